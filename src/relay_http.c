/*-------------------------------------------------------------------------
 *
 * relay_http.c
 *	  HTTP delivery with libcurl's multi interface.  All libcurl use is here.
 *
 * Each HTTP lane owns one easy handle, reused for every request, so
 * connections are kept alive and reused through the multi handle's pool.
 * libcurl tells us which sockets to watch through its socket callback; we
 * keep them in a private epoll set whose own descriptor is one event of the
 * worker's WaitEventSet, next to the latch and postmaster death.  So the
 * worker sleeps in one place, stays responsive to signals, and never blocks
 * on the network.  libcurl's timer callback gives the longest it may sleep.
 *
 * Rules kept here: curl_global_init in the worker only; CURLOPT_NOSIGNAL;
 * no redirects; http and https only; every timeout set; sockets counted
 * with AcquireExternalFD; no ereport(ERROR) inside libcurl callbacks.
 *
 * Requests follow the Standard Webhooks spec: webhook-id (the message's
 * stable id, or for a batch an id derived from its first and last
 * sequence numbers), webhook-timestamp and, when the target has a secret,
 * webhook-signature = "v1," base64(HMAC-SHA256(key, id "." timestamp "."
 * body)).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/base64.h"
#include "common/cryptohash.h"
#include "common/hmac.h"
#include "common/sha2.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Bytes of a response body kept for last_error. */
#define RELAY_ERROR_KEEP	200

/* libcurl state of one HTTP lane (RelayLane.priv). */
typedef struct RelayHttpLane
{
	CURL	   *easy;			/* reused for every request of the lane */
	StringInfoData body;		/* body of a batch request in flight */

	/*
	 * Headers of the request in flight: the lines, NUL-separated, in hdr;
	 * their offsets in hoff; and a curl_slist linking them, in nodes.  All
	 * are reused from request to request, so that building the headers
	 * allocates nothing once they have grown to size.
	 */
	StringInfoData hdr;
	int		   *hoff;
	struct curl_slist *nodes;
	int			nlines;			/* lines in hdr */
	int			maxlines;		/* entries allocated in hoff and nodes */
	char		errbuf[CURL_ERROR_SIZE];	/* libcurl's error text */
	char		response[RELAY_ERROR_KEEP + 1]; /* start of the response body */
	int			response_len;	/* bytes in response */
	Size		body_bytes;		/* bytes of response body received */
	Size		header_bytes;	/* bytes of response headers received */
	bool		body_capped;	/* stopped reading at RELAY_MAX_RESPONSE_BODY */
	bool		headers_capped; /* gave up at RELAY_MAX_RESPONSE_HEADERS */
	char		refused[512];	/* why a connect was refused, or "" */
	bool		opened;			/* a connection was opened since */
	int			options_version;	/* the target's options set on easy */
	StringInfoData sig;			/* webhook-signature of the request */
	bool		reads_answer;	/* a kind that reads answers
								 * (RelayTransport.http_answer) */
	char	   *answer;			/* its body, up to RELAY_MAX_ANSWER bytes:
								 * malloc'd (grown in relay_write_cb,
								 * which must not raise errors), or NULL */
	int			answer_len;		/* bytes in answer */
	int			answer_cap;		/* bytes allocated */
	uint32		auth_generation;	/* of the token the request carries */
	bool		has_auth;		/* it carries one (relay_auth.c) */
	bool		auth_heavy;		/* which is most of its header bytes */
} RelayHttpLane;

#define HTTP(lane)	((RelayHttpLane *) (lane)->priv)

static void relay_header(RelayHttpLane *h, const char *line);
static void relay_easy_common(CURL *easy);
static bool relay_fetch_finish(CURL *easy, CURLcode result);
static void relay_printable_copy(char *dst, size_t size, const char *src);

/*
 * What is read of a response: the body up to RELAY_MAX_RESPONSE_BODY bytes
 * (then the connection is closed, and the status decides), the headers up
 * to RELAY_MAX_RESPONSE_HEADERS; of the body only the first
 * RELAY_ERROR_KEEP bytes are kept, for last_error, as printable ASCII.
 */
#define RELAY_MAX_RESPONSE_BODY		(64 * 1024)
/* The same for a kind that reads answers (500 records' answers from Kinesis). */
#define RELAY_MAX_ANSWER			(512 * 1024)
#define RELAY_MAX_RESPONSE_HEADERS	(64 * 1024)

/* A lane's batch body buffer larger than this is given back after use. */
#define RELAY_BODY_KEEP		(256 * 1024)

static CURLM *multi = NULL;
static int	epoll_fd = -1;
static TimestampTz timer_deadline = 0;	/* libcurl wants a call by then */
static bool timer_set = false;	/* timer_deadline is meaningful */
static uint64 destinations_seen = 0;	/* outbox_destinations_generation */
static char *default_cainfo = NULL; /* libcurl's built-in CA bundle path */
static char *default_capath = NULL; /* and CA directory */

/*
 * What epoll_fd watches for each socket libcurl gave us, indexed by
 * descriptor: the registered events (0: not registered), whether libcurl
 * still wants the socket watched, and whether we opened it (the HTTP
 * connections; libcurl also hands us sockets of its own, such as its
 * resolver's).  A connection that libcurl stops watching (its request
 * finished and it went back to the pool) stays registered, so that the next
 * request on it costs no epoll_ctl calls; if it reports an event while
 * libcurl does not want it, it is removed then.  Our close callback forgets
 * a connection; closing it removed it from epoll_fd.  libcurl's own sockets
 * are closed without that callback, so they are removed from epoll_fd as
 * soon as libcurl stops watching them.
 */
typedef struct RelaySocketState
{
	uint32		registered;		/* EPOLLIN/EPOLLOUT registered, or 0 */
	bool		wanted;			/* libcurl watches it */
	bool		ours;			/* opened by relay_open_socket_cb */
	bool		stale;			/* connected under destination rules that
								 * changed since: not to be used again */
} RelaySocketState;

static RelaySocketState *sockets = NULL;
static int	nsockets = 0;		/* entries allocated in sockets */

static RelaySocketState *
relay_socket_state(curl_socket_t s)
{
	if (s < 0)
		return NULL;
	if (s >= nsockets)
	{
		int			n = Max(64, nsockets);
		RelaySocketState *grown;

		while (n <= s)
			n *= 2;
		/* Plain realloc: this may run inside a libcurl callback. */
		grown = realloc(sockets, n * sizeof(RelaySocketState));
		if (grown == NULL)
			return NULL;
		memset(grown + nsockets, 0, (n - nsockets) * sizeof(RelaySocketState));
		sockets = grown;
		nsockets = n;
	}
	return &sockets[s];
}

