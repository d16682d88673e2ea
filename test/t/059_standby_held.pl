# outbox.standby_slots holds delivery, never skips it, while a listed slot
# cannot confirm: a slot never created, one that is logical, its standby
# stopped, the slot dropped, the slot invalidated.  Each hold shows the
# slot and why in outbox.worker, outbox.lag (state and last_error),
# outbox.standby_status(), outbox.metrics() and one LOG line; delivery
# (and outbox.receive()) resumes by itself when the slot catches up or the
# setting changes.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;
use OutboxSession;

my $sink = start_sink('standby_held');

my ($primary, $standby) = standby_pair('held', logical => 1,
	conf => q{
outbox.standby_slots = 'standby1'
max_slot_wal_keep_size = 1MB
log_min_messages = info
},
	sql => qq{
SELECT pg_create_logical_replication_slot('logical1', 'test_decoding');
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$sink->{url}/held');
SELECT outbox.subscribe('t', 'm');
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'm');
});

sub q1 { return $primary->safe_psql('postgres', $_[0]); }

# Stop the standby, and wait until the primary's WAL sender has let go of
# its slot (it may hold it a moment longer).
sub stop_standby
{
	$standby->stop;
	$primary->poll_query_until('postgres',
		q{SELECT active FROM pg_replication_slots WHERE slot_name = 'standby1'}, 'f')
	  or die 'the slot of the stopped standby stays active';
}

sub delivered
{
	return scalar grep { $_->{status} == 204 } @{ sink_attempts($sink, '/held') };
}

# Take the queue's messages in one transaction: how many.
sub receive_all
{
	return q1(q{SELECT count(*) FROM outbox.receive('q', 1000)});
}

my $n = 0;

# Messages flow while the standby confirms.
q1(q{SELECT outbox_emit('m', '{"n": 1}')});
$n++;
ok(wait_until(sub { delivered() >= $n }), 'with its standby streaming, a message is delivered');
is(receive_all(), '1', '... and received');
is(q1(q{SELECT state || ' ' || (behind_bytes = 0) FROM outbox.standby_status()}), 'streaming true',
	'outbox.standby_status(): streaming, nothing behind');

# Emit one message, check it is held for $why ($state in
# outbox.standby_status()), fix it with $fix, check it is delivered.
sub held
{
	my ($label, $slot, $state, $log_why, $fix) = @_;
	my $offset = -s $primary->logfile;
	$primary->poll_query_until('postgres', q{SELECT pending FROM outbox.lag WHERE target = 't'}, '0');
	$n = delivered() + 1;
	q1(q{SELECT outbox_emit('m', '{"held": true}')});
	ok($primary->poll_query_until('postgres',
			q{SELECT state FROM outbox.worker}, 'waiting for standby'),
		"$label: the relay waits for the standby");
	usleep(300_000);    # a span: a message let through would be here now
	is(delivered(), $n - 1, "$label: the message is not delivered");
	is(receive_all(), '0', "$label: nor received");
	is(q1(q{SELECT standby_held_by FROM outbox.worker}), "$slot ($state)",
		"$label: outbox.worker names the slot and why");
	is(q1(q{SELECT state FROM outbox.lag WHERE target = 't'}), 'waiting for standby',
		"$label: outbox.lag: the target waits for the standby");
	ok($primary->poll_query_until('postgres', qq{SELECT last_error LIKE '%standby slot "$slot"%$state%'
		FROM outbox.lag WHERE target = 't'}), "$label: ... with the slot in its last_error");
	like(q1(q{SELECT outbox.metrics()}), qr/^outbox_standby_slot_up\{slot="$slot"\} 0$/m,
		"$label: outbox.metrics(): the slot is not up");
	is(q1(qq{SELECT state FROM outbox.standby_status() WHERE slot_name = '$slot'}), $state,
		"$label: outbox.standby_status()");
	my $log = substr(slurp_file($primary->logfile), $offset);
	my @lines = $log =~ /(outbox relay holds delivery: standby slot "\Q$slot\E" \Q$log_why\E)/g;
	is(scalar(@lines), 1, "$label: one LOG line says why");
	$fix->();
	ok(wait_until(sub { delivered() >= $n }), "$label: delivered once fixed");
	my $got = 0;
	ok(wait_until(sub { ($got += receive_all()) >= 1 }), "$label: ... and received");
	like(substr(slurp_file($primary->logfile), $offset), qr/outbox relay resumes delivery/,
		"$label: the resume is logged");
}

sub set_slots
{
	my ($v) = @_;
	q1("ALTER SYSTEM SET outbox.standby_slots = '$v'");
	$primary->reload;
	# what is emitted next is read under the new setting
	relay_reloaded($primary, 'postgres', 'outbox.standby_slots' => $v);
}


# A slot never created: listed by a reload.
set_slots('standby1, nosuch');
held('never created', 'nosuch', 'does not exist', 'does not exist', sub { set_slots('standby1') });

# A logical slot.
set_slots('logical1');
held('logical slot', 'logical1', 'not a physical slot', 'is not a physical replication slot',
	sub { set_slots('standby1') });

# The standby stopped.
stop_standby();
held('standby stopped', 'standby1', 'no standby connected', 'has no standby connected',
	sub {
		# A slot moved by hand is no standby's confirmation.
		q1(q{SELECT pg_replication_slot_advance('standby1', pg_current_wal_lsn())});
		usleep(300_000);    # a span: a message let through would be here now
		is(delivered(), $n - 1, 'standby stopped: a slot advanced by hand releases nothing');
		$standby->start;
	});

