#!/usr/bin/env bash
# retention_soak.sh - ten million messages through the relay with retention
# at work (I8): do the outbox tables and the relay's memory stay flat while
# finished chunks are TRUNCATEd, and does delivery keep the speed of a short
# drain?  On a throwaway cluster and a throwaway nginx.
#
# Run by hand, as root (not in CI):
#
#   test/bench/retention_soak.sh                        # 10 million messages
#   N=1000000 STEP=100000 REV=HEAD test/bench/retention_soak.sh
#   RETENTION=10s NOTIFY=1 OUT=/tmp/rs test/bench/retention_soak.sh
#
# The cluster runs with outbox.retention = 0 (RETENTION): a chunk is emptied
# as soon as every target has finished it and it stopped being current; the
# current chunk moves on every max(retention / 3, 1 s).
#
# Target: "soak", nginx answering 204 on 127.0.0.1 (worker_processes 1,
# access_log off), batch_size 100, 8 lanes, subscribed to '*'; with NOTIFY=1
# also "soak_notify", NOTIFY on a channel nobody listens to, subscribed to
# '*'.  "Delivered" below is the least, over the targets, of the messages
# they finished (outbox.progress: delivered + dead).
#
# What runs:
#   short     SHORT_RUNS times: SHORT_N messages emitted while
#             outbox.enabled = off (the emitters below), CHECKPOINT, then
#             released at once (outbox.enabled = on); time from the reload
#             until every target finished them (polled every 5 ms).  The
#             median rate is the "short drain" the soak is compared with.
#   soak      N messages emitted at full speed (or RATE messages/s) by
#             pgbench, CLIENTS clients, each transaction
#               SELECT count(outbox_emit('t', jsonb_build_object('i', g,
#                      'pad', repeat('x', 100)), 'k' || (g % 1000)))
#                 FROM generate_series(1, BATCH) g
#             while the relay delivers.  Every STEP messages delivered a
#             line: messages delivered, the size of schema outbox (the sum
#             of pg_total_relation_size over its tables: heap, indexes,
#             TOAST), the RssAnon of the 'outbox relay' process
#             (/proc/<pid>/status), the drain rate over those STEP messages,
#             and the messages emitted, the backlog, the current chunk and
#             the TRUNCATEs seen so far.  The size is also sampled every
#             SAMPLE_SECS, for its peak.
#   summary   min/max size, first/last RssAnon, emit and drain rates, the
#             ratio of the soak's drain rate (N over the time from the first
#             emit to the last delivery) to the short drain's, the relay's
#             CPU time per message (utime + stime from /proc) in the soak
#             against the short drain's, the size once the drain settled, and
#             sanity checks (no dead letters, no errors, every lane delivered
#             exactly the messages of its keys, nothing left stored, the relay
#             kept its pid, no crash, no retention warning).
#
# Goal: flat size (the peak over the second half of the soak at most 1.25 x
# the peak over the first half, plus one chunk's worth of slack: 16 MB),
# flat memory (last RssAnon at most the first + max(1 MB, 10%)), and the
# drain rate within 10% of the short drain's (ratio >= 0.90).  When the
# relay keeps up with the emitters the soak's drain rate is the emit rate,
# not the relay's ceiling; the summary says so (on 2 cores the emitters
# cannot outrun the relay), and the relay's CPU per message (at most 1.10 x
# the short drain's) is the figure that shows what retention costs it.
#
# Settings (environment):
#   N=10000000 STEP=1000000       messages emitted; a line every STEP delivered
#   CLIENTS=4 BATCH=1000 RATE=    pgbench clients, messages per transaction,
#                                 messages/s over all clients (empty: full speed)
#   SHORT_N=200000 SHORT_RUNS=3   the short drain
#   RETENTION=0                   outbox.retention (seconds, or '10s', '1min')
#   BATCH_SIZE=100 LANES=8        the HTTP target
#   NOTIFY=0                      1: also a NOTIFY target
#   SAMPLE_SECS=2 POLL_MS=10      size sampling; delivered polling
#   STALL_SECS=120                give up when nothing is delivered this long
#   KEEP=0                        1: keep the cluster directory
#   OUT=DIR                       copy the raw results (JSON lines, pgbench
#                                 logs, server log) there
#   REV=                          build this git revision instead of the
#                                 working tree (e.g. REV=HEAD: committed code only)
#   INSTALL=1                     also install the build system-wide (default
#                                 without REV; 0 with REV); the server itself
#                                 always runs on its private copy
#   PORT=54351 NGINX_PORT=18101   non-default ports, 127.0.0.1 only
#   WAIT_FOR=relay_bench.sh       wait (polling every 30 s) while a process
#                                 whose command line matches runs ('' = no)
set -euo pipefail

