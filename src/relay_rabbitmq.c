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
 * Threads: rabbitmq-c has none.  The relay dials the broker itself (every
 * address checked with the destination rules) and hands rabbitmq-c the
 * connected socket; the AMQP handshake (connection, login, channel,
 * confirm.select) then runs on the relay's thread, bounded by the target's
 * timeout (at most RMQ_HANDSHAKE_MS).  Confirms, returns and closes are
 * read without waiting when the socket, in an epoll set whose descriptor is
 * in the relay's WaitEventSet, is readable.
 *
 * Delivery tags are numbered from 1 on a channel, one per publish; a FIFO
 * of what each tag was (lane, request, position) matches the confirms,
 * which may acknowledge many at once (multiple).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

#include "fmgr.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Longest exchange name and routing key (AMQP short strings). */
#define RMQ_MAX_SHORTSTR	255
/* Longest the connection and handshake may block the relay. */
#define RMQ_HANDSHAKE_MS	5000
/* Largest frame asked for. */
#define RMQ_FRAME_MAX		131072
/* Most frames taken in one turn of the loop per target. */
#define RMQ_MAX_FRAMES		256
/* Headers the relay puts on every message before its own. */
#define RMQ_OWN_HEADERS		4
/* Longest a connection waits for a host name's lookup, each attempt. */
#define RMQ_LOOKUP_WAIT_MS	50
/* The channel the relay publishes on. */
#define RMQ_CHANNEL			1

/* A host name resolved by glibc's thread: malloc'd, glibc writes to it. */
typedef struct RmqLookup
{
	struct gaicb cb;
	struct addrinfo hints;
	char		name[256];
	char		service[8];
} RmqLookup;

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
	amqp_connection_state_t conn;	/* NULL for none */
	int			fd;				/* its socket (rabbitmq-c's), or -1 */
	uint64		serial;			/* epoll events name it by this */
	char	   *url;			/* the url it was made for */
	uint64		destinations;	/* outbox_destinations_generation then */
	char		peer[INET6_ADDRSTRLEN + 8];
	RmqLookup  *lookup;			/* a host name being resolved, or NULL */
	bool		broken;			/* a publish failed: drive() ends it */
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
	int			in_flight;		/* lanes of the target with a request */
	MemoryContext cxt;			/* the target's, where out lives */
	StringInfoData out;			/* frames not yet written */
	int			out_off;		/* bytes of out written */
	bool		want_write;		/* EPOLLOUT asked for */
	char		broken_why[RELAY_MAX_ERROR_LEN + 1];
	long		max_message_size;	/* the broker refused a body above this
									 * (a 406), 0 for not known */
	StringInfoData key;			/* reused: a message's routing key */
	amqp_table_entry_t *headers;	/* reused: a message's headers, in cxt */
	int			nheaders;		/* of them set */
	int			maxheaders;		/* entries in headers */
	char		error[RELAY_MAX_ERROR_LEN + 1];
} RelayRmqTarget;

#define RMQ_TARGET(t)	((RelayRmqTarget *) (t)->priv)
#define RMQ_LANE(lane)	((RelayAcks *) (lane)->priv)

static int	epoll_fd = -1;
static uint64 next_conn_serial = 1;
static int	requests_in_flight = 0;

/*---- checks, for the SQL functions and for rows read ----*/

/*
 * Whether url is an AMQP URL the relay can use:
 * amqp://[user[:password]@]host[:port][/vhost].  Returns why not, or NULL;
 * with info (and its string, which it points into), fills it.
 */
static const char *
rmq_parse_url(const char *url, struct amqp_connection_info *info, char **copy)
{
	char	   *s;
	const char *why = NULL;
	const char *slash;
	const char *at;
	struct amqp_connection_info i;

	if (url == NULL || *url == '\0')
		return "it is empty";
	if (pg_strncasecmp(url, "amqps://", 8) == 0)
		return "TLS (amqps://) is not supported yet";
	if (strncmp(url, "amqp://", 7) != 0)
		return "it must start with amqp://";
	if (strpbrk(url, "?#") != NULL)
		return "it has a query; only amqp://[user:password@]host[:port][/vhost] is taken";
	if (strchr(url + 7, ',') != NULL)
		return "it names several servers; give one";
	/* a user without a password would log in with rabbitmq-c's "guest" */
	slash = strchr(url + 7, '/');
	at = memchr(url + 7, '@', (slash ? slash : url + strlen(url)) - (url + 7));
	if (at != NULL && memchr(url + 7, ':', at - (url + 7)) == NULL)
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
				(errcode(strncmp(why, "TLS", 3) == 0 ?
						 ERRCODE_FEATURE_NOT_SUPPORTED : ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid AMQP URL %s",
						url ? quote_literal_cstr(relay_url_shown(url)) : "NULL"),
				 errdetail("The URL is not usable: %s.", why),
				 strncmp(why, "TLS", 3) == 0 ?
				 errhint("Reach a TLS-only broker through a TLS tunnel on loopback (stunnel) and give its amqp:// address.") :
				 errhint("Give amqp://user:password@host:port/vhost (port 5672 and vhost / by default); percent-encode special characters, and the vhost / as %%2f.")));
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

