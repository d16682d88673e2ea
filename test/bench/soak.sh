#!/usr/bin/env bash
# soak.sh - a long run of the relay at a steady rate: does the worker's
# memory grow with the messages it delivers, and do the tables stay small
# when delivered messages are purged?  On a throwaway cluster, nginx and the
# test sink (test/sink/outbox_sink.py).
#
# Run by hand, as root (not in CI):
#
#   test/bench/soak.sh                      # 10 minutes
#   SOAK_SECS=3600 RATE=1000 test/bench/soak.sh
#
# What runs, for SOAK_SECS:
#   emitters  pgbench, 4 clients, RATE transactions/s, each emitting 5
#             messages (topic orders.created, every 50th audit.event) over
#             1000 keys with a ~150-byte payload
#   targets   fast      nginx, batch_size 1, 8 lanes          (orders.*)
#             batched   nginx, batch_size 50, 4 lanes         (*)
#             flaky     the sink, signed, 5% of answers 500, batch_size 20,
#                       16 lanes, max_attempts 3 (outbox.retry_base_delay
#                       50 ms), so a few batches become dead letters
#                                                             (orders.*)
#             rejecting the sink answering 400: every message a dead letter
#                                                             (audit.*)
#             notify    NOTIFY on a channel nobody listens to   (*)
#   purge     every PURGE_SECS: DELETE the messages every target is done
#             with, and dead letters older than a minute
#   samples   every SAMPLE_SECS: the relay worker's RssAnon and VmRSS, the
#             messages done (delivered + dead-lettered, all targets), the
#             sizes of outbox.messages, outbox.progress, outbox.dead_letters;
#             and the worker's memory contexts (their grand total, from
#             pg_log_backend_memory_contexts) after the warm-up and at the end
# Afterwards the emitters stop and the backlog drains; the report gives the
# growth of RssAnon per million messages done after the warm-up (a least
# squares fit over the samples after WARMUP_SECS), and the table sizes.
#
# Settings (environment): SOAK_SECS=600 RATE=2000 SAMPLE_SECS=10
# PURGE_SECS=30 WARMUP_SECS=60 KEEP=0 OUT=DIR REV= INSTALL= PORT=54341
# NGINX_PORT=18091 WAIT_FOR=relay_bench.sh
set -euo pipefail

