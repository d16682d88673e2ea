# Amazon SQS targets against the emulator fauxqs on loopback, behind a
# front that checks every request's AWS Signature Version 4 with AWS's own
# signer (@smithy/signature-v4) and answers as SQS does when it does not
# hold (test/aws/aws_peer.mjs):
#  - a standard and a FIFO queue: every message there once with its body,
#    outbox-* attributes and headers; the FIFO queue per key in commit
#    order, MessageGroupId the key (a key SQS would not take: its hash),
#    MessageDeduplicationId the message id; every request signed right;
#  - CloudEvents in structured mode;
#  - a wrong secret (SignatureDoesNotMatch), an expired session token, a
#    queue that does not exist, a region that is not the queue's: held
#    with SQS's reason, nothing dead-lettered, then delivered in order
#    once set right (set_aws_credentials, the queue made);
#  - throttling: the target backs off, no message uses up its attempts;
#  - entries of a batch that fail (SQS's fault): sent again, in order, an
#    entry stored never sent again; an entry SQS refuses as the sender's
#    fault: a dead letter, the rest of its request stored; a request refused
#    whole for one entry: that one a dead letter, the others using up no
#    attempt; 5xx and answers that are not JSON: tried again;
#  - a message over the queue's MaximumMessageSize, and one over SQS's
#    1 MiB: dead letters with the reason, the rest of the key in order;
#  - the relay killed (kill -9) mid-stream: every message there, the FIFO
#    queue's copies dropped by their deduplication id;
#  - destination rules apply to SQS requests;
#  - web identity: credentials from STS (AssumeRoleWithWebIdentity) for the
#    token a file holds, renewed ahead of expiry, asked for again once when
#    SQS finds them expired (the file read again: a rotated token), the
#    target held with STS's reason when it refuses, the file is gone or
#    is a FIFO (refused without blocking the relay);
#  - bad options refused at create time (region not the URL's).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Cwd qw(abs_path);
use JSON::PP;
use POSIX ();
use OutboxRelayTest;
use OutboxAws;

my $json = JSON::PP->new->utf8->canonical;
# the bodies the peer's answer held, already characters
my $chars = JSON::PP->new->canonical;
my $peer = aws_peer_start('sqs');
my $key_id = 'AKIAIOSFODNN7EXAMPLE';
my $secret = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY';
my $temp_id = 'ASIAIOSFODNN7EXAMPLE';
aws_control($peer, 'setup', {
	region => 'eu-west-1',
	keys => { $key_id => $secret, $temp_id => 'temporary/secret' },
	tokens => { $temp_id => 'token-new' },
	expired => ['token-old'] });
for my $q ([ 'orders', {} ], [ 'orders.fifo', { FifoQueue => 'true' } ],
	[ 'small.fifo', { FifoQueue => 'true', MaximumMessageSize => '1024' } ],
	[ 'temp', {} ], [ 'ce', {} ], [ 'kill.fifo', { FifoQueue => 'true' } ])
{
	aws_control($peer, 'queue', { name => $q->[0], attributes => $q->[1] });
}

my $node = relay_node('sqs', conf => "outbox.max_payload_size = '4MB'\n");

sub target
{
	my ($name, $queue, %o) = @_;
	my $opts = join('', map { ", $_ => $o{$_}" } sort keys %o);
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_sqs_target('$name', '$peer->{url}/000000000000/$queue', 'eu-west-1',
			'$key_id', '$secret'$opts);
		SELECT outbox.subscribe('$name', '$name.*');});
}

sub pending
{
	my ($t) = @_;
	return lag_value($node, $t, 'pending');
}

my $emitted = 0;
sub emit
{
	my ($t, $n, $nkeys, %o) = @_;
	aws_emit($node, \$emitted, $t, $n, $nkeys, %o);
}

