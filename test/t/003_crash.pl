# Invariant I6, monotone ids forever: after a crash restart, and after the
# messages were deleted or truncated and the server restarted, new ids are
# higher than every id handed out before.
#
# Invariant I7, durable before delivered: with synchronous_commit = off a
# commit is visible before its WAL is flushed; outbox.frontier() must not
# return an id whose commit a crash could still undo.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

# Leave asynchronous commits in WAL buffers as long as possible, so only an
# explicit flush can make them survive an immediate shutdown.
my $node = outbox_node('crash', conf => "wal_writer_delay = 10000ms\n");

# Highest id handed out so far, over the whole test.
my $highest = 0;

# Emit $n messages in separate transactions; return their ids.
sub emit
{
	my ($n, $topic) = @_;
	my @ids;
	for my $i (1 .. $n)
	{
		my $uuid = $node->safe_psql('postgres',
			"SELECT outbox_emit('$topic', '{\"i\": $i}')");
		push @ids,
		  $node->safe_psql('postgres',
			"SELECT id FROM outbox.messages WHERE msg_id = '$uuid'");
	}
	return @ids;
}

sub crash_restart
{
	$node->stop('immediate');
	$node->start;
}

# Check that @ids are all above every id seen so far, then remember them.
sub check_above
{
	my ($what, @ids) = @_;
	my $min = (sort { $a <=> $b } @ids)[0];
	my $max = (sort { $b <=> $a } @ids)[0];
	cmp_ok($min, '>', $highest, "$what: new ids are above every earlier id");
	$highest = $max if $max > $highest;
}

# --- crash with messages in the table ---
my @ids = emit(5, 'before.crash');
is_deeply(\@ids, [ $ids[0] .. $ids[0] + 4 ], 'sequential commits get consecutive ids');
check_above('first messages', @ids);

# A transaction can fail in COMMIT after its ids were reserved: the
# serialization check runs after the outbox stored its messages.  Its ids
# become a gap, which the frontier must step over.
$node->safe_psql(
	'postgres', q{
CREATE TABLE skew (k int PRIMARY KEY, v int NOT NULL);
INSERT INTO skew VALUES (1, 0), (2, 0);
});
my $s1 = $node->background_psql('postgres', on_error_stop => 0);
my $s2 = $node->background_psql('postgres', on_error_stop => 0);
for my $s ($s1, $s2)
{
	$s->query_safe('BEGIN ISOLATION LEVEL SERIALIZABLE');
	$s->query_safe('SELECT sum(v) FROM skew');
}
$s1->query_safe(q{SELECT outbox_emit('skew', '{}'); UPDATE skew SET v = 1 WHERE k = 1});
$s2->query_safe(q{SELECT outbox_emit('skew', '{}'); UPDATE skew SET v = 1 WHERE k = 2});
$s1->query_safe('COMMIT');
$s2->query('COMMIT');
like($s2->{stderr}, qr/could not serialize access/,
	'the second transaction of the write skew fails at COMMIT');
$s1->quit;
$s2->quit;
my $skew_id = $node->safe_psql('postgres',
	q{SELECT id FROM outbox.messages WHERE topic = 'skew'});
check_above('committed skew transaction', $skew_id);
@ids = emit(1, 'after.gap');
is($ids[0], $skew_id + 2,
	'the transaction that failed at COMMIT had reserved an id, now a gap');
check_above('after the gap', @ids);
cmp_ok($node->safe_psql('postgres', 'SELECT outbox.frontier()'), '>=', $ids[0],
	'the frontier steps over the gap');

crash_restart();
@ids = emit(3, 'after.crash');
check_above('after a crash restart', @ids);

# --- crash with the highest messages deleted ---
my $deleted_above = $ids[0];
$node->safe_psql('postgres',
	"DELETE FROM outbox.messages WHERE id >= $deleted_above");
# VACUUM removes the deleted row versions, so after the restart only the
# high-water mark remembers the ids they had.
$node->safe_psql('postgres', 'VACUUM outbox.messages');
is( $node->safe_psql('postgres', 'SELECT max(id_high_water) FROM outbox.state'),
	$highest, 'DELETE records the highest deleted id as the high-water mark');
crash_restart();
@ids = emit(3, 'after.delete');
check_above('after deleting the newest messages and a crash restart', @ids);

# --- crash with every message deleted ---
$node->safe_psql('postgres', 'DELETE FROM outbox.messages');
$node->safe_psql('postgres', 'VACUUM outbox.messages');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	'0', 'all messages deleted');
crash_restart();
@ids = emit(3, 'after.delete.all');
check_above('after deleting all messages and a crash restart', @ids);

