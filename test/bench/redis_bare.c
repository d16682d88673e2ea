/*
 * redis_bare.c - the bare client of redis_bench.sh, with hiredis:
 *
 *   redis_bare send HOST PORT STREAM N KEYS WINDOW PAYLOAD
 *	   SCRIPT LOAD the relay's script (script.h, cut from
 *	   src/relay_redis.c by redis_bench.sh), then N EVALSHA of it, the
 *	   commands the relay sends (fields id, seq, topic, key, payload; a
 *	   de-duplication mark each), pipelined with at most WINDOW waiting
 *	   for their replies; prints "<seconds> <cpu seconds>".
 *   redis_bare wait HOST PORT STREAM N POLL_MS TIMEOUT_S
 *	   XLEN every POLL_MS until it is at least N; prints the realtime
 *	   in ns when it is; exit 1 on timeout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <hiredis/hiredis.h>

#include "script.h"

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static redisReply *
must(redisContext *c, redisReply *r)
{
	if (r == NULL || r->type == REDIS_REPLY_ERROR)
	{
		fprintf(stderr, "redis_bare: %s\n", r ? r->str : c->errstr);
		exit(1);
	}
	return r;
}

int
main(int argc, char **argv)
{
	redisContext *c;

	if (argc < 6)
	{
		fprintf(stderr, "usage: see the head of redis_bare.c\n");
		return 2;
	}
	c = redisConnect(argv[2], atoi(argv[3]));
	if (c == NULL || c->err)
	{
		fprintf(stderr, "redis_bare: connect: %s\n", c ? c->errstr : "?");
		return 1;
	}
	if (strcmp(argv[1], "wait") == 0 && argc == 8)
	{
		long long	want = atoll(argv[5]);
		double		deadline = now() + atoi(argv[7]);
		struct timespec nap = {0, atol(argv[6]) * 1000000L};

		for (;;)
		{
			redisReply *r = must(c, redisCommand(c, "XLEN %s", argv[4]));
			long long	n = r->integer;

			freeReplyObject(r);
			if (n >= want)
			{
				struct timespec t;

				clock_gettime(CLOCK_REALTIME, &t);
				printf("%lld\n", (long long) t.tv_sec * 1000000000LL + t.tv_nsec);
				return 0;
			}
			if (now() > deadline)
				return 1;
			nanosleep(&nap, NULL);
		}
	}
	if (strcmp(argv[1], "send") == 0 && argc == 9)
	{
		const char *stream = argv[4];
		long		n = atol(argv[5]);
		long		keys = atol(argv[6]);
		long		window = atol(argv[7]);
		const char *payload = argv[8];
		redisReply *r = must(c, redisCommand(c, "SCRIPT LOAD %s", redis_script));
		char		sha[41];
		long		sent = 0;
		long		done = 0;
		double		t0;
		struct rusage ru;

		snprintf(sha, sizeof(sha), "%s", r->str);
		freeReplyObject(r);
		t0 = now();
		while (done < n)
		{
			while (sent < n && sent - done < window)
			{
				char		id[40], mark[256], seq[24], key[24];
				const char *av[17];
				size_t		al[17];
				int			i;

				sent++;
				snprintf(id, sizeof(id), "%08lx-0000-4000-8000-000000000000", sent);
				snprintf(mark, sizeof(mark), "%s:outbox-dedup:%s", stream, id);
				snprintf(seq, sizeof(seq), "%ld", sent);
				snprintf(key, sizeof(key), "k%ld", sent % keys);
				av[0] = "EVALSHA"; av[1] = sha; av[2] = "2"; av[3] = stream; av[4] = mark;
				av[5] = "600"; av[6] = "0"; av[7] = "id"; av[8] = id; av[9] = "seq"; av[10] = seq;
				av[11] = "topic"; av[12] = "orders"; av[13] = "key"; av[14] = key;
				av[15] = "payload"; av[16] = payload;
				for (i = 0; i < 17; i++)
					al[i] = strlen(av[i]);
				redisAppendCommandArgv(c, 17, av, al);
			}
			if (redisGetReply(c, (void **) &r) != REDIS_OK)
				must(c, NULL);
			must(c, r);
			freeReplyObject(r);
			done++;
		}
		getrusage(RUSAGE_SELF, &ru);
		printf("%.6f %.6f\n", now() - t0,
			   ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
		return 0;
	}
	fprintf(stderr, "usage: see the head of redis_bare.c\n");
	return 2;
}
