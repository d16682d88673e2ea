/*-------------------------------------------------------------------------
 *
 * queue_receive.c
 *	  outbox.receive(): claiming messages of a queue for the calling
 *	  transaction.
 *
 * outbox.receive() claims messages in the window for the calling
 * transaction and writes one row into outbox.receipts naming them.  The
 * receipt is the acknowledgement: it is durable exactly when the
 * transaction commits, together with everything else the transaction did
 * (tables it changed, messages it emitted).  What becomes of the claims at
 * commit and abort is queue_xact.c's.
 *
 * Per key, a message is handed out only when every earlier message of its
 * key in the window is acknowledged or held by the same backend (which is
 * then the same transaction).  Keyless messages are unordered.
 *
 * A receive fills the window when it finds it short (queue_fill.c); with
 * nothing to take it waits up to wait_ms on the queues' condition variable
 * (queue_shmem.c), and for a fill under way in another backend even when
 * not asked to wait.  Poisoned messages it comes upon are dead-lettered
 * (queue_poison.c), not returned.  The messages it returns are durable
 * (I7) and read from their chunks with a fresh snapshot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/condition_variable.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "queue.h"

PG_FUNCTION_INFO_V1(outbox_receive);

/* Longest single sleep of a waiting receiver (it re-checks after). */
#define QUEUE_MAX_SLEEP_MS	1000

/* Longest wait for another backend's fill before looking again. */
#define QUEUE_FILL_WAIT_MS	10

/* How long past wait_ms a receive waits for another backend's fill. */
#define QUEUE_FILL_GRACE_MS	200

/* Largest max_messages. */
#define QUEUE_MAX_MESSAGES	10000

/*---- choosing messages ----*/

/*
 * A small open-addressing set of key hashes.  Slots hold h | 1 (0 marks an
 * empty slot), and every probe, on insert, lookup and rehash, starts from
 * that stored value.
 */
typedef struct KeySet
{
	uint64	   *keys;
	int			cap;			/* a power of two, or 0 */
	int			n;
} KeySet;

static inline int
keyset_slot(KeySet *ks, uint64 v)
{
	int			i = (int) (v & (uint64) (ks->cap - 1));

	while (ks->keys[i] != 0 && ks->keys[i] != v)
		i = (i + 1) & (ks->cap - 1);
	return i;
}

static bool
keyset_has(KeySet *ks, uint64 h)
{
	uint64		v = h | 1;

	if (ks->n == 0)
		return false;
	return ks->keys[keyset_slot(ks, v)] == v;
}

static void
keyset_add(KeySet *ks, uint64 h)
{
	uint64		v = h | 1;
	int			i;

	if (keyset_has(ks, h))
		return;
	if ((ks->n + 1) * 2 > ks->cap)
	{
		uint64	   *old = ks->keys;
		int			oldcap = ks->cap;

		ks->cap = ks->cap ? ks->cap * 2 : 64;
		ks->keys = palloc0(sizeof(uint64) * ks->cap);
		for (i = 0; i < oldcap; i++)
			if (old[i] != 0)
				ks->keys[keyset_slot(ks, old[i])] = old[i];
		if (old)
			pfree(old);
	}
	ks->keys[keyset_slot(ks, v)] = v;
	ks->n++;
}

/* Whether entry e may be taken by this backend, given the blocked keys. */
static inline bool
entry_takeable(QueueEntry *e, KeySet *blocked)
{
	if (e->state != QE_FREE)
		return false;
	return !e->has_key || !keyset_has(blocked, e->keyhash);
}

/* Block the key of an entry this backend may not take or pass. */
static inline void
entry_block(QueueEntry *e, KeySet *blocked)
{
	if (e->state == QE_ACKED)
		return;
	if (e->state == QE_CLAIMED && e->owner == OUTBOX_MY_PROC_INDEX())
		return;
	if (e->has_key)
		keyset_add(blocked, e->keyhash);
}

/*
 * Claim up to max messages (poisoned ones besides) for this transaction.
 * Under the slot lock; nothing here may fail after the first claim except
 * through queue_claims_reserve, which the caller ran before.
 */
