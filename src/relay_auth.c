/*-------------------------------------------------------------------------
 *
 * relay_auth.c
 *	  Tokens a target's requests carry: OAuth2 client credentials (RFC 6749,
 *	  section 4.4) for HTTP targets, and AWS web identity for SQS, SNS and
 *	  Kinesis targets (STS AssumeRoleWithWebIdentity: the token a file holds,
 *	  exchanged for temporary credentials the requests are signed with).
 *
 * A target with a token endpoint (or STS) gets its token there before its first
 * request, with a request of the relay's own on the HTTP engine
 * (relay_fetch_start()): the worker never waits for it, and the destination
 * rules check the endpoint's address as they check every receiver's.  No
 * lane sends while the target has no token it may use; the next lane that
 * asks is told when one cannot be had, and holds the target with the
 * endpoint's reason (relay_lane_may_send()): nothing is dead-lettered, and
 * the probe after the backoff asks again.  A token is fetched anew
 * after three quarters of its lifetime, while it is still used, and is not
 * used in the last tenth of it (at most 30 s), so that no request carries
 * one about to expire.  A receiver answering 401 to a token gets it
 * replaced once: the request goes again with a new one, counting no
 * attempt; a 401 to that new token holds the target as any 401 does.
 *
 * The client secret goes only to the token endpoint, over https (or to a
 * loopback address), and is never written to a log or an error; the token
 * is kept in the target's memory only, and zeroed when it goes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "aws.h"
#include "json_scan.h"
#include "relay.h"

/* Longest access token taken (a JWT with many claims fits). */
#define AUTH_MAX_TOKEN			16384
/* A token's lifetime when the endpoint does not give one. */
#define AUTH_DEFAULT_LIFETIME_S	3600
/* Longest lifetime believed. */
#define AUTH_MAX_LIFETIME_S		(366 * 86400)
/* Tokens in the endpoint's answer read (access_token, id_token, scope ...). */
#define AUTH_MAX_JSON_TOKENS	1024
/* A failure not taken by a lane within this long is forgotten (a paused target). */
#define AUTH_FAILURE_KEEP_US	(10 * USECS_PER_SEC)
/*
 * A token fetched because the one before was refused, refused too, is not
 * replaced for so long (a receiver that refuses every token costs a fetch
 * this often at most).
 */
#define AUTH_AFTER_401_US		(30 * USECS_PER_SEC)
/* Longest web identity token read from its file (a JWT). */
#define AUTH_MAX_WEB_IDENTITY	16384

typedef struct RelayAuth
{
	RelayTarget *t;
	RelayFetch *fetch;
	bool		fetching;		/* a request for a token is on the wire */
	bool		waited;			/* a lane waits for it (else it is fetched
								 * ahead of the token's expiry) */
	char	   *failure;		/* why none could be had, for the next lane
								 * that asks (relay_auth_ready()), or NULL */
	TimestampTz failure_at;		/* when */
	TimestampTz fetched_at;		/* when the token in hand came */
	TimestampTz usable_until;	/* t->auth_header is sent until then */
	TimestampTz refresh_at;		/* a new token is asked for from then */
	bool		after_401;		/* the token replaced one a receiver refused */
	bool		want_after_401; /* the token on its way will be such */
	int			refresh_failures;	/* failed fetches ahead of expiry in a row */
} RelayAuth;

#define AUTH(t)	((RelayAuth *) (t)->auth)

static void relay_auth_done(void *arg, long status, const char *answer, int len,
							const char *error);
static void relay_auth_failed_text(RelayTarget *t, char *out, size_t size, const char *fmt,...)
			pg_attribute_printf(4, 5);

/* Whether host is an address literal of 127/8 or ::1, or the name localhost. */
static bool
relay_host_loopback(const char *host)
{
	unsigned char addr[16];

	return pg_strcasecmp(host, "localhost") == 0 ||
		(inet_pton(AF_INET, host, addr) == 1 && addr[0] == 127) ||
		(inet_pton(AF_INET6, host, addr) == 1 &&
		 IN6_IS_ADDR_LOOPBACK((struct in6_addr *) addr));
}

/*
 * Whether what is sent to url (https://, or http:// to a loopback address)
 * cannot be read on the way: where tokens may go.
 */
static bool
relay_url_private(const char *url)
{
	const char *why;
	char	   *host;
	bool		loopback;

	if (url == NULL)
		return false;
	if (pg_strncasecmp(url, "https://", 8) == 0)
		return true;
	if (pg_strncasecmp(url, "http://", 7) != 0 || (host = outbox_url_host(url, &why)) == NULL)
		return false;
	loopback = relay_host_loopback(host);
	pfree(host);
	return loopback;
}

/*
 * The scheme and authority of an http(s) URL (checked by
 * outbox_url_host()): *authority palloc'd, *https set.  Returns why not.
 * http:// only to a loopback address (a local emulator, a proxy on the
 * same machine): credentials and tokens go nowhere else in
 * clear text.
 */
