/*-------------------------------------------------------------------------
 *
 * relay_rabbitmq.c
 *	  Delivery to RabbitMQ (AMQP 0-9-1) with rabbitmq-c.  All rabbitmq-c
 *	  use is here.
 *
 * A RabbitMQ target has one connection and one channel, shared by its
 * lanes, in publisher-confirm mode.  Each message is published persistent
 * (delivery mode 2) and mandatory, with message_id = its stable id, and is
 * delivered once the broker confirms it (basic.ack).  A message no queue
 * is bound for comes back (basic.return, then its ack): the target is held
 * with that reason, never dropped.  A request (relay_lane_cut_keys) never
 * holds two messages of a key, so no message of a key is published after
 * an earlier one that is to be sent again.
 *
 * The connection is relay_conn.c's (lookup, destination rules, connect,
 * TLS for amqps://); this file speaks AMQP on it, all of it without
 * waiting: the handshake (protocol header, connection.start-ok with PLAIN
 * or EXTERNAL, tune-ok without heartbeats, connection.open, channel.open,
 * confirm.select) is a state machine driven by the frames that come back,
 * and the publishes of a request sent while it runs are framed once it has
 * ended (the frame size is negotiated there).  rabbitmq-c only encodes and
 * decodes methods and properties; it never touches the socket.
 *
 * Delivery tags are numbered from 1 on a channel, one per publish; a FIFO
 * of what each tag was (lane, request, position) matches the confirms,
 * which may acknowledge many at once (multiple).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <amqp.h>
#include <amqp_framing.h>

#include "fmgr.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Longest exchange name and routing key (AMQP short strings). */
#define RMQ_MAX_SHORTSTR	255
/* Largest frame asked for. */
#define RMQ_FRAME_MAX		131072
/* The least frame_max AMQP allows: frames of the handshake fit in it. */
#define RMQ_FRAME_MIN		4096
/* Bytes read from the socket at a time, and reads in one turn. */
#define RMQ_READ_CHUNK		65536
#define RMQ_MAX_READS		16
/* Most frames taken in one turn of the loop per target. */
#define RMQ_MAX_FRAMES		256
/* Headers the relay puts on a message before its own, at the most. */
#define RMQ_OWN_HEADERS		(4 + RELAY_CE_MAX_ATTRS)
/* The CloudEvents AMQP binding's prefix of attributes (binary mode). */
#define RMQ_CE_PREFIX		"cloudEvents:"

/* The channel the relay publishes on. */
#define RMQ_CHANNEL			1

/* Where the handshake is: what the broker is to send next. */
typedef enum RmqPhase
{
	RMQ_START,					/* connection.start */
	RMQ_TUNE,					/* connection.tune (or a refused login) */
	RMQ_OPEN_OK,				/* connection.open-ok */
	RMQ_CHANNEL_OK,				/* channel.open-ok */
	RMQ_CONFIRM_OK,				/* confirm.select-ok */
	RMQ_READY					/* publishing */
} RmqPhase;

/* What a delivery tag was. */
typedef struct RmqTag
{
	int			lane;
	uint32		request;
	int			pos;
	int			body_len;		/* the payload's bytes */
	bool		acked;			/* confirmed (maybe ahead of older tags) */
	bool		returned;		/* came back unroutable before its ack */
	char		msg_id[RELAY_UUID_LEN + 1];
} RmqTag;

/* A target's connection (RelayTarget.priv). */
typedef struct RelayRmqTarget
{
	RelayConn	conn;			/* first: the socket, its TLS, what waits
								 * to go (relay_conn.c) */
	RmqPhase	phase;			/* of the handshake, while conn is open */
	uint32		frame_max;		/* negotiated (RMQ_FRAME_MIN before) */
	StringInfoData in;			/* bytes read, not yet taken as frames */
	int			in_off;			/* of them taken */
	amqp_pool_t pool;			/* rabbitmq-c's decoding memory, per frame */
	bool		blocked;		/* connection.blocked, not yet unblocked */
	char		blocked_why[128];
	uint64		next_tag;		/* the next publish's delivery tag */
	RmqTag	   *tags;			/* ring: tags first_tag .. next_tag - 1 */
	int			tags_head;
	int			ntags;
	int			maxtags;
	uint64		first_tag;		/* tag of tags[tags_head] */
	bool		more;			/* frames were left for the next turn */
	bool		returning;		/* a basic.return's content follows */
	uint64		return_body_left;	/* its body bytes still to come */
	bool		return_header;	/* its header frame was read */
	char		return_why[RELAY_MAX_ERROR_LEN + 1];
	long		max_message_size;	/* the broker refused a body above this
									 * (a 406), 0 for not known */
	StringInfoData key;			/* reused: a message's routing key */
	amqp_table_entry_t *headers;	/* reused: a message's headers, in cxt */
	int			nheaders;		/* of them set */
	int			maxheaders;		/* entries in headers */
	RelayCeAttrs ce;			/* reused: a message's CloudEvents attributes */
	char		ce_names[RELAY_CE_MAX_ATTRS][32];	/* and their header names */
	StringInfoData body;		/* reused: a structured CloudEvent */
} RelayRmqTarget;

#define RMQ_TARGET(t)	((RelayRmqTarget *) (t)->priv)
#define RMQ_LANE(lane)	((RelayAcks *) (lane)->priv)

static RelayConnSet conns = RELAY_CONN_SET_INIT;

/*---- checks, for the SQL functions and for rows read ----*/

/*
 * Whether url is an AMQP URL the relay can use:
 * amqp://[user[:password]@]host[:port][/vhost], or amqps:// for TLS.
 * Returns why not, or NULL;
 * with info (and its string, which it points into), fills it.
 */
static const char *
rmq_parse_url(const char *url, struct amqp_connection_info *info, char **copy)
{
	char	   *s;
	const char *why = NULL;
	const char *rest;
	const char *slash;
	const char *at;
	struct amqp_connection_info i;

	if (url == NULL || *url == '\0')
		return "it is empty";
	if (strncmp(url, "amqps://", 8) == 0)
		rest = url + 8;
	else if (strncmp(url, "amqp://", 7) == 0)
		rest = url + 7;
	else
		return "it must start with amqp:// or amqps:// (TLS)";
	if (strpbrk(url, "?#") != NULL)
		return "it has a query; only amqp[s]://[user:password@]host[:port][/vhost] is taken";
	if (strchr(rest, ',') != NULL)
		return "it names several servers; give one";
	/* a user without a password would log in with rabbitmq-c's "guest" */
	slash = strchr(rest, '/');
	at = memchr(rest, '@', (slash ? slash : url + strlen(url)) - rest);
	if (at != NULL && memchr(rest, ':', at - rest) == NULL)
		return "it has a user without a password: give amqp://user:password@host";
	s = pstrdup(url);
	amqp_default_connection_info(&i);
	if (amqp_parse_url(s, &i) != AMQP_STATUS_OK)
		why = "it is not an AMQP URL (a bad port, a bad percent escape, an IPv6 address without brackets?)";
	else if (i.host == NULL || *i.host == '\0' || strlen(i.host) > 253)
		why = "it has no host, or one that is too long";
	else if (i.port < 1 || i.port > 65535)
		why = "the port is not between 1 and 65535";
	else
	{
		/* "amqp://host/" names the empty vhost, which no one has: the default */
		if (i.vhost[0] == '\0')
			i.vhost = "/";
		if (strlen(i.vhost) > RMQ_MAX_SHORTSTR)
			why = "the virtual host is longer than 255 bytes";
	}
	if (why == NULL && info != NULL)
	{
		*info = i;
		*copy = s;				/* the caller wipes it */
		return NULL;
	}
	/* the decoded password goes from memory */
	memset(s, 0, strlen(url));
	pfree(s);
	return why;
}

