/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Module load: GUCs, shared memory hooks and transaction callbacks.
 *
 * The library must be loaded through shared_preload_libraries: the commit
 * sequence and the in-flight slots live in shared memory, and the
 * transaction callbacks must be in place in every backend before its first
 * transaction.  Loaded any other way, it defines its settings and nothing
 * else, and the SQL functions explain what to change.
 *
 * This file is the top of the extension: it calls every part's init and
 * owns the shared memory hooks, which size and set up each part's shared
 * state in turn; no other file calls into it (test/check-layering.sh).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "outbox.h"

PG_MODULE_MAGIC;

/*
 * The GUC variables live in base.c, so that every file may read them without
 * depending on this one, which calls everyone's init.
 */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PGDLLEXPORT void _PG_init(void);

static bool
outbox_databases_check(char **newval, void **extra, GucSource source)
{
	const char *why = NULL;

	if (outbox_databases_valid(*newval, &why))
		return true;
	GUC_check_errdetail("outbox.databases is '*' or a list of database names: %s.", why);
	return false;
}

/* The database check of the SQL functions decides again. */
static void
outbox_databases_assign(const char *newval, void *extra)
{
	outbox_databases_generation++;
}

/*
 * Shared memory of every part: the commit sequence (shmem.c), the delivery
 * statistics (stats.c) and the queues (queue_shmem.c).
 */
static void
outbox_shmem_request_hook(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	outbox_shmem_request();
	RequestAddinShmemSpace(outbox_stats_shmem_size());
	outbox_queue_shmem_request();
	RequestAddinShmemSpace(outbox_capture_shmem_size());
}

static void
outbox_shmem_startup_hook(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	outbox_shmem_init();
	outbox_stats_shmem_init();
	outbox_queue_shmem_init();
	outbox_capture_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

void
_PG_init(void)
{
	/* Reloadable settings first: they are useful even without preloading. */
	DefineCustomIntVariable("outbox.max_payload_size",
							"Largest payload outbox_emit() accepts.",
							"Measured as the size of the jsonb value.",
							&outbox_max_payload_size,
							1024 * 1024,
							1024,
							MaxAllocSize / 2,
							PGC_SUSET,
							GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("outbox.enabled",
							 "Whether the relay delivers messages.",
							 "Off pauses all delivery; messages keep accumulating.",
							 &outbox_enabled,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.poll_interval",
							"Longest the relay sleeps without being woken.",
							"Commits wake the relay at once; this is a safety net.",
							&outbox_poll_interval,
							1000,
							10,
							3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_base_delay",
							"Delay before the first retry of a failed delivery.",
							"Each further retry doubles it, with jitter, up to outbox.retry_max_delay.",
							&outbox_retry_base_delay,
							500,
							1,
							3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retry_max_delay",
							"Longest delay between retries of a failed delivery.",
							NULL,
							&outbox_retry_max_delay,
							300000,
							1,
							24 * 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.relay_memory",
							"Most memory the relay holds for messages.",
							"Read-ahead queues and the request bodies built from them, shared evenly between targets. "
							"A message larger than a target's share is still delivered, alone.",
							&outbox_relay_memory,
							64 * 1024,
							1024,
							16 * 1024 * 1024,
							PGC_SIGHUP,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.retention",
							"How long delivered messages are kept.",
							"Messages are removed a whole chunk at a time, once every target has finished "
							"them and their chunk stopped being written at least this long ago.",
							&outbox_retention,
							3600,
							0,
							PG_INT32_MAX,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

#ifdef OUTBOX_TEST_FAULTS
	outbox_test_fault_define_guc();
#endif

	outbox_destinations_define_gucs();
	outbox_standby_define_gucs();
	outbox_topic_grants_define_gucs();
	outbox_trace_define_gucs();

	DefineCustomIntVariable("outbox.max_receives",
							"Rolled-back receives after which a queue message becomes a dead letter.",
							"Serialization failures, deadlocks, lock timeouts and terminated sessions do not count; 0 means a message is received again however often its receivers roll back.",
							&outbox_max_receives,
							5, 0, 1000000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	if (!process_shared_preload_libraries_in_progress)
	{
		MarkGUCPrefixReserved("outbox");
		return;
	}

	DefineCustomStringVariable("outbox.database",
							   "The one database the outbox serves, or empty for outbox.databases.",
							   "The one-database form of 0.2: when set, outbox_emit() is refused in every other database.",
							   &outbox_database,
							   "",
							   PGC_POSTMASTER,
							   0,
							   NULL, outbox_databases_assign, NULL);

	DefineCustomStringVariable("outbox.databases",
							   "Databases that get a relay: '*' for every database with the extension, or a list of names.",
							   "Used when outbox.database is empty.  Templates and databases that refuse connections get none.",
							   &outbox_databases,
							   "*",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   outbox_databases_check, outbox_databases_assign, NULL);

	DefineCustomIntVariable("outbox.max_databases",
							"Databases that can have an outbox at once.",
							"Each takes a slot of shared memory from CREATE EXTENSION until the extension or the database is dropped.",
							&outbox_max_databases,
							16, 1, 1024,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.max_queues",
							"Queues that can be received from.",
							"Each takes outbox.queue_window entries of shared memory from its first receive until it is dropped.",
							&outbox_max_queues,
							16, 1, 1024,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("outbox.queue_window",
							"Messages of one queue held in shared memory, in id order.",
							"Receivers choose among these; a key held by a slow receiver can fill it.",
							&outbox_queue_window,
							4096, 16, 1048576,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);

	DefineCustomStringVariable("outbox.relay_role",
							   "Role the relay connects as; empty for the bootstrap superuser.",
							   "A role that is not a superuser needs the grants the README lists.",
							   &outbox_relay_role,
							   "",
							   PGC_POSTMASTER,
							   0,
							   NULL, NULL, NULL);

	MarkGUCPrefixReserved("outbox");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = outbox_shmem_request_hook;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = outbox_shmem_startup_hook;
	outbox_emit_init();
	outbox_queue_init();
	outbox_capture_init();
	outbox_databases_init();
	outbox_register_launcher();
	outbox_preloaded = true;
}
