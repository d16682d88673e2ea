/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  Declarations shared by the files of the outbox extension.
 *
 * The extension is split by job, one file each, every file opening with
 * its design; docs/internals.md ("Source layout") describes them and the
 * order of their dependencies, which test/check-layering.sh (make lint)
 * keeps pointing one way.  What every file may use, the base module, is
 * declared in base.h, included here.  The relay's files share relay.h and
 * the queue's files queue.h besides; this header has what other files
 * need: the shared state of the commit sequence (shmem.c), storage, the
 * emit buffer, statistics, the checks of text and destinations, signing,
 * and the entry points of the queues that module load and the relay call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "storage/lockdefs.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "utils/jsonb.h"
#include "utils/relcache.h"
#include "utils/uuid.h"

#include "base.h"
#include "compat.h"

/*---- input limits ----*/
#define OUTBOX_MAX_TOPIC_LEN		255 /* bytes */
#define OUTBOX_MAX_KEY_LEN			1024	/* bytes */
#define OUTBOX_MAX_HEADER_NAME_LEN	256 /* bytes */
#define OUTBOX_MAX_HEADERS_SIZE		(64 * 1024) /* bytes of jsonb */

/*
 * One message as handed from the emit buffer to storage.  The pointers are
 * valid only until the next message is fetched.
 */
typedef struct OutboxMessage
{
	pg_uuid_t	msg_id;			/* stable id returned by outbox_emit */
	TimestampTz emitted_at;		/* when outbox_emit was called */
	const char *topic;			/* not NUL-terminated */
	int			topic_len;		/* bytes in topic */
	const char *key;			/* NULL for no key; not NUL-terminated */
	int			key_len;		/* bytes in key */
	struct varlena *payload;	/* jsonb, untoasted, 4-byte header */
	struct varlena *headers;	/* jsonb or NULL */
	int			commit_time_off;	/* offset in headers of a string value of
									 * OUTBOX_COMMIT_TIME_LEN bytes that
									 * PRE_COMMIT overwrites with the commit
									 * time (captured changes), or -1 */
} OutboxMessage;

/* Bytes of a commit time as outbox_format_commit_time writes it. */
#define OUTBOX_COMMIT_TIME_LEN		27

/* Iterator over the buffered messages of the transaction (emit.c). */
typedef bool (*OutboxNextMessage) (void *state, OutboxMessage *msg);

/*---- launcher.c ----*/
extern void outbox_register_launcher(void);

/*---- databases.c: DROP DATABASE and RENAME with workers connected ----*/
extern void outbox_databases_init(void);

/*---- capture_slot.c: WAL capture's state, for the launcher and _PG_init ----*/
struct Latch;
extern Size outbox_capture_shmem_size(void);
extern void outbox_capture_shmem_init(void);
extern void outbox_capture_init(void);
extern bool outbox_capture_wanted(Oid dboid, int index, struct Latch *launcher_latch);

/*---- shmem.c ----*/
struct Latch;


extern void outbox_shmem_request(void);
/* one slot of shared state per database (outbox.max_databases) */
extern void outbox_db_attach(void);
extern bool outbox_db_attach_noerror(void);
extern bool outbox_db_lookup(void);
extern int	outbox_db_index(void);
extern int	outbox_db_attached_index(void);
extern bool outbox_db_release(Oid dboid, int min_age_ms);
extern void outbox_set_launcher_latch(struct Latch *latch);
extern void outbox_wake_launcher(void);
extern int	outbox_db_slots(void);
extern void outbox_relay_set_error(const char *message);
extern void outbox_db_set_note(Oid dboid, const char *note);
extern void outbox_db_hold(Oid dboid, TimestampTz until);
extern void outbox_shmem_init(void);
extern bool outbox_shmem_ready(void);
extern bool outbox_counter_valid(void);
extern bool outbox_counter_initialize(int64 highest_used, uint32 generation);
extern uint32 outbox_db_generation(void);
extern void outbox_db_abort_taken(void);
extern void outbox_db_tell_relay(void);
extern void outbox_db_note_looked(void);

