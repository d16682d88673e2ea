/*-------------------------------------------------------------------------
 *
 * relay_dead_letters.c
 *	  Dead letters waiting to be written, and dead letters delivered again
 *	  waiting to be removed.
 *
 * A lane that gives up on a message (relay_lane.c) and a read that cannot
 * build one (relay_read.c) queue a dead letter here, in the relay's memory;
 * a lane that delivers a dead letter again (outbox.retry_dead_letters)
 * notes it here too.  relay_progress.c writes both with the next progress
 * update, in the same transaction, and only once that committed are they
 * forgotten (relay_dead_letters_written), so a crash can only make the
 * relay find them again (I5).  A read that rolls back takes back the dead
 * letters it queued (relay_dead_letters_mark/discard).  This file only
 * keeps the lists: it runs no SQL and calls no other relay file but the
 * shared state of relay_config.c, so the lanes, which use it, do not
 * depend on relay_progress.c, which uses them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "nodes/pg_list.h"
#include "utils/memutils.h"

#include "relay.h"

static RelayDeadLetter *dead_letters = NULL;	/* not yet written, newest
												 * first */
static List *retried_done = NIL;	/* RelayRetried *, in relay_cxt */

/* The newest dead letter not yet written, to take back later ones with. */
void *
relay_dead_letters_mark(void)
{
	return dead_letters;
}

/* Forget the newest queued dead letters, down to (not including) mark. */
void
relay_dead_letters_discard(void *mark)
{
	while (dead_letters != NULL && (void *) dead_letters != mark)
	{
		RelayDeadLetter *d = dead_letters;

		dead_letters = d->next;
		pfree(d->target);
		pfree(d->topic);
		if (d->key)
			pfree(d->key);
		pfree(d->last_error);
		pfree(d);
	}
}

/* Queue a dead letter, written with the next progress update. */
void
relay_add_dead_letter(RelayTarget *t, int64 id, const char *msg_id,
					  const char *topic, const char *key, int attempts,
					  int status, const char *error)
{
	RelayDeadLetter *d = MemoryContextAllocZero(relay_cxt, sizeof(RelayDeadLetter));

	d->target = MemoryContextStrdup(relay_cxt, t->name);
	d->id = id;
	strlcpy(d->msg_id, msg_id, sizeof(d->msg_id));
	d->topic = MemoryContextStrdup(relay_cxt, topic);
	d->key = key ? MemoryContextStrdup(relay_cxt, key) : NULL;
	d->attempts = attempts;
	d->last_status = status;
	d->last_error = MemoryContextStrdup(relay_cxt, error);
	d->next = dead_letters;
	dead_letters = d;
}

/*
 * Whether dead-letter rows are about to change (written or removed at the
 * next progress write): dead letters to deliver again are read only after,
 * so that none is read, and sent, twice.
 */
bool
relay_dead_letter_writes_pending(void)
{
	return dead_letters != NULL || retried_done != NIL;
}

/* A dead letter delivered again was acknowledged: it is no longer dead. */
void
relay_retry_delivered(RelayTarget *t, int64 id)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(relay_cxt);
	RelayRetried *r = palloc(sizeof(RelayRetried));

	r->target = pstrdup(t->name);
	r->id = id;
	retried_done = lappend(retried_done, r);
	MemoryContextSwitchTo(oldcxt);
}

/* The dead letters not yet written, newest first (relay_progress.c). */
RelayDeadLetter *
relay_dead_letters_queued(void)
{
	return dead_letters;
}

/* The dead letters delivered again, to remove (relay_progress.c). */
List *
relay_retried_queued(void)
{
	return retried_done;
}

/*
 * What relay_dead_letters_queued() and relay_retried_queued() returned is
 * durable now (the progress write committed): forget it all.
 */
void
relay_dead_letters_written(void)
{
	ListCell   *lc;

	relay_dead_letters_discard(NULL);	/* written: forget them all */
	foreach(lc, retried_done)
		pfree(((RelayRetried *) lfirst(lc))->target);
	list_free_deep(retried_done);
	retried_done = NIL;
}
