# Failover-safe delivery (I9, outbox.standby_slots).
#
# A primary with a streaming standby on a physical slot; an emitter commits
# numbered messages on 20 keys; the primary's WAL sender is stopped
# (SIGSTOP) for 2 s, as on a slow network, while the emitter goes on; then
# every process of the primary is killed -9, the standby promoted, and new
# messages emitted on it.  From what the receiver got and what the promoted
# server holds:
#   delivered but lost:  delivered, and the promoted server lacks the message
#   reused ids:          one outbox-seq delivered under two msg_ids
#   missing:             on the promoted server, never delivered
#   order:               per key, first deliveries out of id order
# - asynchronous, without the setting: delivered-but-lost > 0 (what the
#   setting is for);
# - asynchronous, with it: all zero;
# - synchronous with the waiting commits cancelled (they commit locally),
#   with it: all zero;
# and the same for a queue consumer: what it received in transactions that
# committed, the promoted server must hold;
# and on the promoted server the relay starts, delivers what was pending and
# goes on with ids above everything delivered before (the time from
# pg_ctl promote to the first delivery is printed).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use JSON::PP;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $sink = start_sink('failover');
my $json = json_codec();

# The deliveries to $path that succeeded: [{seq, msg_id, key, n, t}] in
# arrival order (the records read once: polled often, over thousands).
my %deliveries;    # path => { read => records looked at, list => [...] }
sub deliveries
{
	my ($path) = @_;
	my $d = $deliveries{$path} //= { read => 0, list => [] };
	my $records = sink_records($sink);
	for my $r (@$records[ $d->{read} .. $#$records ])
	{
		next unless $r->{path} eq $path && defined $r->{status} && $r->{status} == 204;
		my $h = $r->{headers} // {};
		my $body = eval { $json->decode($r->{body}) } // {};
		push @{ $d->{list} }, { seq => $h->{'outbox-seq'}, msg_id => $h->{'webhook-id'},
			key => $h->{'outbox-key'} // '-', n => $body->{n}, t => $r->{t} };
	}
	$d->{read} = scalar @$records;
	return [ @{ $d->{list} } ];
}

# A primary and its streaming standby (physical slot standby1), the
# extension and an HTTP target to /$name on the primary.
sub make_pair
{
	my ($name, %opts) = @_;
	my ($primary, $standby) = standby_pair($name,
		conf => "restart_after_crash = off\n"
		  . ($opts{gated} ? "outbox.standby_slots = 'standby1'\n" : ''),
		standby_conf => "synchronous_standby_names = ''\n",
		sql => qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$sink->{url}/$name');
SELECT outbox.subscribe('t', 'm');
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'm');
});
	if ($opts{sync})
	{
		$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = '*'});
		$primary->reload;
		$primary->poll_query_until('postgres',
			q{SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'}, '1')
		  or die "the standby is not synchronous";
	}
	return ($primary, $standby);
}

# Run the failover; returns a hash of the counts.
sub failover
{
	my ($name, %opts) = @_;
	my ($primary, $standby) = make_pair($name, %opts);

	# The emitter: numbered messages, one a transaction, on 20 keys, at
	# most about 2,000 a second (so that it is still emitting when the
	# primary dies).
	my $file = "$PostgreSQL::Test::Utils::tmp_check/emit_$name.sql";
	open my $fh, '>', $file or die $!;
	for my $n (1 .. 40000)
	{
		print $fh "SELECT outbox_emit('m', '{\"n\": $n}', 'k' || $n % 20);\n";
		print $fh "SELECT pg_sleep(0.005);\n" if $n % 10 == 0;
	}
	close $fh;
	# (its output to files: a pipe nobody reads would stop it)
	my $emitter = IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=0', '-d', $primary->connstr('postgres'), '-f', $file ],
		'>', "$file.out", '2>', "$file.err");
	# A queue consumer: what it received in transactions that committed
	# is what it acted on.
	my $cfile = "$PostgreSQL::Test::Utils::tmp_check/consume_$name.sql";
	open $fh, '>', $cfile or die $!;
	print $fh "BEGIN;\nSELECT 'got ' || (payload->>'n') FROM outbox.receive('q', 50, 200);\nCOMMIT;\n"
	  for 1 .. 20000;
	close $fh;
	my $consumer = IPC::Run::start(
		[ 'psql', '-X', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $primary->connstr('postgres'), '-f', $cfile ],
		'>', "$cfile.out", '2>', "$cfile.err");
	ok(wait_until(sub { @{ deliveries("/$name") } >= 300 }), "$name: messages flow");

	# The WAL sender stalls for 2 s; the emitter goes on.  Without the
	# setting the stall lasts, besides, until a message committed after it
	# began has been delivered and received (and committed by the
	# consumer): what a failover then undoes, however slow the machine.
	my $walsender = $primary->safe_psql('postgres', 'SELECT pid FROM pg_stat_replication');
	kill 'STOP', $walsender;
	my $n_stall = $primary->safe_psql('postgres',
		q{SELECT coalesce(max((payload->>'n')::int), 0) FROM outbox.messages});
	my $past_stall = sub {
		return 0 unless grep { ($_->{n} // 0) > $n_stall } @{ deliveries("/$name") };
		open my $in, '<', "$cfile.out" or return 0;
		my $got = 0;
		while (my $l = <$in>)
		{
			$got = 1 if $l =~ /^got (\d+)$/ && $1 > $n_stall;
			return 1 if $got && $l =~ /^COMMIT$/;
		}
		return 0;
	};
	my $until = time + 2;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	my $next_look = 0;
	my $past = $opts{gated};
	while (time < $until || (!$past && time < $deadline))
	{
		# Synchronous commits waiting for the standby are cancelled: they
		# then commit locally, with a WARNING.
		$primary->safe_psql('postgres', q{SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
			WHERE wait_event = 'SyncRep'}) if $opts{sync};
		if (!$past && time > $next_look)
		{
			$past = $past_stall->();
			$next_look = time + 0.2;
		}
		usleep(50_000);    # a span: the stall
	}
	diag("$name: nothing committed after the stall began was delivered and received") unless $past;
	my $delivered_before = scalar @{ deliveries("/$name") };
	kill_all($primary);
	$_->kill_kill for $emitter, $consumer;
	eval { $_->finish } for $emitter, $consumer;
	# Received in a transaction whose COMMIT came back: a "got" line
	# followed by a COMMIT line.
	my @received;
	{
		open my $in, '<', "$cfile.out" or die $!;
		my @lines = <$in>;
		chomp @lines;
		my @got;
		for my $l (@lines)
		{
			if ($l =~ /^got (\d+)$/) { push @got, $1 }
			elsif ($l eq 'COMMIT') { push @received, @got; @got = () }
			elsif ($l eq 'BEGIN') { @got = () }
		}
	}

	my $t_promote = time;
	$standby->promote;
	$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'no promotion';
	my $max_before = 0;
	for (@{ deliveries("/$name") }) { $max_before = $_->{seq} if $_->{seq} > $max_before }
	# New messages on the promoted server.
	$standby->safe_psql('postgres',
		q{SELECT count(outbox_emit('m', jsonb_build_object('n', 1000000 + g), 'k' || g % 20)) FROM generate_series(1, 200) g});
	ok(wait_until(sub { grep { $_->{t} >= $t_promote } @{ deliveries("/$name") } }, undef, 0.01),
		"$name: the promoted server delivers");
	my ($first_after) = grep { $_->{t} >= $t_promote } @{ deliveries("/$name") };
	my $promote_to_delivery = $first_after ? $first_after->{t} - $t_promote : -1;

	# Everything the promoted server holds is delivered.
	my %held = map { my ($id, $m, $n) = split /\|/; ($n => { id => $id, msg_id => $m }) }
	  split /\n/, $standby->safe_psql('postgres',
		q{SELECT id || '|' || msg_id || '|' || (payload->>'n') FROM outbox.messages});
	my $all = sub {
		my %got = map { ($_->{n} => 1) } @{ deliveries("/$name") };
		return !grep { !$got{$_} } keys %held;
	};
	ok(wait_until($all), "$name: every message of the promoted server is delivered");

	my $d = deliveries("/$name");
	my (%got, %ids_of_seq, %first);
	my ($lost, $order) = (0, 0);
	for my $e (@$d)
	{
		$ids_of_seq{ $e->{seq} }{ $e->{msg_id} } = 1;
		next if $got{ $e->{n} }++;
		$lost++ unless $held{ $e->{n} };
	}
	my $reused = grep { keys %{ $ids_of_seq{$_} } > 1 } keys %ids_of_seq;
	my $missing = grep { !$got{$_} } keys %held;
	# per key, the first delivery of each message follows the promoted
	# server's id order
	my %last;
	for my $e (@$d)
	{
		next if $first{ $e->{n} }++ || !$held{ $e->{n} };
		my $id = $held{ $e->{n} }{id};
		$order++ if defined $last{ $e->{key} } && $id < $last{ $e->{key} };
		$last{ $e->{key} } = $id;
	}
	my $received_lost = grep { !$held{$_} } @received;
	my $after_min = $standby->safe_psql('postgres',
		q{SELECT min(id) FROM outbox.messages WHERE (payload->>'n')::bigint > 1000000});
	note(sprintf("%s: %d delivered before the kill, %d messages on the promoted server, "
		  . "delivered-but-lost %d, reused ids %d, missing %d, out of order %d; "
		  . "queue: %d received, %d of them lost; "
		  . "pg_ctl promote to the first delivery %.2f s",
		$name, $delivered_before, scalar(keys %held), $lost, $reused, $missing, $order,
		scalar(@received), $received_lost, $promote_to_delivery));
	my %r = (lost => $lost, reused => $reused, missing => $missing, order => $order,
		received => scalar(@received), received_lost => $received_lost,
		after_min => $after_min, max_before => $max_before, standby => $standby);
	$standby->stop;
	return \%r;
}

my $r = failover('async_plain');
cmp_ok($r->{lost}, '>', 0,
	"without outbox.standby_slots a failover undoes delivered messages ($r->{lost}): the test can fail");
cmp_ok($r->{received_lost}, '>', 0,
	"... and received ones ($r->{received_lost} of $r->{received})");

$r = failover('async_gated', gated => 1);
is($r->{lost}, 0, 'asynchronous, outbox.standby_slots: no delivered message is lost');
is($r->{reused}, 0, '... no id is reused for another message');
is($r->{missing}, 0, '... nothing committed on the promoted server goes undelivered');
is($r->{order}, 0, '... and per key the order holds');
cmp_ok($r->{after_min}, '>', $r->{max_before}, '... new ids are above every id delivered before');
cmp_ok($r->{received}, '>', 0, '... a queue consumer received messages');
is($r->{received_lost}, 0, '... and none that the promoted server lacks');

$r = failover('sync_cancelled', gated => 1, sync => 1);
is($r->{lost}, 0, 'synchronous with cancelled waits, outbox.standby_slots: no delivered message is lost');
is($r->{reused}, 0, '... no id is reused');
is($r->{missing}, 0, '... nothing goes undelivered');
is($r->{order}, 0, '... and per key the order holds');
is($r->{received_lost}, 0, '... and no received message is lost');

stop_sink($sink);
done_testing();
