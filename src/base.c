/*-------------------------------------------------------------------------
 *
 * base.c
 *	  The base module: what every other file may use, and which uses no
 *	  other file of the extension.
 *
 * It holds the storage of the settings that _PG_init (outbox.c) defines,
 * whether the library was preloaded, the check that refuses SQL functions
 * in a database the relay does not serve, and the hook through which the
 * commit path (emit.c) wakes queue receivers without depending on the
 * queues, which set it.  Module load sits at the top of the extension and
 * calls everyone's init; everyone sits above this file.  Keeping these
 * here, and not in the file that defines the settings, in one SQL entry
 * point or in the queues, is what lets dependencies point one way
 * (docs/internals.md, "Source layout").
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/condition_variable.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/syscache.h"
#include "utils/varlena.h"

#include "base.h"

/*---- GUC variables (defined in _PG_init) ----*/
char	   *outbox_database = NULL;
char	   *outbox_databases = NULL;
int			outbox_max_databases = 16;
uint64		outbox_databases_generation = 0;
char	   *outbox_relay_role = NULL;
int			outbox_max_payload_size = 1024 * 1024;
bool		outbox_enabled = true;
int			outbox_poll_interval = 1000;
int			outbox_retry_base_delay = 500;
int			outbox_retry_max_delay = 300000;
int			outbox_relay_memory = 64 * 1024;	/* kB */
int			outbox_retention = 3600;	/* seconds */
int			outbox_max_receives = 5;
int			outbox_max_queues = 16;
int			outbox_queue_window = 4096;

/* Whether _PG_init ran from shared_preload_libraries. */
bool		outbox_preloaded = false;

#ifdef OUTBOX_TEST_FAULTS
char	   *outbox_test_fault = NULL;

/* Whether outbox.test_fault names this point (a test build only). */
bool
outbox_fault(const char *point)
{
	return outbox_test_fault != NULL && strcmp(outbox_test_fault, point) == 0;
}

void
outbox_test_fault_define_guc(void)
{
	DefineCustomStringVariable("outbox.test_fault",
							   "Test build only: make a part of outbox fail or stand still at a named point.",
							   "'read:TOPIC' fails building a message of TOPIC, 'send:TOPIC' starting its request; "
							   "capture_pause, capture_off, capture_small_parts, capture_slow_handoff, capture_* crash points and "
							   "commit_delay are the others.",
							   &outbox_test_fault,
							   "",
							   PGC_SIGHUP,
							   GUC_NOT_IN_SAMPLE | GUC_NO_SHOW_ALL,
							   NULL, NULL, NULL);
}
#endif

/* Set by the queues when the library is preloaded (outbox_queue_init). */
OutboxWakeReceivers outbox_receivers_wake = NULL;

/*
 * Whether outbox.databases is a valid value: '*' alone, or a list of
 * database names.
 */
bool
outbox_databases_valid(const char *value, const char **why)
{
	char	   *copy;
	List	   *names;
	ListCell   *lc;
	bool		ok = true;

	if (strcmp(value, "*") == 0)
		return true;
	copy = pstrdup(value);
	if (!SplitGUCList(copy, ',', &names))
	{
		*why = "it is not a list of database names";
		ok = false;
	}
	else if (names == NIL)
	{
		*why = "it names no database (use '*' for every database)";
		ok = false;
	}
	else
		foreach(lc, names)
			if (strcmp((char *) lfirst(lc), "*") == 0 || ((char *) lfirst(lc))[0] == '\0')
			{
				*why = "'*' must stand alone";
				ok = false;
			}
	list_free(names);
	pfree(copy);
	return ok;
}

/*
 * Whether the relay serves the database named dbname: outbox.database when
 * set (the one-database form), else outbox.databases.
 */
bool
outbox_database_served(const char *dbname)
{
	char	   *copy;
	List	   *names;
	ListCell   *lc;
	bool		served = false;

	if (outbox_one_database_form())
		return strcmp(dbname, outbox_database) == 0;
	if (outbox_databases == NULL || strcmp(outbox_databases, "*") == 0)
		return true;
	copy = pstrdup(outbox_databases);
	if (SplitGUCList(copy, ',', &names))
		foreach(lc, names)
			if (strcmp((char *) lfirst(lc), dbname) == 0)
				served = true;
	list_free(names);
	pfree(copy);
	return served;
}

