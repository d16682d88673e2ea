#!/usr/bin/env bash
# kafka_bench.sh - delivery throughput of the outbox relay into Kafka
# (librdkafka's mock cluster), against a bare librdkafka idempotent
# producer into the same cluster, on a throwaway PostgreSQL cluster.
#
# Run by hand, as root (not in CI):
#
#   test/bench/kafka_bench.sh                      # ~3 minutes on 2 cores (RUNS=3)
#   LANES=32 BATCH=500 test/bench/kafka_bench.sh   # another setting
#   CONFIGS="100:8 500:32 1000:64" test/bench/kafka_bench.sh  # several, same run
#   CONFIGS="100:8 100:8:linger.ms=0" test/bench/kafka_bench.sh  # and properties
#   PERF=1 test/bench/kafka_bench.sh               # and a profile of the relay
#
# What it measures (everything on 127.0.0.1, one machine; the peer is
# test/kafka/outbox_kafka mock: librdkafka's mock cluster of 3 brokers in a
# process of its own, every topic PARTITIONS=6 partitions, replication
# factor 3, in memory):
#   relay   a backlog of N=100000 committed messages (keys k0..k999, payload
#           {"key": "k<g % KEYS>", "seq": g, "data": "xxxxxxxx"}, the bare
#           producer's payload give or take jsonb's spaces) emitted in XACTS
#           transactions (generate_series) while a fresh Kafka target
#           (topic 'bench.c<i>.r<round>', created on the mock just before,
#           properties from the CONFIGS entry) is paused
#           (outbox.pause_target), then released at once
#           (outbox.resume_target); time from just before the resume until
#           the topic holds all N records, polled every POLL_MS ms by a small
#           librdkafka poller (one client, a watermark query of every
#           partition per poll, built here from the C below); rate =
#           N / elapsed.  Per CONFIGS entry batch_size:lanes[:PROP=VALUE,...]
#           (default BATCH:LANES = 100:8, no properties: librdkafka's
#           defaults, linger.ms 5 in librdkafka 2.0).  Also recorded: the time
#           until the relay's own bookkeeping (outbox.progress delivered) says
#           N, polled in SQL every POLL_MS ms after the topic is full.
#   bare    test/kafka/outbox_kafka produce: the same N messages (keys
#           k0..k999, headers webhook-id and outbox-seq) from one idempotent
#           producer (acks=all, murmur2_random, linger.ms=5, plus BARE_PROPS)
#           into a fresh topic 'bench.bare.r<round>' of the same mock cluster,
#           every delivery report waited for; the rate it prints (its own
#           clock, first produce to last report).  The relay's records carry
#           two more headers (outbox-topic, outbox-key).
# The relay's runs go into a fresh target too (every target dropped, the
# outbox emptied, VACUUM ANALYZE and a CHECKPOINT before each).  The runs
# alternate over RUNS rounds (the order rotates every round); per round
# both rates and relay/bare are recorded, and medians reported:
#   relay/bare       goal >= 0.80 (ratio of the medians, and the median of
#                    the per-round ratios: runs of a round are close in time)
#   relay msg/s      goal >= 100,000
# After every relay run the topic is read back (outbox_kafka consume):
# every one of the N outbox-seq values of the backlog is there (duplicates
# allowed, counted and reported), nothing else, every key in one partition,
# per key the first copies in commit order; outbox.lag pending 0, N
# delivered, no dead letters, no lane with last_error.  After every bare
# run the topic holds exactly N (watermarks).  CPU (user+system over the
# run, as a share of one core) of the relay worker (per thread: its own
# ("main") and librdkafka's, by thread name; and its context switches, the
# main thread's apart), the mock cluster's process and the bare producer,
# and the CPUs the machine had busy, are recorded with every run.  The
# resume call's own duration (resume_target counts the pending messages
# before it commits) is reported next to the rate, as is the time to the
# first stored record.
#   profile  (PERF=1) after the rounds, one more relay run of the first
#            CONFIGS entry under perf record --call-graph dwarf of the relay
#            worker (not timed: perf slows it), reported by thread and symbol.
#
# Settings (environment):
#   RUNS=3 N=100000 KEYS=1000 XACTS=4 (transactions the backlog is emitted in)
#   BATCH=100 LANES=8            the relay target's batch_size and lanes
#   CONFIGS="$BATCH:$LANES"      batch_size:lanes[:PROP=VALUE,PROP=VALUE...] of
#                                the relay runs, several to compare in one run;
#                                the properties go into the target's
#                                properties (as strings), e.g. 100:8:linger.ms=5
#   BARE_PROPS=                  PROP=VALUE ... for the bare producer
#                                (space-separated; e.g. linger.ms=0)
#   PARTITIONS=6                 partitions of every topic
#   POLL_MS=50                   the poll of the topic's record count
#   DRAIN_TIMEOUT=300            seconds a run may take
#   PERF=0 KEEP=0
#   REV=                         build this git revision instead of the
#                                working tree (e.g. REV=HEAD: committed code only)
#   INSTALL=0                    1: also install the build system-wide
#   OUT=DIR                      copy the raw results (JSON lines, poll
#                                timelines, read-back summaries, the mock's
#                                and the server's logs) there
#   PORT=54347                   a non-default port, 127.0.0.1 only (the
#                                mock's brokers take ports of their own)
#   WAIT_FOR="relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh"
#                                wait (polling every 30 s) while a process
#                                whose command line matches runs ('' = no)
#   QUIET_MAX=0.3 QUIET_WAIT=120 before every run wait (at most QUIET_WAIT s)
#                                until at most QUIET_MAX CPUs are busy; runs
#                                measured on a busy machine are listed as
#                                anomalies
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-100000}
KEYS=${KEYS:-1000}
XACTS=${XACTS:-4}
BATCH=${BATCH:-100}
LANES=${LANES:-8}
CONFIGS=${CONFIGS:-"$BATCH:$LANES"}
BARE_PROPS=${BARE_PROPS:-}
PARTITIONS=${PARTITIONS:-6}
POLL_MS=${POLL_MS:-50}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-300}
PERF=${PERF:-0}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54347}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh"}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-120}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

