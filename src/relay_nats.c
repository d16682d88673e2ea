/*-------------------------------------------------------------------------
 *
 * relay_nats.c
 *	  Delivery to NATS JetStream with libnats.  All libnats use is here.
 *
 * A NATS target has one connection, shared by its lanes.  Each message is
 * published with Nats-Msg-Id = its stable id and a reply subject of the
 * target's inbox naming its lane, request and position; the stream's
 * acknowledgement (a PubAck, or a JetStream error) comes back there.  So a
 * message sent again after a crash or a lost acknowledgement is taken by
 * the stream as a duplicate of the same id within its duplicate window, and
 * the stream holds it once.  A request (relay_lane_cut_keys) never holds
 * two messages of a key, so no message of a key is stored before an earlier
 * one that is to be sent again.
 *
 * Threads.  libnats runs its own threads (a reader and a flusher per
 * connection, timers, a subscription's deliverer); the relay makes and
 * closes connections on threads of its own (NatsDial), as libnats blocks
 * through them, and lets libnats not reconnect.  They never run
 * PostgreSQL code.  The acknowledgements arrive on the target's inbox
 * subscription, whose callback (nats_reply_cb(), on libnats' thread) copies
 * what the relay reads of each (its subject, up to NATS_MAX_ACK bytes of
 * data, whether it is the server's "no responders") into a queue under a
 * pthread mutex (malloc, no palloc); the relay's thread takes them in
 * relay_nats_drive(), every millisecond while requests are in flight (no
 * wake-up per acknowledgement).  A synchronous subscription would not do:
 * libnats drops a "no responders" answer there, and with it the reply
 * subject that says which message no stream took.  The connection
 * callbacks only append to a queue under the same mutex and write a byte
 * to a pipe whose read end is in the relay's WaitEventSet.  libnats
 * does not mask signals, and its threads inherit the mask of the thread
 * that creates them, so every call that may start a thread runs with all
 * signals blocked: PostgreSQL's handlers then run on the relay's thread
 * only.
 *
 * Destinations: the relay resolves the URLs' host names itself, checks
 * every address with outbox.denied_destinations / allowed_destinations,
 * and gives libnats the allowed addresses only, with the servers a cluster
 * advertises ignored; the rules changing (a reload) makes the connection
 * anew.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nats/nats.h>
#include <openssl/evp.h>

#include "catalog/pg_authid.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "relay.h"

/* Most servers in a target's url. */
#define NATS_MAX_SERVERS	16
/* Longest subject, in bytes, once the template is filled in. */
#define NATS_MAX_SUBJECT	1024
/* Longest acknowledgement read; a longer one is not understood. */
#define NATS_MAX_ACK		4096
/* Most events waiting for the relay; more are dropped (a publish then finds the connection closed). */
#define NATS_MAX_EVENTS		10000
/*
 * Most replies (and their bytes) waiting for the relay; more are dropped,
 * and their requests time out and are sent again.
 */
#define NATS_MAX_REPLIES	1000000
#define NATS_MAX_REPLY_BYTES	(64 * 1024 * 1024)
/* Dropped replies are told in the log at most this often. */
#define NATS_DROPPED_WARN_MS	10000
/* Longest reply subject kept: the relay's own are far shorter. */
#define NATS_MAX_REPLY_SUBJECT	200
/* nats_ack_class(): a reply that is not JetStream's, to ignore. */
#define NATS_NOT_AN_ACK		((RelayOutcomeKind) -1)
/* Why a message answered by a service, not a stream, is a dead letter. */
#define NATS_FOREIGN_REPLY	"NATS answered the publish to \"%s\" with something other than a JetStream acknowledgement (a service, not a stream, took it): it is not published again"
/* Most acknowledgements taken in one call of relay_nats_drive(). */
#define NATS_MAX_DRAIN		100000
/*
 * Messages a target may have waiting for acknowledgements (lanes x
 * batch_size) from which it publishes through libnats' write buffer.
 */
#define NATS_BUFFERED_MIN_IN_FLIGHT 64
/* A connection's first attempt takes at most this long a server. */
#define NATS_CONNECT_MAX_MS	10000
/*
 * Most connections being made at once (each on a thread, which a target
 * dropped or changed meanwhile does not stop); more wait for them.
 */
#define NATS_MAX_DIALS		64
/* Shortest deadline of a write to a NATS server. */
#define NATS_WRITE_MIN_MS	1000
/* Longest the relay's exit waits for connections being made or closed. */
#define NATS_STOP_WAIT_S	2
/* How often the relay looks at host-name lookups while one runs. */
#define NATS_LOOKUP_POLL_MS	10
/* JetStream's error code for a message above the stream's max_msg_size. */
#define NATS_JS_ERR_MSG_SIZE	10054

typedef enum NatsEventKind
{
	NATS_EVENT_DISCONNECTED		/* the connection was lost */
} NatsEventKind;

/* What a libnats thread hands the relay's thread. */
typedef struct NatsEvent
{
	struct NatsEvent *next;
	NatsEventKind kind;
	uint64		conn;			/* the connection's serial number */
} NatsEvent;

/*
 * A reply on a target's inbox, as libnats' thread copied it: the subject
 * (NUL-terminated), then data_len bytes of data (none when the data was
 * longer than NATS_MAX_ACK: data_len is -1 then).
 */
typedef struct NatsReply
{
	struct NatsReply *next;
	uint64		conn;			/* the connection's serial number */
	bool		no_responders;	/* the server's: no subscriber took it */
	int			data_len;
	size_t		size;			/* bytes allocated */
	char		buf[FLEXIBLE_ARRAY_MEMBER];
} NatsReply;

static pthread_mutex_t events_lock = PTHREAD_MUTEX_INITIALIZER;
static NatsEvent *events_head = NULL;
static NatsEvent *events_tail = NULL;
static int	events_count = 0;
static NatsReply *replies_head = NULL;	/* under events_lock too */
static NatsReply *replies_tail = NULL;
static int	replies_count = 0;
static size_t replies_bytes = 0;
static uint64 replies_dropped = 0;	/* over the caps, since the start */
static uint64 replies_dropped_seen = 0; /* of those, told in the log */
static TimestampTz replies_dropped_warned = 0;	/* told then */
static int	wake_pipe[2] = {-1, -1};
static bool replies_left = false;	/* the relay thread's: replies it left */
static bool nats_opened = false;
static uint64 next_conn_serial = 1;
static int	requests_in_flight = 0;	/* parked ones too */
static int	dials_running = 0;	/* NatsDial and closing threads not
								 * ended; under events_lock */
static pthread_cond_t dials_ended = PTHREAD_COND_INITIALIZER;

struct NatsDial;

/*
 * A target's connection (RelayTarget.priv): made, or being made (its
 * names being resolved, or dial's thread connecting), for url, files and
 * destinations.
 */
typedef struct RelayNatsTarget
{
	natsConnection *nc;
	natsSubscription *sub;
	struct NatsDial *dial;		/* the connection being made, or NULL */
	bool		lost;			/* nc (or the one being made) was lost */
	uint64		serial;			/* events name the connection by this, or
								 * 0 for none */
	char		inbox[64];		/* reply subjects start with it */
	char	   *url;			/* the url it is for, or NULL */
	char	   *files;			/* the TLS and credentials files it is for */
	uint64		destinations;	/* outbox_destinations_generation then */
	char		refused[256];	/* why it could not be made, or "" */
	RelayLookup *lookups[NATS_MAX_SERVERS];	/* host names being resolved */
	int			nlookups;
	StringInfoData subject;		/* reused: a message's subject */
	StringInfoData reply;		/* reused: its reply subject */
	StringInfoData value;		/* reused: a structured CloudEvent */
} RelayNatsTarget;

/* A lane's request in flight: RelayLane.priv is its RelayAcks. */

#define NATS_TARGET(t)	((RelayNatsTarget *) (t)->priv)
#define NATS_LANE(lane)	((RelayAcks *) (lane)->priv)

/*---- on libnats threads: queue, wake, nothing else ----*/

static void
nats_push_event(NatsEventKind kind, uint64 conn)
{
	NatsEvent  *ev = NULL;
	bool		wake = false;

	pthread_mutex_lock(&events_lock);
	if (events_count < NATS_MAX_EVENTS)
		ev = malloc(sizeof(NatsEvent));
	if (ev != NULL)
	{
		ev->next = NULL;
		ev->kind = kind;
		ev->conn = conn;
		if (events_tail)
			events_tail->next = ev;
		else
		{
			events_head = ev;
			wake = true;
		}
		events_tail = ev;
		events_count++;
	}
	pthread_mutex_unlock(&events_lock);
	if (wake)
	{
		char		c = 1;

		/* Non-blocking: a full pipe has woken the relay already. */
		if (write(wake_pipe[1], &c, 1) < 0)
			return;
	}
}

/*
 * Whether a subject has the shape of the relay's reply subjects,
 * _INBOX.<id>.<lane>.<request>.<position>.<message id> (relay_nats_send()):
 * the callback queues nothing else, so that junk published on an inbox
 * takes no room from the acknowledgements (nats_ack() checks the rest).
 */
static bool
nats_reply_shaped(const char *subj, size_t len)
{
	const char *p;
	int			groups = 0;
	int			digits = 0;

	if (len < 7 || strncmp(subj, "_INBOX.", 7) != 0 ||
		(p = memchr(subj + 7, '.', len - 7)) == NULL)
		return false;
	for (p++; p < subj + len; p++)
	{
		if (*p == '.')
		{
			if (digits == 0)
				return false;
			groups++;
			digits = 0;
		}
		else if (*p >= '0' && *p <= '9' && digits < 20)
			digits++;
		else
			return false;
	}
	return groups == 3 && digits > 0;
}

/*
 * A message on a target's inbox (libnats' deliverer thread): copy what the
 * relay reads of it, queue the copy, and wake the relay when the queue was
 * empty: one wake-up for all that arrive before the relay takes them, not
 * one per acknowledgement.
 */
