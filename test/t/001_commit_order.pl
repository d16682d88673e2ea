# Invariant I2, commit order: message ids increase in commit order, so a
# transaction that waited on another's row lock gets higher ids than every id
# of the one it waited for; inside one transaction ids are contiguous and
# follow emit order.
#
# Eight pgbench clients run transactions on four keys.  Each transaction
# emits one to three messages marked with its txid, pauses a random moment,
# then increments the counter row of its key (the row lock makes same-key
# transactions queue behind each other) and records (txid, key, new value)
# in a side table.  Afterwards, per key, the counter values must strictly
# increase in message id order.
#
# The same workload against a hand-rolled outbox (a bigserial id assigned at
# INSERT time) must show at least one inversion, which proves the workload
# really produces the interleavings the check is about.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

# A fixed amount of work, not a time: a slow machine runs the same
# transactions, only for longer.
my $clients = 8;
my $per_client = 150;	# transactions of each client: 1200 a workload

my $node = outbox_node('commit_order', conf => "max_connections = 40\n");

$node->safe_psql(
	'postgres', q{
CREATE TABLE counters (k int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO counters SELECT k, 0 FROM generate_series(1, 4) k;
CREATE TABLE side (marker bigint PRIMARY KEY, k int NOT NULL, v bigint NOT NULL,
                   n int NOT NULL);

-- The baseline: an outbox table whose id is taken when the row is inserted.
CREATE TABLE naive_counters (k int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO naive_counters SELECT k, 0 FROM generate_series(1, 4) k;
CREATE TABLE naive_side (marker bigint PRIMARY KEY, k int NOT NULL, v bigint NOT NULL,
                         n int NOT NULL);
CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, topic text NOT NULL,
                           key text, payload jsonb NOT NULL);
});

# Both scripts are the same transaction; only the way the message is
# recorded differs.  The pause between emitting and taking the row lock
# widens the window in which a transaction that emitted first can be
# overtaken at the row lock by one that emitted later.
my $outbox_script = q{
\set k random(1, 4)
\set n random(1, 3)
BEGIN;
SELECT count(outbox_emit('order', jsonb_build_object('m', txid_current(), 's', g), :k::text))
  FROM generate_series(1, :n) g;
SELECT pg_sleep(random() * 0.003);
UPDATE counters SET v = v + 1 WHERE k = :k RETURNING v \gset
INSERT INTO side VALUES (txid_current(), :k, :v, :n);
COMMIT;
};

my $naive_script = q{
\set k random(1, 4)
\set n random(1, 3)
BEGIN;
INSERT INTO naive_outbox (topic, key, payload)
  SELECT 'order', :k::text, jsonb_build_object('m', txid_current(), 's', g)
  FROM generate_series(1, :n) g;
SELECT pg_sleep(random() * 0.003);
UPDATE naive_counters SET v = v + 1 WHERE k = :k RETURNING v \gset
INSERT INTO naive_side VALUES (txid_current(), :k, :v, :n);
COMMIT;
};

$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$per_client",
	0,
	[qr{processed: [1-9]}, qr{number of failed transactions: 0 }],
	[qr{^$}],
	'outbox workload runs without errors',
	{ '001_outbox' => $outbox_script });

$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$per_client",
	0,
	[qr{processed: [1-9]}, qr{number of failed transactions: 0 }],
	[qr{^$}],
	'hand-rolled outbox workload runs without errors',
	{ '001_naive' => $naive_script });

