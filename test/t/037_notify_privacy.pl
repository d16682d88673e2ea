# NOTIFY is visible to every role that can connect, and what to do about it:
#  - a role with no grant at all LISTENs on a NOTIFY target's channel and
#    reads the payload of another team's message (the README's warning);
#  - an envelope_only target sends the envelope without payload and
#    headers: that role learns only that a message exists (id, seq, topic,
#    key), while a listener granted a view of its topic reads the payload
#    from the table by seq;
#  - per-topic grants hold at emit with the relay running: a role granted
#    'app.*' emits there and is refused elsewhere, and its messages are
#    delivered;
#  - alter_target switches envelope_only live;
#  - a channel name that needs quoting, and looks like SQL, is notified as
#    named (it is never spliced into SQL).
use strict;
use warnings;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $json = JSON::PP->new->utf8->canonical;
my $node = relay_node('relay_notify_privacy');

$node->safe_psql(
	'postgres', q{
CREATE ROLE nosy LOGIN;
CREATE ROLE payroll_reader LOGIN;
CREATE ROLE app LOGIN;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO app;
SELECT outbox.create_notify_target('loud', 'payroll_loud');
SELECT outbox.subscribe('loud', 'payroll.*');
SELECT outbox.create_notify_target('quiet', 'payroll_quiet', envelope_only => true);
SELECT outbox.subscribe('quiet', 'payroll.*');
SELECT outbox.subscribe('quiet', 'app.*');
-- A channel name that needs quoting in LISTEN, and looks like SQL.
SELECT outbox.create_notify_target('odd', 'Pay "roll"; DROP TABLE x; --');
SELECT outbox.subscribe('odd', 'payroll.*');
-- What the payroll team may read: its topic's messages, through a view.
CREATE SCHEMA payroll;
CREATE VIEW payroll.messages WITH (security_barrier) AS
	SELECT id, msg_id, topic, key, payload, headers, emitted_at
	  FROM outbox.messages WHERE topic LIKE 'payroll.%';
GRANT USAGE ON SCHEMA payroll TO payroll_reader;
GRANT SELECT ON payroll.messages TO payroll_reader;
});

# A listener session as role $role; returns a closure that collects the
# notifications received so far: [ [channel, payload] ].
sub listener
{
	my ($role, @channels) = @_;
	my ($in, $out, $err) = ('', '', '');
	# (the time limit is one collect's: it starts anew each time)
	my $timer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres') . " user=$role" ],
		'<', \$in, '>', \$out, '2>', \$err, $timer);
	$in .= join('', map { (my $q = $_) =~ s/"/""/g; qq{LISTEN "$q";\n} } @channels);
	my $tick = 0;
	my @got;
	my $collect = sub {
		return \@got unless $h->pumpable;
		$tick++;
		$timer->start($PostgreSQL::Test::Utils::timeout_default);
		$in .= "SELECT 'tick $tick';\n";
		$h->pump while $h->pumpable && $out !~ /^tick $tick$/m;
		while ($out =~
			s/^Asynchronous notification "(.+?)" with payload "(.*)" received from server process with PID \d+\.\n//m)
		{
			push @got, [ $1, $2 ];
		}
		$out =~ s/^tick \d+\n//mg;
		return \@got;
	};
	$collect->();
	return ($collect, $h, \$err);
}

my ($nosy, $nosy_h, $nosy_err) = listener('nosy', 'payroll_loud', 'payroll_quiet', 'Pay "roll"; DROP TABLE x; --');
is($$nosy_err, '', 'a role with no grants may LISTEN on any channel');

$node->safe_psql('postgres',
	q{SELECT outbox_emit('payroll.paid', '{"employee": "e-17", "salary": 98000}', 'e-17', '{"x-team": "payroll"}')});

ok(wait_until(sub { @{ $nosy->() } >= 3 }), 'the nosy listener got the three notifications');
my %by_chan = map { $_->[0] => $_->[1] } @{ $nosy->() };
like($by_chan{payroll_loud}, qr/"salary":\s*98000/,
	'a normal NOTIFY target shows the payload to every listener (the README says so)');
like($by_chan{'Pay "roll"; DROP TABLE x; --'}, qr/"seq"/,
	'a channel whose name needs quoting (and looks like SQL) is notified as named');
my $env = $json->decode($by_chan{payroll_quiet});
is($env->{payload_omitted}, JSON::PP::true, 'envelope_only: no payload');
is($env->{headers_omitted}, JSON::PP::true, 'envelope_only: no headers');
unlike($by_chan{payroll_quiet}, qr/98000|x-team|payroll"\}/, 'nothing of the payload or headers leaks');
is($env->{topic}, 'payroll.paid', 'the envelope names the topic');
ok($env->{seq} > 0, 'and the seq to read the message by');

# The nosy role cannot read the message; the payroll reader can, by seq.
my ($rc, $out, $err) = $node->psql('postgres', "SELECT payload FROM outbox.messages WHERE id = $env->{seq}",
	extra_params => [ '-U', 'nosy' ]);
like($err, qr/permission denied/, 'the nosy role cannot read outbox.messages');
($rc, $out, $err) = $node->psql('postgres', "SELECT payload FROM payroll.messages WHERE id = $env->{seq}",
	extra_params => [ '-U', 'nosy' ]);
like($err, qr/permission denied/, 'nor the payroll view');
is( $node->safe_psql(
		'postgres', "SELECT payload->>'salary' FROM payroll.messages WHERE id = $env->{seq}",
		extra_params => [ '-U', 'payroll_reader' ]),
	'98000',
	'the granted listener reads the message from its view by seq');

# Per-topic grants with the relay running.
$node->safe_psql(
	'postgres', q{
SELECT outbox.grant_topic('app', 'app.*');
ALTER SYSTEM SET outbox.check_topic_grants = on;
SELECT pg_reload_conf();
});
# the app role's sessions start with the setting the postmaster has
settings_reloaded($node, 'postgres', 'outbox.check_topic_grants' => 'on');
is( $node->safe_psql(
		'postgres', q{SELECT outbox_emit('app.signup', '{"user": 1}') IS NOT NULL},
		extra_params => [ '-U', 'app' ]),
	't',
	'the app role emits to its granted topics');
($rc, $out, $err) = $node->psql('postgres', q{SELECT outbox_emit('payroll.paid', '{"forged": true}')},
	extra_params => [ '-U', 'app' ]);
like($err, qr/permission denied to emit to outbox topic "payroll.paid"/,
	'and is refused on a topic it holds no grant for');
ok(wait_until(sub { grep { $_->[1] =~ /app\.signup/ } @{ $nosy->() } }),
	'its message is delivered');
ok(!(grep { $_->[1] =~ /forged/ } @{ $nosy->() }), 'the refused one is not');

# envelope_only switched off live.
$node->safe_psql('postgres', q{SELECT outbox.alter_target('quiet', envelope_only => false)});
$node->safe_psql('postgres', q{SELECT outbox_emit('payroll.paid', '{"salary": 12345}')});
ok( wait_until(
		sub { grep { $_->[0] eq 'payroll_quiet' && $_->[1] =~ /12345/ } @{ $nosy->() } }),
	'alter_target(envelope_only => false) sends payloads again');

$nosy_h->kill_kill;
relay_no_crash($node);
$node->stop;
done_testing();
