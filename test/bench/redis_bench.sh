#!/usr/bin/env bash
# redis_bench.sh - delivery throughput of the outbox relay into a Redis
# stream, against a bare hiredis client sending the same commands, on a
# throwaway cluster and a throwaway redis-server.
#
# Run by hand, as root (not in CI):
#
#   test/bench/redis_bench.sh                      # ~2 minutes on 2 cores (RUNS=3)
#   RUNS=5 LANES=16 test/bench/redis_bench.sh
#
# What it measures (127.0.0.1, one machine; redis-server 7.0 without
# persistence, so the disk does not set the pace):
#   relay   N=100000 committed messages over KEYS=1000 keys (payload
#           bench_payload(g) of common.sh, ~220 bytes) emitted while a fresh
#           Redis target (stream 'bench', batch_size BATCH, lanes LANES,
#           dedup_window 600) is paused, then released at once; time from
#           just before the resume until XLEN bench reaches N (polled every
#           POLL_MS ms); rate = N / elapsed.
#   bare    test/bench/redis_bare.c send: the same N EVALSHA commands of the
#           relay's own script (cut from src/relay_redis.c), same fields and
#           payload size, marks included, pipelined from one connection with
#           at most BATCH x LANES waiting for replies; its own clock.
# Runs alternate over RUNS rounds (the order rotates); every run starts
# from FLUSHALL.  Reported: medians of both rates, relay/bare (goal >= 0.8),
# and the CPU seconds of the relay worker, the bare client and
# redis-server per run, from /proc.
#
# With TLS=1 redis-server has a TLS port too (REDIS_PORT + 1, a throwaway
# CA), and every round has one more run, relay_tls: a rediss:// target with
# that CA as ca_file.  hiredis 0.14 (Debian 12) has no TLS, so there is no
# bare client over TLS: relay_tls/relay and relay_tls/bare are reported.
#
# Settings: RUNS=3 N=100000 KEYS=1000 BATCH=100 LANES=8 POLL_MS=20 TLS=0
#   DRAIN_TIMEOUT=300 PORT=54345 REDIS_PORT=16379 KEEP=0 OUT=DIR REV=
#   INSTALL=0 WAIT_FOR=... QUIET_MAX=0.3 QUIET_WAIT=120 (as nats_bench.sh)
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-100000}
KEYS=${KEYS:-1000}
BATCH=${BATCH:-100}
LANES=${LANES:-8}
POLL_MS=${POLL_MS:-20}
TLS=${TLS:-0}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-300}
KEEP=${KEEP:-0}
PERF=${PERF:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54345}
REDIS_PORT=${REDIS_PORT:-16379}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh|kafka_bench.sh"}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-120}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=redis-bench
BENCH_PACKAGES=(gcc libhiredis-dev redis-server)
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
perf_pid=
redis_pid=
bench_on_exit() {
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null
	[ -n "$redis_pid" ] && kill -TERM "$redis_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

# ---- tools and server ----------------------------------------------------------------
sed -n '/^static const char redis_script\[\] =/,/;$/p' "$repo/src/relay_redis.c" >"$work/script.h"
grep -q "return {1, id}" "$work/script.h" || { echo "could not cut the script out of src/relay_redis.c" >&2; exit 1; }
cc -O2 -Wall -I"$work" -o "$work/redis_bare" "$here/redis_bare.c" -lhiredis
bare() { "$work/redis_bare" "$@"; }
mkdir -p "$work/redis"
tls_args=()
if [ "$TLS" = 1 ]; then
	bench_tls_certs "$work/tls"
	tls_args=(--tls-port $((REDIS_PORT + 1)) --tls-cert-file "$work/tls/server.pem"
		--tls-key-file "$work/tls/server.key" --tls-ca-cert-file "$work/tls/ca.pem" --tls-auth-clients no)
fi
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$work/redis" --save '' --appendonly no \
	--daemonize no --logfile "$work/redis.log" "${tls_args[@]}" &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
log "redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$REDIS_PORT (pid $redis_pid)"

psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox" >/dev/null
create_bench_payload
payload=$(sql -c "SELECT bench_payload(50000)::text")

ticks_of() { awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

run_relay() {	# round [perf|tls]
	local r=$1 run=relay name="redis_r$1" wpid t0 t1 w0 w1 s0 s1 url=redis://127.0.0.1:$REDIS_PORT tls=
	[ "${2:-}" = tls ] && { run=relay_tls url=rediss://127.0.0.1:$((REDIS_PORT + 1)) tls=", ca_file => '$work/tls/ca.pem'"; }
	rcli FLUSHALL >/dev/null
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null
	sql -c "SELECT outbox.create_redis_target('$name', '$url', stream => 'bench', batch_size => $BATCH, lanes => $LANES$tls)" \
		-c "SELECT outbox.pause_target('$name')" -c "SELECT outbox.subscribe('$name', '*')" >/dev/null
	sql -c "SELECT count(outbox_emit('orders', bench_payload(g), 'k' || (g % $KEYS))) FROM generate_series(1, $N) g" >/dev/null
	sql -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
	wpid=$(worker_pid)
	wait_quiet "relay round $r"
	w0=$(ticks_of "$wpid") s0=$(ticks_of "$redis_pid")
	if [ "${2:-}" = perf ]; then
		run=relay_perf
		perf record -q -F 999 --call-graph dwarf,16384 -p "$wpid" -o "$work/perf.data" >/dev/null 2>&1 &
		perf_pid=$!
		sleep 0.5
	fi
	t0=$(date +%s%N)
	sql -c "SELECT outbox.resume_target('$name')" >/dev/null
	t1=$(bare wait 127.0.0.1 "$REDIS_PORT" bench "$N" "$POLL_MS" "$DRAIN_TIMEOUT") ||
		{ echo "relay round $r: the stream did not reach $N" | tee -a "$work/anomalies" >&2; return; }
	w1=$(ticks_of "$wpid") s1=$(ticks_of "$redis_pid")
	if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; perf_pid=; fi
	[ "$(rcli XLEN bench)" = "$N" ] || echo "relay round $r: XLEN $(rcli XLEN bench), not $N" | tee -a "$work/anomalies" >&2
	record "{\"run\": \"$run\", \"round\": $r, \"secs\": $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", (b - a) / 1e9}'),
		\"cpu_relay\": $(awk -v a="$w0" -v b="$w1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}'),
		\"cpu_redis\": $(awk -v a="$s0" -v b="$s1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}')}"
}

