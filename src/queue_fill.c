/*-------------------------------------------------------------------------
 *
 * queue_fill.c
 *	  Filling a queue's window from outbox.messages, and building it from
 *	  the tables after a start or a replay.
 *
 * The window is filled by whichever receiver finds it short, reading
 * outbox.messages up to the frontier (I3) with a fresh snapshot, so a
 * REPEATABLE READ caller sees messages committed after its snapshot.  The
 * filler announces the fill in the slot (filling, filler), reads with the
 * slot's lock released, and places the rows of the queue's subscriptions
 * under the lock, unless the window changed meanwhile (epoch, read_id).
 * A read that stops inside one emitting transaction notes it (open_group),
 * so whole_transactions does not hand out part of it.
 *
 * After a restart the window is rebuilt from done_id and the receipts;
 * after outbox.replay() too, once no transaction holds a message of the
 * queue (until then nothing is handed out).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "queue.h"

/* A row of the read, for a filter's document (columns 6 and 7). */
typedef struct FillDocArg
{
	HeapTuple	tup;
	TupleDesc	desc;
	const char *topic;
	const char *key;
} FillDocArg;

static Jsonb *
queue_fill_doc(void *arg)
{
	FillDocArg *a = (FillDocArg *) arg;
	bool		isnull;
	Datum		h = SPI_getbinval(a->tup, a->desc, 6, &isnull);
	Jsonb	   *headers = isnull ? NULL : DatumGetJsonbP(h);

	return outbox_filter_doc(a->topic, a->key, headers,
							 DatumGetJsonbP(SPI_getbinval(a->tup, a->desc, 7, &isnull)));
}

/*
 * Whether the queue takes the message: a subscription takes its topic and,
 * if it has a filter, the filter selects it (the row has the headers and
 * payload then).
 */
static bool
queue_matches(QueueInfo *qi, HeapTuple tup, TupleDesc desc, const char *topic,
			  const char *key, int64 id, MemoryContext rowcxt)
{
	FillDocArg	a;
	bool		filtered;
	bool		taken;
	MemoryContext oldcxt;

	switch (outbox_subscriptions_route(qi->subs, qi->nsubs, topic, id))
	{
		case 0:
			return false;
		case 1:
			return true;
		default:
			/* the payload detoasted and the document: gone after the row */
			a.tup = tup;
			a.desc = desc;
			a.topic = topic;
			a.key = key;
			oldcxt = MemoryContextSwitchTo(rowcxt);
			taken = outbox_subscriptions_select(qi->subs, qi->nsubs, topic, id,
												queue_fill_doc, &a, &filtered);
			MemoryContextSwitchTo(oldcxt);
			MemoryContextReset(rowcxt);
			return taken;
	}
}

/* Sorted ids acknowledged by receipts, while a window is rebuilt. */
typedef struct AckedIds
{
	int64	   *ids;
	int			n;
	int			next;
} AckedIds;

static int
cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a,
				y = *(const int64 *) b;

	return (x > y) - (x < y);
}

static bool
acked_contains(AckedIds *acked, int64 id)
{
	if (acked == NULL)
		return false;
	while (acked->next < acked->n && acked->ids[acked->next] < id)
		acked->next++;
	return acked->next < acked->n && acked->ids[acked->next] == id;
}

/* A message read for the window, before it is placed. */
typedef struct FillRow
{
	int64		id;
	uint64		keyhash;
	Oid			relid;
	TransactionId group;
	bool		has_key;
} FillRow;

/*
 * Set while a rebuild reads up to its last acknowledged id rather than to
 * a frontier: that id need not end its transaction (queue_load).
 */
static bool fill_may_split = false;

/*
 * Read messages after the slot's read_id up to the frontier into the
 * window.  The caller set s->filling.  Returns whether read_id moved.
 */