prop_re='[A-Za-z0-9._-]+=[^,:[:space:]"\\]+'
for c in $CONFIGS; do
	[[ $c =~ ^[1-9][0-9]*:[1-9][0-9]*(:$prop_re(,$prop_re)*)?$ ]] ||
		{ echo "CONFIGS: batch_size:lanes[:PROP=VALUE,...] entries, not '$c'" >&2; exit 2; }
done
for p in $BARE_PROPS; do
	[[ $p =~ ^$prop_re$ ]] || { echo "BARE_PROPS: PROP=VALUE entries, not '$p'" >&2; exit 2; }
done
[[ $PARTITIONS =~ ^[1-9][0-9]*$ ]] || { echo "PARTITIONS: a positive number" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=kafka-bench
BENCH_PACKAGES=(gcc librdkafka-dev)
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
mock_pid=
poll_pid=
perf_pid=
bench_on_exit() {
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null
	[ -n "$poll_pid" ] && kill "$poll_pid" 2>/dev/null
	kafka_mock_stop
}
. "$here/common.sh"
bench_setup

# ---- tools -----------------------------------------------------------------------
# The poller: one client, a watermark query (ListOffsets) of every partition
# every POLL_MS ms; prints "<realtime ns> <records>" (sum over the partitions
# of high - low watermark) whenever the count changed, the first complete
# poll included, and exits 0 once the topic holds at least N (1 on timeout).
# A poll that fails (a partition without a leader yet) is skipped.
cat >"$work/kafka_poll.c" <<'EOF'
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <librdkafka/rdkafka.h>

static int64_t
now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t) t.tv_sec * 1000000000 + t.tv_nsec;
}

int
main(int argc, char **argv)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char		errstr[512];
	int			parts, p, errors = 0;
	int64_t		want, last = -1, poll_ns, deadline;

	if (argc != 7)
	{
		fprintf(stderr, "usage: kafka_poll BOOTSTRAP TOPIC PARTITIONS N POLL_MS TIMEOUT_S\n");
		return 2;
	}
	parts = atoi(argv[3]);
	want = atoll(argv[4]);
	poll_ns = atoll(argv[5]) * 1000000;
	conf = rd_kafka_conf_new();
	if (rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "kafka_poll: %s\n", errstr);
		return 1;
	}
	if ((rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr))) == NULL)
	{
		fprintf(stderr, "kafka_poll: rd_kafka_new: %s\n", errstr);
		return 1;
	}
	deadline = now_ns() + atoll(argv[6]) * 1000000000LL;
	for (;;)
	{
		int64_t		sum = 0, t;
		int			ok = 1;

		for (p = 0; p < parts && ok; p++)
		{
			int64_t		lo, hi;
			rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(rk, argv[2], p, &lo, &hi, 5000);

			if (err)
			{
				if (errors++ < 10)
					fprintf(stderr, "kafka_poll: watermarks of %s [%d]: %s\n", argv[2], p, rd_kafka_err2str(err));
				ok = 0;
			}
			else
				sum += hi - lo;
		}
		t = now_ns();
		if (ok && sum != last)
		{
			last = sum;
			printf("%" PRId64 " %" PRId64 "\n", t, last);
			fflush(stdout);
		}
		if (last >= want)
			break;
		if (t > deadline)
		{
			rd_kafka_destroy(rk);
			return 1;
		}
		usleep(poll_ns / 1000);
	}
	rd_kafka_destroy(rk);
	return 0;
}
EOF
cc -O2 -Wall -o "$work/kafka_poll" "$work/kafka_poll.c" -lrdkafka
kafka() { "$work/outbox_kafka" "$@"; }

# ---- the mock cluster (common.sh) ---------------------------------------------------
kafka_mock_start
rdkafka_version=$(dpkg-query -W -f='${Version}' librdkafka-dev 2>/dev/null || echo '?')
log "librdkafka $rdkafka_version mock cluster, 3 brokers on $BOOT (pid $mock_pid); $PARTITIONS partitions a topic"

