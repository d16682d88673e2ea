/*-------------------------------------------------------------------------
 *
 * relay_aws.h
 *	  What the AWS targets share (relay_aws.c): relay_sqs.c and
 *	  relay_kinesis.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_AWS_H
#define OUTBOX_RELAY_AWS_H

#include "aws.h"
#include "relay.h"

/* An AWS target's state (RelayTarget.priv): made again when its options change. */
typedef struct AwsTarget
{
	int			options_version;	/* of the target, when made */
	uint32		auth_generation;	/* of its credentials from STS, when made */
	char	   *authority;		/* the Host header's value */
	AwsSigner	signer;
	StringInfoData *bodies;		/* a request body per lane */
	int			nbodies;
	StringInfoData auth;		/* Authorization of the request being made */
	StringInfoData line;		/* a header line being made */
	void	   *kind;			/* the kind's own state, or NULL */
} AwsTarget;

#define AWS(t)	((AwsTarget *) (t)->priv)

extern const char *aws_row_checked(RelayTarget *t, const char *what, const char *why,
								   const char *authority, const char *kind);
/* An error of an option of an AWS kind's SQL check function. */
typedef struct AwsCheckError
{
	const char *what;			/* the option its check names */
	const char *noun;			/* "invalid <noun> '<value>'<suffix>" */
	const char *suffix;
	int			arg;			/* the argument holding the value */
	const char *subject;		/* "The <subject> is not usable: <why>." */
	const char *hint;
} AwsCheckError;

extern void aws_check_failed(const AwsCheckError *errors, int nerrors, const char *kind,
							 const char *what, const char *why, char **args);
extern void aws_target_init(RelayTarget *t);
extern void aws_prepare(RelayTarget *t, const char *service);
extern StringInfo aws_lane_body(RelayLane *lane);
extern bool aws_send(RelayLane *lane, StringInfo body, const char *content_type,
					 const char *target, RelayOutcome *failed);
extern bool aws_code_not_message(const char *code);
extern bool aws_code_refuses_credentials(const char *code);
extern void aws_lane_done(RelayLane *lane);
extern RelayOutcomeKind aws_code_class(const char *code, long status, int nmessages);
extern void aws_error_answer(const char *service, long status, const char *body, int len,
							 bool capped, int nmessages, RelayOutcome *outcome, char *msg,
							 size_t size);
extern void aws_host_region(const char *authority, const char *service, char *region);
extern void aws_target_release(RelayTarget *t);

#endif							/* OUTBOX_RELAY_AWS_H */
