# A NATS target against a 3-node JetStream cluster of real nats-server
# processes on loopback, with a stream replicated on all three (R3):
# 20,000 messages over 200 keys, and mid-stream the relay killed (kill -9),
# then the stream's leader killed and started again.  The stream holds
# exactly 20,000 messages (what was sent again was taken as duplicates of
# the same Nats-Msg-Id), per key in commit order.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxNats;

my @names = qw(n1 n2 n3);
my %client = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } @names;
my %route = map { $_ => PostgreSQL::Test::Cluster::get_free_port() } @names;
my %srv;
for my $n (@names)
{
	$srv{$n} = nats_start($n, port => $client{$n}, cluster_port => $route{$n},
		routes => [ map { $route{$_} } grep { $_ ne $n } @names ]);
}
my $urls = join(',', map { "nats://127.0.0.1:$client{$_}" } @names);

# A live server's URL, for the tool.
sub live_url
{
	my ($n) = grep { $srv{$_}{harness} } @names;
	return $srv{$n}{url};
}

# The cluster elects its JetStream leader first: retry.  (A duplicate
# window of an hour: messages sent again after a fault are taken as
# duplicates, however long the test runs.)
ok(wait_for('the cluster to take an R3 stream',
		sub { scalar eval { nats_tool($srv{n1}{url}, 'create', 'ORDERS', 'orders.>', 3, -1, 3600); 1 } },
		interval => 1),
	'an R3 stream on the 3-node cluster');

my $node = relay_node('nats_cluster');
# Slowed down (at most 100 requests of 20 a second), so that the faults
# come mid-stream, and paused until every message is committed (however
# long emitting takes).  Retried for ever: elections answer 503 or let
# publishes time out, for as long as they take.
$node->safe_psql('postgres', qq{
	SELECT outbox.create_nats_target('js', '$urls', subject => 'orders.{topic}', lanes => 8,
									 batch_size => 20, timeout_ms => 2000, max_attempts => 0);
	SELECT outbox.alter_target('js', max_rate => 100);
	SELECT outbox.subscribe('js', '*');
	SELECT outbox.pause_target('js');
});
$node->safe_psql('postgres', q{
	DO $$
	BEGIN
		FOR b IN 0 .. 199 LOOP
			PERFORM outbox_emit(CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END,
								jsonb_build_object('n', g), 'k' || (g % 200))
			   FROM generate_series(b * 100 + 1, b * 100 + 100) g;
			COMMIT;
		END LOOP;
	END
	$$;
});
$node->safe_psql('postgres', q{SELECT outbox.resume_target('js')});

sub count_now { return nats_count(live_url(), 'ORDERS') }

ok(wait_until(sub { count_now() >= 4000 }), 'delivering');
my $pid = relay_worker_pid($node);
kill 'KILL', $pid;
my $at = count_now();
note("relay killed with $at of 20000 in the stream");
ok($at < 16000, 'the relay was killed mid-stream');

ok(wait_until(sub { count_now() >= 8000 }), 'delivering after the relay restarted');
my $leader = '';
wait_for("the stream's leader",
	sub { $leader = eval { nats_tool(live_url(), 'leader', 'ORDERS') } // ''; chomp $leader; ($leader ne '', $leader) });
ok(exists $srv{$leader}, "the stream's leader is $leader");
$at = count_now();
nats_kill($srv{$leader});
note("leader $leader killed with $at of 20000 in the stream");
ok($at >= 0 && $at < 18000, 'the leader was killed mid-stream');
ok(wait_until(sub { my $c = count_now(); $c >= 12000 || $c >= 20000 }),
	'delivering with a server down');
$srv{$leader} = nats_start($leader, port => $client{$leader}, dir => $srv{$leader}{dir},
	cluster_port => $route{$leader}, routes => [ map { $route{$_} } grep { $_ ne $leader } @names ]);
# the faults are over: the rest at full speed
$node->safe_psql('postgres', q{SELECT outbox.alter_target('js', max_rate => 0)});

ok(wait_until(sub { count_now() >= 20000 }), 'everything arrives');
sleep 2;    # a span: an extra copy would be here now
my $msgs = nats_dump(live_url(), 'ORDERS');
my (%seen, %last, $dups, $disorder);
for my $m (@$msgs)
{
	$dups++ if $seen{ $m->{oseq} }++;
	$disorder++ if defined $last{ $m->{key} } && $last{ $m->{key} } >= $m->{oseq};
	$last{ $m->{key} } = $m->{oseq};
}
is(scalar @$msgs, 20000, 'the stream holds exactly 20000 messages');
is(scalar keys %seen, 20000, 'each message once');
is($dups // 0, 0, 'no duplicates');
is($disorder // 0, 0, 'per key in commit order');
is(scalar keys %last, 200, 'over 200 keys');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0', 'no dead letters');
ok($node->poll_query_until('postgres', q{SELECT pending FROM outbox.lag WHERE target = 'js'}, '0'),
	'nothing pending');

relay_no_crash($node, $pid);
$node->stop;
nats_stop($_) for values %srv;
done_testing();
