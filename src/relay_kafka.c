/*-------------------------------------------------------------------------
 *
 * relay_kafka.c
 *	  Delivery to Kafka with librdkafka.  All librdkafka use is here.
 *
 * A Kafka target has one producer, shared by its lanes: idempotent
 * (enable.idempotence, acks=all), so per partition the broker keeps the
 * order librdkafka sent in through its retries and leader changes, and
 * partitioner murmur2_random, so keys land on the partitions the Java
 * client would pick.  Each record: key = the message's key, value = its
 * payload, headers = its headers plus webhook-id, outbox-seq,
 * outbox-topic and outbox-key, on the topic the target's template names.
 *
 * Pipelined (I4 in docs/internals.md).  A lane does not wait for a
 * request's reports before it produces the next: every message of a key
 * goes to one partition, and the idempotent producer keeps a partition's
 * order through its retries, so the lane has a window of messages on the
 * wire, each with a sequence number in its msg_opaque.  Messages never
 * time out in librdkafka (message.timeout.ms 0: retried until delivered),
 * so what a producer stores of a partition is always a prefix of what it
 * was given; the relay keeps the deadline itself (timeout_ms from a
 * message's produce to its report) and, past it, gives the producer up
 * and makes it anew.  The window's delivered head is popped as reports
 * come.  When a message fails (refused, a fatal error, given up), the lane
 * produces nothing more until every report of its window is in; then that
 * message's outcome is the lane's, the messages after it that were
 * acknowledged are delivered unless an earlier message of their key was
 * not, and the rest is produced again, in order, under the same ids: per
 * key, the first copy of each message in the partition is in commit
 * order, and a copy carries its message's webhook-id.
 *
 * Threads.  librdkafka's threads block every signal and never run
 * PostgreSQL code: delivery reports, errors and logs (log.queue) wait on
 * the producer's main queue, which writes a byte to a pipe in the relay's
 * WaitEventSet when it becomes non-empty (rd_kafka_queue_io_event_enable);
 * the relay's thread serves them in rd_kafka_poll(), where the callbacks
 * only note what happened, and acts on it afterwards.  The one callback on
 * a librdkafka thread is connect_cb: it checks the address about to be
 * dialled against a copy of outbox.denied_destinations /
 * allowed_destinations (outbox_destinations_snapshot, under a mutex), so
 * the rules apply to every broker address, not only to the bootstrap list.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "catalog/pg_authid.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Most brokers in a target's bootstrap list. */
#define KAFKA_MAX_BROKERS	32
/* Kafka's longest topic name. */
#define KAFKA_MAX_TOPIC		249
/* A full producer queue: a lane tries again this much later. */
#define KAFKA_QUEUE_FULL_WAIT_MS	5

/*
 * librdkafka settings a target's properties may give; everything else is
 * refused (the relay runs as a superuser: no plugin libraries, no
 * commands, no settings that would break the guarantees).  Some take only
 * the values in kafka_check_value().
 */
static const char *const kafka_allowed_properties[] = {
	"acks", "request.required.acks", "enable.idempotence", "partitioner",
	"compression.type", "compression.codec", "compression.level",
	"linger.ms", "queue.buffering.max.ms", "batch.num.messages", "batch.size",
	"message.max.bytes", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
	"max.in.flight", "max.in.flight.requests.per.connection",
	"request.timeout.ms", "socket.timeout.ms", "socket.keepalive.enable",
	"socket.nagle.disable", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
	"socket.connection.setup.timeout.ms", "connections.max.idle.ms",
	"reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.ms",
	"retry.backoff.max.ms", "topic.metadata.refresh.interval.ms",
	"metadata.max.age.ms", "broker.address.family", "client.id", "client.rack",
	"security.protocol", "ssl.ca.location", "ssl.certificate.location",
	"ssl.key.location", "ssl.key.password", "ssl.endpoint.identification.algorithm",
	"ssl.cipher.suites", "ssl.curves.list", "ssl.sigalgs.list",
	"enable.ssl.certificate.verification", "sasl.mechanism", "sasl.mechanisms",
	"sasl.username", "sasl.password", "api.version.request",
	"broker.version.fallback", "sticky.partitioning.linger.ms",
	"allow.auto.create.topics",
	NULL
};

/* Properties whose values are secrets: never in a message. */
static bool
kafka_secret_property(const char *name)
{
	return strcmp(name, "sasl.password") == 0 || strcmp(name, "ssl.key.password") == 0;
}

/* Events of the pipe librdkafka writes to; shared by every producer. */
static int	wake_pipe[2] = {-1, -1};
static uint64 next_serial = 1;
static int	requests_in_flight = 0;

/* The destination rules connect_cb checks, and why it last refused. */
static pthread_mutex_t rules_lock = PTHREAD_MUTEX_INITIALIZER;
static OutboxDestinations *rules = NULL;
static uint64 rules_generation = 0;

/* A target's producer (RelayTarget.priv). */
typedef struct RelayKafkaTarget
{
	rd_kafka_t *rk;
	uint64		serial;			/* connect_cb and callbacks name it so */
	char	   *brokers;		/* the bootstrap list it was made for */
	char	   *properties;		/* and the properties (their JSON text) */
	uint64		destinations;	/* outbox_destinations_generation then */
	bool		filled_topic;	/* made for a topic filled in from messages
								 * (allow.auto.create.topics=false) */
	bool		broken;			/* a fatal error: make it anew */
	char		down[RELAY_MAX_ERROR_LEN + 1];	/* why brokers are out of
												 * reach, or "" */
	TimestampTz down_at;		/* when that was said */
	char		refused[RELAY_MAX_ERROR_LEN + 1];	/* connect_cb's last
													 * refusal (under
													 * rules_lock) */
	char		fatal[RELAY_MAX_ERROR_LEN + 1];
	char		last_log[RELAY_MAX_ERROR_LEN + 1];	/* a warning to log */
	TimestampTz logged_at;		/* when the relay last logged one */
	StringInfoData topic;		/* reused: a message's topic */
	StringInfoData value;		/* reused: a structured CloudEvent */
} RelayKafkaTarget;

/* Where a message of a lane's window stands. */
#define KW_WAITING	0
#define KW_ACKED	1
#define KW_FAILED	2

/*
 * A lane's window (RelayLane.priv): the messages on the wire, numbered
 * from 0 in each window (seq), the first of them the lane's head.
 */
