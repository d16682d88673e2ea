/*-------------------------------------------------------------------------
 *
 * emit.c
 *	  The per-transaction message buffer and the transaction callbacks.
 *
 * outbox_emit() appends a serialised record to a buffer that lives in the
 * top transaction's memory.  Nothing touches outbox.messages before commit,
 * so an aborted transaction leaves nothing behind (invariant I1).  When the
 * buffer passes OUTBOX_SPILL_THRESHOLD it is written to a temporary file and
 * emptied, so a transaction that emits millions of messages keeps backend
 * memory bounded.
 *
 * Savepoints: messages of a subtransaction always form a suffix of the
 * buffer, because subtransactions nest.  A stack of marks remembers where
 * each still-open subtransaction that emitted began; aborting it truncates
 * the buffer (and the spill file's logical length) back to its mark,
 * committing it hands the mark to its parent.
 *
 * At XACT_EVENT_PRE_COMMIT the buffered records are stored: storage.c opens
 * the table and its indexes, then ids are reserved from the shared commit
 * sequence (publishing our in-flight slot), then the rows are written in
 * batches.  At XACT_EVENT_COMMIT, after the transaction became visible, the
 * slot is cleared and the relay worker and waiting queue receivers are woken
 * (the latter through base.h's outbox_wake_receivers, so this file does not
 * depend on the queues); at XACT_EVENT_ABORT the slot is cleared and the ids
 * become a gap.  PREPARE TRANSACTION is refused
 * for a transaction that emitted, since COMMIT PREPARED would run in another
 * process without our callbacks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <unistd.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "storage/buffile.h"
#include "utils/memutils.h"
#include "utils/datetime.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "outbox.h"

/* Spill the in-memory buffer to a temporary file past this many bytes. */
#define OUTBOX_SPILL_THRESHOLD	(4 * 1024 * 1024)

/*
 * On-buffer layout of one message: this header, then the payload varlena,
 * the headers varlena, the topic bytes and the key bytes, each starting at a
 * MAXALIGN'd offset so the varlenas can be used in place.
 */
typedef struct OutboxRecordHeader
{
	uint32		total_len;		/* whole record, MAXALIGN'd */
	int32		topic_len;		/* bytes of topic */
	int32		key_len;		/* bytes of key, -1 for no key */
	int32		payload_len;	/* bytes of the payload varlena */
	int32		headers_len;	/* bytes of the headers varlena, -1 for none */
	int32		commit_time_off;	/* OUTBOX_COMMIT_TIME_LEN bytes of the
									 * headers varlena to fill with the
									 * commit time at PRE_COMMIT, or -1 */
	TimestampTz emitted_at;		/* when outbox_emit was called */
	pg_uuid_t	msg_id;			/* the message's stable id */
} OutboxRecordHeader;

#define RECORD_HEADER_SIZE	MAXALIGN(sizeof(OutboxRecordHeader))

/* Where an open subtransaction's messages begin. */
typedef struct OutboxMark
{
	SubTransactionId subid;		/* the subtransaction that owns the suffix */
	uint64		position;		/* logical byte offset where it begins */
	int64		count;			/* messages buffered before it */
} OutboxMark;

typedef struct OutboxXactBuffer
{
	MemoryContext cxt;			/* child of TopTransactionContext */
	char	   *mem;			/* records not yet spilled */
	size_t		mem_len;		/* bytes used in mem */
	size_t		mem_cap;		/* bytes allocated for mem */
	BufFile    *spill;			/* temporary file, or NULL */
	uint64		spill_len;		/* logical bytes in the spill file */
	int64		count;			/* messages buffered */
	OutboxMark *marks;			/* stack of open subtransactions' marks */
	int			nmarks;			/* entries used in marks */
	int			maxmarks;		/* entries allocated in marks */
	bool		stored;			/* PRE_COMMIT wrote the messages */
} OutboxXactBuffer;

/* The current transaction's buffer; NULL until it emits. */
static OutboxXactBuffer *xbuf = NULL;

/*
 * The transaction has passed PRE_COMMIT: its messages, if any, are stored,
 * and a message emitted now (by a later PRE_COMMIT callback) would be lost.
 */
static bool xact_precommitted = false;

/* The current transaction changed targets or subscriptions. */
static bool config_changed = false;

