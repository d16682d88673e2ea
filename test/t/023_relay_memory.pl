# The relay's memory is bounded in bytes (outbox.relay_memory), not in
# messages: 120 messages of 512 kB (they compress, so the table stays
# small) to a slow receiver with batch_size 1000.  Without the cap the
# read-ahead would take them all and one request body would hold 60 MB;
# with outbox.relay_memory = 8MB the relay's private memory stays near its
# idle size, every batch body is small, everything arrives, and a healthy
# target on another topic keeps flowing.  A message larger than a target's
# whole share is still delivered, alone.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('memory');
my $url = $sink->{url};
my $node = relay_node(
	'relay_memory', conf => q{
outbox.relay_memory = '8MB'
outbox.max_payload_size = '16MB'
});

sub rss_anon
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return 0;
	while (<$fh>) { return $1 if /^RssAnon:\s+(\d+) kB/ }
	return 0;
}

# The slow receiver holds its first answers until the healthy target has
# delivered everything, then answers them, and each later request after
# 100 ms.
sink_control($sink, { path => '/big', hold => JSON::PP::true, keep_body => JSON::PP::false });
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('big', '$url/big', batch_size => 1000, lanes => 2,
	timeout_ms => 3600000, max_attempts => 0);
SELECT outbox.subscribe('big', 'big');
SELECT outbox.create_http_target('small', '$url/small');
SELECT outbox.subscribe('small', 'small');
});
# Warm the relay up, then take its idle size.
$node->safe_psql('postgres', q{SELECT outbox_emit('small', '{"warm": 1}')});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'small'}),
	'warm-up delivered');
my $pid = relay_worker_pid($node);
my $idle = rss_anon($pid);

$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('big', to_jsonb(repeat(chr(65 + g % 20), 512 * 1024)), 'k' || (g % 4))) FROM generate_series(1, 120) g});
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('small', jsonb_build_object('n', g))) FROM generate_series(1, 50) g});

my $peak = 0;
my ($big, $small);
# Until both are done, sampling the relay's memory; the first phase ends
# when the healthy target is done, the second when the slow one is.
for my $phase ('small', 'both')
{
	my $done = wait_for(
		$phase eq 'small' ? 'the healthy target to deliver everything' : 'both targets to deliver everything',
		sub {
			my $r = rss_anon($pid);
			$peak = $r if $r > $peak;
			($big, $small) = split /\|/, $node->safe_psql('postgres',
				q{SELECT (SELECT pending FROM outbox.lag WHERE target = 'big'), (SELECT pending FROM outbox.lag WHERE target = 'small')});
			return ($small == 0 && ($phase eq 'small' || $big == 0), "big $big, small $small pending");
		},
		interval => 0.05);
	next unless $phase eq 'small';
	ok($done && $big > 0, 'the healthy target finished while the slow one was still draining');
	sink_control($sink, { path => '/big', hold => JSON::PP::false, delay_ms => 100 });
}
is($node->safe_psql('postgres', q{SELECT string_agg(format('%s:%s/%s', target, pending, dead_letters), ' ' ORDER BY target) FROM outbox.lag}),
	'big:0/0 small:0/0', 'every message was delivered');
is(relay_worker_pid($node), $pid, 'the relay did not restart');

my @big = grep { $_->{status} && $_->{status} == 204 } sink_path_records($sink, '/big');
my $count = 0;
$count += $_->{headers}{'outbox-count'} // 1 for @big;
is($count, 120, 'the receiver got the 120 large messages');
my ($largest) = sort { $b <=> $a } map { $_->{body_len} } @big;
cmp_ok($largest, '<=', 3 * 1024 * 1024, "batches were cut by size (largest body: $largest bytes)");
cmp_ok(scalar @big, '>=', 20, 'in many requests (' . scalar(@big) . ')');
my $grew = $peak - $idle;
cmp_ok($grew, '<', 40 * 1024,
	"the relay's RssAnon grew by $grew kB (idle $idle kB, peak $peak kB), within the cap's reach");

# A message larger than a target's whole share is delivered, alone.
$node->safe_psql('postgres', q{SELECT outbox_emit('big', to_jsonb(repeat('z', 6 * 1024 * 1024)), 'k1')});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 AND dead_letters = 0 FROM outbox.lag WHERE target = 'big'}),
	'a message larger than the cap is delivered');
my @last = grep { $_->{status} && $_->{status} == 204 } sink_path_records($sink, '/big');
cmp_ok($last[-1]{body_len}, '>', 6 * 1024 * 1024, '... in a request of its own');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