/* Whether s is an exchange name RabbitMQ takes ("" the default). */
static const char *
rmq_check_exchange(const char *s)
{
	const char *c;

	if (s == NULL)
		return "it is NULL";
	if (strlen(s) > RMQ_MAX_SHORTSTR)
		return "it is longer than 255 bytes";
	for (c = s; *c; c++)
		if (!(outbox_ascii_alnum((unsigned char) *c) || *c == '-' || *c == '_' || *c == '.' || *c == ':'))
			return "it has a character other than letters, digits, '-', '_', '.' and ':'";
	return NULL;
}

/* Whether template is a routing key template ('' is one). */
static const char *
rmq_check_routing_key(const char *template)
{
	return relay_template_check(template, RMQ_MAX_SHORTSTR, true);
}

PG_FUNCTION_INFO_V1(outbox_check_rabbitmq_target);

/*
 * outbox.check_rabbitmq_target(url, exchange, routing_key): the checks of
 * a RabbitMQ target's options, for create_rabbitmq_target() and
 * alter_target().
 */
Datum
outbox_check_rabbitmq_target(PG_FUNCTION_ARGS)
{
	char	   *url = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *exchange = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	char	   *key = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	const char *why;

	if ((why = rmq_parse_url(url, NULL, NULL)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid AMQP URL %s",
						url ? quote_literal_cstr(relay_url_shown(url)) : "NULL"),
				 errdetail("The URL is not usable: %s.", why),
				 errhint("Give amqp://user:password@host:port/vhost (port 5672 and vhost / by default), or amqps:// for TLS (port 5671); percent-encode special characters, and the vhost / as %%2f.")));
	if ((why = rmq_check_exchange(exchange)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid RabbitMQ exchange name %s", exchange ? quote_literal_cstr(exchange) : "NULL"),
				 errdetail("The exchange name is not usable: %s.", why),
				 errhint("Give an exchange that exists, or '' for the default exchange, which routes to the queue the routing key names.")));
	if ((why = rmq_check_routing_key(key)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid RabbitMQ routing key %s", key ? quote_literal_cstr(key) : "NULL"),
				 errdetail("The routing key is not usable: %s.", why),
				 errhint("Give the routing key, with {topic} or {key} standing for the message's topic or key, as in 'orders.{topic}'.")));
	PG_RETURN_VOID();
}

/*---- on the relay's thread ----*/

/* Close the connection; what it carried is forgotten. */
static void
rmq_close(RelayRmqTarget *rt)
{
	relay_conn_close(&rt->conn);
	relay_buffer_reset(&rt->in, rt->conn.cxt, 1024 * 1024);
	rt->in_off = 0;
	rt->phase = RMQ_START;
	rt->frame_max = RMQ_FRAME_MIN;
	rt->ntags = 0;
	rt->tags_head = 0;
	rt->returning = false;
	rt->return_header = false;
	rt->more = false;
	rt->blocked = false;
	recycle_amqp_pool(&rt->pool);
}

static void
rmq_conn_close(RelayTarget *t)
{
	rmq_close(RMQ_TARGET(t));
}

/* What a connection.close or channel.close said, for last_error. */
static void
rmq_close_text(amqp_method_t *m, const char *what, char *error, size_t size)
{
	int			code;
	amqp_bytes_t text;
	char	   *c;

	if (m->id == AMQP_CONNECTION_CLOSE_METHOD)
	{
		code = ((amqp_connection_close_t *) m->decoded)->reply_code;
		text = ((amqp_connection_close_t *) m->decoded)->reply_text;
	}
	else
	{
		code = ((amqp_channel_close_t *) m->decoded)->reply_code;
		text = ((amqp_channel_close_t *) m->decoded)->reply_text;
	}
	snprintf(error, size, "%s: the broker closed the %s: %d %.*s", what,
			 m->id == AMQP_CONNECTION_CLOSE_METHOD ? "connection" : "channel",
			 code, (int) Min(text.len, 150), (char *) text.bytes);
	/* printable ASCII only: it goes to last_error */
	for (c = error; *c; c++)
		if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
			*c = '?';
}

/*
 * Make the target's connection if it has none: the protocol header waits
 * in its output while the lookup, connect and TLS go on (relay_conn.c).
 * Returns false, with rt->conn.error, when it cannot be made.
 */
static bool
rmq_connect(RelayTarget *t)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	struct amqp_connection_info info;
	char	   *copy;
	const char *bad;
	bool		ok;

	if (rt->conn.state != RELAY_CONN_NONE)
		return true;
	/* another broker (or the same reconfigured): its limit is not known */
	if (rt->conn.url == NULL || strcmp(rt->conn.url, t->url) != 0)
		rt->max_message_size = 0;
	if ((bad = rmq_parse_url(t->url, &info, &copy)) != NULL)
	{
		snprintf(rt->conn.error, sizeof(rt->conn.error), "the url is not usable: %s", bad);
		return false;
	}
	rmq_close(rt);
	appendBinaryStringInfo(&rt->conn.out, "AMQP\0\0\x09\x01", 8);
	ok = relay_conn_open(&rt->conn, t, info.host, info.port);
	memset(copy, 0, strlen(t->url));	/* the password, gone from memory */
	pfree(copy);
	if (!ok)
	{
		char		error[RELAY_MAX_ERROR_LEN + 1];

		strlcpy(error, rt->conn.error, sizeof(error));
		rmq_close(rt);
		strlcpy(rt->conn.error, error, sizeof(rt->conn.error));
	}
	return ok;
}

/* One frame: type, channel, size, payload, end (AMQP 0-9-1, 2.3.5). */
static void
rmq_frame(StringInfo out, uint8 type, uint16 channel, const char *payload, uint32 len)
{
	unsigned char h[7];

	h[0] = type;
	h[1] = (channel >> 8) & 0xFF;
	h[2] = channel & 0xFF;
	h[3] = (len >> 24) & 0xFF;
	h[4] = (len >> 16) & 0xFF;
	h[5] = (len >> 8) & 0xFF;
	h[6] = len & 0xFF;
	appendBinaryStringInfo(out, (const char *) h, 7);
	appendBinaryStringInfo(out, payload, len);
	appendStringInfoChar(out, (char) AMQP_FRAME_END);
}

