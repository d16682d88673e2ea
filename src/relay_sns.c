/*-------------------------------------------------------------------------
 *
 * relay_sns.c
 *	  Amazon SNS targets: PublishBatch requests, signed with AWS Signature
 *	  Version 4 (relay_aws.c), on relay_http.c's engine.
 *
 * A lane publishes up to 10 messages a request (SNS's limit), at most one
 * of a key (per_message: SNS answers for each entry), at most 256 KiB of
 * them.  SNS speaks AWS's query protocol: the request is a form,
 *	  Action=PublishBatch&Version=2010-03-31&TopicArn=...&
 *	  PublishBatchRequestEntries.member.N.Id=N-1&...Message=...&
 *	  ...MessageAttributes.entry.K.Name=outbox-id&...
 * and the answer XML: <Successful><member><Id>..</Id>...</member>...
 * </Successful><Failed><member><Id/><Code/><Message/><SenderFault/>
 * </member>...</Failed>, or <ErrorResponse><Error><Code/><Message/>.
 * A FIFO topic (its name ends in ".fifo") gets the key as MessageGroupId
 * and the message id as MessageDeduplicationId, as an SQS FIFO queue.
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

/* SNS's limits: entries of a PublishBatch, bytes of all its messages. */
#define SNS_MAX_BATCH		10
#define SNS_MAX_BYTES		(256 * 1024)

/* Outcomes by position, for relay_lane_outcome() (used at once). */
static bool sns_acked[SNS_MAX_BATCH];

/*
 * The parts of a topic ARN, arn:PARTITION:sns:REGION:ACCOUNT:NAME: its
 * region (into region, AWS_MAX_REGION + 1 bytes) and whether it is FIFO.
 * Returns why it is not one, or NULL.
 */
static const char *
sns_parse_arn(const char *arn, char *region, bool *fifo)
{
	const char *p;
	const char *r;
	const char *name;
	int			digits;
	size_t		n;

	if (arn == NULL)
		return "it is missing";
	if (strncmp(arn, "arn:aws:sns:", 12) == 0)
		p = arn + 12;
	else if (strncmp(arn, "arn:aws-cn:sns:", 15) == 0)
		p = arn + 15;
	else if (strncmp(arn, "arn:aws-us-gov:sns:", 19) == 0)
		p = arn + 19;
	else
		return "it does not begin with arn:aws:sns: (or arn:aws-cn:sns:, arn:aws-us-gov:sns:)";
	r = p;
	p = strchr(r, ':');
	if (p == NULL || p - r < 1 || p - r > AWS_MAX_REGION)
		return "it has no region";
	memcpy(region, r, p - r);
	region[p - r] = '\0';
	if (!aws_region_valid(region))
		return "its region is not an AWS region name";
	for (digits = 0, p++; p[digits] >= '0' && p[digits] <= '9'; digits++)
		;
	if (digits != 12 || p[digits] != ':')
		return "it has no 12-digit account id";
	name = p + digits + 1;
	n = strlen(name);
	if (n == 0 || n > 256)
		return "its topic name is not 1 to 256 characters";
	*fifo = n > 5 && strcmp(name + n - 5, ".fifo") == 0;
	for (p = name; p < name + n - (*fifo ? 5 : 0); p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
			return "its topic name has a character other than letters, digits, '-' and '_' (and a final \".fifo\")";
	return NULL;
}

/*
 * The checks of an SNS target's options, shared by the relay and
 * outbox.check_sns_target(): the endpoint (url), the topic ARN, the
 * region (the ARN's), the credentials.
 */
static const char *
sns_check(const char *url, const char *arn, const char *region, const char *key_id,
		  const char *secret, const char *token, const char **what, char **authority)
{
	const char *why;
	const char *p;
	bool		https;
	bool		fifo;
	char		arn_region[AWS_MAX_REGION + 1];
	char		host_region[AWS_MAX_REGION + 1];

	*what = "topic";
	if ((why = sns_parse_arn(arn, arn_region, &fifo)) != NULL)
		return why;
	*what = "region";
	if (!aws_region_valid(region))
		return "it is not an AWS region name (1 to 32 lower-case letters, digits and '-', such as 'eu-west-1')";
	if (strcmp(region, arn_region) != 0)
		return psprintf("the topic is in region \"%s\"", arn_region);
	*what = "url";
	if ((why = relay_url_authority(url, authority, &https)) != NULL)
		return why;
	p = url + (https ? 8 : 7) + strlen(*authority);
	if (*p != '\0' && strcmp(p, "/") != 0)
		return "it has a path: the endpoint is https://sns.REGION.amazonaws.com";
	aws_host_region(*authority, "sns", host_region);
	*what = "region";
	if (host_region[0] != '\0' && strcmp(host_region, region) != 0)
		return psprintf("the endpoint is in region \"%s\"", host_region);
	*what = "credentials";
	return aws_check_credentials(key_id, secret, token);
}

static const char *
relay_sns_check(RelayTarget *t)
{
	const char *what;
	const char *why;
	char	   *authority = NULL;

	why = sns_check(t->url, t->topic, t->region, t->aws_key_id, t->aws_secret, t->aws_token,
					&what, &authority);
	return aws_row_checked(t, what, why, authority, "an SNS");
}

PG_FUNCTION_INFO_V1(outbox_check_sns_target);

static const AwsCheckError sns_errors[] = {
	{"topic", "SNS topic ARN", "", 1, "ARN",
	"Give the topic's ARN as SNS shows it, such as 'arn:aws:sns:eu-west-1:123456789012:orders'."},
	{"url", "SNS endpoint", "", 0, "endpoint",
	"Leave endpoint out for the region's own, https://sns.REGION.amazonaws.com."},
	{"region", "AWS region", " for an SNS target", 2, "region",
	"Give the topic's region, such as 'eu-west-1'."},
};

/*
 * outbox.check_sns_target(endpoint, topic_arn, region, access_key_id,
 * secret_access_key, session_token): the checks of an SNS target's
 * options, for create_sns_target(), alter_target() and
 * set_aws_credentials().
 */
Datum
outbox_check_sns_target(PG_FUNCTION_ARGS)
{
	char	   *args[6];
	const char *what;
	const char *why;
	char	   *authority;
	int			i;

	for (i = 0; i < 6; i++)
		args[i] = PG_ARGISNULL(i) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(i));
	why = sns_check(args[0], args[1], args[2], args[3], args[4], args[5], &what, &authority);
	if (why != NULL)
		aws_check_failed(sns_errors, lengthof(sns_errors), "an SNS", what, why, args);
	PG_RETURN_VOID();
}

