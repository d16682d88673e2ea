/*-------------------------------------------------------------------------
 *
 * databases.c
 *	  DROP DATABASE, ALTER DATABASE RENAME and CREATE DATABASE ... TEMPLATE
 *	  while outbox workers run in the database.
 *
 * These commands refuse to run while any other session is connected to the
 * database (they wait five seconds for sessions to go), and a relay or a
 * capture worker is connected to it all the time.  So a utility hook, in
 * every backend through shared_preload_libraries, sees these two commands
 * before they run: it holds the database's relay off (the launcher starts
 * none while held, launcher.c), asks the database's outbox workers to
 * exit, which they do after recording what was acknowledged, and waits
 * for them.  The hold ends with the transaction: after a rename the
 * launcher starts the relay under the new name, after a drop it gives
 * the database's slot back.
 *
 * DROP EXTENSION outbox is seen by an object access hook: the transaction
 * then tells the relay when it commits, as a change of targets does, and
 * the relay, finding no extension, gives the database's slot back and
 * exits (relay_main.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "commands/defrem.h"
#include "nodes/parsenodes.h"
#include "postmaster/bgworker.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "outbox.h"

/* Longest a hold lasts if the transaction never ends it. */
#define DATABASES_HOLD_MS		30000
/* Longest the command waits for the workers to exit. */
#define DATABASES_WAIT_MS		5000

static ProcessUtility_hook_type prev_utility_hook = NULL;
static object_access_hook_type prev_object_access_hook = NULL;

/* The databases this transaction holds (renames in one transaction). */
#define DATABASES_MAX_HELD		8
static Oid	held_databases[DATABASES_MAX_HELD];
static int	nheld = 0;

/* This transaction drops the extension. */
static bool extension_dropped = false;

/* Ask the outbox workers connected to dboid to exit; how many there were. */
static int
databases_signal_workers(Oid dboid)
{
	int			n = 0;
	uint32		i;

	for (i = 0; i < ProcGlobal->allProcCount; i++)
	{
		PGPROC	   *proc = &ProcGlobal->allProcs[i];
		int			pid = proc->pid;
		const char *type;

		if (pid == 0 || pid == MyProcPid || proc->databaseId != dboid)
			continue;
		type = GetBackgroundWorkerTypeByPid(pid);
		if (type == NULL || strncmp(type, "outbox ", 7) != 0)
			continue;
		if (kill(pid, SIGTERM) == 0)
			n++;
	}
	return n;
}

/* Whether the user may create databases (CREATE DATABASE checks it too). */
static bool
databases_may_create(void)
{
	HeapTuple	tup;
	bool		ok = false;

	if (superuser())
		return true;
	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(GetUserId()));
	if (HeapTupleIsValid(tup))
	{
		ok = ((Form_pg_authid) GETSTRUCT(tup))->rolcreatedb;
		ReleaseSysCache(tup);
	}
	return ok;
}

static void
databases_hold(const char *dbname)
{
	Oid			dboid = get_database_oid(dbname, true);
	TimestampTz deadline;

	/*
	 * The command refuses these itself: a missing database, the current
	 * one, one the user does not own.  Checked first, so that a role that
	 * may not drop the database cannot stop its relay with a failing DROP.
	 */
	if (!OidIsValid(dboid) || dboid == MyDatabaseId ||
		!outbox_database_ownercheck(dboid, GetUserId()) ||
		nheld == DATABASES_MAX_HELD)
		return;
	held_databases[nheld++] = dboid;
	outbox_db_hold(dboid, TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															  DATABASES_HOLD_MS));
	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), DATABASES_WAIT_MS);
	while (databases_signal_workers(dboid) > 0 &&
		   GetCurrentTimestamp() < deadline)
	{
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000L);
	}
}

static void
databases_utility_hook(PlannedStmt *pstmt, const char *queryString,
					   bool readOnlyTree, ProcessUtilityContext context,
					   ParamListInfo params, QueryEnvironment *queryEnv,
					   DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	/* (DROP and CREATE DATABASE refuse to run in a transaction block) */
	if (IsA(stmt, DropdbStmt) && !IsTransactionBlock())
		databases_hold(((DropdbStmt *) stmt)->dbname);
	else if (IsA(stmt, RenameStmt) &&
			 ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		databases_hold(((RenameStmt *) stmt)->subname);
	else if (IsA(stmt, CreatedbStmt) && !IsTransactionBlock() && databases_may_create())
	{
		ListCell   *lc;

		/* A copy of a database with an outbox is a database with its own. */
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *opt = (DefElem *) lfirst(lc);

			if (strcmp(opt->defname, "template") == 0 && opt->arg != NULL)
				databases_hold(defGetString(opt));
		}
	}

	if (prev_utility_hook)
		prev_utility_hook(pstmt, queryString, readOnlyTree, context, params,
						  queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
								queryEnv, dest, qc);
}

/* The hold ends with the transaction, whatever its outcome. */
static void
databases_xact_callback(XactEvent event, void *arg)
{
	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
		event != XACT_EVENT_PREPARE)
		return;
	if (extension_dropped && event == XACT_EVENT_COMMIT)
		outbox_db_tell_relay();
	extension_dropped = false;
	while (nheld > 0)
		outbox_db_hold(held_databases[--nheld], 0);
}

/*
 * DROP EXTENSION outbox: the relay is told once the drop committed, never
 * before (a relay that reloaded while the extension was still there would
 * wait for the drop's locks and then fail on the dropped tables).
 */
static void
databases_object_access(ObjectAccessType access, Oid classId, Oid objectId,
						int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access == OAT_DROP && classId == ExtensionRelationId)
	{
		char	   *name = get_extension_name(objectId);

		if (name != NULL && strcmp(name, "outbox") == 0)
			extension_dropped = true;
	}
}

/* From _PG_init, when preloaded. */
void
outbox_databases_init(void)
{
	prev_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = databases_utility_hook;
	prev_object_access_hook = object_access_hook;
	object_access_hook = databases_object_access;
	RegisterXactCallback(databases_xact_callback, NULL);
}
