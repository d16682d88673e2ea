#!/usr/bin/env bash
# emit_bench.sh - write-path cost of outbox_emit() against a hand-rolled
# outbox table, measured with pgbench on a throwaway cluster.
#
# Run by hand, as root (not in CI):
#
#   test/bench/emit_bench.sh                    # ~12 minutes on 2 cores
#   ROUNDS=7 DURATION=15 test/bench/emit_bench.sh
#   PERF=1 test/bench/emit_bench.sh             # then profile each variant
#   STYLE=cte test/bench/emit_bench.sh          # one statement per transaction
#
# Variants, each one transaction, same order INSERT everywhere (STYLE=xact,
# the default: BEGIN; INSERT order RETURNING id; [outbox statement;] COMMIT;
# STYLE=cte: one autocommit statement, WITH o AS (INSERT ... RETURNING id)
# followed by the outbox INSERT or SELECT, so no extra round trip):
#   a    INSERT INTO orders                                  (no outbox)
#   b    a + INSERT INTO hand_outbox (bigserial, pending partial index)
#   c    a + SELECT outbox_emit(...)
#   b10  a + INSERT INTO hand_outbox ... FROM generate_series(1,10)
#   c10  a + SELECT outbox_emit(...) FROM generate_series(1,10)
#
# All variants run in the same invocation, alternating over ROUNDS rounds
# (the order rotates every round), under synchronous_commit on and off; the
# median TPS of each is reported with the ratios that matter: the ratio of
# the medians and the median of the per-round ratios (the runs of one round
# are close in time, so the latter resists slow drift on a shared machine).
# Before every run the tables are truncated and a CHECKPOINT taken, so table
# growth and checkpoints do not favour whichever variant runs first.  After
# every run the rows are checked (one order per committed transaction, the
# expected outbox rows, distinct gap-free ids, frontier = max(id)).
#
# Settings (environment):
#   ROUNDS=5 DURATION=10 CLIENTS=8 THREADS=2 PROTOCOL=prepared WARMUP=5
#   STYLE=xact              or cte (see above)
#   MODES="on off"          synchronous_commit values to measure
#   VARIANTS="a b c b10 c10"
#   PORT=54329              non-default port, unix socket only
#   PERF=0                  1: after the measurements, perf-record (DWARF
#                           call graphs, this cluster's processes) while each of
#                           PERF_VARIANTS="a b c b10 c10" runs with
#                           synchronous_commit=off; print backend CPU per
#                           transaction, where it goes, and outbox.so's share
#   RELAY=running           stopped: SIGSTOP the outbox relay worker for the
#                           measurements, to separate the emit/commit path
#                           from the cost of waking the relay at each commit
#   KEEP=0                  1: keep the cluster directory (for debugging)
#   REV=                    build this git revision instead of the working tree
#   OUT=DIR                 copy the raw results and the server log there
#   WAIT_FOR=relay_bench.sh wait while a process whose command line matches runs
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10}
STYLE=${STYLE:-xact}
PERF_VARIANTS=${PERF_VARIANTS:-"a b c b10 c10"}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
PROTOCOL=${PROTOCOL:-prepared}
WARMUP=${WARMUP:-5}
MODES=${MODES:-"on off"}
VARIANTS=${VARIANTS:-"a b c b10 c10"}
PORT=${PORT:-54329}
PERF=${PERF:-0}
KEEP=${KEEP:-0}
RELAY=${RELAY:-running}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

# The shared set-up (test/bench/common.sh): packages, a build of the working
# tree (or REV) installed privately for this server, the cluster.
REV=${REV:-}
if [ -n "$REV" ]; then INSTALL=${INSTALL:-0}; else INSTALL=${INSTALL:-1}; fi
OUT=${OUT:-}
WAIT_FOR=${WAIT_FOR-relay_bench.sh}
NGINX_PORT=
BENCH_NAME=emit-bench
BENCH_PACKAGES=()
if [ "$PERF" = 1 ]; then BENCH_PACKAGES+=(linux-perf); fi
# Unix socket only; tables are truncated before each run, so keep vacuum,
# analyze and checkpoints out of the runs.
BENCH_CONF="listen_addresses = ''
checkpoint_timeout = 1h
autovacuum = off
log_checkpoints = off"
relay_pid=
bench_on_exit() {
	[ -n "$relay_pid" ] && kill -CONT "$relay_pid" 2>/dev/null
	return 0
}
. "$here/common.sh"
bench_setup
pmpid=$(head -1 "$PGDATA/postmaster.pid")