static void
nats_reply_cb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
	const char *subj = natsMsg_GetSubject(msg);
	const char *data = natsMsg_GetData(msg);
	int			len = natsMsg_GetDataLength(msg);
	size_t		slen = subj != NULL ? strlen(subj) : 0;
	int			copy = (data != NULL && len > 0 && len <= NATS_MAX_ACK) ? len : 0;
	size_t		size = offsetof(NatsReply, buf) + slen + 1 + copy + 1;
	NatsReply  *r = NULL;
	bool		wake = false;

	if (slen > 0 && slen <= NATS_MAX_REPLY_SUBJECT && nats_reply_shaped(subj, slen))
		r = malloc(size);
	if (r != NULL)
	{
		r->next = NULL;
		r->conn = (uint64) (uintptr_t) closure;
		r->no_responders = natsMsg_IsNoResponders(msg);
		r->data_len = len > NATS_MAX_ACK ? -1 : copy;
		r->size = size;
		memcpy(r->buf, subj, slen + 1);
		if (copy > 0)
			memcpy(r->buf + slen + 1, data, copy);
		r->buf[slen + 1 + copy] = '\0';
	}
	natsMsg_Destroy(msg);
	if (r == NULL)
		return;
	pthread_mutex_lock(&events_lock);
	if (replies_count >= NATS_MAX_REPLIES || replies_bytes + size > NATS_MAX_REPLY_BYTES)
	{
		replies_dropped++;
		pthread_mutex_unlock(&events_lock);
		free(r);
		return;
	}
	if (replies_tail)
		replies_tail->next = r;
	else
	{
		replies_head = r;
		wake = true;
	}
	replies_tail = r;
	replies_count++;
	replies_bytes += size;
	pthread_mutex_unlock(&events_lock);
	if (wake)
	{
		char		c = 1;

		/* Non-blocking: a full pipe has woken the relay already. */
		if (write(wake_pipe[1], &c, 1) < 0)
			return;
	}
}

/*
 * The connection was lost, or closed (libnats does not reconnect: the
 * relay makes a new connection, on a thread of its own).
 */
static void
nats_disconnected_cb(natsConnection *nc, void *closure)
{
	nats_push_event(NATS_EVENT_DISCONNECTED, (uint64) (uintptr_t) closure);
}

/*---- checks, for the SQL functions and for rows read ----*/

/*
 * The TLS options of a connection, set on its NatsDial's thread (libnats
 * makes its OpenSSL context there: with the system's store, tens of
 * milliseconds): malloc'd copies, or NULL.
 */
typedef struct NatsTlsPlan
{
	bool		on;
	char	   *ca_file;
	char	   *cert;
	char	   *key;
	char	   *host;			/* the name the certificate must have */
} NatsTlsPlan;

/* What a NATS url says beyond its servers (palloc'd strings, or NULL). */
typedef struct NatsUrlAuth
{
	bool		tls;			/* tls:// */
	char	   *user;			/* user:password@ */
	char	   *password;
	char	   *token;			/* token@ */
} NatsUrlAuth;

/*
 * Whether url is a list of NATS server URLs the relay can use:
 * nats://[user:password@ | token@]host[:port], or tls:// for TLS,
 * comma-separated, at most NATS_MAX_SERVERS.  Returns why not, or NULL.
 * With hosts, fills hosts[i] and ports[i] (palloc'd); with auth, what the
 * url says of TLS and credentials.
 */
static const char *
nats_parse_url(const char *url, char **hosts, int *ports, int *nservers, NatsUrlAuth *auth)
{
	const char *p = url;
	int			n = 0;
	int			tls = -1;
	const char *userinfo = NULL;
	int			userinfo_len = 0;
	const char *tls_host = NULL;
	int			tls_host_len = 0;

	if (url == NULL || *url == '\0')
		return "it is empty";
	for (;;)
	{
		const char *h;
		const char *hend;
		const char *bad;
		long		port = 4222;
		bool		this_tls;
		size_t		at;

		while (*p == ' ')
			p++;
		if (strncmp(p, "nats://", 7) == 0)
			this_tls = false;
		else if (strncmp(p, "tls://", 6) == 0)
			this_tls = true;
		else
			return "each server must be a nats://host:port or tls://host:port URL";
		if (tls >= 0 && tls != this_tls)
			return "it mixes nats:// and tls:// servers: give all of them one scheme";
		tls = this_tls;
		p += this_tls ? 6 : 7;
		at = strcspn(p, "@");
		if (at < strcspn(p, ",/?"))
		{
			/* the same credentials on every server that has some */
			if (userinfo != NULL && ((int) at != userinfo_len || memcmp(p, userinfo, at) != 0))
				return "its servers have different credentials: give them once";
			if (at == 0)
				return "a server URL has an empty user information before its @";
			userinfo = p;
			userinfo_len = (int) at;
			p += at + 1;
		}
		if ((bad = outbox_scan_host(&p, &h, &hend, "a server URL has no host, or one that is too long")) != NULL)
			return bad;
		if (this_tls)
		{
			char		name[256];
			unsigned char addr[16];

			memcpy(name, h, hend - h);
			name[hend - h] = '\0';
			/* libnats checks one host name in every server's certificate */
			if (inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1)
				return "a tls:// server is an IP address: give the host name its certificate names (libnats checks names, not addresses)";
			if (tls_host != NULL && (tls_host_len != hend - h || pg_strncasecmp(tls_host, h, tls_host_len) != 0))
				return "its tls:// servers have different host names: give one name (it may resolve to several servers), the one their certificates name";
			tls_host = h;
			tls_host_len = hend - h;
		}
		if (*p == ':')
		{
			char	   *end;

			p++;
			if (!outbox_ascii_digit((unsigned char) *p))
				return "a port is not a number";
			port = strtol(p, &end, 10);
			p = end;
			if (port < 1 || port > 65535)
				return "a port is not between 1 and 65535";
		}
		if (*p == '@' || *p == '/' || *p == '?')
			return "a server URL has a path or a query; only nats://[credentials@]host:port is taken";
		if (n == NATS_MAX_SERVERS)
			return "it has more than 16 servers";
		if (hosts)
		{
			hosts[n] = pnstrdup(h, hend - h);
			ports[n] = (int) port;
		}
		n++;
		while (*p == ' ')
			p++;
		if (*p == '\0')
			break;
		if (*p != ',')
			return "servers must be separated by commas";
		p++;
	}
	if (userinfo != NULL)
	{
		const char *colon = memchr(userinfo, ':', userinfo_len);
		char	   *user = NULL;
		char	   *password = NULL;
		char	   *token = NULL;

		if (colon != NULL)
		{
			if (colon == userinfo || (user = relay_url_unescape(userinfo, colon - userinfo)) == NULL)
				return "the user is empty or has an invalid percent escape";
			if (colon + 1 == userinfo + userinfo_len ||
				(password = relay_url_unescape(colon + 1, userinfo + userinfo_len - colon - 1)) == NULL)
				return "the password is empty or has an invalid percent escape";
		}
		else if ((token = relay_url_unescape(userinfo, userinfo_len)) == NULL)
			return "the token has an invalid percent escape";
		if (auth)
		{
			auth->user = user;
			auth->password = password;
			auth->token = token;
		}
	}
	else if (auth)
		auth->user = auth->password = auth->token = NULL;
	if (auth)
		auth->tls = tls == 1;
	if (nservers)
		*nservers = n;
	return NULL;
}

const char *
relay_nats_check_url(const char *url)
{
	return nats_parse_url(url, NULL, NULL, NULL, NULL);
}

/*
 * Whether s (len bytes) is a subject NATS takes for publishing: tokens of
 * printable ASCII without spaces, wildcards or empty tokens, separated by
 * dots.  With template, "{topic}" and "{key}" stand for a token's part,
 * and no other braces are allowed.  Returns why not, or NULL.
 */
static const char *
nats_check_subject_len(const char *s, int len, bool template)
{
	int			i;
	bool		token_empty = true;

	if (len == 0)
		return "it is empty";
	if (len > NATS_MAX_SUBJECT)
		return "it is longer than 1024 bytes";
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (template && c == '{')
		{
			if (len - i >= 7 && strncmp(s + i, "{topic}", 7) == 0)
				i += 6;
			else if (len - i >= 5 && strncmp(s + i, "{key}", 5) == 0)
				i += 4;
			else
				return "only {topic} and {key} may stand in braces";
			token_empty = false;
			continue;
		}
		if (c == '.')
		{
			if (token_empty)
				return "it has an empty token (a leading, trailing or doubled dot)";
			token_empty = true;
			continue;
		}
		if (c <= 0x20 || c >= 0x7f)
			return "it has a space, a control character or a character that is not ASCII";
		if (c == '*' || c == '>')
			return "it has a wildcard (* or >), which is for subscribing";
		if (template && c == '}')
			return "only {topic} and {key} may stand in braces";
		token_empty = false;
	}
	if (token_empty)
		return "it has an empty token (a leading, trailing or doubled dot)";
	return NULL;
}

const char *
relay_nats_check_subject(const char *s, bool template)
{
	return nats_check_subject_len(s, strlen(s), template);
}

PG_FUNCTION_INFO_V1(outbox_check_nats_target);

/*
 * outbox.check_nats_target(url, subject): the checks of a NATS target's
 * options, for create_nats_target() and alter_target().
 */
Datum
outbox_check_nats_target(PG_FUNCTION_ARGS)
{
	char	   *url = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *subject = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	const char *why;

	if ((why = relay_nats_check_url(url)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid NATS server URL %s", url ? quote_literal_cstr(relay_url_shown(url)) : "NULL"),
				 errdetail("The URL is not usable: %s.", why),
				 errhint("Give nats://host:port (tls://host:port for TLS), or several separated by commas; user:password@ or token@ before the host log in, percent-encoded.")));
	if (subject == NULL || (why = relay_nats_check_subject(subject, true)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid NATS subject %s", subject ? quote_literal_cstr(subject) : "NULL"),
				 errdetail("The subject is not usable: %s.", subject ? why : "it is NULL"),
				 errhint("Give dot-separated tokens of printable ASCII, with {topic} or {key} standing for the message's topic or key, as in 'orders.{topic}'.")));
	PG_RETURN_VOID();
}

/*---- NATS credentials: a .creds file or an NKey seed ----*/

/* Length of an NKey user's public key, and of a seed, in base32. */
#define NATS_NKEY_PUBLIC_LEN	56
#define NATS_NKEY_SEED_LEN		58
/* The largest credentials file read. */
#define NATS_MAX_CREDS_FILE		65536

/* CRC-16/XMODEM, as NKeys append it (little-endian). */
static uint16
nats_crc16(const unsigned char *p, int len)
{
	uint16		crc = 0;
	int			i;
	int			b;

	for (i = 0; i < len; i++)
	{
		crc ^= (uint16) p[i] << 8;
		for (b = 0; b < 8; b++)
			crc = (crc & 0x8000) ? (uint16) ((crc << 1) ^ 0x1021) : (uint16) (crc << 1);
	}
	return crc;
}

static const char nats_base32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/* Base32 (RFC 4648, no padding) of len bytes into out (NUL-ended). */
static void
nats_b32_encode(const unsigned char *in, int len, char *out)
{
	int			bits = 0;
	uint32		acc = 0;
	int			i;

	for (i = 0; i < len; i++)
	{
		acc = (acc << 8) | in[i];
		bits += 8;
		while (bits >= 5)
		{
			*out++ = nats_base32[(acc >> (bits - 5)) & 31];
			bits -= 5;
		}
	}
	if (bits > 0)
		*out++ = nats_base32[(acc << (5 - bits)) & 31];
	*out = '\0';
}

