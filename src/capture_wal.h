/*-------------------------------------------------------------------------
 *
 * capture_wal.h
 *	  Declarations shared by the four files of change capture from the WAL:
 *
 *	  capture_slot.c	the database's replication slot: its name, the
 *						capture's shared state, what the launcher and SQL
 *						ask of it, confirming it (and its standby copies)
 *	  capture_plugin.c	the output plugin "outbox": the callbacks decoding
 *						runs, which may not write
 *	  capture_decode.c	what the callbacks collect: which tables are
 *						captured and how (read with the historic snapshot),
 *						and each change made a message
 *	  capture_worker.c	the capture worker: it drives decoding, hands the
 *						collected messages off with the offset, exactly once
 *
 * Nothing here is for the other files of outbox: capture.h holds what the
 * trigger capture shares with these.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_CAPTURE_WAL_H
#define OUTBOX_CAPTURE_WAL_H

#include "access/xlogdefs.h"
#include "replication/logical.h"
#include "replication/slot.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

#include "capture.h"

/*
 * The replication slot of this database's WAL capture: slot names are the
 * cluster's, so each database has its own, named by its oid (stable across
 * ALTER DATABASE RENAME).  outbox.capture_slot_name() gives it to SQL.
 */
#define CAPTURE_SLOT			capture_slot_name()
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

/*---- capture_slot.c ----*/
extern CaptureShared *capture_shared;	/* this database's, once capture_mine() */
extern bool capture_confirm_eager;	/* the standbys stream: confirm often */
extern const char *capture_slot_name(void);
extern bool capture_mine(bool report);
extern void capture_set_state(const char *state, const char *error);
extern const char *capture_invalidation_text(ReplicationSlot *slot);
extern void capture_confirm(XLogRecPtr offset, XLogRecPtr end);
extern void capture_confirm_ready(void);
extern void capture_check_copies(void);

/*---- capture_decode.c ----*/
extern CaptureDecoding *capture_dec;	/* the worker's decoding, or NULL */
extern int	capture_part_messages;
extern void capture_reset_rels(void);
extern void capture_wal_relcache_callback(Datum arg, Oid relid);
extern WalRel *capture_wal_rel(Relation relation);
extern void capture_wal_change(WalRel *r, TupleDesc desc, const char *op,
							   HeapTuple oldtup, HeapTuple newtup);
extern void capture_wal_outbox_row(WalRel *r, TupleDesc desc, HeapTuple tup);
extern bool capture_part_take(Size size);
extern void capture_note_error(const char *fmt,...) pg_attribute_printf(1, 2);

#endif							/* OUTBOX_CAPTURE_WAL_H */
