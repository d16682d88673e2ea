/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Direct reads and writes of the outbox tables.
 *
 * Messages are written at PRE_COMMIT straight through the table AM
 * (table_multi_insert plus index insertion, as COPY does), never through
 * SPI: no user code may run at that point, and trigger events queued there
 * would be dropped silently.  Rows are written in batches from a short-lived
 * memory context, so storing a million messages uses a bounded amount of
 * memory.
 *
 * This file also reads what the commit sequence is initialised from after
 * a start: the highest id present in outbox.messages (any row version, dead
 * or alive), the high-water mark in outbox.state that the delete and
 * truncate triggers maintain, and the durable id mark (outbox.id_mark),
 * which the commit sequence keeps ahead of every id it hands out.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_sequence.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/dbcommands.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "storage/lmgr.h"

#include "outbox.h"

/* Rows handed to table_multi_insert at once. */
#define OUTBOX_INSERT_BATCH		1000

struct OutboxWriter
{
	Relation	rel;			/* outbox.messages */
	EState	   *estate;			/* for index insertion */
	ResultRelInfo *rri;			/* rel and its open indexes */
	TupleTableSlot **slots;		/* up to OUTBOX_INSERT_BATCH slots */
	int			maxslots;		/* entries allocated in slots */
	int			nslots_made;	/* slots created so far */
	OutboxMarkRel mark;			/* the id mark's sequence */
	bool		mark_locked;	/* mark checked, and locked if it exists */
};

/* OID of outbox.messages found by the last lookup, or InvalidOid. */
static Oid	cached_messages_relid = InvalidOid;

/* OIDs of outbox.messages_1 .. _N found by the last lookups. */
static Oid	cached_chunk_relid[OUTBOX_NUM_CHUNKS];

/* The id mark's sequence found by the last lookup. */
static OutboxMarkRel cached_mark = {InvalidOid, InvalidOid};

/* Refuse a messages table whose columns are not the ones we write. */
static void
outbox_check_layout(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);

	if (desc->natts != Natts_outbox_messages ||
		TupleDescAttr(desc, Anum_outbox_messages_id - 1)->atttypid != INT8OID ||
		TupleDescAttr(desc, Anum_outbox_messages_msg_id - 1)->atttypid != UUIDOID ||
		TupleDescAttr(desc, Anum_outbox_messages_payload - 1)->atttypid != JSONBOID ||
		TupleDescAttr(desc, Anum_outbox_messages_emitted_at - 1)->atttypid != TIMESTAMPTZOID)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table outbox.%s does not have the layout this library expects",
						RelationGetRelationName(rel)),
				 errhint("Run ALTER EXTENSION outbox UPDATE, or install the library version that matches the extension.")));
}

/*
 * Open outbox.<relname> with the given lock, or return NULL when the schema
 * or the table does not exist.  The OID found is remembered in *cached; a
 * relation with that OID that is no longer the table (dropped and
 * recreated) sends us back to the by-name lookup.
 */
static Relation
outbox_try_open_table(const char *relname, Oid *cached, LOCKMODE lockmode)
{
	Oid			nspid;
	Oid			relid = InvalidOid;
	Relation	rel;

	if (OidIsValid(*cached))
	{
		rel = try_table_open(*cached, lockmode);
		if (rel != NULL)
		{
			if (strcmp(RelationGetRelationName(rel), relname) == 0 &&
				RelationGetNamespace(rel) == get_namespace_oid(OUTBOX_SCHEMA, true))
				return rel;
			table_close(rel, lockmode);
		}
		*cached = InvalidOid;
	}

	nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	if (OidIsValid(nspid))
		relid = get_relname_relid(relname, nspid);
	if (!OidIsValid(relid))
		return NULL;
	rel = table_open(relid, lockmode);
	outbox_check_layout(rel);
	*cached = relid;
	return rel;
}

/*
 * Open outbox.messages with the given lock, with a clear error when the
 * extension is not installed in this database.
 */
Relation
outbox_open_messages(LOCKMODE lockmode)
{
	Relation	rel = outbox_try_open_table(OUTBOX_MESSAGES_TABLE,
											&cached_messages_relid, lockmode);

	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"outbox\" is not installed in database \"%s\"",
						get_database_name(MyDatabaseId)),
				 errhint("Run CREATE EXTENSION outbox in this database.")));
	return rel;
}