static void
sns_field(StringInfo b, int pos, const char *name, const char *value)
{
	appendStringInfo(b, "&PublishBatchRequestEntries.member.%d.%s=", pos + 1, name);
	relay_form_value(b, value, strlen(value));
}

static void
sns_attribute(StringInfo b, int pos, int *k, const char *name, const char *type, const char *value)
{
	(*k)++;
	appendStringInfo(b, "&PublishBatchRequestEntries.member.%d.MessageAttributes.entry.%d.Name=%s"
					 "&PublishBatchRequestEntries.member.%d.MessageAttributes.entry.%d.Value.DataType=%s"
					 "&PublishBatchRequestEntries.member.%d.MessageAttributes.entry.%d.Value.StringValue=",
					 pos + 1, *k, name, pos + 1, *k, type, pos + 1, *k);
	relay_form_value(b, value, strlen(value));
}

/* The size SNS counts of a message: body and attributes. */
static Size
relay_sns_message_bytes(RelayTarget *t, RelayMessage *m)
{
	Size		n = t->format == RELAY_FORMAT_OUTBOX ? (Size) m->payload_len :
		relay_envelope_size(t, m);
	char		number[32];

	n += strlen("outbox-id") + 6 + RELAY_UUID_LEN;
	n += strlen("outbox-seq") + 6 + pg_lltoa(m->id, number);
	n += strlen("outbox-topic") + 6 + strlen(m->topic);
	if (m->key != NULL && m->key[0] != '\0')
		n += strlen("outbox-key") + 6 + strlen(m->key);
	if (m->headers != NULL && strcmp(m->headers, "{}") != 0)
		n += strlen("outbox-headers") + 6 + strlen(m->headers);
	return n;
}

