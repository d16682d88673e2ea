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
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/cash.h"
#include "utils/datum.h"
#include "utils/date.h"
#include "utils/datetime.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
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
	col->typmod = att->atttypmod;
	col->typid = getBaseTypeAndTypmod(att->atttypid, &col->typmod);
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


/*---- Debezium's change events ----*/

/*
 * Values as Debezium's PostgreSQL connector writes them with its JSON
 * converter (schemas disabled) and these settings (docs/formats.md lists
 * them type by type):
 *	  decimal.handling.mode = string		numeric, money: "12.30"
 *	  time.precision.mode = adaptive		date: days since 1970-01-01;
 *		time(0-3): milliseconds, time and time(4-6): microseconds since
 *		midnight; timestamp likewise since 1970-01-01 00:00
 *	  timestamptz, timetz					ISO 8601 strings in UTC ("Z")
 *	  interval.handling.mode = numeric		microseconds, a month as 30.4375 days
 *	  binary.handling.mode = bytes			base64, as the JSON converter writes bytes
 *	  json, jsonb, uuid, xml and the rest	strings
 * Arrays are arrays of their elements so written.
 */

#define DBZ_UNIX_EPOCH_DAYS		(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE)
#define DBZ_DAYS_PER_MONTH		(365.25 / 12)
/*
 * What the connector makes of infinite dates and timestamps (the values
 * its JDBC driver reads them as): days since 1970, microseconds since 1970.
 */
#define DBZ_DATE_POS_INFINITY		INT64CONST(-2147472692)
#define DBZ_DATE_NEG_INFINITY		INT64CONST(-2147472691)
#define DBZ_TIMESTAMP_POS_INFINITY	INT64CONST(9223372036825200000)
#define DBZ_TIMESTAMP_NEG_INFINITY	INT64CONST(-9223372036832400000)

static void capture_push_dbz_value(JsonbParseState **st, JsonbIteratorToken tok,
								   Datum val, Oid typid, int32 typmod,
								   FmgrInfo *out);

static void
capture_push_int64(JsonbParseState **st, JsonbIteratorToken tok, int64 n)
{
	JsonbValue	v;

	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric(n);
	pushJsonbValue(st, tok, &v);
}

/* floor(a / b) for b > 0 */
static int64
capture_floor_div(int64 a, int64 b)
{
	int64		q = a / b;

	if ((a % b) != 0 && a < 0)
		q--;
	return q;
}

/*
 * "HH:MM:SS[.fraction]" of time t (microseconds, 0 <= t < a day).  digits:
 * the fraction's digits (0: none), or -1 for as Java's ISO formats write a
 * time: none for whole seconds, else 3 or 6 digits.
 */
static void
capture_append_time(StringInfo buf, int64 t, int digits)
{
	int64		secs = t / USECS_PER_SEC;
	int			usec = (int) (t % USECS_PER_SEC);
	char		frac[8];

	appendStringInfo(buf, "%02d:%02d:%02d", (int) (secs / 3600),
					 (int) ((secs / 60) % 60), (int) (secs % 60));
	if (digits < 0)
		digits = usec == 0 ? 0 : usec % 1000 == 0 ? 3 : 6;
	if (digits > 6)
		digits = 6;
	if (digits > 0)
	{
		snprintf(frac, sizeof(frac), "%06d", usec);
		appendStringInfo(buf, ".%.*s", digits, frac);
	}
}

/*
 * timestamptz as Debezium's ZonedTimestamp: in UTC, the fraction with as
 * many digits as the column's precision (6 without one, none for 0):
 * "2026-12-03T10:15:30.500000Z".
 */