/* Read position while storing the buffer at PRE_COMMIT. */
typedef struct OutboxBufferReader
{
	uint64		file_pos;		/* next byte to read from the spill file */
	size_t		mem_pos;		/* next byte to read from mem */
	char	   *record;			/* holds one record read from the file */
	size_t		record_cap;		/* bytes allocated for record */
	char		commit_time[OUTBOX_COMMIT_TIME_LEN + 1];	/* as text, once a
																 * record needs it */
} OutboxBufferReader;

static void outbox_buffer_close_spill(void);
#ifdef OUTBOX_TEST_FAULTS
static void outbox_test_commit_delay(void);
#else
#define outbox_test_commit_delay()	((void) 0)
#endif
static void outbox_xact_callback(XactEvent event, void *arg);
static void outbox_subxact_callback(SubXactEvent event,
									SubTransactionId mySubid,
									SubTransactionId parentSubid,
									void *arg);

/*
 * Register the callbacks.  Called once from _PG_init, when the library is
 * preloaded.
 */
void
outbox_emit_init(void)
{
	RegisterXactCallback(outbox_xact_callback, NULL);
	RegisterSubXactCallback(outbox_subxact_callback, NULL);
}

static OutboxXactBuffer *
outbox_buffer_create(void)
{
	MemoryContext cxt;
	OutboxXactBuffer *buf;

	cxt = AllocSetContextCreate(TopTransactionContext,
								"outbox emit buffer",
								ALLOCSET_SMALL_SIZES);
	buf = MemoryContextAllocZero(cxt, sizeof(OutboxXactBuffer));
	buf->cxt = cxt;
	buf->mem_cap = 1024;
	buf->mem = MemoryContextAlloc(cxt, buf->mem_cap);
	return buf;
}

static uint64
outbox_buffer_position(void)
{
	return xbuf->spill_len + xbuf->mem_len;
}

/*
 * Write the in-memory records to the spill file at its logical end, which a
 * rolled-back savepoint may have moved back.
 */
