#!/usr/bin/env bash
# capture_bench.sh - write-path cost of change capture by trigger
# (outbox.capture()) against no capture and against a PL/pgSQL AFTER ROW
# trigger calling outbox_emit(), measured with pgbench on a throwaway
# cluster.
#
# Run by hand, as root (not in CI):
#
#   test/bench/capture_bench.sh                  # ~17 minutes on 2 cores
#   ROUNDS=3 DURATION=15 test/bench/capture_bench.sh     # ~10 minutes
#   STYLES=statement ROWS="1 10" test/bench/capture_bench.sh
#   PG_CONFIG=/tmp/pg18/pg_config test/bench/capture_bench.sh  # another server
#
# The table: orders (id bigserial PRIMARY KEY, customer_id bigint, status
# text, amount numeric(12,2)), the same for every variant; each transaction
# inserts N rows (ROWS="1 10"):
#   none     no capture
#   wal, walpaused   SELECT outbox.capture('orders', mode => 'wal') (the
#            cluster runs with wal_level = logical for every variant)
#   trigger  SELECT outbox.capture('orders'): the extension's C row trigger,
#            one message per row on topic public.orders (key id, payload
#            {"op", "before", "after"}, source-* headers)
#   debezium SELECT outbox.capture('orders', format => 'debezium',
#            topic => 'public.orders'): the same C trigger writing
#            Debezium's change events (envelope, source block, key object)
#   plpgsql  a PL/pgSQL AFTER INSERT row trigger doing
#            PERFORM outbox_emit('orders', to_jsonb(NEW), NEW.id::text)
# in one of two shapes (STYLES="statement xact"):
#   statement  one autocommit INSERT ... SELECT of N rows (N = 1: INSERT
#              ... VALUES): the trigger's per-row cost is most visible
#   xact       BEGIN; N one-row INSERTs; COMMIT: the round trips of an
#              application that inserts row by row
#
# Every variant runs in the same invocation under synchronous_commit = on,
# alternating over ROUNDS rounds (the order of the variants rotates every
# round, so none always runs first); the median TPS of each is reported
# with the ratios that matter, as the ratio of the medians and as the
# median of the per-round ratios (runs of one round are close in time, so
# the latter resists slow drift on a shared machine):
#   trigger/none     goal >= 0.90 at 1 row, >= 0.80 at 10 rows
#   trigger/plpgsql  goal >= 1.30
#   debezium/trigger goal >= 0.95: Debezium's format against outbox's
#   wal/none         goal >= 0.95: WAL capture, the capture worker decoding
#                    and handing off during the run (on 2 cores it takes
#                    CPU from the application)
#   walpaused/none   goal >= 0.95: the application's commit path alone, the
#                    worker standing still (outbox.test_fault =
#                    capture_pause) until the run ends
# and, after the rounds, the WAL capture's hand-off rate (HANDOFF_ROWS
# changes decoded after the fact, goal >= 100,000/s) and its commit-to-
# delivered latency to nginx at LATENCY_RATE changes/s (outbox.stats p50
# and p99, goals <= 5 ms and <= 20 ms).
# Before every run the variant is set up (capture, trigger or nothing), the
# tables are truncated and a CHECKPOINT taken.  After every run the rows
# are checked: N orders per committed transaction, one message per order
# for trigger and plpgsql (none for none) with the variant's topic and
# shape, distinct gap-free ids, frontier = max(id).  Before each run the
# CPUs the rest of the machine keeps busy are sampled for a second, and the
# report says when the machine was shared.  A chart of the medians
# (capture-tps.svg, with bench_charts.py's helpers) goes to $work/out.
#
# Settings (environment):
#   ROUNDS=5 DURATION=15 CLIENTS=8 THREADS=2 PROTOCOL=prepared WARMUP=5
#   ROWS="1 10"               rows inserted per transaction
#   STYLES="statement xact"   see above
#   VARIANTS="none trigger plpgsql"
#   PG_CONFIG=                the pg_config of the server to build for and
#                             run (default: PostgreSQL 15 of Debian)
#   PORT=54331                non-default port, unix socket only
#   RELAY=running             stopped: SIGSTOP the relay worker for the
#                             measurements (it has no target to deliver to
#                             either way, but is woken by every commit)
#   KEEP=0                    1: keep the cluster directory (for debugging)
#   REV=                      build this git revision instead of the working tree
#   OUT=DIR                   copy the raw results, the chart and the server log there
#   INSTALL=0                 1: also "make install" into PG_CONFIG's directories
#   WAIT_FOR="relay_bench.sh|emit_bench.sh|queue_bench.sh"
#                             wait while a process whose command line matches runs
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-15}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
PROTOCOL=${PROTOCOL:-prepared}
WARMUP=${WARMUP:-5}
ROWS=${ROWS:-"1 10"}
STYLES=${STYLES:-"statement xact"}
VARIANTS=${VARIANTS:-"none trigger plpgsql wal walpaused"}
HANDOFF_ROWS=${HANDOFF_ROWS:-1000000}	# WAL hand-off rate: changes decoded and handed off
LATENCY_RATE=${LATENCY_RATE:-1000}	# WAL latency run: changes per second, for LATENCY_SECONDS
LATENCY_SECONDS=${LATENCY_SECONDS:-40}
PORT=${PORT:-54331}
KEEP=${KEEP:-0}
RELAY=${RELAY:-running}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench
BENCH_PG_CONFIG=${PG_CONFIG:-}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

