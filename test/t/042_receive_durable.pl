# Queues across isolation levels, restarts and crashes, with the relay
# folding acknowledgements into progress and retention running: a
# REPEATABLE READ or SERIALIZABLE receiver gets messages committed after
# its snapshot; a standby refuses; committed receives stay acknowledged
# over a crash (before and after the relay wrote them into done_id), held
# ones come back in order; receipts and the window stay small however many
# messages went through; a held message keeps retention from removing it;
# replay, pause and resume work for queues.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxSession;


my $node = relay_node('recv_durable', init => { allows_streaming => 1 },
	conf => "outbox.max_queues = 4\noutbox.queue_window = 64\n");
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'q');
});

sub emit
{
	my ($from, $to, $topic) = @_;
	$topic //= 'q';
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('$topic', jsonb_build_object('n', g), 'k' || (g % 3))) FROM generate_series($from, $to) g"
	);
}

sub received
{
	my ($session, $n, $extra) = @_;
	$extra //= '';
	return $session->query(
		"SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM outbox.receive('q', $n$extra)");
}

# ---- isolation levels -----------------------------------------------------
my $a = OutboxSession->new($node, 's1');
my $n = 1;
for my $level ('REPEATABLE READ', 'SERIALIZABLE')
{
	my $two = "$n," . ($n + 1);
	$a->query("BEGIN ISOLATION LEVEL $level");
	$a->query('SELECT count(*) FROM pg_class');    # the snapshot is taken
	emit($n, $n + 1);
	is(received($a, 10), $two, "$level: receives messages committed after its snapshot");
	is($a->query("SELECT count(*) FROM outbox.messages WHERE payload->>'n' IN ('$n', '" . ($n + 1) . "')"),
		'0', '... which its own snapshot does not see');
	$a->query('COMMIT');
	$n += 2;
}

# ---- the relay folds acknowledgements into done_id -------------------------
emit(11, 60);
is(received($a, 50), join(',', 11 .. 60), 'fifty received and committed in one transaction');
ok( $node->poll_query_until(
		'postgres', q{
SELECT p.done_id >= (SELECT max(id) FROM outbox.messages WHERE topic = 'q')
       AND NOT EXISTS (SELECT 1 FROM outbox.receipts)
  FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'q'}),
	'the relay moves the queue\'s done_id past them and deletes the receipts');

# ---- committed receives survive a crash; held ones come back --------------
emit(61, 68);
is(received($a, 3), '61,62,63', 'three received and committed');
my $b = OutboxSession->new($node, 's2');
$b->query('BEGIN');
is(received($b, 2), '64,65', 'two held by an open transaction');
is($node->safe_psql('postgres', q{SELECT held || '/' || receivers FROM outbox.lag WHERE target = 'q'}),
	'2/1', 'outbox.lag shows them held by one session');
# Crash before the relay's next compaction may or may not have run: both
# must give the same.
$node->stop('immediate');
$a->close;
$b->close;
$node->start;
$a = OutboxSession->new($node, 's3');
is(received($a, 10, ", 5000"), '64,65,66,67,68',
	'after a crash the held messages come back first, in order; the committed ones do not');

# Again with the receipts certainly not folded in: a session holds the
# queue's progress row, and the relay skips it rather than wait.
$node->safe_psql('postgres', q{
SELECT outbox.create_notify_target('n', 'recv_other');
SELECT outbox.subscribe('n', 'other.topic');
});
my $l = OutboxSession->new($node, 's4');
$l->query('BEGIN');
$l->query(q{SELECT 1 FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'q' FOR UPDATE});
emit(71, 76);
is(received($a, 2), '71,72', 'two committed while the progress row is locked');
# Two retention steps, each of which could fold the receipts in (the
# first may have begun before the emits): none may, the row being held.
my $before_steps = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
my $steps_seen = 0;
ok_wait('two retention steps ran while the progress row is locked', sub {
	my $at = $node->safe_psql('postgres', 'SELECT retention_checked_at FROM outbox.worker');
	if ($at ne '' && $node->safe_psql('postgres', "SELECT '$at'::timestamptz > '$before_steps'") eq 't')
	{
		$steps_seen++;
		$before_steps = $at;
	}
	return ($steps_seen >= 2, "$steps_seen steps since the emits (last checked at $at)");
});
$node->safe_psql('postgres', q{SELECT outbox_emit('other.topic', '{}')});
my $receipt72 = q{SELECT count(*) FROM outbox.receipts r JOIN outbox.messages m ON m.id = r.last_id
	WHERE m.payload->>'n' = '72'};
