-- Targets and subscriptions: the relay's configuration.  (Delivery itself
-- is covered by the TAP tests; outbox.enabled is off here.)
SELECT outbox.create_http_target('billing', 'http://127.0.0.1:9/hooks/billing');
SELECT outbox.create_http_target('audit', 'https://localhost:8443/audit',
	headers => '{"authorization": "Bearer abc"}',
	secret => 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
	batch_size => 50, lanes => 4, max_attempts => 0, timeout_ms => 2000);
SELECT outbox.create_http_target('ledger', 'http://127.0.0.1:9/ledger', lanes => 16, ordering => 'strict');
SELECT outbox.create_notify_target('listeners', 'outbox_events');
SELECT name, kind, url, channel, headers, secret IS NOT NULL AS signed, batch_size, lanes, ordering,
	   max_attempts, timeout_ms
  FROM outbox.targets ORDER BY id;
-- One progress row per lane, starting at the frontier.
SELECT t.name, count(*) AS lanes, bool_and(p.done_id = outbox.frontier()) AS at_frontier
  FROM outbox.targets t JOIN outbox.progress p ON p.target_id = t.id
 GROUP BY t.name ORDER BY t.name;

-- Subscriptions: exact topics, prefix patterns, everything.
SELECT outbox.subscribe('billing', 'orders.created');
SELECT outbox.subscribe('billing', 'invoices.*');
SELECT outbox.subscribe('audit', '*');
SELECT outbox.subscribe('listeners', 'orders.*');
SELECT outbox.subscribe('billing', 'orders.created');	-- already: a notice
SELECT t.name, s.pattern, s.start_id = outbox.frontier() AS starts_at_frontier
  FROM outbox.subscriptions s JOIN outbox.targets t ON t.id = s.target_id
 ORDER BY t.name, s.pattern;
SELECT outbox.unsubscribe('billing', 'invoices.*');
SELECT outbox.unsubscribe('billing', 'invoices.*');	-- not subscribed: a notice
SELECT count(*) AS billing_subscriptions
  FROM outbox.subscriptions WHERE target_id = outbox.target_id('billing');

-- Pattern matching.
SELECT p, t, outbox.topic_matches(p, t)
  FROM (VALUES ('*', 'anything'), ('orders.*', 'orders.created'), ('orders.*', 'orders'),
			   ('orders.*', 'ordersX'), ('orders.created', 'orders.created'),
			   ('orders.created', 'orders.created.v2'), ('orders*', 'ordersX')) v(p, t);

-- The lag view: nothing emitted yet for anyone.
SELECT target, kind, pending, pending_is_estimate, dead_letters, last_error FROM outbox.lag ORDER BY target;
SELECT outbox_emit('orders.created', '{"order": 1}', 'c1') IS NOT NULL AS emitted;
SELECT outbox_emit('orders.cancelled', '{"order": 1}', 'c1') IS NOT NULL AS emitted;
SELECT outbox_emit('invoices.paid', '{"invoice": 7}') IS NOT NULL AS emitted;
SELECT target, pending, pending_is_estimate, oldest_pending IS NOT NULL AS has_oldest
  FROM outbox.lag ORDER BY target;

-- Bad input.
\set SHOW_CONTEXT never
SELECT outbox.create_http_target('billing', 'http://127.0.0.1:9/other');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('bad name', 'http://127.0.0.1:9/');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'ftp://example.com/file');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://exa mple.com/');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', headers => '["a"]');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', headers => '{"x-a": 1}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', headers => '{"x-a": "a\r\nb: c"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', headers => '{"webhook-id": "forged"}');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', secret => 'secret');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', secret => 'whsec_c2hvcnQ=');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', batch_size => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', lanes => 1000);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', ordering => 'random');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', max_attempts => -1);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('t1', 'http://x/', timeout_ms => 0);
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_notify_target('t1', '');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.subscribe('nobody', 'orders.*');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.subscribe('billing', 'or*ders');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.subscribe('billing', '');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.drop_target('nobody');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS targets_after_errors FROM outbox.targets;

-- Only the owner manages targets.
CREATE ROLE outbox_intruder;
GRANT USAGE ON SCHEMA outbox TO outbox_intruder;
SET ROLE outbox_intruder;
SELECT outbox.create_http_target('evil', 'http://127.0.0.1:9/');
SELECT count(*) FROM outbox.targets;
SELECT * FROM outbox.lag;
RESET ROLE;
REVOKE USAGE ON SCHEMA outbox FROM outbox_intruder;

-- Dropping a target removes its subscriptions and progress.
SELECT outbox.drop_target('billing');
SELECT count(*) AS leftover FROM outbox.subscriptions s
 WHERE NOT EXISTS (SELECT 1 FROM outbox.targets t WHERE t.id = s.target_id);
SELECT name FROM outbox.targets ORDER BY id;

