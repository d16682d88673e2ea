# Fan-out: one stream of messages to an HTTP target (strict order) and to
# NOTIFY targets at once.  Each target gets every message it subscribes to
# exactly once, in commit order; the NOTIFY envelope carries id, seq,
# topic, key, headers, payload and emitted_at, and a message whose envelope
# would exceed NOTIFY's 7999-byte limit arrives with "payload_omitted":
# true instead of the payload (checked byte-exactly around the limit),
# while the HTTP target gets the whole payload.
use strict;
use warnings;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $json = JSON::PP->new->utf8->canonical;
my $sink = start_sink('fanout');
my $url = $sink->{url};
my $node = relay_node('relay_fanout');

$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('fan_http', '$url/fan', ordering => 'strict');
SELECT outbox.subscribe('fan_http', 'fan.*');
SELECT outbox.create_notify_target('fan_notify', 'outbox_fan');
SELECT outbox.subscribe('fan_notify', 'fan.*');
SELECT outbox.create_notify_target('fan_notify_b', 'outbox_fan_b');
SELECT outbox.subscribe('fan_notify_b', 'fan.b');
COMMIT;
});

# A listener: a psql session that LISTENs; psql prints the notifications
# it received after each command, so collect() runs a trivial one.
# The time limit is one command's: collect() starts it anew.
my ($lin, $lout, $lerr) = ('', '', '');
my $ltimer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
my $listener = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
	'<', \$lin, '>', \$lout, '2>', \$lerr, $ltimer);
my $tick = 0;
my %notes;    # channel => [ [raw payload bytes, decoded envelope] ]

sub collect
{
	return unless $listener->pumpable;    # the connection was lost
	$tick++;
	$ltimer->start($PostgreSQL::Test::Utils::timeout_default);
	$lin .= "SELECT 'tick $tick';\n";
	$listener->pump while $listener->pumpable && $lout !~ /^tick $tick$/m;
	while ($lout =~ s/^Asynchronous notification "([^"]+)" with payload "(.*)" received from server process with PID \d+\.\n//m)
	{
		my ($chan, $raw) = ($1, $2);
		my $e = eval { $json->decode($raw) };
		# Not JSON: keep it, the checks below report it.
		$e //= { seq => 'not JSON: ' . substr($raw, 0, 40) };
		push @{ $notes{$chan} }, [ $raw, $e ];
	}
	$lout =~ s/^tick \d+\n//mg;
}
$lin .= "LISTEN outbox_fan;\nLISTEN outbox_fan_b;\n";
collect();
is($lerr, '', 'the listener listens');

# Concurrent transactions emit 1 to 3 messages each, on ten keys and two
# topics, some with headers.
$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=50',
	0,
	[qr{processed: 200/200}],
	[qr{^$}],
	'concurrent emitters',
	{
		'012_emit' => q{
\set k random(1, 10)
\set n random(1, 3)
BEGIN;
SELECT count(outbox_emit(CASE WHEN random() < 0.5 THEN 'fan.a' ELSE 'fan.b' END,
	jsonb_build_object('k', :k, 'g', g, 'pad', repeat('x', (random() * 50)::int)),
	'key-' || :k, CASE WHEN :k % 3 = 0 THEN jsonb_build_object('x-k', :k::text) END))
  FROM generate_series(1, :n) g;
COMMIT;
}
	});

# Payloads whose envelope straddles the NOTIFY limit, and one far beyond.
$node->safe_psql(
	'postgres', q{
SELECT count(outbox_emit('fan.big', jsonb_build_object('p', repeat('y', n)), 'big'))
  FROM generate_series(7700, 7900, 4) n;
SELECT outbox_emit('fan.big', jsonb_build_object('p', repeat('z', 20000)), NULL,
	'{"x-big": "yes"}');
});

my @msgs = map {
	my ($id, $mid, $topic, $key, $headers, $payload, $at) = split /\t/;
	{
		id => $mid,
		seq => $id + 0,
		topic => $topic,
		key => $key eq '\N' ? undef : $key,
		headers => $headers eq '\N' ? undef : $json->decode($headers),
		payload_text => $payload,
		emitted_at => $at
	}
} split /\n/, $node->safe_psql(
	'postgres', q{
COPY (SELECT id, msg_id, topic, key, headers::text, payload::text, to_json(emitted_at) #>> '{}'
        FROM outbox.messages ORDER BY id) TO STDOUT});
my %by_seq = map { $_->{seq} => $_ } @msgs;
my @all_seqs = map { $_->{seq} } @msgs;
my @b_seqs = map { $_->{seq} } grep { $_->{topic} eq 'fan.b' } @msgs;
cmp_ok(scalar @msgs, '>', 300, scalar(@msgs) . ' messages emitted');

