# A destination filled in from a message that the broker does not take
# (issue 41, finding 4), against a real nats-server -js, rabbitmq-server
# and librdkafka's mock cluster on loopback, and outbox.set_aside():
#  - NATS, subject 'n.{key}' and a stream on 'n.*': the key "x.y" makes
#    "n.x.y", which no stream takes (no responders).  The message is
#    retried on its lane, the target is not held, last_error names
#    "n.x.y" (not the template); with unroutable_after it becomes a dead
#    letter naming the subject and the option, and the next message of
#    the lane is delivered.  The clock is the lane's: a second such
#    message behind the first is a dead letter at its first refusal (its
#    dead letter says 1 attempt), not after unroutable_after of its own;
#  - NATS, subject 'w.{key}' and no stream at all (the broker takes
#    nothing: a stream deleted, say): dead letters after unroutable_after
#    too, which outbox.retry_dead_letters() delivers once a stream takes
#    'w.*';
#  - RabbitMQ, routing key 'orders.{key}' on a direct exchange with one
#    binding: a key no queue is bound for comes back unroutable, the same;
#  - Kafka, topic '{topic}' on a cluster that creates no topic: a topic
#    the cluster lacks, the same;
#  - one request of two keys whose first message is refused (RabbitMQ, a
#    lane of its own; Kafka the same): the second, which the broker
#    confirmed, is delivered once, not sent again after the refusal
#    (RabbitMQ stored it twice before: this fails on 73d4bc0);
#  - outbox.set_aside(): a message retried for ever (unroutable_after 0)
#    on NATS, and the head of an HTTP target held by a 404, each set aside
#    as a dead letter with the reason given; the rest goes on.  Its
#    errors, with their SQLSTATEs: a queue, no failing message, an id that
#    is not failing, two failing without an id, a reason with a control
#    character.
# Targets have two lanes, and keys are chosen by lane: the other lane
# delivers while one is refused.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxNats;
use OutboxRabbitMQ;
use OutboxKafka;

my $nats = nats_start('unroutable');
my $nurl = $nats->{url};
nats_tool($nurl, 'create', 'N', 'n.*');
my $rmq = rmq_start('unroutable');
my $murl = $rmq->{url};
rmq_tool($murl, 'exchange', 'ex', 'direct');
rmq_tool($murl, 'declare', 'q1');
rmq_tool($murl, 'bind', 'q1', 'ex', 'orders.k1');
rmq_tool($murl, 'declare', 'q2');
rmq_tool($murl, 'bind', 'q2', 'ex', 'orders.k2');
my $mock = kafka_mock('orders', 1);
# Metadata v4 carries allow.auto.create.topics (the mock creates any topic
# named otherwise)
is(kafka_command($mock, 'apiversion 3 0 4'), 'ok', 'the mock cluster creates no topic');
my $brokers = $mock->{bootstrap};
my $sink = start_sink('unroutable');

# max_attempts 0: nothing here becomes a dead letter by running out of
# attempts, only for its destination (or set aside); but 'mq' has 2, which
# refusals of a destination do not count toward
my $node = relay_node('unroutable');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('n', '$nurl', subject => 'n.{key}', lanes => 2,
		max_attempts => 0);
	SELECT outbox.subscribe('n', 'nats');
	SELECT outbox.alter_target('n', unroutable_after => interval '0');
	SELECT outbox.create_rabbitmq_target('mq', '$murl', exchange => 'ex',
		routing_key => 'orders.{key}', lanes => 2, max_attempts => 2);
	SELECT outbox.subscribe('mq', 'mq');
	SELECT outbox.alter_target('mq', unroutable_after => interval '2 seconds');
	SELECT outbox.create_rabbitmq_target('mq1', '$murl', exchange => 'ex',
		routing_key => 'orders.{key}', lanes => 1, max_attempts => 0);
	SELECT outbox.subscribe('mq1', 'mq1');
	SELECT outbox.alter_target('mq1', unroutable_after => interval '1 second');
	SELECT outbox.create_kafka_target('k1', '$brokers', topic => 'ord{topic}', lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('k1', 'xx');
	SELECT outbox.subscribe('k1', 'ers');
	SELECT outbox.alter_target('k1', unroutable_after => interval '1 second');
	SELECT outbox.create_kafka_target('k', '$brokers', topic => '{topic}', lanes => 2,
		max_attempts => 0);
	SELECT outbox.subscribe('k', 'orders');
	SELECT outbox.subscribe('k', 'missing');
	SELECT outbox.alter_target('k', unroutable_after => interval '2 seconds');
	SELECT outbox.create_http_target('h', '$sink->{url}/h', lanes => 1, max_attempts => 0);
	SELECT outbox.subscribe('h', 'http');
	SELECT outbox.create_nats_target('w', '$nurl', subject => 'w.{key}', lanes => 2,
		max_attempts => 0);
	SELECT outbox.subscribe('w', 'wide');
	SELECT outbox.alter_target('w', unroutable_after => interval '1 second');
	SELECT outbox.create_queue('qq');
});

