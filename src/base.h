/*-------------------------------------------------------------------------
 *
 * base.h
 *	  What every file of the extension may use: the names and columns of
 *	  the extension's objects, the settings _PG_init defines, the database
 *	  check, and the hook through which a commit wakes queue receivers.
 *
 * base.c defines these and calls no other file of the extension, so using
 * them never makes a dependency circle (test/check-layering.sh checks it).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_BASE_H
#define OUTBOX_BASE_H

#include "postgres.h"

/*---- names of the extension's objects ----*/
#define OUTBOX_SCHEMA			"outbox"
#define OUTBOX_MESSAGES_TABLE	"messages"
#define OUTBOX_STATE_TABLE		"state"
#define OUTBOX_MARK_SEQUENCE	"id_mark"
/* Messages are stored in chunks outbox.messages_1 .. _N (schema 0.2). */
#define OUTBOX_NUM_CHUNKS		4

/*---- columns of outbox.messages, in table order ----*/
#define Anum_outbox_messages_id			1
#define Anum_outbox_messages_msg_id		2
#define Anum_outbox_messages_topic		3
#define Anum_outbox_messages_key		4
#define Anum_outbox_messages_payload	5
#define Anum_outbox_messages_headers	6
#define Anum_outbox_messages_emitted_at	7
#define Natts_outbox_messages			7

/*---- settings: defined by _PG_init (outbox.c), stored in base.c ----*/
extern char *outbox_database;
extern char *outbox_databases;
extern int	outbox_max_databases;
extern uint64 outbox_databases_generation;	/* bumped when either changes */
extern char *outbox_relay_role;
extern int	outbox_max_payload_size;
extern bool outbox_enabled;
extern int	outbox_poll_interval;
extern int	outbox_retry_base_delay;
extern int	outbox_retry_max_delay;
extern int	outbox_relay_memory;
extern int	outbox_retention;
extern int	outbox_max_receives;
extern int	outbox_max_queues;
extern int	outbox_queue_window;

/* Whether _PG_init ran from shared_preload_libraries. */
extern bool outbox_preloaded;

/*
 * Test hooks: points where the suite makes a part fail or stand still,
 * named by the setting outbox.test_fault.  Only a test build has them
 * (make OUTBOX_TEST_FAULTS=1, as test/run-tests.sh builds): in the
 * product, the setting does not exist and outbox_fault() is false, so the
 * compiler drops every hook.
 */
#ifdef OUTBOX_TEST_FAULTS
extern char *outbox_test_fault;
extern bool outbox_fault(const char *point);
extern void outbox_test_fault_define_guc(void);
#else
#define outbox_fault(point)	false
#endif

/*---- the database check ----*/
extern void outbox_check_database(const char *what);

/* The one-database form of 0.2: outbox.database names the database. */
static inline bool
outbox_one_database_form(void)
{
	return outbox_database != NULL && outbox_database[0] != '\0';
}

extern bool outbox_database_served(const char *dbname);
extern bool outbox_this_database_served(void);
extern bool outbox_this_database_served_known(void);
extern bool outbox_databases_valid(const char *value, const char **why);

/*---- the extension dropped under a worker ----*/
extern bool outbox_extension_installed(void);
extern bool outbox_extension_gone(void);
extern const char *outbox_fence_extension_drop(void);
extern bool outbox_error_from_drop(void);

/*---- waking queue receivers ----*/

/*
 * Wakes receivers waiting in outbox.receive(), or NULL.  The queues set it
 * (outbox_queue_init) when the library is preloaded; the commit path calls
 * outbox_wake_receivers() after a transaction that stored messages ended,
 * without knowing who listens.
 */
typedef void (*OutboxWakeReceivers) (void);
extern OutboxWakeReceivers outbox_receivers_wake;

static inline void
outbox_wake_receivers(void)
{
	if (outbox_receivers_wake != NULL)
		outbox_receivers_wake();
}

#endif							/* OUTBOX_BASE_H */
