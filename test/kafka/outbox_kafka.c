/*
 * outbox_kafka: the tests' and benchmarks' Kafka tool (librdkafka).
 *
 *   outbox_kafka mock TOPIC PARTITIONS [TOPIC PARTITIONS ...]
 *       runs a librdkafka mock cluster of 3 brokers (ids 1..3, listening on
 *       127.0.0.1), creates the topics (replication factor 3), prints the
 *       bootstrap list as one line, then reads commands from stdin, one a
 *       line, and answers each with "ok" or "error: ..." on stdout:
 *         produce-errors N ERRCODE [ERRCODE ...]
 *             the next N Produce requests fail, with the codes in turn
 *         request-errors APIKEY N ERRCODE [ERRCODE ...]
 *             the same for any protocol request type
 *         clear-errors APIKEY
 *         leader TOPIC PARTITION BROKERID
 *         down BROKERID | up BROKERID        (-1: all brokers)
 *         rtt BROKERID MS
 *         topic-error TOPIC ERRCODE          (0 clears it)
 *         create TOPIC PARTITIONS
 *         apiversion APIKEY MIN MAX          e.g. "apiversion 3 0 4": Metadata
 *             v4 carries the client's allow.auto.create.topics; up to v2
 *             (the mock's default) any unknown topic named is auto-created
 *         bootstraps                          prints the list again
 *         quit                                (or end of stdin)
 *   outbox_kafka consume BOOTSTRAP TOPIC [TIMEOUT_S]
 *       every message of every partition from the beginning to the end, as
 *       JSON lines sorted by partition and offset:
 *       {"partition":P,"offset":O,"key":"..."|null,"payload":"..."|null,
 *        "headers":{"name":"value",...}}
 *       (default timeout 60 s)
 *   outbox_kafka tail BOOTSTRAP TOPIC COUNT [TIMEOUT_S]
 *       the benchmarks' consumer: reads the topic from the beginning as
 *       records arrive (fetch.wait.max.ms 1) until COUNT records, printing
 *       one line a record as it is received:
 *       "<receipt, realtime us> <partition> <offset> <ce_time header or ->
 *       <source-xid header or ->"
 *   outbox_kafka partition KEY PARTITIONS
 *       the partition librdkafka's murmur2 partitioner (Java's) picks
 *   outbox_kafka produce BOOTSTRAP TOPIC COUNT KEYS [PROP=VALUE ...]
 *       the benchmark's baseline: an idempotent producer (acks=all,
 *       murmur2_random, linger.ms=5) sends COUNT messages over keys
 *       k0..k<KEYS-1>, each with headers webhook-id and outbox-seq, waits
 *       for every delivery report and prints the rate (messages/s);
 *       exit status 1 if any delivery failed
 *
 * Exit status 0 on success; errors on stderr.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

/* Protocol ApiKey of ProduceRequest (rdkafka_proto.h is not installed) */
#ifndef RD_KAFKAP_Produce
#define RD_KAFKAP_Produce 0
#endif

static void
die(const char *fmt, const char *arg)
{
	fprintf(stderr, "outbox_kafka: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	exit(1);
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int
parse_long(const char *s, long *out)
{
	char	   *end;

	errno = 0;
	*out = strtol(s, &end, 10);
	return errno == 0 && end != s && *end == '\0';
}

static long
arg_long(const char *s, const char *what, long min)
{
	long		v;

	if (!parse_long(s, &v) || v < min)
		die("bad %s", what);
	return v;
}

static void
conf_set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, name, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		die("configuration: %s", errstr);
}

/* PROP=VALUE arguments */
static void
conf_set_args(rd_kafka_conf_t *conf, int argc, char **argv)
{
	int			i;

	for (i = 0; i < argc; i++)
	{
		char	   *eq = strchr(argv[i], '=');

		if (eq == NULL || eq == argv[i])
			die("expected PROP=VALUE, got \"%s\"", argv[i]);
		*eq = '\0';
		conf_set(conf, argv[i], eq + 1);
		*eq = '=';
	}
}

/* ---------------------------------------------------------------- mock */

/* The hosting instance has no bootstrap.servers on purpose; hush that. */
static void
mock_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	if (strcmp(fac, "CONFWARN") == 0)
		return;
	fprintf(stderr, "%%%d|%s|%s| %s\n", level, fac, rk ? rd_kafka_name(rk) : "", buf);
}

