# Verified TLS to the brokers (src/relay_conn.c, src/relay_tls.c), against
# real TLS-only servers on loopback (redis-server with port 0 and a
# tls-port) and certificates of throwaway CAs:
#  - rediss:// with ca_file: delivered, in order; an ACL user and password;
#  - held, with the reason in outbox.lag and nothing dead-lettered (even
#    with max_attempts 2), then delivered in order once fixed, live
#    (alter_target, no restart): the system's store for a private CA, an
#    unrelated CA, a certificate for another host name, an expired one, a
#    server that wants a client certificate and gets none (then
#    client_cert / client_key), a wrong password; an unrelated CA in a
#    ca_file then rewritten in place (no alter_target: TLS contexts are
#    kept only for files unchanged on disk);
#  - a server whose AUTH is renamed away (its error echoes the arguments):
#    held with the error code only, no password in last_error;
#  - a plaintext server behind rediss:// and a TLS server behind redis://
#    say so in a hint;
#  - a server that accepts TCP and never answers the handshake: the target
#    times out and is held, while an HTTP target keeps delivering;
#  - the server restarted with a new certificate: the relay reconnects;
#  - RabbitMQ with amqps:// only: a password, the EXTERNAL login of a client
#    certificate, an unrelated CA held then fixed; a server that never
#    answers the AMQP handshake holds its target while HTTP goes on;
#  - no password in outbox.lag or the server's log.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Copy qw(copy);
use IO::Socket::INET;
use IPC::Run;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;
use OutboxRabbitMQ;
use OutboxRedis;
use OutboxTls;

# --- certificates ---
my $dir = tls_dir();
my $ca = make_ca('ca', 'outbox test CA');
my $other_ca = make_ca('other-ca', 'unrelated CA');
my $server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
make_cert('server', 'ca', '/O=outbox-test/CN=127.0.0.1', $server_ext);
make_cert('server2', 'ca', '/O=outbox-test/CN=127.0.0.1 (renewed)', $server_ext);
make_cert('elsewhere', 'ca', '/O=outbox-test/CN=elsewhere.invalid',
	"subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n");
make_cert('expired', 'ca', '/O=outbox-test/CN=127.0.0.1', $server_ext, 0);
make_cert('client', 'ca', '/O=outbox-test/CN=outbox-relay-client', "extendedKeyUsage=clientAuth\n");
my ($client_cert, $client_key) = ("$dir/client.pem", "$dir/client.key");

sub tls_of
{
	my ($name, %o) = @_;
	return { cert => "$dir/$name.pem", key => "$dir/$name.key", ca => $ca,
		client_cert => $client_cert, client_key => $client_key, %o };
}

# --- servers: TLS only ---
my $pw = 'S3cretPW-tls';
my %redis;
# plain server authentication; an ACL user "relay"
$redis{tls} = redis_start('tls', tls => tls_of('server', auth_clients => 'no'),
	args => [ '--user', 'relay', 'on', ">$pw", '~*', '&*', '+@all' ]);
# wants a client certificate of the CA
$redis{mtls} = redis_start('mtls', tls => tls_of('server', auth_clients => 'yes'));
$redis{elsewhere} = redis_start('elsewhere', tls => tls_of('elsewhere', auth_clients => 'no'));
sleep 1;    # a span: the expired certificate's one second of life ends
$redis{expired} = redis_start('expired', tls => tls_of('expired', auth_clients => 'no'));
# a plaintext server
$redis{plain} = redis_start('plain');
my %url = map { $_ => "rediss://127.0.0.1:$redis{$_}{port}" } keys %redis;

my $node = relay_node('broker_tls', conf => "outbox.retry_max_delay = 300\n");
my $sink = start_sink('http', '--status', '200');

sub sql { return $node->safe_psql('postgres', $_[0]) }

sub lag
{
	my ($target, $what) = @_;
	return sql("SELECT $what FROM outbox.lag WHERE target = '$target'");
}

# Emit $n messages on $topic under one key (one lane: in order).
my $emitted = 0;
sub emit
{
	my ($topic, $n) = @_;
	my $b = ++$emitted;
	sql("SELECT count(outbox_emit('$topic', jsonb_build_object('b', $b, 'n', g), 'k')) FROM generate_series(1, $n) g");
}

# The seqs of a stream, in order.
sub seqs
{
	my ($server, $stream) = @_;
	my $e = eval { redis_entries($redis{$server}, $stream) } // [];
	return [ map { $_->{seq} } @$e ];
}

