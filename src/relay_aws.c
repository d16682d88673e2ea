/*-------------------------------------------------------------------------
 *
 * relay_aws.c
 *	  What the AWS targets (relay_sqs.c, relay_kinesis.c) share: their
 *	  credentials' checks, a target's signer and buffers, a request to an
 *	  AWS JSON API signed with Signature Version 4 (aws_sigv4.c) put on
 *	  relay_http.c's engine, and what an error of a whole request means.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"


#include "utils/builtins.h"

#include "aws.h"
#include "json_scan.h"
#include "relay.h"
#include "relay_aws.h"


/*
 * The region an AWS host names, "<service>.<region>.amazonaws.com" (or
 * .com.cn, with or without a final dot, with a port), into region
 * (AWS_MAX_REGION + 1 bytes); "" for another host.
 */
void
aws_host_region(const char *authority, const char *service, char *region)
{
	size_t		s = strlen(service);
	const char *r;
	const char *dot;
	const char *rest;

	region[0] = '\0';
	if (pg_strncasecmp(authority, service, s) != 0 || authority[s] != '.')
		return;
	r = authority + s + 1;
	dot = strchr(r, '.');
	if (dot == NULL || dot - r > AWS_MAX_REGION || pg_strncasecmp(dot, ".amazonaws.com", 14) != 0)
		return;
	rest = dot + 14;
	if (pg_strncasecmp(rest, ".cn", 3) == 0)
		rest += 3;
	if (*rest == '.')
		rest++;
	if (*rest != '\0' && *rest != ':')
		return;
	memcpy(region, r, dot - r);
	region[dot - r] = '\0';
	for (r = region; *r; r++)
		*(char *) r = pg_tolower((unsigned char) *r);
}

/*
 * The end of an AWS kind's check of a row (RelayTransport.check): its own
 * checks said why (or NULL) about what; then what every AWS kind refuses,
 * and the target's post_url (the endpoint, path /) and host.  kind: "an
 * SQS", "a Kinesis".
 */
const char *
aws_row_checked(RelayTarget *t, const char *what, const char *why,
				const char *authority, const char *kind)
{
	if (why != NULL)
		return psprintf("%s: %s", what, why);
	if (t->format == RELAY_FORMAT_CE_BINARY)
		return psprintf("format: %s target sends CloudEvents in structured mode only", kind);
	if (t->nheader_lines > 0)
		return psprintf("headers: %s target has no headers of its own", kind);
	t->post_url = psprintf("%s://%s/", strncmp(t->url, "https:", 6) == 0 ? "https" : "http",
						   authority);
	t->host = outbox_url_host(t->url, &why);
	return t->host == NULL ? why : NULL;
}

/*
 * The error of an AWS kind's SQL check function (outbox.check_sqs_target()
 * and the like): the option its check named (what), why it cannot be used,
 * as the kind's table says, with the value the caller gave (args[arg]);
 * credentials the same for every kind, without their values.  kind: "an
 * SQS" ...
 */
void
aws_check_failed(const AwsCheckError *errors, int nerrors, const char *kind,
				 const char *what, const char *why, char **args)
{
	int			i;

	for (i = 0; i < nerrors; i++)
		if (strcmp(errors[i].what, what) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid %s %s%s", errors[i].noun,
							args[errors[i].arg] ? quote_literal_cstr(args[errors[i].arg]) : "NULL",
							errors[i].suffix),
					 errdetail("The %s is not usable: %s.", errors[i].subject, why),
					 errhint("%s", errors[i].hint)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid AWS credentials for %s target", kind),
			 errdetail("The credentials are not usable: %s.", why),
			 errhint("Give an access key id and its secret access key (and, for temporary credentials, the session token) as AWS shows them.")));
}

void
aws_target_init(RelayTarget *t)
{
	AwsTarget  *a = palloc0(sizeof(AwsTarget));

	initStringInfo(&a->auth);
	initStringInfo(&a->line);
	a->options_version = -1;
	t->priv = a;
}

/* The target goes: its signing key is wiped. */
void
aws_target_release(RelayTarget *t)
{
	AwsTarget  *a = AWS(t);

	if (a != NULL)
		explicit_bzero(&a->signer, sizeof(a->signer));
}

/*
 * Take the target's options (again, after they changed): the authority of
 * post_url, the signer.  The strings are the target's (t->cxt or its
 * opts_cxt), which live as long as these options are the target's.
 */
