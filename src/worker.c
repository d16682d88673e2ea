/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  The relay: a background worker that delivers committed messages to
 *	  their targets in commit order.
 *
 * One worker serves outbox.database.  Committing transactions that emitted
 * set its latch; outbox.poll_interval is only a safety net.  Each turn of
 * the loop:
 *
 *	1. computes the frontier F (shmem.c) and flushes WAL up to the current
 *	   insert position, so no message is delivered before its commit is
 *	   durable (I7);
 *	2. reads, in a short transaction whose snapshot is taken after F was
 *	   computed, the messages above each target's read position and at or
 *	   below F (I3), and queues those the target subscribes to in the lane
 *	   of their key (hash of the key modulo the lanes; keyless messages by
 *	   id), skipping those a lane already finished before a restart;
 *	3. delivers: NOTIFY targets in one transaction that also records their
 *	   progress (notify.c); HTTP lanes that are idle send their next batch
 *	   (http.c), one request in flight per lane, so each key is strict FIFO
 *	   (I4) while lanes and targets run concurrently;
 *	4. lets libcurl progress and handles finished requests: success pops
 *	   the batch; a retryable failure schedules a retry with exponential
 *	   backoff and jitter; a permanent failure or the last attempt turns the
 *	   batch into dead letters and the lane moves on;
 *	5. records progress: per lane, the id up to which everything of the lane
 *	   is finished, plus new dead letters, in one short transaction, at most
 *	   every RELAY_PROGRESS_INTERVAL_MS while requests are in flight.
 *
 * No transaction or snapshot is held across network I/O.  A message is sent
 * again after a crash only if its lane's progress was not yet recorded, that
 * is, if it may not have been acknowledged; it then carries the same
 * webhook-id (I5).
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
/* Rows fetched from the read cursor at once (each at most ~2 kB: larger
 * values stay TOAST pointers until a message is built). */
#define RELAY_FETCH_ROWS			256
/* Least number of messages a target may have queued before reading stops. */
#define RELAY_MIN_QUEUE				10000
/* A payload text buffer larger than this is given back after use. */
#define RELAY_TEXT_BUF_KEEP			(1024 * 1024)
/* Failed attempts at building one message before it is dead-lettered. */
#define RELAY_POISON_TRIES			3
/* Record progress at least this often while requests are in flight. */
#define RELAY_PROGRESS_INTERVAL_MS	20
/*
 * After reading, let commits accumulate this long before the next read: the
 * worker does not wait on its latch meanwhile, so committers need not wake
 * it, and one read picks up many commits.  Bounds the cost of the relay at
 * high commit rates; adds at most this much latency.
 */
#define RELAY_READ_PAUSE_MS			1

PGDLLEXPORT void outbox_worker_main(Datum main_arg);

static MemoryContext relay_cxt = NULL;	/* targets and dead letters */
static Oid	loaded_extension = InvalidOid;
static List *targets = NIL;			/* RelayTarget *, by id */
static RelayDeadLetter *dead_letters = NULL;	/* not yet written */
static StringInfoData text_buf;	/* a payload's text, while a row is read */
static TimestampTz last_progress_write = 0;
static SPIPlanPtr read_plan = NULL;
static SPIPlanPtr progress_plan = NULL;
static SPIPlanPtr dead_letter_plan = NULL;

/* outbox.progress has batch_end (schema 0.2 and later). */
static bool progress_has_batch_end = false;

/* The message being built while reading, for the error path; 0 for none. */
static int64 building_id = 0;

/*
 * Test-only fault injection (outbox.test_fault = 'read:TOPIC' or
 * 'send:TOPIC'): raise an error while preparing a message of TOPIC, to show
 * that an unexpected error stops neither the relay nor other targets.
 */
void
relay_test_fault(const char *where, const char *topic)
{
	size_t		n = strlen(where);

	if (outbox_test_fault != NULL && outbox_test_fault[0] != '\0' &&
		strncmp(outbox_test_fault, where, n) == 0 &&
		outbox_test_fault[n] == ':' && strcmp(outbox_test_fault + n + 1, topic) == 0)
		elog(ERROR, "outbox: injected fault while preparing a message of topic \"%s\"", topic);
}

/*---- queues ----*/

static int
relay_queue_cap(RelayTarget *t)
{
	return Max(RELAY_MIN_QUEUE, 4 * t->nlanes * t->batch_size);
}

/*
 * Messages one lane may hold: half the target's read-ahead (all of it with
 * one lane).  A lane that retries for a long time fills up and stops taking
 * messages (remembering where, in overflow_id) while the other lanes keep
 * going with the other half; it reads its own messages again once it
 * drains.  Half, not an even share, so that lanes do not overflow, and
 * re-read, in an ordinary backlog of uneven keys.
 */
static int
relay_lane_cap(RelayTarget *t)
{
	if (t->nlanes == 1)
		return relay_queue_cap(t);
	return Max(4 * t->batch_size, relay_queue_cap(t) / 2);
}

/*
 * Bytes of messages a target may have queued: half its even share of
 * outbox.relay_memory (the request bodies built from them take at most as
 * much again).
 */
static Size
relay_queue_bytes(RelayTarget *t)
{
	Size		total = (Size) outbox_relay_memory * 1024;

	return Max(total / Max(list_length(targets), 1) / 2, 64 * 1024);
}

/* Bytes one lane may hold: as relay_lane_cap(), half of the target's. */
static Size
relay_lane_bytes(RelayTarget *t)
{
	if (t->nlanes == 1)
		return relay_queue_bytes(t);
	return relay_queue_bytes(t) / 2;
}

/*
 * Whether target t has room for the message that last did not fit, so that
 * a read does not stop at once (and the loop does not spin on it).
 */
static bool
relay_target_has_room(RelayTarget *t)
{
	return t->nqueued == 0 ||
		t->queued_bytes + Max(t->read_need, 1) <= relay_queue_bytes(t);
}

static bool
relay_lane_needs_refill(RelayLane *lane)
{
	return lane->overflow_id != 0 && relay_target_has_room(lane->target) &&
		lane->nqueued <= relay_lane_cap(lane->target) / 2 &&
		lane->queued_bytes <= relay_lane_bytes(lane->target) / 2;
}

static void
relay_lane_push(RelayLane *lane, RelayMessage *m)
{
	m->next = NULL;
	if (lane->tail)
		lane->tail->next = m;
	else
		lane->head = m;
	lane->tail = m;
	lane->nqueued++;
	lane->target->nqueued++;
	lane->queued_bytes += m->mem_size;
	lane->target->queued_bytes += m->mem_size;
}

RelayMessage *
relay_lane_pop(RelayLane *lane)
{
	RelayMessage *m = lane->head;

	Assert(m != NULL);
	lane->head = m->next;
	if (lane->head == NULL)
		lane->tail = NULL;
	lane->nqueued--;
	lane->target->nqueued--;
	lane->queued_bytes -= m->mem_size;
	lane->target->queued_bytes -= m->mem_size;
	return m;
}

