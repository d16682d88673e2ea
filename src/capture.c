/*-------------------------------------------------------------------------
 *
 * capture.c
 *	  Change capture by trigger: the rows a transaction writes to a captured
 *	  table become messages of that transaction.
 *
 * outbox.capture() (SQL) installs outbox.capture_trigger() as an AFTER
 * INSERT OR UPDATE OR DELETE row trigger and an AFTER TRUNCATE statement
 * trigger on the table.  The trigger appends to the transaction's emit
 * buffer (emit.c), exactly as outbox_emit() does, so captured changes are
 * stored at commit with commit-ordered ids, mixed in true commit order with
 * the messages the transaction emitted, and vanish with a rollback or a
 * rolled-back savepoint (I1-I3).  No PL/pgSQL and no SPI run per row.
 *
 * Everything the trigger needs is in its arguments, which outbox.capture()
 * wrote and pg_dump carries with the trigger:
 *
 *	  '1', 'c', topic, source, ncolumns, column..., nkey, key...
 *		  a change: payload {"op", "before", "after"}, the rows as capture_json.c
 *		  makes them (only the listed columns, or all when ncolumns is 0),
 *		  key the key columns' values (one: its text; several: a JSON array)
 *	  '1', 'o', topic, source, topic_column, key_column, payload_column,
 *		  headers_column
 *		  a row of an outbox table: one message with the row's topic, key,
 *		  payload and headers (key_column and headers_column may be '')
 *
 * Column names are resolved to attribute numbers once per trigger and
 * backend, and again after a relcache invalidation of the table (ALTER
 * TABLE), so a dropped or renamed captured column is an error at the next
 * write rather than a wrong message.  Partitions carry clones of the
 * parent's row trigger, with its arguments: their changes go to the
 * parent's topic.
 *
 * Headers: source-table (the captured table, schema-qualified, bytes that
 * are not printable ASCII percent-encoded), source-xid (as
 * pg_current_xact_id() shows it) and source-commit-time, whose value is a
 * placeholder of OUTBOX_COMMIT_TIME_LEN bytes that emit.c overwrites at
 * PRE_COMMIT, when the transaction commits; traceparent and tracestate
 * while the transaction names a trace (trace.c), as it is at the change.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_inherits.h"
#include "executor/tuptable.h"
#include "executor/executor.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "capture.h"

PG_FUNCTION_INFO_V1(outbox_capture_trigger);
PG_FUNCTION_INFO_V1(outbox_capture_snapshot);

/* The value source-commit-time holds until PRE_COMMIT fills it. */
static const char commit_time_placeholder[OUTBOX_COMMIT_TIME_LEN + 1] =
"0000-00-00T00:00:00.000000Z";

/* What one trigger (on one table or partition) needs, by trigger OID. */
typedef struct CaptureEntry
{
	Oid			tgoid;			/* hash key */
	Oid			relid;			/* the table the trigger is on */
	bool		valid;			/* cleared by a relcache invalidation */
	MemoryContext cxt;			/* what follows, when valid */
	char		kind;			/* 'c'hange, 'd'ebezium change or 'o'utbox row */
	char	   *topic;
	int			topic_len;
	char	   *source;			/* source-table header value */
	/* kind 'd': the source block's name, schema and table */
	char	   *dbz_name;
	char	   *dbz_schema;
	char	   *dbz_table;
	int		   *dbz_order;		/* outbox_capture_json_order(cols) */
	/* kinds 'c' and 'd' */
	int			ncols;			/* captured columns (all, if none listed) */
	CaptureColumn *cols;
	int			nkeys;
	CaptureColumn *keys;
	/* kind 'o' */
	CaptureOutboxColumns oc;
	/* the headers for the transaction they were last built for */
	FullTransactionId headers_xid;
	uint64		headers_trace;	/* outbox_trace_generation they have */
	Jsonb	   *headers;
	int			commit_time_off;
} CaptureEntry;

static HTAB *capture_cache = NULL;


static void
capture_relcache_callback(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	CaptureEntry *e;

	if (capture_cache == NULL)
		return;
	hash_seq_init(&status, capture_cache);
	while ((e = hash_seq_search(&status)) != NULL)
		if (relid == InvalidOid || e->relid == relid)
			e->valid = false;
}

