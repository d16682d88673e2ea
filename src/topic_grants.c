/*-------------------------------------------------------------------------
 *
 * topic_grants.c
 *	  Per-topic emit rights: outbox.grant_topic(role, pattern).
 *
 * With outbox.check_topic_grants on, outbox_emit() by a role that is not a
 * superuser is refused unless the role (or a role it has the privileges of)
 * holds a grant whose pattern matches the topic.  Grants live in
 * outbox.topic_grants.  Each backend keeps them in memory and reads them
 * again only after a change: grant_topic and revoke_topic send a relcache
 * invalidation of outbox.topic_grants (so does a trigger on any other
 * change of the table), which every backend receives when their
 * transaction commits.  So the check at emit costs a few string
 * comparisons, no table access.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "catalog/pg_type.h"

#include "outbox.h"

bool		outbox_check_topic_grants = false;

typedef struct TopicGrant
{
	Oid			role;
	char	   *pattern;		/* topic, prefix* or * */
	int			len;			/* bytes of pattern */
} TopicGrant;

static TopicGrant *grants = NULL;
static int	ngrants = 0;
static bool grants_valid = false;
static Oid	grants_relid = InvalidOid;
static bool callback_registered = false;
static MemoryContext grants_cxt = NULL;

void
outbox_topic_grants_define_gucs(void)
{
	DefineCustomBoolVariable("outbox.check_topic_grants",
							 "Refuse outbox_emit() to topics the role holds no grant for.",
							 "Grants are made with outbox.grant_topic(role, pattern). Superusers are not checked.",
							 &outbox_check_topic_grants,
							 false,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
}

/* Invalidations seen: one arriving while the grants are read voids them. */
static uint64 invalidations = 0;

static void
outbox_topic_grants_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == grants_relid || !OidIsValid(grants_relid))
	{
		grants_valid = false;
		invalidations++;
	}
}

/* Read outbox.topic_grants into memory. */
static void
outbox_load_topic_grants(void)
{
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, true);
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	int			max = 16;
	MemoryContext oldcxt;
	uint64		seen;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(outbox_topic_grants_invalidate, (Datum) 0);
		callback_registered = true;
	}
	seen = invalidations;
	grants_relid = OidIsValid(nsp) ? get_relname_relid("topic_grants", nsp) : InvalidOid;
	if (!OidIsValid(grants_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.check_topic_grants is on, but table outbox.topic_grants does not exist"),
				 errhint("Update the extension with ALTER EXTENSION outbox UPDATE, or turn outbox.check_topic_grants off.")));

	if (grants_cxt == NULL)
		grants_cxt = AllocSetContextCreate(TopMemoryContext, "outbox topic grants",
										   ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(grants_cxt);
	grants = NULL;
	ngrants = 0;
	oldcxt = MemoryContextSwitchTo(grants_cxt);
	grants = palloc(sizeof(TopicGrant) * max);

	/*
	 * A heap scan with the catalog snapshot (the latest committed rows),
	 * without a privilege check: the emitting role cannot read the table.
	 */
	rel = table_open(grants_relid, AccessShareLock);
	if (RelationGetDescr(rel)->natts < 2 ||
		TupleDescAttr(RelationGetDescr(rel), 0)->atttypid != REGROLEOID ||
		TupleDescAttr(RelationGetDescr(rel), 1)->atttypid != TEXTOID)
		elog(ERROR, "outbox: outbox.topic_grants does not have the expected columns");
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		role = heap_getattr(tup, 1, RelationGetDescr(rel), &isnull);
		Datum		pattern;

		if (isnull)
			continue;
		pattern = heap_getattr(tup, 2, RelationGetDescr(rel), &isnull);
		if (isnull)
			continue;
		if (ngrants == max)
		{
			max *= 2;
			grants = repalloc(grants, sizeof(TopicGrant) * max);
		}
		grants[ngrants].role = DatumGetObjectId(role);
		grants[ngrants].pattern = TextDatumGetCString(pattern);
		grants[ngrants].len = strlen(grants[ngrants].pattern);
		ngrants++;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	MemoryContextSwitchTo(oldcxt);
	/* Used now either way; read again next time if they changed meanwhile. */
	grants_valid = (invalidations == seen);
}

static bool
outbox_pattern_matches(const TopicGrant *g, const char *topic, int topic_len)
{
	if (g->len == 1 && g->pattern[0] == '*')
		return true;
	if (g->len > 0 && g->pattern[g->len - 1] == '*')
		return topic_len >= g->len - 1 && memcmp(topic, g->pattern, g->len - 1) == 0;
	return g->len == topic_len && memcmp(topic, g->pattern, topic_len) == 0;
}

/* Refuse the emit unless the current role may emit to topic. */
void
outbox_check_topic_grant(const char *topic, int topic_len)
{
	Oid			user = GetUserId();
	int			i;

	if (!outbox_check_topic_grants || superuser_arg(user))
		return;
	if (!grants_valid)
		outbox_load_topic_grants();
	for (i = 0; i < ngrants; i++)
		if (outbox_pattern_matches(&grants[i], topic, topic_len) &&
			has_privs_of_role(user, grants[i].role))
			return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to emit to outbox topic \"%.*s\"", topic_len, topic),
			 errdetail("outbox.check_topic_grants is on and role \"%s\" holds no grant whose pattern matches the topic.",
					   GetUserNameFromId(user, false)),
			 errhint("A superuser can grant it with SELECT outbox.grant_topic('%s', '%.*s').",
					 GetUserNameFromId(user, false), topic_len, topic)));
}

PG_FUNCTION_INFO_V1(outbox_topic_grants_changed);

/*
 * outbox.topic_grants_changed() -> void: every backend reads the grants
 * again once the calling transaction commits.
 */
Datum
outbox_topic_grants_changed(PG_FUNCTION_ARGS)
{
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, false);
	Oid			relid = get_relname_relid("topic_grants", nsp);

	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	PG_RETURN_VOID();
}
