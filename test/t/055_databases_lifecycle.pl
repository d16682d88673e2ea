# One outbox per database, while the server runs: CREATE EXTENSION in a new
# database delivers within a second; DROP EXTENSION, DROP DATABASE (plain
# and WITH (FORCE)) and ALTER DATABASE RENAME with a relay connected; a
# database that refuses connections; outbox.databases changed by a reload;
# the outbox.max_databases limit; max_worker_processes used up.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $sink = start_sink('lifecycle');
my $url = $sink->{url};

sub delivered
{
	my ($path) = @_;
	return scalar grep { $_->{status} == 204 } @{ sink_attempts($sink, $path) };
}

sub relay_of
{
	my ($node, $db) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$db'});
}

sub setup_db
{
	my ($node, $db) = @_;
	$node->safe_psql($db, qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/$db');
SELECT outbox.subscribe('t', 'm');
});
}

my $node = relay_node('lifecycle', every_database => 1, create_extension => 0,
	conf => "outbox.max_databases = 3\nmax_worker_processes = 16\n");
my $log_offset = 0;

# --- CREATE EXTENSION in a new database: delivering at once ---
$node->safe_psql('postgres', 'CREATE DATABASE one');
# One transaction: the extension, a target, a message; then the server's
# clock, just after the commit.
my $t1 = $node->safe_psql('one', qq{
BEGIN;
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/one');
SELECT outbox.subscribe('t', 'm');
SELECT outbox_emit('m', '{"first": true}');
COMMIT;
SELECT extract(epoch FROM clock_timestamp());
});
$t1 = (split /\n/, $t1)[-1];
ok(wait_until(sub { delivered('/one') >= 1 }, undef, 0.05), 'CREATE EXTENSION: the first message is delivered');
# From the commit to the receiver's record of the request (one clock, the
# machine's): the launcher, woken by the commit (or at its next look, at
# most a second later), starts the relay, which connects and delivers;
# about 0.1 s on a quiet machine.  The bound leaves room for a loaded one;
# it tells a relay started at once from one that waits for a retry's
# backoff or a failed start, not the wake-up from the next look.
my $first = (sink_path_records($sink, '/one'))[0]{t} - $t1;
cmp_ok($first, '<', 5.0, sprintf('... %.2f s after the commit', $first));

# --- ALTER DATABASE RENAME with its relay connected ---
my $pid = relay_of($node, 'one');
isnt($pid, '', 'database one has a relay');
my ($ret, $out, $err) = $node->psql('postgres', 'ALTER DATABASE one RENAME TO uno');
is($ret, 0, 'ALTER DATABASE RENAME succeeds while the relay was connected') or diag $err;
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'uno'}, '1'),
	'the relay runs again, in the renamed database');
$node->safe_psql('uno', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/one') >= 2 }), '... and delivers');
is($node->safe_psql('uno', q{SELECT max(id) FROM outbox.messages}), '2',
	'... with the same sequence (ids go on)');

# A role that may not drop or rename the database cannot stop its relay
# with a command that fails.
$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN');
$pid = relay_of($node, 'uno');
for my $cmd ('DROP DATABASE uno', 'ALTER DATABASE uno RENAME TO dos')
{
	($ret, $out, $err) = $node->psql('postgres', $cmd, extra_params => [ '-U', 'mallory' ]);
	like($err, qr/must be owner of database uno/, "$cmd by another role is refused");
}
usleep(300_000);    # a span: a relay told to stop would be gone by now
is(relay_of($node, 'uno'), $pid, '... and the relay ran on');

# --- DROP EXTENSION: the relay stops, the slot is given back ---
setup_db($node, 'postgres');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM outbox.relays WHERE database = 'postgres' AND pid IS NOT NULL}, '1'),
	'postgres has a relay');
$node->safe_psql('postgres', 'DROP EXTENSION outbox CASCADE');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'postgres'}, '0'),
	'DROP EXTENSION: the relay exits');
like(slurp_file($node->logfile), qr/outbox relay for database "postgres" stops: the extension was dropped/,
	'... and says why');