static void
capture_init_backend(void)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(CaptureEntry);
	capture_cache = hash_create("outbox capture triggers", 16, &ctl,
								HASH_ELEM | HASH_BLOBS);
	CacheRegisterRelcacheCallback(capture_relcache_callback, (Datum) 0);
}

static void
capture_bad_arguments(Trigger *tg, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("outbox capture trigger \"%s\" has invalid arguments", tg->tgname),
			 errdetail("%s", why),
			 errhint("Capture the table again: SELECT outbox.uncapture(...), then outbox.capture(...).")));
}

/* The attribute number of column name of rel, or an error. */
static AttrNumber
capture_column(Relation rel, const char *name, Trigger *tg)
{
	AttrNumber	att = get_attnum(RelationGetRelid(rel), name);

	if (att == InvalidAttrNumber || att < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" captured by outbox does not exist in table \"%s\"",
						name, RelationGetRelationName(rel)),
				 errdetail("The column was renamed or dropped after outbox.capture() named it."),
				 errhint("Capture the table again: SELECT outbox.uncapture(...), then outbox.capture(...) with its present columns.")));
	return att;
}

/* Resolve the trigger's arguments against rel's present columns. */
static void
capture_build(CaptureEntry *e, Relation rel, Trigger *tg)
{
	TupleDesc	desc = RelationGetDescr(rel);
	char	  **a = tg->tgargs;
	int			n = tg->tgnargs;
	int			i;

	if (n < 4 || strcmp(a[0], "1") != 0)
		capture_bad_arguments(tg, "They do not start with version 1.");
	e->kind = a[1][0];
	e->topic = pstrdup(a[2]);
	e->topic_len = strlen(a[2]);
	e->source = pstrdup(a[3]);
	if (e->topic_len == 0 || e->topic_len > OUTBOX_MAX_TOPIC_LEN)
		capture_bad_arguments(tg, "The topic is empty or too long.");
	outbox_check_text(e->topic, e->topic_len, OUTBOX_TEXT_TOPIC, "outbox topic");
	outbox_check_text(e->source, strlen(e->source), OUTBOX_TEXT_HEADER_VALUE,
					  "outbox header \"source-table\"");

	if (strcmp(a[1], "c") == 0 || strcmp(a[1], "d") == 0)
	{
		int			pos = 4;

		if (e->kind == 'd')
		{
			if (n < 8)
				capture_bad_arguments(tg, "A Debezium capture names its prefix, schema and table.");
			e->dbz_name = pstrdup(a[4]);
			e->dbz_schema = pstrdup(a[5]);
			e->dbz_table = pstrdup(a[6]);
			pos = 7;
		}

		if (pos >= n)
			capture_bad_arguments(tg, "The column count is missing.");
		e->ncols = pg_strtoint32(a[pos++]);
		if (e->ncols < 0 || pos + e->ncols >= n)
			capture_bad_arguments(tg, "The column list is cut short.");
		if (e->ncols > 0)
		{
			e->cols = palloc(e->ncols * sizeof(CaptureColumn));
			for (i = 0; i < e->ncols; i++)
				outbox_capture_column_init(&e->cols[i], desc,
										   capture_column(rel, a[pos++], tg),
										   e->cxt);
		}
		else
		{
			e->cols = palloc(desc->natts * sizeof(CaptureColumn));
			for (i = 0; i < desc->natts; i++)
				if (outbox_capture_column_usable(TupleDescAttr(desc, i)))
					outbox_capture_column_init(&e->cols[e->ncols++], desc,
											   i + 1, e->cxt);
		}
		e->nkeys = pg_strtoint32(a[pos++]);
		if (e->nkeys < 1 || pos + e->nkeys != n)
			capture_bad_arguments(tg, "The key column list does not match its count.");
		e->keys = palloc(e->nkeys * sizeof(CaptureColumn));
		for (i = 0; i < e->nkeys; i++)
			outbox_capture_column_init(&e->keys[i], desc,
									   capture_column(rel, a[pos++], tg),
									   e->cxt);
		if (e->kind == 'd')
			e->dbz_order = outbox_capture_json_order(e->cols, e->ncols);
	}
	else if (strcmp(a[1], "o") == 0 || strcmp(a[1], "r") == 0)
	{
		Oid			outfn;
		bool		varlena;

		if (n != (e->kind == 'r' ? 9 : 8))
			capture_bad_arguments(tg, e->kind == 'r' ? "A routed outbox table capture has 9 arguments." :
								  "An outbox table capture has 8 arguments.");
		if (e->kind == 'r')
		{
			e->kind = 'o';
			e->oc.router = true;
			e->oc.id_att = capture_column(rel, a[8], tg);
			getTypeOutputInfo(TupleDescAttr(desc, e->oc.id_att - 1)->atttypid,
							  &outfn, &varlena);
			fmgr_info_cxt(outfn, &e->oc.id_out, e->cxt);
		}
		e->oc.topic_att = capture_column(rel, a[4], tg);
		e->oc.key_att = a[5][0] ? capture_column(rel, a[5], tg) : 0;
		e->oc.payload_att = capture_column(rel, a[6], tg);
		e->oc.headers_att = a[7][0] ? capture_column(rel, a[7], tg) : 0;
		e->oc.payload_type = TupleDescAttr(desc, e->oc.payload_att - 1)->atttypid;
		if (e->oc.key_att)
		{
			getTypeOutputInfo(TupleDescAttr(desc, e->oc.key_att - 1)->atttypid,
							  &outfn, &varlena);
			fmgr_info_cxt(outfn, &e->oc.key_out, e->cxt);
		}
		if (getBaseType(TupleDescAttr(desc, e->oc.topic_att - 1)->atttypid) != TEXTOID &&
			getBaseType(TupleDescAttr(desc, e->oc.topic_att - 1)->atttypid) != VARCHAROID)
			capture_bad_arguments(tg, "The topic column is not of type text.");
		if (e->oc.payload_type != JSONBOID && e->oc.payload_type != JSONOID &&
			e->oc.payload_type != TEXTOID)
			capture_bad_arguments(tg, "The payload column is not of type jsonb, json or text.");
		if (e->oc.headers_att &&
			TupleDescAttr(desc, e->oc.headers_att - 1)->atttypid != JSONBOID)
			capture_bad_arguments(tg, "The headers column is not of type jsonb.");
	}
	else
		capture_bad_arguments(tg, "The kind is none of \"c\", \"d\", \"o\" and \"r\".");
}