static bool
queue_fill(QueueInfo *qi, int slot, int64 frontier, AckedIds *acked)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr plan_filtered = NULL;	/* the same with the headers and payload */
	QueueSlot  *s = &QShared->slots[slot];
	QueueSpiState st;
	Datum		values[3];
	int64		from;
	int			room;
	uint32		epoch;
	int			rc;
	uint64		n,
				i;
	int			nrows;
	int			nfill = 0;
	FillRow    *rows;
	bool		moved = false;
	int64		last_read;
	TransactionId open_group = InvalidTransactionId;
	Snapshot	snap;
	MemoryContext caller = CurrentMemoryContext;
	MemoryContext rowcxt;

	LWLockAcquire(slot_lock(slot), LW_SHARED);
	from = s->read_id;
	room = QShared->window - s->count;
	epoch = s->epoch;
	LWLockRelease(slot_lock(slot));
	if (room <= 0 || frontier <= from)
		return false;
	nrows = Min(room, QUEUE_FILL_ROWS);

	values[0] = Int64GetDatum(from);
	values[1] = Int64GetDatum(frontier);
	values[2] = Int64GetDatum(nrows + 1);
	queue_spi_begin(&st);
	if (plan == NULL)
	{
		Oid			types[3] = {INT8OID, INT8OID, INT8OID};
		SPIPlanPtr	p = SPI_prepare("SELECT m.id, m.xmin::text, m.topic, m.key, m.tableoid"
									"  FROM outbox.messages m"
									" WHERE m.id OPERATOR(pg_catalog.>) $1"
									"   AND m.id OPERATOR(pg_catalog.<=) $2"
									" ORDER BY m.id LIMIT $3",
									3, types);
		SPIPlanPtr	pf = SPI_prepare("SELECT m.id, m.xmin::text, m.topic, m.key, m.tableoid,"
									 "       m.headers, m.payload"
									 "  FROM outbox.messages m"
									 " WHERE m.id OPERATOR(pg_catalog.>) $1"
									 "   AND m.id OPERATOR(pg_catalog.<=) $2"
									 " ORDER BY m.id LIMIT $3",
									 3, types);

		if (p == NULL || SPI_keepplan(p) != 0 || pf == NULL || SPI_keepplan(pf) != 0)
			elog(ERROR, "outbox: could not prepare the queue read");
		plan = p;
		plan_filtered = pf;
	}
	snap = RegisterSnapshot(GetLatestSnapshot());
	rc = SPI_execute_snapshot(qi->filtered ? plan_filtered : plan, values, NULL, snap,
							  InvalidSnapshot, true, false, 0);
	UnregisterSnapshot(snap);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.messages");
	n = SPI_processed;
	last_read = frontier;
	/* a frontier that may cut a transaction: its last row's may go on */
	if (fill_may_split && n > 0 && n <= (uint64) nrows)
		open_group = (TransactionId) strtoul(SPI_getvalue(SPI_tuptable->vals[n - 1],
														  SPI_tuptable->tupdesc, 2), NULL, 10);
	if (n > (uint64) nrows)
	{
		/*
		 * More to read: stop before the extra row, and note whether the
		 * transaction of the last row read goes on past it.
		 */
		bool		isnull;
		char	   *x1 = SPI_getvalue(SPI_tuptable->vals[nrows - 1], SPI_tuptable->tupdesc, 2);
		char	   *x2 = SPI_getvalue(SPI_tuptable->vals[nrows], SPI_tuptable->tupdesc, 2);

		last_read = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[nrows - 1],
												SPI_tuptable->tupdesc, 1, &isnull));
		if (strcmp(x1, x2) == 0)
			open_group = (TransactionId) strtoul(x1, NULL, 10);
		n = nrows;
	}

	/* Route and hash outside the lock (rows outlive SPI's memory). */
	rows = MemoryContextAlloc(caller, sizeof(FillRow) * Max(n, 1));
	rowcxt = AllocSetContextCreate(CurrentMemoryContext, "outbox queue filter",
								   ALLOCSET_DEFAULT_SIZES);
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		char	   *topic = SPI_getvalue(tup, desc, 3);
		char	   *key = SPI_getvalue(tup, desc, 4);
		FillRow    *r;

		if (!queue_matches(qi, tup, desc, topic, key, id, rowcxt))
			continue;
		r = &rows[nfill++];
		r->id = id;
		r->has_key = (key != NULL);
		r->keyhash = key ? hash_bytes_extended((const unsigned char *) key, strlen(key), 0) : 0;
		r->group = (TransactionId) strtoul(SPI_getvalue(tup, desc, 2), NULL, 10);
		r->relid = DatumGetObjectId(SPI_getbinval(tup, desc, 5, &isnull));
	}
	MemoryContextDelete(rowcxt);
	queue_spi_end(&st);

	LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
	if (s->epoch == epoch && s->read_id == from)
	{
		for (i = 0; i < (uint64) nfill; i++)
		{
			QueueEntry *e;

			if (s->count >= QShared->window)
			{
				/*
				 * Full: read again from this message later.  The newest
				 * entry's transaction goes on past what was read if this
				 * message is of it.
				 */
				TransactionId tail = slot_entry(slot, s->count - 1)->group;

				last_read = rows[i].id - 1;
				open_group = (rows[i].group == tail) ? tail : InvalidTransactionId;
				break;
			}
			e = &QEntries[(Size) slot * QShared->window + (s->head + s->count) % QShared->window];
			memset(e, 0, sizeof(QueueEntry));
			e->id = rows[i].id;
			e->has_key = rows[i].has_key;
			e->keyhash = rows[i].keyhash;
			e->group = rows[i].group;
			e->relid = rows[i].relid;
			e->owner = -1;
			e->state = acked_contains(acked, rows[i].id) ? QE_ACKED : QE_FREE;
			s->count++;
		}
		if (last_read > s->read_id)
		{
			s->read_id = last_read;
			moved = true;
		}
		s->open_group = open_group;
		queue_slot_trim(slot);
	}
	LWLockRelease(slot_lock(slot));
	pfree(rows);
	return moved;
}