# The ids of $topic's messages, in order.
sub ids
{
	my ($topic) = @_;
	return [ split /\n/, sql("SELECT id FROM outbox.messages WHERE topic = '$topic' ORDER BY id") ];
}

# The SQLSTATE of the error $q raises, or ''.
sub sql_state
{
	my ($q) = @_;
	my ($out, $err) = ('', '');
	$node->psql('postgres', "\\set VERBOSITY verbose\n$q", stdout => \$out, stderr => \$err);
	my ($state) = $err =~ /ERROR:\s+([0-9A-Z]{5}):/;
	return ($state // '');
}

# A target on $server's stream $topic, subscribed to $topic.
sub target
{
	my ($name, $url, $topic, @opts) = @_;
	my $opts = join('', map { ", $_" } @opts);
	sql(qq{SELECT outbox.create_redis_target('$name', '$url', stream => '$topic', lanes => 1$opts);
		SELECT outbox.subscribe('$name', '$topic');});
}

# Held with an error matching $re: the error, the messages pending, none
# dead-lettered, nothing on $server; then $fix (SQL) and every message in
# $dest's stream (default $server's) once, in order.
sub held_then_fixed
{
	my ($what, $name, $server, $topic, $re, $fix, $dest) = @_;
	$dest //= $server;
	ok(wait_for("$what: outbox.lag shows why",
			sub { my $e = lag($name, q{coalesce(last_error, '')}); (scalar($e =~ $re), $e) }),
		"$what: held, outbox.lag says why");
	note("$what: " . lag($name, 'last_error'));
	ok(wait_for("$what: tried again",
			sub { my $r = sql("SELECT retries FROM outbox.stats WHERE target = '$name'"); ($r >= 2, "retries $r") }),
		"$what: tried again");
	is(lag($name, q{format('%s/%s', pending, dead_letters)}), '3/0',
		"$what: the messages wait, none dead-lettered");
	is_deeply(seqs($server, $topic), [], "$what: nothing reached the server");
	ref $fix eq 'CODE' ? $fix->() : sql($fix);
	ok(wait_for("$what: delivered once fixed",
			sub { my $s = seqs($dest, $topic); (@$s == 3, scalar(@$s) . ' in the stream') }),
		"$what: delivered once fixed, without a restart");
	is_deeply(seqs($dest, $topic), ids($topic), "$what: each once, in order");
}

# --- (1) delivered over TLS, with an ACL user ---
target('ok', "rediss://relay:$pw\@127.0.0.1:$redis{tls}{port}", 't1', "ca_file => '$ca'");
emit('t1', 20);
ok(wait_for('20 messages over TLS', sub { my $s = seqs('tls', 't1'); (@$s == 20, scalar(@$s)) }),
	'rediss:// with ca_file and an ACL user: delivered');
is_deeply(seqs('tls', 't1'), ids('t1'), '... each once, in order');
like(redis_cmd($redis{tls}, 'CLIENT', 'LIST'), qr/user=relay/, '... logged in as the ACL user');

# --- (2) what holds a target, and its fix, live ---
target('sysstore', $url{tls}, 't2', 'max_attempts => 2');
emit('t2', 3);
held_then_fixed('a private CA, no ca_file (the system store)', 'sysstore', 'tls', 't2',
	qr/certificate .*not accepted: (unable to get local issuer certificate|self-signed certificate in certificate chain)/,
	"SELECT outbox.alter_target('sysstore', ca_file => '$ca')");

target('wrongca', $url{tls}, 't3', 'max_attempts => 2', "ca_file => '$other_ca'");
emit('t3', 3);
held_then_fixed('an unrelated CA', 'wrongca', 'tls', 't3',
	qr/certificate .*not accepted/, "SELECT outbox.alter_target('wrongca', ca_file => '$ca')");

# a ca_file rewritten in place (the same name, the same inode): the next
# connection reads it (the relay keeps TLS contexts only for files unchanged)
copy($other_ca, "$dir/swap-ca.pem") or die "copy: $!";
chmod 0644, "$dir/swap-ca.pem";
target('swapca', $url{tls}, 't12', 'max_attempts => 2', "ca_file => '$dir/swap-ca.pem'");
emit('t12', 3);
held_then_fixed('a ca_file rewritten in place', 'swapca', 'tls', 't12',
	qr/certificate .*not accepted/,
	sub {
		open(my $in, '<', $ca) or die "$ca: $!";
		my $pem = do { local $/; <$in> };
		close $in;
		open(my $out, '+<', "$dir/swap-ca.pem") or die "swap-ca.pem: $!";
		truncate($out, 0);
		print $out $pem;
		close $out;
	});

target('elsewhere', $url{elsewhere}, 't4', 'max_attempts => 2', "ca_file => '$ca'");
emit('t4', 3);
held_then_fixed('a certificate for another host name', 'elsewhere', 'elsewhere', 't4',
	qr/certificate .*not accepted: IP address mismatch/,
	"SELECT outbox.alter_target('elsewhere', url => '$url{tls}')", 'tls');

target('expired', $url{expired}, 't5', 'max_attempts => 2', "ca_file => '$ca'");
emit('t5', 3);
held_then_fixed('an expired certificate', 'expired', 'expired', 't5',
	qr/certificate .*not accepted: certificate has expired/,
	"SELECT outbox.alter_target('expired', url => '$url{tls}')", 'tls');

target('noclient', $url{mtls}, 't6', 'max_attempts => 2', "ca_file => '$ca'");
emit('t6', 3);
held_then_fixed('a server that wants a client certificate', 'noclient', 'mtls', 't6',
	qr/TLS|certificate|closed/,
	"SELECT outbox.alter_target('noclient', client_cert => '$client_cert', client_key => '$client_key')");

target('wrongpw', "rediss://relay:wrong-$pw\@127.0.0.1:$redis{tls}{port}", 't7',
	'max_attempts => 2', "ca_file => '$ca'");
emit('t7', 3);
held_then_fixed('a wrong password', 'wrongpw', 'tls', 't7', qr/WRONGPASS/,
	"SELECT outbox.alter_target('wrongpw', url => 'rediss://relay:$pw\@127.0.0.1:$redis{tls}{port}')");

# a server whose AUTH is renamed away echoes the arguments of the unknown
# command: the password must not reach last_error
$redis{noauth} = redis_start('noauth', args => [ '--rename-command', 'AUTH', '' ]);
target('echo', "redis://relay:$pw\@127.0.0.1:$redis{noauth}{port}", 't11', 'max_attempts => 2');
emit('t11', 1);
ok(wait_for('AUTH unknown: held',
		sub { my $e = lag('echo', q{coalesce(last_error, '')}); (scalar($e =~ /Redis refused the credentials: ERR \(the rest/), $e) }),
	'a server that does not know AUTH: held, with only its error code');
unlike(lag('echo', 'last_error'), qr/\Q$pw\E/, '... and no password in last_error');
sql(q{SELECT outbox.drop_target('echo')});

# --- (3) TLS and plaintext mixed up: a hint ---
target('plainbehindtls', $url{plain}, 't8', 'max_attempts => 2', 'timeout_ms => 2000');
emit('t8', 3);
held_then_fixed('a plaintext server behind rediss://', 'plainbehindtls', 'plain', 't8',
	qr/does the server speak TLS/,
	"SELECT outbox.alter_target('plainbehindtls', url => 'redis://127.0.0.1:$redis{plain}{port}')");

target('tlsbehindplain', "redis://127.0.0.1:$redis{tls}{port}", 't9', 'max_attempts => 2',
	'timeout_ms => 2000');
emit('t9', 3);
held_then_fixed('a TLS server behind redis://', 'tlsbehindplain', 'tls', 't9',
	qr/lost before it answered: .*does the server want TLS\? its url would start with rediss:\/\//,
	"SELECT outbox.alter_target('tlsbehindplain', url => '$url{tls}', ca_file => '$ca')");

# --- (4) a server that never answers the handshake; HTTP goes on ---
my $mute = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1000,
	Proto => 'tcp', ReuseAddr => 1) or die "listen: $!";
my $mute_port = $mute->sockport;
sql(qq{SELECT outbox.create_http_target('web', '$sink->{url}/web', lanes => 1);
	SELECT outbox.subscribe('web', 'w');});
target('mute', "rediss://127.0.0.1:$mute_port", 't10', 'max_attempts => 0', 'timeout_ms => 1000',
	"ca_file => '$ca'");
emit('t10', 3);
ok(wait_for('the mute server: the handshake times out',
		sub { my $e = lag('mute', q{coalesce(last_error, '')}); (scalar($e =~ /TLS handshake with Redis at [0-9.:]+ did not end within 1000 ms/), $e) }),
	'a server that never answers the TLS handshake: the target times out and is held');
# while it is held and retried, the HTTP target delivers: 20 rounds
my $rounds_ok = 1;
for my $r (1 .. 20)
{
	emit('w', 1);
	$rounds_ok &&= wait_for("HTTP message $r delivered",
		sub { my $n = () = sink_path_records($sink, '/web'); ($n >= $r, "$n delivered") });
}
ok($rounds_ok, '... while an HTTP target keeps delivering, message by message');
ok(sql("SELECT retries FROM outbox.stats WHERE target = 'mute'") >= 1,
	'... and the mute target was tried again meanwhile');
is(lag('mute', q{format('%s/%s', pending, dead_letters)}), '3/0', '... its messages wait');
sql(q{SELECT outbox.drop_target('mute')});
close $mute;

# --- (5) the server restarted with a new certificate: reconnects ---
emit('t1', 5);
ok(wait_for('25 on t1', sub { my $s = seqs('tls', 't1'); (@$s == 25, scalar(@$s)) }), 'before the restart');
redis_stop($redis{tls});
$redis{tls} = redis_start('tls', port => $redis{tls}{port}, dir => $redis{tls}{dir},
	tls => tls_of('server2', auth_clients => 'no'),
	args => [ '--user', 'relay', 'on', ">$pw", '~*', '&*', '+@all' ]);
emit('t1', 5);
ok(wait_for('30 on t1 after the restart', sub { my $s = seqs('tls', 't1'); (@$s == 30, scalar(@$s)) }),
	'the server restarted with a renewed certificate: the relay reconnects and delivers');
is_deeply(seqs('tls', 't1'), ids('t1'), '... each once, in order');

# --- (6) RabbitMQ: amqps:// only (listeners.tcp = none) ---
my $rmq = rmq_start('tls', tls => { ca => $ca, cert => "$dir/server.pem", key => "$dir/server.key",
		client_cert => $client_cert, client_key => $client_key });
rmq_tls_client($ca, $client_cert, $client_key);
my $amqps = "amqps://guest:guest\@127.0.0.1:$rmq->{port}";
rmq_tool($amqps, 'declare', $_) for qw(q1 q2 q3);
rmq_ctl($rmq, 'add_user', 'outbox-relay-client', 'unused-password');
rmq_ctl($rmq, 'set_permissions', '-p', '/', 'outbox-relay-client', '.*', '.*', '.*');

# The seqs in a queue, in order.
sub queued
{
	my ($queue) = @_;
	my $m = eval { rmq_dump($amqps, $queue) } // [];
	return [ map { $_->{seq} } @$m ];
}

sub rmq_target
{
	my ($name, $url, $queue, @opts) = @_;
	my $opts = join('', map { ", $_" } @opts);
	sql(qq{SELECT outbox.create_rabbitmq_target('$name', '$url', routing_key => '$queue', lanes => 1$opts);
		SELECT outbox.subscribe('$name', '$queue');});
}

rmq_target('mq', $amqps, 'q1', "ca_file => '$ca'");
emit('q1', 20);
ok(wait_for('20 messages over AMQPS', sub { my $q = queued('q1'); (@$q == 20, scalar(@$q)) }),
	'amqps:// with ca_file and a password: delivered');
is_deeply(queued('q1'), ids('q1'), '... each once, in order');

rmq_target('mqext', "amqps://127.0.0.1:$rmq->{port}", 'q2', "ca_file => '$ca'",
	"client_cert => '$client_cert'", "client_key => '$client_key'");
emit('q2', 5);
ok(wait_for('EXTERNAL: 5 messages', sub { my $q = queued('q2'); (@$q == 5, scalar(@$q)) }),
	'amqps:// with a client certificate and no user: the EXTERNAL login');
like(rmq_ctl($rmq, 'list_connections', 'user', 'auth_mechanism', 'ssl'),
	qr/outbox-relay-client\s+EXTERNAL\s+true/, '... as the certificate\'s user, over TLS');

rmq_target('mqca', $amqps, 'q3', 'max_attempts => 2', "ca_file => '$other_ca'");
emit('q3', 3);
ok(wait_for('RabbitMQ with an unrelated CA: held',
		sub { my $e = lag('mqca', q{coalesce(last_error, '')}); (scalar($e =~ /certificate .*not accepted/), $e) }),
	'RabbitMQ, an unrelated CA: held, outbox.lag says why');
ok(wait_for('tried again', sub { my $r = sql("SELECT retries FROM outbox.stats WHERE target = 'mqca'"); ($r >= 2, "retries $r") }),
	'... tried again');
is(lag('mqca', q{format('%s/%s', pending, dead_letters)}), '3/0', '... nothing dead-lettered');
sql(qq{SELECT outbox.alter_target('mqca', ca_file => '$ca')});
ok(wait_for('RabbitMQ fixed', sub { my $q = queued('q3'); (@$q == 3, scalar(@$q)) }),
	'... delivered once ca_file is right, without a restart');
is_deeply(queued('q3'), ids('q3'), '... each once, in order');

# a server that accepts TCP and never answers the AMQP handshake: the
# relay does not wait for it (the HTTP target goes on)
$mute = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 1000,
	Proto => 'tcp', ReuseAddr => 1) or die "listen: $!";