/*
 * A method frame of the handshake into the output (it fits in
 * RMQ_FRAME_MIN).  Returns false when it does not encode.
 */
static bool
rmq_send_method(RelayRmqTarget *rt, uint16 channel, amqp_method_number_t id, void *method)
{
	char		buf[RMQ_FRAME_MIN];
	amqp_bytes_t enc;
	int			n;

	buf[0] = (id >> 24) & 0xFF;
	buf[1] = (id >> 16) & 0xFF;
	buf[2] = (id >> 8) & 0xFF;
	buf[3] = id & 0xFF;
	enc.bytes = buf + 4;
	enc.len = sizeof(buf) - 4 - 8;
	if ((n = amqp_encode_method(id, method, enc)) < 0)
		return false;
	rmq_frame(&rt->conn.out, AMQP_FRAME_METHOD, channel, buf, 4 + n);
	return true;
}

/* Whether the space-separated list (a longstr) names word. */
static bool
rmq_names(amqp_bytes_t list, const char *word)
{
	size_t		n = strlen(word);
	const char *p = list.bytes;
	const char *end = p + list.len;

	while (p < end)
	{
		const char *sp = memchr(p, ' ', end - p);
		const char *e = sp ? sp : end;

		if ((size_t) (e - p) == n && memcmp(p, word, n) == 0)
			return true;
		p = e + 1;
	}
	return false;
}

/*
 * connection.start came: answer with start-ok, logging in with PLAIN (the
 * url's user and password, "guest" without them) or, for a url with TLS,
 * a client certificate and no user, EXTERNAL.  Returns false with error.
 */
static bool
rmq_start_ok(RelayTarget *t, amqp_connection_start_t *start, char *error, size_t size)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	struct amqp_connection_info info;
	char	   *copy;
	const char *bad;
	bool		external;
	amqp_connection_start_ok_t ok;
	amqp_table_entry_t caps[3];
	amqp_table_entry_t props[3];
	StringInfoData response;
	bool		sent;

	if (start->version_major != 0 || start->version_minor != 9)
	{
		snprintf(error, size, "RabbitMQ at %s speaks AMQP %d-%d, not 0-9-1", rt->conn.peer,
				 start->version_major, start->version_minor);
		return false;
	}
	if ((bad = rmq_parse_url(t->url, &info, &copy)) != NULL)
	{
		snprintf(error, size, "the url is not usable: %s", bad);
		return false;
	}
	external = rt->conn.tls.on && t->client_cert != NULL && strchr(strstr(t->url, "://") + 3, '@') == NULL;
	if (!rmq_names(start->mechanisms, external ? "EXTERNAL" : "PLAIN"))
	{
		snprintf(error, size, "RabbitMQ at %s does not offer the %s login mechanism%s", rt->conn.peer,
				 external ? "EXTERNAL" : "PLAIN",
				 external ? " (enable the rabbitmq_auth_mechanism_ssl plugin, or give a user and password in the url)" : "");
		memset(copy, 0, strlen(t->url));
		pfree(copy);
		return false;
	}

	/* Ask for connection.blocked notices (a broker short of memory). */
	caps[0].key = amqp_cstring_bytes("connection.blocked");
	caps[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[0].value.value.boolean = 1;
	caps[1].key = amqp_cstring_bytes("publisher_confirms");
	caps[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[1].value.value.boolean = 1;
	/* a refused login is told (a connection.close), not a closed socket */
	caps[2].key = amqp_cstring_bytes("authentication_failure_close");
	caps[2].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[2].value.value.boolean = 1;
	props[0].key = amqp_cstring_bytes("capabilities");
	props[0].value.kind = AMQP_FIELD_KIND_TABLE;
	props[0].value.value.table.num_entries = 3;
	props[0].value.value.table.entries = caps;
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes("outbox relay");
	props[2].key = amqp_cstring_bytes("product");
	props[2].value.kind = AMQP_FIELD_KIND_UTF8;
	props[2].value.value.bytes = amqp_cstring_bytes("outbox");
	memset(&ok, 0, sizeof(ok));
	ok.client_properties.num_entries = 3;
	ok.client_properties.entries = props;
	ok.mechanism = amqp_cstring_bytes(external ? "EXTERNAL" : "PLAIN");
	initStringInfo(&response);
	if (!external)
	{
		/* PLAIN: NUL, user, NUL, password */
		appendStringInfoChar(&response, '\0');
		appendStringInfoString(&response, info.user);
		appendStringInfoChar(&response, '\0');
		appendStringInfoString(&response, info.password);
	}
	ok.response.bytes = response.data;
	ok.response.len = response.len;
	ok.locale = amqp_cstring_bytes("en_US");
	sent = rmq_send_method(rt, 0, AMQP_CONNECTION_START_OK_METHOD, &ok);
	memset(response.data, 0, response.len);
	pfree(response.data);
	memset(copy, 0, strlen(t->url));
	pfree(copy);
	if (!sent)
	{
		snprintf(error, size, "the login does not fit in a frame (a user and password of over 3 kB?)");
		return false;
	}
	rt->phase = RMQ_TUNE;
	return true;
}

/*
 * A method of the handshake (phase says which is due).  Returns false with
 * error when the connection cannot go on.
 */
static bool
rmq_handshake(RelayTarget *t, uint16 channel, amqp_method_t *m, char *error, size_t size)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	static const char *const refused[] = {
		"RabbitMQ refused the connection", "RabbitMQ refused the login",
		"RabbitMQ refused the virtual host", "RabbitMQ refused the channel",
		"RabbitMQ refused publisher confirms"
	};

	if (m->id == AMQP_CONNECTION_CLOSE_METHOD || m->id == AMQP_CHANNEL_CLOSE_METHOD)
	{
		rmq_close_text(m, refused[rt->phase], error, size);
		return false;
	}
	/* a broker short of memory may say so at once: held, not refused */
	if (m->id == AMQP_CONNECTION_BLOCKED_METHOD && channel == 0)
	{
		rt->blocked = true;
		snprintf(rt->blocked_why, sizeof(rt->blocked_why), "RabbitMQ blocked publishing");
		return true;
	}
	if (m->id == AMQP_CONNECTION_UNBLOCKED_METHOD && channel == 0)
	{
		rt->blocked = false;
		return true;
	}
	switch (rt->phase)
	{
		case RMQ_START:
			if (m->id == AMQP_CONNECTION_START_METHOD && channel == 0)
				return rmq_start_ok(t, (amqp_connection_start_t *) m->decoded, error, size);
			break;
		case RMQ_TUNE:
			if (m->id == AMQP_CONNECTION_TUNE_METHOD && channel == 0)
			{
				amqp_connection_tune_t *tune = (amqp_connection_tune_t *) m->decoded;
				amqp_connection_tune_ok_t ok;
				amqp_connection_open_t open;
				struct amqp_connection_info info;
				char	   *copy;
				bool		sent;

				/* the smaller frame size; no heartbeats (none is sent) */
				ok.frame_max = tune->frame_max == 0 ? RMQ_FRAME_MAX : Min(tune->frame_max, RMQ_FRAME_MAX);
				if (ok.frame_max < RMQ_FRAME_MIN)
				{
					snprintf(error, size, "RabbitMQ at %s asked for frames of %u bytes, below AMQP's least (4096)",
							 rt->conn.peer, tune->frame_max);
					return false;
				}
				ok.channel_max = tune->channel_max;
				ok.heartbeat = 0;
				rt->frame_max = ok.frame_max;
				if (rmq_parse_url(t->url, &info, &copy) != NULL)
				{
					snprintf(error, size, "the url is not usable");
					return false;
				}
				memset(&open, 0, sizeof(open));
				open.virtual_host = amqp_cstring_bytes(info.vhost);
				sent = rmq_send_method(rt, 0, AMQP_CONNECTION_TUNE_OK_METHOD, &ok) &&
					rmq_send_method(rt, 0, AMQP_CONNECTION_OPEN_METHOD, &open);
				memset(copy, 0, strlen(t->url));
				pfree(copy);
				if (!sent)
				{
					snprintf(error, size, "the virtual host does not fit in a frame");
					return false;
				}
				rt->phase = RMQ_OPEN_OK;
				return true;
			}
			break;
		case RMQ_OPEN_OK:
			if (m->id == AMQP_CONNECTION_OPEN_OK_METHOD && channel == 0)
			{
				amqp_channel_open_t open;

				memset(&open, 0, sizeof(open));
				(void) rmq_send_method(rt, RMQ_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &open);
				rt->phase = RMQ_CHANNEL_OK;
				return true;
			}
			break;
		case RMQ_CHANNEL_OK:
			if (m->id == AMQP_CHANNEL_OPEN_OK_METHOD && channel == RMQ_CHANNEL)
			{
				amqp_confirm_select_t select;

				select.nowait = 0;
				(void) rmq_send_method(rt, RMQ_CHANNEL, AMQP_CONFIRM_SELECT_METHOD, &select);
				rt->phase = RMQ_CONFIRM_OK;
				return true;
			}
			break;
		case RMQ_CONFIRM_OK:
			if (m->id == AMQP_CONFIRM_SELECT_OK_METHOD && channel == RMQ_CHANNEL)
			{
				rt->phase = RMQ_READY;
				rt->next_tag = 1;
				rt->first_tag = 1;
				rt->ntags = 0;
				rt->tags_head = 0;
				return true;
			}
			break;
		case RMQ_READY:
			break;
	}
	snprintf(error, size, "RabbitMQ at %s sent method 0x%08X during the handshake", rt->conn.peer, m->id);
	return false;
}

