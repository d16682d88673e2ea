# Change capture by trigger (outbox.capture(), mode 'trigger') against a
# running server, with concurrent writers:
# (a) Four sessions run 500 transactions of 40 row changes each (20,000
#     changes: inserts, updates, deletes of orders over 200 ids); every
#     tenth transaction ends with ROLLBACK, a quarter roll a savepoint back
#     (ROLLBACK TO, sometimes over an outbox_emit() too), some release one;
#     every transaction calls outbox_emit('marker', {tx, seq}) between its
#     changes.  The application records, in the same transactions, each
#     change (a unique change number, which is also the row's note, the row
#     before and after it, and the key's version: a per-key counter taken
#     under a row lock, so it follows commit order) and each marker in
#     applog, which is not captured.  Then in outbox.messages: every
#     committed change exactly once with the payload {"op", "before",
#     "after"} the application saw, nothing of a rolled-back transaction or
#     savepoint, the messages of a transaction at contiguous ids in
#     statement order with its marker in its place, per key the changes in
#     commit order, the source-* headers.
# (b) An HTTP target subscribed to the captured topic receives every
#     captured change once, with its payload, per key in order (I4).
# (c) pg_dump -Fc of a database with a captured table, DROP DATABASE,
#     CREATE DATABASE, pg_restore: the restore emits nothing for the rows
#     it loads, outbox.captures lists the table, the next INSERT is
#     captured.  Skipped where pg_dump cannot dump this server (PostgreSQL
#     18 with the clients of 15).
# (d) session_replication_role = replica: not captured; after ALTER TABLE
#     ... with both triggers ENABLE ALWAYS captured, the state 'always'.
# (e) A partitioned table with two partitions and concurrent writers in
#     both, writing through the parent or to a partition: every change on
#     the parent's topic, per key in commit order.
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
my $t_start = time;

my $ntx = 500;		# transactions of (a)
my $per_tx = 40;	# row changes per transaction
my $nkeys = 200;	# order ids
my $nsessions = 4;

my $sink = start_sink('capture');
my $url = $sink->{url};
my $node = relay_node('capture_trigger', conf => "max_connections = 40\n");
# (c) needs a pg_dump and pg_restore that can work with this server.
my $dump_skip = client_matches_server($node, 'pg_dump') || client_matches_server($node, 'pg_restore');

# Run the scripts in @$scripts on $n sessions at once, each session taking
# the next script when it is done with one.  Returns the problems: what a
# script printed on stderr, or that no script finished for the TAP
# library's time limit ($limit seconds if given).
sub run_concurrently
{
	my ($n, $scripts, $limit) = @_;
	my @queue = @$scripts;
	my @s = map { OutboxSession->new($node, "w$_") } 1 .. $n;
	my @problems;
	$limit //= $PostgreSQL::Test::Utils::timeout_default;
	my $deadline = time + $limit;
	while (1)
	{
		my $running = 0;
		for my $s (@s)
		{
			if ($s->{busy})
			{
				if (!$s->poll)
				{
					$running++;
					next;
				}
				push @problems, "$s->{name}: $s->{step_err}" if $s->{step_err} ne '';
				$deadline = time + $limit;    # progress
			}
			if (@queue)
			{
				$s->send(shift @queue);
				$running++;
			}
		}
		last unless $running;
		if (time > $deadline)
		{
			push @problems, "no script finished for $limit s";
			$_->kill for @s;
			return @problems;
		}
		usleep(2000);
	}
	$_->quit for @s;
	return @problems;
}