static int
split_words(char *line, char **words, int max)
{
	int			n = 0;
	char	   *save = NULL;
	char	   *w;

	for (w = strtok_r(line, " \t\r\n", &save); w != NULL; w = strtok_r(NULL, " \t\r\n", &save))
	{
		if (n == max)
			return -1;
		words[n++] = w;
	}
	return n;
}

#define MAX_WORDS 1024

/*
 * Pushes N errors on the ApiKey's cluster-wide error stack, repeating the
 * codes[0..ncodes-1] in turn.  Returns an error message or NULL.
 */
static const char *
push_errors(rd_kafka_mock_cluster_t *mc, int16_t apikey, const char *count,
			char **codes, int ncodes)
{
	long		n;
	long		i;
	rd_kafka_resp_err_t *errs;

	if (!parse_long(count, &n) || n < 1 || n > 10000000)
		return "bad count";
	if (ncodes < 1)
		return "no error codes";
	errs = malloc(sizeof(*errs) * n);
	if (errs == NULL)
		return "out of memory";
	for (i = 0; i < ncodes; i++)
	{
		long		code;

		if (!parse_long(codes[i], &code) || code < INT16_MIN || code > INT16_MAX)
		{
			free(errs);
			return "bad error code";
		}
	}
	for (i = 0; i < n; i++)
	{
		long		code;

		parse_long(codes[i % ncodes], &code);
		errs[i] = (rd_kafka_resp_err_t) code;
	}
	rd_kafka_mock_push_request_errors_array(mc, apikey, (size_t) n, errs);
	free(errs);
	return NULL;
}

static int
mock_reply(rd_kafka_resp_err_t err)
{
	if (err)
		printf("error: %s\n", rd_kafka_err2str(err));
	else
		printf("ok\n");
	return 0;
}

static int
cmd_mock(int argc, char **argv)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	char		errstr[512];
	char	   *line = NULL;
	size_t		linecap = 0;
	int			i;

	if (argc < 2 || argc % 2 != 0)
		die("usage: mock TOPIC PARTITIONS [TOPIC PARTITIONS ...]%s", "");

	conf = rd_kafka_conf_new();
	rd_kafka_conf_set_log_cb(conf, mock_log_cb);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		die("rd_kafka_new: %s", errstr);
	mc = rd_kafka_mock_cluster_new(rk, 3);
	if (mc == NULL)
		die("rd_kafka_mock_cluster_new failed%s", "");

	for (i = 0; i < argc; i += 2)
	{
		long		parts = arg_long(argv[i + 1], "partition count", 1);
		rd_kafka_resp_err_t err;

		err = rd_kafka_mock_topic_create(mc, argv[i], (int) parts, 3);
		if (err)
		{
			fprintf(stderr, "outbox_kafka: topic %s: %s\n", argv[i], rd_kafka_err2str(err));
			exit(1);
		}
	}

	printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);

	while (getline(&line, &linecap, stdin) >= 0)
	{
		char	   *w[MAX_WORDS];
		int			n = split_words(line, w, MAX_WORDS);
		long		a,
					b;

		if (n == 0)
			continue;
		if (n < 0)
			printf("error: too many words\n");
		else if (strcmp(w[0], "quit") == 0)
			break;
		else if (strcmp(w[0], "produce-errors") == 0 && n >= 3)
		{
			const char *msg = push_errors(mc, RD_KAFKAP_Produce, w[1], w + 2, n - 2);

			if (msg)
				printf("error: %s\n", msg);
			else
				printf("ok\n");
		}
		else if (strcmp(w[0], "request-errors") == 0 && n >= 4)
		{
			const char *msg;

			if (!parse_long(w[1], &a) || a < 0 || a > INT16_MAX)
				msg = "bad ApiKey";
			else
				msg = push_errors(mc, (int16_t) a, w[2], w + 3, n - 3);
			if (msg)
				printf("error: %s\n", msg);
			else
				printf("ok\n");
		}
		else if (strcmp(w[0], "clear-errors") == 0 && n == 2)
		{
			if (!parse_long(w[1], &a) || a < 0 || a > INT16_MAX)
				printf("error: bad ApiKey\n");
			else
			{
				rd_kafka_mock_clear_request_errors(mc, (int16_t) a);
				printf("ok\n");
			}
		}
		else if (strcmp(w[0], "leader") == 0 && n == 4)
		{
			if (!parse_long(w[2], &a) || a < 0 || !parse_long(w[3], &b))
				printf("error: bad number\n");
			else
				mock_reply(rd_kafka_mock_partition_set_leader(mc, w[1], (int32_t) a,
															  (int32_t) b));
		}
		else if ((strcmp(w[0], "down") == 0 || strcmp(w[0], "up") == 0) && n == 2)
		{
			if (!parse_long(w[1], &a))
				printf("error: bad broker id\n");
			else if (w[0][0] == 'd')
				mock_reply(rd_kafka_mock_broker_set_down(mc, (int32_t) a));
			else
				mock_reply(rd_kafka_mock_broker_set_up(mc, (int32_t) a));
		}
		else if (strcmp(w[0], "rtt") == 0 && n == 3)
		{
			if (!parse_long(w[1], &a) || !parse_long(w[2], &b) || b < 0)
				printf("error: bad number\n");
			else
				mock_reply(rd_kafka_mock_broker_set_rtt(mc, (int32_t) a, (int) b));
		}
		else if (strcmp(w[0], "topic-error") == 0 && n == 3)
		{
			if (!parse_long(w[2], &a))
				printf("error: bad error code\n");
			else
			{
				rd_kafka_mock_topic_set_error(mc, w[1], (rd_kafka_resp_err_t) a);
				printf("ok\n");
			}
		}
		else if (strcmp(w[0], "create") == 0 && n == 3)
		{
			if (!parse_long(w[2], &a) || a < 1)
				printf("error: bad partition count\n");
			else
				mock_reply(rd_kafka_mock_topic_create(mc, w[1], (int) a, 3));
		}
		else if (strcmp(w[0], "apiversion") == 0 && n == 4)
		{
			long		c;

			if (!parse_long(w[1], &a) || a < 0 || a > INT16_MAX ||
				!parse_long(w[2], &b) || b < -1 || b > INT16_MAX ||
				!parse_long(w[3], &c) || c < -1 || c > INT16_MAX)
				printf("error: bad number\n");
			else
				mock_reply(rd_kafka_mock_set_apiversion(mc, (int16_t) a, (int16_t) b,
														(int16_t) c));
		}
		else if (strcmp(w[0], "bootstraps") == 0 && n == 1)
			printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
		else
			printf("error: unknown command or wrong arguments: %s\n", w[0]);
		fflush(stdout);
	}
	free(line);

	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}

