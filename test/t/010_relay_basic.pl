# The relay worker, basics:
#  - it runs as a background worker ('outbox relay' in pg_stat_activity),
#    and before CREATE EXTENSION it waits, saying so once in the log;
#  - HTTP delivery with batch_size 1: body = payload, the documented
#    headers, and Standard Webhooks signatures checked by the sink and
#    recomputed here with Digest::SHA; a wrong secret fails the check;
#  - batch_size 100: a JSON array of envelopes, batch headers, signature;
#  - subscription patterns (exact, prefix.*, *), nothing from before the
#    subscription; unsubscribe and drop_target take effect at once;
#  - outbox.enabled = off pauses delivery (reload), on resumes it; the
#    outbox.lag view shows the backlog, dead letters and the last error;
#  - a message emitted after subscribe() committed is delivered even when
#    the worker read it with a configuration loaded just before;
#  - an empty key is sent as an empty outbox-key header;
#  - messages that come one at a time (each delivered before the next
#    commits) have their progress recorded at most every 20 ms, not in a
#    transaction of its own per message;
#  - after DROP EXTENSION and CREATE EXTENSION, a new target that got the
#    id of a dropped one receives its messages (not the old URL).
use strict;
use warnings;
use Encode qw(encode_utf8);
use JSON::PP;
use MIME::Base64 qw(encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
my $other_secret = 'whsec_' . encode_base64('another key of 24 bytes!', '');
my $json = JSON::PP->new->utf8->canonical;

my $sink = start_sink('basic', '--secret', $secret);
my $url = $sink->{url};

# --- the worker, before and after CREATE EXTENSION ---
my $node = relay_node('relay_basic', create_extension => 0);
my $waiting = qr/outbox relay is waiting for the extension to be created in database "postgres"/;
my $t0 = time;
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) FROM pg_stat_activity
		   WHERE backend_type = 'outbox relay' AND datname = 'postgres'}, '1'),
	'the relay worker runs, connected to outbox.database');
ok(wait_until(sub { slurp_file($node->logfile) =~ $waiting }),
	'before CREATE EXTENSION the worker says it is waiting');
# Let it poll (outbox.poll_interval = 1 s) a few more times.
usleep(1e6 * (3 - (time - $t0))) if time - $t0 < 3;
my @said = slurp_file($node->logfile) =~ /$waiting/g;
is(scalar @said, 1, '... once, not at every poll');
my $worker_pid = relay_worker_pid($node);

$node->safe_psql('postgres', 'CREATE EXTENSION outbox');


# Lag view columns of a target, as a hash.
sub lag_of
{
	my ($target) = @_;
	my $row = $node->safe_psql('postgres',
		qq{SELECT json_build_object('pending', pending, 'is_estimate', pending_is_estimate,
			'delivered', delivered, 'dead_letters', dead_letters, 'last_status', last_status,
			'last_error', last_error, 'last_error_at', last_error_at,
			'last_delivered_id', last_delivered_id, 'done_up_to_id', done_up_to_id,
			'oldest_pending', oldest_pending)
		   FROM outbox.lag WHERE target = '$target'});
	return $row eq '' ? undef : $json->decode($row);
}

sub wait_lag
{
	my ($target, $field, $value, $timeout) = @_;
	my $lag;
	my $ok = wait_until(sub {
		$lag = lag_of($target);
		return defined $lag && defined $lag->{$field} && $lag->{$field} eq $value;
	}, $timeout);
	diag("lag of $target: " . $json->encode($lag)) unless $ok;
	return $ok;
}

# Whether two decoded JSON values are equal (canonical encoding).
sub eq_deeply_json
{
	my ($x, $y) = @_;
	return defined $y && $json->encode($x) eq $json->encode($y);
}

# Check the Standard Webhooks headers of a record: sink verdict, and an
# independent recomputation.
sub check_signature
{
	my ($r, $what) = @_;
	my $h = $r->{headers};
	is($r->{sig_ok}, JSON::PP::true, "$what: the sink verifies the signature");
	like($h->{'webhook-timestamp'}, qr/^\d+$/, "$what: webhook-timestamp is in seconds");
	cmp_ok(abs($h->{'webhook-timestamp'} - $r->{t}), '<', 120,
		"$what: webhook-timestamp is now (when the receiver got it)");
	is( $h->{'webhook-signature'},
		webhook_signature(
			$secret, $h->{'webhook-id'}, $h->{'webhook-timestamp'},
			encode_utf8($r->{body})),
		"$what: the signature recomputed in Perl matches");
}