typedef struct KafkaWindow
{
	uint32		generation;		/* a report of an earlier window is ignored */
	uint64		base;			/* seq of the lane's head */
	uint64		next;			/* seq of the next message produced */
	int			cap;			/* slots of the rings (a power of 2) */
	uint8	   *state;			/* KW_*, by seq & (cap - 1) */
	TimestampTz *sent_at;		/* when it was produced */
	bool		bad;			/* a message failed: nothing more is sent */
	uint64		bad_seq;		/* the first of them */
	RelayOutcomeKind bad_kind;
	char		bad_error[RELAY_MAX_ERROR_LEN + 1];
	bool		given_up;		/* what is still awaited is not waited for */
	RelayOutcomeKind given_up_kind;
	char		given_up_error[RELAY_MAX_ERROR_LEN + 1];
	bool	   *acked;			/* the outcome's, by position */
	int			maxacked;
	uint32		topic_hash;		/* of the topic template it started with */
} KafkaWindow;

#define KAFKA_TARGET(t)	((RelayKafkaTarget *) (t)->priv)
#define KAFKA_WINDOW(lane)	((KafkaWindow *) (lane)->priv)

/* msg_opaque: lane (9 bits), window generation (15 bits), seq (40 bits). */
#define KAFKA_SEQ_BITS	40
#define KAFKA_GEN_MASK	0x7fff
#define KAFKA_OPAQUE(lane, generation, seq) \
	((void *) (uintptr_t) (((uint64) (lane) << 55) | \
						   ((uint64) ((generation) & KAFKA_GEN_MASK) << KAFKA_SEQ_BITS) | \
						   ((uint64) (seq) & ((UINT64CONST(1) << KAFKA_SEQ_BITS) - 1))))

StaticAssertDecl(sizeof(void *) >= 8, "msg_opaque packs 64 bits into a pointer");

/*---- checks, for the SQL functions and for rows read ----*/

/*
 * Whether brokers is a bootstrap list the relay takes: host:port entries
 * separated by commas.  Returns why not, or NULL.
 */
const char *
relay_kafka_check_brokers(const char *brokers)
{
	const char *p = brokers;
	int			n = 0;

	if (brokers == NULL || *brokers == '\0')
		return "it is empty";
	for (;;)
	{
		const char *h;
		const char *hend;
		const char *bad;
		long		port;
		char	   *end;

		while (*p == ' ')
			p++;
		if ((bad = outbox_scan_host(&p, &h, &hend, "a broker has no host, or one that is too long")) != NULL)
			return bad;
		if (*p != ':' || !outbox_ascii_digit((unsigned char) p[1]))
			return "each broker must be host:port (no scheme, no user information)";
		port = strtol(p + 1, &end, 10);
		if (port < 1 || port > 65535)
			return "a port is not between 1 and 65535";
		p = end;
		if (++n > KAFKA_MAX_BROKERS)
			return "it has more than 32 brokers";
		while (*p == ' ')
			p++;
		if (*p == '\0')
			return NULL;
		if (*p != ',')
			return "brokers must be host:port separated by commas";
		p++;
	}
}

/* Whether s[0..len) is a Kafka topic name: [A-Za-z0-9._-], 1 to 249. */
static bool
kafka_valid_topic(const char *s, int len)
{
	int			i;

	if (len < 1 || len > KAFKA_MAX_TOPIC || (len == 1 && s[0] == '.') ||
		(len == 2 && s[0] == '.' && s[1] == '.'))
		return false;
	for (i = 0; i < len; i++)
		if (!outbox_ascii_alnum((unsigned char) s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
			return false;
	return true;
}

/*
 * Whether template is a topic template: a Kafka topic name in which
 * {topic} stands for the message's topic.  Returns why not, or NULL.
 */
const char *
relay_kafka_check_topic(const char *template)
{
	StringInfoData buf;
	const char *p;
	bool		ok;

	initStringInfo(&buf);
	for (p = template; *p; p++)
	{
		if (*p == '{' && strncmp(p, "{topic}", 7) == 0)
		{
			appendStringInfoChar(&buf, 't');
			p += 6;
		}
		else
			appendStringInfoChar(&buf, *p);
	}
	ok = kafka_valid_topic(buf.data, buf.len);
	pfree(buf.data);
	if (!ok)
		return "it is not a Kafka topic name (1 to 249 of A-Z a-z 0-9 . _ -) with {topic} standing for the message's topic";
	return NULL;
}

/* A value the relay takes for a property that must keep the guarantees. */
static const char *
kafka_check_value(const char *name, const char *value)
{
	if ((strcmp(name, "acks") == 0 || strcmp(name, "request.required.acks") == 0) &&
		strcmp(value, "all") != 0 && strcmp(value, "-1") != 0)
		return "acks must be all: a record counts as delivered only once every in-sync replica has it";
	if (strcmp(name, "enable.idempotence") == 0 && strcmp(value, "true") != 0)
		return "enable.idempotence must be true: without it retries may reorder a partition";
	if (strcmp(name, "partitioner") == 0 &&
		strcmp(value, "murmur2_random") != 0 && strcmp(value, "murmur2") != 0 &&
		strcmp(value, "consistent_random") != 0 && strcmp(value, "consistent") != 0 &&
		strcmp(value, "fnv1a_random") != 0 && strcmp(value, "fnv1a") != 0)
		return "partitioner must be one that sends a key to one partition: murmur2_random (the default, as the Java client), murmur2, consistent_random, consistent, fnv1a_random or fnv1a";
	if ((strcmp(name, "max.in.flight") == 0 ||
		 strcmp(name, "max.in.flight.requests.per.connection") == 0) &&
		(atoi(value) < 1 || atoi(value) > 5))
		return "max.in.flight must be between 1 and 5 with the idempotent producer";
	return NULL;
}

/*
 * Walk a properties object: call fn for each name and value (text; a
 * number or boolean in its JSON form).  Returns why the object is not
 * usable, or NULL.
 */
static const char *
kafka_properties(Jsonb *jb, void (*fn) (const char *name, const char *value, void *arg),
				 void *arg)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *name = NULL;
	static char why[300];

	if (jb == NULL)
		return NULL;
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		return "properties is not a JSON object";
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			name = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_VALUE)
		{
			char	   *value;
			const char *bad;
			int			i;

			for (i = 0; kafka_allowed_properties[i] != NULL; i++)
				if (strcmp(kafka_allowed_properties[i], name) == 0)
					break;
			if (kafka_allowed_properties[i] == NULL)
			{
				snprintf(why, sizeof(why), "property \"%.100s\" is not one the relay passes on", name);
				return why;
			}
			if (v.type == jbvString)
				value = pnstrdup(v.val.string.val, v.val.string.len);
			else if (v.type == jbvNumeric)
				value = DatumGetCString(DirectFunctionCall1(numeric_out,
															NumericGetDatum(v.val.numeric)));
			else if (v.type == jbvBool)
				value = pstrdup(v.val.boolean ? "true" : "false");
			else
			{
				snprintf(why, sizeof(why), "property \"%.100s\" is not a string, number or boolean", name);
				return why;
			}
			if (strlen(value) >= 4096)
				return "a property value is too long";
			if ((bad = kafka_check_value(name, value)) != NULL)
				return bad;
			if (fn)
				fn(name, value, arg);
		}
	}
	return NULL;
}

