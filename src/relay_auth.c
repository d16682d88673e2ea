/*-------------------------------------------------------------------------
 *
 * relay_auth.c
 *	  Tokens a target's requests carry: OAuth2 client credentials (RFC 6749,
 *	  section 4.4) for HTTP targets.
 *
 * A target with a token endpoint gets its token there before its first
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
#include <math.h>

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "json_scan.h"
#include "relay.h"

/* Longest access token taken (a JWT with many claims fits). */
#define AUTH_MAX_TOKEN			16384
/* A token's lifetime when the endpoint does not give one. */
#define AUTH_DEFAULT_LIFETIME_S	3600
/* Longest lifetime believed. */
#define AUTH_MAX_LIFETIME_S		(366 * 86400)
/* Tokens in the endpoint's answer read (access_token, id_token, scope ...). */
#define AUTH_MAX_JSON_TOKENS	256

typedef struct RelayAuth
{
	RelayTarget *t;
	RelayFetch *fetch;
	bool		fetching;		/* a request for a token is on the wire */
	bool		waited;			/* a lane waits for it (else it is fetched
								 * ahead of the token's expiry) */
	char	   *failure;		/* why none could be had, for the next lane
								 * that asks (relay_auth_ready()), or NULL */
	TimestampTz usable_until;	/* t->auth_header is sent until then */
	TimestampTz refresh_at;		/* a new token is asked for from then */
	bool		after_401;		/* the token replaced one a receiver refused */
	bool		want_after_401; /* the token on its way will be such */
	int			refresh_failures;	/* failed fetches ahead of expiry in a row */
} RelayAuth;

#define AUTH(t)	((RelayAuth *) (t)->auth)

static void relay_auth_done(void *arg, long status, const char *answer, int len,
							const char *error);

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
	{
		unsigned char addr[16];

		/* an address literal of 127/8 or ::1, or the name localhost */
		loopback = pg_strcasecmp(host, "localhost") == 0 ||
			(inet_pton(AF_INET, host, addr) == 1 && addr[0] == 127) ||
			(inet_pton(AF_INET6, host, addr) == 1 &&
			 IN6_IS_ADDR_LOOPBACK((struct in6_addr *) addr));
	}
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
 * client_auth): the checks of OAuth2 client credentials, for set_oauth2().
 */
Datum
outbox_check_oauth2(PG_FUNCTION_ARGS)
{
	char	   *args[5];
	const char *what;
	const char *why;
	int			i;

	for (i = 0; i < 5; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = relay_auth_problem(args[0], args[1], args[2], args[3], args[4], &what);
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
 * The OAuth2 options of a target row (relay_config.c), checked as
 * outbox.check_oauth2() checks them: why they cannot be used, or NULL.
 * Sets t->oauth_host.
 */
const char *
relay_auth_check(RelayTarget *t)
{
	const char *why;
	const char *what;
	int			i;

	if (t->oauth_token_url == NULL)
		return NULL;
	why = relay_auth_problem(t->oauth_token_url, t->oauth_client_id, t->oauth_client_secret,
							 t->oauth_scope, t->oauth_client_post ? "post" : "basic", &what);
	if (why != NULL)
		return psprintf("oauth %s: %s", what, why);
	t->oauth_host = outbox_url_host(t->oauth_token_url, &why);
	if (t->oauth_host == NULL)
		return psprintf("oauth token_url: %s", why);
	for (i = 0; i < t->nheader_lines; i++)
		if (outbox_header_name_is(t->header_names[i], strlen(t->header_names[i]),
								  "authorization", true))
			return "a target with OAuth2 client credentials has no Authorization header of its own";
	return NULL;
}

/* Forget t's token, zeroed. */
static void
relay_auth_drop(RelayTarget *t)
{
	if (t->auth_header != NULL)
	{
		explicit_bzero(t->auth_header, strlen(t->auth_header));
		pfree(t->auth_header);
		t->auth_header = NULL;
	}
}

/* Give t, which has a token endpoint, its token state (none yet). */
void
relay_auth_create(RelayTarget *t)
{
	RelayAuth  *a;

	if (t->oauth_token_url == NULL)
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
		t->oauth_client_post != n->oauth_client_post;
#undef DIFFER
}

/* The token endpoint's URL as errors show it. */
static const char *
relay_auth_endpoint(RelayTarget *t)
{
	return t->oauth_token_url;
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
	char		error[256];
	bool		started;

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

	started = relay_fetch_start(a->fetch, t->oauth_token_url, t->oauth_host, NULL,
								t->timeout_ms, headers, nheaders, body.data,
								relay_auth_done, t, error, sizeof(error));
	explicit_bzero(body.data, body.len);
	explicit_bzero(basic.data, basic.len);
	pfree(body.data);
	pfree(basic.data);
	a->waited = waited;
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
	if (t->auth_header != NULL && now < a->usable_until)
	{
		if (now >= a->refresh_at && !a->fetching)
			relay_auth_fetch(a, false);
		return RELAY_AUTH_READY;
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
		(t->auth_header == NULL || GetCurrentTimestamp() >= a->usable_until);
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
	if (a->after_401)
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

	while (i < len && (isalnum((unsigned char) s[i]) || strchr("-._~+/", s[i]) != NULL))
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
		return "the answer is not a JSON object";
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

/*
 * What a token endpoint refusing says: its error and error_description
 * (RFC 6749, 5.2), or the start of its answer.
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
	relay_auth_printable(out, size, answer, Min(len, 200));
}

/* The token endpoint answered, or could not be reached (error). */
static void
relay_auth_done(void *arg, long status, const char *answer, int len, const char *error)
{
	RelayTarget *t = (RelayTarget *) arg;
	RelayAuth  *a = AUTH(t);
	char		why[512];
	char	   *header = NULL;
	int64		lifetime_s = 0;
	TimestampTz now = GetCurrentTimestamp();
	bool		waited = a->waited;

	a->fetching = false;
	a->waited = false;
	if (error != NULL)
		snprintf(why, sizeof(why), "could not get an OAuth2 token from %s: %s",
				 relay_auth_endpoint(t), error);
	else if (status < 200 || status > 299)
	{
		char		refusal[300];

		relay_auth_refusal(answer, len, refusal, sizeof(refusal));
		snprintf(why, sizeof(why), "could not get an OAuth2 token from %s: HTTP %ld%s%s",
				 relay_auth_endpoint(t), status, refusal[0] ? ": " : "", refusal);
	}
	else
	{
		const char *bad = relay_auth_read(answer, len, t->cxt, &header, &lifetime_s);

		if (bad != NULL)
			snprintf(why, sizeof(why), "could not get an OAuth2 token from %s: %s",
					 relay_auth_endpoint(t), bad);
	}

	if (header != NULL)
	{
		int64		margin_s = Min((int64) 30, lifetime_s / 10);

		relay_auth_drop(t);
		t->auth_header = header;
		t->auth_generation++;
		a->after_401 = a->want_after_401;
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
	if (waited)
	{
		if (a->failure != NULL)
			pfree(a->failure);
		a->failure = MemoryContextStrdup(t->cxt, why);
	}
	else
	{
		a->refresh_failures++;
		if (a->refresh_failures == 1)
			ereport(LOG,
					(errmsg("outbox relay could not renew the token of target \"%s\"", t->name),
					 errdetail("%s", why),
					 errhint("Its current token is used until it expires.")));
		a->refresh_at = now + Min((int64) 30, (int64) 1 << Min(a->refresh_failures, 5)) * USECS_PER_SEC;
	}
}
