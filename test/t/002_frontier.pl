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
use OutboxRelayTest;
use IPC::Run;

# A fixed amount of writing (transactions of each writer), not a time: the
# reader reads for as long as the writers write, however fast the machine.
my $per_client = 400;

my $node = outbox_node('frontier', conf => "max_connections = 30\n");

$node->safe_psql(
	'postgres', q{
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
		"--transactions=$per_client", '-h', $node->host, '-p', $node->port,
		@script_opts, 'postgres'
	],
	'>', \$bench_out, '2>', \$bench_err);

# The reader: one session, one statement for the frontier and a later one
# (a new snapshot, READ COMMITTED) for the messages up to it.  Errors do not
# end the session: they are counted, and the round does not advance.
my $reader = $node->background_psql('postgres', on_error_stop => 0);
my $last = 0;
my $rounds = 0;
my $backwards = 0;
my @errors;

# One round trip per round: the frontier is computed by one statement and
# kept in a psql variable; the INSERT that reads up to it is the next
# statement, so its snapshot is taken after the frontier was computed.
sub read_round
{
	my ($f, $failed) = $reader->query(
		"\\unset f\n"
		  . "SELECT outbox.frontier() AS f \\gset\n"
		  . "INSERT INTO seen SELECT id, $rounds FROM outbox.messages WHERE id > $last AND id <= :f;\n"
		  . "SELECT :f");
	$rounds++;
	if ($failed)
	{
		# BackgroundPsql keeps stderr across queries; take it and clear it.
		push @errors, $reader->{stderr};
		$reader->{stderr} = '';
		return;
	}
	die "unexpected frontier '$f'" unless $f =~ /^-?\d+$/;
	if ($f < $last)
	{
		$backwards++;
	}
	else
	{
		$last = $f;
	}
	return $f;
}

# BackgroundPsql notes every query and its result; thousands of rounds
# would flood the test log.
{
	no warnings 'redefine';
	local *PostgreSQL::Test::BackgroundPsql::note = sub { };
	while (1)
	{
		$bench->pump_nb;
		last unless $bench->pumpable;
		read_round();
	}
}
my $rounds_during = $rounds;
my $last_during = $last;

$bench->finish;
my $bench_status = $?;
note "pgbench:\n$bench_out$bench_err";
is($bench_status, 0, 'pgbench writers ran to the end');
like($bench_out, qr/processed: [1-9]/, 'writers committed transactions');

# Writers are gone: rounds until the cursor reaches the highest id (the
# first one normally does).
my $max_id = $node->safe_psql('postgres', 'SELECT max(id) FROM outbox.messages');
for (1 .. 20)
{
	my $f = read_round();
	last if defined $f && $f >= $max_id;
}
$reader->quit;

my ($nmsg, $nseen) = split /\|/,
  $node->safe_psql('postgres',
	'SELECT count(*), (SELECT count(*) FROM seen) FROM outbox.messages');
my ($nskew, $gaps) = split /\|/, $node->safe_psql('postgres',
	q{SELECT count(*) FILTER (WHERE topic = 'skew'), max(id) - min(id) + 1 - count(*)
	    FROM outbox.messages});
note "reader: $rounds_during rounds while writing, cursor $last_during; "
  . "$nmsg messages, max id $max_id, $nskew skew messages, $gaps ids never visible";

# (The reader shares the machine with the four writers: about 1900 rounds
# during their 1600 transactions on an idle machine; a loaded one slows
# both alike.)
cmp_ok($rounds_during, '>=', 100, 'the reader made many rounds while writers ran');
cmp_ok($last_during, '>=', 2000, 'the reader advanced while writers ran');
is($backwards, 0, 'the frontier never moved backwards');
is(scalar(@errors), 0, 'no reader round failed')
  or diag("first of " . scalar(@errors) . " errors: $errors[0]");

# The invariant: every message at or below the cursor was read by the
# round that moved the cursor past it.  The cursor reached while writers
# ran is the real test; the final cursor adds the catch-up rounds.
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

# outbox.frontier() flushes WAL up to the current insert position (I7).
# When that position is exactly at the start of a WAL page, the insert
# pointer reported by PostgreSQL lies past the page header, beyond
# anything generated yet; a flush request for it must not fail.  Land the
# insert position on a page boundary with a WAL message of the right size,
# then ask for the frontier in the same transaction (nothing else is
# written in between).
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION frontier_at_page_boundary(OUT landed bool, OUT frontier bigint)
LANGUAGE plpgsql AS $$
DECLARE
	page int := current_setting('wal_block_size')::int;
	pos bigint;
	len int;
BEGIN
	landed := false;
	FOR attempt IN 1 .. 100 LOOP
		pos := pg_current_wal_insert_lsn() - '0/0'::pg_lsn;
		-- A non-transactional WAL message with a 1-byte prefix and len bytes
		-- is a 24-byte record header, a 2-byte data header, the 24-byte
		-- message header, 'x' and its NUL, then the bytes: 52 + len.
		len := page - (pos % page)::int - 52;
		IF len BETWEEN 0 AND 200 THEN
			PERFORM pg_logical_emit_message(false, 'x', repeat('y', len));
			pos := pg_current_wal_insert_lsn() - '0/0'::pg_lsn;
			-- just past the header of a fresh page?
			IF pos % page IN (24, 40) THEN
				landed := true;
				frontier := outbox.frontier();
				RETURN;
			END IF;
		ELSE
			PERFORM pg_logical_emit_message(false, 'x', repeat('y', 1000));
		END IF;
	END LOOP;
END $$;
});
my ($rc, $out, $err) = $node->psql('postgres',
	'SELECT landed, frontier IS NOT NULL FROM frontier_at_page_boundary()');
is($rc, 0,
	'outbox.frontier() works when the WAL insert position is on a page boundary'
) or diag($err);
is($out, 't|t', 'the WAL insert position was placed on a page boundary')
  if $rc == 0;

$node->stop;
done_testing();
