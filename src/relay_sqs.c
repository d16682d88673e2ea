/*-------------------------------------------------------------------------
 *
 * relay_sqs.c
 *	  Amazon SQS targets: SendMessageBatch requests, signed with AWS
 *	  Signature Version 4 (aws_sigv4.c), on relay_http.c's engine.
 *
 * A lane sends up to 10 messages a request (SQS's limit), at most one of a
 * key (per_message: SQS answers for each entry, and an entry that failed
 * is sent again after those of its key that follow it would otherwise be
 * stored), and at most 1 MiB of them as SQS counts (body and attributes).
 * The request goes to the queue URL's endpoint (scheme and authority) with
 * AWS's JSON protocol:
 *	  POST /  X-Amz-Target: AmazonSQS.SendMessageBatch
 *	  {"QueueUrl": ..., "Entries": [{"Id": "0", "MessageBody": ...,
 *	   "MessageAttributes": {...}, "MessageGroupId": ...,
 *	   "MessageDeduplicationId": ...}, ...]}
 * Each entry's Id is its position in the request.  A FIFO queue (name
 * ending in ".fifo") gets the message's key as MessageGroupId (the topic
 * for a message without one; a value SQS would not take, as
 * "outbox-sha256-" and its SHA-256 in hex) and the message id as
 * MessageDeduplicationId, so SQS drops a copy sent within 5 minutes.
 *
 * What an answer means (docs/brokers.md, "Amazon SQS"): a failed entry
 * that is the sender's fault is a dead letter with SQS's reason; one that
 * is SQS's own is retried, in order; an error of the whole request holds
 * the target (credentials, signature, no such queue, throttling: the
 * target backs off as a whole), is tried again (5xx), or, for a request of
 * one message that SQS refuses for its content, makes it a dead letter.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <openssl/sha.h>

#include "fmgr.h"
#include "utils/builtins.h"

#include "aws.h"
#include "json_scan.h"
#include "relay.h"
#include "relay_aws.h"

/* SQS's limits: entries of a SendMessageBatch, bytes of a message and of all of a request's. */
#define SQS_MAX_BATCH		10
#define SQS_MAX_BYTES		(1024 * 1024)

/* Longest queue name, with its ".fifo". */
#define SQS_MAX_QUEUE_NAME	80

/* Longest MessageGroupId. */
#define SQS_MAX_GROUP_ID	128

/* Tokens of an answer read (10 entries of a few members each fit easily). */
#define SQS_MAX_TOKENS		512

/* Outcomes by position, for relay_lane_outcome() (used at once). */
static bool sqs_acked[SQS_MAX_BATCH];

/*
 * The parts of an SQS queue URL: http(s)://authority/account/name.
 * Returns why it is not one, or NULL; sets *authority (palloc'd), *fifo,
 * and host_region to the region an AWS host names ("" for another host).
 */
