/*-------------------------------------------------------------------------
 *
 * queue_xact.c
 *	  The claims of this backend's transaction: how they end at commit, at
 *	  abort and at a savepoint's rollback, and which rollbacks count.
 *
 * At XACT_EVENT_COMMIT the claims become "acknowledged" in shared memory;
 * at abort (ROLLBACK, an error, the session ending) or at the rollback of
 * the savepoint that contained the receive, they become free again, in
 * their place.  So a claim lives exactly as long as the transaction.  A
 * backend that ends with claims releases them in its exit callback.
 *
 * Only rollbacks that say something about the messages count toward
 * outbox.max_receives (queue_poison.c): one caused by an error of class 40
 * (serialization failure, deadlock) or 53 (the server ran short of
 * resources), by an I/O error, a lock_timeout or an administrator
 * ending the session does not (rollback_counts()).  The cause comes from
 * the error report (emit_log_hook).  Usually it precedes the abort, which
 * then decides at once; but a failed COMMIT in a procedure, or an error
 * passing through a PL/pgSQL block with EXCEPTION, aborts first and is
 * reported after.  So a release that no error at its nesting level
 * explains is pending.  An error reported later in the same transaction
 * decides it, and so does one reported in the next transaction before it
 * ran any statement (the rethrow of a failed COMMIT in a procedure).
 * Otherwise it counts (unless an earlier error of the transaction, raised
 * while the message was held, says otherwise) once the transaction
 * commits, or once a statement of a later transaction starts
 * (post_parse_analyze_hook, ExecutorStart_hook, ProcessUtility_hook), a
 * receive starts or the backend exits.  Statements of the same transaction
 * do not settle it: a PL/pgSQL handler may run some before it raises the
 * error again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "parser/analyze.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/elog.h"
#include "utils/memutils.h"

#include "queue.h"

/* A message this backend's transaction holds. */
typedef struct LocalClaim
{
	int			slot;
	uint32		epoch;
	int64		id;
	SubTransactionId subid;
	uint64		seq;			/* claim_seq when claimed */
	bool		poison;			/* claimed to be dead-lettered */
} LocalClaim;

static LocalClaim *claims = NULL;
static int	nclaims = 0;
static int	maxclaims = 0;
static uint64 claim_seq = 0;	/* claims made by this backend */

/*
 * A rollback of a message whose cause is not known yet (see
 * rollback_counts()): its abort came before the error that caused it was
 * reported, or without an error.  Room for maxclaims of them.
 */
typedef struct PendingRollback
{
	int			slot;
	uint32		epoch;
	int64		id;
	uint64		xact;			/* xact_count when released */
	bool		decided;		/* an error reported since decided it */
	bool		counts;			/* if decided: whether it counts */
	bool		fallback;		/* whether it counts if no error comes */
} PendingRollback;

static PendingRollback *pending = NULL;
static int	npending = 0;

/* Top-level transactions this backend ended, and whether the current one
 * has started a statement. */
static uint64 xact_count = 0;
static bool stmt_started = false;

/* Which pending rollbacks pending_apply() applies. */
typedef enum PendingScope
{
	PENDING_DECIDED,			/* those an error decided */
	PENDING_EARLIER,			/* ... and those of earlier transactions */
	PENDING_ALL					/* all, undecided ones by their fallback */
} PendingScope;

/*
 * The last error (ERROR or worse) reported in this transaction while it
 * held messages or had rollbacks pending, 0 if none.  The abort it causes
 * (at the nesting level it was reported at) is classified by it and uses
 * it up; claims held when it was reported (seq below err_claimseq) and
 * released later without an error of their own fall back to it.
 */
static int	err_code = 0;
static int	err_level = 0;		/* transaction nesting level */
static bool err_fatal = false;	/* FATAL or PANIC: the session ends */
static bool err_used = true;	/* the abort it caused classified by it */
static uint64 err_claimseq = 0;

static emit_log_hook_type prev_emit_log_hook = NULL;
static post_parse_analyze_hook_type prev_post_parse_analyze_hook = NULL;
static ExecutorStart_hook_type prev_ExecutorStart_hook = NULL;
static ProcessUtility_hook_type prev_ProcessUtility_hook = NULL;

static bool rollback_counts(int sqlerrcode);
static void queue_xact_callback(XactEvent event, void *arg);
static void queue_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								   SubTransactionId parentSubid, void *arg);

