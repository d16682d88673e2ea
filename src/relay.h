/*-------------------------------------------------------------------------
 *
 * relay.h
 *	  In-memory state of the relay and the interfaces of its files.
 *
 * The relay is split by job, dependencies pointing one way:
 *	  relay_main.c		lifecycle, signals, the wait loop, dispatch
 *	   +- relay_config.c	targets and subscriptions loaded from the tables
 *	   +- relay_read.c		frontier -> read -> route to lanes
 *	   +- relay_progress.c	progress and dead-letter writes
 *	   +- relay_retention.c	retention step, current chunk
 *	   +- relay_http.c, relay_notify.c, relay_nats.c, relay_kafka.c,
 *		  relay_sqs.c, relay_kinesis.c, relay_sns.c (AWS: relay_aws.c; on relay_http.c's
 *		  engine),
 *		  relay_redis.c, relay_rabbitmq.c	transports (a
 *								RelayTransport each): send, then report
 *								an outcome; they know nothing of dead
 *								letters
 *	   +- relay_conn.c, relay_tls.c	the connection layer of the socket
 *								transports (Redis, RabbitMQ): lookup,
 *								destination rules, connect, TLS, buffer,
 *								and their drive()
 *	   +- all use: relay_lane.c (FIFO, caps, backoff, what an outcome does),
 *				   relay_dead_letters.c (dead letters waiting to be
 *				   written) and relay_envelope.c (formats)
 *	  launcher.c starts relay_main.c's worker.
 *
 * All of it lives in the worker's process memory; nothing here is in shared
 * memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "lib/stringinfo.h"
#include "datatype/timestamp.h"
#include "storage/latch.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"

#include "outbox.h"
#include "subscription.h"

#define RELAY_UUID_LEN		36

/* One message read from outbox.messages, queued in a lane. */
typedef struct RelayMessage
{
	struct RelayMessage *next;	/* next message of the lane */
	int64		id;				/* commit-ordered id */
	uint32		key_hash;		/* hash of key, for a transport that
								 * acknowledges each message */
	Size		mem_size;		/* bytes this message takes in memory */
	char		msg_id[RELAY_UUID_LEN + 1]; /* stable id, text form */
	TimestampTz emitted_at;		/* when it was emitted */
	char	   *topic;			/* NUL-terminated */
	char	   *key;			/* NULL when the message has no key */
	char	   *payload;		/* JSON text */
	int			payload_len;	/* bytes of payload */
	char	   *headers;		/* JSON object text for envelopes, or NULL
								 * (none, or a target that sends no envelopes) */
	char	   *header_lines;	/* the same as NUL-separated "Name: value"
								 * strings ended by an empty one, or NULL */
	bool		retry;			/* a dead letter delivered again
								 * (outbox.retry_dead_letters): it sits
								 * below the lane's done_id, goes alone, and
								 * its dead letter goes once delivered */
	bool		foreign_reply;	/* NATS: a publish of it was answered by
								 * something other than a stream (a service
								 * on the subject): never published again,
								 * it becomes a dead letter */
} RelayMessage;

typedef OutboxSubscription RelaySubscription;

struct RelayTarget;

/*
 * What a transport says of one request (a message or a batch); the lane
 * decides what follows (relay_lane.c).  See the failure classes in
 * docs/sql-reference.md.
 */
typedef enum RelayOutcomeKind
{
	RELAY_DELIVERED,			/* acknowledged */
	RELAY_RETRY,				/* try again later: timeouts, 5xx, 429 ... */
	RELAY_REJECTED,				/* the receiver refuses this body: dead
								 * letter it, the lane moves on */
	RELAY_RECEIVER_FAILED,		/* the endpoint is wrong, not the message
								 * (401, 404, 3xx ...): hold the target */
	RELAY_UNROUTABLE			/* the broker does not take the destination
								 * this message filled in (its subject,
								 * topic or routing key): its lane tries
								 * again, and after the target's
								 * unroutable_after dead-letters it (I10) */
} RelayOutcomeKind;

typedef struct RelayOutcome
{
	RelayOutcomeKind kind;
	int			status;			/* HTTP status, 0 for none */
	const char *error;			/* what went wrong, or NULL */
	int			retry_after_s;	/* the receiver's Retry-After, 0 for none */
	int			ndelivered;		/* a transport that acknowledges each
								 * message: how many at the head of the
								 * request were acknowledged before the one
								 * kind is about (delivered, then kind
								 * applies to that one message, and the
								 * rest of the request is sent again,
								 * but for those acked says) */
	const bool *acked;			/* and by position, those after it that
								 * were acknowledged (not failed), of
								 * nsent positions; NULL for none */
	int			nsent;
	bool		auth_sent;		/* the request carried the target's token
								 * (relay_auth.c) ... */
	uint32		auth_generation;	/* ... of this generation */
	bool		auth_refused;	/* and the receiver refused that token (an
								 * HTTP 401; AWS's ExpiredToken) */
} RelayOutcome;

/*
 * A FIFO of one target: at most one request in flight, or a window of
 * them for a pipelined target (RelayTransport.pipelines).
 */
