/*-------------------------------------------------------------------------
 *
 * relay_config.c
 *	  Targets, subscriptions and progress, loaded from the outbox tables.
 *
 * The relay keeps one RelayTarget per row of outbox.targets, in its own
 * memory context with its lanes and queued messages.  A reload (after a
 * target change committed, see emit.c and shmem.c) keeps the targets that
 * still exist, with their queues and requests in flight, builds new ones
 * from their recorded progress, and forgets dropped ones.  Every row is
 * checked as it is loaded, the way the target functions and the table's
 * constraints check it, since a superuser may have written it by hand: a
 * row that cannot be used is skipped with a WARNING, shown in outbox.lag,
 * and never makes the relay fail.
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

#include <math.h>

#include "relay.h"

MemoryContext relay_cxt = NULL;
List	   *relay_targets = NIL;
bool		relay_progress_has_batch_end = false;
bool		relay_config_incomplete = false;
bool		relay_dead_letters_keep_payload = false;
bool		relay_schema_operations = false;
bool		relay_schema_brokers = false;
bool		relay_schema_set_aside = false;
bool		relay_schema_aws = false;

/*
 * Every kind of target the relay delivers to (relay_transports[], set by
 * relay_main.c): looked up by kind, reached only through the table, so
 * that this file, which every other one uses, uses no transport.
 */
const RelayTransport *const *relay_kinds = NULL;

/*
 * The kinds (bit i: relay_kinds[i]) of which a target was loaded since the
 * relay started; never cleared.  A kind never used has no connection, no
 * library thread and nothing its descriptors could report: its drive is not
 * called (each costs a system call or two a turn).
 */
uint64		relay_kinds_used = 0;

/* Requests of target t on the wire. */
int
relay_target_in_flight(RelayTarget *t)
{
	int			i;
	int			n = 0;

	for (i = 0; i < t->nlanes; i++)
		if (t->lanes[i].in_flight)
			n++;
	return n;
}

/* Requests on the wire, over all targets. */
int
relay_in_flight(void)
{
	ListCell   *lc;
	int			n = 0;

	foreach(lc, relay_targets)
		n += relay_target_in_flight((RelayTarget *) lfirst(lc));
	return n;
}

/* The extension whose targets relay_targets holds. */
static Oid	loaded_extension = InvalidOid;

RelayTarget *
relay_find_target(int id)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->id == id)
			return t;
	}
	return NULL;
}

void
relay_free_target(RelayTarget *t)
{
	int			i;

	if (t->transport != NULL && t->transport->lane_release != NULL)
		for (i = 0; i < t->nlanes; i++)
			t->transport->lane_release(&t->lanes[i]);
	if (t->transport != NULL && t->transport->target_release != NULL && t->lanes != NULL)
		t->transport->target_release(t);
	relay_auth_release(t);
	MemoryContextDelete(t->cxt);
}

static char *
relay_spi_text(HeapTuple tup, TupleDesc desc, int col)
{
	return SPI_getvalue(tup, desc, col);
}

static int64
relay_spi_int(HeapTuple tup, TupleDesc desc, int col, bool *isnull)
{
	Datum		d = SPI_getbinval(tup, desc, col, isnull);

	if (*isnull)
		return 0;
	switch (TupleDescAttr(desc, col - 1)->atttypid)
	{
		case INT2OID:
			return DatumGetInt16(d);
		case INT4OID:
			return DatumGetInt32(d);
		default:
			return DatumGetInt64(d);
	}
}

/* Whether s[0..len) is an HTTP token, as header names must be. */
static bool
relay_token(const char *s, int len)
{
	int			i;

	if (len == 0)
		return false;
	for (i = 0; i < len; i++)
		if (!outbox_is_token_char((unsigned char) s[i]))
			return false;
	return true;
}

/*
 * Header lines of the target's headers object, as libcurl takes them:
 * "Name: value", or "Name;" for an empty value ("Name:" would remove a
 * header instead of sending it).  Returns a reason when the object is not
 * usable, else NULL.
 */