# ---------------------------------------------------------------------------
# (a) 20,000 changes by four sessions
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', qq{
CREATE TABLE orders (id int PRIMARY KEY, customer text, total numeric, note text);
-- The application's side, not captured: a per-key version (the row lock on
-- it orders the changes of a key by commit) and the log of what it did.
CREATE TABLE versions (id int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO versions SELECT g, 0 FROM generate_series(1, $nkeys) g;
CREATE TABLE applog (
	n		int PRIMARY KEY,	-- change number, unique; the note of the row written
	tx		int NOT NULL,		-- the script's transaction number
	xid		text NOT NULL,		-- pg_current_xact_id()
	id		int,				-- the order id (null for a marker)
	op		text NOT NULL,		-- insert, update, delete, marker
	v		bigint,				-- the key's version: commit order per key
	payload	jsonb NOT NULL		-- the message the change must give
);
-- One change of order x, always exactly one row: an insert when there is
-- no row, else an update or, when want = 'delete', a delete.  The caller
-- holds the lock on versions x, so the row cannot change under it.
CREATE FUNCTION app_change(t int, n int, x int, want text) RETURNS void
LANGUAGE plpgsql AS \$\$
DECLARE
	ver bigint;
	b jsonb;
	a jsonb;
	what text;
BEGIN
	UPDATE versions SET v = v + 1 WHERE id = x RETURNING v INTO ver;
	SELECT to_jsonb(o) INTO b FROM orders o WHERE o.id = x;
	IF b IS NULL THEN
		INSERT INTO orders VALUES (x, 'c' || t, ver + 0.5, n::text);
		what := 'insert';
	ELSIF want = 'delete' THEN
		DELETE FROM orders WHERE id = x;
		what := 'delete';
	ELSE
		UPDATE orders SET customer = 'c' || t, total = ver + 0.5, note = n::text WHERE id = x;
		what := 'update';
	END IF;
	SELECT to_jsonb(o) INTO a FROM orders o WHERE o.id = x;
	INSERT INTO applog VALUES (n, t, pg_current_xact_id()::text, x, what, ver,
		jsonb_build_object('op', what, 'before', b, 'after', a));
END
\$\$;
SELECT outbox.capture('orders');
SELECT outbox.create_http_target('cap', '$url/cap', lanes => 4, batch_size => 25, max_attempts => 0);
SELECT outbox.subscribe('cap', 'public.orders');
});
is( $node->safe_psql('postgres',
		q{SELECT table_name || '|' || mode || '|' || topic || '|' || shape || '|' || state FROM outbox.captures}),
	'orders|trigger|public.orders|changes|capturing',
	'outbox.captures lists orders, captured by trigger on topic public.orders');

# The scripts.  A transaction first locks the versions rows of the keys it
# will change, in key order (no deadlocks), then changes them in random
# order.
my $change_no = 0;
my @scripts;
my @rolled_back;	# change numbers (and marker seqs) that must not appear
my ($planned_changes, $planned_markers, $planned_tx) = (0, 0, 0);
my ($n_rollback, $n_sp_rollback, $n_sp_release) = (0, 0, 0);
for my $t (1 .. $ntx)
{
	my $rollback = $t % 10 == 0;
	my $sp = $t % 4 == 1 ? 'rollback' : $t % 7 == 2 ? 'release' : '';
	$n_rollback++ if $rollback;
	$n_sp_rollback++ if $sp eq 'rollback' && !$rollback;
	$n_sp_release++ if $sp eq 'release' && !$rollback;
	my @keys = map { 1 + int(rand($nkeys)) } 1 .. $per_tx;
	my %distinct = map { $_ => 1 } @keys;
	my $lock = join(',', sort { $a <=> $b } keys %distinct);
	# the savepoint covers changes $s .. $e - 1
	my ($s, $e) = (-1, -1);
	if ($sp)
	{
		$s = 1 + int(rand($per_tx - 12));
		$e = $s + 4 + int(rand(7));
	}
	# the marker comes before change $m, outside a rolled-back savepoint
	my $m = 1 + int(rand($per_tx - 1));
	$m = $e if $sp eq 'rollback' && $m >= $s && $m < $e;
	my $marker_in_sp = $sp eq 'rollback' && rand() < 0.5;
	my @lines = (
		'\o /dev/null', 'BEGIN;',
		"SELECT count(*) FROM (SELECT id FROM versions WHERE id IN ($lock) ORDER BY id FOR UPDATE) l;");
	my $marker = sub {
		my ($gone) = @_;
		my $n = ++$change_no;
		push @lines,
		    "WITH m AS (SELECT outbox_emit('marker', jsonb_build_object('tx', $t, 'seq', $n)))"
		  . " INSERT INTO applog SELECT $n, $t, pg_current_xact_id()::text, NULL, 'marker', NULL,"
		  . " jsonb_build_object('tx', $t, 'seq', $n) FROM m;";
		if ($gone) { push @rolled_back, $n } else { $planned_markers++ }
	};
	for my $i (0 .. $per_tx)
	{
		push @lines, 'SAVEPOINT s;' if $i == $s;
		push @lines, $sp eq 'rollback' ? 'ROLLBACK TO SAVEPOINT s;' : 'RELEASE SAVEPOINT s;'
		  if $i == $e;
		$marker->($rollback) if $i == $m;
		$marker->(1) if $marker_in_sp && $i == $s + 1;
		last if $i == $per_tx;
		my $n = ++$change_no;
		my $want = rand() < 0.35 ? 'delete' : 'update';
		push @lines, "SELECT app_change($t, $n, $keys[$i], '$want');";
		if ($rollback || ($sp eq 'rollback' && $i >= $s && $i < $e))
		{
			push @rolled_back, $n;
		}
		else
		{
			$planned_changes++;
		}
	}
	push @lines, $rollback ? 'ROLLBACK;' : 'COMMIT;', '\o';
	$planned_tx++ unless $rollback;
	push @scripts, join("\n", @lines);
}
note "(a): $ntx transactions, $n_rollback rolled back, $n_sp_rollback with a savepoint rolled back, "
  . "$n_sp_release with one released; $planned_changes changes and $planned_markers markers to commit, "
  . scalar(@rolled_back) . " changes and markers rolled back";