typedef struct RelayLane
{
	struct RelayTarget *target; /* owner */
	int			index;			/* lane number */
	RelayMessage *head;			/* oldest undelivered message */
	RelayMessage *tail;			/* newest queued message */
	int			nqueued;		/* messages in the queue */
	Size		queued_bytes;	/* their mem_size, summed */
	int			nbatch;			/* messages at the head being sent */
	bool		in_flight;		/* a request is on the wire */
	RelayMessage *sent_last;	/* pipelined: the last message of the
								 * window (nbatch > 0), or NULL */
	int			attempts;		/* failed attempts of the head batch */
	int			retry_nbatch;	/* size of the failed batch, to resend as is */
	bool		auth_again;		/* that batch goes again because its token
								 * was refused: a second refusal holds */
	int64		overflow_id;	/* 0, or the lowest id of the lane not queued
								 * because the lane was full: messages of the
								 * lane from there to the target's read_id
								 * are read again when it drains */
	Size		refill_need;	/* size of the message at overflow_id */
	TimestampTz next_attempt;	/* not before; 0 for now */
	int64		done_id;		/* durable: all of the lane <= done_id done */
	int64		batch_end;		/* durable: a batch cut short of batch_size
								 * ends here (outbox.progress.batch_end),
								 * so it is cut the same way again; 0 none */
	int			cut_n;			/* messages of the next request */
	Size		cut_bytes;		/* their envelopes' size */
	int64		cut_last;		/* id of the last of them */
	bool		cut_record;		/* the cut must be recorded before it goes */
	int64		last_delivered_id;	/* highest id acknowledged */
	int64		delivered_delta;	/* acknowledged since the last write */
	int64		dead_delta;		/* dead-lettered since the last write */
	int			last_status;	/* last HTTP status, 0 for none */
	char	   *last_error;		/* last failure, or NULL */
	TimestampTz last_error_at;	/* when it happened */
	bool		error_dirty;	/* last_error not yet written */
	int64		failing_id;		/* the queued message last_error is about
								 * (outbox.progress.failing_id), 0 none */
	TimestampTz unroutable_since;	/* the lane's first refusal of a
									 * filled-in destination since it
									 * last delivered, 0 none */
	int64		unroutable_id;	/* the head message refused so */
	int			unroutable_attempts;	/* its refusals (its backoff; they
										 * do not count as attempts) */
	int64		aside_id;		/* outbox.set_aside() asks that this head
								 * message become a dead letter, 0 none */
	char	   *aside_reason;	/* the reason it gives */
	bool		aside_answered; /* aside_id was acted on (or is past):
								 * clear the request at the next write */
	void	   *priv;			/* the transport's state of the lane */
} RelayLane;

typedef enum RelayTargetKind
{
	RELAY_HTTP,
	RELAY_NOTIFY,
	RELAY_NATS,
	RELAY_KAFKA,
	RELAY_REDIS,
	RELAY_RABBITMQ,
	RELAY_SQS,
	RELAY_KINESIS,
	RELAY_SNS
} RelayTargetKind;

struct RelayTarget;

/* Called by a transport when a lane's request has ended. */
typedef void (*RelayFinishedFn) (RelayLane *lane, const RelayOutcome *outcome);

/*
 * A kind of target: everything the relay knows of a protocol.  A transport
 * sends a lane's next request (the cut_n messages relay_lane_cut() chose),
 * reports its outcome through drive(), and knows nothing of dead letters,
 * progress or order: relay_lane.c decides what an outcome does.  Adding a
 * kind: docs/internals.md, "Adding a kind of target".
 */
