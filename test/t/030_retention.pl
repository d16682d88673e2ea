# Retention without bloat (I8; README, "Retention"): with outbox.retention =
# 0, a million messages through a fast HTTP target and a NOTIFY target
# leave the outbox schema's relations (heap, indexes, TOAST) within 16 MB
# of their size after the first 200,000, with no manual VACUUM; the same
# with a transaction held open for part of the run, once it ends.  Chunks
# are emptied by TRUNCATE, never row by row.  A message pending for a
# (paused) target is never removed; a dead letter keeps its payload and is
# delivered again after its message is gone; a transaction holding a lock
# on outbox.messages delays removal and outbox.worker names it; replay of
# removed history is refused; ids keep rising across rotations and a
# restart (I6).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $sink = start_sink('retention');
my $url = $sink->{url};
my $node = relay_node('retention', conf => q{
outbox.retention = 0
autovacuum_naptime = 10
});
sink_control($sink, { keep_body => JSON::PP::false });
sink_control($sink, { path => '/dl', keep_body => JSON::PP::true });

$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('h', '$url/h', batch_size => 100, lanes => 4);
SELECT outbox.subscribe('h', 'bulk');
SELECT outbox.create_notify_target('n', 'retention_channel');
SELECT outbox.subscribe('n', '*');
});

my $size_sql = q{SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
  WHERE c.relnamespace = 'outbox'::regnamespace AND c.relkind IN ('r', 'p')};
sub schema_size { return $node->safe_psql('postgres', $size_sql) }
sub mb { return sprintf('%.1f MB', $_[0] / 1048576) }

# Emit $n messages of ~120 bytes in transactions of 10,000.
my $emitted = 0;
sub emit_bulk
{
	my ($n) = @_;
	while ($n > 0)
	{
		my $k = $n < 10_000 ? $n : 10_000;
		$node->safe_psql('postgres',
			"SELECT count(outbox_emit('bulk', jsonb_build_object('i', g, 'pad', repeat('x', 80)), 'k' || (g % 100)))"
			  . " FROM generate_series($emitted + 1, $emitted + $k) g");
		$emitted += $k;
		$n -= $k;
	}
}

# Everything delivered, and the chunks that held it emptied.
sub drained
{
	my ($what) = @_;
	ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}),
		"$what: everything delivered");
	ok($node->poll_query_until('postgres', q{SELECT count(*) < 30000 FROM outbox.messages}),
		"$what: ... and removed");
}

my $max_seen = 0;
sub run_bulk
{
	my ($n) = @_;
	for (1 .. $n / 50_000)
	{
		emit_bulk(50_000);
		my $s = schema_size();
		$max_seen = $s if $s > $max_seen;
	}
}

# --- a million messages ---
my $t0 = time;
run_bulk(200_000);
drained('after 200k');
my $base = schema_size();
note('size after 200k: ' . mb($base));
run_bulk(800_000);
drained('after 1M');
my $end = schema_size();
note('size after 1M: ' . mb($end) . ', largest seen ' . mb($max_seen) . sprintf(', %.0f s', time - $t0));
cmp_ok(abs($end - $base), '<=', 16 * 1048576, 'a million messages later the schema is within 16 MB of its size after 200k');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.chunks WHERE truncated_at IS NOT NULL}),
	'>=', 3, 'chunks were emptied in turn');
is($node->safe_psql('postgres', q{SELECT sum(delivered) FROM outbox.lag WHERE target = 'h'}),
	$emitted, '... after every message was delivered');
my $acked = sink_stats($sink)->{by_path}{'/h'};
ok(defined $acked && $acked >= $emitted / 100, '... in batches of 100 to the receiver');

# --- the same with a transaction held open (an old snapshot) ---
my $hold = $node->background_psql('postgres');
$hold->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$hold->query_safe('SELECT txid_current()');
run_bulk(300_000);
my $held_size = schema_size();
$hold->query_safe('COMMIT');
$hold->quit;
run_bulk(100_000);
drained('after a held transaction');
my $recovered = schema_size();
note('size with a transaction held: ' . mb($held_size) . ', after it ended: ' . mb($recovered));
cmp_ok(abs($recovered - $base), '<=', 16 * 1048576, 'after the transaction ends the size is back within 16 MB');

