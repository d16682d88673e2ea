/*-------------------------------------------------------------------------
 *
 * relay_progress.c
 *	  Progress and dead-letter writes.
 *
 * Per lane, outbox.progress records the id up to which everything of the
 * lane is finished (delivered or dead-lettered), with counters and the last
 * error; dead letters (queued by relay_dead_letters.c) go to
 * outbox.dead_letters.  Both are written together in one short
 * transaction, batched over all lanes, at most 20 ms after an
 * acknowledgement and no more often (relay_main.c): a crash can only make
 * the relay send again what it may not have recorded (I5).  Batches cut
 * short of batch_size are recorded, durably, before they are sent, so a
 * restart cuts them the same way.
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

TimestampTz relay_last_progress_write = 0;

static SPIPlanPtr progress_plan = NULL;

/*
 * The relay's progress write: every lane that moved, in one statement, its
 * values in arrays (one element a lane), so that a write costs one
 * executor run and one scan of outbox.progress, not one of each a lane (at
 * 32 lanes, 32 of them were most of the write).  Schema 0.2 adds the
 * replay generation check.
 */
#define RELAY_PROGRESS_UPDATE(failing) \
	"UPDATE outbox.progress p" \
	"   SET " failing "done_id = greatest(p.done_id, v.done_id)," \
	"       last_delivered_id = coalesce(v.last_delivered_id, p.last_delivered_id)," \
	"       delivered = p.delivered + v.delivered, dead = p.dead + v.dead," \
	"       attempts = v.attempts," \
	"       last_status = coalesce(v.last_status, p.last_status)," \
	"       last_error = coalesce(v.last_error, p.last_error)," \
	"       last_error_at = coalesce(v.last_error_at, p.last_error_at)" \
	"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)," \
	"                  pg_catalog.unnest($3), pg_catalog.unnest($4)," \
	"                  pg_catalog.unnest($5), pg_catalog.unnest($6)," \
	"                  pg_catalog.unnest($7), pg_catalog.unnest($8)," \
	"                  pg_catalog.unnest($9), pg_catalog.unnest($10)," \
	"                  pg_catalog.unnest($11), pg_catalog.unnest($12)," \
	"                  pg_catalog.unnest($13))" \
	"       AS v(target_id, lane, done_id, last_delivered_id, delivered, dead," \
	"            attempts, last_status, last_error, last_error_at, generation," \
	"            failing_id, aside_done)" \
	" WHERE p.target_id = v.target_id AND p.lane = v.lane"
#define RELAY_PROGRESS_COLUMNS	13

/* The element types of the progress write's arrays, in order. */
static const Oid relay_progress_types[RELAY_PROGRESS_COLUMNS] = {
	INT4OID, INT4OID, INT8OID, INT8OID, INT8OID, INT8OID, INT4OID, INT4OID,
	TEXTOID, TIMESTAMPTZOID, INT4OID, INT8OID, INT8OID
};

/*
 * A one-dimensional array of n values of type (one of
 * relay_progress_types), nulls[i] true for a null element.
 */
static Datum
relay_progress_array(Oid type, Datum *values, bool *nulls, int n)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		len;
	bool		byval;
	char		align;

	get_typlenbyvalalign(type, &len, &byval, &align);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, type,
											  len, byval, align));
}

/* What a dead letter recorded again updates (both schemas). */
#define RELAY_DEAD_LETTER_CONFLICT \
	" ON CONFLICT (target, id) DO UPDATE" \
	"   SET attempts = excluded.attempts, last_status = excluded.last_status," \
	"       last_error = excluded.last_error, failed_at = excluded.failed_at"
static SPIPlanPtr dead_letter_plan = NULL;
static bool dead_letter_plan_keeps = false;	/* prepared to keep payloads */
static int	progress_plan_schema = -1;	/* prepared for: generation check
										 * (1), failing_id (2) */

bool
relay_progress_pending(void)
{
	ListCell   *lc;

	if (relay_dead_letter_writes_pending())
		return true;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (t->disable_reason != NULL)
			return true;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			if (lane->delivered_delta || lane->dead_delta || lane->error_dirty ||
				relay_lane_done_position(lane) != lane->done_id ||
				(lane->aside_answered && lane->aside_id != 0))
				return true;
		}
	}
	return false;
}

