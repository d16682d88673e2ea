# NATS JetStream targets against a real nats-server -js on loopback:
#  - messages published with their id as Nats-Msg-Id, the headers and the
#    subject template, each waited for its JetStream acknowledgement;
#  - the relay killed (kill -9) mid-stream: the stream still holds every
#    message exactly once (duplicates taken by the stream's window), per
#    key in order;
#  - the server stopped and started again mid-stream: the same;
#  - a subject no stream takes (filled in from the topic): retried on
#    its lane with the subject named (issue 41), nothing dead-lettered
#    (unroutable_after is 10 minutes), and delivery resumes once a stream
#    exists;
#  - a message above the stream's max_msg_size: a dead letter, the rest
#    flow; retry_dead_letters after the limit is raised delivers it;
#  - pause/resume, alter_target (subject), replay (the stream takes the
#    replayed messages as duplicates within its window);
#  - outbox.denied_destinations refuses the server's address at connect;
#  - a backlog released into a new 64-lane target, four times: requests
#    sent while its connection is being made (on a thread of its own) are
#    all published once it is made; none waits for its timeout;
#  - bad arguments are refused with their reasons.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxNats;

my $nats = nats_start('single');
my $url = $nats->{url};
# (a duplicate window of an hour: the replay below sends everything again,
# however long the test took to get there)
nats_tool($url, 'create', 'ORDERS', 'orders.>', 1, -1, 3600);

my $node = relay_node('nats');

# --- bad arguments ---
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT outbox.create_nats_target('x', 'http://127.0.0.1:4222')});
like($err, qr/invalid NATS server URL.*\n.*DETAIL:  The URL is not usable: each server must be a nats:\/\/host:port or tls:\/\/host:port URL/,
	'an http:// URL is refused, with the reason');
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT outbox.create_nats_target('x', 'nats://u:p@127.0.0.1:4222/path')});
like($err, qr/a path or a query/, 'a URL with a path is refused');
# (credentials in the URL log in: test/t/073_nats_tls.pl)
for my $bad ('orders.*', 'orders..x', 'orders x', '.orders', 'orders.{id}', 'a.>')
{
	($rc, $out, $err) = $node->psql('postgres',
		qq{SELECT outbox.create_nats_target('x', '$url', subject => '$bad')});
	like($err, qr/invalid NATS subject/, "subject '$bad' is refused");
}
like($err, qr/HINT:  Give dot-separated tokens/, '... with a hint');
($rc, $out, $err) = $node->psql('postgres',
	qq{SELECT outbox.create_nats_target('x', '$url', batch_size => 0)});
like($err, qr/batch_size must be between 1 and 1000/, 'batch_size 0 is refused');

# --- delivery ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('js', '$url', subject => 'orders.{topic}', lanes => 4,
		max_attempts => 0);
	SELECT outbox.subscribe('js', '*');
});

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

# Every outbox seq once, per key in order; returns the count.
sub check_stream
{
	my ($what, $want) = @_;
	my $msgs = nats_dump($url, 'ORDERS');
	my (%seen, %last, $dups, $disorder);
	for my $m (@$msgs)
	{
		$dups++ if $seen{ $m->{oseq} }++;
		$disorder++ if defined $last{ $m->{key} } && $last{ $m->{key} } >= $m->{oseq};
		$last{ $m->{key} } = $m->{oseq};
	}
	is(scalar @$msgs, $want, "$what: the stream holds $want messages");
	is($dups // 0, 0, "$what: none twice");
	is($disorder // 0, 0, "$what: per key in order");
	return $msgs;
}

emit(200, 20);
ok(wait_until(sub { nats_count($url, 'ORDERS') >= 200 }), 'messages reach the stream');
my $msgs = check_stream('first 200', 200);
my ($m) = grep { $_->{oseq} == 3 } @$msgs;
is($m->{subject}, 'orders.b', 'the subject is the template with the topic');
is($m->{topic}, 'b', 'outbox-topic header');
is($m->{key}, 'k3', 'outbox-key header');
is($m->{payload}, '{"n": 3}', 'the payload is the body');
my $id = $node->safe_psql('postgres', q{SELECT msg_id FROM outbox.messages WHERE id = 3});
is($m->{id}, $id, 'Nats-Msg-Id is the message id');
ok($node->poll_query_until('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'js'}, '200'),
	'outbox.lag counts them');
is($node->safe_psql('postgres', q{SELECT kind FROM outbox.lag WHERE target = 'js'}), 'nats',
	'... as a nats target');
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT messages FROM outbox.stats WHERE target = 'js'}) eq '200';
		}),
	'outbox.stats counts them');
