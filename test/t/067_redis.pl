# Redis Streams targets against a real redis-server on loopback (an
# append-only file fsynced at every write):
#  - each message appended with XADD as the fields id, seq, topic, key,
#    headers, payload, under the stream template; outbox.lag, stats and
#    metrics count them;
#  - 20,000 messages over 200 keys, the relay killed (kill -9) and the
#    server killed and started again mid-stream: every message exactly
#    once in the stream (the de-duplication marks), per key in order;
#  - maxlen trims the stream; replay within the window appends nothing;
#  - held with the server's reason, nothing dead-lettered, and resumed
#    by itself: the server down, NOPERM (an ACL user), WRONGPASS, OOM
#    (maxmemory), WRONGTYPE on the target's own stream key; SCRIPT FLUSH
#    is taken in stride;
#  - a stream template with {key} for a message without key: a dead
#    letter, the others flow; pause/resume; destination rules.
use strict;
use POSIX ();
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxRedis;
use IO::Socket::INET;

my $redis = redis_start('single');
my $port = $redis->{port};
my $url = "redis://127.0.0.1:$port";

my $node = relay_node('redis');

sub lag
{
	my ($target, $col) = @_;
	return $node->safe_psql('postgres', qq{SELECT $col FROM outbox.lag WHERE target = '$target'});
}

# n messages over nkeys keys, in transactions of 10; topics a and b.
my $emitted = 0;
sub emit
{
	my ($n, $nkeys) = @_;
	my $sql = '';
	for my $i (1 .. $n)
	{
		$emitted++;
		my $key = 'k' . ($emitted % $nkeys);
		my $topic = $emitted % 3 ? 'a' : 'b';
		$sql .= "BEGIN;\n" if $i % 10 == 1;
		$sql .= qq{SELECT outbox_emit('$topic', '{"n": $emitted}', '$key', '{"x-trace": "t$emitted"}');\n};
		$sql .= "COMMIT;\n" if $i % 10 == 0 || $i == $n;
	}
	$node->safe_psql('postgres', $sql);
}

# Every seq once over the streams, per key in order; returns the entries.
sub check_streams
{
	my ($what, $want, @streams) = @_;
	my (@all, %seen, $dups, $disorder);
	for my $stream (@streams)
	{
		# a key's messages are in order within each stream they go to
		my %last;
		for my $e (@{ redis_entries($redis, $stream) })
		{
			push @all, $e;
			$dups++ if $seen{ $e->{seq} }++;
			$disorder++ if defined $last{ $e->{key} } && $last{ $e->{key} } >= $e->{seq};
			$last{ $e->{key} } = $e->{seq};
		}
	}
	is(scalar @all, $want, "$what: the streams hold $want messages");
	is($dups // 0, 0, "$what: none twice");
	is($disorder // 0, 0, "$what: per key in order");
	return \@all;
}

my $count;
sub total { my $n = 0; $n += redis_len($redis, $_) for @_; return $n; }

# --- delivery ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('rs', '$url', stream => 'orders:{topic}', lanes => 4,
		dedup_window => 3600);
	SELECT outbox.subscribe('rs', '*');
});
# (dedup_window an hour: the replay below sends everything again, however
# long the test took to get there)
emit(200, 20);
ok(wait_until(sub { total('orders:a', 'orders:b') >= 200 }), 'messages reach the streams');
my $all = check_streams('first 200', 200, 'orders:a', 'orders:b');
my ($e) = grep { $_->{seq} == 3 } @$all;
is($e->{topic}, 'b', 'the topic field');
is($e->{key}, 'k3', 'the key field');
is($e->{payload}, '{"n": 3}', 'the payload field');
is($e->{headers}, '{"x-trace": "t3"}', 'the headers field');
my $id = $node->safe_psql('postgres', q{SELECT msg_id FROM outbox.messages WHERE id = 3});
is($e->{id}, $id, 'the id field is the message id');
is(redis_len($redis, 'orders:b'), 66, 'the stream is the template with the topic');
like(redis_cmd($redis, 'GET', "orders:b:outbox-dedup:$id"), qr/^\d+-\d+$/,
	'the de-duplication mark holds the entry id');
my $ttl = redis_cmd($redis, 'TTL', "orders:b:outbox-dedup:$id");
ok($ttl > 3500 && $ttl <= 3600, "... and expires after dedup_window (TTL $ttl)");
ok(wait_until(sub { lag('rs', 'delivered') eq '200' }), 'outbox.lag counts them');
is(lag('rs', 'kind'), 'redis', '... as a redis target');
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT messages FROM outbox.stats WHERE target = 'rs'}) eq '200' }),
	'outbox.stats counts them');
