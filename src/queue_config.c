/*-------------------------------------------------------------------------
 *
 * queue_config.c
 *	  What this backend knows of queues: their rows, subscriptions and
 *	  grants, read as the extension's owner; and the slot each queue has.
 *
 * A queue's row, subscriptions and grants are read with SQL run as the
 * extension's owner, with a safe search_path and a fresh snapshot
 * (queue_spi_begin, queue_spi_fresh), and kept for as long as the
 * configuration generation (outbox_config_generation) does not change; the
 * grants are read again after any change of outbox.queue_grants (a relcache
 * invalidation, outbox.queue_grants_changed()).  Whether the current user
 * may receive is checked at every call and every wake-up
 * (queue_check_allowed).
 *
 * A queue takes a slot of shared memory at its first receive (queue_slot),
 * for as long as it exists: when no slot is free, the slots of queues
 * dropped since, or of an installation of the extension dropped since, are
 * freed, unless a transaction still holds one of their messages or a fill
 * is under way.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "queue.h"

PG_FUNCTION_INFO_V1(outbox_queue_grants_changed);

static MemoryContext queue_cache_cxt = NULL;
static List *queue_cache = NIL;
static uint64 queue_cache_generation = 0;
static Oid	receipts_relid = InvalidOid;
static Oid	grants_relid = InvalidOid;
static Oid	targets_relid = InvalidOid;
static uint64 grants_invalidations = 1;
static bool grants_callback = false;

static void queue_grants_invalidate(Datum arg, Oid relid);

/*---- running SQL as the extension's owner ----*/

static Oid
extension_owner(void)
{
	static Oid	owner = InvalidOid;
	static Oid	owner_nsp = InvalidOid;
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, false);

	if (nsp != owner_nsp)
	{
		HeapTuple	tup = SearchSysCache1(NAMESPACEOID, ObjectIdGetDatum(nsp));

		if (!HeapTupleIsValid(tup))
			elog(ERROR, "cache lookup failed for schema %u", nsp);
		owner = ((Form_pg_namespace) GETSTRUCT(tup))->nspowner;
		ReleaseSysCache(tup);
		owner_nsp = nsp;
	}
	return owner;
}

/*
 * Switch to the extension's owner with a safe search_path and connect SPI.
 * An error on the way is cleaned up by the (sub)transaction's abort.
 */
void
queue_spi_begin(QueueSpiState *st)
{
	Oid			owner = extension_owner();

	GetUserIdAndSecContext(&st->save_userid, &st->save_sec);
	SetUserIdAndSecContext(owner, st->save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	st->nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "outbox: SPI_connect failed");
}

void
queue_spi_end(QueueSpiState *st)
{
	SPI_finish();
	AtEOXact_GUC(true, st->nestlevel);
	SetUserIdAndSecContext(st->save_userid, st->save_sec);
}

/* Run a read-only query with a fresh snapshot (callers may be in RR). */
int
queue_spi_fresh(const char *sql, int nargs, Oid *types, Datum *values,
				const char *nulls, long limit)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, types);
	Snapshot	snap;
	int			rc;

	if (plan == NULL)
		elog(ERROR, "outbox: SPI_prepare failed for \"%s\"", sql);
	snap = RegisterSnapshot(GetLatestSnapshot());
	rc = SPI_execute_snapshot(plan, values, nulls, snap, InvalidSnapshot,
							  true, false, limit);
	UnregisterSnapshot(snap);
	return rc;
}

/*---- what this backend knows of queues ----*/

static void
queue_cache_check(void)
{
	uint64		gen = outbox_config_generation();

	if (queue_cache_cxt == NULL)
		queue_cache_cxt = AllocSetContextCreate(TopMemoryContext, "outbox queues",
												ALLOCSET_SMALL_SIZES);
	if (!grants_callback)
	{
		CacheRegisterRelcacheCallback(queue_grants_invalidate, (Datum) 0);
		grants_callback = true;
	}
	if (gen != queue_cache_generation)
	{
		MemoryContextReset(queue_cache_cxt);
		queue_cache = NIL;
		queue_cache_generation = gen;
		/* The extension may have been dropped and created again. */
		grants_relid = InvalidOid;
		targets_relid = InvalidOid;
	}
	if (!OidIsValid(grants_relid) || !OidIsValid(targets_relid))
	{
		Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, false);

		grants_relid = get_relname_relid("queue_grants", nsp);
		targets_relid = get_relname_relid("targets", nsp);
		receipts_relid = InvalidOid;
	}
}

static Oid
outbox_relid(const char *name)
{
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, false);
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table outbox.%s does not exist", name),
				 errhint("Update the extension with ALTER EXTENSION outbox UPDATE.")));
	return relid;
}

/* outbox.receipts, looked up again when the cached one went away. */
Oid
queue_receipts_relid(void)
{
	if (!OidIsValid(receipts_relid) ||
		!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(receipts_relid)))
		receipts_relid = outbox_relid("receipts");
	return receipts_relid;
}

