# Invariant I6 when a transaction fails after its ids were reserved: a
# serialization failure at COMMIT leaves its ids as a gap at the top of the
# sequence, the frontier (and the relay's progress) passes the gap, VACUUM
# removes the dead rows.  After a clean or an immediate restart the next ids
# must still be above the gap, or the relay would skip them as done.
#
# The durable id mark (outbox.id_mark) is what makes this hold; it moves in
# chunks, so single commits do not write it each time.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $node = relay_node('id_mark');
$node->safe_psql(
	'postgres', q{
CREATE TABLE skew (k int PRIMARY KEY, v int NOT NULL);
INSERT INTO skew VALUES (1, 0), (2, 0);
SELECT outbox.create_notify_target('n', 'id_mark_channel');
SELECT outbox.subscribe('n', '*');
});

sub emit_one
{
	my ($topic) = @_;
	return $node->safe_psql('postgres',
		"SELECT outbox_emit('$topic', '{}') IS NOT NULL; SELECT max(id) FROM outbox.messages WHERE topic = '$topic'"
	) =~ s/^t\n//r;
}

# A write skew: the second transaction emits $n messages and fails in
# COMMIT, after its ids were reserved.
sub failed_commit
{
	my ($n) = @_;
	my $s1 = $node->background_psql('postgres', on_error_stop => 0);
	my $s2 = $node->background_psql('postgres', on_error_stop => 0);
	for my $s ($s1, $s2)
	{
		$s->query_safe('BEGIN ISOLATION LEVEL SERIALIZABLE');
		$s->query_safe('SELECT sum(v) FROM skew');
	}
	$s1->query_safe(q{UPDATE skew SET v = v + 1 WHERE k = 1});
	$s2->query_safe(
		"SELECT count(outbox_emit('skew.failed', '{}')) FROM generate_series(1, $n); UPDATE skew SET v = v + 1 WHERE k = 2"
	);
	$s1->query_safe('COMMIT');
	$s2->query('COMMIT');
	like($s2->{stderr}, qr/could not serialize access/,
		'the transaction that reserved the ids fails at COMMIT');
	$s1->quit;
	$s2->quit;
}

# The relay's recorded position for target n, once it passed $upto.
sub relay_passed
{
	my ($upto) = @_;
	return $node->poll_query_until('postgres',
		"SELECT min(done_id) >= $upto FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'n'"
	);
}

sub delivered
{
	my ($id, $what) = @_;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT last_delivered_id = $id AND pending = 0 FROM outbox.lag WHERE target = 'n'"),
		"$what: the new message is delivered");
}

for my $mode ('fast', 'immediate')
{
	my $before = emit_one("before.$mode");
	failed_commit(50);
	my $frontier = $node->safe_psql('postgres', 'SELECT outbox.frontier()');
	cmp_ok($frontier, '>=', $before + 50, "$mode: the frontier passed the gap");
	ok(relay_passed($frontier), "$mode: the relay recorded progress past the gap");
	$node->safe_psql('postgres', 'VACUUM outbox.messages');
	is($node->safe_psql('postgres', 'SELECT max(id) FROM outbox.messages'),
		$before, "$mode: after VACUUM the table's highest id is below the gap");
	# The failed transaction was the last one to reserve ids.
	$node->stop($mode);
	$node->start;
	my $after = emit_one("after.$mode");
	cmp_ok($after, '>', $frontier,
		"$mode restart: the next id is above every id the frontier passed");
	delivered($after, $mode);
}

# The same with the gap followed by a TRUNCATE of the table.
{
	failed_commit(20);
	my $frontier = $node->safe_psql('postgres', 'SELECT outbox.frontier()');
	$node->safe_psql('postgres', 'TRUNCATE outbox.messages');
	$node->stop('immediate');
	$node->start;
	my $after = emit_one('after.truncate');
	cmp_ok($after, '>', $frontier, 'TRUNCATE and a restart: the next id is above the gap');
	delivered($after, 'TRUNCATE');
}

# The mark moves in chunks: a run of single commits writes it rarely.
{
	my $mark_before = $node->safe_psql('postgres', 'SELECT last_value FROM outbox.id_mark');
	emit_one("chunk.$_") for 1 .. 20;
	my ($mark, $max) = split /\|/,
	  $node->safe_psql('postgres',
		'SELECT last_value, (SELECT max(id) FROM outbox.messages) FROM outbox.id_mark');
	cmp_ok($mark, '>=', $max, 'the durable mark is at or above every id handed out');
	cmp_ok($mark - $max, '<=', 1024, '... by at most one chunk');
	is($mark, $mark_before, 'twenty single commits did not move it again');
}

relay_no_crash($node);
$node->stop;
done_testing();