# The error of a statement, with its SQLSTATE.
sub sql_error
{
	my ($sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\n$sql");
	return $err;
}

# The first of @keys that outbox.lane_of() puts in lane $lane of 2.
sub key_in_lane
{
	my ($lane, @keys) = @_;
	for my $k (@keys)
	{
		return $k if $node->safe_psql('postgres', "SELECT outbox.lane_of('$k', 1, 2)") == $lane;
	}
	die "none of @keys is in lane $lane";
}

sub lag_of
{
	my ($t) = @_;
	return $node->safe_psql('postgres',
		"SELECT state || '|' || coalesce(last_error, '') FROM outbox.lag WHERE target = '$t'");
}

sub failing_id
{
	my ($t) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(p.failing_id::text, ',') FROM outbox.progress p"
		  . " JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = '$t'");
}

# --- NATS: retried on its lane, named, then set aside ---
my $bad = $node->safe_psql('postgres', q{SELECT outbox_emit('nats', '{"n": 1}', 'x.y')});
ok_wait('NATS: the lane retries "n.x.y", named in last_error, the target not held',
	sub { my $l = lag_of('n');
		  return ($l =~ /^(?:retrying|delivering)\|no JetStream stream takes subject "n\.x\.y" \(no responders\)$/, $l) });
ok_wait('NATS: outbox.progress names the failing message',
	sub { my $f = failing_id('n'); return ($f ne '', "failing_id: '$f'") });
my $failing = failing_id('n');
is($node->safe_psql('postgres', q{SELECT outbox.set_aside('n', 'a key with a dot')}), $failing,
	'NATS: outbox.set_aside() returns the failing id');
ok_wait('NATS: the message is a dead letter with the reason',
	sub { my $d = dead_letter_lines($node, 'n');
		  return (@$d == 1 && $d->[0] =~ /^x\.y\|set aside by \S+: a key with a dot$/, join('; ', @$d)) });
$node->safe_psql('postgres', q{SELECT outbox_emit('nats', '{"n": 2}', 'k2')});
ok_wait('NATS: the next message is in the stream',
	sub { my $n = nats_count($nurl, 'N'); return ($n == 1, "$n messages in N") });

# unroutable_after: a dead letter naming the subject and the option; two
# such messages in one lane, the second refused at once (the lane's clock
# ran out with the first), while the other lane delivers
my $lane_a = $node->safe_psql('postgres', q{SELECT outbox.lane_of('a.b', 1, 2)});
my $second = key_in_lane($lane_a, qw(c.d e.f g.h i.j k.l m.n));
my $other = key_in_lane(1 - $lane_a, qw(k4 k5 k6 k7 k8 k9));
my $good_a = key_in_lane($lane_a, qw(k4 k5 k6 k7 k8 k9));
$node->safe_psql('postgres', q{SELECT outbox.alter_target('n', unroutable_after => interval '2 seconds')});
$node->safe_psql('postgres', qq{
	SELECT outbox_emit('nats', '{"n": 3}', 'a.b');
	SELECT outbox_emit('nats', '{"n": 4}', '$second');
});
ok_wait('NATS: "n.a.b" is refused',
	sub { my $f = failing_id('n'); return ($f ne '', "failing_id: '$f'; " . lag_of('n')) });
$node->safe_psql('postgres', qq{SELECT outbox_emit('nats', '{"n": 5}', '$other')});
ok_wait('NATS: the message of the other lane is in the stream',
	sub { my $n = nats_count($nurl, 'N'); return ($n == 2, "$n messages in N") });
ok_wait('NATS: after unroutable_after both messages are dead letters naming their subjects',
	sub { my $d = dead_letter_lines($node, 'n');
		  return (@$d == 3 && $d->[1] =~ /^a\.b\|no JetStream stream takes subject "n\.a\.b" \(no responders\); refused for the target's unroutable_after \(2 s\)$/
			  && $d->[2] =~ /^\Q$second\E\|no JetStream stream takes subject "n\.\Q$second\E" /,
			  join('; ', @$d)) });
