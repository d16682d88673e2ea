/*-------------------------------------------------------------------------
 *
 * capture.h
 *	  Declarations shared by the files of change capture: capture.c (the
 *	  trigger), the WAL miner (capture_wal.h: capture_slot.c,
 *	  capture_plugin.c, capture_decode.c, capture_worker.c) and
 *	  capture_json.c (rows as
 *	  JSON, the same for both).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CAPTURE_H
#define OUTBOX_CAPTURE_H

#include "access/htup.h"
#include "access/tupdesc.h"
#include "access/xlogdefs.h"
#include "catalog/pg_attribute.h"
#include "datatype/timestamp.h"
#include "fmgr.h"
#include "utils/jsonb.h"

#include "outbox.h"

/* How a column's values are written in JSON (capture_json.c). */
typedef struct CaptureColumn
{
	AttrNumber	attnum;			/* in the table's descriptor */
	char	   *name;
	Oid			typid;			/* the base type, for domains */
	int32		typmod;			/* of the base type: time precision */
	char		category;		/* see capture_json.c */
	bool		dbz_omit;		/* a type the Debezium connector leaves out */
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

/*
 * Debezium's change events (capture_json.c): what the source block of one
 * change says.
 */
typedef struct CaptureDebeziumSource
{
	const char *name;			/* the topic prefix */
	const char *schema;
	const char *table;
	TimestampTz ts;				/* source.ts_ms: commit (WAL) or change time */
	TimestampTz made;			/* ts_ms: when outbox made the event */
	const char *snapshot;		/* "false", "true" or "last" */
	TransactionId xid;			/* txId */
	uint64		full_xid;		/* txId of a snapshot row: with its epoch */
	XLogRecPtr	lsn;			/* the change's, or InvalidXLogRecPtr */
	XLogRecPtr	commit_lsn;		/* its transaction's commit, or invalid */
} CaptureDebeziumSource;

/* What an unchanged TOASTed column holds in a Debezium event (bytea: base64). */
#define CAPTURE_DEBEZIUM_UNAVAILABLE	"__debezium_unavailable_value"
#define CAPTURE_DEBEZIUM_UNAVAILABLE_B64	"X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
/* ... in a uuid[] (the connector's: a name-based uuid of the text) */
#define CAPTURE_DEBEZIUM_UNAVAILABLE_UUID	"b68a35a7-17ad-35b3-af2a-ae46edb4545a"

extern int *outbox_capture_json_order(const CaptureColumn *cols, int ncols);
extern Jsonb *outbox_capture_debezium(const CaptureDebeziumSource *src, const char *op,
									  HeapTuple before, HeapTuple after,
									  TupleDesc desc, const CaptureColumn *cols,
									  int ncols, const int *order,
									  const bool *unavailable);
extern bool outbox_capture_key_changed(HeapTuple oldtup, HeapTuple newtup,
									   TupleDesc desc, const CaptureColumn *keys,
									   int nkeys);
extern char *outbox_capture_debezium_key(HeapTuple tuple, TupleDesc desc,
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
	/* Debezium's outbox event router (format 'debezium-outbox') */
	bool		router;			/* topic "outbox.event.<topic column>" */
	AttrNumber	id_att;			/* its id column: header "id" */
	FmgrInfo	id_out;
} CaptureOutboxColumns;

/* The topic of a routed outbox table row: this, then the routing column. */
#define CAPTURE_ROUTER_TOPIC_PREFIX	"outbox.event."

extern void outbox_capture_outbox_row(HeapTuple row, TupleDesc desc,
									  const CaptureOutboxColumns *oc,
									  const char *source, OutboxMessage *msg);

#endif							/* OUTBOX_CAPTURE_H */
