# outbox.database names a database that does not exist yet:
#  - the worker fails to connect once (FATAL), then waits without
#    restarting every few seconds, saying once what it waits for;
#  - once the database is created, it connects within seconds, waits for
#    CREATE EXTENSION, and delivers;
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
ok(wait_until(sub { log_count($waiting) > 0 }, 30),
	'the worker says it waits for the database');
like(slurp_file($node->logfile),
	qr/$waiting\n.*DETAIL:  The database does not exist\.\n.*HINT:  Create the database/,
	'... with a detail and a hint');
usleep(3_000_000);
is(log_count($missing), 1, 'it tried to connect once, not every few seconds');
is(log_count($fatal), 1, '... and failed in no other way');
is(log_count($waiting), 1, 'it said so once');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname IS NULL}),
	'1',
	'the waiting worker is connected to no database');

# A database that does not allow connections is not usable either.
$node->safe_psql('postgres', 'CREATE DATABASE later ALLOW_CONNECTIONS false');
ok( wait_until(sub { slurp_file($node->logfile) =~ /$waiting\n.*DETAIL:  The database does not allow connections\./ }, 30),
	'a database that does not allow connections is waited for, saying why');
usleep(1_000_000);
is(log_count(qr/outbox relay found database "later"/), 0, '... without connecting');

$node->safe_psql('postgres', 'ALTER DATABASE later ALLOW_CONNECTIONS true');
ok(wait_until(sub { log_count(qr/outbox relay started for database "later"/) > 0 }, 30),
	'once it allows connections the worker connects');
is(log_count($fatal), 1, '... with no further failed attempt');

$node->safe_psql('later', 'CREATE EXTENSION outbox');
$node->safe_psql('later', q{
SELECT outbox.create_notify_target('n', 'later_channel');
SELECT outbox.subscribe('n', '*');
});
my $id = $node->safe_psql('later',
	q{SELECT outbox_emit('t.x', '{"a": 1}') IS NOT NULL; SELECT max(id) FROM outbox.messages});
$id = (split /\n/, $id)[-1];
ok( $node->poll_query_until(
		'later',
		qq{SELECT pending = 0 AND last_delivered_id = $id FROM outbox.lag WHERE target = 'n'}),
	'and delivers in the new database');

relay_no_crash($node);
$node->stop;
done_testing();
