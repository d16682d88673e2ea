-- outbox_emit(): a message exists if and only if its transaction commits,
-- and ids follow commit order, contiguous and in emit order inside one
-- transaction.
CREATE EXTENSION outbox;

-- A committed transaction stores its message; nothing is visible before.
BEGIN;
SELECT outbox_emit('orders.created', '{"order": 1}', 'customer-1') IS NOT NULL AS emitted;
SELECT count(*) AS stored_before_commit FROM outbox.messages;
COMMIT;
SELECT topic, key, payload, headers FROM outbox.messages ORDER BY id;

-- A rolled-back transaction stores nothing.
BEGIN;
SELECT outbox_emit('orders.cancelled', '{"order": 1}') IS NOT NULL AS emitted;
ROLLBACK;
SELECT count(*) AS cancelled FROM outbox.messages WHERE topic = 'orders.cancelled';

-- The returned id is the stored msg_id, a version 7 UUID.
CREATE TEMP TABLE returned AS
	SELECT outbox_emit('ids', '{"n": 1}', 'k', '{"x-tenant": "acme"}') AS msg_id;
SELECT m.topic, m.key, m.headers, substr(m.msg_id::text, 15, 1) AS uuid_version
  FROM outbox.messages m JOIN returned r USING (msg_id);

-- Every call gets its own msg_id.
SELECT count(DISTINCT outbox_emit('distinct', to_jsonb(g))) AS distinct_ids
  FROM generate_series(1, 100) g;

-- Ids of one transaction are contiguous and follow emit order.
BEGIN;
SELECT count(outbox_emit('batch', jsonb_build_object('seq', g), 'k' || (g % 3)))
  FROM generate_series(1, 50) g;
SELECT outbox_emit('batch', '{"seq": 51}') IS NOT NULL AS emitted;
COMMIT;
SELECT max(id) - min(id) + 1 AS span, count(*) AS n,
	   bool_and((payload->>'seq')::int = id - (SELECT min(id) FROM outbox.messages WHERE topic = 'batch') + 1) AS in_emit_order
  FROM outbox.messages WHERE topic = 'batch';

-- Later commits get higher ids.
SELECT outbox_emit('later', '{}') IS NOT NULL AS emitted;
SELECT (SELECT id FROM outbox.messages WHERE topic = 'later') >
	   (SELECT max(id) FROM outbox.messages WHERE topic <> 'later') AS later_is_higher;

-- JSON of every shape is a valid payload; emitted_at is the call's time.
SELECT outbox_emit('shapes', p) IS NOT NULL AS emitted
  FROM (VALUES ('null'::jsonb), ('"text"'), ('42'), ('[1, 2]'), ('{"a": {"b": [true]}}')) v(p);
SELECT payload FROM outbox.messages WHERE topic = 'shapes' ORDER BY id;
SELECT bool_and(emitted_at BETWEEN now() - interval '1 hour' AND clock_timestamp()) AS emitted_at_sane
  FROM outbox.messages;

-- Callable unqualified whatever the search_path.
CREATE SCHEMA app;
SET search_path = app;
SELECT outbox_emit('from.app.schema', '{}') IS NOT NULL AS emitted;
RESET search_path;
SELECT count(*) AS from_app_schema FROM outbox.messages WHERE topic = 'from.app.schema';

-- A procedure that commits in the middle: each transaction stands alone.
CREATE PROCEDURE emit_and_commit()
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('proc', '{"step": 1}');
	COMMIT;
	PERFORM outbox_emit('proc', '{"step": 2}');
	ROLLBACK;
	PERFORM outbox_emit('proc', '{"step": 3}');
END
$$;
CALL emit_and_commit();
SELECT payload FROM outbox.messages WHERE topic = 'proc' ORDER BY id;

-- Large payloads are stored whole (toasted).
SELECT outbox_emit('large', jsonb_build_object('blob', repeat('x', 500000))) IS NOT NULL AS emitted;
SELECT length(payload->>'blob') AS blob_length FROM outbox.messages WHERE topic = 'large';

-- Stored messages are immutable.
UPDATE outbox.messages SET topic = 'changed';
SELECT count(*) AS changed FROM outbox.messages WHERE topic = 'changed';

-- Rows inserted directly (as a restore does; only the owner may) push the
-- sequence above them.
INSERT INTO outbox.messages
	SELECT max(id) + 1000, gen_random_uuid(), 'restored', NULL, '{}', NULL, now()
	  FROM outbox.messages;
SELECT outbox_emit('after.restore', '{}') IS NOT NULL AS emitted;
SELECT (SELECT id FROM outbox.messages WHERE topic = 'after.restore') >
	   (SELECT id FROM outbox.messages WHERE topic = 'restored') AS above_restored;

-- An application role needs EXECUTE on outbox_emit(), and nothing more.
CREATE ROLE outbox_app;
SET ROLE outbox_app;
SELECT outbox_emit('app', '{}');
RESET ROLE;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO outbox_app;
SET ROLE outbox_app;
SELECT outbox_emit('app', '{}') IS NOT NULL AS emitted;
SELECT count(*) FROM outbox.messages;
SELECT outbox.frontier();
RESET ROLE;
SELECT count(*) AS app_messages FROM outbox.messages WHERE topic = 'app';