static char *
capture_dbz_zoned_timestamp(TimestampTz t, int32 typmod)
{
	struct pg_tm tm;
	fsec_t		fsec;
	StringInfoData buf;

	if (TIMESTAMP_NOT_FINITE(t))
		return pstrdup(TIMESTAMP_IS_NOBEGIN(t) ? "-infinity" : "infinity");
	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	initStringInfo(&buf);
	if (tm.tm_year <= 0)
		appendStringInfo(&buf, "-%04d", 1 - tm.tm_year);	/* 1 BC is year 0 */
	else if (tm.tm_year > 9999)
		appendStringInfo(&buf, "+%d", tm.tm_year);
	else
		appendStringInfo(&buf, "%04d", tm.tm_year);
	appendStringInfo(&buf, "-%02d-%02dT", tm.tm_mon, tm.tm_mday);
	capture_append_time(&buf, ((int64) tm.tm_hour * 3600 + tm.tm_min * 60 + tm.tm_sec) *
						USECS_PER_SEC + fsec, typmod < 0 ? 6 : typmod);
	appendStringInfoChar(&buf, 'Z');
	return buf.data;
}

static void
capture_push_dbz_array(JsonbParseState **st, JsonbIteratorToken tok, Datum val,
					   int32 typmod)
{
	ArrayType  *arr = DatumGetArrayTypeP(val);
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			i;
	Oid			outfn;
	bool		varlena;
	FmgrInfo	out;
	int32		elemmod = typmod;
	Oid			base = getBaseTypeAndTypmod(elemtype, &elemmod);

	/* Debezium's arrays are one-dimensional lists: the elements in order */
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  &elems, &nulls, &nelems);
	getTypeOutputInfo(base, &outfn, &varlena);
	fmgr_info(outfn, &out);
	pushJsonbValue(st, WJB_BEGIN_ARRAY, NULL);
	for (i = 0; i < nelems; i++)
	{
		if (nulls[i])
		{
			JsonbValue	v;

			v.type = jbvNull;
			pushJsonbValue(st, WJB_ELEM, &v);
		}
		else
			capture_push_dbz_value(st, WJB_ELEM, elems[i], base, elemmod, &out);
	}
	pushJsonbValue(st, WJB_END_ARRAY, NULL);
}

