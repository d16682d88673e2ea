#!/usr/bin/env bash
# failover_bench.sh - what outbox.standby_slots costs delivery: a primary
# with a streaming standby on loopback (physical slot standby1), the same
# run alternating A (setting empty) and B (outbox.standby_slots =
# 'standby1'), A B / B A per round.
#
# Run by hand, as root (not in CI):
#
#   test/bench/failover_bench.sh                  # ~4 minutes on 2 cores
#   ROUNDS=5 LAT_SECS=30 test/bench/failover_bench.sh
#
# latency: LAT_RATE messages a second for LAT_SECS seconds (4 emitting
#          connections, one message a transaction) to a batch_size 1 target
#          with 8 lanes at test/bench/bench_sink.py; from the commit's return
#          to the receiver's arrival, p50 and p99.  Goal: B at most +1 ms
#          p50 and +3 ms p99 over A.
# drain:   DRAIN messages stored while outbox.enabled is off, then released
#          to an HTTP target on nginx (batch_size BATCH, LANES lanes); messages
#          a second until outbox.stats counts them delivered.  Goal: B/A >=
#          0.95.
#
# Settings (environment):
#   ROUNDS=3 LAT_RATE=500 LAT_SECS=15 DRAIN=200000 BATCH=100 LANES=8
#   PORT=54341 NGINX_PORT=18095 KEEP=0 REV= OUT=DIR
#   WAIT_FOR=relay_bench.sh   wait while a process whose command line matches runs
set -euo pipefail

ROUNDS=${ROUNDS:-3}
LAT_RATE=${LAT_RATE:-500}
LAT_SECS=${LAT_SECS:-15}
DRAIN=${DRAIN:-200000}
BATCH=${BATCH:-100}
LANES=${LANES:-8}
PORT=${PORT:-54341}
NGINX_PORT=${NGINX_PORT:-18095}
KEEP=${KEEP:-0}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=app

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
REV=${REV:-}
INSTALL=${INSTALL:-0}
OUT=${OUT:-}
WAIT_FOR=${WAIT_FOR-relay_bench.sh}
BENCH_NAME=failover-bench
BENCH_PACKAGES=()
BENCH_CONF="wal_level = replica
max_wal_senders = 4
outbox.poll_interval = '1s'"
STANDBY_PORT=$((PORT + 1))
bench_on_exit() {
	[ -f "$work/standby/postmaster.pid" ] &&
		as_pg "$BIN/pg_ctl" -D "$work/standby" -m immediate -w stop >/dev/null 2>&1
	[ -n "${sink_pid:-}" ] && kill "$sink_pid" 2>/dev/null
	return 0
}
# shellcheck source=common.sh
. "$here/common.sh"
bench_setup

# ---- the standby, on its own port, with the same private library directory ----
log "standby: pg_basebackup with slot standby1"
mkdir -p "$work/standby" && chown "$PGUSER_OS" "$work/standby" && chmod 700 "$work/standby"
as_pg "$BIN/pg_basebackup" -h "$SOCK" -p "$PORT" -U postgres -D "$work/standby" -R -C -S standby1 -X stream
mkdir -p "$work/sock2" && chown "$PGUSER_OS" "$work/sock2"
cat >>"$work/standby/postgresql.conf" <<-EOF
port = $STANDBY_PORT
unix_socket_directories = '$work/sock2'
outbox.standby_slots = ''
EOF
unshare -m --propagation private sh -c 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && shift 4 && exec "$@"' sh \
	"$work/pkglib" "$pkglibdir" "$work/extension" "$extdir" \
	runuser -u "$PGUSER_OS" -- "$BIN/pg_ctl" -D "$work/standby" -l "$work/log/standby.log" -w -t 60 start >/dev/null
