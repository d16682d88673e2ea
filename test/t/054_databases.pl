# One outbox per database: three databases with the extension, each with
# its own target on the test receiver, emitting at the same time.  Every
# message reaches its own database's target, per key in commit order, with
# ids of its database's own sequence.  Then one database's relay is
# terminated again and again while its receiver refuses every request
# (receiver-wide, 401): the other two deliver everything, their relays
# untouched, and the failing one's messages are held, not dead-lettered,
# and delivered once its receiver answers again.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my @dbs = qw(app_a app_b app_c);
my $sink = start_sink('databases');
my $url = $sink->{url};
my $node = relay_node('databases', every_database => 1, create_extension => 0,
	conf => "max_worker_processes = 16\n");

for my $db (@dbs)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/$db', lanes => 4);
SELECT outbox.subscribe('t', 'm');
});
}

# Each database has a relay of its own, connected to it.
ok( $node->poll_query_until('postgres', q{
	SELECT count(DISTINCT datname) FROM pg_stat_activity
	 WHERE backend_type = 'outbox relay' AND datname LIKE 'app_%'}, '3'),
	'a relay runs in each of the three databases');
my %relay;
$relay{$_} = $node->safe_psql('postgres', qq{
	SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$_'})
  for @dbs;

# (a relay enters outbox.relays once it has claimed its database, a moment
# after it appears in pg_stat_activity)
ok($node->poll_query_until('app_a', q{SELECT string_agg(database || ':' || (pid IS NOT NULL), ',' ORDER BY database)
	FROM outbox.relays WHERE database LIKE 'app_%'},
	'app_a:true,app_b:true,app_c:true'), 'outbox.relays shows the three relays from any database');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'outbox'}), '0',
	'... (postgres has no extension, and no relay)');

# --- three databases emitting at the same time (pgbench, 2 clients each) ---
my $script = "$PostgreSQL::Test::Utils::tmp_check/emit_databases.sql";
open(my $fh, '>', $script) or die;
print $fh q{\set k random(1, 20)
BEGIN;
SELECT outbox_emit('m', jsonb_build_object('db', current_database()), 'key-' || :k);
SELECT outbox_emit('m', jsonb_build_object('db', current_database()), 'key-' || :k);
SELECT outbox_emit('m', jsonb_build_object('db', current_database()), 'key-' || (:k + 1));
COMMIT;
};
close $fh;
my $per_client = 300;    # transactions
my @runs;
for my $db (@dbs)
{
	push @runs, IPC::Run::start(
		[ 'pgbench', '-n', '-c', '2', '-t', $per_client, '-f', $script,
		  '-h', $node->host, '-p', $node->port, $db ],
		'>', \my $out, '2>', \my $err);
}
is(join(',', map { $_->finish ? 'ok' : 'failed' } @runs), 'ok,ok,ok',
	'pgbench ran in the three databases at once');

my $n = 2 * $per_client * 3;    # messages per database

# Requests the receiver got on a path (cheap: the sink's counters; the
# records themselves are read once the counts are there).
sub requests_at
{
	my ($path) = @_;
	return sink_stats($sink)->{by_path}{$path} // 0;
}
for my $db (@dbs)
{
	ok(wait_until(sub { requests_at("/$db") >= $n }),
		"$db: all $n messages reached its own target");
}
for my $db (@dbs)
{
	my $att = sink_attempts($sink, "/$db");
	my %seen;
	$seen{ $_->{seq} }++ for grep { $_->{status} == 204 } @$att;
	is(scalar(keys %seen), $n, "$db: each id once");
	# ids of its own sequence: 1..n, whatever the others handed out
	is_deeply([ (sort { $a <=> $b } keys %seen)[ 0, -1 ] ], [ 1, $n ],
		"$db: ids 1 to $n, independent of the other databases");
	is($node->safe_psql($db, q{SELECT count(*) FROM outbox.messages
		WHERE payload->>'db' <> current_database()}), '0',
		"$db: only its own messages in its table");
	my %expected;
	push @{ $expected{ $_->[1] } }, $_->[0]
	  for map { [ split /\|/ ] } split /\n/,
	  $node->safe_psql($db, 'SELECT id, key FROM outbox.messages ORDER BY id');
	is_deeply([ check_key_fifo($att, \%expected) ], [], "$db: per key in commit order");
}

