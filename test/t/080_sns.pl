# Amazon SNS targets against the emulator fauxqs on loopback, behind a front
# that checks every request's AWS Signature Version 4 with AWS's own signer
# (test/aws/aws_peer.mjs); each topic delivers raw to an SQS queue the test
# reads:
#  - a FIFO topic: every message there once, per key in commit order, its
#    body the payload, the outbox-* attributes, MessageGroupId the key and
#    MessageDeduplicationId the message id; PublishBatch of several;
#  - a standard topic with CloudEvents in structured mode;
#  - a topic that does not exist (NotFound), a wrong secret: held with the
#    reason, nothing dead-lettered, delivered once set right;
#  - entries that fail (SNS's fault): sent again, each once; Throttled
#    entries: the target backs off; a request refused whole for one
#    entry: that one a dead letter; 5xx, answers not XML: tried again;
#    values a form encodes arrive as they were;
#  - a message over SNS's 256 KiB: a dead letter, the rest of the key in
#    order;
#  - bad options refused at create time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;
use OutboxAws;

my $chars = JSON::PP->new->canonical;
my $peer = aws_peer_start('sns');
my $key_id = 'AKIAIOSFODNN7EXAMPLE';
my $secret = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY';
aws_control($peer, 'setup', { region => 'eu-west-1', keys => { $key_id => $secret } });
aws_control($peer, 'queue', { name => 'from-sns.fifo', attributes => { FifoQueue => 'true' } });
aws_control($peer, 'queue', { name => 'from-events', attributes => {} });
my $fifo_arn = aws_control($peer, 'topic',
	{ name => 'orders.fifo', attributes => { FifoTopic => 'true' }, queue => 'from-sns.fifo' })->{arn};
my $events_arn = aws_control($peer, 'topic', { name => 'events', queue => 'from-events' })->{arn};
like($fifo_arn, qr/^arn:aws:sns:eu-west-1:\d{12}:orders\.fifo$/, 'the FIFO topic made, in eu-west-1');

my $node = relay_node('sns', conf => "outbox.max_payload_size = '4MB'\n");

