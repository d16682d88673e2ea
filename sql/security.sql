-- Security: what each role may do, where requests may go, input checked by
-- character, signing keys, TLS files, topic grants.  (Delivery is covered
-- by TAP 032-036; outbox.enabled is off here.)  Error contexts are left
-- out: their wording differs between PostgreSQL versions.
\set SHOW_CONTEXT never
\set VERBOSITY default

---------------------------------------------------------------------------
-- An application role granted outbox_emit may emit, and nothing else.
---------------------------------------------------------------------------
CREATE ROLE sec_app;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO sec_app;
SET ROLE sec_app;
SELECT outbox_emit('sec.created', '{"n": 1}', 'k1') IS NOT NULL AS emitted;
SELECT count(*) FROM outbox.messages;
SELECT * FROM outbox.targets;
SELECT * FROM outbox.lag;
SELECT outbox.create_http_target('sec_evil', 'http://127.0.0.1:9/');
SELECT outbox.subscribe('x', 'sec.*');
SELECT outbox.alter_target('x', url => 'http://127.0.0.1:9/');
SELECT outbox.rotate_secret('x', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SELECT outbox.replay('x', 1::bigint);
SELECT outbox.grant_topic('sec_app', '*');
SELECT outbox.metrics();
SELECT outbox.generate_secret();
SELECT outbox.check_destination('http://127.0.0.1/');
SELECT outbox.retention_step(interval '0');
SELECT setval('outbox.id_mark', 1);
INSERT INTO outbox.messages VALUES (1, gen_random_uuid(), 't', NULL, '{}', NULL, now());
RESET ROLE;

---------------------------------------------------------------------------
-- outbox_monitor sees figures and states, never URLs, headers, secrets or
-- payloads.
---------------------------------------------------------------------------
SELECT outbox.create_http_target('sec_hook', 'http://127.0.0.1:9/sec',
	headers => '{"authorization": "Bearer s3cret"}',
	secret => 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
CREATE ROLE sec_watch;
GRANT outbox_monitor TO sec_watch;
SET ROLE sec_watch;
SELECT target, kind, state FROM outbox.lag WHERE target = 'sec_hook';
SELECT count(*) >= 0 AS readable FROM outbox.stats;
SELECT count(*) AS rows FROM outbox.worker;
SELECT outbox.metrics() LIKE '%outbox_pending_messages%' AS has_metrics,
	   outbox.metrics() NOT LIKE '%s3cret%' AND outbox.metrics() NOT LIKE '%whsec_%'
	   AND outbox.metrics() NOT LIKE '%127.0.0.1%' AS no_secrets;
SELECT secret FROM outbox.targets;
SELECT url FROM outbox.targets;
SELECT payload FROM outbox.messages;
SELECT headers FROM outbox.messages;
SELECT * FROM outbox.dead_letters;
SELECT outbox.pause_target('sec_hook');
SELECT outbox.reset_stats();
RESET ROLE;
-- The views show no column that could hold a secret.
SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 WHERE c.relnamespace = 'outbox'::regnamespace AND c.relname IN ('lag', 'stats', 'worker')
   AND a.attnum > 0 AND a.attname ~ '(url|header|secret|payload|channel|key)'
 ORDER BY 1, 2;

---------------------------------------------------------------------------
-- Where requests may go.
---------------------------------------------------------------------------
SHOW outbox.denied_destinations;
SHOW outbox.allowed_destinations;
-- The cloud metadata service and link-local addresses are refused.
SELECT outbox.create_http_target('sec_meta', 'http://169.254.169.254/latest/meta-data/');
\echo :LAST_ERROR_SQLSTATE
SELECT outbox.create_http_target('sec_meta6', 'http://[fd00:ec2::254]/latest/meta-data/');
SELECT outbox.create_http_target('sec_ll6', 'http://[fe80::1]/');
SELECT outbox.create_http_target('sec_ali', 'http://100.100.100.200/latest/meta-data/');
-- ... also written as an IPv4-mapped IPv6 address, or in forms parsers
-- disagree on.
SELECT outbox.create_http_target('sec_mapped', 'http://[::ffff:169.254.169.254]/');
SELECT outbox.create_http_target('sec_nat64', 'http://[64:ff9b::a9fe:a9fe]/');
SELECT outbox.create_http_target('sec_nat64l', 'http://[64:ff9b:1::a9fe:a9fe]/');
SELECT outbox.create_http_target('sec_compat', 'http://[::169.254.169.254]/');
SELECT outbox.create_http_target('sec_6to4', 'http://[2002:a9fe:a9fe::1]/');
SELECT outbox.create_http_target('sec_hex', 'http://0xa9fea9fe/');
SELECT outbox.create_http_target('sec_dec', 'http://2852039166/');
SELECT outbox.create_http_target('sec_oct', 'http://0251.0376.0251.0376/');
SELECT outbox.create_http_target('sec_short', 'http://127.1/');
SELECT outbox.create_http_target('sec_zero', 'http://0.0.0.0:8080/');
SELECT outbox.create_http_target('sec_zero6', 'http://[::]:8080/');
SELECT outbox.create_http_target('sec_zone', 'http://[fe80::1%25eth0]/');
SELECT outbox.create_http_target('sec_cred', 'http://user:pw@127.0.0.1:9/');
SELECT outbox.create_http_target('sec_cred2', 'http://127.0.0.1:9@169.254.169.254/');
SELECT outbox.create_http_target('sec_port', 'http://127.0.0.1:99999/');
SELECT outbox.create_http_target('sec_port0', 'http://127.0.0.1:0/');
SELECT outbox.create_http_target('sec_pct', 'http://127.0.0.%31/');
SELECT outbox.create_http_target('sec_bs', 'http://127.0.0.1:9\@169.254.169.254/');
SELECT outbox.create_http_target('sec_nbsp', E'http://127.0.0.1:9/a\u00a0b');
SELECT outbox.create_http_target('sec_idn', 'http://bücher.example/');
SELECT outbox.create_http_target('sec_ftp', 'ftp://127.0.0.1/');
SELECT outbox.create_http_target('sec_file', 'file:///etc/passwd');
SELECT outbox.create_http_target('sec_gopher', 'gopher://127.0.0.1:6379/_FLUSHALL');
-- Only superusers change the rules.
SET ROLE sec_app;
SET outbox.denied_destinations = '';
SET outbox.allowed_destinations = '*.example.com';
RESET ROLE;
-- Bad rules are refused.
SET outbox.denied_destinations = '10.0.0.0/33';
SET outbox.denied_destinations = 'not-a-cidr';
SET outbox.allowed_destinations = '*.';
-- Entries may be separated by commas, spaces, tabs or newlines.
SET outbox.denied_destinations = E'1.1.1.1\t2.2.2.2\t3.3.3.3\t4.4.4.4\t5.5.5.5\t6.6.6.6\t7.7.7.7\t8.8.8.8\n9.9.9.9\t10.0.0.0/8';
SELECT outbox.create_http_target('sec_tab', 'http://9.9.9.9/');
RESET outbox.denied_destinations;
-- A rule applies to literal addresses and to names resolved now; an
-- allowed CIDR wins over a denied one.
SET outbox.denied_destinations = '127.0.0.0/8, ::1/128';
SELECT outbox.create_http_target('sec_lo', 'http://127.0.0.1:9/');
SELECT outbox.create_http_target('sec_lo_name', 'http://localhost:9/');
SET outbox.allowed_destinations = '127.0.0.2/32';
SELECT outbox.create_http_target('sec_lo2', 'http://127.0.0.2:9/');
SELECT outbox.create_http_target('sec_lo', 'http://127.0.0.1:9/');
-- A non-empty allowed list allows only what it names.
SET outbox.denied_destinations = '169.254.0.0/16';
SET outbox.allowed_destinations = 'localhost, *.hooks.test';
SELECT outbox.create_http_target('sec_named', 'http://localhost:9/');
SELECT outbox.create_http_target('sec_other', 'http://127.0.0.3:9/');
RESET outbox.denied_destinations;
RESET outbox.allowed_destinations;
SELECT name, url FROM outbox.targets WHERE name LIKE 'sec_%' ORDER BY name;

---------------------------------------------------------------------------
-- Input checked by character, not by byte.
---------------------------------------------------------------------------
SELECT outbox_emit(E'orders\u0085created', '{}');
SELECT outbox_emit(E'orders\u00a0created', '{}');
SELECT outbox_emit(E'orders\u2028created', '{}');
SELECT outbox_emit(E'orders\u3000created', '{}');
SELECT outbox_emit(E'orders\u200bcreated', '{}');
SELECT outbox_emit(E'orders\u202ecreated', '{}');
SELECT outbox_emit(E'orders\ufeffcreated', '{}');
SELECT outbox_emit('commandes.créées', '{}') IS NOT NULL AS letters_of_any_script_ok;
SELECT outbox_emit('t', '{}', E'k\u0085') ;
SELECT outbox_emit('t', '{}', E'k\u2029');
SELECT outbox_emit('t', '{}', 'clé-ü') IS NOT NULL AS unicode_key_ok;
SELECT outbox_emit('t', '{}', NULL, E'{"x-a": "caf\u00e9"}');
SELECT outbox_emit('t', '{}', NULL, '{"x-a": "a\u0085b"}');
SELECT outbox_emit('t', '{}', NULL, '{"x-a": "tab\tand ~ printable"}') IS NOT NULL AS ascii_header_ok;
-- Subscriptions can match every topic that can be emitted, and only those.
SELECT outbox.subscribe('sec_hook', E'orders\u00a0*');
SELECT outbox.subscribe('sec_hook', E'a\u2028b');
SELECT outbox.subscribe('sec_hook', 'a*b*');
SELECT outbox.subscribe('sec_hook', 'commandes.*');
-- Target headers: printable ASCII values only.
SELECT outbox.create_http_target('sec_h1', 'http://127.0.0.1:9/', headers => E'{"x-a": "caf\u00e9"}');
SELECT outbox.create_http_target('sec_h2', 'http://127.0.0.1:9/', headers => '{"x-a": "a\r\nInjected: 1"}');
SELECT outbox.create_http_target('sec_h3', 'http://127.0.0.1:9/', headers => '{"x a": "v"}');
SELECT outbox.create_http_target('sec_h4', 'http://127.0.0.1:9/', headers => '{"Host": "evil"}');
-- Names with SQL metacharacters are refused; channels that need quoting
-- are fine (they are never spliced into SQL).
SELECT outbox.create_http_target('x''; DROP TABLE outbox.messages; --', 'http://127.0.0.1:9/');
SELECT outbox.create_http_target('"quoted"', 'http://127.0.0.1:9/');
SELECT outbox.create_notify_target('sec_chan', 'Orders "EU"; DROP TABLE x; --');
SELECT channel FROM outbox.targets WHERE name = 'sec_chan';
SELECT outbox.create_notify_target('sec_chan2', E'bad\nchannel');
SELECT outbox.create_notify_target('sec_chan3', repeat('c', 64));
-- Absurd numbers.
SELECT outbox.create_http_target('sec_n1', 'http://127.0.0.1:9/', batch_size => 1000000);
SELECT outbox.create_http_target('sec_n2', 'http://127.0.0.1:9/', lanes => -1);
SELECT outbox.create_http_target('sec_n3', 'http://127.0.0.1:9/', timeout_ms => 2147483647);
SELECT outbox.create_http_target('sec_n4', 'http://127.0.0.1:9/', max_attempts => -5);
SELECT outbox.alter_target('sec_hook', max_rate => 'NaN');
SELECT outbox.alter_target('sec_hook', max_rate => 'Infinity');
SELECT outbox.alter_target('sec_hook', disable_after => interval '-1 day');
SELECT outbox.alter_target('sec_hook', disable_after => interval '1000000 years');
SELECT outbox.create_http_target('sec_n5', 'http://127.0.0.1:9/', batch_size => 99999999999);
-- Huge and deeply nested payloads.
SET outbox.max_payload_size = '1kB';
SELECT outbox_emit('t', jsonb_build_object('big', repeat('x', 2000)));
RESET outbox.max_payload_size;
SELECT outbox_emit('t', (repeat('[', 100000) || repeat(']', 100000))::jsonb);

---------------------------------------------------------------------------
-- Signing keys: HMAC (whsec_) or ed25519 (whsk_), rotated without a gap.
---------------------------------------------------------------------------
SELECT outbox.generate_secret() ~ '^whsec_[A-Za-z0-9+/]{43}=$' AS hmac_key,
	   outbox.generate_secret('ed25519') ~ '^whsk_[A-Za-z0-9+/]{43}=$' AS ed25519_key;
SELECT outbox.generate_secret('rsa');
-- RFC 8032's first test key: its public key is known.
SELECT outbox.signing_public_key('whsk_' || encode(decode(
	'9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60', 'hex'), 'base64'))
	= 'whpk_' || encode(decode(
	'd75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a', 'hex'), 'base64') AS rfc8032;
SELECT outbox.signing_public_key('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw');
SELECT outbox.signing_public_key('whsk_AAAA');
SELECT outbox.create_http_target('sec_ed', 'http://127.0.0.1:9/ed', secret => 'whsk_AAAA');
SELECT outbox.create_http_target('sec_ed', 'http://127.0.0.1:9/ed',
	secret => 'whsk_' || encode(decode(
	'9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60', 'hex'), 'base64'));
SELECT outbox.rotate_secret('sec_hook', 'whsec_bm90IHRoZSBzYW1lIGtleSBhdCBhbGwh');
SELECT secret, previous_secret FROM outbox.targets WHERE name = 'sec_hook';
SELECT outbox.rotate_secret('sec_hook', 'whsec_bm90IHRoZSBzYW1lIGtleSBhdCBhbGwh');
SELECT outbox.rotate_secret('sec_hook', 'nope');
SELECT outbox.rotate_secret('sec_hook', NULL);
SELECT outbox.rotate_secret('sec_chan', 'whsec_bm90IHRoZSBzYW1lIGtleSBhdCBhbGwh');
SELECT outbox.finish_secret_rotation('sec_hook');
SELECT outbox.finish_secret_rotation('sec_hook');
SELECT secret, previous_secret FROM outbox.targets WHERE name = 'sec_hook';
-- A hand-written row is checked too (terse: the row holds a timestamp).
\set VERBOSITY terse
UPDATE outbox.targets SET previous_secret = 'not-a-key' WHERE name = 'sec_hook';
UPDATE outbox.targets SET previous_secret = secret, secret = NULL WHERE name = 'sec_hook';
\set VERBOSITY default

---------------------------------------------------------------------------
-- TLS files: read by the server, so named only by roles that may read
-- server files, and they must exist.
---------------------------------------------------------------------------
SELECT outbox.create_http_target('sec_tls', 'http://127.0.0.1:9/', ca_file => '/etc/ssl/certs/ca-certificates.crt');
SELECT outbox.create_http_target('sec_tls', 'https://127.0.0.1:9/', ca_file => 'relative/ca.pem');
SELECT outbox.create_http_target('sec_tls', 'https://127.0.0.1:9/', ca_file => '/nonexistent/ca.pem');
SELECT outbox.create_http_target('sec_tls', 'https://127.0.0.1:9/', client_key => '/etc/hostname');
SELECT outbox.create_http_target('sec_tls', 'https://127.0.0.1:9/', ca_file => '/etc/hostname');
SELECT ca_file FROM outbox.targets WHERE name = 'sec_tls';
SELECT outbox.alter_target('sec_tls', ca_file => '');
SELECT ca_file FROM outbox.targets WHERE name = 'sec_tls';
CREATE ROLE sec_admin;
GRANT USAGE ON SCHEMA outbox TO sec_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox TO sec_admin;
GRANT SELECT, UPDATE ON outbox.targets TO sec_admin;
SET ROLE sec_admin;
SELECT outbox.alter_target('sec_tls', ca_file => '/etc/hostname');
-- nor a NATS credentials file, even with EXECUTE on the check itself
SELECT outbox.create_nats_target('sec_nats', 'nats://127.0.0.1:4222', credentials => '/etc/hostname');
SELECT outbox.check_nats_credentials('/etc/hostname');
RESET ROLE;
-- A member of pg_read_server_files may.
GRANT pg_read_server_files TO sec_admin;
SET ROLE sec_admin;
SELECT outbox.alter_target('sec_tls', ca_file => '/etc/hostname');
RESET ROLE;
SELECT ca_file FROM outbox.targets WHERE name = 'sec_tls';

---------------------------------------------------------------------------
-- NOTIFY targets may send envelopes without payload and headers.
---------------------------------------------------------------------------
SELECT outbox.create_notify_target('sec_quiet', 'sec_quiet', envelope_only => true);
SELECT name, envelope_only FROM outbox.targets WHERE kind = 'notify' ORDER BY name;
SELECT outbox.alter_target('sec_quiet', envelope_only => false);
SELECT outbox.alter_target('sec_hook', envelope_only => true);

---------------------------------------------------------------------------
-- Per-topic emit rights.
---------------------------------------------------------------------------
SELECT outbox.grant_topic('sec_app', 'sec.*');
SELECT outbox.grant_topic('sec_app', 'sec.*');
SELECT outbox.grant_topic('nobody_here', 'sec.*');
SELECT outbox.grant_topic('sec_app', E'bad\u00a0*');
SELECT role, pattern FROM outbox.topic_grants;
SET ROLE sec_app;
SET outbox.check_topic_grants = off;
RESET ROLE;
SET outbox.check_topic_grants = on;
SET ROLE sec_app;
SELECT outbox_emit('sec.created', '{}') IS NOT NULL AS granted;
SELECT outbox_emit('payroll.paid', '{}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- Members of a granted role may emit too; superusers are not checked.
CREATE ROLE sec_app2 IN ROLE sec_app;
GRANT EXECUTE ON FUNCTION outbox_emit(text, jsonb, text, jsonb) TO sec_app2;
SET ROLE sec_app2;
SELECT outbox_emit('sec.updated', '{}') IS NOT NULL AS granted_through_membership;
RESET ROLE;
SELECT outbox_emit('payroll.paid', '{}') IS NOT NULL AS superuser_unchecked;
-- A row deleted by hand revokes too, for sessions that cached the grants.
SET ROLE sec_app;
SELECT outbox_emit('sec.cached', '{}') IS NOT NULL AS granted_and_cached;
RESET ROLE;
DELETE FROM outbox.topic_grants WHERE pattern = 'sec.*';
SET ROLE sec_app;
SELECT outbox_emit('sec.cached', '{}');
RESET ROLE;
INSERT INTO outbox.topic_grants (role, pattern) VALUES ('sec_app', 'sec.*');
-- A revoke takes effect at once, for sessions that cached the grants too.
SELECT outbox.revoke_topic('sec_app', 'sec.*');
SELECT outbox.revoke_topic('sec_app', 'sec.*');
SET ROLE sec_app;
SELECT outbox_emit('sec.created', '{}');
RESET ROLE;
SELECT outbox.grant_topic('sec_app', '*');
SET ROLE sec_app;
SELECT outbox_emit('anything.at.all', '{}') IS NOT NULL AS granted_everything;
RESET ROLE;
RESET outbox.check_topic_grants;

-- Clean up the roles (the cluster outlives this database).
DELETE FROM outbox.topic_grants;
DROP OWNED BY sec_app, sec_app2, sec_watch, sec_admin;
DROP ROLE sec_app2, sec_app, sec_watch, sec_admin;