like($node->safe_psql('postgres', q{SELECT outbox.metrics()}),
	qr/^outbox_delivered_messages_total\{target="js"\} 200$/m, 'and outbox.metrics()');

# --- the relay killed mid-stream (slowed down, so that it is mid-stream) ---
# The messages are all committed before the relay starts on them (paused
# meanwhile), however long emitting takes.
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', batch_size => 10, max_rate => 40)});
$node->safe_psql('postgres', q{SELECT outbox.pause_target('js')});
emit(3000, 50);
$node->safe_psql('postgres', q{SELECT outbox.resume_target('js')});
ok(wait_until(sub { nats_count($url, 'ORDERS') >= 900 }), 'delivering');
my $pid = relay_worker_pid($node);
my $kill_log = -s $node->logfile;
kill 'KILL', $pid;
my $at = nats_count($url, 'ORDERS');
note("relay killed with $at of 3200 in the stream");
ok($at < 3000, 'the relay was killed mid-stream');
# (the rest at full speed, once the server is back from the crash restart;
# slowed again for the next fault)
$node->wait_for_log(qr/\(PID $pid\) was terminated by signal 9/, $kill_log);
$node->poll_query_until('postgres', 'SELECT true') or die 'the server did not come back';
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', max_rate => 0)});
ok(wait_until(sub { nats_count($url, 'ORDERS') >= 3200 }), 'after kill -9 of the relay, everything arrives');
sleep 1;    # a span: an extra copy would be here now
check_stream('relay killed', 3200);

# --- the server stopped and started mid-stream ---
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', max_rate => 40)});
$node->safe_psql('postgres', q{SELECT outbox.pause_target('js')});
emit(3000, 50);
$node->safe_psql('postgres', q{SELECT outbox.resume_target('js')});
ok(wait_until(sub { nats_count($url, 'ORDERS') >= 4000 }), 'delivering again');
$at = nats_count($url, 'ORDERS');
note("server killed with $at of 6200 in the stream");
ok($at < 5800, 'the server is killed mid-stream');
nats_kill($nats);
$at = nats_count($url, 'ORDERS');
ok($at < 0, 'the server is down');
sleep 1;    # a span: down for a while (the relay meets it down)
$nats = nats_start('single', port => $nats->{port}, dir => $nats->{dir});
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', max_rate => 0)});
ok(wait_until(sub { nats_count($url, 'ORDERS') >= 6200 }), 'after the server came back, everything arrives');
sleep 1;    # a span: an extra copy would be here now
check_stream('server killed', 6200);
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', batch_size => 100, max_rate => 0)});
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0', 'no dead letters');

# --- a subject no stream takes ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('nostream', '$url', subject => 'nowhere.{topic}');
	SELECT outbox.subscribe('nostream', 'a');
});
emit(30, 5);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT state || ' ' || coalesce(last_error, '') FROM outbox.lag WHERE target = 'nostream'})
			  =~ /^(?:retrying|delivering) no JetStream stream takes subject "nowhere\.a" \(no responders\)$/;
		}),
	'a subject no stream takes: retried, the subject named (it is filled in from the topic)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'nostream'}),
	'0', '... nothing dead-lettered');
nats_tool($url, 'create', 'NOWHERE', 'nowhere.>');
ok(wait_until(sub { nats_count($url, 'NOWHERE') == 20 }), 'once a stream exists, the held messages arrive');

# --- a message too large for the stream ---
nats_tool($url, 'create', 'SMALL', 'small.>', 1, 1000);
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('small', '$url', subject => 'small.{topic}', max_attempts => 3);
	SELECT outbox.subscribe('small', 'big');
	SELECT outbox_emit('big', '{"n": 1}', 'k');
	SELECT outbox_emit('big', jsonb_build_object('pad', repeat('x', 2000)), 'k');
	SELECT outbox_emit('big', '{"n": 3}', 'k');
});
ok(wait_until(sub { nats_count($url, 'SMALL') == 2 }), 'a message too large: the others flow');
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'small'})
			  =~ /JetStream error .*10054/;
		}),
	'it is a dead letter, with the stream\'s reason');