/*
 * Register s in epoll_fd for events (0: remove it).  Unless forced, nothing
 * is done when st says it is registered so already.
 */
static void
relay_socket_watch(curl_socket_t s, RelaySocketState *st, uint32 events,
				   bool force)
{
	struct epoll_event ev;
	int			op;

	if (st->registered == events && !force)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.data.fd = s;
	ev.events = events;
	if (events == 0)
		op = EPOLL_CTL_DEL;
	else if (st->registered == 0 && !force)
		op = EPOLL_CTL_ADD;
	else
		op = EPOLL_CTL_MOD;
	if (epoll_ctl(epoll_fd, op, s, &ev) != 0)
	{
		/* Out of step with the kernel: start over with this socket. */
		(void) epoll_ctl(epoll_fd, EPOLL_CTL_DEL, s, NULL);
		if (events != 0 && epoll_ctl(epoll_fd, EPOLL_CTL_ADD, s, &ev) != 0)
			events = 0;
	}
	st->registered = events;
}

/* libcurl's socket callback: what to watch on socket s. */
static int
relay_socket_cb(CURL *easy, curl_socket_t s, int what, void *userp,
				void *socketp)
{
	RelaySocketState *st = relay_socket_state(s);
	uint32		events = 0;

	if (st == NULL)
		return -1;
	if (what == CURL_POLL_REMOVE)
	{
		st->wanted = false;
		/* Keep a connection registered for its next request. */
		if (!st->ours)
			relay_socket_watch(s, st, 0, false);
		else if (st->stale)
			shutdown(s, SHUT_RDWR); /* libcurl finds it dead, opens anew */
		return 0;
	}
	if (what & CURL_POLL_IN)
		events |= EPOLLIN;
	if (what & CURL_POLL_OUT)
		events |= EPOLLOUT;
	st->wanted = true;

	/*
	 * Our state of a socket libcurl opened itself may be stale: it may have
	 * closed an earlier socket of the same number without telling us.
	 */
	relay_socket_watch(s, st, events, !st->ours);
	return 0;
}

/* libcurl's timer callback: when it next wants to be called. */
static int
relay_timer_cb(CURLM *m, long timeout_ms, void *userp)
{
	if (timeout_ms < 0)
		timer_set = false;
	else
	{
		timer_deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 timeout_ms);
		timer_set = true;
	}
	return 0;
}

/*
 * Open the sockets libcurl connects with: refuse an address that
 * outbox.denied_destinations / allowed_destinations do not allow (the
 * address actually dialled, after any DNS lookup), and count the sockets
 * against the server's file descriptor budget.
 */
static curl_socket_t
relay_dial(struct curl_sockaddr *address, const char *host, char *refused,
		   size_t refused_size, bool *opened)
{
	curl_socket_t s;
	const char *why = NULL;

	if (address->family == AF_INET)
		why = outbox_destination_refused(AF_INET,
										 &((struct sockaddr_in *) &address->addr)->sin_addr,
										 host);
	else if (address->family == AF_INET6)
		why = outbox_destination_refused(AF_INET6,
										 &((struct sockaddr_in6 *) &address->addr)->sin6_addr,
										 host);
	else
		why = "not an Internet address";
	if (why != NULL)
	{
		snprintf(refused, refused_size, "connection refused by the relay: %s", why);
		return CURL_SOCKET_BAD;
	}

	if (!AcquireExternalFD())
		return CURL_SOCKET_BAD;
	s = socket(address->family, address->socktype, address->protocol);
	if (s == CURL_SOCKET_BAD)
		ReleaseExternalFD();
	else
	{
		RelaySocketState *st = relay_socket_state(s);

		*opened = true;
		/* A new descriptor is in no epoll set. */
		if (st != NULL)
		{
			st->registered = 0;
			st->wanted = false;
			st->ours = true;
			st->stale = false;
		}
	}
	return s;
}

static curl_socket_t
relay_open_socket_cb(void *clientp, curlsocktype purpose,
					 struct curl_sockaddr *address)
{
	RelayLane  *lane = (RelayLane *) clientp;

	return relay_dial(address, lane->target->host, HTTP(lane)->refused,
					  sizeof(HTTP(lane)->refused), &HTTP(lane)->opened);
}

static int
relay_close_socket_cb(void *clientp, curl_socket_t s)
{
	RelaySocketState *st = relay_socket_state(s);

	/* Closing removes it from epoll_fd. */
	if (st != NULL)
	{
		st->registered = 0;
		st->wanted = false;
		st->ours = false;
		st->stale = false;
	}
	close(s);
	ReleaseExternalFD();
	return 0;
}

/*
 * Keep the start of the response body for error messages, as printable
 * ASCII; drop the rest; stop reading at RELAY_MAX_RESPONSE_BODY.
 */
static size_t
relay_write_cb(char *data, size_t size, size_t nmemb, void *userdata)
{
	RelayHttpLane *h = (RelayHttpLane *) userdata;
	size_t		len = size * nmemb;
	size_t		room = sizeof(h->response) - 1 - h->response_len;

	h->body_bytes += len;
	if (h->reads_answer && h->answer_len < RELAY_MAX_ANSWER)
	{
		size_t		n = Min(len, (size_t) (RELAY_MAX_ANSWER - h->answer_len));

		if (h->answer_len + (int) n + 1 > h->answer_cap)
		{
			int			cap = Min(Max(h->answer_len + (int) n + 1, 2 * h->answer_cap),
								  RELAY_MAX_ANSWER + 1);
			char	   *grown = realloc(h->answer, cap);

			if (grown == NULL)
			{
				h->body_capped = true;	/* read as cut short */
				return 0;
			}
			h->answer = grown;
			h->answer_cap = cap;
		}
		memcpy(h->answer + h->answer_len, data, n);
		h->answer_len += n;
		h->answer[h->answer_len] = '\0';
	}
	if (room > 0)
	{
		size_t		n = Min(room, len);
		size_t		i;

		for (i = 0; i < n; i++)
		{
			unsigned char c = (unsigned char) data[i];

			h->response[h->response_len + i] = (c >= 0x20 && c < 0x7f) ? c : '?';
		}
		h->response_len += n;
		h->response[h->response_len] = '\0';
	}
	if (h->body_bytes > (h->reads_answer ? RELAY_MAX_ANSWER : RELAY_MAX_RESPONSE_BODY))
	{
		/* Returning less than len aborts the transfer and its connection. */
		h->body_capped = true;
		return 0;
	}
	return len;
}

