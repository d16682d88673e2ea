#!/usr/bin/env bash
# commit_bench.sh - the time from a change's commit to Kafka: a mixed
# INSERT/UPDATE/DELETE workload on a captured table, delivered by the relay
# to librdkafka's mock cluster, timed per change until a consumer has it;
# the figure the change-capture tools publish (Sequin, Debezium).
#
# Run by hand, as root (not in CI):
#
#   test/bench/commit_bench.sh                    # ~3 minutes on 2 cores
#   RATES="1000 10000" MODES="trigger wal" DURATION=20 test/bench/commit_bench.sh
#   MAX=0 test/bench/commit_bench.sh              # without the unthrottled run
#
# What it measures (everything on 127.0.0.1, one machine of 2 cores; the
# peer is test/kafka/outbox_kafka mock: librdkafka's mock cluster of 3
# brokers in a process of its own, a topic of PARTITIONS=6 partitions per
# run, replication factor 3, acks=all):
#   The table: orders (id bigint PRIMARY KEY, customer_id bigint, status
#   text, amount numeric(12,2), note text), 1,000,000 rows to start with,
#   captured with outbox.capture() in MODE (MODES="trigger wal": the C row
#   trigger, or WAL decoding by the capture worker; the cluster runs with
#   wal_level = logical for both), and a Kafka target (defaults: 8 lanes,
#   batch_size 100; format 'cloudevents', so that every record carries its
#   change's time as the ce_time header) subscribed to it, fresh for each
#   run with a fresh topic.
#   The workload: pgbench, CLIENTS=8 connections, XACT_CHANGES=10 changes
#   a transaction (1: one autocommit statement each), synchronous_commit =
#   on; each change 50% an UPDATE of a random row of the first 500,000,
#   30% an INSERT of a new row, 20% a DELETE of the next row from 500,001
#   on (a sequence: every change changes one row).  At
#   each rate of RATES (changes a second: pgbench -R of RATE / XACT_CHANGES
#   transactions) for DURATION seconds,
#   and (MAX=1) once without a rate: the highest rate the writers reach on
#   this machine, the relay delivering as they go.
#   The time of a change: from its transaction's commit
#   (track_commit_timestamp: pg_xact_commit_timestamp() of the record's
#   source-xid header) to the moment a consumer
#   (test/kafka/outbox_kafka tail, fetch.wait.max.ms 1, from the beginning
#   of the topic) received the record: average, p50, p90, p99, max, over
#   every change of the run; also from the change itself (its ce_time, the
#   message's emitted_at: the moment the row changed for the trigger, the
#   commit for WAL capture).  The broker's acknowledgement comes before the
#   consumer's fetch, so this is an upper bound of commit to
#   acknowledgement.
#   Also recorded: the changes/s the writers reached, pgbench's own
#   latency per transaction (its commit included), whether delivery kept
#   up (the consumer had everything within 2 s of the last commit), and
#   the CPUs busy during the run: the machine's, and of them the relay's,
#   the capture worker's, the mock cluster's and the consumer's.
# Goals (issue 45): at 10,000 changes/s, average <= 5 ms, p99 <= 25 ms.
#
# Settings (environment):
#   RATES="1000 10000" MODES="trigger wal" DURATION=15 CLIENTS=8 MAX=1
#   PROPERTIES='{}' (the target's librdkafka properties, e.g.
#   '{"linger.ms": 5}')
#   XACT_CHANGES=10 PERF=0 (1: perf record of the relay during each run,
#   into $OUT)
#   PARTITIONS=6 KEEP=0 OUT= REV= (build that git revision) INSTALL=0

set -euo pipefail

RATES=${RATES:-"1000 10000"}
MODES=${MODES:-"trigger wal"}
DURATION=${DURATION:-15}
CLIENTS=${CLIENTS:-8}
XACT_CHANGES=${XACT_CHANGES:-10}
MAX=${MAX:-1}
PERF=${PERF:-0}
PROPERTIES=${PROPERTIES:-"{}"}
PARTITIONS=${PARTITIONS:-6}
KEEP=${KEEP:-0}
OUT=${OUT:-}
REV=${REV:-}
INSTALL=${INSTALL:-0}
PORT=${PORT:-54349}
NGINX_PORT=			# no nginx
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh|capture_bench.sh|nats_bench.sh|kafka_bench.sh"}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

