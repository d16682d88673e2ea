# The smaller holes of the hardening issue, each shown closed:
#  - a subscription committed while a message commits: the relay is told of
#    a target change before it becomes visible, so a message committed after
#    the subscription is delivered even when the change's COMMIT callback is
#    slow to wake the relay (outbox.test_fault = 'commit_delay');
#  - PREPARE TRANSACTION of a target change is refused (COMMIT PREPARED
#    could not wake the relay);
#  - a hand-written bad target row is skipped with a WARNING, shown in
#    outbox.lag, and the relay keeps running;
#  - message headers never replace or duplicate a target header, and an
#    empty value is sent as an empty header (it does not remove one);
#  - ids never wrap: after a restored row with an id near 2^63, emitting
#    fails at the call with a clear error;
#  - SIGTERM: the relay records what was acknowledged before it exits, so
#    a new relay sends again only what was still unanswered.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use OutboxRelayTest;

my $sink = start_sink('holes');
my $url = $sink->{url};
my $node = relay_node('small_holes', conf => "max_prepared_transactions = 2\n");

# --- the subscription race ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('race', '$url/race');
SELECT outbox.subscribe('race', 'other');
});
# The fault makes the COMMIT of a subscription wait in its callback, after
# the subscription became visible and before the relay is told, until the
# test creates a file in the data directory.  A message emitted in that
# window must be delivered.  Whether the emit fell in the window is checked
# (the subscribing session is still in its statement); if not (the file
# was there, or a minute passed), the race is tried again with a new
# topic.
$node->append_conf('postgresql.conf', "outbox.test_fault = 'commit_delay'");
$node->reload;
settings_reloaded($node, 'postgres', 'outbox.test_fault' => 'commit_delay');
my ($in_window, $race_topic);
for my $try (1 .. 10)
{
	$race_topic = "race$try";
	my $release = $node->data_dir . '/outbox_test_commit_release';
	unlink $release;
	my $sub = $node->background_psql('postgres');
	my $sub_pid = $sub->query_safe('SELECT pg_backend_pid()');
	$sub->query_until(qr/go/, qq{\\echo go
SELECT outbox.subscribe('race', '$race_topic');
});
	$node->poll_query_until('postgres',
		qq{SELECT count(*) = 1 FROM outbox.subscriptions WHERE pattern = '$race_topic'})
	  or die "the subscription to $race_topic never became visible";
	$node->safe_psql('postgres', qq{SELECT outbox_emit('$race_topic', '{"after": "subscribe"}')});
	$in_window = $node->safe_psql('postgres',
		qq{SELECT state = 'active' FROM pg_stat_activity WHERE pid = $sub_pid}) eq 't';
	open(my $fh, '>', $release) or die "cannot create $release: $!";
	close $fh;
	$sub->quit;
	last if $in_window;
	note "try $try: the emit came after the subscription's COMMIT callback; again";
}
ok($in_window, 'race: the subscription is visible (its COMMIT callback still sleeping)');
$node->append_conf('postgresql.conf', "outbox.test_fault = ''");
$node->reload;
ok( wait_until(sub { scalar(my @r = grep { $_->{body} =~ /subscribe/ && $_->{headers}{'outbox-topic'} eq $race_topic } sink_path_records($sink, '/race')) >= 1 }),
	'race: the message committed after the subscription is delivered');

# --- PREPARE ---
my ($ret, $out, $err) = $node->psql('postgres',
	q{BEGIN; SELECT outbox.subscribe('race', 'prepared'); PREPARE TRANSACTION 'p';});
like($err, qr/cannot prepare a transaction that changed outbox targets or subscriptions/,
	'PREPARE TRANSACTION of a target change is refused');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts}), '0', '... and nothing stays prepared');

# --- a bad target row ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('bad', '$url/bad', lanes => 2);
SELECT outbox.subscribe('bad', 'bad');
});
$node->safe_psql('postgres', q{
ALTER TABLE outbox.targets DROP CONSTRAINT targets_lanes_check;
UPDATE outbox.targets SET lanes = 0 WHERE name = 'bad';
});
my $pid = relay_worker_pid($node);
$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'outbox relay'});
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $pid"),
	'a new relay started');
$node->safe_psql('postgres', q{SELECT outbox_emit('bad', '{}'); SELECT outbox_emit('other', '{"still": "flowing"}')});
ok( $node->poll_query_until('postgres',
		q{SELECT last_error LIKE 'target is not delivered: lanes is not between 1 and 256%' FROM outbox.lag WHERE target = 'bad'}),
	'a target row with lanes = 0 is skipped, and outbox.lag says why');