my $t0 = time;
my @problems = run_concurrently($nsessions, \@scripts);
is_deeply([ @problems[ 0 .. ($#problems < 4 ? $#problems : 4) ] ], [],
	"(a) $nsessions sessions ran the $ntx transactions without an error");
note sprintf('(a) workload: %.1f s', time - $t0);

is( $node->safe_psql('postgres',
		q{SELECT count(*) FILTER (WHERE op <> 'marker') || '|' || count(*) FILTER (WHERE op = 'marker')
		         || '|' || count(DISTINCT tx) FROM applog}),
	"$planned_changes|$planned_markers|$planned_tx",
	'(a) the application log holds every committed change and marker, of every committed transaction');
my ($nins, $nupd, $ndel) = split /\|/, $node->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE op = 'insert') || '|' || count(*) FILTER (WHERE op = 'update')
	         || '|' || count(*) FILTER (WHERE op = 'delete') FROM applog});
note "(a) committed: $nins inserts, $nupd updates, $ndel deletes";
ok($nins > 1000 && $nupd > 1000 && $ndel > 1000, '(a) the workload has many of each kind of change');

is( $node->safe_psql('postgres',
		q{SELECT count(*) FILTER (WHERE topic = 'public.orders') || '|' || count(*) FILTER (WHERE topic = 'marker')
		         || '|' || count(*) FROM outbox.messages}),
	"$planned_changes|$planned_markers|" . ($planned_changes + $planned_markers),
	'(a) outbox.messages holds as many changes and markers as were committed, and nothing else');

# Every committed change once, by its change number: n for an insert or
# update (the note of the row written), the key and the deleted row's
# note for a delete (each row version is deleted once at most).
is( $node->safe_psql('postgres', q{
WITH m AS (
	SELECT CASE WHEN payload->>'op' = 'delete' THEN 'd' || key || '/' || (payload->'before'->>'note')
	            ELSE 'c' || (payload->'after'->>'note') END AS change, count(*) AS c
	  FROM outbox.messages WHERE topic = 'public.orders' GROUP BY 1),
l AS (
	SELECT CASE WHEN op = 'delete' THEN 'd' || id || '/' || (payload->'before'->>'note')
	            ELSE 'c' || n END AS change
	  FROM applog WHERE op <> 'marker')
SELECT count(*) FILTER (WHERE m.c = 1 AND l.change IS NOT NULL) || '|'
       || count(*) FILTER (WHERE m.c > 1) || '|'
       || count(*) FILTER (WHERE m.change IS NULL) || '|' || count(*) FILTER (WHERE l.change IS NULL)
  FROM m FULL JOIN l USING (change)}),
	"$planned_changes|0|0|0",
	'(a) every committed change is captured exactly once (counted by change number): none twice, none missing, none extra');

# The whole message: topic, key, payload as the application saw the row
# before and after, the transaction's xid.
is( $node->safe_psql('postgres', q{
WITH m AS (SELECT headers->>'source-xid' AS xid, key, payload FROM outbox.messages WHERE topic = 'public.orders'),
l AS (SELECT xid, id::text AS key, payload FROM applog WHERE op <> 'marker')
SELECT (SELECT count(*) FROM l WHERE NOT EXISTS
          (SELECT 1 FROM m WHERE m.xid = l.xid AND m.key = l.key AND m.payload = l.payload)) || '|'
       || (SELECT count(*) FROM m WHERE NOT EXISTS
          (SELECT 1 FROM l WHERE m.xid = l.xid AND m.key = l.key AND m.payload = l.payload))}),
	'0|0',
	'(a) each message has the key, the {"op", "before", "after"} payload and the source-xid of its change');
