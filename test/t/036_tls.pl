# HTTPS targets and their TLS files (ca_file, client_cert, client_key),
# end to end against HTTPS receivers (test/sink/outbox_sink.py --tls-*),
# with a throwaway CA made by the openssl command line:
#  - verification is always on: a server certificate of a CA the system
#    does not know is refused, the target retries (nothing dead-lettered
#    with max_attempts 0; with max_attempts 2 it holds the target instead of
#    dead-lettering), outbox.lag shows the certificate error; once
#    alter_target() gives it ca_file, the waiting messages arrive once, in
#    order; ca_file => '' removes it again, live;
#  - an unrelated CA is refused, also while a verified connection to the
#    same receiver is open;
#  - a certificate for another host name is refused even with the right CA;
#  - mutual TLS: without a client certificate the handshake fails and is
#    retried; with client_cert / client_key the messages arrive and the
#    receiver sees the client's subject; a target without the certificate
#    does not ride on an authenticated connection, nor does the target once
#    its certificate is removed;
#  - a TLS file that disappears after creation: the relay reports it and
#    goes on once the file is back;
#  - only superusers and members of pg_read_server_files name TLS files
#    (42501 otherwise, even with EXECUTE and table rights);
#  - a missing, unreadable or relative path is refused at once (22023).
use strict;
use warnings;
use File::Copy qw(copy);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxTls;

# --- certificates ---
my $dir = tls_dir();

make_ca('ca', 'outbox test CA');
make_ca('other-ca', 'unrelated CA');
make_cert('server', 'ca', '/O=outbox-test/CN=127.0.0.1',
	"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
make_cert('elsewhere', 'ca', '/O=outbox-test/CN=elsewhere.invalid',
	"subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n");
make_cert('client', 'ca', '/O=outbox-test/CN=outbox-relay-client',
	"extendedKeyUsage=clientAuth\n");
my $ca = "$dir/ca.pem";
my $other_ca = "$dir/other-ca.pem";
my $client_cert = "$dir/client.pem";
my $client_key = "$dir/client.key";
my $client_subject = 'organizationName=outbox-test,commonName=outbox-relay-client';

# --- receivers ---
# tls: HTTPS with the server certificate; elsewhere: HTTPS with a
# certificate of the same CA for another host; mtls: HTTPS that requires a
# client certificate of the CA.  Their /_control and /_stats speak HTTPS
# too; the test reads their record files and logs only.
my %sink;
$sink{tls} = start_sink('tls', '--status', '200',
	'--tls-cert', "$dir/server.pem", '--tls-key', "$dir/server.key");
$sink{elsewhere} = start_sink('elsewhere', '--status', '200',
	'--tls-cert', "$dir/elsewhere.pem", '--tls-key', "$dir/elsewhere.key");
$sink{mtls} = start_sink('mtls', '--status', '200',
	'--tls-cert', "$dir/server.pem", '--tls-key', "$dir/server.key",
	'--tls-client-ca', $ca);
my %url = map { $_ => "https://127.0.0.1:$sink{$_}{port}" } keys %sink;

# The handshakes a receiver saw fail, as the reasons it logged.
sub handshake_failures
{
	my ($name) = @_;
	my $log = $sink{$name}{log};
	return () unless -e $log;
	return (slurp_file($log) =~ /^tls handshake failed #\d+: (.*)$/mg);
}

my $node = relay_node('tls', conf => "outbox.retry_max_delay = 300\n");

sub lag
{
	my ($target, $what) = @_;
	return $node->safe_psql('postgres', "SELECT $what FROM outbox.lag WHERE target = '$target'");
}

# Failed attempts the relay tried again (outbox.stats).
sub retries
{
	my ($target) = @_;
	return $node->safe_psql('postgres', "SELECT retries FROM outbox.stats WHERE target = '$target'");
}

# Whether outbox.lag shows an error for the target.
sub defined_error
{
	my ($target) = @_;
	return lag($target, 'last_error IS NOT NULL') eq 't';
}

# Emit $n messages on $topic (one key: a lane, in order); their ids.
my $emitted = 0;
sub emit
{
	my ($topic, $n) = @_;
	my $b = ++$emitted;
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('$topic', jsonb_build_object('b', $b, 'n', g), 'k')) FROM generate_series(1, $n) g");
	return [ split /\n/,
		$node->safe_psql('postgres',
			"SELECT id FROM outbox.messages WHERE topic = '$topic' AND payload->>'b' = '$b' ORDER BY id") ];
}

# The outbox-seq of every request a receiver got on $path, in arrival
# order (a record per request: a status of 200 means acknowledged).
sub arrived
{
	my ($name, $path) = @_;
	return [ map { $_->{headers}{'outbox-seq'} } sink_path_records($sink{$name}, $path) ];
}

# ($sqlstate, $message) of the error $sql raises, as $role (undef: the
# superuser); ('', '') when it succeeds.
sub sql_error
{
	my ($sql, $role) = @_;
	my ($out, $err) = ('', '');
	my $set = defined $role ? "SET ROLE $role;\n" : '';
	$node->psql('postgres', "\\set VERBOSITY verbose\n$set$sql",
		stdout => \$out, stderr => \$err, on_error_stop => 1);
	my ($state, $msg) = $err =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/;
	return ($state // '', $msg // '');
}

# --- (1) a server certificate of a CA the system does not know ---
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('unknown_ca', '$url{tls}/c1', lanes => 1, max_attempts => 0);
SELECT outbox.subscribe('unknown_ca', 'c1');
});
my $c1 = emit('c1', 5);
ok(wait_until(sub { lag('unknown_ca', 'last_error') =~ /certificate/i }),
	'no ca_file: outbox.lag shows a certificate verification error');