/* Drop the lane's queued messages with ids above bound (never in flight). */
static void
relay_lane_truncate(RelayLane *lane, int64 bound)
{
	RelayMessage *keep = NULL;
	RelayMessage *m = lane->head;

	while (m != NULL && m->id <= bound)
	{
		keep = m;
		m = m->next;
	}
	if (keep)
		keep->next = NULL;
	else
		lane->head = NULL;
	lane->tail = keep;
	while (m != NULL)
	{
		RelayMessage *next = m->next;

		Assert(!lane->in_flight || lane->nbatch == 0);
		lane->nqueued--;
		lane->target->nqueued--;
		lane->queued_bytes -= m->mem_size;
		lane->target->queued_bytes -= m->mem_size;
		pfree(m);
		m = next;
	}
}

/* The id up to which everything of the lane is finished. */
static int64
relay_lane_done_position(RelayLane *lane)
{
	if (lane->head != NULL)
		return Max(lane->done_id, lane->head->id - 1);
	if (lane->overflow_id != 0)
		return Max(lane->done_id, lane->overflow_id - 1);
	return Max(lane->done_id, lane->target->read_id);
}

void
relay_lane_set_error(RelayLane *lane, int status, const char *error)
{
	RelayTarget *t = lane->target;

	if (lane->last_error)
		pfree(lane->last_error);
	lane->last_error = MemoryContextStrdup(t->cxt, error);
	lane->last_status = status;
	lane->last_error_at = GetCurrentTimestamp();
	lane->error_dirty = true;
}

/* The head batch was acknowledged. */
static void
relay_lane_succeeded(RelayLane *lane)
{
	int			i;

	for (i = 0; i < lane->nbatch; i++)
	{
		RelayMessage *m = relay_lane_pop(lane);

		lane->last_delivered_id = m->id;
		pfree(m);
	}
	lane->delivered_delta += lane->nbatch;
	lane->nbatch = 0;
	lane->retry_nbatch = 0;
	lane->attempts = 0;
	lane->next_attempt = 0;
}

/* Exponential backoff with jitter, at least Retry-After. */
int64
relay_backoff_ms(int attempts, int retry_after_s)
{
	double		delay = outbox_retry_base_delay;
	int			i;

	for (i = 1; i < attempts && delay < outbox_retry_max_delay; i++)
		delay *= 2;
	delay = Min(delay, (double) outbox_retry_max_delay);
	delay *= 0.5 + 0.5 * pg_prng_double(&pg_global_prng_state);
	if (retry_after_s > 0)
		delay = Max(delay, retry_after_s * 1000.0);
	return (int64) delay;
}

/* Queue a dead letter, written with the next progress update. */
static void
relay_add_dead_letter(RelayTarget *t, int64 id, const char *msg_id,
					  const char *topic, const char *key, int attempts,
					  int status, const char *error)
{
	RelayDeadLetter *d = MemoryContextAllocZero(relay_cxt, sizeof(RelayDeadLetter));

	d->target = MemoryContextStrdup(relay_cxt, t->name);
	d->id = id;
	strlcpy(d->msg_id, msg_id, sizeof(d->msg_id));
	d->topic = MemoryContextStrdup(relay_cxt, topic);
	d->key = key ? MemoryContextStrdup(relay_cxt, key) : NULL;
	d->attempts = attempts;
	d->last_status = status;
	d->last_error = MemoryContextStrdup(relay_cxt, error);
	d->next = dead_letters;
	dead_letters = d;
}

/* The head batch failed: retry it later, or dead-letter it. */
static void
relay_lane_failed(RelayLane *lane, bool retryable, int status,
				  const char *error, int retry_after_s)
{
	RelayTarget *t = lane->target;
	int			i;

	lane->attempts++;
	relay_lane_set_error(lane, status, error);

	if (retryable && (t->max_attempts == 0 || lane->attempts < t->max_attempts))
	{
		lane->next_attempt =
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										relay_backoff_ms(lane->attempts, retry_after_s));
		lane->retry_nbatch = lane->nbatch;
		lane->nbatch = 0;
		return;
	}

	for (i = 0; i < lane->nbatch; i++)
	{
		RelayMessage *m = relay_lane_pop(lane);

		relay_add_dead_letter(t, m->id, m->msg_id, m->topic, m->key,
							  lane->attempts, status, error);
		pfree(m);
	}
	lane->dead_delta += lane->nbatch;
	lane->nbatch = 0;
	lane->retry_nbatch = 0;
	lane->attempts = 0;
	lane->next_attempt = 0;
}

/*
 * The receiver as a whole refused (the endpoint, not the message, is
 * wrong): hold the target.  Nothing is dead-lettered and the lane's attempts
 * do not count toward max_attempts; this lane probes again after a backoff
 * (up to outbox.retry_max_delay) while the other lanes wait, and the first
 * success releases them all, in order.
 */
static void
relay_lane_hold(RelayLane *lane, int status, const char *error,
				int retry_after_s)
{
	RelayTarget *t = lane->target;

	relay_lane_set_error(lane, status, error);
	t->hold_attempts++;
	t->probe_lane = lane->index;
	t->held_until =
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									relay_backoff_ms(t->hold_attempts, retry_after_s));
	lane->next_attempt = t->held_until;
	lane->retry_nbatch = lane->nbatch;
	lane->nbatch = 0;
	if (t->hold_attempts == 1)
		ereport(LOG,
				(errmsg("outbox relay holds target \"%s\": %s", t->name, error),
				 errdetail("Nothing is dead-lettered; delivery resumes in order when the receiver accepts requests again.")));
}

/* What a transport reported for the lane's request. */
void
relay_lane_outcome(RelayLane *lane, const RelayOutcome *outcome)
{
	RelayTarget *t = lane->target;

	switch (outcome->kind)
	{
		case RELAY_DELIVERED:
			relay_lane_succeeded(lane);
			if (t->hold_attempts > 0)
				ereport(LOG,
						(errmsg("outbox relay resumes target \"%s\"", t->name)));
			t->hold_attempts = 0;
			t->held_until = 0;
			break;
		case RELAY_RETRY:
			relay_lane_failed(lane, true, outcome->status, outcome->error,
							  outcome->retry_after_s);
			break;
		case RELAY_REJECTED:
			relay_lane_failed(lane, false, outcome->status, outcome->error, 0);
			break;
		case RELAY_RECEIVER_FAILED:
			relay_lane_hold(lane, outcome->status, outcome->error,
							outcome->retry_after_s);
			break;
	}
}

/* Whether a lane of t may start a request now (a held target probes). */
static bool
relay_lane_may_send(RelayLane *lane, TimestampTz now)
{
	RelayTarget *t = lane->target;

	if (lane->in_flight || lane->nqueued == 0 || now < lane->next_attempt)
		return false;
	if (t->hold_attempts > 0)
		return lane->index == t->probe_lane && now >= t->held_until;
	return true;
}

/*
 * Append the JSON envelope of a message to buf: id, seq, topic, key,
 * headers (or headers_omitted), payload (or payload_omitted) and
 * emitted_at.  parts says which of headers and payload to include.
 */
