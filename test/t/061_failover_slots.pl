# WAL capture across a failover with failover slots (PostgreSQL 17 and
# later; on 15 and 16, 060 shows the capture lost and recovered).
#
# The capture slot is a failover slot, and a standby with
# sync_replication_slots keeps a copy of it, which the capture worker goes on
# from when the standby is promoted, with the offset that reached it.  The
# hand-off (messages and offset, in a transaction) and the slot's
# confirmation are apart, so a copy confirmed beyond the replicated offset
# would skip what lies between: with outbox.standby_slots set, the slot is
# confirmed only once those standbys have flushed the hand-off.
#
# The window, made to happen: a test fault holds a hand-off back until it is
# lifted;
# the standby receives the captured transaction, then its WAL sender is
# stopped (SIGSTOP), the hand-off commits on the primary alone, and the
# standby's copy of the slot is synchronized; the primary is killed -9 and
# the standby promoted.
# - without outbox.standby_slots the copy is confirmed beyond the offset:
#   the capture says so (state lost, with the reason), never skipping;
# - with it: every row of the promoted server is captured and delivered
#   exactly once (one msg_id a row), nothing it lacks is delivered, and the
#   capture goes on there.
# Also: a slot made before failover slots is converted, with a LOG line; a
# WARNING (and last_error) while no listed standby keeps a copy, and a LOG
# line once one does.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;

plan skip_all => 'failover slots need PostgreSQL 17 (060 tests 15 and 16: lost, then recovered)'
  if PostgreSQL::Test::Cluster->new('probe')->pg_version < 17;

my $sink = start_sink('failover_slots');
my $json = json_codec();

# The deliveries of captured changes to /$name: [{id, op, msg_id}].
sub deliveries
{
	my ($name) = @_;
	my @d;
	for my $r (@{ sink_records($sink) })
	{
		next unless $r->{path} eq "/$name" && defined $r->{status} && $r->{status} == 204;
		my $b = $json->decode($r->{body});
		push @d, { id => $b->{after}{id}, op => $b->{op}, msg_id => $r->{headers}{'webhook-id'} };
	}
	return \@d;
}

# Wait until $pattern appears in $node's log after $offset.
# Wait for $pattern in $node's log from $offset on (for the TAP library's
# time limit, or quietly for $short seconds, a try the caller repeats).
sub wait_log
{
	my ($node, $pattern, $offset, $short) = @_;
	return wait_for("$pattern in the log", sub { scalar(slurp_file($node->logfile, $offset) =~ $pattern) },
		defined $short ? (timeout => $short, quiet => 1) : ());
}