const char *
relay_kafka_check_properties(Jsonb *jb)
{
	return kafka_properties(jb, NULL, NULL);
}

/*
 * A property naming a file the relay (the server's user) would read: only
 * for a role that may read server files, as with an HTTP target's TLS
 * files.
 */
static void
kafka_check_file_property(const char *name, const char *value, void *arg)
{
	if (strncmp(name, "ssl.", 4) == 0 && strlen(name) > 9 &&
		strcmp(name + strlen(name) - 9, ".location") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to name a server file in property \"%s\"", name),
				 errdetail("The relay reads the file as the database server's user."),
				 errhint("Only roles with privileges of pg_read_server_files may set it.")));
}

PG_FUNCTION_INFO_V1(outbox_check_kafka_target);

/*
 * outbox.check_kafka_target(brokers, topic, properties): the checks of a
 * Kafka target's options, for create_kafka_target() and alter_target().
 */
Datum
outbox_check_kafka_target(PG_FUNCTION_ARGS)
{
	char	   *brokers = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *topic = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	Jsonb	   *props = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	const char *why;

	if ((why = relay_kafka_check_brokers(brokers)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Kafka bootstrap list %s", brokers ? quote_literal_cstr(brokers) : "NULL"),
				 errdetail("The list is not usable: %s.", why),
				 errhint("Give host:port, or several separated by commas, as in 'kafka1:9092,kafka2:9092'.")));
	if (topic == NULL || (why = relay_kafka_check_topic(topic)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Kafka topic %s", topic ? quote_literal_cstr(topic) : "NULL"),
				 errdetail("The topic is not usable: %s.", topic ? why : "it is NULL"),
				 errhint("Give a topic name, or a template such as 'outbox.{topic}'.")));
	if (props != NULL && !has_privs_of_role(GetUserId(), ROLE_PG_READ_SERVER_FILES))
		kafka_properties(props, kafka_check_file_property, NULL);
	if ((why = relay_kafka_check_properties(props)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Kafka properties"),
				 errdetail("The properties are not usable: %s.", why),
				 errhint("Properties pass librdkafka settings such as TLS, SASL, compression and linger.ms; docs/brokers.md lists those taken.")));
	PG_RETURN_VOID();
}

/*---- on librdkafka's threads: connect_cb only ----*/

static int
kafka_connect_cb(int sockfd, const struct sockaddr *addr, int addrlen, const char *id,
				 void *opaque)
{
	char		why[RELAY_MAX_ERROR_LEN + 1];
	const char *refused = NULL;

	pthread_mutex_lock(&rules_lock);
	if (rules == NULL)
		refused = "the destination rules are not known";
	else if (addr->sa_family == AF_INET)
		refused = outbox_destination_refused_in(rules, AF_INET,
												&((const struct sockaddr_in *) addr)->sin_addr,
												NULL, why, sizeof(why));
	else if (addr->sa_family == AF_INET6)
		refused = outbox_destination_refused_in(rules, AF_INET6,
												&((const struct sockaddr_in6 *) addr)->sin6_addr,
												NULL, why, sizeof(why));
	else
		refused = "not an Internet address";
	if (refused != NULL && opaque != NULL)
	{
		RelayKafkaTarget *kt = (RelayKafkaTarget *) opaque;

		snprintf(kt->refused, sizeof(kt->refused), "connection refused by the relay: %s",
				 refused);
	}
	pthread_mutex_unlock(&rules_lock);
	if (refused != NULL)
		return ECONNREFUSED;
	if (connect(sockfd, addr, addrlen) != 0 && errno != EINPROGRESS)
		return errno;
	return 0;
}

/*---- callbacks served by rd_kafka_poll() on the relay's thread ----*/

static RelayOutcomeKind
kafka_error_class(RelayKafkaTarget *kt, rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
			return RELAY_REJECTED;
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
		case RD_KAFKA_RESP_ERR__SSL:
			return RELAY_RECEIVER_FAILED;
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
			/* The brokers are out of reach: hold, rather than use up attempts. */
			return kt->down[0] != '\0' ? RELAY_RECEIVER_FAILED : RELAY_RETRY;
		default:
			return RELAY_RETRY;
	}
}

/*
 * An error about the topic itself (unknown, no such partition, not ours to
 * write) of a topic the message filled in: the message's doing, not the
 * target's (I10): retried on its lane, then a dead letter.  Otherwise the
 * class of kafka_error_class().  error (size bytes) gets the text, naming
 * the topic.
 */
static RelayOutcomeKind
kafka_outcome_class(RelayTarget *t, RelayKafkaTarget *kt, rd_kafka_resp_err_t err,
					const char *topic, const char *prefix, char *error, size_t size)
{
	if ((err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
		 err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
		 err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION ||
		 err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) &&
		topic != NULL && relay_template_filled(t->topic))
	{
		char		shown[RELAY_SHOWN_LEN];

		relay_shown(shown, sizeof(shown), topic, strlen(topic));
		snprintf(error, size, "%sthe Kafka cluster does not take topic \"%s\": %s",
				 prefix, shown, rd_kafka_err2str(err));
		return RELAY_UNROUTABLE;
	}
	snprintf(error, size, "%s%s", prefix, rd_kafka_err2str(err));
	return kafka_error_class(kt, err);
}

static RelayTarget *
kafka_target_of(uint64 serial)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_KAFKA && t->priv != NULL && KAFKA_TARGET(t)->serial == serial)
			return t;
	}
	return NULL;
}

/*
 * Message seq of the lane's window failed (kind, error): nothing more is
 * sent until the window has drained.
 */
static void
kafka_window_bad(KafkaWindow *kw, uint64 seq, RelayOutcomeKind kind, const char *error)
{
	kw->state[seq & (kw->cap - 1)] = KW_FAILED;
	if (kw->bad && kw->bad_seq <= seq)
		return;
	kw->bad = true;
	kw->bad_seq = seq;
	kw->bad_kind = kind;
	strlcpy(kw->bad_error, error, sizeof(kw->bad_error));
}