void
relay_envelope(RelayMessage *m, int parts, StringInfo buf)
{
	appendStringInfo(buf, "{\"id\":\"%s\",\"seq\":" INT64_FORMAT ",\"topic\":",
					 m->msg_id, m->id);
	escape_json(buf, m->topic);
	appendStringInfoString(buf, ",\"key\":");
	if (m->key)
		escape_json(buf, m->key);
	else
		appendStringInfoString(buf, "null");
	if (parts & RELAY_ENVELOPE_HEADERS)
	{
		appendStringInfoString(buf, ",\"headers\":");
		appendStringInfoString(buf, m->headers ? m->headers : "null");
	}
	else
		appendStringInfoString(buf, ",\"headers_omitted\":true");
	if (parts & RELAY_ENVELOPE_PAYLOAD)
	{
		appendStringInfoString(buf, ",\"payload\":");
		appendBinaryStringInfo(buf, m->payload, m->payload_len);
	}
	else
		appendStringInfoString(buf, ",\"payload_omitted\":true");
	appendStringInfoString(buf, ",\"emitted_at\":");
	relay_append_time(buf, m->emitted_at);
	appendStringInfoChar(buf, '}');
}

/*
 * Bytes a message adds to a batch body, at most: its envelope, with room
 * for escaping the topic and key.
 */
Size
relay_envelope_size(RelayMessage *m)
{
	return (Size) m->payload_len + (m->headers ? strlen(m->headers) : 0) +
		6 * (strlen(m->topic) + (m->key ? strlen(m->key) : 0)) + 256;
}

/* Append t as a JSON string, the way to_json() writes a timestamptz. */
void
relay_append_time(StringInfo buf, TimestampTz t)
{
	char		text[MAXDATELEN + 1];

	JsonEncodeDateTime(text, TimestampTzGetDatum(t), TIMESTAMPTZOID, NULL);
	appendStringInfoChar(buf, '"');
	appendStringInfoString(buf, text);
	appendStringInfoChar(buf, '"');
}

/*---- configuration ----*/

static RelayTarget *
relay_find_target(int id)
{
	ListCell   *lc;

	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->id == id)
			return t;
	}
	return NULL;
}

static void
relay_free_target(RelayTarget *t)
{
	int			i;

	for (i = 0; i < t->nlanes; i++)
		relay_http_lane_release(&t->lanes[i]);
	MemoryContextDelete(t->cxt);
}

static char *
relay_spi_text(HeapTuple tup, TupleDesc desc, int col)
{
	return SPI_getvalue(tup, desc, col);
}

static int64
relay_spi_int(HeapTuple tup, TupleDesc desc, int col, bool *isnull)
{
	Datum		d = SPI_getbinval(tup, desc, col, isnull);

	if (*isnull)
		return 0;
	switch (TupleDescAttr(desc, col - 1)->atttypid)
	{
		case INT2OID:
			return DatumGetInt16(d);
		case INT4OID:
			return DatumGetInt32(d);
		default:
			return DatumGetInt64(d);
	}
}

/*
 * Whether s has no control character (and, unless allow_space, no space),
 * as the target functions check for URLs and header values.
 */
static bool
relay_printable(const char *s, bool allow_space)
{
	for (; *s; s++)
	{
		unsigned char c = (unsigned char) *s;

		if (c < 0x20 || c == 0x7f || (c == ' ' && !allow_space))
			return false;
	}
	return true;
}

/* RFC 9110 token characters, the only ones allowed in a header name. */
static bool
relay_token(const char *s, int len)
{
	int			i;

	if (len == 0)
		return false;
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (!(isalnum(c) || (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL)))
			return false;
	}
	return true;
}

/*
 * Header lines of the target's headers object, as libcurl takes them:
 * "Name: value", or "Name;" for an empty value ("Name:" would remove a
 * header instead of sending it).  Returns a reason when the object is not
 * usable, else NULL.
 */
static const char *
relay_target_headers(RelayTarget *t, Jsonb *jb)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			max;
	char	   *name = NULL;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return "headers is not a JSON object";
	max = JB_ROOT_COUNT(jb);
	t->header_lines = palloc(sizeof(char *) * (max + 1));
	t->header_names = palloc(sizeof(char *) * (max + 1));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			if (!relay_token(v.val.string.val, v.val.string.len))
				return "a header name is not an HTTP token";
			name = pnstrdup(v.val.string.val, v.val.string.len);
		}
		else if (tok == WJB_VALUE)
		{
			char	   *value;

			if (v.type != jbvString)
				return "a header value is not a string";
			value = pnstrdup(v.val.string.val, v.val.string.len);
			if (!relay_printable(value, true))
				return "a header value has a control character";
			t->header_names[t->nheader_lines] = name;
			t->header_lines[t->nheader_lines++] = *value ?
				psprintf("%s: %s", name, value) : psprintf("%s;", name);
		}
	}
	return NULL;
}

/*
 * Build a target from a row of the configuration query (see
 * relay_load_config() for its columns), checking every field the way the
 * target functions and the table's constraints do: the row may have been
 * written by hand.  Returns NULL, with *problem set, for a row that cannot
 * be used.
 */
static RelayTarget *
relay_make_target(HeapTuple tup, TupleDesc desc, const char **problem)
{
	MemoryContext cxt;
	MemoryContext oldcxt;
	RelayTarget *t;
	bool		isnull;
	char	   *s;
	Datum		d;
	int			i;

	*problem = NULL;
	cxt = AllocSetContextCreate(relay_cxt, "outbox target", ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);
	t = palloc0(sizeof(RelayTarget));
	t->cxt = cxt;
	t->id = (int) relay_spi_int(tup, desc, 1, &isnull);
	t->name = relay_spi_text(tup, desc, 2);
	s = relay_spi_text(tup, desc, 3);
	t->url = relay_spi_text(tup, desc, 4);
	t->channel = relay_spi_text(tup, desc, 5);
	t->batch_size = (int) relay_spi_int(tup, desc, 6, &isnull);
	t->nlanes = (int) relay_spi_int(tup, desc, 7, &isnull);
	t->max_attempts = (int) relay_spi_int(tup, desc, 8, &isnull);
	t->timeout_ms = (int) relay_spi_int(tup, desc, 9, &isnull);

	if (s != NULL && strcmp(s, "http") == 0)
	{
		t->kind = RELAY_HTTP;
		if (t->url == NULL || !relay_printable(t->url, false) ||
			(pg_strncasecmp(t->url, "http://", 7) != 0 &&
			 pg_strncasecmp(t->url, "https://", 8) != 0))
			*problem = "url is not an http:// or https:// URL without spaces or control characters";
	}
	else if (s != NULL && strcmp(s, "notify") == 0)
	{
		t->kind = RELAY_NOTIFY;
		if (t->channel == NULL || t->channel[0] == '\0' ||
			strlen(t->channel) >= NAMEDATALEN)
			*problem = "channel is not a channel name of 1 to 63 bytes";
	}
	else
		*problem = "kind is neither 'http' nor 'notify'";

	if (*problem == NULL && (t->batch_size < 1 || t->batch_size > 1000))
		*problem = "batch_size is not between 1 and 1000";
	if (*problem == NULL && (t->nlanes < 1 || t->nlanes > 256 ||
							 (t->kind == RELAY_NOTIFY && t->nlanes != 1)))
		*problem = "lanes is not between 1 and 256 (1 for NOTIFY)";
	if (*problem == NULL && (t->max_attempts < 0 || t->max_attempts > 1000000))
		*problem = "max_attempts is not between 0 and 1000000";
	if (*problem == NULL && (t->timeout_ms < 10 || t->timeout_ms > 3600000))
		*problem = "timeout_ms is not between 10 and 3600000";

	s = relay_spi_text(tup, desc, 10);
	if (*problem == NULL && s != NULL)
	{
		int			len = strlen(s);

		if (len < 6 || strncmp(s, "whsec_", 6) != 0)
			*problem = "secret does not start with whsec_";
		else
		{
			t->secret = palloc(pg_b64_dec_len(len - 6) + 1);
			t->secret_len = pg_b64_decode(s + 6, len - 6, (char *) t->secret,
										  pg_b64_dec_len(len - 6));
			if (t->secret_len < 16 || t->secret_len > 64)
				*problem = "secret is not base64 of 16 to 64 bytes";
		}
	}

	d = SPI_getbinval(tup, desc, 11, &isnull);
	if (*problem == NULL && !isnull)
		*problem = relay_target_headers(t, DatumGetJsonbP(d));

	if (*problem != NULL)
	{
		MemoryContextSwitchTo(oldcxt);
		MemoryContextDelete(cxt);
		return NULL;
	}

	t->lanes = palloc0(sizeof(RelayLane) * t->nlanes);
	for (i = 0; i < t->nlanes; i++)
	{
		t->lanes[i].target = t;
		t->lanes[i].index = i;
		t->lanes[i].done_id = -1;
		if (t->kind == RELAY_HTTP)
			relay_http_lane_init(&t->lanes[i]);
	}
	t->read_id = -1;
	MemoryContextSwitchTo(oldcxt);
	return t;
}