my $err1 = lag('unknown_ca', 'last_error');
note "last_error without ca_file: $err1";
like($err1, qr/SSL certificate problem|certificate verify failed|issuer/i,
	'... the verification of the server certificate');
my $seen = () = handshake_failures('tls');
ok(wait_until(sub { (() = handshake_failures('tls')) >= $seen + 3 }),
	'... the target keeps retrying (the receiver sees the handshakes fail)');
like((handshake_failures('tls'))[-1], qr/unknown ca/i,
	'... the relay aborts them: unknown CA');
is_deeply(arrived('tls', '/c1'), [], '... nothing reaches the receiver');
is(lag('unknown_ca', q{format('%s/%s', pending, dead_letters)}), '5/0',
	'... all 5 stay pending, none dead-lettered (max_attempts 0)');

# A certificate that does not verify is the target's problem, not the
# messages': it holds the target, even with few attempts allowed.
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('unknown_ca_few', '$url{tls}/c1few', lanes => 1, max_attempts => 2);
SELECT outbox.subscribe('unknown_ca_few', 'c1few');
});
emit('c1few', 3);
ok(wait_until(sub { lag('unknown_ca_few', 'state') eq 'failing' }),
	'max_attempts 2: a certificate that does not verify holds the target (failing)');
$seen = () = handshake_failures('tls');
ok(wait_until(sub { (() = handshake_failures('tls')) >= $seen + 3 }), '... which keeps probing');
is(lag('unknown_ca_few', q{format('%s/%s', pending, dead_letters)}), '3/0',
	'... past max_attempts, nothing is dead-lettered');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('unknown_ca_few')});

is($node->safe_psql('postgres', "SELECT outbox.alter_target('unknown_ca', ca_file => '$ca')"),
	'1', 'alter_target(ca_file): one option changed');
ok(wait_until(sub { @{ arrived('tls', '/c1') } >= 5 }),
	'with ca_file, the waiting messages arrive');
ok($node->poll_query_until('postgres',
		q{SELECT pending = 0 AND delivered = 5 FROM outbox.lag WHERE target = 'unknown_ca'}),
	'... and are acknowledged');
usleep(700_000);    # more than a retry: any duplicate would be here now
is_deeply(arrived('tls', '/c1'), $c1, '... exactly once, in order');
my @c1 = sink_path_records($sink{tls}, '/c1');
is_deeply([ map { "$_->{status} $_->{tls}{version}" } @c1 ], [ map { '200 ' . $c1[0]{tls}{version} } @c1 ],
	"... over TLS ($c1[0]{tls}{version}), answered 200");
is(lag('unknown_ca', 'dead_letters'), '0', '... no dead letters');

# A host name in the certificate's subjectAltName (DNS) works as the IP did.
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('by_name', 'https://localhost:$sink{tls}{port}/c1dns', lanes => 1,
	max_attempts => 0, ca_file => '$ca');
