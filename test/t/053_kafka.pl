# Kafka targets against librdkafka's mock cluster (3 brokers, run as a
# process of its own on loopback by test/kafka/outbox_kafka), read back by
# a consumer:
#  - 20,000 messages over 200 keys into a 6-partition topic while the mock
#    fails produce requests, moves partition leaders and takes a broker
#    down and up, and the relay is killed (kill -9): every message is
#    there, each key in one partition (the one the Java client's murmur2
#    partitioner picks, checked against Kafka's own test vectors), per key
#    the last copies in commit order (the first copies too on a broker; the
#    mock may store a later batch of a partition without an earlier one it
#    refused: TAP 077), copies of a message only with its webhook-id;
#  - the record: key, value = payload, the headers;
#  - a message larger than message.max.bytes is a dead letter, the rest
#    flow; retried after the limit is raised, it is delivered;
#  - an authorization error holds the target with the broker's reason,
#    nothing dead-lettered, and it delivers once the error stops;
#  - pause and resume, replay; the destination rules refuse the brokers'
#    addresses at connect;
#  - properties that would break the guarantees, or run code, are refused.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxKafka;

# Kafka's own vectors of murmur2 (UtilsTest.testMurmur2).
my %vectors = ('21' => -973932308, 'foobar' => -790332482,
	'a-little-bit-long-string' => -985981536,
	'a-little-bit-longer-string' => -1486304829,
	'lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8' => -58897971,
	'abc' => 479470107);
is_deeply({ map { $_ => murmur2($_) } keys %vectors }, \%vectors,
	'murmur2 here gives the Java client\'s values');

my $mock = kafka_mock('orders', 6, 'small', 1, 'denied', 1, 'other', 3);
my $brokers = $mock->{bootstrap};
note("mock cluster at $brokers");

my $node = relay_node('kafka');

# --- bad arguments ---
for my $case (
	[ q{'kafka://127.0.0.1:9092'}, q{'{}'}, qr/invalid Kafka bootstrap list/ ],
	[ "'$brokers'", q{'{"enable.idempotence": false}'}, qr/enable\.idempotence must be true/ ],
	[ "'$brokers'", q{'{"acks": "1"}'}, qr/acks must be all/ ],
	[ "'$brokers'", q{'{"partitioner": "random"}'}, qr/partitioner must be one that sends a key to one partition/ ],
	[ "'$brokers'", q{'{"plugin.library.paths": "/tmp/evil.so"}'}, qr/property "plugin\.library\.paths" is not one the relay passes on/ ],
	[ "'$brokers'", q{'{"sasl.kerberos.kinit.cmd": "touch /tmp/pwned"}'}, qr/is not one the relay passes on/ ],
	[ "'$brokers'", q{'[1]'}, qr/properties is not a JSON object/ ])
{
	my ($b, $p, $re) = @$case;
	my ($rc, $out, $err) = $node->psql('postgres',
		"SELECT outbox.create_kafka_target('x', $b, properties => $p)");
	like($err, $re, "refused: $b $p");
}
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT outbox.create_kafka_target('x', '$brokers', topic => 'a b')");
like($err, qr/invalid Kafka topic/, 'a topic that is not a Kafka topic name is refused');
ok(!-e '/tmp/pwned', 'no command ran');

# --- 20,000 messages through faults ---
# Slowed down (at most 100 requests of 20 a second), so that the faults
# come mid-stream, and paused until every message is committed (however
# long emitting takes).  Retried for ever: a delivery timed out with the
# brokers reachable counts as an attempt, and no message may be lost.
$node->safe_psql('postgres', qq{
	SELECT outbox.create_kafka_target('kf', '$brokers', topic => 'orders', lanes => 8,
									  batch_size => 20, timeout_ms => 5000, max_attempts => 0);
	SELECT outbox.alter_target('kf', max_rate => 100);
	SELECT outbox.subscribe('kf', 'ord.*');
	SELECT outbox.pause_target('kf');
});
$node->safe_psql('postgres', q{
	DO $$
	BEGIN
		FOR b IN 0 .. 199 LOOP
			PERFORM outbox_emit('ord.' || CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END,
								jsonb_build_object('n', g), 'k' || (g % 200),
								jsonb_build_object('x-n', g::text))
			   FROM generate_series(b * 100 + 1, b * 100 + 100) g;
			COMMIT;
		END LOOP;
	END
	$$;
});
$node->safe_psql('postgres', q{SELECT outbox.resume_target('kf')});
sub delivered
{
	return $node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'kf'});
}
ok(wait_until(sub { delivered() >= 2000 }), 'delivering');
is(kafka_command($mock, 'produce-errors 40 6 7 19 5'), 'ok', 'the brokers fail 40 produce requests');
ok(wait_until(sub { delivered() >= 5000 }), 'delivering through them');
is(kafka_command($mock, 'leader orders 0 2'), 'ok', 'a partition leader moves');
is(kafka_command($mock, 'leader orders 3 1'), 'ok', 'another one');
ok(wait_until(sub { delivered() >= 8000 }), 'delivering after the moves');
my $pid = relay_worker_pid($node);
my $at = delivered();
kill 'KILL', $pid;
# The server restarts after a worker killed so (restart_after_crash): wait
# until the postmaster has reaped the relay (it then stops everything), so
# that the poll cannot pass before the restart, then for the restart.
wait_until(sub { !kill(0, $pid) });
$node->poll_query_until('postgres', 'SELECT true');
note("relay killed with $at of 20000 delivered");
ok($at < 18000, 'the relay was killed mid-stream');
ok(wait_until(sub { delivered() >= 11000 || delivered() >= 20000 }), 'delivering after the relay restarted');
is(kafka_command($mock, 'down 2'), 'ok', 'a broker goes down');
sleep 3;    # a span: down for a while
is(kafka_command($mock, 'up 2'), 'ok', 'and up');
# the faults are over: the rest at full speed
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kf', max_rate => 0)});
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT pending FROM outbox.lag WHERE target = 'kf'}) eq '0';
		}),
	'everything delivered');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'kf'}), '0',
	'no dead letters');
