/*-------------------------------------------------------------------------
 *
 * relay_lane.c
 *	  Lanes: the FIFO of one target and key hash, its caps, what an outcome
 *	  does to it, backoff, and how its next batch is cut.
 *
 * A lane has at most one request in flight, so the messages of one key go
 * one after another in id order (I4); a pipelined target's lane has a
 * window of them, its broker keeping their order per key.  Its queue is capped in messages and
 * in bytes (a share of outbox.relay_memory); a lane that fills up stops
 * taking messages and reads its own again once it drains (overflow_id).
 * A transport reports an outcome (relay.h) and the lane decides: delivered
 * pops the batch; retry waits with exponential backoff and jitter, then
 * dead-letters after max_attempts; rejected dead-letters at once; a
 * receiver-wide failure holds the whole target, dead-lettering nothing,
 * while one lane probes.  A batch is cut so that, sent again after a
 * failure or a restart, it has the same members (relay_lane_cut).
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

#include "mb/pg_wchar.h"

#include "relay.h"

/* Least number of messages a target may have queued before reading stops. */
#define RELAY_MIN_QUEUE				10000

int
relay_queue_cap(RelayTarget *t)
{
	return Max(RELAY_MIN_QUEUE, 4 * t->nlanes * t->batch_size);
}

/*
 * Messages one lane may hold: half the target's read-ahead (all of it with
 * one lane).  A lane that retries for a long time fills up and stops taking
 * messages (remembering where, in overflow_id) while the other lanes keep
 * going with the other half; it reads its own messages again once it
 * drains.  Half, not an even share, so that lanes do not overflow, and
 * re-read, in an ordinary backlog of uneven keys.
 */
int
relay_lane_cap(RelayTarget *t)
{
	if (t->nlanes == 1)
		return relay_queue_cap(t);
	return Max(4 * t->batch_size, relay_queue_cap(t) / 2);
}

/*
 * Bytes of messages a target may have queued: half its even share of
 * outbox.relay_memory (the request bodies built from them take at most as
 * much again).
 */
Size
relay_queue_bytes(RelayTarget *t)
{
	Size		total = (Size) outbox_relay_memory * 1024;

	return Max(total / Max(list_length(relay_targets), 1) / 2, 64 * 1024);
}

/* Bytes one lane may hold: as relay_lane_cap(), half of the target's. */
Size
relay_lane_bytes(RelayTarget *t)
{
	if (t->nlanes == 1)
		return relay_queue_bytes(t);
	return relay_queue_bytes(t) / 2;
}

/*
 * Whether target t has room for the message that last did not fit, so that
 * a read does not stop at once (and the loop does not spin on it).
 */
bool
relay_target_has_room(RelayTarget *t)
{
	return t->nqueued == 0 ||
		t->queued_bytes + Max(t->read_need, 1) <= relay_queue_bytes(t);
}

bool
relay_lane_needs_refill(RelayLane *lane)
{
	return lane->overflow_id != 0 && relay_target_has_room(lane->target) &&
		(lane->nqueued == 0 ||
		 lane->queued_bytes + lane->refill_need <= relay_lane_bytes(lane->target)) &&
		lane->nqueued <= relay_lane_cap(lane->target) / 2 &&
		lane->queued_bytes <= relay_lane_bytes(lane->target) / 2;
}

void
relay_lane_push(RelayLane *lane, RelayMessage *m)
{
	m->next = NULL;
	if (lane->tail)
		lane->tail->next = m;
	else
		lane->head = m;
	lane->tail = m;
	lane->nqueued++;
	lane->target->nqueued++;
	lane->queued_bytes += m->mem_size;
	lane->target->queued_bytes += m->mem_size;
}

RelayMessage *
relay_lane_pop(RelayLane *lane)
{
	RelayMessage *m = lane->head;

	Assert(m != NULL);
	lane->head = m->next;
	if (lane->head == NULL)
	{
		lane->tail = NULL;
		lane->unroutable_since = 0; /* no run of refusals goes on */
	}
	if (m->id == lane->failing_id)
		lane->failing_id = 0;	/* its row is written: delivered or dead */
	if (m->id == lane->unroutable_id)
		lane->unroutable_id = 0;	/* its own refusals end with it */
	lane->nqueued--;
	lane->target->nqueued--;
	lane->queued_bytes -= m->mem_size;
	lane->target->queued_bytes -= m->mem_size;
	return m;
}

/*
 * Drop the lane's queued messages with ids above bound (never in flight);
 * dead letters delivered again stay (they were not read from the range).
 */
