# A Kafka lane produces while earlier messages of a key are in flight
# (pipelined, I4): through every fault below, against librdkafka's mock
# cluster, every message is delivered, copies of a message carry its
# webhook-id, and per key the order holds:
#  - where the mock keeps a partition as a broker does, the first copies
#    are in commit order;
#  - where a request error is pushed mid-stream or a leader moves, the mock
#    may store a later
#    batch of a partition without the earlier one it refused (it checks the
#    sequence numbers of transactional producers only: rdkafka_mock.c,
#    rd_kafka_mock_validate_records), and librdkafka reports the earlier
#    one delivered without an offset; the relay sends it again, and every
#    later message of its key after it, so per key the last copies are in
#    commit order (a broker refuses the later batch: there the first copies
#    are);
# and each scenario prints how many copies were sent again.
# Faults: request errors NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT and
# NOT_ENOUGH_REPLICAS pushed mid-stream, a broker down and up, partition
# leaders moved, a message too large in the middle of its key's run (a dead
# letter; the later messages of its key still go), a fatal idempotence
# error (OUT_OF_ORDER_SEQUENCE_NUMBER: the producer is made anew), the
# relay killed -9 with requests in flight, 20,000 messages over 200 keys
# at full speed, the producer's queue full (a wait, not a hold), and an
# error raised while a request is being produced, after part of it went
# (the message that raised it is the dead letter; none other is lost).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxKafka;

my @topics = ((map { ("p$_", 6) } 1 .. 11), 'p12.m', 6);
my $mock = kafka_mock(@topics);
my $brokers = $mock->{bootstrap};
note("mock cluster at $brokers");

my $node = relay_node('kafka');

sub pending
{
	my ($target) = @_;
	return $node->safe_psql('postgres', "SELECT pending FROM outbox.lag WHERE target = '$target'");
}

sub delivered
{
	my ($target) = @_;
	return $node->safe_psql('postgres', "SELECT delivered FROM outbox.lag WHERE target = '$target'");
}

# A paused target of topic $topic, and $n messages over $keys keys (topic
# "$topic.m"), committed in transactions of 100; returns the ids.
sub backlog
{
	my ($topic, $n, $keys, %o) = @_;
	my $rate = $o{max_rate} // 100;
	my $props = $o{properties} ? ", properties => '$o{properties}'" : '';
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_kafka_target('$topic', '$brokers', topic => '$topic', lanes => 8,
										  batch_size => 20, timeout_ms => 5000,
										  max_attempts => 0 $props);
		SELECT outbox.alter_target('$topic', max_rate => $rate);
		SELECT outbox.subscribe('$topic', '$topic.*');
		SELECT outbox.pause_target('$topic');
	});
	$node->safe_psql('postgres', qq{
		DO \$\$
		BEGIN
			FOR b IN 0 .. ($n / 100) - 1 LOOP
				PERFORM outbox_emit('$topic.m', jsonb_build_object('n', g), 'k' || (g % $keys))
				   FROM generate_series(b * 100 + 1, b * 100 + 100) g;
				COMMIT;
			END LOOP;
		END
		\$\$;
	});
	my @ids = split /\n/,
	  $node->safe_psql('postgres', "SELECT id FROM outbox.messages WHERE topic = '$topic.m' ORDER BY id");
	is(scalar @ids, $n, "$topic: $n messages emitted");
	return @ids;
}

