# Helpers of the Redis tests (test/t/067_redis.pl): real redis-server
# processes on loopback ports, in throwaway directories, with an
# append-only file fsynced at every write, and a small RESP client to look
# at what they hold.
package OutboxRedis;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use IO::Socket::INET;
use IO::Socket::SSL;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(redis_start redis_stop redis_kill redis_cmd redis_entries redis_len);

my @started;    # every server started, stopped at exit even if a test dies

# Start a redis-server.  %opts: port (default: a free one), dir (default a
# new one under tmp_check), args (more redis-server arguments), tls (a
# hash: cert, key, ca, and client_cert, client_key for the test's own
# client; the server then listens with TLS only, on port, and asks for a
# client certificate unless auth_clients says 'no').  Returns a hash:
# port, dir, harness, log, name.
sub redis_start
{
	my ($name, %opts) = @_;
	my $port = $opts{port} // PostgreSQL::Test::Cluster::get_free_port();
	my $dir = $opts{dir} // "$PostgreSQL::Test::Utils::tmp_check/redis_$name";
	mkdir $dir;
	$dir = abs_path($dir);
	# absolute: redis-server opens it after changing to --dir
	my $log = abs_path($PostgreSQL::Test::Utils::log_path) . "/redis_$name.log";
	my $tls = $opts{tls};
	my @listen = $tls
	  ? ('--port', '0', '--tls-port', $port, '--tls-cert-file', $tls->{cert},
		'--tls-key-file', $tls->{key}, '--tls-ca-cert-file', $tls->{ca},
		'--tls-auth-clients', $tls->{auth_clients} // 'yes')
	  : ('--port', $port);
	my @cmd = ('redis-server', @listen, '--bind', '127.0.0.1', '--dir', $dir,
		'--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
		'--daemonize', 'no', '--logfile', $log, @{ $opts{args} // [] });
	my $h = IPC::Run::start(\@cmd, '<', \undef, '>>', "$log.out", '2>>', "$log.out");
	my $s = { name => $name, port => $port, dir => $dir, harness => $h, log => $log,
		opts => \%opts, tls => $tls };
	push @started, $s unless grep { $_ == $s } @started;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my $pong = eval { redis_cmd($s, 'PING') };
		return $s if defined $pong && $pong eq 'PONG';
		usleep(50_000);
	}
	die "redis-server $name did not start (see $log)";
}

sub redis_stop
{
	my ($s) = @_;
	return unless $s->{harness};
	$s->{harness}->signal('TERM');
	eval { $s->{harness}->finish };
	$s->{harness} = undef;
	$s->{sock} = undef;
}

sub redis_kill
{
	my ($s) = @_;
	return unless $s->{harness};
	$s->{harness}->signal('KILL');
	eval { $s->{harness}->finish };
	$s->{harness} = undef;
	$s->{sock} = undef;
}

END
{
	# (the test's exit status is not the killed servers')
	local $?;
	for my $s (@started)
	{
		redis_kill($s) if $s->{harness};
	}
}

sub _line
{
	my ($sock) = @_;
	my $line = <$sock>;
	die "redis: connection closed\n" unless defined $line;
	$line =~ s/\r\n\z//;
	return $line;
}

sub _reply
{
	my ($sock) = @_;
	my $line = _line($sock);
	my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
	return $rest if $type eq '+';
	die "redis error: $rest\n" if $type eq '-';
	return $rest + 0 if $type eq ':';
	if ($type eq '$')
	{
		return undef if $rest < 0;
		my $buf = '';
		while (length($buf) < $rest + 2)
		{
			my $n = read($sock, $buf, $rest + 2 - length($buf), length($buf));
			die "redis: connection closed\n" unless $n;
		}
		return substr($buf, 0, $rest);
	}
	if ($type eq '*')
	{
		return undef if $rest < 0;
		return [ map { _reply($sock) } 1 .. $rest ];
	}
	die "redis: cannot parse '$line'\n";
}

# Run one command as the default user; returns its reply (an array ref
# for arrays), dies with the server's error.
sub redis_cmd
{
	my ($s, @args) = @_;
	for my $try (1 .. 2)
	{
		$s->{sock} //= $s->{tls}
		  ? IO::Socket::SSL->new(PeerAddr => '127.0.0.1', PeerPort => $s->{port}, Timeout => 5,
			# (the test's own look at the server: the relay's checks are what is tested)
			SSL_verify_mode => SSL_VERIFY_NONE,
			SSL_cert_file => $s->{tls}{client_cert}, SSL_key_file => $s->{tls}{client_key})
		  : IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $s->{port},
			Proto => 'tcp', Timeout => 5);
		die "redis: cannot connect to $s->{port}: $! " . ($IO::Socket::SSL::SSL_ERROR // '') . "\n"
		  unless $s->{sock};
		my $sock = $s->{sock};
		my $cmd = '*' . scalar(@args) . "\r\n";
		$cmd .= '$' . length($_) . "\r\n$_\r\n" for @args;
		my $ok = print $sock $cmd;
		my $r = eval { die "write failed\n" unless $ok; _reply($sock) };
		return $r unless $@;
		my $e = $@;
		die $e if $e =~ /^redis error/;
		$s->{sock} = undef;
		die $e if $try == 2;
	}
}

# Entries of a stream: an array of hashes (_id, and each field), in order.
sub redis_entries
{
	my ($s, $stream) = @_;
	my @out;
	my $from = '-';
	for (;;)
	{
		my $r = redis_cmd($s, 'XRANGE', $stream, $from, '+', 'COUNT', 10000);
		last unless @$r;
		for my $e (@$r)
		{
			my %h = @{ $e->[1] };
			$h{_id} = $e->[0];
			push @out, \%h;
		}
		last if @$r < 10000;
		$from = '(' . $r->[-1][0];
	}
	return \@out;
}

# XLEN, or -1 while the server does not answer.
sub redis_len
{
	my ($s, $stream) = @_;
	my $n = eval { redis_cmd($s, 'XLEN', $stream) };
	return defined $n ? $n : -1;
}

1;
