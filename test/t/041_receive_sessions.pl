# outbox.receive() across sessions:
#
# (a) messages held by a session that dies (pg_terminate_backend, the client
#     disconnecting mid-transaction, a FATAL error) or by a rolled-back
#     savepoint become available again, in their original order, with
#     receive_count counting every receive, and another session receives
#     them; while they are held, nobody receives a later message of their
#     keys;
# (b) wait_ms: a waiting receive returns within 2 s (and, to show that it
#     was woken rather than finding the message at its once-a-second
#     look, within 500 ms) after a commit makes a message available: an
#     emit, or the rollback or commit of the session holding the key; it
#     returns nothing after wait_ms when nothing comes, at once with
#     wait_ms = 0, and is interruptible by pg_cancel_backend and
#     statement_timeout (57014); a waiting session that is terminated
#     leaves the others working;
# (c) competing consumers: while one transaction holds a key's message,
#     another receives the next message of another key, never the key's
#     next one; after a commit it gets the key's next message, after a
#     rollback the same message again, with receive_count 2;
# (d) three sessions receiving at the same moment from three available
#     messages of three keys each get one, with and without wait_ms;
# (e) a backend crash (SIGKILL, the server reinitializes) returns what the
#     crashed backend held; what was acknowledged before stays so.
#
# The sessions are psql processes driven from here one step at a time
# (IPC::Run; works with the test modules of PostgreSQL 15 and 18).
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxSession;


package main;

my $node = outbox_node('sessions', conf => q{
outbox.enabled = off
# the sessions of (a) roll some messages back more than 5 times
outbox.max_receives = 100
# (e) kills a backend: the server reinitializes and goes on
restart_after_crash = on
});
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('qa');
SELECT outbox.subscribe('qa', 'a');
SELECT outbox.create_queue('qb');
SELECT outbox.subscribe('qb', 'b');
SELECT outbox.create_queue('qc');
SELECT outbox.subscribe('qc', 'c');
});
my $admin = OutboxSession->new($node, 'admin');

# Emit, in one transaction, messages of topic $topic: each "key:n" gives
# key and payload {"n": n}.
sub emit
{
	my ($topic, @msgs) = @_;
	my $sql = "BEGIN;\n";
	for (@msgs)
	{
		my ($key, $n) = split /:/;
		$sql .= "SELECT 1 FROM outbox_emit('$topic', '{\"n\": $n}', '$key');\n";
	}
	$admin->run_ok("${sql}COMMIT;");
	return;
}

# The SQL of a receive whose rows print as "key:n/receive_count", one a line.
sub receive_sql
{
	my ($queue, $max, $wait) = @_;
	$wait //= 0;
	return "SELECT key || ':' || (payload ->> 'n') || '/' || receive_count"
	  . " FROM outbox.receive('$queue', $max, $wait) ORDER BY id;";
}

sub lines { my ($s) = @_; return [ grep { $_ ne '' } split /\n/, $s ]; }

# Receive with $s, expecting no error; returns the rows as a list ref.
sub receive
{
	my ($s, $queue, $max, $wait) = @_;
	return lines($s->run_ok(receive_sql($queue, $max, $wait)));
}

sub backend_gone
{
	my ($pid) = @_;
	return wait_until(
		sub {
			$admin->run_ok("SELECT count(*) FROM pg_stat_activity WHERE pid = $pid;") eq '0';
		}, undef, 0.05);
}

# Whether $s's backend is waiting in a running statement (it did not
# finish and pg_stat_activity shows it active).
# Whether $s's statement waits in a receive: its backend is active and
# waits on the queue's condition variable (an Extension wait event).
# Waits for that state (psql may not even have sent the statement yet).
sub is_waiting
{
	my ($s) = @_;
	my $finished;
	return wait_for(
		"$s->{name} to wait in a receive",
		sub {
			if ($s->poll)
			{
				$finished = 1;
				diag("$s->{name}: the statement finished: stdout '$s->{step_out}', stderr '$s->{step_err}'");
				return (1);
			}
			my $state = $admin->run_ok(
				"SELECT state || '/' || coalesce(wait_event_type, '') FROM pg_stat_activity WHERE pid = $s->{pid};");
			return ($state eq 'active/Extension', "backend state $state");
		},
		interval => 0.02) && !$finished;
}

