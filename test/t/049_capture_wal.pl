# Change capture from the WAL (issue 19): the capture worker decodes the
# database's WAL and hands each source transaction off into
# outbox.messages with its offset, exactly once.
#
# (a) 20,000 changes in 500 transactions by 4 concurrent sessions, with
#     rollbacks and rolled-back savepoints: every committed change exactly
#     once, none of the rolled-back ones, in source commit order, each
#     transaction's changes in statement order.
# (b) Faults: the capture worker killed (kill -9, which restarts the
#     server) and the server stopped with -m immediate at random moments of
#     a stream, and a crash between the hand-off commit and the slot's
#     confirmation: zero duplicates and zero losses, counted by a unique
#     column.
# (c) Replica identity DEFAULT and FULL, an unchanged TOASTed column, ADD
#     and DROP COLUMN mid-stream, TRUNCATE, DROP TABLE, a transaction
#     larger than a part (handed off in parts), and the last WAL capture
#     removed: the worker drops the slot.
# (d) WAL retention: an idle captured table while another table churns
#     holds little WAL; a slot invalidated by max_slot_wal_keep_size while
#     the worker stands still is shown as lost.
# (e) A snapshot of 100,000 rows while 4 sessions update them: per key, the
#     last message is the row as the table holds it.
# (f) A large UPDATE (200,000 rows, or OUTBOX_CAPTURE_BIG: the figures for
#     1,000,000 are in docs/performance.md) through the worker, its peak
#     RssAnon printed and bounded.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $seed = $ENV{OUTBOX_TEST_SEED} // int(rand(1_000_000));
note "random seed $seed (OUTBOX_TEST_SEED=$seed repeats it)";
srand($seed);

my $node = relay_node('capture_wal', conf => q{
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
log_min_messages = info
});
allow_output_plugins($node);

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Run the SQL script $sql in the background (psql -f): returns the harness.
my $nscript = 0;
sub start_script
{
	my ($sql) = @_;
	my $file = $PostgreSQL::Test::Utils::tmp_check . '/capture_wal_' . ++$nscript . '.sql';
	open my $fh, '>', $file or die "cannot write $file: $!";
	print $fh $sql;
	close $fh;
	my ($out, $err) = ('', '');
	return IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-f', $file ],
		'>', \$out, '2>', \$err);
}

# Wait until the worker has handed off everything committed so far: it has
# decoded (and handed off) past the WAL position taken now.
sub caught_up
{
	my ($label) = @_;
	my $target = q1('SELECT pg_current_wal_lsn()');
	ok( $node->poll_query_until('postgres', qq{
SELECT decoded_lsn >= '$target' FROM outbox.capture_status()}),
		"$label: the capture caught up")
	  or diag(q1('SELECT * FROM outbox.captures'));
}