static const char *
sqs_parse_url(const char *url, char **authority, bool *fifo, char *host_region)
{
	const char *why;
	const char *slash;
	const char *p;
	const char *name;
	size_t		n;
	int			digits;
	bool		https;

	host_region[0] = '\0';
	if ((why = relay_url_authority(url, authority, &https)) != NULL)
		return why;
	slash = strchr(url + (https ? 8 : 7), '/');
	if (slash == NULL)
		return "it has no path: the queue URL is https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE";
	/* the path: /account/name */
	p = slash + 1;
	for (digits = 0; p[digits] >= '0' && p[digits] <= '9'; digits++)
		;
	if (digits != 12 || p[digits] != '/')
		return "its path does not begin with a 12-digit account id: the queue URL is https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE";
	name = p + digits + 1;
	n = strlen(name);
	if (n == 0 || n > SQS_MAX_QUEUE_NAME)
		return "its queue name is not 1 to 80 characters";
	*fifo = n > 5 && strcmp(name + n - 5, ".fifo") == 0;
	for (p = name; p < name + n - (*fifo ? 5 : 0); p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
			return "its queue name has a character other than letters, digits, '-' and '_' (and a final \".fifo\")";

	/* sqs.REGION.amazonaws.com (or .com.cn): REGION must be the target's */
	aws_host_region(*authority, "sqs", host_region);
	return NULL;
}

/*
 * The checks of an SQS target's options, shared by the relay (a row may
 * have been written by hand) and outbox.check_sqs_target().  Returns why
 * they cannot be used, or NULL; *what says which ("url", "region",
 * "credentials").
 */
static const char *
sqs_check(const char *url, const char *region, const char *key_id,
		  const char *secret, const char *token, const char **what,
		  char **authority, bool *fifo)
{
	const char *why;
	char		host_region[AWS_MAX_REGION + 1];

	*what = "url";
	if ((why = sqs_parse_url(url, authority, fifo, host_region)) != NULL)
		return why;
	*what = "region";
	if (!aws_region_valid(region))
		return "it is not an AWS region name (1 to 32 lower-case letters, digits and '-', such as 'eu-west-1')";
	if (host_region[0] != '\0' && strcmp(host_region, region) != 0)
		return psprintf("the queue URL is in region \"%s\"", host_region);
	*what = "credentials";
	return aws_check_credentials(key_id, secret, token);
}

/* The relay's check of a row (RelayTransport.check): also sets post_url and host. */
static const char *
relay_sqs_check(RelayTarget *t)
{
	const char *what;
	const char *why;
	char	   *authority;
	bool		fifo;

	why = sqs_check(t->url, t->region, t->aws_key_id, t->aws_secret, t->aws_token,
					&what, &authority, &fifo);
	return aws_row_checked(t, what, why, authority, "an SQS");
}

PG_FUNCTION_INFO_V1(outbox_check_sqs_target);

static const AwsCheckError sqs_errors[] = {
	{"url", "SQS queue URL", "", 0, "URL",
	"Give the queue's URL as SQS shows it, such as 'https://sqs.eu-west-1.amazonaws.com/123456789012/orders'."},
	{"region", "AWS region", " for an SQS target", 1, "region",
	"Give the region of the queue's URL, such as 'eu-west-1'."},
};

/*
 * outbox.check_sqs_target(url, region, access_key_id, secret_access_key,
 * session_token): the checks of an SQS target's options, for
 * create_sqs_target() and alter_target().
 */
Datum
outbox_check_sqs_target(PG_FUNCTION_ARGS)
{
	char	   *args[5];
	const char *what;
	const char *why;
	char	   *authority;
	bool		fifo;
	int			i;

	for (i = 0; i < 5; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = sqs_check(args[0], args[1], args[2], args[3], args[4], &what, &authority, &fifo);
	if (why != NULL)
		aws_check_failed(sqs_errors, lengthof(sqs_errors), "an SQS", what, why, args);
	PG_RETURN_VOID();
}

/* Digits of an int64, for a message attribute. */
static int
sqs_digits(int64 v)
{
	char		buf[32];

	return pg_lltoa(v, buf);
}

/*
 * The size SQS counts of a message (its body, and each attribute's name,
 * data type and value): the request's limit (RelayTransport.message_bytes).
 * A CloudEvent's body is the upper bound relay_envelope_size() gives.
 */
static Size
relay_sqs_message_bytes(RelayTarget *t, RelayMessage *m)
{
	Size		n = t->format == RELAY_FORMAT_OUTBOX ? (Size) m->payload_len :
		relay_envelope_size(t, m);

	n += strlen("outbox-id") + 6 + RELAY_UUID_LEN;
	n += strlen("outbox-seq") + 6 + sqs_digits(m->id);
	n += strlen("outbox-topic") + 6 + strlen(m->topic);
	if (m->key != NULL && m->key[0] != '\0')
		n += strlen("outbox-key") + 6 + strlen(m->key);
	if (m->headers != NULL && strcmp(m->headers, "{}") != 0)
		n += strlen("outbox-headers") + 6 + strlen(m->headers);
	return n;
}

/* Whether s may be a MessageGroupId as it is. */
static bool
sqs_group_ok(const char *s)
{
	return aws_token_valid(s, 1, SQS_MAX_GROUP_ID);
}

static void
sqs_attribute(StringInfo b, bool *first, const char *name, const char *type,
			  const char *value)
{
	appendStringInfo(b, "%s\"%s\":{\"DataType\":\"%s\",\"StringValue\":", *first ? "" : ",",
					 name, type);
	relay_json_string(b, value, strlen(value));
	appendStringInfoChar(b, '}');
	*first = false;
}

/* One entry of the request, at position pos. */
static void
sqs_entry(RelayTarget *t, RelayMessage *m, int pos, bool fifo, StringInfo b, StringInfo tmp)
{
	bool		first = true;
	char		number[32];

	appendStringInfo(b, "%s{\"Id\":\"%d\",\"MessageBody\":", pos > 0 ? "," : "", pos);
	if (t->format == RELAY_FORMAT_OUTBOX)
		relay_json_string(b, m->payload, m->payload_len);
	else
	{
		resetStringInfo(tmp);
		relay_ce_structured(t, m, tmp);
		relay_json_string(b, tmp->data, tmp->len);
	}
	appendStringInfoString(b, ",\"MessageAttributes\":{");
	sqs_attribute(b, &first, "outbox-id", "String", m->msg_id);
	pg_lltoa(m->id, number);
	sqs_attribute(b, &first, "outbox-seq", "Number", number);
	sqs_attribute(b, &first, "outbox-topic", "String", m->topic);
	if (m->key != NULL && m->key[0] != '\0')
		sqs_attribute(b, &first, "outbox-key", "String", m->key);
	if (m->headers != NULL && strcmp(m->headers, "{}") != 0)
		sqs_attribute(b, &first, "outbox-headers", "String", m->headers);
	appendStringInfoChar(b, '}');
	if (fifo)
	{
		const char *group = (m->key != NULL && m->key[0] != '\0') ? m->key : m->topic;

		appendStringInfoString(b, ",\"MessageGroupId\":");
		if (sqs_group_ok(group))
			relay_json_string(b, group, strlen(group));
		else
		{
			unsigned char digest[SHA256_DIGEST_LENGTH];
			int			i;

			SHA256((const unsigned char *) group, strlen(group), digest);
			appendStringInfoString(b, "\"outbox-sha256-");
			for (i = 0; i < SHA256_DIGEST_LENGTH; i++)
				appendStringInfo(b, "%02x", digest[i]);
			appendStringInfoChar(b, '"');
		}
		appendStringInfo(b, ",\"MessageDeduplicationId\":\"%s\"", m->msg_id);
	}
	appendStringInfoChar(b, '}');
}

/* Whether the target's queue is a FIFO queue. */
static bool
sqs_fifo(RelayTarget *t)
{
	size_t		n = strlen(t->url);

	return n > 5 && strcmp(t->url + n - 5, ".fifo") == 0;
}

static bool
relay_sqs_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	StringInfo	b;
	StringInfoData tmp;
	int			n = lane->cut_n;
	int			i;
	bool		fifo = sqs_fifo(t);

	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", m->topic);
	if (AWS(t)->options_version != t->options_version)
		aws_prepare(t, "sqs");
	lane->nbatch = n;
	if (n == 1 && relay_sqs_message_bytes(t, m) > SQS_MAX_BYTES)
	{
		static char why[200];

		snprintf(why, sizeof(why),
				 "the message takes %zu bytes as SQS counts them (body and attributes), over SQS's limit of %d",
				 relay_sqs_message_bytes(t, m), SQS_MAX_BYTES);
		failed->kind = RELAY_REJECTED;
		failed->error = why;
		return false;
	}

	b = aws_lane_body(lane);
	initStringInfo(&tmp);
	appendStringInfoString(b, "{\"QueueUrl\":");
	relay_json_string(b, t->url, strlen(t->url));
	appendStringInfoString(b, ",\"Entries\":[");
	for (i = 0; i < n; i++, m = m->next)
		sqs_entry(t, m, i, fifo, b, &tmp);
	appendStringInfoString(b, "]}");
	pfree(tmp.data);
	return aws_send(lane, b, "application/x-amz-json-1.0", "AmazonSQS.SendMessageBatch", failed);
}

/*
 * The position an entry's Id names: the decimal digits of a position the
 * request has, exactly as sent ("0" to "9"); -1 for anything else.
 */
static int
sqs_position(const char *body, const JscanToken *tok, int entry, int n)
{
	char		id[8];
	int			pos;

	if (tok[entry].type != JSCAN_OBJECT ||
		!jscan_string(body, tok, jscan_member(body, tok, entry, "Id"), id, sizeof(id)) ||
		id[0] < '0' || id[0] > '9' || id[1] != '\0')
		return -1;
	pos = id[0] - '0';
	return pos < n ? pos : -1;
}

/*
 * What SQS's answer means (RelayTransport.http_answer).  Anything not
 * understood is never taken to mean "drop the message": an entry counts
 * as stored only if the answer says so and names no failure of it.
 */
static void
relay_sqs_answer(RelayLane *lane, long status, const char *body, int len,
				 bool capped, RelayOutcome *outcome, char *msg, size_t size)
{
	JscanToken	tok[SQS_MAX_TOKENS];
	int			ntok;
	int			n = lane->nbatch;
	int			i;

	StaticAssertStmt(SQS_MAX_BATCH <= 10, "an entry's Id is one digit");
	Assert(n >= 1 && n <= SQS_MAX_BATCH);
	n = Max(1, Min(n, SQS_MAX_BATCH));	/* (max_batch: never more) */
	aws_lane_done(lane);
	if (status != 200)
	{
		aws_error_answer("SQS", status, body, len, capped, n, outcome, msg, size);
		return;
	}
	ntok = capped ? -1 : jscan_parse(body, len, tok, lengthof(tok));
	{
		int			ok = ntok > 0 ? jscan_member(body, tok, 0, "Successful") : -1;
		int			bad = ntok > 0 ? jscan_member(body, tok, 0, "Failed") : -1;
		int			failed_at[SQS_MAX_BATCH];	/* token of an entry's failure */
		bool		stored[SQS_MAX_BATCH];
		int			e;
		char		code[64];
		char		text[200];

		if (ntok <= 0 || (ok >= 0 && tok[ok].type != JSCAN_ARRAY) ||
			(bad >= 0 && tok[bad].type != JSCAN_ARRAY))
		{
			snprintf(msg, size, "SQS answered 200 with a body that is not SendMessageBatch's answer%s",
					 capped ? " (body cut at 512 kB)" : "");
			outcome->kind = RELAY_RETRY;
			outcome->error = msg;
			return;
		}
		memset(stored, 0, sizeof(stored));
		for (i = 0; i < n; i++)
			failed_at[i] = -1;
		for (e = ok >= 0 ? ok + 1 : 0; ok >= 0 && e < tok[ok].next; e = tok[e].next)
			if ((i = sqs_position(body, tok, e, n)) >= 0)
				stored[i] = true;
		for (e = bad >= 0 ? bad + 1 : 0; bad >= 0 && e < tok[bad].next; e = tok[e].next)
			if ((i = sqs_position(body, tok, e, n)) >= 0 && failed_at[i] < 0)
				failed_at[i] = e;
		for (i = 0; i < n; i++)
			sqs_acked[i] = stored[i] && failed_at[i] < 0;
		for (i = 0; i < n && sqs_acked[i]; i++)
			;
		if (i == n)
		{
			outcome->kind = RELAY_DELIVERED;
			return;
		}
		outcome->ndelivered = i;
		outcome->acked = sqs_acked;
		outcome->nsent = n;
		outcome->error = msg;
		e = failed_at[i];
		if (e < 0)
		{
			snprintf(msg, size, "SQS's answer does not say entry %d of the request was stored", i);
			outcome->kind = RELAY_RETRY;
			return;
		}
		if (!jscan_string(body, tok, jscan_member(body, tok, e, "Code"), code, sizeof(code)))
			strlcpy(code, "?", sizeof(code));
		if (!jscan_string(body, tok, jscan_member(body, tok, e, "Message"), text, sizeof(text)))
			text[0] = '\0';
		if (jscan_true(body, tok, jscan_member(body, tok, e, "SenderFault")) && !stored[i] &&
			!aws_code_not_message(code))
		{
			snprintf(msg, size, "SQS refused the message: %s%s%s", code, text[0] ? ": " : "", text);
			outcome->kind = RELAY_REJECTED;
		}
		else
		{
			/*
			 * SQS's fault (or an answer that says both, stored and failed:
			 * sent again, never dropped): its code says whether to back
			 * off or try again.
			 */
			snprintf(msg, size, "SQS failed to store the message: %s%s%s", code, text[0] ? ": " : "", text);
			outcome->kind = aws_code_class(code, 200, 2);
		}
	}
}

const RelayTransport relay_sqs_transport = {
	.kind = "sqs",
	.id = RELAY_SQS,
	.per_message = true,
	.check = relay_sqs_check,
	.target_init = aws_target_init,
	.target_release = aws_target_release,
	.lane_init = relay_http_lane_init,
	.lane_release = relay_http_lane_release,
	.send = relay_sqs_send,
	.drive = relay_http_drive,
	.http_answer = relay_sqs_answer,
	.max_batch = SQS_MAX_BATCH,
	.max_request_bytes = SQS_MAX_BYTES,
	.message_bytes = relay_sqs_message_bytes,
};