/*
 * Room for "more" claims, and for as many pending rollbacks as there can
 * be claims: pending ones are settled at every receive, before it claims.
 */
void
queue_claims_reserve(int more)
{
	int			n;
	LocalClaim *c;
	PendingRollback *p;

	if (nclaims + more <= maxclaims)
		return;
	n = Max(Max(64, maxclaims * 2), nclaims + more);

	/*
	 * New arrays first, then the copy: an allocation that fails leaves
	 * both arrays and maxclaims as they were.
	 */
	c = MemoryContextAlloc(TopMemoryContext, n * sizeof(LocalClaim));
	p = MemoryContextAllocExtended(TopMemoryContext, n * sizeof(PendingRollback),
								   MCXT_ALLOC_NO_OOM);
	if (p == NULL)
	{
		pfree(c);
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory"),
				 errdetail("Failed on a request of size %zu for outbox.receive().",
						   n * sizeof(PendingRollback))));
	}
	if (claims != NULL)
	{
		memcpy(c, claims, nclaims * sizeof(LocalClaim));
		memcpy(p, pending, npending * sizeof(PendingRollback));
		pfree(claims);
		pfree(pending);
	}
	claims = c;
	pending = p;
	maxclaims = n;
}

/*
 * Note a claim of this transaction, made under the slot's lock
 * (queue_select): queue_claims_reserve() made room for it, so this cannot
 * fail.
 */
void
queue_claim_add(int slot, uint32 epoch, int64 id, SubTransactionId subid,
				bool poison)
{
	LocalClaim *c = &claims[nclaims++];

	c->slot = slot;
	c->epoch = epoch;
	c->id = id;
	c->subid = subid;
	c->poison = poison;
	c->seq = claim_seq++;
}

/*
 * An error report.  Remember its SQLSTATE when it may end a transaction
 * that holds messages: the abort that follows is classified by it.  Runs
 * for every report of the backend, so it only compares and stores.
 *
 * An error caught by a PL/pgSQL EXCEPTION block is not reported, and an
 * error is reported here only while log_min_messages lets it reach the
 * server log (an ERROR unless it is set to fatal or panic, a FATAL unless
 * panic); a rollback whose cause was not seen counts.
 */
static void
queue_emit_log(ErrorData *edata)
{
	if (edata->elevel >= ERROR && (nclaims > 0 || npending > 0))
	{
		int			i;

		bool		rethrow = IsTransactionState() && !stmt_started;

		/*
		 * Rollbacks still undecided of this transaction were caused by this
		 * error, which was caught, the (sub)transaction aborted, and thrown
		 * again: a PL/pgSQL block whose handlers do not take it, or do and
		 * raise it again.  So were those of the previous transaction if
		 * this one has run no statement yet: a failed COMMIT in a
		 * procedure, thrown again in the transaction that follows it.
		 * Shared memory is not touched here: the next transaction event or
		 * statement applies them.
		 */
		for (i = 0; i < npending; i++)
			if (!pending[i].decided &&
				(pending[i].xact == xact_count ||
				 (rethrow && pending[i].xact + 1 == xact_count)))
			{
				pending[i].decided = true;
				pending[i].counts = rollback_counts(edata->sqlerrcode);
			}
		err_code = edata->sqlerrcode;
		err_level = GetCurrentTransactionNestLevel();
		err_fatal = edata->elevel >= FATAL;
		err_used = false;
		err_claimseq = claim_seq;
	}
	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
}

/*
 * Whether a rollback caused by an error with this SQLSTATE (0: no error,
 * as for ROLLBACK or a lost client) counts toward outbox.max_receives:
 * whether it says something about the messages the transaction held.
 * The table of docs/queues.md, "Which rollbacks count".
 */
static bool
rollback_counts(int sqlerrcode)
{
	switch (ERRCODE_TO_CATEGORY(sqlerrcode))
	{
		case ERRCODE_TRANSACTION_ROLLBACK:	/* 40001, 40P01, ... */
		case ERRCODE_INSUFFICIENT_RESOURCES:	/* disk full, out of memory */
			return false;
		default:
			break;
	}
	switch (sqlerrcode)
	{
		case ERRCODE_SYSTEM_ERROR:	/* 58000 */
		case ERRCODE_IO_ERROR:	/* 58030; not 58P01, a file a message names */
		case ERRCODE_LOCK_NOT_AVAILABLE:	/* lock_timeout, NOWAIT */
		case ERRCODE_ADMIN_SHUTDOWN:	/* pg_terminate_backend, shutdown */
		case ERRCODE_CRASH_SHUTDOWN:	/* another backend crashed */
		case ERRCODE_CANNOT_CONNECT_NOW:
		case ERRCODE_DATABASE_DROPPED:
			return false;
		default:
			return true;
	}
}