/* A change of outbox.queue_grants committed: check rights again. */
static void
queue_grants_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == grants_relid)
		grants_invalidations++;
}

/*
 * outbox.queue_grants_changed() -> void: every receiver checks its rights
 * again once the calling transaction commits.
 */
Datum
outbox_queue_grants_changed(PG_FUNCTION_ARGS)
{
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, false);
	Oid			relid = get_relname_relid("queue_grants", nsp);

	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	PG_RETURN_VOID();
}

/* Read the roles granted a queue (SPI connected, as the owner). */
static void
queue_read_grants(QueueInfo *qi)
{
	Oid			types[1] = {INT4OID};
	Datum		values[1];
	int			rc;
	uint64		i;
	uint64		seen = grants_invalidations;
	Oid		   *roles;

	values[0] = Int32GetDatum(qi->target_id);
	rc = queue_spi_fresh("SELECT g.role::pg_catalog.oid FROM outbox.queue_grants g"
						 " WHERE g.target_id OPERATOR(pg_catalog.=) $1",
						 1, types, values, NULL, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.queue_grants");
	roles = MemoryContextAlloc(queue_cache_cxt, sizeof(Oid) * Max(SPI_processed, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		roles[i] = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
												  SPI_tuptable->tupdesc, 1, &isnull));
	}
	if (qi->grant_roles)
		pfree(qi->grant_roles);
	qi->grant_roles = roles;
	qi->ngrants = (int) SPI_processed;
	qi->checked_grants = seen;
}

/*
 * Refuse unless the current user may receive from the queue: superusers,
 * roles with the privileges of the extension's owner, and roles with the
 * privileges of a role granted the queue (outbox.grant_receive).  Checked
 * at every call and every wake-up, against the session's current
 * memberships (PostgreSQL caches those); the grants themselves are read
 * again after any change of outbox.queue_grants.
 */
void
queue_check_allowed(QueueInfo *qi)
{
	Oid			user = GetUserId();
	int			i;

	if (qi->checked_grants != grants_invalidations)
	{
		QueueSpiState st;

		queue_spi_begin(&st);
		queue_read_grants(qi);
		queue_spi_end(&st);
	}
	if (superuser_arg(user) || has_privs_of_role(user, extension_owner()))
		return;
	for (i = 0; i < qi->ngrants; i++)
		if (has_privs_of_role(user, qi->grant_roles[i]))
			return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to receive from outbox queue \"%s\"", qi->name),
			 errhint("The queue's owner can allow it with outbox.grant_receive('%s', role).", qi->name)));
}

/* Load a queue's row, subscriptions and grants (as the owner). */
static QueueInfo *
queue_info_load(const char *name)
{
	QueueSpiState st;
	QueueInfo  *qi;
	MemoryContext old;
	Oid			types[2] = {TEXTOID, OIDOID};
	Datum		values[2];
	bool		isnull;
	int			rc;
	uint64		i;

	values[0] = CStringGetTextDatum(name);
	queue_spi_begin(&st);
	rc = queue_spi_fresh("SELECT t.id, t.kind = 'queue', t.state = 'active'"
						 "  FROM outbox.targets t WHERE t.name OPERATOR(pg_catalog.=) $1",
						 1, types, values, NULL, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not read outbox.targets");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox queue \"%s\" does not exist", name),
				 errhint("Create it with outbox.create_queue().")));

	old = MemoryContextSwitchTo(queue_cache_cxt);
	qi = palloc0(sizeof(QueueInfo));
	qi->name = pstrdup(name);
	qi->slot = -1;
	MemoryContextSwitchTo(old);
	qi->target_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	qi->is_queue = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	qi->active = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));

	if (qi->is_queue)
	{
		types[0] = INT4OID;
		values[0] = Int32GetDatum(qi->target_id);
		rc = queue_spi_fresh("SELECT s.pattern, s.start_id, " OUTBOX_SUBSCRIPTION_FILTER_SQL
							 "  FROM outbox.subscriptions s"
							 " WHERE s.target_id OPERATOR(pg_catalog.=) $1",
							 1, types, values, NULL, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "outbox: could not read outbox.subscriptions");
		old = MemoryContextSwitchTo(queue_cache_cxt);
		qi->nsubs = (int) SPI_processed;
		qi->subs = palloc0(sizeof(OutboxSubscription) * Max(qi->nsubs, 1));
		for (i = 0; i < SPI_processed; i++)
		{
			char	   *p = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

			qi->subs[i].pattern = pstrdup(p);
			qi->subs[i].prefix_len = outbox_pattern_prefix_len(p);
			qi->subs[i].start_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
															   SPI_tuptable->tupdesc, 2, &isnull));
			{
				Datum		f = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 3, &isnull);

				outbox_subscription_set_filter(&qi->subs[i], f, isnull, queue_cache_cxt);
				if (qi->subs[i].filter != NULL)
					qi->filtered = true;
			}
		}
		MemoryContextSwitchTo(old);

		queue_read_grants(qi);
	}
	queue_spi_end(&st);

	old = MemoryContextSwitchTo(queue_cache_cxt);
	queue_cache = lappend(queue_cache, qi);
	MemoryContextSwitchTo(old);
	return qi;
}

