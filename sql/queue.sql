-- Queues: outbox.receive() inside the caller's transaction.  Receiving
-- needs no relay (outbox.enabled is off here); concurrency, killed
-- sessions and waiting are covered by TAP 040-042.  Ids depend on the
-- tests before this one, so rows show payloads and keys.
\set SHOW_CONTEXT never
\set VERBOSITY default

SELECT outbox.create_queue('work');
SELECT outbox.subscribe('work', 'job.*');
SELECT outbox.create_queue('other');
SELECT outbox.subscribe('other', 'other');

-- Three emitting transactions: a, b (one transaction of three), c.
SELECT outbox_emit('job.a', '{"n": 1}', 'k1') IS NOT NULL AS emitted;
BEGIN;
SELECT outbox_emit('job.b', '{"n": 2}', 'k2') IS NOT NULL AS emitted;
SELECT outbox_emit('skipped', '{"n": 0}', 'k2') IS NOT NULL AS emitted;	-- no queue
SELECT outbox_emit('job.b', '{"n": 3}', 'k1') IS NOT NULL AS emitted;
SELECT outbox_emit('job.b', '{"n": 4}', NULL) IS NOT NULL AS emitted;
COMMIT;
SELECT outbox_emit('job.c', '{"n": 5}', 'k3', '{"h": "v"}') IS NOT NULL AS emitted;

SELECT queue, pending, held, received FROM outbox.queues ORDER BY queue;

-- Receive and roll back: the messages come back, in their order.
BEGIN;
SELECT topic, key, payload, receive_count FROM outbox.receive('work', 2);
SELECT queue, held, receivers FROM outbox.queues WHERE queue = 'work';
SELECT target, kind, state, held, receivers FROM outbox.lag WHERE target = 'work';
ROLLBACK;
BEGIN;
SELECT topic, key, payload, receive_count FROM outbox.receive('work', 2);
-- A second receive in the same transaction goes on after the first.
SELECT topic, key, payload, receive_count FROM outbox.receive('work', 1);
COMMIT;

-- What was committed is gone; the rest follows.
SELECT queue, pending, held, received, acknowledged, rolled_back FROM outbox.queues WHERE queue = 'work';

-- A rolled-back savepoint returns what was received inside it.
BEGIN;
SAVEPOINT s;
SELECT payload, receive_count FROM outbox.receive('work', 1);
ROLLBACK TO SAVEPOINT s;
SELECT payload, receive_count FROM outbox.receive('work', 1);
-- An error inside a savepoint too.
SAVEPOINT t;
SELECT payload, (1 / 0) FROM outbox.receive('work', 1);
ROLLBACK TO SAVEPOINT t;
RELEASE SAVEPOINT s;
ROLLBACK;

-- An error rolls back the whole transaction: receive_count keeps counting.
BEGIN;
SELECT payload, receive_count, headers FROM outbox.receive('work', 5);
SELECT 1 / 0;
COMMIT;

-- Nothing left after a committed receive; an empty queue returns no rows.
SELECT payload, receive_count FROM outbox.receive('work', 5);
SELECT count(*) FROM outbox.receive('work', 5);
SELECT count(*) FROM outbox.receive('work', 1, 50);	-- waits 50 ms

---------------------------------------------------------------------------
-- whole_transactions: a transaction's messages are never split.
---------------------------------------------------------------------------
BEGIN;
SELECT outbox_emit('job.g', jsonb_build_object('g', 1, 'i', i), 'g1-' || i) IS NOT NULL AS emitted
  FROM generate_series(1, 3) i;
COMMIT;
BEGIN;
SELECT outbox_emit('job.g', jsonb_build_object('g', 2, 'i', i), 'g2-' || i) IS NOT NULL AS emitted
  FROM generate_series(1, 2) i;
COMMIT;
-- max_messages 4 takes the first transaction (3) but not half the second.
BEGIN;
SELECT payload FROM outbox.receive('work', 4, 0, whole_transactions => true);
ROLLBACK;
-- A transaction larger than max_messages comes whole.
BEGIN;
SELECT payload FROM outbox.receive('work', 2, 0, whole_transactions => true);
ROLLBACK;
-- Without it, max_messages cuts.
BEGIN;
SELECT payload FROM outbox.receive('work', 4);
COMMIT;
SELECT payload FROM outbox.receive('work', 4, 0, true);