const char *
relay_url_authority(const char *url, char **authority, bool *https)
{
	const char *a;
	const char *end;
	const char *why;
	char	   *host;
	bool		loopback;

	if (url == NULL)
		return "it is missing";
	if (strncmp(url, "https://", 8) == 0)
		a = url + 8;
	else if (strncmp(url, "http://", 7) == 0)
		a = url + 7;
	else
		return "it does not begin with https:// (or http://)";
	host = outbox_url_host(url, &why);
	if (host == NULL)
	{
		/* its reasons are sentences: lower-case, to follow a colon */
		char	   *w = pstrdup(why);

		w[0] = pg_tolower((unsigned char) w[0]);
		return w;
	}
	loopback = relay_host_loopback(host);
	pfree(host);
	end = a + strcspn(a, "/?#");
	if (*end == '?' || *end == '#')
		return "it has a query or a fragment";
	*authority = pnstrdup(a, end - a);
	*https = (a == url + 8);
	if (!*https && !loopback)
		return "http:// goes to a loopback address only (a local emulator): give https://";
	return NULL;
}


/* Whether s is 1 to 1024 characters of printable ASCII (RFC 6749's VSCHAR). */
static bool
relay_auth_vschars(const char *s)
{
	size_t		n = s ? strlen(s) : 0;
	size_t		i;

	if (n < 1 || n > 1024)
		return false;
	for (i = 0; i < n; i++)
		if ((unsigned char) s[i] < 0x20 || (unsigned char) s[i] > 0x7e)
			return false;
	return true;
}

/*
 * Whether s is an OAuth2 scope (RFC 6749, 3.3): tokens of printable ASCII
 * but '"' and '\', separated by single spaces; at most 1024 characters.
 */
static bool
relay_auth_scope_valid(const char *s)
{
	size_t		n = strlen(s);
	size_t		i;

	if (n < 1 || n > 1024 || s[0] == ' ' || s[n - 1] == ' ')
		return false;
	for (i = 0; i < n; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c == ' ' ? s[i + 1] == ' ' : (c < 0x21 || c > 0x7e || c == '"' || c == '\\'))
			return false;
	}
	return true;
}

/*
 * The checks of OAuth2 client credentials, the SQL function's and the
 * relay's: why they cannot be used, or NULL; *what names the option.
 * Never quotes the secret.
 */
static const char *
relay_auth_problem(const char *url, const char *client_id, const char *client_secret,
				   const char *scope, const char *client_auth, const char **what)
{
	char	   *authority;
	bool		https;
	const char *why;

	*what = "token_url";
	if (url == NULL)
		return "it is missing";
	if (strlen(url) > 2048)
		return "it is longer than 2048 characters";
	if ((why = relay_url_authority(url, &authority, &https)) != NULL)
		return why;
	*what = "client_id";
	if (!relay_auth_vschars(client_id))
		return "it is not 1 to 1024 printable ASCII characters";
	*what = "client_secret";
	if (!relay_auth_vschars(client_secret))
		return "it is not 1 to 1024 printable ASCII characters";
	*what = "scope";
	if (scope != NULL && !relay_auth_scope_valid(scope))
		return "it is not scope tokens of printable ASCII (not '\"' or '\\') separated by single spaces, at most 1024 characters";
	*what = "client_auth";
	if (client_auth == NULL || (strcmp(client_auth, "basic") != 0 && strcmp(client_auth, "post") != 0))
		return "it is not 'basic' or 'post'";
	return NULL;
}

PG_FUNCTION_INFO_V1(outbox_check_oauth2);

/*
 * outbox.check_oauth2(token_url, client_id, client_secret, scope,
 * client_auth, receiver_url): the checks of OAuth2 client credentials and
 * of the URL the token goes to, for check_http_target().
 */
Datum
outbox_check_oauth2(PG_FUNCTION_ARGS)
{
	char	   *args[6];
	const char *what;
	const char *why;
	int			i;

	for (i = 0; i < 6; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = relay_auth_problem(args[0], args[1], args[2], args[3], args[4], &what);
	if (why == NULL && !relay_url_private(args[5]))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a target with OAuth2 client credentials needs an https:// URL"),
				 errdetail("Its requests carry the token, which would go in clear text to \"%s\".",
						   args[5] ? args[5] : ""),
				 errhint("Give the target an https:// URL (http:// goes to a loopback address only).")));
	if (why == NULL)
		PG_RETURN_VOID();
	if (strcmp(what, "token_url") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid OAuth2 token URL \"%s\"", args[0] ? args[0] : ""),
				 errdetail("The token URL is not usable: %s.", why),
				 errhint("Give the https:// URL of the identity provider's token endpoint, such as 'https://login.example.com/oauth2/token'.")));
	if (strcmp(what, "client_secret") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid OAuth2 client secret"),
				 errdetail("The client secret is not usable: %s.", why),
				 errhint("Give the secret the identity provider issued with the client id.")));
	if (strcmp(what, "client_auth") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("OAuth2 client_auth must be 'basic' or 'post', not %s",
						args[4] ? quote_literal_cstr(args[4]) : "NULL"),
				 errhint("'basic' sends the client id and secret in an Authorization header (RFC 6749's default); 'post' in the request's form.")));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid OAuth2 %s \"%s\"", strcmp(what, "scope") == 0 ? "scope" : "client id",
					args[strcmp(what, "scope") == 0 ? 3 : 1] ? args[strcmp(what, "scope") == 0 ? 3 : 1] : ""),
			 errdetail("The %s is not usable: %s.", strcmp(what, "scope") == 0 ? "scope" : "client id", why),
			 errhint("Give the values the identity provider issued, such as client_id => 'outbox-relay', scope => 'webhooks.write'.")));
	PG_RETURN_VOID();
}

