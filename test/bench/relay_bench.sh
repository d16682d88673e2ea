#!/usr/bin/env bash
# relay_bench.sh - delivery throughput and latency of the outbox relay worker,
# against the sink's own ceiling and a hand-rolled polling relay, on a
# throwaway cluster and a throwaway nginx.
#
# Run by hand, as root (not in CI):
#
#   test/bench/relay_bench.sh                 # ~5 minutes on 2 cores (RUNS=3)
#   RUNS=5 test/bench/relay_bench.sh
#   PERF=0 VERIFY=0 test/bench/relay_bench.sh # measurements only
#
# What it measures (everything on 127.0.0.1, one machine):
#   ceiling   wrk -t1 -c32 -d10s POSTing a ~220-byte JSON body to nginx
#             (worker_processes 1, access_log off, location / { return 204; })
#   libcurl   test/bench/curl_client.c: the same POSTs from 32 reused libcurl
#             easy handles on one multi handle (keep-alive, curl_multi_poll),
#             no database: the most one-message-per-request delivery through
#             libcurl reaches here, for comparison with batch_size 1; and
#             again with bodies of BARE_BATCH messages; its own CPU time
#   drain     a backlog of N=100000 committed messages (1000 keys, ~220-byte
#             payload) emitted while outbox.enabled = off into a fresh target,
#             then released at once (outbox.enabled = on); time from the
#             reload until outbox.progress records all N delivered (polled
#             every 5 ms; the worker records progress at most 20 ms after
#             an acknowledgement, and no more often).  Per
#             CONFIGS entry batch_size:lanes (default 1:32 1:8 100:8 100:32).
#   hand      the usual polling relay (test/bench/hand_relay.py): SELECT ...
#             FOR UPDATE SKIP LOCKED LIMIT 100, one keep-alive POST per
#             message, UPDATE processed_at, COMMIT; 1 process, and HAND_PROCS
#             in parallel (which no longer keeps per-key order)
#   latency   a batch_size 1, 8-lane target at test/bench/bench_sink.py;
#             500 messages/s emitted for 20 s in single-statement autocommit
#             transactions; arrival time at the sink minus emitted_at (taken
#             in outbox_emit(), just before the commit and its WAL flush)
#   memory    VmRSS (and RssAnon) of the 'outbox relay' process before and
#             after every drain
#   verify    (VERIFY=1) a 100k drain each of 1:32 and 100:8 into bench_sink,
#             checked message by message: none lost, none twice, per-key order
#   profile   (PERF=1) perf record of the relay worker while a 1:32 and a
#             100:8 backlog drain (not timed: perf slows the worker)
#
# Charts: after the report, test/bench/bench_charts.py draws the report's
# figures with gnuplot (Debian: gnuplot-nox) as SVG into the results
# directory (OUT=DIR), each next to the .dat file of its figures and the .gp
# script that plotted it (cd DIR && gnuplot NAME.gp draws it again):
#   relay-drain.svg    drain throughput (medians) by batch_size:lanes against
#                      the ceiling, the libcurl client and the hand-rolled relay
#   relay-latency.svg  p50/p90/p99 of the latency run
#
# The runs of the different drain configurations alternate over RUNS rounds
# (the order rotates), with a wrk run of the ceiling and a libcurl client run
# at the start of every round; medians are reported.  Before each run the outbox table is emptied
# (targets dropped, TRUNCATE), the backlog emitted, VACUUM ANALYZE and a
# CHECKPOINT taken.
#
# Settings (environment):
#   RUNS=3 N=100000 KEYS=1000 XACTS=10 (transactions the backlog is emitted in)
#   CONFIGS="1:32 1:8 100:8 100:32"  batch_size:lanes of the timed drains
#   WRK_SECS=10 WRK_CONNS=32      the ceiling's wrk run
#   HAND_PROCS=4                  parallel hand-rolled relays (0: no hand-rolled
#                                 relay at all)
#   BARE_BATCH=100 BARE_BATCH_HANDLES=8  the libcurl client once more per
#                                 round, posting bodies of BARE_BATCH envelopes
#                                 (as a batch_size BARE_BATCH target sends them;
#                                 1: skip) from that many handles
#   LAT_RATE=500 LAT_SECS=20 LAT_LANES=8
#   PERF=1 VERIFY=1 KEEP=0
#   REV=                          build this git revision instead of the
#                                 working tree (e.g. REV=HEAD: committed code only)
#   INSTALL=1                     also install the build system-wide (default
#                                 without REV; 0 with REV); the server itself
#                                 always runs on its private copy
#   OUT=DIR                       copy the raw results (JSON lines, sink
#                                 records, wrk output, server log) and the
#                                 charts there
#   PORT=54339 NGINX_PORT=18089   non-default ports, 127.0.0.1 only
#   WAIT_FOR=emit_bench.sh        wait (polling every 30 s) while a process
#                                 whose command line matches runs ('' = no)
#   QUIET_MAX=0.3 QUIET_WAIT=300  before every measurement wait (at most
#                                 QUIET_WAIT s) until at most QUIET_MAX CPUs
#                                 are busy (ours are idle then); runs measured
#                                 on a busy machine are listed as anomalies
set -euo pipefail

