-- W3C Trace Context: outbox.traceparent and outbox.tracestate give the
-- messages of a transaction its trace.
TRUNCATE outbox.messages;

-- Malformed values are refused by the settings themselves.
SET outbox.traceparent = 'nonsense';
SET outbox.traceparent = '00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01';
SET outbox.traceparent = '00-00000000000000000000000000000000-b7ad6b7169203331-01';
SET outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01';
SET outbox.traceparent = 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SET outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra';
SET outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331-01';
SET outbox.tracestate = 'Congo=t61rcWkgMzE';
SET outbox.tracestate = 'congo=';
SET outbox.tracestate = 'congo=a=b';
SET outbox.tracestate = 'congo';
SHOW outbox.traceparent;

-- A later version is taken as the specification has parsers take it.
SET outbox.traceparent = '01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future';
RESET outbox.traceparent;
SET outbox.tracestate = 'congo=t61rcWkgMzE, rojo=00f067aa0ba902b7,,tenant@vendor=x y';
RESET outbox.tracestate;

-- Without a trace, messages are as before.
SELECT outbox_emit('t.none', '{}') IS NOT NULL AS emitted;

-- SET LOCAL: the transaction's messages carry it, and it ends with it.
BEGIN;
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SET LOCAL outbox.tracestate = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
SELECT outbox_emit('t.local', '{}') IS NOT NULL AS emitted;
SELECT outbox_emit('t.local.headers', '{}', 'k', '{"x-tenant": "acme"}') IS NOT NULL AS emitted;
-- a message that names its own trace keeps it, and its own tracestate
SELECT outbox_emit('t.own', '{}', NULL,
	'{"traceparent": "00-11111111111111111111111111111111-2222222222222222-00"}') IS NOT NULL AS emitted;
COMMIT;
SHOW outbox.traceparent;
SELECT outbox_emit('t.after', '{}') IS NOT NULL AS emitted;

-- A tracestate alone is not sent: it belongs to a traceparent.
BEGIN;
SET LOCAL outbox.tracestate = 'congo=t61rcWkgMzE';
SELECT outbox_emit('t.state.only', '{}') IS NOT NULL AS emitted;
COMMIT;

-- A rolled-back transaction's traced message does not exist.
BEGIN;
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SELECT outbox_emit('t.rolled.back', '{}') IS NOT NULL AS emitted;
ROLLBACK;

SELECT topic, headers FROM outbox.messages ORDER BY id;

-- Headers that are not an object are refused, trace or not; a message's
-- own tracestate without a traceparent goes when the session's is added.
BEGIN;
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SELECT outbox_emit('t.bad', '{}', NULL, '[1, 2]');
ROLLBACK;
BEGIN;
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
SELECT outbox_emit('t.lone.state', '{}', NULL, '{"tracestate": "other=1", "x-a": "b"}') IS NOT NULL AS emitted;
COMMIT;
SELECT headers FROM outbox.messages WHERE topic = 't.lone.state';

-- A message's own trace headers are checked as the settings are.
SELECT outbox_emit('t.bad', '{}', NULL, '{"traceparent": "00-abc"}');
SELECT outbox_emit('t.bad', '{}', NULL, '{"TraceState": "Bad Key=1"}');

-- Trigger capture: each change carries the trace in effect when it was made.
TRUNCATE outbox.messages;
CREATE TABLE traced (id int PRIMARY KEY, v text);
SELECT outbox.capture('traced');
BEGIN;
INSERT INTO traced VALUES (1, 'untraced');
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
INSERT INTO traced VALUES (2, 'traced');
SET LOCAL outbox.traceparent = '00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01';
SET LOCAL outbox.tracestate = 'rojo=00f067aa0ba902b7';
UPDATE traced SET v = 'again' WHERE id = 2;
COMMIT;
SELECT payload->>'op' AS op, key, headers ? 'source-commit-time' AS has_commit_time,
	   (headers->>'source-commit-time')::timestamptz > now() - interval '1 hour' AS commit_time_set,
	   headers->>'traceparent' AS traceparent, headers->>'tracestate' AS tracestate
  FROM outbox.messages ORDER BY id;
