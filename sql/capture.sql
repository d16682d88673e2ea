-- Change capture in trigger mode: outbox.capture() and outbox.uncapture(),
-- the messages' shapes, columns, keys, partitioned tables and the outbox
-- table mapping.  Ids depend on the tests before this one: rows are shown
-- in id order, without the ids.
\set SHOW_CONTEXT never
\set VERBOSITY default

CREATE SCHEMA shop;
CREATE TABLE shop.orders (id int PRIMARY KEY, customer text, total numeric,
						  secret text, placed_at timestamptz DEFAULT '2026-12-01 10:00+00');
CREATE TABLE mark (id bigint);
CREATE VIEW last_messages AS
	SELECT topic, key, payload, headers
	  FROM outbox.messages WHERE id > (SELECT coalesce(max(id), 0) FROM mark) ORDER BY id;
CREATE FUNCTION set_mark() RETURNS void LANGUAGE sql AS
	$$ DELETE FROM mark; INSERT INTO mark SELECT max(id) FROM outbox.messages $$;
SELECT set_mark() \gset

SELECT outbox.capture('shop.orders');
SELECT table_name, mode, topic, shape, state, columns, key, last_error FROM outbox.captures;

-- insert, update, delete: the envelope, the key, the headers.
SET TimeZone = 'Asia/Tokyo';
INSERT INTO shop.orders VALUES (1, 'ann', 9.50, 's3cret');
RESET TimeZone;
-- Timestamps are in UTC, whatever the writer's TimeZone.
UPDATE shop.orders SET total = 12 WHERE id = 1;
DELETE FROM shop.orders WHERE id = 1;
SELECT topic, key, payload FROM last_messages;
SELECT headers ? 'source-table' AND headers ? 'source-xid' AND headers ? 'source-commit-time'
	   AS has_headers,
	   headers->>'source-table' AS source_table,
	   headers->>'source-commit-time' ~ '^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$' AS commit_time_iso
  FROM last_messages LIMIT 1;
-- source-xid is the transaction's, source-commit-time when it committed
-- (not the placeholder), after every statement of the transaction.
SELECT set_mark() \gset
BEGIN;
INSERT INTO shop.orders VALUES (2, 'bob', 1, NULL);
SELECT pg_sleep(0.05);
SELECT pg_current_xact_id()::text AS xid \gset
SELECT now() AS started \gset
UPDATE shop.orders SET total = 2 WHERE id = 2;
COMMIT;
SELECT count(*) AS messages,
	   bool_and(headers->>'source-xid' = :'xid') AS same_xid,
	   count(DISTINCT headers->>'source-commit-time') AS one_commit_time,
	   bool_and((headers->>'source-commit-time')::timestamptz > :'started'::timestamptz + interval '40 ms')
	   AS after_the_statements
  FROM last_messages;

-- A rollback and a rolled-back savepoint leave nothing; captured changes
-- and outbox_emit() messages of a transaction are stored in their order.
SELECT set_mark() \gset
BEGIN;
INSERT INTO shop.orders VALUES (3, 'cy', 3, NULL);
ROLLBACK;
BEGIN;
SELECT outbox_emit('note', '{"n": 1}') IS NOT NULL AS emitted;
INSERT INTO shop.orders VALUES (4, 'di', 4, NULL);
SAVEPOINT s;
INSERT INTO shop.orders VALUES (5, 'ed', 5, NULL);
ROLLBACK TO s;
SELECT outbox_emit('note', '{"n": 2}') IS NOT NULL AS emitted;
UPDATE shop.orders SET customer = 'dee' WHERE id = 4;
COMMIT;
SELECT topic, key, payload->>'op' AS op, payload->'after'->>'customer' AS customer, payload->>'n' AS n
  FROM last_messages;

-- TRUNCATE: one message with no key.
SELECT set_mark() \gset
TRUNCATE shop.orders;
SELECT topic, key, payload FROM last_messages;