-- Broker targets: their options checked at create and alter time, each
-- kind taking only its own.
SELECT outbox.create_nats_target('js', 'nats://127.0.0.1:4222,nats://[::1]:4223', subject => 'orders.{topic}');
SELECT outbox.create_kafka_target('kf', '127.0.0.1:9092', topic => 'outbox.{topic}',
                                  properties => '{"linger.ms": 5, "compression.type": "zstd"}');
SELECT name, kind, url, subject, topic, properties, batch_size, lanes, timeout_ms
  FROM outbox.targets WHERE kind IN ('nats', 'kafka') ORDER BY id;
SELECT outbox.create_nats_target('x', 'nats://:4222');
SELECT outbox.create_nats_target('x', 'nats://127.0.0.1:99999');
SELECT outbox.create_nats_target('x', 'tls://127.0.0.1:4222');
-- TLS by host name, credentials in the url (never shown), TLS files
SELECT outbox.create_nats_target('nats_tls', 'tls://relay:s3cret@nats-1.internal:4222, tls://relay:s3cret@nats-1.internal:4223',
								 ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT kind, ca_file, credentials FROM outbox.targets WHERE name = 'nats_tls';
SELECT outbox.create_nats_target('x', 'tls://a.internal:4222,nats://b.internal:4222');
SELECT outbox.create_nats_target('x', 'tls://a.internal:4222,tls://b.internal:4222');
SELECT outbox.create_nats_target('x', 'nats://u:s3cret@a.internal:4222,nats://u:other@a.internal:4223');
SELECT outbox.create_nats_target('x', 'nats://u:@a.internal:4222');
SELECT outbox.create_nats_target('x', 'nats://a.internal:4222', ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT outbox.create_nats_target('x', 'nats://a.internal:4222', credentials => '/etc/hostname');
SELECT outbox.create_nats_target('x', 'nats://a.internal:4222', credentials => 'relative.creds');
SELECT outbox.alter_target('nats_tls', credentials => '/nonexistent/u.creds');
SELECT outbox.drop_target('nats_tls');
SELECT outbox.create_nats_target('x', 'nats://127.0.0.1:4222', subject => 'a.*.b');
SELECT outbox.create_nats_target('x', 'nats://127.0.0.1:4222', subject => NULL);
SELECT outbox.create_nats_target('x', 'nats://127.0.0.1:4222', lanes => 0);
SELECT outbox.create_kafka_target('x', '127.0.0.1');
SELECT outbox.create_kafka_target('x', '127.0.0.1:9092', topic => '{key}');
SELECT outbox.create_kafka_target('x', '127.0.0.1:9092', properties => '{"debug": "all"}');
SELECT outbox.create_kafka_target('x', '127.0.0.1:9092', properties => '{"linger.ms": [1]}');
SELECT outbox.create_kafka_target('x', '127.0.0.1:9092', properties => '{"max.in.flight": 6}');
SELECT outbox.alter_target('js', subject => 'orders.{key}', lanes => 4);
SELECT outbox.alter_target('js', topic => 'x');
SELECT outbox.alter_target('kf', subject => 'x');
SELECT outbox.alter_target('kf', headers => '{}');
SELECT outbox.alter_target('kf', properties => '{"acks": 0}');
SELECT outbox.alter_target('kf', properties => '{"acks": "all"}', topic => 'fixed');
SELECT outbox.create_http_target('hb', 'http://127.0.0.1:9/');
SELECT outbox.alter_target('hb', subject => 'x');
SELECT outbox.drop_target('hb');
SELECT name, subject, topic, properties, pending_lanes FROM outbox.targets
 WHERE kind IN ('nats', 'kafka') ORDER BY id;
SELECT outbox.drop_target('js');
SELECT outbox.drop_target('kf');
-- JetStream acts on nats-* headers: a message may not carry one.
BEGIN;
SELECT outbox_emit('t', '{}', NULL, '{"Nats-Expected-Stream": "OTHER"}');
ROLLBACK;
-- Files the relay would read for a Kafka target: pg_read_server_files only.
CREATE ROLE outbox_kafka_admin;
GRANT USAGE ON SCHEMA outbox TO outbox_kafka_admin;
GRANT EXECUTE ON FUNCTION outbox.check_kafka_target(text, text, jsonb) TO outbox_kafka_admin;
SET ROLE outbox_kafka_admin;
SELECT outbox.check_kafka_target('127.0.0.1:9092', 'x', '{"linger.ms": 5}');
SELECT outbox.check_kafka_target('127.0.0.1:9092', 'x', '{"ssl.ca.location": "/etc/passwd"}');
RESET ROLE;
GRANT pg_read_server_files TO outbox_kafka_admin;
SET ROLE outbox_kafka_admin;
SELECT outbox.check_kafka_target('127.0.0.1:9092', 'x', '{"ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt"}');
RESET ROLE;
REVOKE USAGE ON SCHEMA outbox FROM outbox_kafka_admin;
REVOKE EXECUTE ON FUNCTION outbox.check_kafka_target(text, text, jsonb) FROM outbox_kafka_admin;
DROP ROLE outbox_kafka_admin;
