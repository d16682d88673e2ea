# RabbitMQ targets against a real rabbitmq-server on loopback:
#  - each message published persistent and mandatory with message_id = its
#    id and the outbox headers, waited for the broker's confirm; outbox.lag,
#    stats and metrics count them;
#  - 20,000 messages over 200 keys into a quorum queue, the relay killed
#    (kill -9) and the broker killed and started again mid-stream: every
#    message there, per key in order, copies only with the same message_id;
#  - unroutable (no queue bound): held with the reason, delivered once a
#    queue is bound; an exchange that does not exist, access refused (a
#    user without rights, a wrong password): held, then resumed;
#  - a message above max_message_size: a dead letter, the rest flow;
#  - pause/resume, replay (copies with the same message_id), destination
#    rules.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxRabbitMQ;

# frame_max small: bodies go in several frames, and a message whose
# headers do not fit in one is a dead letter
my $rmq = rmq_start('single', conf => "max_message_size = 100000\nframe_max = 16384\n");
my $url = $rmq->{url};
rmq_tool($url, 'quorum', 'orders');

my $node = relay_node('rabbitmq');

sub lag
{
	my ($target, $col) = @_;
	return $node->safe_psql('postgres', qq{SELECT $col FROM outbox.lag WHERE target = '$target'});
}

# n messages over nkeys keys, in transactions of 10, topic 'orders'.
my $emitted = 0;
sub emit
{
	my ($n, $nkeys, $topic) = @_;
	$topic //= 'orders';
	my $sql = '';
	for my $i (1 .. $n)
	{
		$emitted++;
		my $key = 'k' . ($emitted % $nkeys);
		$sql .= "BEGIN;\n" if $i % 10 == 1;
		$sql .= qq{SELECT outbox_emit('$topic', '{"n": $emitted}', '$key', '{"x-trace": "t$emitted"}');\n};
		$sql .= "COMMIT;\n" if $i % 10 == 0 || $i == $n;
	}
	$node->safe_psql('postgres', $sql);
}

# Every seq there; copies only of the same message_id; per key, the first
# copies in order.  Returns the messages.
sub check_queue
{
	my ($what, $queue, $want) = @_;
	my $msgs = rmq_dump($url, $queue);
	my (%id_of, %last, $bad_copy, $disorder, %seen, $shown);
	for my $m (@$msgs)
	{
		if (exists $id_of{ $m->{seq} })
		{
			$bad_copy++ if $id_of{ $m->{seq} } ne $m->{message_id};
			next;
		}
		$id_of{ $m->{seq} } = $m->{message_id};
		if (defined $last{ $m->{key} } && $last{ $m->{key} } >= $m->{seq})
		{
			$disorder++;
			if (!$shown++)
			{
				my $k = $m->{key};
				diag("$what: key $k in queue order: "
					  . join(' ', map { $_->{seq} } grep { $_->{key} eq $k } @$msgs));
			}
		}
		$last{ $m->{key} } = $m->{seq};
	}
	is(scalar keys %id_of, $want, "$what: all $want messages are in the queue");
	is($bad_copy // 0, 0, "$what: copies only with the same message_id");
	is($disorder // 0, 0, "$what: per key in order");
	note("$what: " . scalar(@$msgs) . " messages in the queue for $want");
	return $msgs;
}

# --- delivery ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_rabbitmq_target('mq', '$url', routing_key => 'orders', lanes => 4,
		max_attempts => 0);
	SELECT outbox.subscribe('mq', 'orders');
});
emit(200, 20);
ok(wait_until(sub { rmq_count($url, 'orders') >= 200 }), 'messages reach the queue');
my $msgs = check_queue('first 200', 'orders', 200);
my ($m) = grep { $_->{seq} == 3 } @$msgs;
my $id = $node->safe_psql('postgres', q{SELECT msg_id FROM outbox.messages WHERE id = 3});
is($m->{message_id}, $id, 'message_id is the message id');
is($m->{webhook_id}, $id, '... and the webhook-id header');
is($m->{topic}, 'orders', 'outbox-topic header');
is($m->{key}, 'k3', 'outbox-key header');
is($m->{x_trace}, 't3', "the message's own header");
is($m->{payload}, '{"n": 3}', 'the payload is the body');
is($m->{delivery_mode}, 2, 'persistent');
is($m->{content_type}, 'application/json', 'content type');
is($m->{exchange}, '', 'through the default exchange');
ok(wait_until(sub { lag('mq', 'delivered') eq '200' }), 'outbox.lag counts them');
is(lag('mq', 'kind'), 'rabbitmq', '... as a rabbitmq target');
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT messages FROM outbox.stats WHERE target = 'mq'}) eq '200' }),
	'outbox.stats counts them');