typedef struct RelayTransport
{
	const char *kind;			/* outbox.targets.kind */
	RelayTargetKind id;
	bool		header_lines;	/* messages carry their headers as "Name:
								 * value" lines (RelayMessage.header_lines) */
	bool		per_message;	/* acknowledges each message of a request:
								 * a request holds at most one message of a
								 * key, so that no later message of a key is
								 * acknowledged ahead of an earlier one that
								 * is to be sent again */
	/*
	 * Whether target t is pipelined: the transport acknowledges each
	 * message (per_message), and the broker keeps per key the order it is
	 * sent in through its own retries (Kafka's idempotent producer, a key
	 * on one partition): a request may hold several messages of a key,
	 * and a lane sends on while earlier requests are on the wire (its
	 * window, nbatch messages at the head); see I4 in docs/internals.md.
	 * NULL for never.
	 */
	bool		(*pipelines) (struct RelayTarget *t);
	/*
	 * Pipelined: whether the lane's window may take more now (nothing in
	 * it failed).  A transport whose lanes keep a window of what is on the
	 * wire (Kafka's, pipelined or not): sending more failed (send returned
	 * false or raised an error with the window on the wire): the first
	 * message not sent fails so, and the window's outcome follows once the
	 * rest of it has come back.
	 */
	bool		(*extends) (RelayLane *lane);
	void		(*window_fail) (RelayLane *lane, const RelayOutcome *failed);
	/*
	 * At relay start: a descriptor the loop waits on, or -1; at exit.  A
	 * transport on relay_conn.c without them has its epoll set's
	 * (relay_conn_set_start(), relay_conn_stop()).
	 */
	int			(*start) (void);
	void		(*stop) (void);
	/*
	 * The kind's own options of a target row read (its url, subject, topic,
	 * properties), checked: why the row cannot be used, or NULL.  NULL for
	 * a kind relay_config.c checks itself.
	 */
	const char *(*check) (struct RelayTarget *t);
	/*
	 * A target is made (before its lanes) and freed (after them); its
	 * lanes are made and freed.  Any may be NULL.
	 */
	void		(*target_init) (struct RelayTarget *t);
	void		(*target_release) (struct RelayTarget *t);
	void		(*lane_init) (RelayLane *lane);
	void		(*lane_release) (RelayLane *lane);
	/*
	 * Start the lane's request; false, with *failed set, when it could not
	 * be started.  NULL for a transport with deliver instead.
	 */
	bool		(*send) (RelayLane *lane, RelayOutcome *failed);
	/* Instead of send: deliver the queue at once (NOTIFY, in a transaction). */
	void		(*deliver) (struct RelayTarget *t);
	/* Make progress; report requests that ended.  NULL for none. */
	void		(*drive) (RelayFinishedFn finished);
	/* Milliseconds until drive must be called, or -1. */
	long		(*timeout) (void);
	/*
	 * A transport on relay_conn.c (conn_set not NULL) has no drive or
	 * timeout: relay_conn_drive() and relay_conn_next_ms() serve it, with
	 * these; its targets' priv begins with their RelayConn.
	 */
	struct RelayConnSet *conn_set;	/* its epoll set */
	/* take what the socket has */
	void		(*conn_read) (struct RelayTarget *t, RelayFinishedFn finished);
	/* give the connection up, and every request of the target waiting */
	void		(*conn_fail) (struct RelayTarget *t, RelayOutcomeKind kind, const char *why,
							  RelayFinishedFn finished);
	/* conn_read has more to take without the socket saying so; may be NULL */
	bool		(*conn_more) (struct RelayTarget *t);
	/* a request is past its deadline: why, and what it is */
	RelayOutcomeKind (*conn_expired) (struct RelayTarget *t, char *error, size_t size);
	/* close the connection and forget what it carried */
	void		(*conn_close) (struct RelayTarget *t);
	/* start one when there is none; false, with its error, if it cannot be */
	bool		(*conn_connect) (struct RelayTarget *t);

	/*
	 * A kind whose requests are HTTP (SQS) runs on relay_http.c's engine:
	 * its lanes are made with relay_http_lane_init(), its send builds the
	 * request and calls relay_http_start(), and http_answer says what the
	 * answer (status and body, up to 512 kB) means: the outcome's kind,
	 * error (in msg), and for a per_message kind ndelivered, acked, nsent.
	 */
	void		(*http_answer) (RelayLane *lane, long status, const char *body, int len,
								bool capped, RelayOutcome *outcome, char *msg, size_t size);
	/*
	 * Limits of one request of a per_message kind: at most max_batch
	 * messages (0: batch_size's), and at most max_request_bytes of them as
	 * message_bytes() counts (0: no limit; the first message always goes).
	 */
	int			max_batch;
	Size		max_request_bytes;
	Size		(*message_bytes) (struct RelayTarget *t, RelayMessage *m);
} RelayTransport;

extern const RelayTransport relay_http_transport;
extern const RelayTransport relay_notify_transport;
extern const RelayTransport relay_nats_transport;
extern const RelayTransport relay_kafka_transport;
extern const RelayTransport relay_redis_transport;
extern const RelayTransport relay_rabbitmq_transport;
extern const RelayTransport relay_sqs_transport;
extern const RelayTransport relay_kinesis_transport;
extern const RelayTransport relay_sns_transport;
extern const RelayTransport *const relay_transports[];	/* relay_main.c */
extern const RelayTransport *const *relay_kinds;	/* relay_config.c: the same */
extern uint64 relay_kinds_used;	/* relay_config.c: kinds loaded, by bit */

/* What a target sends (outbox.targets.format). */
typedef enum RelayFormat
{
	RELAY_FORMAT_OUTBOX,		/* the payload, or outbox envelopes */
	RELAY_FORMAT_CE_BINARY,		/* CloudEvents, binary content mode */
	RELAY_FORMAT_CE_STRUCTURED	/* CloudEvents, structured content mode */
} RelayFormat;

