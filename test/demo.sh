#!/usr/bin/env bash
# The main job on an embedded default: install what is needed, build and
# install the extension, start a throwaway PostgreSQL server (unprivileged
# user, Unix socket and loopback only) with the library preloaded, emit
# messages from a trigger and from plain SQL, and show them in commit order.
# Everything is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

"$here/test/install-deps.sh"
make -s
if [ "$(id -u)" -eq 0 ]; then make -s install; else make -s install 2>/dev/null || sudo make -s install; fi

bindir=$(pg_config --bindir)
user=${OUTBOX_DEMO_USER:-postgres}
port=${OUTBOX_DEMO_PORT:-54329}
work=$(mktemp -d /tmp/outbox-demo.XXXXXX)
as_user() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}
[ "$(id -u)" -eq 0 ] && chown "$user" "$work"

cleanup() {
	as_user "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "== starting a throwaway server in $work"
as_user "$bindir/initdb" -D "$work/data" -A trust -U postgres >/dev/null
cat >> "$work/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$work'
shared_preload_libraries = 'outbox'
outbox.database = 'postgres'
CONF
as_user "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null

psql_demo() {
	as_user "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres -d postgres "$@"
}

echo "== emitting messages"
psql_demo <<'SQL'
CREATE EXTENSION outbox;

CREATE TABLE orders (
	id		 serial PRIMARY KEY,
	customer text NOT NULL,
	total	 numeric NOT NULL
);

-- Every change to an order emits a message in the same transaction.
CREATE FUNCTION orders_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('orders.' || lower(TG_OP), to_jsonb(NEW), NEW.customer);
	RETURN NULL;
END $$;
CREATE TRIGGER orders_outbox AFTER INSERT OR UPDATE ON orders
	FOR EACH ROW EXECUTE FUNCTION orders_outbox();

INSERT INTO orders (customer, total) VALUES ('alice', 30), ('bob', 12.5);

BEGIN;
UPDATE orders SET total = total + 5 WHERE customer = 'alice';
SELECT outbox_emit('audit.note', '{"text": "price corrected by support"}', 'alice',
				   '{"x-source": "demo"}') AS msg_id \gset
SAVEPOINT maybe;
INSERT INTO orders (customer, total) VALUES ('carol', 99);	-- rolled back below
ROLLBACK TO SAVEPOINT maybe;
COMMIT;

BEGIN;
INSERT INTO orders (customer, total) VALUES ('dave', 1);	-- never committed
ROLLBACK;

-- A thousand messages in one transaction: contiguous ids, emit order.
SELECT count(outbox_emit('load.tick', jsonb_build_object('n', g), 'k' || g % 10))
  FROM generate_series(1, 1000) g \gset
SQL

echo "== messages in commit order (carol's and dave's orders were rolled back)"
psql_demo <<'SQL'
SELECT id, topic, key, payload, headers
  FROM outbox.messages WHERE topic <> 'load.tick' ORDER BY id;
SELECT topic, count(*), min(id), max(id), max(id) - min(id) + 1 AS span
  FROM outbox.messages GROUP BY topic ORDER BY min(id);
SELECT outbox.frontier() AS frontier;
SQL
echo "== done"
