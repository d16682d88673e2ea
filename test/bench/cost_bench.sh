#!/usr/bin/env bash
# cost_bench.sh - the relay's own CPU per message, transport by transport:
# what the relay worker spends per message delivered, against what a bare
# client of the same transport spends for the same messages, and the
# difference, which is the relay's own cost (reading the messages, routing,
# building headers and bodies, acknowledgements, progress, the wait loop).
#
# Run by hand, as root (not in CI):
#
#   OUT=/tmp/cost test/bench/cost_bench.sh          # ~25 minutes on 2 cores
#   KINDS="redis nats" RUNS=3 OUT=/tmp/cost test/bench/cost_bench.sh
#
# It runs the transports' own benchmarks one after the other, each on its
# throwaway cluster and peer, with OUT=$OUT/<kind> and a profile run
# (PERF=1), then reads their results:
#   http      relay_bench.sh, CONFIGS="1:32 100:8" (nginx answering 204):
#             the relay's drains against test/bench/curl_client.c, once
#             posting one message per request and once bodies of 100
#             envelopes (BARE_BATCH); its latency run (500 msg/s)
#   nats      nats_bench.sh, CONFIGS="100:32": against a bare libnats
#             asynchronous JetStream publisher, once with two headers and
#             once with the five the relay sends (two rows)
#   kafka     kafka_bench.sh, CONFIGS="1000:64": against a bare idempotent
#             librdkafka producer (librdkafka's mock cluster)
#   redis     redis_bench.sh: against a bare hiredis pipeline of the same
#             EVALSHA commands
#   rabbitmq  rabbitmq_bench.sh: against a bare rabbitmq-c publisher with
#             confirms (classic durable queue)
# CPU times are the whole process's (all threads: librdkafka's and
# libnats' included, on both sides), from /proc for the relay and from
# getrusage or the shell's `time` for the bare clients, medians over RUNS.
#
# Under each row, the own cost round by round (the relay's run minus the
# bare client's run of the same round): the bare figure alone moves by
# tens of percent between rounds on a shared machine, so the spread of the
# differences says how far the median can be trusted.  The latency row
# also gives the arrival counted from the commit's return to the emitting
# client, and that client's whole call.
#
# The table is printed and written to $OUT/cost.txt (and cost.json), with
# the share of the relay's samples in each of its parts, from the profiles
# (test/bench/fold_split.py); each
# kind's directory keeps its results (results.jsonl), its report
# (report.txt) and the profile of a relay run: perf-*.txt (self time by
# shared object and symbol, inclusive time) and perf-*.folded (folded
# stacks, for flamegraph.pl, speedscope or inferno).
#
# Settings: KINDS="http nats kafka redis rabbitmq" RUNS=1 PERF=1 OUT=
#   (required) REV= (build that revision in every benchmark) REPORT_ONLY=1
#   (no runs: the table of what $OUT already holds, for KINDS)
set -euo pipefail

KINDS=${KINDS:-"http nats kafka redis rabbitmq"}
RUNS=${RUNS:-1}
PERF=${PERF:-1}
OUT=${OUT:?set OUT=DIR: where the results go}
REV=${REV:-}
REPORT_ONLY=${REPORT_ONLY:-0}

here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
mkdir -p "$OUT"
log() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

run() {	# kind script settings...
	local kind=$1 script=$2
	shift 2
	rm -rf "${OUT:?}/$kind"
	log "$kind: $script $*"
	if env RUNS="$RUNS" PERF="$PERF" REV="$REV" INSTALL=0 WAIT_FOR= OUT="$OUT/$kind" "$@" \
		"$here/$script" >"$OUT/$kind.report.txt" 2>"$OUT/$kind.log"; then
		mv "$OUT/$kind.report.txt" "$OUT/$kind/report.txt"
		mv "$OUT/$kind.log" "$OUT/$kind/log.txt"
	else
		log "$kind: $script failed; see $OUT/$kind.log"
	fi
}

