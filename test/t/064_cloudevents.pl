# CloudEvents 1.0 on every target kind that can carry them (issue 29,
# item 1), checked with the official CloudEvents SDK (npm `cloudevents`,
# validation on; test/verify/ce_check.js) parsing what each consumer got:
#  - HTTP binary content mode (ce- headers, the payload as the body; still
#    signed per Standard Webhooks), structured mode
#    (application/cloudevents+json, a source of the target's own) and a
#    batch (application/cloudevents-batch+json);
#  - a message's own ce-* and ce_* headers reach no consumer (the relay's
#    attributes; a receiver may read "_" as "-");
#  - Kafka binary (ce_ headers, the key the partitionkey) and structured
#    mode, read back from librdkafka's mock cluster;
#  - NATS binary (ce- headers) and structured mode, read back from a
#    JetStream stream of a real nats-server;
#  - the attributes: id = msg_id, type = topic, source (the default names
#    the cluster and database), subject and partitionkey = key (none
#    without one), time = emitted_at, datacontenttype, sequence (the id,
#    zero-padded), traceparent and tracestate from the emitting
#    transaction; a key that HTTP headers cannot carry as is goes
#    percent-encoded;
#  - a target altered from format 'outbox' to 'cloudevents' and back sends
#    each shape; a message's own ce-* headers never reach a CloudEvent.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use File::Basename qw(dirname);
use Cwd qw(abs_path);
use JSON::PP;
use Encode;
use OutboxRelayTest;
use OutboxKafka;
use OutboxNats;

my $json = json_codec()->utf8->canonical;
my $cjson = json_codec();    # for text already decoded (the sink's bodies)
my $verify_dir = abs_path(dirname(__FILE__) . '/../verify');

my $node = relay_node('cloudevents', init => { extra => [ '--encoding=UTF8', '--locale=C' ] });
sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $sink = start_sink('ce');
my $url = $sink->{url};
my $secret = 'whsec_' . 'MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
my $mock = kafka_mock('kbin', 1, 'kstr', 1);
my $brokers = $mock->{bootstrap};
my $nats = nats_start('ce');
my $nurl = $nats->{url};
# two streams: the targets publish the same Nats-Msg-Id, which one stream
# would take once
nats_tool($nurl, 'create', 'CEB', 'ceb.>');
nats_tool($nurl, 'create', 'CES', 'ces.>');

q1(qq{
SELECT outbox.create_http_target('http_bin', '$url/bin', format => 'cloudevents', secret => '$secret');
SELECT outbox.create_http_target('http_str', '$url/str', format => 'cloudevents-structured',
	source => 'https://shop.example.com/orders');
SELECT outbox.create_http_target('http_batch', '$url/batch', format => 'cloudevents', batch_size => 10,
	lanes => 1);
SELECT outbox.create_http_target('http_alt', '$url/alt');
SELECT outbox.create_kafka_target('k_bin', '$brokers', topic => 'kbin', format => 'cloudevents');
SELECT outbox.create_kafka_target('k_str', '$brokers', topic => 'kstr', format => 'cloudevents-structured');
SELECT outbox.create_nats_target('n_bin', '$nurl', subject => 'ceb.x', format => 'cloudevents');
SELECT outbox.create_nats_target('n_str', '$nurl', subject => 'ces.x', format => 'cloudevents-structured');
SELECT outbox.subscribe(name, 'ce.*') FROM outbox.targets;
});

my $tp = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my $ts = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
q1(qq{
BEGIN;
SET LOCAL outbox.traceparent = '$tp';
SET LOCAL outbox.tracestate = '$ts';
SELECT outbox_emit('ce.orders', '{"order": 1, "name": "Zoë"}', 'customer-1',
	'{"x-tenant": "acme", "ce-type": "forged", "ce_type": "forged"}');
COMMIT;
SELECT outbox_emit('ce.orders', '{"order": 2}');
SELECT outbox_emit('ce.refunds', '[1, "two", null]', 'key with space/ü');
});

my %want;    # by msg_id
for my $row (split /\n/, q1(q{
SELECT msg_id, id, topic, coalesce(key, ''),
	   to_char(emitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), payload::text
  FROM outbox.messages ORDER BY id}))
{
	my ($mid, $id, $topic, $key, $at, $payload) = split /\|/, $row, 6;
	$want{$mid} = { id => $id, topic => $topic, key => $key, time => $at,
		data => $json->decode($payload) };
}
is(scalar(keys %want), 3, 'three messages emitted');
my $sysid = q1('SELECT system_identifier FROM pg_control_system()');
my $default_source = "/outbox/$sysid/postgres";