/* ------------------------------------------------------------- consume */

typedef struct
{
	char	   *s;
	size_t		len;
	size_t		cap;
} buf_t;

static void
buf_grow(buf_t *b, size_t more)
{
	if (b->len + more + 1 > b->cap)
	{
		size_t		cap = b->cap ? b->cap : 256;

		while (b->len + more + 1 > cap)
			cap *= 2;
		b->s = realloc(b->s, cap);
		if (b->s == NULL)
			die("out of memory%s", "");
		b->cap = cap;
	}
}

static void
buf_put(buf_t *b, const char *s, size_t len)
{
	buf_grow(b, len);
	memcpy(b->s + b->len, s, len);
	b->len += len;
	b->s[b->len] = '\0';
}

static void
buf_puts(buf_t *b, const char *s)
{
	buf_put(b, s, strlen(s));
}

static void
buf_json(buf_t *b, const void *data, size_t len)
{
	const unsigned char *p = data;
	size_t		i;

	if (data == NULL)
	{
		buf_puts(b, "null");
		return;
	}
	buf_put(b, "\"", 1);
	for (i = 0; i < len; i++)
	{
		char		esc[8];

		if (p[i] == '"' || p[i] == '\\')
		{
			esc[0] = '\\';
			esc[1] = (char) p[i];
			buf_put(b, esc, 2);
		}
		else if (p[i] < 0x20)
		{
			snprintf(esc, sizeof(esc), "\\u%04x", p[i]);
			buf_put(b, esc, 6);
		}
		else
			buf_put(b, (const char *) p + i, 1);
	}
	buf_put(b, "\"", 1);
}

typedef struct
{
	int32_t		partition;
	int64_t		offset;
	char	   *json;
} line_t;

static int
line_cmp(const void *a, const void *b)
{
	const line_t *x = a,
			   *y = b;

	if (x->partition != y->partition)
		return x->partition < y->partition ? -1 : 1;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return 0;
}

