#!/usr/bin/env bash
# databases_bench.sh - one outbox per database: does spreading the work over
# databases cost anything?  Both figures are ratios of totals measured in
# the same run, alternating A B A B.
#
# Run by hand, as root (not in CI):
#
#   test/bench/databases_bench.sh               # ~6 minutes on 2 cores
#   ROUNDS=5 DURATION=15 test/bench/databases_bench.sh
#
# emit:  pgbench, CLIENTS clients, each transaction an INSERT and an
#        outbox_emit(): A all clients in database d1; B half of them in d1
#        and half in d2 at the same time.  Ratio: total TPS of B / A (no
#        contention between databases on the commit path: >= 0.9).
# relay: MESSAGES messages (over 1,000 keys) stored while outbox.enabled is
#        off, then released at once to an HTTP target on nginx (lanes
#        LANES, batch BATCH): A all in d1; B a third in each of d1, d2, d3,
#        drained by their three relays at once.  Ratio: messages per second
#        of B / A, from the release until outbox.stats counts them all
#        delivered (>= 0.9).
#
# Settings (environment):
#   ROUNDS=3 DURATION=10 CLIENTS=8 MESSAGES=60000 LANES=8 BATCH=1
#   PORT=54331 NGINX_PORT=18091 KEEP=0 REV= OUT=DIR
#   WAIT_FOR=relay_bench.sh   wait while a process whose command line matches runs
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CLIENTS=${CLIENTS:-8}
MESSAGES=${MESSAGES:-60000}
LANES=${LANES:-8}
BATCH=${BATCH:-1}
PORT=${PORT:-54331}
NGINX_PORT=${NGINX_PORT:-18091}
KEEP=${KEEP:-0}
PGUSER_OS=${OUTBOX_BENCH_USER:-postgres}
DB=d1

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
REV=${REV:-}
INSTALL=${INSTALL:-0}
OUT=${OUT:-}
WAIT_FOR=${WAIT_FOR-relay_bench.sh}
BENCH_NAME=databases-bench
BENCH_PACKAGES=()
# every database with the extension gets a relay
BENCH_CONF="outbox.database = ''
outbox.relay_memory = '64MB'"
# shellcheck source=common.sh
. "$here/common.sh"
bench_setup

for d in d1 d2 d3; do
	psqlq -d postgres -c "CREATE DATABASE $d" >/dev/null
	psqlq -d "$d" >/dev/null <<-EOF
	CREATE EXTENSION outbox;
	CREATE TABLE orders (id bigserial PRIMARY KEY, customer int, total numeric);
	SELECT outbox.create_http_target('t', '$NGINX_URL', lanes => $LANES, batch_size => $BATCH);
	SELECT outbox.subscribe('t', 'relay');
	EOF
done
cat >"$work/emit.sql" <<-'EOF'
\set c random(1, 1000)
BEGIN;
INSERT INTO orders (customer, total) VALUES (:c, 10);
SELECT outbox_emit('emit', jsonb_build_object('customer', :c::int, 'total', 10), 'c' || :c::int);
COMMIT;
EOF
chmod 644 "$work/emit.sql"

# pgbench in the background; its TPS (excluding connections) on stdout
pgb() {
	local db=$1 clients=$2
	"$BIN/pgbench" -n -M prepared -c "$clients" -j "$((clients < 2 ? 1 : 2))" -T "$DURATION" \
		-f "$work/emit.sql" "$db" 2>"$work/log/pgbench.err" | awk '/^tps = / {print $3; exit}'
}

emit_round() {
	local kind=$1 a b
	for d in d1 d2; do psqlq -d "$d" -c "TRUNCATE orders; CHECKPOINT" >/dev/null; done
	if [ "$kind" = A ]; then
		pgb d1 "$CLIENTS"
	else
		pgb d1 "$((CLIENTS / 2))" >"$work/tps_d1" &
		local p1=$!
		pgb d2 "$((CLIENTS - CLIENTS / 2))" >"$work/tps_d2" &
		local p2=$!
		wait "$p1" "$p2"
		a=$(cat "$work/tps_d1"); b=$(cat "$work/tps_d2")
		awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f\n", a + b }'
	fi
}

# Store n messages in each database of $@ with delivery off, release, time
# until the targets' statistics count them delivered; prints messages per
# second (the statistics are published every 50 ms).
relay_round() {
	local n=$1; shift
	psqlq -d postgres -c "ALTER SYSTEM SET outbox.enabled = off" -c "SELECT pg_reload_conf()" >/dev/null
	sleep 0.5
	for d in "$@"; do
		psqlq -d "$d" -c "SELECT count(outbox_emit('relay', jsonb_build_object('n', g, 'pad', repeat('x', 150)), 'k' || g % 1000)) FROM generate_series(1, $n) g" >/dev/null
	done
	local t0 t1 d before=0 now
	delivered() {
		local sum=0
		for d in "$@"; do
			sum=$((sum + $(psqlq -d "$d" -At -c "SELECT coalesce(sum(messages), 0) FROM outbox.stats")))
		done
		echo "$sum"
	}
	before=$(delivered "$@")
	t0=$(date +%s.%N)
	psqlq -d postgres -c "ALTER SYSTEM SET outbox.enabled = on" -c "SELECT pg_reload_conf()" >/dev/null
	while :; do
		now=$(delivered "$@")
		[ "$now" -ge $((before + n * $#)) ] && break
		sleep 0.02
	done
	t1=$(date +%s.%N)
	awk -v n="$n" -v k="$#" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f\n", n * k / (b - a) }'
}

log "warm-up"
pgb d1 "$CLIENTS" >/dev/null
relay_round 10000 d1 >/dev/null
relay_round 3000 d1 d2 d3 >/dev/null

declare -a EA EB RA RB
for r in $(seq "$ROUNDS"); do
	busy=$(machine_busy 1)
	if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
	for k in $order; do
		v=$(emit_round "$k")
		log "round $r emit $k: $v tps (machine busy before: $busy CPUs)"
		record "{\"round\": $r, \"part\": \"emit\", \"config\": \"$k\", \"tps\": $v}"
		if [ "$k" = A ]; then EA+=("$v"); else EB+=("$v"); fi
	done
	for k in $order; do
		if [ "$k" = A ]; then v=$(relay_round "$MESSAGES" d1); else v=$(relay_round "$((MESSAGES / 3))" d1 d2 d3); fi
		log "round $r relay $k: $v msg/s"
		record "{\"round\": $r, \"part\": \"relay\", \"config\": \"$k\", \"msgs\": $v}"
		if [ "$k" = A ]; then RA+=("$v"); else RB+=("$v"); fi
	done
done

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
ea=$(median "${EA[@]}"); eb=$(median "${EB[@]}")
ra=$(median "${RA[@]}"); rb=$(median "${RB[@]}")
echo
echo "outbox $build_rev ($build_md5), $ROUNDS rounds, medians"
printf 'emit:  one database %s tps, two databases %s tps: %s\n' "$ea" "$eb" \
	"$(awk -v a="$ea" -v b="$eb" 'BEGIN { printf "%.2f", b / a }')"
printf 'relay: one database %s msg/s, three databases %s msg/s: %s\n' "$ra" "$rb" \
	"$(awk -v a="$ra" -v b="$rb" 'BEGIN { printf "%.2f", b / a }')"