RUNS=${RUNS:-3}
N=${N:-100000}
KEYS=${KEYS:-1000}
XACTS=${XACTS:-10}
CONFIGS=${CONFIGS:-"1:32 1:8 100:8 100:32"}
WRK_SECS=${WRK_SECS:-10}
WRK_CONNS=${WRK_CONNS:-32}
HAND_PROCS=${HAND_PROCS:-4}
BARE_BATCH=${BARE_BATCH:-100}
BARE_BATCH_HANDLES=${BARE_BATCH_HANDLES:-8}
LAT_RATE=${LAT_RATE:-500}
LAT_SECS=${LAT_SECS:-20}
LAT_LANES=${LAT_LANES:-8}
PERF=${PERF:-1}
VERIFY=${VERIFY:-1}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
if [ -n "$REV" ]; then INSTALL=${INSTALL:-0}; else INSTALL=${INSTALL:-1}; fi
PORT=${PORT:-54339}
NGINX_PORT=${NGINX_PORT:-18089}
WAIT_FOR=${WAIT_FOR-emit_bench.sh}
QUIET_MAX=${QUIET_MAX:-0.3}
QUIET_WAIT=${QUIET_WAIT:-300}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=relay-bench
BENCH_PACKAGES=(wrk gcc libcurl4-openssl-dev gnuplot-nox)
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
sink_pid=
perf_pid=
bench_on_exit() {
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null
	[ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup
cc -O2 -Wall -o "$work/curl_client" "$here/curl_client.c" -lcurl


psqlq -d postgres -c "CREATE DATABASE $DB"
create_bench_payload
sql >/dev/null <<'SQL'
CREATE EXTENSION outbox;

CREATE TABLE hand_outbox (
	id			bigserial PRIMARY KEY,
	key			text,
	payload		jsonb,
	processed_at timestamptz
);
-- the "pending index" the hand-rolled relay polls
CREATE INDEX hand_outbox_pending ON hand_outbox (id) WHERE processed_at IS NULL;

ALTER SYSTEM SET outbox.enabled = off;
SELECT pg_reload_conf();
SQL
payload=$(sql -c "SELECT bench_payload(1)::text")
payload_bytes=${#payload}


printf '%s' "$payload" >"$work/body.json"
# the body of a batch of BARE_BATCH messages, as the relay sends it (the
# envelope of each, in a JSON array), for the libcurl client's batch run
"$PY" - "$payload" "$BARE_BATCH" >"$work/body-batch.json" <<'PYEOF'
import sys
p, n = sys.argv[1], int(sys.argv[2])
env = ('{"id":"0190f0a2-6b1e-7c3d-9a4f-%012d","seq":%d,"topic":"orders.created","key":"key-%d",'
       '"headers":{},"payload":%s,"emitted_at":"2026-12-03T12:00:00.123456+00:00"}')
print("[" + ",".join(env % (i, i, i % 1000, p) for i in range(n)) + "]", end="")
PYEOF
cat >"$work/post.lua" <<EOF
wrk.method = "POST"
wrk.body = [[$payload]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["webhook-id"] = "0190f0a2-6b1e-7c3d-9a4f-123456789abc"
wrk.headers["webhook-timestamp"] = "1700000000"
wrk.headers["outbox-seq"] = "123456"
wrk.headers["outbox-topic"] = "orders.created"
wrk.headers["outbox-key"] = "key-123"
EOF

# ---- helpers ------------------------------------------------------------------

set_enabled() {	# on|off
	sql -c "ALTER SYSTEM SET outbox.enabled = $1" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 0.5	# let the worker take the SIGHUP
}

# Drop every target, empty the outbox, make a fresh target subscribed to
# everything and emit the backlog into it while delivery is off.  Prints the
# target id.
prepare_backlog() {	# name url batch_size lanes messages
	local name=$1 url=$2 bs=$3 lanes=$4 n=$5 i lo hi per tid cnt
	set_enabled off
	sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" >/dev/null
	sql -c "TRUNCATE outbox.messages" >/dev/null
	sql -c "SELECT outbox.create_http_target('$name', '$url', batch_size => $bs, lanes => $lanes)" \
		-c "SELECT outbox.subscribe('$name', '*')" >/dev/null
	tid=$(sql -c "SELECT outbox.target_id('$name')")
	per=$(((n + XACTS - 1) / XACTS))
	for ((i = 0; i < XACTS; i++)); do
		lo=$((i * per + 1)) hi=$(((i + 1) * per))
		[ "$hi" -gt "$n" ] && hi=$n
		[ "$lo" -gt "$hi" ] && break
		sql -c "SELECT count(outbox_emit('orders.created', bench_payload(g), 'key-' || (g % $KEYS))) FROM generate_series($lo, $hi) g" >/dev/null
	done
	sql -c "VACUUM ANALYZE outbox.messages" -c "CHECKPOINT" >/dev/null
	cnt=$(sql -c "SELECT count(*) FROM outbox.messages m, outbox.subscriptions s WHERE s.target_id = $tid AND m.id > s.start_id")
	[ "$cnt" = "$n" ] || echo "prepare_backlog: $cnt messages above the subscription start, expected $n" | tee -a "$work/anomalies" >&2
	cnt=$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $tid")
	[ "$cnt" = 0 ] && sleep 0.5 && cnt=$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $tid")
	[ "$cnt" = 0 ] || echo "prepare_backlog: $cnt messages delivered while outbox.enabled = off" | tee -a "$work/anomalies" >&2
	echo "$tid"
}

# Post-drain checks of the target; appends to anomalies.
check_target() {	# tid label expected
	local out
	out=$(sql -F' ' -c "SELECT coalesce(sum(delivered), 0), coalesce(sum(dead), 0), count(*) FILTER (WHERE last_error IS NOT NULL),
				(SELECT count(*) FROM outbox.dead_letters), (SELECT pending FROM outbox.lag l JOIN outbox.targets t ON t.name = l.target WHERE t.id = $1),
				min(done_id), (SELECT max(id) FROM outbox.messages)
			FROM outbox.progress WHERE target_id = $1")
	local del dead errs dl pend mind maxid
	read -r del dead errs dl pend mind maxid <<<"$out"
	local bad=""
	[ "$del" = "$3" ] || bad+=" delivered=$del"
	[ "$dead" = 0 ] || bad+=" dead=$dead"
	[ "$dl" = 0 ] || bad+=" dead_letters=$dl"
	[ "$errs" = 0 ] || bad+=" lanes_with_last_error=$errs ($(sql -c "SELECT string_agg(DISTINCT last_error, '; ') FROM outbox.progress WHERE target_id = $1"))"
	[ "$pend" = 0 ] || bad+=" lag.pending=$pend"
	[ "$mind" = "$maxid" ] || bad+=" min(done_id)=$mind<max(id)=$maxid"
	[ -z "$bad" ] || echo "$2: expected $3 delivered:$bad" | tee -a "$work/anomalies" >&2
}

# Release the backlog and time it; records a JSON line.  Extra JSON fields in $3.
timed_drain() {	# tid label extra-json
	local tid=$1 label=$2 wpid r0 r1 n0 n1 out
	wpid=$(worker_pid)
	wait_quiet "drain $label"
	r0=$(rss_of "$wpid")
	n0=$(nginx_requests)
	out=$(tool drain --target-id "$tid" --n "$N" --cpu-pids "$wpid,$nginx_worker" --poll-ms 5)
	n1=$(nginx_requests)
	sleep 0.2
	r1=$(rss_of "$wpid")
	set_enabled off
	check_target "$tid" "$label" "$N"
	record "$3" "{\"kind\": \"drain\", \"busy_before\": $BUSY, \"label\": \"$label\", \"worker_pid\": $wpid, \"nginx_worker\": $nginx_worker, \"requests\": $((n1 - n0 - 1))}" \
		"$out" "{\"rss_before\": $r0, \"rss_after\": $r1}"
	log "  $label: $out; $((n1 - n0 - 1)) requests; worker RSS before $r0 after $r1"
}

run_wrk() {	# round
	local out rps
	wait_quiet "wrk round $1"
	out=$(wrk -t1 -c"$WRK_CONNS" -d"${WRK_SECS}s" --latency -s "$work/post.lua" "$NGINX_URL" 2>&1)
	rps=$(echo "$out" | awk '/^Requests\/sec:/ {print $2}')
	[ -n "$rps" ] || { echo "wrk failed:" >&2; echo "$out" >&2; return 1; }
	echo "$out" >"$work/out/wrk-$1.txt"
	record "{\"kind\": \"wrk\", \"round\": $1, \"rps\": $rps, \"busy_before\": $BUSY}"
	log "  wrk -t1 -c$WRK_CONNS -d${WRK_SECS}s: $rps req/s"
}

run_curl_client() {	# round
	local out
	wait_quiet "libcurl client round $1"
	# (it exits 1 when a request failed; the count is in its output)
	out=$("$work/curl_client" "$NGINX_URL" "$WRK_CONNS" "$WRK_SECS" "$work/body.json" || true)
	record "{\"kind\": \"libcurl\", \"round\": $1, \"busy_before\": $BUSY}" "$out"
	log "  libcurl client, $WRK_CONNS handles, ${WRK_SECS}s: $out"
	if [ "$BARE_BATCH" -gt 1 ]; then
		wait_quiet "libcurl client (batch body) round $1"
		out=$("$work/curl_client" "$NGINX_URL" "$BARE_BATCH_HANDLES" "$WRK_SECS" "$work/body-batch.json" || true)
		record "{\"kind\": \"libcurl_batch\", \"batch\": $BARE_BATCH, \"round\": $1, \"busy_before\": $BUSY}" "$out"
		log "  libcurl client, $BARE_BATCH_HANDLES handles, bodies of $BARE_BATCH messages, ${WRK_SECS}s: $out"
	fi
}

load_hand() {
	sql -c "TRUNCATE hand_outbox RESTART IDENTITY" \
		-c "INSERT INTO hand_outbox (key, payload) SELECT 'key-' || (g % $KEYS), bench_payload(g) FROM generate_series(1, $N) g" \
		-c "VACUUM ANALYZE hand_outbox" -c "CHECKPOINT" >/dev/null
}

run_hand() {	# procs round
	local out n0 n1 left
	load_hand
	wait_quiet "hand-rolled relay, $1 process(es)"
	n0=$(nginx_requests)
	out=$("$PY" "$here/hand_relay.py" "${PGARGS[@]}" --url "$NGINX_URL" --procs "$1")
	n1=$(nginx_requests)
	left=$(sql -c "SELECT count(*) FROM hand_outbox WHERE processed_at IS NULL")
	[ "$left" = 0 ] || echo "hand relay ($1 procs): $left rows left unprocessed" | tee -a "$work/anomalies" >&2
	record "{\"kind\": \"hand\", \"busy_before\": $BUSY, \"procs\": $1, \"round\": $2, \"nginx_requests\": $((n1 - n0 - 1))}" "$out"
	log "  hand-rolled relay, $1 process(es): $out"
}

start_sink() {	# name [--parse-batches]
	rm -f "$work/out/$1.port"
	"$PY" "$here/bench_sink.py" --port 0 --port-file "$work/out/$1.port" --record "$work/out/$1.jsonl" "${@:2}" &
	sink_pid=$!
	for _ in $(seq 100); do [ -s "$work/out/$1.port" ] && break; sleep 0.05; done
	SINK_URL="http://127.0.0.1:$(cat "$work/out/$1.port")/hook"
}
stop_sink() {
	kill -TERM "$sink_pid"
	wait "$sink_pid" || true
	sink_pid=
}

# ---- is the machine quiet? -------------------------------------------------------
busy_before=$(machine_busy 2)
log "machine busy before the runs: $busy_before of $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
# The worker started before CREATE DATABASE $DB: it waits for the database,
# then restarts to connect to it.
for _ in $(seq 150); do worker0=$(worker_pid); [ -n "$worker0" ] && break; sleep 0.2; done
[ -n "$worker0" ] || { echo "no 'outbox relay' process" >&2; tail -20 "$SERVERLOG" >&2; exit 1; }
record "{\"kind\": \"start\", \"worker_pid\": $worker0}" "{\"rss\": $(rss_of "$worker0")}"

# ---- the timed rounds ------------------------------------------------------------
read -r -a clist <<<"$CONFIGS"
nc=${#clist[@]}
log "plan: $RUNS rounds of: wrk ${WRK_SECS}s; libcurl client ${WRK_SECS}s; drains of $N messages for batch_size:lanes = ${CONFIGS}; hand-rolled relay (1 process)"
for ((r = 1; r <= RUNS; r++)); do
	log "round $r"
	run_wrk "$r"
	run_curl_client "$r"
	for ((i = 0; i < nc; i++)); do
		c=${clist[$(((i + r - 1) % nc))]}
		bs=${c%%:*} lanes=${c##*:}
		tid=$(prepare_backlog "drain_b${bs}_l${lanes}_r$r" "$NGINX_URL" "$bs" "$lanes" "$N")
		timed_drain "$tid" "b${bs}_l${lanes}" "{\"batch\": $bs, \"lanes\": $lanes, \"round\": $r}"
	done
	[ "$HAND_PROCS" = 0 ] || run_hand 1 "$r"
done
if [ "$HAND_PROCS" -gt 1 ]; then
	run_hand "$HAND_PROCS" 1
fi
sql -c "TRUNCATE hand_outbox" >/dev/null
# What the statistics system knows of the outbox tables after the drains
# (the relay worker's own reads and progress updates included, if it reports them).
sleep 1
sql -c "SELECT json_agg(json_build_object('table', relname, 'n_tup_upd', n_tup_upd, 'n_tup_hot_upd', n_tup_hot_upd,
		'n_dead_tup', n_dead_tup, 'idx_tup_fetch', idx_tup_fetch, 'autovacuum_count', autovacuum_count,
		'bytes', pg_relation_size(relid)) ORDER BY relname)
		FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname IN ('messages', 'progress')" >"$work/out/stats.json"
record '{"kind": "stats"}' "{\"tables\": $(cat "$work/out/stats.json")}"

# ---- latency at a steady rate --------------------------------------------------------
log "latency: batch_size 1, $LAT_LANES lanes, $LAT_RATE msg/s for ${LAT_SECS}s into bench_sink"
set_enabled off
sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" -c "TRUNCATE outbox.messages" -c "CHECKPOINT" >/dev/null
start_sink latency
sql -c "SELECT outbox.create_http_target('latency', '$SINK_URL', batch_size => 1, lanes => $LAT_LANES)" \
	-c "SELECT outbox.subscribe('latency', '*')" >/dev/null
lat_tid=$(sql -c "SELECT outbox.target_id('latency')")
set_enabled on
wait_quiet latency
emit_out=$(tool emit-rate --rate "$LAT_RATE" --seconds "$LAT_SECS" --threads 4 --out "$work/out/latency-emits.jsonl")
log "  emitter: $emit_out"
nlat=$(wc -l <"$work/out/latency-emits.jsonl")
for _ in $(seq 300); do
	[ "$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $lat_tid")" -ge "$nlat" ] && break
	sleep 0.1
done
stop_sink
set_enabled off
check_target "$lat_tid" latency "$nlat"
lat_out=$(tool latency --emits "$work/out/latency-emits.jsonl" --sink-records "$work/out/latency.jsonl")
lat_verify=$(tool verify --sink-records "$work/out/latency.jsonl" --target-id "$lat_tid")
record '{"kind": "latency"}' "{\"emitter\": $emit_out}" "$lat_out" "{\"verify\": $lat_verify}"
log "  $lat_out"
log "  verify: $lat_verify"

# ---- integrity of bulk drains ----------------------------------------------------------
if [ "$VERIFY" = 1 ]; then
	for c in 1:32 100:8; do
		bs=${c%%:*} lanes=${c##*:}
		log "verify: drain of $N, batch_size $bs, $lanes lanes, into bench_sink, checked message by message"
		start_sink "verify_b$bs" --parse-batches
		tid=$(prepare_backlog "verify_b${bs}_l$lanes" "$SINK_URL" "$bs" "$lanes" "$N")
		out=$(tool drain --target-id "$tid" --n "$N")
		set_enabled off
		stop_sink
		check_target "$tid" "verify_b${bs}_l$lanes" "$N"
		v=$(tool verify --sink-records "$work/out/verify_b$bs.jsonl" --target-id "$tid")
		record "{\"kind\": \"verify\", \"batch\": $bs, \"lanes\": $lanes}" "{\"drain\": $out}" "{\"verify\": $v}"
		log "  $v"
		echo "$v" | grep -q '"ok": true' || echo "verify b$bs l$lanes: $v" >>"$work/anomalies"
	done
fi

# ---- memory after everything -----------------------------------------------------------
sql -c "SELECT count(outbox.drop_target(name)) FROM outbox.targets" >/dev/null
sleep 1
wpid=$(worker_pid)
record "{\"kind\": \"end\", \"worker_pid\": ${wpid:-0}}" "{\"rss\": $(rss_of "${wpid:-self}")}"

# ---- profile ------------------------------------------------------------------------------
if [ "$PERF" = 1 ]; then
	if ! perf record -q -N -o "$work/perf-probe.data" -- true >/dev/null 2>&1; then
		echo "perf record does not work here; skipping the profile" >"$work/out/perf.txt"
	else
		libview=$work/pkglib
		# perf report in a private mount namespace where the library directory
		# is the server's (see above).
		preport() {
			unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf report "$@"' \
				sh "$libview" "$pkglibdir" --no-inline "$@" 2>/dev/null
		}
		: >"$work/out/perf.txt"
		set +o pipefail
		for c in 1:32 100:8; do
			bs=${c%%:*} lanes=${c##*:}
			log "profile: drain of $N, batch_size $bs, $lanes lanes (not timed)"
			tid=$(prepare_backlog "perf_b${bs}_l$lanes" "$NGINX_URL" "$bs" "$lanes" "$N")
			wpid=$(worker_pid)
			perf record -q -N -F 999 --call-graph dwarf,16384 -p "$wpid" -o "$work/perf-b$bs.data" -- sleep 5 >/dev/null 2>&1 &
			perf_pid=$!
			sleep 0.3
			out=$(tool drain --target-id "$tid" --n "$N" --cpu-pids "$wpid")
			wait "$perf_pid" || true
			perf_pid=
			set_enabled off
			check_target "$tid" "perf_b${bs}_l$lanes" "$N"
			{
				echo "==== relay worker (pid $wpid), drain of $N, batch_size $bs, $lanes lanes; 5 s of perf record -F 999 --call-graph dwarf"
				echo "  drain under perf: $out"
				echo "  samples: $(perf script -i "$work/perf-b$bs.data" -F pid 2>/dev/null | wc -l)"
				echo "  self time by shared object:"
				preport -i "$work/perf-b$bs.data" --no-children --sort dso --stdio -g none |
					grep -E '^ +[0-9]' | head -8 | sed 's/^/    /'
				echo "  top self-time symbols:"
				preport -i "$work/perf-b$bs.data" --no-children --sort dso,sym --stdio -g none |
					grep -E '^ +[0-9]' | head -30 | sed 's/^/    /'
				echo "  inclusive time (children, self) of selected functions:"
				preport -i "$work/perf-b$bs.data" --children --sort dso,sym --stdio -g none |
					grep -E '\] (outbox_worker_main|relay_[a-z_]+|outbox_[a-z_]+|WaitEventSetWait|epoll_wait|curl_multi_socket_action|curl_multi_add_handle|curl_multi_remove_handle|curl_multi_info_read|Curl_[a-zA-Z_]+|SPI_execute_plan|SPI_getvalue|JsonbToCString|XLogFlush|CommitTransactionCommand|StartTransactionCommand|ProcessConfigFile|__libc_send|__libc_recv|__GI___libc_write|__GI___libc_read|__send|__recv|__libc_sendto|__libc_recvfrom|issue_xlog_fsync|pg_fsync|fdatasync|__GI_fdatasync)$' |
					awk '{printf "    %7s %7s  %-22s %s\n", $1, $2, $3, $NF}' | head -40
			} >>"$work/out/perf.txt"
			perf_fold "$work/perf-b$bs.data" "$work/out/perf-http-b$bs.folded"
		done
		set -o pipefail
	fi
fi

# ---- server log -------------------------------------------------------------------------
wend=$(worker_pid)
[ "$wend" = "$worker0" ] || echo "the relay worker changed pid: $worker0 -> ${wend:-none} (restarted?)" >>"$work/anomalies"
set +o pipefail
{
	if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
		echo "SERVER LOG shows a crash:"
		grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
	fi
	# The worker starts before CREATE DATABASE $DB: one FATAL attempt to
	# connect, then it waits and exits once to connect when the database exists.
	nexit=$(grep -c 'exited with exit code' "$SERVERLOG" || true)
	[ "$nexit" = 0 ] || echo "server log: $nexit background worker exit(s): $(grep 'exited with exit code' "$SERVERLOG" | sed 's/^[^]]*] //' | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
	echo "server log: $(grep -c 'ERROR' "$SERVERLOG" || true) ERROR, $(grep -c 'WARNING' "$SERVERLOG" || true) WARNING, $(grep -c 'FATAL' "$SERVERLOG" || true) FATAL lines"
	grep -E 'ERROR|WARNING|FATAL' "$SERVERLOG" | sed -E 's/^.*(ERROR|WARNING|FATAL)/\1/' | sort | uniq -c | sort -rn | head -10
} >"$work/out/serverlog.txt"
set -o pipefail

# ---- report -------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$work/anomalies" "$work/out/perf.txt" "$work/out/serverlog.txt" <<PYEOF
import json, statistics, sys, os
res = [json.loads(l) for l in open(sys.argv[1])]
anom = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else ""
perf = open(sys.argv[3]).read() if os.path.exists(sys.argv[3]) else ""
slog = open(sys.argv[4]).read()
med = statistics.median
def of(kind, **kw):
    return [r for r in res if r["kind"] == kind and all(r.get(k) == v for k, v in kw.items())]

print()
print("outbox relay benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)")
print("  built from $build_rev (outbox.so md5 $build_md5); PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); nginx $(/usr/sbin/nginx -v 2>&1 | sed 's/.*nginx\///'); $(nproc) cores; machine busy before: $busy_before CPUs")
print("  N=$N messages, $KEYS keys, payload $payload_bytes bytes of JSON text, backlog emitted in $XACTS transactions; $RUNS rounds; synchronous_commit=on")
print()
ceil_runs = [r["rps"] for r in of("wrk")]
ceil = med(ceil_runs)
print(f"sink ceiling (wrk -t1 -c$WRK_CONNS -d${WRK_SECS}s, nginx return 204): median {ceil:.0f} req/s   runs: " + " ".join(f"{x:.0f}" for x in ceil_runs))
curl_runs = [r["rps"] for r in of("libcurl")]
lcurl = med(curl_runs)
print(f"libcurl client ($WRK_CONNS handles, no database, test/bench/curl_client.c): median {lcurl:.0f} req/s = {lcurl / ceil:.2f} x ceiling   runs: " + " ".join(f"{x:.0f}" for x in curl_runs))
print()
print("drain of a released backlog (messages/s; from the reload to the last recorded delivery)")
print(f"  {'batch:lanes':12} {'median':>8} {'x ceiling':>9}  {'runs':34} {'10-90% rate':>11} {'requests':>9} {'worker CPU':>10} {'us/msg':>6} {'nginx CPU':>9} {'machine':>7}")
drains = {}
for c in "$CONFIGS".split():
    bs, lanes = (int(x) for x in c.split(":"))
    rs = of("drain", batch=bs, lanes=lanes)
    if not rs: continue
    m = med(r["rate"] for r in rs)
    drains[c] = m
    cpu = med(r["cpu_s"][str(r["worker_pid"])] / r["seconds"] for r in rs)
    ncpu = med(r["cpu_s"][str(r["nginx_worker"])] / r["seconds"] for r in rs)
    runs = " ".join("%.0f" % r["rate"] for r in rs)
    r1090 = [r["rate_10_90"] for r in rs if r["rate_10_90"]]
    r1090 = med(r1090) if r1090 else float("nan")
    reqs = med(r["requests"] for r in rs)
    mach = med(r["machine_cpus_busy"] for r in rs)
    us = med(r["cpu_s"][str(r["worker_pid"])] / r["n"] * 1e6 for r in rs)
    print(f"  {c:12} {m:8.0f} {m / ceil:9.2f}  {runs:34} {r1090:11.0f} {reqs:9.0f} {cpu:10.0%} {us:6.1f} {ncpu:9.0%} {mach:7.2f}")
print("  (worker/nginx CPU: share of one core over the drain; us/msg: worker CPU per message; machine: CPUs busy)")
print()
hand1 = [r for r in of("hand", procs=1)]
hand = med(r["rate"] for r in hand1) if hand1 else None	# HAND_PROCS=0: none
if hand:
    print(f"hand-rolled relay, 1 process: median {hand:.0f} msg/s   runs: " + " ".join(f"{r['rate']:.0f}" for r in hand1))
for r in res:
    if r["kind"] == "hand" and r["procs"] > 1:
        print(f"hand-rolled relay, {r['procs']} processes in parallel (no per-key order): {r['rate']:.0f} msg/s")
print()
lat = of("latency")[0]
L = lat["arrival_minus_emitted_at_ms"]; C = lat["arrival_minus_commit_returned_ms"]; K = lat["commit_call_ms"]
print(f"latency at {lat['emitter']['achieved_rate']} msg/s for ${LAT_SECS}s, batch_size 1, $LAT_LANES lanes, {lat['arrived']}/{lat['emitted']} arrived:")
print(f"  arrival - emitted_at     p50 {L['p50']} p90 {L['p90']} p99 {L['p99']} max {L['max']} ms")
print(f"  arrival - commit seen by client  p50 {C['p50']} p90 {C['p90']} p99 {C['p99']} max {C['max']} ms (negative: the webhook arrived before the client saw its commit)")
print(f"  commit round trip (call to return)  p50 {K['p50']} p99 {K['p99']} ms")
print()
b1 = drains.get("1:32")
# batch_size 100 with the default 8 lanes if measured, else the first 100:* measured
b100 = next(((drains[c], c) for c in ["100:8"] + [c for c in drains if c.startswith("100:")] if c in drains), None)
def goal(ok): return "met" if ok else "MISSED"
print(f"{'figure (medians)':44} {'value':>12}   goal")
print(f"{'sink ceiling req/s':44} {ceil:12.0f}")
if b1:
    print(f"{'batch_size 1, 32 lanes msg/s':44} {b1:12.0f}")
    print(f"{'  / ceiling':44} {b1 / ceil:12.2f}   >= 0.40  {goal(b1 / ceil >= 0.4)}")
    print(f"{'  / libcurl client (same run)':44} {b1 / lcurl:12.2f}   (libcurl client / ceiling: {lcurl / ceil:.2f})")
if b100:
    print(f"{'batch_size 100, ' + b100[1].split(':')[1] + ' lanes msg/s':44} {b100[0]:12.0f}")
    print(f"{'  / ceiling':44} {b100[0] / ceil:12.2f}   >= 1.50  {goal(b100[0] / ceil >= 1.5)}")
    for c, v in drains.items():
        if c.startswith("100:") and c != b100[1]:
            print(f"{'  (batch_size 100, ' + c.split(':')[1] + ' lanes msg/s)':44} {v:12.0f}   x ceiling {v / ceil:.2f}")
if hand:
    print(f"{'hand-rolled relay msg/s (1 process)':44} {hand:12.0f}")
if b1 and hand:
    print(f"{'batch_size 1 / hand-rolled':44} {b1 / hand:12.2f}   >= 5     {goal(b1 / hand >= 5)}")
print(f"{'latency p50 ms (arrival - emitted_at)':44} {L['p50']:12.2f}   <= 5     {goal(L['p50'] <= 5)}")
print(f"{'latency p99 ms (arrival - emitted_at)':44} {L['p99']:12.2f}   <= 25    {goal(L['p99'] <= 25)}")
print()
print("relay worker memory (kB; VmRSS / RssAnon; RssShmem is shared_buffers pages it touched)")
st = of("start")[0]
print(f"  at start (pid {st['worker_pid']}): VmRSS {st['rss']['rss_kb']}  RssAnon {st['rss']['anon_kb']}  RssShmem {st['rss']['shmem_kb']}")
print(f"  {'drain':16} {'VmRSS before':>12} {'after':>8} {'RssAnon before':>14} {'after':>8} {'VmHWM after':>11}")
for r in res:
    if r["kind"] == "drain":
        a, b = r["rss_before"], r["rss_after"]
        print(f"  {r['label'] + ' r' + str(r['round']):16} {a['rss_kb']:12} {b['rss_kb']:8} {a['anon_kb']:14} {b['anon_kb']:8} {b['hwm_kb']:11}")
en = of("end")[0]
print(f"  at the end, targets dropped (pid {en['worker_pid']}): VmRSS {en['rss']['rss_kb']}  RssAnon {en['rss']['anon_kb']}  VmHWM {en['rss']['hwm_kb']}")
print()
for r in of("stats"):
    print("pg_stat_user_tables after the timed drains (the worker read every message and updated outbox.progress every 20 ms meanwhile):")
    for t in r["tables"] or []:
        print("  outbox." + t["table"] + ": " + ", ".join(f"{k} {v}" for k, v in t.items() if k != "table"))
    print()
for r in of("verify"):
    print(f"verify batch_size {r['batch']}, {r['lanes']} lanes into bench_sink: {json.dumps(r['verify'])}  ({r['drain']['rate']} msg/s into the Python sink)")
print(f"verify latency run: {json.dumps(lat['verify'])}")
print()
print("ANOMALIES:\n  " + anom.replace("\n", "\n  ") if anom else "sanity: every drain delivered exactly N with no dead letters, no lane errors, lag pending 0; the relay worker kept its pid")
print(slog.rstrip())
if perf:
    print()
    print(perf.rstrip())
PYEOF

# ---- charts -------------------------------------------------------------------------------
# The figures above as SVG charts (header comment), into $work/out, which
# OUT=DIR receives; a chart that fails is reported and does not fail the run.
if charts=$("$PY" "$here/bench_charts.py" relay "$RESULTS" "$work/out" --configs "$CONFIGS" \
	--lat-lanes "$LAT_LANES" --lat-secs "$LAT_SECS" \
	--note "built from $build_rev; $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"); then
	log "charts: $(echo "$charts" | sed "s|^$work/out/|${OUT:-$work/out}/|" | paste -sd' ' -)"
else
	log "charts: not all made (see above): $(echo "$charts" | paste -sd' ' -)"
fi
[ -n "$OUT" ] || [ "$KEEP" = 1 ] || log "charts: removed with $work on exit; OUT=DIR keeps them"
