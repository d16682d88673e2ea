/*-------------------------------------------------------------------------
 *
 * queue_shmem.c
 *	  The queues' shared memory: a slot per queue holding its window, the
 *	  locks, and the condition variable receivers wait on.
 *
 * Shared memory holds, per queue, a window: the queue's messages above its
 * durable position (outbox.progress.done_id), in id order, each free,
 * claimed by one backend's transaction, or acknowledged (QE_*).  A slot's
 * entries are a ring (head, count); acknowledged ones leave from its front
 * (queue_slot_trim), so every message below the first entry is
 * acknowledged (queue_slot_acked_upto).  How the window is filled is
 * queue_fill.c's; which queue a slot holds, queue_config.c's.
 *
 * Waiting receivers sleep on one condition variable, broadcast when a
 * transaction that emitted commits (emit.c, through base.h's
 * outbox_wake_receivers), when claims are released or acknowledged, and
 * when a fill ends.  A fill and a wait are announced in shared memory
 * (filling/filler, waiters); a backend that ends by FATAL takes them back
 * in its exit callback (queue_shmem_backend_exit).
 *
 * Locking: QShared->locks[0] guards taking and freeing slots; each slot's
 * own lock guards its fields and entries.  No SQL runs under either: a
 * fill reads with the slot's filling flag set and the lock released.
 *
 * This file uses no other queue file.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"

#include "queue.h"

QueueShared *QShared = NULL;
QueueEntry *QEntries = NULL;

static QueueWait *QWaits = NULL;	/* outbox_max_databases of them */
static bool waiting_registered = false;	/* counted in waiters */
static int	wait_index = -1;	/* of our database, once we waited */

static Size
outbox_queue_shmem_size(void)
{
	Size		size = offsetof(QueueShared, slots);

	size = add_size(size, mul_size(outbox_max_queues, sizeof(QueueSlot)));
	size = MAXALIGN(size);
	size = add_size(size, mul_size(mul_size(outbox_max_queues, outbox_queue_window),
								   sizeof(QueueEntry)));
	return size;
}

void
outbox_queue_shmem_request(void)
{
	RequestAddinShmemSpace(outbox_queue_shmem_size());
	RequestAddinShmemSpace(mul_size(outbox_max_databases, sizeof(QueueWait)));
	RequestNamedLWLockTranche("outbox queues", outbox_max_queues + 1);
}

/* Called from the shmem startup hook, under AddinShmemInitLock. */
void
outbox_queue_shmem_init(void)
{
	bool		found;
	Size		off;

	QWaits = ShmemInitStruct("outbox queue waits",
							 mul_size(outbox_max_databases, sizeof(QueueWait)), &found);
	if (!found)
	{
		int			i;

		for (i = 0; i < outbox_max_databases; i++)
		{
			ConditionVariableInit(&QWaits[i].cv);
			pg_atomic_init_u32(&QWaits[i].waiters, 0);
		}
	}
	QShared = ShmemInitStruct("outbox queues", outbox_queue_shmem_size(), &found);
	off = MAXALIGN(offsetof(QueueShared, slots) + outbox_max_queues * sizeof(QueueSlot));
	QEntries = (QueueEntry *) ((char *) QShared + off);
	if (!found)
	{
		int			i;

		QShared->nslots = outbox_max_queues;
		QShared->window = outbox_queue_window;
		QShared->locks = GetNamedLWLockTranche("outbox queues");
		for (i = 0; i < QShared->nslots; i++)
		{
			memset(&QShared->slots[i], 0, sizeof(QueueSlot));
			QShared->slots[i].dboid = InvalidOid;
			QShared->slots[i].filler = -1;
		}
	}
}

/*
 * Wake this database's waiting receivers; cheap when none waits.  Without
 * a slot of its database the backend stored nothing and changed no queue.
 */
void
outbox_queue_wake(void)
{
	int			i;

	if (QShared == NULL || (i = outbox_db_attached_index()) < 0)
		return;
	/* What the caller changed must be visible to a waiter we do not wake. */
	pg_memory_barrier();
	if (pg_atomic_read_u32(&QWaits[i].waiters) > 0)
		ConditionVariableBroadcast(&QWaits[i].cv);
}

/* The condition variable this backend's receiver waits on. */
ConditionVariable *
queue_wait_cv(void)
{
	Assert(wait_index >= 0);
	return &QWaits[wait_index].cv;
}

/*
 * Announce that this backend is about to sleep on the condition variable:
 * it is counted in its database's waiters, so commits there broadcast to it.
 */
void
queue_wait_announce(void)
{
	outbox_db_attach();
	wait_index = outbox_db_index();
	pg_atomic_fetch_add_u32(&QWaits[wait_index].waiters, 1);
	waiting_registered = true;
	ConditionVariablePrepareToSleep(&QWaits[wait_index].cv);
}

/* The wait announced by queue_wait_announce() is over. */
void
queue_wait_cancel(void)
{
	ConditionVariableCancelSleep();
	pg_atomic_fetch_sub_u32(&QWaits[wait_index].waiters, 1);
	waiting_registered = false;
}

/*
 * The backend ends, its claims released (queue_shmem_exit).  A FATAL error
 * (pg_terminate_backend, say) does not pass through the error handling of a
 * fill or a wait: undo what they announced.
 */
void
queue_shmem_backend_exit(void)
{
	int			i;

	for (i = 0; i < QShared->nslots; i++)
	{
		QueueSlot  *s = &QShared->slots[i];

		if (s->filler != OUTBOX_MY_PROC_INDEX())
			continue;
		LWLockAcquire(slot_lock(i), LW_EXCLUSIVE);
		if (s->filler == OUTBOX_MY_PROC_INDEX())
		{
			s->filling = false;
			s->filler = -1;
		}
		LWLockRelease(slot_lock(i));
	}
	if (waiting_registered)
	{
		pg_atomic_fetch_sub_u32(&QWaits[wait_index].waiters, 1);
		waiting_registered = false;
	}
	outbox_queue_wake();
}

/* The position in the window of message id, or -1. Under the slot lock. */
int
queue_slot_find(int slot, int64 id)
{
	QueueSlot  *s = &QShared->slots[slot];
	int			lo = 0,
				hi = s->count - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int64		v = slot_entry(slot, mid)->id;

		if (v == id)
			return mid;
		if (v < id)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

/* Drop acknowledged entries from the front of the window. */
void
queue_slot_trim(int slot)
{
	QueueSlot  *s = &QShared->slots[slot];

	while (s->count > 0 && slot_entry(slot, 0)->state == QE_ACKED)
	{
		s->head = (s->head + 1) % QShared->window;
		s->count--;
	}
}

/*
 * Every message of the queue at or below this id is acknowledged (under
 * the slot lock).
 */
int64
queue_slot_acked_upto(int slot)
{
	QueueSlot  *s = &QShared->slots[slot];

	if (s->count > 0)
		return slot_entry(slot, 0)->id - 1;
	return s->read_id;
}
