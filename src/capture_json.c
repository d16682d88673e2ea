/*-------------------------------------------------------------------------
 *
 * capture_json.c
 *	  A captured row as a JSON object and its key as text: the same for the
 *	  trigger (capture.c) and the WAL miner (capture_wal.c).
 *
 * The rules are to_jsonb()'s, made independent of the writer's TimeZone and of
 * user-defined code:
 *	  boolean			true / false
 *	  smallint, integer, bigint, real, double precision, numeric
 *						a number (NaN and infinities: a string)
 *	  json, jsonb		the value itself
 *	  date, timestamp, timestamptz
 *						ISO 8601 strings; timestamptz in UTC ("+00:00"),
 *						whatever the writer's TimeZone
 *	  arrays			JSON arrays (nested per dimension)
 *	  composite types	objects
 *	  domains			as their base type
 *	  anything else		the type's output function's text, as a string (which
 *						IntervalStyle, bytea_output, extra_float_digits and
 *						lc_monetary may change: those are the writer's)
 * to_jsonb() would also apply a cast to json defined for the type: such a
 * cast is a function anybody owning the type may write, and the WAL miner
 * runs as a superuser inside logical decoding, so it is not used.  Output
 * functions are in C, which only a superuser can install.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/date.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/typcache.h"

#include "outbox.h"
#include "capture.h"

/* Categories of CaptureColumn.category. */
#define CAT_BOOL		'b'
#define CAT_INT			'i'		/* int2, int4, int8 */
#define CAT_FLOAT		'f'
#define CAT_NUMERIC		'n'
#define CAT_JSON		'j'
#define CAT_JSONB		'J'
#define CAT_DATETIME	'd'
#define CAT_ARRAY		'a'
#define CAT_COMPOSITE	'c'
#define CAT_STRING		's'

static char
capture_category(Oid typid)
{
	switch (typid)
	{
		case BOOLOID:
			return CAT_BOOL;
		case INT2OID:
		case INT4OID:
		case INT8OID:
			return CAT_INT;
		case FLOAT4OID:
		case FLOAT8OID:
			return CAT_FLOAT;
		case NUMERICOID:
			return CAT_NUMERIC;
		case JSONOID:
			return CAT_JSON;
		case JSONBOID:
			return CAT_JSONB;
		case DATEOID:
		case TIMESTAMPOID:
		case TIMESTAMPTZOID:
			return CAT_DATETIME;
		default:
			if (OidIsValid(get_element_type(typid)))
				return CAT_ARRAY;
			if (type_is_rowtype(typid))
				return CAT_COMPOSITE;
			return CAT_STRING;
	}
}

void
outbox_capture_push_string(JsonbParseState **st, JsonbIteratorToken tok,
						   const char *s)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) s;
	v.val.string.len = strlen(s);
	pushJsonbValue(st, tok, &v);
}

static void capture_push_value(JsonbParseState **st, JsonbIteratorToken tok,
							   Datum val, Oid typid, char category,
							   FmgrInfo *out);

/* A number given as text, or a string if it is not a finite number. */
static void
capture_push_number_text(JsonbParseState **st, JsonbIteratorToken tok,
						 const char *s)
{
	JsonbValue	v;

	if (pg_strcasecmp(s, "NaN") == 0 || strstr(s, "nfinity") != NULL)
	{
		outbox_capture_push_string(st, tok, s);
		return;
	}
	v.type = jbvNumeric;
	v.val.numeric = DatumGetNumeric(DirectFunctionCall3(numeric_in,
														CStringGetDatum(s),
														ObjectIdGetDatum(InvalidOid),
														Int32GetDatum(-1)));
	pushJsonbValue(st, tok, &v);
}

static char *
capture_output(Datum val, Oid typid, FmgrInfo *out)
{
	Oid			outfn;
	bool		varlena;

	if (out != NULL)
		return OutputFunctionCall(out, val);
	getTypeOutputInfo(typid, &outfn, &varlena);
	return OidOutputFunctionCall(outfn, val);
}