sub worker_pid
{
	return q1(q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox capture'});
}

my @killed;

# kill -9 the capture worker (the postmaster then restarts every process)
# and wait until the server accepts connections again: after the postmaster
# has reaped the worker, else the poll may pass before the restart begins
# and the next query meet it (CI on 18).
sub kill_worker
{
	my $pid;
	wait_for('the capture worker to run', sub { $pid = worker_pid(); (scalar($pid =~ /^\d+$/), $pid) })
	  or die 'no capture worker to kill';
	my $offset = -s $node->logfile;
	kill 'KILL', $pid;
	push @killed, $pid;
	$node->wait_for_log(qr/\(PID $pid\) was terminated by signal 9/, $offset);
	$node->poll_query_until('postgres', 'SELECT true')
	  or die 'the server did not come back after the capture worker was killed';
}

#### (a) concurrent sessions
q1(q{
CREATE TABLE orders (id int PRIMARY KEY, customer text, total numeric, c int);
CREATE TABLE applied (xid text, stmt int, c int, id int, op text);
SELECT outbox.capture('orders', mode => 'wal');
});
ok($node->poll_query_until('postgres', q{SELECT state = 'streaming' FROM outbox.captures}),
	'the capture worker streams');

# Each session: 125 transactions of 40 changes on 200 ids; 1 in 10 rolled
# back, 1 in 5 with a savepoint rolled back in the middle.  Every change
# has a unique number c and is logged in applied in its transaction.
my @scripts;
my $c = 0;
my %expect_committed;
for my $s (0 .. 3)
{
	my $sql = '';
	for my $t (1 .. 125)
	{
		my $rollback = rand() < 0.1;
		my $savepoint = !$rollback && rand() < 0.2;
		$sql .= "BEGIN;\n";
		for my $i (1 .. 40)
		{
			$c++;
			my $id = $s * 50 + int(rand(50));	# each session its own ids
			if ($savepoint && $i == 20) { $sql .= "SAVEPOINT s;\n"; }
			my $op = (qw(upsert upsert update delete))[ int(rand(4)) ];
			if ($op eq 'delete')
			{
				$sql .= "WITH d AS (DELETE FROM orders WHERE id = $id RETURNING id) "
				  . "INSERT INTO applied SELECT pg_current_xact_id()::text, $i, $c, id, 'delete' FROM d;\n";
			}
			elsif ($op eq 'update')
			{
				$sql .= "WITH u AS (UPDATE orders SET total = total + 1, c = $c WHERE id = $id RETURNING id) "
				  . "INSERT INTO applied SELECT pg_current_xact_id()::text, $i, $c, id, 'update' FROM u;\n";
			}
			else
			{
				$sql .= "WITH u AS (INSERT INTO orders VALUES ($id, 'c$s', 1, $c) "
				  . "ON CONFLICT (id) DO UPDATE SET c = $c, total = orders.total + 1 "
				  . "RETURNING id, (xmax = 0) AS ins) "
				  . "INSERT INTO applied SELECT pg_current_xact_id()::text, $i, $c, id, "
				  . "CASE WHEN ins THEN 'insert' ELSE 'update' END FROM u;\n";
			}
			if ($savepoint && $i == 30) { $sql .= "ROLLBACK TO s;\n"; }
		}
		$sql .= $rollback ? "ROLLBACK;\n" : "COMMIT;\n";
	}
	push @scripts, $sql;
}
my @h = map { start_script($_) } @scripts;
$_->finish for @h;
is(scalar(grep { $_->result != 0 } @h), 0, '(a) the 4 sessions ran their 500 transactions');
caught_up('(a)');

# Every committed change once, in its transaction, in statement order; the
# transactions in commit order.
is( q1(q{
WITH m AS (
  SELECT id AS mid, headers->>'source-xid' AS xid, headers->>'source-lsn' AS lsn,
		 payload->>'op' AS op, key::int AS k,
		 row_number() OVER (PARTITION BY headers->>'source-xid' ORDER BY id) AS place
	FROM outbox.messages WHERE topic = 'public.orders'),
a AS (
  SELECT xid, op, id AS k, row_number() OVER (PARTITION BY xid ORDER BY stmt) AS place
	FROM applied)
SELECT (SELECT count(*) FROM m) || ' ' || (SELECT count(*) FROM a) || ' ' ||
	   (SELECT count(*) FROM m FULL JOIN a USING (xid, place)
		 WHERE m.op IS DISTINCT FROM a.op OR m.k IS DISTINCT FROM a.k)}),
	q1('SELECT count(*) FROM applied') . ' ' . q1('SELECT count(*) FROM applied') . ' 0',
	'(a) every committed change exactly once, none rolled back, in statement order');
is( q1(q{
SELECT count(*) FROM (
  SELECT pg_lsn(headers->>'source-lsn') < lag(pg_lsn(headers->>'source-lsn')) OVER (ORDER BY id) AS back
	FROM outbox.messages WHERE topic = 'public.orders') s WHERE back}), '0',
	'(a) source transactions in commit order');
is( q1(q{
SELECT count(*) FROM outbox.messages m JOIN applied a
  ON a.xid = m.headers->>'source-xid' AND a.c = (m.payload->'after'->>'c')::int
 WHERE m.topic = 'public.orders' AND m.payload->>'op' <> 'delete'}),
	q1(q{SELECT count(*) FROM applied WHERE op <> 'delete'}),
	'(a) the rows of inserts and updates are those the transactions wrote');
my $rolled = q1(q{SELECT count(*) FROM outbox.messages m
  WHERE topic = 'public.orders' AND payload->>'op' <> 'delete'
	AND NOT EXISTS (SELECT 1 FROM applied a WHERE a.c = (m.payload->'after'->>'c')::int)});
is($rolled, '0', '(a) no rolled-back change');
like(q1(q{SELECT payload->'before' FROM outbox.messages WHERE payload->>'op' = 'update' LIMIT 1}),
	qr/^\{"id": \d+\}$/, '(a) replica identity DEFAULT: before holds the key only');

#### (b) faults
q1(q{CREATE TABLE stream (c int PRIMARY KEY, pad text);
SELECT outbox.capture('stream', mode => 'wal');});
my $next = 0;
my $writer;
sub start_writer
{
	my $sql = '';
	for (1 .. 4000)
	{
		my $n = 1 + int(rand(20));
		$sql .= sprintf("INSERT INTO stream SELECT g, 'p' FROM generate_series(%d, %d) g;\n",
			$next + 1, $next + $n);
		$next += $n;
	}
	$writer = start_script($sql);
}
start_writer();
for my $i (1 .. 20)
{
	usleep(150_000 + int(rand(400_000)));    # a span: the next fault at a random moment
	if ($i % 5 == 0)
	{
		$node->stop('immediate');
		$node->start;
	}
	else
	{
		kill_worker();
	}
	$writer->kill_kill;
	start_writer();
}
$writer->kill_kill;
$node->poll_query_until('postgres', 'SELECT true');
caught_up('(b)');
is( q1(q{
SELECT count(*) || ' ' || count(DISTINCT (payload->'after'->>'c')::int)
  FROM outbox.messages WHERE topic = 'public.stream'}),
	q1(q{SELECT count(*) || ' ' || count(*) FROM stream}),
	'(b) 20 crashes: zero duplicates, as many messages as committed rows');
is( q1(q{
SELECT count(*) FROM stream s WHERE NOT EXISTS (
  SELECT 1 FROM outbox.messages m WHERE m.topic = 'public.stream'
	 AND (m.payload->'after'->>'c')::int = s.c)}), '0',
	'(b) zero losses: every committed row is a message');
note 'rows committed during the faults: ' . q1('SELECT count(*) FROM stream');

# A crash after the hand-off committed, before the slot was confirmed.  The
# fault is set, and taken away, by a restart: the capture worker starts
# with it (a reload reaches the worker at a moment of its own).
q1(q{ALTER SYSTEM SET outbox.test_fault = 'capture_before_confirm'});
$node->restart;
my $fault_log = -s $node->logfile;
q1(q{INSERT INTO stream SELECT g, 'f' FROM generate_series(1000001, 1000100) g});
$node->wait_for_log(qr/test fault "capture_before_confirm"/, $fault_log);
# the postmaster has noticed the crash before the poll below can pass
$node->wait_for_log(qr/"outbox capture" \(PID \d+\) was terminated by signal 9/, $fault_log);
ok($node->poll_query_until('postgres', q{SELECT true}), 'the server is back after the fault');
q1(q{ALTER SYSTEM RESET outbox.test_fault});
$node->restart;
q1(q{INSERT INTO stream SELECT g, 'f' FROM generate_series(1000101, 1000200) g});
caught_up('(b) fault point');
is( q1(q{
SELECT count(*) || ' ' || count(DISTINCT (payload->'after'->>'c')::int)
  FROM outbox.messages WHERE topic = 'public.stream' AND (payload->'after'->>'c')::int > 1000000}),
	'200 200', '(b) a crash between hand-off and confirmation: no duplicate, no loss');

#### (c) shapes
q1(q{
CREATE TABLE t (id int PRIMARY KEY, big text, n int);
ALTER TABLE t ALTER big SET STORAGE EXTERNAL;
CREATE TABLE f (id int PRIMARY KEY, big text, n int);
ALTER TABLE f REPLICA IDENTITY FULL;
SELECT outbox.capture('t', mode => 'wal');
SELECT outbox.capture('f', mode => 'wal', columns => ARRAY['id', 'big', 'n']);
INSERT INTO t VALUES (1, repeat('x', 5000), 1);
INSERT INTO f VALUES (1, repeat('y', 5000), 1);
UPDATE t SET n = 2;
UPDATE f SET n = 2;
ALTER TABLE t ADD COLUMN extra text DEFAULT 'e';
UPDATE t SET n = 3;
ALTER TABLE t DROP COLUMN extra;
ALTER TABLE t ALTER n TYPE bigint;
UPDATE t SET n = 4;
DELETE FROM f;
TRUNCATE t;
});
caught_up('(c)');
my @t = split /\n/, q1(q{SELECT (payload - 'after') || jsonb_build_object('after', CASE WHEN jsonb_typeof(payload->'after') = 'object' THEN (payload->'after') - 'big' ELSE payload->'after' END)
  || jsonb_build_object('big', length(payload->'after'->>'big')) FROM outbox.messages
 WHERE topic = 'public.t' ORDER BY id});
is_deeply(
	\@t,
	[
		'{"op": "insert", "big": 5000, "after": {"n": 1, "id": 1}, "before": null}',
		'{"op": "update", "big": null, "after": {"n": 2, "id": 1}, "before": {"id": 1}, "unchanged": ["big"]}',
		'{"op": "update", "big": null, "after": {"n": 3, "id": 1, "extra": "e"}, "before": {"id": 1}, "unchanged": ["big"]}',
		'{"op": "update", "big": null, "after": {"n": 4, "id": 1}, "before": {"id": 1}, "unchanged": ["big"]}',
		'{"op": "truncate", "big": null, "after": null, "before": null}',
	],
	'(c) DEFAULT: an unchanged TOASTed value listed as unchanged, never null; columns as of each change; TRUNCATE');
my @f = split /\n/, q1(q{SELECT payload->>'op', length(payload->'after'->>'big'), length(payload->'before'->>'big'),
  payload->'before'->>'n' FROM outbox.messages WHERE topic = 'public.f' ORDER BY id});
is_deeply(\@f, [ 'insert|5000||', 'update|5000|5000|1', 'delete||5000|2' ],
	'(c) FULL: the whole old row, and the unchanged TOASTed value filled from it');

# A transaction larger than a part is handed off in parts (small parts
# under the test fault), nothing lost or twice, also across a crash.
q1(q{ALTER SYSTEM SET outbox.test_fault = 'capture_small_parts'; SELECT pg_reload_conf();});
kill_worker();
q1(q{CREATE TABLE parts (c int PRIMARY KEY); SELECT outbox.capture('parts', mode => 'wal');});
q1(q{INSERT INTO parts SELECT generate_series(1, 2550)});
ok($node->poll_query_until('postgres', q{
SELECT parts_done > 3 OR part_commit_lsn IS NULL FROM outbox.capture_progress}), '(c) the parts go out');
kill_worker();
caught_up('(c) parts');
is( q1(q{SELECT count(*) || ' ' || count(DISTINCT key) FROM outbox.messages WHERE topic = 'public.parts'}),
	'2550 2550', '(c) a transaction in 26 parts, with a crash among them: every change once');
is( q1(q{SELECT count(*) FROM (SELECT key::int - lag(key::int) OVER (ORDER BY id) AS d
  FROM outbox.messages WHERE topic = 'public.parts') s WHERE d <> 1}), '0',
	'(c) the parts in the transaction\'s order');
q1(q{ALTER SYSTEM RESET outbox.test_fault; SELECT pg_reload_conf();});

# An outbox table from the WAL: each inserted row is one message, even when
# the transaction deleted it again; a row that is not a valid message is
# skipped, with a warning and last_error, and does not stop the capture.
q1(q{
CREATE TABLE app_outbox (id bigserial PRIMARY KEY, aggregatetype text, aggregateid text,
						 payload jsonb, headers jsonb);
SELECT outbox.capture('app_outbox', mode => 'wal', topic_column => 'aggregatetype',
					  key_column => 'aggregateid', payload_column => 'payload',
					  headers_column => 'headers');
BEGIN;
INSERT INTO app_outbox (aggregatetype, aggregateid, payload, headers)
	VALUES ('order', 'o-1', '{"n": 1}', '{"x-tenant": "acme"}');
INSERT INTO app_outbox (aggregatetype, aggregateid, payload) VALUES ('bad topic', 'o-2', '{"n": 2}');
INSERT INTO app_outbox (aggregatetype, aggregateid, payload) VALUES ('order', 'o-3', '{"n": 3}');
DELETE FROM app_outbox;
COMMIT;
});
caught_up('(c) outbox table');
is( q1(q{SELECT string_agg(topic || ' ' || key || ' ' || payload::text || ' ' || coalesce(headers::text, '-'), '; ' ORDER BY id)
  FROM outbox.messages WHERE topic = 'order'}),
	'order o-1 {"n": 1} {"x-tenant": "acme"}; order o-3 {"n": 3} -',
	'(c) an outbox table from the WAL: the rows as messages, deleted or not; the bad one skipped');
like(q1(q{SELECT last_error FROM outbox.captures WHERE table_name = 'app_outbox'::regclass}),
	qr/cannot become a message: outbox topic contains a character/, '(c) ... and named in last_error');
q1(q{SELECT outbox.uncapture('app_outbox')});

# One bad value never stops the capture (a json value jsonb refuses), nor
# does an unchanged key stored out of line, which the WAL does not carry.
q1(q{
CREATE TABLE badj (id int PRIMARY KEY, j json);
CREATE TABLE bigkey (k text PRIMARY KEY, n int);
ALTER TABLE bigkey ALTER k SET STORAGE EXTERNAL;
SELECT outbox.capture('badj', mode => 'wal');
SELECT outbox.capture('bigkey', mode => 'wal');
INSERT INTO badj VALUES (1, '{"a": "\u0000"}');
INSERT INTO badj VALUES (2, '{"a": 2}');
INSERT INTO bigkey VALUES (repeat('x', 2500), 1);
UPDATE bigkey SET n = 2;
INSERT INTO badj VALUES (3, '{"a": 3}');
});
caught_up('(c) bad values');
is(q1(q{SELECT string_agg(payload->'after'->>'id', ',' ORDER BY id) FROM outbox.messages WHERE topic = 'public.badj'}),
	'2,3', '(c) a json value jsonb refuses: that change is skipped, the capture goes on');
is( q1(q{SELECT string_agg(payload->>'op' || ':' || coalesce(length(key), 0) || ':' || (payload->'after'->>'n'), ',' ORDER BY id)
  FROM outbox.messages WHERE topic = 'public.bigkey'}),
	'insert:0:1,update:0:2', '(c) a key too long for a key: both changes sent, without a key');
like(q1(q{SELECT string_agg(last_error, ' | ') FROM outbox.captures WHERE table_name::text IN ('badj', 'bigkey')}),
	qr/cannot become a message|it has no key/, '(c) the skipped change is in last_error');
q1(q{SELECT outbox.uncapture('badj'); SELECT outbox.uncapture('bigkey');});

# Parts are cut by what the WAL holds: a setting changed between two parts
# (here outbox.max_payload_size, which skips a change) does not move them.
q1(q{ALTER SYSTEM SET outbox.test_fault = 'capture_small_parts';
ALTER SYSTEM SET outbox.max_payload_size = '1kB'; SELECT pg_reload_conf();});
kill_worker();
q1(q{CREATE TABLE parts2 (c int PRIMARY KEY, pad text); SELECT outbox.capture('parts2', mode => 'wal');});
# The hand-off of the first part waits on a lock held until the setting
# has changed: waited for as conditions, not for fixed times (under load
# the worker took longer than one: the part was decoded after the change).
my $locker = start_script(q{BEGIN; LOCK TABLE outbox.messages IN ACCESS EXCLUSIVE MODE;
SELECT pg_sleep(300); COMMIT;});
$node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_locks WHERE relation = 'outbox.messages'::regclass
   AND mode = 'AccessExclusiveLock' AND granted});
