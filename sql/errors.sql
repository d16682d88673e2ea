-- Bad input gets a clear error and changes nothing.
TRUNCATE outbox.messages;
-- Each error is followed by its SQLSTATE.
\set SHOW_CONTEXT never

-- Topic.
SELECT outbox_emit(NULL, '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit(repeat('t', 256), '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('orders created', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('orders.*', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit(E'orders\ncreated', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit(repeat('t', 255), '{}') IS NOT NULL AS longest_topic_ok;

-- Key.
SELECT outbox_emit('t', '{}', repeat('k', 1025));
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', E'line\r\nbreak');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', repeat('k', 1024)) IS NOT NULL AS longest_key_ok;

-- Payload.
SELECT outbox_emit('t', NULL);
\echo :LAST_ERROR_SQLSTATE
SET outbox.max_payload_size = '1kB';
SELECT outbox_emit('t', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', jsonb_build_object('blob', repeat('x', 900))) IS NOT NULL AS under_limit_ok;
RESET outbox.max_payload_size;
SELECT outbox_emit('t', jsonb_build_object('blob', repeat('x', 1100000)));
\echo :LAST_ERROR_SQLSTATE


-- Headers.
SELECT outbox_emit('t', '{}', NULL, '"text"');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '["x-a", "b"]');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"x-count": 3}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"x-nested": {"a": "b"}}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"x-null": null}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"x-crlf": "a\r\nInjected: yes"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"bad name": "v"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"": "v"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"Webhook-Signature": "v1,forged"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"content-type": "text/plain"}');
\echo :LAST_ERROR_SQLSTATE
-- Twins: receivers that read "_" as "-" (CGI, WSGI) would take these for
-- the relay's own headers.
SELECT outbox_emit('t', '{}', NULL, '{"webhook_signature": "v1,Zm9yZ2Vk"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox_emit('t', '{}', NULL, '{"Webhook_Id": "x"}');
SELECT outbox_emit('t', '{}', NULL, '{"outbox_seq": "1"}');
SELECT outbox_emit('t', '{}', NULL, '{"NATS_Msg_Id": "x"}');
SELECT outbox_emit('t', '{}', NULL, '{"content_type": "text/plain"}');
SELECT outbox_emit('t', '{}', NULL, '{"x_tenant": "acme", "ce_type": "t"}') IS NOT NULL AS other_underscores_ok;
SELECT outbox_emit('t', '{}', NULL, '{}') IS NOT NULL AS empty_headers_ok;
SELECT outbox_emit('t', '{}', NULL, '{"x-tab": "a\tb", "X-Trace_Id.v2": "ok"}') IS NOT NULL AS fine_headers_ok;

-- A failed call inside a transaction aborts it: nothing of it is stored.
BEGIN;
SELECT outbox_emit('t.aborted', '{}') IS NOT NULL AS emitted;
SELECT outbox_emit('', '{}');
\echo :LAST_ERROR_SQLSTATE
COMMIT;
SELECT count(*) AS aborted FROM outbox.messages WHERE topic = 't.aborted';

-- Read-only transactions are refused at the call.
BEGIN READ ONLY;
SELECT outbox_emit('t', '{}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET default_transaction_read_only = on;
SELECT outbox_emit('t', '{}');
\echo :LAST_ERROR_SQLSTATE
RESET default_transaction_read_only;

-- PREPARE TRANSACTION after an emit is refused and emits nothing.  (The
-- test instance has max_prepared_transactions = 0; the TAP tests cover a
-- server that allows prepared transactions.)
BEGIN;
SELECT outbox_emit('t.prepared', '{}') IS NOT NULL AS emitted;
PREPARE TRANSACTION 'outbox_test';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS prepared FROM outbox.messages WHERE topic = 't.prepared';

-- Parallel workers are refused, even when a wrapper hides the call.
CREATE FUNCTION sneaky_emit() RETURNS uuid
LANGUAGE sql PARALLEL SAFE AS $$ SELECT outbox_emit('t.parallel', '{}') $$;
-- (force_parallel_mode was renamed debug_parallel_query in 16.)
SELECT CASE WHEN current_setting('server_version_num')::int >= 160000
			THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END AS parallel_guc \gset
SET :parallel_guc = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SELECT sneaky_emit();
\echo :LAST_ERROR_SQLSTATE
RESET :parallel_guc;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
SELECT count(*) AS parallel FROM outbox.messages WHERE topic = 't.parallel';

-- Only the owner may change max_payload_size.
CREATE ROLE outbox_limited;
SET ROLE outbox_limited;
SET outbox.max_payload_size = '10MB';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- Unknown settings in the outbox namespace are refused.
SET outbox.no_such_setting = 1;
\echo :LAST_ERROR_SQLSTATE

-- Everything that succeeded above is there; nothing that failed is.
SELECT left(topic, 12) AS topic, count(*) FROM outbox.messages GROUP BY 1 ORDER BY 1;

-- Other databases are refused: the relay serves only outbox.database.
CREATE DATABASE outbox_other;
\c outbox_other
CREATE EXTENSION outbox;
SELECT outbox_emit('t', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.frontier();
\echo :LAST_ERROR_SQLSTATE
\c contrib_regression
DROP DATABASE outbox_other;