# Wait until the target has delivered everything, then read the topic back
# and check it: every message of @ids there, nothing else, copies with
# their message's webhook-id, per key the last copies in commit order, and
# the first copies too unless $o{first} is 0.  Returns the copies.
sub check_topic
{
	my ($topic, $ids, %o) = @_;
	ok_wait("$topic: everything delivered", sub { my $p = pending($topic); return ($p eq '0', "$p pending") });
	is($node->safe_psql('postgres', "SELECT count(*) FROM outbox.dead_letters WHERE target = '$topic'"),
		$o{dead} // 0, "$topic: dead letters");
	my $records = kafka_consume($mock, $topic);
	my %want = map { $_ => 1 } @$ids;
	my (%seen, %msgid, %first_last, %last_pos, $extra, $mixed, $first_disorder);
	my $pos = 0;
	for my $r (@$records)
	{
		my $seq = $r->{headers}{'outbox-seq'};
		$pos++;
		$extra++ unless $want{$seq};
		$mixed++ if defined $msgid{$seq} && $msgid{$seq} ne $r->{headers}{'webhook-id'};
		$msgid{$seq} //= $r->{headers}{'webhook-id'};
		$last_pos{$seq} = "$r->{partition}:$r->{offset}";
		next if $seen{$seq}++;
		if (defined $first_last{ $r->{key} } && $first_last{ $r->{key} } >= $seq)
		{
			note("$topic: first copy of $seq (key $r->{key}) after $first_last{$r->{key}}")
			  if ++$first_disorder <= 5;
		}
		$first_last{ $r->{key} } = $seq;
	}
	# the last copies: per key, by partition and offset
	my (%by_key, $last_disorder);
	for my $r (@$records)
	{
		my $seq = $r->{headers}{'outbox-seq'};
		next unless $last_pos{$seq} eq "$r->{partition}:$r->{offset}";
		push @{ $by_key{ $r->{key} } }, $seq;
	}
	for my $k (sort keys %by_key)
	{
		my $prev = 0;
		for my $seq (@{ $by_key{$k} })
		{
			note("$topic: last copy of $seq (key $k) after $prev") if $seq <= $prev && !$last_disorder++;
			$prev = $seq;
		}
	}
	my @missing = grep { !$seen{$_} } @$ids;
	my %dead = map { $_ => 1 } @{ $o{dead_ids} // [] };
	@missing = grep { !$dead{$_} } @missing;
	my $copies = scalar(@$records) - scalar(keys %seen);
	note("$topic: " . scalar(@$records) . " records, copies sent again: $copies, "
		  . "first copies out of commit order: " . ($first_disorder // 0));
	is(scalar @missing, 0, "$topic: every message is there") or note("missing: @missing[0 .. 9]");
	is($extra // 0, 0, "$topic: nothing else");
	is($mixed // 0, 0, "$topic: copies carry their message's webhook-id");
	is($last_disorder // 0, 0, "$topic: per key, the last copies in commit order");
	is($first_disorder // 0, 0, "$topic: per key, the first copies in commit order")
	  unless defined $o{first} && !$o{first};
	return $copies;
}

# --- request errors pushed mid-stream, one kind at a time ---
my %errors = (p1 => [ 6, 'NOT_LEADER_FOR_PARTITION' ], p2 => [ 7, 'REQUEST_TIMED_OUT' ],
	p3 => [ 19, 'NOT_ENOUGH_REPLICAS' ]);
for my $topic (sort keys %errors)
{
	my ($code, $name) = @{ $errors{$topic} };
	my @ids = backlog($topic, 4000, 100);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('$topic')");
	ok_wait("$topic: delivering", sub { my $d = delivered($topic); return ($d >= 500, "$d delivered") });
	is(kafka_command($mock, "produce-errors 30 $code"), 'ok', "$topic: the brokers answer $name to 30 produce requests");
	ok(delivered($topic) < 4000, "$topic: mid-stream");
	check_topic($topic, \@ids, first => 0);
}

# --- a broker down and up ---
{
	my @ids = backlog('p4', 4000, 100);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p4')");
	ok_wait('p4: delivering', sub { my $d = delivered('p4'); return ($d >= 500, "$d delivered") });
	is(kafka_command($mock, 'down 2'), 'ok', 'p4: a broker goes down');
	my $at = delivered('p4');
	sleep 2;    # a span: down for a while
	is(kafka_command($mock, 'up 2'), 'ok', 'p4: and up');
	ok($at < 4000, "p4: down mid-stream ($at delivered)");
	check_topic('p4', \@ids);
}

# --- partition leaders moved ---
{
	my @ids = backlog('p5', 4000, 100);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p5')");
	ok_wait('p5: delivering', sub { my $d = delivered('p5'); return ($d >= 500, "$d delivered") });
	is(kafka_command($mock, "leader p5 $_ " . (1 + $_ % 3)), 'ok', "p5: the leader of partition $_ moves")
	  for 0 .. 5;
	ok(delivered('p5') < 4000, 'p5: mid-stream');
	check_topic('p5', \@ids, first => 0);
}

# --- a message too large in the middle of its key's run ---
{
	my @ids = backlog('p6', 2000, 20, properties => '{"message.max.bytes": 5000}');
	# one more run of key kbig: the 26th of 50 too large
	$node->safe_psql('postgres', q{
		SELECT outbox_emit('p6.m', CASE WHEN g = 26 THEN jsonb_build_object('pad', repeat('x', 8000))
										ELSE jsonb_build_object('n', g) END, 'kbig')
		  FROM generate_series(1, 50) g;
	});
	my @big = split /\n/,
	  $node->safe_psql('postgres', q{SELECT id FROM outbox.messages WHERE key = 'kbig' ORDER BY id});
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p6')");
	check_topic('p6', [ @ids, @big ], dead => 1, dead_ids => [ $big[25] ]);
	is($node->safe_psql('postgres', q{SELECT id FROM outbox.dead_letters WHERE target = 'p6'}), $big[25],
		'p6: the message too large is the dead letter');
	like($node->safe_psql('postgres', q{SELECT last_error FROM outbox.dead_letters WHERE target = 'p6'}),
		qr/too large/i, 'p6: with the reason');
	my @run = map { $_->{headers}{'outbox-seq'} } grep { $_->{key} eq 'kbig' } @{ kafka_consume($mock, 'p6') };
	my %once;
	@run = grep { !$once{$_}++ } @run;
	is_deeply(\@run, [ @big[ 0 .. 24, 26 .. 49 ] ], 'p6: the rest of its key\'s run went, in order');
}

# --- a fatal idempotence error: the producer is made anew ---
{
	my @ids = backlog('p7', 4000, 100);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p7')");
	ok_wait('p7: delivering', sub { my $d = delivered('p7'); return ($d >= 500, "$d delivered") });
	my $offset = -s $node->logfile;
	is(kafka_command($mock, 'produce-errors 1 45'), 'ok', 'p7: the brokers answer OUT_OF_ORDER_SEQUENCE_NUMBER');
	ok( wait_until(
			sub { slurp_file($node->logfile, $offset) =~ /Kafka target "p7": .*it is made anew/ }),
		'p7: the producer failed for good and is made anew');
	check_topic('p7', \@ids);
}

# --- the relay killed with requests in flight ---
{
	my @ids = backlog('p8', 4000, 100);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p8')");
	ok_wait('p8: delivering', sub { my $d = delivered('p8'); return ($d >= 1000, "$d delivered") });
	my $pid = relay_worker_pid($node);
	my $at = delivered('p8');
	kill 'KILL', $pid;
	wait_until(sub { !kill(0, $pid) });
	$node->poll_query_until('postgres', 'SELECT true');
	ok($at < 4000, "p8: the relay was killed mid-stream ($at delivered)");
	check_topic('p8', \@ids);
}

# --- 20,000 messages over 200 keys, at full speed ---
{
	my @ids = backlog('p9', 20000, 200, max_rate => 0);
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p9')");
	check_topic('p9', \@ids);
}

# --- the producer's queue full: lanes wait for reports, the target is not held ---
{
	my $offset = -s $node->logfile;
	my @ids = backlog('p11', 4000, 100, max_rate => 0,
		properties => '{"queue.buffering.max.messages": 150}');
	$node->safe_psql('postgres', "SELECT outbox.resume_target('p11')");
	check_topic('p11', \@ids);
	unlike(slurp_file($node->logfile, $offset), qr/holds target "p11"/,
		'p11: a full producer queue does not hold the target');
}

# --- an error while a request is being produced, after part of it went ---
# (one lane: the request holds all ten; the fifth raises an error while it
# is prepared, max_attempts 1): the four before it are on the wire; the
# fifth alone is the dead letter, every other message is delivered.
{
	my $topic = 'p10';
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_kafka_target('$topic', '$brokers', topic => '$topic', lanes => 1,
										  batch_size => 20, timeout_ms => 30000, max_attempts => 1);
		SELECT outbox.subscribe('$topic', '$topic.*');
		SELECT outbox.pause_target('$topic');
		SELECT outbox_emit(CASE WHEN g = 5 THEN '$topic.boom' ELSE '$topic.m' END,
						   jsonb_build_object('n', g), 'k' || (g % 3))
		  FROM generate_series(1, 10) g;
	});
	my @ids = split /\n/,
	  $node->safe_psql('postgres', "SELECT id FROM outbox.messages WHERE topic LIKE '$topic.%' ORDER BY id");
	$node->append_conf('postgresql.conf', "outbox.test_fault = 'send:$topic.boom'");
	$node->reload;
	relay_reloaded($node, 'postgres', 'outbox.test_fault' => "send:$topic.boom");
	$node->safe_psql('postgres', "SELECT outbox.resume_target('$topic')");
	check_topic($topic, \@ids, dead => 1, dead_ids => [ $ids[4] ]);
	like(
		$node->safe_psql('postgres',
			"SELECT id || ' ' || last_error FROM outbox.dead_letters WHERE target = '$topic'"),
		qr/^$ids[4] .*injected fault/, "$topic: the message that raised the error is the dead letter");
}

# --- the same on a target whose topic is filled in (not pipelined: one
# message of a key a request, but a request on the wire all the same) ---
{
	my $target = 'p12';
	$node->safe_psql('postgres', qq{
		SELECT outbox.create_kafka_target('$target', '$brokers', topic => '{topic}', lanes => 1,
										  batch_size => 20, timeout_ms => 30000, max_attempts => 1);
		SELECT outbox.subscribe('$target', '$target.*');
		SELECT outbox.pause_target('$target');
		SELECT outbox_emit(CASE WHEN g = 5 THEN '$target.boom' ELSE '$target.m' END,
						   jsonb_build_object('n', g), 'k' || g)
		  FROM generate_series(1, 10) g;
	});
	my @ids = split /\n/,
	  $node->safe_psql('postgres', "SELECT id FROM outbox.messages WHERE topic LIKE '$target.%' ORDER BY id");
	$node->append_conf('postgresql.conf', "outbox.test_fault = 'send:$target.boom'");
	$node->reload;
	relay_reloaded($node, 'postgres', 'outbox.test_fault' => "send:$target.boom");
	$node->safe_psql('postgres', "SELECT outbox.resume_target('$target')");
	ok_wait("$target: everything delivered",
		sub { my $p = pending($target); return ($p eq '0', "$p pending") });
	is($node->safe_psql('postgres', "SELECT string_agg(id::text, ' ') FROM outbox.dead_letters WHERE target = '$target'"),
		$ids[4], "$target: the message that raised the error is the one dead letter");
	my @got = sort { $a <=> $b } map { $_->{headers}{'outbox-seq'} } @{ kafka_consume($mock, "$target.m") };
	is_deeply(\@got, [ @ids[ 0 .. 3, 5 .. 9 ] ], "$target: every other message is in its topic, once");
}

kafka_stop($mock);
$node->stop;
done_testing();