# Wait for everything: every target acknowledged (the receiver records a
# request before it answers; the brokers have what they acknowledged).
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'every target delivered the three messages')
  or diag(q1('SELECT * FROM outbox.lag'));

# What each consumer got, as ce_check.js reads it.
my @in;
for my $r (grep { ($_->{status} // 0) =~ /^2/ && $_->{path} ne '/alt' } @{ sink_records($sink) })
{
	(my $what = $r->{path}) =~ s{^/}{http_};
	push @in, [ $what, { binding => 'http', headers => $r->{headers}, body => $r->{body} }, $r ];
}
for my $topic ('kbin', 'kstr')
{
	push @in, [ "kafka_$topic", { binding => 'kafka', headers => $_->{headers}, key => $_->{key},
			body => $_->{payload} }, $_ ] for @{ kafka_consume($mock, $topic) };
}
for my $m (@{ nats_dump($nurl, 'CEB') }, @{ nats_dump($nurl, 'CES') })
{
	push @in, [ "nats_$m->{subject}", { binding => 'nats', headers => $m->{headers},
			body => $m->{payload} }, $m ];
}
# The message's own ce-type and ce_type ("forged") reach no consumer:
# a receiver that reads "_" as "-" would see them beside the relay's.
for my $d (@in)
{
	my ($what, $got) = @$d;
	my $h = $got->{headers} // {};
	my @forged = grep { $h->{$_} eq 'forged' } sort keys %$h;
	is("@forged", '', "$what: no header of the message's own ce-type or ce_type");
}
my $input = join('', map { $json->encode($_->[1]) . "\n" } @in);
my ($out, $err) = ('', '');
IPC::Run::run([ 'node', "$verify_dir/ce_check.js" ], '<', \$input, '>', \$out, '2>', \$err)
  or BAIL_OUT("ce_check.js failed: $err");
my @parsed = map { $json->decode($_) } split /\n/, $out;
is(scalar(@parsed), scalar(@in), 'the SDK read every delivery');

my %events;    # what => [events]
for my $i (0 .. $#in)
{
	my ($what, undef, $raw) = @{ $in[$i] };
	ok($parsed[$i]{ok}, "$what: the SDK parses and validates it")
	  or diag("$parsed[$i]{error}\n" . $json->encode($in[$i][1]));
	push @{ $events{$what} }, @{ $parsed[$i]{events} // [] };
}

sub check_events
{
	my ($what, $source, %opts) = @_;
	my @ev = @{ $events{$what} // [] };
	is(scalar(@ev), 3, "$what: three events");
	for my $ev (@ev)
	{
		my $w = $want{ $ev->{id} // '' };
		ok($w, "$what: the id is a message's msg_id") or next;
		my $label = "$what $w->{id}";
		is($ev->{specversion}, '1.0', "$label: specversion");
		is($ev->{type}, $w->{topic}, "$label: type is the topic");
		is($ev->{source}, $source, "$label: source");
		is($ev->{sequence}, sprintf('%019d', $w->{id}), "$label: sequence, zero-padded");
		is($ev->{datacontenttype}, 'application/json', "$label: datacontenttype");
		is_deeply($ev->{data}, $w->{data}, "$label: data is the payload");
		like($ev->{time}, qr/^\Q${\ substr($w->{time}, 0, 19)}\E/, "$label: time is emitted_at");
		my $key = Encode::decode_utf8($w->{key});
		# the HTTP binding percent-encodes the UTF-8; the SDK hands the
		# value on as sent
		my $subject = $w->{key};
		$subject =~ s/([^\x21-\x7e]|["%])/sprintf('%%%02X', ord($1))/ge if $opts{percent};
		if ($key eq '')
		{
			ok(!exists $ev->{subject} && !exists $ev->{partitionkey},
				"$label: no key, no subject or partitionkey");
		}
		else
		{
			is($ev->{subject}, $opts{percent} ? $subject : $key, "$label: subject is the key");
			is($ev->{partitionkey}, $opts{percent} ? $subject : $key, "$label: partitionkey is the key");
		}
		if ($w->{key} eq 'customer-1')
		{
			is($ev->{traceparent}, $tp, "$label: traceparent of the emitting transaction");
			is($ev->{tracestate}, $ts, "$label: tracestate of the emitting transaction");
			isnt($ev->{type}, 'forged', "$label: a message's ce-type header is not the type");
		}
		else
		{
			ok(!exists $ev->{traceparent}, "$label: no trace, no traceparent");
		}
	}
}
check_events('http_bin', $default_source, percent => 1);
check_events('http_str', 'https://shop.example.com/orders');
check_events('http_batch', $default_source);
check_events('kafka_kbin', $default_source);
check_events('kafka_kstr', $default_source);
check_events('nats_ceb.x', $default_source);
check_events('nats_ces.x', $default_source);

# The wire: content types, signatures, what stays as it was.
my @bin = grep { $_->{path} eq '/bin' } @{ sink_records($sink) };
for my $r (@bin)
{
	my $h = $r->{headers};
	is($h->{'content-type'}, 'application/json', 'binary mode: the body is the payload, as JSON');
	is($h->{'webhook-signature'},
		webhook_signature($secret, $h->{'webhook-id'}, $h->{'webhook-timestamp'},
			Encode::encode_utf8($r->{body})),
		'binary mode: still signed per Standard Webhooks');
	is($h->{'ce-id'}, $h->{'webhook-id'}, 'ce-id is the webhook-id');
}
for my $r (@bin)
{
	my $w = $want{ $r->{headers}{'ce-id'} };
	is($r->{headers}{'ce-time'}, $w->{time}, 'ce-time is emitted_at, RFC 3339 in UTC with microseconds');
	ok(!exists $r->{headers}{'outbox-topic'} && !exists $r->{headers}{'outbox-seq'},
		'no outbox-* copies of the attributes');
}
my ($spaced) = grep { ($_->{headers}{'ce-subject'} // '') =~ /space/ } @bin;
is($spaced->{headers}{'ce-subject'}, 'key%20with%20space/%C3%BC',
	'a key HTTP headers cannot carry as is goes percent-encoded in ce-subject');
is($_->{headers}{'content-type'}, 'application/cloudevents+json', 'structured mode: its content type')
  for grep { $_->{path} eq '/str' } @{ sink_records($sink) };
is($_->{headers}{'content-type'}, 'application/cloudevents-batch+json', 'a batch: its content type')
  for grep { $_->{path} eq '/batch' } @{ sink_records($sink) };
my @alt = grep { $_->{path} eq '/alt' } @{ sink_records($sink) };
is(scalar(@alt), 3, 'the outbox-format target got the three messages');
ok(!grep({ /^ce-(id|specversion|source)$/ } map { keys %{ $_->{headers} } } @alt),
	"format 'outbox' sends no CloudEvents attributes (only a message's own headers)");
is($_->{headers}{'content-type'}, 'application/json', 'Kafka binary mode: content-type is datacontenttype')
  for @{ kafka_consume($mock, 'kbin') };
is($_->{headers}{'content-type'}, 'application/cloudevents+json', 'Kafka structured mode: its content type')
  for @{ kafka_consume($mock, 'kstr') };
my ($kb) = grep { ($_->{key} // '') eq 'customer-1' } @{ kafka_consume($mock, 'kbin') };
is($kb->{headers}{ce_type}, 'ce.orders', "Kafka binary mode: a message's own ce_type header does not replace the relay's");
is($kb->{headers}{'x-tenant'}, 'acme', 'Kafka binary mode: the other headers of the message stay');

# alter: the outbox-format target to CloudEvents structured, then back.
q1(q{SELECT outbox.alter_target('http_alt', format => 'cloudevents-structured', source => 'urn:alt')});
wait_until(sub { q1(q{SELECT count(*) FROM outbox.lag WHERE target = 'http_alt' AND pending = 0}) eq '1' });
q1(q{SELECT outbox_emit('ce.after', '{"n": 4}', 'k4')});
my @a2 = sink_path_records($sink, '/alt', 4);
is($a2[3]{headers}{'content-type'}, 'application/cloudevents+json', 'altered to structured mode: sent as a CloudEvent');
my $ev = $cjson->decode($a2[3]{body});
is($ev->{source}, 'urn:alt', 'altered: the new source');
q1(q{SELECT outbox.alter_target('http_alt', format => 'outbox', source => '')});
wait_until(sub { q1(q{SELECT format FROM outbox.targets WHERE name = 'http_alt'}) eq 'outbox' });
q1(q{SELECT outbox_emit('ce.after', '{"n": 5}', 'k5')});
my @a3 = sink_path_records($sink, '/alt', 5);
is($a3[4]{body}, '{"n": 5}', 'altered back: the payload itself');

stop_sink($sink);
kafka_stop($mock);
nats_stop($nats);
relay_no_crash($node);
done_testing();