static int
relay_rabbitmq_start(void)
{
	epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (epoll_fd < 0)
		elog(ERROR, "outbox: could not create an epoll set: %m");
	ReserveExternalFD();
	return epoll_fd;
}

/* Drop the lookup; one still running is left to glibc (a small leak). */
static void
rmq_lookup_forget(RelayRmqTarget *rt)
{
	RmqLookup  *l = rt->lookup;

	if (l == NULL)
		return;
	rt->lookup = NULL;
	if (gai_error(&l->cb) == EAI_INPROGRESS)
	{
		int			rc = gai_cancel(&l->cb);

		if (rc != EAI_CANCELED && rc != EAI_ALLDONE)
			return;
	}
	if (l->cb.ar_result)
		freeaddrinfo(l->cb.ar_result);
	free(l);
}

/* Close the connection; what it carried is forgotten. */
static void
rmq_close(RelayRmqTarget *rt)
{
	if (rt->conn != NULL)
	{
		if (rt->fd >= 0)
			(void) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, rt->fd, NULL);
		/* closes the socket, without waiting for the broker */
		amqp_destroy_connection(rt->conn);
		rt->conn = NULL;
		if (rt->fd >= 0)
			ReleaseExternalFD();
	}
	else if (rt->fd >= 0)
	{
		close(rt->fd);
		ReleaseExternalFD();
	}
	rt->fd = -1;
	rmq_lookup_forget(rt);
	rt->ntags = 0;
	rt->tags_head = 0;
	rt->returning = false;
	rt->return_header = false;
	rt->more = false;
	rt->broken = false;
	rt->blocked = false;
	rt->want_write = false;
	if (rt->out.data != NULL)
		resetStringInfo(&rt->out);
	rt->out_off = 0;
}

static void
relay_rabbitmq_stop(void)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_RABBITMQ && t->priv != NULL)
			rmq_close(RMQ_TARGET(t));
	}
	if (epoll_fd >= 0)
	{
		close(epoll_fd);
		ReleaseExternalFD();
		epoll_fd = -1;
	}
}

