/*-------------------------------------------------------------------------
 *
 * capture_decode.c
 *	  What the output plugin collects: the captured tables as the historic
 *	  catalog describes them, and each change made a message.
 *
 * Which tables are captured, and how, is read from outbox.captured_tables,
 * a user catalog table, with the historic snapshot of the change: a change
 * is captured if the capture existed when its transaction committed, and
 * each row is read with the columns its table had then (DDL mid-stream is
 * decoded against the catalog of its time).  What is known of a table is
 * kept per transaction and dropped on a relcache invalidation.
 *
 * Memory.  The messages of a pass are kept in one context until the
 * worker hands them off; a part is at most CAPTURE_PART_MESSAGES messages
 * or CAPTURE_PART_BYTES bytes of them (capture_worker.c cuts a larger
 * transaction into parts).  The reorder buffer itself spills to disk
 * beyond logical_decoding_work_mem.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/partition.h"
#include "catalog/pg_namespace.h"
#include "commands/dbcommands.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "outbox.h"
#include "compat.h"
#include "capture.h"
#include "capture_wal.h"

/*---- what the plugin collects ----*/

CaptureDecoding *capture_dec = NULL;

/* CAPTURE_PART_MESSAGES, or 100 under outbox.test_fault = 'capture_small_parts'. */
int			capture_part_messages = CAPTURE_PART_MESSAGES;

void
capture_wal_relcache_callback(Datum arg, Oid relid)
{
	HASH_SEQ_STATUS status;
	WalRel	   *r;

	if (capture_dec == NULL || capture_dec->rels == NULL)
		return;
	hash_seq_init(&status, capture_dec->rels);
	while ((r = hash_seq_search(&status)) != NULL)
		if (relid == InvalidOid || r->relid == relid)
			r->valid = false;
}

void
capture_note_error(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(capture_dec->error, sizeof(capture_dec->error), fmt, ap);
	va_end(ap);
	capture_dec->skipped++;
	ereport(WARNING,
			(errmsg("outbox capture: %s", capture_dec->error)));
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
	rel = try_table_open(capture_dec->captured_tables, AccessShareLock);
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
				capture_dec->skipped--;	/* not a change */
				continue;
			}
			outbox_capture_column_init(&(*cols)[(*ncols)++], desc, att, r->cxt);
		}
	}
}

