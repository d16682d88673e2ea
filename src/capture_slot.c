/*-------------------------------------------------------------------------
 *
 * capture_slot.c
 *	  The replication slot of a database's WAL capture, and the state the
 *	  capture shares: what the launcher, SQL and the worker ask of it.
 *
 * Each database has its own slot, outbox_capture_<database oid>, made by
 * outbox.capture() with the plugin "outbox" (capture_plugin.c), held by
 * the capture worker (capture_worker.c) whenever it runs, and dropped by
 * the worker once no WAL capture is left.  The state of each database's
 * capture (worker, offset, counts, last error) is in shared memory, one
 * entry per database directory slot (shmem.c), read by
 * outbox.capture_status() and the view outbox.captures.
 *
 * The launcher (launcher.c) starts the worker when a WAL capture may exist:
 * at server start when the slot exists, and when outbox.capture() or
 * uncapture() wakes it (outbox.capture_wake(), at the end of their
 * transaction).  A transaction that names a trace and writes in such a
 * database leaves the trace in its WAL for the plugin.
 *
 * Confirming the slot (below, "failover"): the slot is confirmed only up to
 * an offset that is durable and, with outbox.standby_slots, flushed by the
 * standbys named, so that a copy of the slot a standby keeps is never ahead
 * of what was handed off.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "replication/message.h"
#include "replication/slot.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/pg_lsn.h"

#include "outbox.h"
#include "compat.h"
#include "capture.h"
#include "capture_wal.h"

PG_FUNCTION_INFO_V1(outbox_capture_wake);
PG_FUNCTION_INFO_V1(outbox_capture_status);

PG_FUNCTION_INFO_V1(outbox_capture_slot_name);

/* The slot name of database dboid, into name (NAMEDATALEN bytes). */
static void
capture_slot_name_of(Oid dboid, char *name)
{
	snprintf(name, NAMEDATALEN, "outbox_capture_%u", dboid);
}

const char *
capture_slot_name(void)
{
	static char name[NAMEDATALEN];

	if (name[0] == '\0')
		capture_slot_name_of(MyDatabaseId, name);
	return name;
}

/* outbox.capture_slot_name() -> name */
Datum
outbox_capture_slot_name(PG_FUNCTION_ARGS)
{
	PG_RETURN_DATUM(DirectFunctionCall1(namein, CStringGetDatum(capture_slot_name())));
}

static CaptureShared *capture_array = NULL;
/* This backend's database's entry, once capture_mine() found it. */
CaptureShared *capture_shared = NULL;

Size
outbox_capture_shmem_size(void)
{
	return mul_size(outbox_max_databases, sizeof(CaptureShared));
}

void
outbox_capture_shmem_init(void)
{
	bool		found;

	capture_array = ShmemInitStruct("outbox capture", outbox_capture_shmem_size(), &found);
	if (!found)
	{
		int			i;

		memset(capture_array, 0, outbox_capture_shmem_size());
		for (i = 0; i < outbox_max_databases; i++)
			SpinLockInit(&capture_array[i].mutex);
	}
}

/*
 * Whether dboid's replication slot exists: then a WAL capture may exist,
 * and the worker looks once after a start.  (It drops the slot when the
 * last WAL capture goes, so a database without one starts no worker.)
 */
static bool
capture_slot_exists(Oid dboid)
{
	char		name[NAMEDATALEN];

	capture_slot_name_of(dboid, name);
	return SearchNamedReplicationSlot(name, true) != NULL;
}

/*
 * The entry of slot index for dboid; one another database left is made
 * afresh, wanted when look (capture_slot_exists, asked before the mutex).
 * Caller holds its mutex.
 */
static CaptureShared *
capture_entry_locked(CaptureShared *c, Oid dboid, bool look)
{
	if (c->dboid != dboid)
	{
		c->dboid = dboid;
		c->wanted = look;
		c->wakes = 0;
		c->pid = 0;
		c->worker_latch = NULL;
		strlcpy(c->state, "stopped", sizeof(c->state));
		c->last_error[0] = '\0';
		c->handed_lsn = c->end_lsn = c->decoded_lsn = InvalidXLogRecPtr;
		c->handed_at = 0;
		c->handed = c->skipped = 0;
	}
	return c;
}

/* This database's entry (its slot is taken if need be). */
bool
capture_mine(bool report)
{
	bool		look = false;

	if (capture_array == NULL)
		return false;
	if (report)
		outbox_db_attach();
	else if (!outbox_db_attach_noerror())
		return false;
	capture_shared = &capture_array[outbox_db_index()];
	if (capture_shared->dboid != MyDatabaseId)
		look = capture_slot_exists(MyDatabaseId);
	SpinLockAcquire(&capture_shared->mutex);
	capture_entry_locked(capture_shared, MyDatabaseId, look);
	SpinLockRelease(&capture_shared->mutex);
	return true;
}

