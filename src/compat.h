/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Version shims, so the rest of the code reads like PostgreSQL 15's.
 *
 * Supported: PostgreSQL 13 to 17.  Each shim names the release that
 * changed the API it covers.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_COMPAT_H
#define OUTBOX_COMPAT_H

#if PG_VERSION_NUM < 130000
#error "outbox needs PostgreSQL 13 or later"
#endif

/* PostgreSQL 17 renamed the PGPROC index to MyProcNumber. */
#if PG_VERSION_NUM >= 170000
#define OUTBOX_MY_PROC_INDEX()	(MyProcNumber)
#else
#define OUTBOX_MY_PROC_INDEX()	(MyProc->pgprocno)
#endif

/* PostgreSQL 15 added MarkGUCPrefixReserved. */
#if PG_VERSION_NUM < 150000
#define MarkGUCPrefixReserved(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

/* ExecInsertIndexTuples: PG14 takes the ResultRelInfo, PG16 adds onlySummarizing. */
#if PG_VERSION_NUM >= 160000
#define outbox_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL, false)
#elif PG_VERSION_NUM >= 140000
#define outbox_insert_index_tuples(rri, slot, estate) \
	ExecInsertIndexTuples((rri), (slot), (estate), false, false, NULL, NIL)
#else
#define outbox_insert_index_tuples(rri, slot, estate) \
	((estate)->es_result_relation_info = (rri), \
	 ExecInsertIndexTuples((slot), (estate), false, NULL, NIL))
#endif

/* PostgreSQL 18 adds an instrumentation argument to index_beginscan. */
#if PG_VERSION_NUM >= 180000
#define outbox_index_beginscan(heap, index, snapshot) \
	index_beginscan((heap), (index), (snapshot), NULL, 0, 0)
#else
#define outbox_index_beginscan(heap, index, snapshot) \
	index_beginscan((heap), (index), (snapshot), 0, 0)
#endif

#endif							/* OUTBOX_COMPAT_H */
