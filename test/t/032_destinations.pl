# Where requests may go: outbox.denied_destinations and
# outbox.allowed_destinations are checked at every connect, on the address
# libcurl dials, not only when a target is created:
#  - a target created for "localhost" while loopback was allowed delivers;
#    then 127.0.0.0/8 and ::1 are denied (a reload): nothing more reaches
#    the receiver, not even over a connection kept alive from before, the
#    error names the rule, the target is held (receiver-wide), nothing is
#    dead-lettered though max_attempts is small; when the rule is lifted,
#    every message arrives, exactly once, per key in order;
#  - a non-empty allowed list that does not name the host refuses it the
#    same way; naming the host (or its address) lets it flow;
#  - an allowed CIDR wins over a denied one;
#  - a target row written by hand with a URL the checks refuse is skipped
#    by the relay, with the reason in outbox.lag.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('dest');
my $port = $sink->{port};
my $node = relay_node('relay_dest');

$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('named', 'http://localhost:$port/named', lanes => 2,
	max_attempts => 2);
SELECT outbox.subscribe('named', 'dest');
});

my $n = 0;
sub emit_some
{
	my ($count) = @_;
	my $sql = join '',
	  map { $n++; "SELECT outbox_emit('dest', '{\"n\": $n}', 'k" . ($n % 3) . "');\n" }
	  1 .. $count;
	$node->safe_psql('postgres', "BEGIN;\n$sql COMMIT;");
}

sub delivered_2xx
{
	return scalar grep { $_->{status} >= 200 && $_->{status} < 300 }
	  @{ sink_attempts($sink) };
}

emit_some(5);
ok(wait_until(sub { delivered_2xx() >= 5 }), 'loopback is allowed by default: delivered');

sub reload_with
{
	my ($denied, $allowed) = @_;
	$node->safe_psql('postgres',
		    "ALTER SYSTEM SET outbox.denied_destinations = '$denied';"
		  . "ALTER SYSTEM SET outbox.allowed_destinations = '$allowed';");
	$node->reload;
	# Every backend, the relay among them, reads the file at its next turn.
	relay_reloaded($node, 'postgres',
		'outbox.denied_destinations' => $denied,
		'outbox.allowed_destinations' => $allowed);
}

# Wait until the relay has tried (and been refused) $n more times.
sub refused_again
{
	my ($n) = @_;
	my $q = q{SELECT failed_attempts FROM outbox.lag WHERE target = 'named'};
	my $from = $node->safe_psql('postgres', $q);
	return wait_for("$n more refused attempts",
		sub { my $f = $node->safe_psql('postgres', $q); ($f >= $from + $n, "$f failed attempts, from $from") });
}

# Deny loopback while a kept-alive connection to the receiver is open.
my $before = scalar @{ sink_attempts($sink) };
reload_with('127.0.0.0/8, ::1/128', '');
emit_some(10);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT last_error FROM outbox.lag WHERE target = 'named'}) =~
			  /denied by outbox\.denied_destinations entry "(127\.0\.0\.0\/8|::1\/128)"/;
		}),
	'the error names the rule (localhost is 127.0.0.1 and ::1)');
like(
	$node->safe_psql('postgres', q{SELECT last_error FROM outbox.lag WHERE target = 'named'}),
	qr/^connection refused by the relay: (127\.0\.0\.1|::1) is denied/,
	'it says the relay refused the connection, and to which address');
# It tries (and is refused) several times.
refused_again(3) or die 'the relay did not try again';
is(scalar @{ sink_attempts($sink) }, $before, 'nothing reached the receiver, not even over a kept-alive connection');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', 'nothing is dead-lettered (a refused connect holds the target)');
is($node->safe_psql('postgres', q{SELECT state FROM outbox.lag WHERE target = 'named'}),
	'failing', 'the target shows as failing');
like($node->safe_psql('postgres', q{SELECT pending FROM outbox.lag WHERE target = 'named'}),
	qr/^[1-9]/, 'its messages wait');

# Creating a target for a denied address is refused too.
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT outbox.create_http_target('other', 'http://127.0.0.1:$port/other')");
like($err, qr/is not an allowed destination/, 'a new target to a denied address is refused');

