/*-------------------------------------------------------------------------
 *
 * api.c
 *	  SQL-callable entry points and the checks on their input.
 *
 * outbox_emit() refuses everything it cannot honour at the call, not at
 * commit: a library that was not preloaded, the wrong database, a read-only
 * transaction or a standby, a parallel worker, and malformed input.  A
 * refused call raises an error and buffers nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/detoast.h"
#include "access/parallel.h"
#include "access/table.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "common/pg_prng.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_emit);
PG_FUNCTION_INFO_V1(outbox_frontier);
PG_FUNCTION_INFO_V1(outbox_config_changed);
PG_FUNCTION_INFO_V1(outbox_advance_sequence);

/* Refuse to run unless the library was loaded by shared_preload_libraries. */
void
outbox_check_preloaded(const char *what)
{
	if (!outbox_preloaded || !outbox_shmem_ready())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s requires the outbox library to be preloaded", what),
				 errdetail("The commit sequence lives in shared memory, which only a preloaded library can set up."),
				 errhint("Add outbox to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* Refuse to emit where the message could not be stored at commit. */
static void
outbox_check_writable(void)
{
	if (IsParallelWorker() || IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot call outbox_emit() during a parallel operation"),
				 errhint("Call outbox_emit() from a function marked PARALLEL UNSAFE.")));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call outbox_emit() during recovery"),
				 errdetail("A standby server cannot store messages."),
				 errhint("Emit messages on the primary server.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot call outbox_emit() in a read-only transaction"),
				 errhint("Emit messages from a read-write transaction.")));
}

void
outbox_check_topic(text *topic_t, const char **topic, int *topic_len)
{
	int			len = VARSIZE_ANY_EXHDR(topic_t);
	const char *s = VARDATA_ANY(topic_t);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox topic must not be empty"),
				 errhint("Name the topic, for example 'orders.created'.")));
	if (len > OUTBOX_MAX_TOPIC_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("outbox topic is too long"),
				 errdetail("The topic has %d bytes; the limit is %d.",
						   len, OUTBOX_MAX_TOPIC_LEN),
				 errhint("Use a shorter topic name.")));
	outbox_check_text(s, len, OUTBOX_TEXT_TOPIC, "outbox topic");
	outbox_check_topic_grant(s, len);
	*topic = s;
	*topic_len = len;
}

void
outbox_check_key(text *key_t, const char **key, int *key_len)
{
	int			len = VARSIZE_ANY_EXHDR(key_t);
	const char *s = VARDATA_ANY(key_t);

	if (len > OUTBOX_MAX_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("outbox key is too long"),
				 errdetail("The key has %d bytes; the limit is %d.",
						   len, OUTBOX_MAX_KEY_LEN),
				 errhint("Use a shorter key, such as the aggregate's id.")));
	outbox_check_text(s, len, OUTBOX_TEXT_KEY, "outbox key");
	*key = s;
	*key_len = len;
}

/*
 * Headers the relay sets itself, which a message may not override, and
 * those a broker acts on (nats-*); compared as a receiver reads a name,
 * "_" as "-" (webhook_id would reach a CGI receiver as webhook-id).
 */
static bool
outbox_is_reserved_header(const char *name, int len)
{
	static const char *const reserved[] = {
		"content-length", "content-type", "host", "connection",
		"transfer-encoding", "te", "upgrade", "expect", "trailer",
		"keep-alive", "proxy-connection", "user-agent"
	};
	int			i;

	if (outbox_header_name_is(name, len, "webhook-", false) ||
		outbox_header_name_is(name, len, "outbox-", false))
		return true;
	/* JetStream reads these (Nats-Msg-Id, Nats-Expected-*, Nats-Rollup). */
	if (outbox_header_name_is(name, len, "nats-", false))
		return true;
	for (i = 0; i < lengthof(reserved); i++)
		if (outbox_header_name_is(name, len, reserved[i], true))
			return true;
	return false;
}

/* Headers no larger than OUTBOX_MAX_HEADERS_SIZE. */
void
outbox_check_headers_size(Jsonb *headers)
{
	if (VARSIZE(headers) > OUTBOX_MAX_HEADERS_SIZE)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox headers are too large"),
				 errdetail("The headers take %zu bytes; the limit is %d.",
						   (size_t) VARSIZE(headers), OUTBOX_MAX_HEADERS_SIZE),
				 errhint("Move bulky data into the payload.")));
}

/*
 * headers must be a flat JSON object of string values usable as HTTP
 * headers, no larger than OUTBOX_MAX_HEADERS_SIZE.
 */