/*
 * A target row that cannot be used is skipped: say so once per load, with
 * a WARNING and in its progress rows, which outbox.lag shows.  Its messages
 * wait until the row is fixed.
 */
static void
relay_report_bad_target(int id, const char *name, const char *problem)
{
	static SPIPlanPtr plan = NULL;
	Datum		args[2];
	char	   *error = psprintf("target is not delivered: %s", problem);

	ereport(WARNING,
			(errmsg("outbox relay skips target \"%s\": %s", name ? name : "?", problem),
			 errhint("Drop the target and create it again with outbox.create_http_target() or outbox.create_notify_target().")));
	if (plan == NULL)
	{
		Oid			argtypes[2] = {INT4OID, TEXTOID};

		plan = SPI_prepare("UPDATE outbox.progress SET last_error = $2, last_error_at = now()"
						   " WHERE target_id = $1 AND last_error IS DISTINCT FROM $2",
						   2, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the target error query");
		SPI_keepplan(plan);
	}
	args[0] = Int32GetDatum(id);
	args[1] = CStringGetTextDatum(error);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: could not record a target error");
	pfree(error);
}

/*
 * Load targets, subscriptions and progress.  Targets that still exist keep
 * their queues and requests in flight; new ones start from their recorded
 * progress; dropped ones are forgotten.  Runs in its own transaction.
 */
static void
relay_load_config(void)
{
	ListCell   *lc;
	List	   *kept = NIL;
	uint64		i;
	SPITupleTable *rows;
	uint64		nrows;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "loading outbox targets");

	{
		Oid			ext = get_extension_oid("outbox", true);

		if (ext != loaded_extension)
		{
			/* A new extension: its target ids mean other targets. */
			foreach(lc, targets)
				relay_free_target((RelayTarget *) lfirst(lc));
			list_free(targets);
			targets = NIL;
			loaded_extension = ext;
		}
	}
	foreach(lc, targets)
		((RelayTarget *) lfirst(lc))->seen = false;

	if (SPI_execute("SELECT t.id, t.name, t.kind, t.url, t.channel, t.batch_size, t.lanes,"
					"       t.max_attempts, t.timeout_ms, t.secret, t.headers"
					"  FROM outbox.targets t ORDER BY t.id", false, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.targets");

	rows = SPI_tuptable;
	nrows = SPI_processed;
	for (i = 0; i < nrows; i++)
	{
		HeapTuple	tup = rows->vals[i];
		bool		isnull;
		int			id = (int) relay_spi_int(tup, rows->tupdesc, 1, &isnull);
		RelayTarget *t = relay_find_target(id);

		if (t == NULL)
		{
			const char *problem;

			t = relay_make_target(tup, rows->tupdesc, &problem);
			if (t == NULL)
			{
				relay_report_bad_target(id, relay_spi_text(tup, rows->tupdesc, 2),
										problem);
				continue;
			}
			ereport(LOG,
					(errmsg("outbox relay: delivering to target \"%s\"", t->name)));
		}
		t->seen = true;
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);

			kept = lappend(kept, t);
			MemoryContextSwitchTo(oldcxt);
		}
	}

	/* Forget dropped targets. */
	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (!t->seen)
		{
			ereport(LOG,
					(errmsg("outbox relay: target \"%s\" was dropped", t->name)));
			relay_free_target(t);
		}
	}
	list_free(targets);
	targets = kept;

	/*
	 * Subscriptions replace the old ones.  A subscription new to a target
	 * that has already read past its start_id starts at the target's read
	 * position instead: the relay may have passed messages committed while
	 * subscribe() was still open without queueing them.  Everything
	 * committed after the subscription is delivered either way.
	 */
	if (SPI_execute("SELECT target_id, pattern, start_id FROM outbox.subscriptions"
					" ORDER BY target_id, pattern", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.subscriptions");
	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		RelaySubscription *old = t->subs;
		int			nold = t->nsubs;
		int			j;

		t->subs = MemoryContextAlloc(t->cxt, sizeof(RelaySubscription) * (SPI_processed + 1));
		t->nsubs = 0;
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			RelaySubscription *sub;
			char	   *pattern;
			int			len;

			if ((int) relay_spi_int(tup, desc, 1, &isnull) != t->id)
				continue;
			sub = &t->subs[t->nsubs++];
			pattern = relay_spi_text(tup, desc, 2);
			sub->pattern = MemoryContextStrdup(t->cxt, pattern);
			len = strlen(pattern);
			sub->prefix_len = (len > 0 && pattern[len - 1] == '*') ? len - 1 : -1;
			sub->start_id = relay_spi_int(tup, desc, 3, &isnull);
			if (t->read_id >= 0)
			{
				bool		known = false;

				for (j = 0; j < nold; j++)
				{
					if (strcmp(old[j].pattern, sub->pattern) == 0)
					{
						sub->start_id = old[j].start_id;
						known = true;
						break;
					}
				}
				if (!known)
					sub->start_id = Max(sub->start_id, t->read_id);
			}
		}
		for (j = 0; j < nold; j++)
			pfree(old[j].pattern);
		if (old)
			pfree(old);
	}

	/* Progress, for targets that have not read anything yet. */
	{
		Oid			progress = get_relname_relid("progress", get_namespace_oid("outbox", false));

		/* batch_end came with schema 0.2. */
		progress_has_batch_end = OidIsValid(progress) &&
			get_attnum(progress, "batch_end") != InvalidAttrNumber;
	}
	if (SPI_execute(progress_has_batch_end ?
					"SELECT target_id, lane, done_id, last_delivered_id, batch_end FROM outbox.progress" :
					"SELECT target_id, lane, done_id, last_delivered_id, NULL::bigint FROM outbox.progress",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.progress");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		RelayTarget *t = relay_find_target((int) relay_spi_int(tup, desc, 1, &isnull));
		int			lane = (int) relay_spi_int(tup, desc, 2, &isnull);

		if (t == NULL || lane < 0 || lane >= t->nlanes || t->lanes[lane].done_id >= 0)
			continue;
		t->lanes[lane].done_id = relay_spi_int(tup, desc, 3, &isnull);
		t->lanes[lane].last_delivered_id = relay_spi_int(tup, desc, 4, &isnull);
		t->lanes[lane].batch_end = relay_spi_int(tup, desc, 5, &isnull);
	}
	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			j;

		if (t->read_id >= 0)
			continue;
		for (j = 0; j < t->nlanes; j++)
		{
			if (t->lanes[j].done_id < 0)
				t->lanes[j].done_id = 0;
			if (t->read_id < 0 || t->lanes[j].done_id < t->read_id)
				t->read_id = t->lanes[j].done_id;
		}
		if (t->read_id < 0)
			t->read_id = 0;
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*---- reading ----*/

static bool
relay_subscribed(RelayTarget *t, const char *topic, int64 id)
{
	int			i;

	for (i = 0; i < t->nsubs; i++)
	{
		RelaySubscription *s = &t->subs[i];

		if (id <= s->start_id)
			continue;
		if (s->prefix_len < 0)
		{
			if (strcmp(topic, s->pattern) == 0)
				return true;
		}
		else if (strncmp(topic, s->pattern, s->prefix_len) == 0)
			return true;
	}
	return false;
}

static int
relay_lane_of(RelayTarget *t, const char *key, int64 id)
{
	if (t->nlanes == 1)
		return 0;
	if (key == NULL)
		return (int) (id % t->nlanes);
	return (int) (hash_bytes((const unsigned char *) key, strlen(key)) % (uint32) t->nlanes);
}

/*
 * "Name: value" lines of a headers object, NUL-separated and ended by an
 * empty string, for HTTP requests.
 */
static char *
relay_header_lines(Jsonb *jb, int *len)
{
	StringInfoData buf;
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbValue	v;
	JsonbIteratorToken tok;

	initStringInfo(&buf);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			appendBinaryStringInfo(&buf, v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE && v.type == jbvString)
		{
			/* "Name;" sends an empty header; "Name:" would remove one. */
			if (v.val.string.len == 0)
				appendStringInfoChar(&buf, ';');
			else
			{
				appendStringInfoString(&buf, ": ");
				appendBinaryStringInfo(&buf, v.val.string.val, v.val.string.len);
			}
			appendStringInfoChar(&buf, '\0');
		}
	}
	appendStringInfoChar(&buf, '\0');
	*len = buf.len;
	return buf.data;
}