/*
 * The durable id mark moves this many ids ahead of the last id handed out:
 * one WAL record per chunk, and at most this many ids skipped by a restart.
 */
#define OUTBOX_MARK_CHUNK		1024

/* The sequence that holds the durable id mark, and its owner. */
typedef struct OutboxMarkRel
{
	Oid			relid;			/* outbox.id_mark, or InvalidOid */
	Oid			owner;			/* who may setval() it */
} OutboxMarkRel;

extern bool outbox_mark_needed(int64 count);
extern void outbox_check_ids_left(int64 count);
extern int64 outbox_reserve_ids(int64 count, const OutboxMarkRel *markrel,
								bool mark_locked);
extern bool outbox_release_slot(XLogRecPtr commit_end);
extern XLogRecPtr outbox_flush_commits(void);
extern XLogRecPtr outbox_newest_commit_end(void);
extern void outbox_counter_advance(int64 highest_used);
extern int64 outbox_compute_frontier(void);
extern void outbox_wake_worker(bool for_commit);
extern void outbox_set_worker_wants_commits(bool wants);
extern void outbox_set_worker_latch(struct Latch *latch);
extern bool outbox_relay_claim(void);
extern void outbox_relay_release(void);
extern pid_t outbox_relay_running(void);
extern uint64 outbox_config_generation(void);
extern void outbox_bump_config_generation(bool wake);
/* Bytes of a status text kept in shared memory for the views. */
#define OUTBOX_STATUS_LEN		256

/* One database's slot, as the launcher and outbox.relays see it. */
typedef struct OutboxDbInfo
{
	Oid			dboid;
	int			index;			/* of the slot */
	pid_t		relay_pid;		/* a live relay, or 0 */
	TimestampTz started_at;		/* when it started */
	TimestampTz hold_until;		/* no relay is started before */
	TimestampTz looked_at;		/* a relay last found no extension */
	uint64		config_generation;	/* bumped by CREATE EXTENSION's commit */
	char		error[OUTBOX_STATUS_LEN];	/* the last relay's last error */
	char		note[OUTBOX_STATUS_LEN];	/* why no relay runs */
} OutboxDbInfo;
extern bool outbox_db_info(int i, OutboxDbInfo *info);
extern bool outbox_db_info_of(Oid dboid, OutboxDbInfo *info);
extern int	outbox_current_chunk(void);
extern void outbox_set_retention_status(const char *held, TimestampTz at);
extern TimestampTz outbox_get_retention_status(char *held);
extern void outbox_set_current_chunk(int chunk);
extern void outbox_set_current_chunk_if_unset(int chunk);

extern void outbox_oldest_in_flight(int *pid, int64 *first_id);

/*---- stats.c: delivery statistics in shared memory ----*/
#define OUTBOX_MAX_STAT_TARGETS	128 /* targets with statistics */
#define OUTBOX_LATENCY_BUCKETS	17	/* 16 bounds and +Inf */
#define OUTBOX_WINDOW_HALF_MS	30000	/* percentiles: the last 30-60 s */

extern const double outbox_latency_bounds_ms[OUTBOX_LATENCY_BUCKETS - 1];

/* One target's figures since the last outbox.reset_stats(). */
typedef struct OutboxTargetStats
{
	int			target_id;
	char		state;			/* 'i'dle, 'd'elivering, 'r'etrying,
								 * 'p'aused, disabled ('x'), 'f'ailing,
								 * 'w'aiting for standby */
	int			in_flight;		/* requests on the wire */
	int			failed_attempts;	/* of the messages now being retried */
	TimestampTz last_success_at;
	uint64		messages;		/* delivered */
	uint64		requests;		/* sent */
	uint64		bytes;			/* of request bodies */
	uint64		retries;		/* failed attempts tried again */
	uint64		dead_letters;	/* messages given up on */
	uint64		filtered;		/* turned away by the subscriptions' filters */
	uint64		hist[OUTBOX_LATENCY_BUCKETS];	/* emit-to-acknowledgement */
	double		latency_sum_ms;
	uint64		window[2][OUTBOX_LATENCY_BUCKETS];	/* this and the last half */
	double		window_max_ms[2];
	TimestampTz window_start;	/* of window[0] */
	TimestampTz reset_at;
} OutboxTargetStats;