static CaptureEntry *
capture_entry(Relation rel, Trigger *tg)
{
	CaptureEntry *e;
	bool		found;
	MemoryContext oldcxt;

	if (capture_cache == NULL)
		capture_init_backend();
	e = hash_search(capture_cache, &tg->tgoid, HASH_ENTER, &found);
	if (found && e->valid)
		return e;
	if (found && e->cxt)
		MemoryContextDelete(e->cxt);
	memset((char *) e + sizeof(Oid), 0, sizeof(CaptureEntry) - sizeof(Oid));
	e->relid = RelationGetRelid(rel);
	e->cxt = AllocSetContextCreate(CacheMemoryContext, "outbox capture trigger",
								   ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(e->cxt);
	PG_TRY();
	{
		capture_build(e, rel, tg);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		MemoryContextDelete(e->cxt);
		e->cxt = NULL;
		hash_search(capture_cache, &tg->tgoid, HASH_REMOVE, NULL);
		PG_RE_THROW();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(oldcxt);
	e->valid = true;
	return e;
}

/*
 * The headers of e's messages in this transaction; built once per
 * transaction and trigger.
 */
static Jsonb *
capture_headers(CaptureEntry *e)
{
	FullTransactionId xid = GetTopFullTransactionId();
	JsonbParseState *st = NULL;
	JsonbValue	k;
	JsonbValue	v;
	JsonbValue *res;
	char		xidbuf[32];
	Jsonb	   *h;
	MemoryContext oldcxt;

	if (e->headers != NULL &&
		FullTransactionIdEquals(e->headers_xid, xid) &&
		e->headers_trace == outbox_trace_generation)
		return e->headers;

	oldcxt = MemoryContextSwitchTo(e->cxt);
	if (e->headers)
		pfree(e->headers);
	e->headers = NULL;
	snprintf(xidbuf, sizeof(xidbuf), UINT64_FORMAT, U64FromFullTransactionId(xid));
	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
#define CAPTURE_PUSH(name, value) \
	do { \
		k.type = jbvString; k.val.string.val = (char *) (name); \
		k.val.string.len = strlen(name); \
		pushJsonbValue(&st, WJB_KEY, &k); \
		v.type = jbvString; v.val.string.val = (char *) (value); \
		v.val.string.len = strlen(value); \
		pushJsonbValue(&st, WJB_VALUE, &v); \
	} while (0)
	CAPTURE_PUSH("source-table", e->source);
	CAPTURE_PUSH("source-xid", xidbuf);
	CAPTURE_PUSH("source-commit-time", commit_time_placeholder);
	/* the transaction's trace as it is now (keys shorter than the above) */
	if (outbox_trace_active())
	{
		CAPTURE_PUSH("traceparent", outbox_traceparent);
		if (outbox_tracestate[0] != '\0')
			CAPTURE_PUSH("tracestate", outbox_tracestate);
	}
#undef CAPTURE_PUSH
	res = pushJsonbValue(&st, WJB_END_OBJECT, NULL);
	h = JsonbValueToJsonb(res);
	MemoryContextSwitchTo(oldcxt);

	/*
	 * A jsonb object stores its keys by length, then bytes, and the values
	 * in that order after them: source-commit-time, the longest key, has the
	 * last value, which ends the container.
	 */
	e->commit_time_off = VARSIZE(h) - OUTBOX_COMMIT_TIME_LEN;
	if (memcmp((char *) h + e->commit_time_off, commit_time_placeholder,
			   OUTBOX_COMMIT_TIME_LEN) != 0)
		elog(ERROR, "outbox: unexpected layout of captured message headers");
	e->headers = h;
	e->headers_xid = xid;
	e->headers_trace = outbox_trace_generation;
	return h;
}

/* The key of a change, checked as outbox_emit() checks keys. */
static void
capture_key(CaptureEntry *e, HeapTuple tuple, TupleDesc desc, OutboxMessage *msg)
{
	msg->key = e->kind == 'd' ?
		outbox_capture_debezium_key(tuple, desc, e->keys, e->nkeys, &msg->key_len) :
		outbox_capture_key(tuple, desc, e->keys, e->nkeys, &msg->key_len);
	if (msg->key == NULL)
		return;
	if (msg->key_len > OUTBOX_MAX_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("outbox key of a change captured from \"%s\" is too long", e->source),
				 errdetail("The key has %d bytes; the limit is %d.",
						   msg->key_len, OUTBOX_MAX_KEY_LEN),
				 errhint("Capture the table with shorter key columns (outbox.capture(..., key => ...)).")));
	outbox_check_text(msg->key, msg->key_len, OUTBOX_TEXT_KEY, "outbox key");
}

/*
 * A change: the envelope {"op", "before", "after"} (kind 'c') or Debezium's
 * (kind 'd', snapshot its source.snapshot) and the key, from the new row, or
 * the old one for a delete.
 */
static void
capture_change(CaptureEntry *e, TupleDesc desc, const char *op,
			   HeapTuple oldtup, HeapTuple newtup, const char *snapshot,
			   OutboxMessage *msg)
{
	Jsonb	   *payload;

	msg->emitted_at = GetCurrentTimestamp();
	if (e->kind == 'd')
	{
		CaptureDebeziumSource src;

		memset(&src, 0, sizeof(src));
		src.name = e->dbz_name;
		src.schema = e->dbz_schema;
		src.table = e->dbz_table;
		src.snapshot = snapshot;
		src.xid = GetTopTransactionId();
		if (op[0] == 'r')
		{
			/* as the connector's snapshot: its transaction's start, xid8 */
			src.ts = GetCurrentTransactionStartTimestamp();
			src.full_xid = U64FromFullTransactionId(GetTopFullTransactionId());
		}
		else
			src.ts = msg->emitted_at;	/* the commit is still to come */
		src.made = msg->emitted_at;
		src.lsn = InvalidXLogRecPtr;
		src.commit_lsn = InvalidXLogRecPtr;
		payload = outbox_capture_debezium(&src, op, oldtup, newtup,
										  desc, e->cols, e->ncols, e->dbz_order, NULL);
	}
	else
	{
		JsonbParseState *st = NULL;
		JsonbValue	null;

		null.type = jbvNull;
		pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
		outbox_capture_push_string(&st, WJB_KEY, "op");
		outbox_capture_push_string(&st, WJB_VALUE, op);
		outbox_capture_push_string(&st, WJB_KEY, "before");
		if (oldtup != NULL)
			outbox_capture_push_row(&st, oldtup, desc, e->cols, e->ncols, NULL);
		else
			pushJsonbValue(&st, WJB_VALUE, &null);
		outbox_capture_push_string(&st, WJB_KEY, "after");
		if (newtup != NULL)
			outbox_capture_push_row(&st, newtup, desc, e->cols, e->ncols, NULL);
		else
			pushJsonbValue(&st, WJB_VALUE, &null);
		payload = JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
	}
	outbox_check_payload_size(PointerGetDatum(payload));
	msg->payload = (struct varlena *) payload;
	if (newtup != NULL || oldtup != NULL)
		capture_key(e, newtup != NULL ? newtup : oldtup, desc, msg);

	msg->topic = e->topic;
	msg->topic_len = e->topic_len;
	msg->headers = (struct varlena *) capture_headers(e);
	msg->commit_time_off = e->commit_time_off;
}

/*
 * The headers of a routed outbox table row: those of its headers column
 * (h, or NULL), with "id", as Debezium's outbox event router adds it.
 */
static Jsonb *
capture_router_headers(HeapTuple row, TupleDesc desc, const CaptureOutboxColumns *oc,
					   const char *source, Jsonb *h)
{
	JsonbParseState *st = NULL;
	bool		isnull;
	Datum		d;
	Jsonb	   *add;

	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	d = heap_getattr(row, oc->id_att, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox event id must not be null"),
				 errdetail("The row inserted into captured outbox table \"%s\" has a null id column.",
						   source),
				 errhint("Give each outbox row an id, for example gen_random_uuid().")));
	outbox_capture_push_string(&st, WJB_KEY, "id");
	outbox_capture_push_string(&st, WJB_VALUE, OutputFunctionCall((FmgrInfo *) &oc->id_out, d));
	add = JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
	if (h == NULL)
		return add;
	/* the row's own headers give way to the router's */
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(h),
											  JsonbPGetDatum(add)));
}