is($node->safe_psql('uno', q{SELECT string_agg(database, ',') FROM outbox.relays}), 'uno',
	'... and gives back its slot (outbox.relays)');

# A CREATE EXTENSION that rolls back gives back the slot it took.
$node->safe_psql('postgres', 'BEGIN; CREATE EXTENSION outbox; SELECT pg_sleep(0.5); ROLLBACK;');
ok(wait_until(sub { $node->safe_psql('uno', q{SELECT string_agg(coalesce(database, '?'), ',') FROM outbox.relays}) eq 'uno' }),
	'a CREATE EXTENSION rolled back leaves no slot behind');

# --- the outbox.max_databases limit (3) ---
$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(two three four);
setup_db($node, $_) for qw(two three);
($ret, $out, $err) = $node->psql('four', 'CREATE EXTENSION outbox');
isnt($ret, 0, 'a fourth database cannot create the extension (outbox.max_databases = 3)');
like($err, qr/ERROR:  outbox cannot serve database "four": all 3 outbox database slots are in use/, '... with a clear error');
like($err, qr/HINT:  Raise outbox.max_databases/, '... and a hint');
is($node->safe_psql('four', q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'}), '0',
	'... and nothing is left behind');
$node->safe_psql('uno', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/one') >= 3 }), 'the other databases deliver on');

# --- DROP DATABASE with its relay connected, plain and WITH (FORCE) ---
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE three');
is($ret, 0, 'DROP DATABASE succeeds while its relay was connected') or diag $err;
($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE two WITH (FORCE)');
is($ret, 0, 'DROP DATABASE WITH (FORCE) too') or diag $err;
ok($node->poll_query_until('uno', q{SELECT string_agg(coalesce(database, '?'), ',') FROM outbox.relays}, 'uno'),
	'their slots are given back');
setup_db($node, 'four');
$node->safe_psql('four', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/four') >= 1 }), 'a database that could not have one before has an outbox now');

# --- a database that refuses connections ---
$node->safe_psql('postgres', 'CREATE DATABASE closed');
setup_db($node, 'closed');
$node->safe_psql('closed', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/closed') >= 1 }), 'database closed delivers');
$node->safe_psql('postgres', 'ALTER DATABASE closed ALLOW_CONNECTIONS false');
$node->restart;
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname IN ('uno', 'four')}, '2'),
	'after a restart the relays run again');
usleep(2_000_000);    # a span: two more looks of the launcher
is(relay_of($node, 'closed'), '', 'a database that refuses connections gets no relay');
unlike(slurp_file($node->logfile), qr/FATAL:  database "closed" is not currently accepting connections/,
	'... and nothing tries to connect to it');
$node->safe_psql('postgres', 'ALTER DATABASE closed ALLOW_CONNECTIONS true');
$node->safe_psql('closed', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/closed') >= 2 }), 'once it allows connections again its relay delivers');

# --- outbox.databases, reloaded ---
$node->append_conf('postgresql.conf', "outbox.databases = 'uno, closed'\n");
$node->reload;
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'four'}, '0'),
	'outbox.databases without four: its relay stops');
($ret, $out, $err) = $node->psql('four', q{SELECT outbox_emit('m', '{}')});
like($err, qr/outbox_emit\(\) cannot be used in database "four".*\n.*outbox.databases names: uno, closed/,
	'... and outbox_emit() is refused there, naming the setting');
$node->append_conf('postgresql.conf', "outbox.databases = '*'\n");
$node->reload;
# a new session of four checks outbox.databases as the postmaster has it
settings_reloaded($node, 'four', 'outbox.databases' => '*');
$node->safe_psql('four', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { delivered('/four') >= 2 }), "outbox.databases = '*' again: four delivers");

