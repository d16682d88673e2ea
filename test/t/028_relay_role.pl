# The relay need not be a superuser: with outbox.relay_role it connects as
# a plain role holding only the grants the README lists, and delivers to
# HTTP and NOTIFY targets, records progress and dead letters, and survives
# a restart of its own; it removes delivered messages (retention), delivers
# dead letters again, disables a target that answers 410 and changes a
# target's lanes.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('relay_role');
my $url = $sink->{url};
my $node = relay_node('relay_role');
$node->safe_psql('postgres', q{
CREATE ROLE outbox_relay LOGIN NOSUPERUSER;
GRANT USAGE ON SCHEMA outbox TO outbox_relay;
GRANT SELECT ON outbox.subscriptions, outbox.messages TO outbox_relay;
GRANT SELECT, UPDATE ON outbox.targets TO outbox_relay;
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.progress, outbox.dead_letters TO outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.retention_step(interval) TO outbox_relay;
GRANT SELECT, DELETE ON outbox.receipts TO outbox_relay;
});
$node->append_conf('postgresql.conf', "outbox.relay_role = 'outbox_relay'\noutbox.retention = 0\n");
my $log_from = -s $node->logfile;
$node->restart;

$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('hook', '$url/hook', lanes => 2);
SELECT outbox.subscribe('hook', 't.*');
SELECT outbox.create_http_target('rej', '$url/rej');
SELECT outbox.subscribe('rej', 'r');
SELECT outbox.create_notify_target('n', 'role_channel');
SELECT outbox.subscribe('n', '*');
});
sink_control($sink, { path => '/rej', status => 422 });
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('t.a', jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series(1, 20) g; SELECT outbox_emit('r', '{}')});
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}), 'everything is delivered');
is($node->safe_psql('postgres',
	q{SELECT format('%s/%s', a.usename, r.rolsuper) FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = a.usename WHERE a.backend_type = 'outbox relay'}),
	'outbox_relay/f', 'by a relay connected as a role that is not a superuser');
is(scalar(my @r = grep { $_->{status} == 204 } sink_path_records($sink, '/hook')), 20, 'the receiver got the 20');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'rej'}), '1',
	'the dead letter was recorded');
is($node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'n'}), '21',
	'NOTIFY delivered and recorded its progress');

ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.messages}),
	'delivered messages are removed (retention 0)');
sink_control($sink, { path => '/rej', reset => JSON::PP::true });
$node->safe_psql('postgres', q{SELECT outbox.retry_dead_letters('rej')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.dead_letters}),
	'a dead letter is delivered again');
sink_control($sink, { path => '/rej', status => 410 });
$node->safe_psql('postgres', q{SELECT outbox_emit('r', '{}')});
ok($node->poll_query_until('postgres', q{SELECT state = 'disabled' FROM outbox.targets WHERE name = 'rej'}),
	'a target answering 410 is disabled');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('hook', lanes => 3)});
ok($node->poll_query_until('postgres', q{SELECT lanes = 3 FROM outbox.targets WHERE name = 'hook'}),
	'a target gets new lanes');

my $pid = relay_worker_pid($node);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
$node->poll_query_until('postgres', "SELECT pid IS NOT NULL AND pid <> $pid FROM outbox.worker")
  or die 'no new relay after the old one was terminated';
$node->safe_psql('postgres', q{SELECT outbox_emit('t.b', '{}')});
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target <> 'rej'}),
	'a new relay, as the same role, delivers what came next');

# Queues: the relay folds acknowledgements into progress and deletes the
# receipts it folded, as that role too.
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('rq');
SELECT outbox.subscribe('rq', 'q.*');
SELECT count(outbox_emit('q.x', jsonb_build_object('g', g), 'k')) FROM generate_series(1, 5) g;
});
is($node->safe_psql('postgres', q{
BEGIN;
SELECT count(*) FROM outbox.receive('rq', 10);
COMMIT;
}), '5', 'a consumer received the queue\'s 5 messages');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.receipts}),
	'the relay folded the receipts into progress and deleted them');
is($node->safe_psql('postgres', q{SELECT pending FROM outbox.queues WHERE queue = 'rq'}), '0',
	'nothing of the queue is pending');
# From the restart on; a session of the setup still ending when the restart
# came is terminated by it, which is not the relay's.
is_deeply([ grep { /ERROR|FATAL|WARNING/ && !/FATAL:  terminating connection due to administrator command/ }
			split /\n/, slurp_file($node->logfile, $log_from) ],
	[], 'no error or warning in the log');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
