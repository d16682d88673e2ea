/*-------------------------------------------------------------------------
 *
 * capture_wal.c
 *	  Change capture by mining the WAL: the capture worker decodes the
 *	  database's WAL in-process and hands each source transaction's changes
 *	  into outbox.messages, exactly once.
 *
 * Decoding.  The worker holds the slot outbox_capture (made by
 * outbox.capture(), plugin "outbox": this library, whose
 * _PG_output_plugin_init is below) and drives logical decoding itself, as
 * the SQL functions and the walsender do: XLogReadRecord and
 * LogicalDecodingProcessRecord up to the flushed end of WAL.  The plugin's
 * callbacks may not write, so they collect messages in memory; the worker
 * hands them off between records, in a transaction of its own.  Which
 * tables are captured, and how, is read in the callbacks from
 * outbox.captured_tables, a user catalog table, with the historic snapshot
 * of the change: a change is captured if the capture existed when its
 * transaction committed, and each row is read with the columns its table
 * had then (DDL mid-stream is decoded against the catalog of its time).
 *
 * The offset (the seed's "restart from 6, not 8").  Moving a slot is not
 * transactional, so the offset is a row, outbox.capture_progress, written
 * in the same local transaction as the messages it covers:
 *	  end_lsn			every source transaction whose commit record begins
 *						below it is handed off (or had nothing to capture)
 *	  part_commit_lsn, parts_done
 *						a source transaction larger than a part (below) of
 *						which the first parts_done parts are handed off
 * Decoding always starts at end_lsn (snapbuild skips transactions
 * committed before its start point), and the slot is confirmed only up to
 * an end_lsn whose transaction is durable.  So after a crash at any moment
 * the stored offset says exactly what was handed off: nothing is lost and
 * nothing is handed off twice.  A slot found confirmed beyond the offset
 * (advanced by somebody else) or invalidated is a gap: state "lost".
 *
 * Memory.  A part is at most CAPTURE_PART_MESSAGES messages or
 * CAPTURE_PART_BYTES bytes of them.  A source transaction larger than that
 * is handed off one part per local transaction: the worker collects part
 * k, hands it off with parts_done = k + 1, and decodes again from end_lsn,
 * skipping the parts already handed off.  The reorder buffer itself spills
 * to disk beyond logical_decoding_work_mem.
 *
 * Our own writes: the hand-off transactions carry the replication origin
 * DoNotReplicateId, which the plugin filters before decoding their
 * changes; the outbox's tables cannot be captured anyway.
 *
 * The launcher (launcher.c) starts the worker when a WAL capture may exist
 * (at server start, and when outbox.capture() or uncapture() wakes it);
 * the worker exits, dropping the slot, once no WAL capture is left.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlogutils.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/partition.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "replication/decode.h"
#include "replication/logical.h"
#include "replication/message.h"
#include "replication/origin.h"
#include "replication/output_plugin.h"
#include "replication/reorderbuffer.h"
#include "replication/slot.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/pg_lsn.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "compat.h"
#include "capture.h"

PGDLLEXPORT void outbox_capture_main(Datum main_arg);
static void capture_loop(LogicalDecodingContext **ctxp, XLogRecPtr end_lsn,
						 XLogRecPtr part_lsn, int parts_done, uint64 wakes_seen);
PGDLLEXPORT void _PG_output_plugin_init(OutputPluginCallbacks *cb);

PG_FUNCTION_INFO_V1(outbox_capture_wake);
PG_FUNCTION_INFO_V1(outbox_capture_status);

/*
 * The replication slot of this database's WAL capture: slot names are the
 * cluster's, so each database has its own, named by its oid (stable across
 * ALTER DATABASE RENAME).  outbox.capture_slot_name() gives it to SQL.
 */
#define CAPTURE_SLOT			capture_slot_name()
PG_FUNCTION_INFO_V1(outbox_capture_slot_name);

/* The slot name of database dboid, into name (NAMEDATALEN bytes). */
static void
capture_slot_name_of(Oid dboid, char *name)
{
	snprintf(name, NAMEDATALEN, "outbox_capture_%u", dboid);
}

static const char *
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
/*
 * The advisory lock (per database) outbox.capture() takes shared while it
 * looks for the slot, and the worker exclusive while it drops the slot.
 */
#define CAPTURE_LOCK_KEY		"7386912245760017"
#define CAPTURE_PART_MESSAGES	100000
#define CAPTURE_PART_BYTES		(32 * 1024 * 1024)
/* How long the worker sleeps at most when no WAL comes. */
#define CAPTURE_MAX_NAP_MS		100
/* An offset with no messages is written at most this often. */
#define CAPTURE_IDLE_OFFSET_MS	1000

/*---- shared state ----*/
/* One per database, in the entry of its directory slot (shmem.c). */
typedef struct CaptureShared
{
	slock_t		mutex;
	Oid			dboid;			/* whose state this is */
	bool		wanted;			/* start the worker */
	uint64		wakes;			/* outbox.capture_wake() calls */
	pid_t		pid;			/* the worker, or 0 */
	Latch	   *worker_latch;
	Latch	   *launcher_latch;
	char		state[32];
	char		last_error[OUTBOX_STATUS_LEN];
	XLogRecPtr	handed_lsn;		/* commit LSN of the last source transaction */
	TimestampTz handed_at;		/* and its commit time */
	XLogRecPtr	end_lsn;		/* the stored offset */
	XLogRecPtr	decoded_lsn;	/* read and handed off up to here */
	uint64		handed;			/* messages handed off since start */
	uint64		skipped;		/* changes that could not become messages */
} CaptureShared;

static CaptureShared *capture_array = NULL;
/* This backend's database's entry, once capture_mine() found it. */
static CaptureShared *capture_shared = NULL;

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
static bool
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

static void
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

/*---- what the plugin collects ----*/

