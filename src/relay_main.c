/*-------------------------------------------------------------------------
 *
 * relay_main.c
 *	  The relay: a background worker that delivers committed messages to
 *	  their targets in commit order.  Lifecycle, signals and the loop.
 *
 * The launcher (launcher.c) starts one relay for outbox.database.
 * Committing transactions that emitted set its latch; outbox.poll_interval
 * is only a safety net.  Each turn of the loop:
 *
 *	1. computes the frontier F (shmem.c) and flushes WAL up to it, so no
 *	   message is delivered before its commit is durable (I7);
 *	2. reads the messages above each target's read position and at or below
 *	   F into the lanes of their keys (relay_read.c);
 *	3. delivers: NOTIFY targets in one transaction that also records their
 *	   progress (relay_notify.c); idle HTTP lanes start their next batch
 *	   (relay_http.c), one request in flight per lane (relay_lane.c);
 *	4. lets libcurl progress and hands finished requests' outcomes to their
 *	   lanes;
 *	5. records progress and dead letters (relay_progress.c).
 *
 * No transaction or snapshot is held across network I/O.  The worker's
 * session resolves names in pg_catalog only, whatever the database's
 * search_path.  SIGTERM records what was acknowledged, then exits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "common/base64.h"
#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "access/detoast.h"
#include "utils/datetime.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "relay.h"

/*
 * Record progress at most this long after an acknowledgement, and no more
 * often.
 */
#define RELAY_PROGRESS_INTERVAL_MS	20
/*
 * After reading, let commits accumulate this long before the next read: the
 * worker does not wait on its latch meanwhile, so committers need not wake
 * it, and one read picks up many commits.  Bounds the cost of the relay at
 * high commit rates; adds at most this much latency.
 */
#define RELAY_READ_PAUSE_MS			1
/* How soon to load the configuration again while a target waits for its progress rows. */
#define RELAY_INCOMPLETE_RELOAD_MS	200
/*
 * A relay that finds no extension gives back a slot only this long after it
 * was taken: a younger one may belong to a CREATE EXTENSION still running
 * (one that fails gives its slot back itself, outbox_db_abort_taken).
 */
#define RELAY_SLOT_MIN_AGE_MS		60000

PGDLLEXPORT void outbox_worker_main(Datum main_arg);

/*
 * Start the lane's next request.  A failure to start it, even an error
 * while preparing it, is the lane's outcome (retried, then a dead letter),
 * never the relay's.
 */
static void
relay_lane_start(RelayLane *lane)
{
	MemoryContext cxt = CurrentMemoryContext;
	RelayOutcome failed;
	volatile bool started = false;
	char	   *volatile error = NULL;

	memset(&failed, 0, sizeof(failed));
	PG_TRY();
	{
		started = lane->target->transport->send(lane, &failed);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		error = MemoryContextStrdup(relay_cxt, edata->message);
		FreeErrorData(edata);
	}
	PG_END_TRY();

	if (error != NULL)
	{
		memset(&failed, 0, sizeof(failed));
		failed.kind = RELAY_RETRY;
		failed.error = error;
		/*
		 * The head message alone is retried, then dead-lettered; or, when
		 * the lane of a transport with windows has one on the wire (it
		 * had, or the send put messages on the wire before the error),
		 * the first message not sent fails so (window_fail below).
		 */
		if (!lane->in_flight && lane->nbatch == 0)
			lane->nbatch = 1;
		if (!lane->in_flight)
			lane->retry_nbatch = 0;
	}
	if (started)
	{
		RelayTarget *t = lane->target;

		t->stats.requests++;
		t->stats.bytes += (t->batch_size == 1 && lane->head != NULL) ?
			(uint64) lane->head->payload_len : (uint64) lane->cut_bytes;
	}
	if (!started && lane->in_flight && lane->target->transport->window_fail != NULL)
		lane->target->transport->window_fail(lane, &failed);
	else if (!started)
		relay_lane_outcome(lane, &failed);
	if (error != NULL)
		pfree(error);
}

/*
 * Start a request on every idle lane whose next batch is due; batches that
 * must be recorded first are recorded together, then sent.  A transport
 * that delivers a whole queue at once (NOTIFY) does so here.
 */