/*
 * Open chunk n (1 .. OUTBOX_NUM_CHUNKS, outbox.messages_<n>) with the given
 * lock, or return NULL when it does not exist (a schema of version 0.1).
 */
static Relation
outbox_try_open_chunk(int n, LOCKMODE lockmode)
{
	static const char *const names[OUTBOX_NUM_CHUNKS] = {
		OUTBOX_MESSAGES_TABLE "_1", OUTBOX_MESSAGES_TABLE "_2",
		OUTBOX_MESSAGES_TABLE "_3", OUTBOX_MESSAGES_TABLE "_4"
	};

	StaticAssertStmt(OUTBOX_NUM_CHUNKS == 4, "one name per chunk");
	Assert(n >= 1 && n <= OUTBOX_NUM_CHUNKS);
	return outbox_try_open_table(names[n - 1], &cached_chunk_relid[n - 1], lockmode);
}

/*
 * Open the table committers store messages in: the current chunk as the
 * relay published it (chunk 1 before it has), or outbox.messages itself on
 * a schema of version 0.1.  The caller reserves ids only after this, with
 * the lock held, so a chunk emptied meanwhile can never lose them.
 */
static Relation
outbox_open_for_write(void)
{
	int			n = outbox_current_chunk();
	Relation	rel;

	if (n < 1 || n > OUTBOX_NUM_CHUNKS)
		n = 1;
	rel = outbox_try_open_chunk(n, RowExclusiveLock);
	if (rel == NULL)
		rel = outbox_open_messages(RowExclusiveLock);
	return rel;
}

/* The highest id of any row version in a messages table, or 0. */
static int64
outbox_highest_message_id(Relation messages)
{
	Oid			pkoid = outbox_primary_key_index(messages);
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	int64		highest = 0;

	if (!OidIsValid(pkoid))
		elog(ERROR, "outbox: outbox.%s has no primary key",
			 RelationGetRelationName(messages));

	index = index_open(pkoid, AccessShareLock);
	slot = table_slot_create(messages, NULL);
	scan = outbox_index_beginscan(messages, index, SnapshotAny);
	index_rescan(scan, NULL, 0, NULL, 0);
	if (index_getnext_slot(scan, BackwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, Anum_outbox_messages_id, &isnull);

		if (!isnull)
			highest = DatumGetInt64(d);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);

	return highest;
}

/* The durable high-water mark from outbox.state (any row version), or 0. */
static int64
outbox_high_water_mark(void)
{
	Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, false);
	Oid			relid = get_relname_relid(OUTBOX_STATE_TABLE, nspid);
	Relation	rel;
	TableScanDesc scan;
	TupleTableSlot *slot;
	int64		highest = 0;

	if (!OidIsValid(relid))
		elog(ERROR, "outbox: table outbox.state is missing");

	rel = table_open(relid, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, 1, &isnull);

		if (!isnull && DatumGetInt64(d) > highest)
			highest = DatumGetInt64(d);
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);

	return highest;
}

/*
 * Find the sequence outbox.id_mark.  A schema of version 0.1 has none
 * (InvalidOid): ids then follow the table and outbox.state only, until
 * ALTER EXTENSION outbox UPDATE.  The lookup is remembered, and checked
 * again like outbox.messages' in case the sequence was recreated.
 */
static const OutboxMarkRel *
outbox_mark_rel(void)
{
	Oid			nspid;
	HeapTuple	tup;

	if (OidIsValid(cached_mark.relid))
	{
		tup = SearchSysCache1(RELOID, ObjectIdGetDatum(cached_mark.relid));
		if (HeapTupleIsValid(tup))
		{
			Form_pg_class cls = (Form_pg_class) GETSTRUCT(tup);
			bool		same = cls->relkind == RELKIND_SEQUENCE &&
				strcmp(NameStr(cls->relname), OUTBOX_MARK_SEQUENCE) == 0 &&
				cls->relnamespace == get_namespace_oid(OUTBOX_SCHEMA, true);

			ReleaseSysCache(tup);
			if (same)
				return &cached_mark;
		}
	}
	cached_mark.relid = InvalidOid;
	cached_mark.owner = InvalidOid;
	nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	if (!OidIsValid(nspid))
		return &cached_mark;
	tup = SearchSysCache2(RELNAMENSP, CStringGetDatum(OUTBOX_MARK_SEQUENCE),
						  ObjectIdGetDatum(nspid));
	if (HeapTupleIsValid(tup))
	{
		Form_pg_class cls = (Form_pg_class) GETSTRUCT(tup);

		if (cls->relkind == RELKIND_SEQUENCE)
		{
			cached_mark.relid = cls->oid;
			cached_mark.owner = cls->relowner;
		}
		ReleaseSysCache(tup);
	}
	return &cached_mark;
}

