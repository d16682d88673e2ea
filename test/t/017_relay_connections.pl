# Connections of an HTTP target:
#  - keep-alive: a lane sends its requests over one connection, so 400
#    messages over 4 lanes take at most 4 connections;
#  - the receiver closing idle connections (the sink's --idle-timeout):
#    the worker notices the closed socket, stops watching it without
#    spinning (its CPU time stays low while idle), and the next messages
#    go out over new connections, none lost and with no error recorded;
#  - the receiver answering "Connection: close" (as some servers do on
#    every answer): every message is still delivered, in key order.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;

my $sink = start_sink('connections', '--idle-timeout', '1');
my $node = relay_node('relay_connections');
my $worker_pid = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'});

$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('conns', '$sink->{url}/conns', lanes => 4);
SELECT outbox.subscribe('conns', 'c.*');
});

# CPU seconds (user + system) the worker used so far.
my $ticks = `getconf CLK_TCK` || 100;
chomp $ticks;
sub worker_cpu
{
	my @f = split ' ', (slurp_file("/proc/$worker_pid/stat") =~ s/^.*\) //sr);
	# after "pid (comm) ": field 3 is the state, 14 and 15 utime and stime
	return ($f[11] + $f[12]) / $ticks;
}

sub emit
{
	my ($from, $to) = @_;
	$node->safe_psql('postgres',
		qq{SELECT count(outbox_emit('c.e', jsonb_build_object('i', g), 'k' || (g % 40)))
		     FROM generate_series($from, $to) g});
}

sub arrived
{
	my ($n) = @_;
	return wait_until(sub { scalar(@{ sink_attempts($sink, '/conns') }) >= $n }, 60);
}

# --- keep-alive ---
emit(1, 400);
ok(arrived(400), '400 messages arrive');
my $a = sink_attempts($sink, '/conns');
my %conns = map { (sink_records($sink)->[ $_->{rseq} - 1 ]{conn} => 1) } @$a;
cmp_ok(scalar(keys %conns), '<=', 4,
	'... over at most one connection per lane (' . scalar(keys %conns) . ')');

# --- the receiver closes the idle connections ---
usleep(2_000_000);    # the sink closes them after 1 s
my $cpu0 = worker_cpu();
usleep(2_000_000);
my $idle_cpu = worker_cpu() - $cpu0;
cmp_ok($idle_cpu, '<', 0.5,
	"the worker does not spin on the closed connections (${idle_cpu}s CPU in 2 s)");

emit(401, 440);
ok(arrived(440), 'the next messages arrive over new connections');
$a = sink_attempts($sink, '/conns');
my %later = map { (sink_records($sink)->[ $_->{rseq} - 1 ]{conn} => 1) }
  @$a[ 400 .. $#$a ];
ok(!grep({ $conns{$_} } keys %later), '... none of the closed ones is used');
is( $node->safe_psql(
		'postgres',
		q{SELECT pending, dead_letters, coalesce(last_error, '') FROM outbox.lag WHERE target = 'conns'}),
	'0|0|',
	'nothing pending, no dead letter, no error');

# --- "Connection: close" on every answer (a tiny receiver of its own) ---
my $dir = $PostgreSQL::Test::Utils::log_path;
my ($port_file, $log_file) = ("$dir/close_receiver.port", "$dir/close_receiver.log");
unlink $port_file, $log_file;
my $receiver = <<'EOPY';
import http.server, os, sys
port_file, log_file = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(log_file, "a") as f:
            f.write(f"{self.headers.get('outbox-key')} {self.headers.get('outbox-seq')}\n")
        self.send_response(204)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(port_file + ".tmp", port_file)
server.serve_forever()
EOPY
my $h = IPC::Run::start([ 'python3', '-c', $receiver, $port_file, $log_file ],
	'>', "$dir/close_receiver.out", '2>&1');
ok(wait_until(sub { -s $port_file }, 20), 'the closing receiver runs');
my $port = slurp_file($port_file);
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('closing', 'http://127.0.0.1:$port/', lanes => 4);
SELECT outbox.subscribe('closing', 'c.*');
});
emit(441, 740);
my @lines;
ok( wait_until(
		sub {
			@lines = -e $log_file ? split(/\n/, slurp_file($log_file)) : ();
			@lines >= 300;
		},
		60),
	'300 messages arrive at a receiver that closes every connection');
my (%last, $inversions);
for (@lines)
{
	my ($key, $seq) = split ' ';
	$inversions++ if defined $last{$key} && $seq <= $last{$key};
	$last{$key} = $seq;
}
is(scalar(@lines), 300, '... each once');
ok(!$inversions, '... in key order');
$h->kill_kill;

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
