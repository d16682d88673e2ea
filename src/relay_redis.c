/*-------------------------------------------------------------------------
 *
 * relay_redis.c
 *	  Delivery to Redis Streams.  All Redis protocol use is here.
 *
 * A Redis target has one connection, shared by its lanes, on the relay's
 * own thread: a non-blocking socket the relay opens itself (so every
 * address it dials has passed outbox.denied_destinations /
 * allowed_destinations), in an epoll set whose descriptor is in the
 * relay's WaitEventSet.  Commands are written in RESP by this file;
 * replies are parsed by hiredis's reader (with reply objects of our own
 * that refuse what no answer of ours can be: large arrays, long strings).
 * No library thread runs, apart from glibc's resolver for host names.
 *
 * Each message is one EVALSHA of a small Lua script that, atomically on
 * the server, looks for a de-duplication mark of the message's id, and
 * when there is none appends the message to the stream (XADD, with an
 * approximate MAXLEN when the target has one) and sets the mark to expire
 * after dedup_window seconds.  So a message sent again (after a relay
 * crash, a lost reply, a reconnect) within the window is not appended
 * twice: its reply says "already there", which counts as delivered.
 *
 * Replies come back in the order the commands were written; a FIFO of
 * what each reply answers (a handshake step, or a lane's request and a
 * position in it) matches them.  A request holds at most one message of a
 * key (per_message), so no later message of a key is appended ahead of an
 * earlier one that is to be sent again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <openssl/evp.h>

#include "fmgr.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Longest stream key, in bytes, once the template is filled in. */
#define REDIS_MAX_STREAM	1024
/* XADD's error for a stream whose last id is the largest there is */
#define REDIS_EXHAUSTED "ERR The stream has exhausted the last possible ID"
/* Most bytes of replies buffered and not yet parsed. */
#define REDIS_MAX_UNPARSED	(4 * 1024 * 1024)
/* Longest string in a reply; none of ours is near it. */
#define REDIS_MAX_REPLY_STRING	(64 * 1024)
/* Most elements of an array in a reply; ours have 2. */
#define REDIS_MAX_REPLY_ARRAY	16
/* Bytes read from a socket at a time, and reads in one call of drive(). */
#define REDIS_READ_CHUNK	65536
#define REDIS_MAX_READS		16

/*
 * The script each message runs.  KEYS: the stream, the mark.  ARGV: the
 * window in seconds (0: no mark), the MAXLEN (0: none), then the entry's
 * fields and values.  Returns {1, entry id} when appended, {0, entry id}
 * when the mark says it was appended before.
 */
static const char redis_script[] =
"local w = ARGV[1] ~= '0'\n"
"if w then\n"
"  local seen = redis.call('GET', KEYS[2])\n"
"  if seen then return {0, seen} end\n"
"end\n"
"local id\n"
"if ARGV[2] ~= '0' then\n"
"  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))\n"
"else\n"
"  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))\n"
"end\n"
"if w then redis.call('SET', KEYS[2], id, 'EX', ARGV[1]) end\n"
"return {1, id}\n";

/* What a reply answers. */
typedef enum RedisPendingKind
{
	REDIS_PENDING_AUTH,
	REDIS_PENDING_SELECT,
	REDIS_PENDING_LOAD,
	REDIS_PENDING_MESSAGE
} RedisPendingKind;

typedef struct RedisPending
{
	RedisPendingKind kind;
	int			lane;			/* MESSAGE: the lane, its request and the */
	uint32		request;		/* message's position in it */
	int			pos;
} RedisPending;

/* A Redis URL, taken apart. */
typedef struct RedisUrl
{
	bool		tls;			/* rediss:// */
	char	   *user;			/* NULL for the default user */
	char	   *password;		/* NULL for none */
	char	   *host;
	int			port;
	long		db;
} RedisUrl;

/* A target's connection (RelayTarget.priv). */
typedef struct RelayRedisTarget
{
	RelayConn	conn;			/* first: the socket, its TLS, what waits
								 * to go (relay_conn.c) */
	redisReader *reader;		/* replies being parsed */
	RedisPending *pending;		/* ring of what the replies answer */
	int			pending_head;
	int			npending;
	int			maxpending;
	bool		ready;			/* the handshake was answered */
	StringInfoData early;		/* commands sent before it was: they wait */
	bool		loading;		/* a SCRIPT LOAD is on its way again */
	StringInfoData stream;		/* reused: a message's stream key */
	StringInfoData mark;		/* reused: its mark's key */
	StringInfoData event;		/* reused: a structured CloudEvent */
} RelayRedisTarget;

