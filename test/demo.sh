#!/usr/bin/env bash
# The main job on an embedded default: install what is needed, build and
# install the extension, start a throwaway PostgreSQL server (unprivileged
# user, Unix socket and loopback only) with the library preloaded and a
# local HTTP receiver, emit messages from a trigger and from plain SQL, and
# watch the relay deliver them: signed webhooks to the receiver, NOTIFY to
# a listener, then the outbox.lag view.  Everything is removed on exit.
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

sink_pid=
cleanup() {
	[ -n "$sink_pid" ] && kill "$sink_pid" 2>/dev/null || true
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

secret="whsec_$(head -c 32 /dev/urandom | base64)"
echo "== starting the HTTP receiver (test/sink/outbox_sink.py) on 127.0.0.1"
python3 "$here/test/sink/outbox_sink.py" --port 0 --port-file "$work/sink.port" \
	--record "$work/sink.jsonl" --secret "$secret" >"$work/sink.log" 2>&1 &
sink_pid=$!
for _ in $(seq 50); do [ -s "$work/sink.port" ] && break; sleep 0.1; done
sink_port=$(cat "$work/sink.port")

echo "== creating the extension and the targets"
psql_demo <<SQL
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('orders-webhook', 'http://127.0.0.1:$sink_port/hooks/orders',
								 secret => '$secret', lanes => 4);
SELECT outbox.subscribe('orders-webhook', 'orders.*');
SELECT outbox.create_http_target('audit-log', 'http://127.0.0.1:$sink_port/hooks/audit',
								 batch_size => 100);
SELECT outbox.subscribe('audit-log', '*');
SELECT outbox.create_notify_target('listeners', 'outbox_events');
SELECT outbox.subscribe('listeners', 'audit.*');
SQL

echo "== emitting messages"
psql_demo <<'SQL'

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
SQL

echo "== waiting for the relay to deliver everything"
for _ in $(seq 100); do
	left=$(psql_demo -At -c "SELECT coalesce(sum(pending), 0) FROM outbox.lag")
	[ "$left" = "0" ] && break
	sleep 0.1
done

echo "== what the receiver got (signatures checked with the Standard Webhooks algorithm)"
python3 - "$work/sink.jsonl" <<'PY'
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
for r in reqs:
	if r["path"] == "/hooks/orders":
		h = r["headers"]
		print(f'  POST {r["path"]}  seq={h.get("outbox-seq")} key={h.get("outbox-key")} '
			  f'id={h["webhook-id"]} signature_ok={r["sig_ok"]}  body={r["body"]}')
audit = [r for r in reqs if r["path"] == "/hooks/audit"]
n = sum(len(json.loads(r["body"])) for r in audit)
print(f'  POST /hooks/audit: {len(audit)} batched requests carrying {n} messages')
PY

echo "== outbox.lag"
psql_demo -c "SELECT target, kind, pending, last_delivered_id, delivered, dead_letters, last_error FROM outbox.lag ORDER BY target"
echo "== done"
