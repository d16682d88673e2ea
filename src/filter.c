/*-------------------------------------------------------------------------
 *
 * filter.c
 *	  Per-subscription filters: a jsonpath over a message's document.
 *
 * outbox.subscribe(target, pattern, filter => '<jsonpath>') keeps, of the
 * messages whose topic matches the pattern, those the path selects in the
 * document
 *
 *	  {"topic": ..., "key": ... or null, "headers": {...} or null,
 *	   "payload": ...}
 *
 * A path that is a predicate ('$.payload.total > 100') selects a message
 * when it is true (as @@ does; unknown is false).  Any other path selects
 * it when it yields a single boolean that is true ('$.payload.vip'), or
 * else when it yields anything ('$.payload.items[*] ? (@.sku == "x")', as
 * @? does).  Evaluation is silent, and an error the silent form does not
 * hide (a datetime conversion that needs a time zone, say) makes the path
 * select nothing, with a WARNING: a message's content never stops
 * delivery.  PostgreSQL's own jsonpath evaluator runs it, called directly,
 * without SPI or the executor.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/jsonpath.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "outbox.h"
#include "subscription.h"

/* Whether a path is a predicate (a boolean at its top), evaluated as @@. */
bool
outbox_filter_is_predicate(struct JsonPath *path)
{
	JsonPathItem v;

	jspInit(&v, (JsonPath *) path);
	switch (v.type)
	{
		case jpiAnd:
		case jpiOr:
		case jpiNot:
		case jpiIsUnknown:
		case jpiEqual:
		case jpiNotEqual:
		case jpiLess:
		case jpiGreater:
		case jpiLessOrEqual:
		case jpiGreaterOrEqual:
		case jpiExists:
		case jpiLikeRegex:
		case jpiStartsWith:
			return true;
		default:
			return false;
	}
}

static void
filter_push_key(JsonbParseState **st, const char *key)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) key;
	v.val.string.len = strlen(key);
	pushJsonbValue(st, WJB_KEY, &v);
}

static void
filter_push_jsonb(JsonbParseState **st, Jsonb *jb)
{
	JsonbValue	v;

	if (jb == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvBinary;
		v.val.binary.data = &jb->root;
		v.val.binary.len = VARSIZE(jb) - VARHDRSZ;
	}
	pushJsonbValue(st, WJB_VALUE, &v);
}

/* A message's document, in the current memory context. */
Jsonb *
outbox_filter_doc(const char *topic, const char *key, Jsonb *headers, Jsonb *payload)
{
	JsonbParseState *st = NULL;
	JsonbValue	v;

	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	filter_push_key(&st, "topic");
	v.type = jbvString;
	v.val.string.val = (char *) topic;
	v.val.string.len = strlen(topic);
	pushJsonbValue(&st, WJB_VALUE, &v);
	filter_push_key(&st, "key");
	if (key == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvString;
		v.val.string.val = (char *) key;
		v.val.string.len = strlen(key);
	}
	pushJsonbValue(&st, WJB_VALUE, &v);
	filter_push_key(&st, "headers");
	filter_push_jsonb(&st, headers);
	filter_push_key(&st, "payload");
	filter_push_jsonb(&st, payload);
	return JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
}

/*
 * jsonb_path_match (or, with exists, jsonb_path_exists) of doc and the
 * filter, silent: the boolean, or -1 for NULL.
 */