/* The elements of dimension dim of an array, from *pos on. */
static void
capture_push_dimension(JsonbParseState **st, JsonbIteratorToken tok, int dim,
					   int ndims, const int *dims, Datum *elems, bool *nulls,
					   int *pos, Oid elemtype, char elemcat)
{
	int			i;

	pushJsonbValue(st, WJB_BEGIN_ARRAY, NULL);
	for (i = 0; i < dims[dim]; i++)
	{
		if (dim + 1 < ndims)
			capture_push_dimension(st, WJB_ELEM, dim + 1, ndims, dims, elems,
								   nulls, pos, elemtype, elemcat);
		else
		{
			if (nulls[*pos])
			{
				JsonbValue	v;

				v.type = jbvNull;
				pushJsonbValue(st, WJB_ELEM, &v);
			}
			else
				capture_push_value(st, WJB_ELEM, elems[*pos], elemtype, elemcat, NULL);
			(*pos)++;
		}
	}
	pushJsonbValue(st, WJB_END_ARRAY, NULL);
}

static void
capture_push_array(JsonbParseState **st, JsonbIteratorToken tok, Datum val)
{
	ArrayType  *arr = DatumGetArrayTypeP(val);
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			pos = 0;
	Oid			base = getBaseType(elemtype);

	if (ARR_NDIM(arr) == 0)
	{
		pushJsonbValue(st, WJB_BEGIN_ARRAY, NULL);
		pushJsonbValue(st, WJB_END_ARRAY, NULL);
		return;
	}
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  &elems, &nulls, &nelems);
	capture_push_dimension(st, tok, 0, ARR_NDIM(arr), ARR_DIMS(arr), elems,
						   nulls, &pos, base, capture_category(base));
}

static void
capture_push_composite(JsonbParseState **st, Datum val)
{
	HeapTupleHeader td = DatumGetHeapTupleHeader(val);
	TupleDesc	desc;
	HeapTupleData tmptup;
	int			i;

	desc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(td),
								  HeapTupleHeaderGetTypMod(td));
	tmptup.t_len = HeapTupleHeaderGetDatumLength(td);
	tmptup.t_data = td;
	pushJsonbValue(st, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		bool		isnull;
		Datum		d;
		Oid			base;

		if (att->attisdropped)
			continue;
		outbox_capture_push_string(st, WJB_KEY, NameStr(att->attname));
		d = heap_getattr(&tmptup, i + 1, desc, &isnull);
		if (isnull)
		{
			JsonbValue	v;

			v.type = jbvNull;
			pushJsonbValue(st, WJB_VALUE, &v);
			continue;
		}
		base = getBaseType(att->atttypid);
		capture_push_value(st, WJB_VALUE, d, base, capture_category(base), NULL);
	}
	pushJsonbValue(st, WJB_END_OBJECT, NULL);
	ReleaseTupleDesc(desc);
}

/* Push a non-null value of base type typid as tok (WJB_VALUE or WJB_ELEM). */
static void
capture_push_value(JsonbParseState **st, JsonbIteratorToken tok, Datum val,
				   Oid typid, char category, FmgrInfo *out)
{
	JsonbValue	v;

	switch (category)
	{
		case CAT_BOOL:
			v.type = jbvBool;
			v.val.boolean = DatumGetBool(val);
			pushJsonbValue(st, tok, &v);
			break;
		case CAT_INT:
			v.type = jbvNumeric;
			v.val.numeric = DatumGetNumeric(typid == INT2OID ?
											DirectFunctionCall1(int2_numeric, val) :
											typid == INT4OID ?
											DirectFunctionCall1(int4_numeric, val) :
											DirectFunctionCall1(int8_numeric, val));
			pushJsonbValue(st, tok, &v);
			break;
		case CAT_NUMERIC:
			if (numeric_is_nan(DatumGetNumeric(val)) ||
				numeric_is_inf(DatumGetNumeric(val)))
				outbox_capture_push_string(st, tok, capture_output(val, typid, out));
			else
			{
				v.type = jbvNumeric;
				v.val.numeric = DatumGetNumeric(val);
				pushJsonbValue(st, tok, &v);
			}
			break;
		case CAT_FLOAT:
			capture_push_number_text(st, tok, capture_output(val, typid, out));
			break;
		case CAT_JSON:
			{
				Datum		jb = DirectFunctionCall1(jsonb_in,
													 CStringGetDatum(TextDatumGetCString(val)));

				v.type = jbvBinary;
				v.val.binary.data = &DatumGetJsonbP(jb)->root;
				v.val.binary.len = VARSIZE(DatumGetPointer(jb)) - VARHDRSZ;
				pushJsonbValue(st, tok, &v);
			}
			break;
		case CAT_JSONB:
			{
				Jsonb	   *jb = DatumGetJsonbP(val);

				v.type = jbvBinary;
				v.val.binary.data = &jb->root;
				v.val.binary.len = VARSIZE(jb) - VARHDRSZ;
				pushJsonbValue(st, tok, &v);
			}
			break;
		case CAT_DATETIME:
			{
				char		buf[MAXDATELEN + 1];
				int			utc = 0;

				/* pushJsonbValue keeps the pointer until the end */
				JsonEncodeDateTime(buf, val, typid, &utc);
				outbox_capture_push_string(st, tok, pstrdup(buf));
			}
			break;
		case CAT_ARRAY:
			capture_push_array(st, tok, val);
			break;
		case CAT_COMPOSITE:
			capture_push_composite(st, val);
			break;
		default:
			outbox_capture_push_string(st, tok, capture_output(val, typid, out));
			break;
	}
}

