#!/usr/bin/env bash
# aws_bench.sh - delivery throughput of the outbox relay into Amazon SQS, SNS
# and Kinesis emulators, against a bare client sending the same signed requests
# with the same batching, on a throwaway PostgreSQL cluster.
#
# Run by hand, as root (not in CI):
#
#   test/bench/aws_bench.sh                    # ~3 minutes on 2 cores (RUNS=3)
#   SERVICES=sqs RUNS=5 test/bench/aws_bench.sh
#   PERF=1 test/bench/aws_bench.sh             # and the relay's signer cost
#
# What it measures (everything on 127.0.0.1, one machine; the peer is
# test/aws/aws_peer.mjs: fauxqs and kinesalite in one Node.js process,
# behind the front that checks every request's signature with AWS's own
# signer, for the relay and the bare client alike):
#   relay   a backlog of N committed messages (keys k0..k(KEYS-1), payload
#           {"key": "k<g % KEYS>", "seq": g, "data": "xxxxxxxx"}) emitted while
#           a fresh target (SQS: queue 'bench', batch_size SQS_BATCH; SNS:
#           topic 'bench', delivering raw to a queue, batch_size SQS_BATCH; Kinesis:
#           stream 'bench' of SHARDS shards, batch_size KINESIS_BATCH; LANES
#           lanes) is paused, then released at once; time from just before
#           the resume until outbox.lag says nothing is pending (every
#           message acknowledged by the emulator), polled every 50 ms;
#           rate = N / elapsed.
#   bare    test/bench/aws_bare.mjs: the same N messages, the same batching
#           (LANES workers, each its keys' messages in order, at most one of
#           a key a request), the same attributes (SQS) or envelope (Kinesis),
#           signed with @smithy/signature-v4, keep-alive connections; the rate
#           it prints, and its signer's time per request.
# One unrecorded run of each first (warm-up); then rounds alternate (the
# order rotates every round); per service the medians
# and relay/bare (goal >= 0.80) are reported, with the relay worker's CPU
# per message (its process's user+system time over the run) and the
# requests each side sent (the relay's time includes the resume call and
# a poll of at most 50 ms: a bias against it; the bare client times
# itself); and the relay's signer on its own
# (sigv4_bench.c: aws_sigv4_sign() of a 3 kB and a 25 kB body, microseconds
# a request).  PERF=1: after the rounds, one more relay run per
# service under perf record (not timed), and the share of the relay's
# samples in aws_sigv4_sign() (the signer: canonical request, hashes,
# HMAC), as microseconds a request of the relay's CPU.
#
# Settings (environment):
#   RUNS=3 N=20000 KEYS=1000 LANES=8 SQS_BATCH=10 KINESIS_BATCH=100 SHARDS=4
#   SERVICES="sqs sns kinesis" PERF=0 KEEP=0 OUT=DIR REV= INSTALL=0
#   PORT=54349 WAIT_FOR="..._bench.sh" (as kafka_bench.sh)
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-20000}
KEYS=${KEYS:-1000}
LANES=${LANES:-8}
SQS_BATCH=${SQS_BATCH:-10}
KINESIS_BATCH=${KINESIS_BATCH:-100}
SHARDS=${SHARDS:-4}
SERVICES=${SERVICES:-"sqs sns kinesis"}
PERF=${PERF:-0}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54349}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh|kafka_bench.sh"}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench
KEY_ID=AKIAIOSFODNN7EXAMPLE
SECRET=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY
REGION=eu-west-1

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=aws-bench
BENCH_PACKAGES=(nodejs gcc)
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
peer_pid=
bench_on_exit() {
	[ -n "$peer_pid" ] && kill "$peer_pid" 2>/dev/null
	return 0
}
# shellcheck source=test/bench/common.sh
. "$here/common.sh"
bench_setup

