# The randomly failing receiver: 30% of all requests answer 500.  Three
# thousand messages over 20 keys, to a target with 8 lanes and one message
# per request, and to one that sends batches of 25 over 4 lanes:
#  - I5: every message gets a 2xx, exactly once (no crash, so no
#    redelivery of an acknowledged message);
#  - I4: per key, in the receiver's arrival order, a message is never
#    attempted before every earlier message of its key got a 2xx;
#  - retries of a message carry the same webhook-id;
#  - the lag view and outbox.progress agree: all delivered, nothing dead.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use OutboxRelayTest;

my $nmsg = 3000;
my $nkeys = 20;

my $sink = start_sink('random', '--fail-rate', '0.3', '--seed', '20240611');
my $url = $sink->{url};
my $node = relay_node('relay_random');

$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('rnd', '$url/rnd', lanes => 8, max_attempts => 0);
SELECT outbox.subscribe('rnd', 'rnd.*');
SELECT outbox.create_http_target('rndb', '$url/rndb', lanes => 4, batch_size => 25,
	max_attempts => 0);
SELECT outbox.subscribe('rndb', 'rnd.*');
COMMIT;
});

# 30 transactions of 100 messages; keys interleave within and across them.
my $t0 = time;
my $per_tx = 100;
$node->safe_psql('postgres',
	join(
		"\n",
		map {
			my $base = $_ * $per_tx;
			"SELECT count(outbox_emit('rnd.event', jsonb_build_object('n', $base + g), 'key-' || ($base + g) % $nkeys)) FROM generate_series(1, $per_tx) g;"
		} 0 .. $nmsg / $per_tx - 1));

my %expected;    # key => [seqs ascending]
my %msg_id;      # seq => msg_id
for (split /\n/,
	$node->safe_psql('postgres',
		q{SELECT id, key, msg_id FROM outbox.messages ORDER BY id}))
{
	my ($id, $key, $mid) = split /\|/;
	push @{ $expected{$key} }, $id;
	$msg_id{$id} = $mid;
}
is(scalar keys %msg_id, $nmsg, "$nmsg messages stored");
is(scalar keys %expected, $nkeys, "over $nkeys keys");

for my $t (qw(rnd rndb))
{
	ok( $node->poll_query_until(
			'postgres',
			"SELECT pending = 0 AND delivered = $nmsg FROM outbox.lag WHERE target = '$t'"),
		"target $t: the lag view shows all $nmsg delivered, none pending");
}
note sprintf('delivered to both targets in %.1f s', time - $t0);

my $all = sink_attempts($sink);
for my $t (qw(rnd rndb))
{
	my @att = grep { $_->{path} eq "/$t" } @$all;
	my @ok = grep { $_->{status} >= 200 && $_->{status} < 300 } @att;
	my %requests;
	$requests{ $_->{rseq} } = $_->{status} for @att;
	my $failed = grep { $_ == 500 } values %requests;
	my $nreq = scalar keys %requests;
	note sprintf('%s: %d requests, %d answered 500 (%.0f%%), %d message attempts',
		$t, $nreq, $failed, 100 * $failed / ($nreq || 1), scalar @att);
	cmp_ok($failed, ">", $nreq * 0.1, "$t: the receiver failed a good share of the requests");

	my %ok_count;
	$ok_count{ $_->{seq} }++ for @ok;
	is(scalar(grep { !$ok_count{$_} } keys %msg_id), 0,
		"$t: every message got a 2xx (I5)");
	is(scalar(grep { $_ > 1 } values %ok_count), 0,
		"$t: none got more than one 2xx");
	is(scalar(grep { !exists $msg_id{$_} } keys %ok_count), 0,
		"$t: nothing else was delivered");

	my @problems = check_key_fifo(\@att, \%expected);
	is_deeply(\@problems, [],
		"$t: per key, nothing is attempted before its predecessor got a 2xx (I4)");

	# The id a receiver deduplicates on: the message's msg_id, on every
	# attempt (in a batch, the envelope's id).
	my @wrong_id = grep { $_->{msg_id} ne $msg_id{ $_->{seq} } } @att;
	is(scalar @wrong_id, 0, "$t: every attempt carries the message's own id");

	is( $node->safe_psql(
			'postgres',
			"SELECT sum(delivered) || ' ' || sum(dead) || ' ' || count(*) FILTER (WHERE attempts <> 0)
			   FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
			  WHERE t.name = '$t'"),
		"$nmsg 0 0",
		"$t: outbox.progress counts $nmsg delivered, none dead, no lane retrying");
}

my @single = grep { $_->{path} eq '/rnd' } @$all;
my %wid_of;
my $wid_changes = 0;
for (@single)
{
	$wid_changes++ if exists $wid_of{ $_->{seq} } && $wid_of{ $_->{seq} } ne $_->{wid};
	$wid_of{ $_->{seq} } = $_->{wid};
}
is($wid_changes, 0, 'rnd: retries of a message carry the same webhook-id');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', 'no dead letters');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
