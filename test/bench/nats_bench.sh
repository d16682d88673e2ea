#!/usr/bin/env bash
# nats_bench.sh - delivery throughput of the outbox relay into NATS
# JetStream, against a bare libnats JetStream publisher into the same
# server, on a throwaway cluster and a throwaway nats-server.
#
# Run by hand, as root (not in CI):
#
#   test/bench/nats_bench.sh                       # ~2 minutes on 2 cores (RUNS=3)
#   LANES=32 BATCH=500 test/bench/nats_bench.sh    # another setting
#   CONFIGS="100:8 500:32 1000:64" test/bench/nats_bench.sh  # several, same run
#   PERF=1 test/bench/nats_bench.sh                # and a profile of the relay
#   TLS=1 PERF=tls test/bench/nats_bench.sh        # the profile's run over TLS
#
# What it measures (everything on 127.0.0.1, one machine; one nats-server
# 2.9 with JetStream on file storage in the throwaway directory):
#   relay   a backlog of N=100000 committed messages (keys k0..k999, payload
#           {"n": g, "pad": "0123456789"}, ~33 bytes of JSON text) emitted in
#           XACTS transactions (generate_series) while a fresh NATS target
#           (subject 'bench.{topic}', topic 'orders') is paused
#           (outbox.pause_target), then released at once
#           (outbox.resume_target); time from just before the resume until
#           the stream holds all N, polled every POLL_MS ms by a small
#           libnats poller (one connection, one STREAM.INFO request per
#           poll, built here from the C below); rate = N / elapsed.  Per
#           CONFIGS entry batch_size:lanes (default BATCH:LANES = 100:8).
#   bare    test/nats/outbox_nats publish: the same N messages (same
#           payload text, keys k0..k999 as outbox-key, a Nats-Msg-Id each)
#           published asynchronously from one libnats connection (at most
#           4096 unacknowledged) on bench.orders, all acknowledged; the
#           rate it prints (its own clock, first publish to last ack).  The
#           relay's messages carry three more headers (webhook-id,
#           outbox-seq, outbox-topic).
#   bare_all  the same publisher with those three headers too
#           (outbox_nats publish ... all): the relay's work without the
#           relay; relay/bare is reported against both
# Every run goes into a fresh stream BENCH (deleted and created again,
# subjects bench.>), so the duplicate window never drops anything; the
# relay's runs into a fresh target too (every target dropped, the outbox
# emptied, VACUUM ANALYZE and a CHECKPOINT before each).  The runs
# alternate over RUNS rounds (the order rotates every round); per round
# both rates and relay/bare are recorded, and medians reported:
#   relay/bare       goal >= 0.80 (ratio of the medians, and the median of
#                    the per-round ratios: runs of a round are close in time)
#   relay msg/s      goal >= 100,000
# After every relay run: the stream holds exactly N, outbox.lag pending 0,
# N delivered, no dead letters, no lane with last_error.  CPU (user+system
# over the run, as a share of one core) of the relay worker (per thread:
# its own and libnats'; and its context switches), nats-server and the
# bare publisher, and the CPUs
# the machine had busy, are recorded with every run.  The resume call's own
# duration (resume_target counts the pending messages before it commits)
# is reported next to the rate, as is the time to the first stored message.
#   relay_tls, bare_tls  (TLS=1) the same runs, the first CONFIGS entry for
#           the relay, against a second nats-server that wants TLS
#           (NATS_PORT + 1, a throwaway CA; tls://localhost with ca_file for
#           the relay, the CA for the bare publisher and the poller):
#           relay_tls/bare_tls (goal >= 0.80) and relay_tls/relay reported
#   profile  (PERF=1) after the rounds, one more relay run of the first
#            CONFIGS entry under perf record --call-graph dwarf of the relay
#            worker (not timed: perf slows it), reported by thread and symbol.
#            PERF=tls (with TLS=1): that run goes to the TLS server.
#
# Settings (environment):
#   RUNS=3 N=100000 KEYS=1000 XACTS=4 (transactions the backlog is emitted in)
#   BATCH=100 LANES=8            the relay target's batch_size and lanes
#   CONFIGS="$BATCH:$LANES"      batch_size:lanes of the relay runs, several
#                                to compare in one run
#   POLL_MS=50                   the poll of the stream's message count
#   DRAIN_TIMEOUT=300            seconds a run may take
#   PERF=0 KEEP=0 TLS=0
#   REV=                         build this git revision instead of the
#                                working tree (e.g. REV=HEAD: committed code only)
#   INSTALL=0                    1: also install the build system-wide
#   OUT=DIR                      copy the raw results (JSON lines, poll
#                                timelines, nats-server and server logs) there
#   PORT=54343 NATS_PORT=14243   non-default ports, 127.0.0.1 only
#   WAIT_FOR="relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh"
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
POLL_MS=${POLL_MS:-50}
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-300}
PERF=${PERF:-0}
TLS=${TLS:-0}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
if [ "$PERF" = tls ] && [ "$TLS" != 1 ]; then
	echo "PERF=tls needs TLS=1" >&2
	exit 2
