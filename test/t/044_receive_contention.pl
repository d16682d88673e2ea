# Consumers that lose races are not poison (issue 17).  A rollback counts
# toward outbox.max_receives only when it says something about the
# messages: a transaction-rollback error (SQLSTATE class 40: serialization
# failure, deadlock), a lock_timeout and the session being terminated by
# an administrator do not count; an error of the consumer's own code, a
# statement_timeout, an explicit ROLLBACK and a lost client do.
#
# (a) Four SERIALIZABLE consumers, each in a loop of
#       BEGIN ISOLATION LEVEL SERIALIZABLE;
#       read the shared table effects; receive up to 5 messages;
#       insert one row per message into effects; COMMIT;
#     conflict with each other and retry every serialization failure, as
#     PostgreSQL's documentation tells them to.  3,000 messages over 12
#     keys: many serialization failures, no dead letter, every message in
#     effects exactly once, per key in order; outbox.queues shows the
#     rollbacks, none of which counted.  The same again with consumers
#     terminated by pg_terminate_backend now and then.
# (b) Two consumers deadlock after receiving, more often than
#     max_receives: no dead letter, and the message that lost every time
#     is received and committed at last.
# (c) The cases of the rule that need a second session: a real
#     lock_timeout and pg_terminate_backend do not count; a lost client and
#     idle_in_transaction_session_timeout do, and a message that keeps
#     losing its client that way becomes a dead letter.
# The cases one session can show (errors of each class raised by the
# consumer, savepoints, statement_timeout, PL/pgSQL EXCEPTION blocks, real
# poison under READ COMMITTED and SERIALIZABLE) are in sql/queue.sql.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxSession;

my $seed = $ENV{OUTBOX_TEST_SEED} // int(rand(1_000_000));
note "random seed $seed (OUTBOX_TEST_SEED=$seed repeats it)";
srand($seed);

my $node = relay_node('recv_contention',
	conf => "outbox.max_receives = 5\ndeadlock_timeout = '1s'\n");
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'q');
CREATE TABLE effects (seq bigserial, id bigint, k text, n int, receive_count int);
});
my $admin = OutboxSession->new($node, 'admin');

sub qstat
{
	my ($col) = @_;
	return $node->safe_psql('postgres', "SELECT $col FROM outbox.queues WHERE queue = 'q'");
}

# Emit $n messages over $nkeys keys (k0 .. k<nkeys-1>, drawn at random) into
# topic q, in transactions of 50; payload n is the message's place among
# those of its key, counted from $first->{key} + 1.
sub emit_keyed
{
	my ($n, $nkeys, $first) = @_;
	my @values;
	for (1 .. $n)
	{
		my $k = 'k' . int(rand($nkeys));
		my $m = ++$first->{$k};
		push @values, "('$k', $m)";
	}
	while (my @part = splice(@values, 0, 50))
	{
		$node->safe_psql('postgres',
			'SELECT count(outbox_emit(\'q\', jsonb_build_object(\'n\', v.n), v.k)) FROM (VALUES '
			  . join(',', @part) . ') v(k, n)');
	}
}

# Per key, effects must hold n = 1, 2, 3, ... in the order they were
# committed (seq), and each message id once.
sub check_effects
{
	my ($label, $expected) = @_;
	is($node->safe_psql('postgres', 'SELECT count(*), count(DISTINCT id) FROM effects'),
		"$expected|$expected", "$label: every message is in effects exactly once");
	is( $node->safe_psql(
			'postgres', q{
SELECT count(*) FROM (
  SELECT k, n, row_number() OVER (PARTITION BY k ORDER BY seq) AS place FROM effects) s
 WHERE n <> place}), '0', "$label: per key, in order");
}

# The consumer step of (a): prints "ok <rows>" when it committed, or the
# error of the step on stderr.
my $step = q{BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT count(*) FROM effects \g /dev/null
WITH m AS (SELECT * FROM outbox.receive('q', 5))
INSERT INTO effects (id, k, n, receive_count)
SELECT id, key, (payload->>'n')::int, receive_count FROM m ORDER BY id;
COMMIT;
\echo ok};