N=${N:-10000000}
STEP=${STEP:-1000000}
CLIENTS=${CLIENTS:-4}
BATCH=${BATCH:-1000}
RATE=${RATE:-}
SHORT_N=${SHORT_N:-200000}
SHORT_RUNS=${SHORT_RUNS:-3}
RETENTION=${RETENTION:-0}
BATCH_SIZE=${BATCH_SIZE:-100}
LANES=${LANES:-8}
NOTIFY=${NOTIFY:-0}
SAMPLE_SECS=${SAMPLE_SECS:-2}
POLL_MS=${POLL_MS:-10}
STALL_SECS=${STALL_SECS:-120}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
if [ -n "$REV" ]; then INSTALL=${INSTALL:-0}; else INSTALL=${INSTALL:-1}; fi
PORT=${PORT:-54351}
NGINX_PORT=${NGINX_PORT:-18101}
WAIT_FOR=${WAIT_FOR-relay_bench.sh}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=retsoak

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=retention-soak
BENCH_PACKAGES=()	# pgbench comes with postgresql-15
BENCH_CONF="outbox.retention = '$RETENTION'"
pgbench_pid=
bench_on_exit() {
	[ -n "$pgbench_pid" ] && kill "$pgbench_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

# ---- the database, the targets, the emitters ----------------------------------
# The worker waits for the database, then restarts to connect to it.
psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox" >/dev/null
for _ in $(seq 150); do [ -n "$(worker_pid)" ] && break; sleep 0.2; done
wpid=$(worker_pid)
[ -n "$wpid" ] || { echo "no 'outbox relay' process" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }
[ "$(sql -c "SELECT count(*) FROM outbox.chunks")" = 5 ] ||
	{ echo "outbox.chunks does not list five chunks: is this a build with retention?" >&2; exit 1; }
sql -c "SELECT outbox.create_http_target('soak', '$NGINX_URL', batch_size => $BATCH_SIZE, lanes => $LANES)" \
	-c "SELECT outbox.subscribe('soak', '*')" >/dev/null
if [ "$NOTIFY" = 1 ]; then
	sql -c "SELECT outbox.create_notify_target('soak_notify', 'retention_soak_nobody_listens')" \
		-c "SELECT outbox.subscribe('soak_notify', '*')" >/dev/null
fi
retention_shown=$(sql -c "SHOW outbox.retention")

cat >"$work/emit.sql" <<EOF
SELECT count(outbox_emit('t', jsonb_build_object('i', g, 'pad', repeat('x', 100)), 'k' || (g % 1000))) FROM generate_series(1, $BATCH) g;
EOF
chown "$PGUSER_OS" "$work/emit.sql"
threads=$((CLIENTS < 2 ? CLIENTS : 2))
# Transactions per client for at least $1 messages; sets per_client, total.
plan_emit() {
	local xacts=$((($1 + BATCH - 1) / BATCH))
	per_client=$(((xacts + CLIENTS - 1) / CLIENTS))
	total=$((per_client * CLIENTS * BATCH))
}
# pgbench in the background (pgbench_pid); log in $work/out/pgbench-$1.log.
start_emitters() {	# label [rate messages/s]
	local rate_opt=()
	if [ -n "${2:-}" ]; then
		rate_opt=(-R "$(awk -v r="$2" -v b="$BATCH" 'BEGIN { printf "%.3f", r / b }')")
	fi
	as_pg "$BIN/pgbench" -h "$SOCK" -p "$PORT" -U postgres -n -M prepared -c "$CLIENTS" -j "$threads" \
		-t "$per_client" "${rate_opt[@]}" -f "$work/emit.sql" "$DB" >"$work/out/pgbench-$1.log" 2>&1 &
	pgbench_pid=$!
}
wait_emitters() {	# label
	wait "$pgbench_pid" || { echo "pgbench ($1) failed:" >&2; tail -20 "$work/out/pgbench-$1.log" >&2; exit 1; }
	pgbench_pid=
}
# Every transaction emits keys 'k' || (g % 1000), g = 1 .. BATCH: so the
# messages each lane of the HTTP target must have delivered are known.  Prints
# the lanes where outbox.progress disagrees (nothing when none does).
xacts_all=0
lane_check() {
	sql -F' ' -c "WITH k AS (SELECT outbox.lane_of('k' || (g % 1000), 0, $LANES) AS lane, count(*) AS n
							FROM generate_series(1, $BATCH) g GROUP BY 1)
		SELECT 'lane', p.lane, 'delivered', p.delivered, 'dead', p.dead, 'expected', coalesce(k.n, 0) * $xacts_all,
			   'done_id', p.done_id, 'last_delivered_id', p.last_delivered_id, 'last_error', p.last_error
		  FROM outbox.progress p LEFT JOIN k ON k.lane = p.lane
		 WHERE p.target_id = outbox.target_id('soak') AND p.delivered + p.dead <> coalesce(k.n, 0) * $xacts_all
		 ORDER BY p.lane"
}
set_enabled() {	# on|off
	sql -c "ALTER SYSTEM SET outbox.enabled = $1" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 0.5	# let the worker take the SIGHUP
}