typedef struct RelayTarget
{
	int			id;				/* outbox.targets.id */
	char	   *name;			/* outbox.targets.name */
	RelayTargetKind kind;		/* http, notify or nats */
	const RelayTransport *transport;	/* of the kind */
	void	   *priv;			/* the transport's state of the target */
	char	   *url;			/* HTTP, NATS; Kafka: the bootstrap list */
	char	   *channel;		/* NOTIFY */
	char	   *subject;		/* NATS: the subject template */
	char	   *topic;			/* Kafka: the topic template */
	char	   *properties;		/* Kafka: librdkafka settings (JSON text) */
	Jsonb	   *properties_jb;	/* the same, or NULL */
	char	   *stream;			/* Redis: the stream's key template */
	int64		maxlen;			/* Redis: XADD MAXLEN ~ this, 0 for none */
	int			dedup_window;	/* Redis: seconds a de-dup mark lives, 0
								 * for none, -1 when not given */
	char	   *exchange;		/* RabbitMQ: the exchange ("" the default) */
	char	   *routing_key;	/* RabbitMQ: the routing key template */
	char	  **header_lines;	/* "Name: value" of the target's headers */
	char	  **header_names;	/* their names */
	int			nheader_lines;	/* entries in header_lines */
	char	   *host;			/* the URL's host, for allowed_destinations */
	OutboxSigningKey keys[2];	/* signing keys: secret, previous_secret */
	int			nkeys;			/* entries in keys */
	char	   *ca_file;		/* TLS: CA bundle file, or NULL */
	char	   *client_cert;	/* TLS: client certificate file, or NULL */
	char	   *client_key;		/* TLS: its private key file, or NULL */
	char	   *credentials;	/* NATS: a .creds or NKey seed file, or NULL */
	char	   *region;			/* AWS: the region signed for */
	char	   *aws_key_id;		/* AWS: access key id */
	char	   *aws_secret;		/* AWS: secret access key */
	char	   *aws_token;		/* AWS: session token, or NULL */
	char	   *oauth_token_url;	/* OAuth2 client credentials: the token
									 * endpoint, or NULL for none */
	char	   *oauth_client_id;
	char	   *oauth_client_secret;
	char	   *oauth_scope;	/* or NULL */
	bool		oauth_client_post;	/* id and secret in the body, not Basic */
	char	   *aws_role_arn;	/* AWS web identity: the role assumed, or
								 * NULL (static credentials) */
	char	   *aws_token_file; /* the web identity token's file */
	char	   *aws_sts_endpoint;	/* STS's URL, or NULL for the region's */
	struct RelayAuth *auth;		/* the token's state, or NULL */
	char	   *auth_url;		/* where a token is asked for (the token
								 * endpoint, STS) */
	char	   *auth_host;		/* its host, for the destination rules */
	char	   *auth_header;	/* OAuth2: "Authorization: Bearer ...", or
								 * NULL (relay_auth.c sets it) */
	char	   *auth_aws_key_id;	/* web identity: STS's credentials, or NULL */
	char	   *auth_aws_secret;
	char	   *auth_aws_token;
	uint32		auth_generation;	/* bumped with every new token */
	char	   *post_url;		/* a kind on HTTP whose requests go to
								 * another URL than url (SQS: the service's
								 * endpoint), or NULL */
	bool		envelope_only;	/* NOTIFY: without payload and headers */
	RelayFormat format;			/* what it sends */
	char	   *ce_source;		/* CloudEvents source attribute */
	int			batch_size;		/* messages per request */
	int			nlanes;			/* lanes */
	int			max_attempts;	/* 0 = retry forever */
	int			timeout_ms;		/* per request */
	bool		strict;			/* ordering 'strict': commit order over all keys */
	RelaySubscription *subs;	/* subscriptions */
	int			nsubs;			/* entries in subs */
	RelayLane  *lanes;			/* nlanes lanes */
	int64		read_id;		/* every id <= read_id was read or skipped */
	int			read_failures;	/* failed reads in a row */
	TimestampTz read_retry_at;	/* no read before, after a failure; 0 */
	TimestampTz last_read_at;	/* when its queue was last read on */
	int64		poison_id;		/* message whose building failed, or 0 */
	int			poison_tries;	/* times in a row it failed */
	char	   *poison_error;	/* the last error, or NULL */
	List	   *condemned;		/* messages that failed RELAY_POISON_TRIES
								 * times: a dead letter when read (ids as
								 * int64 *, in cxt), until read_id passes */
	int			hold_attempts;	/* receiver-wide failures in a row; while
								 * above 0 the target is held: only
								 * probe_lane sends, at held_until */
	int			probe_lane;		/* the lane whose request failed last */
	TimestampTz held_until;		/* when the probe may go */
	int			nqueued;		/* messages queued over all lanes */
	Size		queued_bytes;	/* their mem_size, summed */
	Size		read_need;		/* size of the message that did not fit in
								 * the queue, 0 for none */
	MemoryContext cxt;			/* holds the target and its messages */
	bool		seen;			/* found in the last configuration load */

	/* Operations (schema 0.2): states, rate, changes applied live. */
	char		state;			/* 'a'ctive, 'p'aused or 'd'isabled */
	double		max_rate;		/* requests a second, 0 for unlimited */
	double		tokens;			/* token bucket of max_rate */
	TimestampTz tokens_at;		/* when tokens was last refilled */
	int64		disable_after_ms;	/* failing this long disables, 0 never */
	int64		unroutable_after_ms;	/* a filled-in destination the
										 * broker refuses this long makes a
										 * dead letter, 0 never */
	TimestampTz failing_since;	/* first receiver-wide failure in a row */
	char	   *disable_reason; /* disable the target at the next write */
	int			generation;		/* outbox.progress.generation loaded */
	bool		rebuild;		/* replayed: reload once nothing is in flight */
	int			pending_lanes;	/* lanes asked for, 0 for no change */
	char	   *pending_ordering;	/* ordering asked for, or NULL */
	char	   *fingerprint;	/* of the options, to see them change */
	int			options_version;	/* bumped when new options are taken */
	MemoryContext opts_cxt;		/* options taken from a later load */
	bool		retry_wanted;	/* dead letters wait to be delivered again */
	bool		aside_pending;	/* a lane has an outbox.set_aside() request
								 * not acted on (relay_lane_set_aside()) */
	int			nretry;			/* of those, queued in the lanes */
	OutboxTargetStats stats;	/* published to shared memory (stats.c) */
	uint64		filtered_pending;	/* filtered by a read not yet done */
} RelayTarget;

