# DROP EXTENSION committing while a worker is inside a read of the
# extension's tables.  The race is made to happen every time: a session
# locks one of the tables, the worker is made to read it (and waits for the
# lock), and the same session then drops the extension and commits, so the
# worker's statement finds its table gone.  Each worker must then stop as
# it does when told of the drop (its LOG line, its database slot given
# back), never with an error exit or a restart loop:
#   - the relay reloading its configuration (outbox.targets, after a reload),
#   - the relay recording its progress (outbox.progress, after a delivery),
#   - the relay's retention step, which read a chunk (outbox.messages_2)
#     the session holds while it held outbox.chunks, which the drop needs
#     too (a deadlock the drop lost): it now takes the extension's tables
#     without waiting, and leaves a step to its next turn when one is held,
#     saying so in outbox.worker,
#   - the WAL capture worker reading its offset (outbox.capture_progress),
#   - the WAL capture worker handing off (it holds the extension in share
#     mode, which the drop needs first: waiting there for the table the
#     session holds, or for the offset's row it locked, was a deadlock the
#     drop could lose; it now waits for the table holding nothing, and
#     begins the hand-off again).
# The drop comes after the worker's own deadlock check, so that a worker
# waiting while it holds another table would make the drop fail.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;
use OutboxSession;

my $sink = start_sink('drop_race');
my $url = $sink->{url};

my $node = relay_node('drop_race', every_database => 1, create_extension => 0,
	conf => q{
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
log_min_messages = info
deadlock_timeout = 200ms
});
allow_output_plugins($node);
# A second database keeps its outbox throughout: outbox.relays is read
# there, and its relay must not be disturbed.
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/other');
SELECT outbox.subscribe('t', 'm');
});

sub worker_pid
{
	my ($type) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity WHERE backend_type = '$type' AND datname = 'postgres'});
}

sub relays_listed
{
	return $node->safe_psql('other',
		q{SELECT string_agg(coalesce(database, '?'), ',' ORDER BY database) FROM outbox.relays});
}

# Install the extension in postgres with a target, and wait for its relay.
sub setup
{
	$node->safe_psql('postgres', qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/postgres');
SELECT outbox.subscribe('t', 'm');
});
	ok($node->poll_query_until('other',
			q{SELECT count(*) FROM outbox.relays WHERE database = 'postgres' AND pid IS NOT NULL}, '1'),
		'postgres has a relay');
}

# Hold $table locked in $mode, make the worker of $type read it with
# $trigger (a statement run in another session), wait until that worker
# waits for the lock doing $activity, then drop the extension in the
# locking transaction and commit.  Returns the worker's pid and where its
# log starts.
sub race
{
	my ($label, $type, $table, $mode, $trigger, $activity) = @_;
	my $pid = worker_pid($type);
	isnt($pid, '', "$label: the $type runs");
	my $offset = -s $node->logfile;
	my $s = OutboxSession->new($node, 'dropper');
	$s->run_ok("BEGIN; LOCK TABLE $table IN $mode MODE;");
	$node->safe_psql('postgres', $trigger);
	my @doing = ref $activity ? @$activity : ($activity);
	my $doing = 'AND a.query IN (' . join(', ', map { "'$_'" } @doing) . ')';
	ok($node->poll_query_until('postgres', qq{
SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l USING (pid)
 WHERE a.pid = $pid AND NOT l.granted AND l.relation = '$table'::regclass $doing}, '1'),
		"$label: the $type waits inside its read (" . join(' or ', @doing) . ')')
	  or diag($node->safe_psql('postgres', qq{SELECT wait_event_type, wait_event, query FROM pg_stat_activity WHERE pid = $pid}));
	# Past the worker's own deadlock check (deadlock_timeout): had the
	# worker waited holding another of the extension's tables, the drop
	# would now be the transaction a deadlock rolls back (CI saw it).
	usleep(600_000);
	$s->run_ok('DROP EXTENSION outbox CASCADE; COMMIT;');
	$s->quit;
	ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_stat_activity WHERE pid = $pid}, '0'),
		"$label: the $type exits");
	return ($pid, $offset);
}

# What the log says from $offset on.
sub log_since
{
	my ($offset) = @_;
	return substr(slurp_file($node->logfile), $offset);
}

# --- the relay reloading its configuration ---
setup();
my ($pid, $offset) = race('configuration', 'outbox relay', 'outbox.targets',
	'ACCESS EXCLUSIVE', 'SELECT pg_reload_conf()', 'loading outbox targets');
