/* outbox--0.1.sql */

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- The extension lives in pg_catalog (see outbox.control) so that
-- outbox_emit() is callable unqualified from any schema; everything else
-- lives in schema outbox, which the extension owns.
CREATE SCHEMA outbox;
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

-- Messages, one row each, written only by the extension at commit.  The id
-- follows commit order; the table is append-only.
CREATE TABLE outbox.messages (
	id			bigint		NOT NULL,
	msg_id		uuid		NOT NULL,
	topic		text		NOT NULL,
	key			text,
	payload		jsonb		NOT NULL,
	headers		jsonb,
	emitted_at	timestamptz	NOT NULL,
	CONSTRAINT messages_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE outbox.messages IS 'messages of committed transactions, by commit-ordered id';
REVOKE ALL ON TABLE outbox.messages FROM PUBLIC;

-- The durable high-water mark of message ids: the highest id ever removed
-- from outbox.messages.  After a restart the commit sequence continues above
-- it and above every id still in the table.  Normally one row; a restore may
-- add a second, and readers take the maximum.
CREATE TABLE outbox.state (
	id_high_water	bigint	NOT NULL DEFAULT 0
);
COMMENT ON TABLE outbox.state IS 'highest message id ever removed from outbox.messages';
REVOKE ALL ON TABLE outbox.state FROM PUBLIC;
INSERT INTO outbox.state DEFAULT VALUES;

SELECT pg_catalog.pg_extension_config_dump('outbox.messages', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.state', '');

-- Messages never change once stored: they may already have been delivered.
CREATE FUNCTION outbox.messages_guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RAISE EXCEPTION 'cannot update outbox.messages'
		USING ERRCODE = 'insufficient_privilege',
			  DETAIL = 'Stored messages are immutable; they may already have been delivered.',
			  HINT = 'Emit a new message with outbox_emit() instead.';
END
$$;
REVOKE ALL ON FUNCTION outbox.messages_guard() FROM PUBLIC;

CREATE TRIGGER messages_guard
	BEFORE UPDATE ON outbox.messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();

-- Keep the sequence monotone (I6) whatever happens to the table:
--  * rows inserted directly (only the owner can; a restore does) make the
--    sequence continue above them;
--  * DELETE and TRUNCATE record the highest id removed in outbox.state, in
--    the same transaction, so a restart continues above it.  TRUNCATE
--    records the frontier too: it holds an exclusive lock, so every id
--    handed out so far is at or below it, even ids of rows this
--    transaction's snapshot cannot see.
-- These fire even with session_replication_role = replica.
CREATE FUNCTION outbox.advance_sequence(highest bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_advance_sequence'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox.advance_sequence(bigint) FROM PUBLIC;

CREATE FUNCTION outbox.note_inserted_ids()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	highest bigint;
BEGIN
	SELECT max(id) INTO highest FROM inserted_messages;
	IF highest IS NOT NULL THEN
		PERFORM outbox.advance_sequence(highest);
	END IF;
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.note_inserted_ids() FROM PUBLIC;

CREATE FUNCTION outbox.note_deleted_ids()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	UPDATE outbox.state
	   SET id_high_water = greatest(id_high_water, (SELECT max(id) FROM deleted_messages));
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.note_deleted_ids() FROM PUBLIC;

CREATE FUNCTION outbox.note_truncated_ids()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	UPDATE outbox.state
	   SET id_high_water = greatest(id_high_water, (SELECT max(id) FROM outbox.messages),
									outbox.frontier());
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.note_truncated_ids() FROM PUBLIC;

CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
CREATE TRIGGER messages_high_water_delete
	AFTER DELETE ON outbox.messages
	REFERENCING OLD TABLE AS deleted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_deleted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
ALTER TABLE outbox.messages ENABLE ALWAYS TRIGGER messages_high_water_insert;
ALTER TABLE outbox.messages ENABLE ALWAYS TRIGGER messages_high_water_delete;
ALTER TABLE outbox.messages ENABLE ALWAYS TRIGGER messages_high_water_truncate;

-- outbox_emit(topic, payload, key, headers): buffer a message in the
-- current transaction; it is stored, with a commit-ordered id, if and only
-- if the transaction commits.  Returns the message's stable id.
CREATE FUNCTION pg_catalog.outbox_emit(
	topic	text,
	payload	jsonb,
	key		text DEFAULT NULL,
	headers	jsonb DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'outbox_emit'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION pg_catalog.outbox_emit(text, jsonb, text, jsonb)
	IS 'emit a message that exists if and only if the calling transaction commits';
REVOKE ALL ON FUNCTION pg_catalog.outbox_emit(text, jsonb, text, jsonb) FROM PUBLIC;

-- outbox.frontier(): the highest id at or below which no message can still
-- appear; messages up to it are committed and durable.
CREATE FUNCTION outbox.frontier()
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_frontier'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.frontier()
	IS 'highest message id below which no message can still appear';
REVOKE ALL ON FUNCTION outbox.frontier() FROM PUBLIC;

---------------------------------------------------------------------------
-- The relay: targets, subscriptions, progress, dead letters.
---------------------------------------------------------------------------

-- Where messages go.  Changed only through the functions below, which wake
-- the relay worker when their transaction commits.
CREATE TABLE outbox.targets (
	id			int			GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	name		text		NOT NULL UNIQUE,
	kind		text		NOT NULL CHECK (kind IN ('http', 'notify')),
	url			text,
	headers		jsonb		NOT NULL DEFAULT '{}',
	secret		text,
	channel		text,
	batch_size	int			NOT NULL DEFAULT 1,
	lanes		int			NOT NULL DEFAULT 1,
	ordering	text		NOT NULL DEFAULT 'key' CHECK (ordering IN ('key', 'strict')),
	max_attempts int		NOT NULL DEFAULT 10,
	timeout_ms	int			NOT NULL DEFAULT 10000,
	created_at	timestamptz	NOT NULL DEFAULT now(),
	CHECK ((kind = 'http') = (url IS NOT NULL)),
	CHECK ((kind = 'notify') = (channel IS NOT NULL))
);
COMMENT ON TABLE outbox.targets IS 'delivery targets: HTTP endpoints and NOTIFY channels';
REVOKE ALL ON TABLE outbox.targets FROM PUBLIC;

-- Which topics a target receives.  pattern is a topic, a prefix ending in
-- "*" (orders.*), or "*".  Messages with ids at or below start_id (the
-- frontier when the subscription was made) are not delivered under it.
CREATE TABLE outbox.subscriptions (
	target_id	int		NOT NULL REFERENCES outbox.targets (id) ON DELETE CASCADE,
	pattern		text	NOT NULL,
	start_id	bigint	NOT NULL,
	PRIMARY KEY (target_id, pattern)
);
COMMENT ON TABLE outbox.subscriptions IS 'topics (exact, prefix.* or *) each target receives';
REVOKE ALL ON TABLE outbox.subscriptions FROM PUBLIC;

-- Delivery progress, one row per target and lane.  Every message of the
-- lane with an id at or below done_id was delivered or dead-lettered.
CREATE TABLE outbox.progress (
	target_id	int		NOT NULL REFERENCES outbox.targets (id) ON DELETE CASCADE,
	lane		int		NOT NULL,
	done_id		bigint	NOT NULL,
	last_delivered_id bigint,
	delivered	bigint	NOT NULL DEFAULT 0,
	dead		bigint	NOT NULL DEFAULT 0,
	attempts	int		NOT NULL DEFAULT 0,
	last_status	int,
	last_error	text,
	last_error_at timestamptz,
	PRIMARY KEY (target_id, lane)
);
COMMENT ON TABLE outbox.progress IS 'per target and lane: everything at or below done_id is finished';
REVOKE ALL ON TABLE outbox.progress FROM PUBLIC;

-- Messages a target gave up on.
CREATE TABLE outbox.dead_letters (
	target		text		NOT NULL,
	id			bigint		NOT NULL,
	msg_id		uuid		NOT NULL,
	topic		text		NOT NULL,
	key			text,
	attempts	int			NOT NULL,
	last_status	int,
	last_error	text,
	failed_at	timestamptz	NOT NULL DEFAULT now(),
	PRIMARY KEY (target, id)
);
COMMENT ON TABLE outbox.dead_letters IS 'messages a target rejected or that ran out of attempts';
REVOKE ALL ON TABLE outbox.dead_letters FROM PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('outbox.targets', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.progress', '');
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_letters', '');

-- Tell the relay worker, when this transaction commits, to reload targets.
CREATE FUNCTION outbox.config_changed()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_config_changed'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox.config_changed() FROM PUBLIC;

-- Does topic match a subscription pattern?
CREATE FUNCTION outbox.topic_matches(pattern text, topic text)
RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
	SELECT pattern = '*'
		OR topic = pattern
		OR (right(pattern, 1) = '*' AND left(topic, length(pattern) - 1) = left(pattern, -1))
$$;

-- Common checks of the target functions.
CREATE FUNCTION outbox.check_target_name(name text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF name IS NULL OR name !~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$' THEN
		RAISE EXCEPTION 'invalid outbox target name "%"', name
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Target names have 1 to 63 characters: letters, digits, "_", "." and "-".',
				  HINT = 'Use a name such as ''billing-webhook''.';
	END IF;
END
$$;

CREATE FUNCTION outbox.check_headers(headers jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	h record;
BEGIN
	IF headers IS NULL OR jsonb_typeof(headers) <> 'object' THEN
		RAISE EXCEPTION 'target headers must be a JSON object'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass headers such as ''{"authorization": "Bearer ..."}''.';
	END IF;
	FOR h IN SELECT key, value FROM jsonb_each(headers) LOOP
		IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' OR octet_length(h.key) > 256 THEN
			RAISE EXCEPTION 'target header name "%" is not a valid HTTP header name', h.key
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Use header names such as "authorization" or "x-api-key".';
		END IF;
		IF lower(h.key) ~ '^(webhook-|outbox-)' OR lower(h.key) IN ('content-length', 'content-type', 'host',
				'connection', 'transfer-encoding', 'te', 'upgrade', 'expect', 'trailer', 'keep-alive',
				'proxy-connection') THEN
			RAISE EXCEPTION 'target header name "%" is reserved', h.key
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The relay sets this header itself.',
					  HINT = 'Choose another header name.';
		END IF;
		IF jsonb_typeof(h.value) <> 'string' OR (h.value #>> '{}') ~ '[\x01-\x08\x0a-\x1f\x7f]' THEN
			RAISE EXCEPTION 'target header "%" must have a string value without control characters', h.key
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Quote the value and remove carriage returns and line feeds.';
		END IF;
	END LOOP;
END
$$;

-- Store a validated target and its progress rows, which start at the
-- frontier; wake the relay at commit.
CREATE FUNCTION outbox.add_target(target outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	new_id int;
BEGIN
	BEGIN
		INSERT INTO outbox.targets (name, kind, url, headers, secret, channel, batch_size, lanes,
									ordering, max_attempts, timeout_ms)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000))
		RETURNING id INTO new_id;
	EXCEPTION WHEN unique_violation THEN
		RAISE EXCEPTION 'outbox target "%" already exists', target.name
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Drop it first with outbox.drop_target(), or choose another name.';
	END;
	INSERT INTO outbox.progress (target_id, lane, done_id)
	SELECT new_id, g, outbox.frontier() FROM generate_series(0, target.lanes - 1) g;
	PERFORM outbox.config_changed();
END
$$;

CREATE FUNCTION outbox.create_http_target(
	name		 text,
	url			 text,
	headers		 jsonb	DEFAULT '{}',
	secret		 text	DEFAULT NULL,
	batch_size	 int	DEFAULT 1,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 10000)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
	key_bytes bytea;
BEGIN
	PERFORM outbox.check_target_name(name);
	IF url IS NULL OR url !~* '^https?://[^/?#\s]+' OR url ~ '[\s\x01-\x1f\x7f]' OR length(url) > 2048 THEN
		RAISE EXCEPTION 'invalid target URL "%"', url
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Targets take absolute http:// or https:// URLs of at most 2048 characters, without white space.',
				  HINT = 'Use a URL such as ''https://hooks.example.com/outbox''.';
	END IF;
	PERFORM outbox.check_headers(headers);
	IF secret IS NOT NULL THEN
		BEGIN
			IF secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' THEN
				RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value';
			END IF;
			key_bytes := decode(substr(secret, 7), 'base64');
		EXCEPTION WHEN others THEN
			RAISE EXCEPTION 'invalid webhook secret'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Secrets follow the Standard Webhooks format: "whsec_" followed by base64.',
					  HINT = 'Generate one with: SELECT ''whsec_'' || encode(gen_random_bytes(32), ''base64'').';
		END;
		IF length(key_bytes) < 16 OR length(key_bytes) > 64 THEN
			RAISE EXCEPTION 'webhook secret must decode to 16 to 64 bytes, not %', length(key_bytes)
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Use 24 to 64 random bytes, as the Standard Webhooks spec recommends.';
		END IF;
	END IF;
	IF batch_size IS NULL OR batch_size < 1 OR batch_size > 1000 THEN
		RAISE EXCEPTION 'batch_size must be between 1 and 1000, not %', batch_size
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF ordering IS NULL OR ordering NOT IN ('key', 'strict') THEN
		RAISE EXCEPTION 'ordering must be ''key'' or ''strict'', not %', quote_nullable(ordering)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = '''key'' keeps order per key and delivers keys concurrently; ''strict'' delivers the whole target in commit order.';
	END IF;
	IF lanes IS NULL OR lanes < 1 OR lanes > 256 THEN
		RAISE EXCEPTION 'lanes must be between 1 and 256, not %', lanes
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF ordering = 'strict' THEN
		lanes := 1;
	END IF;
	IF max_attempts IS NULL OR max_attempts < 0 OR max_attempts > 1000000 THEN
		RAISE EXCEPTION 'max_attempts must be between 0 (retry forever) and 1000000, not %', max_attempts
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF timeout_ms IS NULL OR timeout_ms < 10 OR timeout_ms > 3600000 THEN
		RAISE EXCEPTION 'timeout_ms must be between 10 and 3600000, not %', timeout_ms
			USING ERRCODE = 'invalid_parameter_value';
	END IF;

	t.name := name;
	t.kind := 'http';
	t.url := url;
	t.headers := headers;
	t.secret := secret;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	PERFORM outbox.add_target(t);
END
$$;

CREATE FUNCTION outbox.create_notify_target(name text, channel text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	IF channel IS NULL OR channel = '' OR octet_length(channel) > 63 THEN
		RAISE EXCEPTION 'invalid NOTIFY channel name %', quote_nullable(channel)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Channel names have 1 to 63 bytes.',
				  HINT = 'Use the name your listeners pass to LISTEN.';
	END IF;
	t.name := name;
	t.kind := 'notify';
	t.channel := channel;
	t.lanes := 1;
	t.ordering := 'strict';
	PERFORM outbox.add_target(t);
END
$$;

CREATE FUNCTION outbox.target_id(name text)
RETURNS int
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	found_id int;
BEGIN
	SELECT t.id INTO found_id FROM outbox.targets t WHERE t.name = target_id.name;
	IF found_id IS NULL THEN
		RAISE EXCEPTION 'outbox target "%" does not exist', name
			USING ERRCODE = 'undefined_object',
				  HINT = 'See SELECT name FROM outbox.targets.';
	END IF;
	RETURN found_id;
END
$$;

CREATE FUNCTION outbox.subscribe(target text, topic text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
BEGIN
	IF topic IS NULL OR topic = '' OR octet_length(topic) > 255
		OR topic ~ '[\s\x01-\x1f\x7f]' OR left(topic, -1) ~ '\*' THEN
		RAISE EXCEPTION 'invalid topic pattern %', quote_nullable(topic)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A pattern is a topic, a prefix followed by "*" (such as ''orders.*''), or ''*''.',
				  HINT = 'Topics have 1 to 255 bytes and no white space.';
	END IF;
	INSERT INTO outbox.subscriptions (target_id, pattern, start_id)
	VALUES (tid, topic, outbox.frontier())
	ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RAISE NOTICE 'target "%" is already subscribed to "%"', target, topic;
	END IF;
	PERFORM outbox.config_changed();
END
$$;

CREATE FUNCTION outbox.unsubscribe(target text, topic text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
BEGIN
	DELETE FROM outbox.subscriptions s WHERE s.target_id = tid AND s.pattern = topic;
	IF NOT FOUND THEN
		RAISE NOTICE 'target "%" is not subscribed to "%"', target, topic;
	END IF;
	PERFORM outbox.config_changed();
END
$$;

CREATE FUNCTION outbox.drop_target(name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(drop_target.name);	-- raises if unknown
BEGIN
	DELETE FROM outbox.targets t WHERE t.id = tid;
	PERFORM outbox.config_changed();
END
$$;

REVOKE ALL ON FUNCTION outbox.check_target_name(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.check_headers(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.add_target(outbox.targets) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.create_http_target(text, text, jsonb, text, int, int, text, int, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.create_notify_target(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.target_id(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.subscribe(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.unsubscribe(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.drop_target(text) FROM PUBLIC;

---------------------------------------------------------------------------
-- Monitoring
---------------------------------------------------------------------------

-- Lane of a message, as the relay computes it: the key's hash (the same as
-- hashtext()) modulo the lanes, or the id modulo the lanes without a key.
CREATE FUNCTION outbox.lane_of(key text, id bigint, lanes int)
RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
	SELECT CASE WHEN lanes = 1 THEN 0
				WHEN key IS NULL THEN (id % lanes)::int
				ELSE ((hashtext(key)::bigint & 4294967295) % lanes)::int END
$$;

-- Messages of a target committed but not yet delivered or dead-lettered,
-- and the emit time of the oldest.  Exact when at most 10000 ids separate
-- the target's slowest lane from the frontier; beyond that, estimated from
-- the first 5000 ids (is_estimate), so the view stays cheap with millions
-- of messages pending.
CREATE FUNCTION outbox.target_pending(target_id int,
									  OUT pending bigint, OUT oldest_pending timestamptz,
									  OUT is_estimate boolean)
RETURNS record
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f bigint := outbox.frontier();
	low bigint;
	nlanes int;
	span bigint;
	sample bigint;
BEGIN
	SELECT min(p.done_id), count(*) INTO low, nlanes
	  FROM outbox.progress p WHERE p.target_id = target_pending.target_id;
	IF low IS NULL OR low >= f THEN
		pending := 0;
		is_estimate := false;
		RETURN;
	END IF;
	span := f - low;
	sample := CASE WHEN span <= 10000 THEN span ELSE 5000 END;

	SELECT count(*), min(m.emitted_at) INTO pending, oldest_pending
	  FROM outbox.messages m
	  JOIN outbox.progress p
		ON p.target_id = target_pending.target_id
	   AND p.lane = outbox.lane_of(m.key, m.id, nlanes)
	 WHERE m.id > low AND m.id <= low + sample
	   AND m.id > p.done_id
	   AND EXISTS (SELECT 1 FROM outbox.subscriptions s
				    WHERE s.target_id = target_pending.target_id
					  AND m.id > s.start_id
					  AND outbox.topic_matches(s.pattern, m.topic));
	is_estimate := sample < span;
	IF is_estimate THEN
		pending := (pending::numeric * span / sample)::bigint;
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.target_pending(int) FROM PUBLIC;

-- One row per target: how far behind it is and what went wrong last.
CREATE VIEW outbox.lag AS
SELECT t.name AS target,
	   t.kind,
	   pend.pending,
	   pend.is_estimate AS pending_is_estimate,
	   pend.oldest_pending,
	   now() - pend.oldest_pending AS lag,
	   prog.last_delivered_id,
	   prog.done_id AS done_up_to_id,
	   prog.delivered,
	   (SELECT count(*) FROM outbox.dead_letters d WHERE d.target = t.name) AS dead_letters,
	   err.last_status,
	   err.last_error,
	   err.last_error_at
  FROM outbox.targets t
 CROSS JOIN LATERAL (SELECT min(p.done_id) AS done_id, max(p.last_delivered_id) AS last_delivered_id,
						   sum(p.delivered)::bigint AS delivered
					  FROM outbox.progress p WHERE p.target_id = t.id) prog
 CROSS JOIN LATERAL outbox.target_pending(t.id) pend
  LEFT JOIN LATERAL (SELECT p.last_status, p.last_error, p.last_error_at
					   FROM outbox.progress p
					  WHERE p.target_id = t.id AND p.last_error IS NOT NULL
					  ORDER BY p.last_error_at DESC LIMIT 1) err ON true;
COMMENT ON VIEW outbox.lag IS 'per target: pending messages, oldest pending, progress, dead letters, last error';
REVOKE ALL ON outbox.lag FROM PUBLIC;