-- uncapture: no more messages; capture again with columns (the secret
-- stays out), a topic and a key of two columns.
SELECT outbox.uncapture('shop.orders');
SELECT count(*) FROM outbox.captures;
SELECT set_mark() \gset
INSERT INTO shop.orders VALUES (6, 'fay', 6, 'x');
SELECT count(*) AS not_captured FROM last_messages;
SELECT outbox.capture('shop.orders', topic => 'orders.changed',
					  columns => ARRAY['id', 'total'], key => ARRAY['id', 'customer']);
UPDATE shop.orders SET total = 7, secret = 'y' WHERE id = 6;
SELECT topic, key, payload FROM last_messages;
SELECT outbox.uncapture('shop.orders');

-- Composite keys of several types; a null key column is JSON null, a text
-- key is escaped.
CREATE TABLE shop.lines (order_id bigint, line smallint, sku text, ok boolean, qty int,
						 PRIMARY KEY (order_id, line, sku, ok));
SELECT outbox.capture('shop.lines');
SELECT set_mark() \gset
INSERT INTO shop.lines VALUES (10, 1, 'a"b', true, 2);
SELECT key, payload->'after' AS after FROM last_messages;
SELECT outbox.uncapture('shop.lines');
SELECT outbox.capture('shop.lines', key => ARRAY['sku', 'qty']);
SELECT set_mark() \gset
INSERT INTO shop.lines VALUES (10, 2, 'c', false, NULL);
SELECT key FROM last_messages;
SELECT outbox.uncapture('shop.lines');
-- One key column: its text; a null one: no key.
SELECT outbox.capture('shop.lines', key => ARRAY['qty']);
SELECT set_mark() \gset
INSERT INTO shop.lines VALUES (10, 3, 'd', true, NULL), (10, 4, 'e', true, 42);
SELECT key, payload->'after'->>'sku' AS sku FROM last_messages;
SELECT outbox.uncapture('shop.lines');

-- Values as to_jsonb() writes them (timestamps in UTC), for many types.
CREATE TYPE shop.pair AS (a int, b text);
CREATE DOMAIN shop.posint AS int CHECK (VALUE > 0);
CREATE TABLE shop.types (id int PRIMARY KEY, b boolean, i2 smallint, i8 bigint, f4 real,
						 f8 double precision, n numeric, nn numeric, fi double precision,
						 j json, jb jsonb, d date, ts timestamp, tstz timestamptz, iv interval,
						 by bytea, arr int[], arr2 text[][], p shop.pair, pa shop.pair[],
						 dom shop.posint, u uuid, e text[], tz timestamptz);
SELECT outbox.capture('shop.types');
SELECT set_mark() \gset
SET TimeZone = 'UTC';
INSERT INTO shop.types VALUES (1, true, -2, 9007199254740993, 1.5, 0.1, 123.450, 'NaN',
	'-Infinity', '{"x": [1, "y"]}', '{"b": null}', '2026-12-01', '2026-12-01 10:11:12.5',
	'2026-12-01 10:11:12+02', '1 day 2 hours', '\x00ff', '{1,NULL,3}', '{{a,b},{c,d}}',
	'(1,"q")', ARRAY['(2,r)'::shop.pair], 7, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{}',
	'infinity');
INSERT INTO shop.types (id) VALUES (2);
SELECT payload->'after' = to_jsonb(t) AS same_as_to_jsonb, payload->'after' AS after
  FROM last_messages m JOIN shop.types t ON t.id = (m.payload->'after'->>'id')::int;
RESET TimeZone;
SELECT outbox.uncapture('shop.types');

-- Partitioned tables: changes of every partition, on the parent's topic,
-- also of a partition attached later; TRUNCATE of the parent.
CREATE TABLE shop.events (id int, region text, body jsonb, PRIMARY KEY (id, region))
	PARTITION BY LIST (region);
CREATE TABLE shop.events_eu PARTITION OF shop.events FOR VALUES IN ('eu');
SELECT outbox.capture('shop.events');
CREATE TABLE shop.events_us PARTITION OF shop.events FOR VALUES IN ('us');
SELECT set_mark() \gset
INSERT INTO shop.events VALUES (1, 'eu', '{"a": 1}'), (2, 'us', '[1, 2]');
UPDATE shop.events SET region = 'us' WHERE id = 1;	-- moves: delete + insert
TRUNCATE shop.events;
SELECT topic, key, payload, headers->>'source-table' AS source FROM last_messages;
SELECT outbox.capture('shop.events_eu');
-- A partition's trigger disabled: the state says where.
ALTER TABLE shop.events_us DISABLE TRIGGER outbox_capture;
SELECT table_name, state, last_error FROM outbox.captures;
SELECT outbox.uncapture('shop.events');