/* A target's connection state, made before its lanes. */
static void
relay_rabbitmq_target_init(RelayTarget *t)
{
	RelayRmqTarget *rt = MemoryContextAllocZero(t->cxt, sizeof(RelayRmqTarget));
	MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

	relay_conn_init(&rt->conn, &conns, "RabbitMQ", "amqps://", t->cxt);
	initStringInfo(&rt->key);
	initStringInfo(&rt->in);
	initStringInfo(&rt->body);
	init_amqp_pool(&rt->pool, 4096);
	rt->frame_max = RMQ_FRAME_MIN;
	MemoryContextSwitchTo(oldcxt);
	t->priv = rt;
}

static void
relay_rabbitmq_target_release(RelayTarget *t)
{
	if (t->priv != NULL)
	{
		rmq_close(RMQ_TARGET(t));
		empty_amqp_pool(&RMQ_TARGET(t)->pool);
	}
	t->priv = NULL;
}

/* Note what the next delivery tag is. */
static void
rmq_tag(RelayTarget *t, RelayLane *lane, uint32 request, int pos, RelayMessage *m, int body_len)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	RmqTag	   *g;

	if (rt->ntags == rt->maxtags)
		relay_ring_grow((void **) &rt->tags, &rt->maxtags, &rt->tags_head, sizeof(RmqTag), t->cxt);
	if (rt->ntags == 0)
		rt->first_tag = rt->next_tag;
	g = &rt->tags[(rt->tags_head + rt->ntags) % rt->maxtags];
	g->lane = lane->index;
	g->request = request;
	g->pos = pos;
	g->body_len = body_len;
	g->acked = false;
	g->returned = false;
	memcpy(g->msg_id, m->msg_id, sizeof(g->msg_id));
	rt->ntags++;
	rt->next_tag++;
}

static void
rmq_header_str(amqp_table_entry_t *e, const char *name, const char *value)
{
	e->key = amqp_cstring_bytes(name);
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(value);
}

/*
 * Message headers RabbitMQ itself acts on, left out of what the relay
 * publishes (I10, docs/brokers.md): CC and BCC route a message to more
 * queues (and a string there makes the broker close the channel), the
 * others steer dead-lettering, delays, stream filters and de-duplication,
 * or pose as the broker's own records.  Exactly as the broker spells them
 * (it compares bytes): "cc" is an application's own header.
 */
static bool
rmq_broker_header(const char *name, int len)
{
	static const char *const exact[] = {
		"CC", "BCC", "x-death", "x-delay", "x-delivery-count",
		"x-stream-filter-value", "x-deduplication-header", "x-received-from",
		"x-opt-deduplication-id"
	};
	int			i;

	for (i = 0; i < lengthof(exact); i++)
		if (len == (int) strlen(exact[i]) && memcmp(name, exact[i], len) == 0)
			return true;
	return (len > 14 && memcmp(name, "x-first-death-", 14) == 0) ||
		(len > 13 && memcmp(name, "x-last-death-", 13) == 0);
}

/*
 * The headers of message m into rt->headers (rt->nheaders of them): the
 * relay's, then the message's own but those the broker acts on.  Returns
 * why one cannot be carried (AMQP's names have at most 255 bytes;
 * outbox_emit() takes 256), or NULL.
 */
