/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The launcher: a background worker connected to no database that
 *	  starts one relay per database that has the extension, and the
 *	  capture worker of each database that captures from the WAL.
 *
 * A background worker that connects to a database that does not exist dies
 * with a FATAL error and is restarted, again and again; and one that exits
 * to be restarted waits bgw_restart_time first.  So relays are not static
 * workers: the launcher, registered at server start, reads pg_database (a
 * shared catalog, readable without a database connection) every second or
 * when woken, and keeps a list of the databases it serves (outbox.database,
 * or outbox.databases; never a template or one that refuses connections).
 *
 * Which of them have the extension it cannot see from here.  A database has
 * a slot of shared state (shmem.c) once anything of the extension ran in it
 * since the start: CREATE EXTENSION takes it and wakes the launcher.  So a
 * database with a slot gets a relay; one without, a single relay started
 * to look (after the server starts, when the database appears or is
 * renamed), which exits at once when it finds no extension.  At most
 * LAUNCHER_MAX_PROBES look at a time, so a cluster of many databases does
 * not use up the worker slots.  A relay exits when the extension is
 * dropped, giving its slot back, and the launcher gives back the slot of
 * a dropped database.
 *
 * It notices a relay's exit (it is notified, as bgw_notify_pid) and starts
 * a new one: at once after a deliberate exit, after a backoff when the
 * relay keeps failing soon after its start, each database on its own.  A
 * database being dropped or renamed (the utility hook, databases.c) holds
 * its relay off until that is done.  Running out of worker slots is said
 * once at LOG and shown in outbox.worker and outbox.relays.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"

/* How often the launcher reads pg_database at most, and at least. */
#define LAUNCHER_DB_POLL_MS		250
#define LAUNCHER_SCAN_MS		1000
/* A relay that ran at least this long is restarted at once. */
#define LAUNCHER_STABLE_MS		10000
/* Longest pause before restarting a relay that keeps failing. */
#define LAUNCHER_MAX_BACKOFF_MS	30000
/* Relays that look for the extension at the same time. */
#define LAUNCHER_MAX_PROBES		4

PGDLLEXPORT void outbox_launcher_main(Datum main_arg);

/* Whether outbox.database can be connected to, and if not why. */
typedef enum LauncherDatabaseState
{
	LAUNCHER_DB_USABLE,
	LAUNCHER_DB_MISSING,
	LAUNCHER_DB_NO_CONNECTIONS,
	LAUNCHER_DB_INVALID,
	LAUNCHER_DB_TEMPLATE
} LauncherDatabaseState;

/* A worker the launcher keeps running, and when to start it again. */
typedef struct LauncherWorker
{
	BackgroundWorkerHandle *handle;
	TimestampTz started;
	TimestampTz next_start;
	long		backoff;
	bool		no_slot_logged;
	bool		looked;			/* the last relay found no extension */
	uint64		looked_generation;	/* the slot's configuration then */
} LauncherWorker;

/* A database the launcher serves. */
typedef struct LauncherDb
{
	Oid			oid;
	char		name[NAMEDATALEN];
	bool		served;			/* in the last scan, and served */
	bool		probed;			/* a relay looked since it got this name */
	LauncherWorker relay;
	LauncherWorker capture;
} LauncherDb;

static LauncherDb *ldbs = NULL;
static int	nldbs = 0;
static int	maxldbs = 0;

/*
 * Register the launcher.  Called from _PG_init while shared_preload_libraries
 * is processed.  Not on a server pg_upgrade runs (-b): there no relay or
 * capture worker may read or write while the schema is restored, as
 * PostgreSQL runs no logical replication launcher there.
 */
void
outbox_register_launcher(void)
{
	BackgroundWorker worker;

	if (IsBinaryUpgrade)
	{
		ereport(LOG,
				(errmsg("outbox starts no relay or capture worker in binary upgrade mode")));
		return;
	}
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 2;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "outbox_launcher_main", BGW_MAXLEN);
	strlcpy(worker.bgw_name, "outbox launcher", BGW_MAXLEN);
	strlcpy(worker.bgw_type, "outbox launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&worker);
}

/*
 * Start a dynamic worker running function of this library in database db:
 * the relay (outbox_worker_main, relay_main.c) or the capture worker
 * (outbox_capture_main, capture_worker.c); NULL if no slot is free.  Its
 * argument is the database's oid, bgw_extra its name.  The launcher is
 * notified of its exit and starts it again itself.
 */
