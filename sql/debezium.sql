-- Debezium-compatible change events (docs/formats.md), trigger mode.
-- The fixtures follow the PostgreSQL connector's documentation: its
-- customers table and example row, its envelope, source block, key and
-- type mappings.  Times that change with each run (ts_ms, ts_us, ts_ns)
-- and the transaction id are checked for what they must be, then left out.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS outbox;
RESET client_min_messages;
DELETE FROM outbox.messages;
SET TimeZone = 'Europe/Paris';

CREATE FUNCTION dbz_stable(p jsonb) RETURNS jsonb LANGUAGE sql AS $$
	SELECT (p - '{ts_ms,ts_us,ts_ns}'::text[])
		   || jsonb_build_object('source', (p->'source') - '{ts_ms,ts_us,ts_ns,txId}'::text[])
$$;
-- what the volatile fields must be: numbers of now, the xid of the writer
CREATE FUNCTION dbz_times_ok(p jsonb, xid xid8) RETURNS boolean LANGUAGE sql AS $$
	SELECT abs((p->>'ts_ms')::bigint - extract(epoch FROM clock_timestamp()) * 1000) < 600000
	   AND abs((p->'source'->>'ts_ms')::bigint - extract(epoch FROM clock_timestamp()) * 1000) < 600000
	   AND (p->'source'->>'ts_us')::bigint / 1000 = (p->'source'->>'ts_ms')::bigint
	   AND (p->'source'->>'ts_ns')::numeric / 1000 = (p->'source'->>'ts_us')::bigint
	   AND (p->>'ts_us')::bigint / 1000 = (p->>'ts_ms')::bigint
	   AND (p->'source'->>'txId')::bigint = (xid::text::bigint % 4294967296)
$$;
CREATE TABLE xids (label text, xid xid8);

-- The connector documentation's table and row.
CREATE TABLE customers (id integer PRIMARY KEY, first_name text, last_name text, email text);
SELECT outbox.capture('customers', format => 'debezium', topic_prefix => 'PostgreSQL_server');
SELECT table_name, mode, topic, shape, format FROM outbox.captures;

BEGIN;
INSERT INTO customers VALUES (1, 'Anne', 'Kretchmar', 'annek@noanswer.org');
INSERT INTO xids SELECT 'create', pg_current_xact_id();
COMMIT;
BEGIN;
UPDATE customers SET first_name = 'Anne Marie' WHERE id = 1;
INSERT INTO xids SELECT 'update', pg_current_xact_id();
COMMIT;
BEGIN;
DELETE FROM customers WHERE id = 1;
INSERT INTO xids SELECT 'delete', pg_current_xact_id();
COMMIT;
-- a change of the key: a delete of the old key, a create of the new
BEGIN;
INSERT INTO customers VALUES (3, 'Edward', 'Walker', 'ed@walker.com');
UPDATE customers SET id = 4 WHERE id = 3;
INSERT INTO xids SELECT 'rekey', pg_current_xact_id();
COMMIT;
BEGIN;
INSERT INTO customers VALUES (2, 'Sally', 'Thomas', 'sally.thomas@acme.com');
TRUNCATE customers;
INSERT INTO xids SELECT 'truncate', pg_current_xact_id();
COMMIT;

SELECT m.topic, m.key, jsonb_pretty(dbz_stable(m.payload)) AS value
  FROM outbox.messages m ORDER BY m.id;
-- the volatile fields: times of now, txId the writer's transaction
SELECT m.payload->>'op' AS op, x.label, dbz_times_ok(m.payload, x.xid) AS ok
  FROM outbox.messages m
  JOIN xids x ON x.xid::text = m.headers->>'source-xid'
 ORDER BY m.id;
-- Debezium's record key is a JSON object of the key columns
SELECT key::jsonb = '{"id": 1}' AS object_key FROM outbox.messages WHERE payload->>'op' = 'u';
DELETE FROM outbox.messages;

-- The type mappings (decimal.handling.mode string, time.precision.mode
-- adaptive, interval.handling.mode numeric, binary.handling.mode bytes).
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE types (
	id			bigint PRIMARY KEY,
	b			boolean,
	i2			smallint,
	f8			double precision,
	f8nan		double precision,
	num			numeric(10, 2),
	numnan		numeric,
	numinf		numeric,
	cash		money,
	d			date,
	d_inf		date,
	t			time,
	t3			time(3),
	tz			timetz,
	ts			timestamp,
	ts3			timestamp(3),
	ts_inf		timestamp,
	ts3_inf		timestamp(3),
	tstz		timestamptz,
	tstz0		timestamptz(0),
	tstz3		timestamptz(3),
	tstz_inf	timestamptz,
	tstz_bc		timestamptz,
	iv			interval,
	iv_big		interval,
	raw			bytea,
	js			json,
	jsb			jsonb,
	u			uuid,
	ints		integer[],
	texts		text[],
	stamps		timestamptz[],
	m			mood,
	addr		inet,
	c			char(3),
	nothing		text
);
SELECT outbox.capture('types', format => 'debezium');
INSERT INTO types VALUES (
	42, true, -7, 1.5, 'NaN', 12.30, 'NaN', '-Infinity', 1234.56,
	'2018-06-20', 'infinity', '10:40:39.212', '10:40:39.212', '10:40:39.5+02',
	'2018-06-20 10:40:39.212', '2018-06-20 10:40:39.212', '-infinity', 'infinity',
	'2018-06-20 10:40:39.212+02', '2018-06-20 10:40:39+02', '2018-06-20 10:40:39.1+02', 'infinity',
	'0001-01-01 00:00:00+00 BC',
	'1 year 2 months 3 days 04:05:06.78', '178000000 years', '\x0102ff', '{"a": 1,  "b": [true]}',
	'{"a": 1, "b": [true]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
	'{1,2,3}', '{"x", NULL}', '{"2018-06-20 10:40:39.212+02"}', 'happy', '192.168.0.1/24',
	'ab', NULL);
