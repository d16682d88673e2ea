# "A failing message blocks only its lane" (DESIGN.md, Lanes): a receiver
# that keeps failing the messages of one key (503, retried forever) must
# not hold up the other keys of the target, even after that key's backlog
# grew beyond what the relay keeps queued per target (10,000 messages).
#
# The sink answers 503 to every request with outbox-key "stuck", 204 to
# the others.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('stuck');
ok(sink_control($sink, { key => 'stuck', status => 503 }), 'the receiver runs');

# Requests of key $key the sink answered 204.
sub delivered_of
{
	my ($key) = @_;
	return scalar grep { $_->{key} eq $key && $_->{status} == 204 } @{ sink_attempts($sink, '/in') };
}

my $node = relay_node('relay_stuck');
# A key in another lane than "stuck" (of 2).
my $good = $node->safe_psql(
	'postgres', q{
SELECT k FROM (SELECT 'good-' || g AS k FROM generate_series(1, 50) g) s
 WHERE outbox.lane_of(k, 0, 2) <> outbox.lane_of('stuck', 0, 2) ORDER BY k LIMIT 1});
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('t', '$sink->{url}/in', lanes => 2, max_attempts => 0);
SELECT outbox.subscribe('t', '*');
COMMIT;
});

$node->safe_psql('postgres', qq{SELECT count(outbox_emit('x', '{}', '$good')) FROM generate_series(1, 5)});
ok(wait_until(sub { delivered_of($good) >= 5 }),
	'the good key is delivered');

$node->safe_psql('postgres', q{SELECT count(outbox_emit('x', '{}', 'stuck')) FROM generate_series(1, 12000)});
$node->safe_psql('postgres', qq{SELECT count(outbox_emit('x', '{}', '$good')) FROM generate_series(1, 5)});
ok( wait_until(sub { delivered_of($good) >= 10 }),
	'with 12000 messages of a failing key pending, another lane\'s messages are still delivered');
note $node->safe_psql('postgres', q{SELECT format('pending %s, delivered %s, last error %s', pending, delivered, last_error) FROM outbox.lag});

# Two failing keys, in two lanes of four, hold more than three quarters of
# what the relay keeps read ahead for a target (5,000 and 3,000 of
# 10,000): the target puts off reading on until a quarter is free, but
# never more than 20 ms, so a third lane's messages are still read and
# delivered.
$node->safe_psql('postgres', q{SELECT outbox.drop_target('t')});

# A 4-lane target $name at /$name on topic $topic, with keys in lanes 0, 1
# and 2 (the sink told %$mode for the first two), 6,000 messages of the
# first and 3,000 of the second emitted; returns the three keys.
sub crowded_target
{
	my ($name, $topic, %mode) = @_;
	my @keys = map {
		my $lane = $_;
		$node->safe_psql(
			'postgres', qq{
SELECT k FROM (SELECT '$name-' || g AS k FROM generate_series(1, 200) g) s
 WHERE outbox.lane_of(k, 0, 4) = $lane ORDER BY k LIMIT 1})
	} (0, 1, 2);
	sink_control($sink, { key => $_, %mode }) for @keys[ 0, 1 ];
	$node->safe_psql(
		'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('$name', '$sink->{url}/$name', lanes => 4, max_attempts => 0);
SELECT outbox.subscribe('$name', '$topic');
COMMIT;
});
	$node->safe_psql('postgres',
		qq{SELECT count(outbox_emit('$topic', '{}', '$keys[0]')) FROM generate_series(1, 6000)});
	$node->safe_psql('postgres',
		qq{SELECT count(outbox_emit('$topic', '{}', '$keys[1]')) FROM generate_series(1, 3000)});
	return @keys;
}

my ($sa, $sb, $g4) = crowded_target('t4', 'y', status => 503);
sub delivered4
{
	return scalar grep { $_->{key} eq $g4 && $_->{status} == 204 && $_->{path} eq '/t4' }
	  @{ sink_attempts($sink, '/t4') };
}
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT count(*) FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
				   WHERE t.name = 't4' AND p.last_error IS NOT NULL}) >= 2;
		}),
	'both failing lanes are retrying');
$node->safe_psql('postgres', qq{SELECT count(outbox_emit('y', '{}', '$g4')) FROM generate_series(1, 5)});
ok(wait_until(sub { delivered4() >= 5 }),
	'with two failing lanes holding over three quarters of the read-ahead, a third lane is still served');
note $node->safe_psql('postgres', q{SELECT format('pending %s, delivered %s, last error %s', pending, delivered, last_error) FROM outbox.lag WHERE target = 't4'});

# The same with lanes that are slow, not failing (2 s a request, each a
# success): no attempt fails, and still the third lane is read within the
# 20 ms bound, not once the slow lanes have delivered a quarter.
$node->safe_psql('postgres', q{SELECT outbox.drop_target('t4')});
my ($slow_a, $slow_b, $g5) = crowded_target('t5', 'z', delay_ms => 2000);
ok( wait_until(
		sub {
			my %seen = map { $_->{key} => 1 } @{ sink_attempts($sink, '/t5') };
			return $seen{$slow_a} && $seen{$slow_b};
		}),
	'both slow lanes are sending');
$node->safe_psql('postgres', qq{SELECT count(outbox_emit('z', '{}', '$g5')) FROM generate_series(1, 5)});
ok( wait_until(
		sub {
			return 5 <= scalar grep { $_->{key} eq $g5 && $_->{status} == 204 } @{ sink_attempts($sink, '/t5') };
		}),
	'with two slow lanes holding over three quarters of the read-ahead, a third lane is still served');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('t5')});

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
