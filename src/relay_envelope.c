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
#include "commands/dbcommands.h"
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
#include "utils/numeric.h"
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
	appendBinaryStringInfo(buf, "{\"id\":\"", 7);
	appendBinaryStringInfo(buf, m->msg_id, RELAY_UUID_LEN);
	appendBinaryStringInfo(buf, "\",\"seq\":", 8);
	relay_append_int64(buf, m->id);
	appendBinaryStringInfo(buf, ",\"topic\":", 9);
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
relay_envelope_size(RelayTarget *t, RelayMessage *m)
{
	Size		size = (Size) m->payload_len + (m->headers ? strlen(m->headers) : 0) +
		6 * (strlen(m->topic) + (m->key ? strlen(m->key) : 0)) + 256;

	/* a CloudEvent: the key twice, the source, the trace, the attributes */
	if (t->format != RELAY_FORMAT_OUTBOX)
		size += 6 * ((m->key ? strlen(m->key) : 0) + strlen(t->ce_source)) +
			2 * OUTBOX_TRACESTATE_MAX + 512;
	return size;
}

/*
 * Append s (len bytes, UTF-8) as a JSON string, escaped exactly as
 * escape_json() does, but copying each run of bytes that need no escape
 * at once instead of byte by byte.
 */
void
relay_json_string(StringInfo buf, const char *s, int len)
{
	const char *end = s + len;

	/* room for the common case: nothing to escape */
	enlargeStringInfo(buf, len + 2);
	buf->data[buf->len++] = '"';
	while (s < end)
	{
		const char *run = s;
		unsigned char c;

		while (s < end && (unsigned char) *s >= 0x20 && *s != '"' && *s != '\\')
			s++;
		if (s > run)
			appendBinaryStringInfo(buf, run, s - run);
		if (s == end)
			break;
		c = (unsigned char) *s++;
		switch (c)
		{
			case '\b':
				appendBinaryStringInfo(buf, "\\b", 2);
				break;
			case '\f':
				appendBinaryStringInfo(buf, "\\f", 2);
				break;
			case '\n':
				appendBinaryStringInfo(buf, "\\n", 2);
				break;
			case '\r':
				appendBinaryStringInfo(buf, "\\r", 2);
				break;
			case '\t':
				appendBinaryStringInfo(buf, "\\t", 2);
				break;
			case '"':
				appendBinaryStringInfo(buf, "\\\"", 2);
				break;
			case '\\':
				appendBinaryStringInfo(buf, "\\\\", 2);
				break;
			default:
				{
					static const char hex[] = "0123456789abcdef";
					char		u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};

					appendBinaryStringInfo(buf, u, 6);
				}
				break;
		}
	}
	appendStringInfoChar(buf, '"');
}

/*
 * A numeric's stored form (the on-disk format, the same in every supported
 * version; numeric.c keeps its macros to itself): after the varlena header,
 * a 16-bit word, then for the long form a 16-bit weight, then the digits, in
 * base 10000, most significant first.  The short form packs the sign, the
 * display scale and a 7-bit weight into the word.
 */
#define RELAY_NUM_FORM_MASK			0xC000
#define RELAY_NUM_POS				0x0000
#define RELAY_NUM_NEG				0x4000
#define RELAY_NUM_SHORT				0x8000
#define RELAY_NUM_SHORT_NEG			0x2000
#define RELAY_NUM_SHORT_DSCALE_MASK	0x1F80
#define RELAY_NUM_SHORT_DSCALE_SHIFT 7
#define RELAY_NUM_SHORT_WEIGHT_NEG	0x0040
#define RELAY_NUM_SHORT_WEIGHT_MASK	0x003F
#define RELAY_NUM_DSCALE_MASK		0x3FFF

/* Append the four decimal digits of a base-10000 digit, or fewer when lead. */
static inline char *
relay_numeric_group(char *p, int dig, bool lead)
{
	int			div;

	for (div = 1000; div > 1; div /= 10)
	{
		int			d = dig / div;

		dig -= d * div;
		if (d > 0 || !lead)
		{
			*p++ = '0' + d;
			lead = false;
		}
	}
	*p++ = '0' + dig;
	return p;
}