#define REDIS_TARGET(t)	((RelayRedisTarget *) (t)->priv)
#define REDIS_LANE(lane)	((RelayAcks *) (lane)->priv)

static RelayConnSet conns = RELAY_CONN_SET_INIT;
static char script_sha[41];

/*---- reply objects: hiredis's reader builds them with these ----*/

static void *
redis_reply_attach(const redisReadTask *task, redisReply *r)
{
	if (task->parent != NULL)
	{
		redisReply *parent = (redisReply *) task->parent->obj;

		parent->element[task->idx] = r;
	}
	return r;
}

static void *
redis_reply_new(const redisReadTask *task, int type)
{
	redisReply *r = calloc(1, sizeof(redisReply));

	if (r == NULL)
		return NULL;
	r->type = type;
	return r;
}

static void *
redis_create_string(const redisReadTask *task, char *str, size_t len)
{
	redisReply *r;

	if (len > REDIS_MAX_REPLY_STRING)
		return NULL;			/* the reader reports an error */
	r = redis_reply_new(task, task->type);
	if (r == NULL)
		return NULL;
	r->str = malloc(len + 1);
	if (r->str == NULL)
	{
		free(r);
		return NULL;
	}
	memcpy(r->str, str, len);
	r->str[len] = '\0';
	r->len = len;
	return redis_reply_attach(task, r);
}

static void *
redis_create_array(const redisReadTask *task, int elements)
{
	redisReply *r;

	/* Ours are flat: an array inside an array is no answer of ours. */
	if (elements < 0 || elements > REDIS_MAX_REPLY_ARRAY || task->parent != NULL)
		return NULL;
	r = redis_reply_new(task, REDIS_REPLY_ARRAY);
	if (r == NULL)
		return NULL;
	if (elements > 0)
	{
		r->element = calloc(elements, sizeof(redisReply *));
		if (r->element == NULL)
		{
			free(r);
			return NULL;
		}
	}
	r->elements = elements;
	return redis_reply_attach(task, r);
}

static void *
redis_create_integer(const redisReadTask *task, long long value)
{
	redisReply *r = redis_reply_new(task, REDIS_REPLY_INTEGER);

	if (r == NULL)
		return NULL;
	r->integer = value;
	return redis_reply_attach(task, r);
}

static void *
redis_create_nil(const redisReadTask *task)
{
	redisReply *r = redis_reply_new(task, REDIS_REPLY_NIL);

	if (r == NULL)
		return NULL;
	return redis_reply_attach(task, r);
}

static void
redis_free_reply(void *obj)
{
	redisReply *r = (redisReply *) obj;
	size_t		i;

	if (r == NULL)
		return;
	for (i = 0; i < r->elements; i++)
		if (r->element != NULL)
			redis_free_reply(r->element[i]);
	free(r->element);
	free(r->str);
	free(r);
}

static redisReplyObjectFunctions redis_reply_functions = {
	redis_create_string,
	redis_create_array,
	redis_create_integer,
	redis_create_nil,
	redis_free_reply
};

/*---- checks, for the SQL functions and for rows read ----*/

/*
 * Whether url is a Redis URL the relay can use:
 * redis://[[user]:password@]host[:port][/db], or rediss:// for TLS.  Returns why not, or NULL;
 * with u, fills it (palloc'd).
 */
