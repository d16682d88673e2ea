/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Version shims, so the rest of the code reads like PostgreSQL 15's.
 *
 * Supported, built and tested: PostgreSQL 15, 16, 17 and 18; what 19
 * changes is written from its documentation (there is no 19 server here to
 * test against).  Each shim names the release that changed the API it
 * covers, and why it matters here.  Nothing outside this file tests
 * PG_VERSION_NUM.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

/* 15 brought common/pg_prng.h, common/hmac.h and shmem_request_hook. */
#if PG_VERSION_NUM < 150000
#error "outbox needs PostgreSQL 15 or later"
#endif

/*
 * 16 marked the SQL-callable function PGDLLEXPORT in PG_FUNCTION_INFO_V1
 * (15 marks only its info record): the library is built with hidden
 * visibility (Makefile), and the server must find the function by name.
 */
#include "fmgr.h"
#if PG_VERSION_NUM < 160000
#undef PG_FUNCTION_INFO_V1
#define PG_FUNCTION_INFO_V1(funcname) \
extern PGDLLEXPORT Datum funcname(PG_FUNCTION_ARGS); \
extern PGDLLEXPORT const Pg_finfo_record *CppConcat(pg_finfo_, funcname) (void); \
const Pg_finfo_record *CppConcat(pg_finfo_, funcname) (void) \
{ \
	static const Pg_finfo_record finfo = {1}; \
	return &finfo; \
} \
extern int	no_such_variable
#endif

/* 16 moved VARSIZE and the other varlena macros into varatt.h. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/* 17 renamed the PGPROC index, which our in-flight slots are indexed by. */
#if PG_VERSION_NUM >= 170000
#define OUTBOX_MY_PROC_INDEX()	(MyProcNumber)
#else
#define OUTBOX_MY_PROC_INDEX()	(MyProc->pgprocno)
#endif

/* 16 added onlySummarizing to ExecInsertIndexTuples. */
#if PG_VERSION_NUM >= 160000
#define outbox_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#else
#define outbox_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#endif

/* 18 adds an instrumentation argument to index_beginscan. */
#if PG_VERSION_NUM >= 180000
#define outbox_index_beginscan_keys(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), 0)
#else
#define outbox_index_beginscan_keys(heap, index, snapshot, nkeys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), 0)
#endif
#define outbox_index_beginscan(heap, index, snapshot) \
	outbox_index_beginscan_keys((heap), (index), (snapshot), 0)

/* 18 adds deferrable_ok to RelationGetPrimaryKeyIndex (ours is not deferrable). */
#if PG_VERSION_NUM >= 180000
#define outbox_primary_key_index(rel)	RelationGetPrimaryKeyIndex((rel), false)
#else
#define outbox_primary_key_index(rel)	RelationGetPrimaryKeyIndex(rel)
#endif

/*
 * 17 made the first argument of CreateWaitEventSet a ResourceOwner (NULL:
 * the set lives until freed, in TopMemoryContext); before, the memory
 * context to allocate it in.  Passing a memory context to 17 corrupts
 * memory.
 */
#if PG_VERSION_NUM >= 170000
#define outbox_create_wait_event_set(nevents)	CreateWaitEventSet(NULL, (nevents))
#else
#define outbox_create_wait_event_set(nevents)	CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/* 18 types the binary side of pg_b64_encode/pg_b64_decode as uint8. */
#if PG_VERSION_NUM >= 180000
typedef uint8 outbox_b64_byte;
#else
typedef char outbox_b64_byte;
#endif

/*
 * The "extra" of a GUC check hook: malloc'd up to 15, from the GUC memory
 * context (guc_malloc, freed with guc_free) from 16 on.
 */
#if PG_VERSION_NUM >= 160000
#define outbox_guc_malloc(size)	guc_malloc(LOG, (size))
#define outbox_guc_free(ptr)	guc_free(ptr)
#else
#define outbox_guc_malloc(size)	malloc(size)
#define outbox_guc_free(ptr)	free(ptr)
#endif

/* 16 replaced the owner check of each kind of object by object_ownercheck. */
#if PG_VERSION_NUM >= 160000
#define outbox_database_ownercheck(dboid, roleid) \
	object_ownercheck(DatabaseRelationId, (dboid), (roleid))
#else
#define outbox_database_ownercheck(dboid, roleid) \
	pg_database_ownercheck((dboid), (roleid))
#endif

/*
 * 16 records why a replication slot was invalidated (15: only when, and
 * only max_slot_wal_keep_size invalidates one there).
 */
#if PG_VERSION_NUM >= 160000
#define OUTBOX_HAVE_SLOT_INVALIDATION_CAUSE 1
#define outbox_slot_invalidated(slot)	((slot)->data.invalidated != RS_INVAL_NONE)
#else
#define outbox_slot_invalidated(slot) \
	((slot)->data.invalidated_at != InvalidXLogRecPtr && \
	 (slot)->data.restart_lsn == InvalidXLogRecPtr)
#endif

/* 18 invalidates a slot idle longer than idle_replication_slot_timeout. */
#if PG_VERSION_NUM >= 180000
#define OUTBOX_HAVE_IDLE_SLOT_TIMEOUT 1
#endif

/* 18 adds error_if_invalid to ReplicationSlotAcquire: we look ourselves. */
#if PG_VERSION_NUM >= 180000
#define outbox_slot_acquire(name)	ReplicationSlotAcquire((name), true, false)
#else
#define outbox_slot_acquire(name)	ReplicationSlotAcquire((name), true)
#endif

/*
 * 19 turns logical decoding on when the first logical slot is made on a
 * server with wal_level = replica (effective_wal_level), and off when the
 * last is dropped or invalidated: there, WAL capture needs replica (its
 * slot, made by outbox.capture(), turns decoding on); before, logical.
 * Written from 19's documentation: no 19 server was at hand to test it.
 */
#if PG_VERSION_NUM >= 190000
#define OUTBOX_CAPTURE_WAL_LEVEL	WAL_LEVEL_REPLICA
#else
#define OUTBOX_CAPTURE_WAL_LEVEL	WAL_LEVEL_LOGICAL
#endif

/* 17 passes a decoded change's tuples as HeapTuple (16: ReorderBufferTupleBuf). */
#if PG_VERSION_NUM >= 170000
#define outbox_change_tuple(t)	(t)
#else
#define outbox_change_tuple(t)	((t) ? &(t)->tuple : NULL)
#endif

/* 17 has failover slots, which standbys with sync_replication_slots copy. */
#if PG_VERSION_NUM >= 170000
#define OUTBOX_HAVE_FAILOVER_SLOTS 1
#endif

/* 17 adds flush to LogLogicalMessage; ours is transactional, flushed at commit. */
#if PG_VERSION_NUM >= 170000
#define outbox_log_logical_message(prefix, message, size) \
	LogLogicalMessage((prefix), (message), (size), true, false)
#else
#define outbox_log_logical_message(prefix, message, size) \
	LogLogicalMessage((prefix), (message), (size), true)
#endif

#endif							/* OUTBOX_COMPAT_H */