# --- a clean restart with every message deleted, twice ---
$node->safe_psql('postgres', 'DELETE FROM outbox.messages');
$node->safe_psql('postgres', 'VACUUM outbox.messages');
$node->restart;
$node->restart;
@ids = emit(2, 'after.delete.restart');
check_above('after deleting all messages and two clean restarts', @ids);

# --- crash with the table truncated ---
$node->safe_psql('postgres', 'TRUNCATE outbox.messages');
is($node->safe_psql('postgres', 'SELECT max(id_high_water) FROM outbox.state'),
	$highest, 'TRUNCATE records the highest id as the high-water mark');
crash_restart();
@ids = emit(3, 'after.truncate');
check_above('after TRUNCATE and a crash restart', @ids);

# A TRUNCATE rolled back changes nothing; the ids stay above too.
$node->safe_psql('postgres', 'BEGIN; TRUNCATE outbox.messages; ROLLBACK');
crash_restart();
@ids = emit(1, 'after.truncate.rollback');
check_above('after a rolled-back TRUNCATE and a crash restart', @ids);

# TRUNCATE and emit in one transaction, then crash: the emitted message is
# stored in the new (truncated) table.
my $uuid = $node->safe_psql('postgres',
	q{BEGIN; TRUNCATE outbox.messages; SELECT outbox_emit('with.truncate', '{}'); COMMIT;});
my $with_truncate = $node->safe_psql('postgres',
	"SELECT id FROM outbox.messages WHERE msg_id = '$uuid'");
check_above('emitted in the transaction that truncated', $with_truncate);
crash_restart();
@ids = emit(2, 'after.truncate.and.emit');
check_above('after TRUNCATE and emit in one transaction, then a crash', @ids);
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	'3', 'the messages emitted since the TRUNCATE are all there');

# --- TRUNCATE from a REPEATABLE READ transaction ---
# Its snapshot predates a message committed meanwhile; the TRUNCATE still
# removes that message (TRUNCATE is not MVCC-safe), so the high-water mark
# must cover it as well.
my $rr = $node->background_psql('postgres');
$rr->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$rr->query_safe('SELECT count(*) FROM outbox.messages');    # takes the snapshot
@ids = emit(1, 'during.rr.truncate');
check_above('emitted while a REPEATABLE READ transaction is open', @ids);
$rr->query_safe('TRUNCATE outbox.messages');
$rr->query_safe('COMMIT');
$rr->quit;
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	'0', 'the REPEATABLE READ TRUNCATE removed the newer message too');
cmp_ok($node->safe_psql('postgres', 'SELECT max(id_high_water) FROM outbox.state'),
	'>=', $ids[0],
	'the high-water mark covers the message the TRUNCATE could not see');
crash_restart();
@ids = emit(1, 'after.rr.truncate');
check_above('after a REPEATABLE READ TRUNCATE and a crash restart', @ids);

# --- I7: the frontier flushes asynchronous commits ---
# In one session with synchronous_commit = off: emit and commit, then ask
# for the frontier.  The commit is visible at once but its WAL may sit in
# memory; the frontier may only cover it once it is flushed.
my $async = $node->background_psql('postgres');
$async->query_safe('SET synchronous_commit = off');
my $async_uuid = $async->query_safe(q{SELECT outbox_emit('async', '{"n": 1}')});
my $async_id = $async->query_safe(
	"SELECT id FROM outbox.messages WHERE msg_id = '$async_uuid'");
my $frontier = $async->query_safe('SELECT outbox.frontier()');
cmp_ok($frontier, '>=', $async_id,
	'the frontier covers the asynchronously committed message');
my $covered = $async->query_safe(
	"SELECT count(*) FROM outbox.messages WHERE id <= $frontier");

# A second asynchronous commit that no frontier call covered.  Whether it
# survives the crash is up to chance (another flush may happen); it is only
# reported, as a sign of whether the check above is meaningful.
my $unflushed_uuid =
  $async->query_safe(q{SELECT outbox_emit('async', '{"n": 2}')});
$async->quit;

crash_restart();
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FROM outbox.messages WHERE msg_id = '$async_uuid' AND id = $async_id"
	),
	'1',
	'a message at or below a frontier returned before the crash survives it');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM outbox.messages WHERE id <= $frontier"),
	$covered, 'nothing at or below the frontier was lost');
note 'the unflushed asynchronous commit '
  . ($node->safe_psql('postgres',
		"SELECT count(*) FROM outbox.messages WHERE msg_id = '$unflushed_uuid'") ? 'survived' : 'did not survive')
  . ' the crash';

@ids = emit(1, 'after.async.crash');
cmp_ok($ids[0], '>', $async_id,
	'after the crash new ids are above the frontier-covered message');

$node->stop;
done_testing();
