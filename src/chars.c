/*-------------------------------------------------------------------------
 *
 * chars.c
 *	  Which characters topics, keys, header names and values and channel
 *	  names may hold: checked by character, not by byte.
 *
 * Text is decoded from the database encoding to Unicode code points (in a
 * SQL_ASCII database a byte above 0x7f has no known meaning: it is allowed
 * in keys and channel names only).  Refused everywhere: C0 controls
 * (tab is allowed in keys and header values, as HTTP allows it), DEL and C1
 * controls such as U+0085 (NEL), which some HTTP stacks and log viewers
 * take for a line break.  Further:
 *	  topic, pattern	no white space or separator of any script (U+00A0,
 *						U+2028, U+3000 ...), no invisible formatting
 *						characters (zero-width, bidirectional controls, BOM),
 *						no noncharacters, no "*" (a pattern may end in one)
 *	  key, channel		no line or paragraph separator (U+2028, U+2029)
 *	  header value		printable ASCII and tab only: values travel raw in
 *						HTTP request headers
 * Header names are RFC 9110 tokens (outbox_is_token_char).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"

#include "outbox.h"

/* Unicode white space and separators (Zs, Zl, Zp and the like). */
static bool
outbox_is_unicode_space(pg_wchar c)
{
	return c == 0x00A0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
		c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Invisible formatting characters and noncharacters. */
static bool
outbox_is_unicode_invisible(pg_wchar c)
{
	return c == 0x00AD || c == 0x034F || c == 0x061C || c == 0x115F ||
		c == 0x1160 || c == 0x17B4 || c == 0x17B5 || c == 0x180E ||
		(c >= 0x200B && c <= 0x200F) || (c >= 0x202A && c <= 0x202E) ||
		(c >= 0x2060 && c <= 0x206F) || c == 0x3164 || c == 0xFEFF ||
		c == 0xFFA0 || (c >= 0xFFF0 && c <= 0xFFFB) ||
		(c >= 0xFDD0 && c <= 0xFDEF) || (c & 0xFFFE) == 0xFFFE ||
		(c >= 0xE0000 && c <= 0xE0FFF);
}

static bool
outbox_char_ok(pg_wchar c, OutboxTextKind kind, bool last)
{
	if (c == '\t')
		return kind == OUTBOX_TEXT_KEY || kind == OUTBOX_TEXT_HEADER_VALUE;
	if (c < 0x20 || (c >= 0x7f && c <= 0x9f))
		return false;
	switch (kind)
	{
		case OUTBOX_TEXT_HEADER_VALUE:
			return c <= 0x7e;
		case OUTBOX_TEXT_TOPIC:
		case OUTBOX_TEXT_PATTERN:
			if (c == ' ')
				return false;
			if (c == '*')
				return kind == OUTBOX_TEXT_PATTERN && last;
			return !outbox_is_unicode_space(c) && !outbox_is_unicode_invisible(c);
		case OUTBOX_TEXT_KEY:
		case OUTBOX_TEXT_CHANNEL:
			return c != 0x2028 && c != 0x2029;
	}
	return false;
}

/*
 * The first character of s (len bytes, in the database encoding) that kind
 * does not allow: returns its position (1-based, in characters) and sets
 * *bad to its code point; 0 if all are allowed.  *bad is 0xFFFFFFFF for a
 * byte whose meaning is unknown (above 0x7f in a SQL_ASCII database).
 */
int
outbox_bad_char(const char *s, int len, OutboxTextKind kind, pg_wchar *bad)
{
	int			enc = GetDatabaseEncoding();
	const unsigned char *p;
	const unsigned char *end;
	char	   *converted = NULL;
	int			pos = 0;

	if (enc != PG_UTF8 && enc != PG_SQL_ASCII)
	{
		converted = (char *) pg_do_encoding_conversion((unsigned char *) s, len, enc, PG_UTF8);
		if (converted != s)
		{
			s = converted;
			len = strlen(converted);
		}
		else
			converted = NULL;
		enc = PG_UTF8;
	}
	p = (const unsigned char *) s;
	end = p + len;
	while (p < end)
	{
		pg_wchar	c;
		int			n = 1;

		pos++;
		if (*p < 0x80)
			c = *p;
		else if (enc == PG_UTF8)
		{
			n = pg_utf_mblen(p);
			if (p + n > end || !pg_utf8_islegal(p, n))
				c = 0xFFFFFFFF;
			else
				c = utf8_to_unicode(p);
		}
		else
			c = 0xFFFFFFFF;
		if (c == 0xFFFFFFFF ?
			!(enc == PG_SQL_ASCII && (kind == OUTBOX_TEXT_KEY || kind == OUTBOX_TEXT_CHANNEL)) :
			!outbox_char_ok(c, kind, p + n == end))
		{
			*bad = c;
			if (converted)
				pfree(converted);
			return pos;
		}
		p += n;
	}
	if (converted)
		pfree(converted);
	return 0;
}

/* "U+0085" for messages. */
static const char *
outbox_char_name(pg_wchar c)
{
	if (c == 0xFFFFFFFF)
		return "a byte above 0x7f of unknown meaning (SQL_ASCII database)";
	return psprintf("U+%04X", (unsigned int) c);
}

static const char *
outbox_text_kind_name(OutboxTextKind kind)
{
	switch (kind)
	{
		case OUTBOX_TEXT_TOPIC:
			return "topic";
		case OUTBOX_TEXT_PATTERN:
			return "topic pattern";
		case OUTBOX_TEXT_KEY:
			return "key";
		case OUTBOX_TEXT_HEADER_VALUE:
			return "header value";
		case OUTBOX_TEXT_CHANNEL:
			return "NOTIFY channel name";
	}
	return "text";
}

static const char *
outbox_text_kind_rule(OutboxTextKind kind)
{
	switch (kind)
	{
		case OUTBOX_TEXT_TOPIC:
			return "Topics may not contain white space, control characters, invisible formatting characters or \"*\".";
		case OUTBOX_TEXT_PATTERN:
			return "A pattern is a topic, a prefix followed by \"*\" (such as 'orders.*'), or '*'; topics may not contain white space, control or invisible formatting characters.";
		case OUTBOX_TEXT_KEY:
		case OUTBOX_TEXT_CHANNEL:
			return "Control characters and line separators are not allowed.";
		case OUTBOX_TEXT_HEADER_VALUE:
			return "Header values travel in HTTP request headers: printable ASCII and tab only.";
	}
	return "";
}

/*
 * Raise 22023 if s holds a character kind does not allow; what names the
 * value in the message ("outbox key", "target header \"x-a\"").
 */
void
outbox_check_text(const char *s, int len, OutboxTextKind kind, const char *what)
{
	pg_wchar	c;
	int			pos = outbox_bad_char(s, len, kind, &c);

	if (pos > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s contains a character that is not allowed", what),
				 errdetail("Character %d is %s. %s", pos, outbox_char_name(c),
						   outbox_text_kind_rule(kind)),
				 kind == OUTBOX_TEXT_HEADER_VALUE ?
				 errhint("Percent-encode or base64-encode other text, or move it into the payload.") :
				 errhint("Remove the character.")));
}

