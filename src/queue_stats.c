/*-------------------------------------------------------------------------
 *
 * queue_stats.c
 *	  outbox.queue_stats(): what shared memory holds for each queue of this
 *	  database, for the view outbox.queues.
 *
 * One row per loaded window: its size, the messages held and by how many
 * backends, the poisoned ones waiting for their dead letter, the counters
 * since the queue took its slot (received, acknowledged, rolled back,
 * counted rollbacks, dead-lettered), and the positions acknowledged and
 * read up to.  Each slot is read under its lock, shared.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/tuplestore.h"

#include "queue.h"

PG_FUNCTION_INFO_V1(outbox_queue_stats);

Datum
outbox_queue_stats(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			i;
	Oid			current;

	InitMaterializedSRF(fcinfo, 0);
	if (QShared == NULL)
		return (Datum) 0;
	current = queue_current_targets_relid();
	for (i = 0; i < QShared->nslots; i++)
	{
		QueueSlot  *s = &QShared->slots[i];
		Datum		values[12];
		bool		nulls[12] = {0};
		int			held = 0,
					poisoned = 0,
					nowners = 0,
					k;
		int		   *owners;

		LWLockAcquire(slot_lock(i), LW_SHARED);
		if (s->dboid != MyDatabaseId || !s->loaded || s->targets_relid != current)
		{
			LWLockRelease(slot_lock(i));
			continue;
		}
		owners = palloc(sizeof(int) * Max(s->count, 1));
		for (k = 0; k < s->count; k++)
		{
			QueueEntry *e = slot_entry(i, k);

			if (e->poisoned && e->state == QE_FREE)
				poisoned++;
			if (e->state == QE_CLAIMED)
			{
				int			o;

				held++;
				for (o = 0; o < nowners && owners[o] != e->owner; o++)
					;
				if (o == nowners)
					owners[nowners++] = e->owner;
			}
		}
		values[0] = Int32GetDatum(s->target_id);
		values[1] = Int32GetDatum(s->count);
		values[2] = Int32GetDatum(held);
		values[3] = Int32GetDatum(nowners);
		values[4] = Int32GetDatum(poisoned);
		values[5] = Int64GetDatum((int64) s->received);
		values[6] = Int64GetDatum((int64) s->acknowledged);
		values[7] = Int64GetDatum((int64) s->rolled_back);
		values[8] = Int64GetDatum((int64) s->rolled_back_counted);
		values[9] = Int64GetDatum((int64) s->dead_lettered);
		values[10] = Int64GetDatum(queue_slot_acked_upto(i));
		values[11] = Int64GetDatum(s->read_id);
		LWLockRelease(slot_lock(i));
		pfree(owners);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