# --- batch_size 1: body, headers, signature ---
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('single', '$url/single',
	headers => '{"authorization": "Bearer t0ken", "x-target": "single"}',
	secret => '$secret');
SELECT outbox.subscribe('single', 'orders.created');
COMMIT;
});
my $pid_now = relay_worker_pid($node);
is($pid_now, $worker_pid, 'CREATE EXTENSION and the first target need no restart');

my ($m1, $m2) = split /\n/, $node->safe_psql(
	'postgres', q{
BEGIN;
SELECT outbox_emit('orders.created', '{"order": 1, "name": "Zoë – €5", "items": [1, 2], "nested": {"b": null}}',
	'customer-1', '{"x-tenant": "acme", "x-trace": "abc 123"}');
SELECT outbox_emit('orders.created', '{"order": 2}');
SELECT outbox_emit('orders.shipped', '{"order": 1}', 'customer-1');
COMMIT;
});
my @rows = map { [ split /\|/ ] } split /\n/, $node->safe_psql(
	'postgres', q{
SELECT id, msg_id, payload::text, coalesce(key, ''), topic FROM outbox.messages
 WHERE topic LIKE 'orders.%' ORDER BY id});
is(scalar @rows, 3, 'three messages stored');
is($rows[0][1], $m1, 'outbox_emit returned the msg_id');

my @single = sink_path_records($sink, '/single', 2);
is(scalar @single, 2, 'the two subscribed messages arrived');
@single = sort { $a->{headers}{'outbox-seq'} <=> $b->{headers}{'outbox-seq'} } @single;
my ($r1, $r2) = @single;
is($r1->{method}, 'POST', 'delivered with POST');
is(encode_utf8($r1->{body}), $rows[0][2], 'the body is the payload, as jsonb prints it');
is_deeply($json->decode(encode_utf8($r1->{body})),
	{ order => 1, name => "Zo\x{eb} \x{2013} \x{20ac}5", items => [ 1, 2 ], nested => { b => undef } },
	'... and decodes to the emitted JSON (UTF-8 intact)');
my $h = $r1->{headers};
is($h->{'webhook-id'}, $m1, 'webhook-id is the message id');
is($h->{'outbox-seq'}, $rows[0][0], 'outbox-seq is the commit-ordered id');
is($h->{'outbox-topic'}, 'orders.created', 'outbox-topic');
is($h->{'outbox-key'}, 'customer-1', 'outbox-key');
is($h->{'x-tenant'}, 'acme', 'message headers are sent');
is($h->{'x-trace'}, 'abc 123', '... with their values intact');
is($h->{authorization}, 'Bearer t0ken', 'target headers are sent');
is($h->{'x-target'}, 'single', '... all of them');
like($h->{'content-type'}, qr{^application/json}, 'content-type is application/json');
ok(!exists $h->{'outbox-count'}, 'no outbox-count for a single message');
check_signature($r1, 'single message');

is($r2->{body}, $rows[1][2], 'second message: body');
is($r2->{headers}{'webhook-id'}, $m2, 'second message: webhook-id');
ok(!exists $r2->{headers}{'outbox-key'}, 'no outbox-key header without a key');
ok(!exists $r2->{headers}{'x-tenant'}, 'message headers are per message');
check_signature($r2, 'message without a key');
ok(!(grep { $_->{headers}{'outbox-topic'} eq 'orders.shipped' } @{ sink_records($sink) }),
	'a topic the target does not subscribe to is not delivered');

# --- a wrong secret, and no secret ---
sink_control($sink, { path => '/wrong', secret => $other_secret });
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('wrong', '$url/wrong', secret => '$secret');
SELECT outbox.subscribe('wrong', 'sig.check');
SELECT outbox.create_http_target('unsigned', '$url/unsigned');
SELECT outbox.subscribe('unsigned', 'sig.check');
COMMIT;
SELECT outbox_emit('sig.check', '{"s": 1}');
});
my ($wrong) = sink_path_records($sink, '/wrong', 1);
my ($unsigned) = sink_path_records($sink, '/unsigned', 1);
is($wrong->{sig_ok}, JSON::PP::false,
	'a receiver with another secret rejects the signature');
is( $wrong->{headers}{'webhook-signature'},
	webhook_signature(
		$secret, $wrong->{headers}{'webhook-id'},
		$wrong->{headers}{'webhook-timestamp'}, encode_utf8($wrong->{body})),
	'... which is the one of the target\'s own secret');
