/*-------------------------------------------------------------------------
 *
 * relay_kinesis.c
 *	  Amazon Kinesis Data Streams targets: PutRecords requests, signed with
 *	  AWS Signature Version 4 (relay_aws.c), on relay_http.c's engine.
 *
 * A lane sends up to batch_size records a request (Kinesis takes 500), at
 * most one of a key (per_message: Kinesis answers for each record, and
 * stores the records of a request in no promised order), and at most 5 MiB
 * of them; a record is at most 1 MiB with its partition key.  The request
 * goes to the target's endpoint with AWS's JSON 1.1 protocol:
 *	  POST /  X-Amz-Target: Kinesis_20131202.PutRecords
 *	  {"StreamName": ..., "Records": [{"Data": base64, "PartitionKey": ...}]}
 * A record's data is the message's outbox envelope (id, topic, key,
 * headers and payload: a record has no attributes) or, with format
 * 'cloudevents-structured', its CloudEvent.  The partition key is the
 * message's key (its topic for a message without one; a key over 256
 * bytes as "outbox-sha256-" and its SHA-256 in hex), so a key's records
 * are on one shard, in commit order.
 *
 * Kinesis answers each record in the order sent: a sequence number, or an
 * error code.  ProvisionedThroughputExceededException (the shard's limit)
 * holds the target, which backs off as a whole; InternalFailure is tried
 * again; any other code holds the target with Kinesis's reason.
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

/* Kinesis's limits: records a request, bytes a record, bytes a request. */
#define KINESIS_MAX_BATCH		500
#define KINESIS_MAX_RECORD		(1024 * 1024)
#define KINESIS_MAX_REQUEST		(5 * 1024 * 1024)

/* Longest partition key, in bytes (Kinesis counts 256 characters). */
#define KINESIS_MAX_KEY		256

/* Longest stream name. */
#define KINESIS_MAX_STREAM	128

/*
 * Tokens of an answer read: 500 records of up to 4 members each (AWS
 * leaves out what does not apply; other servers write nulls), and a few
 * members of the answer's own.
 */
#define KINESIS_MAX_TOKENS	(16 + KINESIS_MAX_BATCH * 10)

/* Outcomes by position, for relay_lane_outcome() (used at once). */
static bool kinesis_acked[KINESIS_MAX_BATCH];

/*
 * The checks of a Kinesis target's options, shared by the relay (a row may
 * have been written by hand) and outbox.check_kinesis_target().  Returns
 * why they cannot be used, or NULL; *what says which.
 */