/* A dead letter waiting to be written with the next progress update. */
typedef struct RelayDeadLetter
{
	struct RelayDeadLetter *next;
	char	   *target;
	int64		id;
	char		msg_id[RELAY_UUID_LEN + 1];
	char	   *topic;
	char	   *key;
	int			attempts;
	int			last_status;
	char	   *last_error;
} RelayDeadLetter;

/* A dead letter delivered again, to remove with the next progress write. */
typedef struct RelayRetried
{
	char	   *target;
	int64		id;
} RelayRetried;

/*
 * Largest body of one batch request: a batch is cut before it grows past
 * this (a message larger than this goes alone).  Fixed, so a re-read cuts
 * the same batches.
 */
#define RELAY_MAX_BATCH_BYTES	(64 * 1024 * 1024)
/* batch_size's upper bound (targets_batch_size_check), and the power of 2 at or above it */
#define RELAY_MAX_BATCH_SIZE	1000
#define RELAY_MAX_BATCH_SIZE_POW2	1024

/* Longest last_error kept, in bytes. */
#define RELAY_MAX_ERROR_LEN		256

/* Parts of relay_envelope(); without one, it says "..._omitted". */
#define RELAY_ENVELOPE_HEADERS	0x01
#define RELAY_ENVELOPE_PAYLOAD	0x02
#define RELAY_ENVELOPE_ALL		(RELAY_ENVELOPE_HEADERS | RELAY_ENVELOPE_PAYLOAD)

/*---- shared state of the relay (relay_config.c, relay_progress.c) ----*/
extern MemoryContext relay_cxt;	/* targets, dead letters */
extern List *relay_targets;		/* RelayTarget *, by id */
extern bool relay_progress_has_batch_end;	/* schema 0.2 or later */
extern bool relay_config_incomplete;	/* a target waits for its progress rows */
extern bool relay_dead_letters_keep_payload;	/* schema 0.2 or later */
extern bool relay_schema_operations;	/* states, replay: 0.2 or later */
extern bool relay_schema_brokers;	/* targets.subject, topic, properties: 0.3 */
extern bool relay_schema_aws;	/* targets.region and the AWS credentials: 0.4 */
extern bool relay_schema_set_aside;	/* progress.failing_id, set_aside_id,
									 * targets.unroutable_after: 0.3 */
extern TimestampTz relay_last_progress_write;

/*---- relay_http.c: its engine, for the kinds whose requests are HTTP ----*/
extern void relay_http_lane_init(RelayLane *lane);
extern void relay_http_lane_release(RelayLane *lane);
extern void relay_http_headers_reset(RelayLane *lane);
extern void relay_http_header(RelayLane *lane, const char *line);
extern bool relay_http_start(RelayLane *lane, const char *body, int body_len,
							 RelayOutcome *failed);
extern void relay_http_drive(RelayFinishedFn finished);
extern void relay_http_auth_sent(RelayLane *lane, bool sent, uint32 generation);

/*
 * A request the relay makes for itself (a token: relay_auth.c), on the same
 * engine.  done is called from relay_http_drive() when it ends: error is
 * NULL when an answer came (status, and answer[0..len), NUL-terminated),
 * else why not (refused by the destination rules, timed out, TLS ...).
 */
typedef struct RelayFetch RelayFetch;
typedef void (*RelayFetchDone) (void *arg, long status, const char *answer, int len,
								const char *error);
extern RelayFetch *relay_fetch_create(MemoryContext cxt);
extern bool relay_fetch_start(RelayFetch *f, const char *url, const char *host,
							  const char *ca_file, int timeout_ms,
							  const char *const *headers, int nheaders, const char *body,
							  RelayFetchDone done, void *arg, char *error, size_t size);
extern void relay_fetch_cancel(RelayFetch *f);
extern void relay_fetch_free(RelayFetch *f);
extern void relay_form_value(StringInfo b, const char *s, size_t len);

/*---- relay_auth.c: tokens a target's requests carry (OAuth2) ----*/
struct RelayAuth;
typedef enum RelayAuthState
{
	RELAY_AUTH_READY,			/* the lane may send (a token, or none needed) */
	RELAY_AUTH_WAIT,			/* a token is on its way */
	RELAY_AUTH_FAILED			/* none could be had: *why says why */
} RelayAuthState;
extern void relay_auth_create(RelayTarget *t);
extern void relay_auth_release(RelayTarget *t);
extern bool relay_auth_options_changed(RelayTarget *t, RelayTarget *n);
extern RelayAuthState relay_auth_ready(RelayLane *lane, TimestampTz now, char **why);
extern bool relay_auth_waiting(RelayTarget *t);
extern bool relay_auth_rejected(RelayTarget *t, uint32 generation);
extern void relay_auth_accepted(RelayTarget *t, uint32 generation);
extern const char *relay_auth_check(RelayTarget *t);
extern const char *relay_url_authority(const char *url, char **authority, bool *https);

