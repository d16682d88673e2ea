# Helpers of the AWS tests (test/t/078_sqs.pl): the SQS peer of
# test/aws/sqs_peer.mjs (the emulator fauxqs behind a front that checks
# each request's Signature Version 4 with AWS's own signer), on loopback.
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

our @EXPORT = qw(sqs_peer_start sqs_control sqs_drain sqs_stats);

my $peer_script = abs_path(dirname(__FILE__) . '/../aws/sqs_peer.mjs');
my $json = JSON::PP->new->utf8->canonical;
my @started;

# Start the peer; returns a hash: port (SQS), control, url
# (http://127.0.0.1:port), log, harness.
sub sqs_peer_start
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
		die "SQS peer $name did not start (see $base.log)" if time > $deadline || !$h->pumpable;
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
sub sqs_control
{
	my ($peer, $what, $req) = @_;
	my $url = "http://127.0.0.1:$peer->{control}/$what";
	my $res = defined $req
	  ? $peer->{http}->post($url,
		{ content => $json->encode($req), headers => { 'content-type' => 'application/json' } })
	  : $peer->{http}->get($url);
	die "SQS peer $what failed: $res->{status} $res->{content}" unless $res->{success};
	return $json->decode($res->{content});
}

# Every message in queue $name now, received and deleted, in order.
sub sqs_drain
{
	my ($peer, $name) = @_;
	return sqs_control($peer, "drain?queue=$name");
}

sub sqs_stats
{
	my ($peer) = @_;
	return sqs_control($peer, 'stats');
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