like(slurp_file($node->logfile), qr/WARNING:  outbox relay skips target "bad": lanes/, '... with a WARNING');
ok(wait_until(sub { grep { ($_->{body} // '') =~ /"still"/ } sink_path_records($sink, '/race') }),
	'... while the other targets keep flowing');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('bad')});

# --- headers ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('hdr', '$url/hdr', headers => '{"authorization": "Bearer target", "x-empty": ""}');
SELECT outbox.subscribe('hdr', 'hdr');
SELECT outbox_emit('hdr', '{}', NULL, '{"Authorization": "Bearer emitter", "x-mine": "1", "x-blank": ""}');
});
my @h;
ok(wait_until(sub { @h = sink_path_records($sink, '/hdr'); @h >= 1 }), 'headers: delivered');
is($h[0]{headers}{authorization}, 'Bearer target',
	"a message header never replaces or duplicates the target's");
is($h[0]{headers}{'x-mine'}, '1', '... other message headers are sent');
is($h[0]{headers}{'x-blank'}, '', '... an empty message header is sent empty');
is($h[0]{headers}{'x-empty'}, '', '... and so is an empty target header');
my ($version) = slurp_file(($ENV{TESTDIR} // '.') . '/outbox.control') =~ /default_version\s*=\s*'([^']+)'/;
is($h[0]{headers}{'user-agent'} // '', "outbox/$version", '... the user agent is the relay\'s, with the version');
($ret, $out, $err) = $node->psql('postgres', q{SELECT outbox_emit('hdr', '{}', NULL, '{"user-agent": ""}')});
like($err, qr/outbox header name "user-agent" is reserved/, 'a message may not set user-agent');

# --- ids never wrap ---
$node->safe_psql('postgres',
	q{INSERT INTO outbox.messages (id, msg_id, topic, payload, emitted_at) VALUES (9223372036854775806, gen_random_uuid(), 'restored', '{}', now())});
($ret, $out, $err) = $node->psql('postgres', q{SELECT outbox_emit('t', '{}')});
like($err, qr/ERROR:  outbox message ids are exhausted/, 'after a row with an id near 2^63, emitting fails with a clear error');
like($err, qr/never wrap around/, '... saying ids never wrap');
cmp_ok($node->safe_psql('postgres', 'SELECT outbox.frontier()'), '>', 0, '... and the frontier stays positive');
$node->safe_psql('postgres', 'TRUNCATE outbox.messages');

# --- SIGTERM records what was acknowledged ---
# A fresh node: the exhausted ids above are permanent by design.
$node->stop;
my $n2 = relay_node('sigterm');
$n2->safe_psql('postgres', qq{
SELECT outbox.create_http_target('term', '$url/term', lanes => 8);
SELECT outbox.subscribe('term', 'term');
});
sink_control($sink, { path => '/term', delay_ms => 2 });
my $emitter = $n2->background_psql('postgres');
$emitter->query_safe(q{SELECT count(outbox_emit('term', jsonb_build_object('g', g), 'k' || (g % 50))) FROM generate_series(1, 3000) g});
for my $round (1 .. 3)
{
	# each termination in the middle of delivery: 200 more requests first
	# (or all of it delivered already, on a fast machine)
	my $seen = sink_stats($sink)->{by_path}{'/term'} // 0;
	wait_for("200 more requests at /term (round $round)",
		sub {
			my $n = sink_stats($sink)->{by_path}{'/term'} // 0;
			($n >= $seen + 200
				  || $n2->safe_psql('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'term'}) eq 't',
				$n);
		},
		interval => 0.02)
	  or die 'delivery is not under way';
	my $p = relay_worker_pid($n2);
	kill 'TERM', $p;
	$n2->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND pid <> $p")
	  or die 'no new relay after SIGTERM';
	$emitter->query_safe(q{SELECT count(outbox_emit('term', jsonb_build_object('g', g), 'k' || (g % 50))) FROM generate_series(1, 1000) g});
}
$emitter->quit;
ok($n2->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'term'}),
	'SIGTERM: after three terminations everything is delivered');
my %acks;
$acks{ $_->{seq} }++ for grep { $_->{status} == 204 } @{ sink_attempts($sink, '/term') };
is(scalar keys %acks, 6000, '... every message once at least');
my $again = grep { $_ > 1 } values %acks;
cmp_ok($again, '<=', 3 * 8, "... and acknowledged messages were not sent again ($again sent twice; at most the 8 lanes' unanswered requests per termination)");
like(slurp_file($n2->logfile), qr/outbox relay started/, 'the launcher started new relays');
unlike(slurp_file($n2->logfile), qr/terminating background worker "outbox relay"/, '... which exited without a FATAL');

relay_no_crash($n2);
stop_sink($sink);
$n2->stop;
done_testing();