is( $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM applog l WHERE op = 'marker' AND NOT EXISTS
          (SELECT 1 FROM outbox.messages m WHERE m.topic = 'marker' AND m.payload = l.payload)) || '|'
       || (SELECT count(*) FROM (SELECT payload FROM outbox.messages WHERE topic = 'marker'
                                  GROUP BY payload HAVING count(*) > 1) d)}),
	'0|0', '(a) every committed marker is there once');

my $rb = '{' . join(',', @rolled_back) . '}';
is( $node->safe_psql('postgres', qq{
SELECT (SELECT count(*) FROM applog WHERE n = ANY('$rb')) || '|'
       || (SELECT count(*) FROM outbox.messages
            WHERE (topic = 'public.orders' AND (payload->'after'->>'note')::int = ANY('$rb'))
               OR (topic = 'marker' AND (payload->>'seq')::int = ANY('$rb')))}),
	'0|0',
	'(a) nothing of a rolled-back transaction or savepoint is captured (' . scalar(@rolled_back)
	  . ' changes and markers)');

# Per transaction: its messages (changes by source-xid, the marker by its
# tx) at contiguous ids, in the order of its statements (change numbers).
my $per_tx_sql = q{
WITH tx AS (SELECT DISTINCT tx, xid FROM applog),
m AS (
	SELECT m.id, coalesce(m.key, '') AS key, m.payload,
	       CASE WHEN m.topic = 'marker' THEN (m.payload->>'tx')::int ELSE tx.tx END AS tx
	  FROM outbox.messages m
	  LEFT JOIN tx ON m.topic = 'public.orders' AND tx.xid = m.headers->>'source-xid'
	 WHERE m.topic IN ('public.orders', 'marker')),
mm AS (SELECT tx, count(*) AS c, max(id) - min(id) + 1 AS span,
              string_agg(key || ' ' || payload::text, ' | ' ORDER BY id) AS s
         FROM m GROUP BY tx),
ll AS (SELECT tx, count(*) AS c, string_agg(coalesce(id::text, '') || ' ' || payload::text, ' | ' ORDER BY n) AS s
         FROM applog GROUP BY tx)
};
is( $node->safe_psql('postgres', $per_tx_sql . q{
SELECT count(*) FILTER (WHERE mm.c = ll.c AND mm.span = mm.c AND mm.s = ll.s) || '|'
       || count(*) FILTER (WHERE mm.tx IS NULL OR ll.tx IS NULL) || '|' || count(*)
  FROM mm FULL JOIN ll ON mm.tx = ll.tx}),
	"$planned_tx|0|$planned_tx",
	'(a) per transaction, the captured changes and its outbox_emit() marker are at contiguous ids, in statement order');
if (my $bad = $node->safe_psql('postgres', $per_tx_sql . q{
SELECT 'tx ' || ll.tx || ': ' || mm.c || ' messages over ' || mm.span || ' ids; ' || ll.c || ' logged'
  FROM mm JOIN ll ON mm.tx = ll.tx WHERE NOT (mm.c = ll.c AND mm.span = mm.c AND mm.s = ll.s) LIMIT 3}))
{
	diag $bad;
}

# Per key: the changes in message id order are those of the log in version
# order, which is commit order (and statement order inside a transaction).
my $nkeys_logged = $node->safe_psql('postgres', q{SELECT count(DISTINCT id) FROM applog WHERE op <> 'marker'});
is( $node->safe_psql('postgres', q{
WITH mk AS (SELECT key, string_agg(payload::text, ' | ' ORDER BY id) AS s
              FROM outbox.messages WHERE topic = 'public.orders' GROUP BY key),
lk AS (SELECT id::text AS key, string_agg(payload::text, ' | ' ORDER BY v) AS s
         FROM applog WHERE op <> 'marker' GROUP BY id)
SELECT count(*) FILTER (WHERE mk.s = lk.s) || '|' || count(*) FROM mk FULL JOIN lk ON mk.key = lk.key}),
	"$nkeys_logged|$nkeys_logged",
	"(a) per key ($nkeys_logged keys), the captured changes are in commit order");