void
relay_lane_truncate(RelayLane *lane, int64 bound)
{
	RelayMessage *m = lane->head;
	RelayMessage *prev = NULL;

	while (m != NULL)
	{
		RelayMessage *next = m->next;

		if (m->retry || m->id <= bound)
		{
			prev = m;
			m = next;
			continue;
		}
		if (prev)
			prev->next = next;
		else
			lane->head = next;
		lane->nqueued--;
		lane->target->nqueued--;
		lane->queued_bytes -= m->mem_size;
		lane->target->queued_bytes -= m->mem_size;
		pfree(m);
		m = next;
	}
	lane->tail = prev;
}

/* The id up to which everything of the lane is finished. */
int64
relay_lane_done_position(RelayLane *lane)
{
	RelayMessage *m = lane->head;

	/* Dead letters delivered again sit below done_id: not positions. */
	while (m != NULL && m->retry)
		m = m->next;
	if (m != NULL)
		return Max(lane->done_id, m->id - 1);
	if (lane->overflow_id != 0)
		return Max(lane->done_id, lane->overflow_id - 1);
	return Max(lane->done_id, lane->target->read_id);
}

void
relay_lane_set_error(RelayLane *lane, int status, const char *error)
{
	RelayTarget *t = lane->target;

	int			len = strlen(error);

	if (lane->last_error)
		pfree(lane->last_error);
	/* Short: last_error is for people, and a receiver may be hostile. */
	if (len > RELAY_MAX_ERROR_LEN)
		len = pg_mbcliplen(error, len, RELAY_MAX_ERROR_LEN);
	lane->last_error = MemoryContextAlloc(t->cxt, len + 1);
	memcpy(lane->last_error, error, len);
	lane->last_error[len] = '\0';
	lane->last_status = status;
	lane->last_error_at = GetCurrentTimestamp();
	lane->error_dirty = true;
	/* What outbox.set_aside() may take; a retried dead letter is one already. */
	lane->failing_id = (lane->head != NULL && !lane->head->retry) ? lane->head->id : 0;
}

/* The head batch was acknowledged. */
static void
relay_lane_succeeded(RelayLane *lane)
{
	int			i;
	TimestampTz now = GetCurrentTimestamp();
	OutboxTargetStats *stats = &lane->target->stats;

	stats->messages += lane->nbatch;
	stats->last_success_at = now;
	for (i = 0; i < lane->nbatch; i++)
	{
		RelayMessage *m = relay_lane_pop(lane);

		outbox_stats_latency(stats, (now - m->emitted_at) / 1000.0, now);
		if (m->retry)
		{
			relay_retry_delivered(lane->target, m->id);
			lane->target->nretry--;
		}
		else
			lane->last_delivered_id = Max(lane->last_delivered_id, m->id);
		pfree(m);
	}
	lane->delivered_delta += lane->nbatch;
	lane->nbatch = 0;
	lane->retry_nbatch = 0;
	lane->attempts = 0;
	lane->next_attempt = 0;
	lane->unroutable_since = 0;
}

/* Exponential backoff with jitter, at least Retry-After. */
int64
relay_backoff_ms(int attempts, int retry_after_s)
{
	double		delay = outbox_retry_base_delay;
	int			i;

	for (i = 1; i < attempts && delay < outbox_retry_max_delay; i++)
		delay *= 2;
	delay = Min(delay, (double) outbox_retry_max_delay);
	delay *= 0.5 + 0.5 * pg_prng_double(&pg_global_prng_state);
	if (retry_after_s > 0)
		delay = Max(delay, retry_after_s * 1000.0);
	return (int64) delay;
}

/*
 * Try the head batch again after a backoff (its members kept), the backoff
 * of the given number of attempts.
 */
static void
relay_lane_retry(RelayLane *lane, int attempts, int retry_after_s)
{
	lane->target->stats.retries++;
	lane->next_attempt =
		TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
									relay_backoff_ms(attempts, retry_after_s));
	lane->retry_nbatch = lane->nbatch;
	lane->nbatch = 0;
}

/*
 * The head batch (nbatch messages) becomes dead letters, recorded with the
 * given number of attempts; the lane moves on.
 */
static void
relay_lane_dead_letter(RelayLane *lane, int attempts, int status, const char *error)
{
	RelayTarget *t = lane->target;
	int			i;

	for (i = 0; i < lane->nbatch; i++)
	{
		RelayMessage *m = relay_lane_pop(lane);

		relay_add_dead_letter(t, m->id, m->msg_id, m->topic, m->key,
							  attempts, status, error);
		if (m->retry)
		{
			/* Still a dead letter (counted once). */
			t->nretry--;
			lane->dead_delta--;
		}
		pfree(m);
	}
	lane->dead_delta += lane->nbatch;
	t->stats.dead_letters += lane->nbatch;
	lane->nbatch = 0;
	lane->retry_nbatch = 0;
	lane->attempts = 0;
	lane->next_attempt = 0;
}