/* The text form of a uuid, into out (RELAY_UUID_LEN + 1 bytes). */
static void
relay_uuid_text(const pg_uuid_t *uuid, char *out)
{
	static const char hex[] = "0123456789abcdef";
	int			i;
	int			j;

	for (i = 0, j = 0; i < UUID_LEN; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			out[j++] = '-';
		out[j++] = hex[uuid->data[i] >> 4];
		out[j++] = hex[uuid->data[i] & 0x0f];
	}
	out[j] = '\0';
}

/*
 * A message that cannot be sent at all (it cannot be encoded): a dead letter
 * at once, with the reason; its lane goes on without it.
 */
static void
relay_dead_letter_unsent(RelayLane *lane, HeapTuple tup, TupleDesc desc,
						 int64 id, const char *topic, const char *key,
						 const char *error)
{
	char		msg_id[RELAY_UUID_LEN + 1];
	bool		isnull;

	relay_uuid_text(DatumGetUUIDP(SPI_getbinval(tup, desc, 2, &isnull)), msg_id);
	relay_add_dead_letter(lane->target, id, msg_id, topic, key, 0, 0, error);
	lane->dead_delta++;
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
		(void) JsonbToCString(&text_buf, &jb->root, VARSIZE(jb));
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
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
relay_make_message(RelayTarget *t, HeapTuple tup, TupleDesc desc, int64 id,
				   const char *topic, const char *key, char **error)
{
	bool		isnull;
	Datum		d;
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
	d = SPI_getbinval(tup, desc, 5, &isnull);
	jb = DatumGetJsonbP(d);		/* detoasted here, outside the guard */

	if (!relay_payload_text(jb, error))
		return NULL;
	payload = text_buf.data;
	payload_len = text_buf.len;

	/*
	 * Headers: as "Name: value" lines for a single-message HTTP request, as
	 * JSON text for envelopes (batches and NOTIFY).
	 */
	d = SPI_getbinval(tup, desc, 6, &isnull);
	if (!isnull)
	{
		jb = DatumGetJsonbP(d);
		if (t->kind == RELAY_NOTIFY || t->batch_size > 1)
		{
			headers = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
			headers_len = strlen(headers);
		}
		if (t->kind == RELAY_HTTP && JsonContainerSize(&jb->root) > 0)
			lines = relay_header_lines(jb, &lines_len);
	}

	size = MAXALIGN(sizeof(RelayMessage)) + strlen(topic) + 1 +
		(key ? strlen(key) + 1 : 0) + payload_len + 1 +
		(headers ? headers_len + 1 : 0) + lines_len;
	m = MemoryContextAllocHuge(t->cxt, size);
	p = (char *) m + MAXALIGN(sizeof(RelayMessage));
	m->next = NULL;
	m->id = id;
	m->mem_size = size;

	relay_uuid_text(DatumGetUUIDP(SPI_getbinval(tup, desc, 2, &isnull)), m->msg_id);

	/* Formatted only when an envelope needs it. */
	m->emitted_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 7, &isnull));

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

		SPI_cursor_fetch(portal, true, Min(RELAY_FETCH_ROWS, limit - (int) n));
		if (SPI_processed == 0)
			break;
		for (i = 0; i < SPI_processed && !stop; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			int64		id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
			MemoryContext oldcxt;
			char	   *topic;

			oldcxt = MemoryContextSwitchTo(rowcxt);
			topic = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
			if (relay_subscribed(t, topic, id))
			{
				Datum		kd = SPI_getbinval(tup, desc, 4, &isnull);
				char	   *key = isnull ? NULL : TextDatumGetCString(kd);
				int			l = relay_lane_of(t, key, id);
				RelayLane  *lane = &t->lanes[l];
				Size		est = toast_raw_datum_size(SPI_getbinval(tup, desc, 5, &isnull));

				if (only_lane >= 0 && l != only_lane)
					 /* another lane's message */ ;
				else if (id <= lane->done_id)
					 /* finished before a restart */ ;
				else if (only_lane < 0 && lane->overflow_id != 0)
					 /* the lane is behind; its refill will read this */ ;
				else if (t->nqueued > 0 && t->queued_bytes + est > queue_bytes)
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
				else if (lane->nqueued >= lane_cap ||
						 (lane->nqueued > 0 && lane->queued_bytes + est > lane_bytes))
				{
					/* The lane is full: leave the rest for its refill. */
					lane->overflow_id = id;
					stop = (only_lane >= 0);
				}
				else if (id == t->poison_id && t->poison_tries >= RELAY_POISON_TRIES)
				{
					char	   *error = psprintf("message could not be prepared: %s",
												 t->poison_error);

					relay_dead_letter_unsent(lane, tup, desc, id, topic, key, error);
					t->poison_id = 0;
					t->poison_tries = 0;
				}
				else
				{
					char	   *error = NULL;
					RelayMessage *m;

					building_id = id;
					relay_test_fault("read", topic);
					m = relay_make_message(t, tup, desc, id, topic, key, &error);
					building_id = 0;
					if (m != NULL)
						relay_lane_push(lane, m);
					else
						relay_dead_letter_unsent(lane, tup, desc, id, topic,
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

/* Whether target t has messages to read. */
static bool
relay_target_wants_read(RelayTarget *t, int64 frontier)
{
	int			i;

	if (t->read_id < frontier && t->nqueued < relay_queue_cap(t) &&
		relay_target_has_room(t))
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

	limit = Min(RELAY_READ_CHUNK, relay_queue_cap(t) - t->nqueued);
	if (t->read_id >= frontier || limit <= 0 || !relay_target_has_room(t))
		return;
	t->read_need = 0;
	if (relay_read_range(t, t->read_id, frontier, limit, -1, rowcxt, &last,
						 &full) < (uint64) limit && !full)
		t->read_id = frontier;
	else
		t->read_id = last;
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
	int			i;

	for (i = 0; i < t->nlanes; i++)
		overflow[i] = t->lanes[i].overflow_id;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcxt);
	PG_TRY();
	{
		relay_read_target(t, frontier, rowcxt);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcxt);
		CurrentResourceOwner = oldowner;
		t->read_failures = 0;
		t->read_retry_at = 0;
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

		/* Take back what this read queued: it will be read again. */
		for (i = 0; i < t->nlanes; i++)
			relay_lane_truncate(&t->lanes[i],
								overflow[i] != 0 ? overflow[i] - 1 : read_id);
		for (i = 0; i < t->nlanes; i++)
			t->lanes[i].overflow_id = overflow[i];
		t->read_id = read_id;
		t->read_need = 0;

		if (building_id != 0 && building_id == t->poison_id)
			t->poison_tries++;
		else
		{
			t->poison_id = building_id;
			t->poison_tries = 1;
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
}

/*
 * Read the messages above each target's read position and at or below the
 * frontier, and queue those it subscribes to; refill lanes that overflowed
 * and have drained.  The snapshot is taken here, after the frontier was
 * computed.  Returns whether anything was read.
 */
static bool
relay_read_messages(int64 frontier)
{
	ListCell   *lc;
	bool		any = false;
	MemoryContext rowcxt;

	foreach(lc, targets)
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

	foreach(lc, targets)
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

/*---- progress ----*/

static bool
relay_progress_pending(void)
{
	ListCell   *lc;

	if (dead_letters != NULL)
		return true;
	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			if (lane->delivered_delta || lane->dead_delta || lane->error_dirty ||
				relay_lane_done_position(lane) != lane->done_id)
				return true;
		}
	}
	return false;
}

/*
 * Record, in one transaction, the progress of every lane that moved and
 * the dead letters found since the last call.  (NOTIFY targets record
 * their deliveries themselves; here they only advance past messages they
 * do not subscribe to.)
 */
static void
relay_write_progress(void)
{
	ListCell   *lc;
	RelayDeadLetter *d;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "recording outbox progress");

	if (progress_plan == NULL)
	{
		Oid			argtypes[10] = {INT4OID, INT4OID, INT8OID, INT8OID, INT8OID,
		INT8OID, INT4OID, INT4OID, TEXTOID, TIMESTAMPTZOID};

		progress_plan = SPI_prepare("UPDATE outbox.progress"
									"   SET done_id = greatest(done_id, $3),"
									"       last_delivered_id = coalesce($4, last_delivered_id),"
									"       delivered = delivered + $5, dead = dead + $6,"
									"       attempts = $7,"
									"       last_status = coalesce($8, last_status),"
									"       last_error = coalesce($9, last_error),"
									"       last_error_at = coalesce($10, last_error_at)"
									" WHERE target_id = $1 AND lane = $2",
									10, argtypes);
		if (progress_plan == NULL)
			elog(ERROR, "outbox: could not prepare the progress query");
		SPI_keepplan(progress_plan);
	}
	if (dead_letter_plan == NULL)
	{
		Oid			argtypes[8] = {TEXTOID, INT8OID, UUIDOID, TEXTOID, TEXTOID,
		INT4OID, INT4OID, TEXTOID};

		dead_letter_plan = SPI_prepare("INSERT INTO outbox.dead_letters"
									   " (target, id, msg_id, topic, key, attempts, last_status, last_error)"
									   " VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0), $8)"
									   " ON CONFLICT (target, id) DO UPDATE"
									   "   SET attempts = excluded.attempts, last_status = excluded.last_status,"
									   "       last_error = excluded.last_error, failed_at = excluded.failed_at",
									   8, argtypes);
		if (dead_letter_plan == NULL)
			elog(ERROR, "outbox: could not prepare the dead letter query");
		SPI_keepplan(dead_letter_plan);
	}

	for (d = dead_letters; d != NULL; d = d->next)
	{
		Datum		args[8];
		char		nulls[8] = "        ";

		args[0] = CStringGetTextDatum(d->target);
		args[1] = Int64GetDatum(d->id);
		args[2] = DirectFunctionCall1(uuid_in, CStringGetDatum(d->msg_id));
		args[3] = CStringGetTextDatum(d->topic);
		if (d->key)
			args[4] = CStringGetTextDatum(d->key);
		else
			nulls[4] = 'n';
		args[5] = Int32GetDatum(d->attempts);
		args[6] = Int32GetDatum(d->last_status);
		args[7] = CStringGetTextDatum(d->last_error);
		if (SPI_execute_plan(dead_letter_plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "outbox: could not record a dead letter");
	}

	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];
			int64		done = relay_lane_done_position(lane);
			Datum		args[10];
			char		nulls[10] = "          ";

			if (!(lane->delivered_delta || lane->dead_delta || lane->error_dirty ||
				  done != lane->done_id))
				continue;
			args[0] = Int32GetDatum(t->id);
			args[1] = Int32GetDatum(i);
			args[2] = Int64GetDatum(done);
			args[3] = Int64GetDatum(lane->last_delivered_id);
			if (lane->last_delivered_id <= 0)
				nulls[3] = 'n';
			args[4] = Int64GetDatum(lane->delivered_delta);
			args[5] = Int64GetDatum(lane->dead_delta);
			args[6] = Int32GetDatum(lane->attempts);
			args[7] = Int32GetDatum(lane->last_status);
			args[8] = (Datum) 0;
			args[9] = (Datum) 0;
			if (lane->error_dirty && lane->last_error)
			{
				if (lane->last_status == 0)
					nulls[7] = 'n';
				args[8] = CStringGetTextDatum(lane->last_error);
				args[9] = TimestampTzGetDatum(lane->last_error_at);
			}
			else
			{
				nulls[7] = 'n';
				nulls[8] = 'n';
				nulls[9] = 'n';
			}
			if (SPI_execute_plan(progress_plan, args, nulls, false, 0) != SPI_OK_UPDATE)
				elog(ERROR, "outbox: could not record progress");
		}
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	/* Durable now: forget what was written. */
	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			lane->done_id = relay_lane_done_position(lane);
			lane->delivered_delta = 0;
			lane->dead_delta = 0;
			lane->error_dirty = false;
		}
	}
	while (dead_letters != NULL)
	{
		d = dead_letters;
		dead_letters = d->next;
		pfree(d->target);
		pfree(d->topic);
		if (d->key)
			pfree(d->key);
		pfree(d->last_error);
		pfree(d);
	}
	last_progress_write = GetCurrentTimestamp();
}