/*
 * Apply the pending rollbacks of "scope"; undecided ones as their fallback
 * says: no error came for them.
 */
static void
pending_apply(PendingScope scope)
{
	int			i,
				kept = 0;

	for (i = 0; i < npending; i++)
	{
		PendingRollback *r = &pending[i];
		QueueSlot  *s;
		int			k;

		if (!r->decided &&
			(scope == PENDING_DECIDED ||
			 (scope == PENDING_EARLIER && r->xact == xact_count)))
		{
			pending[kept++] = *r;
			continue;
		}
		if (!(r->decided ? r->counts : r->fallback))
			continue;
		s = &QShared->slots[r->slot];
		LWLockAcquire(slot_lock(r->slot), LW_EXCLUSIVE);
		if (s->epoch == r->epoch && s->dboid == MyDatabaseId &&
			(k = queue_slot_find(r->slot, r->id)) >= 0)
			queue_count_rollback(s, slot_entry(r->slot, k));
		LWLockRelease(slot_lock(r->slot));
	}
	npending = kept;
}

/*
 * Settle the rollbacks still pending from earlier transactions of this
 * session (outbox.receive(), before it claims): no error came for them.
 */
void
queue_settle_rollbacks(void)
{
	if (npending > 0)
		pending_apply(PENDING_ALL);
}

/*
 * Acknowledge (commit) or release the claims from index "from" on.  A
 * release is a rollback of each message that was not poison handling.
 * Whether it counts toward outbox.max_receives: by the error reported
 * before this abort at this nesting level if there is one (a FATAL one
 * at any level), else it is pending until an error or the next statement
 * decides it (rollback_counts()).
 */
static void
claims_finish(int from, bool commit)
{
	int			i = from;
	bool		any = false;
	bool		decided = false;
	bool		counts = false;

	if (!commit && err_code != 0 &&
		(err_fatal || (!err_used && err_level == GetCurrentTransactionNestLevel())))
	{
		decided = true;
		counts = rollback_counts(err_code);
	}

	while (i < nclaims)
	{
		int			slot = claims[i].slot;
		QueueSlot  *s = &QShared->slots[slot];

		LWLockAcquire(slot_lock(slot), LW_EXCLUSIVE);
		for (; i < nclaims && claims[i].slot == slot; i++)
		{
			LocalClaim *c = &claims[i];
			int			k;
			QueueEntry *e;

			if (s->epoch != c->epoch || s->dboid != MyDatabaseId)
				continue;		/* the window was rebuilt meanwhile */
			k = queue_slot_find(slot, c->id);
			if (k < 0)
				continue;
			e = slot_entry(slot, k);
			if (e->state != QE_CLAIMED || e->owner != OUTBOX_MY_PROC_INDEX())
				continue;
			e->owner = -1;
			if (commit)
			{
				e->state = QE_ACKED;
				if (c->poison)
					s->dead_lettered++;
				else
					s->acknowledged++;
			}
			else
			{
				e->state = QE_FREE;
				if (!c->poison)
				{
					s->rolled_back++;
					if (decided)
					{
						if (counts)
							queue_count_rollback(s, e);
					}
					else
					{
						PendingRollback *r = &pending[npending++];

						r->slot = slot;
						r->epoch = c->epoch;
						r->id = c->id;
						r->xact = xact_count;
						r->decided = false;
						r->counts = false;
						/* Held when the transaction's last error came. */
						r->fallback = (err_code != 0 && c->seq < err_claimseq) ?
							rollback_counts(err_code) : true;
					}
				}
			}
			any = true;
		}
		if (commit)
			queue_slot_trim(slot);
		LWLockRelease(slot_lock(slot));
	}
	nclaims = from;
	if (!commit && decided && !err_fatal)
		err_used = true;
	if (any)
		outbox_queue_wake();
}

/* The transaction ended: forget its errors (not a FATAL one). */
static void
xact_errors_reset(void)
{
	if (err_fatal)
		return;
	err_code = 0;
	err_used = true;
	err_claimseq = 0;
}