# Per key, the messages' n in queue order.
sub keys_of
{
	my ($msgs) = @_;
	my %k;
	push @{ $k{ $_->{attrs}{'outbox-key'} // '' } }, $chars->decode($_->{body})->{n} for @$msgs;
	return \%k;
}

sub signatures_all_good
{
	my ($what) = @_;
	my $s = aws_stats($peer);
	is_deeply($s->{refused}, {}, "$what: SQS refused no request's signature or credentials")
	  or diag($json->encode($s->{refused}));
	return $s;
}

# --- a standard and a FIFO queue ------------------------------------------
target('std', 'orders');
target('fifo', 'orders.fifo');
emit('std', 300, 30, extra => 'h\u00e9llo \"q\"');
emit('fifo', 300, 30);
# a key SQS does not take as a MessageGroupId (blanks, not ASCII): its hash
$node->safe_psql('postgres', q{
	SELECT outbox_emit('fifo.x', jsonb_build_object('n', 10000 + g), 'clé avec espace') FROM generate_series(1, 5) g;});
ok_wait('every message of the standard and FIFO targets delivered',
	sub { my $p = pending('std') + pending('fifo'); return ($p == 0, "$p pending") });
my $std = sqs_drain($peer, 'orders');
is(scalar(@$std), 300, 'the standard queue holds the 300 messages');
my %seen;
$seen{ $chars->decode($_->{body})->{n} }++ for @$std;
is(scalar(keys %seen), 300, 'each of them once');
my ($m) = grep { $chars->decode($_->{body})->{n} == 1 } @$std;
is($chars->decode($m->{body})->{s}, "h\x{e9}llo \"q\"", 'the body is the payload, its text as it was');
is($m->{attrs}{'outbox-topic'}, 'std.x', 'outbox-topic');
is($m->{attrs}{'outbox-key'}, 'k1', 'outbox-key');
like($m->{attrs}{'outbox-seq'}, qr/^[1-9][0-9]*$/, 'outbox-seq is the id');
like($m->{attrs}{'outbox-id'}, qr/^[0-9a-f-]{36}$/, 'outbox-id is the message id');
is($m->{attrs}{'outbox-headers'}, '{"x-trace": "t1"}', 'the headers in outbox-headers');

my $fifo = sqs_drain($peer, 'orders.fifo');
is(scalar(@$fifo), 305, 'the FIFO queue holds the 305 messages');
my $k = keys_of($fifo);
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'FIFO: per key, in commit order');
is(scalar(grep { $_->{group} ne ($_->{attrs}{'outbox-key'} =~ /^[!-~]+$/ ? $_->{attrs}{'outbox-key'} : 'x') && $_->{attrs}{'outbox-key'} =~ /^[!-~]+$/ } @$fifo),
	0, 'FIFO: MessageGroupId is the key');
my @hashed = grep { $_->{attrs}{'outbox-key'} eq "cl\x{e9} avec espace" } @$fifo;
is(scalar(@hashed), 5, 'FIFO: the messages of a key that is no group id');
like($hashed[0]{group}, qr/^outbox-sha256-[0-9a-f]{64}$/, 'their MessageGroupId is the key\'s hash');
is(scalar(grep { $_->{dedup} ne $_->{attrs}{'outbox-id'} } @$fifo), 0,
	'FIFO: MessageDeduplicationId is the message id');
my $s = signatures_all_good('standard and FIFO');
ok((grep { $_ > 1 } @{ $s->{batches} }), 'requests carried several messages (SendMessageBatch)');
ok(!(grep { $_ > 10 } @{ $s->{batches} }), 'no request carried more than 10');

# --- CloudEvents ----------------------------------------------------------
target('ce', 'ce', format => q{'cloudevents-structured'}, source => q{'/shop'});
emit('ce', 1, 1);
ok_wait('the CloudEvent delivered', sub { return (pending('ce') == 0) });
my $ce = sqs_drain($peer, 'ce');
my $ev = $chars->decode($ce->[0]{body});
is($ev->{specversion}, '1.0', 'CloudEvents: the body is a CloudEvent');
is($ev->{source}, '/shop', 'with its source');
is($ev->{type}, 'ce.x', 'and the topic as its type');
is($ev->{data}{n}, $emitted, 'and the payload as its data');

# --- a wrong secret, then the right one -----------------------------------
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('fifo', '$key_id', 'not-the-secret')});
emit('fifo', 20, 4);
ok_wait('a wrong secret: the target is held with SignatureDoesNotMatch',
	sub { my $e = lag_value($node, 'fifo', 'last_error'); return (scalar($e =~ /SignatureDoesNotMatch/), $e) });
