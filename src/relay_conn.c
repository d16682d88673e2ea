/*-------------------------------------------------------------------------
 *
 * relay_conn.c
 *	  The connection layer of the socket transports (Redis, RabbitMQ):
 *	  name lookup, destination rules, connect, TLS, the output buffer.
 *	  A transport file holds only its protocol.
 *
 * Host names are resolved by glibc's getaddrinfo_a() on its own thread,
 * which the relay looks at every few milliseconds while one runs (its
 * notification would run on a thread of glibc's with every signal
 * unblocked); an address needs no lookup.  NATS uses the same lookups
 * (relay_lookup_*).  Each transport's sockets are in an epoll set whose
 * descriptor is in the relay's WaitEventSet.
 * Every address found is checked with outbox.denied_destinations /
 * allowed_destinations and the allowed ones are dialled in turn, each with
 * a non-blocking connect().  A url that asks for TLS then gets a
 * non-blocking handshake (relay_tls.c) before the connection is open.
 * Nothing here waits: each step is taken when epoll says the socket is
 * ready (relay_conn_step()).
 *
 * The transport appends what it sends to conn->out and calls
 * relay_conn_flush(), which writes what the socket takes and asks epoll for
 * writability while bytes wait; a write that fails marks the connection
 * broken, for the transport to see in its drive() (it may be inside a send
 * then).  Reads go through relay_conn_read().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "storage/fd.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* A host name resolved by glibc's thread: malloc'd, glibc writes to it. */
struct RelayLookup
{
	struct gaicb cb;
	struct addrinfo hints;
	struct addrinfo *numeric;	/* an address's result, taken at once */
	int			numeric_rc;		/* and its getaddrinfo() code */
	bool		is_numeric;
	char		name[256];
	char		service[8];
};

/* How often a lookup under way is looked at, in milliseconds. */
#define CONN_LOOKUP_POLL_MS	10

/*---- lookups ----*/

/*
 * Start resolving host:port on glibc's resolver thread; the caller looks
 * at relay_lookup_running() until it has ended (no notification: glibc
 * would run it on a thread of its own with every signal unblocked, where
 * PostgreSQL's handlers must never run).  An address is taken at once, on
 * this thread.  Returns NULL with error when it cannot be started.
 */
RelayLookup *
relay_lookup_start(const char *host, int port, char *error, size_t size)
{
	RelayLookup *l = calloc(1, sizeof(RelayLookup));
	unsigned char addr[16];
	struct gaicb *list[1];
	struct sigevent sev;
	sigset_t	all;
	sigset_t	old;
	int			rc;

	if (l == NULL)
	{
		snprintf(error, size, "out of memory");
		return NULL;
	}
	strlcpy(l->name, host, sizeof(l->name));
	snprintf(l->service, sizeof(l->service), "%d", port);
	l->hints.ai_family = AF_UNSPEC;
	l->hints.ai_socktype = SOCK_STREAM;
	if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1)
	{
		l->is_numeric = true;
		l->hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
		l->numeric_rc = getaddrinfo(l->name, l->service, &l->hints, &l->numeric);
		return l;
	}
	l->cb.ar_name = l->name;
	l->cb.ar_service = l->service;
	l->cb.ar_request = &l->hints;
	list[0] = &l->cb;
	memset(&sev, 0, sizeof(sev));
	sev.sigev_notify = SIGEV_NONE;
	/* glibc's resolver threads must not take PostgreSQL's signals */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = getaddrinfo_a(GAI_NOWAIT, list, 1, &sev);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
	{
		free(l);
		snprintf(error, size, "could not resolve \"%s\": %s", host, gai_strerror(rc));
		return NULL;
	}
	return l;
}

/* Whether the lookup is still under way. */
bool
relay_lookup_running(RelayLookup *l)
{
	return !l->is_numeric && gai_error(&l->cb) == EAI_INPROGRESS;
}

/*
 * Once ended: the addresses the destination rules allow, at most max of
 * them, into addrs and lens.  Returns how many, with error saying why
 * when none.
 */