/*
 * Append a numeric as numeric_out() writes it (every digit before the point,
 * a leading zero when there is none, then exactly the display scale's digits
 * after it), straight from its stored form: numeric_out() builds a
 * variable, a string and a copy per number.  Anything but the plain forms
 * (NaN and infinities, a short or toasted varlena, a digit out of range) is
 * left to numeric_out().
 */
static void
relay_append_numeric(StringInfo buf, Numeric num)
{
	const char *data;
	Size		size;
	uint16		word;
	int16		w;
	bool		neg;
	int			weight;
	int			dscale;
	int			ndigits;
	const char *digits;
	int			d;
	int			i;
	char	   *p;

	if (VARATT_IS_EXTENDED(num))
		goto slow;
	size = VARSIZE(num) - VARHDRSZ;
	data = VARDATA(num);
	if (size < sizeof(uint16))
		goto slow;
	memcpy(&word, data, sizeof(uint16));
	switch (word & RELAY_NUM_FORM_MASK)
	{
		case RELAY_NUM_SHORT:
			neg = (word & RELAY_NUM_SHORT_NEG) != 0;
			dscale = (word & RELAY_NUM_SHORT_DSCALE_MASK) >> RELAY_NUM_SHORT_DSCALE_SHIFT;
			weight = word & RELAY_NUM_SHORT_WEIGHT_MASK;
			if (word & RELAY_NUM_SHORT_WEIGHT_NEG)
				weight -= RELAY_NUM_SHORT_WEIGHT_MASK + 1;
			digits = data + sizeof(uint16);
			ndigits = (size - sizeof(uint16)) / sizeof(int16);
			break;
		case RELAY_NUM_POS:
		case RELAY_NUM_NEG:
			if (size < 2 * sizeof(uint16))
				goto slow;
			neg = (word & RELAY_NUM_FORM_MASK) == RELAY_NUM_NEG;
			dscale = word & RELAY_NUM_DSCALE_MASK;
			memcpy(&w, data + sizeof(uint16), sizeof(int16));
			weight = w;
			digits = data + 2 * sizeof(uint16);
			ndigits = (size - 2 * sizeof(uint16)) / sizeof(int16);
			break;
		default:
			goto slow;
	}
	for (i = 0; i < ndigits; i++)
	{
		int16		dig;

		memcpy(&dig, digits + i * sizeof(int16), sizeof(int16));
		if (dig < 0 || dig > 9999)
			goto slow;
	}

	/* sign, digits before the point (4 a group), point, dscale digits */
	enlargeStringInfo(buf, 1 + 4 * (Max(weight, 0) + 1) + 1 + dscale + 4);
	p = buf->data + buf->len;
	if (neg)
		*p++ = '-';
	if (weight < 0)
	{
		*p++ = '0';
		d = weight + 1;
	}
	else
	{
		for (d = 0; d <= weight; d++)
		{
			int16		dig = 0;

			if (d < ndigits)
				memcpy(&dig, digits + d * sizeof(int16), sizeof(int16));
			p = relay_numeric_group(p, dig, d == 0);
		}
	}
	if (dscale > 0)
	{
		char	   *end;

		*p++ = '.';
		end = p + dscale;
		for (i = 0; i < dscale; d++, i += 4)
		{
			int16		dig = 0;

			if (d >= 0 && d < ndigits)
				memcpy(&dig, digits + d * sizeof(int16), sizeof(int16));
			p = relay_numeric_group(p, dig, false);
		}
		p = end;
	}
	buf->len = p - buf->data;
	buf->data[buf->len] = '\0';
	return;

slow:
	{
		char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out,
															   NumericGetDatum(num)));

		appendStringInfoString(buf, text);
		pfree(text);
	}
}

/* Append one scalar of a jsonb, as JsonbToCString() writes it. */
static void
relay_jsonb_scalar(StringInfo buf, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			appendBinaryStringInfo(buf, "null", 4);
			break;
		case jbvString:
			relay_json_string(buf, v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			relay_append_numeric(buf, v->val.numeric);
			break;
		case jbvBool:
			if (v->val.boolean)
				appendBinaryStringInfo(buf, "true", 4);
			else
				appendBinaryStringInfo(buf, "false", 5);
			break;
		default:
			elog(ERROR, "unexpected jsonb value type %d in a stored document", (int) v->type);
	}
}