static void
relay_dispatch(TimestampTz now)
{
	ListCell   *lc;
	RelayLane **cut = NULL;
	int			ncut = 0;
	int			maxcut = 0;

	static uint32 turn = 0;

	turn++;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;
		int			k;

		if (t->aside_pending)
		{
			/* Rare: only after outbox.set_aside(), not every turn. */
			t->aside_pending = false;
			for (i = 0; i < t->nlanes; i++)
			{
				relay_lane_set_aside(&t->lanes[i]);
				if (t->lanes[i].aside_id != 0 && !t->lanes[i].aside_answered)
					t->aside_pending = true;
			}
		}
		if (t->transport->deliver != NULL)
		{
			/* One lane, delivered in the worker's own transactions. */
			if (t->nqueued > 0 && now >= t->lanes[0].next_attempt &&
				relay_target_may_send(t, now, NULL))
				t->transport->deliver(t);
			continue;
		}
		/*
		 * From another lane each turn, so that no lane is always first to
		 * what a full producer queue frees.
		 */
		for (k = 0; k < t->nlanes; k++)
		{
			RelayLane  *lane = &t->lanes[(turn + k) % t->nlanes];
			int			share;
			int			start;

			if (!relay_lane_may_send(lane, now) || !relay_lane_cut(lane))
				continue;
			relay_target_took_token(t);
			if (!lane->cut_record)
			{
				relay_lane_start(lane);
				/*
				 * A pipelined lane sends on, request after request, while
				 * its window takes more: one request a turn would hold it
				 * to batch_size messages per wake-up.  About its share of
				 * the target's queue a turn, so that one lane does not take
				 * all of what a full producer queue frees.
				 */
				share = Max(t->batch_size, relay_queue_cap(t) / t->nlanes);
				start = lane->nbatch;
				while (lane->in_flight && relay_target_pipelined(t) &&
					   lane->nbatch - start < share)
				{
					int			nbatch = lane->nbatch;

					if (!relay_lane_may_send(lane, now) || !relay_lane_cut(lane))
						break;
					relay_target_took_token(t);
					relay_lane_start(lane);
					if (lane->nbatch <= nbatch)
						break;	/* nothing went (a full producer queue) */
				}
				continue;
			}
			if (ncut == maxcut)
			{
				maxcut = Max(16, maxcut * 2);
				cut = cut ? repalloc(cut, sizeof(RelayLane *) * maxcut) :
					MemoryContextAlloc(relay_cxt, sizeof(RelayLane *) * maxcut);
			}
			cut[ncut++] = lane;
		}
	}
	if (ncut > 0)
	{
		int			i;

		relay_record_cuts(cut, ncut);
		for (i = 0; i < ncut; i++)
			relay_lane_start(cut[i]);
	}
	if (cut)
		pfree(cut);
}

/* Every kind of target the relay delivers to (relay_kinds). */
const RelayTransport *const relay_transports[] = {
	&relay_http_transport,
	&relay_notify_transport,
	&relay_nats_transport,
	&relay_kafka_transport,
	&relay_redis_transport,
	&relay_rabbitmq_transport,
	&relay_sqs_transport,
	&relay_kinesis_transport,
	&relay_sns_transport,
	NULL
};
StaticAssertDecl(lengthof(relay_transports) <= 64,
				 "relay_kinds_used has a bit for each transport");

/*
 * Let every transport make progress and report what ended: every one that
 * had a target since the relay started (one that never had one has nothing
 * to report).
 */
static void
relay_drive(void)
{
	int			i;

	for (i = 0; relay_transports[i] != NULL; i++)
	{
		if ((relay_kinds_used & (UINT64CONST(1) << i)) == 0)
			continue;
		if (relay_transports[i]->conn_set != NULL)
			relay_conn_drive(relay_transports[i], relay_lane_outcome);
		else if (relay_transports[i]->drive != NULL)
			relay_transports[i]->drive(relay_lane_outcome);
	}
}

/* How often the relay publishes its figures (stats.c). */
#define RELAY_STATS_INTERVAL_MS		50

/*
 * outbox.standby_slots (I9): what the last gate said, and the frontier the
 * relay would have read up to without it.
 */
