/*-------------------------------------------------------------------------
 *
 * relay_read.c
 *	  Reading up to the frontier: messages above each target's read position
 *	  are read, in id order, and queued in the lanes of their keys.
 *
 * The read runs in a short transaction whose snapshot is taken after the
 * frontier was computed, so nothing at or below the frontier can appear
 * later (I3).  Rows come from a cursor a few at a time; what a target
 * queues is capped in bytes as well as in messages (outbox.relay_memory),
 * so the relay's memory does not grow with payload sizes.  Each target is
 * read in a subtransaction: an error while building one of its messages
 * rolls back only that target's read, which is retried with backoff, and a
 * message that keeps failing becomes a dead letter with the error.  A
 * payload that cannot be encoded as JSON text is a dead letter at once.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "common/base64.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "access/detoast.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "relay.h"

/* Most messages read for one target in one turn. */
#define RELAY_READ_CHUNK			5000
/*
 * Rows fetched from the read cursor at once: as many as the target's
 * remaining byte budget holds at RELAY_ROW_BYTES each (a row stays below
 * ~2 kB in the cursor's result, larger values staying TOAST pointers until
 * a message is built), at least RELAY_MIN_FETCH_ROWS.
 */
#define RELAY_ROW_BYTES				2048
#define RELAY_MIN_FETCH_ROWS		64
/* A payload text buffer larger than this is given back after use. */
#define RELAY_TEXT_BUF_KEEP			(1024 * 1024)
/* Failed attempts at building one message before it is dead-lettered. */
#define RELAY_POISON_TRIES			3

static StringInfoData text_buf;	/* a payload's text, while a row is read */
static SPIPlanPtr read_plan = NULL;

/* The message being built while reading, for the error path; 0 for none. */
static int64 building_id = 0;

static bool relay_condemned(RelayTarget *t, int64 id);

/*
 * A row of the read query (id, msg_id, topic, key, payload, headers,
 * emitted_at; the dead letter read has the same columns), deformed once:
 * reading the columns one by one walks the tuple again for each column
 * after the first variable-length one.
 */
#define RELAY_ROW_COLS 7
typedef struct RelayRow
{
	Datum		v[RELAY_ROW_COLS];
	bool		n[RELAY_ROW_COLS];
} RelayRow;

#define ROW_ID		0
#define ROW_MSG_ID	1
#define ROW_TOPIC	2
#define ROW_KEY		3
#define ROW_PAYLOAD	4
#define ROW_HEADERS	5
#define ROW_EMITTED	6

static void
relay_row_deform(HeapTuple tup, TupleDesc desc, RelayRow *row)
{
	if (desc->natts != RELAY_ROW_COLS)
		elog(ERROR, "outbox: the read query returned %d columns, not %d",
			 desc->natts, RELAY_ROW_COLS);
	heap_deform_tuple(tup, desc, row->v, row->n);
}

/* A row of the read cursor, for a filter's document. */
typedef struct RelayDocArg
{
	RelayRow   *row;
	const char *topic;
} RelayDocArg;

static Jsonb *
relay_filter_doc(void *arg)
{
	RelayDocArg *a = (RelayDocArg *) arg;
	RelayRow   *row = a->row;
	char	   *key = row->n[ROW_KEY] ? NULL : TextDatumGetCString(row->v[ROW_KEY]);
	Jsonb	   *headers = row->n[ROW_HEADERS] ? NULL : DatumGetJsonbP(row->v[ROW_HEADERS]);

	return outbox_filter_doc(a->topic, key, headers, DatumGetJsonbP(row->v[ROW_PAYLOAD]));
}

/*
 * Whether the filters of target t's subscriptions select the message of
 * this row (outbox_subscriptions_route said only filtered ones take its
 * topic).
 */
static bool
relay_filters_select(RelayTarget *t, RelayRow *row, const char *topic, int64 id)
{
	RelayDocArg a;
	bool		filtered;
	bool		taken;

	/* a message that failed too often goes dead (relay_condemned) */
	if (relay_condemned(t, id))
		return true;
	a.row = row;
	a.topic = topic;
	/* an error thrown on from here makes the message poison */
	building_id = id;
	taken = outbox_subscriptions_select(t->subs, t->nsubs, topic, id,
										relay_filter_doc, &a, &filtered);
	building_id = 0;
	return taken;
}

