/*-------------------------------------------------------------------------
 *
 * capture_plugin.c
 *	  The output plugin "outbox" (this library's _PG_output_plugin_init):
 *	  the callbacks logical decoding runs for the capture worker.
 *
 * The worker drives logical decoding itself, as the SQL functions and the
 * walsender do (capture_worker.c); the callbacks may not write, so they
 * collect messages in memory (capture_decode.c), and the worker hands them
 * off between records.  A transaction committed before the pass's offset
 * is skipped; one larger than a part is collected part by part, and the
 * parts already handed off are skipped when it is decoded again.
 *
 * A change whose values cannot become a message (an output function's
 * error, JSON jsonb refuses) is skipped with a warning and counted: it must
 * not stop the capture of every table for good.  Errors of the server
 * itself are thrown on.
 *
 * Our own writes: the hand-off transactions carry the replication origin
 * DoNotReplicateId, which the plugin filters before decoding their
 * changes; the outbox's tables cannot be captured anyway.  Decoding the
 * slot anywhere but in the worker (pg_logical_slot_get_changes()) is
 * refused at startup: it would move the slot past changes not handed off.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "replication/logical.h"
#include "replication/origin.h"
#include "replication/output_plugin.h"
#include "replication/reorderbuffer.h"
#include "utils/memutils.h"

#include "outbox.h"
#include "compat.h"
#include "capture.h"
#include "capture_wal.h"

PGDLLEXPORT void _PG_output_plugin_init(OutputPluginCallbacks *cb);

/*---- the output plugin ----*/

static void
capture_startup(LogicalDecodingContext *ctx, OutputPluginOptions *opt, bool is_init)
{
	opt->output_type = OUTPUT_PLUGIN_BINARY_OUTPUT;
	opt->receive_rewrites = false;
	if (!is_init && capture_dec == NULL)
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
	capture_dec->txn_seq++;
	MemoryContextReset(capture_dec->change_cxt);
	capture_dec->txn_commit_lsn = txn->final_lsn;
	capture_dec->txn_skip = txn->final_lsn < capture_dec->start_lsn;
	capture_dec->txn_part = 0;
	capture_dec->txn_part_count = 0;
	capture_dec->txn_part_bytes = 0;
	capture_dec->txn_first_msg = capture_dec->nmsgs;
	capture_dec->txn_commit_time = txn->xact_time.commit_time;
	capture_dec->txn_xid_raw = txn->xid;
	capture_dec->txn_xid[0] = '\0';	/* capture_txn_strings, at its first message */
	capture_dec->txn_traceparent[0] = '\0';
	capture_dec->txn_tracestate[0] = '\0';
}

/* The source transaction's header values, made once it has a message. */
static void
capture_txn_strings(void)
{
	FullTransactionId next;
	uint32		epoch;

	if (capture_dec->txn_xid[0] != '\0')
		return;
	next = ReadNextFullTransactionId();
	epoch = EpochFromFullTransactionId(next);
	if (capture_dec->txn_xid_raw > XidFromFullTransactionId(next))
		epoch--;
	snprintf(capture_dec->txn_xid, sizeof(capture_dec->txn_xid), UINT64_FORMAT,
			 U64FromFullTransactionId(FullTransactionIdFromEpochAndXid(epoch, capture_dec->txn_xid_raw)));
	snprintf(capture_dec->txn_lsn, sizeof(capture_dec->txn_lsn), "%X/%X", LSN_FORMAT_ARGS(capture_dec->txn_commit_lsn));
	outbox_format_commit_time(capture_dec->txn_commit_time, capture_dec->txn_time);
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
	MemoryContext oldcxt = MemoryContextSwitchTo(capture_dec->change_cxt);
	volatile int nmsgs = capture_dec->nmsgs;
	volatile Size bytes = capture_dec->bytes;

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

		MemoryContextSwitchTo(capture_dec->change_cxt);
		edata = CopyErrorData();
		if (!capture_error_skips_change(edata))
			PG_RE_THROW();
		FlushErrorState();
		/* a change becomes all its messages or none (a key change: two) */
		capture_dec->nmsgs = nmsgs;
		capture_dec->bytes = bytes;
		capture_note_error("a change of %s at %s cannot become a message: %s",
						   r->source, capture_dec->txn_lsn, edata->message);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(capture_dec->change_cxt);
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
	values = MemoryContextAlloc(capture_dec->change_cxt, desc->natts * sizeof(Datum));
	nulls = MemoryContextAlloc(capture_dec->change_cxt, desc->natts * sizeof(bool));
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

	if (capture_dec->txn_skip)
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
	capture_dec->change_lsn = change->lsn;
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

	if (capture_dec->txn_skip)
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
								   RelationGetRelationName(relations[i]), r->source, capture_dec->txn_lsn);
				capture_dec->skipped--;
			}
			continue;
		}
		if (!capture_part_take(0))
			continue;
		capture_dec->change_lsn = change->lsn;
		capture_wal_one(r, RelationGetDescr(relations[i]), "truncate", NULL, NULL);
	}
}

static void
capture_commit_cb(LogicalDecodingContext *ctx, ReorderBufferTXN *txn, XLogRecPtr commit_lsn)
{
	if (capture_dec->txn_skip)
		return;
	if (capture_dec->partial)
	{
		capture_dec->stop = true;		/* hand off this part, then decode it again */
		return;
	}
	capture_dec->last_commit_lsn = commit_lsn;
	capture_dec->last_commit_time = txn->xact_time.commit_time;
	if (capture_dec->nmsgs >= capture_part_messages || capture_dec->bytes >= CAPTURE_PART_BYTES)
		capture_dec->stop = true;
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

	if (!transactional || capture_dec->txn_skip || strcmp(prefix, OUTBOX_TRACE_PREFIX) != 0)
		return;
	if (memchr(message, '\0', message_size) != NULL ||
		message_size > 2 * OUTBOX_TRACESTATE_MAX + 1)
	{
		capture_txn_strings();
		capture_note_error("the trace context written at %X/%X by transaction %s is malformed (a NUL byte, or too long): its changes are captured without it",
						   LSN_FORMAT_ARGS(message_lsn), capture_dec->txn_xid);
		capture_dec->skipped--;			/* nothing is skipped */
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
						   LSN_FORMAT_ARGS(message_lsn), capture_dec->txn_xid,
						   why ? why : "too long");
		capture_dec->skipped--;
		return;
	}
	strlcpy(capture_dec->txn_traceparent, content, sizeof(capture_dec->txn_traceparent));
	strlcpy(capture_dec->txn_tracestate, state ? state : "", sizeof(capture_dec->txn_tracestate));

	oldcxt = MemoryContextSwitchTo(capture_dec->collect_cxt);
	for (i = capture_dec->txn_first_msg; i < capture_dec->nmsgs; i++)
	{
		Collected  *c = &capture_dec->msgs[i];

		c->msg.headers = (struct varlena *)
			outbox_trace_add((Jsonb *) c->msg.headers, capture_dec->txn_traceparent,
							 capture_dec->txn_tracestate);
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
