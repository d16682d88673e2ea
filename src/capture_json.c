/*-------------------------------------------------------------------------
 *
 * capture_json.c
 *	  A captured row as a JSON object and its key as text: the same for the
 *	  trigger (capture.c) and the WAL miner (capture_decode.c).
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
#include "common/shortest_dec.h"
#include "mb/pg_wchar.h"
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
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"
#include "utils/geo_decls.h"
#include "utils/syscache.h"
#include "utils/varbit.h"

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
#define CAT_HSTORE		'h'		/* the hstore extension's type */
#define CAT_RANGE		'r'		/* ranges: their text may hold dates */

/*
 * The category of a type written as its text: a range, the hstore
 * extension's type (by its name, as the Debezium connector tells it), or
 * any other.
 */
static char
capture_text_category(Oid typid)
{
	HeapTuple	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	Form_pg_type typ;
	char		category = CAT_STRING;

	if (!HeapTupleIsValid(tup))
		return category;
	typ = (Form_pg_type) GETSTRUCT(tup);
	if (typ->typtype == TYPTYPE_RANGE)
		category = CAT_RANGE;
	else if (strcmp(NameStr(typ->typname), "hstore") == 0)
		category = CAT_HSTORE;
	ReleaseSysCache(tup);
	return category;
}

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
			return capture_text_category(typid);
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

/*
 * A number given as text into *v, or a string if it is not a finite number
 * ("NaN", "Infinity", "-Infinity", as Kafka's JSON converter writes them too).
 */
static void
capture_number_text(const char *s, JsonbValue *v)
{
	if (pg_strcasecmp(s, "NaN") == 0 || strstr(s, "nfinity") != NULL)
	{
		v->type = jbvString;
		v->val.string.val = (char *) s;
		v->val.string.len = strlen(s);
		return;
	}
	v->type = jbvNumeric;
	v->val.numeric = DatumGetNumeric(DirectFunctionCall3(numeric_in,
														 CStringGetDatum(s),
														 ObjectIdGetDatum(InvalidOid),
														 Int32GetDatum(-1)));
}

static void
capture_push_number_text(JsonbParseState **st, JsonbIteratorToken tok,
						 const char *s)
{
	JsonbValue	v;

	capture_number_text(s, &v);
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

/*
 * The elements of array val, of every dimension in order, and the base type
 * of its elements (and that type's typmod, from typmod, the array's).
 */
static ArrayType *
capture_array_elements(Datum val, Datum **elems, bool **nulls, int *nelems,
					   Oid *base, int32 *typmod)
{
	ArrayType  *arr = DatumGetArrayTypeP(val);
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int16		typlen;
	bool		typbyval;
	char		typalign;

	*base = getBaseTypeAndTypmod(elemtype, typmod);
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  elems, nulls, nelems);
	return arr;
}

static void
capture_push_array(JsonbParseState **st, JsonbIteratorToken tok, Datum val)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			pos = 0;
	Oid			base;
	int32		typmod = -1;

	arr = capture_array_elements(val, &elems, &nulls, &nelems, &base, &typmod);
	if (ARR_NDIM(arr) == 0)
	{
		pushJsonbValue(st, WJB_BEGIN_ARRAY, NULL);
		pushJsonbValue(st, WJB_END_ARRAY, NULL);
		return;
	}
	capture_push_dimension(st, tok, 0, ARR_NDIM(arr), ARR_DIMS(arr), elems,
						   nulls, &pos, base, capture_category(base));
}