static const char *
relay_target_headers(RelayTarget *t, Jsonb *jb)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			max;
	char	   *name = NULL;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return "headers is not a JSON object";
	max = JB_ROOT_COUNT(jb);
	t->header_lines = palloc(sizeof(char *) * (max + 1));
	t->header_names = palloc(sizeof(char *) * (max + 1));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			if (!relay_token(v.val.string.val, v.val.string.len))
				return "a header name is not an HTTP token";
			name = pnstrdup(v.val.string.val, v.val.string.len);
		}
		else if (tok == WJB_VALUE)
		{
			char	   *value;
			pg_wchar	bad;

			if (v.type != jbvString)
				return "a header value is not a string";
			if (outbox_bad_char(v.val.string.val, v.val.string.len,
								OUTBOX_TEXT_HEADER_VALUE, &bad) > 0)
				return "a header value has a character that is not printable ASCII";
			value = pnstrdup(v.val.string.val, v.val.string.len);
			t->header_names[t->nheader_lines] = name;
			t->header_lines[t->nheader_lines++] = *value ?
				psprintf("%s: %s", name, value) : psprintf("%s;", name);
		}
	}
	return NULL;
}

/*
 * Build a target from a row of the configuration query (see
 * relay_load_config() for its columns), checking every field the way the
 * target functions and the table's constraints do: the row may have been
 * written by hand.  Returns NULL, with *problem set (a constant, or in the
 * caller's memory context: the target's is deleted), for a row that cannot
 * be used.  Without with_lanes only the options are read (to refresh a
 * known target's, relay_refresh_target).
 */