is( $node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE headers->>'source-table' = 'public.orders'
                          AND headers->>'source-commit-time' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$'
                          AND headers->>'source-commit-time' NOT LIKE '0000-%'
                          AND (SELECT count(*) FROM jsonb_object_keys(headers)) = 3)
       || '|' || count(*)
  FROM outbox.messages WHERE topic = 'public.orders'}),
	"$planned_changes|$planned_changes",
	'(a) every change has the headers source-table, source-xid and a filled-in source-commit-time');
is( $node->safe_psql('postgres', q{
SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox.messages WHERE topic = 'public.orders'
                               GROUP BY headers->>'source-xid'
                               HAVING count(DISTINCT headers->>'source-commit-time') > 1) x) || '|'
       || (SELECT count(*) FROM (
             SELECT (headers->>'source-commit-time')::timestamptz AS ct,
                    lag((headers->>'source-commit-time')::timestamptz) OVER (PARTITION BY key ORDER BY id) AS prev
               FROM outbox.messages WHERE topic = 'public.orders') x WHERE ct < prev)}),
	'0|0',
	'(a) one source-commit-time per transaction, not decreasing along the changes of a key');
note sprintf('(a) done at %.1f s', time - $t_start);

# ---------------------------------------------------------------------------
# (b) delivery of the captured changes to an HTTP target
# ---------------------------------------------------------------------------
ok($node->poll_query_until('postgres', "SELECT pending = 0 FROM outbox.lag WHERE target = 'cap'"),
	'(b) the target cap has nothing pending');
is($node->safe_psql('postgres', "SELECT delivered || '|' || dead_letters FROM outbox.lag WHERE target = 'cap'"),
	"$planned_changes|0", "(b) ... it got all $planned_changes captured changes, no dead letter (outbox.lag)");

# One line per delivered envelope: rseq, status, seq, key, op, the note of
# the row (after, or before for a delete), source-xid, topic.
my $extract = <<'EOPY';
import json, sys
for line in open(sys.argv[1], encoding='utf-8'):
    if not line.endswith('\n'):
        break
    r = json.loads(line)
    if r['path'] != '/cap':
        continue
    st = -1 if r['status'] is None else r['status']
    for e in json.loads(r['body']):
        p = e['payload']
        row = p['after'] if p['after'] is not None else p['before']
        print('\t'.join(map(str, (r['seq'], st, e['seq'], e['key'], p['op'], row['note'],
                                  e['headers']['source-xid'], e['topic']))))
EOPY
my @att;
{
	open(my $fh, '-|', 'python3', '-c', $extract, $sink->{record}) or die "python3: $!";
	while (my $line = <$fh>)
	{
		chomp $line;
		my %e;
		@e{qw(rseq status seq key op note xid topic)} = split /\t/, $line;
		push @att, \%e;
	}
	close $fh or die 'record extraction failed';
}
my (%expected, %want);
for (split /\n/, $node->safe_psql('postgres', q{
SELECT id, key, payload->>'op',
       CASE WHEN payload->>'op' = 'delete' THEN payload->'before' ELSE payload->'after' END->>'note',
       headers->>'source-xid', topic
  FROM outbox.messages WHERE topic = 'public.orders' ORDER BY id}))
{
	my ($id, @rest) = split /\|/;
	push @{ $expected{ $rest[0] } }, $id;
	$want{$id} = join("\t", @rest);
}
my @ok = grep { $_->{status} >= 200 && $_->{status} < 300 } @att;
my %got;
$got{ $_->{seq} }++ for @ok;
is( scalar(grep { !$got{$_} } keys %want) . '|' . scalar(grep { $_ > 1 } values %got) . '|'
	  . scalar(grep { !exists $want{$_} } keys %got),
	'0|0|0', '(b) the receiver got every captured change once, and nothing else');
is(scalar(grep { $want{ $_->{seq} } ne join("\t", @$_{qw(key op note xid topic)}) } @ok), 0,
	'(b) ... each with its key, topic, op, row and source-xid');
my @fifo = check_key_fifo(\@att, \%expected);
is_deeply(\@fifo, [], '(b) per key, the receiver got the changes in order (I4)');
note sprintf('(b) done at %.1f s', time - $t_start);