/* For the launcher: should a capture worker run in dboid (slot index)? */
bool
outbox_capture_wanted(Oid dboid, int index, Latch *launcher_latch)
{
	CaptureShared *c;
	OutboxDbInfo info;
	bool		wanted;
	bool		look = false;

	if (capture_array == NULL || wal_level < OUTBOX_CAPTURE_WAL_LEVEL)
		return false;
	/* the slot must still be dboid's, or its entry is another's */
	if (!outbox_db_info(index, &info) || info.dboid != dboid)
		return false;
	c = &capture_array[index];
	if (c->dboid != dboid)
		look = capture_slot_exists(dboid);
	SpinLockAcquire(&c->mutex);
	capture_entry_locked(c, dboid, look);
	c->launcher_latch = launcher_latch;
	wanted = c->wanted;
	SpinLockRelease(&c->mutex);
	return wanted;
}

void
capture_set_state(const char *state, const char *error)
{
	SpinLockAcquire(&capture_shared->mutex);
	strlcpy(capture_shared->state, state, sizeof(capture_shared->state));
	if (error != NULL)
		strlcpy(capture_shared->last_error, error, sizeof(capture_shared->last_error));
	SpinLockRelease(&capture_shared->mutex);
}

/* outbox.capture_wake() was called in this transaction. */
static bool wake_at_commit = false;

static void
capture_wake_now(void)
{
	Latch	   *launcher;
	Latch	   *worker;

	SpinLockAcquire(&capture_shared->mutex);
	capture_shared->wanted = true;
	capture_shared->wakes++;
	launcher = capture_shared->launcher_latch;
	worker = capture_shared->pid != 0 ? capture_shared->worker_latch : NULL;
	SpinLockRelease(&capture_shared->mutex);
	if (launcher)
		SetLatch(launcher);
	if (worker)
		SetLatch(worker);
}

/*
 * A transaction that names a trace and wrote something, in a database a
 * WAL capture decodes, writes the trace into its WAL before it commits, for
 * capture_message_cb.  One that names none pays the first test only.
 */
static void
capture_log_trace(void)
{
	StringInfoData buf;

	if (!outbox_trace_active() || !XLogLogicalInfoActive() ||
		!TransactionIdIsValid(GetTopTransactionIdIfAny()) ||
		!capture_slot_exists(MyDatabaseId))
		return;
	initStringInfo(&buf);
	appendStringInfoString(&buf, outbox_traceparent);
	if (outbox_tracestate[0] != '\0')
	{
		appendStringInfoChar(&buf, '\n');
		appendStringInfoString(&buf, outbox_tracestate);
	}
	outbox_log_logical_message(OUTBOX_TRACE_PREFIX, buf.data, buf.len);
	pfree(buf.data);
}

static void
capture_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE)
	{
		capture_log_trace();
		return;
	}

	/*
	 * At abort too: a capture() that made the slot and then failed leaves
	 * the slot, which the worker drops when it finds no WAL capture.
	 */
	if ((event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT) &&
		wake_at_commit && capture_mine(false))
		capture_wake_now();
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE)
		wake_at_commit = false;
}

/* Register the transaction callback; from _PG_init. */
void
outbox_capture_init(void)
{
	RegisterXactCallback(capture_xact_callback, NULL);
}

/*
 * outbox.capture_wake(): a WAL capture was added or removed.  When the
 * transaction ends (the worker must see the change), the launcher starts
 * the worker if it is not running, and a running one looks again.
 */
Datum
outbox_capture_wake(PG_FUNCTION_ARGS)
{
	wake_at_commit = true;
	PG_RETURN_VOID();
}

/*
 * outbox.capture_status() -> (pid, state, last_error, last_commit_lsn,
 * last_commit_at, offset_lsn, handed, skipped, decoded_lsn)
 */