/*
 * Build a slot's window from the tables when it is not loaded, or when a
 * configuration change may have replayed the queue.  The caller holds
 * s->filling.
 */
static void
queue_load(QueueInfo *qi, int slot, uint64 gen)
{
	QueueSlot  *s = &QShared->slots[slot];
	QueueSpiState st;
	Oid			types[2] = {INT4OID, INT8OID};
	Datum		values[2];
	bool		isnull;
	int64		done;
	int			generation;
	AckedIds	acked = {NULL, 0, 0};
	uint64		i;
	int			rc;
	bool		reload;
	MemoryContext cxt = CurrentMemoryContext;

	values[0] = Int32GetDatum(qi->target_id);
	queue_spi_begin(&st);
	rc = queue_spi_fresh("SELECT p.done_id, p.generation FROM outbox.progress p"
						 " WHERE p.target_id OPERATOR(pg_catalog.=) $1 ORDER BY p.lane LIMIT 1",
						 1, types, values, NULL, 1);
	if (rc != SPI_OK_SELECT || SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox queue \"%s\" has no progress row", qi->name),
				 errhint("Drop the queue and create it again.")));
	done = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	generation = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));

	/*
	 * Rebuild the window when it was never built, or when outbox.replay()
	 * moved the queue back (a new generation).  A rebuild waits until no
	 * transaction holds a message of the queue (meanwhile nothing is handed
	 * out), so no claim is lost and none is handed out twice.  The
	 * receipts are read after the window was emptied: every transaction
	 * that acknowledged in the old window is visible to that snapshot.
	 */
	LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
	reload = !s->loaded || s->generation != generation;
	if (reload && s->loaded)
	{
		int			k;

		for (k = 0; k < s->count; k++)
			if (slot_entry(slot, k)->state == QE_CLAIMED)
				break;
		if (k < s->count)
		{
			s->reload_wanted = true;
			s->config_generation = gen;
			LWLockRelease(slot_lock(slot));
			queue_spi_end(&st);
			return;
		}
	}
	if (reload)
	{
		s->epoch++;
		s->count = 0;
		s->head = 0;
		s->done_id = done;
		s->read_id = done;
		s->open_group = InvalidTransactionId;
		s->generation = generation;
		s->loaded = true;
		s->reload_wanted = false;
	}
	s->config_generation = gen;
	LWLockRelease(slot_lock(slot));

	if (reload)
	{
		values[1] = Int64GetDatum(done);
		rc = queue_spi_fresh("SELECT u.id FROM outbox.receipts r, pg_catalog.unnest(r.ids) u(id)"
							 " WHERE r.target_id OPERATOR(pg_catalog.=) $1"
							 "   AND r.last_id OPERATOR(pg_catalog.>) $2"
							 "   AND u.id OPERATOR(pg_catalog.>) $2",
							 2, types, values, NULL, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "outbox: could not read outbox.receipts");
		acked.n = (int) SPI_processed;
		acked.ids = MemoryContextAlloc(cxt, sizeof(int64) * Max(acked.n, 1));
		for (i = 0; i < SPI_processed; i++)
			acked.ids[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 1, &isnull));
		qsort(acked.ids, acked.n, sizeof(int64), cmp_int64);
	}
	queue_spi_end(&st);

	if (reload)
	{
		/*
		 * Acknowledged messages lie within a window's length of done_id:
		 * fill until they are all placed (or the window is full).
		 */
		while (acked.next < acked.n)
		{
			long		recheck;
			bool		filled;
			int64		frontier = outbox_standby_frontier(&recheck);

			/*
			 * Up to the last acknowledged id at least, whatever the standby
			 * slots confirmed so far in this backend: each of those ids was
			 * handed out once already (I9 was checked then), and a receipt
			 * not placed is forgotten, its message handed out again.
			 */
			fill_may_split = acked.ids[acked.n - 1] > frontier;
			frontier = Max(frontier, Min(acked.ids[acked.n - 1], outbox_compute_frontier()));
			filled = queue_fill(qi, slot, frontier, &acked);
			fill_may_split = false;
			if (!filled)
				break;
		}
		pfree(acked.ids);
	}
}

