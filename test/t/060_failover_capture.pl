# Change capture across a failover.
#
# Trigger capture writes its messages in the captured transaction, so they
# are replicated like any message and delivered under outbox.standby_slots:
# it carries on on the promoted server with nothing to do.  WAL capture
# decodes through a logical replication slot that exists only on the
# primary: after the promotion the capture shows state 'lost', with a
# reason that names the failover, and the documented recovery (uncapture,
# then capture again with a snapshot) captures on the promoted server.
# (From 17 on, a standby can keep a copy of the slot: 061.)
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;

my $sink = start_sink('failover_capture');
my $json = json_codec();

# The payloads delivered on $topic, in arrival order.
sub payloads
{
	my ($topic) = @_;
	return [ map { $json->decode($_->{body}) }
		  grep { $_->{path} eq '/fc' && defined $_->{status} && $_->{status} == 204
			  && ($_->{headers}{'outbox-topic'} // '') eq $topic } @{ sink_records($sink) } ];
}

my ($primary, $standby) = standby_pair('fc', logical => 1,
	conf => "outbox.standby_slots = 'standby1'\n",
	sql => qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$sink->{url}/fc');
SELECT outbox.subscribe('t', 'orders');
SELECT outbox.subscribe('t', 'items');
CREATE TABLE orders (id int PRIMARY KEY, note text);
CREATE TABLE items (id int PRIMARY KEY, note text);
SELECT outbox.capture('orders', mode => 'wal', topic => 'orders');
SELECT outbox.capture('items', topic => 'items');
});

$primary->safe_psql('postgres', q{
INSERT INTO orders SELECT g, 'before' FROM generate_series(1, 5) g;
INSERT INTO items SELECT g, 'before' FROM generate_series(1, 5) g;
});
ok(wait_until(sub { @{ payloads('orders') } >= 5 && @{ payloads('items') } >= 5 }),
	'on the primary both captures deliver');
is(join(' ', map { scalar @{ payloads($_) } } 'orders', 'items'), '5 5', '... each change once');
# Before 17 nothing copies the capture slot to a standby: said at once.
my $major = $primary->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int / 10000});
if ($major < 17)
{
	ok(wait_until(sub { slurp_file($primary->logfile) =~
			/WARNING:  WAL capture cannot follow a failover on PostgreSQL $major/ }),
		'before 17: a WARNING that WAL capture cannot follow a failover');
}
else
{
	is($primary->safe_psql('postgres',
			q{SELECT failover FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()}),
		't', '17 and later: the capture slot is a failover slot (061 follows it across a failover)');
}

# The primary dies; the standby is promoted.
$primary->stop('immediate');
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'no promotion';

# Trigger capture carries on.
$standby->safe_psql('postgres', q{INSERT INTO items VALUES (6, 'after')});
ok(wait_until(sub { grep { ($_->{after}{id} // 0) == 6 } @{ payloads('items') } }),
	'trigger capture carries on on the promoted server');

# WAL capture: lost, and says why.
ok($standby->poll_query_until('postgres',
		q{SELECT state FROM outbox.captures WHERE table_name = 'orders'::regclass}, 'lost'),
	'WAL capture: state lost on the promoted server');
like($standby->safe_psql('postgres',
		q{SELECT last_error FROM outbox.captures WHERE table_name = 'orders'::regclass}),
	qr/does not exist on this server \(after a failover .*capture the tables again with a snapshot/,
	'... with a reason that names the failover and the recovery');

# The documented recovery: uncapture, capture again with a snapshot.
$standby->safe_psql('postgres', q{
SELECT outbox.uncapture('orders');
SELECT outbox.capture('orders', mode => 'wal', topic => 'orders', snapshot => true);
});
$standby->safe_psql('postgres', q{INSERT INTO orders VALUES (6, 'after')});
# (the snapshot's rows and the insert are of different keys: they may
# arrive in any order, so all of them are waited for)
my @read;
ok( wait_until(
		sub {
			my $p = payloads('orders');
			@read = grep { $_->{op} eq 'read' } @$p;
			@read >= 5 && grep { $_->{op} eq 'insert' && ($_->{after}{id} // 0) == 6 } @$p;
		}),
	'after the recovery a new change is captured from the WAL');
is(scalar(@read), 5, '... and the snapshot carried every row there (op "read")');
is($standby->safe_psql('postgres',
		q{SELECT state FROM outbox.captures WHERE table_name = 'orders'::regclass}), 'streaming',
	'... and the capture streams');

relay_no_crash($standby);
stop_sink($sink);
done_testing();
