# Helpers of the RabbitMQ tests (test/t/068_rabbitmq.pl): real
# rabbitmq-server nodes on loopback ports, each in a throwaway directory
# (its own HOME, Erlang cookie, database and logs), and
# test/rabbitmq/outbox_rabbitmq (built here on first use) to declare
# queues and read back what they hold.
package OutboxRabbitMQ;

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

our @EXPORT = qw(rmq_start rmq_stop rmq_kill rmq_tool rmq_dump rmq_count rmq_ctl rmq_tls_client);

my $src = abs_path(dirname(__FILE__) . '/../rabbitmq/outbox_rabbitmq.c');
my @started;
my $tool;
my $json = OutboxRelayTest::json_codec()->utf8;

sub rmq_tool_path
{
	return $tool if $tool;
	$tool = abs_path($PostgreSQL::Test::Utils::tmp_check) . '/outbox_rabbitmq_' . basename($0, '.pl');
	system('cc', '-O2', '-o', $tool, $src, '-lrabbitmq') == 0
	  or BAIL_OUT("could not build $src");
	return $tool;
}

sub _env
{
	my ($s) = @_;
	return (
		HOME => $s->{dir},
		RABBITMQ_MNESIA_BASE => "$s->{dir}/mnesia",
		RABBITMQ_LOG_BASE => "$s->{dir}/log",
		RABBITMQ_NODENAME => $s->{node},
		# a TLS node's listener is in its rabbitmq.conf
		($s->{tls} ? () : (RABBITMQ_NODE_PORT => $s->{port})),
		RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
		RABBITMQ_DIST_PORT => $s->{dist_port},
		RABBITMQ_ENABLED_PLUGINS_FILE => "$s->{dir}/enabled_plugins",
		RABBITMQ_PID_FILE => "$s->{dir}/pid",
		RABBITMQ_CONFIG_FILE => "$s->{dir}/rabbitmq",
		RABBITMQ_ADVANCED_CONFIG_FILE => "$s->{dir}/advanced.config",
		RABBITMQ_CONF_ENV_FILE => "$s->{dir}/rabbitmq-env.conf",
		ERL_CRASH_DUMP => "$s->{dir}/erl_crash.dump");
}

# Start a node.  %opts: port and dir (to start one again), conf (lines of
# rabbitmq.conf), tls (a hash: cert, key, ca, client_cert, client_key,
# and peer_cert_required: the node then listens with TLS only, takes the
# EXTERNAL login of a client certificate, and url is amqps://).  Returns
# a hash: port, url, dir, node, harness.
sub rmq_start
{
	my ($name, %opts) = @_;
	my $s = $opts{again} // {
		name => $name,
		port => PostgreSQL::Test::Cluster::get_free_port(),
		dist_port => PostgreSQL::Test::Cluster::get_free_port(),
		dir => abs_path($PostgreSQL::Test::Utils::tmp_check) . "/rabbitmq_$name",
		node => "outbox_${name}_$$\@localhost",
	};
	$s->{tls} = $opts{tls} if exists $opts{tls};
	my $tls = $s->{tls};
	$s->{url} = ($tls ? 'amqps' : 'amqp') . "://guest:guest\@127.0.0.1:$s->{port}";
	mkdir $s->{dir};
	open my $f, '>', "$s->{dir}/rabbitmq.conf" or die;
	print $f "loopback_users = none\n" . ($opts{conf} // $s->{conf} // '');
	print $f <<"EOC" if $tls;
listeners.tcp = none
listeners.ssl.default = 127.0.0.1:$s->{port}
ssl_options.cacertfile = $tls->{ca}
ssl_options.certfile = $tls->{cert}
ssl_options.keyfile = $tls->{key}
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = @{[ $tls->{peer_cert_required} ? 'true' : 'false' ]}
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = EXTERNAL
ssl_cert_login_from = common_name
EOC
	close $f;
	$s->{conf} //= $opts{conf};
	open $f, '>', "$s->{dir}/enabled_plugins" or die;
	print $f $tls ? "[rabbitmq_auth_mechanism_ssl].\n" : "[].\n";
	close $f;
	my %env = _env($s);
	my $log = "$PostgreSQL::Test::Utils::log_path/rabbitmq_$name.log";
	local @ENV{ keys %env } = values %env;
	$s->{harness} = IPC::Run::start([ '/usr/lib/rabbitmq/bin/rabbitmq-server' ],
		'<', \undef, '>>', $log, '2>>', $log);
	push @started, $s unless grep { $_ == $s } @started;
	# (a node restarted after a kill recovers its queues first: minutes on
	# a loaded machine with a large quorum queue)
	my $deadline = time + 2 * $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		my ($out, $err) = ('', '');
		my %tls_env = _tls_env($tls ? ($tls->{ca}, $tls->{client_cert}, $tls->{client_key}) : ());
		local @ENV{ keys %tls_env } = values %tls_env;
		return $s
		  if IPC::Run::run([ rmq_tool_path(), 'count', $s->{url}, 'amq.probe.none' ],
			'>', \$out, '2>', \$err)
		  || $err =~ /NOT_FOUND/;
		usleep(200_000);
	}
	die "rabbitmq-server $name did not start (see $log)";
}