# --- a lock on outbox.messages delays removal, and outbox.worker says who ---
my $reader = $node->background_psql('postgres');
$reader->query_safe('BEGIN');
$reader->query_safe('SELECT count(*) FROM outbox.messages');
my $reader_pid = $reader->query_safe('SELECT pg_backend_pid()');
chomp $reader_pid;
emit_bulk(50_000);
ok($node->poll_query_until('postgres',
		qq{SELECT retention_held_by LIKE '%lock on outbox.messages%$reader_pid%' FROM outbox.worker}),
	'a reader holding a lock keeps its chunks, and outbox.worker names its pid');
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'... delivery goes on meanwhile');
cmp_ok($node->safe_psql('postgres', 'SELECT count(*) FROM ONLY outbox.messages_1')
	  + $node->safe_psql('postgres', 'SELECT count(*) FROM ONLY outbox.messages_2')
	  + $node->safe_psql('postgres', 'SELECT count(*) FROM ONLY outbox.messages_3')
	  + $node->safe_psql('postgres', 'SELECT count(*) FROM ONLY outbox.messages_4'),
	'>=', 40_000, '... and the delivered messages stay while it holds the lock');
$reader->query_safe('COMMIT');
$reader->quit;
drained('after the reader ended');

# --- a paused target keeps its messages ---
$node->safe_psql('postgres', q{SELECT outbox.pause_target('h')});
emit_bulk(20_000);
# several retention steps (and rotations) since
for my $step (1 .. 3)
{
	my $t = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	$node->poll_query_until('postgres', "SELECT retention_checked_at > '$t' FROM outbox.worker")
	  or die "no retention step $step after the emit";
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE topic = 'bulk' AND id > (SELECT min(done_id) FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'h')}),
	'20000', 'messages pending for a paused target are not removed');
# Polled: the count above takes a share lock on every chunk, and a
# retention step that ran meanwhile names that lock until the next step
# (about a second later); so does an autovacuum of a chunk.
ok($node->poll_query_until('postgres',
		q{SELECT retention_held_by LIKE '%target "h"%' FROM outbox.worker}),
	'... and outbox.worker says which target holds them')
  or diag('retention_held_by: '
	  . $node->safe_psql('postgres', q{SELECT retention_held_by FROM outbox.worker}));
$node->safe_psql('postgres', q{SELECT outbox.resume_target('h')});
drained('after resume');
is($node->safe_psql('postgres', q{SELECT sum(delivered) FROM outbox.lag WHERE target = 'h'}),
	$emitted, '... and all of them were delivered');

# --- a dead letter outlives its message and is delivered again ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('dl', '$url/dl', lanes => 1, max_attempts => 1);
SELECT outbox.subscribe('dl', 'dl');
});
sink_control($sink, { path => '/dl', status => 422 });
my $dl_id = $node->safe_psql('postgres', q{
SELECT outbox_emit('dl', '{"order": 42, "note": "kept"}', 'dk', '{"x-trace": "t1"}')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.dead_letters WHERE target = 'dl'}),
	'a rejected message becomes a dead letter');
emit_bulk(20_000);
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.messages WHERE topic = 'dl'}),
	'... its message is removed with its chunk');
is($node->safe_psql('postgres', q{SELECT payload->>'note' || ' ' || (headers->>'x-trace') FROM outbox.dead_letters WHERE target = 'dl'}),
	'kept t1', '... the dead letter keeps payload and headers');
sink_control($sink, { path => '/dl', reset => JSON::PP::true });
sink_control($sink, { path => '/dl', keep_body => JSON::PP::true });
is($node->safe_psql('postgres', q{SELECT outbox.retry_dead_letters('dl')}), '1', 'retry_dead_letters');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.dead_letters WHERE target = 'dl'}),
	'... it is delivered');
my ($got) = grep { $_->{status} == 204 } sink_path_records($sink, '/dl');
is($got->{headers}{'webhook-id'}, $dl_id, '... with its message id as webhook-id');
is($got->{headers}{'x-trace'}, 't1', '... and its headers');
like($got->{body}, qr/"note": "kept"/, '... and its payload');

# --- replay of removed history is refused; ids keep rising ---
my ($out, $err) = ('', '');
$node->psql('postgres', q{SELECT outbox.replay('h', 1::bigint)}, stdout => \$out, stderr => \$err);
like($err, qr/messages from id 1 are no longer retained/, 'replay of removed messages is refused');
my $highest = $node->safe_psql('postgres', q{SELECT max(id_high_water) FROM outbox.state});
cmp_ok($highest, '>=', 1_000_000, 'outbox.state records the highest id removed');
# The NOTIFY target (every topic) paused: the message emitted next stays
# pending, so retention cannot remove it before it is looked up (CI on 18
# found it gone).
$node->safe_psql('postgres', q{SELECT outbox.pause_target('n')});
$node->restart;
my $next = $node->safe_psql('postgres', q{SELECT outbox_emit('after.restart', '{}')});
cmp_ok($node->safe_psql('postgres', qq{SELECT id FROM outbox.messages WHERE msg_id = '$next'}),
	'>', $highest,
	'after rotations and a restart new ids are above every id handed out');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