/* Describe column attnum of desc, with its output function in cxt. */
void
outbox_capture_column_init(CaptureColumn *col, TupleDesc desc,
						   AttrNumber attnum, MemoryContext cxt)
{
	Form_pg_attribute att = TupleDescAttr(desc, attnum - 1);
	Oid			outfn;
	bool		varlena;

	col->attnum = attnum;
	col->name = MemoryContextStrdup(cxt, NameStr(att->attname));
	col->typid = getBaseType(att->atttypid);
	col->category = capture_category(col->typid);
	getTypeOutputInfo(col->typid, &outfn, &varlena);
	fmgr_info_cxt(outfn, &col->out, cxt);
}

/*
 * Push the row as an object of the given columns, leaving out those whose
 * skip entry (by position in cols; skip may be NULL) is set.
 */
void
outbox_capture_push_row(JsonbParseState **st, HeapTuple tuple, TupleDesc desc,
						const CaptureColumn *cols, int ncols, const bool *skip)
{
	int			i;

	pushJsonbValue(st, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < ncols; i++)
	{
		const CaptureColumn *col = &cols[i];
		bool		isnull;
		Datum		d;

		if (skip != NULL && skip[i])
			continue;
		outbox_capture_push_string(st, WJB_KEY, col->name);
		d = heap_getattr(tuple, col->attnum, desc, &isnull);
		if (isnull)
		{
			JsonbValue	v;

			v.type = jbvNull;
			pushJsonbValue(st, WJB_VALUE, &v);
		}
		else
			capture_push_value(st, WJB_VALUE, d, col->typid, col->category,
							   (FmgrInfo *) &col->out);
	}
	pushJsonbValue(st, WJB_END_OBJECT, NULL);
}

/*
 * The key of a change as text: one column's text (NULL when it is null),
 * several as a JSON array (integers as numbers, booleans as true/false,
 * nulls as null, the rest as strings).
 */
char *
outbox_capture_key(HeapTuple tuple, TupleDesc desc, const CaptureColumn *keys,
				   int nkeys, int *len)
{
	StringInfoData buf;
	int			i;

	if (nkeys == 1)
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, keys[0].attnum, desc, &isnull);
		char	   *s;

		if (isnull)
			return NULL;
		s = OutputFunctionCall((FmgrInfo *) &keys[0].out, d);
		*len = strlen(s);
		return s;
	}

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '[');
	for (i = 0; i < nkeys; i++)
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, keys[i].attnum, desc, &isnull);

		if (i > 0)
			appendStringInfoChar(&buf, ',');
		if (isnull)
			appendStringInfoString(&buf, "null");
		else if (keys[i].category == CAT_BOOL)
			appendStringInfoString(&buf, DatumGetBool(d) ? "true" : "false");
		else if (keys[i].category == CAT_INT)
			appendStringInfoString(&buf, OutputFunctionCall((FmgrInfo *) &keys[i].out, d));
		else
			escape_json(&buf, OutputFunctionCall((FmgrInfo *) &keys[i].out, d));
	}
	appendStringInfoChar(&buf, ']');
	*len = buf.len;
	return buf.data;
}
