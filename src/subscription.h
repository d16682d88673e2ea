/*-------------------------------------------------------------------------
 *
 * subscription.h
 *	  Subscriptions (outbox.subscriptions): which messages a target or a
 *	  queue takes.  Matched by the relay (relay_read.c) and by queues
 *	  (queue_fill.c) alike; filters are filter.c's.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_SUBSCRIPTION_H
#define OUTBOX_SUBSCRIPTION_H

#include "utils/jsonb.h"

/*
 * The subscriptions query's filter column: (to_jsonb(s) ->> 'filter') reads
 * NULL from a 0.2 schema, which has no such column.
 */
#define OUTBOX_SUBSCRIPTION_FILTER_SQL \
	"(pg_catalog.to_jsonb(s) OPERATOR(pg_catalog.->>) 'filter')::pg_catalog.jsonpath"

/*
 * A subscription of a target (outbox.subscriptions): messages above
 * start_id whose topic is pattern, or starts with its first prefix_len
 * bytes when it ends in '*'.  Matched by the relay and by queues alike.
 */
struct JsonPath;

typedef struct OutboxSubscription
{
	char	   *pattern;		/* topic, prefix* or * */
	int			prefix_len;		/* bytes before '*', -1 for an exact topic */
	int64		start_id;		/* only ids above this */
	struct JsonPath *filter;	/* jsonpath over the message's document, or
								 * NULL (filter.c) */
	bool		filter_predicate;	/* evaluated as @@ rather than @? */
} OutboxSubscription;

/* prefix_len of a pattern. */
static inline int
outbox_pattern_prefix_len(const char *pattern)
{
	size_t		len = strlen(pattern);

	return (len > 0 && pattern[len - 1] == '*') ? (int) len - 1 : -1;
}

/* Whether subscription s takes topic (its filter aside). */
static inline bool
outbox_subscription_matches(const OutboxSubscription *s, const char *topic, int64 id)
{
	if (id <= s->start_id)
		return false;
	if (s->prefix_len < 0)
		return strcmp(topic, s->pattern) == 0;
	return strncmp(topic, s->pattern, s->prefix_len) == 0;
}

/*
 * Whether a subscription takes topic: 0 none, 1 one without a filter, 2
 * only ones with a filter (outbox_subscriptions_select decides).
 */
static inline int
outbox_subscriptions_route(const OutboxSubscription *subs, int nsubs,
						   const char *topic, int64 id)
{
	int			i;
	int			route = 0;

	for (i = 0; i < nsubs; i++)
		if (outbox_subscription_matches(&subs[i], topic, id))
		{
			if (subs[i].filter == NULL)
				return 1;
			route = 2;
		}
	return route;
}

/*---- filter.c ----*/
extern bool outbox_filter_is_predicate(struct JsonPath *path);
extern Jsonb *outbox_filter_doc(const char *topic, const char *key, Jsonb *headers,
								Jsonb *payload);
extern bool outbox_filter_match(const OutboxSubscription *s, Jsonb *doc);
extern void outbox_subscription_set_filter(OutboxSubscription *s, Datum d, bool isnull,
										   MemoryContext cxt);
extern bool outbox_subscriptions_select(const OutboxSubscription *subs, int nsubs,
										const char *topic, int64 id,
										Jsonb *(*make_doc) (void *arg), void *arg,
										bool *filtered);

#endif							/* OUTBOX_SUBSCRIPTION_H */
