#!/usr/bin/env bash
# queue_bench.sh - receive-and-commit throughput and wake-up latency of
# outbox.receive() against PgQ (Debian's postgresql-15-pgq3) and a
# hand-rolled SKIP LOCKED queue table, side by side on one throwaway
# PostgreSQL 15 server.
#
# Run by hand, as root (not in CI):
#
#   test/bench/queue_bench.sh        # 6 minutes on 2 quiet cores, 12 on busy ones
#   OUT=/tmp/qb test/bench/queue_bench.sh   # keep the raw results
#   ROUNDS=5 MESSAGES=200000 MESSAGES_B1=50000 MAX_SECS=60 test/bench/queue_bench.sh  # bigger backlogs, much longer
#   SYSTEMS="pgq hand" LAT_SYSTEMS=hand test/bench/queue_bench.sh   # without outbox
#
# What it measures (client and server on 127.0.0.1, one machine; clients are
# test/bench/queue_bench_tool.py, one process per consumer, statements
# PREPAREd, jsonb and timestamptz handed to the client as text):
#   drain     a preloaded backlog (MESSAGES messages, MESSAGES_B1 for batch 1;
#             KEYS keys 'key-' || (g % KEYS); the ~220-byte jsonb of
#             bench_payload(g), g = 1..N in order, emitted by one session) is
#             drained by C consumer processes, each looping on one transaction
#             per receive of at most B messages:
#               outbox  queue 'q' subscribed to topic 'bench', filled with
#                       outbox_emit('bench', bench_payload(g), key) in
#                       transactions of CHUNK messages;
#                       BEGIN; SELECT * FROM outbox.receive('q', B); COMMIT
#               pgq     pgq.create_queue('q'), consumer c1 registered, filled
#                       with pgq.insert_event('q', 'bench', payload::text, key,
#                       ...) in transactions of B events with a pgq.ticker('q')
#                       after each (ticker_max_count = B), so that batches
#                       hold B events (the first 2B), as a live ticker with those
#                       settings would have cut them; a thread calls pgq.ticker() every
#                       TICK_MS during the drain (there is no pgqd);
#                       BEGIN; pgq.next_batch; pgq.get_batch_events;
#                       pgq.finish_batch; COMMIT
#               hand    hand_q (id bigserial primary key, key text, payload
#                       jsonb), filled with one INSERT ... SELECT;
#                       BEGIN; DELETE FROM hand_q WHERE id IN (SELECT id FROM
#                       hand_q ORDER BY id FOR UPDATE SKIP LOCKED LIMIT B)
#                       RETURNING *; COMMIT
#             A consumer that receives nothing commits, sleeps EMPTY_SLEEP_MS
#             and tries again.  Timed: from all consumers connected to the
#             last COMMIT that acknowledged messages (at most MAX_SECS: a drain
#             cut there counts what it received in that time).  Per
#             batch (BATCHES) x consumers (CONSUMERS) x system (SYSTEMS); each
#             system is preloaded (then VACUUM ANALYZE, CHECKPOINT) just
#             before its timed run; the systems alternate within every round,
#             their order rotating from round to round; medians over ROUNDS,
#             and the goal ratios also per round (systems measured side by side).
#   ceiling   (CEILING=1) at batch 1, the same consumers running a transaction
#             that is no queue at all (an INSERT into an index-less table, so
#             that its COMMIT flushes WAL like a receive's): what the client,
#             three round trips and a commit flush cost on this machine, the
#             most any queue can reach at batch 1 with these clients.
#   PgQ and several consumers: PgQ is not a competing-consumer queue, every
#             registered consumer gets every event, and the cooperative
#             consumers (pgq_coop) are not part of pgq3.  With PGQ_MULTI=
#             partitioned (default) C > 1 means C registered consumers that
#             each read every batch and keep the events whose key hashes to
#             them (crc32(key) % C): the usual way to spread one PgQ queue over
#             processes, keeping per-key order; each message counts once.
#             PGQ_MULTI=skip measures PgQ with 1 consumer only.
#   order     with C > 1, per-key order violations seen by the consumers:
#             a message is one when a message of its key emitted after it was
#             acknowledged by a transaction whose COMMIT had returned before
#             the message's own transaction sent its COMMIT (in commit order,
#             certain ones only); plus duplicates.  outbox promises per-key
#             order, the others do not (PgQ partitioned keeps it by design).
#   latency   one producer emits LAT_RATE messages/s for LAT_SECS s, each in
#             its own transaction (BEGIN; emit; COMMIT), while one receiver
#             waits; percentiles of (receive returned) - (the producer's COMMIT
#             returned), and - (COMMIT sent):
#               outbox  BEGIN; SELECT * FROM outbox.receive('q', 1, 5000); COMMIT
#               hand    LISTEN hand_q; the producer's transaction does INSERT
#                       and NOTIFY hand_q; the receiver's DELETE ... LIMIT 1
#                       and, finding nothing, waits for a notification
#               pgq     ticker every LAT_TICK_MS (ticker_max_count 1), receiver
#                       polling next_batch every LAT_POLL_MS (for information)
#             OUT=DIR keeps every message's times (latency-SYSTEM-*.jsonl, clock
#             CLOCK_MONOTONIC seconds; outbox: also every receive call's).
#
# Charts: after the report, test/bench/bench_charts.py draws the report's
# figures with gnuplot (Debian: gnuplot-nox) as SVG into the results
# directory (OUT=DIR), each next to the .dat file of its figures and the .gp
# script that plotted it (cd DIR && gnuplot NAME.gp draws it again):
#   queue-receive.svg  receive-and-commit throughput (medians) per batch (a
#                      panel each) and consumers: outbox, PgQ, hand-rolled, ceiling
#   queue-latency.svg  p50/p90/p99 of the latency runs (when LAT_SYSTEMS is set)
# Packages: common.sh's (curl, nginx, python3-psycopg2; nginx is not started)
# plus postgresql-15-pgq3 and gnuplot-nox (the charts), through
# test/install-deps.sh.
#
# Settings (environment):
#   ROUNDS=3 MESSAGES=100000 MESSAGES_B1=10000 KEYS=20 CHUNK=10000
#                               (MESSAGES_B1: the batch-1 backlog; PgQ's takes one
#                               transaction and one tick per message to preload)
#   BATCHES="1 100" CONSUMERS="1 4" SYSTEMS="outbox pgq hand"
#   PGQ_MULTI=partitioned|skip  (above)
#   MAX_SECS=15                 cap of one timed drain
#   EMPTY_SLEEP_MS=1 TICK_MS=20
#   LAT_RATE=200 LAT_SECS=15 LAT_SYSTEMS="outbox hand pgq" ('' = none)
#   LAT_TICK_MS=10 LAT_POLL_MS=10
#   KEEP=0 OUT=DIR              keep the throwaway directory / copy the raw
#                               results (JSON lines), the charts and the server
#                               log to DIR
#   REV=                        build this git revision instead of the working tree
#   PORT=54351                  non-default port, 127.0.0.1 (and a private socket) only
#   WAIT_FOR='relay_bench.sh|emit_bench.sh|soak.sh'  wait (polling every 30 s)
#                               while a process whose command line matches runs ('' = no)
#   CEILING=1                   at batch 1, also time consumers that only run
#                               BEGIN; INSERT INTO ceiling_t VALUES (1)
#                               RETURNING 1; COMMIT (no queue: about the least
#                               a transaction that flushes its commit costs here:
#                               client, round trips, WAL flush)
#   QUIET_MAX=0.5 QUIET_WAIT=5  before every measurement wait (at most
#                               QUIET_WAIT s) until at most QUIET_MAX CPUs are
#                               busy; runs measured on a busy machine are
#                               listed as anomalies
# The build is never installed system-wide (INSTALL is forced to 0): the
# server runs on its private copy of the library and extension directories.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
MESSAGES=${MESSAGES:-100000}
MESSAGES_B1=${MESSAGES_B1:-10000}
KEYS=${KEYS:-20}
CHUNK=${CHUNK:-10000}
BATCHES=${BATCHES:-"1 100"}
CONSUMERS=${CONSUMERS:-"1 4"}
SYSTEMS=${SYSTEMS:-"outbox pgq hand"}
PGQ_MULTI=${PGQ_MULTI:-partitioned}
MAX_SECS=${MAX_SECS:-15}
EMPTY_SLEEP_MS=${EMPTY_SLEEP_MS:-1}
TICK_MS=${TICK_MS:-20}
LAT_RATE=${LAT_RATE:-200}
LAT_SECS=${LAT_SECS:-15}
LAT_SYSTEMS=${LAT_SYSTEMS-"outbox hand pgq"}
LAT_TICK_MS=${LAT_TICK_MS:-10}
LAT_POLL_MS=${LAT_POLL_MS:-10}
CEILING=${CEILING:-1}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=0
PORT=${PORT:-54351}
NGINX_PORT=
WAIT_FOR=${WAIT_FOR-'relay_bench.sh|emit_bench.sh|soak.sh'}
QUIET_MAX=${QUIET_MAX:-0.5}
QUIET_WAIT=${QUIET_WAIT:-5}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

