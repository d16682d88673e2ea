/*-------------------------------------------------------------------------
 *
 * capture_worker.c
 *	  The capture worker: it decodes the database's WAL in-process and hands
 *	  each source transaction's changes into outbox.messages, exactly once.
 *
 * Decoding.  The worker holds the slot (capture_slot.c) and drives logical
 * decoding itself: XLogReadRecord and LogicalDecodingProcessRecord up to
 * the flushed end of WAL, the plugin's callbacks (capture_plugin.c)
 * collecting messages; between records it hands them off, in a
 * transaction of its own.
 *
 * The offset (the seed's "restart from 6, not 8").  Moving a slot is not
 * transactional, so the offset is a row, outbox.capture_progress, written
 * in the same local transaction as the messages it covers:
 *	  end_lsn			every source transaction whose commit record begins
 *						below it is handed off (or had nothing to capture)
 *	  part_commit_lsn, parts_done
 *						a source transaction larger than a part of which the
 *						first parts_done parts are handed off
 * Decoding always starts at end_lsn (snapbuild skips transactions
 * committed before its start point), and the slot is confirmed only up to
 * an end_lsn whose transaction is durable.  So after a crash at any moment
 * the stored offset says exactly what was handed off: nothing is lost and
 * nothing is handed off twice.  A slot found confirmed beyond the offset
 * (advanced by somebody else) or invalidated is a gap: state "lost".
 *
 * Parts.  A source transaction larger than a part (capture_decode.c) is
 * handed off one part per local transaction: the worker collects part k,
 * hands it off with parts_done = k + 1, and decodes again from end_lsn,
 * skipping the parts already handed off.
 *
 * The worker exits, dropping the slot, once no WAL capture is left.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlogutils.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/decode.h"
#include "replication/logical.h"
#include "replication/origin.h"
#include "replication/slot.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/pg_lsn.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "compat.h"
#include "capture.h"
#include "capture_wal.h"

PGDLLEXPORT void outbox_capture_main(Datum main_arg);
static void capture_loop(LogicalDecodingContext **ctxp, XLogRecPtr end_lsn,
						 XLogRecPtr part_lsn, int parts_done, uint64 wakes_seen);

/* The writer callbacks are not used: the plugin writes nothing. */
static void
capture_prepare_write(LogicalDecodingContext *ctx, XLogRecPtr lsn, TransactionId xid, bool last_write)
{
}

static void
capture_write(LogicalDecodingContext *ctx, XLogRecPtr lsn, TransactionId xid, bool last_write)
{
}

/*---- the worker ----*/

/* Run sql (no result rows) in the current transaction. */
static void
capture_spi_exec(const char *sql, int expected)
{
	int			rc = SPI_execute(sql, false, 0);

	if (rc != expected)
		elog(ERROR, "outbox capture: \"%s\" failed: %s", sql, SPI_result_code_string(rc));
}

/*
 * Drop the slot if no WAL capture exists, holding the advisory lock
 * CAPTURE_LOCK_KEY, which outbox.capture() holds shared from before it
 * looks for the slot until it commits: a capture committed meanwhile keeps
 * the slot.  Only this worker, which has no transaction id, waits on it
 * exclusively, so it closes no cycle of waits.  Returns whether no WAL
 * capture exists.
 */