psqlq -d postgres -c "CREATE DATABASE $DB"
psqlq -d "$DB" <<'SQL'
CREATE EXTENSION outbox;

CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	customer_id	bigint		NOT NULL,
	status		text		NOT NULL,
	amount		numeric(12,2) NOT NULL,
	currency	text		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT now(),
	note		text
);

CREATE TABLE hand_outbox (
	id			bigserial PRIMARY KEY,
	topic		text,
	key			text,
	payload		jsonb,
	created_at	timestamptz DEFAULT now(),
	processed_at timestamptz
);
-- the "pending index" a relay polls
CREATE INDEX hand_outbox_pending ON hand_outbox (id) WHERE processed_at IS NULL;
SQL

case $RELAY in
running) ;;
stopped)
	for _ in $(seq 50); do
		# only while it sleeps in its wait, so it holds no lock
		relay_pid=$(psqlq -d "$DB" -At -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = current_database() AND wait_event_type = 'Extension'")
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
# The order row is ~200 bytes; every message payload is the same ~200-byte
# jsonb, built the same way for b and c, and b and c send the same number of
# statements.
sdir=$work/scripts
mkdir -p "$sdir"

order_values="(customer_id, status, amount, currency, note) VALUES (:cust::bigint, 'created', :cents::int / 100.0, 'EUR', repeat('n', 120))"
payload_expr() {	# $1: the order id, $2: the line number
	echo "jsonb_build_object('order_id', $1, 'customer_id', :cust::bigint, 'status', 'created', 'amount', :cents::int / 100.0, 'currency', 'EUR', 'line', $2, 'sku', 'SKU-' || lpad(($2)::text, 8, '0'), 'note', repeat('p', 60))"
}
hand_insert() {	# $1: order id, $2: line, $3: FROM clause or ""
	echo "INSERT INTO hand_outbox (topic, key, payload) SELECT 'orders.created', ($1)::text, $(payload_expr "$1" "$2") $3"
}
emit_select() {	# $1: order id, $2: line, $3: FROM clause or ""
	echo "SELECT outbox_emit('orders.created', $(payload_expr "$1" "$2"), ($1)::text) $3"
}

write_script() {	# name, outbox statement for STYLE=xact, for STYLE=cte
	{
		echo '\set cust random(1, 100000)'
		echo '\set cents random(100, 99999)'
		if [ "$STYLE" = cte ]; then
			echo "$3;"
		else
			echo "BEGIN;"
			echo "INSERT INTO orders $order_values RETURNING id AS oid \\gset"
			[ -n "$2" ] && echo "$2;"
			echo "COMMIT;"
		fi
	} >"$sdir/$1.sql"
}
with_order="WITH o AS (INSERT INTO orders $order_values RETURNING id)"
case $STYLE in xact | cte) ;; *) echo "STYLE must be xact or cte" >&2; exit 2 ;; esac
write_script a "" \
	"INSERT INTO orders $order_values RETURNING id"
write_script b "$(hand_insert :oid::bigint 1 "")" \
	"$with_order $(hand_insert o.id 1 "FROM o")"
write_script c "$(emit_select :oid::bigint 1 "")" \
	"$with_order $(emit_select o.id 1 "FROM o")"
write_script b10 "$(hand_insert :oid::bigint g "FROM generate_series(1, 10) g")" \
	"$with_order $(hand_insert o.id g "FROM o, generate_series(1, 10) g")"
write_script c10 "$(emit_select :oid::bigint g "FROM generate_series(1, 10) g")" \
	"$with_order $(emit_select o.id g "FROM o, generate_series(1, 10) g")"
chown -R "$PGUSER_OS" "$sdir"

msgs_per_xact() { case $1 in b | c) echo 1 ;; b10 | c10) echo 10 ;; *) echo 0 ;; esac; }

# Sizes, for the record.
psqlq -d "$DB" -At -F' ' <<SQL >"$work/sizes"
BEGIN;
\set cust 42
\set cents 12345
\set oid 1
SELECT 'payload_bytes', pg_column_size($(payload_expr :oid::bigint 1));
SELECT 'order_row_bytes', pg_column_size(r) FROM (SELECT 1::bigint, 42::bigint, 'created'::text, 123.45::numeric(12,2), 'EUR'::text, now(), repeat('n', 120)) r;
ROLLBACK;
SQL

