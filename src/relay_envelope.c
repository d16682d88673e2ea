/*-------------------------------------------------------------------------
 *
 * relay_envelope.c
 *	  What the relay writes about a message: JSON envelopes (batch bodies,
 *	  NOTIFY payloads), header lines, uuids and timestamps as text.
 *
 * Pure formatting in the caller's memory; nothing here touches lanes,
 * tables or the network.  Envelopes are built in C from the payload's jsonb
 * text output, not through SQL JSON functions, which would cost a round of
 * executor work per message.
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

/*
 * "Name: value" lines of a headers object, NUL-separated and ended by an
 * empty string, for HTTP requests.
 */
char *
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
			pg_wchar	bad;
			int			blank = 0;

			/*
			 * outbox_emit() refuses such values; a message stored by an
			 * earlier version may hold one.  It is not sent raw: the error
			 * makes the message a dead letter (relay_read.c).
			 */
			if (outbox_bad_char(v.val.string.val, v.val.string.len,
								OUTBOX_TEXT_HEADER_VALUE, &bad) > 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("outbox header value of the message holds U+%04X, which HTTP headers cannot carry",
								(unsigned int) bad)));
			/*
			 * "Name;" sends an empty header; "Name:" (or "Name:" and white
			 * space only) would remove one.
			 */
			while (blank < v.val.string.len &&
				   (v.val.string.val[blank] == ' ' || v.val.string.val[blank] == '\t'))
				blank++;
			if (blank == v.val.string.len)
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
void
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
 * Fill in a broker target's template (a NATS subject, a Kafka topic):
 * {topic} with the message's topic, {key} with its key.  Returns false,
 * with buf holding nothing usable, when it has {key} and the message no
 * key.
 */
bool
relay_template_fill(const char *template, RelayMessage *m, StringInfo buf)
{
	const char *p;

	resetStringInfo(buf);
	for (p = template; *p; p++)
	{
		if (*p == '{' && strncmp(p, "{topic}", 7) == 0)
		{
			appendStringInfoString(buf, m->topic);
			p += 6;
		}
		else if (*p == '{' && strncmp(p, "{key}", 5) == 0)
		{
			if (m->key == NULL || m->key[0] == '\0')
				return false;
			appendStringInfoString(buf, m->key);
			p += 4;
		}
		else
			appendStringInfoChar(buf, *p);
	}
	return true;
}