/* Count the response's header bytes; give up past the cap. */
static size_t
relay_header_cb(char *data, size_t size, size_t nmemb, void *userdata)
{
	RelayHttpLane *h = (RelayHttpLane *) userdata;
	size_t		len = size * nmemb;

	h->header_bytes += len;
	if (h->header_bytes > RELAY_MAX_RESPONSE_HEADERS)
	{
		h->headers_capped = true;
		return 0;
	}
	return len;
}

/*
 * Set up libcurl and the epoll set.  Returns the epoll descriptor, which the
 * caller adds to its WaitEventSet as readable.
 */
static int
relay_http_init(void)
{
	CURLcode	rc = curl_global_init(CURL_GLOBAL_DEFAULT);

	if (rc != CURLE_OK)
		elog(ERROR, "outbox: could not initialise libcurl: %s",
			 curl_easy_strerror(rc));

	/*
	 * Proxy variables of the environment are ignored: through a proxy the
	 * open-socket callback would see only the proxy's address, and the
	 * destination rules could not tell where a request goes.
	 */
	destinations_seen = outbox_destinations_generation;
	if (getenv("http_proxy") || getenv("https_proxy") || getenv("HTTPS_PROXY") ||
		getenv("all_proxy") || getenv("ALL_PROXY"))
		ereport(LOG,
				(errmsg("outbox relay ignores the proxy variables of its environment"),
				 errdetail("Requests go straight to their targets, so that outbox.denied_destinations applies to the address each one is sent to.")));

	ReserveExternalFD();
	epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (epoll_fd < 0)
		elog(ERROR, "outbox: epoll_create1 failed: %m");

#if LIBCURL_VERSION_NUM >= 0x075400
	{
		CURL	   *probe = curl_easy_init();
		char	   *path = NULL;

		if (probe != NULL && default_cainfo == NULL &&
			curl_easy_getinfo(probe, CURLINFO_CAINFO, &path) == CURLE_OK && path != NULL)
			default_cainfo = MemoryContextStrdup(TopMemoryContext, path);
		path = NULL;
		if (probe != NULL && default_capath == NULL &&
			curl_easy_getinfo(probe, CURLINFO_CAPATH, &path) == CURLE_OK && path != NULL)
			default_capath = MemoryContextStrdup(TopMemoryContext, path);
		if (probe != NULL)
			curl_easy_cleanup(probe);
	}
#endif

	multi = curl_multi_init();
	if (multi == NULL)
		elog(ERROR, "outbox: could not create a libcurl multi handle");
	curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, relay_socket_cb);
	curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, relay_timer_cb);
	curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, 1024L);
	/*
	 * No HTTP/2 multiplexing: each lane has a connection of its own (a
	 * lane's failures stay its own), and a connection made under
	 * destination rules that changed since is not kept busy by others.
	 */
	curl_multi_setopt(multi, CURLMOPT_PIPELINING, (long) CURLPIPE_NOTHING);
	return epoll_fd;
}

static void
relay_http_shutdown(void)
{
	if (multi != NULL)
	{
		curl_multi_cleanup(multi);
		multi = NULL;
		curl_global_cleanup();
	}
	if (epoll_fd >= 0)
	{
		close(epoll_fd);
		epoll_fd = -1;
	}
	free(sockets);
	sockets = NULL;
	nsockets = 0;
}

/*
 * The options of a lane's handle that follow the target's row: URL,
 * timeouts, TLS files.  Set again before the next request once the target
 * took new options (t->options_version), so that a target altered live
 * uses them from then on.
 */
static void
relay_http_lane_options(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	CURL	   *easy = HTTP(lane)->easy;

	curl_easy_setopt(easy, CURLOPT_URL, t->post_url ? t->post_url : t->url);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, (long) t->timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, (long) Min(t->timeout_ms, 10000));
	/*
	 * A ca_file replaces the system's trust (bundle and directory), so that
	 * no other CA can vouch for the receiver; without one, libcurl's own
	 * defaults (NULL would mean none).
	 */
	if (t->ca_file != NULL || default_cainfo != NULL)
		curl_easy_setopt(easy, CURLOPT_CAINFO, t->ca_file ? t->ca_file : default_cainfo);
	curl_easy_setopt(easy, CURLOPT_CAPATH, t->ca_file ? NULL : default_capath);
	curl_easy_setopt(easy, CURLOPT_SSLCERT, t->client_cert);
	curl_easy_setopt(easy, CURLOPT_SSLKEY, t->client_key);
}

/*
 * Create the easy handle of an HTTP lane: of an HTTP target, or of a kind
 * whose requests are HTTP (SQS: relay_sqs.c).
 */
void
relay_http_lane_init(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayHttpLane *h = MemoryContextAllocZero(t->cxt, sizeof(RelayHttpLane));
	CURL	   *easy = curl_easy_init();

	if (easy == NULL)
		elog(ERROR, "outbox: could not create a libcurl handle");

	initStringInfo(&h->body);
	initStringInfo(&h->hdr);
	initStringInfo(&h->sig);
	h->maxlines = 16;
	h->hoff = palloc(sizeof(int) * h->maxlines);
	h->nodes = palloc(sizeof(struct curl_slist) * h->maxlines);
	h->reads_answer = (t->transport->http_answer != NULL);
	h->easy = easy;
	lane->priv = h;
	curl_easy_setopt(easy, CURLOPT_PRIVATE, lane);
	relay_easy_common(easy);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, h->errbuf);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, relay_write_cb);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, h);
	curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, relay_header_cb);
	curl_easy_setopt(easy, CURLOPT_HEADERDATA, h);
	relay_http_lane_options(lane);
	h->options_version = t->options_version;
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, relay_open_socket_cb);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, lane);
	curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, relay_close_socket_cb);
}

/*
 * The options every handle of the relay has: no proxy, no signals, no
 * redirects, http and https only, no decompression, cookies or .netrc,
 * verified TLS.
 */
