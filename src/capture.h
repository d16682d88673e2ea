/*-------------------------------------------------------------------------
 *
 * capture.h
 *	  Declarations shared by the files of change capture: capture.c (the
 *	  trigger), capture_wal.c (the WAL miner) and capture_json.c (rows as
 *	  JSON, the same for both).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CAPTURE_H
#define OUTBOX_CAPTURE_H

#include "access/htup.h"
#include "access/tupdesc.h"
#include "catalog/pg_attribute.h"
#include "fmgr.h"
#include "utils/jsonb.h"

#include "outbox.h"

/* How a column's values are written in JSON (capture_json.c). */
typedef struct CaptureColumn
{
	AttrNumber	attnum;			/* in the table's descriptor */
	char	   *name;
	Oid			typid;			/* the base type, for domains */
	char		category;		/* see capture_json.c */
	FmgrInfo	out;			/* the type's output function */
} CaptureColumn;

/*
 * Columns a row's JSON has: not dropped, and not virtual generated columns
 * (PostgreSQL 18), whose values are computed on read and are in neither
 * the trigger's tuple nor the WAL.
 */
static inline bool
outbox_capture_column_usable(Form_pg_attribute att)
{
	if (att->attisdropped)
		return false;
#ifdef ATTRIBUTE_GENERATED_VIRTUAL
	if (att->attgenerated == ATTRIBUTE_GENERATED_VIRTUAL)
		return false;
#endif
	return true;
}

extern void outbox_capture_column_init(CaptureColumn *col, TupleDesc desc,
									   AttrNumber attnum, MemoryContext cxt);
extern void outbox_capture_push_row(JsonbParseState **st, HeapTuple tuple,
									TupleDesc desc, const CaptureColumn *cols,
									int ncols, const bool *skip);
extern void outbox_capture_push_string(JsonbParseState **st,
									   JsonbIteratorToken tok, const char *s);
extern char *outbox_capture_key(HeapTuple tuple, TupleDesc desc,
								const CaptureColumn *keys, int nkeys,
								int *len);

/* The columns of a captured outbox table (capture.c). */
typedef struct CaptureOutboxColumns
{
	AttrNumber	topic_att;
	AttrNumber	key_att;		/* 0 for none */
	AttrNumber	payload_att;
	AttrNumber	headers_att;	/* 0 for none */
	Oid			payload_type;	/* JSONBOID, JSONOID or TEXTOID */
	FmgrInfo	key_out;		/* the key column's output function */
} CaptureOutboxColumns;

extern void outbox_capture_outbox_row(HeapTuple row, TupleDesc desc,
									  const CaptureOutboxColumns *oc,
									  const char *source, OutboxMessage *msg);

#endif							/* OUTBOX_CAPTURE_H */