q1(q{INSERT INTO parts2 SELECT g, CASE WHEN g = 50 THEN repeat('p', 5000) ELSE 'p' END FROM generate_series(1, 250) g});
$node->poll_query_until('postgres', q{
SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'outbox capture' AND wait_event_type = 'Lock'});
q1(q{ALTER SYSTEM RESET outbox.max_payload_size; SELECT pg_reload_conf();});
q1(q{SELECT pg_terminate_backend(l.pid) FROM pg_locks l
 WHERE l.relation = 'outbox.messages'::regclass AND l.mode = 'AccessExclusiveLock' AND l.granted});
eval { $locker->finish };    # psql ends with the error of its terminated session
caught_up('(c) parts under a changed setting');
is(q1(q{SELECT count(*) || ' ' || count(DISTINCT key) FROM outbox.messages WHERE topic = 'public.parts2'}),
	'249 249', '(c) a setting changed between parts: no change twice, only the oversized one skipped');
q1(q{ALTER SYSTEM RESET outbox.test_fault; SELECT pg_reload_conf();});
kill_worker();
q1(q{SELECT outbox.uncapture('parts2')});

# DROP TABLE ends its capture; the last WAL capture removed drops the slot.
q1(q{DROP TABLE f});
is(q1(q{SELECT count(*) FROM outbox.captures WHERE table_name::text = 'f'}), '0',
	'(c) DROP TABLE ends the capture');