int
relay_lookup_allowed(RelayLookup *l, struct sockaddr_storage *addrs, socklen_t *lens, int max,
					 char *error, size_t size)
{
	int			rc = l->is_numeric ? l->numeric_rc : gai_error(&l->cb);
	struct addrinfo *ai;
	const char *refused = NULL;
	int			n = 0;

	Assert(!relay_lookup_running(l));
	if (rc != 0)
	{
		snprintf(error, size, l->is_numeric ? "\"%s\" is not an address: %s" :
				 "could not resolve \"%s\": %s", l->name, gai_strerror(rc));
		return 0;
	}
	for (ai = l->is_numeric ? l->numeric : l->cb.ar_result; ai != NULL && n < max; ai = ai->ai_next)
	{
		const void *addr;

		if (ai->ai_family == AF_INET && ai->ai_addrlen == sizeof(struct sockaddr_in))
			addr = &((struct sockaddr_in *) ai->ai_addr)->sin_addr;
		else if (ai->ai_family == AF_INET6 && ai->ai_addrlen == sizeof(struct sockaddr_in6))
			addr = &((struct sockaddr_in6 *) ai->ai_addr)->sin6_addr;
		else
			continue;
		if ((refused = outbox_destination_refused(ai->ai_family, addr, l->name)) != NULL)
			continue;
		memcpy(&addrs[n], ai->ai_addr, ai->ai_addrlen);
		lens[n++] = ai->ai_addrlen;
	}
	if (n == 0)
	{
		if (refused != NULL)
			snprintf(error, size, "connection refused by the relay: %s", refused);
		else
			snprintf(error, size, "\"%s\" has no IPv4 or IPv6 address", l->name);
	}
	return n;
}

/* Drop a lookup; one still running is left to glibc (a small leak). */
void
relay_lookup_forget(RelayLookup *l)
{
	if (l == NULL)
		return;
	if (l->is_numeric)
	{
		if (l->numeric)
			freeaddrinfo(l->numeric);
		free(l);
		return;
	}
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

/* An address as "a.b.c.d:port" or "[v6]:port". */
void
relay_sockaddr_text(const struct sockaddr *sa, char *out, size_t size)
{
	char		text[INET6_ADDRSTRLEN];

	if (sa->sa_family == AF_INET)
		snprintf(out, size, "%s:%d",
				 inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, text, sizeof(text)),
				 ntohs(((const struct sockaddr_in *) sa)->sin_port));
	else
		snprintf(out, size, "[%s]:%d",
				 inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, text, sizeof(text)),
				 ntohs(((const struct sockaddr_in6 *) sa)->sin6_port));
}

/*---- a transport's set of connections ----*/

/* A transport's epoll set; its descriptor, for the loop. */
int
relay_conn_set_start(RelayConnSet *s)
{
	s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (s->epoll_fd < 0)
		elog(ERROR, "outbox: could not create an epoll set: %m");
	ReserveExternalFD();
	if (s->next_serial == 0)
		s->next_serial = 1;
	return s->epoll_fd;
}

void
relay_conn_set_stop(RelayConnSet *s)
{
	if (s->epoll_fd >= 0)
	{
		close(s->epoll_fd);
		ReleaseExternalFD();
		s->epoll_fd = -1;
	}
}

/*---- one connection ----*/

void
relay_conn_init(RelayConn *c, RelayConnSet *set, const char *what, const char *tls_scheme,
				MemoryContext cxt)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(cxt);

	memset(c, 0, sizeof(*c));
	c->set = set;
	c->what = what;
	c->tls_scheme = tls_scheme;
	c->fd = -1;
	c->cxt = cxt;
	initStringInfo(&c->out);
	MemoryContextSwitchTo(oldcxt);
}

/* Ask epoll for what the connection waits for. */
static void
conn_register(RelayConn *c, bool want_write)
{
	struct epoll_event ev;

	if (c->fd < 0 || (c->registered && c->want_write == want_write))
		return;
	ev.events = EPOLLIN | (want_write ? EPOLLOUT : 0);
	ev.data.u64 = c->serial;
	if (epoll_ctl(c->set->epoll_fd, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) == 0)
	{
		c->registered = true;
		c->want_write = want_write;
	}
}