static bool
capture_drop_slot_if_unused(void)
{
	bool		unused;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute("SELECT pg_catalog.to_regclass('outbox.captured_tables') IS NOT NULL",
					true, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox capture: cannot look for outbox.captured_tables");
	unused = true;
	if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &unused)))
	{
		if (SPI_execute("SELECT pg_catalog.pg_advisory_xact_lock(" CAPTURE_LOCK_KEY ")",
						false, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox capture: cannot take the capture lock");
		PopActiveSnapshot();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (SPI_execute("SELECT 1 FROM outbox.captured_tables WHERE mode OPERATOR(pg_catalog.=) 'wal' LIMIT 1",
						true, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox capture: cannot read outbox.captured_tables");
		unused = SPI_processed == 0;
		/* the offset goes with the slot: a new slot starts afresh */
		if (unused)
			capture_spi_exec(psprintf("DELETE FROM outbox.capture_progress WHERE slot_name OPERATOR(pg_catalog.=) '%s'",
									  CAPTURE_SLOT),
							 SPI_OK_DELETE);
	}
	else
		unused = true;
	if (unused && SearchNamedReplicationSlot(CAPTURE_SLOT, true) != NULL)
	{
		ReplicationSlotDrop(CAPTURE_SLOT, true);
		ereport(LOG,
				(errmsg("outbox capture dropped replication slot \"%s\": no table is captured from the WAL",
						CAPTURE_SLOT)));
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	return unused;
}

static void capture_extension_dropped(const char *error, uint64 wakes_seen);

/*
 * Lock the two tables the offset read uses, in this transaction, without
 * waiting for either: the oid of one that another transaction holds is
 * returned (InvalidOid when both are locked).  A worker that waited for
 * one while holding the other could close a deadlock with a DROP EXTENSION
 * (which takes every table of the extension) in which the drop is the
 * transaction rolled back.  *gone: the extension's tables are not there.
 */
static Oid
capture_lock_offset_tables(bool *gone)
{
	Oid			nsp = get_namespace_oid("outbox", true);
	Oid			rels[2];
	int			i;

	*gone = true;
	if (!OidIsValid(nsp))
		return InvalidOid;
	rels[0] = get_relname_relid("captured_tables", nsp);
	rels[1] = get_relname_relid("capture_progress", nsp);
	if (!OidIsValid(rels[0]) || !OidIsValid(rels[1]))
		return InvalidOid;
	*gone = false;
	for (i = 0; i < lengthof(rels); i++)
		if (!ConditionalLockRelationOid(rels[i], AccessShareLock))
			return rels[i];
	return InvalidOid;
}

/*
 * Whether any WAL capture exists, and the stored offset (read in a
 * transaction).  A table of the two held by someone else is waited for in
 * a transaction that holds nothing else, and the read begins again; if the
 * extension was dropped meanwhile, the worker stops here.
 */
static bool
capture_read_offset(XLogRecPtr *end_lsn, XLogRecPtr *part_lsn, int *parts_done,
					uint64 wakes_seen)
{
	bool		any;
	bool		gone;
	bool		waited = false;
	Oid			busy;

	*end_lsn = InvalidXLogRecPtr;
	*part_lsn = InvalidXLogRecPtr;
	*parts_done = 0;
	for (;;)
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		busy = capture_lock_offset_tables(&gone);
		if (gone)
		{
			/* no extension (yet, or any more): nothing is captured */
			CommitTransactionCommand();
			if (waited)
				capture_extension_dropped(NULL, wakes_seen);
			return false;
		}
		if (!OidIsValid(busy))
			break;
		CommitTransactionCommand();
		StartTransactionCommand();
		pgstat_report_activity(STATE_RUNNING, "waiting to read the outbox capture offset");
		LockRelationOid(busy, AccessShareLock);
		pgstat_report_activity(STATE_IDLE, NULL);
		CommitTransactionCommand();
		waited = true;
	}
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_execute("SELECT 1 FROM outbox.captured_tables WHERE mode OPERATOR(pg_catalog.=) 'wal' LIMIT 1",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox capture: cannot read outbox.captured_tables");
	any = SPI_processed > 0;
	if (SPI_execute(psprintf("SELECT end_lsn, part_commit_lsn, parts_done FROM outbox.capture_progress"
							 " WHERE slot_name OPERATOR(pg_catalog.=) '%s'", CAPTURE_SLOT),
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox capture: cannot read outbox.capture_progress");
	if (SPI_processed > 0)
	{
		bool		isnull;
		Datum		d;

		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		if (!isnull)
			*end_lsn = DatumGetLSN(d);
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
		if (!isnull)
			*part_lsn = DatumGetLSN(d);
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull);
		if (!isnull)
			*parts_done = DatumGetInt32(d);
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	return any;
}

/*
 * Take the extension itself in share mode, first: a DROP EXTENSION takes it
 * exclusively before any of its tables, so the hand-off waits for a drop
 * (or the drop for it) holding none of them.  Returns the extension's oid
 * (InvalidOid: there is none).  A drop that committed meanwhile, or an
 * extension other than expected when that is set (one created again while the
 * hand-off waited), fails the hand-off, which ends in the drop's own stop
 * or a restart for the new extension.
 */
static Oid
capture_lock_extension(Oid expected)
{
	Oid			ext = get_extension_oid("outbox", true);

	if (!OidIsValid(ext))
		return InvalidOid;
	LockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock);
	/* dropped (and perhaps created again) while this waited */
	if (get_extension_oid("outbox", true) != ext ||
		(OidIsValid(expected) && ext != expected))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"outbox\" was dropped while the capture worker waited to hand off")));
	return ext;
}

/*
 * Lock, without waiting, the tables a hand-off writes (the offset's, and
 * those a store of messages takes when it has messages): the oid of one
 * another transaction holds is returned, its mode in *mode (InvalidOid when
 * all are held now, or the extension's tables are gone).  The offset's
 * table is taken in EXCLUSIVE mode: its upsert would otherwise wait for a
 * row that a session locked or changed (FOR SHARE, UPDATE, DELETE, all
 * under table locks that EXCLUSIVE conflicts with), holding the
 * extension.  Readers (ACCESS SHARE) are not kept out; only this worker
 * writes the table while its slot exists.
 */
static Oid
capture_lock_handoff_tables(bool store, LOCKMODE *mode)
{
	Oid			nsp = get_namespace_oid("outbox", true);
	Oid			rel = OidIsValid(nsp) ? get_relname_relid("capture_progress", nsp) : InvalidOid;

	*mode = ExclusiveLock;
	if (OidIsValid(rel) && !ConditionalLockRelationOid(rel, *mode))
		return rel;
	return store ? outbox_storage_try_lock(mode) : InvalidOid;
}

/*
 * Hand off what the pass collected, with the new offset, in one local
 * transaction; durable when this returns.  It holds the extension in share
 * mode and does not wait for one of its tables (nor a row of the offset's)
 * meanwhile: a table another transaction holds is waited for in a
 * transaction that holds nothing (a session that locked it may be about to
 * drop the extension), and the hand-off begins again.  Not covered: a
 * session holding only an index or a TOAST table of the extension's
 * exclusively (ALTER INDEX ... SET TABLESPACE, REINDEX of a TOAST table)
 * and then dropping the extension can still lose a deadlock to it.
 */
static void
capture_handoff(XLogRecPtr end_lsn, XLogRecPtr part_lsn, int parts_done,
				uint64 wakes_seen)
{
	int			i;
	char		sql[512];
	char		part[64];
	Oid			ext = InvalidOid;
	Oid			busy;
	LOCKMODE	mode;

	for (;;)
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		if (!OidIsValid(ext))
			ext = capture_lock_extension(InvalidOid);
		else if (get_extension_oid("outbox", true) != ext)
		{
			/* dropped (or created again) while this waited for a table */
			CommitTransactionCommand();
			if (!outbox_extension_installed())
				capture_extension_dropped(NULL, wakes_seen);
			ereport(LOG,
					(errmsg("outbox capture restarts: the extension was created again")));
			proc_exit(1);
		}
		else
			(void) capture_lock_extension(ext);
		busy = capture_lock_handoff_tables(capture_dec->nmsgs > 0, &mode);
		if (!OidIsValid(busy))
			break;
		CommitTransactionCommand();
		StartTransactionCommand();
		pgstat_report_activity(STATE_RUNNING, "waiting to hand off outbox captured changes");
		LockRelationOid(busy, mode);
		pgstat_report_activity(STATE_IDLE, NULL);
		CommitTransactionCommand();
	}
	replorigin_session_origin = DoNotReplicateId;
	PG_TRY();
	{
		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		for (i = 0; i < capture_dec->nmsgs; i++)
			outbox_buffer_append(&capture_dec->msgs[i].msg);
		if (part_lsn != InvalidXLogRecPtr)
			snprintf(part, sizeof(part), "'%X/%X'::pg_lsn", LSN_FORMAT_ARGS(part_lsn));
		else
			strlcpy(part, "NULL::pg_lsn", sizeof(part));
		snprintf(sql, sizeof(sql),
				 "INSERT INTO outbox.capture_progress AS p (slot_name, end_lsn, part_commit_lsn,"
				 " parts_done, updated_at) VALUES ('%s', '%X/%X'::pg_lsn, %s, %d, now())"
				 " ON CONFLICT (slot_name) DO UPDATE SET end_lsn = excluded.end_lsn,"
				 " part_commit_lsn = excluded.part_commit_lsn, parts_done = excluded.parts_done,"
				 " updated_at = excluded.updated_at",
				 CAPTURE_SLOT, LSN_FORMAT_ARGS(end_lsn), part, parts_done);
		capture_spi_exec(sql, SPI_OK_INSERT);
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_FINALLY();
	{
		replorigin_session_origin = InvalidRepOriginId;
	}
	PG_END_TRY();
	/* synchronous_commit is on for this worker: the commit is flushed */
	XLogFlush(XactLastCommitEnd);

	SpinLockAcquire(&capture_shared->mutex);
	capture_shared->end_lsn = end_lsn;
	capture_shared->handed += capture_dec->nmsgs;
	capture_shared->skipped += capture_dec->skipped;
	if (capture_dec->last_commit_lsn != InvalidXLogRecPtr)
	{
		capture_shared->handed_lsn = capture_dec->last_commit_lsn;
		capture_shared->handed_at = capture_dec->last_commit_time;
	}
	if (capture_dec->error[0])
		strlcpy(capture_shared->last_error, capture_dec->error, sizeof(capture_shared->last_error));
	SpinLockRelease(&capture_shared->mutex);
	capture_dec->skipped = 0;
	capture_dec->error[0] = '\0';
}

static void
capture_exit_idle(uint64 wakes_seen)
{
	SpinLockAcquire(&capture_shared->mutex);
	if (capture_shared->wakes == wakes_seen)
		capture_shared->wanted = false;
	SpinLockRelease(&capture_shared->mutex);
	proc_exit(0);
}

/*
 * DROP EXTENSION: nothing is captured any more.  The worker drops its
 * replication slot (as a worker started after the drop would) and exits
 * without asking to be started again.  error: what a read under way when
 * the drop committed failed with, or NULL.
 */
static void
capture_extension_dropped(const char *error, uint64 wakes_seen)
{
	ereport(LOG,
			(errmsg("outbox capture stops: the extension was dropped"),
			 error ? errdetail("It was dropped while the capture worker read its tables: %s", error) : 0));
	if (MyReplicationSlot != NULL)
		ReplicationSlotRelease();
	(void) capture_drop_slot_if_unused();
	capture_set_state("stopped", NULL);
	capture_exit_idle(wakes_seen);
}

static void
capture_lost(const char *why, uint64 wakes_seen)
{
	ereport(WARNING,
			(errmsg("outbox capture from the WAL is lost: %s", why),
			 errdetail("Changes after the last handed-off transaction may be missing."),
			 errhint("Capture the tables again with a snapshot: outbox.uncapture() each WAL capture, then outbox.capture(..., mode => 'wal', snapshot => true).")));
	capture_set_state("lost", why);
	capture_exit_idle(wakes_seen);
}

static void
capture_worker_exit(int code, Datum arg)
{
	SpinLockAcquire(&capture_shared->mutex);
	/* the entry may serve another database by now: leave it alone then */
	if (capture_shared->dboid == MyDatabaseId && capture_shared->pid == MyProcPid)
	{
		capture_shared->pid = 0;
		capture_shared->worker_latch = NULL;
		if (strcmp(capture_shared->state, "lost") != 0)
			strlcpy(capture_shared->state, "stopped", sizeof(capture_shared->state));
	}
	SpinLockRelease(&capture_shared->mutex);
}

/*
 * Whether outbox.captured_tables is still the table the worker found at its
 * start (the extension was not dropped and created again meanwhile: the
 * worker then exits, and the next one starts afresh).
 */
static bool
capture_same_extension(void)
{
	Oid			nsp;
	Oid			relid = InvalidOid;

	StartTransactionCommand();
	nsp = get_namespace_oid("outbox", true);
	if (OidIsValid(nsp))
		relid = get_relname_relid("captured_tables", nsp);
	CommitTransactionCommand();
	return relid == capture_dec->captured_tables;
}

/*
 * Test only (outbox.test_fault): while the setting names point, stand still
 * (answering signals and reloads), for at most max_secs seconds (0: no
 * limit).
 */
static void
capture_fault_wait(const char *point, int max_secs)
{
	int			waited;

	if (!outbox_fault(point))
		return;
	ereport(LOG, (errmsg("outbox capture: test fault \"%s\"", point)));
	for (waited = 0; (max_secs == 0 || waited < max_secs * 10) && outbox_fault(point); waited++)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 100, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
	}
}

/* Test only (outbox.test_fault): die as a crash would, at a named point. */
static void
capture_fault(const char *point)
{
	if (outbox_fault(point))
	{
		ereport(LOG, (errmsg("outbox capture: test fault \"%s\"", point)));
		kill(MyProcPid, SIGKILL);
		pg_usleep(10000000L);
	}
}

void
outbox_capture_main(Datum main_arg)
{
	XLogRecPtr	end_lsn;
	XLogRecPtr	part_lsn;
	int			parts_done;
	uint64		wakes_seen;
	LogicalDecodingContext *ctx = NULL;
	ReplicationSlot *slot;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* main_arg is the database's oid, bgw_extra its name (launcher.c) */
	BackgroundWorkerInitializeConnection(MyBgworkerEntry->bgw_extra, NULL, 0);
	if (MyDatabaseId != DatumGetObjectId(main_arg))
		proc_exit(1);			/* renamed meanwhile: the launcher looks again */
	SetConfigOption("synchronous_commit", "on", PGC_SUSET, PGC_S_OVERRIDE);
	/* a superuser's queries: nothing of the database's search_path */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	/* a trace set for the database or role is not the decoded transactions' */
	SetConfigOption("outbox.traceparent", "", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("outbox.tracestate", "", PGC_SUSET, PGC_S_OVERRIDE);
	pgstat_report_appname("outbox capture");
	if (!capture_mine(false))
		proc_exit(0);			/* no slot for this database (any more) */

	SpinLockAcquire(&capture_shared->mutex);
	capture_shared->pid = MyProcPid;
	capture_shared->worker_latch = MyLatch;
	wakes_seen = capture_shared->wakes;
	strlcpy(capture_shared->state, "starting", sizeof(capture_shared->state));
	capture_shared->last_error[0] = '\0';
	SpinLockRelease(&capture_shared->mutex);
	before_shmem_exit(capture_worker_exit, (Datum) 0);

	if (!capture_read_offset(&end_lsn, &part_lsn, &parts_done, wakes_seen) &&
		capture_drop_slot_if_unused())
		capture_exit_idle(wakes_seen);
	if (!capture_read_offset(&end_lsn, &part_lsn, &parts_done, wakes_seen))
		proc_exit(1);			/* a capture came and went meanwhile: again */
	/* Test only: stand still without the slot, left idle (outbox.test_fault). */
	capture_fault_wait("capture_off", 0);
	slot = SearchNamedReplicationSlot(CAPTURE_SLOT, true);
	if (slot == NULL)
		capture_lost(psprintf("replication slot \"%s\" does not exist", CAPTURE_SLOT), wakes_seen);
	outbox_slot_acquire(CAPTURE_SLOT);
	slot = MyReplicationSlot;
	if (outbox_slot_invalidated(slot))
		capture_lost(psprintf("replication slot \"%s\" was invalidated: %s",
							  CAPTURE_SLOT, capture_invalidation_text(slot)),
					 wakes_seen);
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
	/* a slot made before failover slots were used: made one (as ALTER would) */
	if (!slot->data.failover)
	{
		SpinLockAcquire(&slot->mutex);
		slot->data.failover = true;
		SpinLockRelease(&slot->mutex);
		ReplicationSlotMarkDirty();
		ReplicationSlotSave();
		ereport(LOG,
				(errmsg("outbox capture made replication slot \"%s\" a failover slot", CAPTURE_SLOT),
				 errdetail("Standbys with sync_replication_slots = on keep a copy of it, and capture on from it when promoted.")));
	}
#endif
	if (end_lsn == InvalidXLogRecPtr)
	{
		/* first start: from where the slot begins */
		end_lsn = slot->data.confirmed_flush;
	}
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
	else if (slot->data.confirmed_flush > end_lsn && slot->data.synced)
		capture_lost(psprintf("replication slot \"%s\" was copied from the old primary at %X/%X, past the handed-off offset %X/%X that reached this server (outbox.standby_slots was not set, or did not name this standby, when the slot was confirmed there)",
							  CAPTURE_SLOT, LSN_FORMAT_ARGS(slot->data.confirmed_flush),
							  LSN_FORMAT_ARGS(end_lsn)),
					 wakes_seen);
#endif
	else if (slot->data.confirmed_flush > end_lsn)
		capture_lost(psprintf("replication slot \"%s\" was moved to %X/%X, past the handed-off offset %X/%X",
							  CAPTURE_SLOT, LSN_FORMAT_ARGS(slot->data.confirmed_flush),
							  LSN_FORMAT_ARGS(end_lsn)),
					 wakes_seen);

	if (outbox_fault("capture_small_parts"))
		capture_part_messages = 100;
	capture_dec = MemoryContextAllocZero(TopMemoryContext, sizeof(CaptureDecoding));
	capture_dec->collect_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture messages",
											 ALLOCSET_DEFAULT_SIZES);
	capture_dec->rel_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture tables",
										 ALLOCSET_DEFAULT_SIZES);
	capture_dec->change_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture change",
											ALLOCSET_DEFAULT_SIZES);
	capture_reset_rels();
	CacheRegisterRelcacheCallback(capture_wal_relcache_callback, (Datum) 0);
	{
		StartTransactionCommand();
		capture_dec->outbox_namespace = get_namespace_oid("outbox", false);
		capture_dec->captured_tables = get_relname_relid("captured_tables",
												 capture_dec->outbox_namespace);
		CommitTransactionCommand();
	}
	SpinLockAcquire(&capture_shared->mutex);
	capture_shared->end_lsn = end_lsn;
	SpinLockRelease(&capture_shared->mutex);
	capture_set_state("streaming", NULL);

	PG_TRY();
	{
		capture_loop(&ctx, end_lsn, part_lsn, parts_done, wakes_seen);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();
		/* a read under way when the extension's drop committed */
		if (outbox_error_from_drop())
			capture_extension_dropped(edata->message, wakes_seen);
		capture_set_state("failed", edata->message);
		ReThrowError(edata);
	}
	PG_END_TRY();
}

