# Queues under attack, each case a bug found in review and fixed: a fill
# ended by pg_terminate_backend does not stop the queue; a receive waiting
# while its queue is dropped and made again (with other topics) does not
# hand out what its role was never granted; a revoked role membership
# takes effect in an open session; replay while a message is held does not
# hand it to a second receiver; whole_transactions does not starve on a
# large transaction at the front of the window; a receive with wait_ms 0
# reads past other topics' messages; more than 32 keys held at once keep
# their order; a queue of a dropped and
# re-created extension does not inherit the old window; receipts of a
# queue dropped while a transaction held its messages are deleted.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use OutboxRelayTest;
use OutboxSession;



my $node = relay_node('recv_attack', conf => "outbox.queue_window = 64\n");
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('w');
SELECT outbox.subscribe('w', 'w.*');
CREATE ROLE alice LOGIN;
CREATE ROLE grp;
GRANT grp TO alice;
});

sub ids
{
	my ($session, $q, $n, $extra) = @_;
	$extra //= '';
	return $session->query("SELECT string_agg(payload->>'n', ',' ORDER BY id) FROM outbox.receive('$q', $n$extra)");
}

# ---- a fill ended by FATAL --------------------------------------------------
my $a = OutboxSession->new($node, 's1');
is(ids($a, 'w', 1), '', 'queue w is loaded and empty');
$node->safe_psql('postgres', q{SELECT outbox_emit('w.z', '{"n": "after"}')});
my $l = OutboxSession->new($node, 's2');
$l->query('BEGIN');
$l->query('LOCK TABLE outbox.messages IN ACCESS EXCLUSIVE MODE');
my $r = OutboxSession->new($node, 's3');
my $rpid = $r->pid;
$r->send(q{SELECT count(*) FROM outbox.receive('w', 1);});
ok( $node->poll_query_until('postgres',
		qq{SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $rpid}),
	'a receiver blocks inside its fill');
# Another receiver, not asked to wait, does not wait long for that fill.
my $t0 = time;
$a->send(q{SELECT count(*) FROM outbox.receive('w', 1);});
ok($a->wait_done, 'a receive with wait_ms 0 returns while another fill is stuck behind a lock');
# (The lock is held until the test lets go: returning at all is the point;
# the bound leaves room for a loaded machine.)
cmp_ok(time - $t0, '<', 30, sprintf('... after %.0f ms', 1000 * (time - $t0)));
$node->safe_psql('postgres', "SELECT pg_terminate_backend($rpid)");
$r->quit;    # its psql ends with the connection
$l->query('COMMIT');
is(ids($a, 'w', 5, ', 60000'), 'after', 'the next receiver fills the window: the queue goes on');

# Wait until $s's receive waits for messages (on the queue's condition
# variable: an Extension wait event).
sub waiting
{
	my ($s) = @_;
	my $pid = $s->pid;
	$node->poll_query_until('postgres',
		"SELECT state = 'active' AND wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $pid")
	  or die "$s->{name}: its receive does not wait";
}

# ---- a waiting receive and a queue dropped and made again -----------------
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('jobs');
SELECT outbox.subscribe('jobs', 'j.*');
SELECT outbox.grant_receive('jobs', 'alice');
});
my $alice = OutboxSession->new($node, 's4');
$alice->query('SET ROLE alice');
$alice->send(q{SELECT string_agg(topic, ',') FROM outbox.receive('jobs', 5, 60000);});
waiting($alice);
$node->safe_psql('postgres', q{
BEGIN;
SELECT outbox.drop_target('jobs');
SELECT outbox.create_queue('jobs');
SELECT outbox.subscribe('jobs', 'secret.*');
COMMIT;
SELECT outbox_emit('secret.payroll', '{"salary": 1000000}');
});
like($alice->result, qr/ERROR: .*(was dropped|permission denied)/,
	'a receive waiting while its queue is replaced errs instead of handing out the new queue\'s messages');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0', '... nothing dead-lettered either');

# ---- a revoked membership takes effect in an open session ------------------
$node->safe_psql('postgres', q{SELECT outbox.grant_receive('w', 'grp'); SELECT outbox_emit('w.m', '{"n": "m"}')});
$alice->query('BEGIN');
is(ids($alice, 'w', 1), 'm', 'alice receives through her membership in grp');
$alice->query('ROLLBACK');
$node->safe_psql('postgres', q{REVOKE grp FROM alice});
like(ids($alice, 'w', 1), qr/permission denied to receive from outbox queue "w"/,
	'... and not after the membership is revoked, in the same session');
is(ids($a, 'w', 1), 'm', 'the message is still there');
# A receive already waiting when its right is revoked.
$node->safe_psql('postgres', q{SELECT outbox.grant_receive('w', 'alice')});
$alice->send(q{SELECT string_agg(payload->>'n', ',') FROM outbox.receive('w', 5, 60000);});
waiting($alice);
$node->safe_psql('postgres', q{SELECT outbox.revoke_receive('w', 'alice')});
$node->safe_psql('postgres', q{SELECT outbox_emit('w.late', '{"n": "late"}')});
like($alice->result, qr/permission denied to receive from outbox queue "w"/,
	'a receive waiting when its grant is revoked does not get the next message');
