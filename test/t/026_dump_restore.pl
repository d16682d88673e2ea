# pg_dump and pg_restore of a database with the extension: targets,
# subscriptions, progress, dead letters and messages come back; new ids
# continue above every id handed out before the dump (the durable id mark
# is dumped), new targets get new ids (the target id sequence is dumped),
# the restored relay delivers what was pending and nothing it had already
# delivered.  A server without the library preloaded can take the restore
# too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('dump');
my $url = $sink->{url};
my $src = relay_node('dump_src');
if (my $why = client_matches_server($src, 'pg_dump'))
{
	stop_sink($sink);
	$src->stop;
	plan skip_all => $why;
}
$src->safe_psql('postgres', qq{
SELECT outbox.create_http_target('hook', '$url/hook', lanes => 2, max_attempts => 0);
SELECT outbox.subscribe('hook', 't.*');
SELECT outbox.create_http_target('rej', '$url/rej');
SELECT outbox.subscribe('rej', 'r');
SELECT outbox.create_notify_target('n', 'dump_channel');
SELECT outbox.subscribe('n', '*');
});
# A queue, with a grant and two of its five messages received.
$src->safe_psql('postgres', q{
CREATE ROLE dq_app LOGIN;
SELECT outbox.create_queue('dq');
SELECT outbox.subscribe('dq', 'q');
SELECT outbox.grant_receive('dq', 'dq_app');
SELECT count(outbox_emit('q', jsonb_build_object('q', g), 'k' || (g % 2))) FROM generate_series(1, 5) g;
});
is($src->safe_psql('postgres', q{SELECT string_agg(payload->>'q', ',' ORDER BY id) FROM outbox.receive('dq', 2)}),
	'1,2', 'source: two of the queue\'s messages received');
sink_control($sink, { path => '/rej', status => 422 });
$src->safe_psql('postgres',
	q{SELECT count(outbox_emit('t.a', jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series(1, 20) g; SELECT outbox_emit('r', '{}')});
ok($src->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE kind <> 'queue'}),
	'source: delivered');
sink_control($sink, { path => '/hook', status => 503 });
$src->safe_psql('postgres',
	q{SELECT count(outbox_emit('t.b', jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series(1, 10) g});
ok($src->poll_query_until('postgres', q{SELECT pending = 10 FROM outbox.lag WHERE target = 'hook'}),
	'source: 10 pending for hook');
my $frontier = $src->safe_psql('postgres', 'SELECT outbox.frontier()');
my %counts;
my $count_sql = q{SELECT (SELECT count(*) FROM outbox.targets) || '/' || (SELECT count(*) FROM outbox.subscriptions) || '/' ||
	(SELECT count(*) FROM outbox.progress) || '/' || (SELECT count(*) FROM outbox.dead_letters) || '/' ||
	(SELECT count(*) FROM outbox.messages)};
my $before = $src->safe_psql('postgres', $count_sql);
my $max_target = $src->safe_psql('postgres', 'SELECT max(id) FROM outbox.targets');

my $dump = "$PostgreSQL::Test::Utils::tmp_check/outbox.dump";
command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $src->connstr('postgres') ], 'pg_dump');
$src->stop;

my $dst = relay_node('dump_dst', create_extension => 0);
$dst->safe_psql('postgres', 'CREATE ROLE dq_app LOGIN');	# roles are not in a database's dump
command_ok([ 'pg_restore', '--exit-on-error', '-d', $dst->connstr('postgres'), $dump ], 'pg_restore');
is($dst->safe_psql('postgres', $count_sql), $before,
	'targets, subscriptions, progress, dead letters and messages are restored');

$dst->safe_psql('postgres', q{SELECT outbox_emit('t.c', '{}', 'k1')});
cmp_ok($dst->safe_psql('postgres', q{SELECT max(id) FROM outbox.messages WHERE topic = 't.c'}), '>', $frontier,
	'a new message gets an id above every id handed out before the dump');
$dst->safe_psql('postgres', qq{SELECT outbox.create_http_target('new', '$url/new'); SELECT outbox.subscribe('new', 't.c')});
cmp_ok($dst->safe_psql('postgres', q{SELECT id FROM outbox.targets WHERE name = 'new'}), '>', $max_target,
	'a new target gets a new id');

my %before_restore;
$before_restore{ $_->{seq} }++ for grep { $_->{status} == 204 } @{ sink_attempts($sink, '/hook') };
sink_control($sink, { path => '/hook', status => 204 });
ok($dst->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target IN ('hook', 'n')}),
	'the restored relay delivers what was pending');
my %after;
$after{ $_->{seq} }++ for grep { $_->{status} == 204 } @{ sink_attempts($sink, '/hook') };
is(scalar(keys %after) - scalar(keys %before_restore), 11, '... the 10 pending and the new one');
is(scalar(grep { $after{$_} > 1 } keys %after), 0, '... and nothing delivered before the dump again');
is($dst->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'rej'}), '1',
	'the dead letter is still there');
is( $dst->safe_psql(
		'postgres', q{SELECT string_agg(payload->>'q', ',' ORDER BY id) FROM outbox.receive('dq', 10)},
		extra_params => [ '-U', 'dq_app' ]),
	'3,4,5', 'the restored queue gives what was not received, to the role granted it');

# Without the library preloaded the restore works too.
my $plain = PostgreSQL::Test::Cluster->new('dump_plain');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE ROLE dq_app LOGIN');
command_ok([ 'pg_restore', '--exit-on-error', '-d', $plain->connstr('postgres'), $dump ],
	'pg_restore into a server without the library preloaded');
is($plain->safe_psql('postgres', $count_sql), $before, '... restores everything');
$plain->stop;

relay_no_crash($dst);
stop_sink($sink);
$dst->stop;
done_testing();
