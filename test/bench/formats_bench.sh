#!/usr/bin/env bash
# formats_bench.sh - what CloudEvents formatting and subscription filters
# cost the relay: drains of the same backlog, in one run on one throwaway
# cluster (so that the ratios compare like with like), into a throwaway
# nginx answering 204.
#
# Run by hand, as root (not in CI):
#
#   test/bench/formats_bench.sh                          # ~2 minutes on 2 cores
#   N1=200000 N100=1000000 test/bench/formats_bench.sh   # ~5 minutes
#   PAIRS=c R=5 N100=1000000 test/bench/formats_bench.sh # the filter only
#
# With the default N a batch_size 100 drain takes well under a second on
# 2 cores: the fixed costs (the reload, the 20 ms progress ticks, 10 ms
# CPU ticks) and the noise then weigh much; ten times N is steadier.
#
# What it measures.  Each drain: every target dropped, outbox.messages
# truncated, outbox.enabled = off, a fresh HTTP target (LANES lanes) at
# nginx subscribed to 'bench.*', a backlog of N messages emitted (topic
# bench.created, KEYS keys, a ~200-byte JSON payload with a numeric field
# n, in XACTS transactions), VACUUM ANALYZE, CHECKPOINT; then
# outbox.enabled = on and the time from the reload until outbox.progress
# records all N delivered (relay_bench_tool.py drain, polled every 5 ms).
# The relay's CPU time is utime + stime of its process (/proc/PID/stat,
# pid from outbox.relays) over the drain; its RSS before and after, and
# utime and stime apart, go to the raw results (OUT=DIR) and the log.
# The pairs:
#   a) batch_size 1   (N1 messages):   format 'outbox' vs 'cloudevents'
#   b) batch_size 100 (N100 messages): format 'outbox' vs 'cloudevents'
#   c) batch_size 100 (N100 messages), format 'outbox': no filter vs
#      filter '$.payload.n >= 0' (true of every message)
# over R rounds, A B in every pair in every round (A B A B ...); medians.
# Goals: a), b) cloudevents/outbox msgs/s >= 0.95; c) filter costs < 2 us of
# relay CPU per message.
#
# Before the timed runs a small functional check (a capturing receiver
# written into the work directory): CloudEvents binary mode with
# batch_size 1 (ce- headers, the payload as the body), a CloudEvents batch
# (application/cloudevents-batch+json), and a filter that turns a message
# away (counted in outbox.stats.filtered).
#
# Settings (environment):
#   R=3 N1=20000 N100=100000 KEYS=100 XACTS=10 LANES=8
#   PAIRS="a b c"                 which pairs to measure
#   FILTER='$.payload.n >= 0'
#   KEEP=0 OUT=DIR (raw results and the server log are copied there)
#   REV=  (build this git revision instead of the working tree)
#   INSTALL=0 (1: also install the build system-wide; the server always
#             runs on its private copy)
#   PORT=54361 NGINX_PORT=18111   127.0.0.1 only
#   WAIT_FOR=                     wait while a process whose command line
#                                 matches runs (e.g. relay_bench.sh)
#   QUIET_MAX=0.3 QUIET_WAIT=60   before every drain wait (at most
#                                 QUIET_WAIT s) until at most QUIET_MAX CPUs
#                                 are busy; drains measured on a busy machine
#                                 are listed as anomalies
set -euo pipefail

# the command line, with the settings given in the environment
cmdline=
for v in R N1 N100 PAIRS KEYS XACTS LANES FILTER KEEP OUT REV INSTALL PORT NGINX_PORT WAIT_FOR QUIET_MAX QUIET_WAIT; do
	if [ -n "${!v+x}" ]; then cmdline+="$v=$(printf '%q' "${!v}") "; fi