/* What a failed RPC (login, channel.open, confirm.select) said. */
static void
rmq_reply_text(amqp_rpc_reply_t r, const char *what, char *error, size_t size)
{
	switch (r.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			snprintf(error, size, "%s: no error", what);
			break;
		case AMQP_RESPONSE_NONE:
			snprintf(error, size, "%s: the broker sent no reply", what);
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			snprintf(error, size, "%s: %s", what, amqp_error_string2(r.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			{
				amqp_connection_close_t *c = (amqp_connection_close_t *) r.reply.decoded;

				snprintf(error, size, "%s: the broker closed the connection: %d %.*s", what,
						 c->reply_code, (int) Min(c->reply_text.len, 150),
						 (char *) c->reply_text.bytes);
			}
			else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_channel_close_t *c = (amqp_channel_close_t *) r.reply.decoded;

				snprintf(error, size, "%s: the broker closed the channel: %d %.*s", what,
						 c->reply_code, (int) Min(c->reply_text.len, 150),
						 (char *) c->reply_text.bytes);
			}
			else
				snprintf(error, size, "%s: the broker answered method 0x%08X", what, r.reply.id);
			break;
	}
	/* printable ASCII only: it goes to last_error */
	for (; *error; error++)
		if ((unsigned char) *error < 0x20 || (unsigned char) *error >= 0x7f)
			*error = '?';
}

/*
 * A host name's addresses, resolved in the background: a lookup is
 * started (or one under way for the same name looked at) and waited for
 * RMQ_LOOKUP_WAIT_MS at most; while it runs the connection fails with
 * that reason, and the next attempt looks again.  The list is the
 * lookup's (rmq_lookup_forget frees it).
 */
static bool
rmq_resolve(RelayRmqTarget *rt, const char *host, const char *service, struct addrinfo **list)
{
	RmqLookup  *l = rt->lookup;
	int			rc;

	if (l != NULL && (strcmp(l->name, host) != 0 || strcmp(l->service, service) != 0))
	{
		rmq_lookup_forget(rt);
		l = NULL;
	}
	if (l == NULL)
	{
		struct gaicb *one[1];
		sigset_t	all;
		sigset_t	old;

		l = calloc(1, sizeof(RmqLookup));
		if (l == NULL)
		{
			snprintf(rt->error, sizeof(rt->error), "out of memory");
			return false;
		}
		strlcpy(l->name, host, sizeof(l->name));
		strlcpy(l->service, service, sizeof(l->service));
		l->hints.ai_family = AF_UNSPEC;
		l->hints.ai_socktype = SOCK_STREAM;
		l->cb.ar_name = l->name;
		l->cb.ar_service = l->service;
		l->cb.ar_request = &l->hints;
		one[0] = &l->cb;
		/* glibc's resolver thread must not take PostgreSQL's signals */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = getaddrinfo_a(GAI_NOWAIT, one, 1, NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (rc != 0)
		{
			free(l);
			snprintf(rt->error, sizeof(rt->error), "could not resolve \"%s\": %s", host, gai_strerror(rc));
			return false;
		}
		rt->lookup = l;
	}
	{
		const struct gaicb *one[1] = {&l->cb};
		struct timespec ts = {0, RMQ_LOOKUP_WAIT_MS * 1000000L};

		if (gai_error(&l->cb) == EAI_INPROGRESS)
			(void) gai_suspend(one, 1, &ts);
	}
	rc = gai_error(&l->cb);
	if (rc == EAI_INPROGRESS)
	{
		snprintf(rt->error, sizeof(rt->error), "resolving \"%s\" (the DNS is slow: the target waits, the relay goes on)", host);
		return false;
	}
	if (rc != 0)
	{
		snprintf(rt->error, sizeof(rt->error), "could not resolve \"%s\": %s", host, gai_strerror(rc));
		rmq_lookup_forget(rt);
		return false;
	}
	*list = l->cb.ar_result;
	return true;
}

/*
 * Dial the broker: the first allowed address that accepts within the
 * handshake's time.  Returns the socket, or -1 with rt->error.
 */
static int
rmq_dial(RelayRmqTarget *rt, const char *host, int port, TimestampTz deadline)
{
	struct addrinfo hints;
	struct addrinfo *list = NULL;
	struct addrinfo *ai;
	char		service[8];
	const char *refused = NULL;
	int			rc;
	bool		from_lookup = false;

	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	snprintf(service, sizeof(service), "%d", port);
	/* An address at once; a name in the background (glibc's thread). */
	if ((rc = getaddrinfo(host, service, &hints, &list)) == EAI_NONAME)
	{
		if (!rmq_resolve(rt, host, service, &list))
			return -1;
		from_lookup = true;
	}
	else if (rc != 0)
	{
		snprintf(rt->error, sizeof(rt->error), "could not resolve \"%s\": %s", host, gai_strerror(rc));
		return -1;
	}
	snprintf(rt->error, sizeof(rt->error), "\"%s\" has no IPv4 or IPv6 address", host);
	for (ai = list; ai != NULL; ai = ai->ai_next)
	{
		const void *addr;
		char		text[INET6_ADDRSTRLEN];
		int			fd;
		int			one = 1;
		struct pollfd pfd;
		int			err = 0;
		socklen_t	len = sizeof(err);

		if (ai->ai_family == AF_INET)
			addr = &((struct sockaddr_in *) ai->ai_addr)->sin_addr;
		else if (ai->ai_family == AF_INET6)
			addr = &((struct sockaddr_in6 *) ai->ai_addr)->sin6_addr;
		else
			continue;
		if ((refused = outbox_destination_refused(ai->ai_family, addr, host)) != NULL)
		{
			snprintf(rt->error, sizeof(rt->error), "connection refused by the relay: %s", refused);
			continue;
		}
		inet_ntop(ai->ai_family, addr, text, sizeof(text));
		snprintf(rt->peer, sizeof(rt->peer), ai->ai_family == AF_INET6 ? "[%s]:%d" : "%s:%d",
				 text, port);
		if (!AcquireExternalFD())
		{
			snprintf(rt->error, sizeof(rt->error), "could not connect to RabbitMQ at %s: no file descriptor is free",
					 rt->peer);
			break;
		}
		fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
		{
			ReleaseExternalFD();
			snprintf(rt->error, sizeof(rt->error), "could not connect to RabbitMQ at %s: %s",
					 rt->peer, strerror(errno));
			continue;
		}
		(void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
		{
			if (errno != EINPROGRESS)
				err = errno;
			else
			{
				pfd.fd = fd;
				pfd.events = POLLOUT;
				do
				{
					long		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);

					rc = left > 0 ? poll(&pfd, 1, (int) left) : 0;
				} while (rc < 0 && errno == EINTR);
				if (rc == 0)
					err = ETIMEDOUT;
				else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
					err = errno;
			}
		}
		if (err != 0)
		{
			snprintf(rt->error, sizeof(rt->error), "could not connect to RabbitMQ at %s: %s",
					 rt->peer, strerror(err));
			close(fd);
			ReleaseExternalFD();
			continue;
		}
		if (from_lookup)
			rmq_lookup_forget(rt);
		else
			freeaddrinfo(list);
		return fd;
	}
	if (from_lookup)
		rmq_lookup_forget(rt);
	else
		freeaddrinfo(list);
	return -1;
}

/*
 * Make the target's connection if it has none: dial, hand the socket to
 * rabbitmq-c, log in, open the channel in confirm mode.  Returns false,
 * with rt->error, when it cannot be made.
 */
static bool
rmq_connect(RelayTarget *t)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	struct amqp_connection_info info;
	char	   *copy;
	const char *bad;
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	struct timeval tv;
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   Min(t->timeout_ms, RMQ_HANDSHAKE_MS));
	long		left;
	int			fd;
	amqp_table_entry_t caps[2];
	amqp_table_entry_t props[3];
	amqp_table_t client;
	MemoryContext oldcxt;
	struct epoll_event ev;

	if (rt->conn != NULL)
		return true;
	/* another broker (or the same reconfigured): its limit is not known */
	if (rt->url == NULL || strcmp(rt->url, t->url) != 0)
		rt->max_message_size = 0;
	oldcxt = MemoryContextSwitchTo(t->cxt);
	if (rt->url)
		pfree(rt->url);
	rt->url = pstrdup(t->url);
	MemoryContextSwitchTo(oldcxt);
	rt->destinations = outbox_destinations_generation;
	if ((bad = rmq_parse_url(t->url, &info, &copy)) != NULL)
	{
		snprintf(rt->error, sizeof(rt->error), "the url is not usable: %s", bad);
		return false;
	}
	if ((fd = rmq_dial(rt, info.host, info.port, deadline)) < 0)
	{
		memset(copy, 0, strlen(t->url));	/* the password, gone from memory */
		pfree(copy);
		return false;
	}

	rt->conn = amqp_new_connection();
	sock = rt->conn ? amqp_tcp_socket_new(rt->conn) : NULL;
	if (sock == NULL)
	{
		close(fd);
		ReleaseExternalFD();
		if (rt->conn)
			amqp_destroy_connection(rt->conn);
		rt->conn = NULL;
		snprintf(rt->error, sizeof(rt->error), "out of memory");
		memset(copy, 0, strlen(t->url));
		pfree(copy);
		return false;
	}
	amqp_tcp_socket_set_sockfd(sock, fd);
	rt->fd = fd;
	/* the handshake gets what is left of the connection's time */
	left = Max((long) ((deadline - GetCurrentTimestamp()) / 1000), 1);
	tv.tv_sec = left / 1000;
	tv.tv_usec = (left % 1000) * 1000;
	(void) amqp_set_handshake_timeout(rt->conn, &tv);
	(void) amqp_set_rpc_timeout(rt->conn, &tv);

	/* Ask for connection.blocked notices (a broker short of memory). */
	caps[0].key = amqp_cstring_bytes("connection.blocked");
	caps[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[0].value.value.boolean = 1;
	caps[1].key = amqp_cstring_bytes("publisher_confirms");
	caps[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[1].value.value.boolean = 1;
	props[0].key = amqp_cstring_bytes("capabilities");
	props[0].value.kind = AMQP_FIELD_KIND_TABLE;
	props[0].value.value.table.num_entries = 2;
	props[0].value.value.table.entries = caps;
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes("outbox relay");
	props[2].key = amqp_cstring_bytes("product");
	props[2].value.kind = AMQP_FIELD_KIND_UTF8;
	props[2].value.value.bytes = amqp_cstring_bytes("outbox");
	client.num_entries = 3;
	client.entries = props;

	r = amqp_login_with_properties(rt->conn, info.vhost, 1, RMQ_FRAME_MAX, 0, &client,
								   AMQP_SASL_METHOD_PLAIN, info.user, info.password);
	memset(copy, 0, strlen(t->url));	/* the password, gone from memory */
	pfree(copy);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		rmq_reply_text(r, "RabbitMQ refused the login", rt->error, sizeof(rt->error));
		rmq_close(rt);
		return false;
	}
	/*
	 * The relay writes its publishes itself (rmq_flush): rabbitmq-c must
	 * never write on its own, which it would for heartbeats.
	 */
	if (amqp_get_heartbeat(rt->conn) != 0)
	{
		snprintf(rt->error, sizeof(rt->error), "RabbitMQ at %s asked for heartbeats the relay cannot send", rt->peer);
		rmq_close(rt);
		return false;
	}
	/* each RPC gets what is left of the one deadline */
	left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
	if (left > 0)
	{
		tv.tv_sec = left / 1000;
		tv.tv_usec = (left % 1000) * 1000;
		(void) amqp_set_rpc_timeout(rt->conn, &tv);
		amqp_channel_open(rt->conn, RMQ_CHANNEL);
		r = amqp_get_rpc_reply(rt->conn);
		left = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (r.reply_type == AMQP_RESPONSE_NORMAL && left > 0)
		{
			tv.tv_sec = left / 1000;
			tv.tv_usec = (left % 1000) * 1000;
			(void) amqp_set_rpc_timeout(rt->conn, &tv);
			amqp_confirm_select(rt->conn, RMQ_CHANNEL);
			r = amqp_get_rpc_reply(rt->conn);
		}
	}
	if (left <= 0)
	{
		snprintf(rt->error, sizeof(rt->error), "RabbitMQ at %s did not finish the handshake within %d ms",
				 rt->peer, Min(t->timeout_ms, RMQ_HANDSHAKE_MS));
		rmq_close(rt);
		return false;
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		rmq_reply_text(r, "RabbitMQ refused the channel", rt->error, sizeof(rt->error));
		rmq_close(rt);
		return false;
	}
	ev.events = EPOLLIN;
	rt->serial = next_conn_serial++;
	ev.data.u64 = rt->serial;
	if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, rt->fd, &ev) != 0)
	{
		snprintf(rt->error, sizeof(rt->error), "could not wait for RabbitMQ at %s: %s",
				 rt->peer, strerror(errno));
		rmq_close(rt);
		return false;
	}
	rt->next_tag = 1;
	rt->first_tag = 1;
	rt->ntags = 0;
	rt->tags_head = 0;
	return true;
}