/*
 * The checks of an AWS target's web identity, the SQL function's and the
 * relay's: why it cannot be used, or NULL; *what names the option.
 */
static const char *
relay_auth_sts_problem(const char *role_arn, const char *token_file, const char *endpoint,
					   const char **what)
{
	char	   *authority;
	bool		https;
	const char *why;

	*what = "role_arn";
	if (!aws_token_valid(role_arn, 20, 2048) || strncmp(role_arn, "arn:aws", 7) != 0 ||
		strstr(role_arn, ":iam::") == NULL || strstr(role_arn, ":role/") == NULL)
		return "it is not the ARN of an IAM role (arn:aws:iam::<account>:role/<name>)";
	*what = "web_identity_token_file";
	if (token_file == NULL || token_file[0] != '/' || strlen(token_file) > 1024)
		return "it is not an absolute path of at most 1024 bytes";
	*what = "sts_endpoint";
	if (endpoint != NULL)
	{
		if (strlen(endpoint) > 2048)
			return "it is longer than 2048 characters";
		if ((why = relay_url_authority(endpoint, &authority, &https)) != NULL)
			return why;
	}
	return NULL;
}

PG_FUNCTION_INFO_V1(outbox_check_aws_web_identity);

/*
 * outbox.check_aws_web_identity(role_arn, token_file, sts_endpoint): the
 * checks of an AWS target's web identity, for the create functions and
 * set_aws_web_identity().
 */
Datum
outbox_check_aws_web_identity(PG_FUNCTION_ARGS)
{
	char	   *args[3];
	const char *what;
	const char *why;
	int			i;

	for (i = 0; i < 3; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = relay_auth_sts_problem(args[0], args[1], args[2], &what);
	if (why == NULL)
		PG_RETURN_VOID();
	i = strcmp(what, "role_arn") == 0 ? 0 : strcmp(what, "sts_endpoint") == 0 ? 2 : 1;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid %s \"%s\" for AWS web identity", what, args[i] ? args[i] : ""),
			 errdetail("The %s is not usable: %s.", what, why),
			 i == 0 ? errhint("Give the role's ARN, such as 'arn:aws:iam::123456789012:role/outbox-relay'.") :
			 i == 1 ? errhint("Give the file the platform writes the token to, such as '/var/run/secrets/eks.amazonaws.com/serviceaccount/token' (AWS_WEB_IDENTITY_TOKEN_FILE).") :
			 errhint("Leave sts_endpoint out for the region's STS, or give an https:// URL.")));
	PG_RETURN_VOID();
}

/*
 * The token options of a target row (relay_config.c), checked as
 * outbox.check_oauth2() and check_aws_web_identity() check them: why they
 * cannot be used, or NULL.  Sets t->auth_url and t->auth_host.
 */
const char *
relay_auth_check(RelayTarget *t)
{
	const char *why;
	const char *what;
	int			i;

	if (t->oauth_token_url != NULL)
	{
		if (t->kind != RELAY_HTTP)
			return "only HTTP targets take OAuth2 client credentials";
		why = relay_auth_problem(t->oauth_token_url, t->oauth_client_id, t->oauth_client_secret,
								 t->oauth_scope, t->oauth_client_post ? "post" : "basic", &what);
		if (why != NULL)
			return psprintf("oauth %s: %s", what, why);
		for (i = 0; i < t->nheader_lines; i++)
			if (outbox_header_name_is(t->header_names[i], strlen(t->header_names[i]),
									  "authorization", true))
				return "a target with OAuth2 client credentials has no Authorization header of its own";
		if (!relay_url_private(t->url))
			return "a target with OAuth2 client credentials sends its token to an https:// URL (or http:// to a loopback address) only";
		t->auth_url = t->oauth_token_url;
	}
	else if (t->aws_role_arn != NULL)
	{
		if (t->region == NULL || t->aws_key_id != NULL)
			return "only SQS, SNS and Kinesis targets without static credentials take a web identity";
		why = relay_auth_sts_problem(t->aws_role_arn, t->aws_token_file, t->aws_sts_endpoint,
									 &what);
		if (why != NULL)
			return psprintf("%s: %s", what, why);
		t->auth_url = t->aws_sts_endpoint ? t->aws_sts_endpoint :
			psprintf("https://sts.%s.amazonaws.com%s/", t->region,
					 strncmp(t->region, "cn-", 3) == 0 ? ".cn" : "");
	}
	else
	{
		if (t->region != NULL && t->aws_key_id == NULL)
			return "the target has neither AWS credentials nor a web identity";
		return NULL;
	}
	t->auth_host = outbox_url_host(t->auth_url, &why);
	if (t->auth_host == NULL)
		return psprintf("%s: %s", t->oauth_token_url ? "oauth token_url" : "sts_endpoint", why);
	return NULL;
}