is(dead_letter_lines($node, 'fifo')->[0], undef, 'nothing dead-lettered');
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('fifo', '$key_id', '$secret')});
ok_wait('the right secret: delivered', sub { return (pending('fifo') == 0, pending('fifo') . ' pending') });
$k = keys_of(sqs_drain($peer, 'orders.fifo'));
is(scalar(map { @$_ } values %$k), 20, 'all 20 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');

# --- temporary credentials: an expired session token ----------------------
$node->safe_psql('postgres', qq{
	SELECT outbox.create_sqs_target('temp', '$peer->{url}/000000000000/temp', 'eu-west-1',
		'$temp_id', 'temporary/secret', 'token-old');
	SELECT outbox.subscribe('temp', 'temp.*');});
emit('temp', 10, 2);
ok_wait('an expired session token: held with ExpiredToken',
	sub { my $e = lag_value($node, 'temp', 'last_error'); return (scalar($e =~ /ExpiredToken/), $e) });
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('temp', '$temp_id', 'temporary/secret', 'token-new')});
ok_wait('a new session token: delivered', sub { return (pending('temp') == 0) });
is(scalar(@{ sqs_drain($peer, 'temp') }), 10, 'all 10 there');
is(dead_letter_lines($node, 'temp')->[0], undef, 'nothing dead-lettered');

# --- a queue that does not exist, then made -------------------------------
target('later', 'later');
emit('later', 10, 2);
ok_wait('a queue that does not exist: held with QueueDoesNotExist',
	sub { my $e = lag_value($node, 'later', 'last_error'); return (scalar($e =~ /QueueDoesNotExist/), $e) });
aws_control($peer, 'queue', { name => 'later', attributes => {} });
ok_wait('the queue made: delivered by itself', sub { return (pending('later') == 0) });
is(scalar(@{ sqs_drain($peer, 'later') }), 10, 'all 10 there');
is(dead_letter_lines($node, 'later')->[0], undef, 'nothing dead-lettered');

# --- a region that is not the queue's -------------------------------------
$node->safe_psql('postgres', qq{
	SELECT outbox.create_sqs_target('west', '$peer->{url}/000000000000/orders', 'us-west-2', '$key_id', '$secret');
	SELECT outbox.subscribe('west', 'west.*');});
emit('west', 1, 1);
ok_wait('a region that is not the queue\'s: held with SQS\'s reason',
	sub { my $e = lag_value($node, 'west', 'last_error'); return (scalar($e =~ /SignatureDoesNotMatch: Credential should be scoped/), $e) });
$node->safe_psql('postgres', q{SELECT outbox.drop_target('west')});
my ($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_sqs_target('x', 'https://sqs.us-east-1.amazonaws.com/123456789012/orders', 'eu-west-1', '$key_id', '$secret')});
like($err, qr/invalid AWS region 'eu-west-1' for an SQS target.*DETAIL:  The region is not usable: the queue URL is in region "us-east-1"/s,
	'a region that is not the queue URL\'s is refused at create time');
sqs_drain($peer, 'orders');