static RelayTarget *
relay_make_target(HeapTuple tup, TupleDesc desc, bool with_lanes,
				  const char **problem)
{
	MemoryContext cxt;
	MemoryContext oldcxt;
	RelayTarget *t;
	bool		isnull;
	char	   *s;
	Datum		d;
	int			i;

	*problem = NULL;
	cxt = AllocSetContextCreate(relay_cxt, "outbox target", ALLOCSET_DEFAULT_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);
	t = palloc0(sizeof(RelayTarget));
	t->cxt = cxt;
	t->id = (int) relay_spi_int(tup, desc, 1, &isnull);
	t->name = relay_spi_text(tup, desc, 2);
	s = relay_spi_text(tup, desc, 3);
	t->url = relay_spi_text(tup, desc, 4);
	t->channel = relay_spi_text(tup, desc, 5);
	t->batch_size = (int) relay_spi_int(tup, desc, 6, &isnull);
	t->nlanes = (int) relay_spi_int(tup, desc, 7, &isnull);
	t->max_attempts = (int) relay_spi_int(tup, desc, 8, &isnull);
	t->timeout_ms = (int) relay_spi_int(tup, desc, 9, &isnull);

	for (i = 0; s != NULL && relay_kinds != NULL && relay_kinds[i] != NULL; i++)
		if (strcmp(s, relay_kinds[i]->kind) == 0)
		{
			t->transport = relay_kinds[i];
			relay_kinds_used |= UINT64CONST(1) << i;
		}
	if (t->transport == NULL)
		*problem = "kind is not 'http', 'notify', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis' or 'sns'";
	else
		t->kind = t->transport->id;
	s = relay_spi_text(tup, desc, 24);
	t->strict = (s != NULL && strcmp(s, "strict") == 0);
	t->subject = relay_spi_text(tup, desc, 25);
	t->topic = relay_spi_text(tup, desc, 26);
	d = SPI_getbinval(tup, desc, 27, &isnull);
	if (!isnull)
	{
		t->properties_jb = DatumGetJsonbPCopy(d);
		t->properties = JsonbToCString(NULL, &t->properties_jb->root,
									   VARSIZE(t->properties_jb));
	}
	s = relay_spi_text(tup, desc, 28);
	if (s == NULL || strcmp(s, "outbox") == 0)
		t->format = RELAY_FORMAT_OUTBOX;
	else if (strcmp(s, "cloudevents") == 0)
		t->format = RELAY_FORMAT_CE_BINARY;
	else if (strcmp(s, "cloudevents-structured") == 0)
		t->format = RELAY_FORMAT_CE_STRUCTURED;
	else if (*problem == NULL)
		*problem = "format is not 'outbox', 'cloudevents' or 'cloudevents-structured'";
	if (*problem == NULL && t->format != RELAY_FORMAT_OUTBOX && t->kind == RELAY_NOTIFY)
		*problem = "a NOTIFY target cannot send CloudEvents";
	t->ce_source = relay_spi_text(tup, desc, 29);
	if (t->ce_source != NULL)
	{
		const char *c;

		for (c = t->ce_source; *c; c++)
			if ((unsigned char) *c <= 0x20 || *c == 0x7f)
				break;
		if ((*c != '\0' || t->ce_source[0] == '\0' || strlen(t->ce_source) > 1024) &&
			*problem == NULL)
			*problem = "ce_source is not 1 to 1024 bytes without white space or control characters";
	}
	else
		t->ce_source = pstrdup(relay_ce_default_source());
	t->stream = relay_spi_text(tup, desc, 30);
	t->maxlen = relay_spi_int(tup, desc, 31, &isnull);
	if (isnull)
		t->maxlen = 0;
	t->dedup_window = (int) relay_spi_int(tup, desc, 32, &isnull);
	if (isnull)
		t->dedup_window = -1;
	t->exchange = relay_spi_text(tup, desc, 33);
	t->routing_key = relay_spi_text(tup, desc, 34);
	t->unroutable_after_ms = relay_spi_int(tup, desc, 35, &isnull);
	if (isnull || t->unroutable_after_ms < 0)
		t->unroutable_after_ms = 0;
	t->credentials = relay_spi_text(tup, desc, 36);
	t->region = relay_spi_text(tup, desc, 37);
	t->aws_key_id = relay_spi_text(tup, desc, 38);
	t->aws_secret = relay_spi_text(tup, desc, 39);
	t->aws_token = relay_spi_text(tup, desc, 40);
	t->oauth_token_url = relay_spi_text(tup, desc, 41);
	t->oauth_client_id = relay_spi_text(tup, desc, 42);
	t->oauth_client_secret = relay_spi_text(tup, desc, 43);
	t->oauth_scope = relay_spi_text(tup, desc, 44);
	s = relay_spi_text(tup, desc, 45);
	t->oauth_client_post = s != NULL && strcmp(s, "post") == 0;
	t->aws_role_arn = relay_spi_text(tup, desc, 46);
	t->aws_token_file = relay_spi_text(tup, desc, 47);
	t->aws_sts_endpoint = relay_spi_text(tup, desc, 48);
	/* the kind's check below reads them (an SQS target's headers must be none) */
	d = SPI_getbinval(tup, desc, 11, &isnull);
	if (*problem == NULL && !isnull)
		*problem = relay_target_headers(t, DatumGetJsonbP(d));
	if (*problem == NULL)
	{
		/* OAuth2 client credentials, AWS web identity */
		const char *why = relay_auth_check(t);

		if (why != NULL)
			*problem = MemoryContextStrdup(oldcxt, why);
	}

	if (t->kind == RELAY_HTTP && *problem == NULL)
	{
		/* The URL itself is checked below (outbox_url_host). */
		if (t->url == NULL)
			*problem = "url is missing";
	}
	else if (t->kind == RELAY_NOTIFY && *problem == NULL)
	{
		if (t->channel == NULL || t->channel[0] == '\0' ||
			strlen(t->channel) >= NAMEDATALEN)
			*problem = "channel is not a channel name of 1 to 63 bytes";
	}
	else if (*problem == NULL && t->transport->check != NULL)
	{
		/* The kind's own options (NATS, Kafka), checked by its transport. */
		const char *why = t->transport->check(t);

		if (why != NULL)
			*problem = MemoryContextStrdup(oldcxt, why);
	}

	if (*problem == NULL && (t->batch_size < 1 || t->batch_size > RELAY_MAX_BATCH_SIZE))
		*problem = "batch_size is not between 1 and 1000";
	if (*problem == NULL && (t->nlanes < 1 || t->nlanes > 256 ||
							 (t->kind == RELAY_NOTIFY && t->nlanes != 1)))
		*problem = "lanes is not between 1 and 256 (1 for NOTIFY)";
	if (*problem == NULL && (t->max_attempts < 0 || t->max_attempts > 1000000))
		*problem = "max_attempts is not between 0 and 1000000";
	if (*problem == NULL && (t->timeout_ms < 10 || t->timeout_ms > 3600000))
		*problem = "timeout_ms is not between 10 and 3600000";

	for (i = 0; i < 2; i++)
	{
		const char *why;

		s = relay_spi_text(tup, desc, i == 0 ? 10 : 19);
		if (*problem != NULL || s == NULL)
			continue;
		why = outbox_parse_signing_key(s, &t->keys[t->nkeys]);
		if (why != NULL)
			*problem = MemoryContextStrdup(oldcxt, psprintf("%s: %s", i == 0 ? "secret" : "previous_secret", why));
		else
			t->nkeys++;
	}
	if (*problem == NULL && t->kind == RELAY_HTTP)
	{
		const char *why;

		t->host = outbox_url_host(t->url, &why);
		if (t->host == NULL)
			*problem = MemoryContextStrdup(oldcxt, psprintf("url: %s", why));
	}
	t->ca_file = relay_spi_text(tup, desc, 20);
	t->client_cert = relay_spi_text(tup, desc, 21);
	t->client_key = relay_spi_text(tup, desc, 22);
	d = SPI_getbinval(tup, desc, 23, &isnull);
	t->envelope_only = !isnull && DatumGetBool(d);

	/* Operations (NULL on a 0.1 schema: active, no limits). */
	s = relay_spi_text(tup, desc, 12);
	t->state = (s == NULL || strcmp(s, "active") == 0) ? 'a' :
		strcmp(s, "paused") == 0 ? 'p' : 'd';
	d = SPI_getbinval(tup, desc, 13, &isnull);
	t->max_rate = isnull ? 0 : DatumGetFloat8(d);
	if (*problem == NULL && (t->max_rate < 0 || t->max_rate > 1000000 || isnan(t->max_rate)))
		*problem = "max_rate is not between 0 and 1000000";
	t->disable_after_ms = relay_spi_int(tup, desc, 14, &isnull);
	t->pending_lanes = (int) relay_spi_int(tup, desc, 15, &isnull);
	if (*problem == NULL && (t->pending_lanes < 0 || t->pending_lanes > 256))
		*problem = "pending_lanes is not between 1 and 256";
	t->pending_ordering = relay_spi_text(tup, desc, 16);
	if (t->pending_ordering != NULL && t->pending_lanes == 0)
		t->pending_lanes = t->nlanes;
	if (t->pending_lanes == t->nlanes && t->pending_ordering == NULL)
		t->pending_lanes = 0;
	t->fingerprint = relay_spi_text(tup, desc, 17);
	t->retry_wanted = DatumGetBool(SPI_getbinval(tup, desc, 18, &isnull)) && !isnull;

	if (*problem != NULL)
	{
		MemoryContextSwitchTo(oldcxt);
		MemoryContextDelete(cxt);
		return NULL;
	}

	if (!with_lanes)
	{
		MemoryContextSwitchTo(oldcxt);
		return t;
	}
	t->lanes = palloc0(sizeof(RelayLane) * t->nlanes);
	relay_auth_create(t);
	if (t->transport->target_init != NULL)
		t->transport->target_init(t);
	for (i = 0; i < t->nlanes; i++)
	{
		t->lanes[i].target = t;
		t->lanes[i].index = i;
		t->lanes[i].done_id = -1;
		if (t->transport->lane_init != NULL)
			t->transport->lane_init(&t->lanes[i]);
	}
	t->read_id = -1;
	MemoryContextSwitchTo(oldcxt);
	return t;
}