# app_a and app_b: how long $more messages each take with app_c healthy.
my $more = 3000;
sub emit_ab
{
	my @h;
	for my $db (qw(app_a app_b))
	{
		push @h, IPC::Run::start(
			[ 'psql', '-X', '-q', '-h', $node->host, '-p', $node->port, '-d', $db, '-c',
			  "SELECT count(outbox_emit('m', jsonb_build_object('db', current_database()), 'k' || g % 20)) FROM generate_series(1, $more) g" ],
			'>', \my $o, '2>', \my $e);
	}
	return @h;
}
my $want_ab = $n + $more;
# (their receiver answers every request 204: a request is a delivery)
my $done_ab = sub { requests_at('/app_a') >= $want_ab && requests_at('/app_b') >= $want_ab };
my $delivered_ab = sub {
	scalar(grep { $_->{status} == 204 } @{ sink_attempts($sink, '/app_a') }) >= $want_ab
	  && scalar(grep { $_->{status} == 204 } @{ sink_attempts($sink, '/app_b') }) >= $want_ab;
};
# When the last request of app_a and app_b arrived (the receiver's clock,
# the machine's): the phases below are timed by delivery alone.
my $last_ab = sub {
	my ($t) = (0);
	for my $path ('/app_a', '/app_b')
	{
		my @r = sink_path_records($sink, $path);
		$t = $r[-1]{t} if @r && $r[-1]{t} > $t;
	}
	return $t;
};
my $t0 = time;
my @emitters = emit_ab();
$_->finish for @emitters;
ok(wait_until($done_ab) && $delivered_ab->(), "baseline: app_a and app_b delivered $more more each");
my $healthy = $last_ab->() - $t0;

# --- one database failing: its relay terminated, its receiver refusing ---
sink_control($sink, { path => '/app_c', status => 401 });
$node->safe_psql('app_c', q{SELECT count(outbox_emit('m', '{}', 'c-' || g % 5)) FROM generate_series(1, 200) g});
ok(wait_until(sub { $node->safe_psql('app_c', q{SELECT state FROM outbox.stats WHERE target = 't'}) eq 'failing' }),
	'app_c: its target is held (receiver-wide failure)');

$want_ab = $n + 2 * $more;
$t0 = time;
@emitters = emit_ab();
# Meanwhile app_c's relay is terminated three times, each time it is back
# (the launcher starts it again, later each time: three are enough).
my $kills = 0;
while ($kills < 3)
{
	my $pid;
	wait_for("app_c's relay to run (kill $kills)", sub {
		$pid = $node->safe_psql('postgres', q{
			SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = 'app_c'});
		($pid ne '', 'no relay') })
	  or last;
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
	$kills++;
	wait_for("app_c's relay $pid to be gone",
		sub { $node->safe_psql('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid") eq 't' });
}
wait_until($done_ab);
$_->finish for @emitters;
ok($delivered_ab->(), "app_a and app_b delivered their $more new messages each while app_c failed");
my $failing = $last_ab->() - $t0;
# Timing is noisy here: this only catches a stall, so the bound leaves
# room for the files running beside this one loading the machine
# differently in the two phases.
cmp_ok($failing, '<', 3 * $healthy + 5,
	sprintf('... without a stall: %.1f s, against %.1f s with app_c healthy', $failing, $healthy));
cmp_ok($kills, '>=', 3, "app_c's relay was terminated $kills times meanwhile");
for my $db (qw(app_a app_b))
{
	is($node->safe_psql('postgres', qq{
		SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = '$db'}),
		$relay{$db}, "$db: its relay ran on, untouched");
}
is($node->safe_psql('app_c', 'SELECT count(*) FROM outbox.dead_letters'), '0',
	'app_c: nothing dead-lettered while its receiver refused');

# app_c recovers: its relay is back and delivers what was held.
sink_control($sink, { path => '/app_c', reset => JSON::PP::true });
ok(wait_until(sub { scalar(grep { $_->{status} == 204 } @{ sink_attempts($sink, '/app_c') }) >= $n + 200 }, undef, 0.5),
	'app_c: its held messages are delivered once the receiver answers');
like($node->safe_psql('app_c', q{SELECT state FROM outbox.relays WHERE database = 'app_c'}),
	qr/^(idle|delivering)$/, 'outbox.relays: app_c runs again');

relay_no_crash($node);
$node->stop;
stop_sink($sink);
done_testing();
