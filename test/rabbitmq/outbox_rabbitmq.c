/*
 * outbox_rabbitmq.c - the RabbitMQ tool of the TAP tests (test/t/068_*):
 *
 *   outbox_rabbitmq declare URL QUEUE          a durable classic queue
 *   outbox_rabbitmq quorum URL QUEUE           a quorum queue
 *   outbox_rabbitmq exchange URL NAME TYPE     a durable exchange
 *   outbox_rabbitmq bind URL QUEUE EXCHANGE KEY
 *   outbox_rabbitmq delete URL QUEUE
 *   outbox_rabbitmq count URL QUEUE            messages ready in it
 *   outbox_rabbitmq dump URL QUEUE             every message, one JSON
 *       object a line (message_id, seq, topic, key, routing_key, exchange,
 *       delivery_mode, content_type, payload, a few headers, headers
 *       (every string header, by name), and
 *       header_names: the name of every header), in queue order;
 *       consumed and not acknowledged, so they stay
 *
 * An amqps:// URL connects with TLS: the CA in $OUTBOX_RMQ_CA, a client
 * certificate and key in $OUTBOX_RMQ_CERT and $OUTBOX_RMQ_KEY (when set).
 *
 * Exits 1 with the error on stderr when the broker refuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

static amqp_connection_state_t conn;

static void
check(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
	{
		amqp_channel_close_t *c = r.reply.decoded;

		fprintf(stderr, "%s: %d %.*s\n", what, c->reply_code, (int) c->reply_text.len,
				(char *) c->reply_text.bytes);
	}
	else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
	{
		amqp_connection_close_t *c = r.reply.decoded;

		fprintf(stderr, "%s: %d %.*s\n", what, c->reply_code, (int) c->reply_text.len,
				(char *) c->reply_text.bytes);
	}
	else
		fprintf(stderr, "%s: %s\n", what, amqp_error_string2(r.library_error));
	exit(1);
}

static void
json_str(const char *s, size_t len)
{
	size_t		i;

	putchar('"');
	for (i = 0; i < len; i++)
	{
		unsigned char c = s[i];

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void
header(amqp_table_t *t, const char *name, const char *as)
{
	int			i;

	for (i = 0; i < t->num_entries; i++)
		if (t->entries[i].key.len == strlen(name) &&
			memcmp(t->entries[i].key.bytes, name, t->entries[i].key.len) == 0 &&
			(t->entries[i].value.kind == AMQP_FIELD_KIND_UTF8 || t->entries[i].value.kind == AMQP_FIELD_KIND_BYTES))
		{
			printf(", \"%s\": ", as);
			json_str(t->entries[i].value.value.bytes.bytes, t->entries[i].value.value.bytes.len);
		}
}

/* Every string header, as "headers": {name: value}. */
static void
header_values(amqp_table_t *t)
{
	int			i;
	int			n = 0;

	printf(", \"headers\": {");
	for (i = 0; i < t->num_entries; i++)
	{
		if (t->entries[i].value.kind != AMQP_FIELD_KIND_UTF8 && t->entries[i].value.kind != AMQP_FIELD_KIND_BYTES)
			continue;
		if (n++ > 0)
			printf(", ");
		json_str(t->entries[i].key.bytes, t->entries[i].key.len);
		printf(": ");
		json_str(t->entries[i].value.value.bytes.bytes, t->entries[i].value.value.bytes.len);
	}
	printf("}");
}

/* Every header's name, as "header_names": [...]. */
static void
header_names(amqp_table_t *t)
{
	int			i;

	printf(", \"header_names\": [");
	for (i = 0; i < t->num_entries; i++)
	{
		if (i > 0)
			printf(", ");
		json_str(t->entries[i].key.bytes, t->entries[i].key.len);
	}
	printf("]");
}