case "$PORT" in 65432 | 65442 | 54339) echo "PORT=$PORT is used by others; pick another" >&2; exit 1 ;; esac
case "$PGQ_MULTI" in partitioned | skip) ;; *) echo "PGQ_MULTI must be partitioned or skip" >&2; exit 1 ;; esac
for s in $SYSTEMS $LAT_SYSTEMS; do
	case "$s" in outbox | pgq | hand) ;; *) echo "unknown system '$s' (outbox, pgq, hand)" >&2; exit 1 ;; esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=queue-bench
BENCH_PACKAGES=(postgresql-15-pgq3 gnuplot-nox)
BENCH_CONF="max_connections = 30"
. "$here/common.sh"
bench_setup
qtool() { "$PY" "$here/queue_bench_tool.py" "${PGARGS[@]}" "$@"; }

psqlq -d postgres -c "CREATE DATABASE $DB"
sql >/dev/null <<SQL
CREATE EXTENSION outbox;
CREATE EXTENSION pgq;

-- ~220 bytes of JSON text; order_id is the emitting order the consumers check
CREATE FUNCTION bench_payload(g bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS \$\$
	SELECT jsonb_build_object('order_id', g, 'customer_id', 100000 + g % 1000,
							  'status', 'created', 'amount', 123.45, 'currency', 'EUR',
							  'sku', 'SKU-' || lpad(g::text, 8, '0'),
							  'created_at', '2024-01-01T12:00:00Z', 'note', repeat('p', 50))
\$\$;

-- CEILING=1: a table without an index that the ceiling consumers insert into
CREATE TABLE ceiling_t (v int);

CREATE TABLE hand_q (
	id		bigserial PRIMARY KEY,
	key		text,
	payload	jsonb
);

-- PgQ's backlog: transactions of b events, a tick after each (the queue's
-- ticker_max_count is b, so pgq.ticker() ticks every time).
CREATE PROCEDURE pgq_preload(n bigint, b int, keys int)
LANGUAGE plpgsql AS \$\$
DECLARE
	lo bigint := 1;