typedef struct OutboxWorkerStatus
{
	char		state[32];		/* what the relay is doing */
	TimestampTz started_at;
	TimestampTz last_wakeup;
	int64		read_position;	/* every target has read up to here */
} OutboxWorkerStatus;

extern Size outbox_stats_shmem_size(void);
extern void outbox_stats_shmem_init(void);
extern void outbox_stats_latency(OutboxTargetStats *s, double ms, TimestampTz now);
extern void outbox_stats_publish(const OutboxWorkerStatus *worker,
								 const OutboxTargetStats *targets, int ntargets);
extern uint64 outbox_stats_reset_generation(void);

/*---- trace.c: W3C Trace Context of the emitting transaction ----*/
#define OUTBOX_TRACEPARENT_LEN	55	/* "00-" 32 "-" 16 "-" 2 */
#define OUTBOX_TRACESTATE_MAX	512 /* bytes of a tracestate we carry */
#define OUTBOX_TRACE_PREFIX		"outbox-trace"	/* its logical message */
extern char *outbox_traceparent;
extern char *outbox_tracestate;
extern uint64 outbox_trace_generation;
extern void outbox_trace_define_gucs(void);
extern bool outbox_traceparent_valid(const char *s, const char **why);
extern bool outbox_tracestate_valid(const char *s, const char **why);
extern bool outbox_trace_active(void);
extern Jsonb *outbox_trace_add(Jsonb *headers, const char *traceparent,
							   const char *tracestate);
extern Jsonb *outbox_trace_add_current(Jsonb *headers);

/*---- standby.c: failover-safe delivery (I9) ----*/
extern char *outbox_standby_slots;

typedef enum OutboxStandbyState
{
	OUTBOX_STANDBY_STREAMING,	/* a standby is connected */
	OUTBOX_STANDBY_DISCONNECTED,	/* no standby connected */
	OUTBOX_STANDBY_MISSING,		/* no slot of that name */
	OUTBOX_STANDBY_INVALIDATED,
	OUTBOX_STANDBY_LOGICAL		/* a logical slot */
} OutboxStandbyState;

typedef struct OutboxStandbySlot
{
	char		name[NAMEDATALEN];
	OutboxStandbyState state;
	XLogRecPtr	flushed;		/* what its standby confirmed, or invalid */
	XLogRecPtr	restart;		/* its restart_lsn (WAL kept for it), or invalid */
	bool		waiting;		/* (the gate) something waits for it */
	int64		behind;			/* (the gate) bytes still to confirm, -1 unknown */
} OutboxStandbySlot;

extern void outbox_standby_define_gucs(void);
extern bool outbox_standby_gated(void);
extern const char *outbox_standby_state_name(OutboxStandbyState state);
extern int64 outbox_standby_gate(int64 frontier, XLogRecPtr end, OutboxStandbySlot *hold,
								 long *recheck_ms);
extern int64 outbox_standby_frontier(long *recheck_ms);
extern bool outbox_standby_wait(long max_us);
extern XLogRecPtr outbox_standby_confirmed(OutboxStandbySlot *worst);
extern int	outbox_standby_catalog_holders(void);

/*---- emit.c ----*/
/* chars.c: which characters text of each kind may hold */
typedef enum OutboxTextKind
{
	OUTBOX_TEXT_TOPIC,
	OUTBOX_TEXT_PATTERN,
	OUTBOX_TEXT_KEY,
	OUTBOX_TEXT_HEADER_VALUE,
	OUTBOX_TEXT_CHANNEL
} OutboxTextKind;

extern int	outbox_bad_char(const char *s, int len, OutboxTextKind kind, pg_wchar *bad);
extern void outbox_check_text(const char *s, int len, OutboxTextKind kind, const char *what);
extern bool outbox_is_token_char(unsigned char c);
extern bool outbox_header_name_is(const char *name, int len, const char *prefix, bool exact);
extern bool outbox_header_names_match(const char *a, int alen, const char *b, int blen);