# --- copies of a database with an outbox, with every slot in use ---
# Slots now: uno, four, closed (outbox.max_databases = 3).
$pid = relay_of($node, 'four');
($ret, $out, $err) = $node->psql('postgres', 'CREATE DATABASE copy1 TEMPLATE four');
is($ret, 0, 'CREATE DATABASE ... TEMPLATE of a database whose relay was connected') or diag $err;
$node->safe_psql('postgres', 'CREATE DATABASE copy2 TEMPLATE four');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'four'}, '1'), "four's relay runs again");
isnt(relay_of($node, 'four'), $pid, '... a new one');
ok(wait_until(sub { slurp_file($node->logfile) =~
	/outbox cannot serve database "(copy1|copy2|\d+)": all 3 outbox database slots are in use/ }),
	'the copies have the extension, but no slot is free: their relays say so');
($ret, $out, $err) = $node->psql('copy1', q{SELECT outbox_emit('m', '{}')});
like($err, qr/all 3 outbox database slots are in use/, 'outbox_emit() in a copy without a slot: the same error');
($ret, $out, $err) = $node->psql('copy1', 'DROP EXTENSION outbox CASCADE');
is($ret, 0, 'DROP EXTENSION works in a database without a slot') or diag $err;
# A slot is given back: copy2 is looked at again and gets its relay.
$node->safe_psql('closed', 'DROP EXTENSION outbox CASCADE');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'copy2'}, '1'),
	'a slot given back: the copy that waited for one gets its relay');
# A template gets no relay, gives its slot back and refuses outbox_emit().
$node->safe_psql('postgres', 'ALTER DATABASE copy2 IS_TEMPLATE true');
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay' AND datname = 'copy2'}, '0'),
	'a database made a template loses its relay');
ok($node->poll_query_until('uno', q{SELECT count(*) FROM outbox.relays WHERE datid = (SELECT oid FROM pg_database WHERE datname = 'copy2')}, '0'),
	'... and its slot');
($ret, $out, $err) = $node->psql('copy2', q{SELECT outbox_emit('m', '{}')});
like($err, qr/cannot be used in database "copy2".*\n.*it is a template/, '... and outbox_emit() is refused there');
relay_no_crash($node);

# --- max_worker_processes used up ---
# Three worker slots: the launcher and two relays (and for w3 none left);
# no logical replication launcher to take one.
my $small = relay_node('few_workers', every_database => 1, create_extension => 0,
	conf => "max_worker_processes = 3\nmax_logical_replication_workers = 0\n");
$small->safe_psql('postgres', "CREATE DATABASE $_") for qw(w1 w2 w3);
setup_db($small, $_) for qw(w1 w2);
ok($small->poll_query_until('postgres', q{SELECT count(*) FROM pg_stat_activity
	WHERE backend_type = 'outbox relay'}, '2'), 'launcher and two relays use the three worker slots');
setup_db($small, 'w3');
$small->safe_psql('w3', q{SELECT outbox_emit('m', '{}')});
ok(wait_until(sub { slurp_file($small->logfile) =~
	/LOG:  outbox relay for database "w3" cannot start: no background worker slot is free/ }),
	'the third relay cannot start: said at LOG');
like(slurp_file($small->logfile), qr/HINT:  Raise max_worker_processes/, '... with a hint');
# (the launcher logs before it notes the state)
ok($small->poll_query_until('w3', q{SELECT state FROM outbox.worker},
	'waiting for a background worker (max_worker_processes)'), '... and shown in outbox.worker');
ok($small->poll_query_until('w1', q{SELECT state FROM outbox.relays WHERE database = 'w3'},
	'waiting for a background worker (max_worker_processes)'), '... and in outbox.relays');
my $said = () = slurp_file($small->logfile) =~ /"w3" cannot start: no background worker slot is free/g;
usleep(2_500_000);    # a span: two more tries of the launcher
my $said_later = () = slurp_file($small->logfile) =~ /"w3" cannot start: no background worker slot is free/g;
is($said_later, $said, '... once, not at every try (the launcher tries every second)');
$small->safe_psql('postgres', 'DROP DATABASE w2 WITH (FORCE)');
ok(wait_until(sub { delivered('/w3') >= 1 }), 'a worker slot is free again: w3 delivers');

relay_no_crash($node);
relay_no_crash($small);
$small->stop;
$node->stop;
stop_sink($sink);
done_testing();
