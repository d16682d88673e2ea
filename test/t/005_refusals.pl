# What outbox_emit() and outbox.frontier() refuse, at the call (or at
# PREPARE TRANSACTION), with a clear error, leaving nothing behind:
#  (a) a server that did not preload the library;
#  (b) a streaming standby, and a read-only transaction;
#  (c) PREPARE TRANSACTION after an emit;
#  (d) a database other than outbox.database.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

# Run $sql with verbose errors; return (exit code, stdout, stderr).
sub psql_verbose
{
	my ($node, $db, $sql) = @_;
	return $node->psql($db, "\\set VERBOSITY verbose\n$sql");
}

# --- (a) not preloaded ---
my $plain = PostgreSQL::Test::Cluster->new('not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION outbox');
pass('CREATE EXTENSION works without shared_preload_libraries');

my ($ret, $out, $err) =
  psql_verbose($plain, 'postgres', q{SELECT outbox_emit('t', '{}')});
isnt($ret, 0, 'outbox_emit fails without preloading');
like($err, qr/ERROR:  55000: outbox_emit\(\) requires the outbox library to be preloaded/,
	'... with SQLSTATE 55000 and a message saying it must be preloaded');
like($err, qr/HINT:  .*shared_preload_libraries/, '... and a hint naming the setting');

($ret, $out, $err) =
  psql_verbose($plain, 'postgres', 'SELECT outbox.frontier()');
isnt($ret, 0, 'outbox.frontier fails without preloading');
like($err, qr/ERROR:  55000: .*preloaded/, '... with SQLSTATE 55000');

# Also when the call comes after the library was loaded by an earlier call.
($ret, $out, $err) = psql_verbose($plain, 'postgres',
	q{LOAD 'outbox';
BEGIN;
SELECT outbox_emit('t', '{}');
COMMIT;});
like($err, qr/55000: .*preloaded/, 'outbox_emit still fails after LOAD');
is($plain->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	'0', 'nothing was stored');
$plain->stop;

# --- the primary, preloaded ---
my $primary = outbox_node(
	'primary',
	init => { allows_streaming => 1 },
	conf => "max_prepared_transactions = 5\n");
$primary->safe_psql('postgres', 'CREATE TABLE t (a int)');
my $first_uuid =
  $primary->safe_psql('postgres', q{SELECT outbox_emit('primary', '{"n": 1}')});
like($first_uuid, qr/^[0-9a-f-]{36}$/, 'outbox_emit works on the primary');

# --- (b) read-only transactions and a standby ---
($ret, $out, $err) = psql_verbose($primary, 'postgres',
	q{BEGIN READ ONLY; SELECT outbox_emit('t', '{}'); COMMIT;});
like($err, qr/ERROR:  25006: cannot call outbox_emit\(\) in a read-only transaction/,
	'outbox_emit is refused in a read-only transaction (SQLSTATE 25006)');
($ret, $out, $err) = psql_verbose($primary, 'postgres',
	q{SET default_transaction_read_only = on; SELECT outbox_emit('t', '{}');});
like($err, qr/read-only transaction/,
	'outbox_emit is refused with default_transaction_read_only');

my $standby = cold_standby($primary, 'standby');
$standby->start;
# Emitted on the primary while the standby follows.
$primary->safe_psql('postgres', q{SELECT outbox_emit('primary', '{"n": 2}')});
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE topic = 'primary'}),
	'2', 'the standby sees the messages committed on the primary');

($ret, $out, $err) =
  psql_verbose($standby, 'postgres', q{SELECT outbox_emit('t', '{}')});
isnt($ret, 0, 'outbox_emit fails on a standby');
like($err, qr/ERROR:  25006: cannot call outbox_emit\(\) during recovery/,
	'... saying it runs during recovery (SQLSTATE 25006)');
($ret, $out, $err) =
  psql_verbose($standby, 'postgres', 'SELECT outbox.frontier()');