/* A delivery report: note it in its lane's window (acted on after the poll). */
static void
kafka_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	RelayKafkaTarget *kt = (RelayKafkaTarget *) opaque;
	RelayTarget *t = kafka_target_of(kt->serial);
	uint64		packed = (uint64) (uintptr_t) msg->_private;
	int			lane_index = (int) (packed >> 55);
	uint32		generation = (uint32) ((packed >> KAFKA_SEQ_BITS) & KAFKA_GEN_MASK);
	uint64		seq = packed & ((UINT64CONST(1) << KAFKA_SEQ_BITS) - 1);
	RelayLane  *lane;
	KafkaWindow *kw;

	if (t == NULL || t->priv != kt || lane_index >= t->nlanes)
		return;
	lane = &t->lanes[lane_index];
	kw = KAFKA_WINDOW(lane);
	if (!lane->in_flight || generation != (kw->generation & KAFKA_GEN_MASK) ||
		seq < kw->base || seq >= kw->next ||
		kw->state[seq & (kw->cap - 1)] != KW_WAITING)
		return;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR && msg->offset < 0)
	{
		/*
		 * Delivered without an offset: librdkafka's implicit
		 * acknowledgement of a batch that failed, because a later one of
		 * its partition got through.  A broker would have refused the later
		 * one had the first not been stored, but not every broker (the mock
		 * cluster does not check): sent again, a duplicate at worst, the
		 * target held a moment (no attempt counted: it is not the
		 * message's fault).
		 */
		kafka_window_bad(kw, seq, RELAY_RECEIVER_FAILED,
						 "delivery reported without an offset (acknowledged by a later batch): sent again");
	}
	else if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		kw->state[seq & (kw->cap - 1)] = KW_ACKED;
		kt->down[0] = '\0';	/* a message went through: the brokers are back */
	}
	else
	{
		char		error[RELAY_MAX_ERROR_LEN + 1];
		RelayOutcomeKind kind;

		kind = kafka_outcome_class(t, kt, msg->err,
								   msg->rkt ? rd_kafka_topic_name(msg->rkt) : NULL,
								   "", error, sizeof(error));
		if (kind == RELAY_RECEIVER_FAILED && kt->down[0] != '\0' &&
			(msg->err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT ||
			 msg->err == RD_KAFKA_RESP_ERR__TRANSPORT ||
			 msg->err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN))
			snprintf(error, sizeof(error), "%s (%s)", rd_kafka_err2str(msg->err), kt->down);
		kafka_window_bad(kw, seq, kind, error);
	}
}

/* An error of the producer: note what it says of the brokers. */
static void
kafka_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	RelayKafkaTarget *kt = (RelayKafkaTarget *) opaque;

	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char		fatal[RELAY_MAX_ERROR_LEN + 1];

		(void) rd_kafka_fatal_error(rk, fatal, sizeof(fatal));
		snprintf(kt->fatal, sizeof(kt->fatal), "%s", fatal);
		kt->broken = true;
		return;
	}
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN || err == RD_KAFKA_RESP_ERR__TRANSPORT ||
		err == RD_KAFKA_RESP_ERR__RESOLVE || err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
		err == RD_KAFKA_RESP_ERR__SSL)
	{
		pthread_mutex_lock(&rules_lock);
		if (kt->refused[0] != '\0')
			snprintf(kt->down, sizeof(kt->down), "%s", kt->refused);
		else
			snprintf(kt->down, sizeof(kt->down), "%s", reason ? reason : rd_kafka_err2str(err));
		pthread_mutex_unlock(&rules_lock);
		kt->down_at = GetCurrentTimestamp();
	}
}

/* A log line (log.queue: served by poll): kept, logged after the poll. */
static void
kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	RelayKafkaTarget *kt = (RelayKafkaTarget *) rd_kafka_opaque(rk);

	if (kt != NULL && level <= 4)	/* LOG_WARNING and worse */
		snprintf(kt->last_log, sizeof(kt->last_log), "%s: %s", fac, buf);
}

/*---- on the relay's thread ----*/

static int
relay_kafka_start(void)
{
	return relay_wake_pipe(wake_pipe);
}

/* Drop a target's producer: what it still holds is given up. */
static void
kafka_destroy(RelayKafkaTarget *kt)
{
	if (kt->rk == NULL)
		return;
	(void) rd_kafka_purge(kt->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	rd_kafka_destroy(kt->rk);
	kt->rk = NULL;
}

static void
relay_kafka_stop(void)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_KAFKA && t->priv != NULL)
			kafka_destroy(KAFKA_TARGET(t));
	}
}

/* Take the destination rules in force for connect_cb, if they changed. */
static void
kafka_refresh_rules(void)
{
	OutboxDestinations *fresh;
	OutboxDestinations *old;

	if (rules != NULL && rules_generation == outbox_destinations_generation)
		return;
	fresh = outbox_destinations_snapshot();
	if (fresh == NULL)
		return;
	pthread_mutex_lock(&rules_lock);
	old = rules;
	rules = fresh;
	rules_generation = outbox_destinations_generation;
	pthread_mutex_unlock(&rules_lock);
	outbox_destinations_free(old);
}

typedef struct KafkaConfArg
{
	rd_kafka_conf_t *conf;
	char	   *errstr;
	size_t		errsize;
	bool		failed;
} KafkaConfArg;

static void
kafka_set_property(const char *name, const char *value, void *arg)
{
	KafkaConfArg *a = (KafkaConfArg *) arg;

	if (a->failed)
		return;
	if (rd_kafka_conf_set(a->conf, name, value, a->errstr, a->errsize) != RD_KAFKA_CONF_OK)
	{
		a->failed = true;
		/* librdkafka may quote the value: not for a secret. */
		if (kafka_secret_property(name))
			snprintf(a->errstr, a->errsize, "property \"%s\" is not accepted by librdkafka", name);
	}
}

/* The fail-everything-in-flight of a target whose producer goes. */
static void
kafka_fail_in_flight(RelayTarget *t, RelayOutcomeKind kind, const char *error);

/*
 * Whether the target's producer is one to go on with: made, not failed for
 * good, and made for the target's bootstrap list, properties, topic and
 * destination rules.
 */
static bool
kafka_current(RelayTarget *t)
{
	RelayKafkaTarget *kt = KAFKA_TARGET(t);

	return kt->rk != NULL && !kt->broken &&
		kt->destinations == outbox_destinations_generation &&
		kt->filled_topic == relay_template_filled(t->topic) &&
		strcmp(kt->brokers, t->url) == 0 &&
		strcmp(kt->properties, t->properties ? t->properties : "") == 0;
}

/*
 * Make the target's producer if it has none, or one made for another
 * bootstrap list, other properties or other destination rules.  Returns
 * false, with *why, when it cannot be made.
 */