/*---- the loop ----*/

/*
 * Choose the messages of the lane's next request (cut_n, cut_bytes,
 * cut_last), so that a batch sent again, after a failure or after a
 * restart, has the same members and so the same webhook-id:
 *  - a batch that failed is sent again as it was;
 *  - a batch recorded in outbox.progress.batch_end (one cut short of
 *    batch_size, as the messages then available allowed) is cut at that id
 *    again, once its messages are all read;
 *  - otherwise up to batch_size messages, fewer if the body would pass
 *    RELAY_MAX_BATCH_BYTES (the first one always goes): both rules give the
 *    same batch whenever the same messages are read.  A batch cut short of
 *    batch_size for want of messages depends on when it was cut, so it is
 *    recorded (cut_record) before it is sent.
 * Returns false when the lane must wait for more of its messages.
 */
static bool
relay_lane_cut(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	int			n = 0;
	Size		bytes = 0;
	bool		by_size = false;

	lane->cut_record = false;
	if (lane->retry_nbatch > 0)
	{
		lane->cut_n = Min(lane->retry_nbatch, lane->nqueued);
		for (; n < lane->cut_n; m = m->next, n++)
		{
			bytes += relay_envelope_size(m);
			lane->cut_last = m->id;
		}
		lane->cut_bytes = bytes;
		return true;
	}
	if (t->batch_size > 1 && lane->batch_end >= m->id)
	{
		/* All of the recorded batch must be queued first. */
		if (lane->tail->id < lane->batch_end &&
			(t->read_id < lane->batch_end ||
			 (lane->overflow_id != 0 && lane->overflow_id <= lane->batch_end)))
			return false;
		for (; m != NULL && m->id <= lane->batch_end && n < t->batch_size; m = m->next, n++)
		{
			bytes += relay_envelope_size(m);
			lane->cut_last = m->id;
		}
		lane->cut_n = n;
		lane->cut_bytes = bytes;
		return true;
	}
	for (; m != NULL && n < t->batch_size; m = m->next, n++)
	{
		Size		add = t->batch_size > 1 ? relay_envelope_size(m) : 0;

		if (n > 0 && bytes + add > RELAY_MAX_BATCH_BYTES)
		{
			by_size = true;
			break;
		}
		bytes += add;
		lane->cut_last = m->id;
	}
	lane->cut_n = n;
	lane->cut_bytes = bytes;
	lane->cut_record = (t->batch_size > 1 && n < t->batch_size && !by_size &&
						progress_has_batch_end);
	return true;
}