# --- throttling: the target backs off, no attempts used up ----------------
$node->safe_psql('postgres', q{SELECT outbox.alter_target('fifo', max_attempts => 1)});
aws_control($peer, 'fault', { throttle => 4 });
emit('fifo', 20, 4);
ok_wait('throttled 4 times: delivered', sub { return (pending('fifo') == 0, pending('fifo') . ' pending') });
is(aws_stats($peer)->{refused}{throttled}, 4, 'the peer throttled 4 requests');
is(dead_letter_lines($node, 'fifo')->[0], undef, 'nothing dead-lettered (max_attempts 1)');
$k = keys_of(sqs_drain($peer, 'orders.fifo'));
is(scalar(map { @$_ } values %$k), 20, 'all 20 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('fifo', max_attempts => 10)});

# --- entries of a batch that fail (SQS's fault): sent again in order -----
# On the standard queue, which drops no copy: an entry SQS stored is never
# sent again; max_attempts 10, as made.
aws_control($peer, 'fault', { marker => 'flaky', marker_times => 6 });
emit('std', 40, 8, extra => 'flaky');
ok_wait('entries that failed (SQS\'s fault): sent again, delivered',
	sub { return (pending('std') == 0, pending('std') . ' pending') });
my $got = sqs_drain($peer, 'orders');
%seen = ();
$seen{ $chars->decode($_->{body})->{n} }++ for @$got;
is(scalar(@$got), 40, 'all 40 there ...');
is(scalar(keys %seen), 40, '... each once: no entry SQS stored was sent again');
like(lag_value($node, 'std', 'last_error'), qr/SQS failed to store the message: InternalError/,
	'last_error says which entry failed');
is(dead_letter_lines($node, 'std')->[0], undef, 'nothing dead-lettered');
# the same on the FIFO queue: per key in order
aws_control($peer, 'fault', { marker => 'flaky', marker_times => 6 });
emit('fifo', 40, 8, extra => 'flaky');
ok_wait('FIFO: entries that failed sent again, delivered',
	sub { return (pending('fifo') == 0, pending('fifo') . ' pending') });
$k = keys_of(sqs_drain($peer, 'orders.fifo'));
is(scalar(map { @$_ } values %$k), 40, 'FIFO: all 40 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'FIFO: per key in order');
is(dead_letter_lines($node, 'fifo')->[0], undef, 'FIFO: nothing dead-lettered');

# --- an entry SQS refuses as the sender's fault, among entries stored -----
aws_control($peer, 'fault', { marker => 'refuse-me', marker_times => 1, marker_sender => JSON::PP::true,
	marker_code => 'InvalidMessageContents' });
$node->safe_psql('postgres', q{
	SELECT outbox_emit('std.x', jsonb_build_object('n', 20000 + g, 's', CASE WHEN g = 5 THEN 'refuse-me' ELSE 'ok' END),
					   'sk' || g) FROM generate_series(1, 10) g;});
ok_wait('an entry refused as the sender\'s fault: the rest delivered',
	sub { return (pending('std') == 0, pending('std') . ' pending') });
my $dl = dead_letter_lines($node, 'std');
is_deeply($dl, ['sk5|SQS refused the message: InvalidMessageContents: injected failure of one entry'],
	'that message alone is a dead letter, with SQS\'s reason');
$got = sqs_drain($peer, 'orders');
is_deeply([ sort map { $chars->decode($_->{body})->{n} } @$got ], [ map { 20000 + $_ } 1 .. 4, 6 .. 10 ],
	'the other 9 there, each once');
$node->safe_psql('postgres', q{SELECT outbox.discard_dead_letters('std')});
aws_control($peer, 'fault', { marker => undef, marker_times => 0, marker_sender => JSON::PP::false, marker_code => undef });

# --- a whole request refused for one entry's content -----------------------
# One lane, so the refused message shares its request with others; with
# max_attempts 1, the others must use up no attempt while the relay finds
# which one SQS refuses.
target('one', 'orders', lanes => 1, max_attempts => 1);
aws_control($peer, 'fault', { reject_marker => 'poison' });
$node->safe_psql('postgres', q{
	SELECT outbox_emit('one.x', jsonb_build_object('n', 30000 + g, 's', CASE WHEN g = 4 THEN 'poison' ELSE 'ok' END),
					   'pk' || g) FROM generate_series(1, 10) g;});
ok_wait('a request refused whole for one entry: the rest delivered',
	sub { return (pending('one') == 0, pending('one') . ' pending') });
is_deeply(dead_letter_lines($node, 'one'), ['pk4|SQS answered HTTP 400: InvalidMessageContents: Invalid characters found.'],
	'only the message SQS refuses is a dead letter');
$got = sqs_drain($peer, 'orders');
%seen = ();
$seen{ $chars->decode($_->{body})->{n} }++ for @$got;
is_deeply([ sort keys %seen ], [ map { 30000 + $_ } 1 .. 3, 5 .. 10 ], 'the other 9 there');
ok(aws_stats($peer)->{refused}{'rejected whole'} >= 2, 'requests of several messages were refused whole');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('one')});
aws_control($peer, 'fault', { reject_marker => undef });