static OutboxStandbySlot relay_standby_hold;
static int64 relay_ungated_frontier = 0;
static bool relay_standby_logged = false;	/* a hold was logged ... */
static OutboxStandbySlot relay_standby_logged_as;	/* ... for this slot, state */

static TimestampTz relay_started_at = 0;
static uint64 relay_reset_generation = 0;

/* The state outbox.lag shows for a target (OutboxTargetStats.state). */
static char
relay_target_state(RelayTarget *t)
{
	int			i;
	bool		busy = t->nqueued > 0;

	if (t->state == 'p')
		return 'p';
	if (t->state == 'd')
		return 'x';
	if (t->hold_attempts > 0)
		return 'f';
	for (i = 0; i < t->nlanes; i++)
	{
		if (t->lanes[i].attempts > 0 || t->lanes[i].retry_nbatch > 0)
			return 'r';
		busy = busy || t->lanes[i].in_flight || t->lanes[i].overflow_id != 0;
	}
	/* Idle with messages the standbys have not confirmed yet. */
	if (!busy && relay_standby_hold.waiting && t->read_id < relay_ungated_frontier)
		return 'w';
	return busy ? 'd' : 'i';
}

/*
 * Zero every target's counters if outbox.reset_stats() was called since we
 * last looked.  Checked after each read, before anything read is
 * delivered, so every message read after the call counts.
 */
static void
relay_stats_check_reset(TimestampTz now)
{
	uint64		gen = outbox_stats_reset_generation();
	ListCell   *lc;

	if (gen == relay_reset_generation)
		return;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		memset(&t->stats, 0, sizeof(t->stats));
		t->stats.reset_at = now;
	}
	relay_reset_generation = gen;
}

/*
 * Publish the relay's status and every target's figures to shared memory
 * (at most every RELAY_STATS_INTERVAL_MS unless forced), after zeroing the
 * counters if outbox.reset_stats() asked for it.
 */
void
relay_publish_stats(TimestampTz now, const char *state, bool force)
{
	static TimestampTz last = 0;
	OutboxWorkerStatus w;
	OutboxTargetStats *all;
	ListCell   *lc;
	int			n = 0;

	if (!force && last != 0 && !TimestampDifferenceExceeds(last, now, RELAY_STATS_INTERVAL_MS))
		return;
	relay_stats_check_reset(now);
	last = now;
	if (relay_started_at == 0)
		relay_started_at = now;

	memset(&w, 0, sizeof(w));
	strlcpy(w.state, state, sizeof(w.state));
	w.started_at = relay_started_at;
	w.last_wakeup = now;
	w.read_position = -1;

	all = palloc(sizeof(OutboxTargetStats) * Max(list_length(relay_targets), 1));
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		t->stats.target_id = t->id;
		t->stats.state = relay_target_state(t);
		t->stats.in_flight = 0;
		t->stats.failed_attempts = t->hold_attempts;
		for (i = 0; i < t->nlanes; i++)
		{
			t->stats.in_flight += t->lanes[i].in_flight ? 1 : 0;
			t->stats.failed_attempts += t->lanes[i].attempts;
		}
		if (w.read_position < 0 || t->read_id < w.read_position)
			w.read_position = t->read_id;
		all[n++] = t->stats;
	}
	if (w.read_position < 0)
		w.read_position = 0;
	outbox_stats_publish(&w, all, n);
	pfree(all);
}

