/*
 * curl_client.c - the fastest one-request-per-message sender libcurl allows
 * here, as a reference for the relay benchmark (test/bench/relay_bench.sh).
 *
 * No database: HANDLES reused easy handles on one multi handle, keep-alive,
 * each POSTing the same body with the headers the relay
 * sends for a batch_size 1 message, and a new request as soon as one ends.
 * Prints one JSON line: {"handles": n, "seconds": s, "requests": n,
 * "rps": x, "failed": n, "cpu_s": s, "api": a} (cpu_s: its own user +
 * system time, from getrusage).
 *
 *   curl_client URL HANDLES SECONDS BODY_FILE [perform|socket]
 *
 * perform (the default): curl_multi_perform and curl_multi_poll.  socket:
 * the event interface the relay drives libcurl with, curl_multi_socket_action
 * on the sockets an epoll set reports ready, a connection kept registered
 * between its requests as the relay keeps it (src/relay_http.c), so that
 * the two loops' costs can be set side by side.  It stands for libcurl's
 * side only: the relay also waits on its latch before it looks at the
 * connections.
 *
 * Built by relay_bench.sh: cc -O2 -Wall -o curl_client curl_client.c -lcurl
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>
#include <time.h>

static size_t
discard(char *data, size_t size, size_t nmemb, void *userdata)
{
	(void) data;
	(void) userdata;
	return size * nmemb;
}

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * socket mode: the epoll set; per descriptor, the events registered (0:
 * none) and whether libcurl wants it watched; libcurl's timer.
 */
#define MAX_FD 4096
static int	epoll_fd = -1;
static unsigned registered[MAX_FD];
static char wanted[MAX_FD];
static double deadline = -1;

static int
socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
	struct epoll_event ev;

	(void) easy;
	(void) userp;
	(void) socketp;
	if (s < 0 || s >= MAX_FD)
	{
		fprintf(stderr, "socket %d is past the %d this client watches\n", (int) s, MAX_FD);
		return -1;
	}
	/*
	 * A connection back in the pool stays registered (close_cb forgets it);
	 * an event on it while libcurl does not want it removes it (main loop).
	 */
	if (what == CURL_POLL_REMOVE)
	{
		wanted[s] = 0;
		return 0;
	}
	wanted[s] = 1;
	memset(&ev, 0, sizeof(ev));
	ev.data.fd = s;
	ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0);
	if (registered[s] == ev.events)
		return 0;
	if (epoll_ctl(epoll_fd, EPOLL_CTL_MOD, s, &ev) != 0 &&
		epoll_ctl(epoll_fd, EPOLL_CTL_ADD, s, &ev) != 0)
		return -1;
	registered[s] = ev.events;
	return 0;
}

/* libcurl closes a socket: closing took it out of the epoll set */
static int
close_cb(void *clientp, curl_socket_t s)
{
	(void) clientp;
	if (s >= 0 && s < MAX_FD)
	{
		registered[s] = 0;
		wanted[s] = 0;
	}
	return close(s);
}

static int
timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
	(void) multi;
	(void) userp;
	deadline = timeout_ms < 0 ? -1 : now() + timeout_ms / 1000.0;
	return 0;
}