static JsonbValue *
capture_push_composite(JsonbParseState **st, Datum val)
{
	HeapTupleHeader td = DatumGetHeapTupleHeader(val);
	TupleDesc	desc;
	HeapTupleData tmptup;
	int			i;
	JsonbValue *res;

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
		/* copied: the names go when the descriptor is released */
		outbox_capture_push_string(st, WJB_KEY, pstrdup(NameStr(att->attname)));
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
	res = pushJsonbValue(st, WJB_END_OBJECT, NULL);
	ReleaseTupleDesc(desc);
	return res;
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

/*
 * Whether the Debezium connector leaves a column of type typid out (with
 * include.unknown.datatypes false): types it does not know (tsquery,
 * pg_lsn, txid_snapshot, pg_snapshot), arrays of those, of domains, and
 * the arrays it never maps (money, name, interval, varbit, xml, point,
 * refcursor).
 */
static bool
capture_dbz_unknown(Oid typid)
{
	Oid			elem = get_element_type(getBaseType(typid));
	Oid			base;

	if (OidIsValid(elem))
	{
		if (get_typtype(elem) == TYPTYPE_DOMAIN)
			return true;
		switch (elem)
		{
			case CASHOID:
			case NAMEOID:
			case INTERVALOID:
			case VARBITOID:
			case XMLOID:
			case POINTOID:
			case REFCURSOROID:
				return true;
		}
		base = elem;
	}
	else
		base = getBaseType(typid);
	switch (base)
	{
		case TSQUERYOID:
		case PG_LSNOID:
		case TXID_SNAPSHOTOID:
		case PG_SNAPSHOTOID:
		case JSONPATHOID:
		case XIDOID:
		case XID8OID:
		case CIDOID:
		case TIDOID:
		case REGCLASSOID:
		case REGPROCOID:
		case REGPROCEDUREOID:
		case REGOPEROID:
		case REGOPERATOROID:
		case REGTYPEOID:
		case REGCONFIGOID:
		case REGDICTIONARYOID:
		case REGNAMESPACEOID:
		case REGROLEOID:
		case REGCOLLATIONOID:
		case INT2VECTOROID:
		case OIDVECTOROID:
		case ACLITEMOID:
		case REFCURSOROID:
			return true;
		case INT4RANGEOID:
		case INT8RANGEOID:
		case NUMRANGEOID:
		case TSRANGEOID:
		case TSTZRANGEOID:
		case DATERANGEOID:
			return false;
	}
	/* other ranges and the multiranges are Types.OTHER to the connector */
	return get_typtype(base) == TYPTYPE_RANGE || get_typtype(base) == TYPTYPE_MULTIRANGE;
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
	col->dbz_omit = capture_dbz_unknown(att->atttypid);
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

static bool capture_dbz_scalar(Datum val, Oid typid, int32 typmod,
							   char category, FmgrInfo *out, JsonbValue *v);
static JsonbValue *capture_push_dbz_array(JsonbParseState **st, Datum val,
										  int32 typmod);

static void
capture_set_string(JsonbValue *v, const char *s)
{
	v->type = jbvString;
	v->val.string.val = (char *) s;
	v->val.string.len = strlen(s);
}

static void
capture_set_int64(JsonbValue *v, int64 n)
{
	v->type = jbvNumeric;
	v->val.numeric = int64_to_numeric(n);
}

/* microseconds since 1970 of a timestamp */
static int64
capture_epoch_us(Timestamp t)
{
	return t + (int64) DBZ_UNIX_EPOCH_DAYS * USECS_PER_DAY;
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
 * the fraction's digits (0: none), or -1 for as Java's ISO_OFFSET_TIME
 * writes a time: the fraction without its trailing zeros (none for whole
 * seconds).
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
	{
		int			u = usec;

		for (digits = 6; digits > 0 && u % 10 == 0; digits--)
			u /= 10;
	}
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
	if (tm.tm_year < 0)
		appendStringInfo(&buf, "-%04d", -tm.tm_year);	/* 1 BC is year 0 */
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

/* Push a value built in memory (objects of scalars and objects). */
static void
capture_push_built(JsonbParseState **st, JsonbIteratorToken tok, JsonbValue *v)
{
	int			i;

	if (v->type != jbvObject)
	{
		pushJsonbValue(st, tok, v);
		return;
	}
	pushJsonbValue(st, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < v->val.object.nPairs; i++)
	{
		pushJsonbValue(st, WJB_KEY, &v->val.object.pairs[i].key);
		capture_push_built(st, WJB_VALUE, &v->val.object.pairs[i].value);
	}
	pushJsonbValue(st, WJB_END_OBJECT, NULL);
}

static bool capture_dbz_geometric(Datum val, Oid typid, JsonbValue *v);

/* Push a non-null value of base type typid the way Debezium writes it. */
static void
capture_push_dbz_value(JsonbParseState **st, JsonbIteratorToken tok, Datum val,
					   Oid typid, int32 typmod, char category, FmgrInfo *out)
{
	JsonbValue	v;

	if (capture_dbz_geometric(val, typid, &v))
	{
		capture_push_built(st, tok, &v);
		return;
	}

	if (capture_dbz_scalar(val, typid, typmod, category, out, &v))
		pushJsonbValue(st, tok, &v);
	else if (category == CAT_ARRAY)
		(void) capture_push_dbz_array(st, val, typmod);
	else
		(void) capture_push_composite(st, val);
}

/*
 * An array as Debezium's list: the elements in order, each mapped as a
 * scalar is (a multi-dimensional array is flattened).  Returns the array
 * built, at top level.
 */
static JsonbValue *
capture_push_dbz_array(JsonbParseState **st, Datum val, int32 typmod)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	int			i;
	Oid			outfn;
	bool		varlena;
	FmgrInfo	out;
	int32		elemmod = typmod;
	Oid			base;
	char		category;

	(void) capture_array_elements(val, &elems, &nulls, &nelems, &base, &elemmod);
	getTypeOutputInfo(base, &outfn, &varlena);
	fmgr_info(outfn, &out);
	category = capture_category(base);
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
			capture_push_dbz_value(st, WJB_ELEM, elems[i], base, elemmod, category, &out);
	}
	return pushJsonbValue(st, WJB_END_ARRAY, NULL);
}

/*
 * A value's text with DateStyle ISO, as the connector's session has it
 * (the dates and times in a range's text, say), whatever the writer's.
 */
static char *
capture_output_iso(Datum val, Oid typid, FmgrInfo *out)
{
	int			style = DateStyle;
	char	   *volatile s = NULL;

	if (style == USE_ISO_DATES)
		return capture_output(val, typid, out);
	DateStyle = USE_ISO_DATES;
	PG_TRY();
	{
		s = capture_output(val, typid, out);
	}
	PG_FINALLY();
	{
		DateStyle = style;
	}
	PG_END_TRY();
	return s;
}

/*
 * bit and varbit wider than 1 as the connector's io.debezium.data.Bits: the
 * bit string read as an unsigned number, its last bit the lowest, written
 * as Java's BitSet.toByteArray() does (little-endian, without high zero
 * bytes: "" for zero), in base64.  '101' is "BQ==".
 */
static char *
capture_dbz_bits(VarBit *b)
{
	int			nbits = VARBITLEN(b);
	uint8	   *bytes = palloc0((nbits + 7) / 8 + 1);
	int			len = 0;
	int			i;
	StringInfoData buf;

	for (i = 0; i < nbits; i++)
	{
		int			pos = nbits - 1 - i;	/* the string's bit for the number's bit i */

		if (VARBITS(b)[pos / 8] & (0x80 >> (pos % 8)))
		{
			bytes[i / 8] |= (uint8) (1 << (i % 8));
			len = i / 8 + 1;
		}
	}
	initStringInfo(&buf);
	outbox_append_b64(&buf, bytes, len);
	pfree(bytes);
	return buf.data;
}

/* Whether a bit string has a bit set (bit(1), varbit(1): the boolean). */
static bool
capture_bits_any(VarBit *b)
{
	int			nbytes = VARBITBYTES(b);
	int			i;

	for (i = 0; i < nbytes; i++)
		if (VARBITS(b)[i] != 0)
			return true;		/* (the pad bits are zero) */
	return false;
}

/*
 * The shortest text of a float as a JSON number that stays a float's: in
 * plain decimal (jsonb has no exponent), a whole number with ".0" (Java
 * writes 1.0E15 where this writes 1000000000000000.0: the same number);
 * NaN and the infinities as strings.
 */
static void
capture_float_text(const char *text, bool finite, JsonbValue *v)
{
	char	   *plain;

	if (!finite)
	{
		capture_number_text(pstrdup(text), v);
		return;
	}
	plain = DatumGetCString(DirectFunctionCall1(numeric_out,
												DirectFunctionCall3(numeric_in, CStringGetDatum(text),
																	ObjectIdGetDatum(InvalidOid),
																	Int32GetDatum(-1))));
	if (strchr(plain, '.') == NULL)
		plain = psprintf("%s.0", plain);
	capture_number_text(plain, v);
}

/*
 * A double as a JSON number, written as Java's Double.toString() would
 * read back (the shortest text that does, "1.0" for a whole number); NaN
 * and the infinities as strings, as the JSON converter writes them.
 */
static void
capture_set_double(JsonbValue *v, double d)
{
	char		text[DOUBLE_SHORTEST_DECIMAL_LEN + 2];

	double_to_shortest_decimal_buf(d, text);
	capture_float_text(text, isfinite(d), v);
}

/* The same of a real, as Java's Float.toString() would read back. */
static void
capture_set_float4(JsonbValue *v, float f)
{
	char		text[FLOAT_SHORTEST_DECIMAL_LEN + 2];

	float_to_shortest_decimal_buf(f, text);
	capture_float_text(text, isfinite(f), v);
}

/* A double's 8 bytes, little-endian, at out. */
static void
capture_put_double_le(uint8 *out, double d)
{
	uint64		u;
	int			i;

	memcpy(&u, &d, sizeof(u));
	for (i = 0; i < 8; i++)
		out[i] = (uint8) (u >> (8 * i));
}

static JsonbValue *capture_pair(JsonbPair *p, int n, const char *k);
static void capture_object(JsonbValue *v, JsonbPair *pairs, int n);
static void capture_sorted_object(JsonbValue *v, int n, const char *const *keys,
								  JsonbValue *values);

/*
 * point as the connector's io.debezium.data.geometry.Point: x, y, its WKB
 * (a little-endian WKB point: byte order 1, type 1, x, y) in base64, and a
 * null srid.  An object in jsonb's key order (by length, then bytes).
 */
static void
capture_dbz_point(Point *pt, JsonbValue *v)
{
	static const char *const keys[] = {"x", "y", "wkb", "srid"};
	JsonbValue	values[4];
	uint8		wkb[21] = {1, 1, 0, 0, 0};
	StringInfoData buf;

	capture_put_double_le(&wkb[5], pt->x);
	capture_put_double_le(&wkb[13], pt->y);
	initStringInfo(&buf);
	outbox_append_b64(&buf, wkb, sizeof(wkb));
	capture_set_double(&values[0], pt->x);
	capture_set_double(&values[1], pt->y);
	capture_set_string(&values[2], buf.data);
	values[3].type = jbvNull;
	capture_sorted_object(v, 4, keys, values);
}

/* A JSON object of n pairs whose keys are given in jsonb's order. */
static void
capture_sorted_object(JsonbValue *v, int n, const char *const *keys, JsonbValue *values)
{
	JsonbPair  *pairs = palloc(n * sizeof(JsonbPair));
	int			i;

	for (i = 0; i < n; i++)
		*capture_pair(&pairs[i], i, keys[i]) = values[i];
	capture_object(v, pairs, n);
}

/* WKB, little-endian: a 32-bit number, a point. */
static void
capture_wkb_u32(StringInfo b, uint32 n)
{
	int			i;

	for (i = 0; i < 4; i++)
		appendStringInfoChar(b, (char) (n >> (8 * i)));
}

static void
capture_wkb_point(StringInfo b, double x, double y)
{
	uint8		d[16];

	capture_put_double_le(d, x);
	capture_put_double_le(d + 8, y);
	appendBinaryStringInfo(b, (const char *) d, sizeof(d));
}

/* The header of a WKB line string (type 2) or polygon (3). */
static void
capture_wkb_start(StringInfo b, uint32 type)
{
	appendStringInfoChar(b, 1);
	capture_wkb_u32(b, type);
}

/*
 * box, lseg, path and polygon as the connector's io.debezium.data.geometry.
 * Geometry (since Debezium 3.7): the WKB in base64, a null srid, and
 * extensions naming the PostgreSQL type (and whether a path is closed).
 */
static void
capture_dbz_geometry(StringInfo wkb, const char *type, const char *closed, JsonbValue *v)
{
	static const char *const keys[] = {"wkb", "srid", "extensions"};
	static const char *const ext_keys[] = {"type", "closed"};
	JsonbValue	values[3];
	JsonbValue	ext[2];
	StringInfoData b64;

	initStringInfo(&b64);
	outbox_append_b64(&b64, (const uint8 *) wkb->data, wkb->len);
	capture_set_string(&values[0], b64.data);
	values[1].type = jbvNull;
	capture_set_string(&ext[0], type);
	if (closed)
		capture_set_string(&ext[1], closed);
	capture_sorted_object(&values[2], closed ? 2 : 1, ext_keys, ext);
	capture_sorted_object(v, 3, keys, values);
}

/*
 * The geometric types as the connector writes them, into *v; false for any
 * other type.
 */
static bool
capture_dbz_geometric(Datum val, Oid typid, JsonbValue *v)
{
	StringInfoData wkb;
	int			i;

	switch (typid)
	{
		case BOXOID:
		case LSEGOID:
		case PATHOID:
		case POLYGONOID:
			initStringInfo(&wkb);
			break;
	}
	switch (typid)
	{
		case POINTOID:
			capture_dbz_point(DatumGetPointP(val), v);
			return true;
		case BOXOID:
			{
				/* the corners from the first (high) one around, closed */
				BOX		   *box = DatumGetBoxP(val);

				capture_wkb_start(&wkb, 3);
				capture_wkb_u32(&wkb, 1);
				capture_wkb_u32(&wkb, 5);
				capture_wkb_point(&wkb, box->high.x, box->high.y);
				capture_wkb_point(&wkb, box->high.x, box->low.y);
				capture_wkb_point(&wkb, box->low.x, box->low.y);
				capture_wkb_point(&wkb, box->low.x, box->high.y);
				capture_wkb_point(&wkb, box->high.x, box->high.y);
				capture_dbz_geometry(&wkb, "box", NULL, v);
			}
			return true;
		case LSEGOID:
			{
				LSEG	   *l = DatumGetLsegP(val);

				capture_wkb_start(&wkb, 2);
				capture_wkb_u32(&wkb, 2);
				capture_wkb_point(&wkb, l->p[0].x, l->p[0].y);
				capture_wkb_point(&wkb, l->p[1].x, l->p[1].y);
				capture_dbz_geometry(&wkb, "lseg", NULL, v);
			}
			return true;
		case PATHOID:
			{
				PATH	   *p = DatumGetPathP(val);

				capture_wkb_start(&wkb, 2);
				capture_wkb_u32(&wkb, p->npts);
				for (i = 0; i < p->npts; i++)
					capture_wkb_point(&wkb, p->p[i].x, p->p[i].y);
				capture_dbz_geometry(&wkb, "path", p->closed ? "true" : "false", v);
			}
			return true;
		case POLYGONOID:
			{
				/* one ring, closed as WKB wants it */
				POLYGON    *p = DatumGetPolygonP(val);
				bool		open = p->npts > 0 &&
					(p->p[0].x != p->p[p->npts - 1].x || p->p[0].y != p->p[p->npts - 1].y);

				capture_wkb_start(&wkb, 3);
				capture_wkb_u32(&wkb, 1);
				capture_wkb_u32(&wkb, p->npts + (open ? 1 : 0));
				for (i = 0; i < p->npts; i++)
					capture_wkb_point(&wkb, p->p[i].x, p->p[i].y);
				if (open)
					capture_wkb_point(&wkb, p->p[0].x, p->p[0].y);
				capture_dbz_geometry(&wkb, "polygon", NULL, v);
			}
			return true;
		case CIRCLEOID:
			{
				/* io.debezium.data.geometry.Circle: its center, its radius */
				static const char *const keys[] = {"center", "radius"};
				CIRCLE	   *c = DatumGetCircleP(val);
				JsonbValue	values[2];

				capture_dbz_point(&c->center, &values[0]);
				capture_set_double(&values[1], c->radius);
				capture_sorted_object(v, 2, keys, values);
			}
			return true;
		case LINEOID:
			{
				/* io.debezium.data.geometry.Line: Ax + By + C = 0 */
				static const char *const keys[] = {"a", "b", "c"};
				LINE	   *l = DatumGetLineP(val);
				JsonbValue	values[3];

				capture_set_double(&values[0], l->A);
				capture_set_double(&values[1], l->B);
				capture_set_double(&values[2], l->C);
				capture_sorted_object(v, 3, keys, values);
			}
			return true;
	}
	return false;
}

/* Java's String.hashCode() of s (in the database encoding), over UTF-16. */
static uint32
capture_java_hash(const char *s, int len)
{
	uint32		h = 0;
	const unsigned char *u;
	const unsigned char *end;
	char	   *utf8 = NULL;

	if (GetDatabaseEncoding() != PG_UTF8 && GetDatabaseEncoding() != PG_SQL_ASCII)
	{
		utf8 = pg_server_to_any(s, len, PG_UTF8);
		if (utf8 != s)
		{
			s = utf8;
			len = strlen(utf8);
		}
	}
	u = (const unsigned char *) s;
	end = u + len;
	while (u < end)
	{
		pg_wchar	c;
		int			n = GetDatabaseEncoding() == PG_SQL_ASCII ? 1 : pg_utf_mblen(u);

		if (n > end - u || !pg_utf8_islegal(u, n) || GetDatabaseEncoding() == PG_SQL_ASCII)
		{
			c = *u;				/* (Java would have read it otherwise) */
			n = 1;
		}
		else
			c = utf8_to_unicode(u);
		u += n;
		if (c > 0xFFFF)
		{
			h = 31 * h + (uint32) (0xD800 + ((c - 0x10000) >> 10));
			h = 31 * h + (uint32) (0xDC00 + ((c - 0x10000) & 0x3FF));
		}
		else
			h = 31 * h + (uint32) c;
	}
	return h;
}

typedef struct CaptureHstorePair
{
	char	   *key;
	char	   *value;			/* NULL: SQL NULL */
	uint32		bucket;
	int			pos;
} CaptureHstorePair;

static int
capture_hstore_cmp(const void *a, const void *b)
{
	const CaptureHstorePair *x = a;
	const CaptureHstorePair *y = b;

	if (x->bucket != y->bucket)
		return x->bucket < y->bucket ? -1 : 1;
	return x->pos - y->pos;
}

/*
 * s as a JSON string the way Jackson (the connector's JSON writer) escapes
 * it: \" \\ \b \f \n \r \t, other controls \u00XX in upper case.
 */
static void
capture_jackson_string(StringInfo buf, const char *s)
{
	const unsigned char *p;

	appendStringInfoChar(buf, '"');
	for (p = (const unsigned char *) s; *p; p++)
	{
		switch (*p)
		{
			case '"':
				appendStringInfoString(buf, "\\\"");
				break;
			case '\\':
				appendStringInfoString(buf, "\\\\");
				break;
			case '\b':
				appendStringInfoString(buf, "\\b");
				break;
			case '\f':
				appendStringInfoString(buf, "\\f");
				break;
			case '\n':
				appendStringInfoString(buf, "\\n");
				break;
			case '\r':
				appendStringInfoString(buf, "\\r");
				break;
			case '\t':
				appendStringInfoString(buf, "\\t");
				break;
			default:
				if (*p < 0x20)
					appendStringInfo(buf, "\\u%04X", *p);
				else
					appendStringInfoChar(buf, (char) *p);
		}
	}
	appendStringInfoChar(buf, '"');
}

/* One quoted string of hstore's text at *p (past it after), unescaped. */
static char *
capture_hstore_string(const char **p)
{
	StringInfoData buf;
	const char *q = *p;

	if (*q != '"')
		elog(ERROR, "outbox: unexpected hstore text");
	initStringInfo(&buf);
	for (q++; *q && *q != '"'; q++)
	{
		if (*q == '\\' && q[1] != '\0')
			q++;
		appendStringInfoChar(&buf, *q);
	}
	if (*q != '"')
		elog(ERROR, "outbox: unexpected hstore text");
	*p = q + 1;
	return buf.data;
}

/*
 * hstore as the connector writes it with hstore.handling.mode json: a
 * string of JSON text, an object of the pairs with null for a NULL value,
 * in the order of a java.util.HashMap filled in hstore's order (the order
 * its text has): by bucket of the key's hash, then in that order.
 */
static char *
capture_dbz_hstore(const char *text)
{
	CaptureHstorePair *pairs = NULL;
	int			n = 0;
	int			max = 0;
	uint32		cap = 16;
	const char *p = text;
	StringInfoData buf;
	int			i;

	while (*p)
	{
		while (*p == ' ' || *p == ',')
			p++;
		if (*p == '\0')
			break;
		if (n == max)
		{
			max = Max(8, 2 * max);
			pairs = pairs ? repalloc(pairs, max * sizeof(*pairs)) : palloc(max * sizeof(*pairs));
		}
		pairs[n].key = capture_hstore_string(&p);
		if (strncmp(p, "=>", 2) != 0)
			elog(ERROR, "outbox: unexpected hstore text");
		p += 2;
		if (strncmp(p, "NULL", 4) == 0)
		{
			pairs[n].value = NULL;
			p += 4;
		}
		else
			pairs[n].value = capture_hstore_string(&p);
		pairs[n].pos = n;
		n++;
	}
	/*
	 * HashMap's table, filled in this order: 16 buckets, doubled when it
	 * holds more than 3/4 of them, or when a put makes a bucket's ninth
	 * entry while it has fewer than 64 (at 64 such a bucket becomes a tree,
	 * whose order is not followed here: only keys made to collide get one).
	 */
	{
		uint32	   *count = palloc0(cap * sizeof(uint32));

		for (i = 0; i < n; i++)
		{
			uint32		h = capture_java_hash(pairs[i].key, strlen(pairs[i].key));
			bool		grow;
			int			j;

			pairs[i].bucket = h ^ (h >> 16);	/* the spread hash, for now */
			grow = ++count[pairs[i].bucket & (cap - 1)] >= 9 && cap < 64;
			grow = grow || (uint64) (i + 1) * 4 > (uint64) cap * 3;
			while (grow)
			{
				cap *= 2;
				pfree(count);
				count = palloc0(cap * sizeof(uint32));
				for (j = 0; j <= i; j++)
					count[pairs[j].bucket & (cap - 1)]++;
				grow = (uint64) (i + 1) * 4 > (uint64) cap * 3;
			}
		}
		pfree(count);
		for (i = 0; i < n; i++)
			pairs[i].bucket &= cap - 1;
	}
	if (n > 1)
		qsort(pairs, n, sizeof(*pairs), capture_hstore_cmp);
	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < n; i++)
	{
		if (i > 0)
			appendStringInfoChar(&buf, ',');
		capture_jackson_string(&buf, pairs[i].key);
		appendStringInfoChar(&buf, ':');
		if (pairs[i].value == NULL)
			appendStringInfoString(&buf, "null");
		else
			capture_jackson_string(&buf, pairs[i].value);
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

/*
 * A non-null value of base type typid (of capture_category category) as
 * Debezium writes it, into *v, if it is a scalar; false for an array or a
 * composite.
 */
static bool
capture_dbz_scalar(Datum val, Oid typid, int32 typmod, char category,
				   FmgrInfo *out, JsonbValue *v)
{
	switch (typid)
	{
		case BOOLOID:
			v->type = jbvBool;
			v->val.boolean = DatumGetBool(val);
			return true;
		case INT2OID:
			capture_set_int64(v, DatumGetInt16(val));
			return true;
		case INT4OID:
			capture_set_int64(v, DatumGetInt32(val));
			return true;
		case INT8OID:
			capture_set_int64(v, DatumGetInt64(val));
			return true;
		case OIDOID:
			/* the connector's INT64, unsigned as PostgreSQL's */
			capture_set_int64(v, (int64) DatumGetObjectId(val));
			return true;
		case BITOID:
		case VARBITOID:
			/* bit(1), varbit(1): a boolean; wider: Bits */
			if (typmod == 1)
			{
				v->type = jbvBool;
				v->val.boolean = capture_bits_any(DatumGetVarBitP(val));
			}
			else
				capture_set_string(v, capture_dbz_bits(DatumGetVarBitP(val)));
			return true;
		case FLOAT4OID:
			capture_set_float4(v, DatumGetFloat4(val));
			return true;
		case FLOAT8OID:
			capture_set_double(v, DatumGetFloat8(val));
			return true;
		case TIMESTAMPTZOID:
			capture_set_string(v, capture_dbz_zoned_timestamp(DatumGetTimestampTz(val), typmod));
			return true;
		case NUMERICOID:
			{
				Numeric		n = DatumGetNumeric(val);

				/* Debezium's SpecialValueDecimal names */
				if (numeric_is_nan(n))
					capture_set_string(v, "NAN");
				else if (numeric_is_inf(n))
					capture_set_string(v, capture_output(val, typid, out)[0] == '-' ?
									   "NEGATIVE_INFINITY" : "POSITIVE_INFINITY");
				else
					capture_set_string(v, capture_output(val, typid, out));
			}
			return true;
		case CASHOID:
			capture_set_string(v, DatumGetCString(DirectFunctionCall1(numeric_out,
																	  DirectFunctionCall1(cash_numeric, val))));
			return true;
		case DATEOID:
			{
				DateADT		d = DatumGetDateADT(val);

				if (DATE_NOT_FINITE(d))
					capture_set_int64(v, DATE_IS_NOBEGIN(d) ? DBZ_DATE_NEG_INFINITY :
									  DBZ_DATE_POS_INFINITY);
				else
					capture_set_int64(v, (int64) d + DBZ_UNIX_EPOCH_DAYS);
			}
			return true;
		case TIMEOID:
			{
				TimeADT		t = DatumGetTimeADT(val);

				/* time(0) to time(3): Time, milliseconds; else MicroTime */
				capture_set_int64(v, typmod >= 0 && typmod <= 3 ? t / 1000 : t);
			}
			return true;
		case TIMESTAMPOID:
			{
				Timestamp	t = DatumGetTimestamp(val);
				int64		micros;

				if (TIMESTAMP_NOT_FINITE(t))
					micros = TIMESTAMP_IS_NOBEGIN(t) ? DBZ_TIMESTAMP_NEG_INFINITY :
						DBZ_TIMESTAMP_POS_INFINITY;
				else
					micros = capture_epoch_us(t);
				/* timestamp(0) to timestamp(3): Timestamp, milliseconds */
				capture_set_int64(v, typmod >= 0 && typmod <= 3 ?
								  capture_floor_div(micros, 1000) : micros);
			}
			return true;
		case TIMETZOID:
			{
				TimeTzADT  *t = DatumGetTimeTzADTP(val);
				int64		utc = t->time + (int64) t->zone * USECS_PER_SEC;
				StringInfoData buf;

				/* the end of the day at UTC: the connector's own text */
				if (t->time == USECS_PER_DAY && t->zone == 0)
				{
					capture_set_string(v, "24:00:00Z");
					return true;
				}
				utc %= USECS_PER_DAY;
				if (utc < 0)
					utc += USECS_PER_DAY;
				initStringInfo(&buf);
				capture_append_time(&buf, utc, -1);
				appendStringInfoChar(&buf, 'Z');
				capture_set_string(v, buf.data);
			}
			return true;
		case INTERVALOID:
			{
				Interval   *i = DatumGetIntervalP(val);
				double		micros;

#ifdef INTERVAL_NOT_FINITE
				if (INTERVAL_NOT_FINITE(i))
				{
					capture_set_string(v, INTERVAL_IS_NOBEGIN(i) ? "-infinity" : "infinity");
					return true;
				}
#endif
				micros = (double) i->month * DBZ_DAYS_PER_MONTH * USECS_PER_DAY +
					(double) i->day * USECS_PER_DAY + (double) i->time;
				/* saturated, as Java's (long) cast does */
				if (micros >= (double) PG_INT64_MAX)
					capture_set_int64(v, PG_INT64_MAX);
				else if (micros <= (double) PG_INT64_MIN)
					capture_set_int64(v, PG_INT64_MIN);
				else
					capture_set_int64(v, (int64) micros);
			}
			return true;
		case BYTEAOID:
			{
				bytea	   *b = DatumGetByteaPP(val);
				StringInfoData buf;

				initStringInfo(&buf);
				outbox_append_b64(&buf, (const uint8 *) VARDATA_ANY(b),
								  VARSIZE_ANY_EXHDR(b));
				capture_set_string(v, buf.data);
			}
			return true;
		case JSONBOID:
			{
				Jsonb	   *jb = DatumGetJsonbP(val);

				capture_set_string(v, JsonbToCString(NULL, &jb->root, VARSIZE(jb)));
			}
			return true;
		default:
			if (category == CAT_ARRAY || category == CAT_COMPOSITE)
				return false;
			if (category == CAT_HSTORE)
			{
				capture_set_string(v, capture_dbz_hstore(capture_output(val, typid, out)));
				return true;
			}
			/* json, uuid, text, enums, xml, inet, ranges ...: their text */
			capture_set_string(v, category == CAT_RANGE ? capture_output_iso(val, typid, out) :
							   capture_output(val, typid, out));
			return true;
	}
}

/* A column's value as Debezium writes it, into *v. */
static void
capture_dbz_column(const CaptureColumn *col, Datum val, JsonbValue *v)
{
	JsonbParseState *st = NULL;

	if (col->category == CAT_ARRAY)
		*v = *capture_push_dbz_array(&st, val, col->typmod);
	else if (col->category == CAT_COMPOSITE)
		*v = *capture_push_composite(&st, val);
	else if (capture_dbz_geometric(val, col->typid, v))
		;
	else if (!capture_dbz_scalar(val, col->typid, col->typmod, col->category,
								 (FmgrInfo *) &col->out, v))
		elog(ERROR, "outbox: type %u is not a scalar", col->typid);
}

/*
 * The order in which a jsonb object stores the keys of cols (by length,
 * then bytes), so that an object of them is built without sorting it per
 * row.  Allocated in the current memory context.
 */
static const CaptureColumn *order_cols;

static int
capture_order_cmp(const void *a, const void *b)
{
	const char *ka = order_cols[*(const int *) a].name;
	const char *kb = order_cols[*(const int *) b].name;
	size_t		la = strlen(ka);
	size_t		lb = strlen(kb);

	if (la != lb)
		return la < lb ? -1 : 1;
	return memcmp(ka, kb, la);
}

int *
outbox_capture_json_order(const CaptureColumn *cols, int ncols)
{
	int		   *order = palloc(Max(ncols, 1) * sizeof(int));
	int			i;

	for (i = 0; i < ncols; i++)
		order[i] = i;
	order_cols = cols;
	qsort(order, ncols, sizeof(int), capture_order_cmp);
	order_cols = NULL;
	return order;
}

/* Fill pair p with key k (a literal) and make its value the one returned. */
static JsonbValue *
capture_pair(JsonbPair *p, int n, const char *k)
{
	p->key.type = jbvString;
	p->key.val.string.val = (char *) k;
	p->key.val.string.len = strlen(k);
	p->order = n;
	return &p->value;
}

static void
capture_object(JsonbValue *v, JsonbPair *pairs, int n)
{
	v->type = jbvObject;
	v->val.object.nPairs = n;
	v->val.object.pairs = pairs;
}

/*
 * The connector's placeholder for a TOASTed value an update left unchanged,
 * of the column's type: its text; for bytea its bytes in base64; for an
 * array, one element of the element type standing for it (so that the
 * field stays an array): the text for text-like elements, the text's bytes
 * as numbers for integer and date elements, base64 for bytea, the
 * connector's own uuid for uuid; for hstore, an object of the text to it.
 */
static void
capture_dbz_unavailable(const CaptureColumn *col, JsonbValue *v)
{
	if (col->category == CAT_ARRAY)
	{
		Oid			elem = getBaseType(get_element_type(col->typid));
		const char *text = CAPTURE_DEBEZIUM_UNAVAILABLE;
		int			len = strlen(text);
		JsonbValue *elems;
		int			n = 1;
		int			i;

		if (elem == INT2OID || elem == INT4OID || elem == INT8OID || elem == DATEOID)
		{
			n = len;
			elems = palloc(n * sizeof(JsonbValue));
			for (i = 0; i < n; i++)
				capture_set_int64(&elems[i], (unsigned char) text[i]);
		}
		else
		{
			elems = palloc(sizeof(JsonbValue));
			capture_set_string(elems, elem == BYTEAOID ? CAPTURE_DEBEZIUM_UNAVAILABLE_B64 :
							   elem == UUIDOID ? CAPTURE_DEBEZIUM_UNAVAILABLE_UUID : text);
		}
		v->type = jbvArray;
		v->val.array.nElems = n;
		v->val.array.elems = elems;
		v->val.array.rawScalar = false;
	}
	else if (col->category == CAT_HSTORE)
		capture_set_string(v, "{\"" CAPTURE_DEBEZIUM_UNAVAILABLE "\":\"" CAPTURE_DEBEZIUM_UNAVAILABLE "\"}");
	else
		capture_set_string(v, col->typid == BYTEAOID ? CAPTURE_DEBEZIUM_UNAVAILABLE_B64 :
						   CAPTURE_DEBEZIUM_UNAVAILABLE);
}

/*
 * The row as a Debezium row object: every column, in the object's order,
 * the unavailable ones (by position in cols) so marked.
 */
static void
capture_dbz_row(JsonbValue *v, HeapTuple tuple, TupleDesc desc,
				const CaptureColumn *cols, int ncols, const int *order,
				const bool *unavailable)
{
	JsonbPair  *pairs = palloc(Max(ncols, 1) * sizeof(JsonbPair));
	int			n = 0;
	int			k;

	for (k = 0; k < ncols; k++)
	{
		int			i = order[k];
		const CaptureColumn *col = &cols[i];
		JsonbValue *cv;
		bool		isnull;
		Datum		d;

		if (col->dbz_omit)
			continue;
		cv = capture_pair(&pairs[n], n, col->name);
		n++;

		if (unavailable != NULL && unavailable[i])
		{
			capture_dbz_unavailable(col, cv);
			continue;
		}
		d = heap_getattr(tuple, col->attnum, desc, &isnull);
		if (isnull)
			cv->type = jbvNull;
		else
			capture_dbz_column(col, d, cv);
	}
	capture_object(v, pairs, n);
}

/*
 * The three keys of a time, ts_ms, ts_ns and ts_us (in that order, from
 * *n on), of t.
 */
static void
capture_pair_times(JsonbPair *pairs, int *n, TimestampTz t)
{
	capture_set_int64(capture_pair(&pairs[*n], *n, "ts_ms"), capture_floor_div(capture_epoch_us(t), 1000)), (*n)++;
	capture_set_int64(capture_pair(&pairs[*n], *n, "ts_ns"), capture_epoch_us(t) * 1000), (*n)++;
	capture_set_int64(capture_pair(&pairs[*n], *n, "ts_us"), capture_epoch_us(t)), (*n)++;
}

static void
capture_set_string_or_null(JsonbValue *v, const char *s)
{
	if (s == NULL)
		v->type = jbvNull;
	else
		capture_set_string(v, s);
}

/*
 * A change as Debezium's envelope: {"before", "after", "source", "op",
 * "ts_ms", "ts_us", "ts_ns", "transaction"}.  op is outbox's name of it
 * (insert, update, delete, read, truncate), written as Debezium's letter.
 * order is outbox_capture_json_order(cols).  unavailable (by
 * position in cols, or NULL) marks the after row's unchanged TOASTed
 * columns, which the WAL does not carry.
 *
 * The objects are built in jsonb's own key order (by length, then bytes),
 * so none is sorted per change: the keys below are listed in that order.
 */
Jsonb *
outbox_capture_debezium(const CaptureDebeziumSource *src, const char *op,
						HeapTuple before, HeapTuple after, TupleDesc desc,
						const CaptureColumn *cols, int ncols, const int *order,
						const bool *unavailable)
{
	static char *dbname = NULL;
	JsonbPair	env[8];
	JsonbPair	source[16];
	JsonbValue	root;
	JsonbValue *v;
	int			n = 0;

	/* a database is not renamed while a session is connected to it */
	if (dbname == NULL)
	{
		char	   *name = get_database_name(MyDatabaseId);

		dbname = MemoryContextStrdup(TopMemoryContext, name ? name : "");
	}

	capture_set_string(capture_pair(&source[n], n, "db"), dbname), n++;
	v = capture_pair(&source[n], n, "lsn"), n++;
	if (!XLogRecPtrIsInvalid(src->lsn))
		capture_set_int64(v, (int64) src->lsn);
	else
		v->type = jbvNull;
	capture_set_string(capture_pair(&source[n], n, "name"), src->name), n++;
	v = capture_pair(&source[n], n, "txId"), n++;
	if (src->full_xid != 0)
		capture_set_int64(v, (int64) src->full_xid);
	else if (TransactionIdIsValid(src->xid))
		capture_set_int64(v, (int64) src->xid);
	else
		v->type = jbvNull;
	capture_pair(&source[n], n, "xmin")->type = jbvNull, n++;
	capture_set_string(capture_pair(&source[n], n, "table"), src->table), n++;
	capture_pair_times(source, &n, src->ts);
	capture_pair(&source[n], n, "origin")->type = jbvNull, n++;
	capture_set_string(capture_pair(&source[n], n, "schema"), src->schema), n++;
	capture_set_string(capture_pair(&source[n], n, "version"), OUTBOX_VERSION), n++;
	capture_set_string_or_null(capture_pair(&source[n], n, "sequence"),
							   XLogRecPtrIsInvalid(src->lsn) ? NULL :
							   XLogRecPtrIsInvalid(src->commit_lsn) ?
							   psprintf("[null,\"" UINT64_FORMAT "\"]", (uint64) src->lsn) :
							   psprintf("[\"" UINT64_FORMAT "\",\"" UINT64_FORMAT "\"]",
										(uint64) src->commit_lsn, (uint64) src->lsn)), n++;
	capture_set_string(capture_pair(&source[n], n, "snapshot"), src->snapshot), n++;
	capture_set_string(capture_pair(&source[n], n, "connector"), "postgresql"), n++;
	capture_pair(&source[n], n, "origin_lsn")->type = jbvNull, n++;
	Assert(n == lengthof(source));

	n = 0;
	/* outbox's op names to Debezium's letters */
	capture_set_string(capture_pair(&env[n], n, "op"),
					   op[0] == 'i' ? "c" : op[0] == 'u' ? "u" : op[0] == 'd' ? "d" :
					   op[0] == 'r' ? "r" : "t"), n++;
	v = capture_pair(&env[n], n, "after"), n++;
	if (after != NULL)
		capture_dbz_row(v, after, desc, cols, ncols, order, unavailable);
	else
		v->type = jbvNull;
	capture_pair_times(env, &n, src->made);
	v = capture_pair(&env[n], n, "before"), n++;
	if (before != NULL)
		capture_dbz_row(v, before, desc, cols, ncols, order, NULL);
	else
		v->type = jbvNull;
	capture_object(capture_pair(&env[n], n, "source"), source, lengthof(source)), n++;
	capture_pair(&env[n], n, "transaction")->type = jbvNull, n++;
	Assert(n == lengthof(env));
	capture_object(&root, env, lengthof(env));
	return JsonbValueToJsonb(&root);
}

/* An in-memory JSON value as compact text, as Jackson writes it: {"a":[1,2]} */
static void
capture_append_compact(StringInfo buf, const JsonbValue *v)
{
	int			i;

	check_stack_depth();
	switch (v->type)
	{
		case jbvNull:
			appendStringInfoString(buf, "null");
			break;
		case jbvString:
			escape_json(buf, pnstrdup(v->val.string.val, v->val.string.len));
			break;
		case jbvNumeric:
			appendStringInfoString(buf, DatumGetCString(DirectFunctionCall1(numeric_out,
																			NumericGetDatum(v->val.numeric))));
			break;
		case jbvBool:
			appendStringInfoString(buf, v->val.boolean ? "true" : "false");
			break;
		case jbvArray:
			appendStringInfoChar(buf, '[');
			for (i = 0; i < v->val.array.nElems; i++)
			{
				if (i > 0)
					appendStringInfoChar(buf, ',');
				capture_append_compact(buf, &v->val.array.elems[i]);
			}
			appendStringInfoChar(buf, ']');
			break;
		case jbvObject:
			appendStringInfoChar(buf, '{');
			for (i = 0; i < v->val.object.nPairs; i++)
			{
				if (i > 0)
					appendStringInfoChar(buf, ',');
				capture_append_compact(buf, &v->val.object.pairs[i].key);
				appendStringInfoChar(buf, ':');
				capture_append_compact(buf, &v->val.object.pairs[i].value);
			}
			appendStringInfoChar(buf, '}');
			break;
		default:
			elog(ERROR, "outbox: unexpected JSON value type %d in a key", (int) v->type);
	}
}

/*
 * The record key of a change as Debezium's key object, as text, compact and
 * in the key's column order as the connector's JSON converter writes it:
 * {"id":1}.
 */
char *
outbox_capture_debezium_key(HeapTuple tuple, TupleDesc desc,
							const CaptureColumn *keys, int nkeys, int *len)
{
	StringInfoData buf;
	int			i;
	bool		first = true;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < nkeys; i++)
	{
		bool		isnull;
		Datum		d;
		JsonbValue	v;

		/* (the connector's key has no field it has no schema for) */
		if (keys[i].dbz_omit)
			continue;
		d = heap_getattr(tuple, keys[i].attnum, desc, &isnull);
		if (!first)
			appendStringInfoChar(&buf, ',');
		first = false;
		escape_json(&buf, keys[i].name);
		appendStringInfoChar(&buf, ':');
		if (isnull)
		{
			appendStringInfoString(&buf, "null");
			continue;
		}
		capture_dbz_column(&keys[i], d, &v);
		capture_append_compact(&buf, &v);
	}
	appendStringInfoChar(&buf, '}');
	*len = buf.len;
	return buf.data;
}

/*
 * Whether the key columns of two versions of a row differ (in value, as
 * Debezium compares its key objects; the same value compressed or not is
 * the same): a change of the key is sent as a delete of the old key and a
 * create of the new one.
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
		Datum		d1;
		Datum		d2;

		if (keys[i].dbz_omit)
			continue;			/* not in the key object */
		d1 = heap_getattr(oldtup, keys[i].attnum, desc, &n1);
		d2 = heap_getattr(newtup, keys[i].attnum, desc, &n2);
		if (n1 != n2)
			return true;
		/* the same bytes first: an unchanged out-of-line value is not read */
		if (!n1 && !datumIsEqual(d1, d2, att->attbyval, att->attlen) &&
			!datum_image_eq(d1, d2, att->attbyval, att->attlen))
			return true;
	}
	return false;
}
