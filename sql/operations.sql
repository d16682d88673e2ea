-- Operating targets: states, admin functions and their errors, the
-- monitoring views' shapes.  (Delivery is covered by TAP 029 and 030;
-- outbox.enabled is off here.)  Error contexts are left out: their wording
-- differs between PostgreSQL versions, the messages and hints do not.
\set SHOW_CONTEXT never
SELECT outbox.create_http_target('ops', 'http://127.0.0.1:9/ops', lanes => 2);
SELECT outbox.create_notify_target('ops_notify', 'ops_channel');
SELECT outbox.subscribe('ops', 'ops.*');
SELECT count(outbox_emit('ops.created', jsonb_build_object('n', g), 'k' || (g % 3)))
  FROM generate_series(1, 6) g;

-- pause and resume return the messages pending; a second call says so.
SELECT outbox.pause_target('ops');
SELECT outbox.pause_target('ops');
SELECT name, state, state_reason LIKE 'paused by %' AS says_who FROM outbox.targets WHERE name = 'ops';
SELECT target, state, pending FROM outbox.lag WHERE target = 'ops';
SELECT outbox.resume_target('ops');
SELECT outbox.resume_target('ops');
SELECT name, state, state_reason FROM outbox.targets WHERE name = 'ops';

-- Unknown targets.
SELECT outbox.pause_target('nope');
SELECT outbox.resume_target('nope');
SELECT outbox.retry_dead_letters('nope');
SELECT outbox.discard_dead_letters('nope');
SELECT outbox.replay('nope', 1::bigint);
SELECT outbox.replay('nope', now());
SELECT outbox.alter_target('nope', batch_size => 2);
SELECT outbox.pause_target(NULL);

-- Dead letters: none yet; an id that is not one.
SELECT outbox.retry_dead_letters('ops');
SELECT outbox.discard_dead_letters('ops');
SELECT outbox.retry_dead_letters('ops', 12345);
SELECT outbox.discard_dead_letters('ops', 12345);
-- Written as the relay would: retry marks, discard removes, each counts.
INSERT INTO outbox.dead_letters (target, id, msg_id, topic, key, attempts, payload, emitted_at)
SELECT 'ops', m.id, m.msg_id, m.topic, m.key, 3, m.payload, m.emitted_at
  FROM outbox.messages m WHERE m.topic = 'ops.created' ORDER BY m.id LIMIT 3;
SELECT outbox.retry_dead_letters('ops', (SELECT min(id) FROM outbox.dead_letters));
SELECT outbox.retry_dead_letters('ops');
SELECT count(*) FILTER (WHERE retry_requested_at IS NOT NULL) AS to_retry FROM outbox.dead_letters;
SELECT outbox.discard_dead_letters('ops', (SELECT max(id) FROM outbox.dead_letters));
SELECT outbox.discard_dead_letters('ops');
-- A dead letter from 0.1 whose message is gone cannot be delivered again.
INSERT INTO outbox.dead_letters (target, id, msg_id, topic, attempts)
VALUES ('ops', 1, gen_random_uuid(), 'ops.created', 3);
SELECT outbox.retry_dead_letters('ops');
SELECT outbox.discard_dead_letters('ops', 1);

-- Replay: bad values, not retained, and a replay that moves lanes back.
SELECT outbox.replay('ops', NULL::bigint);
SELECT outbox.replay('ops', 0::bigint);
SELECT outbox.replay('ops', NULL::timestamptz);
UPDATE outbox.state SET id_high_water = 3, removed_before = '2026-01-01 12:00:00+00';
SELECT outbox.replay('ops', 2::bigint);
SELECT outbox.replay('ops', '2026-01-01 11:00:00+00'::timestamptz);
SELECT outbox.replay('ops', (SELECT min(id) FROM outbox.messages WHERE topic = 'ops.created'));
UPDATE outbox.progress SET done_id = outbox.frontier() WHERE target_id = outbox.target_id('ops');
SELECT outbox.replay('ops', (SELECT min(id) + 2 FROM outbox.messages WHERE topic = 'ops.created'));
SELECT lane, done_id = (SELECT min(id) + 1 FROM outbox.messages WHERE topic = 'ops.created') AS moved_back,
	   generation FROM outbox.progress WHERE target_id = outbox.target_id('ops') ORDER BY lane;
SELECT outbox.replay('ops', '2100-01-01 00:00:00+00'::timestamptz);
UPDATE outbox.state SET id_high_water = 0, removed_before = NULL;

-- alter_target: each option, the resets, bad values, the wrong kind.
SELECT outbox.alter_target('ops', url => 'https://localhost:8443/ops', batch_size => 10,
						   headers => '{"x-env": "test"}', timeout_ms => 500, max_attempts => 3,
						   secret => 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
						   max_rate => 25, disable_after => '1 hour');
