/*-------------------------------------------------------------------------
 *
 * queue_poison.c
 *	  Poison messages of queues: when a message becomes one, and its dead
 *	  letter.
 *
 * A message whose receiving transactions rolled back outbox.max_receives
 * times is poisoned: the next receive writes it to outbox.dead_letters
 * and acknowledges it in its own transaction, instead of returning it.
 * Which rollbacks count is queue_xact.c's to decide.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "queue.h"

/* A rollback of entry e (under its slot's lock) counts. */
void
queue_count_rollback(QueueSlot *s, QueueEntry *e)
{
	s->rolled_back_counted++;
	if (e->rollbacks < PG_UINT16_MAX)
		e->rollbacks++;
	if (outbox_max_receives > 0 && e->rollbacks >= outbox_max_receives)
		e->poisoned = true;
}

/* Dead-letter a poisoned message (as the owner). */
void
queue_dead_letter(QueueInfo *qi, Taken *t)
{
	QueueSpiState st;
	Oid			types[4] = {TEXTOID, INT8OID, INT4OID, TEXTOID};
	Datum		values[4];
	char		err[160];

	snprintf(err, sizeof(err),
			 "rolled back by %d receiving transactions (outbox.max_receives); received %d times",
			 (int) t->rollbacks, (int) t->receives);
	values[0] = CStringGetTextDatum(qi->name);
	values[1] = Int64GetDatum(t->id);
	values[2] = Int32GetDatum((int) t->receives);
	values[3] = CStringGetTextDatum(err);
	queue_spi_begin(&st);
	{
		SPIPlanPtr	plan = SPI_prepare(
									   "INSERT INTO outbox.dead_letters AS d (target, id, msg_id, topic, key, attempts,"
									   "        last_status, last_error, payload, headers, emitted_at)"
									   " SELECT $1, m.id, m.msg_id, m.topic, m.key, $3, NULL, $4,"
									   "        m.payload, m.headers, m.emitted_at"
									   "   FROM outbox.messages m WHERE m.id OPERATOR(pg_catalog.=) $2"
									   " ON CONFLICT (target, id) DO UPDATE"
									   "   SET attempts = excluded.attempts, last_error = excluded.last_error,"
									   "       failed_at = pg_catalog.now(), retry_requested_at = NULL",
									   4, types);
		Snapshot	snap;

		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the dead letter insert");
		snap = RegisterSnapshot(GetLatestSnapshot());
		if (SPI_execute_snapshot(plan, values, NULL, snap, InvalidSnapshot,
								 false, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "outbox: could not write a dead letter");
		UnregisterSnapshot(snap);
	}
	queue_spi_end(&st);
}