static int
queue_select(int slot, int max, bool whole, Taken *out, int cap, int *nreal)
{
	QueueSlot  *s = &QShared->slots[slot];
	KeySet		blocked = {NULL, 0, 0};
	int			n = 0;
	int			k;
	int			me = OUTBOX_MY_PROC_INDEX();
	SubTransactionId subid = GetCurrentSubTransactionId();

	*nreal = 0;
	for (k = 0; k < s->count && *nreal < max && n < cap; k++)
	{
		QueueEntry *e = slot_entry(slot, k);
		int			end = k + 1;
		int			j;
		bool		ok = true;

		if (e->state == QE_ACKED || (e->state == QE_CLAIMED && e->owner == me))
			continue;
		if (whole)
		{
			while (end < s->count && slot_entry(slot, end)->group == e->group)
				end++;
			/* The newest transaction may go on past what was read. */
			if (end == s->count && TransactionIdIsValid(s->open_group) &&
				e->group == s->open_group && !(k == 0 && s->count == QShared->window))
				ok = false;
			for (j = k; j < end && ok; j++)
				if (!entry_takeable(slot_entry(slot, j), &blocked))
					ok = false;
			if (ok && *nreal > 0 && *nreal + (end - k) > max)
				break;			/* the next transaction does not fit */
			if (ok && n + (end - k) > cap)
				break;			/* room for poisoned ones ran out */
		}
		else
			ok = entry_takeable(e, &blocked);

		if (!ok)
		{
			for (j = k; j < end; j++)
				entry_block(slot_entry(slot, j), &blocked);
			k = end - 1;
			continue;
		}
		for (j = k; j < end; j++)
		{
			QueueEntry *x = slot_entry(slot, j);

			x->state = QE_CLAIMED;
			x->owner = me;
			queue_claim_add(slot, s->epoch, x->id, subid, x->poisoned);
			out[n].id = x->id;
			out[n].relid = x->relid;
			out[n].poison = x->poisoned;
			if (!x->poisoned)
			{
				x->receives++;
				s->received++;
				(*nreal)++;
			}
			out[n].receives = x->receives;
			out[n].rollbacks = x->rollbacks;
			n++;
		}
		k = end - 1;
	}
	if (blocked.keys)
		pfree(blocked.keys);
	return n;
}

/*---- writing and reading rows ----*/