done
cmdline+=$(printf '%q' "$0")
[ $# -eq 0 ] || cmdline+=" $(printf '%q ' "$@")"

R=${R:-3}
N1=${N1:-20000}
N100=${N100:-100000}
KEYS=${KEYS:-100}
XACTS=${XACTS:-10}
LANES=${LANES:-8}
FILTER=${FILTER:-'$.payload.n >= 0'}
PAIRS=${PAIRS:-"a b c"}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54361}
NGINX_PORT=${NGINX_PORT:-18111}
WAIT_FOR=${WAIT_FOR:-}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-60}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=formats-bench
BENCH_PACKAGES=()
cap_pid=
bench_on_exit() {
	[ -n "$cap_pid" ] && kill "$cap_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

psqlq -d postgres -c "CREATE DATABASE $DB"
sql >/dev/null <<'SQL'
CREATE EXTENSION outbox;
ALTER SYSTEM SET outbox.enabled = off;
SELECT pg_reload_conf();
-- ~200 bytes of JSON text, with the numeric field the filter tests
CREATE FUNCTION fmt_payload(g bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
	SELECT jsonb_build_object('n', g, 'order_id', g, 'customer_id', 100000 + g % 1000,
							  'status', 'created', 'amount', 123.45, 'currency', 'EUR',
							  'sku', 'SKU-' || lpad(g::text, 8, '0'),
							  'created_at', '2024-01-01T12:00:00Z', 'note', repeat('p', 32))
$$;
SQL
payload_bytes=$(sql -c "SELECT octet_length(fmt_payload(1)::text)")

# ---- helpers ------------------------------------------------------------------

# utime and stime of a process, in seconds
ustime() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f %.2f\n", $12 / hz, $13 / hz }' "/proc/$1/stat"; }
relay_pid() { sql -c "SELECT pid FROM outbox.relays WHERE database = current_database()"; }


set_enabled() {	# on|off
	sql -c "ALTER SYSTEM SET outbox.enabled = $1" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 0.5	# let the relay take the SIGHUP
}

# Drop every target, empty the outbox, create the target (delivery off),
# subscribe it and emit n messages.  Prints the target id.
prepare_backlog() {	# name url batch_size format filter|'' n
	local name=$1 url=$2 bs=$3 fmt=$4 filt=$5 n=$6 i lo hi per tid cnt fsql=
	set_enabled off
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" >/dev/null
	sql -c "TRUNCATE outbox.messages" >/dev/null
	[ -z "$filt" ] || fsql=", filter => '${filt//\'/\'\'}'"
	sql -c "SELECT outbox.create_http_target('$name', '$url', batch_size => $bs, lanes => $LANES, format => '$fmt')" \
		-c "SELECT outbox.subscribe('$name', 'bench.*'$fsql)" >/dev/null
	tid=$(sql -c "SELECT outbox.target_id('$name')")
	per=$(((n + XACTS - 1) / XACTS))
	for ((i = 0; i < XACTS; i++)); do
		lo=$((i * per + 1)) hi=$(((i + 1) * per))
		[ "$hi" -gt "$n" ] && hi=$n
		[ "$lo" -gt "$hi" ] && break
		sql -c "SELECT count(outbox_emit('bench.created', fmt_payload(g), 'key-' || (g % $KEYS))) FROM generate_series($lo, $hi) g" >/dev/null
	done
	sql -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
	cnt=$(sql -c "SELECT count(*) FROM outbox.messages m, outbox.subscriptions s WHERE s.target_id = $tid AND m.id > s.start_id")
	[ "$cnt" = "$n" ] || echo "prepare_backlog $name: $cnt messages above the subscription start, expected $n" | tee -a "$work/anomalies" >&2
	cnt=$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $tid")
	[ "$cnt" = 0 ] || echo "prepare_backlog $name: $cnt messages delivered while outbox.enabled = off" | tee -a "$work/anomalies" >&2
	echo "$tid"
}

# After a drain: everything delivered, nothing dead, no errors, lag 0.
check_target() {	# tid label expected
	local out del dead errs dl pend mind maxid bad=""
	out=$(sql -F' ' -c "SELECT coalesce(sum(delivered), 0), coalesce(sum(dead), 0), count(*) FILTER (WHERE last_error IS NOT NULL),
				(SELECT count(*) FROM outbox.dead_letters), (SELECT pending FROM outbox.lag l JOIN outbox.targets t ON t.name = l.target WHERE t.id = $1),
				min(done_id), (SELECT max(id) FROM outbox.messages)
			FROM outbox.progress WHERE target_id = $1")
	read -r del dead errs dl pend mind maxid <<<"$out"
	[ "$del" = "$3" ] || bad+=" delivered=$del"
	[ "$dead" = 0 ] || bad+=" dead=$dead"
	[ "$dl" = 0 ] || bad+=" dead_letters=$dl"
	[ "$errs" = 0 ] || bad+=" lanes_with_last_error=$errs ($(sql -c "SELECT string_agg(DISTINCT last_error, '; ') FROM outbox.progress WHERE target_id = $1"))"
	[ "$pend" = 0 ] || bad+=" lag.pending=$pend"
	[ "$mind" = "$maxid" ] || bad+=" min(done_id)=$mind<max(id)=$maxid"
	[ -z "$bad" ] || echo "$2: expected $3 delivered:$bad" | tee -a "$work/anomalies" >&2
}

# One timed drain; records a JSON line.
run_drain() {	# exp variant round batch_size format filter|'' n
	local exp=$1 var=$2 r=$3 bs=$4 fmt=$5 filt=$6 n=$7 name tid rpid n0 n1 out st r0 r1 t0 t1
	name="${exp}_${var}_r$r"
	tid=$(prepare_backlog "$name" "$NGINX_URL" "$bs" "$fmt" "$filt" "$n")
	rpid=$(relay_pid)
	[ -n "$rpid" ] || { echo "no relay in outbox.relays" >&2; exit 1; }
	wait_quiet "$name"
	r0=$(rss_of "$rpid")
	t0=$(ustime "$rpid")
	n0=$(nginx_requests)
	out=$(tool drain --target-id "$tid" --n "$n" --cpu-pids "$rpid,$nginx_worker" --poll-ms 5)
	n1=$(nginx_requests)
	t1=$(ustime "$rpid")
	r1=$(rss_of "$rpid")
	sleep 0.3	# the relay's statistics
	st=$(sql -c "SELECT json_build_object('messages', messages, 'requests', requests, 'bytes', bytes, 'filtered', filtered, 'retries', retries)
				 FROM outbox.stats WHERE target = '$name'")
	set_enabled off
	check_target "$tid" "$name" "$n"
	record "{\"kind\": \"drain\", \"exp\": \"$exp\", \"variant\": \"$var\", \"round\": $r, \"batch\": $bs, \"format\": \"$fmt\", \"filter\": $( [ -n "$filt" ] && echo true || echo false),
		\"busy_before\": $BUSY, \"relay_pid\": $rpid, \"nginx_worker\": $nginx_worker, \"nginx_requests\": $((n1 - n0 - 1))}" \
		"$out" "{\"stats\": ${st:-null}, \"rss_before\": $r0, \"rss_after\": $r1,
		  \"utime_s\": $(awk -v a="$t0" -v b="$t1" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.2f, \"stime_s\": %.2f", y[1] - x[1], y[2] - x[2] }')}"
	log "  $name: $(echo "$out" | "$PY" -c 'import json, sys
d = json.load(sys.stdin)
print("%s msg/s in %s s, relay CPU %s s" % (d["rate"], d["seconds"], d["cpu_s"].get(sys.argv[1])))' "$rpid"), $((n1 - n0 - 1)) requests; relay utime stime $t0 -> $t1 s; RSS before $r0 after $r1"
}

# ---- functional check: what the receiver gets ---------------------------------------
cat >"$work/capture.py" <<'PYEOF'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
out = open(sys.argv[2], "a")
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        out.write(json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                              "body": body.decode("utf-8", "replace")}) + "\n")
        out.flush()
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(srv.server_address[1]))
srv.serve_forever()
PYEOF
"$PY" "$work/capture.py" "$work/capture.port" "$work/out/capture.jsonl" &
cap_pid=$!
for _ in $(seq 100); do [ -s "$work/capture.port" ] && break; sleep 0.05; done
CAP_URL="http://127.0.0.1:$(cat "$work/capture.port")"