static void
queue_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (nclaims > 0)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that received outbox messages"),
						 errdetail("The transaction holds %d message(s) from outbox.receive(); a prepared transaction would hold them, and their keys, with no session to finish it.", nclaims),
						 errhint("Receive outbox messages in transactions that commit directly.")));
			break;
		case XACT_EVENT_COMMIT:
			/* Rollbacks pending from earlier events had no error. */
			if (npending > 0)
				pending_apply(PENDING_ALL);
			if (nclaims > 0)
				claims_finish(0, true);
			xact_errors_reset();
			xact_count++;
			stmt_started = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:

			/*
			 * Not those of this transaction: its error may yet be thrown
			 * again (a failed COMMIT in a procedure).
			 */
			if (npending > 0)
				pending_apply(PENDING_EARLIER);
			if (nclaims > 0)
				claims_finish(0, false);
			xact_errors_reset();
			xact_count++;
			stmt_started = false;
			break;
		default:
			break;
	}
}

/*
 * A statement starts: the rollbacks still pending from earlier
 * transactions had no error thrown after them (an explicit ROLLBACK).
 */
static inline void
statement_start(void)
{
	if (npending > 0)
		pending_apply(PENDING_EARLIER);
	stmt_started = true;
}

static void
queue_post_parse_analyze(ParseState *pstate, Query *query, JumbleState *jstate)
{
	statement_start();
	if (prev_post_parse_analyze_hook)
		prev_post_parse_analyze_hook(pstate, query, jstate);
}

static void
queue_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	statement_start();
	if (prev_ExecutorStart_hook)
		prev_ExecutorStart_hook(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

static void
queue_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
					 bool readOnlyTree, ProcessUtilityContext context,
					 ParamListInfo params, QueryEnvironment *queryEnv,
					 DestReceiver *dest, QueryCompletion *qc)
{
	statement_start();
	if (prev_ProcessUtility_hook)
		prev_ProcessUtility_hook(pstmt, queryString, readOnlyTree, context,
								 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

static void
queue_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			i;

	if (npending > 0)
		pending_apply(PENDING_DECIDED);
	if (nclaims == 0)
	{
		/* An error reported at this level is used up by this abort. */
		if (event == SUBXACT_EVENT_ABORT_SUB && !err_fatal &&
			err_level == GetCurrentTransactionNestLevel())
			err_used = true;
		return;
	}
	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			{
				/*
				 * Claims of a subtransaction follow those of its parent:
				 * they are a suffix, since a parent cannot receive while a
				 * child is open.
				 */
				int			from = nclaims;

				while (from > 0 && claims[from - 1].subid == mySubid)
					from--;
				if (from < nclaims)
					claims_finish(from, false);
				if (!err_fatal && err_level == GetCurrentTransactionNestLevel())
					err_used = true;
			}
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (i = nclaims - 1; i >= 0 && claims[i].subid == mySubid; i--)
				claims[i].subid = parentSubid;
			break;
		default:
			break;
	}
}

/*
 * The backend ends.  This runs before ShutdownPostgres aborts an open
 * transaction, so claims may still be held: release them here, as that
 * abort would, and settle every pending rollback (by the FATAL error that
 * ends the session, if one was reported, else as counting).
 */
static void
queue_shmem_exit(int code, Datum arg)
{
	if (QShared == NULL)
		return;
	if (nclaims > 0)
		claims_finish(0, false);
	if (npending > 0)
		pending_apply(PENDING_ALL);
	queue_shmem_backend_exit();
}

void
outbox_queue_init(void)
{
	outbox_receivers_wake = outbox_queue_wake;
	RegisterXactCallback(queue_xact_callback, NULL);
	RegisterSubXactCallback(queue_subxact_callback, NULL);
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = queue_emit_log;
	prev_post_parse_analyze_hook = post_parse_analyze_hook;
	post_parse_analyze_hook = queue_post_parse_analyze;
	prev_ExecutorStart_hook = ExecutorStart_hook;
	ExecutorStart_hook = queue_ExecutorStart;
	prev_ProcessUtility_hook = ProcessUtility_hook;
	ProcessUtility_hook = queue_ProcessUtility;
}

void
outbox_queue_backend_init(void)
{
	static bool done = false;

	if (!done)
	{
		before_shmem_exit(queue_shmem_exit, (Datum) 0);
		done = true;
	}
}
