# A server pg_upgrade runs (postgres -b, binary upgrade mode) starts no
# outbox launcher, so no relay or capture worker reads or writes while
# pg_upgrade restores the schema (PostgreSQL runs no logical replication
# launcher there either).  The same server started normally delivers again.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $node = relay_node('binary_upgrade', every_database => 1);
ok_wait('the launcher runs on a normal start', sub {
	my $n = $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox launcher'});
	return ($n eq '1', "$n launchers");
});
$node->stop;

# Started as pg_upgrade starts it.
my $offset = -s $node->logfile;
system_or_bail('pg_ctl', '-D', $node->data_dir, '-l', $node->logfile, '-o', '-b', '-w', 'start');
ok($node->wait_for_log(qr/outbox starts no relay or capture worker in binary upgrade mode/, $offset),
	'binary upgrade mode: outbox says it starts no worker');
is($node->safe_psql('postgres', 'SHOW is_superuser'), 'on', 'the server takes connections');
# a span: the launcher would have started with the first background workers
sleep 1;
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'outbox%'}),
	'0', 'no outbox launcher, relay or capture worker runs');
# started by hand: stopped by hand (the node object did not start it)
system_or_bail('pg_ctl', '-D', $node->data_dir, '-m', 'fast', '-w', 'stop');

$node->start;
ok_wait('a normal start runs the launcher again', sub {
	my $n = $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox launcher'});
	return ($n eq '1', "$n launchers");
});
$node->stop;
done_testing();