BEGIN
	WHILE lo <= n LOOP
		PERFORM pgq.insert_event('q', 'bench', bench_payload(g)::text, 'key-' || (g % keys), NULL, NULL, NULL)
			FROM generate_series(lo, least(lo + b - 1, n)) g;
		COMMIT;
		PERFORM pgq.ticker('q');
		COMMIT;
		lo := lo + b;
	END LOOP;
END
\$\$;
SQL
payload=$(sql -c "SELECT bench_payload(1)::text")
payload_bytes=${#payload}

# ---- helpers ------------------------------------------------------------------

# ---- preloading, one function per system ------------------------------------------
# Each empties its system, fills it with messages 1..$1 and leaves it vacuumed
# and checkpointed.

emit_chunks() {	# n: outbox_emit 1..n in transactions of CHUNK
	local n=$1 lo hi
	for ((lo = 1; lo <= n; lo += CHUNK)); do
		hi=$((lo + CHUNK - 1))
		[ "$hi" -gt "$n" ] && hi=$n
		sql -c "SET synchronous_commit = off" \
			-c "SELECT count(outbox_emit('bench', bench_payload(g), 'key-' || (g % $KEYS))) FROM generate_series($lo, $hi) g" >/dev/null
	done
}

preload_outbox() {	# n batch consumers
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets WHERE name = 'q'" >/dev/null
	sql -c "TRUNCATE outbox.messages" >/dev/null
	sql -c "SELECT outbox.create_queue('q')" -c "SELECT outbox.subscribe('q', 'bench')" >/dev/null
	emit_chunks "$1"
	sql -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
	local cnt
	cnt=$(sql -c "SELECT pending FROM outbox.queues WHERE queue = 'q'")
	[ "$cnt" = "$1" ] || echo "preload outbox: outbox.queues.pending = $cnt, expected $1" | tee -a "$work/anomalies" >&2
}
left_outbox() { sql -c "SELECT pending FROM outbox.queues WHERE queue = 'q'"; }

preload_pgq() {	# n batch consumers
	local n=$1 b=$2 c=$3 i
	[ "$PGQ_MULTI" = partitioned ] || c=1
	sql -c "SELECT pgq.drop_queue('q', true) FROM pgq.queue WHERE queue_name = 'q'" >/dev/null
	sql -c "SELECT pgq.create_queue('q')" \
		-c "SELECT pgq.set_queue_config('q', 'ticker_max_count', '$b')" \
		-c "SELECT pgq.set_queue_config('q', 'ticker_max_lag', '3 seconds')" \
		-c "SELECT pgq.set_queue_config('q', 'ticker_idle_period', '1 minute')" >/dev/null
	for ((i = 1; i <= c; i++)); do
		sql -c "SELECT pgq.register_consumer('q', 'c$i')" >/dev/null
	done
	sql -c "SET synchronous_commit = off" -c "CALL pgq_preload($n, $b, $KEYS)" >/dev/null
	# a last tick for a short last chunk
	sql -c "SELECT pgq.set_queue_config('q', 'ticker_max_count', '1')" -c "SELECT pgq.ticker('q')" \
		-c "SELECT pgq.set_queue_config('q', 'ticker_max_count', '$b')" >/dev/null
	sql -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
	local cnt
	cnt=$(sql -c "SELECT count(*) FROM pgq.event_$(sql -c "SELECT queue_id FROM pgq.queue WHERE queue_name = 'q'")")
	[ "$cnt" = "$n" ] || echo "preload pgq: $cnt events in the queue, expected $n" | tee -a "$work/anomalies" >&2
}
left_pgq() {	# pending events of consumer c1 (with PGQ_MULTI=partitioned and C > 1
	# a consumer may stop with batches of others' events unread)
	sql -c "SELECT coalesce(sum(pending_events), 0) FROM pgq.get_consumer_info('q', 'c1')"
}

preload_hand() {	# n batch consumers
	sql -c "TRUNCATE hand_q RESTART IDENTITY" \
		-c "SET synchronous_commit = off" \
		-c "INSERT INTO hand_q (key, payload) SELECT 'key-' || (g % $KEYS), bench_payload(g) FROM generate_series(1, $1) g" \
		-c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
}
left_hand() { sql -c "SELECT count(*) FROM hand_q"; }

preload_ceiling() { sql -c "TRUNCATE ceiling_t" -c "CHECKPOINT" >/dev/null; }
left_ceiling() { echo 0; }

run_drain() {	# system batch consumers round
	local s=$1 b=$2 c=$3 r=$4 n out left t0 t1
	n=$MESSAGES
	[ "$b" = 1 ] && n=$MESSAGES_B1
	t0=$(date +%s.%N)
	"preload_$s" "$n" "$b" "$c"
	t1=$(date +%s.%N)
	wait_quiet "$s batch $b, $c consumer(s), round $r"
	out=$(qtool drain --system "$s" --consumers "$c" --batch "$b" --n "$n" --max-secs "$MAX_SECS" \
		--empty-sleep-ms "$EMPTY_SLEEP_MS" --tick-ms "$TICK_MS" --pgq-mode partitioned) ||
		echo "drain $s b$b c$c r$r failed: $out" | tee -a "$work/anomalies" >&2
	left=$("left_$s")
	record "{\"kind\": \"drain\", \"round\": $r, \"busy_before\": $BUSY, \"left_after\": ${left:-null},
		\"preload_s\": $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')}" "$out"
	log "  $s b$b c$c: $out; left $left"
	if echo "$out" | grep -q '"drained": true' && [ "${left:-x}" != 0 ] && { [ "$s" != pgq ] || [ "$c" = 1 ]; }; then
		echo "$s b$b c$c r$r: drained by the consumers' count, but $left left in the system" >>"$work/anomalies"
	fi
	if echo "$out" | grep -q '"duplicates": [1-9]'; then
		echo "$s b$b c$c r$r: duplicates: $out" >>"$work/anomalies"
	fi
}

# ---- the timed rounds ------------------------------------------------------------
busy_before=$(machine_busy 2)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "machine busy before the runs: $busy_before of $(nproc) CPUs; load $load_before"
read -r -a slist <<<"$SYSTEMS"
ns=${#slist[@]}
log "plan: $ROUNDS rounds of: for batch in {$BATCHES} x consumers in {$CONSUMERS}: $SYSTEMS (rotating); then latency ($LAT_SYSTEMS)"
for ((r = 1; r <= ROUNDS; r++)); do
	log "round $r"
	for b in $BATCHES; do
		for c in $CONSUMERS; do
			for ((i = 0; i < ns; i++)); do
				s=${slist[$(((i + r - 1) % ns))]}
				if [ "$s" = pgq ] && [ "$c" -gt 1 ] && [ "$PGQ_MULTI" = skip ]; then continue; fi
				run_drain "$s" "$b" "$c" "$r"
			done
			if [ "$CEILING" = 1 ] && [ "$b" = 1 ]; then run_drain ceiling "$b" "$c" "$r"; fi
		done
	done
done

# ---- latency --------------------------------------------------------------------
for s in $LAT_SYSTEMS; do
	log "latency: $s, $LAT_RATE msg/s for ${LAT_SECS}s"
	case $s in
	outbox) preload_outbox 0 1 1 ;;
	hand) preload_hand 0 1 1 ;;
	pgq)
		preload_pgq 0 1 1
		sql -c "SELECT pgq.set_queue_config('q', 'ticker_max_count', '1')" \
			-c "SELECT pgq.set_queue_config('q', 'ticker_max_lag', '1 second')" >/dev/null
		;;
	esac
	wait_quiet "latency $s"
	out=$(qtool latency --system "$s" --rate "$LAT_RATE" --seconds "$LAT_SECS" --keys "$KEYS" \
		--tick-ms "$LAT_TICK_MS" --poll-ms "$LAT_POLL_MS" --out "$work/out/latency-$s-$SECONDS.jsonl") ||
		echo "latency $s failed: $out" | tee -a "$work/anomalies" >&2
	record "{\"kind\": \"latency\", \"busy_before\": $BUSY}" "$out"
	log "  $out"
