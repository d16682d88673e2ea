# A target whose host name takes long to resolve does not hold up the
# others: the relay (one process, libcurl's threaded resolver) gives up a
# request still resolving its name (its timeout_ms, shorter than the
# lookup) without waiting for the lookup to end.  It used to wait: libcurl
# joined the resolver thread in the relay's own thread, so every given-up
# lookup stopped the whole relay until the DNS answer came, and every
# other target's messages waited (and their requests timed out); fixed
# with CURLOPT_QUICK_EXIT.  A NATS target of such a host does not hold it
# up either: the relay used to resolve NATS servers' names with the
# blocking getaddrinfo() at every attempt (with the preloaded library that
# stopped the relay 3 s each time; this test failed so); it now uses
# getaddrinfo_a(), waiting at most 50 ms.  (glibc's getaddrinfo_a() does
# not go through the preloaded getaddrinfo(), so that it does not wait is
# glibc's, not shown here.)
#
# No DNS server is involved: test/dns/slow_getaddrinfo.c, preloaded into
# the server (LD_PRELOAD), makes getaddrinfo() take 3 s to fail for names
# ending in ".slow.invalid" and leaves every other name alone.  A target
# at http://x.slow.invalid/ with timeout_ms = 100, 8 lanes and 50 keys of
# messages keeps starting and giving up lookups (retried forever, backoff
# at most 500 ms) while a healthy target at the test sink receives 20
# messages, emitted 150 ms apart (over more than 3 s): each should arrive
# within 1.5 s of its emission, on the server's clock (it takes
# milliseconds); at most 3 of the 20 may be later, for a loaded machine.
# With the stall, the relay stopped for about 3 s after each round of
# given-up lookups, free for a fraction of a second in between, and a
# message emitted at the start of a stop waited for its end, up to 3 s:
# about half of them were later than 1.5 s.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $json = JSON::PP->new->utf8->canonical;
my $max_latency = 1.5;    # seconds from an emit to the sink, allowed ...
my $max_late = 3;         # ... to all but this many of the 20

# --- the slow getaddrinfo ---
my $src = abs_path(dirname(__FILE__) . '/../dns/slow_getaddrinfo.c');
my $so = "$PostgreSQL::Test::Utils::tmp_check/slow_getaddrinfo.so";
my ($cc_out, $cc_err) = run_command([ 'cc', '-shared', '-fPIC', '-o', $so, $src, '-ldl' ]);
ok(-e $so, 'the slow getaddrinfo library builds') or die "cc failed: $cc_out$cc_err";

my $sink = start_sink('slow_dns');
my $url = $sink->{url};

# Only the server (pg_ctl and the postmaster it starts) gets the library.
my $node;
{
	local $ENV{LD_PRELOAD} = $so;
	$node = relay_node('relay_slow_dns', create_extension => 0);
}
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'}, '1'),
	'the relay runs');
my $relay_pid = relay_worker_pid($node);
like(slurp_file("/proc/$relay_pid/maps"), qr{/slow_getaddrinfo\.so$}m,
	"the relay (pid $relay_pid) has the slow getaddrinfo loaded");

# The healthy target works, before the slow one starts.
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('ok', '$url/ok', lanes => 8);
SELECT outbox.subscribe('ok', 'ok');
COMMIT;
});
$node->safe_psql('postgres', q{SELECT outbox_emit('ok', '{"i": 0}', 'k0')});
ok(scalar(sink_path_records($sink, '/ok', 1)), 'the healthy target receives a first message');

# --- the slow target: lookups started and given up all along ---
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT outbox.create_http_target('slow', 'http://x.slow.invalid/', lanes => 8,
	timeout_ms => 100, max_attempts => 0);
SELECT outbox.subscribe('slow', 'slow');
SELECT outbox.create_nats_target('slow_nats', 'nats://x.slow.invalid:4222', lanes => 8,
	max_attempts => 0);
SELECT outbox.subscribe('slow_nats', 'slow');
COMMIT;
});
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('slow', jsonb_build_object('s', g), 's' || g)) FROM generate_series(1, 50) g});

sub lag_of
{
	my ($target) = @_;
	return $json->decode($node->safe_psql('postgres',
		qq{SELECT json_build_object('pending', pending, 'delivered', delivered,
			'last_error', last_error, 'error_age', extract(epoch FROM now() - last_error_at))
		   FROM outbox.lag WHERE target = '$target'}));
}
my $lag;
ok(wait_until(sub { $lag = lag_of('slow'); defined $lag->{last_error} }),
	'the slow target fails')
  or diag($json->encode($lag));
like($lag->{last_error} // '', qr/time/i, "... its requests time out ($lag->{last_error})");

# --- meanwhile, the healthy target ---
my $n = 20;
my $t0 = time;
for my $i (1 .. $n)
{
	$node->safe_psql('postgres', qq{SELECT outbox_emit('ok', '{"i": $i}', 'k$i')});
	usleep(150_000);    # a span: the messages spread over the stalls
}
my $t_emitted = time;
# i => its emitted_at (the server's clock; the sink's is the same machine's)
my %emitted = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	q{SELECT payload->>'i', extract(epoch FROM emitted_at) FROM outbox.messages WHERE topic = 'ok'});
my @ok;
wait_until(sub { @ok = sink_path_records($sink, '/ok'); @ok >= $n + 1 }, undef, 0.02);
is(scalar(grep { $_->{status} == 204 } @ok), $n + 1,
	"the healthy target receives all $n messages");
my %latency;
for my $r (@ok)
{
	my $i = $json->decode($r->{body})->{i};
	next unless $i;
	$latency{$i} = $r->{t} - $emitted{$i};
}
my @late = grep { $latency{$_} > $max_latency } sort { $a <=> $b } keys %latency;
my $max = 0;
$max < $_ and $max = $_ for values %latency;
note sprintf('latencies (s): %s', join ' ', map { sprintf '%d:%.3f', $_, $latency{$_} } sort { $a <=> $b } keys %latency);
cmp_ok(scalar @late, '<=', $max_late,
	sprintf('each within %.1f s of its emit, but for at most %d (late: %s; the slowest took %.3f s; emitted over %.1f s)',
		$max_latency, $max_late, join(' ', @late) || 'none', $max, $t_emitted - $t0));

$lag = lag_of('slow');
is($lag->{delivered}, 0, 'the slow target delivered nothing');
is($lag->{pending}, 50, '... has its 50 messages pending');
cmp_ok($lag->{error_age}, '<', time - $t0, '... and failed again while the healthy target received its messages')
  or diag($json->encode($lag));

is(lag_of('slow_nats')->{delivered}, 0, 'the NATS target of a slow host delivered nothing either');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
