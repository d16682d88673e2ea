#!/usr/bin/env bash
# emit_bench.sh - write-path cost of outbox_emit() against a hand-rolled
# outbox table, measured with pgbench on a throwaway cluster.
#
# Run by hand, as root (not in CI):
#
#   test/bench/emit_bench.sh                    # ~12 minutes on 2 cores
#   ROUNDS=5 DURATION=20 test/bench/emit_bench.sh
#   PERF=1 test/bench/emit_bench.sh             # also profile (c) with perf
#
# Variants, each one transaction, same order INSERT everywhere:
#   a    INSERT INTO orders                                  (no outbox)
#   b    a + INSERT INTO hand_outbox (bigserial, pending partial index)
#   c    a + SELECT outbox_emit(...)
#   b10  a + INSERT INTO hand_outbox ... FROM generate_series(1,10)
#   c10  a + SELECT outbox_emit(...) FROM generate_series(1,10)
#
# All variants run in the same invocation, alternating over ROUNDS rounds
# (the order rotates every round), under synchronous_commit on and off; the
# median TPS of each is reported with the ratios that matter.  Before every
# run the tables are truncated and a CHECKPOINT taken, so table growth and
# checkpoints do not favour whichever variant runs first.
#
# Settings (environment):
#   ROUNDS=3 DURATION=15 CLIENTS=8 THREADS=2 PROTOCOL=prepared WARMUP=5
#   MODES="on off"          synchronous_commit values to measure
#   VARIANTS="a b c b10 c10"
#   PORT=54329              non-default port, unix socket only
#   PERF=0                  1: after the measurements, perf-record the
#                           backends while c and c10 run; print the
#                           outbox.so symbols and the top of the profile
#   KEEP=0                  1: keep the cluster directory (for debugging)
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15}
CLIENTS=${CLIENTS:-8}
THREADS=${THREADS:-2}
PROTOCOL=${PROTOCOL:-prepared}
WARMUP=${WARMUP:-5}
MODES=${MODES:-"on off"}
VARIANTS=${VARIANTS:-"a b c b10 c10"}
PORT=${PORT:-54329}
PERF=${PERF:-0}
KEEP=${KEEP:-0}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=bench

repo=$(cd "$(dirname "$0")/../.." && pwd)

if [ "$(id -u)" -ne 0 ]; then
	echo "run as root (the cluster itself runs as '$PGUSER_OS')" >&2
	exit 1
fi

log() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# ---- packages ---------------------------------------------------------------
need=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql-15)
[ -x /usr/lib/postgresql/15/bin/pgbench ] || need+=(postgresql-contrib)
[ -e /usr/lib/postgresql/15/lib/pgxs/src/makefiles/pgxs.mk ] || need+=(postgresql-server-dev-15)
command -v make >/dev/null || need+=(make)
command -v gcc >/dev/null || need+=(gcc)
command -v curl-config >/dev/null || need+=(libcurl4-openssl-dev)
if [ "$PERF" = 1 ] && ! command -v perf >/dev/null; then need+=(linux-perf); fi
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The Debian package starts its own cluster on 5432; we do not use it.

BIN=/usr/lib/postgresql/15/bin
PG_CONFIG=$BIN/pg_config
[ -x "$PG_CONFIG" ] || PG_CONFIG=$(command -v pg_config)
id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --create-home --shell /bin/bash "$PGUSER_OS"

# ---- build and install the extension ---------------------------------------
log "building and installing outbox from $repo"
make -s -C "$repo" PG_CONFIG="$PG_CONFIG" install >/dev/null

# ---- throwaway cluster ------------------------------------------------------
work=$(mktemp -d /var/tmp/outbox-bench.XXXXXX)
chown "$PGUSER_OS" "$work"
chmod 700 "$work"
PGDATA=$work/data
SOCK=$work
SERVERLOG=$work/server.log
perf_pid=

as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }

cleanup() {
	local rc=$?
	[ -n "$perf_pid" ] && kill "$perf_pid" 2>/dev/null || true
	if [ -f "$PGDATA/postmaster.pid" ]; then
		as_pg "$BIN/pg_ctl" -D "$PGDATA" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	if [ "$KEEP" = 1 ]; then
		echo "cluster kept in $work" >&2
	else
		rm -rf "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "initdb in $PGDATA"
as_pg "$BIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null \
	|| as_pg "$BIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --no-locale >/dev/null

cat >>"$PGDATA/postgresql.conf" <<EOF

# ---- emit_bench.sh ----
listen_addresses = ''
unix_socket_directories = '$SOCK'
port = $PORT
max_connections = 40
shared_preload_libraries = 'outbox'
outbox.database = '$DB'

# sized for a 2-core, 24 GB machine
shared_buffers = 256MB
wal_buffers = 16MB
max_wal_size = 4GB
min_wal_size = 1GB
checkpoint_timeout = 1h
checkpoint_completion_target = 0.9
# tables are truncated before each run; keep vacuum/analyze out of the runs
autovacuum = off
jit = off
synchronous_commit = on
fsync = on

logging_collector = off
log_min_messages = warning
log_checkpoints = off
EOF

log "starting server on port $PORT (unix socket $SOCK)"
as_pg "$BIN/pg_ctl" -D "$PGDATA" -l "$SERVERLOG" -w -t 60 start >/dev/null

export PGHOST=$SOCK PGPORT=$PORT PGUSER=postgres
psqlq() { as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
	"$BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

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

# ---- pgbench scripts --------------------------------------------------------
# The order row is ~200 bytes; every message payload is the same ~200-byte
# jsonb, built the same way for b and c.  Every variant is one explicit
# transaction; b and c send the same number of statements.
sdir=$work/scripts
mkdir -p "$sdir"

order_sql='INSERT INTO orders (customer_id, status, amount, currency, note) VALUES (:cust::bigint, '"'"'created'"'"', :cents::int / 100.0, '"'"'EUR'"'"', repeat('"'"'n'"'"', 120)) RETURNING id AS oid \gset'
payload_expr() {	# $1: expression for the line number
	echo "jsonb_build_object('order_id', :oid::bigint, 'customer_id', :cust::bigint, 'status', 'created', 'amount', :cents::int / 100.0, 'currency', 'EUR', 'line', $1, 'sku', 'SKU-' || lpad(($1)::text, 8, '0'), 'note', repeat('p', 60))"
}

write_script() {	# name, extra statement
	cat >"$sdir/$1.sql" <<EOF
\\set cust random(1, 100000)
\\set cents random(100, 99999)
BEGIN;
$order_sql
$2
COMMIT;
EOF
}
write_script a   ""
write_script b   "INSERT INTO hand_outbox (topic, key, payload) VALUES ('orders.created', :oid::text, $(payload_expr 1));"
write_script c   "SELECT outbox_emit('orders.created', $(payload_expr 1), :oid::text);"
write_script b10 "INSERT INTO hand_outbox (topic, key, payload) SELECT 'orders.created', :oid::text, $(payload_expr g) FROM generate_series(1, 10) g;"
write_script c10 "SELECT outbox_emit('orders.created', $(payload_expr g), :oid::text) FROM generate_series(1, 10) g;"
chown -R "$PGUSER_OS" "$sdir"

msgs_per_xact() { case $1 in b | c) echo 1 ;; b10 | c10) echo 10 ;; *) echo 0 ;; esac; }

# Sizes, for the record.
psqlq -d "$DB" -At -F' ' <<SQL >"$work/sizes"
BEGIN;
\set cust 42
\set cents 12345
\set oid 1
SELECT 'payload_bytes', pg_column_size($(payload_expr 1));
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
	sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'
}