for my $tbl (qw(orders stream t parts))
{
	q1("SELECT outbox.uncapture('$tbl')");
}
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()}),
	'(c) without WAL captures the worker drops the slot');
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'outbox capture'}),
	'(c) and exits');

# uncapture() of the last WAL capture and capture() at once: the worker does
# not drop the slot the new capture uses.
q1(q{CREATE TABLE again (id int PRIMARY KEY); SELECT outbox.capture('again', mode => 'wal');});
ok($node->poll_query_until('postgres', q{SELECT state = 'streaming' FROM outbox.captures WHERE table_name = 'again'::regclass}),
	'(c) streaming again');
for (1 .. 5)
{
	q1(q{SELECT outbox.uncapture('again')});
	q1(q{SELECT outbox.capture('again', mode => 'wal')});
}
usleep(1_500_000);    # a span: the worker acts on the five pairs (and would drop the slot now)
q1(q{INSERT INTO again VALUES (1)});
caught_up('(c) uncapture and capture at once');
is(q1(q{SELECT state || ' ' || (SELECT count(*) FROM outbox.messages WHERE topic = 'public.again')
  FROM outbox.captures WHERE table_name = 'again'::regclass}), 'streaming 1',
	'(c) uncapture and capture at once: the slot stays, the change is captured');