/* Close the socket and its TLS session (the output stays). */
static void
conn_close_socket(RelayConn *c)
{
	relay_tls_free(c->ssl);
	c->ssl = NULL;
	if (c->fd < 0)
		return;
	if (c->registered)
		(void) epoll_ctl(c->set->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	ReleaseExternalFD();
	c->fd = -1;
	c->registered = false;
	c->want_write = false;
}

/* Close the connection; what it carried is forgotten. */
void
relay_conn_close(RelayConn *c)
{
	relay_lookup_forget(c->lookup);
	c->lookup = NULL;
	conn_close_socket(c);
	c->naddrs = 0;
	c->next_addr = 0;
	relay_buffer_reset(&c->out, c->cxt, 1024 * 1024);
	c->out_off = 0;
	c->broken = false;
	c->got_bytes = false;
	c->tls_read_wants_write = false;
	c->tls_write_wants_read = false;
	c->state = RELAY_CONN_NONE;
}

/*
 * Empty buf; one that grew above keep bytes is given back and made anew
 * in cxt (a large message must not pin its size for good).
 */
void
relay_buffer_reset(StringInfo buf, MemoryContext cxt, int keep)
{
	if (buf->maxlen > keep)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(cxt);

		pfree(buf->data);
		initStringInfo(buf);
		MemoryContextSwitchTo(oldcxt);
	}
	resetStringInfo(buf);
}

static bool
same_path(const char *a, const char *b)
{
	return (a == NULL) == (b == NULL) && (a == NULL || strcmp(a, b) == 0);
}

/* Whether the target's url asks for TLS (it starts with the TLS scheme). */
static bool
conn_wants_tls(RelayConn *c, RelayTarget *t)
{
	return c->tls_scheme != NULL && t->url != NULL &&
		strncmp(t->url, c->tls_scheme, strlen(c->tls_scheme)) == 0;
}

/*
 * Whether the connection was made for other settings than the target's
 * now: its url, TLS files or the destination rules changed.
 */
bool
relay_conn_stale(RelayConn *c, RelayTarget *t)
{
	return c->url == NULL || t->url == NULL || strcmp(c->url, t->url) != 0 ||
		c->destinations != outbox_destinations_generation ||
		c->tls.on != conn_wants_tls(c, t) || !same_path(c->tls.ca_file, t->ca_file) ||
		!same_path(c->tls.client_cert, t->client_cert) ||
		!same_path(c->tls.client_key, t->client_key);
}

/*
 * The start of a send() of a transport on this layer: a connection made
 * for other settings, or broken with nothing on it, is closed
 * (tr->conn_close) to be made anew; false, with *failed, while requests of
 * other lanes are on such a one (relay_conn_drive() ends them first).
 * Then the connection is started when there is none (tr->conn_connect;
 * false, with *failed, when it cannot be), and the lane's acknowledgements
 * (its priv) are begun for its next cut_n messages.
 */
bool
relay_conn_send_begin(const RelayTransport *tr, RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayConn  *c = RELAY_CONN(t);

	Assert(!lane->in_flight && lane->nqueued > 0);
	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", lane->head->topic);
	if (c->state == RELAY_CONN_NONE)
		 /* made below */ ;
	else if (relay_conn_stale(c, t))
	{
		if (relay_target_in_flight(t) > 0)
		{
			failed->kind = RELAY_RETRY;
			failed->error = "the url, the TLS files or the destination rules changed: the connection is made anew";
			return false;
		}
		tr->conn_close(t);
	}
	else if (c->broken && relay_target_in_flight(t) == 0)
		tr->conn_close(t);
	if (!tr->conn_connect(t))
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = c->error;
		return false;
	}
	relay_acks_begin((RelayAcks *) lane->priv, lane->cut_n, t->cxt);
	lane->nbatch = lane->cut_n;
	return true;
}

