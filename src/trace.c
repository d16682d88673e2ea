/*-------------------------------------------------------------------------
 *
 * trace.c
 *	  W3C Trace Context: the trace of the transaction that wrote a message.
 *
 * A transaction names its trace with two settings, usually SET LOCAL by
 * the application's tracing instrumentation:
 *
 *	  outbox.traceparent  "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>"
 *	  outbox.tracestate   the vendors' list, "key=value,..." (optional)
 *
 * Every message the transaction emits, and every change trigger capture
 * makes a message of, gets them as its traceparent and tracestate headers
 * (a message whose headers already name a traceparent keeps its own).  WAL
 * capture cannot see a session's settings: at commit, a transaction that
 * set a trace and wrote something, in a database with a WAL capture slot,
 * writes them into its own WAL as a transactional logical message, which
 * the capture worker decodes with the transaction's changes
 * (capture_slot.c, capture_plugin.c).  A transaction that sets no trace pays one test of a
 * string at commit and nothing else.
 *
 * Values are checked against the W3C grammar wherever they come from (the
 * settings, a message's headers, the WAL): a malformed one is refused with
 * the rule it breaks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/guc.h"
#include "utils/jsonb.h"

#include "outbox.h"

char	   *outbox_traceparent = NULL;
char	   *outbox_tracestate = NULL;
uint64		outbox_trace_generation = 0;	/* bumped when either changes */

static bool
trace_is_lower_hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* Whether s[0..n) is lower-case hex, and not all zeros when nonzero. */
static bool
trace_hex_field(const char *s, int n, bool nonzero, const char **why,
				const char *what)
{
	bool		zero = true;
	int			i;

	for (i = 0; i < n; i++)
	{
		if (!trace_is_lower_hex(s[i]))
		{
			*why = psprintf("its %s is not %d lower-case hexadecimal digits", what, n);
			return false;
		}
		if (s[i] != '0')
			zero = false;
	}
	if (nonzero && zero)
	{
		*why = psprintf("its %s is all zeros, which W3C Trace Context makes invalid", what);
		return false;
	}
	return true;
}

/*
 * Whether s is a traceparent header value: version 00 exactly
 * "00-<trace-id>-<parent-id>-<flags>"; a later version (01 to fe) the same
 * 55 characters, then nothing or "-" and more printable ASCII, as the
 * specification has parsers accept future versions.  Otherwise false, with
 * *why (palloc'd) saying which rule is broken.
 */
bool
outbox_traceparent_valid(const char *s, const char **why)
{
	size_t		len = strlen(s);
	size_t		i;

	if (len < OUTBOX_TRACEPARENT_LEN)
	{
		*why = psprintf("it has %zu characters, and a traceparent has %d: 00-<32 hex digits>-<16 hex digits>-<2 hex digits>",
						len, OUTBOX_TRACEPARENT_LEN);
		return false;
	}
	if (s[2] != '-' || s[35] != '-' || s[52] != '-')
	{
		*why = "its fields are not separated by \"-\" at the places the format has them";
		return false;
	}
	if (!trace_hex_field(s, 2, false, why, "version"))
		return false;
	if (strncmp(s, "ff", 2) == 0)
	{
		*why = "version ff is invalid";
		return false;
	}
	if (!trace_hex_field(s + 3, 32, true, why, "trace-id") ||
		!trace_hex_field(s + 36, 16, true, why, "parent-id") ||
		!trace_hex_field(s + 53, 2, false, why, "trace-flags"))
		return false;
	if (strncmp(s, "00", 2) == 0 && len != OUTBOX_TRACEPARENT_LEN)
	{
		*why = psprintf("version 00 has exactly %d characters, not %zu",
						OUTBOX_TRACEPARENT_LEN, len);
		return false;
	}
	if (len > OUTBOX_TRACEPARENT_LEN)
	{
		if (s[OUTBOX_TRACEPARENT_LEN] != '-' || len > OUTBOX_TRACESTATE_MAX)
		{
			*why = "what follows the flags of a later version must start with \"-\" and be short";
			return false;
		}
		for (i = OUTBOX_TRACEPARENT_LEN; i < len; i++)
			if (s[i] < 0x21 || s[i] > 0x7e)
			{
				*why = "it holds a character that is not printable ASCII";
				return false;
			}
	}
	return true;
}

static bool
trace_key_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		c == '_' || c == '-' || c == '*' || c == '/';
}

/*
 * Whether s is a tracestate header value: at most 32 members separated by
 * commas (spaces and tabs around them allowed, empty members skipped),
 * each key=value with the specification's key (lcalpha, then up to 255 of
 * lcalpha, digits, "_-*\/"; or tenant@system) and value (up to 256
 * printable ASCII characters but "," and "=", not ending in a space);
 * at most OUTBOX_TRACESTATE_MAX bytes in all.
 */