/*
 * The durable id mark: the last value set on outbox.id_mark, read from the
 * sequence's tuple without advancing it (or 0 when never set, or without
 * the sequence).
 */
static int64
outbox_id_mark(void)
{
	const OutboxMarkRel *markrel = outbox_mark_rel();
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	int64		mark = 0;

	if (!OidIsValid(markrel->relid))
		return 0;
	rel = relation_open(markrel->relid, AccessShareLock);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	tup = heap_getnext(scan, ForwardScanDirection);
	if (tup != NULL)
	{
		Form_pg_sequence_data seq = (Form_pg_sequence_data) GETSTRUCT(tup);

		if (seq->is_called)
			mark = seq->last_value;
	}
	table_endscan(scan);
	relation_close(rel, AccessShareLock);
	return mark;
}

/*
 * After a start, before the relay has said which chunk is current, take it
 * from outbox.chunks, so that committers do not fill an old chunk (which
 * would be emptied as soon as delivered, ahead of outbox.retention).
 */
static void
outbox_find_current_chunk(void)
{
	Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	Oid			relid = OidIsValid(nspid) ? get_relname_relid("chunks", nspid) : InvalidOid;
	AttrNumber	chunk_att;
	AttrNumber	current_att;
	Relation	rel;
	Snapshot	snapshot;
	TableScanDesc scan;
	TupleTableSlot *slot;

	if (!OidIsValid(relid) || outbox_current_chunk() != 0)
		return;
	chunk_att = get_attnum(relid, "chunk");
	current_att = get_attnum(relid, "is_current");
	if (chunk_att == InvalidAttrNumber || current_att == InvalidAttrNumber)
		return;
	rel = table_open(relid, AccessShareLock);
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	slot = table_slot_create(rel, NULL);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		current = slot_getattr(slot, current_att, &isnull);

		if (!isnull && DatumGetBool(current))
		{
			Datum		chunk = slot_getattr(slot, chunk_att, &isnull);

			if (!isnull && DatumGetInt32(chunk) >= 1 &&
				DatumGetInt32(chunk) <= OUTBOX_NUM_CHUNKS)
				outbox_set_current_chunk_if_unset(DatumGetInt32(chunk));
			break;
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);
}

/*
 * Make sure the commit sequence is initialised since the last start, from
 * the highest id in outbox.messages and its chunks, the high-water mark and
 * the id mark.  Caller holds a lock on outbox.messages.
 */
void
outbox_ensure_counter(Relation messages)
{
	int64		highest;
	int			n;
	uint32		generation;

	do
	{
		/* the reading is for the database's slot of now */
		generation = outbox_db_generation();
		if (outbox_counter_valid())
			return;

		outbox_find_current_chunk();
		highest = Max(outbox_highest_message_id(messages), outbox_high_water_mark());
		highest = Max(highest, outbox_id_mark());
		for (n = 1; n <= OUTBOX_NUM_CHUNKS; n++)
		{
			Relation	chunk = outbox_try_open_chunk(n, AccessShareLock);

			if (chunk == NULL)
				break;
			highest = Max(highest, outbox_highest_message_id(chunk));
			table_close(chunk, AccessShareLock);
		}
	} while (!outbox_counter_initialize(highest, generation));
}

/*
 * Find the id mark's sequence (checked again: it may have been created by
 * ALTER EXTENSION UPDATE, or recreated, since we last looked) and lock it,
 * before our LWLock is taken, so that moving it never waits under that.
 */
static void
outbox_writer_lock_mark(OutboxWriter *writer)
{
	if (writer->mark_locked)
		return;
	writer->mark = *outbox_mark_rel();
	if (OidIsValid(writer->mark.relid))
		LockRelationOid(writer->mark.relid, RowExclusiveLock);
	writer->mark_locked = true;
}

