# Operating targets against a live receiver (README, "Operating outbox"):
# pause and resume; a 410 disables and resume continues; so does failing
# receiver-wide for disable_after; a dead letter
# retried after the receiver is fixed is delivered, in id order, with its
# webhook-id; replay from an id and from a time re-delivers to one target
# only; max_rate holds a target to its rate while another runs unthrottled;
# alter_target of url, batch size and lanes mid-stream loses nothing and
# keeps per-key order.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $sink = start_sink('operations');
my $url = $sink->{url};
my $node = relay_node('operations');

sub emit
{
	my ($topic, $from, $to, $keys) = @_;
	$keys //= 10;
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('$topic', jsonb_build_object('n', g), 'k' || (g % $keys)))"
		  . " FROM generate_series($from, $to) g");
}

sub lag
{
	my ($target, $what) = @_;
	return $node->safe_psql('postgres', "SELECT $what FROM outbox.lag WHERE target = '$target'");
}

# Messages (seq) the receiver acknowledged on a path, in arrival order.
sub acked
{
	my ($path) = @_;
	return [ grep { $_->{status} >= 200 && $_->{status} < 300 } @{ sink_attempts($sink, $path) } ];
}

# Map message id (the records' seq) to the payload's n, for a topic.
sub n_of
{
	my ($topic) = @_;
	my %n = map { split /\|/ } split /\n/,
	  $node->safe_psql('postgres', "SELECT id, payload->>'n' FROM outbox.messages WHERE topic = '$topic'");
	return \%n;
}

# Per key, acknowledged messages arrive in id order (records sorted by
# arrival; a message's first 2xx counts).
sub key_order_ok
{
	my ($list) = @_;
	my (%last, %done);
	for my $a (sort { $a->{rseq} <=> $b->{rseq} } @$list)
	{
		next if $done{ $a->{seq} }++;
		if (defined $last{ $a->{key} } && $last{ $a->{key} } > $a->{seq})
		{
			diag("key $a->{key}: $a->{seq} after $last{ $a->{key} }");
			return 0;
		}
		$last{ $a->{key} } = $a->{seq};
	}
	return 1;
}

# --- pause and resume ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('p', '$url/p', lanes => 4);
SELECT outbox.subscribe('p', 'p');
});
emit('p', 1, 50);
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'p'}),
	'pause: the first 50 are delivered');
is($node->safe_psql('postgres', q{SELECT outbox.pause_target('p')}), '0', 'pause_target returns the pending count');
is($node->safe_psql('postgres', q{SELECT state FROM outbox.targets WHERE name = 'p'}), 'paused', '... and the target is paused');
emit('p', 51, 150);
sleep 1;    # a span: a paused target would have sent by now
is(scalar @{ acked('/p') }, 50, 'a paused target receives nothing');
is(lag('p', 'pending'), '100', '... its messages accumulate');
is($node->safe_psql('postgres', q{SELECT outbox.resume_target('p')}), '100', 'resume_target returns the pending count');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'p'}),
	'after resume everything is delivered');
my $p = acked('/p');
is(scalar @$p, 150, '... each message once');
ok(key_order_ok($p), '... per key in order');

# --- 410 Gone disables; resume continues from where it stopped ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('g', '$url/g', lanes => 2);
SELECT outbox.subscribe('g', 'g');
});
emit('g', 1, 20);
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'g'}),
	'410: the first 20 are delivered');
sink_control($sink, { path => '/g', status => 410 });
emit('g', 21, 60);
ok($node->poll_query_until('postgres', q{SELECT state = 'disabled' FROM outbox.targets WHERE name = 'g'}),
	'a 410 disables the target');
like($node->safe_psql('postgres', q{SELECT state_reason FROM outbox.targets WHERE name = 'g'}),
	qr/410 Gone/, '... saying why');
emit('g', 61, 80);
sleep 1;    # a span: a disabled target would have sent (or dead-lettered) by now
is(lag('g', 'pending'), '60', 'a disabled target keeps its messages');
is(lag('g', 'dead_letters'), '0', '... dead-letters nothing');
sink_control($sink, { path => '/g', reset => JSON::PP::true });
$node->safe_psql('postgres', q{SELECT outbox.resume_target('g')});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'g'}),
	'resumed, it delivers everything');
my %g;
$g{ $_->{seq} }++ for @{ acked('/g') };
is(scalar keys %g, 80, '... all 80 reached the receiver');
ok(key_order_ok(acked('/g')), '... per key in order');