/* Base32 of len characters into out; the bytes, or -1 when it is not base32. */
static int
nats_b32_decode(const char *in, int len, unsigned char *out)
{
	int			bits = 0;
	uint32		acc = 0;
	int			n = 0;
	int			i;

	for (i = 0; i < len; i++)
	{
		const char *c = strchr(nats_base32, in[i]);

		if (in[i] == '\0' || c == NULL)
			return -1;
		acc = (acc << 5) | (uint32) (c - nats_base32);
		bits += 5;
		if (bits >= 8)
		{
			out[n++] = (unsigned char) (acc >> (bits - 8));
			bits -= 8;
		}
	}
	return n;
}

/*
 * Whether text (a file's content) is a user's NKey seed ("SU...", white
 * space around it); with public_key, its public key ("U...") too.
 */
static bool
nats_seed_public(const char *text, char *public_key)
{
	unsigned char raw[40];
	unsigned char pub[35];
	const char *p = text;
	int			n;
	uint16		crc;
	EVP_PKEY   *key;
	size_t		publen = 32;
	bool		ok;

	while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
		p++;
	if (strncmp(p, "SU", 2) != 0 || strspn(p, nats_base32) != NATS_NKEY_SEED_LEN ||
		strspn(p + NATS_NKEY_SEED_LEN, " \r\n\t") != strlen(p + NATS_NKEY_SEED_LEN))
		return false;
	n = nats_b32_decode(p, NATS_NKEY_SEED_LEN, raw);
	crc = nats_crc16(raw, 34);
	/* the seed prefix (18 << 3) and the user prefix (20 << 3), the key, a CRC */
	ok = n == 36 && raw[0] == (144 | (160 >> 5)) && raw[1] == ((160 & 31) << 3) &&
		raw[34] == (crc & 0xFF) && raw[35] == (crc >> 8);
	if (!ok || public_key == NULL)
	{
		explicit_bzero(raw, sizeof(raw));
		return ok;
	}
	key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw + 2, 32);
	ok = key != NULL && EVP_PKEY_get_raw_public_key(key, pub + 1, &publen) == 1 && publen == 32;
	EVP_PKEY_free(key);
	explicit_bzero(raw, sizeof(raw));
	if (!ok)
		return false;
	pub[0] = 160;
	crc = nats_crc16(pub, 33);
	pub[33] = crc & 0xFF;
	pub[34] = crc >> 8;
	nats_b32_encode(pub, 35, public_key);
	return true;
}

/* Whether text is a .creds file: a user JWT, then an NKey seed, in armour. */
static bool
nats_is_creds(const char *text)
{
	const char *jwt = strstr(text, "-----BEGIN NATS USER JWT-----");
	const char *seed = strstr(text, "-----BEGIN USER NKEY SEED-----");

	return jwt != NULL && seed != NULL && jwt < seed &&
		strstr(jwt, "------END NATS USER JWT------") != NULL &&
		strstr(seed, "------END USER NKEY SEED------") != NULL;
}

/*
 * The credentials file at path, read: NULL with error (no secret in it)
 * when it cannot be read; palloc'd text, to be wiped and freed.
 */
static char *
nats_read_credentials(const char *path, char *error, size_t size)
{
	int			fd = OpenTransientFile(path, O_RDONLY | O_NONBLOCK | PG_BINARY);
	struct stat st;
	char	   *text;
	ssize_t		n = 0;

	if (fd < 0)
	{
		snprintf(error, size, "could not open credentials \"%s\": %s", path, strerror(errno));
		return NULL;
	}
	/* a regular file only: a FIFO or a device would make the relay wait */
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		snprintf(error, size, "credentials \"%s\" is not a regular file", path);
		CloseTransientFile(fd);
		return NULL;
	}
	if (st.st_size > NATS_MAX_CREDS_FILE)
	{
		snprintf(error, size, "credentials \"%s\" is larger than 64 kB: not a .creds file or an NKey seed", path);
		CloseTransientFile(fd);
		return NULL;
	}
	text = palloc0(NATS_MAX_CREDS_FILE + 2);
	/* one byte more than the most taken: a file grown since fstat is seen */
	while (n <= NATS_MAX_CREDS_FILE)
	{
		ssize_t		got = read(fd, text + n, NATS_MAX_CREDS_FILE + 1 - n);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
		{
			snprintf(error, size, "could not read credentials \"%s\": %s", path, strerror(errno));
			CloseTransientFile(fd);
			explicit_bzero(text, NATS_MAX_CREDS_FILE + 2);
			pfree(text);
			return NULL;
		}
		if (got == 0)
			break;
		n += got;
	}
	CloseTransientFile(fd);
	if (n > NATS_MAX_CREDS_FILE)
	{
		snprintf(error, size, "credentials \"%s\" is larger than 64 kB: not a .creds file or an NKey seed", path);
		explicit_bzero(text, NATS_MAX_CREDS_FILE + 2);
		pfree(text);
		return NULL;
	}
	text[n] = '\0';
	return text;
}

/*
 * Whether the credentials file at path is an NKey seed, with its public
 * key into public_key; false with error[0] '\0' for a .creds file, with
 * error set when it is neither, or cannot be read.
 */
static bool
nats_nkey_seed_public(const char *path, char *public_key, char *error, size_t size)
{
	char	   *text = nats_read_credentials(path, error, size);
	bool		seed;

	if (text == NULL)
		return false;
	error[0] = '\0';
	seed = nats_seed_public(text, public_key);
	if (!seed && !nats_is_creds(text))
		snprintf(error, size, "credentials \"%s\" is not a .creds file (a user JWT and its seed) or a user's NKey seed", path);
	explicit_bzero(text, NATS_MAX_CREDS_FILE + 2);
	pfree(text);
	return seed;
}

PG_FUNCTION_INFO_V1(outbox_check_nats_credentials);

/*
 * outbox.check_nats_credentials(path): whether the file is a .creds file
 * or a user's NKey seed, for create_nats_target() and alter_target().
 * Says nothing of what the file holds but that.
 */
Datum
outbox_check_nats_credentials(PG_FUNCTION_ARGS)
{
	char	   *path = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char		error[RELAY_MAX_ERROR_LEN + 1];
	char		public_key[NATS_NKEY_PUBLIC_LEN + 1];

	/* it reads a file as the server: as pg_read_server_files may */
	if (!has_privs_of_role(GetUserId(), ROLE_PG_READ_SERVER_FILES))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to read the credentials file \"%s\"", path),
				 errdetail("The relay reads credentials as the server."),
				 errhint("Only superusers and members of pg_read_server_files may name one.")));

	if (!nats_nkey_seed_public(path, public_key, error, sizeof(error)) && error[0] != '\0')
	{
		error[0] = pg_toupper((unsigned char) error[0]);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid NATS credentials file \"%s\"", path),
				 errdetail("%s.", error),
				 errhint("Give a .creds file as nsc or Synadia Cloud hand it out, or a file holding a user's NKey seed (SU...).")));
	}
	explicit_bzero(public_key, sizeof(public_key));
	PG_RETURN_VOID();
}

/*---- on the relay's thread ----*/

/* Block every signal around a libnats call that may start a thread. */
#define NATS_NO_SIGNALS(call) \
	do { \
		sigset_t	all_, old_; \
		sigfillset(&all_); \
		pthread_sigmask(SIG_SETMASK, &all_, &old_); \
		call; \
		pthread_sigmask(SIG_SETMASK, &old_, NULL); \
	} while (0)

static int
relay_nats_start(void)
{
	return relay_wake_pipe(wake_pipe);
}

static void nats_dial_forget(RelayNatsTarget *nt);
static void nats_dispose(natsConnection *nc, natsSubscription *sub);

/*
 * Close a target's connection (on a thread: closing takes libnats' lock of
 * it, which a write to a server that reads nothing may hold), or give up
 * the one being made.  What comes of it afterwards names no target.
 */
static void
nats_disconnect(RelayNatsTarget *nt)
{
	nats_dial_forget(nt);
	if (nt->nc != NULL || nt->sub != NULL)
		nats_dispose(nt->nc, nt->sub);
	nt->nc = NULL;
	nt->sub = NULL;
	nt->serial = 0;
	nt->lost = false;
}

static void
relay_nats_stop(void)
{
	ListCell   *lc;
	int			running;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_NATS && t->priv != NULL)
			nats_disconnect(NATS_TARGET(t));
	}
	/*
	 * Connections being made or closed have their threads inside libnats
	 * (and OpenSSL), which closing the library, or the process's exit
	 * handlers, would pull from under them: wait for them, a while (a
	 * connection being made to a server that does not answer takes up to
	 * its timeout).  Those still running then are ended by the exit.
	 */
	pthread_mutex_lock(&events_lock);
	{
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += NATS_STOP_WAIT_S;
		while (dials_running > 0 &&
			   pthread_cond_timedwait(&dials_ended, &events_lock, &until) == 0)
			;
	}
	running = dials_running;
	pthread_mutex_unlock(&events_lock);
	if (nats_opened && running == 0)
		nats_CloseAndWait(2000);
	nats_opened = false;
	/*
	 * Replies left.  A deliverer thread that outlived the wait may still
	 * queue one afterwards, which the process's exit frees (this runs as
	 * the relay exits).
	 */
	pthread_mutex_lock(&events_lock);
	while (replies_head != NULL)
	{
		NatsReply  *next = replies_head->next;

		free(replies_head);
		replies_head = next;
	}
	replies_tail = NULL;
	replies_count = 0;
	replies_bytes = 0;
	pthread_mutex_unlock(&events_lock);
}

/*
 * Host names are resolved in the background (relay_conn.c's lookups): a
 * slow DNS server must not stop the relay (its other targets wait on this
 * thread).  Drop the lookups of a target.
 */
static void
nats_lookups_forget(RelayNatsTarget *nt)
{
	int			i;

	for (i = 0; i < nt->nlookups; i++)
		relay_lookup_forget(nt->lookups[i]);
	nt->nlookups = 0;
}

/*
 * Start resolving the url's hosts (an address comes back at once).
 * Returns why the url cannot
 * be used, or NULL.  The url's parts are parsed in the caller's
 * (short-lived) memory context.
 */
static const char *
nats_lookups_start(RelayTarget *t, RelayNatsTarget *nt)
{
	char	   *hosts[NATS_MAX_SERVERS];
	int			ports[NATS_MAX_SERVERS];
	int			nhosts = 0;
	int			i;

	nats_lookups_forget(nt);
	if (nats_parse_url(t->url, hosts, ports, &nhosts, NULL) != NULL)
		return "the url is not usable";
	for (i = 0; i < nhosts; i++)
	{
		RelayLookup *l = relay_lookup_start(hosts[i], ports[i], nt->refused, sizeof(nt->refused));

		if (l == NULL)
		{
			nats_lookups_forget(nt);
			return nt->refused;
		}
		nt->lookups[nt->nlookups++] = l;
	}
	return NULL;
}