/*
 * The end of a send(): the request is in flight, its deadline set and its
 * bytes on their way; or, when it was tried (not left to wait for the
 * connection) and not one message could be sent, false with *failed.
 */
bool
relay_conn_send_end(RelayLane *lane, bool tried, RelayOutcome *failed)
{
	RelayAcks  *a = (RelayAcks *) lane->priv;
	RelayTarget *t = lane->target;

	if (tried && a->nsent == 0)
	{
		failed->kind = a->bad_kind;
		failed->error = a->bad_error;
		return false;
	}
	a->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), t->timeout_ms);
	lane->in_flight = true;
	relay_conn_flush(RELAY_CONN(t));
	return true;
}

/*
 * A transport's stop(): the connections of its targets closed
 * (tr->conn_close), and its epoll set.
 */
void
relay_conn_stop(const RelayTransport *tr)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->transport == tr && t->priv != NULL)
			tr->conn_close(t);
	}
	relay_conn_set_stop(tr->conn_set);
}

/* The target's url, rules and TLS settings, for the next connection. */
static void
conn_take_settings(RelayConn *c, RelayTarget *t)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(c->cxt);

	if (c->url)
		pfree(c->url);
	c->url = pstrdup(t->url);
	c->destinations = outbox_destinations_generation;
	if (c->tls.ca_file)
		pfree((char *) c->tls.ca_file);
	if (c->tls.client_cert)
		pfree((char *) c->tls.client_cert);
	if (c->tls.client_key)
		pfree((char *) c->tls.client_key);
	memset(&c->tls, 0, sizeof(c->tls));
	c->tls.on = conn_wants_tls(c, t);
	c->tls.ca_file = t->ca_file ? pstrdup(t->ca_file) : NULL;
	c->tls.client_cert = t->client_cert ? pstrdup(t->client_cert) : NULL;
	c->tls.client_key = t->client_key ? pstrdup(t->client_key) : NULL;
	MemoryContextSwitchTo(oldcxt);
}

/*
 * Dial the next address kept.  Returns false, with c->error, when every
 * one left failed at once (a connect() under way is seen by
 * relay_conn_step()).
 */