like($node->safe_psql('postgres', q{SELECT outbox.metrics()}),
	qr/^outbox_delivered_messages_total\{target="rs"\} 200$/m, 'and outbox.metrics()');

# --- 20,000 over 200 keys: the relay and the server killed mid-stream ---
# (emitted while paused: however long emitting takes, the faults below
# come mid-stream)
$node->safe_psql('postgres', q{SELECT outbox.alter_target('rs', batch_size => 20, max_rate => 60)});
$node->safe_psql('postgres', q{SELECT outbox.pause_target('rs')});
emit(20000, 200);
$node->safe_psql('postgres', q{SELECT outbox.resume_target('rs')});
my $want = 20200;
ok(wait_until(sub { total('orders:a', 'orders:b') >= 3000 }), 'delivering');
my $pid = relay_worker_pid($node);
kill 'KILL', $pid;
my $at = total('orders:a', 'orders:b');
note("relay killed with $at of $want in the streams");
ok($at < 15000, 'the relay was killed mid-stream');
ok(wait_until(sub { total('orders:a', 'orders:b') >= $at + 2000 }), 'delivering after the relay restarted');
$at = total('orders:a', 'orders:b');
note("server killed with $at of $want in the streams");
ok($at < $want - 2000, 'the server is killed mid-stream');
redis_kill($redis);
ok(wait_until(sub { lag('rs', 'last_error') =~ /Redis at 127\.0\.0\.1:\d+|could not connect to Redis/ }),
	'the server down: last_error says so');
sleep 1;    # a span: the relay goes on meeting the server down (a hold: no attempt counts)
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0',
	'... and nothing is dead-lettered');
$redis = redis_start('single', port => $port, dir => $redis->{dir});
$node->safe_psql('postgres', q{SELECT outbox.alter_target('rs', max_rate => 0)});
ok(wait_until(sub { total('orders:a', 'orders:b') >= $want }),
	'after the server came back, everything arrives');
ok(wait_until(sub { lag('rs', 'pending') eq '0' }), 'nothing pending');
check_streams('relay and server killed', $want, 'orders:a', 'orders:b');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0', 'no dead letters');

# --- the relay killed while the server holds its commands unread ---
# The server is stopped (SIGSTOP) with requests on the wire, the relay is
# killed, the server goes on: it runs the commands the dead relay wrote,
# and the new relay sends the same messages again.  The marks keep them
# from being appended twice.
my $redis_pid = (redis_cmd($redis, 'INFO', 'server') =~ /process_id:(\d+)/)[0];
$count = total('orders:a', 'orders:b');
kill 'STOP', $redis_pid;
emit(200, 200);
$want += 200;
ok(wait_until(sub { lag('rs', 'in_flight') > 0 }), 'requests wait on the stopped server');
my $pid2 = relay_worker_pid($node);
kill 'KILL', $pid2;
ok(wait_until(sub { my $p = eval { relay_worker_pid_now($node) } // ''; $p ne '' && $p ne $pid2 }),
	'the relay was restarted');
kill 'CONT', $redis_pid;
ok(wait_until(sub { (eval { lag('rs', 'pending') } // '') eq '0' }), 'the server goes on: all delivered');
check_streams('relay killed with commands unread', $want, 'orders:a', 'orders:b');

# --- maxlen, a template without a key, replay ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('trim', '$url', stream => 'trim', maxlen => 100, dedup_window => 0);
	SELECT outbox.subscribe('trim', 'a');
	SELECT outbox.create_redis_target('bykey', '$url', stream => 'bykey:{key}', max_attempts => 2);
	SELECT outbox.subscribe('bykey', 'keyed');
	SELECT outbox_emit('keyed', '{"n": 1}', 'x');
	SELECT outbox_emit('keyed', '{"n": 2}');
	SELECT outbox_emit('keyed', '{"n": 3}', 'x');
});
emit(1500, 10);
ok(wait_until(sub { lag('trim', 'pending') eq '0' && lag('trim', 'delivered') eq '1000' }),
	'a trimmed stream: all delivered');
my $len = redis_len($redis, 'trim');
ok($len >= 100 && $len < 300, "maxlen trims the stream (XLEN $len for 1000 appended)");
is(redis_cmd($redis, 'EXISTS', 'trim:outbox-dedup:' . $node->safe_psql('postgres',
	q{SELECT msg_id FROM outbox.messages WHERE topic = 'a' ORDER BY id DESC LIMIT 1})), 0,
	'dedup_window 0 sets no marks');
ok(wait_until(sub { redis_len($redis, 'bykey:x') == 2 }), 'bykey: the keyed messages arrive');
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'bykey'}) eq '1' }),
	'a message without key under {key}: a dead letter');