# --- 5xx, and a 200 that is not SQS's answer: tried again -------------------
# (an answer whose Ids are not those sent, "00" for "0", stores nothing)
aws_control($peer, 'fault', { error500 => 2, garbage => 2, bad_ids => 3 });
emit('std', 10, 10);
ok_wait('after 500s, answers that are not JSON and Ids not sent: delivered',
	sub { return (pending('std') == 0, pending('std') . ' pending') });
is(scalar(@{ sqs_drain($peer, 'orders') }), 10, 'all 10 there');
is(dead_letter_lines($node, 'std')->[0], undef, 'nothing dead-lettered');

# --- too large: dead letters with the reason ------------------------------
target('small', 'small.fifo');
my $big = 'x' x 2000;
$node->safe_psql('postgres', qq{
	SELECT outbox_emit('small.x', '{"n": 1}', 'k');
	SELECT outbox_emit('small.x', '{"n": 2, "big": "$big"}', 'k');
	SELECT outbox_emit('small.x', '{"n": 3}', 'k');
	SELECT outbox_emit('small.x', jsonb_build_object('n', 4, 'huge', repeat('y', 1100000)), 'k');
	SELECT outbox_emit('small.x', '{"n": 5}', 'k');});
ok_wait('a message over the queue\'s size and one over SQS\'s: the rest delivered',
	sub { return (pending('small') == 0, pending('small') . ' pending') });
$dl = dead_letter_lines($node, 'small');
is(scalar(@$dl), 2, 'two dead letters');
like($dl->[0], qr/^k\|SQS refused the message: InvalidParameterValue: .*shorter than 1024 bytes/,
	'the one over the queue\'s MaximumMessageSize, with SQS\'s reason');
like($dl->[1], qr/^k\|the message takes \d+ bytes as SQS counts them .* over SQS's limit of 1048576/,
	'the one over 1 MiB, refused before it was sent');
is_deeply([ map { $chars->decode($_->{body})->{n} } @{ sqs_drain($peer, 'small.fifo') } ], [ 1, 3, 5 ],
	'the rest of the key delivered, in order');

# --- destination rules -----------------------------------------------------
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.0/8'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.0/8');
emit('std', 1, 1);
ok_wait('a denied address is refused at connect',
	sub { my $e = lag_value($node, 'std', 'last_error'); return (scalar($e =~ /connection refused by the relay: 127\.0\.0\.1 is denied/), $e) });
is(scalar(@{ sqs_drain($peer, 'orders') }), 0, 'nothing was sent');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
$node->reload;
ok_wait('allowed again: delivered', sub { return (pending('std') == 0) });
is(scalar(@{ sqs_drain($peer, 'orders') }), 1, 'the message is there');