static const char *
redis_parse_url(const char *url, RedisUrl *u)
{
	const char *p;
	const char *at;
	const char *h;
	const char *hend;
	const char *bad;
	long		port = 6379;
	long		db = 0;
	char	   *user = NULL;
	char	   *password = NULL;
	bool		tls;

	if (url == NULL || *url == '\0')
		return "it is empty";
	if (strncmp(url, "unix://", 7) == 0 || strncmp(url, "redis+unix://", 13) == 0)
		return "Unix-domain sockets are not supported: give a host and port";
	tls = strncmp(url, "rediss://", 9) == 0;
	if (!tls && strncmp(url, "redis://", 8) != 0)
		return "it must start with redis:// or rediss:// (TLS)";
	p = url + (tls ? 9 : 8);
	at = strchr(p, '@');
	if (at != NULL)
	{
		const char *colon = memchr(p, ':', at - p);

		if (strchr(at + 1, '@') != NULL)
			return "it has more than one @ (percent-encode an @ of the password as %40)";
		if (colon == NULL)
			return "it has a user without a password: give redis://user:password@host (or rediss://)";
		if (colon > p && (user = relay_url_unescape(p, colon - p)) == NULL)
			return "the user has an invalid percent escape";
		if ((password = relay_url_unescape(colon + 1, at - colon - 1)) == NULL)
			return "the password has an invalid percent escape";
		if (*password == '\0')
			return "the password is empty";
		if (user != NULL && *user == '\0')
			user = NULL;
		p = at + 1;
	}
	if ((bad = outbox_scan_host(&p, &h, &hend, "it has no host, or one that is too long")) != NULL)
		return bad;
	if (*p == ':')
	{
		char	   *end;

		p++;
		if (!outbox_ascii_digit((unsigned char) *p))
			return "the port is not a number";
		errno = 0;
		port = strtol(p, &end, 10);
		p = end;
		if (errno != 0 || port < 1 || port > 65535)
			return "the port is not between 1 and 65535";
	}
	if (*p == '/' && p[1] != '\0')
	{
		char	   *end;

		p++;
		if (!outbox_ascii_digit((unsigned char) *p))
			return "the database is not a number";
		errno = 0;
		db = strtol(p, &end, 10);
		p = end;
		if (errno != 0 || db < 0 || db > PG_INT32_MAX)
			return "the database number is out of range";
	}
	else if (*p == '/')
		p++;
	if (*p != '\0')
		return "it has something after the host, port and database (a query, a second server?); only redis[s]://[user:password@]host[:port][/db] is taken";
	if (u != NULL)
	{
		u->tls = tls;
		u->user = user;
		u->password = password;
		u->host = pnstrdup(h, hend - h);
		u->port = (int) port;
		u->db = db;
	}
	return NULL;
}

const char *
relay_redis_check_url(const char *url)
{
	return redis_parse_url(url, NULL);
}

/*
 * What separates a stream's key from the ids in the names of its
 * de-duplication marks, "<stream>:outbox-dedup:<id>": a key filled in from
 * a message may not hold it, so that no message names another's mark.
 */
#define REDIS_MARK_INFIX	":outbox-dedup:"

/* Whether template is a stream key template. */
const char *
relay_redis_check_stream(const char *template)
{
	if (template != NULL && strstr(template, REDIS_MARK_INFIX) != NULL)
		return "it holds \"" REDIS_MARK_INFIX "\", which names the relay's de-duplication marks";
	return relay_template_check(template, REDIS_MAX_STREAM, false);
}

PG_FUNCTION_INFO_V1(outbox_check_redis_target);

/*
 * outbox.check_redis_target(url, stream): the checks of a Redis target's
 * options, for create_redis_target() and alter_target().
 */
Datum
outbox_check_redis_target(PG_FUNCTION_ARGS)
{
	char	   *url = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *stream = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	const char *why;

	if ((why = relay_redis_check_url(url)) != NULL)
		ereport(ERROR,
				(errcode(strncmp(why, "Unix", 4) == 0 ?
						 ERRCODE_FEATURE_NOT_SUPPORTED : ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Redis URL %s",
						url ? quote_literal_cstr(relay_url_shown(url)) : "NULL"),
				 errdetail("The URL is not usable: %s.", why),
				 errhint("Give redis://host:port (rediss:// for TLS), with :password@ or user:password@ before the host for AUTH and /N after it for a database; percent-encode special characters of the password.")));
	if ((why = relay_redis_check_stream(stream)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Redis stream key %s", stream ? quote_literal_cstr(stream) : "NULL"),
				 errdetail("The stream key is not usable: %s.", why),
				 errhint("Give the stream's key, with {topic} or {key} standing for the message's topic or key, as in 'orders:{topic}'.")));
	PG_RETURN_VOID();
}

/*---- on the relay's thread ----*/

/* The script's SHA1, as EVALSHA names it. */
static void
redis_script_sha(void)
{
	unsigned char digest[EVP_MAX_MD_SIZE];
	unsigned int len = 0;
	int			i;

	if (script_sha[0] != '\0')
		return;
	/* OpenSSL itself: pg_cryptohash needs a resource owner */
	if (EVP_Digest(redis_script, strlen(redis_script), digest, &len, EVP_sha1(), NULL) != 1 ||
		len != 20)
		elog(ERROR, "outbox: could not compute the SHA1 of the Redis script");
	for (i = 0; i < 20; i++)
		snprintf(script_sha + i * 2, 3, "%02x", digest[i]);
}

