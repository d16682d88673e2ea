/*-------------------------------------------------------------------------
 *
 * destinations.c
 *	  Where the relay's HTTP requests may go (README, "Security").
 *
 * outbox.denied_destinations is a list of CIDRs, by default link-local and
 * the cloud metadata addresses; outbox.allowed_destinations a list of CIDRs
 * and host names ("hooks.example.com", "*.example.com"), empty for any
 * address not denied.  An address is allowed when an allowed CIDR holds it
 * (an explicit allow wins over a deny), refused when a denied CIDR holds
 * it, and otherwise allowed when the allowed list is empty or names the
 * URL's host.  Unspecified addresses (0.0.0.0/8, ::) are always refused:
 * Linux connects them to the local host.  IPv4-mapped IPv6 addresses are
 * checked as the IPv4 address they carry.
 *
 * The rules are checked when a target is created or altered
 * (outbox.check_destination: the URL's host, literal or resolved then) and
 * by the relay at every connect, on the address libcurl actually dials
 * (relay_http.c's open-socket callback), so a name that later resolves to a
 * denied address is refused too.
 *
 * Both settings are superuser-only (PGC_SUSET: set in the server's
 * configuration, reloadable, or by a superuser for a session), parsed by their check
 * hooks into a rule list (outbox_guc_malloc) handed to the assign hook as
 * "extra".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <curl/curl.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "outbox.h"

/* One rule: a CIDR, or a host name (a leading "*." matches subdomains). */
typedef struct DestinationRule
{
	bool		is_host;
	int			family;			/* AF_INET or AF_INET6 */
	unsigned char addr[16];
	int			bits;			/* prefix length */
	char		text[256];		/* as written, for messages */
} DestinationRule;

typedef struct DestinationRules
{
	int			nrules;
	DestinationRule rules[FLEXIBLE_ARRAY_MEMBER];
} DestinationRules;

char	   *outbox_denied_destinations = NULL;
char	   *outbox_allowed_destinations = NULL;
static DestinationRules *denied_rules = NULL;
static DestinationRules *allowed_rules = NULL;

/* Bumped whenever either setting changes (relay_http.c drops connections). */
uint64		outbox_destinations_generation = 0;

/* Is s a host name we accept: dot-separated labels of [A-Za-z0-9-]? */
static bool
outbox_valid_host_name(const char *s, size_t len)
{
	size_t		label = 0;
	size_t		i;
	bool		alpha = false;

	if (len == 0 || len > 253)
		return false;
	for (i = 0; i < len; i++)
	{
		char		c = s[i];

		if (c == '.')
		{
			if (label == 0 || s[i - 1] == '-')
				return false;
			label = 0;
			alpha = false;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '-'))
			return false;
		if (c == '-' && label == 0)
			return false;
		if (!(c >= '0' && c <= '9'))
			alpha = true;
		if (++label > 63)
			return false;
	}
	/* A last label of digits only is a numeric address, not a name. */
	return label > 0 && s[len - 1] != '-' && alpha;
}

/* Parse one CIDR ("10.0.0.0/8", "fe80::/10", "192.0.2.1"). */
static bool
outbox_parse_cidr(const char *s, DestinationRule *r)
{
	char		buf[256];
	char	   *slash;
	int			maxbits;

	if (strlen(s) >= sizeof(buf))
		return false;
	strcpy(buf, s);
	slash = strchr(buf, '/');
	if (slash)
		*slash = '\0';
	memset(r, 0, sizeof(*r));
	if (inet_pton(AF_INET, buf, r->addr) == 1)
	{
		r->family = AF_INET;
		maxbits = 32;
	}
	else if (inet_pton(AF_INET6, buf, r->addr) == 1)
	{
		r->family = AF_INET6;
		maxbits = 128;
	}
	else
		return false;
	r->bits = maxbits;
	if (slash)
	{
		char	   *end;
		long		bits;

		errno = 0;
		bits = strtol(slash + 1, &end, 10);
		if (slash[1] == '\0' || *end != '\0' || errno != 0 || bits < 0 || bits > maxbits)
			return false;
		r->bits = (int) bits;
	}
	strlcpy(r->text, s, sizeof(r->text));
	return true;
}

/*
 * Parse a list setting into *rules (outbox_guc_malloc).  Returns false, with the
 * GUC's error detail set, for an entry that is neither a CIDR nor (when
 * hosts is set) a host name.
 */