for s in $STYLES; do
	case $s in statement | xact) ;; *) echo "STYLES: statement and/or xact, not '$s'" >&2; exit 2 ;; esac
done
for v in $VARIANTS; do
	case $v in none | trigger | debezium | plpgsql | wal | walpaused) ;; *) echo "VARIANTS: none, trigger, debezium, plpgsql, wal, walpaused, not '$v'" >&2; exit 2 ;; esac
done
for n in $ROWS; do
	[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "ROWS: positive numbers, not '$n'" >&2; exit 2; }
done

# The shared set-up (test/bench/common.sh): packages, a build of the working
# tree (or REV) installed privately for this server, the cluster.
REV=${REV:-}
INSTALL=${INSTALL:-0}
OUT=${OUT:-}
WAIT_FOR=${WAIT_FOR-"relay_bench.sh|emit_bench.sh|queue_bench.sh"}
NGINX_PORT=${NGINX_PORT:-18091}	# the receiver of the WAL latency run
BENCH_NAME=capture-bench
BENCH_PACKAGES=(gnuplot-nox)
# The hand-off runs stop the capture worker with outbox.test_fault
# (capture_pause), which only the test build has: this benchmark measures
# that build (its hooks cost one string compare where they are).
BENCH_MAKE_ARGS=OUTBOX_TEST_FAULTS=1
BENCH_CONF="listen_addresses = ''
wal_level = logical
max_replication_slots = 4
checkpoint_timeout = 1h
autovacuum = off
log_checkpoints = off"
relay_pid=
bench_on_exit() {
	[ -n "$relay_pid" ] && kill -CONT "$relay_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
# common.sh takes PostgreSQL 15's binaries; with PG_CONFIG, bench_setup
# takes that server's (its --bindir) instead.
if [ -n "$BENCH_PG_CONFIG" ]; then
	[ -x "$BENCH_PG_CONFIG" ] || { echo "PG_CONFIG=$BENCH_PG_CONFIG is not executable" >&2; exit 2; }
	patched=$(declare -f bench_setup | sed \
		-e 's|BIN=/usr/lib/postgresql/15/bin;|BIN=$("$BENCH_PG_CONFIG" --bindir);|' \
		-e 's|PG_CONFIG=\$BIN/pg_config;|PG_CONFIG=$BENCH_PG_CONFIG;|')
	[ "$(grep -c 'BENCH_PG_CONFIG' <<<"$patched")" = 2 ] || {
		echo "common.sh's bench_setup no longer has the lines PG_CONFIG replaces; update capture_bench.sh" >&2
		exit 2
	}
	eval "$patched"
fi
bench_setup

# 15.19 and later minors allow only the listed output plugins.
if [ "$(psqlq -d postgres -Atc "SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'")" = 1 ]; then
	psqlq -d postgres -c "ALTER SYSTEM SET output_plugin_libraries = pgoutput, test_decoding, outbox" \
		-c "SELECT pg_reload_conf()" >/dev/null
fi
psqlq -d postgres -c "CREATE DATABASE $DB"
psqlq -d "$DB" <<'SQL'
CREATE EXTENSION outbox;

CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	customer_id	bigint		NOT NULL,
	status		text		NOT NULL,
	amount		numeric(12,2) NOT NULL
);

-- Variant plpgsql: what an application would write without outbox.capture().
CREATE FUNCTION orders_emit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('orders', to_jsonb(NEW), NEW.id::text);
	RETURN NULL;
END
$$;
SQL

case $RELAY in
running) ;;
stopped)
	for _ in $(seq 50); do
		# only while it sleeps in its wait, so it holds no lock
		relay_pid=$(sql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = current_database() AND wait_event_type = 'Extension'")
		[ -n "$relay_pid" ] && break
		sleep 0.2
	done
	[ -n "$relay_pid" ] || { echo "no outbox relay process found" >&2; exit 1; }
	kill -STOP "$relay_pid"
	log "relay worker (pid $relay_pid) stopped with SIGSTOP for the measurements"
	;;
*) echo "RELAY must be running or stopped" >&2; exit 2 ;;
esac