static const char *
rmq_message_headers(RelayTarget *t, RelayMessage *m, const char *number)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	int			want = RMQ_OWN_HEADERS;
	int			n = 0;
	char	   *p;

	for (p = m->header_lines; p != NULL && *p; p += strlen(p) + 1)
		want++;
	if (rt->maxheaders < want)
	{
		amqp_table_entry_t *headers = MemoryContextAlloc(t->cxt,
														 Max(want, 32) * sizeof(amqp_table_entry_t));

		if (rt->headers)
			pfree(rt->headers);
		rt->headers = headers;
		rt->maxheaders = Max(want, 32);
	}
	rmq_header_str(&rt->headers[n++], "webhook-id", m->msg_id);
	if (t->format == RELAY_FORMAT_OUTBOX)
	{
		/* a CloudEvent carries them as attributes: no outbox-* copies */
		rmq_header_str(&rt->headers[n++], "outbox-seq", number);
		rmq_header_str(&rt->headers[n++], "outbox-topic", m->topic);
		if (m->key)
			rmq_header_str(&rt->headers[n++], "outbox-key", m->key);
	}
	else if (t->format == RELAY_FORMAT_CE_BINARY)
	{
		int			j;

		/* the AMQP binding's binary mode: cloudEvents: headers, content-type */
		for (j = 0; j < rt->ce.n; j++)
		{
			if (strcmp(rt->ce.name[j], "datacontenttype") == 0)
				continue;
			snprintf(rt->ce_names[j], sizeof(rt->ce_names[j]), RMQ_CE_PREFIX "%s", rt->ce.name[j]);
			rmq_header_str(&rt->headers[n++], rt->ce_names[j], rt->ce.value[j]);
		}
	}
	/* The message's own headers: "Name: value" lines, or "Name;" for "". */
	for (p = m->header_lines; p != NULL && *p; p += strlen(p) + 1)
	{
		int			name_len = strcspn(p, ":;");
		const char *value = p[name_len] == ':' ? p + name_len + 1 : "";

		if (rmq_broker_header(p, name_len))
			continue;
		/* nor, in a CloudEvent, what its binding owns (cloudEvents_*, -*) */
		if (t->format != RELAY_FORMAT_OUTBOX &&
			(relay_ce_owned_header(p) || outbox_header_name_is(p, name_len, "cloudevents-", false)))
			continue;
		if (name_len > RMQ_MAX_SHORTSTR)
			return "a header name is longer than the 255 bytes AMQP carries";
		if (*value == ' ')
			value++;
		rt->headers[n].key.bytes = p;
		rt->headers[n].key.len = name_len;
		rt->headers[n].value.kind = AMQP_FIELD_KIND_UTF8;
		rt->headers[n].value.value.bytes = amqp_cstring_bytes(value);
		n++;
	}
	rt->nheaders = n;
	return NULL;
}

/*
 * The frames of one publish (basic.publish, its content header, its body
 * in frames of the negotiated size), appended to out whole, or not at
 * all: returns why the message cannot be framed (its properties do not
 * fit in a frame), or NULL.
 */
static const char *
rmq_encode_publish(RelayRmqTarget *rt, const char *exchange, const char *routing_key,
				   amqp_basic_properties_t *props, const char *body, size_t len)
{
	int			frame_max = rt->frame_max;
	int			room = frame_max - 8;
	char	   *buf = palloc(frame_max);
	amqp_basic_publish_t m;
	amqp_bytes_t enc;
	int			n;
	size_t		off;
	StringInfo	out = &rt->conn.out;
	int			start = out->len;

	memset(&m, 0, sizeof(m));
	m.exchange = amqp_cstring_bytes(exchange);
	m.routing_key = amqp_cstring_bytes(routing_key);
	m.mandatory = 1;
	m.immediate = 0;
	/* method: class 60, method 40, then the arguments */
	buf[0] = 0;
	buf[1] = 60;
	buf[2] = 0;
	buf[3] = 40;
	enc.bytes = buf + 4;
	enc.len = room - 4;
	if ((n = amqp_encode_method(AMQP_BASIC_PUBLISH_METHOD, &m, enc)) < 0)
	{
		pfree(buf);
		return "the exchange and routing key do not fit in the broker's frame size";
	}
	rmq_frame(out, AMQP_FRAME_METHOD, RMQ_CHANNEL, buf, 4 + n);
	/* content header: class, weight, body size, then the properties */
	buf[0] = 0;
	buf[1] = 60;
	buf[2] = 0;
	buf[3] = 0;
	{
		uint64		size = len;
		int			i;

		for (i = 0; i < 8; i++)
			buf[4 + i] = (char) ((size >> (56 - 8 * i)) & 0xFF);
	}
	enc.bytes = buf + 12;
	enc.len = room - 12;
	if ((n = amqp_encode_properties(60, props, enc)) < 0)
	{
		/* the method frame goes too: nothing of this message is written */
		out->len = start;
		out->data[start] = '\0';
		pfree(buf);
		return "its headers do not fit in the broker's frame size";
	}
	rmq_frame(out, AMQP_FRAME_HEADER, RMQ_CHANNEL, buf, 12 + n);
	for (off = 0; off < len; off += room)
		rmq_frame(out, AMQP_FRAME_BODY, RMQ_CHANNEL, body + off, (uint32) Min((size_t) room, len - off));
	pfree(buf);
	return NULL;
}

/*
 * Frame the publishes of the lane's request (its cut_n messages at the
 * head) into the output, once the connection is ready.  A message that
 * cannot be framed fails the request there (relay_acks_bad()).
 */
static void
rmq_publish(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayRmqTarget *rt = RMQ_TARGET(t);
	RelayAcks  *rl = RMQ_LANE(lane);
	RelayMessage *m;
	int			i;
	int			out_len;
	int			ntags;
	uint64		next_tag;

	Assert(rt->phase == RMQ_READY && rl->nsent == 0);
	out_len = rt->conn.out.len;
	ntags = rt->ntags;
	next_tag = rt->next_tag;
	/* An error half-way (out of memory) must not leave half a message. */
	PG_TRY();
	{
	for (m = lane->head, i = 0; i < lane->cut_n; m = m->next, i++)
	{
		amqp_basic_properties_t props;
		char		number[24];
		const char *bad;
		const char *body;
		int			body_len;

		if (!relay_template_fill(t->routing_key, m, &rt->key))
		{
			relay_acks_bad(rl, i, RELAY_REJECTED,
						   "the routing key template has {key} and the message has no key, or an empty one");
			break;
		}
		if (rt->key.len > RMQ_MAX_SHORTSTR)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED,
						   "the routing key is longer than 255 bytes once the template is filled in");
			break;
		}
		pg_lltoa(m->id, number);
		if (t->format == RELAY_FORMAT_CE_BINARY)
			relay_ce_attrs(t, m, &rt->ce);
		if ((bad = rmq_message_headers(t, m, number)) != NULL)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED, bad);
			break;
		}
		memset(&props, 0, sizeof(props));
		props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
			AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
		/* the body: the payload, or the structured CloudEvent */
		body = m->payload;
		body_len = m->payload_len;
		props.content_type = amqp_cstring_bytes("application/json");
		if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			resetStringInfo(&rt->body);
			relay_ce_structured(t, m, &rt->body);
			body = rt->body.data;
			body_len = rt->body.len;
			props.content_type = amqp_cstring_bytes("application/cloudevents+json");
		}
		props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
		props.message_id = amqp_cstring_bytes(m->msg_id);
		props.timestamp = (uint64) (timestamptz_to_time_t(m->emitted_at));
		props.headers.num_entries = rt->nheaders;
		props.headers.entries = rt->headers;
		if (rt->max_message_size > 0 && body_len > rt->max_message_size)
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];

			snprintf(error, sizeof(error), "the message's %d bytes are more than the broker's max_message_size (%ld, from its earlier refusal)",
					 body_len, rt->max_message_size);
			relay_acks_bad(rl, i, RELAY_REJECTED, error);
			break;
		}
		if ((bad = rmq_encode_publish(rt, t->exchange, rt->key.data, &props, body,
									  body_len)) != NULL)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED, bad);
			break;
		}
		rmq_tag(t, lane, rl->request, i, m, body_len);
		rl->nsent++;
	}
	}
	PG_CATCH();
	{
		rt->conn.out.len = out_len;
		rt->conn.out.data[out_len] = '\0';
		rt->ntags = ntags;
		rt->next_tag = next_tag;
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * Publish the lane's next request: the cut_n messages at its head; while
 * the connection is being made they wait for it (rmq_ready()).  Returns
 * false, with *failed set, when not one could be published.
 */
static bool
relay_rabbitmq_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayRmqTarget *rt = RMQ_TARGET(t);

	/* one made for other settings, or broken, is made anew */
	if (!relay_conn_send_begin(&relay_rabbitmq_transport, lane, failed))
		return false;
	if (rt->blocked || rt->conn.broken)
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = rt->blocked ? rt->blocked_why : rt->conn.broken_why;
		return false;
	}
	if (rt->phase == RMQ_READY)
		rmq_publish(lane);
	return relay_conn_send_end(lane, rt->phase == RMQ_READY, failed);
}