static bool
outbox_parse_rules(const char *value, bool hosts, DestinationRules **rules)
{
	char	   *copy = pstrdup(value ? value : "");
	char	   *p = copy;
	int			max = 1;
	char	   *c;
	DestinationRules *r;

	for (c = copy; *c; c++)
		if (*c == ',' || *c == ' ' || *c == '\t' || *c == '\n')
			max++;
	r = outbox_guc_malloc(offsetof(DestinationRules, rules) + sizeof(DestinationRule) * max);
	if (r == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		GUC_check_errmsg("out of memory");
		return false;
	}
	r->nrules = 0;
	while (*p)
	{
		char	   *start;
		DestinationRule *rule = &r->rules[r->nrules];

		while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (*p == '\0')
			break;
		start = p;
		while (*p && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n')
			p++;
		if (*p)
			*p++ = '\0';
		if (outbox_parse_cidr(start, rule))
		{
			r->nrules++;
			continue;
		}
		if (hosts)
		{
			const char *name = start;

			if (strncmp(name, "*.", 2) == 0)
				name += 2;
			if (outbox_valid_host_name(name, strlen(name)))
			{
				memset(rule, 0, sizeof(*rule));
				rule->is_host = true;
				strlcpy(rule->text, start, sizeof(rule->text));
				r->nrules++;
				continue;
			}
		}
		GUC_check_errdetail("\"%s\" is not %s.", start,
							hosts ? "a CIDR such as 10.0.0.0/8 or a host name such as hooks.example.com or *.example.com" :
							"a CIDR such as 169.254.0.0/16 or fe80::/10");
		outbox_guc_free(r);
		pfree(copy);
		return false;
	}
	pfree(copy);
	*rules = r;
	return true;
}

static bool
outbox_denied_check(char **newval, void **extra, GucSource source)
{
	DestinationRules *r;

	if (!outbox_parse_rules(*newval, false, &r))
		return false;
	*extra = r;
	return true;
}

/* Whether two rule lists differ (a reload assigns even an unchanged one). */
static bool
outbox_rules_differ(const DestinationRules *a, const DestinationRules *b)
{
	if (a == NULL || b == NULL)
		return a != b;
	return a->nrules != b->nrules ||
		memcmp(a->rules, b->rules, sizeof(DestinationRule) * a->nrules) != 0;
}

static void
outbox_denied_assign(const char *newval, void *extra)
{
	if (outbox_rules_differ(denied_rules, (DestinationRules *) extra))
		outbox_destinations_generation++;
	denied_rules = (DestinationRules *) extra;
}

static bool
outbox_allowed_check(char **newval, void **extra, GucSource source)
{
	DestinationRules *r;

	if (!outbox_parse_rules(*newval, true, &r))
		return false;
	*extra = r;
	return true;
}

static void
outbox_allowed_assign(const char *newval, void *extra)
{
	if (outbox_rules_differ(allowed_rules, (DestinationRules *) extra))
		outbox_destinations_generation++;
	allowed_rules = (DestinationRules *) extra;
}

void
outbox_destinations_define_gucs(void)
{
	DefineCustomStringVariable("outbox.denied_destinations",
							   "Addresses the relay never sends requests to (CIDRs).",
							   "Checked when a target is created or altered and at every connect, on the "
							   "address dialled. An address in outbox.allowed_destinations is allowed even so.",
							   &outbox_denied_destinations,
							   "169.254.0.0/16, fe80::/10, fd00:ec2::254/128, 100.100.100.200/32",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   outbox_denied_check, outbox_denied_assign, NULL);
	DefineCustomStringVariable("outbox.allowed_destinations",
							   "The only addresses and host names the relay sends requests to (CIDRs and host names); empty for any not denied.",
							   "A host name entry allows the URLs of that host (\"*.example.com\": of its subdomains) "
							   "at any address that is not denied.",
							   &outbox_allowed_destinations,
							   "",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   outbox_allowed_check, outbox_allowed_assign, NULL);
}

static bool
outbox_rule_holds(const DestinationRule *r, int family, const unsigned char *addr)
{
	int			full = r->bits / 8;
	int			rest = r->bits % 8;

	if (r->is_host || r->family != family)
		return false;
	if (memcmp(r->addr, addr, full) != 0)
		return false;
	if (rest != 0)
	{
		unsigned char mask = (unsigned char) (0xff << (8 - rest));

		if ((r->addr[full] & mask) != (addr[full] & mask))
			return false;
	}
	return true;
}

static bool
outbox_host_rule_matches(const DestinationRule *r, const char *host)
{
	if (!r->is_host || host == NULL)
		return false;
	if (strncmp(r->text, "*.", 2) == 0)
	{
		size_t		hl = strlen(host);
		size_t		sl = strlen(r->text + 1);	/* ".example.com" */

		return hl > sl && pg_strcasecmp(host + hl - sl, r->text + 1) == 0;
	}
	return pg_strcasecmp(host, r->text) == 0;
}

/*
 * The rules for one address (IPv4 in 4 bytes, IPv6 in 16) under the
 * rules denied and allowed; NULL: allowed, else why not, in why.  Plain C
 * on memory the caller owns: a library thread may run it on a snapshot
 * (outbox_destinations_snapshot).
 */
static const char *
outbox_address_refused(const DestinationRules *denied, const DestinationRules *allowed,
					   int family, const unsigned char *addr, const char *host,
					   char *why, size_t size)
{
	char		shown[INET6_ADDRSTRLEN];
	int			i;

	inet_ntop(family, addr, shown, sizeof(shown));
	if ((family == AF_INET && addr[0] == 0) ||
		(family == AF_INET6 && memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16) == 0))
	{
		snprintf(why, size, "%s is an unspecified address, which is never allowed", shown);
		return why;
	}
	if (allowed)
		for (i = 0; i < allowed->nrules; i++)
			if (outbox_rule_holds(&allowed->rules[i], family, addr))
				return NULL;
	if (denied)
		for (i = 0; i < denied->nrules; i++)
			if (outbox_rule_holds(&denied->rules[i], family, addr))
			{
				snprintf(why, size, "%s is denied by outbox.denied_destinations entry \"%s\"",
						 shown, denied->rules[i].text);
				return why;
			}
	if (allowed == NULL || allowed->nrules == 0)
		return NULL;
	for (i = 0; i < allowed->nrules; i++)
		if (outbox_host_rule_matches(&allowed->rules[i], host))
			return NULL;
	snprintf(why, size, "%s%s%s is not in outbox.allowed_destinations",
			 host ? host : "", host ? " at " : "", shown);
	return why;
}