# ---- pgbench scripts --------------------------------------------------------
# One script per style and row count; the variants differ only in the
# trigger on orders, so they run the same scripts.
sdir=$work/scripts
mkdir -p "$sdir"
for style in $STYLES; do
	for n in $ROWS; do
		{
			echo '\set cust random(1, 100000)'
			echo '\set cents random(100, 99999)'
			if [ "$style" = statement ]; then
				if [ "$n" = 1 ]; then
					echo "INSERT INTO orders (customer_id, status, amount) VALUES (:cust, 'created', :cents / 100.0);"
				else
					echo "INSERT INTO orders (customer_id, status, amount) SELECT :cust + g, 'created', (:cents + g) / 100.0 FROM generate_series(1, $n) g;"
				fi
			else
				echo 'BEGIN;'
				for ((i = 1; i <= n; i++)); do
					echo "INSERT INTO orders (customer_id, status, amount) VALUES (:cust + $i, 'created', (:cents + $i) / 100.0);"
				done
				echo 'COMMIT;'
			fi
		} >"$sdir/$style-$n.sql"
	done
done
chown -R "$PGUSER_OS" "$sdir"

# ---- one measured run --------------------------------------------------------
# The variant's set-up, on empty tables, after a checkpoint.
prepare() {	# variant
	sql -q -c "SET client_min_messages = warning" \
		-c "SELECT outbox.uncapture('orders') FROM outbox.captures WHERE table_name = 'orders'::regclass" \
		-c "DROP TRIGGER IF EXISTS orders_emit ON orders" \
		-c "TRUNCATE orders RESTART IDENTITY" -c "TRUNCATE outbox.messages" -c "CHECKPOINT" >/dev/null
	case $1 in
	none) ;;
	trigger) sql -q -c "SELECT outbox.capture('orders')" >/dev/null ;;
	debezium) sql -q -c "SELECT outbox.capture('orders', format => 'debezium', topic => 'public.orders')" >/dev/null ;;
	wal) sql -q -c "SELECT outbox.capture('orders', mode => 'wal')" >/dev/null ;;
	walpaused)
		# the application's commit path alone: the worker decodes after the run
		sql -q -c "SELECT outbox.capture('orders', mode => 'wal')" >/dev/null
		sql -q -c "ALTER SYSTEM SET outbox.test_fault = 'capture_pause'" -c "SELECT pg_reload_conf()" >/dev/null
		sleep 1
		;;
	plpgsql) sql -q -c "CREATE TRIGGER orders_emit AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION orders_emit()" ;;
	esac
}

# Wait (at most $1 s) until the WAL capture has handed off everything
# committed so far.
wal_caught_up() {
	local target i
	target=$(sql -c "SELECT pg_current_wal_lsn()")
	for ((i = 0; i < $1 * 10; i++)); do
		[ "$(sql -c "SELECT coalesce(decoded_lsn >= '$target', false) FROM outbox.capture_status()")" = t ] && return 0
		sleep 0.1
	done
	return 1
}