sub target
{
	my ($name, $arn, %o) = @_;
	my $opts = join('', map { ", $_ => $o{$_}" } sort keys %o);
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_sns_target('$name', '$arn', '$key_id', '$secret',
			endpoint => '$peer->{url}'$opts);
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

sub keys_of
{
	my ($msgs) = @_;
	my %k;
	push @{ $k{ $_->{attrs}{'outbox-key'} // '' } }, $chars->decode($_->{body})->{n} for @$msgs;
	return \%k;
}

# --- a FIFO topic -----------------------------------------------------------
target('fifo', $fifo_arn);
emit('fifo', 200, 20);
ok_wait('every message published', sub { my $p = pending('fifo'); return ($p == 0, "$p pending") });
my $msgs = sqs_drain($peer, 'from-sns.fifo');
is(scalar(@$msgs), 200, 'the queue behind the topic holds the 200 messages');
my $k = keys_of($msgs);
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in commit order');
my ($m) = grep { $chars->decode($_->{body})->{n} == 1 } @$msgs;
is($m->{attrs}{'outbox-topic'}, 'fifo.x', 'outbox-topic');
is($m->{attrs}{'outbox-key'}, 'k1', 'outbox-key');
like($m->{attrs}{'outbox-id'}, qr/^[0-9a-f-]{36}$/, 'outbox-id');
is($m->{attrs}{'outbox-headers'}, '{"x-trace": "t1"}', 'the headers');
is($m->{group}, 'k1', 'MessageGroupId is the key');
is($m->{dedup}, $m->{attrs}{'outbox-id'}, 'MessageDeduplicationId is the message id');
my $s = aws_stats($peer);
is_deeply($s->{refused}, {}, 'no request refused: every signature holds');
ok((grep { $_ > 1 } @{ $s->{batches} }), 'requests carried several messages (PublishBatch)');
ok(!(grep { $_ > 10 } @{ $s->{batches} }), 'none more than 10');

# --- CloudEvents on a standard topic ----------------------------------------
target('ce', $events_arn, format => q{'cloudevents-structured'});
emit('ce', 1, 1);
ok_wait('the CloudEvent published', sub { return (pending('ce') == 0) });
my $ev = $chars->decode(sqs_drain($peer, 'from-events')->[0]{body});
is($ev->{specversion}, '1.0', 'CloudEvents: the message is a CloudEvent');
is($ev->{type}, 'ce.x', 'with the topic as its type');

# --- a topic that does not exist, then made ---------------------------------
# (made hidden, with its subscription: the front says NotFound until it
# is revealed, so no message goes to it before it has a subscriber)
aws_control($peer, 'queue', { name => 'from-later', attributes => {} });
my $later_arn = aws_control($peer, 'topic', { name => 'later', queue => 'from-later', hidden => JSON::PP::true })->{arn};
target('later', $later_arn);
emit('later', 10, 2);
ok_wait('a topic that does not exist: held with NotFound',
	sub { my $e = lag_value($node, 'later', 'last_error'); return (scalar($e =~ /SNS answered HTTP 404: NotFound/), $e) });
aws_control($peer, 'reveal', { arn => $later_arn });
ok_wait('the topic made: published by itself', sub { return (pending('later') == 0) });
is(scalar(@{ sqs_drain($peer, 'from-later') }), 10, 'all 10 there');
is(dead_letter_lines($node, 'later')->[0], undef, 'nothing dead-lettered');

# --- a wrong secret ---------------------------------------------------------
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('fifo', '$key_id', 'not-the-secret')});
emit('fifo', 10, 2);
ok_wait('a wrong secret: held with SignatureDoesNotMatch',
	sub { my $e = lag_value($node, 'fifo', 'last_error'); return (scalar($e =~ /SignatureDoesNotMatch/), $e) });
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('fifo', '$key_id', '$secret')});
ok_wait('the right secret: published', sub { return (pending('fifo') == 0) });
$k = keys_of(sqs_drain($peer, 'from-sns.fifo'));
is(scalar(map { @$_ } values %$k), 10, 'all 10 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');

# --- entries that fail, on a standard topic (no de-duplication) -----------
# SNS's fault: sent again, each message once; values that a form must
# encode (& = + % and UTF-8) arrive as they were.
target('std', $events_arn);
aws_control($peer, 'fault', { marker => 'flaky', marker_times => 6 });
emit('std', 30, 6, extra => "flaky &=+% \xc3\xa9");
ok_wait('entries that failed (SNS\'s fault): sent again, published',
	sub { return (pending('std') == 0, pending('std') . ' pending') });
$msgs = sqs_drain($peer, 'from-events');
my %seen;
$seen{ $chars->decode($_->{body})->{n} }++ for @$msgs;
is(scalar(@$msgs), 30, 'all 30 there ...');
is(scalar(keys %seen), 30, '... each once: no entry SNS published was sent again');
is($chars->decode($msgs->[0]{body})->{s}, "flaky &=+% \x{e9}", 'a value a form encodes arrives as it was');
like(lag_value($node, 'std', 'last_error'), qr/SNS failed to publish the message: InternalError/, 'last_error says so');
is(dead_letter_lines($node, 'std')->[0], undef, 'nothing dead-lettered');

# Throttled entries (SNS calls them the sender's fault): the target backs
# off, max_attempts 1 and nothing dead-lettered.
$node->safe_psql('postgres', q{SELECT outbox.alter_target('std', max_attempts => 1)});
aws_control($peer, 'fault', { marker => 'busy', marker_times => 4, marker_code => 'Throttled',
	marker_sender => JSON::PP::true });
