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

is(relay_worker_pid($node), $pid, 'the relay never restarted');
relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