/* Milliseconds the loop may sleep. */
static long
relay_sleep_ms(int64 frontier, TimestampTz now)
{
	long		timeout = outbox_poll_interval;
	ListCell   *lc;
	int			k;

	for (k = 0; relay_transports[k] != NULL; k++)
	{
		long		ms = relay_transports[k]->conn_set ? relay_conn_next_ms(relay_transports[k]) :
			relay_transports[k]->timeout ? relay_transports[k]->timeout() : -1;

		if (ms >= 0 && ms < timeout)
			timeout = ms;
	}

	if (!outbox_enabled)
		return timeout;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		long		rate_ms;

		if (relay_target_wants_read(t, frontier))
			return 0;
		if (!relay_target_may_send(t, now, &rate_ms))
		{
			/* Paused or disabled: nothing to wake up for; else the rate. */
			if (rate_ms >= 0)
				timeout = Min(timeout, rate_ms);
			continue;
		}
		if (t->read_retry_at != 0)
		{
			long		ms = (long) ((t->read_retry_at - now + 999) / 1000);

			timeout = Min(timeout, Max(ms, 0));
		}
		{
			/* a read put off while the target is nearly full */
			long		ms = relay_target_read_put_off_ms(t, frontier, now);

			if (ms >= 0)
				timeout = Min(timeout, ms);
		}
		/* lanes waiting for a token are woken by its answer */
		if (relay_auth_waiting(t))
			continue;
		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			/* a lane waiting for a read is woken by the read's conditions */
			if (!lane->in_flight && lane->nqueued > 0 && !relay_lane_waits_for_read(lane) &&
				(t->hold_attempts == 0 || i == t->probe_lane))
			{
				long		ms = (long) ((lane->next_attempt - now + 999) / 1000);

				timeout = Min(timeout, Max(ms, 0));
			}
		}
	}
	return timeout;
}

/*
 * Load the configuration, and say whether commits should wake the worker.
 * Returns the configuration generation loaded.
 */
static uint64
relay_reload_config(void)
{
	uint64		generation = outbox_config_generation();

	relay_load_config();
	outbox_set_worker_wants_commits(relay_targets != NIL && outbox_enabled);
	return generation;
}

/*
 * The frontier the relay may read up to with outbox.standby_slots (I9),
 * given the one it computed and the end of the newest commit it covers;
 * *recheck_ms: how soon to look at the slots again (-1: no need).  A change
 * between holding for a slot that cannot confirm and not is logged once,
 * and written as each target's last error.
 */
static int64
relay_standby_gate(int64 frontier, XLogRecPtr end, long *recheck_ms)
{
	int64		gated;
	bool		stuck;

	gated = outbox_standby_gate(frontier, end, &relay_standby_hold, recheck_ms);
	relay_ungated_frontier = frontier;
	stuck = relay_standby_hold.waiting &&
		relay_standby_hold.state != OUTBOX_STANDBY_STREAMING;
	/* a hold is logged when it begins, and again when its reason changes */
	if (stuck &&
		(!relay_standby_logged ||
		 relay_standby_hold.state != relay_standby_logged_as.state ||
		 strcmp(relay_standby_hold.name, relay_standby_logged_as.name) != 0))
	{
		char	   *why = psprintf("held until standby slot \"%s\" confirms: %s",
								   relay_standby_hold.name,
								   outbox_standby_state_name(relay_standby_hold.state));
		ListCell   *lc;

		ereport(LOG,
				(errmsg("outbox relay holds delivery: standby slot \"%s\" %s",
						relay_standby_hold.name,
						relay_standby_hold.state == OUTBOX_STANDBY_MISSING ? "does not exist" :
						relay_standby_hold.state == OUTBOX_STANDBY_INVALIDATED ? "was invalidated" :
						relay_standby_hold.state == OUTBOX_STANDBY_LOGICAL ? "is not a physical replication slot" :
						"has no standby connected"),
				 errdetail("Messages from id " INT64_FORMAT " on wait until every slot of outbox.standby_slots has confirmed their commits.",
						   gated + 1),
				 relay_standby_hold.state == OUTBOX_STANDBY_DISCONNECTED ?
				 errhint("Start the standby that streams from this slot, or take the slot out of outbox.standby_slots.") :
				 errhint("Name in outbox.standby_slots the physical replication slot of the standby that would be promoted.")));
		foreach(lc, relay_targets)
		{
			RelayTarget *t = (RelayTarget *) lfirst(lc);

			if (t->read_id < frontier)
				relay_lane_set_error(&t->lanes[0], 0, why);
		}
		pfree(why);
		relay_standby_logged = true;
		relay_standby_logged_as = relay_standby_hold;
	}
	else if (!stuck && relay_standby_logged)
	{
		ereport(LOG,
				(errmsg("outbox relay resumes delivery: %s",
						!outbox_standby_gated() ? "outbox.standby_slots is empty" :
						"every slot of outbox.standby_slots confirms again")));
		relay_standby_logged = false;
	}
	return gated;
}