/*---- relay_lane.c: queues, outcomes, backoff, batch cuts ----*/
extern int relay_queue_cap(RelayTarget *t);
extern int relay_lane_cap(RelayTarget *t);
extern Size relay_queue_bytes(RelayTarget *t);
extern Size relay_lane_bytes(RelayTarget *t);
extern bool relay_target_has_room(RelayTarget *t);
extern bool relay_lane_needs_refill(RelayLane *lane);
extern void relay_lane_push(RelayLane *lane, RelayMessage *m);
extern RelayMessage *relay_lane_pop(RelayLane *lane);
extern void relay_lane_truncate(RelayLane *lane, int64 bound);
extern int64 relay_lane_done_position(RelayLane *lane);
extern void relay_lane_set_error(RelayLane *lane, int status, const char *error);
extern int64 relay_backoff_ms(int attempts, int retry_after_s);
extern void relay_lane_outcome(RelayLane *lane, const RelayOutcome *outcome);
extern void relay_lane_delivered_head(RelayLane *lane, int n);
extern int	relay_lane_window_cap(RelayTarget *t);
#define relay_target_pipelined(t) \
	((t)->transport->pipelines != NULL && (t)->transport->pipelines(t))
extern bool relay_lane_may_send(RelayLane *lane, TimestampTz now);
extern bool relay_target_stopped(RelayTarget *t);
extern bool relay_target_may_send(RelayTarget *t, TimestampTz now, long *wait_ms);
extern void relay_target_took_token(RelayTarget *t);
extern void relay_lane_push_retry(RelayLane *lane, RelayMessage *m);
extern bool relay_target_idle(RelayTarget *t);
extern bool relay_target_resizable(RelayTarget *t);
extern bool relay_lane_cut(RelayLane *lane);
extern bool relay_lane_waits_for_read(RelayLane *lane);
extern void relay_lane_notified(RelayLane *lane, int64 done);
extern void relay_lane_retry_later(RelayLane *lane, const char *error);
extern void relay_lane_set_aside(RelayLane *lane);

/*---- relay_envelope.c: formats ----*/
extern void relay_envelope(RelayMessage *m, int parts, StringInfo buf);
extern void relay_json_string(StringInfo buf, const char *s, int len);
extern Size relay_envelope_size(struct RelayTarget *t, RelayMessage *m);
extern void relay_append_time(StringInfo buf, TimestampTz t);
extern void relay_append_int64(StringInfo buf, int64 v);
extern void relay_jsonb_text(StringInfo buf, Jsonb *jb);
extern char *relay_header_lines(Jsonb *jb, int *len);
extern void relay_uuid_text(const pg_uuid_t *uuid, char *out);
extern bool relay_template_fill(const char *template, RelayMessage *m, StringInfo buf);
extern bool relay_template_filled(const char *template);
extern const char *relay_template_check(const char *template, int maxlen, bool allow_empty);

/*---- relay_envelope.c: CloudEvents ----*/
#define RELAY_CE_MAX_ATTRS	11	/* the most relay_ce_attrs() gives */

/* A message's CloudEvents attributes, for the binary content modes. */
typedef struct RelayCeAttrs
{
	int			n;
	const char *name[RELAY_CE_MAX_ATTRS];	/* without the binding's prefix */
	const char *value[RELAY_CE_MAX_ATTRS];
	bool		safe[RELAY_CE_MAX_ATTRS];	/* JSON-safe as they are */
	char		sequence[24];	/* storage of the values */
	char		time[MAXDATELEN + 1];
} RelayCeAttrs;

extern void relay_ce_attrs(struct RelayTarget *t, RelayMessage *m, RelayCeAttrs *a);
extern bool relay_ce_owned_header(const char *line);
extern void relay_ce_structured(struct RelayTarget *t, RelayMessage *m, StringInfo buf);
extern void relay_ce_http_value(const char *value, StringInfo buf);
extern const char *relay_message_header(RelayMessage *m, const char *name);
extern const char *relay_ce_default_source(void);

/*---- relay_config.c: targets loaded from the tables ----*/
extern RelayTarget *relay_find_target(int id);
extern void relay_free_target(RelayTarget *t);
extern void relay_load_config(void);

/*---- relay_read.c: reading up to the frontier ----*/
extern bool relay_target_wants_read(RelayTarget *t, int64 frontier);
extern long relay_target_read_put_off_ms(RelayTarget *t, int64 frontier, TimestampTz now);
extern bool relay_read_messages(int64 frontier);
extern int	relay_lane_of(RelayTarget *t, const char *key, int64 id);

/*---- relay_dead_letters.c: dead letters waiting to be written ----*/
extern void relay_add_dead_letter(RelayTarget *t, int64 id, const char *msg_id, const char *topic, const char *key, int attempts, int status, const char *error);
extern void *relay_dead_letters_mark(void);
extern void relay_dead_letters_discard(void *mark);
extern void relay_retry_delivered(RelayTarget *t, int64 id);
extern bool relay_dead_letter_writes_pending(void);
extern RelayDeadLetter *relay_dead_letters_queued(void);
extern List *relay_retried_queued(void);
extern void relay_dead_letters_written(void);

/*---- relay_progress.c: progress and dead-letter writes ----*/
extern bool relay_progress_pending(void);
extern void relay_write_progress(void);
extern void relay_record_cuts(RelayLane **cut, int n);
extern void relay_progress_notified(RelayTarget *t, int n, int64 last_id,
									int64 done);