/*
 * The connection is given up: every request of the target waiting is
 * decided at its first unconfirmed message (kind, why), those confirmed
 * before it delivered.  A message found too large (its payload above
 * too_large bytes, when not 0) is rejected instead.
 */
static void
rmq_fail(RelayTarget *t, RelayOutcomeKind kind, const char *why, long too_large,
		 RelayFinishedFn finished)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	char		error[RELAY_MAX_ERROR_LEN + 1];
	int			i;

	strlcpy(error, why, sizeof(error));
	/* the message the broker refused for its size, if one is known */
	for (i = 0; too_large > 0 && i < rt->ntags; i++)
	{
		RmqTag	   *g = &rt->tags[(rt->tags_head + i) % rt->maxtags];

		if (!g->acked && g->body_len > too_large && g->lane < t->nlanes &&
			t->lanes[g->lane].in_flight &&
			relay_acks_waits(RMQ_LANE(&t->lanes[g->lane]), g->request, g->pos))
		{
			relay_acks_bad(RMQ_LANE(&t->lanes[g->lane]), g->pos, RELAY_REJECTED, error);
			break;
		}
	}
	rmq_close(rt);
	relay_acks_fail_lanes(t, kind, error, finished);
}

/* rmq_fail() for relay_conn.c: no message known too large. */
static void
rmq_fail_conn(RelayTarget *t, RelayOutcomeKind kind, const char *why, RelayFinishedFn finished)
{
	rmq_fail(t, kind, why, 0, finished);
}

/* The handshake has ended: the requests that waited for it go. */
static void
rmq_ready(RelayTarget *t, RelayFinishedFn finished)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	int			i;

	/* a broker that blocked publishing during the handshake: they wait */
	if (rt->blocked)
	{
		char		error[RELAY_MAX_ERROR_LEN + 1];

		strlcpy(error, rt->blocked_why, sizeof(error));
		for (i = 0; i < t->nlanes && t->priv != NULL; i++)
			if (t->lanes[i].in_flight && RMQ_LANE(&t->lanes[i])->nsent == 0)
			{
				relay_acks_give_up(RMQ_LANE(&t->lanes[i]), RELAY_RECEIVER_FAILED, error);
				relay_acks_lane_check(&t->lanes[i], finished);
			}
		return;
	}
	for (i = 0; i < t->nlanes && t->priv != NULL && rt->phase == RMQ_READY; i++)
	{
		RelayLane  *lane = &t->lanes[i];

		if (!lane->in_flight || RMQ_LANE(lane)->nsent > 0)
			continue;
		rmq_publish(lane);
		/* not one could be framed: that decides it */
		if (RMQ_LANE(lane)->nsent == 0)
			relay_acks_lane_check(lane, finished);
	}
	if (t->priv != NULL && rt->conn.state == RELAY_CONN_OPEN)
		relay_conn_flush(&rt->conn);
}

/*
 * A message came back unroutable (then its ack).  A routing key the message
 * filled in ({topic}, {key}) is its own doing (I10): RELAY_UNROUTABLE,
 * naming that key; a fixed routing key no queue is bound for is the
 * target's configuration: held.
 */
static void
rmq_unroutable(RelayTarget *t, RelayLane *lane, int pos, RelayAcks *rl)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	RelayMessage *m = lane->head;
	int			i;
	char		error[RELAY_MAX_ERROR_LEN + 1];
	char		shown[RELAY_SHOWN_LEN];

	for (i = 0; i < pos && m != NULL; i++)
		m = m->next;
	if (m == NULL || !relay_template_filled(t->routing_key) ||
		!relay_template_fill(t->routing_key, m, &rt->key))
	{
		relay_acks_bad(rl, pos, RELAY_RECEIVER_FAILED, rt->return_why);
		return;
	}
	relay_shown(shown, sizeof(shown), rt->key.data, rt->key.len);
	snprintf(error, sizeof(error),
			 "RabbitMQ returned the message as unroutable (312 NO_ROUTE): no queue is bound for routing key \"%s\" on exchange \"%.60s\"",
			 shown, t->exchange ? t->exchange : "");
	relay_acks_bad(rl, pos, RELAY_UNROUTABLE, error);
}

/* A confirm: ack (or nack) of tag, and of all before it with multiple. */
static void
rmq_confirm(RelayTarget *t, uint64 tag, bool multiple, bool ack, RelayFinishedFn finished)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	int			i;
	int			n;

	if (rt->ntags == 0 || tag < rt->first_tag || tag >= rt->first_tag + rt->ntags)
		return;					/* not one of ours waiting */
	n = (int) (tag - rt->first_tag);
	for (i = multiple ? 0 : n; i <= n; i++)
	{
		RmqTag	   *g = &rt->tags[(rt->tags_head + i) % rt->maxtags];
		RelayLane  *lane;
		RelayAcks  *rl;

		if (g->acked)
			continue;
		g->acked = true;
		if (g->lane >= t->nlanes)
			continue;
		lane = &t->lanes[g->lane];
		rl = RMQ_LANE(lane);
		if (!lane->in_flight || !relay_acks_waits(rl, g->request, g->pos))
			continue;
		if (!ack)
			relay_acks_bad(rl, g->pos, RELAY_RETRY, "RabbitMQ did not take the message (basic.nack: an internal error of the broker or a queue)");
		else if (g->returned)
			rmq_unroutable(t, lane, g->pos, rl);
		else
			rl->acked[g->pos] = true;
		relay_acks_lane_check(lane, finished);
		if (t->priv == NULL || rt->conn.state != RELAY_CONN_OPEN)
			return;
	}
	/* confirmed tags at the head leave the ring */
	while (rt->ntags > 0 && rt->tags[rt->tags_head].acked)
	{
		rt->tags_head = (rt->tags_head + 1) % rt->maxtags;
		rt->ntags--;
		rt->first_tag++;
	}
}

/*
 * A returned message (mandatory, unroutable): its tag comes from its id.
 * Returns false when it is none of those waiting for a confirm.
 */