log "functional check: cloudevents (batch_size 1 and 100) and a filter, into a capturing receiver"
set_enabled off
sql -c "SELECT outbox.create_http_target('ce1', '$CAP_URL/ce1', batch_size => 1, lanes => 1, format => 'cloudevents')" \
	-c "SELECT outbox.subscribe('ce1', 'bench.*')" \
	-c "SELECT outbox.create_http_target('ce100', '$CAP_URL/ce100', batch_size => 100, lanes => 1, format => 'cloudevents')" \
	-c "SELECT outbox.subscribe('ce100', 'bench.*')" \
	-c "SELECT outbox.create_http_target('flt', '$CAP_URL/flt', batch_size => 100, lanes => 1)" \
	-c "SELECT outbox.subscribe('flt', 'bench.*', filter => '\$.payload.n >= 2')" >/dev/null
sql -c "SELECT count(outbox_emit('bench.created', fmt_payload(g), 'key-' || g)) FROM generate_series(1, 3) g" >/dev/null
set_enabled on
for _ in $(seq 100); do
	[ "$(sql -c "SELECT coalesce(sum(pending), 1) FROM outbox.lag WHERE target IN ('ce1', 'ce100', 'flt')")" = 0 ] && break
	sleep 0.1
done
sleep 0.5
set_enabled off
sql -c "SELECT json_object_agg(target, json_build_object('pending', pending, 'delivered', delivered, 'dead_letters', dead_letters, 'last_error', last_error))
		FROM outbox.lag WHERE target IN ('ce1', 'ce100', 'flt')" >"$work/out/capture-lag.json"
