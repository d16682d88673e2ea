/*-------------------------------------------------------------------------
 *
 * json_scan.c
 *	  A small JSON reader for the answers of services (json_scan.h).
 *
 * The relay reads a service's answer in its main loop, outside any
 * library callback; still, an answer is hostile input, so this reader
 * allocates nothing and raises nothing: a text it cannot take is refused
 * as a whole, and the caller says so in the target's last error.
 *
 *-------------------------------------------------------------------------
 */
#include "c.h"

#include "json_scan.h"

typedef struct Jscan
{
	const char *text;
	int			len;
	int			pos;
	JscanToken *tok;
	int			max;
	int			ntok;
} Jscan;

static bool jscan_value(Jscan *s, int depth);

static void
jscan_blank(Jscan *s)
{
	while (s->pos < s->len &&
		   (s->text[s->pos] == ' ' || s->text[s->pos] == '\t' ||
			s->text[s->pos] == '\n' || s->text[s->pos] == '\r'))
		s->pos++;
}

static int
jscan_new(Jscan *s, JscanType type, int start)
{
	JscanToken *t;

	if (s->ntok >= s->max)
		return -1;
	t = &s->tok[s->ntok];
	t->type = type;
	t->start = start;
	t->end = start;
	t->size = 0;
	t->next = 0;
	return s->ntok++;
}

/* A string at s->pos (its opening quote). */
static bool
jscan_str(Jscan *s)
{
	int			i = jscan_new(s, JSCAN_STRING, s->pos + 1);

	if (i < 0)
		return false;
	for (s->pos++; s->pos < s->len; s->pos++)
	{
		unsigned char c = (unsigned char) s->text[s->pos];

		if (c == '"')
		{
			s->tok[i].end = s->pos++;
			s->tok[i].next = s->ntok;
			return true;
		}
		if (c < 0x20)
			return false;
		if (c == '\\')
		{
			if (++s->pos >= s->len)
				return false;
			c = (unsigned char) s->text[s->pos];
			if (c == 'u')
			{
				int			k;

				for (k = 0; k < 4; k++)
					if (++s->pos >= s->len || !isxdigit((unsigned char) s->text[s->pos]))
						return false;
			}
			else if (strchr("\"\\/bfnrt", c) == NULL || c == '\0')
				return false;
		}
	}
	return false;
}

static bool
jscan_literal(Jscan *s, const char *word)
{
	size_t		n = strlen(word);

	return (size_t) (s->len - s->pos) >= n && memcmp(s->text + s->pos, word, n) == 0;
}

static bool
jscan_value(Jscan *s, int depth)
{
	int			i;
	char		c;

	jscan_blank(s);
	if (s->pos >= s->len || depth > JSCAN_MAX_DEPTH)
		return false;
	c = s->text[s->pos];
	if (c == '"')
		return jscan_str(s);
	if (c == '{' || c == '[')
	{
		bool		object = (c == '{');

		i = jscan_new(s, object ? JSCAN_OBJECT : JSCAN_ARRAY, s->pos);
		if (i < 0)
			return false;
		s->pos++;
		jscan_blank(s);
		if (s->pos < s->len && s->text[s->pos] == (object ? '}' : ']'))
			s->pos++;
		else
		{
			for (;;)
			{
				if (object)
				{
					jscan_blank(s);
					if (s->pos >= s->len || s->text[s->pos] != '"' || !jscan_str(s))
						return false;
					jscan_blank(s);
					if (s->pos >= s->len || s->text[s->pos] != ':')
						return false;
					s->pos++;
				}
				if (!jscan_value(s, depth + 1))
					return false;
				s->tok[i].size++;
				jscan_blank(s);
				if (s->pos >= s->len)
					return false;
				if (s->text[s->pos] == ',')
				{
					s->pos++;
					continue;
				}
				if (s->text[s->pos] != (object ? '}' : ']'))
					return false;
				s->pos++;
				break;
			}
		}
		s->tok[i].end = s->pos;
		s->tok[i].next = s->ntok;
		return true;
	}
	i = jscan_new(s, JSCAN_PRIMITIVE, s->pos);
	if (i < 0)
		return false;
	if (jscan_literal(s, "true"))
		s->pos += 4;
	else if (jscan_literal(s, "false"))
		s->pos += 5;
	else if (jscan_literal(s, "null"))
		s->pos += 4;
	else
	{
		int			start = s->pos;

		while (s->pos < s->len && strchr("+-0123456789.eE", s->text[s->pos]) != NULL &&
			   s->text[s->pos] != '\0')
			s->pos++;
		if (s->pos == start)
			return false;
	}
	s->tok[i].end = s->pos;
	s->tok[i].next = s->ntok;
	return true;
}