sub run
{
	my ($name, $gated) = @_;
	my ($primary, $standby) = standby_pair($name, logical => 1, slot_sync => 1,
		conf => "restart_after_crash = off\nautovacuum = off\n"
		  . ($gated ? "outbox.standby_slots = 'standby1'\n" : ''),
		# gated: the standby keeps no copy at first (the warning)
		standby_conf => 'sync_replication_slots = ' . ($gated ? 'off' : 'on') . "\n",
		sql => qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$sink->{url}/$name');
SELECT outbox.subscribe('t', 'orders');
CREATE TABLE orders (id int PRIMARY KEY, note text);
CREATE TABLE tick (t timestamptz DEFAULT now());
-- a capture slot made the way 0.3's first builds made it: no failover
SELECT pg_create_logical_replication_slot(outbox.capture_slot_name(), 'outbox');
SELECT outbox.capture('orders', mode => 'wal', topic => 'orders');
});
	my $slot = $primary->safe_psql('postgres', q{SELECT outbox.capture_slot_name()});
	my $ins = sub {
		my ($from, $to) = @_;
		$primary->safe_psql('postgres',
			"INSERT INTO orders SELECT g, 'x' FROM generate_series($from, $to) g");
	};

	$ins->(1, 20);
	ok(wait_until(sub { @{ deliveries($name) } >= 20 }), "$name: the capture delivers on the primary");
	is($primary->safe_psql('postgres',
			qq{SELECT failover FROM pg_replication_slots WHERE slot_name = '$slot'}), 't',
		"$name: the capture slot is a failover slot");
	like(slurp_file($primary->logfile), qr/outbox capture made replication slot "$slot" a failover slot/,
		"$name: ... converted by the worker, which says so");

	if ($gated)
	{
		ok(wait_log($primary, qr/WARNING:  no standby named by outbox.standby_slots keeps a copy of replication slot "$slot"/, 0),
			"$name: a WARNING while no listed standby keeps a copy of the slot");
		like($primary->safe_psql('postgres', q{SELECT last_error FROM outbox.captures}),
			qr/no standby named by outbox.standby_slots keeps a copy of the capture slot/,
			"$name: ... and outbox.captures says so");
		my $offset = -s $primary->logfile;
		$standby->append_conf('postgresql.conf', "sync_replication_slots = on\n");
		$standby->reload;
		ok(wait_log($primary, qr/keeps a copy of replication slot "$slot" now/, $offset),
			"$name: a LOG line once the standby keeps a copy");
		is($primary->safe_psql('postgres', q{SELECT last_error FROM outbox.captures}), '',
			"$name: ... and last_error is clear again");
	}
	# The standby's copy is ready once the slot on the primary moved past
	# where the copy began, which takes WAL (a write, a running-xacts
	# record) on an idle server.
	ok(wait_until(sub {
				$primary->safe_psql('postgres',
					q{INSERT INTO tick DEFAULT VALUES; SELECT pg_log_standby_snapshot()});
				$standby->safe_psql('postgres',
					qq{SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = '$slot'})
				  eq 't';
			}, undef, 0.5),
		"$name: the standby keeps a synchronized copy of the slot");
	$ins->(1000 + 10 * $_, 1009 + 10 * $_) for 0 .. 49;

	# The window: a late hand-off, the standby stopped after it received
	# the transaction, before the hand-off.  Ungated, the slot is confirmed
	# up to each offset at once, and an offset is written again when other
	# WAL comes (the relay's): the relay is paused, so that the copy can be
	# synchronized to the hand-off's offset, which the standby has.
	$primary->safe_psql('postgres', q{SELECT outbox.pause_target('t')}) unless $gated;
	$primary->safe_psql('postgres', q{ALTER SYSTEM SET outbox.test_fault = 'capture_slow_handoff'});
	$primary->reload;
	# (the capture worker takes the fault at a moment of its own: an insert
	# a try until one is held by it)
	my ($before, $n) = ('', 5000);
	my $offset = -s $primary->logfile;
	my $faulted = 0;
	my $give_up = time + $PostgreSQL::Test::Utils::timeout_default;
	while (!$faulted && time < $give_up)
	{
		$before = $primary->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
		$ins->($n, $n);
		$faulted = wait_log($primary, qr/test fault "capture_slow_handoff"/, $offset, 5);
		$n++;
	}
	ok($faulted, "$name: a hand-off is held by the fault");
	my $flush = $primary->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');
	ok($primary->poll_query_until('postgres',
			qq{SELECT bool_and(flush_lsn >= '$flush') FROM pg_stat_replication}),
		"$name: the standby has the captured transaction");
	my @walsenders = split /\n/, $primary->safe_psql('postgres', 'SELECT pid FROM pg_stat_replication');
	die "one WAL sender expected: @walsenders" unless @walsenders == 1;
	kill 'STOP', $walsenders[0];
	# the hand-off waits for the fault to be lifted
	$primary->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.test_fault});
	$primary->reload;
	ok($primary->poll_query_until('postgres',
			qq{SELECT end_lsn > '$before' FROM outbox.capture_progress}),
		"$name: the hand-off commits on the primary alone");
	my $handed = $primary->safe_psql('postgres', q{SELECT end_lsn FROM outbox.capture_progress});
	if ($gated)
	{
		# what the standby confirmed does not reach the hand-off: held
		ok($primary->safe_psql('postgres',
				qq{SELECT confirmed_flush_lsn < '$handed' FROM pg_replication_slots WHERE slot_name = '$slot'}) eq 't',
			"$name: the slot is not confirmed up to the hand-off the standby lacks");
	}
	else
	{
		ok($primary->poll_query_until('postgres',
				qq{SELECT confirmed_flush_lsn = '$handed' FROM pg_replication_slots WHERE slot_name = '$slot'}),
			"$name: the slot is confirmed up to the hand-off");
	}
	my $confirmed = $primary->safe_psql('postgres',
		qq{SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '$slot'});
	ok($standby->poll_query_until('postgres',
			qq{SELECT confirmed_flush_lsn = '$confirmed' FROM pg_replication_slots WHERE slot_name = '$slot'}),
		"$name: the standby's copy is synchronized to $confirmed");

	kill_all($primary);
	$standby->promote;
	$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'no promotion';
	return ($standby, $slot);
}