/* Push a non-null value of base type typid the way Debezium writes it. */
static void
capture_push_dbz_value(JsonbParseState **st, JsonbIteratorToken tok, Datum val,
					   Oid typid, int32 typmod, FmgrInfo *out)
{
	switch (typid)
	{
		case BOOLOID:
		case INT2OID:
		case INT4OID:
		case INT8OID:
		case FLOAT4OID:
		case FLOAT8OID:
			capture_push_value(st, tok, val, typid, capture_category(typid), out);
			return;
		case TIMESTAMPTZOID:
			outbox_capture_push_string(st, tok,
									   capture_dbz_zoned_timestamp(DatumGetTimestampTz(val), typmod));
			return;
		case NUMERICOID:
			{
				Numeric		n = DatumGetNumeric(val);

				/* Debezium's SpecialValueDecimal names */
				if (numeric_is_nan(n))
					outbox_capture_push_string(st, tok, "NAN");
				else if (numeric_is_inf(n))
					outbox_capture_push_string(st, tok,
											   capture_output(val, typid, out)[0] == '-' ?
											   "NEGATIVE_INFINITY" : "POSITIVE_INFINITY");
				else
					outbox_capture_push_string(st, tok, capture_output(val, typid, out));
			}
			return;
		case CASHOID:
			outbox_capture_push_string(st, tok,
									   DatumGetCString(DirectFunctionCall1(numeric_out,
																		   DirectFunctionCall1(cash_numeric, val))));
			return;
		case DATEOID:
			{
				DateADT		d = DatumGetDateADT(val);

				if (DATE_NOT_FINITE(d))
					capture_push_int64(st, tok, DATE_IS_NOBEGIN(d) ? DBZ_DATE_NEG_INFINITY :
									   DBZ_DATE_POS_INFINITY);
				else
					capture_push_int64(st, tok, (int64) d + DBZ_UNIX_EPOCH_DAYS);
			}
			return;
		case TIMEOID:
			{
				TimeADT		t = DatumGetTimeADT(val);

				/* time(0) to time(3): Time, milliseconds; else MicroTime */
				capture_push_int64(st, tok, typmod >= 0 && typmod <= 3 ? t / 1000 : t);
			}
			return;
		case TIMESTAMPOID:
			{
				Timestamp	t = DatumGetTimestamp(val);
				int64		micros;

				if (TIMESTAMP_NOT_FINITE(t))
					micros = TIMESTAMP_IS_NOBEGIN(t) ? DBZ_TIMESTAMP_NEG_INFINITY :
						DBZ_TIMESTAMP_POS_INFINITY;
				else
					micros = t + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY;
				/* timestamp(0) to timestamp(3): Timestamp, milliseconds */
				capture_push_int64(st, tok, typmod >= 0 && typmod <= 3 ?
								   capture_floor_div(micros, 1000) : micros);
			}
			return;
		case TIMETZOID:
			{
				TimeTzADT  *t = DatumGetTimeTzADTP(val);
				int64		utc = t->time + (int64) t->zone * USECS_PER_SEC;
				StringInfoData buf;

				utc %= USECS_PER_DAY;
				if (utc < 0)
					utc += USECS_PER_DAY;
				initStringInfo(&buf);
				capture_append_time(&buf, utc, -1);
				appendStringInfoChar(&buf, 'Z');
				outbox_capture_push_string(st, tok, buf.data);
			}
			return;
		case INTERVALOID:
			{
				Interval   *i = DatumGetIntervalP(val);
				double		micros;

#ifdef INTERVAL_NOT_FINITE
				if (INTERVAL_NOT_FINITE(i))
				{
					outbox_capture_push_string(st, tok, INTERVAL_IS_NOBEGIN(i) ? "-infinity" : "infinity");
					return;
				}
#endif
				micros = (double) i->month * DBZ_DAYS_PER_MONTH * USECS_PER_DAY +
					(double) i->day * USECS_PER_DAY + (double) i->time;
				capture_push_int64(st, tok, (int64) micros);
			}
			return;
		case BYTEAOID:
			{
				bytea	   *b = DatumGetByteaPP(val);
				StringInfoData buf;

				initStringInfo(&buf);
				outbox_append_b64(&buf, (const uint8 *) VARDATA_ANY(b),
								  VARSIZE_ANY_EXHDR(b));
				outbox_capture_push_string(st, tok, buf.data);
			}
			return;
		case JSONBOID:
			outbox_capture_push_string(st, tok,
									   JsonbToCString(NULL, &DatumGetJsonbP(val)->root,
													  VARSIZE(DatumGetPointer(val))));
			return;
		default:
			if (OidIsValid(get_element_type(typid)))
			{
				capture_push_dbz_array(st, tok, val, typmod);
				return;
			}
			if (type_is_rowtype(typid))
			{
				capture_push_composite(st, val);
				return;
			}
			/* json, uuid, text, enums, xml, inet, ...: their text */
			outbox_capture_push_string(st, tok, capture_output(val, typid, out));
			return;
	}
}

/*
 * The row as a Debezium row object: every column, the unavailable ones so
 * marked.  Returns what the object's end returns (the value, at top level).
 */
