/*
 * rabbitmq_bare.c - the bare client of rabbitmq_bench.sh, with rabbitmq-c:
 *
 *   rabbitmq_bare URL QUEUE N KEYS WINDOW PAYLOAD
 *	   publishes N messages to the default exchange with routing key QUEUE,
 *	   as the relay does (persistent, mandatory, message_id, content type,
 *	   timestamp, the headers webhook-id, outbox-seq, outbox-topic,
 *	   outbox-key), on a channel in confirm mode, with at most WINDOW
 *	   waiting for their confirms; prints "<seconds> <cpu seconds>" once
 *	   all are confirmed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

static double
now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void
check(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		fprintf(stderr, "rabbitmq_bare: %s failed (%d)\n", what, r.reply_type);
		exit(1);
	}
}

static void
str(amqp_table_entry_t *e, const char *k, const char *v)
{
	e->key = amqp_cstring_bytes(k);
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(v);
}

int
main(int argc, char **argv)
{
	struct amqp_connection_info info;
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	long		n, keys, window, sent = 0, confirmed = 0;
	double		t0;
	struct rusage ru;

	if (argc != 7)
	{
		fprintf(stderr, "usage: see the head of rabbitmq_bare.c\n");
		return 2;
	}
	n = atol(argv[3]);
	keys = atol(argv[4]);
	window = atol(argv[5]);
	amqp_default_connection_info(&info);
	if (amqp_parse_url(strdup(argv[1]), &info) != AMQP_STATUS_OK)
		return 2;
	if (info.vhost[0] == '\0')
		info.vhost = "/";
	conn = amqp_new_connection();
	if (info.ssl)
	{
		/* amqps://: the broker's chain verified with $OUTBOX_RMQ_CA, as the relay does */
		sock = amqp_ssl_socket_new(conn);
		amqp_ssl_socket_set_verify_hostname(sock, 0);	/* (an IP: rabbitmq-c checks names) */
		if (getenv("OUTBOX_RMQ_CA") == NULL ||
			amqp_ssl_socket_set_cacert(sock, getenv("OUTBOX_RMQ_CA")) != AMQP_STATUS_OK)
			return 2;
	}
	else
		sock = amqp_tcp_socket_new(conn);
	if (amqp_socket_open(sock, info.host, info.port) != AMQP_STATUS_OK)
		return 1;
	check(amqp_login(conn, info.vhost, 1, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password), "login");
	amqp_channel_open(conn, 1);
	check(amqp_get_rpc_reply(conn), "channel");
	amqp_confirm_select(conn, 1);
	check(amqp_get_rpc_reply(conn), "confirm.select");
	t0 = now();
	while (confirmed < n)
	{
		while (sent < n && sent - confirmed < window)
		{
			amqp_basic_properties_t p;
			amqp_table_entry_t h[4];
			char		id[40], seq[24], key[24];

			sent++;
			snprintf(id, sizeof(id), "%08lx-0000-4000-8000-000000000000", sent);
			snprintf(seq, sizeof(seq), "%ld", sent);
			snprintf(key, sizeof(key), "k%ld", sent % keys);
			str(&h[0], "webhook-id", id);
			str(&h[1], "outbox-seq", seq);
			str(&h[2], "outbox-topic", "orders");
			str(&h[3], "outbox-key", key);
			memset(&p, 0, sizeof(p));
			p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
				AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
			p.content_type = amqp_cstring_bytes("application/json");
			p.delivery_mode = 2;
			p.message_id = amqp_cstring_bytes(id);
			p.timestamp = (uint64_t) time(NULL);
			p.headers.num_entries = 4;
			p.headers.entries = h;
			if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(""), amqp_cstring_bytes(argv[2]),
								   1, 0, &p, amqp_cstring_bytes(argv[6])) != AMQP_STATUS_OK)
				return 1;
		}
		{
			amqp_frame_t f;

			if (amqp_simple_wait_frame(conn, &f) != AMQP_STATUS_OK)
				return 1;
			if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD)
			{
				amqp_basic_ack_t *a = f.payload.method.decoded;

				confirmed = a->multiple ? (long) a->delivery_tag : confirmed + 1;
			}
			else if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id != AMQP_BASIC_ACK_METHOD)
			{
				fprintf(stderr, "rabbitmq_bare: method 0x%08x\n", f.payload.method.id);
				return 1;
			}
			amqp_maybe_release_buffers(conn);
		}
	}
	getrusage(RUSAGE_SELF, &ru);
	printf("%.6f %.6f\n", now() - t0,
		   ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
	return 0;
}
