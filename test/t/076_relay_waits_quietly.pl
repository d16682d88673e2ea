# A relay waiting for CREATE EXTENSION (the one-database form, after DROP
# EXTENSION) sleeps on its latch.  It used to wait on every transport's
# descriptor too, and a transport's wake-up that came then (a NATS
# connection lost, a late acknowledgement) stayed readable, since only a
# drive takes it, and no drive runs before the extension is back: the
# relay spun, a transaction a turn, until CREATE EXTENSION.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxNats;

my $nats = nats_start('quiet');
my $url = $nats->{url};
nats_tool($url, 'create', 'ORDERS', 'orders.>', 1, -1, 3600);

my $node = relay_node('waits_quietly');	# outbox.database = 'postgres'
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('js', '$url', subject => 'orders.{topic}', max_attempts => 0);
	SELECT outbox.subscribe('js', '*');
	SELECT outbox_emit('a', '{"n": 1}', 'k1');
});
ok_wait('the message is in the stream (the relay holds a NATS connection)', sub {
	my $n = nats_count($url, 'ORDERS');
	return ($n == 1, "$n messages");
});
my $pid = $node->safe_psql('postgres',
	q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'});
like($pid, qr/^\d+$/, "the relay runs (pid $pid)");

my $offset = -s $node->logfile;
$node->safe_psql('postgres', 'DROP EXTENSION outbox CASCADE');
ok($node->wait_for_log(qr/outbox relay is waiting for the extension to be created/, $offset),
	'after DROP EXTENSION the relay waits for CREATE EXTENSION');

# The NATS server goes away: libnats tells the relay through its pipe.
nats_kill($nats);

# CPU the relay's process used over a span (ticks of /proc/PID/stat).
sub cpu_ticks
{
	open(my $fh, '<', "/proc/$pid/stat") or die "the relay (pid $pid) is gone: $!";
	my $stat = <$fh>;
	close $fh;
	$stat =~ s/^.*\) //;			# after the command name
	my @f = split / /, $stat;
	return $f[11] + $f[12];		# utime + stime (fields 14 and 15)
}
# a span: the lost connection reaches the pipe within it
sleep 1;
my $before = cpu_ticks();
# a span: a relay that spins uses a whole core in it, one that sleeps none
sleep 3;
my $used = cpu_ticks() - $before;
cmp_ok($used, "<", 30, "the waiting relay sleeps: $used ticks of CPU in 3 s (one that spins took 118 beside a CI run, about 300 alone)");

# CREATE EXTENSION: the relay takes up delivery again (a new target).
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
ok($node->poll_query_until('postgres',
		q{SELECT state NOT LIKE 'waiting%' FROM outbox.worker}),
	'after CREATE EXTENSION the relay runs again')
  or diag($node->safe_psql('postgres', 'SELECT * FROM outbox.worker'));

$node->stop;
done_testing();
