/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  Shared state: the commit sequence, the in-flight slots and the frontier.
 *
 * Message ids are handed out at PRE_COMMIT, so they follow commit order
 * (invariant I2).  A committing backend reserves a contiguous block of ids
 * and publishes the first one in its in-flight slot; it clears the slot in
 * its COMMIT or ABORT callback, which runs after the transaction became
 * visible (or was rolled back) and before its locks are released.
 *
 * The frontier is the lowest published slot minus one, or the last id handed
 * out when no slot is published.  Every id at or below it belongs to a
 * transaction that is visible to any snapshot taken from now on, or that
 * aborted and left a gap (invariant I3).
 *
 * Locking protocol: OutboxShared->lock is taken exclusively to reserve ids
 * (read next_id, publish the slot, advance next_id) and to initialise the
 * counter; it is taken shared to compute the frontier.  A backend clears its
 * own slot without the lock: a single atomic write, and a reader that misses
 * it only computes a lower, still safe, frontier.
 *
 * The counter lives in shared memory only, but never runs ahead of a
 * durable mark (the sequence outbox.id_mark): before it hands out an id
 * above the mark, the reserving backend moves the mark OUTBOX_MARK_CHUNK ids
 * further with setval(), which is WAL-logged and not rolled back.  So one
 * WAL record per chunk, not a write per commit.  After every start the
 * counter is initialised lazily (storage.c) above the highest id in
 * outbox.messages, the high-water mark in outbox.state and the id mark, so a
 * crash can leave gaps but never make an id handed out before reappear,
 * even when the transaction that had it failed at COMMIT and VACUUM removed
 * its rows (invariant I6).  Whoever computes a frontier flushes WAL past the
 * latest mark write as well as past the latest commit, so no frontier
 * passes an id that a crash could hand out again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "postmaster/autovacuum.h"
#include "replication/walsender.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "access/twophase.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "utils/builtins.h"

#include "outbox.h"

typedef struct OutboxSharedState
{
	/* which database this slot serves: set under the directory's lock */
	pg_atomic_uint32 dboid;		/* the database, or InvalidOid when free */
	pg_atomic_uint32 generation;	/* bumped each time the slot is taken */
	int			index;			/* in the directory */
	LWLock	   *lock;			/* see the locking protocol above */
	bool		counter_valid;	/* next_id initialised since the last start */
	int64		next_id;		/* next id to hand out; at most
								 * PG_INT64_MAX, which is never handed out */
	int64		mark;			/* every id up to here is covered by the
								 * durable id mark */
	pg_atomic_uint64 mark_end;	/* end LSN of the latest write of the mark */
	Latch	   *worker_latch;	/* the relay worker's latch, or NULL */
	pid_t		relay_pid;		/* the running relay, or 0 */
	bool		worker_wants_commits;	/* the worker has targets to feed */
	pg_atomic_uint64 config_generation; /* bumped when targets change */
	pg_atomic_uint64 max_commit_end;	/* end LSN of the latest commit that
										 * stored messages */
	slock_t		status_mutex;	/* protects the status below */
	TimestampTz retention_checked_at;	/* last retention step, or 0 */
	char		retention_held[OUTBOX_STATUS_LEN];	/* what keeps messages, or "" */
	TimestampTz relay_started_at;	/* of the running relay, or 0 */
	char		relay_error[OUTBOX_STATUS_LEN]; /* the last relay's last error */
	char		launcher_note[OUTBOX_STATUS_LEN];	/* why no relay runs */
	TimestampTz hold_until;		/* start no relay before (DROP, RENAME) */
	TimestampTz taken_at;		/* when this database took the slot */
	TimestampTz looked_at;		/* a relay last found no extension */
	pg_atomic_uint32 current_chunk; /* chunk table committers write into,
									 * as the relay last published it; 0
									 * before it did */
	int			nslots;			/* entries in inflight[] */
	pg_atomic_uint64 inflight[FLEXIBLE_ARRAY_MEMBER];	/* first reserved id of
														 * each backend, by
														 * PGPROC index; 0 =
														 * none */
} OutboxSharedState;

/*
 * The directory: outbox.max_databases slots, one per database that has the
 * extension, taken by the first backend of that database that needs it
 * (CREATE EXTENSION, the relay, the first emit after a start) and given
 * back when the database is gone or its extension was dropped.  Its lock is
 * taken only to find or give back a slot: a backend remembers its slot, so
 * the commit path takes only its own database's lock, never a shared one.
 */