/*
 * DROP EXTENSION: the relay gives back its database's slot and exits; the
 * launcher starts none until the extension is created again.  In the
 * one-database form the relay keeps the slot: the next one waits for the
 * extension.  error: what a read under way when the drop committed failed
 * with, or NULL.
 */
static void
relay_extension_dropped(const char *dbname, const char *error)
{
	ereport(LOG,
			(errmsg("outbox relay for database \"%s\" stops: the extension was dropped", dbname),
			 error ? errdetail("It was dropped while the relay read its tables: %s", error) : 0));
	outbox_relay_release();
	if (!outbox_one_database_form())
		outbox_db_release(MyDatabaseId, 0);
	proc_exit(0);
}

/*
 * SIGTERM (server shutdown, or pg_terminate_backend): collect the answers
 * already received, record them, and exit.  Requests still unanswered are
 * sent again by the next relay, as they may not have been acknowledged.
 * Exit code 0: the launcher starts a new relay unless the server is
 * stopping.
 */
static void
relay_shutdown(void)
{
	relay_drive();
	if (relay_progress_pending())
		relay_write_progress();
	proc_exit(0);
}

static void
relay_worker_exit(int code, Datum arg)
{
	OutboxWorkerStatus w;
	int			i;

	/*
	 * What this relay published no longer describes a running one (unless
	 * it gave its database's slot back: then nothing is left to say).
	 */
	if (outbox_db_lookup())
	{
		memset(&w, 0, sizeof(w));
		strlcpy(w.state, "stopped", sizeof(w.state));
		outbox_stats_publish(&w, NULL, 0);
		outbox_relay_release();
	}
	/* Close the connections (never called from inside a library). */
	for (i = 0; relay_transports[i] != NULL; i++)
	{
		const RelayTransport *tr = relay_transports[i];

		if (tr->stop != NULL)
			tr->stop();
		else if (tr->conn_set != NULL)
			relay_conn_stop(tr);
	}
}

static void relay_loop(WaitEventSet *wait_set, WaitEventSet *quiet_set);

void
outbox_worker_main(Datum main_arg)
{
	WaitEventSet *wait_set;
	WaitEventSet *quiet_set;
	const char *dbname = MyBgworkerEntry->bgw_extra;

	/* SIGTERM: record what was acknowledged, then exit (relay_shutdown). */
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	/*
	 * The launcher (launcher.c) saw the database exist; its argument is the
	 * database's oid, bgw_extra its name.  As the bootstrap superuser, or as
	 * outbox.relay_role, which need not be a superuser: the relay reads and
	 * writes only the outbox tables.
	 */
	BackgroundWorkerInitializeConnection(dbname,
										 (outbox_relay_role && outbox_relay_role[0]) ?
										 outbox_relay_role : NULL, 0);
	if (MyDatabaseId != DatumGetObjectId(main_arg))
		proc_exit(0);			/* renamed meanwhile: the launcher looks again */

	/*
	 * A database without the extension gets no relay: give back a slot left
	 * from before a DROP EXTENSION, and exit.  CREATE EXTENSION takes a slot,
	 * which makes the launcher start a relay again.  In the one-database
	 * form (outbox.database) the relay waits for the extension instead, as
	 * in 0.2.
	 */
	if (!outbox_one_database_form() && !outbox_extension_installed())
	{
		outbox_db_note_looked();
		outbox_db_release(MyDatabaseId, RELAY_SLOT_MIN_AGE_MS);
		proc_exit(0);
	}

	/* One relay at a time: two would break per-key order (I4). */
	if (!outbox_relay_claim())
	{
		ereport(LOG,
				(errmsg("outbox relay not started for database \"%s\": relay process %d is still running",
						dbname, (int) outbox_relay_running())));
		proc_exit(0);
	}

	/*
	 * The relay runs as a superuser: whatever search_path the database or a
	 * role sets, every function and operator in its queries must resolve in
	 * pg_catalog (tables are schema-qualified), or whoever can create a
	 * schema and set the database's search_path runs code as superuser.
	 */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET,
					PGC_S_OVERRIDE);

	/*
	 * Its transactions are READ COMMITTED and may write, whatever the
	 * database or role says: retention, progress and replay rely on each
	 * statement seeing every commit before it.
	 */
	SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET,
					PGC_S_OVERRIDE);
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET,
					PGC_S_OVERRIDE);
	ereport(LOG,
			(errmsg("outbox relay started for database \"%s\"", dbname)));

	relay_cxt = AllocSetContextCreate(TopMemoryContext, "outbox relay",
									  ALLOCSET_DEFAULT_SIZES);
	relay_kinds = relay_transports;

	before_shmem_exit(relay_worker_exit, (Datum) 0);

	{
		int			fds[8];
		int			nfds = 0;
		int			i;

		/* Each transport may give a descriptor to wait on. */
		for (i = 0; relay_transports[i] != NULL; i++)
		{
			const RelayTransport *tr = relay_transports[i];
			int			fd = -1;

			if (tr->start != NULL)
				fd = tr->start();
			else if (tr->conn_set != NULL)
				fd = relay_conn_set_start(tr->conn_set);

			if (fd >= 0 && nfds < lengthof(fds))
				fds[nfds++] = fd;
		}
		wait_set = outbox_create_wait_event_set(2 + nfds);
		AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (i = 0; i < nfds; i++)
			AddWaitEventToSet(wait_set, WL_SOCKET_READABLE, fds[i], NULL, NULL);

		/* The same without the latch, for the pause after a read. */
		quiet_set = outbox_create_wait_event_set(1 + nfds);
		AddWaitEventToSet(quiet_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		for (i = 0; i < nfds; i++)
			AddWaitEventToSet(quiet_set, WL_SOCKET_READABLE, fds[i], NULL, NULL);
	}

	/*
	 * An error the extension's drop caused (a read under way when it
	 * committed) ends in the same stop as the drop's notice.  Any other is
	 * kept for outbox.relays, and the relay exits with it.
	 */
	PG_TRY();
	{
		relay_loop(wait_set, quiet_set);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(TopMemoryContext);
		edata = CopyErrorData();
		if (outbox_error_from_drop())
			relay_extension_dropped(dbname, edata->message);
		outbox_relay_set_error(edata->message);
		ReThrowError(edata);
	}
	PG_END_TRY();
}

