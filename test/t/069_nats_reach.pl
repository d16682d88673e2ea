# What an application that may only emit can make a NATS target do (issue
# 41), against a real nats-server -js on loopback, the messages emitted by
# a role that has nothing but EXECUTE on outbox_emit():
#  - a topic or key filled into the subject template never reaches the
#    server's API namespace ("$...") or where replies go ("_INBOX.") unless
#    the template's own text names it: "$JS.API.STREAM.DELETE.VICTIM" does
#    not delete the stream VICTIM, "_INBOX..." and "_{topic}" filled with
#    "INBOX.z" are refused too; each such message is a dead letter naming
#    the subject, and the target goes on;
#  - a publish answered by a service rather than a stream is published
#    once (the service sees it once), then becomes a dead letter with the
#    reason: it is not sent again however many attempts are allowed;
#  - the same when the service answers after the relay gave the attempt
#    up (the answer names the message: its id is in the reply subject);
#  - a header name of 256 bytes arrives; one with an empty value is left
#    out, as documented;
#  - a message whose topic, key or a header carries the text "Nats-Msg-Id"
#    (which nats-server can take for the relay's de-duplication header),
#    or whose key is blanks only (which libnats reads wrongly), is a dead
#    letter naming the header.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use OutboxRelayTest;
use OutboxNats;

my $nats = nats_start('reach');
my $url = $nats->{url};
nats_tool($url, 'create', 'VICTIM', 'victim.>');
nats_tool($url, 'create', 'EV', 'ev.>');
is(nats_count($url, 'VICTIM'), 0, 'the stream VICTIM exists');

# (retries 10 to 20 s apart: a service's late answer, below, comes before
# the retry, as the test lets it go as soon as the first attempt failed)
my $node = relay_node('nats_reach',
	conf => "outbox.retry_base_delay = 20000\noutbox.retry_max_delay = 20000\n");
# max_attempts 0: nothing here may become a dead letter by running out of
# attempts, only for what it is
$node->safe_psql('postgres', qq{
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO app;
	SELECT outbox.create_nats_target('n', '$url', subject => '{topic}', lanes => 1,
		max_attempts => 0, timeout_ms => 10000);
	SELECT outbox.subscribe('n', '*');
	SELECT outbox.create_nats_target('u', '$url', subject => '_{key}', lanes => 1,
		max_attempts => 0);
	SELECT outbox.subscribe('u', 'ev.u');
});

sub emit_as_app
{
	my ($topic, $key) = @_;
	$node->safe_psql('postgres',
		'SELECT outbox_emit(' . sql_literal($topic) . q{, '{"n": 1}', } . sql_literal($key) . ')',
		extra_params => [ '-U', 'app' ]);
}

# The dead letters of target $t: "topic|key|error" lines, in id order.
sub dead_letters
{
	my ($t) = @_;
	return [ split /\n/, $node->safe_psql('postgres',
		"SELECT topic || '|' || coalesce(key, '') || '|' || last_error"
		  . " FROM outbox.dead_letters WHERE target = '$t' ORDER BY id") ];
}

# --- the server's namespaces, reached through the template ---
emit_as_app('$JS.API.STREAM.DELETE.VICTIM');
emit_as_app('$JS.API.STREAM.PURGE.EV');
emit_as_app('_INBOX.x.0.1.0');
emit_as_app('_R_.abc.def');
emit_as_app('ev.u', 'INBOX.z');
emit_as_app('ev.after');

ok_wait('the stream EV holds ev.u and ev.after (target n went past the refused ones)',
	sub { my $n = nats_count($url, 'EV'); return ($n == 2, "$n messages in EV") });
is(nats_count($url, 'VICTIM'), 0, 'the stream VICTIM still exists: its delete was never published');
ok_wait('target n: four dead letters',
	sub { my $d = dead_letters('n'); return (@$d == 4, join('; ', @$d)) });
my $dl = dead_letters('n');
like($dl->[0] // '', qr/^\$JS\.API\.STREAM\.DELETE\.VICTIM\|\|it begins with "\$", the server's API namespace, which only the target's subject template may name: the subject "\$JS\.API\.STREAM\.DELETE\.VICTIM" is not one to publish to$/,
	'... the delete request, naming its subject and the reason');