static bool
kafka_connect(RelayTarget *t, const char **why)
{
	RelayKafkaTarget *kt = KAFKA_TARGET(t);
	rd_kafka_conf_t *conf;
	static char errstr[512];
	const char *props = t->properties ? t->properties : "";
	KafkaConfArg arg;
		MemoryContext oldcxt;

	kafka_refresh_rules();
	if (kafka_current(t))
		return true;
	if (kt->rk != NULL)
	{
		kafka_fail_in_flight(t, RELAY_RETRY, kt->broken ?
							 "the Kafka producer failed for good, and is made anew" :
							 "the target's settings changed: its producer is made anew");
		kafka_destroy(kt);
	}
	kt->broken = false;
	kt->down[0] = '\0';
	kt->refused[0] = '\0';

	conf = rd_kafka_conf_new();
	errstr[0] = '\0';
	arg.conf = conf;
	arg.errstr = errstr;
	arg.errsize = sizeof(errstr);
	arg.failed = false;
	/* The guarantees first; then the target's properties, checked. */
	kafka_set_property("bootstrap.servers", t->url, &arg);
	kafka_set_property("enable.idempotence", "true", &arg);
	kafka_set_property("acks", "all", &arg);
	kafka_set_property("partitioner", "murmur2_random", &arg);
	/*
	 * Retried until delivered, never timed out (a gap in a partition): the
	 * relay keeps timeout_ms itself (relay_kafka_drive()).
	 */
	kafka_set_property("message.timeout.ms", "0", &arg);
	kafka_set_property("topic.metadata.propagation.max.ms", "2000", &arg);
	kafka_set_property("log.queue", "true", &arg);
	/*
	 * A topic filled in from a message does not make the cluster create
	 * it (I10): a topic the cluster lacks is that message's failure
	 * (RELAY_UNROUTABLE).  Properties may allow it.  A topic the target
	 * names itself is the administrator's, and the producer's default
	 * (the broker's auto.create.topics.enable decides) stays.
	 */
	kt->filled_topic = relay_template_filled(t->topic);
	if (kt->filled_topic)
		kafka_set_property("allow.auto.create.topics", "false", &arg);
	/*
	 * Latency from commit to broker: Nagle's algorithm with delayed ACKs
	 * would add ~40 ms to a request that waits for the one before.  A
	 * linger of 5 ms (librdkafka's default): 1 ms took 2 ms less at 1,000
	 * changes a second but twice the relay's CPU, and was slower from
	 * 2,500 on (docs/performance.md, commit_bench.sh).  Both may be set in
	 * properties.
	 */
	kafka_set_property("socket.nagle.disable", "true", &arg);
	kafka_set_property("linger.ms", "5", &arg);
	kafka_set_property("client.id", "outbox-relay", &arg);
	if (!arg.failed && t->properties_jb != NULL)
	{
		const char *bad = kafka_properties(t->properties_jb, kafka_set_property, &arg);

		if (bad != NULL)
		{
			snprintf(errstr, sizeof(errstr), "%s", bad);
			arg.failed = true;
		}
	}
	if (arg.failed)
	{
		rd_kafka_conf_destroy(conf);
		*why = errstr;
		return false;
	}
	kt->serial = next_serial++;
	rd_kafka_conf_set_opaque(conf, kt);
	rd_kafka_conf_set_dr_msg_cb(conf, kafka_dr_cb);
	rd_kafka_conf_set_error_cb(conf, kafka_error_cb);
	rd_kafka_conf_set_log_cb(conf, kafka_log_cb);
	rd_kafka_conf_set_connect_cb(conf, kafka_connect_cb);

	/* librdkafka blocks every signal in the threads it starts. */
	kt->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (kt->rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		*why = errstr;
		return false;
	}
	(void) rd_kafka_set_log_queue(kt->rk, NULL);
	{
		rd_kafka_queue_t *q = rd_kafka_queue_get_main(kt->rk);

		rd_kafka_queue_io_event_enable(q, wake_pipe[1], "k", 1);
		rd_kafka_queue_destroy(q);
	}
	oldcxt = MemoryContextSwitchTo(t->cxt);
	if (kt->brokers)
		pfree(kt->brokers);
	if (kt->properties)
		pfree(kt->properties);
	kt->brokers = pstrdup(t->url);
	kt->properties = pstrdup(props);
	MemoryContextSwitchTo(oldcxt);
	kt->destinations = outbox_destinations_generation;
	return true;
}

static void
relay_kafka_target_init(RelayTarget *t)
{
	RelayKafkaTarget *kt = MemoryContextAllocZero(t->cxt, sizeof(RelayKafkaTarget));
	MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

	initStringInfo(&kt->topic);
	initStringInfo(&kt->value);
	MemoryContextSwitchTo(oldcxt);
	t->priv = kt;
}

/* After its lanes: the target's producer is dropped. */
static void
relay_kafka_target_release(RelayTarget *t)
{
	kafka_destroy(KAFKA_TARGET(t));
	t->priv = NULL;
}

/*---- a lane's window ----*/

static void
relay_kafka_lane_init(RelayLane *lane)
{
	lane->priv = MemoryContextAllocZero(lane->target->cxt, sizeof(KafkaWindow));
}

/* The lane's window is over: nothing of it is awaited any more. */
static void
kafka_window_end(RelayLane *lane)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);

	kw->generation++;
	kw->base = kw->next = 0;
	kw->bad = kw->given_up = false;
	if (lane->in_flight)
		requests_in_flight--;
	lane->in_flight = false;
}

static void
relay_kafka_lane_release(RelayLane *lane)
{
	kafka_window_end(lane);
}

/* Room in the window's rings for one more message (in the target's memory). */
static void
kafka_window_reserve(RelayTarget *t, KafkaWindow *kw)
{
	int			cap;
	uint8	   *state;
	TimestampTz *sent_at;
	uint64		seq;

	if (kw->next - kw->base < (uint64) kw->cap)
		return;
	cap = Max(64, kw->cap * 2);
	state = MemoryContextAlloc(t->cxt, cap);
	sent_at = MemoryContextAlloc(t->cxt, cap * sizeof(TimestampTz));
	for (seq = kw->base; seq < kw->next; seq++)
	{
		state[seq & (cap - 1)] = kw->state[seq & (kw->cap - 1)];
		sent_at[seq & (cap - 1)] = kw->sent_at[seq & (kw->cap - 1)];
	}
	if (kw->state)
	{
		pfree(kw->state);
		pfree(kw->sent_at);
	}
	kw->state = state;
	kw->sent_at = sent_at;
	kw->cap = cap;
}

/* Message m goes into the lane's window, the next seq, as state says. */
static uint64
kafka_window_add(RelayLane *lane, RelayMessage *m, int state, TimestampTz now)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	uint64		seq;

	kafka_window_reserve(lane->target, kw);
	seq = kw->next++;
	kw->state[seq & (kw->cap - 1)] = state;
	kw->sent_at[seq & (kw->cap - 1)] = now;
	lane->nbatch++;
	lane->sent_last = m;
	if (!lane->in_flight)
	{
		lane->in_flight = true;
		requests_in_flight++;
	}
	return seq;
}

/*
 * The first message of the lane not on the wire failed before it was
 * produced (kind, error): it joins the window as failed, and the window's
 * outcome follows once the rest of it has come back.  The transport's
 * window_fail.
 */