/*
 * Append the JSON text of a jsonb document, byte for byte what
 * JsonbToCString() (so jsonb_out, payload::text) gives: ", " between
 * members and elements, ": " after keys, a raw scalar alone.  It is the
 * relay's per-message conversion of payloads and headers, written out
 * here because JsonbToCString() copies every string and escapes it byte by
 * byte, which was a fifth of the relay's CPU into Redis.
 */
void
relay_jsonb_text(StringInfo buf, Jsonb *jb)
{
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbIteratorToken type;
	JsonbValue	v;
	bool		first = true;
	bool		raw_scalar = false;

	while ((type = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (type)
		{
			case WJB_BEGIN_ARRAY:
				if (!first)
					appendBinaryStringInfo(buf, ", ", 2);
				if (v.val.array.rawScalar)
					raw_scalar = true;
				else
					appendStringInfoChar(buf, '[');
				first = true;
				break;
			case WJB_BEGIN_OBJECT:
				if (!first)
					appendBinaryStringInfo(buf, ", ", 2);
				appendStringInfoChar(buf, '{');
				first = true;
				break;
			case WJB_KEY:
				if (!first)
					appendBinaryStringInfo(buf, ", ", 2);
				relay_jsonb_scalar(buf, &v);
				appendBinaryStringInfo(buf, ": ", 2);
				/* a container value follows with no separator */
				first = true;
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				if (!first)
					appendBinaryStringInfo(buf, ", ", 2);
				relay_jsonb_scalar(buf, &v);
				first = false;
				break;
			case WJB_END_ARRAY:
				if (!raw_scalar)
					appendStringInfoChar(buf, ']');
				first = false;
				break;
			case WJB_END_OBJECT:
				appendStringInfoChar(buf, '}');
				first = false;
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) type);
		}
	}
}

/* Append v in decimal (what appendStringInfo's INT64_FORMAT gives, faster). */
void
relay_append_int64(StringInfo buf, int64 v)
{
	enlargeStringInfo(buf, MAXINT8LEN + 1);
	buf->len += pg_lltoa(v, buf->data + buf->len);
}

/*
 * Append t as a JSON string, the way to_json() writes a timestamptz.  The
 * text of the whole second is kept, with the place its fraction goes (just
 * before the time zone offset, which cannot change within a second): the
 * messages of a request were mostly emitted within the same second, and
 * converting to the local time is most of the cost.
 */