/*
 * Record, in one transaction, the progress of every lane that moved and
 * the dead letters found since the last call.  (NOTIFY targets record
 * their deliveries themselves; here they only advance past messages they
 * do not subscribe to.)
 */
static void relay_write_progress_once(void);

void
relay_write_progress(void)
{
	MemoryContext oldcxt = CurrentMemoryContext;

	/*
	 * An admin statement updating progress rows of several targets (two
	 * replays in one transaction, say) can deadlock with this write.  Then
	 * this transaction is the one rolled back: what it would have written is
	 * still in memory, and is written at the next turn.  Nothing is
	 * forgotten before the commit (see below).
	 */
	PG_TRY();
	{
		relay_write_progress_once();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_T_R_DEADLOCK_DETECTED &&
			edata->sqlerrcode != ERRCODE_T_R_SERIALIZATION_FAILURE &&
			edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		{
			FreeErrorData(edata);
			PG_RE_THROW();
		}
		FlushErrorState();
		AbortCurrentTransaction();
		ereport(LOG,
				(errmsg("outbox relay will record its progress again: %s", edata->message)));
		FreeErrorData(edata);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	PG_END_TRY();
}

static void
relay_write_progress_once(void)
{
	ListCell   *lc;
	RelayDeadLetter *d;
	Datum	   *values[RELAY_PROGRESS_COLUMNS];
	bool	   *isnull[RELAY_PROGRESS_COLUMNS];
	int			nlanes;
	int			n;
	int			k;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "recording outbox progress");

	if (progress_plan != NULL &&
		progress_plan_schema != ((relay_schema_operations ? 1 : 0) | (relay_schema_set_aside ? 2 : 0)))
	{
		/* The schema was updated under us. */
		SPI_freeplan(progress_plan);
		progress_plan = NULL;
	}
	if (progress_plan == NULL)
	{
		Oid			argtypes[RELAY_PROGRESS_COLUMNS];

		for (k = 0; k < RELAY_PROGRESS_COLUMNS; k++)
			argtypes[k] = get_array_type(relay_progress_types[k]);

		/*
		 * The generation check drops what the relay learnt before an
		 * outbox.replay() moved the lane back (the relay reloads it).
		 */
		progress_plan_schema = (relay_schema_operations ? 1 : 0) | (relay_schema_set_aside ? 2 : 0);
		progress_plan = SPI_prepare(relay_schema_set_aside ?
									RELAY_PROGRESS_UPDATE("failing_id = v.failing_id,"
															  " set_aside_reason = CASE WHEN p.set_aside_id = v.aside_done"
															  " THEN NULL ELSE p.set_aside_reason END,"
															  " set_aside_id = CASE WHEN p.set_aside_id = v.aside_done"
															  " THEN NULL ELSE p.set_aside_id END, ") " AND p.generation = v.generation" :
									relay_schema_operations ?
									RELAY_PROGRESS_UPDATE("") " AND p.generation = v.generation" :
									RELAY_PROGRESS_UPDATE("") " AND v.generation IS NOT NULL",
									RELAY_PROGRESS_COLUMNS, argtypes);
		if (progress_plan == NULL)
			elog(ERROR, "outbox: could not prepare the progress query");
		SPI_keepplan(progress_plan);
	}
	if (dead_letter_plan != NULL && dead_letter_plan_keeps != relay_dead_letters_keep_payload)
	{
		/* The schema was updated under us. */
		SPI_freeplan(dead_letter_plan);
		dead_letter_plan = NULL;
	}
	if (dead_letter_plan == NULL)
	{
		Oid			argtypes[8] = {TEXTOID, INT8OID, UUIDOID, TEXTOID, TEXTOID,
		INT4OID, INT4OID, TEXTOID};

		dead_letter_plan_keeps = relay_dead_letters_keep_payload;

		/*
		 * From schema 0.2 a dead letter keeps the message's payload,
		 * headers and emit time, so that retention may remove the message
		 * and the dead letter can still be delivered again.
		 */
		dead_letter_plan = SPI_prepare(relay_dead_letters_keep_payload ?
									   "INSERT INTO outbox.dead_letters"
									   " (target, id, msg_id, topic, key, attempts, last_status, last_error,"
									   "  payload, headers, emitted_at)"
									   " SELECT $1, $2, $3, $4, $5, $6, nullif($7, 0), $8,"
									   "        m.payload, m.headers, m.emitted_at"
									   "   FROM (VALUES (1)) v LEFT JOIN outbox.messages m ON m.id = $2"
									   RELAY_DEAD_LETTER_CONFLICT ","
									   "       payload = coalesce(excluded.payload, dead_letters.payload),"
									   "       headers = coalesce(excluded.headers, dead_letters.headers),"
									   "       emitted_at = coalesce(excluded.emitted_at, dead_letters.emitted_at),"
									   "       retry_requested_at = NULL" :
									   "INSERT INTO outbox.dead_letters"
									   " (target, id, msg_id, topic, key, attempts, last_status, last_error)"
									   " VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0), $8)"
									   RELAY_DEAD_LETTER_CONFLICT,
									   8, argtypes);
		if (dead_letter_plan == NULL)
			elog(ERROR, "outbox: could not prepare the dead letter query");
		SPI_keepplan(dead_letter_plan);
	}

	for (d = relay_dead_letters_queued(); d != NULL; d = d->next)
	{
		Datum		args[8];
		char		nulls[8] = "        ";

		args[0] = CStringGetTextDatum(d->target);
		args[1] = Int64GetDatum(d->id);
		args[2] = DirectFunctionCall1(uuid_in, CStringGetDatum(d->msg_id));
		args[3] = CStringGetTextDatum(d->topic);
		if (d->key)
			args[4] = CStringGetTextDatum(d->key);
		else
			nulls[4] = 'n';
		args[5] = Int32GetDatum(d->attempts);
		args[6] = Int32GetDatum(d->last_status);
		args[7] = CStringGetTextDatum(d->last_error);
		if (SPI_execute_plan(dead_letter_plan, args, nulls, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "outbox: could not record a dead letter");
	}

	/* Every lane that moved: one element of each array. */
	nlanes = 0;
	foreach(lc, relay_targets)
		nlanes += ((RelayTarget *) lfirst(lc))->nlanes;
	for (k = 0; k < RELAY_PROGRESS_COLUMNS; k++)
	{
		values[k] = palloc(sizeof(Datum) * Max(nlanes, 1));
		isnull[k] = palloc0(sizeof(bool) * Max(nlanes, 1));
	}
	n = 0;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];
			int64		done = relay_lane_done_position(lane);

			if (!(lane->delivered_delta || lane->dead_delta || lane->error_dirty ||
				  done != lane->done_id || (lane->aside_answered && lane->aside_id != 0)))
				continue;
			values[0][n] = Int32GetDatum(t->id);
			values[1][n] = Int32GetDatum(i);
			values[2][n] = Int64GetDatum(done);
			values[3][n] = Int64GetDatum(lane->last_delivered_id);
			isnull[3][n] = lane->last_delivered_id <= 0;
			values[4][n] = Int64GetDatum(lane->delivered_delta);
			values[5][n] = Int64GetDatum(lane->dead_delta);
			values[6][n] = Int32GetDatum(lane->attempts);
			values[7][n] = Int32GetDatum(lane->last_status);
			values[8][n] = (Datum) 0;
			values[9][n] = (Datum) 0;
			values[10][n] = Int32GetDatum(t->generation);
			values[11][n] = Int64GetDatum(lane->failing_id);
			isnull[11][n] = lane->failing_id == 0;
			/* a request of outbox.set_aside() acted on: cleared */
			values[12][n] = Int64GetDatum(lane->aside_id);
			isnull[12][n] = !lane->aside_answered || lane->aside_id == 0;
			if (lane->error_dirty && lane->last_error)
			{
				isnull[7][n] = lane->last_status == 0;
				values[8][n] = CStringGetTextDatum(lane->last_error);
				values[9][n] = TimestampTzGetDatum(lane->last_error_at);
			}
			else
			{
				isnull[7][n] = true;
				isnull[8][n] = true;
				isnull[9][n] = true;
			}
			n++;
		}
	}
	if (n > 0)
	{
		Datum		args[RELAY_PROGRESS_COLUMNS];

		for (k = 0; k < RELAY_PROGRESS_COLUMNS; k++)
			args[k] = relay_progress_array(relay_progress_types[k], values[k], isnull[k], n);
		if (SPI_execute_plan(progress_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not record progress");
	}

	/* Dead letters delivered again are gone. */
	foreach(lc, relay_retried_queued())
	{
		RelayRetried *r = (RelayRetried *) lfirst(lc);
		Datum		args[2];
		Oid			argtypes[2] = {TEXTOID, INT8OID};

		args[0] = CStringGetTextDatum(r->target);
		args[1] = Int64GetDatum(r->id);
		if (SPI_execute_with_args("DELETE FROM outbox.dead_letters"
								  " WHERE target = $1 AND id = $2 AND retry_requested_at IS NOT NULL",
								  2, argtypes, args, NULL, false, 0) != SPI_OK_DELETE)
			elog(ERROR, "outbox: could not remove a dead letter delivered again");
	}

	/* Targets that answered 410 Gone or failed for disable_after. */
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		Datum		args[2];
		Oid			argtypes[2] = {INT4OID, TEXTOID};

		if (t->disable_reason == NULL)
			continue;
		args[0] = Int32GetDatum(t->id);
		args[1] = CStringGetTextDatum(t->disable_reason);
		if (SPI_execute_with_args("UPDATE outbox.targets"
								  "   SET state = 'disabled', state_reason = $2, state_changed_at = now()"
								  " WHERE id = $1 AND state = 'active'",
								  2, argtypes, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not disable a target");
	}

	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	/* Durable now: forget what was written. */
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			lane->done_id = relay_lane_done_position(lane);
			lane->delivered_delta = 0;
			lane->dead_delta = 0;
			lane->error_dirty = false;
			if (lane->aside_answered)
			{
				lane->aside_id = 0;
				lane->aside_answered = false;
			}
		}
	}
	relay_dead_letters_written();
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->disable_reason != NULL)
		{
			pfree(t->disable_reason);
			t->disable_reason = NULL;
			/* The row changed under the options loaded: load them again. */
			t->fingerprint = NULL;
		}
	}
	relay_last_progress_write = GetCurrentTimestamp();
}