/*
 * A row of a captured outbox table as its message: its topic, key, payload
 * and headers, checked as outbox_emit() checks its arguments.  For both
 * modes: the trigger lets the error fail the insert, the WAL worker skips
 * the row (capture_decode.c).  source names the table in the errors.
 */
void
outbox_capture_outbox_row(HeapTuple row, TupleDesc desc,
						  const CaptureOutboxColumns *oc, const char *source,
						  OutboxMessage *msg)
{
	bool		isnull;
	Datum		d;

	d = heap_getattr(row, oc->topic_att, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox topic must not be null"),
				 errdetail("The row inserted into captured outbox table \"%s\" has a null topic column.",
						   source),
				 errhint("Name the topic, for example 'orders.created'.")));
	if (oc->router)
	{
		/* Debezium's route.topic.replacement: outbox.event.${routedByValue} */
		text	   *v = DatumGetTextPP(d);
		StringInfoData t;

		initStringInfo(&t);
		appendStringInfoString(&t, CAPTURE_ROUTER_TOPIC_PREFIX);
		appendBinaryStringInfo(&t, VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v));
		outbox_check_topic(cstring_to_text_with_len(t.data, t.len), &msg->topic, &msg->topic_len);
	}
	else
		outbox_check_topic(DatumGetTextPP(d), &msg->topic, &msg->topic_len);

	if (oc->key_att)
	{
		d = heap_getattr(row, oc->key_att, desc, &isnull);
		if (!isnull)
		{
			char	   *s = OutputFunctionCall((FmgrInfo *) &oc->key_out, d);

			outbox_check_key(cstring_to_text(s), &msg->key, &msg->key_len);
		}
	}

	d = heap_getattr(row, oc->payload_att, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox payload must not be null"),
				 errdetail("The row inserted into captured outbox table \"%s\" has a null payload column.",
						   source),
				 errhint("Store 'null'::jsonb or '{}' for a message without a body.")));
	if (oc->payload_type != JSONBOID)
		d = DirectFunctionCall1(jsonb_in,
								CStringGetDatum(TextDatumGetCString(d)));
	outbox_check_payload_size(d);
	msg->payload = (struct varlena *) DatumGetJsonbP(d);

	{
		Jsonb	   *h = NULL;

		if (oc->headers_att)
		{
			d = heap_getattr(row, oc->headers_att, desc, &isnull);
			if (!isnull)
				h = DatumGetJsonbP(d);
		}
		if (oc->router)
			h = capture_router_headers(row, desc, oc, source, h);
		if (h != NULL)
			outbox_check_headers(h);
		/* the transaction's trace, unless the row's headers name their own */
		if (outbox_trace_active())
		{
			h = outbox_trace_add_current(h);
			outbox_check_headers_size(h);	/* the rest was checked */
		}
		msg->headers = (struct varlena *) h;
	}
}