# ---- one measured run --------------------------------------------------------
reset_tables() {
	psqlq -d "$DB" -c "TRUNCATE orders, hand_outbox RESTART IDENTITY" \
		-c "TRUNCATE outbox.messages" -c "CHECKPOINT"
}

# Sanity after a run: every committed transaction left exactly one order and
# its messages; outbox ids are distinct; and the frontier reached the end.
check_run() {	# variant, mode, transactions
	local v=$1 mode=$2 nx=$3 k out
	k=$(msgs_per_xact "$v")
	out=$(psqlq -d "$DB" -At -F' ' -c "
		SELECT (SELECT count(*) FROM orders),
		       (SELECT count(*) FROM hand_outbox),
		       (SELECT count(*) FROM outbox.messages),
		       (SELECT count(DISTINCT id) FROM outbox.messages),
		       (SELECT coalesce(max(id) - min(id) + 1, 0) FROM outbox.messages),
		       (SELECT coalesce(max(id), 0) FROM outbox.messages)" \
		-c "SELECT outbox.frontier()")
	local orders hand msgs dmsgs span maxid frontier
	read -r orders hand msgs dmsgs span maxid <<<"$(echo "$out" | head -1)"
	frontier=$(echo "$out" | tail -1)
	local want_hand=0 want_msgs=0
	case $v in b | b10) want_hand=$((nx * k)) ;; c | c10) want_msgs=$((nx * k)) ;; esac
	local bad=""
	[ "$orders" = "$nx" ] || bad+=" orders=$orders!=xacts=$nx"
	[ "$hand" = "$want_hand" ] || bad+=" hand_outbox=$hand!=$want_hand"
	[ "$msgs" = "$want_msgs" ] || bad+=" outbox.messages=$msgs!=$want_msgs"
	[ "$dmsgs" = "$msgs" ] || bad+=" duplicate ids ($dmsgs distinct of $msgs)"
	[ "$span" = "$msgs" ] || bad+=" id gaps (span $span, rows $msgs)"
	if [ "$msgs" != 0 ] && [ "$frontier" -lt "$maxid" ]; then
		bad+=" frontier=$frontier<max(id)=$maxid with no writer"
	fi
	if [ -n "$bad" ]; then
		echo "CHECK FAILED after $v sync=$mode:$bad" | tee -a "$work/anomalies" >&2
	fi
}

run_one() {	# variant, mode, seconds -> prints tps
	local v=$1 mode=$2 secs=$3 out tps nx failed
	reset_tables
	out=$(as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
		PGOPTIONS="-c synchronous_commit=$mode" \
		"$BIN/pgbench" -n -c "$CLIENTS" -j "$THREADS" -T "$secs" -M "$PROTOCOL" \
		-f "$sdir/$v.sql" "$DB" 2>&1) || {
		echo "pgbench failed for $v sync=$mode:" >&2
		echo "$out" >&2
		echo "--- server log tail ---" >&2
		tail -30 "$SERVERLOG" >&2
		return 1
	}
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) (without initial connection time)$/\1/p')
	nx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
	failed=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
	if [ -z "$tps" ] || [ -z "$nx" ]; then
		echo "could not parse pgbench output for $v:" >&2
		echo "$out" >&2
		return 1
	fi
	if [ -n "$failed" ] && [ "$failed" != 0 ]; then
		echo "pgbench reports $failed failed transactions for $v sync=$mode" | tee -a "$work/anomalies" >&2
	fi
	check_run "$v" "$mode" "$nx"
	echo "$tps"
}