/*
 * Record, durably and in one transaction, the batches cut short of
 * batch_size that the lanes in cut[0..n) are about to send.
 */
void
relay_record_cuts(RelayLane **cut, int n)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	SPIPlanPtr	plan;
	int			i;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "recording outbox batches");
	plan = plans[relay_schema_operations];
	if (plan == NULL)
	{
		Oid			argtypes[4] = {INT4OID, INT4OID, INT8OID, INT4OID};

		/* Not over a replay (see relay_write_progress). */
#define RELAY_CUT_UPDATE \
	"UPDATE outbox.progress SET batch_end = $3 WHERE target_id = $1 AND lane = $2"
		plan = SPI_prepare(relay_schema_operations ?
						   RELAY_CUT_UPDATE " AND generation = $4" :
						   RELAY_CUT_UPDATE " AND $4 IS NOT NULL", 4, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the batch query");
		SPI_keepplan(plan);
		plans[relay_schema_operations] = plan;
	}
	for (i = 0; i < n; i++)
	{
		Datum		args[4];

		args[0] = Int32GetDatum(cut[i]->target->id);
		args[1] = Int32GetDatum(cut[i]->index);
		args[2] = Int64GetDatum(cut[i]->cut_last);
		args[3] = Int32GetDatum(cut[i]->target->generation);
		if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not record a batch");
	}
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	/* Durable before the request goes, whatever synchronous_commit says. */
	XLogFlush(XactLastCommitEnd);
	pgstat_report_activity(STATE_IDLE, NULL);
	for (i = 0; i < n; i++)
		cut[i]->batch_end = cut[i]->cut_last;
}