/*
 * Whether a connection for host (the URL's, or NULL) may go to the address
 * family/address (a struct in_addr or in6_addr) under the rules denied
 * and allowed.  Returns NULL if so, else why not (in why).
 *
 * IPv6 addresses that carry an IPv4 address must pass the rules as that
 * address too: IPv4-mapped ::ffff:a.b.c.d (only as the IPv4 address: it
 * is one), IPv4-compatible ::a.b.c.d (not ::1), NAT64 64:ff9b::/96 and the
 * local-use 64:ff9b:1::/48 (they reach IPv4 networks through a
 * translator), and 6to4 2002:aabb:ccdd::/48.
 */
static const char *
outbox_refused_under(const DestinationRules *denied, const DestinationRules *allowed,
					 int family, const void *address, const char *host,
					 char *why, size_t size)
{
	static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
	static const unsigned char nat64_local[6] = {0, 0x64, 0xff, 0x9b, 0, 0x01};
	static const unsigned char zero[12] = {0};
	const unsigned char *a = address;
	const char *r;

	if (family == AF_INET)
		return outbox_address_refused(denied, allowed, AF_INET, a, host, why, size);
	if (family != AF_INET6)
	{
		snprintf(why, size, "address family %d is not an Internet address", family);
		return why;
	}
	if (memcmp(a, mapped, 12) == 0)
		return outbox_address_refused(denied, allowed, AF_INET, a + 12, host, why, size);
	r = outbox_address_refused(denied, allowed, AF_INET6, a, host, why, size);
	if (r != NULL)
		return r;
	if (memcmp(a, nat64, 12) == 0 || memcmp(a, nat64_local, 6) == 0 ||
		(memcmp(a, zero, 12) == 0 && a[12] != 0))
		return outbox_address_refused(denied, allowed, AF_INET, a + 12, host, why, size);
	if (a[0] == 0x20 && a[1] == 0x02)
		return outbox_address_refused(denied, allowed, AF_INET, a + 2, host, why, size);
	return NULL;
}

/*
 * Whether a request to host may connect to an address, under the settings
 * in force (outbox_refused_under).  Returns NULL if so, else why not (in a
 * static buffer).
 */
const char *
outbox_destination_refused(int family, const void *address, const char *host)
{
	static char why[512];

	return outbox_refused_under(denied_rules, allowed_rules, family, address, host,
								why, sizeof(why));
}

/* A copy of the rules in force, for a library thread (malloc'd). */
struct OutboxDestinations
{
	DestinationRules *denied;
	DestinationRules *allowed;
};

static DestinationRules *
outbox_rules_copy(const DestinationRules *r)
{
	DestinationRules *c;
	size_t		size;

	if (r == NULL)
		return NULL;
	size = offsetof(DestinationRules, rules) + sizeof(DestinationRule) * r->nrules;
	c = malloc(size);
	if (c != NULL)
		memcpy(c, r, size);
	return c;
}