is($a->query($receipt72), '1', '... their receipt is still there');
ok(wait_until(sub { $node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'n'}) eq '1' }),
	'... and the relay did not stall on the lock: it delivers to another target');
$node->stop('immediate');
$a->close;
$l->close;
$node->start;
$a = OutboxSession->new($node, 's5');
is($a->query($receipt72), '1', 'after a crash the receipt is there');
is(received($a, 10), '73,74,75,76', '... and only the others come');

# ---- bounded: receipts and the window stay small ---------------------------
# 3,000 messages through a 64-message window, in 300 transactions.
emit(1001, 4000);
my $max_receipts = 0;
my $max_window = 0;
my $got = 0;
for my $i (1 .. 300)
{
	my $r = received($a, 10);
	$got += scalar(split /,/, $r);
	if ($i % 20 == 0)
	{
		my ($nr, $nw) = split /\|/,
		  $a->query(q{SELECT (SELECT count(*) FROM outbox.receipts), (SELECT window_messages FROM outbox.queues)});
		$max_receipts = $nr if $nr > $max_receipts;
		$max_window = $nw if $nw > $max_window;
	}
}
is($got, 3000, '3,000 messages received through a 64-message window');
cmp_ok($max_window, '<=', 64, "the window never held more than outbox.queue_window ($max_window)");
ok( $node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.receipts}),
	"receipts are deleted as the relay catches up (at most $max_receipts seen)");

# ---- a held message keeps retention from removing it -----------------------
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.retention = 0});
$node->reload;
emit(5001, 5003);
$b = OutboxSession->new($node, 's6');
$b->query('BEGIN');
is(received($b, 1), '5001', 'one message held');
is(received($a, 5), '5002,5003', 'the others received and committed');
ok($node->poll_query_until('postgres', q{SELECT retention_held_by IS NOT NULL FROM outbox.worker}),
	'retention is held back');
note('retention held by: ' . $node->safe_psql('postgres', q{SELECT retention_held_by FROM outbox.worker}));
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM outbox.messages WHERE payload->>'n' IN ('5001', '5002', '5003')}),
	'3', '... and the held message (with those after it) is kept');
$b->query('COMMIT');
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) = 0 FROM outbox.messages WHERE payload->>'n' IN ('5001', '5002', '5003')}),
	'once it is committed retention removes them');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.retention});
$node->reload;

# ---- replay, pause, resume -------------------------------------------------
emit(6001, 6004);
is(received($a, 10), '6001,6002,6003,6004', 'four received');
my $first = $node->safe_psql('postgres', q{SELECT min(id) FROM outbox.messages WHERE payload->>'n' = '6001'});
is($node->safe_psql('postgres', qq{SELECT outbox.replay('q', $first)}), '4', 'replay counts the four');
is(received($a, 10), '6001,6002,6003,6004', '... and they are received again, in order');
$node->safe_psql('postgres', q{SELECT outbox.pause_target('q')});
emit(6005, 6005);
is(received($a, 10, ", 200"), '', 'a paused queue gives nothing');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('q')});
is(received($a, 10, ", 2000"), '6005', 'resumed, it gives the message');

# Unsubscribed topics stay out; a second queue gets only its own.
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('q2');
SELECT outbox.subscribe('q2', 'other');
});
emit(7001, 7002, 'other');
emit(7003, 7003);
is(received($a, 10), '7003', 'a queue gets only its topics');
is( $a->query(q{SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM outbox.receive('q2', 10)}),
	'7001,7002', '... and another queue its own');

$a->close;
relay_no_crash($node);

# ---- a standby refuses ----------------------------------------------------
# (last: the standby is a copy of the server stopped for it)
my $standby = cold_standby($node, 'recv_standby');
$standby->start;
$node->wait_for_catchup($standby);
my ($rc, $out, $err) = $standby->psql('postgres', q{SELECT * FROM outbox.receive('q')});
like($err, qr/cannot receive from outbox queues during recovery/, 'a standby refuses to receive');
$standby->stop;
$node->stop;
done_testing();
