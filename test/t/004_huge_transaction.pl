# A transaction that emits a million messages: backend memory stays
# bounded (the buffer spills to a temporary file), and at commit every
# message is stored, at contiguous ids, in emit order (I1, I2).
#
# Also: a savepoint rolled back after the buffer spilled drops exactly its
# own messages, from the file and from memory.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $n = 1_000_000;

my $node = outbox_node('huge', conf => "log_temp_files = 0\n");

# Some messages before, so ids do not simply start at 1.
$node->safe_psql('postgres',
	q{SELECT outbox_emit('small', '{}') FROM generate_series(1, 3)});

my $log_offset = -s $node->logfile;
my ($ret, $out, $err) = $node->psql(
	'postgres', qq{
BEGIN;
SELECT count(outbox_emit('big', jsonb_build_object('i', g), g::text))
  FROM generate_series(1, $n) g;
SELECT coalesce(sum(total_bytes), 0) FROM pg_backend_memory_contexts
 WHERE name = 'outbox emit buffer';
SELECT count(*) FROM outbox.messages WHERE topic = 'big';
COMMIT;
});
is($ret, 0, 'a transaction emitting a million messages commits') or diag($err);
my ($emitted, $buffer_bytes, $visible_before) = split /\n/, $out;
is($emitted, $n, 'every outbox_emit call returned');
note "outbox emit buffer: $buffer_bytes bytes";
cmp_ok($buffer_bytes, '>', 0, 'the emit buffer memory context exists');
cmp_ok($buffer_bytes, '<', 32 * 1024 * 1024,
	'the emit buffer stays under 32 MB for a million messages');
is($visible_before, '0', 'nothing is stored before COMMIT');
is($err, '', 'no warning or error while committing');

my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/LOG:  temporary file: path "[^"]+", size \d+/,
	'the emit buffer spilled to a temporary file');

my ($count, $span, $first) = split /\|/, $node->safe_psql('postgres',
	q{SELECT count(*), max(id) - min(id) + 1, min(id) FROM outbox.messages WHERE topic = 'big'});
is($count, $n, 'a million messages are stored');
is($span, $n, 'their ids are contiguous');
cmp_ok($first, '>', $node->safe_psql('postgres',
		q{SELECT max(id) FROM outbox.messages WHERE topic = 'small'}),
	'they follow the messages committed before');
is( $node->safe_psql(
		'postgres', qq{
	SELECT count(*) FROM outbox.messages
	 WHERE topic = 'big'
	   AND ((payload->>'i')::bigint <> id - $first + 1
	        OR key <> (payload->>'i'))}),
	'0',
	'ids follow emit order, and every message kept its key');
is($node->safe_psql('postgres',
		q{SELECT count(DISTINCT msg_id) FROM outbox.messages WHERE topic = 'big'}),
	$n, 'every message has its own msg_id');

# --- a savepoint rolled back after the buffer spilled ---
# 'keep' is buffered, then the savepoint's 'drop' messages push it all into
# the spill file, then the savepoint is rolled back and 'keep2' follows.
$log_offset = -s $node->logfile;
($ret, $out, $err) = $node->psql(
	'postgres', q{
BEGIN;
SELECT count(outbox_emit('keep', jsonb_build_object('i', g))) FROM generate_series(1, 10) g;
SAVEPOINT s;
SELECT count(outbox_emit('drop', jsonb_build_object('i', g, 'pad', repeat('x', 100))))
  FROM generate_series(1, 100000) g;
ROLLBACK TO SAVEPOINT s;
SELECT count(outbox_emit('keep2', jsonb_build_object('i', g))) FROM generate_series(11, 20) g;
COMMIT;
});
is($ret, 0, 'transaction with a spilled, rolled-back savepoint commits')
  or diag($err);
is($err, '', 'no warning or error from it');
like(
	slurp_file($node->logfile, $log_offset),
	qr/temporary file: path/,
	'the rolled-back savepoint had spilled to a temporary file');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FILTER (WHERE topic = 'drop'),
	       count(*) FILTER (WHERE topic <> 'drop'),
	       max(id) FILTER (WHERE topic <> 'drop') - min(id) FILTER (WHERE topic <> 'drop') + 1,
	       bool_and((payload->>'i')::bigint = id - k.first + 1) FILTER (WHERE topic <> 'drop')
	  FROM outbox.messages,
	       (SELECT min(id) AS first FROM outbox.messages WHERE topic = 'keep') k
	 WHERE topic IN ('keep', 'keep2', 'drop')}),
	'0|20|20|t',
	'only the messages outside the savepoint are stored, contiguous, in emit order');

# All of a spilled transaction rolled back to a savepoint: nothing is stored,
# and the spill file is cleaned up without complaint.
my $max_before = $node->safe_psql('postgres', 'SELECT max(id) FROM outbox.messages');
($ret, $out, $err) = $node->psql(
	'postgres', q{
BEGIN;
SAVEPOINT s;
SELECT count(outbox_emit('drop', jsonb_build_object('i', g, 'pad', repeat('x', 100))))
  FROM generate_series(1, 100000) g;
ROLLBACK TO SAVEPOINT s;
COMMIT;
});
is($ret, 0, 'transaction whose spilled messages were all rolled back commits')
  or diag($err);
is($err, '', 'no warning (such as a temporary file leak) from it');
is($node->safe_psql('postgres', 'SELECT max(id) FROM outbox.messages'),
	$max_before, 'it stored nothing');

# A spilled transaction that rolls back entirely stores nothing.
($ret, $out, $err) = $node->psql(
	'postgres', q{
BEGIN;
SELECT count(outbox_emit('drop', jsonb_build_object('i', g, 'pad', repeat('x', 100))))
  FROM generate_series(1, 100000) g;
ROLLBACK;
});
is($ret, 0, 'a spilled transaction rolls back') or diag($err);
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE topic = 'drop'}),
	'0', 'and stores nothing');

$node->stop;
done_testing();