static bool
conn_dial_next(RelayConn *c)
{
	while (c->next_addr < c->naddrs)
	{
		struct sockaddr *sa = (struct sockaddr *) &c->addrs[c->next_addr];
		socklen_t	salen = c->addr_lens[c->next_addr];
		int			fd;
		int			one = 1;

		c->next_addr++;
		relay_sockaddr_text(sa, c->peer, sizeof(c->peer));
		if (!AcquireExternalFD())
		{
			snprintf(c->error, sizeof(c->error), "could not connect to %s at %s: no file descriptor is free",
					 c->what, c->peer);
			return false;
		}
		fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
		{
			ReleaseExternalFD();
			snprintf(c->error, sizeof(c->error), "could not connect to %s at %s: %s",
					 c->what, c->peer, strerror(errno));
			continue;
		}
		(void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (connect(fd, sa, salen) != 0 && errno != EINPROGRESS)
		{
			snprintf(c->error, sizeof(c->error), "could not connect to %s at %s: %s",
					 c->what, c->peer, strerror(errno));
			close(fd);
			ReleaseExternalFD();
			continue;
		}
		c->fd = fd;
		c->registered = false;
		c->serial = c->set->next_serial++;
		conn_register(c, true);
		if (!c->registered)
		{
			snprintf(c->error, sizeof(c->error), "could not wait for %s at %s: %s",
					 c->what, c->peer, strerror(errno));
			close(fd);
			ReleaseExternalFD();
			c->fd = -1;
			return false;
		}
		c->state = RELAY_CONN_CONNECTING;
		return true;
	}
	return false;
}

/* The lookup ended: keep the allowed addresses and dial the first. */
static bool
conn_resolved(RelayConn *c)
{
	c->naddrs = relay_lookup_allowed(c->lookup, c->addrs, c->addr_lens, RELAY_CONN_MAX_ADDRS,
									 c->error, sizeof(c->error));
	c->next_addr = 0;
	/*
	 * Each connection starts at another of the addresses: one that drops
	 * what is sent to it (a connect that only times out) is not tried
	 * first every time.
	 */
	if (c->naddrs > 1)
	{
		int			k = (int) (c->attempts++ % (uint64) c->naddrs);
		struct sockaddr_storage addrs[RELAY_CONN_MAX_ADDRS];
		socklen_t	lens[RELAY_CONN_MAX_ADDRS];
		int			i;

		memcpy(addrs, c->addrs, sizeof(addrs));
		memcpy(lens, c->addr_lens, sizeof(lens));
		for (i = 0; i < c->naddrs; i++)
		{
			c->addrs[i] = addrs[(i + k) % c->naddrs];
			c->addr_lens[i] = lens[(i + k) % c->naddrs];
		}
	}
	relay_lookup_forget(c->lookup);
	c->lookup = NULL;
	c->state = RELAY_CONN_NONE;
	return c->naddrs > 0 && conn_dial_next(c);
}

/*
 * Start making a connection to host:port for target t (with TLS when its
 * url starts with the TLS scheme, and its files): a lookup, or a connect()
 * under way.  Returns false, with c->error, when it cannot be started.
 * What the transport queued in c->out waits until it is open.
 */
bool
relay_conn_open(RelayConn *c, RelayTarget *t, const char *host, int port)
{
	Assert(c->state == RELAY_CONN_NONE);
	conn_take_settings(c, t);
	strlcpy(c->host, host, sizeof(c->host));
	snprintf(c->peer, sizeof(c->peer), "%s:%d", host, port);
	c->lookup = relay_lookup_start(host, port, c->error, sizeof(c->error));
	if (c->lookup == NULL)
		return false;
	c->state = RELAY_CONN_RESOLVING;
	if (relay_lookup_running(c->lookup))
		return true;
	return conn_resolved(c);
}

/* The TLS handshake, going on. */
static RelayConnStep
conn_tls_step(RelayConn *c)
{
	bool		want_write = false;
	int			rc = relay_tls_handshake(c->ssl, c->peer, &want_write, c->error, sizeof(c->error));

	if (rc < 0)
		return RELAY_CONN_FAILED;
	if (rc == 0)
	{
		conn_register(c, want_write);
		return RELAY_CONN_WAIT;
	}
	c->state = RELAY_CONN_OPEN;
	conn_register(c, c->out_off < c->out.len);
	return RELAY_CONN_OPENED;
}

/*
 * Take the connection a step on: after epoll's events of it, or with no
 * events after the set's wake pipe (a lookup may have ended).  Returns
 * RELAY_CONN_OPENED once it has become open (the caller flushes what it
 * queued), RELAY_CONN_READY while open (the caller reads and writes),
 * RELAY_CONN_WAIT while it is being made, RELAY_CONN_FAILED with c->error
 * (the connection is closed: every address failed).
 */
RelayConnStep
relay_conn_step(RelayConn *c, uint32 events)
{
	switch (c->state)
	{
		case RELAY_CONN_NONE:
			return RELAY_CONN_WAIT;
		case RELAY_CONN_RESOLVING:
			if (relay_lookup_running(c->lookup))
				return RELAY_CONN_WAIT;
			if (!conn_resolved(c))
			{
				relay_conn_close(c);
				return RELAY_CONN_FAILED;
			}
			return RELAY_CONN_WAIT;
		case RELAY_CONN_CONNECTING:
			{
				int			err = 0;
				socklen_t	len = sizeof(err);

				if (events == 0)
					return RELAY_CONN_WAIT;
				if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
					err = errno;
				if (err == EINPROGRESS || err == EALREADY)
					return RELAY_CONN_WAIT;
				if (err != 0)
				{
					snprintf(c->error, sizeof(c->error), "could not connect to %s at %s: %s",
							 c->what, c->peer, strerror(err));
					conn_close_socket(c);
					c->state = RELAY_CONN_NONE;
					/* the next address, or the last one's failure */
					if (conn_dial_next(c))
						return RELAY_CONN_WAIT;
					relay_conn_close(c);
					return RELAY_CONN_FAILED;
				}
				if (!c->tls.on)
				{
					c->state = RELAY_CONN_OPEN;
					conn_register(c, c->out_off < c->out.len);
					return RELAY_CONN_OPENED;
				}
				c->ssl = relay_tls_new(c->fd, c->host, &c->tls, c->error, sizeof(c->error));
				if (c->ssl == NULL)
				{
					relay_conn_close(c);
					return RELAY_CONN_FAILED;
				}
				c->state = RELAY_CONN_TLS;
				if (conn_tls_step(c) == RELAY_CONN_FAILED)
				{
					relay_conn_close(c);
					return RELAY_CONN_FAILED;
				}
				return c->state == RELAY_CONN_OPEN ? RELAY_CONN_OPENED : RELAY_CONN_WAIT;
			}
		case RELAY_CONN_TLS:
			if (events == 0)
				return RELAY_CONN_WAIT;
			switch (conn_tls_step(c))
			{
				case RELAY_CONN_FAILED:
					relay_conn_close(c);
					return RELAY_CONN_FAILED;
				case RELAY_CONN_OPENED:
					return RELAY_CONN_OPENED;
				default:
					return RELAY_CONN_WAIT;
			}
		case RELAY_CONN_OPEN:
			return RELAY_CONN_READY;
	}
	return RELAY_CONN_WAIT;
}

/*
 * "The connection was lost" for an error; before the server has answered
 * anything on a connection without TLS, with a hint that it may want TLS
 * (a TLS server resets or closes what it cannot read as TLS).
 */
static void
conn_lost_text(RelayConn *c, const char *why, char *out, size_t size)
{
	if (!c->got_bytes && !c->tls.on && c->tls_scheme != NULL)
		snprintf(out, size, "the connection to %s at %s was lost before it answered: %s (does the server want TLS? its url would start with %s)",
				 c->what, c->peer, why, c->tls_scheme);
	else
		snprintf(out, size, "the connection to %s at %s was lost: %s", c->what, c->peer, why);
}

/*
 * Read up to len bytes: > 0 read, 0 nothing now, -1 the connection is lost
 * (c->error says why; the caller fails it).
 */
int
relay_conn_read(RelayConn *c, char *buf, int len)
{
	int			n;

	Assert(c->state == RELAY_CONN_OPEN);
	if (c->ssl != NULL)
	{
		bool		want_write = false;
		char		why[RELAY_MAX_ERROR_LEN + 1];

		n = relay_tls_read(c->ssl, buf, len, c->peer, &want_write, why, sizeof(why));
		if (n < 0)
		{
			snprintf(c->error, sizeof(c->error), "the connection to %s at %s was lost: %s",
					 c->what, c->peer, why);
			return -1;
		}
		if (c->tls_read_wants_write != want_write)
		{
			c->tls_read_wants_write = want_write;
			conn_register(c, want_write || c->out_off < c->out.len);
		}
		if (n > 0)
			c->got_bytes = true;
		/* a write that waited for a read may go on now (a read that took
		 * only handshake records returns 0 and may have let it) */
		if (c->tls_write_wants_read)
			relay_conn_flush(c);
		return n;
	}
	for (;;)
	{
		n = recv(c->fd, buf, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n > 0)
		{
			c->got_bytes = true;
			return n;
		}
		conn_lost_text(c, n == 0 ? "closed by the server" : strerror(errno), c->error, sizeof(c->error));
		return -1;
	}
}

/*---- drive() and timeout() of the transports on this layer ----*/

/* The target of kind whose connection epoll names serial, or NULL. */
static RelayTarget *
conn_target_of(const RelayTransport *tr, uint64 serial)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == tr->id && t->priv != NULL && RELAY_CONN(t)->serial == serial &&
			RELAY_CONN(t)->fd >= 0)
			return t;
	}
	return NULL;
}

