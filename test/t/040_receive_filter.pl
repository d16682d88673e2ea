# Transactional Client: the randomly failing filter (Enterprise Integration
# Patterns).  2,000 messages over 20 keys are emitted into topic 'in'; three
# filters compete for queue 'in', each in a loop of
#
#   BEGIN; receive one message; (30 %: fail, the transaction rolls back)
#   else emit the same payload and key to topic 'out'; COMMIT;
#
# and a consumer of queue 'out' records what it receives, in transactions
# that also fail now and then.  Every message must reach the consumer
# exactly once and, per key, in the order it was emitted; receive_count
# counts every receive of a message; nothing becomes a dead letter.  This
# runs twice: with the relay running and the default window, and without
# the relay and with outbox.queue_window = 16, the smallest.
#
# Then the same harness against a hand-rolled queue table consumed with
# SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1 and DELETE, the filters
# inserting into a plain output table in the same transaction: it also
# delivers exactly once, but not in order per key, which is what the
# outbox's per-key claim adds.
#
# The filters are psql processes driven concurrently from here, one loop
# step at a time (IPC::Run, no BackgroundPsql, no DBI): works with the test
# modules of PostgreSQL 15 and 18.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxSession;


package main;

my $seed = $ENV{OUTBOX_TEST_SEED} // int(rand(1_000_000));
note "random seed $seed (OUTBOX_TEST_SEED=$seed repeats it)";
srand($seed);

my $n_messages = 2000;
my $n_keys = 20;
my $n_filters = 3;
my $p_fail = 0.3;
# Now and then a filter takes its time over a message, as a real one would
# (a slow call, a lock wait): with probability $p_slow it sleeps $slow
# seconds while it holds the message, otherwise not at all.  Both variants
# get the same.
my $p_slow = 0.1;
my $slow = 0.03;
# A variant fails when its clients make no progress for this long (the TAP
# library's time limit); how long they take in all does not matter.
my $stall_limit = $PostgreSQL::Test::Utils::timeout_default;

# The server of the current pass.
my $node;

# The input: message $i (0-based) has a key drawn at random (so a key's
# messages sometimes follow each other) and n, its place among the
# messages of its key (1, 2, ...).
my (@msgs, %per_key);
for my $i (0 .. $n_messages - 1)
{
	my $key = 'k' . int(rand($n_keys));
	push @msgs, { i => $i, key => $key, n => ++$per_key{$key} };
}
is(scalar(keys %per_key), $n_keys, "the $n_messages messages use all $n_keys keys");

sub payload
{
	my ($m) = @_;
	return qq({"i": $m->{i}, "key": "$m->{key}", "n": $m->{n}});
}

# Emitted by 8 transactions; the first 4 before the filters start, the
# other 4 while they run.
my @batches;
push @batches, [ splice(@msgs, 0, $n_messages / 8) ] while @msgs;
@msgs = map { @$_ } @batches;

# One filter step: receive one message, maybe sleep, maybe fail, else pass
# it on; the step prints "got <id> <receive_count> <ok|fail>" or "empty".
# $variant: 'outbox' or 'table'.
sub filter_step
{
	my ($variant) = @_;
	my $fail = rand() < $p_fail;
	my $sleep = rand() < $p_slow ? $slow : 0;
	my $receive =
	  $variant eq 'outbox'
	  ? q{SELECT id AS r_id, key AS r_key, payload AS r_payload, receive_count AS r_rc
    FROM outbox.receive('in', 1) \gset}
	  : q{SELECT id AS r_id, key AS r_key, payload AS r_payload, 0 AS r_rc
    FROM in_table ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED \gset};
	my $pass =
	  $variant eq 'outbox'
	  ? q{SELECT 1 FROM outbox_emit('out', :'r_payload'::jsonb, :'r_key');}
	  : q{DELETE FROM in_table WHERE id = :r_id;
INSERT INTO out_table (in_id, key, n) VALUES (:r_id, :'r_key', (:'r_payload'::jsonb ->> 'n')::int);};
	my $action =
	  $fail
	  ? q{DO $$BEGIN RAISE EXCEPTION 'filter failure'; END$$;}
	  : $pass;
	my $what = $fail ? 'fail' : 'ok';
	my $sleep_sql = $sleep ? "SELECT 1 FROM pg_sleep($sleep);" : '';
	return qq{BEGIN;
\\unset r_id
$receive
\\if :{?r_id}
\\echo got :r_id :r_rc $what
$sleep_sql
$action
\\else
\\echo empty
\\endif
COMMIT;};
}

