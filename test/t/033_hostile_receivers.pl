# Receivers that misbehave cost nothing but their own lane.  A small raw
# socket server (Python, written below) plays one hostile receiver per
# path, each behind a target of its own (lanes 1, max_attempts 0,
# timeout_ms 1500):
#  - endless: a 503 whose chunked body never ends;
#  - drip: the status line, then one byte a second;
#  - hugeheader: a header line of 8 MB; manyheaders: 5000 header lines
#    (5 MB); midheaders: 150 header lines (150 kB, past the relay's 64 kB
#    cap on response headers, short of libcurl's own 300 kB) then 200;
#  - reset: reads the request line, then resets the connection (SO_LINGER
#    0) while the relay is still sending a 512 kB body;
#  - tls (https): accepts, never answers the TLS handshake;
#  - r429: 429 with Retry-After: 999999999;
#  - garbage500: 500 with a 10 MB body of binary garbage (control bytes,
#    escapes, invalid UTF-8, NULs);
#  - big200: 200 with a 5 MB body.
# Checked: each failure shows in outbox.lag within a few timeout_ms, and
# from the receiver's side every response is abandoned within timeout_ms
# (plus slack); attempts keep coming (no lane is wedged), the 429 one
# within outbox.retry_max_delay (2 s here) of the last; the relay reads at
# most about 64 kB of a body (the endless body and the 10 MB one are cut
# off by the relay closing the connection); big200 is delivered, once per
# message; the over-long headers are never taken for a delivery;
# last_error in outbox.lag and outbox.progress is at most 256 printable
# ASCII characters whatever was received, and a role without access to the
# targets sees none of it (outbox.metrics() does not carry it); the
# relay's RssAnon stays within 32 MB of its size before; a healthy target
# on the test sink keeps at least half its rate, measured in the same
# run before the hostile targets were resumed and after they were paused
# again; the relay never
# crashed or restarted.
use strict;
use warnings;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $timeout_ms = 1500;
my $timeout_s = $timeout_ms / 1000;
my $retry_max_s = 2;
# Slack on the time bounds below: they tell a response abandoned at
# timeout_ms (or a Retry-After capped at retry_max_delay) from one never
# abandoned (or waited for 999999999 s), and leave room for a loaded
# 2-core machine.
my $slack_s = 10;
my $json = json_codec()->utf8;

# --- the hostile receiver ---
my $dir = $PostgreSQL::Test::Utils::log_path;
my $script = "$dir/hostile_receiver.py";
my $events_file = "$dir/hostile_receiver.jsonl";
my $port_file = "$dir/hostile_receiver.port";
unlink $events_file, $port_file;
unlink $script;
PostgreSQL::Test::Utils::append_to_file($script, <<'EOPY');
import json, os, random, select, socket, struct, sys, threading, time

# Misbehaving HTTP receivers, one per path, on one port (argv: port file,
# event log).  Every request and its fate is logged as one JSON line:
#   {"ev": "conn", "cid", "t"}                       a connection accepted
#   {"ev": "req", "cid", "mode", "t"}                a request (or a TLS hello) read
#   {"ev": "end", "cid", "mode", "t0", "t", "sent", "total", "how"}
# how: "complete" (the whole answer was written), "client_closed" (the
# client closed or reset the connection first), "reset" (we reset it).
port_file, log_path = sys.argv[1], sys.argv[2]
log_lock = threading.Lock()
log_fh = open(log_path, 'a', buffering=1)

def log(**kw):
    with log_lock:
        log_fh.write(json.dumps(kw) + '\n')

MB = 1024 * 1024
rng = random.Random(42)
# Binary garbage for the 500: control bytes, escapes, invalid UTF-8 and
# high bytes, no NUL in its first 8 kB (so it reaches an error text that
# stops at NUL), NULs and everything else after that.
head = bytearray()
pieces = [b'\x1b[31mALERT\x1b[0m', b'\r\n\t\x07\x08\x0b\x0c', b'\xc3\x28', b'\xed\xa0\x80',
          b'\xff\xfe\xfd', b'\xf0\x28\x8c\x28', b'\x7f\x01\x02\x1f', b"'; DROP TABLE x; --",
          b'\xe2\x80\xae', b'%s%n%x', b'<script>']
while len(head) < 8192:
    head += rng.choice(pieces)
    head += bytes(rng.randrange(1, 256) for _ in range(8))