/* Free a string of secrets, zeroed, and forget it. */
static void
relay_auth_forget(char **s)
{
	if (*s != NULL)
	{
		explicit_bzero(*s, strlen(*s));
		pfree(*s);
		*s = NULL;
	}
}

/* Whether t has a token (or credentials) in hand. */
static bool
relay_auth_have(RelayTarget *t)
{
	return t->auth_header != NULL || t->auth_aws_key_id != NULL;
}

/*
 * Forget t's token (or credentials), zeroed.  Its generation moves on, so
 * that whatever holds on to them (an AWS target's signer) lets go.
 */
static void
relay_auth_drop(RelayTarget *t)
{
	if (relay_auth_have(t))
		t->auth_generation++;
	relay_auth_forget(&t->auth_header);
	relay_auth_forget(&t->auth_aws_key_id);
	relay_auth_forget(&t->auth_aws_secret);
	relay_auth_forget(&t->auth_aws_token);
}


/* Give t, which has a token endpoint, its token state (none yet). */
void
relay_auth_create(RelayTarget *t)
{
	RelayAuth  *a;

	if (t->auth_url == NULL)
		return;
	a = MemoryContextAllocZero(t->cxt, sizeof(RelayAuth));
	a->t = t;
	a->fetch = relay_fetch_create(t->cxt);
	t->auth = a;
}

/* Forget the token; cancel a fetch. */
void
relay_auth_release(RelayTarget *t)
{
	RelayAuth  *a = AUTH(t);

	if (a == NULL)
		return;
	relay_fetch_free(a->fetch);
	relay_auth_drop(t);
	if (a->failure != NULL)
		pfree(a->failure);
	pfree(a);
	t->auth = NULL;
}

/*
 * Whether the target's OAuth2 options changed in n, its row read again:
 * then its token is no longer good (another endpoint, client or scope).
 */
bool
relay_auth_options_changed(RelayTarget *t, RelayTarget *n)
{
#define DIFFER(f) ((t->f == NULL) != (n->f == NULL) || (t->f != NULL && strcmp(t->f, n->f) != 0))
	return DIFFER(oauth_token_url) || DIFFER(oauth_client_id) ||
		DIFFER(oauth_client_secret) || DIFFER(oauth_scope) ||
		t->oauth_client_post != n->oauth_client_post ||
		DIFFER(aws_role_arn) || DIFFER(aws_token_file) || DIFFER(auth_url) ||
		DIFFER(region);
#undef DIFFER
}

/* What a failure to get a token says first. */
static void
relay_auth_failed_text(RelayTarget *t, char *out, size_t size, const char *fmt,...)
{
	va_list		ap;
	size_t		n;

	if (t->oauth_token_url != NULL)
		snprintf(out, size, "could not get an OAuth2 token from %s: ", t->auth_url);
	else
		snprintf(out, size, "could not get AWS credentials for %s from STS (%s): ",
				 t->aws_role_arn, t->auth_url);
	n = strlen(out);
	va_start(ap, fmt);
	vsnprintf(out + n, size - n, fmt, ap);
	va_end(ap);
}

/*
 * The web identity token t's file holds, into buf (AUTH_MAX_WEB_IDENTITY + 2
 * bytes), trailing blanks cut; or why not, into error.
 */