static void
relay_easy_common(CURL *easy)
{
	curl_easy_setopt(easy, CURLOPT_PROXY, "");
	curl_easy_setopt(easy, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long) (CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
	curl_easy_setopt(easy, CURLOPT_POST, 1L);
	curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
#if LIBCURL_VERSION_NUM >= 0x075700
	/*
	 * A request given up while its name is being resolved (its timeout, a
	 * lane released) leaves the resolver thread to finish on its own:
	 * otherwise libcurl joins it there, and the whole relay waits for the
	 * DNS server (seconds, when it does not answer), every target's
	 * requests timing out meanwhile.
	 */
	curl_easy_setopt(easy, CURLOPT_QUICK_EXIT, 1L);
#endif
	curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(easy, CURLOPT_USERAGENT, "outbox/" OUTBOX_VERSION);
	/* No decompression (no zip bombs), no cookies, no .netrc. */
	curl_easy_setopt(easy, CURLOPT_NETRC, (long) CURL_NETRC_IGNORED);
	curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
}

/* Abandon the lane's request, if any, and free its handle. */
void
relay_http_lane_release(RelayLane *lane)
{
	RelayHttpLane *h = HTTP(lane);

	if (h == NULL)
		return;
	if (lane->in_flight)
	{
		curl_multi_remove_handle(multi, h->easy);
		lane->in_flight = false;
	}
	curl_easy_cleanup(h->easy);
	free(h->answer);
	h->answer = NULL;
	lane->priv = NULL;
}

/*---- requests of the relay's own: tokens (relay_auth.c) ----*/

/*
 * Most bytes of a fetch's answer kept (a token endpoint's JSON, STS's
 * XML); a longer answer fails the fetch.
 */
#define RELAY_FETCH_MAX_ANSWER	(64 * 1024)

/*
 * A request the relay makes for itself, not for a lane: the token a
 * target's requests carry.  It goes through the same multi handle, so the
 * worker never waits for it, and its connections are checked by the
 * destination rules against its own host.
 */
struct RelayFetch
{
	CURL	   *easy;
	struct RelayFetch *next;	/* in fetches, while on the wire */
	bool		in_flight;
	RelayFetchDone done;
	void	   *arg;
	char	   *host;			/* the URL's host, for allowed_destinations */
	struct curl_slist *headers;
	char	   *body;			/* the request body, while on the wire */
	char		errbuf[CURL_ERROR_SIZE];
	char		refused[512];
	bool		opened;
	char	   *answer;			/* RELAY_FETCH_MAX_ANSWER + 1 bytes */
	int			answer_len;
	bool		capped;			/* the answer did not fit */
	Size		header_bytes;
	MemoryContext cxt;
};

static RelayFetch *fetches = NULL;	/* on the wire */

static size_t
relay_fetch_write_cb(char *data, size_t size, size_t nmemb, void *userdata)
{
	RelayFetch *f = (RelayFetch *) userdata;
	size_t		len = size * nmemb;

	if (len > (size_t) (RELAY_FETCH_MAX_ANSWER - f->answer_len))
	{
		f->capped = true;
		return 0;				/* aborts the transfer */
	}
	memcpy(f->answer + f->answer_len, data, len);
	f->answer_len += len;
	f->answer[f->answer_len] = '\0';
	return len;
}

static size_t
relay_fetch_header_cb(char *data, size_t size, size_t nmemb, void *userdata)
{
	RelayFetch *f = (RelayFetch *) userdata;
	size_t		len = size * nmemb;

	f->header_bytes += len;
	if (f->header_bytes > RELAY_MAX_RESPONSE_HEADERS)
	{
		f->capped = true;
		return 0;
	}
	return len;
}

static curl_socket_t
relay_fetch_open_socket_cb(void *clientp, curlsocktype purpose,
						   struct curl_sockaddr *address)
{
	RelayFetch *f = (RelayFetch *) clientp;

	return relay_dial(address, f->host, f->refused, sizeof(f->refused), &f->opened);
}

/* A fetch's handle and buffers, in cxt. */
RelayFetch *
relay_fetch_create(MemoryContext cxt)
{
	RelayFetch *f = MemoryContextAllocZero(cxt, sizeof(RelayFetch));
	CURL	   *easy = curl_easy_init();

	if (easy == NULL)
		elog(ERROR, "outbox: could not create a libcurl handle");
	f->easy = easy;
	f->cxt = cxt;
	f->answer = MemoryContextAlloc(cxt, RELAY_FETCH_MAX_ANSWER + 1);
	relay_easy_common(easy);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, f->errbuf);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, relay_fetch_write_cb);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, f);
	curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, relay_fetch_header_cb);
	curl_easy_setopt(easy, CURLOPT_HEADERDATA, f);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, relay_fetch_open_socket_cb);
	curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, f);
	curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, relay_close_socket_cb);
	return f;
}

/* Forget what the fetch's last request held. */
static void
relay_fetch_clear(RelayFetch *f)
{
	struct curl_slist *l;

	for (l = f->headers; l != NULL; l = l->next)
		explicit_bzero(l->data, strlen(l->data));	/* client credentials */
	curl_slist_free_all(f->headers);
	f->headers = NULL;
	if (f->body != NULL)
	{
		explicit_bzero(f->body, strlen(f->body));	/* client secrets */
		pfree(f->body);
		f->body = NULL;
	}
	if (f->host != NULL)
	{
		pfree(f->host);
		f->host = NULL;
	}
}

/*
 * POST body (form-encoded, NUL-terminated) to url, with the header lines
 * given, under ca_file (NULL: the system's CAs) and timeout_ms; host is
 * url's host, for the destination rules.  done(arg, ...) is called from
 * relay_http_drive() when it ends.  Returns false, with error filled in,
 * when it could not be started.
 */
bool
relay_fetch_start(RelayFetch *f, const char *url, const char *host, const char *ca_file,
				  int timeout_ms, const char *const *headers, int nheaders,
				  const char *body, RelayFetchDone done, void *arg,
				  char *error, size_t size)
{
	int			i;
	CURLMcode	mrc;

	Assert(!f->in_flight);
	if (multi == NULL)
	{
		snprintf(error, size, "the relay's HTTP client is not running");
		return false;
	}
	relay_fetch_clear(f);
	f->host = MemoryContextStrdup(f->cxt, host);
	f->body = MemoryContextStrdup(f->cxt, body);
	for (i = 0; i < nheaders; i++)
	{
		struct curl_slist *l = curl_slist_append(f->headers, headers[i]);

		if (l == NULL)
		{
			relay_fetch_clear(f);
			snprintf(error, size, "out of memory");
			return false;
		}
		f->headers = l;
	}
	f->errbuf[0] = '\0';
	f->refused[0] = '\0';
	f->opened = false;
	f->answer_len = 0;
	f->answer[0] = '\0';
	f->capped = false;
	f->header_bytes = 0;
	f->done = done;
	f->arg = arg;
	curl_easy_setopt(f->easy, CURLOPT_URL, url);
	curl_easy_setopt(f->easy, CURLOPT_TIMEOUT_MS, (long) timeout_ms);
	curl_easy_setopt(f->easy, CURLOPT_CONNECTTIMEOUT_MS, (long) Min(timeout_ms, 10000));
	if (ca_file != NULL || default_cainfo != NULL)
		curl_easy_setopt(f->easy, CURLOPT_CAINFO, ca_file ? ca_file : default_cainfo);
	curl_easy_setopt(f->easy, CURLOPT_CAPATH, ca_file ? NULL : default_capath);
	curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->headers);
	curl_easy_setopt(f->easy, CURLOPT_POSTFIELDS, f->body);
	curl_easy_setopt(f->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) strlen(f->body));
	mrc = curl_multi_add_handle(multi, f->easy);
	if (mrc != CURLM_OK)
	{
		relay_fetch_clear(f);
		snprintf(error, size, "%s", curl_multi_strerror(mrc));
		return false;
	}
	f->in_flight = true;
	f->next = fetches;
	fetches = f;
	return true;
}