static void
sns_entry(RelayTarget *t, RelayMessage *m, int pos, bool fifo, StringInfo b, StringInfo tmp)
{
	char		number[32];
	char		id[8];
	int			k = 0;

	snprintf(id, sizeof(id), "%d", pos);
	sns_field(b, pos, "Id", id);
	appendStringInfo(b, "&PublishBatchRequestEntries.member.%d.Message=", pos + 1);
	if (t->format == RELAY_FORMAT_OUTBOX)
		relay_form_value(b, m->payload, m->payload_len);
	else
	{
		resetStringInfo(tmp);
		relay_ce_structured(t, m, tmp);
		relay_form_value(b, tmp->data, tmp->len);
	}
	sns_attribute(b, pos, &k, "outbox-id", "String", m->msg_id);
	pg_lltoa(m->id, number);
	sns_attribute(b, pos, &k, "outbox-seq", "Number", number);
	sns_attribute(b, pos, &k, "outbox-topic", "String", m->topic);
	if (m->key != NULL && m->key[0] != '\0')
		sns_attribute(b, pos, &k, "outbox-key", "String", m->key);
	if (m->headers != NULL && strcmp(m->headers, "{}") != 0)
		sns_attribute(b, pos, &k, "outbox-headers", "String", m->headers);
	if (fifo)
	{
		const char *group = (m->key != NULL && m->key[0] != '\0') ? m->key : m->topic;

		if (aws_token_valid(group, 1, 128))
			sns_field(b, pos, "MessageGroupId", group);
		else
		{
			unsigned char digest[SHA256_DIGEST_LENGTH];
			char		hashed[100];
			int			i;

			SHA256((const unsigned char *) group, strlen(group), digest);
			strlcpy(hashed, "outbox-sha256-", sizeof(hashed));
			for (i = 0; i < SHA256_DIGEST_LENGTH; i++)
				snprintf(hashed + 14 + 2 * i, 3, "%02x", digest[i]);
			sns_field(b, pos, "MessageGroupId", hashed);
		}
		sns_field(b, pos, "MessageDeduplicationId", m->msg_id);
	}
}

static bool
relay_sns_send(RelayLane *lane, RelayOutcome *failed)
{
	RelayTarget *t = lane->target;
	RelayMessage *m = lane->head;
	StringInfo	b;
	StringInfoData tmp;
	int			n = lane->cut_n;
	int			i;
	size_t		len = strlen(t->topic);
	bool		fifo = len > 5 && strcmp(t->topic + len - 5, ".fifo") == 0;

	memset(failed, 0, sizeof(*failed));
	relay_test_fault("send", m->topic);
	if (AWS(t)->options_version != t->options_version)
		aws_prepare(t, "sns");
	lane->nbatch = n;
	if (n == 1 && relay_sns_message_bytes(t, m) > SNS_MAX_BYTES)
	{
		static char why[200];

		snprintf(why, sizeof(why),
				 "the message takes %zu bytes as SNS counts them (body and attributes), over SNS's limit of %d",
				 relay_sns_message_bytes(t, m), SNS_MAX_BYTES);
		failed->kind = RELAY_REJECTED;
		failed->error = why;
		return false;
	}
	b = aws_lane_body(lane);
	initStringInfo(&tmp);
	appendStringInfoString(b, "Action=PublishBatch&Version=2010-03-31&TopicArn=");
	relay_form_value(b, t->topic, len);
	for (i = 0; i < n; i++, m = m->next)
		sns_entry(t, m, i, fifo, b, &tmp);
	pfree(tmp.data);
	return aws_send(lane, b, "application/x-www-form-urlencoded; charset=utf-8", NULL, failed);
}

/* The position an entry's <Id> names: "0" to "9" as sent, or -1. */
static int
sns_position(const char *from, const char *to, int n)
{
	char		id[8];

	if (!xml_text(from, to, "Id", id, sizeof(id)) ||
		id[0] < '0' || id[0] > '9' || id[1] != '\0' || id[0] - '0' >= n)
		return -1;
	return id[0] - '0';
}