# ---------------------------------------------------------------------------
# (d) session_replication_role = replica
# ---------------------------------------------------------------------------
# Expected: the capture triggers are ordinary (origin-enabled) triggers, so
# in a session with session_replication_role = replica (what logical
# replication's apply workers run with, and loaders that mean to skip
# triggers set) changes are NOT captured: a subscriber applying changes
# captured at the publisher does not emit them again.  Whoever wants them captured there
# too enables the trigger ALWAYS; outbox.captures then says 'always'.
$node->safe_psql('postgres', q{
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric);
SELECT outbox.capture('accounts');
});
my $acc = q{SELECT coalesce(string_agg(key || ':' || (payload->>'op'), ',' ORDER BY id), '')
              FROM outbox.messages WHERE topic = 'public.accounts'};
$node->safe_psql('postgres', q{
SET session_replication_role = replica;
INSERT INTO accounts VALUES (1, 10), (2, 20);
UPDATE accounts SET balance = 11 WHERE id = 1;
DELETE FROM accounts WHERE id = 2;
TRUNCATE accounts;
INSERT INTO accounts VALUES (3, 30);
});
is($node->safe_psql('postgres', $acc), '',
	'(d) session_replication_role = replica: changes are not captured (the trigger is not ALWAYS)');
$node->safe_psql('postgres', q{INSERT INTO accounts VALUES (4, 40)});
is($node->safe_psql('postgres', $acc), '4:insert', '(d) ... in the default role (origin) they are');

$node->safe_psql('postgres', q{ALTER TABLE accounts ENABLE ALWAYS TRIGGER outbox_capture});
is($node->safe_psql('postgres', q{SELECT state FROM outbox.captures WHERE table_name = 'accounts'::regclass}),
	'capturing', "(d) ENABLE ALWAYS of the row trigger only: not 'always' (the TRUNCATE trigger is not)");
$node->safe_psql('postgres', q{ALTER TABLE accounts ENABLE ALWAYS TRIGGER outbox_capture_truncate});
is($node->safe_psql('postgres', q{SELECT state FROM outbox.captures WHERE table_name = 'accounts'::regclass}),
	'always', "(d) after ENABLE ALWAYS of both triggers, outbox.captures shows state 'always'");
$node->safe_psql('postgres', q{
SET session_replication_role = replica;
BEGIN;
INSERT INTO accounts VALUES (5, 50);
UPDATE accounts SET balance = 31 WHERE id = 3;
DELETE FROM accounts WHERE id = 4;
COMMIT;
});
$node->safe_psql('postgres', q{UPDATE accounts SET balance = 51 WHERE id = 5});
is($node->safe_psql('postgres', $acc), '4:insert,5:insert,3:update,4:delete,5:update',
	'(d) ... changes are captured in the replica role, in order, and still in the origin role');
# TRUNCATE has a trigger of its own, outbox_capture_truncate.
$node->safe_psql('postgres', q{ALTER TABLE accounts ENABLE ALWAYS TRIGGER outbox_capture_truncate});
$node->safe_psql('postgres', q{SET session_replication_role = replica; TRUNCATE accounts;});
is( $node->safe_psql('postgres',
		q{SELECT count(*) || '|' || bool_and(key IS NULL) FROM outbox.messages
		   WHERE topic = 'public.accounts' AND payload->>'op' = 'truncate'}),
	'1|true', '(d) with outbox_capture_truncate ALWAYS too, a TRUNCATE in the replica role is captured');

$node->safe_psql('postgres', q{ALTER TABLE accounts ENABLE REPLICA TRIGGER outbox_capture;
ALTER TABLE accounts ENABLE REPLICA TRIGGER outbox_capture_truncate});
is($node->safe_psql('postgres', q{SELECT state FROM outbox.captures WHERE table_name = 'accounts'::regclass}),
	'replica only', "(d) ENABLE REPLICA TRIGGER: state 'replica only'");
$node->safe_psql('postgres', q{INSERT INTO accounts VALUES (6, 60)});
$node->safe_psql('postgres', q{SET session_replication_role = replica; INSERT INTO accounts VALUES (7, 70)});
is( $node->safe_psql('postgres',
		q{SELECT string_agg(key, ',' ORDER BY id) FROM outbox.messages
		   WHERE topic = 'public.accounts' AND payload->>'op' = 'insert' AND key::int >= 6}),
	'7', '(d) ... then only changes in the replica role are captured');