emit('std', 10, 5, extra => 'busy');
ok_wait('throttled entries: published', sub { return (pending('std') == 0, pending('std') . ' pending') });
is(dead_letter_lines($node, 'std')->[0], undef, 'nothing dead-lettered (max_attempts 1)');
is(scalar(@{ sqs_drain($peer, 'from-events') }), 10, 'all 10 there');
aws_control($peer, 'fault', { marker => undef, marker_times => 0, marker_code => undef, marker_sender => JSON::PP::false });
$node->safe_psql('postgres', q{SELECT outbox.alter_target('std', max_attempts => 10)});

# A request refused whole for one entry's content (InvalidParameter), one
# lane: that message a dead letter, the others using up no attempt.
target('one', $events_arn, lanes => 1, max_attempts => 1);
aws_control($peer, 'fault', { reject_marker => 'poison' });
$node->safe_psql('postgres', q{
	SELECT outbox_emit('one.x', jsonb_build_object('n', 40000 + g, 's', CASE WHEN g = 3 THEN 'poison' ELSE 'ok' END),
					   'pk' || g) FROM generate_series(1, 8) g;});
ok_wait('a request refused whole for one entry: the rest published',
	sub { return (pending('one') == 0, pending('one') . ' pending') });
is_deeply(dead_letter_lines($node, 'one'), ['pk3|SNS answered HTTP 400: InvalidParameter: Invalid parameter: Message'],
	'only the message SNS refuses is a dead letter');
is_deeply([ sort map { $chars->decode($_->{body})->{n} } @{ sqs_drain($peer, 'from-events') } ],
	[ map { 40000 + $_ } 1, 2, 4 .. 8 ], 'the other 7 there');
aws_control($peer, 'fault', { reject_marker => undef });

# 5xx and an answer that is not XML: tried again
aws_control($peer, 'fault', { error500 => 2, garbage => 2 });
emit('std', 10, 10);
ok_wait('after 500s and answers that are not XML: published',
	sub { return (pending('std') == 0, pending('std') . ' pending') });
is(scalar(@{ sqs_drain($peer, 'from-events') }), 10, 'all 10 there');
is(dead_letter_lines($node, 'std')->[0], undef, 'nothing dead-lettered');

# --- too large --------------------------------------------------------------
$node->safe_psql('postgres', q{
	SELECT outbox_emit('fifo.x', '{"n": 300001}', 'big');
	SELECT outbox_emit('fifo.x', jsonb_build_object('n', 300002, 'huge', repeat('y', 300000)), 'big');
	SELECT outbox_emit('fifo.x', '{"n": 300003}', 'big');});
ok_wait('a message over 256 KiB: the rest published', sub { return (pending('fifo') == 0, pending('fifo') . ' pending') });
like(dead_letter_lines($node, 'fifo')->[0] // '', qr/^big\|the message takes \d+ bytes as SNS counts them .* over SNS's limit of 262144/,
	'a dead letter with the reason');
is_deeply([ map { $chars->decode($_->{body})->{n} } @{ sqs_drain($peer, 'from-sns.fifo') } ], [ 300001, 300003 ],
	'the rest of the key, in order');

# --- bad options --------------------------------------------------------------
my ($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_sns_target('x', 'arn:aws:sqs:eu-west-1:123456789012:orders', '$key_id', '$secret')});
like($err, qr/invalid SNS topic ARN/, 'an ARN that is not a topic\'s is refused');
($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_sns_target('x', 'arn:aws:sns:eu-west-1:123456789012:orders', '$key_id', '$secret',
		endpoint => 'https://sns.us-east-1.amazonaws.com')});
like($err, qr/invalid AWS region 'eu-west-1' for an SNS target.*the endpoint is in region "us-east-1"/s,
	'an endpoint in another region than the topic\'s is refused');

is_deeply([ sort keys %{ aws_stats($peer)->{refused} } ], [ 'error500', 'garbage', 'rejected whole', 'signature' ],
	'the only requests refused were those the test asked for');
relay_no_crash($node);
done_testing();