/* The relay's loop: read, dispatch, record, sleep; never returns. */
static void
relay_loop(WaitEventSet *wait_set, WaitEventSet *quiet_set)
{
	uint64		loaded_generation = 0;
	bool		force_reload = true;
	bool		ready = false;
	bool		waiting_logged = false;
	const char *dbname = MyBgworkerEntry->bgw_extra;

	for (;;)
	{
		WaitEvent	event;
		int64		frontier = 0;
		TimestampTz now;
		long		timeout;
		bool		did_read = false;
		XLogRecPtr	commit_end;
		long		standby_recheck = -1;

		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			relay_shutdown();

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			force_reload = true;
		}

		if (!ready)
		{
			ready = outbox_extension_installed();
			if (!ready)
			{
				if (!outbox_one_database_form())
					relay_extension_dropped(dbname, NULL);
				if (!waiting_logged)
					ereport(LOG,
							(errmsg("outbox relay is waiting for the extension to be created in database \"%s\"",
									dbname),
							 errhint("Run CREATE EXTENSION outbox in database \"%s\".",
									 dbname)));
				waiting_logged = true;
				relay_publish_stats(GetCurrentTimestamp(), "waiting for CREATE EXTENSION", false);
				/*
				 * CREATE EXTENSION wakes us when it commits.  The latch
				 * only: a transport's descriptor (a late acknowledgement)
				 * stays readable until a drive takes it, which waits for
				 * the extension, and would make this loop spin.
				 */
				(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
								 Min(outbox_poll_interval, 500), PG_WAIT_EXTENSION);
				ResetLatch(MyLatch);
				continue;
			}
			force_reload = true;
		}

		if (force_reload || outbox_config_generation() != loaded_generation)
		{
			force_reload = false;
			if (!outbox_extension_installed())
			{
				loaded_generation = outbox_config_generation();
				ready = false;
				waiting_logged = false;
				continue;
			}
			loaded_generation = relay_reload_config();
		}

		if (outbox_enabled && relay_targets != NIL)
		{
			if (!outbox_counter_valid())
			{
				Relation	rel;

				StartTransactionCommand();
				rel = outbox_open_messages(AccessShareLock);
				outbox_ensure_counter(rel);
				table_close(rel, AccessShareLock);
				CommitTransactionCommand();
			}
			frontier = outbox_compute_frontier();
			/* Subscriptions committed before the frontier must be known. */
			if (outbox_config_generation() != loaded_generation)
				loaded_generation = relay_reload_config();
			/* Deliver nothing whose commit is not durable (I7), ... */
			commit_end = outbox_flush_commits();
			/* ... nor anything a failover could undo (I9). */
			frontier = relay_standby_gate(frontier, commit_end, &standby_recheck);
			did_read = relay_read_messages(frontier);
		}
		else
		{
			/* no targets, or disabled: nothing waits for the standbys */
			relay_standby_hold.waiting = false;
			relay_standby_logged = false;
		}
		relay_stats_check_reset(GetCurrentTimestamp());

		/* Collect answers, then start what is due on the free lanes. */
		relay_drive();
		if (outbox_enabled)
			relay_dispatch(GetCurrentTimestamp());
		relay_drive();

		/*
		 * Targets replayed or with new lanes are made afresh from the
		 * tables once nothing of theirs is in flight (new lanes once they
		 * have delivered everything they read).
		 */
		{
			ListCell   *lc;

			foreach(lc, relay_targets)
			{
				RelayTarget *t = (RelayTarget *) lfirst(lc);

				if (!t->rebuild && outbox_enabled && relay_target_resizable(t) &&
					relay_target_idle(t))
				{
					if (relay_progress_pending())
						relay_write_progress();
					relay_resize_target(t);
				}
				if (t->rebuild && relay_target_in_flight(t) == 0)
					force_reload = true;
			}
		}

		/* Let autovacuum and the statistics views see our work. */
		pgstat_report_stat(false);

		now = GetCurrentTimestamp();
		timeout = relay_sleep_ms(frontier, now);
		if (relay_progress_pending())
		{
			/*
			 * Write when due, else wake up when it is due, idle or not: one
			 * message at a time, a write (a transaction and its WAL flush)
			 * per acknowledgement cost the relay more than the delivery.
			 */
			TimestampTz due = TimestampTzPlusMilliseconds(relay_last_progress_write,
														  RELAY_PROGRESS_INTERVAL_MS);

			/* (a clock set back does not put the write off) */
			if (now >= due || now < relay_last_progress_write)
			{
				relay_write_progress();
				/* a write that gave way to a lock is tried again soon */
				if (relay_progress_pending())
					timeout = Min(timeout, RELAY_PROGRESS_INTERVAL_MS);
			}
			else
				timeout = Min(timeout, TimestampDifferenceMilliseconds(now, due));
		}

		relay_publish_stats(now, !outbox_enabled ? "disabled (outbox.enabled = off)" :
							relay_in_flight() > 0 || did_read ? "delivering" :
							relay_standby_hold.waiting ? "waiting for standby" : "idle",
							false);
		if (standby_recheck >= 0)
			timeout = Min(timeout, standby_recheck);

		/* Empty finished chunks (I8), whether or not there are targets. */
		timeout = Min(timeout, relay_retention_maybe(now));

		if (did_read && timeout > 0)
		{
			long		pause = Min(timeout, RELAY_READ_PAUSE_MS);

			if (WaitEventSetWait(quiet_set, pause, &event, 1, PG_WAIT_EXTENSION) > 0 &&
				(event.events & WL_SOCKET_READABLE))
				continue;
			timeout -= pause;
		}
		if (force_reload)
			timeout = 0;
		else if (relay_config_incomplete)
		{
			/* Load again soon: a target waits for its progress rows. */
			timeout = Min(timeout, RELAY_INCOMPLETE_RELOAD_MS);
			force_reload = true;
		}
		/*
		 * Messages wait for a streaming standby, and nothing else is due
		 * within the millisecond: look at its slot more often than a wait
		 * can (nothing wakes us when it confirms).
		 */
		if (standby_recheck == 1 && timeout > 0 && outbox_standby_wait(1000))
			timeout = 0;
		if (WaitEventSetWait(wait_set, timeout, &event, 1, PG_WAIT_EXTENSION) > 0 &&
			(event.events & WL_LATCH_SET))
			ResetLatch(MyLatch);
	}
}
