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

#include "commands/dbcommands.h"
#include "miscadmin.h"

#include "base.h"

/*---- GUC variables (defined in _PG_init) ----*/
char	   *outbox_database = NULL;
char	   *outbox_relay_role = NULL;
int			outbox_max_payload_size = 1024 * 1024;
bool		outbox_enabled = true;
int			outbox_poll_interval = 1000;
int			outbox_retry_base_delay = 500;
int			outbox_retry_max_delay = 300000;
int			outbox_relay_memory = 64 * 1024;	/* kB */
int			outbox_retention = 3600;	/* seconds */
char	   *outbox_test_fault = NULL;
int			outbox_max_receives = 5;
int			outbox_max_queues = 16;
int			outbox_queue_window = 4096;

/* Whether _PG_init ran from shared_preload_libraries. */
bool		outbox_preloaded = false;

/* Set by the queues when the library is preloaded (outbox_queue_init). */
OutboxWakeReceivers outbox_receivers_wake = NULL;

/* Whether this backend's database is outbox.database: 0 unknown, 1 yes, -1 no. */
static int	database_matches = 0;

/*
 * Refuse to run in a database other than outbox.database: the relay worker
 * serves only that one, so messages stored elsewhere would never leave.
 */
void
outbox_check_database(const char *what)
{
	if (database_matches == 0)
	{
		char	   *dbname = get_database_name(MyDatabaseId);

		database_matches = (dbname && strcmp(dbname, outbox_database) == 0) ? 1 : -1;
	}
	if (database_matches < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s cannot be used in database \"%s\"", what,
						get_database_name(MyDatabaseId)),
				 errdetail("The outbox relay serves database \"%s\" (outbox.database).",
						   outbox_database),
				 errhint("Connect to database \"%s\", or set outbox.database to \"%s\" and restart the server.",
						 outbox_database, get_database_name(MyDatabaseId))));
}