typedef struct OutboxDirectory
{
	LWLock	   *lock;			/* assigns slots */
	Latch	   *launcher_latch; /* the launcher's, or NULL */
	int			ndbs;			/* slots */
	Size		slot_size;		/* bytes of one, MAXALIGNed */
	char		slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxDirectory;

static OutboxDirectory *OutboxDir = NULL;

/* This backend's database's slot, or NULL; see outbox_db_attach(). */
static OutboxSharedState *OutboxShared = NULL;
static uint32 attached_generation = 0;

/* This backend took a slot the launcher has not been told of yet. */
static bool slot_taken = false;

/* Whether this backend has published its slot and must clear it. */
static bool slot_published = false;

/*
 * Number of PGPROC entries, so any backend or background worker can index
 * its slot by its PGPROC number.
 */
static int
outbox_slot_count(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

static Size
outbox_db_slot_size(void)
{
	return MAXALIGN(add_size(offsetof(OutboxSharedState, inflight),
							 mul_size(outbox_slot_count(), sizeof(pg_atomic_uint64))));
}

static Size
outbox_shmem_size(void)
{
	return add_size(offsetof(OutboxDirectory, slots),
					mul_size(outbox_max_databases, outbox_db_slot_size()));
}

static inline OutboxSharedState *
outbox_db_slot(int i)
{
	return (OutboxSharedState *) (OutboxDir->slots + i * OutboxDir->slot_size);
}

/* Called from the shmem request hook (outbox.c). */
void
outbox_shmem_request(void)
{
	RequestAddinShmemSpace(outbox_shmem_size());
	RequestNamedLWLockTranche("outbox", 1 + outbox_max_databases);
}

/* Called from the shmem startup hook (outbox.c), under AddinShmemInitLock. */
void
outbox_shmem_init(void)
{
	bool		found;

	OutboxDir = ShmemInitStruct("outbox", outbox_shmem_size(), &found);
	if (!found)
	{
		LWLockPadded *locks = GetNamedLWLockTranche("outbox");
		int			i;

		OutboxDir->lock = &locks[0].lock;
		OutboxDir->launcher_latch = NULL;
		OutboxDir->ndbs = outbox_max_databases;
		OutboxDir->slot_size = outbox_db_slot_size();
		for (i = 0; i < OutboxDir->ndbs; i++)
		{
			OutboxSharedState *s = outbox_db_slot(i);
			int			j;

			memset(s, 0, offsetof(OutboxSharedState, inflight));
			pg_atomic_init_u32(&s->dboid, InvalidOid);
			pg_atomic_init_u32(&s->generation, 0);
			s->index = i;
			s->lock = &locks[1 + i].lock;
			pg_atomic_init_u64(&s->mark_end, 0);
			pg_atomic_init_u64(&s->config_generation, 0);
			pg_atomic_init_u64(&s->max_commit_end, 0);
			pg_atomic_init_u32(&s->current_chunk, 0);
			SpinLockInit(&s->status_mutex);
			s->nslots = outbox_slot_count();
			for (j = 0; j < s->nslots; j++)
				pg_atomic_init_u64(&s->inflight[j], 0);
		}
	}
}

/*
 * Make a free slot serve dboid.  Caller holds the directory's lock
 * exclusively.  Every field starts afresh: the counter is initialised from
 * the database's own tables (I6 per database).
 */
/*
 * The end of the WAL inserted so far.  GetXLogInsertRecPtr() gives where
 * the next record starts: past the page header when the last one ended on
 * a page boundary, and a flush request for that position fails ("xlog
 * flush request is not satisfied", seen after a crash restart) until
 * something else is written on the new page.
 */
static XLogRecPtr
outbox_wal_inserted_end(void)
{
	XLogRecPtr	next = GetXLogInsertRecPtr();

	if (XLogSegmentOffset(next, wal_segment_size) == SizeOfXLogLongPHD)
		return next - SizeOfXLogLongPHD;
	if (next % XLOG_BLCKSZ == SizeOfXLogShortPHD)
		return next - SizeOfXLogShortPHD;
	return next;
}

static void
outbox_db_slot_take(OutboxSharedState *s, Oid dboid)
{
	XLogRecPtr	now_lsn = RecoveryInProgress() ? InvalidXLogRecPtr : outbox_wal_inserted_end();

	LWLockAcquire(s->lock, LW_EXCLUSIVE);
	s->counter_valid = false;
	s->next_id = 1;
	s->mark = 0;

	/*
	 * Commits of this database before the slot was taken (it may have had
	 * another, given back meanwhile) are flushed by a frontier too (I7):
	 * nothing before the current end of WAL is known to be durable.
	 */
	pg_atomic_write_u64(&s->mark_end, now_lsn);
	s->worker_latch = NULL;
	s->relay_pid = 0;
	s->worker_wants_commits = false;
	pg_atomic_write_u64(&s->max_commit_end, now_lsn);
	s->taken_at = GetCurrentTimestamp();
	pg_atomic_write_u32(&s->current_chunk, 0);
	SpinLockAcquire(&s->status_mutex);
	s->retention_checked_at = 0;
	s->retention_held[0] = '\0';
	s->relay_started_at = 0;
	s->relay_error[0] = '\0';
	s->launcher_note[0] = '\0';
	s->hold_until = 0;
	s->looked_at = 0;
	SpinLockRelease(&s->status_mutex);
	pg_atomic_fetch_add_u32(&s->generation, 1);
	pg_write_barrier();
	pg_atomic_write_u32(&s->dboid, dboid);
	LWLockRelease(s->lock);
}

/* The slot serving dboid, or NULL.  Caller holds the directory's lock. */
static OutboxSharedState *
outbox_db_find(Oid dboid)
{
	int			i;

	for (i = 0; i < OutboxDir->ndbs; i++)
		if (pg_atomic_read_u32(&outbox_db_slot(i)->dboid) == dboid)
			return outbox_db_slot(i);
	return NULL;
}

/* Whether OutboxShared is this database's slot, as it was when attached. */
static inline bool
outbox_db_attached(void)
{
	return OutboxShared != NULL &&
		pg_atomic_read_u32(&OutboxShared->dboid) == MyDatabaseId &&
		pg_atomic_read_u32(&OutboxShared->generation) == attached_generation;
}

/*
 * Find, or with create take, the slot of this backend's database; returns
 * whether it is attached.  The launcher hears of a new slot at the end of
 * the transaction.  With report, running out of slots is an ERROR.
 */
static bool
outbox_db_attach_internal(bool create, bool report)
{
	OutboxSharedState *s;
	bool		taken = false;

	if (outbox_db_attached())
		return true;
	if (OutboxDir == NULL || !OidIsValid(MyDatabaseId))
		return false;
	/* Usually the slot exists: look under a shared lock first. */
	LWLockAcquire(OutboxDir->lock, LW_SHARED);
	s = outbox_db_find(MyDatabaseId);
	if (s == NULL && create)
	{
		LWLockRelease(OutboxDir->lock);
		LWLockAcquire(OutboxDir->lock, LW_EXCLUSIVE);
		s = outbox_db_find(MyDatabaseId);
	}
	if (s == NULL && create)
	{
		s = outbox_db_find(InvalidOid);
		if (s != NULL)
		{
			outbox_db_slot_take(s, MyDatabaseId);
			taken = true;
		}
	}
	if (s != NULL)
	{
		OutboxShared = s;
		attached_generation = pg_atomic_read_u32(&s->generation);
	}
	LWLockRelease(OutboxDir->lock);

	/*
	 * The launcher learns of a new slot when the transaction ends (see
	 * outbox_db_wake_if_taken), not now: a relay it started at once could
	 * find the extension not yet committed and give the slot back.
	 */
	if (taken)
		slot_taken = true;
	if (s == NULL && create && report)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("outbox cannot serve database \"%s\": all %d outbox database slots are in use",
						IsTransactionState() ? get_database_name(MyDatabaseId) :
						psprintf("%u", MyDatabaseId), OutboxDir->ndbs),
				 errdetail("Each database with the outbox extension takes one slot of shared memory, and outbox.max_databases is %d.",
						   OutboxDir->ndbs),
				 errhint("Raise outbox.max_databases and restart the server, or drop the extension in a database that no longer uses it.")));
	return s != NULL;
}

