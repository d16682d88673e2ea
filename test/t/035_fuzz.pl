# Fuzz test of the SQL API: thousands of random calls of outbox_emit() and
# of every function in schema outbox (found in pg_proc, so functions added
# later are covered without touching this file), with random arguments per
# argument type: empty and 100 kB strings, control characters (C0, DEL, C1
# U+0085), U+00A0, U+2028, U+3000, CR/LF, quotes, backslashes, SQL
# metacharacters, format strings, negative, zero, INT_MIN/INT_MAX and huge
# numbers, NaN and infinities, odd JSON (10000-deep arrays, huge numbers,
# "\u0000", big objects, escapes), URLs of every shape (credentials,
# 0x7f000001, IPv6 with a zone id, odd ports, percent-encoding, other
# schemes, 169.254.169.254) and header objects with CR/LF.  Most calls take
# valid arguments with at most one fuzzed, so that targets exist and the
# relay delivers to them (mostly to a second sink) while the fuzzing goes
# on; the others are fuzzed throughout.  Calls run as the extension owner
# and, a fifth of them again, as a role granted only EXECUTE on
# outbox_emit(), from two concurrent sessions; each call is its own plpgsql
# sub-block recording its SQLSTATE, some are rolled back on purpose, up to
# four share a transaction.  The first phase ends with 30 targets made of
# valid settings (some answered 404 or 410); a second phase reconfigures,
# pauses, resumes and replays them with valid arguments while messages
# flow.  Checked:
#  - every call succeeds or fails with a proper SQLSTATE, never XX000 (nor
#    any other internal-error class XX), and none goes unrecorded;
#  - the server never crashes or restarts, and logs no internal error;
#  - the relay worker never fails (exits) on what the fuzzer stored or did;
#  - a healthy HTTP target, created before and never named by the fuzzer,
#    still receives newly emitted messages after each phase;
#  - the relay skips none of the 30 targets (it skips only rows it cannot
#    use), and disables none of them before its disable_after.
# FUZZ_SEED=n reproduces the generated calls (the seed is printed; the two
# sessions and the relay interleave differently from run to run);
# FUZZ_CALLS=n changes the number of owner calls (default 5000; the
# unprivileged role makes a fifth as many more).
use strict;
use warnings;
use Encode qw(encode_utf8);
use IPC::Run;
use JSON::PP;
use POSIX qw(strftime);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use OutboxRelayTest;

my $seed = $ENV{FUZZ_SEED} // (int(time * 1000) ^ $$) % 2**31;
my $owner_calls = $ENV{FUZZ_CALLS} // 5000;
srand($seed);
note "fuzz seed $seed (FUZZ_SEED=$seed reproduces the generated calls)";
my $json = json_codec()->utf8->canonical;

# The healthy target and its topic: the fuzzer never names them.
my $healthy = 'fuzz_healthy_target';
my $healthy_topic = 'fuzz.healthy.check';

my $hsink = start_sink('fuzz_healthy');
# The sink the fuzzed targets mostly point at: it answers 204, or 500 at
# random, 404 on /nf and 410 on /gone, and keeps no bodies (some are large).
my $fsink = start_sink('fuzz_targets', '--fail-rate', '0.2', '--seed', $seed);
sink_control($fsink, { keep_body => JSON::PP::false });
sink_control($fsink, { path => '/nf', status => 404 });
sink_control($fsink, { path => '/gone', status => 410 });
my ($furl, $fport) = ($fsink->{url}, $fsink->{port});

my $node = relay_node(
	'fuzz',
	init => { extra => [ '--encoding=UTF8', '--locale=C' ] },
	# The SQLSTATE in every logged error, to find internal errors.
	conf => "log_error_verbosity = verbose\n");
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
my $owner = $node->safe_psql('postgres', 'SELECT current_user');

$node->safe_psql(
	'postgres', qq{
CREATE ROLE fuzz_app LOGIN;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO fuzz_app;
CREATE SCHEMA fuzz;
CREATE TABLE fuzz.results (n int NOT NULL, who text NOT NULL, state text NOT NULL, message text);
GRANT USAGE ON SCHEMA fuzz TO fuzz_app;
GRANT INSERT ON fuzz.results TO fuzz_app;
SELECT outbox.create_http_target('$healthy', '$hsink->{url}/healthy', lanes => 2);
SELECT outbox.subscribe('$healthy', '$healthy_topic');
});