my ($first_attempts, $second_attempts) = split /\n/, $node->safe_psql('postgres',
	"SELECT attempts FROM outbox.dead_letters WHERE target = 'n' AND key IN ('a.b', '$second') ORDER BY id");
cmp_ok($first_attempts, '>', 1, 'NATS: the first was refused several times (its attempts)');
is($second_attempts, 1, 'NATS: the second was a dead letter at its first refusal: the clock is the lane\'s');
$node->safe_psql('postgres', qq{SELECT outbox_emit('nats', '{"n": 6}', '$good_a')});
ok_wait('NATS: the lane delivers again',
	sub { my $n = nats_count($nurl, 'N'); return ($n == 3, "$n messages in N") });

# --- NATS: a broker that takes no destination: dead letters, sent again ---
# (no stream on 'w.*' at all, as when a stream is deleted: told from a
# subject no stream covers only by waiting for another message to be
# delivered, which an emitter could prevent in every lane)
my $wa = key_in_lane(0, qw(w1 w2 w3 w4 w5 w6));
my $wb = key_in_lane(1, qw(w1 w2 w3 w4 w5 w6));
$node->safe_psql('postgres', qq{
	SELECT outbox_emit('wide', '{"w": 1}', '$wa');
	SELECT outbox_emit('wide', '{"w": 2}', '$wb');
});
ok_wait('NATS: both lanes of "w" are refused',
	sub { my $f = failing_id('w'); return (scalar(split /,/, $f) == 2, "failing_id: '$f'") });
like(sql_error(q{SELECT outbox.set_aside('w')}),
	qr/ERROR:  55000: target "w" has 2 failing messages\nDETAIL:  Failing: \d+, \d+\.\nHINT:  Pass id => one of them\./,
	'set_aside: two failing, no id (55000)');
ok_wait('NATS: after unroutable_after both are dead letters',
	sub { my $d = dead_letter_lines($node, 'w'); return (@$d == 2, join('; ', @$d)) });
nats_tool($nurl, 'create', 'W', 'w.*');
$node->safe_psql('postgres', q{SELECT count(*) FROM outbox.retry_dead_letters('w')});
ok_wait('NATS: once a stream takes "w.*", outbox.retry_dead_letters() delivers both',
	sub { my $n = nats_count($nurl, 'W'); return ($n == 2, "$n messages in W") });
ok_wait('NATS: and no dead letter is left',
	sub { my $d = dead_letter_lines($node, 'w'); return (@$d == 0, join('; ', @$d)) });

# --- RabbitMQ: a routing key no queue is bound for ---
# (k1 and a key of the other lane: the target delivers while it refuses)
my $zz = key_in_lane(1 - $node->safe_psql('postgres', q{SELECT outbox.lane_of('k1', 1, 2)}),
	qw(zz zy zx zw zv zu));
$node->safe_psql('postgres', qq{SELECT outbox_emit('mq', '{"n": 1}', '$zz')});
ok_wait('RabbitMQ: "orders.' . $zz . '" is refused',
	sub { my $f = failing_id('mq'); return ($f ne '', "failing_id: '$f'; " . lag_of('mq')) });
$node->safe_psql('postgres', q{SELECT outbox_emit('mq', '{"n": 2}', 'k1')});
ok_wait('RabbitMQ: the unroutable message is a dead letter naming its routing key',
	sub { my $d = dead_letter_lines($node, 'mq');
		  return (@$d == 1 && $d->[0] =~ /^\Q$zz\E\|RabbitMQ returned the message as unroutable \(312 NO_ROUTE\): no queue is bound for routing key "orders\.\Q$zz\E" on exchange "ex"; refused for the target's unroutable_after \(2 s\)$/,
			  join('; ', @$d)) });
cmp_ok($node->safe_psql('postgres', "SELECT attempts FROM outbox.dead_letters WHERE target = 'mq'"),
	'>', 2, 'RabbitMQ: refused more often than max_attempts (2): refusals are not attempts');
ok_wait('RabbitMQ: the message after it is in q1',
	sub { my $n = rmq_count($murl, 'q1'); return ($n == 1, "$n messages in q1") });