/* The target's connection taken a step on (its events, or 0 after a wake-up). */
static void
conn_event(const RelayTransport *tr, RelayTarget *t, uint32 events, RelayFinishedFn finished)
{
	RelayConn  *c = RELAY_CONN(t);
	char		error[RELAY_MAX_ERROR_LEN + 1];

	switch (relay_conn_step(c, events))
	{
		case RELAY_CONN_WAIT:
			return;
		case RELAY_CONN_FAILED:
			strlcpy(error, c->error, sizeof(error));
			tr->conn_fail(t, RELAY_RECEIVER_FAILED, error, finished);
			return;
		case RELAY_CONN_OPENED:
			/* what the transport queued goes */
			relay_conn_flush(c);
			return;
		case RELAY_CONN_READY:
			break;
	}
	/* (a TLS read that waited for the socket to be writable goes on too) */
	if ((events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ||
		((events & EPOLLOUT) && c->tls_read_wants_write))
		tr->conn_read(t, finished);
	if (t->priv != NULL && c->state == RELAY_CONN_OPEN && (events & EPOLLOUT))
		relay_conn_flush(c);
}

/*
 * A transport's drive(): take what the sockets have (connections made,
 * replies, writes possible), then lookups ended, bytes TLS decrypted
 * already, connections broken or made for other settings, and requests
 * past their time.
 */
void
relay_conn_drive(const RelayTransport *tr, RelayFinishedFn finished)
{
	struct epoll_event evs[64];
	int			n;
	int			i;
	ListCell   *lc;
	TimestampTz now = 0;

	n = tr->conn_set->epoll_fd >= 0 ?
		epoll_wait(tr->conn_set->epoll_fd, evs, lengthof(evs), 0) : 0;
	for (i = 0; i < n; i++)
	{
		RelayTarget *t = conn_target_of(tr, evs[i].data.u64);

		if (t != NULL)
			conn_event(tr, t, evs[i].events, finished);
	}
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		RelayConn  *c;
		char		error[RELAY_MAX_ERROR_LEN + 1];

		if (t->kind != tr->id || t->priv == NULL)
			continue;
		c = RELAY_CONN(t);
		if (c->state == RELAY_CONN_RESOLVING)
			conn_event(tr, t, 0, finished);
		/* what epoll does not see: TLS's bytes, the transport's own */
		if (t->priv != NULL && c->state == RELAY_CONN_OPEN &&
			(relay_tls_pending(c->ssl) || (tr->conn_more != NULL && tr->conn_more(t))))
			tr->conn_read(t, finished);
		if (t->priv == NULL || c->state == RELAY_CONN_NONE)
			continue;
		if (c->broken)
		{
			strlcpy(error, c->broken_why, sizeof(error));
			tr->conn_fail(t, RELAY_RECEIVER_FAILED, error, finished);
			continue;
		}
		if (relay_target_in_flight(t) == 0)
			continue;
		if (relay_conn_stale(c, t))
		{
			tr->conn_fail(t, RELAY_RETRY,
					  "the url, the TLS files or the destination rules changed: the connection is made anew",
					  finished);
			continue;
		}
		/* a request past its time gives the connection up */
		for (i = 0; i < t->nlanes; i++)
		{
			RelayLane  *lane = &t->lanes[i];
			RelayOutcomeKind kind;

			if (!lane->in_flight)
				continue;
			if (now == 0)
				now = GetCurrentTimestamp();
			if (now < ((RelayAcks *) lane->priv)->deadline)
				continue;
			kind = tr->conn_expired(t, error, sizeof(error));
			tr->conn_fail(t, kind, error, finished);
			break;
		}
	}
}