void
relay_append_time(StringInfo buf, TimestampTz t)
{
	static TimestampTz second_at = DT_NOBEGIN;
	static pg_tz *second_tz = NULL;
	static char second_text[MAXDATELEN + 1];
	static int	second_split = -1;	/* where the fraction goes; -1: nowhere */
	char		text[MAXDATELEN + 1];
	TimestampTz second;
	int64		fraction;

	if (TIMESTAMP_NOT_FINITE(t))
		goto whole;
	fraction = t % USECS_PER_SEC;
	if (fraction < 0)
		fraction += USECS_PER_SEC;
	second = t - fraction;
	if (second != second_at || session_timezone != second_tz)
	{
		char	   *time_at;
		char	   *zone;

		/* kept only once made: the conversion may fail (out of range) */
		JsonEncodeDateTime(text, TimestampTzGetDatum(second), TIMESTAMPTZOID, NULL);
		strlcpy(second_text, text, sizeof(second_text));
		second_at = second;
		second_tz = session_timezone;
		/* the offset's sign is the first after the date's 'T' */
		time_at = strchr(second_text, 'T');
		zone = time_at ? strpbrk(time_at, "+-") : NULL;
		second_split = zone ? (int) (zone - second_text) : -1;
	}
	if (second_split < 0)
		goto whole;
	appendStringInfoChar(buf, '"');
	appendBinaryStringInfo(buf, second_text, second_split);
	if (fraction != 0)
	{
		char		digits[8];
		int			n = 6;
		int			i;

		/* six digits, trailing zeros left out */
		for (i = 5; i >= 0; i--)
		{
			digits[i] = '0' + fraction % 10;
			fraction /= 10;
		}
		while (digits[n - 1] == '0')
			n--;
		appendStringInfoChar(buf, '.');
		appendBinaryStringInfo(buf, digits, n);
	}
	appendStringInfoString(buf, second_text + second_split);
	appendStringInfoChar(buf, '"');
	return;

whole:
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
 * Whether template is a key template of a broker target (a Redis stream,
 * a RabbitMQ routing key): at most maxlen bytes (and some, unless
 * allow_empty), no control characters, {topic} and {key} the only braces.
 * Returns why not, or NULL.
 */
const char *
relay_template_check(const char *template, int maxlen, bool allow_empty)
{
	const char *s;

	if (template == NULL)
		return "it is NULL";
	if (*template == '\0' && !allow_empty)
		return "it is empty";
	if (strlen(template) > (size_t) maxlen)
		return psprintf("it is longer than %d bytes", maxlen);
	for (s = template; *s; s++)
	{
		if (*s == '{')
		{
			if (strncmp(s, "{topic}", 7) == 0)
				s += 6;
			else if (strncmp(s, "{key}", 5) == 0)
				s += 4;
			else
				return "only {topic} and {key} may stand in braces";
			continue;
		}
		if (*s == '}')
			return "only {topic} and {key} may stand in braces";
		if ((unsigned char) *s < 0x20 || *s == 0x7f)
			return "it has a control character";
	}
	return NULL;
}

/*
 * Whether a template takes part of a message's destination from the
 * message ({topic} or {key}): then a destination the broker does not take
 * is the message's doing, not the target's (RELAY_UNROUTABLE).
 */
bool
relay_template_filled(const char *template)
{
	return template != NULL &&
		(strstr(template, "{topic}") != NULL || strstr(template, "{key}") != NULL);
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

/*
 * The value of the message's own header name ("Name: value" lines), or
 * NULL; "" for an empty one.  Names are matched case-insensitively.
 */
const char *
relay_message_header(RelayMessage *m, const char *name)
{
	size_t		len = strlen(name);
	const char *p;

	for (p = m->header_lines; p != NULL && *p; p += strlen(p) + 1)
		if (pg_strncasecmp(p, name, len) == 0)
		{
			if (p[len] == ':')
				return p[len + 1] == ' ' ? p + len + 2 : p + len + 1;
			if (p[len] == ';' && p[len + 1] == '\0')
				return "";
		}
	return NULL;
}

/*
 * The CloudEvents source of a target without one: /outbox/<the cluster's
 * system identifier>/<the database name, percent-encoded>.  The system
 * identifier is the same on a streaming standby, so the source survives a
 * failover.  Made once, in the relay's memory.
 */
const char *
relay_ce_default_source(void)
{
	static char *source = NULL;

	if (source == NULL)
	{
		StringInfoData buf;
		const char *db = get_database_name(MyDatabaseId);
		const unsigned char *p;

		initStringInfo(&buf);
		appendStringInfo(&buf, "/outbox/" UINT64_FORMAT "/", GetSystemIdentifier());
		for (p = (const unsigned char *) (db ? db : ""); *p; p++)
		{
			if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
				(*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~')
				appendStringInfoChar(&buf, (char) *p);
			else
				appendStringInfo(&buf, "%%%02X", *p);
		}
		source = MemoryContextStrdup(TopMemoryContext, buf.data);
		pfree(buf.data);
	}
	return source;
}

/*
 * The CloudEvents attributes of message m for target t: specversion, id
 * (the stable msg_id), source, type (the topic), time (when it was
 * emitted), datacontenttype, the sequence extension (the commit-ordered id,
 * zero-padded to 19 digits so that it orders as a string, as the extension
 * asks), and when the message has a key subject and partitionkey (the key),
 * and when it has a trace, traceparent and tracestate.  Values point into
 * m, t and a.
 */
/* Write n digits of v, zero-padded, at p; returns the end. */
static char *
ce_digits(char *p, uint64 v, int n)
{
	int			i;

	for (i = n - 1; i >= 0; i--)
	{
		p[i] = '0' + (char) (v % 10);
		v /= 10;
	}
	return p + n;
}

/*
 * t as RFC 3339 in UTC with microseconds, "2026-12-03T11:08:43.185470Z",
 * into out (MAXDATELEN + 1 bytes).  Written by hand: the time zone and
 * the general formatter cost more than the rest of a CloudEvent.
 */
static void
ce_format_time(TimestampTz t, char *out)
{
	struct pg_tm tm;
	fsec_t		fsec;
	char	   *p = out;

	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0 ||
		tm.tm_year < 1 || tm.tm_year > 9999)
	{
		/* out of RFC 3339's range: as to_json() writes it */
		JsonEncodeDateTime(out, TimestampTzGetDatum(t), TIMESTAMPTZOID, NULL);
		return;
	}
	p = ce_digits(p, tm.tm_year, 4);
	*p++ = '-';
	p = ce_digits(p, tm.tm_mon, 2);
	*p++ = '-';
	p = ce_digits(p, tm.tm_mday, 2);
	*p++ = 'T';
	p = ce_digits(p, tm.tm_hour, 2);
	*p++ = ':';
	p = ce_digits(p, tm.tm_min, 2);
	*p++ = ':';
	p = ce_digits(p, tm.tm_sec, 2);
	*p++ = '.';
	p = ce_digits(p, fsec, 6);
	*p++ = 'Z';
	*p = '\0';
}

void
relay_ce_attrs(RelayTarget *t, RelayMessage *m, RelayCeAttrs *a)
{
	const char *v;

#define CE_ADD(n_, v_, safe_) \
	do { a->name[a->n] = (n_); a->value[a->n] = (v_); a->safe[a->n] = (safe_); a->n++; } while (0)
	a->n = 0;
	*ce_digits(a->sequence, m->id < 0 ? 0 : (uint64) m->id, 19) = '\0';
	ce_format_time(m->emitted_at, a->time);
	CE_ADD("specversion", "1.0", true);
	CE_ADD("id", m->msg_id, true);
	CE_ADD("source", t->ce_source, false);
	CE_ADD("type", m->topic, false);
	CE_ADD("time", a->time, true);
	CE_ADD("datacontenttype", "application/json", true);
	CE_ADD("sequence", a->sequence, true);
	if (m->key != NULL && m->key[0] != '\0')
	{
		CE_ADD("subject", m->key, false);
		CE_ADD("partitionkey", m->key, false);
	}
	v = m->header_lines ? relay_message_header(m, "traceparent") : NULL;
	if (v != NULL && *v != '\0')
	{
		CE_ADD("traceparent", v, false);
		v = relay_message_header(m, "tracestate");
		if (v != NULL && *v != '\0')
			CE_ADD("tracestate", v, false);
	}
#undef CE_ADD
	Assert(a->n <= RELAY_CE_MAX_ATTRS);
}

/*
 * Whether a message header ("Name: value" or "Name;") is one a CloudEvent's
 * binding owns, which the relay leaves out on a CloudEvents target: an
 * attribute (ce-*, or ce_* as Kafka writes them and as a receiver that
 * reads "_" as "-" takes it) or content-type.
 */
bool
relay_ce_owned_header(const char *line)
{
	int			len = strcspn(line, ":;");

	return outbox_header_name_is(line, len, "ce-", false) ||
		outbox_header_name_is(line, len, "content-type", true);
}

/*
 * Append message m as a CloudEvent in structured content mode (JSON, the
 * payload as data) to buf.
 */
void
relay_ce_structured(RelayTarget *t, RelayMessage *m, StringInfo buf)
{
	RelayCeAttrs a;
	int			i;

	relay_ce_attrs(t, m, &a);
	appendStringInfoChar(buf, '{');
	for (i = 0; i < a.n; i++)
	{
		/* the names, and the values marked safe, need no escaping */
		appendStringInfoChar(buf, '"');
		appendStringInfoString(buf, a.name[i]);
		appendStringInfoString(buf, "\":");
		if (a.safe[i])
		{
			appendStringInfoChar(buf, '"');
			appendStringInfoString(buf, a.value[i]);
			appendStringInfoString(buf, "\",");
		}
		else
		{
			escape_json(buf, a.value[i]);
			appendStringInfoChar(buf, ',');
		}
	}
	appendStringInfoString(buf, "\"data\":");
	appendBinaryStringInfo(buf, m->payload, m->payload_len);
	appendStringInfoChar(buf, '}');
}

/*
 * Append an attribute value as the HTTP binding has it in a ce- header:
 * printable ASCII as is, but space, '"' and '%', and every byte outside
 * U+0021-U+007E (the UTF-8 of other characters), percent-encoded.
 */
void
relay_ce_http_value(const char *value, StringInfo buf)
{
	const unsigned char *p;

	for (p = (const unsigned char *) value; *p; p++)
	{
		if (*p < 0x21 || *p > 0x7e || *p == '"' || *p == '%')
			appendStringInfo(buf, "%%%02X", *p);
		else
			appendStringInfoChar(buf, (char) *p);
	}
}