q1(q{SELECT outbox.uncapture('again')});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()}),
	'(c) and the slot goes with the last capture');

# The worker is a superuser: the database's search_path cannot lend it a
# user's operator.
q1(q{
CREATE ROLE evil LOGIN;
GRANT CREATE ON SCHEMA public TO evil;
ALTER DATABASE postgres SET search_path = public, pg_catalog;
});
$node->safe_psql('postgres', q{
SET ROLE evil;
CREATE FUNCTION public.evil_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$ BEGIN
	   -- only when the capture worker calls it (the test's own sessions,
	   -- superusers too, have the same search_path)
	   IF (SELECT a.backend_type FROM pg_catalog.pg_stat_activity a
		    WHERE a.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
		  OPERATOR(pg_catalog.=) 'outbox capture' THEN
		 EXECUTE 'ALTER ROLE evil SUPERUSER';
	   END IF;
	   RETURN $1 OPERATOR(pg_catalog.=) $2;
	 END $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.evil_eq);
RESET ROLE;
});
q1(q{CREATE TABLE trap (id int PRIMARY KEY); SELECT outbox.capture('trap', mode => 'wal');
INSERT INTO trap VALUES (1);});
caught_up('(c) search_path');
kill_worker();
q1(q{INSERT INTO trap VALUES (2)});
caught_up('(c) search_path, again');
is(q1(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'evil'}), 'f',
	'(c) an operator in the database\'s search_path does not run as the capture worker');