static bool
rmq_returned(RelayTarget *t, const char *msg_id, int len)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	int			i;

	for (i = 0; i < rt->ntags; i++)
	{
		RmqTag	   *g = &rt->tags[(rt->tags_head + i) % rt->maxtags];

		if (!g->acked && !g->returned && len == RELAY_UUID_LEN &&
			memcmp(g->msg_id, msg_id, RELAY_UUID_LEN) == 0)
		{
			g->returned = true;
			return true;
		}
	}
	return false;
}

static uint32
rmq_be32(const unsigned char *p)
{
	return ((uint32) p[0] << 24) | ((uint32) p[1] << 16) | ((uint32) p[2] << 8) | p[3];
}

/*
 * The next whole frame of rt->in into f (decoded in rt->pool): 1 one was
 * taken, 0 none is whole yet, -1 what came is not AMQP (error).
 */
static int
rmq_next_frame(RelayRmqTarget *rt, amqp_frame_t *f, char *error, size_t size)
{
	const unsigned char *p = (const unsigned char *) rt->in.data + rt->in_off;
	int			avail = rt->in.len - rt->in_off;
	uint32		len;
	amqp_bytes_t enc;

	if (avail < 7)
		return 0;
	len = rmq_be32(p + 3);
	/* frames up to the size agreed; before the tune, AMQP's least */
	/* (in 64 bits: a length near 4 GB must not wrap round to a small one) */
	if ((uint64) len + 8 > (uint64) (rt->phase <= RMQ_TUNE ? RMQ_FRAME_MIN : rt->frame_max))
	{
		snprintf(error, size, "RabbitMQ at %s sent a frame of %u bytes, more than the %u agreed%s",
				 rt->conn.peer, len, rt->phase <= RMQ_TUNE ? RMQ_FRAME_MIN : rt->frame_max,
				 rt->phase == RMQ_START && !rt->conn.tls.on ?
				 " (does the server want TLS? its url would start with amqps://)" : "");
		return -1;
	}
	if ((uint64) avail < (uint64) len + 8)
		return 0;
	if (p[7 + len] != AMQP_FRAME_END)
	{
		snprintf(error, size, "RabbitMQ at %s sent a frame without its end byte%s", rt->conn.peer,
				 rt->phase == RMQ_START && !rt->conn.tls.on ?
				 " (does the server want TLS? its url would start with amqps://)" : "");
		return -1;
	}
	rt->in_off += len + 8;
	memset(f, 0, sizeof(*f));
	f->frame_type = p[0];
	f->channel = ((uint16) p[1] << 8) | p[2];
	p += 7;
	switch (f->frame_type)
	{
		case AMQP_FRAME_METHOD:
			if (len < 4)
				break;
			f->payload.method.id = rmq_be32(p);
			enc.bytes = (void *) (p + 4);
			enc.len = len - 4;
			if (amqp_decode_method(f->payload.method.id, &rt->pool, enc,
								   &f->payload.method.decoded) < 0)
				break;
			return 1;
		case AMQP_FRAME_HEADER:
			if (len < 14)
				break;
			f->payload.properties.class_id = ((uint16) p[0] << 8) | p[1];
			f->payload.properties.body_size = ((uint64) rmq_be32(p + 4) << 32) | rmq_be32(p + 8);
			enc.bytes = (void *) (p + 12);
			enc.len = len - 12;
			if (f->payload.properties.class_id != 60 ||
				amqp_decode_properties(60, &rt->pool, enc, &f->payload.properties.decoded) < 0)
				break;
			return 1;
		case AMQP_FRAME_BODY:
			f->payload.body_fragment.bytes = (void *) p;
			f->payload.body_fragment.len = len;
			return 1;
		case AMQP_FRAME_HEARTBEAT:
			return 1;
		default:
			break;
	}
	snprintf(error, size, "RabbitMQ at %s sent a frame the relay cannot decode (type %d, %u bytes)",
			 rt->conn.peer, f->frame_type, len);
	return -1;
}

/*
 * Read what the socket has (bounded) and take the frames in it: the
 * handshake's, then confirms, returns and closes.
 */