GARBAGE = bytes(head[:8192]) + rng.randbytes(10 * MB - 8192)
BIG = b'z' * (5 * MB)
HUGE_HEADER = b'HTTP/1.1 200 OK\r\nX-Huge: ' + b'h' * (8 * MB) + b'\r\nContent-Length: 0\r\n\r\n'
MANY_HEADERS = (b'HTTP/1.1 200 OK\r\n'
                + b''.join(b'X-Many-%05d: %s\r\n' % (i, b'm' * 1000) for i in range(5000))
                + b'Content-Length: 0\r\n\r\n')
MID_HEADERS = (b'HTTP/1.1 200 OK\r\n'
               + b''.join(b'X-Mid-%03d: %s\r\n' % (i, b'n' * 1000) for i in range(150))
               + b'Content-Length: 0\r\n\r\n')
CHUNK = b'%x\r\n' % MB + b'e' * MB + b'\r\n'

def send_all(c, data, st):
    """Write data; False when the client went away first."""
    view = memoryview(data)
    while len(view):
        try:
            n = c.send(view[:256 * 1024])
        except OSError:
            return False
        st['sent'] += n
        view = view[n:]
    return True

def wait_closed(c, max_s=None):
    """Wait until the client closes (True) or max_s passes (False)."""
    deadline = None if max_s is None else time.time() + max_s
    while True:
        left = None if deadline is None else max(0, deadline - time.time())
        r, _, _ = select.select([c], [], [], left)
        if not r:
            return False
        try:
            if not c.recv(65536):
                return True
        except OSError:
            return True

def read_head(c, buf):
    """Read up to the end of a request head; returns (head, rest) or None."""
    while b'\r\n\r\n' not in buf:
        try:
            d = c.recv(65536)
        except OSError:
            return None
        if not d:
            return None
        buf += d
        if len(buf) > MB:
            return None
    i = buf.index(b'\r\n\r\n') + 4
    return buf[:i], buf[i:]

def handle(c, cid):
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    try:
        first = c.recv(1, socket.MSG_PEEK)
    except OSError:
        first = b''
    if not first:
        c.close()
        return
    t0 = time.time()
    if first[0] == 0x16:
        # A TLS ClientHello: never answer.
        log(ev='req', cid=cid, mode='tls', t=t0)
        wait_closed(c)
        log(ev='end', cid=cid, mode='tls', t0=t0, t=time.time(), sent=0, total=0, how='client_closed')
        c.close()
        return
    buf = b''
    while True:
        # The request line first: /reset answers it with a reset, while the
        # client is still sending its body.
        while b'\r\n' not in buf:
            try:
                d = c.recv(65536)
            except OSError:
                d = b''
            if not d:
                c.close()
                return
            buf += d
        line = buf[:buf.index(b'\r\n')].decode('latin-1')
        parts = line.split(' ')
        path = parts[1] if len(parts) > 1 else '/'
        mode = path.split('?')[0].strip('/')
        t0 = time.time()
        log(ev='req', cid=cid, mode=mode, t=t0)
        st = {'sent': 0}

        def end(how, total):
            log(ev='end', cid=cid, mode=mode, t0=t0, t=time.time(), sent=st['sent'], total=total, how=how)

        if mode == 'reset':
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
            c.close()
            end('reset', 0)
            return
        got = read_head(c, buf)
        if got is None:
            c.close()
            return
        head, buf = got
        clen = 0
        for h in head.split(b'\r\n'):
            if h.lower().startswith(b'content-length:'):
                clen = int(h.split(b':', 1)[1])
        while len(buf) < clen:
            try:
                d = c.recv(65536)
            except OSError:
                d = b''
            if not d:
                c.close()
                return
            buf += d
        buf = buf[clen:]
        t0 = time.time()

        if mode == 'endless':
            # A 503 whose chunked body never ends.
            ok = send_all(c, b'HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/octet-stream\r\n'
                          b'Transfer-Encoding: chunked\r\n\r\n', st)
            while ok:
                ok = send_all(c, CHUNK, st)
            end('client_closed', -1)
            c.close()
            return
        if mode == 'drip':
            # The status line, then one byte a second.
            ok = send_all(c, b'HTTP/1.1 200 OK\r\nX-Drip: ', st)
            while ok:
                if wait_closed(c, 1.0):
                    break
                ok = send_all(c, b'd', st)
            end('client_closed', -1)
            c.close()
            return
        if mode in ('hugeheader', 'manyheaders', 'midheaders', 'garbage500', 'big200', 'r429'):
            if mode == 'midheaders':
                data = MID_HEADERS
            elif mode == 'hugeheader':
                data = HUGE_HEADER
            elif mode == 'manyheaders':
                data = MANY_HEADERS
            elif mode == 'garbage500':
                data = (b'HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/octet-stream\r\n'
                        b'Content-Length: %d\r\n\r\n' % len(GARBAGE)) + GARBAGE
            elif mode == 'big200':
                data = b'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n' % len(BIG) + BIG
            else:
                data = b'HTTP/1.1 429 Too Many Requests\r\nRetry-After: 999999999\r\nContent-Length: 0\r\n\r\n'
            if not send_all(c, data, st):
                end('client_closed', len(data))
                c.close()
                return
            end('complete', len(data))
            continue    # kept alive: the next request
        send_all(c, b'HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n', st)
        end('complete', 0)