note sprintf('(d) done at %.1f s', time - $t_start);

# ---------------------------------------------------------------------------
# (e) a partitioned table, concurrent writers in both partitions
# ---------------------------------------------------------------------------
my $eparts = 20;	# ids per partition
$node->safe_psql('postgres', qq{
CREATE TABLE events (id int, region text, n int NOT NULL, PRIMARY KEY (id, region))
	PARTITION BY LIST (region);
CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu');
CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us');
SELECT outbox.capture('events');
INSERT INTO events SELECT g, r, 0 FROM generate_series(1, $eparts) g, (VALUES ('eu'), ('us')) v(r);
INSERT INTO events VALUES ($eparts + 1, 'eu', 0);
});
# 160 transactions of 6 updates, each of a random key of either partition,
# in (region, id) order, through the parent or the partition itself; a
# row's n counts its updates, so per key the captured n must be 0, 1, 2,
# ... in message id order.
my @escripts;
my $eupdates = 0;
for my $t (1 .. 160)
{
	my @k = sort { $a->[1] cmp $b->[1] || $a->[0] <=> $b->[0] }
	  map { [ 1 + int(rand($eparts)), rand() < 0.5 ? 'eu' : 'us' ] } 1 .. 6;
	push @escripts,
	  join("\n", '\o /dev/null', 'BEGIN;',
		(map {
				rand() < 0.5
				  ? "UPDATE events SET n = n + 1 WHERE id = $_->[0] AND region = '$_->[1]';"
				  : "UPDATE events_$_->[1] SET n = n + 1 WHERE id = $_->[0];"
		} @k),
		'COMMIT;', '\o');
	$eupdates += @k;
}
$t0 = time;
@problems = run_concurrently($nsessions, \@escripts);
is_deeply([ @problems[ 0 .. ($#problems < 4 ? $#problems : 4) ] ], [],
	"(e) $nsessions sessions updated both partitions without an error");
note sprintf('(e) workload: %.1f s', time - $t0);
# A row moved to the other partition: a delete and an insert.
$node->safe_psql('postgres', qq{UPDATE events SET region = 'us' WHERE id = $eparts + 1});

my $ninserts = 2 * $eparts + 1;
my $etotal = $ninserts + $eupdates + 2;
is( $node->safe_psql('postgres', q{
SELECT count(*) || '|' || count(*) FILTER (WHERE headers->>'source-table' = 'public.events') || '|'
       || (count(*) FILTER (WHERE key LIKE '%"eu"]') > 100 AND count(*) FILTER (WHERE key LIKE '%"us"]') > 100)
  FROM outbox.messages WHERE topic = 'public.events'}),
	"$etotal|$etotal|true",
	"(e) all $etotal changes of both partitions are captured on the parent's topic public.events, source-table public.events");
my $moved = $eparts + 1;
is( $node->safe_psql('postgres', qq{
SELECT count(*) FILTER (WHERE ns = (SELECT string_agg(g::text, ',' ORDER BY g) FROM generate_series(0, c - 1) g))
       || '|' || count(*)
  FROM (SELECT key, string_agg(payload->'after'->>'n', ',' ORDER BY id) AS ns, count(*) AS c
          FROM outbox.messages WHERE topic = 'public.events' AND payload->>'op' IN ('insert', 'update')
           AND key <> '[$moved,"us"]'
         GROUP BY key) x}),
	(2 * $eparts + 1) . '|' . (2 * $eparts + 1),
	'(e) per key, the changes are in commit order (n = 0, 1, 2, ... in id order)');
is( $node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE c = 6 AND span = 6) || '|' || count(*)
  FROM (SELECT count(*) AS c, max(id) - min(id) + 1 AS span FROM outbox.messages
         WHERE topic = 'public.events' AND payload->>'op' = 'update'
         GROUP BY headers->>'source-xid') x}),
	'160|160', '(e) each transaction\'s 6 updates are at contiguous ids');