my $log = log_since($offset);
like($log, qr/outbox relay for database "postgres" stops: the extension was dropped/,
	'configuration: the relay says why it stops');
unlike($log, qr/\(PID $pid\) exited with exit code 1/, '... without an error exit');
unlike($log, qr/ERROR:  relation "outbox\.targets" does not exist/, '... and without the error');
is(relays_listed(), 'other', '... and gives back its slot (outbox.relays)');
usleep(1_500_000);    # a span: the launcher looks again (every second)
is(worker_pid('outbox relay'), '', '... and no relay starts again in postgres');
unlike(log_since($offset), qr/outbox relay started for database "postgres"/, '... (none was started)');

# --- the relay recording its progress after a delivery ---
# SHARE: the relay's reads (retention) go through, its UPDATE waits.
setup();
($pid, $offset) = race('progress', 'outbox relay', 'outbox.progress', 'SHARE',
	q{SELECT outbox_emit('m', '{"n": 1}')}, 'recording outbox progress');
$log = log_since($offset);
like($log, qr/outbox relay for database "postgres" stops: the extension was dropped/,
	'progress: the relay says why it stops');
unlike($log, qr/\(PID $pid\) exited with exit code 1/, '... without an error exit');
is(relays_listed(), 'other', '... and gives back its slot (outbox.relays)');
usleep(1_500_000);    # a span: the launcher looks again (every second)
is(worker_pid('outbox relay'), '', '... and no relay starts again in postgres');

# --- the relay's retention step and a chunk the session holds ---
# (It reads outbox.chunks, then each chunk but the current one.)
setup();
$pid = worker_pid('outbox relay');
$offset = -s $node->logfile;
my $dropper = OutboxSession->new($node, 'dropper');
$dropper->run_ok('BEGIN; LOCK TABLE outbox.messages_2 IN ACCESS EXCLUSIVE MODE;');
my $dropper_pid = $dropper->pid;
ok($node->poll_query_until('postgres',
		qq{SELECT retention_held_by ~ '^a lock on outbox\\.messages_2 held by pid .*\\m$dropper_pid\\M' FROM outbox.worker}),
	'retention: a step meets the chunk the session holds, and outbox.worker says so')
  or diag($node->safe_psql('postgres', 'SELECT retention_held_by FROM outbox.worker'));
is($node->safe_psql('postgres', qq{SELECT count(*) FROM pg_locks WHERE pid = $pid AND NOT granted}), '0',
	'retention: ... without waiting for it');
# Past a deadlock check of the session's own, had the relay waited for it.
usleep(600_000);
ok(eval { $dropper->run_ok('DROP EXTENSION outbox CASCADE; COMMIT;'); 1 },
	'retention: the session drops the extension (no deadlock with the relay)')
  or diag($@);
$dropper->quit;
ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_stat_activity WHERE pid = $pid}, '0'),
	'retention: the relay exits');
$log = log_since($offset);
like($log, qr/outbox relay for database "postgres" stops: the extension was dropped/,
	'retention: the relay says why it stops');
unlike($log, qr/\(PID $pid\) exited with exit code 1/, '... without an error exit');
is(relays_listed(), 'other', '... and gives back its slot (outbox.relays)');

# --- the WAL capture worker reading its offset ---
setup();
$node->safe_psql('postgres', q{
CREATE TABLE orders (id int PRIMARY KEY, note text);
SELECT outbox.capture('orders', mode => 'wal');
INSERT INTO orders VALUES (1, 'a');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM outbox.messages WHERE topic LIKE '%orders%'}, '1'),
	'capture: the worker captures');
my $slot = $node->safe_psql('postgres', 'SELECT outbox.capture_slot_name()');
# The worker reads its offset at least once a second (or it may be writing
# it again after the relay's WAL: the hand-off waits as the read does).
($pid, $offset) = race('capture', 'outbox capture', 'outbox.capture_progress',
	'ACCESS EXCLUSIVE', 'SELECT 1',
	['waiting to read the outbox capture offset', 'waiting to hand off outbox captured changes']);
$log = log_since($offset);
like($log, qr/outbox capture stops: the extension was dropped/, 'capture: the worker says why it stops');
unlike($log, qr/\(PID $pid\) exited with exit code 1/, '... without an error exit');
ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'}, '0'),
	'... and drops its replication slot');