run_bare() {	# round
	local r=$1 out s0 s1
	rcli FLUSHALL >/dev/null
	wait_quiet "bare round $r"
	s0=$(ticks_of "$redis_pid")
	out=$(bare send 127.0.0.1 "$REDIS_PORT" bench "$N" "$KEYS" $((BATCH * LANES)) "$payload")
	s1=$(ticks_of "$redis_pid")
	[ "$(rcli XLEN bench)" = "$N" ] || echo "bare round $r: XLEN $(rcli XLEN bench), not $N" | tee -a "$work/anomalies" >&2
	record "{\"run\": \"bare\", \"round\": $r, \"secs\": ${out% *}, \"cpu_client\": ${out#* },
		\"cpu_redis\": $(awk -v a="$s0" -v b="$s1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}')}"
}

for ((r = 1; r <= RUNS; r++)); do
	if ((r % 2)); then
		run_relay "$r"; run_bare "$r"; if [ "$TLS" = 1 ]; then run_relay "$r" tls; fi
	else
		if [ "$TLS" = 1 ]; then run_relay "$r" tls; fi; run_bare "$r"; run_relay "$r"
	fi
	log "round $r done"
done

# ---- profile (not timed: perf slows the relay) --------------------------------------------
if [ "$PERF" = 1 ]; then
	log "profile: one more relay run under perf record --call-graph dwarf"
	run_relay 0 perf
	perf_report_files "$work/perf.data" relay
fi

"$PY" - "$RESULTS" "$N" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
n = int(sys.argv[2])
def med(run, k):
    v = [r[k] for r in rows if r["run"] == run and k in r]
    return statistics.median(v) if v else float("nan")
relay, bare = n / med("relay", "secs"), n / med("bare", "secs")
print(f"messages {n}")
print(f"relay  {relay:10.0f} msg/s   relay CPU {med('relay', 'cpu_relay') / n * 1e6:5.1f} us/msg   redis-server CPU {med('relay', 'cpu_redis') / n * 1e6:5.1f} us/msg")
print(f"bare   {bare:10.0f} msg/s   client CPU {med('bare', 'cpu_client') / n * 1e6:5.1f} us/msg   redis-server CPU {med('bare', 'cpu_redis') / n * 1e6:5.1f} us/msg")
print(f"relay/bare {relay / bare:.2f} (goal >= 0.8)")
if any(r["run"] == "relay_tls" for r in rows):
    rt = n / med("relay_tls", "secs")
    print(f"relay over TLS {rt:10.0f} msg/s   relay CPU {med('relay_tls', 'cpu_relay') / n * 1e6:5.1f} us/msg   redis-server CPU {med('relay_tls', 'cpu_redis') / n * 1e6:5.1f} us/msg")
    print(f"relay_tls/relay {rt / relay:.2f}   relay_tls/bare (plaintext: hiredis 0.14 has no TLS) {rt / bare:.2f}")
for r in rows:
    print(json.dumps(r))
PY
[ -s "$work/anomalies" ] && { echo "anomalies:"; cat "$work/anomalies"; }
exit 0