# The consumer of the output: receives up to 10 messages per transaction
# and records them in received_out, in the order it received them (seq);
# 10 % of its transactions fail after the insert.  The step prints
# "inserted <n> <ok|fail>".
sub consumer_step
{
	my $fail = rand() < 0.1;
	my $what = $fail ? 'fail' : 'ok';
	return q{BEGIN;
WITH ins AS (
  INSERT INTO received_out (out_id, key, n, receive_count)
  SELECT id, key, (payload ->> 'n')::int, receive_count
  FROM outbox.receive('out', 10) ORDER BY id
  RETURNING 1)
SELECT 'inserted ' || count(*) || } . "' $what'" . q{ FROM ins;
} . ($fail ? q{DO $$BEGIN RAISE EXCEPTION 'consumer failure'; END$$;} : '') . q{
COMMIT;};
}

# The emitter's step for batch $b.
sub emit_step
{
	my ($variant, $b) = @_;
	my $sql = "BEGIN;\n";
	for my $m (@{ $batches[$b] })
	{
		my $p = payload($m);
		$sql .=
		  $variant eq 'outbox'
		  ? "SELECT 1 FROM outbox_emit('in', '$p', '$m->{key}');\n"
		  : "INSERT INTO in_table (key, payload) VALUES ('$m->{key}', '$p');\n";
	}
	return $sql . "COMMIT;";
}

# At most 20 distinct lines of @_, each with how often it occurs.
sub distinct_lines
{
	my (%count, @order);
	for (@_) { push @order, $_ unless $count{$_}++ }
	splice(@order, 20) if @order > 20;
	return join("\n", map { "$count{$_} x $_" } @order);
}