is($node->safe_psql('postgres', q{SELECT kind FROM outbox.lag WHERE target = 'kf'}), 'kafka',
	'outbox.lag shows a kafka target');
like($node->safe_psql('postgres', q{SELECT outbox.metrics()}),
	qr/^outbox_delivered_messages_total\{target="kf"\} \d+$/m, 'outbox.metrics() counts its messages');

my $records = kafka_consume($mock, 'orders');
my (%first, %part, %ids, $bad_part, $split, $disorder, $mixed_ids, %last);
for my $r (@$records)
{
	my $seq = $r->{headers}{'outbox-seq'};
	my $key = $r->{key};
	$mixed_ids++ if defined $ids{$seq} && $ids{$seq} ne $r->{headers}{'webhook-id'};
	$ids{$seq} //= $r->{headers}{'webhook-id'};
	$split++ if defined $part{$key} && $part{$key} != $r->{partition};
	$part{$key} //= $r->{partition};
	$bad_part++ if $r->{partition} != java_partition($key, 6);
	next if $first{$seq}++;
	if (defined $last{$key} && $last{$key} >= $seq)
	{
		note("out of order: key $key seq $seq after $last{$key} (p$r->{partition} offset $r->{offset})")
		  if ++$disorder <= 10;
	}
	$last{$key} = $seq;
}
my $copies = scalar(@$records) - scalar(keys %first);
{
	my @missing = grep { !$first{$_} } 1 .. 20000;
	my %next;
	my @gaps;
	for my $r (@$records)
	{
		push @gaps, "p$r->{partition}: $next{$r->{partition}} -> $r->{offset}"
		  if defined $next{ $r->{partition} } && $r->{offset} != $next{ $r->{partition} };
		$next{ $r->{partition} } = $r->{offset} + 1;
	}
	note("missing: @missing[0 .. ($#missing < 20 ? $#missing : 19)]") if @missing;
	note("offset gaps: @gaps[0 .. ($#gaps < 20 ? $#gaps : 19)]") if @gaps;
	note("partition ends: " . join(' ', map { "p$_=$next{$_}" } sort keys %next));
	if (@missing)
	{
		my $again = kafka_consume($mock, 'orders');
		note("a second read: " . scalar(@$again) . " records");
		for my $seq (@missing)
		{
			my $key = $node->safe_psql('postgres', "SELECT key FROM outbox.messages WHERE id = $seq");
			note("missing $seq key $key partition " . java_partition($key, 6));
		}
	}
}
note("records: " . scalar(@$records) . ", copies sent again: $copies");
# the last copies, per key by partition and offset
my (%last_at, %runs, $last_disorder);
$last_at{ $_->{headers}{'outbox-seq'} } = "$_->{partition}:$_->{offset}" for @$records;
for my $r (@$records)
{
	my $seq = $r->{headers}{'outbox-seq'};
	push @{ $runs{ $r->{key} } }, $seq if $last_at{$seq} eq "$r->{partition}:$r->{offset}";
}
for my $run (values %runs)
{
	$last_disorder += scalar grep { $run->[$_] <= $run->[ $_ - 1 ] } 1 .. $#$run;
}
note("first copies out of commit order (the mock's doing): " . ($disorder // 0));
is(scalar keys %first, 20000, 'every message is in the topic');
is(scalar(grep { $_ < 1 || $_ > 20000 } keys %first), 0, '... and nothing else');
is($split // 0, 0, 'each key in one partition');
is($bad_part // 0, 0, 'the partition the Java client picks for the key');
is($last_disorder // 0, 0, 'per key, the last copies in commit order');
is($mixed_ids // 0, 0, 'copies of a message carry its webhook-id');
is(scalar keys %last, 200, 'over 200 keys');

my ($rec) = grep { $_->{headers}{'outbox-seq'} == 7 } @$records;
is($rec->{key}, 'k7', 'the record key is the message key');
is($rec->{payload}, '{"n": 7}', 'the value is the payload');
is($rec->{headers}{'outbox-topic'}, 'ord.odd', 'outbox-topic header');
is($rec->{headers}{'outbox-key'}, 'k7', 'outbox-key header');
is($rec->{headers}{'x-n'}, '7', 'the message\'s own header');
is($rec->{headers}{'webhook-id'},
	$node->safe_psql('postgres', q{SELECT msg_id FROM outbox.messages WHERE id = 7}),
	'webhook-id is the message id');

# --- a message too large ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_kafka_target('kbig', '$brokers', topic => 'small', max_attempts => 2,
									  properties => '{"message.max.bytes": 5000}');
	SELECT outbox.subscribe('kbig', 'big');
	SELECT outbox_emit('big', '{"n": 1}', 'k');
	SELECT outbox_emit('big', jsonb_build_object('pad', repeat('x', 8000)), 'k');
	SELECT outbox_emit('big', '{"n": 3}', 'k');
});
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT pending FROM outbox.lag WHERE target = 'kbig'}) eq '0';
		}),
	'a message too large: the others flow');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'kbig'}),
	qr/too large/i, 'it is a dead letter, with the reason');