done

# ---- server log -------------------------------------------------------------------------
set +o pipefail
{
	if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
		echo "SERVER LOG shows a crash:"
		grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
	fi
	echo "server log: $(grep -c 'ERROR' "$SERVERLOG" || true) ERROR, $(grep -c 'WARNING' "$SERVERLOG" || true) WARNING, $(grep -c 'FATAL' "$SERVERLOG" || true) FATAL lines"
	grep -E 'ERROR|WARNING|FATAL' "$SERVERLOG" | sed -E 's/^.*(ERROR|WARNING|FATAL)/\1/' | sort | uniq -c | sort -rn | head -10
} >"$work/out/serverlog.txt"
set -o pipefail
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- report -------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$work/anomalies" "$work/out/serverlog.txt" <<PYEOF
import json, statistics, sys, os
res = [json.loads(l) for l in open(sys.argv[1])]
anom = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else ""
slog = open(sys.argv[3]).read()
med = statistics.median
systems = "$SYSTEMS".split()
if any(r["kind"] == "drain" and r.get("system") == "ceiling" for r in res):
    systems.append("ceiling")
names = {"outbox": "outbox", "pgq": "PgQ", "hand": "hand-rolled", "ceiling": "ceiling"}
drains = [r for r in res if r["kind"] == "drain" and r.get("rate")]
def runs(s, b, c):
    return [r for r in drains if r["system"] == s and r["batch"] == b and r["consumers"] == c]
