-- Emitting from triggers, the usual way to use the outbox.
TRUNCATE outbox.messages;

CREATE TABLE orders (
	id			int PRIMARY KEY,
	customer	text NOT NULL,
	total		numeric NOT NULL
);

CREATE FUNCTION orders_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('orders.' || lower(TG_OP),
						to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END),
						CASE WHEN TG_OP = 'DELETE' THEN OLD.customer ELSE NEW.customer END,
						jsonb_build_object('x-table', TG_TABLE_NAME));
	RETURN NULL;
END
$$;
CREATE TRIGGER orders_outbox AFTER INSERT OR UPDATE OR DELETE ON orders
	FOR EACH ROW EXECUTE FUNCTION orders_outbox();

INSERT INTO orders VALUES (1, 'alice', 10), (2, 'bob', 20);
UPDATE orders SET total = total + 1 WHERE id = 1;
DELETE FROM orders WHERE id = 2;
BEGIN;
INSERT INTO orders VALUES (3, 'carol', 30);
ROLLBACK;
SELECT topic, key, payload, headers FROM outbox.messages ORDER BY id;

-- A deferred constraint trigger runs at COMMIT, before the messages are
-- stored, so what it emits is part of the transaction.
CREATE FUNCTION orders_summary() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('orders.summary',
						jsonb_build_object('orders', (SELECT count(*) FROM orders)));
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER orders_summary AFTER INSERT ON orders
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION orders_summary();

TRUNCATE outbox.messages;
BEGIN;
INSERT INTO orders VALUES (4, 'dave', 40);
SELECT outbox_emit('orders.note', '"emitted before the deferred trigger"') IS NOT NULL AS emitted;
COMMIT;
SELECT topic, payload FROM outbox.messages ORDER BY id;
DROP TRIGGER orders_summary ON orders;

-- A transaction that fails at COMMIT (deferred unique violation) emits
-- nothing.
CREATE TABLE slots (
	n	int UNIQUE DEFERRABLE INITIALLY DEFERRED
);
INSERT INTO slots VALUES (1);
TRUNCATE outbox.messages;
BEGIN;
INSERT INTO slots VALUES (1);
SELECT outbox_emit('slots.taken', '{"n": 1}') IS NOT NULL AS emitted;
COMMIT;
SELECT count(*) AS after_failed_commit FROM outbox.messages;

-- A deferred trigger that fails at COMMIT after emitting: nothing stored.
CREATE FUNCTION fail_at_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('never', '{}');
	RAISE EXCEPTION 'refused at commit';
END
$$;
CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON slots
	DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW EXECUTE FUNCTION fail_at_commit();
BEGIN;
INSERT INTO slots VALUES (2);
SELECT outbox_emit('slots.taken', '{"n": 2}') IS NOT NULL AS emitted;
COMMIT;
SELECT count(*) AS after_failed_trigger FROM outbox.messages;
DROP TRIGGER fail_at_commit ON slots;

-- A statement-level trigger with a transition table emits one message per
-- statement.
CREATE FUNCTION orders_bulk() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox_emit('orders.bulk', jsonb_build_object('inserted', (SELECT count(*) FROM new_rows)));
	RETURN NULL;
END
$$;
CREATE TRIGGER orders_bulk AFTER INSERT ON orders
	REFERENCING NEW TABLE AS new_rows
	FOR EACH STATEMENT EXECUTE FUNCTION orders_bulk();
TRUNCATE outbox.messages;
INSERT INTO orders SELECT g, 'bulk', g FROM generate_series(100, 104) g;
SELECT topic, count(*) FROM outbox.messages GROUP BY topic ORDER BY topic;