/*
 * The rules in force, copied into memory of their own (malloc, not palloc)
 * that stays valid however the settings change: for code that checks
 * addresses on a library's thread (relay_kafka.c's connect callback).
 * NULL when out of memory.
 */
OutboxDestinations *
outbox_destinations_snapshot(void)
{
	OutboxDestinations *d = malloc(sizeof(OutboxDestinations));

	if (d == NULL)
		return NULL;
	d->denied = outbox_rules_copy(denied_rules);
	d->allowed = outbox_rules_copy(allowed_rules);
	if ((denied_rules && !d->denied) || (allowed_rules && !d->allowed))
	{
		outbox_destinations_free(d);
		return NULL;
	}
	return d;
}

void
outbox_destinations_free(OutboxDestinations *d)
{
	if (d == NULL)
		return;
	free(d->denied);
	free(d->allowed);
	free(d);
}

/*
 * outbox_destination_refused() under a snapshot, with why in the caller's
 * buffer: safe on any thread (no palloc, no ereport, no shared state).
 */
const char *
outbox_destination_refused_in(const OutboxDestinations *d, int family,
							  const void *address, const char *host,
							  char *why, size_t size)
{
	return outbox_refused_under(d->denied, d->allowed, family, address, host, why, size);
}

/*
 * The host of an http(s) URL as libcurl parses it, checked: no user or
 * password, no IPv6 zone id, a port in range, and a host that is a plain
 * DNS name, a dotted-quad IPv4 address or a bracketed IPv6 address (no
 * "0x7f000001", "127.1" or percent-encoding: forms that parsers disagree
 * on).  Returns the host (palloc'd; an IPv6 one without brackets), or NULL
 * with *why set.
 */
char *
outbox_url_host(const char *url, const char **why)
{
	CURLU	   *u = curl_url();
	char	   *part = NULL;
	char	   *host = NULL;
	CURLUcode	rc;
	const char *p;

	*why = NULL;
	if (u == NULL)
	{
		*why = "out of memory";
		return NULL;
	}
	for (p = url; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if (c <= 0x20 || c >= 0x7f || strchr("\\\"<>^`{|}", c) != NULL)
		{
			*why = "The URL has a character outside printable ASCII, a space, or one of \\\"<>^`{|}";
			goto done;
		}
	}
	rc = curl_url_set(u, CURLUPART_URL, url, 0);
	if (rc != CURLUE_OK)
	{
		*why = "The URL cannot be parsed by libcurl";
		goto done;
	}
	if (curl_url_get(u, CURLUPART_SCHEME, &part, 0) != CURLUE_OK ||
		(pg_strcasecmp(part, "http") != 0 && pg_strcasecmp(part, "https") != 0))
	{
		*why = "The scheme is not http or https";
		goto done;
	}
	curl_free(part);
	part = NULL;
	if (curl_url_get(u, CURLUPART_USER, &part, 0) == CURLUE_OK ||
		curl_url_get(u, CURLUPART_PASSWORD, &part, 0) == CURLUE_OK ||
		curl_url_get(u, CURLUPART_OPTIONS, &part, 0) == CURLUE_OK)
	{
		*why = "The URL carries credentials (user@ or user:password@)";
		goto done;
	}
	if (curl_url_get(u, CURLUPART_ZONEID, &part, 0) == CURLUE_OK)
	{
		*why = "The URL has an IPv6 zone id";
		goto done;
	}
	if (curl_url_get(u, CURLUPART_PORT, &part, 0) == CURLUE_OK)
	{
		char	   *end;
		long		port = strtol(part, &end, 10);

		if (*end != '\0' || port < 1 || port > 65535)
		{
			*why = "The port is not between 1 and 65535";
			goto done;
		}
		curl_free(part);
		part = NULL;
	}
	if (curl_url_get(u, CURLUPART_HOST, &part, 0) != CURLUE_OK)
	{
		*why = "The URL has no host";
		goto done;
	}
	{
		size_t		len = strlen(part);
		unsigned char addr[16];

		if (len > 2 && part[0] == '[' && part[len - 1] == ']')
		{
			char		inner[INET6_ADDRSTRLEN + 1];

			if (len - 2 >= sizeof(inner))
			{
				*why = "The IPv6 address is not valid";
				goto done;
			}
			memcpy(inner, part + 1, len - 2);
			inner[len - 2] = '\0';
			if (inet_pton(AF_INET6, inner, addr) != 1)
			{
				*why = "The IPv6 address is not valid";
				goto done;
			}
			host = pstrdup(inner);
		}
		else if (inet_pton(AF_INET, part, addr) == 1)
			host = pstrdup(part);
		else if (outbox_valid_host_name(part, len))
			host = pstrdup(part);
		else
			*why = "The host is neither a DNS name, a dotted-quad IPv4 address nor a bracketed IPv6 address";
		/* The host libcurl saw must be what the URL says, byte for byte. */
		if (host != NULL && strstr(url, part) == NULL)
		{
			pfree(host);
			host = NULL;
			*why = "The host as libcurl reads it differs from how it is written";
		}
	}

done:
	if (part)
		curl_free(part);
	curl_url_cleanup(u);
	return host;
}

