/*
 * curl_client.c - the fastest one-request-per-message sender libcurl allows
 * here, as a reference for the relay benchmark (test/bench/relay_bench.sh).
 *
 * No database: HANDLES reused easy handles on one multi handle, keep-alive,
 * curl_multi_poll, each POSTing the same body with the headers the relay
 * sends for a batch_size 1 message, and a new request as soon as one ends.
 * Prints one JSON line: {"handles": n, "seconds": s, "requests": n,
 * "rps": x, "failed": n, "cpu_s": s} (cpu_s: its own user + system time,
 * from getrusage).
 *
 *   curl_client URL HANDLES SECONDS BODY_FILE
 *
 * Built by relay_bench.sh: cc -O2 -o curl_client curl_client.c -lcurl
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
	long		requests = 0;
	long		failed = 0;
	double		t0;
	double		elapsed;
	int			i;

	if (argc != 5)
	{
		fprintf(stderr, "usage: %s URL HANDLES SECONDS BODY_FILE\n", argv[0]);
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
		curl_multi_add_handle(multi, e);
		handles[i] = e;
	}

	t0 = now();
	while ((elapsed = now() - t0) < seconds)
	{
		int			running;
		int			left;
		CURLMsg    *msg;

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
		curl_multi_poll(multi, NULL, 0, 100, NULL);
	}

	{
		struct rusage ru;

		getrusage(RUSAGE_SELF, &ru);
		printf("{\"handles\": %d, \"seconds\": %.3f, \"requests\": %ld, \"rps\": %.1f, \"failed\": %ld, \"cpu_s\": %.3f}\n",
			   nhandles, elapsed, requests, requests / elapsed, failed,
			   ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
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
