/*-------------------------------------------------------------------------
 *
 * relay_notify.c
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
 * ("headers_omitted": true).  The transaction is this file's too; the
 * progress it records is relay_progress.c's.
 * A failure (the notification queue is full, for example) rolls the
 * transaction back; the messages stay queued and are retried with backoff,
 * and the error shows in outbox.lag.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "relay.h"

/* Most notifications sent in one transaction. */
#define RELAY_NOTIFY_BATCH	1000

/* NOTIFY refuses payloads of NOTIFY_PAYLOAD_MAX_LENGTH (8000) bytes or more. */
#define RELAY_NOTIFY_MAX_PAYLOAD	7999

/*
 * Notify the channel of up to RELAY_NOTIFY_BATCH messages from the head of
 * the lane, in order.  The caller holds the transaction the notifications
 * are sent with: they go out if and only if it commits, together with the
 * progress it records.  Returns the number notified; errors (the
 * notification queue is full, say) are thrown to the caller.
 */
static int
relay_notify_send(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m;
	int			n = 0;
	StringInfoData buf;

	initStringInfo(&buf);
	for (m = lane->head; m != NULL && n < RELAY_NOTIFY_BATCH; m = m->next)
	{
		resetStringInfo(&buf);
		/* envelope_only: listeners read the message from a table. */
		relay_envelope(m, t->envelope_only ? 0 : RELAY_ENVELOPE_ALL, &buf);
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
		n++;
	}
	pfree(buf.data);
	lane->nbatch = n;
	return n;
}

/*
 * Deliver a NOTIFY target's queued messages: notify and record progress in
 * one transaction, so a listener sees each message once, in order.
 */
static void
relay_notify_deliver(RelayTarget *t)
{
	RelayLane  *lane = &t->lanes[0];
	MemoryContext oldcxt = CurrentMemoryContext;
	volatile int64 done = 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	pgstat_report_activity(STATE_RUNNING, "notifying outbox listeners");
	PG_TRY();
	{
		int			n = relay_notify_send(lane);
		RelayMessage *last = lane->head;
		int			i;

		t->stats.requests += n;
		t->stats.bytes += last->payload_len;
		for (i = 1; i < n; i++)
		{
			last = last->next;
			t->stats.bytes += last->payload_len;
		}
		/* All of it sent: finished up to what was read. */
		done = (n == lane->nqueued) ? Max(last->id, t->read_id) : last->id;
		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		relay_progress_notified(t, n, last->id, done);
		PopActiveSnapshot();
		SPI_finish();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		relay_lane_retry_later(lane, edata->message);
		FreeErrorData(edata);
		pgstat_report_activity(STATE_IDLE, NULL);
		return;
	}
	PG_END_TRY();
	pgstat_report_activity(STATE_IDLE, NULL);
	relay_lane_notified(lane, done);
}

const RelayTransport relay_notify_transport = {
	.kind = "notify",
	.id = RELAY_NOTIFY,
	.deliver = relay_notify_deliver,
};