def m(s, b, c, f="rate"):
    v = [r[f] for r in runs(s, b, c) if r.get(f) is not None]
    return med(v) if v else None

print()
print("queue benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("  outbox built from $build_rev (outbox.so md5 $build_md5); PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); pgq $(sql -c "SELECT extversion FROM pg_extension WHERE extname = 'pgq'"); $(nproc) cores")
print("  machine before: $busy_before CPUs busy, load $load_before; after: load $load_after")
print("  backlog: $MESSAGES messages ($MESSAGES_B1 for batch 1), $KEYS keys, payload $payload_bytes bytes of JSON; $ROUNDS rounds; synchronous_commit=on; empty receive: sleep ${EMPTY_SLEEP_MS} ms; drains capped at ${MAX_SECS} s")
print("  PgQ with >1 consumer: " + ("$PGQ_MULTI" == "partitioned" and "C registered consumers, each reads every batch, keeps crc32(key) % C == its number" or "not measured (every consumer gets every event)"))
print()
print("receive-and-commit throughput, messages/s, medians (runs)")
hdr = f"  {'batch':>5} {'cons':>4}"
for s in systems:
    hdr += f"  {names[s]:>24}"
print(hdr)
cfgs = sorted({(r["batch"], r["consumers"]) for r in drains})
for b, c in cfgs:
    line = f"  {b:5} {c:4}"
    for s in systems:
        v = m(s, b, c)
        rr = runs(s, b, c)
        cell = "-" if v is None else f"{v:8.0f} (" + " ".join(f"{r['rate']:.0f}" + ("*" if not r["drained"] else "") for r in rr) + ")"
        line += f"  {cell:>24}"
    print(line)
