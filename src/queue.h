/*-------------------------------------------------------------------------
 *
 * queue.h
 *	  Queue targets: messages received by SQL clients inside their own
 *	  transactions (outbox.receive), the Transactional Client.  This header
 *	  declares what the queue files share; the rest of the extension sees
 *	  only outbox.h.
 *
 * A queue is a target of kind 'queue'.  Its messages are those of its
 * subscriptions, in id order, as for any target.  What is special is who
 * takes them and when they count as done: a receiving transaction claims
 * them in a window of shared memory, the receipt it writes acknowledges
 * them when it commits, and a rollback gives them back in their place.
 *
 * The queue files, one job each; each uses only files listed after it:
 *	  queue_receive.c	outbox.receive(): wait, choose, write the receipt,
 *						return the messages
 *	  queue_compact.c	the relay's folding of receipts into done_id
 *	  queue_stats.c		outbox.queue_stats(), for the view outbox.queues
 *	  queue_fill.c		filling a window up to the frontier, building it
 *						from the tables
 *	  queue_xact.c		the claims' end at commit and abort, which
 *						rollbacks count, the callbacks
 *	  queue_poison.c	poison messages and their dead letters
 *	  queue_config.c	queues as configured, and the slot each has
 *	  queue_shmem.c		slots and their windows, the locks, waiting
 * Module load (outbox.c) calls queue_shmem.c and queue_xact.c to set them
 * up; the relay calls queue_compact.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_QUEUE_H
#define OUTBOX_QUEUE_H

#include "postgres.h"

#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/lwlock.h"

#include "outbox.h"
#include "subscription.h"

/* Entry states */
#define QE_FREE		0
#define QE_CLAIMED	1
#define QE_ACKED	2

/* Most rows one fill reads from outbox.messages. */
#define QUEUE_FILL_ROWS		2048

/* One message of a window. */
typedef struct QueueEntry
{
	int64		id;				/* message id */
	uint64		keyhash;		/* hash of the key, if has_key */
	Oid			relid;			/* chunk table the message is stored in */
	TransactionId group;		/* xmin: the emitting transaction */
	int32		owner;			/* proc index of the claiming backend, -1 */
	uint32		receives;		/* times handed out */
	uint16		rollbacks;		/* rollbacks that counted (max_receives) */
	uint8		state;			/* QE_* */
	bool		has_key;
	bool		poisoned;		/* to be dead-lettered by the next receive */
} QueueEntry;

/* A queue's slot: its window, positions and counters. */
typedef struct QueueSlot
{
	Oid			dboid;			/* database, InvalidOid for a free slot */
	int			target_id;		/* outbox.targets.id */
	uint32		epoch;			/* bumped whenever the window is rebuilt */
	Oid			targets_relid;	/* outbox.targets of the extension it is of */
	bool		loaded;			/* window built from the tables */
	bool		filling;		/* a backend is reading into the window */
	int32		filler;			/* its proc index, -1 */
	bool		reload_wanted;	/* replayed: rebuild once nothing is held */
	uint64		config_generation;	/* configuration the window checked */
	int			generation;		/* outbox.progress.generation loaded */
	int64		done_id;		/* durable position (outbox.progress) */
	int64		read_id;		/* every id <= read_id was read */
	TransactionId open_group;	/* the newest entries' transaction may go on
								 * past read_id: InvalidTransactionId if not */
	int			head;			/* ring index of the oldest entry */
	int			count;			/* entries in the window */
	uint64		received;		/* messages handed out */
	uint64		acknowledged;	/* committed */
	uint64		rolled_back;	/* returned by a rollback */
	uint64		rolled_back_counted;	/* ... that counted (max_receives) */
	uint64		dead_lettered;	/* poisoned and dead-lettered */
} QueueSlot;