# ---- database ------------------------------------------------------------------------
psqlq -d postgres -c "CREATE DATABASE $DB"
sql >/dev/null <<SQL
CREATE EXTENSION outbox;
-- the bare producer's payload ({"seq":1,"key":"k1","data":"xxxxxxxx"}), as jsonb
CREATE FUNCTION bench_payload(g bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS \$\$ SELECT jsonb_build_object('seq', g, 'key', 'k' || (g % $KEYS), 'data', 'xxxxxxxx') \$\$;
SQL
payload_bytes=$(sql -c "SELECT length(bench_payload($N)::text)")
bare_payload_bytes=$(printf '{"seq":%d,"key":"k%d","data":"xxxxxxxx"}' "$((N - 1))" "$(((N - 1) % KEYS))" | wc -c)

# ---- helpers --------------------------------------------------------------------------

# A CONFIGS entry's properties as jsonb text: "a=1,b=x" -> {"a": "1", "b": "x"}
props_json() {
	local out="{" sep="" kv
	[ -n "$1" ] || { echo "{}"; return; }
	IFS=, read -r -a kvs <<<"$1"
	for kv in "${kvs[@]}"; do
		out+="$sep\"${kv%%=*}\": \"${kv#*=}\""
		sep=", "
	done
	echo "$out}"
}

# records in a topic (sum of the partitions' watermarks), waiting a little for
# them to settle
topic_records() { "$work/kafka_poll" "$BOOT" "$1" "$PARTITIONS" "${2:-0}" 10 "${3:-0}" 2>/dev/null | tail -1 | cut -d' ' -f2; }

# CPU ticks (utime + stime) of a process, all threads; of each thread as
# a JSON object {"tid comm": ticks}; of the whole machine (busy, total).
ticks_of() { awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$1/stat"; }
thread_ticks() {
	local t out="{" sep=""
	for t in /proc/"$1"/task/*; do
		[ -r "$t/stat" ] || continue
		out+="$sep\"${t##*/} $(tr -d '"\\' <"$t/comm")\": $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "$t/stat" 2>/dev/null || echo 0)"
		sep=", "
	done
	echo "$out}"
}
# context switches of a process, all threads: voluntary nonvoluntary; of its
# main thread only
ctxsw_of() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {v += $2} /^nonvoluntary_ctxt_switches/ {n += $2} END {print v + 0, n + 0}'; }
ctxsw_main() { awk '/^voluntary_ctxt_switches/ {v = $2} /^nonvoluntary_ctxt_switches/ {n = $2} END {print v + 0, n + 0}' "/proc/$1/task/$1/status"; }
machine_ticks() { awk 'NR == 1 {b = 0; t = 0; for (i = 2; i <= 9; i++) { t += $i; if (i != 5 && i != 6) b += $i }; print b, t}' /proc/stat; }
HZ=$(getconf CLK_TCK)

# Drop every target, empty the outbox, make a fresh topic on the mock and a
# fresh paused target into it, and emit the backlog; writes the backlog's ids
# to $work/ids.txt.
prepare_backlog() {	# name topic batch_size lanes properties-json
	local name=$1 topic=$2 bs=$3 lanes=$4 props=$5 i lo hi per cnt
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null
	mock_cmd create "$topic" "$PARTITIONS"
	sql -c "SELECT outbox.create_kafka_target('$name', '$BOOT', topic => '$topic', properties => '$props'::jsonb, batch_size => $bs, lanes => $lanes)" \
		-c "SELECT outbox.pause_target('$name')" \
		-c "SELECT outbox.subscribe('$name', '*')" >/dev/null
	per=$(((N + XACTS - 1) / XACTS))
	for ((i = 0; i < XACTS; i++)); do
		lo=$((i * per + 1)) hi=$(((i + 1) * per))
		[ "$hi" -gt "$N" ] && hi=$N
		[ "$lo" -gt "$hi" ] && break
		sql -c "SELECT count(outbox_emit('orders', bench_payload(g), 'k' || (g % $KEYS))) FROM generate_series($lo, $hi) g" >/dev/null
	done
	sql -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
	sql -c "SELECT m.id FROM outbox.messages m, outbox.subscriptions s WHERE s.target_id = outbox.target_id('$name') AND m.id > s.start_id ORDER BY m.id" >"$work/ids.txt"
	cnt=$(wc -l <"$work/ids.txt")
	[ "$cnt" = "$N" ] || echo "prepare_backlog $name: $cnt messages above the subscription start, expected $N" | tee -a "$work/anomalies" >&2
	cnt=$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = outbox.target_id('$name')")
	[ "$cnt" = 0 ] || echo "prepare_backlog $name: $cnt messages delivered while paused" | tee -a "$work/anomalies" >&2
}

# Read a topic back and check it against $work/ids.txt: prints a JSON object
# (records, distinct, duplicates, missing, extra, keys_in_several_partitions,
# keys_out_of_order).
readback() {	# topic label
	local f=$work/consume.jsonl
	if ! kafka consume "$BOOT" "$1" 120 >"$f" 2>"$work/consume.err"; then
		echo "$2: outbox_kafka consume $1 failed: $(tail -3 "$work/consume.err")" | tee -a "$work/anomalies" >&2
	fi
	"$PY" - "$f" "$work/ids.txt" <<-'PYEOF'
	import json, sys
	ids = set(int(l) for l in open(sys.argv[2]) if l.strip())
	seen, dup, extra, order_bad, nrec = set(), 0, 0, set(), 0
	key_parts, last_first = {}, {}
	for l in open(sys.argv[1]):
	    if not l.strip():
	        continue
	    r = json.loads(l)
	    nrec += 1
	    seq = int(r["headers"].get("outbox-seq", "-1"))
	    k = r["key"]
	    key_parts.setdefault(k, set()).add(r["partition"])
	    if seq not in ids:
	        extra += 1
	        continue
	    if seq in seen:
	        dup += 1
	        continue
	    seen.add(seq)
	    # records come by partition then offset: per key, first copies in
	    # commit (outbox-seq) order
	    if k in last_first and seq < last_first[k]:
	        order_bad.add(k)
	    last_first[k] = seq
	print(json.dumps({"records": nrec, "distinct": len(seen), "duplicates": dup, "missing": len(ids - seen),
	    "extra": extra, "keys_in_several_partitions": sum(1 for v in key_parts.values() if len(v) > 1),
	    "keys_out_of_order": len(order_bad)}))
	PYEOF
}

# After a relay run: the topic holds every message of the backlog, and the
# target's bookkeeping has caught up (waits up to 10 s for it); appends to
# anomalies.  Sets READBACK (readback's JSON).
check_relay() {	# name topic label
	local out pend del dead errs dl bad=""
	for _ in $(seq 200); do
		pend=$(sql -c "SELECT pending FROM outbox.lag WHERE target = '$1'")
		[ "$pend" = 0 ] && break
		sleep 0.05
	done
	out=$(sql -F' ' -c "SELECT coalesce(sum(p.delivered), 0), coalesce(sum(p.dead), 0), count(*) FILTER (WHERE p.last_error IS NOT NULL),
			(SELECT count(*) FROM outbox.dead_letters d WHERE d.target = '$1')
			FROM outbox.progress p WHERE p.target_id = outbox.target_id('$1')")
	read -r del dead errs dl <<<"$out"
	READBACK=$(readback "$2" "$3")
	bad+=$("$PY" -c 'import json, sys
r = json.loads(sys.argv[1]); n = int(sys.argv[2])
out = ""
if r["distinct"] != n: out += " distinct_outbox_seq=%d" % r["distinct"]
for k in ("missing", "extra", "keys_in_several_partitions", "keys_out_of_order"):
    if r[k]: out += " %s=%d" % (k, r[k])
print(out, end="")' "$READBACK" "$N")
	[ "$pend" = 0 ] || bad+=" lag.pending=$pend"
	[ "$del" = "$N" ] || bad+=" delivered=$del"
	[ "$dead" = 0 ] || bad+=" dead=$dead"
	[ "$dl" = 0 ] || bad+=" dead_letters=$dl"
	[ "$errs" = 0 ] || bad+=" lanes_with_last_error=$errs ($(sql -c "SELECT string_agg(DISTINCT last_error, '; ') FROM outbox.progress WHERE target_id = outbox.target_id('$1')"))"
	[ -z "$bad" ] || echo "$3: expected $N:$bad" | tee -a "$work/anomalies" >&2
}

# One timed relay run; records a JSON line.
run_relay() {	# config-index batch_size lanes props round
	local ci=$1 bs=$2 lanes=$3 props=$4 r=$5 name="kafka_c$1_r$5" topic="bench.c$1.r$5" label wpid tl pj
	label="b${bs}_l${lanes}${props:+:$props}"
	pj=$(props_json "$props")
	prepare_backlog "$name" "$topic" "$bs" "$lanes" "$pj"
	wpid=$(worker_pid)
	[ -n "$wpid" ] || { echo "no outbox relay process" >&2; exit 1; }
	wait_quiet "relay $label round $r"
	tl=$work/out/poll-c$ci-r$r.txt
	"$work/kafka_poll" "$BOOT" "$topic" "$PARTITIONS" "$N" "$POLL_MS" "$DRAIN_TIMEOUT" >"$tl" 2>>"$work/poll.err" &
	poll_pid=$!
	for _ in $(seq 300); do [ -s "$tl" ] && break; sleep 0.01; done	# connected, first poll (0)
	local w0 k0 m0 th0 kth0 cs0 csm0 times prc=0
	w0=$(ticks_of "$wpid") k0=$(ticks_of "$mock_pid") m0=$(machine_ticks) th0=$(thread_ticks "$wpid") kth0=$(thread_ticks "$mock_pid")
	cs0=$(ctxsw_of "$wpid") csm0=$(ctxsw_main "$wpid")
	times=$(sql -c "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint" \
		-c "SELECT outbox.resume_target('$name')" -c "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint")
	wait "$poll_pid" || prc=$?
	poll_pid=
	local w1 k1 m1 th1 kth1 cs1 csm1 recorded=0
	w1=$(ticks_of "$wpid") k1=$(ticks_of "$mock_pid") m1=$(machine_ticks) th1=$(thread_ticks "$wpid") kth1=$(thread_ticks "$mock_pid")
	cs1=$(ctxsw_of "$wpid") csm1=$(ctxsw_main "$wpid")
	# until the relay's bookkeeping has them all (not in the rate)
	for _ in $(seq 400); do
		recorded=$(sql -c "SELECT CASE WHEN coalesce(sum(delivered), 0) >= $N THEN (extract(epoch FROM clock_timestamp()) * 1e9)::bigint ELSE 0 END FROM outbox.progress WHERE target_id = outbox.target_id('$name')")
		[ "$recorded" != 0 ] && break
		sleep "$(awk -v p="$POLL_MS" 'BEGIN {print p / 1000}')"
	done
	[ "$prc" = 0 ] || echo "relay $label round $r: the topic did not reach $N in ${DRAIN_TIMEOUT}s (poller exit $prc; last: $(tail -1 "$tl"))" | tee -a "$work/anomalies" >&2
	check_relay "$name" "$topic" "relay $label round $r"
	local rec
	rec=$("$PY" - "$tl" "$N" "$HZ" "$(nproc)" <<-PYEOF
	import json, re, sys
	tl = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
	n, hz, ncpu = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
	t0, _, t1 = (int(x) for x in """$times""".split())
	end = next((t for t, c in tl if c >= n), None)
	first = next((t for t, c in tl if c > 0), None)
	secs = (end - t0) / 1e9 if end else None
	recorded = $recorded
	# 10%..90% of N, from the poll timeline (interpolated at the polls)
	def at(frac):
	    return next((t for t, c in tl if c >= frac * n), None)
	a, b = at(0.1), at(0.9)
	def by_thread(t0, t1, pid):
	    # the process's own thread ("main") and the others by name, digits
	    # dropped (rdk:broker1, rdk:broker2 ... -> rdk:broker)
	    out = {}
	    for k, v in t1.items():
	        tid, comm = k.split(" ", 1)
	        name = "main" if tid == str(pid) else re.sub(r"[-0-9]+$", "", comm)
	        out[name] = out.get(name, 0) + (v - t0.get(k, 0)) / hz
	    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda x: -x[1]) if v > 0}
	th0, th1 = json.loads('''$th0'''), json.loads('''$th1''')
	kth0, kth1 = json.loads('''$kth0'''), json.loads('''$kth1''')
	mb0, mt0 = map(int, "$m0".split()); mb1, mt1 = map(int, "$m1".split())
	cv0, cn0 = map(int, "$cs0".split()); cv1, cn1 = map(int, "$cs1".split())
	mv0, mn0 = map(int, "$csm0".split()); mv1, mn1 = map(int, "$csm1".split())
	print(json.dumps({"kind": "relay", "config": $ci, "batch": $bs, "lanes": $lanes, "props": "$props", "round": $r, "label": "$label",
	    "busy_before": $BUSY, "worker_pid": $wpid, "seconds": secs, "rate": n / secs if secs else 0,
	    "resume_ms": (t1 - t0) / 1e6, "first_ms": (first - t0) / 1e6 if first else None,
	    "recorded_ms": (recorded - t0) / 1e6 if recorded else None,
	    "rate_10_90": 0.8 * n / ((b - a) / 1e9) if a and b and b > a else None,
	    "polls_changed": len(tl), "worker_threads": len(th1),
	    "ctxsw_voluntary": cv1 - cv0, "ctxsw_involuntary": cn1 - cn0,
	    "ctxsw_main_voluntary": mv1 - mv0, "ctxsw_main_involuntary": mn1 - mn0,
	    "worker_cpu_s": ($w1 - $w0) / hz, "mock_cpu_s": ($k1 - $k0) / hz,
	    "worker_threads_cpu_s": by_thread(th0, th1, $wpid), "mock_threads_cpu_s": by_thread(kth0, kth1, $mock_pid),
	    "readback": json.loads('''$READBACK'''),
	    "machine_cpus_busy": (mb1 - mb0) / (mt1 - mt0) * ncpu if mt1 > mt0 else 0}))
	PYEOF
	)
	echo "$rec" >>"$RESULTS"
	log "  relay $label: $("$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print("%.0f msg/s (%.3f s; resume call %.0f ms; first stored after %.0f ms; 10-90%%: %s msg/s; all recorded after %s ms); relay CPU %.2f s (%s), mock CPU %.2f s; machine %.2f CPUs busy; read back %d records, %d duplicates" % (r["rate"], r["seconds"] or 0, r["resume_ms"], r["first_ms"] or 0, "%.0f" % r["rate_10_90"] if r["rate_10_90"] else "-", "%.0f" % r["recorded_ms"] if r["recorded_ms"] else "-", r["worker_cpu_s"], ", ".join("%s %.2f" % kv for kv in r["worker_threads_cpu_s"].items()), r["mock_cpu_s"], r["machine_cpus_busy"], r["readback"]["records"], r["readback"]["duplicates"]))' "$rec")"
	sql -c "SELECT outbox.drop_target('$name')" -c "TRUNCATE outbox.messages" >/dev/null
}

# One bare producer run; records a JSON line.
run_bare() {	# round
	local r=$1 topic="bench.bare.r$1" rate k0 k1 m0 m1 kth0 kth1 cnt tm brc=0
	mock_cmd create "$topic" "$PARTITIONS"
	wait_quiet "bare round $r"
	k0=$(ticks_of "$mock_pid") m0=$(machine_ticks) kth0=$(thread_ticks "$mock_pid")
	# shellcheck disable=SC2086
	tm=$({ TIMEFORMAT='%R %U %S'; time kafka produce "$BOOT" "$topic" "$N" "$KEYS" $BARE_PROPS >"$work/bare.out" 2>"$work/bare.err"; } 2>&1) || brc=$?
	k1=$(ticks_of "$mock_pid") m1=$(machine_ticks) kth1=$(thread_ticks "$mock_pid")
	[ "$brc" = 0 ] || { echo "bare round $r: outbox_kafka produce failed ($brc): $(tail -3 "$work/bare.err")" | tee -a "$work/anomalies" >&2; tm=$(tail -1 <<<"$tm"); }
	rate=$(head -1 "$work/bare.out")
	[ -n "$rate" ] || rate=0
	cnt=$(topic_records "$topic" "$N" 10)
	[ "$cnt" = "$N" ] || echo "bare round $r: topic holds ${cnt:-?} records, expected $N" | tee -a "$work/anomalies" >&2
	local rec
	rec=$("$PY" - <<-PYEOF
	import json, re
	real, user, sys_ = map(float, "$tm".split()[-3:])
	mb0, mt0 = map(int, "$m0".split()); mb1, mt1 = map(int, "$m1".split())
	kth0, kth1 = json.loads('''$kth0'''), json.loads('''$kth1''')
	mock = {}
	for k, v in kth1.items():
	    tid, comm = k.split(" ", 1)
	    name = "main" if tid == "$mock_pid" else re.sub(r"[-0-9]+$", "", comm)
	    mock[name] = mock.get(name, 0) + (v - kth0.get(k, 0)) / $HZ
	rate = float("$rate")
	print(json.dumps({"kind": "bare", "round": $r, "busy_before": $BUSY, "rate": rate,
	    "seconds": $N / rate if rate else None, "wall_s": real, "producer_cpu_s": round(user + sys_, 3),
	    "mock_cpu_s": ($k1 - $k0) / $HZ, "mock_threads_cpu_s": {k: round(v, 2) for k, v in sorted(mock.items(), key=lambda x: -x[1]) if v > 0},
	    "machine_cpus_busy": (mb1 - mb0) / (mt1 - mt0) * $(nproc) if mt1 > mt0 else 0}))
	PYEOF
	)
	echo "$rec" >>"$RESULTS"
	log "  bare: $rate msg/s (process wall ${tm%% *} s); $("$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print("producer CPU %.2f s, mock CPU %.2f s; machine %.2f CPUs busy" % (r["producer_cpu_s"], r["mock_cpu_s"], r["machine_cpus_busy"]))' "$rec")"
}

# ---- is the machine quiet? --------------------------------------------------------------
busy_before=$(machine_busy 2)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "machine busy before the runs: $busy_before of $(nproc) CPUs; load $load_before"
for _ in $(seq 150); do worker0=$(worker_pid); [ -n "$worker0" ] && break; sleep 0.2; done
[ -n "$worker0" ] || { echo "no 'outbox relay' process" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }

# ---- the timed rounds -----------------------------------------------------------------------
# Entries of a round: every CONFIGS entry (by its index) and the bare
# producer, rotated.
read -r -a configs <<<"$CONFIGS"
plan=()
for ((i = 0; i < ${#configs[@]}; i++)); do plan+=("$((i + 1))"); done
plan+=(bare)
np=${#plan[@]}
log "plan: $RUNS rounds of: relay runs of $N messages ($KEYS keys) for batch_size:lanes[:properties] = $CONFIGS; the bare producer${BARE_PROPS:+ ($BARE_PROPS)}"
for ((r = 1; r <= RUNS; r++)); do
	log "round $r"
	for ((i = 0; i < np; i++)); do
		c=${plan[$(((i + r - 1) % np))]}
		if [ "$c" = bare ]; then
			run_bare "$r"
		else
			IFS=: read -r bs lanes props <<<"${configs[$((c - 1))]}"
			run_relay "$c" "$bs" "$lanes" "$props" "$r"
		fi
	done
done

# ---- profile ------------------------------------------------------------------------------
if [ "$PERF" = 1 ]; then
	if ! perf record -q -o "$work/perf-probe.data" -- true >/dev/null 2>&1; then
		echo "perf record does not work here; skipping the profile" >"$work/out/perf.txt"
	else
		IFS=: read -r bs lanes props <<<"${configs[0]}"
		name=kafka_perf
		topic=bench.perf
		log "profile: relay run of $N, batch_size $bs, $lanes lanes${props:+, $props}, under perf record --call-graph dwarf (not timed)"
		prepare_backlog "$name" "$topic" "$bs" "$lanes" "$(props_json "$props")"
		wpid=$(worker_pid)
		perf record -q -F 999 --call-graph dwarf,16384 -p "$wpid" -o "$work/perf.data" >/dev/null 2>&1 &
		perf_pid=$!
		sleep 0.5
		t0=$(date +%s%N)
		sql -c "SELECT outbox.resume_target('$name')" >/dev/null
		"$work/kafka_poll" "$BOOT" "$topic" "$PARTITIONS" "$N" "$POLL_MS" "$DRAIN_TIMEOUT" >"$work/out/poll-perf.txt" 2>>"$work/poll.err" || true
		t1=$(date +%s%N)
		kill -INT "$perf_pid"
		wait "$perf_pid" || true
		perf_pid=
		check_relay "$name" "$topic" "profile run"
		libview=$work/pkglib
		preport() {
			unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf report "$@"' \
				sh "$libview" "$pkglibdir" "$@" 2>/dev/null
		}
		set +o pipefail
		{
			echo "==== relay worker (pid $wpid), run of $N, batch_size $bs, $lanes lanes${props:+, $props}, under perf record -F 999 --call-graph dwarf"
			echo "  drain under perf: $(awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f msg/s", n / ((b - a) / 1e9)}')"
			echo "  self time by thread:"
			preport -i "$work/perf.data" --no-children --sort pid --stdio -g none | grep -E '^ +[0-9]' | head -12 | sed 's/^/    /'
			echo "  self time by thread name and shared object:"
			preport -i "$work/perf.data" --no-children --sort comm,dso --stdio -g none | grep -E '^ +[0-9]' | head -16 | sed 's/^/    /'
			echo "  top self-time symbols:"
			preport -i "$work/perf.data" --no-children --sort dso,sym --stdio -g none | grep -E '^ +[0-9]' | head -40 | sed 's/^/    /'
			echo "  inclusive time (children, self) of the top symbols:"
			preport -i "$work/perf.data" --children --sort dso,sym --stdio -g none | grep -E '^ +[0-9]' | head -40 | sed 's/^/    /'
		} >"$work/out/perf.txt"
		perf_fold "$work/perf.data" "$work/out/perf-relay.folded"
		set -o pipefail
	fi
fi

# ---- server logs ------------------------------------------------------------------------------
wend=$(worker_pid)
[ "$wend" = "$worker0" ] || echo "the relay worker changed pid: $worker0 -> ${wend:-none} (restarted?)" >>"$work/anomalies"
kill -0 "$mock_pid" 2>/dev/null || echo "the mock cluster's process (pid $mock_pid) is gone" >>"$work/anomalies"
set +o pipefail
{
	if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
		echo "SERVER LOG shows a crash:"
		grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
	fi
	echo "server log: $(grep -c 'ERROR' "$SERVERLOG" || true) ERROR, $(grep -c 'WARNING' "$SERVERLOG" || true) WARNING, $(grep -c 'FATAL' "$SERVERLOG" || true) FATAL, $(grep -c 'Kafka target' "$SERVERLOG" || true) Kafka target lines"
	grep -E 'ERROR|WARNING|FATAL|Kafka target' "$SERVERLOG" | sed -E 's/^.*(ERROR|WARNING|FATAL|LOG)/\1/' | sed -E 's/"kafka_c[0-9]+_r[0-9]+"/"kafka_c*_r*"/' | sort | uniq -c | sort -rn | head -10
	echo "mock cluster log: $(wc -l <"$work/mock.log") lines"
	sed -E 's/[0-9]+/N/g' "$work/mock.log" | sort | uniq -c | sort -rn | head -5
	if [ -s "$work/poll.err" ]; then
		echo "poller: $(wc -l <"$work/poll.err") error lines (polls skipped)"
		sed -E 's/\[[0-9]+\]/[P]/; s/bench\.[a-z0-9.]+/bench.*/' "$work/poll.err" | sort | uniq -c | sort -rn | head -3
	fi
} >"$work/out/serverlog.txt"
set -o pipefail

# ---- report -------------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$work/anomalies" "$work/out/perf.txt" "$work/out/serverlog.txt" <<PYEOF
import json, statistics, sys, os
res = [json.loads(l) for l in open(sys.argv[1])]
anom = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else ""
perf = open(sys.argv[3]).read() if os.path.exists(sys.argv[3]) else ""
slog = open(sys.argv[4]).read()
med = statistics.median
def goal(ok): return "met" if ok else "MISSED"

print()
print("outbox Kafka benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("  built from $build_rev (outbox.so md5 $build_md5); PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); librdkafka $rdkafka_version mock cluster (3 brokers, $PARTITIONS partitions, replication 3)")
print("  $(nproc) cores; machine busy before: $busy_before CPUs, load $load_before; N=$N messages, $KEYS keys, payload $payload_bytes bytes (bare $bare_payload_bytes); backlog in $XACTS transactions; $RUNS rounds; poll every $POLL_MS ms")
print()
bare = {r["round"]: r for r in res if r["kind"] == "bare"}
bare_med = med(r["rate"] for r in bare.values())
print(f"bare librdkafka producer (outbox_kafka produce, idempotent, acks=all, linger.ms=5${BARE_PROPS:+, $BARE_PROPS}): median {bare_med:.0f} msg/s   runs: " +
      " ".join(f"{bare[k]['rate']:.0f}" for k in sorted(bare)) +
      f"   producer CPU {med(r['producer_cpu_s'] / r['seconds'] for r in bare.values() if r['seconds']):.0%}, mock CPU {med(r['mock_cpu_s'] / r['seconds'] for r in bare.values() if r['seconds']):.0%} of a core")
print()
print("relay: backlog released with outbox.resume_target, until the topic holds N (msg/s)")
print(f"  {'config':22} {'round':>5} {'relay':>8} {'bare':>8} {'relay/bare':>10} {'resume ms':>9} {'first ms':>8} {'rec. ms':>7} {'10-90%':>8} {'relay CPU':>9} {'us/msg':>6} {'mock CPU':>8} {'machine':>7} {'dups':>5}")
best = None
summary = []
for ci, c in enumerate("$CONFIGS".split(), 1):
    rs = sorted((r for r in res if r["kind"] == "relay" and r["config"] == ci), key=lambda r: r["round"])
    if not rs: continue
    for r in rs:
        b = bare.get(r["round"])
        s = r["seconds"] or float("nan")
        print(f"  {c:22} {r['round']:5} {r['rate']:8.0f} {b['rate'] if b else float('nan'):8.0f} {r['rate'] / b['rate'] if b and b['rate'] else float('nan'):10.2f} "
              f"{r['resume_ms']:9.0f} {r['first_ms'] or 0:8.0f} {r['recorded_ms'] or float('nan'):7.0f} {r['rate_10_90'] or float('nan'):8.0f} {r['worker_cpu_s'] / s:9.0%} "
              f"{r['worker_cpu_s'] / $N * 1e6:6.1f} {r['mock_cpu_s'] / s:8.0%} {r['machine_cpus_busy']:7.2f} {r['readback']['duplicates']:5}")
    m = med(r["rate"] for r in rs)
    ratios = [r["rate"] / bare[r["round"]]["rate"] for r in rs if r["round"] in bare and bare[r["round"]]["rate"]]
    summary.append((c, m, m / bare_med if bare_med else float("nan"), med(ratios) if ratios else float("nan"), rs))
    print(f"  {c:22} {'med':>5} {m:8.0f} {bare_med:8.0f} {summary[-1][2]:10.2f}   (median of the per-round ratios {summary[-1][3]:.2f})")
    if best is None or m > best[1]: best = (c, m)
print("  (resume ms: the resume_target call itself, inside the time; first ms: until the first record was in the topic;")
print("   rec. ms: until outbox.progress counted N delivered (after the topic was full; not in the rate);")
print("   10-90%: rate between 10% and 90% of N stored; relay/mock CPU: share of one core over the run; us/msg: relay CPU per message;")
print("   dups: records read back whose outbox-seq was there before)")
print()
print("relay worker CPU by thread (seconds, medians over the rounds; main: the relay's own, rdk:*: librdkafka's):")
for c, m, rat, mr, rs in summary:
    names = {}
    for r in rs:
        for k in r["worker_threads_cpu_s"]:
            names.setdefault(k, []).append(r["worker_threads_cpu_s"][k])
    print(f"  {c:22} " + ", ".join(f"{k} {med(v):.2f}" for k, v in sorted(names.items(), key=lambda kv: -med(kv[1]))) +
          f"   ({med(r['worker_threads'] for r in rs)} threads)")
    print(f"  {'':22} context switches per message: all threads voluntary {med(r['ctxsw_voluntary'] for r in rs) / $N:.2f}, involuntary {med(r['ctxsw_involuntary'] for r in rs) / $N:.2f};"
          f" main thread voluntary {med(r['ctxsw_main_voluntary'] for r in rs) / $N:.3f}, involuntary {med(r['ctxsw_main_involuntary'] for r in rs) / $N:.3f}")
print("mock cluster CPU by thread (seconds, medians):")
for c, m, rat, mr, rs in summary:
    names = {}
    for r in rs:
        for k in r["mock_threads_cpu_s"]:
            names.setdefault(k, []).append(r["mock_threads_cpu_s"][k])
    print(f"  relay {c:16} " + ", ".join(f"{k} {med(v):.2f}" for k, v in sorted(names.items(), key=lambda kv: -med(kv[1]))))
names = {}
for r in bare.values():
    for k in r["mock_threads_cpu_s"]:
        names.setdefault(k, []).append(r["mock_threads_cpu_s"][k])
print(f"  {'bare':22} " + ", ".join(f"{k} {med(v):.2f}" for k, v in sorted(names.items(), key=lambda kv: -med(kv[1]))) +
      f"   (producer process {med(r['producer_cpu_s'] for r in bare.values()):.2f} s)")
print()
print(f"{'figure (medians)':44} {'value':>12}   goal")
print(f"{'bare producer msg/s':44} {bare_med:12.0f}")
for c, m, rat, mr, rs in summary:
    print(f"{'relay ' + c + ' msg/s':44} {m:12.0f}   >= 100000  {goal(m >= 100000)}")
    print(f"{'  relay / bare (ratio of medians)':44} {rat:12.2f}   >= 0.80    {goal(rat >= 0.8)}")
    print(f"{'  relay / bare (median of per-round ratios)':44} {mr:12.2f}")
    print(f"{'  duplicates read back (total over rounds)':44} {sum(r['readback']['duplicates'] for r in rs):12d}")
if len(summary) > 1:
    print(f"best relay setting: {best[0]} at {best[1]:.0f} msg/s")
print()
print("ANOMALIES:\n  " + anom.replace("\n", "\n  ") if anom else "sanity: every relay run's topic held all N outbox-seq values and nothing else (duplicates counted above), every key in one partition and its first copies in commit order, N delivered, no dead letters, no lane errors, lag pending 0; every bare topic held exactly N; the relay worker kept its pid")
print(slog.rstrip())
if perf:
    print()
    print(perf.rstrip())
PYEOF
[ -n "$OUT" ] || [ "$KEEP" = 1 ] || log "raw results removed with $work on exit; OUT=DIR keeps them"