/* The head batch failed: retry it later, or dead-letter it. */
static void
relay_lane_failed(RelayLane *lane, bool retryable, int status,
				  const char *error, int retry_after_s)
{
	RelayTarget *t = lane->target;

	lane->attempts++;
	relay_lane_set_error(lane, status, error);
	lane->unroutable_since = 0; /* a run of refusals is broken */

	if (retryable && (t->max_attempts == 0 || lane->attempts < t->max_attempts))
		relay_lane_retry(lane, lane->attempts, retry_after_s);
	else
		relay_lane_dead_letter(lane, lane->attempts, status, error);
}

/*
 * The broker does not take the destination the head message filled in (a
 * subject no stream covers, a routing key no queue is bound to, a topic the
 * cluster lacks): the message's own doing (I10), so the lane alone tries it
 * again (the broker may be given the destination meanwhile; these refusals
 * have a backoff of their own and do not count toward max_attempts), and
 * it becomes a dead letter once the lane has been refused for the target's
 * unroutable_after.  The clock is the lane's, from its first refusal since
 * it last delivered, emptied or failed otherwise, so that a run of such
 * messages holds the lane's other keys for unroutable_after in all, not for
 * each of them.  A broker that takes nothing (a stream deleted under a
 * '{topic}' subject) is not told from a destination it lacks: waiting for
 * another message to be delivered first would let an emitter hold every
 * lane with one message each, so its messages too become dead letters
 * (outbox.retry_dead_letters() sends them again).
 *
 * The broker answered: a hold this lane probed for is released.
 */
static void
relay_lane_unroutable(RelayLane *lane, const char *error)
{
	RelayTarget *t = lane->target;
	TimestampTz now = GetCurrentTimestamp();

	lane->nbatch = 1;
	if (lane->unroutable_id != lane->head->id)
	{
		lane->unroutable_id = lane->head->id;
		lane->unroutable_attempts = 0;
	}
	if (lane->unroutable_since == 0)
		lane->unroutable_since = now;
	lane->unroutable_attempts++;
	relay_lane_set_error(lane, 0, error);
	if (t->hold_attempts > 0 && lane->index == t->probe_lane)
	{
		t->hold_attempts = 0;
		t->held_until = 0;
	}
	if (t->unroutable_after_ms > 0 &&
		now - lane->unroutable_since >= t->unroutable_after_ms * 1000)
	{
		char	   *why;

		if (t->unroutable_after_ms % 1000 == 0)
			why = psprintf("%s; refused for the target's unroutable_after (" INT64_FORMAT " s)",
						   error, t->unroutable_after_ms / 1000);
		else
			why = psprintf("%s; refused for the target's unroutable_after (" INT64_FORMAT " ms)",
						   error, t->unroutable_after_ms);
		relay_lane_dead_letter(lane, lane->unroutable_attempts, 0, why);
		pfree(why);
		return;
	}
	relay_lane_retry(lane, lane->unroutable_attempts, 0);
}

/*
 * The receiver as a whole refused (the endpoint, not the message, is
 * wrong): hold the target.  Nothing is dead-lettered and the lane's attempts
 * do not count toward max_attempts; this lane probes again after a backoff
 * (up to outbox.retry_max_delay) while the other lanes wait, and the first
 * success releases them all, in order.
 */