/*
 * A transport's timeout(): 0 when bytes wait that epoll does not see (or a
 * connection broke), a short while when a lookup is under way, else the
 * milliseconds until the earliest request deadline, or -1.
 */
long
relay_conn_next_ms(const RelayTransport *tr)
{
	ListCell   *lc;
	bool		resolving = false;
	long		ms;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		RelayConn  *c;

		if (t->kind != tr->id || t->priv == NULL)
			continue;
		c = RELAY_CONN(t);
		if (c->broken || (c->state == RELAY_CONN_OPEN &&
						  (relay_tls_pending(c->ssl) || (tr->conn_more != NULL && tr->conn_more(t)))))
			return 0;
		if (c->state == RELAY_CONN_RESOLVING)
			resolving = true;
	}
	ms = relay_acks_next_deadline_ms(tr->id);
	if (resolving && (ms < 0 || ms > CONN_LOOKUP_POLL_MS))
		ms = CONN_LOOKUP_POLL_MS;
	return ms;
}

/*
 * Why a connection has not become open, or its first reply has not come,
 * within ms milliseconds, for last_error.
 */
void
relay_conn_timeout_text(RelayConn *c, int ms, char *out, size_t size)
{
	switch (c->state)
	{
		case RELAY_CONN_RESOLVING:
			snprintf(out, size, "could not resolve %s's host \"%s\" within %d ms", c->what, c->host, ms);
			break;
		case RELAY_CONN_CONNECTING:
			snprintf(out, size, "could not connect to %s at %s within %d ms", c->what, c->peer, ms);
			break;
		case RELAY_CONN_TLS:
			snprintf(out, size, "the TLS handshake with %s at %s did not end within %d ms%s", c->what, c->peer, ms,
					 c->got_bytes ? "" : " (does the server speak TLS on this port? a plaintext server needs a url without TLS)");
			break;
		default:
			snprintf(out, size, "no reply from %s at %s within %d ms%s%s%s", c->what, c->peer, ms,
					 c->got_bytes || c->tls.on || c->tls_scheme == NULL ? "" : " (does the server want TLS? its url would start with ",
					 c->got_bytes || c->tls.on || c->tls_scheme == NULL ? "" : c->tls_scheme,
					 c->got_bytes || c->tls.on || c->tls_scheme == NULL ? "" : ")");
			break;
	}
}