/*
 * Record that the NOTIFY target's lane notified n messages, the last being
 * last_id, and is finished up to done.  The caller holds the transaction
 * that sent the notifications.
 */
void
relay_progress_notified(RelayTarget *t, int n, int64 last_id, int64 done)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	SPIPlanPtr	plan = plans[relay_schema_operations];
	Datum		args[5];

	if (plan == NULL)
	{
		Oid			argtypes[5] = {INT4OID, INT8OID, INT8OID, INT8OID, INT4OID};

		/* Not over a replay (see relay_write_progress). */
#define RELAY_NOTIFIED_UPDATE \
	"UPDATE outbox.progress" \
	"   SET done_id = greatest(done_id, $2), last_delivered_id = $3," \
	"       delivered = delivered + $4, attempts = 0" \
	" WHERE target_id = $1 AND lane = 0"
		plan = SPI_prepare(relay_schema_operations ?
						   RELAY_NOTIFIED_UPDATE " AND generation = $5" :
						   RELAY_NOTIFIED_UPDATE " AND $5 IS NOT NULL",
						   5, argtypes);
		if (plan == NULL)
			elog(ERROR, "outbox: could not prepare the NOTIFY progress query");
		SPI_keepplan(plan);
		plans[relay_schema_operations] = plan;
	}
	args[0] = Int32GetDatum(t->id);
	args[1] = Int64GetDatum(done);
	args[2] = Int64GetDatum(last_id);
	args[3] = Int64GetDatum(n);
	args[4] = Int32GetDatum(t->generation);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: could not record NOTIFY progress");
}