/* A captured table as the historic catalog describes it. */
typedef struct WalRel
{
	Oid			relid;			/* hash key: the changed table or partition */
	bool		captured;
	Oid			root;			/* the captured table (relid, or an ancestor) */
	bool		valid;			/* cleared by a relcache invalidation */
	MemoryContext cxt;			/* what the entry points to */
	/* the transaction and historic snapshot it was read with */
	uint64		txn_seq;
	Snapshot	snap;
	TransactionId snap_xmin;
	TransactionId snap_xmax;
	CommandId	snap_curcid;
	uint32		snap_xcnt;
	char		kind;			/* 'c'hange or 'o'utbox row */
	bool		full;			/* REPLICA IDENTITY FULL */
	char	   *topic;
	char	   *source;
	/* kind 'd' (Debezium): the source block's name, schema and table */
	char	   *dbz_name;
	char	   *dbz_schema;
	char	   *dbz_table;
	int		   *dbz_order;		/* outbox_capture_json_order(cols) */
	int			ncols;
	CaptureColumn *cols;
	int			nkeys;
	CaptureColumn *keys;
	CaptureOutboxColumns oc;	/* kind 'o' */
} WalRel;

typedef struct Collected
{
	OutboxMessage msg;			/* pointers into the collect context */
} Collected;

typedef struct CaptureDecoding
{
	MemoryContext collect_cxt;	/* the messages of this pass */
	MemoryContext rel_cxt;		/* rels and their entries' contexts */
	MemoryContext change_cxt;	/* one change's work, reset after it */
	HTAB	   *rels;
	Oid			captured_tables;	/* outbox.captured_tables */
	Oid			outbox_namespace;	/* schema outbox */
	/* the offset the pass started from */
	XLogRecPtr	start_lsn;
	XLogRecPtr	part_commit_lsn;
	int			parts_done;
	/* collected, in order */
	Collected  *msgs;
	int			nmsgs;
	int			maxmsgs;
	Size		bytes;
	/* the transaction being decoded */
	bool		txn_skip;		/* committed before the offset */
	XLogRecPtr	txn_commit_lsn;
	int			txn_part;		/* part of the next message */
	int			txn_part_count;
	Size		txn_part_bytes;
	int			txn_first_msg;	/* index in msgs of its first message */
	uint64		txn_seq;		/* transactions begun: what rels hold for */
	TransactionId txn_xid_raw;
	XLogRecPtr	change_lsn;		/* of the change being decoded */
	char		txn_xid[32];
	char		txn_lsn[32];
	char		txn_time[OUTBOX_COMMIT_TIME_LEN + 1];
	TimestampTz txn_commit_time;
	/* its trace, from its OUTBOX_TRACE_PREFIX logical message, or "" */
	char		txn_traceparent[OUTBOX_TRACESTATE_MAX + 1];
	char		txn_tracestate[OUTBOX_TRACESTATE_MAX + 1];
	/* after a commit: how the pass ends */
	bool		stop;			/* hand off what is collected now */
	bool		partial;		/* the last transaction has more parts */
	XLogRecPtr	last_commit_lsn;	/* of the last complete transaction */
	TimestampTz last_commit_time;
	char		error[OUTBOX_STATUS_LEN];
	uint64		skipped;
} CaptureDecoding;

static CaptureDecoding *dec = NULL;

/* CAPTURE_PART_MESSAGES, or 100 under outbox.test_fault = 'capture_small_parts'. */
static int	capture_part_messages = CAPTURE_PART_MESSAGES;

static void
capture_wal_relcache_callback(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	WalRel	   *r;

	if (dec == NULL || dec->rels == NULL)
		return;
	hash_seq_init(&status, dec->rels);
	while ((r = hash_seq_search(&status)) != NULL)
		if (relid == InvalidOid || r->relid == relid)
			r->valid = false;
}

static void
capture_note_error(const char *fmt,...) pg_attribute_printf(1, 2);

static void
capture_note_error(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(dec->error, sizeof(dec->error), fmt, ap);
	va_end(ap);
	dec->skipped++;
	ereport(WARNING,
			(errmsg("outbox capture: %s", dec->error)));
}

/* "schema.table" with bytes that are not printable ASCII percent-encoded. */
static char *
capture_source_name(Oid relid)
{
	char	   *nsp = get_namespace_name(get_rel_namespace(relid));
	char	   *rel = get_rel_name(relid);
	char	   *name = psprintf("%s.%s", nsp ? nsp : "?", rel ? rel : "?");
	StringInfoData buf;
	const unsigned char *p;

	initStringInfo(&buf);
	for (p = (const unsigned char *) name; *p; p++)
	{
		if (*p >= 32 && *p <= 126 && *p != '%')
			appendStringInfoChar(&buf, (char) *p);
		else
			appendStringInfo(&buf, "%%%02X", *p);
	}
	return buf.data;
}

/* The attribute number of name in desc, or 0. */
static AttrNumber
capture_attnum(TupleDesc desc, const char *name)
{
	int			i;

	for (i = 0; i < desc->natts; i++)
		if (!TupleDescAttr(desc, i)->attisdropped &&
			strcmp(NameStr(TupleDescAttr(desc, i)->attname), name) == 0)
			return i + 1;
	return 0;
}

/* Column name of a captured_tables row, or NULL. */
static text *
capture_getarg_text(HeapTuple tup, TupleDesc desc, const char *name)
{
	AttrNumber	att = capture_attnum(desc, name);
	bool		isnull;
	Datum		d;

	if (att == 0)
		elog(ERROR, "outbox capture: outbox.captured_tables has no column \"%s\"", name);
	d = heap_getattr(tup, att, desc, &isnull);
	return isnull ? NULL : DatumGetTextPP(d);
}

/* The captured_tables row of relid as of the change, copied, or NULL. */
static HeapTuple
capture_config_row(Oid relid, TupleDesc *descp)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	HeapTuple	result = NULL;

	/* not there as of the change: the extension was dropped */
	rel = try_table_open(dec->captured_tables, AccessShareLock);
	if (rel == NULL)
		return NULL;
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		mode = heap_getattr(tup, capture_attnum(RelationGetDescr(rel), "mode"),
										RelationGetDescr(rel), &isnull);

		if (!isnull && strcmp(TextDatumGetCString(mode), "wal") == 0)
		{
			result = heap_copytuple(tup);
			*descp = CreateTupleDescCopy(RelationGetDescr(rel));
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return result;
}

