# Webhook signatures checked by implementations independent of the
# extension's C: a receiver (test/verify/receiver.js) verifies v1 (whsec_,
# HMAC-SHA256) signatures with the Standard Webhooks npm library
# `standardwebhooks` and v1a (whsk_, ed25519) ones with Python's
# `cryptography` (Debian's python3-cryptography), given only the whpk_
# public key; it answers 401 when no signature verifies with a key it
# accepts, so a bad signature is a delivery failure.  Every signature of a
# request is checked on its own against every key the receiver knows.
#  - generate_secret() and signing_public_key(): formats, lengths, RFC 8032's
#    test vector, the public key derived by Python, the 64-byte whsk_ form;
#  - whsec_ targets (batch_size 1 and 10; 32- and 64-byte secrets): every
#    request verified by the library, one v1 signature, also recomputed in
#    Perl; every message once, per key in order;
#  - whsk_ targets (batch_size 1 with a generated key, batch_size 10 with
#    the 64-byte form): every request verified with the public key, one
#    v1a signature, byte-identical to the one Python makes with the same
#    key (ed25519 is deterministic);
#  - a receiver holding a wrong public key refuses (401, outbox.lag shows
#    it, nothing delivered); given the right one, the retry is delivered;
#  - rotation while messages flow: hmac -> hmac -> ed25519, each time the
#    receiver learning the new key first and dropping the old one once the
#    rotation is finished; during a rotation requests carry both signatures,
#    the new key's first, each verifying with its own key; per key the
#    signing phases only move forward; every message emitted arrives exactly
#    once, per key in order, and no request was refused;
#  - negative controls, by replaying recorded requests: the old key alone
#    does not verify a request signed after the rotation, nor the new key a
#    request signed before it; a changed body, webhook-id or timestamp, and
#    a corrupted ed25519 signature, are refused.
use strict;
use warnings;
use Cwd qw(abs_path);
use Digest::SHA qw(sha256);
use File::Basename qw(dirname);
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use MIME::Base64 qw(encode_base64 decode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $json = JSON::PP->new->utf8->canonical;
my $verify_dir = abs_path(dirname(__FILE__) . '/../verify');
my $python = -x '/usr/bin/python3' ? '/usr/bin/python3' : 'python3';

# --- the receiver and the Python helper ---

# Start test/verify/receiver.js; the same hash as start_sink(), so that
# sink_records(), sink_path_records() and stop_sink() work on it.
sub start_receiver
{
	my ($name) = @_;
	my $dir = $PostgreSQL::Test::Utils::log_path;
	my $record = "$dir/receiver_$name.jsonl";
	my $port_file = "$dir/receiver_$name.port";
	my $log = "$dir/receiver_$name.log";
	unlink $record, $port_file;
	my $h = IPC::Run::start(
		[
			'node', "$verify_dir/receiver.js", '--port-file', $port_file,
			'--record', $record, '--python', $python
		],
		'<', \undef, '>>', $log, '2>>', $log);
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	until (-s $port_file)
	{
		eval { $h->pump_nb };    # notices that it exited
		if (time > $deadline || !$h->pumpable)
		{
			eval { $h->finish };
			my $why = "receiver.js did not start: " . (-e $log ? slurp_file($log) : '?');
			diag($why);
			die $why;
		}
		usleep(20_000);
	}
	my $port = slurp_file($port_file);
	chomp $port;
	return {
		name => $name,
		port => $port,
		url => "http://127.0.0.1:$port",
		record => $record,
		harness => $h,
		http => HTTP::Tiny->new(timeout => $PostgreSQL::Test::Utils::timeout_default),
	};
}

# The receiver's keys for a path: { label => whsec_ or whpk_ }, and the
# labels it accepts (default all).
sub set_keys
{
	my ($r, $path, $keys, $accept) = @_;
	my $res = $r->{http}->post(
		"$r->{url}/_keys",
		{
			content => $json->encode({ path => $path, keys => $keys, defined $accept ? (accept => $accept) : () }),
			headers => { 'content-type' => 'application/json' }
		});
	die "receiver /_keys failed: $res->{status} $res->{content}" unless $res->{success};
	return $json->decode($res->{content});
}

# Requests to test/verify/ed25519_helper.py (Python's cryptography), one
# run for all of them; returns the answers in order.
sub py_ed25519
{
	my (@reqs) = @_;
	my $in = join('', map { $json->encode($_) . "\n" } @reqs);
	my ($out, $err) = ('', '');
	IPC::Run::run([ $python, "$verify_dir/ed25519_helper.py" ], \$in, \$out, \$err)
	  or die "ed25519_helper.py failed: $err";
	my @ans = map { $json->decode($_) } split /\n/, $out;
	die "ed25519_helper.py answered " . scalar(@ans) . " of " . scalar(@reqs) unless @ans == @reqs;
	die "ed25519_helper.py: $_->{error}" for grep { defined $_->{error} } @ans;
	return @ans;
}

my $r = start_receiver('sig');
# Stop it (and its Python helper) even when the test dies half-way.
END { stop_sink($r) if $r && $r->{harness} }
my $url = $r->{url};
my $node = relay_node('signatures', init => { extra => [ '--encoding=UTF8', '--locale=C' ] });

sub sql { return $node->safe_psql('postgres', $_[0]) }

# The body's bytes and the signed text of a record.
sub body_bytes { return decode_base64($_[0]{body_b64}) }

sub signed_text
{
	my ($rec) = @_;
	my $h = $rec->{headers};
	return "$h->{'webhook-id'}.$h->{'webhook-timestamp'}." . body_bytes($rec);
}

# What verified each signature of a record, in header order: "a2 a1" (a
# signature no key verified shows as "?").
sub pattern
{
	my ($rec) = @_;
	return join(' ', map { @{ $_->{verified_by} } == 1 ? $_->{verified_by}[0] : '?' } @{ $rec->{sigs} });
}

# One entry per message of a record, for check_key_fifo(): rseq, status,
# key, seq (the payload's i, which grows with commit order).
sub entries
{
	my ($rec) = @_;
	my $body = $json->decode(body_bytes($rec));
	my @env = ref $body eq 'ARRAY'
	  ? map { { key => $_->{key} // '-', payload => $_->{payload} } } @$body
	  : ({ key => $rec->{headers}{'outbox-key'} // '-', payload => $body });
	return map { { rseq => $rec->{seq}, status => $rec->{status}, key => $_->{key}, seq => $_->{payload}{i} } } @env;
}

# Expected { key => [i ascending] } for emitted(i, k) rows matching $where.
sub expected_by_key
{
	my ($where) = @_;
	my %e;
	for (split /\n/, sql("SELECT k, i FROM emitted WHERE $where ORDER BY i"))
	{
		my ($k, $i) = split /\|/;
		push @{ $e{$k} }, $i;
	}
	return \%e;
}

sub lag
{
	my ($target, $what) = @_;
	return sql("SELECT $what FROM outbox.lag WHERE target = '$target'");
}

# Wait until every message emitted so far reached $target.
sub wait_drained
{
	my ($target) = @_;
	return wait_until(sub { lag($target, 'pending') eq '0' });
}

sql(q{CREATE TABLE emitted (i int PRIMARY KEY, k text NOT NULL, topic text NOT NULL, msg_id text NOT NULL)});
sql(q{CREATE TABLE emit_stop ()});

# A body with characters of 2, 3 and 4 bytes in UTF-8, a quote, a
# backslash and a tab: the signature is over the bytes.
my $text = q{U&'caf\00e9 \6f22\5b57 \+01f642 "q" \005c \0009 end'};

# Emit messages $from..$to to $topic in one statement (one transaction).
sub emit_range
{
	my ($topic, $from, $to, $nkeys) = @_;
	sql(qq{INSERT INTO emitted
		SELECT g, 'k' || (g % $nkeys), '$topic',
		       outbox_emit('$topic', jsonb_build_object('i', g, 'text', $text), 'k' || (g % $nkeys))
		  FROM generate_series($from, $to) g});
}

# --- generate_secret() and signing_public_key() ---
my $gen_h = sql(q{SELECT outbox.generate_secret()});
my $gen_h2 = sql(q{SELECT outbox.generate_secret('hmac')});
my $gen_e = sql(q{SELECT outbox.generate_secret('ed25519')});
like($gen_h, qr{^whsec_[A-Za-z0-9+/]+={0,2}$}, 'generate_secret() makes a whsec_ key');
is(length(decode_base64(substr($gen_h, 6))), 32, '... of 32 bytes');
isnt($gen_h, $gen_h2, '... a new one each time');
like($gen_e, qr{^whsk_[A-Za-z0-9+/]+={0,2}$}, "generate_secret('ed25519') makes a whsk_ key");
is(length(decode_base64(substr($gen_e, 5))), 32, '... of 32 bytes (the seed)');

# RFC 8032, 7.1, TEST 1: secret key and public key.
my $rfc_sk = 'whsk_' . encode_base64(pack('H*', '9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60'), '');
my $rfc_pk = 'whpk_' . encode_base64(pack('H*', 'd75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a'), '');
is(sql("SELECT outbox.signing_public_key('$rfc_sk')"), $rfc_pk,
	"signing_public_key() of RFC 8032's test key is its public key");

my $gen_e_pk = sql("SELECT outbox.signing_public_key('$gen_e')");
my ($py_pk, $py_rfc) = py_ed25519({ op => 'public', secret => $gen_e }, { op => 'public', secret => $rfc_sk });
is($gen_e_pk, $py_pk->{public_key}, 'signing_public_key() agrees with Python on a generated key');
is($py_rfc->{public_key}, $rfc_pk, '... and Python agrees with RFC 8032 (the helper works)');
my $gen_e64 = 'whsk_' . encode_base64(decode_base64(substr($gen_e, 5)) . decode_base64(substr($gen_e_pk, 5)), '');
is(sql("SELECT outbox.signing_public_key('$gen_e64')"), $gen_e_pk,
	'the 64-byte whsk_ form (seed and public key) has the same public key');
my $mismatch = 'whsk_' . encode_base64(decode_base64(substr($gen_e, 5)) . decode_base64(substr($rfc_pk, 5)), '');
my ($rc, $out, $err) = $node->psql('postgres', "SELECT outbox.signing_public_key('$mismatch')");
like($err, qr/not an ed25519 signing key/, 'a 64-byte whsk_ key whose second half is another public key is refused');
($rc, $out, $err) = $node->psql('postgres', "SELECT outbox.signing_public_key('$gen_h')");
like($err, qr/not an ed25519 signing key/, 'signing_public_key() of a whsec_ secret is an error');

# --- v1: whsec_ targets, verified by the standardwebhooks library ---
my $h64 = 'whsec_' . encode_base64(sha256('one') . sha256('two'), '');    # 64 bytes
set_keys($r, '/hmac1', { h => $gen_h });
set_keys($r, '/hmacb', { h => $h64 });
sql(qq{
BEGIN;
SELECT outbox.create_http_target('hmac1', '$url/hmac1', secret => '$gen_h', lanes => 4);
SELECT outbox.create_http_target('hmacb', '$url/hmacb', secret => '$h64', batch_size => 10, lanes => 2);
SELECT outbox.subscribe('hmac1', 'sig.h');
SELECT outbox.subscribe('hmacb', 'sig.h');
COMMIT;
});
emit_range('sig.h', 1, 150, 7);
emit_range('sig.h', 151, 300, 7);
ok(wait_drained('hmac1') && wait_drained('hmacb'), 'the whsec_ targets deliver their messages');
my %hmac_secret = (hmac1 => $gen_h, hmacb => $h64);
for my $t (qw(hmac1 hmacb))
{
	my @recs = sink_path_records($r, "/$t");
	my $expected = expected_by_key(q{topic = 'sig.h'});
	is_deeply([ check_key_fifo([ map { entries($_) } @recs ], $expected) ], [],
		"$t: every message once, per key in order");
	is(scalar(grep { $_->{status} != 200 } @recs), 0, "$t: the receiver accepted every request");
	is(scalar(grep { pattern($_) ne 'h' } @recs), 0,
		"$t: each request has one signature, that the library verifies with the secret");
	is(scalar(grep { $_->{sigs}[0]{version} ne 'v1' } @recs), 0, "$t: ... a v1 one");
	is(scalar(grep { "@{ $_->{lib_accepts} }" ne 'h' } @recs), 0,
		"$t: Webhook.verify() accepts the whole header of every request");
	is(scalar(grep { $_->{headers}{'webhook-signature'} ne webhook_signature($hmac_secret{$t},
					$_->{headers}{'webhook-id'}, $_->{headers}{'webhook-timestamp'}, body_bytes($_)) } @recs),
		0, "$t: every signature recomputed in Perl (Digest::SHA) is the header");
	ok(scalar(grep { body_bytes($_) =~ /\xf0\x9f\x99\x82/ } @recs) == @recs,
		"$t: the bodies carry multi-byte UTF-8");
}
cmp_ok(scalar(sink_path_records($r, '/hmacb')), '<', 300 / 2, 'hmacb sent batches');

# --- v1a: whsk_ targets, verified with Python's cryptography ---
set_keys($r, '/ed1', { e => $gen_e_pk });
set_keys($r, '/edb', { e => $gen_e_pk });
sql(qq{
BEGIN;
SELECT outbox.create_http_target('ed1', '$url/ed1', secret => '$gen_e', lanes => 4);
SELECT outbox.create_http_target('edb', '$url/edb', secret => '$gen_e64', batch_size => 10, lanes => 2);
SELECT outbox.subscribe('ed1', 'sig.e');
SELECT outbox.subscribe('edb', 'sig.e');
COMMIT;
});
emit_range('sig.e', 1001, 1100, 5);
emit_range('sig.e', 1101, 1200, 5);
ok(wait_drained('ed1') && wait_drained('edb'), 'the whsk_ targets deliver their messages');
for my $t (qw(ed1 edb))
{
	my @recs = sink_path_records($r, "/$t");
	is_deeply([ check_key_fifo([ map { entries($_) } @recs ], expected_by_key(q{topic = 'sig.e'})) ], [],
		"$t: every message once, per key in order");
	is(scalar(grep { $_->{status} != 200 } @recs), 0, "$t: the receiver accepted every request");
	is(scalar(grep { pattern($_) ne 'e' } @recs), 0,
		"$t: each request has one signature, that cryptography verifies with the whpk_ key");
	is(scalar(grep { $_->{headers}{'webhook-signature'} !~ m{^v1a,[A-Za-z0-9+/]{86}==$} } @recs), 0,
		"$t: ... a v1a one, of 64 bytes");
	# Ed25519 is deterministic: Python signing the same text with the
	# same key makes the very same signature.
	my @mine = py_ed25519(map { { op => 'sign', secret => $gen_e, msg_b64 => encode_base64(signed_text($_), '') } } @recs);
	my @differ = grep { $recs[$_]{headers}{'webhook-signature'} ne "v1a,$mine[$_]{sig_b64}" } 0 .. $#recs;
	is(scalar @differ, 0, "$t: every signature is the one Python makes with the whsk_ key");
	diag("first differing: header $recs[$differ[0]]{headers}{'webhook-signature'}, "
		  . "body_b64 " . substr($recs[$differ[0]]{body_b64}, 0, 200) . ", Python's v1a,$mine[$differ[0]]{sig_b64}")
	  if @differ;
}

# A receiver with a wrong public key refuses; with the right one, the
# retry is delivered.
my $other_e = sql(q{SELECT outbox.generate_secret('ed25519')});
my $other_pk = sql("SELECT outbox.signing_public_key('$other_e')");
set_keys($r, '/edbad', { wrong => $other_pk });
sql(qq{
BEGIN;
SELECT outbox.create_http_target('edbad', '$url/edbad', secret => '$gen_e', max_attempts => 0);
SELECT outbox.subscribe('edbad', 'sig.bad');
COMMIT;
});
emit_range('sig.bad', 2001, 2001, 1);
ok(scalar(sink_path_records($r, '/edbad', 2)) >= 2, 'a receiver with a wrong public key: the relay retries');
my @bad = sink_path_records($r, '/edbad');
is(scalar(grep { $_->{status} == 401 && pattern($_) eq '?' } @bad), scalar @bad,
	'... every attempt refused (401): the signature does not verify with the wrong key');
ok(wait_until(sub { lag('edbad', 'last_status') eq '401' }), '... outbox.lag shows the 401');
is(lag('edbad', 'delivered || \' \' || pending'), '0 1', '... nothing delivered, the message pending');
set_keys($r, '/edbad', { wrong => $other_pk, e => $gen_e_pk });
ok(wait_drained('edbad'), 'given the right public key, the receiver accepts the retry');
@bad = sink_path_records($r, '/edbad');
is($bad[-1]{status} . ' ' . pattern($bad[-1]), '200 e', '... verified with it');
is(scalar(grep { $_->{status} == 200 } @bad), 1, '... once');

# --- rotation while messages flow ---
# Two targets (batch_size 1 and 10); for each, keys 1 and 2 (whsec_) and 3
# (whsk_; the receiver holds its whpk_).
my %key;
for my $p (qw(a b))
{
	$key{"${p}1"} = sql(q{SELECT outbox.generate_secret()});
	$key{"${p}2"} = sql(q{SELECT outbox.generate_secret('hmac')});
	$key{"${p}3"} = sql(q{SELECT outbox.generate_secret('ed25519')});
}
my %rkey = map { $_ => ($key{$_} =~ /^whsk_/ ? sql("SELECT outbox.signing_public_key('$key{$_}')") : $key{$_}) } keys %key;
my %rot = (rot1 => 'a', rotb => 'b');
sub receiver_accepts
{
	my (@n) = @_;
	for my $t (sort keys %rot)
	{
		my $p = $rot{$t};
		set_keys($r, "/$t", { map { ("$p$_" => $rkey{"$p$_"}) } 1 .. 3 }, [ map { "$p$_" } @n ]);
	}
}
receiver_accepts(1);
sql(qq{
BEGIN;
SELECT outbox.create_http_target('rot1', '$url/rot1', secret => '$key{a1}', lanes => 4);
SELECT outbox.create_http_target('rotb', '$url/rotb', secret => '$key{b1}', batch_size => 10, lanes => 2);
SELECT outbox.subscribe('rot1', 'rot');
SELECT outbox.subscribe('rotb', 'rot');
COMMIT;
});

# The emitter: one message a transaction, sometimes three, about a hundred
# transactions a second, until told to stop (at the latest after 600 s or
# 50,000 messages, should the test die before telling it).
my $emitter_sql = qq{
DO \$\$
DECLARE
	i int := 10000;
	stop_at timestamptz := clock_timestamp() + interval '600 s';
BEGIN
	WHILE NOT EXISTS (SELECT FROM emit_stop) AND clock_timestamp() < stop_at AND i < 60000 LOOP
		FOR j IN 1 .. CASE WHEN i % 7 = 0 THEN 3 ELSE 1 END LOOP
			i := i + 1;
			INSERT INTO emitted VALUES (i, 'k' || (i % 5), 'rot',
				outbox_emit('rot', jsonb_build_object('i', i, 'text', $text), 'k' || (i % 5)));
		END LOOP;
		COMMIT;
		PERFORM pg_sleep(0.01);
	END LOOP;
END
\$\$;
};
my ($em_out, $em_err) = ('', '');
my $emitter = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $emitter_sql ],
	'<', \undef, '>', \$em_out, '2>', \$em_err);

# How many requests of each path verified as each pattern(), counted as the
# records come in.
sub pattern_count
{
	my ($path, $pattern) = @_;
	my $recs = sink_records($r);
	for my $i (($r->{counted} // 0) .. $#$recs)
	{
		$r->{patterns}{ $recs->[$i]{path} }{ pattern($recs->[$i]) }++;
	}
	$r->{counted} = scalar @$recs;
	return $r->{patterns}{$path}{$pattern} // 0;
}

# Wait until both rotation targets got $n requests whose signatures
# verified as $pattern, with a prefix of 'a'/'b' for each target's keys
# ("2 1": key 2's signature, then key 1's).
sub wait_pattern
{
	my ($pattern, $n) = @_;
	my $ok = 1;
	for my $t (sort keys %rot)
	{
		(my $want = $pattern) =~ s/(\d)/$rot{$t}$1/g;
		$ok &&= wait_until(sub { pattern_count("/$t", $want) >= $n });
		diag("$t: waited in vain for $n requests signed \"$want\"; emitter: $em_err") unless $ok;
	}
	return $ok;
}

my $rot_start = time;
ok(wait_pattern('1', 40), 'rotation: requests signed with key 1');
receiver_accepts(1, 2);
sql(qq{SELECT outbox.rotate_secret('rot1', '$key{a2}'), outbox.rotate_secret('rotb', '$key{b2}')});
is(sql(q{SELECT string_agg(format('%s %s %s', name, left(secret, 6), left(previous_secret, 6)), ',' ORDER BY name)
	FROM outbox.targets WHERE name LIKE 'rot%'}),
	'rot1 whsec_ whsec_,rotb whsec_ whsec_', 'rotate_secret(): the old key is the previous_secret');
ok(wait_pattern('2 1', 40), 'after rotate_secret(): both signatures, key 2\'s first, each verified with its own key');
is(sql(q{SELECT outbox.finish_secret_rotation('rot1') AND outbox.finish_secret_rotation('rotb')}), 't',
	'finish_secret_rotation() answers true');
ok(wait_pattern('2', 40), 'after finish_secret_rotation(): key 2 alone');
is(sql(q{SELECT count(*) FROM outbox.targets WHERE name LIKE 'rot%' AND previous_secret IS NOT NULL}), '0',
	'... no previous_secret left');
is(sql(q{SELECT outbox.finish_secret_rotation('rot1')}), 'f', '... and a second finish answers false');
receiver_accepts(2, 3);    # the receiver forgets key 1 and learns key 3
sql(qq{SELECT outbox.rotate_secret('rot1', '$key{a3}'), outbox.rotate_secret('rotb', '$key{b3}')});
ok(wait_pattern('3 2', 40), 'rotating from whsec_ to whsk_: the v1a signature, then the v1 one, each verified');
sql(q{SELECT outbox.finish_secret_rotation('rot1'), outbox.finish_secret_rotation('rotb')});
ok(wait_pattern('3', 40), 'after finish_secret_rotation(): the whsk_ key alone');
receiver_accepts(3);
ok(wait_pattern('3', 80), '... and messages go on flowing');
note sprintf('rotation steps done in %.1f s', time - $rot_start);

sql(q{INSERT INTO emit_stop DEFAULT VALUES});
ok($emitter->finish, 'the emitter ran without error') or diag($em_err);
my $n_rot = sql(q{SELECT count(*) FROM emitted WHERE topic = 'rot'});
note "rotation: $n_rot messages emitted";
ok(wait_drained('rot1') && wait_drained('rotb'), 'rotation: both targets deliver every message');

my %phase = ('1' => 0, '2 1' => 1, '2' => 2, '3 2' => 3, '3' => 4);
my %sample;    # a request of each phase, for the replays below
for my $t (sort keys %rot)
{
	my $p = $rot{$t};
	my @recs = sink_path_records($r, "/$t");
	my @refused = grep { $_->{status} != 200 } @recs;
	is(scalar @refused, 0, "$t: no request was refused")
	  or diag("first refused: " . $json->encode($refused[0]));
	is_deeply([ check_key_fifo([ map { entries($_) } @recs ], expected_by_key(q{topic = 'rot'})) ], [],
		"$t: every message emitted arrived exactly once, per key in order ($n_rot messages)");

	# Every signature verified with exactly one key, and the header's
	# signatures are those of a phase.
	my (%seen, @odd, @back, %last);
	for my $rec (@recs)
	{
		(my $pat = pattern($rec)) =~ s/$p//g;
		if (!defined $phase{$pat})
		{
			push @odd, pattern($rec) . " ($rec->{headers}{'webhook-signature'})";
			next;
		}
		$seen{$pat}++;
		$sample{$t}{$pat} //= $rec;
		# Per key, requests go one after another: the phases only move
		# forward.
		for my $e (entries($rec))
		{
			push @back, "key $e->{key}: $pat after $last{$e->{key}}"
			  if defined $last{ $e->{key} } && $phase{$pat} < $phase{ $last{ $e->{key} } };
			$last{ $e->{key} } = $pat;
		}
	}
	is_deeply(\@odd, [], "$t: every signature verified with one key; the keys are those of a phase");
	is_deeply(\@back, [], "$t: per key, the phases follow each other in order");
	is(join(',', sort { $phase{$a} <=> $phase{$b} } keys %seen), '1,2 1,2,3 2,3', "$t: all five phases seen")
	  or diag(explain(\%seen));
	# The library, given the whole header, accepts with every v1 key that
	# signed it (it skips v1a signatures).
	my @lib = grep {
		my $rec = $_;
		"@{ $rec->{lib_accepts} }" ne join(' ', sort map { @{ $_->{verified_by} } } grep { $_->{version} eq 'v1' } @{ $rec->{sigs} })
	} @recs;
	is(scalar @lib, 0, "$t: Webhook.verify() of the whole header accepts with each v1 key that signed");
	is(lag($t, q{dead_letters || ' ' || coalesce(last_error, 'none')}), '0 none', "$t: no dead letter, no error");
}

# --- negative controls: recorded requests replayed ---
set_keys($r, '/replay_1', { a1 => $rkey{a1} });
set_keys($r, '/replay_2', { a2 => $rkey{a2} });
set_keys($r, '/replay_3', { a3 => $rkey{a3} });

# POST a recorded request again, its body or headers changed as %change
# says; returns the receiver's status.
sub replay
{
	my ($rec, $path, %change) = @_;
	my %h = (
		'content-type' => 'application/json',
		map { ($_ => $rec->{headers}{$_}) } qw(webhook-id webhook-timestamp webhook-signature));
	%h = (%h, %{ $change{headers} // {} });
	my $res = $r->{http}->post("$url$path", { content => $change{body} // body_bytes($rec), headers => \%h });
	return $res->{status};
}

# A body with its first "i" changed.
sub tampered
{
	(my $b = body_bytes($_[0])) =~ s/"i": (\d+)/'"i": ' . ($1 + 1)/e;
	return $b;
}

SKIP:
{
	my $s = $sample{rot1};
	skip 'rot1 has no request of some phase', 19 if grep { !$s->{$_} } keys %phase;

	is(replay($s->{'1'}, '/replay_1'), 200,
		'replay: a request signed with key 1 is accepted with key 1 (the replay works)');
	is(replay($s->{'1'}, '/replay_2'), 401, '... but not with key 2 alone');
	is(replay($s->{'2 1'}, '/replay_1') . ' ' . replay($s->{'2 1'}, '/replay_2'), '200 200',
		'a request signed during the rotation is accepted with either key alone');
	is(replay($s->{'2'}, '/replay_2'), 200, 'a request signed after the rotation is accepted with key 2');
	is(replay($s->{'2'}, '/replay_1'), 401, '... and refused with the old key alone');
	is(replay($s->{'3 2'}, '/replay_3') . ' ' . replay($s->{'3 2'}, '/replay_2'), '200 200',
		'a request signed during the whsec_ -> whsk_ rotation is accepted with either key alone');
	is(replay($s->{'3'}, '/replay_3'), 200, 'a v1a request is accepted with the whpk_ key');
	is(replay($s->{'3'}, '/replay_2'), 401, '... and refused with the previous whsec_ key alone');

	isnt(tampered($s->{'2'}), body_bytes($s->{'2'}), 'a tampered body differs');
	is(replay($s->{'2'}, '/replay_2', body => tampered($s->{'2'})), 401, 'v1: a tampered body is refused');
	is(replay($s->{'2'}, '/replay_2', body => body_bytes($s->{'2'}) . ' '), 401,
		'v1: a byte appended to the body is refused');
	is(replay($s->{'2'}, '/replay_2', headers => { 'webhook-id' => 'msg_other' }), 401,
		'v1: another webhook-id is refused');
	is( replay(
			$s->{'2'}, '/replay_2',
			headers => { 'webhook-timestamp' => $s->{'2'}{headers}{'webhook-timestamp'} + 1 }),
		401,
		'v1: another webhook-timestamp is refused');
	is(replay($s->{'2 1'}, '/replay_2', body => tampered($s->{'2 1'})), 401,
		'v1, two signatures: a tampered body is refused');
	is(replay($s->{'3'}, '/replay_3', body => tampered($s->{'3'})), 401, 'v1a: a tampered body is refused');
	is(replay($s->{'3'}, '/replay_3', headers => { 'webhook-id' => 'msg_other' }), 401,
		'v1a: another webhook-id is refused');
	is( replay(
			$s->{'3'}, '/replay_3',
			headers => { 'webhook-timestamp' => $s->{'3'}{headers}{'webhook-timestamp'} + 1 }),
		401,
		'v1a: another webhook-timestamp is refused');
	my $sig = decode_base64(substr($s->{'3'}{headers}{'webhook-signature'}, 4));
	substr($sig, -1, 1) = chr(ord(substr($sig, -1, 1)) ^ 1);
	is(replay($s->{'3'}, '/replay_3', headers => { 'webhook-signature' => 'v1a,' . encode_base64($sig, '') }),
		401, 'v1a: a signature with one bit changed is refused');
	is(replay($s->{'3 2'}, '/replay_3', body => tampered($s->{'3 2'})), 401,
		'v1a, two signatures: a tampered body is refused');
}

stop_sink($r);
relay_no_crash($node);
$node->stop;
done_testing();
