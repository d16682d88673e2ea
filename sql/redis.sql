-- Redis Streams targets: the options, their defaults and their errors
-- (delivery against a real redis-server is in test/t/067_redis.pl).
SET client_min_messages = warning;

SELECT outbox.create_redis_target('rd', 'redis://127.0.0.1:6379');
SELECT kind, url, stream, maxlen, dedup_window, batch_size, lanes, ordering, timeout_ms, format
  FROM outbox.targets WHERE name = 'rd';
SELECT outbox.create_redis_target('rd_opts', 'redis://:pw@localhost/2', stream => 'orders:{topic}:{key}',
								  maxlen => 10000, dedup_window => 0, lanes => 3, ordering => 'strict');
SELECT stream, maxlen, dedup_window, lanes, ordering FROM outbox.targets WHERE name = 'rd_opts';
SELECT outbox.create_redis_target('rd_acl', 'redis://relay:p%40ss@[::1]:6380/0');

-- TLS: rediss://, with the TLS files of HTTP targets (only a rediss:// URL
-- takes them; the files must exist and be readable by the server)
SELECT outbox.create_redis_target('rd_tls', 'rediss://relay:pw@127.0.0.1:6380',
								  ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT url, ca_file, client_cert, client_key FROM outbox.targets WHERE name = 'rd_tls';
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1:6379', ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT outbox.create_redis_target('x', 'rediss://127.0.0.1:6379', ca_file => 'relative/ca.pem');
SELECT outbox.create_redis_target('x', 'rediss://127.0.0.1:6379', ca_file => '/nonexistent/ca.pem');
SELECT outbox.create_redis_target('x', 'rediss://127.0.0.1:6379', client_key => '/etc/hostname');
SELECT outbox.alter_target('rd_tls', client_cert => '/etc/hostname', client_key => '/etc/hostname');
SELECT outbox.alter_target('rd_tls', ca_file => '');
SELECT ca_file, client_cert, client_key FROM outbox.targets WHERE name = 'rd_tls';
SELECT outbox.alter_target('rd_tls', url => 'redis://127.0.0.1:6379');
SELECT outbox.alter_target('rd_tls', client_cert => '', client_key => '');
SELECT outbox.alter_target('rd_tls', url => 'redis://127.0.0.1:6379');
SELECT outbox.alter_target('rd', ca_file => '/etc/ssl/certs/ca-certificates.crt');

-- URLs
SELECT outbox.create_redis_target('x', 'redis://user:secret@127.0.0.1:6379?timeout=1');
SELECT outbox.create_redis_target('x', 'http://127.0.0.1:6379');
SELECT outbox.create_redis_target('x', 'redis://user@127.0.0.1');
SELECT outbox.create_redis_target('x', 'redis://:@127.0.0.1');
SELECT outbox.create_redis_target('x', 'redis://:a%zz@127.0.0.1');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1:0');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1/x');
SELECT outbox.create_redis_target('x', 'unix:///run/redis.sock');
SELECT outbox.create_redis_target('x', NULL);
-- the password is never in an error, whatever the URL
SELECT outbox.create_redis_target('x', 'rediss://default:S3cretPW@redis.example.com:6380/db');
SELECT outbox.create_redis_target('x', 'REDIS://:S3cretPW@127.0.0.1:6379');
SELECT outbox.create_redis_target('x', 'redis://u:S3cret@PW@127.0.0.1');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1:6379/0?password=S3cretPW');

-- streams and limits
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', stream => 'orders:{id}');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', stream => '');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', stream => E'a\nb');
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', maxlen => 0);
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', dedup_window => -1);
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', dedup_window => 2592001);
SELECT outbox.create_redis_target('x', 'redis://127.0.0.1', batch_size => 0);

-- alter_target
SELECT outbox.alter_target('rd', stream => 'o:{topic}', maxlen => 500, dedup_window => 60);
SELECT stream, maxlen, dedup_window FROM outbox.targets WHERE name = 'rd';
SELECT outbox.alter_target('rd', maxlen => 0);
SELECT maxlen FROM outbox.targets WHERE name = 'rd';
SELECT outbox.alter_target('rd', url => 'rediss://127.0.0.1/x');
SELECT outbox.alter_target('rd', format => 'cloudevents');
SELECT outbox.alter_target('rd', subject => 'x');
SELECT outbox.create_nats_target('rd_nats', 'nats://127.0.0.1:4222');
SELECT outbox.alter_target('rd_nats', stream => 'x');
SELECT outbox.alter_target('rd_nats', dedup_window => 5);

-- the table's own checks, for rows written by hand
\set VERBOSITY terse
INSERT INTO outbox.targets (name, kind, url) VALUES ('x', 'redis', 'redis://127.0.0.1');
INSERT INTO outbox.targets (name, kind, url, stream, dedup_window, maxlen)
	VALUES ('x', 'redis', 'redis://127.0.0.1', 's', 60, 0);
INSERT INTO outbox.targets (name, kind, url, stream) VALUES ('x', 'http', 'http://127.0.0.1', 's');
\set VERBOSITY default

SELECT outbox.drop_target(name) FROM outbox.targets WHERE name LIKE 'rd%' ORDER BY name;