static BackgroundWorkerHandle *
launcher_start_worker(const char *function, const char *type, const LauncherDb *db)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;	/* we restart it */
	worker.bgw_notify_pid = MyProcPid;
	worker.bgw_main_arg = ObjectIdGetDatum(db->oid);
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, function, BGW_MAXLEN);
	snprintf(worker.bgw_name, BGW_MAXLEN, "%s for database %s", type, db->name);
	strlcpy(worker.bgw_type, type, BGW_MAXLEN);
	StaticAssertStmt(NAMEDATALEN <= BGW_EXTRALEN, "a database name fits in bgw_extra");
	strlcpy(worker.bgw_extra, db->name, BGW_EXTRALEN);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}

static LauncherDb *
launcher_find(Oid oid)
{
	int			i;

	for (i = 0; i < nldbs; i++)
		if (ldbs[i].oid == oid)
			return &ldbs[i];
	return NULL;
}

static LauncherDb *
launcher_add(Oid oid, const char *name)
{
	LauncherDb *db;

	if (nldbs == maxldbs)
	{
		maxldbs = Max(16, maxldbs * 2);
		ldbs = ldbs == NULL ?
			MemoryContextAlloc(TopMemoryContext, sizeof(LauncherDb) * maxldbs) :
			repalloc(ldbs, sizeof(LauncherDb) * maxldbs);
	}
	db = &ldbs[nldbs++];
	memset(db, 0, sizeof(LauncherDb));
	db->oid = oid;
	strlcpy(db->name, name, NAMEDATALEN);
	return db;
}

static void
launcher_log_waiting(LauncherDatabaseState state)
{
	ereport(LOG,
			(errmsg("outbox relay is waiting for database \"%s\"", outbox_database),
			 state == LAUNCHER_DB_MISSING ?
			 errdetail("The database does not exist.") :
			 state == LAUNCHER_DB_NO_CONNECTIONS ?
			 errdetail("The database does not allow connections.") :
			 state == LAUNCHER_DB_TEMPLATE ?
			 errdetail("The database is a template, which gets no relay.") :
			 errdetail("The database is invalid: a DROP DATABASE of it was interrupted."),
			 errhint("Create the database, or set outbox.database to the database that has the extension and restart the server.")));
}

/*
 * Read pg_database: which databases are served now.  The caller is
 * connected to no database: pg_database is a shared catalog.  Returns the
 * state of outbox.database in the one-database form.
 */
static LauncherDatabaseState
launcher_scan(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	LauncherDatabaseState one = LAUNCHER_DB_MISSING;
	bool		one_form = outbox_one_database_form();
	int			i;
	Oid		   *all;
	int			nall = 0;
	int			maxall = 64;

	for (i = 0; i < nldbs; i++)
		ldbs[i].served = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	all = palloc(sizeof(Oid) * maxall);
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);
		const char *name = NameStr(d->datname);
		LauncherDatabaseState state = LAUNCHER_DB_USABLE;
		LauncherDb *db;


		if (!d->datallowconn)
			state = LAUNCHER_DB_NO_CONNECTIONS;
#ifdef DATCONNLIMIT_INVALID_DB
		else if (d->datconnlimit == DATCONNLIMIT_INVALID_DB)
			state = LAUNCHER_DB_INVALID;	/* left by an interrupted DROP */
#endif
		else if (d->datistemplate)
			state = LAUNCHER_DB_TEMPLATE;	/* CREATE DATABASE copies it */
		if (one_form && strcmp(name, outbox_database) == 0)
			one = state;

		db = launcher_find(d->oid);
		if (state != LAUNCHER_DB_USABLE || !outbox_database_served(name))
			continue;
		if (nall == maxall)
		{
			maxall *= 2;
			all = repalloc(all, sizeof(Oid) * maxall);
		}
		all[nall++] = d->oid;
		if (db == NULL)
			db = launcher_add(d->oid, name);
		else if (strcmp(db->name, name) != 0)
		{
			/* renamed: workers connect by name, so look again */
			strlcpy(db->name, name, NAMEDATALEN);
			db->probed = false;
		}
		db->served = true;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	/*
	 * The slot of a database that is gone, or no longer served (a
	 * template, closed to connections, not listed), is given back once
	 * nothing runs in it, whether or not the launcher knew the database.
	 * Such a database refuses outbox_emit() (base.c) and takes no slot.
	 */
	for (i = 0; i < outbox_db_slots(); i++)
	{
		OutboxDbInfo info;
		int			j;

		if (!outbox_db_info(i, &info))
			continue;
		for (j = 0; j < nall && all[j] != info.dboid; j++)
			;
		if (j == nall)
			(void) outbox_db_release(info.dboid, 0);
	}
	CommitTransactionCommand();
	return one;
}