static void
relay_lane_hold(RelayLane *lane, int status, const char *error,
				int retry_after_s)
{
	RelayTarget *t = lane->target;

	bool		counts;

	relay_lane_set_error(lane, status, error);
	t->stats.retries++;

	/*
	 * An attempt counts toward the backoff when it is the target's first
	 * failure or its probe's: requests of other lanes on the wire when the
	 * receiver went (a lost connection fails them all at once) tell nothing
	 * new, and counting each would send the backoff to its longest after
	 * a moment's outage.
	 */
	counts = t->hold_attempts == 0 || lane->index == t->probe_lane;
	if (counts)
	{
		t->hold_attempts++;
		t->probe_lane = lane->index;
	}
	if (t->hold_attempts == 1 && counts)
		t->failing_since = GetCurrentTimestamp();
	/* Nothing is dropped: the target keeps its messages until resumed. */
	if (t->disable_reason == NULL && t->state == 'a' && relay_schema_operations)
	{
		if (status == 410)
			t->disable_reason = MemoryContextStrdup(t->cxt, "the receiver answered 410 Gone");
		else if (t->disable_after_ms > 0 &&
				 GetCurrentTimestamp() - t->failing_since >= t->disable_after_ms * 1000)
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

			t->disable_reason = psprintf("failing since %s: %s",
										 timestamptz_to_str(t->failing_since), error);
			MemoryContextSwitchTo(oldcxt);
		}
		if (t->disable_reason != NULL)
		{
			t->state = 'd';
			ereport(LOG,
					(errmsg("outbox relay disabled target \"%s\": %s", t->name, t->disable_reason),
					 errhint("Messages keep accumulating; outbox.resume_target('%s') delivers them.",
							 t->name)));
		}
	}
	if (counts)
		t->held_until =
			TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										relay_backoff_ms(t->hold_attempts, retry_after_s));
	lane->next_attempt = t->held_until;
	lane->retry_nbatch = lane->nbatch;
	lane->nbatch = 0;
	if (t->hold_attempts == 1 && counts)
		ereport(LOG,
				(errmsg("outbox relay holds target \"%s\": %s", t->name, error),
				 errdetail("Nothing is dead-lettered; delivery resumes in order when the receiver accepts requests again.")));
}

/*
 * The token lane's requests must carry could not be had (relay_auth.c): the
 * target is held as if the token endpoint were its receiver, with no request
 * of the lane on the wire, so a batch it is to send again keeps its size.
 */
static void
relay_lane_auth_failed(RelayLane *lane, const char *error)
{
	int			retry_nbatch = lane->retry_nbatch;

	Assert(!lane->in_flight);
	relay_lane_hold(lane, 0, error, 0);
	lane->retry_nbatch = retry_nbatch;
	lane->auth_again = false;	/* the next token may be refused once more */
}

/*
 * The lane's request was refused for its token alone, and a new token is
 * to come (relay_auth_rejected()): the same batch goes again once it is
 * there, counting no attempt.
 */
static void
relay_lane_again(RelayLane *lane, const RelayOutcome *outcome)
{
	relay_lane_set_error(lane, outcome->status, outcome->error ? outcome->error : "token refused");
	lane->target->stats.retries++;
	lane->sent_last = NULL;
	lane->retry_nbatch = lane->nbatch;
	lane->nbatch = 0;
	lane->next_attempt = 0;
	lane->auth_again = true;
}

/*
 * A request of a transport that acknowledges each message failed at its
 * position ndelivered, now the lane's head: those after it that the broker
 * acknowledged (of the request's first n positions) are delivered, taken
 * out of the queue behind the head, and not sent again (a broker without
 * de-duplication, RabbitMQ, Kafka, would store them twice).  A request
 * never holds two messages of a key (relay_lane_cut_keys()), and a
 * pipelined window reports those behind an unacknowledged message of their
 * key as not acknowledged, so this keeps each key's order; the lane's done
 * position stays below its head, so a restart before the head is finished
 * sends them again, as for any message delivered but not yet recorded.
 */
static void
relay_lane_acked_after(RelayLane *lane, const RelayOutcome *outcome, int n)
{
	RelayTarget *t = lane->target;
	RelayMessage *prev = lane->head;
	RelayMessage *m;
	TimestampTz now = 0;
	int			pos;

	if (prev == NULL)
		return;
	m = prev->next;
	for (pos = outcome->ndelivered + 1; pos < n && m != NULL; pos++)
	{
		RelayMessage *next = m->next;

		if (!outcome->acked[pos])
		{
			prev = m;
			m = next;
			continue;
		}
		prev->next = next;
		if (lane->tail == m)
			lane->tail = prev;
		lane->nqueued--;
		t->nqueued--;
		lane->queued_bytes -= m->mem_size;
		t->queued_bytes -= m->mem_size;
		if (now == 0)
			now = GetCurrentTimestamp();
		t->stats.messages++;
		t->stats.last_success_at = now;
		outbox_stats_latency(&t->stats, (now - m->emitted_at) / 1000.0, now);
		if (m->retry)
		{
			relay_retry_delivered(t, m->id);
			t->nretry--;
		}
		else
			lane->last_delivered_id = Max(lane->last_delivered_id, m->id);
		lane->delivered_delta++;
		pfree(m);
		m = next;
	}
}

/*
 * What a transport reported for the lane's request.  A transport that
 * acknowledges each message reports the messages acknowledged at the head
 * of the request (ndelivered), what happened to the next one, and which
 * after it were acknowledged: those are delivered, the outcome is that one
 * message's, and the rest of the request (neither acknowledged nor
 * failed) is sent again after it.
 */