# Messages of the healthy topic carrying a marker, and the wait for them.
sub healthy_delivered
{
	my ($marker, $n, $timeout) = @_;
	my $got = 0;
	wait_until(
		sub {
			my %seen = map { $_->{body} => 1 }
			  grep { ($_->{body} // '') =~ /"marker": "\Q$marker\E"/ }
			  sink_path_records($hsink, '/healthy');
			$got = keys %seen;
			return $got >= $n;
		},
		$timeout);
	return $got;
}
$node->safe_psql('postgres',
	"SELECT outbox_emit('$healthy_topic', '{\"marker\": \"before\", \"i\": 0}', 'k')");
is(healthy_delivered('before', 1), 1, 'the healthy target receives messages before the fuzzing');
my $healthy_row_sql = qq{SELECT url, state, headers::text, batch_size, lanes, ordering,
	(SELECT string_agg(pattern, ',') FROM outbox.subscriptions s WHERE s.target_id = t.id)
  FROM outbox.targets t WHERE name = '$healthy'};
my $healthy_row = $node->safe_psql('postgres', $healthy_row_sql);

# --- the functions to fuzz, from pg_proc ---
my $functions = $json->decode(
	$node->safe_psql(
		'postgres', q{
SELECT coalesce(json_agg(f ORDER BY f.sig), '[]') FROM (
  SELECT p.oid::regprocedure::text AS sig,
		 quote_ident(n.nspname) || '.' || quote_ident(p.proname) AS fn,
		 p.prokind AS kind, format_type(p.prorettype, NULL) AS rettype, p.proretset AS retset,
		 p.pronargdefaults AS ndefaults,
		 (SELECT coalesce(json_agg(json_build_object(
					'name', (SELECT array_agg(x.nm ORDER BY x.k)
							   FROM unnest(p.proargnames, p.proargmodes) WITH ORDINALITY x(nm, m, k)
							  WHERE coalesce(x.m, 'i') IN ('i', 'b', 'v'))[a.o],
					'type', format_type(a.t, NULL), 'typtype', ty.typtype,
					'attrs', (SELECT json_agg(json_build_object('name', at.attname,
							   'type', format_type(at.atttypid, at.atttypmod), 'typtype', aty.typtype)
							   ORDER BY at.attnum)
								FROM pg_attribute at JOIN pg_type aty ON aty.oid = at.atttypid
							   WHERE at.attrelid = ty.typrelid AND at.attnum > 0 AND NOT at.attisdropped))
					ORDER BY a.o), '[]')
			FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, o)
			JOIN pg_type ty ON ty.oid = a.t) AS args
	FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname = 'outbox' OR (n.nspname = 'pg_catalog' AND p.proname = 'outbox_emit')) f}));

# Left out, because calling them defeats the test rather than tests the
# function:
my %excluded = (
	# raises the commit sequence to its argument: a huge value exhausts the
	# message ids for good (every later emit fails), so the relay check
	# afterwards would be meaningless; its own refusals are tested in sql/
	'outbox.advance_sequence(bigint)' => 'a huge value exhausts message ids',);
my (@fuzzed, %skipped);
for my $f (@$functions)
{
	if ($excluded{ $f->{sig} })
	{
		$skipped{ $f->{sig} } = $excluded{ $f->{sig} };
	}
	elsif ($f->{rettype} =~ /^(trigger|event_trigger)$/)
	{
		# callable only as triggers
		$skipped{ $f->{sig} } = "returns $f->{rettype}";
	}
	elsif ($f->{kind} !~ /^[fp]$/)
	{
		$skipped{ $f->{sig} } = "prokind $f->{kind}";
	}
	elsif (my @p = grep { $_->{typtype} eq 'p' } @{ $f->{args} })
	{
		# pseudo-typed arguments (internal, anyelement): nothing to fuzz from SQL
		$skipped{ $f->{sig} } = "argument of pseudo-type $p[0]{type}";
	}
	else
	{
		push @fuzzed, $f;
	}
}
ok((grep { $_->{fn} eq 'pg_catalog.outbox_emit' } @fuzzed), 'outbox_emit() is fuzzed');
cmp_ok(scalar @fuzzed, '>=', 20, 'the functions of schema outbox are found in pg_proc');
note 'fuzzed: ' . join(', ', map { $_->{sig} } @fuzzed);
note "not fuzzed: $_ ($skipped{$_})" for sort keys %skipped;

# --- random values ---
sub pick { return $_[ int rand @_ ] }

my @special = (
	(map { chr } 1 .. 31), "\x7f", "\x{85}", "\x{a0}", "\x{2028}", "\x{2029}", "\x{3000}",
	"\x{feff}", "\x{fffd}", "\x{10ffff}", "\x{1f600}", "\x{e9}", "\x{20ac}", "\r\n",
	"'", "''", '"', '\\', '\\\\', '`', '$$', '$fz$', '$1', "'; DROP TABLE x; --",
	'"; DROP TABLE x; --', '%s', '%n', '%s%s%s%n', '%d', '%x', '%%', '%', '*', '.', ' ', '--',
	'/*', '*/', ';', ':v', ':"v"', ":'v'", '\\gexec', '\\!', '\\.', '{', '}', '[', ']', ',',
	'<script>', '../', '%00', '%0d%0a', 'NULL', 'null', '\\u0000', '\\N');

# A random string: pieces of words, special characters and random code
# points; sometimes empty, very long or at a length limit.
sub rstr
{
	my $r = rand;
	return '' if $r < 0.04;
	return 'x' x 100_000 if $r < 0.05;
	if ($r < 0.055)
	{
		return join '', map { pick(@special, 'a' .. 'z') } 1 .. 20_000;
	}
	return 'x' x pick(63, 64, 255, 256, 1024, 1025, 2048, 2049, 7999, 8000) if $r < 0.08;
	my $s = '';
	for (0 .. int rand 8)
	{
		my $q = rand;
		$s .=
		    $q < 0.45 ? pick(@special)
		  : $q < 0.85 ? join('', map { pick('a' .. 'z', '0' .. '9', '_', '-', '.') } 0 .. int rand 10)
		  :             chr(pick(0x20 + int rand 0x5f, 0xa0 + int rand 0x700, 0x3000 + int rand 0x6000));
	}
	return $s;
}

# Values by the name of the argument (or column) they are for: a pool of
# valid ones (so that calls get past the first check and targets exist to
# be altered, paused, replayed and delivered to) and a pool of bad ones.
# A call draws all its arguments valid ($good, with at most one argument
# fuzzed), or all of them fuzzed.
our $good = 0;
my %valid = (
	name => [ 'fz_a', 'fz-b', 'fz.c', 'FZ_A', 'fz_n', 'fz_n2', '0', '_', 'a' x 63 ],
	topic => [
		'fz.t1', 'fz.t2', 'fz.t3', 'fz', "fz.\x{e9}\x{20ac}", 't' x 255, "fz.'\"\\`\$\$",
		'fz.%s%n', 'fz.*', '*', 'fz.t1.*'
	],
	key => [ 'k1', 'k2', 'k3', '', 'k' x 1024, "k\x{a0}\x{3000}", "k'\"\\", "k\tk", '%s%n' ],
	url => [
		"$furl/fz", "$furl/fz?a=1&b=%20&c", "$furl/fz#frag", "$furl/nf", "$furl/nf?x", "$furl/gone",
		"$furl/%zz%00%0d%0a%25",
		"$furl/'\"\\", "http://user:pa%40ss\@127.0.0.1:$fport/cred", "http://user:\@127.0.0.1:$fport/",
		"http://0x7f000001:$fport/hex", "http://2130706433:$fport/dec", "http://127.1:$fport/",
		"http://[::1]:$fport/v6", "http://[fe80::1%25eth0]:$fport/zone", 'http://127.0.0.1:0/',
		'http://127.0.0.1:1/', 'http://127.0.0.1:65535/', 'http://127.0.0.1:65536/',
		'http://127.0.0.1:99999999999999999999/', 'http://169.254.169.254/latest/meta-data/',
		"https://127.0.0.1:$fport/tls", "HTTP://127.0.0.1:$fport/UPPER", "http://localhost:$fport/",
		"$furl/" . 'a' x 2000, 'http://fuzz.invalid/', "http://127.0.0.1:$fport\\\@fuzz.invalid/",
		"http://127.0.0.1:$fport?q", "http://127.0.0.1:$fport/%2e%2e/%2e%2e/"
	],
	ca_file => [ '/etc/ssl/certs/ca-certificates.crt', '/nonexistent/ca.pem' ],
	secret => [
		'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'whsec_' . 'QUFB' x 6, 'whsec_' . 'QUFB' x 21 . 'QQ==',
		'whsec_' . 'QUFB' x 5 . 'QQ=='
	],
	ordering => [ 'key', 'strict' ],
	kind => [ 'http', 'notify', 'hmac', 'ed25519' ],
	state => [ 'active', 'paused', 'disabled' ],
	channel => [ 'fz_chan', 'fz chan', 'c' x 63, "\x{e9}" x 31, 'Fz"chan', "fz'chan", 'fz;chan' ],);
$valid{target} = $valid{name};
$valid{pattern} = $valid{topic};
$valid{pending_ordering} = $valid{ordering};
$valid{$_} = $valid{secret} for qw(new_secret previous_secret);
$valid{$_} = $valid{ca_file} for qw(client_cert client_key path);
my %invalid = (
	name => [ 'a' x 64, '-a', '.a', 'fz a', "fz\n", "fz_\x{e9}", '', "fz'; DROP TABLE x; --" ],
	topic => [
		't' x 256, 'a*b', '**', 'a b', "a\tb", "a\x{a0}b", "fz.\r\n", "fz\x01", "fz\x7f", '', ' ',
		"fz.\x{85}", "fz.\x{2028}", "fz.\x{3000}", "fz.\x{200b}", "fz.\x{feff}"
	],
	key => [ 'k' x 1025, "k\r\n", "k\x01", "k\x7f", "k\n", "k\x{2028}", "k\x{85}" ],
	url => [
		"http://[fe80::1%eth0]/", 'http://[::1/', 'http://[]/', 'http://127.0.0.1:-1/',
		'http://127.0.0.1:/', 'http://127.0.0.1:port/', 'file:///etc/passwd', "gopher://127.0.0.1:$fport/_x",
		'ftp://127.0.0.1/', "dict://127.0.0.1:$fport/", 'ldap://127.0.0.1/', 'ws://127.0.0.1/',
		'javascript:alert(1)', 'http://', 'http://:80/', 'http:///x', 'http://a@b@c/',
		"http://\x{4f8b}\x{3048}.invalid/", "http://127.0.0.1:$fport/ space",
		"http://127.0.0.1:$fport/\r\nX-Injected: 1", "http://127.0.0.1:$fport/\tx", "$furl/" . 'a' x 2100,
		"$furl/\x{e9}\x{2028}", "$furl/\x{85}", "$furl/\x{3000}", ''
	],
	secret => [
		'whsec_' . 'QUFB' x 22, 'whsec_' . 'QUFB' x 4, 'whsec_', 'whsec_====', 'whsec_QUF',
		'whsec_QUFB=', 'whsec_!!!!', 'WHSEC_QUFBQUFBQUFBQUFBQUFBQUFB', 'whsec_' . 'A' x 10000,
		'whsec_QUFB QUFB', "whsec_QUFB\n", ''
	],
	ordering => [ 'KEY', 'Strict', '', 'key ' ],
	kind => [ 'HTTP', '', 'smtp' ],
	state => [ 'Active', '', 'dropped' ],
	channel => [ 'c' x 64, "\x{e9}" x 32, '' ],
	ca_file => [ 'relative.pem', '', '/etc/passwd', "/tmp/x\n", '/', '/' . 'd/' x 2000, '/proc/self/mem' ],);
$invalid{target} = $invalid{name};
$invalid{pattern} = $invalid{topic};
$invalid{pending_ordering} = $invalid{ordering};
$invalid{$_} = $invalid{secret} for qw(new_secret previous_secret);
$invalid{$_} = $invalid{ca_file} for qw(client_cert client_key path);

my @header_names = (
	'x-tenant', 'X-Trace', 'authorization', 'x-api-key', "!#\$%&'*+-.^_`|~", 'x-' . 'y' x 200);
my @bad_header_names = (
	'content-type', 'Content-Length', 'host', 'HOST', 'webhook-id', 'Webhook-Signature',
	'outbox-seq', 'OUTBOX-KEY', 'user-agent', 'te', 'connection', 'x y', "x\r\ny", "x\n", '',
	'x' x 256, 'x' x 257, "\x{e9}", 'x:y', '%s%n', "x\x00y", 'x-' . 'y' x 300);
my @header_values = (
	'v', "tab\there", "\t", ' ', ' lead', 'trail ', '', 'v' x 8000, '%s%n',
	"'; DROP TABLE x; --", '"q"', '\\');
my @bad_header_values = (
	"a\r\nX-Injected: 1", "\n", "\r", "\x7f", "\x01", "\x00", "\x{85}", "\x{a0}", "\x{2028}",
	"\x{1f600}", "\x{e9}");

sub json_str
{
	my ($s) = @_;
	$s =~ s/(["\\])/\\$1/g;
	$s =~ s/([\x00-\x1f])/sprintf('\\u%04x', ord $1)/ge;
	# sometimes escape the rest too
	$s =~ s/([^\x00-\x7f])/ord $1 > 0xffff ? $1 : sprintf('\\u%04x', ord $1)/ge if rand() < 0.3;
	return "\"$s\"";
}

sub rnumber
{
	return pick(
		'0', '-0', '1', '-1', '1.5', '1e308', '-1e308', '1e309', '123456789012345678901234567890',
		'1e-7', '9007199254740993', '0.' . '0' x 400 . '1', '1' . '0' x 1000, '1E+2', '-0.0e-0',
		int(rand 1e9) - 5e8);
}

my $deep = 10_000;
my @valid_json = (
	'[' x $deep . ']' x $deep,
	'{"a":' x $deep . '1' . '}' x $deep,
	'1' . '0' x 100_000, '"\\ud83d\\ude00"', '"\\u00e9\\n\\t\\"\\\\\\/\\b\\f\\r"',
	"\"\x{2028}\x{85}\x{3000}\"", '{' . join(',', map { "\"k$_\": $_" } 1 .. 5000) . '}',
	'[' . join(',', 1 .. 10_000) . ']', '{"a": 1, "a": 2}', 'null', 'true', 'false', '""', '[]',
	'{}', '"' . 'x' x 100_000 . '"', '{"' . 'k' x 70_000 . '": 1}', "\t{ \"a\" : [ ] }\n");
my @invalid_json = (
	'[' x $deep, '1e1000000', '-1e1000000', '1e-1000000', '"\\u0000"', '{"a": "\\u0000"}',
	'"\\ud800"', '"\\udfff\\ud800"', '{', '[1,]', "'x'", 'NaN', 'Infinity', '-Infinity', '',
	' ', "\x{feff}{}", "{\"a\": \"\x01\"}", '{"big": "' . 'y' x 1_100_000 . '"}', '/* c */ {}',
	'{"a":1}x', '{"a" 1}', '[1 2]', '"\\x41"', '01', '.5', '+1', 'nul', '{"a":}');

# Random JSON text (valid when $good).
sub rjson
{
	my ($depth) = @_;
	$depth //= 0;
	if ($depth == 0 && rand() < 0.15)
	{
		return pick(@valid_json, $good ? () : @invalid_json);
	}
	my $r = rand;
	if ($depth < 4 && $r < 0.3)
	{
		return '{'
		  . join(', ',
			map { json_str(rand() < 0.6 ? pick('a' .. 'f', 'id', 'name', '') : rstr()) . ': ' . rjson($depth + 1) }
			  1 .. int rand 6)
		  . '}';
	}
	if ($depth < 4 && $r < 0.5)
	{
		return '[' . join(', ', map { rjson($depth + 1) } 1 .. int rand 6) . ']';
	}
	return json_str(rstr()) if $r < 0.75;
	return rnumber() if $r < 0.9;
	return pick('true', 'false', 'null');
}

# A header object (valid when $good).
sub rheaders
{
	my $r = rand;
	return rjson() if !$good && $r < 0.1;
	my $n = $r < 0.12 ? 300 : int rand 4;
	return '{'
	  . join(', ',
		map {
			json_str($good ? pick(@header_names) : rand() < 0.7 ? pick(@header_names, @bad_header_names) : rstr())
			  . ': '
			  . (
				$good ? json_str(pick(@header_values))
				: rand() < 0.85 ? json_str(rand() < 0.7 ? pick(@header_values, @bad_header_values) : rstr())
				: rjson(3))
		} 1 .. $n)
	  . '}';
}

# Integers: valid ones by name, or the edges.
my %valid_int = (
	lanes => [ 1, 2, 8, 256 ],
	pending_lanes => [ 1, 2, 8 ],
	batch_size => [ 1, 2, 10, 100, 1000 ],
	max_attempts => [ 0, 1, 2, 10, 1000000 ],
	timeout_ms => [ 10, 100, 1000, 5000 ],
	id => [ 1 .. 40, map { int rand 3000 } 1 .. 20 ],
	from_id => [ 1 .. 10, map { int rand 3000 } 1 .. 20 ],
	max_rate => [ 0, 0.5, 1, 50, 1000000, '1e-9' ],);
$valid_int{target_id} = $valid_int{id};

sub rint
{
	my ($hint) = @_;
	return pick(@{ $valid_int{$hint} }) if $good && $valid_int{$hint};
	return pick(0 .. 10) if $good;
	return pick(
		0, 1, -1, 2, 8, 9, 10, 16, 255, 256, 257, 999, 1000, 1001, 3600000, 3600001, 1000000,
		1000001, 2147483647, -2147483648, int rand 100, -int rand 100, int rand 5000);
}

sub rbigint
{
	my ($hint) = @_;
	return pick(@{ $valid_int{$hint} }) if $good && $valid_int{$hint};
	return pick(1 .. 100) if $good;
	return pick(
		0, 1, -1, 2, '9223372036854775807', '-9223372036854775808', 2147483648, 4294967296,
		'1000000000000000', int rand 100, int rand 5000, int rand 5000, -int rand 100);
}

sub rfloat
{
	my ($hint) = @_;
	return pick(@{ $valid_int{$hint} }) if $good && $valid_int{$hint};
	return pick(
		'NaN', 'Infinity', '-Infinity', '0', '-0', '1e308', '1.7976931348623157e308',
		'4.9e-324', '1e-320', '0.001', '0.05', '1', '50', '1000000', '1000000.0001', '-1',
		'1e300', sprintf('%.3f', rand 1000));
}

sub rinterval
{
	# ('infinity' is an interval from PostgreSQL 17 on)
	return pick('0', '1 second', '1 hour', '3 days', '24 days 20:31:23.647', '25 days', '1 microsecond',
		'1000000 years', 'infinity')
	  if $good;
	return pick(
		'0', '-1 second', '1 microsecond', '1 second', '3 days', '-3 days', '178000000 years',
		'-178000000 years', '2147483647 days', '2147483647 months', '@ 1 mon -30 days',
		'1 day -24 hours', '24 days 20:31:23.647', '25 days', '100 years', 'P1Y2M3DT4H5M6S',
		'infinity', '-infinity', int(rand 100000) . ' seconds', int(rand 1000) . ' ms', '-0',
		'1 fortnight');
}

sub rtimestamptz
{
	my @recent = (
		'now', strftime('%Y-%m-%d %H:%M:%S+00', gmtime(time - rand 60)),
		strftime('%Y-%m-%d %H:%M:%S.123456+00', gmtime(time - rand 10)));
	return pick(@recent) if $good;
	return pick(
		@recent, 'epoch', 'infinity', '-infinity', '294276-12-31 23:59:59+00',
		'4713-01-01 00:00:00+00 BC', '2000-01-01', '1970-01-01 00:00:00+14', '3000-01-01',
		'2000-02-30', 'yesterday', 'allballs', '');
}

sub lit
{
	my ($s) = @_;
	$s =~ s/'/''/g;
	return "'$s'";
}

my %unknown_types;

# A string for an argument or column, by its name.
sub hinted
{
	my ($hint) = @_;
	$hint //= '';
	my $s;
	if ($good)
	{
		$s =
		  $valid{$hint}
		  ? pick(@{ $valid{$hint} })
		  : join('', map { pick('a' .. 'z', '0' .. '9', '_', '-', '.', "\x{e9}", ' ') } 0 .. int rand 12);
	}
	elsif ($valid{$hint} && rand() < 0.75)
	{
		$s = pick(@{ $valid{$hint} }, @{ $invalid{$hint} });
	}
	else
	{
		$s = rstr();
	}
	# Never the healthy target or its topic.
	$s .= '_' if $s eq $healthy || $s eq $healthy_topic;
	return $s;
}

# An SQL expression of type $type (from format_type), for an argument or
# column named $hint; $attrs: the columns of a composite type.
sub value
{
	my ($type, $typtype, $hint, $attrs) = @_;
	$hint //= '';
	# NULL, often for the columns of a row (it leaves most of them unset)
	return "NULL::$type" if rand() < ($good ? ($hint =~ /^(key|secret|previous_secret|channel|id|state.*|pending_.*|max_rate|created_at)$/ ? 0.5 : $hint =~ /^(ca_file|client_.*)$/ ? 0.9 : 0.02) : 0.07);
	if ($typtype eq 'c' && $attrs)
	{
		return 'ROW(' . join(', ', map { value($_->{type}, $_->{typtype}, $_->{name}) } @$attrs) . ")::$type";
	}
	my $v;
	if ($type =~ /^(text|name|character varying|character|"char"|citext)$/) { $v = hinted($hint) }
	elsif ($type =~ /^jsonb?$/) { $v = $hint eq 'headers' ? rheaders() : rjson() }
	elsif ($type =~ /^(integer|smallint)$/) { $v = rint($hint) }
	elsif ($type eq 'bigint') { $v = rbigint($hint) }
	elsif ($type =~ /^(double precision|real|numeric)$/) { $v = rfloat($hint) }
	elsif ($type eq 'interval') { $v = rinterval() }
	elsif ($type =~ /^timestamp/) { $v = rtimestamptz() }
	elsif ($type eq 'boolean') { $v = pick('true', 'false', 't', 'f', 'yes', 'off') }
	elsif ($type eq 'uuid')
	{
		$v = pick('00000000-0000-0000-0000-000000000000',
			join('-', map { join '', map { sprintf '%x', int rand 16 } 1 .. $_ } 8, 4, 4, 4, 12));
	}
	elsif ($type eq 'regrole')
	{
		$v = pick('fuzz_app', $owner, 'pg_monitor', $good ? () : ('public', 'nobody_here', rstr()));
	}
	else
	{
		$unknown_types{$type}++;
		return "NULL::$type";
	}
	return lit($v) . "::$type";
}

# A call of $f with random arguments: positional, or the optional ones by
# name; optional arguments often left out.  Three in five calls draw valid
# arguments, half of them with one fuzzed.
sub call_of
{
	my ($f, $all_valid) = @_;
	my @args = @{ $f->{args} };
	my $required = @args - $f->{ndefaults};
	local $good = $all_valid || rand() < 0.6;
	my $fuzzed = $good && !$all_valid && rand() < 0.5 ? int rand @args : -1;
	my @parts;
	my $named = $f->{ndefaults} > 0 && !(grep { !defined $_->{name} || $_->{name} eq '' } @args) && rand() < 0.5;
	my $n = $named ? @args : $required + int rand($f->{ndefaults} + 1);
	my $by_name = 0;    # once one is passed by name, the rest must be
	for my $i (0 .. $n - 1)
	{
		my $a = $args[$i];
		next if $named && $i >= $required && $i != $fuzzed && rand() < 0.6;
		local $good = $good && $i != $fuzzed;
		my $v = value($a->{type}, $a->{typtype}, $a->{name}, $a->{attrs});
		$by_name ||= $named && ($i >= $required || rand() < 0.3);
		push @parts, $by_name ? qq{"$a->{name}" => $v} : $v;
	}
	my $call = "$f->{fn}(" . join(', ', @parts) . ')';
	return $f->{kind} eq 'p' ? "CALL $call" : "PERFORM ($call)::text";
}

# --- the calls ---
# outbox_emit() gets a third of the calls, the other functions share the
# rest, those that make targets and subscriptions more, drop_target less
# (so that the relay has targets to deliver to while the fuzzing goes on).
my ($emit) = grep { $_->{fn} eq 'pg_catalog.outbox_emit' } @fuzzed;
my %weight = (
	'outbox.create_http_target' => 3,
	'outbox.create_notify_target' => 2,
	'outbox.subscribe' => 3,
	'outbox.drop_target' => 0.5,);
my @others;
for my $f (grep { $_ != $emit } @fuzzed)
{
	push @others, ($f) x (2 * ($weight{ $f->{fn} } // 1));
}
my @calls;    # n => { stmt, who, rollback, fn }

sub new_call
{
	my ($who, $stmt, $fn, $rollback) = @_;
	push @calls, { stmt => $stmt, who => $who, fn => $fn, rollback => $rollback };
	return $#calls + 1;    # n, from 1
}

# One plpgsql sub-block per call, recording its outcome.
sub block_of
{
	my ($n) = @_;
	my $c = $calls[ $n - 1 ];
	my $stmt = $c->{rollback}
	  ? "BEGIN\n$c->{stmt};\nRAISE SQLSTATE 'FZ001';\nEXCEPTION WHEN SQLSTATE 'FZ001' THEN NULL;\nEND"
	  : $c->{stmt};
	return "BEGIN\n$stmt;\nINSERT INTO fuzz.results VALUES ($n, '$c->{who}', '00000', NULL);\n"
	  . "EXCEPTION WHEN others OR query_canceled THEN\n"
	  . "INSERT INTO fuzz.results VALUES ($n, '$c->{who}', SQLSTATE, left(SQLERRM, 300));\nEND;\n";
}

# Scripts: DO blocks of one to four calls, each its own transaction; the
# line range of each block is kept, to match an error psql reports (one
# that escaped the sub-blocks, at commit) with its calls.  Scripts: owner
# and app (run at once), then owner2 (the second phase).
my (%script, %blocks, %line);
my @app_copies;

sub add_block
{
	my ($script, @ns) = @_;
	my $body = join '', map { block_of($_) } @ns;
	my $tag = 'fz';
	$tag .= 'z' while index($body, "\$$tag\$") >= 0;
	my $do = "DO \$$tag\$\nBEGIN\n$body\nEND\n\$$tag\$;\n";
	# (line 1 of each script is \set VERBOSITY)
	my $start = ($line{$script} //= 2);
	$line{$script} += ($do =~ tr/\n//);
	push @{ $blocks{$script} }, { from => $start, to => $line{$script} - 1, ns => \@ns };
	$script{$script} .= $do;
}

while (grep({ $_->{who} eq 'owner' } @calls) < $owner_calls)
{
	my @ns;
	my $k = rand() < 0.6 ? 1 : 2 + int rand 3;
	for (1 .. $k)
	{
		my $f = rand() < 0.33 ? $emit : pick(@others);
		my $n = new_call('owner', call_of($f), $f->{sig}, rand() < 0.1);
		push @ns, $n;
		push @app_copies, $n if rand() < 0.2;
	}
	add_block('owner', @ns);
}
# Last, targets made of valid settings only, that stay: the relay must
# take every one of them, and disable none before its disable_after
# (checked after this phase); then messages for them.
my %fn = map { $_->{fn} => $_ } @fuzzed;
my @final = map { "fz_final_$_" } 1 .. 30;
for my $i (1 .. 30)
{
	my $create = $fn{ $i % 3 ? 'outbox.create_http_target' : 'outbox.create_notify_target' };
	my $subscribe = $fn{'outbox.subscribe'};
	next unless $create && $subscribe;
	local $valid{name} = ["fz_final_$i"];
	local $valid{target} = ["fz_final_$i"];
	local $valid{topic} = ['fz.*'];
	# (often a receiver that answers 404, for disable_after)
	local $valid{url} = [ @{ $valid{url} }, ("$furl/nf") x 10 ];
	my @ns = map { new_call('owner', call_of($_, 1), $_->{sig}, 0) } $create, $subscribe;
	# (not 'infinity' here, which the second phase may set)
	push @ns,
	  new_call('owner',
		"PERFORM (outbox.alter_target('fz_final_$i', disable_after => "
		  . lit(pick('0', '1 second', '3 days', '1000000 years')) . "))::text",
		'outbox.alter_target', 0)
	  if $i % 3 && $fn{'outbox.alter_target'};
	add_block('owner', @ns);
}
add_block('owner',
	map { new_call('owner', "PERFORM (outbox_emit('fz.t1', '{\"final\": $_}', 'k$_'))::text", $emit->{sig}, 0) }
	  1 .. 20);
while (@app_copies)
{
	my @ns;
	for (1 .. (rand() < 0.6 ? 1 : 2 + int rand 3))
	{
		last unless @app_copies;
		my $c = $calls[ shift(@app_copies) - 1 ];
		push @ns, new_call('app', $c->{stmt}, $c->{fn}, $c->{rollback});
	}
	add_block('app', @ns);
}
# The second phase: the targets of the end of the first reconfigured,
# paused, resumed, replayed (valid arguments) while messages flow to them.
{
	# (those that take a target's name first, not dropping it; alter_target
	# half of the time)
	my @admin = grep {
		@{ $_->{args} } && ($_->{args}[0]{name} // '') =~ /^(name|target)$/
		  && $_->{args}[0]{type} eq 'text'
		  && $_->{fn} !~ /^outbox\.(drop_target|create_)/
	} @fuzzed;
	my ($alter) = grep { $_->{fn} eq 'outbox.alter_target' } @admin;
	push @admin, ($alter) x @admin if $alter;
	local $valid{name} = \@final;
	local $valid{target} = \@final;
	local $valid{topic} = [ 'fz.t1', 'fz.t2' ];
	for (1 .. 300)
	{
		my $f = rand() < 0.3 || !@admin ? $emit : pick(@admin);
		my $stmt = call_of($f, 1);
		# (and, as often, alter_target of disable_after alone: the other
		# options of an HTTP target refuse a NOTIFY one)
		$stmt =
		    "PERFORM (outbox.alter_target("
		  . lit(pick(@final))
		  . ', disable_after => '
		  . lit(pick('0', '1 second', '3 days', '1000000 years', 'infinity'))
		  . '))::text'
		  if $alter && $f == $alter && rand() < 0.5;
		add_block('owner2', new_call('owner', $stmt, $f->{sig}, 0));
	}
}
my $total = @calls;
note "generated $total calls ("
  . scalar(grep { $_->{who} eq 'app' } @calls)
  . ' as the unprivileged role), scripts of '
  . join(', ', map { sprintf('%.1f MB', length($script{$_}) / 1e6) } sort keys %script);
note 'argument types without a generator (passed NULL): ' . join(', ', sort keys %unknown_types)
  if %unknown_types;

# Run scripts, each in its own session, all at once; the outcomes go to
# fuzz.results, or for calls whose block failed as a whole (at COMMIT, or
# a lost session) to @escaped.
my (%file, %err, @escaped);

sub run_scripts
{
	my @scripts = @_;
	my $dir = $PostgreSQL::Test::Utils::tmp_check;
	my @h;
	local $ENV{PGOPTIONS} = '-c statement_timeout=30s -c lock_timeout=5s -c client_min_messages=warning';
	local $ENV{PGCLIENTENCODING} = 'UTF8';
	for my $sc (@scripts)
	{
		$file{$sc} = "$dir/fuzz_$sc.sql";
		open(my $fh, '>:raw', $file{$sc}) or die "$file{$sc}: $!";
		print $fh "\\set VERBOSITY verbose\n" . encode_utf8($script{$sc});
		close $fh;
		my $conn = $node->connstr('postgres') . ($sc eq 'app' ? ' user=fuzz_app' : '');
		push @h,
		  IPC::Run::start(
			[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=0', '-d', $conn, '-f', $file{$sc} ],
			'<', \undef, '>', \my $out, '2>', \$err{$sc},
			IPC::Run::timeout(10 * $PostgreSQL::Test::Utils::timeout_default));
	}
	$_->finish for @h;
	for my $sc (@scripts)
	{
		for my $l (split /\n/, $err{$sc} // '')
		{
			next unless $l =~ /^psql:.*?:(\d+): (ERROR|FATAL|PANIC):  (?:([0-9A-Z]{5}): )?(.*)$/;
			my ($ln, $level, $st, $msg) = ($1, $2, $3 // '?????', $4);
			push @escaped, "$sc line $ln: $level $st: $msg";
			my ($b) = grep { $_->{from} <= $ln && $ln <= $_->{to} } @{ $blocks{$sc} };
			push @{ $b->{escaped} }, [ $st, "$level (escaped the call's block): $msg" ] if $b;
		}
	}
}

my $t0 = time;
run_scripts('owner', 'app');
note sprintf('the calls ran in %.1f s', time - $t0);

# A call, shown with its non-printable characters escaped and shortened.
sub shown
{
	my ($s) = @_;
	$s = substr($s, 0, 300) . ' [... ' . length($s) . ' characters ...] ' . substr($s, -150)
	  if length($s) > 600;
	$s =~ s/([^\x20-\x7e])/ord $1 < 256 ? sprintf('\\x%02x', ord $1) : sprintf('\\x{%x}', ord $1)/ge;
	return $s;
}

note 'after the first phase: '
  . $node->safe_psql('postgres',
	q{SELECT (SELECT count(*) FROM outbox.targets) || ' targets, '
		|| (SELECT count(*) FROM outbox.subscriptions) || ' subscriptions, '
		|| (SELECT count(*) FROM outbox.messages) || ' messages stored, '
		|| (SELECT count(*) FROM outbox.dead_letters) || ' dead letters'})
  . ', ' . sink_stats($fsink)->{requests} . ' requests to the fuzzed targets\' sink';

# --- the relay keeps delivering ---
is($node->safe_psql('postgres', $healthy_row_sql), $healthy_row,
	'the fuzzer left the healthy target as it was');

# 20 new messages reach the healthy target; $what names the moment.
sub healthy_check
{
	my ($what) = @_;
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('$healthy_topic', jsonb_build_object('marker', '$what', 'i', g), 'k' || g % 5))"
		  . ' FROM generate_series(1, 20) g');
	my $t1 = time;
	is(healthy_delivered($what, 20), 20,
		"$what, the healthy target receives 20 new messages")
	  or diag "seed $seed; the relay: "
	  . $node->safe_psql('postgres', 'SELECT row_to_json(w) FROM outbox.worker_status() w')
	  . "\nthe healthy target: "
	  . $node->safe_psql('postgres', "SELECT row_to_json(l) FROM outbox.lag l WHERE target = '$healthy'")
	  . "\nthe targets:\n"
	  . $node->safe_psql('postgres',
		q{SELECT t.id, left(t.name, 40), t.kind, t.state, left(t.url, 80), left(t.channel, 40), t.lanes,
				 t.pending_lanes, t.ordering, t.pending_ordering, t.batch_size, t.timeout_ms, t.max_rate,
				 t.disable_after
			FROM outbox.targets t ORDER BY t.id LIMIT 50});
	note sprintf('... in %.1f s', time - $t1);
}

# The relay reloads every target now (and skips, with a WARNING, those it
# cannot use), before the messages of the check.
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT outbox.config_changed()');
healthy_check('after the fuzzing');

# The relay skips (with a WARNING) only a target it cannot use, one the
# target functions would refuse: none of those made through them at the
# end of the fuzzing.
my %skips;
my $log_after = substr(slurp_file($node->logfile), $log_offset);
$skips{$1} = $2 while $log_after =~ /outbox relay skips target "(.*?)": ([^\n]*)/g;
my @wrongly_skipped;
for my $name (sort grep { /^fz_final_\d+$/ } keys %skips)
{
	push @wrongly_skipped,
	  "target \"$name\" ($skips{$name}): "
	  . shown(
		$node->safe_psql(
			'postgres',
			"SELECT row_to_json(t) FROM (SELECT url, headers, secret, channel, batch_size, lanes,"
			  . " ordering, timeout_ms FROM outbox.targets WHERE name = '$name') t"));
}
note 'the relay skips ' . scalar(keys %skips) . ' targets after the fuzzing';
is_deeply(\@wrongly_skipped, [],
	'the relay skips none of the targets the target functions made of valid settings');

# A target disabled for failing receiver-wide failed for its disable_after
# first (the relay's clock for both times).
my @early = split /\n/, $node->safe_psql(
	'postgres', q{
SELECT name || ': disabled after failing for ' || (state_changed_at - since)
	   || ', disable_after ' || coalesce(disable_after::text, 'none (never)')
  FROM (SELECT *, substring(state_reason FROM '^failing since (.*?): ')::timestamptz AS since
		  FROM outbox.targets WHERE name LIKE 'fz\_final\_%' AND state = 'disabled') t
 WHERE since IS NOT NULL
   AND (disable_after IS NULL OR state_changed_at - since < disable_after - interval '0.1 s')});
is_deeply(\@early, [], 'the relay disables no target before its disable_after');

# --- the second phase ---
$t0 = time;
run_scripts('owner2');
note sprintf('the second phase ran in %.1f s', time - $t0);
healthy_check('after the second phase');

# --- outcomes ---
my %state;    # n => [state, message]
for (split /\n/,
	$node->safe_psql('postgres', q{SELECT n, state, replace(replace(coalesce(message, ''), E'\n', ' '), E'\r', ' ') FROM fuzz.results}))
{
	my ($n, $st, $msg) = split /\|/, $_, 3;
	$state{$n} = [ $st, $msg ];
}
# A block that failed as a whole: each of its calls without an outcome
# gets the error.
for my $b (map { @$_ } values %blocks)
{
	next unless $b->{escaped};
	$state{$_} //= $b->{escaped}[0] for @{ $b->{ns} };
}
diag "errors outside the calls' blocks:\n" . join("\n", @escaped) if @escaped;

my @lost = grep { !$state{$_} } 1 .. $total;
cmp_ok($total - @lost, '>=', 5000, 'at least 5000 calls were made');
is(scalar @lost, 0, 'every call has an outcome')
  or diag "no outcome for "
  . scalar(@lost)
  . " calls, the first: $lost[0] ($calls[$lost[0]-1]{fn})\n"
  . join("\n", map { "psql stderr ($_): " . substr($err{$_} // '', 0, 2000) } sort keys %err);

my (%by_state, %by_class, %fn_states, %example);
for my $n (sort { $a <=> $b } keys %state)
{
	my $st = $state{$n}[0];
	$by_state{$st}++;
	$example{$st} //= $state{$n}[1];
	$by_class{ substr($st, 0, 2) }++;
	$fn_states{ $calls[ $n - 1 ]{fn} }{$st}++;
}
note 'outcomes by SQLSTATE class: ' . join(', ', map { "$_: $by_class{$_}" } sort keys %by_class);
note 'outcomes by SQLSTATE: ' . join(', ', map { "$_: $by_state{$_}" } sort keys %by_state);
note "  $_, for example: " . shown(substr($example{$_}, 0, 160)) for grep { $_ ne '00000' } sort keys %example;
for my $fn (sort keys %fn_states)
{
	note "  $fn: " . join(', ', map { "$_ $fn_states{$fn}{$_}" } sort keys %{ $fn_states{$fn} });
}

my @internal = sort { $a <=> $b } grep { $state{$_}[0] =~ /^XX/ } keys %state;
my $repro = "$PostgreSQL::Test::Utils::log_path/035_fuzz_internal_errors.sql";
if (@internal)
{
	open(my $fh, '>:encoding(UTF-8)', $repro) or die "$repro: $!";
	for my $n (@internal)
	{
		my $c = $calls[ $n - 1 ];
		(my $q = $c->{stmt}) =~ s/^PERFORM /SELECT /;
		print $fh "-- call $n as $c->{who}"
		  . ($c->{rollback} ? ', rolled back' : '')
		  . ": $state{$n}[0] $state{$n}[1]\n$q;\n\n";
	}
	close $fh;
}
is(scalar @internal, 0, 'no call fails with an internal error (SQLSTATE XX000 or class XX)')
  or diag "seed $seed; the calls (in full in $repro):\n"
  . join("\n",
	map { "call $_ ($calls[$_-1]{who}): $state{$_}[0] $state{$_}[1]\n  " . shown($calls[ $_ - 1 ]{stmt}) }
	  @internal[ 0 .. ($#internal < 19 ? $#internal : 19) ]);

# --- the server ---
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'),
	$started, 'the postmaster did not restart');
relay_no_crash($node);
my $log = slurp_file($node->logfile);
my @restarts = grep { /terminated by signal|all server processes terminated; reinitializing|database system was interrupted/ }
  split /\n/, $log;
is_deeply(\@restarts, [], 'no server process died, no crash restart');
my @log_internal = grep { /^.*(ERROR|FATAL|PANIC):  XX\d\d\d: / } split /\n/, $log;
is_deeply(\@log_internal, [], 'the server log has no internal error (the relay\'s included)');
# The relay must not fail on what the fuzzer stored or did (an error while
# preparing one message or loading one target is that message's or that
# target's failure, not the worker's).
my @exits = $log =~ /background worker "outbox relay" \(PID (\d+)\) exited with exit code/g;
my %exited = map { $_ => 1 } @exits;
# Their errors (once each), with the first line of DETAIL and CONTEXT.
my (@relay_errors, %seen_error, $in);
for my $l (split /\n/, $log)
{
	if ($l =~ /\[(\d+)\] ((?:ERROR|FATAL|PANIC):  .*)/)
	{
		$in = $exited{$1} && !$seen_error{$2}++ ? $1 : undef;
		push @relay_errors, $2 if $in;
	}
	elsif ($in && $l =~ /\[$in\] (DETAIL|CONTEXT):  (.*)/)
	{
		$relay_errors[-1] .= "\n  $1: " . substr($2, 0, 300);
	}
}
is(scalar @exits, 0, 'the relay worker never exited')
  or diag "seed $seed; the relay exited " . scalar(@exits) . " times, with:\n" . join("\n", @relay_errors);

stop_sink($_) for $hsink, $fsink;
$node->stop;
# The scripts (tens of MB) are kept when something failed.
unlink values %file if Test::More->builder->is_passing;
done_testing();