/*
 * outbox.capture_trigger(): the trigger outbox.capture() installs.
 */
Datum
outbox_capture_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	CaptureEntry *e;
	OutboxMessage msg;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox.capture_trigger() must be called as a trigger"),
				 errhint("Install it with outbox.capture().")));
	if (!TRIGGER_FIRED_AFTER(td->tg_event) ||
		(TRIGGER_FIRED_BY_TRUNCATE(td->tg_event) ?
		 !TRIGGER_FIRED_FOR_STATEMENT(td->tg_event) :
		 !TRIGGER_FIRED_FOR_ROW(td->tg_event)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox.capture_trigger() must run AFTER each row, or AFTER TRUNCATE"),
				 errhint("Install it with outbox.capture().")));

	outbox_check_preloaded("outbox change capture");
	outbox_check_database("outbox change capture");
	if (outbox_counter_valid())
		outbox_check_ids_left(1);

	e = capture_entry(td->tg_relation, td->tg_trigger);

	memset(&msg, 0, sizeof(msg));
	msg.commit_time_off = -1;
	if (e->kind == 'o')
	{
		if (!TRIGGER_FIRED_BY_INSERT(td->tg_event))
			return PointerGetDatum(NULL);	/* only inserts are messages */
		outbox_capture_outbox_row(td->tg_trigtuple, RelationGetDescr(td->tg_relation),
								  &e->oc, e->source, &msg);
	}
	else
	{
		TupleDesc	desc = RelationGetDescr(td->tg_relation);
		TriggerEvent ev = td->tg_event;

		if (TRIGGER_FIRED_BY_INSERT(ev))
			capture_change(e, desc, "insert", NULL, td->tg_trigtuple, "false", &msg);
		else if (TRIGGER_FIRED_BY_UPDATE(ev) && e->kind == 'd' &&
				 outbox_capture_key_changed(td->tg_trigtuple, td->tg_newtuple, desc,
											e->keys, e->nkeys))
		{
			/* Debezium: a delete of the old key, then a create of the new */
			OutboxMessage del;

			memset(&del, 0, sizeof(del));
			del.commit_time_off = -1;
			capture_change(e, desc, "delete", td->tg_trigtuple, NULL, "false", &del);
			outbox_make_uuid(&del.msg_id, del.emitted_at);
			outbox_buffer_append(&del);
			capture_change(e, desc, "insert", NULL, td->tg_newtuple, "false", &msg);
		}
		else if (TRIGGER_FIRED_BY_UPDATE(ev))
			capture_change(e, desc, "update", td->tg_trigtuple,
						   td->tg_newtuple, "false", &msg);
		else if (TRIGGER_FIRED_BY_DELETE(ev))
			capture_change(e, desc, "delete", td->tg_trigtuple, NULL, "false", &msg);
		else
			capture_change(e, desc, "truncate", NULL, NULL, "false", &msg);
	}
	if (msg.emitted_at == 0)
		msg.emitted_at = GetCurrentTimestamp();
	outbox_make_uuid(&msg.msg_id, msg.emitted_at);
	outbox_buffer_append(&msg);

	return PointerGetDatum(NULL);
}