/*
 * Lock, without waiting and in this transaction, every table a store of
 * messages may take, in each mode it may take it (more than one store
 * needs: all the chunks, for the current one can change before the store
 * runs; the relay's retention then leaves a chunk to its next turn): the
 * chunks and
 * outbox.messages (written, and read for the commit sequence),
 * outbox.state and outbox.chunks (read), the id mark (moved).  Returns the
 * OID of one another transaction holds, with the mode asked in *mode, or
 * InvalidOid when all of them (those that exist) are held now.  For a
 * worker that stores while it holds the extension itself in share mode
 * (the capture hand-off): waiting there for a table that a session locked
 * before it dropped the extension would close a deadlock the drop may
 * lose, so such a worker waits holding nothing, and begins again.
 */
Oid
outbox_storage_try_lock(LOCKMODE *mode)
{
	static const char *const tables[] = {
		OUTBOX_MESSAGES_TABLE "_1", OUTBOX_MESSAGES_TABLE "_2",
		OUTBOX_MESSAGES_TABLE "_3", OUTBOX_MESSAGES_TABLE "_4",
		OUTBOX_MESSAGES_TABLE, OUTBOX_STATE_TABLE, "chunks"
	};
	Oid			nspid = get_namespace_oid(OUTBOX_SCHEMA, true);
	Oid			relid;
	int			i;

	if (!OidIsValid(nspid))
		return InvalidOid;
	for (i = 0; i < lengthof(tables); i++)
	{
		relid = get_relname_relid(tables[i], nspid);
		if (!OidIsValid(relid))
			continue;
		*mode = AccessShareLock;
		if (!ConditionalLockRelationOid(relid, *mode))
			return relid;
		/* the chunks and outbox.messages (a schema of 0.1) are written */
		*mode = RowExclusiveLock;
		if (i <= OUTBOX_NUM_CHUNKS && !ConditionalLockRelationOid(relid, *mode))
			return relid;
	}
	relid = outbox_mark_rel()->relid;
	*mode = RowExclusiveLock;
	if (OidIsValid(relid) && !ConditionalLockRelationOid(relid, *mode))
		return relid;
	return InvalidOid;
}

/*
 * Prepare to store messages: open outbox.messages and its indexes and make
 * sure the commit sequence is initialised.  Everything that could wait for a
 * lock happens here, before the caller reserves ids.
 */
OutboxWriter *
outbox_writer_begin(int64 count)
{
	OutboxWriter *writer = palloc0(sizeof(OutboxWriter));

	writer->rel = outbox_open_for_write();
	if (!outbox_counter_valid())
	{
		Relation	messages = outbox_open_messages(AccessShareLock);

		outbox_ensure_counter(messages);
		table_close(messages, AccessShareLock);
	}

	/*
	 * Check and lock the id mark now if the reservation will probably move
	 * it (once per OUTBOX_MARK_CHUNK ids); most commits need neither.
	 */
	if (outbox_mark_needed(count))
		outbox_writer_lock_mark(writer);

	writer->estate = CreateExecutorState();
	writer->estate->es_output_cid = GetCurrentCommandId(true);
	writer->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(writer->rri, writer->rel, 1, NULL, 0);
	ExecOpenIndices(writer->rri, false);

	writer->maxslots = (int) Min(Max(count, 1), OUTBOX_INSERT_BATCH);
	writer->slots = palloc0(sizeof(TupleTableSlot *) * writer->maxslots);
	return writer;
}

/*
 * Reserve count ids for the messages to store (publishing our in-flight
 * slot), moving the durable id mark first when they pass it.
 */
int64
outbox_writer_reserve(OutboxWriter *writer, int64 count)
{
	int64		first = outbox_reserve_ids(count, &writer->mark, writer->mark_locked);

	if (first == 0)
	{
		/* The mark must move after all: check and lock it, then again. */
		outbox_writer_lock_mark(writer);
		first = outbox_reserve_ids(count, &writer->mark, true);
	}
	return first;
}