# --- web identity: credentials from STS -----------------------------------
# The token a file holds (as EKS writes one), exchanged with STS
# (AssumeRoleWithWebIdentity, the peer's /sts) for temporary credentials.
my $role = 'arn:aws:iam::000000000000:role/outbox-relay';
# (absolute: the server reads it; 16's tempdir() is relative to the test's directory)
my $wi_dir = abs_path(PostgreSQL::Test::Utils::tempdir());
my $wi_file = "$wi_dir/token";
my $wi_token = 'eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6b3V0Ym94In0.c2ln';
PostgreSQL::Test::Utils::append_to_file($wi_file, "$wi_token\n");
aws_control($peer, 'setup', { web_identity => { role => $role, token => $wi_token } });
aws_control($peer, 'queue', { name => 'wi', attributes => {} });
$node->safe_psql('postgres', qq{
	SELECT outbox.create_sqs_target('wi', '$peer->{url}/000000000000/wi', 'eu-west-1',
		role_arn => '$role', web_identity_token_file => '$wi_file',
		sts_endpoint => '$peer->{url}/sts', max_attempts => 1);
	SELECT outbox.subscribe('wi', 'wi.*');});
my %wi_seen;
sub wi_delivered
{
	my ($what, $want) = @_;
	ok_wait("$what: delivered", sub { return (pending('wi') == 0, pending('wi') . ' pending') });
	$wi_seen{ $chars->decode($_->{body})->{n} }++ for @{ sqs_drain($peer, 'wi') };
	is(scalar(keys %wi_seen), $want, "$what: all $want there");
	is(scalar(grep { $_ > 1 } values %wi_seen), 0, "$what: each once");
	is(dead_letter_lines($node, 'wi')->[0], undef, "$what: nothing dead-lettered");
}
sub wi_held
{
	my ($what, $re) = @_;
	emit('wi', 5, 5);
	ok_wait("$what: held with the reason",
		sub { my $e = lag_value($node, 'wi', 'last_error'); return (scalar($e =~ $re), $e) });
	cmp_ok(pending('wi'), '>', 0, "$what: messages wait");
	is(dead_letter_lines($node, 'wi')->[0], undef, "$what: nothing dead-lettered");
}
emit('wi', 30, 5);
wi_delivered('web identity', 30);
is(aws_stats($peer)->{sts}{issued}, 1, 'one set of credentials from STS');
is($node->safe_psql('postgres', q{SELECT aws_access_key_id IS NULL FROM outbox.targets WHERE name = 'wi'}),
	't', 'no access key stored');

# The platform rotates the token; the credentials expire in flight
# (ExpiredToken): new ones once, with the new token, the request again.
my $wi_token2 = 'eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyb3RhdGVkIn0.c2lnMg';
unlink $wi_file;
PostgreSQL::Test::Utils::append_to_file($wi_file, $wi_token2);
aws_control($peer, 'setup', { web_identity => { role => $role, token => $wi_token2 } });
aws_control($peer, 'expire_sessions', {});
my $wi_log = -s $node->logfile;
emit('wi', 10, 5);
wi_delivered('credentials expired in flight', 40);
# (each lane's request on the wire with them is refused: at most one a lane)
my $expired = aws_stats($peer)->{refused}{'expired session'} // 0;
ok($expired >= 1 && $expired <= 8, "SQS refused the expired credentials ($expired requests, one a lane at most)");
is(aws_stats($peer)->{sts}{issued}, 2, 'new credentials asked for once, with the rotated token');
unlike(slurp_file($node->logfile, $wi_log), qr/holds target "wi"/, 'the target was not held');