extern void relay_resize_target(RelayTarget *t);

/*
 * Test-only fault injection (outbox.test_fault = 'read:TOPIC' or
 * 'send:TOPIC'): raise an error while preparing a message of TOPIC, to show
 * that an unexpected error stops neither the relay nor other targets.
 */
#ifdef OUTBOX_TEST_FAULTS
static inline void
relay_test_fault(const char *where, const char *topic)
{
	size_t		n = strlen(where);

	if (outbox_test_fault != NULL && outbox_test_fault[0] != '\0' &&
		strncmp(outbox_test_fault, where, n) == 0 &&
		outbox_test_fault[n] == ':' && strcmp(outbox_test_fault + n + 1, topic) == 0)
		elog(ERROR, "outbox: injected fault while preparing a message of topic \"%s\"", topic);
}
#else
#define relay_test_fault(where, topic)	((void) 0)
#endif

/*---- relay_main.c ----*/
extern void relay_publish_stats(TimestampTz now, const char *state, bool force);

/*---- relay_retention.c: emptying finished chunks ----*/
extern long relay_retention_maybe(TimestampTz now);

/*---- relay_acks.c: per-message acknowledgements (NATS, Kafka) ----*/
typedef struct RelayAcks
{
	uint32		request;		/* serial of the request */
	int			n;				/* its messages */
	int			nsent;			/* of them sent */
	int			prefix;			/* acknowledged at the head, in a row */
	int			first_bad;		/* position of the first failure, or n */
	bool	   *acked;			/* acknowledged, by position */
	bool	   *failed;			/* failed, by position */
	int			maxacked;		/* entries in acked and failed */
	bool		given_up;		/* decided without what is still awaited
								 * (a time-out, a lost connection) */
	RelayOutcomeKind bad_kind;	/* what the first failure was */
	char		bad_error[RELAY_MAX_ERROR_LEN + 1];
	TimestampTz deadline;		/* given up after this */
} RelayAcks;

extern void relay_acks_begin(RelayAcks *a, int n, MemoryContext cxt);
extern void relay_acks_bad(RelayAcks *a, int pos, RelayOutcomeKind kind, const char *error);
extern bool relay_acks_waits(RelayAcks *a, uint32 request, int pos);
extern bool relay_acks_decided(RelayAcks *a);
extern void relay_ring_grow(void **ring, int *max, int *head, size_t size, MemoryContext cxt);
extern void relay_acks_give_up(RelayAcks *a, RelayOutcomeKind kind, const char *error);
extern void relay_acks_outcome(RelayAcks *a, RelayOutcome *outcome);
extern void relay_acks_lane_init(RelayLane *lane);
extern void relay_acks_lane_release(RelayLane *lane);
extern void relay_acks_lane_check(RelayLane *lane, RelayFinishedFn finished);
extern void relay_acks_fail_lanes(RelayTarget *t, RelayOutcomeKind kind, const char *error,
								  RelayFinishedFn finished);
extern int	relay_wake_pipe(int fds[2]);
extern void relay_wake_pipe_drain(int fd);
extern char *relay_url_shown(const char *url);
extern char *relay_url_unescape(const char *s, int len);
extern void relay_shown(char *dst, size_t size, const char *src, int len);
/* How much of a filled-in destination an error shows (relay_shown()). */
#define RELAY_SHOWN_LEN 120
extern long relay_acks_next_deadline_ms(RelayTargetKind kind);

/*---- relay_nats.c: checks of a NATS target's options ----*/
extern const char *relay_nats_check_url(const char *url);
extern const char *relay_nats_check_subject(const char *s, bool template);

/*---- relay_kafka.c: checks of a Kafka target's options ----*/
extern const char *relay_kafka_check_brokers(const char *brokers);
extern const char *relay_kafka_check_topic(const char *template);
extern const char *relay_kafka_check_properties(Jsonb *jb);

/*---- relay_redis.c: checks of a Redis target's options ----*/
extern const char *relay_redis_check_url(const char *url);
extern const char *relay_redis_check_stream(const char *template);

/*---- relay_conn.c: the socket transports' connections (Redis, RabbitMQ) ----*/

/* Most addresses of a host kept to dial in turn. */
#define RELAY_CONN_MAX_ADDRS	8

typedef struct RelayLookup RelayLookup;

/* A transport's epoll set (its descriptor is in the relay's WaitEventSet). */
typedef struct RelayConnSet
{
	int			epoll_fd;		/* -1 until started */
	uint64		next_serial;	/* epoll names a connection by a serial */
} RelayConnSet;

#define RELAY_CONN_SET_INIT {-1, 1}

typedef enum RelayConnState
{
	RELAY_CONN_NONE,			/* no connection */
	RELAY_CONN_RESOLVING,		/* the host name is being resolved */
	RELAY_CONN_CONNECTING,		/* connect() under way */
	RELAY_CONN_TLS,				/* the TLS handshake under way */
	RELAY_CONN_OPEN				/* open: the transport's protocol runs */
} RelayConnState;

/* What relay_conn_step() says. */
typedef enum RelayConnStep
{
	RELAY_CONN_WAIT,			/* being made: nothing to do */
	RELAY_CONN_OPENED,			/* has just become open */
	RELAY_CONN_READY,			/* open: read and write */
	RELAY_CONN_FAILED			/* could not be made (error), closed */
} RelayConnStep;