void
relay_lane_outcome(RelayLane *lane, const RelayOutcome *outcome)
{
	RelayTarget *t = lane->target;

	/*
	 * A 401 to the target's token (AWS: an expired one): a new token and
	 * the same request again, once (relay_auth.c); a request taken with it
	 * confirms it.
	 */
	if (outcome->auth_sent && outcome->auth_refused && !lane->auth_again &&
		relay_auth_rejected(t, outcome->auth_generation))
	{
		relay_lane_again(lane, outcome);
		return;
	}
	lane->auth_again = false;	/* (a second refusal of the batch: held below) */
	if (outcome->auth_sent && outcome->kind == RELAY_DELIVERED)
		relay_auth_accepted(t, outcome->auth_generation);

	/* A pipelined lane's window ends with its outcome. */
	lane->sent_last = NULL;
	if (t->transport->per_message && outcome->kind != RELAY_DELIVERED)
	{
		int			nbatch = lane->nbatch;

		if (outcome->ndelivered > 0)
		{
			lane->nbatch = Min(outcome->ndelivered, lane->nbatch);
			relay_lane_succeeded(lane);
		}
		if (outcome->acked != NULL)
			relay_lane_acked_after(lane, outcome, Min(nbatch, outcome->nsent));
		if (lane->nqueued == 0)
			return;
		lane->nbatch = 1;
	}

	switch (outcome->kind)
	{
		case RELAY_DELIVERED:
			relay_lane_succeeded(lane);
			if (t->hold_attempts > 0)
				ereport(LOG,
						(errmsg("outbox relay resumes target \"%s\"", t->name)));
			t->hold_attempts = 0;
			t->held_until = 0;
			break;
		case RELAY_RETRY:
			relay_lane_failed(lane, true, outcome->status, outcome->error,
							  outcome->retry_after_s);
			break;
		case RELAY_REJECTED:
			relay_lane_failed(lane, false, outcome->status, outcome->error, 0);
			/* The receiver answered about the message: it is reachable. */
			t->hold_attempts = 0;
			t->held_until = 0;
			break;
		case RELAY_RECEIVER_FAILED:
			relay_lane_hold(lane, outcome->status, outcome->error,
							outcome->retry_after_s);
			break;
		case RELAY_UNROUTABLE:
			relay_lane_unroutable(lane, outcome->error);
			break;
	}
}

/*
 * A pipelined lane's window (relay_lane_may_send()): the n messages at its
 * head were acknowledged, while the rest of it is still on the wire.  As a
 * request delivered: they are popped, and a held target is released.
 */
void
relay_lane_delivered_head(RelayLane *lane, int n)
{
	RelayTarget *t = lane->target;
	int			rest = lane->nbatch - n;

	Assert(n > 0 && rest >= 0);
	lane->nbatch = n;
	relay_lane_succeeded(lane);
	lane->nbatch = rest;
	if (rest == 0)
		lane->sent_last = NULL;
	if (t->hold_attempts > 0)
	{
		ereport(LOG,
				(errmsg("outbox relay resumes target \"%s\"", t->name)));
		t->hold_attempts = 0;
		t->held_until = 0;
	}
}

/*
 * Most messages a pipelined lane has on the wire: all it may queue, as
 * the bare producer would; the producer's own queue
 * (queue.buffering.max.messages) may stop it sooner.
 */
int
relay_lane_window_cap(RelayTarget *t)
{
	return t->strict ? 1 : relay_lane_cap(t);
}

/*
 * Whether a pipelined lane with a window on the wire may send more now:
 * the transport says nothing in it failed, the lane is not sending a
 * message again alone (after a failure, or a dead letter delivered again),
 * the target is not held, and there is more to send, short of a dead
 * letter delivered again (it goes alone, once the window has drained).
 */
static bool
relay_lane_may_extend(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *next = lane->sent_last != NULL ? lane->sent_last->next : NULL;

	return next != NULL && !next->retry && !lane->head->retry &&
		lane->retry_nbatch == 0 && t->hold_attempts == 0 &&
		lane->nbatch < relay_lane_window_cap(t) && t->transport->extends(lane);
}

/*
 * outbox.set_aside() asked that the lane's head message become a dead
 * letter: done once nothing of the lane is on the wire, if that message is
 * still the head (it may have been delivered meanwhile, or a replay may
 * have moved the lane); a request for a message not read yet waits for it.
 * A held target is released: its next message is tried at once.
 */