/* Take f off the wire, if it is on it. */
void
relay_fetch_cancel(RelayFetch *f)
{
	RelayFetch **p;

	if (!f->in_flight)
		return;
	for (p = &fetches; *p != NULL; p = &(*p)->next)
		if (*p == f)
		{
			*p = f->next;
			break;
		}
	curl_multi_remove_handle(multi, f->easy);
	f->in_flight = false;
	relay_fetch_clear(f);
}

/* Cancel f and free it. */
void
relay_fetch_free(RelayFetch *f)
{
	if (f == NULL)
		return;
	relay_fetch_cancel(f);
	curl_easy_cleanup(f->easy);
	explicit_bzero(f->answer, RELAY_FETCH_MAX_ANSWER + 1);	/* a token */
	pfree(f->answer);
	pfree(f);
}

/* Whether easy is a fetch's; if so, it ended: tell its owner. */
static bool
relay_fetch_finish(CURL *easy, CURLcode result)
{
	RelayFetch *f;
	long		status = 0;
	char		msg[CURL_ERROR_SIZE + 600];
	const char *error = NULL;

	for (f = fetches; f != NULL; f = f->next)
		if (f->easy == easy)
			break;
	if (f == NULL)
		return false;
	relay_fetch_cancel(f);
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	if (result != CURLE_OK && f->refused[0] != '\0' && !f->opened)
		error = f->refused;
	else if (f->capped)
	{
		snprintf(msg, sizeof(msg), "the answer exceeds %d bytes", RELAY_FETCH_MAX_ANSWER);
		error = msg;
	}
	else if (result != CURLE_OK)
	{
		relay_printable_copy(msg, sizeof(msg),
							 f->errbuf[0] ? f->errbuf : curl_easy_strerror(result));
		error = msg;
	}
	f->done(f->arg, status, f->answer, f->answer_len, error);
	explicit_bzero(f->answer, f->answer_len);	/* a token */
	f->answer_len = 0;
	return true;
}

/* Append s percent-encoded for a form (RFC 3986's unreserved kept). */
void
relay_form_value(StringInfo b, const char *s, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t		i;
	char	   *o;

	/* room for the worst case once, then the bytes written in place */
	enlargeStringInfo(b, 3 * len);
	o = b->data + b->len;
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			c == '-' || c == '_' || c == '.' || c == '~')
			*o++ = (char) c;
		else
		{
			*o++ = '%';
			*o++ = hex[c >> 4];
			*o++ = hex[c & 15];
		}
	}
	b->len = o - b->data;
	b->data[b->len] = '\0';
}

/*
 * Whether the lane's next request carries the target's token (or
 * credentials) of this generation: then what the answer says of it counts
 * (RelayOutcome.auth_refused).
 */
void
relay_http_auth_sent(RelayLane *lane, bool sent, uint32 generation)
{
	HTTP(lane)->has_auth = sent;
	HTTP(lane)->auth_heavy = false;
	HTTP(lane)->auth_generation = generation;
}

/* Start the header lines of a lane's next request (relay_http_start()). */
void
relay_http_headers_reset(RelayLane *lane)
{
	RelayHttpLane *h = HTTP(lane);

	h->nlines = 0;
	resetStringInfo(&h->hdr);
}

/* Add a "Name: value" line to them. */
void
relay_http_header(RelayLane *lane, const char *line)
{
	relay_header(HTTP(lane), line);
}

/* Start a header line: note where it begins. */
static void
relay_header_start(RelayHttpLane *h)
{
	if (h->nlines == h->maxlines)
	{
		h->maxlines *= 2;
		h->hoff = repalloc(h->hoff, sizeof(int) * h->maxlines);
		h->nodes = repalloc(h->nodes, sizeof(struct curl_slist) * h->maxlines);
	}
	h->hoff[h->nlines++] = h->hdr.len;
}

/* Add the header line "line". */
static void
relay_header(RelayHttpLane *h, const char *line)
{
	relay_header_start(h);
	appendStringInfoString(&h->hdr, line);
	appendStringInfoChar(&h->hdr, '\0');
}

/*
 * Add the header line "name: value".  A value of white space only goes as
 * "name;" (an empty header; HTTP drops the white space around a value
 * anyway): libcurl would take "name:   " for "remove this header".
 */
static void
relay_header_value(RelayHttpLane *h, const char *name, const char *value)
{
	relay_header_start(h);
	appendStringInfoString(&h->hdr, name);
	if (value[strspn(value, " \t")] == '\0')
		appendStringInfoChar(&h->hdr, ';');
	else
	{
		appendStringInfoString(&h->hdr, ": ");
		appendStringInfoString(&h->hdr, value);
	}
	appendStringInfoChar(&h->hdr, '\0');
}

/* Link the lines into the list libcurl reads (it never frees it). */
static struct curl_slist *
relay_header_list(RelayHttpLane *h)
{
	int			i;

	for (i = 0; i < h->nlines; i++)
	{
		h->nodes[i].data = h->hdr.data + h->hoff[i];
		h->nodes[i].next = (i + 1 < h->nlines) ? &h->nodes[i + 1] : NULL;
	}
	return h->nlines > 0 ? h->nodes : NULL;
}

/* Whether the target has a header of the name that starts line. */
static bool
relay_target_has_header(RelayTarget *t, const char *line)
{
	size_t		len = strcspn(line, ":;");
	int			i;

	for (i = 0; i < t->nheader_lines; i++)
		if (outbox_header_names_match(t->header_names[i], strlen(t->header_names[i]),
									  line, len))
			return true;
	return false;
}

/* Whether s begins or ends with a space or a tab (NULL: no). */
static bool
http_edge_blank(const char *s)
{
	size_t		len;

	if (s == NULL || *s == '\0')
		return false;
	len = strlen(s);
	return *s == ' ' || *s == '\t' || s[len - 1] == ' ' || s[len - 1] == '\t';
}