/*
 * Once every lookup has ended: the addresses the destination rules allow,
 * as nats://address:port strings (palloc'd) in servers.  Returns the
 * number kept, with none nt->refused saying why; or -1 while a lookup is
 * still running.
 */
static int
nats_allowed_servers(RelayNatsTarget *nt, char **servers)
{
	int			n = 0;
	int			i;

	for (i = 0; i < nt->nlookups; i++)
		if (relay_lookup_running(nt->lookups[i]))
			return -1;
	nt->refused[0] = '\0';
	for (i = 0; i < nt->nlookups && n < NATS_MAX_SERVERS; i++)
	{
		struct sockaddr_storage addrs[NATS_MAX_SERVERS];
		socklen_t	lens[NATS_MAX_SERVERS];
		int			k;
		int			got = relay_lookup_allowed(nt->lookups[i], addrs, lens, NATS_MAX_SERVERS - n,
											   nt->refused, sizeof(nt->refused));

		for (k = 0; k < got; k++)
		{
			char		addr[INET6_ADDRSTRLEN + 8];

			relay_sockaddr_text((struct sockaddr *) &addrs[k], addr, sizeof(addr));
			servers[n++] = psprintf("nats://%s", addr);
		}
	}
	return n;
}

/* The target's TLS and credentials files, as one string to compare. */
static char *
nats_files(RelayTarget *t)
{
	return psprintf("%s\n%s\n%s\n%s", t->ca_file ? t->ca_file : "",
					t->client_cert ? t->client_cert : "", t->client_key ? t->client_key : "",
					t->credentials ? t->credentials : "");
}

/*
 * TLS and the login, as the url and the target's files say: tls:// with
 * the host name checked in the server's certificate (ca_file, client_cert
 * and client_key), user and password or a token from the url, a .creds
 * file or an NKey seed file (credentials).  Returns why they cannot be
 * used, or NULL.
 */
static char *
nats_strdup_or_null(const char *s, bool *failed)
{
	char	   *copy;

	if (s == NULL)
		return NULL;
	copy = strdup(s);
	if (copy == NULL)
		*failed = true;
	return copy;
}

static const char *
nats_auth_options(RelayTarget *t, natsOptions *opts, NatsTlsPlan *tls, char *error, size_t size)
{
	char	   *hosts[NATS_MAX_SERVERS];
	int			ports[NATS_MAX_SERVERS];
	int			n;
	NatsUrlAuth a;
	natsStatus	s = NATS_OK;
	const char *what = NULL;
	const char *bad = NULL;

	if (nats_parse_url(t->url, hosts, ports, &n, &a) != NULL)
		return "the url is not usable";
	if (a.tls)
	{
		bool		failed = false;

		if (t->client_cert != NULL || t->ca_file != NULL)
		{
			RelayConnTls files = {true, t->ca_file, t->client_cert, t->client_key};

			/* libnats would prompt for an encrypted key's passphrase, and wait */
			if (!relay_tls_files_load(&files, error, size))
				bad = error;
		}
		/* set on the connection's thread (nats_dial_tls()) */
		tls->on = true;
		tls->ca_file = nats_strdup_or_null(t->ca_file, &failed);
		tls->cert = nats_strdup_or_null(t->client_cert, &failed);
		tls->key = nats_strdup_or_null(t->client_key ? t->client_key : t->client_cert, &failed);
		tls->host = nats_strdup_or_null(hosts[0], &failed);
		if (failed && bad == NULL)
			bad = "out of memory";
	}
	if (s == NATS_OK && bad == NULL && a.user != NULL)
	{
		what = "the user";
		s = natsOptions_SetUserInfo(opts, a.user, a.password);
	}
	else if (s == NATS_OK && bad == NULL && a.token != NULL)
	{
		what = "the token";
		s = natsOptions_SetToken(opts, a.token);
	}
	if (s == NATS_OK && bad == NULL && t->credentials != NULL)
	{
		char		public_key[NATS_NKEY_PUBLIC_LEN + 1];

		what = "credentials";
		if (nats_nkey_seed_public(t->credentials, public_key, error, size))
			s = natsOptions_SetNKeyFromSeed(opts, public_key, t->credentials);
		else if (error[0] != '\0')
			bad = error;
		else
			s = natsOptions_SetUserCredentialsFromFiles(opts, t->credentials, NULL);
	}
	/* the secrets, gone from this memory (libnats keeps its copies) */
	if (a.password)
		memset(a.password, 0, strlen(a.password));
	if (a.token)
		memset(a.token, 0, strlen(a.token));
	if (bad != NULL)
		return bad;
	if (s != NATS_OK)
	{
		const char *last = nats_GetLastError(NULL);

		snprintf(error, size, "libnats refused %s: %s", what,
				 last && *last ? last : natsStatus_GetText(s));
		return error;
	}
	return NULL;
}

/*
 * A connection being made.  natsConnection_Connect() makes its first
 * attempt before it returns (for up to the connection's timeout, and
 * once for each server), so it runs on a thread of its own, started with
 * every signal blocked, which then subscribes the inbox and wakes the
 * relay through the pipe.  The relay and that thread share the struct
 * under events_lock; the last of them frees it: the relay once it took
 * what was made, the thread when the relay gave the connection up meanwhile
 * (the target dropped or changed).
 */
typedef struct NatsDial
{
	natsOptions *opts;			/* the thread's, which destroys them */
	NatsTlsPlan tls;			/* the thread's, which frees it */
	char		filter[80];		/* the inbox subscribed: <inbox>.> */
	uint64		serial;			/* the connection's */
	/* the thread's work, once done */
	natsConnection *nc;
	natsSubscription *sub;
	natsStatus	status;
	char		error[RELAY_MAX_ERROR_LEN + 1];	/* libnats' words, if failed */
	/* under events_lock */
	bool		done;
	bool		abandoned;
} NatsDial;

static void nats_thread_ended(void);

static void
nats_tls_plan_free(NatsTlsPlan *tls)
{
	free(tls->ca_file);
	free(tls->cert);
	free(tls->key);
	free(tls->host);
	memset(tls, 0, sizeof(*tls));
}

/* The TLS options of the plan, on the connection's thread; *what names the one refused. */
static natsStatus
nats_dial_tls(natsOptions *opts, const NatsTlsPlan *tls, const char **what)
{
	natsStatus	s = NATS_OK;

	if (!tls->on)
		return NATS_OK;
	*what = "TLS";
	s = natsOptions_SetSecure(opts, true);
	if (s == NATS_OK && tls->ca_file != NULL)
	{
		*what = "ca_file";
		s = natsOptions_LoadCATrustedCertificates(opts, tls->ca_file);
	}
	if (s == NATS_OK && tls->cert != NULL)
	{
		*what = "client_cert or client_key";
		s = natsOptions_LoadCertificatesChain(opts, tls->cert, tls->key);
	}
	if (s == NATS_OK)
	{
		*what = "the host name to check";
		s = natsOptions_SetExpectedHostname(opts, tls->host);
	}
	return s;
}

/* The thread of a NatsDial: libnats calls only. */
static void *
nats_dial_main(void *arg)
{
	NatsDial   *d = (NatsDial *) arg;
	natsConnection *nc = NULL;
	natsSubscription *sub = NULL;
	natsStatus	s;
	bool		abandoned;

	char		error[RELAY_MAX_ERROR_LEN + 1] = "";
	const char *what = NULL;

	s = nats_dial_tls(d->opts, &d->tls, &what);
	nats_tls_plan_free(&d->tls);
	if (s != NATS_OK)
	{
		const char *last = nats_GetLastError(NULL);

		snprintf(error, sizeof(error), "libnats refused %s: %s", what,
				 last && *last ? last : natsStatus_GetText(s));
	}
	/* One attempt (each server in turn); a failure's reason is kept. */
	else
		s = natsConnection_Connect(&nc, d->opts);
	if (s == NATS_OK)
		s = natsConnection_Subscribe(&sub, nc, d->filter, nats_reply_cb,
									 (void *) (uintptr_t) d->serial);
	if (s == NATS_OK)
		s = natsSubscription_SetPendingLimits(sub, 1000000, 256 * 1024 * 1024);
	if (s != NATS_OK && error[0] == '\0')
	{
		const char *last = nats_GetLastError(NULL);

		snprintf(error, sizeof(error), "%s", last && *last ? last : natsStatus_GetText(s));
	}
	natsOptions_Destroy(d->opts);
	d->opts = NULL;

	pthread_mutex_lock(&events_lock);
	abandoned = d->abandoned;
	if (!abandoned)
	{
		d->nc = nc;
		d->sub = sub;
		d->status = s;
		memcpy(d->error, error, sizeof(error));
		d->done = true;
	}
	pthread_mutex_unlock(&events_lock);
	/* d is the relay's from here unless abandoned */
	if (abandoned)
	{
		if (sub != NULL)
			natsSubscription_Destroy(sub);
		if (nc != NULL)
			natsConnection_Destroy(nc);
		free(d);
	}
	else
	{
		char		c = 1;

		/* (a full pipe has woken the relay already) */
		if (write(wake_pipe[1], &c, 1) < 0)
			c = 0;
	}
	nats_thread_ended();
	return NULL;
}

/* A thread of the NATS connections ends (the last thing it does). */
static void
nats_thread_ended(void)
{
	pthread_mutex_lock(&events_lock);
	dials_running--;
	pthread_cond_broadcast(&dials_ended);
	pthread_mutex_unlock(&events_lock);
}

/* Start a detached thread that takes no signal; false if none could be. */
static bool
nats_thread_start(void *(*main) (void *), void *arg, char *error, size_t size)
{
	pthread_attr_t attr;
	pthread_t	thread;
	int			rc;

	pthread_mutex_lock(&events_lock);
	dials_running++;
	pthread_mutex_unlock(&events_lock);
	rc = pthread_attr_init(&attr);
	if (rc == 0)
	{
		rc = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		/* its threads, and libnats' it starts, take no signal */
		if (rc == 0)
			NATS_NO_SIGNALS(rc = pthread_create(&thread, &attr, main, arg));
		pthread_attr_destroy(&attr);
	}
	if (rc != 0)
	{
		nats_thread_ended();
		if (error != NULL)
			snprintf(error, size, "could not start a thread: %s", strerror(rc));
		return false;
	}
	return true;
}

/* What a closing thread closes. */
typedef struct NatsClosing
{
	natsConnection *nc;
	natsSubscription *sub;
} NatsClosing;

static void *
nats_close_main(void *arg)
{
	NatsClosing *c = (NatsClosing *) arg;

	if (c->sub != NULL)
		natsSubscription_Destroy(c->sub);
	if (c->nc != NULL)
		natsConnection_Destroy(c->nc);
	free(c);
	nats_thread_ended();
	return NULL;
}