SELECT outbox.subscribe('by_name', 'c1dns');
});
my $c1dns = emit('c1dns', 2);
ok(wait_until(sub { @{ arrived('tls', '/c1dns') } >= 2 }),
	'https://localhost with the CA: delivered (DNS subjectAltName)');
is_deeply(arrived('tls', '/c1dns'), $c1dns, '... once, in order');

# --- (2) an unrelated CA ---
# The receiver is the one 'unknown_ca' has a verified connection to now.
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('other_ca', '$url{tls}/c2', lanes => 1, max_attempts => 0,
	ca_file => '$other_ca');
SELECT outbox.subscribe('other_ca', 'c2');
});
emit('c2', 2);
ok(wait_until(sub { lag('other_ca', 'last_error') =~ /certificate/i }),
	'ca_file of an unrelated CA: refused');
note "last_error with an unrelated CA: " . lag('other_ca', 'last_error');
usleep(500_000);    # a span: a ride on another connection would be here now
is_deeply(arrived('tls', '/c2'), [], '... nothing delivered (no ride on another target\'s connection)');
is(lag('other_ca', q{format('%s/%s', pending, dead_letters)}), '2/0', '... both pending, none dead-lettered');

# ca_file => '' removes the CA live: the next request is verified against
# the system's CAs again, although the target's connection is still open.
is($node->safe_psql('postgres', q{SELECT outbox.alter_target('unknown_ca', ca_file => '')}),
	'1', "alter_target(ca_file => ''): one option changed");
is($node->safe_psql('postgres', q{SELECT ca_file IS NULL FROM outbox.targets WHERE name = 'unknown_ca'}),
	't', '... ca_file is removed');
my $c1b = emit('c1', 1);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				"SELECT last_error_at > (SELECT emitted_at FROM outbox.messages WHERE id = $c1b->[0])"
				  . " FROM outbox.lag WHERE target = 'unknown_ca'") eq 't';
		}),
	'... the next message fails again');
like(lag('unknown_ca', 'last_error'), qr/certificate/i, '... on the certificate');
is(scalar @{ arrived('tls', '/c1') }, 5, '... and is not delivered');

# --- (3) a certificate for another host name, of the right CA ---
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('wrong_host', '$url{elsewhere}/c3', lanes => 1, max_attempts => 0,
	ca_file => '$ca');
SELECT outbox.subscribe('wrong_host', 'c3');
});
emit('c3', 2);
ok(wait_until(sub { defined_error('wrong_host') }), 'a certificate for another host: refused');
my $err3 = lag('wrong_host', 'last_error');
note "last_error for a host name mismatch: $err3";
like($err3, qr/host ?name|subject name|does not match/i, '... as a host name mismatch');
# The handshake itself succeeds (the chain is good); the relay checks the
# name after it and closes the connection: count its retries.
my $r3 = retries('wrong_host');
ok(wait_until(sub { retries('wrong_host') >= $r3 + 2 }), '... retried');
is_deeply(arrived('elsewhere', '/c3'), [], '... nothing delivered');
is(lag('wrong_host', q{format('%s/%s', pending, dead_letters)}), '2/0', '... none dead-lettered');

# --- (4) mutual TLS ---
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('mtls', '$url{mtls}/c4', lanes => 1, max_attempts => 0,
	ca_file => '$ca');
SELECT outbox.subscribe('mtls', 'c4');
});
my $c4 = emit('c4', 3);
ok(wait_until(sub { defined_error('mtls') }), 'mTLS without a client certificate: refused');
note "last_error without a client certificate: " . lag('mtls', 'last_error');
$seen = () = handshake_failures('mtls');
ok(wait_until(sub { (() = handshake_failures('mtls')) >= $seen + 2 }), '... retried');
like((handshake_failures('mtls'))[-1], qr/did not return a certificate/i,
	'... the receiver saw no client certificate');
is_deeply(arrived('mtls', '/c4'), [], '... nothing delivered');
is(lag('mtls', q{format('%s/%s', pending, dead_letters)}), '3/0', '... none dead-lettered');

is( $node->safe_psql('postgres',
		"SELECT outbox.alter_target('mtls', client_cert => '$client_cert', client_key => '$client_key')"),
	'2', 'alter_target(client_cert, client_key): two options changed');
