# The relay need not be a superuser: with outbox.relay_role it connects as
# a plain role holding only the grants the README lists, and delivers to
# HTTP and NOTIFY targets, records progress and dead letters, and survives
# a restart of its own.
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
GRANT SELECT ON outbox.targets, outbox.subscriptions, outbox.messages TO outbox_relay;
GRANT SELECT, UPDATE ON outbox.progress TO outbox_relay;
GRANT SELECT, INSERT, UPDATE ON outbox.dead_letters TO outbox_relay;
});
$node->append_conf('postgresql.conf', "outbox.relay_role = 'outbox_relay'\n");
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

my $pid = relay_worker_pid($node);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
$node->safe_psql('postgres', q{SELECT outbox_emit('t.b', '{}')});
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'a new relay, as the same role, delivers what came next');
unlike(slurp_file($node->logfile), qr/ERROR|FATAL/, 'no error in the log');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