/*
 * RFC 9110 token characters, the only ones allowed in a header name
 * (checked by outbox_emit() and by the relay as it loads targets).
 */
bool
outbox_is_token_char(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return true;
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return true;
	return strchr("!#$%&'*+-.^_`|~", c) != NULL && c != '\0';
}

/* A header name's character as a receiver may read it: lower case, "_" as "-". */
static inline unsigned char
outbox_header_fold(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A' + 'a';
	return c == '_' ? '-' : c;
}

/*
 * Whether the header name (len bytes) begins with prefix (lower case, with
 * "-") as a receiver reads it: case aside, and "_" the same as "-", as CGI
 * and WSGI servers fold both into one variable (X_ID and X-ID are both
 * HTTP_X_ID).  With exact, the whole name.
 */
bool
outbox_header_name_is(const char *name, int len, const char *prefix, bool exact)
{
	int			plen = strlen(prefix);
	int			i;

	if (len < plen || (exact && len != plen))
		return false;
	for (i = 0; i < plen; i++)
		if (outbox_header_fold((unsigned char) name[i]) != (unsigned char) prefix[i])
			return false;
	return true;
}

/* Whether header names a and b are the same to a receiver (see above). */
bool
outbox_header_names_match(const char *a, int alen, const char *b, int blen)
{
	int			i;

	if (alen != blen)
		return false;
	for (i = 0; i < alen; i++)
		if (outbox_header_fold((unsigned char) a[i]) != outbox_header_fold((unsigned char) b[i]))
			return false;
	return true;
}

PG_FUNCTION_INFO_V1(outbox_check_text_sql);

/*
 * outbox.check_text(value text, kind text, what text) -> void: the checks
 * above, for the SQL functions (kind: topic, pattern, key, header_value,
 * channel; what names the value in the message).
 */
Datum
outbox_check_text_sql(PG_FUNCTION_ARGS)
{
	text	   *value;
	char	   *kind;
	OutboxTextKind k;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		PG_RETURN_VOID();
	value = PG_GETARG_TEXT_PP(0);
	kind = text_to_cstring(PG_GETARG_TEXT_PP(1));
	if (strcmp(kind, "topic") == 0)
		k = OUTBOX_TEXT_TOPIC;
	else if (strcmp(kind, "pattern") == 0)
		k = OUTBOX_TEXT_PATTERN;
	else if (strcmp(kind, "key") == 0)
		k = OUTBOX_TEXT_KEY;
	else if (strcmp(kind, "header_value") == 0)
		k = OUTBOX_TEXT_HEADER_VALUE;
	else if (strcmp(kind, "channel") == 0)
		k = OUTBOX_TEXT_CHANNEL;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown text kind \"%s\"", kind),
				 errhint("Use topic, pattern, key, header_value or channel.")));
	outbox_check_text(VARDATA_ANY(value), VARSIZE_ANY_EXHDR(value), k,
					  PG_NARGS() > 2 && !PG_ARGISNULL(2) ?
					  text_to_cstring(PG_GETARG_TEXT_PP(2)) :
					  psprintf("outbox %s", outbox_text_kind_name(k)));
	PG_RETURN_VOID();
}

/*
 * The host of a broker URL or list at *p: a bracketed IPv6 address, or a
 * run of ASCII letters, digits, '.', '-' and '_' (what a name or an IPv4
 * address may hold).  Sets [*host, *host_end) to it without brackets and
 * moves *p past it.  Returns why there is none (missing says how the caller
 * names that), or NULL.  Whether the text is a valid name or address is for
 * the caller, or for the lookup.
 */
const char *
outbox_scan_host(const char **p, const char **host, const char **host_end, const char *missing)
{
	const char *s = *p;

	if (*s == '[')
	{
		*host = ++s;
		while (*s && *s != ']')
			s++;
		if (*s != ']')
			return "an IPv6 address lacks its ']'";
		*host_end = s++;
	}
	else
	{
		*host = s;
		while (*s && (outbox_ascii_alnum((unsigned char) *s) || *s == '.' || *s == '-' || *s == '_'))
			s++;
		*host_end = s;
	}
	*p = s;
	if (*host_end == *host || *host_end - *host > 253)
		return missing;
	return NULL;
}