---------------------------------------------------------------------------
-- A message rolled back outbox.max_receives times becomes a dead letter,
-- and the messages after it flow.
---------------------------------------------------------------------------
SET outbox.max_receives = 2;
SELECT outbox_emit('job.poison', '{"p": 1}', 'kp') IS NOT NULL AS emitted;
SELECT outbox_emit('job.poison', '{"p": 2}', 'kp') IS NOT NULL AS emitted;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
ROLLBACK;
SELECT queue, poisoned, rolled_back FROM outbox.queues WHERE queue = 'work';
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT target, topic, key, attempts, last_error, payload FROM outbox.dead_letters WHERE target = 'work';
COMMIT;
SELECT target, topic, key, attempts, payload FROM outbox.dead_letters WHERE target = 'work';
SELECT outbox.retry_dead_letters('work');
SELECT outbox.discard_dead_letters('work');
RESET outbox.max_receives;

---------------------------------------------------------------------------
-- Which rollbacks count toward outbox.max_receives (the table in
-- docs/queues.md).  Each case rolls message kr1 back; the view shows
-- rolled_back growing and rolled_back_counted only for the cases that
-- count.
---------------------------------------------------------------------------
SET outbox.max_receives = 3;
SELECT outbox_emit('job.rule', '{"r": 1}', 'kr1') IS NOT NULL AS emitted;
CREATE TEMP TABLE rb_before AS
  SELECT rolled_back, rolled_back_counted FROM outbox.queues WHERE queue = 'work';
CREATE FUNCTION pg_temp.rb() RETURNS TABLE (rolled_back bigint, counted bigint, poisoned int)
LANGUAGE sql AS $$
  SELECT q.rolled_back - b.rolled_back, q.rolled_back_counted - b.rolled_back_counted, q.poisoned
    FROM outbox.queues q, rb_before b WHERE q.queue = 'work' $$;
