# Two set-up hazards refused:
#  - a role named outbox_monitor that someone else made (it can log in, or a
#    role that is not a superuser administers it) makes CREATE EXTENSION
#    fail, rather than granting the monitoring views to it; the
#    extension's own role is NOLOGIN;
#  - proxy variables in the server's environment are ignored (through a
#    proxy the destination rules could not see where a request goes): the
#    relay says so in the log and sends straight to the target; a denied
#    target stays refused although a proxy would have carried it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('direct');
my $proxy = start_sink('proxy');

local $ENV{http_proxy} = $proxy->{url};
local $ENV{HTTPS_PROXY} = $proxy->{url};
my $node = relay_node('relay_proxy', create_extension => 0);

$node->safe_psql('postgres', q{CREATE ROLE outbox_monitor LOGIN PASSWORD 'mine'});
my ($rc, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION outbox');
like($err, qr/role "outbox_monitor" exists and is not the extension's monitoring role/,
	'a pre-existing outbox_monitor that can log in is refused');
$node->safe_psql('postgres', q{DROP ROLE outbox_monitor});
$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
is( $node->safe_psql(
		'postgres', q{SELECT rolcanlogin FROM pg_roles WHERE rolname = 'outbox_monitor'}),
	'f', 'the extension makes its own, without login');

$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('direct', '$sink->{url}/direct');
SELECT outbox.subscribe('direct', 'p');
});
$node->safe_psql('postgres', q{SELECT outbox_emit('p', '{"n": 1}')});
ok(wait_until(sub { @{ sink_attempts($sink) } >= 1 }), 'delivered to the target itself');
is(scalar @{ sink_attempts($proxy) }, 0, 'nothing went to the proxy');
like(slurp_file($node->logfile), qr/outbox relay ignores the proxy variables of its environment/,
	'the relay says it ignores the proxy variables');

# A denied address is not reached through the proxy either.
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET outbox.denied_destinations = '169.254.0.0/16, 10.255.255.0/24'; SELECT pg_reload_conf();});
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '169.254.0.0/16, 10.255.255.0/24');
# (retried for ever: the check looks for the refusal, however long it takes)
$node->safe_psql(
	'postgres', q{
INSERT INTO outbox.targets (name, kind, url, max_attempts)
VALUES ('meta', 'http', 'http://10.255.255.1/latest/meta-data/', 0);
INSERT INTO outbox.progress (target_id, lane, done_id)
SELECT id, 0, outbox.frontier() FROM outbox.targets WHERE name = 'meta';
INSERT INTO outbox.subscriptions (target_id, pattern, start_id)
SELECT id, 'm', outbox.frontier() FROM outbox.targets WHERE name = 'meta';
SELECT outbox.config_changed();
});
$node->safe_psql('postgres', q{SELECT outbox_emit('m', '{"steal": "credentials"}')});
ok( wait_until(
		sub {
			$node->safe_psql('postgres', q{SELECT last_error FROM outbox.lag WHERE target = 'meta'}) =~
			  /10\.255\.255\.1 is denied by outbox\.denied_destinations/;
		}),
	'a denied target written by hand is refused at connect');
is(scalar @{ sink_attempts($proxy) }, 0, 'and the proxy saw nothing');

relay_no_crash($node);
$node->stop;
stop_sink($sink);
stop_sink($proxy);
done_testing();
