# PostgreSQL 18's idle_replication_slot_timeout and WAL capture (issue 44).
#
# A capture slot left idle (its worker standing still without it: the test
# build's fault capture_off) longer than idle_replication_slot_timeout is
# invalidated by the next checkpoint.  The capture then says lost, with that
# reason in last_error (not max_slot_wal_keep_size's, the only reason it
# gave before), delivers nothing more, and uncapture() drops the slot.
#
# 15 to 17 have no such setting: skipped there (049 covers the invalidation
# by max_slot_wal_keep_size on every version).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

plan skip_all => 'idle_replication_slot_timeout needs PostgreSQL 18'
  if PostgreSQL::Test::Cluster->new('probe')->pg_version < 18;

my $node = relay_node('capture_idle', conf => q{
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
});
allow_output_plugins($node);

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1(q{CREATE TABLE items (id int PRIMARY KEY, v text);
SELECT outbox.capture('items', mode => 'wal');
INSERT INTO items VALUES (1, 'before');});
ok_wait('the first change is captured', sub {
	my $n = q1(q{SELECT count(*) FROM outbox.messages WHERE topic LIKE '%items%'});
	return ($n eq '1', "$n messages");
});
ok_wait('the capture streams', sub {
	my $r = q1('SELECT state FROM outbox.captures');
	return ($r eq 'streaming', $r);
});

# The worker stands still without its slot from its next start on.
q1(q{ALTER SYSTEM SET outbox.test_fault = 'capture_off'});
$node->restart;
ok_wait('the capture slot is idle (no process holds it)', sub {
	my $r = q1(q{SELECT coalesce(active_pid::text, 'none') || ' ' || coalesce(inactive_since::text, '')
		FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()});
	return (scalar($r =~ /^none \d/), $r);
});

# The shortest timeout this server takes (its unit), and a checkpoint
# until the slot is invalidated for being idle that long.
my $unit = q1(q{SELECT unit FROM pg_settings WHERE name = 'idle_replication_slot_timeout'});
my $timeout = $unit eq 'min' ? '1min' : '1s';
note "idle_replication_slot_timeout unit '$unit': set to $timeout";
q1(qq{ALTER SYSTEM SET idle_replication_slot_timeout = '$timeout'; SELECT pg_reload_conf();});
q1(q{INSERT INTO items VALUES (2, 'while idle')});
ok_wait('a checkpoint invalidates the idle slot (idle_timeout)', sub {
	q1('CHECKPOINT');
	my $r = q1(q{SELECT coalesce(invalidation_reason, 'valid')
		FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()});
	return ($r eq 'idle_timeout', $r);
});

# The worker takes its slot again: the capture is lost, and says why.
q1(q{ALTER SYSTEM RESET outbox.test_fault; ALTER SYSTEM RESET idle_replication_slot_timeout;
SELECT pg_reload_conf();});
ok_wait('the capture is lost', sub {
	my $r = q1(q{SELECT state || ': ' || coalesce(last_error, '') FROM outbox.captures});
	return (scalar($r =~ /^lost: /), $r);
});
like(q1('SELECT last_error FROM outbox.captures'),
	qr/replication slot "[^"]+" was invalidated: it was idle longer than idle_replication_slot_timeout/,
	'last_error names idle_replication_slot_timeout, not max_slot_wal_keep_size');
like(q1('SELECT last_error FROM outbox.capture_status()'),
	qr/replication slot "[^"]+" was invalidated: it was idle longer than idle_replication_slot_timeout/,
	'and so does the worker\'s own (outbox.capture_status())');
is(q1(q{SELECT count(*) FROM outbox.messages WHERE topic LIKE '%items%'}), '1',
	'nothing is captured from an invalidated slot');

q1(q{SELECT outbox.uncapture('items')});
ok_wait('uncapture drops the lost slot', sub {
	my $n = q1(q{SELECT count(*) FROM pg_replication_slots WHERE slot_name = outbox.capture_slot_name()});
	return ($n eq '0', "$n slots");
});

$node->stop;
done_testing();