# One row per transaction of a workload: its key, counter value and the
# first, last and number of message ids, plus whether its messages are in
# emit order ('s' 1..n at consecutive ids).
sub per_txn_sql
{
	my ($messages, $side) = @_;
	return qq{
	SELECT s.marker, s.k, s.v, s.n,
	       min(m.id) AS first_id, max(m.id) AS last_id, count(m.id) AS cnt,
	       bool_and((m.payload->>'s')::bigint = m.id - mn.first + 1) AS in_order,
	       bool_and(m.key = s.k::text) AS key_ok
	  FROM $side s
	  JOIN $messages m ON (m.payload->>'m')::bigint = s.marker
	  JOIN (SELECT (payload->>'m')::bigint AS marker, min(id) AS first
	          FROM $messages GROUP BY 1) mn ON mn.marker = s.marker
	 GROUP BY s.marker, s.k, s.v, s.n};
}

# Pairs of same-key transactions, adjacent in id order: how many have
# counter values (their order at the row lock) that disagree with their id
# order, and how many have interleaved id ranges.
sub inversions_sql
{
	my ($messages, $side) = @_;
	my $per_txn = per_txn_sql($messages, $side);
	return qq{
	WITH t AS ($per_txn),
	     o AS (SELECT k, v, first_id, last_id,
	                  lag(v) OVER w AS prev_v, lag(last_id) OVER w AS prev_last
	             FROM t WINDOW w AS (PARTITION BY k ORDER BY first_id))
	SELECT count(*) FILTER (WHERE v <= prev_v),
	       count(*) FILTER (WHERE first_id <= prev_last)
	  FROM o};
}

# --- the outbox ---
my ($txns, $msgs, $sum_n) = split /\|/, $node->safe_psql('postgres',
	q{SELECT (SELECT count(*) FROM side), (SELECT count(*) FROM outbox.messages),
	         (SELECT sum(n) FROM side)});
note "outbox workload: $txns transactions, $msgs messages";
is($txns, $clients * $per_client, 'outbox workload committed every transaction');
is($msgs, $sum_n,
	'every message of every committed transaction exists, and no other');

my $per_txn = per_txn_sql('outbox.messages', 'side');
is( $node->safe_psql(
		'postgres', qq{
	WITH t AS ($per_txn)
	SELECT count(*) FILTER (WHERE cnt = n),
	       count(*) FILTER (WHERE last_id - first_id + 1 = n),
	       count(*) FILTER (WHERE in_order),
	       count(*) FILTER (WHERE key_ok)
	  FROM t}),
	"$txns|$txns|$txns|$txns",
	'each transaction has all its messages, at contiguous ids, in emit order, with its key'
);

my ($inv, $overlap) = split /\|/,
  $node->safe_psql('postgres', inversions_sql('outbox.messages', 'side'));
is($inv, '0', 'per key, counter values strictly increase in message id order');
is($overlap, '0',
	'per key, all ids of a transaction are below all ids of the next one');

# A counter value is taken once per key: no two transactions share one.
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM (SELECT k, v FROM side GROUP BY k, v HAVING count(*) > 1) d}
	),
	'0',
	'counter values are unique per key');

# --- the hand-rolled baseline ---
# With a bigserial, the id is taken when the row is inserted.  Transaction
# A inserts (id 10) and pauses; B inserts (id 11), reaches the row lock
# first, increments the counter to 5 and commits; A then gets 6.  A relay
# reading in id order delivers A's "6" before B's "5": the id order is
# insert order, not commit order.  The outbox reserves ids at commit, so
# the same interleaving gives B the lower ids.
my ($naive_txns, $naive_msgs) = split /\|/, $node->safe_psql('postgres',
	q{SELECT (SELECT count(*) FROM naive_side), (SELECT count(*) FROM naive_outbox)});
note "hand-rolled workload: $naive_txns transactions, $naive_msgs messages";
is($naive_txns, $clients * $per_client,
	'hand-rolled workload committed every transaction');
my ($naive_inversions) = split /\|/,
  $node->safe_psql('postgres', inversions_sql('naive_outbox', 'naive_side'));
note "hand-rolled outbox: $naive_inversions inversions";
cmp_ok($naive_inversions, '>', 0,
	'the same workload on a bigserial outbox shows commit-order inversions');

$node->stop;
done_testing();
