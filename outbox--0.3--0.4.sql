/* outbox--0.3--0.4.sql */

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.4'" to load this file. \quit

---------------------------------------------------------------------------
-- Amazon SQS, Kinesis and SNS targets (kinds 'sqs', 'kinesis', 'sns'): a
-- region and AWS credentials; a Kinesis target's stream name in stream, an
-- SNS target's topic ARN in topic.
---------------------------------------------------------------------------
ALTER TABLE outbox.targets
	DROP CONSTRAINT targets_kind_check,
	ADD CONSTRAINT targets_kind_check
		CHECK (kind IN ('http', 'notify', 'queue', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns')),
	DROP CONSTRAINT targets_ca_file_check,
	ADD CONSTRAINT targets_ca_file_check
		CHECK (ca_file IS NULL OR (ca_file ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats', 'sqs', 'kinesis', 'sns'))),
	DROP CONSTRAINT targets_client_cert_check,
	ADD CONSTRAINT targets_client_cert_check
		CHECK (client_cert IS NULL OR (client_cert ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats', 'sqs', 'kinesis', 'sns'))),
	DROP CONSTRAINT targets_check,
	ADD CONSTRAINT targets_check CHECK ((kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns')) = (url IS NOT NULL)),
	DROP CONSTRAINT targets_topic_check,
	ADD CONSTRAINT targets_topic_check CHECK ((kind IN ('kafka', 'sns')) = (topic IS NOT NULL)),
	DROP CONSTRAINT targets_stream_check,
	ADD CONSTRAINT targets_stream_check
		CHECK ((kind IN ('redis', 'kinesis')) = (stream IS NOT NULL) AND octet_length(stream) BETWEEN 1 AND 1024),
	DROP CONSTRAINT targets_lanes_check,
	ADD CONSTRAINT targets_lanes_check
		CHECK (lanes BETWEEN 1 AND 256 AND (kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns') OR lanes = 1)),
	-- AWS (SQS, Kinesis): the region requests are signed for, and the
	-- credentials they are signed with (docs/brokers.md, "Amazon SQS")
	ADD COLUMN region text
		CONSTRAINT targets_region_check
		CHECK ((kind IN ('sqs', 'kinesis', 'sns')) = (region IS NOT NULL) AND region ~ '^[a-z0-9-]{1,32}$'),
	ADD COLUMN aws_access_key_id text
		CONSTRAINT targets_aws_access_key_id_check
		CHECK ((aws_access_key_id IS NULL OR kind IN ('sqs', 'kinesis', 'sns')) AND aws_access_key_id ~ '^[!-~]{16,128}$'),
	ADD COLUMN aws_secret_access_key text
		CONSTRAINT targets_aws_secret_access_key_check
		CHECK ((aws_access_key_id IS NULL) = (aws_secret_access_key IS NULL) AND aws_secret_access_key ~ '^[!-~]{1,128}$'),
	ADD COLUMN aws_session_token text
		CONSTRAINT targets_aws_session_token_check
		CHECK (aws_session_token IS NULL OR (aws_access_key_id IS NOT NULL AND aws_session_token ~ '^[!-~]+$' AND octet_length(aws_session_token) <= 8192)),
	-- OAuth2 client credentials (HTTP): the token endpoint, the client, the
	-- scope asked for, and how the client authenticates there ('basic':
	-- an Authorization header, 'post': in the form); outbox.set_oauth2()
	ADD COLUMN oauth_token_url text
		CONSTRAINT targets_oauth_token_url_check
		CHECK (oauth_token_url IS NULL OR (kind = 'http' AND oauth_token_url ~* '^https?://' AND octet_length(oauth_token_url) <= 2048)),
	ADD COLUMN oauth_client_id text
		CONSTRAINT targets_oauth_client_id_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_id IS NULL) AND octet_length(oauth_client_id) BETWEEN 1 AND 1024),
	ADD COLUMN oauth_client_secret text
		CONSTRAINT targets_oauth_client_secret_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_secret IS NULL) AND octet_length(oauth_client_secret) BETWEEN 1 AND 1024),
	ADD COLUMN oauth_scope text
		CONSTRAINT targets_oauth_scope_check
		CHECK (oauth_scope IS NULL OR (oauth_token_url IS NOT NULL AND octet_length(oauth_scope) BETWEEN 1 AND 1024)),
	ADD COLUMN oauth_client_auth text
		CONSTRAINT targets_oauth_client_auth_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_auth IS NULL) AND oauth_client_auth IN ('basic', 'post')),
	-- AWS web identity (SQS, SNS, Kinesis): the role assumed with the token
	-- a file holds (STS AssumeRoleWithWebIdentity), instead of an access
	-- key; STS's URL when not the region's
	ADD COLUMN aws_role_arn text
		CONSTRAINT targets_aws_role_arn_check
		CHECK (aws_role_arn IS NULL OR (kind IN ('sqs', 'kinesis', 'sns') AND aws_role_arn ~ '^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$' AND octet_length(aws_role_arn) <= 2048)),
	ADD COLUMN aws_web_identity_token_file text
		CONSTRAINT targets_aws_web_identity_token_file_check
		CHECK ((aws_role_arn IS NULL) = (aws_web_identity_token_file IS NULL) AND aws_web_identity_token_file ~ '^/'),
	ADD COLUMN aws_sts_endpoint text
		CONSTRAINT targets_aws_sts_endpoint_check
		CHECK (aws_sts_endpoint IS NULL OR (aws_role_arn IS NOT NULL AND aws_sts_endpoint ~* '^https?://' AND octet_length(aws_sts_endpoint) <= 2048)),
	ADD CONSTRAINT targets_aws_credentials_check
		CHECK ((kind IN ('sqs', 'kinesis', 'sns')) = (aws_access_key_id IS NOT NULL OR aws_role_arn IS NOT NULL)
			   AND (aws_access_key_id IS NULL OR aws_role_arn IS NULL));
COMMENT ON TABLE outbox.targets IS 'delivery targets: HTTP endpoints, NOTIFY channels, queues, NATS JetStream, Kafka, Redis Streams, RabbitMQ, Amazon SQS, Kinesis and SNS';
COMMENT ON COLUMN outbox.targets.stream IS
	'Redis: the key of the stream each message is appended to, {topic} and {key} filled in; Kinesis: the name of the stream';

-- The checks of the options every target with lanes has (HTTP, the
-- brokers, AWS): ordering (ordering_hint says what it means for the kind),
-- lanes, attempts and disable_after (check_target_options), timeout_ms and
-- max_rate.
CREATE FUNCTION outbox.check_lane_options(t outbox.targets, ordering_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF t.ordering IS NULL OR t.ordering NOT IN ('key', 'strict') THEN
		RAISE EXCEPTION 'ordering must be ''key'' or ''strict'', not %', quote_nullable(t.ordering)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = ordering_hint;
	END IF;
	IF t.lanes IS NULL OR t.lanes < 1 OR t.lanes > 256 THEN
		RAISE EXCEPTION 'lanes must be between 1 and 256, not %', t.lanes
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM outbox.check_target_options(t);
	IF t.timeout_ms IS NULL OR t.timeout_ms < 10 OR t.timeout_ms > 3600000 THEN
		RAISE EXCEPTION 'timeout_ms must be between 10 and 3600000, not %', t.timeout_ms
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF t.max_rate IS NOT NULL AND NOT (t.max_rate > 0 AND t.max_rate <= 1000000) THEN
		RAISE EXCEPTION 'max_rate must be between 0 (unlimited) and 1000000 requests a second, not %', t.max_rate
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.check_lane_options(outbox.targets, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION outbox.check_http_target(t outbox.targets)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	key_bytes bytea;
BEGIN
	IF t.url IS NULL OR t.url !~* '^https?://[^/?#\s]+' OR t.url ~ '[\s\x01-\x1f\x7f]' OR length(t.url) > 2048 THEN
		RAISE EXCEPTION 'invalid target URL "%"', t.url
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Targets take absolute http:// or https:// URLs of at most 2048 characters, without white space.',
				  HINT = 'Use a URL such as ''https://hooks.example.com/outbox''.';
	END IF;
	PERFORM outbox.check_headers(t.headers);
	IF t.oauth_token_url IS NOT NULL THEN
		PERFORM outbox.check_oauth2(t.oauth_token_url, t.oauth_client_id, t.oauth_client_secret,
									t.oauth_scope, t.oauth_client_auth, t.url);
		IF EXISTS (SELECT 1 FROM jsonb_object_keys(t.headers) k
				   WHERE lower(replace(k, '_', '-')) = 'authorization') THEN
			RAISE EXCEPTION 'a target with OAuth2 client credentials sends its own Authorization header'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The relay sets Authorization to the OAuth2 token.',
					  HINT = 'Take the Authorization header out of the target''s headers, or its OAuth2 client credentials away with outbox.set_oauth2(target, NULL).';
		END IF;
	END IF;
	PERFORM outbox.check_secret(t.secret, 'secret');
	PERFORM outbox.check_secret(t.previous_secret, 'previous_secret');
	IF t.previous_secret IS NOT NULL AND t.secret IS NULL THEN
		RAISE EXCEPTION 'a target with a previous secret needs a secret'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use outbox.rotate_secret() to change keys.';
	END IF;
	IF t.batch_size IS NULL OR t.batch_size < 1 OR t.batch_size > 1000 THEN
		RAISE EXCEPTION 'batch_size must be between 1 and 1000, not %', t.batch_size
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	PERFORM outbox.check_lane_options(t, '''key'' keeps order per key and delivers keys concurrently; ''strict'' delivers the whole target in commit order.');
	-- Last, as it may resolve the host: the URL as libcurl parses it, and
	-- where it may go (outbox.denied_destinations, allowed_destinations).
	PERFORM outbox.check_destination(t.url);
	IF t.oauth_token_url IS NOT NULL THEN
		PERFORM outbox.check_destination(t.oauth_token_url);
	END IF;
	PERFORM outbox.check_tls_files(t);
END
$$;

CREATE OR REPLACE FUNCTION outbox.check_broker_options(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF t.kind = 'nats' THEN
		PERFORM outbox.check_nats_target(t.url, t.subject);
	ELSIF t.kind = 'rabbitmq' THEN
		PERFORM outbox.check_rabbitmq_target(t.url, t.exchange, t.routing_key);
	ELSIF t.kind = 'redis' THEN
		PERFORM outbox.check_redis_target(t.url, t.stream);
		IF t.maxlen IS NOT NULL AND t.maxlen < 1 THEN
			RAISE EXCEPTION 'maxlen must be at least 1, not %', t.maxlen
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'It is about how many entries the stream keeps (XADD MAXLEN ~); pass NULL (or 0 to alter_target) to never trim.';
		END IF;
		IF t.dedup_window IS NULL OR t.dedup_window < 0 OR t.dedup_window > 2592000 THEN
			RAISE EXCEPTION 'dedup_window must be between 0 and 2592000 seconds (30 days), not %', coalesce(t.dedup_window::text, 'NULL')
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'It is how long a message sent again is still recognised and not appended twice; 0 appends without marks.';
		END IF;
	ELSE
		PERFORM outbox.check_kafka_target(t.url, t.topic, t.properties);
	END IF;
	IF t.batch_size IS NULL OR t.batch_size < 1 OR t.batch_size > 1000 THEN
		RAISE EXCEPTION 'batch_size must be between 1 and 1000, not %', t.batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'It is how many messages of different keys a lane has waiting for their acknowledgements.';
	END IF;
	PERFORM outbox.check_lane_options(t, '''key'' keeps order per key and publishes keys concurrently; ''strict'' publishes one message at a time, in commit order.');
	PERFORM outbox.check_tls_files(t);
END
$$;

CREATE OR REPLACE FUNCTION outbox.check_tls_files(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f record;
	scheme text := CASE t.kind WHEN 'http' THEN 'https://' WHEN 'redis' THEN 'rediss://'
								WHEN 'rabbitmq' THEN 'amqps://' WHEN 'nats' THEN 'tls://'
								WHEN 'sqs' THEN 'https://' WHEN 'kinesis' THEN 'https://'
								WHEN 'sns' THEN 'https://' END;
BEGIN
	IF t.credentials IS NOT NULL THEN
		IF NOT pg_has_role(current_user, 'pg_read_server_files', 'USAGE') THEN
			RAISE EXCEPTION 'permission denied to name the credentials file of a target'
				USING ERRCODE = 'insufficient_privilege',
					  DETAIL = 'The relay reads credentials as the server.',
					  HINT = 'Only superusers and members of pg_read_server_files may set it.';
		END IF;
		PERFORM outbox.check_server_file(t.credentials, 'credentials');
		PERFORM outbox.check_nats_credentials(t.credentials);
	END IF;
	IF t.ca_file IS NULL AND t.client_cert IS NULL AND t.client_key IS NULL THEN
		RETURN;
	END IF;
	IF scheme IS NULL THEN
		RAISE EXCEPTION 'a % target has no TLS files', t.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'ca_file, client_cert and client_key go to HTTP, Redis, RabbitMQ, NATS, SQS, Kinesis and SNS targets.';
	END IF;
	IF lower(left(ltrim(t.url), length(scheme))) <> scheme THEN
		RAISE EXCEPTION 'TLS files need % % URL', CASE WHEN scheme IN ('https://', 'amqps://') THEN 'an' ELSE 'a' END, scheme
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = format('Give the target a URL that starts with %s to verify its server with them.', scheme);
	END IF;
	IF NOT pg_has_role(current_user, 'pg_read_server_files', 'USAGE') THEN
		RAISE EXCEPTION 'permission denied to name TLS files of a target'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'The relay reads ca_file, client_cert and client_key as the server.',
				  HINT = 'Only superusers and members of pg_read_server_files may set them.';
	END IF;
	IF t.client_key IS NOT NULL AND t.client_cert IS NULL THEN
		RAISE EXCEPTION 'client_key needs client_cert'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	FOR f IN SELECT * FROM (VALUES ('ca_file', t.ca_file), ('client_cert', t.client_cert),
									('client_key', t.client_key)) v(opt, path)
			 WHERE path IS NOT NULL LOOP
		PERFORM outbox.check_server_file(f.path, f.opt);
	END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION outbox.check_format(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF t.format IS NULL OR t.format NOT IN ('outbox', 'cloudevents', 'cloudevents-structured') THEN
		RAISE EXCEPTION 'unknown target format %', quote_nullable(t.format)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A target sends ''outbox'' (its own shape), ''cloudevents'' (CloudEvents 1.0, binary content mode) or ''cloudevents-structured'' (CloudEvents 1.0, structured content mode).',
				  HINT = 'Pass format => ''cloudevents'' for CloudEvents consumers.';
	END IF;
	IF t.format = 'cloudevents' AND t.kind = 'redis' THEN
		RAISE EXCEPTION 'a Redis target sends CloudEvents in structured mode only'
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'CloudEvents has no Redis binding: the event goes whole, as JSON, in the stream entry''s field cloudevent.',
				  HINT = 'Pass format => ''cloudevents-structured''.';
	END IF;
	IF t.format = 'cloudevents' AND t.kind IN ('sqs', 'kinesis', 'sns') THEN
		RAISE EXCEPTION '% target sends CloudEvents in structured mode only', CASE t.kind WHEN 'sqs' THEN 'an SQS' WHEN 'sns' THEN 'an SNS' ELSE 'a Kinesis' END
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = CASE t.kind WHEN 'sqs' THEN 'CloudEvents has no SQS binding: the event goes whole, as JSON, in the message body.'
								WHEN 'sns' THEN 'CloudEvents has no SNS binding: the event goes whole, as JSON, in the message.'
								ELSE 'CloudEvents has no Kinesis binding: the event goes whole, as JSON, in the record''s data.' END,
				  HINT = 'Pass format => ''cloudevents-structured''.';
	END IF;
	IF t.format <> 'outbox' AND t.kind NOT IN ('http', 'nats', 'kafka', 'rabbitmq', 'redis', 'sqs', 'kinesis', 'sns') THEN
		RAISE EXCEPTION 'a % target cannot send CloudEvents', upper(t.kind)
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'CloudEvents go to HTTP, NATS, Kafka, RabbitMQ, Redis, SQS, Kinesis and SNS targets; NOTIFY sends outbox envelopes only.',
				  HINT = 'Use another kind of target for CloudEvents consumers.';
	END IF;
	IF t.ce_source IS NOT NULL AND t.format = 'outbox' THEN
		RAISE EXCEPTION 'source is the CloudEvents source attribute, and the target sends format ''outbox'''
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass format => ''cloudevents'' as well, or leave source out (source => '''' removes it).';
	END IF;
	IF t.ce_source IS NOT NULL AND (t.ce_source = '' OR octet_length(t.ce_source) > 1024
									OR t.ce_source ~ '[[:cntrl:][:space:]]') THEN
		RAISE EXCEPTION 'invalid CloudEvents source %', quote_literal(left(t.ce_source, 100))
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A source is a URI-reference of 1 to 1024 bytes without white space or control characters.',
				  HINT = 'Use a URI such as ''https://shop.example.com/orders'' or ''/shop/orders''.';
	END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.add_target(target outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	new_id int;
	violated text;
BEGIN
	BEGIN
		INSERT INTO outbox.targets (name, kind, url, headers, secret, channel, batch_size, lanes,
									ordering, max_attempts, timeout_ms, ca_file, client_cert,
									client_key, envelope_only, subject, topic, properties,
									format, ce_source, stream, maxlen, dedup_window,
									exchange, routing_key, credentials, region,
									aws_access_key_id, aws_secret_access_key, aws_session_token,
									aws_role_arn, aws_web_identity_token_file, aws_sts_endpoint)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000),
				target.ca_file, target.client_cert, target.client_key,
				coalesce(target.envelope_only, false), target.subject, target.topic,
				target.properties, coalesce(target.format, 'outbox'), target.ce_source,
				target.stream, target.maxlen, target.dedup_window,
				target.exchange, target.routing_key, target.credentials, target.region,
				target.aws_access_key_id, target.aws_secret_access_key, target.aws_session_token,
				target.aws_role_arn, target.aws_web_identity_token_file, target.aws_sts_endpoint)
		RETURNING id INTO new_id;
	EXCEPTION WHEN unique_violation THEN
		GET STACKED DIAGNOSTICS violated = CONSTRAINT_NAME;
		IF violated IS DISTINCT FROM 'targets_name_key' THEN
			RAISE;
		END IF;
		RAISE EXCEPTION 'outbox target "%" already exists', target.name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Drop it first with outbox.drop_target(), or choose another name.';
	END;
	INSERT INTO outbox.progress (target_id, lane, done_id)
	SELECT new_id, g, outbox.frontier() FROM generate_series(0, target.lanes - 1) g;
	PERFORM outbox.config_changed();
END
$$;

CREATE OR REPLACE FUNCTION outbox.alter_target(
	name		  text,
	url			  text		DEFAULT NULL,
	headers		  jsonb		DEFAULT NULL,
	secret		  text		DEFAULT NULL,
	batch_size	  int		DEFAULT NULL,
	lanes		  int		DEFAULT NULL,
	ordering	  text		DEFAULT NULL,
	max_attempts  int		DEFAULT NULL,
	timeout_ms	  int		DEFAULT NULL,
	max_rate	  float8	DEFAULT NULL,
	disable_after interval	DEFAULT NULL,
	ca_file		  text		DEFAULT NULL,
	client_cert	  text		DEFAULT NULL,
	client_key	  text		DEFAULT NULL,
	envelope_only boolean	DEFAULT NULL,
	subject		  text		DEFAULT NULL,
	topic		  text		DEFAULT NULL,
	properties	  jsonb		DEFAULT NULL,
	format		  text		DEFAULT NULL,
	source		  text		DEFAULT NULL,
	stream		  text		DEFAULT NULL,
	maxlen		  bigint	DEFAULT NULL,
	dedup_window  int		DEFAULT NULL,
	exchange	  text		DEFAULT NULL,
	routing_key	  text		DEFAULT NULL,
	unroutable_after interval DEFAULT NULL,
	credentials	  text		DEFAULT NULL)
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(alter_target.name);
	old outbox.targets;
	t outbox.targets;
	n int := 0;
BEGIN
	SELECT * INTO old FROM outbox.targets WHERE id = tid FOR UPDATE;
	t := old;
	IF old.kind NOT IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns') AND (url IS NOT NULL OR batch_size IS NOT NULL
													  OR lanes IS NOT NULL OR ordering IS NOT NULL
													  OR timeout_ms IS NOT NULL OR max_rate IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, NATS, Kafka, Redis, RabbitMQ, SQS, Kinesis and SNS targets have a URL (brokers, endpoint), batches, lanes, a timeout or a rate.';
	END IF;
	IF old.kind <> 'http' AND (headers IS NOT NULL OR secret IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets have headers and a secret.';
	END IF;
	IF old.kind NOT IN ('http', 'redis', 'rabbitmq', 'nats', 'sqs', 'kinesis', 'sns') AND (ca_file IS NOT NULL OR client_cert IS NOT NULL
																  OR client_key IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, Redis, RabbitMQ, NATS, SQS, Kinesis and SNS targets have TLS files.';
	END IF;
	IF old.kind <> 'nats' AND credentials IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NATS targets have a credentials file.';
	END IF;
	IF old.kind <> 'nats' AND subject IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NATS targets have a subject.';
	END IF;
	IF old.kind NOT IN ('kafka', 'sns') AND topic IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Kafka and SNS targets have a topic.';
	END IF;
	IF old.kind <> 'kafka' AND properties IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Kafka targets have properties.';
	END IF;
	IF old.kind NOT IN ('redis', 'kinesis') AND stream IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Redis and Kinesis targets have a stream.';
	END IF;
	IF old.kind <> 'redis' AND (maxlen IS NOT NULL OR dedup_window IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Redis targets have maxlen and dedup_window.';
	END IF;
	IF old.kind <> 'rabbitmq' AND (exchange IS NOT NULL OR routing_key IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only RabbitMQ targets have an exchange and a routing key.';
	END IF;
	IF old.kind NOT IN ('nats', 'kafka', 'rabbitmq') AND unroutable_after IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NATS, Kafka and RabbitMQ targets fill in a destination the broker may not take (unroutable_after).';
	END IF;
	IF unroutable_after < interval '0' THEN
		RAISE EXCEPTION 'unroutable_after must not be negative'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass interval ''0'' to retry such a message for ever.';
	END IF;
	IF old.kind <> 'notify' AND envelope_only IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NOTIFY targets send envelopes without payload.';
	END IF;
	t.url := coalesce(url, old.url);
	t.headers := coalesce(headers, old.headers);
	t.secret := CASE WHEN secret = '' THEN NULL ELSE coalesce(secret, old.secret) END;
	t.batch_size := coalesce(batch_size, old.batch_size);
	t.ordering := coalesce(ordering, old.pending_ordering, old.ordering);
	t.lanes := coalesce(lanes, old.pending_lanes, old.lanes);
	t.max_attempts := coalesce(max_attempts, old.max_attempts);
	t.timeout_ms := coalesce(timeout_ms, old.timeout_ms);
	t.max_rate := CASE WHEN max_rate = 0 THEN NULL ELSE coalesce(max_rate, old.max_rate) END;
	t.disable_after := CASE WHEN disable_after = interval '0' THEN NULL
							ELSE coalesce(disable_after, old.disable_after) END;
	t.ca_file := CASE WHEN ca_file = '' THEN NULL ELSE coalesce(ca_file, old.ca_file) END;
	t.client_cert := CASE WHEN client_cert = '' THEN NULL ELSE coalesce(client_cert, old.client_cert) END;
	t.client_key := CASE WHEN client_key = '' THEN NULL ELSE coalesce(client_key, old.client_key) END;
	t.envelope_only := coalesce(envelope_only, old.envelope_only);
	t.subject := coalesce(subject, old.subject);
	t.topic := coalesce(topic, old.topic);
	t.properties := coalesce(properties, old.properties);
	t.format := coalesce(format, old.format);
	t.ce_source := CASE WHEN source = '' THEN NULL ELSE coalesce(source, old.ce_source) END;
	t.stream := coalesce(stream, old.stream);
	t.maxlen := CASE WHEN maxlen = 0 THEN NULL ELSE coalesce(maxlen, old.maxlen) END;
	t.dedup_window := coalesce(dedup_window, old.dedup_window);
	t.exchange := coalesce(exchange, old.exchange);
	t.routing_key := coalesce(routing_key, old.routing_key);
	t.unroutable_after := CASE WHEN unroutable_after = interval '0' THEN NULL
							   ELSE coalesce(unroutable_after, old.unroutable_after) END;
	t.credentials := CASE WHEN credentials = '' THEN NULL ELSE coalesce(credentials, old.credentials) END;
	IF old.kind = 'sns' THEN
		t.region := split_part(t.topic, ':', 4);	-- an SNS target's is its topic's
	END IF;
	IF t.secret IS NULL THEN
		t.previous_secret := NULL;	-- an unsigned target has nothing to rotate
	END IF;
	IF old.kind = 'http' THEN
		PERFORM outbox.check_http_target(t);
	ELSIF old.kind IN ('sqs', 'kinesis', 'sns') THEN
		PERFORM outbox.check_aws_options(t);
	ELSIF old.kind IN ('nats', 'kafka', 'redis', 'rabbitmq') THEN
		PERFORM outbox.check_broker_options(t);
	ELSE
		PERFORM outbox.check_target_options(t);
	END IF;
	PERFORM outbox.check_format(t);
	IF t.ordering = 'strict' THEN
		IF lanes IS NOT NULL AND lanes <> 1 THEN
			RAISE EXCEPTION 'a target with strict ordering has one lane, not %', lanes
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass ordering => ''key'' as well to deliver keys on several lanes.';
		END IF;
		t.lanes := 1;
	END IF;

	n := (t.url IS DISTINCT FROM old.url)::int + (t.headers IS DISTINCT FROM old.headers)::int
		+ (t.secret IS DISTINCT FROM old.secret)::int + (t.batch_size IS DISTINCT FROM old.batch_size)::int
		+ (t.lanes IS DISTINCT FROM coalesce(old.pending_lanes, old.lanes))::int
		+ (t.ordering IS DISTINCT FROM coalesce(old.pending_ordering, old.ordering))::int
		+ (t.max_attempts IS DISTINCT FROM old.max_attempts)::int
		+ (t.timeout_ms IS DISTINCT FROM old.timeout_ms)::int
		+ (t.max_rate IS DISTINCT FROM old.max_rate)::int
		+ (t.disable_after IS DISTINCT FROM old.disable_after)::int
		+ (t.ca_file IS DISTINCT FROM old.ca_file)::int
		+ (t.client_cert IS DISTINCT FROM old.client_cert)::int
		+ (t.client_key IS DISTINCT FROM old.client_key)::int
		+ (t.envelope_only IS DISTINCT FROM old.envelope_only)::int
		+ (t.subject IS DISTINCT FROM old.subject)::int
		+ (t.topic IS DISTINCT FROM old.topic)::int
		+ (t.properties IS DISTINCT FROM old.properties)::int
		+ (t.format IS DISTINCT FROM old.format)::int
		+ (t.ce_source IS DISTINCT FROM old.ce_source)::int
		+ (t.stream IS DISTINCT FROM old.stream)::int
		+ (t.maxlen IS DISTINCT FROM old.maxlen)::int
		+ (t.dedup_window IS DISTINCT FROM old.dedup_window)::int
		+ (t.exchange IS DISTINCT FROM old.exchange)::int
		+ (t.routing_key IS DISTINCT FROM old.routing_key)::int
		+ (t.unroutable_after IS DISTINCT FROM old.unroutable_after)::int
		+ (t.credentials IS DISTINCT FROM old.credentials)::int;

	UPDATE outbox.targets x
	   SET url = t.url, headers = t.headers, secret = t.secret, batch_size = t.batch_size,
		   max_attempts = t.max_attempts, timeout_ms = t.timeout_ms, max_rate = t.max_rate,
		   disable_after = t.disable_after, previous_secret = t.previous_secret,
		   ca_file = t.ca_file, client_cert = t.client_cert, client_key = t.client_key,
		   envelope_only = t.envelope_only, subject = t.subject, topic = t.topic,
		   properties = t.properties, format = t.format, ce_source = t.ce_source,
		   stream = t.stream, maxlen = t.maxlen, dedup_window = t.dedup_window,
		   exchange = t.exchange, routing_key = t.routing_key,
		   unroutable_after = t.unroutable_after, credentials = t.credentials, region = t.region,
		   pending_lanes = CASE WHEN t.lanes = old.lanes THEN NULL ELSE t.lanes END,
		   pending_ordering = CASE WHEN t.ordering = old.ordering THEN NULL ELSE t.ordering END
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;

-- The checks of an SQS target's queue URL, region and credentials (in C,
-- as the relay makes them of every row it reads).
CREATE FUNCTION outbox.check_sqs_target(url text, region text, access_key_id text,
										secret_access_key text, session_token text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_sqs_target';
REVOKE ALL ON FUNCTION outbox.check_sqs_target(text, text, text, text, text) FROM PUBLIC;

-- The checks of a Kinesis target's endpoint, stream name, region and
-- credentials (in C, as the relay makes them of every row it reads).
CREATE FUNCTION outbox.check_kinesis_target(endpoint text, stream text, region text,
											access_key_id text, secret_access_key text,
											session_token text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_kinesis_target';
REVOKE ALL ON FUNCTION outbox.check_kinesis_target(text, text, text, text, text, text) FROM PUBLIC;

-- The checks of an SNS target's endpoint, topic ARN, region and
-- credentials (in C, as the relay makes them of every row it reads).
CREATE FUNCTION outbox.check_sns_target(endpoint text, topic_arn text, region text,
										access_key_id text, secret_access_key text,
										session_token text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_sns_target';
REVOKE ALL ON FUNCTION outbox.check_sns_target(text, text, text, text, text, text) FROM PUBLIC;

-- The checks of an AWS target's options (SQS, Kinesis, SNS), shared by the
-- create functions and alter_target.
CREATE FUNCTION outbox.check_aws_options(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	most int := CASE t.kind WHEN 'kinesis' THEN 500 ELSE 10 END;
BEGIN
	IF t.kind = 'sqs' THEN
		PERFORM outbox.check_sqs_target(t.url, t.region, t.aws_access_key_id,
										t.aws_secret_access_key, t.aws_session_token);
	ELSIF t.kind = 'sns' THEN
		PERFORM outbox.check_sns_target(t.url, t.topic, t.region, t.aws_access_key_id,
										t.aws_secret_access_key, t.aws_session_token);
	ELSE
		PERFORM outbox.check_kinesis_target(t.url, t.stream, t.region, t.aws_access_key_id,
											t.aws_secret_access_key, t.aws_session_token);
	END IF;
	IF t.aws_role_arn IS NULL AND (t.aws_web_identity_token_file IS NOT NULL OR t.aws_sts_endpoint IS NOT NULL) THEN
		RAISE EXCEPTION 'web_identity_token_file and sts_endpoint go with role_arn'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give role_arn too, for a web identity; or leave them out, for an access key.';
	END IF;
	IF (t.aws_access_key_id IS NULL) = (t.aws_role_arn IS NULL) THEN
		RAISE EXCEPTION 'an AWS target has an access key or a web identity: %',
			CASE WHEN t.aws_role_arn IS NULL THEN 'it has neither' ELSE 'it has both' END
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Give access_key_id and secret_access_key, or role_arn and web_identity_token_file.';
	END IF;
	IF t.aws_role_arn IS NOT NULL THEN
		PERFORM outbox.check_aws_web_identity(t.aws_role_arn, t.aws_web_identity_token_file,
											  t.aws_sts_endpoint);
		IF NOT pg_has_role(current_user, 'pg_read_server_files', 'USAGE') THEN
			RAISE EXCEPTION 'permission denied to name the web identity token file of a target'
				USING ERRCODE = 'insufficient_privilege',
					  DETAIL = 'The relay reads the token as the server.',
					  HINT = 'Only superusers and members of pg_read_server_files may set it.';
		END IF;
		PERFORM outbox.check_server_file(t.aws_web_identity_token_file, 'web_identity_token_file');
		IF t.aws_sts_endpoint IS NOT NULL THEN
			PERFORM outbox.check_destination(t.aws_sts_endpoint);
		END IF;
	END IF;
	IF t.batch_size IS NULL OR t.batch_size < 1 OR t.batch_size > most THEN
		RAISE EXCEPTION 'batch_size must be between 1 and %, not %', most, t.batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = CASE t.kind WHEN 'sqs' THEN 'It is how many messages go in one SendMessageBatch request; SQS takes at most 10.'
							 WHEN 'sns' THEN 'It is how many messages go in one PublishBatch request; SNS takes at most 10.'
							 ELSE 'It is how many records go in one PutRecords request; Kinesis takes at most 500.' END;
	END IF;
	PERFORM outbox.check_lane_options(t, '''key'' keeps order per key and sends keys concurrently; ''strict'' sends one message at a time, in commit order.');
	-- Last, as it may resolve the host: where requests may go
	-- (outbox.denied_destinations, allowed_destinations).
	PERFORM outbox.check_destination(t.url);
	PERFORM outbox.check_tls_files(t);
END
$$;
REVOKE ALL ON FUNCTION outbox.check_aws_options(outbox.targets) FROM PUBLIC;

-- A target that sends messages to an Amazon SQS queue (SendMessageBatch,
-- signed with AWS Signature Version 4 with the credentials given): a FIFO
-- queue (its name ends in .fifo) gets each message's key as its
-- MessageGroupId and its id as MessageDeduplicationId.  format
-- 'cloudevents-structured' sends CloudEvents; ca_file is for a queue URL
-- whose endpoint has a private CA (a VPC endpoint, a test).
CREATE FUNCTION outbox.create_sqs_target(
	name			  text,
	queue_url		  text,
	region			  text,
	access_key_id	  text	DEFAULT NULL,
	secret_access_key text	DEFAULT NULL,
	session_token	  text	DEFAULT NULL,
	batch_size		  int	DEFAULT 10,
	lanes			  int	DEFAULT 8,
	ordering		  text	DEFAULT 'key',
	max_attempts	  int	DEFAULT 10,
	timeout_ms		  int	DEFAULT 10000,
	format			  text	DEFAULT 'outbox',
	source			  text	DEFAULT NULL,
	ca_file			  text	DEFAULT NULL,
	role_arn		  text	DEFAULT NULL,
	web_identity_token_file text DEFAULT NULL,
	sts_endpoint	  text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'sqs';
	t.url := queue_url;
	t.region := region;
	t.aws_access_key_id := access_key_id;
	t.aws_secret_access_key := secret_access_key;
	t.aws_session_token := session_token;
	t.aws_role_arn := role_arn;
	t.aws_web_identity_token_file := web_identity_token_file;
	t.aws_sts_endpoint := sts_endpoint;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	t.ca_file := ca_file;
	PERFORM outbox.check_aws_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_sqs_target(text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) IS
	'create a target that sends messages to an Amazon SQS queue';
REVOKE ALL ON FUNCTION outbox.create_sqs_target(text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) FROM PUBLIC;

-- Give an AWS target (SQS, Kinesis, SNS) new credentials: an access key id, its secret
-- and, for temporary credentials, a session token.  The relay signs its
-- next requests with them.
CREATE FUNCTION outbox.set_aws_credentials(
	target			  text,
	access_key_id	  text,
	secret_access_key text,
	session_token	  text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
	t outbox.targets;
BEGIN
	SELECT * INTO t FROM outbox.targets WHERE id = tid FOR UPDATE;
	IF t.kind NOT IN ('sqs', 'kinesis', 'sns') THEN
		RAISE EXCEPTION 'target "%" is a % target', target, t.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only SQS, Kinesis and SNS targets have AWS credentials.';
	END IF;
	t.aws_access_key_id := access_key_id;
	t.aws_secret_access_key := secret_access_key;
	t.aws_session_token := session_token;
	IF access_key_id IS NULL OR secret_access_key IS NULL THEN
		RAISE EXCEPTION 'AWS credentials need an access key id and its secret'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use outbox.set_aws_web_identity() for a web identity instead.';
	END IF;
	-- (the credentials only: rotating them needs no right over the
	-- target's other options, its TLS files say)
	IF t.kind = 'sqs' THEN
		PERFORM outbox.check_sqs_target(t.url, t.region, t.aws_access_key_id,
										t.aws_secret_access_key, t.aws_session_token);
	ELSIF t.kind = 'sns' THEN
		PERFORM outbox.check_sns_target(t.url, t.topic, t.region, t.aws_access_key_id,
										t.aws_secret_access_key, t.aws_session_token);
	ELSE
		PERFORM outbox.check_kinesis_target(t.url, t.stream, t.region, t.aws_access_key_id,
											t.aws_secret_access_key, t.aws_session_token);
	END IF;
	UPDATE outbox.targets x
	   SET aws_access_key_id = t.aws_access_key_id, aws_secret_access_key = t.aws_secret_access_key,
		   aws_session_token = t.aws_session_token, aws_role_arn = NULL,
		   aws_web_identity_token_file = NULL, aws_sts_endpoint = NULL
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.set_aws_credentials(text, text, text, text) IS
	'give an SQS, Kinesis or SNS target new AWS credentials';
REVOKE ALL ON FUNCTION outbox.set_aws_credentials(text, text, text, text) FROM PUBLIC;

-- A target that puts messages into an Amazon Kinesis data stream
-- (PutRecords, signed with AWS Signature Version 4): each message a record
-- whose data is its outbox envelope (or CloudEvent) and whose partition
-- key is its key.  endpoint defaults to the region's.
CREATE FUNCTION outbox.create_kinesis_target(
	name			  text,
	stream			  text,
	region			  text,
	access_key_id	  text	DEFAULT NULL,
	secret_access_key text	DEFAULT NULL,
	session_token	  text	DEFAULT NULL,
	endpoint		  text	DEFAULT NULL,
	batch_size		  int	DEFAULT 100,
	lanes			  int	DEFAULT 8,
	ordering		  text	DEFAULT 'key',
	max_attempts	  int	DEFAULT 10,
	timeout_ms		  int	DEFAULT 10000,
	format			  text	DEFAULT 'outbox',
	source			  text	DEFAULT NULL,
	ca_file			  text	DEFAULT NULL,
	role_arn		  text	DEFAULT NULL,
	web_identity_token_file text DEFAULT NULL,
	sts_endpoint	  text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'kinesis';
	t.url := coalesce(endpoint, 'https://kinesis.' || region
					  || CASE WHEN region LIKE 'cn-%' THEN '.amazonaws.com.cn' ELSE '.amazonaws.com' END);
	t.stream := stream;
	t.region := region;
	t.aws_access_key_id := access_key_id;
	t.aws_secret_access_key := secret_access_key;
	t.aws_session_token := session_token;
	t.aws_role_arn := role_arn;
	t.aws_web_identity_token_file := web_identity_token_file;
	t.aws_sts_endpoint := sts_endpoint;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	t.ca_file := ca_file;
	PERFORM outbox.check_aws_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_kinesis_target(text, text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) IS
	'create a target that puts messages into an Amazon Kinesis data stream';
REVOKE ALL ON FUNCTION outbox.create_kinesis_target(text, text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) FROM PUBLIC;

-- A target that publishes messages to an Amazon SNS topic (PublishBatch,
-- signed with AWS Signature Version 4): a FIFO topic (its name ends in
-- .fifo) gets each message's key as its MessageGroupId and its id as
-- MessageDeduplicationId.  The region is the ARN's; endpoint defaults to
-- the region's.
CREATE FUNCTION outbox.create_sns_target(
	name			  text,
	topic_arn		  text,
	access_key_id	  text	DEFAULT NULL,
	secret_access_key text	DEFAULT NULL,
	session_token	  text	DEFAULT NULL,
	endpoint		  text	DEFAULT NULL,
	batch_size		  int	DEFAULT 10,
	lanes			  int	DEFAULT 8,
	ordering		  text	DEFAULT 'key',
	max_attempts	  int	DEFAULT 10,
	timeout_ms		  int	DEFAULT 10000,
	format			  text	DEFAULT 'outbox',
	source			  text	DEFAULT NULL,
	ca_file			  text	DEFAULT NULL,
	role_arn		  text	DEFAULT NULL,
	web_identity_token_file text DEFAULT NULL,
	sts_endpoint	  text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
	region text := split_part(topic_arn, ':', 4);
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'sns';
	t.topic := topic_arn;
	t.region := region;
	t.url := coalesce(endpoint, 'https://sns.' || region
					  || CASE WHEN region LIKE 'cn-%' THEN '.amazonaws.com.cn' ELSE '.amazonaws.com' END);
	t.aws_access_key_id := access_key_id;
	t.aws_secret_access_key := secret_access_key;
	t.aws_session_token := session_token;
	t.aws_role_arn := role_arn;
	t.aws_web_identity_token_file := web_identity_token_file;
	t.aws_sts_endpoint := sts_endpoint;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	t.ca_file := ca_file;
	PERFORM outbox.check_aws_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_sns_target(text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) IS
	'create a target that publishes messages to an Amazon SNS topic';
REVOKE ALL ON FUNCTION outbox.create_sns_target(text, text, text, text, text, text, int, int, text, int, int, text, text, text, text, text, text) FROM PUBLIC;

-- The checks of OAuth2 client credentials (in C, as the relay makes them
-- of every row it reads).  The secret is never quoted in an error.
CREATE FUNCTION outbox.check_oauth2(token_url text, client_id text, client_secret text,
									scope text, client_auth text, receiver_url text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_oauth2';
REVOKE ALL ON FUNCTION outbox.check_oauth2(text, text, text, text, text, text) FROM PUBLIC;

-- Give an HTTP target OAuth2 client credentials (RFC 6749, 4.4): the relay
-- gets a token at token_url and sends it as "Authorization: Bearer" with
-- every request, renewed before it expires.  token_url => NULL takes them
-- away.
CREATE FUNCTION outbox.set_oauth2(
	target		  text,
	token_url	  text,
	client_id	  text DEFAULT NULL,
	client_secret text DEFAULT NULL,
	scope		  text DEFAULT NULL,
	client_auth	  text DEFAULT 'basic')
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(set_oauth2.target);
	t outbox.targets;
BEGIN
	SELECT * INTO t FROM outbox.targets WHERE id = tid FOR UPDATE;
	IF t.kind <> 'http' THEN
		RAISE EXCEPTION 'target "%" is a % target', set_oauth2.target, t.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets take OAuth2 client credentials.';
	END IF;
	IF token_url IS NULL THEN
		IF client_id IS NOT NULL OR client_secret IS NOT NULL OR scope IS NOT NULL THEN
			RAISE EXCEPTION 'OAuth2 client credentials need a token URL'
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass token_url => NULL alone to take a target''s OAuth2 client credentials away.';
		END IF;
		t.oauth_client_auth := NULL;
	ELSE
		t.oauth_client_auth := client_auth;
	END IF;
	t.oauth_token_url := token_url;
	t.oauth_client_id := client_id;
	t.oauth_client_secret := client_secret;
	t.oauth_scope := scope;
	PERFORM outbox.check_http_target(t);
	UPDATE outbox.targets x
	   SET oauth_token_url = t.oauth_token_url, oauth_client_id = t.oauth_client_id,
		   oauth_client_secret = t.oauth_client_secret, oauth_scope = t.oauth_scope,
		   oauth_client_auth = t.oauth_client_auth
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.set_oauth2(text, text, text, text, text, text) IS
	'give an HTTP target OAuth2 client credentials (token_url => NULL takes them away)';
REVOKE ALL ON FUNCTION outbox.set_oauth2(text, text, text, text, text, text) FROM PUBLIC;

-- The checks of an AWS target's web identity (in C, as the relay makes
-- them of every row it reads).
CREATE FUNCTION outbox.check_aws_web_identity(role_arn text, token_file text, sts_endpoint text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_aws_web_identity';
REVOKE ALL ON FUNCTION outbox.check_aws_web_identity(text, text, text) FROM PUBLIC;

-- Give an AWS target (SQS, Kinesis, SNS) a web identity instead of an
-- access key: the relay exchanges the token the file holds for temporary
-- credentials with STS (AssumeRoleWithWebIdentity), renewed before they
-- expire, the file read again each time.
CREATE FUNCTION outbox.set_aws_web_identity(
	target		 text,
	role_arn	 text,
	token_file	 text,
	sts_endpoint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(set_aws_web_identity.target);
	t outbox.targets;
BEGIN
	SELECT * INTO t FROM outbox.targets WHERE id = tid FOR UPDATE;
	IF t.kind NOT IN ('sqs', 'kinesis', 'sns') THEN
		RAISE EXCEPTION 'target "%" is a % target', set_aws_web_identity.target, t.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only SQS, Kinesis and SNS targets have AWS credentials.';
	END IF;
	t.aws_access_key_id := NULL;
	t.aws_secret_access_key := NULL;
	t.aws_session_token := NULL;
	t.aws_role_arn := role_arn;
	t.aws_web_identity_token_file := token_file;
	t.aws_sts_endpoint := sts_endpoint;
	IF role_arn IS NULL OR token_file IS NULL THEN
		RAISE EXCEPTION 'a web identity needs a role ARN and a token file'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use outbox.set_aws_credentials() to sign with an access key instead.';
	END IF;
	PERFORM outbox.check_aws_options(t);
	UPDATE outbox.targets x
	   SET aws_access_key_id = NULL, aws_secret_access_key = NULL, aws_session_token = NULL,
		   aws_role_arn = t.aws_role_arn, aws_web_identity_token_file = t.aws_web_identity_token_file,
		   aws_sts_endpoint = t.aws_sts_endpoint
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.set_aws_web_identity(text, text, text, text) IS
	'give an SQS, Kinesis or SNS target a web identity (STS AssumeRoleWithWebIdentity) instead of an access key';
REVOKE ALL ON FUNCTION outbox.set_aws_web_identity(text, text, text, text) FROM PUBLIC;
