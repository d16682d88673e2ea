# Failures are classified by what the receiver says (README, "Failure
# classes"):
#  - receiver-wide (401, 404, 3xx ...): the endpoint is wrong, not the
#    message.  The target is held: nothing is dead-lettered however long it
#    lasts, one lane probes with backoff while the others wait, outbox.lag
#    shows the status and error, and once the receiver accepts requests
#    again everything is delivered, once, per key in order;
#  - message-level (422, 409 ...): a dead letter after one attempt, and the
#    lane goes on.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('classes');
my $url = $sink->{url};
my $node = relay_node('failure_classes');

$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('auth', '$url/auth', lanes => 4, max_attempts => 3);
SELECT outbox.subscribe('auth', 'auth');
SELECT outbox.create_http_target('gone', '$url/gone', lanes => 2, max_attempts => 2);
SELECT outbox.subscribe('gone', 'gone');
SELECT outbox.create_http_target('moved', '$url/moved', lanes => 1, max_attempts => 2);
SELECT outbox.subscribe('moved', 'moved');
SELECT outbox.create_http_target('rej', '$url/rej', lanes => 1);
SELECT outbox.subscribe('rej', 'rej');
});

# --- 401 while credentials are rotated ---
sink_control($sink, { path => '/auth', status => 401 });
sink_control($sink, { path => '/gone', status => 404 });
sink_control($sink, { path => '/moved', status => 301 });
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('auth', jsonb_build_object('n', g), 'k' || (g % 10))) FROM generate_series(1, 200) g});
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit(t, '{}', 'k' || g)) FROM generate_series(1, 20) g, unnest(ARRAY['gone', 'moved']) t});
ok( $node->poll_query_until(
		'postgres', q{SELECT last_status FROM outbox.lag WHERE target = 'auth'}, '401'),
	'401: outbox.lag shows the status');
# Each held target's receiver sees more requests than its max_attempts:
# a first request of each lane, then twice max_attempts probes (auth: 14,
# to have a few probes at the capped backoff as well).
my %want_probes = (auth => 14, gone => 2 + 2 * 2, moved => 1 + 2 * 2);
for my $t (sort keys %want_probes)
{
	wait_for("$want_probes{$t} requests at /$t",
		sub { my $n = sink_path_records($sink, "/$t"); ($n >= $want_probes{$t}, $n) })
	  or die "/$t got too few requests";
}
is( $node->safe_psql(
		'postgres',
		q{SELECT format('%s/%s/%s', pending, dead_letters, last_error LIKE 'HTTP 401%') FROM outbox.lag WHERE target = 'auth'}),
	'200/0/t',
	'401: nothing is dead-lettered, all 200 stay pending, the error is shown');
# One lane probes, each probe after the backoff of the one before (base
# 20 ms, doubled, capped at 500 ms, less up to half at random): from the
# first four requests (one a lane) and six probes on, every gap is at
# least 250 ms, on the receiver's own clock.  Lanes probing on their own
# would come closer together.
my @r = sink_path_records($sink, '/auth');
my @gaps = map { $r[$_]{mono} - $r[ $_ - 1 ]{mono} } 10 .. $#r;
my ($min_gap) = sort { $a <=> $b } @gaps;
cmp_ok($min_gap, '>=', 0.2,
	sprintf('401: the held target only probes, one lane at a time (gaps from the 10th request on: %s)',
		join(' ', map { sprintf '%.3f', $_ } @gaps)));
for my $t ('gone', 'moved')
{
	is( $node->safe_psql(
			'postgres', "SELECT format('%s/%s', pending, dead_letters) FROM outbox.lag WHERE target = '$t'"),
		'20/0', "$t: a receiver-wide failure dead-letters nothing past max_attempts");
}
ok($node->poll_query_until('postgres', q{SELECT last_status FROM outbox.lag WHERE target = 'moved'}, '301'),
	'3xx is not followed and holds the target');

sink_control($sink, { path => '/auth', status => 204 });
sink_control($sink, { path => '/gone', status => 204 });
sink_control($sink, { path => '/moved', status => 204 });
ok( $node->poll_query_until(
		'postgres',
		q{SELECT bool_and(pending = 0 AND dead_letters = 0) FROM outbox.lag WHERE target IN ('auth', 'gone', 'moved')}),
	'once the receiver accepts requests everything is delivered');

my %expected;
for (split /\n/, $node->safe_psql('postgres',
	q{SELECT id, key FROM outbox.messages WHERE topic = 'auth' ORDER BY id}))
{
	my ($id, $key) = split /\|/;
	push @{ $expected{$key} }, $id;
}
my @att = @{ sink_attempts($sink, '/auth') };
my @problems = check_key_fifo(\@att, \%expected);
is_deeply(\@problems, [], '... each message once, per key in order') or diag explain \@problems;

# --- message-level rejection ---
sink_control($sink, { path => '/rej', status => 422 });
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('rej', jsonb_build_object('n', g), 'kr')) FROM generate_series(1, 5) g});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) FILTER (WHERE attempts = 1 AND last_status = 422) FROM outbox.dead_letters WHERE target = 'rej'},
		'5'),
	'422: each message is a dead letter after one attempt, and the lane moves on');

# --- many lanes refused at once: one failed attempt, not one a lane ---
# Eight requests on the wire when the receiver turns them all away (a
# lost connection to a broker fails every lane the same way) tell one
# thing: the target is held with one attempt counted, so its backoff does
# not start at its longest.
sink_control($sink, { path => '/many', status => 404, hold => JSON::PP::true });
$node->safe_psql('postgres', qq{
	SELECT outbox.create_http_target('many', '$url/many', lanes => 8, max_attempts => 0);
	SELECT outbox.subscribe('many', 'many');
	SELECT count(outbox_emit('many', '{}', 'k' || g)) FROM generate_series(1, 64) g;});
ok(wait_for('eight requests held at the receiver',
		sub { my $n = $node->safe_psql('postgres', q{SELECT in_flight FROM outbox.stats WHERE target = 'many'}); ($n eq '8', $n) }),
	'eight lanes have a request on the wire');
sink_control($sink, { path => '/many', hold => JSON::PP::false });
ok(wait_for('the eight refusals taken',
		sub { my $r = $node->safe_psql('postgres', q{SELECT retries FROM outbox.stats WHERE target = 'many'}); ($r >= 8, "retries $r") }),
	'... all refused (404)');
# (each later probe adds one to both)
is($node->safe_psql('postgres', q{SELECT retries - failed_attempts FROM outbox.stats WHERE target = 'many'}), '7',
	'... held with one failed attempt counted for the eight, not eight');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