QueueInfo *
queue_info(const char *name)
{
	ListCell   *lc;

	queue_cache_check();
	foreach(lc, queue_cache)
	{
		QueueInfo  *qi = lfirst(lc);

		if (strcmp(qi->name, name) == 0)
			return qi;
	}
	return queue_info_load(name);
}

/*---- slots ----*/

/* Free slots of this database whose queue no longer exists; -1 if none. */
static int
slot_collect(void)
{
	QueueSpiState st;
	int			freed = -1;
	int			i;
	Oid			types[1] = {INT4OID};

	for (i = 0; i < QShared->nslots; i++)
	{
		QueueSlot  *s = &QShared->slots[i];
		Datum		v;
		int			rc;
		bool		gone;

		if (s->dboid != MyDatabaseId)
			continue;
		if (s->targets_relid != targets_relid)
			gone = true;		/* of an extension dropped since */
		else
		{
			v = Int32GetDatum(s->target_id);
			queue_spi_begin(&st);
			rc = queue_spi_fresh("SELECT 1 FROM outbox.targets t"
								 " WHERE t.id OPERATOR(pg_catalog.=) $1 AND t.kind = 'queue'",
								 1, types, &v, NULL, 1);
			gone = (rc == SPI_OK_SELECT && SPI_processed == 0);
			queue_spi_end(&st);
		}
		if (!gone)
			continue;
		LWLockAcquire(slot_lock(i), LW_EXCLUSIVE);
		if (s->dboid == MyDatabaseId && !s->filling)
		{
			int			k;
			bool		held = false;

			for (k = 0; k < s->count; k++)
				if (slot_entry(i, k)->state == QE_CLAIMED)
					held = true;
			if (!held)
			{
				s->dboid = InvalidOid;
				s->target_id = 0;
				s->epoch++;
				freed = i;
			}
		}
		LWLockRelease(slot_lock(i));
	}
	return freed;
}

/*
 * outbox.targets of the extension installed in this database now, or
 * InvalidOid: slots of an installation dropped since are not its queues.
 */
Oid
queue_current_targets_relid(void)
{
	Oid			nsp = get_namespace_oid(OUTBOX_SCHEMA, true);

	return OidIsValid(nsp) ? get_relname_relid("targets", nsp) : InvalidOid;
}

/* Whether slot i holds this queue (of this installation of the extension). */
bool
queue_slot_is(int i, QueueInfo *qi)
{
	QueueSlot  *s = &QShared->slots[i];

	return s->dboid == MyDatabaseId && s->target_id == qi->target_id &&
		s->targets_relid == targets_relid;
}

/* The slot of a queue, taken if it has none. */
int
queue_slot(QueueInfo *qi)
{
	int			i;
	int			free_slot = -1;

	if (qi->slot >= 0 && queue_slot_is(qi->slot, qi))
		return qi->slot;

	for (;;)
	{
		LWLockAcquire(&QShared->locks[0].lock, LW_EXCLUSIVE);
		for (i = 0; i < QShared->nslots; i++)
		{
			QueueSlot  *s = &QShared->slots[i];

			if (queue_slot_is(i, qi))
			{
				LWLockRelease(&QShared->locks[0].lock);
				qi->slot = i;
				return i;
			}
			if (s->dboid == InvalidOid && free_slot < 0)
				free_slot = i;
		}
		if (free_slot >= 0)
		{
			QueueSlot  *s = &QShared->slots[free_slot];

			LWLockAcquire(slot_lock(free_slot), LW_EXCLUSIVE);
			s->dboid = MyDatabaseId;
			s->target_id = qi->target_id;
			s->targets_relid = targets_relid;
			s->reload_wanted = false;
			s->filler = -1;
			s->epoch++;
			s->loaded = false;
			s->filling = false;
			s->count = 0;
			s->head = 0;
			s->received = s->acknowledged = s->rolled_back = s->rolled_back_counted =
				s->dead_lettered = 0;
			LWLockRelease(slot_lock(free_slot));
			LWLockRelease(&QShared->locks[0].lock);
			qi->slot = free_slot;
			return free_slot;
		}
		LWLockRelease(&QShared->locks[0].lock);
		if (slot_collect() < 0)
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("too many outbox queues in use"),
					 errdetail("outbox.max_queues is %d, and each is in use.", QShared->nslots),
					 errhint("Raise outbox.max_queues and restart the server, or drop queues no longer used.")));
	}
}