[[ $XACT_CHANGES =~ ^[1-9][0-9]*$ ]] || { echo "XACT_CHANGES: a positive number" >&2; exit 2; }
for r in $RATES; do [[ $r =~ ^[1-9][0-9]*$ ]] || { echo "RATES: positive numbers, not '$r'" >&2; exit 2; }; done
for m in $MODES; do [[ $m =~ ^(trigger|wal)$ ]] || { echo "MODES: trigger and/or wal, not '$m'" >&2; exit 2; }; done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

BENCH_NAME=commit-bench
BENCH_PACKAGES=(gcc librdkafka-dev)
BENCH_CONF="wal_level = logical
track_commit_timestamp = on
max_replication_slots = 10
max_wal_senders = 10"
mock_pid=
tail_pid=
bench_on_exit() {
	[ -n "$tail_pid" ] && kill "$tail_pid" 2>/dev/null
	kafka_mock_stop
}
. "$here/common.sh"
bench_setup

PGBENCH=$BIN/pgbench
[ -x "$PGBENCH" ] || PGBENCH=$(command -v pgbench)

# ---- the mock cluster (common.sh) ----
kafka_mock_start
log "librdkafka $(dpkg-query -W -f='${Version}' librdkafka-dev 2>/dev/null || echo '?') mock cluster on $BOOT; $PARTITIONS partitions a topic"

# ---- database ----
# 15.19 and later minors allow only the listed output plugins.
if [ "$(psqlq -d postgres -Atc "SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'")" = 1 ]; then
	psqlq -d postgres -c "ALTER SYSTEM SET output_plugin_libraries = pgoutput, test_decoding, outbox" \
		-c "SELECT pg_reload_conf()" >/dev/null
fi
psqlq -d postgres -c "CREATE DATABASE $DB"
sql >/dev/null <<SQL
CREATE EXTENSION outbox;
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
                     amount numeric(12,2) NOT NULL, note text);
CREATE SEQUENCE orders_new START 100000001;
CREATE SEQUENCE orders_gone START 500001;
INSERT INTO orders SELECT g, g % 5000, 'new', (g % 1000) / 10.0, 'order ' || g
  FROM generate_series(1, 1000000) g;
VACUUM ANALYZE orders;
SQL
# a transaction: XACT_CHANGES changes, each drawn from the mix
{
	if [ "$XACT_CHANGES" -gt 1 ]; then echo 'BEGIN;'; fi
	for i in $(seq "$XACT_CHANGES"); do
		echo "\\set r$i random(1, 100)"
		echo "\\set id$i random(1, 500000)"
		echo "\\set c$i random(1, 5000)"
		echo "\\if :r$i <= 50"
		echo "UPDATE orders SET status = 'paid', amount = amount + 1 WHERE id = :id$i;"
		echo "\\elif :r$i <= 80"
		echo "INSERT INTO orders VALUES (nextval('orders_new'), :c$i, 'new', :id$i / 100.0, 'inserted');"
		echo "\\else"
		echo "DELETE FROM orders WHERE id = (SELECT nextval('orders_gone'));"
		echo "\\endif"
	done
	if [ "$XACT_CHANGES" -gt 1 ]; then echo 'COMMIT;'; fi
} >"$work/mix.sql"
chmod 644 "$work/mix.sql"

