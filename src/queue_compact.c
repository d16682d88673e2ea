/*-------------------------------------------------------------------------
 *
 * queue_compact.c
 *	  The relay's part of the queues: folding acknowledgements into
 *	  outbox.progress.done_id.
 *
 * The relay folds acknowledgements into done_id about once a second
 * (outbox_queue_compact, from relay_retention.c) and deletes the receipts
 * below it, so receipts stay as few as the messages between done_id and
 * the newest acknowledged one, and retention frees chunks as for other
 * targets.  It never waits for a lock on a progress row (an admin's open
 * transaction would stall the relay) and tries again next time; now and
 * then it deletes the receipts of queues dropped while a transaction held
 * their messages.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/memutils.h"

#include "queue.h"

/*
 * The folds of the running transaction, published in shared memory only
 * once it has committed (outbox_queue_compact_done): a transaction that
 * then fails (a lock it gave up on) must leave the slots as they were, or
 * the next fold would take the rolled-back done_id for the recorded one.
 */
typedef struct CompactFold
{
	int			slot;
	int			target_id;
	int			generation;
	Oid			targets_relid;
	int64		upto;
} CompactFold;

static CompactFold *folds = NULL;
static int	nfolds = 0;

/*
 * Move each queue's outbox.progress.done_id up to what is acknowledged in
 * shared memory, and delete the receipts below it.  Run by the relay in its
 * own transaction, with SPI connected.
 */
void
outbox_queue_compact(void)
{
	static int	calls = 0;
	int			i;
	bool		any = false;
	Oid			current;

	nfolds = 0;
	if (QShared == NULL)
		return;
	if (folds == NULL)
		folds = MemoryContextAlloc(TopMemoryContext, sizeof(CompactFold) * QShared->nslots);
	current = queue_current_targets_relid();

	/*
	 * Now and then, delete receipts of queues dropped while a transaction
	 * held their messages (drop_target could not see its receipt).
	 */
	for (i = 0; i < QShared->nslots; i++)
		if (QShared->slots[i].dboid == MyDatabaseId)
			any = true;
	if (any && ++calls % 10 == 0 &&
		SPI_execute("DELETE FROM outbox.receipts r WHERE NOT EXISTS"
					" (SELECT 1 FROM outbox.targets t"
					"   WHERE t.id OPERATOR(pg_catalog.=) r.target_id AND t.kind = 'queue')",
					false, 0) != SPI_OK_DELETE)
		elog(ERROR, "outbox: could not delete receipts of dropped queues");
	for (i = 0; i < QShared->nslots; i++)
	{
		QueueSlot  *s = &QShared->slots[i];
		int			target_id;
		int			generation;
		int64		upto;
		int64		done;
		Datum		values[3];
		Oid			types[3] = {INT4OID, INT8OID, INT4OID};

		LWLockAcquire(slot_lock(i), LW_SHARED);
		if (s->dboid != MyDatabaseId || !s->loaded || s->targets_relid != current)
		{
			LWLockRelease(slot_lock(i));
			continue;
		}
		target_id = s->target_id;
		generation = s->generation;
		done = s->done_id;
		upto = queue_slot_acked_upto(i);
		LWLockRelease(slot_lock(i));
		if (upto <= done)
			continue;

		values[0] = Int32GetDatum(target_id);
		values[1] = Int64GetDatum(upto);
		values[2] = Int32GetDatum(generation);

		/*
		 * Never wait for a lock on the progress row (an admin's open
		 * transaction would stall the relay): try again next time.
		 */
		if (SPI_execute_with_args("SELECT 1 FROM outbox.progress p"
								  " WHERE p.target_id OPERATOR(pg_catalog.=) $1"
								  " FOR UPDATE SKIP LOCKED",
								  1, types, values, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox: could not lock a queue's progress");
		if (SPI_processed == 0)
			continue;
		if (SPI_execute_with_args("UPDATE outbox.progress p"
								  "   SET done_id = $2, last_delivered_id = $2"
								  " WHERE p.target_id OPERATOR(pg_catalog.=) $1"
								  "   AND p.generation OPERATOR(pg_catalog.=) $3"
								  "   AND p.done_id OPERATOR(pg_catalog.<) $2",
								  3, types, values, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not update a queue's progress");
		if (SPI_processed == 0)
			continue;
		if (SPI_execute_with_args("DELETE FROM outbox.receipts r"
								  " WHERE r.target_id OPERATOR(pg_catalog.=) $1"
								  "   AND r.last_id OPERATOR(pg_catalog.<=) $2",
								  2, types, values, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "outbox: could not delete a queue's receipts");
		folds[nfolds].slot = i;
		folds[nfolds].target_id = target_id;
		folds[nfolds].generation = generation;
		folds[nfolds].targets_relid = current;
		folds[nfolds].upto = upto;
		nfolds++;
	}
}

/*
 * After the transaction of outbox_queue_compact() ended: committed, its
 * folds go to shared memory; rolled back, they are forgotten.
 */
void
outbox_queue_compact_done(bool committed)
{
	int			k;

	for (k = 0; committed && k < nfolds; k++)
	{
		CompactFold *f = &folds[k];
		QueueSlot  *s = &QShared->slots[f->slot];

		LWLockAcquire(slot_lock(f->slot), LW_EXCLUSIVE);
		if (s->dboid == MyDatabaseId && s->target_id == f->target_id &&
			s->targets_relid == f->targets_relid && s->generation == f->generation &&
			s->done_id < f->upto)
			s->done_id = f->upto;
		LWLockRelease(slot_lock(f->slot));
	}
	nfolds = 0;
}