$mute_port = $mute->sockport;
rmq_target('mqmute', "amqp://guest:guest\@127.0.0.1:$mute_port", 'qm', 'max_attempts => 0',
	'timeout_ms => 1000');
emit('qm', 2);
ok(wait_for('the mute AMQP server: timed out',
		sub { my $e = lag('mqmute', q{coalesce(last_error, '')}); (scalar($e =~ /no reply from RabbitMQ at [0-9.:]+ within 1000 ms/), $e) }),
	'a server that never answers the AMQP handshake: the target times out and is held');
my $before = () = sink_path_records($sink, '/web');
$rounds_ok = 1;
for my $r (1 .. 10)
{
	emit('w', 1);
	$rounds_ok &&= wait_for("HTTP message $r delivered",
		sub { my $n = () = sink_path_records($sink, '/web'); ($n >= $before + $r, "$n delivered") });
}
ok($rounds_ok, '... while an HTTP target keeps delivering');
sql(q{SELECT outbox.drop_target('mqmute')});
close $mute;

# a hostile AMQP server whose first frame claims a length near 4 GB: the
# target is held with the reason, the relay does not read past its buffer
my $hostile = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 100,
	Proto => 'tcp', ReuseAddr => 1) or die "listen: $!";
my $hostile_port = $hostile->sockport;
my $hostile_pid = fork();
die "fork: $!" unless defined $hostile_pid;
if ($hostile_pid == 0)
{
	while (my $c = $hostile->accept)
	{
		my $hdr;
		sysread($c, $hdr, 8);
		# a method frame on channel 0 of 0xFFFFFFF8 bytes, then a few
		syswrite($c, "\x01\x00\x00\xFF\xFF\xFF\xF8" . "\x00\x0A\x00\x0A\xCE\xCE" x 4);
		close $c;
	}
	POSIX::_exit(0);
}
# (killed however the test ends: a child left running would hold prove)
END { local $?; kill 'KILL', $hostile_pid if $hostile_pid; }
close $hostile;
rmq_target('mqhostile', "amqp://guest:guest\@127.0.0.1:$hostile_port", 'qh', 'max_attempts => 0',
	'timeout_ms => 1000');