/*
 * The slot of this backend's database, taken if needed: ERROR when every
 * slot serves another database.
 */
void
outbox_db_attach(void)
{
	(void) outbox_db_attach_internal(true, true);
}

/* The same without an ERROR (commit callbacks): whether attached. */
bool
outbox_db_attach_noerror(void)
{
	return outbox_db_attach_internal(true, false);
}

/* Whether this database has a slot, without taking one. */
bool
outbox_db_lookup(void)
{
	return outbox_db_attach_internal(false, false);
}

/* Index of this database's slot if attached now, else -1 (no ERROR). */
int
outbox_db_attached_index(void)
{
	return outbox_db_attached() ? OutboxShared->index : -1;
}

/* Index of this database's slot (attached), for per-database state. */
int
outbox_db_index(void)
{
	return OutboxShared->index;
}

/* Ensure attachment or ERROR: the entry of the functions below. */
#define DB_ATTACH()		do { if (!outbox_db_attached()) outbox_db_attach(); } while (0)

/*
 * Take the lock of this database's slot, checked under the lock: a slot
 * given back and taken by another database since we attached is left, and
 * the database's slot of now taken instead.
 */
static void
outbox_db_lock(LWLockMode mode)
{
	for (;;)
	{
		DB_ATTACH();
		LWLockAcquire(OutboxShared->lock, mode);
		if (outbox_db_attached())
			return;
		LWLockRelease(OutboxShared->lock);
	}
}

/* The generation of this database's slot (taken if need be). */
uint32
outbox_db_generation(void)
{
	DB_ATTACH();
	return attached_generation;
}