int
jscan_parse(const char *text, int len, JscanToken *tok, int max)
{
	Jscan		s;

	s.text = text;
	s.len = len;
	s.pos = 0;
	s.tok = tok;
	s.max = max;
	s.ntok = 0;
	if (text == NULL || len < 0 || !jscan_value(&s, 0))
		return -1;
	jscan_blank(&s);
	return s.pos == len ? s.ntok : -1;
}

int
jscan_member(const char *text, const JscanToken *tok, int obj, const char *name)
{
	int			i;
	int			k;
	size_t		n = strlen(name);

	if (obj < 0 || tok[obj].type != JSCAN_OBJECT)
		return -1;
	i = obj + 1;
	for (k = 0; k < tok[obj].size; k++)
	{
		int			value = i + 1;

		if ((size_t) (tok[i].end - tok[i].start) == n &&
			memcmp(text + tok[i].start, name, n) == 0)
			return value;
		i = tok[value].next;
	}
	return -1;
}

bool
jscan_string(const char *text, const JscanToken *tok, int i, char *out, size_t size)
{
	int			p;
	size_t		o = 0;

	if (size == 0)
		return false;
	out[0] = '\0';
	if (i < 0 || tok[i].type != JSCAN_STRING)
		return false;
	for (p = tok[i].start; p < tok[i].end && o + 1 < size; p++)
	{
		unsigned char c = (unsigned char) text[p];

		if (c == '\\')
		{
			c = (unsigned char) text[++p];
			if (c == 'u')
			{
				unsigned int v = 0;
				int			k;

				for (k = 0; k < 4; k++)
				{
					char		h = text[++p];

					v = v * 16 + (isdigit((unsigned char) h) ? h - '0' : (tolower((unsigned char) h) - 'a' + 10));
				}
				c = (v >= 0x20 && v < 0x7f) ? (unsigned char) v : '?';
			}
			else if (c != '"' && c != '\\' && c != '/')
				c = '?';
		}
		out[o++] = (c >= 0x20 && c < 0x7f) ? (char) c : '?';
	}
	out[o] = '\0';
	return true;
}

bool
jscan_absent(const char *text, const JscanToken *tok, int i)
{
	return i < 0 || (tok[i].type == JSCAN_PRIMITIVE &&
					 tok[i].end - tok[i].start == 4 && memcmp(text + tok[i].start, "null", 4) == 0);
}

bool
jscan_true(const char *text, const JscanToken *tok, int i)
{
	return i >= 0 && tok[i].type == JSCAN_PRIMITIVE &&
		tok[i].end - tok[i].start == 4 && memcmp(text + tok[i].start, "true", 4) == 0;
}

/*
 * The text of element name inside [from, to) of an XML answer (AWS's
 * query protocol: SNS, STS), entities decoded
 * (&lt; &gt; &amp; &quot; &apos;; others shown as they are), printable
 * ASCII, into out; false if there is none.
 */
bool
xml_text(const char *from, const char *to, const char *name, char *out, size_t size)
{
	char		open[40];
	char		close[40];
	const char *s;
	const char *e;
	size_t		o = 0;

	snprintf(open, sizeof(open), "<%s>", name);
	snprintf(close, sizeof(close), "</%s>", name);
	out[0] = '\0';
	s = from;
	for (;;)
	{
		s = strstr(s, open);
		if (s == NULL || s >= to)
			return false;
		s += strlen(open);
		e = strstr(s, close);
		if (e == NULL || e > to)
			return false;
		break;
	}
	while (s < e && o + 1 < size)
	{
		static const struct
		{
			const char *entity;
			char		c;
		}			entities[] = {{"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&apos;", '\''}};
		int			k;
		char		c = *s;
		int			step = 1;

		for (k = 0; c == '&' && k < (int) lengthof(entities); k++)
			if (strncmp(s, entities[k].entity, strlen(entities[k].entity)) == 0)
			{
				c = entities[k].c;
				step = strlen(entities[k].entity);
				break;
			}
		out[o++] = ((unsigned char) c >= 0x20 && (unsigned char) c < 0x7f) ? c : '?';
		s += step;
	}
	out[o] = '\0';
	return true;
}