ok(wait_until(sub { @{ arrived('mtls', '/c4') } >= 3 }), 'with the client certificate: delivered');
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'mtls'}),
	'... acknowledged');
usleep(700_000);    # more than a retry: any duplicate would be here now
is_deeply(arrived('mtls', '/c4'), $c4, '... exactly once, in order');
my @c4 = sink_path_records($sink{mtls}, '/c4');
is_deeply([ map { $_->{tls}{peer_subject} // 'none' } @c4 ], [ ($client_subject) x 3 ],
	'... the receiver saw the client certificate\'s subject');

# Another target without a client certificate, to the same receiver, while
# 'mtls' keeps its authenticated connection open.
emit('c4', 1);
ok(wait_until(sub { @{ arrived('mtls', '/c4') } >= 4 }), 'mtls delivers one more');
my @conns = map { $_->{conn} } sink_path_records($sink{mtls}, '/c4');
note "mTLS connections used by the 4 requests: @conns";
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('mtls_anon', '$url{mtls}/c4anon', lanes => 1, max_attempts => 0,
	ca_file => '$ca');
SELECT outbox.subscribe('mtls_anon', 'c4anon');
});
emit('c4anon', 1);
ok(wait_until(sub { defined_error('mtls_anon') }),
	'a target without the client certificate is refused by the mTLS receiver');
usleep(500_000);    # a span: a ride on the other connection would be here now
is_deeply(arrived('mtls', '/c4anon'), [], '... it does not use the other target\'s authenticated connection');
$node->safe_psql('postgres', q{SELECT outbox.drop_target('mtls_anon')});

# client_cert => '' and client_key => '' remove the certificate, live.
is( $node->safe_psql('postgres',
		q{SELECT outbox.alter_target('mtls', client_cert => '', client_key => '')}),
	'2', "alter_target(client_cert => '', client_key => ''): two options changed");
my $c4c = emit('c4', 1);
ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				"SELECT last_error_at > (SELECT emitted_at FROM outbox.messages WHERE id = $c4c->[0])"
				  . " FROM outbox.lag WHERE target = 'mtls'") eq 't';
		}),
	'... the next message is sent without the certificate, and fails');
$seen = () = handshake_failures('mtls');
ok(wait_until(sub { (() = handshake_failures('mtls')) >= $seen + 2 }),
	'... the receiver refuses its handshakes');
like((handshake_failures('mtls'))[-1], qr/did not return a certificate/i, '... for want of a certificate');
is(scalar @{ arrived('mtls', '/c4') }, 4, '... not delivered over the connection opened with it');

# --- a TLS file that goes away after creation ---
my $ca_copy = "$dir/ca-copy.pem";
copy($ca, $ca_copy) or die "copy: $!";
$node->safe_psql(
	'postgres', qq{
SELECT outbox.create_http_target('moved_ca', '$url{tls}/c7', lanes => 1, max_attempts => 0,
	ca_file => '$ca_copy');
SELECT outbox.subscribe('moved_ca', 'c7');
});
unlink $ca_copy or die "unlink: $!";
my $c7 = emit('c7', 2);
ok(wait_until(sub { defined_error('moved_ca') }), 'a CA file removed after creation: delivery fails');
my $err7 = lag('moved_ca', 'last_error');
note "last_error with the CA file gone: $err7";
like($err7, qr/\Q$ca_copy\E|CAfile|certificate|verify locations/i, '... saying so');
is(lag('moved_ca', q{format('%s/%s', pending, dead_letters)}), '2/0', '... none dead-lettered');
copy($ca, $ca_copy) or die "copy: $!";
ok(wait_until(sub { @{ arrived('tls', '/c7') } >= 2 }), '... and delivered once the file is back');
usleep(500_000);    # a span: any duplicate would be here now
is_deeply(arrived('tls', '/c7'), $c7, '... once, in order');

# --- (5) who may name TLS files ---
# tls_admin may manage targets (EXECUTE on every function, rights on the
# tables) but may not read server files; tls_reader may, through
# pg_read_server_files.
$node->safe_psql(
	'postgres', q{
CREATE ROLE tls_admin;
GRANT USAGE ON SCHEMA outbox TO tls_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox TO tls_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox TO tls_admin;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA outbox TO tls_admin;
CREATE ROLE tls_reader IN ROLE tls_admin, pg_read_server_files;
});
is_deeply([ sql_error(qq{SELECT outbox.create_http_target('plain', '$url{tls}/plain')}, 'tls_admin') ],
	[ '', '' ], 'tls_admin can create a target without TLS files');
