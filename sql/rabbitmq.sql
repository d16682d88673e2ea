-- RabbitMQ targets: the options, their defaults and their errors
-- (delivery against a real rabbitmq-server is in test/t/068_rabbitmq.pl).
SET client_min_messages = warning;

SELECT outbox.create_rabbitmq_target('mq', 'amqp://guest:guest@127.0.0.1:5672');
SELECT kind, url, exchange, routing_key, batch_size, lanes, ordering, timeout_ms, format
  FROM outbox.targets WHERE name = 'mq';
SELECT outbox.create_rabbitmq_target('mq_opts', 'amqp://relay:p%40ss@broker.internal/shop', exchange => 'orders',
									 routing_key => 'orders.{topic}.{key}', lanes => 3, ordering => 'strict');
SELECT exchange, routing_key, lanes, ordering FROM outbox.targets WHERE name = 'mq_opts';

-- TLS: amqps://, with the TLS files of HTTP targets (only an amqps:// URL
-- takes them)
SELECT outbox.create_rabbitmq_target('mq_tls', 'amqps://relay:pw@127.0.0.1:5671',
									 ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT url, ca_file, client_cert, client_key FROM outbox.targets WHERE name = 'mq_tls';
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT outbox.alter_target('mq_tls', client_cert => '/etc/hostname');
SELECT outbox.alter_target('mq_tls', url => 'amqp://127.0.0.1');

-- URLs: the password is never in an error
SELECT outbox.create_rabbitmq_target('x', 'amqps://relay:S3cretPW@127.0.0.1:5671/a%zz');
SELECT outbox.create_rabbitmq_target('x', 'http://127.0.0.1:5672');
SELECT outbox.create_rabbitmq_target('x', 'amqp://relay:S3cretPW@127.0.0.1:5672/?heartbeat=10');
SELECT outbox.create_rabbitmq_target('x', 'amqp://relay:S3cretPW@127.0.0.1:99999');
SELECT outbox.create_rabbitmq_target('x', 'amqp://a:b@h1:5672,h2:5672');
SELECT outbox.create_rabbitmq_target('x', NULL);

-- exchange and routing key
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', exchange => 'a b');
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', exchange => repeat('e', 256));
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', routing_key => 'orders.{id}');
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', routing_key => E'a\tb');
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', routing_key => NULL);
SELECT outbox.create_rabbitmq_target('x', 'amqp://127.0.0.1', lanes => 0);

-- alter_target
SELECT outbox.alter_target('mq', exchange => 'amq.topic', routing_key => 'o.{key}');
SELECT exchange, routing_key FROM outbox.targets WHERE name = 'mq';
SELECT outbox.alter_target('mq', exchange => '');
SELECT outbox.alter_target('mq', url => 'amqps://127.0.0.1:0');
SELECT outbox.alter_target('mq', format => 'cloudevents');
SELECT outbox.alter_target('mq', stream => 's');
SELECT outbox.create_redis_target('mq_redis', 'redis://127.0.0.1');
SELECT outbox.alter_target('mq_redis', routing_key => 'x');

-- the table's own checks, for rows written by hand
\set VERBOSITY terse
INSERT INTO outbox.targets (name, kind, url, exchange) VALUES ('x', 'rabbitmq', 'amqp://127.0.0.1', '');
INSERT INTO outbox.targets (name, kind, url, routing_key) VALUES ('x', 'http', 'http://127.0.0.1', 'k');
\set VERBOSITY default

SELECT outbox.drop_target(name) FROM outbox.targets WHERE name LIKE 'mq%' ORDER BY name;