void
outbox_check_headers(Jsonb *headers)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *name = NULL;
	int			name_len = 0;

	outbox_check_headers_size(headers);

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("outbox headers must be a JSON object"),
				 errhint("Pass headers such as '{\"x-tenant\": \"acme\"}'.")));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			int			i;

			name = v.val.string.val;
			name_len = v.val.string.len;
			if (name_len == 0 || name_len > OUTBOX_MAX_HEADER_NAME_LEN)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox header name must have 1 to %d bytes",
								OUTBOX_MAX_HEADER_NAME_LEN),
						 errhint("Use header names such as \"x-tenant\".")));
			for (i = 0; i < name_len; i++)
				if (!outbox_is_token_char((unsigned char) name[i]))
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("outbox header name \"%.*s\" is not a valid HTTP header name",
									name_len, name),
							 errdetail("Header names may contain only letters, digits and !#$%%&'*+-.^_`|~."),
							 errhint("Use header names such as \"x-tenant\".")));
			if (outbox_is_reserved_header(name, name_len))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox header name \"%.*s\" is reserved",
								name_len, name),
						 outbox_header_name_is(name, name_len, "nats-", false) ?
						 errdetail("NATS JetStream acts on nats-* headers; the relay sets Nats-Msg-Id itself.") :
						 memchr(name, '_', name_len) != NULL ?
						 errdetail("Receivers read \"_\" in a header name as \"-\", so this name stands for a header the relay sets itself.") :
						 errdetail("The relay sets this header itself."),
						 errhint("Choose another header name, for example one starting with \"x-\".")));
		}
		else if (tok == WJB_VALUE)
		{
			pg_wchar	bad;

			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox header \"%.*s\" must have a string value",
								name_len, name),
						 errhint("Quote the value, for example '{\"x-retry\": \"3\"}'.")));
			if (outbox_bad_char(v.val.string.val, v.val.string.len,
								OUTBOX_TEXT_HEADER_VALUE, &bad) > 0)
				outbox_check_text(v.val.string.val, v.val.string.len,
								  OUTBOX_TEXT_HEADER_VALUE,
								  psprintf("outbox header \"%.*s\"", name_len, name));
			if ((name_len == 11 && pg_strncasecmp(name, "traceparent", 11) == 0) ||
				(name_len == 10 && pg_strncasecmp(name, "tracestate", 10) == 0))
			{
				char	   *value = pnstrdup(v.val.string.val, v.val.string.len);
				const char *why;

				if (name_len == 11 ? !outbox_traceparent_valid(value, &why) :
					!outbox_tracestate_valid(value, &why))
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("outbox header \"%.*s\" is not a W3C Trace Context value",
									name_len, name),
							 errdetail("The value \"%.80s\" is refused: %s.", value, why),
							 errhint("Pass the value as OpenTelemetry formats it, or SET LOCAL outbox.traceparent (and outbox.tracestate) instead.")));
			}
		}
	}
}

/* A jsonb payload must fit outbox.max_payload_size; checked before detoasting. */
void
outbox_check_payload_size(Datum payload)
{
	Size		payload_size = toast_raw_datum_size(payload) - VARHDRSZ;

	if (payload_size > (Size) outbox_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("outbox payload is too large"),
				 errdetail("The payload takes %zu bytes as jsonb; outbox.max_payload_size is %d bytes.",
						   payload_size, outbox_max_payload_size),
				 errhint("Send a reference to the data instead, or raise outbox.max_payload_size.")));
}

