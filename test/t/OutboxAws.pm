# Helpers of the AWS tests (test/t/078_sqs.pl, 079_kinesis.pl): the peer
# of test/aws/aws_peer.mjs (the emulators fauxqs and kinesalite behind a
# front that checks each request's Signature Version 4 with AWS's own
# signer), on loopback.
package OutboxAws;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(basename dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(aws_peer_start aws_control sqs_drain kinesis_records aws_stats aws_emit in_order);

my $peer_script = abs_path(dirname(__FILE__) . '/../aws/aws_peer.mjs');
my $json = JSON::PP->new->utf8->canonical;
my @started;

# Start the peer; returns a hash: port (SQS and Kinesis), control, url
# (http://127.0.0.1:port), log, harness.
sub aws_peer_start
{
	my ($name) = @_;
	my $base = "$PostgreSQL::Test::Utils::log_path/sqs_" . basename($0, '.pl') . "_$name";
	my $port_file = "$base.port";
	unlink $port_file;
	my $h = IPC::Run::start([ 'node', $peer_script, $port_file ],
		'<', \undef, '>>', "$base.log", '2>>', "$base.log");
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	until (-s $port_file)
	{
		die "AWS peer $name did not start (see $base.log)" if time > $deadline || !$h->pumpable;
		usleep(20_000);
	}
	my $ports = $json->decode(slurp_file($port_file));
	my $peer = {
		name => $name,
		port => $ports->{sqs},
		control => $ports->{control},
		url => "http://127.0.0.1:$ports->{sqs}",
		log => "$base.log",
		harness => $h,
		http => HTTP::Tiny->new(timeout => $PostgreSQL::Test::Utils::timeout_default),
	};
	push @started, $peer;
	return $peer;
}

# POST /$what with $req (GET when $req is undef); the decoded answer.
sub aws_control
{
	my ($peer, $what, $req) = @_;
	my $url = "http://127.0.0.1:$peer->{control}/$what";
	my $res = defined $req
	  ? $peer->{http}->post($url,
		{ content => $json->encode($req), headers => { 'content-type' => 'application/json' } })
	  : $peer->{http}->get($url);
	die "AWS peer $what failed: $res->{status} $res->{content}" unless $res->{success};
	return $json->decode($res->{content});
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

END
{
	local $?;
	for my $p (@started)
	{
		next unless $p->{harness};
		$p->{harness}->signal('TERM');
		eval { $p->{harness}->finish };
	}
}

1;