SOAK_SECS=${SOAK_SECS:-600}
RATE=${RATE:-2000}
SAMPLE_SECS=${SAMPLE_SECS:-10}
PURGE_SECS=${PURGE_SECS:-30}
WARMUP_SECS=${WARMUP_SECS:-60}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
if [ -n "$REV" ]; then INSTALL=${INSTALL:-0}; else INSTALL=${INSTALL:-1}; fi
PORT=${PORT:-54341}
NGINX_PORT=${NGINX_PORT:-18091}
WAIT_FOR=${WAIT_FOR-relay_bench.sh}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=soak

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=soak
BENCH_PACKAGES=()	# pgbench comes with postgresql-15
sink_pid=
pgbench_pid=
bench_on_exit() {
	[ -n "$pgbench_pid" ] && kill "$pgbench_pid" 2>/dev/null
	[ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

# The worker waits for the database, then restarts to connect to it.
psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox" >/dev/null
for _ in $(seq 150); do [ -n "$(worker_pid)" ] && break; sleep 0.2; done
wpid=$(worker_pid)
[ -n "$wpid" ] || { echo "no 'outbox relay' process" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }

secret=whsec_c29hayB0ZXN0IHNlY3JldCBvZiAyNCBieXRlcyE=
"$PY" "$repo/test/sink/outbox_sink.py" --port 0 --port-file "$work/out/sink.port" \
	--secret "$secret" >"$work/out/sink.log" 2>&1 &
sink_pid=$!
for _ in $(seq 100); do [ -s "$work/out/sink.port" ] && break; sleep 0.05; done
SINK="http://127.0.0.1:$(cat "$work/out/sink.port")"
curl -sf -o /dev/null -d '{"path": "/flaky", "fail_rate": 0.05}' "$SINK/_control"
curl -sf -o /dev/null -d '{"path": "/rejecting", "status": 400}' "$SINK/_control"

# Retries sooner than by default, so that the flaky target keeps up.
sql >/dev/null <<SQL
ALTER SYSTEM SET outbox.retry_base_delay = 50;
SELECT pg_reload_conf();
SELECT outbox.create_http_target('fast', '$NGINX_URL', batch_size => 1, lanes => 8);
SELECT outbox.subscribe('fast', 'orders.*');
SELECT outbox.create_http_target('batched', '$NGINX_URL', batch_size => 50, lanes => 4);
SELECT outbox.subscribe('batched', '*');
SELECT outbox.create_http_target('flaky', '$SINK/flaky', secret => '$secret',
								 batch_size => 20, lanes => 16, max_attempts => 3);
SELECT outbox.subscribe('flaky', 'orders.*');
SELECT outbox.create_http_target('rejecting', '$SINK/rejecting', lanes => 2);
SELECT outbox.subscribe('rejecting', 'audit.*');
SELECT outbox.create_notify_target('notify', 'soak_nobody_listens');
SELECT outbox.subscribe('notify', '*');
SQL

cat >"$work/emit.sql" <<'EOF'
\set k random(1, 1000)
SELECT count(outbox_emit(CASE WHEN (:k + g) % 50 = 0 THEN 'audit.event' ELSE 'orders.created' END,
                         jsonb_build_object('k', :k, 'g', g, 'note', repeat('p', 100)),
                         'key-' || ((:k + g) % 1000)))
  FROM generate_series(1, 5) g;
EOF
chown "$PGUSER_OS" "$work/emit.sql"

done_sql="SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress"
sample() {	# phase
	local rss sizes
	rss=$(rss_of "$wpid")
	sizes=$(sql -c "SELECT json_build_object('done', ($done_sql), 'messages_bytes', pg_total_relation_size('outbox.messages'),
			'progress_bytes', pg_total_relation_size('outbox.progress'), 'dead_letters_bytes', pg_total_relation_size('outbox.dead_letters'),
			'messages_rows', (SELECT count(*) FROM outbox.messages), 'pending', (SELECT sum(pending) FROM outbox.lag))")
	record "{\"kind\": \"sample\", \"phase\": \"$1\", \"t\": $(date +%s.%N)}" "$rss" "$sizes"
}
# The worker's memory contexts, logged by the server: keep the grand total.
contexts() {	# label
	local n
	n=$(grep -c 'Grand total' "$SERVERLOG" || true)
	sql -c "SELECT pg_log_backend_memory_contexts($wpid)" >/dev/null
	for _ in $(seq 50); do
		[ "$(grep -c 'Grand total' "$SERVERLOG" || true)" -gt "$n" ] && break
		sleep 0.1
	done
	echo "$1: $(grep "\[$wpid\].*Grand total" "$SERVERLOG" | tail -1 | sed 's/^.*Grand total: //')" >>"$work/out/contexts.txt"
}
purge() {
	sql -c "DELETE FROM outbox.messages WHERE id <= (SELECT min(done_id) FROM outbox.progress)" \
		-c "DELETE FROM outbox.dead_letters WHERE failed_at < now() - interval '60 seconds'" >/dev/null
}

log "soak: $RATE transactions/s x 5 messages for ${SOAK_SECS}s; relay worker pid $wpid"
sample start
as_pg "$BIN/pgbench" -h "$SOCK" -p "$PORT" -U postgres -n -c 4 -j 2 -R "$RATE" -T "$SOAK_SECS" \
	-f "$work/emit.sql" "$DB" >"$work/out/pgbench.log" 2>&1 &
pgbench_pid=$!
t0=$(date +%s)
last_purge=$t0
warm=0
while kill -0 "$pgbench_pid" 2>/dev/null; do
	sleep "$SAMPLE_SECS"
	now=$(date +%s)
	if [ "$warm" = 0 ] && [ $((now - t0)) -ge "$WARMUP_SECS" ]; then
		contexts "after the warm-up"
		warm=1
	fi
	if [ $((now - last_purge)) -ge "$PURGE_SECS" ]; then
		purge
		last_purge=$now
	fi
	sample run
	log "  $(tail -1 "$RESULTS")"
done
wait "$pgbench_pid" || { echo "pgbench failed:" >&2; tail -20 "$work/out/pgbench.log" >&2; exit 1; }
pgbench_pid=

log "emitters stopped; draining"
for _ in $(seq 600); do
	[ "$(sql -c "SELECT coalesce(sum(pending), 0) FROM outbox.lag")" = 0 ] && break
	sleep 1
done
purge
sql -c "VACUUM outbox.messages" -c "VACUUM outbox.progress" >/dev/null
sample end
contexts "at the end"
[ "$(worker_pid)" = "$wpid" ] || echo "the relay worker changed pid: $wpid -> $(worker_pid)" >>"$work/anomalies"
grep -Eq 'PANIC|TRAP|terminated by signal' "$SERVERLOG" && echo "the server log shows a crash" >>"$work/anomalies"

"$PY" - "$RESULTS" "$WARMUP_SECS" "$work/out/pgbench.log" "$work/anomalies" "$work/out/contexts.txt" <<'PYEOF'
import json, os, sys
res = [json.loads(l) for l in open(sys.argv[1])]
warmup = float(sys.argv[2])
s = [r for r in res if r["kind"] == "sample"]
t0 = s[0]["t"]
run = [r for r in s if r["phase"] == "run" and r["t"] - t0 >= warmup]
print()
print("outbox soak")
for line in open(sys.argv[3]):
    if line.startswith(("number of transactions actually processed", "tps", "latency average")):
        print("  pgbench: " + line.strip())
end = s[-1]
print(f"  messages done (delivered + dead-lettered, all targets): {end['done']}; pending at the end: {end['pending']}")
print(f"  {'t (s)':>6} {'done':>10} {'RssAnon kB':>10} {'VmRSS kB':>9} {'messages rows':>13} {'messages MB':>11} {'progress kB':>11} {'dead_letters kB':>15}")
for r in s:
    print(f"  {r['t'] - t0:6.0f} {r['done']:10} {r['anon_kb']:10} {r['rss_kb']:9} {r['messages_rows']:13} "
          f"{r['messages_bytes'] / 1e6:11.1f} {r['progress_bytes'] / 1e3:11.0f} {r['dead_letters_bytes'] / 1e3:15.0f}")
if len(run) >= 3:
    xs = [r["done"] / 1e6 for r in run]
    ys = [r["anon_kb"] for r in run]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else float("nan")
    print(f"  RssAnon after {warmup:.0f}s of warm-up: {min(ys)}-{max(ys)} kB over {xs[-1] - xs[0]:.2f} million messages; "
          f"least-squares growth {slope:.1f} kB per million messages")
else:
    print("  too few samples after the warm-up for a fit")
mx_rows = max(r["messages_rows"] for r in s)
print(f"  outbox.messages: at most {mx_rows} rows between purges; "
      f"progress {max(r['progress_bytes'] for r in s) / 1e3:.0f} kB at most")
if os.path.exists(sys.argv[5]):
    print("  the worker's memory contexts (pg_log_backend_memory_contexts, grand total):")
    for line in open(sys.argv[5]):
        print("    " + line.strip())
anom = open(sys.argv[4]).read().strip() if os.path.exists(sys.argv[4]) else ""
print("ANOMALIES: " + anom if anom else "sanity: the relay worker kept its pid; no crash in the server log")
PYEOF