static const char *
kinesis_check(const char *url, const char *stream, const char *region, const char *key_id,
			  const char *secret, const char *token, const char **what, char **authority)
{
	const char *why;
	const char *p;
	bool		https;
	size_t		n;
	char		host_region[AWS_MAX_REGION + 1];

	*what = "region";
	if (!aws_region_valid(region))
		return "it is not an AWS region name (1 to 32 lower-case letters, digits and '-', such as 'eu-west-1')";
	*what = "url";
	if ((why = relay_url_authority(url, authority, &https)) != NULL)
		return why;
	p = url + (https ? 8 : 7) + strlen(*authority);
	if (*p != '\0' && strcmp(p, "/") != 0)
		return "it has a path: the endpoint is https://kinesis.REGION.amazonaws.com";
	*what = "stream";
	n = stream ? strlen(stream) : 0;
	if (n == 0 || n > KINESIS_MAX_STREAM)
		return "it is not 1 to 128 characters";
	for (p = stream; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
			return "it has a character other than letters, digits, '-', '_' and '.'";
	*what = "region";
	/* kinesis.REGION.amazonaws.com: REGION must be the target's */
	aws_host_region(*authority, "kinesis", host_region);
	if (host_region[0] != '\0' && strcmp(host_region, region) != 0)
		return psprintf("the endpoint is in region \"%s\"", host_region);
	*what = "credentials";
	return aws_check_credentials(key_id, secret, token);
}

/* The relay's check of a row (RelayTransport.check): also sets post_url and host. */
static const char *
relay_kinesis_check(RelayTarget *t)
{
	const char *what;
	const char *why;
	char	   *authority;

	why = kinesis_check(t->url, t->stream, t->region, t->aws_key_id, t->aws_secret,
						t->aws_token, &what, &authority);
	return aws_row_checked(t, what, why, authority, "a Kinesis");
}

PG_FUNCTION_INFO_V1(outbox_check_kinesis_target);

static const AwsCheckError kinesis_errors[] = {
	{"url", "Kinesis endpoint", "", 0, "endpoint",
	"Leave endpoint out for the region's own, https://kinesis.REGION.amazonaws.com."},
	{"stream", "Kinesis stream name", "", 1, "stream name",
	"Give the stream's name, such as 'orders'."},
	{"region", "AWS region", " for a Kinesis target", 2, "region",
	"Give the stream's region, such as 'eu-west-1'."},
};

/*
 * outbox.check_kinesis_target(endpoint, stream, region, access_key_id,
 * secret_access_key, session_token): the checks of a Kinesis target's
 * options, for create_kinesis_target(), alter_target() and
 * set_aws_credentials().
 */
Datum
outbox_check_kinesis_target(PG_FUNCTION_ARGS)
{
	char	   *args[6];
	const char *what;
	const char *why;
	char	   *authority;
	int			i;

	for (i = 0; i < 6; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = kinesis_check(args[0], args[1], args[2], args[3], args[4], args[5], &what, &authority);
	if (why != NULL)
		aws_check_failed(kinesis_errors, lengthof(kinesis_errors), "a Kinesis", what, why, args);
	PG_RETURN_VOID();
}

/* The partition key of a message: its key, or its topic. */
static const char *
kinesis_key(RelayMessage *m)
{
	return (m->key != NULL && m->key[0] != '\0') ? m->key : m->topic;
}

/* The bytes of the partition key sent: the key, or its hash. */
static Size
kinesis_key_bytes(RelayMessage *m)
{
	Size		n = strlen(kinesis_key(m));

	return n <= KINESIS_MAX_KEY ? n : strlen("outbox-sha256-") + 2 * SHA256_DIGEST_LENGTH;
}

/*
 * A record's size as Kinesis counts it (data and partition key), at most:
 * the request's limit (RelayTransport.message_bytes).  A record that may
 * be over Kinesis's limit counts as more than a request takes, so that it
 * goes alone (and, if it is over, is a dead letter on its own).
 */
static Size
relay_kinesis_message_bytes(RelayTarget *t, RelayMessage *m)
{
	Size		n = relay_envelope_size(t, m) + kinesis_key_bytes(m);

	return n > KINESIS_MAX_RECORD ? KINESIS_MAX_REQUEST + 1 : n;
}

/* One record, at position pos; false if its data is over 1 MiB. */
static bool
kinesis_record(RelayTarget *t, RelayMessage *m, int pos, StringInfo b, StringInfo data)
{
	const char *key = kinesis_key(m);

	resetStringInfo(data);
	if (t->format == RELAY_FORMAT_OUTBOX)
		relay_envelope(m, RELAY_ENVELOPE_ALL, data);
	else
		relay_ce_structured(t, m, data);
	if ((Size) data->len + kinesis_key_bytes(m) > KINESIS_MAX_RECORD)
		return false;
	appendStringInfo(b, "%s{\"Data\":\"", pos > 0 ? "," : "");
	outbox_append_b64(b, (const uint8 *) data->data, data->len);
	appendStringInfoString(b, "\",\"PartitionKey\":");
	if (strlen(key) <= KINESIS_MAX_KEY)
		relay_json_string(b, key, strlen(key));
	else
	{
		unsigned char digest[SHA256_DIGEST_LENGTH];
		int			i;

		SHA256((const unsigned char *) key, strlen(key), digest);
		appendStringInfoString(b, "\"outbox-sha256-");
		for (i = 0; i < SHA256_DIGEST_LENGTH; i++)
			appendStringInfo(b, "%02x", digest[i]);
		appendStringInfoChar(b, '"');
	}
	appendStringInfoChar(b, '}');
	return true;
}

static bool
relay_kinesis_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	StringInfo	b;
	StringInfoData data;
	int			n = lane->cut_n;
	int			i;

	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", m->topic);
	if (AWS(t)->options_version != t->options_version)
		aws_prepare(t, "kinesis");
	lane->nbatch = n;
	b = aws_lane_body(lane);
	initStringInfo(&data);
	appendStringInfoString(b, "{\"StreamName\":");
	relay_json_string(b, t->stream, strlen(t->stream));
	appendStringInfoString(b, ",\"Records\":[");
	for (i = 0; i < n; i++, m = m->next)
	{
		if (!kinesis_record(t, m, i, b, &data))
		{
			static char why[200];

			if (i > 0)
			{
				/*
				 * Not reached (the cut sends a record that may be over the
				 * limit alone); if it were, the request ends before it.
				 */
				lane->nbatch = n = i;
				break;
			}
			/* a record over the limit, alone: a dead letter */
			snprintf(why, sizeof(why),
					 "the record takes %zu bytes with its partition key, over Kinesis's limit of %d",
					 data.len + kinesis_key_bytes(m), KINESIS_MAX_RECORD);
			pfree(data.data);
			lane->nbatch = 1;
			failed->kind = RELAY_REJECTED;
			failed->error = why;
			return false;
		}
	}
	appendStringInfoString(b, "]}");
	pfree(data.data);
	return aws_send(lane, b, "application/x-amz-json-1.1", "Kinesis_20131202.PutRecords", failed);
}

/* What Kinesis's answer means (RelayTransport.http_answer). */
static void
relay_kinesis_answer(RelayLane *lane, long status, const char *body, int len,
					 bool capped, RelayOutcome *outcome, char *msg, size_t size)
{
	static JscanToken tok[KINESIS_MAX_TOKENS];
	int			n = lane->nbatch;
	int			ntok;
	int			records;
	int			i;
	int			r;
	int			first = -1;

	Assert(n >= 1 && n <= KINESIS_MAX_BATCH);
	n = Max(1, Min(n, KINESIS_MAX_BATCH));	/* (max_batch: never more) */
	aws_lane_done(lane);
	if (status != 200)
	{
		aws_error_answer("Kinesis", status, body, len, capped, n, outcome, msg, size);
		return;
	}
	ntok = capped ? -1 : jscan_parse(body, len, tok, lengthof(tok));
	records = ntok > 0 ? jscan_member(body, tok, 0, "Records") : -1;
	if (records < 0 || tok[records].type != JSCAN_ARRAY || tok[records].size != n)
	{
		snprintf(msg, size, "Kinesis answered 200 with a body that is not PutRecords' answer for %d records%s",
				 n, capped ? " (body cut at 512 kB)" : "");
		outcome->kind = RELAY_RETRY;
		outcome->error = msg;
		return;
	}
	memset(kinesis_acked, 0, sizeof(kinesis_acked));
	for (i = 0, r = records + 1; i < n; i++, r = tok[r].next)
	{
		int			seq = jscan_member(body, tok, r, "SequenceNumber");

		/* stored: a sequence number, and no error code (absent or null) */
		kinesis_acked[i] = tok[r].type == JSCAN_OBJECT &&
			seq >= 0 && tok[seq].type == JSCAN_STRING && tok[seq].end > tok[seq].start &&
			jscan_absent(body, tok, jscan_member(body, tok, r, "ErrorCode"));
		if (!kinesis_acked[i] && first < 0)
			first = i;
	}
	if (first < 0)
	{
		outcome->kind = RELAY_DELIVERED;
		return;
	}
	outcome->ndelivered = first;
	outcome->acked = kinesis_acked;
	outcome->nsent = n;
	{
		char		code[64];
		char		text[200];

		for (i = 0, r = records + 1; i < first; i++)
			r = tok[r].next;
		if (!jscan_string(body, tok, jscan_member(body, tok, r, "ErrorCode"), code, sizeof(code)))
			strlcpy(code, "?", sizeof(code));
		if (!jscan_string(body, tok, jscan_member(body, tok, r, "ErrorMessage"), text, sizeof(text)))
			text[0] = '\0';
		snprintf(msg, size, "Kinesis did not store the record: %s%s%s", code,
				 text[0] ? ": " : "", text);
		outcome->error = msg;
		/* a record's own error is never the message's fault: not dropped */
		outcome->kind = aws_code_class(code, 200, 2);
	}
}

const RelayTransport relay_kinesis_transport = {
	.kind = "kinesis",
	.id = RELAY_KINESIS,
	.per_message = true,
	.check = relay_kinesis_check,
	.target_init = aws_target_init,
	.target_release = aws_target_release,
	.lane_init = relay_http_lane_init,
	.lane_release = relay_http_lane_release,
	.send = relay_kinesis_send,
	.drive = relay_http_drive,
	.http_answer = relay_kinesis_answer,
	.max_batch = KINESIS_MAX_BATCH,
	.max_request_bytes = KINESIS_MAX_REQUEST,
	.message_bytes = relay_kinesis_message_bytes,
};