my $small = nats_dump($url, 'SMALL');
is(join(',', map { $_->{payload} } @$small), '{"n": 1},{"n": 3}', 'in order, without it');

# --- pause, resume, alter, replay ---
# (js takes every topic: what it had to publish is in the stream first)
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'js'}),
	'js has published everything so far');
$node->safe_psql('postgres', q{SELECT outbox.pause_target('js')});
my $before = nats_count($url, 'ORDERS');
emit(50, 5);
sleep 2;    # a span: a paused target would have published by now
is(nats_count($url, 'ORDERS'), $before, 'a paused target publishes nothing');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('js')});
ok(wait_until(sub { nats_count($url, 'ORDERS') == $before + 50 }), 'resumed: it publishes what waited');

is($node->safe_psql('postgres', q{SELECT outbox.alter_target('js', subject => 'orders.{key}.{topic}')}),
	'1', 'alter_target changes the subject');
emit(10, 5);
ok(wait_until(sub { nats_count($url, 'ORDERS') == $before + 60 }), 'delivered after the change');
$msgs = nats_dump($url, 'ORDERS');
like($msgs->[-1]{subject}, qr/^orders\.k\d\.[ab]$/, 'under the new subject');
($rc, $out, $err) = $node->psql('postgres', q{SELECT outbox.alter_target('js', headers => '{}')});
like($err, qr/Only HTTP targets have headers/, 'alter_target refuses HTTP options for a NATS target');

my $count = nats_count($url, 'ORDERS');
$node->safe_psql('postgres', q{SELECT outbox.replay('js', now() - interval '1 hour')});
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT pending FROM outbox.lag WHERE target = 'js'}) eq '0' }),
	'replay: the relay sends everything again');
is(nats_count($url, 'ORDERS'), $count, 'the stream takes the replayed messages as duplicates within its window');

# --- destination rules ---
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.0/8'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.0/8');
$before = nats_count($url, 'ORDERS');
emit(10, 5);
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT last_error FROM outbox.lag WHERE target = 'js'}) =~
			  /connection refused by the relay: 127\.0\.0\.1 is denied/;
		}),
	'a denied server address is refused at connect');
sleep 1;    # a span: a publish would be in the stream by now
is(nats_count($url, 'ORDERS'), $before, 'nothing was published');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
$node->reload;
ok(wait_until(sub { nats_count($url, 'ORDERS') == $before + 10 }), 'allowed again: delivered');

# --- new connections, many lanes waiting for them ---
# Each round a fresh target (so a fresh connection, made on a thread while
# its lanes' requests wait) takes a backlog released at once; a request
# still waiting once the connection is made would sit until timeout_ms
# (20 s) and count a retry.
$node->safe_psql('postgres', q{SELECT outbox.drop_target('js')});
nats_tool($url, 'create', 'MANY', 'many.>');
for my $round (1 .. 4)
{
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_nats_target('many$round', '$url', subject => 'many.{topic}',
			lanes => 64, batch_size => 500, timeout_ms => 20000, max_attempts => 0);
		SELECT outbox.pause_target('many$round');
		SELECT outbox.subscribe('many$round', 'm');
		SELECT count(outbox_emit('m', jsonb_build_object('n', g), 'k' || (g % 1000)))
		  FROM generate_series(1, 10000) g;
		SELECT outbox.resume_target('many$round');});
	ok(wait_until(sub { nats_count($url, 'MANY') >= 10000 * $round }),
		"round $round: the backlog reaches the stream");
	is($node->safe_psql('postgres',
			qq{SELECT format('%s retries, errors: %s', retries, coalesce(last_error, 'none')) FROM outbox.stats s
			   JOIN outbox.lag l USING (target) WHERE target = 'many$round'}),
		'0 retries, errors: none',
		"round $round: every request waiting for the new connection was published once it was made");
	$node->safe_psql('postgres', qq{SELECT outbox.drop_target('many$round')});
}

relay_no_crash($node, $pid);
$node->stop;
nats_stop($nats);
done_testing();