SELECT outbox.uncapture('traced');
DROP TABLE traced;
TRUNCATE outbox.messages;

-- CloudEvents: format and source of HTTP, NATS and Kafka targets.
SELECT outbox.create_http_target('ce_http', 'http://127.0.0.1:9/ce', format => 'cloudevents');
SELECT outbox.create_http_target('ce_http_s', 'http://127.0.0.1:9/ce', format => 'cloudevents-structured',
	source => 'https://shop.example.com/orders');
SELECT outbox.create_nats_target('ce_nats', 'nats://127.0.0.1:4222', format => 'cloudevents');
SELECT outbox.create_kafka_target('ce_kafka', '127.0.0.1:9092', format => 'cloudevents-structured',
	source => '/shop');
SELECT name, kind, format, ce_source FROM outbox.targets WHERE name LIKE 'ce\_%' ORDER BY name;
-- errors
SELECT outbox.create_http_target('ce_bad', 'http://127.0.0.1:9/ce', format => 'xml');
SELECT outbox.create_http_target('ce_bad', 'http://127.0.0.1:9/ce', format => NULL);
SELECT outbox.create_http_target('ce_bad', 'http://127.0.0.1:9/ce', source => '/shop');
SELECT outbox.create_http_target('ce_bad', 'http://127.0.0.1:9/ce', format => 'cloudevents',
	source => 'has space');
SELECT outbox.create_http_target('ce_bad', 'http://127.0.0.1:9/ce', format => 'cloudevents',
	source => '');
SELECT outbox.create_notify_target('ce_notify', 'ce_channel');
SELECT outbox.alter_target('ce_notify', format => 'cloudevents');
-- alter: format and source change; source => '' goes back to the default
SELECT outbox.alter_target('ce_http', format => 'cloudevents-structured', source => 'urn:shop:orders');
SELECT outbox.alter_target('ce_http', source => '');
SELECT outbox.alter_target('ce_http', format => 'outbox');
SELECT outbox.alter_target('ce_http_s', format => 'outbox');
SELECT name, format, ce_source FROM outbox.targets WHERE name LIKE 'ce\_%' ORDER BY name;
SELECT outbox.drop_target(name) FROM outbox.targets WHERE name LIKE 'ce\_%' ORDER BY name;

-- Filters: a jsonpath per subscription, checked at subscribe.
SELECT outbox.create_http_target('f_http', 'http://127.0.0.1:9/f');
SELECT outbox.subscribe('f_http', 'orders.*', filter => '$.payload.total > 100');
SELECT outbox.subscribe('f_http', 'refunds', filter => '$.headers."x-tenant" == "acme"');
SELECT outbox.subscribe('f_http', 'audit', filter => '$.payload.items[*] ? (@.sku == "x")');
SELECT outbox.subscribe('f_http', 'bad', filter => '$.payload.total >');
SELECT outbox.subscribe('f_http', 'bad', filter => '$ ? (@ like_regex "(")');
-- a variable has no value in a filter; a "$" in a string is no variable
SELECT outbox.subscribe('f_http', 'bad', filter => '$.payload.total > $min');
SELECT outbox.subscribe('f_http', 'dollar', filter => '$.payload.s == "x$" || $.payload.s == "$"');
-- the same pattern again: its filter changes, or goes with NULL
SELECT outbox.subscribe('f_http', 'orders.*', filter => '$.payload.total > 200');
SELECT outbox.subscribe('f_http', 'orders.*', filter => '$.payload.total > 200');
SELECT outbox.subscribe('f_http', 'refunds');
SELECT pattern, filter FROM outbox.subscriptions s JOIN outbox.targets t ON t.id = s.target_id
 WHERE t.name = 'f_http' ORDER BY pattern;
-- (the relay may or may not have published the target yet: 0 either way)
SELECT coalesce(max(filtered), 0) AS filtered FROM outbox.stats WHERE target = 'f_http';
SELECT outbox.drop_target('f_http');
