/*-------------------------------------------------------------------------
 *
 * standby.c
 *	  Failover-safe delivery (I9): nothing leaves the outbox before the
 *	  standbys named by outbox.standby_slots have flushed its commit.
 *
 * A failover undoes the commits its standby had not received.  Were their
 * messages already delivered, consumers would have acted on transactions
 * that never happened, and the promoted server would hand their ids out
 * again for other messages.  So with outbox.standby_slots set, whatever
 * hands messages out (the relay for its targets, a fill of a queue for
 * outbox.receive()) reads only up to a frontier whose commits every listed
 * physical slot has confirmed: a physical slot's restart_lsn is the flush
 * position its standby last reported.  The writer's commit never waits.
 *
 * Each reader keeps, in its own memory, the frontiers it computed with the
 * end of the newest commit then (a frontier covers only commits that ended
 * before it was computed, so their ends are at or below it): the frontier
 * it may read up to is the newest one whose end every slot has confirmed.
 * A slot that does not exist, was invalidated or is not physical holds
 * everything; one whose standby is gone holds what it has not confirmed.
 * Never skipped: delivery resumes when the slot catches up or the setting
 * changes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "replication/slot.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/pg_lsn.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "outbox.h"
#include "compat.h"

/* The setting, and its parsed list (the GUC's extra). */
char	   *outbox_standby_slots = NULL;

typedef struct StandbySlotList
{
	int			n;
	NameData	names[FLEXIBLE_ARRAY_MEMBER];
} StandbySlotList;

static StandbySlotList *standby_list = NULL;

/* Frontiers waiting for the slots, oldest first (a ring). */
#define GATE_POINTS		256

typedef struct GatePoint
{
	int64		frontier;
	XLogRecPtr	end;
} GatePoint;

typedef struct StandbyGate
{
	GatePoint	points[GATE_POINTS];
	int			head;
	int			count;
	int64		safe;			/* the slots confirmed every commit up to it */
	int64		handed;			/* the highest frontier returned */
	bool		active;			/* the setting was in force last time */
	int			index;			/* the database slot the ids are from ... */
	uint32		generation;		/* ... and its generation */
	TimestampTz waiting_since;	/* when the oldest point began to wait */
} StandbyGate;

static StandbyGate gate;

/* After this long waiting for a streaming standby, look every 10 ms. */
#define GATE_EAGER_MS	20

/*
 * What each listed slot confirmed while a standby was connected to it, as
 * this process saw it.  A slot's position counts only then: a slot without
 * its standby may have been moved by hand (pg_replication_slot_advance),
 * made with reserved WAL, or copied by a failover manager, and none of
 * these is a flush some standby reported.
 */
#define SEEN_SLOTS	64

typedef struct SeenSlot
{
	NameData	name;
	XLogRecPtr	flushed;
} SeenSlot;

static SeenSlot seen[SEEN_SLOTS];
static int	nseen = 0;

static XLogRecPtr *
seen_position(const char *name)
{
	int			i;

	for (i = 0; i < nseen; i++)
		if (strcmp(NameStr(seen[i].name), name) == 0)
			return &seen[i].flushed;
	if (nseen == SEEN_SLOTS)
		return NULL;			/* more slots than that: nothing kept */
	namestrcpy(&seen[nseen].name, name);
	seen[nseen].flushed = InvalidXLogRecPtr;
	return &seen[nseen++].flushed;
}

/*---- the setting ----*/