# The server's clock now, in seconds (a step's last line of output).
sub server_time
{
	my ($out) = @_;
	return (split /\n/, $out)[-1];
}
my $now_sql = 'SELECT extract(epoch FROM clock_timestamp());';

# ---------------------------------------------------------------------
# (a) sessions that die while they hold messages
# ---------------------------------------------------------------------
my @a_msgs = qw(k1:1 k2:1 k1:2 k3:1 k2:2 k3:2);
emit('a', @a_msgs);

my $a1 = OutboxSession->new($node, 'a1');
$a1->run_ok('BEGIN;');
is_deeply(receive($a1, 'qa', 4), [qw(k1:1/1 k2:1/1 k1:2/1 k3:1/1)],
	'(a) a batch of 4 over three keys, in id order, receive_count 1');
my $b = OutboxSession->new($node, 'b');
is_deeply(receive($b, 'qa', 10), [],
	'(a) another session receives nothing while the first one holds an earlier message of every key');
ok($admin->run_ok("SELECT pg_terminate_backend($a1->{pid});") eq 't', '(a) pg_terminate_backend');
ok(backend_gone($a1->{pid}), '(a) the terminated backend is gone');
$a1->kill;
$b->run_ok('BEGIN;');
is_deeply(receive($b, 'qa', 10), [qw(k1:1/2 k2:1/2 k1:2/2 k3:1/2 k2:2/1 k3:2/1)],
	'(a) after pg_terminate_backend, another session receives them all again in order; receive_count 2 for those received before');
$b->run_ok('ROLLBACK;');

# The client goes away mid-transaction.
my $a2 = OutboxSession->new($node, 'a2');
$a2->run_ok('BEGIN;');
is_deeply(receive($a2, 'qa', 3), [qw(k1:1/3 k2:1/3 k1:2/3)], '(a) a second session receives the first three');
$a2->quit;
ok(backend_gone($a2->{pid}), '(a) the backend of the client that disconnected mid-transaction is gone');
$b->run_ok('BEGIN;');
is_deeply(receive($b, 'qa', 2), [qw(k1:1/4 k2:1/4)],
	'(a) after the client disconnected mid-transaction, its messages are received again in order');
$b->run_ok('ROLLBACK;');

# A FATAL error ends the session mid-transaction.
my $a3 = OutboxSession->new($node, 'a3');
$a3->run_ok(q{SET idle_in_transaction_session_timeout = '200ms'; BEGIN;});
is_deeply(receive($a3, 'qa', 1), [qw(k1:1/5)], '(a) a third session receives the first message');
ok(backend_gone($a3->{pid}), '(a) idle_in_transaction_session_timeout ended the session (FATAL)');
like(slurp_file($node->logfile), qr/FATAL:.*idle-in-transaction timeout/,
	'(a) the server log shows the FATAL error');
$a3->kill;
$b->run_ok('BEGIN;');
is_deeply(receive($b, 'qa', 10), [qw(k1:1/6 k2:1/5 k1:2/4 k3:1/3 k2:2/2 k3:2/2)],
	'(a) after the FATAL error, all six are received again in order');
$b->run_ok('ROLLBACK;');

# A rolled-back savepoint returns what was received after it; the rest of
# the transaction keeps what it received before.
$b->run_ok('BEGIN;');
is_deeply(receive($b, 'qa', 1), [qw(k1:1/7)], '(a) savepoint: first receive before the savepoint');
$b->run_ok('SAVEPOINT s;');
is_deeply(receive($b, 'qa', 2), [qw(k2:1/6 k1:2/5)], '(a) savepoint: two more after it');
$b->run_ok('ROLLBACK TO SAVEPOINT s;');
my $c = OutboxSession->new($node, 'c');
is_deeply(receive($c, 'qa', 2), [qw(k2:1/7 k3:1/4)],
	'(a) after ROLLBACK TO SAVEPOINT, another session receives the first message of the keys the rolled-back part held, not k1 (still held)');