static void
outbox_buffer_spill(void)
{
	if (xbuf->mem_len == 0)
		return;

	if (xbuf->spill == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(xbuf->cxt);
		ResourceOwner oldowner = CurrentResourceOwner;

		/*
		 * The file belongs to the top transaction, so it survives the end of
		 * the subtransaction that happened to create it.
		 */
		CurrentResourceOwner = TopTransactionResourceOwner;
		xbuf->spill = BufFileCreateTemp(false);
		CurrentResourceOwner = oldowner;
		MemoryContextSwitchTo(oldcxt);
	}

	if (BufFileSeek(xbuf->spill, 0, (off_t) xbuf->spill_len, SEEK_SET) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not seek in outbox spill file: %m")));
	BufFileWrite(xbuf->spill, xbuf->mem, xbuf->mem_len);
	xbuf->spill_len += xbuf->mem_len;
	xbuf->mem_len = 0;
}

/* Remember where the current subtransaction's messages begin. */
static void
outbox_buffer_push_mark(void)
{
	SubTransactionId cur = GetCurrentSubTransactionId();
	OutboxMark *mark;

	if (cur == TopSubTransactionId)
		return;
	if (xbuf->nmarks > 0 && xbuf->marks[xbuf->nmarks - 1].subid == cur)
		return;

	if (xbuf->nmarks == xbuf->maxmarks)
	{
		int			newmax = Max(8, xbuf->maxmarks * 2);

		if (xbuf->marks == NULL)
			xbuf->marks = MemoryContextAlloc(xbuf->cxt,
											 newmax * sizeof(OutboxMark));
		else
			xbuf->marks = repalloc(xbuf->marks, newmax * sizeof(OutboxMark));
		xbuf->maxmarks = newmax;
	}
	mark = &xbuf->marks[xbuf->nmarks++];
	mark->subid = cur;
	mark->position = outbox_buffer_position();
	mark->count = xbuf->count;
}

/* Copy len bytes to dst and zero dst up to MAXALIGN(len). */
static inline void
outbox_copy_padded(char *dst, const void *src, size_t len)
{
	memcpy(dst, src, len);
	memset(dst + len, 0, MAXALIGN(len) - len);
}

/*
 * Append one message to the current transaction's buffer.  The caller has
 * validated it.
 */
void
outbox_buffer_append(const OutboxMessage *msg)
{
	OutboxRecordHeader hdr;
	size_t		payload_off;
	size_t		headers_off;
	size_t		topic_off;
	size_t		key_off;
	size_t		total;
	char	   *rec;

	if (xact_precommitted)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot call outbox_emit() while the transaction is committing"),
				 errdetail("The transaction's messages have already been stored.")));
	if (xbuf == NULL)
		xbuf = outbox_buffer_create();

	outbox_buffer_push_mark();

	memset(&hdr, 0, sizeof(hdr));	/* no stale padding bytes */
	hdr.topic_len = msg->topic_len;
	hdr.key_len = msg->key ? msg->key_len : -1;
	hdr.payload_len = VARSIZE(msg->payload);
	hdr.headers_len = msg->headers ? (int32) VARSIZE(msg->headers) : -1;
	hdr.commit_time_off = -1;
	if (msg->headers && msg->commit_time_off >= 0)
	{
		if (msg->commit_time_off < VARHDRSZ ||
			msg->commit_time_off + OUTBOX_COMMIT_TIME_LEN > hdr.headers_len)
			elog(ERROR, "outbox: commit time slot out of the headers' bounds");
		hdr.commit_time_off = msg->commit_time_off;
	}
	hdr.emitted_at = msg->emitted_at;
	hdr.msg_id = msg->msg_id;

	payload_off = RECORD_HEADER_SIZE;
	headers_off = payload_off + MAXALIGN(hdr.payload_len);
	topic_off = headers_off + (msg->headers ? MAXALIGN(hdr.headers_len) : 0);
	key_off = topic_off + MAXALIGN(hdr.topic_len);
	total = key_off + (msg->key ? MAXALIGN(hdr.key_len) : 0);
	if (total > PG_UINT32_MAX)
		elog(ERROR, "outbox: message record of %zu bytes is too large", total);
	hdr.total_len = (uint32) total;

	if (xbuf->mem_len + total > xbuf->mem_cap)
	{
		size_t		newcap = xbuf->mem_cap;

		while (xbuf->mem_len + total > newcap)
			newcap *= 2;
		xbuf->mem = repalloc_huge(xbuf->mem, newcap);
		xbuf->mem_cap = newcap;
	}

	/*
	 * Copy each part; zero only the padding, so that a spilled record holds
	 * no stale bytes.
	 */
	rec = xbuf->mem + xbuf->mem_len;
	memcpy(rec, &hdr, sizeof(hdr));
	memset(rec + sizeof(hdr), 0, RECORD_HEADER_SIZE - sizeof(hdr));
	outbox_copy_padded(rec + payload_off, msg->payload, hdr.payload_len);
	if (msg->headers)
		outbox_copy_padded(rec + headers_off, msg->headers, hdr.headers_len);
	outbox_copy_padded(rec + topic_off, msg->topic, hdr.topic_len);
	if (msg->key)
		outbox_copy_padded(rec + key_off, msg->key, hdr.key_len);
	xbuf->mem_len += total;
	xbuf->count++;

	if (xbuf->mem_len >= OUTBOX_SPILL_THRESHOLD)
	{
		outbox_buffer_spill();

		/* Give back memory a very large record made us take. */
		if (xbuf->mem_cap > 2 * OUTBOX_SPILL_THRESHOLD)
		{
			pfree(xbuf->mem);
			xbuf->mem_cap = OUTBOX_SPILL_THRESHOLD;
			xbuf->mem = MemoryContextAlloc(xbuf->cxt, xbuf->mem_cap);
		}
	}
}

/* Drop every message buffered after position (a rolled-back savepoint). */
static void
outbox_buffer_truncate(uint64 position, int64 count)
{
	if (position >= xbuf->spill_len)
		xbuf->mem_len = position - xbuf->spill_len;
	else
	{
		xbuf->mem_len = 0;
		xbuf->spill_len = position;
	}
	xbuf->count = count;
}

/*
 * Decode the record at rec into msg; write the commit time into the
 * headers' commit time slot, if it has one (the record is the reader's to
 * change).  The time is taken and formatted when the first record needs it:
 * the messages of outbox_emit() have no slot and pay nothing.
 */