def main():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('127.0.0.1', 0))
    s.listen(128)
    with open(port_file + '.tmp', 'w') as f:
        f.write('%d\n' % s.getsockname()[1])
    os.rename(port_file + '.tmp', port_file)
    cid = 0
    while True:
        c, _ = s.accept()
        cid += 1
        log(ev='conn', cid=cid, t=time.time())
        threading.Thread(target=handle, args=(c, cid), daemon=True).start()

main()
EOPY
my $hostile_h = IPC::Run::start([ 'python3', $script, $port_file, $events_file ],
	'<', \undef, '>>', "$dir/hostile_receiver.log", '2>>', "$dir/hostile_receiver.log");
# Stopped however the test ends.
END { $hostile_h->kill_kill if $hostile_h && $hostile_h->pumpable }
ok(wait_until(sub { -s $port_file }, undef, 0.05), 'the hostile receiver listens');
my $hport = slurp_file($port_file);
chomp $hport;
my $hurl = "http://127.0.0.1:$hport";

# The receiver's events, read incrementally.
my @events;
my $events_off = 0;
sub events
{
	open(my $fh, '<:raw', $events_file) or return \@events;
	seek($fh, $events_off, 0);
	while (my $line = <$fh>)
	{
		last unless $line =~ /\n\z/;
		$events_off += length($line);
		push @events, $json->decode($line);
	}
	close $fh;
	return \@events;
}
sub requests_of
{
	my ($mode) = @_;
	return grep { $_->{ev} eq 'req' && $_->{mode} eq $mode } @{ events() };
}
sub ends_of
{
	my ($mode) = @_;
	return grep { $_->{ev} eq 'end' && $_->{mode} eq $mode } @{ events() };
}

my $sink = start_sink('hostile_healthy');
sink_control($sink, { keep_body => JSON::PP::false });
my $node = relay_node(
	'hostile', conf => qq{
outbox.retry_max_delay = '${retry_max_s}s'
});

# name => [ url, delivered in the end? ]
my %hostile = (
	endless => [ "$hurl/endless", 0 ],
	drip => [ "$hurl/drip", 0 ],
	hugeheader => [ "$hurl/hugeheader", 0 ],
	manyheaders => [ "$hurl/manyheaders", 0 ],
	midheaders => [ "$hurl/midheaders", 0 ],
	reset => [ "$hurl/reset", 0 ],
	tls => [ "https://127.0.0.1:$hport/tls", 0 ],
	r429 => [ "$hurl/r429", 0 ],
	garbage500 => [ "$hurl/garbage500", 0 ],
	big200 => [ "$hurl/big200", 1 ],
);
my @failing = sort grep { !$hostile{$_}[1] } keys %hostile;
my $nmsg = 3;    # messages per hostile target

my $setup = qq{SELECT outbox.create_http_target('healthy', '$sink->{url}/healthy');
SELECT outbox.subscribe('healthy', 'healthy');
};
for my $m (sort keys %hostile)
{
	# (big200 is meant to be delivered: it gets time to be, however loaded
	# the machine; a retry would send a message twice.)
	my $tmo = $hostile{$m}[1] ? 60_000 : $timeout_ms;
	$setup .= qq{SELECT outbox.create_http_target('h_$m', '$hostile{$m}[0]', lanes => 1,
	max_attempts => 0, timeout_ms => $tmo);
SELECT outbox.subscribe('h_$m', 'h_$m');
};
}
$node->safe_psql('postgres', $setup);
# Held back until the healthy target's baseline is measured.
$node->safe_psql('postgres', join('', map { "SELECT outbox.pause_target('h_$_');\n" } sort keys %hostile));
for my $m (sort keys %hostile)
{
	# reset's bodies are large, so that the reset comes while the relay
	# is still sending.
	my $payload = $m eq 'reset' ? q{to_jsonb(repeat('r', 512 * 1024))} : q{jsonb_build_object('n', g)};
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('h_$m', $payload, 'k' || g)) FROM generate_series(1, $nmsg) g");
}