# Run one variant: emit half the input, start the filters (and, for
# 'outbox', the consumer), emit the other half while they run, and loop
# until every message went through.  Returns the attempts, one hash per
# message the filters received: id, rc (receive_count), what (ok, fail).
sub run_variant
{
	my ($variant, $label) = @_;
	my $admin = OutboxSession->new($node, "${variant}_admin");
	for my $b (0 .. 3)
	{
		$admin->run(emit_step($variant, $b));
		is($admin->{step_err}, '', "$label: input batch $b emitted");
	}
	my @filters = map { OutboxSession->new($node, "${variant}_filter$_") } 1 .. $n_filters;
	my $emitter = OutboxSession->new($node, "${variant}_emitter");
	my $consumer = $variant eq 'outbox' ? OutboxSession->new($node, "${variant}_consumer") : undef;
	my $passed_sql =
	  $variant eq 'outbox'
	  ? q{SELECT count(*) FROM outbox.messages WHERE topic = 'out'}
	  : q{SELECT count(*) FROM out_table};

	my (@attempts, @errors);
	my %done;    # filter name => 1 once it saw everything passed on
	my $next_batch = 4;
	my $consumer_done = 0;
	my $start = time;
	my $deadline = $start + $stall_limit;
	$_->send(filter_step($variant)) for @filters;
	$emitter->send('SELECT 1 FROM pg_sleep(0.05);');
	# Whether the consumer's running step was sent once every filter was
	# done: only such a step that found nothing shows the output complete.
	my $consumer_after_done = 0;
	if ($consumer)
	{
		$consumer->send(consumer_step());
	}
	# Progress: a message received, more passed on than seen before, a
	# batch emitted, rows the consumer took (steps that find nothing, which
	# the clients take in turn while they wait, are not progress).
	my $passed_max = 0;
	while (1)
	{
		my $progress = 0;
		my $busy = 0;
		for my $f (@filters)
		{
			next if $done{ $f->{name} } || !$f->poll;
			$busy = 1;
			my $out = $f->{step_out};
			my $err = $f->{step_err};
			# A step's stderr holds the failure it was told to have, psql's
			# complaint that \gset got no row, and nothing else.
			my @unexpected = grep { !/filter failure|no rows returned for \\gset|^\s*$|^(CONTEXT|LOCATION):/ }
			  split /\n/, $err;
			push @errors, "$f->{name}: $_" for @unexpected;
			if ($out =~ /^got (\d+) (\d+) (ok|fail)$/m)
			{
				$progress = 1;
				push @attempts, { id => $1, rc => $2, what => $3, filter => $f->{name} };
				$f->send(filter_step($variant));
			}
			elsif ($out =~ /^empty$/m)
			{
				# Nothing to receive now: finished once every message was
				# passed on, else wait a little.
				$f->send("SELECT pg_sleep(0.005);\n\\echo passed\n$passed_sql;");
			}
			elsif ($out =~ /^passed\n(\d+)$/m)
			{
				if ($1 > $passed_max) { $progress = 1; $passed_max = $1; }
				if ($1 >= $n_messages) { $done{ $f->{name} } = 1 }
				else { $f->send(filter_step($variant)) }
			}
			else
			{
				push @errors, "$f->{name}: unexpected output: $out";
				$f->send(filter_step($variant));
			}
		}
		if ($emitter->poll && $next_batch < @batches)
		{
			$progress = $busy = 1;
			push @errors, "emitter: $emitter->{step_err}" if $emitter->{step_err} ne '';
			# Spread the late batches over the filters' run.
			$emitter->send(emit_step($variant, $next_batch++) . "\nSELECT pg_sleep(0.3);");
		}
		if ($consumer && !$consumer_done && $consumer->poll)
		{
			$busy = 1;
			$progress = 1 if $consumer->{step_out} =~ /^inserted [1-9]\d* ok$/;
			my @unexpected = grep { !/consumer failure|^\s*$|^(CONTEXT|LOCATION):/ }
			  split /\n/, $consumer->{step_err};
			push @errors, "consumer: $_" for @unexpected;
			# Once the filters are done, a transaction of the consumer that
			# committed and found nothing ends it.
			if ($consumer_after_done && $consumer->{step_out} eq 'inserted 0 ok')
			{
				$consumer_done = 1;
			}
			else
			{
				push @errors, "consumer: unexpected output: $consumer->{step_out}"
				  unless $consumer->{step_out} =~ /^inserted \d+ (ok|fail)$/;
				$consumer_after_done = keys %done == $n_filters;
				$consumer->send(consumer_step());
			}
		}
		last if keys %done == $n_filters && (!$consumer || $consumer_done) && $emitter->poll;
		if ($progress)
		{
			$deadline = time + $stall_limit;
		}
		elsif (time > $deadline)
		{
			push @errors, "the clients made no progress for $stall_limit s";
			last;
		}
		usleep(2000) unless $busy;
	}
	my $elapsed = time - $start;
	note sprintf("%s: %d receives, %d failed, in %.1f s", $label, scalar(@attempts),
		scalar(grep { $_->{what} eq 'fail' } @attempts), $elapsed);
	is_deeply(\@errors, [], "$label: no unexpected errors or output from the clients")
	  or diag(distinct_lines(@errors));
	$_->quit for @filters, $emitter, $admin, ($consumer ? $consumer : ());
	return \@attempts;
}

# The per-key order of a recorded output: rows (key, n) in the order
# received.  Returns the number of order violations (a message received
# after a later message of its key) and whether every (key, n) emitted
# was received exactly once.
sub check_output
{
	my ($variant, $table) = @_;
	my $rows = $node->safe_psql('postgres', "SELECT key, n FROM $table ORDER BY seq");
	my (%seen, %last, $violations, $dups, $rows_n);
	$violations = $dups = $rows_n = 0;
	for my $row (split /\n/, $rows)
	{
		my ($key, $n) = split /\|/, $row;
		$rows_n++;
		$dups++ if $seen{"$key/$n"}++;
		$violations++ if defined $last{$key} && $n < $last{$key};
		$last{$key} = $n if !defined $last{$key} || $n > $last{$key};
	}
	my @missing = grep { !$seen{"$_->{key}/$_->{n}"} } @msgs;
	is($rows_n, $n_messages, "$variant: the output got $n_messages messages");
	is($dups, 0, "$variant: no message reached the output twice");
	is(scalar(@missing), 0, "$variant: no message is missing from the output");
	return $violations;
}

