# Isolation: one relay worker serves every target, so a slow receiver must
# not slow down the others.  A target whose receiver takes 2 s per request
# keeps all its lanes busy; meanwhile another HTTP target and a NOTIFY
# target get 200 messages each, all well within a second.  The slow
# target's lanes run concurrently (its first requests arrive together),
# and a request that exceeds the target's timeout_ms is retried and then
# dead-lettered with the timeout as its error.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $delay_ms = 2000;
my $nfast = 200;

my $sink = start_sink('isolation');
my $url = $sink->{url};
sink_control($sink, { path => '/slow', delay_ms => $delay_ms });
sink_control($sink, { path => '/timeout', delay_ms => 1500 });
my $node = relay_node('relay_isolation');

$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('slow', '$url/slow', lanes => 4);
SELECT outbox.subscribe('slow', 'iso.slow');
SELECT outbox.create_http_target('fast', '$url/fast', lanes => 4);
SELECT outbox.subscribe('fast', 'iso.fast');
SELECT outbox.create_notify_target('fast_notify', 'iso_fast');
SELECT outbox.subscribe('fast_notify', 'iso.fast');
SELECT outbox.create_http_target('timeout', '$url/timeout', lanes => 1, timeout_ms => 300,
	max_attempts => 2);
SELECT outbox.subscribe('timeout', 'iso.timeout');
COMMIT;
});

# Two messages for each lane of the slow target: keys chosen by lane.
my @slow_keys = split /\n/, $node->safe_psql(
	'postgres', q{
SELECT k FROM (SELECT DISTINCT ON (outbox.lane_of(k, 0, 4)) k
                 FROM (SELECT 'slow-' || g AS k FROM generate_series(1, 100) g) s
                ORDER BY outbox.lane_of(k, 0, 4), k) d});
is(scalar @slow_keys, 4, 'a key for each of the 4 lanes of the slow target');
my $t_slow = time;
$node->safe_psql('postgres',
	join "\n",
	map { "SELECT outbox_emit('iso.slow', '{\"n\": $_}', '$slow_keys[$_ % 4]');" } 0 .. 7);

my @slow;
ok( wait_until(
		sub { @slow = sink_path_records($sink, '/slow'); @slow >= 4 }, 10, 0.02),
	'the slow receiver got the first request of each lane');
my $spread = $slow[3]{t} - $slow[0]{t};
cmp_ok($spread, '<', 0.5,
	sprintf('... at about the same time (within %.3f s): its lanes run concurrently', $spread));

# The slow target's four requests are in flight now; another target's
# messages must not wait for them.
my $t_fast = time;
$node->safe_psql('postgres',
	"SELECT count(outbox_emit('iso.fast', jsonb_build_object('n', g), 'fast-' || g % 10)) FROM generate_series(1, $nfast) g"
);
my $commit_done = time;
my @fast;
ok( wait_until(
		sub { @fast = sink_path_records($sink, '/fast'); @fast >= $nfast },
		30, 0.02),
	"the fast receiver got all $nfast messages");
my $fast_took = $fast[-1]{t} - $commit_done;
my $slow_now = sink_path_records($sink, '/slow');
note sprintf('fast target: %d messages in %.3f s after the commit; slow target: %d requests so far',
	$nfast, $fast_took, $slow_now);
cmp_ok($fast_took, '<', 1.5,
	"all $nfast messages of the fast target arrived within 1.5 s ($delay_ms ms per slow request)");
cmp_ok($fast[-1]{t}, '<', $slow[0]{t} + $delay_ms / 1000,
	'... while the first slow requests were still being answered');
ok($node->poll_query_until('postgres',
		"SELECT delivered FROM outbox.lag WHERE target = 'fast_notify'", $nfast),
	'the NOTIFY target got them too');
my $notify_took = time - $commit_done;
cmp_ok($notify_took, '<', 1.5, sprintf('... within %.3f s', $notify_took));

# The slow target finishes, in per-key order.
ok( wait_until(
		sub { @slow = sink_path_records($sink, '/slow'); @slow >= 8 }, 20),
	'the slow target delivers all 8 messages');
my %order;
push @{ $order{ $_->{headers}{'outbox-key'} } }, $_->{body} for @slow;
is_deeply(
	\%order,
	{ map { $slow_keys[$_] => [ "{\"n\": $_}", '{"n": ' . ($_ + 4) . '}' ] } 0 .. 3 },
	'... each lane in order');
my @second = @slow[ 4 .. 7 ];
cmp_ok($second[0]{t} - $slow[0]{t}, '>=', $delay_ms / 1000 - 0.1,
	'... a lane\'s second request only after the first was answered');

# A receiver slower than the target's timeout_ms.
$node->safe_psql('postgres', q{SELECT outbox_emit('iso.timeout', '{"t": 1}')});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT format('%s/%s', attempts, coalesce(last_status::text, 'none'))
		    FROM outbox.dead_letters WHERE target = 'timeout'}, '2/none'),
	'a request over timeout_ms is retried, then dead-lettered after max_attempts (2)');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'timeout'}),
	qr/time/i, '... with the timeout as the error');
my @to = sink_path_records($sink, '/timeout');
is(scalar @to, 2, '... the receiver saw both attempts');

# --- dropping a target while its requests are in flight ---
my $pid = relay_worker_pid($node);
my $nslow = sink_path_records($sink, '/slow');
$node->safe_psql('postgres',
	join "\n",
	map { "SELECT outbox_emit('iso.slow', '{\"m\": $_}', '$slow_keys[$_ % 4]');" } 0 .. 7);
ok( wait_until(
		sub { (sink_path_records($sink, '/slow')) >= $nslow + 4 }, 10, 0.02),
	'the slow target has requests in flight');
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT outbox.drop_target('slow')});
ok($node->wait_for_log(qr/target "slow" was dropped/, $log_offset),
	'the target is dropped with its requests in flight');
my $nfast_before = sink_path_records($sink, '/fast');
$node->safe_psql('postgres', q{SELECT outbox_emit('iso.fast', '{"after": "drop"}', 'x')});
ok(wait_until(sub { (sink_path_records($sink, '/fast')) > $nfast_before }, 10),
	'the other targets go on');
usleep($delay_ms * 1000 + 500_000);    # the abandoned requests would have been answered
is(relay_worker_pid($node),
	$pid, 'the worker did not crash');
is(scalar(sink_path_records($sink, '/slow')), $nslow + 4,
	'nothing more was sent to the dropped target');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