/*
 * Record, durably and in one transaction, the batches cut short of
 * batch_size that the lanes in cut[0..n) are about to send.
 */
static void
relay_record_cuts(RelayLane **cut, int n)
{
	static SPIPlanPtr plan = NULL;
	int			i;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "recording outbox batches");
	if (plan == NULL)
	{
		Oid			argtypes[3] = {INT4OID, INT4OID, INT8OID};

		plan = SPI_prepare("UPDATE outbox.progress SET batch_end = $3"
						   " WHERE target_id = $1 AND lane = $2", 3, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the batch query");
		SPI_keepplan(plan);
	}
	for (i = 0; i < n; i++)
	{
		Datum		args[3];

		args[0] = Int32GetDatum(cut[i]->target->id);
		args[1] = Int32GetDatum(cut[i]->index);
		args[2] = Int64GetDatum(cut[i]->cut_last);
		if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not record a batch");
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	/* Durable before the request goes, whatever synchronous_commit says. */
	XLogFlush(XactLastCommitEnd);
	pgstat_report_activity(STATE_IDLE, NULL);
	for (i = 0; i < n; i++)
		cut[i]->batch_end = cut[i]->cut_last;
}

/*
 * Start the lane's next request.  A failure to start it, even an error
 * while preparing it, is the lane's outcome (retried, then a dead letter),
 * never the relay's.
 */
static void
relay_lane_start(RelayLane *lane)
{
	MemoryContext cxt = CurrentMemoryContext;
	RelayOutcome failed;
	volatile bool started = false;
	char	   *volatile error = NULL;

	PG_TRY();
	{
		started = relay_http_send(lane, &failed);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		error = MemoryContextStrdup(relay_cxt, edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	if (error != NULL)
	{
		memset(&failed, 0, sizeof(failed));
		failed.kind = RELAY_RETRY;
		failed.error = error;
		/* The head message alone is retried, then dead-lettered. */
		if (lane->nbatch == 0)
			lane->nbatch = 1;
		lane->retry_nbatch = 0;
	}
	if (!started)
		relay_lane_outcome(lane, &failed);
	if (error != NULL)
		pfree(error);
}

/*
 * Start a request on every idle HTTP lane whose next batch is due; batches
 * that must be recorded first are recorded together, then sent.
 */
static void
relay_dispatch(TimestampTz now)
{
	ListCell   *lc;
	RelayLane **cut = NULL;
	int			ncut = 0;
	int			maxcut = 0;

	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (t->kind == RELAY_NOTIFY)
		{
			/* One lane, delivered in the worker's own transactions. */
			if (t->nqueued > 0 && now >= t->lanes[0].next_attempt)
				relay_notify_deliver(t);
			continue;
		}
		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			if (!relay_lane_may_send(lane, now) || !relay_lane_cut(lane))
				continue;
			if (!lane->cut_record)
			{
				relay_lane_start(lane);
				continue;
			}
			if (ncut == maxcut)
			{
				maxcut = Max(16, maxcut * 2);
				cut = cut ? repalloc(cut, sizeof(RelayLane *) * maxcut) :
					MemoryContextAlloc(relay_cxt, sizeof(RelayLane *) * maxcut);
			}
			cut[ncut++] = lane;
		}
	}
	if (ncut > 0)
	{
		int			i;

		relay_record_cuts(cut, ncut);
		for (i = 0; i < ncut; i++)
			relay_lane_start(cut[i]);
	}
	if (cut)
		pfree(cut);
}

/* Milliseconds the loop may sleep. */
static long
relay_sleep_ms(int64 frontier, TimestampTz now)
{
	long		timeout = outbox_poll_interval;
	long		curl_ms = relay_http_timeout();
	ListCell   *lc;

	if (curl_ms >= 0 && curl_ms < timeout)
		timeout = curl_ms;

	if (!outbox_enabled)
		return timeout;

	foreach(lc, targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (relay_target_wants_read(t, frontier))
			return 0;
		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			if (!lane->in_flight && lane->nqueued > 0 &&
				(t->hold_attempts == 0 || i == t->probe_lane))
			{
				long		ms = (long) ((lane->next_attempt - now + 999) / 1000);

				timeout = Min(timeout, Max(ms, 0));
			}
		}
	}
	return timeout;
}