static void
capture_resolve_columns(WalRel *r, Relation relation, HeapTuple cfg,
						TupleDesc cfgdesc, const char *field,
						CaptureColumn **cols, int *ncols, bool all)
{
	TupleDesc	desc = RelationGetDescr(relation);
	bool		isnull;
	Datum		d = heap_getattr(cfg, capture_attnum(cfgdesc, field), cfgdesc, &isnull);
	int			i;

	*ncols = 0;
	if (isnull)
	{
		*cols = NULL;
		if (!all)
			return;
		*cols = palloc(desc->natts * sizeof(CaptureColumn));
		for (i = 0; i < desc->natts; i++)
			if (outbox_capture_column_usable(TupleDescAttr(desc, i)))
				outbox_capture_column_init(&(*cols)[(*ncols)++], desc, i + 1,
										   r->cxt);
		return;
	}
	else
	{
		Datum	   *elems;
		bool	   *enulls;
		int			n;

		deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &enulls, &n);
		*cols = palloc(n * sizeof(CaptureColumn));
		for (i = 0; i < n; i++)
		{
			char	   *name = TextDatumGetCString(elems[i]);
			AttrNumber	att = capture_attnum(desc, name);

			if (att == 0)
			{
				capture_note_error("column \"%s\" of captured table %s no longer exists: it is left out",
								   name, r->source);
				dec->skipped--;	/* not a change */
				continue;
			}
			outbox_capture_column_init(&(*cols)[(*ncols)++], desc, att, r->cxt);
		}
	}
}

/* How relation's changes are captured as of this transaction. */
static WalRel *
capture_wal_rel(Relation relation)
{
	Oid			relid = RelationGetRelid(relation);
	WalRel	   *r;
	bool		found;
	HeapTuple	cfg = NULL;
	TupleDesc	cfgdesc = NULL;
	MemoryContext oldcxt;
	Oid			captured = relid;
	text	   *t;
	text	   *format;

	Snapshot	snap = GetCatalogSnapshot(RelationRelationId);

	/*
	 * Whether a table is captured is decided with the catalog as of the
	 * change: an entry holds, within its transaction (capture_begin counts
	 * them), for the historic snapshot it was read with, and is read
	 * again under another (a command id of the transaction's own catalog
	 * changes, or a catalog change committed meanwhile).
	 */
	r = hash_search(dec->rels, &relid, HASH_ENTER, &found);
	if (found && r->valid && r->txn_seq == dec->txn_seq &&
		r->snap == snap && r->snap_xmin == snap->xmin &&
		r->snap_xmax == snap->xmax && r->snap_curcid == snap->curcid &&
		r->snap_xcnt == snap->xcnt)
		return r;
	if (found && r->cxt != NULL)
		MemoryContextDelete(r->cxt);
	memset((char *) r + sizeof(Oid), 0, sizeof(WalRel) - sizeof(Oid));
	r->valid = true;
	r->txn_seq = dec->txn_seq;
	r->snap = snap;
	r->snap_xmin = snap->xmin;
	r->snap_xmax = snap->xmax;
	r->snap_curcid = snap->curcid;
	r->snap_xcnt = snap->xcnt;

	oldcxt = MemoryContextSwitchTo(dec->change_cxt);
	/* the outbox's own tables and the catalogs cannot be captured */
	if (relation->rd_rel->relnamespace == dec->outbox_namespace ||
		relation->rd_rel->relnamespace == PG_CATALOG_NAMESPACE)
	{
		MemoryContextSwitchTo(oldcxt);
		return r;
	}
	cfg = capture_config_row(relid, &cfgdesc);
	if (cfg == NULL && relation->rd_rel->relispartition)
	{
		List	   *ancestors = get_partition_ancestors(relid);
		ListCell   *lc;

		foreach(lc, ancestors)
		{
			cfg = capture_config_row(lfirst_oid(lc), &cfgdesc);
			if (cfg != NULL)
			{
				captured = lfirst_oid(lc);
				break;
			}
		}
	}
	if (cfg == NULL)
	{
		MemoryContextSwitchTo(oldcxt);
		return r;
	}

	r->cxt = AllocSetContextCreate(dec->rel_cxt, "outbox capture table",
								   ALLOCSET_SMALL_SIZES);
	MemoryContextSwitchTo(r->cxt);
	r->captured = true;
	r->root = captured;
	r->full = relation->rd_rel->relreplident == REPLICA_IDENTITY_FULL;
	r->source = capture_source_name(captured);
	/* a schema older than the formats has no format column: 'outbox' */
	format = capture_attnum(cfgdesc, "format") ?
		capture_getarg_text(cfg, cfgdesc, "format") : NULL;
	t = capture_getarg_text(cfg, cfgdesc, "topic_column");
	if (t == NULL)
	{
		r->kind = 'c';
		r->topic = text_to_cstring(capture_getarg_text(cfg, cfgdesc, "topic"));
		capture_resolve_columns(r, relation, cfg, cfgdesc, "columns", &r->cols, &r->ncols, true);
		capture_resolve_columns(r, relation, cfg, cfgdesc, "key", &r->keys, &r->nkeys, false);
		if (format != NULL && strcmp(text_to_cstring(format), "debezium") == 0)
		{
			text	   *prefix = capture_getarg_text(cfg, cfgdesc, "topic_prefix");
			char	   *nsp = get_namespace_name(get_rel_namespace(captured));
			char	   *name = get_rel_name(captured);

			r->kind = 'd';
			r->dbz_name = prefix ? text_to_cstring(prefix) : get_database_name(MyDatabaseId);
			r->dbz_schema = nsp ? nsp : "?";
			r->dbz_table = name ? name : "?";
			r->dbz_order = outbox_capture_json_order(r->cols, r->ncols);
		}
	}
	else
	{
		TupleDesc	desc = RelationGetDescr(relation);
		text	   *k = capture_getarg_text(cfg, cfgdesc, "key_column");
		text	   *h = capture_getarg_text(cfg, cfgdesc, "headers_column");
		text	   *p = capture_getarg_text(cfg, cfgdesc, "payload_column");

		r->kind = 'o';
		r->oc.topic_att = capture_attnum(desc, text_to_cstring(t));
		r->oc.payload_att = p ? capture_attnum(desc, text_to_cstring(p)) : 0;
		r->oc.key_att = k ? capture_attnum(desc, text_to_cstring(k)) : 0;
		r->oc.headers_att = h ? capture_attnum(desc, text_to_cstring(h)) : 0;
		if (format != NULL && strcmp(text_to_cstring(format), "debezium-outbox") == 0)
		{
			r->oc.router = true;
			r->oc.id_att = capture_attnum(desc, "id");
		}
		if (r->oc.topic_att == 0 || r->oc.payload_att == 0 ||
			(r->oc.router && r->oc.id_att == 0))
		{
			capture_note_error("the topic, payload or id column of captured outbox table %s no longer exists",
							   r->source);
			dec->skipped--;
			r->captured = false;
		}
		else
		{
			Oid			outfn;
			bool		varlena;

			r->oc.payload_type = TupleDescAttr(desc, r->oc.payload_att - 1)->atttypid;
			if (r->oc.key_att)
			{
				getTypeOutputInfo(TupleDescAttr(desc, r->oc.key_att - 1)->atttypid,
								  &outfn, &varlena);
				fmgr_info_cxt(outfn, &r->oc.key_out, r->cxt);
			}
			if (r->oc.router)
			{
				getTypeOutputInfo(TupleDescAttr(desc, r->oc.id_att - 1)->atttypid,
								  &outfn, &varlena);
				fmgr_info_cxt(outfn, &r->oc.id_out, r->cxt);
			}

		}
	}
	MemoryContextSwitchTo(oldcxt);
	return r;
}