static char *
message_json(rd_kafka_message_t *m)
{
	buf_t		b = {0};
	char		num[64];
	rd_kafka_headers_t *hdrs = NULL;

	snprintf(num, sizeof(num), "{\"partition\":%" PRId32 ",\"offset\":%" PRId64 ",\"key\":",
			 m->partition, m->offset);
	buf_puts(&b, num);
	buf_json(&b, m->key, m->key_len);
	buf_puts(&b, ",\"payload\":");
	buf_json(&b, m->payload, m->len);
	buf_puts(&b, ",\"headers\":{");
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		size_t		i;
		const char *name;
		const void *value;
		size_t		size;

		for (i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
		{
			if (i > 0)
				buf_put(&b, ",", 1);
			buf_json(&b, name, strlen(name));
			buf_put(&b, ":", 1);
			buf_json(&b, value, size);
		}
	}
	buf_puts(&b, "}}");
	return b.s;
}

static int
cmd_consume_or_tail(int argc, char **argv, long tail);

static int
cmd_consume(int argc, char **argv)
{
	return cmd_consume_or_tail(argc, argv, 0);
}

static int
cmd_tail(int argc, char **argv)
{
	if (argc < 3 || argc > 4)
		die("usage: tail BOOTSTRAP TOPIC COUNT [TIMEOUT_S]%s", "");
	return cmd_consume_or_tail(argc - 1, (char *[]) {argv[0], argv[1], argc == 4 ? argv[3] : NULL},
							   arg_long(argv[2], "count", 1));
}

/* A record's header value as a string, or "-". */
static const char *
header_or_dash(const rd_kafka_message_t *m, const char *name, char *buf, size_t size)
{
	rd_kafka_headers_t *hdrs;
	const void *v;
	size_t		len;

	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		rd_kafka_header_get_last(hdrs, name, &v, &len) != RD_KAFKA_RESP_ERR_NO_ERROR ||
		v == NULL || len == 0 || len >= size)
		return "-";
	memcpy(buf, v, len);
	buf[len] = '\0';
	return buf;
}