int
main(int argc, char **argv)
{
	const char *url;
	int			nhandles;
	double		seconds;
	FILE	   *f;
	char	   *body;
	long		body_len;
	CURLM	   *multi;
	CURL	  **handles;
	struct curl_slist *headers = NULL;
	int			socket_mode = 0;
	long		requests = 0;
	long		failed = 0;
	double		t0;
	double		elapsed;
	int			i;

	if (argc != 5 && argc != 6)
	{
		fprintf(stderr, "usage: %s URL HANDLES SECONDS BODY_FILE [perform|socket]\n", argv[0]);
		return 2;
	}
	if (argc == 6 && strcmp(argv[5], "socket") == 0)
		socket_mode = 1;
	else if (argc == 6 && strcmp(argv[5], "perform") != 0)
	{
		fprintf(stderr, "the loop must be perform or socket\n");
		return 2;
	}
	url = argv[1];
	nhandles = atoi(argv[2]);
	seconds = atof(argv[3]);
	if (nhandles < 1 || seconds <= 0)
	{
		fprintf(stderr, "HANDLES and SECONDS must be positive\n");
		return 2;
	}

	f = fopen(argv[4], "rb");
	if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (body_len = ftell(f)) < 0)
	{
		perror(argv[4]);
		return 1;
	}
	rewind(f);
	body = malloc(body_len + 1);
	if (body == NULL || fread(body, 1, body_len, f) != (size_t) body_len)
	{
		perror(argv[4]);
		return 1;
	}
	body[body_len] = '\0';
	fclose(f);

	curl_global_init(CURL_GLOBAL_DEFAULT);
	multi = curl_multi_init();
	handles = calloc(nhandles, sizeof(CURL *));
	if (multi == NULL || handles == NULL)
		return 1;
	if (socket_mode)
	{
		epoll_fd = epoll_create1(EPOLL_CLOEXEC);
		if (epoll_fd < 0)
		{
			perror("epoll_create1");
			return 1;
		}
		curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
		curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, timer_cb);
	}
	headers = curl_slist_append(headers, "Content-Type: application/json");
	headers = curl_slist_append(headers, "Expect:");
	headers = curl_slist_append(headers, "webhook-id: 0190f0a2-6b1e-7c3d-9a4f-123456789abc");
	headers = curl_slist_append(headers, "webhook-timestamp: 1700000000");
	headers = curl_slist_append(headers, "outbox-seq: 123456");
	headers = curl_slist_append(headers, "outbox-topic: orders.created");
	headers = curl_slist_append(headers, "outbox-key: key-123");
	for (i = 0; i < nhandles; i++)
	{
		CURL	   *e = curl_easy_init();

		if (e == NULL)
			return 1;
		curl_easy_setopt(e, CURLOPT_URL, url);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_PROXY, "");
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) body_len);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
		if (socket_mode)
			curl_easy_setopt(e, CURLOPT_CLOSESOCKETFUNCTION, close_cb);
		curl_multi_add_handle(multi, e);
		handles[i] = e;
	}

	t0 = now();
	if (socket_mode)
	{
		int			running;

		curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
	}
	while ((elapsed = now() - t0) < seconds)
	{
		int			running;
		int			left;
		CURLMsg    *msg;

		if (socket_mode)
		{
			struct epoll_event events[64];
			int			wait_ms = 100;
			int			n;

			if (deadline >= 0)
			{
				double		due = (deadline - now()) * 1000 + 0.999;

				wait_ms = due < 0 ? 0 : due > 100 ? 100 : (int) due;
			}
			n = epoll_wait(epoll_fd, events, 64, wait_ms);
			for (i = 0; i < n; i++)
			{
				int			fd = events[i].data.fd;

				/* a pooled connection that libcurl does not watch: drop it */
				if (fd >= 0 && fd < MAX_FD && !wanted[fd])
				{
					epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, NULL);
					registered[fd] = 0;
					continue;
				}
				curl_multi_socket_action(multi, events[i].data.fd,
										 ((events[i].events & EPOLLIN) ? CURL_CSELECT_IN : 0) |
										 ((events[i].events & EPOLLOUT) ? CURL_CSELECT_OUT : 0) |
										 ((events[i].events & (EPOLLERR | EPOLLHUP)) ? CURL_CSELECT_ERR : 0),
										 &running);
			}
			if (deadline >= 0 && now() >= deadline)
			{
				deadline = -1;
				curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
			}
		}
		else
			curl_multi_perform(multi, &running);
		while ((msg = curl_multi_info_read(multi, &left)) != NULL)
		{
			CURL	   *e;
			long		status = 0;

			if (msg->msg != CURLMSG_DONE)
				continue;
			e = msg->easy_handle;
			curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
			if (msg->data.result != CURLE_OK || status < 200 || status >= 300)
				failed++;
			else
				requests++;
			curl_multi_remove_handle(multi, e);
			curl_multi_add_handle(multi, e);
		}
		if (!socket_mode)
			curl_multi_poll(multi, NULL, 0, 100, NULL);
	}

	{
		struct rusage ru;

		getrusage(RUSAGE_SELF, &ru);
		printf("{\"handles\": %d, \"seconds\": %.3f, \"requests\": %ld, \"rps\": %.1f, \"failed\": %ld, \"cpu_s\": %.3f, \"api\": \"%s\"}\n",
			   nhandles, elapsed, requests, requests / elapsed, failed,
			   ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
			   socket_mode ? "socket" : "perform");
	}

	for (i = 0; i < nhandles; i++)
	{
		curl_multi_remove_handle(multi, handles[i]);
		curl_easy_cleanup(handles[i]);
	}
	curl_multi_cleanup(multi);
	curl_slist_free_all(headers);
	free(handles);
	free(body);
	curl_global_cleanup();
	return failed > 0 ? 1 : 0;
}