/* Whether the value of a "Name: value" line does (see above). */
static bool
http_line_edge_blank(const char *line)
{
	const char *colon = strchr(line, ':');

	/* the one space after the colon is the format's */
	return colon != NULL && colon[1] == ' ' && http_edge_blank(colon + 2);
}

/* Whether a value of the "Name: value" lines t sends does (see above). */
static bool
http_headers_edge_blank(RelayTarget *t, const char *lines)
{
	const char *p;

	for (p = lines; p != NULL && *p; p += strlen(p) + 1)
	{
		if (relay_target_has_header(t, p) ||
			(t->format != RELAY_FORMAT_OUTBOX && relay_ce_owned_header(p)))
			continue;			/* left out: see relay_http_send() */
		if (http_line_edge_blank(p))
			return true;
	}
	return false;
}

/* Whether a "Name: value" line is an Authorization header, as receivers read names. */
static bool
relay_line_is_authorization(const char *line)
{
	return outbox_header_name_is(line, strcspn(line, ":;"), "authorization", true);
}

/*
 * Send the lane's next batch: the lane->cut_n messages at the head of its
 * queue that relay_lane_cut() chose.  With batch_size 1 the body is the
 * payload itself; otherwise a JSON array of envelopes.  Returns false,
 * with *failed set, when the request could not be started.
 */
static bool
relay_http_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayHttpLane *h = HTTP(lane);
	RelayMessage *first = lane->head;
	RelayMessage *last = first;
	RelayMessage *m;
	char		webhook_id[64];
	char		timestamp[32];
	char		number[32];
	const char *body;
	int			body_len;
	int			n;
	int			i;

	Assert(!lane->in_flight && lane->nqueued > 0);
	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", first->topic);

	/* relay_lane_cut() chose the messages. */
	n = lane->cut_n;
	Assert(n >= 1 && n <= lane->nqueued);
	if (t->batch_size == 1 &&
		((t->format == RELAY_FORMAT_OUTBOX && http_edge_blank(first->key)) ||
		 http_headers_edge_blank(t, first->header_lines)))
	{
		/*
		 * Its headers are all that carries them (a CloudEvent's key is
		 * percent-encoded, or in its body), and receivers trim them (I10).
		 */
		lane->nbatch = 1;
		failed->kind = RELAY_REJECTED;
		failed->error = "the message's key or a header value begins or ends with a space or tab, which an HTTP header cannot carry (receivers trim them)";
		return false;
	}
	if (t->batch_size == 1 && t->format == RELAY_FORMAT_CE_STRUCTURED)
	{
		/* The CloudEvent, the payload its data. */
		resetStringInfo(&h->body);
		relay_ce_structured(t, first, &h->body);
		body = h->body.data;
		body_len = h->body.len;
	}
	else if (t->batch_size == 1)
	{
		/* The payload itself; it stays queued until the request ends. */
		body = first->payload;
		body_len = first->payload_len;
	}
	else
	{
		if (lane->cut_bytes >= MaxAllocSize)
		{
			lane->nbatch = 1;
			failed->kind = RELAY_REJECTED;
			failed->error = "message too large for a batch request body (1 GB)";
			return false;
		}
		resetStringInfo(&h->body);
		appendStringInfoChar(&h->body, '[');
		for (m = first, i = 0; i < n; m = m->next, i++)
		{
			if (i > 0)
				appendStringInfoChar(&h->body, ',');
			if (t->format == RELAY_FORMAT_OUTBOX)
				relay_envelope(m, RELAY_ENVELOPE_ALL, &h->body);
			else
				relay_ce_structured(t, m, &h->body);
			last = m;
		}
		appendStringInfoChar(&h->body, ']');
		body = h->body.data;
		body_len = h->body.len;
	}
	lane->nbatch = n;

	if (n == 1)
		strlcpy(webhook_id, first->msg_id, sizeof(webhook_id));
	else
		snprintf(webhook_id, sizeof(webhook_id), "batch_" INT64_FORMAT "_" INT64_FORMAT,
				 first->id, last->id);
	pg_lltoa((int64) time(NULL), timestamp);

	h->nlines = 0;
	resetStringInfo(&h->hdr);
	if (t->format == RELAY_FORMAT_OUTBOX ||
		(t->format == RELAY_FORMAT_CE_BINARY && t->batch_size == 1))
		relay_header(h, "Content-Type: application/json");
	else if (t->batch_size == 1)
		relay_header(h, "Content-Type: application/cloudevents+json");
	else
		relay_header(h, "Content-Type: application/cloudevents-batch+json");
	relay_header(h, "Expect:");
	if (t->format == RELAY_FORMAT_CE_BINARY && t->batch_size == 1)
	{
		RelayCeAttrs a;

		/* Each attribute a ce- header, but datacontenttype: Content-Type. */
		relay_ce_attrs(t, first, &a);
		for (i = 0; i < a.n; i++)
		{
			if (strcmp(a.name[i], "datacontenttype") == 0)
				continue;
			relay_header_start(h);
			appendStringInfo(&h->hdr, "ce-%s: ", a.name[i]);
			relay_ce_http_value(a.value[i], &h->hdr);
			appendStringInfoChar(&h->hdr, '\0');
		}
	}
	relay_header_value(h, "webhook-id", webhook_id);
	relay_header_value(h, "webhook-timestamp", timestamp);
	if (t->nkeys > 0)
	{
		/* Both signatures during a key rotation, space-separated. */
		resetStringInfo(&h->sig);
		for (i = 0; i < t->nkeys; i++)
		{
			if (i > 0)
				appendStringInfoChar(&h->sig, ' ');
			outbox_sign(&t->keys[i], webhook_id, timestamp, body, body_len, &h->sig);
		}
		relay_header_value(h, "webhook-signature", h->sig.data);
	}
	/*
	 * A CloudEvent carries the id, topic and key as ce-sequence, ce-type
	 * and ce-subject (or in its body): no outbox-* copies of them.
	 */
	pg_lltoa(first->id, number);
	if (t->format == RELAY_FORMAT_OUTBOX || t->batch_size > 1)
		relay_header_value(h, "outbox-seq", number);
	if (n == 1)
	{
		/*
		 * A batch of one (batch_size > 1) of format outbox carries the key
		 * and headers exactly in its body: a header copy that receivers
		 * would trim is left out there (with batch_size 1 it was refused
		 * above).  A CloudEvents batch has no place for a message's
		 * headers: they are not sent, in a batch of one as in any other
		 * (docs/formats.md).
		 */
		bool		exact = t->batch_size > 1;

		if (t->format == RELAY_FORMAT_OUTBOX)
		{
			relay_header_value(h, "outbox-topic", first->topic);
			if (first->key && *first->key)
			{
				if (!(exact && http_edge_blank(first->key)))
					relay_header_value(h, "outbox-key", first->key);
			}
			else if (first->key)
				relay_header(h, "outbox-key;");
		}
		if (first->header_lines &&
			(t->format == RELAY_FORMAT_OUTBOX || t->batch_size == 1))
		{
			char	   *p = first->header_lines;

			/*
			 * NUL-separated "Name: value" lines, ended by an empty one.  A
			 * message header never replaces or duplicates one of the
			 * target's: it is left out (outbox_emit() already refuses the
			 * names the relay sets).
			 */
			while (*p)
			{
				/*
				 * a CloudEvent's attributes are the relay's: ce-* skipped;
				 * so is an Authorization when the relay sets one
				 */
				if (!relay_target_has_header(t, p) &&
					!(t->auth != NULL && relay_line_is_authorization(p)) &&
					(t->format == RELAY_FORMAT_OUTBOX || !relay_ce_owned_header(p)) &&
					!(exact && http_line_edge_blank(p)))
					relay_header(h, p);
				p += strlen(p) + 1;
			}
		}
	}
	else
	{
		pg_ltoa(n, number);
		relay_header_value(h, "outbox-count", number);
	}
	for (i = 0; i < t->nheader_lines; i++)
	{
		/* a CloudEvent's attributes are the relay's, not the target's */
		if (t->format != RELAY_FORMAT_OUTBOX && relay_ce_owned_header(t->header_lines[i]))
			continue;
		relay_header(h, t->header_lines[i]);
	}
	/* An OAuth2 token (relay_lane_may_send() saw that there is one). */
	h->has_auth = false;
	if (t->auth != NULL)
	{
		const char *line = t->auth_header;

		h->auth_generation = t->auth_generation;
		if (line == NULL)
		{
			/* not the message's fault: held, no attempt counted */
			failed->kind = RELAY_RECEIVER_FAILED;
			failed->error = "the target's OAuth2 token went away before the request was sent";
			return false;
		}
		relay_header(h, line);
		h->has_auth = true;
		/* the token is most of the header bytes (a 431 is then its doing) */
		h->auth_heavy = strlen(line) * 2 > (size_t) h->hdr.len;
	}

	return relay_http_start(lane, body, body_len, failed);
}

