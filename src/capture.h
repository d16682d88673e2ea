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

#endif							/* OUTBOX_CAPTURE_H */