# --- failing receiver-wide for disable_after disables too ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('f', '$url/f', lanes => 1);
SELECT outbox.subscribe('f', 'f');
});
sink_control($sink, { path => '/f', status => 401 });
emit('f', 1, 5);
# Failing for as long as the test looks; disable_after comes once it saw.
ok($node->poll_query_until('postgres', q{SELECT state = 'failing' FROM outbox.lag WHERE target = 'f'}),
	'a target answering 401 is failing');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('f', disable_after => '2 seconds')});
ok($node->poll_query_until('postgres', q{SELECT state = 'disabled' FROM outbox.targets WHERE name = 'f'}),
	'... and disabled once it failed for disable_after');
like($node->safe_psql('postgres', q{SELECT state_reason FROM outbox.targets WHERE name = 'f'}),
	qr/failing since .*401/, '... saying since when and why');
is(lag('f', 'pending || \'/\' || dead_letters'), '5/0', '... keeping its messages');
sink_control($sink, { path => '/f', reset => JSON::PP::true });
$node->safe_psql('postgres', q{SELECT outbox.resume_target('f')});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'f'}),
	'... resumed, it delivers them');

# --- a dead letter retried after the receiver is fixed ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('d', '$url/d', lanes => 1, max_attempts => 1);
SELECT outbox.subscribe('d', 'd');
});
sink_control($sink, { path => '/d', status => 422 });
emit('d', 1, 5, 1);
ok($node->poll_query_until('postgres', q{SELECT dead_letters = 5 FROM outbox.lag WHERE target = 'd'}),
	'five messages become dead letters');
my @dead_wids = map { $_->{wid} } @{ sink_attempts($sink, '/d') };
sink_control($sink, { path => '/d', reset => JSON::PP::true });
emit('d', 6, 8, 1);
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'd'}),
	'later messages are delivered');
my $dead_ids = $node->safe_psql('postgres', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM outbox.dead_letters WHERE target = 'd'});
my ($second) = (split /,/, $dead_ids)[1];
is($node->safe_psql('postgres', "SELECT outbox.retry_dead_letters('d', $second)"), '1',
	'retry_dead_letters of one id returns 1');
ok($node->poll_query_until('postgres', q{SELECT dead_letters = 4 FROM outbox.lag WHERE target = 'd'}),
	'... that dead letter is delivered and gone');
is($node->safe_psql('postgres', q{SELECT outbox.retry_dead_letters('d')}), '4', 'retry all returns 4');
ok($node->poll_query_until('postgres', q{SELECT dead_letters = 0 FROM outbox.lag WHERE target = 'd'}),
	'... all are delivered');
my @retried = grep { $_->{status} == 204 } @{ sink_attempts($sink, '/d') };
my $dn = n_of('d');
is(join(',', map { $dn->{ $_->{seq} } } @retried), '6,7,8,2,1,3,4,5',
	'the later messages first, then the retried one, then the rest in id order');
is(join(',', sort @dead_wids), join(',', sort map { $_->{wid} } grep { $dn->{ $_->{seq} } <= 5 } @retried),
	'... the webhook-ids they were first sent with');

# --- replay from an id and from a time, to one target only ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('r1', '$url/r1', lanes => 4);
SELECT outbox.subscribe('r1', 'r');
SELECT outbox.create_http_target('r2', '$url/r2', lanes => 4);
SELECT outbox.subscribe('r2', 'r');
});
emit('r', 1, 100);
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target IN ('r1', 'r2')}),
	'replay: 100 delivered to both');
my $from = $node->safe_psql('postgres', q{SELECT id FROM outbox.messages WHERE topic = 'r' AND payload->>'n' = '61'});
is($node->safe_psql('postgres', "SELECT outbox.replay('r1', $from)"), '40', 'replay from an id returns 40');
ok(wait_until(sub { scalar @{ acked('/r1') } >= 140 }), '... r1 receives them again');
# once progress records them, nothing more of the replay is on its way
$node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'r1'})
  or die 'r1 did not finish the replay';
is(scalar @{ acked('/r1') }, 140, '... exactly those 40');
my $rn = n_of('r');
is(join(',', sort { $a <=> $b } map { $rn->{ $_->{seq} } } @{ acked('/r1') }[100 .. 139]),
	join(',', 61 .. 100), '... messages 61 to 100');