static void
capture_push_null(JsonbParseState **st)
{
	JsonbValue	v;

	v.type = jbvNull;
	pushJsonbValue(st, WJB_VALUE, &v);
}

static bool
capture_is_unchanged_toast(HeapTuple tup, TupleDesc desc, AttrNumber att)
{
	bool		isnull;
	Datum		d;

	if (TupleDescAttr(desc, att - 1)->attlen != -1)
		return false;
	d = heap_getattr(tup, att, desc, &isnull);
	return !isnull && VARATT_IS_EXTERNAL_ONDISK(DatumGetPointer(d));
}

static void *
capture_copy(const void *p, Size len)
{
	void	   *copy = palloc(len);

	memcpy(copy, p, len);
	return copy;
}

/*
 * Which part of its transaction this change is in, and whether that is the
 * part being collected.  A part ends after capture_part_messages changes or
 * CAPTURE_PART_BYTES bytes of their tuples as decoded: what the WAL holds,
 * not what the messages become, so a decode again after a restart (under
 * other settings, say) cuts the parts at the same changes.
 */
static bool
capture_part_take(Size size)
{
	int			want;

	if (dec->txn_part_count > 0 &&
		(dec->txn_part_count >= capture_part_messages ||
		 dec->txn_part_bytes + size > CAPTURE_PART_BYTES))
	{
		dec->txn_part++;
		dec->txn_part_count = 0;
		dec->txn_part_bytes = 0;
	}
	dec->txn_part_count++;
	dec->txn_part_bytes += size;
	want = (dec->txn_commit_lsn == dec->part_commit_lsn) ? dec->parts_done : 0;
	if (dec->txn_part < want)
		return false;			/* handed off already */
	if (dec->txn_part > want)
	{
		dec->partial = true;	/* the next pass takes it */
		return false;
	}
	return true;
}

/* Add a message to the pass. */
static void
capture_collect(OutboxMessage *m)
{
	Size		size = VARSIZE(m->payload) + (m->headers ? VARSIZE(m->headers) : 0) +
		m->topic_len + m->key_len + 64;
	MemoryContext oldcxt;
	Collected  *c;

	oldcxt = MemoryContextSwitchTo(dec->collect_cxt);
	if (dec->nmsgs == dec->maxmsgs)
	{
		dec->maxmsgs = Max(1024, dec->maxmsgs * 2);
		dec->msgs = dec->msgs ? repalloc_huge(dec->msgs, dec->maxmsgs * sizeof(Collected)) :
			palloc(dec->maxmsgs * sizeof(Collected));
	}
	c = &dec->msgs[dec->nmsgs++];
	c->msg = *m;
	c->msg.payload = capture_copy(m->payload, VARSIZE(m->payload));
	if (m->headers)
		c->msg.headers = capture_copy(m->headers, VARSIZE(m->headers));
	c->msg.topic = capture_copy(m->topic, m->topic_len);
	if (m->key)
		c->msg.key = capture_copy(m->key, m->key_len);
	dec->bytes += size;
	MemoryContextSwitchTo(oldcxt);
}

static Jsonb *
capture_wal_headers(WalRel *r)
{
	JsonbParseState *st = NULL;

	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	outbox_capture_push_string(&st, WJB_KEY, "source-table");
	outbox_capture_push_string(&st, WJB_VALUE, r->source);
	outbox_capture_push_string(&st, WJB_KEY, "source-xid");
	outbox_capture_push_string(&st, WJB_VALUE, dec->txn_xid);
	outbox_capture_push_string(&st, WJB_KEY, "source-lsn");
	outbox_capture_push_string(&st, WJB_VALUE, dec->txn_lsn);
	outbox_capture_push_string(&st, WJB_KEY, "source-commit-time");
	outbox_capture_push_string(&st, WJB_VALUE, dec->txn_time);
	if (dec->txn_traceparent[0] != '\0')
	{
		outbox_capture_push_string(&st, WJB_KEY, "traceparent");
		outbox_capture_push_string(&st, WJB_VALUE, dec->txn_traceparent);
		if (dec->txn_tracestate[0] != '\0')
		{
			outbox_capture_push_string(&st, WJB_KEY, "tracestate");
			outbox_capture_push_string(&st, WJB_VALUE, dec->txn_tracestate);
		}
	}
	return JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
}

/*
 * A change as Debezium's envelope.  before: the whole old row under REPLICA
 * IDENTITY FULL; else, for a delete or an update that changed the key, the
 * old key's columns (the others null, as the WAL has them); else null.
 * skip marks the new row's unchanged TOASTed columns.
 */
static Jsonb *
capture_wal_debezium(WalRel *r, TupleDesc desc, const char *op,
					 HeapTuple oldtup, HeapTuple newtup, const bool *skip)
{
	CaptureDebeziumSource src;

	memset(&src, 0, sizeof(src));
	src.name = r->dbz_name;
	src.schema = r->dbz_schema;
	src.table = r->dbz_table;
	src.ts = dec->txn_commit_time;
	src.snapshot = "false";
	src.xid = dec->txn_xid_raw;
	src.lsn = dec->change_lsn;
	src.commit_lsn = dec->txn_commit_lsn;
	src.made = GetCurrentTimestamp();
	if (strcmp(op, "insert") == 0 || strcmp(op, "truncate") == 0)
		oldtup = NULL;
	return outbox_capture_debezium(&src, op, oldtup, newtup, desc,
								   r->cols, r->ncols, r->dbz_order, skip);
}

