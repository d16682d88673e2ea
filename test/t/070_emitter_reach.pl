# What an application that may only emit can make Redis, RabbitMQ, Kafka
# and HTTP targets do (issue 41), against a real redis-server and
# rabbitmq-server and librdkafka's mock cluster on loopback, the messages
# emitted by a role with nothing but EXECUTE on outbox_emit(); each target
# has one lane, so a message that held it would hold every key:
#  - Redis, stream 'orders:{key}': a key that makes the stream's name one
#    of the relay's de-duplication marks ("k1:outbox-dedup:<id of an
#    earlier message>"), a key naming a hash (WRONGTYPE), an empty key and
#    a key naming a stream out of entry ids are each that message's dead
#    letter with the reason; a template holding ":outbox-dedup:" is
#    refused;
#  - RabbitMQ: the headers the broker acts on (CC, BCC, x-death ...) are
#    left out, so the broker does not close the channel on a string CC;
#    all 70 headers of a message arrive; a header name AMQP cannot carry
#    (256 bytes) is that message's dead letter;
#  - Kafka, topic '{topic}': "__consumer_offsets" is refused as the
#    cluster's own;
#  - HTTP (batch_size 1): a key or header value with a blank at its start
#    or end, which receivers trim, is a dead letter, not altered; in a
#    batch of one (batch_size 10) the body carries them exactly and such
#    header copies are left out; a CloudEvents batch sends no message
#    headers;
#  and in every case the next message is delivered.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxRedis;
use OutboxRabbitMQ;
use OutboxKafka;

my $redis = redis_start('reach');
my $rurl = "redis://127.0.0.1:$redis->{port}";
my $rmq = rmq_start('reach');
my $murl = $rmq->{url};
rmq_tool($murl, 'declare', 'q');
my $mock = kafka_mock('orders', 1);
my $brokers = $mock->{bootstrap};