static void
outbox_decode_record(char *rec, OutboxMessage *msg, char *commit_time)
{
	OutboxRecordHeader hdr;
	size_t		off = RECORD_HEADER_SIZE;

	memcpy(&hdr, rec, sizeof(hdr));
	msg->commit_time_off = -1;
	msg->msg_id = hdr.msg_id;
	msg->emitted_at = hdr.emitted_at;
	msg->payload = (struct varlena *) (rec + off);
	off += MAXALIGN(hdr.payload_len);
	if (hdr.headers_len >= 0)
	{
		msg->headers = (struct varlena *) (rec + off);
		if (hdr.commit_time_off >= 0)
		{
			if (commit_time[0] == '\0')
				outbox_format_commit_time(GetCurrentTimestamp(), commit_time);
			memcpy((char *) msg->headers + hdr.commit_time_off, commit_time,
				   OUTBOX_COMMIT_TIME_LEN);
		}
		off += MAXALIGN(hdr.headers_len);
	}
	else
		msg->headers = NULL;
	msg->topic = rec + off;
	msg->topic_len = hdr.topic_len;
	off += MAXALIGN(hdr.topic_len);
	if (hdr.key_len >= 0)
	{
		msg->key = rec + off;
		msg->key_len = hdr.key_len;
	}
	else
	{
		msg->key = NULL;
		msg->key_len = 0;
	}
}

static void
outbox_read_exact(void *ptr, size_t len)
{
	if (BufFileRead(xbuf->spill, ptr, len) != len)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read outbox spill file: %m")));
}

/*
 * OutboxNextMessage over the buffer: first the spill file, then memory, in
 * emit order.
 */
static bool
outbox_buffer_next(void *state, OutboxMessage *msg)
{
	OutboxBufferReader *reader = (OutboxBufferReader *) state;

	if (reader->file_pos < xbuf->spill_len)
	{
		OutboxRecordHeader hdr;

		if (reader->file_pos == 0 &&
			BufFileSeek(xbuf->spill, 0, 0, SEEK_SET) != 0)
			ereport(ERROR,
					(errcode_for_file_access(),
					 errmsg("could not seek in outbox spill file: %m")));
		outbox_read_exact(&hdr, RECORD_HEADER_SIZE);
		if (hdr.total_len > reader->record_cap)
		{
			if (reader->record)
				pfree(reader->record);
			reader->record_cap = Max(hdr.total_len, 65536);
			reader->record = MemoryContextAllocHuge(xbuf->cxt,
													reader->record_cap);
		}
		memcpy(reader->record, &hdr, sizeof(hdr));
		outbox_read_exact(reader->record + RECORD_HEADER_SIZE,
						  hdr.total_len - RECORD_HEADER_SIZE);
		reader->file_pos += hdr.total_len;
		outbox_decode_record(reader->record, msg, reader->commit_time);
		return true;
	}

	if (reader->mem_pos < xbuf->mem_len)
	{
		char	   *rec = xbuf->mem + reader->mem_pos;
		OutboxRecordHeader hdr;

		memcpy(&hdr, rec, sizeof(hdr));
		reader->mem_pos += hdr.total_len;
		outbox_decode_record(rec, msg, reader->commit_time);
		return true;
	}

	return false;
}

/*
 * t as OUTBOX_COMMIT_TIME_LEN characters of ISO 8601 in UTC with
 * microseconds, "2026-12-01T22:58:31.123456Z", NUL-terminated in out.
 */