sql -c "SELECT json_object_agg(target, json_build_object('messages', messages, 'requests', requests, 'filtered', filtered))
		FROM outbox.stats WHERE target IN ('ce1', 'ce100', 'flt')" >"$work/out/capture-stats.json"
sql -c "SELECT json_agg(json_build_object('id', id, 'payload', payload::text) ORDER BY id) FROM outbox.messages" >"$work/out/capture-msgs.json"
kill "$cap_pid"; wait "$cap_pid" 2>/dev/null || true; cap_pid=
func=$("$PY" - "$work/out/capture.jsonl" "$work/out/capture-lag.json" "$work/out/capture-stats.json" "$work/out/capture-msgs.json" <<'PYEOF'
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
lag = json.load(open(sys.argv[2])); stats = json.load(open(sys.argv[3])); msgs = json.load(open(sys.argv[4]))
payloads = {json.dumps(json.loads(m["payload"]), sort_keys=True) for m in msgs}
bad = []
def by(p): return [r for r in reqs if r["path"] == "/" + p]
# batch_size 1, binary mode: one request per message, ce- headers, the payload as body
ce1 = by("ce1")
if len(ce1) != 3: bad.append(f"ce1: {len(ce1)} requests, expected 3")
for r in ce1:
    h = r["headers"]
    miss = [k for k in ("ce-specversion", "ce-id", "ce-type", "ce-source") if k not in h]
    if miss: bad.append(f"ce1: missing {miss}")
    if h.get("ce-specversion") != "1.0": bad.append(f"ce1: ce-specversion {h.get('ce-specversion')!r}")
    if h.get("ce-type") != "bench.created": bad.append(f"ce1: ce-type {h.get('ce-type')!r}")
    if not h.get("content-type", "").startswith("application/json"): bad.append(f"ce1: content-type {h.get('content-type')!r}")
    try:
        if json.dumps(json.loads(r["body"]), sort_keys=True) not in payloads: bad.append("ce1: body is not a payload")
    except ValueError:
        bad.append("ce1: body is not JSON")
# batch_size 100: a CloudEvents batch of structured events
ce100 = by("ce100")
n100 = 0
for r in ce100:
    if not r["headers"].get("content-type", "").startswith("application/cloudevents-batch+json"):
        bad.append(f"ce100: content-type {r['headers'].get('content-type')!r}")
    try:
        evs = json.loads(r["body"])
    except ValueError:
        bad.append("ce100: body is not JSON"); continue
    if not isinstance(evs, list): bad.append("ce100: body is not an array"); continue
    for e in evs:
        n100 += 1
        miss = [k for k in ("specversion", "id", "type", "source", "data") if k not in e]
        if miss: bad.append(f"ce100: event without {miss}")
        elif json.dumps(e["data"], sort_keys=True) not in payloads: bad.append("ce100: data is not a payload")
if n100 != 3: bad.append(f"ce100: {n100} events in {len(ce100)} requests, expected 3")
# filter n >= 2: messages 2 and 3 delivered, 1 filtered
flt = by("flt")
nf = 0
for r in flt:
    try:
        b = json.loads(r["body"]); nf += len(b) if isinstance(b, list) else 1
    except ValueError:
        bad.append("flt: body is not JSON")
if nf != 2: bad.append(f"flt: {nf} messages received, expected 2")
if stats.get("flt", {}).get("filtered") != 1: bad.append(f"flt: outbox.stats.filtered = {stats.get('flt', {}).get('filtered')}, expected 1")
for t, l in lag.items():
    if l["pending"] != 0 or l["dead_letters"] != 0 or l["last_error"]: bad.append(f"{t}: lag {l}")
ex = ce1[0]["headers"] if ce1 else {}
print(json.dumps({"ok": not bad, "problems": bad,
                  "requests": {p: len(by(p)) for p in ("ce1", "ce100", "flt")}, "stats": stats,
                  "example_ce_headers": {k: v for k, v in ex.items() if k.startswith("ce-") or k == "content-type"}}))
PYEOF
)
record '{"kind": "functional"}' "$func"
log "  $func"
echo "$func" | grep -q '"ok": true' || echo "functional check: $func" >>"$work/anomalies"
sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null