static int
relay_redis_start(void)
{
	redis_script_sha();
	return relay_conn_set_start(&conns);
}

/* Close the connection; what it carried is forgotten. */
static void
redis_close(RelayRedisTarget *rt)
{
	relay_conn_close(&rt->conn);
	if (rt->reader != NULL)
	{
		redisReaderFree(rt->reader);
		rt->reader = NULL;
	}
	rt->npending = 0;
	rt->pending_head = 0;
	rt->loading = false;
	rt->ready = false;
	relay_buffer_reset(&rt->early, rt->conn.cxt, 1024 * 1024);
}

static void
redis_conn_close(RelayTarget *t)
{
	redis_close(REDIS_TARGET(t));
}

/*---- RESP commands ----*/

static void
redis_arg(StringInfo out, const char *s, int len)
{
	char	   *p;

	enlargeStringInfo(out, len + MAXINT8LEN + 6);
	p = out->data + out->len;
	*p++ = '$';
	p += pg_ltoa(len, p);
	*p++ = '\r';
	*p++ = '\n';
	memcpy(p, s, len);
	p += len;
	*p++ = '\r';
	*p++ = '\n';
	*p = '\0';
	out->len = p - out->data;
}

static void
redis_arg_str(StringInfo out, const char *s)
{
	redis_arg(out, s, strlen(s));
}

/* Note that the next reply answers this. */
static void
redis_expect(RelayTarget *t, RedisPendingKind kind, int lane, uint32 request, int pos)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);
	RedisPending *p;

	if (rt->npending == rt->maxpending)
		relay_ring_grow((void **) &rt->pending, &rt->maxpending, &rt->pending_head,
						sizeof(RedisPending), t->cxt);
	p = &rt->pending[(rt->pending_head + rt->npending) % rt->maxpending];
	p->kind = kind;
	p->lane = lane;
	p->request = request;
	p->pos = pos;
	rt->npending++;
}

static void
redis_queue_load(RelayTarget *t)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);

	appendStringInfoString(&rt->conn.out, "*3\r\n");
	redis_arg_str(&rt->conn.out, "SCRIPT");
	redis_arg_str(&rt->conn.out, "LOAD");
	redis_arg_str(&rt->conn.out, redis_script);
	redis_expect(t, REDIS_PENDING_LOAD, 0, 0, 0);
}

/* The handshake a new connection starts with: AUTH, SELECT, SCRIPT LOAD. */
static void
redis_queue_handshake(RelayTarget *t, RedisUrl *u)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);

	if (u->password != NULL)
	{
		appendStringInfo(&rt->conn.out, "*%d\r\n", u->user ? 3 : 2);
		redis_arg_str(&rt->conn.out, "AUTH");
		if (u->user)
			redis_arg_str(&rt->conn.out, u->user);
		redis_arg_str(&rt->conn.out, u->password);
		redis_expect(t, REDIS_PENDING_AUTH, 0, 0, 0);
	}
	if (u->db != 0)
	{
		char		db[24];

		snprintf(db, sizeof(db), "%ld", u->db);
		appendStringInfoString(&rt->conn.out, "*2\r\n");
		redis_arg_str(&rt->conn.out, "SELECT");
		redis_arg_str(&rt->conn.out, db);
		redis_expect(t, REDIS_PENDING_SELECT, 0, 0, 0);
	}
	redis_queue_load(t);
}

/*
 * Make the target's connection if it has none: queue the handshake, and
 * start the lookup, connect and TLS (relay_conn.c).  Returns false, with
 * rt->conn.error, when it cannot be made.
 */
static bool
redis_connect(RelayTarget *t)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);
	RedisUrl	u;
	const char *bad;

	if (rt->conn.state != RELAY_CONN_NONE)
		return true;
	if ((bad = redis_parse_url(t->url, &u)) != NULL)
	{
		snprintf(rt->conn.error, sizeof(rt->conn.error), "the url is not usable: %s", bad);
		return false;
	}
	rt->reader = redisReaderCreateWithFunctions(&redis_reply_functions);
	if (rt->reader == NULL)
	{
		snprintf(rt->conn.error, sizeof(rt->conn.error), "out of memory");
		return false;
	}
	redis_queue_handshake(t, &u);
	if (u.password != NULL)
		memset(u.password, 0, strlen(u.password));	/* gone from memory */
	if (!relay_conn_open(&rt->conn, t, u.host, u.port))
	{
		char		error[RELAY_MAX_ERROR_LEN + 1];

		strlcpy(error, rt->conn.error, sizeof(error));
		redis_close(rt);
		strlcpy(rt->conn.error, error, sizeof(rt->conn.error));
		return false;
	}
	return true;
}