q1(q{SELECT outbox.uncapture('trap');
ALTER DATABASE postgres RESET search_path;
DROP OPERATOR public.= (text, text); DROP FUNCTION public.evil_eq(text, text);
REVOKE CREATE ON SCHEMA public FROM evil; DROP ROLE evil;});

#### (d) WAL retention
q1(q{CREATE TABLE idle (id int PRIMARY KEY); CREATE TABLE churn (id int, pad text);
SELECT outbox.capture('idle', mode => 'wal');});
ok($node->poll_query_until('postgres', q{SELECT state = 'streaming' FROM outbox.captures}),
	'(d) streaming');
for (1 .. 5)
{
	q1(q{INSERT INTO churn SELECT g, repeat('c', 200) FROM generate_series(1, 40000) g});
}
q1('CHECKPOINT');
ok( $node->poll_query_until('postgres', q{SELECT retained_wal < 32 * 1024 * 1024 FROM outbox.captures},
	),
	'(d) an idle captured table while another churns: retained WAL stays bounded')
  or diag(q1('SELECT retained_wal FROM outbox.captures'));
note 'retained WAL after 40 MB of churn: ' . q1('SELECT retained_wal FROM outbox.captures');

# Standing still with a tiny max_slot_wal_keep_size: the slot is
# invalidated, and the capture says lost.
q1(q{ALTER SYSTEM SET max_slot_wal_keep_size = '1MB';
ALTER SYSTEM SET outbox.test_fault = 'capture_pause'; SELECT pg_reload_conf();});
# the worker starts again with the fault (it stands still from then on),
# and every process with the new max_slot_wal_keep_size
kill_worker();
for (1 .. 4)
{
	q1(q{INSERT INTO churn SELECT g, repeat('c', 200) FROM generate_series(1, 40000) g});
	q1(q{SELECT pg_switch_wal()});
}
q1('CHECKPOINT');
q1(q{ALTER SYSTEM RESET outbox.test_fault; SELECT pg_reload_conf();});
ok($node->poll_query_until('postgres', q{SELECT state = 'lost' FROM outbox.captures}),
	'(d) an invalidated slot: the capture is lost')
  or diag(q1('SELECT * FROM outbox.captures'));
