/*-------------------------------------------------------------------------
 *
 * relay_acks.c
 *	  What the transports that acknowledge each message share (NATS,
 *	  Kafka, Redis, RabbitMQ): the acknowledgements of a lane's request,
 *	  position by position, the pipe their libraries' threads wake the
 *	  relay with, and a URL's password decoded, or shown without it.
 *
 * A request's messages are acknowledged one by one, in any order.  It is
 * decided once all of them are acknowledged, or once every message sent
 * has an answer and one failed (or the request is given up: a time-out, a
 * lost connection): those at the head are delivered, the failure is the
 * outcome of the next one (RelayOutcome.ndelivered, relay_lane.c), and
 * those after it that were acknowledged are delivered too, so that a
 * failure never makes the broker take them again (RelayOutcome.acked:
 * RabbitMQ and Kafka would store them twice).
 * Every request has a serial number, which the transport puts in what
 * comes back (a reply subject, a msg_opaque): an acknowledgement of an
 * earlier request, late, is not taken for one of this request.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include "storage/fd.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* A new request of n messages; acked grows in cxt as needed. */
void
relay_acks_begin(RelayAcks *a, int n, MemoryContext cxt)
{
	if (a->maxacked < n)
	{
		int			size = Max(n, 16);

		if (a->acked)
			pfree(a->acked);
		if (a->failed)
			pfree(a->failed);
		a->acked = MemoryContextAlloc(cxt, size * sizeof(bool));
		a->failed = MemoryContextAlloc(cxt, size * sizeof(bool));
		a->maxacked = size;
	}
	memset(a->acked, 0, n * sizeof(bool));
	memset(a->failed, 0, n * sizeof(bool));
	a->given_up = false;
	a->request++;
	a->n = n;
	a->nsent = 0;
	a->prefix = 0;
	a->first_bad = n;
	a->bad_error[0] = '\0';
}

/* Message pos failed (kind, error), unless one before it failed already. */
void
relay_acks_bad(RelayAcks *a, int pos, RelayOutcomeKind kind, const char *error)
{
	if (pos >= 0 && pos < a->n)
		a->failed[pos] = true;
	if (pos >= a->first_bad)
		return;
	a->first_bad = pos;
	a->bad_kind = kind;
	strlcpy(a->bad_error, error, sizeof(a->bad_error));
}

/*
 * Whether pos of request is a message this request waits for (sent, not
 * acknowledged yet): what came back for anything else is ignored.
 */
bool
relay_acks_waits(RelayAcks *a, uint32 request, int pos)
{
	return request == a->request && pos >= 0 && pos < a->nsent &&
		!a->acked[pos] && !a->failed[pos];
}

/* Whether what came back decides the request. */
bool
relay_acks_decided(RelayAcks *a)
{
	int			i;

	while (a->prefix < a->nsent && a->acked[a->prefix] && !a->failed[a->prefix])
		a->prefix++;
	if (a->prefix >= a->n)
		return true;
	if (a->prefix < a->first_bad)
		return false;
	if (a->given_up)
		return true;
	/* a failure: wait for what the rest sent comes to */
	for (i = a->prefix + 1; i < a->nsent; i++)
		if (!a->acked[i] && !a->failed[i])
			return false;
	return true;
}

/*
 * Give the request up (a time-out, a lost connection): what is not
 * acknowledged yet is not awaited, the first of it fails with kind.
 */
void
relay_acks_give_up(RelayAcks *a, RelayOutcomeKind kind, const char *error)
{
	(void) relay_acks_decided(a);
	a->given_up = true;
	relay_acks_bad(a, a->prefix, kind, error);
}

/*
 * The outcome of a decided request (or one given up: its failure set at
 * a->prefix first); later acknowledgements of it are ignored.
 */
void
relay_acks_outcome(RelayAcks *a, RelayOutcome *outcome)
{
	int			i;

	memset(outcome, 0, sizeof(*outcome));
	a->request++;
	if (a->prefix >= a->n)
		outcome->kind = RELAY_DELIVERED;
	else
	{
		outcome->kind = a->bad_kind;
		outcome->error = a->bad_error;
		outcome->ndelivered = a->prefix;
		/* a position both acknowledged and failed is not delivered */
		for (i = a->prefix; i < a->nsent; i++)
			if (a->failed[i])
				a->acked[i] = false;
		outcome->acked = a->acked;
		outcome->nsent = a->nsent;
	}
}

/*
 * Milliseconds until the earliest deadline of a request in flight on a
 * target of kind (whose lanes keep RelayAcks), 0 when one has passed, -1
 * for none.
 */
long
relay_acks_next_deadline_ms(RelayTargetKind kind)
{
	TimestampTz first = 0;
	ListCell   *lc;
	long		ms;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (t->kind != kind)
			continue;
		for (i = 0; i < t->nlanes; i++)
		{
			RelayAcks  *a = (RelayAcks *) t->lanes[i].priv;

			if (t->lanes[i].in_flight && a != NULL && (first == 0 || a->deadline < first))
				first = a->deadline;
		}
	}
	if (first == 0)
		return -1;
	ms = (long) ((first - GetCurrentTimestamp()) / 1000) + 1;
	return Max(ms, 0);
}

