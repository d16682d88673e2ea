# Isolation: one relay worker serves every target, so a slow receiver must
# not slow down the others.  A target whose receiver holds its answers
# keeps all its lanes busy; meanwhile another HTTP target and a NOTIFY
# target get 200 messages each.  The slow target's lanes run concurrently
# (its first requests are all in flight at once), and a request that
# exceeds the target's timeout_ms is retried and then dead-lettered with
# the timeout as its error.  The receiver holds answers until the test
# lifts the hold: what is checked is a state, not a time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $nfast = 200;

my $sink = start_sink('isolation');
my $url = $sink->{url};
sink_control($sink, { path => '/slow', hold => JSON::PP::true });
sink_control($sink, { path => '/timeout', hold => JSON::PP::true });
my $node = relay_node('relay_isolation');

$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('slow', '$url/slow', lanes => 4, timeout_ms => 3600000,
	max_attempts => 0);
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

# The slow target's requests in flight, as the relay counts them.
sub slow_in_flight
{
	return $node->safe_psql('postgres', q{SELECT in_flight FROM outbox.stats WHERE target = 'slow'});
}

# The fast target's time for $nfast messages with nothing else going on
# (the receiver's clock, first to last), to compare with its time while
# the slow target's requests are held.
sub fast_burst
{
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('iso.fast', jsonb_build_object('n', g), 'fast-' || g % 10)) FROM generate_series(1, $nfast) g"
	);
}
fast_burst();
my @base;
ok(wait_until(sub { @base = sink_path_records($sink, '/fast'); @base >= $nfast }, undef, 0.02),
	"the fast receiver got $nfast messages, nothing else going on");
my $base_span = $base[-1]{t} - $base[0]{t};

# Two messages for each lane of the slow target: keys chosen by lane.
my @slow_keys = split /\n/, $node->safe_psql(
	'postgres', q{
SELECT k FROM (SELECT DISTINCT ON (outbox.lane_of(k, 0, 4)) k
                 FROM (SELECT 'slow-' || g AS k FROM generate_series(1, 100) g) s
                ORDER BY outbox.lane_of(k, 0, 4), k) d});
is(scalar @slow_keys, 4, 'a key for each of the 4 lanes of the slow target');
$node->safe_psql('postgres',
	join "\n",
	map { "SELECT outbox_emit('iso.slow', '{\"n\": $_}', '$slow_keys[$_ % 4]');" } 0 .. 7);

my @slow;
ok( wait_until(
		sub { @slow = sink_path_records($sink, '/slow'); @slow >= 4 }, undef, 0.02),
	'the slow receiver got the first request of each lane');
ok(wait_for('the slow target to have 4 requests in flight',
		sub { my $n = slow_in_flight(); ($n eq '4', $n) }),
	'... all four in flight at once, none answered: its lanes run concurrently');

# The slow target's four requests are held; another target's messages must
# not wait for them.
my $commit_done = time;
fast_burst();
my @fast;
ok( wait_until(
		sub { @fast = sink_path_records($sink, '/fast'); @fast >= 2 * $nfast }, undef, 0.02),
	"the fast receiver got all $nfast messages");
@fast = @fast[ $nfast .. $#fast ];
note sprintf('fast target: %d messages in %.3f s after the commit', $nfast, $fast[-1]{t} - $commit_done);
is(slow_in_flight(), 4,
	"all $nfast messages of the fast target arrived while the slow target's requests were held");
# Not slowed down either: about as fast as with nothing held (room for a
# loaded machine; a relay that served the others only between its waits
# on the slow receiver would take seconds).
my $held_span = $fast[-1]{t} - $fast[0]{t};
cmp_ok($held_span, '<=', 3 * $base_span + 2,
	sprintf('... as fast as with nothing held (%.3f s, against %.3f s)', $held_span, $base_span));
is(scalar(sink_path_records($sink, '/slow')), 4,
	'... and the slow lanes sent nothing more meanwhile');
ok($node->poll_query_until('postgres',
		"SELECT delivered FROM outbox.lag WHERE target = 'fast_notify'", 2 * $nfast),
	'the NOTIFY target got them too');
note sprintf('NOTIFY target: all delivered %.3f s after the commit', time - $commit_done);
is(slow_in_flight(), 4, '... while the slow requests were still held');

# The slow target finishes, in per-key order.
my $t_release = time;
sink_control($sink, { path => '/slow', hold => JSON::PP::false });
ok( wait_until(
		sub { @slow = sink_path_records($sink, '/slow'); @slow >= 8 }),
	'the slow target delivers all 8 messages');
my %order;
push @{ $order{ $_->{headers}{'outbox-key'} } }, $_->{body} for @slow;
is_deeply(
	\%order,
	{ map { $slow_keys[$_] => [ "{\"n\": $_}", '{"n": ' . ($_ + 4) . '}' ] } 0 .. 3 },
	'... each lane in order');
my @second = @slow[ 4 .. 7 ];
cmp_ok($second[0]{t}, '>=', $t_release,
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
sink_control($sink, { path => '/slow', hold => JSON::PP::true });
$node->safe_psql('postgres',
	join "\n",
	map { "SELECT outbox_emit('iso.slow', '{\"m\": $_}', '$slow_keys[$_ % 4]');" } 0 .. 7);
ok( wait_until(
		sub { (sink_path_records($sink, '/slow')) >= $nslow + 4 }, undef, 0.02),
	'the slow target has requests in flight');
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT outbox.drop_target('slow')});
ok($node->wait_for_log(qr/target "slow" was dropped/, $log_offset),
	'the target is dropped with its requests in flight');
my $nfast_before = sink_path_records($sink, '/fast');
$node->safe_psql('postgres', q{SELECT outbox_emit('iso.fast', '{"after": "drop"}', 'x')});
ok(wait_until(sub { (sink_path_records($sink, '/fast')) > $nfast_before }),
	'the other targets go on');
# The abandoned requests are answered now: a span in which a relay that
# had not forgotten the target would send each lane's next message.
sink_control($sink, { path => '/slow', hold => JSON::PP::false });
usleep(1_500_000);
is(relay_worker_pid($node),
	$pid, 'the worker did not crash');
is(scalar(sink_path_records($sink, '/slow')), $nslow + 4,
	'nothing more was sent to the dropped target');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