static JsonbValue *
capture_push_dbz_row(JsonbParseState **st, HeapTuple tuple, TupleDesc desc,
					 const CaptureColumn *cols, int ncols, const bool *unavailable)
{
	int			i;

	pushJsonbValue(st, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < ncols; i++)
	{
		const CaptureColumn *col = &cols[i];
		bool		isnull;
		Datum		d;

		outbox_capture_push_string(st, WJB_KEY, col->name);
		if (unavailable != NULL && unavailable[i])
		{
			if (col->typid == BYTEAOID)
			{
				StringInfoData buf;

				initStringInfo(&buf);
				outbox_append_b64(&buf, (const uint8 *) CAPTURE_DEBEZIUM_UNAVAILABLE,
								  strlen(CAPTURE_DEBEZIUM_UNAVAILABLE));
				outbox_capture_push_string(st, WJB_VALUE, buf.data);
			}
			else
				outbox_capture_push_string(st, WJB_VALUE, CAPTURE_DEBEZIUM_UNAVAILABLE);
			continue;
		}
		d = heap_getattr(tuple, col->attnum, desc, &isnull);
		if (isnull)
		{
			JsonbValue	v;

			v.type = jbvNull;
			pushJsonbValue(st, WJB_VALUE, &v);
		}
		else
			capture_push_dbz_value(st, WJB_VALUE, d, col->typid, col->typmod,
								   (FmgrInfo *) &col->out);
	}
	return pushJsonbValue(st, WJB_END_OBJECT, NULL);
}

static void
capture_push_dbz_key_string(JsonbParseState **st, const char *k, const char *v)
{
	outbox_capture_push_string(st, WJB_KEY, k);
	if (v == NULL)
	{
		JsonbValue	null;

		null.type = jbvNull;
		pushJsonbValue(st, WJB_VALUE, &null);
	}
	else
		outbox_capture_push_string(st, WJB_VALUE, v);
}

/* milliseconds since 1970 of a timestamptz */
static int64
capture_epoch_ms(TimestampTz t)
{
	return capture_floor_div(t + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY, 1000);
}

/*
 * A change as Debezium's envelope: {"before", "after", "source", "op",
 * "ts_ms", "transaction"}.  op is Debezium's letter: c, u, d, r or t.
 * unavailable (by position in cols, or NULL) marks the after row's
 * unchanged TOASTed columns, which the WAL does not carry.
 */