ok(!exists $unsigned->{headers}{'webhook-signature'},
	'a target without a secret sends no webhook-signature');
ok(defined $unsigned->{headers}{'webhook-id'} && defined $unsigned->{headers}{'webhook-timestamp'},
	'... but webhook-id and webhook-timestamp');

# --- batch_size 100 ---
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('batch', '$url/batch', secret => '$secret',
	batch_size => 100, lanes => 1);
SELECT outbox.subscribe('batch', 'batch.*');
COMMIT;
});
$node->safe_psql(
	'postgres', q{
SELECT count(outbox_emit('batch.item', jsonb_build_object('i', g, 't', 'ü'),
	CASE WHEN g % 4 = 0 THEN NULL ELSE 'k' || g % 3 END,
	CASE WHEN g % 5 = 0 THEN jsonb_build_object('x-i', g::text) END))
  FROM generate_series(1, 150) g;
});
my %want = map {
	my ($id, $mid, $topic, $key, $headers, $payload, $at) = split /\t/;
	(
		$id => {
			id => $mid,
			seq => $id + 0,
			topic => $topic,
			key => $key eq '' ? undef : $key,
			headers => $headers eq '' ? undef : $json->decode($headers),
			payload => $json->decode($payload),
			emitted_at => $at
		})
} split /\n/, $node->safe_psql(
	'postgres', q{
COPY (SELECT id, msg_id, topic, coalesce(key, ''), coalesce(headers::text, ''), payload::text,
             to_json(emitted_at) #>> '{}'
        FROM outbox.messages WHERE topic = 'batch.item' ORDER BY id) TO STDOUT
		WITH (FORMAT text, DELIMITER E'\t')});
is(scalar keys %want, 150, '150 batch messages stored');
my @batch_reqs;
wait_until(
	sub {
		@batch_reqs = sink_path_records($sink, '/batch');
		my $n = 0;
		$n += $_->{headers}{'outbox-count'} // 1 for @batch_reqs;
		return $n >= 150;
	});
is(scalar @batch_reqs, 2, 'one transaction of 150 messages goes in two requests');
my @envelopes;
my $batch_ok = 1;
for my $r (@batch_reqs)
{
	my $items = $json->decode(encode_utf8($r->{body}));
	my $h = $r->{headers};
	$batch_ok &&= is(ref $items, 'ARRAY', "batch request $r->{seq}: the body is a JSON array");
	$batch_ok &&= cmp_ok(scalar @$items, '<=', 100, '... of at most batch_size envelopes');
	$batch_ok &&= is($h->{'outbox-count'}, scalar @$items, '... outbox-count counts them');
	$batch_ok &&= is($h->{'outbox-seq'}, $items->[0]{seq}, '... outbox-seq is the first seq');
	$batch_ok &&= is($h->{'webhook-id'}, "batch_$items->[0]{seq}_$items->[-1]{seq}",
		'... webhook-id is batch_<first>_<last>');
	check_signature($r, "batch request $r->{seq}");
	push @envelopes, @$items;
}
is(scalar @batch_reqs ? scalar @{ $json->decode(encode_utf8($batch_reqs[0]{body})) } : 0,
	100, 'the first batch is full');
is_deeply([ map { $_->{seq} } @envelopes ], [ sort { $a <=> $b } keys %want ],
	'every message once, in commit order, across the batches');
my @bad_env = grep { !eq_deeply_json($_, $want{ $_->{seq} }) } @envelopes;
is(scalar @bad_env, 0,
	'every envelope has the stored id, seq, topic, key, headers, payload and emitted_at');
is_deeply($bad_env[0], $want{ $bad_env[0]{seq} }, 'first mismatching envelope') if @bad_env;

# A batch target with a single message pending.
my $lone = $node->safe_psql('postgres',
	q{SELECT outbox_emit('batch.lone', '{"lone": true}', 'kl')});