sub _signal
{
	my ($s, $sig) = @_;
	return unless $s->{harness};
	# the node is the beam process the script started; its pid file says
	# it (but the pid of a node that is gone may be another process's now:
	# only a process whose environment names this pid file is signalled)
	my $pid = -f "$s->{dir}/pid" ? slurp_file("$s->{dir}/pid") : undef;
	$pid =~ s/\s+//g if defined $pid;
	my $environ = ($pid // '') =~ /^\d+$/ ? eval { slurp_file("/proc/$pid/environ") } // '' : '';
	kill $sig, $pid if index("\0$environ", "\0RABBITMQ_PID_FILE=$s->{dir}/pid\0") >= 0;
	$s->{harness}->signal($sig);
	eval { $s->{harness}->finish };
	$s->{harness} = undef;
}

sub rmq_stop { _signal($_[0], 'TERM'); }
sub rmq_kill { _signal($_[0], 'KILL'); }

END
{
	# (the test's exit status is not the killed servers')
	local $?;
	_signal($_, 'KILL') for grep { $_->{harness} } @started;
}

# rabbitmqctl against the node; dies on failure.
sub rmq_ctl
{
	my ($s, @args) = @_;
	my %env = _env($s);
	local @ENV{ keys %env } = values %env;
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/lib/rabbitmq/bin/rabbitmqctl', '-n', $s->{node}, @args ],
		'>', \$out, '2>', \$err)
	  or die "rabbitmqctl @args: $err$out";
	return $out;
}

# The tool's environment for TLS files (CA, certificate, key), those given.
sub _tls_env
{
	my %e;
	@e{qw(OUTBOX_RMQ_CA OUTBOX_RMQ_CERT OUTBOX_RMQ_KEY)} = @_;
	return map { defined $e{$_} ? ($_ => $e{$_}) : () } keys %e;
}

# The TLS files the tool uses for amqps:// URLs (rmq_tls_client(ca, cert, key)).
my @tool_tls;
sub rmq_tls_client { @tool_tls = @_; }

# Run the tool; returns its output, dies on failure.
sub rmq_tool
{
	my ($url, $cmd, @args) = @_;
	my ($out, $err) = ('', '');
	my %tls_env = _tls_env(@tool_tls);
	local @ENV{ keys %tls_env } = values %tls_env;
	IPC::Run::run([ rmq_tool_path(), $cmd, $url, @args ], '>', \$out, '2>', \$err)
	  or die "outbox_rabbitmq $cmd @args: $err";
	return $out;
}

# What a queue holds: an array of hashes, in queue order.
sub rmq_dump
{
	my ($url, $queue) = @_;
	return [ map { $json->decode($_) } split /\n/, rmq_tool($url, 'dump', $queue) ];
}

# Messages ready in a queue, or -1 when the node does not answer.
sub rmq_count
{
	my ($url, $queue) = @_;
	my $n = eval { rmq_tool($url, 'count', $queue) };
	return defined $n ? $n + 0 : -1;
}

1;