/* A target's connection state, made before its lanes. */
static void
relay_redis_target_init(RelayTarget *t)
{
	RelayRedisTarget *rt = MemoryContextAllocZero(t->cxt, sizeof(RelayRedisTarget));
	MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

	relay_conn_init(&rt->conn, &conns, "Redis", "rediss://", t->cxt);
	initStringInfo(&rt->stream);
	initStringInfo(&rt->mark);
	initStringInfo(&rt->early);
	initStringInfo(&rt->event);
	MemoryContextSwitchTo(oldcxt);
	t->priv = rt;
}

static void
relay_redis_target_release(RelayTarget *t)
{
	if (t->priv != NULL)
		redis_close(REDIS_TARGET(t));
	t->priv = NULL;
}

/*
 * Queue the lane's next request: one EVALSHA per message of the cut_n at
 * its head.  Returns false, with *failed set, when not one could be.
 */
static bool
relay_redis_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayRedisTarget *rt = REDIS_TARGET(t);
	RelayAcks  *rl = REDIS_LANE(lane);
	RelayMessage *m;
	char		number[24];
	char		window[16];
	char		maxlen[24];
	int			i;
	StringInfo	out;
	int			out_len;
	int			npending;

	/* one made for other settings, or broken, is made anew */
	if (!relay_conn_send_begin(&relay_redis_transport, lane, failed))
		return false;
	snprintf(window, sizeof(window), "%d", Max(t->dedup_window, 0));
	snprintf(maxlen, sizeof(maxlen), INT64_FORMAT, t->maxlen);
	/*
	 * Until the handshake (AUTH above all) is answered, commands wait: a
	 * refused AUTH must not leave them to run as the default user.
	 */
	out = rt->ready ? &rt->conn.out : &rt->early;
	out_len = out->len;
	npending = rt->npending;
	/* An error half-way (out of memory) must not leave half a command. */
	PG_TRY();
	{
	for (m = lane->head, i = 0; i < lane->cut_n; m = m->next, i++)
	{
		if (!relay_template_fill(t->stream, m, &rt->stream))
		{
			relay_acks_bad(rl, i, RELAY_REJECTED,
						   "the stream template has {key} and the message has no key, or an empty one");
			break;
		}
		if (rt->stream.len == 0 || rt->stream.len > REDIS_MAX_STREAM)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED,
						   "the stream key is empty or longer than 1024 bytes once the template is filled in");
			break;
		}
		if (strstr(rt->stream.data, REDIS_MARK_INFIX) != NULL)
		{
			/* I10: a message may not name another's mark */
			char		error[RELAY_MAX_ERROR_LEN + 1];
			char		shown[RELAY_SHOWN_LEN];

			relay_shown(shown, sizeof(shown), rt->stream.data, rt->stream.len);
			snprintf(error, sizeof(error), "the stream key holds \"" REDIS_MARK_INFIX "\" once the template is filled in: it would name one of the relay's de-duplication marks (\"%s\")",
					 shown);
			relay_acks_bad(rl, i, RELAY_REJECTED, error);
			break;
		}
		resetStringInfo(&rt->mark);
		appendBinaryStringInfo(&rt->mark, rt->stream.data, rt->stream.len);
		appendBinaryStringInfoNT(&rt->mark, REDIS_MARK_INFIX, strlen(REDIS_MARK_INFIX));
		appendBinaryStringInfo(&rt->mark, m->msg_id, RELAY_UUID_LEN);
		pg_lltoa(m->id, number);

		if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			/* the structured CloudEvent in one field, beside the id and seq */
			resetStringInfo(&rt->event);
			relay_ce_structured(t, m, &rt->event);
		}
		appendStringInfoChar(out, '*');
		relay_append_int64(out, t->format == RELAY_FORMAT_CE_STRUCTURED ? 5 + 2 + 4 + 2 :
						   5 + 2 + 6 + (m->key ? 2 : 0) + (m->headers ? 2 : 0) + 2);
		appendBinaryStringInfo(out, "\r\n", 2);
		redis_arg_str(out, "EVALSHA");
		redis_arg(out, script_sha, 40);
		redis_arg_str(out, "2");
		redis_arg(out, rt->stream.data, rt->stream.len);
		redis_arg(out, rt->mark.data, rt->mark.len);
		redis_arg_str(out, window);
		redis_arg_str(out, maxlen);
		redis_arg_str(out, "id");
		redis_arg_str(out, m->msg_id);
		redis_arg_str(out, "seq");
		redis_arg_str(out, number);
		if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			redis_arg_str(out, "cloudevent");
			redis_arg(out, rt->event.data, rt->event.len);
			redis_expect(t, REDIS_PENDING_MESSAGE, lane->index, rl->request, i);
			rl->nsent++;
			continue;
		}
		redis_arg_str(out, "topic");
		redis_arg_str(out, m->topic);
		if (m->key)
		{
			redis_arg_str(out, "key");
			redis_arg_str(out, m->key);
		}
		if (m->headers)
		{
			redis_arg_str(out, "headers");
			redis_arg_str(out, m->headers);
		}
		redis_arg_str(out, "payload");
		redis_arg(out, m->payload, m->payload_len);
		redis_expect(t, REDIS_PENDING_MESSAGE, lane->index, rl->request, i);
		rl->nsent++;
	}
	}
	PG_CATCH();
	{
		out->len = out_len;
		out->data[out_len] = '\0';
		rt->npending = npending;
		PG_RE_THROW();
	}
	PG_END_TRY();
	return relay_conn_send_end(lane, true, failed);
}

