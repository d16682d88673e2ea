# An error while preparing one message stops neither the relay nor any other
# target or lane.  outbox.test_fault injects one:
#  - 'read:TOPIC' fails building messages of TOPIC while reading: the read
#    of that target is rolled back and retried with backoff, the message is
#    dead-lettered with the error after a few tries, and everything else
#    (other messages of the same target, other targets, NOTIFY) flows;
#  - 'send:TOPIC' fails starting its request: the lane retries it, then
#    dead-letters it after max_attempts, and goes on.
# A payload whose JSON text would pass 1 GB (control characters become
# \u00XX) is a real case of the first kind: a dead letter, not a crash loop.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('errors');
my $url = $sink->{url};
my $node = relay_node(
	'relay_errors', conf => q{
outbox.test_fault = 'read:poison.read'
outbox.max_payload_size = '200MB'
});
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('a', '$url/a', lanes => 2, max_attempts => 3);
SELECT outbox.subscribe('a', '*');
SELECT outbox.create_http_target('b', '$url/b');
SELECT outbox.subscribe('b', 'ok.*');
SELECT outbox.create_notify_target('n', 'errors_channel');
SELECT outbox.subscribe('n', '*');
});
my $pid = relay_worker_pid($node);

sub emit_batch
{
	my ($from, $to, $poison) = @_;
	$node->safe_psql('postgres', qq{
SELECT count(outbox_emit('ok.' || g, jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series($from, $from + 4) g;
SELECT outbox_emit('$poison', '{"bad": 1}', 'k1');
SELECT outbox_emit('$poison', '{"bad": 2}', 'k2');
SELECT count(outbox_emit('ok.' || g, jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series($from + 5, $to) g;
});
}

sub settled
{
	return $node->poll_query_until('postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag});
}

sub ok_paths
{
	my ($path) = @_;
	return scalar grep { $_->{status} == 204 } sink_path_records($sink, $path);
}

emit_batch(1, 10, 'poison.read');
ok(settled(), 'read fault: every target settles');
ok(wait_until(sub { $node->safe_psql('postgres', q{SELECT string_agg(format('%s %s', target, last_error), ';' ORDER BY target, id) FROM outbox.dead_letters WHERE topic = 'poison.read'}) =~
	/^a message could not be prepared: .*injected fault.*;a message could not be prepared: .*;n message could not be prepared: .*injected fault.*;n message could not be prepared: / }),
	'... both poison messages (in one read) are dead letters of each target that subscribes to them, with the error');
is($node->safe_psql('postgres', q{SELECT sum(dead) FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'a'}),
	'2', '... counted once each, though the reads that found them were retried');
is(ok_paths('/a'), 10, '... target a got the other 10 messages');
is(ok_paths('/b'), 10, '... target b, which does not subscribe to it, got its 10');
is($node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'n'}), '10',
	'... and NOTIFY delivered its 10');
like(slurp_file($node->logfile), qr/WARNING:  outbox relay could not read messages for target "a": .*injected fault/,
	'... the failed read is logged');

$node->append_conf('postgresql.conf', "outbox.test_fault = 'send:poison.send'");
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.test_fault' => 'send:poison.send');
emit_batch(11, 20, 'poison.send');
ok(settled(), 'send fault: every target settles');
is($node->safe_psql('postgres', q{SELECT string_agg(format('%s/%s', attempts, last_error LIKE '%injected fault%'), ' ') FROM outbox.dead_letters WHERE topic = 'poison.send'}),
	'3/t 3/t', '... the messages are dead letters after max_attempts, with the error');
is(ok_paths('/a'), 20, '... target a got the other messages');
is(ok_paths('/b'), 20, '... target b got its own');

# Real data: JSON text past 1 GB.
$node->safe_psql('postgres', q{SELECT outbox_emit('huge', to_jsonb(repeat(chr(1), 180 * 1000 * 1000)))});
emit_batch(21, 30, 'ok.fine');
ok(settled(), 'a payload that cannot be encoded: every target settles');
ok(wait_until(sub { $node->safe_psql('postgres', q{SELECT string_agg(target || ' ' || last_error, ';' ORDER BY target) FROM outbox.dead_letters WHERE topic = 'huge'}) =~
	/^a payload cannot be encoded as JSON text: .*;n payload cannot be encoded as JSON text: / }),
	'... it is a dead letter with the reason');
is(ok_paths('/a'), 32, '... the rest was delivered');

# Progress is written for all lanes of all targets at once: each lane's
# row gets its own counts, position and error.  Two targets of 4 and 3
# lanes; the receiver answers 500 to the messages of key 'bad', so the lane
# of 'bad' in each target stops at it (retrying forever: max_attempts 0,
# and records the error) while the others deliver everything.
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('p4', '$url/p4', lanes => 4, max_attempts => 0);
SELECT outbox.subscribe('p4', 'lanes');
SELECT outbox.create_http_target('p3', '$url/p3', lanes => 3, max_attempts => 0);
SELECT outbox.subscribe('p3', 'lanes');
});
sink_control($sink, { key => 'bad', status => 500 });
$node->safe_psql('postgres', q{
SELECT count(outbox_emit('lanes', jsonb_build_object('g', g), 'k' || (g % 7))) FROM generate_series(1, 40) g;
SELECT outbox_emit('lanes', '{"bad": 1}', 'bad');
SELECT count(outbox_emit('lanes', jsonb_build_object('g', g), 'k' || (g % 7))) FROM generate_series(41, 80) g;
});
# What each lane of each target should record, from the messages: all of
# its own, or (the lane of 'bad') those before 'bad'; a lane may have none.
my $expected = $node->safe_psql('postgres', q{
WITH m AS (
  SELECT t.name, outbox.lane_of(m.key, m.id, t.lanes) AS lane, m.id, m.key
    FROM outbox.messages m CROSS JOIN outbox.targets t
   WHERE m.topic = 'lanes' AND t.name IN ('p4', 'p3')),
b AS (SELECT name, lane, id FROM m WHERE key = 'bad')
SELECT string_agg(format('%s/%s:%s:%s', name, lane, delivered, failing), ' ' ORDER BY name, lane)
  FROM (SELECT t.name, l.lane,
               count(m.id) FILTER (WHERE b.id IS NULL OR m.id < b.id) AS delivered,
               b.id IS NOT NULL AS failing
          FROM outbox.targets t CROSS JOIN generate_series(0, t.lanes - 1) l(lane)
          LEFT JOIN m ON m.name = t.name AND m.lane = l.lane
          LEFT JOIN b ON b.name = t.name AND b.lane = l.lane
         WHERE t.name IN ('p4', 'p3')
         GROUP BY t.name, l.lane, b.id) per_lane});
my $recorded = q{
SELECT string_agg(format('%s/%s:%s:%s', t.name, p.lane, p.delivered,
                         coalesce(p.last_status, 0) = 500), ' ' ORDER BY t.name, p.lane)
  FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
 WHERE t.name IN ('p4', 'p3')};
ok($node->poll_query_until('postgres', $recorded, $expected),
	"each lane of two targets records its own deliveries and error ($expected)")
  or diag($node->safe_psql('postgres', $recorded));
is( $node->safe_psql(
		'postgres', q{
SELECT count(*) FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
 WHERE t.name IN ('p4', 'p3') AND p.lane <> outbox.lane_of('bad', 0, t.lanes)
   AND p.done_id < coalesce((SELECT max(m.id) FROM outbox.messages m
                              WHERE m.topic = 'lanes' AND m.key <> 'bad'
                                AND outbox.lane_of(m.key, m.id, t.lanes) = p.lane), 0)},
		),
	'0', '... and the other lanes\' positions: past every message of their own');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(format('%s/%s', t.name, p.lane), ' ' ORDER BY t.name)
  FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
 WHERE t.name IN ('p4', 'p3') AND p.done_id >= (SELECT id FROM outbox.messages WHERE key = 'bad')
   AND p.lane = outbox.lane_of('bad', 0, t.lanes)}),
	'', '... the lanes of \'bad\' short of it');
sink_control($sink, { key => 'bad', reset => \1 });
ok($node->poll_query_until('postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target IN ('p4', 'p3')}),
	'... until the receiver takes it');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target IN ('p4', 'p3')}),
	'0', '... delivered, not dead-lettered');

is(relay_worker_pid($node), $pid, 'the relay never restarted');
relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