PG_FUNCTION_INFO_V1(outbox_check_destination);

/*
 * outbox.check_destination(url text) -> void
 *
 * Refuse a URL that the relay would not send to: one libcurl parses in an
 * unexpected way, or whose host (literal, or resolved now) is refused by
 * outbox.denied_destinations / outbox.allowed_destinations.  A name that
 * does not resolve now is accepted with a NOTICE: the relay checks every
 * address it dials anyway.
 */
Datum
outbox_check_destination(PG_FUNCTION_ARGS)
{
	char	   *url = text_to_cstring(PG_GETARG_TEXT_PP(0));
	const char *why;
	char	   *host = outbox_url_host(url, &why);
	unsigned char addr[16];
	struct addrinfo hints;
	struct addrinfo *res = NULL;
	struct addrinfo *ai;
	int			rc;

	if (host == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid target URL \"%s\"", url),
				 errdetail("%s.", why),
				 errhint("Use a URL such as 'https://hooks.example.com/outbox'; send credentials in a header.")));

	if (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1)
	{
		why = outbox_destination_refused(strchr(host, ':') ? AF_INET6 : AF_INET, addr, NULL);
		if (why != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("target URL \"%s\" is not an allowed destination", url),
					 errdetail("%s.", why),
					 errhint("A superuser can change outbox.denied_destinations or outbox.allowed_destinations.")));
		PG_RETURN_VOID();
	}

	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_family = AF_UNSPEC;
	rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc != 0)
	{
		ereport(NOTICE,
				(errmsg("could not resolve host \"%s\" of target URL: %s", host, gai_strerror(rc)),
				 errdetail("The relay checks every address it connects to against outbox.denied_destinations.")));
		PG_RETURN_VOID();
	}
	why = NULL;
	for (ai = res; ai != NULL && why == NULL; ai = ai->ai_next)
	{
		if (ai->ai_family == AF_INET)
			why = outbox_destination_refused(AF_INET,
											 &((struct sockaddr_in *) ai->ai_addr)->sin_addr, host);
		else if (ai->ai_family == AF_INET6)
			why = outbox_destination_refused(AF_INET6,
											 &((struct sockaddr_in6 *) ai->ai_addr)->sin6_addr, host);
	}
	freeaddrinfo(res);
	if (why != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("target URL \"%s\" is not an allowed destination", url),
				 errdetail("Host \"%s\" resolves to an address that is refused: %s.", host, why),
				 errhint("A superuser can change outbox.denied_destinations or outbox.allowed_destinations.")));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(outbox_check_server_file);

/*
 * outbox.check_server_file(path text, what text) -> void
 *
 * Refuse a TLS file (ca_file, client_cert, client_key) the server cannot
 * read now: the relay reads it as the server's operating system user.  The
 * caller (outbox.check_tls_files) checked first that the role may name
 * server files at all.
 */
Datum
outbox_check_server_file(PG_FUNCTION_ARGS)
{
	char	   *path = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *what = text_to_cstring(PG_GETARG_TEXT_PP(1));
	int			fd;
	char		byte;
	struct stat st;

	if (!is_absolute_path(path))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be an absolute path, not \"%s\"", what, path)));
	/* Not a FIFO or device: opening one could block the backend for good. */
	if (stat(path, &st) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot read %s \"%s\": %m", what, path),
				 errhint("The file must be readable by the server's operating system user.")));
	if (!S_ISREG(st.st_mode))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s \"%s\" is not a regular file", what, path)));
	fd = OpenTransientFile(path, O_RDONLY | O_NONBLOCK | PG_BINARY);
	if (fd < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot read %s \"%s\": %m", what, path),
				 errhint("The file must be readable by the server's operating system user.")));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || read(fd, &byte, 1) != 1)
	{
		CloseTransientFile(fd);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s \"%s\" is not a readable, non-empty regular file", what, path)));
	}
	CloseTransientFile(fd);
	PG_RETURN_VOID();
}