/*
 * A pipe for a library's threads to wake the relay: both ends
 * non-blocking.  Returns the read end, for the relay's WaitEventSet.
 */
int
relay_wake_pipe(int fds[2])
{
	if (pipe(fds) != 0)
		elog(ERROR, "outbox: could not create a pipe: %m");
	if (fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(fds[0], F_SETFD, FD_CLOEXEC) != 0 ||
		fcntl(fds[1], F_SETFD, FD_CLOEXEC) != 0)
		elog(ERROR, "outbox: could not set up a pipe: %m");
	ReserveExternalFD();
	ReserveExternalFD();
	return fds[0];
}

/*
 * A full ring of elements of the given size (*max of them, the first at
 * *head) made twice as large, at least 64, in cxt: its elements moved to
 * the front in order (*head 0).
 */
void
relay_ring_grow(void **ring, int *max, int *head, size_t size, MemoryContext cxt)
{
	int			n = Max(64, *max * 2);
	char	   *grown = MemoryContextAlloc(cxt, n * size);
	int			i;

	for (i = 0; i < *max; i++)
		memcpy(grown + i * size, (char *) *ring + ((*head + i) % *max) * size, size);
	if (*ring)
		pfree(*ring);
	*ring = grown;
	*head = 0;
	*max = n;
}

/* A lane's acknowledgements (RelayLane.priv), for lane_init. */
void
relay_acks_lane_init(RelayLane *lane)
{
	lane->priv = MemoryContextAllocZero(lane->target->cxt, sizeof(RelayAcks));
}

/* A lane freed with a request on the wire: nothing more comes of it. */
void
relay_acks_lane_release(RelayLane *lane)
{
	lane->in_flight = false;
}

/* Report the lane's request if what came back decides it. */
void
relay_acks_lane_check(RelayLane *lane, RelayFinishedFn finished)
{
	RelayOutcome outcome;
	RelayAcks  *a = (RelayAcks *) lane->priv;

	if (!lane->in_flight || !relay_acks_decided(a))
		return;
	relay_acks_outcome(a, &outcome);
	lane->in_flight = false;
	finished(lane, &outcome);
}

/*
 * A target's connection is given up: every request of it waiting is
 * decided at its first unanswered message (kind, error), those answered
 * before it delivered.  The transport has closed the connection; a
 * finished request that releases the target (t->priv) ends the loop.
 */
void
relay_acks_fail_lanes(RelayTarget *t, RelayOutcomeKind kind, const char *error,
					  RelayFinishedFn finished)
{
	char		why[RELAY_MAX_ERROR_LEN + 1];
	int			i;

	strlcpy(why, error, sizeof(why));
	for (i = 0; i < t->nlanes && t->priv != NULL; i++)
		if (t->lanes[i].in_flight)
		{
			relay_acks_give_up((RelayAcks *) t->lanes[i].priv, kind, why);
			relay_acks_lane_check(&t->lanes[i], finished);
		}
}

/* Empty the read end. */
void
relay_wake_pipe_drain(int fd)
{
	char		buf[256];

	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

static int
url_hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/*
 * s[0..len) of a URL's user information percent-decoded (palloc'd), or
 * NULL when it is not valid (a bad escape, or %00).
 */
char *
relay_url_unescape(const char *s, int len)
{
	char	   *out = palloc(len + 1);
	int			n = 0;
	int			i;

	for (i = 0; i < len; i++)
	{
		if (s[i] == '%')
		{
			int			hi;
			int			lo;

			if (i + 2 >= len)
				return NULL;
			hi = url_hex(s[i + 1]);
			lo = url_hex(s[i + 2]);
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
				return NULL;
			out[n++] = (char) (hi * 16 + lo);
			i += 2;
		}
		else
			out[n++] = s[i];
	}
	out[n] = '\0';
	return out;
}

/*
 * A destination filled in from a message (a subject, a topic, a stream
 * key: the emitter's bytes), as an error may show it: at most size - 1
 * bytes of printable ASCII, anything else as '?', "..." when cut; so an
 * error stays valid in any encoding however the text was cut.
 */
void
relay_shown(char *dst, size_t size, const char *src, int len)
{
	size_t		i;

	Assert(size > 4);
	for (i = 0; i + 1 < size && (int) i < len; i++)
		dst[i] = ((unsigned char) src[i] >= 0x20 && (unsigned char) src[i] < 0x7f) ? src[i] : '?';
	if ((int) i < len)
		memcpy(dst + size - 4, "...", 3), i = size - 1;
	dst[i] = '\0';
}

/*
 * The url to show in an error: without user information (up to the last
 * '@', whatever the scheme) and without a query.
 */
char *
relay_url_shown(const char *url)
{
	const char *scheme_end;
	const char *host;
	const char *at;
	StringInfoData buf;

	if (url == NULL)
		return pstrdup("NULL");
	scheme_end = strstr(url, "://");
	host = scheme_end ? scheme_end + 3 : url;
	at = strrchr(host, '@');
	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, url, host - url);
	if (at != NULL)
	{
		appendStringInfoString(&buf, "***@");
		host = at + 1;
	}
	appendBinaryStringInfo(&buf, host, strcspn(host, "?#"));
	if (host[strcspn(host, "?#")] != '\0')
		appendStringInfoString(&buf, "?...");
	return buf.data;
}