/*
 * Put the lane's request on the wire: the header lines built with
 * relay_http_header() since relay_http_headers_reset(), and body (which
 * must stay as it is until the request ends).  Returns false, with *failed
 * set, when it could not be started.
 */
bool
relay_http_start(RelayLane *lane, const char *body, int body_len, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayHttpLane *h = HTTP(lane);
	CURLMcode	mrc;

	h->response_len = 0;
	h->response[0] = '\0';
	h->answer_len = 0;
	h->errbuf[0] = '\0';
	h->body_bytes = 0;
	h->header_bytes = 0;
	h->body_capped = false;
	h->headers_capped = false;
	h->refused[0] = '\0';
	h->opened = false;
	if (h->options_version != t->options_version)
	{
		relay_http_lane_options(lane);
		h->options_version = t->options_version;
	}

	curl_easy_setopt(h->easy, CURLOPT_HTTPHEADER, relay_header_list(h));
	curl_easy_setopt(h->easy, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) body_len);

	mrc = curl_multi_add_handle(multi, h->easy);
	if (mrc != CURLM_OK)
	{
		failed->kind = RELAY_RETRY;
		failed->error = curl_multi_strerror(mrc);
		return false;
	}
	lane->in_flight = true;
	return true;
}

/*
 * The failure class of an HTTP status (README, "Failure classes").  A
 * status we do not know is never taken to mean "drop the message": an
 * unknown 4xx holds the target, anything else is retried.
 */
static RelayOutcomeKind
relay_http_status_class(long status)
{
	if (status >= 200 && status < 300)
		return RELAY_DELIVERED;
	switch (status)
	{
		case 408:				/* Request Timeout */
		case 425:				/* Too Early */
		case 429:				/* Too Many Requests */
			return RELAY_RETRY;
		case 400:				/* Bad Request */
		case 409:				/* Conflict */
		case 411:				/* Length Required */
		case 413:				/* Content Too Large */
		case 415:				/* Unsupported Media Type */
		case 422:				/* Unprocessable Content */
		case 431:				/* Request Header Fields Too Large */
			return RELAY_REJECTED;
	}
	if (status >= 500 && status < 600)
		return RELAY_RETRY;
	if ((status >= 300 && status < 500))
		return RELAY_RECEIVER_FAILED;	/* 3xx (not followed), 401, 403, 404,
										 * 405, 410, other 4xx */
	return RELAY_RETRY;			/* 1xx or nonsense */
}

/* Copy src into dst as printable ASCII, cut to fit. */
static void
relay_printable_copy(char *dst, size_t size, const char *src)
{
	size_t		i;

	for (i = 0; i + 1 < size && src[i] != '\0'; i++)
		dst[i] = ((unsigned char) src[i] >= 0x20 && (unsigned char) src[i] < 0x7f) ? src[i] : '?';
	dst[i] = '\0';
}

/*
 * The failure class of a transfer that did not complete.  TLS
 * verification and TLS file problems are the target's configuration (or
 * the receiver's certificate), not the message: they hold the target
 * rather than use up the messages' attempts.  Anything else (refused,
 * reset, timed out ...) is retried.
 */
static RelayOutcomeKind
relay_http_error_class(CURLcode result)
{
	switch (result)
	{
		case CURLE_PEER_FAILED_VERIFICATION:
		case CURLE_SSL_CACERT_BADFILE:
		case CURLE_SSL_CERTPROBLEM:
		case CURLE_SSL_CRL_BADFILE:
		case CURLE_SSL_ISSUER_ERROR:
		case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
		case CURLE_SSL_CIPHER:
			return RELAY_RECEIVER_FAILED;
		default:
			return RELAY_RETRY;
	}
}

/* A request finished: classify the outcome and tell the lane. */
static void
relay_http_finish(CURL *easy, CURLcode result, RelayFinishedFn finished)
{
	RelayLane  *lane = NULL;
	RelayHttpLane *h;
	long		status = 0;
	curl_off_t	retry_after = 0;
	RelayOutcome outcome;
	char		msg[CURL_ERROR_SIZE + 400];

	curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **) &lane);
	h = HTTP(lane);
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
#if LIBCURL_VERSION_NUM >= 0x074200
	curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &retry_after);