# ---- the peer ------------------------------------------------------------------
node "$repo/test/aws/aws_peer.mjs" "$work/peer.port" >"$work/log/peer.log" 2>&1 &
peer_pid=$!
for _ in $(seq 100); do [ -s "$work/peer.port" ] && break; sleep 0.1; done
[ -s "$work/peer.port" ] || { echo "the peer did not start:" >&2; cat "$work/log/peer.log" >&2; exit 1; }
SQS_PORT=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["sqs"])' "$work/peer.port")
CONTROL=http://127.0.0.1:$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["control"])' "$work/peer.port")
ENDPOINT=http://127.0.0.1:$SQS_PORT
control() { curl -sf -X POST "$CONTROL/$1" -d "$2" >/dev/null; }
peer_requests() { curl -sf "$CONTROL/stats" | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["batches"]))'; }
control setup "{\"region\": \"$REGION\", \"keys\": {\"$KEY_ID\": \"$SECRET\"}}"
control queue '{"name": "bench"}'
control queue '{"name": "from-topic"}'
TOPIC_ARN=$(curl -sf -X POST "$CONTROL/topic" -d '{"name": "bench", "queue": "from-topic"}' |
	"$PY" -c 'import json, sys; print(json.load(sys.stdin)["arn"])')
control stream "{\"name\": \"bench\", \"shards\": $SHARDS}"
QUEUE_URL=$ENDPOINT/000000000000/bench

psqlq -d postgres -c "CREATE DATABASE $DB"
sql -c "CREATE EXTENSION outbox"
# (outbox.database: the relay starts once the database has the extension)
for _ in $(seq 100); do [ -n "$(worker_pid)" ] && break; sleep 0.1; done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# What a run left in the emulators, emptied (Kinesis streams only grow).
purge_after() {
	case $1 in
		sqs) control purge '{"name": "bench"}' ;;
		sns) control purge '{"name": "from-topic"}' ;;
	esac
	return 0
}

# relay_run SERVICE ROUND [perf]: prints a JSON line
relay_run() {
	local svc=$1 round=$2 t=bench_$1_$2 create
	if [ "$svc" = sqs ]; then
		create="SELECT outbox.create_sqs_target('$t', '$QUEUE_URL', '$REGION', '$KEY_ID', '$SECRET', batch_size => $SQS_BATCH, lanes => $LANES, max_attempts => 0)"
	elif [ "$svc" = sns ]; then
		create="SELECT outbox.create_sns_target('$t', '$TOPIC_ARN', '$KEY_ID', '$SECRET', endpoint => '$ENDPOINT', batch_size => $SQS_BATCH, lanes => $LANES, max_attempts => 0)"
	else
		create="SELECT outbox.create_kinesis_target('$t', 'bench', '$REGION', '$KEY_ID', '$SECRET', endpoint => '$ENDPOINT', batch_size => $KINESIS_BATCH, lanes => $LANES, max_attempts => 0)"
	fi
	sql -c "$create" -c "SELECT outbox.subscribe('$t', 'bench')" -c "SELECT outbox.pause_target('$t')" >/dev/null
	sql -c "SELECT count(outbox_emit('bench', jsonb_build_object('key', 'k' || (g % $KEYS), 'seq', g, 'data', 'xxxxxxxx'), 'k' || (g % $KEYS))) FROM generate_series(1, $N) g" >/dev/null
	local pid req0 cpu0 t0 t1 pending perf_pid=
	pid=$(worker_pid)
	req0=$(peer_requests)
	if [ "${3:-}" = perf ]; then
		perf record -F 2000 -g -p "$pid" -o "$work/out/perf.$svc.data" >/dev/null 2>&1 &
		perf_pid=$!
		sleep 1
	fi
	cpu0=$(cpu_ticks "$pid")
	t0=$(date +%s.%N)
	sql -c "SELECT outbox.resume_target('$t')" >/dev/null
	for _ in $(seq 6000); do
		pending=$(sql -c "SELECT pending FROM outbox.lag WHERE target = '$t'")
		[ "$pending" = 0 ] && break
		sleep 0.05
	done
	t1=$(date +%s.%N)
	[ "$pending" = 0 ] || { echo "relay run $t did not drain ($pending pending)" >&2; exit 1; }
	local cpu1 req1
	cpu1=$(cpu_ticks "$pid")
	req1=$(peer_requests)
	if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; fi
	[ "$(sql -c "SELECT count(*) FROM outbox.dead_letters")" = 0 ] || { echo "dead letters after $t" >&2; exit 1; }
	sql -c "SELECT outbox.drop_target('$t')" >/dev/null
	sql -c "TRUNCATE outbox.messages" >/dev/null 2>&1 || true
	purge_after "$svc"
	"$PY" -c 'import json, sys
n, t0, t1, c0, c1, r0, r1 = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
hz = 100
print(json.dumps({"n": n, "seconds": t1 - t0, "rate": n / (t1 - t0), "requests": r1 - r0,
                  "relay_cpu_us_per_msg": (c1 - c0) / hz * 1e6 / n}))' "$N" "$t0" "$t1" "$cpu0" "$cpu1" "$req0" "$req1"
}