usleep(1_500_000);    # a span: the launcher looks again (every second)
is(worker_pid('outbox capture'), '', '... and no capture worker starts again');
# (the relay of postgres exits on its own, a moment after the drop)
ok($node->poll_query_until('other', q{SELECT string_agg(coalesce(database, '?'), ',' ORDER BY database) FROM outbox.relays}, 'other'),
	'... and the relay gave back the slot too');

# --- the WAL capture worker handing off, the offset's table held ---
# The worker is held before a hand-off of captured changes (the test
# fault), the session takes $lock (the table locked, or its row: the
# upsert would wait for the row), the fault is lifted: the hand-off takes
# the extension in share mode and meets the table, waits for it holding
# nothing, and the session's drop goes through.
sub handoff_race
{
	my ($label, $lock, $first) = @_;
	setup();
	$node->safe_psql('postgres', q{SELECT outbox.capture('orders', mode => 'wal')});
	my $slot = $node->safe_psql('postgres', 'SELECT outbox.capture_slot_name()');
	$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.test_fault = 'capture_slow_handoff'});
	$node->reload;
	my $offset = -s $node->logfile;
	# (the worker reads the setting at a moment of its own: an insert a
	# try, until one is held by it)
	my ($held, $n) = (0, $first);
	my $give_up = time + $PostgreSQL::Test::Utils::timeout_default;
	while (!$held && time < $give_up)
	{
		$node->safe_psql('postgres', "INSERT INTO orders VALUES ($n, 'b')");
		$held = wait_for('the capture fault in the log',
			sub { scalar(slurp_file($node->logfile, $offset) =~ /test fault "capture_slow_handoff"/) },
			timeout => 5, quiet => 1);
		$n++;
	}
	ok($held, "$label: the capture worker is held before a hand-off");
	my $pid = worker_pid('outbox capture');
	my $s = OutboxSession->new($node, 'dropper');
	$s->run_ok("BEGIN; $lock");
	$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.test_fault});
	$node->reload;
	ok($node->poll_query_until('postgres', qq{
SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l USING (pid)
 WHERE a.pid = $pid AND NOT l.granted AND l.relation = 'outbox.capture_progress'::regclass
   AND a.query = 'waiting to hand off outbox captured changes'}, '1'),
		"$label: the capture worker waits for the offset's table, holding nothing")
	  or diag($node->safe_psql('postgres', qq{SELECT wait_event_type, wait_event, query FROM pg_stat_activity WHERE pid = $pid}));
	is($node->safe_psql('postgres',
			qq{SELECT count(*) FROM pg_locks WHERE pid = $pid AND granted AND locktype <> 'virtualxid'}),
		'0', '... (no lock granted to it)');
	# Past the worker's own deadlock check (deadlock_timeout), as above.
	usleep(600_000);
	ok(eval { $s->run_ok('DROP EXTENSION outbox CASCADE; COMMIT;'); 1 },
		"$label: the session drops the extension (no deadlock with the hand-off)")
	  or diag($@);
	$s->quit;
	ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_stat_activity WHERE pid = $pid}, '0'),
		"$label: the capture worker exits");
	my $log = log_since($offset);
	like($log, qr/outbox capture stops: the extension was dropped/, "$label: the worker says why it stops");
	unlike($log, qr/\(PID $pid\) exited with exit code 1/, '... without an error exit');
	unlike($log, qr/deadlock detected/, '... and no deadlock was detected');
	ok($node->poll_query_until('postgres', qq{SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$slot'}, '0'),
		'... and drops its replication slot');
	ok($node->poll_query_until('other', q{SELECT string_agg(coalesce(database, '?'), ',' ORDER BY database) FROM outbox.relays}, 'other'),
		'... and the relay gave back the slot too');
	return $n;
}
my $next = handoff_race('hand-off', 'LOCK TABLE outbox.capture_progress IN ACCESS EXCLUSIVE MODE;', 2);
handoff_race('hand-off, a row', 'SELECT 1 FROM outbox.capture_progress FOR SHARE;', $next);

# The other database delivered on throughout.
$node->safe_psql('other', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { scalar grep { $_->{status} == 204 } @{ sink_attempts($sink, '/other') } }),
	'the other database delivers on');

# Nothing along the way was taken for a failure of the relay's own.
unlike(slurp_file($node->logfile), qr/WARNING:  outbox relay could not|exited with exit code 1/,
	'no relay warned of a failed read or retention, and no worker exited with an error');
relay_no_crash($node);
stop_sink($sink);
done_testing();