/*
 * A transaction that took its database's slot aborted (a CREATE EXTENSION
 * that failed, say): give the slot back, unless a relay took it over.
 */
void
outbox_db_abort_taken(void)
{
	if (!slot_taken)
		return;
	slot_taken = false;
	if (outbox_db_attached())
		(void) outbox_db_release(MyDatabaseId, 0);
}

/*
 * DROP EXTENSION committed: tell the database's relay, without taking a
 * slot (a database without one has no relay to tell).  No ERROR.
 */
void
outbox_db_tell_relay(void)
{
	if (OutboxDir == NULL || !outbox_db_lookup())
		return;
	pg_atomic_fetch_add_u64(&OutboxShared->config_generation, 1);
	outbox_wake_worker(false);
}

/* A relay found no extension in this database (the launcher's view). */
void
outbox_db_note_looked(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (!outbox_db_lookup())
		return;
	SpinLockAcquire(&OutboxShared->status_mutex);
	OutboxShared->looked_at = now;
	SpinLockRelease(&OutboxShared->status_mutex);
}

/*
 * At the end of a transaction: tell the launcher of a slot this backend
 * took, so that it starts the database's relay.
 */
static void
outbox_db_wake_if_taken(void)
{
	if (slot_taken)
	{
		slot_taken = false;
		outbox_wake_launcher();
	}
}

/*
 * Give back the slot of dboid unless a relay runs in it or a committer has
 * ids in flight: the database is gone (the launcher) or has no extension
 * any more (its relay).  Returns whether the database has no slot now.
 */
bool
outbox_db_release(Oid dboid, int min_age_ms)
{
	OutboxSharedState *s;
	bool		released = true;
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(OutboxDir->lock, LW_EXCLUSIVE);
	s = outbox_db_find(dboid);
	if (s != NULL)
	{
		int			i;

		LWLockAcquire(s->lock, LW_EXCLUSIVE);
		if (s->relay_pid != 0 && s->relay_pid != MyProcPid &&
			kill(s->relay_pid, 0) == 0)
			released = false;
		for (i = 0; released && i < s->nslots; i++)
			if (pg_atomic_read_u64(&s->inflight[i]) != 0)
				released = false;
		/* a slot just taken may be a CREATE EXTENSION still running */
		if (min_age_ms > 0 &&
			!TimestampDifferenceExceeds(s->taken_at, now, min_age_ms))
			released = false;
		if (released)
		{
			s->relay_pid = 0;
			s->worker_latch = NULL;
			s->worker_wants_commits = false;
			pg_atomic_write_u32(&s->dboid, InvalidOid);
		}
		LWLockRelease(s->lock);
	}
	LWLockRelease(OutboxDir->lock);
	return released;
}

/* The launcher publishes its latch: new slots and held relays wake it. */
void
outbox_set_launcher_latch(Latch *latch)
{
	OutboxDir->launcher_latch = latch;
	pg_memory_barrier();
}

