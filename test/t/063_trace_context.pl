# W3C Trace Context end to end (issue 29, item 3): a transaction that sets
# outbox.traceparent and outbox.tracestate gives every message it emits and
# every change it makes to a captured table, in trigger and in WAL mode,
# the traceparent and tracestate headers, which reach the HTTP receiver as
# headers.  WAL capture learns the trace from a transactional logical
# message the transaction writes at commit:
#  - a transaction that sets no trace writes none (its WAL is checked);
#  - a change made before the trace was set in the transaction gets it in
#    WAL mode (the trace in effect at commit covers the whole transaction),
#    and one made in a transaction handed off in several parts too;
#  - a forged, malformed message of the same prefix is not trusted: the
#    changes go without a trace, with a warning.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $node = relay_node('trace', conf => q{
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
});
allow_output_plugins($node);
sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $sink = start_sink('trace');
my $url = $sink->{url};
my $tp1 = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
my $ts1 = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
my $tp2 = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00';

q1(qq{
CREATE TABLE trig (id int PRIMARY KEY, v text);
CREATE TABLE wal (id int PRIMARY KEY, v text);
SELECT outbox.capture('trig');
SELECT outbox.capture('wal', mode => 'wal');
SELECT outbox.create_http_target('t', '$url/t');
SELECT outbox.subscribe('t', '*');
});

# Without a trace no logical message is written (test_decoding reads the
# WAL from here on, at the end).
q1(q{SELECT pg_create_logical_replication_slot('peek', 'test_decoding')});
q1(q{INSERT INTO wal VALUES (1, 'untraced'); INSERT INTO trig VALUES (1, 'untraced');
SELECT outbox_emit('e.untraced', '{}', 'k1');});

# A traced transaction: a WAL change before the SET LOCAL too.
q1(qq{
BEGIN;
INSERT INTO wal VALUES (2, 'before the trace');
SET LOCAL outbox.traceparent = '$tp1';
SET LOCAL outbox.tracestate = '$ts1';
INSERT INTO wal VALUES (3, 'traced');
INSERT INTO trig VALUES (2, 'traced');
SELECT outbox_emit('e.traced', '{}', 'k2');
COMMIT;
});
my $after = q1('SELECT pg_current_wal_lsn()');

# A forged message of the prefix, malformed: the changes go untraced.
q1(q{
BEGIN;
INSERT INTO wal VALUES (4, 'forged');
SELECT pg_logical_emit_message(true, 'outbox-trace', E'00-zz\nnot=a=state') IS NOT NULL;
COMMIT;
});

# A traceparent without a tracestate, in a transaction handed off in
# parts (outbox.test_fault capture_small_parts: 100 changes a part; set by
# a restart, so that the capture worker has it from its start).
q1(q{ALTER SYSTEM SET outbox.test_fault = 'capture_small_parts'});
$node->restart;
q1(qq{
BEGIN;
SET LOCAL outbox.traceparent = '$tp2';
INSERT INTO wal SELECT g, 'big' FROM generate_series(100, 349) g;
COMMIT;
});

my $n = 3 + 4 + 1 + 250;
# (at least once: a message on the wire at the restart may come again,
# under its id; each is counted once)
my @r;
wait_for("all $n messages at the receiver", sub {
	my %seen;
	@r = grep { !$seen{ $_->{headers}{'webhook-id'} // '' }++ } sink_path_records($sink, '/t');
	(@r >= $n, scalar(@r) . ' distinct') });
is(scalar(@r), $n, "all $n messages arrived");

my %got;
for my $r (@r)
{
	my $h = $r->{headers};
	my $what = ($h->{'outbox-topic'} // '?') . ' ' . ($h->{'outbox-key'} // '-');
	$got{$what} = [ $h->{traceparent}, $h->{tracestate} ];
}
my $tbl_wal = 'public.wal';
is_deeply($got{'e.untraced k1'}, [ undef, undef ], 'an untraced emit has no trace headers');
is_deeply($got{'public.trig 1'}, [ undef, undef ], 'an untraced trigger capture has none');
is_deeply($got{'public.wal 1'}, [ undef, undef ], 'an untraced WAL capture has none');
is_deeply($got{'e.traced k2'}, [ $tp1, $ts1 ], 'outbox_emit: traceparent and tracestate');
is_deeply($got{'public.trig 2'}, [ $tp1, $ts1 ], 'trigger capture: traceparent and tracestate');
is_deeply($got{'public.wal 3'}, [ $tp1, $ts1 ], 'WAL capture: traceparent and tracestate');
is_deeply($got{'public.wal 2'}, [ $tp1, $ts1 ],
	'WAL capture: a change made before the trace was set gets the commit-time trace');
is_deeply($got{'public.wal 4'}, [ undef, undef ], 'a forged, malformed trace message is not trusted');
my @big = grep { ($_->{headers}{'outbox-key'} // 0) >= 100 } @r;
is(scalar(@big), 250, 'the transaction handed off in parts arrived whole');
is(scalar(grep { ($_->{headers}{traceparent} // '') eq $tp2 && !defined $_->{headers}{tracestate} } @big),
	250, 'every part carries the traceparent, and no tracestate');
like(slurp_file($node->logfile), qr/outbox capture: the trace context written at .* is malformed/,
	'the forged message is logged');

# test_decoding's view of the WAL: the untraced transaction wrote no
# logical message, the traced one exactly one.
my $msgs = q1(qq{
SELECT count(*) FILTER (WHERE data LIKE 'message: transactional: 1 prefix: outbox-trace%'),
	   count(*) FILTER (WHERE data LIKE 'table public.wal: INSERT%')
  FROM pg_logical_slot_peek_changes('peek', '$after', NULL)});
is($msgs, '1|3', 'test_decoding sees one trace message, in the traced transaction only');

stop_sink($sink);
relay_no_crash($node);
done_testing();