/* Close and free a connection and its subscription, on a thread if one can be had. */
static void
nats_dispose(natsConnection *nc, natsSubscription *sub)
{
	NatsClosing *c = malloc(sizeof(NatsClosing));

	if (c != NULL)
	{
		c->nc = nc;
		c->sub = sub;
		if (nats_thread_start(nats_close_main, c, NULL, 0))
			return;
		free(c);
	}
	if (sub != NULL)
		natsSubscription_Destroy(sub);
	if (nc != NULL)
		natsConnection_Destroy(nc);
}

/* Give up the connection being made, if any (its thread may go on). */
static void
nats_dial_forget(RelayNatsTarget *nt)
{
	NatsDial   *d = nt->dial;
	bool		done;

	if (d == NULL)
		return;
	nt->dial = NULL;
	pthread_mutex_lock(&events_lock);
	done = d->done;
	if (!done)
		d->abandoned = true;
	pthread_mutex_unlock(&events_lock);
	if (done)
	{
		if (d->nc != NULL || d->sub != NULL)
			nats_dispose(d->nc, d->sub);
		free(d);
	}
}

/*
 * Start making the connection to the given servers (the options of
 * relay_nats_connect()'s).  Returns why it could not be started, or NULL.
 */
static const char *
nats_dial_start(RelayTarget *t, char **servers, int n)
{
	RelayNatsTarget *nt = NATS_TARGET(t);
	natsOptions *opts = NULL;
	natsStatus	s;
	NatsDial   *d;
	natsInbox  *inbox = NULL;
	int			running;
	const char *bad_auth;
	NatsTlsPlan tls;

	memset(&tls, 0, sizeof(tls));
	pthread_mutex_lock(&events_lock);
	running = dials_running;
	pthread_mutex_unlock(&events_lock);
	if (running >= NATS_MAX_DIALS)
	{
		snprintf(nt->refused, sizeof(nt->refused),
				 "%d connections to NATS servers are being made already (some for targets since dropped or changed); this one waits for them to end",
				 running);
		return nt->refused;
	}
	if (!nats_opened)
	{
		NATS_NO_SIGNALS(s = nats_Open(-1));
		if (s != NATS_OK)
			return "could not initialise libnats";
		nats_opened = true;
	}
	nt->serial = next_conn_serial++;

	s = natsOptions_Create(&opts);
	if (s == NATS_OK)
		s = natsOptions_SetServers(opts, (const char **) servers, n);
	if (s == NATS_OK)
		s = natsOptions_SetIgnoreDiscoveredServers(opts, true);
	bad_auth = s == NATS_OK ? nats_auth_options(t, opts, &tls, nt->refused, sizeof(nt->refused)) : NULL;
	if (bad_auth != NULL)
	{
		if (bad_auth != nt->refused)
			strlcpy(nt->refused, bad_auth, sizeof(nt->refused));
		natsOptions_Destroy(opts);
		nats_tls_plan_free(&tls);
		return nt->refused;
	}
	/*
	 * A target that can have many messages waiting for acknowledgements
	 * publishes through libnats' write buffer, which its flusher thread
	 * writes at most a millisecond after the first of them, as a bare
	 * publisher's are: sending each at once cost a send() and the server's
	 * wake-up per message, a quarter of the relay's CPU.  One that waits
	 * for each acknowledgement (strict, or few lanes of small requests)
	 * sends each at once (SendAsap): the millisecond would be its pace.
	 * Decided when the connection is made.
	 */
	if (s == NATS_OK)
		s = natsOptions_SetSendAsap(opts, t->strict ||
									t->nlanes * t->batch_size < NATS_BUFFERED_MIN_IN_FLIGHT);
	if (s == NATS_OK)
		s = natsOptions_SetName(opts, "outbox relay");
	if (s == NATS_OK)
		s = natsOptions_SetTimeout(opts, Min(t->timeout_ms, NATS_CONNECT_MAX_MS));
	/*
	 * No reconnecting by libnats: its reconnecting thread holds the
	 * connection's lock through each attempt's handshake (up to the
	 * timeout), which any call of the relay's on the connection would wait
	 * for.  A connection lost is told (nats_disconnected_cb()) and made
	 * anew by the relay, on a thread, as the first one.  Writes have a
	 * deadline (at least NATS_WRITE_MIN_MS: a server slow to read for a
	 * moment keeps the connection), so a server that stops reading holds a
	 * publish that long at most, once, and loses the connection.
	 */
	if (s == NATS_OK)
		s = natsOptions_SetAllowReconnect(opts, false);
	if (s == NATS_OK)
		s = natsOptions_SetWriteDeadline(opts, Min(Max(t->timeout_ms, NATS_WRITE_MIN_MS),
													NATS_CONNECT_MAX_MS));
	if (s == NATS_OK)
		s = natsOptions_SetPingInterval(opts, 5000);
	if (s == NATS_OK)
		s = natsOptions_SetMaxPingsOut(opts, 2);
	if (s == NATS_OK)
		s = natsOptions_SetDisconnectedCB(opts, nats_disconnected_cb,
										  (void *) (uintptr_t) nt->serial);
	if (s == NATS_OK)
		s = natsOptions_SetClosedCB(opts, nats_disconnected_cb,
									(void *) (uintptr_t) nt->serial);
	if (s == NATS_OK)
		s = natsInbox_Create(&inbox);
	if (s != NATS_OK)
	{
		if (opts)
			natsOptions_Destroy(opts);
		nats_tls_plan_free(&tls);
		snprintf(nt->refused, sizeof(nt->refused), "could not set up the NATS connection: %s",
				 natsStatus_GetText(s));
		return nt->refused;
	}
	strlcpy(nt->inbox, inbox, sizeof(nt->inbox));
	natsInbox_Destroy(inbox);

	d = calloc(1, sizeof(NatsDial));
	if (d == NULL)
	{
		natsOptions_Destroy(opts);
		nats_tls_plan_free(&tls);
		return "out of memory";
	}
	d->opts = opts;
	d->tls = tls;
	d->serial = nt->serial;
	snprintf(d->filter, sizeof(d->filter), "%s.>", nt->inbox);

	if (!nats_thread_start(nats_dial_main, d, nt->refused, sizeof(nt->refused)))
	{
		natsOptions_Destroy(opts);
		nats_tls_plan_free(&d->tls);
		free(d);
		return nt->refused;
	}
	nt->dial = d;
	nt->lost = false;
	return NULL;
}

/*
 * Why the target's connection could not be made, from libnats' words
 * (printable ASCII only: the server's words may be in them), in
 * nt->refused.
 */
static void
nats_failed_text(RelayTarget *t, const char *libnats)
{
	RelayNatsTarget *nt = NATS_TARGET(t);
	bool		tls = t->url[strspn(t->url, " ")] == 't';
	const char *hint = "";
	char	   *c;

	/* libnats puts where in its code first: "(conn.c:733): " */
	if (libnats[0] == '(' && (c = strstr(libnats, "): ")) != NULL && c - libnats < 40)
		libnats = c + 3;
	if (strstr(libnats, "No server available") != NULL)
		hint = tls ? " (down, or it did not answer, or the TLS handshake failed)" :
			" (down, or it did not answer)";
	else if (strstr(libnats, "Expected 'PONG', got ''") != NULL)
		hint = tls ? " (the server closed the connection in the handshake: does it want a client certificate?)" :
			" (the server closed the connection in the handshake)";
	snprintf(nt->refused, sizeof(nt->refused), "could not connect to the NATS server: %s%s", libnats, hint);
	for (c = nt->refused; *c; c++)
		if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
			*c = '?';
}

/* Where the target's connection is (nats_connect()). */
typedef enum NatsConnState
{
	NATS_CONN_READY,			/* made, not lost */
	NATS_CONN_WAIT,				/* being made: the relay is woken */
	NATS_CONN_FAILED			/* cannot be made now: why */
} NatsConnState;

/*
 * Move the target's connection on, without waiting: resolve the servers'
 * names (relay_conn.c's lookups, polled), keep the addresses the
 * destination rules allow, and make the connection on a thread
 * (nats_dial_start()); one made for another url, other files or other
 * destination rules is given up first.  Returns READY, WAIT while a lookup
 * or the thread runs, or FAILED with *why; a failure starts over at the
 * next call.
 */