/* Decode, hand off, confirm: until told to stop. */
static void
capture_loop(LogicalDecodingContext **ctxp, XLogRecPtr end_lsn,
			 XLogRecPtr part_lsn, int parts_done, uint64 wakes_seen)
{
	LogicalDecodingContext *ctx = *ctxp;
	long		nap = 1;
	TimestampTz last_offset_write = 0;
	TimestampTz last_check = GetCurrentTimestamp();
	XLogRecPtr	own_end = InvalidXLogRecPtr;
	bool		foreign = false;	/* WAL not ours read since the last offset */

	for (;;)
	{
		XLogRecPtr	flush;
		bool		read_any = false;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (capture_shared->wakes != wakes_seen ||
			TimestampDifferenceExceeds(last_check, GetCurrentTimestamp(), CAPTURE_IDLE_OFFSET_MS))
		{
			XLogRecPtr	e2,
						p2;
			int			d2;

			wakes_seen = capture_shared->wakes;
			last_check = GetCurrentTimestamp();
			capture_check_copies();
			if (!capture_same_extension())
			{
				if (!outbox_extension_installed())
					capture_extension_dropped(NULL, wakes_seen);
				ereport(LOG,
						(errmsg("outbox capture restarts: the extension was created again")));
				proc_exit(1);
			}
			if (!capture_read_offset(&e2, &p2, &d2, wakes_seen))
			{
				if (ctx != NULL)
					FreeDecodingContext(ctx);
				ctx = NULL;
				ReplicationSlotRelease();
				if (capture_drop_slot_if_unused())
				{
					capture_set_state("stopped", NULL);
					capture_exit_idle(wakes_seen);
				}
				proc_exit(1);	/* a capture was added meanwhile: again */
			}
		}

		/* Test only: stand still, holding the slot (outbox.test_fault). */
		if (outbox_fault("capture_pause"))
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 CAPTURE_MAX_NAP_MS, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			continue;
		}

		if (ctx == NULL)
		{
			ctx = CreateDecodingContext(end_lsn, NIL, false,
										XL_ROUTINE(.page_read = read_local_xlog_page,
												   .segment_open = wal_segment_open,
												   .segment_close = wal_segment_close),
										capture_prepare_write, capture_write, NULL);
			XLogBeginRead(ctx->reader, MyReplicationSlot->data.restart_lsn);
			capture_dec->start_lsn = end_lsn;
			capture_dec->part_commit_lsn = part_lsn;
			capture_dec->parts_done = parts_done;
		}

		capture_dec->stop = false;
		capture_dec->partial = false;
		capture_dec->last_commit_lsn = InvalidXLogRecPtr;
		flush = GetFlushRecPtr(NULL);
		while (ctx->reader->EndRecPtr < flush && !capture_dec->stop)
		{
			XLogRecord *record;
			char	   *errm = NULL;

			record = XLogReadRecord(ctx->reader, &errm);
			if (errm)
				elog(ERROR, "outbox capture: could not read WAL: %s", errm);
			if (record != NULL)
			{
				RmgrId		rmid = XLogRecGetRmid(ctx->reader);

				/* WAL of others, not checkpoints and running-xacts records */
				if (ctx->reader->ReadRecPtr >= own_end &&
					rmid != RM_XLOG_ID && rmid != RM_STANDBY_ID)
					foreign = true;
				LogicalDecodingProcessRecord(ctx, ctx->reader);
			}
			read_any = true;
			CHECK_FOR_INTERRUPTS();
		}

		if (capture_dec->partial)
		{
			/*
			 * One more part of a large transaction X: everything committed
			 * before X's commit record is handed off with it, so the offset
			 * moves to that record, and decoding starts again there.
			 */
			XLogRecPtr	x = capture_dec->txn_commit_lsn;
			int			done = (x == capture_dec->part_commit_lsn ? capture_dec->parts_done : 0) + 1;

			capture_handoff(x, x, done, wakes_seen);
			end_lsn = x;
			part_lsn = x;
			parts_done = done;
			FreeDecodingContext(ctx);
			ctx = NULL;
		}
		else if (capture_dec->nmsgs > 0 ||
				 (ctx->reader->EndRecPtr > end_lsn && foreign &&
				  TimestampDifferenceExceeds(last_offset_write, GetCurrentTimestamp(),
											 CAPTURE_IDLE_OFFSET_MS)))
		{
			XLogRecPtr	new_end = ctx->reader->EndRecPtr;
			bool		had_messages = capture_dec->nmsgs > 0;

			/* Test only: a hand-off that comes late (outbox.test_fault). */
			if (had_messages)
				capture_fault_wait("capture_slow_handoff", 60);
			capture_handoff(new_end, InvalidXLogRecPtr, 0, wakes_seen);
			/*
			 * The offset's own commit is WAL too, and so are the
			 * checkpoint and running-xacts records an idle server writes:
			 * with nothing else after it, the offset is not written again.
			 */
			own_end = XactLastCommitEnd;
			foreign = false;
			last_offset_write = GetCurrentTimestamp();
			end_lsn = new_end;
			part_lsn = InvalidXLogRecPtr;
			parts_done = 0;
			capture_dec->start_lsn = end_lsn;
			capture_dec->part_commit_lsn = InvalidXLogRecPtr;
			capture_dec->parts_done = 0;
			if (had_messages)
				capture_fault("capture_before_confirm");
			capture_confirm(end_lsn, own_end);
		}
		else
			capture_confirm_ready();
		if (ctx != NULL)
		{
			SpinLockAcquire(&capture_shared->mutex);
			capture_shared->decoded_lsn = ctx->reader->EndRecPtr;
			SpinLockRelease(&capture_shared->mutex);
		}
		capture_dec->nmsgs = 0;
		capture_dec->bytes = 0;
		capture_dec->msgs = NULL;
		capture_dec->maxmsgs = 0;
		MemoryContextReset(capture_dec->collect_cxt);

		if (read_any)
			nap = 1;
		else
		{
			int			rc;

			rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						   nap, PG_WAIT_EXTENSION);
			if (rc & WL_LATCH_SET)
				ResetLatch(MyLatch);
			/* a confirmation waiting for the standbys is looked at often */
			nap = Min(nap * 2, capture_confirm_eager ? 10 : CAPTURE_MAX_NAP_MS);
		}
	}
}