# ---- the timed drains ----------------------------------------------------------
busy_before=$(machine_busy 2)
log "machine busy before the runs: $busy_before of $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq 150); do relay0=$(relay_pid); [ -n "$relay0" ] && break; sleep 0.2; done
[ -n "$relay0" ] || { echo "no relay in outbox.relays" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }
[ "$relay0" = "$(worker_pid)" ] || echo "outbox.relays pid $relay0 differs from pg_stat_activity's $(worker_pid)" >>"$work/anomalies"

log "plan: $R rounds of pairs $PAIRS: a) batch 1 outbox/cloudevents ($N1), b) batch 100 outbox/cloudevents ($N100), c) batch 100 no filter/filter ($N100); $LANES lanes"
for ((r = 1; r <= R; r++)); do
	log "round $r"
	for e in $PAIRS; do
		case $e in
		a)	run_drain a outbox "$r" 1 outbox '' "$N1"
			run_drain a cloudevents "$r" 1 cloudevents '' "$N1" ;;
		b)	run_drain b outbox "$r" 100 outbox '' "$N100"
			run_drain b cloudevents "$r" 100 cloudevents '' "$N100" ;;
		c)	run_drain c nofilter "$r" 100 outbox '' "$N100"
			run_drain c filter "$r" 100 outbox "$FILTER" "$N100" ;;
		*)	echo "PAIRS: unknown pair '$e' (a, b, c)" >&2; exit 1 ;;
		esac
	done
done
sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null

# ---- server log -------------------------------------------------------------------------
relay_end=$(relay_pid)
[ "$relay_end" = "$relay0" ] || echo "the relay changed pid: $relay0 -> ${relay_end:-none} (restarted?)" >>"$work/anomalies"
set +o pipefail
{
	if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
		echo "SERVER LOG shows a crash:"
		grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
	fi
	nexit=$(grep -c 'exited with exit code' "$SERVERLOG" || true)
	[ "$nexit" = 0 ] || echo "server log: $nexit background worker exit(s): $(grep 'exited with exit code' "$SERVERLOG" | sed 's/^[^]]*] //' | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
	echo "server log: $(grep -c 'ERROR' "$SERVERLOG" || true) ERROR, $(grep -c 'WARNING' "$SERVERLOG" || true) WARNING, $(grep -c 'FATAL' "$SERVERLOG" || true) FATAL lines"
	grep -E 'ERROR|WARNING|FATAL' "$SERVERLOG" | sed -E 's/^.*(ERROR|WARNING|FATAL)/\1/' | sort | uniq -c | sort -rn | head -10
} >"$work/out/serverlog.txt"
set -o pipefail

# ---- report -------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$work/anomalies" "$work/out/serverlog.txt" <<PYEOF
import json, statistics, sys, os
res = [json.loads(l) for l in open(sys.argv[1])]
anom = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else ""
slog = open(sys.argv[3]).read()
med = statistics.median
drains = [r for r in res if r["kind"] == "drain"]
def runs(exp, var): return [r for r in drains if r["exp"] == exp and r["variant"] == var]
def us_per_msg(r):
    c = r["cpu_s"].get(str(r["relay_pid"]))
    return c / r["n"] * 1e6 if c is not None else float("nan")
def nginx_share(r):
    c = r["cpu_s"].get(str(r["nginx_worker"]))
    return c / r["seconds"] if c is not None and r["seconds"] else float("nan")