/* What SNS's answer means (RelayTransport.http_answer). */
static void
relay_sns_answer(RelayLane *lane, long status, const char *body, int len,
				 bool capped, RelayOutcome *outcome, char *msg, size_t size)
{
	int			n = lane->nbatch;
	const char *end = body + len;
	const char *ok;
	const char *ok_end;
	const char *bad;
	const char *bad_end;
	const char *p;
	const char *failed_at[SNS_MAX_BATCH];
	const char *failed_end[SNS_MAX_BATCH];
	bool		stored[SNS_MAX_BATCH];
	char		code[64];
	char		text[200];
	int			i;

	Assert(n >= 1 && n <= SNS_MAX_BATCH);
	n = Max(1, Min(n, SNS_MAX_BATCH));
	aws_lane_done(lane);
	outcome->error = msg;
	if (status != 200)
	{
		/* <ErrorResponse><Error><Type/><Code/><Message/></Error> */
		if (!capped && xml_text(body, end, "Code", code, sizeof(code)))
		{
			xml_text(body, end, "Message", text, sizeof(text));
			snprintf(msg, size, "SNS answered HTTP %ld: %s%s%s", status, code,
					 text[0] ? ": " : "", text);
			outcome->kind = aws_code_class(code, status, n);
			outcome->auth_refused = aws_code_refuses_credentials(code);
		}
		else
			aws_error_answer("SNS", status, body, len, capped, n, outcome, msg, size);
		return;
	}
	ok = capped ? NULL : strstr(body, "<PublishBatchResult>");
	if (ok == NULL)
	{
		snprintf(msg, size, "SNS answered 200 with a body that is not PublishBatch's answer%s",
				 capped ? " (body cut at 512 kB)" : "");
		outcome->kind = RELAY_RETRY;
		return;
	}
	ok = strstr(body, "<Successful>");
	ok_end = ok ? strstr(ok, "</Successful>") : NULL;
	bad = strstr(body, "<Failed>");
	bad_end = bad ? strstr(bad, "</Failed>") : NULL;
	memset(stored, 0, sizeof(stored));
	for (i = 0; i < n; i++)
		failed_at[i] = failed_end[i] = NULL;
	for (p = ok; ok_end != NULL && (p = strstr(p, "<member>")) != NULL && p < ok_end;)
	{
		const char *e = strstr(p, "</member>");

		if (e == NULL || e > ok_end)
			break;
		if ((i = sns_position(p, e, n)) >= 0)
			stored[i] = true;
		p = e;
	}
	for (p = bad; bad_end != NULL && (p = strstr(p, "<member>")) != NULL && p < bad_end;)
	{
		const char *e = strstr(p, "</member>");

		if (e == NULL || e > bad_end)
			break;
		if ((i = sns_position(p, e, n)) >= 0 && failed_at[i] == NULL)
		{
			failed_at[i] = p;
			failed_end[i] = e;
		}
		p = e;
	}
	for (i = 0; i < n; i++)
		sns_acked[i] = stored[i] && failed_at[i] == NULL;
	for (i = 0; i < n && sns_acked[i]; i++)
		;
	if (i == n)
	{
		outcome->kind = RELAY_DELIVERED;
		return;
	}
	outcome->ndelivered = i;
	outcome->acked = sns_acked;
	outcome->nsent = n;
	if (failed_at[i] == NULL)
	{
		snprintf(msg, size, "SNS's answer does not say entry %d of the request was published", i);
		outcome->kind = RELAY_RETRY;
		return;
	}
	if (!xml_text(failed_at[i], failed_end[i], "Code", code, sizeof(code)))
		strlcpy(code, "?", sizeof(code));
	xml_text(failed_at[i], failed_end[i], "Message", text, sizeof(text));
	{
		char		fault[8];

		if (xml_text(failed_at[i], failed_end[i], "SenderFault", fault, sizeof(fault)) &&
			strcmp(fault, "true") == 0 && !stored[i] && !aws_code_not_message(code))
		{
			snprintf(msg, size, "SNS refused the message: %s%s%s", code, text[0] ? ": " : "", text);
			outcome->kind = RELAY_REJECTED;
			return;
		}
	}
	snprintf(msg, size, "SNS failed to publish the message: %s%s%s", code, text[0] ? ": " : "", text);
	outcome->kind = aws_code_class(code, 200, 2);
}

const RelayTransport relay_sns_transport = {
	.kind = "sns",
	.id = RELAY_SNS,
	.per_message = true,
	.check = relay_sns_check,
	.target_init = aws_target_init,
	.target_release = aws_target_release,
	.lane_init = relay_http_lane_init,
	.lane_release = relay_http_lane_release,
	.send = relay_sns_send,
	.drive = relay_http_drive,
	.http_answer = relay_sns_answer,
	.max_batch = SNS_MAX_BATCH,
	.max_request_bytes = SNS_MAX_BYTES,
	.message_bytes = relay_sns_message_bytes,
};