/* The connection is given up, and every request of the target waiting. */
static void
redis_fail(RelayTarget *t, RelayOutcomeKind kind, const char *why, RelayFinishedFn finished)
{
	char		error[RELAY_MAX_ERROR_LEN + 1];

	strlcpy(error, why, sizeof(error));
	redis_close(REDIS_TARGET(t));
	relay_acks_fail_lanes(t, kind, error, finished);
}

/* An error reply's text, printable ASCII only (it goes to last_error). */
static void
redis_error_text(const redisReply *r, const char *what, char *error, size_t size)
{
	char		text[201];
	size_t		i;
	size_t		n = r->str ? Min(r->len, sizeof(text) - 1) : 0;

	for (i = 0; i < n; i++)
		text[i] = ((unsigned char) r->str[i] >= 0x20 && (unsigned char) r->str[i] < 0x7f) ?
			r->str[i] : '?';
	text[n] = '\0';
	snprintf(error, size, "%s: %s", what, text);
}

static bool
redis_error_is(const redisReply *r, const char *code)
{
	size_t		n = strlen(code);

	return r->str != NULL && r->len >= n && strncmp(r->str, code, n) == 0 &&
		(r->len == n || r->str[n] == ' ');
}

/*
 * Whether an error reply of the relay's script is text, as Redis 7 passes a
 * command's error on ("WRONGTYPE ... script: ..."), or as Redis 6 wraps it
 * ("ERR Error running script (...): @user_script:10: WRONGTYPE ...").  Not
 * anywhere in the reply: an error may echo the command, the stream key
 * filled in from the message among its arguments.
 */
static bool
redis_script_error(const redisReply *r, const char *text)
{
	size_t		n = strlen(text);
	const char *wrapped = "ERR Error running script";
	const char *p;

	if (r->str == NULL)
		return false;
	if (r->len >= n && strncmp(r->str, text, n) == 0)
		return true;
	if (r->len < strlen(wrapped) || strncmp(r->str, wrapped, strlen(wrapped)) != 0)
		return false;
	p = memmem(r->str, r->len, "@user_script:", 13);
	if (p == NULL)
		return false;
	p += 13;
	while (p < r->str + r->len && outbox_ascii_digit((unsigned char) *p))
		p++;
	return (size_t) (r->str + r->len - p) >= n + 2 && strncmp(p, ": ", 2) == 0 &&
		strncmp(p + 2, text, n) == 0;
}

/*
 * One reply, answering the oldest pending entry.  Returns false when the
 * connection is given up (the caller stops reading it).
 */