like($node->safe_psql('postgres', q{SELECT outbox.metrics()}),
	qr/^outbox_delivered_messages_total\{target="mq"\} 200$/m, 'and outbox.metrics()');

# --- 20,000 over 200 keys: the relay and the broker killed mid-stream ---
# (into a queue of its own: the first 200, read without acknowledging and given
# back, may come back in another order after the broker restarts, which
# is the quorum queue's doing, not the relay's)
rmq_tool($url, 'quorum', 'crash');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('mq', routing_key => 'crash', batch_size => 20, max_rate => 60)});
# in transactions of 100, from the server itself (20,000 statements from
# psql take minutes on a loaded machine), while the target is paused (the
# faults below come mid-stream however long this takes)
$node->safe_psql('postgres', q{SELECT outbox.pause_target('mq')});
$node->safe_psql('postgres', qq{
	DO \$\$
	BEGIN
		FOR b IN 0 .. 199 LOOP
			PERFORM outbox_emit('orders', jsonb_build_object('n', g), 'k' || (g % 200),
								jsonb_build_object('x-trace', 't' || g))
			   FROM generate_series(b * 100 + 1, b * 100 + 100) g;
			COMMIT;
		END LOOP;
	END
	\$\$;
});
$node->safe_psql('postgres', q{SELECT outbox.resume_target('mq')});
my $want = 20000;
ok(wait_until(sub { rmq_count($url, 'crash') >= 3000 }), 'delivering');
my $pid = relay_worker_pid($node);
kill 'KILL', $pid;
my $at = rmq_count($url, 'crash');
note("relay killed with $at of $want in the queue");
ok($at < 15000, 'the relay was killed mid-stream');
ok(wait_until(sub { rmq_count($url, 'crash') >= $at + 2000 }), 'delivering after the relay restarted');
$at = rmq_count($url, 'crash');
note("broker killed with $at of $want in the queue");
ok($at < $want - 2000, 'the broker is killed mid-stream');
rmq_kill($rmq);
ok(wait_until(sub { (eval { lag('mq', 'last_error') } // '') =~ /could not connect to RabbitMQ|connection to RabbitMQ .*(closed|lost|reset)|RabbitMQ at \S+ closed/ }),
	'the broker down: last_error says so') or diag(eval { lag('mq', 'state, last_error') });
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0',
	'... and nothing is dead-lettered');
$rmq = rmq_start('single', again => $rmq);
$node->safe_psql('postgres', q{SELECT outbox.alter_target('mq', max_rate => 0)});
ok(wait_until(sub { lag('mq', 'pending') eq '0' }), 'after the broker came back, everything is delivered');
check_queue('relay and broker killed', 'crash', $want);
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0', 'no dead letters');

# The target's failed attempts that were tried again (outbox.stats): a
# copy in a queue is the broker's right only after one.
sub retries
{
	my ($target) = @_;
	return $node->safe_psql('postgres', qq{SELECT retries FROM outbox.stats WHERE target = '$target'});
}

# After a wait for at least $n messages in $queue: exactly $n, unless the
# target tried a publish again since $retries_before (a lost or late
# confirm may leave a copy).
sub exactly_unless_retried
{
	my ($queue, $n, $target, $retries_before, $what) = @_;
	my $count = rmq_count($url, $queue);
	my $retried = retries($target) - $retries_before;
	ok($retried > 0 || $count == $n,
		"$what: $count in the queue for $n" . ($retried > 0 ? " ($retried publishes tried again)" : ''));
}

# --- unroutable: retried on the lanes (a routing key filled in from the
# topic: the message's own, issue 41), then delivered once a queue is
# bound ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_rabbitmq_target('unrouted', '$url', routing_key => 'nowhere.{topic}');
	SELECT outbox.subscribe('unrouted', 'u');
});
emit(10, 5, 'u');
ok(wait_until(sub { lag('unrouted', q{state || ' ' || coalesce(last_error, '')}) =~
	/^(?:retrying|delivering) RabbitMQ returned the message as unroutable \(312 NO_ROUTE\): no queue is bound for routing key "nowhere\.u" on exchange ""$/ }),
	'a message no queue is bound for: retried, its routing key named')
  or diag(lag('unrouted', 'state, last_error'));
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters WHERE target = 'unrouted'}),
	'0', '... nothing dead-lettered');