/* The receipt: the ids this transaction acknowledges when it commits. */
static void
queue_write_receipt(int target_id, Taken *taken, int n)
{
	Relation	rel;
	Datum	   *ids = palloc(sizeof(Datum) * n);
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	HeapTuple	tup;
	int			i;
	Oid			receipts = queue_receipts_relid();

	for (i = 0; i < n; i++)
		ids[i] = Int64GetDatum(taken[i].id);
	values[0] = Int32GetDatum(target_id);
	values[1] = Int64GetDatum(taken[n - 1].id);
	values[2] = PointerGetDatum(construct_array(ids, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	rel = table_open(receipts, RowExclusiveLock);
	tup = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	simple_heap_insert(rel, tup);
	table_close(rel, RowExclusiveLock);
	heap_freetuple(tup);
	pfree(ids);
}

/*
 * Reads messages by id from their chunks with a fresh snapshot, keeping
 * the chunk and its index open while consecutive messages share it.
 */
typedef struct QueueFetcher
{
	Oid			relid;
	Relation	rel;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	Snapshot	snap;
} QueueFetcher;

static void
fetcher_close(QueueFetcher *f)
{
	if (f->rel == NULL)
		return;
	index_endscan(f->scan);
	ExecDropSingleTupleTableSlot(f->slot);
	index_close(f->index, AccessShareLock);
	table_close(f->rel, AccessShareLock);
	f->rel = NULL;
	f->relid = InvalidOid;
}

/* The message, in f->slot, or NULL when it is not there. */
static TupleTableSlot *
fetcher_get(QueueFetcher *f, Oid relid, int64 id)
{
	ScanKeyData key;

	if (f->relid != relid)
	{
		Oid			indexid;

		fetcher_close(f);
		f->rel = table_open(relid, AccessShareLock);
		indexid = outbox_primary_key_index(f->rel);
		if (!OidIsValid(indexid))
			elog(ERROR, "outbox: table \"%s\" has no primary key", RelationGetRelationName(f->rel));
		f->index = index_open(indexid, AccessShareLock);
		f->slot = table_slot_create(f->rel, NULL);
		f->scan = outbox_index_beginscan_keys(f->rel, f->index, f->snap, 1);
		f->relid = relid;
	}
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
	index_rescan(f->scan, &key, 1, NULL, 0);
	if (!index_getnext_slot(f->scan, ForwardScanDirection, f->slot))
		return NULL;
	slot_getallattrs(f->slot);
	return f->slot;
}

/* A column of a fetched message, detoasted (the row may go after commit). */
static Datum
fetched_value(TupleTableSlot *slot, int attnum, bool *isnull)
{
	Datum		v = slot->tts_values[attnum - 1];

	*isnull = slot->tts_isnull[attnum - 1];
	if (*isnull)
		return (Datum) 0;
	if (TupleDescAttr(slot->tts_tupleDescriptor, attnum - 1)->attlen == -1)
		v = PointerGetDatum(detoast_attr((struct varlena *) DatumGetPointer(v)));
	return v;
}

/*---- outbox.receive() ----*/

/*
 * Claim messages for this transaction, waiting up to wait_ms for some.
 * Sets *ntakenp to how many were claimed (poisoned ones included, *nreal
 * without);
 * *waiting says whether the caller must cancel a condition variable sleep.
 */
static void
queue_take(const char *name, QueueInfo **qip, int *slotp, int max_messages, bool whole,
		   int wait_ms, Taken *taken, int cap, int *ntakenp, int *nreal,
		   volatile bool *waiting)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);

	/* How long past the deadline a fill under way in another backend is
	 * waited for (it may itself wait for a lock). */
	TimestampTz fill_deadline = TimestampTzPlusMilliseconds(deadline, QUEUE_FILL_GRACE_MS);
	QueueInfo  *qi = *qip;
	int			target_id = qi->target_id;
	int			slot = *slotp;
	int			ntaken = 0;
	bool		starved = false;
	int			i;

	for (;;)
	{
		QueueSlot  *s;
		uint64		gen;
		bool		fill = false;
		bool		load = false;
		bool		other_filling = false;
		bool		moved = false;
		int64		frontier;
		long		left;
		long		sleep_ms;
		long		standby_recheck;

		CHECK_FOR_INTERRUPTS();
		/* A sleeping backend saw no invalidations: grants, memberships. */
		AcceptInvalidationMessages();
		qi = queue_info(name);	/* the configuration may have changed */
		if (!qi->is_queue || qi->target_id != target_id)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("outbox queue \"%s\" was dropped", name)));
		queue_check_allowed(qi);	/* a grant may have gone meanwhile */
		slot = queue_slot(qi);
		s = &QShared->slots[slot];
		gen = outbox_config_generation();
		/* Nothing a failover could undo is handed out (I9). */
		frontier = outbox_standby_frontier(&standby_recheck);

		LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
		if (!queue_slot_is(slot, qi))
		{
			/* Given to another queue meanwhile (ours was dropped). */
			LWLockRelease(slot_lock(slot));
			qi->slot = -1;
			continue;
		}
		if (!s->filling)
		{
			int			room = QShared->window - s->count;

			load = !s->loaded || s->config_generation != gen || s->reload_wanted;

			/*
			 * Read more when there is room for a good part of a read, so
			 * that a full window is not topped up one message at a time;
			 * or when the last look found nothing to take.
			 */
			fill = load || (frontier > s->read_id &&
							(room >= Min(QUEUE_FILL_ROWS, QShared->window / 2) ||
							 (starved && room > 0)));
			if (fill)
			{
				s->filling = true;
				s->filler = OUTBOX_MY_PROC_INDEX();
			}
		}
		else
			other_filling = true;
		LWLockRelease(slot_lock(slot));

		if (fill)
			moved = queue_fill_guarded(qi, slot, frontier, load, gen, max_messages);

		if (qi->active && s->loaded)
		{
			queue_claims_reserve(cap);
			LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
			ntaken = (queue_slot_is(slot, qi) && !s->reload_wanted) ?
				queue_select(slot, max_messages, whole, taken, cap, nreal) : 0;
			LWLockRelease(slot_lock(slot));
			if (ntaken > 0 && *nreal == 0)
			{
				/* Only poisoned messages: dead-letter them, look again. */
				queue_write_receipt(qi->target_id, taken, ntaken);
				for (i = 0; i < ntaken; i++)
					queue_dead_letter(qi, &taken[i]);
				ntaken = 0;
				continue;
			}
			if (ntaken > 0)
				break;
			starved = true;

			/*
			 * The read passed only messages of other topics: read on at
			 * once while there is more up to the frontier.
			 */
			if (moved && frontier > s->read_id)
				continue;
		}

		/*
		 * Another backend is reading messages into the window: what it reads
		 * may be for us, so wait for it even when not asked to wait.
		 */
		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (other_filling && GetCurrentTimestamp() < fill_deadline)
			sleep_ms = left > 0 ? Min(left, QUEUE_FILL_WAIT_MS) : 5;
		else if (wait_ms == 0 || left <= 0)
			break;
		else
			sleep_ms = Min(left, QUEUE_MAX_SLEEP_MS);
		/* Nothing wakes us when the standbys confirm: look again soon. */
		if (standby_recheck >= 0)
			sleep_ms = Min(sleep_ms, Max(standby_recheck, 1));
		if (!*waiting)
		{
			/* Look once more after announcing the wait: no wake-up is lost. */
			queue_wait_announce();
			*waiting = true;
			continue;
		}
		(void) ConditionVariableTimedSleep(queue_wait_cv(), sleep_ms, PG_WAIT_EXTENSION);
	}
	*qip = qi;
	*slotp = slot;
	*ntakenp = ntaken;
}