-- Snapshot: the rows already in the table, as op "read", then the changes.
INSERT INTO shop.orders VALUES (7, 'gil', 7, NULL);
SELECT set_mark() \gset
SELECT outbox.capture('shop.orders', snapshot => true);
SELECT snapshot_rows FROM outbox.captures;
UPDATE shop.orders SET total = 8 WHERE id = 7;
SELECT key, payload->>'op' AS op, payload->'after'->>'total' AS total FROM last_messages;
SELECT outbox.uncapture('shop.orders');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT outbox.capture('shop.orders', snapshot => true);
ROLLBACK;

-- An existing outbox table: each inserted row is one message with its
-- topic, key, payload and headers; the row may be deleted at once.
CREATE TABLE shop.outbox (id bigserial PRIMARY KEY, aggregatetype text NOT NULL,
						  aggregateid text, payload jsonb, headers jsonb, note text);
SELECT outbox.capture('shop.outbox', topic_column => 'aggregatetype', key_column => 'aggregateid',
					  payload_column => 'payload', headers_column => 'headers');
SELECT table_name, topic, shape, state FROM outbox.captures;
SELECT set_mark() \gset
BEGIN;
INSERT INTO shop.outbox (aggregatetype, aggregateid, payload, headers)
	VALUES ('order', 'o-1', '{"total": 5}', '{"x-tenant": "acme"}');
DELETE FROM shop.outbox;
INSERT INTO shop.outbox (aggregatetype, payload) VALUES ('customer', '"raw"');
UPDATE shop.outbox SET note = 'ignored';
COMMIT;
SELECT topic, key, payload, headers FROM last_messages;
-- The row's values are checked as outbox_emit() checks them.
INSERT INTO shop.outbox (aggregatetype, payload) VALUES ('bad topic', '{}');
INSERT INTO shop.outbox (aggregatetype, payload) VALUES ('t', NULL);
INSERT INTO shop.outbox (aggregatetype, payload, headers) VALUES ('t', '{}', '{"host": "x"}');
INSERT INTO shop.outbox (aggregatetype, aggregateid, payload) VALUES ('t', repeat('k', 1025), '{}');
SELECT outbox.uncapture('shop.outbox');
CREATE TABLE shop.outbox_text (topic varchar(100), payload text);
SELECT outbox.capture('shop.outbox_text', topic_column => 'topic', payload_column => 'payload');
SELECT set_mark() \gset
INSERT INTO shop.outbox_text VALUES ('t', '{"b": [1]}');
INSERT INTO shop.outbox_text VALUES ('t', 'not json');
SELECT topic, key, payload, headers FROM last_messages;
SELECT outbox.uncapture('shop.outbox_text');

-- Argument errors.
SELECT outbox.capture(NULL);
SELECT outbox.capture('last_messages');
CREATE TEMP TABLE tmp (id int PRIMARY KEY);
SELECT outbox.capture('tmp');
SELECT outbox.capture('outbox.targets');
SELECT outbox.capture('shop.events_eu');
SELECT outbox.capture('shop.orders', mode => 'wal');	-- wal_level = replica here
SELECT outbox.capture('shop.orders', mode => NULL);
CREATE TABLE shop.nokey (a int);
SELECT outbox.capture('shop.nokey');
SELECT outbox.capture('shop.orders', columns => ARRAY['id', 'nope']);
SELECT outbox.capture('shop.orders', columns => ARRAY['id', 'id']);
SELECT outbox.capture('shop.orders', columns => '{}');
SELECT outbox.capture('shop.orders', key => ARRAY['ctid']);
SELECT outbox.capture('shop.orders', key => ARRAY[NULL]);
SELECT outbox.capture('shop.orders', topic => 'bad topic');
SELECT outbox.capture('shop.orders', topic => repeat('t', 256));
SELECT outbox.capture('shop.orders', topic_column => 'customer');
SELECT outbox.capture('shop.orders', topic_column => 'customer', payload_column => 'id');
SELECT outbox.capture('shop.orders', topic_column => 'nope', payload_column => 'id');
SELECT outbox.capture('shop.orders', topic_column => 'customer', payload_column => 'secret',
					  topic => 'x');