like(q1('SELECT last_error FROM outbox.captures'), qr/invalidated/, '(d) with the reason');
q1(q{ALTER SYSTEM RESET max_slot_wal_keep_size; SELECT pg_reload_conf();});
q1(q{SELECT outbox.uncapture('idle')});
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()}),
	'(d) recovery: uncapture drops the lost slot');

#### (e) snapshot under concurrent updates
q1(q{CREATE TABLE snap (id int PRIMARY KEY, v int);
INSERT INTO snap SELECT g, 0 FROM generate_series(1, 100000) g;});
my @u;
for my $s (0 .. 3)
{
	my $sql = '';
	for (1 .. 300)
	{
		my $id = 1 + int(rand(100000));
		$sql .= "UPDATE snap SET v = v + 1 WHERE id = $id;\n";
	}
	push @u, start_script($sql);
}
usleep(100_000);    # a span: the updaters get going
q1(q{SELECT outbox.capture('snap', mode => 'wal', snapshot => true)});
$_->finish for @u;
caught_up('(e)');
is( q1(q{
WITH last AS (
  SELECT DISTINCT ON (m.key) m.key::int AS id, m.payload->'after' AS after
	FROM outbox.messages m WHERE m.topic = 'public.snap' ORDER BY m.key, m.id DESC)
SELECT count(*) FROM snap s LEFT JOIN last l USING (id)
 WHERE l.after IS DISTINCT FROM to_jsonb(s)}), '0',
	'(e) snapshot of 100,000 rows while 4 sessions update them: per key, the last message is the table\'s row');
is(q1(q{SELECT snapshot_rows FROM outbox.captures WHERE table_name::text = 'snap'}), '100000',
	'(e) 100,000 rows read');

#### (f) a large UPDATE
my $big = $ENV{OUTBOX_CAPTURE_BIG} // 200000;
q1(qq{CREATE TABLE bigt (id int PRIMARY KEY, v int);
INSERT INTO bigt SELECT g, 0 FROM generate_series(1, $big) g;});
my $wpid = worker_pid();
my $t0 = time;
my $mark = q1('SELECT max(id) FROM outbox.messages');
q1(q{SELECT outbox.capture('bigt', mode => 'wal')});
q1(q{UPDATE bigt SET v = 1});
my $rss = 0;
while (time - $t0 < 600)
{
	my $n = q1(qq{SELECT count(*) FROM outbox.messages WHERE id > $mark AND topic = 'public.bigt'});
	if (open my $fh, '<', "/proc/$wpid/status")
	{
		while (<$fh>) { $rss = $1 if /^RssAnon:\s+(\d+)/ && $1 > $rss; }
		close $fh;
	}
	last if $n >= $big;
	usleep(200_000);    # the sampling interval
}
is(q1(qq{SELECT count(*) || ' ' || count(DISTINCT key) FROM outbox.messages WHERE id > $mark AND topic = 'public.bigt'}),
	"$big $big", "(f) an UPDATE of $big rows: every change once");
note sprintf('(f) %d changes handed off in %.1f s; the capture worker\'s RssAnon peaked at %d kB',
	$big, time - $t0, $rss);
cmp_ok($rss, '<', 200 * 1024, '(f) the capture worker stays within 200 MB (RssAnon)');

my $log = slurp_file($node->logfile);
push @killed, $1 while $log =~ /\[(\d+)\] LOG:  outbox capture: test fault/g;
relay_no_crash($node, @killed);
done_testing();