void
aws_prepare(RelayTarget *t, const char *service)
{
	AwsTarget  *a = AWS(t);
	MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);
	bool		https;

	if (a->authority != NULL)
		pfree(a->authority);
	a->authority = NULL;
	/* checked when the row was read */
	if (relay_url_authority(t->post_url, &a->authority, &https) != NULL)
		a->authority = pstrdup("");
	explicit_bzero(a->signer.key, sizeof(a->signer.key));
	memset(&a->signer, 0, sizeof(a->signer));
	if (t->aws_role_arn != NULL)
	{
		/* web identity: STS's credentials (relay_auth.c), when there are */
		a->signer.access_key_id = t->auth_aws_key_id;
		a->signer.secret_access_key = t->auth_aws_secret;
		a->signer.session_token = t->auth_aws_token;
	}
	else
	{
		a->signer.access_key_id = t->aws_key_id;
		a->signer.secret_access_key = t->aws_secret;
		a->signer.session_token = t->aws_token;
	}
	a->auth_generation = t->auth_generation;
	a->signer.region = t->region;
	a->signer.service = service;
	a->options_version = t->options_version;
	MemoryContextSwitchTo(oldcxt);
}

/*
 * A lane's request body buffer larger than this is given back before the
 * lane's next request (relay_http.c gives back its own so).
 */
#define AWS_BODY_KEEP	(256 * 1024)

/* The lane's request body buffer, kept until its request ends; reset. */
/* The lane's request ended: a large body buffer is given back now. */
void
aws_lane_done(RelayLane *lane)
{
	AwsTarget  *a = AWS(lane->target);

	if (lane->index < a->nbodies && a->bodies[lane->index].maxlen > AWS_BODY_KEEP)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(lane->target->cxt);

		pfree(a->bodies[lane->index].data);
		initStringInfo(&a->bodies[lane->index]);
		MemoryContextSwitchTo(oldcxt);
	}
}

StringInfo
aws_lane_body(RelayLane *lane)
{
	RelayTarget *t = lane->target;
	AwsTarget  *a = AWS(t);
	StringInfo	b;

	if (lane->index >= a->nbodies)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(t->cxt);
		int			want = lane->index + 1;
		int			i;

		a->bodies = a->bodies ? repalloc(a->bodies, sizeof(StringInfoData) * want) :
			palloc(sizeof(StringInfoData) * want);
		for (i = a->nbodies; i < want; i++)
			initStringInfo(&a->bodies[i]);
		a->nbodies = want;
		MemoryContextSwitchTo(oldcxt);
	}
	aws_lane_done(lane);		/* (a request that ended without an answer) */
	b = &a->bodies[lane->index];
	resetStringInfo(b);
	return b;
}

static void
aws_header(RelayLane *lane, StringInfo line, const char *name, const char *value)
{
	resetStringInfo(line);
	appendStringInfo(line, "%s: %s", name, value);
	relay_http_header(lane, line->data);
}

/*
 * Sign body (the lane's, from aws_lane_body()) as a POST / to the target's
 * endpoint with X-Amz-Target target (NULL: none, AWS's query protocol) and
 * content type content_type, and start it.
 */
bool
aws_send(RelayLane *lane, StringInfo body, const char *content_type,
		 const char *target, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	AwsTarget  *a = AWS(t);
	char		amz_date[17];
	const char *names[2] = {"content-type", "x-amz-target"};
	const char *values[2];

	values[0] = content_type;
	values[1] = target;
	if (t->aws_role_arn != NULL && a->auth_generation != t->auth_generation)
		aws_prepare(t, a->signer.service);	/* new credentials from STS */
	if (a->signer.access_key_id == NULL)
	{
		/* not the message's fault: held, no attempt counted */
		failed->kind = RELAY_RECEIVER_FAILED;
		failed->error = "the target's AWS credentials from STS went away before the request was sent";
		return false;
	}
	relay_http_auth_sent(lane, t->aws_role_arn != NULL, t->auth_generation);
	aws_sigv4_sign(&a->signer, "POST", "/", a->authority, names, values, target ? 2 : 1,
				   body->data, body->len, time(NULL), amz_date, &a->auth);
	relay_http_headers_reset(lane);
	aws_header(lane, &a->line, "Host", a->authority);
	aws_header(lane, &a->line, "Content-Type", content_type);
	if (target != NULL)
		aws_header(lane, &a->line, "X-Amz-Target", target);
	aws_header(lane, &a->line, "X-Amz-Date", amz_date);
	if (a->signer.session_token != NULL)
		aws_header(lane, &a->line, "X-Amz-Security-Token", a->signer.session_token);
	aws_header(lane, &a->line, "Authorization", a->auth.data);
	relay_http_header(lane, "Expect:");
	return relay_http_start(lane, body->data, body->len, failed);
}

static bool
aws_code_in(const char *code, const char *const *list)
{
	for (; *list != NULL; list++)
		if (strcmp(code, *list) == 0)
			return true;
	return false;
}

/*
 * Throttling: the service asks for less.  The target backs off as a whole
 * (held): no message's attempts are used up.
 */