static NatsConnState
nats_connect(RelayTarget *t, const char **why)
{
	RelayNatsTarget *nt = NATS_TARGET(t);
	char	   *servers[NATS_MAX_SERVERS];
	int			n;
	int			i;
	MemoryContext oldcxt;
	MemoryContext tmpcxt;
	char	   *files = nats_files(t);
	const char *bad;

	*why = NULL;
	if (nt->url == NULL || strcmp(nt->url, t->url) != 0 || nt->files == NULL ||
		strcmp(nt->files, files) != 0 || nt->destinations != outbox_destinations_generation)
	{
		/* other settings: what was made or started for the old ones goes */
		nats_disconnect(nt);
		nats_lookups_forget(nt);
		oldcxt = MemoryContextSwitchTo(t->cxt);
		if (nt->url)
			pfree(nt->url);
		nt->url = NULL;			/* (pstrdup may throw) */
		if (nt->files)
			pfree(nt->files);
		nt->files = NULL;
		nt->url = pstrdup(t->url);
		nt->files = pstrdup(files);
		MemoryContextSwitchTo(oldcxt);
		nt->destinations = outbox_destinations_generation;
	}
	pfree(files);
	if (nt->nc != NULL && !nt->lost)
		return NATS_CONN_READY;
	if (nt->nc != NULL)
		nats_disconnect(nt);	/* lost: made anew below */
	if (nt->dial != NULL)
	{
		NatsDial   *d = nt->dial;
		bool		done;

		pthread_mutex_lock(&events_lock);
		done = d->done;
		pthread_mutex_unlock(&events_lock);
		if (!done)
			return NATS_CONN_WAIT;
		nt->dial = NULL;
		nt->nc = d->nc;
		nt->sub = d->sub;
		if (d->status != NATS_OK)
		{
			nats_failed_text(t, d->error);
			free(d);
			nats_disconnect(nt);
			*why = nt->refused;
			return NATS_CONN_FAILED;
		}
		free(d);
		if (!nt->lost)
			return NATS_CONN_READY;
		/* made, and lost before it was taken: made anew below */
		nats_disconnect(nt);
	}

	/* The servers' addresses first: an address comes back at once. */
	tmpcxt = AllocSetContextCreate(CurrentMemoryContext, "outbox NATS connect",
								   ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(tmpcxt);
	if (nt->nlookups == 0 && (bad = nats_lookups_start(t, nt)) != NULL)
	{
		MemoryContextSwitchTo(oldcxt);
		snprintf(nt->refused, sizeof(nt->refused), "could not resolve the servers: %s", bad);
		MemoryContextDelete(tmpcxt);
		*why = nt->refused;
		return NATS_CONN_FAILED;
	}
	for (i = 0; i < nt->nlookups; i++)
		if (relay_lookup_running(nt->lookups[i]))
		{
			MemoryContextSwitchTo(oldcxt);
			MemoryContextDelete(tmpcxt);
			return NATS_CONN_WAIT;
		}
	n = nats_allowed_servers(nt, servers);
	/* used: a connection made later (a failure's) resolves anew */
	nats_lookups_forget(nt);
	bad = n > 0 ? nats_dial_start(t, servers, n) : nt->refused;
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(tmpcxt);
	if (bad != NULL)
	{
		*why = bad;
		return NATS_CONN_FAILED;
	}
	return NATS_CONN_WAIT;
}

static void
relay_nats_target_init(RelayTarget *t)
{
	RelayNatsTarget *nt = MemoryContextAllocZero(t->cxt, sizeof(RelayNatsTarget));
	MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

	initStringInfo(&nt->subject);
	initStringInfo(&nt->reply);
	initStringInfo(&nt->value);
	MemoryContextSwitchTo(oldcxt);
	t->priv = nt;
}

/* After its lanes: the target's connection is closed. */
static void
relay_nats_target_release(RelayTarget *t)
{
	nats_disconnect(NATS_TARGET(t));
	nats_lookups_forget(NATS_TARGET(t));
	t->priv = NULL;
}

static void
relay_nats_lane_release(RelayLane *lane)
{
	if (lane->in_flight)
		requests_in_flight--;
	relay_acks_lane_release(lane);
}

/*
 * The message's subject: the template with {topic} and {key} filled in.
 * Returns why it is not a subject, or NULL.
 */
/* Whether the subject template can be filled in for m (a key if it needs one). */
static bool
nats_filled(RelayTarget *t, RelayMessage *m)
{
	return m->key != NULL || strstr(t->subject, "{key}") == NULL;
}

static const char *
nats_subject(RelayTarget *t, RelayMessage *m, StringInfo buf)
{
	/* replies: clients' inboxes, the server's service imports and gateways */
	static const char *const reply_prefixes[] = {"_INBOX.", "_R_.", "_GR_."};
	const char *bad;
	int			i;

	if (!relay_template_fill(t->subject, m, buf))
		return "the subject template has {key} and the message has no key, or an empty one";
	if ((bad = nats_check_subject_len(buf->data, buf->len, false)) != NULL)
		return bad;

	/*
	 * The server's own namespaces (I10): "$..." is its API ($JS.API, $KV,
	 * $SYS ...), which takes a publish with a reply subject as a request,
	 * and "_INBOX.", "_R_.", "_GR_." are where requests are answered (the
	 * relay's own acknowledgements among them).  A message's topic or key
	 * reaches them only where the template's literal text does.
	 */
	if (buf->data[0] == '$' && t->subject[0] != '$')
		return "it begins with \"$\", the server's API namespace, which only the target's subject template may name";
	for (i = 0; i < lengthof(reply_prefixes); i++)
		if (strncmp(buf->data, reply_prefixes[i], strlen(reply_prefixes[i])) == 0 &&
			strncmp(t->subject, reply_prefixes[i], strlen(reply_prefixes[i])) != 0)
			return "it begins as the subjects where replies go do (_INBOX., _R_., _GR_.), which only the target's subject template may name";
	return NULL;
}

/*
 * The header JetStream de-duplicates by.  nats-server (2.9, 2.10) looks it
 * up as the first occurrence of this text anywhere in the header block,
 * and the block's order is libnats' hash order: the text in another
 * header's name or value can hide the relay's own (a copy sent again is
 * then stored again), so a message carrying it is not published (I10).
 */
#define NATS_MSG_ID "Nats-Msg-Id"

/*
 * A header of the message that is not published as it is: one carrying
 * NATS_MSG_ID's text, or one whose value is only blanks, which libnats (the
 * C client) reads as empty, taking the next header's line for its value.
 * The first such header's name goes into bad (OUTBOX_MAX_HEADER_NAME_LEN + 1
 * bytes) and *why says what it is.
 */
static void
nats_check_header(const char *name, const char *value, char *bad, const char **why)
{
	if (*bad != '\0')
		return;
	if (strstr(name, NATS_MSG_ID) != NULL || strstr(value, NATS_MSG_ID) != NULL)
		*why = "carries the text \"" NATS_MSG_ID "\", which nats-server can take for the relay's de-duplication header";
	else if (*value != '\0' && value[strspn(value, " \t")] == '\0')
		*why = "holds only blanks, which libnats (the C client) reads as an empty value and then takes the next header's line for it";
	else
		return;
	strlcpy(bad, name, OUTBOX_MAX_HEADER_NAME_LEN + 1);
}

/* Set a relay's header of msg (see nats_check_header()). */
static natsStatus
nats_header(natsMsg *msg, const char *name, const char *value, char *bad, const char **why)
{
	nats_check_header(name, value, bad, why);
	return natsMsgHeader_Set(msg, name, value);
}

/*
 * Publish the lane's next request: the cut_n messages at its head, each
 * with its own reply subject.  Returns false, with *failed set, when not
 * one could be published.
 */
static bool nats_publish(RelayLane *lane);

/*
 * Start the lane's request.  While the target's connection is being made
 * the request is parked: in flight with nothing sent (RelayAcks.nsent 0)
 * until relay_nats_drive() publishes it, or gives it up at its deadline.
 */
static bool
relay_nats_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayAcks  *nl = NATS_LANE(lane);
	const char *why = NULL;
	NatsConnState state;

	Assert(!lane->in_flight && lane->nqueued > 0);
	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", lane->head->topic);

	state = nats_connect(t, &why);
	if (state == NATS_CONN_FAILED)
	{
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = why;
		return false;
	}
	relay_acks_begin(nl, lane->cut_n, t->cxt);
	lane->nbatch = lane->cut_n;
	if (state == NATS_CONN_READY && !nats_publish(lane))
	{
		failed->kind = nl->bad_kind;
		failed->error = nl->bad_error;
		return false;
	}
	nl->deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), t->timeout_ms);
	lane->in_flight = true;
	requests_in_flight++;
	return true;
}

/*
 * Publish the lane's request, begun in nl, on the target's connection.
 * Returns whether any message was published; the first that was not is
 * marked bad in nl.
 */
static bool
nats_publish(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	RelayNatsTarget *nt = NATS_TARGET(t);
	RelayAcks  *nl = NATS_LANE(lane);
	RelayMessage *m;
	char		number[32];
	int			i;


	for (m = lane->head, i = 0; i < lane->cut_n; m = m->next, i++)
	{
		natsMsg    *msg = NULL;
		natsStatus	s;
		const char *bad = nats_subject(t, m, &nt->subject);
		char		bad_header[OUTBOX_MAX_HEADER_NAME_LEN + 1];
		const char *bad_why = NULL;
		char	   *p;

		if (bad != NULL || m->foreign_reply)
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];
			char		shown[RELAY_SHOWN_LEN];

			relay_shown(shown, sizeof(shown), nt->subject.data, nt->subject.len);
			if (bad == NULL)
				snprintf(error, sizeof(error), NATS_FOREIGN_REPLY, shown);
			else if (!nats_filled(t, m))
				strlcpy(error, bad, sizeof(error));
			else
				snprintf(error, sizeof(error), "%s: the subject \"%s\" is not one to publish to", bad, shown);
			relay_acks_bad(nl, i, RELAY_REJECTED, error);
			break;
		}
		bad_header[0] = '\0';
		resetStringInfo(&nt->reply);
		appendStringInfoString(&nt->reply, nt->inbox);
		appendStringInfoChar(&nt->reply, '.');
		relay_append_int64(&nt->reply, lane->index);
		appendStringInfoChar(&nt->reply, '.');
		relay_append_int64(&nt->reply, nl->request);
		appendStringInfoChar(&nt->reply, '.');
		relay_append_int64(&nt->reply, i);
		appendStringInfoChar(&nt->reply, '.');
		relay_append_int64(&nt->reply, m->id);
		if (t->format == RELAY_FORMAT_CE_STRUCTURED)
		{
			resetStringInfo(&nt->value);
			relay_ce_structured(t, m, &nt->value);
			s = natsMsg_Create(&msg, nt->subject.data, nt->reply.data, nt->value.data,
							   nt->value.len);
			if (s == NATS_OK)
				s = nats_header(msg, "content-type", "application/cloudevents+json", bad_header, &bad_why);
		}
		else
			s = natsMsg_Create(&msg, nt->subject.data, nt->reply.data, m->payload,
							   m->payload_len);
		if (s == NATS_OK && t->format == RELAY_FORMAT_CE_BINARY)
		{
			RelayCeAttrs a;
			char		name[32];
			int			j;

			/* The NATS binding's binary mode: ce- headers, content-type. */
			relay_ce_attrs(t, m, &a);
			for (j = 0; s == NATS_OK && j < a.n; j++)
			{
				if (strcmp(a.name[j], "datacontenttype") == 0)
					s = nats_header(msg, "content-type", a.value[j], bad_header, &bad_why);
				else
				{
					snprintf(name, sizeof(name), "ce-%s", a.name[j]);
					s = nats_header(msg, name, a.value[j], bad_header, &bad_why);
				}
			}
		}
		if (s == NATS_OK)
			s = natsMsgHeader_Set(msg, NATS_MSG_ID, m->msg_id);
		if (s == NATS_OK)
			s = nats_header(msg, "webhook-id", m->msg_id, bad_header, &bad_why);
		/* a CloudEvent carries them as attributes: no outbox-* copies */
		pg_lltoa(m->id, number);
		if (s == NATS_OK && t->format == RELAY_FORMAT_OUTBOX)
			s = nats_header(msg, "outbox-seq", number, bad_header, &bad_why);
		if (s == NATS_OK && t->format == RELAY_FORMAT_OUTBOX)
			s = nats_header(msg, "outbox-topic", m->topic, bad_header, &bad_why);
		/* (an empty value: libnats would read the next line as it) */
		if (s == NATS_OK && t->format == RELAY_FORMAT_OUTBOX && m->key != NULL && *m->key)
			s = nats_header(msg, "outbox-key", m->key, bad_header, &bad_why);
		/* The message's own headers: "Name: value" lines, NUL-separated. */
		for (p = m->header_lines; s == NATS_OK && p != NULL && *p; p += strlen(p) + 1)
		{
			int			name_len = strcspn(p, ":;");
			const char *value = p[name_len] == ':' ? p + name_len + 1 : "";
			char		name[OUTBOX_MAX_HEADER_NAME_LEN + 1];

			/*
			 * JetStream acts on nats-* headers: never a message's own; nor
			 * ce-* or content-type in a CloudEvent, which are the relay's.
			 * Nor one with an empty value ("Name;"): libnats, the C client,
			 * reads the next header's line as its value (docs/brokers.md).
			 */
			if (name_len == 0 || name_len >= (int) sizeof(name) || *value == '\0' ||
				outbox_header_name_is(p, name_len, "nats-", false) ||
				(t->format != RELAY_FORMAT_OUTBOX && relay_ce_owned_header(p)))
				continue;
			memcpy(name, p, name_len);
			name[name_len] = '\0';
			if (*value == ' ')
				value++;
			nats_check_header(name, value, bad_header, &bad_why);
			s = natsMsgHeader_Add(msg, name, value);
		}
		if (s == NATS_OK && bad_header[0] != '\0')
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];
			char		shown[RELAY_SHOWN_LEN];

			natsMsg_Destroy(msg);
			relay_shown(shown, sizeof(shown), bad_header, strlen(bad_header));
			snprintf(error, sizeof(error), "its header \"%s\" %s: not published", shown, bad_why);
			relay_acks_bad(nl, i, RELAY_REJECTED, error);
			break;
		}
		if (s == NATS_OK)
			s = natsConnection_PublishMsg(nt->nc, msg);
		if (msg)
			natsMsg_Destroy(msg);
		if (s != NATS_OK)
		{
			char		error[RELAY_MAX_ERROR_LEN + 1];

			snprintf(error, sizeof(error), "could not publish to NATS: %s", natsStatus_GetText(s));
			/* closed without its event (the queue was full): made anew */
			if (natsConnection_IsClosed(nt->nc))
				nt->lost = true;
			/* Too large for the server: the message's fault, not the target's. */
			relay_acks_bad(nl, i, s == NATS_MAX_PAYLOAD ? RELAY_REJECTED :
						  i == 0 ? RELAY_RECEIVER_FAILED : RELAY_RETRY, error);
			break;
		}
		nl->nsent++;
	}
	/* a structured event's buffer that grew for a large one is given back */
	if (nt->value.maxlen > 256 * 1024)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);

		pfree(nt->value.data);
		initStringInfo(&nt->value);
		MemoryContextSwitchTo(oldcxt);
	}
	return nl->nsent > 0;
}