/*
 * Write what the socket takes now; a failure marks the connection broken
 * (c->broken_why), for the transport's drive().
 */
void
relay_conn_flush(RelayConn *c)
{
	while (c->state == RELAY_CONN_OPEN && !c->broken && c->out_off < c->out.len)
	{
		ssize_t		n;

		if (c->ssl != NULL)
		{
			bool		want_read = false;
			char		why[RELAY_MAX_ERROR_LEN + 1];

			n = relay_tls_write(c->ssl, c->out.data + c->out_off,
								Min(c->out.len - c->out_off, 1024 * 1024), c->peer,
								&want_read, why, sizeof(why));
			c->tls_write_wants_read = want_read;
			if (n > 0)
				c->out_off += n;
			else if (n == 0)
				break;
			else
			{
				c->broken = true;
				snprintf(c->broken_why, sizeof(c->broken_why),
						 "the connection to %s at %s was lost: %s", c->what, c->peer, why);
				break;
			}
			continue;
		}
		n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0)
			c->out_off += n;
		else if (n < 0 && errno == EINTR)
			continue;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		else
		{
			c->broken = true;
			conn_lost_text(c, n == 0 ? "closed" : strerror(errno), c->broken_why, sizeof(c->broken_why));
			break;
		}
	}
	if (c->out_off >= c->out.len)
	{
		/* All written: the buffer starts again (a large one given back). */
		relay_buffer_reset(&c->out, c->cxt, 4 * 1024 * 1024);
		c->out_off = 0;
	}
	else if (c->out_off > 1024 * 1024 && c->out_off > c->out.len / 2)
	{
		/*
		 * What was written leaves the front, so a buffer that never empties
		 * (lanes adding requests while the socket is full) does not grow
		 * without end; TLS takes a moved buffer
		 * (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER) of the same unsent bytes.
		 */
		memmove(c->out.data, c->out.data + c->out_off, c->out.len - c->out_off);
		c->out.len -= c->out_off;
		c->out.data[c->out.len] = '\0';
		c->out_off = 0;
	}
	if (c->state == RELAY_CONN_OPEN)
		conn_register(c, (c->out_off < c->out.len && !c->tls_write_wants_read) ||
					  c->tls_read_wants_write);
}