/* Buffer a row of a snapshot as a change with op "read". */
static void
capture_snapshot_row(CaptureEntry *e, TupleDesc desc, HeapTuple tup,
					 const char *snapshot, MemoryContext rowcxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(rowcxt);
	OutboxMessage msg;

	memset(&msg, 0, sizeof(msg));
	msg.commit_time_off = -1;
	capture_change(e, desc, "read", NULL, tup, snapshot, &msg);
	outbox_make_uuid(&msg.msg_id, msg.emitted_at);
	outbox_buffer_append(&msg);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(rowcxt);
}

/*
 * outbox.capture_snapshot(tbl regclass, args text[]) -> bigint
 *
 * Buffer every row of tbl (of each partition of a partitioned table) as a
 * change with op "read", described by args (the trigger's arguments), in
 * the calling transaction, and return how many.  outbox.capture() calls it
 * after installing the trigger (or, for a WAL capture, taking a SHARE
 * lock), whose lock keeps writers out until the transaction ends: a row's
 * read comes before any later change of it.  That needs this statement's
 * snapshot to be taken after the lock, hence READ COMMITTED.
 */
Datum
outbox_capture_snapshot(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	ArrayType  *argarr = PG_GETARG_ARRAYTYPE_P(1);
	Trigger		tg;
	Datum	   *elems;
	bool	   *enulls;
	int			nelems;
	int			i;
	List	   *relids;
	ListCell   *lc;
	int64		count = 0;
	MemoryContext rowcxt;
	MemoryContext pendcxt;
	Snapshot	snapshot;
	List	   *opened = NIL;
	HeapTuple	pending = NULL;
	CaptureEntry *pend_e = NULL;
	TupleDesc	pend_desc = NULL;

	outbox_check_preloaded("outbox.capture_snapshot()");
	outbox_check_database("outbox.capture_snapshot()");
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("outbox.capture() with snapshot => true must run in a READ COMMITTED transaction"),
				 errdetail("A transaction snapshot taken before the table was locked would miss rows that were committed in between."),
				 errhint("Call it in a transaction of isolation level READ COMMITTED.")));

	if (get_rel_relkind(relid) == RELKIND_PARTITIONED_TABLE)
		relids = find_all_inheritors(relid, AccessShareLock, NULL);
	else
		relids = list_make1_oid(relid);

	deconstruct_array(argarr, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &enulls, &nelems);
	memset(&tg, 0, sizeof(tg));
	tg.tgname = "outbox_capture";
	tg.tgnargs = nelems;
	tg.tgargs = palloc(nelems * sizeof(char *));
	for (i = 0; i < nelems; i++)
	{
		if (enulls[i])
			elog(ERROR, "outbox.capture_snapshot(): null argument");
		tg.tgargs[i] = TextDatumGetCString(elems[i]);
	}

	/*
	 * A snapshot taken now, under the lock, not the calling statement's:
	 * that one may be older than the lock (PL/pgSQL need not take a new
	 * one for an expression), and would miss rows committed in between.
	 */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	rowcxt = AllocSetContextCreate(CurrentMemoryContext, "outbox capture snapshot row",
								   ALLOCSET_DEFAULT_SIZES);
	pendcxt = AllocSetContextCreate(CurrentMemoryContext, "outbox capture snapshot last row",
									ALLOCSET_DEFAULT_SIZES);
	foreach(lc, relids)
	{
		Relation	rel = table_open(lfirst_oid(lc), AccessShareLock);
		TableScanDesc scan;
		TupleTableSlot *slot;
		CaptureEntry *e;

		if (rel->rd_rel->relkind != RELKIND_RELATION)
		{
			table_close(rel, AccessShareLock);
			continue;
		}
		/* closed at the end: the row held back may be this table's */
		opened = lappend(opened, rel);
		e = palloc0(sizeof(CaptureEntry));
		e->relid = RelationGetRelid(rel);
		e->cxt = CurrentMemoryContext;
		capture_build(e, rel, &tg);
		if (e->kind != 'c' && e->kind != 'd')
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("an outbox table capture has no snapshot")));
		slot = table_slot_create(rel, NULL);
		scan = table_beginscan(rel, snapshot, 0, NULL);
		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			bool		should_free;
			HeapTuple	tup;
			MemoryContext oldcxt;

			CHECK_FOR_INTERRUPTS();
			/*
			 * Each row is sent when the next is read, so that the last one
			 * can say so: Debezium's source.snapshot is "first" for the
			 * first row, "last" for the last (a single row's too), "true"
			 * between.
			 */
			if (pending != NULL)
			{
				capture_snapshot_row(pend_e, pend_desc, pending,
									 count == 0 ? "first" : "true", rowcxt);
				count++;
			}
			MemoryContextReset(pendcxt);
			tup = ExecFetchSlotHeapTuple(slot, false, &should_free);
			oldcxt = MemoryContextSwitchTo(pendcxt);
			pending = heap_copytuple(tup);
			MemoryContextSwitchTo(oldcxt);
			pend_e = e;
			pend_desc = RelationGetDescr(rel);
		}
		table_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
	}
	if (pending != NULL)
	{
		capture_snapshot_row(pend_e, pend_desc, pending, "last", rowcxt);
		count++;
	}
	foreach(lc, opened)
		table_close((Relation) lfirst(lc), AccessShareLock);
	MemoryContextDelete(pendcxt);
	MemoryContextDelete(rowcxt);
	UnregisterSnapshot(snapshot);
	PG_RETURN_INT64(count);
}
