# Amazon Kinesis targets against the emulator kinesalite on loopback,
# behind a front that checks every request's AWS Signature Version 4 with
# AWS's own signer (test/aws/aws_peer.mjs):
#  - a stream of 4 shards: every message a record once, its data the
#    outbox envelope, its partition key the message's key; per key in
#    commit order; every request signed right; PutRecords of many records;
#  - CloudEvents in structured mode;
#  - records that fail (InternalFailure): sent again, in order; records
#    over the shard's throughput (ProvisionedThroughputExceededException):
#    the target backs off, no message uses up its attempts;
#  - a wrong secret, a stream that does not exist: held with the reason,
#    nothing dead-lettered, delivered once set right;
#  - a record over 1 MiB: a dead letter with the reason, the rest of the
#    key in order;
#  - bad options refused at create time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;
use OutboxAws;

# the records' data, already characters in the peer's answer
my $chars = JSON::PP->new->canonical;
my $peer = aws_peer_start('kinesis');
my $key_id = 'AKIAIOSFODNN7EXAMPLE';
my $secret = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY';
aws_control($peer, 'setup', { region => 'eu-west-1', keys => { $key_id => $secret } });
aws_control($peer, 'stream', { name => 'orders', shards => 4 });
aws_control($peer, 'stream', { name => 'ce', shards => 1 });

my $node = relay_node('kinesis', conf => "outbox.max_payload_size = '4MB'\n");

sub target
{
	my ($name, $stream, %o) = @_;
	my $opts = join('', map { ", $_ => $o{$_}" } sort keys %o);
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_kinesis_target('$name', '$stream', 'eu-west-1', '$key_id', '$secret',
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

# The records, decoded; per key their n in stream order; whether a key's
# records are all on one shard.
sub records
{
	my ($stream) = @_;
	my $recs = kinesis_records($peer, $stream);
	$_->{env} = $chars->decode($_->{data}) for @$recs;
	return $recs;
}

sub keys_of
{
	my ($recs) = @_;
	my (%k, %shard, $split);
	for my $r (@$recs)
	{
		push @{ $k{ $r->{key} } }, $r->{env}{payload}{n};
		$split++ if defined $shard{ $r->{key} } && $shard{ $r->{key} } ne $r->{shard};
		$shard{ $r->{key} } = $r->{shard};
	}
	return (\%k, $split // 0);
}

# --- a stream of 4 shards --------------------------------------------------
target('kin', 'orders');
emit('kin', 600, 40);
ok_wait('every message delivered', sub { my $p = pending('kin'); return ($p == 0, "$p pending") });
my $recs = records('orders');
is(scalar(@$recs), 600, 'the stream holds the 600 records');
my %seen;
$seen{ $_->{env}{payload}{n} }++ for @$recs;
is(scalar(keys %seen), 600, 'each of them once');
my ($k, $split) = keys_of($recs);
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in commit order');
is($split, 0, 'a key\'s records on one shard (the key is the partition key)');
my ($r) = grep { $_->{env}{payload}{n} == 1 } @$recs;
is($r->{key}, 'k1', 'the partition key is the message key');
is($r->{env}{topic}, 'kin.x', 'the data is the envelope: topic');
is($r->{env}{key}, 'k1', 'key');
is_deeply($r->{env}{headers}, { 'x-trace' => 't1' }, 'headers');
like($r->{env}{id}, qr/^[0-9a-f-]{36}$/, 'and the message id');
my $s = aws_stats($peer);
is_deeply($s->{refused}, {}, 'no request refused: every signature holds');
ok((grep { $_ > 1 } @{ $s->{batches} }), 'requests carried several records (PutRecords)');

# --- CloudEvents ----------------------------------------------------------
target('ce', 'ce', format => q{'cloudevents-structured'});
emit('ce', 1, 1);
ok_wait('the CloudEvent delivered', sub { return (pending('ce') == 0) });
my $ev = records('ce')->[0]{env};
is($ev->{specversion}, '1.0', 'CloudEvents: the data is a CloudEvent');
is($ev->{type}, 'ce.x', 'with the topic as its type');
is($ev->{data}{n}, $emitted, 'and the payload as its data');

# --- records that fail: sent again in order -------------------------------
aws_control($peer, 'fault', { marker => 'flaky', marker_times => 8, marker_code => 'InternalFailure' });
emit('kin', 60, 6, extra => 'flaky');
ok_wait('records that failed (InternalFailure): sent again, delivered',
	sub { return (pending('kin') == 0, pending('kin') . ' pending') });
($k) = keys_of(records('orders'));
is(scalar(map { @$_ } values %$k), 60, 'all 60 there, once');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');
like(lag_value($node, 'kin', 'last_error'), qr/Kinesis did not store the record: InternalFailure/,
	'last_error says which record failed');

# --- over the shard's throughput: backs off, no attempts used up ----------
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kin', max_attempts => 1)});
aws_control($peer, 'fault', { marker => 'busy', marker_times => 6,
	marker_code => 'ProvisionedThroughputExceededException' });
emit('kin', 30, 3, extra => 'busy');
ok_wait('records over the throughput: delivered', sub { return (pending('kin') == 0, pending('kin') . ' pending') });
is(dead_letter_lines($node, 'kin')->[0], undef, 'nothing dead-lettered (max_attempts 1)');
($k) = keys_of(records('orders'));
is(scalar(map { @$_ } values %$k), 30, 'all 30 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('kin', max_attempts => 0)});
aws_control($peer, 'fault', { marker => undef, marker_times => 0 });

# --- a wrong secret --------------------------------------------------------
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('kin', '$key_id', 'not-the-secret')});
emit('kin', 10, 2);
ok_wait('a wrong secret: held with SignatureDoesNotMatch',
	sub { my $e = lag_value($node, 'kin', 'last_error'); return (scalar($e =~ /SignatureDoesNotMatch/), $e) });
$node->safe_psql('postgres', qq{SELECT outbox.set_aws_credentials('kin', '$key_id', '$secret')});
ok_wait('the right secret: delivered', sub { return (pending('kin') == 0) });
is(scalar(@{ records('orders') }), 10, 'all 10 there');

# --- a stream that does not exist, then made ------------------------------
target('later', 'later');
emit('later', 10, 2);
ok_wait('a stream that does not exist: held with ResourceNotFoundException',
	sub { my $e = lag_value($node, 'later', 'last_error'); return (scalar($e =~ /ResourceNotFoundException/), $e) });
aws_control($peer, 'stream', { name => 'later', shards => 1 });
ok_wait('the stream made: delivered by itself', sub { return (pending('later') == 0) });
($k) = keys_of(records('later'));
is(scalar(map { @$_ } values %$k), 10, 'all 10 there');
is(scalar(grep { !in_order($k->{$_}) } keys %$k), 0, 'per key in order');

# --- too large --------------------------------------------------------------
$node->safe_psql('postgres', q{
	SELECT outbox_emit('kin.x', '{"n": 100001}', 'big');
	SELECT outbox_emit('kin.x', jsonb_build_object('n', 100002, 'huge', repeat('y', 1100000)), 'big');
	SELECT outbox_emit('kin.x', '{"n": 100003}', 'big');});
ok_wait('a record over 1 MiB: the rest delivered', sub { return (pending('kin') == 0, pending('kin') . ' pending') });
like(dead_letter_lines($node, 'kin')->[0] // '', qr/^big\|the record takes \d+ bytes with its partition key, over Kinesis's limit of 1048576/,
	'a dead letter with the reason');
is_deeply([ map { $_->{env}{payload}{n} } @{ records('orders') } ], [ 100001, 100003 ],
	'the rest of the key delivered, in order');

# --- a record over 1 MiB behind others of other keys ----------------------
# One lane, max_attempts 1: the big record goes alone, the others of its
# request use up no attempt.
target('one', 'orders', lanes => 1, max_attempts => 1);
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT outbox_emit('one.x', '{"n": 200001}', 'a');
	SELECT outbox_emit('one.x', jsonb_build_object('n', 200002, 'huge', repeat('y', 1100000)), 'b');
	SELECT outbox_emit('one.x', '{"n": 200003}', 'c');
	COMMIT;});