static bool
redis_reply(RelayTarget *t, redisReply *r, RelayFinishedFn finished)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);
	RedisPending p;
	char		error[RELAY_MAX_ERROR_LEN + 1];

	if (rt->npending == 0)
	{
		snprintf(error, sizeof(error), "Redis at %s sent a reply to no command", rt->conn.peer);
		redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
		return false;
	}
	p = rt->pending[rt->pending_head];
	rt->pending_head = (rt->pending_head + 1) % rt->maxpending;
	rt->npending--;

	switch (p.kind)
	{
		case REDIS_PENDING_AUTH:
		case REDIS_PENDING_SELECT:
		case REDIS_PENDING_LOAD:
			if (r->type == REDIS_REPLY_ERROR && p.kind == REDIS_PENDING_AUTH)
			{
				/*
				 * Its code only: an error may echo the command's arguments
				 * (an AUTH renamed away: "unknown command ... with args
				 * beginning with: 'user' 'password'"), the password among
				 * them.
				 */
				int			code = (int) strspn(r->str ? r->str : "", "ABCDEFGHIJKLMNOPQRSTUVWXYZ");

				snprintf(error, sizeof(error), "Redis refused the credentials%s%.*s (the rest of its answer is not shown: it may echo the password)",
						 code > 0 ? ": " : "", code, r->str ? r->str : "");
				redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
				return false;
			}
			if (r->type == REDIS_REPLY_ERROR)
			{
				redis_error_text(r, p.kind == REDIS_PENDING_SELECT ? "Redis refused to select the database" :
								 "Redis refused to load the relay's script", error, sizeof(error));
				redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
				return false;
			}
			if (p.kind == REDIS_PENDING_LOAD)
			{
				rt->loading = false;
				if (r->type != REDIS_REPLY_STRING || r->len != 40 ||
					strncmp(r->str, script_sha, 40) != 0)
				{
					snprintf(error, sizeof(error), "Redis at %s answered SCRIPT LOAD with something else than the script's SHA1",
							 rt->conn.peer);
					redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
					return false;
				}
				if (!rt->ready)
				{
					/* the handshake's last answer: what waited goes */
					rt->ready = true;
					appendBinaryStringInfo(&rt->conn.out, rt->early.data, rt->early.len);
					resetStringInfo(&rt->early);
					relay_conn_flush(&rt->conn);
				}
			}
			return true;
		case REDIS_PENDING_MESSAGE:
			break;
	}

	{
		RelayLane  *lane;
		RelayAcks  *rl;

		if (p.lane < 0 || p.lane >= t->nlanes)
			return true;
		lane = &t->lanes[p.lane];
		rl = REDIS_LANE(lane);
		if (!lane->in_flight || !relay_acks_waits(rl, p.request, p.pos))
			return true;		/* a request given up already */
		if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
			r->element[0]->type == REDIS_REPLY_INTEGER &&
			(r->element[0]->integer == 0 || r->element[0]->integer == 1) &&
			r->element[1]->type == REDIS_REPLY_STRING)
			rl->acked[p.pos] = true;
		else if (r->type == REDIS_REPLY_ERROR)
		{
			RelayOutcomeKind kind = RELAY_RECEIVER_FAILED;

			redis_error_text(r, "Redis error", error, sizeof(error));
			if (redis_error_is(r, "NOSCRIPT"))
			{
				/*
				 * The script was flushed: load it again, and hold the
				 * target a moment (no attempt counted) before sending again.
				 */
				snprintf(error, sizeof(error), "Redis at %s lost the relay's script (NOSCRIPT: SCRIPT FLUSH, or a restart); it is loaded again",
						 rt->conn.peer);
				if (!rt->loading)
				{
					redis_queue_load(t);
					rt->loading = true;
				}
			}
			else if (redis_error_is(r, "MOVED") || redis_error_is(r, "ASK") ||
					 redis_error_is(r, "CROSSSLOT"))
				snprintf(error, sizeof(error), "Redis Cluster is not supported (the server answered %.*s)",
						 (int) Min(r->len, 100), r->str);
			else if (relay_template_filled(t->stream) &&
					 (redis_script_error(r, "WRONGTYPE ") || redis_script_error(r, REDIS_EXHAUSTED)))
			{
				/*
				 * The stream key the message's topic or key filled in names
				 * a key of another type, or a stream that can take no more
				 * entries: the message's doing, not the target's.
				 */
				RelayMessage *m = lane->head;
				int			k;

				for (k = 0; k < p.pos && m != NULL; k++)
					m = m->next;
				if (m != NULL && relay_template_fill(t->stream, m, &rt->stream))
				{
					char		shown[RELAY_SHOWN_LEN];

					relay_shown(shown, sizeof(shown), rt->stream.data, rt->stream.len);
					if (redis_script_error(r, "WRONGTYPE "))
						snprintf(error, sizeof(error), "Redis answered WRONGTYPE for the stream key filled in from the message: a key of another type has that name (\"%s\")",
								 shown);
					else
						snprintf(error, sizeof(error), "Redis answered that the stream filled in from the message can take no more entries: it has exhausted the last possible ID (\"%s\")",
								 shown);
					kind = RELAY_REJECTED;	/* I10 */
				}
			}
			/* Anything else (WRONGTYPE, OOM, NOPERM, LOADING, BUSY ...): held. */
			relay_acks_bad(rl, p.pos, kind, error);
		}
		else
		{
			snprintf(error, sizeof(error), "Redis at %s answered the relay's script with an unexpected reply (type %d)",
					 rt->conn.peer, r->type);
			relay_acks_bad(rl, p.pos, RELAY_RECEIVER_FAILED, error);
		}
		relay_acks_lane_check(lane, finished);
	}
	return true;
}