/* How a worker that stopped ended. */
typedef enum LauncherExit
{
	LAUNCHER_EXIT_DONE,			/* deliberately, or after a long run */
	LAUNCHER_EXIT_FAILED,		/* soon after it began its work */
	LAUNCHER_EXIT_LOOKED		/* a relay that found no extension yet */
} LauncherExit;

/*
 * Pause before starting again a relay that only looked while the database
 * has a slot (a CREATE EXTENSION not committed yet): doubled each time up
 * to LAUNCHER_MAX_BACKOFF_MS, and cut short when the slot's configuration
 * changes (the CREATE EXTENSION committed).
 */
#define LAUNCHER_LOOKED_MS		100

/* Whether the worker stopped; if so, when to start it again. */
static bool
launcher_reap(LauncherWorker *w, TimestampTz now, LauncherExit how)
{
	pid_t		pid;

	if (w->handle == NULL)
		return true;
	if (GetBackgroundWorkerPid(w->handle, &pid) != BGWH_STOPPED)
		return false;
	pfree(w->handle);
	w->handle = NULL;
	/* Restart at once after a long run or a deliberate exit, else back off. */
	if (how == LAUNCHER_EXIT_LOOKED)
		w->backoff = Min(Max(w->backoff * 2, LAUNCHER_LOOKED_MS), LAUNCHER_MAX_BACKOFF_MS);
	else if (how == LAUNCHER_EXIT_DONE ||
			 TimestampDifferenceExceeds(w->started, now, LAUNCHER_STABLE_MS))
		w->backoff = 0;
	else
		w->backoff = Min(Max(w->backoff * 2, 500), LAUNCHER_MAX_BACKOFF_MS);
	w->looked = how == LAUNCHER_EXIT_LOOKED;
	w->next_start = TimestampTzPlusMilliseconds(now, w->backoff);
	return true;
}

/* Start w if it is due; returns the longest the launcher may sleep. */
static long
launcher_start(LauncherWorker *w, LauncherDb *db, const char *function,
			   const char *type, TimestampTz now, bool has_slot)
{
	if (now < w->next_start)
		return (long) ((w->next_start - now) / 1000) + 1;
	w->handle = launcher_start_worker(function, type, db);
	w->started = now;
	if (w->handle != NULL)
	{
		w->no_slot_logged = false;
		if (has_slot && strcmp(function, "outbox_worker_main") == 0)
			outbox_db_set_note(db->oid, "");
		return LONG_MAX;
	}
	if (!w->no_slot_logged)
		ereport(LOG,
				(errmsg("%s for database \"%s\" cannot start: no background worker slot is free",
						type, db->name),
				 errdetail("max_worker_processes is %d; the outbox needs the launcher, a relay for each database with the extension and a capture worker for each that captures from the WAL.",
						   max_worker_processes),
				 errhint("Raise max_worker_processes and restart the server.")));
	w->no_slot_logged = true;
	if (has_slot && strcmp(function, "outbox_worker_main") == 0)
		outbox_db_set_note(db->oid, "waiting for a background worker (max_worker_processes)");
	return 1000;
}

