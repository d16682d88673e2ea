# Stable batch ids: a batch re-sent after a crash restart has the same
# webhook-id and the same messages.  A batch of 3 (fewer than batch_size,
# because only 3 were committed) is in flight when the server crashes;
# meanwhile more messages of the same lane commit.  After the restart the
# relay must send the same 3 again, not a larger batch under another id,
# and then the rest.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('batch_ids');
my $url = $sink->{url};
my $node = relay_node('batch_ids');
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('b', '$url/b', batch_size => 10, lanes => 1,
	timeout_ms => 3600000, max_attempts => 0);
SELECT outbox.subscribe('b', 'b');
});
# The receiver holds its answer to the first batch until after the crash.
sink_control($sink, { path => '/b', hold => JSON::PP::true });
$node->safe_psql('postgres', q{SELECT count(outbox_emit('b', jsonb_build_object('g', g), 'k')) FROM generate_series(1, 3) g});
my @r;
ok(wait_until(sub { @r = sink_path_records($sink, '/b'); @r >= 1 }), 'the first batch is on its way');
is($r[0]{headers}{'outbox-count'}, 3, '... with 3 messages');
$node->safe_psql('postgres', q{SELECT count(outbox_emit('b', jsonb_build_object('g', g), 'k')) FROM generate_series(4, 8) g});
$node->stop('immediate');
sink_control($sink, { path => '/b', hold => JSON::PP::false });
$node->start;
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'b'}),
	'after the crash everything is delivered');
@r = sink_path_records($sink, '/b');
cmp_ok(scalar @r, '>=', 3, 'the receiver saw the batch, its resend and the rest');
is($r[1]{headers}{'webhook-id'}, $r[0]{headers}{'webhook-id'}, 'the re-sent batch has the same webhook-id');
is($r[1]{body}, $r[0]{body}, '... and the same messages');
my $rest = 0;
$rest += $_->{headers}{'outbox-count'} for @r[ 2 .. $#r ];
is($rest, 5, 'the other 5 came in later batches');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