is(join(',', map { $_->{payload} } @{ kafka_consume($mock, 'small') }), '{"n": 1},{"n": 3}',
	'the others in order');
$node->safe_psql('postgres', q{
	SELECT outbox.alter_target('kbig', properties => '{"message.max.bytes": 100000}');
	SELECT outbox.retry_dead_letters('kbig');
});
ok(wait_until(sub { scalar(@{ kafka_consume($mock, 'small') }) == 3 }),
	'retried after the limit was raised, it is delivered');

# --- an authorization error ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_kafka_target('kdeny', '$brokers', topic => 'denied');
	SELECT outbox.subscribe('kdeny', 'deny');
});
# (refusing until the test has seen the target held: then the errors are
# cleared, Produce being API key 0)
is(kafka_command($mock, 'produce-errors 100000 29'), 'ok', 'the brokers answer TOPIC_AUTHORIZATION_FAILED');
$node->safe_psql('postgres', q{SELECT outbox_emit('deny', '{"n": 1}', 'k')});
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT state || ' ' || coalesce(last_error, '') FROM outbox.lag WHERE target = 'kdeny'})
			  =~ /^failing .*[Aa]uthoriz/;
		}),
	'an authorization error holds the target, with the broker\'s reason');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'kdeny'}),
	'0', '... nothing dead-lettered');
kafka_command($mock, 'clear-errors 0') eq 'ok' or die 'the mock did not clear its errors';
ok(wait_until(sub { scalar(@{ kafka_consume($mock, 'denied') }) == 1 }),
	'once the broker stops refusing, it is delivered');

# --- pause, resume ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_kafka_target('kother', '$brokers', topic => 'other');
	SELECT outbox.subscribe('kother', 'oth');
	SELECT outbox.pause_target('kother');
	SELECT outbox_emit('oth', jsonb_build_object('n', g), 'k' || g) FROM generate_series(1, 10) g;
});
sleep 2;    # a span: a paused target would have produced by now
is(scalar(@{ kafka_consume($mock, 'other') }), 0, 'a paused target produces nothing');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('kother')});
ok(wait_until(sub { scalar(@{ kafka_consume($mock, 'other') }) == 10 }), 'resumed: it produces what waited');
$node->safe_psql('postgres', q{SELECT outbox.replay('kother', now() - interval '1 hour')});
ok(wait_until(sub { scalar(@{ kafka_consume($mock, 'other') }) == 20 }),
	'replay produces the messages again');
my %replayed;
$replayed{ $_->{headers}{'outbox-seq'} }{ $_->{headers}{'webhook-id'} }++ for @{ kafka_consume($mock, 'other') };
is(scalar(grep { keys %{ $replayed{$_} } == 1 && (values %{ $replayed{$_} })[0] == 2 } keys %replayed), 10,
	'... each twice, under its own webhook-id');

# --- destination rules ---
# (A refused connection shows once the produce times out: a short
# timeout_ms shows it sooner.  Copies that a timeout may make are allowed
# for below.)
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kother', timeout_ms => 3000)});
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.0/8'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.0/8');
$node->safe_psql('postgres',
	q{SELECT outbox_emit('oth', jsonb_build_object('n', g), 'k' || g) FROM generate_series(11, 15) g});
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT last_error FROM outbox.lag WHERE target = 'kother'}) =~
			  /connection refused by the relay: 127\.0\.0\.1 is denied/;
		}),
	'a denied broker address is refused at connect, with the reason');
is(scalar(@{ kafka_consume($mock, 'other') }), 20, 'nothing was produced');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'kother'}),
	'0', '... and nothing dead-lettered');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
$node->reload;
ok( wait_until(
		sub {
			my %seqs = map { $_->{headers}{'outbox-seq'} => 1 } @{ kafka_consume($mock, 'other') };
			keys %seqs == 15;
		}),
	'allowed again: delivered');

relay_no_crash($node, $pid);
$node->stop;
kafka_stop($mock);
done_testing();