Jsonb *
outbox_capture_debezium(const CaptureDebeziumSource *src, char op,
						HeapTuple before, HeapTuple after, TupleDesc desc,
						const CaptureColumn *cols, int ncols,
						const bool *unavailable)
{
	JsonbParseState *st = NULL;
	JsonbValue	null;
	char		opstr[2] = {op, '\0'};
	TimestampTz now = GetCurrentTimestamp();

	null.type = jbvNull;
	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	outbox_capture_push_string(&st, WJB_KEY, "before");
	if (before != NULL)
		capture_push_dbz_row(&st, before, desc, cols, ncols, NULL);
	else
		pushJsonbValue(&st, WJB_VALUE, &null);
	outbox_capture_push_string(&st, WJB_KEY, "after");
	if (after != NULL)
		capture_push_dbz_row(&st, after, desc, cols, ncols, unavailable);
	else
		pushJsonbValue(&st, WJB_VALUE, &null);

	outbox_capture_push_string(&st, WJB_KEY, "source");
	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	capture_push_dbz_key_string(&st, "version", OUTBOX_VERSION);
	capture_push_dbz_key_string(&st, "connector", "postgresql");
	capture_push_dbz_key_string(&st, "name", src->name);
	outbox_capture_push_string(&st, WJB_KEY, "ts_ms");
	capture_push_int64(&st, WJB_VALUE, capture_epoch_ms(src->ts));
	outbox_capture_push_string(&st, WJB_KEY, "ts_us");
	capture_push_int64(&st, WJB_VALUE, src->ts + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY);
	outbox_capture_push_string(&st, WJB_KEY, "ts_ns");
	capture_push_int64(&st, WJB_VALUE, (src->ts + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY) * 1000);
	capture_push_dbz_key_string(&st, "snapshot", src->snapshot);
	capture_push_dbz_key_string(&st, "db", get_database_name(MyDatabaseId));
	if (!XLogRecPtrIsInvalid(src->lsn))
	{
		char	   *seq = XLogRecPtrIsInvalid(src->commit_lsn) ?
			psprintf("[null,\"" UINT64_FORMAT "\"]", (uint64) src->lsn) :
			psprintf("[\"" UINT64_FORMAT "\",\"" UINT64_FORMAT "\"]",
					 (uint64) src->commit_lsn, (uint64) src->lsn);

		capture_push_dbz_key_string(&st, "sequence", seq);
	}
	else
		capture_push_dbz_key_string(&st, "sequence", NULL);
	capture_push_dbz_key_string(&st, "schema", src->schema);
	capture_push_dbz_key_string(&st, "table", src->table);
	outbox_capture_push_string(&st, WJB_KEY, "txId");
	if (src->full_xid != 0)
		capture_push_int64(&st, WJB_VALUE, (int64) src->full_xid);
	else if (TransactionIdIsValid(src->xid))
		capture_push_int64(&st, WJB_VALUE, (int64) src->xid);
	else
		pushJsonbValue(&st, WJB_VALUE, &null);
	outbox_capture_push_string(&st, WJB_KEY, "lsn");
	if (!XLogRecPtrIsInvalid(src->lsn))
		capture_push_int64(&st, WJB_VALUE, (int64) src->lsn);
	else
		pushJsonbValue(&st, WJB_VALUE, &null);
	outbox_capture_push_string(&st, WJB_KEY, "xmin");
	pushJsonbValue(&st, WJB_VALUE, &null);
	outbox_capture_push_string(&st, WJB_KEY, "origin");
	pushJsonbValue(&st, WJB_VALUE, &null);
	outbox_capture_push_string(&st, WJB_KEY, "origin_lsn");
	pushJsonbValue(&st, WJB_VALUE, &null);
	pushJsonbValue(&st, WJB_END_OBJECT, NULL);

	capture_push_dbz_key_string(&st, "op", opstr);
	outbox_capture_push_string(&st, WJB_KEY, "ts_ms");
	capture_push_int64(&st, WJB_VALUE, capture_epoch_ms(now));
	outbox_capture_push_string(&st, WJB_KEY, "ts_us");
	capture_push_int64(&st, WJB_VALUE, now + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY);
	outbox_capture_push_string(&st, WJB_KEY, "ts_ns");
	capture_push_int64(&st, WJB_VALUE, (now + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY) * 1000);
	outbox_capture_push_string(&st, WJB_KEY, "transaction");
	pushJsonbValue(&st, WJB_VALUE, &null);
	return JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
}

/*
 * The record key of a change as Debezium's key object, {"id": 1}, as text;
 * NULL when a key column is not available (stored out of line, unchanged).
 */
char *
outbox_capture_debezium_key(HeapTuple tuple, TupleDesc desc,
							const CaptureColumn *keys, int nkeys,
							const bool *unavailable, int *len)
{
	JsonbParseState *st = NULL;
	Jsonb	   *jb;
	char	   *s;
	int			i;

	if (unavailable != NULL)
		for (i = 0; i < nkeys; i++)
			if (unavailable[i])
				return NULL;
	jb = JsonbValueToJsonb(capture_push_dbz_row(&st, tuple, desc, keys, nkeys, NULL));
	s = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
	*len = strlen(s);
	return s;
}

/*
 * Whether the key columns of two versions of a row differ (byte for byte,
 * as Debezium compares its key objects): a change of the key is sent as a
 * delete of the old key and a create of the new one.
 */
bool
outbox_capture_key_changed(HeapTuple oldtup, HeapTuple newtup, TupleDesc desc,
						   const CaptureColumn *keys, int nkeys)
{
	int			i;

	for (i = 0; i < nkeys; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, keys[i].attnum - 1);
		bool		n1;
		bool		n2;
		Datum		d1 = heap_getattr(oldtup, keys[i].attnum, desc, &n1);
		Datum		d2 = heap_getattr(newtup, keys[i].attnum, desc, &n2);

		if (n1 != n2)
			return true;
		if (!n1 && !datumIsEqual(d1, d2, att->attbyval, att->attlen))
			return true;
	}
	return false;
}