/*
 * Give target t the lanes (and ordering) outbox.alter_target() asked for.
 * Its lanes are idle: everything up to its read position is finished, so
 * every lane of the new layout starts there and no key's order can break.
 * The counts of lanes that go are kept in lane 0.  The target is then made
 * afresh from the tables.
 */
void
relay_resize_target(RelayTarget *t)
{
	Oid			argtypes[4] = {INT4OID, INT4OID, INT8OID, INT4OID};
	Datum		args[4];

	args[0] = Int32GetDatum(t->id);
	args[1] = Int32GetDatum(t->pending_lanes);
	args[2] = Int64GetDatum(t->read_id);
	args[3] = Int32GetDatum(t->generation);

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "changing the lanes of an outbox target");

	/*
	 * Only what is still asked for (alter_target may have run since), and
	 * not over a replay (which the reload that follows takes up).
	 */
	if (SPI_execute_with_args("UPDATE outbox.targets"
							  "   SET lanes = $2, ordering = coalesce(pending_ordering, ordering),"
							  "       pending_lanes = NULL, pending_ordering = NULL"
							  " WHERE id = $1 AND coalesce(pending_lanes, lanes) = $2"
							  "   AND $3 IS NOT NULL"
							  "   AND NOT EXISTS (SELECT 1 FROM outbox.progress p"
							  "                    WHERE p.target_id = $1 AND p.generation <> $4)",
							  4, argtypes, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: could not change the lanes of target \"%s\"", t->name);
	if (SPI_processed != 1)
	{
		PopActiveSnapshot();
		SPI_finish();
		AbortCurrentTransaction();
		pgstat_report_activity(STATE_IDLE, NULL);
		t->fingerprint = NULL;	/* read the row again */
		outbox_bump_config_generation(false);
		return;
	}
	if (SPI_execute_with_args("UPDATE outbox.progress p"
							  "   SET delivered = p.delivered + x.delivered, dead = p.dead + x.dead"
							  "  FROM (SELECT sum(delivered) AS delivered, sum(dead) AS dead"
							  "          FROM outbox.progress WHERE target_id = $1 AND lane >= $2) x"
							  " WHERE p.target_id = $1 AND p.lane = 0 AND x.delivered IS NOT NULL"
							  "   AND $3 IS NOT NULL AND $4 IS NOT NULL",
							  4, argtypes, args, NULL, false, 0) != SPI_OK_UPDATE ||
		SPI_execute_with_args("DELETE FROM outbox.progress WHERE target_id = $1 AND lane >= $2"
							  "   AND $3 IS NOT NULL AND $4 IS NOT NULL",
							  4, argtypes, args, NULL, false, 0) != SPI_OK_DELETE ||
		SPI_execute_with_args("INSERT INTO outbox.progress (target_id, lane, done_id, generation)"
							  " SELECT $1, g, $3, $4 FROM pg_catalog.generate_series(0, $2 - 1) g"
							  " ON CONFLICT DO NOTHING",
							  4, argtypes, args, NULL, false, 0) != SPI_OK_INSERT ||
		SPI_execute_with_args("UPDATE outbox.progress"
							  "   SET done_id = $3, batch_end = NULL, generation = $4"
							  " WHERE target_id = $1 AND $2 IS NOT NULL",
							  4, argtypes, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: could not change the lanes of target \"%s\"", t->name);
	PopActiveSnapshot();
	SPI_finish();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	ereport(LOG,
			(errmsg("outbox relay: target \"%s\" now has %d lanes", t->name, t->pending_lanes)));
	t->rebuild = true;
}