/*
 * A target row that cannot be used is skipped: say so once per load, with
 * a WARNING and in its progress rows, which outbox.lag shows.  Its messages
 * wait until the row is fixed.
 */
static void
relay_report_bad_target(int id, const char *name, const char *problem)
{
	static SPIPlanPtr plan = NULL;
	Datum		args[2];
	char	   *error = psprintf("target is not delivered: %s", problem);

	ereport(WARNING,
			(errmsg("outbox relay skips target \"%s\": %s", name ? name : "?", problem),
			 errhint("Drop the target and create it again with outbox.create_http_target() or outbox.create_notify_target().")));
	if (plan == NULL)
	{
		Oid			argtypes[2] = {INT4OID, TEXTOID};

		plan = SPI_prepare("UPDATE outbox.progress SET last_error = $2, last_error_at = now()"
						   " WHERE target_id = $1 AND last_error IS DISTINCT FROM $2",
						   2, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the target error query");
		SPI_keepplan(plan);
	}
	args[0] = Int32GetDatum(id);
	args[1] = CStringGetTextDatum(error);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: could not record a target error");
	pfree(error);
}

/*
 * Load targets, subscriptions and progress.  Targets that still exist keep
 * their queues and requests in flight; new ones start from their recorded
 * progress; dropped ones are forgotten.  Runs in its own transaction.
 */
/*
 * A known target's row changed: take its new options (URL, headers,
 * secret, batch size, attempts, timeout, rate, state) for the next
 * requests, keeping its lanes and what they hold.  Lanes and ordering
 * change later, once the lanes are idle (relay_resize_target).
 */
static void
relay_refresh_target(RelayTarget *t, HeapTuple tup, TupleDesc desc)
{
	const char *problem;
	RelayTarget *n;
	MemoryContext oldcxt;
	char		was = t->state;

	char	   *fingerprint = relay_spi_text(tup, desc, 17);
	bool		isnull;

	if (t->fingerprint != NULL && fingerprint != NULL &&
		strcmp(t->fingerprint, fingerprint) == 0)
	{
		Datum		d = SPI_getbinval(tup, desc, 18, &isnull);

		t->retry_wanted = t->retry_wanted || (!isnull && DatumGetBool(d));
		return;
	}
	n = relay_make_target(tup, desc, false, &problem);
	if (n == NULL)
	{
		relay_report_bad_target(t->id, t->name, problem);
		return;
	}
	/*
	 * Another token endpoint, client, scope or role: the token is not
	 * good, and a target held for want of one tries the new options now.
	 */
	if (relay_auth_options_changed(t, n))
	{
		int			i;

		relay_auth_release(t);
		if (t->hold_attempts > 0)
		{
			t->hold_attempts = 0;
			t->held_until = 0;
			for (i = 0; i < t->nlanes; i++)
				t->lanes[i].next_attempt = 0;
		}
		for (i = 0; i < t->nlanes; i++)
			t->lanes[i].auth_again = false;
	}
	/* n's context holds the new strings: keep it, drop the previous one. */
	MemoryContextSetParent(n->cxt, t->cxt);
	if (t->opts_cxt)
		MemoryContextDelete(t->opts_cxt);
	t->opts_cxt = n->cxt;
	t->url = n->url;
	t->subject = n->subject;
	t->topic = n->topic;
	t->properties = n->properties;
	t->properties_jb = n->properties_jb;
	t->format = n->format;
	t->ce_source = n->ce_source;
	t->stream = n->stream;
	t->maxlen = n->maxlen;
	t->dedup_window = n->dedup_window;
	t->exchange = n->exchange;
	t->routing_key = n->routing_key;
	t->header_lines = n->header_lines;
	t->header_names = n->header_names;
	t->nheader_lines = n->nheader_lines;
	memcpy(t->keys, n->keys, sizeof(t->keys));
	t->nkeys = n->nkeys;
	t->host = n->host;
	t->ca_file = n->ca_file;
	t->client_cert = n->client_cert;
	t->client_key = n->client_key;
	t->credentials = n->credentials;
	t->region = n->region;
	t->aws_key_id = n->aws_key_id;
	t->aws_secret = n->aws_secret;
	t->aws_token = n->aws_token;
	t->oauth_token_url = n->oauth_token_url;
	t->aws_role_arn = n->aws_role_arn;
	t->aws_token_file = n->aws_token_file;
	t->aws_sts_endpoint = n->aws_sts_endpoint;
	t->auth_url = n->auth_url;
	t->auth_host = n->auth_host;
	t->oauth_client_id = n->oauth_client_id;
	t->oauth_client_secret = n->oauth_client_secret;
	t->oauth_scope = n->oauth_scope;
	t->oauth_client_post = n->oauth_client_post;
	if (t->auth == NULL)
		relay_auth_create(t);
	t->post_url = n->post_url;
	t->envelope_only = n->envelope_only;
	t->batch_size = n->batch_size;
	t->max_attempts = n->max_attempts;
	t->timeout_ms = n->timeout_ms;
	t->max_rate = n->max_rate;
	t->disable_after_ms = n->disable_after_ms;
	t->unroutable_after_ms = n->unroutable_after_ms;
	t->pending_lanes = n->pending_lanes != 0 ? n->pending_lanes :
		(n->nlanes != t->nlanes) ? n->nlanes : 0;
	t->pending_ordering = n->pending_ordering;
	t->fingerprint = n->fingerprint;
	t->options_version++;		/* the lanes' handles take them at their next request */
	t->retry_wanted = t->retry_wanted || n->retry_wanted;
	t->state = n->state;
	if (t->state == 'a' && was != 'a')
	{
		int			i;

		/* Resumed: from where it stopped, at once. */
		t->hold_attempts = 0;
		t->held_until = 0;
		t->failing_since = 0;
		for (i = 0; i < t->nlanes; i++)
			t->lanes[i].next_attempt = 0;
		oldcxt = CurrentMemoryContext;
		ereport(LOG,
				(errmsg("outbox relay: target \"%s\" is active again", t->name)));
		MemoryContextSwitchTo(oldcxt);
	}
	else if (t->state != was)
		ereport(LOG,
				(errmsg("outbox relay: target \"%s\" is %s", t->name,
						t->state == 'p' ? "paused" : "disabled")));
}

/*
 * A request of outbox.set_aside() in a progress row (columns 7 and 8): the
 * lane acts on it (relay_lane_set_aside()) once, and the next progress
 * write clears it.  A request already answered and not cleared yet stays
 * answered.
 */
static void
relay_take_set_aside(RelayLane *lane, HeapTuple tup, TupleDesc desc)
{
	bool		isnull;
	int64		id = relay_spi_int(tup, desc, 7, &isnull);
	char	   *reason;

	if (isnull || id <= 0)
	{
		lane->aside_id = 0;
		lane->aside_answered = false;
		return;
	}
	if (id == lane->aside_id)
		return;
	reason = relay_spi_text(tup, desc, 8);
	if (lane->aside_reason)
		pfree(lane->aside_reason);
	lane->aside_reason = MemoryContextStrdup(lane->target->cxt,
											 reason ? reason : "set aside");
	lane->aside_id = id;
	lane->aside_answered = false;
	lane->target->aside_pending = true;
}

void
relay_load_config(void)
{
	ListCell   *lc;
	List	   *kept = NIL;
	uint64		i;
	SPITupleTable *rows;
	uint64		nrows;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "loading outbox targets");

	{
		Oid			ext = get_extension_oid("outbox", true);

		if (ext != loaded_extension)
		{
			/* A new extension: its target ids mean other targets. */
			foreach(lc, relay_targets)
				relay_free_target((RelayTarget *) lfirst(lc));
			list_free(relay_targets);
			relay_targets = NIL;
			loaded_extension = ext;
		}
	}
	foreach(lc, relay_targets)
		((RelayTarget *) lfirst(lc))->seen = false;

	/* Columns that came with schema 0.2. */
	{
		Oid			nsp = get_namespace_oid("outbox", false);
		Oid			progress = get_relname_relid("progress", nsp);
		Oid			dead = get_relname_relid("dead_letters", nsp);

		relay_progress_has_batch_end = OidIsValid(progress) &&
			get_attnum(progress, "batch_end") != InvalidAttrNumber;
		relay_dead_letters_keep_payload = OidIsValid(dead) &&
			get_attnum(dead, "payload") != InvalidAttrNumber;
		relay_schema_operations = OidIsValid(progress) &&
			get_attnum(progress, "generation") != InvalidAttrNumber;
		relay_schema_brokers = get_attnum(get_relname_relid("targets", nsp), "subject") !=
			InvalidAttrNumber;
		relay_schema_set_aside = OidIsValid(progress) &&
			get_attnum(progress, "set_aside_id") != InvalidAttrNumber;
		relay_schema_aws = get_attnum(get_relname_relid("targets", nsp), "region") !=
			InvalidAttrNumber;
	}

	/*
	 * Targets no longer in use once nothing is in flight: replayed ones
	 * (their progress was moved back) and resized ones are made afresh
	 * from the tables below.
	 */
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->rebuild && relay_target_in_flight(t) == 0)
			t->seen = false;
		else
			t->seen = true;
	}
	{
		List	   *live = NIL;

		foreach(lc, relay_targets)
		{
			RelayTarget *t = (RelayTarget *) lfirst(lc);
			MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);

			if (t->seen)
				live = lappend(live, t);
			else
				relay_free_target(t);
			MemoryContextSwitchTo(oldcxt);
		}
		list_free(relay_targets);
		relay_targets = live;
	}
	foreach(lc, relay_targets)
		((RelayTarget *) lfirst(lc))->seen = false;

	/*
	 * Columns 24 to 36: ordering; the subject, topic, properties, format,
	 * CloudEvents source, a Redis target's stream, maxlen and dedup_window,
	 * a RabbitMQ target's exchange and routing key, unroutable_after in
	 * milliseconds, and a NATS target's credentials file (schema 0.3);
	 * 37 to 40: an AWS target's region and credentials, 41 to 45: OAuth2
	 * client credentials, 46 to 48: AWS web identity (schema 0.4).
	 */