/*
 * Load the configuration, and say whether commits should wake the worker.
 * Returns the configuration generation loaded.
 */
static uint64
relay_reload_config(void)
{
	uint64		generation = outbox_config_generation();

	relay_load_config();
	outbox_set_worker_wants_commits(targets != NIL && outbox_enabled);
	return generation;
}

/* Whether the extension is installed in this database. */
static bool
relay_extension_ready(void)
{
	bool		ready;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ready = OidIsValid(get_extension_oid("outbox", true));
	CommitTransactionCommand();
	return ready;
}

/*
 * SIGTERM (server shutdown, or pg_terminate_backend): collect the answers
 * already received, record them, and exit.  Requests still unanswered are
 * sent again by the next relay, as they may not have been acknowledged.
 * Exit code 0: the launcher starts a new relay unless the server is
 * stopping.
 */
static void
relay_shutdown(void)
{
	relay_http_drive(relay_lane_outcome);
	if (relay_progress_pending())
		relay_write_progress();
	proc_exit(0);
}

static void
relay_worker_exit(int code, Datum arg)
{
	outbox_set_worker_wants_commits(false);
	outbox_set_worker_latch(NULL);
	/* Close the connections (never called from inside libcurl). */
	relay_http_shutdown();
}

void
outbox_worker_main(Datum main_arg)
{
	WaitEventSet *wait_set;
	WaitEventSet *quiet_set;
	int			quiet_epoll_pos;
	bool		ready = false;
	bool		waiting_logged = false;
	uint64		loaded_generation = 0;
	bool		force_reload = true;

	/* SIGTERM: record what was acknowledged, then exit (relay_shutdown). */
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	/* The launcher (launcher.c) saw the database exist. */
	BackgroundWorkerInitializeConnection(outbox_database, NULL, 0);

	/*
	 * The relay runs as a superuser: whatever search_path the database or a
	 * role sets, every function and operator in its queries must resolve in
	 * pg_catalog (tables are schema-qualified), or whoever can create a
	 * schema and set the database's search_path runs code as superuser.
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET,
					PGC_S_OVERRIDE);
	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\"", outbox_database)));

	relay_cxt = AllocSetContextCreate(TopMemoryContext, "outbox relay",
									  ALLOCSET_DEFAULT_SIZES);

	before_shmem_exit(relay_worker_exit, (Datum) 0);
	outbox_set_worker_latch(MyLatch);

	{
		int			epfd = relay_http_init();

		wait_set = CreateWaitEventSet(TopMemoryContext, 3);
		AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, epfd, NULL, NULL);

		/* The same without the latch, for the pause after a read. */
		quiet_set = CreateWaitEventSet(TopMemoryContext, 2);
		AddWaitEventToSet(quiet_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		quiet_epoll_pos = AddWaitEventToSet(quiet_set, WL_SOCKET_READABLE, epfd, NULL, NULL);
	}

	for (;;)
	{
		WaitEvent	event;
		int64		frontier = 0;
		TimestampTz now;
		long		timeout;
		bool		did_read = false;

		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			relay_shutdown();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			force_reload = true;
		}

		if (!ready)
		{
			ready = relay_extension_ready();
			if (!ready)
			{
				if (!waiting_logged)
					ereport(LOG,
							(errmsg("outbox relay is waiting for the extension to be created in database \"%s\"",
									outbox_database),
							 errhint("Run CREATE EXTENSION outbox in database \"%s\".",
									  outbox_database)));
				waiting_logged = true;
				/* CREATE EXTENSION wakes us when it commits. */
				(void) WaitEventSetWait(wait_set, Min(outbox_poll_interval, 500), &event, 1,
										PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				continue;
			}
			force_reload = true;
		}

		if (force_reload || outbox_config_generation() != loaded_generation)
		{
			force_reload = false;
			if (!relay_extension_ready())
			{
				loaded_generation = outbox_config_generation();
				ready = false;
				waiting_logged = false;
				continue;
			}
			loaded_generation = relay_reload_config();
		}

		if (outbox_enabled && targets != NIL)
		{
			if (!outbox_counter_valid())
			{
				Relation	rel;

				StartTransactionCommand();
				rel = outbox_open_messages(AccessShareLock);
				outbox_ensure_counter(rel);
				table_close(rel, AccessShareLock);
				CommitTransactionCommand();
			}
			frontier = outbox_compute_frontier();
			/* Subscriptions committed before the frontier must be known. */
			if (outbox_config_generation() != loaded_generation)
				loaded_generation = relay_reload_config();
			/* Deliver nothing whose commit is not durable (I7). */
			outbox_flush_commits();
			did_read = relay_read_messages(frontier);
		}

		/* Collect answers, then start what is due on the free lanes. */
		relay_http_drive(relay_lane_outcome);
		if (outbox_enabled)
			relay_dispatch(GetCurrentTimestamp());
		relay_http_drive(relay_lane_outcome);

		/* Let autovacuum and the statistics views see our work. */
		pgstat_report_stat(false);

		now = GetCurrentTimestamp();
		timeout = relay_sleep_ms(frontier, now);
		if (relay_progress_pending())
		{
			/* Write now when idle or due, else wake up when it is due. */
			if (relay_http_in_flight() == 0 ||
				TimestampDifferenceExceeds(last_progress_write, now,
										   RELAY_PROGRESS_INTERVAL_MS))
				relay_write_progress();
			else
				timeout = Min(timeout, RELAY_PROGRESS_INTERVAL_MS);
		}

		if (did_read && timeout > 0)
		{
			long		pause = Min(timeout, RELAY_READ_PAUSE_MS);

			if (WaitEventSetWait(quiet_set, pause, &event, 1, PG_WAIT_EXTENSION) > 0 &&
				event.pos == quiet_epoll_pos)
				continue;
			timeout -= pause;
		}
		if (WaitEventSetWait(wait_set, timeout, &event, 1, PG_WAIT_EXTENSION) > 0 &&
			(event.events & WL_LATCH_SET))
			ResetLatch(MyLatch);
	}
}