void
outbox_wake_launcher(void)
{
	Latch	   *latch = OutboxDir ? OutboxDir->launcher_latch : NULL;

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Clear our slot if a backend exits between PRE_COMMIT and the end of its
 * transaction without passing through the abort path.
 */
static void
outbox_shmem_exit(int code, Datum arg)
{
	if (outbox_release_slot(InvalidXLogRecPtr))
		outbox_wake_worker(true);
}

/* True when the shared state exists (the library was preloaded). */
bool
outbox_shmem_ready(void)
{
	return OutboxDir != NULL;
}

/*
 * Whether the counter was initialised since the last start.  Once true it
 * stays true until shared memory is reinitialised, which ends every backend,
 * so a backend that saw it true need not take the lock again.
 */
bool
outbox_counter_valid(void)
{
	static OutboxSharedState *seen_slot = NULL;
	static uint32 seen_generation = 0;

	DB_ATTACH();
	if (seen_slot != OutboxShared || seen_generation != attached_generation)
	{
		bool		valid;

		LWLockAcquire(OutboxShared->lock, LW_SHARED);
		valid = OutboxShared->counter_valid;
		LWLockRelease(OutboxShared->lock);
		if (!valid)
			return false;
		seen_slot = OutboxShared;
		seen_generation = attached_generation;
	}
	return true;
}

/*
 * Initialise the counter to follow highest_used, unless another backend did
 * so first.  highest_used was read while the counter was invalid, so no id
 * has been handed out since and the value cannot be stale.
 */
bool
outbox_counter_initialize(int64 highest_used, uint32 generation)
{
	bool		valid;

	outbox_db_lock(LW_EXCLUSIVE);
	/*
	 * highest_used was read for the slot of that generation; a slot taken
	 * since (ours given back meanwhile) is initialised from a new reading.
	 */
	if (attached_generation != generation)
	{
		LWLockRelease(OutboxShared->lock);
		return false;
	}
	if (!OutboxShared->counter_valid)
	{
		highest_used = Min(Max(highest_used, 0), PG_INT64_MAX - 1);
		OutboxShared->next_id = highest_used + 1;
		/* Nothing above highest_used is known to be covered. */
		OutboxShared->mark = highest_used;
		OutboxShared->counter_valid = true;
	}
	valid = OutboxShared->counter_valid;
	LWLockRelease(OutboxShared->lock);
	return valid;
}

/*
 * Whether reserving count ids would probably pass the durable mark, so the
 * caller should lock the mark's sequence before reserving (a lock wait
 * must not happen under our LWLock).  Read without the lock: a wrong guess
 * only costs a retry in outbox_reserve_ids().
 */
bool
outbox_mark_needed(int64 count)
{
	DB_ATTACH();
	return !OutboxShared->counter_valid ||
		OutboxShared->next_id > OutboxShared->mark - count;
}

/*
 * Refuse to go on when the commit sequence has run out of ids: a bigint
 * never wraps around.  Also called by outbox_emit(), so that the failure
 * normally comes at the call rather than at COMMIT.
 */
void
outbox_check_ids_left(int64 count)
{
	int64		next;

	DB_ATTACH();
	next = OutboxShared->next_id;

	if (OutboxShared->counter_valid && next > PG_INT64_MAX - count)
		ereport(ERROR,
				(errcode(ERRCODE_SEQUENCE_GENERATOR_LIMIT_EXCEEDED),
				 errmsg("outbox message ids are exhausted"),
				 errdetail("The next id would be " INT64_FORMAT "; ids are bigint and never wrap around.",
						   next),
				 errhint("A message with an id near the bigint maximum was stored in outbox.messages, for example by a restore of foreign data.  Restore the outbox from a dump of this database instead.")));
}

/*
 * Move the durable mark to value: setval() on its sequence, as the
 * sequence's owner (the emitting role has no right to it).  Returns the end
 * of the WAL record.  Caller holds the lock and a lock on the sequence.
 */
static XLogRecPtr
outbox_mark_write(const OutboxMarkRel *markrel, int64 value)
{
	Oid			save_userid;
	int			save_sec;

	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(markrel->owner,
						   save_sec | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	DirectFunctionCall2(setval_oid, ObjectIdGetDatum(markrel->relid),
						Int64GetDatum(value));
	SetUserIdAndSecContext(save_userid, save_sec);
	return XactLastRecEnd;
}

/*
 * Reserve count contiguous ids and publish the first in our slot.  The
 * caller must clear it with outbox_release_slot() at the end of the
 * transaction.  Ids past the durable mark are covered first: markrel names
 * its sequence (InvalidOid with a 0.1 schema, which has none), checked and
 * locked by the caller when mark_locked.  When the mark must move and it is
 * not, nothing is reserved and 0 is returned (ids start at 1): the caller
 * checks and locks the sequence, which must not wait under our LWLock, and
 * calls again.  Precondition: the counter is valid.
 */
int64
outbox_reserve_ids(int64 count, const OutboxMarkRel *markrel, bool mark_locked)
{
	int			me = OUTBOX_MY_PROC_INDEX();
	int64		first;
	static bool exit_hook_registered = false;

	Assert(count > 0);
	if (me < 0 || me >= OutboxShared->nslots)
		elog(ERROR, "outbox: process index %d outside the %d in-flight slots",
			 me, OutboxShared->nslots);

	if (!exit_hook_registered)
	{
		before_shmem_exit(outbox_shmem_exit, (Datum) 0);
		exit_hook_registered = true;
	}

	DB_ATTACH();
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	/* the slot is given back only without committers in it: never now */
	if (pg_atomic_read_u32(&OutboxShared->dboid) != MyDatabaseId ||
		pg_atomic_read_u32(&OutboxShared->generation) != attached_generation)
		elog(ERROR, "outbox: the commit sequence of this database was given back while in use");
	if (!OutboxShared->counter_valid)
		elog(ERROR, "outbox: commit sequence used before initialisation");
	outbox_check_ids_left(count);
	first = OutboxShared->next_id;

	if (first - 1 > OutboxShared->mark - count)
	{
		int64		last = first + count - 1;
		int64		mark;

		if (!mark_locked)
		{
			LWLockRelease(OutboxShared->lock);
			return 0;
		}
		mark = (last > PG_INT64_MAX - OUTBOX_MARK_CHUNK) ?
			PG_INT64_MAX : last + OUTBOX_MARK_CHUNK;

		/*
		 * Without the sequence (a 0.1 schema) nothing is covered, and the
		 * next reservation looks for it again: it appears with ALTER
		 * EXTENSION UPDATE.
		 */
		if (OidIsValid(markrel->relid))
		{
			pg_atomic_write_u64(&OutboxShared->mark_end,
								outbox_mark_write(markrel, mark));
			OutboxShared->mark = mark;
		}
	}

	OutboxShared->next_id += count;
	pg_atomic_write_u64(&OutboxShared->inflight[me], (uint64) first);
	slot_published = true;
	LWLockRelease(OutboxShared->lock);
	return first;
}

/*
 * Clear our slot.  Called at COMMIT (after the transaction became visible),
 * at ABORT, and at backend exit.  commit_end is the end of our commit record
 * (InvalidXLogRecPtr when the transaction did not commit): it is published
 * before the slot is cleared, so whoever computes a frontier that covers
 * this transaction and then reads outbox_commit_lsn() can flush WAL far
 * enough to make it durable.  Returns whether a slot was cleared.
 */
bool
outbox_release_slot(XLogRecPtr commit_end)
{
	if (!slot_published || OutboxShared == NULL)
		return false;
	if (commit_end != InvalidXLogRecPtr)
	{
		uint64		cur = pg_atomic_read_u64(&OutboxShared->max_commit_end);

		while (cur < commit_end &&
			   !pg_atomic_compare_exchange_u64(&OutboxShared->max_commit_end,
											   &cur, commit_end))
			;
	}
	pg_memory_barrier();
	pg_atomic_write_u64(&OutboxShared->inflight[OUTBOX_MY_PROC_INDEX()], 0);
	slot_published = false;
	return true;
}

/*
 * The highest id such that no message with an id at or below it can still
 * become visible.  Precondition: the counter is valid.
 *
 * A caller that reads messages up to the frontier must take its snapshot
 * after this returns.
 */
int64
outbox_compute_frontier(void)
{
	int64		lowest;
	int			i;

	DB_ATTACH();
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	lowest = OutboxShared->next_id;
	for (i = 0; i < OutboxShared->nslots; i++)
	{
		int64		v = (int64) pg_atomic_read_u64(&OutboxShared->inflight[i]);

		if (v != 0 && v < lowest)
			lowest = v;
	}
	LWLockRelease(OutboxShared->lock);

	return lowest - 1;
}

/*
 * Wake the relay worker, if one is running.  For a commit, only when it has
 * targets: a worker with nothing to deliver need not be woken.
 */
void
outbox_wake_worker(bool for_commit)
{
	Latch	   *latch;

	outbox_db_wake_if_taken();
	if (!outbox_db_attached())
		return;
	if (for_commit && !OutboxShared->worker_wants_commits)
		return;
	latch = OutboxShared->worker_latch;
	if (latch != NULL)
		SetLatch(latch);
}

/* The relay worker says whether commits should wake it. */
void
outbox_set_worker_wants_commits(bool wants)
{
	DB_ATTACH();
	OutboxShared->worker_wants_commits = wants;
	pg_memory_barrier();
}

/*
 * Become the relay: false when another relay process is alive (a launcher
 * restarted after an error does not know the relay its predecessor
 * started).  On success our latch is published for committers to set.
 */
bool
outbox_relay_claim(void)
{
	bool		claimed = false;

	outbox_db_lock(LW_EXCLUSIVE);
	if (OutboxShared->relay_pid == 0 || OutboxShared->relay_pid == MyProcPid ||
		kill(OutboxShared->relay_pid, 0) != 0)
	{
		OutboxShared->relay_pid = MyProcPid;
		OutboxShared->worker_latch = MyLatch;
		claimed = true;
	}
	LWLockRelease(OutboxShared->lock);
	if (claimed)
	{
		TimestampTz now = GetCurrentTimestamp();

		SpinLockAcquire(&OutboxShared->status_mutex);
		OutboxShared->relay_started_at = now;
		OutboxShared->launcher_note[0] = '\0';
		SpinLockRelease(&OutboxShared->status_mutex);
		/* the launcher starts the capture worker once a relay runs */
		slot_taken = false;
		outbox_wake_launcher();
	}
	return claimed;
}

/* The relay exits: withdraw its latch and its claim, if they are ours. */
void
outbox_relay_release(void)
{
	if (!outbox_db_attached())
		return;
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (OutboxShared->relay_pid == MyProcPid)
	{
		OutboxShared->relay_pid = 0;
		OutboxShared->worker_latch = NULL;
		OutboxShared->worker_wants_commits = false;
	}
	LWLockRelease(OutboxShared->lock);
}

/* The pid of a live relay, or 0. */
pid_t
outbox_relay_running(void)
{
	pid_t		pid;

	if (!outbox_db_lookup())
		return 0;
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	pid = OutboxShared->relay_pid;
	LWLockRelease(OutboxShared->lock);
	if (pid != 0 && kill(pid, 0) != 0)
		pid = 0;
	return pid;
}

/* Publish (or, with NULL, withdraw) the relay worker's latch. */
void
outbox_set_worker_latch(Latch *latch)
{
	outbox_db_lock(LW_EXCLUSIVE);
	OutboxShared->worker_latch = latch;
	LWLockRelease(OutboxShared->lock);
}

/* Generation of the target configuration; changes when it was edited. */
uint64
outbox_config_generation(void)
{
	DB_ATTACH();
	return pg_atomic_read_u64(&OutboxShared->config_generation);
}

/*
 * Called when a transaction that changed targets commits: before it became
 * visible (wake = false) and after (wake = true, waking the relay).
 */
void
outbox_bump_config_generation(bool wake)
{
	if (OutboxDir == NULL)
		return;

	/*
	 * A database the relays do not serve takes no slot, and none is taken
	 * here with an ERROR: a DROP EXTENSION must not fail for want of one.
	 * (outbox.config_changed(), which CREATE EXTENSION and the target
	 * functions call, takes it with an ERROR when none is free.)  After the
	 * commit a slot is taken again in case the relay gave it back
	 * meanwhile (a DROP EXTENSION just before).
	 */
	if (!outbox_db_attached())
	{
		if (!wake ? !outbox_this_database_served() :
			!outbox_this_database_served_known())
			return;
		if (!outbox_db_attach_noerror())
			return;
	}
	pg_atomic_fetch_add_u64(&OutboxShared->config_generation, 1);
	if (wake)
	{
		outbox_wake_worker(false);
		/* CREATE EXTENSION: the launcher starts the relay */
		outbox_wake_launcher();
		slot_taken = false;
	}
}

/*
 * Flush WAL far enough that every commit covered by a frontier computed
 * before this call is durable (invariant I7).  Cheap when nothing is left
 * to flush, as with synchronous_commit = on.
 */
XLogRecPtr
outbox_flush_commits(void)
{
	XLogRecPtr	upto = outbox_newest_commit_end();

	if (upto != InvalidXLogRecPtr && !RecoveryInProgress())
		XLogFlush(upto);
	return upto;
}

/*
 * The end of the newest commit that handed out ids in this database (of
 * the id mark too: ids up to the frontier may include a failed
 * transaction's gap), or InvalidXLogRecPtr when the database has no slot.
 * Every commit a frontier computed before this call covers ends at or
 * below it.
 */
XLogRecPtr
outbox_newest_commit_end(void)
{
	XLogRecPtr	upto;
	XLogRecPtr	mark_end;

	if (!outbox_db_attached() && !outbox_db_lookup())
		return InvalidXLogRecPtr;
	upto = pg_atomic_read_u64(&OutboxShared->max_commit_end);
	mark_end = pg_atomic_read_u64(&OutboxShared->mark_end);
	return Max(upto, mark_end);
}

/*
 * Rows were inserted into outbox.messages directly (a restore): make sure
 * the sequence continues above them.  When the counter is not initialised
 * yet, its initialisation will find them.
 */
void
outbox_counter_advance(int64 highest_used)
{
	highest_used = Min(highest_used, PG_INT64_MAX - 1);
	outbox_db_lock(LW_EXCLUSIVE);
	if (OutboxShared->counter_valid && OutboxShared->next_id <= highest_used)
		OutboxShared->next_id = highest_used + 1;
	LWLockRelease(OutboxShared->lock);
}

/*
 * The chunk table committers write into (outbox.chunks.is_current), as the
 * relay last published it, or 0 when it has not since the start.  Any chunk
 * is correct to write into: a chunk is emptied only when every message in
 * it is finished, checked under a lock that committers writing into it
 * hold.  Writing into the current one keeps the others emptiable.
 */
int
outbox_current_chunk(void)
{
	DB_ATTACH();
	return (int) pg_atomic_read_u32(&OutboxShared->current_chunk);
}

void
outbox_set_current_chunk(int chunk)
{
	DB_ATTACH();
	pg_atomic_write_u32(&OutboxShared->current_chunk, (uint32) chunk);
}

/* What the last retention step found keeping messages (NULL: nothing). */
void
outbox_set_retention_status(const char *held, TimestampTz at)
{
	DB_ATTACH();
	SpinLockAcquire(&OutboxShared->status_mutex);
	OutboxShared->retention_checked_at = at;
	strlcpy(OutboxShared->retention_held, held ? held : "", OUTBOX_STATUS_LEN);
	SpinLockRelease(&OutboxShared->status_mutex);
}

/* Copy of the above into held (OUTBOX_STATUS_LEN bytes); returns its time. */
TimestampTz
outbox_get_retention_status(char *held)
{
	TimestampTz at;

	DB_ATTACH();
	SpinLockAcquire(&OutboxShared->status_mutex);
	at = OutboxShared->retention_checked_at;
	memcpy(held, OutboxShared->retention_held, OUTBOX_STATUS_LEN);
	SpinLockRelease(&OutboxShared->status_mutex);
	return at;
}

/*
 * The committer holding the frontier back: the backend whose published
 * first id is the lowest, and that id; *pid = 0 when none is in flight.
 */
void
outbox_oldest_in_flight(int *pid, int64 *first_id)
{
	int			i;
	int			best = -1;
	uint64		lowest = 0;

	DB_ATTACH();
	for (i = 0; i < OutboxShared->nslots; i++)
	{
		uint64		v = pg_atomic_read_u64(&OutboxShared->inflight[i]);

		if (v != 0 && (best < 0 || v < lowest))
		{
			best = i;
			lowest = v;
		}
	}
	*pid = 0;
	*first_id = 0;
	if (best >= 0 && best < (int) ProcGlobal->allProcCount)
	{
		*pid = ProcGlobal->allProcs[best].pid;
		*first_id = (int64) lowest;
	}
}

/* Set the current chunk unless the relay has published one already. */
void
outbox_set_current_chunk_if_unset(int chunk)
{
	uint32		expected = 0;

	DB_ATTACH();
	(void) pg_atomic_compare_exchange_u32(&OutboxShared->current_chunk, &expected,
										  (uint32) chunk);
}

/*---- the directory as the launcher and outbox.relays see it ----*/

/* Number of slots (outbox.max_databases), 0 without shared memory. */
int
outbox_db_slots(void)
{
	return OutboxDir != NULL ? OutboxDir->ndbs : 0;
}

static void
outbox_db_copy(OutboxSharedState *s, OutboxDbInfo *info)
{
	info->index = s->index;
	LWLockAcquire(s->lock, LW_SHARED);
	info->relay_pid = s->relay_pid;
	LWLockRelease(s->lock);
	SpinLockAcquire(&s->status_mutex);
	info->started_at = s->relay_started_at;
	info->hold_until = s->hold_until;
	info->looked_at = s->looked_at;
	memcpy(info->error, s->relay_error, OUTBOX_STATUS_LEN);
	memcpy(info->note, s->launcher_note, OUTBOX_STATUS_LEN);
	SpinLockRelease(&s->status_mutex);
	info->config_generation = pg_atomic_read_u64(&s->config_generation);
	if (info->relay_pid != 0 && kill(info->relay_pid, 0) != 0)
		info->relay_pid = 0;
}

/* Slot i: false when it serves no database. */
bool
outbox_db_info(int i, OutboxDbInfo *info)
{
	OutboxSharedState *s = outbox_db_slot(i);

	info->dboid = pg_atomic_read_u32(&s->dboid);
	if (!OidIsValid(info->dboid))
		return false;
	outbox_db_copy(s, info);
	return true;
}

/* The slot of dboid: false when it has none. */
bool
outbox_db_info_of(Oid dboid, OutboxDbInfo *info)
{
	OutboxSharedState *s;

	if (OutboxDir == NULL)
		return false;
	LWLockAcquire(OutboxDir->lock, LW_SHARED);
	s = outbox_db_find(dboid);
	if (s != NULL)
	{
		info->dboid = dboid;
		outbox_db_copy(s, info);
	}
	LWLockRelease(OutboxDir->lock);
	return s != NULL;
}

/* The launcher says why the relay of dboid does not run ("" when it does). */
void
outbox_db_set_note(Oid dboid, const char *note)
{
	OutboxSharedState *s;

	LWLockAcquire(OutboxDir->lock, LW_SHARED);
	s = outbox_db_find(dboid);
	if (s != NULL)
	{
		SpinLockAcquire(&s->status_mutex);
		strlcpy(s->launcher_note, note, OUTBOX_STATUS_LEN);
		SpinLockRelease(&s->status_mutex);
	}
	LWLockRelease(OutboxDir->lock);
}

/* The relay records the error it stops with. */
void
outbox_relay_set_error(const char *message)
{
	if (!outbox_db_attached())
		return;
	SpinLockAcquire(&OutboxShared->status_mutex);
	strlcpy(OutboxShared->relay_error, message, OUTBOX_STATUS_LEN);
	SpinLockRelease(&OutboxShared->status_mutex);
}

/*
 * Start no relay for dboid before until (0: from now on again), because
 * DROP DATABASE, RENAME or a copy waits for the database's sessions to end.
 */
void
outbox_db_hold(Oid dboid, TimestampTz until)
{
	OutboxSharedState *s;

	if (OutboxDir == NULL)
		return;
	LWLockAcquire(OutboxDir->lock, LW_SHARED);
	s = outbox_db_find(dboid);
	if (s != NULL)
	{
		SpinLockAcquire(&s->status_mutex);
		s->hold_until = until;
		SpinLockRelease(&s->status_mutex);
	}
	LWLockRelease(OutboxDir->lock);
	outbox_wake_launcher();
}