Datum
outbox_capture_status(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[9];
	bool		nulls[9] = {0};
	CaptureShared copy;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (!capture_mine(true))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.capture_status() requires the outbox library to be preloaded")));
	SpinLockAcquire(&capture_shared->mutex);
	memcpy(&copy, capture_shared, sizeof(copy));
	SpinLockRelease(&capture_shared->mutex);
	values[0] = Int32GetDatum(copy.pid);
	nulls[0] = copy.pid == 0;
	values[1] = CStringGetTextDatum(copy.state);
	values[2] = CStringGetTextDatum(copy.last_error);
	nulls[2] = copy.last_error[0] == '\0';
	values[3] = LSNGetDatum(copy.handed_lsn);
	nulls[3] = copy.handed_lsn == InvalidXLogRecPtr;
	values[4] = TimestampTzGetDatum(copy.handed_at);
	nulls[4] = copy.handed_at == 0;
	values[5] = LSNGetDatum(copy.end_lsn);
	nulls[5] = copy.end_lsn == InvalidXLogRecPtr;
	values[6] = Int64GetDatum((int64) copy.handed);
	values[7] = Int64GetDatum((int64) copy.skipped);
	values[8] = LSNGetDatum(copy.decoded_lsn);
	nulls[8] = copy.decoded_lsn == InvalidXLogRecPtr;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/* Why the slot was invalidated, in words, for last_error. */
const char *
capture_invalidation_text(ReplicationSlot *slot)
{
#ifdef OUTBOX_HAVE_SLOT_INVALIDATION_CAUSE
	switch (slot->data.invalidated)
	{
		case RS_INVAL_WAL_REMOVED:
			break;
		case RS_INVAL_HORIZON:
			return "rows it needed were removed (a conflict with recovery)";
		case RS_INVAL_WAL_LEVEL:
			return "wal_level became too low for logical decoding";
#ifdef OUTBOX_HAVE_IDLE_SLOT_TIMEOUT
		case RS_INVAL_IDLE_TIMEOUT:
			return "it was idle longer than idle_replication_slot_timeout";
#endif
		default:
			return "for a reason this version of outbox does not know";
	}
#endif
	return "the WAL it needed was removed (max_slot_wal_keep_size)";
}

/*---- failover ----*/

/*
 * Confirming the slot.  A standby with sync_replication_slots keeps a copy
 * of the slot with its confirmed position (PostgreSQL 17), and when it is
 * promoted the worker there decodes from the offset that reached it: had the
 * copy been confirmed beyond that offset, the transactions in between would
 * be captured by neither server.  So with outbox.standby_slots set, the slot
 * is confirmed up to an offset only once the listed standbys have flushed
 * the hand-off that wrote it.  At most two offsets wait: the oldest, and the
 * newest, which each hand-off replaces.
 */
typedef struct CaptureConfirm
{
	XLogRecPtr	offset;			/* to confirm the slot up to */
	XLogRecPtr	end;			/* the end of the hand-off that stored it */
} CaptureConfirm;

static CaptureConfirm confirms[2];
static int	nconfirms = 0;

/* The standbys stream: look often.  The hold-back was let go (said so). */
bool		capture_confirm_eager = false;
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
static bool confirm_released = false;
#endif

/*
 * Confirm what the standbys have flushed.  Holding back protects only a copy
 * a standby can still take: a listed slot that does not exist, was
 * invalidated or is logical has no standby to protect, and a standby slot
 * behind by more than half of max_slot_wal_keep_size will soon be
 * invalidated, and the capture slot, held back behind it, with it.  Then the
 * slot is confirmed at once, said once: a copy may be ahead after all, which
 * a promoted server reports as lost.
 */
void
capture_confirm_ready(void)
{
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
	OutboxStandbySlot worst;
	XLogRecPtr	flushed;
	char		why[NAMEDATALEN + 128];
#endif

	capture_confirm_eager = false;
	if (nconfirms == 0)
		return;
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
	if (outbox_standby_gated())
	{
		flushed = outbox_standby_confirmed(&worst);
		while (nconfirms > 0 && flushed != InvalidXLogRecPtr && confirms[0].end <= flushed)
		{
			LogicalConfirmReceivedLocation(confirms[0].offset);
			confirms[0] = confirms[1];
			nconfirms--;
			if (confirm_released)
				ereport(LOG,
						(errmsg("outbox capture confirms replication slot \"%s\" again only as far as the standbys of outbox.standby_slots flushed",
								CAPTURE_SLOT)));
			confirm_released = false;
		}
		if (nconfirms == 0)
			return;
		why[0] = '\0';
		if (worst.state == OUTBOX_STANDBY_MISSING || worst.state == OUTBOX_STANDBY_INVALIDATED ||
			worst.state == OUTBOX_STANDBY_LOGICAL)
			snprintf(why, sizeof(why), "standby slot \"%s\" %s", worst.name,
					 outbox_standby_state_name(worst.state));
		else if (max_slot_wal_keep_size_mb >= 0 && worst.restart != InvalidXLogRecPtr &&
				 GetXLogInsertRecPtr() - worst.restart >
				 (uint64) max_slot_wal_keep_size_mb * 1024 * 1024 / 2)
			snprintf(why, sizeof(why), "standby slot \"%s\" is behind by more than half of max_slot_wal_keep_size",
					 worst.name);
		if (why[0] == '\0')
		{
			capture_confirm_eager = worst.state == OUTBOX_STANDBY_STREAMING;
			return;
		}
		if (!confirm_released)
			ereport(LOG,
					(errmsg("outbox capture confirms replication slot \"%s\" without waiting for the standbys: %s",
							CAPTURE_SLOT, why),
					 errdetail("A standby's copy of the slot may get ahead of the capture's offset; promoted, that standby would show the WAL capture lost.")));
		confirm_released = true;
	}
#endif
	LogicalConfirmReceivedLocation(confirms[nconfirms - 1].offset);
	nconfirms = 0;
}

/* The slot may be confirmed up to offset once the WAL up to end is safe. */
void
capture_confirm(XLogRecPtr offset, XLogRecPtr end)
{
	if (nconfirms < 2)
		nconfirms++;
	confirms[nconfirms - 1].offset = offset;
	confirms[nconfirms - 1].end = end;
	capture_confirm_ready();
}

/*
 * Whether a standby keeps a copy of the slot.  The primary cannot see a
 * standby's slots, but a standby with hot_standby_feedback reports the
 * catalog_xmin of its logical slots in its physical slot here, and one that
 * keeps a copy of ours has one.  Checked while outbox.standby_slots is set;
 * a standby without a copy is reported after CAPTURE_COPY_GRACE_MS (a
 * standby just started needs a while to copy the slot and report it), and
 * once again when that changes.
 */
#define CAPTURE_COPY_GRACE_MS	20000

typedef enum CaptureCopy
{
	COPY_UNKNOWN,
	COPY_UNGATED,				/* outbox.standby_slots is empty */
	COPY_KEPT,					/* some listed standby reports a copy */
	COPY_NONE,					/* none does */
	COPY_UNSUPPORTED			/* no failover slots before PostgreSQL 17 */
} CaptureCopy;

static CaptureCopy copy_seen = COPY_UNKNOWN;
static CaptureCopy copy_reported = COPY_UNKNOWN;
static TimestampTz copy_since = 0;

#define COPY_NONE_ERROR "no standby named by outbox.standby_slots keeps a copy of the capture slot: a failover loses this capture"

void
capture_check_copies(void)
{
	CaptureCopy state;
	TimestampTz now = GetCurrentTimestamp();

	if (!outbox_standby_gated())
		state = COPY_UNGATED;
	else
	{
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
		state = outbox_standby_catalog_holders() > 0 ? COPY_KEPT : COPY_NONE;
#else
		state = COPY_UNSUPPORTED;
#endif
	}
	if (state != copy_seen)
	{
		copy_seen = state;
		copy_since = now;
	}
	if (state == copy_reported ||
		(state == COPY_NONE && !TimestampDifferenceExceeds(copy_since, now, CAPTURE_COPY_GRACE_MS)))
		return;

	if (state == COPY_NONE)
	{
		SpinLockAcquire(&capture_shared->mutex);
		strlcpy(capture_shared->last_error, COPY_NONE_ERROR, sizeof(capture_shared->last_error));
		SpinLockRelease(&capture_shared->mutex);
		ereport(WARNING,
				(errmsg("no standby named by outbox.standby_slots keeps a copy of replication slot \"%s\"",
						CAPTURE_SLOT),
				 errdetail("None of the physical slots \"%s\" reports a catalog_xmin, which a standby keeping a synchronized copy of a logical slot reports; after a failover to such a standby, WAL capture is lost.",
						   outbox_standby_slots),
				 errhint("On the standbys set sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name, and dbname in primary_conninfo.")));
	}
	else if (state == COPY_UNSUPPORTED)
	{
		ereport(WARNING,
				(errmsg("WAL capture cannot follow a failover on PostgreSQL %s", PG_MAJORVERSION),
				 errdetail("Standbys keep copies of logical replication slots from PostgreSQL 17 on; outbox.standby_slots is set, but after a failover the capture slot is not on the promoted server."),
				 errhint("After a failover, capture the tables again with a snapshot: outbox.uncapture(), then outbox.capture(..., mode => 'wal', snapshot => true).")));
	}
	else if (copy_reported == COPY_NONE)
	{
		SpinLockAcquire(&capture_shared->mutex);
		if (strcmp(capture_shared->last_error, COPY_NONE_ERROR) == 0)
			capture_shared->last_error[0] = '\0';
		SpinLockRelease(&capture_shared->mutex);
		if (state == COPY_KEPT)
			ereport(LOG,
					(errmsg("a standby named by outbox.standby_slots keeps a copy of replication slot \"%s\" now",
							CAPTURE_SLOT)));
	}
	copy_reported = state;
}