/*
 * ASCII letters and digits, whatever the database's LC_CTYPE (isalnum() in
 * a single-byte locale takes bytes such as 0xE9 for letters).
 */
static inline bool
outbox_ascii_digit(unsigned char c)
{
	return c >= '0' && c <= '9';
}

static inline bool
outbox_ascii_alnum(unsigned char c)
{
	return outbox_ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

extern const char *outbox_scan_host(const char **p, const char **host, const char **host_end,
									const char *missing);

/* destinations.c: where requests may go */
extern char *outbox_denied_destinations;
extern char *outbox_allowed_destinations;
extern uint64 outbox_destinations_generation;
extern void outbox_destinations_define_gucs(void);
extern const char *outbox_destination_refused(int family, const void *address, const char *host);
typedef struct OutboxDestinations OutboxDestinations;
extern OutboxDestinations *outbox_destinations_snapshot(void);
extern void outbox_destinations_free(OutboxDestinations *d);
extern const char *outbox_destination_refused_in(const OutboxDestinations *d, int family,
												 const void *address, const char *host,
												 char *why, size_t size);
extern char *outbox_url_host(const char *url, const char **why);

/* topic_grants.c: per-topic emit rights */
extern bool outbox_check_topic_grants;
extern void outbox_topic_grants_define_gucs(void);
extern void outbox_check_topic_grant(const char *topic, int topic_len);

/* signing.c: webhook signing keys */
typedef struct OutboxSigningKey
{
	char		kind;			/* 'h'mac (whsec_) or 'e'd25519 (whsk_) */
	uint8	   *bytes;			/* the HMAC key, or the ed25519 seed */
	int			len;			/* bytes */
	void	   *pkey;			/* EVP_PKEY of an ed25519 key, freed with
								 * the memory context it was parsed in */
} OutboxSigningKey;

extern const char *outbox_parse_signing_key(const char *text, OutboxSigningKey *key);
extern bool outbox_sign(const OutboxSigningKey *key, const char *webhook_id,
						const char *timestamp, const char *body, int body_len,
						StringInfo out);
extern void outbox_append_b64(StringInfo out, const uint8 *data, int len);

extern void outbox_emit_init(void);
extern void outbox_buffer_append(const OutboxMessage *msg);
extern void outbox_format_commit_time(TimestampTz t, char *out);

/* api.c: the checks of outbox_emit(), shared with capture.c */
extern void outbox_check_preloaded(const char *what);
extern void outbox_check_topic(text *topic_t, const char **topic, int *topic_len);
extern void outbox_check_key(text *key_t, const char **key, int *key_len);
extern void outbox_check_headers(Jsonb *headers);
extern void outbox_check_headers_size(Jsonb *headers);
extern void outbox_check_payload_size(Datum payload);
extern void outbox_make_uuid(pg_uuid_t *uuid, TimestampTz now);
extern void outbox_note_config_change(void);

/*---- storage.c ----*/
typedef struct OutboxWriter OutboxWriter;
extern Relation outbox_open_messages(LOCKMODE lockmode);
extern void outbox_ensure_counter(Relation messages);
extern Oid	outbox_storage_try_lock(LOCKMODE *mode);
extern OutboxWriter *outbox_writer_begin(int64 count);
extern int64 outbox_writer_reserve(OutboxWriter *writer, int64 count);
extern void outbox_writer_store(OutboxWriter *writer, int64 first_id,
								int64 count, OutboxNextMessage next,
								void *next_state);
extern void outbox_writer_end(OutboxWriter *writer);

/*---- queues received from in SQL transactions (the rest: queue.h) ----*/
/* queue_shmem.c */
extern void outbox_queue_shmem_request(void);
extern void outbox_queue_shmem_init(void);
/* queue_xact.c */
extern void outbox_queue_init(void);
/* queue_compact.c, run by the relay */
extern void outbox_queue_compact(void);
extern void outbox_queue_compact_done(bool committed);

#endif							/* OUTBOX_H */