# --- NOTIFY ---
my $n_all = @all_seqs;
ok( wait_until(
		sub {
			collect();
			return @{ $notes{outbox_fan} // [] } >= $n_all
			  && @{ $notes{outbox_fan_b} // [] } >= @b_seqs;
		}),
	'the listener received the notifications');
usleep(300_000);    # a span: anything more (duplicates) would show up now
collect();

is_deeply([ map { $_->[1]{seq} } @{ $notes{outbox_fan} } ], \@all_seqs,
	'NOTIFY target: every message once, in commit order');
is_deeply([ map { $_->[1]{seq} } @{ $notes{outbox_fan_b} } ], \@b_seqs,
	'NOTIFY target subscribed to one topic: its messages once, in commit order');

my (@bad, $omitted, $with_payload, @wrong_limit);
for my $n (@{ $notes{outbox_fan} }, @{ $notes{outbox_fan_b} })
{
	my ($raw, $e) = @$n;
	my $m = $by_seq{ $e->{seq} };
	my %want = (
		id => $m->{id},
		seq => $m->{seq},
		topic => $m->{topic},
		key => $m->{key},
		headers => $m->{headers},
		emitted_at => $m->{emitted_at});
	my %got = %$e;
	my $payload = delete $got{payload};
	my $om = delete $got{payload_omitted};
	push @bad, $e->{seq} unless $json->encode(\%got) eq $json->encode(\%want);
	# The envelope with the payload, as the relay would have built it.
	my $full_len;
	if ($om)
	{
		$omitted++;
		push @bad, $e->{seq} if defined $payload || !JSON::PP::is_bool($om);
		$full_len = length($raw) - length(',"payload_omitted":true')
		  + length(',"payload":') + length($m->{payload_text});
		push @wrong_limit, "$e->{seq}: omitted, but the full envelope has $full_len bytes"
		  if $full_len <= 7999;
	}
	else
	{
		$with_payload++;
		push @bad, $e->{seq}
		  unless $json->encode($payload) eq $json->encode($json->decode($m->{payload_text}));
		push @wrong_limit, "$e->{seq}: sent with its payload in " . length($raw) . ' bytes'
		  if length($raw) > 7999;
	}
}
is_deeply(\@bad, [],
	'NOTIFY envelopes carry the stored id, seq, topic, key, headers, payload, emitted_at');
is_deeply(\@wrong_limit, [],
	'payloads are omitted exactly when the envelope would exceed 7999 bytes');
cmp_ok($omitted, '>=', 2, "some envelopes ($omitted) went without their payload");
my @near = grep { $by_seq{ $_->[1]{seq} }{topic} eq 'fan.big' && !$_->[1]{payload_omitted} }
  @{ $notes{outbox_fan} };
cmp_ok(scalar @near, '>=', 2,
	'some of the large payloads just below the limit went with their payload');
my ($huge) = grep { $by_seq{ $_->[1]{seq} }{payload_text} =~ /zzzz/ } @{ $notes{outbox_fan} };
ok($huge && $huge->[1]{payload_omitted}, 'a 20 kB payload arrives as payload_omitted');
is_deeply($huge && $huge->[1]{headers}, { 'x-big' => 'yes' }, '... with its headers');

# --- HTTP ---
ok( wait_until(sub { @{ sink_attempts($sink) } >= $n_all }),
	'the HTTP target received the messages');
my $http = sink_attempts($sink);
is_deeply([ map { $_->{seq} } @$http ], \@all_seqs,
	'HTTP target (strict order): every message once, in commit order');
is(scalar(grep { $_->{status} != 204 } @$http), 0, '... each answered 204');
my ($big_http) = grep { $_->{body} =~ /zzzz/ } @{ sink_records($sink) };
is($big_http && $big_http->{body}, $by_seq{ $big_http->{headers}{'outbox-seq'} }{payload_text},
	'the HTTP target gets the whole 20 kB payload');

ok( $node->poll_query_until(
		'postgres', q{SELECT string_agg(format('%s:%s:%s', target, pending, delivered), ' ' ORDER BY target)
		                FROM outbox.lag},
		"fan_http:0:$n_all fan_notify:0:$n_all fan_notify_b:0:" . scalar(@b_seqs)),
	'the lag view: nothing pending, all delivered, for each target');

# --- a message whose headers alone exceed the NOTIFY limit ---
# Its envelope cannot fit even without the payload.  It must not block the
# target: later messages still arrive (the large one is notified in a
# smaller form, or dead-lettered with the reason).
$node->safe_psql('postgres',
	q{SELECT outbox_emit('fan.a', '{"h": "big"}', 'hk', jsonb_build_object('x-big', repeat('h', 9000)))});
$node->safe_psql('postgres', q{SELECT outbox_emit('fan.a', '{"after": "big headers"}', 'hk')});
my $after = wait_until(
	sub {
		collect();
		return grep { $_->[0] =~ /big headers/ } @{ $notes{outbox_fan} };
	});
ok($after, 'a message with 9000 bytes of headers does not block the NOTIFY target');
diag('NOTIFY target stuck; last log line about it: '
	  . ((grep { /could not notify/ } split /^/, slurp_file($node->logfile))[-1] // 'none'))
  unless $after;
my $big_h_seq = $node->safe_psql('postgres',
	q{SELECT id FROM outbox.messages WHERE payload = '{"h": "big"}'});
ok( (grep { $_->[1]{seq} == $big_h_seq } @{ $notes{outbox_fan} })
	  || $node->safe_psql('postgres',
		"SELECT count(*) FROM outbox.dead_letters WHERE target = 'fan_notify' AND id = $big_h_seq") eq '1',
	'... the message itself is notified or dead-lettered');

$lin .= "\\q\n";
eval { $listener->finish };
stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