SELECT outbox.capture('shop.orders', topic_column => 'customer', payload_column => 'secret',
					  snapshot => true);
SELECT outbox.capture('shop.orders');
SELECT outbox.capture('shop.orders');
SELECT outbox.uncapture('shop.nokey');
SELECT outbox.capture_trigger();

-- A captured column renamed: the next write fails, loudly, until the
-- table is captured again.
SELECT outbox.uncapture('shop.orders');
SELECT outbox.capture('shop.orders', columns => ARRAY['id', 'customer']);
ALTER TABLE shop.orders RENAME customer TO buyer;
INSERT INTO shop.orders VALUES (8, 'hal', 8, NULL);
SELECT outbox.uncapture('shop.orders');
SELECT outbox.capture('shop.orders', columns => ARRAY['id', 'buyer']);
SELECT set_mark() \gset
INSERT INTO shop.orders VALUES (8, 'hal', 8, NULL);
-- A column added or dropped: the next message has the new row.
ALTER TABLE shop.orders ADD COLUMN note text DEFAULT 'n';
SELECT outbox.uncapture('shop.orders');
SELECT outbox.capture('shop.orders');
ALTER TABLE shop.orders DROP COLUMN secret;
UPDATE shop.orders SET total = 9 WHERE id = 8;
SELECT key, payload FROM last_messages;

-- The state shows a disabled or dropped trigger; DROP TABLE ends the
-- capture.
ALTER TABLE shop.orders DISABLE TRIGGER outbox_capture;
SELECT table_name, state, last_error FROM outbox.captures;
ALTER TABLE shop.orders ENABLE ALWAYS TRIGGER outbox_capture;
SELECT table_name, state FROM outbox.captures;	-- the TRUNCATE trigger is not
ALTER TABLE shop.orders ENABLE ALWAYS TRIGGER outbox_capture_truncate;
SELECT table_name, state FROM outbox.captures;
ALTER TABLE shop.orders ENABLE TRIGGER outbox_capture;
ALTER TABLE shop.orders DISABLE TRIGGER outbox_capture_truncate;
SELECT table_name, state, last_error FROM outbox.captures;
DROP TRIGGER outbox_capture ON shop.orders;
SELECT table_name, state, last_error FROM outbox.captures;
DROP TABLE shop.orders;
SELECT count(*) AS captures_left FROM outbox.captures;

-- Who may: the extension's owner; outbox_monitor reads the view.
CREATE ROLE capture_app;
GRANT USAGE ON SCHEMA shop TO capture_app;
SET ROLE capture_app;
SELECT outbox.capture('shop.lines');
SELECT outbox.uncapture('shop.lines');
RESET ROLE;
GRANT outbox_monitor TO capture_app;
SET ROLE capture_app;
SELECT count(*) FROM outbox.captures;
RESET ROLE;
-- A captured table's writer needs no rights on the outbox.
SELECT outbox.capture('shop.lines');
SELECT set_mark() \gset
GRANT SELECT, INSERT, DELETE ON shop.lines TO capture_app;
SET ROLE capture_app;
INSERT INTO shop.lines VALUES (11, 1, 'z', true, 1);
DELETE FROM shop.lines WHERE order_id = 11;
RESET ROLE;
SELECT key, payload->>'op' AS op FROM last_messages;
SELECT outbox.uncapture('shop.lines');
REVOKE ALL ON shop.lines FROM capture_app;
REVOKE ALL ON SCHEMA shop FROM capture_app;
REVOKE outbox_monitor FROM capture_app;
DROP ROLE capture_app;

DROP SCHEMA shop CASCADE;
DROP VIEW last_messages;
DROP TABLE mark;
DROP FUNCTION set_mark();