for _ in $(seq 100); do
	[ "$(psqlq -d postgres -At -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ] && break
	sleep 0.1
done

psqlq -d postgres -c "CREATE DATABASE $DB" >/dev/null
for _ in $(seq 150); do [ -n "$(worker_pid)" ] && break; sleep 0.2; done
sql -c 'CREATE EXTENSION outbox' >/dev/null
create_bench_payload
sql -c "SELECT outbox.create_http_target('drain', '$NGINX_URL', batch_size => $BATCH, lanes => $LANES)" \
	-c "SELECT outbox.subscribe('drain', 'drain')" >/dev/null

start_sink() {	# name
	rm -f "$work/out/$1.port"
	"$PY" "$here/bench_sink.py" --port 0 --port-file "$work/out/$1.port" --record "$work/out/$1.jsonl" &
	sink_pid=$!
	for _ in $(seq 100); do [ -s "$work/out/$1.port" ] && break; sleep 0.05; done
	SINK_URL="http://127.0.0.1:$(cat "$work/out/$1.port")/hook"
}
stop_sink() { kill -TERM "$sink_pid"; wait "$sink_pid" || true; sink_pid=; }
set_conf() {	# name value
	sql -c "ALTER SYSTEM SET $1 = '$2'" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 0.5
}
config() {	# A|B
	if [ "$1" = A ]; then set_conf outbox.standby_slots ''; else set_conf outbox.standby_slots standby1; fi
}

# One latency run: prints "p50 p99" of arrival - commit returned, in ms.
latency_round() {
	local name=lat$1 tid n
	start_sink "$name"
	sql -c "SELECT outbox.create_http_target('$name', '$SINK_URL', batch_size => 1, lanes => 8)" \
		-c "SELECT outbox.subscribe('$name', 'latency.test')" >/dev/null
	tid=$(sql -c "SELECT outbox.target_id('$name')")
	tool emit-rate --rate "$LAT_RATE" --seconds "$LAT_SECS" --threads 4 --out "$work/out/$name-emits.jsonl" >/dev/null
	n=$(wc -l <"$work/out/$name-emits.jsonl")
	for _ in $(seq 300); do
		[ "$(sql -c "SELECT coalesce(sum(delivered + dead), 0) FROM outbox.progress WHERE target_id = $tid")" -ge "$n" ] && break
		sleep 0.1
	done
	stop_sink
	sql -c "SELECT outbox.drop_target('$name')" >/dev/null
	tool latency --emits "$work/out/$name-emits.jsonl" --sink-records "$work/out/$name.jsonl" >"$work/out/$name.json"
	"$PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
l = d["arrival_minus_commit_returned_ms"]
if d["missing"]:
    sys.exit("missing deliveries: %d" % d["missing"])
print(l["p50"], l["p99"])' "$work/out/$name.json"
}

# One drain: prints messages a second.
drain_round() {
	local before now t0 t1
	set_conf outbox.enabled off
	sql -c "SELECT count(outbox_emit('drain', bench_payload(g), 'k' || g % 1000)) FROM generate_series(1, $DRAIN) g" >/dev/null
	before=$(sql -c "SELECT coalesce(sum(messages), 0) FROM outbox.stats WHERE target = 'drain'")
	t0=$(date +%s.%N)
	sql -c "ALTER SYSTEM SET outbox.enabled = on" -c "SELECT pg_reload_conf()" >/dev/null
	while :; do
		now=$(sql -c "SELECT coalesce(sum(messages), 0) FROM outbox.stats WHERE target = 'drain'")
		[ "$now" -ge $((before + DRAIN)) ] && break
		sleep 0.02
	done
	t1=$(date +%s.%N)
	awk -v n="$DRAIN" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", n / (b - a) }'
}

log "warm-up"
config B
latency_round 0 >/dev/null
drain_round >/dev/null

declare -a P50A P50B P99A P99B DA DB_
k=0
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
	for c in $order; do
		config "$c"
		k=$((k + 1))
		read -r p50 p99 < <(latency_round "$k")
		v=$(drain_round)
		log "round $r $c: latency p50 $p50 ms p99 $p99 ms; drain $v msg/s (machine busy: $(machine_busy 1) CPUs)"
		record "{\"round\": $r, \"config\": \"$c\", \"p50_ms\": $p50, \"p99_ms\": $p99, \"drain_msgs\": $v}"
		if [ "$c" = A ]; then P50A+=("$p50"); P99A+=("$p99"); DA+=("$v"); else P50B+=("$p50"); P99B+=("$p99"); DB_+=("$v"); fi
	done
done
held=$(sql -c "SELECT count(*) FROM outbox.dead_letters")
[ "$held" = 0 ] || { echo "dead letters: $held" >&2; exit 1; }

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
a50=$(median "${P50A[@]}"); b50=$(median "${P50B[@]}")
a99=$(median "${P99A[@]}"); b99=$(median "${P99B[@]}")
da=$(median "${DA[@]}"); db=$(median "${DB_[@]}")
echo
echo "outbox $build_rev ($build_md5), a streaming standby on loopback, $ROUNDS rounds, medians"
printf 'latency (commit returned -> arrival, %s msg/s): p50 %s ms without, %s ms with outbox.standby_slots (%+.2f ms); p99 %s ms without, %s ms with (%+.2f ms)\n' \
	"$LAT_RATE" "$a50" "$b50" "$(awk -v a="$a50" -v b="$b50" 'BEGIN { print b - a }')" \
	"$a99" "$b99" "$(awk -v a="$a99" -v b="$b99" 'BEGIN { print b - a }')"
printf 'drain (batch_size %s, %s lanes, nginx): %s msg/s without, %s msg/s with: %s\n' "$BATCH" "$LANES" "$da" "$db" \
	"$(awk -v a="$da" -v b="$db" 'BEGIN { printf "%.2f", b / a }')"