# Sanity after a run: N orders per committed transaction; for trigger and
# plpgsql one message per order, of the variant's topic and shape; ids
# distinct and gap-free; the frontier reached the end.
check_run() {	# variant style rows transactions
	local v=$1 style=$2 n=$3 nx=$4 out topic shape
	case $v in
	trigger) topic=public.orders shape="payload->>'op' = 'insert' AND payload->'after'->>'id' = key AND headers ? 'source-xid'" ;;
	debezium) topic=public.orders shape="payload->>'op' = 'c' AND payload->'after'->'id' = key::jsonb->'id' AND payload->'source'->>'table' = 'orders'" ;;
	wal | walpaused)
		if [ "$v" = walpaused ]; then
			sql -q -c "ALTER SYSTEM RESET outbox.test_fault" -c "SELECT pg_reload_conf()" >/dev/null
		fi
		topic=public.orders shape="payload->>'op' = 'insert' AND payload->'after'->>'id' = key AND headers ? 'source-lsn'"
		wal_caught_up 120 || echo "CHECK FAILED after wal $style rows=$n: the capture did not catch up in 120 s" | tee -a "$work/anomalies" >&2
		;;
	plpgsql) topic=orders shape="payload->>'id' = key AND headers IS NULL" ;;
	none) topic=- shape=false ;;
	esac
	out=$(sql -F' ' -c "
		SELECT (SELECT count(*) FROM orders),
		       (SELECT count(*) FROM outbox.messages),
		       (SELECT count(*) FROM outbox.messages WHERE topic = '$topic' AND $shape),
		       (SELECT count(DISTINCT id) FROM outbox.messages),
		       (SELECT coalesce(max(id) - min(id) + 1, 0) FROM outbox.messages),
		       (SELECT coalesce(max(id), 0) FROM outbox.messages),
		       outbox.frontier()")
	local orders msgs good dmsgs span maxid frontier want_msgs=0 bad=""
	read -r orders msgs good dmsgs span maxid frontier <<<"$out"
	[ "$v" = none ] || want_msgs=$((nx * n))
	[ "$orders" = $((nx * n)) ] || bad+=" orders=$orders!=$((nx * n)) (transactions $nx x rows $n)"
	[ "$msgs" = "$want_msgs" ] || bad+=" outbox.messages=$msgs!=$want_msgs"
	[ "$good" = "$want_msgs" ] || bad+=" only $good messages of topic $topic with the expected shape"
	[ "$dmsgs" = "$msgs" ] || bad+=" duplicate ids ($dmsgs distinct of $msgs)"
	[ "$span" = "$msgs" ] || bad+=" id gaps (span $span, rows $msgs)"
	if [ "$msgs" != 0 ] && [ "$frontier" -lt "$maxid" ]; then
		bad+=" frontier=$frontier<max(id)=$maxid with no writer"
	fi
	if [ -n "$bad" ]; then
		echo "CHECK FAILED after $v $style rows=$n:$bad" | tee -a "$work/anomalies" >&2
	fi
}

run_one() {	# variant style rows seconds -> prints tps, transactions, idle load
	local v=$1 style=$2 n=$3 secs=$4 out tps nx failed idle
	prepare "$v"
	# CPUs busy for 1 s before the run, while this benchmark is idle: what
	# other processes of the machine take (a shared machine skews runs).
	idle=$(machine_busy 1)
	out=$(as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
		PGOPTIONS="-c synchronous_commit=on" \
		"$BIN/pgbench" -n -c "$CLIENTS" -j "$THREADS" -T "$secs" -M "$PROTOCOL" \
		-f "$sdir/$style-$n.sql" "$DB" 2>&1) || {
		echo "pgbench failed for $v $style rows=$n:" >&2
		echo "$out" >&2
		echo "--- server log tail ---" >&2
		tail -30 "$SERVERLOG" >&2
		return 1
	}
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p')
	nx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
	failed=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
	if [ -z "$tps" ] || [ -z "$nx" ]; then
		echo "could not parse pgbench output for $v $style rows=$n:" >&2
		echo "$out" >&2
		return 1
	fi
	if [ -n "$failed" ] && [ "$failed" != 0 ]; then
		echo "pgbench reports $failed failed transactions for $v $style rows=$n" | tee -a "$work/anomalies" >&2
	fi
	check_run "$v" "$style" "$n" "$nx"
	echo "$tps $nx $idle"
}

