# Helpers of the AWS tests (test/t/078_sqs.pl, 079_kinesis.pl): the peer
# of test/aws/aws_peer.mjs (the emulators fauxqs and kinesalite behind a
# front that checks each request's Signature Version 4 with AWS's own
# signer), on loopback.
package OutboxAws;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(dirname);
use OutboxRelayTest;

our @EXPORT = qw(aws_peer_start aws_control sqs_drain kinesis_records aws_stats aws_emit in_order);

my $peer_script = abs_path(dirname(__FILE__) . '/../aws/aws_peer.mjs');

# Start the peer; returns a hash: port (SQS and Kinesis), control, url
# (http://127.0.0.1:port), log, harness.
sub aws_peer_start
{
	my ($name) = @_;
	my $peer = node_peer_start($peer_script, "sqs_$name");
	$peer->{port} = $peer->{ports}{sqs};
	$peer->{url} = "http://127.0.0.1:$peer->{port}";
	return $peer;
}

# POST /$what with $req (GET when $req is undef); the decoded answer.
sub aws_control
{
	return node_peer_control(@_);
}

# Every message in queue $name now, received and deleted, in order.
sub sqs_drain
{
	my ($peer, $name) = @_;
	return aws_control($peer, "drain?queue=$name");
}

# The records of Kinesis stream $name not returned before, per shard in
# order.
sub kinesis_records
{
	my ($peer, $name) = @_;
	return aws_control($peer, "records?stream=$name");
}

# Emit n messages of topic $t.x into $node's postgres, in transactions of
# 10: payload {"n": <count>} (and "s": $o{extra}), key $o{key} or
# k<count % nkeys>, header x-trace; $count is the caller's counter (a
# reference), which numbers them.
sub aws_emit
{
	my ($node, $count, $t, $n, $nkeys, %o) = @_;
	my $sql = '';
	for my $i (1 .. $n)
	{
		$$count++;
		my $key = $o{key} // 'k' . ($$count % $nkeys);
		my $extra = $o{extra} ? qq{, "s": "$o{extra}"} : '';
		$sql .= "BEGIN;\n" if $i % 10 == 1;
		$sql .= qq{SELECT outbox_emit('$t.x', '{"n": $$count$extra}', '$key', '{"x-trace": "t$$count"}');\n};
		$sql .= "COMMIT;\n" if $i % 10 == 0 || $i == $n;
	}
	$node->safe_psql('postgres', $sql);
}

# Whether a list of numbers rises throughout.
sub in_order
{
	my ($list) = @_;
	for my $i (1 .. $#$list)
	{
		return 0 if $list->[$i] <= $list->[ $i - 1 ];
	}
	return 1;
}

sub aws_stats
{
	my ($peer) = @_;
	return aws_control($peer, 'stats');
}

1;