ok_wait('a big record among others: the others delivered', sub { return (pending('one') == 0, pending('one') . ' pending') });
is_deeply([ map { s/\|.*//r } @{ dead_letter_lines($node, 'one') } ], ['b'], 'only the big record is a dead letter');
is_deeply([ sort map { $_->{env}{payload}{n} } @{ records('orders') } ], [ 200001, 200003 ], 'the others there');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('one')});

# --- 5xx, answers that are not PutRecords', and members written null -----
# (kinesis-mock, LocalStack's emulator, writes every member, the absent ones
# null: a null ErrorCode is no error)
aws_control($peer, 'fault', { error500 => 2, garbage => 2, nulls => 3 });
emit('kin', 20, 4);
ok_wait('after 500s, answers that are not JSON and null members: delivered',
	sub { return (pending('kin') == 0, pending('kin') . ' pending') });
$recs = records('orders');
%seen = ();
$seen{ $_->{env}{payload}{n} }++ for @$recs;
is(scalar(keys %seen), 20, 'all 20 there');
is(scalar(@$recs), 20, '... once each (a record answered with null members is not sent again)');
is(aws_stats($peer)->{refused}{nulls}, 3, 'three answers had null members');

# --- bad options ----------------------------------------------------------
my ($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', '$key_id', '$secret',
		endpoint => 'https://kinesis.us-east-1.amazonaws.com')});
like($err, qr/invalid AWS region 'eu-west-1' for a Kinesis target.*the endpoint is in region "us-east-1"/s,
	'a region that is not the endpoint\'s is refused');
($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', '$key_id', '$secret', batch_size => 501)});
like($err, qr/batch_size must be between 1 and 500, not 501/, 'batch_size over 500 is refused');
($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT outbox.create_kinesis_target('x', 'orders', 'eu-west-1', 'short', '$secret')});
like($err, qr/invalid AWS credentials for a Kinesis target/, 'credentials that are not AWS\'s are refused');
unlike($err, qr/\Q$secret\E/, '... and the error does not show the secret');

my $st = aws_stats($peer);
is_deeply([ sort keys %{ $st->{refused} } ], [ 'error500', 'garbage', 'nulls', 'signature' ],
	'the only requests refused were those the test asked for');
relay_no_crash($node);
done_testing();