static void
relay_rabbitmq_lane_init(RelayLane *lane)
{
	RelayTarget *t = lane->target;

	if (t->priv == NULL)
	{
		RelayRmqTarget *rt = MemoryContextAllocZero(t->cxt, sizeof(RelayRmqTarget));
		MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

		rt->fd = -1;
		rt->cxt = t->cxt;
		initStringInfo(&rt->key);
		initStringInfo(&rt->out);
		MemoryContextSwitchTo(oldcxt);
		t->priv = rt;
	}
	lane->priv = MemoryContextAllocZero(t->cxt, sizeof(RelayAcks));
}

static void
relay_rabbitmq_lane_release(RelayLane *lane)
{
	RelayTarget *t = lane->target;

	if (lane->in_flight)
	{
		requests_in_flight--;
		if (t->priv != NULL)
			RMQ_TARGET(t)->in_flight--;
		lane->in_flight = false;
	}
	/* The last lane closes the target's connection. */
	if (lane->index == t->nlanes - 1 && t->priv != NULL)
	{
		rmq_close(RMQ_TARGET(t));
		t->priv = NULL;
	}
}

/* Note what the next delivery tag is. */
static void
rmq_tag(RelayTarget *t, RelayLane *lane, uint32 request, int pos, RelayMessage *m)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	RmqTag	   *g;

	if (rt->ntags == rt->maxtags)
	{
		int			size = Max(64, rt->maxtags * 2);
		RmqTag	   *ring = MemoryContextAlloc(t->cxt, size * sizeof(RmqTag));
		int			i;

		for (i = 0; i < rt->ntags; i++)
			ring[i] = rt->tags[(rt->tags_head + i) % rt->maxtags];
		if (rt->tags)
			pfree(rt->tags);
		rt->tags = ring;
		rt->tags_head = 0;
		rt->maxtags = size;
	}
	if (rt->ntags == 0)
		rt->first_tag = rt->next_tag;
	g = &rt->tags[(rt->tags_head + rt->ntags) % rt->maxtags];
	g->lane = lane->index;
	g->request = request;
	g->pos = pos;
	g->body_len = m->payload_len;
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
	rmq_header_str(&rt->headers[n++], "outbox-seq", number);
	rmq_header_str(&rt->headers[n++], "outbox-topic", m->topic);
	if (m->key)
		rmq_header_str(&rt->headers[n++], "outbox-key", m->key);
	/* The message's own headers: "Name: value" lines, or "Name;" for "". */
	for (p = m->header_lines; p != NULL && *p; p += strlen(p) + 1)
	{
		int			name_len = strcspn(p, ":;");
		const char *value = p[name_len] == ':' ? p + name_len + 1 : "";

		if (rmq_broker_header(p, name_len))
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

/* Ask for EPOLLOUT while frames wait to be written. */
static void
rmq_want_write(RelayRmqTarget *rt, bool want)
{
	struct epoll_event ev;

	if (rt->fd < 0 || rt->want_write == want)
		return;
	ev.events = EPOLLIN | (want ? EPOLLOUT : 0);
	ev.data.u64 = rt->serial;
	if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, rt->fd, &ev) == 0)
		rt->want_write = want;
}