is(scalar @{ acked('/r2') }, 100, '... r2 is not disturbed');
my %first_wid;
$first_wid{ $_->{seq} } //= $_->{wid} for @{ acked('/r1') };
ok(!(grep { $first_wid{ $_->{seq} } ne $_->{wid} } @{ acked('/r1') }), '... with the same webhook-ids');
ok(key_order_ok([ @{ acked('/r1') }[100 .. 139] ]), '... per key in order');

my $since = $node->safe_psql('postgres', q{SELECT now()});
usleep(20_000);    # a span: what is emitted next is stamped after $since
emit('r', 101, 110);
ok(wait_until(sub { scalar @{ acked('/r1') } >= 150 }), 'ten more delivered');
# replay counts what progress says was delivered: the receiver has them
# before the relay records them (up to 20 ms after the acknowledgement).
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'r1'}),
	'... and recorded as delivered');
is($node->safe_psql('postgres', "SELECT outbox.replay('r1', '$since'::timestamptz)"), '10',
	'replay since a time returns 10');
ok(wait_until(sub { scalar @{ acked('/r1') } >= 160 }), '... and re-delivers them');
$rn = n_of('r');
is(join(',', sort { $a <=> $b } map { $rn->{ $_->{seq} } } @{ acked('/r1') }[150 .. 159]),
	join(',', 101 .. 110), '... the messages emitted since then');

# --- max_rate holds a target to its rate; another runs unthrottled ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('slow', '$url/slow', lanes => 8);
SELECT outbox.subscribe('slow', 'rate');
SELECT outbox.create_http_target('fast', '$url/fast', lanes => 8);
SELECT outbox.subscribe('fast', 'rate');
SELECT outbox.alter_target('slow', max_rate => 50);
});
emit('rate', 1, 400, 50);
ok(wait_until(sub { scalar @{ acked('/fast') } >= 400 }), 'the unthrottled target gets all 400');
my $fast = acked('/fast');
ok(wait_until(sub { scalar @{ acked('/slow') } >= 150 }), 'the limited target gets 150');
my $slow = acked('/slow');
my $rate = (150 - 50) / ($slow->[149]{t} - $slow->[49]{t});
note("max_rate 50: measured $rate requests/s");
# The upper bound is the limit itself (the bucket holds at most 2.5
# requests, so there is no catch-up burst); the lower one only says the
# limit does not throttle far below the rate, with room for a loaded
# machine.
cmp_ok($rate, '>=', 25, 'max_rate 50: not far below 50 a second');
cmp_ok($rate, '<=', 60, '... at most 60 a second');
# (the unthrottled target beats the limited one's ceiling)
my $fast_rate = 399 / (($fast->[399]{t} - $fast->[0]{t}) || 0.001);
cmp_ok($fast_rate, '>', 60, sprintf('... while the other target ran faster (%.0f a second)', $fast_rate));
$node->safe_psql('postgres', q{SELECT outbox.alter_target('slow', max_rate => 0)});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'slow'}),
	'max_rate => 0 lifts the limit');

# --- alter_target of url, batch size and lanes mid-stream ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('a', '$url/a1', lanes => 4);
SELECT outbox.subscribe('a', 'a');
});
sink_control($sink, { path => '/a1', delay_ms => 5 });
my $total = 0;
my $bg = $node->background_psql('postgres');
for my $step (0 .. 5)
{
	$bg->query_safe("SELECT count(outbox_emit('a', jsonb_build_object('n', g), 'k' || (g % 20))) FROM generate_series("
		  . ($total + 1) . ', ' . ($total + 300) . ') g');
	$total += 300;
	# what came after the change of URL goes there before the URL changes back
	wait_for('a delivery at the new URL', sub { scalar @{ acked('/a2') } > 0 })
	  or die 'nothing reached the new URL' if $step == 2;
	$node->safe_psql('postgres', q{SELECT outbox.alter_target('a', url => '} . "$url/a2" . q{')}) if $step == 1;
	$node->safe_psql('postgres', q{SELECT outbox.alter_target('a', batch_size => 25)}) if $step == 2;
	$node->safe_psql('postgres', q{SELECT outbox.alter_target('a', lanes => 7)}) if $step == 3;
	$node->safe_psql('postgres', q{SELECT outbox.alter_target('a', lanes => 2, batch_size => 1, url => '} . "$url/a1" . q{')}) if $step == 4;
	usleep(100_000);    # a span: the changes spread over the delivery
}
$bg->quit;
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'a'}),
	'alter_target mid-stream: everything is delivered');
