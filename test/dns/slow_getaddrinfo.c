/*
 * A slow DNS server for the tests, without a DNS server: preloaded
 * (LD_PRELOAD) into the server, this getaddrinfo() takes 3 s to answer
 * EAI_NONAME for any name ending in ".slow.invalid", and passes every other
 * name on to the real getaddrinfo() at once.  Used by test/t/052_relay_slow_dns.pl;
 * built there with
 *
 *     cc -shared -fPIC -o slow_getaddrinfo.so slow_getaddrinfo.c -ldl
 *
 * The sleep is not cut short by signals: the lookup takes its 3 s
 * whatever the calling thread is sent meanwhile.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <time.h>

#define SLOW_SUFFIX ".slow.invalid"
#define SLOW_SECONDS 3

typedef int (*getaddrinfo_fn) (const char *node, const char *service,
							   const struct addrinfo *hints,
							   struct addrinfo **res);

static int
is_slow(const char *node)
{
	size_t		n,
				s = strlen(SLOW_SUFFIX);

	if (node == NULL)
		return 0;
	n = strlen(node);
	/* a trailing dot (an absolute name) counts the same */
	if (n > 0 && node[n - 1] == '.')
		n--;
	return n >= s && strncmp(node + n - s, SLOW_SUFFIX, s) == 0;
}

int
getaddrinfo(const char *node, const char *service,
			const struct addrinfo *hints, struct addrinfo **res)
{
	static getaddrinfo_fn real = NULL;

	if (is_slow(node))
	{
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += SLOW_SECONDS;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
			;
		return EAI_NONAME;
	}
	if (real == NULL)
	{
		real = (getaddrinfo_fn) dlsym(RTLD_NEXT, "getaddrinfo");
		if (real == NULL)
			return EAI_SYSTEM;
	}
	return real(node, service, hints, res);
}