/* The queues' shared memory; the slots' entries follow the slots. */
typedef struct QueueShared
{
	int			nslots;
	int			window;
	LWLockPadded *locks;		/* [0] slot allocation, [i + 1] slot i */
	QueueSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} QueueShared;

/* What this backend knows of one queue, valid for one configuration. */
typedef struct QueueInfo
{
	char	   *name;
	int			target_id;
	bool		is_queue;
	bool		active;			/* state = 'active' */
	uint64		checked_grants; /* grants_invalidations when read */
	Oid		   *grant_roles;	/* roles granted the queue */
	int			ngrants;
	int			slot;			/* slot index, or -1 */
	int			nsubs;
	bool		filtered;		/* a subscription has a filter: rows are read
								 * with their headers and payload */
	OutboxSubscription *subs;
} QueueInfo;

/* What queue_spi_begin() changed, for queue_spi_end() to restore. */
typedef struct QueueSpiState
{
	Oid			save_userid;
	int			save_sec;
	int			nestlevel;
} QueueSpiState;

/* A message a receive claimed, to return or to dead-letter. */
typedef struct Taken
{
	int64		id;
	Oid			relid;
	uint32		receives;
	uint16		rollbacks;		/* that counted toward max_receives */
	bool		poison;
} Taken;

/*---- queue_shmem.c: the shared memory of the queues ----*/
extern QueueShared *QShared;
extern QueueEntry *QEntries;

/* The lock of slot i, guarding its fields and entries. */
static inline LWLock *
slot_lock(int i)
{
	return &QShared->locks[i + 1].lock;
}

/* Entry k of a slot's window, 0 being the oldest (under the slot lock). */
static inline QueueEntry *
slot_entry(int slot, int k)
{
	QueueSlot  *s = &QShared->slots[slot];

	return &QEntries[(Size) slot * QShared->window + (s->head + k) % QShared->window];
}

extern void outbox_queue_wake(void);
/*
 * Receivers wait on their database's condition variable, one per slot of
 * the database directory (shmem.c): a commit in one database wakes no
 * receiver of another.
 */
typedef struct QueueWait
{
	ConditionVariable cv;		/* messages may be available */
	pg_atomic_uint32 waiters;	/* receivers waiting on cv */
} QueueWait;

extern ConditionVariable *queue_wait_cv(void);
extern void queue_wait_announce(void);
extern void queue_wait_cancel(void);
extern void queue_shmem_backend_exit(void);
extern int	queue_slot_find(int slot, int64 id);
extern void queue_slot_trim(int slot);
extern int64 queue_slot_acked_upto(int slot);

/*---- queue_config.c: queues as configured, and their slots ----*/
extern void queue_spi_begin(QueueSpiState *st);
extern void queue_spi_end(QueueSpiState *st);
extern int	queue_spi_fresh(const char *sql, int nargs, Oid *types, Datum *values,
							const char *nulls, long limit);
extern QueueInfo *queue_info(const char *name);
extern void queue_check_allowed(QueueInfo *qi);
extern Oid	queue_receipts_relid(void);
extern Oid	queue_current_targets_relid(void);
extern bool queue_slot_is(int i, QueueInfo *qi);
extern int	queue_slot(QueueInfo *qi);

/*---- queue_poison.c: poison messages and their dead letters ----*/
extern void queue_count_rollback(QueueSlot *s, QueueEntry *e);
extern void queue_dead_letter(QueueInfo *qi, Taken *t);

/*---- queue_xact.c: the claims of this backend's transaction ----*/
extern void queue_claims_reserve(int more);
extern void queue_claim_add(int slot, uint32 epoch, int64 id,
							SubTransactionId subid, bool poison);
extern void queue_settle_rollbacks(void);
extern void outbox_queue_backend_init(void);

/*---- queue_fill.c: filling and building windows ----*/
extern bool queue_fill_guarded(QueueInfo *qi, int slot, int64 frontier,
							   bool load, uint64 gen, int want);

#endif							/* OUTBOX_QUEUE_H */
