/*-------------------------------------------------------------------------
 *
 * aws_sigv4.c
 *	  AWS Signature Version 4, written after AWS's description of it
 *	  ("Create a signed AWS API request"): a canonical request, a string to
 *	  sign, a signing key derived from the secret for the day, region and
 *	  service, and an HMAC-SHA256 of the string with that key.
 *
 * The relay signs every request to SQS (and AWS's other services) with it;
 * the tests check each signature with AWS's own signer (test/aws/).  Not
 * libcurl's CURLOPT_AWS_SIGV4: libcurl 7.88, Debian 12's, signs some
 * requests wrongly (fixed in 8.x), and this keeps the signing key from day
 * to day instead of deriving it for each request.
 *
 * Hashes and HMACs are OpenSSL's one-shot functions, which neither
 * allocate in PostgreSQL's memory nor raise errors.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include "aws.h"

static void
aws_hmac(const unsigned char *key, size_t key_len, const char *data, size_t len,
		 unsigned char *out)
{
	unsigned int out_len = 32;

	HMAC(EVP_sha256(), key, (int) key_len, (const unsigned char *) data, len,
		 out, &out_len);
}

static void
aws_hex(const unsigned char *bytes, int n, StringInfo buf)
{
	static const char digits[] = "0123456789abcdef";
	int			i;

	enlargeStringInfo(buf, 2 * n);
	for (i = 0; i < n; i++)
	{
		buf->data[buf->len++] = digits[bytes[i] >> 4];
		buf->data[buf->len++] = digits[bytes[i] & 15];
	}
	buf->data[buf->len] = '\0';
}

bool
aws_region_valid(const char *s)
{
	size_t		n = s ? strlen(s) : 0;
	size_t		i;

	if (n == 0 || n > AWS_MAX_REGION)
		return false;
	for (i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
			return false;
	return true;
}

void
aws_sigv4_sign(AwsSigner *signer, const char *method, const char *path,
			   const char *host, const char *const *names,
			   const char *const *values, int nheaders,
			   const char *body, size_t body_len, time_t now,
			   char *amz_date, StringInfo auth)
{
	const char *hn[AWS_MAX_SIGNED_HEADERS + 3];
	const char *hv[AWS_MAX_SIGNED_HEADERS + 3];
	int			n = 0;
	int			i;
	int			j;
	struct tm	tm;
	char		day[9];
	unsigned char digest[32];
	StringInfoData canon;
	StringInfoData signed_names;
	StringInfoData to_sign;

	Assert(nheaders <= AWS_MAX_SIGNED_HEADERS);
	gmtime_r(&now, &tm);
	strftime(amz_date, 17, "%Y%m%dT%H%M%SZ", &tm);
	memcpy(day, amz_date, 8);
	day[8] = '\0';

	/* The headers signed, sorted by name. */
	hn[n] = "host";
	hv[n++] = host;
	hn[n] = "x-amz-date";
	hv[n++] = amz_date;
	if (signer->session_token != NULL)
	{
		hn[n] = "x-amz-security-token";
		hv[n++] = signer->session_token;
	}
	for (i = 0; i < nheaders; i++)
	{
		hn[n] = names[i];
		hv[n++] = values[i];
	}
	for (i = 1; i < n; i++)
	{
		const char *name = hn[i];
		const char *value = hv[i];

		for (j = i - 1; j >= 0 && strcmp(hn[j], name) > 0; j--)
		{
			hn[j + 1] = hn[j];
			hv[j + 1] = hv[j];
		}
		hn[j + 1] = name;
		hv[j + 1] = value;
	}

	/* The canonical request. */
	initStringInfo(&canon);
	initStringInfo(&signed_names);
	appendStringInfo(&canon, "%s\n%s\n\n", method, path);
	for (i = 0; i < n; i++)
	{
		appendStringInfo(&canon, "%s:%s\n", hn[i], hv[i]);
		if (i > 0)
			appendStringInfoChar(&signed_names, ';');
		appendStringInfoString(&signed_names, hn[i]);
	}
	appendStringInfo(&canon, "\n%s\n", signed_names.data);
	SHA256((const unsigned char *) body, body_len, digest);
	aws_hex(digest, 32, &canon);

	/* The string to sign. */
	initStringInfo(&to_sign);
	appendStringInfo(&to_sign, "AWS4-HMAC-SHA256\n%s\n%s/%s/%s/aws4_request\n",
					 amz_date, day, signer->region, signer->service);
	SHA256((const unsigned char *) canon.data, canon.len, digest);
	aws_hex(digest, 32, &to_sign);

	/* The signing key, derived once a day. */
	if (strcmp(signer->key_day, day) != 0)
	{
		StringInfoData secret;
		unsigned char k1[32];
		unsigned char k2[32];

		initStringInfo(&secret);
		appendStringInfo(&secret, "AWS4%s", signer->secret_access_key);
		aws_hmac((unsigned char *) secret.data, secret.len, day, 8, k1);
		explicit_bzero(secret.data, secret.len);
		pfree(secret.data);
		aws_hmac(k1, 32, signer->region, strlen(signer->region), k2);
		aws_hmac(k2, 32, signer->service, strlen(signer->service), k1);
		aws_hmac(k1, 32, "aws4_request", 12, signer->key);
		explicit_bzero(k1, sizeof(k1));
		explicit_bzero(k2, sizeof(k2));
		memcpy(signer->key_day, day, sizeof(day));
	}
	aws_hmac(signer->key, 32, to_sign.data, to_sign.len, digest);

	resetStringInfo(auth);
	appendStringInfo(auth,
					 "AWS4-HMAC-SHA256 Credential=%s/%s/%s/%s/aws4_request, SignedHeaders=%s, Signature=",
					 signer->access_key_id, day, signer->region, signer->service,
					 signed_names.data);
	aws_hex(digest, 32, auth);
	pfree(canon.data);
	pfree(signed_names.data);
	pfree(to_sign.data);
}

/* Whether s is min to max characters of printable ASCII without blanks. */
bool
aws_token_valid(const char *s, size_t min, size_t max)
{
	size_t		n = s ? strlen(s) : 0;
	size_t		i;

	if (n < min || n > max)
		return false;
	for (i = 0; i < n; i++)
		if ((unsigned char) s[i] <= 0x20 || (unsigned char) s[i] >= 0x7f)
			return false;
	return true;
}

/*
 * Why an AWS target's credentials cannot be used, or NULL.  None at all
 * is fine here: the target gets them from STS (web identity).
 */
const char *
aws_check_credentials(const char *key_id, const char *secret, const char *token)
{
	if (key_id == NULL && secret == NULL && token == NULL)
		return NULL;			/* none: the target has web identity */
	if (!aws_token_valid(key_id, 16, 128))
		return "the access key id is not 16 to 128 printable ASCII characters without blanks";
	if (!aws_token_valid(secret, 1, 128))
		return "the secret access key is not 1 to 128 printable ASCII characters without blanks";
	if (token != NULL && !aws_token_valid(token, 1, 8192))
		return "the session token is not 1 to 8192 printable ASCII characters without blanks";
	return NULL;
}
