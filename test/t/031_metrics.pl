# Monitoring against a live receiver (README, "outbox.metrics()",
# "Operating outbox", "Prometheus"):
#  - outbox.stats counts what was delivered (messages, requests, bytes,
#    the bytes equal to what the receiver got) and its latency percentiles
#    are ordered, for HTTP and NOTIFY targets;
#  - outbox.lag's state follows the target: 'retrying' while its receiver
#    answers 503 (pending stays, lag grows), 'idle' once it recovered and
#    everything is delivered, 'failing' while the receiver answers 401;
#  - outbox.metrics(), as psql -XAt prints it, passes
#    `promtool check metrics` with no lint problem, and carries the right
#    samples (delivered counts, the histogram's +Inf bucket equal to its
#    _count, the state, the relay being up);
#  - prometheus-postgres-exporter, with the custom queries the README
#    recommends (written here to a YAML file) and connected as a role with
#    only the grants the file lists, exposes the same figures under the
#    same names with a target label (the latency histogram too, its
#    buckets those of outbox.metrics()), and that output passes promtool;
#  - outbox.reset_stats() zeroes the counters (once the relay applied it:
#    outbox.worker.last_wakeup after the call), and they count again from
#    there.
use strict;
use warnings;
use IPC::Run;
use HTTP::Tiny;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

# The programs (Debian packages prometheus and prometheus-postgres-exporter,
# installed by test/install-deps.sh); PROMTOOL and POSTGRES_EXPORTER may
# name others.
sub program
{
	my ($env, $name) = @_;
	return $ENV{$env} if $ENV{$env};
	for my $dir (split /:/, $ENV{PATH}, -1)
	{
		return "$dir/$name" if -x "$dir/$name";
	}
	return "/usr/bin/$name";
}
my $promtool = program('PROMTOOL', 'promtool');
my $exporter = program('POSTGRES_EXPORTER', 'prometheus-postgres-exporter');
for my $p ($promtool, $exporter)
{
	die "$p not found: run test/install-deps.sh (Debian packages prometheus, prometheus-postgres-exporter)"
	  unless -x $p;
}

my $sink = start_sink('metrics');
my $url = $sink->{url};
my $node = relay_node('metrics');
my $n = 300;

sub q1
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

sub emit
{
	my ($topic, $from, $to) = @_;
	q1("SELECT count(outbox_emit('$topic', jsonb_build_object('n', g, 'pad', repeat('x', g % 50)), 'k' || (g % 20)))"
		  . " FROM generate_series($from, $to) g");
}