void
outbox_launcher_main(Datum main_arg)
{
	LauncherDatabaseState logged = LAUNCHER_DB_USABLE;
	TimestampTz last_scan = 0;
	bool		woken = true;
	int			last_nfree = INT_MAX;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);
	outbox_set_launcher_latch(MyLatch);

	for (;;)
	{
		long		timeout = Min(outbox_poll_interval, LAUNCHER_SCAN_MS);
		TimestampTz now;
		int			probing = 0;
		int			i;

		CHECK_FOR_INTERRUPTS();
		/* Exit code 1: a launcher terminated by hand is started again. */
		if (ShutdownRequestPending)
			proc_exit(1);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now = GetCurrentTimestamp();
		/* Woken (a new slot, a hold ended) or due: read pg_database. */
		if (woken || TimestampDifferenceExceeds(last_scan, now, LAUNCHER_DB_POLL_MS))
		{
			LauncherDatabaseState one = launcher_scan();

			last_scan = now;
			/* The one-database form says once what it waits for. */
			if (outbox_one_database_form())
			{
				if (one != LAUNCHER_DB_USABLE && one != logged)
					launcher_log_waiting(one);
				logged = one;
			}
		}

		/*
		 * A slot was given back: a database whose relay could not take one
		 * (all were in use) is looked at again.
		 */
		{
			int			nfree = 0;
			OutboxDbInfo info;

			for (i = 0; i < outbox_db_slots(); i++)
				if (!outbox_db_info(i, &info))
					nfree++;
			if (nfree > last_nfree)
				for (i = 0; i < nldbs; i++)
					if (!outbox_db_info_of(ldbs[i].oid, &info))
						ldbs[i].probed = false;
			last_nfree = nfree;
		}

		for (i = 0; i < nldbs; i++)
		{
			OutboxDbInfo info;

			if (ldbs[i].relay.handle != NULL && !outbox_db_info_of(ldbs[i].oid, &info))
				probing++;
		}

		for (i = 0; i < nldbs; i++)
		{
			LauncherDb *db = &ldbs[i];
			OutboxDbInfo info;
			bool		has_slot = outbox_db_info_of(db->oid, &info);

			/*
			 * A relay that ends while the database has no slot only looked.
			 * One that found no extension although the database has a slot
			 * (a CREATE EXTENSION not committed yet) is started again after
			 * a growing pause, or as soon as the slot's configuration moves.
			 * Any other end (an error, a FATAL at connect) soon after its
			 * start is a failure, backed off.
			 */
			if (db->relay.handle != NULL &&
				launcher_reap(&db->relay, now,
							  !has_slot ? LAUNCHER_EXIT_DONE :
							  info.looked_at >= db->relay.started ? LAUNCHER_EXIT_LOOKED :
							  LAUNCHER_EXIT_FAILED))
				db->relay.looked_generation = info.config_generation;
			/* one that looked too early: again once the configuration moved */
			if (db->relay.handle == NULL && db->relay.looked && has_slot &&
				db->relay.next_start > now &&
				info.config_generation != db->relay.looked_generation)
				db->relay.next_start = now;
			(void) launcher_reap(&db->capture, now, LAUNCHER_EXIT_FAILED);

			if (!db->served)
			{
				/*
				 * Dropped, invalid, no longer listed: stop its workers and
				 * forget it (a slot left is given back by the scan once the
				 * database is gone).
				 */
				if (db->relay.handle != NULL)
					TerminateBackgroundWorker(db->relay.handle);
				if (db->capture.handle != NULL)
					TerminateBackgroundWorker(db->capture.handle);
				if (db->relay.handle == NULL && db->capture.handle == NULL)
				{
					ldbs[i--] = ldbs[--nldbs];
					continue;
				}
				timeout = Min(timeout, 100);
				continue;
			}

			if (db->relay.handle == NULL)
			{
				if (has_slot && info.hold_until > now)
					timeout = Min(timeout, (long) ((info.hold_until - now) / 1000) + 1);
				else if (has_slot && info.relay_pid != 0)
					timeout = Min(timeout, 1000);	/* an earlier launcher's relay */
				else if (has_slot || (!db->probed && probing < LAUNCHER_MAX_PROBES))
				{
					timeout = Min(timeout, launcher_start(&db->relay, db, "outbox_worker_main",
														  "outbox relay", now, has_slot));
					if (db->relay.handle != NULL)
					{
						if (!has_slot)
							probing++;
						db->probed = true;
					}
				}
			}

			/*
			 * The capture worker, once the relay runs: when a WAL capture
			 * may exist.  It exits by itself when none is left; one that
			 * keeps failing is started again after a backoff.
			 */
			if (db->capture.handle == NULL && db->relay.handle != NULL && has_slot &&
				outbox_capture_wanted(db->oid, info.index, MyLatch))
				timeout = Min(timeout, launcher_start(&db->capture, db, "outbox_capture_main",
													  "outbox capture", now, has_slot));
			else if (db->capture.handle == NULL)
			{
				/* an exit with nothing left to capture is no failure */
				db->capture.backoff = 0;
				db->capture.next_start = 0;
			}
		}

		woken = (WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						   timeout, PG_WAIT_EXTENSION) & WL_LATCH_SET) != 0;
		ResetLatch(MyLatch);
	}
}