/* A version 7 UUID: 48 bits of Unix milliseconds, then 74 random bits. */
void
outbox_make_uuid(pg_uuid_t *uuid, TimestampTz now)
{
	uint64		unix_ms;
	uint64		r1;
	uint64		r2;
	int			i;

	unix_ms = (uint64) (now / 1000) +
		(uint64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
	/* Seeded by PostgreSQL in every process. */
	r1 = pg_prng_uint64(&pg_global_prng_state);
	r2 = pg_prng_uint64(&pg_global_prng_state);

	for (i = 0; i < 6; i++)
		uuid->data[i] = (unsigned char) (unix_ms >> (40 - 8 * i));
	uuid->data[6] = 0x70 | (unsigned char) (r1 & 0x0f);
	uuid->data[7] = (unsigned char) (r1 >> 8);
	uuid->data[8] = 0x80 | (unsigned char) (r2 & 0x3f);
	for (i = 9; i < 16; i++)
		uuid->data[i] = (unsigned char) (r2 >> (8 * (i - 8)));
}

/*
 * outbox_emit(topic text, payload jsonb, key text, headers jsonb) -> uuid
 *
 * Buffer a message in the current transaction.  It is stored, with a
 * commit-ordered id, if and only if the transaction commits.
 */
Datum
outbox_emit(PG_FUNCTION_ARGS)
{
	OutboxMessage msg;
	pg_uuid_t  *result;
	Jsonb	   *payload;

	outbox_check_preloaded("outbox_emit()");
	outbox_check_writable();
	outbox_check_database("outbox_emit()");
	/* Ids exhausted: fail at the call rather than at COMMIT. */
	if (outbox_counter_valid())
		outbox_check_ids_left(1);

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox topic must not be null"),
				 errhint("Name the topic, for example 'orders.created'.")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("outbox payload must not be null"),
				 errhint("Pass 'null'::jsonb or '{}' for a message without a body.")));

	memset(&msg, 0, sizeof(msg));
	msg.commit_time_off = -1;
	outbox_check_topic(PG_GETARG_TEXT_PP(0), &msg.topic, &msg.topic_len);

	outbox_check_payload_size(PG_GETARG_DATUM(1));
	payload = PG_GETARG_JSONB_P(1);
	msg.payload = (struct varlena *) payload;

	if (!PG_ARGISNULL(2))
		outbox_check_key(PG_GETARG_TEXT_PP(2), &msg.key, &msg.key_len);

	{
		Jsonb	   *headers = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);

		if (headers != NULL)
			outbox_check_headers(headers);
		/* the transaction's trace, unless the headers name their own */
		if (outbox_trace_active())
		{
			headers = outbox_trace_add_current(headers);
			outbox_check_headers_size(headers);	/* the rest was checked */
		}
		msg.headers = (struct varlena *) headers;
	}

	msg.emitted_at = GetCurrentTimestamp();
	outbox_make_uuid(&msg.msg_id, msg.emitted_at);

	outbox_buffer_append(&msg);

	result = palloc(sizeof(pg_uuid_t));
	*result = msg.msg_id;
	PG_RETURN_UUID_P(result);
}

/*
 * outbox.frontier() -> bigint
 *
 * The highest id at or below which no message can still become visible.
 * Messages up to it are also durable: WAL is flushed past their commit
 * records before the value is returned (invariant I7), so a reader that
 * acts on them never acts on a commit a crash could undo.
 *
 * Read the messages in a statement that starts after this one returned, so
 * that its snapshot is taken after the frontier was computed.
 */
Datum
outbox_frontier(PG_FUNCTION_ARGS)
{
	int64		frontier;

	outbox_check_preloaded("outbox.frontier()");
	outbox_check_database("outbox.frontier()");
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.frontier() cannot be used during recovery"),
				 errdetail("Transactions still in progress on the primary can commit messages below any frontier a standby could compute."),
				 errhint("Call outbox.frontier() on the primary server.")));

	if (!outbox_counter_valid())
	{
		Relation	rel = outbox_open_messages(AccessShareLock);

		outbox_ensure_counter(rel);
		table_close(rel, AccessShareLock);
	}

	frontier = outbox_compute_frontier();

	/* Make every commit at or below the frontier durable (I7). */
	outbox_flush_commits();

	PG_RETURN_INT64(frontier);
}

/*
 * outbox.config_changed() -> void
 *
 * Called by the target and subscription functions: wake the relay worker to
 * reload its configuration when the current transaction commits.
 */
Datum
outbox_config_changed(PG_FUNCTION_ARGS)
{
	outbox_check_preloaded("outbox.config_changed()");
	/* CREATE EXTENSION and the target functions: ERROR when no slot is free */
	if (outbox_this_database_served())
		outbox_db_attach();
	outbox_note_config_change();
	PG_RETURN_VOID();
}

/*
 * outbox.advance_sequence(highest bigint) -> void
 *
 * Called by the trigger that fires when rows are inserted into
 * outbox.messages directly (pg_restore, COPY): new ids continue above them.
 * Does nothing when the library is not preloaded.
 */
Datum
outbox_advance_sequence(PG_FUNCTION_ARGS)
{
	/*
	 * Without the preloaded library there is no counter to advance (a
	 * restore into a server not set up yet): the initialisation after the
	 * next start with the library finds the rows.
	 */
	if (outbox_preloaded && outbox_shmem_ready())
		outbox_counter_advance(PG_GETARG_INT64(0));
	PG_RETURN_VOID();
}