my ($lone_req) = grep { $_->{body} =~ /"lone"/ } sink_path_records($sink, '/batch', 3);
ok($lone_req, 'a lone message to a batch target arrives');
if ($lone_req)
{
	my $items = $json->decode(encode_utf8($lone_req->{body}));
	is(ref $items eq 'ARRAY' && scalar @$items, 1,
		'... as an array of one envelope');
	is($items->[0]{id}, $lone, '... carrying the message id');
	note "lone message in a batch target: webhook-id $lone_req->{headers}{'webhook-id'}, outbox-count "
	  . ($lone_req->{headers}{'outbox-count'} // 'absent');
	check_signature($lone_req, 'lone batch message');
}

# --- subscription patterns ---
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('p_exact', '$url/p_exact', lanes => 1);
SELECT outbox.create_http_target('p_prefix', '$url/p_prefix', lanes => 1);
SELECT outbox.create_http_target('p_all', '$url/p_all', lanes => 1);
SELECT outbox_emit('inv.created', '{"before": "subscribe"}');
});
$node->safe_psql(
	'postgres', q{
BEGIN;
SELECT outbox.subscribe('p_exact', 'inv.created');
SELECT outbox.subscribe('p_prefix', 'inv.*');
SELECT outbox.subscribe('p_all', '*');
COMMIT;
});
my @topics = qw(inv.created inv.updated inv.created.eu inv invoice.created other);
for my $i (0 .. $#topics)
{
	$node->safe_psql('postgres', "SELECT outbox_emit('$topics[$i]', '{\"n\": $i}')");
}
my %expect = (
	p_exact => [qw(inv.created)],
	p_prefix => [qw(inv.created inv.updated inv.created.eu)],
	p_all => [@topics]);
for my $t (sort keys %expect)
{
	my @got = map { $_->{headers}{'outbox-topic'} }
	  sink_path_records($sink, "/$t", scalar @{ $expect{$t} });
	is_deeply(\@got, $expect{$t}, "pattern of $t: the matching topics, in order");
}
ok(!(grep { $_->{body} =~ /before/ } @{ sink_records($sink) }),
	'a message committed before the subscription is not delivered');

# --- unsubscribe and drop_target without a restart ---
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('u', '$url/u', lanes => 1);
SELECT outbox.subscribe('u', 'u.a');
SELECT outbox.subscribe('u', 'u.b');
COMMIT;
SELECT outbox_emit('u.a', '{"n": 1}');
SELECT outbox_emit('u.b', '{"n": 2}');
});
is(scalar(sink_path_records($sink, '/u', 2)), 2, 'target u gets both topics');
$node->safe_psql('postgres', q{SELECT outbox.unsubscribe('u', 'u.b')});
$node->safe_psql('postgres', q{SELECT outbox_emit('u.b', '{"n": 3}')});
$node->safe_psql('postgres', q{SELECT outbox_emit('u.a', '{"n": 4}')});
my @u = sink_path_records($sink, '/u', 3);
is_deeply([ map { $_->{body} } @u ], [ '{"n": 1}', '{"n": 2}', '{"n": 4}' ],
	'after unsubscribe the topic is no longer delivered, the others are');

my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT outbox.drop_target('u')});
ok( $node->wait_for_log(qr/outbox relay: target "u" was dropped/, $log_offset),
	'the worker forgets a dropped target');
$node->safe_psql('postgres', q{SELECT outbox_emit('u.a', '{"n": 5}')});
ok(wait_until(sub { grep { $_->{body} eq '{"n": 5}' } sink_path_records($sink, '/p_all', 1) }),
	'a later message reaches the other targets');
# (two turns of the relay's loop: a relay that still had u would have
# sent to it by then)
relay_went_round($node, 'postgres', 2);
is(scalar(sink_path_records($sink, '/u')), 3,
	'... but not the dropped one');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.progress p
	WHERE NOT EXISTS (SELECT FROM outbox.targets t WHERE t.id = p.target_id)}),
	'0', 'its progress rows are gone');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('p_all')});

# --- outbox.enabled = off pauses; on resumes; the lag view ---
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('pause', '$url/pause', lanes => 4);
SELECT outbox.subscribe('pause', 'pause');
COMMIT;
});
$node->append_conf('postgresql.conf', "outbox.enabled = off\n");
$node->reload;
# the worker takes the reload in its loop, and says so
$node->poll_query_until('postgres', q{SELECT state FROM outbox.worker},
	'disabled (outbox.enabled = off)')
  or die 'the relay did not take outbox.enabled = off';
$node->safe_psql('postgres',
	q{SELECT count(outbox_emit('pause', jsonb_build_object('i', g), 'k' || g % 7)) FROM generate_series(1, 20) g});
usleep(1_500_000);    # a span: longer than outbox.poll_interval
is(scalar(sink_path_records($sink, '/pause')), 0,
	'outbox.enabled = off: nothing is delivered');