run=0
# CPU ticks (user + system, every thread) of a process, and of the machine
ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
machine_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
# run MODE RATE (0: unthrottled): one measured run
one_run() {
	local mode=$1 rate=$2 topic target rargs=() t_end delivered pgb
	run=$((run + 1))
	topic="commit.r$run"
	target="k$run"
	mock_cmd create "$topic" "$PARTITIONS"
	sql >/dev/null <<-SQL
	SELECT outbox.capture('public.orders', mode => '$mode');
	SELECT outbox.create_kafka_target('$target', '$BOOT', topic => '$topic', format => 'cloudevents',
	                                  properties => '$PROPERTIES');
	SELECT outbox.subscribe('$target', 'public.orders');
	SQL
	# warm up: one change through, and the consumer reading
	sql -c "UPDATE orders SET note = 'warm' WHERE id = 1" >/dev/null
	"$work/outbox_kafka" tail "$BOOT" "$topic" 100000000 600 >"$work/tail.$run" 2>"$work/tail.$run.err" &
	tail_pid=$!
	for _ in $(seq 600); do [ -s "$work/tail.$run" ] && break; sleep 0.05; done
	[ -s "$work/tail.$run" ] || { echo "the warm-up change never reached the consumer" >&2; exit 1; }
	[ "$rate" -gt 0 ] && rargs=(-R $(( (rate + XACT_CHANGES - 1) / XACT_CHANGES )))
	log "  $mode at ${rate/#0/max} changes/s for $DURATION s"
	local relay_pid capture_pid c0 c1 t0 t1
	relay_pid=$(sql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay'")
	capture_pid=$(sql -c "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE backend_type = 'outbox capture'")
	c0="$(ticks "$relay_pid") $(ticks "$capture_pid") $(ticks "$mock_pid") $(ticks "$tail_pid") $(machine_ticks)"
	if [ "$PERF" = 1 ]; then
		perf record -F 999 -g -p "$relay_pid" -o "$work/out/perf.$mode.$rate.data" -- sleep "$DURATION" \
			>/dev/null 2>&1 &
	fi
	t0=$(date +%s%N)
	pgb=$(as_pg env PGHOST="$SOCK" PGPORT="$PORT" "$PGBENCH" -n -U postgres -c "$CLIENTS" -j 2 -M prepared \
		-T "$DURATION" "${rargs[@]}" -f "$work/mix.sql" "$DB" 2>&1) || { echo "$pgb" >&2; exit 1; }
	t_end=$(date +%s%N)
	c1="$(ticks "$relay_pid") $(ticks "$capture_pid") $(ticks "$mock_pid") $(ticks "$tail_pid") $(machine_ticks)"
	t1=$t_end
	# every message delivered, and the consumer has them all
	for _ in $(seq 1200); do
		[ "$(sql -c "SELECT pending FROM outbox.lag WHERE target = '$target'")" = 0 ] && break
		sleep 0.05
	done
	delivered=$(sql -c "SELECT delivered FROM outbox.lag WHERE target = '$target'")
	for _ in $(seq 1200); do
		[ "$(wc -l <"$work/tail.$run")" -ge "$delivered" ] && break
		sleep 0.05
	done
	kill "$tail_pid" 2>/dev/null; wait "$tail_pid" 2>/dev/null || true
	tail_pid=
	[ "$(wc -l <"$work/tail.$run")" -ge "$delivered" ] ||
		{ echo "the consumer has $(wc -l <"$work/tail.$run") of $delivered records" >&2; exit 1; }
	# every change's commit time (track_commit_timestamp), by its source-xid
	awk '$5 != "-" {print $5}' "$work/tail.$run" | sort -u >"$work/xids.$run"
	chmod 644 "$work/xids.$run"
	sql >"$work/commits.$run" <<-SQL
	CREATE TEMP TABLE x (xid text);
	\copy x FROM '$work/xids.$run'
	SELECT xid, (extract(epoch FROM pg_xact_commit_timestamp(xid::xid)) * 1e6)::bigint FROM x;
	SQL
	"$PY" - "$work/tail.$run" "$mode" "$rate" "$DURATION" "$t_end" "$delivered" "$pgb" "$XACT_CHANGES" \
		"$c0" "$c1" "$t0" "$t1" "$work/commits.$run" >>"$RESULTS" <<-'PY'
	import datetime, json, re, sys
	path, mode, rate, duration, t_end, delivered, pgb = sys.argv[1:8]
	commits = {}
	for line in open(sys.argv[13]):
	    if '|' in line:
	        x, us = line.strip().split('|')
	        commits[x] = int(us) if us else None
	c0, c1 = [list(map(int, x.split())) for x in sys.argv[9:11]]
	secs = (int(sys.argv[12]) - int(sys.argv[11])) / 1e9
	cpu = {name: (b - a) / 100.0 / secs for name, a, b in
	       zip(["relay", "capture", "mock", "consumer", "machine"], c0, c1)}
	lat, change_lat, last_recv, unknown = [], [], 0, 0
	for i, line in enumerate(open(path)):
	    recv, part, off, ce, xid = line.split()
	    if i == 0:
	        continue          # the warm-up change
	    t = datetime.datetime.strptime(ce.rstrip('Z'), '%Y-%m-%dT%H:%M:%S.%f')
	    t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
	    change_lat.append((int(recv) / 1e6 - t) * 1000.0)
	    if commits.get(xid) is None:
	        unknown += 1
	        continue
	    lat.append((int(recv) - commits[xid]) / 1000.0)
	    last_recv = max(last_recv, int(recv))
	lat.sort()
	change_lat.sort()
	q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
	m = re.search(r'latency average = ([0-9.]+) ms', pgb)
	tps = re.search(r'tps = ([0-9.]+)', pgb)
	print(json.dumps({"mode": mode, "rate": int(rate), "xact_changes": int(sys.argv[8]), "changes": len(change_lat),
	                  "changes_per_s": len(change_lat) / float(duration),
	                  "pgbench_tps": float(tps.group(1)) if tps else None,
	                  "pgbench_latency_ms": float(m.group(1)) if m else None,
	                  "avg_ms": sum(lat) / len(lat), "p50_ms": q(0.50), "p90_ms": q(0.90),
	                  "p99_ms": q(0.99), "max_ms": lat[-1], "no_commit_time": unknown,
	                  "from_change_avg_ms": sum(change_lat) / len(change_lat),
	                  "from_change_p99_ms": change_lat[min(len(change_lat) - 1, int(0.99 * len(change_lat)))],
	                  "cpus": cpu,
	                  "kept_up": (last_recv * 1000 - int(t_end)) / 1e9 <= 2.0,
	                  "last_after_end_s": (last_recv * 1000 - int(t_end)) / 1e9}))
	PY
	log "    $(tail -1 "$RESULTS" | "$PY" -c 'import json, sys; r = json.load(sys.stdin); print("%(changes)d changes, %(changes_per_s).0f/s (pgbench %(pgbench_latency_ms).2f ms a transaction); from the change avg %(from_change_avg_ms).2f ms, p99 %(from_change_p99_ms).2f; commit to consumer: avg %(avg_ms).2f ms, p50 %(p50_ms).2f, p90 %(p90_ms).2f, p99 %(p99_ms).2f, max %(max_ms).1f; last record %(last_after_end_s).2f s after the last commit" % r + "; CPUs busy: " + ", ".join("%s %.2f" % kv for kv in r["cpus"].items()))')"
	sql >/dev/null <<-SQL
	SELECT outbox.uncapture('public.orders');
	SELECT outbox.drop_target('$target');
	SQL
	sql -c "CHECKPOINT" >/dev/null
}

for mode in $MODES; do
	for rate in $RATES; do one_run "$mode" "$rate"; done
	[ "$MAX" = 1 ] && one_run "$mode" 0
done

"$PY" - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print()
print("commit to a consumer's receipt (ms), per change")
print(f"  {'mode':8} {'rate':>6} {'reached/s':>9} {'changes':>8} {'avg':>7} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'pgbench ms':>10} {'kept up':>7}")
for r in rows:
    print(f"  {r['mode']:8} {r['rate'] or 'max':>6} {r['changes_per_s']:9.0f} {r['changes']:8d} {r['avg_ms']:7.2f} {r['p50_ms']:7.2f} "
          f"{r['p90_ms']:7.2f} {r['p99_ms']:7.2f} {r['max_ms']:7.1f} {r['pgbench_latency_ms'] or 0:10.2f} {'yes' if r['kept_up'] else 'NO':>7}")
print()
for r in rows:
    if r['rate'] == 10000:
        print(f"goal at 10,000 changes/s ({r['mode']}): avg {r['avg_ms']:.2f} ms (<= 5: {'met' if r['avg_ms'] <= 5 else 'MISSED'}), "
              f"p99 {r['p99_ms']:.2f} ms (<= 25: {'met' if r['p99_ms'] <= 25 else 'MISSED'}); "
              f"reached {r['changes_per_s']:.0f}/s")
PY
