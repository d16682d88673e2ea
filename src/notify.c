/*-------------------------------------------------------------------------
 *
 * notify.c
 *	  Delivery to PostgreSQL NOTIFY channels.
 *
 * A NOTIFY target is a single lane.  Its queued messages are notified and
 * its progress row advanced in one transaction, so a listener sees each
 * message once and in commit order: the notifications and the progress
 * commit together or not at all.  Each notification carries the message's
 * JSON envelope; when the envelope would exceed NOTIFY's payload limit, it
 * is sent without the payload and with "payload_omitted": true, and the
 * listener reads the message from outbox.messages by its seq.
 *
 * An envelope whose headers alone are too large drops them as well
 * ("headers_omitted": true).  A failure (the notification queue is full,
 * for example) rolls the transaction back; the messages stay queued and are
 * retried with backoff, and the error shows in outbox.lag.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Most notifications sent in one transaction. */
#define RELAY_NOTIFY_BATCH	1000

/* NOTIFY refuses payloads of NOTIFY_PAYLOAD_MAX_LENGTH (8000) bytes or more. */
#define RELAY_NOTIFY_MAX_PAYLOAD	7999

static SPIPlanPtr notify_progress_plan = NULL;

/*
 * Notify the target's queued messages and record its progress, in one
 * transaction.  Returns the number of messages still queued.
 */
int
relay_notify_deliver(RelayTarget *t)
{
	RelayLane  *lane = &t->lanes[0];
	MemoryContext oldcxt = CurrentMemoryContext;
	RelayMessage *m;
	volatile int n = 0;
	volatile int64 last_id = 0;
	StringInfoData buf;

	if (lane->nqueued == 0)
		return 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	pgstat_report_activity(STATE_RUNNING, "notifying outbox listeners");

	PG_TRY();
	{
		Datum		args[4];

		initStringInfo(&buf);
		for (m = lane->head; m != NULL && n < RELAY_NOTIFY_BATCH; m = m->next)
		{
			resetStringInfo(&buf);
			relay_envelope(m, RELAY_ENVELOPE_ALL, &buf);
			if (buf.len > RELAY_NOTIFY_MAX_PAYLOAD)
			{
				resetStringInfo(&buf);
				relay_envelope(m, RELAY_ENVELOPE_HEADERS, &buf);
			}
			if (buf.len > RELAY_NOTIFY_MAX_PAYLOAD)
			{
				/* Headers too large as well: name the message only. */
				resetStringInfo(&buf);
				relay_envelope(m, 0, &buf);
			}
			Async_Notify(t->channel, buf.data);
			last_id = m->id;
			n++;
		}

		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (notify_progress_plan == NULL)
		{
			Oid			argtypes[4] = {INT4OID, INT8OID, INT8OID, INT8OID};

			notify_progress_plan =
				SPI_prepare("UPDATE outbox.progress"
							"   SET done_id = greatest(done_id, $2), last_delivered_id = $3,"
							"       delivered = delivered + $4, attempts = 0"
							" WHERE target_id = $1 AND lane = 0",
							4, argtypes);
			if (notify_progress_plan == NULL)
				elog(ERROR, "outbox: could not prepare the NOTIFY progress query");
			SPI_keepplan(notify_progress_plan);
		}
		args[0] = Int32GetDatum(t->id);
		args[1] = Int64GetDatum(n == lane->nqueued ? Max(last_id, t->read_id) : last_id);
		args[2] = Int64GetDatum(last_id);
		args[3] = Int64GetDatum(n);
		if (SPI_execute_plan(notify_progress_plan, args, NULL, false, 0) != SPI_OK_UPDATE)
			elog(ERROR, "outbox: could not record NOTIFY progress");
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;
		int64		delay;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();

		lane->attempts++;
		delay = relay_backoff_ms(lane->attempts, 0);
		lane->next_attempt = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
		relay_lane_set_error(lane, 0, edata->message);	/* shown in outbox.lag */
		ereport(LOG,
				(errmsg("outbox relay could not notify channel \"%s\" of target \"%s\": %s",
						t->channel, t->name, edata->message),
				 errdetail("Retrying in " INT64_FORMAT " ms.", delay)));
		FreeErrorData(edata);
		pgstat_report_activity(STATE_IDLE, NULL);
		return 0;
	}
	PG_END_TRY();

	pgstat_report_activity(STATE_IDLE, NULL);

	/* Committed: the messages are delivered. */
	lane->delivered_delta = 0;
	lane->last_delivered_id = last_id;
	lane->attempts = 0;
	lane->next_attempt = 0;
	lane->done_id = (n == lane->nqueued) ? Max(last_id, t->read_id) : last_id;
	while (n-- > 0)
		pfree(relay_lane_pop(lane));
	return lane->nqueued;
}