emit('qh', 1);
ok(wait_for('the hostile AMQP server: held',
		sub { my $e = lag('mqhostile', q{coalesce(last_error, '')}); (scalar($e =~ /sent a frame of 4294967288 bytes, more than the 4096 agreed/), $e) }),
	'a frame length near 4 GB: the target is held with the reason');
sql(q{SELECT outbox.drop_target('mqhostile')});
kill 'KILL', $hostile_pid;
waitpid($hostile_pid, 0);
$hostile_pid = undef;

# --- (7) CloudEvents on Redis (structured: one field) and RabbitMQ (both modes) ---
sql(qq{SELECT outbox.create_redis_target('rce', '$url{tls}', stream => 'ce', lanes => 1,
		ca_file => '$ca', format => 'cloudevents-structured', source => 'urn:outbox:test');
	SELECT outbox.subscribe('rce', 'ce');});
rmq_tool($amqps, 'declare', $_) for qw(qceb qces);
rmq_target('mqceb', $amqps, 'qceb', "ca_file => '$ca'", "format => 'cloudevents'", "source => 'urn:outbox:test'");
rmq_target('mqces', $amqps, 'qces', "ca_file => '$ca'", "format => 'cloudevents-structured'");
sql(q{SELECT outbox.subscribe('mqceb', 'ce'); SELECT outbox.subscribe('mqces', 'ce');});
sql(q{SELECT outbox_emit('ce', jsonb_build_object('n', g), 'k' || g,
		'{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "ce-type": "forged", "cloudEvents_type": "forged"}')
	FROM generate_series(1, 3) g});