CREATE FUNCTION pg_temp.fail(code text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'consumer failed' USING ERRCODE = code; END $$;
-- Transaction-rollback errors (class 40), however often: do not count.
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('serialization_failure');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('deadlock_detected');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('40000');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('serialization_failure');
ROLLBACK;
-- lock_timeout, disk full, out of memory, an I/O error: do not count.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('lock_not_available');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('disk_full');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('out_of_memory');
ROLLBACK;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('io_error');
ROLLBACK;
SELECT * FROM pg_temp.rb();
-- A serialization failure inside a savepoint, then the client's ROLLBACK
-- (its retry): does not count.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SAVEPOINT s1;
SELECT pg_temp.fail('serialization_failure');
ROLLBACK TO s1;
ROLLBACK;
SELECT * FROM pg_temp.rb();
-- The consumer's own error: counts.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('P0001');
ROLLBACK;
SELECT * FROM pg_temp.rb();
-- An error inside a savepoint the client rolls back to: counts for the
-- messages received in it; the transaction goes on and commits nothing.
BEGIN;
SAVEPOINT s1;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('unique_violation');
ROLLBACK TO s1;
COMMIT;
SELECT * FROM pg_temp.rb();
-- statement_timeout: counts.  The third counted rollback poisons kr1.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SET LOCAL statement_timeout = '20ms';
SELECT pg_sleep(5);
ROLLBACK;
SELECT * FROM pg_temp.rb();
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT topic, key, attempts, last_error FROM outbox.dead_letters WHERE target = 'work';
COMMIT;
-- An explicit ROLLBACK counts, and so does an error caught by a PL/pgSQL
-- EXCEPTION block around the receive (its cause is not reported).
SELECT outbox_emit('job.rule', '{"r": 2}', 'kr2') IS NOT NULL AS emitted;
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
ROLLBACK;
DO $$
BEGIN
	BEGIN
		PERFORM outbox.receive('work');
		PERFORM pg_temp.fail('serialization_failure');
	EXCEPTION WHEN serialization_failure THEN
		RAISE NOTICE 'caught';
	END;
END $$;
SELECT * FROM pg_temp.rb();
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
COMMIT;
-- Errors that abort the transaction before they are reported: a failed
-- COMMIT inside a procedure, and an error a PL/pgSQL block with EXCEPTION
-- does not catch.  Classified by the error when it is reported.
SET outbox.max_receives = 100;
SELECT outbox_emit('job.rule', '{"r": 3}', 'kr3') IS NOT NULL AS emitted;
CREATE TABLE rb_defer (code text);
CREATE FUNCTION rb_defer_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'failed at commit' USING ERRCODE = NEW.code; END $$;
CREATE CONSTRAINT TRIGGER rb_defer_fail AFTER INSERT ON rb_defer
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rb_defer_fail();
CREATE PROCEDURE rb_consume(code text) LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox.receive('work');
	INSERT INTO rb_defer VALUES (code);
	COMMIT;
END $$;
CALL rb_consume('serialization_failure');
SELECT * FROM pg_temp.rb();
CALL rb_consume('P0001');
SELECT * FROM pg_temp.rb();
DO $$
BEGIN
	PERFORM outbox.receive('work');
	PERFORM pg_temp.fail('serialization_failure');
EXCEPTION WHEN unique_violation THEN
	RAISE NOTICE 'not this one';
END $$;
SELECT * FROM pg_temp.rb();
-- An error recovered from (ROLLBACK TO) does not decide later rollbacks:
-- while kr3 is held, a deadlock inside a savepoint is rolled back to; a
-- receive after it (kr4) whose block catches its own error counts.
SELECT outbox_emit('job.rule', '{"r": 4}', 'kr4') IS NOT NULL AS emitted;
BEGIN;
SELECT payload FROM outbox.receive('work');
SAVEPOINT s1;
SELECT pg_temp.fail('deadlock_detected');
ROLLBACK TO s1;
DO $$
BEGIN
	PERFORM outbox.receive('work');
	PERFORM pg_temp.fail('P0001');
EXCEPTION WHEN raise_exception THEN
	RAISE NOTICE 'caught';
END $$;
COMMIT;
SELECT * FROM pg_temp.rb();
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
COMMIT;
DROP PROCEDURE rb_consume(text);
DROP TABLE rb_defer;
DROP FUNCTION rb_defer_fail();
-- A handler that runs statements and then raises again: decided by the
-- error raised again, whether its statements were planned before or not.
SELECT outbox_emit('job.rule', '{"r": 5}', 'kr5') IS NOT NULL AS emitted;
CREATE TABLE rb_log (code text);
CREATE FUNCTION rb_reraise() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		PERFORM outbox.receive('work');
		PERFORM pg_temp.fail('serialization_failure');
	EXCEPTION WHEN others THEN
		INSERT INTO rb_log VALUES (SQLSTATE);
		RAISE NOTICE 'consumer failed: %', SQLERRM;
		RAISE;
	END;
END $$;
SELECT rb_reraise();
SELECT * FROM pg_temp.rb();
SELECT rb_reraise();
SELECT * FROM pg_temp.rb();
-- An explicit ROLLBACK is not decided by an error of a later statement,
-- nor, in a procedure, by an error after its ROLLBACK.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
ROLLBACK;
SELECT pg_temp.fail('serialization_failure');
SELECT * FROM pg_temp.rb();
CREATE PROCEDURE rb_rollback_then_fail() LANGUAGE plpgsql AS $$
BEGIN
	PERFORM outbox.receive('work');
	ROLLBACK;
	PERFORM pg_temp.fail('serialization_failure');
END $$;
CALL rb_rollback_then_fail();
SELECT * FROM pg_temp.rb();
CALL rb_rollback_then_fail();
SELECT * FROM pg_temp.rb();
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
COMMIT;
-- A procedure whose block catches an error around a receive, then fails
-- at COMMIT with a serialization failure: the caught error's rollback is
-- decided by that failure, as it would be for a client's COMMIT.
SELECT outbox_emit('job.rule', '{"r": 6}', 'kr6') IS NOT NULL AS emitted;
CREATE TABLE rb_defer (code text);
CREATE FUNCTION rb_defer_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'failed at commit' USING ERRCODE = NEW.code; END $$;
CREATE CONSTRAINT TRIGGER rb_defer_fail AFTER INSERT ON rb_defer
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION rb_defer_fail();
CREATE PROCEDURE rb_caught_then_commit_fails() LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		PERFORM outbox.receive('work');
		PERFORM pg_temp.fail('P0001');
	EXCEPTION WHEN raise_exception THEN
		NULL;
	END;
	INSERT INTO rb_defer VALUES ('serialization_failure');
	COMMIT;
END $$;
CALL rb_caught_then_commit_fails();
SELECT * FROM pg_temp.rb();
-- A file the message names that does not exist (58P01) counts.
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
SELECT pg_temp.fail('undefined_file');
ROLLBACK;
SELECT * FROM pg_temp.rb();
BEGIN;
SELECT payload, receive_count FROM outbox.receive('work');
COMMIT;
DROP PROCEDURE rb_caught_then_commit_fails();
DROP TABLE rb_defer;
DROP FUNCTION rb_defer_fail();
DROP PROCEDURE rb_rollback_then_fail();
DROP FUNCTION rb_reraise();
DROP TABLE rb_log;

---------------------------------------------------------------------------
-- Real poison: processing that always fails (here, a payload that is not
-- a number) becomes a dead letter after max_receives rollbacks, under
-- READ COMMITTED and under SERIALIZABLE.
---------------------------------------------------------------------------
SET outbox.max_receives = 2;
CREATE TEMP TABLE processed (n int);
SELECT outbox_emit('job.rule', '{"n": "x"}', 'kn') IS NOT NULL AS emitted;
SELECT outbox_emit('job.rule', '{"n": "1"}', 'kn') IS NOT NULL AS emitted;
BEGIN ISOLATION LEVEL READ COMMITTED;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
ROLLBACK;
BEGIN ISOLATION LEVEL READ COMMITTED;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
ROLLBACK;
BEGIN ISOLATION LEVEL READ COMMITTED;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
COMMIT;
SELECT outbox_emit('job.rule', '{"n": "y"}', 'ks') IS NOT NULL AS emitted;
SELECT outbox_emit('job.rule', '{"n": "2"}', 'ks') IS NOT NULL AS emitted;
BEGIN ISOLATION LEVEL SERIALIZABLE;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
INSERT INTO processed SELECT (payload->>'n')::int FROM outbox.receive('work');
COMMIT;
SELECT n FROM processed ORDER BY n;
SELECT key, payload, attempts, last_error FROM outbox.dead_letters
 WHERE target = 'work' AND topic = 'job.rule' ORDER BY id;
SELECT outbox.discard_dead_letters('work');
RESET outbox.max_receives;

---------------------------------------------------------------------------
-- Rights: superusers and the extension's owner receive; others need
-- outbox.grant_receive.
---------------------------------------------------------------------------
SELECT outbox_emit('job.r', '{"r": 1}', 'kr') IS NOT NULL AS emitted;
CREATE ROLE queue_app;
GRANT USAGE ON SCHEMA outbox TO queue_app;
GRANT EXECUTE ON FUNCTION outbox.receive(text, int, int, boolean) TO queue_app;
SET ROLE queue_app;
SELECT * FROM outbox.receive('work');
SELECT * FROM outbox.receipts;
SELECT outbox.grant_receive('work', 'queue_app');
RESET ROLE;
SELECT outbox.grant_receive('work', 'queue_app');
SELECT outbox.grant_receive('work', 'queue_app');	-- already granted
SET ROLE queue_app;
BEGIN;
SELECT topic, payload FROM outbox.receive('work');
ROLLBACK;
SELECT * FROM outbox.receive('other');
RESET ROLE;
SELECT outbox.revoke_receive('work', 'queue_app');
SELECT outbox.revoke_receive('work', 'queue_app');	-- not granted any more
SET ROLE queue_app;
SELECT * FROM outbox.receive('work');
RESET ROLE;
-- A grant deleted by hand is gone at once too.
SELECT outbox.grant_receive('work', 'queue_app');
SET ROLE queue_app;
BEGIN;
SELECT topic FROM outbox.receive('work');
ROLLBACK;
RESET ROLE;
DELETE FROM outbox.queue_grants;
SET ROLE queue_app;
SELECT * FROM outbox.receive('work');
RESET ROLE;

---------------------------------------------------------------------------
-- Errors.
---------------------------------------------------------------------------
SELECT * FROM outbox.receive('nope');
SELECT outbox.create_notify_target('a_notify', 'chan');
SELECT * FROM outbox.receive('a_notify');
SELECT outbox.grant_receive('a_notify', 'queue_app');
SELECT * FROM outbox.receive(NULL);
SELECT * FROM outbox.receive('work', 0);
SELECT * FROM outbox.receive('work', 10001);
SELECT * FROM outbox.receive('work', NULL);
SELECT * FROM outbox.receive('work', 1, -1);
SELECT * FROM outbox.receive('work', 1, 0, NULL);
SELECT outbox.create_queue('work');
SELECT outbox.create_queue('bad name');
BEGIN READ ONLY;
SELECT * FROM outbox.receive('work');
ROLLBACK;
BEGIN;
SELECT topic FROM outbox.receive('work');
PREPARE TRANSACTION 'q1';
SELECT topic FROM outbox.receive('work');	-- came back
-- A queue's dead letters are not retried one by one.
SELECT outbox.retry_dead_letters('work');

-- Dropping a queue takes its receipts along.
SELECT outbox.drop_target('other');
SELECT count(*) FROM outbox.receipts r
 WHERE NOT EXISTS (SELECT 1 FROM outbox.targets t WHERE t.id = r.target_id);
SELECT * FROM outbox.receive('other');
SELECT outbox.drop_target('a_notify');
DROP OWNED BY queue_app;
DROP ROLE queue_app;