/* A change as the {"op", "before", "after"[, "unchanged"]} envelope. */
static Jsonb *
capture_wal_envelope(WalRel *r, TupleDesc desc, const char *op,
					 HeapTuple oldtup, HeapTuple newtup, const bool *skip,
					 const bool *keyskip, List *unchanged)
{
	JsonbParseState *st = NULL;

	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	outbox_capture_push_string(&st, WJB_KEY, "op");
	outbox_capture_push_string(&st, WJB_VALUE, op);
	outbox_capture_push_string(&st, WJB_KEY, "before");
	if (strcmp(op, "insert") == 0 || strcmp(op, "truncate") == 0)
		capture_push_null(&st);
	else if (r->full && oldtup != NULL)
		outbox_capture_push_row(&st, oldtup, desc, r->cols, r->ncols, NULL);
	else if (oldtup != NULL)
		/* the replica identity's key only */
		outbox_capture_push_row(&st, oldtup, desc, r->keys, r->nkeys, NULL);
	else if (newtup != NULL)
		/* the key, unchanged: as in the new row */
		outbox_capture_push_row(&st, newtup, desc, r->keys, r->nkeys, keyskip);
	else
		capture_push_null(&st);

	outbox_capture_push_string(&st, WJB_KEY, "after");
	if (newtup != NULL)
		outbox_capture_push_row(&st, newtup, desc, r->cols, r->ncols, skip);
	else
		capture_push_null(&st);
	if (unchanged != NIL)
	{
		ListCell   *lc;

		outbox_capture_push_string(&st, WJB_KEY, "unchanged");
		pushJsonbValue(&st, WJB_BEGIN_ARRAY, NULL);
		foreach(lc, unchanged)
			outbox_capture_push_string(&st, WJB_ELEM, lfirst(lc));
		pushJsonbValue(&st, WJB_END_ARRAY, NULL);
	}
	return JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
}

/* A change of a captured table as the {"op", "before", "after"} message. */
static void
capture_wal_change(WalRel *r, TupleDesc desc, const char *op,
				   HeapTuple oldtup, HeapTuple newtup)
{
	OutboxMessage m;
	Jsonb	   *payload;
	bool	   *skip = NULL;
	bool	   *keyskip = NULL;
	HeapTuple	keytup;
	List	   *unchanged = NIL;
	int			i;

	memset(&m, 0, sizeof(m));
	m.commit_time_off = -1;

	/*
	 * An unchanged TOASTed value is in the WAL only as a pointer, which
	 * cannot be read here: take it from the old row when that has it (FULL,
	 * or the key's old value), else leave it out and list it as unchanged.
	 * Nothing here ever reads such a pointer.
	 */
	if (newtup != NULL)
	{
		Datum	   *values = NULL;
		bool	   *nulls = NULL;
		bool	   *repl = NULL;

		for (i = 1; i <= desc->natts; i++)
		{
			bool		isnull;

			if (!capture_is_unchanged_toast(newtup, desc, i) || oldtup == NULL ||
				capture_is_unchanged_toast(oldtup, desc, i))
				continue;
			/*
			 * A key-only old row (REPLICA IDENTITY DEFAULT or INDEX, the key
			 * changed) has nulls for the other columns: not their values.
			 */
			(void) heap_getattr(oldtup, i, desc, &isnull);
			if (isnull)
				continue;
			if (values == NULL)
			{
				values = palloc(desc->natts * sizeof(Datum));
				nulls = palloc(desc->natts * sizeof(bool));
				repl = palloc0(desc->natts * sizeof(bool));
			}
			values[i - 1] = heap_getattr(oldtup, i, desc, &isnull);
			nulls[i - 1] = false;
			repl[i - 1] = true;
		}
		if (values != NULL)
			newtup = heap_modify_tuple(newtup, desc, values, nulls, repl);
		for (i = 0; i < r->ncols; i++)
		{
			if (!capture_is_unchanged_toast(newtup, desc, r->cols[i].attnum))
				continue;
			if (skip == NULL)
				skip = palloc0(r->ncols * sizeof(bool));
			skip[i] = true;
			unchanged = lappend(unchanged, r->cols[i].name);
		}
	}
	/*
	 * Debezium: a change of the key is a delete of the old key (in the old
	 * row as the WAL has it) and a create of the new row.
	 */
	if (r->kind == 'd' && strcmp(op, "update") == 0 && oldtup != NULL && newtup != NULL &&
		outbox_capture_key_changed(oldtup, newtup, desc, r->keys, r->nkeys))
	{
		int			nmsgs = dec->nmsgs;
		Size		bytes = dec->bytes;
		uint64		skipped = dec->skipped;

		capture_wal_change(r, desc, "delete", oldtup, NULL);
		capture_wal_change(r, desc, "insert", NULL, newtup);
		/* both or neither: a consumer must not see the delete alone */
		if (dec->skipped != skipped)
		{
			dec->nmsgs = nmsgs;
			dec->bytes = bytes;
		}
		return;
	}
	if (strcmp(op, "delete") == 0 && oldtup == NULL)
	{
		capture_note_error("a delete of %s at %s carries no old row (replica identity NOTHING?): it has no key",
						   r->source, dec->txn_lsn);
		dec->skipped--;
	}
	keytup = newtup != NULL ? newtup : oldtup;
	if (keytup != NULL)
	{
		for (i = 0; i < r->nkeys; i++)
			if (capture_is_unchanged_toast(keytup, desc, r->keys[i].attnum))
			{
				if (keyskip == NULL)
					keyskip = palloc0(r->nkeys * sizeof(bool));
				keyskip[i] = true;
			}
	}

	if (r->kind == 'd')
		payload = capture_wal_debezium(r, desc, op, oldtup, newtup, skip);
	else
		payload = capture_wal_envelope(r, desc, op, oldtup, newtup, skip, keyskip, unchanged);
	if (VARSIZE(payload) - VARHDRSZ > (Size) outbox_max_payload_size)
	{
		capture_note_error("a change of %s at %s is larger than outbox.max_payload_size: not captured",
						   r->source, dec->txn_lsn);
		return;
	}
	m.payload = (struct varlena *) payload;
	m.topic = r->topic;
	m.topic_len = strlen(r->topic);
	if (keytup != NULL && keyskip != NULL)
	{
		capture_note_error("the key of a change of %s at %s is stored out of line and not in the WAL: it has no key",
						   r->source, dec->txn_lsn);
		dec->skipped--;
	}
	else if (keytup != NULL)
	{
		m.key = r->kind == 'd' ?
			outbox_capture_debezium_key(keytup, desc, r->keys, r->nkeys, &m.key_len) :
			outbox_capture_key(keytup, desc, r->keys, r->nkeys, &m.key_len);
		if (m.key != NULL &&
			(m.key_len > OUTBOX_MAX_KEY_LEN ||
			 outbox_bad_char(m.key, m.key_len, OUTBOX_TEXT_KEY, NULL) > 0))
		{
			capture_note_error("the key of a change of %s at %s is too long or has characters keys may not have: it has no key",
							   r->source, dec->txn_lsn);
			dec->skipped--;
			m.key = NULL;
			m.key_len = 0;
		}
	}
	m.headers = (struct varlena *) capture_wal_headers(r);
	m.emitted_at = dec->txn_commit_time;
	outbox_make_uuid(&m.msg_id, m.emitted_at);
	capture_collect(&m);
}