my $lag = lag_of('pause');
is($lag->{pending}, 20, 'the lag view counts 20 pending messages while paused');
is($lag->{is_estimate}, JSON::PP::false, '... exactly');
ok(defined $lag->{oldest_pending}, '... and shows the oldest pending emit time');
is($lag->{delivered}, 0, '... none delivered');

$node->append_conf('postgresql.conf', "outbox.enabled = on\n");
$node->reload;
is(scalar(sink_path_records($sink, '/pause', 20)), 20,
	'outbox.enabled = on (reload): the backlog is delivered');
ok(wait_lag('pause', 'pending', 0), 'the lag view shows nothing pending afterwards');
$lag = lag_of('pause');
is($lag->{delivered}, 20, '... and 20 delivered');
is($lag->{dead_letters}, 0, '... no dead letters');
ok(!defined $lag->{last_error}, '... and no error');
is(relay_worker_pid($node),
	$worker_pid, 'the worker was never restarted');

# --- dead letters and the last error in the lag view ---
sink_control($sink, { path => '/reject', status => 400 });
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('reject', '$url/reject', lanes => 2);
SELECT outbox.subscribe('reject', 'rej');
COMMIT;
SELECT outbox_emit('rej', '{"r": 1}', 'a');
SELECT outbox_emit('rej', '{"r": 2}', 'b');
});
ok(wait_lag('reject', 'dead_letters', 2), 'two rejected messages become dead letters');
ok(wait_lag('reject', 'pending', 0), '... and are no longer pending');
$lag = lag_of('reject');
is($lag->{last_status}, 400, 'the lag view shows the last status');
like($lag->{last_error}, qr/400/, '... and the last error');
ok(defined $lag->{last_error_at}, '... and when it happened');
is($lag->{delivered}, 0, '... nothing delivered');
is( $node->safe_psql('postgres',
		q{SELECT string_agg(format('%s %s %s %s', topic, key, attempts, last_status), ',' ORDER BY id)
		    FROM outbox.dead_letters WHERE target = 'reject'}),
	'rej a 1 400,rej b 1 400',
	'outbox.dead_letters: topic, key, one attempt, status 400');

# --- a message emitted after subscribe() committed is delivered ---
# The worker loads the configuration in one transaction and reads messages
# in a later one.  Make the window between them wide and deterministic: a
# configuration reload is held up by a lock on outbox.progress (the last
# table it reads, after targets and subscriptions, in the same snapshot);
# meanwhile a subscription commits and then a matching message.  The
# message was emitted after subscribe() returned, with an id above the
# subscription's start_id: it must be delivered.
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('late', '$url/late', lanes => 1);
SELECT outbox.subscribe('late', 'late.a');
COMMIT;
});
$node->safe_psql('postgres', q{SELECT outbox_emit('late.a', '{"n": 0}')});
sink_path_records($sink, '/late', 1);
# Recorded too: the lock below must catch the configuration reload, not a
# progress write still due for that message.
$node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'late'})
  or die 'the first late message is not recorded as delivered';
my $locker = $node->background_psql('postgres');
$locker->query_safe('BEGIN; LOCK TABLE outbox.progress IN ACCESS EXCLUSIVE MODE');
$node->safe_psql('postgres', 'SELECT outbox.config_changed()');
ok( $node->poll_query_until(
		'postgres', q{SELECT wait_event_type FROM pg_stat_activity
		               WHERE backend_type = 'outbox relay'}, 'Lock'),
	'the worker\'s configuration reload waits for the lock');
$node->safe_psql('postgres', q{SELECT outbox.subscribe('late', 'late.b')});
$node->safe_psql('postgres', q{SELECT outbox_emit('late.b', '{"n": 1}')});
my $late_id = $node->safe_psql('postgres',
	q{SELECT id FROM outbox.messages WHERE topic = 'late.b' ORDER BY id DESC LIMIT 1});
cmp_ok(
	$late_id, '>',
	$node->safe_psql('postgres',
		q{SELECT start_id FROM outbox.subscriptions WHERE pattern = 'late.b'}),
	'the message has an id above the subscription\'s start_id');
$locker->query_safe('COMMIT');
$locker->quit;
$node->safe_psql('postgres', q{SELECT outbox_emit('late.b', '{"n": 2}')});
my @late = sink_path_records($sink, '/late', 3);
is_deeply([ map { $_->{body} } @late ], [ '{"n": 0}', '{"n": 1}', '{"n": 2}' ],
	'a message emitted after subscribe() committed is delivered (not skipped)');