SELECT outbox.alter_target('ops', batch_size => 10);
SELECT outbox.alter_target('ops', lanes => 4);
SELECT url, batch_size, headers, timeout_ms, max_attempts, secret IS NOT NULL AS signed, max_rate,
	   disable_after, lanes, pending_lanes, pending_ordering
  FROM outbox.targets WHERE name = 'ops';
SELECT outbox.alter_target('ops', secret => '', max_rate => 0, disable_after => '0');
SELECT outbox.alter_target('ops', ordering => 'strict');
SELECT outbox.alter_target('ops', lanes => 3);
SELECT secret, max_rate, disable_after, lanes, pending_lanes, pending_ordering
  FROM outbox.targets WHERE name = 'ops';
SELECT outbox.alter_target('ops', url => 'ftp://example.com/');
SELECT outbox.alter_target('ops', batch_size => 0);
SELECT outbox.alter_target('ops', lanes => 1000);
SELECT outbox.alter_target('ops', ordering => 'random');
SELECT outbox.alter_target('ops', timeout_ms => 1);
SELECT outbox.alter_target('ops', max_attempts => -1);
SELECT outbox.alter_target('ops', max_rate => -5);
SELECT outbox.alter_target('ops', max_rate => 'NaN');
SELECT outbox.alter_target('ops', disable_after => '-1 day');
SELECT outbox.alter_target('ops', headers => '{"host": "x"}');
SELECT outbox.alter_target('ops', secret => 'not-a-secret');
SELECT outbox.alter_target('ops_notify', url => 'http://127.0.0.1:9/');
SELECT outbox.alter_target('ops_notify', max_attempts => 5, disable_after => '2 days');
SELECT outbox.alter_target('ops_notify', max_attempts => 2000000);
SELECT name, max_attempts, disable_after FROM outbox.targets WHERE name = 'ops_notify';
-- The table's constraints hold for rows written by hand.
\set VERBOSITY terse
UPDATE outbox.targets SET state = 'sleeping' WHERE name = 'ops';
UPDATE outbox.targets SET max_rate = 0 WHERE name = 'ops';
UPDATE outbox.targets SET disable_after = '-1 hour' WHERE name = 'ops';
UPDATE outbox.targets SET pending_lanes = 0 WHERE name = 'ops';
\set VERBOSITY default

-- No privilege: an application role may emit and nothing else.
CREATE ROLE outbox_ops_app;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO outbox_ops_app;
GRANT USAGE ON SCHEMA outbox TO outbox_ops_app;
SET ROLE outbox_ops_app;
SELECT outbox.pause_target('ops');
SELECT outbox.resume_target('ops');
SELECT outbox.retry_dead_letters('ops');
SELECT outbox.discard_dead_letters('ops');
SELECT outbox.replay('ops', 1::bigint);
SELECT outbox.replay('ops', now());
SELECT outbox.alter_target('ops', batch_size => 2);
SELECT outbox.reset_stats();
SELECT outbox.metrics();
SELECT * FROM outbox.stats;
SELECT * FROM outbox.worker;
RESET ROLE;
REVOKE ALL ON SCHEMA outbox FROM outbox_ops_app;
REVOKE ALL ON FUNCTION outbox_emit(text, jsonb, text, jsonb) FROM outbox_ops_app;
DROP ROLE outbox_ops_app;

-- The views' columns.
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'outbox.lag'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'outbox.stats'::regclass AND attnum > 0 ORDER BY attnum;
SELECT attname, format_type(atttypid, atttypmod)
  FROM pg_attribute WHERE attrelid = 'outbox.worker'::regclass AND attnum > 0 ORDER BY attnum;
SELECT count(*) >= 1 AS relay_listed, bool_and(pid IS NOT NULL) AS has_pid,
	   bool_and(current_chunk BETWEEN 1 AND 4) AS chunk FROM outbox.worker;
SELECT outbox.reset_stats();
SELECT outbox.metrics() LIKE '# HELP outbox_pending_messages %' AS metrics_text,
	   outbox.metrics() ~ 'outbox_pending_messages\{target="ops"\} \d+' AS ops_pending;

-- Retention: the chunks, and the step's argument check.
SELECT chunk, relname, is_current FROM outbox.chunks ORDER BY chunk;
SELECT count(*) AS chunk_tables FROM pg_inherits WHERE inhparent = 'outbox.messages'::regclass;
SELECT * FROM outbox.retention_step(interval '-1 second');
SELECT * FROM outbox.retention_step(NULL);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM outbox.retention_step(interval '1 hour');
ROLLBACK;

SELECT outbox.drop_target('ops');
SELECT outbox.drop_target('ops_notify');