/* Whether this backend's database is served, decided once per setting. */
static uint64 decided_for = 0;	/* outbox_databases_generation + 1 */
static bool served = false;
static const char *not_served_why = NULL;	/* a template, closed */

/*
 * Whether the relay serves this backend's database (catalog access): named
 * by the settings, and neither a template nor closed to connections (the
 * launcher starts no relay in those).
 */
/* ALTER DATABASE (IS_TEMPLATE, ALLOW_CONNECTIONS, RENAME): decide again. */
static void
outbox_database_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	decided_for = 0;
}

bool
outbox_this_database_served(void)
{
	static bool callback_registered = false;

	if (!callback_registered)
	{
		CacheRegisterSyscacheCallback(DATABASEOID, outbox_database_changed, (Datum) 0);
		callback_registered = true;
	}
	if (decided_for != outbox_databases_generation + 1)
	{
		HeapTuple	tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(MyDatabaseId));

		served = false;
		not_served_why = NULL;
		if (HeapTupleIsValid(tup))
		{
			Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);

			served = outbox_database_served(NameStr(d->datname));
			if (served && d->datistemplate)
				not_served_why = "it is a template";
			else if (served && !d->datallowconn)
				not_served_why = "it does not allow connections";
			if (not_served_why != NULL)
				served = false;
			ReleaseSysCache(tup);
		}
		decided_for = outbox_databases_generation + 1;
	}
	return served;
}

/* The same when known without a catalog lookup (commit callbacks). */
bool
outbox_this_database_served_known(void)
{
	return decided_for == outbox_databases_generation + 1 && served;
}

/*
 * Refuse to run in a database the relay does not serve: messages stored
 * there would never leave.
 */
void
outbox_check_database(const char *what)
{
	(void) outbox_this_database_served();
	if (served)
		return;
	if (not_served_why != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot be used in database \"%s\"", what,
						get_database_name(MyDatabaseId)),
				 errdetail("The database gets no outbox relay: %s.", not_served_why),
				 errhint("Emit in a database that is not a template and allows connections (ALTER DATABASE ... IS_TEMPLATE false, ALLOW_CONNECTIONS true).")));
	if (outbox_one_database_form())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot be used in database \"%s\"", what,
						get_database_name(MyDatabaseId)),
				 errdetail("The outbox relay serves database \"%s\" (outbox.database).",
						   outbox_database),
				 errhint("Connect to database \"%s\", or set outbox.database to \"%s\" and restart the server.",
						 outbox_database, get_database_name(MyDatabaseId))));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("%s cannot be used in database \"%s\"", what,
					get_database_name(MyDatabaseId)),
			 errdetail("The outbox relays serve the databases outbox.databases names: %s.",
					   outbox_databases),
			 errhint("Add \"%s\" to outbox.databases, or set it to '*', and reload the configuration.",
					 get_database_name(MyDatabaseId))));
}

/*
 * Whether the extension is installed in this database, asked by a worker
 * outside any transaction, in one of its own.  A DROP EXTENSION under way
 * holds its extension locked until it ends: the answer waits for it (a
 * shared lock on the extension), so it is never "installed" for an
 * extension whose drop then commits.
 */
bool
outbox_extension_installed(void)
{
	Oid			ext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ext = get_extension_oid("outbox", true);
	if (OidIsValid(ext))
	{
		/*
		 * Taking the lock reads the invalidations the drop sent.  Waited
		 * for in steps, so that a relay asked to stop (its SIGTERM only sets
		 * a flag) stops even while a drop is held open, prepared say.
		 */
		bool		waited = false;

		while (!ConditionalLockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock))
		{
			waited = true;
			CHECK_FOR_INTERRUPTS();
			if (ShutdownRequestPending)
				proc_exit(0);
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 10, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
		}
		if (waited)
			SetLatch(MyLatch);	/* a wake-up reset above is not lost */
		ext = get_extension_oid("outbox", true);
	}
	CommitTransactionCommand();
	return OidIsValid(ext);
}

