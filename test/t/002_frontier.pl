# Invariant I3, nothing behind the cursor: a reader that computes
# F = outbox.frontier() in one statement and then reads the ids in
# (last, F] in a later statement never misses a message, because no message
# with an id <= F can become visible after F was computed.
#
# Writers (pgbench) commit transactions of 1-3 messages, now and then one of
# a few hundred (which keeps ids reserved but not yet visible for longer),
# with a random pause between emitting and COMMIT, and serializable
# transactions in write skew, some of which fail at COMMIT after their ids
# were reserved (leaving gaps the frontier must step over).  Meanwhile a
# reader loops: frontier, then read, then advance its cursor to F,
# recording every id it read.  Afterwards no id at or below the final cursor
# may be missing from what it read.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time);

my $duration = 10;	# seconds of concurrent writing and reading

my $node = PostgreSQL::Test::Cluster->new('frontier');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
max_connections = 30
});
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION outbox;
CREATE TABLE seen (id bigint NOT NULL, round int NOT NULL);
CREATE TABLE skew (k int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO skew VALUES (1, 0), (2, 0);
});

my $basedir = $node->basedir;
my %scripts = (
	'002_small@16' => q{
\set n random(1, 3)
BEGIN;
SELECT count(outbox_emit('small', jsonb_build_object('s', g))) FROM generate_series(1, :n) g;
SELECT pg_sleep(random() * 0.005);
COMMIT;
},
	'002_large@1' => q{
\set n random(100, 400)
BEGIN;
SELECT count(outbox_emit('large', jsonb_build_object('s', g, 'pad', repeat('x', 200))))
  FROM generate_series(1, :n) g;
SELECT pg_sleep(random() * 0.005);
COMMIT;
},
	# Write skew: each reads both rows and updates one.  Concurrent pairs
	# fail with a serialization failure, some of them in COMMIT itself,
	# after the outbox reserved their ids.
	'002_skew@4' => q{
\set k random(1, 2)
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT sum(v) FROM skew;
SELECT count(outbox_emit('skew', jsonb_build_object('k', :k)));
SELECT pg_sleep(random() * 0.002);
UPDATE skew SET v = v + 1 WHERE k = :k;
COMMIT;
});
my @script_opts;
for my $name (sort keys %scripts)
{
	(my $file = "$basedir/$name") =~ s/\@\d+$//;
	PostgreSQL::Test::Utils::append_to_file($file, $scripts{$name});
	my ($weight) = $name =~ /\@(\d+)$/;
	push @script_opts, '-f', "$file\@$weight";
}

my ($bench_out, $bench_err) = ('', '');
my $bench = IPC::Run::start(
	[
		'pgbench', '--no-vacuum', '--client=4', '--jobs=2',
		"--time=$duration", '-h', $node->host, '-p', $node->port,
		@script_opts, 'postgres'
	],
	'>', \$bench_out, '2>', \$bench_err);

# The reader: one session, one statement for the frontier and a later one
# (a new snapshot, READ COMMITTED) for the messages up to it.
my $reader = $node->background_psql('postgres');
my $last = 0;
my $rounds = 0;
my $backwards = 0;

sub read_round
{
	my $f = $reader->query_safe('SELECT outbox.frontier()');
	die "unexpected frontier '$f'" unless $f =~ /^-?\d+$/;
	$backwards++ if $f < $last;
	if ($f > $last)
	{
		$reader->query_safe(
			"INSERT INTO seen SELECT id, $rounds FROM outbox.messages WHERE id > $last AND id <= $f"
		);
		$last = $f;
	}
	$rounds++;
	return $f;
}

my $deadline = time() + $duration;
read_round() while time() < $deadline;
my $rounds_during = $rounds;
my $last_during = $last;

$bench->finish;
note "pgbench exit status $?:\n$bench_out$bench_err";
like($bench_out, qr/processed: [1-9]/, 'writers committed transactions');

# Writers are gone: a few more rounds reach everything.
read_round() for 1 .. 3;
$reader->quit;

my ($nmsg, $max_id, $nseen) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT count(*), max(id), (SELECT count(*) FROM seen) FROM outbox.messages');
my ($nskew, $gaps) = split /\|/, $node->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE topic = 'skew'), max(id) - min(id) + 1 - count(*)
	    FROM outbox.messages});
note "reader: $rounds_during rounds while writing, cursor $last_during; "
  . "$nmsg messages, max id $max_id, $nskew skew messages, $gaps ids never visible";

cmp_ok($rounds_during, '>=', 200, 'the reader made many rounds while writers ran');
cmp_ok($last_during, '>=', 2000, 'the reader advanced while writers ran');
is($backwards, 0, 'the frontier never moved backwards');

# The invariant: every message at or below the cursor was read, when the
# cursor passed it.  (The reader stopped while writers ran, so $last_during
# is the real test; the final cursor covers the catch-up rounds.)
is( $node->safe_psql(
		'postgres', qq{
	SELECT count(*) FROM outbox.messages m
	 WHERE m.id <= $last_during
	   AND NOT EXISTS (SELECT FROM seen s WHERE s.id = m.id AND s.round < $rounds_during)}
	),
	'0',
	'no message at or below the cursor was missed while writers ran');
is( $node->safe_psql(
		'postgres', qq{
	SELECT count(*) FROM outbox.messages m
	 WHERE m.id <= $last AND NOT EXISTS (SELECT FROM seen s WHERE s.id = m.id)}),
	'0',
	'no message at or below the final cursor was missed');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM (SELECT id FROM seen GROUP BY id HAVING count(*) > 1) d'),
	'0', 'no message was read twice');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM seen s WHERE NOT EXISTS (SELECT FROM outbox.messages m WHERE m.id = s.id)'),
	'0', 'every id read is a stored message');
cmp_ok($last, '>=', $max_id,
	'with writers stopped the frontier reaches the highest id');
is($nseen, $nmsg, 'the reader read every message');

$node->stop;
done_testing();