static bool
standby_slots_check(char **newval, void **extra, GucSource source)
{
	char	   *raw = pstrdup(*newval);
	List	   *names;
	ListCell   *lc;
	StandbySlotList *list;
	int			i = 0;
	const char *p = *newval;

	/* SplitIdentifierString would cut a long name short: refuse it first */
	while (*p)
	{
		size_t		len = strcspn(p, ",");
		size_t		chars = 0;
		size_t		k;

		for (k = 0; k < len; k++)
			if (p[k] != ' ' && p[k] != '\t' && p[k] != '"')
				chars++;
		if (chars >= NAMEDATALEN)
		{
			GUC_check_errdetail("Replication slot names have 1 to %d characters.", NAMEDATALEN - 1);
			return false;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	if (!SplitIdentifierString(raw, ',', &names))
	{
		GUC_check_errdetail("The list syntax is invalid.");
		return false;
	}
	foreach(lc, names)
	{
		const char *name = (const char *) lfirst(lc);
		const char *c;

		if (name[0] == '\0' || strlen(name) >= NAMEDATALEN)
		{
			GUC_check_errdetail("Replication slot names have 1 to %d characters.", NAMEDATALEN - 1);
			return false;
		}
		for (c = name; *c; c++)
			if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_'))
			{
				GUC_check_errdetail("Replication slot name \"%s\" contains invalid character.", name);
				GUC_check_errhint("Replication slot names may only contain lower case letters, numbers, and the underscore character.");
				return false;
			}
	}
	list = outbox_guc_malloc(offsetof(StandbySlotList, names) +
							 sizeof(NameData) * Max(list_length(names), 1));
	if (list == NULL)
		return false;
	list->n = list_length(names);
	foreach(lc, names)
		namestrcpy(&list->names[i++], (const char *) lfirst(lc));
	list_free(names);
	pfree(raw);
	*extra = list;
	return true;
}

static void
standby_slots_assign(const char *newval, void *extra)
{
	standby_list = (StandbySlotList *) extra;
}

void
outbox_standby_define_gucs(void)
{
	DefineCustomStringVariable("outbox.standby_slots",
							   "Physical replication slots whose standbys must have flushed a commit before its messages are delivered or received.",
							   "Empty: messages are delivered once their commit is durable here. A listed slot that does "
							   "not exist, was invalidated or is not physical holds delivery.",
							   &outbox_standby_slots,
							   "",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   standby_slots_check, standby_slots_assign, NULL);
}

bool
outbox_standby_gated(void)
{
	return standby_list != NULL && standby_list->n > 0;
}

/*---- the slots ----*/

/* How one listed slot stands. */
static void
standby_slot_look(const char *name, OutboxStandbySlot *out)
{
	ReplicationSlot *s;

	memset(out, 0, sizeof(*out));
	strlcpy(out->name, name, sizeof(out->name));
	out->flushed = InvalidXLogRecPtr;

	LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
	s = SearchNamedReplicationSlot(name, false);
	if (s == NULL)
		out->state = OUTBOX_STANDBY_MISSING;
	else
	{
		XLogRecPtr	restart;
		Oid			database;
		bool		invalidated;
		pid_t		active;
		XLogRecPtr	reported = InvalidXLogRecPtr;
		bool		sender = false;
		int			i;

		SpinLockAcquire(&s->mutex);
		restart = s->data.restart_lsn;
		database = s->data.database;
		invalidated = outbox_slot_invalidated(s);
		active = s->active_pid;
		SpinLockRelease(&s->mutex);

		if (OidIsValid(database))
			out->state = OUTBOX_STANDBY_LOGICAL;
		else if (invalidated)
			out->state = OUTBOX_STANDBY_INVALIDATED;
		else
		{
			/*
			 * Streaming only when the process holding the slot is a WAL
			 * sender: pg_replication_slot_advance(), a copy or a creation
			 * hold it too, with a position no standby reported.  And only
			 * as far as the standby's own replies say it flushed (a WAL
			 * sender that has no reply yet confirms nothing).
			 */
			for (i = 0; active != 0 && WalSndCtl != NULL && i < max_wal_senders; i++)
			{
				WalSnd	   *w = &WalSndCtl->walsnds[i];

				SpinLockAcquire(&w->mutex);
				if (w->pid == active)
				{
					sender = true;
					reported = w->flush;
				}
				SpinLockRelease(&w->mutex);
			}
			out->state = sender ? OUTBOX_STANDBY_STREAMING : OUTBOX_STANDBY_DISCONNECTED;
			out->restart = restart;
			out->flushed = !sender ? restart :
				reported == InvalidXLogRecPtr ? InvalidXLogRecPtr : Min(restart, reported);
		}
	}
	LWLockRelease(ReplicationSlotControlLock);
}

/*
 * standby_slot_look() for the gate: a slot without its standby confirms
 * only what this process saw its standby confirm (see seen[]).
 */
static void
standby_slot_trusted(const char *name, OutboxStandbySlot *out)
{
	XLogRecPtr *pos = seen_position(name);

	standby_slot_look(name, out);
	if (out->state == OUTBOX_STANDBY_STREAMING)
	{
		if (pos != NULL && out->flushed != InvalidXLogRecPtr)
			*pos = out->flushed;
	}
	else if (out->state == OUTBOX_STANDBY_DISCONNECTED)
		out->flushed = pos != NULL ? Min(*pos, out->flushed) : InvalidXLogRecPtr;
	else if (pos != NULL)
		*pos = InvalidXLogRecPtr;	/* gone: a slot made again starts afresh */
}

const char *
outbox_standby_state_name(OutboxStandbyState state)
{
	switch (state)
	{
		case OUTBOX_STANDBY_STREAMING:
			return "streaming";
		case OUTBOX_STANDBY_DISCONNECTED:
			return "no standby connected";
		case OUTBOX_STANDBY_MISSING:
			return "does not exist";
		case OUTBOX_STANDBY_INVALIDATED:
			return "invalidated";
		case OUTBOX_STANDBY_LOGICAL:
			return "not a physical slot";
	}
	return "unknown";
}

/* Whether a slot in this state confirms anything (its standby flushed). */
static bool
standby_state_confirms(OutboxStandbyState state)
{
	return state == OUTBOX_STANDBY_STREAMING || state == OUTBOX_STANDBY_DISCONNECTED;
}

/*
 * The position every listed slot has confirmed (InvalidXLogRecPtr when one
 * confirms nothing), and in *worst the slot that holds most: the first in a
 * state that holds everything, else the one furthest behind.
 */
XLogRecPtr
outbox_standby_confirmed(OutboxStandbySlot *worst)
{
	XLogRecPtr	confirmed = InvalidXLogRecPtr;
	bool		blocked = false;
	int			i;

	memset(worst, 0, sizeof(*worst));
	for (i = 0; standby_list != NULL && i < standby_list->n; i++)
	{
		OutboxStandbySlot s;

		standby_slot_trusted(NameStr(standby_list->names[i]), &s);
		if (!standby_state_confirms(s.state))
		{
			if (!blocked)
				*worst = s;
			blocked = true;
		}
		else if (!blocked && (i == 0 || s.flushed < confirmed))
		{
			*worst = s;
			confirmed = s.flushed;
		}
	}
	return blocked ? InvalidXLogRecPtr : confirmed;
}

/*
 * How many listed physical slots carry a catalog_xmin: a standby with
 * hot_standby_feedback reports the oldest catalog_xmin of its own logical
 * slots, so a standby keeping a synchronized copy of a logical slot
 * (sync_replication_slots, PostgreSQL 17) shows one in its slot here.
 */
int
outbox_standby_catalog_holders(void)
{
	int			holders = 0;
	int			i;

	for (i = 0; standby_list != NULL && i < standby_list->n; i++)
	{
		ReplicationSlot *s;

		LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
		s = SearchNamedReplicationSlot(NameStr(standby_list->names[i]), false);
		if (s != NULL)
		{
			SpinLockAcquire(&s->mutex);
			if (!OidIsValid(s->data.database) && !outbox_slot_invalidated(s) &&
				TransactionIdIsValid(s->data.catalog_xmin))
				holders++;
			SpinLockRelease(&s->mutex);
		}
		LWLockRelease(ReplicationSlotControlLock);
	}
	return holders;
}

/*---- the gate ----*/

/*
 * The frontier a reader may read up to, given the frontier it computed and
 * the end of the newest commit (at or above every commit the frontier
 * covers).  Without the setting: the frontier itself.  *hold gets why the
 * rest waits (state OUTBOX_STANDBY_STREAMING with nothing behind when
 * nothing does); *recheck_ms how soon to ask again while something waits
 * (-1 when nothing does).  The slots report as their standbys flush, and
 * nothing wakes a reader when they do: while a standby streams it is asked
 * again within a millisecond.
 */
int64
outbox_standby_gate(int64 frontier, XLogRecPtr end, OutboxStandbySlot *hold, long *recheck_ms)
{
	XLogRecPtr	confirmed;

	uint32		generation = outbox_db_generation();
	int			index = outbox_db_attached_index();

	memset(hold, 0, sizeof(*hold));
	hold->state = OUTBOX_STANDBY_STREAMING;
	*recheck_ms = -1;

	/*
	 * Ids start again in a database slot taken anew (DROP and CREATE
	 * EXTENSION): what was confirmed of the old ones says nothing.
	 */
	if (generation != gate.generation || index != gate.index)
	{
		memset(&gate, 0, sizeof(gate));
		gate.generation = generation;
		gate.index = index;
	}

	if (!outbox_standby_gated())
	{
		gate.active = false;
		gate.count = 0;
		gate.safe = gate.handed = Max(gate.handed, frontier);
		return frontier;
	}
	if (!gate.active)
	{
		/* just set: what was handed out before stays handed out */
		gate.active = true;
		gate.count = 0;
		gate.safe = gate.handed;
	}

	if (frontier > gate.safe &&
		(gate.count == 0 ||
		 frontier > gate.points[(gate.head + gate.count - 1) % GATE_POINTS].frontier))
	{
		if (gate.count == GATE_POINTS)
		{
			/* full: the newest point stands for the newest frontier too */
			GatePoint  *last = &gate.points[(gate.head + gate.count - 1) % GATE_POINTS];

			last->frontier = frontier;
			last->end = Max(last->end, end);
		}
		else
		{
			GatePoint  *p = &gate.points[(gate.head + gate.count) % GATE_POINTS];

			p->frontier = frontier;
			p->end = end;
			gate.count++;
		}
	}
	if (gate.count == 0)
		return Min(gate.safe, frontier);

	confirmed = outbox_standby_confirmed(hold);
	while (gate.count > 0 && confirmed != InvalidXLogRecPtr &&
		   gate.points[gate.head].end <= confirmed)
	{
		gate.safe = Max(gate.safe, gate.points[gate.head].frontier);
		gate.head = (gate.head + 1) % GATE_POINTS;
		gate.count--;
		gate.waiting_since = 0;
	}
	if (gate.count > 0)
	{
		XLogRecPtr	wanted = gate.points[(gate.head + gate.count - 1) % GATE_POINTS].end;
		TimestampTz now = GetCurrentTimestamp();

		if (gate.waiting_since == 0)
			gate.waiting_since = now;
		hold->waiting = true;
		hold->behind = hold->flushed == InvalidXLogRecPtr ? -1 :
			wanted > hold->flushed ? (int64) (wanted - hold->flushed) : 0;
		/* a standby that keeps up confirms within a millisecond or two */
		*recheck_ms = hold->state != OUTBOX_STANDBY_STREAMING ? 100 :
			TimestampDifferenceExceeds(gate.waiting_since, now, GATE_EAGER_MS) ? 10 : 1;
	}
	gate.handed = Max(gate.handed, gate.safe);
	return Min(gate.safe, frontier);
}

/*
 * Wait at most max_us microseconds for the listed slots to confirm the
 * oldest frontier waiting, looking every 100 us: a standby streaming on
 * loopback confirms a commit well within a millisecond, the shortest sleep
 * a wait event set can take.  Gives up at once when nothing can confirm
 * soon (a slot not streaming) or the latch is set.  Returns whether the
 * oldest frontier waiting is confirmed now.
 */
bool
outbox_standby_wait(long max_us)
{
	long		waited = 0;

	for (;;)
	{
		OutboxStandbySlot worst;
		XLogRecPtr	confirmed;

		if (gate.count == 0)
			return true;
		/* a standby that is behind is looked at every 10 ms instead */
		if (gate.waiting_since != 0 &&
			TimestampDifferenceExceeds(gate.waiting_since, GetCurrentTimestamp(), GATE_EAGER_MS))
			return false;
		confirmed = outbox_standby_confirmed(&worst);
		if (confirmed != InvalidXLogRecPtr && gate.points[gate.head].end <= confirmed)
			return true;
		if (worst.state != OUTBOX_STANDBY_STREAMING || MyLatch->is_set || waited >= max_us)
			return false;
		pg_usleep(100);
		waited += 100;
	}
}

/*
 * The frontier a backend may hand messages out up to (outbox.receive()):
 * outbox_compute_frontier() passed through the gate.  *recheck_ms as for
 * outbox_standby_gate().
 */
int64
outbox_standby_frontier(long *recheck_ms)
{
	uint32		generation = outbox_db_generation();
	int			index = outbox_db_attached_index();
	int64		frontier = outbox_compute_frontier();
	OutboxStandbySlot hold;

	frontier = outbox_standby_gate(frontier, outbox_newest_commit_end(), &hold, recheck_ms);
	/* the database's slot was taken anew meanwhile: nothing this turn */
	if (generation != outbox_db_generation() || index != outbox_db_attached_index())
	{
		*recheck_ms = 1;
		return 0;
	}
	return frontier;
}

/*---- outbox.standby_status() ----*/

/*
 * outbox.standby_status() -> setof (slot_name, state, flushed_lsn,
 * behind_bytes): each slot of outbox.standby_slots, how it stands, and how
 * far its standby is behind the newest commit that emitted messages here.
 */
PG_FUNCTION_INFO_V1(outbox_standby_status);

Datum
outbox_standby_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	XLogRecPtr	newest = outbox_newest_commit_end();
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; standby_list != NULL && i < standby_list->n; i++)
	{
		OutboxStandbySlot s;
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		standby_slot_look(NameStr(standby_list->names[i]), &s);
		values[0] = CStringGetTextDatum(s.name);
		values[1] = CStringGetTextDatum(outbox_standby_state_name(s.state));
		values[2] = LSNGetDatum(s.flushed);
		nulls[2] = s.flushed == InvalidXLogRecPtr;
		values[3] = Int64GetDatum(s.flushed == InvalidXLogRecPtr ? 0 :
								  newest > s.flushed ? (int64) (newest - s.flushed) : 0);
		nulls[3] = s.flushed == InvalidXLogRecPtr;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