# --- a refused message does not make the broker take the rest of its
# request again: one request of two keys, the first refused, the second
# confirmed; the second is delivered once (without this, RabbitMQ and
# Kafka stored it again with each request after the refusal) ---
sub request_of_two
{
	my ($t, $first_topic, $first_key, $second_topic, $second_key) = @_;
	$node->safe_psql('postgres', qq{
		SELECT outbox_emit('$first_topic', '{"n": 1}', '$first_key');
		SELECT outbox_emit('$second_topic', '{"n": 2}', '$second_key');
	});
	ok_wait("$t: the refused message is a dead letter, the other delivered, none pending",
		sub { my $l = $node->safe_psql('postgres',
				"SELECT dead_letters || '|' || delivered || '|' || pending"
				  . " FROM outbox.lag WHERE target = '$t'");
			  return ($l eq '1|1|0', "dead_letters|delivered|pending: $l") });
}
request_of_two('mq1', 'mq1', 'zz1', 'mq1', 'k2');
is(rmq_count($murl, 'q2'), 1, 'RabbitMQ: the confirmed message of the request is in q2 once');

# --- Kafka: a topic the cluster lacks ---
my $ka = key_in_lane(0, qw(ka kb kc kd ke kf));
my $kb = key_in_lane(1, qw(ka kb kc kd ke kf));
$node->safe_psql('postgres', qq{SELECT outbox_emit('missing', '{"n": 1}', '$ka')});
ok_wait('Kafka: topic "missing" is refused',
	sub { my $f = failing_id('k'); return ($f ne '', "failing_id: '$f'; " . lag_of('k')) });
$node->safe_psql('postgres', qq{SELECT outbox_emit('orders', '{"n": 2}', '$kb')});
ok_wait('Kafka: the message for a missing topic is a dead letter naming the topic',
	sub { my $d = dead_letter_lines($node, 'k');
		  return (@$d == 1 && $d->[0] =~ /^\Q$ka\E\|.*the Kafka cluster does not take topic "missing": .*; refused for the target's unroutable_after \(2 s\)$/,
			  join('; ', @$d)) });
ok_wait('Kafka: the message after it is in orders',
	sub { my $n = scalar(@{ kafka_consume($mock, 'orders') }); return ($n == 1, "$n records") });
# (the request of two: topic "ordxx" refused, "orders" confirmed)
request_of_two('k1', 'xx', 'a', 'ers', 'b');
is(scalar(@{ kafka_consume($mock, 'orders') }), 2, 'Kafka: the confirmed record of the request is in orders once');

# --- HTTP: a head held by a 404, set aside ---
sink_control($sink, { path => '/h', status => 404 });
$node->safe_psql('postgres', q{SELECT outbox_emit('http', '{"n": 1}', 'h1')});
ok_wait('HTTP: the target is held by the 404',
	sub { my $f = failing_id('h'); return ($f ne '', 'failing_id: ' . $f . '; ' . lag_of('h')) });
my $hid = failing_id('h');
is($node->safe_psql('postgres', qq{SELECT outbox.set_aside('h', id => $hid)}), $hid,
	'HTTP: outbox.set_aside() with the id');
ok_wait('HTTP: the held message is a dead letter, set aside',
	sub { my $d = dead_letter_lines($node, 'h');
		  return (@$d == 1 && $d->[0] =~ /^h1\|set aside by \S+$/, join('; ', @$d)) });
sink_control($sink, { path => '/h', status => 204 });
$node->safe_psql('postgres', q{SELECT outbox_emit('http', '{"n": 2}', 'h2')});
ok_wait('HTTP: the next message is delivered',
	sub { my $n = grep { $_->{status} == 204 } @{ sink_attempts($sink, '/h') }; return ($n == 1, "$n delivered") });

# --- outbox.set_aside()'s errors, with their SQLSTATEs ---
like(sql_error(q{SELECT outbox.set_aside('h')}),
	qr/ERROR:  55000: no message of target "h" is failing/, 'set_aside: nothing failing (55000)');
like(sql_error(q{SELECT outbox.set_aside('h', id => 12345)}),
	qr/ERROR:  P0002: message 12345 is not failing on target "h"/, 'set_aside: an id that is not failing (P0002)');
like(sql_error(q{SELECT outbox.set_aside('nope')}),
	qr/ERROR:  42704: .*"nope"/, 'set_aside: an unknown target (42704)');
like(sql_error(q{SELECT outbox.set_aside('qq')}),
	qr/ERROR:  0A000: target "qq" is a queue/, 'set_aside: a queue (0A000)');
like(sql_error(qq{SELECT outbox.set_aside('h', E'two\\nlines')}),
	qr/ERROR:  22023: reason contains a control character/, 'set_aside: a reason with a control character (22023)');
like(sql_error(q{SELECT outbox.alter_target('h', unroutable_after => interval '1 minute')}),
	qr/ERROR:  .*target "h" is a http target/, 'alter_target: unroutable_after is a broker target\'s');

relay_no_crash($node);
kafka_stop($mock);
rmq_stop($rmq);
nats_stop($nats);
stop_sink($sink);
done_testing();
