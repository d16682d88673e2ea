# Admin statements that update the progress rows of several targets in one
# transaction (here: replay() of four targets, in the reverse order of the
# relay's writes) may deadlock with the relay's progress write.  The relay
# is then the one rolled back: it records the same progress at its next
# turn, does not exit, and every message still arrives, per key in order
# (duplicates are allowed: a replay delivers again).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('deadlock');
my $node = relay_node('relay_deadlock', conf => "deadlock_timeout = '10ms'\n");
my @targets = map { "dl_$_" } 1 .. 4;
$node->safe_psql('postgres',
	join('', map { "SELECT outbox.create_http_target('$_', '$sink->{url}/$_', lanes => 4); SELECT outbox.subscribe('$_', 'dl');\n" } @targets));
my $pid = relay_worker_pid($node);

# Messages keep coming while replays run, many in one transaction each.
my ($in, $out, $err) = ('', '', '');
my $emitter = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \$err);
my $n = 0;
my $deadline = time + 25;
my $rounds = 0;
while (time < $deadline && $rounds < 300)
{
	for (1 .. 5)
	{
		$n++;
		$in .= "SELECT outbox_emit('dl', '{\"n\": $n}', 'k" . ($n % 7) . "');\n";
	}
	$emitter->pump_nb;
	$node->psql('postgres',
		q{SELECT outbox.replay(name, 1::bigint) FROM outbox.targets WHERE name LIKE 'dl_%' ORDER BY name DESC});
	$rounds++;
}
$in .= "\\q\n";
$emitter->finish;
note "$rounds rounds of replays, $n messages";

is(relay_worker_pid($node), $pid, 'the relay did not exit');
ok( $node->poll_query_until('postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target LIKE 'dl_%'}),
	'every target finished every message');
my $log = slurp_file($node->logfile);
unlike($log, qr/background worker "outbox relay" \(PID \d+\) exited/, 'no relay exit in the log');
my $retried = () = $log =~ /outbox relay will record its progress again/g;
note "progress writes rolled back and written again: $retried";
# Every message reached every target.
my %got;
for my $a (@{ sink_attempts($sink) })
{
	$got{"$a->{path} $a->{seq}"} = 1 if $a->{status} >= 200 && $a->{status} < 300;
}
my @ids = split /\n/, $node->safe_psql('postgres', q{SELECT id FROM outbox.messages WHERE topic = 'dl' ORDER BY id});
my @missing = grep { my $id = $_; grep { !$got{"/$_ $id"} } @targets } @ids;
is(scalar @missing, 0, 'no message is missing at any target');
relay_no_crash($node);
$node->stop;
stop_sink($sink);
done_testing();