/*
 * A row of a captured outbox table as its message (outbox_capture_outbox_row
 * checks it); a bad row raises a data exception, which capture_wal_one turns
 * into a skipped change.
 */
static void
capture_wal_outbox_row(WalRel *r, TupleDesc desc, HeapTuple tup)
{
	OutboxMessage m;

	memset(&m, 0, sizeof(m));
	m.commit_time_off = -1;
	outbox_capture_outbox_row(tup, desc, &r->oc, r->source, &m);
	if (dec->txn_traceparent[0] != '\0')
	{
		m.headers = (struct varlena *) outbox_trace_add((Jsonb *) m.headers,
														dec->txn_traceparent,
														dec->txn_tracestate);
		outbox_check_headers_size((Jsonb *) m.headers);	/* the rest was checked */
	}
	m.emitted_at = dec->txn_commit_time;
	outbox_make_uuid(&m.msg_id, m.emitted_at);
	capture_collect(&m);
}

/*
 * The table of what is known of the tables, made once (capture_wal_rel
 * says when an entry holds).  DDL on a table invalidates its entry
 * (capture_wal_relcache_callback).
 */
static void
capture_reset_rels(void)
{
	HASHCTL		hctl;

	MemoryContextReset(dec->rel_cxt);
	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(Oid);
	hctl.entrysize = sizeof(WalRel);
	hctl.hcxt = dec->rel_cxt;
	dec->rels = hash_create("outbox capture tables", 16, &hctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/*---- the output plugin ----*/

static void
capture_startup(LogicalDecodingContext *ctx, OutputPluginOptions *opt, bool is_init)
{
	opt->output_type = OUTPUT_PLUGIN_BINARY_OUTPUT;
	opt->receive_rewrites = false;
	if (!is_init && dec == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("replication slot \"%s\" is decoded only by the outbox capture worker",
						NameStr(MyReplicationSlot->data.name)),
				 errdetail("Reading it here would move it past changes the worker has not handed off."),
				 errhint("See SELECT * FROM outbox.captures.")));
}

static void
capture_begin(LogicalDecodingContext *ctx, ReorderBufferTXN *txn)
{
	/* a transaction's own uncommitted captures are its alone */
	dec->txn_seq++;
	MemoryContextReset(dec->change_cxt);
	dec->txn_commit_lsn = txn->final_lsn;
	dec->txn_skip = txn->final_lsn < dec->start_lsn;
	dec->txn_part = 0;
	dec->txn_part_count = 0;
	dec->txn_part_bytes = 0;
	dec->txn_first_msg = dec->nmsgs;
	dec->txn_commit_time = txn->xact_time.commit_time;
	dec->txn_xid_raw = txn->xid;
	dec->txn_xid[0] = '\0';	/* capture_txn_strings, at its first message */
	dec->txn_traceparent[0] = '\0';
	dec->txn_tracestate[0] = '\0';
}

/* The source transaction's header values, made once it has a message. */
static void
capture_txn_strings(void)
{
	FullTransactionId next;
	uint32		epoch;

	if (dec->txn_xid[0] != '\0')
		return;
	next = ReadNextFullTransactionId();
	epoch = EpochFromFullTransactionId(next);
	if (dec->txn_xid_raw > XidFromFullTransactionId(next))
		epoch--;
	snprintf(dec->txn_xid, sizeof(dec->txn_xid), UINT64_FORMAT,
			 U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(epoch, dec->txn_xid_raw)));
	snprintf(dec->txn_lsn, sizeof(dec->txn_lsn), "%X/%X", LSN_FORMAT_ARGS(dec->txn_commit_lsn));
	outbox_format_commit_time(dec->txn_commit_time, dec->txn_time);
}

/*
 * Make one change a message, or skip it with a warning when it cannot
 * become one: an error raised by a value (its output function, JSON that
 * jsonb refuses) must not stop the capture of every table for good.
 * Errors of the server itself (cancel, shutdown, out of memory, I/O) are
 * thrown on.  The code run here only reads its arguments: it holds no
 * lock or buffer an error could leave behind.
 */
/*
 * Errors a change's values can raise, which skip that change: data
 * exceptions (22), program limits (54), features a value needs (0A).
 * Everything else (cancel, shutdown, out of memory, I/O, internal errors,
 * corruption) is the server's and thrown on.
 */
static bool
capture_error_skips_change(ErrorData *edata)
{
	int			class = ERRCODE_TO_CATEGORY(edata->sqlerrcode);

	return edata->elevel == ERROR &&
		(class == ERRCODE_TO_CATEGORY(ERRCODE_DATA_EXCEPTION) ||
		 class == ERRCODE_TO_CATEGORY(ERRCODE_PROGRAM_LIMIT_EXCEEDED) ||
		 class == ERRCODE_TO_CATEGORY(ERRCODE_FEATURE_NOT_SUPPORTED));
}