is( $node->safe_psql('postgres', q{
SELECT string_agg(key || ' ' || (payload->>'op') || ' ' || coalesce(payload->'before'->>'region', '-')
                  || '>' || coalesce(payload->'after'->>'region', '-'), ', ' ORDER BY id)
  FROM (SELECT * FROM outbox.messages WHERE topic = 'public.events' ORDER BY id DESC LIMIT 2) x}),
	qq{[$moved,"eu"] delete eu>-, [$moved,"us"] insert ->us},
	'(e) a row moved to the other partition is a delete and an insert, on the parent\'s topic');
note sprintf('(e) done at %.1f s', time - $t_start);

relay_no_crash($node);
$node->stop;

# ---------------------------------------------------------------------------
# (c) pg_dump and pg_restore of a database with a captured table
# ---------------------------------------------------------------------------
# On its own server, whose outbox.database, app, is dropped and created
# again.  No restart is needed: the launcher waits for app to come back
# and starts the relay in it.
SKIP:
{
	skip "(c) $dump_skip", 10 if $dump_skip;

	my $dn = relay_node('capture_dump', create_extension => 0, conf => "outbox.database = 'app'\n");
	$dn->safe_psql('postgres', 'CREATE DATABASE app');
	$dn->safe_psql('app', q{
CREATE EXTENSION outbox;
CREATE TABLE orders (id int PRIMARY KEY, customer text, total numeric, note text);
INSERT INTO orders VALUES (1, 'ann', 10, 'before capture');
SELECT outbox.capture('orders', topic => 'shop.orders');
INSERT INTO orders VALUES (2, 'bob', 20, 'captured'), (3, 'cy', 30, 'captured');
UPDATE orders SET total = 11 WHERE id = 1;
});
	my $msgs = q{SELECT count(*) || ' ' || coalesce(string_agg(id || ':' || key || ':' || (payload->>'op'), ',' ORDER BY id), '')
	               FROM outbox.messages};
	my $before = $dn->safe_psql('app', $msgs);
	like($before, qr/^3 \d+:2:insert,\d+:3:insert,\d+:1:update$/, '(c) source: three changes captured');
	my $max_id = $dn->safe_psql('app', 'SELECT max(id) FROM outbox.messages');

	my $dump = "$PostgreSQL::Test::Utils::tmp_check/capture_app.dump";
	command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $dn->connstr('app') ], '(c) pg_dump -Fc of app');
	# FORCE: the relay is connected to app; the launcher waits for app to
	# come back.
	$dn->safe_psql('postgres', 'DROP DATABASE app WITH (FORCE)');
	$dn->safe_psql('postgres', 'CREATE DATABASE app');
	command_ok([ 'pg_restore', '--exit-on-error', '-d', $dn->connstr('app'), $dump ],
		'(c) pg_restore into app created again');

	is($dn->safe_psql('app', $msgs), $before,
		'(c) the restore loaded the 3 rows of orders and emitted nothing for them: outbox.messages is as dumped');
	is($dn->safe_psql('app', q{SELECT count(*) FROM orders}), '3', '(c) ... orders has its rows');
	is( $dn->safe_psql('app',
			q{SELECT table_name || '|' || mode || '|' || topic || '|' || state FROM outbox.captures}),
		'orders|trigger|shop.orders|capturing', '(c) outbox.captures lists the restored table');
	is( $dn->safe_psql('app',
			q{SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger
			   WHERE tgrelid = 'orders'::regclass}),
		'outbox_capture:O,outbox_capture_truncate:O', '(c) ... with its two triggers');

	$dn->safe_psql('app', q{
INSERT INTO orders VALUES (4, 'di', 40, 'after restore');
UPDATE orders SET total = 21 WHERE id = 2;
});
	is( $dn->safe_psql('app', qq{
SELECT string_agg(topic || ' ' || key || ' ' || (payload->>'op') || ' ' || coalesce(payload->'before'->>'total', '-')
                  || '>' || (payload->'after'->>'total') || ' ' || (headers->>'source-table'), ', ' ORDER BY id)
  FROM outbox.messages WHERE id > $max_id}),
		'shop.orders 4 insert ->40 public.orders, shop.orders 2 update 20>21 public.orders',
		'(c) after the restore, an INSERT and an UPDATE are captured, above every id before the dump');
	ok( $dn->poll_query_until('app',
			q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'app'}),
		'(c) the relay runs in the restored database');
	relay_no_crash($dn);
	$dn->stop;
}
stop_sink($sink);
note sprintf('total %.1f s', time - $t_start);
done_testing();
