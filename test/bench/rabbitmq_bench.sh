#!/usr/bin/env bash
# rabbitmq_bench.sh - delivery throughput of the outbox relay into a
# RabbitMQ queue, against a bare rabbitmq-c publisher with confirms, on a
# throwaway cluster and a throwaway rabbitmq-server node.
#
# Run by hand, as root (not in CI):
#
#   test/bench/rabbitmq_bench.sh                   # ~3 minutes on 2 cores (RUNS=3)
#   QUEUE_TYPE=quorum test/bench/rabbitmq_bench.sh
#
# What it measures (127.0.0.1, one machine; rabbitmq-server 3.10, a durable
# classic queue by default, QUEUE_TYPE=quorum for a quorum queue):
#   relay   N=100000 committed messages over KEYS=1000 keys (payload
#           bench_payload(g) of common.sh, ~220 bytes) emitted while a fresh
#           RabbitMQ target (default exchange, routing key the queue,
#           batch_size BATCH, lanes LANES) is paused, then released at once;
#           time from just before the resume until the queue holds N
#           (polled every POLL_MS ms); rate = N / elapsed.
#   bare    test/bench/rabbitmq_bare.c: the same N messages (persistent,
#           mandatory, message_id, the outbox headers, same payload size)
#           published on one channel in confirm mode with at most
#           BATCH x LANES unconfirmed; its own clock.
# Runs alternate over RUNS rounds (the order rotates); the queue is purged
# (deleted and declared) before every run.  Reported: medians of both
# rates, relay/bare (goal >= 0.8), and the CPU seconds of the relay
# worker, the bare client and the broker per run, from /proc.
#
# With TLS=1 the broker has an AMQPS listener too (AMQP_PORT + 1, a
# throwaway CA), and every round has two more runs: relay_tls (an amqps://
# target with that CA as ca_file) and bare_tls (the same client over
# rabbitmq-c's TLS socket, verifying the chain): relay_tls/bare_tls (goal
# >= 0.8) and relay_tls/relay are reported.
#
# Settings: RUNS=3 N=100000 KEYS=1000 BATCH=100 LANES=8 POLL_MS=50 TLS=0
#   QUEUE_TYPE=classic DRAIN_TIMEOUT=600 PORT=54346 AMQP_PORT=15673 KEEP=0
#   OUT=DIR REV= INSTALL=0 WAIT_FOR=... QUIET_MAX=0.3 QUIET_WAIT=120
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-100000}
KEYS=${KEYS:-1000}
BATCH=${BATCH:-100}
LANES=${LANES:-8}
POLL_MS=${POLL_MS:-50}
TLS=${TLS:-0}
QUEUE_TYPE=${QUEUE_TYPE:-classic}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-600}
KEEP=${KEEP:-0}
PERF=${PERF:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54346}
AMQP_PORT=${AMQP_PORT:-15673}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh|kafka_bench.sh|redis_bench.sh"}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-120}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=rabbitmq-bench
BENCH_PACKAGES=(gcc librabbitmq-dev rabbitmq-server)
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
perf_pid=
rmq_pid=
bench_on_exit() {
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null
	[ -n "$rmq_pid" ] && kill -TERM "$rmq_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

# ---- tools and broker ---------------------------------------------------------------
cc -O2 -Wall -o "$work/rabbitmq_bare" "$here/rabbitmq_bare.c" -lrabbitmq
cc -O2 -Wall -o "$work/outbox_rabbitmq" "$repo/test/rabbitmq/outbox_rabbitmq.c" -lrabbitmq
URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT
TLS_URL=amqps://guest:guest@127.0.0.1:$((AMQP_PORT + 1))
rtool() { "$work/outbox_rabbitmq" "$1" "$URL" "${@:2}"; }
mkdir -p "$work/rmq"
echo '[].' >"$work/rmq/enabled_plugins"
: >"$work/rmq/rabbitmq.conf"
if [ "$TLS" = 1 ]; then
	# an AMQPS listener beside the plain one, the same broker
	bench_tls_certs "$work/tls"
	cat >>"$work/rmq/rabbitmq.conf" <<EOC
listeners.ssl.default = 127.0.0.1:$((AMQP_PORT + 1))
ssl_options.cacertfile = $work/tls/ca.pem
ssl_options.certfile = $work/tls/server.pem
ssl_options.keyfile = $work/tls/server.key
ssl_options.verify = verify_none
EOC
fi
HOME=$work/rmq ERL_CRASH_DUMP=$work/rmq/erl_crash.dump RABBITMQ_MNESIA_BASE=$work/rmq/mnesia RABBITMQ_LOG_BASE=$work/rmq/log \
	RABBITMQ_NODENAME=outbox_bench_$$@localhost RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
	RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) RABBITMQ_ENABLED_PLUGINS_FILE=$work/rmq/enabled_plugins \
	RABBITMQ_PID_FILE=$work/rmq/pid RABBITMQ_CONFIG_FILE=$work/rmq/rabbitmq \
	/usr/lib/rabbitmq/bin/rabbitmq-server >"$work/rmq.log" 2>&1 &
for _ in $(seq 300); do rtool count none 2>&1 | grep -q NOT_FOUND && break; sleep 0.2; done
rmq_pid=$(cat "$work/rmq/pid")
log "rabbitmq-server on $URL (pid $rmq_pid), $QUEUE_TYPE queue"
fresh_queue() { rtool delete bench >/dev/null 2>&1 || true; if [ "$QUEUE_TYPE" = quorum ]; then rtool quorum bench; else rtool declare bench; fi; }
wait_count() {	# n timeout_s: realtime ns once the queue holds n
	local deadline=$(($(date +%s) + $2))
	while [ "$(date +%s)" -le "$deadline" ]; do
		[ "$(rtool count bench 2>/dev/null || echo 0)" -ge "$1" ] && { date +%s%N; return 0; }
		sleep "$(awk -v m="$POLL_MS" 'BEGIN {print m / 1000}')"
	done
	return 1
}

psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox" >/dev/null
create_bench_payload
payload=$(sql -c "SELECT bench_payload(50000)::text")

ticks_of() { awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

run_relay() {	# round [perf|tls]
	local r=$1 run=relay name="rabbitmq_r$1" wpid t0 t1 w0 w1 s0 s1 url=$URL tls=
	[ "${2:-}" = tls ] && { run=relay_tls url=$TLS_URL tls=", ca_file => '$work/tls/ca.pem'"; }
	fresh_queue
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null
	sql -c "SELECT outbox.create_rabbitmq_target('$name', '$url', routing_key => 'bench', batch_size => $BATCH, lanes => $LANES$tls)" \
		-c "SELECT outbox.pause_target('$name')" -c "SELECT outbox.subscribe('$name', '*')" >/dev/null
	sql -c "SELECT count(outbox_emit('orders', bench_payload(g), 'k' || (g % $KEYS))) FROM generate_series(1, $N) g" >/dev/null
	sql -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
	wpid=$(worker_pid)
	wait_quiet "relay round $r"
	w0=$(ticks_of "$wpid") s0=$(ticks_of "$rmq_pid")
	if [ "${2:-}" = perf ]; then
		run=relay_perf
		perf record -q -F 999 --call-graph dwarf,16384 -p "$wpid" -o "$work/perf.data" >/dev/null 2>&1 &
		perf_pid=$!
		sleep 0.5
	fi
	t0=$(date +%s%N)
	sql -c "SELECT outbox.resume_target('$name')" >/dev/null
	t1=$(wait_count "$N" "$DRAIN_TIMEOUT") ||
		{ echo "relay round $r: the queue did not reach $N" | tee -a "$work/anomalies" >&2; return; }
	w1=$(ticks_of "$wpid") s1=$(ticks_of "$rmq_pid")
	if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; perf_pid=; fi
	[ "$(rtool count bench)" = "$N" ] || echo "relay round $r: $(rtool count bench) in the queue, not $N" | tee -a "$work/anomalies" >&2
	record "{\"run\": \"$run\", \"round\": $r, \"secs\": $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.4f", (b - a) / 1e9}'),
		\"cpu_relay\": $(awk -v a="$w0" -v b="$w1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}'),
		\"cpu_broker\": $(awk -v a="$s0" -v b="$s1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}')}"
}

run_bare() {	# round [tls]
	local r=$1 out s0 s1 run=bare url=$URL
	[ "${2:-}" = tls ] && { run=bare_tls url=$TLS_URL; }
	fresh_queue
	wait_quiet "bare round $r"
	s0=$(ticks_of "$rmq_pid")
	out=$(OUTBOX_RMQ_CA=$work/tls/ca.pem "$work/rabbitmq_bare" "$url" bench "$N" "$KEYS" $((BATCH * LANES)) "$payload")
	s1=$(ticks_of "$rmq_pid")
	[ "$(rtool count bench)" = "$N" ] || echo "bare round $r: $(rtool count bench) in the queue, not $N" | tee -a "$work/anomalies" >&2
	record "{\"run\": \"$run\", \"round\": $r, \"secs\": ${out% *}, \"cpu_client\": ${out#* },
		\"cpu_broker\": $(awk -v a="$s0" -v b="$s1" -v h="$HZ" 'BEGIN {printf "%.3f", (b - a) / h}')}"
}

for ((r = 1; r <= RUNS; r++)); do
	if ((r % 2)); then run_relay "$r"; run_bare "$r"; else run_bare "$r"; run_relay "$r"; fi
	if [ "$TLS" = 1 ]; then
		if ((r % 2)); then run_bare "$r" tls; run_relay "$r" tls; else run_relay "$r" tls; run_bare "$r" tls; fi
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
print(f"relay  {relay:10.0f} msg/s   relay CPU {med('relay', 'cpu_relay') / n * 1e6:5.1f} us/msg   broker CPU {med('relay', 'cpu_broker') / n * 1e6:5.1f} us/msg")
print(f"bare   {bare:10.0f} msg/s   client CPU {med('bare', 'cpu_client') / n * 1e6:5.1f} us/msg   broker CPU {med('bare', 'cpu_broker') / n * 1e6:5.1f} us/msg")
print(f"relay/bare {relay / bare:.2f} (goal >= 0.8)")
if any(r["run"] == "relay_tls" for r in rows):
    rt, bt = n / med("relay_tls", "secs"), n / med("bare_tls", "secs")
    print(f"relay over TLS  {rt:10.0f} msg/s   relay CPU {med('relay_tls', 'cpu_relay') / n * 1e6:5.1f} us/msg")
    print(f"bare over TLS   {bt:10.0f} msg/s   client CPU {med('bare_tls', 'cpu_client') / n * 1e6:5.1f} us/msg")
    print(f"relay_tls/bare_tls {rt / bt:.2f} (goal >= 0.8)   relay_tls/relay {rt / relay:.2f}")
for r in rows:
    print(json.dumps(r))
PY
[ -s "$work/anomalies" ] && { echo "anomalies:"; cat "$work/anomalies"; }
exit 0
