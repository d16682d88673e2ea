# Helpers of the NATS tests (test/t/050_*, 051_*): real nats-server
# processes with JetStream on loopback ports, in throwaway store
# directories, and test/nats/outbox_nats (built here on first use) to
# create streams and read back what they hold.
package OutboxNats;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(basename dirname);
use IPC::Run;
use JSON::PP;
use OutboxRelayTest ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(nats_start nats_stop nats_kill nats_tool nats_dump nats_count nats_wait_ready nats_tls_client);

my $src = abs_path(dirname(__FILE__) . '/../nats/outbox_nats.c');
my @started;    # every server started, stopped at exit even if a test dies
my $tool;
my $json = OutboxRelayTest::json_codec()->utf8;

# The tool, compiled once per test file (into a name of its own: files
# run at the same time share tmp_check).
sub nats_tool_path
{
	return $tool if $tool;
	$tool = "$PostgreSQL::Test::Utils::tmp_check/outbox_nats_" . basename($0, '.pl');
	system('cc', '-O2', '-o', $tool, $src, '-lnats') == 0
	  or BAIL_OUT("could not build $src");
	return $tool;
}

# Start a nats-server with JetStream.  %opts: port (default: a free one),
# dir (store; default a new one under tmp_check), name (server name),
# cluster_port and routes (array of route ports) for a cluster, config
# (more settings: a configuration file's text), tls (the server wants TLS:
# url is tls://localhost:port).  Returns a hash: port, url, dir, name,
# harness, log.
sub nats_start
{
	my ($name, %opts) = @_;
	my $port = $opts{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $dir = $opts{dir} // "$PostgreSQL::Test::Utils::tmp_check/nats_$name";
	mkdir $dir;
	my $log = "$PostgreSQL::Test::Utils::log_path/nats_$name.log";
	my @cmd = ('nats-server', '-a', '127.0.0.1', '-p', $port, '-js', '-sd', $dir,
		'-n', $name, '-l', $log);
	# more settings (TLS, users) in a configuration file
	if (defined $opts{config})
	{
		open(my $f, '>', "$dir/server.conf") or die "$dir/server.conf: $!";
		print $f $opts{config};
		close $f;
		push @cmd, '-c', "$dir/server.conf";
	}
	if ($opts{cluster_port})
	{
		push @cmd, '--cluster_name', 'outbox', '--cluster',
		  "nats://127.0.0.1:$opts{cluster_port}", '--routes',
		  join(',', map { "nats://127.0.0.1:$_" } @{ $opts{routes} });
	}
	# (the log is appended to: a server started again on it is ready when
	# the log says so after this point)
	my $log_from = -s $log // 0;
	my $h = IPC::Run::start(\@cmd, '<', \undef, '>>', "$log.out", '2>>', "$log.out");
	my $s = { name => $name, port => $port,
		url => ($opts{tls} ? "tls://localhost:$port" : "nats://127.0.0.1:$port"),
		dir => $dir, harness => $h, log => $log, log_from => $log_from, opts => \%opts };
	push @started, $s;
	nats_wait_ready($s);
	return $s;
}

# Wait until the server accepts connections.
sub nats_wait_ready
{
	my ($s) = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		return 1 if -f $s->{log} && substr(slurp_file($s->{log}), $s->{log_from} // 0) =~ /Server is ready/;
		usleep(50_000);
	}
	die "nats-server $s->{name} did not start (see $s->{log})";
}

# Stop the server (SIGTERM), or kill it (SIGKILL).
sub nats_stop
{
	my ($s) = @_;
	return unless $s->{harness};
	$s->{harness}->signal('TERM');
	eval { $s->{harness}->finish };
	$s->{harness} = undef;
}

sub nats_kill
{
	my ($s) = @_;
	return unless $s->{harness};
	$s->{harness}->signal('KILL');
	eval { $s->{harness}->finish };
	$s->{harness} = undef;
}

# Run the tool; returns its output, dies on failure unless $may_fail.
# The TLS and credentials files the tool uses (nats_tls_client(ca, cert,
# key, creds); undef for one not used).
my %tool_env;
sub nats_tls_client
{
	my %e;
	@e{qw(OUTBOX_NATS_CA OUTBOX_NATS_CERT OUTBOX_NATS_KEY OUTBOX_NATS_CREDS)} = @_;
	%tool_env = map { defined $e{$_} ? ($_ => $e{$_}) : () } keys %e;
}

sub nats_tool
{
	my ($url, @args) = @_;
	my ($out, $err) = ('', '');
	local @ENV{ keys %tool_env } = values %tool_env;
	my $ok = IPC::Run::run([ nats_tool_path(), $args[0], $url, @args[ 1 .. $#args ] ],
		'>', \$out, '2>', \$err);
	die "outbox_nats @args: $err" unless $ok;
	return $out;
}

# What the stream holds: an array of hashes (seq, subject, id, key, oseq,
# topic, payload), in stream order.
sub nats_dump
{
	my ($url, $stream) = @_;
	return [ map { $json->decode($_) } split /\n/, nats_tool($url, 'dump', $stream) ];
}

sub nats_count
{
	my ($url, $stream) = @_;
	my $n = eval { nats_tool($url, 'count', $stream) };
	return defined $n ? $n + 0 : -1;
}

END
{
	local $?;
	nats_kill($_) for grep { $_->{harness} } @started;
}

1;