static int
cmd_consume_or_tail(int argc, char **argv, long tail)
{
	const char *bootstrap;
	const char *topic;
	double		timeout = 60;
	double		deadline;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char		errstr[512];
	char		group[128];
	const rd_kafka_metadata_t *md = NULL;
	rd_kafka_topic_t *rkt;
	rd_kafka_topic_partition_list_t *assign;
	rd_kafka_resp_err_t err;
	int			nparts = 0;
	int32_t	   *part_ids;
	char	   *at_end;
	int			ended = 0;
	line_t	   *lines = NULL;
	size_t		nlines = 0,
				caplines = 0;
	size_t		i;
	int			j;

	long		got = 0;

	if (argc < 2 || argc > 3)
		die("usage: consume BOOTSTRAP TOPIC [TIMEOUT_S]%s", "");
	bootstrap = argv[0];
	topic = argv[1];
	if (argc == 3 && argv[2] != NULL)
		timeout = (double) arg_long(argv[2], "timeout", 1);
	deadline = now_s() + timeout;

	conf = rd_kafka_conf_new();
	snprintf(group, sizeof(group), "outbox_kafka-consume-%ld-%ld", (long) getpid(),
			 (long) time(NULL));
	conf_set(conf, "bootstrap.servers", bootstrap);
	conf_set(conf, "group.id", group);
	conf_set(conf, "enable.auto.commit", "false");
	conf_set(conf, "enable.auto.offset.store", "false");
	conf_set(conf, "enable.partition.eof", "true");
	conf_set(conf, "auto.offset.reset", "earliest");
	if (tail)
	{
		setvbuf(stdout, NULL, _IOLBF, 0);	/* a line as each record comes */
		conf_set(conf, "fetch.wait.max.ms", "1");
		conf_set(conf, "fetch.error.backoff.ms", "1");
	}
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		die("rd_kafka_new: %s", errstr);
	rd_kafka_poll_set_consumer(rk);

	/* the topic's partitions; retried while the cluster settles */
	rkt = rd_kafka_topic_new(rk, topic, NULL);
	for (;;)
	{
		double		left = deadline - now_s();

		if (left <= 0)
			die("timed out reading the metadata of topic %s", topic);
		err = rd_kafka_metadata(rk, 0, rkt, &md, left > 5 ? 5000 : (int) (left * 1000) + 1);
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR && md->topic_cnt == 1 &&
			md->topics[0].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
			md->topics[0].partition_cnt > 0)
			break;
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			/* the request worked: only a leader election is worth waiting for */
			rd_kafka_resp_err_t terr = md->topic_cnt == 1 ? md->topics[0].err :
				RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;

			rd_kafka_metadata_destroy(md);
			md = NULL;
			if (terr != RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE &&
				terr != RD_KAFKA_RESP_ERR_NO_ERROR)
			{
				fprintf(stderr, "outbox_kafka: topic %s: %s\n", topic, rd_kafka_err2str(terr));
				exit(1);
			}
		}
		usleep(200 * 1000);
	}
	nparts = md->topics[0].partition_cnt;
	part_ids = calloc(nparts, sizeof(*part_ids));
	at_end = calloc(nparts, 1);
	if (part_ids == NULL || at_end == NULL)
		die("out of memory%s", "");
	assign = rd_kafka_topic_partition_list_new(nparts);
	for (j = 0; j < nparts; j++)
	{
		part_ids[j] = md->topics[0].partitions[j].id;
		rd_kafka_topic_partition_list_add(assign, topic, part_ids[j])->offset =
			RD_KAFKA_OFFSET_BEGINNING;
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_topic_destroy(rkt);

	err = rd_kafka_assign(rk, assign);
	rd_kafka_topic_partition_list_destroy(assign);
	if (err)
		die("assign: %s", rd_kafka_err2str(err));

	while (tail ? got < tail : ended < nparts)
	{
		rd_kafka_message_t *m;
		double		left = deadline - now_s();

		if (left <= 0 && tail)
		{
			fprintf(stderr, "outbox_kafka: timed out after %.0f s with %ld of %ld records\n",
					timeout, got, tail);
			exit(1);
		}
		if (left <= 0)
		{
			fprintf(stderr, "outbox_kafka: timed out after %.0f s; %d of %d partitions read to the end\n",
					timeout, ended, nparts);
			exit(1);
		}
		m = rd_kafka_consumer_poll(rk, left > 1 ? 1000 : (int) (left * 1000) + 1);
		if (m == NULL)
			continue;
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
		{
			for (j = 0; j < nparts; j++)
				if (part_ids[j] == m->partition && !at_end[j])
				{
					at_end[j] = 1;
					ended++;
				}
		}
		else if (m->err)
		{
			if (m->err == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION ||
				m->err == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
				m->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
				m->err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
				m->err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE)
				die("consume: %s", rd_kafka_message_errstr(m));
			fprintf(stderr, "outbox_kafka: consume (continuing): %s\n",
					rd_kafka_message_errstr(m));
		}
		else if (tail)
		{
			struct timespec ts;
			char		buf[64];

			clock_gettime(CLOCK_REALTIME, &ts);
			printf("%lld %d %lld %s",
				   (long long) ts.tv_sec * 1000000 + ts.tv_nsec / 1000, (int) m->partition,
				   (long long) m->offset, header_or_dash(m, "ce_time", buf, sizeof(buf)));
			printf(" %s\n", header_or_dash(m, "source-xid", buf, sizeof(buf)));
			got++;
		}
		else
		{
			if (nlines == caplines)
			{
				caplines = caplines ? caplines * 2 : 1024;
				lines = realloc(lines, caplines * sizeof(*lines));
				if (lines == NULL)
					die("out of memory%s", "");
			}
			lines[nlines].partition = m->partition;
			lines[nlines].offset = m->offset;
			lines[nlines].json = message_json(m);
			nlines++;
		}
		rd_kafka_message_destroy(m);
	}

	qsort(lines, nlines, sizeof(*lines), line_cmp);
	for (i = 0; i < nlines; i++)
	{
		fputs(lines[i].json, stdout);
		fputc('\n', stdout);
		free(lines[i].json);
	}
	free(lines);
	free(part_ids);
	free(at_end);
	if (fflush(stdout) != 0)
		die("writing stdout: %s", strerror(errno));

	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	return 0;
}

/* ----------------------------------------------------------- partition */

static int
cmd_partition(int argc, char **argv)
{
	long		parts;

	if (argc != 2)
		die("usage: partition KEY PARTITIONS%s", "");
	parts = arg_long(argv[1], "partition count", 1);
	if (parts > INT32_MAX)
		die("bad partition count%s", "");
	printf("%" PRId32 "\n",
		   rd_kafka_msg_partitioner_murmur2(NULL, argv[0], strlen(argv[0]),
											(int32_t) parts, NULL, NULL));
	return 0;
}

/* ------------------------------------------------------------- produce */

static long dr_ok = 0;
static long dr_failed = 0;

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	if (m->err)
	{
		if (dr_failed < 10)
			fprintf(stderr, "outbox_kafka: delivery failed: %s\n", rd_kafka_err2str(m->err));
		dr_failed++;
	}
	else
		dr_ok++;
}