rmq_tool($url, 'declare', 'nowhere.u');
ok(wait_until(sub { rmq_count($url, 'nowhere.u') >= 10 && lag('unrouted', 'pending') eq '0' }),
	'once a queue is bound, the held messages arrive');
check_queue('unroutable, then bound', 'nowhere.u', 10);

# --- an exchange that does not exist: held, then delivered ---
$node->safe_psql('postgres', qq{
	SELECT outbox.create_rabbitmq_target('byexchange', '$url', exchange => 'shop', routing_key => 'shop.{topic}');
	SELECT outbox.subscribe('byexchange', 'x');
});
emit(5, 5, 'x');
ok(wait_until(sub { lag('byexchange', 'last_error') =~ /404 NOT_FOUND - no exchange 'shop'/ }),
	'an exchange that does not exist: held, with the reason');
rmq_tool($url, 'exchange', 'shop', 'topic');
rmq_tool($url, 'declare', 'shop-all');
my $r0 = retries('byexchange');
rmq_tool($url, 'bind', 'shop-all', 'shop', 'shop.#');
ok(wait_until(sub { rmq_count($url, 'shop-all') >= 5 }), 'declared and bound: delivered');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'byexchange'}),
	'... and recorded');
exactly_unless_retried('shop-all', 5, 'byexchange', $r0, '... once each');
is(rmq_dump($url, 'shop-all')->[0]{routing_key}, 'shop.x', 'under the routing key template');

# --- a message above max_message_size: a dead letter ---
rmq_tool($url, 'declare', 'big');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_rabbitmq_target('big', '$url', routing_key => 'big', max_attempts => 100);
	SELECT outbox.subscribe('big', 'big');
	SELECT outbox_emit('big', '{"n": 1}', 'k');
	SELECT outbox_emit('big', jsonb_build_object('pad', repeat('x', 200000)), 'k');
	SELECT outbox_emit('big', '{"n": 3}', 'k');
});
ok(wait_until(sub { rmq_count($url, 'big') >= 2 }), 'a message too large: the others flow');
ok(wait_until(sub { $node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'big'}) =~
	/larger than configured max size 100000/ }), 'it is a dead letter, with the broker\'s reason');
is(join(',', map { $_->{payload} } @{ rmq_dump($url, 'big') }), '{"n": 1},{"n": 3}', 'in order, without it');

# --- headers larger than a frame: a dead letter, nothing half-written ---
$node->safe_psql('postgres', q{
	SELECT outbox_emit('big', '{"n": 6}', 'k2', jsonb_build_object('x-big', repeat('v', 20000)));
	SELECT outbox_emit('big', '{"n": 7}', 'k2');
});
ok(wait_until(sub { rmq_count($url, 'big') >= 3 }), 'headers larger than a frame: the next message flows');
ok(wait_until(sub { $node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'big' ORDER BY id DESC LIMIT 1}) =~
	/its headers do not fit in the broker's frame size/ }), '... and that one is a dead letter, with the reason');

# --- the broker stops reading (a memory alarm): the relay is not stuck ---
# Until the broker says it blocked the connection, a publish it holds
# ends as "no confirm" after the target's timeout (10 s), which counts as
# an attempt; on a busy machine the notice took 40 s, and at 3 attempts
# messages became dead letters.  The check is that they are not lost.
$node->safe_psql('postgres', q{SELECT outbox.alter_target('big', max_attempts => 1000)});
rmq_ctl($rmq, 'set_vm_memory_high_watermark', 'absolute', '1');
$node->safe_psql('postgres', q{
	SELECT outbox_emit('big', jsonb_build_object('pad', repeat('y', 90000)), 'k' || g) FROM generate_series(1, 40) g;
});
ok(wait_until(sub { lag('big', q{state || ' ' || coalesce(last_error, '')}) =~ /^failing .*(blocked|not reading|no confirm)/i }),
	'a broker that stopped reading: held, with the reason') or diag(lag('big', 'state, last_error'));
my $stuck = relay_worker_pid($node);
$node->safe_psql('postgres', qq{SELECT pg_terminate_backend($stuck)});
ok(wait_until(sub { my $p = eval { relay_worker_pid_now($node) } // ''; $p ne '' && $p ne $stuck }),
	'... and the relay still answers: terminated, it starts again');
rmq_ctl($rmq, 'set_vm_memory_high_watermark', '0.4');
ok(wait_until(sub { lag('big', 'pending') eq '0' }), 'the alarm cleared: the 40 are delivered')
  or diag(lag('big', 'state, last_error'));
my %big = map { ($_->{seq} // 0) => 1 } @{ rmq_dump($url, 'big') };
is(scalar(keys %big), 43, '... all of them in the queue (copies aside)') or do {
	my $want = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ' ' ORDER BY id) FROM outbox.messages WHERE topic = 'big'});
	diag('missing from the queue: ' . join(' ', grep { !$big{$_} } split / /, $want));
	diag('dead letters of big: ' . $node->safe_psql('postgres', q{SELECT string_agg(format('%s %s %s', id, attempts, last_error), '; ') FROM outbox.dead_letters WHERE target = 'big'}));
	diag('progress of big: ' . $node->safe_psql('postgres', q{SELECT string_agg(format('lane %s done %s delivered %s dead %s attempts %s', lane, done_id, delivered, dead, attempts), '; ') FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'big'}));
};

# --- access refused: held, then resumed ---
rmq_tool($url, 'declare', 'acl');
rmq_ctl($rmq, 'add_user', 'relay', 's3cret');
rmq_ctl($rmq, 'set_permissions', '-p', '/', 'relay', '^$', '^$', '^$');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_rabbitmq_target('acl', 'amqp://relay:s3cret\@127.0.0.1:$rmq->{port}', routing_key => 'acl');
	SELECT outbox.subscribe('acl', 'acl');
});
emit(5, 5, 'acl');
ok(wait_until(sub { lag('acl', 'last_error') =~ /403 ACCESS_REFUSED/ }),
	'no write permission: held, with the reason') or diag(lag('acl', 'state, last_error'));