static void
capture_wal_one(WalRel *r, TupleDesc desc, const char *op,
				HeapTuple oldtup, HeapTuple newtup)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(dec->change_cxt);
	volatile int nmsgs = dec->nmsgs;
	volatile Size bytes = dec->bytes;

	capture_txn_strings();
	PG_TRY();
	{
		if (r->kind == 'o')
			capture_wal_outbox_row(r, desc, newtup);
		else
			capture_wal_change(r, desc, op, oldtup, newtup);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(dec->change_cxt);
		edata = CopyErrorData();
		if (!capture_error_skips_change(edata))
			PG_RE_THROW();
		FlushErrorState();
		/* a change becomes all its messages or none (a key change: two) */
		dec->nmsgs = nmsgs;
		dec->bytes = bytes;
		capture_note_error("a change of %s at %s cannot become a message: %s",
						   r->source, dec->txn_lsn, edata->message);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(dec->change_cxt);
}

/*
 * What a tuple weighs for the part boundaries: its length plus the raw size
 * of each out-of-line or compressed value (as decoded, a TOASTed value is a
 * pointer of a few bytes).  Read from the WAL alone, so the same on every
 * decode.
 */
static Size
capture_tuple_size(HeapTuple t, TupleDesc desc)
{
	Size		size;
	int			i;
	Datum	   *values;
	bool	   *nulls;

	if (t == NULL)
		return 0;
	size = t->t_len;
	if (!HeapTupleHasVarWidth(t))
		return size;
	/* one pass over the tuple (in the change's context, reset after it) */
	values = MemoryContextAlloc(dec->change_cxt, desc->natts * sizeof(Datum));
	nulls = MemoryContextAlloc(dec->change_cxt, desc->natts * sizeof(bool));
	heap_deform_tuple(t, desc, values, nulls);
	for (i = 0; i < desc->natts; i++)
		if (!nulls[i] && TupleDescAttr(desc, i)->attlen == -1 &&
			VARATT_IS_EXTENDED(DatumGetPointer(values[i])))
			size += toast_raw_datum_size(values[i]);
	return size;
}

static void
capture_change_cb(LogicalDecodingContext *ctx, ReorderBufferTXN *txn,
				  Relation relation, ReorderBufferChange *change)
{
	WalRel	   *r;
	TupleDesc	desc = RelationGetDescr(relation);
	HeapTuple	oldtup;
	HeapTuple	newtup;
	const char *op;

	if (dec->txn_skip)
		return;
	r = capture_wal_rel(relation);
	if (!r->captured)
		return;
	oldtup = outbox_change_tuple(change->data.tp.oldtuple);
	newtup = outbox_change_tuple(change->data.tp.newtuple);
	switch (change->action)
	{
		case REORDER_BUFFER_CHANGE_INSERT:
			op = "insert";
			break;
		case REORDER_BUFFER_CHANGE_UPDATE:
			op = "update";
			break;
		case REORDER_BUFFER_CHANGE_DELETE:
			op = "delete";
			break;
		default:
			return;
	}
	if (r->kind == 'o' && change->action != REORDER_BUFFER_CHANGE_INSERT)
		return;					/* an outbox table's rows are its inserts */
	if (!capture_part_take(capture_tuple_size(oldtup, desc) + capture_tuple_size(newtup, desc)))
		return;
	dec->change_lsn = change->lsn;
	capture_wal_one(r, desc, op, oldtup, newtup);
}

/*
 * TRUNCATE of a captured table: one message.  The record of a partitioned
 * table's TRUNCATE names it and each partition: only its own entry counts.
 * A partition truncated alone is not captured (as in trigger mode: a
 * message would say the whole table was emptied), with a warning.
 */
static void
capture_truncate_cb(LogicalDecodingContext *ctx, ReorderBufferTXN *txn,
					int nrelations, Relation relations[], ReorderBufferChange *change)
{
	int			i;
	int			j;

	if (dec->txn_skip)
		return;
	for (i = 0; i < nrelations; i++)
	{
		WalRel	   *r = capture_wal_rel(relations[i]);
		bool		root_named = false;

		if (!r->captured || r->kind == 'o')
			continue;
		if (RelationGetRelid(relations[i]) != r->root)
		{
			for (j = 0; j < nrelations; j++)
				if (RelationGetRelid(relations[j]) == r->root)
					root_named = true;
			if (!root_named)
			{
				capture_txn_strings();
				capture_note_error("TRUNCATE of partition %s of captured table %s at %s is not captured",
								   RelationGetRelationName(relations[i]), r->source, dec->txn_lsn);
				dec->skipped--;
			}
			continue;
		}
		if (!capture_part_take(0))
			continue;
		dec->change_lsn = change->lsn;
		capture_wal_one(r, RelationGetDescr(relations[i]), "truncate", NULL, NULL);
	}
}

static void
capture_commit_cb(LogicalDecodingContext *ctx, ReorderBufferTXN *txn, XLogRecPtr commit_lsn)
{
	if (dec->txn_skip)
		return;
	if (dec->partial)
	{
		dec->stop = true;		/* hand off this part, then decode it again */
		return;
	}
	dec->last_commit_lsn = commit_lsn;
	dec->last_commit_time = txn->xact_time.commit_time;
	if (dec->nmsgs >= capture_part_messages || dec->bytes >= CAPTURE_PART_BYTES)
		dec->stop = true;
}

/*
 * A transactional logical message of the transaction: the trace it set
 * (trace.c), "traceparent\ntracestate", written at its commit, so after its
 * changes.  The messages collected from it so far get the trace, and so do
 * the ones after it.  Anyone may write such a message in their own
 * transaction: a malformed one is skipped with a note, never trusted.
 */