#define RELAY_TARGETS_QUERY(brokers) \
					"SELECT t.id, t.name, t.kind, t.url, t.channel, t.batch_size, t.lanes," \
					"       t.max_attempts, t.timeout_ms, t.secret, t.headers," \
					"       t.state, t.max_rate," \
					"       (extract(epoch FROM least(t.disable_after, interval '100 years')) * 1000)::bigint," \
					"       t.pending_lanes, t.pending_ordering," \
					"       md5(row(t.url, t.headers, t.secret, t.batch_size, t.lanes, t.max_attempts," \
					"               t.timeout_ms, t.state, t.max_rate, t.disable_after," \
					"               t.pending_lanes, t.pending_ordering, t.previous_secret, t.ca_file," \
					"               t.client_cert, t.client_key, t.envelope_only, " brokers ")::text)," \
					"       EXISTS (SELECT 1 FROM outbox.dead_letters d" \
					"                WHERE d.target = t.name AND d.retry_requested_at IS NOT NULL)," \
					"       t.previous_secret, t.ca_file, t.client_cert, t.client_key, t.envelope_only," \
					"       t.ordering, " brokers \
					"  FROM outbox.targets t WHERE t.kind <> 'queue' ORDER BY t.id"
#define RELAY_NO_AWS ", NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text"
	if (SPI_execute(relay_schema_aws ? RELAY_TARGETS_QUERY("t.subject, t.topic, t.properties, t.format, t.ce_source, t.stream, t.maxlen, t.dedup_window, t.exchange, t.routing_key, ceil(extract(epoch FROM least(greatest(t.unroutable_after, interval '0'), interval '100 years')) * 1000)::bigint, t.credentials, t.region, t.aws_access_key_id, t.aws_secret_access_key, t.aws_session_token, t.oauth_token_url, t.oauth_client_id, t.oauth_client_secret, t.oauth_scope, t.oauth_client_auth, t.aws_role_arn, t.aws_web_identity_token_file, t.aws_sts_endpoint") :
					relay_schema_set_aside ? RELAY_TARGETS_QUERY("t.subject, t.topic, t.properties, t.format, t.ce_source, t.stream, t.maxlen, t.dedup_window, t.exchange, t.routing_key, ceil(extract(epoch FROM least(greatest(t.unroutable_after, interval '0'), interval '100 years')) * 1000)::bigint, t.credentials" RELAY_NO_AWS) :
					relay_schema_brokers ? RELAY_TARGETS_QUERY("t.subject, t.topic, t.properties, t.format, t.ce_source, t.stream, t.maxlen, t.dedup_window, t.exchange, t.routing_key, NULL::bigint, NULL::text" RELAY_NO_AWS) :
					relay_schema_operations ? RELAY_TARGETS_QUERY("NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::int, NULL::text, NULL::text, NULL::bigint, NULL::text" RELAY_NO_AWS) :
					"SELECT t.id, t.name, t.kind, t.url, t.channel, t.batch_size, t.lanes,"
					"       t.max_attempts, t.timeout_ms, t.secret, t.headers,"
					"       NULL::text, NULL::float8, NULL::bigint, NULL::int, NULL::text,"
					"       NULL::text, false, NULL::text, NULL::text, NULL::text, NULL::text, false,"
					"       t.ordering, NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::text,"
					"       NULL::text, NULL::bigint, NULL::int, NULL::text, NULL::text, NULL::bigint,"
					"       NULL::text" RELAY_NO_AWS
					"  FROM outbox.targets t ORDER BY t.id", false, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.targets");

	rows = SPI_tuptable;
	nrows = SPI_processed;
	for (i = 0; i < nrows; i++)
	{
		HeapTuple	tup = rows->vals[i];
		bool		isnull;
		int			id = (int) relay_spi_int(tup, rows->tupdesc, 1, &isnull);
		RelayTarget *t = relay_find_target(id);

		if (t == NULL)
		{
			const char *problem;

			t = relay_make_target(tup, rows->tupdesc, true, &problem);
			if (t == NULL)
			{
				relay_report_bad_target(id, relay_spi_text(tup, rows->tupdesc, 2),
										problem);
				continue;
			}
			ereport(LOG,
					(errmsg("outbox relay: delivering to target \"%s\"", t->name)));
		}
		else
			relay_refresh_target(t, tup, rows->tupdesc);
		t->seen = true;
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);

			kept = lappend(kept, t);
			MemoryContextSwitchTo(oldcxt);
		}
	}

	/* Forget dropped targets. */
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (!t->seen)
		{
			ereport(LOG,
					(errmsg("outbox relay: target \"%s\" was dropped", t->name)));
			relay_free_target(t);
		}
	}
	list_free(relay_targets);
	relay_targets = kept;

	/*
	 * Subscriptions replace the old ones.  A subscription new to a target
	 * that has already read past its start_id starts at the target's read
	 * position instead: the relay may have passed messages committed while
	 * subscribe() was still open without queueing them.  Everything
	 * committed after the subscription is delivered either way.
	 */
	if (SPI_execute("SELECT target_id, pattern, start_id, " OUTBOX_SUBSCRIPTION_FILTER_SQL
					"  FROM outbox.subscriptions s ORDER BY target_id, pattern",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.subscriptions");
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		RelaySubscription *old = t->subs;
		int			nold = t->nsubs;
		int			j;

		t->subs = MemoryContextAlloc(t->cxt, sizeof(RelaySubscription) * (SPI_processed + 1));
		t->nsubs = 0;
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			RelaySubscription *sub;
			char	   *pattern;

			if ((int) relay_spi_int(tup, desc, 1, &isnull) != t->id)
				continue;
			sub = &t->subs[t->nsubs++];
			pattern = relay_spi_text(tup, desc, 2);
			sub->pattern = MemoryContextStrdup(t->cxt, pattern);
			sub->prefix_len = outbox_pattern_prefix_len(pattern);
			sub->start_id = relay_spi_int(tup, desc, 3, &isnull);
			{
				Datum		f = SPI_getbinval(tup, desc, 4, &isnull);

				outbox_subscription_set_filter(sub, f, isnull, t->cxt);
			}
			if (t->read_id >= 0)
			{
				bool		known = false;

				for (j = 0; j < nold; j++)
				{
					if (strcmp(old[j].pattern, sub->pattern) == 0)
					{
						sub->start_id = old[j].start_id;
						known = true;
						break;
					}
				}
				if (!known)
					sub->start_id = Max(sub->start_id, t->read_id);
			}
		}
		for (j = 0; j < nold; j++)
		{
			pfree(old[j].pattern);
			if (old[j].filter)
				pfree(old[j].filter);
		}
		if (old)
			pfree(old);
	}

	/* Progress, for targets that have not read anything yet. */
	if (SPI_execute(relay_schema_set_aside ?
					"SELECT target_id, lane, done_id, last_delivered_id, batch_end, generation,"
					"       set_aside_id, set_aside_reason FROM outbox.progress" :
					relay_schema_operations ?
					"SELECT target_id, lane, done_id, last_delivered_id, batch_end, generation, NULL::bigint, NULL::text FROM outbox.progress" :
					relay_progress_has_batch_end ?
					"SELECT target_id, lane, done_id, last_delivered_id, batch_end, 0, NULL::bigint, NULL::text FROM outbox.progress" :
					"SELECT target_id, lane, done_id, last_delivered_id, NULL::bigint, 0, NULL::bigint, NULL::text FROM outbox.progress",
					true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.progress");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		RelayTarget *t = relay_find_target((int) relay_spi_int(tup, desc, 1, &isnull));
		int			lane = (int) relay_spi_int(tup, desc, 2, &isnull);

		if (t == NULL || lane < 0 || lane >= t->nlanes)
			continue;
		relay_take_set_aside(&t->lanes[lane], tup, desc);
		if (t->read_id >= 0)
		{
			/* outbox.replay() moved it back: reload it when it is quiet. */
			if ((int) relay_spi_int(tup, desc, 6, &isnull) != t->generation)
				t->rebuild = true;
			continue;
		}
		t->generation = (int) relay_spi_int(tup, desc, 6, &isnull);
		if (t->lanes[lane].done_id >= 0)
			continue;
		t->lanes[lane].done_id = relay_spi_int(tup, desc, 3, &isnull);
		t->lanes[lane].last_delivered_id = relay_spi_int(tup, desc, 4, &isnull);
		t->lanes[lane].batch_end = relay_spi_int(tup, desc, 5, &isnull);
	}
	/*
	 * A new target with a lane that has no progress row is not taken yet:
	 * its rows are being written by something other than add_target (a
	 * restore copies outbox.targets before outbox.progress, in separate
	 * transactions).  Taking it would deliver it everything from id 0 again.
	 * The next load, soon, takes it once its progress is there.
	 */
	relay_config_incomplete = false;
	{
		List	   *complete = NIL;

		foreach(lc, relay_targets)
		{
			RelayTarget *t = (RelayTarget *) lfirst(lc);
			int			j;
			bool		missing = false;

			if (t->read_id < 0)
			{
				for (j = 0; j < t->nlanes; j++)
					if (t->lanes[j].done_id < 0)
						missing = true;
			}
			if (missing)
			{
				relay_config_incomplete = true;
				relay_free_target(t);
				continue;
			}
			{
				MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);

				complete = lappend(complete, t);
				MemoryContextSwitchTo(oldcxt);
			}
			if (t->read_id >= 0)
				continue;
			for (j = 0; j < t->nlanes; j++)
			{
				if (t->read_id < 0 || t->lanes[j].done_id < t->read_id)
					t->read_id = t->lanes[j].done_id;
			}
			if (t->read_id < 0)
				t->read_id = 0;
		}
		list_free(relay_targets);
		relay_targets = complete;
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
}