# The slot dropped (its standby stopped first), then made again.
stop_standby();
q1(q{SELECT pg_drop_replication_slot('standby1')});
held('slot dropped', 'standby1', 'does not exist', 'does not exist', sub {
	# (not reserving WAL: a slot's reserved position is no standby's)
	q1(q{SELECT pg_create_physical_replication_slot('standby1')});
	$standby->start;
});

# --- queue receipts across a restart, under the setting ---
# (review finding: a rebuilt window placed receipts only up to what the
# standbys had confirmed to a fresh backend, and forgot the rest: an
# acknowledged message was handed out again)
$primary->poll_query_until('postgres',
	q{SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'}, '1')
  or die 'the standby does not stream';
receive_all();
q1(q{SELECT outbox_emit('m', '{"r": 1}'); SELECT outbox_emit('m', '{"r": 2}')});
my $s = OutboxSession->new($primary, 'holder');
my $held_id = $s->run_ok(q{BEGIN; SELECT id FROM outbox.receive('q', 1, 60000);});
$held_id =~ /^\d+$/ or die "the holder received nothing ('$held_id')";
my $acked_id;
ok(wait_until(sub { $acked_id = q1(q{SELECT id FROM outbox.receive('q', 1)}); $acked_id ne '' }),
	'restart: a second session takes and acknowledges the next message');
$s->run_ok('ROLLBACK;');
$s->quit;
# The standby down across the restart: the first receive rebuilds the
# window while nothing is confirmed to the fresh backend.
stop_standby();
$primary->restart;
my @after;
my $take = sub { push @after, grep { $_ ne '' } split /,/, q1(q{SELECT string_agg(id::text, ',') FROM outbox.receive('q', 100)}) };
$take->();
$standby->start;
ok(wait_until(sub { $take->(); grep { $_ eq $held_id } @after }),
	'restart: the message rolled back is handed out again');
$take->();
is(join(',', @after), $held_id, "restart: only it ($held_id), not the acknowledged one ($acked_id)");

# --- DROP and CREATE EXTENSION under a session that received before ---
# (review finding: the session's gate kept the old ids' confirmed frontier
# and handed the new ids out unconfirmed)
my $old = OutboxSession->new($primary, 'old');
$old->run_ok(q{SELECT count(*) FROM outbox.receive('q', 100);});
q1('DROP EXTENSION outbox CASCADE');
$primary->poll_query_until('postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'outbox relay'}, '0')
  or die 'the relay did not exit after DROP EXTENSION';
q1(qq{CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$sink->{url}/held');
SELECT outbox.subscribe('t', 'm');
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'm');});
stop_standby();
q1(q{SELECT outbox_emit('m', '{"new": true}')});
usleep(300_000);    # a span: a message let through would be here now
is($old->run_ok(q{SELECT count(*) FROM outbox.receive('q', 100);}), '0',
	'recreated extension: a session that received before gets nothing its standby has not confirmed');
$standby->start;
ok(wait_until(sub { $old->run_ok(q{SELECT count(*) FROM outbox.receive('q', 100);}) eq '1' }),
	'... and gets it once the standby confirms');
$old->quit;

# (the relay, which looks at a slot without its standby every 100 ms, may
# not have seen the standby confirm yet)
ok($primary->poll_query_until('postgres', q{SELECT pending FROM outbox.lag WHERE target = 't'}, '0'),
	'... and the relay delivers it');

# The slot invalidated: its standby stopped, more WAL than
# max_slot_wal_keep_size written and checkpointed.  A message emitted
# before is held first because the standby is gone, then because the slot
# is invalidated: a LOG line and last_error for each reason.
stop_standby();
my $offset = -s $primary->logfile;
q1(q{SELECT outbox_emit('m', '{"while": "invalidated"}')});
ok($primary->poll_query_until('postgres', q{SELECT last_error LIKE '%standby slot "standby1"%no standby connected%'
		FROM outbox.lag WHERE target = 't'}), 'standby stopped: held, last_error says why');
q1(q{CREATE TABLE filler (x text)});
for (1 .. 4)
{
	q1(q{INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); SELECT pg_switch_wal();});
}
q1('CHECKPOINT');
ok($primary->poll_query_until('postgres',
		q{SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'standby1'}, 'lost'),
	'the slot is invalidated');
ok($primary->poll_query_until('postgres', q{SELECT last_error LIKE '%standby slot "standby1"%invalidated%'
		FROM outbox.lag WHERE target = 't'}), '... the held message now waits for the invalidated slot: last_error');
my @why = substr(slurp_file($primary->logfile), $offset) =~ /outbox relay holds delivery: standby slot "standby1" (.*)/g;
is_deeply(\@why, [ 'has no standby connected', 'was invalidated' ], '... and a LOG line for each reason');
my $before_fix = delivered();
set_slots('');
ok(wait_until(sub { delivered() > $before_fix }), '... delivered once the setting is emptied');
my $drained = 0;
ok(wait_until(sub { ($drained += receive_all()) >= 1 }), '... and received');
set_slots('standby1');
held('slot invalidated', 'standby1', 'invalidated', 'was invalidated', sub { set_slots('') });
like(slurp_file($primary->logfile), qr/outbox relay resumes delivery: outbox.standby_slots is empty/,
	'an emptied setting is named as the reason to resume');

relay_no_crash($primary);
stop_sink($sink);
done_testing();