# Check the receive counts of the attempts: for each message the receives
# counted 1, 2, ..., m, all failed but the last, which passed it on.
sub check_attempts
{
	my ($variant, $attempts) = @_;
	my %by_id;
	push @{ $by_id{ $_->{id} } }, $_ for @$attempts;
	is(scalar(keys %by_id), $n_messages, "$variant: the filters received $n_messages distinct messages");
	my @bad;
	for my $id (sort { $a <=> $b } keys %by_id)
	{
		my @a = sort { $a->{rc} <=> $b->{rc} } @{ $by_id{$id} };
		my @rc = map { $_->{rc} } @a;
		my @what = map { $_->{what} } @a;
		my $ok = join(',', @rc) eq join(',', 1 .. scalar(@a))
		  && join(',', @what) eq join(',', ('fail') x (@a - 1), 'ok');
		push @bad, "id $id: receive counts @rc, outcomes @what" unless $ok;
	}
	is_deeply(\@bad, [], "$variant: each message was received with receive_count 1, 2, ... until it passed")
	  or diag(distinct_lines(@bad));
	return;
}

# One pass of the harness through outbox queues 'in' and 'out' on $node.
sub outbox_pass
{
	my ($label) = @_;
	$node->safe_psql('postgres', q{
SELECT outbox.create_queue('in');
SELECT outbox.subscribe('in', 'in');
SELECT outbox.create_queue('out');
SELECT outbox.subscribe('out', 'out');
CREATE TABLE received_out (seq bigserial PRIMARY KEY, out_id bigint NOT NULL,
  key text NOT NULL, n int NOT NULL, receive_count int NOT NULL);
});
	my $attempts = run_variant('outbox', $label);
	check_attempts($label, $attempts);
	my $max_rc = 0;
	for (@$attempts) { $max_rc = $_->{rc} if $_->{rc} > $max_rc }
	cmp_ok($max_rc, '>', 1, "$label: some messages were received more than once (highest receive_count $max_rc)");
	my $violations = check_output($label, 'received_out');
	is($violations, 0, "$label: every key's messages reached the consumer of out in the order emitted");
	is( $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages WHERE topic = 'out'}),
		$n_messages, "$label: the filters emitted $n_messages messages to out, no more");
	is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}),
		'0', "$label: no dead letters");
	is( $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.receive('in', 100)}),
		'0', "$label: queue in is drained");
	is( $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.receive('out', 100)}),
		'0', "$label: queue out is drained");
	is( $node->safe_psql('postgres', q{SELECT string_agg(queue || ' ' || pending || ' ' || held, ', ' ORDER BY queue)
  FROM outbox.queues WHERE queue IN ('in', 'out')}),
		'in 0 0, out 0 0', "$label: outbox.queues shows nothing pending or held");
	relay_no_crash($node);
	return;
}

# --- outbox queues, the relay running ---
# The relay folds the queues' acknowledgements into their progress about
# once a second while the filters receive; it has nothing else to do.  No
# message may become a dead letter however often it is rolled back.
$node = outbox_node('filter', conf => q{
outbox.max_receives = 100
});
outbox_pass('outbox');

# --- the same with a queue table and SKIP LOCKED ---
$node->safe_psql('postgres', q{
CREATE TABLE in_table (id bigserial PRIMARY KEY, key text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE out_table (seq bigserial PRIMARY KEY, in_id bigint NOT NULL, key text NOT NULL, n int NOT NULL);
});
my $attempts = run_variant('table', 'table');
my %fails;
$fails{ $_->{id} }++ for grep { $_->{what} eq 'fail' } @$attempts;
cmp_ok(scalar(keys %fails), '>', 0, 'table: some messages were rolled back and received again');
my $violations = check_output('table', 'out_table');
note "table: $violations messages reached out_table after a later message of their key";
cmp_ok($violations, '>', 0,
	'table: FOR UPDATE SKIP LOCKED does not keep the order per key (a message overtook an earlier one of its key)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM in_table}), '0', 'table: in_table is drained');
$node->stop;

# --- outbox queues again: the smallest window, no relay ---
# With outbox.queue_window = 16 the receivers keep refilling the window
# from outbox.messages as it drains, and a key held by a slow filter can
# leave it full of messages nobody may take yet; without the relay the
# acknowledgements stay in outbox.receipts.
$node = outbox_node('filter_w16', conf => q{
outbox.enabled = off
outbox.max_receives = 100
outbox.queue_window = 16
});
outbox_pass('window 16');
$node->stop;

done_testing();