rmq_ctl($rmq, 'set_permissions', '-p', '/', 'relay', '.*', '.*', '.*');
ok(wait_until(sub { rmq_count($url, 'acl') >= 5 }), 'permitted: delivered');
$node->safe_psql('postgres', qq{SELECT outbox.alter_target('acl', url => 'amqp://relay:wrong\@127.0.0.1:$rmq->{port}')});
emit(5, 5, 'acl');
ok(wait_until(sub { lag('acl', 'last_error') =~ /RabbitMQ refused the login/ }),
	'a wrong password: held, with the reason') or diag(lag('acl', 'state, last_error'));
unlike(lag('acl', 'last_error'), qr/s3cret|wrong/, 'the password is never in last_error');
$node->safe_psql('postgres', qq{SELECT outbox.alter_target('acl', url => 'amqp://relay:s3cret\@127.0.0.1:$rmq->{port}')});
ok(wait_until(sub { rmq_count($url, 'acl') >= 10 }), 'the right password again: delivered');

# --- pause, resume, replay ---
$node->safe_psql('postgres', q{SELECT outbox.pause_target('big')});
my $before = rmq_count($url, 'big');
$node->safe_psql('postgres', q{SELECT outbox_emit('big', '{"n": 4}', 'k')});
sleep 2;    # a span: a paused target would have published by now
is(rmq_count($url, 'big'), $before, 'a paused target publishes nothing');
$r0 = retries('big');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('big')});
ok(wait_until(sub { rmq_count($url, 'big') >= $before + 1 }), 'resumed: it publishes what waited');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'big'}),
	'... and records it');
exactly_unless_retried('big', $before + 1, 'big', $r0, '... once');
$r0 = retries('acl');
$node->safe_psql('postgres', q{SELECT outbox.replay('acl', now() - interval '1 hour')});
ok(wait_until(sub { rmq_count($url, 'acl') >= 20 }), 'replay: the messages are published again');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'acl'}),
	'... and recorded');
exactly_unless_retried('acl', 20, 'acl', $r0, '... once more each');
check_queue('replayed', 'acl', 10);

# --- destination rules ---
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.0/8'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.0/8');
$before = rmq_count($url, 'big');
$node->safe_psql('postgres', q{SELECT outbox_emit('big', '{"n": 5}', 'k')});
ok(wait_until(sub { lag('big', 'last_error') =~ /connection refused by the relay: 127\.0\.0\.1 is denied/ }),
	'a denied broker address is refused at connect');
is(rmq_count($url, 'big'), $before, 'nothing was published');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
$node->reload;
ok(wait_until(sub { rmq_count($url, 'big') >= $before + 1 }), 'allowed again: delivered');

relay_no_crash($node, $pid);
$node->stop;
rmq_stop($rmq);
done_testing();
