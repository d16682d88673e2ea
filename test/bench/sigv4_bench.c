/*
 * sigv4_bench.c - the cost of the relay's AWS signer (src/aws_sigv4.c)
 * per request, on its own: aws_sigv4_sign() of an SQS SendMessageBatch
 * body of 10 messages and of a Kinesis PutRecords body of 100 records,
 * built here against PostgreSQL's frontend libraries (libpgcommon's
 * StringInfo), as aws_bench.sh does.
 *
 *   sigv4_bench [ITERATIONS]     prints one JSON line per body
 */
#include "postgres.h"

#include <time.h>

#include "aws.h"

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
run(const char *what, const char *service, const char *target, int body_len, int iterations)
{
	AwsSigner	s = {0};
	StringInfoData auth;
	char		amz_date[17];
	char	   *body = malloc(body_len + 1);
	const char *names[2] = {"content-type", "x-amz-target"};
	const char *values[2] = {"application/x-amz-json-1.0", target};
	double		t0;
	int			i;

	memset(body, 'x', body_len);
	body[body_len] = '\0';
	s.access_key_id = "AKIAIOSFODNN7EXAMPLE";
	s.secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
	s.region = "eu-west-1";
	s.service = service;
	initStringInfo(&auth);
	t0 = now_s();
	for (i = 0; i < iterations; i++)
		aws_sigv4_sign(&s, "POST", "/", "sqs.eu-west-1.amazonaws.com", names, values, 2,
					   body, body_len, time(NULL), amz_date, &auth);
	printf("{\"body\": \"%s\", \"bytes\": %d, \"us_per_request\": %.2f}\n", what, body_len,
		   (now_s() - t0) * 1e6 / iterations);
	free(body);
}

int
main(int argc, char **argv)
{
	int			n = argc > 1 ? atoi(argv[1]) : 100000;

	run("sqs, 10 messages", "sqs", "AmazonSQS.SendMessageBatch", 3000, n);
	run("kinesis, 100 records", "kinesis", "Kinesis_20131202.PutRecords", 25000, n / 10);
	return 0;
}