# Credentials renewed ahead of their expiry: ten seconds each.
aws_control($peer, 'setup', { sts_lifetime => 10 });
aws_control($peer, 'expire_sessions', {});
emit('wi', 2, 2);
ok_wait('ten-second credentials: delivered', sub { return (pending('wi') == 0) });
$expired = aws_stats($peer)->{refused}{'expired session'};
my $issued = aws_stats($peer)->{sts}{issued};
my $t0 = time;
my $n_wi = 42;
while (time - $t0 < 13)
{
	emit('wi', 2, 2);
	$n_wi += 2;
	ok_wait('a round delivered', sub { return (pending('wi') == 0) }) or last;
	sleep 1;    # the span over which credentials expire
}
wi_delivered('credentials renewed', $n_wi);
cmp_ok(aws_stats($peer)->{sts}{issued} - $issued, '>=', 1, 'credentials renewed before they expire (13 s of 10-second ones)');
is(aws_stats($peer)->{refused}{'expired session'}, $expired, 'no request signed with credentials that had expired');
aws_control($peer, 'setup', { sts_lifetime => 3600 });

# STS refuses the token; the token file is gone: held with the reason.
aws_control($peer, 'fault', { sts_fail => 1000000, sts_status => 400, sts_code => 'InvalidIdentityToken' });
aws_control($peer, 'expire_sessions', {});
wi_held('STS refuses the token',
	qr/could not get AWS credentials for \Q$role\E from STS \(.*\): HTTP 400: InvalidIdentityToken \(fault injected by the test\)/);
aws_control($peer, 'fault', { sts_fail => 0 });
$n_wi += 5;
wi_delivered('STS takes it again', $n_wi);
rename $wi_file, "$wi_file.away";
aws_control($peer, 'expire_sessions', {});
wi_held('the token file gone', qr/could not read the web identity token file "\Q$wi_file\E": No such file/);
rename "$wi_file.away", $wi_file;
$n_wi += 5;
wi_delivered('the token file back', $n_wi);
# A FIFO at the path: refused without blocking the relay (an open() would
# wait for a writer for ever).
rename $wi_file, "$wi_file.away";
POSIX::mkfifo($wi_file, 0600) or die "mkfifo: $!";
aws_control($peer, 'expire_sessions', {});
wi_held('a FIFO at the token path', qr/the web identity token file "\Q$wi_file\E" is not a regular file/);
unlink $wi_file;
rename "$wi_file.away", $wi_file;
$n_wi += 5;
wi_delivered('a token file again', $n_wi);
unlike(slurp_file($node->logfile), qr/\Q$wi_token\E|\Q$wi_token2\E/, 'no web identity token in the log');

# --- the relay killed mid-stream ------------------------------------------
# (a rate limit keeps the stream going while the relay is killed)
target('kill', 'kill.fifo', lanes => 4);
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kill', max_rate => 50)});
emit('kill', 3000, 50);
my $before = aws_stats($peer)->{entries};
ok_wait('delivering', sub { my $n = aws_stats($peer)->{entries} - $before; return ($n >= 300, "$n sent") });
my $pid = relay_worker_pid($node);
kill 'KILL', $pid;
my $at = aws_stats($peer)->{entries} - $before;
ok($at < 3000, "the relay was killed mid-stream ($at sent)");
# (the server restarts its processes after the kill: sessions fail meanwhile)
ok_wait('the server back', sub { return (defined eval { pending('kill') }) });
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kill', max_rate => 0)});
ok_wait('the relay killed -9: every message delivered after',
	sub { my $p = eval { pending('kill') } // ''; return ($p eq '0', $p) });
my $killed = sqs_drain($peer, 'kill.fifo');
is(scalar(@$killed), 3000, 'the FIFO queue holds each message once (copies dropped by MessageDeduplicationId)');
$k = keys_of($killed);
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');

my $st = aws_stats($peer);
is_deeply([ sort keys %{ $st->{refused} } ],
	[ 'bad ids', 'error500', 'expired session', 'expired token', 'garbage', 'rejected whole', 'scope', 'signature', 'throttled' ],
	'the only requests SQS refused were those the test asked for');
ok($st->{verified} > 100, "every other request's signature checked by AWS's signer ($st->{verified})");
relay_no_crash($node, $pid);
done_testing();
