/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The relay's launcher: a background worker connected to no database
 *	  that starts the relay once outbox.database can be connected to.
 *
 * A background worker that connects to a database that does not exist dies
 * with a FATAL error and is restarted, again and again; and one that exits
 * to be restarted waits bgw_restart_time first.  So the relay is not a
 * static worker: the launcher, registered at server start, looks at
 * pg_database (a shared catalog, readable without a database connection),
 * says once what it waits for, and registers the relay as a dynamic worker
 * the moment the database is usable.  It notices the relay's exit (it is
 * notified, as bgw_notify_pid) and starts a new one: at once after a
 * deliberate exit, after a backoff when the relay keeps failing soon after
 * its start.  A normal start logs nothing that looks like a failure.
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
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "outbox.h"

/* How often the launcher looks for the database while waiting for it. */
#define LAUNCHER_DB_POLL_MS		250
/* A relay that ran at least this long is restarted at once. */
#define LAUNCHER_STABLE_MS		10000
/* Longest pause before restarting a relay that keeps failing. */
#define LAUNCHER_MAX_BACKOFF_MS	30000

PGDLLEXPORT void outbox_launcher_main(Datum main_arg);

/* Whether outbox.database can be connected to, and if not why. */
typedef enum LauncherDatabaseState
{
	LAUNCHER_DB_USABLE,
	LAUNCHER_DB_MISSING,
	LAUNCHER_DB_NO_CONNECTIONS,
	LAUNCHER_DB_INVALID
} LauncherDatabaseState;

/*
 * Register the launcher.  Called from _PG_init while shared_preload_libraries
 * is processed.
 */
void
outbox_register_launcher(void)
{
	BackgroundWorker worker;

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
 * Start a dynamic worker running function of this library: the relay
 * (outbox_worker_main, relay_main.c) or the capture worker
 * (outbox_capture_main, capture_wal.c); NULL if no slot is free.  The
 * launcher is notified of its exit and starts it again itself.
 */
static BackgroundWorkerHandle *
launcher_start_worker(const char *function, const char *name)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;	/* we restart it */
	worker.bgw_notify_pid = MyProcPid;
	strlcpy(worker.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, function, BGW_MAXLEN);
	strlcpy(worker.bgw_name, name, BGW_MAXLEN);
	strlcpy(worker.bgw_type, name, BGW_MAXLEN);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	return handle;
}

/* The caller is connected to no database: pg_database is a shared catalog. */
static LauncherDatabaseState
launcher_database_state(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	LauncherDatabaseState state = LAUNCHER_DB_MISSING;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (strcmp(NameStr(db->datname), outbox_database) != 0)
			continue;
		if (!db->datallowconn)
			state = LAUNCHER_DB_NO_CONNECTIONS;
#ifdef DATCONNLIMIT_INVALID_DB
		else if (db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			state = LAUNCHER_DB_INVALID;	/* left by an interrupted DROP */
#endif
		else
			state = LAUNCHER_DB_USABLE;
		break;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return state;
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
			 errdetail("The database is invalid: a DROP DATABASE of it was interrupted."),
			 errhint("Create the database, or set outbox.database to the database that has the extension and restart the server.")));
}

void
outbox_launcher_main(Datum main_arg)
{
	BackgroundWorkerHandle *relay = NULL;
	LauncherDatabaseState logged = LAUNCHER_DB_USABLE;
	TimestampTz relay_started = 0;
	TimestampTz next_start = 0;
	long		backoff = 0;
	bool		no_slot_logged = false;
	BackgroundWorkerHandle *capture = NULL;
	TimestampTz capture_started = 0;
	TimestampTz capture_next_start = 0;
	long		capture_backoff = 0;
	bool		capture_no_slot_logged = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);

	for (;;)
	{
		long		timeout = outbox_poll_interval;
		TimestampTz now;

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
		if (relay != NULL)
		{
			pid_t		pid;

			if (GetBackgroundWorkerPid(relay, &pid) == BGWH_STOPPED)
			{
				/* Restart at once after a long run, else back off. */
				pfree(relay);
				relay = NULL;
				if (TimestampDifferenceExceeds(relay_started, now, LAUNCHER_STABLE_MS))
					backoff = 0;
				else
					backoff = Min(Max(backoff * 2, 500), LAUNCHER_MAX_BACKOFF_MS);
				next_start = TimestampTzPlusMilliseconds(now, backoff);
			}
		}

		if (relay == NULL && outbox_relay_running() != 0)
		{
			/*
			 * A relay started by an earlier launcher (this one was restarted
			 * after an error) still runs: wait for it to end.
			 */
			timeout = Min(timeout, 1000);
		}
		else if (relay == NULL)
		{
			if (now < next_start)
				timeout = Min(timeout, (long) ((next_start - now) / 1000) + 1);
			else
			{
				LauncherDatabaseState state = launcher_database_state();

				if (state == LAUNCHER_DB_USABLE)
				{
					relay = launcher_start_worker("outbox_worker_main", "outbox relay");
					if (relay != NULL)
					{
						relay_started = now;
						no_slot_logged = false;
					}
					else
					{
						if (!no_slot_logged)
							ereport(LOG,
									(errmsg("outbox relay cannot start: no background worker slot is free"),
									 errhint("Raise max_worker_processes.")));
						no_slot_logged = true;
						timeout = Min(timeout, 1000);
					}
				}
				else
				{
					/* Say it once, and again if the reason changes. */
					if (state != logged)
						launcher_log_waiting(state);
					timeout = Min(timeout, LAUNCHER_DB_POLL_MS);
				}
				logged = state;
			}
		}

		/*
		 * The capture worker (capture_wal.c), once the relay runs: when a
		 * WAL capture may exist.  It exits by itself when none is left;
		 * one that keeps failing is started again after a backoff.
		 */
		if (capture != NULL)
		{
			pid_t		pid;

			if (GetBackgroundWorkerPid(capture, &pid) == BGWH_STOPPED)
			{
				pfree(capture);
				capture = NULL;
				/* an exit with nothing left to capture is no failure */
				if (!outbox_capture_wanted(MyLatch) ||
					TimestampDifferenceExceeds(capture_started, now, LAUNCHER_STABLE_MS))
					capture_backoff = 0;
				else
					capture_backoff = Min(Max(capture_backoff * 2, 500),
										  LAUNCHER_MAX_BACKOFF_MS);
				capture_next_start = TimestampTzPlusMilliseconds(now, capture_backoff);
			}
		}
		if (capture == NULL && relay != NULL && outbox_capture_wanted(MyLatch))
		{
			if (now < capture_next_start)
				timeout = Min(timeout, (long) ((capture_next_start - now) / 1000) + 1);
			else
			{
				capture = launcher_start_worker("outbox_capture_main", "outbox capture");
				capture_started = now;
				if (capture != NULL)
					capture_no_slot_logged = false;
				else
				{
					if (!capture_no_slot_logged)
						ereport(LOG,
								(errmsg("outbox capture worker cannot start: no background worker slot is free"),
								 errhint("Raise max_worker_processes.")));
					capture_no_slot_logged = true;
					timeout = Min(timeout, 1000);
				}
			}
		}

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