void
relay_lane_set_aside(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;

	if (lane->aside_id == 0 || lane->aside_answered || lane->in_flight)
		return;
	if (m == NULL && lane->aside_id > relay_lane_done_position(lane))
		return;					/* not read yet */
	if (m != NULL && m->id == lane->aside_id && m->id != lane->failing_id)
		return;					/* not seen failing by this relay yet */
	lane->aside_answered = true;
	if (m == NULL || m->id != lane->aside_id || m->retry)
		return;
	ereport(LOG,
			(errmsg("outbox relay sets message " INT64_FORMAT " of target \"%s\" aside as a dead letter",
					m->id, t->name),
			 errdetail("%s", lane->aside_reason ? lane->aside_reason : "outbox.set_aside()")));
	lane->nbatch = 1;
	relay_lane_dead_letter(lane,
						   m->id == lane->unroutable_id ? lane->unroutable_attempts : lane->attempts,
						   lane->last_status,
						   lane->aside_reason ? lane->aside_reason : "set aside");
	lane->unroutable_since = 0;
	if (t->hold_attempts > 0)
	{
		t->hold_attempts = 0;
		t->held_until = 0;
		t->failing_since = 0;
	}
}

/* Whether a lane of t may start a request now (a held target probes). */
bool
relay_lane_may_send(RelayLane *lane, TimestampTz now)
{
	RelayTarget *t = lane->target;

	if (lane->in_flight)
		return relay_target_pipelined(t) && now >= lane->next_attempt &&
			relay_lane_may_extend(lane) && relay_target_may_send(t, now, NULL);
	if (lane->nqueued == 0 || now < lane->next_attempt)
		return false;
	if (!relay_target_may_send(t, now, NULL))
		return false;
	if (t->hold_attempts > 0)
	{
		RelayLane  *probe = &t->lanes[t->probe_lane];

		/* A probe lane left with nothing to send hands the probe on. */
		if (lane != probe && !probe->in_flight && probe->nqueued == 0)
			t->probe_lane = lane->index;
		if (lane->index != t->probe_lane || now < t->held_until)
			return false;
	}
	/* last: it may ask for the token the request is to carry */
	if (lane->target->auth != NULL)
	{
		char	   *why = NULL;

		switch (relay_auth_ready(lane, now, &why))
		{
			case RELAY_AUTH_READY:
				return true;
			case RELAY_AUTH_WAIT:
				return false;
			case RELAY_AUTH_FAILED:
				relay_lane_auth_failed(lane, why);
				pfree(why);
				return false;
		}
	}
	return true;
}

/*
 * The next request of a lane whose transport acknowledges each message
 * (relay_lane_cut): up to batch_size messages from the head, stopping
 * before the second message of a key, so that a message is sent only once
 * every earlier message of its key is acknowledged (I4, whatever fails in
 * between); a target with strict ordering sends one message at a time.
 * Nothing is recorded: each message goes under its own id, so a request's
 * members do not matter when it is sent again.
 */
StaticAssertDecl(RELAY_MAX_BATCH_SIZE <= RELAY_MAX_BATCH_SIZE_POW2,
				 "RELAY_MAX_BATCH_SIZE_POW2 is below RELAY_MAX_BATCH_SIZE");

static bool
relay_lane_cut_keys(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	RelayMessage *first = m;
	int			max = t->strict ? 1 : Min(t->batch_size, RELAY_MAX_BATCH_SIZE);
	int			n = 0;
	Size		bytes = 0;

	/*
	 * The keys taken so far, in an open-addressing set of at least twice as
	 * many slots as the request can hold (batch_size is at most
	 * RELAY_MAX_BATCH_SIZE), so that a cut costs a probe or two per message,
	 * not a walk of the request so far.
	 */
	RelayMessage *seen[2 * RELAY_MAX_BATCH_SIZE_POW2];
	uint32		mask = 1;

	if (t->transport->max_batch > 0)
		max = Min(max, t->transport->max_batch);
	max = Min(max, Max(lane->nqueued, 1));
	while (mask < (uint32) (2 * max))
		mask <<= 1;
	memset(seen, 0, mask * sizeof(RelayMessage *));
	mask--;

	for (; m != NULL && n < max && !m->retry; m = m->next, n++)
	{
		if (m->key != NULL && max > 1)
		{
			uint32		slot = m->key_hash & mask;
			RelayMessage *o;

			while ((o = seen[slot]) != NULL &&
				   !(o->key_hash == m->key_hash && strcmp(o->key, m->key) == 0))
				slot = (slot + 1) & mask;
			if (o != NULL)
				break;			/* a second message of a key */
			seen[slot] = m;
		}
		if (t->transport->message_bytes != NULL)
		{
			/* The kind's own limit of a request (the first always goes). */
			Size		add = t->transport->message_bytes(t, m);

			if (n > 0 && t->transport->max_request_bytes > 0 &&
				bytes + add > t->transport->max_request_bytes)
				break;
			bytes += add;
		}
		else
			bytes += m->payload_len;
		lane->cut_last = m->id;
	}
	lane->cut_n = Max(n, 1);
	if (n == 0)
		lane->cut_last = first->id;
	lane->cut_bytes = bytes;
	return true;
}