static int
filter_call(const OutboxSubscription *s, Jsonb *doc, bool exists)
{
	static Jsonb *no_vars = NULL;
	LOCAL_FCINFO(fcinfo, 4);
	Datum		result;

	if (no_vars == NULL)
	{
		JsonbParseState *st = NULL;
		MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

		pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
		no_vars = JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
		MemoryContextSwitchTo(oldcxt);
	}
	InitFunctionCallInfoData(*fcinfo, NULL, 4, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = PointerGetDatum(doc);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = PointerGetDatum(s->filter);
	fcinfo->args[1].isnull = false;
	fcinfo->args[2].value = PointerGetDatum(no_vars);
	fcinfo->args[2].isnull = false;
	fcinfo->args[3].value = BoolGetDatum(true);	/* silent */
	fcinfo->args[3].isnull = false;
	result = exists ? jsonb_path_exists(fcinfo) : jsonb_path_match(fcinfo);
	return fcinfo->isnull ? -1 : (int) DatumGetBool(result);
}

/*
 * Whether the subscription's filter selects the document.  The evaluation
 * reads only the document and the path, and holds no lock or buffer an
 * error could leave behind, so an error of the value's (data exception,
 * program limit, unsupported feature, a variable the path names but which
 * is not there) is caught here and selects nothing; any other is thrown on.
 */
bool
outbox_filter_match(const OutboxSubscription *s, Jsonb *doc)
{
	static TimestampTz warned_at = 0;
	MemoryContext cxt = CurrentMemoryContext;
	volatile int r = 0;

	PG_TRY();
	{
		r = filter_call(s, doc, false);
		if (!s->filter_predicate && r < 0)
			r = filter_call(s, doc, true);
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		int			class;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		class = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
		if (edata->elevel != ERROR ||
			!(class == ERRCODE_TO_CATEGORY(ERRCODE_DATA_EXCEPTION) ||
			  class == ERRCODE_TO_CATEGORY(ERRCODE_PROGRAM_LIMIT_EXCEEDED) ||
			  class == ERRCODE_TO_CATEGORY(ERRCODE_FEATURE_NOT_SUPPORTED) ||
			  edata->sqlerrcode == ERRCODE_UNDEFINED_OBJECT))
			PG_RE_THROW();
		FlushErrorState();
		/* at most once a minute: a bad filter may fail for every message */
		if (TimestampDifferenceExceeds(warned_at, GetCurrentTimestamp(), 60 * 1000))
		{
			warned_at = GetCurrentTimestamp();
			ereport(WARNING,
					(errmsg("outbox filter of subscription \"%s\" selects nothing for a message: %s",
							s->pattern, edata->message),
					 errdetail("Such messages are not sent under this subscription; this is said at most once a minute."),
					 errhint("Correct the filter with outbox.subscribe(target, pattern, filter => ...).")));
		}
		FreeErrorData(edata);
		r = 0;
	}
	PG_END_TRY();
	return r > 0;
}

/*
 * Whether a message of topic and id goes to a holder of these
 * subscriptions: one matches the topic and has no filter, or one matches
 * the topic and its filter selects the message's document, which
 * make_doc(arg) makes (once) when a filter needs it.
 */
bool
outbox_subscriptions_select(const OutboxSubscription *subs, int nsubs,
							const char *topic, int64 id,
							Jsonb *(*make_doc) (void *arg), void *arg,
							bool *filtered)
{
	Jsonb	   *doc = NULL;
	int			i;

	*filtered = false;
	for (i = 0; i < nsubs; i++)
	{
		const OutboxSubscription *s = &subs[i];

		if (!outbox_subscription_matches(s, topic, id))
			continue;
		if (s->filter == NULL)
			return true;
		if (doc == NULL)
			doc = make_doc(arg);
		if (outbox_filter_match(s, doc))
			return true;
		*filtered = true;
	}
	return false;
}

/*
 * Set s's filter from a jsonpath datum of the subscriptions query (NULL for
 * none), copied into cxt.
 */
void
outbox_subscription_set_filter(OutboxSubscription *s, Datum d, bool isnull,
							   MemoryContext cxt)
{
	MemoryContext oldcxt;

	s->filter = NULL;
	s->filter_predicate = false;
	if (isnull)
		return;
	oldcxt = MemoryContextSwitchTo(cxt);
	s->filter = (struct JsonPath *) PG_DETOAST_DATUM_COPY(d);
	MemoryContextSwitchTo(oldcxt);
	s->filter_predicate = outbox_filter_is_predicate(s->filter);
}