static void relay_read_retries(RelayTarget *t, MemoryContext rowcxt);

int
relay_lane_of(RelayTarget *t, const char *key, int64 id)
{
	if (t->nlanes == 1)
		return 0;
	if (key == NULL)
		return (int) (id % t->nlanes);
	return (int) (hash_bytes((const unsigned char *) key, strlen(key)) % (uint32) t->nlanes);
}

/*
 * A message that cannot be sent at all (it cannot be encoded): a dead letter
 * at once, with the reason; its lane goes on without it.
 */
static void
relay_dead_letter_unsent(RelayLane *lane, RelayRow *row,
						 int64 id, const char *topic, const char *key,
						 const char *error)
{
	char		msg_id[RELAY_UUID_LEN + 1];

	relay_uuid_text(DatumGetUUIDP(row->v[ROW_MSG_ID]), msg_id);
	relay_add_dead_letter(lane->target, id, msg_id, topic, key, 0, 0, error);
	lane->dead_delta++;
	lane->target->stats.dead_letters++;
	relay_lane_set_error(lane, 0, error);
	ereport(LOG,
			(errmsg("outbox relay dead-lettered message " INT64_FORMAT " for target \"%s\": %s",
					id, lane->target->name, error)));
}

/*
 * The text of a jsonb payload, into text_buf.  Only this conversion can
 * fail on data (JSON text past 1 GB, as a jsonb string of control
 * characters gives: each one becomes "\u00XX"); it is pure computation in
 * our own memory, so its error is caught here and the message becomes a
 * dead letter instead of stopping the relay.  Returns false, with *error
 * set, when it failed.
 */
static bool
relay_payload_text(Jsonb *jb, char **error)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool failed = false;

	PG_TRY();
	{
		relay_jsonb_text(&text_buf, jb);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		/* Only "too large for a string" is the message's own fault. */
		if (edata->sqlerrcode != ERRCODE_PROGRAM_LIMIT_EXCEEDED)
			ReThrowError(edata);
		*error = psprintf("payload cannot be encoded as JSON text: %s", edata->message);
		FreeErrorData(edata);
		failed = true;
	}
	PG_END_TRY();
	if (failed)
	{
		/* The buffer may be half grown: start a new one next time. */
		text_buf.maxlen = RELAY_TEXT_BUF_KEEP + 1;
		return false;
	}
	return true;
}

/*
 * Copy one row of the read query into a message of target t.  Returns NULL,
 * with *error set (in the current memory context), when the message cannot
 * be encoded.
 */