# An allowed CIDR wins over the denied one.
reload_with('127.0.0.0/8, ::1/128', '127.0.0.1/32, ::1/128');
ok(wait_until(sub { delivered_2xx() >= 15 }), 'an allowed CIDR wins over a denied one: all 15 delivered');

# localhost is ::1 and 127.0.0.1: with only 127.0.0.1 allowed, the refused
# ::1 does not fail a request that goes through 127.0.0.1.
reload_with('127.0.0.0/8, ::1/128', '127.0.0.1/32');
emit_some(3);
ok(wait_until(sub { delivered_2xx() >= 18 }), 'one address of a name refused, another allowed: delivered');
ok( wait_until(
		sub { $node->safe_psql('postgres', q{SELECT state FROM outbox.lag WHERE target = 'named'}) eq 'idle' }),
	'and the target is idle, not failing');

# A non-empty allowed list that does not name the host refuses it.
reload_with('169.254.0.0/16', 'hooks.test, 10.0.0.0/8');
emit_some(5);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT last_error FROM outbox.lag WHERE target = 'named'}) =~
			  /is not in outbox\.allowed_destinations/;
		}),
	'a host the allowed list does not name is refused');
refused_again(2) or die 'the relay did not try again';
is(delivered_2xx(), 18, 'and nothing more was delivered');

# Naming the host lets it flow.
reload_with('169.254.0.0/16', 'hooks.test, localhost');
ok(wait_until(sub { delivered_2xx() >= 23 }), 'the allowed host name lets it flow');

# Back to the defaults; everything arrived exactly once, per key in order.
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET outbox.denied_destinations; ALTER SYSTEM RESET outbox.allowed_destinations;');
$node->reload;
emit_some(5);
ok(wait_until(sub { delivered_2xx() >= 28 }), 'defaults again: delivered');
my %expected;
my $ids = $node->safe_psql('postgres',
	q{SELECT coalesce(key, '-') || ' ' || id FROM outbox.messages WHERE topic = 'dest' ORDER BY id});
for my $line (split /\n/, $ids)
{
	my ($k, $id) = split / /, $line;
	push @{ $expected{$k} }, $id;
}
my @problems = check_key_fifo(sink_attempts($sink), \%expected, 5);
is_deeply(\@problems, [], 'each message exactly once, per key in order');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'),
	'0', 'still no dead letter');

# Rows stored by an earlier version (or restored) whose key or header value
# outbox_emit() now refuses are not sent raw in HTTP headers: they become
# dead letters, and the messages after them are delivered.
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.messages (id, msg_id, topic, key, payload, headers, emitted_at)
SELECT max(id) + 1, gen_random_uuid(), 'dest', E'old\u0085key', '{"legacy": 1}', NULL, now()
  FROM outbox.messages;
INSERT INTO outbox.messages (id, msg_id, topic, key, payload, headers, emitted_at)
SELECT max(id) + 1, gen_random_uuid(), 'dest', 'k1', '{"legacy": 2}', '{"x-old": "v\u2028w"}', now()
  FROM outbox.messages;
});
emit_some(1);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT count(*) FROM outbox.dead_letters WHERE last_error ~ 'HTTP headers cannot carry'}) eq '2';
		}),
	'a stored key or header value with U+0085 or U+2028 becomes a dead letter, not a raw header');
ok(wait_until(sub { delivered_2xx() >= 29 }), 'the message after them is delivered');
ok(!(grep { ($_->{body} // '') =~ /legacy/ } @{ sink_records($sink) }),
	'neither was sent');

# A row written by hand with a URL the checks refuse is not delivered.
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.targets (name, kind, url) VALUES ('sneaky', 'http', 'http://user:pw@127.0.0.1:9/');
INSERT INTO outbox.progress (target_id, lane, done_id)
SELECT id, 0, outbox.frontier() FROM outbox.targets WHERE name = 'sneaky';
SELECT outbox.config_changed();
});
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT last_error FROM outbox.lag WHERE target = 'sneaky'}) =~
			  /target is not delivered: url: The URL carries credentials/;
		}),
	'a hand-written row with credentials in its URL is skipped, and outbox.lag says why');

relay_no_crash($node);
$node->stop;
stop_sink($sink);
done_testing();