/*
 * Write what the socket takes now, never waiting (rabbitmq-c's own
 * publish waits without end on a broker that stopped reading); a failure
 * is left for drive().
 */
static void
rmq_flush(RelayRmqTarget *rt)
{
	while (rt->conn != NULL && !rt->broken && rt->out_off < rt->out.len)
	{
		ssize_t		n = send(rt->fd, rt->out.data + rt->out_off,
							 rt->out.len - rt->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0)
			rt->out_off += n;
		else if (n < 0 && errno == EINTR)
			continue;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		else
		{
			rt->broken = true;
			snprintf(rt->broken_why, sizeof(rt->broken_why),
					 "the connection to RabbitMQ at %s was lost: %s", rt->peer,
					 n == 0 ? "closed" : strerror(errno));
			break;
		}
	}
	if (rt->out_off >= rt->out.len)
	{
		if (rt->out.maxlen > 4 * 1024 * 1024)
		{
			MemoryContext oldcxt = MemoryContextSwitchTo(rt->cxt);

			pfree(rt->out.data);
			initStringInfo(&rt->out);
			MemoryContextSwitchTo(oldcxt);
		}
		resetStringInfo(&rt->out);
		rt->out_off = 0;
	}
	if (rt->conn != NULL)
		rmq_want_write(rt, rt->out_off < rt->out.len);
}

