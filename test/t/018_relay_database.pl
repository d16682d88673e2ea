# outbox.database names a database that does not exist yet:
#  - the launcher, connected to no database, waits for it, saying once what
#    it waits for; nothing fails and nothing restarts meanwhile;
#  - once the database can be connected to, the relay starts at once, waits
#    for CREATE EXTENSION, and delivers within a second of it;
#  - a database that does not allow connections is waited for too.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;

my $node = relay_node(
	'relay_database',
	create_extension => 0,
	conf => qq{
outbox.database = 'later'
outbox.poll_interval = 200
});

sub log_count
{
	my ($re) = @_;
	my @m = slurp_file($node->logfile) =~ /$re/g;
	return scalar @m;
}

my $missing = qr/FATAL:  database "later" does not exist/;
my $fatal = qr/FATAL:/;
my $waiting = qr/outbox relay is waiting for database "later"/;
ok(wait_until(sub { log_count($waiting) > 0 }),
	'the worker says it waits for the database');
like(slurp_file($node->logfile),
	qr/$waiting\n.*DETAIL:  The database does not exist\.\n.*HINT:  Create the database/,
	'... with a detail and a hint');
usleep(3_000_000);    # a span: the launcher looks again every 200 ms
is(log_count($missing), 0, 'nothing tried to connect to the missing database');
is(log_count($fatal), 0, '... and nothing failed');
is(log_count(qr/exited with exit code/), 0, '... or exited');
is(log_count($waiting), 1, 'it said so once');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox launcher' AND datname IS NULL}),
	'1',
	'the waiting launcher is connected to no database');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'}),
	'0', '... and no relay runs yet');

# A database that does not allow connections is not usable either.
$node->safe_psql('postgres', 'CREATE DATABASE later ALLOW_CONNECTIONS false');
ok( wait_until(sub { slurp_file($node->logfile) =~ /$waiting\n.*DETAIL:  The database does not allow connections\./ }),
	'a database that does not allow connections is waited for, saying why');
usleep(1_000_000);    # a span: five more looks of the launcher
is(log_count(qr/outbox relay found database "later"/), 0, '... without connecting');

$node->safe_psql('postgres', 'ALTER DATABASE later ALLOW_CONNECTIONS true');
ok(wait_until(sub { log_count(qr/outbox relay started for database "later"/) > 0 }),
	'once it allows connections the relay starts');
is(log_count($fatal), 0, '... with no failed attempt');

# Promptly after CREATE EXTENSION (the relay is woken by the commit; the
# poll is the safety net), measured on the server's clock: from the
# message's emitted_at to its delivery (5 s: a generous bound).
$node->safe_psql('later', q{
BEGIN;
CREATE EXTENSION outbox;
SELECT outbox.create_notify_target('n', 'later_channel');
SELECT outbox.subscribe('n', '*');
SELECT outbox_emit('t.x', '{"a": 1}');
COMMIT;
});
my $id = $node->safe_psql('later', q{SELECT max(id) FROM outbox.messages});
ok( $node->poll_query_until(
		'later',
		qq{SELECT pending = 0 AND last_delivered_id = $id FROM outbox.lag WHERE target = 'n'}),
	'and delivers in the new database');
$node->poll_query_until('later', q{SELECT last_success_at IS NOT NULL FROM outbox.stats WHERE target = 'n'})
  or die 'no success in outbox.stats';
my $took = $node->safe_psql('later', qq{
SELECT extract(epoch FROM s.last_success_at - m.emitted_at)
  FROM outbox.stats s, outbox.messages m WHERE s.target = 'n' AND m.id = $id});
cmp_ok($took, '<', 5, sprintf('... %.2f s after it was emitted, in the transaction of CREATE EXTENSION', $took));
is(log_count(qr/exited with exit code|FATAL:|ERROR:/), 0, 'nothing in the log looks like a failure');

relay_no_crash($node);
$node->stop;
done_testing();