/*
 * The next request of a pipelined lane (relay_lane_cut): up to batch_size
 * messages after those on the wire (from the head when none is), stopping
 * before a dead letter delivered again; a target with strict ordering
 * sends one message at a time.  Returns false when there is none.
 */
static bool
relay_lane_cut_window(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->in_flight ? lane->sent_last->next : lane->head;
	int			max = t->strict ? 1 : Min(t->batch_size, RELAY_MAX_BATCH_SIZE);
	int			n = 0;
	Size		bytes = 0;

	for (; m != NULL && n < max && !m->retry; m = m->next, n++)
	{
		bytes += m->payload_len;
		lane->cut_last = m->id;
	}
	lane->cut_n = n;
	lane->cut_bytes = bytes;
	return n > 0;
}

/*
 * Whether the lane's next request waits for messages not read yet: the
 * batch recorded before a restart (batch_end) is only partly queued, and
 * must be cut the same way again (relay_lane_cut()).
 */
bool
relay_lane_waits_for_read(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;

	return m != NULL && lane->retry_nbatch == 0 && !m->retry &&
		t->batch_size > 1 && lane->batch_end >= m->id &&
		lane->tail->id < lane->batch_end &&
		(t->read_id < lane->batch_end ||
		 (lane->overflow_id != 0 && lane->overflow_id <= lane->batch_end));
}

/*
 * Choose the messages of the lane's next request (cut_n, cut_bytes,
 * cut_last), so that a batch sent again, after a failure or after a
 * restart, has the same members and so the same webhook-id:
 *  - a batch that failed is sent again as it was;
 *  - a batch recorded in outbox.progress.batch_end (one cut short of
 *    batch_size, as the messages then available allowed) is cut at that id
 *    again, once its messages are all read;
 *  - otherwise up to batch_size messages, fewer if the body would pass
 *    RELAY_MAX_BATCH_BYTES (the first one always goes): both rules give the
 *    same batch whenever the same messages are read.  A batch cut short of
 *    batch_size for want of messages depends on when it was cut, so it is
 *    recorded (cut_record) before it is sent.
 * Returns false when the lane must wait for more of its messages.
 */
bool
relay_lane_cut(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	int			n = 0;
	Size		bytes = 0;
	bool		by_size = false;

	lane->cut_record = false;
	if (lane->in_flight)
		return relay_lane_cut_window(lane);
	if (lane->retry_nbatch == 0 && m->retry)
	{
		/* A dead letter delivered again goes alone. */
		lane->cut_n = 1;
		lane->cut_bytes = relay_envelope_size(lane->target, m);
		lane->cut_last = m->id;
		return true;
	}
	if (lane->retry_nbatch > 0)
	{
		lane->cut_n = Min(lane->retry_nbatch, lane->nqueued);
		for (; n < lane->cut_n; m = m->next, n++)
		{
			bytes += relay_envelope_size(lane->target, m);
			lane->cut_last = m->id;
		}
		lane->cut_bytes = bytes;
		return true;
	}
	if (t->batch_size > 1 && lane->batch_end >= m->id)
	{
		/* All of the recorded batch must be queued first. */
		if (relay_lane_waits_for_read(lane))
			return false;
		for (; m != NULL && m->id <= lane->batch_end && n < t->batch_size && !m->retry;
			 m = m->next, n++)
		{
			bytes += relay_envelope_size(lane->target, m);
			lane->cut_last = m->id;
		}
		lane->cut_n = n;
		lane->cut_bytes = bytes;
		return true;
	}
	if (relay_target_pipelined(t))
		return relay_lane_cut_window(lane);
	if (t->transport->per_message)
		return relay_lane_cut_keys(lane);
	for (; m != NULL && n < t->batch_size && !m->retry; m = m->next, n++)
	{
		Size		add = t->batch_size > 1 ? relay_envelope_size(lane->target, m) : 0;

		if (n > 0 && bytes + add > RELAY_MAX_BATCH_BYTES)
		{
			by_size = true;
			break;
		}
		bytes += add;
		lane->cut_last = m->id;
	}
	lane->cut_n = n;
	lane->cut_bytes = bytes;
	lane->cut_record = (t->batch_size > 1 && n < t->batch_size && !by_size &&
						relay_progress_has_batch_end);
	return true;
}

/*
 * A NOTIFY lane's transaction committed: its nbatch messages are delivered,
 * and the lane is finished up to done.
 */