/* One frame: type, channel, size, payload, end (AMQP 0-9-1, 2.3.5). */
static void
rmq_frame(StringInfo out, uint8 type, const char *payload, uint32 len)
{
	unsigned char h[7];

	h[0] = type;
	h[1] = 0;
	h[2] = RMQ_CHANNEL;
	h[3] = (len >> 24) & 0xFF;
	h[4] = (len >> 16) & 0xFF;
	h[5] = (len >> 8) & 0xFF;
	h[6] = len & 0xFF;
	appendBinaryStringInfo(out, (const char *) h, 7);
	appendBinaryStringInfo(out, payload, len);
	appendStringInfoChar(out, (char) AMQP_FRAME_END);
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
	int			frame_max = amqp_get_frame_max(rt->conn);
	int			room = frame_max - 8;
	char	   *buf = palloc(frame_max);
	amqp_basic_publish_t m;
	amqp_bytes_t enc;
	int			n;
	size_t		off;
	int			start = rt->out.len;

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
	rmq_frame(&rt->out, AMQP_FRAME_METHOD, buf, 4 + n);
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
		rt->out.len = start;
		rt->out.data[start] = '\0';
		pfree(buf);
		return "its headers do not fit in the broker's frame size";
	}
	rmq_frame(&rt->out, AMQP_FRAME_HEADER, buf, 12 + n);
	for (off = 0; off < len; off += room)
		rmq_frame(&rt->out, AMQP_FRAME_BODY, body + off, (uint32) Min((size_t) room, len - off));
	pfree(buf);
	return NULL;
}

/*
 * Publish the lane's next request: the cut_n messages at its head.
 * Returns false, with *failed set, when not one could be published.
 */