/* TLS of a connection: on, and the target's files (NULL for none). */
typedef struct RelayConnTls
{
	bool		on;
	const char *ca_file;		/* NULL: the system's store */
	const char *client_cert;
	const char *client_key;		/* NULL: in client_cert's file */
} RelayConnTls;

typedef struct RelayConn
{
	RelayConnSet *set;			/* the epoll set it is in */
	const char *what;			/* "Redis", "RabbitMQ": for errors */
	const char *tls_scheme;		/* the TLS url scheme, for a hint */
	RelayConnState state;
	int			fd;				/* the socket, or -1 */
	uint64		serial;			/* epoll's name of it */
	bool		registered;		/* in the epoll set */
	bool		want_write;		/* EPOLLOUT asked for */
	RelayLookup *lookup;		/* the host being resolved, or NULL */
	struct sockaddr_storage addrs[RELAY_CONN_MAX_ADDRS];	/* allowed */
	socklen_t	addr_lens[RELAY_CONN_MAX_ADDRS];
	int			naddrs;
	int			next_addr;		/* the next of them to dial */
	uint64		attempts;		/* connections made (kept when closed) */
	char	   *url;			/* the target's url it was made for (kept
								 * when closed), in cxt */
	uint64		destinations;	/* outbox_destinations_generation then */
	char		host[256];		/* the url's host: TLS checks it */
	char		peer[INET6_ADDRSTRLEN + 8];	/* address:port dialled */
	RelayConnTls tls;			/* copies, in cxt */
	void	   *ssl;			/* OpenSSL's session, or NULL */
	bool		tls_read_wants_write;	/* a TLS read waits for EPOLLOUT */
	bool		tls_write_wants_read;	/* a TLS write waits for EPOLLIN */
	bool		got_bytes;		/* anything was read on it */
	StringInfoData out;			/* bytes not yet written */
	int			out_off;		/* of them written */
	bool		broken;			/* a write failed: the transport ends it */
	char		broken_why[RELAY_MAX_ERROR_LEN + 1];
	MemoryContext cxt;			/* the target's */
	char		error[RELAY_MAX_ERROR_LEN + 1];
} RelayConn;

extern RelayLookup *relay_lookup_start(const char *host, int port, char *error, size_t size);
extern bool relay_lookup_running(RelayLookup *l);
extern int	relay_lookup_allowed(RelayLookup *l, struct sockaddr_storage *addrs, socklen_t *lens,
								 int max, char *error, size_t size);
extern void relay_lookup_forget(RelayLookup *l);
extern void relay_sockaddr_text(const struct sockaddr *sa, char *out, size_t size);
extern int	relay_conn_set_start(RelayConnSet *s);
extern void relay_conn_set_stop(RelayConnSet *s);
extern void relay_conn_init(RelayConn *c, RelayConnSet *set, const char *what,
							const char *tls_scheme, MemoryContext cxt);
extern bool relay_conn_stale(RelayConn *c, struct RelayTarget *t);
extern bool relay_conn_send_begin(const RelayTransport *tr, RelayLane *lane, RelayOutcome *failed);
extern bool relay_conn_send_end(RelayLane *lane, bool tried, RelayOutcome *failed);
extern void relay_conn_stop(const RelayTransport *tr);
extern bool relay_conn_open(RelayConn *c, struct RelayTarget *t, const char *host, int port);
extern void relay_buffer_reset(StringInfo buf, MemoryContext cxt, int keep);
extern RelayConnStep relay_conn_step(RelayConn *c, uint32 events);
extern int	relay_conn_read(RelayConn *c, char *buf, int len);
extern void relay_conn_timeout_text(RelayConn *c, int ms, char *out, size_t size);
extern void relay_conn_flush(RelayConn *c);
extern void relay_conn_close(RelayConn *c);

/*
 * A transport on relay_conn.c: its targets' priv begins with their
 * RelayConn, its lanes' priv is their RelayAcks.
 */
#define RELAY_CONN(t)	((RelayConn *) (t)->priv)

extern void relay_conn_drive(const RelayTransport *tr, RelayFinishedFn finished);
extern long relay_conn_next_ms(const RelayTransport *tr);

/*---- relay_tls.c: TLS of those connections ----*/
extern void *relay_tls_new(int fd, const char *host, const RelayConnTls *tls, char *error, size_t size);
extern bool relay_tls_files_load(const RelayConnTls *tls, char *error, size_t size);
extern void relay_tls_free(void *ssl);
extern int	relay_tls_handshake(void *ssl, const char *peer, bool *want_write, char *error, size_t size);
extern int	relay_tls_read(void *ssl, char *buf, int len, const char *peer, bool *want_write,
						   char *error, size_t size);
extern int	relay_tls_write(void *ssl, const char *buf, int len, const char *peer, bool *want_read,
							char *error, size_t size);
extern bool relay_tls_pending(void *ssl);

/*---- relay_config.c: what every transport's lanes have on the wire ----*/
extern int	relay_in_flight(void);
extern int	relay_target_in_flight(RelayTarget *t);

#endif							/* OUTBOX_RELAY_H */