# Run $nconsumers consumers of $step until effects holds $total rows,
# terminating a random busy consumer $kills times on the way.  Fails when
# effects gains no row for the TAP library's time limit, or after $limit
# times that limit in all.  Returns the number of serialization failures
# seen and the number of terminations done.
sub run_consumers
{
	my ($nconsumers, $total, $limit, $kills, $step_sql) = @_;
	my $step = $step_sql // $step;
	my @c = map { OutboxSession->new($node, "c$_") } 1 .. $nconsumers;
	my ($failures, $other, $killed, $steps) = (0, 0, 0, 0);
	my $stall = $PostgreSQL::Test::Utils::timeout_default;
	my $end = time + $limit * $stall;
	my $deadline = time + $stall;
	my $next_check = 0;
	my $rows = -1;
	$_->send($step) for @c;
	while (1)
	{
		if (time > $deadline || time > $end)
		{
			fail(time > $end ? "the consumers did not finish within $limit x $stall s"
				: "effects gained no row for $stall s");
			last;
		}
		my $busy = 0;
		for my $i (0 .. $#c)
		{
			my $s = $c[$i];
			if (!$s->poll)
			{
				if (!$s->gone)
				{
					$busy++;
					next;
				}
				$steps++;
				# Terminated (psql exits): the client connects again.
				$s->kill;
				$s = $c[$i] = OutboxSession->new($node, "c${i}_$steps");
			}
			elsif ($steps++, $s->{step_err} =~ /40001/)
			{
				$failures++;
			}
			elsif ($s->{step_err} =~ /terminating connection|connection to server was lost|server closed/)
			{
				$s->kill;
				$s = $c[$i] = OutboxSession->new($node, "c${i}_$steps");
			}
			elsif ($s->{step_err} =~ /ERROR/)
			{
				$other++;
				diag "consumer $s->{name}: $s->{step_err}" if $other <= 5;
			}
			$s->send($step);
		}
		if ($killed < $kills && rand() < 0.02)
		{
			my @busy = grep { $_->{busy} } @c;
			if (@busy)
			{
				my $victim = $busy[ int(rand(@busy)) ];
				$admin->query("SELECT pg_terminate_backend($victim->{pid})");
				$killed++;
				$deadline = time + $stall;    # the terminations are progress too
			}
		}
		if (time > $next_check)
		{
			# Done when effects is complete, or when the queue is empty
			# (then something went wrong, which the caller's checks show).
			my $now_rows = $node->safe_psql('postgres', 'SELECT count(*) FROM effects');
			$deadline = time + $stall if $now_rows > $rows;
			$rows = $now_rows;
			last if $killed >= $kills && ($now_rows >= $total || qstat('pending') eq '0');
			$next_check = time + 0.5;
		}
		usleep(2000) if $busy == @c;
	}
	for my $s (@c)
	{
		$s->wait_done;
		$s->close;
	}
	is($other, 0, 'no consumer step failed for a reason other than a serialization failure');
	return ($failures, $killed);
}

# ---- (a) four SERIALIZABLE consumers ------------------------------------
my %first;
emit_keyed(3000, 12, \%first);
my ($failures) = run_consumers(4, 3000, 2, 0);
note "(a) serialization failures: $failures";
# (how many depends on how the consumers interleave)
cmp_ok($failures, '>', 0, '(a) the consumers conflicted: serialization failures happened');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', '(a) no message became a dead letter');
check_effects('(a)', 3000);
cmp_ok(qstat('rolled_back'), '>', 0, '(a) outbox.queues counts the rollbacks');
is(qstat('rolled_back_counted'), '0', '(a) ... none of which counted toward max_receives');
is(qstat('acknowledged'), '3000', '(a) outbox.queues: 3,000 acknowledged');
cmp_ok($node->safe_psql('postgres', 'SELECT max(receive_count) FROM effects'),
	'>', 1, '(a) receive_count still counts every delivery');

# ... and with 20 consumers terminated on the way.
$node->safe_psql('postgres', 'TRUNCATE effects');
my $acked = qstat('acknowledged');
emit_keyed(1500, 12, {});
my $killed;
($failures, $killed) = run_consumers(4, 1500, 2, 20);
note "(a) with kills: serialization failures $failures, terminations $killed";
is($killed, 20, '(a) 20 consumers were terminated while they ran');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', '(a) with terminations: no message became a dead letter');
check_effects('(a) with terminations', 1500);
is(qstat('rolled_back_counted'), '0', '(a) with terminations: no rollback counted toward max_receives');
is(qstat('acknowledged'), $acked + 1500, '(a) with terminations: 1,500 more acknowledged');

# ... and with consumers that are procedures committing inside (CALL): a
# serialization failure at that COMMIT aborts the transaction before it is
# reported.
$node->safe_psql('postgres', q{
TRUNCATE effects;
CREATE PROCEDURE consume() LANGUAGE plpgsql AS $$
BEGIN
	PERFORM count(*) FROM effects;
	PERFORM pg_sleep(0.002);	-- the consumers overlap, whatever the machine's speed
	INSERT INTO effects (id, k, n, receive_count)
	SELECT id, key, (payload->>'n')::int, receive_count FROM outbox.receive('q', 5) ORDER BY id;
	COMMIT;
END $$;
ALTER SYSTEM SET default_transaction_isolation = 'serializable';
SELECT pg_reload_conf();
});
# the consumers' sessions start serializable
settings_reloaded($node, 'postgres', default_transaction_isolation => 'serializable');
$acked = qstat('acknowledged');
emit_keyed(1500, 12, {});
($failures) = run_consumers(4, 1500, 2, 0, q{CALL consume();
\echo ok});
note "(a) procedures: serialization failures $failures";
# (how many depends on how the consumers interleave: 4 to 84 seen)
cmp_ok($failures, '>', 0, '(a) procedures: serialization failures happened');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', '(a) procedures: no message became a dead letter');
check_effects('(a) procedures', 1500);
is(qstat('rolled_back_counted'), '0', '(a) procedures: no rollback counted toward max_receives');
is(qstat('acknowledged'), $acked + 1500, '(a) procedures: 1,500 more acknowledged');
$node->safe_psql('postgres', q{
ALTER SYSTEM RESET default_transaction_isolation;
SELECT pg_reload_conf();
});
settings_reloaded($node, 'postgres', default_transaction_isolation => 'read committed');

# ---- (b) deadlocks between two consumers ---------------------------------
# Consumer a holds the one message of key x, b a message of key y; a
# locks row 1, b row 2; b waits for row 1, and once it does, a asks for
# row 2.  a's deadlock_timeout is short and b's long, so a finds the
# deadlock and fails with 40P01 (its message returns); b then gets its row
# and commits.  Eight rounds, with max_receives 3.
$node->safe_psql('postgres', q{
ALTER SYSTEM SET outbox.max_receives = 3;
SELECT pg_reload_conf();
CREATE TABLE locks (id int PRIMARY KEY, v int);
INSERT INTO locks VALUES (1, 0), (2, 0);
});
settings_reloaded($node, 'postgres', 'outbox.max_receives' => '3');
my $dl_before = $node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters');
my $x_id = $node->safe_psql('postgres', q{SELECT outbox_emit('q', '{"x": 1}', 'x')});
my $ca = OutboxSession->new($node, 'dl_a');
my $cb = OutboxSession->new($node, 'dl_b');
$ca->query(q{SET deadlock_timeout = '50ms'});
$cb->query(q{SET deadlock_timeout = '10s'});
my ($deadlocks, $b_commits) = (0, 0);
for my $round (1 .. 8)
{
	$node->safe_psql('postgres', qq{SELECT outbox_emit('q', '{"y": $round}', 'y')});
	$ca->query('BEGIN');
	$cb->query('BEGIN');
	my $got_a = $ca->query(q{SELECT key || ':' || receive_count FROM outbox.receive('q')});
	my $got_b = $cb->query(q{SELECT key FROM outbox.receive('q')});
	is($got_a, "x:$round", "(b) round $round: consumer a holds x, received $round times");
	is($got_b, 'y', "(b) round $round: consumer b holds the next message of y");
	$ca->query('UPDATE locks SET v = v + 1 WHERE id = 1');
	$cb->query('UPDATE locks SET v = v + 1 WHERE id = 2');
	$cb->send('UPDATE locks SET v = v + 1 WHERE id = 1;');
	wait_until(
		sub {
			$node->safe_psql('postgres',
				"SELECT wait_event_type FROM pg_stat_activity WHERE pid = $cb->{pid}") eq 'Lock';
		}, undef, 0.01) or die 'consumer b does not wait for row 1';
	$ca->send('UPDATE locks SET v = v + 1 WHERE id = 2;');
	my $ra = $ca->result;
	my $rb = $cb->result;
	$deadlocks++ if $ra =~ /40P01/;
	$ca->query('ROLLBACK');
	$b_commits++ if $rb !~ /ERROR/ && $cb->query('COMMIT') !~ /ERROR/;
	$cb->query('ROLLBACK') if $rb =~ /ERROR/;
}
is($deadlocks, 8, '(b) consumer a failed with 40P01 in each of the 8 rounds');
is($b_commits, 8, '(b) consumer b committed in each round');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	$dl_before, '(b) no dead letter after 8 deadlocks with max_receives 3');
is(qstat('poisoned'), '0', '(b) ... and none waiting to become one');
$ca->query('BEGIN');
is($ca->query(q{SELECT msg_id || ':' || receive_count FROM outbox.receive('q')}),
	"$x_id:9", '(b) the message that lost every deadlock comes a ninth time');
