/*-------------------------------------------------------------------------
 *
 * aws.h
 *	  AWS Signature Version 4 (aws_sigv4.c), for the relay's requests to
 *	  AWS's own services.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_AWS_H
#define OUTBOX_AWS_H

#include <time.h>

#include "lib/stringinfo.h"

/* Longest region name taken ("ap-southeast-5" and the like are 14). */
#define AWS_MAX_REGION	32

/*
 * Credentials and the scope they sign for.  The signing key is derived
 * from the secret, the day, the region and the service, so it is kept for
 * the day it was made for.
 */
typedef struct AwsSigner
{
	const char *access_key_id;
	const char *secret_access_key;
	const char *session_token;	/* or NULL */
	const char *region;
	const char *service;		/* "sqs", "sns", "kinesis" ... */
	char		key_day[9];		/* YYYYMMDD of key, or "" */
	unsigned char key[32];		/* kSigning of key_day */
} AwsSigner;

/* At most this many headers besides host, x-amz-date and the token. */
#define AWS_MAX_SIGNED_HEADERS	8

extern bool aws_token_valid(const char *s, size_t min, size_t max);
extern const char *aws_check_credentials(const char *key_id, const char *secret,
										 const char *token);

/*
 * Sign a request made at now: method, path (already in canonical form, "/"
 * for AWS's JSON APIs), an empty query, host (the Host header's value),
 * the caller's other headers to sign (lower-case names, values without
 * edge blanks), and the body.  Writes the x-amz-date value into amz_date
 * (17 bytes) and the Authorization header's value into auth (reset first).
 */
extern void aws_sigv4_sign(AwsSigner *signer, const char *method, const char *path,
						   const char *host, const char *const *names,
						   const char *const *values, int nheaders,
						   const char *body, size_t body_len, time_t now,
						   char *amz_date, StringInfo auth);

/* Whether s is a region name: 1 to AWS_MAX_REGION of [a-z0-9-]. */
extern bool aws_region_valid(const char *s);

#endif							/* OUTBOX_AWS_H */