#endif
	curl_multi_remove_handle(multi, easy);
	lane->in_flight = false;

	/* Give back the memory of a large batch body. */
	if (h->body.maxlen > RELAY_BODY_KEEP)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(GetMemoryChunkContext(h->body.data));

		pfree(h->body.data);
		initStringInfo(&h->body);
		MemoryContextSwitchTo(oldcxt);
	}

	memset(&outcome, 0, sizeof(outcome));
	if (result != CURLE_OK && h->refused[0] != '\0' && !h->opened)
	{
		/*
		 * Every address was refused (libcurl tries the others of a name
		 * first).  Not the receiver's doing, nor the message's: hold the
		 * target.
		 */
		snprintf(msg, sizeof(msg), "%s", h->refused);
		outcome.kind = RELAY_RECEIVER_FAILED;
		outcome.error = msg;
	}
	else if (h->headers_capped)
	{
		snprintf(msg, sizeof(msg), "the response headers exceed %d bytes",
				 RELAY_MAX_RESPONSE_HEADERS);
		outcome.kind = RELAY_RETRY;
		outcome.error = msg;
	}
	else if (result != CURLE_OK && !(h->body_capped && status > 0))
	{
		relay_printable_copy(msg, sizeof(msg),
							 h->errbuf[0] ? h->errbuf : curl_easy_strerror(result));
		outcome.kind = relay_http_error_class(result);
		outcome.error = msg;
	}
	else if (lane->target->transport->http_answer != NULL)
	{
		/* A kind that reads the answer (relay_sqs.c) says what it means. */
		outcome.status = (int) status;
		outcome.auth_sent = h->has_auth;	/* auth_refused: the kind's */
		outcome.auth_generation = h->auth_generation;
		lane->target->transport->http_answer(lane, status, h->answer ? h->answer : "",
											 h->answer_len, h->body_capped, &outcome,
											 msg, sizeof(msg));
		if (outcome.kind != RELAY_DELIVERED)
			outcome.retry_after_s = (int) Min(Max(retry_after, 0),
											  (curl_off_t) (outbox_retry_max_delay + 999) / 1000);
		/* a large answer's memory given back */
		if (h->answer_cap > RELAY_MAX_RESPONSE_BODY)
		{
			free(h->answer);
			h->answer = NULL;
			h->answer_cap = 0;
		}
	}
	else
	{
		/* A body cut at the cap still has its status. */
		outcome.auth_sent = h->has_auth;	/* a 401 to it: relay_lane_outcome() */
		outcome.auth_generation = h->auth_generation;
		outcome.auth_refused = status == 401;
		outcome.kind = relay_http_status_class(status);
		/*
		 * Headers too large, most of them the token (a JWT of many claims):
		 * the token's doing, not the message's; held, nothing dead-lettered.
		 */
		if (status == 431 && h->has_auth && h->auth_heavy)
			outcome.kind = RELAY_RECEIVER_FAILED;
		outcome.status = (int) status;
		if (outcome.kind != RELAY_DELIVERED)
		{
			snprintf(msg, sizeof(msg), "HTTP %ld%s%s%s", status,
					 h->response_len > 0 ? ": " : "", h->response,
					 h->body_capped ? " (body cut short)" : "");
			outcome.error = msg;
			/* Retry-After is honoured up to outbox.retry_max_delay. */
			outcome.retry_after_s = (int) Min(Max(retry_after, 0),
											  (curl_off_t) (outbox_retry_max_delay + 999) / 1000);
		}
	}
	finished(lane, &outcome);
}

/*
 * Let libcurl make progress: serve the sockets epoll reports ready and an
 * expired timer, then collect finished requests.  The sockets are polled
 * every time, without waiting: the worker's wait returns only the latch
 * when it is set, even if sockets are ready too.
 */
void
relay_http_drive(RelayFinishedFn finished)
{
	struct epoll_event events[64];
	int			running;
	int			n;
	CURLMsg    *msg;
	int			left;

	if (multi == NULL)
		return;

	/*
	 * The destination rules changed (a reload): connections made under the
	 * old ones are not used again, so every address is checked anew.  All
	 * are shut down now: libcurl finds an idle one dead before it reuses
	 * it, and a request on a busy one fails and is retried.
	 */
	if (destinations_seen != outbox_destinations_generation)
	{
		int			fd;

		destinations_seen = outbox_destinations_generation;
		for (fd = 0; fd < nsockets; fd++)
			if (sockets[fd].ours)
			{
				sockets[fd].stale = true;
				shutdown(fd, SHUT_RDWR);
			}
	}

	do
	{
		int			i;

		n = epoll_wait(epoll_fd, events, lengthof(events), 0);
		for (i = 0; i < n; i++)
		{
			int			flags = 0;
			RelaySocketState *st = relay_socket_state(events[i].data.fd);

			if (st != NULL && !st->wanted)
			{
				/*
				 * An idle pooled connection: the peer closed it or sent
				 * something unasked.  Stop watching it; libcurl checks a
				 * connection before it reuses one.
				 */
				relay_socket_watch(events[i].data.fd, st, 0, false);
				continue;
			}

			if (events[i].events & (EPOLLIN | EPOLLHUP))
				flags |= CURL_CSELECT_IN;
			if (events[i].events & EPOLLOUT)
				flags |= CURL_CSELECT_OUT;
			if (events[i].events & EPOLLERR)
				flags |= CURL_CSELECT_ERR;
			curl_multi_socket_action(multi, events[i].data.fd, flags,
									 &running);
		}
	} while (n == lengthof(events));

	if (timer_set && GetCurrentTimestamp() >= timer_deadline)
	{
		timer_set = false;
		curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
	}

	while ((msg = curl_multi_info_read(multi, &left)) != NULL)
	{
		if (msg->msg == CURLMSG_DONE &&
			!relay_fetch_finish(msg->easy_handle, msg->data.result))
			relay_http_finish(msg->easy_handle, msg->data.result, finished);
	}
}

/* Milliseconds until libcurl needs a call, or -1 for no limit. */
static long
relay_http_timeout(void)
{
	long		secs;
	int			usecs;

	if (!timer_set)
		return -1;
	TimestampDifference(GetCurrentTimestamp(), timer_deadline, &secs, &usecs);
	return secs * 1000 + (usecs + 999) / 1000;
}

const RelayTransport relay_http_transport = {
	.kind = "http",
	.id = RELAY_HTTP,
	.header_lines = true,
	.start = relay_http_init,
	.stop = relay_http_shutdown,
	.lane_init = relay_http_lane_init,
	.lane_release = relay_http_lane_release,
	.send = relay_http_send,
	.drive = relay_http_drive,
	.timeout = relay_http_timeout,
};