# ---- warm-up, then the alternating rounds ------------------------------------
read -r -a vlist <<<"$VARIANTS"
read -r -a slist <<<"$STYLES"
read -r -a rlist <<<"$ROWS"
nv=${#vlist[@]}
nruns=$((ROUNDS * ${#slist[@]} * ${#rlist[@]} * nv))
log "plan: $ROUNDS rounds x ${#slist[@]} styles x ${#rlist[@]} row counts x $nv variants x ${DURATION}s, clients=$CLIENTS threads=$THREADS protocol=$PROTOCOL, synchronous_commit=on (~$(((nruns * (DURATION + 3) + nv * WARMUP) / 60)) min)"

if [ "$WARMUP" -gt 0 ]; then
	for v in "${vlist[@]}"; do
		run_one "$v" "${slist[0]}" "${rlist[0]}" "$WARMUP" >/dev/null
	done
	log "warm-up done"
fi

results=$work/results	# lines: style rows variant round tps transactions busy-before
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
	for style in "${slist[@]}"; do
		for n in "${rlist[@]}"; do
			# rotate the order each round so no variant always runs first
			for ((i = 0; i < nv; i++)); do
				v=${vlist[$(((i + r - 1) % nv))]}
				out=$(run_one "$v" "$style" "$n" "$DURATION")
				read -r tps nx idle <<<"$out"
				echo "$style $n $v $r $tps $nx $idle" >>"$results"
				record "{\"kind\": \"run\", \"style\": \"$style\", \"rows\": $n, \"variant\": \"$v\", \"round\": $r, \"tps\": $tps, \"transactions\": $nx, \"seconds\": $DURATION, \"clients\": $CLIENTS, \"busy_before\": $idle}"
				log "round $r $style rows=$n $v: $tps tps (other load before the run: $idle CPUs)"
			done
		done
	done
done

# ---- WAL capture: hand-off rate and commit-to-delivered latency ---------------
# Hand-off rate: with the capture worker standing still (outbox.test_fault =
# capture_pause), HANDOFF_ROWS rows are inserted in transactions of 10,000;
# then the worker resumes and the time until every change is handed off
# gives changes/s.  Latency: an HTTP target (nginx answering 204) receives
# the captured changes while pgbench inserts LATENCY_RATE rows/s, one per
# transaction; outbox.stats gives p50/p99 from the message's emitted_at,
# which for a WAL capture is the source commit time, to the receiver's
# answer: commit to delivered.
handoff_rate= lat_p50= lat_p99= lat_n=
if [[ " $VARIANTS " == *" wal "* ]]; then
	prepare wal
	sql -q -c "ALTER SYSTEM SET outbox.test_fault = 'capture_pause'" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 1
	log "WAL hand-off: inserting $HANDOFF_ROWS rows while the capture worker stands still"
	for ((done_rows = 0; done_rows < HANDOFF_ROWS; done_rows += 10000)); do
		echo "INSERT INTO orders (customer_id, status, amount) SELECT g, 'created', 1 FROM generate_series(1, 10000) g;"
	done | as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" "$BIN/psql" -X -q -d "$DB" >/dev/null
	t0=$(date +%s.%N)
	sql -q -c "ALTER SYSTEM RESET outbox.test_fault" -c "SELECT pg_reload_conf()" >/dev/null
	if wal_caught_up 600; then
		t1=$(date +%s.%N)
		got=$(sql -c "SELECT count(*) FROM outbox.messages WHERE topic = 'public.orders'")
		handoff_rate=$(awk -v n="$got" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", n / (b - a)}')
		[ "$got" = "$HANDOFF_ROWS" ] || echo "CHECK FAILED: $got of $HANDOFF_ROWS changes handed off" | tee -a "$work/anomalies" >&2
		log "WAL hand-off: $got changes in $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s: $handoff_rate changes/s"
	else
		echo "CHECK FAILED: the WAL capture did not catch up in 600 s" | tee -a "$work/anomalies" >&2
	fi

	prepare wal
	sql -q -c "SELECT outbox.create_http_target('sink', '$NGINX_URL', lanes => 8)" \
		-c "SELECT outbox.subscribe('sink', 'public.orders')" -c "SELECT outbox.reset_stats()" >/dev/null
	[ -n "$relay_pid" ] && kill -CONT "$relay_pid"
	echo "INSERT INTO orders (customer_id, status, amount) VALUES (1, 'created', 1);" >"$sdir/latency.sql"
	chown "$PGUSER_OS" "$sdir/latency.sql"
	log "WAL latency: $LATENCY_RATE changes/s for $LATENCY_SECONDS s to $NGINX_URL"
	as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" PGOPTIONS="-c synchronous_commit=on" \
		"$BIN/pgbench" -n -c 4 -j 2 -T "$LATENCY_SECONDS" -R "$LATENCY_RATE" -M "$PROTOCOL" \
		-f "$sdir/latency.sql" "$DB" >/dev/null 2>&1 || echo "pgbench failed for the latency run" >&2
	read -r lat_p50 lat_p99 lat_n <<<"$(sql -F' ' -c "SELECT round(p50_ms::numeric, 2), round(p99_ms::numeric, 2), window_messages FROM outbox.stats WHERE target = 'sink'")"
	log "WAL latency: p50 $lat_p50 ms, p99 $lat_p99 ms over the last $lat_n messages"
	[ -n "$relay_pid" ] && kill -STOP "$relay_pid"
	sql -q -c "SELECT outbox.drop_target('sink')" >/dev/null
fi

# ---- report -----------------------------------------------------------------
median() {	# values on stdin
	sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
tps_of() { awk -v s="$1" -v n="$2" -v v="$3" -v r="${4:-}" '$1==s && $2==n && $3==v && (r=="" || $4==r) {print $5}' "$results"; }
summary=$work/summary	# lines: style ratio rows of-medians per-round goal verdict
: >"$summary"

echo
echo "outbox capture benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "  built from $build_rev; loaded outbox.so md5 $(md5sum <"$work/outbox.so" | cut -c1-12)"
echo "  PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), $(nproc) cores; synchronous_commit = on; relay worker $RELAY (no target)"
echo "  pgbench -n -c $CLIENTS -j $THREADS -T $DURATION -M $PROTOCOL; $ROUNDS rounds, variants alternating (order rotating)"
echo "  none: no capture; trigger: outbox.capture('orders'); wal: outbox.capture('orders', mode => 'wal'); plpgsql: AFTER INSERT row trigger PERFORM outbox_emit('orders', to_jsonb(NEW), NEW.id::text)"
for style in "${slist[@]}"; do
	echo
	case $style in
	statement) echo "STYLE=statement: one autocommit INSERT of N rows per transaction" ;;
	xact) echo "STYLE=xact: BEGIN; N one-row INSERTs; COMMIT" ;;
	esac
	printf '  %4s  %-8s %10s %11s   %s\n' rows variant "median TPS" "rows/s" "TPS per round"
	declare -A med=()
	for n in "${rlist[@]}"; do
		for v in "${vlist[@]}"; do
			med[$n.$v]=$(tps_of "$style" "$n" "$v" | median)
			printf '  %4s  %-8s %10.1f %11.0f   %s\n' "$n" "$v" "${med[$n.$v]:-0}" \
				"$(awk -v t="${med[$n.$v]:-0}" -v n="$n" 'BEGIN {print t * n}')" \
				"$(tps_of "$style" "$n" "$v" | awk '{printf "%.0f ", $1}')"
		done
	done
	echo
	printf '  %-16s %5s %11s %10s   %s\n' ratio rows "of medians" "per-round" goal
	ratio() {	# numerator denominator rows goal-or-empty
		local a=$1 b=$2 n=$3 g=$4 nm=${med[$3.$1]:-} dm=${med[$3.$2]:-} r per=""
		[ -n "$nm" ] && [ -n "$dm" ] || return 0
		for ((r = 1; r <= ROUNDS; r++)); do
			local rn rd
			rn=$(tps_of "$style" "$n" "$a" "$r") rd=$(tps_of "$style" "$n" "$b" "$r")
			[ -n "$rn" ] && [ -n "$rd" ] && per+="$(awk -v x="$rn" -v y="$rd" 'BEGIN {print x / y}') "
		done
		per=$(echo "$per" | tr ' ' '\n' | grep . | median)
		awk -v x="$nm" -v y="$dm" -v per="$per" -v g="$g" -v l="$a/$b" -v n="$n" -v style="$style" -v sf="$summary" 'BEGIN {
			r = x / y
			if (g == "") {
				printf "  %-16s %5s %11.3f %10.3f\n", l, n, r, per
				exit
			}
			verdict = (r >= g && per >= g) ? "met" : (r >= g || per >= g) ? "borderline" : "MISSED"
			printf "  %-16s %5s %11.3f %10.3f   >= %.2f  %s\n", l, n, r, per, g, verdict
			printf "%s %s %s %.3f %.3f %.2f %s\n", style, l, n, r, per, g, verdict >> sf }'
	}
	for n in "${rlist[@]}"; do
		if [ "$n" = 1 ]; then g=0.90; else g=0.80; fi
		ratio trigger none "$n" "$g"
	done
	for n in "${rlist[@]}"; do
		ratio trigger plpgsql "$n" 1.30
	done
	for n in "${rlist[@]}"; do
		ratio debezium trigger "$n" 0.95
	done
	for n in "${rlist[@]}"; do
		ratio wal none "$n" 0.95
	done
	for n in "${rlist[@]}"; do
		ratio walpaused none "$n" 0.95
	done
	for n in "${rlist[@]}"; do
		ratio plpgsql none "$n" ""
	done
	unset med
done

echo
echo
echo "WAL capture: hand-off rate ${handoff_rate:-?} changes/s (goal >= 100000; $HANDOFF_ROWS changes in transactions of 10,000, decoded after the fact)"
echo "WAL capture: commit to delivered at $LATENCY_RATE changes/s to an HTTP receiver: p50 ${lat_p50:-?} ms, p99 ${lat_p99:-?} ms (goals <= 5 ms, <= 20 ms; outbox.stats over ${lat_n:-?} messages)"
echo
echo "summary (goals: trigger/none >= 0.90 at 1 row, >= 0.80 at more; trigger/plpgsql >= 1.30; debezium/trigger >= 0.95; wal/none >= 0.95):"
awk '{
	printf "  %-9s %-16s %3s row%s  %.3f (per-round %.3f)  %s\n", $1, $2, $3, ($3 == 1 ? " " : "s"), $4, $5, $7 }' "$summary"
awk -v lim=0.25 '$7 > lim {n++; if ($7 > m) m = $7} END {
	if (n) printf "machine: %d of %d runs started with more than %.2f CPUs busy elsewhere (at most %.2f): the machine was shared, trust the per-round ratios more\n", n, NR, lim, m
	else printf "machine: quiet before every run (at most %.2f CPUs busy elsewhere)\n", m }' "$results"
if [ -s "$work/anomalies" ]; then
	echo "ANOMALIES:"
	sed 's/^/  /' "$work/anomalies"
else
	echo "sanity: after every run, N orders per committed transaction, exactly one message per order of the variant's topic and shape (none without capture), ids distinct and gap-free, frontier = max(id)"
fi
if grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
	echo "SERVER LOG shows a crash:"
	grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
fi
nerr=$(grep -c 'ERROR' "$SERVERLOG" || true)
echo "server log: $nerr ERROR lines"
if [ "$nerr" -gt 0 ]; then
	grep 'ERROR' "$SERVERLOG" | sed 's/^.*ERROR/ERROR/' | sort | uniq -c | sort -rn | head -10
fi

# ---- chart --------------------------------------------------------------------
# Median TPS per row count (one panel per style), a bar per variant, drawn
# with bench_charts.py's helpers; into $work/out, which OUT=DIR receives.
# A chart that fails is reported and does not fail the run.
note="built from $build_rev; PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
if chart=$(BENCH_HERE=$here "$PY" - "$RESULTS" "$work/out" "$VARIANTS" "$note" <<'PYEOF'
import json, os, sys
sys.path.insert(0, os.environ["BENCH_HERE"])
import bench_charts as bc

results, outdir, variants, note = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
runs = [r for r in (json.loads(line) for line in open(results) if line.strip()) if r.get("kind") == "run"]
titles = {"none": ("ceiling", "no capture"),
          "trigger": ("outbox", "outbox.capture('orders') (C trigger)"),
          "debezium": ("alt", "format => 'debezium' (C trigger)"),
          "plpgsql": ("hand", "PL/pgSQL trigger calling outbox_emit()"),
          "wal": ("pgq", "outbox.capture('orders', mode => 'wal')"),
          "walpaused": ("commit", "mode => 'wal', capture worker standing still")}
series = [(v, titles[v][1], bc.COLOR[titles[v][0]]) for v in variants]
styles = [s for s in ("statement", "xact") if any(r["style"] == s for r in runs)]
shape = {"statement": "one INSERT of N rows per transaction", "xact": "BEGIN; N one-row INSERTs; COMMIT"}
name = "capture-tps"
panels, dats = [], []
for s in styles:
    rows = sorted({r["rows"] for r in runs if r["style"] == s})
    values, labels = [], []
    for n in rows:
        row, lrow = [], []
        base = None
        for v in variants:
            tps = [r["tps"] for r in runs if r["style"] == s and r["rows"] == n and r["variant"] == v]
            m = bc.med(tps) if tps else None
            if v == "none":
                base = m
            row.append(m)
        for v, m in zip(variants, row):
            if m is None:
                lrow.append("")
            elif v != "none" and base:
                lrow.append(f"{bc.fmt_k(m)}\n{m / base:.2f} x")
            else:
                lrow.append(bc.fmt_k(m))
        values.append(row)
        labels.append(lrow)
    groups = [f"{n} row" + ("s" if n > 1 else "") + " per transaction" for n in rows]
    cmd, dat = bc.clustered(groups, series, values, labels, title=shape[s],
                            ylabel="transactions/s (median over the rounds)", yfmt="%.0s%c")
    # two-line labels (TPS, ratio) stand higher than clustered()'s one-line ones
    panels.append(cmd.replace("offset 0,0.7", "offset 0,1.3"))
    dats.append(f"# style {s}\n" + dat)
if not panels:
    sys.exit(1)
bc.write(os.path.join(outdir, name + ".dat"),
         "# capture_bench.sh: pgbench TPS, medians over the rounds, synchronous_commit = on;\n"
         "# one data block per style (gnuplot index 0, 1, ...); labels: TPS and the ratio to no capture\n"
         + "\n\n".join(dats))
nrounds = max(r["round"] for r in runs)
title = ("Change capture: write throughput with outbox.capture() against no capture and a PL/pgSQL trigger\n"
         f"pgbench, {runs[0]['clients']} clients, {runs[0]['seconds']} s runs, medians of {nrounds} round{'s' if nrounds > 1 else ''}; {note}")
panels = [p.replace("{panel}", f"{bc.q(name + '.dat')} index {i}") for i, p in enumerate(panels)]
bc.write(os.path.join(outdir, name + ".gp"), bc.figure(name, max(640, 560 * len(panels)), 600, title, panels))
svg = bc.run_gnuplot(outdir, name)
if not svg:
    sys.exit(1)
print(svg)
PYEOF
); then
	log "chart: $(echo "$chart" | sed "s|^$work/out/|${OUT:-$work/out}/|")"
else
	log "chart: not made (see above)"
fi
[ -n "$OUT" ] || [ "$KEEP" = 1 ] || log "chart: removed with $work on exit; OUT=DIR keeps it"

# A run that misbehaved fails, whatever the figures.
if [ -s "$work/anomalies" ] || grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
	exit 1
fi