static RelayMessage *
relay_make_message(RelayTarget *t, RelayRow *row, int64 id,
				   const char *topic, const char *key, char **error)
{
	char	   *payload;
	int			payload_len;
	char	   *headers = NULL;
	int			headers_len = 0;
	char	   *lines = NULL;
	int			lines_len = 0;
	Jsonb	   *jb;
	Size		size;
	RelayMessage *m;
	char	   *p;

	/*
	 * outbox_emit() refuses keys and topics with control characters or
	 * line separators; one stored by an earlier version is not sent raw in
	 * an HTTP (or NATS) header: the message becomes a dead letter.
	 */
	if (t->transport->header_lines)
	{
		pg_wchar	bad;

		if (key != NULL && outbox_bad_char(key, strlen(key), OUTBOX_TEXT_KEY, &bad) > 0)
		{
			*error = psprintf("the message key holds U+%04X, which HTTP headers cannot carry",
							  (unsigned int) bad);
			return NULL;
		}
		if (outbox_bad_char(topic, strlen(topic), OUTBOX_TEXT_KEY, &bad) > 0)
		{
			*error = psprintf("the message topic holds U+%04X, which HTTP headers cannot carry",
							  (unsigned int) bad);
			return NULL;
		}
	}

	/*
	 * The payload's text, in a buffer reused from row to row; one that grew
	 * for a large payload is given back first.
	 */
	if (text_buf.data != NULL && text_buf.maxlen > RELAY_TEXT_BUF_KEEP)
	{
		pfree(text_buf.data);
		text_buf.data = NULL;
	}
	if (text_buf.data == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);

		initStringInfo(&text_buf);
		MemoryContextSwitchTo(oldcxt);
	}
	resetStringInfo(&text_buf);
	jb = DatumGetJsonbP(row->v[ROW_PAYLOAD]);	/* detoasted here, outside the guard */

	if (!relay_payload_text(jb, error))
		return NULL;
	payload = text_buf.data;
	payload_len = text_buf.len;

	/*
	 * Headers: as "Name: value" lines for a single-message HTTP request, as
	 * JSON text for envelopes (batches and NOTIFY).
	 */
	if (!row->n[ROW_HEADERS])
	{
		jb = DatumGetJsonbP(row->v[ROW_HEADERS]);
		if (t->kind == RELAY_NOTIFY || t->kind == RELAY_REDIS || t->kind == RELAY_SQS ||
			t->kind == RELAY_KINESIS || t->kind == RELAY_SNS ||
			(t->kind == RELAY_HTTP && t->batch_size > 1))
		{
			StringInfoData hb;

			initStringInfo(&hb);
			relay_jsonb_text(&hb, jb);
			headers = hb.data;
			headers_len = hb.len;
		}
		/* (a CloudEvent's traceparent comes from them, for Redis too) */
		if ((t->transport->header_lines || t->format != RELAY_FORMAT_OUTBOX) &&
			JsonContainerSize(&jb->root) > 0)
			lines = relay_header_lines(jb, &lines_len);
	}

	size = MAXALIGN(sizeof(RelayMessage)) + strlen(topic) + 1 +
		(key ? strlen(key) + 1 : 0) + payload_len + 1 +
		(headers ? headers_len + 1 : 0) + lines_len;
	m = MemoryContextAllocHuge(t->cxt, size);
	p = (char *) m + MAXALIGN(sizeof(RelayMessage));
	m->next = NULL;
	m->retry = false;
	m->foreign_reply = false;
	m->id = id;
	m->key_hash = (key != NULL && t->transport->per_message) ?
		hash_bytes((const unsigned char *) key, strlen(key)) : 0;
	m->mem_size = size;

	relay_uuid_text(DatumGetUUIDP(row->v[ROW_MSG_ID]), m->msg_id);

	/* Formatted only when an envelope needs it. */
	m->emitted_at = DatumGetTimestampTz(row->v[ROW_EMITTED]);

	m->topic = p;
	strcpy(p, topic);
	p += strlen(topic) + 1;
	if (key)
	{
		m->key = p;
		strcpy(p, key);
		p += strlen(key) + 1;
	}
	else
		m->key = NULL;
	m->payload = p;
	memcpy(p, payload, payload_len + 1);
	m->payload_len = payload_len;
	p += payload_len + 1;
	if (headers)
	{
		m->headers = p;
		memcpy(p, headers, headers_len + 1);
		p += headers_len + 1;
	}
	else
		m->headers = NULL;
	if (lines)
	{
		m->header_lines = p;
		memcpy(p, lines, lines_len);
	}
	else
		m->header_lines = NULL;
	return m;
}

/*
 * Read messages of target t with ids in (after, upto], at most limit rows,
 * and queue those it subscribes to.  With only_lane >= 0, queue only that
 * lane's messages (a refill after an overflow) and stop when it is full.
 * Rows come from a cursor a few at a time, and each queue is capped in
 * messages and in bytes (outbox.relay_memory), so what is held stays
 * bounded whatever the payloads' sizes; a message larger than a whole
 * queue's cap is taken when its lane and target are empty, and goes alone.
 * The messages of a batch recorded before a restart (lane->batch_end) are
 * taken whatever the caps, so that the batch can be cut the same way (it
 * is at most RELAY_MAX_BATCH_BYTES).
 * Returns the rows examined; *last is set to the last id examined, and
 * *full to whether reading stopped because the target's queue is full.
 */