/*
 * For a worker's transaction that reads and writes several of the
 * extension's tables one statement after another (the relay's retention
 * step), with SPI connected: take the extension itself, and then every
 * table of the extension's schema, in share mode, each without waiting,
 * and cap every lock wait that follows (rows only, by then) at half of
 * deadlock_timeout and at most 100 ms.  DROP EXTENSION takes the extension
 * first: it then waits for the whole transaction before it locks any
 * table.  A session that holds one of the tables (and may drop the
 * extension next) makes the worker leave the step to its next turn
 * instead of waiting for it holding others.  So the worker never waits for
 * a table while it holds another, and a drop is never the transaction a
 * deadlock rolls back, unless the dropping session's deadlock_timeout is
 * below the worker's cap while the worker waits for a row that session
 * has locked.
 *
 * Returns NULL when the transaction may go on; else what was not free
 * ("the extension", or "a lock on outbox.name held by pid n"), or "" when
 * the extension is not there.  Locks taken stay until the transaction
 * ends.
 */
const char *
outbox_fence_extension_drop(void)
{
	Oid			ext = get_extension_oid("outbox", true);
	int			cap;
	uint64		i;
	char		ms[32];

	if (!OidIsValid(ext))
		return "";
	if (!ConditionalLockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock))
		return "the extension, which another session is dropping or changing";
	/* dropped (or made anew) between the look-up and the lock */
	if (get_extension_oid("outbox", true) != ext)
		return "";

	if (SPI_execute("SELECT c.oid, c.relname FROM pg_catalog.pg_class c"
					" JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
					" WHERE n.nspname OPERATOR(pg_catalog.=) 'outbox'"
					"   AND c.relkind OPERATOR(pg_catalog.=) ANY (ARRAY['r', 'p']::pg_catalog.\"char\"[])"
					" ORDER BY c.oid", true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: could not list the extension's tables");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Oid			rel = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 1, &isnull));

		if (!ConditionalLockRelationOid(rel, AccessShareLock))
		{
			char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
			char	   *pids = NULL;
			Datum		arg = ObjectIdGetDatum(rel);
			Oid			argtype = OIDOID;

			if (SPI_execute_with_args("SELECT pg_catalog.string_agg(DISTINCT l.pid::pg_catalog.text, ', ')"
									  "  FROM pg_catalog.pg_locks l"
									  " WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'"
									  "   AND l.granted AND l.relation OPERATOR(pg_catalog.=) $1"
									  "   AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()",
									  1, &argtype, &arg, NULL, true, 1) == SPI_OK_SELECT &&
				SPI_processed == 1)
				pids = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
			return psprintf("a lock on outbox.%s held by pid %s", name, pids ? pids : "?");
		}
	}

	cap = Min(Max(DeadlockTimeout / 2, 1), 100);
	if (LockTimeout > 0)
		cap = Min(cap, LockTimeout);
	snprintf(ms, sizeof(ms), "%d", cap);
	(void) set_config_option("lock_timeout", ms, PGC_SUSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
	return NULL;
}

/*
 * Whether the extension is gone, as the current transaction sees the
 * catalog now.  A worker's handler that keeps going after an error (a
 * failed read is retried later) throws the error on when this is true, to
 * the worker's outermost handler (outbox_error_from_drop).
 */
bool
outbox_extension_gone(void)
{
	return !OidIsValid(get_extension_oid("outbox", true));
}

/*
 * The one check of every worker that reads the extension's tables (the
 * relay, the WAL capture worker), made in its outermost PG_CATCH once it has
 * copied the error out: whether the error came from the extension being
 * dropped under it.  A statement already under way when DROP EXTENSION
 * commits fails on whatever it reads next (a table, a function, a type
 * gone, or a deadlock with the drop's locks), wherever it is; the worker
 * must then stop as it does when told of the drop, not with an error exit.
 * This rolls back what the error left, forgets the error, and asks whether
 * the extension is still installed, after the drop if one is under way.
 * False: the error is the worker's own, and the caller throws it again.
 */
bool
outbox_error_from_drop(void)
{
	HOLD_INTERRUPTS();
	/* what an error outside a transaction may have left, as workers do */
	LWLockReleaseAll();
	ConditionVariableCancelSleep();
	pgstat_report_wait_end();
	AbortOutOfAnyTransaction();
	FlushErrorState();
	RESUME_INTERRUPTS();
	return !outbox_extension_installed();
}