static void
capture_message_cb(LogicalDecodingContext *ctx, ReorderBufferTXN *txn,
				   XLogRecPtr message_lsn, bool transactional, const char *prefix,
				   Size message_size, const char *message)
{
	char	   *content;
	char	   *state;
	const char *why = NULL;
	MemoryContext oldcxt;
	int			i;

	if (!transactional || dec->txn_skip || strcmp(prefix, OUTBOX_TRACE_PREFIX) != 0)
		return;
	if (memchr(message, '\0', message_size) != NULL ||
		message_size > 2 * OUTBOX_TRACESTATE_MAX + 1)
	{
		capture_txn_strings();
		capture_note_error("the trace context written at %X/%X by transaction %s is malformed (a NUL byte, or too long): its changes are captured without it",
						   LSN_FORMAT_ARGS(message_lsn), dec->txn_xid);
		dec->skipped--;			/* nothing is skipped */
		return;
	}
	content = palloc(message_size + 1);
	memcpy(content, message, message_size);
	content[message_size] = '\0';
	state = strchr(content, '\n');
	if (state != NULL)
		*state++ = '\0';
	if (strlen(content) > OUTBOX_TRACESTATE_MAX ||
		!outbox_traceparent_valid(content, &why) ||
		(state != NULL && *state != '\0' &&
		 (strlen(state) > OUTBOX_TRACESTATE_MAX || !outbox_tracestate_valid(state, &why))))
	{
		capture_txn_strings();
		capture_note_error("the trace context written at %X/%X by transaction %s is malformed (%s): its changes are captured without it",
						   LSN_FORMAT_ARGS(message_lsn), dec->txn_xid,
						   why ? why : "too long");
		dec->skipped--;
		return;
	}
	strlcpy(dec->txn_traceparent, content, sizeof(dec->txn_traceparent));
	strlcpy(dec->txn_tracestate, state ? state : "", sizeof(dec->txn_tracestate));

	oldcxt = MemoryContextSwitchTo(dec->collect_cxt);
	for (i = dec->txn_first_msg; i < dec->nmsgs; i++)
	{
		Collected  *c = &dec->msgs[i];

		c->msg.headers = (struct varlena *)
			outbox_trace_add((Jsonb *) c->msg.headers, dec->txn_traceparent,
							 dec->txn_tracestate);
	}
	MemoryContextSwitchTo(oldcxt);
}

static bool
capture_filter_origin(LogicalDecodingContext *ctx, RepOriginId origin_id)
{
	return origin_id == DoNotReplicateId;
}

static void
capture_shutdown(LogicalDecodingContext *ctx)
{
}

void
_PG_output_plugin_init(OutputPluginCallbacks *cb)
{
	cb->startup_cb = capture_startup;
	cb->begin_cb = capture_begin;
	cb->change_cb = capture_change_cb;
	cb->truncate_cb = capture_truncate_cb;
	cb->commit_cb = capture_commit_cb;
	cb->message_cb = capture_message_cb;
	cb->filter_by_origin_cb = capture_filter_origin;
	cb->shutdown_cb = capture_shutdown;
}

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
		busy = capture_lock_handoff_tables(dec->nmsgs > 0, &mode);
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
		for (i = 0; i < dec->nmsgs; i++)
			outbox_buffer_append(&dec->msgs[i].msg);
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
	capture_shared->handed += dec->nmsgs;
	capture_shared->skipped += dec->skipped;
	if (dec->last_commit_lsn != InvalidXLogRecPtr)
	{
		capture_shared->handed_lsn = dec->last_commit_lsn;
		capture_shared->handed_at = dec->last_commit_time;
	}
	if (dec->error[0])
		strlcpy(capture_shared->last_error, dec->error, sizeof(capture_shared->last_error));
	SpinLockRelease(&capture_shared->mutex);
	dec->skipped = 0;
	dec->error[0] = '\0';
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

/* Why the slot was invalidated, in words, for last_error. */
static const char *
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
	return relid == dec->captured_tables;
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
static bool confirm_eager = false;
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
static void
capture_confirm_ready(void)
{
#ifdef OUTBOX_HAVE_FAILOVER_SLOTS
	OutboxStandbySlot worst;
	XLogRecPtr	flushed;
	char		why[NAMEDATALEN + 128];
#endif

	confirm_eager = false;
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
			confirm_eager = worst.state == OUTBOX_STANDBY_STREAMING;
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
static void
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

static void
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
	while (outbox_fault("capture_off"))
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
	dec = MemoryContextAllocZero(TopMemoryContext, sizeof(CaptureDecoding));
	dec->collect_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture messages",
											 ALLOCSET_DEFAULT_SIZES);
	dec->rel_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture tables",
										 ALLOCSET_DEFAULT_SIZES);
	dec->change_cxt = AllocSetContextCreate(TopMemoryContext, "outbox capture change",
											ALLOCSET_DEFAULT_SIZES);
	capture_reset_rels();
	CacheRegisterRelcacheCallback(capture_wal_relcache_callback, (Datum) 0);
	{
		StartTransactionCommand();
		dec->outbox_namespace = get_namespace_oid("outbox", false);
		dec->captured_tables = get_relname_relid("captured_tables",
												 dec->outbox_namespace);
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
			dec->start_lsn = end_lsn;
			dec->part_commit_lsn = part_lsn;
			dec->parts_done = parts_done;
		}

		dec->stop = false;
		dec->partial = false;
		dec->last_commit_lsn = InvalidXLogRecPtr;
		flush = GetFlushRecPtr(NULL);
		while (ctx->reader->EndRecPtr < flush && !dec->stop)
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

		if (dec->partial)
		{
			/*
			 * One more part of a large transaction X: everything committed
			 * before X's commit record is handed off with it, so the offset
			 * moves to that record, and decoding starts again there.
			 */
			XLogRecPtr	x = dec->txn_commit_lsn;
			int			done = (x == dec->part_commit_lsn ? dec->parts_done : 0) + 1;

			capture_handoff(x, x, done, wakes_seen);
			end_lsn = x;
			part_lsn = x;
			parts_done = done;
			FreeDecodingContext(ctx);
			ctx = NULL;
		}
		else if (dec->nmsgs > 0 ||
				 (ctx->reader->EndRecPtr > end_lsn && foreign &&
				  TimestampDifferenceExceeds(last_offset_write, GetCurrentTimestamp(),
											 CAPTURE_IDLE_OFFSET_MS)))
		{
			XLogRecPtr	new_end = ctx->reader->EndRecPtr;
			bool		had_messages = dec->nmsgs > 0;

			/* Test only: a hand-off that comes late (outbox.test_fault). */
			if (had_messages && outbox_fault("capture_slow_handoff"))
			{
				int			waited;

				/* until the setting changes, at most a minute */
				ereport(LOG, (errmsg("outbox capture: test fault \"capture_slow_handoff\"")));
				for (waited = 0; waited < 600 && outbox_fault("capture_slow_handoff"); waited++)
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
			dec->start_lsn = end_lsn;
			dec->part_commit_lsn = InvalidXLogRecPtr;
			dec->parts_done = 0;
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
		dec->nmsgs = 0;
		dec->bytes = 0;
		dec->msgs = NULL;
		dec->maxmsgs = 0;
		MemoryContextReset(dec->collect_cxt);

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
			nap = Min(nap * 2, confirm_eager ? 10 : CAPTURE_MAX_NAP_MS);
		}
	}
}
