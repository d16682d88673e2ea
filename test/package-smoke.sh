#!/usr/bin/env bash
# Smoke test of an installed outbox: the files PostgreSQL finds are those a
# package installed (Debian's postgresql-15-outbox, or the PGXN archive
# through pgxnclient), and they work in a fresh cluster: CREATE EXTENSION,
# a signed webhook target on the test receiver (test/sink/outbox_sink.py,
# 127.0.0.1), messages emitted, delivered in order with good signatures, and
# nothing pending in outbox.lag.
#
#   test/package-smoke.sh [--deb PACKAGE] [PG_CONFIG]
#
# --deb PACKAGE: also check with dpkg that the installed files are the
# package's own and unchanged (dpkg --verify).  PG_CONFIG: the
# installation to use (default /usr/lib/postgresql/15/bin/pg_config).
# Run as root (the server runs as the unprivileged postgres user) or as
# that user.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

deb=
if [ "${1:-}" = --deb ]; then
	deb=$2
	shift 2
fi
pgc=${1:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$pgc" --bindir)
pkglibdir=$("$pgc" --pkglibdir)
sharedir=$("$pgc" --sharedir)
user=${OUTBOX_TEST_USER:-postgres}

fail() {
	echo "package-smoke: $*" >&2
	exit 1
}

for f in "$pkglibdir/outbox.so" "$sharedir/extension/outbox.control" \
	"$sharedir/extension/outbox--0.4.sql" "$sharedir/extension/outbox--0.3--0.4.sql" \
	"$sharedir/extension/outbox--0.3.sql" "$sharedir/extension/outbox--0.2--0.3.sql" \
	"$sharedir/extension/outbox--0.2.sql" "$sharedir/extension/outbox--0.1--0.2.sql"; do
	[ -f "$f" ] || fail "$f is not installed"
done
# The product carries no test hooks (src/base.h): not the setting that
# names them, nor their messages.
if grep -a -q -E 'outbox\.test_fault|injected fault' "$pkglibdir/outbox.so"; then
	fail "$pkglibdir/outbox.so is a test build (it has outbox.test_fault's hooks)"
fi
if [ -n "$deb" ]; then
	dpkg-query -W -f='${Status}\n' "$deb" | grep -q "install ok installed" ||
		fail "package $deb is not installed"
	for f in "$pkglibdir/outbox.so" "$sharedir/extension/outbox.control" \
		"$sharedir/extension/outbox--0.4.sql"; do
		owner=$(dpkg -S "$f" 2>/dev/null || true)
		case "$owner" in "$deb: "*) ;; *) fail "$f does not belong to $deb ($owner)" ;; esac
	done
	# dpkg --verify prints a line for each file that differs from the package.
	changed=$(dpkg --verify "$deb" || true)
	[ -z "$changed" ] || fail "installed files differ from package $deb: $changed"
	echo "package-smoke: $deb installed, its files unchanged"
fi

as_user() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}
work=$(mktemp -d /tmp/outbox-smoke.XXXXXX)
[ "$(id -u)" -eq 0 ] && chown "$user" "$work"
sink_pid=
cleanup() {
	[ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null || true
	as_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

# A free port for the server on loopback.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
cat >>"$work/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$work'
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
CONF
as_user "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null ||
	{ cat "$work/server.log" >&2; fail "the server did not start"; }

secret="whsec_$(head -c 32 /dev/urandom | base64)"
python3 "$here/test/sink/outbox_sink.py" --port 0 --port-file "$work/sink.port" \
	--record "$work/sink.jsonl" --secret "$secret" >"$work/sink.log" 2>&1 &
sink_pid=$!
for _ in $(seq 100); do [ -s "$work/sink.port" ] && break; sleep 0.1; done
[ -s "$work/sink.port" ] || fail "the test receiver did not start"
sink_port=$(cat "$work/sink.port")

psql_smoke() {
	as_user "$bindir/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres -d postgres "$@"
}
psql_smoke >/dev/null <<SQL
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('smoke', 'http://127.0.0.1:$sink_port/smoke', secret => '$secret');
SELECT outbox.subscribe('smoke', 'smoke.*');
BEGIN;
SELECT count(outbox_emit('smoke.n', jsonb_build_object('n', g), 'k')) FROM generate_series(1, 20) g;
COMMIT;
BEGIN;
SELECT outbox_emit('smoke.n', '{"n": 0}', 'k');
ROLLBACK;
SQL
[ "$(psql_smoke -c "SELECT extversion FROM pg_extension WHERE extname = 'outbox'")" = 0.4 ] ||
	fail "the extension is not at version 0.4"

left=
for _ in $(seq 300); do
	left=$(psql_smoke -c "SELECT coalesce(sum(pending), 0) FROM outbox.lag")
	[ "$left" = 0 ] && break
	sleep 0.1
done
[ "$left" = 0 ] || { psql_smoke -c "SELECT * FROM outbox.lag"; fail "messages still pending: $left"; }

python3 - "$work/sink.jsonl" <<'PY'
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
ns = [json.loads(r["body"])["n"] for r in reqs]
assert ns == list(range(1, 21)), f"delivered out of order or incomplete: {ns}"
assert all(r["sig_ok"] for r in reqs), "a signature did not verify"
print(f"package-smoke: 20 messages delivered in order, signatures good; the rolled-back one never sent")
PY
echo "package-smoke: passed"