my $ce_ids = ids('ce');
ok(wait_for('CloudEvents delivered', sub {
		my $r = redis_len($redis{tls}, 'ce');
		my @q = map { my $d = eval { rmq_dump($amqps, $_) } // []; scalar(@$d) } qw(qceb qces);
		($r == 3 && $q[0] == 3 && $q[1] == 3, "redis $r, amqp @q") }),
	'CloudEvents reach the Redis stream and both RabbitMQ queues');
my $verify_dir = abs_path(dirname(__FILE__) . '/../verify');
my @ce_in;
push @ce_in, [ 'redis', { binding => 'redis', body => $_->{cloudevent} }, $_ ]
  for @{ redis_entries($redis{tls}, 'ce') };
for my $q (qw(qceb qces))
{
	push @ce_in, [ "amqp_$q", { binding => 'amqp', headers => $_->{headers}, content_type => $_->{content_type},
			body => $_->{payload} }, $_ ] for @{ rmq_dump($amqps, $q) };
}
my @forged = grep { ($_->[1]{headers} && grep { $_ eq 'forged' } values %{ $_->[1]{headers} })
	  || ($_->[1]{body} // '') =~ /forged/ } @ce_in;
is(scalar(@forged), 0, "the message's own ce-type and cloudEvents_type reach no consumer");
my $codec = json_codec()->utf8->canonical;
my ($ce_out, $ce_err) = ('', '');
IPC::Run::run([ 'node', "$verify_dir/ce_check.js" ], '<', \join('', map { $codec->encode($_->[1]) . "\n" } @ce_in),
	'>', \$ce_out, '2>', \$ce_err) or die "ce_check.js failed: $ce_err";
my @ce_parsed = map { $codec->decode($_) } split /\n/, $ce_out;
is(scalar(@ce_parsed), 9, 'the CloudEvents SDK read all 9');
for my $i (0 .. $#ce_in)
{
	my ($what, undef, $raw) = @{ $ce_in[$i] };
	my $ev = $ce_parsed[$i]{events}[0] // {};
	ok($ce_parsed[$i]{ok}, "$what: the SDK parses and validates it") or diag($ce_parsed[$i]{error});
	is($ev->{type}, 'ce', "$what: type is the topic, not the message's own header");
	like($ev->{traceparent} // '', qr/^00-0af7/, "$what: traceparent");
	is($ev->{source}, 'urn:outbox:test', "$what: source") unless $what eq 'amqp_qces';
}
is_deeply([ map { $codec->decode($_->{cloudevent})->{id} } @{ redis_entries($redis{tls}, 'ce') } ],
	[ map { sql("SELECT msg_id FROM outbox.messages WHERE id = $_") } @$ce_ids ],
	'Redis: the events in order, their ids the messages\'');
is((rmq_dump($amqps, 'qces'))->[0]{content_type}, 'application/cloudevents+json',
	'RabbitMQ structured mode: its content type');
my @b = grep { /^cloudEvents:/ } @{ (rmq_dump($amqps, 'qceb'))->[0]{header_names} };
ok(scalar(@b) >= 5, 'RabbitMQ binary mode: cloudEvents: headers (' . join(' ', @b) . ')');
my ($ce_state) = sql_state(q{SELECT outbox.alter_target('rce', format => 'cloudevents')});
is($ce_state, '0A000', 'a Redis target takes no binary-mode CloudEvents');

# --- (8) no password anywhere ---
my $shown = sql(q{SELECT string_agg(row_to_json(l)::text, ' ') FROM outbox.lag l});
unlike($shown, qr/\Q$pw\E/, 'no password in outbox.lag');
# (the statements the test ran are logged whole, log_statement = all: the
# relay's own lines are what counts)
my @entries = split /^(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)/m, slurp_file($node->logfile);
my @leaks = grep { /\Q$pw\E/ && !/^[^\n]*\] [^\n]*(LOG|ERROR):  statement: / } @entries;
is(scalar(@leaks), 0, 'no password in the server log, but in the statements logged')
  or diag(@leaks);
is(sql('SELECT count(*) FROM outbox.dead_letters'), '0', 'nothing was dead-lettered');
relay_no_crash($node);

done_testing();