void
outbox_format_commit_time(TimestampTz t, char *out)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
		elog(ERROR, "outbox: commit time out of range");
	snprintf(out, OUTBOX_COMMIT_TIME_LEN + 1,
			 "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
			 tm.tm_year, tm.tm_mon, tm.tm_mday,
			 tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

/*
 * PRE_COMMIT: store the buffered messages under ids reserved now, in emit
 * order.  Opening the table and its indexes (the only step that may wait on
 * a lock) happens before the reservation publishes our slot.
 */
static void
outbox_store_buffer(void)
{
	OutboxWriter *writer;
	OutboxBufferReader reader;
	int64		first_id;

	writer = outbox_writer_begin(xbuf->count);
	first_id = outbox_writer_reserve(writer, xbuf->count);

	memset(&reader, 0, sizeof(reader));
	outbox_writer_store(writer, first_id, xbuf->count,
						outbox_buffer_next, &reader);
	outbox_writer_end(writer);
	xbuf->stored = true;
}

/*
 * Close the spill file before the transaction ends: a temporary file still
 * open at commit draws a leak warning.  Savepoints may have emptied the
 * buffer, so this runs whether or not anything was stored.
 */
static void
outbox_buffer_close_spill(void)
{
	if (xbuf != NULL && xbuf->spill != NULL)
	{
		BufFileClose(xbuf->spill);
		xbuf->spill = NULL;
	}
}

static void
outbox_xact_callback(XactEvent event, void *arg)
{
	bool		released;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (xbuf != NULL && xbuf->count > 0 && !xbuf->stored)
				outbox_store_buffer();
			outbox_buffer_close_spill();
			xact_precommitted = true;

			/*
			 * Tell the relay about a target change before the change becomes
			 * visible, and again (waking it) once it is.  A relay that
			 * computes a frontier covering a message committed after this
			 * change is then sure to see a new generation, and reloads with
			 * a snapshot that sees the change, before it reads the message.
			 */
			if (config_changed)
				outbox_bump_config_generation(false);
			break;

		case XACT_EVENT_PRE_PREPARE:
			if (config_changed)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that changed outbox targets or subscriptions"),
						 errdetail("COMMIT PREPARED runs in another session, which could not tell the relay to reload them."),
						 errhint("Change outbox targets in transactions that commit directly.")));
			if (xbuf != NULL && xbuf->count > 0)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that emitted outbox messages"),
						 errdetail("The transaction emitted " INT64_FORMAT " message(s); COMMIT PREPARED could not order or deliver them.",
								   xbuf->count),
						 errhint("Emit outbox messages from transactions that commit directly, or commit the prepared work first and emit afterwards.")));
			outbox_buffer_close_spill();
			break;

		case XACT_EVENT_COMMIT:
			{
				bool		emitted = (xbuf != NULL && xbuf->stored);

				/* The memory went away with TopTransactionContext. */
				xbuf = NULL;
				xact_precommitted = false;
				outbox_release_slot(XactLastCommitEnd);
				if (emitted)
				{
					outbox_wake_worker(true);
					outbox_wake_receivers();
				}
				if (config_changed)
				{
					config_changed = false;
					outbox_test_commit_delay();
					outbox_bump_config_generation(true);
				}
			}
			break;

		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			/* The resource owner closes the spill file, if any. */
			xbuf = NULL;
			xact_precommitted = false;
			config_changed = false;

			/*
			 * Ids reserved by a transaction that failed while committing
			 * become a gap; the frontier may now move past it.
			 */
			released = outbox_release_slot(InvalidXLogRecPtr);
			/* After the in-flight slot: never given back with ids in flight. */
			outbox_db_abort_taken();
			if (released)
			{
				outbox_wake_worker(true);
				outbox_wake_receivers();
			}
			break;

		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
			/* outbox_emit() refuses to run in parallel mode. */
			break;
	}
}

static void
outbox_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	OutboxMark *top;

	if (xbuf == NULL || xbuf->nmarks == 0)
		return;
	top = &xbuf->marks[xbuf->nmarks - 1];
	if (top->subid != mySubid)
		return;					/* this subtransaction emitted nothing */

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			outbox_buffer_truncate(top->position, top->count);
			xbuf->nmarks--;
			break;

		case SUBXACT_EVENT_COMMIT_SUB:

			/*
			 * The messages now belong to the parent.  Its own mark, if any,
			 * lies just below and already covers them.
			 */
			if (parentSubid == TopSubTransactionId ||
				(xbuf->nmarks > 1 &&
				 xbuf->marks[xbuf->nmarks - 2].subid == parentSubid))
				xbuf->nmarks--;
			else
				top->subid = parentSubid;
			break;

		case SUBXACT_EVENT_START_SUB:
		case SUBXACT_EVENT_PRE_COMMIT_SUB:
			break;
	}
}

#ifdef OUTBOX_TEST_FAULTS
/*
 * Test only (outbox.test_fault = 'commit_delay'): wait in the COMMIT
 * callback of a target change, after it became visible and before the
 * relay is told, to show that the relay does not depend on that moment;
 * until the test creates the file outbox_test_commit_release in the data
 * directory (the backend's working directory), a minute at most.
 */
static void
outbox_test_commit_delay(void)
{
	int			i;

	if (!outbox_fault("commit_delay"))
		return;
	for (i = 0; i < 600 && access("outbox_test_commit_release", F_OK) != 0; i++)
		pg_usleep(100000L);
}
#endif

/*
 * Remember that this transaction changed the target configuration, so the
 * relay worker reloads it once the transaction has committed.
 */
void
outbox_note_config_change(void)
{
	config_changed = true;
}