is($node->safe_psql('postgres', q{SELECT lanes || '/' || batch_size FROM outbox.targets WHERE name = 'a'}),
	'2/1', '... with the last lanes and batch size');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'a'}),
	'2', '... and as many lanes of progress');
my @a = (@{ acked('/a1') }, @{ acked('/a2') });
my %seen;
$seen{ $_->{seq} }++ for @a;
is(scalar keys %seen, $total, "... all $total messages reached the receiver");
is(scalar(grep { $_ > 1 } values %seen), 0, '... none twice');
ok(scalar @{ acked('/a2') } > 0, '... some at the new URL');
ok(key_order_ok(\@a), '... per key in order');

# --- new lanes after a relay restart, with lanes at different positions ---
# Lane of key k3 is stuck (503), the other lane goes ahead; new lanes are
# asked for, then the relay restarts before they are applied: the lane
# behind must catch up before keys are redistributed, or messages are lost.
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('z', '$url/z', lanes => 2, max_attempts => 0);
SELECT outbox.subscribe('z', 'z');
});
sink_control($sink, { key => 'k3', status => 503 });
emit('z', 1, 200, 10);
ok(wait_until(sub { scalar @{ acked('/z') } >= 60 }), 'new lanes: the lane without k3 delivers');
$node->safe_psql('postgres', q{SELECT outbox.alter_target('z', lanes => 3)});
my $old_relay = relay_worker_pid($node);
my $k3_refused = sub { scalar grep { $_->{key} eq 'k3' && $_->{status} == 503 } @{ sink_attempts($sink, '/z') } };
$node->safe_psql('postgres', "SELECT pg_terminate_backend($old_relay)");
ok($node->poll_query_until('postgres', "SELECT pid IS NOT NULL AND pid <> $old_relay FROM outbox.worker"),
	'... the relay restarts');
# (counted once the old relay is gone: what comes now is the new one's)
my $refused_before = $k3_refused->();
# the new relay is stuck on k3 too (its lanes not yet redistributed)
wait_for('the new relay to try k3', sub { my $n = $k3_refused->(); ($n > $refused_before, "$n refusals") })
  or die 'the new relay never tried k3';
sink_control($sink, { key => 'k3', reset => JSON::PP::true });
ok($node->poll_query_until('postgres', q{SELECT lanes = 3 FROM outbox.targets WHERE name = 'z'}),
	'... the new lanes are applied');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'z'}),
	'... everything is delivered');
my %z;
$z{ $_->{seq} }++ for @{ acked('/z') };
is(scalar keys %z, 200, '... all 200 messages, none lost');
is(scalar(grep { $_ > 1 } values %z), 0, '... none twice');
ok(key_order_ok(acked('/z')), '... per key in order');

# --- a dead letter delivered again does not move its lane's position ---
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('q', '$url/q', lanes => 1, max_attempts => 1);
SELECT outbox.subscribe('q', 'q');
});
sink_control($sink, { key => 'bad', status => 422 });
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('q', jsonb_build_object('n', g), CASE WHEN g = 5 THEN 'bad' ELSE 'good' END))
	    FROM generate_series(1, 10) g});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 AND dead_letters = 1 FROM outbox.lag WHERE target = 'q'}),
	'one of ten is a dead letter');
my $qn = n_of('q');
my ($q1) = grep { $qn->{$_} == 1 } keys %$qn;
sink_control($sink, { key => 'bad', reset => JSON::PP::true });
sink_control($sink, { path => '/q', status => 401 });   # held: nothing acknowledged, nothing dead
my $refused_q = grep { $_->{status} == 401 } @{ sink_attempts($sink, '/q') };
$node->safe_psql('postgres', qq{BEGIN; SELECT outbox.replay('q', $q1); SELECT outbox.retry_dead_letters('q'); COMMIT;});
# the relay tried (and was refused) twice since
wait_for('two refused attempts at /q', sub {
	my $n = grep { $_->{status} == 401 } @{ sink_attempts($sink, '/q') };
	($n >= $refused_q + 2, $n - $refused_q) })
  or die 'the relay did not try q';
is($node->safe_psql('postgres', q{SELECT done_id FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id WHERE t.name = 'q'}),
	$q1 - 1, 'replayed with a dead letter delivered again, nothing acknowledged: the position stays');
sink_control($sink, { path => '/q', reset => JSON::PP::true });
ok($node->poll_query_until('postgres', q{SELECT pending = 0 AND dead_letters = 0 FROM outbox.lag WHERE target = 'q'}),
	'... then everything is delivered');

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