static void
rmq_read(RelayTarget *t, RelayFinishedFn finished)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	char		error[RELAY_MAX_ERROR_LEN + 1];
	char		buf[RMQ_READ_CHUNK];
	int			n;

	/* bytes first: at most RMQ_MAX_READS chunks a turn (level-triggered) */
	for (n = 0; n < RMQ_MAX_READS && rt->in.len - rt->in_off < 4 * RMQ_FRAME_MAX; n++)
	{
		int			got = relay_conn_read(&rt->conn, buf, sizeof(buf));

		if (got == 0)
			break;
		if (got < 0)
		{
			strlcpy(error, rt->conn.error, sizeof(error));
			if (rt->phase == RMQ_TUNE)
				strlcat(error, " (during the login: a wrong user or password?)", sizeof(error));
			rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
			return;
		}
		if (rt->in_off > 0 && rt->in_off == rt->in.len)
		{
			resetStringInfo(&rt->in);
			rt->in_off = 0;
		}
		appendBinaryStringInfo(&rt->in, buf, got);
	}

	rt->more = false;
	for (n = 0; rt->conn.state == RELAY_CONN_OPEN; n++)
	{
		amqp_frame_t f;
		int			rc;

		/* a bounded turn; the rest is taken at the next (rt->more) */
		if (n == RMQ_MAX_FRAMES)
		{
			rt->more = true;
			break;
		}
		/* nothing of a frame is kept once it is handled */
		recycle_amqp_pool(&rt->pool);
		rc = rmq_next_frame(rt, &f, error, sizeof(error));
		if (rc == 0)
			break;
		if (rc < 0)
		{
			rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
			return;
		}
		if (rt->phase != RMQ_READY)
		{
			if (f.frame_type != AMQP_FRAME_METHOD)
				continue;
			if (!rmq_handshake(t, f.channel, &f.payload.method, error, sizeof(error)))
			{
				rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
				return;
			}
			if (rt->phase == RMQ_READY)
				rmq_ready(t, finished);
			else
				relay_conn_flush(&rt->conn);
			if (t->priv == NULL || rt->conn.state != RELAY_CONN_OPEN)
				return;
			continue;
		}
		if (f.channel != RMQ_CHANNEL && f.frame_type != AMQP_FRAME_METHOD)
			continue;
		if (f.frame_type == AMQP_FRAME_HEADER && rt->returning && !rt->return_header)
		{
			amqp_basic_properties_t *p = (amqp_basic_properties_t *) f.payload.properties.decoded;

			rt->return_header = true;
			rt->return_body_left = f.payload.properties.body_size;
			if (p == NULL || !(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) ||
				!rmq_returned(t, (const char *) p->message_id.bytes, (int) p->message_id.len))
			{
				/* not one of ours: its confirm must not count as delivered */
				snprintf(error, sizeof(error), "RabbitMQ at %s returned a message the relay did not publish or cannot match",
						 rt->conn.peer);
				rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
				return;
			}
			if (rt->return_body_left == 0)
				rt->returning = false;
			continue;
		}
		if (f.frame_type == AMQP_FRAME_BODY && rt->returning && rt->return_header)
		{
			uint64		len = f.payload.body_fragment.len;

			rt->return_body_left -= Min(len, rt->return_body_left);
			if (rt->return_body_left == 0)
				rt->returning = false;
			continue;
		}
		if (f.frame_type != AMQP_FRAME_METHOD)
			continue;			/* heartbeats; nothing else is sent to us */
		/* connection.* on channel 0, the rest on ours; others are not ours */
		if (f.channel != ((f.payload.method.id >> 16) == AMQP_CONNECTION_CLASS ? 0 : RMQ_CHANNEL))
			continue;
		switch (f.payload.method.id)
		{
			case AMQP_BASIC_ACK_METHOD:
				{
					amqp_basic_ack_t *a = (amqp_basic_ack_t *) f.payload.method.decoded;

					rmq_confirm(t, a->delivery_tag, a->multiple, true, finished);
					break;
				}
			case AMQP_BASIC_NACK_METHOD:
				{
					amqp_basic_nack_t *a = (amqp_basic_nack_t *) f.payload.method.decoded;

					rmq_confirm(t, a->delivery_tag, a->multiple, false, finished);
					break;
				}
			case AMQP_BASIC_RETURN_METHOD:
				{
					amqp_basic_return_t *r = (amqp_basic_return_t *) f.payload.method.decoded;
					char	   *c;

					snprintf(rt->return_why, sizeof(rt->return_why),
							 "RabbitMQ returned the message as unroutable: %d %.*s (exchange \"%.*s\", routing key \"%.*s\"): no queue is bound for it",
							 r->reply_code, (int) Min(r->reply_text.len, 60), (char *) r->reply_text.bytes,
							 (int) Min(r->exchange.len, 60), (char *) r->exchange.bytes,
							 (int) Min(r->routing_key.len, 80), (char *) r->routing_key.bytes);
					for (c = rt->return_why; *c; c++)
						if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
							*c = '?';
					rt->returning = true;
					rt->return_header = false;
					break;
				}
			case AMQP_CONNECTION_BLOCKED_METHOD:
				{
					amqp_connection_blocked_t *b = (amqp_connection_blocked_t *) f.payload.method.decoded;

					char	   *c;

					rt->blocked = true;
					snprintf(rt->blocked_why, sizeof(rt->blocked_why),
							 "RabbitMQ blocked publishing: %.*s",
							 (int) Min(b->reason.len, 80), (char *) b->reason.bytes);
					/* printable ASCII only: it goes to last_error */
					for (c = rt->blocked_why; *c; c++)
						if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
							*c = '?';
					break;
				}
			case AMQP_CONNECTION_UNBLOCKED_METHOD:
				rt->blocked = false;
				break;
			case AMQP_CHANNEL_CLOSE_METHOD:
			case AMQP_CONNECTION_CLOSE_METHOD:
				{
					long		max = 0;
					const char *m;
					bool		channel = f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD;
					int			code;
					amqp_bytes_t text;

					if (channel)
					{
						code = ((amqp_channel_close_t *) f.payload.method.decoded)->reply_code;
						text = ((amqp_channel_close_t *) f.payload.method.decoded)->reply_text;
					}
					else
					{
						code = ((amqp_connection_close_t *) f.payload.method.decoded)->reply_code;
						text = ((amqp_connection_close_t *) f.payload.method.decoded)->reply_text;
					}
					rmq_close_text(&f.payload.method, "RabbitMQ", error, sizeof(error));
					/* 406 "message size N is larger than configured max size M" */
					if (channel && code == AMQP_PRECONDITION_FAILED && text.len < 1024)
					{
						char		buf[1024];

						memcpy(buf, text.bytes, text.len);
						buf[text.len] = '\0';
						if ((m = strstr(buf, "larger than configured max size ")) != NULL)
							max = strtol(m + 32, NULL, 10);
						/* later messages above it are refused here at once */
						if (max > 0)
							rt->max_message_size = max;
					}
					rmq_fail(t, max > 0 ? RELAY_RETRY : RELAY_RECEIVER_FAILED, error, max, finished);
					return;
				}
			default:
				break;
		}
		if (t->priv == NULL || rt->conn.state != RELAY_CONN_OPEN)
			return;
	}
	/* what was taken leaves the buffer */
	if (rt->in_off > 0)
	{
		memmove(rt->in.data, rt->in.data + rt->in_off, rt->in.len - rt->in_off);
		rt->in.len -= rt->in_off;
		rt->in.data[rt->in.len] = '\0';
		rt->in_off = 0;
	}
	recycle_amqp_pool(&rt->pool);
}

/* Whether frames were left for the next turn. */
static bool
rmq_more(RelayTarget *t)
{
	return RMQ_TARGET(t)->more;
}

/*
 * A request past its deadline: a handshake that did not end holds the
 * target; a confirm that did not come is tried again.
 */
static RelayOutcomeKind
rmq_expired(RelayTarget *t, char *error, size_t size)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);

	if (rt->conn.state != RELAY_CONN_OPEN || !rt->conn.got_bytes)
		relay_conn_timeout_text(&rt->conn, t->timeout_ms, error, size);
	else if (rt->phase != RMQ_READY)
		snprintf(error, size, "RabbitMQ at %s did not finish the AMQP handshake within %d ms",
				 rt->conn.peer, t->timeout_ms);
	else
	{
		snprintf(error, size, "no confirm from RabbitMQ at %s within %d ms",
				 rt->conn.peer, t->timeout_ms);
		return RELAY_RETRY;
	}
	return RELAY_RECEIVER_FAILED;
}

/* The options of a RabbitMQ target row read (relay_config.c). */
static const char *
relay_rabbitmq_check(RelayTarget *t)
{
	const char *why;

	if ((why = rmq_parse_url(t->url, NULL, NULL)) != NULL)
		return psprintf("url: %s", why);
	if ((why = rmq_check_exchange(t->exchange)) != NULL)
		return psprintf("exchange: %s", why);
	if ((why = rmq_check_routing_key(t->routing_key)) != NULL)
		return psprintf("routing_key: %s", why);
	return NULL;
}

const RelayTransport relay_rabbitmq_transport = {
	.kind = "rabbitmq",
	.id = RELAY_RABBITMQ,
	.header_lines = true,
	.per_message = true,
	.check = relay_rabbitmq_check,
	.target_init = relay_rabbitmq_target_init,
	.target_release = relay_rabbitmq_target_release,
	.lane_init = relay_acks_lane_init,
	.lane_release = relay_acks_lane_release,
	.send = relay_rabbitmq_send,
	.conn_set = &conns,
	.conn_close = rmq_conn_close,
	.conn_connect = rmq_connect,
	.conn_read = rmq_read,
	.conn_fail = rmq_fail_conn,
	.conn_more = rmq_more,
	.conn_expired = rmq_expired,
};