bool
outbox_tracestate_valid(const char *s, const char **why)
{
	const char *p = s;
	int			members = 0;

	if (strlen(s) > OUTBOX_TRACESTATE_MAX)
	{
		*why = psprintf("it has more than %d bytes", OUTBOX_TRACESTATE_MAX);
		return false;
	}
	while (*p)
	{
		const char *key;
		const char *at = NULL;
		const char *val;
		const char *end;
		const char *q;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == ',')
		{
			p++;
			continue;
		}
		if (*p == '\0')
			break;
		key = p;
		while (*p && *p != '=' && *p != ',')
		{
			if (*p == '@' && at == NULL)
				at = p;
			else if (!trace_key_char(*p))
			{
				*why = psprintf("member %d's key holds \"%c\", which keys may not have (lower-case letters, digits and _-*/, or tenant@system)",
								members + 1, *p);
				return false;
			}
			p++;
		}
		if (*p != '=' || p == key || (at == NULL && !(*key >= 'a' && *key <= 'z')) ||
			(at != NULL && (at == key || at + 1 == p || !(at[1] >= 'a' && at[1] <= 'z') ||
							at - key > 241 || p - at - 1 > 14)) ||
			(at == NULL && p - key > 256))
		{
			*why = psprintf("member %d is not key=value with a valid key (a key starts with a lower-case letter, or is tenant@system)",
							members + 1);
			return false;
		}
		val = ++p;
		while (*p && *p != ',')
			p++;
		end = p;
		/* white space before the comma belongs to the list, not the value */
		while (end > val && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (end == val || end - val > 256)
		{
			*why = psprintf("member %d's value is empty or longer than 256 characters", members + 1);
			return false;
		}
		for (q = val; q < end; q++)
			if (*q < 0x20 || *q > 0x7e || *q == '=')
			{
				*why = psprintf("member %d's value holds a character values may not have (printable ASCII but \",\" and \"=\")",
								members + 1);
				return false;
			}
		if (++members > 32)
		{
			*why = "it has more than 32 members";
			return false;
		}
	}
	return true;
}

static bool
trace_check_traceparent(char **newval, void **extra, GucSource source)
{
	const char *why;

	if (*newval == NULL || (*newval)[0] == '\0' || outbox_traceparent_valid(*newval, &why))
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("The value is not a W3C Trace Context traceparent: %s.", why);
	GUC_check_errhint("Set it as OpenTelemetry formats one, for example '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', or to '' for none.");
	return false;
}

static bool
trace_check_tracestate(char **newval, void **extra, GucSource source)
{
	const char *why;

	if (*newval == NULL || (*newval)[0] == '\0' || outbox_tracestate_valid(*newval, &why))
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("The value is not a W3C Trace Context tracestate: %s.", why);
	GUC_check_errhint("Set it as OpenTelemetry formats one, for example 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7', or to '' for none.");
	return false;
}

static void
trace_assign(const char *newval, void *extra)
{
	outbox_trace_generation++;
}

void
outbox_trace_define_gucs(void)
{
	DefineCustomStringVariable("outbox.traceparent",
							   "W3C traceparent given to the messages this transaction emits and captures.",
							   "Usually SET LOCAL by tracing instrumentation; '' for none.",
							   &outbox_traceparent,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   trace_check_traceparent, trace_assign, NULL);
	DefineCustomStringVariable("outbox.tracestate",
							   "W3C tracestate that goes with outbox.traceparent.",
							   "Sent only with a traceparent; '' for none.",
							   &outbox_tracestate,
							   "",
							   PGC_USERSET,
							   GUC_NOT_IN_SAMPLE,
							   trace_check_tracestate, trace_assign, NULL);
}

/* Whether the session names a trace now. */
bool
outbox_trace_active(void)
{
	return outbox_traceparent != NULL && outbox_traceparent[0] != '\0';
}

/* Whether the headers object holds a key named name, case-insensitively. */
static bool
trace_headers_have(Jsonb *headers, const char *name)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			len = strlen(name);

	if (headers == NULL)
		return false;
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		if (tok == WJB_KEY && v.val.string.len == len &&
			pg_strncasecmp(v.val.string.val, name, len) == 0)
			return true;
	return false;
}

static void
trace_push_pair(JsonbParseState **st, const char *key, const char *value)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) key;
	v.val.string.len = strlen(key);
	pushJsonbValue(st, WJB_KEY, &v);
	v.val.string.val = (char *) value;
	v.val.string.len = strlen(value);
	pushJsonbValue(st, WJB_VALUE, &v);
}

/*
 * headers (NULL for none) with traceparent and, when given, tracestate
 * added (a tracestate of the headers' own goes), in the current memory
 * context; headers itself when traceparent is NULL or empty, when they are
 * not an object (the caller's check refuses them), or when they already
 * name a traceparent (the message's own trace is kept, and its tracestate
 * with it).
 */
Jsonb *
outbox_trace_add(Jsonb *headers, const char *traceparent, const char *tracestate)
{
	JsonbParseState *st = NULL;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	if (traceparent == NULL || traceparent[0] == '\0' ||
		(headers != NULL && (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))) ||
		trace_headers_have(headers, "traceparent"))
		return headers;
	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	if (headers != NULL)
	{
		it = JsonbIteratorInit(&headers->root);
		while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		{
			if (tok != WJB_KEY && tok != WJB_VALUE)
				continue;
			/*
			 * The message's own tracestate goes: it does not belong to the
			 * traceparent added (it had none).
			 */
			if (tok == WJB_KEY && v.val.string.len == 10 &&
				pg_strncasecmp(v.val.string.val, "tracestate", 10) == 0)
			{
				tok = JsonbIteratorNext(&it, &v, true);
				continue;
			}
			pushJsonbValue(&st, tok, &v);
		}
	}
	trace_push_pair(&st, "traceparent", traceparent);
	if (tracestate != NULL && tracestate[0] != '\0')
		trace_push_pair(&st, "tracestate", tracestate);
	return JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
}

/* The session's trace added to headers (see outbox_trace_add). */
Jsonb *
outbox_trace_add_current(Jsonb *headers)
{
	if (!outbox_trace_active())
		return headers;
	return outbox_trace_add(headers, outbox_traceparent, outbox_tracestate);
}
