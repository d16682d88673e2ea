-- Savepoints: messages of a rolled-back subtransaction are gone, those of a
-- released one belong to its parent.
TRUNCATE outbox.messages;

-- RELEASE keeps, ROLLBACK TO drops.
BEGIN;
SELECT outbox_emit('sp', '"top 1"') IS NOT NULL AS emitted;
SAVEPOINT a;
SELECT outbox_emit('sp', '"a 1"') IS NOT NULL AS emitted;
RELEASE SAVEPOINT a;
SAVEPOINT b;
SELECT outbox_emit('sp', '"b 1 (rolled back)"') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT b;
SELECT outbox_emit('sp', '"b 2 after rollback to"') IS NOT NULL AS emitted;
RELEASE SAVEPOINT b;
SELECT outbox_emit('sp', '"top 2"') IS NOT NULL AS emitted;
COMMIT;
SELECT payload FROM outbox.messages WHERE topic = 'sp' ORDER BY id;

-- Nested: an inner release hands its messages to the outer savepoint,
-- whose rollback then drops both.
BEGIN;
SELECT outbox_emit('nest', '"outer kept"') IS NOT NULL AS emitted;
SAVEPOINT s1;
SELECT outbox_emit('nest', '"s1 (dropped with s1)"') IS NOT NULL AS emitted;
SAVEPOINT s2;
SELECT outbox_emit('nest', '"s2 (dropped with s1)"') IS NOT NULL AS emitted;
RELEASE SAVEPOINT s2;
ROLLBACK TO SAVEPOINT s1;
SAVEPOINT s3;
SAVEPOINT s4;
SELECT outbox_emit('nest', '"s4 kept"') IS NOT NULL AS emitted;
RELEASE SAVEPOINT s4;
SAVEPOINT s5;
SELECT outbox_emit('nest', '"s5 (dropped)"') IS NOT NULL AS emitted;
ROLLBACK TO SAVEPOINT s5;
RELEASE SAVEPOINT s3;
SELECT outbox_emit('nest', '"last kept"') IS NOT NULL AS emitted;
COMMIT;
SELECT payload FROM outbox.messages WHERE topic = 'nest' ORDER BY id;
SELECT max(id) - min(id) + 1 AS span, count(*) AS n FROM outbox.messages WHERE topic = 'nest';

-- A savepoint that emitted nothing changes nothing; rolling back to a
-- savepoint taken before any emit empties the transaction.
BEGIN;
SAVEPOINT empty;
RELEASE SAVEPOINT empty;
SAVEPOINT all_of_it;
SELECT count(outbox_emit('gone', to_jsonb(g))) FROM generate_series(1, 10) g;
ROLLBACK TO SAVEPOINT all_of_it;
COMMIT;
SELECT count(*) AS gone FROM outbox.messages WHERE topic = 'gone';

-- A PL/pgSQL exception block is a subtransaction.
CREATE FUNCTION emit_or_fail(fail boolean) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
	BEGIN
		PERFORM outbox_emit('plpgsql', to_jsonb('inner, fail=' || fail));
		IF fail THEN
			RAISE EXCEPTION 'failing on purpose';
		END IF;
	EXCEPTION WHEN OTHERS THEN
		PERFORM outbox_emit('plpgsql', '"handler"');
		RETURN 'caught';
	END;
	RETURN 'ok';
END
$$;
BEGIN;
SELECT emit_or_fail(false);
SELECT emit_or_fail(true);
COMMIT;
SELECT payload FROM outbox.messages WHERE topic = 'plpgsql' ORDER BY id;

-- An error in the statement itself aborts the whole transaction.
BEGIN;
SELECT outbox_emit('aborted', '{}') IS NOT NULL AS emitted;
SELECT 1 / 0;
COMMIT;
SELECT count(*) AS aborted FROM outbox.messages WHERE topic = 'aborted';

-- Many savepoints with spilled messages in between: a transaction emitting
-- more than the in-memory buffer holds, with a rollback to a savepoint
-- taken after the spill started and one taken before.
BEGIN;
SELECT count(outbox_emit('spill', jsonb_build_object('i', g, 'pad', repeat('x', 300)))) FROM generate_series(1, 20000) g;
SAVEPOINT after_spill;
SELECT count(outbox_emit('spill', jsonb_build_object('i', -g, 'pad', repeat('y', 300)))) FROM generate_series(1, 20000) g;
ROLLBACK TO SAVEPOINT after_spill;
SELECT count(outbox_emit('spill', jsonb_build_object('i', 20000 + g))) FROM generate_series(1, 5) g;
COMMIT;
SELECT count(*) AS n, min((payload->>'i')::int) AS lo, max((payload->>'i')::int) AS hi,
	   max(id) - min(id) + 1 AS span,
	   bool_and((payload->>'i')::int = id - (SELECT min(id) FROM outbox.messages WHERE topic = 'spill') + 1) AS in_emit_order
  FROM outbox.messages WHERE topic = 'spill';

BEGIN;
SAVEPOINT before_spill;
SELECT count(outbox_emit('spill2', jsonb_build_object('i', g, 'pad', repeat('x', 300)))) FROM generate_series(1, 20000) g;
ROLLBACK TO SAVEPOINT before_spill;
SELECT outbox_emit('spill2', '{"i": "only survivor"}') IS NOT NULL AS emitted;
COMMIT;
SELECT payload FROM outbox.messages WHERE topic = 'spill2';