static bool
relay_rabbitmq_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayRmqTarget *rt = RMQ_TARGET(t);
	RelayAcks  *rl = RMQ_LANE(lane);
	RelayMessage *m;
	int			i;
	int			out_len;
	int			ntags;
	uint64		next_tag;

	Assert(!lane->in_flight && lane->nqueued > 0);
	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", lane->head->topic);

	/* A connection made for another url or other rules is made anew. */
	if (rt->conn != NULL &&
		(strcmp(rt->url, t->url) != 0 || rt->destinations != outbox_destinations_generation))
	{
		if (rt->in_flight > 0)
		{
			failed->kind = RELAY_RETRY;
			failed->error = "the url or the destination rules changed: the connection is made anew";
			return false;
		}
		rmq_close(rt);
	}
	/* A connection that failed with nothing on it is made anew. */
	if (rt->conn != NULL && rt->broken && rt->in_flight == 0)
		rmq_close(rt);
	if (rt->blocked || rt->broken)
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = rt->blocked ? rt->blocked_why : rt->broken_why;
		return false;
	}
	if (!rmq_connect(t))
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = rt->error;
		return false;
	}

	relay_acks_begin(rl, lane->cut_n, t->cxt);
	lane->nbatch = lane->cut_n;
	out_len = rt->out.len;
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
		if ((bad = rmq_message_headers(t, m, number)) != NULL)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED, bad);
			break;
		}
		memset(&props, 0, sizeof(props));
		props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
			AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
		props.content_type = amqp_cstring_bytes("application/json");
		props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
		props.message_id = amqp_cstring_bytes(m->msg_id);
		props.timestamp = (uint64) (timestamptz_to_time_t(m->emitted_at));
		props.headers.num_entries = rt->nheaders;
		props.headers.entries = rt->headers;
		if (rt->max_message_size > 0 && m->payload_len > rt->max_message_size)
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];

			snprintf(error, sizeof(error), "the message's %d bytes are more than the broker's max_message_size (%ld, from its earlier refusal)",
					 m->payload_len, rt->max_message_size);
			relay_acks_bad(rl, i, RELAY_REJECTED, error);
			break;
		}
		if ((bad = rmq_encode_publish(rt, t->exchange, rt->key.data, &props, m->payload,
									  m->payload_len)) != NULL)
		{
			relay_acks_bad(rl, i, RELAY_REJECTED, bad);
			break;
		}
		rmq_tag(t, lane, rl->request, i, m);
		rl->nsent++;
	}
	}
	PG_CATCH();
	{
		rt->out.len = out_len;
		rt->out.data[out_len] = '\0';
		rt->ntags = ntags;
		rt->next_tag = next_tag;
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (rl->nsent == 0)
	{
		failed->kind = rl->bad_kind;
		failed->error = rl->bad_error;
		return false;
	}
	rl->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), t->timeout_ms);
	lane->in_flight = true;
	rt->in_flight++;
	requests_in_flight++;
	rmq_flush(rt);
	return true;
}

/* Report the lane's request if what came back decides it. */
static void
rmq_lane_check(RelayLane *lane, RelayFinishedFn finished)
{
	RelayOutcome outcome;

	if (!relay_acks_decided(RMQ_LANE(lane)))
		return;
	relay_acks_outcome(RMQ_LANE(lane), &outcome);
	lane->in_flight = false;
	RMQ_TARGET(lane->target)->in_flight--;
	requests_in_flight--;
	finished(lane, &outcome);
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
		RelayLane  *lane = &t->lanes[g->lane];

		if (!g->acked && g->body_len > too_large && g->lane < t->nlanes &&
			lane->in_flight && relay_acks_waits(RMQ_LANE(lane), g->request, g->pos))
		{
			relay_acks_bad(RMQ_LANE(lane), g->pos, RELAY_REJECTED, error);
			break;
		}
	}
	rmq_close(rt);
	for (i = 0; i < t->nlanes && t->priv != NULL; i++)
		if (t->lanes[i].in_flight)
		{
			RelayAcks  *rl = RMQ_LANE(&t->lanes[i]);

			relay_acks_give_up(rl, kind, error);
			rmq_lane_check(&t->lanes[i], finished);
		}
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
		rmq_lane_check(lane, finished);
		if (t->priv == NULL || rt->conn == NULL)
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