static const char *const aws_throttle_codes[] = {
	"ThrottlingException", "RequestThrottled", "Throttling", "Throttled", "KmsThrottled",
	"KMSThrottlingException", "RequestThrottledException", "TooManyRequestsException",
	"ProvisionedThroughputExceededException", "LimitExceededException", NULL
};

/* The service failed this once: the request is tried again, as a 5xx. */
static const char *const aws_retry_codes[] = {
	"ServiceUnavailable", "InternalError", "InternalFailure", "RequestTimeout",
	"RequestTimeoutException", "ServiceUnavailableException", NULL
};

/* The service refuses the content of the request. */
static const char *const aws_content_codes[] = {
	"InvalidMessageContents", "BatchRequestTooLong", "InvalidParameterValue",
	"InvalidAttributeName", "InvalidAttributeValue", "MessageTooLong",
	"InvalidParameterValueException", "ValidationException",
	"InvalidParameter", "ParameterValueInvalid",
	"InvalidArgumentException", "SerializationException", NULL
};

/*
 * Whether code says the service wants less (throttling), or is about the
 * target's own set-up (KMS keys): never the message's fault, whatever the
 * service calls it.
 */
bool
aws_code_not_message(const char *code)
{
	return aws_code_in(code, aws_throttle_codes) || pg_strncasecmp(code, "KMS", 3) == 0;
}

/*
 * What an error code of a whole request of nmessages messages, or of one
 * entry that is the service's fault (nmessages 2: never a dead letter),
 * means.
 */
RelayOutcomeKind
aws_code_class(const char *code, long status, int nmessages)
{
	if (aws_code_in(code, aws_throttle_codes))
		return RELAY_RECEIVER_FAILED;
	if (status >= 500 || aws_code_in(code, aws_retry_codes))
		return RELAY_RETRY;
	if (aws_code_in(code, aws_content_codes))
		/*
		 * About the content of a request of one message: it is refused; of
		 * several: held, and the probe sends the first alone (per_message),
		 * to find which, using up no message's attempts.
		 */
		return nmessages == 1 ? RELAY_REJECTED : RELAY_RECEIVER_FAILED;

	/*
	 * Credentials, signature, permissions, no such queue or stream, KMS,
	 * and any code not known: the target's, not the message's.
	 */
	return RELAY_RECEIVER_FAILED;
}

/*
 * A request's answer that is not 200: an AWS JSON error, {"__type":
 * "...#Code", "message": ...}, said in msg as "<service> answered HTTP
 * <status>: <Code>: <message>".
 */
void
aws_error_answer(const char *service, long status, const char *body, int len,
				 bool capped, int nmessages, RelayOutcome *outcome, char *msg, size_t size)
{
	JscanToken	tok[64];
	int			ntok = capped ? -1 : jscan_parse(body, len, tok, lengthof(tok));
	char		type[128];
	char		text[200];
	const char *code;

	type[0] = text[0] = '\0';
	if (ntok > 0)
	{
		jscan_string(body, tok, jscan_member(body, tok, 0, "__type"), type, sizeof(type));
		if (!jscan_string(body, tok, jscan_member(body, tok, 0, "message"), text, sizeof(text)))
			jscan_string(body, tok, jscan_member(body, tok, 0, "Message"), text, sizeof(text));
	}
	else if (len > 0)
	{
		/* not JSON (a proxy's page, say): its start, printable */
		int			i;

		for (i = 0; i < len && i < 100; i++)
			text[i] = ((unsigned char) body[i] >= 0x20 && (unsigned char) body[i] < 0x7f) ? body[i] : '?';
		text[i] = '\0';
	}
	code = strrchr(type, '#') ? strrchr(type, '#') + 1 : type;
	outcome->error = msg;
	if (code[0] == '\0')
	{
		/* no AWS error code: as an HTTP target's status, 429 a throttle */
		snprintf(msg, size, "%s answered HTTP %ld%s%s%s", service, status,
				 text[0] ? ": " : "", text, capped ? " (body cut at 512 kB)" : "");
		outcome->kind = status == 429 ? RELAY_RECEIVER_FAILED :
			(status >= 500 || status == 408) ? RELAY_RETRY : RELAY_RECEIVER_FAILED;
		return;
	}
	snprintf(msg, size, "%s answered HTTP %ld: %s%s%s", service, status, code,
			 text[0] ? ": " : "", text);
	outcome->kind = aws_code_class(code, status, nmessages);
	outcome->auth_refused = aws_code_refuses_credentials(code);
}

/*
 * Whether code says the request's temporary credentials are no longer
 * good (expired, or revoked): a target with web identity gets new ones
 * from STS once and sends the request again (relay_auth.c).
 */
bool
aws_code_refuses_credentials(const char *code)
{
	static const char *const codes[] = {
		"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId",
		"UnrecognizedClientException", NULL
	};

	return aws_code_in(code, codes);
}