static void
error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	static int	shown = 0;

	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char		buf[512];
		rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf, sizeof(buf));

		fprintf(stderr, "outbox_kafka: fatal error: %s: %s\n", rd_kafka_err2name(orig), buf);
		return;
	}
	if (shown++ < 20)
		fprintf(stderr, "outbox_kafka: (librdkafka) %s: %s\n",
				rd_kafka_err2name((rd_kafka_resp_err_t) err), reason);
}

static int
cmd_produce(int argc, char **argv)
{
	const char *bootstrap;
	const char *topic;
	long		count;
	long		keys;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char		errstr[512];
	char		idprefix[64];
	double		t0,
				elapsed;
	long		i;

	if (argc < 4)
		die("usage: produce BOOTSTRAP TOPIC COUNT KEYS [PROP=VALUE ...]%s", "");
	bootstrap = argv[0];
	topic = argv[1];
	count = arg_long(argv[2], "count", 0);
	keys = arg_long(argv[3], "key count", 1);

	conf = rd_kafka_conf_new();
	conf_set(conf, "bootstrap.servers", bootstrap);
	conf_set(conf, "enable.idempotence", "true");
	conf_set(conf, "acks", "all");
	conf_set(conf, "partitioner", "murmur2_random");
	conf_set(conf, "linger.ms", "5");
	conf_set_args(conf, argc - 4, argv + 4);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
	rd_kafka_conf_set_error_cb(conf, error_cb);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		die("rd_kafka_new: %s", errstr);

	snprintf(idprefix, sizeof(idprefix), "msg_%lx%lx", (long) time(NULL), (long) getpid());
	t0 = now_s();
	for (i = 0; i < count; i++)
	{
		char		key[32];
		char		payload[96];
		char		id[96];
		char		seq[32];
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t err;

		snprintf(key, sizeof(key), "k%ld", i % keys);
		snprintf(payload, sizeof(payload), "{\"seq\":%ld,\"key\":\"%s\",\"data\":\"xxxxxxxx\"}",
				 i, key);
		snprintf(id, sizeof(id), "%s_%ld", idprefix, i);
		snprintf(seq, sizeof(seq), "%ld", i);
		for (;;)
		{
			hdrs = rd_kafka_headers_new(2);
			rd_kafka_header_add(hdrs, "webhook-id", -1, id, -1);
			rd_kafka_header_add(hdrs, "outbox-seq", -1, seq, -1);
			err = rd_kafka_producev(rk,
									RD_KAFKA_V_TOPIC(topic),
									RD_KAFKA_V_KEY(key, strlen(key)),
									RD_KAFKA_V_VALUE(payload, strlen(payload)),
									RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
									RD_KAFKA_V_HEADERS(hdrs),
									RD_KAFKA_V_END);
			if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
				break;
			/* producev() failed: the headers are still ours */
			rd_kafka_headers_destroy(hdrs);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			{
				fprintf(stderr, "outbox_kafka: produce: %s\n", rd_kafka_err2str(err));
				rd_kafka_destroy(rk);
				return 1;
			}
			rd_kafka_poll(rk, 10);
		}
		rd_kafka_poll(rk, 0);
	}
	while (rd_kafka_outq_len(rk) > 0)
		rd_kafka_flush(rk, 1000);
	elapsed = now_s() - t0;

	if (rd_kafka_fatal_error(rk, errstr, sizeof(errstr)))
		fprintf(stderr, "outbox_kafka: producer failed fatally: %s\n", errstr);
	printf("%.0f\n", elapsed > 0 ? count / elapsed : 0.0);
	fflush(stdout);
	if (dr_failed > 0 || dr_ok != count)
		fprintf(stderr, "outbox_kafka: %ld of %ld deliveries failed\n", count - dr_ok, count);
	rd_kafka_destroy(rk);
	return (dr_failed > 0 || dr_ok != count) ? 1 : 0;
}

int
main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);

	if (argc < 2)
		die("usage: outbox_kafka mock|consume|tail|partition|produce ...%s", "");
	if (strcmp(argv[1], "mock") == 0)
		return cmd_mock(argc - 2, argv + 2);
	if (strcmp(argv[1], "consume") == 0)
		return cmd_consume(argc - 2, argv + 2);
	if (strcmp(argv[1], "tail") == 0)
		return cmd_tail(argc - 2, argv + 2);
	if (strcmp(argv[1], "partition") == 0)
		return cmd_partition(argc - 2, argv + 2);
	if (strcmp(argv[1], "produce") == 0)
		return cmd_produce(argc - 2, argv + 2);
	die("unknown subcommand %s", argv[1]);
	return 1;
}