$ca->query('COMMIT');
$ca->close;
$cb->close;

# ---- (c) the cases that need a second session ------------------------------
# One message of key z at a time; after each case, whether it counted
# shows in outbox.queues.rolled_back_counted.
sub counted { return qstat('rolled_back_counted'); }

my $holder = OutboxSession->new($node, 'holder');
my $z_id = $node->safe_psql('postgres', q{SELECT outbox_emit('q', '{"z": 1}', 'z')});

# lock_timeout on a row another session holds: does not count.
my $base = counted();
$holder->query('BEGIN');
$holder->query('UPDATE locks SET v = v + 1 WHERE id = 1');
my $c = OutboxSession->new($node, 'lt');
$c->query('BEGIN');
is($c->query(q{SELECT msg_id FROM outbox.receive('q')}), $z_id, '(c) lock_timeout: received z');
$c->query(q{SET LOCAL lock_timeout = '50ms'});
like($c->query('UPDATE locks SET v = v + 1 WHERE id = 1'),
	qr/55P03/, '(c) lock_timeout: the update fails with 55P03');
$c->query('ROLLBACK');
$holder->query('ROLLBACK');
is(counted(), $base, '(c) a lock_timeout did not count');

# pg_terminate_backend while holding the message: does not count.
$c->query('BEGIN');
is($c->query(q{SELECT msg_id FROM outbox.receive('q')}), $z_id, '(c) terminate: received z');
$admin->query("SELECT pg_terminate_backend($c->{pid})");
wait_until(sub { qstat('held') eq '0' }) or die 'the terminated session still holds z';
$c->kill;
is(counted(), $base, '(c) pg_terminate_backend did not count');