/* Take every frame rabbitmq-c has or can read without waiting. */
static void
rmq_read(RelayTarget *t, RelayFinishedFn finished)
{
	RelayRmqTarget *rt = RMQ_TARGET(t);
	char		error[RELAY_MAX_ERROR_LEN + 1];
	int			n;
	amqp_channel_t last_channel = 0;

	rt->more = false;
	for (n = 0; rt->conn != NULL; n++)
	{
		amqp_frame_t f;
		struct timeval zero = {0, 0};
		int			rc;

		/* a bounded turn; the rest is taken at the next (rt->more) */
		if (n == RMQ_MAX_FRAMES)
		{
			rt->more = true;
			break;
		}
		/* nothing of a frame is kept once it is handled */
		if (n > 0)
			amqp_maybe_release_buffers_on_channel(rt->conn, last_channel);
		rc = amqp_simple_wait_frame_noblock(rt->conn, &f, &zero);
		last_channel = f.channel;

		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK)
		{
			snprintf(error, sizeof(error), "the connection to RabbitMQ at %s was lost: %s",
					 rt->peer, amqp_error_string2(rc));
			rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
			return;
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
						 rt->peer);
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

					rt->blocked = true;
					snprintf(rt->blocked_why, sizeof(rt->blocked_why),
							 "RabbitMQ blocked publishing: %.*s",
							 (int) Min(b->reason.len, 80), (char *) b->reason.bytes);
					break;
				}
			case AMQP_CONNECTION_UNBLOCKED_METHOD:
				rt->blocked = false;
				break;
			case AMQP_CHANNEL_CLOSE_METHOD:
			case AMQP_CONNECTION_CLOSE_METHOD:
				{
					amqp_rpc_reply_t r;
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
					memset(&r, 0, sizeof(r));
					r.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
					r.reply = f.payload.method;
					rmq_reply_text(r, "RabbitMQ", error, sizeof(error));
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
		if (t->priv == NULL || rt->conn == NULL)
			return;
	}
	if (rt->conn != NULL)
		amqp_maybe_release_buffers(rt->conn);
}

static RelayTarget *
rmq_target_of(uint64 serial)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_RABBITMQ && t->priv != NULL && RMQ_TARGET(t)->serial == serial &&
			RMQ_TARGET(t)->conn != NULL)
			return t;
	}
	return NULL;
}

/*
 * Take what the sockets have (confirms, returns, closes) and write what
 * waits; then end connections that broke or that other settings made
 * stale, and requests past their time.
 */
static void
relay_rabbitmq_drive(RelayFinishedFn finished)
{
	struct epoll_event evs[64];
	int			n;
	int			i;
	ListCell   *lc;
	TimestampTz now = 0;

	if (epoll_fd < 0)
		return;
	n = epoll_wait(epoll_fd, evs, lengthof(evs), 0);
	for (i = 0; i < n; i++)
	{
		RelayTarget *t = rmq_target_of(evs[i].data.u64);

		if (t != NULL && (evs[i].events & EPOLLOUT))
			rmq_flush(RMQ_TARGET(t));
	}
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		RelayRmqTarget *rt;
		char		error[RELAY_MAX_ERROR_LEN + 1];

		if (t->kind != RELAY_RABBITMQ || t->priv == NULL)
			continue;
		rt = RMQ_TARGET(t);
		/*
		 * Every connection, each turn: frames rabbitmq-c read ahead wait in
		 * its buffer, where epoll does not see them.
		 */
		if (rt->conn != NULL)
			rmq_read(t, finished);
		if (t->priv == NULL || rt->conn == NULL)
			continue;
		if (rt->broken)
		{
			strlcpy(error, rt->broken_why, sizeof(error));
			rmq_fail(t, RELAY_RECEIVER_FAILED, error, 0, finished);
			continue;
		}
		if (rt->in_flight == 0)
			continue;
		if (strcmp(rt->url, t->url) != 0 || rt->destinations != outbox_destinations_generation)
		{
			rmq_fail(t, RELAY_RETRY,
					 "the url or the destination rules changed: the connection is made anew", 0, finished);
			continue;
		}
		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];

			if (!lane->in_flight)
				continue;
			if (now == 0)
				now = GetCurrentTimestamp();
			if (now >= RMQ_LANE(lane)->deadline)
			{
				snprintf(error, sizeof(error), "no confirm from RabbitMQ at %s within %d ms",
						 rt->peer, t->timeout_ms);
				rmq_fail(t, RELAY_RETRY, error, 0, finished);
				break;
			}
		}
	}
}

/* Milliseconds until the earliest request deadline, or -1. */
static long
relay_rabbitmq_timeout(void)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_RABBITMQ && t->priv != NULL && RMQ_TARGET(t)->more)
			return 0;
	}
	return requests_in_flight > 0 ? relay_acks_next_deadline_ms(RELAY_RABBITMQ) : -1;
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
	if (t->format != RELAY_FORMAT_OUTBOX)
		return "a RabbitMQ target cannot send CloudEvents";
	return NULL;
}

const RelayTransport relay_rabbitmq_transport = {
	.kind = "rabbitmq",
	.id = RELAY_RABBITMQ,
	.header_lines = true,
	.per_message = true,
	.check = relay_rabbitmq_check,
	.start = relay_rabbitmq_start,
	.stop = relay_rabbitmq_stop,
	.lane_init = relay_rabbitmq_lane_init,
	.lane_release = relay_rabbitmq_lane_release,
	.send = relay_rabbitmq_send,
	.drive = relay_rabbitmq_drive,
	.timeout = relay_rabbitmq_timeout,
};