print()
print("outbox formats/filters benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("  command: $cmdline")
print("  built from $build_rev (outbox.so md5 $build_md5); PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///'); $(nproc) cores; machine busy before: $busy_before CPUs")
print("  payload $payload_bytes bytes of JSON, $KEYS keys, $LANES lanes, backlog in $XACTS transactions, $R rounds (A B per pair, every round); synchronous_commit=on")
f = [r for r in res if r["kind"] == "functional"]
if f:
    f = f[0]
    print(f"  functional check: {'ok' if f['ok'] else 'PROBLEMS: ' + '; '.join(f['problems'])}; requests {f['requests']}; binary-mode headers {f['example_ce_headers']}")
print()
print(f"  {'config':34} {'N':>7} {'median msg/s':>12}  {'runs msg/s':26} {'10-90%':>7} {'relay us/msg':>12}  {'runs us/msg':20} {'relay CPU':>9} {'req':>6} {'machine':>7}")
rows = [("a", "outbox", "a) batch 1, outbox"), ("a", "cloudevents", "a) batch 1, cloudevents"),
        ("b", "outbox", "b) batch 100, outbox"), ("b", "cloudevents", "b) batch 100, cloudevents"),
        ("c", "nofilter", "c) batch 100, outbox, no filter"), ("c", "filter", "c) batch 100, outbox, filter")]
M = {}
for exp, var, label in rows:
    rs = runs(exp, var)
    if not rs: continue
    rate = med(r["rate"] for r in rs)
    us = med(us_per_msg(r) for r in rs)
    cpu = med(r["cpu_s"][str(r["relay_pid"])] / r["seconds"] for r in rs)
    M[(exp, var)] = (rate, us, rs)
    r1090 = [r["rate_10_90"] for r in rs if r.get("rate_10_90")]
    r1090 = med(r1090) if r1090 else float("nan")
    print(f"  {label:34} {rs[0]['n']:7} {rate:12.0f}  {' '.join('%.0f' % r['rate'] for r in rs):26} {r1090:7.0f} {us:12.2f}  {' '.join('%.2f' % us_per_msg(r) for r in rs):20} {cpu:9.0%} {med(r['nginx_requests'] for r in rs):6.0f} {med(r['machine_cpus_busy'] for r in rs):7.2f}")
print("  (msg/s: N / time from the reload that turns delivery on to the last recorded delivery; 10-90%: median rate between 10% and 90% delivered;")
print("   relay us/msg: utime+stime of the relay over the drain / N; relay CPU: share of one core; req: nginx requests; machine: CPUs busy during the drain)")
print()
def paired(exp, a, b, f):
    A = {r["round"]: r for r in runs(exp, a)}; B = {r["round"]: r for r in runs(exp, b)}
    return [f(A[k], B[k]) for k in sorted(A) if k in B]
def goal(ok): return "met" if ok else "MISSED"
print(f"  {'figure':52} {'value':>9}  {'per round':24} goal")
for exp, name in (("a", "batch 1"), ("b", "batch 100")):
    if (exp, "outbox") in M and (exp, "cloudevents") in M:
        v = M[(exp, "cloudevents")][0] / M[(exp, "outbox")][0]
        pr = paired(exp, "outbox", "cloudevents", lambda x, y: y["rate"] / x["rate"])
        print(f"  {name + ': cloudevents / outbox msgs/s (medians)':52} {v:9.3f}  {' '.join('%.3f' % x for x in pr):24} >= 0.95 {goal(v >= 0.95)}")
        d = M[(exp, "cloudevents")][1] - M[(exp, "outbox")][1]
        print(f"  {name + ': cloudevents - outbox relay us/msg':52} {d:9.2f}  {' '.join('%.2f' % (us_per_msg(y) - us_per_msg(x)) for x, y in zip(runs(exp, 'outbox'), runs(exp, 'cloudevents'))):24}")
if ("c", "nofilter") in M and ("c", "filter") in M:
    d = M[("c", "filter")][1] - M[("c", "nofilter")][1]
    pr = paired("c", "nofilter", "filter", lambda x, y: us_per_msg(y) - us_per_msg(x))
    print(f"  {'filter: relay us/msg, no filter':52} {M[('c', 'nofilter')][1]:9.2f}")
    print(f"  {'filter: relay us/msg, filter $FILTER':52} {M[('c', 'filter')][1]:9.2f}")
    print(f"  {'filter: difference us/msg (medians)':52} {d:9.2f}  {' '.join('%.2f' % x for x in pr):24} < 2    {goal(d < 2)}")
    v = M[("c", "filter")][0] / M[("c", "nofilter")][0]
    pr = paired("c", "nofilter", "filter", lambda x, y: y["rate"] / x["rate"])
    print(f"  {'filter: filter / no filter msgs/s (medians)':52} {v:9.3f}  {' '.join('%.3f' % x for x in pr):24}")
    filt = [r["stats"]["filtered"] for r in runs("c", "filter") if r.get("stats")]
    print(f"  (outbox.stats.filtered after the filter drains: {filt}; every message matches, so 0 expected)")
print()
print("ANOMALIES:\n  " + anom.replace("\n", "\n  ") if anom else "sanity: every drain delivered exactly N with no dead letters, no lane errors, lag pending 0; the relay kept its pid")
print(slog.rstrip())
PYEOF