my @e = sql_error(qq{SELECT outbox.create_http_target('adm', '$url{tls}/adm', ca_file => '$ca')}, 'tls_admin');
is($e[0], '42501', 'tls_admin cannot name a ca_file: 42501');
note "as tls_admin: $e[1]";
like($e[1], qr/permission denied/, '... permission denied');
@e = sql_error(qq{SELECT outbox.alter_target('plain', ca_file => '$ca')}, 'tls_admin');
is($e[0], '42501', '... nor set one with alter_target (42501)');
@e = sql_error(qq{SELECT outbox.alter_target('plain', client_cert => '$client_cert', client_key => '$client_key')},
	'tls_admin');
is($e[0], '42501', '... nor a client certificate (42501)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.targets WHERE name = 'adm' OR ca_file IS NOT NULL AND name = 'plain'}),
	'0', '... and nothing was stored');
@e = sql_error(qq{SELECT outbox.create_http_target('reader', '$url{tls}/c5', lanes => 1, max_attempts => 0,
	ca_file => '$ca')}, 'tls_reader');
is($e[0], '', 'a member of pg_read_server_files can name a ca_file');
diag("as tls_reader: $e[0] $e[1]") if $e[0];
@e = sql_error(qq{SELECT outbox.alter_target('plain', ca_file => '$ca')}, 'tls_reader');
is($e[0], '', '... and set one with alter_target');
diag("as tls_reader: $e[0] $e[1]") if $e[0];
SKIP:
{
	skip 'tls_reader could not create its target', 1
	  unless $node->safe_psql('postgres', q{SELECT count(*) FROM outbox.targets WHERE name = 'reader'}) eq '1';
	$node->safe_psql('postgres', q{SELECT outbox.subscribe('reader', 'c5')});
	emit('c5', 1);
	ok(wait_until(sub { @{ arrived('tls', '/c5') } >= 1 }), '... and its target delivers');
}

# --- (6) paths refused at once ---
my $missing = "$dir/no-such-ca.pem";
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', ca_file => '$missing')});
is($e[0], '22023', 'a ca_file that does not exist: 22023 at create');
like($e[1], qr/cannot read ca_file "\Q$missing\E"/, "... naming it ($e[1])");
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', ca_file => '$ca',
	client_cert => '$dir/no-such-client.pem', client_key => '$client_key')});
is($e[0], '22023', 'a client_cert that does not exist: 22023');
like($e[1], qr/client_cert/, "... naming client_cert ($e[1])");
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', ca_file => '$ca',
	client_cert => '$client_cert', client_key => '$dir/no-such.key')});
is($e[0], '22023', 'a client_key that does not exist: 22023');
like($e[1], qr/client_key/, "... naming client_key ($e[1])");
$node->safe_psql('postgres', "SELECT outbox.alter_target('plain', ca_file => '$ca')");
@e = sql_error(qq{SELECT outbox.alter_target('plain', ca_file => '$missing')});
is($e[0], '22023', 'alter_target to a missing ca_file: 22023');
is($node->safe_psql('postgres', q{SELECT ca_file FROM outbox.targets WHERE name = 'plain'}), $ca,
	'... the target keeps its ca_file');
my $unreadable = "$dir/unreadable.pem";
copy($ca, $unreadable) or die "copy: $!";
chmod 0000, $unreadable;
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', ca_file => '$unreadable')});
is($e[0], '22023', 'a ca_file the server cannot read: 22023');
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', ca_file => 'ca.pem')});
is($e[0], '22023', 'a relative ca_file: 22023');
@e = sql_error(qq{SELECT outbox.create_http_target('missing', '$url{tls}/x', client_key => '$client_key')});
is($e[0], '22023', 'a client_key without client_cert: 22023');
@e = sql_error(qq{SELECT outbox.create_http_target('missing', 'http://127.0.0.1:$sink{tls}{port}/x', ca_file => '$ca')});
is($e[0], '22023', 'TLS files on an http:// URL: 22023');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.targets WHERE name = 'missing'}), '0',
	'... no target was created');

stop_sink($_) for values %sink;
relay_no_crash($node);
$node->stop;
done_testing();