# The client goes away (psql quits) in the middle of the transaction:
# counts, three times, and z becomes a dead letter.
for my $i (1 .. 3)
{
	$c = OutboxSession->new($node, "lost$i");
	$c->query('BEGIN');
	is($c->query(q{SELECT msg_id FROM outbox.receive('q')}), $z_id, "(c) lost client $i: received z");
	$c->quit;
	wait_until(sub { qstat('held') eq '0' && counted() == $base + $i });
	is(counted(), $base + $i, "(c) lost client $i: counted");
}
is(qstat('poisoned'), '1', '(c) after three lost clients z is poisoned');
$c = OutboxSession->new($node, 'after');
$c->query('BEGIN');
is($c->query(q{SELECT count(*) FROM outbox.receive('q')}), '0',
	'(c) the next receive returns nothing ...');
$c->query('COMMIT');
$c->close;
is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.dead_letters WHERE msg_id = '$z_id'"),
	'1', '(c) ... and z is a dead letter');

# idle_in_transaction_session_timeout counts too: a second message, w.
my $w_id = $node->safe_psql('postgres', q{SELECT outbox_emit('q', '{"w": 1}', 'w')});
$c = OutboxSession->new($node, 'idle');
$c->query(q{SET idle_in_transaction_session_timeout = '300ms'});
# BEGIN and the receive in one step: the timeout cannot fall between them.
is($c->query(q{BEGIN; SELECT msg_id FROM outbox.receive('q')}), $w_id, '(c) idle timeout: received w');
wait_until(sub { qstat('held') eq '0' }) or die 'the idle session still holds w';
$c->kill;
is(counted(), $base + 4, '(c) idle_in_transaction_session_timeout counted');

# An explicit ROLLBACK counts, also when the session then sits idle and is
# terminated (the FATAL error that ends it says nothing of that rollback).
$c = OutboxSession->new($node, 'rollback_idle');
is($c->query(q{BEGIN; SELECT msg_id FROM outbox.receive('q')}), $w_id, '(c) rollback, idle: received w');
$c->query('ROLLBACK');
$admin->query("SELECT pg_terminate_backend($c->{pid})");
wait_until(sub { counted() == $base + 5 });
$c->kill;
is(counted(), $base + 5, '(c) a ROLLBACK of a session terminated afterwards counted');
$holder->close;
$admin->close;

relay_no_crash($node);
$node->stop;
done_testing();