static bool
relay_auth_read_token_file(RelayTarget *t, char *buf, char *error, size_t size)
{
	/* non-blocking: a FIFO there must not stop the worker */
	int			fd = open(t->aws_token_file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	struct stat st;
	ssize_t		n = 0;
	ssize_t		r;

	if (fd < 0)
	{
		snprintf(error, size, "could not read the web identity token file \"%s\": %s",
				 t->aws_token_file, strerror(errno));
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > AUTH_MAX_WEB_IDENTITY + 2)
	{
		snprintf(error, size, "the web identity token file \"%s\" is not a regular file of at most %d bytes",
				 t->aws_token_file, AUTH_MAX_WEB_IDENTITY);
		close(fd);
		return false;
	}
	while (n <= AUTH_MAX_WEB_IDENTITY &&
		   (r = read(fd, buf + n, AUTH_MAX_WEB_IDENTITY + 1 - n)) != 0)
	{
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
		{
			snprintf(error, size, "could not read the web identity token file \"%s\": %s",
					 t->aws_token_file, strerror(errno));
			explicit_bzero(buf, n);
			close(fd);
			return false;
		}
		n += r;
	}
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
					 buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	if (memchr(buf, '\0', n) != NULL || !aws_token_valid(buf, 1, AUTH_MAX_WEB_IDENTITY))
	{
		explicit_bzero(buf, n);
		snprintf(error, size, "the web identity token file \"%s\" does not hold a token (1 to %d printable characters)",
				 t->aws_token_file, AUTH_MAX_WEB_IDENTITY);
		return false;
	}
	return true;
}

/* Ask STS for credentials: AssumeRoleWithWebIdentity, the token the file holds. */
static bool
relay_auth_sts_start(RelayAuth *a, char *error, size_t size)
{
	RelayTarget *t = a->t;
	StringInfoData body;
	char		session[65];
	char	   *token = palloc(AUTH_MAX_WEB_IDENTITY + 2);
	const char *headers[2] = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8",
	"Expect:"};
	bool		started;

	if (!relay_auth_read_token_file(t, token, error, size))
	{
		pfree(token);
		return false;
	}
	/* RoleSessionName: [\w+=,.@-]{2,64}, a target's name fits but its length */
	snprintf(session, sizeof(session), "outbox-%s", t->name);
	initStringInfo(&body);
	appendStringInfoString(&body, "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=");
	relay_form_value(&body, t->aws_role_arn, strlen(t->aws_role_arn));
	appendStringInfoString(&body, "&RoleSessionName=");
	relay_form_value(&body, session, strlen(session));
	appendStringInfoString(&body, "&WebIdentityToken=");
	relay_form_value(&body, token, strlen(token));
	started = relay_fetch_start(a->fetch, t->auth_url, t->auth_host, NULL, t->timeout_ms,
								headers, lengthof(headers), body.data, relay_auth_done, t,
								error, size);
	explicit_bzero(token, strlen(token));
	explicit_bzero(body.data, body.len);
	pfree(token);
	pfree(body.data);
	return started;
}

/* Ask the endpoint for a token; whether a lane waits for it. */
static void
relay_auth_fetch(RelayAuth *a, bool waited)
{
	RelayTarget *t = a->t;
	StringInfoData body;
	StringInfoData basic;
	const char *headers[4];
	int			nheaders = 0;
	char		error[512];
	bool		started;

	a->waited = waited;
	if (t->aws_role_arn != NULL)
	{
		if (relay_auth_sts_start(a, error, sizeof(error)))
			a->fetching = true;
		else
			relay_auth_done(t, 0, "", 0, error);
		return;
	}
	initStringInfo(&body);
	initStringInfo(&basic);
	appendStringInfoString(&body, "grant_type=client_credentials");
	if (t->oauth_scope != NULL && t->oauth_scope[0] != '\0')
	{
		appendStringInfoString(&body, "&scope=");
		relay_form_value(&body, t->oauth_scope, strlen(t->oauth_scope));
	}
	if (t->oauth_client_post)
	{
		appendStringInfoString(&body, "&client_id=");
		relay_form_value(&body, t->oauth_client_id, strlen(t->oauth_client_id));
		appendStringInfoString(&body, "&client_secret=");
		relay_form_value(&body, t->oauth_client_secret, strlen(t->oauth_client_secret));
	}
	else
	{
		StringInfoData pair;

		/* RFC 6749, 2.3.1: each form-encoded, then "id:secret" in base64 */
		initStringInfo(&pair);
		relay_form_value(&pair, t->oauth_client_id, strlen(t->oauth_client_id));
		appendStringInfoChar(&pair, ':');
		relay_form_value(&pair, t->oauth_client_secret, strlen(t->oauth_client_secret));
		appendStringInfoString(&basic, "Authorization: Basic ");
		outbox_append_b64(&basic, (const uint8 *) pair.data, pair.len);
		explicit_bzero(pair.data, pair.len);
		pfree(pair.data);
		headers[nheaders++] = basic.data;
	}
	headers[nheaders++] = "Content-Type: application/x-www-form-urlencoded";
	headers[nheaders++] = "Accept: application/json";
	headers[nheaders++] = "Expect:";

	started = relay_fetch_start(a->fetch, t->auth_url, t->auth_host, NULL,
								t->timeout_ms, headers, nheaders, body.data,
								relay_auth_done, t, error, sizeof(error));
	explicit_bzero(body.data, body.len);
	explicit_bzero(basic.data, basic.len);
	pfree(body.data);
	pfree(basic.data);
	if (started)
	{
		a->fetching = true;
		return;
	}
	relay_auth_done(t, 0, "", 0, error);
}