bare_run() {
	local svc=$1 target batch
	case $svc in
		sqs) target=$QUEUE_URL batch=$SQS_BATCH ;;
		sns) target=$TOPIC_ARN batch=$SQS_BATCH ;;
		*) target=bench batch=$KINESIS_BATCH ;;
	esac
	node "$here/aws_bare.mjs" "$svc" "$ENDPOINT" "$target" "$REGION" "$KEY_ID" "$SECRET" "$N" "$KEYS" "$batch" "$LANES"
	purge_after "$svc"
}

# One run of each, not recorded: the emulators' and the relay's first
# requests (Node.js compiling the peer's paths, the relay's first reads).
for svc in $SERVICES; do
	w1=$(relay_run "$svc" 0)	# (an assignment: a failed run stops the script)
	w2=$(bare_run "$svc")
	log "warm-up $svc: relay $w1, bare $w2"
done

for round in $(seq "$RUNS"); do
	for svc in $SERVICES; do
		if [ $((round % 2)) = 1 ]; then order="relay bare"; else order="bare relay"; fi
		for side in $order; do
			if [ "$side" = relay ]; then r=$(relay_run "$svc" "$round"); else r=$(bare_run "$svc"); fi
			log "round $round $svc $side: $r"
			record "{\"round\": $round, \"service\": \"$svc\", \"side\": \"$side\"}" "$r"
		done
	done
done

"$PY" - "$RESULTS" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for svc in sorted({r["service"] for r in rows}):
    relay = [r for r in rows if r["service"] == svc and r["side"] == "relay"]
    bare = [r for r in rows if r["service"] == svc and r["side"] == "bare"]
    rr = statistics.median(r["rate"] for r in relay)
    br = statistics.median(r["rate"] for r in bare)
    per_round = [a["rate"] / b["rate"] for a, b in zip(sorted(relay, key=lambda r: r["round"]), sorted(bare, key=lambda r: r["round"]))]
    print(f"{svc}: relay {rr:,.0f} msg/s ({statistics.median(r['requests'] for r in relay):.0f} requests, "
          f"{statistics.median(r['relay_cpu_us_per_msg'] for r in relay):.1f} us relay CPU a message), "
          f"bare {br:,.0f} msg/s ({statistics.median(r['requests'] for r in bare):.0f} requests, "
          f"signer {statistics.median(r['sign_us'] for r in bare):.1f} us a request), "
          f"relay/bare {rr / br:.2f} (per round {', '.join(f'{x:.2f}' for x in per_round)})")
PYEOF

# The signer on its own (test/bench/sigv4_bench.c, built against the
# frontend libraries of the server's version).
libdir=$("$PG_CONFIG" --libdir)
gcc -O2 -DFRONTEND -I"$repo/src" -I"$("$PG_CONFIG" --includedir-server)" "$here/sigv4_bench.c" \
	"$repo/src/aws_sigv4.c" -L"$libdir" -L"$("$PG_CONFIG" --pkglibdir)" -lpgcommon -lpgport -lcrypto -lm -o "$work/sigv4_bench"
"$work/sigv4_bench" 100000 | while read -r line; do log "the relay's signer: $line"; record "$line"; done

if [ "$PERF" = 1 ]; then
	for svc in $SERVICES; do
		r=$(relay_run "$svc" perf perf)
		req=$("$PY" -c 'import json, sys; print(json.loads(sys.argv[1])["requests"])' "$r")
		cpu=$("$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["relay_cpu_us_per_msg"] * r["n"])' "$r")
		perf report -i "$work/out/perf.$svc.data" --children --stdio -g none --no-demangle >"$work/out/perf.$svc.txt" 2>/dev/null || true
		share=$(awk '$NF == "aws_sigv4_sign" && $1 ~ /%$/ {sub("%", "", $1); print $1; exit}' "$work/out/perf.$svc.txt")
		"$PY" -c 'import sys
share, cpu_us, req = float(sys.argv[1] or 0), float(sys.argv[2]), int(sys.argv[3])
print(f"{sys.argv[4]}: aws_sigv4_sign {share:.1f}% of the relay worker''s samples (children included): "
      f"{share / 100 * cpu_us / max(req, 1):.1f} us a request over {req} requests")' "${share:-0}" "$cpu" "$req" "$svc"
	done
fi