# --- an empty key is a key ---
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('keys', '$url/keys', lanes => 1);
SELECT outbox.subscribe('keys', 'keys');
COMMIT;
});
$node->safe_psql('postgres', q{SELECT outbox_emit('keys', '{"k": "empty"}', '')});
$node->safe_psql('postgres', q{SELECT outbox_emit('keys', '{"k": "null"}')});
my @keys = sink_path_records($sink, '/keys', 2);
is_deeply([ map { $_->{headers}{'outbox-key'} } @keys ], [ '', undef ],
	'an empty key arrives as an empty outbox-key header, distinct from no key');

# --- payload text, byte for byte ---
# The relay writes a payload's JSON text itself (relay_jsonb_text): it must
# be exactly what payload::text gives, whatever the document holds.
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('exact', '$url/exact');
SELECT outbox.subscribe('exact', 'exact.text');
COMMIT;
});
my @docs = (
	q{{}}, q{[]}, q{"just a string"}, q{12345678901234567890.000100}, q{-0.0}, q{1e-7}, q{true}, q{null},
	q{{"a": {}, "b": [], "c": [{}], "d": [[]], "e": {"f": {"g": []}}}},
	q{[1, "two", null, false, {"x": [1, {"y": null}]}, [[1], [2, [3]]]]},
	q{{"esc": "quote \" backslash \\\\ slash / tab \t nl \n cr \r bs \b ff \f"}},
	q{{"ctl": "\u0001\u001f\u0000x", "uni": "Zoë – €5 😀", "\"k\\\\": 1}},
	q{{"num": [0, -1, 1.5, 1e100, 123456789012345678901234567890, 0.000000000000000000001]}},
	q{{"zzz": 1, "a": 2, "aa": 3, "b": {"y": 1, "x": 2}}},
);
# "\u0000" is refused by jsonb: leave it out of the one document that has it
$docs[11] =~ s/\\u0000//;
my $exact_in = join(",\n", map { my $d = $_; $d =~ s/'/''/g; "('$d'::jsonb)" } @docs);
# and documents with more than 32 members (their stored form records an
# offset every 32 entries), nested deep, of every type
$node->safe_psql('postgres', qq{
SELECT count(outbox_emit('exact.text', d)) FROM (VALUES $exact_in) v(d);
SELECT outbox_emit('exact.text', (SELECT jsonb_object_agg('k' || g,
		CASE g % 5 WHEN 0 THEN to_jsonb(g * 1.5) WHEN 1 THEN to_jsonb(repeat('s', g))
		WHEN 2 THEN 'null'::jsonb WHEN 3 THEN jsonb_build_array(g, 'x', g % 2 = 0, '{}'::jsonb)
		ELSE jsonb_build_object('n', g, 'e', '[]'::jsonb) END) FROM generate_series(1, 100) g));
SELECT outbox_emit('exact.text', (SELECT jsonb_agg(CASE WHEN g % 3 = 0 THEN to_jsonb(g)
		WHEN g % 3 = 1 THEN to_jsonb(E'tab\tq"' || g) ELSE jsonb_build_object('a', jsonb_build_array(g)) END)
		FROM generate_series(1, 70) g));
SELECT outbox_emit('exact.text', (SELECT string_agg('{"d": [', '') || '1' || string_agg(']}', '')
		FROM generate_series(1, 200))::jsonb);
});
# numbers of every shape numeric stores: integers and decimals, short and
# long forms (weights past 63 base-10000 digits, scales past 63), leading
# zero groups after the point, trailing zeros of the scale, negatives
$node->safe_psql('postgres', q{
SELECT outbox_emit('exact.text', (SELECT jsonb_agg(v ORDER BY g) FROM (
	SELECT g, CASE g % 7
		WHEN 0 THEN (g * 7919)::numeric * (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END)
		WHEN 1 THEN -(g * 104729.5)::numeric / 10::numeric ^ (g % 23)
		WHEN 2 THEN (g::numeric * 12345.678901) * 10::numeric ^ (g % 300)
		WHEN 3 THEN round(g::numeric / 7, g % 90)
		WHEN 4 THEN 1::numeric / 10::numeric ^ (g % 130)
		WHEN 5 THEN (g::numeric * 10000 + 0.5)::numeric(70, 30)
		ELSE round((g % 3 - 1)::numeric, g % 5) END AS v
	  FROM generate_series(1, 700) g) s));
});
push @docs, 'object of 100', 'array of 70', 'nested 200 deep', 'numbers';
my %exact_want = map { split /\t/, $_, 2 } split /\n/, $node->safe_psql(
	'postgres', q{
COPY (SELECT id, payload::text FROM outbox.messages WHERE topic = 'exact.text' ORDER BY id)
  TO STDOUT WITH (FORMAT csv, DELIMITER E'\t', QUOTE E'\x01')});
my @exact = sink_path_records($sink, '/exact', scalar @docs);
is(scalar @exact, scalar @docs, 'every document arrived');
my @exact_bad = grep { encode_utf8($_->{body}) ne ($exact_want{ $_->{headers}{'outbox-seq'} } // '') } @exact;
is(scalar @exact_bad, 0, 'each body is byte for byte payload::text');
is(encode_utf8($exact_bad[0]{body}), $exact_want{ $exact_bad[0]{headers}{'outbox-seq'} }, 'first mismatch')
  if @exact_bad;

# --- emitted_at in envelopes, byte for byte ---
# The relay writes emitted_at as to_json() does, from the text of the
# whole second it keeps: fractions with and without trailing zeros, before
# 2000 and BC, and in a time zone with a half-hour offset, then one whose
# offset in 1850 had seconds (the relay's time zone changes on reload).
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('times', '$url/times', batch_size => 100);
SELECT outbox.subscribe('times', 'times.t');
COMMIT;
});
my @times = ('2024-06-01 12:00:00+00', '2024-06-01 12:00:00.5+00', '2024-06-01 12:00:00.123456+00',
	'2024-06-01 12:00:00.000001+00', '2024-06-01 12:00:00.12+00', '2024-06-01 12:00:01.999999+00',
	'1969-12-31 23:59:59.75+00', '1999-12-31 23:59:59.5+00', '0044-03-15 10:00:00.25+00 BC',
	'1850-01-01 00:00:00.5+00', '2026-03-29 01:00:00.5+00',
	# the same second as the first: the next zone's first is not this text
	'2024-06-01 12:00:00.25+00');
my $times_sql = join(', ', map { "'$_'::timestamptz" } @times);
my $times_round = 0;
for my $zone ('UTC', 'America/St_Johns', 'Europe/Amsterdam')
{
	$node->safe_psql('postgres', qq{ALTER SYSTEM SET TimeZone = '$zone'; SELECT pg_reload_conf();});
	$times_round++;
	# The relay has the new zone once a probe's emitted_at arrives in it.
	my %probe_want;
	ok(wait_until(sub {
		my $k = 'p' . $times_round . '-' . (keys(%probe_want) + 1);
		$node->safe_psql('postgres', qq{SELECT outbox_emit('times.t', '{}', '$k')});
		$probe_want{$k} = $node->safe_psql('postgres', qq{
SET TimeZone = '$zone'; SELECT to_json(emitted_at) FROM outbox.messages WHERE key = '$k'});
		return wait_until(sub {
			my %seen = map { ($_->{body} // '') =~ /"key":"(p$times_round-\d+)".*?"emitted_at":("[^"]*")/g }
				sink_path_records($sink, '/times');
			return grep { ($probe_want{$_} // '') eq $seen{$_} } keys %seen;
		}, 3);
	}), "the relay writes emitted_at in $zone");
	# Rows inserted by hand move the id sequence before they commit: the
	# target is paused meanwhile, so that no read skips them.
	$node->safe_psql('postgres', qq{
SELECT outbox.pause_target('times');
INSERT INTO outbox.messages (id, msg_id, topic, key, payload, headers, emitted_at)
SELECT m.max_id + n, gen_random_uuid(), 'times.t', 'z$times_round', jsonb_build_object('n', n), NULL, t
  FROM (SELECT max(id) AS max_id FROM outbox.messages) m,
       unnest(ARRAY[$times_sql]) WITH ORDINALITY AS u(t, n);
});
	$node->safe_psql('postgres', q{SELECT outbox.resume_target('times')});
	my %want = map { split /\t/, $_, 2 } split /\n/, $node->safe_psql('postgres', qq{
SET TimeZone = '$zone';
COPY (SELECT id, to_json(emitted_at)::text FROM outbox.messages WHERE key = 'z$times_round')
  TO STDOUT WITH (FORMAT csv, DELIMITER E'\\t', QUOTE E'\\x01')});
	my @got;
	ok(wait_until(sub {
		@got = map { $_->{body} =~ /"seq":\s*(\d+).*?"emitted_at":\s*("[^"]*")/g }
			grep { ($_->{body} // '') =~ /"z$times_round"/ } sink_path_records($sink, '/times');
		my %seen = @got;
		return keys(%seen) >= @times }), "$zone: every time arrived");
	my %got = @got;
	is_deeply(\%got, \%want, "$zone: each emitted_at is byte for byte to_json(emitted_at)");
}
$node->safe_psql('postgres', q{ALTER SYSTEM RESET TimeZone; SELECT pg_reload_conf();});

# --- progress of messages that come one at a time ---
# Each message is acknowledged before the next is committed, so the relay
# is idle between them; it still records their progress at most every
# 20 ms, not in a transaction (and a WAL flush) of its own per message.
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('trickle', '$url/trickle', lanes => 1);
SELECT outbox.subscribe('trickle', 'trickle.one');
COMMIT;
CREATE TABLE public.trickle_writes (xid xid8, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION public.trickle_note() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
	INSERT INTO public.trickle_writes (xid) VALUES (pg_catalog.pg_current_xact_id());
	RETURN NULL;
END \$\$;
});
my $trickle_id = $node->safe_psql('postgres', q{SELECT outbox.target_id('trickle')});
$node->safe_psql('postgres', qq{
CREATE TRIGGER trickle_note AFTER UPDATE ON outbox.progress FOR EACH ROW
	WHEN (NEW.target_id = $trickle_id AND OLD.delivered <> NEW.delivered)
	EXECUTE FUNCTION public.trickle_note();
});
my $trickle_n = 40;
my $trickle_start = $node->safe_psql('postgres', q{SELECT clock_timestamp()});
# one transaction a message, 5 ms apart: each is delivered in between
$node->safe_psql('postgres', qq{
DO \$\$
BEGIN
	FOR i IN 1..$trickle_n LOOP
		PERFORM outbox_emit('trickle.one', jsonb_build_object('i', i), 'k');
		COMMIT;
		PERFORM pg_sleep(0.005);
	END LOOP;
END \$\$;
});
is(scalar(sink_path_records($sink, '/trickle', $trickle_n)), $trickle_n, 'messages one at a time: all arrive');
ok(wait_until(sub {
	$node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'trickle'}) == $trickle_n }),
	'... and their progress is recorded');
my ($trickle_writes, $trickle_ms) = split /\|/, $node->safe_psql('postgres', qq{
SELECT count(DISTINCT xid), round(extract(epoch FROM max(at) - '$trickle_start') * 1000)
  FROM public.trickle_writes});
# No more than one write per 20 ms since the first message, and the first.
cmp_ok($trickle_writes, '>=', 1, '... the trigger saw the writes');
note("each message took 20 ms or more: this cannot tell one write per message")
  if ($trickle_ms // 0) >= 20 * $trickle_n;
cmp_ok($trickle_writes, '<=', int(($trickle_ms // 0) / 20) + 2,
	"... in at most one transaction per 20 ms ($trickle_writes in $trickle_ms ms for $trickle_n messages)");
$node->safe_psql('postgres', q{
DROP TRIGGER trickle_note ON outbox.progress;
DROP FUNCTION public.trickle_note();
DROP TABLE public.trickle_writes;
});

# --- DROP EXTENSION and CREATE EXTENSION while the worker runs ---
# Target ids start over in the new extension; the worker must not confuse
# a new target with a dropped one that had the same id.
my $old_id = $node->safe_psql('postgres', q{SELECT id FROM outbox.targets WHERE name = 'single'});
$node->safe_psql('postgres', 'DROP EXTENSION outbox');
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('reborn', '$url/reborn');
SELECT outbox.subscribe('reborn', 'orders.created');
COMMIT;
});
is($node->safe_psql('postgres', q{SELECT id FROM outbox.targets WHERE name = 'reborn'}),
	$old_id, 'the new target has the id the dropped target "single" had');
my $n_single = sink_path_records($sink, '/single');
$node->safe_psql('postgres', q{SELECT outbox_emit('orders.created', '{"order": "reborn"}')});
ok(scalar(sink_path_records($sink, '/reborn', 1)), 'after re-creating the extension, the new target gets its message');
is(scalar(sink_path_records($sink, '/single')), $n_single,
	'... and nothing goes to the URL of the dropped target');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