fi
PORT=${PORT:-54343}
NATS_PORT=${NATS_PORT:-14243}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh"}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-120}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

for c in $CONFIGS; do
	[[ $c =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || { echo "CONFIGS: batch_size:lanes entries, not '$c'" >&2; exit 2; }
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=nats-bench
BENCH_PACKAGES=(gcc libnats-dev nats-server)
if [ "$PERF" != 0 ]; then BENCH_PACKAGES+=(linux-perf); fi
nats_pid=
poll_pid=
perf_pid=
tls_pid=
bench_on_exit() {
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null
	[ -n "$tls_pid" ] && kill -KILL "$tls_pid" 2>/dev/null
	nats_pid=${plain_pid:-$nats_pid}
	[ -n "$poll_pid" ] && kill "$poll_pid" 2>/dev/null
	if [ -n "$nats_pid" ]; then
		kill -TERM "$nats_pid" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$nats_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$nats_pid" 2>/dev/null
		[ -n "$OUT" ] && mkdir -p "$OUT" && cp "$work/nats.log" "$OUT/" 2>/dev/null
	fi
	return 0
}
. "$here/common.sh"
bench_setup

# ---- tools -----------------------------------------------------------------------
cc -O2 -Wall -o "$work/outbox_nats" "$repo/test/nats/outbox_nats.c" -lnats
# The poller: one connection, STREAM.INFO every POLL_MS ms; prints
# "<realtime ns> <messages>" whenever the count changed, and exits 0 once the
# stream holds at least N (1 on timeout).
cat >"$work/nats_poll.c" <<'EOF'
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <nats/nats.h>

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
	natsConnection *nc = NULL;
	natsOptions *opts = NULL;
	jsCtx	   *js = NULL;
	natsStatus	s;
	jsErrCode	jerr = 0;
	uint64_t	want, last = UINT64_MAX;
	int64_t		poll_ns, deadline;

	if (argc != 6)
	{
		fprintf(stderr, "usage: nats_poll URL STREAM N POLL_MS TIMEOUT_S\n");
		return 2;
	}
	want = strtoull(argv[3], NULL, 10);
	poll_ns = atoll(argv[4]) * 1000000;
	if ((s = natsOptions_Create(&opts)) != NATS_OK ||
		(s = natsOptions_SetURL(opts, argv[1])) != NATS_OK ||
		(getenv("OUTBOX_NATS_CA") &&
		 (s = natsOptions_LoadCATrustedCertificates(opts, getenv("OUTBOX_NATS_CA"))) != NATS_OK) ||
		(s = natsConnection_Connect(&nc, opts)) != NATS_OK ||
		(s = natsConnection_JetStream(&js, nc, NULL)) != NATS_OK)
	{
		fprintf(stderr, "nats_poll: connect: %s\n", natsStatus_GetText(s));
		return 1;
	}
	deadline = now_ns() + atoll(argv[5]) * 1000000000LL;
	for (;;)
	{
		jsStreamInfo *si = NULL;
		int64_t		t;

		if ((s = js_GetStreamInfo(&si, js, argv[2], NULL, &jerr)) != NATS_OK)
		{
			fprintf(stderr, "nats_poll: stream info: %s (jerr %d)\n", natsStatus_GetText(s), (int) jerr);
			return 1;
		}
		t = now_ns();
		if (si->State.Msgs != last)
		{
			last = si->State.Msgs;
			printf("%" PRId64 " %" PRIu64 "\n", t, last);
			fflush(stdout);
		}
		jsStreamInfo_Destroy(si);
		if (last >= want)
			return 0;
		if (t > deadline)
			return 1;
		nats_Sleep(poll_ns / 1000000);
	}
}
EOF
cc -O2 -Wall -o "$work/nats_poll" "$work/nats_poll.c" -lnats

# ---- nats-server -------------------------------------------------------------------
mkdir -p "$work/nats"
NATS_URL=nats://127.0.0.1:$NATS_PORT
nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$work/nats" -n bench -l "$work/nats.log" &
nats_pid=$!
for _ in $(seq 100); do grep -q 'Server is ready' "$work/nats.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'Server is ready' "$work/nats.log" 2>/dev/null || { echo "nats-server did not start:" >&2; cat "$work/nats.log" >&2; exit 1; }
log "nats-server $(nats-server --version 2>&1 | awk '{print $NF}') on $NATS_URL (pid $nats_pid), store $work/nats"
PLAIN_URL=$NATS_URL
plain_pid=$nats_pid
if [ "$TLS" = 1 ]; then
	# a second server that wants TLS; the runs over TLS switch to it (use_tls)
	bench_tls_certs "$work/tls" DNS:localhost,IP:127.0.0.1
	TLS_URL=tls://localhost:$((NATS_PORT + 1))
	mkdir -p "$work/nats_tls"
	printf 'tls {\n  cert_file: "%s"\n  key_file: "%s"\n}\n' "$work/tls/server.pem" "$work/tls/server.key" >"$work/nats_tls.conf"
	nats-server -a 127.0.0.1 -p $((NATS_PORT + 1)) -js -sd "$work/nats_tls" -n bench_tls -c "$work/nats_tls.conf" -l "$work/nats_tls.log" &
	tls_pid=$!
	for _ in $(seq 100); do grep -q 'Server is ready' "$work/nats_tls.log" 2>/dev/null && break; sleep 0.1; done
	grep -q 'Server is ready' "$work/nats_tls.log" 2>/dev/null || { echo "nats-server (TLS) did not start:" >&2; cat "$work/nats_tls.log" >&2; exit 1; }
	log "nats-server with TLS on $TLS_URL (pid $tls_pid)"
fi
# use_tls 1|0: the runs that follow go to the TLS server or the plain one
use_tls() {
	if [ "$1" = 1 ]; then
		NATS_URL=$TLS_URL nats_pid=$tls_pid
		export OUTBOX_NATS_CA=$work/tls/ca.pem
	else
		NATS_URL=$PLAIN_URL nats_pid=$plain_pid
		unset OUTBOX_NATS_CA
	fi
}
nats() { "$work/outbox_nats" "$@"; }

# ---- database ------------------------------------------------------------------------
psqlq -d postgres -c "CREATE DATABASE $DB"
sql >/dev/null <<'SQL'
CREATE EXTENSION outbox;
-- the bare publisher's payload text, byte for byte ({"n": 1, "pad": "0123456789"})
CREATE FUNCTION bench_payload(g bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT jsonb_build_object('n', g, 'pad', '0123456789') $$;
SQL
payload_bytes=$(sql -c "SELECT length(bench_payload($N)::text)")

# ---- helpers --------------------------------------------------------------------------

fresh_stream() {
	nats delete "$NATS_URL" BENCH >/dev/null 2>&1 || true
	nats create "$NATS_URL" BENCH 'bench.>'
	[ "$(nats count "$NATS_URL" BENCH)" = 0 ] || { echo "stream BENCH not empty after create" >&2; exit 1; }
}

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
# context switches of a process, all threads: voluntary nonvoluntary
ctxsw_of() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches/ {v += $2} /^nonvoluntary_ctxt_switches/ {n += $2} END {print v + 0, n + 0}'; }
machine_ticks() { awk 'NR == 1 {b = 0; t = 0; for (i = 2; i <= 9; i++) { t += $i; if (i != 5 && i != 6) b += $i }; print b, t}' /proc/stat; }
HZ=$(getconf CLK_TCK)

# Drop every target, empty the outbox, make a fresh paused target and emit
# the backlog into it.
prepare_backlog() {	# name batch_size lanes
	local name=$1 bs=$2 lanes=$3 i lo hi per cnt tls=
	[ "$NATS_URL" = "${TLS_URL:-}" ] && tls=", ca_file => '$work/tls/ca.pem'"
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" >/dev/null
	sql -c "SELECT outbox.create_nats_target('$name', '$NATS_URL', subject => 'bench.{topic}', batch_size => $bs, lanes => $lanes$tls)" \
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
	cnt=$(sql -c "SELECT count(*) FROM outbox.messages m, outbox.subscriptions s WHERE s.target_id = outbox.target_id('$name') AND m.id > s.start_id")
	[ "$cnt" = "$N" ] || echo "prepare_backlog $name: $cnt messages above the subscription start, expected $N" | tee -a "$work/anomalies" >&2
	cnt=$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = outbox.target_id('$name')")
	[ "$cnt" = 0 ] || echo "prepare_backlog $name: $cnt messages delivered while paused" | tee -a "$work/anomalies" >&2
}

# After a relay run: the stream holds exactly N, and the target's bookkeeping
# has caught up (waits up to 10 s for it); appends to anomalies.
check_relay() {	# name label
	local out pend del dead errs dl cnt bad=""
	for _ in $(seq 200); do
		pend=$(sql -c "SELECT pending FROM outbox.lag WHERE target = '$1'")
		[ "$pend" = 0 ] && break
		sleep 0.05
	done
	out=$(sql -F' ' -c "SELECT coalesce(sum(p.delivered), 0), coalesce(sum(p.dead), 0), count(*) FILTER (WHERE p.last_error IS NOT NULL),
			(SELECT count(*) FROM outbox.dead_letters d WHERE d.target = '$1')
			FROM outbox.progress p WHERE p.target_id = outbox.target_id('$1')")
	read -r del dead errs dl <<<"$out"
	cnt=$(nats count "$NATS_URL" BENCH)
	[ "$cnt" = "$N" ] || bad+=" stream_msgs=$cnt"
	[ "$pend" = 0 ] || bad+=" lag.pending=$pend"
	[ "$del" = "$N" ] || bad+=" delivered=$del"
	[ "$dead" = 0 ] || bad+=" dead=$dead"
	[ "$dl" = 0 ] || bad+=" dead_letters=$dl"
	[ "$errs" = 0 ] || bad+=" lanes_with_last_error=$errs ($(sql -c "SELECT string_agg(DISTINCT last_error, '; ') FROM outbox.progress WHERE target_id = outbox.target_id('$1')"))"
	[ -z "$bad" ] || echo "$2: expected $N:$bad" | tee -a "$work/anomalies" >&2
}

# One timed relay run; records a JSON line.
run_relay() {	# batch_size lanes round [tls]
	local bs=$1 lanes=$2 r=$3 name="nats_b$1_l$2_r$3" label="b$1_l$2" wpid tl tls=False
	[ "${4:-}" = tls ] && { tls=True label+=_tls name+=_tls; }
	fresh_stream
	prepare_backlog "$name" "$bs" "$lanes"
	wpid=$(worker_pid)
	[ -n "$wpid" ] || { echo "no outbox relay process" >&2; exit 1; }
	wait_quiet "relay $label round $r"
	tl=$work/out/poll-$label-r$r.txt
	"$work/nats_poll" "$NATS_URL" BENCH "$N" "$POLL_MS" "$DRAIN_TIMEOUT" >"$tl" &
	poll_pid=$!
	for _ in $(seq 100); do [ -s "$tl" ] && break; sleep 0.01; done	# connected, first poll (0)
	local w0 n0 m0 th0 cs0 times prc=0
	w0=$(ticks_of "$wpid") n0=$(ticks_of "$nats_pid") m0=$(machine_ticks) th0=$(thread_ticks "$wpid") cs0=$(ctxsw_of "$wpid")
	times=$(sql -c "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint" \
		-c "SELECT outbox.resume_target('$name')" -c "SELECT (extract(epoch FROM clock_timestamp()) * 1e9)::bigint")
	wait "$poll_pid" || prc=$?
	poll_pid=
	local w1 n1 m1 th1 cs1
	w1=$(ticks_of "$wpid") n1=$(ticks_of "$nats_pid") m1=$(machine_ticks) th1=$(thread_ticks "$wpid") cs1=$(ctxsw_of "$wpid")
	[ "$prc" = 0 ] || echo "relay $label round $r: the stream did not reach $N in ${DRAIN_TIMEOUT}s (poller exit $prc; last: $(tail -1 "$tl"))" | tee -a "$work/anomalies" >&2
	check_relay "$name" "relay $label round $r"
	local rec
	rec=$("$PY" - "$tl" "$N" "$HZ" "$(nproc)" <<-PYEOF
	import json, sys
	tl = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
	n, hz, ncpu = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
	t0, _, t1 = (int(x) for x in """$times""".split())
	end = next((t for t, c in tl if c >= n), None)
	first = next((t for t, c in tl if c > 0), None)
	secs = (end - t0) / 1e9 if end else None
	# 10%..90% of N, from the poll timeline (interpolated at the polls)
	def at(frac):
	    return next((t for t, c in tl if c >= frac * n), None)
	a, b = at(0.1), at(0.9)
	th0, th1 = json.loads('''$th0'''), json.loads('''$th1''')
	threads = {}
	# the relay's own thread ("main") and libnats' threads (started with
	# the target's connection, named as the process is), summed
	for k, v in th1.items():
	    name = "main" if k.split(" ", 1)[0] == "$wpid" else "other threads"
	    threads[name] = threads.get(name, 0) + (v - th0.get(k, 0)) / hz
	mb0, mt0 = map(int, "$m0".split()); mb1, mt1 = map(int, "$m1".split())
	cv0, cn0 = map(int, "$cs0".split()); cv1, cn1 = map(int, "$cs1".split())
	print(json.dumps({"kind": "relay", "tls": $tls, "ctxsw_voluntary": cv1 - cv0, "ctxsw_involuntary": cn1 - cn0, "batch": $bs, "lanes": $lanes, "round": $r, "label": "$label",
	    "busy_before": $BUSY, "worker_pid": $wpid, "seconds": secs, "rate": n / secs if secs else 0,
	    "resume_ms": (t1 - t0) / 1e6, "first_ms": (first - t0) / 1e6 if first else None,
	    "rate_10_90": 0.8 * n / ((b - a) / 1e9) if a and b and b > a else None,
	    "polls_changed": len(tl), "worker_threads": len(th1),
	    "worker_cpu_s": ($w1 - $w0) / hz, "nats_cpu_s": ($n1 - $n0) / hz,
	    "worker_threads_cpu_s": {k: round(v, 2) for k, v in sorted(threads.items(), key=lambda x: -x[1]) if v > 0},
	    "machine_cpus_busy": (mb1 - mb0) / (mt1 - mt0) * ncpu if mt1 > mt0 else 0}))
	PYEOF
	)
	echo "$rec" >>"$RESULTS"
	log "  relay $label: $("$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print("%.0f msg/s (%.3f s; resume call %.0f ms; first stored after %.0f ms; 10-90%%: %s msg/s); relay CPU %.2f s (%s), nats-server CPU %.2f s; machine %.2f CPUs busy" % (r["rate"], r["seconds"] or 0, r["resume_ms"], r["first_ms"] or 0, "%.0f" % r["rate_10_90"] if r["rate_10_90"] else "-", r["worker_cpu_s"], ", ".join("%s %.2f" % kv for kv in r["worker_threads_cpu_s"].items()), r["nats_cpu_s"], r["machine_cpus_busy"]))' "$rec")"
	sql -c "SELECT outbox.drop_target('$name')" -c "TRUNCATE outbox.messages" >/dev/null
}

# One bare publisher run; records a JSON line.
run_bare() {	# round [all|tls]
	local r=$1 all=${2:-} kind=bare out rate n0 n1 m0 m1 cnt tm
	[ "$all" = all ] && kind=bare_all
	[ "$all" = tls ] && { kind=bare_tls all=all; }
	fresh_stream
	wait_quiet "$kind round $r"
	n0=$(ticks_of "$nats_pid") m0=$(machine_ticks)
	# (unquoted $all: no argument at all without it)
	# shellcheck disable=SC2086
	tm=$({ TIMEFORMAT='%R %U %S'; time nats publish "$NATS_URL" bench.orders "$N" "$KEYS" $all >"$work/bare.out"; } 2>&1)
	n1=$(ticks_of "$nats_pid") m1=$(machine_ticks)
	rate=$(cat "$work/bare.out")
	cnt=$(nats count "$NATS_URL" BENCH)
	[ "$cnt" = "$N" ] || echo "$kind round $r: stream holds $cnt, expected $N" | tee -a "$work/anomalies" >&2
	local rec
	rec=$("$PY" - <<-PYEOF
	import json
	real, user, sys_ = map(float, "$tm".split())
	mb0, mt0 = map(int, "$m0".split()); mb1, mt1 = map(int, "$m1".split())
	print(json.dumps({"kind": "$kind", "round": $r, "busy_before": $BUSY, "rate": float("$rate"),
	    "seconds": $N / float("$rate"), "wall_s": real, "publisher_cpu_s": round(user + sys_, 3),
	    "nats_cpu_s": ($n1 - $n0) / $HZ,
	    "machine_cpus_busy": (mb1 - mb0) / (mt1 - mt0) * $(nproc) if mt1 > mt0 else 0}))
	PYEOF
	)
	echo "$rec" >>"$RESULTS"
	log "  $kind: $rate msg/s (process wall ${tm%% *} s); $("$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); print("publisher CPU %.2f s, nats-server CPU %.2f s; machine %.2f CPUs busy" % (r["publisher_cpu_s"], r["nats_cpu_s"], r["machine_cpus_busy"]))' "$rec")"
}

# ---- is the machine quiet? --------------------------------------------------------------
busy_before=$(machine_busy 2)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "machine busy before the runs: $busy_before of $(nproc) CPUs; load $load_before"
for _ in $(seq 150); do worker0=$(worker_pid); [ -n "$worker0" ] && break; sleep 0.2; done
[ -n "$worker0" ] || { echo "no 'outbox relay' process" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }

# ---- the timed rounds -----------------------------------------------------------------------
# Entries of a round: every CONFIGS entry and the bare publisher (both
# header sets), rotated.
read -r -a plan <<<"$CONFIGS bare bare_all"
# over TLS: the first CONFIGS entry and the publisher with the relay's headers
[ "$TLS" = 1 ] && plan+=("tls:${CONFIGS%% *}" bare_tls)
np=${#plan[@]}
log "plan: $RUNS rounds of: relay runs of $N messages ($KEYS keys) for batch_size:lanes = $CONFIGS; the bare publisher, with two headers and with all the relay's"
for ((r = 1; r <= RUNS; r++)); do
	log "round $r"
	for ((i = 0; i < np; i++)); do
		c=${plan[$(((i + r - 1) % np))]}
		if [ "$c" = bare ]; then
			run_bare "$r"
		elif [ "$c" = bare_all ]; then
			run_bare "$r" all
		elif [ "$c" = bare_tls ]; then
			use_tls 1; run_bare "$r" tls; use_tls 0
		elif [ "${c%%:*}" = tls ]; then
			c=${c#tls:}
			use_tls 1; run_relay "${c%%:*}" "${c##*:}" "$r" tls; use_tls 0
		else
			run_relay "${c%%:*}" "${c##*:}" "$r"
		fi
	done
done

# ---- profile ------------------------------------------------------------------------------
if [ "$PERF" != 0 ]; then
	[ "$PERF" = tls ] && use_tls 1
	if ! perf record -q -o "$work/perf-probe.data" -- true >/dev/null 2>&1; then
		echo "perf record does not work here; skipping the profile" >"$work/out/perf.txt"
	else
		c=${CONFIGS%% *}
		bs=${c%%:*} lanes=${c##*:}
		name=nats_perf
		[ "$PERF" = tls ] && name=nats_perf_tls
		log "profile ($NATS_URL): relay run of $N, batch_size $bs, $lanes lanes, under perf record --call-graph dwarf (not timed)"
		fresh_stream
		prepare_backlog "$name" "$bs" "$lanes"
		wpid=$(worker_pid)
		perf record -q -F 999 --call-graph dwarf,16384 -p "$wpid" -o "$work/perf.data" >/dev/null 2>&1 &
		perf_pid=$!
		sleep 0.5
		t0=$(date +%s%N)
		sql -c "SELECT outbox.resume_target('$name')" >/dev/null
		"$work/nats_poll" "$NATS_URL" BENCH "$N" "$POLL_MS" "$DRAIN_TIMEOUT" >"$work/out/poll-perf.txt" || true
		t1=$(date +%s%N)
		kill -INT "$perf_pid"
		wait "$perf_pid" || true
		perf_pid=
		check_relay "$name" "profile run"
		libview=$work/pkglib
		preport() {
			unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf report "$@"' \
				sh "$libview" "$pkglibdir" "$@" 2>/dev/null
		}
		set +o pipefail
		{
			echo "==== relay worker (pid $wpid), run of $N, batch_size $bs, $lanes lanes, under perf record -F 999 --call-graph dwarf"
			echo "  drain under perf: $(awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f msg/s", n / ((b - a) / 1e9)}')"
			echo "  self time by thread:"
			preport -i "$work/perf.data" --no-children --sort pid --stdio -g none | grep -E '^ +[0-9]' | head -10 | sed 's/^/    /'
			echo "  self time by thread and shared object:"
			preport -i "$work/perf.data" --no-children --sort pid,dso --stdio -g none | grep -E '^ +[0-9]' | head -14 | sed 's/^/    /'
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
set +o pipefail
{
	if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
		echo "SERVER LOG shows a crash:"
		grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
	fi
	echo "server log: $(grep -c 'ERROR' "$SERVERLOG" || true) ERROR, $(grep -c 'WARNING' "$SERVERLOG" || true) WARNING, $(grep -c 'FATAL' "$SERVERLOG" || true) FATAL lines"
	grep -E 'ERROR|WARNING|FATAL' "$SERVERLOG" | sed -E 's/^.*(ERROR|WARNING|FATAL)/\1/' | sort | uniq -c | sort -rn | head -10
	echo "nats-server log: $(grep -c '\[ERR\]' "$work/nats.log" || true) [ERR], $(grep -c '\[WRN\]' "$work/nats.log" || true) [WRN] lines"
	grep -E '\[(ERR|WRN)\]' "$work/nats.log" | sed -E 's/^.*\[(ERR|WRN)\] //' | sort | uniq -c | sort -rn | head -5
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
print("outbox NATS JetStream benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("  built from $build_rev (outbox.so md5 $build_md5); PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); nats-server $(nats-server --version 2>&1 | awk '{print $NF}'), file storage; libnats $(dpkg-query -W -f='${Version}' libnats-dev 2>/dev/null || echo '?')")
print("  $(nproc) cores; machine busy before: $busy_before CPUs, load $load_before; N=$N messages, $KEYS keys, payload $payload_bytes bytes; backlog in $XACTS transactions; $RUNS rounds; poll every $POLL_MS ms")
print()
bare = {r["round"]: r for r in res if r["kind"] == "bare"}
bare_med = med(r["rate"] for r in bare.values())
bare_all = {r["round"]: r for r in res if r["kind"] == "bare_all"}
bare_all_med = med(r["rate"] for r in bare_all.values()) if bare_all else float("nan")
for what, bb, bm in (("two headers", bare, bare_med), ("the relay's five headers", bare_all, bare_all_med)):
    if not bb: continue
    print(f"bare libnats publisher (outbox_nats publish, async, 4096 pending), {what}: median {bm:.0f} msg/s   runs: " +
          " ".join(f"{bb[k]['rate']:.0f}" for k in sorted(bb)) +
          f"   publisher CPU {med(r['publisher_cpu_s'] / r['seconds'] for r in bb.values()):.0%} of a core, "
          f"{med(r['publisher_cpu_s'] for r in bb.values()) / $N * 1e6:.2f} us/msg; nats-server CPU {med(r['nats_cpu_s'] / r['seconds'] for r in bb.values()):.0%} of a core")
print()
print("relay: backlog released with outbox.resume_target, until the stream holds N (msg/s)")
print(f"  {'batch:lanes':12} {'round':>5} {'relay':>8} {'bare':>8} {'relay/bare':>10} {'resume ms':>9} {'first ms':>8} {'10-90%':>8} {'relay CPU':>9} {'us/msg':>6} {'nats CPU':>8} {'machine':>7}")
best = None
summary = []
for c in "$CONFIGS".split():
    bs, lanes = (int(x) for x in c.split(":"))
    rs = sorted((r for r in res if r["kind"] == "relay" and not r.get("tls") and r["batch"] == bs and r["lanes"] == lanes), key=lambda r: r["round"])
    if not rs: continue
    for r in rs:
        b = bare.get(r["round"])
        s = r["seconds"] or float("nan")
        print(f"  {c:12} {r['round']:5} {r['rate']:8.0f} {b['rate'] if b else float('nan'):8.0f} {r['rate'] / b['rate'] if b else float('nan'):10.2f} "
              f"{r['resume_ms']:9.0f} {r['first_ms'] or 0:8.0f} {r['rate_10_90'] or float('nan'):8.0f} {r['worker_cpu_s'] / s:9.0%} "
              f"{r['worker_cpu_s'] / $N * 1e6:6.1f} {r['nats_cpu_s'] / s:8.0%} {r['machine_cpus_busy']:7.2f}")
    m = med(r["rate"] for r in rs)
    ratios = [r["rate"] / bare[r["round"]]["rate"] for r in rs if r["round"] in bare]
    summary.append((c, m, m / bare_med, med(ratios) if ratios else float("nan"), rs))
    print(f"  {c:12} {'med':>5} {m:8.0f} {bare_med:8.0f} {m / bare_med:10.2f}   (median of the per-round ratios {med(ratios) if ratios else float('nan'):.2f}; against the five-header publisher {m / bare_all_med:.2f})")
    if best is None or m > best[1]: best = (c, m)
print("  (resume ms: the resume_target call itself, inside the time; first ms: until the first message was stored;")
print("   10-90%: rate between 10% and 90% of N stored; relay/nats CPU: share of one core over the run; us/msg: relay CPU per message)")
print()
print("relay worker CPU by thread (seconds, medians over the rounds; main: the relay's own, other threads: libnats'):")
for c, m, rat, mr, rs in summary:
    names = {}
    for r in rs:
        for k in r["worker_threads_cpu_s"]:
            names.setdefault(k, []).append(r["worker_threads_cpu_s"][k])
    print(f"  {c:12} " + ", ".join(f"{k} {med(v):.2f}" for k, v in sorted(names.items(), key=lambda kv: -med(kv[1]))) +
          f"   ({med(r['worker_threads'] for r in rs)} threads; context switches per message: voluntary {med(r['ctxsw_voluntary'] for r in rs) / $N:.2f}, involuntary {med(r['ctxsw_involuntary'] for r in rs) / $N:.2f})")
print()
print(f"{'figure (medians)':44} {'value':>12}   goal")
print(f"{'bare publisher msg/s':44} {bare_med:12.0f}")
print(f"{'bare publisher, five headers, msg/s':44} {bare_all_med:12.0f}")
for c, m, rat, mr, rs in summary:
    print(f"{'relay ' + c + ' msg/s':44} {m:12.0f}   >= 100000  {goal(m >= 100000)}")
    print(f"{'  relay / bare (ratio of medians)':44} {rat:12.2f}   >= 0.80    {goal(rat >= 0.8)}")
    print(f"{'  relay / bare (median of per-round ratios)':44} {mr:12.2f}")
    print(f"{'  relay / bare with five headers (medians)':44} {m / bare_all_med:12.2f}   >= 0.80    {goal(m / bare_all_med >= 0.8)}")
if len(summary) > 1:
    print(f"best relay setting (batch_size:lanes): {best[0]} at {best[1]:.0f} msg/s")
rt = [r for r in res if r["kind"] == "relay" and r.get("tls")]
bt = [r for r in res if r["kind"] == "bare_tls"]
if rt and bt:
    c0 = "$CONFIGS".split()[0]
    rtm, btm = med(r["rate"] for r in rt), med(r["rate"] for r in bt)
    plain = next(s for s in summary if s[0] == c0)
    print()
    print(f"over TLS ({c0}; runs: relay " + " ".join(f"{r['rate']:.0f}" for r in sorted(rt, key=lambda r: r["round"])) +
          ", bare " + " ".join(f"{r['rate']:.0f}" for r in sorted(bt, key=lambda r: r["round"])) + ")")
    print(f"{'relay over TLS msg/s':44} {rtm:12.0f}   relay CPU {med(r['worker_cpu_s'] for r in rt) / $N * 1e6:.2f} us/msg")
    print(f"{'bare publisher over TLS (five headers) msg/s':44} {btm:12.0f}   publisher CPU {med(r['publisher_cpu_s'] for r in bt) / $N * 1e6:.2f} us/msg")
    print(f"{'  relay_tls / bare_tls':44} {rtm / btm:12.2f}   >= 0.80    {goal(rtm / btm >= 0.8)}")
    print(f"{'  relay_tls / relay (plaintext)':44} {rtm / plain[1]:12.2f}")
print()
print("ANOMALIES:\n  " + anom.replace("\n", "\n  ") if anom else "sanity: every relay run stored exactly N in the stream, N delivered, no dead letters, no lane errors, lag pending 0; the relay worker kept its pid")
print(slog.rstrip())
if perf:
    print()
    print(perf.rstrip())
PYEOF
[ -n "$OUT" ] || [ "$KEEP" = 1 ] || log "raw results removed with $work on exit; OUT=DIR keeps them"