/*
 * Whether lane may send now as far as its token goes: the target has none,
 * or one it may use (READY).  Otherwise one is asked for (unless it is on
 * its way) and the lane waits (WAIT); or the last request for one failed
 * (FAILED): *why, palloc'd, says why, and the next lane to ask asks again.
 */
RelayAuthState
relay_auth_ready(RelayLane *lane, TimestampTz now, char **why)
{
	RelayTarget *t = lane->target;
	RelayAuth  *a = AUTH(t);

	if (a == NULL)
		return RELAY_AUTH_READY;
	if (relay_auth_have(t) && now < a->usable_until)
	{
		if (now >= a->refresh_at && !a->fetching)
			relay_auth_fetch(a, false);
		return RELAY_AUTH_READY;
	}
	if (a->failure != NULL && now - a->failure_at > AUTH_FAILURE_KEEP_US)
	{
		pfree(a->failure);		/* stale: ask again */
		a->failure = NULL;
	}
	if (a->failure != NULL)
	{
		*why = a->failure;
		a->failure = NULL;
		return RELAY_AUTH_FAILED;
	}
	if (!a->fetching)
		relay_auth_fetch(a, true);
	else
		a->waited = true;		/* the refresh ahead of expiry came too late */
	if (a->failure != NULL)
		return relay_auth_ready(lane, now, why);	/* it could not start */
	return RELAY_AUTH_WAIT;
}

/* Whether t's lanes wait for a token on its way (nothing to wake up for). */
bool
relay_auth_waiting(RelayTarget *t)
{
	RelayAuth  *a = AUTH(t);

	return a != NULL && a->fetching &&
		(!relay_auth_have(t) || GetCurrentTimestamp() >= a->usable_until);
}

/*
 * A receiver answered 401 to a request with the token of this generation:
 * whether to send the request again with a new one (then the token is
 * dropped, unless a newer one is already there).  Once only: a 401 to a
 * token fetched after one is the receiver's answer.
 */
bool
relay_auth_rejected(RelayTarget *t, uint32 generation)
{
	RelayAuth  *a = AUTH(t);

	if (a == NULL)
		return false;
	if (generation != t->auth_generation)
		return true;			/* sent with an older token */
	/*
	 * A token fetched because one was refused, refused too: the receiver's
	 * answer (held), for a while; a probe after that may fetch once more.
	 */
	if (a->after_401 && GetCurrentTimestamp() - a->fetched_at < AUTH_AFTER_401_US)
		return false;
	relay_auth_drop(t);
	a->want_after_401 = true;
	return true;
}

/* A request with the token of this generation was taken. */
void
relay_auth_accepted(RelayTarget *t, uint32 generation)
{
	RelayAuth  *a = AUTH(t);

	if (a != NULL && generation == t->auth_generation)
		a->after_401 = false;
}

/* Copy the printable start of s[0..len) into out (size bytes). */
static void
relay_auth_printable(char *out, size_t size, const char *s, int len)
{
	size_t		i;

	for (i = 0; i + 1 < size && (int) i < len; i++)
		out[i] = ((unsigned char) s[i] >= 0x20 && (unsigned char) s[i] < 0x7f) ? s[i] : '?';
	out[i] = '\0';
}

/* Whether s[0..len) is an RFC 6750 b64token: [A-Za-z0-9-._~+/]+ "="* */
static bool
relay_auth_b64token(const char *s, int len)
{
	int			i = 0;

	while (i < len && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
					   (s[i] >= '0' && s[i] <= '9') || strchr("-._~+/", s[i]) != NULL))
		i++;
	if (i == 0)
		return false;
	while (i < len && s[i] == '=')
		i++;
	return i == len;
}

/*
 * Read a token endpoint's answer of status 2xx: the token's Authorization
 * line, palloc'd in cxt, and its lifetime in seconds; or why not.
 */