# Without outbox.standby_slots: the copy is ahead, and the capture says so.
{
	my ($standby, $slot) = run('ungated', 0);
	ok($standby->poll_query_until('postgres', q{SELECT state FROM outbox.captures}, 'lost'),
		'ungated: after the failover the capture is lost');
	like($standby->safe_psql('postgres', q{SELECT last_error FROM outbox.captures}),
		qr/"$slot" was copied from the old primary at \S+, past the handed-off offset \S+ that reached this server \(outbox.standby_slots was not set, or did not name this standby, when the slot was confirmed there\)/,
		'ungated: ... and says the copy is past the offset that reached this server');
	relay_no_crash($standby);
}

# With it: exactly once across the failover.
{
	my ($standby, $slot) = run('gated', 1);
	$standby->safe_psql('postgres', q{INSERT INTO orders SELECT g, 'after' FROM generate_series(9000, 9019) g});
	my @rows = split /\n/, $standby->safe_psql('postgres', q{SELECT id FROM orders ORDER BY id});
	my %held = map { $_ => 1 } @rows;
	ok(wait_until(sub {
				my %got = map { ($_->{id} => 1) } @{ deliveries('gated') };
				!grep { !$got{$_} } @rows;
			}),
		'gated: every row of the promoted server is captured and delivered');
	my (%ids, @extra);
	for my $d (@{ deliveries('gated') })
	{
		$ids{ $d->{id} }{ $d->{msg_id} } = 1;
		push @extra, $d->{id} unless $held{ $d->{id} };
	}
	my @twice = grep { keys %{ $ids{$_} } > 1 } sort { $a <=> $b } keys %ids;
	is_deeply(\@twice, [], 'gated: ... each once (one msg_id a row)');
	is_deeply(\@extra, [], 'gated: nothing delivered that the promoted server lacks');
	is($standby->safe_psql('postgres', q{SELECT state FROM outbox.captures}), 'streaming',
		'gated: the capture streams on the promoted server');

	# A listed slot that does not exist has no standby to keep a copy
	# for: the capture slot is confirmed at once (delivery is held).
	my $offset = -s $standby->logfile;
	$standby->append_conf('postgresql.conf', "outbox.standby_slots = 'nosuch'\n");
	$standby->reload;
	settings_reloaded($standby, 'postgres', 'outbox.standby_slots' => 'nosuch');
	# (the capture worker takes the setting at a moment of its own: a row a
	# try until a hand-off is confirmed under it)
	my $confirmed_anyway = 0;
	my $give_up = time + $PostgreSQL::Test::Utils::timeout_default;
	for (my $row = 9100; !$confirmed_anyway && time < $give_up; $row++)
	{
		$standby->safe_psql('postgres', "INSERT INTO orders VALUES ($row, 'held')");
		$confirmed_anyway = wait_log($standby, qr/outbox capture confirms replication slot "$slot" without waiting for the standbys: standby slot "nosuch" does not exist/, $offset, 5);
	}
	ok($confirmed_anyway,
		'gated: a listed slot that does not exist does not hold the capture slot back (LOG)');
	ok($standby->poll_query_until('postgres', qq{SELECT s.confirmed_flush_lsn = p.end_lsn
			FROM pg_replication_slots s, outbox.capture_progress p WHERE s.slot_name = '$slot'}),
		'gated: ... the slot is confirmed up to the offset');
	relay_no_crash($standby);
}

stop_sink($sink);
done_testing();