/* Insert slots[0..n) and their index entries, then forget the batch. */
static void
outbox_writer_flush(OutboxWriter *writer, int n)
{
	int			i;

	if (n == 0)
		return;

	/* Most transactions emit one message: the plain insert is cheaper. */
	if (n == 1)
		table_tuple_insert(writer->rel, writer->slots[0],
						   writer->estate->es_output_cid, 0, NULL);
	else
		table_multi_insert(writer->rel, writer->slots, n,
						   writer->estate->es_output_cid, 0, NULL);

	for (i = 0; i < n; i++)
	{
		List	   *recheck;

		if (writer->rri->ri_NumIndices > 0)
		{
			recheck = outbox_insert_index_tuples(writer->rri,
												 writer->slots[i],
												 writer->estate);
			list_free(recheck);
		}
		ExecClearTuple(writer->slots[i]);
	}
	/* The batch's text datums, and what index insertion used. */
	ResetPerTupleExprContext(writer->estate);
}

/*
 * Store count messages produced by next(), giving them ids first_id,
 * first_id + 1, ... in the order next() returns them.
 */
void
outbox_writer_store(OutboxWriter *writer, int64 first_id, int64 count,
					OutboxNextMessage next, void *next_state)
{
	OutboxMessage msg;
	int64		id = first_id;
	int			n = 0;

	while (next(next_state, &msg))
	{
		TupleTableSlot *slot;
		MemoryContext oldcxt;

		if (id - first_id >= count)
			elog(ERROR, "outbox: more buffered messages than ids reserved");

		if (n == writer->nslots_made)
		{
			if (n == writer->maxslots)
			{
				writer->maxslots = OUTBOX_INSERT_BATCH;
				writer->slots = repalloc(writer->slots,
										 sizeof(TupleTableSlot *) * writer->maxslots);
			}
			writer->slots[writer->nslots_made++] =
				table_slot_create(writer->rel, NULL);
		}
		slot = writer->slots[n];	/* empty: flushed slots are cleared */

		/*
		 * Datums made here live until the batch is flushed; the slot is
		 * materialised below, so msg may change after that.
		 */
		oldcxt = MemoryContextSwitchTo(GetPerTupleMemoryContext(writer->estate));
		memset(slot->tts_isnull, 0, sizeof(bool) * Natts_outbox_messages);
		slot->tts_values[Anum_outbox_messages_id - 1] = Int64GetDatum(id);
		slot->tts_values[Anum_outbox_messages_msg_id - 1] = UUIDPGetDatum(&msg.msg_id);
		slot->tts_values[Anum_outbox_messages_topic - 1] =
			PointerGetDatum(cstring_to_text_with_len(msg.topic, msg.topic_len));
		if (msg.key)
			slot->tts_values[Anum_outbox_messages_key - 1] =
				PointerGetDatum(cstring_to_text_with_len(msg.key, msg.key_len));
		else
			slot->tts_isnull[Anum_outbox_messages_key - 1] = true;
		/* The payload stays in the buffer; the insert copies it. */
		slot->tts_values[Anum_outbox_messages_payload - 1] =
			PointerGetDatum(msg.payload);
		if (msg.headers)
			slot->tts_values[Anum_outbox_messages_headers - 1] =
				PointerGetDatum(msg.headers);
		else
			slot->tts_isnull[Anum_outbox_messages_headers - 1] = true;
		slot->tts_values[Anum_outbox_messages_emitted_at - 1] =
			TimestampTzGetDatum(msg.emitted_at);
		ExecStoreVirtualTuple(slot);

		/*
		 * A message read from the spill file lives in a buffer the next read
		 * overwrites, so materialise it into the slot now.
		 */
		ExecMaterializeSlot(slot);
		MemoryContextSwitchTo(oldcxt);

		id++;
		if (++n == OUTBOX_INSERT_BATCH)
		{
			outbox_writer_flush(writer, n);
			n = 0;
		}
	}
	outbox_writer_flush(writer, n);

	if (id - first_id != count)
		elog(ERROR, "outbox: stored " INT64_FORMAT " messages, reserved " INT64_FORMAT " ids",
			 id - first_id, count);
}

/* Close what outbox_writer_begin opened; locks are kept until commit. */
void
outbox_writer_end(OutboxWriter *writer)
{
	int			i;

	for (i = 0; i < writer->nslots_made; i++)
		ExecDropSingleTupleTableSlot(writer->slots[i]);
	ExecCloseIndices(writer->rri);
	FreeExecutorState(writer->estate);
	table_close(writer->rel, NoLock);
	pfree(writer->slots);
	pfree(writer);
}