like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'bykey'}),
	qr/the stream template has \{key\} and the message has no key/, '... with the reason');

# (rs takes every topic: what it had to append is in the streams first)
ok(wait_until(sub { lag('rs', 'pending') eq '0' }), 'rs has appended everything so far');
$count = total('orders:a', 'orders:b');
$node->safe_psql('postgres', q{SELECT outbox.replay('rs', now() - interval '1 hour')});
ok(wait_until(sub { lag('rs', 'pending') eq '0' }), 'replay: the relay sends everything again');
is(total('orders:a', 'orders:b'), $count, 'within the window the streams take none of it again');

# --- held with the server's reason, resumed by itself ---
# held(target, regex, fix): last_error matches while held, nothing is
# dead-lettered, and after fix() the messages waiting arrive.
sub held
{
	my ($what, $target, $stream, $re, $fix) = @_;
	my $before = redis_len($redis, $stream);
	$before = 0 if $before < 0;
	$node->safe_psql('postgres',
		q{SELECT outbox_emit('h', jsonb_build_object('n', g), 'k' || g) FROM generate_series(1, 10) g});
	ok(wait_until(sub { lag($target, q{state || ' ' || coalesce(last_error, '')}) =~ $re }),
		"$what: held, with the reason") or diag(lag($target, 'state, last_error'));
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM outbox.dead_letters WHERE target = '$target'}),
		'0', "$what: nothing dead-lettered");
	$fix->();
	ok(wait_until(sub { redis_len($redis, $stream) == $before + 10 }), "$what: resumed, all arrive");
}

redis_cmd($redis, 'ACL', 'SETUSER', 'relay', 'on', '>s3cret', '~other:*', '+@all');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('acl', 'redis://relay:s3cret\@127.0.0.1:$port', stream => 'held:{topic}');
	SELECT outbox.subscribe('acl', 'h');
});
held('NOPERM', 'acl', 'held:h', qr/^failing .*NOPERM/,
	sub { redis_cmd($redis, 'ACL', 'SETUSER', 'relay', '~held:*') });
is($node->safe_psql('postgres', qq{SELECT outbox.alter_target('acl', url => 'redis://relay:wrong\@127.0.0.1:$port')}),
	'1', 'a wrong password');
held('WRONGPASS', 'acl', 'held:h', qr/^failing .*Redis refused the credentials: WRONGPASS/,
	sub { $node->safe_psql('postgres', qq{SELECT outbox.alter_target('acl', url => 'redis://relay:s3cret\@127.0.0.1:$port')}) });
unlike(lag('acl', 'last_error') // '', qr/s3cret|wrong/, 'the password is never in last_error');

$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('wt', '$url', stream => 'wt:h');
	SELECT outbox.subscribe('wt', 'h');
});
# (a stream key of the target's own: WRONGTYPE is the target's; where the
# message's topic or key filled it in, the message's: test/t/070)
redis_cmd($redis, 'SET', 'wt:h', 'not a stream');
held('WRONGTYPE', 'wt', 'wt:h', qr/^failing .*WRONGTYPE/, sub { redis_cmd($redis, 'DEL', 'wt:h') });

redis_cmd($redis, 'CONFIG', 'SET', 'maxmemory', '1');
held('OOM', 'wt', 'wt:h', qr/^failing .*OOM/, sub { redis_cmd($redis, 'CONFIG', 'SET', 'maxmemory', '0') });

# SCRIPT FLUSH: the script is loaded again, nothing is lost.
redis_cmd($redis, 'SCRIPT', 'FLUSH');
my $wt = redis_len($redis, 'wt:h');
$node->safe_psql('postgres', q{SELECT outbox_emit('h', '{"n": 1}', 'k1')});
ok(wait_until(sub { redis_len($redis, 'wt:h') == $wt + 1 }), 'after SCRIPT FLUSH the message arrives');

