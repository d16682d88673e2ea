-- outbox.frontier(): the highest id at or below which no message can still
-- appear.  With nothing in flight it is the last id handed out.
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
SELECT outbox.frontier() = (SELECT max(id) FROM outbox.messages) AS at_last_id;

-- Our own open transaction has not reserved ids yet (that happens at
-- commit), so it does not hold the frontier back.
BEGIN;
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
SELECT outbox.frontier() = (SELECT max(id) FROM outbox.messages) AS unchanged_while_open;
COMMIT;
SELECT outbox.frontier() = (SELECT max(id) FROM outbox.messages) AS advanced_after_commit;

-- Aborted transactions leave no gap: nothing was reserved.
BEGIN;
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
ROLLBACK;
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
SELECT max(id) - min(id) + 1 = count(*) AS no_gap FROM outbox.messages WHERE topic = 'frontier';

-- Ids keep growing across DELETE and TRUNCATE; the high-water mark records
-- the highest id removed.
SELECT max(id) AS before_delete FROM outbox.messages \gset
DELETE FROM outbox.messages;
SELECT max(id_high_water) = :before_delete AS high_water_after_delete FROM outbox.state;
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
SELECT min(id) > :before_delete AS above_deleted FROM outbox.messages;
SELECT max(id) AS before_truncate FROM outbox.messages \gset
TRUNCATE outbox.messages;
SELECT max(id_high_water) = :before_truncate AS high_water_after_truncate FROM outbox.state;
SELECT outbox_emit('frontier', '{}') IS NOT NULL AS emitted;
SELECT min(id) > :before_truncate AS above_truncated FROM outbox.messages;
SELECT outbox.frontier() = (SELECT max(id) FROM outbox.messages) AS at_last_id;
