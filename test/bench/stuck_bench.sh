#!/usr/bin/env bash
# stuck_bench.sh - an HTTP target's commit-to-delivery latency while broker
# targets are stuck in a handshake, against the same without them, in one
# run (issue 43: nothing blocks the relay's thread).
#
# Run by hand, as root (not in CI):
#
#   test/bench/stuck_bench.sh                  # ~3 minutes on 2 cores (RUNS=3)
#
# What it measures (127.0.0.1, one machine): a batch_size 1, LAT_LANES-lane
# HTTP target at test/bench/bench_sink.py, LAT_RATE messages/s emitted for
# LAT_SECS s in single-statement autocommit transactions (topic
# latency.test); latency = arrival at the sink - emitted_at
# (relay_bench_tool.py latency), p50/p90/p99.  Two kinds of run, alternating
# over RUNS rounds (the order rotates):
#   plain   the HTTP target alone;
#   stuck   beside it, a rediss://, an amqp:// and a NATS tls:// target,
#           each with messages waiting (topic stuck), pointed at a listener
#           that accepts TCP and never answers (a Python socket that never
#           reads), timeout_ms 200: their connections are made again and
#           again and each waits its whole timeout in a TLS, AMQP or NATS
#           handshake, all through the run (NATS: libnats' first attempt
#           on the relay's connecting thread, then its own reconnects).
# Reported: medians over the rounds of each kind's p99 (and p50), and
# stuck - plain (goal: p99 at most +1 ms).
#
# Settings: RUNS=3 LAT_RATE=500 LAT_SECS=20 LAT_LANES=8 PORT=54347 KEEP=0
#   OUT=DIR REV= INSTALL=0 WAIT_FOR=... QUIET_MAX=0.3 QUIET_WAIT=120
set -euo pipefail

RUNS=${RUNS:-3}
LAT_RATE=${LAT_RATE:-500}
LAT_SECS=${LAT_SECS:-20}
LAT_LANES=${LAT_LANES:-8}
KEEP=${KEEP:-0}
PERF=0
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54347}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh|kafka_bench.sh|redis_bench.sh|rabbitmq_bench.sh"}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-120}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=stuck-bench
BENCH_PACKAGES=()
sink_pid=
mute_pid=
bench_on_exit() {
	[ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null
	[ -n "$mute_pid" ] && kill "$mute_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup

# A listener that accepts and never answers (a large backlog: the relay
# connects again and again).
"$PY" - "$work/out/mute.port" <<'PY' &
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(4096)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
held = []
while True:
    c, _ = s.accept()
    held.append(c)		# never read, never answered
    if len(held) > 2000:
        held.pop(0).close()
PY
mute_pid=$!
for _ in $(seq 100); do [ -s "$work/out/mute.port" ] && break; sleep 0.05; done
MUTE_PORT=$(cat "$work/out/mute.port")
bench_tls_certs "$work/tls"

psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox" >/dev/null
create_bench_payload

start_sink() {
	rm -f "$work/out/$1.port"
	"$PY" "$here/bench_sink.py" --port 0 --port-file "$work/out/$1.port" --record "$work/out/$1.jsonl" &
	sink_pid=$!
	for _ in $(seq 100); do [ -s "$work/out/$1.port" ] && break; sleep 0.05; done
	SINK_URL="http://127.0.0.1:$(cat "$work/out/$1.port")/hook"
}
stop_sink() { kill -TERM "$sink_pid"; wait "$sink_pid" || true; sink_pid=; }

run() {	# kind round
	local kind=$1 r=$2 name="${1}_r$2" tid n emit_out lat_out
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" -c "CHECKPOINT" >/dev/null
	start_sink "$name"
	sql -c "SELECT outbox.create_http_target('$name', '$SINK_URL', batch_size => 1, lanes => $LAT_LANES)" \
		-c "SELECT outbox.subscribe('$name', 'latency.*')" >/dev/null
	tid=$(sql -c "SELECT outbox.target_id('$name')")
	if [ "$kind" = stuck ]; then
		sql -c "SELECT outbox.create_redis_target('stuck_redis', 'rediss://127.0.0.1:$MUTE_PORT', lanes => 1, timeout_ms => 200, max_attempts => 0, ca_file => '$work/tls/ca.pem')" \
			-c "SELECT outbox.create_rabbitmq_target('stuck_amqp', 'amqp://guest:guest@127.0.0.1:$MUTE_PORT', lanes => 1, timeout_ms => 200, max_attempts => 0)" \
			-c "SELECT outbox.create_nats_target('stuck_nats', 'tls://localhost:$MUTE_PORT', subject => 'stuck.{topic}', lanes => 1, timeout_ms => 200, max_attempts => 0, ca_file => '$work/tls/ca.pem')" \
			-c "SELECT outbox.subscribe('stuck_redis', 'stuck')" -c "SELECT outbox.subscribe('stuck_amqp', 'stuck')" \
			-c "SELECT outbox.subscribe('stuck_nats', 'stuck')" \
			-c "SELECT count(outbox_emit('stuck', '{}', 'k' || g)) FROM generate_series(1, 10) g" >/dev/null
		# all three are trying by now
		for _ in $(seq 100); do
			[ "$(sql -c "SELECT count(*) FROM outbox.lag WHERE target LIKE 'stuck%' AND last_error IS NOT NULL")" = 3 ] && break
			sleep 0.1
		done
	fi
	wait_quiet "$name"
	emit_out=$(tool emit-rate --rate "$LAT_RATE" --seconds "$LAT_SECS" --threads 4 --out "$work/out/$name-emits.jsonl")
	n=$(wc -l <"$work/out/$name-emits.jsonl")
	for _ in $(seq 300); do
		[ "$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $tid")" -ge "$n" ] && break
		sleep 0.1
	done
	stop_sink
	lat_out=$(tool latency --emits "$work/out/$name-emits.jsonl" --sink-records "$work/out/$name.jsonl")
	local retries=0
	[ "$kind" = stuck ] && retries=$(sql -c "SELECT coalesce(sum(retries), 0) FROM outbox.stats WHERE target LIKE 'stuck%'")
	record "{\"run\": \"$kind\", \"round\": $r, \"stuck_retries\": $retries}" "{\"emitter\": $emit_out}" "$lat_out"
	log "  $kind round $r: $lat_out (stuck targets' retries: $retries)"
}

for ((r = 1; r <= RUNS; r++)); do
	if ((r % 2)); then run plain "$r"; run stuck "$r"; else run stuck "$r"; run plain "$r"; fi
	log "round $r done"
done

"$PY" - "$RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(run, k):
    return statistics.median([(r["arrival_minus_emitted_at_ms"] if k.startswith("p") else r)[k]
                              for r in rows if r["run"] == run])
for k in ("p50", "p90", "p99"):
    print(f"{k} ms   plain {med('plain', k):7.2f}   stuck {med('stuck', k):7.2f}   stuck - plain {med('stuck', k) - med('plain', k):+6.2f}")
print(f"goal: p99 stuck - plain <= +1 ms: {'met' if med('stuck', 'p99') - med('plain', 'p99') <= 1 else 'NOT met'}")
print(f"stuck targets' retries per run (median): {med('stuck', 'stuck_retries')}")
for r in rows:
    print(json.dumps(r))
PY
exit 0