print("  (* = cut at MAX_SECS, rate of what was received by then)")
if "ceiling" in systems:
    print("  (ceiling: no queue, BEGIN; INSERT INTO ceiling_t VALUES (1) RETURNING 1; COMMIT per message: client + round trips + commit flush)")
print()
print("details (medians): avg messages per transaction, empty receives, client CPU s, CPUs busy during / just before the drain, seconds, preload s")
for b, c in cfgs:
    for s in systems:
        rr = runs(s, b, c)
        if not rr: continue
        extra = ""
        if s == "pgq":
            extra = f", batches {med(r['pgq_batches'] for r in rr):.0f}, ticker calls {med(r['ticker_calls'] for r in rr):.0f}"
        print(f"  b{b:<3} c{c}  {names[s]:12} avg_batch {m(s,b,c,'avg_batch'):7.2f}  empty {m(s,b,c,'empty_receives'):7.0f}  client_cpu {m(s,b,c,'client_cpu_s'):6.2f}"
              f"  busy {m(s,b,c,'machine_cpus_busy'):4.2f} / {m(s,b,c,'busy_before'):4.2f}  secs {m(s,b,c,'seconds'):6.2f}  preload {m(s,b,c,'preload_s'):5.1f}{extra}")
print()
multi = [c for (_, c) in cfgs if c > 1]
if multi:
    print("per-key order under several consumers (violations seen in commit order, summed over rounds / messages received; duplicates)")
    for b, c in cfgs:
        if c == 1: continue
        for s in systems:
            rr = runs(s, b, c)
            if not rr or s == "ceiling": continue
            v = sum(r["order_violations"] for r in rr); n = sum(r["received"] for r in rr); d = sum(r["duplicates"] for r in rr)
            print(f"  b{b:<3} c{c}  {names[s]:12} violations {v:7} of {n:8}  duplicates {d}")
    print()
