/*-------------------------------------------------------------------------
 *
 * json_scan.h
 *	  A small JSON reader for the answers of services (AWS's JSON APIs):
 *	  the text is split into tokens, nothing is allocated, nothing raises
 *	  an error, and any text that is not JSON, or is deeper or longer than
 *	  the caller's token array, is refused.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_JSON_SCAN_H
#define OUTBOX_JSON_SCAN_H

#include <stdbool.h>
#include <stddef.h>

typedef enum JscanType
{
	JSCAN_OBJECT,
	JSCAN_ARRAY,
	JSCAN_STRING,				/* start/end: inside the quotes, escaped */
	JSCAN_PRIMITIVE				/* number, true, false or null */
} JscanType;

typedef struct JscanToken
{
	JscanType	type;
	int			start;			/* offset of its first byte */
	int			end;			/* offset past its last byte */
	int			size;			/* object: members; array: elements */
	int			next;			/* index of the token after it and all of
								 * its children */
} JscanToken;

/* Deepest nesting jscan_parse() takes. */
#define JSCAN_MAX_DEPTH		32

/*
 * Split text[0..len) into at most max tokens (token 0 is the value of the
 * whole text).  Returns how many, or -1 when the text is not one JSON value
 * or needs more tokens or depth.
 */
extern int	jscan_parse(const char *text, int len, JscanToken *tok, int max);

/* Of object token obj, the value of member name, or -1. */
extern int	jscan_member(const char *text, const JscanToken *tok, int obj,
						 const char *name);

/*
 * The value of string token i, unescaped into out (size bytes, always
 * NUL-terminated, cut to fit; control characters and bytes outside ASCII's
 * printable range shown as '?'); false if token i is not a string.
 */
extern bool jscan_string(const char *text, const JscanToken *tok, int i,
						 char *out, size_t size);

/* Whether token i is the primitive true. */
extern bool jscan_true(const char *text, const JscanToken *tok, int i);

/* Whether token i is missing (-1) or the primitive null. */
extern bool jscan_absent(const char *text, const JscanToken *tok, int i);

/*
 * And for AWS's XML answers: the text of the first element name inside
 * [from, to), entities decoded, printable ASCII, into out (size bytes); false
 * if there is none.
 */
extern bool xml_text(const char *from, const char *to, const char *name, char *out,
					 size_t size);

#endif							/* OUTBOX_JSON_SCAN_H */