Datum
outbox_receive(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *name;
	int			max_messages;
	int			wait_ms;
	bool		whole;
	QueueInfo  *qi;
	int			slot;
	Taken	   *taken;
	int			cap;
	int			ntaken = 0;
	int			nreal = 0;
	volatile bool waiting = false;
	int			i;

	if (!outbox_preloaded || QShared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.receive() requires the outbox library to be preloaded"),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox queue name must not be null")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	max_messages = PG_ARGISNULL(1) ? -1 : PG_GETARG_INT32(1);
	if (max_messages < 1 || max_messages > QUEUE_MAX_MESSAGES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_messages must be between 1 and %d", QUEUE_MAX_MESSAGES),
				 errdetail("max_messages was %s.", PG_ARGISNULL(1) ? "null" : psprintf("%d", max_messages))));
	wait_ms = PG_ARGISNULL(2) ? -1 : PG_GETARG_INT32(2);
	if (wait_ms < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait_ms must be 0 or more"),
				 errdetail("wait_ms was %s.", PG_ARGISNULL(2) ? "null" : psprintf("%d", wait_ms)),
				 errhint("Pass 0 to return at once when nothing is available.")));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("whole_transactions must not be null")));
	whole = PG_GETARG_BOOL(3);

	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot call outbox.receive() during a parallel operation")));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot receive from outbox queues during recovery"),
				 errdetail("Receiving writes the acknowledgement, which a standby cannot."),
				 errhint("Receive on the primary server.")));
	PreventCommandIfReadOnly("outbox.receive()");
	outbox_check_database("outbox.receive()");
	outbox_queue_backend_init();
	/* Earlier rollbacks of this session are settled before it claims. */
	queue_settle_rollbacks();

	qi = queue_info(name);
	if (!qi->is_queue)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("outbox target \"%s\" is not a queue", name),
				 errdetail("Only targets created with outbox.create_queue() are received from; the relay delivers the others."),
				 errhint("Receive from a queue, or create one with outbox.create_queue().")));
	queue_check_allowed(qi);

	if (!outbox_counter_valid())
	{
		Relation	rel = outbox_open_messages(AccessShareLock);

		outbox_ensure_counter(rel);
		table_close(rel, AccessShareLock);
	}

	InitMaterializedSRF(fcinfo, 0);
	slot = queue_slot(qi);
	/*
	 * Room for max_messages and some poisoned ones; a whole transaction may
	 * be as large as the window.
	 */
	cap = whole ? QShared->window : Min(QShared->window, max_messages + 16);
	taken = palloc(sizeof(Taken) * cap);

	PG_TRY();
	{
		queue_take(name, &qi, &slot, max_messages, whole, wait_ms, taken, cap,
				   &ntaken, &nreal, &waiting);
	}
	PG_CATCH();
	{
		if (waiting)
			queue_wait_cancel();
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (waiting)
		queue_wait_cancel();

	if (ntaken > 0)
	{
		QueueFetcher fetcher;

		queue_write_receipt(qi->target_id, taken, ntaken);
		for (i = 0; i < ntaken; i++)
			if (taken[i].poison)
				queue_dead_letter(qi, &taken[i]);

		/* Messages handed out are durable (I7). */
		outbox_flush_commits();

		memset(&fetcher, 0, sizeof(fetcher));
		fetcher.snap = RegisterSnapshot(GetLatestSnapshot());
		for (i = 0; i < ntaken; i++)
		{
			static const int cols[7] = {
				Anum_outbox_messages_id, Anum_outbox_messages_msg_id,
				Anum_outbox_messages_topic, Anum_outbox_messages_key,
				Anum_outbox_messages_headers, Anum_outbox_messages_payload,
				Anum_outbox_messages_emitted_at
			};
			TupleTableSlot *row;
			Datum		values[8];
			bool		nulls[8];
			int			c;

			if (taken[i].poison)
				continue;
			row = fetcher_get(&fetcher, taken[i].relid, taken[i].id);
			if (row == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_DATA_CORRUPTED),
						 errmsg("outbox message " INT64_FORMAT " of queue \"%s\" is missing", taken[i].id, name),
						 errdetail("The message was removed before the queue acknowledged it."),
						 errhint("Check outbox.retention and the queue's progress in outbox.lag.")));
			for (c = 0; c < 7; c++)
				values[c] = fetched_value(row, cols[c], &nulls[c]);
			values[7] = Int32GetDatum((int32) Min(taken[i].receives, PG_INT32_MAX));
			nulls[7] = false;
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
		fetcher_close(&fetcher);
		UnregisterSnapshot(fetcher.snap);
	}
	pfree(taken);
	return (Datum) 0;
}