def ratio(a, b):
    return a / b if a and b else None
def paired(s1, s2, b, c):
    """per-round ratios of s1 to s2 (measured next to each other in each round)"""
    r1 = {r["round"]: r["rate"] for r in runs(s1, b, c)}
    r2 = {r["round"]: r["rate"] for r in runs(s2, b, c)}
    return [r1[k] / r2[k] for k in sorted(r1) if k in r2]
def pstr(v):
    return "" if not v else "   per round " + " ".join(f"{x:.2f}" for x in v) + f" (median {med(v):.2f})"
def goal(x, g):
    return "" if x is None else ("met" if x >= g else "MISSED")
print(f"{'figure (ratio of the medians)':44} {'value':>8}   goal")
for c in sorted({c for _, c in cfgs}):
    x = ratio(m("outbox", 1, c), m("hand", 1, c))
    if x is not None:
        print(f"{'outbox / hand-rolled, batch 1, ' + str(c) + ' consumer(s)':44} {x:8.2f}   >= 2   {goal(x, 2):6}" + pstr(paired("outbox", "hand", 1, c)))
for c in sorted({c for _, c in cfgs}):
    x = ratio(m("outbox", 1, c), m("ceiling", 1, c))
    if x is not None:
        print(f"{'  (outbox / ceiling, batch 1, ' + str(c) + ' consumer(s))':44} {x:8.2f}   (hand-rolled / ceiling {ratio(m('hand', 1, c), m('ceiling', 1, c)) or 0:.2f})")
for c in sorted({c for _, c in cfgs}):
    x = ratio(m("outbox", 100, c), m("pgq", 100, c))
    if x is not None:
        print(f"{'outbox / PgQ, batch 100, ' + str(c) + ' consumer(s)':44} {x:8.2f}   >= 1   {goal(x, 1):6}" + pstr(paired("outbox", "pgq", 100, c)))
lat = [r for r in res if r["kind"] == "latency" and r.get("from_commit_returned_ms")]
if lat:
    print()
    print("latency, ms: receiver's receive returned - producer's COMMIT returned (and - COMMIT sent)")
    for r in lat:
        L = r["from_commit_returned_ms"]; S = r["from_commit_sent_ms"]
        how = {"outbox": "outbox.receive('q', 1, 5000)", "hand": "LISTEN/NOTIFY + SKIP LOCKED",
               "pgq": "ticker ${LAT_TICK_MS} ms, poll ${LAT_POLL_MS} ms"}[r["system"]]
        print(f"  {names[r['system']]:12} {how:32} {r['received']}/{r['emitted']} at {r['producer']['achieved_rate']} msg/s:"
              f"  p50 {L['p50']}  p90 {L['p90']}  p99 {L['p99']}  max {L['max']}   (from sent: p50 {S['p50']} p99 {S['p99']})")
print()
print("ANOMALIES:\n  " + anom.replace("\n", "\n  ") if anom else "sanity: no duplicates, every fully drained system empty afterwards, nothing measured on a busy machine")
print(slog.rstrip())
PYEOF

# ---- charts -------------------------------------------------------------------------------
# The figures above as SVG charts (header comment), into $work/out, which
# OUT=DIR receives; a chart that fails is reported and does not fail the run.
if charts=$("$PY" "$here/bench_charts.py" queue "$RESULTS" "$work/out" --systems "$SYSTEMS" \
	--lat-tick-ms "$LAT_TICK_MS" --lat-poll-ms "$LAT_POLL_MS" \
	--note "built from $build_rev; $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"); then
	log "charts: $(echo "$charts" | sed "s|^$work/out/|${OUT:-$work/out}/|" | paste -sd' ' -)"
else
	log "charts: not all made (see above): $(echo "$charts" | paste -sd' ' -)"
fi
[ -n "$OUT" ] || [ "$KEEP" = 1 ] || log "charts: removed with $work on exit; OUT=DIR keeps them"