static const char *
relay_auth_read(const char *answer, int len, MemoryContext cxt, char **header,
				int64 *lifetime_s)
{
	JscanToken	tok[AUTH_MAX_JSON_TOKENS];
	int			ntok = jscan_parse(answer, len, tok, lengthof(tok));
	int			at;
	int			tt;
	int			ei;

	if (ntok <= 0 || tok[0].type != JSCAN_OBJECT)
		return "the answer is not a JSON object (of at most 1024 values)";
	at = jscan_member(answer, tok, 0, "access_token");
	if (at < 0 || tok[at].type != JSCAN_STRING)
		return "the answer has no access_token";
	if (tok[at].end - tok[at].start > AUTH_MAX_TOKEN ||
		!relay_auth_b64token(answer + tok[at].start, tok[at].end - tok[at].start))
		return "its access_token is not a bearer token (RFC 6750) of at most 16384 characters";
	tt = jscan_member(answer, tok, 0, "token_type");
	if (!jscan_absent(answer, tok, tt))
	{
		char		type[16];

		if (!jscan_string(answer, tok, tt, type, sizeof(type)) ||
			pg_strcasecmp(type, "bearer") != 0)
			return "its token_type is not Bearer";
	}
	ei = jscan_member(answer, tok, 0, "expires_in");
	*lifetime_s = AUTH_DEFAULT_LIFETIME_S;
	if (!jscan_absent(answer, tok, ei))
	{
		char		num[32];
		char	   *end;
		double		v;

		if (tok[ei].type == JSCAN_STRING)
			jscan_string(answer, tok, ei, num, sizeof(num));
		else if (tok[ei].type == JSCAN_PRIMITIVE && tok[ei].end - tok[ei].start < (int) sizeof(num))
			relay_auth_printable(num, sizeof(num), answer + tok[ei].start,
								 tok[ei].end - tok[ei].start);
		else
			return "its expires_in is not a number";
		errno = 0;
		v = strtod(num, &end);
		if (end == num || *end != '\0' || errno != 0 || isnan(v))
			return "its expires_in is not a number";
		if (v < 1)
			return "its expires_in is below 1 second";
		*lifetime_s = (int64) Min(v, (double) AUTH_MAX_LIFETIME_S);
	}
	*header = MemoryContextAlloc(cxt, sizeof("Authorization: Bearer ") + tok[at].end - tok[at].start);
	sprintf(*header, "Authorization: Bearer %.*s", tok[at].end - tok[at].start,
			answer + tok[at].start);
	return NULL;
}

/* Read d digits at *s into *v; false if they are not there. */
static bool
relay_auth_digits(const char **s, int d, int *v)
{
	*v = 0;
	for (; d > 0; d--, (*s)++)
	{
		if (**s < '0' || **s > '9')
			return false;
		*v = *v * 10 + (**s - '0');
	}
	return true;
}

/*
 * Whether s is exactly YYYY-MM-DDTHH:MM:SS, a fraction of 1 to 9 digits
 * or none, and Z (STS's Expiration); into *tm (year and month as written).
 */
static bool
relay_auth_utc_time(const char *s, struct tm *tm)
{
	int			frac;

	if (!relay_auth_digits(&s, 4, &tm->tm_year) || *s++ != '-' ||
		!relay_auth_digits(&s, 2, &tm->tm_mon) || *s++ != '-' ||
		!relay_auth_digits(&s, 2, &tm->tm_mday) || *s++ != 'T' ||
		!relay_auth_digits(&s, 2, &tm->tm_hour) || *s++ != ':' ||
		!relay_auth_digits(&s, 2, &tm->tm_min) || *s++ != ':' ||
		!relay_auth_digits(&s, 2, &tm->tm_sec))
		return false;
	if (*s == '.')
	{
		s++;
		for (frac = 0; *s >= '0' && *s <= '9' && frac < 9; s++, frac++)
			;
		if (frac == 0)
			return false;
	}
	return s[0] == 'Z' && s[1] == '\0' &&
		tm->tm_mon >= 1 && tm->tm_mon <= 12 && tm->tm_mday >= 1 && tm->tm_mday <= 31 &&
		tm->tm_hour <= 23 && tm->tm_min <= 59 && tm->tm_sec <= 60;
}

/*
 * Read STS's answer of status 2xx: the credentials, palloc'd in cxt, and
 * their lifetime in seconds; or why not.
 */
static const char *
relay_auth_read_sts(const char *answer, int len, MemoryContext cxt, char **key_id,
					char **secret, char **token, int64 *lifetime_s)
{
	const char *c = strstr(answer, "<Credentials>");
	const char *end = c ? strstr(c, "</Credentials>") : NULL;
	char		k[130];
	char		s[130];
	char	   *tok = palloc(8194);
	char		expiration[64];
	struct tm	tm;
	const char *why = NULL;

	memset(&tm, 0, sizeof(tm));
	if (c == NULL || end == NULL || end > answer + len)
		why = "the answer holds no Credentials";
	else if (!xml_text(c, end, "AccessKeyId", k, sizeof(k)) ||
			 !xml_text(c, end, "SecretAccessKey", s, sizeof(s)) ||
			 !xml_text(c, end, "SessionToken", tok, 8194) ||
			 !xml_text(c, end, "Expiration", expiration, sizeof(expiration)))
		why = "the answer's Credentials lack AccessKeyId, SecretAccessKey, SessionToken or Expiration";
	/* (xml_text shows a byte outside printable ASCII as '?'; credentials hold none) */
	else if (aws_check_credentials(k, s, tok) != NULL || strchr(k, '?') || strchr(s, '?') ||
			 strchr(tok, '?'))
		why = "the answer's credentials are not printable ASCII of AWS's lengths";
	else if (!relay_auth_utc_time(expiration, &tm))
		why = "the answer's Expiration is not a UTC time (YYYY-MM-DDTHH:MM:SS[.fff]Z)";
	else
	{
		time_t		at;

		tm.tm_year -= 1900;
		tm.tm_mon -= 1;
		at = timegm(&tm);
		*lifetime_s = (int64) at - (int64) time(NULL);
		if (*lifetime_s < 1)
			why = "the credentials it gives have expired already (or this server's clock is ahead)";
		else
		{
			*lifetime_s = Min(*lifetime_s, (int64) AUTH_MAX_LIFETIME_S);
			*key_id = MemoryContextStrdup(cxt, k);
			*secret = MemoryContextStrdup(cxt, s);
			*token = MemoryContextStrdup(cxt, tok);
		}
	}
	explicit_bzero(s, sizeof(s));
	explicit_bzero(tok, 8194);
	pfree(tok);
	return why;
}