static void
kafka_window_fail_next(RelayLane *lane, const RelayOutcome *failed)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	RelayMessage *m = lane->sent_last != NULL ? lane->sent_last->next : NULL;
	const char *error = failed->error ? failed->error : "could not produce to Kafka";

	if (m == NULL || !lane->in_flight)
	{
		/* nothing to fail but what is on the wire: give it up */
		kw->given_up = true;
		kw->given_up_kind = failed->kind;
		strlcpy(kw->given_up_error, error, sizeof(kw->given_up_error));
		return;
	}
	kafka_window_bad(kw, kafka_window_add(lane, m, KW_FAILED, GetCurrentTimestamp()),
					 failed->kind, error);
}

/* Pop the window's head that was acknowledged. */
static void
kafka_window_pop(RelayLane *lane)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	int			n = 0;

	while (kw->base + n < kw->next &&
		   kw->state[(kw->base + n) & (kw->cap - 1)] == KW_ACKED)
		n++;
	if (n == 0)
		return;
	kw->base += n;
	relay_lane_delivered_head(lane, n);
}

/*
 * Which of the window's nb messages count as delivered in its outcome
 * (kw->acked, by position from the head, which failed): those
 * acknowledged, unless an earlier message of their key was not (it is sent
 * again, and they after it).
 */
static void
kafka_window_acked(RelayLane *lane, KafkaWindow *kw, int nb)
{
	RelayMessage **held;
	RelayMessage *m;
	uint32		mask = 1;
	int			pos;

	if (kw->maxacked < nb)
	{
		if (kw->acked)
			pfree(kw->acked);
		kw->maxacked = Max(nb, 64);
		kw->acked = MemoryContextAlloc(lane->target->cxt, kw->maxacked * sizeof(bool));
	}
	/* the keys held back so far, in an open-addressing set */
	while (mask < (uint32) (2 * nb))
		mask <<= 1;
	held = palloc0(mask * sizeof(RelayMessage *));
	mask--;
	for (m = lane->head, pos = 0; pos < nb && m != NULL; m = m->next, pos++)
	{
		bool		acked = pos > 0 &&
			kw->state[(kw->base + pos) & (kw->cap - 1)] == KW_ACKED;

		if (m->key != NULL)
		{
			uint32		slot = m->key_hash & mask;
			RelayMessage *o;

			while ((o = held[slot]) != NULL &&
				   !(o->key_hash == m->key_hash && strcmp(o->key, m->key) == 0))
				slot = (slot + 1) & mask;
			if (o != NULL)
				acked = false;
			else if (!acked)
				held[slot] = m;
		}
		kw->acked[pos] = acked;
	}
	pfree(held);
}

/*
 * What came back of the lane's window: its acknowledged head is popped;
 * once a window with a failure has every report in (or was given up), its
 * outcome is reported: the head's failure (or why it was given up), and
 * which of the rest were delivered.
 */
static void
kafka_window_settle(RelayLane *lane, RelayFinishedFn finished)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	RelayOutcome outcome;
	uint64		seq;
	int			nb;

	kafka_window_pop(lane);
	if (kw->base == kw->next)
	{
		kafka_window_end(lane);
		return;
	}
	if (!kw->bad && !kw->given_up)
		return;
	if (!kw->given_up)
		for (seq = kw->base; seq < kw->next; seq++)
			if (kw->state[seq & (kw->cap - 1)] == KW_WAITING)
				return;			/* the rest is still out */
	nb = (int) (kw->next - kw->base);
	Assert(nb == lane->nbatch);
	memset(&outcome, 0, sizeof(outcome));
	if (kw->state[kw->base & (kw->cap - 1)] == KW_FAILED)
	{
		Assert(kw->bad && kw->bad_seq == kw->base);
		outcome.kind = kw->bad_kind;
		outcome.error = kw->bad_error;
	}
	else
	{
		outcome.kind = kw->given_up_kind;
		outcome.error = kw->given_up_error;
	}
	kafka_window_acked(lane, kw, nb);
	outcome.acked = kw->acked;
	outcome.nsent = nb;
	kafka_window_end(lane);
	finished(lane, &outcome);
}

/* Give the window up: what is still awaited fails with kind, error. */
static void
kafka_window_give_up(RelayLane *lane, RelayOutcomeKind kind, const char *error)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);

	kw->given_up = true;
	kw->given_up_kind = kind;
	strlcpy(kw->given_up_error, error, sizeof(kw->given_up_error));
}

/*
 * Forget the window, with no outcome (its producer goes for a reason not
 * its own): what was acknowledged at its head is delivered, the rest goes
 * again in the lane's next request.
 */
static void
kafka_window_forget(RelayLane *lane)
{
	kafka_window_pop(lane);
	kafka_window_end(lane);
	lane->nbatch = 0;
	lane->sent_last = NULL;
}

/* When the window's oldest message awaited is overdue, or 0 for none. */
static TimestampTz
kafka_window_deadline(RelayLane *lane)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	uint64		seq;

	if (!lane->in_flight || kw->given_up)
		return 0;
	for (seq = kw->base; seq < kw->next; seq++)
		if (kw->state[seq & (kw->cap - 1)] == KW_WAITING)
			return TimestampTzPlusMilliseconds(kw->sent_at[seq & (kw->cap - 1)],
											   lane->target->timeout_ms);
	return 0;
}

/*
 * The transport's pipelines: a target whose topic template is not filled
 * in from the message, so that a key has one partition (a key over
 * several topics is ordered only by waiting, as for the other
 * transports).
 */
static bool
relay_kafka_pipelines(RelayTarget *t)
{
	return !relay_template_filled(t->topic);
}

/*
 * The transport's extends: the window may take more: nothing in it failed,
 * the producer goes on, the topic template is the one the window started
 * with (a new topic is a new partition for each key: the window drains
 * first), and its sequence numbers are far from running out.
 */
static bool
relay_kafka_extends(RelayLane *lane)
{
	KafkaWindow *kw = KAFKA_WINDOW(lane);

	return !kw->bad && !kw->given_up && kafka_current(lane->target) &&
		kw->topic_hash == hash_bytes((const unsigned char *) lane->target->topic,
									 strlen(lane->target->topic)) &&
		kw->next < (UINT64CONST(1) << (KAFKA_SEQ_BITS - 1));
}

/*
 * The record's topic into buf: the template with {topic} filled in.
 * Returns why it is not one to produce to, or NULL.
 */