echo
echo "outbox emit benchmark  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "  repo $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$repo" diff --quiet HEAD -- src sql 2>/dev/null || echo ' (+local changes in src/sql)')"
echo "  PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), $(nproc) cores; pgbench -c $CLIENTS -j $THREADS -T $DURATION -M $PROTOCOL, $ROUNDS rounds, median TPS"
echo "  $(tr '\n' ' ' <"$work/sizes" | sed 's/ \([a-z]\)/, \1/g')"
for mode in "${mlist[@]}"; do
	declare -A med=()
	echo
	echo "synchronous_commit = $mode"
	printf '  %-5s %10s   %s\n' variant "median TPS" "rounds"
	for v in "${vlist[@]}"; do
		med[$v]=$(awk -v m="$mode" -v v="$v" '$1==m && $2==v {print $4}' "$results" | median)
		printf '  %-5s %10.1f   %s\n' "$v" "${med[$v]}" \
			"$(awk -v m="$mode" -v v="$v" '$1==m && $2==v {printf "%s ", $4}' "$results")"
	done
	ratio() {	# num den goal-op goal label
		local n=${med[$1]:-} d=${med[$2]:-}
		[ -n "$n" ] && [ -n "$d" ] || return 0
		awk -v n="$n" -v d="$d" -v op="$3" -v g="$4" -v l="$5" 'BEGIN {
			r = n / d
			if (op == "") { printf "  %-8s %6.3f\n", l, r; exit }
			ok = (r >= g) ? "ok" : "MISSED"
			printf "  %-8s %6.3f   goal >= %.2f  %s\n", l, r, g, ok }'
	}
	echo "  ratios:"
	ratio b a "" "" "b/a"
	ratio c a ">=" 0.85 "c/a"
	ratio c b ">=" 1.10 "c/b"
	ratio c10 b10 ">=" 1.30 "c10/b10"
	ratio b10 a "" "" "b10/a"
	ratio c10 a "" "" "c10/a"
	unset med
done

echo
if [ -s "$work/anomalies" ]; then
	echo "ANOMALIES:"
	sed 's/^/  /' "$work/anomalies"
else
	echo "sanity: every run left one order per transaction, the expected outbox rows, distinct gap-free ids, frontier = max(id)"
fi
if grep -Eq 'PANIC|TRAP|terminated by signal|server process .* was terminated' "$SERVERLOG"; then
	echo "SERVER LOG shows a crash:"
	grep -E -B2 -A5 'PANIC|TRAP|terminated by signal|was terminated' "$SERVERLOG" | head -60
fi
nerr=$(grep -c 'ERROR' "$SERVERLOG" || true)
echo "server log: $nerr ERROR lines"
if [ "$nerr" -gt 0 ]; then
	grep 'ERROR' "$SERVERLOG" | sort | uniq -c | sort -rn | head -10
fi

# ---- optional profile ---------------------------------------------------------
if [ "$PERF" = 1 ]; then
	for v in c c10; do
		echo
		echo "perf profile: $v, synchronous_commit=off, ${DURATION}s, all CPUs"
		reset_tables
		as_pg env PGHOST="$PGHOST" PGPORT="$PGPORT" PGUSER="$PGUSER" \
			PGOPTIONS="-c synchronous_commit=off" \
			"$BIN/pgbench" -n -c "$CLIENTS" -j "$THREADS" -T "$DURATION" -M "$PROTOCOL" \
			-f "$sdir/$v.sql" "$DB" >"$work/perf-$v.pgbench" 2>&1 &
		bench_pid=$!
		sleep 2
		perf record -q -F 999 -a -g -o "$work/perf-$v.data" -- sleep $((DURATION - 4)) >/dev/null 2>&1
		wait "$bench_pid"
		echo "  $(grep '^tps' "$work/perf-$v.pgbench" | head -1)"
		perf report -i "$work/perf-$v.data" --no-children --sort comm --stdio 2>/dev/null \
			| grep -E '^ +[0-9]' | head -5 | sed 's/^/  /'
		echo "  postgres backends, by shared object:"
		perf report -i "$work/perf-$v.data" --no-children --comm postgres --sort dso --stdio 2>/dev/null \
			| grep -E '^ +[0-9]' | head -8 | sed 's/^/    /'
		echo "  postgres backends, top symbols:"
		perf report -i "$work/perf-$v.data" --no-children --comm postgres --sort dso,sym --stdio -g none 2>/dev/null \
			| grep -E '^ +[0-9]' | head -25 | sed 's/^/    /'
		echo "  outbox.so symbols (self, % of all samples):"
		perf report -i "$work/perf-$v.data" --no-children --dsos outbox.so --sort sym --stdio -g none 2>/dev/null \
			| grep -E '^ +[0-9]' | head -15 | sed 's/^/    /'
		echo "  outbox.so functions including callees (children, % of all samples):"
		perf report -i "$work/perf-$v.data" --children --comm postgres --sort sym --stdio -g none 2>/dev/null \
			| grep -E 'outbox|PreCommit|CommitTransaction|XLogFlush|heap_multi_insert|ExecInsert' \
			| head -15 | sed 's/^/    /'
	done
fi