static uint64
relay_read_range(RelayTarget *t, int64 after, int64 upto, int limit,
				 int only_lane, MemoryContext rowcxt, int64 *last, bool *full)
{
	Datum		args[3];
	uint64		n = 0;
	int			lane_cap = relay_lane_cap(t);
	Size		lane_bytes = relay_lane_bytes(t);
	Size		queue_bytes = relay_queue_bytes(t);
	Portal		portal;
	bool		stop = false;

	args[0] = Int64GetDatum(after);
	args[1] = Int64GetDatum(upto);
	args[2] = Int32GetDatum(limit);
	portal = SPI_cursor_open(NULL, read_plan, args, NULL, true);
	*last = after;
	*full = false;

	while (!stop && n < (uint64) limit)
	{
		uint64		i;

		Size		room = queue_bytes > t->queued_bytes ? queue_bytes - t->queued_bytes : 0;
		long		rows = Max(RELAY_MIN_FETCH_ROWS, (long) (room / RELAY_ROW_BYTES));

		SPI_cursor_fetch(portal, true, Min(rows, (long) limit - (long) n));
		if (SPI_processed == 0)
			break;
		for (i = 0; i < SPI_processed && !stop; i++)
		{
			RelayRow	row;
			int64		id;
			MemoryContext oldcxt;
			char	   *topic;
			int			route;

			relay_row_deform(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, &row);
			id = DatumGetInt64(row.v[ROW_ID]);
			oldcxt = MemoryContextSwitchTo(rowcxt);
			topic = TextDatumGetCString(row.v[ROW_TOPIC]);
			route = outbox_subscriptions_route(t->subs, t->nsubs, topic, id);
			if (route != 0)
			{
				char	   *key = row.n[ROW_KEY] ? NULL : TextDatumGetCString(row.v[ROW_KEY]);
				int			l = relay_lane_of(t, key, id);
				RelayLane  *lane = &t->lanes[l];
				Size		est = toast_raw_datum_size(row.v[ROW_PAYLOAD]);

				if (only_lane >= 0 && l != only_lane)
					 /* another lane's message */ ;
				else if (id <= lane->done_id)
					 /* finished before a restart */ ;
				else if (only_lane < 0 && lane->overflow_id != 0)
					 /* the lane is behind; its refill will read this */ ;
				else if (route == 2 && !relay_filters_select(t, &row, topic, id))
				{
					/* counted once the read holds (relay_read_target_guarded) */
					if (only_lane < 0)
						t->filtered_pending++;
				}
				else if (!(t->batch_size > 1 && id <= lane->batch_end) &&
						 t->nqueued > 0 && t->queued_bytes + est > queue_bytes)
				{
					/*
					 * The target holds its share: read on from here once it
					 * has room for this message (or is empty).
					 */
					if (only_lane >= 0)
						lane->overflow_id = id;
					*full = true;
					t->read_need = est;
					stop = true;
				}
				else if (!(t->batch_size > 1 && id <= lane->batch_end) &&
						 (lane->nqueued >= lane_cap ||
						  (lane->nqueued > 0 && lane->queued_bytes + est > lane_bytes)))
				{
					/*
					 * The lane is full: leave the rest for its refill, once
					 * it has room for this message.
					 */
					lane->overflow_id = id;
					lane->refill_need = est;
					stop = (only_lane >= 0);
				}
				else if (relay_condemned(t, id))
				{
					char	   *error = psprintf("message could not be prepared: %s",
												 t->poison_error);

					relay_dead_letter_unsent(lane, &row, id, topic, key, error);
				}
				else
				{
					char	   *error = NULL;
					RelayMessage *m;

					building_id = id;
					relay_test_fault("read", topic);
					m = relay_make_message(t, &row, id, topic, key, &error);
					building_id = 0;
					if (m != NULL)
						relay_lane_push(lane, m);
					else
						relay_dead_letter_unsent(lane, &row, id, topic,
												 key, error);
				}
			}
			MemoryContextSwitchTo(oldcxt);
			MemoryContextReset(rowcxt);
			if (stop)
				break;
			*last = id;
			n++;
		}
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	return n;
}

/* Whether message id of t failed to be built too often. */
static bool
relay_condemned(RelayTarget *t, int64 id)
{
	ListCell   *lc;

	foreach(lc, t->condemned)
		if (*(int64 *) lfirst(lc) == id)
			return true;
	return false;
}

/* Forget condemned messages the target has read past for good. */
static void
relay_forget_condemned(RelayTarget *t)
{
	ListCell   *lc;

	foreach(lc, t->condemned)
	{
		int64	   *id = (int64 *) lfirst(lc);

		if (*id <= t->read_id)
		{
			t->condemned = foreach_delete_current(t->condemned, lc);
			pfree(id);
		}
	}
}

/*
 * How long a target more than three quarters full puts off reading on: a
 * backlog is then read in parts of a quarter of its read-ahead, or of what
 * was delivered in that time, instead of a few messages each time requests
 * end (each read is a transaction, a snapshot and a cursor: 3 us a message
 * at batch_size 1), and no lane waits longer than that for a read it needs
 * behind lanes that are slow or failing.
 */
#define RELAY_READ_PUT_OFF_MS	20

/*
 * Whether reading on is worth a read for target t, which has room: a
 * quarter of its read-ahead is free, in messages and in bytes, or a lane
 * cannot go on without one (its batch recorded before a restart is only
 * partly queued), or the last read was RELAY_READ_PUT_OFF_MS ago.
 */
static bool
relay_target_read_worthwhile(RelayTarget *t, TimestampTz now)
{
	int			cap = relay_queue_cap(t);
	Size		bytes = relay_queue_bytes(t);
	int			i;

	if (t->nqueued <= cap - cap / 4 && t->queued_bytes <= bytes - bytes / 4)
		return true;
	if (now == 0)
		now = GetCurrentTimestamp();
	if (now - t->last_read_at >= RELAY_READ_PUT_OFF_MS * 1000)
		return true;
	for (i = 0; i < t->nlanes; i++)
		if (relay_lane_waits_for_read(&t->lanes[i]))
			return true;
	return false;
}

/* Whether t has messages to read and room for them. */
static bool
relay_target_may_read_on(RelayTarget *t, int64 frontier)
{
	return t->read_id < frontier && t->nqueued < relay_queue_cap(t) &&
		relay_target_has_room(t);
}

/*
 * Milliseconds until target t reads on, when it has messages to read and
 * room but puts the read off (relay_target_read_worthwhile); -1 when it
 * does not.
 */
long
relay_target_read_put_off_ms(RelayTarget *t, int64 frontier, TimestampTz now)
{
	TimestampTz due;

	if (relay_target_stopped(t) || !relay_target_may_read_on(t, frontier) ||
		relay_target_read_worthwhile(t, now))
		return -1;
	due = t->last_read_at + RELAY_READ_PUT_OFF_MS * 1000;
	return due > now ? (long) ((due - now + 999) / 1000) : 0;
}

/* Whether target t has messages to read. */
bool
relay_target_wants_read(RelayTarget *t, int64 frontier)
{
	int			i;

	/* After a failed read, nothing until the backoff has passed. */
	if (t->read_retry_at != 0 && GetCurrentTimestamp() < t->read_retry_at)
		return false;
	if (relay_target_stopped(t))
		frontier = Min(frontier, t->read_id);
	else if (t->retry_wanted && t->nretry == 0 && !relay_dead_letter_writes_pending())
		return true;
	if (relay_target_may_read_on(t, frontier) && relay_target_read_worthwhile(t, 0))
		return true;
	for (i = 0; i < t->nlanes; i++)
		if (relay_lane_needs_refill(&t->lanes[i]))
			return true;
	return false;
}

/*
 * One target's part of a read: refill lanes that overflowed and drained,
 * then read on from its read position up to the frontier.
 */
static void
relay_read_target(RelayTarget *t, int64 frontier, MemoryContext rowcxt)
{
	int			limit;
	int			i;
	int64		last;
	bool		full;

	/* Lanes that overflowed and drained read their own messages again. */
	for (i = 0; i < t->nlanes; i++)
	{
		RelayLane  *lane = &t->lanes[i];
		int64		from;
		uint64		n;

		if (!relay_lane_needs_refill(lane))
			continue;
		from = lane->overflow_id;
		lane->overflow_id = 0;
		t->read_need = 0;
		n = relay_read_range(t, from - 1, t->read_id, RELAY_READ_CHUNK, i,
							 rowcxt, &last, &full);
		if (lane->overflow_id == 0 && n == RELAY_READ_CHUNK && last < t->read_id)
			lane->overflow_id = last + 1;	/* more to read next time */
	}

	if (relay_target_stopped(t))
		return;					/* nothing new: see relay_target_stopped() */
	if (t->retry_wanted && t->nretry == 0 && !relay_dead_letter_writes_pending())
		relay_read_retries(t, rowcxt);

	limit = Min(RELAY_READ_CHUNK, relay_queue_cap(t) - t->nqueued);
	if (t->read_id >= frontier || limit <= 0 || !relay_target_has_room(t))
		return;
	t->read_need = 0;
	t->last_read_at = GetCurrentTimestamp();
	if (relay_read_range(t, t->read_id, frontier, limit, -1, rowcxt, &last,
						 &full) < (uint64) limit && !full)
		t->read_id = frontier;
	else
		t->read_id = last;
}

/*
 * Queue the dead letters of target t that outbox.retry_dead_letters() asked
 * to deliver again, in id order, up to the target's share of the relay's
 * memory; the rest come once these are finished.
 */
static void
relay_read_retries(RelayTarget *t, MemoryContext rowcxt)
{
	static SPIPlanPtr plan = NULL;
	Datum		arg;
	uint64		i;
	Size		bytes = 0;
	MemoryContext oldcxt;

	t->retry_wanted = false;
	if (!relay_schema_operations)
		return;
	if (plan == NULL)
	{
		Oid			argtypes[1] = {TEXTOID};

		plan = SPI_prepare("SELECT id, msg_id, topic, key, payload, headers, emitted_at"
						   "  FROM outbox.dead_letters"
						   " WHERE target = $1 AND retry_requested_at IS NOT NULL"
						   "   AND payload IS NOT NULL"
						   " ORDER BY id LIMIT " CppAsString2(RELAY_READ_CHUNK),
						   1, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the dead letter read");
		SPI_keepplan(plan);
	}
	oldcxt = MemoryContextSwitchTo(rowcxt);
	arg = CStringGetTextDatum(t->name);
	if (SPI_execute_plan(plan, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read dead letters to deliver again");
	for (i = 0; i < SPI_processed; i++)
	{
		RelayRow	row;
		int64		id;
		char	   *topic;
		char	   *key;
		char	   *error = NULL;
		RelayMessage *m;

		relay_row_deform(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, &row);
		id = DatumGetInt64(row.v[ROW_ID]);
		topic = TextDatumGetCString(row.v[ROW_TOPIC]);
		key = row.n[ROW_KEY] ? NULL : TextDatumGetCString(row.v[ROW_KEY]);

		if (bytes > relay_queue_bytes(t))
		{
			t->retry_wanted = true; /* the rest later */
			break;
		}
		m = relay_make_message(t, &row, id, topic, key, &error);
		if (m == NULL)
			continue;			/* cannot be encoded: stays a dead letter */
		bytes += m->mem_size;
		relay_lane_push_retry(&t->lanes[relay_lane_of(t, key, id)], m);
	}
	if (SPI_processed == RELAY_READ_CHUNK)
		t->retry_wanted = true;
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(rowcxt);
}

/*
 * relay_read_target() in a subtransaction of the read transaction, so that
 * an unexpected error (not the encoding failures relay_make_message()
 * turns into dead letters) stops only this target, never the relay: what
 * the failed read queued is taken back, the error shows in outbox.lag, and
 * the target reads again after a backoff.  A message whose building failed
 * RELAY_POISON_TRIES times in a row is dead-lettered with the error.
 */
static void
relay_read_target_guarded(RelayTarget *t, int64 frontier, MemoryContext rowcxt)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	int64		read_id = t->read_id;
	int64	   *overflow = palloc(sizeof(int64) * t->nlanes);
	int64	   *dead = palloc(sizeof(int64) * t->nlanes);
	void	   *dead_mark = relay_dead_letters_mark();
	int			i;

	for (i = 0; i < t->nlanes; i++)
	{
		overflow[i] = t->lanes[i].overflow_id;
		dead[i] = t->lanes[i].dead_delta;
	}

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		t->filtered_pending = 0;
		relay_read_target(t, frontier, rowcxt);
		t->stats.filtered += t->filtered_pending;
		t->filtered_pending = 0;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		t->read_failures = 0;
		t->read_retry_at = 0;
		relay_forget_condemned(t);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		char	   *error;
		int64		delay;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		MemoryContextReset(rowcxt);
		/* Not the read's fault: the relay stops (outbox_error_from_drop). */
		if (outbox_extension_gone())
			ReThrowError(edata);

		/* Take back what this read queued: it will be read again. */
		for (i = 0; i < t->nlanes; i++)
			relay_lane_truncate(&t->lanes[i],
								overflow[i] != 0 ? overflow[i] - 1 : read_id);
		for (i = 0; i < t->nlanes; i++)
		{
			t->lanes[i].overflow_id = overflow[i];
			t->lanes[i].dead_delta = dead[i];
		}
		relay_dead_letters_discard(dead_mark);
		t->read_id = read_id;
		t->read_need = 0;
		t->filtered_pending = 0;	/* they will be read again */

		if (building_id != 0 && building_id == t->poison_id)
			t->poison_tries++;
		else
		{
			t->poison_id = building_id;
			t->poison_tries = 1;
		}
		if (building_id != 0 && t->poison_tries >= RELAY_POISON_TRIES)
		{
			MemoryContext cxt = MemoryContextSwitchTo(t->cxt);
			int64	   *id = palloc(sizeof(int64));

			*id = building_id;
			t->condemned = lappend(t->condemned, id);
			MemoryContextSwitchTo(cxt);
			t->poison_id = 0;
			t->poison_tries = 0;
		}
		if (t->poison_error)
			pfree(t->poison_error);
		t->poison_error = MemoryContextStrdup(t->cxt, edata->message);

		t->read_failures++;
		delay = relay_backoff_ms(t->read_failures, 0);
		t->read_retry_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
		error = psprintf("could not read messages: %s", edata->message);
		relay_lane_set_error(&t->lanes[0], 0, error);
		ereport(WARNING,
				(errmsg("outbox relay could not read messages for target \"%s\": %s",
						t->name, edata->message),
				 building_id != 0 ?
				 errdetail("While building message " INT64_FORMAT "; retrying in " INT64_FORMAT " ms.",
						   building_id, delay) :
				 errdetail("Retrying in " INT64_FORMAT " ms.", delay)));
		pfree(error);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	building_id = 0;
	pfree(overflow);
	pfree(dead);
}

/*
 * Read the messages above each target's read position and at or below the
 * frontier, and queue those it subscribes to; refill lanes that overflowed
 * and have drained.  The snapshot is taken here, after the frontier was
 * computed.  Returns whether anything was read.
 */
bool
relay_read_messages(int64 frontier)
{
	ListCell   *lc;
	bool		any = false;
	MemoryContext rowcxt;

	foreach(lc, relay_targets)
	{
		if (relay_target_wants_read((RelayTarget *) lfirst(lc), frontier))
			any = true;
	}
	if (!any)
		return false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "reading outbox messages");

	if (read_plan == NULL)
	{
		Oid			argtypes[3] = {INT8OID, INT8OID, INT4OID};

		/*
		 * A generic plan: the bounds always select a range of the primary
		 * key, and planning each read would cost more than the read.
		 */
		read_plan = SPI_prepare_cursor("SELECT id, msg_id, topic, key, payload, headers, emitted_at"
									   "  FROM outbox.messages"
									   " WHERE id > $1 AND id <= $2 ORDER BY id LIMIT $3",
									   3, argtypes, CURSOR_OPT_GENERIC_PLAN);
		if (read_plan == NULL)
			elog(ERROR, "outbox: could not prepare the read query: %s",
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(read_plan);
	}

	rowcxt = AllocSetContextCreate(CurrentMemoryContext, "outbox read row",
								   ALLOCSET_DEFAULT_SIZES);

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->read_retry_at != 0 && GetCurrentTimestamp() < t->read_retry_at)
			continue;
		relay_read_target_guarded(t, frontier, rowcxt);
	}

	MemoryContextDelete(rowcxt);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return true;
}