# ---- the monitor: polls the delivered count, samples size and memory ---------------
cat >"$work/monitor.py" <<'PYEOF'
import json, os, sys, time
import psycopg2

host, port, db, mode = sys.argv[1:5]
opts = json.loads(sys.argv[5])
conn = psycopg2.connect(host=host, port=int(port), user="postgres", dbname=db)
conn.autocommit = True
cur = conn.cursor()

def one(q, args=None):
    cur.execute(q, args)
    return cur.fetchone()[0]

DONE_Q = ("SELECT coalesce(min(d), 0)::bigint FROM (SELECT sum(delivered + dead) AS d"
          "  FROM outbox.progress GROUP BY target_id) s")
SIZE_Q = ("SELECT coalesce(sum(pg_total_relation_size(oid)), 0)::bigint FROM pg_class"
          " WHERE relnamespace = 'outbox'::regnamespace AND relkind IN ('r', 'p')")

def rss_anon(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None

CLK_TCK = os.sysconf("SC_CLK_TCK")
def proc_cpu(pid):
    """utime + stime of a process, in seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

def emit_json(d):
    with open(opts["results"], "a") as f:
        f.write(json.dumps(d) + "\n")

truncations = set()
def chunk_state():
    cur.execute("SELECT chunk, is_current, truncated_at::text FROM outbox.chunks")
    current = None
    for chunk, is_cur, tr in cur.fetchall():
        if is_cur:
            current = chunk
        if tr is not None:
            truncations.add((chunk, tr))
    return current

if mode == "short":
    n, base = opts["n"], one(DONE_Q)
    cpu0 = proc_cpu(opts["worker_pid"])
    cur.execute("ALTER SYSTEM SET outbox.enabled = on")
    t0 = time.time()
    cur.execute("SELECT pg_reload_conf()")
    deadline = t0 + opts["stall_secs"]
    while True:
        d = one(DONE_Q) - base
        now = time.time()
        if d >= n or now > deadline:
            break
        time.sleep(0.005)
    secs = now - t0
    cpu = proc_cpu(opts["worker_pid"]) - cpu0
    out = {"kind": "short", "run": opts["run"], "n": n, "done": d, "timed_out": d < n,
           "seconds": round(secs, 3), "rate": round(d / secs, 1),
           "relay_cpu_s": round(cpu, 2), "relay_us_per_msg": round(cpu / max(d, 1) * 1e6, 2)}
    emit_json(out)
    print(json.dumps(out))
    sys.exit(0)

# mode == "soak"
n, step, wpid, epid, t0 = opts["n"], opts["step"], opts["worker_pid"], opts["pgbench_pid"], opts["t0"]
poll, sample_secs, stall = opts["poll_ms"] / 1000.0, opts["sample_secs"], opts["stall_secs"]
base = opts["base"]	# taken before the emitters started
id0 = opts["id0"]
chunk_state()
trunc0 = len(truncations)
emit_end = None
mark = step
prev_t, prev_d = t0, 0
last_t, last_d = t0, 0
last_sample = 0.0
last_change = time.time()
max_backlog = 0
while True:
    d = one(DONE_Q) - base
    now = time.time()
    if emit_end is None and not alive(epid):
        emit_end = now
        emit_json({"kind": "emit_end", "t": now, "seconds": now - t0, "rate": n / (now - t0)})
    if d != last_d:
        last_change = now
    while d >= mark or (d >= n and prev_d < n):
        m = min(mark, n)
        # the time the count passed m, between the last two polls
        tc = now if d == last_d else last_t + (m - last_d) / (d - last_d) * (now - last_t)
        size = one(SIZE_Q)
        emitted = one("SELECT outbox.frontier()") - id0
        chunk = chunk_state()
        rss = rss_anon(wpid)
        rate = (m - prev_d) / (tc - prev_t) if tc > prev_t else None
        max_backlog = max(max_backlog, emitted - d)
        r = {"kind": "step", "t": tc, "delivered": m, "size": size, "rss_anon_kb": rss, "rate": rate,
             "emitted": min(emitted, n), "backlog": max(emitted - d, 0), "current_chunk": chunk,
             "truncations": len(truncations) - trunc0}
        emit_json(r)
        print(f"  delivered {m:>11,}  size {size / 1e6:8.1f} MB  RssAnon {rss if rss is not None else -1:>7,} kB"
              f"  drain {rate or 0:>9,.0f} msg/s  | emitted {r['emitted']:>11,}  backlog {r['backlog']:>9,}"
              f"  chunk {chunk}  truncations {r['truncations']}", flush=True)
        prev_t, prev_d = tc, m
        if m >= n:
            break
        mark += step
    last_t, last_d = now, d
    if d >= n:
        break
    if now - last_sample >= sample_secs:
        last_sample = now
        emitted = one("SELECT outbox.frontier()") - id0
        max_backlog = max(max_backlog, emitted - d)
        emit_json({"kind": "sample", "t": now, "delivered": d, "emitted": emitted, "size": one(SIZE_Q),
                   "rss_anon_kb": rss_anon(wpid), "current_chunk": chunk_state(),
                   "truncations": len(truncations) - trunc0})
    if now - last_change > stall:
        emit_json({"kind": "stalled", "t": now, "delivered": d})
        print(f"nothing delivered for {stall} s at {d} of {n}", file=sys.stderr)
        sys.exit(2)
    time.sleep(poll)
if emit_end is None:
    # the emitters are done: the last message was delivered
    while alive(epid):
        time.sleep(0.01)
    emit_end = time.time()
    emit_json({"kind": "emit_end", "t": emit_end, "seconds": emit_end - t0, "rate": n / (emit_end - t0)})
cpu = proc_cpu(wpid) - opts["cpu0"]
emit_json({"kind": "drain_end", "t": prev_t, "seconds": prev_t - t0, "rate": n / (prev_t - t0),
           "relay_cpu_s": round(cpu, 2), "relay_us_per_msg": round(cpu / n * 1e6, 2),
           "max_backlog": max_backlog, "truncations": len(truncations) - trunc0})
PYEOF
monitor() { "$PY" "$work/monitor.py" "$SOCK" "$PORT" "$DB" "$@"; }

# ---- is the machine quiet? ----------------------------------------------------------
# machine_busy: common.sh
busy_before=$(machine_busy 2)
log "outbox $build_rev (outbox.so $build_md5); outbox.retention = $retention_shown; relay pid $wpid;" \
	"machine busy before the runs: $busy_before of $(nproc) CPUs"
record "{\"kind\": \"start\", \"rev\": \"$build_rev\", \"md5\": \"$build_md5\", \"retention\": \"$retention_shown\",
	\"busy_before\": $busy_before, \"worker_pid\": $wpid, \"n\": $N, \"step\": $STEP, \"clients\": $CLIENTS,
	\"batch\": $BATCH, \"rate\": \"$RATE\", \"batch_size\": $BATCH_SIZE, \"lanes\": $LANES, \"notify\": $NOTIFY}"

# ---- the short drain ---------------------------------------------------------------
plan_emit "$SHORT_N"
short_n=$total
log "short drain: $SHORT_RUNS x $short_n messages emitted with outbox.enabled = off, then released"
for ((r = 1; r <= SHORT_RUNS; r++)); do
	set_enabled off
	start_emitters "short-$r"
	wait_emitters "short-$r"
	xacts_all=$((xacts_all + per_client * CLIENTS))
	sql -c "CHECKPOINT" >/dev/null
	out=$(monitor short "{\"n\": $short_n, \"run\": $r, \"worker_pid\": $wpid, \"stall_secs\": $STALL_SECS, \"results\": \"$RESULTS\"}")
	log "  short drain $r: $out"
	echo "$out" | grep -q '"timed_out": false' || { echo "short drain $r did not finish" >&2; exit 1; }
	sleep 3	# retention = 0: the drained chunk is emptied after a rotation or two
done

# ---- the soak --------------------------------------------------------------------------
plan_emit "$N"
n_total=$total
sleep 2
id0=$(sql -c "SELECT outbox.frontier()")
size0=$(sql -c "SELECT sum(pg_total_relation_size(oid)) FROM pg_class WHERE relnamespace = 'outbox'::regnamespace AND relkind IN ('r', 'p')")
rss0=$(awk '/^RssAnon:/ {print $2}' "/proc/$wpid/status")
record "{\"kind\": \"soak_start\", \"size\": $size0, \"rss_anon_kb\": $rss0, \"id0\": $id0, \"n\": $n_total}"
log "soak: $n_total messages, $CLIENTS clients x $per_client transactions of $BATCH, ${RATE:-full speed}${RATE:+ messages/s};" \
	"a line every $STEP delivered; size at the start $((size0 / 1000000)) MB, relay RssAnon $rss0 kB"
echo "retention soak: outbox $build_rev, outbox.retention = $retention_shown, target batch_size $BATCH_SIZE x $LANES lanes$([ "$NOTIFY" = 1 ] && echo ' + NOTIFY')"
done_sql="SELECT coalesce(min(d), 0) FROM (SELECT sum(delivered + dead) AS d FROM outbox.progress GROUP BY target_id) s"
base0=$(sql -c "$done_sql")
cpu0=$(sed 's/.*) //' "/proc/$wpid/stat" | awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($12 + $13) / hz}')
t0=$(date +%s.%N)
start_emitters soak "$RATE"
xacts_all=$((xacts_all + per_client * CLIENTS))
rc=0
monitor soak "{\"n\": $n_total, \"step\": $STEP, \"worker_pid\": $wpid, \"pgbench_pid\": $pgbench_pid, \"t0\": $t0,
	\"id0\": $id0, \"base\": $base0, \"cpu0\": $cpu0, \"poll_ms\": $POLL_MS, \"sample_secs\": $SAMPLE_SECS, \"stall_secs\": $STALL_SECS, \"results\": \"$RESULTS\"}" || rc=$?
if [ "$rc" != 0 ]; then
	{
		echo "the soak stopped (monitor exit $rc); frontier $(sql -c "SELECT outbox.frontier()") (ids from $id0)"
		lane_check
		sql -c "SELECT * FROM outbox.lag"
		sql -c "SELECT chunk, is_current, rotated_at, truncated_at, (SELECT count(*) FROM outbox.messages) AS rows_stored FROM outbox.chunks ORDER BY chunk"
		echo "nginx requests: $(nginx_requests)"
	} | tee "$work/out/stall.txt" >&2
	exit 1
fi
wait_emitters soak

# ---- after the drain: let retention empty the last chunks -------------------------------
settle_size=
for _ in $(seq 30); do
	sleep 1
	settle_size=$(sql -c "SELECT sum(pg_total_relation_size(oid)) FROM pg_class WHERE relnamespace = 'outbox'::regnamespace AND relkind IN ('r', 'p')")
	[ "$(sql -c "SELECT count(*) FROM (SELECT 1 FROM outbox.messages LIMIT 1) s")" = 0 ] && break
done
left=$(sql -c "SELECT count(*) FROM outbox.messages")
rss_end=$(awk '/^RssAnon:/ {print $2}' "/proc/$wpid/status" 2>/dev/null || echo 0)
checks=$(sql -F' ' -c "SELECT coalesce(sum(dead), 0), count(*) FILTER (WHERE last_error IS NOT NULL),
		(SELECT count(*) FROM outbox.dead_letters), (SELECT coalesce(sum(pending), 0) FROM outbox.lag)
	FROM outbox.progress")
read -r dead errs dls pending <<<"$checks"
record "{\"kind\": \"end\", \"size\": $settle_size, \"rows_left\": $left, \"rss_anon_kb\": ${rss_end:-0},
	\"dead\": $dead, \"lanes_with_error\": $errs, \"dead_letters\": $dls, \"pending\": $pending}"
[ "$dead" = 0 ] && [ "$dls" = 0 ] || echo "dead letters: $dead ($dls rows)" >>"$work/anomalies"
[ "$errs" = 0 ] || echo "lanes with a last error: $errs ($(sql -c "SELECT string_agg(DISTINCT last_error, '; ') FROM outbox.progress"))" >>"$work/anomalies"
[ "$pending" = 0 ] || echo "outbox.lag shows $pending pending at the end" >>"$work/anomalies"
[ "$left" = 0 ] || echo "$left messages still stored 30 s after the drain (outbox.chunks: $(sql -c "SELECT string_agg(format('%s%s rotated %s truncated %s', chunk, CASE WHEN is_current THEN '*' END, rotated_at, truncated_at), '; ' ORDER BY chunk) FROM outbox.chunks"))" >>"$work/anomalies"
lanes_off=$(lane_check)
[ -z "$lanes_off" ] || echo "lanes of target soak whose delivered count is not what was emitted: $lanes_off" >>"$work/anomalies"
[ "$(worker_pid)" = "$wpid" ] || echo "the relay worker changed pid: $wpid -> $(worker_pid)" >>"$work/anomalies"
grep -Eq 'PANIC|TRAP|terminated by signal' "$SERVERLOG" && echo "the server log shows a crash" >>"$work/anomalies"
nwarn=$(grep -c 'could not remove delivered messages' "$SERVERLOG" || true)
[ "$nwarn" = 0 ] || echo "$nwarn retention warnings in the server log: $(grep 'could not remove delivered messages' "$SERVERLOG" | tail -1)" >>"$work/anomalies"
sql -c "SELECT chunk, relname, is_current, current_since, rotated_at, truncated_at FROM outbox.chunks ORDER BY chunk" >"$work/out/chunks.txt"

# ---- the summary -------------------------------------------------------------------------
"$PY" - "$RESULTS" "$work/anomalies" "$work/out/pgbench-soak.log" <<'PYEOF'
import json, os, statistics, sys
res = [json.loads(l) for l in open(sys.argv[1])]
kind = lambda k: [r for r in res if r["kind"] == k]
start, soak0, end = kind("start")[0], kind("soak_start")[0], kind("end")[0]
shorts = kind("short")
steps = kind("step")
emit_end, drain_end = kind("emit_end")[0], kind("drain_end")[0]
samples = kind("sample")
short_rate = statistics.median(r["rate"] for r in shorts)
print()
print(f"outbox retention soak ({start['rev']}, outbox.retention = {start['retention']}; "
      f"{soak0['n']:,} messages, {start['clients']} clients x {start['batch']} per transaction, "
      f"{'full speed' if not start['rate'] else start['rate'] + ' messages/s'}; "
      f"machine busy before: {start['busy_before']} CPUs)")
print(f"  short drain ({shorts[0]['n']:,} messages, {len(shorts)} runs): "
      + ", ".join(f"{r['rate']:,.0f}" for r in shorts) + f" msg/s; median {short_rate:,.0f} msg/s")
for line in open(sys.argv[3]):
    if line.startswith(("tps", "latency average")):
        print("  pgbench (soak): " + line.strip())
sizes = [r["size"] for r in steps]
peak = max([s["size"] for s in samples] + sizes)
anon = [r["rss_anon_kb"] for r in steps]
ratio = drain_end["rate"] / short_rate
print(f"  emit: {emit_end['rate']:,.0f} msg/s ({emit_end['seconds']:.1f} s); drain: {drain_end['rate']:,.0f} msg/s "
      f"({drain_end['seconds']:.1f} s from the first emit to the last delivery); backlog at most {drain_end['max_backlog']:,}; "
      f"{drain_end['truncations']} chunk TRUNCATEs")
short_us = statistics.median(r["relay_us_per_msg"] for r in shorts)
cpu_ratio = drain_end["relay_us_per_msg"] / short_us if short_us else float("nan")
print(f"  relay CPU per message: {drain_end['relay_us_per_msg']:.2f} us in the soak ({drain_end['relay_cpu_s']:.1f} s), "
      f"{short_us:.2f} us in the short drain (median): {cpu_ratio:.2f} x")
steady = [r["rate"] for r in steps[1:] if r["rate"]]
if steady:
    print(f"  drain rate per {steps[0]['delivered']:,} after the first: min {min(steady):,.0f}, "
          f"median {statistics.median(steady):,.0f}, max {max(steady):,.0f} msg/s")
print(f"  size of schema outbox: {soak0['size'] / 1e6:.1f} MB at the start; at the steps min {min(sizes) / 1e6:.1f} MB, "
      f"max {max(sizes) / 1e6:.1f} MB; peak of all samples {peak / 1e6:.1f} MB; {end['size'] / 1e6:.1f} MB once settled "
      f"({end['rows_left']} rows left)")
print(f"  relay RssAnon: {soak0['rss_anon_kb']:,} kB at the start; first step {anon[0]:,} kB, last {anon[-1]:,} kB "
      f"(min {min(anon):,}, max {max(anon):,}); {end['rss_anon_kb']:,} kB at the end")
emitter_bound = (drain_end["seconds"] - emit_end["seconds"]) <= max(1.0, 0.05 * drain_end["seconds"])
goals = []
if len(steps) >= 2:
    h = len(steps) // 2
    p1 = max(r["size"] for r in steps[:h])
    p2 = max(r["size"] for r in steps[h:])
    goals.append(("flat size", p2 <= 1.25 * p1 + 16e6, f"peak {p1 / 1e6:.1f} MB in the first half, {p2 / 1e6:.1f} MB in the second"))
else:
    goals.append(("flat size", None, "one step only"))
goals.append(("flat memory", anon[-1] <= anon[0] + max(1024, 0.1 * anon[0]), f"RssAnon {anon[0]:,} -> {anon[-1]:,} kB"))
goals.append(("drain rate", ratio >= 0.90, f"{ratio:.2f} x the short drain"
              + (" (the relay kept up with the emitters: this is the emit rate, not the relay's ceiling)" if emitter_bound else "")))
goals.append(("relay CPU per message", cpu_ratio <= 1.10, f"{cpu_ratio:.2f} x the short drain's"))
for name, ok, why in goals:
    print(f"  goal {name}: {'met' if ok else 'NOT met' if ok is not None else 'n/a'} ({why})")
print(f"SUMMARY: size min {min(sizes) / 1e6:.1f} MB max {max(sizes) / 1e6:.1f} MB; RssAnon first {anon[0]:,} kB last {anon[-1]:,} kB; "
      f"emit {emit_end['rate']:,.0f} msg/s; drain {drain_end['rate']:,.0f} msg/s = {ratio:.2f} x short drain {short_rate:,.0f} msg/s"
      f"{' (emitter-bound)' if emitter_bound else ''}; relay CPU/message {cpu_ratio:.2f} x short drain's")
anom = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else ""
print("ANOMALIES: " + anom.replace("\n", "; ") if anom else
      "sanity: no dead letters, no lane errors, nothing pending or stored at the end, the relay kept its pid, no crash or retention warning in the server log")
PYEOF