int
main(int argc, char **argv)
{
	struct amqp_connection_info info;
	amqp_socket_t *sock;
	char	   *url;

	if (argc < 4)
	{
		fprintf(stderr, "usage: see the head of outbox_rabbitmq.c\n");
		return 2;
	}
	url = strdup(argv[2]);
	amqp_default_connection_info(&info);
	if (amqp_parse_url(url, &info) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "bad url\n");
		return 2;
	}
	conn = amqp_new_connection();
	if (info.ssl)
	{
		sock = amqp_ssl_socket_new(conn);
		/* (the test's own look at the broker: rabbitmq-c checks no IP address) */
		amqp_ssl_socket_set_verify_hostname(sock, 0);
		if (getenv("OUTBOX_RMQ_CA") &&
			amqp_ssl_socket_set_cacert(sock, getenv("OUTBOX_RMQ_CA")) != AMQP_STATUS_OK)
		{
			fprintf(stderr, "cannot load the CA\n");
			return 1;
		}
		if (getenv("OUTBOX_RMQ_CERT") &&
			amqp_ssl_socket_set_key(sock, getenv("OUTBOX_RMQ_CERT"), getenv("OUTBOX_RMQ_KEY")) != AMQP_STATUS_OK)
		{
			fprintf(stderr, "cannot load the client certificate\n");
			return 1;
		}
	}
	else
		sock = amqp_tcp_socket_new(conn);
	if (amqp_socket_open(sock, info.host, info.port) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "cannot connect\n");
		return 1;
	}
	check(amqp_login(conn, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password), "login");
	amqp_channel_open(conn, 1);
	check(amqp_get_rpc_reply(conn), "channel");

	if (strcmp(argv[1], "declare") == 0 || strcmp(argv[1], "quorum") == 0)
	{
		amqp_table_entry_t e;
		amqp_table_t args = amqp_empty_table;

		if (argv[1][0] == 'q')
		{
			e.key = amqp_cstring_bytes("x-queue-type");
			e.value.kind = AMQP_FIELD_KIND_UTF8;
			e.value.value.bytes = amqp_cstring_bytes("quorum");
			args.num_entries = 1;
			args.entries = &e;
		}
		amqp_queue_declare(conn, 1, amqp_cstring_bytes(argv[3]), 0, 1, 0, 0, args);
		check(amqp_get_rpc_reply(conn), "queue.declare");
	}
	else if (strcmp(argv[1], "exchange") == 0 && argc == 5)
	{
		amqp_exchange_declare(conn, 1, amqp_cstring_bytes(argv[3]), amqp_cstring_bytes(argv[4]),
							  0, 1, 0, 0, amqp_empty_table);
		check(amqp_get_rpc_reply(conn), "exchange.declare");
	}
	else if (strcmp(argv[1], "bind") == 0 && argc == 6)
	{
		amqp_queue_bind(conn, 1, amqp_cstring_bytes(argv[3]), amqp_cstring_bytes(argv[4]),
						amqp_cstring_bytes(argv[5]), amqp_empty_table);
		check(amqp_get_rpc_reply(conn), "queue.bind");
	}
	else if (strcmp(argv[1], "delete") == 0)
	{
		amqp_queue_delete(conn, 1, amqp_cstring_bytes(argv[3]), 0, 0);
		check(amqp_get_rpc_reply(conn), "queue.delete");
	}
	else if (strcmp(argv[1], "count") == 0)
	{
		amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(argv[3]), 1, 0, 0, 0,
														 amqp_empty_table);

		check(amqp_get_rpc_reply(conn), "queue.declare passive");
		printf("%u\n", ok->message_count);
	}
	else if (strcmp(argv[1], "dump") == 0)
	{
		amqp_queue_declare_ok_t *ok = amqp_queue_declare(conn, 1, amqp_cstring_bytes(argv[3]), 1, 0, 0, 0,
														 amqp_empty_table);
		uint32_t	n,
					i;

		check(amqp_get_rpc_reply(conn), "queue.declare passive");
		n = ok->message_count;
		/* streamed to us, not acknowledged: given back when we close */
		if (n > 65535)
		{
			fprintf(stderr, "dump: more than 65535 messages\n");
			return 1;
		}
		amqp_basic_qos(conn, 1, 0, n > 0 ? n : 1, 0);
		check(amqp_get_rpc_reply(conn), "basic.qos");
		amqp_basic_consume(conn, 1, amqp_cstring_bytes(argv[3]), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
		check(amqp_get_rpc_reply(conn), "basic.consume");
		for (i = 0; i < n; i++)
		{
			amqp_envelope_t env;
			struct timeval tv = {10, 0};

			amqp_maybe_release_buffers(conn);
			check(amqp_consume_message(conn, &env, &tv, 0), "consume");
			printf("{\"routing_key\": ");
			json_str(env.routing_key.bytes, env.routing_key.len);
			printf(", \"exchange\": ");
			json_str(env.exchange.bytes, env.exchange.len);
			printf(", \"message_id\": ");
			json_str(env.message.properties.message_id.bytes, env.message.properties.message_id.len);
			printf(", \"delivery_mode\": %d, \"content_type\": ", env.message.properties.delivery_mode);
			json_str(env.message.properties.content_type.bytes, env.message.properties.content_type.len);
			header(&env.message.properties.headers, "outbox-seq", "seq");
			header(&env.message.properties.headers, "outbox-topic", "topic");
			header(&env.message.properties.headers, "outbox-key", "key");
			header(&env.message.properties.headers, "webhook-id", "webhook_id");
			header(&env.message.properties.headers, "x-trace", "x_trace");
			header_names(&env.message.properties.headers);
			header_values(&env.message.properties.headers);
			printf(", \"payload\": ");
			json_str(env.message.body.bytes, env.message.body.len);
			printf("}\n");
			amqp_destroy_envelope(&env);
		}
	}
	else
	{
		fprintf(stderr, "usage: see the head of outbox_rabbitmq.c\n");
		return 2;
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}