is(ids($a, 'w', 1), 'late', '... which stays for others');

# ---- replay while a message is held ----------------------------------------
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('rq');
SELECT outbox.subscribe('rq', 'r.*');
SELECT outbox_emit('r.a', jsonb_build_object('n', i), 'K') FROM generate_series(1, 3) i;
});
my $holder = OutboxSession->new($node, 's5');
$holder->query('BEGIN');
is(ids($holder, 'rq', 1), '1', 'A holds 1 (key K)');
my $id3 = $node->safe_psql('postgres', q{SELECT id FROM outbox.messages WHERE topic = 'r.a' AND payload->>'n' = '3'});
$node->safe_psql('postgres', "SELECT outbox.replay('rq', $id3)");
my $b = OutboxSession->new($node, 's6');
$b->query('BEGIN');
is(ids($b, 'rq', 3), '', 'after a replay B gets nothing while A holds a message');
$b->query('ROLLBACK');
$holder->query('COMMIT');
is(ids($b, 'rq', 3, ', 60000'), '2,3', 'once A committed, B gets the rest, once each, in order');
is(ids($b, 'rq', 3), '', '... and nothing twice');

# ---- many keys held at once ------------------------------------------------
# The set of keys a receive may not pass grows past its first size (32).
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('many');
SELECT outbox.subscribe('many', 'mk');
SELECT count(outbox_emit('mk', jsonb_build_object('n', r || ':' || k), 'k' || k))
  FROM generate_series(1, 2) r, generate_series(1, 40) k;
});
$holder->query('BEGIN');
is($holder->query(q{SELECT count(*) FROM outbox.receive('many', 40)}), '40', 'A holds the first message of 40 keys');
$b->query('BEGIN');
is(ids($b, 'many', 40), '', 'B gets no second message of any of them');
$b->query('ROLLBACK');
$holder->query('COMMIT');
is($b->query(q{SELECT count(*) FROM outbox.receive('many', 40)}), '40', '... until A committed');

# ---- whole_transactions and a large transaction at the front ---------------
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('g');
SELECT outbox.subscribe('g', 'g.*');
});
$node->safe_psql('postgres', "SELECT outbox_emit('g.s', jsonb_build_object('n', 's$_'))") for 1 .. 30;
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('g.big', jsonb_build_object('n', i))) FROM generate_series(1, 100) i});
is($a->query(q{SELECT count(*) FROM outbox.receive('g', 30, 0, true)}), '30', 'whole: the 30 small transactions');
my $got = 0;
for (1 .. 5)
{
	$got += $a->query(q{SELECT count(*) FROM outbox.receive('g', 100, 200, true)});
	last if $got >= 100;
}
is($got, 100, 'whole: the transaction of 100 (larger than the window) follows, in window-sized parts');

# ---- receipts of a queue dropped while its messages were held ---------------
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('dq');
SELECT outbox.subscribe('dq', 'd.*');
SELECT outbox_emit('d.x', '{"n": 1}');
});
$holder->query('BEGIN');
is(ids($holder, 'dq', 5), '1', 'a transaction holds a message of dq');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('dq')});
$holder->query('COMMIT');
ok( $node->poll_query_until(
		'postgres', q{SELECT count(*) = 0 FROM outbox.receipts r
					 WHERE NOT EXISTS (SELECT 1 FROM outbox.targets t WHERE t.id = r.target_id)}),
	'its receipt, committed after the drop, is deleted by the relay');

# ---- a re-created extension does not inherit old windows --------------------
$node->safe_psql('postgres', q{SELECT outbox_emit('w.old', jsonb_build_object('n', i)) FROM generate_series(1, 20) i});
# 210 messages of other queues lie between: a receive with wait_ms 0 reads
# past them at once, up to max_messages (it used to return nothing after
# the first read).
is($a->query(q{SELECT count(*) FROM outbox.receive('w', 5)}), '5',
	'queue w (target 1) has a window; a receive reads past other topics at once');
$a->close;
$node->safe_psql('postgres', q{
DROP EXTENSION outbox CASCADE;
CREATE EXTENSION outbox;
SELECT outbox.create_queue('fresh');
SELECT outbox.subscribe('fresh', 'f');
SELECT outbox_emit('f', '{"n": "new"}');
});
is($node->safe_psql('postgres', q{SELECT id FROM outbox.targets WHERE name = 'fresh'}), '1',
	'the new queue has the old one\'s target id');
is( $node->safe_psql('postgres', q{SELECT string_agg(payload->>'n', ',') FROM outbox.receive('fresh', 10)}),
	'new', '... and receives its own messages, not the old window');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.queue_stats() WHERE target_id = 1}), '1',
	'... and outbox.queue_stats() shows only its own slot');
my $newid = $node->safe_psql('postgres', q{SELECT min(id) FROM outbox.messages WHERE topic = 'f'});
is($node->safe_psql('postgres', "SELECT outbox.replay('fresh', $newid)"), '1', '... and it can be replayed');

$holder->close;
$b->close;
$l->close;
$alice->close;
relay_no_crash($node);
$node->stop;
done_testing();