/* Read what the socket has and take every whole reply in it. */
static void
redis_read(RelayTarget *t, RelayFinishedFn finished)
{
	RelayRedisTarget *rt = REDIS_TARGET(t);
	char		buf[REDIS_READ_CHUNK];
	char		error[RELAY_MAX_ERROR_LEN + 1];
	int			reads;

	/* At most REDIS_MAX_READS: the rest wakes the loop again (level-triggered). */
	for (reads = 0; reads < REDIS_MAX_READS; reads++)
	{
		int			n = relay_conn_read(&rt->conn, buf, sizeof(buf));
		void	   *reply = NULL;

		if (n == 0)
			return;
		if (n < 0)
		{
			strlcpy(error, rt->conn.error, sizeof(error));
			redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
			return;
		}
		if (redisReaderFeed(rt->reader, buf, n) != REDIS_OK)
		{
			redis_fail(t, RELAY_RECEIVER_FAILED, "out of memory reading Redis replies", finished);
			return;
		}
		for (;;)
		{
			if (redisReaderGetReply(rt->reader, &reply) != REDIS_OK)
			{
				snprintf(error, sizeof(error), "Redis at %s sent what the relay cannot parse: %s",
						 rt->conn.peer, rt->reader->errstr);
				redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
				return;
			}
			if (reply == NULL)
				break;
			if (!redis_reply(t, (redisReply *) reply, finished))
			{
				redis_free_reply(reply);
				return;
			}
			redis_free_reply(reply);
			if (t->priv == NULL || rt->conn.state != RELAY_CONN_OPEN)
				return;
		}
		if (rt->reader->len - rt->reader->pos > REDIS_MAX_UNPARSED)
		{
			snprintf(error, sizeof(error), "Redis at %s sent a reply larger than 4 MB", rt->conn.peer);
			redis_fail(t, RELAY_RECEIVER_FAILED, error, finished);
			return;
		}
		/* a new reply may have queued a command (SCRIPT LOAD) */
		relay_conn_flush(&rt->conn);
	}
}

/* A request past its deadline: the connection is given up, the target held. */
static RelayOutcomeKind
redis_expired(RelayTarget *t, char *error, size_t size)
{
	relay_conn_timeout_text(&REDIS_TARGET(t)->conn, t->timeout_ms, error, size);
	return RELAY_RECEIVER_FAILED;
}

/* The options of a Redis target row read (relay_config.c). */
static const char *
relay_redis_check(RelayTarget *t)
{
	const char *why;

	if (t->url == NULL)
		return "url is missing";
	if ((why = relay_redis_check_url(t->url)) != NULL)
		return psprintf("url: %s", why);
	if ((why = relay_redis_check_stream(t->stream)) != NULL)
		return psprintf("stream: %s", why);
	if (t->maxlen < 0)
		return "maxlen is below 1";
	if (t->dedup_window < 0 || t->dedup_window > 2592000)
		return "dedup_window is not between 0 and 2592000";
	if (t->format == RELAY_FORMAT_CE_BINARY)
		return "a Redis target sends CloudEvents in structured mode only (cloudevents-structured)";
	return NULL;
}

const RelayTransport relay_redis_transport = {
	.kind = "redis",
	.id = RELAY_REDIS,
	.header_lines = false,
	.per_message = true,
	.check = relay_redis_check,
	.start = relay_redis_start,
	.target_init = relay_redis_target_init,
	.target_release = relay_redis_target_release,
	.lane_init = relay_acks_lane_init,
	.lane_release = relay_acks_lane_release,
	.send = relay_redis_send,
	.conn_set = &conns,
	.conn_close = redis_conn_close,
	.conn_connect = redis_connect,
	.conn_read = redis_read,
	.conn_fail = redis_fail,
	.conn_expired = redis_expired,
};