/* How relation's changes are captured as of this transaction. */
WalRel *
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
	r = hash_search(capture_dec->rels, &relid, HASH_ENTER, &found);
	if (found && r->valid && r->txn_seq == capture_dec->txn_seq &&
		r->snap == snap && r->snap_xmin == snap->xmin &&
		r->snap_xmax == snap->xmax && r->snap_curcid == snap->curcid &&
		r->snap_xcnt == snap->xcnt)
		return r;
	if (found && r->cxt != NULL)
		MemoryContextDelete(r->cxt);
	memset((char *) r + sizeof(Oid), 0, sizeof(WalRel) - sizeof(Oid));
	r->valid = true;
	r->txn_seq = capture_dec->txn_seq;
	r->snap = snap;
	r->snap_xmin = snap->xmin;
	r->snap_xmax = snap->xmax;
	r->snap_curcid = snap->curcid;
	r->snap_xcnt = snap->xcnt;

	oldcxt = MemoryContextSwitchTo(capture_dec->change_cxt);
	/* the outbox's own tables and the catalogs cannot be captured */
	if (relation->rd_rel->relnamespace == capture_dec->outbox_namespace ||
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

	r->cxt = AllocSetContextCreate(capture_dec->rel_cxt, "outbox capture table",
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
			capture_dec->skipped--;
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
bool
capture_part_take(Size size)
{
	int			want;

	if (capture_dec->txn_part_count > 0 &&
		(capture_dec->txn_part_count >= capture_part_messages ||
		 capture_dec->txn_part_bytes + size > CAPTURE_PART_BYTES))
	{
		capture_dec->txn_part++;
		capture_dec->txn_part_count = 0;
		capture_dec->txn_part_bytes = 0;
	}
	capture_dec->txn_part_count++;
	capture_dec->txn_part_bytes += size;
	want = (capture_dec->txn_commit_lsn == capture_dec->part_commit_lsn) ? capture_dec->parts_done : 0;
	if (capture_dec->txn_part < want)
		return false;			/* handed off already */
	if (capture_dec->txn_part > want)
	{
		capture_dec->partial = true;	/* the next pass takes it */
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

	oldcxt = MemoryContextSwitchTo(capture_dec->collect_cxt);
	if (capture_dec->nmsgs == capture_dec->maxmsgs)
	{
		capture_dec->maxmsgs = Max(1024, capture_dec->maxmsgs * 2);
		capture_dec->msgs = capture_dec->msgs ? repalloc_huge(capture_dec->msgs, capture_dec->maxmsgs * sizeof(Collected)) :
			palloc(capture_dec->maxmsgs * sizeof(Collected));
	}
	c = &capture_dec->msgs[capture_dec->nmsgs++];
	c->msg = *m;
	c->msg.payload = capture_copy(m->payload, VARSIZE(m->payload));
	if (m->headers)
		c->msg.headers = capture_copy(m->headers, VARSIZE(m->headers));
	c->msg.topic = capture_copy(m->topic, m->topic_len);
	if (m->key)
		c->msg.key = capture_copy(m->key, m->key_len);
	capture_dec->bytes += size;
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
	outbox_capture_push_string(&st, WJB_VALUE, capture_dec->txn_xid);
	outbox_capture_push_string(&st, WJB_KEY, "source-lsn");
	outbox_capture_push_string(&st, WJB_VALUE, capture_dec->txn_lsn);
	outbox_capture_push_string(&st, WJB_KEY, "source-commit-time");
	outbox_capture_push_string(&st, WJB_VALUE, capture_dec->txn_time);
	if (capture_dec->txn_traceparent[0] != '\0')
	{
		outbox_capture_push_string(&st, WJB_KEY, "traceparent");
		outbox_capture_push_string(&st, WJB_VALUE, capture_dec->txn_traceparent);
		if (capture_dec->txn_tracestate[0] != '\0')
		{
			outbox_capture_push_string(&st, WJB_KEY, "tracestate");
			outbox_capture_push_string(&st, WJB_VALUE, capture_dec->txn_tracestate);
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
	src.ts = capture_dec->txn_commit_time;
	src.snapshot = "false";
	src.xid = capture_dec->txn_xid_raw;
	src.lsn = capture_dec->change_lsn;
	src.commit_lsn = capture_dec->txn_commit_lsn;
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
void
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
		int			nmsgs = capture_dec->nmsgs;
		Size		bytes = capture_dec->bytes;
		uint64		skipped = capture_dec->skipped;

		capture_wal_change(r, desc, "delete", oldtup, NULL);
		capture_wal_change(r, desc, "insert", NULL, newtup);
		/* both or neither: a consumer must not see the delete alone */
		if (capture_dec->skipped != skipped)
		{
			capture_dec->nmsgs = nmsgs;
			capture_dec->bytes = bytes;
		}
		return;
	}
	if (strcmp(op, "delete") == 0 && oldtup == NULL)
	{
		capture_note_error("a delete of %s at %s carries no old row (replica identity NOTHING?): it has no key",
						   r->source, capture_dec->txn_lsn);
		capture_dec->skipped--;
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
						   r->source, capture_dec->txn_lsn);
		return;
	}
	m.payload = (struct varlena *) payload;
	m.topic = r->topic;
	m.topic_len = strlen(r->topic);
	if (keytup != NULL && keyskip != NULL)
	{
		capture_note_error("the key of a change of %s at %s is stored out of line and not in the WAL: it has no key",
						   r->source, capture_dec->txn_lsn);
		capture_dec->skipped--;
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
							   r->source, capture_dec->txn_lsn);
			capture_dec->skipped--;
			m.key = NULL;
			m.key_len = 0;
		}
	}
	m.headers = (struct varlena *) capture_wal_headers(r);
	m.emitted_at = capture_dec->txn_commit_time;
	outbox_make_uuid(&m.msg_id, m.emitted_at);
	capture_collect(&m);
}

/*
 * A row of a captured outbox table as its message (outbox_capture_outbox_row
 * checks it); a bad row raises a data exception, which capture_wal_one turns
 * into a skipped change.
 */
void
capture_wal_outbox_row(WalRel *r, TupleDesc desc, HeapTuple tup)
{
	OutboxMessage m;

	memset(&m, 0, sizeof(m));
	m.commit_time_off = -1;
	outbox_capture_outbox_row(tup, desc, &r->oc, r->source, &m);
	if (capture_dec->txn_traceparent[0] != '\0')
	{
		m.headers = (struct varlena *) outbox_trace_add((Jsonb *) m.headers,
														capture_dec->txn_traceparent,
														capture_dec->txn_tracestate);
		outbox_check_headers_size((Jsonb *) m.headers);	/* the rest was checked */
	}
	m.emitted_at = capture_dec->txn_commit_time;
	outbox_make_uuid(&m.msg_id, m.emitted_at);
	capture_collect(&m);
}

/*
 * The table of what is known of the tables, made once (capture_wal_rel
 * says when an entry holds).  DDL on a table invalidates its entry
 * (capture_wal_relcache_callback).
 */
void
capture_reset_rels(void)
{
	HASHCTL		hctl;

	MemoryContextReset(capture_dec->rel_cxt);
	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(Oid);
	hctl.entrysize = sizeof(WalRel);
	hctl.hcxt = capture_dec->rel_cxt;
	capture_dec->rels = hash_create("outbox capture tables", 16, &hctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}