static const char *
kafka_topic(RelayTarget *t, RelayMessage *m, StringInfo buf)
{
	if (!relay_template_fill(t->topic, m, buf) || !kafka_valid_topic(buf->data, buf->len))
		return "the topic template filled in with the message's topic is not a Kafka topic name";
	/*
	 * The cluster's own topics and its tools' (__consumer_offsets,
	 * _schemas, _confluent-*, ksqlDB's command topics): the template's to
	 * name (I10).
	 */
	if ((buf->data[0] == '_' && t->topic[0] != '_') ||
		(strncmp(buf->data, "__", 2) == 0 && strncmp(t->topic, "__", 2) != 0))
		return "the topic begins with \"_\", as the internal topics of the cluster and its tools do, which only the target's topic template may name";
	return NULL;
}

/*
 * Produce the lane's next request: the cut_n messages after its window
 * (relay_lane_cut()), into the window.  Returns false, with *failed set,
 * when not one could be produced.
 */
static bool
relay_kafka_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayKafkaTarget *kt = KAFKA_TARGET(t);
	KafkaWindow *kw = KAFKA_WINDOW(lane);
	bool		extending = lane->in_flight;
	RelayMessage *m = extending ? lane->sent_last->next : lane->head;
	const char *why = NULL;
	char		number[32];
	static char error[RELAY_MAX_ERROR_LEN + 1]; /* failed->error, after */
	TimestampTz now;
	int			produced = 0;
	int			i;

	Assert(m != NULL && lane->cut_n > 0);
	memset(failed, 0, sizeof(*failed));

	/* A window goes on with its producer (relay_kafka_extends()). */
	if (!extending && !kafka_connect(t, &why))
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = why;
		return false;
	}
	now = GetCurrentTimestamp();
	if (!extending)
		kw->topic_hash = hash_bytes((const unsigned char *) t->topic, strlen(t->topic));

	for (i = 0; i < lane->cut_n; m = m->next, i++)
	{
		const char *bad;
		const char *topic;
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t err;
		char	   *p;
		void	   *value;
		size_t		value_len;
		uint64		seq;

		/* each message: an error after some of the request went (TAP 077) */
		relay_test_fault("send", m->topic);
		bad = kafka_topic(t, m, &kt->topic);
		topic = kt->topic.data;
		if (bad != NULL)
		{
			char		shown[RELAY_SHOWN_LEN];

			relay_shown(shown, sizeof(shown), kt->topic.data, kt->topic.len);
			snprintf(error, sizeof(error), "%s (\"%s\")", bad, shown);
			failed->kind = RELAY_REJECTED;
			failed->error = error;
			break;
		}
		hdrs = rd_kafka_headers_new(8);
		if (t->format == RELAY_FORMAT_CE_BINARY)
		{
			RelayCeAttrs a;
			char		name[32];
			int			j;

			/* The Kafka binding: ce_ headers, datacontenttype as content-type. */
			relay_ce_attrs(t, m, &a);
			for (j = 0; j < a.n; j++)
			{
				if (strcmp(a.name[j], "datacontenttype") == 0)
					rd_kafka_header_add(hdrs, "content-type", -1, a.value[j], -1);
				else
				{
					snprintf(name, sizeof(name), "ce_%s", a.name[j]);
					rd_kafka_header_add(hdrs, name, -1, a.value[j], -1);
				}
			}
		}
		else if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			resetStringInfo(&kt->value);
			relay_ce_structured(t, m, &kt->value);
			rd_kafka_header_add(hdrs, "content-type", -1, "application/cloudevents+json", -1);
		}
		rd_kafka_header_add(hdrs, "webhook-id", -1, m->msg_id, -1);
		/* a CloudEvent carries them as attributes: no outbox-* copies */
		if (t->format == RELAY_FORMAT_OUTBOX)
		{
			pg_lltoa(m->id, number);
			rd_kafka_header_add(hdrs, "outbox-seq", -1, number, -1);
			rd_kafka_header_add(hdrs, "outbox-topic", -1, m->topic, -1);
			if (m->key != NULL)
				rd_kafka_header_add(hdrs, "outbox-key", -1, m->key, -1);
		}
		/* The message's own headers: "Name: value" lines, NUL-separated. */
		for (p = m->header_lines; p != NULL && *p; p += strlen(p) + 1)
		{
			char	   *colon = strchr(p, ':');
			char	   *semi = strchr(p, ';');

			/* a CloudEvent's attributes are the relay's: ce_* skipped */
			if (t->format != RELAY_FORMAT_OUTBOX && relay_ce_owned_header(p))
				continue;
			if (colon != NULL)
				rd_kafka_header_add(hdrs, p, colon - p, colon[1] == ' ' ? colon + 2 : colon + 1, -1);
			else if (semi != NULL)
				rd_kafka_header_add(hdrs, p, semi - p, "", 0);
		}
		if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			value = kt->value.data;
			value_len = kt->value.len;
		}
		else
		{
			value = m->payload;
			value_len = m->payload_len;
		}
		kafka_window_reserve(t, kw);
		seq = kw->next;
		err = rd_kafka_producev(kt->rk,
								RD_KAFKA_V_TOPIC(topic),
								RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
								RD_KAFKA_V_VALUE(value, value_len),
								RD_KAFKA_V_KEY(m->key, m->key ? strlen(m->key) : 0),
								RD_KAFKA_V_HEADERS(hdrs),
								RD_KAFKA_V_OPAQUE(KAFKA_OPAQUE(lane->index, kw->generation, seq)),
								RD_KAFKA_V_END);
		if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL)
		{
			/*
			 * The producer's queue is full (queue.buffering.max.messages,
			 * the target's lanes together): the rest waits for reports,
			 * of this lane's window or, with none, of the others'.
			 */
			rd_kafka_headers_destroy(hdrs);
			if (!lane->in_flight)
				lane->next_attempt = TimestampTzPlusMilliseconds(now, KAFKA_QUEUE_FULL_WAIT_MS);
			break;
		}
		if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			rd_kafka_headers_destroy(hdrs);
			failed->kind = kafka_outcome_class(t, kt, err, topic, "could not produce to Kafka: ",
											   error, sizeof(error));
			failed->error = error;
			if (err == RD_KAFKA_RESP_ERR__FATAL)
				kt->broken = true;
			break;
		}
		(void) kafka_window_add(lane, m, KW_WAITING, now);
		produced++;
	}
	/* a structured event's buffer that grew for a large one is given back */
	if (kt->value.maxlen > 256 * 1024)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

		pfree(kt->value.data);
		initStringInfo(&kt->value);
		MemoryContextSwitchTo(oldcxt);
	}
	if (failed->error != NULL)
	{
		/* Message m failed before it went. */
		if (produced == 0)
			return false;		/* the lane's (or its window's) outcome */
		kafka_window_fail_next(lane, failed);
		memset(failed, 0, sizeof(*failed));
	}
	else if (produced == 0)
		lane->cut_bytes = 0;	/* a full queue: nothing went */
	return true;
}