SELECT topic, key, jsonb_pretty(payload->'after') AS after, payload->'source'->>'name' AS name
  FROM outbox.messages;
DELETE FROM outbox.messages;

-- A large jsonb stored out of line is read whole.
CREATE TABLE docs (id int PRIMARY KEY, j jsonb);
ALTER TABLE docs ALTER j SET STORAGE EXTERNAL;
SELECT outbox.capture('docs', format => 'debezium');
INSERT INTO docs SELECT 1, jsonb_build_object('items', jsonb_agg(g)) FROM generate_series(1, 20000) g;
SELECT (payload->'after'->>'j')::jsonb = (SELECT j FROM docs) AS whole,
	   length(payload->'after'->>'j') AS length
  FROM outbox.messages;
DELETE FROM outbox.messages;

-- An update that leaves the key as it is is an update, even when the key's
-- value is stored compressed in one version of the row and not the other.
CREATE TABLE tk (k text PRIMARY KEY, b1 bytea, b2 bytea);
SELECT outbox.capture('tk', format => 'debezium');
INSERT INTO tk VALUES (repeat('x', 300), 'small', 'small');
UPDATE tk SET b1 = (SELECT string_agg(decode(md5(g::text), 'hex'), '') FROM generate_series(1, 75) g),
			  b2 = (SELECT string_agg(decode(md5((g + 100)::text), 'hex'), '') FROM generate_series(1, 75) g);
SELECT pg_column_compression(k) AS k_compressed FROM tk;
SELECT payload->>'op' AS op FROM outbox.messages ORDER BY id;
DELETE FROM outbox.messages;

-- A snapshot: op "r", source.snapshot "true", and "last" for the last row.
CREATE TABLE stock (sku text PRIMARY KEY, n integer);
INSERT INTO stock VALUES ('a', 1), ('b', 2), ('c', 3);
SELECT outbox.capture('stock', format => 'debezium', snapshot => true, topic => 'inventory.stock');
SELECT topic, key, payload->>'op' AS op, payload->'source'->>'snapshot' AS snapshot,
	   payload->'after' AS after
  FROM outbox.messages ORDER BY id;
DELETE FROM outbox.messages;

-- A composite key: an object of the key's columns, in the order given.
CREATE TABLE lines (order_id integer, line smallint, sku text, PRIMARY KEY (order_id, line));
SELECT outbox.capture('lines', format => 'debezium', key => ARRAY['line', 'order_id']);
INSERT INTO lines VALUES (7, 1, 'a');
SELECT key, key::jsonb = '{"order_id": 7, "line": 1}' AS same FROM outbox.messages;
DELETE FROM outbox.messages;
-- an array key: compact too
CREATE TABLE ak (k int[] PRIMARY KEY, v text);
SELECT outbox.capture('ak', format => 'debezium');
INSERT INTO ak VALUES ('{1,2}', 'x');
SELECT key FROM outbox.messages;
DELETE FROM outbox.messages;

-- Debezium's outbox table, routed as its outbox event router does: topic
-- outbox.event.<aggregatetype>, key aggregateid, payload as it is, the id
-- as a header; updates and deletes are not events.
CREATE TABLE outbox_events (
	id				uuid			NOT NULL PRIMARY KEY,
	aggregatetype	varchar(255)	NOT NULL,
	aggregateid		varchar(255)	NOT NULL,
	type			varchar(255)	NOT NULL,
	payload			jsonb
);
SELECT outbox.capture('outbox_events', format => 'debezium-outbox');
SELECT table_name, topic, shape, format FROM outbox.captures WHERE table_name = 'outbox_events'::regclass;
INSERT INTO outbox_events VALUES ('6d7a3c2e-5b1f-4a8e-9c1d-2f3e4a5b6c7d', 'Order', '123', 'OrderCreated',
	'{"id": 123, "customerId": 456, "lineItems": []}');
UPDATE outbox_events SET type = 'ignored';
DELETE FROM outbox_events;
SELECT topic, key, payload, headers - '{traceparent,tracestate}'::text[] AS headers FROM outbox.messages;
DELETE FROM outbox.messages;

-- Errors.
CREATE TABLE no_id (aggregatetype text, aggregateid text, payload jsonb);
SELECT outbox.uncapture('stock');
SELECT outbox.capture('stock', format => 'avro');
SELECT outbox.capture('stock', format => NULL);
SELECT outbox.capture('stock', topic_prefix => 'x');
SELECT outbox.capture('stock', format => 'debezium', topic_prefix => '');
SELECT outbox.capture('stock', format => 'debezium', topic_prefix => 'has space');
SELECT outbox.capture('no_id', format => 'debezium', topic_column => 'aggregatetype', payload_column => 'payload');
SELECT outbox.capture('stock', format => 'debezium-outbox');
SELECT outbox.capture('no_id', format => 'debezium-outbox');
SELECT outbox.capture('no_id', format => 'debezium-outbox', topic => 't');