void
relay_lane_notified(RelayLane *lane, int64 done)
{
	relay_lane_succeeded(lane);
	/* Recorded in the same transaction: nothing left to write. */
	lane->delivered_delta = 0;
	lane->done_id = done;
}

/*
 * A NOTIFY lane's transaction failed: everything stays queued and is
 * retried after a backoff, for as long as it takes (a listener sees each
 * message once, in order, so nothing is skipped).
 */
void
relay_lane_retry_later(RelayLane *lane, const char *error)
{
	RelayTarget *t = lane->target;
	int64		delay;

	lane->nbatch = 0;
	lane->attempts++;
	delay = relay_backoff_ms(lane->attempts, 0);
	lane->next_attempt = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), delay);
	relay_lane_set_error(lane, 0, error);	/* shown in outbox.lag */
	ereport(LOG,
			(errmsg("outbox relay could not notify channel \"%s\" of target \"%s\": %s",
					t->channel, t->name, error),
			 errdetail("Retrying in " INT64_FORMAT " ms.", delay)));
}

/*
 * Whether target t reads no new messages: paused, disabled, waiting to be
 * reloaded after a replay, or draining its lanes before they change.
 */
bool
relay_target_stopped(RelayTarget *t)
{
	return t->state != 'a' || t->rebuild || relay_target_resizable(t);
}

/*
 * Whether target t waits for new lanes and has read up to where its most
 * advanced lane finished: from there it reads nothing new, and once idle
 * every message up to its read position is finished on every lane, the
 * one point where all lanes of the new layout may start (lanes that are
 * behind, after a restart, read up to it first).
 */
bool
relay_target_resizable(RelayTarget *t)
{
	int			i;

	if (t->pending_lanes == 0)
		return false;
	for (i = 0; i < t->nlanes; i++)
		if (t->lanes[i].done_id > t->read_id)
			return false;
	return true;
}

/*
 * Whether target t may start a request now: it is active, and its rate
 * (max_rate, a token bucket holding at most a twentieth of a second's
 * worth, and at least one) allows.  Otherwise *wait_ms, when given, says
 * how long until it may (-1: not by itself).
 */
bool
relay_target_may_send(RelayTarget *t, TimestampTz now, long *wait_ms)
{
	double		burst;

	if (wait_ms)
		*wait_ms = -1;
	if (t->state != 'a' || t->rebuild)
		return false;
	if (t->max_rate <= 0)
		return true;
	burst = Max(1.0, t->max_rate / 20.0);
	if (t->tokens_at == 0)
		t->tokens = burst;
	else if (now > t->tokens_at)
		t->tokens = Min(burst, t->tokens + (now - t->tokens_at) / 1000000.0 * t->max_rate);
	t->tokens_at = now;
	if (t->tokens >= 1.0)
		return true;
	if (wait_ms)
		*wait_ms = (long) ((1.0 - t->tokens) / t->max_rate * 1000.0) + 1;
	return false;
}

/* A request of target t started: it used a token of its rate. */
void
relay_target_took_token(RelayTarget *t)
{
	if (t->max_rate > 0)
		t->tokens -= 1.0;
}

/*
 * Queue a dead letter delivered again (outbox.retry_dead_letters) in its
 * lane: after the batch on the wire or to be sent again (whose members
 * must not change), after retried dead letters with lower ids, and before
 * every other message waiting.
 */
void
relay_lane_push_retry(RelayLane *lane, RelayMessage *m)
{
	int			skip = lane->in_flight ? lane->nbatch : lane->retry_nbatch;
	RelayMessage *prev = NULL;
	RelayMessage *cur = lane->head;

	m->retry = true;
	while (cur != NULL && skip-- > 0)
	{
		prev = cur;
		cur = cur->next;
	}
	while (cur != NULL && cur->retry && cur->id < m->id)
	{
		prev = cur;
		cur = cur->next;
	}
	m->next = cur;
	if (prev)
		prev->next = m;
	else
		lane->head = m;
	if (cur == NULL)
		lane->tail = m;
	lane->nqueued++;
	lane->target->nqueued++;
	lane->queued_bytes += m->mem_size;
	lane->target->queued_bytes += m->mem_size;
	lane->target->nretry++;
}

/* Whether target t holds no message and has no request on the wire. */
bool
relay_target_idle(RelayTarget *t)
{
	int			i;

	for (i = 0; i < t->nlanes; i++)
	{
		RelayLane  *lane = &t->lanes[i];

		if (lane->nqueued > 0 || lane->in_flight || lane->overflow_id != 0)
			return false;
	}
	return true;
}