/* Read an integer member "name":N of a small JSON text, or -1. */
static long
nats_json_int(const char *json, const char *name)
{
	const char *p = strstr(json, name);

	if (p == NULL)
		return -1;
	p += strlen(name);
	while (*p == ' ' || *p == ':')
		p++;
	return outbox_ascii_digit((unsigned char) *p) ? strtol(p, NULL, 10) : -1;
}

/*
 * What an acknowledgement says: delivered (stored, or a duplicate of what
 * the stream holds), or the failure class and its text in error.
 */
static RelayOutcomeKind
nats_ack_class(const char *data, int len, char *error, size_t size)
{
	char		json[NATS_MAX_ACK + 1];
	const char *d;
	int			i;
	long		code;
	long		err_code;

	if (data == NULL || len <= 0 || len > NATS_MAX_ACK)
		return NATS_NOT_AN_ACK;
	/* Printable ASCII only: it may end up in last_error. */
	for (i = 0; i < len; i++)
		json[i] = ((unsigned char) data[i] >= 0x20 && (unsigned char) data[i] < 0x7f) ? data[i] : '?';
	json[len] = '\0';
	/*
	 * A PubAck: {"stream":"NAME","seq":N[,"duplicate":true]} (a stream may
	 * be named "error"), or an error.
	 */
	if (strncmp(json, "{\"stream\":", 10) == 0 && strstr(json, "\"seq\":") != NULL)
		return RELAY_DELIVERED;
	d = strstr(json, "\"error\"");
	if (d == NULL)
	{
		/* Not JetStream's (someone else answering requests): not the answer. */
		return NATS_NOT_AN_ACK;
	}
	if (strncmp(json, "{\"error\":", 9) != 0)
		return NATS_NOT_AN_ACK;
	code = nats_json_int(d, "\"code\"");
	err_code = nats_json_int(d, "\"err_code\"");
	{
		const char *desc = strstr(d, "\"description\"");
		int			dlen = 0;

		if (desc != NULL && (desc = strchr(desc + 13, '"')) != NULL)
		{
			desc++;
			while (desc[dlen] && desc[dlen] != '"' && dlen < 200)
				dlen++;
		}
		snprintf(error, size, "JetStream error %ld (%ld): %.*s", code, err_code,
				 dlen, desc ? desc : "");
	}
	if (err_code == NATS_JS_ERR_MSG_SIZE)
		return RELAY_REJECTED;
	if (code == 503 || code == 408)
		return RELAY_RETRY;
	/* Not known to be the message's fault: hold the target, drop nothing. */
	return RELAY_RECEIVER_FAILED;
}

/* Report the lane's request if what came back decides it. */
static void
nats_lane_check(RelayLane *lane, RelayFinishedFn finished)
{
	RelayOutcome outcome;

	if (!relay_acks_decided(NATS_LANE(lane)))
		return;
	relay_acks_outcome(NATS_LANE(lane), &outcome);
	lane->in_flight = false;
	requests_in_flight--;
	finished(lane, &outcome);
}

/* The target's requests parked: in flight, nothing sent (relay_nats_send()). */
static int
nats_parked(RelayTarget *t)
{
	int			n = 0;
	int			i;

	for (i = 0; i < t->nlanes; i++)
		if (t->lanes[i].in_flight && NATS_LANE(&t->lanes[i])->nsent == 0)
			n++;
	return n;
}

/*
 * nats_connect() in an error guard: false while the connection is still
 * being made; else its state, with why in error when FAILED (an error
 * thrown is a failure).
 */
static bool
nats_guarded_connect(RelayTarget *t, NatsConnState *state, char *error, size_t size)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile NatsConnState st = NATS_CONN_FAILED;

	PG_TRY();
	{
		const char *why = NULL;

		st = nats_connect(t, &why);
		if (why != NULL)
			strlcpy(error, why, size);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		strlcpy(error, edata->message, size);
		FreeErrorData(edata);
		st = NATS_CONN_FAILED;
	}
	PG_END_TRY();
	*state = st;
	return st != NATS_CONN_WAIT;
}

/*
 * Once the target's connection has moved on (its names resolved, its
 * thread done), publish the parked requests if it is made, or give them
 * up (the target held) when it could not be.
 */
static void
nats_unpark(RelayTarget *t, RelayFinishedFn finished)
{
	NatsConnState state;
	TimestampTz now = GetCurrentTimestamp();
	char		error[RELAY_MAX_ERROR_LEN + 1];
	int			i;

	/*
	 * What send() did inside relay_lane_start()'s error guard is done
	 * here: an error (memory) is the requests' outcome, not the relay's.
	 */
	if (!nats_guarded_connect(t, &state, error, sizeof(error)))
		return;
	for (i = 0; i < t->nlanes && t->priv != NULL; i++)
	{
		RelayLane  *lane = &t->lanes[i];
		RelayAcks  *nl = NATS_LANE(lane);

		if (!lane->in_flight || nl->nsent > 0 || relay_acks_decided(nl))
			continue;
		if (state == NATS_CONN_FAILED)
			relay_acks_give_up(nl, RELAY_RECEIVER_FAILED, error);
		else
		{
			MemoryContext cxt = CurrentMemoryContext;
			char	   *volatile thrown = NULL;
			volatile bool published = false;

			PG_TRY();
			{
				published = nats_publish(lane);
			}
			PG_CATCH();
			{
				ErrorData  *edata;

				MemoryContextSwitchTo(cxt);
				edata = CopyErrorData();
				FlushErrorState();
				thrown = pstrdup(edata->message);
				FreeErrorData(edata);
			}
			PG_END_TRY();
			if (thrown != NULL)
			{
				/* the head message alone is retried, then dead-lettered */
				lane->nbatch = 1;
				relay_acks_give_up(nl, RELAY_RETRY, thrown);
				pfree(thrown);
			}
			else if (published)
				nl->deadline = TimestampTzPlusMilliseconds(now, t->timeout_ms);
		}
		nats_lane_check(lane, finished);
	}
}

static RelayTarget *
nats_target_of(uint64 conn)
{
	ListCell   *lc;

	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_NATS && t->priv != NULL && NATS_TARGET(t)->serial == conn)
			return t;
	}
	return NULL;
}

/*
 * A decimal number of at most 10 digits, at most PG_UINT32_MAX, at *p,
 * ended by end: its value in *value, *p moved past end.  Digits only
 * (sscanf's %u took signs and spaces, and cost more than the rest of an
 * acknowledgement).
 */
static bool
nats_subject_number64(const char **p, char end, uint64 *value, int digits, uint64 max)
{
	const char *s = *p;
	uint64		v = 0;
	int			n = 0;

	while (*s >= '0' && *s <= '9' && n < digits)
	{
		v = v * 10 + (uint64) (*s++ - '0');
		n++;
	}
	if (n == 0 || *s != end || v > max)
		return false;
	*value = v;
	*p = end == '\0' ? s : s + 1;
	return true;
}

static bool
nats_subject_number(const char **p, char end, uint32 *value)
{
	uint64		v;

	if (!nats_subject_number64(p, end, &v, 10, PG_UINT32_MAX))
		return false;
	*value = (uint32) v;
	return true;
}

/*
 * A reply that is not JetStream's for message id of lane: the message, if
 * still queued, is flagged, so it is not published again (I10).
 */
static void
nats_foreign_reply(RelayLane *lane, int64 id)
{
	RelayMessage *m;
	int			n = 0;

	/*
	 * A message not yet delivered stays at the lane's head: a request holds
	 * at most batch_size of them (and a dead letter retried may sit before
	 * them), so the walk is short whatever the reply says.
	 */
	for (m = lane->head; m != NULL && n < 2 * lane->target->batch_size + 16; m = m->next, n++)
		if (m->id == id)
		{
			m->foreign_reply = true;
			break;
		}
}

/*
 * The server's "no responders" for message pos of lane's request: no stream
 * takes its subject (or the stream's leader is being elected).  A subject
 * the message filled in is its own doing (I10): RELAY_UNROUTABLE, naming
 * that subject; the template's own subject holds the target.
 */
static RelayOutcomeKind
nats_no_responders(RelayTarget *t, RelayLane *lane, uint32 pos, char *error, size_t size)
{
	RelayNatsTarget *nt = NATS_TARGET(t);
	RelayMessage *m = lane->head;
	uint32		i;
	char		shown[RELAY_SHOWN_LEN];

	/* a request is the head of the lane, in order (relay_lane_cut()) */
	for (i = 0; i < pos && m != NULL; i++)
		m = m->next;
	if (m != NULL && relay_template_filled(t->subject) &&
		nats_subject(t, m, &nt->subject) == NULL)
	{
		relay_shown(shown, sizeof(shown), nt->subject.data, nt->subject.len);
		snprintf(error, size, "no JetStream stream takes subject \"%s\" (no responders)", shown);
		return RELAY_UNROUTABLE;
	}
	relay_shown(shown, sizeof(shown), t->subject, strlen(t->subject));
	snprintf(error, size, "no JetStream stream answered for the subject (no responders): no stream takes \"%s\", or its leader is being elected",
			 shown);
	return RELAY_RECEIVER_FAILED;
}