# --- pause and resume ---
$node->safe_psql('postgres', q{SELECT outbox.pause_target('wt')});
$wt = redis_len($redis, 'wt:h');
$node->safe_psql('postgres', q{SELECT outbox_emit('h', '{"n": 1}', 'k1') FROM generate_series(1, 5)});
sleep 2;    # a span: a paused target would have appended by now
is(redis_len($redis, 'wt:h'), $wt, 'a paused target appends nothing');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('wt')});
ok(wait_until(sub { redis_len($redis, 'wt:h') == $wt + 5 }), 'resumed: it appends what waited');

# --- a host name: resolved in the background, each address tried ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('byname', 'redis://localhost:$port', stream => 'byname');
	SELECT outbox.subscribe('byname', 'named');
	SELECT outbox_emit('named', '{"n": 1}', 'k');
});
ok(wait_until(sub { redis_len($redis, 'byname') == 1 }), 'a host name (localhost): delivered')
  or diag(lag('byname', 'state, last_error'));

# --- a hostile server: deeply nested replies, far more than any answer ---
# It answers the handshake with arrays nested 8 deep, 16 wide (what
# hiredis's reader would build into gigabytes), on every connection (the
# relay's probes meet the same).  The relay refuses the first nested
# array: held, with the reason, its memory as before.
sub relay_hwm_kb
{
	my ($p) = @_;
	return (slurp_file("/proc/$p/status") =~ /^VmHWM:\s+(\d+)/m)[0];
}
my $hostile_port = PostgreSQL::Test::Cluster::get_free_port();
my $listener = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $hostile_port,
	Listen => 4, ReuseAddr => 1, Proto => 'tcp') or die "listen: $!";
my $parent = $$;
my $child = fork();
# (stopped however the test ends: it serves for ever)
END { kill 'KILL', $child if $child && $$ == $parent; }
if ($child == 0)
{
	$SIG{PIPE} = 'IGNORE';    # the relay hangs up mid-tree
	while (my $c = $listener->accept)
	{
		my $buf;
		sysread($c, $buf, 65536);
		# a tree 7 arrays deep (hiredis's deepest), 16 wide, integer
		# leaves, sent depth first until 50 MB have gone or the relay
		# hangs up
		my $budget = 50_000_000;
		my $out = '';
		my $tree;
		$tree = sub {
			my ($level) = @_;
			return if $budget <= 0;
			$out .= "*16\r\n";
			for (1 .. 16)
			{
				if ($level == 6) { $out .= ":1\r\n"; }
				else { $tree->($level + 1); }
				if (length($out) >= 65536)
				{
					if (!syswrite($c, $out)) { $budget = 0; return; }
					$budget -= length($out);
					$out = '';
				}
				return if $budget <= 0;
			}
		};
		$tree->(0);
		close $c;
	}
	POSIX::_exit(0);    # not the parent's END blocks
}
close $listener;
my $rpid = relay_worker_pid($node);
my $hwm = relay_hwm_kb($rpid);
$node->safe_psql('postgres', qq{
	SELECT outbox.create_redis_target('hostile', 'redis://127.0.0.1:$hostile_port', stream => 'h');
	SELECT outbox.subscribe('hostile', 'hostile');
	SELECT outbox_emit('hostile', '{"n": 1}', 'k');
});
ok(wait_until(sub { (lag('hostile', 'last_error') // '') =~ /sent what the relay cannot parse/ }),
	'a hostile server\'s nested replies: held, with the reason')
  or diag(lag('hostile', 'state, last_error'));
my $grown = relay_hwm_kb($rpid) - $hwm;
ok($grown < 20000, "... and the relay's memory did not grow with them ($grown kB)");
kill 'KILL', $child;
waitpid($child, 0);
$child = undef;    # reaped: its pid may be another process's now
$node->safe_psql('postgres', q{SELECT outbox.drop_target('hostile')});

# --- destination rules ---
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.0/8'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.0/8');
$wt = redis_len($redis, 'wt:h');
$node->safe_psql('postgres', q{SELECT outbox_emit('h', '{"n": 1}', 'k1')});
ok(wait_until(sub { lag('wt', 'last_error') =~ /connection refused by the relay: 127\.0\.0\.1 is denied/ }),
	'a denied server address is refused at connect');
is(redis_len($redis, 'wt:h'), $wt, 'nothing was appended');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
$node->reload;
ok(wait_until(sub { redis_len($redis, 'wt:h') == $wt + 1 }), 'allowed again: delivered');

relay_no_crash($node, $pid, $pid2);
$node->stop;
redis_stop($redis);
done_testing();