is_deeply(receive($b, 'qa', 10), [qw(k1:2/6 k2:2/3 k3:2/3)],
	'(a) the session that rolled back to the savepoint receives the rest in order');
$b->run_ok('COMMIT;');
is_deeply(receive($b, 'qa', 10), [], '(a) queue qa is empty after the commit');
is($admin->run_ok(q{SELECT count(*) FROM outbox.dead_letters;}), '0', '(a) no dead letters');

# ---------------------------------------------------------------------
# (b) wait_ms
# ---------------------------------------------------------------------
my $w = OutboxSession->new($node, 'w');

# Start a receive with wait_ms = 10000 in $w, check that it waits, run
# $trigger (a step whose output ends with the server's clock read just
# before its COMMIT or ROLLBACK), and check that the receive returns
# $expect soon after: within 2 s, and within 500 ms, which shows that the
# trigger woke it (a waiting receive also looks again once a second by
# itself, so a wake-up that got lost would mostly show up as 200 ms to 1 s
# here).  Both times are the server's: just before the trigger's end (an
# overestimate by the commit's own time), and when the receive returned
# its row.
sub check_wakeup
{
	my ($what, $trigger, $expect, $waiting_what) = @_;
	$w->send("SELECT r.k, extract(epoch FROM clock_timestamp()) FROM ("
		  . receive_sql('qb', 1, 10000) =~ s/;$//r . ') r (k);');
	ok(is_waiting($w), "(b) a receive with wait_ms = 10000 waits $waiting_what");
	my $t0 = server_time($trigger->());
	ok($w->wait_done, "(b) the waiting receive returned after $what");
	my ($got, $t1) = split /\|/, $w->{step_out};
	my $ms = (($t1 // 9e9) - $t0) * 1000;    # no row: far too late
	note sprintf('(b) the waiting receive returned %.0f ms after %s', $ms, $what);
	is($got, $expect, "(b) ... with $expect");
	cmp_ok($ms, '<', 2000, "(b) ... within 2 s of $what");
	cmp_ok($ms, '<', 500, "(b) ... woken by $what (within 500 ms)");
	return;
}

# Woken by the commit of an emit.
check_wakeup('the emitting commit',
	sub { $admin->run_ok(q{BEGIN; SELECT 1 FROM outbox_emit('b', '{"n": 1}', 'x');} . $now_sql . 'COMMIT;') },
	'x:1/1', 'while the queue is empty');

# Returns nothing after wait_ms when nothing comes.  How long the receive
# took is the server's: from the statement's start to the clock read once
# the receive (in the first column, evaluated first) had returned.
sub timed_receive
{
	my ($wait) = @_;
	return split /\|/, $w->run_ok("SELECT (SELECT count(*) FROM outbox.receive('qb', 1, $wait)),"
		  . ' round(extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000);');
}
my ($rows, $ms) = timed_receive(300);
is($rows, '0', '(b) receive with wait_ms = 300 and nothing to receive returns no rows');
note sprintf('(b) receive with wait_ms = 300 returned after %.0f ms', $ms);
cmp_ok($ms, '>=', 250, '(b) ... after waiting about 300 ms');
cmp_ok($ms, '<', 2000, '(b) ... not much longer');
($rows, $ms) = timed_receive(0);
is($rows, '0', '(b) receive with wait_ms = 0 and nothing to receive returns no rows');
note sprintf('(b) receive with wait_ms = 0 returned after %.0f ms', $ms);
cmp_ok($ms, '<', 250, '(b) ... at once');

# Interruptible by pg_cancel_backend, and by statement_timeout.
$w->send(receive_sql('qb', 1, 60000));
ok(is_waiting($w), '(b) receive with wait_ms = 60000 waits');
my $t0 = time;
$admin->run_ok("SELECT pg_cancel_backend($w->{pid});");
ok($w->wait_done, '(b) the cancelled receive returned');
$ms = ($w->{done_at} - $t0) * 1000;
note sprintf('(b) the cancelled receive returned %.0f ms after pg_cancel_backend', $ms);
like($w->{step_err}, qr/ERROR:  57014: canceling statement due to user request/,
	'(b) pg_cancel_backend interrupts a waiting receive with 57014');
# (Promptly: a lost interrupt would leave the receive waiting its 60 s;
# the bound, measured from here, leaves room for a loaded machine.)
cmp_ok($ms, '<', 10_000, '(b) ... promptly');
is($w->run_ok('SELECT 1;'), '1', '(b) the session works after the cancel');
my $t = time;
$w->run(q{SET statement_timeout = '300ms';} . receive_sql('qb', 1, 60000) . 'RESET statement_timeout;');
$ms = (time - $t) * 1000;
note sprintf('(b) a receive with wait_ms = 60000 and statement_timeout = 300ms returned after %.0f ms', $ms);
like($w->{step_err}, qr/ERROR:  57014: canceling statement due to statement timeout/,
	'(b) statement_timeout interrupts a waiting receive with 57014');
cmp_ok($ms, '<', 10_000, '(b) ... promptly');

# A waiting receiver that is terminated leaves the others working.
my $w2 = OutboxSession->new($node, 'w2');
$w2->send(receive_sql('qb', 1, 60000));
ok(is_waiting($w2), '(b) a second session waits in a receive');
$admin->run_ok("SELECT pg_terminate_backend($w2->{pid});");
ok(backend_gone($w2->{pid}), '(b) the waiting session was terminated');
$w2->kill;

# Woken when the session holding a key's message rolls back, and when it
# commits and so frees the key's next message.
emit('b', qw(y:1 y:2 y:3));
my $h = OutboxSession->new($node, 'h');
$h->run_ok('BEGIN;');
is_deeply(receive($h, 'qb', 1), [qw(y:1/1)], '(b) a session holds y:1');
check_wakeup("the holder's ROLLBACK", sub { $h->run_ok($now_sql . 'ROLLBACK;') },
	'y:1/2', 'while y:1 is held (y:2 may not be received)');
# ($w received y:1 outside a transaction block: acknowledged.)
$h->run_ok('BEGIN;');
is_deeply(receive($h, 'qb', 1), [qw(y:2/1)], '(b) a session holds y:2');
check_wakeup("the holder's COMMIT", sub { $h->run_ok($now_sql . 'COMMIT;') },
	'y:3/1', 'while y:2 is held (y:3 may not be received)');
is_deeply(receive($w, 'qb', 10), [], '(b) queue qb is empty');

# ---------------------------------------------------------------------
# (c) competing consumers
# ---------------------------------------------------------------------
my $sa = OutboxSession->new($node, 'sa');
my $sb = OutboxSession->new($node, 'sb');
emit('c', qw(k1:1 k1:2 k2:1));
$sa->run_ok('BEGIN;');
$sb->run_ok('BEGIN;');
is_deeply(receive($sa, 'qc', 1), [qw(k1:1/1)], '(c) A receives k1:1');
is_deeply(receive($sb, 'qc', 1), [qw(k2:1/1)], '(c) B receives k2:1, the next message of another key, not k1:2');
is_deeply(receive($sb, 'qc', 1), [], '(c) B receives nothing more while A holds k1:1');
$sa->run_ok('COMMIT;');
is_deeply(receive($sb, 'qc', 1), [qw(k1:2/1)], '(c) after A commits, B receives k1:2');
$sb->run_ok('COMMIT;');
is_deeply(receive($sa, 'qc', 10), [], '(c) nothing left');

emit('c', qw(k1:3 k1:4 k2:2));
$sa->run_ok('BEGIN;');
$sb->run_ok('BEGIN;');
is_deeply(receive($sa, 'qc', 1), [qw(k1:3/1)], '(c) A receives k1:3');
is_deeply(receive($sb, 'qc', 1), [qw(k2:2/1)], '(c) B receives k2:2, not k1:4');
$sa->run_ok('ROLLBACK;');
is_deeply(receive($sb, 'qc', 1), [qw(k1:3/2)], '(c) after A rolls back, B receives k1:3 again, receive_count 2');
is_deeply(receive($sb, 'qc', 1), [qw(k1:4/1)], '(c) then k1:4');
$sb->run_ok('COMMIT;');
is_deeply(receive($sa, 'qc', 10), [], '(c) nothing left');
is($admin->run_ok(q{SELECT count(*) FROM outbox.dead_letters;}), '0', '(c) no dead letters');

# ---------------------------------------------------------------------
# (d) competing receivers that arrive together: three messages of three
# keys, committed, and three sessions that receive one each at the same
# moment.  Each must get one, with wait_ms = 1000 and with wait_ms = 0 (a
# receive that returns nothing while an available message is there tells
# a polling consumer that the queue is drained).
# ---------------------------------------------------------------------
$admin->run_ok(q{SELECT outbox.create_queue('qe'); SELECT outbox.subscribe('qe', 'e');});
my @rs = map { OutboxSession->new($node, "e$_") } 1 .. 3;
for my $wait (1000, 0)
{
	my ($short, $rounds, $example) = (0, 100, '');
	for my $i (1 .. $rounds)
	{
		emit('e', "a$i:1", "b$i:1", "c$i:1");
		$_->send("SELECT count(*) FROM outbox.receive('qe', 1, $wait);") for @rs;
		$_->wait_done or die "$_->{name}: the receive did not return" for @rs;
		my @got = map { $_->{step_out} } @rs;
		my $left = $admin->run_ok(q{SELECT count(*) FROM outbox.receive('qe', 10);});
		next unless grep { $_ ne '1' } @got;
		$short++;
		$example ||= "round $i: the receivers got @got, $left left in the queue";
	}
	is($short, 0,
		"(d) wait_ms = $wait: three sessions receiving at once from three available messages of three keys each get one ($short of $rounds rounds short)")
	  or diag("e.g. $example");
}
$_->quit for @rs;

# ---------------------------------------------------------------------
# (e) a backend crash
# ---------------------------------------------------------------------
emit('c', qw(k5:1 k6:1 k5:2));
my $d = OutboxSession->new($node, 'd');
$d->run_ok('BEGIN;');
is_deeply(receive($d, 'qc', 2), [qw(k5:1/1 k6:1/1)], '(e) a session receives two messages');
my $crash_log = -s $node->logfile;
kill 'KILL', $d->{pid};
$_->kill for $d, $admin, $b, $c, $w, $h, $sa, $sb;
# the postmaster has noticed (and begun reinitializing) before any poll
ok($node->wait_for_log(qr/\(PID $d->{pid}\) was terminated by signal 9/, $crash_log),
	'(e) the server reinitialized after the backend was killed');
ok( $node->poll_query_until('postgres', 'SELECT 1', '1'),
	'(e) the server accepts connections again after the crash of a backend');
$admin = OutboxSession->new($node, 'admin');
my $e = OutboxSession->new($node, 'e');
$e->run_ok('BEGIN;');
my $got = receive($e, 'qc', 10);
is_deeply([ map { s{/\d+$}{}r } @$got ], [qw(k5:1 k6:1 k5:2)],
	'(e) after the crash, another session receives the messages the crashed one held, in order, and the third');
$e->run_ok('COMMIT;');
is_deeply(receive($e, 'qc', 10), [], '(e) nothing left');
$_->quit for $admin, $e;

$node->stop;
done_testing();