/*
 * What a token endpoint refusing says: its error and error_description
 * (RFC 6749, 5.2), or STS's Code and Message, or the start of its answer.
 */
static void
relay_auth_refusal(const char *answer, int len, char *out, size_t size)
{
	JscanToken	tok[AUTH_MAX_JSON_TOKENS];
	int			ntok = jscan_parse(answer, len, tok, lengthof(tok));
	char		code[64];
	char		text[160];

	if (ntok > 0 && tok[0].type == JSCAN_OBJECT &&
		jscan_string(answer, tok, jscan_member(answer, tok, 0, "error"), code, sizeof(code)))
	{
		if (jscan_string(answer, tok, jscan_member(answer, tok, 0, "error_description"),
						 text, sizeof(text)))
			snprintf(out, size, "%s (%s)", code, text);
		else
			snprintf(out, size, "%s", code);
		return;
	}
	if (xml_text(answer, answer + len, "Code", code, sizeof(code)))
	{
		if (xml_text(answer, answer + len, "Message", text, sizeof(text)))
			snprintf(out, size, "%s (%s)", code, text);
		else
			snprintf(out, size, "%s", code);
		return;
	}
	relay_auth_printable(out, size, answer, Min(len, 200));
}

/* The token endpoint answered, or could not be reached (error). */
static void
relay_auth_done(void *arg, long status, const char *answer, int len, const char *error)
{
	RelayTarget *t = (RelayTarget *) arg;
	RelayAuth  *a = AUTH(t);
	char		why[768];
	char	   *header = NULL;
	char	   *key_id = NULL;
	char	   *secret = NULL;
	char	   *token = NULL;
	int64		lifetime_s = 0;
	TimestampTz now = GetCurrentTimestamp();
	bool		waited = a->waited;

	a->fetching = false;
	a->waited = false;
	if (error != NULL)
		relay_auth_failed_text(t, why, sizeof(why), "%s", error);
	else if (status < 200 || status > 299)
	{
		char		refusal[300];

		relay_auth_refusal(answer, len, refusal, sizeof(refusal));
		relay_auth_failed_text(t, why, sizeof(why), "HTTP %ld%s%s", status,
							   refusal[0] ? ": " : "", refusal);
	}
	else
	{
		const char *bad = t->aws_role_arn != NULL ?
			relay_auth_read_sts(answer, len, t->cxt, &key_id, &secret, &token, &lifetime_s) :
			relay_auth_read(answer, len, t->cxt, &header, &lifetime_s);

		if (bad != NULL)
			relay_auth_failed_text(t, why, sizeof(why), "%s", bad);
	}

	if (header != NULL || key_id != NULL)
	{
		int64		margin_s = Min((int64) 30, lifetime_s / 10);

		relay_auth_drop(t);
		t->auth_header = header;
		t->auth_aws_key_id = key_id;
		t->auth_aws_secret = secret;
		t->auth_aws_token = token;
		t->auth_generation++;
		a->after_401 = a->want_after_401;
		a->fetched_at = now;
		a->want_after_401 = false;
		a->refresh_failures = 0;
		a->usable_until = now + (lifetime_s - margin_s) * USECS_PER_SEC;
		a->refresh_at = now + lifetime_s * USECS_PER_SEC * 3 / 4;
		if (a->usable_until <= now)
			a->usable_until = now + USECS_PER_SEC / 2;
		return;
	}

	/*
	 * A lane waits: the next to ask holds the target with the reason.  A
	 * refresh ahead of expiry tries again after a backoff, while the token
	 * lasts.
	 */
	a->want_after_401 = false;
	if (waited)
	{
		if (a->failure != NULL)
			pfree(a->failure);
		a->failure = MemoryContextStrdup(t->cxt, why);
		a->failure_at = now;
	}
	else
	{
		a->refresh_failures++;
		if (a->refresh_failures == 1 && relay_auth_have(t))
			ereport(LOG,
					(errmsg("outbox relay could not renew the token of target \"%s\"", t->name),
					 errdetail("%s", why),
					 errhint("Its current token is used until it expires.")));
		a->refresh_at = now + Min((int64) 30, (int64) 1 << Min(a->refresh_failures, 5)) * USECS_PER_SEC;
	}
}
