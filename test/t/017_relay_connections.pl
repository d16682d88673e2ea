# Connections of an HTTP target:
#  - keep-alive: a lane sends its requests over one connection, so 400
#    messages over 4 lanes take at most 4 connections;
#  - the receiver closing idle connections (the sink's --idle-timeout):
#    the worker notices the closed socket, stops watching it without
#    spinning (its CPU time stays low while idle), and the next messages
#    go out over new connections, none lost and with no error recorded;
#  - the receiver answering "Connection: close" (as some servers do on
#    every answer): every message is still delivered, once, in key order,
#    each over a connection of its own.
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;

# Two receivers: one keeps idle connections (the sink's default, 60 s), for
# counting kept-alive connections; one closes them after 1 s.
my $sink = start_sink('connections');
my $idler = start_sink('idle_close', '--idle-timeout', '1');
my $node = relay_node('relay_connections');
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'postgres'},
		'1'),
	'the relay worker runs');
my $worker_pid = relay_worker_pid($node);

$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('conns', '$sink->{url}/conns', lanes => 4);
SELECT outbox.subscribe('conns', 'c.*');
SELECT outbox.create_http_target('idle', '$idler->{url}/idle', lanes => 4);
SELECT outbox.subscribe('idle', 'c.*');
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
	my ($n, $at, $path) = @_;
	# batch_size 1: one record per message; sink_path_records reads the
	# record file incrementally, so polling stays cheap
	return sink_path_records($at // $sink, $path // '/conns', $n) >= $n;
}

# The connections the receiver on $port holds open (its side, established).
sub open_connections
{
	my ($port) = @_;
	my $hex = sprintf('%04X', $port);
	return scalar grep { (split ' ')[1] =~ /:$hex$/ && (split ' ')[3] eq '01' }
	  split /\n/, slurp_file('/proc/net/tcp');
}

# --- keep-alive ---
emit(1, 400);
ok(arrived(400), '400 messages arrive');
my $a = sink_attempts($sink, '/conns');
my %conns = map { (sink_records($sink)->[ $_->{rseq} - 1 ]{conn} => 1) } @$a;
cmp_ok(scalar(keys %conns), '<=', 4,
	'... over at most one connection per lane (' . scalar(keys %conns) . ')');

# --- the receiver closes the idle connections ---
# The other target got the same 400 messages, from a receiver that closes a
# connection idle for 1 s: wait until it has closed them all.
ok(arrived(400, $idler, '/idle'), 'the receiver that closes idle connections got them too');
ok(wait_for('the receiver to close its idle connections',
		sub { my $n = open_connections($idler->{port}); ($n == 0, "$n open") }),
	'... and closed its connections once idle');
my $cpu0 = worker_cpu();
usleep(2_000_000);    # a span: the worker's CPU while idle
my $idle_cpu = worker_cpu() - $cpu0;
cmp_ok($idle_cpu, '<', 0.5,
	"the worker does not spin on the closed connections (${idle_cpu}s CPU in 2 s)");

emit(401, 440);
ok(arrived(440, $idler, '/idle'), 'the next messages arrive over new connections');
$a = sink_attempts($idler, '/idle');
my %later = map { (sink_records($idler)->[ $_->{rseq} - 1 ]{conn} => 1) }
  @$a[ 400 .. $#$a ];
cmp_ok(scalar(keys %later), '<=', 4,
	'... again at most one per lane (' . scalar(keys %later) . ')');
ok( $node->poll_query_until(
		'postgres',
		q{SELECT string_agg(format('%s %s %s %s', target, pending, dead_letters, coalesce(last_error, '-')), ', ' ORDER BY target)
		    FROM outbox.lag WHERE target IN ('conns', 'idle')},
		'conns 0 0 -, idle 0 0 -'),
	'nothing pending, no dead letter, no error');

# --- "Connection: close" on every answer ---
sink_control($sink, { path => '/closing', close => JSON::PP::true });
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('closing', '$sink->{url}/closing', lanes => 4);
SELECT outbox.subscribe('closing', 'c.*');
});
emit(441, 740);
my $closing;
ok( wait_until(
		sub { sink_path_records($sink, '/closing') >= 300 }),
	'300 messages arrive at a receiver that closes every connection');
$closing = sink_attempts($sink, '/closing');
is(scalar(@$closing), 300, '... each once');
is_deeply([ grep { $_->{status} != 204 } @$closing ], [], '... each answered 204');
# (The first requests may reuse the kept-alive connections the other target
# left: libcurl pools connections by host and port.)
my %used = map { (sink_records($sink)->[ $_->{rseq} - 1 ]{conn} => 1) } @$closing;
is(scalar(keys %used), 300, '... over a connection each');
my (%last, @inversions);
for my $a (@$closing)
{
	push @inversions, "$a->{key}: $a->{seq} after $last{$a->{key}}"
	  if defined $last{ $a->{key} } && $a->{seq} <= $last{ $a->{key} };
	$last{ $a->{key} } = $a->{seq};
}
is_deeply(\@inversions, [], '... in key order');

relay_no_crash($node);
stop_sink($sink);
stop_sink($idler);
$node->stop;
done_testing();