/*
 * Fill the window (and first build it, if load) until it holds want
 * messages or everything up to the frontier, then let others look.
 * Returns whether the window's read position moved.
 */
bool
queue_fill_guarded(QueueInfo *qi, int slot, int64 frontier, bool load, uint64 gen, int want)
{
	QueueSlot  *s = &QShared->slots[slot];
	bool		moved = false;

	PG_TRY();
	{
		if (load)
			queue_load(qi, slot, gen);
		/*
		 * Read on while the window holds fewer than the caller wants and
		 * there is more: messages of other topics may come first.
		 */
		while (queue_fill(qi, slot, frontier, NULL))
		{
			bool		more;

			moved = true;
			LWLockAcquire(slot_lock(slot), LW_SHARED);
			more = s->count < Min(want, QShared->window) && s->read_id < frontier;
			LWLockRelease(slot_lock(slot));
			if (!more)
				break;
			CHECK_FOR_INTERRUPTS();
		}
	}
	PG_CATCH();
	{
		LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
		s->filling = false;
		s->filler = -1;
		LWLockRelease(slot_lock(slot));
		outbox_queue_wake();
		PG_RE_THROW();
	}
	PG_END_TRY();
	LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
	s->filling = false;
	s->filler = -1;
	LWLockRelease(slot_lock(slot));
	/* Receivers that found the fill under way look again. */
	outbox_queue_wake();
	return moved;
}