isnt($ret, 0, 'outbox.frontier fails on a standby');
like($err, qr/ERROR:  55000: outbox.frontier\(\) cannot be used during recovery/,
	'... saying it cannot be used during recovery');
$standby->stop;

# --- (c) PREPARE TRANSACTION ---
my $count_before =
  $primary->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages');
($ret, $out, $err) = psql_verbose($primary, 'postgres',
	q{BEGIN;
INSERT INTO t VALUES (1);
SELECT outbox_emit('prepared', '{}');
PREPARE TRANSACTION 'x';});
isnt($ret, 0, 'PREPARE TRANSACTION after an emit fails');
like($err,
	qr/ERROR:  0A000: cannot prepare a transaction that emitted outbox messages/,
	'... with "cannot prepare a transaction that emitted outbox messages" (SQLSTATE 0A000)'
);
is($primary->safe_psql('postgres', 'SELECT count(*) FROM pg_prepared_xacts'),
	'0', 'no prepared transaction remains');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	$count_before, 'nothing was emitted');
is($primary->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'0', 'the failed transaction was rolled back');

# A transaction that did not emit prepares and commits as usual.
$primary->safe_psql('postgres',
	q{BEGIN; INSERT INTO t VALUES (2); PREPARE TRANSACTION 'y';});
is($primary->safe_psql('postgres', q{SELECT gid FROM pg_prepared_xacts}),
	'y', 'a transaction that did not emit can be prepared');
$primary->safe_psql('postgres', q{COMMIT PREPARED 'y'});
is($primary->safe_psql('postgres', 'SELECT count(*) FROM t'),
	'1', '... and committed');

# Messages of a rolled-back savepoint do not count.
$primary->safe_psql('postgres',
	q{BEGIN; SAVEPOINT s; SELECT outbox_emit('prepared', '{}'); ROLLBACK TO s;
	  INSERT INTO t VALUES (3); PREPARE TRANSACTION 'z';});
is($primary->safe_psql('postgres', q{SELECT gid FROM pg_prepared_xacts}),
	'z', 'a transaction whose only emit was rolled back can be prepared');
$primary->safe_psql('postgres', q{COMMIT PREPARED 'z'});
is($primary->safe_psql('postgres', 'SELECT count(*) FROM outbox.messages'),
	$count_before, 'nothing was emitted by it');

# The failed PREPARE left nothing in flight: the frontier follows new emits.
my $uuid = $primary->safe_psql('postgres', q{SELECT outbox_emit('after', '{}')});
my $id = $primary->safe_psql('postgres',
	"SELECT id FROM outbox.messages WHERE msg_id = '$uuid'");
cmp_ok($primary->safe_psql('postgres', 'SELECT outbox.frontier()'),
	'>=', $id, 'the frontier reaches messages emitted after the refused PREPARE');

# --- (d) another database ---
$primary->safe_psql('postgres', 'CREATE DATABASE other');
$primary->safe_psql('other', 'CREATE EXTENSION outbox');
pass('CREATE EXTENSION works in another database');
($ret, $out, $err) =
  psql_verbose($primary, 'other', q{SELECT outbox_emit('t', '{}')});
isnt($ret, 0, 'outbox_emit fails in a database other than outbox.database');
like($err,
	qr/ERROR:  55000: outbox_emit\(\) cannot be used in database "other"/,
	'... saying it cannot be used in database "other"');
like($err, qr/DETAIL:  .*"postgres"/, '... and naming outbox.database');
($ret, $out, $err) = psql_verbose($primary, 'other', 'SELECT outbox.frontier()');
like($err, qr/cannot be used in database "other"/,
	'outbox.frontier fails there too');
is($primary->safe_psql('other', 'SELECT count(*) FROM outbox.messages'),
	'0', 'nothing was stored there');

# Refused calls left nothing behind in outbox.database either.
is( $primary->safe_psql(
		'postgres',
		q{SELECT string_agg(topic, ',' ORDER BY id) FROM outbox.messages}),
	'primary,primary,after',
	'only the accepted messages exist');

$primary->stop;
done_testing();