for kind in $KINDS; do
	[ "$REPORT_ONLY" = 1 ] && break
	case $kind in
	http) run http relay_bench.sh CONFIGS="1:32 100:8" HAND_PROCS=0 VERIFY=0 ;;
	nats) run nats nats_bench.sh CONFIGS="100:32" ;;
	kafka) run kafka kafka_bench.sh CONFIGS="1000:64" ;;
	redis) run redis redis_bench.sh ;;
	rabbitmq) run rabbitmq rabbitmq_bench.sh ;;
	*) echo "unknown kind '$kind'" >&2; exit 2 ;;
	esac
done

/usr/bin/python3 - "$OUT" $KINDS <<'PY' | tee "$OUT/cost.txt"
import json, os, statistics, sys
out, kinds = sys.argv[1], sys.argv[2:]
med = statistics.median
rows = []

def own_rounds(relay, bare):
    # relay and bare: {round: us a message}; the difference round by round,
    # in round order (both ran minutes apart at most), so that the spread
    # shows; a round without both runs is left out
    return [relay[k] - bare[k] for k in sorted(k for k in relay if k is not None) if k in bare]

def load(kind):
    p = os.path.join(out, kind, "results.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []

for kind in kinds:
    res = load(kind)
    if not res:
        rows.append({"kind": kind, "missing": True})
        continue
    if kind == "http":
        for bs, lanes in ((1, 32), (100, 8)):
            d = [r for r in res if r.get("kind") == "drain" and r.get("batch") == bs]
            if not d:
                continue
            relay = med(r["cpu_s"][str(r["worker_pid"])] / r["n"] for r in d)
            rate = med(r["rate"] for r in d)
            bk = "libcurl" if bs == 1 else "libcurl_batch"
            b = [r for r in res if r.get("kind") == bk and r.get("requests")]
            bare = med(r["cpu_s"] / (r["requests"] * r.get("batch", 1)) for r in b) if b else None
            brate = med(r["rps"] * r.get("batch", 1) for r in b) if b else None
            ceiling = med(r["rps"] for r in res if r.get("kind") == "wrk") if any(r.get("kind") == "wrk" for r in res) else None
            rounds = own_rounds({r.get("round"): r["cpu_s"][str(r["worker_pid"])] / r["n"] * 1e6 for r in d},
                                {r.get("round"): r["cpu_s"] / (r["requests"] * r.get("batch", 1)) * 1e6 for r in b})
            row = {"kind": "http", "config": f"{bs}:{lanes}", "relay_us": relay * 1e6, "own_rounds": rounds,
                   "bare_us": bare * 1e6 if bare else None, "rate": rate,
                   "bare_rate": brate, "bare": f"libcurl, {'1 message' if bs == 1 else str(bs) + ' messages'} per request"}
            if bs == 100 and ceiling:
                row["vs_ceiling"] = rate / ceiling
            rows.append(row)
        lat = [r for r in res if r.get("kind") == "latency"]
        if lat:
            l = lat[0]["arrival_minus_emitted_at_ms"]
            c = lat[0].get("arrival_minus_commit_returned_ms") or {}
            k = lat[0].get("commit_call_ms") or {}
            rows.append({"kind": "http latency", "p50": l.get("p50"), "p99": l.get("p99"),
                         "commit_p50": c.get("p50"), "commit_p99": c.get("p99"),
                         "call_p50": k.get("p50"), "call_p99": k.get("p99")})
    elif kind in ("nats", "kafka"):
        d = [r for r in res if r.get("kind") == "relay" and r.get("seconds")]
        b = [r for r in res if r.get("kind") == "bare" and r.get("seconds")]
        bk = "publisher_cpu_s" if kind == "nats" else "producer_cpu_s"
        n = [int(x) for x in [os.environ.get("N", "100000")]][0]
        if d:
            rows.append({"kind": kind, "config": f"{d[0]['batch']}:{d[0]['lanes']}",
                         "relay_us": med(r["worker_cpu_s"] for r in d) / n * 1e6,
                         "bare_us": med(r[bk] for r in b) / n * 1e6 if b else None,
                         "rate": med(r["rate"] for r in d), "bare_rate": med(r["rate"] for r in b) if b else None,
                         "own_rounds": own_rounds({r.get("round"): r["worker_cpu_s"] / n * 1e6 for r in d},
                                                  {r.get("round"): r[bk] / n * 1e6 for r in b}),
                         "bare": "libnats async publisher" if kind == "nats" else "idempotent librdkafka producer"})
            # the same publisher with every header the relay puts on a message
            ba = [r for r in res if r.get("kind") == "bare_all" and r.get("seconds")]
            if ba:
                rows.append(dict(rows[-1], bare_us=med(r[bk] for r in ba) / n * 1e6,
                                 own_rounds=own_rounds({r.get("round"): r["worker_cpu_s"] / n * 1e6 for r in d},
                                                       {r.get("round"): r[bk] / n * 1e6 for r in ba}),
                                 bare_rate=med(r["rate"] for r in ba),
                                 bare="libnats async publisher, the relay's five headers"))
    else:
        n = int(os.environ.get("N", "100000"))
        d = [r for r in res if r.get("run") == "relay"]
        b = [r for r in res if r.get("run") == "bare"]
        if d:
            rows.append({"kind": kind, "config": "100:8",
                         "relay_us": med(r["cpu_relay"] for r in d) / n * 1e6,
                         "bare_us": med(r["cpu_client"] for r in b) / n * 1e6 if b else None,
                         "rate": n / med(r["secs"] for r in d), "bare_rate": n / med(r["secs"] for r in b) if b else None,
                         "own_rounds": own_rounds({r.get("round"): r["cpu_relay"] / n * 1e6 for r in d},
                                                  {r.get("round"): r["cpu_client"] / n * 1e6 for r in b}),
                         "bare": "hiredis pipeline" if kind == "redis" else "rabbitmq-c with confirms"})

print(f"{'transport':14} {'batch:lanes':>11} {'relay us/msg':>12} {'bare us/msg':>11} {'own us/msg':>10} {'relay msg/s':>11} {'bare msg/s':>10} {'ratio':>6}  bare client")
for r in rows:
    if r.get("missing"):
        print(f"{r['kind']:14} no results")
    elif r["kind"] == "http latency":
        print(f"{'http latency':14} p50 {r['p50']} ms, p99 {r['p99']} ms (500 msg/s, batch_size 1, arrival minus emitted_at)")
        if r.get("commit_p50") is not None:
            print(f"{'':14} p50 {r['commit_p50']} ms, p99 {r['commit_p99']} ms from the commit's return to the client"
                  f" (the client's whole call: p50 {r['call_p50']} ms, p99 {r['call_p99']} ms)")
    else:
        own = r["relay_us"] - r["bare_us"] if r.get("bare_us") is not None else float("nan")
        ratio = r["rate"] / r["bare_rate"] if r.get("bare_rate") else float("nan")
        extra = f"; {r['vs_ceiling']:.2f} x nginx's ceiling" if "vs_ceiling" in r else ""
        print(f"{r['kind']:14} {r['config']:>11} {r['relay_us']:12.2f} {r.get('bare_us') or float('nan'):11.2f} {own:10.2f} "
              f"{r['rate']:11.0f} {r.get('bare_rate') or float('nan'):10.0f} {ratio:6.2f}  {r['bare']}{extra}")
        if len(r.get("own_rounds") or []) > 1:
            print(f"{'':14} {'':>11} own us/msg round by round (relay minus the bare run of its round, rounds without both left out): "
                  + " ".join(f"{x:.2f}" for x in r["own_rounds"]) + f" (median {med(r['own_rounds']):.2f})")
json.dump(rows, open(os.path.join(out, "cost.json"), "w"), indent=1)
PY
# Where the relay's samples go, from the profiles (test/bench/fold_split.py)
if [ "$PERF" = 1 ]; then
	echo
	for kind in $KINDS; do
		for f in "$OUT/$kind"/perf-*.folded; do
			if [ -s "$f" ]; then
				/usr/bin/python3 "$here/fold_split.py" "$f"
			fi
		done
	done
fi | sed "s|$OUT/||" | tee -a "$OUT/cost.txt"