/* A reply on a target's inbox: note it in its lane. */
static void
nats_ack(RelayTarget *t, NatsReply *r, RelayFinishedFn finished)
{
	RelayNatsTarget *nt = NATS_TARGET(t);
	const char *subj = r->buf;
	size_t		plen = strlen(nt->inbox);
	uint32		lane_index;
	uint32		request;
	uint32		pos;
	uint64		id;
	const char *p;
	RelayLane  *lane;
	RelayAcks  *nl;
	RelayOutcomeKind kind;
	char		error[RELAY_MAX_ERROR_LEN + 1];

	/*
	 * <inbox>.<lane>.<request>.<position>.<id>, as relay_nats_send() wrote
	 * it
	 */
	if (subj == NULL || strncmp(subj, nt->inbox, plen) != 0 || subj[plen] != '.')
		return;
	p = subj + plen + 1;
	if (!nats_subject_number(&p, '.', &lane_index) ||
		!nats_subject_number(&p, '.', &request) ||
		!nats_subject_number(&p, '.', &pos) ||
		!nats_subject_number64(&p, '\0', &id, 19, PG_INT64_MAX) ||
		lane_index >= (uint32) t->nlanes || pos > (uint32) PG_INT32_MAX)
		return;
	lane = &t->lanes[lane_index];
	nl = NATS_LANE(lane);
	if (r->no_responders)
	{
		if (!lane->in_flight || !relay_acks_waits(nl, request, pos))
			return;
		kind = nats_no_responders(t, lane, pos, error, sizeof(error));
		relay_acks_bad(nl, pos, kind, error);
		nats_lane_check(lane, finished);
		return;
	}
	kind = r->data_len < 0 ? NATS_NOT_AN_ACK :
		nats_ack_class(subj + strlen(subj) + 1, r->data_len, error, sizeof(error));
	if (kind == NATS_NOT_AN_ACK)
	{
		/*
		 * A service answering requests on the subject (or the server's
		 * API), even late, after the request was given up: the stream's
		 * acknowledgement may still come, but if none does, the message
		 * is not published again (relay_nats_send()).
		 */
		nats_foreign_reply(lane, (int64) id);
		return;
	}
	if (!lane->in_flight || !relay_acks_waits(nl, request, pos))
		return;
	if (kind == RELAY_DELIVERED)
		nl->acked[pos] = true;
	else
		relay_acks_bad(nl, pos, kind, error);
	nats_lane_check(lane, finished);
}

/*
 * Take what libnats' threads queued: acknowledgements and lost
 * connections; then end requests past their timeout.
 */
static void
relay_nats_drive(RelayFinishedFn finished)
{
	NatsEvent  *ev;
	TimestampTz now = 0;
	ListCell   *lc;

	if (wake_pipe[0] < 0)
		return;
	/* before taking what woke it: what comes after wakes it again */
	relay_wake_pipe_drain(wake_pipe[0]);

	/*
	 * First the replies libnats' deliverer queued (at most NATS_MAX_DRAIN a
	 * call, the rest at the next); with nothing in flight too, for a
	 * service's late answer to a request given up, which must mark its
	 * message before the retry (I10).  A reply of a connection closed
	 * since finds no target.
	 */
	{
		NatsReply  *r;
		NatsReply  *q;
		NatsReply  *last = NULL;
		int			n = 0;
		uint64		dropped;

		pthread_mutex_lock(&events_lock);
		r = replies_head;
		for (q = r; q != NULL && n < NATS_MAX_DRAIN; q = q->next, n++)
		{
			last = q;
			replies_count--;
			replies_bytes -= q->size;
		}
		if (last != NULL)
		{
			replies_head = last->next;
			last->next = NULL;
			if (replies_head == NULL)
				replies_tail = NULL;
		}
		/* left for the next call, which nothing else would wake */
		replies_left = replies_head != NULL;
		dropped = replies_dropped;
		pthread_mutex_unlock(&events_lock);
		if (dropped > replies_dropped_seen &&
			(now = GetCurrentTimestamp()) - replies_dropped_warned >= NATS_DROPPED_WARN_MS * 1000)
		{
			ereport(WARNING,
					(errmsg("outbox relay dropped " UINT64_FORMAT " NATS replies it had no room for",
							dropped - replies_dropped_seen),
					 errdetail("At most %d replies (%d MB) wait for the relay; the requests they answer time out and are sent again.",
							   NATS_MAX_REPLIES, NATS_MAX_REPLY_BYTES / (1024 * 1024))));
			replies_dropped_seen = dropped;
			replies_dropped_warned = now;
		}
		while (r != NULL)
		{
			NatsReply  *next = r->next;
			RelayTarget *t = nats_target_of(r->conn);

			if (t != NULL)
				nats_ack(t, r, finished);
			free(r);
			r = next;
		}
	}

	/* Then lost connections: what is still waiting will not be answered. */
	pthread_mutex_lock(&events_lock);
	ev = events_head;
	events_head = events_tail = NULL;
	events_count = 0;
	pthread_mutex_unlock(&events_lock);
	while (ev != NULL)
	{
		NatsEvent  *next = ev->next;
		RelayTarget *t = nats_target_of(ev->conn);
		int			i;

		/*
		 * Made anew at the next request (nats_connect()); parked requests
		 * sent nothing on it, and wait for that.
		 */
		if (t != NULL)
			NATS_TARGET(t)->lost = true;
		for (i = 0; t != NULL && t->priv != NULL && i < t->nlanes; i++)
			if (t->lanes[i].in_flight && NATS_LANE(&t->lanes[i])->nsent > 0)
			{
				RelayAcks  *nl = NATS_LANE(&t->lanes[i]);

				relay_acks_give_up(nl, RELAY_RECEIVER_FAILED,
								   "the connection to the NATS server was lost");
				nats_lane_check(&t->lanes[i], finished);
			}
		free(ev);
		ev = next;
	}

	/* Then requests parked while a connection is made, and those past their time. */
	if (requests_in_flight == 0)
		return;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);
		int			i;

		if (t->kind != RELAY_NATS || t->priv == NULL)
			continue;
		/*
		 * (Whatever made the connection: a send may have taken it from
		 * its thread since, and published its own request then.)
		 */
		if (nats_parked(t) > 0)
			nats_unpark(t, finished);
		for (i = 0; i < t->nlanes && t->priv != NULL; i++)
		{
			RelayLane  *lane = &t->lanes[i];
			RelayAcks  *nl = NATS_LANE(lane);

			if (!lane->in_flight)
				continue;
			if (now == 0)
				now = GetCurrentTimestamp();
			if (now >= nl->deadline && nl->nsent == 0)
			{
				char		error[RELAY_MAX_ERROR_LEN + 1];

				/* parked: the connection is not made in time */
				if (NATS_TARGET(t)->nlookups > 0)
					snprintf(error, sizeof(error), "could not resolve the NATS servers' host names within %d ms",
							 t->timeout_ms);
				else
					snprintf(error, sizeof(error), "no connection to the NATS server within %d ms (does it accept the connection, and answer the %shandshake?)",
							 t->timeout_ms, t->url[strspn(t->url, " ")] == 't' ? "TLS and NATS " : "NATS ");
				relay_acks_give_up(nl, RELAY_RECEIVER_FAILED, error);
				nats_lane_check(lane, finished);
			}
			else if (now >= nl->deadline)
			{
				char		error[RELAY_MAX_ERROR_LEN + 1];
				RelayMessage *m = lane->head;
				int			k;

				(void) relay_acks_decided(nl);
				for (k = 0; k < nl->prefix && m != NULL; k++)
					m = m->next;
				if (m != NULL && m->foreign_reply)
				{
					/* answered, but not by a stream: never again */
					StringInfoData subject;
					char		shown[RELAY_SHOWN_LEN];

					initStringInfo(&subject);
					(void) nats_subject(t, m, &subject);
					relay_shown(shown, sizeof(shown), subject.data, subject.len);
					snprintf(error, sizeof(error), NATS_FOREIGN_REPLY, shown);
					pfree(subject.data);
					relay_acks_give_up(nl, RELAY_REJECTED, error);
				}
				else
				{
					snprintf(error, sizeof(error), "no JetStream acknowledgement within %d ms",
							 t->timeout_ms);
					relay_acks_give_up(nl, RELAY_RETRY, error);
				}
				nats_lane_check(lane, finished);
			}
		}
	}
}

/*
 * Milliseconds the loop may sleep: until the first deadline of a request
 * (acknowledgements, connections made and lost wake the relay through
 * wake_pipe), or NATS_LOOKUP_POLL_MS while a host name is being resolved;
 * else no limit.
 */
static long
relay_nats_timeout(void)
{
	ListCell   *lc;
	bool		resolving = false;
	long		ms;

	if (replies_left)
		return 0;
	if (requests_in_flight == 0)
		return -1;
	foreach(lc, relay_targets)
	{
		RelayTarget *t = (RelayTarget *) lfirst(lc);

		if (t->kind == RELAY_NATS && t->priv != NULL && NATS_TARGET(t)->nlookups > 0)
			resolving = true;
	}
	ms = relay_acks_next_deadline_ms(RELAY_NATS);
	if (resolving && (ms < 0 || ms > NATS_LOOKUP_POLL_MS))
		ms = NATS_LOOKUP_POLL_MS;
	return ms;
}

/* The options of a NATS target row read (relay_config.c). */
static const char *
relay_nats_check(RelayTarget *t)
{
	const char *why;

	if (t->url == NULL)
		return "url is missing";
	if ((why = relay_nats_check_url(t->url)) != NULL)
		return psprintf("url: %s", why);
	if (t->subject == NULL)
		return "subject: it is missing";
	if ((why = relay_nats_check_subject(t->subject, true)) != NULL)
		return psprintf("subject: %s", why);
	return NULL;
}

const RelayTransport relay_nats_transport = {
	.kind = "nats",
	.id = RELAY_NATS,
	.header_lines = true,
	.per_message = true,
	.check = relay_nats_check,
	.start = relay_nats_start,
	.stop = relay_nats_stop,
	.target_init = relay_nats_target_init,
	.target_release = relay_nats_target_release,
	.lane_init = relay_acks_lane_init,
	.lane_release = relay_nats_lane_release,
	.send = relay_nats_send,
	.drive = relay_nats_drive,
	.timeout = relay_nats_timeout,
};
