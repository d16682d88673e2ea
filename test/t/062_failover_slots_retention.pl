# The capture slot's hold-back (061) must not cost the primary its capture
# when the listed standby is gone for long (PostgreSQL 17 and later).
#
# With outbox.standby_slots set, the capture slot is confirmed only as far
# as the standby flushed, so while the standby is down the capture slot
# retains WAL from there, as the standby's own slot does.  Under
# max_slot_wal_keep_size both would be invalidated at the same checkpoint,
# and the capture lost on the primary too.  Once the standby's slot is
# behind by more than half of max_slot_wal_keep_size, it is confirmed without waiting
# (one LOG line): the standby's slot is invalidated, the capture streams on.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

plan skip_all => 'the capture slot is held back for standbys only on PostgreSQL 17 and later (failover slots)'
  if PostgreSQL::Test::Cluster->new('probe')->pg_version < 17;

my ($primary, $standby) = standby_pair('keep', logical => 1,
	conf => "outbox.standby_slots = 'standby1'\nmax_slot_wal_keep_size = 64MB\n"
	  . "max_wal_size = 1GB\nautovacuum = off\n",
	sql => q{
CREATE EXTENSION outbox;
CREATE TABLE orders (id int PRIMARY KEY, note text);
CREATE TABLE filler (t text);
SELECT outbox.capture('orders', mode => 'wal', topic => 'orders');
});
my $slot = $primary->safe_psql('postgres', q{SELECT outbox.capture_slot_name()});
$primary->safe_psql('postgres', q{INSERT INTO orders SELECT g, 'x' FROM generate_series(1, 10) g});
ok($primary->poll_query_until('postgres',
		qq{SELECT s.confirmed_flush_lsn = p.end_lsn AND p.end_lsn > s.restart_lsn
		   FROM pg_replication_slots s, outbox.capture_progress p WHERE s.slot_name = '$slot'}),
	'with the standby streaming, the capture slot is confirmed up to the offset');

# A segment of WAL and more, with captured changes and a running-xacts
# record in it.
my $n = 1000;
sub more_wal
{
	$primary->safe_psql('postgres', qq{
INSERT INTO orders SELECT g, 'x' FROM generate_series($n, $n + 99) g;
INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 2000);
SELECT pg_log_standby_snapshot();
SELECT pg_switch_wal();
});
	$n += 100;
}

$standby->stop('fast');
my $offset = -s $primary->logfile;
# WAL until the capture slot is released.
my $released = wait_until(sub {
		more_wal();
		slurp_file($primary->logfile, $offset) =~
		  /outbox capture confirms replication slot "$slot" without waiting for the standbys: standby slot "standby1" is behind by more than half of max_slot_wal_keep_size/;
	}, undef, 0.2);
ok($released, 'with the standby down, the capture slot is released past half of max_slot_wal_keep_size (LOG)');

# More WAL, past max_slot_wal_keep_size, and a checkpoint: the standby's
# slot is invalidated, the capture slot is not.
more_wal() for 1 .. 6;
ok($primary->poll_query_until('postgres',
		qq{SELECT s.confirmed_flush_lsn = p.end_lsn
		   FROM pg_replication_slots s, outbox.capture_progress p WHERE s.slot_name = '$slot'}),
	'the capture slot is confirmed up to the offset');
$primary->safe_psql('postgres', 'CHECKPOINT');
is($primary->safe_psql('postgres',
		q{SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'standby1'}), 'lost',
	"the standby's slot is invalidated");
isnt($primary->safe_psql('postgres',
		qq{SELECT wal_status FROM pg_replication_slots WHERE slot_name = '$slot'}), 'lost',
	'the capture slot is not');
$primary->safe_psql('postgres', qq{INSERT INTO orders VALUES (999999, 'after')});
ok($primary->poll_query_until('postgres',
		q{SELECT count(*) > 0 FROM outbox.messages WHERE payload->'after'->>'id' = '999999'}),
	'the capture goes on');
is($primary->safe_psql('postgres', q{SELECT state FROM outbox.captures}), 'streaming',
	'... streaming');

relay_no_crash($primary);
done_testing();