# ---- warm-up, then the alternating rounds ------------------------------------
read -r -a vlist <<<"$VARIANTS"
read -r -a mlist <<<"$MODES"
nv=${#vlist[@]}
total=$((ROUNDS * nv * ${#mlist[@]} * DURATION + nv * WARMUP))
log "plan: $ROUNDS rounds x ${#mlist[@]} modes x $nv variants x ${DURATION}s, clients=$CLIENTS threads=$THREADS protocol=$PROTOCOL (~$((total / 60)) min of load plus checkpoints)"

if [ "$WARMUP" -gt 0 ]; then
	for v in "${vlist[@]}"; do
		run_one "$v" on "$WARMUP" >/dev/null
	done
	log "warm-up done"
fi

results=$work/results	# lines: mode variant round tps
: >"$results"
for ((r = 1; r <= ROUNDS; r++)); do
	for mode in "${mlist[@]}"; do
		# rotate the order each round so no variant always runs first
		for ((i = 0; i < nv; i++)); do
			v=${vlist[$(((i + r - 1) % nv))]}
			tps=$(run_one "$v" "$mode" "$DURATION")
			echo "$mode $v $r $tps" >>"$results"
			log "round $r sync=$mode $v: $tps tps"
		done
	done
done

# ---- report -----------------------------------------------------------------
median() {	# values on stdin
	sort -g | awk '{a[NR]=$1} END {if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}
tps_of() { awk -v m="$1" -v v="$2" -v r="${3:-}" '$1==m && $2==v && (r=="" || $3==r) {print $4}' "$results"; }

echo
echo "outbox emit benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "  built from $build_rev; loaded outbox.so md5 $(md5sum <"$work/outbox.so" | cut -c1-12)"
echo "  PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), $(nproc) cores; STYLE=$STYLE; relay worker $RELAY; pgbench -n -c $CLIENTS -j $THREADS -T $DURATION -M $PROTOCOL; $ROUNDS rounds, variants alternating"
echo "  $(tr '\n' ' ' <"$work/sizes" | sed 's/ \([a-z]\)/, \1/g')"
for mode in "${mlist[@]}"; do
	declare -A med=()
	echo
	echo "synchronous_commit = $mode"
	printf '  %-7s %10s   %s\n' variant "median TPS" "TPS per round"
	for v in "${vlist[@]}"; do
		med[$v]=$(tps_of "$mode" "$v" | median)
		printf '  %-7s %10.1f   %s\n' "$v" "${med[$v]:-0}" \
			"$(tps_of "$mode" "$v" | awk '{printf "%.0f ", $1}')"
	done
	echo
	printf '  %-8s %9s %11s   %s\n' ratio "of medians" "per-round" "goal"
	ratio() {	# numerator denominator goal-or-empty
		local n=${med[$1]:-} d=${med[$2]:-} r per=""
		[ -n "$n" ] && [ -n "$d" ] || return 0
		for ((r = 1; r <= ROUNDS; r++)); do
			local rn rd
			rn=$(tps_of "$mode" "$1" "$r") rd=$(tps_of "$mode" "$2" "$r")
			[ -n "$rn" ] && [ -n "$rd" ] && per+="$(awk -v a="$rn" -v b="$rd" 'BEGIN {print a / b}') "
		done
		per=$(echo "$per" | tr ' ' '\n' | grep . | median)
		awk -v n="$n" -v d="$d" -v per="$per" -v g="$3" -v l="$1/$2" 'BEGIN {
			r = n / d
			line = sprintf("  %-8s %9.3f %11.3f", l, r, per)
			if (g != "")
				line = line sprintf("   >= %.2f  %s", g, (r >= g && per >= g) ? "met" : (r >= g || per >= g) ? "borderline" : "MISSED")
			print line }'
	}
	ratio b a ""
	ratio c a 0.85
	ratio c b 1.10
	ratio c10 b10 1.30
	ratio b10 a ""
	ratio c10 a ""
	unset med
done

echo
if [ -s "$work/anomalies" ]; then
	echo "ANOMALIES:"
	sed 's/^/  /' "$work/anomalies"
else
	echo "sanity: after every run, one order per committed transaction, exactly the expected outbox rows, ids distinct and gap-free, frontier = max(id)"
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

# ---- optional profile ---------------------------------------------------------
# perf report runs in a private mount namespace where the library directory
# is the server's own (see test/bench/common.sh).
if [ "$PERF" = 1 ]; then
	set +o pipefail		# head closes pipes early
	libview=$work/pkglib
	preport() {
		unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf report "$@"' \
			sh "$libview" "$pkglibdir" --no-inline "$@" 2>/dev/null
	}
	# perf report --sort dso,sym lines -> "children self dso function", one
	# line per function.  outbox.so addresses that perf left unresolved are
	# mapped with nm on the copy of the library the server loaded.
	nm -n --defined-only "$work/outbox.so" 2>/dev/null | awk 'tolower($2) == "t"' >"$work/outbox.syms"
	resolve_outbox() {
		awk -v syms="$work/outbox.syms" '
			function hex(h,   i, v) {
				sub(/^0x/, "", h); h = tolower(h); v = 0
				for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
				return v }
			BEGIN { n = 0; while ((getline l < syms) > 0) { split(l, f, " "); addr[n] = hex(f[1]); name[n++] = f[3] } }
			function lookup(a,   lo, hi, mid) {
				lo = 0; hi = n - 1; if (n == 0 || a < addr[0]) return sprintf("0x%x", a)
				while (lo < hi) { mid = int((lo + hi + 1) / 2); if (addr[mid] <= a) lo = mid; else hi = mid - 1 }
				return name[lo] }
			/^ +[0-9.]+%/ {
				m = 0; for (i = 3; i <= NF; i++) if ($i == "[.]" || $i == "[k]") { m = i; break }
				if (!m) next
				dso = $3; for (i = 4; i < m; i++) dso = dso "_" $i
				sym = $(m + 1)
				if (dso ~ /^outbox\.so/ && sym ~ /^0x/) sym = lookup(hex(sym))
				k = dso " " sym; c[k] += $1; s[k] += $2 }
			END { for (k in c) printf "%6.2f%% %6.2f%%  %s\n", c[k], s[k], k }' | sort -rn
	}
	for v in $PERF_VARIANTS; do
		secs=$((DURATION > 8 ? DURATION - 4 : 4))
		echo
		echo "==== perf: $v, synchronous_commit=off, ${secs}s of a $((secs + 4))s run, server processes, DWARF call graphs"
		reset_tables
		as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
			PGOPTIONS="-c synchronous_commit=off" \
			"$BIN/pgbench" -n -c "$CLIENTS" -j "$THREADS" -T $((secs + 4)) -M "$PROTOCOL" \
			-f "$sdir/$v.sql" "$DB" >"$work/perf-$v.pgbench" 2>&1 &
		bench_pid=$!
		sleep 2
		# this cluster's processes only: the backends and the auxiliaries
		pids=$(pgrep -P "$pmpid" | paste -sd, -)
		perf record -q -F 499 -p "$pids" --call-graph dwarf,8192 -o "$work/perf-$v.data" -- sleep "$secs" >/dev/null 2>&1
		wait "$bench_pid" || true
		tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$work/perf-$v.pgbench")
		nsamp=$(perf script -i "$work/perf-$v.data" -F pid 2>/dev/null | wc -l)
		# one sample per 1/499 s of CPU of a recorded process
		awk -v t="$tps" -v n="$nsamp" -v s="$secs" 'BEGIN {
			printf "  %.0f tps; server processes used %.2f CPUs = %.1f us CPU per transaction (%d samples)\n",
				t, n / 499 / s, (n / 499) / (t * s) * 1e6, n }'
		echo "  percentages below are of the server processes' samples"
		echo "  self time by shared object:"
		preport -i "$work/perf-$v.data" --no-children --sort dso --stdio -g none \
			| grep -E '^ +[0-9]' | head -6 | sed 's/^/    /'
		echo "  selected functions: inclusive (with callees) and self time:"
		preport -i "$work/perf-$v.data" --children --sort dso,sym --stdio -g none \
			| resolve_outbox >"$work/perf-$v.children"
		grep -E ' (PostgresMain|secure_read|secure_write|PortalRun|PortalStart|standard_ExecutorStart|standard_ExecutorRun|standard_ExecutorEnd|CommitTransactionCommand|heap_insert|heap_multi_insert|RelationGetBufferForTuple|ExecInsertIndexTuples|btinsert|nextval_internal|XLogInsert|jsonb_build_object|hash_search_with_hash_value|LWLockAcquire|__GI___kill|table_open|ExecOpenIndices|GetCurrentTimestamp|outbox_[a-z_.0-9]+)$' \
			"$work/perf-$v.children" | head -40 | sed 's/^/    /'
		echo "  outbox.so, self time by function:"
		awk '$3 ~ /^outbox\.so/ && $2 + 0 > 0 {printf "%7s  %s\n", $2, $4}' "$work/perf-$v.children" \
			| sort -rn | head -12 | sed 's/^/    /'
		echo "  top self-time symbols:"
		preport -i "$work/perf-$v.data" --no-children --sort dso,sym --stdio -g none \
			| grep -E '^ +[0-9]' | head -20 | sed 's/^/    /'
	done
	set -o pipefail
fi

# A run that misbehaved fails, whatever the figures.
if [ -s "$work/anomalies" ] || grep -Eq 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG"; then
	exit 1
fi