/* Where kafka_fail_in_flight() reports, while relay_kafka_drive() runs. */
static RelayFinishedFn fail_finished = NULL;

/*
 * The target's producer goes: every window is given up (kind, error) and
 * its outcome reported; outside relay_kafka_drive (the producer is made
 * anew from send, or the relay exits), with no one to tell, each is
 * forgotten instead, and its messages go again in the next request.
 */
static void
kafka_fail_in_flight(RelayTarget *t, RelayOutcomeKind kind, const char *error)
{
	int			i;

	for (i = 0; i < t->nlanes; i++)
	{
		RelayLane  *lane = &t->lanes[i];

		if (!lane->in_flight)
			continue;
		if (fail_finished != NULL)
		{
			kafka_window_give_up(lane, kind, error);
			kafka_window_settle(lane, fail_finished);
		}
		else
			kafka_window_forget(lane);
	}
}

/*
 * Windows of the target whose oldest message awaited has had no report for
 * timeout_ms: given up, and the producer with them, so that nothing it
 * still holds is stored after what is produced again (a new producer
 * starts a partition's sequence anew).  The other windows are forgotten:
 * not their failure.  Returns whether the producer went.
 */
static bool
kafka_give_up_overdue(RelayTarget *t, TimestampTz now, RelayFinishedFn finished)
{
	RelayKafkaTarget *kt = KAFKA_TARGET(t);
	char		error[RELAY_MAX_ERROR_LEN + 1];
	RelayOutcomeKind kind;
	bool		overdue = false;
	int			i;

	for (i = 0; i < t->nlanes; i++)
	{
		TimestampTz deadline = kafka_window_deadline(&t->lanes[i]);

		if (deadline != 0 && now >= deadline)
			overdue = true;
	}
	if (!overdue)
		return false;
	/* The brokers are out of reach: hold, rather than use up attempts. */
	kind = kt->down[0] != '\0' ? RELAY_RECEIVER_FAILED : RELAY_RETRY;
	if (kt->down[0] != '\0')
		snprintf(error, sizeof(error), "no delivery report within timeout_ms (%s)", kt->down);
	else
		snprintf(error, sizeof(error), "no delivery report within timeout_ms");
	for (i = 0; i < t->nlanes; i++)
	{
		RelayLane  *lane = &t->lanes[i];
		TimestampTz deadline = kafka_window_deadline(lane);

		if (!lane->in_flight)
			continue;
		if (deadline != 0 && now >= deadline)
		{
			kafka_window_give_up(lane, kind, error);
			kafka_window_settle(lane, finished);
		}
		else
			kafka_window_forget(lane);
	}
	kafka_destroy(kt);
	return true;
}

/*
 * Serve every producer's queue (delivery reports, errors, logs), then
 * settle the windows: their acknowledged heads popped, the outcomes of
 * those decided reported, and those past their time given up.
 */
static void
relay_kafka_drive(RelayFinishedFn finished)
{
	TimestampTz now = 0;
	ListCell   *lc;

	if (wake_pipe[0] < 0)
		return;
	relay_wake_pipe_drain(wake_pipe[0]);
	fail_finished = finished;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		RelayKafkaTarget *kt;
		int			i;

		if (t->kind != RELAY_KAFKA || t->priv == NULL || KAFKA_TARGET(t)->rk == NULL)
			continue;
		kt = KAFKA_TARGET(t);
		while (rd_kafka_poll(kt->rk, 0) > 0)
			;
		if (kt->last_log[0] != '\0')
		{
			if (now == 0)
				now = GetCurrentTimestamp();
			if (TimestampDifferenceExceeds(kt->logged_at, now, 10000))
			{
				ereport(LOG,
						(errmsg("outbox relay: Kafka target \"%s\": %s", t->name, kt->last_log)));
				kt->logged_at = now;
			}
			kt->last_log[0] = '\0';
		}
		for (i = 0; i < t->nlanes; i++)
			if (t->lanes[i].in_flight)
				kafka_window_settle(&t->lanes[i], finished);
		if (kt->broken)
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];

			snprintf(error, sizeof(error), "the Kafka producer failed for good: %s", kt->fatal);
			ereport(LOG,
					(errmsg("outbox relay: Kafka target \"%s\": %s; it is made anew", t->name, kt->fatal)));
			kafka_fail_in_flight(t, RELAY_RETRY, error);
			kafka_destroy(kt);
			continue;
		}
		if (requests_in_flight > 0)
		{
			if (now == 0)
				now = GetCurrentTimestamp();
			if (kafka_give_up_overdue(t, now, finished))
				ereport(LOG,
						(errmsg("outbox relay: Kafka target \"%s\": no delivery report within timeout_ms (%d ms); its producer is made anew",
								t->name, t->timeout_ms)));
		}
	}
	fail_finished = NULL;
}

/* Milliseconds until a window's oldest message is overdue, or -1. */
static long
relay_kafka_timeout(void)
{
	TimestampTz first = 0;
	TimestampTz now;
	ListCell   *lc;

	if (requests_in_flight == 0)
		return -1;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (t->kind != RELAY_KAFKA)
			continue;
		for (i = 0; i < t->nlanes; i++)
		{
			TimestampTz deadline = kafka_window_deadline(&t->lanes[i]);

			if (deadline != 0 && (first == 0 || deadline < first))
				first = deadline;
		}
	}
	if (first == 0)
		return -1;
	now = GetCurrentTimestamp();
	return first <= now ? 0 : (long) ((first - now + 999) / 1000);
}

/* The options of a Kafka target row read (relay_config.c). */
static const char *
relay_kafka_check(RelayTarget *t)
{
	const char *why;

	if ((why = relay_kafka_check_brokers(t->url)) != NULL)
		return psprintf("brokers: %s", why);
	if (t->topic == NULL)
		return "topic: it is missing";
	if ((why = relay_kafka_check_topic(t->topic)) != NULL)
		return psprintf("topic: %s", why);
	if ((why = relay_kafka_check_properties(t->properties_jb)) != NULL)
		return psprintf("properties: %s", why);
	return NULL;
}

const RelayTransport relay_kafka_transport = {
	.kind = "kafka",
	.id = RELAY_KAFKA,
	.header_lines = true,
	.per_message = true,
	.pipelines = relay_kafka_pipelines,
	.extends = relay_kafka_extends,
	.window_fail = kafka_window_fail_next,
	.check = relay_kafka_check,
	.start = relay_kafka_start,
	.stop = relay_kafka_stop,
	.target_init = relay_kafka_target_init,
	.target_release = relay_kafka_target_release,
	.lane_init = relay_kafka_lane_init,
	.lane_release = relay_kafka_lane_release,
	.send = relay_kafka_send,
	.drive = relay_kafka_drive,
	.timeout = relay_kafka_timeout,
};