like($dl->[1] // '', qr/^\$JS\.API\.STREAM\.PURGE\.EV\|/, '... the purge request');
like($dl->[2] // '', qr/^_INBOX\.x\.0\.1\.0\|\|it begins as the subjects where replies go do .*: the subject "_INBOX\.x\.0\.1\.0" is not one to publish to$/,
	'... a subject where replies go');
like($dl->[3] // '', qr/^_R_\.abc\.def\|\|it begins as the subjects where replies go do/,
	'... and one of the server\'s reply subjects for service imports');
ok_wait('target u: the key that made "_INBOX.z" is a dead letter',
	sub { my $d = dead_letters('u');
		  return (@$d == 1 && $d->[0] =~ /^ev\.u\|INBOX\.z\|it begins as the subjects where replies go do .*: the subject "_INBOX\.z" is not one to publish to$/,
			  join('; ', @$d)) });
ok_wait('neither target is held', sub {
	my $s = $node->safe_psql('postgres', q{SELECT string_agg(target || ' ' || state, ', ' ORDER BY target) FROM outbox.lag});
	return ($s eq 'n idle, u idle', $s) });

# --- nothing of a message's headers dropped ---
my $long = 'h' x 256;
$node->safe_psql('postgres', qq{SELECT outbox_emit('ev.headers', '{}', NULL, '{"$long": "v", "x-empty": ""}')},
	extra_params => [ '-U', 'app' ]);
ok_wait('ev.headers is in EV',
	sub { my $n = nats_count($url, 'EV'); return ($n == 3, "$n messages in EV") });
my ($with) = grep { $_->{subject} eq 'ev.headers' } @{ nats_dump($url, 'EV') };
is($with->{headers}{$long}, 'v', 'a header name of 256 bytes (what outbox_emit() takes) arrives');
ok(!exists $with->{headers}{'x-empty'}, 'a header with an empty value is left out, as documented (libnats would read the next line as its value)');

# --- a service, not a stream, answers on the subject ---
my $heard = "$PostgreSQL::Test::Utils::tmp_check/nats_reach_heard";
my $service = IPC::Run::start([ OutboxNats::nats_tool_path(), 'respond', $url, 'svc.>',
	'{"type":"io.nats.micro.v1.info_response"}', $heard ]);
ok_wait('the service listens',
	sub { return (-e $heard && PostgreSQL::Test::Utils::slurp_file($heard) =~ /^ready$/m) });
emit_as_app('svc.one');
emit_as_app('ev.last');
ok_wait('svc.one is a dead letter of target n, not published again',
	sub { my $d = dead_letters('n');
		  return (@$d == 5 && $d->[4] =~ /^svc\.one\|\|NATS answered the publish to "svc\.one" with something other than a JetStream acknowledgement .*: it is not published again$/,
			  join('; ', @$d)) });
ok_wait('ev.last follows it into EV',
	sub { my $n = nats_count($url, 'EV'); return ($n == 4, "$n messages in EV") });
my @heard = grep { $_ ne 'ready' } split /\n/, PostgreSQL::Test::Utils::slurp_file($heard);
is_deeply(\@heard, ['svc.one'], 'the service was asked once');
is($node->safe_psql('postgres', q{SELECT attempts FROM outbox.dead_letters WHERE topic = 'svc.one'}),
	'1', '... in one attempt');
$service->kill_kill;

# --- a service that answers late: after the relay gave the attempt up ---
my $heard2 = "$PostgreSQL::Test::Utils::tmp_check/nats_reach_heard2";
my $hold = "$PostgreSQL::Test::Utils::tmp_check/nats_reach_hold";
unlink $hold;
my $slow = IPC::Run::start([ OutboxNats::nats_tool_path(), 'respond', $url, 'svc2.>',
	'{"type":"io.nats.micro.v1.info_response"}', $heard2, $hold ]);
ok_wait('the slow service listens',
	sub { return (-e $heard2 && PostgreSQL::Test::Utils::slurp_file($heard2) =~ /^ready$/m) });
emit_as_app('svc2.late');
ok_wait('the slow service got the request',
	sub { return (PostgreSQL::Test::Utils::slurp_file($heard2) =~ /^svc2\.late$/m) });
ok_wait('the relay gave the first attempt up (no answer within timeout_ms)', sub {
	my $f = $node->safe_psql('postgres', q{SELECT failed_attempts FROM outbox.lag WHERE target = 'n'});
	return ($f ne '' && $f >= 1, "failed_attempts $f") });
open(my $fh, '>', $hold) or die "cannot create $hold: $!";
close $fh;
ok_wait('svc2.late is a dead letter, not published again',
	sub { my $d = dead_letters('n');
		  return (@$d == 6 && $d->[5] =~ /^svc2\.late\|\|NATS answered the publish to "svc2\.late" with something other than a JetStream acknowledgement/,
			  join('; ', @$d)) });
my @heard2 = grep { $_ ne 'ready' } split /\n/, PostgreSQL::Test::Utils::slurp_file($heard2);
is_deeply(\@heard2, ['svc2.late'], 'the slow service was asked once: its late answer counted');
$slow->kill_kill;

# --- the text "Nats-Msg-Id" in a header the relay sends ---
# nats-server takes its first occurrence in the header block, in libnats'
# hash order, for the de-duplication id: such a message is a dead letter
# naming the header, and the next one goes on.
$node->safe_psql('postgres', q{
	SELECT outbox_emit('ev.id1', '{}', NULL, '{"x-note": "see Nats-Msg-Id: x"}');
	SELECT outbox_emit('ev.Nats-Msg-Id', '{}');
	SELECT outbox_emit('ev.id3', '{}', 'k-Nats-Msg-Id');
	SELECT outbox_emit('ev.id4', '{}', NULL, '{"x-Nats-Msg-Id": "v"}');
	SELECT outbox_emit('ev.blank1', '{}', '   ');
	SELECT outbox_emit('ev.blank2', '{}', NULL, '{"x-b": " \t "}');
	SELECT outbox_emit('ev.tail', '{}', NULL, '{"x-note": "nats msg id"}');
}, extra_params => [ '-U', 'app' ]);
ok_wait('ev.blank2 and ev.tail follow them into EV',
	sub { my $n = nats_count($url, 'EV'); return ($n == 6, "$n messages in EV") });
ok_wait('each message carrying "Nats-Msg-Id" in a header is a dead letter naming the header',
	sub { my $d = dead_letters('n');
		  my @id = @$d[ 6 .. $#$d ];
		  my $re = sub { qr/^\Q$_[0]\E\|\Q$_[1]\E\|its header "\Q$_[2]\E" carries the text "Nats-Msg-Id", which nats-server can take for the relay's de-duplication header: not published$/ };
		  return (@id >= 4 && $id[0] =~ $re->('ev.id1', '', 'x-note') && $id[1] =~ $re->('ev.Nats-Msg-Id', '', 'outbox-topic')
			  && $id[2] =~ $re->('ev.id3', 'k-Nats-Msg-Id', 'outbox-key') && $id[3] =~ $re->('ev.id4', '', 'x-Nats-Msg-Id'),
			  join('; ', @id)) });
# a key of blanks only: libnats would read its header as empty and take
# the next header's line for it (a header value of blanks only is stored as
# an empty one, which is left out, as documented)
ok_wait('... and so is one whose key is blanks only',
	sub { my $d = dead_letters('n');
		  my @b = @$d[ 10 .. $#$d ];
		  return (@b == 1 && $b[0] =~ /^ev\.blank1\|   \|its header "outbox-key" holds only blanks, which libnats \(the C client\) reads as an empty value and then takes the next header's line for it: not published$/,
			  join('; ', @b)) });
my @published = grep { $_->{subject} =~ /^ev\.(id|Nats|tail|blank)/ } @{ nats_dump($url, 'EV') };
is(join(',', sort map { $_->{subject} } @published), 'ev.blank2,ev.tail', '... none of them was published');
my ($blank2) = grep { $_->{subject} eq 'ev.blank2' } @published;
ok($blank2 && !exists $blank2->{headers}{'x-b'}, 'a header value of blanks only is left out, as an empty one is');

relay_no_crash($node);
$node->stop;
nats_stop($nats);
done_testing();