my $sink = start_sink('reach');
my $node = relay_node('emitter_reach');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_http_target('h', '$sink->{url}/h', batch_size => 1, lanes => 1,
		max_attempts => 0, headers => '{"x-tenant": "t"}');
	SELECT outbox.subscribe('h', 'http');
	SELECT outbox.create_http_target('hb', '$sink->{url}/hb', batch_size => 10, lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('hb', 'httpb');
	SELECT outbox.create_http_target('hc', '$sink->{url}/hc', batch_size => 10, lanes => 1,
		max_attempts => 0, format => 'cloudevents-structured');
	SELECT outbox.subscribe('hc', 'httpc');
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO app;
	SELECT outbox.create_redis_target('r', '$rurl', stream => 'orders:{key}', lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('r', 'redis');
	SELECT outbox.create_rabbitmq_target('mq', '$murl', routing_key => 'q', lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('mq', 'mq');
	SELECT outbox.create_kafka_target('k', '$brokers', topic => '{topic}', lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('k', '__consumer_offsets');
	SELECT outbox.subscribe('k', '_schemas');
	SELECT outbox.subscribe('k', 'orders');
});

# Emit as the application; returns the message's id (its uuid).
sub emit_as_app
{
	my ($topic, $key, $headers) = @_;
	return $node->safe_psql('postgres',
		'SELECT outbox_emit(' . sql_literal($topic) . q{, '{"n": 1}', } . sql_literal($key) . ', '
		  . sql_literal($headers) . '::jsonb)',
		extra_params => [ '-U', 'app' ]);
}

sub states
{
	return $node->safe_psql('postgres',
		q{SELECT string_agg(target || ' ' || state, ', ' ORDER BY target) FROM outbox.lag});
}

# Wait for $n dead letters of target $t (written with the relay's next
# progress write, which may come after a later message was delivered).
sub dead_letters_wait
{
	my ($t, $n) = @_;
	ok_wait("$t: $n dead letters", sub { my $d = dead_letter_lines($node, $t); return (@$d == $n, join('; ', @$d)) });
	return dead_letter_lines($node, $t);
}

# --- Redis ---
my ($rc, $out, $err) = $node->psql('postgres',
	qq{SELECT outbox.create_redis_target('x', '$rurl', stream => 'a:outbox-dedup:{key}')});
like($err, qr/invalid Redis stream key.*\n.*DETAIL:  The stream key is not usable: it holds ":outbox-dedup:", which names the relay's de-duplication marks/,
	'Redis: a stream template holding ":outbox-dedup:" is refused');
redis_cmd($redis, 'HSET', 'orders:cart', 'f', 'v');
my $first = emit_as_app('redis', 'k1');
ok_wait('Redis: the first message is in orders:k1',
	sub { my $n = redis_len($redis, 'orders:k1'); return ($n == 1, "XLEN $n") });
is(redis_cmd($redis, 'TYPE', "orders:k1:outbox-dedup:$first"), 'string',
	'... and its de-duplication mark is orders:k1:outbox-dedup:<its id>');
emit_as_app('redis', "k1:outbox-dedup:$first");
emit_as_app('redis', 'cart');
emit_as_app('redis', '');
redis_cmd($redis, 'XADD', 'orders:max', '18446744073709551615-18446744073709551615', 'f', 'v');
emit_as_app('redis', 'max');
emit_as_app('redis', 'k2');
ok_wait('Redis: the message after them is in orders:k2',
	sub { my $n = redis_len($redis, 'orders:k2'); return ($n == 1, "XLEN $n; " . join('; ', @{ dead_letter_lines($node, 'r') })) });
my $dl = dead_letters_wait('r', 4);
like($dl->[0] // '', qr/^k1:outbox-dedup:\Q$first\E\|the stream key holds ":outbox-dedup:" once the template is filled in: it would name one of the relay's de-duplication marks \("orders:k1:outbox-dedup:\Q$first\E"\)$/,
	'... the key that named a mark, with the reason');
like($dl->[1] // '', qr/^cart\|Redis answered WRONGTYPE for the stream key filled in from the message: a key of another type has that name \("orders:cart"\)$/,
	'... the key that named a hash (WRONGTYPE), with the reason');
like($dl->[2] // '', qr/^\|the stream template has \{key\} and the message has no key, or an empty one$/,
	'... the empty key, named so');
like($dl->[3] // '', qr/^max\|Redis answered that the stream filled in from the message can take no more entries: it has exhausted the last possible ID \("orders:max"\)$/,
	'... the key that named a stream out of entry ids, with the reason');
is(redis_cmd($redis, 'TYPE', 'orders:cart'), 'hash', '... the hash is untouched');

# --- RabbitMQ ---
my %many = map { ("x-h$_" => "v$_") } 1 .. 70;
my $many = OutboxRelayTest::json_codec()->canonical->encode(\%many);
emit_as_app('mq', 'a', '{"CC": "other", "BCC": "x", "x-death": "forged", "x-delay": "5000", "cc": "data", "x-tenant": "acme"}');
emit_as_app('mq', 'b', $many);
emit_as_app('mq', 'c', '{"' . ('h' x 256) . '": "v"}');
emit_as_app('mq', 'd');
ok_wait('RabbitMQ: three messages in the queue',
	sub { my $n = rmq_count($murl, 'q'); return ($n == 3, "$n in the queue; state: " . states()) });
my $msgs = rmq_dump($murl, 'q');
is(join(',', map { $_->{key} } @$msgs), 'a,b,d', 'RabbitMQ: a, b and d, in order');
is(join(',', sort @{ $msgs->[0]{header_names} // [] }), 'cc,outbox-key,outbox-seq,outbox-topic,webhook-id,x-tenant',
	'... a without CC, BCC, x-death and x-delay (the broker acts on them), with x-tenant and cc (which it does not)');
is(scalar(grep { /^x-h\d+$/ } @{ $msgs->[1]{header_names} // [] }), 70, '... b with all 70 of its headers');
$dl = dead_letters_wait('mq', 1);
like($dl->[0] // '', qr/^c\|a header name is longer than the 255 bytes AMQP carries$/,
	'... c, whose header name AMQP cannot carry');

# --- Kafka ---
emit_as_app('__consumer_offsets', 'x');
emit_as_app('_schemas', 's');
emit_as_app('orders', 'y');
ok_wait('Kafka: the message after it is in orders',
	sub { my $n = scalar(@{ kafka_consume($mock, 'orders') }); return ($n == 1, "$n records; state: " . states()) });
$dl = dead_letters_wait('k', 2);
like($dl->[0] // '', qr/^x\|the topic begins with "_", as the internal topics of the cluster and its tools do, which only the target's topic template may name \("__consumer_offsets"\)$/,
	'... the message for __consumer_offsets, with the reason');
like($dl->[1] // '', qr/^s\|the topic begins with "_".* \("_schemas"\)$/,
	'... and the one for _schemas (Schema Registry\'s)');

# --- HTTP ---
emit_as_app('http', '  pad');
emit_as_app('http', 'v', '{"x-v": "two  "}');
emit_as_app('http', 'ok  fine', '{"x-v": "in  side", "x_tenant": "forged"}');
ok_wait('HTTP: the message after them arrives',
	sub { my @r = grep { $_->{path} eq '/h' } @{ sink_records($sink) };
		  return (@r == 1, scalar(@r) . ' requests; state: ' . states()) });
my ($req) = grep { $_->{path} eq '/h' } @{ sink_records($sink) };
is("$req->{headers}{'outbox-key'}|$req->{headers}{'x-v'}", 'ok  fine|in  side',
	'HTTP: ... with its key and header value as emitted (blanks inside are carried)');
is(join(',', map { "$_=$req->{headers}{$_}" } grep { /^x[-_]tenant$/ } sort keys %{ $req->{headers} }),
	'x-tenant=t', "... and the target's x-tenant only: the message's x_tenant, its twin to a receiver that reads _ as -, left out");
$dl = dead_letters_wait('h', 2);
like($dl->[0] // '', qr/^  pad\|the message's key or a header value begins or ends with a space or tab, which an HTTP header cannot carry/,
	'... the key with leading blanks, which receivers would trim');
like($dl->[1] // '', qr/^v\|the message's key or a header value begins or ends/,
	'... the header value with trailing blanks');

# batch_size 10, a request of one message: the body carries the key and
# headers exactly, and a header copy that receivers would trim is left out
emit_as_app('httpb', '  pad', '{"x-v": "two  ", "x-w": "w"}');
ok_wait('HTTP, a batch of one: it arrives',
	sub { my @r = grep { $_->{path} eq '/hb' } @{ sink_records($sink) };
		  return (@r == 1, scalar(@r) . ' requests; state: ' . states()) });
($req) = grep { $_->{path} eq '/hb' } @{ sink_records($sink) };
my $batch = JSON::PP::decode_json($req->{body});
is(join('|', $batch->[0]{key}, $batch->[0]{headers}{'x-v'}, $batch->[0]{headers}{'x-w'}), '  pad|two  |w',
	'... its body carries the key and headers exactly');
is(join(',', map { "$_=$req->{headers}{$_}" } grep { /^(outbox-key|x-v|x-w)$/ } sort keys %{ $req->{headers} }),
	'x-w=w', '... and its headers only the copies that arrive as they are (not outbox-key, not x-v)');

# a CloudEvents batch has no place for a message's headers: none is sent,
# in a request of one message as in any other (docs/formats.md)
emit_as_app('httpc', 'k', '{"x-v": "two  ", "x-w": "w"}');
ok_wait('HTTP, a CloudEvents batch of one: it arrives',
	sub { my @r = grep { $_->{path} eq '/hc' } @{ sink_records($sink) };
		  return (@r == 1, scalar(@r) . ' requests; state: ' . states()) });
($req) = grep { $_->{path} eq '/hc' } @{ sink_records($sink) };
is(join(',', grep { /^x-/ } sort keys %{ $req->{headers} }), '',
	'... with none of the message\'s headers');

ok_wait('no target is held', sub { my $s = states(); return ($s eq 'h idle, hb idle, hc idle, k idle, mq idle, r idle', $s) });
relay_no_crash($node);
$node->stop;
kafka_stop($mock);
rmq_stop($rmq);
redis_stop($redis);
stop_sink($sink);
done_testing();