sub rss_anon
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or return 0;
	while (<$fh>) { return $1 if /^RssAnon:\s+(\d+) kB/ }
	return 0;
}

$node->safe_psql('postgres', q{SELECT outbox_emit('healthy', '{"warm": 1}')});
ok($node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'healthy'}),
	'the healthy target delivers');
my $pid = relay_worker_pid($node);
my $peak = 0;
sub sample_rss
{
	my $r = rss_anon($pid);
	$peak = $r if $r > $peak;
	return $r;
}

# The healthy target's rate: messages per second to drain a burst of $n,
# from before the emitting transaction to the lag view showing none left.
my $burst = 2000;
my $healthy_sent = 1;
sub healthy_rate
{
	my $t0 = time;
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('healthy', jsonb_build_object('n', g), 'k' || (g % 64)))"
		  . " FROM generate_series(1, $burst) g");
	$healthy_sent += $burst;
	my $done = wait_until(
		sub {
			sample_rss();
			return $node->safe_psql('postgres',
				q{SELECT pending = 0 FROM outbox.lag WHERE target = 'healthy'}) eq 't';
		}, undef, 0.05);
	die 'the healthy target did not drain its burst' unless $done;
	return $burst / (time - $t0);
}

sub median
{
	my @v = sort { $a <=> $b } @_;
	return @v % 2 ? $v[ $#v / 2 ] : ($v[ @v / 2 - 1 ] + $v[ @v / 2 ]) / 2;
}

my @base = map { healthy_rate() } 1 .. 3;
my $rss_before = sample_rss();
$peak = $rss_before;
note sprintf('baseline: healthy rate %s msg/s, relay RssAnon %d kB',
	join(', ', map { sprintf '%.0f', $_ } @base), $rss_before);

# --- the hostile receivers go live ---
my $t_resume = time;
$node->safe_psql('postgres', join('', map { "SELECT outbox.resume_target('h_$_');\n" } sort keys %hostile));

# Each failure shows in outbox.lag.
my %seen_at;
wait_until(
	sub {
		sample_rss();
		my $rows = $node->safe_psql('postgres',
			q{SELECT target, (failed_attempts > 0 AND last_error IS NOT NULL), (pending = 0)
			    FROM outbox.lag WHERE target LIKE 'h\_%'});
		for (split /\n/, $rows)
		{
			my ($t, $failed, $drained) = split /\|/;
			$t =~ s/^h_//;
			$seen_at{$t} //= time - $t_resume
			  if ($hostile{$t}[1] ? $drained : $failed) eq 't';
		}
		return keys(%seen_at) == keys(%hostile);
	},
	undef, 0.1);
for my $m (@failing)
{
	ok(defined $seen_at{$m}, "h_$m: its failure shows in outbox.lag"
		  . (defined $seen_at{$m} ? sprintf(' (after %.1f s)', $seen_at{$m}) : ' (never)'));
}
ok(defined $seen_at{big200}, 'h_big200: delivered'
	  . (defined $seen_at{big200} ? sprintf(' (after %.1f s)', $seen_at{big200}) : ' (not in time)'));

# Attempts keep coming: the receiver sees new requests on every failing
# lane in a later window.
my %count_a = map { $_ => scalar(requests_of($_)) } @failing;
my $t_a = time;
# The healthy target's rate, burst after burst, over two retry cycles of
# the hostile targets (at least three bursts).
my $window = 2 * ($timeout_s + $retry_max_s) + 1;
my @hostile_rates;
push @hostile_rates, healthy_rate() while @hostile_rates < 3 || time < $t_a + $window;
for my $m (@failing)
{
	my $n;
	ok(wait_for("h_$m to be tried again", sub { $n = scalar(requests_of($m)); ($n > $count_a{$m}, $n) }),
		sprintf('h_%s: attempts keep coming (%d requests, %d in the last %.1f s)',
			$m, $n, $n - $count_a{$m}, time - $t_a));
}

# Every response that does not end in time is abandoned within timeout_ms:
# nothing is on the wire longer, finished or not.
my $now = time;
my %open;
for my $e (@{ events() })
{
	next unless $e->{ev} eq 'req' || $e->{ev} eq 'end';
	if ($e->{ev} eq 'req') { $open{ $e->{cid} } = $e }
	else { delete $open{ $e->{cid} } }
}
for my $m (qw(endless drip tls hugeheader manyheaders garbage500))
{
	my @ends = ends_of($m);
	my ($longest) = sort { $b <=> $a } map { $_->{t} - $_->{t0} } @ends;
	$longest //= -1;
	my @stuck = grep { $_->{mode} eq $m && $now - $_->{t} > $timeout_s + $slack_s } values %open;
	ok(@ends > 0 && $longest <= $timeout_s + $slack_s && !@stuck,
		sprintf('h_%s: every response abandoned within timeout_ms (%d ended, longest %.2f s, %d on the wire for longer)',
			$m, scalar @ends, $longest, scalar @stuck));
	# ... and typically at timeout_ms, not a multiple of it (the median
	# leaves out the ones a loaded machine delayed)
	my $typical = @ends ? median(map { $_->{t} - $_->{t0} } @ends) : -1;
	ok(@ends > 0 && $typical <= $timeout_s + 1,
		sprintf('h_%s: ... typically at timeout_ms (median %.2f s)', $m, $typical));
}

# The relay reads at most about 64 kB of a body, then closes.
{
	my @ends = ends_of('endless');
	my ($most) = sort { $b <=> $a } map { $_->{sent} } @ends;
	$most //= 0;
	cmp_ok($most, '<=', 32 * 1024 * 1024,
		sprintf('h_endless: the relay stops reading a body that never ends (at most %.1f MB written per request)',
			$most / 1024 / 1024));
	my @g = ends_of('garbage500');
	my @cut = grep { $_->{how} eq 'client_closed' } @g;
	my @whole = grep { $_->{how} eq 'complete' } @g;
	ok(@cut > 0 && !@whole,
		sprintf('h_garbage500: the relay closes the connection before the 10 MB body is sent (%d cut off, %d sent whole)',
			scalar @cut, scalar @whole));
	for my $m (qw(hugeheader manyheaders))
	{
		my @h = ends_of($m);
		my @done = grep { $_->{how} eq 'complete' } @h;
		ok(@h > 0 && !@done,
			sprintf('h_%s: the relay closes the connection before the headers end (%d requests, %d read whole)',
				$m, scalar @h, scalar @done));
	}
}

# Retry-After is capped at outbox.retry_max_delay.
{
	my @t = sort { $a <=> $b } map { $_->{t} } requests_of('r429');
	my $gap = 0;
	for my $i (1 .. $#t) { $gap = $t[$i] - $t[ $i - 1 ] if $t[$i] - $t[ $i - 1 ] > $gap }
	$gap = time - $t[-1] if @t && time - $t[-1] > $gap;    # and since the last
	ok(@t >= 2 && $gap <= $retry_max_s + $slack_s,
		sprintf('h_r429: Retry-After: 999999999 waits at most retry_max_delay (%d requests in %.1f s, longest wait %.1f s)',
			scalar @t, @t ? time - $t[0] : 0, $gap));
	my $typical = @t >= 2 ? median(map { $t[$_] - $t[ $_ - 1 ] } 1 .. $#t) : -1;
	ok(@t >= 2 && $typical <= $retry_max_s + 1,
		sprintf('h_r429: ... typically retry_max_delay (median wait %.2f s)', $typical));
}

# The failing targets delivered nothing, retry, and say why; big200 got
# each message once.
my $lag = $node->safe_psql('postgres',
	q{SELECT target, state, pending, delivered, dead_letters, last_status FROM outbox.lag
	   WHERE target LIKE 'h\_%' ORDER BY target});
note "outbox.lag:\n$lag";
my %lag = map { my @f = split /\|/; ($f[0] =~ s/^h_//r) => \@f } split /\n/, $lag;
for my $m (@failing)
{
	my (undef, $state, $pending, $delivered, $dead) = @{ $lag{$m} };
	# (pending is an estimate here: more than 10,000 ids went to the
	# healthy target.)
	ok($delivered == 0 && $dead == 0 && $state =~ /^(retrying|delivering)$/,
		"h_$m: nothing delivered or dead-lettered, still retried (state $state, pending $pending, delivered $delivered, dead letters $dead)");
}
{
	my (undef, $state, $pending, $delivered) = @{ $lag{big200} };
	my $n = scalar(requests_of('big200'));
	ok($delivered == $nmsg && $n == $nmsg,
		"h_big200: a 200 with a 5 MB body is delivered, each message once (pending $pending, delivered $delivered, $n requests)");
}
is($lag{r429}[5], '429', 'h_r429: last_status 429');
is($lag{garbage500}[5], '500', 'h_garbage500: last_status 500');

# last_error: short and printable, whatever came.
my $errs = $node->safe_psql('postgres',
	q{SELECT 'lag', target, encode(textsend(last_error), 'hex') FROM outbox.lag
	   WHERE target LIKE 'h\_%' AND last_error IS NOT NULL
	  UNION ALL
	  SELECT 'progress', t.name, encode(textsend(p.last_error), 'hex')
	    FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
	   WHERE t.name LIKE 'h\_%' AND p.last_error IS NOT NULL
	   ORDER BY 1, 2});
my %err_of;
my @bad;
for (split /\n/, $errs)
{
	my ($where, $t, $hex) = split /\|/;
	my $e = pack('H*', $hex);
	$err_of{$t} //= $e;
	(my $shown = $e) =~ s/([^\x20-\x7e])/sprintf('\\x%02x', ord $1)/ge;
	note "$where $t: $shown";
	push @bad, sprintf('%s %s: %d bytes: %.300s', $where, $t, length $e, $shown)
	  unless length($e) <= 256 && $e =~ /\A[\x20-\x7e]*\z/;
}
ok(defined $err_of{"h_$_"}, "h_$_: last_error set") for @failing;
is_deeply(\@bad, [], 'every last_error is at most 256 printable ASCII characters');
like($err_of{h_garbage500} // '', qr/^HTTP 500/, 'h_garbage500: last_error says HTTP 500');

# Only roles that may see the targets see last_error.
$node->safe_psql('postgres', q{CREATE ROLE snoop LOGIN; GRANT USAGE ON SCHEMA outbox TO snoop;
GRANT EXECUTE ON FUNCTION outbox.metrics() TO snoop});
my ($rc, $out, $err) = $node->psql('postgres', q{SET ROLE snoop; SELECT last_error FROM outbox.lag});
ok($rc != 0 && $err =~ /permission denied/, 'a role without grants cannot read outbox.lag');
($rc, $out, $err) = $node->psql('postgres', q{SET ROLE snoop; SELECT count(*) FROM outbox.progress WHERE last_error IS NOT NULL});
ok($rc != 0 && $err =~ /permission denied/, '... nor outbox.progress');
($rc, $out, $err) = $node->psql('postgres', q{SET ROLE snoop; SELECT outbox.metrics()});
my @leaked = grep { length($_) >= 8 && index($out, substr($_, 0, 24)) >= 0 } values %err_of;
ok($rc == 0 && $out =~ /^outbox_/m && !@leaked,
	'outbox.metrics(), which such a role may be granted, carries no last_error'
	  . ($rc ? " (it failed: $err)" : '') . (@leaked ? " (it shows: @leaked)" : ''));

# The relay: memory flat, the healthy target at its rate, no crash.
my $grew = $peak - $rss_before;
cmp_ok($grew, '<', 32 * 1024,
	"the relay's RssAnon grew by $grew kB (before $rss_before kB, peak $peak kB)");
# The baseline again, with the hostile targets paused: measured before and
# after, so that a load the files beside this one put on the machine in
# between weighs on both sides.  (About 1 on a quiet machine.)
$node->safe_psql('postgres', join('', map { "SELECT outbox.pause_target('h_$_');\n" } sort keys %hostile));
push @base, map { healthy_rate() } 1 .. 3;
my $ratio = median(@hostile_rates) / median(@base);
cmp_ok($ratio, '>=', 0.5,
	sprintf('the healthy target keeps its rate: %.2f x, medians (baseline %s, with the hostile receivers %s msg/s)',
		$ratio, join(', ', map { sprintf '%.0f', $_ } @base),
		join(', ', map { sprintf '%.0f', $_ } @hostile_rates)));
is($node->safe_psql('postgres', q{SELECT pending || '/' || delivered || '/' || dead_letters FROM outbox.lag WHERE target = 'healthy'}),
	"0/$healthy_sent/0", 'the healthy target got every message');
is(relay_worker_pid($node), $pid, 'the relay did not restart');
relay_no_crash($node);

$hostile_h->kill_kill;
eval { $hostile_h->finish };
undef $hostile_h;
stop_sink($sink);
$node->stop;
done_testing();