# Prometheus text exposition: { 'name{l1="v1",l2="v2"}' => value }, label
# names sorted (so that any writer's label order gives the same key); and
# { name => type } from the # TYPE lines, with the lines that are neither
# under ' unparsed'.
sub parse_exposition
{
	my ($text) = @_;
	my (%v, %type);
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^# TYPE (\S+) (\S+)$/)
		{
			$type{$1} = $2;
			next;
		}
		next if $line =~ /^#/ || $line !~ /\S/;
		my ($name, $labels, $value) = $line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/;
		if (!defined $name)
		{
			push @{ $type{' unparsed'} }, $line;
			next;
		}
		my %l;
		while (($labels // '') =~ /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/g)
		{
			$l{$1} = $2;
		}
		my $key = $name . '{' . join(',', map { qq{$_="$l{$_}"} } sort keys %l) . '}';
		$v{$key} = $value;
	}
	return (\%v, \%type);
}

# outbox.metrics() as psql prints it.
sub metrics_text
{
	my ($out, $err) = ('', '');
	IPC::Run::run(
		[
			'psql', '-XAt', '-h', $node->host, '-p', $node->port, '-d', 'postgres',
			'-c', 'SELECT outbox.metrics()'
		],
		'<', \undef, '>', \$out, '2>', \$err)
	  or die "psql failed: $err";
	return $out;
}

sub metrics
{
	my ($v) = parse_exposition(metrics_text());
	return $v;
}

# The sink's request bodies on a path, in bytes (every attempt).
sub body_bytes
{
	my ($path) = @_;
	my $sum = 0;
	$sum += $_->{body_len} for sink_path_records($sink, $path);
	return $sum;
}

# --- targets: a healthy receiver, one answering 503, a NOTIFY channel ---
sink_control($sink, { path => '/flaky', status => 503 });
q1(qq{
SELECT outbox.create_http_target('ok', '$url/ok', lanes => 4);
SELECT outbox.subscribe('ok', 'm');
SELECT outbox.subscribe('ok', 'probe');
SELECT outbox.create_http_target('flaky', '$url/flaky', lanes => 4, max_attempts => 0);
SELECT outbox.subscribe('flaky', 'm');
SELECT outbox.create_notify_target('note', 'outbox_metrics');
SELECT outbox.subscribe('note', 'm');
});
emit('m', 1, 100);
emit('m', 101, 200);
emit('m', 201, $n);

ok($node->poll_query_until('postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE target IN ('ok', 'note')}),
	"the healthy targets deliver all $n");
# The relay publishes its figures every 50 ms; poll for them.
ok($node->poll_query_until('postgres',
		qq{SELECT count(*) = 2 FROM outbox.stats WHERE target IN ('ok', 'note') AND messages = $n}),
	"outbox.stats: $n messages delivered to each");

for my $t ('ok', 'note')
{
	my ($requests, $bytes, $retries, $dead, $wm, $order) = split /\|/, q1(qq{
SELECT requests, bytes, retries, dead_letters, window_messages,
	   p50_ms IS NOT NULL AND p50_ms >= 0 AND p50_ms <= p90_ms AND p90_ms <= p99_ms AND p99_ms <= max_ms
  FROM outbox.stats WHERE target = '$t'});
	is($requests, $n, "$t: one request (or notification) per message");
	cmp_ok($bytes, '>', 0, "$t: bytes counted");
	is("$retries/$dead", '0/0', "$t: no retries, no dead letters");
	cmp_ok($wm, '>', 0, "$t: the recent window holds messages");
	is($order, 't', "$t: p50_ms <= p90_ms <= p99_ms <= max_ms");
}
is(q1(q{SELECT bytes FROM outbox.stats WHERE target = 'ok'}), body_bytes('/ok'),
	'ok: bytes equal the request bodies the receiver got');

# --- the 503 receiver: retrying, messages pending, lag growing ---
ok($node->poll_query_until('postgres',
		q{SELECT state = 'retrying' AND pending > 0 FROM outbox.lag WHERE target = 'flaky'}),
	"503: outbox.lag shows the target 'retrying' with messages pending");
my $lag1 = q1(q{SELECT extract(epoch FROM lag) FROM outbox.lag WHERE target = 'flaky'});
my $lag_metric1 = metrics()->{'outbox_oldest_pending_age_seconds{target="flaky"}'};
usleep(1_500_000);    # a span: the lag grows with it
my ($lag2, $pending, $state, $failed) = split /\|/,
  q1(q{SELECT extract(epoch FROM lag), pending, state, failed_attempts FROM outbox.lag WHERE target = 'flaky'});
cmp_ok($lag2, '>', $lag1, "... its lag grows ($lag1 s, then $lag2 s)");
is("$pending/$state", "$n/retrying", '... all its messages still pending, still retrying');
cmp_ok($failed, '>', 0, '... failed_attempts counted');
my $m = metrics();
is($m->{'outbox_target_state{state="retrying",target="flaky"}'}, 1, '... outbox_target_state says retrying');
is($m->{'outbox_target_state{state="idle",target="flaky"}'}, 0, '... and not idle');
is($m->{'outbox_pending_messages{target="flaky"}'}, $n, '... outbox_pending_messages');
cmp_ok($m->{'outbox_oldest_pending_age_seconds{target="flaky"}'}, '>', $lag_metric1,
	'... outbox_oldest_pending_age_seconds grows');
ok($node->poll_query_until('postgres', q{SELECT retries > 0 FROM outbox.stats WHERE target = 'flaky'}),
	'... outbox.stats counts the retries');

sink_control($sink, { path => '/flaky', reset => JSON::PP::true });
ok($node->poll_query_until('postgres',
		q{SELECT pending = 0 AND state = 'idle' FROM outbox.lag WHERE target = 'flaky'}),
	"the receiver recovers: pending falls to 0 and the state goes to 'idle'");
ok($node->poll_query_until('postgres', qq{SELECT messages = $n FROM outbox.stats WHERE target = 'flaky'}),
	"... outbox.stats: $n delivered");
my ($fr, $fretries, $fdead, $forder, $fbytes) = split /\|/, q1(q{
SELECT requests, retries, dead_letters, p50_ms <= p90_ms AND p90_ms <= p99_ms AND p99_ms <= max_ms, bytes
  FROM outbox.stats WHERE target = 'flaky'});
is($fr, $n + $fretries, '... requests = messages + retries (one message a request)');
is($fdead, 0, '... no dead letters');
is($forder, 't', '... p50_ms <= p90_ms <= p99_ms <= max_ms');
is($fbytes, body_bytes('/flaky'), '... bytes equal the request bodies the receiver got, failed ones too');

# --- a 401 receiver: failing ---
sink_control($sink, { path => '/auth', status => 401 });
q1(qq{
SELECT outbox.create_http_target('auth', '$url/auth', lanes => 2);
SELECT outbox.subscribe('auth', 'a');
});
emit('a', 1, 20);
ok($node->poll_query_until('postgres',
		q{SELECT state = 'failing' AND pending = 20 FROM outbox.lag WHERE target = 'auth'}),
	"401: outbox.lag shows the target 'failing', its 20 messages pending");

# --- outbox.metrics() through promtool ---
my $text = metrics_text();
PostgreSQL::Test::Utils::append_to_file("$PostgreSQL::Test::Utils::log_path/outbox_metrics.txt", $text);
my ($pout, $perr) = ('', '');
my $prc = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \$text, '>', \$pout, '2>', \$perr);
ok($prc, 'promtool check metrics accepts outbox.metrics()');
is($pout . $perr, '', '... with no lint problem') or diag("promtool: $pout$perr");

my ($mv, $mtype) = parse_exposition($text);
is_deeply($mtype->{' unparsed'} // [], [], '... every line a comment or a sample');
is($mv->{'outbox_delivered_messages_total{target="ok"}'}, $n, 'outbox_delivered_messages_total of ok');
is($mv->{'outbox_delivered_messages_total{target="flaky"}'}, $n, '... of flaky');
is($mv->{'outbox_delivered_messages_total{target="note"}'}, $n, '... of note (NOTIFY)');
is($mv->{'outbox_delivered_messages_total{target="auth"}'}, 0, '... of auth');
is($mtype->{outbox_delivered_messages_total}, 'counter', '... a counter');
is($mtype->{outbox_delivery_latency_seconds}, 'histogram', 'outbox_delivery_latency_seconds is a histogram');
for my $t ('ok', 'flaky', 'note', 'auth')
{
	my @buckets =
	  sort { $a->[0] <=> $b->[0] }
	  map { /le="([^"]+)"/; [ $1 eq '+Inf' ? 9**9**9 : $1, $mv->{$_} ] }
	  grep { /^outbox_delivery_latency_seconds_bucket\{/ && /target="$t"/ } keys %$mv;
	my $count = $mv->{qq{outbox_delivery_latency_seconds_count{target="$t"}}};
	cmp_ok(scalar @buckets, '>=', 2, "$t: histogram buckets");
	is($buckets[-1][1], $count, "$t: the +Inf bucket equals _count");
	is($count, $t eq 'auth' ? 0 : $n, "$t: _count is the messages delivered");
	ok(!(grep { $buckets[$_][1] < $buckets[ $_ - 1 ][1] } 1 .. $#buckets), "$t: the buckets are cumulative");
	ok(defined $mv->{qq{outbox_delivery_latency_seconds_sum{target="$t"}}}, "$t: _sum");
}
is($mv->{'outbox_target_state{state="failing",target="auth"}'}, 1, 'outbox_target_state of auth: failing');
is($mv->{'outbox_target_state{state="idle",target="ok"}'}, 1, '... of ok: idle');
is(scalar(grep { /^outbox_target_state\{.*target="ok"/ && $mv->{$_} == 1 } keys %$mv), 1,
	'... one state at a time');
is($mv->{'outbox_pending_messages{target="auth"}'}, 20, 'outbox_pending_messages of auth');
is($mv->{'outbox_relay_up{}'}, 1, 'outbox_relay_up');
is($mv->{'outbox_requests_total{target="ok"}'}, $n, 'outbox_requests_total of ok');
is($mv->{'outbox_request_bytes_total{target="ok"}'}, body_bytes('/ok'), 'outbox_request_bytes_total of ok');
cmp_ok($mv->{'outbox_retries_total{target="flaky"}'}, '>', 0, 'outbox_retries_total of flaky');

# --- prometheus-postgres-exporter with the README's custom queries ---
# Metric names as outbox.metrics() has them (each query's name prefixes its
# columns'), so dashboards and alerts work with either; scraped as a role
# with only the grants the file's comment lists.
my $queries = <<'EOYAML';
# Custom queries for prometheus-postgres-exporter (--extend.query-path):
# outbox's figures per target, named as outbox.metrics() names them.
# Connect to the database named by outbox.database, as a member of outbox_monitor:
#   CREATE ROLE outbox_exporter LOGIN IN ROLE outbox_monitor;
outbox:
  query: |
    SELECT l.target,
           l.pending AS pending_messages,
           coalesce(extract(epoch FROM l.lag), 0) AS oldest_pending_age_seconds,
           l.dead_letters,
           l.in_flight AS in_flight_requests,
           l.failed_attempts,
           coalesce(extract(epoch FROM l.last_success_at), 0) AS last_success_timestamp_seconds,
           coalesce(s.messages, 0) AS delivered_messages_total,
           coalesce(s.requests, 0) AS requests_total,
           coalesce(s.bytes, 0) AS request_bytes_total,
           coalesce(s.retries, 0) AS retries_total,
           coalesce(s.dead_letters, 0) AS dead_lettered_messages_total,
           s.p50_ms / 1000 AS delivery_latency_p50_seconds,
           s.p90_ms / 1000 AS delivery_latency_p90_seconds,
           s.p99_ms / 1000 AS delivery_latency_p99_seconds,
           s.max_ms / 1000 AS delivery_latency_max_seconds
      FROM outbox.lag l
      LEFT JOIN outbox.stats s USING (target)
  master: true
  metrics:
    - target:
        usage: "LABEL"
        description: "Name of the outbox target"
    - pending_messages:
        usage: "GAUGE"
        description: "Messages committed and not yet delivered or dead-lettered"
    - oldest_pending_age_seconds:
        usage: "GAUGE"
        description: "Age of the oldest pending message (0 when none)"
    - dead_letters:
        usage: "GAUGE"
        description: "Dead letters kept in outbox.dead_letters"
    - in_flight_requests:
        usage: "GAUGE"
        description: "Requests on the wire"
    - failed_attempts:
        usage: "GAUGE"
        description: "Failed attempts of the messages now being retried"
    - last_success_timestamp_seconds:
        usage: "GAUGE"
        description: "When the target last acknowledged a request (0 when never)"
    - delivered_messages_total:
        usage: "COUNTER"
        description: "Messages acknowledged by the target"
    - requests_total:
        usage: "COUNTER"
        description: "Requests sent to the target"
    - request_bytes_total:
        usage: "COUNTER"
        description: "Bytes of request bodies sent to the target"
    - retries_total:
        usage: "COUNTER"
        description: "Failed attempts that were tried again"
    - dead_lettered_messages_total:
        usage: "COUNTER"
        description: "Messages the relay gave up on"
    - delivery_latency_p50_seconds:
        usage: "GAUGE"
        description: "Median latency from outbox_emit() to acknowledgement, last 30 to 60 s"
    - delivery_latency_p90_seconds:
        usage: "GAUGE"
        description: "90th percentile of that latency, last 30 to 60 s"
    - delivery_latency_p99_seconds:
        usage: "GAUGE"
        description: "99th percentile of that latency, last 30 to 60 s"
    - delivery_latency_max_seconds:
        usage: "GAUGE"
        description: "Highest such latency, last 30 to 60 s"
# The latency histogram (for histogram_quantile()): bucket bounds and
# cumulative counts, the +Inf bucket being the count.
outbox_delivery:
  query: |
    SELECT t.name AS target,
           array(SELECT b.le / 1000 FROM unnest(s.latency_le_ms) WITH ORDINALITY b (le, i)
                  WHERE b.le <> 'Infinity' ORDER BY b.i) AS latency_seconds,
           array(SELECT (sum(b.c) OVER (ORDER BY b.i))::bigint
                   FROM unnest(s.latency_buckets) WITH ORDINALITY b (c, i)
                  ORDER BY b.i LIMIT cardinality(s.latency_buckets) - 1) AS latency_seconds_bucket,
           s.latency_sum_ms / 1000 AS latency_seconds_sum,
           s.latency_count AS latency_seconds_count
      FROM outbox.target_stats() s
      JOIN outbox.targets t ON t.id = s.target_id
  master: true
  metrics:
    - target:
        usage: "LABEL"
        description: "Name of the outbox target"
    - latency_seconds:
        usage: "HISTOGRAM"
        description: "From outbox_emit() to acknowledgement, per message"
EOYAML
my $yaml = "$PostgreSQL::Test::Utils::tmp_check/outbox_exporter_queries.yaml";
open(my $fh, '>', $yaml) or die "$yaml: $!";
print $fh $queries;
close $fh;
my ($grants) = $queries =~ /^# Connect to.*\n((?:#   .*\n)+)/m;
$grants =~ s/^#\s+//mg;
q1($grants);

# The latency percentiles cover the last 30 to 60 s: one more message for
# ok (topic probe: ok only) puts a recent one in its window, however long
# the steps above took.
emit('probe', 1, 1);
ok($node->poll_query_until('postgres',
		qq{SELECT messages = $n + 1 AND window_messages > 0 FROM outbox.stats WHERE target = 'ok'}),
	'ok: a recent message in its latency window');

my $elog = "$PostgreSQL::Test::Utils::log_path/postgres_exporter.log";
my $eh;
END { $eh->kill_kill if $eh && $eh->pumpable; }
my $http = HTTP::Tiny->new(timeout => $PostgreSQL::Test::Utils::timeout_default);
my $scrape = '';
my $served;
# A free port is only known free until someone binds it: an exporter that
# could not listen exits, and another port is tried.
for my $try (1 .. 3)
{
	my $eport = PostgreSQL::Test::Cluster::get_free_port();
	{
		local $ENV{DATA_SOURCE_NAME} =
		  'host=' . $node->host . ' port=' . $node->port . ' user=outbox_exporter dbname=postgres sslmode=disable';
		$eh = IPC::Run::start(
			[
				$exporter, "--web.listen-address=127.0.0.1:$eport",
				"--extend.query-path=$yaml", '--disable-default-metrics',
				'--disable-settings-metrics', '--no-collector.database',
				'--no-collector.bgwriter', '--log.level=warn'
			],
			'<', \undef, '>>', $elog, '2>>', $elog);
	}
	$served = wait_for('the exporter to serve the outbox figures',
		sub {
			eval { $eh->pump_nb };
			return (1) unless $eh->pumpable;    # exited: try another port
			my $res = $http->get("http://127.0.0.1:$eport/metrics");
			$scrape = $res->{content} // '';
			return $res->{success}
			  && $scrape =~ /^outbox_delivered_messages_total\{/m
			  && $scrape =~ /^outbox_delivery_latency_seconds_count\{/m;
		},
		interval => 0.25) && $eh->pumpable;
	last if $served || $eh->pumpable;
	eval { $eh->finish };
	note "the exporter exited (port $eport taken?); another port";
}
ok($served, 'prometheus-postgres-exporter serves the outbox figures')
  or diag("exporter log:\n" . (-e $elog ? slurp_file($elog) : '(none)') . "\nscrape:\n$scrape");
PostgreSQL::Test::Utils::append_to_file("$PostgreSQL::Test::Utils::log_path/postgres_exporter_scrape.txt", $scrape);
my ($ev, $etype) = parse_exposition($scrape);
is_deeply($etype->{' unparsed'} // [], [], '... in the text format');

# The exporter adds a label of its own (server): find by name and labels.
sub exported
{
	my ($name, $target, $le) = @_;
	my @k = grep {
		/^\Q$name\E\{/ && /target="\Q$target\E"/
		  && (!defined $le || /le="\Q$le\E"/)
	} keys %$ev;
	return @k == 1 ? $ev->{ $k[0] } : undef;
}
is(exported('outbox_delivered_messages_total', 'ok'), $n + 1, 'exporter: outbox_delivered_messages_total of ok (and the probe)');
is(exported('outbox_delivered_messages_total', 'flaky'), $n, '... of flaky');
is(exported('outbox_delivered_messages_total', 'note'), $n, '... of note');
is($etype->{outbox_delivered_messages_total}, 'counter', '... a counter');
my ($sreq, $sbytes, $sretries) = split /\|/, q1(q{SELECT requests, bytes, retries FROM outbox.stats WHERE target = 'flaky'});
is(exported('outbox_requests_total', 'flaky'), $sreq, '... outbox_requests_total as in outbox.stats');
is(exported('outbox_request_bytes_total', 'flaky'), $sbytes, '... outbox_request_bytes_total as in outbox.stats');
is(exported('outbox_retries_total', 'flaky'), $sretries, '... outbox_retries_total as in outbox.stats');
is(exported('outbox_pending_messages', 'auth'), 20, '... outbox_pending_messages of auth');
is(exported('outbox_pending_messages', 'ok'), 0, '... of ok');
cmp_ok(exported('outbox_oldest_pending_age_seconds', 'auth') // 0, '>', 0, '... auth has an oldest pending age');
for my $p ('p50', 'p90', 'p99', 'max')
{
	my $v = exported("outbox_delivery_latency_${p}_seconds", 'ok');
	ok(defined $v && $v =~ /^[0-9.e+-]+$/ && $v >= 0, "... outbox_delivery_latency_${p}_seconds of ok");
}
is($etype->{outbox_delivery_latency_seconds}, 'histogram', '... outbox_delivery_latency_seconds is a histogram');
my $mv_now = metrics();
for my $t ('ok', 'flaky', 'note')
{
	my $count = exported('outbox_delivery_latency_seconds_count', $t);
	is($count, $n + ($t eq 'ok' ? 1 : 0), "... $t: its _count");
	is(exported('outbox_delivery_latency_seconds_bucket', $t, '+Inf'), $count, "... $t: its +Inf bucket");
	# The buckets are those of outbox.metrics(), bound for bound.
	my %mine = map { /le="([^"]+)"/; ($1 eq '+Inf' ? 'inf' : $1 + 0) => $mv_now->{$_} }
	  grep { /^outbox_delivery_latency_seconds_bucket\{/ && /target="$t"/ } keys %$mv_now;
	my %theirs = map { /le="([^"]+)"/; ($1 eq '+Inf' ? 'inf' : $1 + 0) => $ev->{$_} }
	  grep { /^outbox_delivery_latency_seconds_bucket\{/ && /target="$t"/ } keys %$ev;
	is_deeply(\%theirs, \%mine, "... $t: the buckets of outbox.metrics()");
}
# Lint what comes of the custom queries (the exporter's own families are
# its business).
my @ours;
{
	my $keep = 0;
	for my $line (split /\n/, $scrape)
	{
		$keep = ($1 =~ /^outbox_/) if $line =~ /^# HELP (\S+)/;
		push @ours, $line if $keep;
	}
}
my ($eout, $eerr) = ('', '');
my $erc = IPC::Run::run([ $promtool, 'check', 'metrics' ], '<', \join('', map { "$_\n" } @ours),
	'>', \$eout, '2>', \$eerr);
ok($erc && $eout . $eerr eq '', 'promtool check metrics accepts the exporter\'s outbox figures')
  or diag("promtool: $eout$eerr");
$eh->signal('TERM');
wait_until(sub { eval { $eh->pump_nb }; !$eh->pumpable });
$eh->kill_kill if $eh->pumpable;
eval { $eh->finish };

# --- outbox.reset_stats() ---
# The relay applies a reset when it next publishes its figures (which
# sets outbox.worker.last_wakeup), zeroing what it delivered since the call
# with the rest: wait for a publication after the call before emitting.
q1(q{SELECT outbox.reset_stats()});
my $after_reset = q1(q{SELECT clock_timestamp()});
ok($node->poll_query_until('postgres', "SELECT last_wakeup > '$after_reset' FROM outbox.worker"),
	'outbox.reset_stats(): the relay publishes its figures again');
is(q1(q{SELECT bool_and(messages = 0 AND reset_at IS NOT NULL) FROM outbox.stats}), 't',
	'... messages are 0 for every target, reset_at set');
is(q1(q{SELECT format('%s/%s/%s', sum(requests), sum(bytes), sum(retries)) FROM outbox.stats WHERE target IN ('ok', 'flaky', 'note')}),
	'0/0/0', '... requests, bytes and retries too');
$m = metrics();
is($m->{'outbox_delivered_messages_total{target="ok"}'}, 0, '... outbox_delivered_messages_total of ok is 0');
is($m->{'outbox_delivery_latency_seconds_count{target="ok"}'}, 0, '... and its latency count');
emit('m', $n + 1, $n + 10);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 3 FROM outbox.stats WHERE target IN ('ok', 'flaky', 'note') AND messages = 10}),
	'... then they count from 0 again')
  or diag(q1(q{SELECT * FROM outbox.stats}));

relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
