/* outbox--0.4.sql */

\echo Use "CREATE EXTENSION outbox" to load this file. \quit

-- The extension lives in pg_catalog (see outbox.control) so that
-- outbox_emit() is callable unqualified from any schema; everything else
-- lives in schema outbox, which the extension owns.
CREATE SCHEMA outbox;
REVOKE ALL ON SCHEMA outbox FROM PUBLIC;

---------------------------------------------------------------------------
-- Messages and their ids.
-- Ids follow commit order and never go back; a message exists if and only
-- if its transaction commits (src/emit.c, src/storage.c).
---------------------------------------------------------------------------

-- Messages, one row each, written only by the extension at commit.  The id
-- follows commit order; the table is append-only.  The rows are stored in
-- its chunk tables, outbox.messages_1 to _4 (see "Chunks and retention" below):
-- reading outbox.messages reads them all.
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
SELECT pg_catalog.pg_extension_config_dump('outbox.messages', '');

-- The durable high-water mark of message ids: the highest id ever removed
-- from outbox.messages, and a time before which every removed message was
-- emitted (outbox.replay() cannot go back past either).  After a restart
-- the commit sequence continues above it and above every id still in the
-- table.  Normally one row; a restore may add a second, and readers take
-- the maximum.
CREATE TABLE outbox.state (
	id_high_water	bigint	NOT NULL DEFAULT 0,
	removed_before	timestamptz
);
COMMENT ON TABLE outbox.state IS 'highest message id ever removed from outbox.messages';
COMMENT ON COLUMN outbox.state.removed_before IS
	'every message removed so far was emitted before this time';
REVOKE ALL ON TABLE outbox.state FROM PUBLIC;
INSERT INTO outbox.state DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('outbox.state', '');

-- The durable id mark: at or above every message id ever handed out.  The
-- commit sequence moves it ahead in chunks with setval() (non-transactional
-- and WAL-logged) before it hands out an id past it, so a transaction that
-- reserved ids and then failed, whose rows VACUUM removed, still leaves its
-- ids covered after a restart.  Written only by the library.
CREATE SEQUENCE outbox.id_mark AS bigint MINVALUE 0 START 0 NO CYCLE;
COMMENT ON SEQUENCE outbox.id_mark IS 'at or above every message id handed out; maintained by the library';
REVOKE ALL ON SEQUENCE outbox.id_mark FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.id_mark', '');

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
--    the same transaction, so a restart continues above it.
-- These fire even with session_replication_role = replica.  The chunk
-- tables have the insert and truncate triggers too.
CREATE FUNCTION outbox.advance_sequence(highest bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_advance_sequence'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox.advance_sequence(bigint) FROM PUBLIC;

-- Rows inserted directly: the sequence continues above the highest.
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
CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
ALTER TABLE outbox.messages ENABLE ALWAYS TRIGGER messages_high_water_insert;

-- Rows deleted: the highest id removed is recorded in outbox.state.
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
CREATE TRIGGER messages_high_water_delete
	AFTER DELETE ON outbox.messages
	REFERENCING OLD TABLE AS deleted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_deleted_ids();
ALTER TABLE outbox.messages ENABLE ALWAYS TRIGGER messages_high_water_delete;

-- TRUNCATE (retention empties chunks that way) records the highest id
-- removed, and a time before which every removed message was emitted: when
-- its chunk stopped being current, or now() for the current chunk.  Only
-- this table's rows: each chunk has this trigger, and the id mark (I6)
-- covers every id handed out whatever is removed.
CREATE FUNCTION outbox.note_truncated_ids()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	highest bigint;
	emitted_before timestamptz;
BEGIN
	-- TRUNCATE holds an exclusive lock: no writer is left, and a statement
	-- of a READ COMMITTED transaction sees every row.  An older snapshot may
	-- not: then every id up to the frontier counts as removed.
	EXECUTE format('SELECT max(id) FROM ONLY %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO highest;
	IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
		highest := greatest(highest, outbox.frontier());
	END IF;
	IF highest IS NULL THEN
		RETURN NULL;
	END IF;
	SELECT c.rotated_at INTO emitted_before FROM outbox.chunks c WHERE c.relname = TG_TABLE_NAME;
	UPDATE outbox.state
	   SET id_high_water = greatest(id_high_water, highest),
		   removed_before = greatest(removed_before, coalesce(emitted_before, now()));
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.note_truncated_ids() FROM PUBLIC;
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
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
-- Chunks and retention without bloat (I8).
--
-- Messages are stored in four chunk tables, outbox.messages_1 to _4, which
-- inherit from outbox.messages: reading outbox.messages reads them all.
-- Committing transactions write into the current chunk.  The relay calls
-- outbox.retention_step() about once a second (src/relay_retention.c): it
-- empties, with TRUNCATE, a chunk that stopped being current at least
-- outbox.retention ago and whose every message every target has finished,
-- and moves the current chunk on to an empty one.  Nothing is deleted or
-- updated row by row, so removal costs the same for ten messages as for
-- ten million and leaves no dead rows for VACUUM.  outbox.messages itself
-- (chunk 0) holds only rows inserted into it directly; it is emptied the
-- same way once they are finished.
---------------------------------------------------------------------------

-- The tables messages are stored in: chunk 0 is outbox.messages itself,
-- chunks 1 to 4 its chunk tables.  One of chunks 1 to 4 is current, the
-- one committing transactions write into; rotated_at is when a chunk
-- stopped being current, truncated_at when retention last emptied it.
CREATE TABLE outbox.chunks (
	chunk			int			PRIMARY KEY CHECK (chunk BETWEEN 0 AND 4),
	relname			name		NOT NULL UNIQUE,
	is_current		boolean		NOT NULL DEFAULT false,
	current_since	timestamptz,
	rotated_at		timestamptz,
	truncated_at	timestamptz,
	CHECK (chunk > 0 OR NOT is_current),
	CHECK (is_current = (rotated_at IS NULL))
);
CREATE UNIQUE INDEX chunks_one_current ON outbox.chunks ((true)) WHERE is_current;
COMMENT ON TABLE outbox.chunks IS 'the tables messages are stored in, and which one is written now';
REVOKE ALL ON TABLE outbox.chunks FROM PUBLIC;
-- Chunk 1 is current; the others, and outbox.messages (chunk 0), count as
-- rotated at install.
INSERT INTO outbox.chunks (chunk, relname, is_current, current_since, rotated_at) VALUES
	(0, 'messages', false, NULL, now()),
	(1, 'messages_1', true, now(), NULL),
	(2, 'messages_2', false, NULL, now()),
	(3, 'messages_3', false, NULL, now()),
	(4, 'messages_4', false, NULL, now());

-- The chunk tables: the columns and primary key of outbox.messages, and
-- its triggers but the one on DELETE (retention only truncates them).
CREATE TABLE outbox.messages_1 (CONSTRAINT messages_1_pkey PRIMARY KEY (id)) INHERITS (outbox.messages);
COMMENT ON TABLE outbox.messages_1 IS 'chunk 1 of outbox.messages (read outbox.messages)';
REVOKE ALL ON TABLE outbox.messages_1 FROM PUBLIC;
CREATE TRIGGER messages_guard
	BEFORE UPDATE ON outbox.messages_1
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();
CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages_1
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages_1
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
ALTER TABLE outbox.messages_1 ENABLE ALWAYS TRIGGER messages_high_water_insert;
ALTER TABLE outbox.messages_1 ENABLE ALWAYS TRIGGER messages_high_water_truncate;
SELECT pg_catalog.pg_extension_config_dump('outbox.messages_1', '');

CREATE TABLE outbox.messages_2 (CONSTRAINT messages_2_pkey PRIMARY KEY (id)) INHERITS (outbox.messages);
COMMENT ON TABLE outbox.messages_2 IS 'chunk 2 of outbox.messages (read outbox.messages)';
REVOKE ALL ON TABLE outbox.messages_2 FROM PUBLIC;
CREATE TRIGGER messages_guard
	BEFORE UPDATE ON outbox.messages_2
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();
CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages_2
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages_2
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
ALTER TABLE outbox.messages_2 ENABLE ALWAYS TRIGGER messages_high_water_insert;
ALTER TABLE outbox.messages_2 ENABLE ALWAYS TRIGGER messages_high_water_truncate;
SELECT pg_catalog.pg_extension_config_dump('outbox.messages_2', '');

CREATE TABLE outbox.messages_3 (CONSTRAINT messages_3_pkey PRIMARY KEY (id)) INHERITS (outbox.messages);
COMMENT ON TABLE outbox.messages_3 IS 'chunk 3 of outbox.messages (read outbox.messages)';
REVOKE ALL ON TABLE outbox.messages_3 FROM PUBLIC;
CREATE TRIGGER messages_guard
	BEFORE UPDATE ON outbox.messages_3
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();
CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages_3
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages_3
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
ALTER TABLE outbox.messages_3 ENABLE ALWAYS TRIGGER messages_high_water_insert;
ALTER TABLE outbox.messages_3 ENABLE ALWAYS TRIGGER messages_high_water_truncate;
SELECT pg_catalog.pg_extension_config_dump('outbox.messages_3', '');

CREATE TABLE outbox.messages_4 (CONSTRAINT messages_4_pkey PRIMARY KEY (id)) INHERITS (outbox.messages);
COMMENT ON TABLE outbox.messages_4 IS 'chunk 4 of outbox.messages (read outbox.messages)';
REVOKE ALL ON TABLE outbox.messages_4 FROM PUBLIC;
CREATE TRIGGER messages_guard
	BEFORE UPDATE ON outbox.messages_4
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();
CREATE TRIGGER messages_high_water_insert
	AFTER INSERT ON outbox.messages_4
	REFERENCING NEW TABLE AS inserted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages_4
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
ALTER TABLE outbox.messages_4 ENABLE ALWAYS TRIGGER messages_high_water_insert;
ALTER TABLE outbox.messages_4 ENABLE ALWAYS TRIGGER messages_high_water_truncate;
SELECT pg_catalog.pg_extension_config_dump('outbox.messages_4', '');

-- One step of retention, run by the relay about once a second: empty every
-- chunk that may be emptied, then move the current chunk on when it is due.
-- Returns the current chunk, and what keeps a chunk from being emptied (or
-- NULL).  A chunk is emptied when it stopped being current at least
-- "retention" ago, every message in it is at or below the frontier and at
-- or below the finished position of every lane of every target, and no
-- other transaction is using it (the lock is taken without waiting, so
-- neither committers nor readers ever queue behind a TRUNCATE).  The
-- current chunk moves on every retention / 3 (at least a second) when it
-- holds messages and the next one is empty.
CREATE FUNCTION outbox.retention_step(retention interval,
									  OUT current_chunk int, OUT held_by text)
RETURNS record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c record;
	highest bigint;
	safe bigint;
	holder text;
	cur outbox.chunks;
	nxt outbox.chunks;
	next_empty boolean := false;
BEGIN
	IF retention IS NULL OR retention < interval '0' THEN
		RAISE EXCEPTION 'retention must be a positive interval or zero, not %', quote_nullable(retention)
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	-- Each statement must see every commit before it (the check after the
	-- lock below); an older snapshot could miss a row and remove it.
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'outbox.retention_step() must run in a READ COMMITTED transaction'
			USING ERRCODE = 'invalid_transaction_state',
				  HINT = 'The relay runs it; to run it by hand, use SET TRANSACTION ISOLATION LEVEL READ COMMITTED.';
	END IF;
	SELECT * INTO cur FROM outbox.chunks WHERE is_current;
	SELECT * INTO nxt FROM outbox.chunks WHERE chunk = cur.chunk % 4 + 1;

	FOR c IN SELECT * FROM outbox.chunks WHERE NOT is_current ORDER BY chunk LOOP
		EXECUTE format('SELECT max(id) FROM ONLY outbox.%I', c.relname) INTO highest;
		IF highest IS NULL THEN
			next_empty := next_empty OR c.chunk = nxt.chunk;
			CONTINUE;
		END IF;
		IF c.rotated_at > now() - retention THEN
			held_by := coalesce(held_by, format('retention: chunk %s is kept until %s', c.chunk,
												c.rotated_at + retention));
			CONTINUE;
		END IF;
		BEGIN
			EXECUTE format('LOCK TABLE ONLY outbox.%I IN ACCESS EXCLUSIVE MODE NOWAIT', c.relname);
		EXCEPTION WHEN lock_not_available THEN
			SELECT string_agg(DISTINCT l.pid::text, ', ') INTO holder
			  FROM pg_locks l
			 WHERE l.locktype = 'relation' AND l.granted
			   AND l.relation = format('outbox.%I', c.relname)::regclass
			   AND l.pid <> pg_backend_pid();
			held_by := coalesce(held_by, format('a lock on outbox.%s held by pid %s', c.relname,
												coalesce(holder, '?')));
			CONTINUE;
		END;
		-- With the lock no message can still be added; look again.
		EXECUTE format('SELECT max(id) FROM ONLY outbox.%I', c.relname) INTO highest;
		SELECT least(outbox.frontier(), min(p.done_id)) INTO safe FROM outbox.progress p;
		IF highest IS NOT NULL AND highest > safe THEN
			SELECT format('target "%s" (lane %s) has not finished message %s', t.name, p.lane, p.done_id + 1)
			  INTO holder
			  FROM outbox.progress p JOIN outbox.targets t ON t.id = p.target_id
			 ORDER BY p.done_id, t.name, p.lane LIMIT 1;
			held_by := coalesce(held_by, coalesce(holder, format('message %s is not committed yet', safe + 1)));
			CONTINUE;
		END IF;
		IF highest IS NOT NULL THEN
			EXECUTE format('TRUNCATE ONLY outbox.%I', c.relname);
			UPDATE outbox.chunks SET truncated_at = now() WHERE chunk = c.chunk;
		END IF;
		next_empty := next_empty OR c.chunk = nxt.chunk;
	END LOOP;

	current_chunk := cur.chunk;
	IF next_empty AND cur.current_since <= now() - greatest(retention / 3, interval '1 second') THEN
		EXECUTE format('SELECT max(id) FROM ONLY outbox.%I', cur.relname) INTO highest;
		IF highest IS NOT NULL THEN
			UPDATE outbox.chunks SET is_current = false, rotated_at = now(), current_since = NULL
			 WHERE chunk = cur.chunk;
			UPDATE outbox.chunks SET is_current = true, rotated_at = NULL, current_since = now()
			 WHERE chunk = nxt.chunk;
			current_chunk := nxt.chunk;
		END IF;
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.retention_step(interval) FROM PUBLIC;

---------------------------------------------------------------------------
-- Targets, subscriptions, progress, dead letters.
-- What the relay delivers to, and how far it has come.
---------------------------------------------------------------------------

-- Where messages go: HTTP endpoints, NOTIFY channels, queues (see
-- "Queues" below), NATS JetStream (src/relay_nats.c), Kafka
-- (src/relay_kafka.c), Redis Streams (src/relay_redis.c) and RabbitMQ
-- (src/relay_rabbitmq.c).  Changed only through the functions below, which
-- wake the relay worker when their transaction commits.  The constraints
-- hold the limits of the target functions, so the relay can trust the rows
-- (it checks them again as it loads them, and skips a bad one with a
-- WARNING shown in outbox.lag).
CREATE TABLE outbox.targets (
	id			int			GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	name		text		NOT NULL UNIQUE,
	kind		text		NOT NULL
		CONSTRAINT targets_kind_check
		CHECK (kind IN ('http', 'notify', 'queue', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns')),
	url			text,		-- HTTP, NATS, Redis, RabbitMQ; Kafka: the bootstrap list
	headers		jsonb		NOT NULL DEFAULT '{}',
	secret		text,
	channel		text,		-- NOTIFY
	batch_size	int			NOT NULL DEFAULT 1,
	lanes		int			NOT NULL DEFAULT 1,
	ordering	text		NOT NULL DEFAULT 'key' CHECK (ordering IN ('key', 'strict')),
	max_attempts int		NOT NULL DEFAULT 10,
	timeout_ms	int			NOT NULL DEFAULT 10000,
	created_at	timestamptz	NOT NULL DEFAULT now(),
	-- operating a target (outbox.pause_target, alter_target, ...)
	state		text		NOT NULL DEFAULT 'active'
		CONSTRAINT targets_state_check CHECK (state IN ('active', 'paused', 'disabled')),
	state_reason text,
	state_changed_at timestamptz,
	max_rate	float8
		CONSTRAINT targets_max_rate_check CHECK (max_rate > 0 AND max_rate <= 1000000),
	disable_after interval	DEFAULT interval '3 days'
		CONSTRAINT targets_disable_after_check CHECK (disable_after > interval '0' AND disable_after <= interval '100 years'),
	pending_lanes int
		CONSTRAINT targets_pending_lanes_check CHECK (pending_lanes BETWEEN 1 AND 256),
	pending_ordering text
		CONSTRAINT targets_pending_ordering_check CHECK (pending_ordering IN ('key', 'strict')),
	-- security: signing keys that rotate, TLS files (HTTP and the brokers
	-- on a TLS url), NOTIFY without payload
	previous_secret text
		CONSTRAINT targets_previous_secret_check
		CHECK (previous_secret IS NULL OR (previous_secret ~ '^(whsec_|whsk_)[A-Za-z0-9+/]+={0,2}$' AND secret IS NOT NULL)),
	ca_file		text
		CONSTRAINT targets_ca_file_check
		CHECK (ca_file IS NULL OR (ca_file ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats', 'sqs', 'kinesis', 'sns'))),
	client_cert	text
		CONSTRAINT targets_client_cert_check
		CHECK (client_cert IS NULL OR (client_cert ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats', 'sqs', 'kinesis', 'sns'))),
	client_key	text
		CONSTRAINT targets_client_key_check CHECK (client_key IS NULL OR (client_key ~ '^/' AND client_cert IS NOT NULL)),
	envelope_only boolean	NOT NULL DEFAULT false,
	-- brokers
	subject		text		-- NATS: the subject template
		CONSTRAINT targets_subject_check CHECK ((kind = 'nats') = (subject IS NOT NULL)),
	topic		text		-- Kafka: the topic template; SNS: the topic's ARN
		CONSTRAINT targets_topic_check CHECK ((kind IN ('kafka', 'sns')) = (topic IS NOT NULL)),
	properties	jsonb		-- Kafka: librdkafka settings
		CONSTRAINT targets_properties_check
		CHECK (properties IS NULL OR (kind = 'kafka' AND jsonb_typeof(properties) = 'object')),
	-- the format consumers parse: CloudEvents 1.0, and its source attribute
	format		text		NOT NULL DEFAULT 'outbox'
		CONSTRAINT targets_format_check
		CHECK (format IN ('outbox', 'cloudevents', 'cloudevents-structured')),
	ce_source	text
		CONSTRAINT targets_ce_source_check
		CHECK (ce_source IS NULL OR (octet_length(ce_source) BETWEEN 1 AND 1024
									 AND ce_source !~ '[[:cntrl:][:space:]]')),
	stream		text		-- Redis: the stream's key template; Kinesis: the stream's name
		CONSTRAINT targets_stream_check
		CHECK ((kind IN ('redis', 'kinesis')) = (stream IS NOT NULL) AND octet_length(stream) BETWEEN 1 AND 1024),
	maxlen		bigint		-- Redis: approximate MAXLEN, NULL none
		CONSTRAINT targets_maxlen_check
		CHECK (maxlen IS NULL OR (kind = 'redis' AND maxlen >= 1)),
	dedup_window int		-- Redis: seconds a de-dup mark lives, 0 none
		CONSTRAINT targets_dedup_window_check
		CHECK ((kind = 'redis') = (dedup_window IS NOT NULL) AND dedup_window BETWEEN 0 AND 2592000),
	exchange	text		-- RabbitMQ: the exchange ('' the default)
		CONSTRAINT targets_exchange_check
		CHECK ((kind = 'rabbitmq') = (exchange IS NOT NULL) AND octet_length(exchange) <= 255),
	routing_key	text		-- RabbitMQ: the routing key template
		CONSTRAINT targets_routing_key_check
		CHECK ((kind = 'rabbitmq') = (routing_key IS NOT NULL) AND octet_length(routing_key) <= 255),
	credentials	text		-- NATS: a .creds or NKey seed file
		CONSTRAINT targets_credentials_check CHECK (credentials IS NULL OR (credentials ~ '^/' AND kind = 'nats')),
	-- a destination filled in from a message's topic or key that the
	-- broker does not take (no stream or binding covers it, no such Kafka
	-- topic) is the message's own failure: its lane retries it, the rest
	-- of the target goes on, and after unroutable_after from its first
	-- refusal it is a dead letter (NULL: it is retried for ever)
	unroutable_after interval DEFAULT interval '10 minutes'
		CHECK (unroutable_after > interval '0'),
	-- AWS (SQS, Kinesis): the region requests are signed for, and the
	-- credentials they are signed with (docs/brokers.md, "Amazon SQS")
	region		text
		CONSTRAINT targets_region_check
		CHECK ((kind IN ('sqs', 'kinesis', 'sns')) = (region IS NOT NULL) AND region ~ '^[a-z0-9-]{1,32}$'),
	aws_access_key_id text
		CONSTRAINT targets_aws_access_key_id_check
		CHECK ((aws_access_key_id IS NULL OR kind IN ('sqs', 'kinesis', 'sns')) AND aws_access_key_id ~ '^[!-~]{16,128}$'),
	aws_secret_access_key text
		CONSTRAINT targets_aws_secret_access_key_check
		CHECK ((aws_access_key_id IS NULL) = (aws_secret_access_key IS NULL) AND aws_secret_access_key ~ '^[!-~]{1,128}$'),
	aws_session_token text
		CONSTRAINT targets_aws_session_token_check
		CHECK (aws_session_token IS NULL OR (aws_access_key_id IS NOT NULL AND aws_session_token ~ '^[!-~]+$' AND octet_length(aws_session_token) <= 8192)),
	-- OAuth2 client credentials (HTTP): the token endpoint, the client, the
	-- scope asked for, and how the client authenticates there ('basic':
	-- an Authorization header, 'post': in the form); outbox.set_oauth2()
	oauth_token_url text
		CONSTRAINT targets_oauth_token_url_check
		CHECK (oauth_token_url IS NULL OR (kind = 'http' AND oauth_token_url ~* '^https?://' AND octet_length(oauth_token_url) <= 2048)),
	oauth_client_id text
		CONSTRAINT targets_oauth_client_id_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_id IS NULL) AND octet_length(oauth_client_id) BETWEEN 1 AND 1024),
	oauth_client_secret text
		CONSTRAINT targets_oauth_client_secret_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_secret IS NULL) AND octet_length(oauth_client_secret) BETWEEN 1 AND 1024),
	oauth_scope text
		CONSTRAINT targets_oauth_scope_check
		CHECK (oauth_scope IS NULL OR (oauth_token_url IS NOT NULL AND octet_length(oauth_scope) BETWEEN 1 AND 1024)),
	oauth_client_auth text
		CONSTRAINT targets_oauth_client_auth_check
		CHECK ((oauth_token_url IS NULL) = (oauth_client_auth IS NULL) AND oauth_client_auth IN ('basic', 'post')),
	-- AWS web identity (SQS, SNS, Kinesis): the role assumed with the token
	-- a file holds (STS AssumeRoleWithWebIdentity), instead of an access
	-- key; STS's URL when not the region's
	aws_role_arn text
		CONSTRAINT targets_aws_role_arn_check
		CHECK (aws_role_arn IS NULL OR (kind IN ('sqs', 'kinesis', 'sns') AND aws_role_arn ~ '^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$' AND octet_length(aws_role_arn) <= 2048)),
	aws_web_identity_token_file text
		CONSTRAINT targets_aws_web_identity_token_file_check
		CHECK ((aws_role_arn IS NULL) = (aws_web_identity_token_file IS NULL) AND aws_web_identity_token_file ~ '^/'),
	aws_sts_endpoint text
		CONSTRAINT targets_aws_sts_endpoint_check
		CHECK (aws_sts_endpoint IS NULL OR (aws_role_arn IS NOT NULL AND aws_sts_endpoint ~* '^https?://' AND octet_length(aws_sts_endpoint) <= 2048)),
	CONSTRAINT targets_aws_credentials_check
		CHECK ((kind IN ('sqs', 'kinesis', 'sns')) = (aws_access_key_id IS NOT NULL OR aws_role_arn IS NOT NULL)
			   AND (aws_access_key_id IS NULL OR aws_role_arn IS NULL)),
	CONSTRAINT targets_check CHECK ((kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns')) = (url IS NOT NULL)),
	CONSTRAINT targets_check1 CHECK ((kind = 'notify') = (channel IS NOT NULL)),
	CONSTRAINT targets_lanes_check
		CHECK (lanes BETWEEN 1 AND 256 AND (kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq', 'sqs', 'kinesis', 'sns') OR lanes = 1))
);
-- The limits of the target functions on these options are NOT VALID
-- because outbox--0.1--0.2.sql adds them so (a row written there by hand
-- must not make the update fail; the relay skips it), and a direct install
-- must give the same catalog.  CREATE TABLE cannot say NOT VALID: apart
-- from ENABLE ALWAYS TRIGGER, this is the script's only ALTER TABLE of a
-- table it creates.  On a new table it changes nothing: every row written
-- is checked.
ALTER TABLE outbox.targets
	ADD CONSTRAINT targets_batch_size_check CHECK (batch_size BETWEEN 1 AND 1000) NOT VALID,
	ADD CONSTRAINT targets_max_attempts_check CHECK (max_attempts BETWEEN 0 AND 1000000) NOT VALID,
	ADD CONSTRAINT targets_timeout_ms_check CHECK (timeout_ms BETWEEN 10 AND 3600000) NOT VALID,
	ADD CONSTRAINT targets_secret_check CHECK (secret IS NULL OR secret ~ '^(whsec_|whsk_)[A-Za-z0-9+/]+={0,2}$') NOT VALID,
	ADD CONSTRAINT targets_headers_check CHECK (jsonb_typeof(headers) = 'object') NOT VALID,
	ADD CONSTRAINT targets_channel_check CHECK (channel IS NULL OR octet_length(channel) BETWEEN 1 AND 63) NOT VALID;
COMMENT ON TABLE outbox.targets IS 'delivery targets: HTTP endpoints, NOTIFY channels, queues, NATS JetStream, Kafka, Redis Streams, RabbitMQ, Amazon SQS, Kinesis and SNS';
REVOKE ALL ON TABLE outbox.targets FROM PUBLIC;
COMMENT ON COLUMN outbox.targets.state IS
	'active; paused (by outbox.pause_target); disabled (410 Gone, or failing for disable_after)';
COMMENT ON COLUMN outbox.targets.pending_lanes IS
	'lanes asked for by outbox.alter_target(); the relay applies it once the lanes are idle';
COMMENT ON COLUMN outbox.targets.previous_secret IS
	'the key being rotated out (outbox.rotate_secret): requests carry its signature too';
COMMENT ON COLUMN outbox.targets.envelope_only IS
	'NOTIFY: send the envelope without payload and headers; listeners read the message from a table';
SELECT pg_catalog.pg_extension_config_dump('outbox.targets', '');
-- A dump keeps the target id sequence, so targets created after a restore
-- get new ids.
SELECT pg_catalog.pg_extension_config_dump('outbox.targets_id_seq', '');
COMMENT ON COLUMN outbox.targets.credentials IS
	'NATS: a .creds file (a user JWT and its NKey seed) or an NKey seed file the relay logs in with';
COMMENT ON COLUMN outbox.targets.stream IS
	'Redis: the key of the stream each message is appended to, {topic} and {key} filled in; Kinesis: the name of the stream';
COMMENT ON COLUMN outbox.targets.maxlen IS
	'Redis: the stream is trimmed to about this many entries (XADD MAXLEN ~), NULL for never';
COMMENT ON COLUMN outbox.targets.dedup_window IS
	'Redis: seconds the mark of an appended message id lives; a message sent again within it is not appended again (0: no marks)';
COMMENT ON COLUMN outbox.targets.exchange IS
	'RabbitMQ: the exchange each message is published to ('''' is the default exchange, which routes to the queue the routing key names)';
COMMENT ON COLUMN outbox.targets.routing_key IS
	'RabbitMQ: the routing key, {topic} and {key} filled in';
COMMENT ON COLUMN outbox.targets.unroutable_after IS
	'how long a message whose filled-in destination the broker does not take is retried before it is a dead letter (NULL: for ever)';

-- Which topics a target receives.  pattern is a topic, a prefix ending in
-- "*" (orders.*), or "*".  Messages with ids at or below start_id (the
-- frontier when the subscription was made) are not delivered under it;
-- filter, a jsonpath over the message's document, narrows it further.
CREATE TABLE outbox.subscriptions (
	target_id	int		NOT NULL REFERENCES outbox.targets (id) ON DELETE CASCADE,
	pattern		text	NOT NULL,
	start_id	bigint	NOT NULL,
	filter		jsonpath,
	PRIMARY KEY (target_id, pattern)
);
COMMENT ON TABLE outbox.subscriptions IS 'topics (exact, prefix.* or *) each target receives';
REVOKE ALL ON TABLE outbox.subscriptions FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.subscriptions', '');
COMMENT ON COLUMN outbox.subscriptions.filter IS
	'jsonpath over {"topic", "key", "headers", "payload"} a message must match, or NULL';

-- Delivery progress, one row per target and lane.  Every message of the
-- lane with an id at or below done_id was delivered or dead-lettered.
-- Stable batch ids: a batch of fewer than batch_size messages is recorded
-- (batch_end) before it is sent, so that after a restart it is cut the
-- same way (same members, same webhook-id).  Full batches are cut the
-- same way anyway.  failing_id: the message a lane's last_error is about,
-- while it fails (written by the relay); set_aside_id and
-- set_aside_reason: a request of outbox.set_aside(), cleared by the relay
-- once it acted on it.
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
	batch_end	bigint,
	generation	int		NOT NULL DEFAULT 0,
	failing_id	bigint,
	set_aside_id bigint,
	set_aside_reason text,
	PRIMARY KEY (target_id, lane)
);
COMMENT ON TABLE outbox.progress IS 'per target and lane: everything at or below done_id is finished';
REVOKE ALL ON TABLE outbox.progress FROM PUBLIC;
COMMENT ON COLUMN outbox.progress.batch_end IS
	'last id of the batch in flight when it was cut short of batch_size; ignored once done_id passes it';
COMMENT ON COLUMN outbox.progress.generation IS
	'bumped by outbox.replay(): the relay reloads the lane, and drops its own older writes';
SELECT pg_catalog.pg_extension_config_dump('outbox.progress', '');
COMMENT ON COLUMN outbox.progress.failing_id IS
	'the message the lane''s last_error is about, while the lane retries it';
COMMENT ON COLUMN outbox.progress.set_aside_id IS
	'asked by outbox.set_aside(): the relay makes this message a dead letter if it is still the lane''s failing head';

-- Messages a target gave up on, with what is needed to deliver them again
-- (outbox.retry_dead_letters) after their message was removed.
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
	payload		jsonb,
	headers		jsonb,
	emitted_at	timestamptz,
	retry_requested_at timestamptz,
	PRIMARY KEY (target, id)
);
COMMENT ON TABLE outbox.dead_letters IS 'messages a target rejected or that ran out of attempts';
REVOKE ALL ON TABLE outbox.dead_letters FROM PUBLIC;
COMMENT ON COLUMN outbox.dead_letters.retry_requested_at IS
	'set by outbox.retry_dead_letters(): the relay delivers it again, then removes it';
SELECT pg_catalog.pg_extension_config_dump('outbox.dead_letters', '');

---------------------------------------------------------------------------
-- Helpers and checks of target options.
-- Shared by the functions that create and alter targets; those in C are
-- the relay's own checks of every row it loads.
---------------------------------------------------------------------------

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

-- A target name: 1 to 63 letters, digits, '_', '.' and '-'.
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
REVOKE ALL ON FUNCTION outbox.check_target_name(text) FROM PUBLIC;

-- Header values travel raw in HTTP request headers: printable ASCII only.
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
	IF octet_length(headers::text) > 65536 THEN
		RAISE EXCEPTION 'target headers are too large'
			USING ERRCODE = 'program_limit_exceeded',
				  DETAIL = 'The headers take more than 64 kB as text.';
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
		IF jsonb_typeof(h.value) <> 'string' THEN
			RAISE EXCEPTION 'target header "%" must have a string value', h.key
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Quote the value, for example ''{"x-retry": "3"}''.';
		END IF;
		PERFORM outbox.check_text(h.value #>> '{}', 'header_value', format('target header "%s"', h.key));
	END LOOP;
END
$$;
REVOKE ALL ON FUNCTION outbox.check_headers(jsonb) FROM PUBLIC;

-- Raise invalid_parameter_value when value holds a character its kind
-- (topic, pattern, key, header_value, channel) does not allow.
CREATE FUNCTION outbox.check_text(value text, kind text, what text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_check_text_sql'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION outbox.check_text(text, text, text) FROM PUBLIC;

-- Refuse a URL libcurl would read differently from how it is written, or
-- whose host (literal, or resolved now) outbox.denied_destinations or
-- outbox.allowed_destinations refuse.  The relay checks again at every
-- connect, on the address it dials.
CREATE FUNCTION outbox.check_destination(url text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_check_destination'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION outbox.check_destination(text) FROM PUBLIC;

-- The whpk_ public key of a whsk_ key, for receivers of v1a signatures.
-- Signing keys: whsec_ (HMAC-SHA256, "v1,") or whsk_ (ed25519, "v1a,").
CREATE FUNCTION outbox.signing_public_key(secret text)
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_signing_public_key'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.signing_public_key(text) IS
	'the whpk_ public key of a whsk_ signing key, for receivers of v1a signatures';
REVOKE ALL ON FUNCTION outbox.signing_public_key(text) FROM PUBLIC;

-- A new signing key: whsec_ (HMAC) or whsk_ (Ed25519).
CREATE FUNCTION outbox.generate_secret(kind text DEFAULT 'hmac')
RETURNS text
AS 'MODULE_PATHNAME', 'outbox_generate_secret'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION outbox.generate_secret(text) IS
	'a new random signing key: ''hmac'' (whsec_) or ''ed25519'' (whsk_)';
REVOKE ALL ON FUNCTION outbox.generate_secret(text) FROM PUBLIC;

-- A signing key as a target's secret (or previous_secret) takes it: a
-- whsk_ ed25519 key, or a whsec_ key of 16 to 64 bytes.  NULL is none.
CREATE FUNCTION outbox.check_secret(secret text, what text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	key_bytes bytea;
BEGIN
	IF secret IS NULL THEN
		RETURN;
	END IF;
	IF secret ~ '^whsk_' THEN
		BEGIN
			PERFORM outbox.signing_public_key(secret);
		EXCEPTION WHEN invalid_parameter_value THEN
			RAISE EXCEPTION 'invalid webhook signing key in %', what
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'A whsk_ key is base64 of a 32-byte ed25519 seed (or of the seed and its public key).',
					  HINT = 'Generate one with: SELECT outbox.generate_secret(''ed25519'').';
		END;
		RETURN;
	END IF;
	BEGIN
		IF secret !~ '^whsec_[A-Za-z0-9+/]+={0,2}$' THEN
			RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value';
		END IF;
		key_bytes := decode(substr(secret, 7), 'base64');
	EXCEPTION WHEN others THEN
		RAISE EXCEPTION 'invalid webhook secret in %', what
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'Secrets follow the Standard Webhooks format: "whsec_" followed by base64, or "whsk_" for an ed25519 key.',
				  HINT = 'Generate one with: SELECT outbox.generate_secret().';
	END;
	IF length(key_bytes) < 16 OR length(key_bytes) > 64 THEN
		RAISE EXCEPTION 'webhook secret must decode to 16 to 64 bytes, not %', length(key_bytes)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Use 24 to 64 random bytes, as the Standard Webhooks spec recommends: SELECT outbox.generate_secret().';
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.check_secret(text, text) FROM PUBLIC;

-- Refuse a file the relay will read (a TLS file, NATS credentials) that
-- the server's operating system user cannot read now: an absolute path to
-- a non-empty regular file.  check_tls_files checks first that the role
-- may name server files.
CREATE FUNCTION outbox.check_server_file(path text, what text)
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_check_server_file'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION outbox.check_server_file(text, text) FROM PUBLIC;

-- TLS files go with a URL that asks for TLS: https:// for HTTP and AWS targets,
-- rediss:// for Redis targets, amqps:// for RabbitMQ targets, tls:// for
-- NATS targets.  Only superusers and members of pg_read_server_files name
-- them, or a NATS target's credentials: the relay reads them as the
-- server.
CREATE FUNCTION outbox.check_tls_files(t outbox.targets)
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
REVOKE ALL ON FUNCTION outbox.check_tls_files(outbox.targets) FROM PUBLIC;

-- A subscription or topic grant pattern: a topic, a prefix followed by
-- "*", or "*", with the characters of topics.
CREATE FUNCTION outbox.check_topic_pattern(pattern text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF pattern IS NULL OR pattern = '' OR octet_length(pattern) > 255 THEN
		RAISE EXCEPTION 'invalid topic pattern %', quote_nullable(pattern)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A pattern is a topic, a prefix followed by "*" (such as ''orders.*''), or ''*''.',
				  HINT = 'Topics have 1 to 255 bytes and no white space.';
	END IF;
	PERFORM outbox.check_text(pattern, 'pattern');
END
$$;
REVOKE ALL ON FUNCTION outbox.check_topic_pattern(text) FROM PUBLIC;

-- Checks of the options every target has.
CREATE FUNCTION outbox.check_target_options(t outbox.targets)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF t.max_attempts IS NULL OR t.max_attempts < 0 OR t.max_attempts > 1000000 THEN
		RAISE EXCEPTION 'max_attempts must be between 0 (retry forever) and 1000000, not %', t.max_attempts
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF t.disable_after IS NOT NULL AND (t.disable_after <= interval '0' OR t.disable_after > interval '100 years') THEN
		RAISE EXCEPTION 'disable_after must be a positive interval of at most 100 years, not %', t.disable_after
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass interval ''0'' to alter_target to never disable the target.';
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.check_target_options(outbox.targets) FROM PUBLIC;

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

-- The checks of an HTTP target's options, shared by create_http_target and
-- alter_target.
CREATE FUNCTION outbox.check_http_target(t outbox.targets)
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
REVOKE ALL ON FUNCTION outbox.check_http_target(outbox.targets) FROM PUBLIC;

-- The checks of a NATS target's url and subject template (in C, as the
-- relay makes them of every row it reads).
CREATE FUNCTION outbox.check_nats_target(url text, subject text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_nats_target';
REVOKE ALL ON FUNCTION outbox.check_nats_target(text, text) FROM PUBLIC;

-- The checks of a Kafka target's bootstrap list, topic template and
-- properties (in C, as the relay makes them of every row it reads).
CREATE FUNCTION outbox.check_kafka_target(brokers text, topic text, properties jsonb)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_kafka_target';
REVOKE ALL ON FUNCTION outbox.check_kafka_target(text, text, jsonb) FROM PUBLIC;

-- Whether a file is a NATS .creds file or a user's NKey seed (in C: the
-- relay reads it so).
CREATE FUNCTION outbox.check_nats_credentials(path text)
RETURNS void
LANGUAGE C STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_nats_credentials';
REVOKE ALL ON FUNCTION outbox.check_nats_credentials(text) FROM PUBLIC;

-- The checks of a Redis target's url and stream template (in C, as the
-- relay makes them of every row it reads).
CREATE FUNCTION outbox.check_redis_target(url text, stream text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_redis_target';
REVOKE ALL ON FUNCTION outbox.check_redis_target(text, text) FROM PUBLIC;

-- The checks of a RabbitMQ target's url, exchange and routing key
-- template (in C, as the relay makes them of every row it reads).
CREATE FUNCTION outbox.check_rabbitmq_target(url text, exchange text, routing_key text)
RETURNS void
LANGUAGE C IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_rabbitmq_target';
REVOKE ALL ON FUNCTION outbox.check_rabbitmq_target(text, text, text) FROM PUBLIC;

-- The checks of a broker target's options (NATS, Kafka, Redis or
-- RabbitMQ), shared by the create functions and alter_target.
CREATE FUNCTION outbox.check_broker_options(t outbox.targets)
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
REVOKE ALL ON FUNCTION outbox.check_broker_options(outbox.targets) FROM PUBLIC;

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

-- The format options of a target: which kinds take which format, and a
-- source the CloudEvents attribute can carry.  CloudEvents go to HTTP, NATS,
-- Kafka and RabbitMQ targets, and, in structured mode (the event in one
-- field or body), to Redis and AWS targets.
CREATE FUNCTION outbox.check_format(t outbox.targets)
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
REVOKE ALL ON FUNCTION outbox.check_format(outbox.targets) FROM PUBLIC;

---------------------------------------------------------------------------
-- Creating targets and subscribing them.
-- One create function per kind of target; all of them insert through
-- outbox.add_target().
---------------------------------------------------------------------------

-- Store a validated target (every kind's columns) and its progress rows,
-- which start at the frontier; wake the relay at commit.  Only a duplicate
-- name is "already exists"; any other unique violation (a restored target
-- id, say) is reported as it is.
CREATE FUNCTION outbox.add_target(target outbox.targets)
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
REVOKE ALL ON FUNCTION outbox.add_target(outbox.targets) FROM PUBLIC;

-- A target that receives messages as HTTP POST requests (webhooks),
-- signed when it has a secret; the TLS files (ca_file, client_cert,
-- client_key) are for https:// URLs; format 'cloudevents' sends CloudEvents
-- (binary content mode, a batch as a CloudEvents batch),
-- 'cloudevents-structured' structured content mode; source is their
-- source attribute.
CREATE FUNCTION outbox.create_http_target(
	name		 text,
	url			 text,
	headers		 jsonb	DEFAULT '{}',
	secret		 text	DEFAULT NULL,
	batch_size	 int	DEFAULT 1,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 10000,
	ca_file		 text	DEFAULT NULL,
	client_cert	 text	DEFAULT NULL,
	client_key	 text	DEFAULT NULL,
	format		 text	DEFAULT 'outbox',
	source		 text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
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
	t.ca_file := ca_file;
	t.client_cert := client_cert;
	t.client_key := client_key;
	t.format := format;
	t.ce_source := source;
	PERFORM outbox.check_http_target(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_http_target(text, text, jsonb, text, int, int, text, int, int, text, text, text, text, text) IS
	'create a target that receives messages as HTTP POST requests (webhooks)';
REVOKE ALL ON FUNCTION outbox.create_http_target(text, text, jsonb, text, int, int, text, int, int, text, text, text, text, text) FROM PUBLIC;

-- A target that receives messages as NOTIFY on a channel.  It may send the
-- envelope only (no payload, no headers): every role that can connect may
-- LISTEN on any channel.
CREATE FUNCTION outbox.create_notify_target(name text, channel text,
											envelope_only boolean DEFAULT false)
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
	PERFORM outbox.check_text(channel, 'channel', 'NOTIFY channel name');
	t.name := name;
	t.kind := 'notify';
	t.channel := channel;
	t.lanes := 1;
	t.ordering := 'strict';
	t.envelope_only := coalesce(envelope_only, false);
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_notify_target(text, text, boolean) IS
	'create a target that receives messages as NOTIFY on a channel';
REVOKE ALL ON FUNCTION outbox.create_notify_target(text, text, boolean) FROM PUBLIC;

-- A target that publishes messages into NATS JetStream streams.
CREATE FUNCTION outbox.create_nats_target(
	name		 text,
	url			 text,
	subject		 text	DEFAULT '{topic}',
	batch_size	 int	DEFAULT 100,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 10000,
	format		 text	DEFAULT 'outbox',
	source		 text	DEFAULT NULL,
	ca_file		 text	DEFAULT NULL,
	client_cert	 text	DEFAULT NULL,
	client_key	 text	DEFAULT NULL,
	credentials	 text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'nats';
	t.ca_file := ca_file;
	t.client_cert := client_cert;
	t.client_key := client_key;
	t.credentials := credentials;
	t.url := url;
	t.subject := subject;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	PERFORM outbox.check_broker_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
	UPDATE outbox.targets x SET subject = t.subject WHERE x.name = t.name;
END
$$;
COMMENT ON FUNCTION outbox.create_nats_target(text, text, text, int, int, text, int, int, text, text, text, text, text, text) IS
	'create a target that publishes messages into NATS JetStream, each acknowledged by its stream';
REVOKE ALL ON FUNCTION outbox.create_nats_target(text, text, text, int, int, text, int, int, text, text, text, text, text, text) FROM PUBLIC;

-- A target that produces messages into Kafka topics, with an idempotent
-- producer.
CREATE FUNCTION outbox.create_kafka_target(
	name		 text,
	brokers		 text,
	topic		 text	DEFAULT '{topic}',
	properties	 jsonb	DEFAULT '{}',
	batch_size	 int	DEFAULT 100,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 30000,
	format		 text	DEFAULT 'outbox',
	source		 text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'kafka';
	t.url := brokers;
	t.topic := topic;
	t.properties := coalesce(properties, '{}');
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	PERFORM outbox.check_broker_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_kafka_target(text, text, text, jsonb, int, int, text, int, int, text, text) IS
	'create a target that produces messages into Kafka topics, with an idempotent producer';
REVOKE ALL ON FUNCTION outbox.create_kafka_target(text, text, text, jsonb, int, int, text, int, int, text, text) FROM PUBLIC;

-- A target that appends messages to Redis streams, each once within the
-- de-duplication window.
CREATE FUNCTION outbox.create_redis_target(
	name		 text,
	url			 text,
	stream		 text	DEFAULT '{topic}',
	maxlen		 bigint	DEFAULT NULL,
	dedup_window int	DEFAULT 600,
	batch_size	 int	DEFAULT 100,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 10000,
	format		 text	DEFAULT 'outbox',
	source		 text	DEFAULT NULL,
	ca_file		 text	DEFAULT NULL,
	client_cert	 text	DEFAULT NULL,
	client_key	 text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'redis';
	t.ca_file := ca_file;
	t.client_cert := client_cert;
	t.client_key := client_key;
	t.url := url;
	t.stream := stream;
	t.maxlen := maxlen;
	t.dedup_window := dedup_window;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	PERFORM outbox.check_broker_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_redis_target(text, text, text, bigint, int, int, int, text, int, int, text, text, text, text, text) IS
	'create a target that appends messages to Redis streams, each once within a de-duplication window';
REVOKE ALL ON FUNCTION outbox.create_redis_target(text, text, text, bigint, int, int, int, text, int, int, text, text, text, text, text) FROM PUBLIC;

-- A target that publishes messages to a RabbitMQ exchange, each
-- confirmed by the broker.
CREATE FUNCTION outbox.create_rabbitmq_target(
	name		 text,
	url			 text,
	exchange	 text	DEFAULT '',
	routing_key	 text	DEFAULT '{topic}',
	batch_size	 int	DEFAULT 100,
	lanes		 int	DEFAULT 8,
	ordering	 text	DEFAULT 'key',
	max_attempts int	DEFAULT 10,
	timeout_ms	 int	DEFAULT 10000,
	format		 text	DEFAULT 'outbox',
	source		 text	DEFAULT NULL,
	ca_file		 text	DEFAULT NULL,
	client_cert	 text	DEFAULT NULL,
	client_key	 text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'rabbitmq';
	t.ca_file := ca_file;
	t.client_cert := client_cert;
	t.client_key := client_key;
	t.url := url;
	t.exchange := exchange;
	t.routing_key := routing_key;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	t.format := format;
	t.ce_source := source;
	PERFORM outbox.check_broker_options(t);
	PERFORM outbox.check_format(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_rabbitmq_target(text, text, text, text, int, int, text, int, int, text, text, text, text, text) IS
	'create a target that publishes messages to a RabbitMQ exchange, each confirmed by the broker';
REVOKE ALL ON FUNCTION outbox.create_rabbitmq_target(text, text, text, text, int, int, text, int, int, text, text, text, text, text) FROM PUBLIC;

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

-- The id of a target, or undefined_object.
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
REVOKE ALL ON FUNCTION outbox.target_id(text) FROM PUBLIC;

-- Deliver the topics of a pattern to a target (or queue): an exact topic,
-- a prefix ending in '*', or '*'.  With a filter (a jsonpath over the
-- document {"topic", "key", "headers", "payload"}), only the messages it
-- selects: a predicate ('$.payload.total > 100') when true, another path
-- when it yields an item.  Subscribing again to the same pattern sets the
-- filter (NULL removes it) for the messages read after this commits.
CREATE FUNCTION outbox.subscribe(target text, topic text, filter text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
	path jsonpath;
	inserted boolean;
BEGIN
	PERFORM outbox.check_topic_pattern(topic);
	IF filter IS NOT NULL THEN
		BEGIN
			path := filter::jsonpath;
		EXCEPTION WHEN syntax_error OR invalid_text_representation OR invalid_regular_expression
					   OR invalid_parameter_value THEN
			RAISE EXCEPTION 'invalid filter for target "%"', target
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = SQLERRM,
					  HINT = 'A filter is a jsonpath over {"topic", "key", "headers", "payload"}, for example ''$.payload.total > 100'' or ''$.headers."x-tenant" == "acme"''.';
		END;
		-- A variable would need a value the relay does not have.
		IF pg_catalog.regexp_replace(path::text, '"(\\.|[^"\\])*"', 'S', 'g') ~ '\$S' THEN
			RAISE EXCEPTION 'invalid filter for target "%"', target
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'The filter uses a variable ($name); filters have none.',
					  HINT = 'Write the value into the path, for example ''$.payload.total > 100''.';
		END IF;
	END IF;
	-- One statement, so that concurrent subscribes neither fail nor lose a filter.
	INSERT INTO outbox.subscriptions AS s (target_id, pattern, start_id, filter)
	VALUES (tid, topic, outbox.frontier(), path)
	ON CONFLICT (target_id, pattern) DO UPDATE SET filter = EXCLUDED.filter
	 WHERE s.filter::text IS DISTINCT FROM EXCLUDED.filter::text
	RETURNING s.xmax = 0 INTO inserted;
	IF NOT FOUND THEN
		RAISE NOTICE 'target "%" is already subscribed to "%"', target, topic;
	ELSIF NOT inserted THEN
		RAISE NOTICE 'target "%" is already subscribed to "%": its filter is now %', target, topic,
			coalesce(quote_literal(path::text), 'none');
	END IF;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.subscribe(text, text, text) IS
	'deliver the topics of a pattern to a target, optionally only the messages a jsonpath filter selects';
REVOKE ALL ON FUNCTION outbox.subscribe(text, text, text) FROM PUBLIC;

-- Stop delivering the topics of a pattern to a target.
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
COMMENT ON FUNCTION outbox.unsubscribe(text, text) IS
	'stop delivering a pattern''s topics to a target (a NOTICE if it was not subscribed)';
REVOKE ALL ON FUNCTION outbox.unsubscribe(text, text) FROM PUBLIC;

-- Drop a target with its subscriptions and progress, and a queue with its
-- grants and receipts.
CREATE FUNCTION outbox.drop_target(name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(drop_target.name);	-- raises if unknown
BEGIN
	DELETE FROM outbox.targets t WHERE t.id = tid;
	DELETE FROM outbox.receipts r WHERE r.target_id = tid;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.drop_target(text) IS
	'remove a target with its subscriptions, progress and a queue''s receipts; its dead letters stay';
REVOKE ALL ON FUNCTION outbox.drop_target(text) FROM PUBLIC;

---------------------------------------------------------------------------
-- Operating targets.
-- Pause and resume, dead letters, replay, changing options, rotating
-- signing keys.  Each raises undefined_object for an unknown target
-- (outbox.target_id).
---------------------------------------------------------------------------

-- Pause a target; returns the messages pending.
CREATE FUNCTION outbox.pause_target(name text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(pause_target.name);
	result bigint;
BEGIN
	UPDATE outbox.targets t
	   SET state = 'paused', state_reason = 'paused by ' || session_user, state_changed_at = now()
	 WHERE t.id = tid AND t.state <> 'paused';
	IF NOT FOUND THEN
		RAISE NOTICE 'target "%" is already paused', name;
	END IF;
	PERFORM outbox.config_changed();
	SELECT p.pending INTO result FROM outbox.target_pending(tid) p;
	RETURN result;
END
$$;
COMMENT ON FUNCTION outbox.pause_target(text) IS
	'stop delivering to a target; messages keep accumulating; returns the messages pending';
REVOKE ALL ON FUNCTION outbox.pause_target(text) FROM PUBLIC;

-- Deliver to a paused or disabled target again, from where it stopped;
-- returns the messages pending.
CREATE FUNCTION outbox.resume_target(name text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(resume_target.name);
	result bigint;
BEGIN
	UPDATE outbox.targets t
	   SET state = 'active', state_reason = NULL, state_changed_at = now()
	 WHERE t.id = tid AND t.state <> 'active';
	IF NOT FOUND THEN
		RAISE NOTICE 'target "%" is not paused or disabled', name;
	END IF;
	PERFORM outbox.config_changed();
	SELECT p.pending INTO result FROM outbox.target_pending(tid) p;
	RETURN result;
END
$$;
COMMENT ON FUNCTION outbox.resume_target(text) IS
	'deliver again to a paused or disabled target, from where it stopped; returns the messages pending';
REVOKE ALL ON FUNCTION outbox.resume_target(text) FROM PUBLIC;

-- The ids of one (id) or all of a target's dead letters; an id the target
-- has no dead letter with is an error.
CREATE FUNCTION outbox.dead_letter_ids(target text, id bigint)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.target_id(target);
	IF id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM outbox.dead_letters d
									   WHERE d.target = dead_letter_ids.target AND d.id = dead_letter_ids.id) THEN
		RAISE EXCEPTION 'target "%" has no dead letter with id %', target, id
			USING ERRCODE = 'no_data_found',
				  HINT = format('See SELECT id FROM outbox.dead_letters WHERE target = %L.', target);
	END IF;
	RETURN QUERY SELECT d.id FROM outbox.dead_letters d
				  WHERE d.target = dead_letter_ids.target
					AND (dead_letter_ids.id IS NULL OR d.id = dead_letter_ids.id);
END
$$;
REVOKE ALL ON FUNCTION outbox.dead_letter_ids(text, bigint) FROM PUBLIC;

-- Deliver dead letters again: the relay delivers each one whose
-- retry_requested_at is set, then removes it.  A queue's dead letters are
-- received again by replaying the queue.
CREATE FUNCTION outbox.retry_dead_letters(target text, id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ids bigint[];
	n bigint;
	lost bigint;
BEGIN
	IF EXISTS (SELECT 1 FROM outbox.targets t WHERE t.name = retry_dead_letters.target AND t.kind = 'queue') THEN
		RAISE EXCEPTION 'dead letters of queue "%" cannot be retried one by one', target
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'A queue hands out messages in id order from its window; a dead letter lies below it.',
				  HINT = 'Receive them again with outbox.replay(queue, id), or read them from outbox.dead_letters and discard them.';
	END IF;
	ids := ARRAY(SELECT outbox.dead_letter_ids(target, id));
	SELECT count(*) INTO lost
	  FROM outbox.dead_letters d
	 WHERE d.target = retry_dead_letters.target AND d.payload IS NULL AND d.id = ANY (ids);
	IF lost > 0 THEN
		RAISE EXCEPTION 'target "%" has dead letters that cannot be delivered again', target
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('%s of them were recorded before version 0.2, and their messages were removed since.', lost),
				  HINT = 'Discard them with outbox.discard_dead_letters().';
	END IF;
	UPDATE outbox.dead_letters d SET retry_requested_at = now()
	 WHERE d.target = retry_dead_letters.target AND d.id = ANY (ids);
	GET DIAGNOSTICS n = ROW_COUNT;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;
COMMENT ON FUNCTION outbox.retry_dead_letters(text, bigint) IS
	'deliver one (id) or all of a target''s dead letters again, in id order; returns how many';
REVOKE ALL ON FUNCTION outbox.retry_dead_letters(text, bigint) FROM PUBLIC;

-- Remove dead letters without delivering them.
CREATE FUNCTION outbox.discard_dead_letters(target text, id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ids bigint[] := ARRAY(SELECT outbox.dead_letter_ids(target, id));
	n bigint;
BEGIN
	DELETE FROM outbox.dead_letters d
	 WHERE d.target = discard_dead_letters.target AND d.id = ANY (ids);
	GET DIAGNOSTICS n = ROW_COUNT;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;
COMMENT ON FUNCTION outbox.discard_dead_letters(text, bigint) IS
	'remove one (id) or all of a target''s dead letters; returns how many';
REVOKE ALL ON FUNCTION outbox.discard_dead_letters(text, bigint) FROM PUBLIC;

-- Set a failing message aside as a dead letter: the one the relay retries
-- at the head of one of the target's lanes (id picks one when several
-- lanes fail), with the reason given.  Returns its id.  The relay acts at
-- its next turn, if the message is still failing then; the rest of its key
-- and lane go on.  Any kind of target but a queue.
CREATE FUNCTION outbox.set_aside(target text, reason text DEFAULT NULL, id bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(set_aside.target);
	k text;
	failing bigint[];
	chosen bigint;
BEGIN
	IF length(reason) > 1000 THEN
		RAISE EXCEPTION 'reason is too long (% characters)', length(reason)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A reason is kept with the dead letter: at most 1000 characters.';
	END IF;
	IF reason ~ '[[:cntrl:]]' THEN
		RAISE EXCEPTION 'reason contains a control character'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'A reason is kept with the dead letter and written to the server log.',
				  HINT = 'Give the reason as one line of printable text.';
	END IF;
	-- (no lock: the UPDATE below checks the row again, and a lock here
	-- would take the relay's tables in the other order from its writes)
	SELECT t.kind INTO k FROM outbox.targets t WHERE t.id = tid;
	IF k = 'queue' THEN
		RAISE EXCEPTION 'target "%" is a queue', set_aside.target
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'No relay delivers a queue''s messages: its receivers take them.',
				  HINT = 'A receiver gives a message up with outbox.nack(); see outbox.queue_dead_letters.';
	END IF;
	SELECT array_agg(p.failing_id ORDER BY p.failing_id) INTO failing
	  FROM outbox.progress p WHERE p.target_id = tid AND p.failing_id IS NOT NULL;
	IF set_aside.id IS NOT NULL THEN
		IF NOT set_aside.id = ANY (coalesce(failing, '{}')) THEN
			RAISE EXCEPTION 'message % is not failing on target "%"', set_aside.id, set_aside.target
				USING ERRCODE = 'no_data_found',
					  DETAIL = CASE WHEN failing IS NULL THEN 'No message of the target is failing.'
									ELSE format('Failing: %s.', array_to_string(failing, ', ')) END,
					  HINT = 'Only a message the relay retries at the head of a lane can be set aside (outbox.progress.failing_id).';
		END IF;
		chosen := set_aside.id;
	ELSIF failing IS NULL THEN
		RAISE EXCEPTION 'no message of target "%" is failing', set_aside.target
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'outbox.status shows each target''s last error; a message is set aside while the relay retries it.';
	ELSIF cardinality(failing) > 1 THEN
		RAISE EXCEPTION 'target "%" has % failing messages', set_aside.target, cardinality(failing)
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Failing: %s.', array_to_string(failing, ', ')),
				  HINT = 'Pass id => one of them.';
	ELSE
		chosen := failing[1];
	END IF;
	UPDATE outbox.progress p
	   SET set_aside_id = chosen,
		   set_aside_reason = 'set aside by ' || session_user || coalesce(': ' || reason, '')
	 WHERE p.target_id = tid AND p.failing_id = chosen;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'message % is not failing on target "%" any more', chosen, set_aside.target
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'The relay delivered it, or set it aside, meanwhile.';
	END IF;
	PERFORM outbox.config_changed();
	RETURN chosen;
END
$$;
COMMENT ON FUNCTION outbox.set_aside(text, text, bigint) IS
	'set a failing message of a target aside as a dead letter; returns its id';
REVOKE ALL ON FUNCTION outbox.set_aside(text, text, bigint) FROM PUBLIC;

-- Deliver the retained messages from from_id on to one target again (same
-- ids, same webhook-id); lanes already behind from_id stay where they are.
-- The lock keeps retention from removing what is replayed until this
-- commits; the relay then reloads the target's progress.  Replaying a
-- queue forgets what it acknowledged from from_id on; the receivers
-- rebuild its window when this commits.
CREATE FUNCTION outbox.replay(target text, from_id bigint)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
	removed bigint;
	upto bigint;
	nlanes int;
	n bigint;
	is_queue boolean;
BEGIN
	IF from_id IS NULL OR from_id < 1 THEN
		RAISE EXCEPTION 'replay needs a message id of 1 or more, not %', quote_nullable(from_id)
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	LOCK TABLE outbox.messages IN ROW SHARE MODE;
	SELECT max(s.id_high_water) INTO removed FROM outbox.state s;
	PERFORM 1 FROM outbox.state FOR SHARE;
	IF from_id <= removed THEN
		RAISE EXCEPTION 'messages from id % are no longer retained', from_id
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Retention removed the messages up to id %s (outbox.retention = %s).',
								  removed, current_setting('outbox.retention', true)),
				  HINT = format('Replay from id %s or later, or keep messages longer with outbox.retention.',
								removed + 1);
	END IF;
	SELECT t.kind = 'queue' INTO is_queue FROM outbox.targets t WHERE t.id = tid;
	-- What each lane finished from from_id on (lanes as outbox.lane_of()).
	SELECT max(p.done_id), count(*) INTO upto, nlanes FROM outbox.progress p WHERE p.target_id = tid;
	IF is_queue THEN
		upto := greatest(upto, (SELECT max(r.last_id) FROM outbox.receipts r WHERE r.target_id = tid),
						 (SELECT q.acknowledged_up_to_id FROM outbox.queue_stats() q WHERE q.target_id = tid));
	END IF;
	SELECT count(*) INTO n
	  FROM outbox.messages m
	  JOIN outbox.progress p ON p.target_id = tid AND p.lane = outbox.lane_of(m.key, m.id, nlanes)
	 WHERE m.id >= from_id AND m.id <= upto AND (is_queue OR m.id <= p.done_id)
	   AND EXISTS (SELECT 1 FROM outbox.subscriptions s
				    WHERE s.target_id = tid AND m.id > s.start_id
					  AND outbox.topic_matches(s.pattern, m.topic));
	IF is_queue THEN
		DELETE FROM outbox.receipts r WHERE r.target_id = tid AND r.last_id >= from_id
		   AND NOT EXISTS (SELECT 1 FROM unnest(r.ids) u(i) WHERE u.i < from_id);
		UPDATE outbox.receipts r
		   SET ids = ARRAY(SELECT u.i FROM unnest(r.ids) u(i) WHERE u.i < from_id ORDER BY u.i),
			   last_id = (SELECT max(u.i) FROM unnest(r.ids) u(i) WHERE u.i < from_id)
		 WHERE r.target_id = tid AND r.last_id >= from_id;
	END IF;
	UPDATE outbox.progress p
	   SET done_id = least(p.done_id, from_id - 1), batch_end = NULL, generation = p.generation + 1
	 WHERE p.target_id = tid;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;
-- Replay from the first retained message emitted at or after a time.
CREATE FUNCTION outbox.replay(target text, since timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	removed_until timestamptz;
	first_id bigint;
BEGIN
	PERFORM outbox.target_id(target);
	IF since IS NULL THEN
		RAISE EXCEPTION 'replay needs a time to start from'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	LOCK TABLE outbox.messages IN ROW SHARE MODE;
	SELECT max(s.removed_before) INTO removed_until FROM outbox.state s;
	IF since < removed_until THEN
		RAISE EXCEPTION 'messages emitted since % are no longer all retained', since
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = format('Retention removed messages emitted before %s (outbox.retention = %s).',
								  removed_until, current_setting('outbox.retention', true)),
				  HINT = format('Replay since %s or later, or keep messages longer with outbox.retention.',
								removed_until);
	END IF;
	-- Emit times are not indexed: this reads the retained messages.
	SELECT min(m.id) INTO first_id FROM outbox.messages m WHERE m.emitted_at >= since;
	IF first_id IS NULL THEN
		RAISE NOTICE 'no message was emitted since %', since;
		RETURN 0;
	END IF;
	RETURN outbox.replay(target, first_id);
END
$$;
COMMENT ON FUNCTION outbox.replay(text, bigint) IS
	'deliver a target''s retained messages again from an id; returns how many it had finished';
COMMENT ON FUNCTION outbox.replay(text, timestamptz) IS
	'deliver a target''s retained messages again from those emitted at or after a time';
REVOKE ALL ON FUNCTION outbox.replay(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.replay(text, timestamptz) FROM PUBLIC;

-- Change a target's options; NULL leaves an option as it is.  secret => ''
-- removes the secret, max_rate => 0 removes the rate limit, disable_after
-- => interval '0' never disables, source => '' removes the CloudEvents
-- source (the default is used).  Takes effect without a restart: the next
-- request uses the new URL, headers, secret, batch size, timeout and rate;
-- new lanes or ordering once the target's lanes are idle (the relay stops
-- reading for it, delivers what it holds, then redistributes keys).  A NATS
-- target takes url, subject, batch_size, lanes, ordering, max_attempts,
-- timeout_ms, max_rate and disable_after; a Kafka target the same with topic
-- and properties instead of subject (url is its brokers); a Redis target
-- url, stream, maxlen (maxlen => 0 never trims), dedup_window and the
-- common ones; a RabbitMQ target the same with exchange and routing_key
-- instead of stream, maxlen and dedup_window; an SQS target url (its
-- queue, in the same region), batch_size (at most 10), lanes, ordering,
-- max_attempts, timeout_ms, max_rate, disable_after, format, source and
-- ca_file (its credentials: outbox.set_aws_credentials); a Kinesis target
-- the same with its endpoint as url, stream, and batch_size up to 500.  unroutable_after (NATS,
-- Kafka and RabbitMQ targets): how long a message whose filled-in
-- destination the broker does not take is retried, interval '0' for ever.
-- Returns the number of options changed.
CREATE FUNCTION outbox.alter_target(
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
COMMENT ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb, text, text, text, bigint, int, text, text, interval, text) IS
	'change a target''s options without a restart; returns how many changed';
REVOKE ALL ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb, text, text, text, bigint, int, text, text, interval, text) FROM PUBLIC;

-- Rotate a target's signing key: the current one becomes the previous one,
-- and requests carry both signatures (space-separated, as Standard Webhooks
-- allows) until outbox.finish_secret_rotation().
CREATE FUNCTION outbox.rotate_secret(target text, new_secret text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
	old outbox.targets;
BEGIN
	SELECT * INTO old FROM outbox.targets WHERE id = tid FOR UPDATE;
	IF old.kind <> 'http' THEN
		RAISE EXCEPTION 'target "%" is a % target', target, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets sign requests.';
	END IF;
	IF new_secret IS NULL THEN
		RAISE EXCEPTION 'new_secret must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Generate one with SELECT outbox.generate_secret().';
	END IF;
	PERFORM outbox.check_secret(new_secret, 'new_secret');
	IF new_secret = old.secret THEN
		RAISE EXCEPTION 'the new secret of target "%" is its current one', target
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	UPDATE outbox.targets SET previous_secret = secret, secret = new_secret WHERE id = tid;
	PERFORM outbox.config_changed();
END
$$;
COMMENT ON FUNCTION outbox.rotate_secret(text, text) IS
	'give a target a new signing key; requests carry the old and the new signature until finish_secret_rotation';
REVOKE ALL ON FUNCTION outbox.rotate_secret(text, text) FROM PUBLIC;

-- Stop signing a target's requests with its previous key; false when it
-- had none.
CREATE FUNCTION outbox.finish_secret_rotation(target text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(target);
BEGIN
	UPDATE outbox.targets SET previous_secret = NULL WHERE id = tid AND previous_secret IS NOT NULL;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox.config_changed();
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.finish_secret_rotation(text) IS
	'stop signing a target''s requests with its previous key';
REVOKE ALL ON FUNCTION outbox.finish_secret_rotation(text) FROM PUBLIC;

---------------------------------------------------------------------------
-- Per-topic emit rights.
-- With outbox.check_topic_grants on, a role that is not a superuser emits
-- only topics it was granted (src/topic_grants.c).
---------------------------------------------------------------------------

-- The grants (superusers are not checked).
CREATE TABLE outbox.topic_grants (
	role		regrole	NOT NULL,
	pattern		text	NOT NULL,
	granted_at	timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (role, pattern)
);
COMMENT ON TABLE outbox.topic_grants IS 'topics (exact, prefix* or *) each role may emit to when outbox.check_topic_grants is on';
REVOKE ALL ON TABLE outbox.topic_grants FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.topic_grants', '');

-- Every session reads the topic grants again once this transaction
-- commits (a relcache invalidation of outbox.topic_grants).
CREATE FUNCTION outbox.topic_grants_changed()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_topic_grants_changed'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION outbox.topic_grants_changed() FROM PUBLIC;

-- Rows changed by hand (or restored) take effect like grant_topic's.
CREATE FUNCTION outbox.topic_grants_trigger()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.topic_grants_changed();
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.topic_grants_trigger() FROM PUBLIC;
CREATE TRIGGER topic_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON outbox.topic_grants
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.topic_grants_trigger();

-- Let a role emit to a pattern's topics; returns whether the grants
-- changed.
CREATE FUNCTION outbox.grant_topic(role regrole, pattern text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	PERFORM outbox.check_topic_pattern(pattern);
	INSERT INTO outbox.topic_grants (role, pattern) VALUES (grant_topic.role, grant_topic.pattern)
	ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox.topic_grants_changed();
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.grant_topic(regrole, text) IS
	'let a role emit to the topics a pattern matches (when outbox.check_topic_grants is on)';
REVOKE ALL ON FUNCTION outbox.grant_topic(regrole, text) FROM PUBLIC;

-- Take back outbox.grant_topic(); returns whether the grants changed.
CREATE FUNCTION outbox.revoke_topic(role regrole, pattern text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	DELETE FROM outbox.topic_grants g WHERE g.role = revoke_topic.role AND g.pattern = revoke_topic.pattern;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM outbox.topic_grants_changed();
	RETURN true;
END
$$;
COMMENT ON FUNCTION outbox.revoke_topic(regrole, text) IS 'take back a grant of outbox.grant_topic';
REVOKE ALL ON FUNCTION outbox.revoke_topic(regrole, text) FROM PUBLIC;

---------------------------------------------------------------------------
-- Queues.
-- Targets of kind 'queue' are received from inside the consumer's own
-- transaction (outbox.receive(), src/queue_*.c).
---------------------------------------------------------------------------

-- One row per receiving transaction that committed: the queue messages it
-- acknowledged.  Written by outbox.receive() in the receiver's transaction,
-- so it is durable exactly when that transaction commits; the relay folds
-- them into outbox.progress.done_id and deletes them.  No index: it holds
-- only what lies between done_id and the newest acknowledged message.
-- Rows come and go all the time: vacuum it by the number of dead rows.
CREATE TABLE outbox.receipts (
	target_id	int			NOT NULL,
	last_id		bigint		NOT NULL,
	ids			bigint[]	NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);
COMMENT ON TABLE outbox.receipts IS 'queue messages acknowledged above outbox.progress.done_id';
REVOKE ALL ON TABLE outbox.receipts FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.receipts', '');

-- Who may receive from a queue besides superusers and the extension's owner.
CREATE TABLE outbox.queue_grants (
	target_id	int			NOT NULL REFERENCES outbox.targets (id) ON DELETE CASCADE,
	role		regrole		NOT NULL,	-- dumped by name, restored to the role of that name
	granted_at	timestamptz	NOT NULL DEFAULT now(),
	PRIMARY KEY (target_id, role)
);
COMMENT ON TABLE outbox.queue_grants IS 'roles allowed to receive from each queue';
REVOKE ALL ON TABLE outbox.queue_grants FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.queue_grants', '');

-- A target that SQL clients receive from with outbox.receive(), in their
-- own transactions, instead of one the relay delivers to.
CREATE FUNCTION outbox.create_queue(name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	t outbox.targets;
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'queue';
	t.lanes := 1;
	t.ordering := 'key';
	t.max_attempts := 0;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_queue(text) IS
	'create a target that SQL clients receive from with outbox.receive()';
REVOKE ALL ON FUNCTION outbox.create_queue(text) FROM PUBLIC;

-- The id of a queue, or an error naming what is wrong.
CREATE FUNCTION outbox.queue_id(name text)
RETURNS int
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.target_id(name);	-- raises if unknown
	k text;
BEGIN
	SELECT t.kind INTO k FROM outbox.targets t WHERE t.id = tid;
	IF k <> 'queue' THEN
		RAISE EXCEPTION 'outbox target "%" is not a queue', name
			USING ERRCODE = 'wrong_object_type',
				  HINT = 'Create a queue with outbox.create_queue().';
	END IF;
	RETURN tid;
END
$$;
REVOKE ALL ON FUNCTION outbox.queue_id(text) FROM PUBLIC;

-- Take messages from a queue for this transaction: COMMIT acknowledges
-- them, a rollback gives them back in order.
CREATE FUNCTION outbox.receive(queue text, max_messages int DEFAULT 1, wait_ms int DEFAULT 0,
							   whole_transactions boolean DEFAULT false)
RETURNS TABLE (id bigint, msg_id uuid, topic text, key text, headers jsonb, payload jsonb,
			   emitted_at timestamptz, receive_count int)
AS 'MODULE_PATHNAME', 'outbox_receive'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION outbox.receive(text, int, int, boolean) IS
	'take messages from a queue for this transaction: COMMIT acknowledges them, a rollback returns them';
REVOKE ALL ON FUNCTION outbox.receive(text, int, int, boolean) FROM PUBLIC;

-- Allow a role to receive from a queue (and to call outbox.receive()).
CREATE FUNCTION outbox.grant_receive(queue text, role regrole)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.queue_id(queue);
	n int;
BEGIN
	IF role IS NULL THEN
		RAISE EXCEPTION 'role must not be null' USING ERRCODE = 'null_value_not_allowed';
	END IF;
	EXECUTE format('GRANT USAGE ON SCHEMA outbox TO %s', role);
	EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.receive(text, int, int, boolean) TO %s', role);
	INSERT INTO outbox.queue_grants (target_id, role) VALUES (tid, role)
	ON CONFLICT DO NOTHING;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n > 0;
END
$$;
COMMENT ON FUNCTION outbox.grant_receive(text, regrole) IS 'allow a role to receive from a queue';
REVOKE ALL ON FUNCTION outbox.grant_receive(text, regrole) FROM PUBLIC;

-- Take back outbox.grant_receive: the role may no longer receive from the
-- queue.  Returns whether it had a grant.
CREATE FUNCTION outbox.revoke_receive(queue text, role regrole)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	tid int := outbox.queue_id(queue);
	n int;
BEGIN
	DELETE FROM outbox.queue_grants g WHERE g.target_id = tid AND g.role = revoke_receive.role;
	GET DIAGNOSTICS n = ROW_COUNT;
	RETURN n > 0;
END
$$;
COMMENT ON FUNCTION outbox.revoke_receive(text, regrole) IS 'take back outbox.grant_receive';
REVOKE ALL ON FUNCTION outbox.revoke_receive(text, regrole) FROM PUBLIC;

-- Receivers keep the grants in memory; any change of the table (by the
-- functions above or by hand) makes them read the grants again once it
-- commits, through a relcache invalidation of outbox.queue_grants (which
-- does not wake the relay, so a restore does not either).
CREATE FUNCTION outbox.queue_grants_changed()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_queue_grants_changed'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION outbox.queue_grants_changed() FROM PUBLIC;

-- Its trigger: every change of outbox.queue_grants calls it.
CREATE FUNCTION outbox.queue_grants_trigger()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM outbox.queue_grants_changed();
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.queue_grants_trigger() FROM PUBLIC;
CREATE TRIGGER queue_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
	ON outbox.queue_grants FOR EACH STATEMENT EXECUTE FUNCTION outbox.queue_grants_trigger();

-- Per queue, from shared memory: its window, the messages held by
-- receiving transactions and by whom, and what happened to its messages
-- since the server started.
CREATE FUNCTION outbox.queue_stats(OUT target_id int, OUT window_messages int, OUT held int,
								   OUT receivers int, OUT poisoned int, OUT received bigint,
								   OUT acknowledged bigint, OUT rolled_back bigint,
								   OUT rolled_back_counted bigint, OUT dead_lettered bigint,
								   OUT acknowledged_up_to_id bigint, OUT read_up_to_id bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_queue_stats'
LANGUAGE C VOLATILE;
REVOKE ALL ON FUNCTION outbox.queue_stats() FROM PUBLIC;

---------------------------------------------------------------------------
-- Monitoring.
-- What the relays, targets and queues are doing, for people (views) and
-- for Prometheus (outbox.metrics()); the role outbox_monitor reads them.
---------------------------------------------------------------------------

-- Messages of a target committed but not yet delivered or dead-lettered,
-- and the emit time of the oldest.  Exact when at most 10000 ids separate
-- the target's slowest lane from the frontier; beyond that, estimated from
-- the first 5000 ids (is_estimate), so the view stays cheap with millions
-- of messages pending.  A queue's pending messages start above what is
-- acknowledged in shared memory, which the relay writes into done_id about
-- once a second.
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
	acked bigint;
	nlanes int;
	span bigint;
	sample bigint;
BEGIN
	SELECT min(p.done_id), count(*) INTO low, nlanes
	  FROM outbox.progress p WHERE p.target_id = target_pending.target_id;
	SELECT q.acknowledged_up_to_id INTO acked
	  FROM outbox.queue_stats() q WHERE q.target_id = target_pending.target_id;
	IF acked > low THEN
		low := acked;
	END IF;
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

-- Per target, from the relay's shared memory: its state, requests in
-- flight, counters and latencies since the last reset.
CREATE FUNCTION outbox.target_stats(
	OUT target_id int, OUT state text, OUT in_flight int, OUT failed_attempts int,
	OUT last_success_at timestamptz, OUT messages bigint, OUT requests bigint,
	OUT bytes bigint, OUT retries bigint, OUT dead_letters bigint,
	OUT p50_ms float8, OUT p90_ms float8, OUT p99_ms float8, OUT max_ms float8,
	OUT window_messages bigint, OUT latency_le_ms float8[], OUT latency_buckets bigint[],
	OUT latency_sum_ms float8, OUT latency_count bigint, OUT reset_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_target_stats'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION outbox.target_stats() FROM PUBLIC;

-- The relay's status, from shared memory: its state, where it reads, the
-- frontier and what holds it, the current chunk and what holds retention.
CREATE FUNCTION outbox.worker_status(
	OUT pid int, OUT state text, OUT started_at timestamptz, OUT last_wakeup timestamptz,
	OUT read_position bigint, OUT frontier bigint, OUT frontier_held_by_pid int,
	OUT frontier_held_at_id bigint, OUT current_chunk int, OUT retention_held_by text,
	OUT retention_checked_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_worker_status'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION outbox.worker_status() FROM PUBLIC;

-- Start the counters and latencies of outbox.target_stats() afresh.
CREATE FUNCTION outbox.reset_stats()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_reset_stats'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.reset_stats() IS 'start the counters and latencies of outbox.stats afresh';
REVOKE ALL ON FUNCTION outbox.reset_stats() FROM PUBLIC;

-- Per target, the messages its subscriptions' filters turned away (since
-- the relay started or outbox.reset_stats()).
CREATE FUNCTION outbox.target_filtered(OUT target_id int, OUT filtered bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_target_filtered'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION outbox.target_filtered() FROM PUBLIC;

-- One row per target: how far behind it is, what went wrong last, its
-- state, and for queues the messages held by open transactions and how
-- many sessions hold them (0 for other targets).
CREATE VIEW outbox.lag AS
SELECT t.name AS target,
	   t.kind,
	   pend.pending,
	   pend.is_estimate AS pending_is_estimate,
	   pend.oldest_pending,
	   now() - pend.oldest_pending AS lag,
	   prog.last_delivered_id,
	   greatest(prog.done_id, q.acknowledged_up_to_id) AS done_up_to_id,
	   prog.delivered + coalesce(q.acknowledged, 0) AS delivered,
	   (SELECT count(*) FROM outbox.dead_letters d WHERE d.target = t.name) AS dead_letters,
	   err.last_status,
	   err.last_error,
	   err.last_error_at,
	   CASE WHEN t.state <> 'active' THEN t.state
			WHEN st.state IS NOT NULL THEN st.state
			WHEN q.held > 0 THEN 'delivering'
			WHEN pend.pending > 0 THEN 'delivering'
			ELSE 'idle' END AS state,
	   coalesce(st.in_flight, q.held, 0) AS in_flight,
	   coalesce(st.failed_attempts, 0) AS failed_attempts,
	   st.last_success_at,
	   coalesce(q.held, 0) AS held,
	   coalesce(q.receivers, 0) AS receivers
  FROM outbox.targets t
 CROSS JOIN LATERAL (SELECT min(p.done_id) AS done_id, max(p.last_delivered_id) AS last_delivered_id,
						   sum(p.delivered)::bigint AS delivered
					  FROM outbox.progress p WHERE p.target_id = t.id) prog
 CROSS JOIN LATERAL outbox.target_pending(t.id) pend
  LEFT JOIN LATERAL (SELECT p.last_status, p.last_error, p.last_error_at
					   FROM outbox.progress p
					  WHERE p.target_id = t.id AND p.last_error IS NOT NULL
					  ORDER BY p.last_error_at DESC LIMIT 1) err ON true
  LEFT JOIN outbox.target_stats() st ON st.target_id = t.id
  LEFT JOIN outbox.queue_stats() q ON q.target_id = t.id;
COMMENT ON VIEW outbox.lag IS 'per target: pending messages, oldest pending, progress, dead letters, last error';
REVOKE ALL ON outbox.lag FROM PUBLIC;

-- Per target, since the last outbox.reset_stats() (or the relay's start):
-- what was delivered and how fast.  Latency runs from outbox_emit() to the
-- receiver's acknowledgement, over the last 30 to 60 seconds.  Read from
-- shared memory: no table is scanned.
CREATE VIEW outbox.stats AS
SELECT t.name AS target, s.state, s.messages, s.requests, s.bytes, s.retries, s.dead_letters,
	   s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.window_messages, s.in_flight, s.failed_attempts,
	   s.last_success_at, s.reset_at, coalesce(f.filtered, 0) AS filtered
  FROM outbox.target_stats() s
  JOIN outbox.targets t ON t.id = s.target_id
  LEFT JOIN outbox.target_filtered() f ON f.target_id = s.target_id;
COMMENT ON VIEW outbox.stats IS 'per target: messages, requests, bytes, retries, dead letters, latency percentiles';
REVOKE ALL ON outbox.stats FROM PUBLIC;

-- Failover-safe delivery: each slot of outbox.standby_slots, how it stands,
-- and how far its standby is behind the newest commit that emitted here.
CREATE FUNCTION outbox.standby_status(OUT slot_name text, OUT state text,
									  OUT flushed_lsn pg_lsn, OUT behind_bytes bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_standby_status'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
COMMENT ON FUNCTION outbox.standby_status() IS
	'each slot of outbox.standby_slots: state, flushed position, bytes behind the newest commit';
REVOKE ALL ON FUNCTION outbox.standby_status() FROM PUBLIC;

-- The relay of this database: what it does, where it reads, and what holds
-- delivery or retention back.
CREATE VIEW outbox.worker AS
SELECT w.pid, w.state, w.started_at, w.last_wakeup, w.read_position, w.frontier,
	   w.frontier_held_by_pid,
	   (SELECT a.xact_start FROM pg_catalog.pg_stat_activity a WHERE a.pid = w.frontier_held_by_pid)
		 AS frontier_held_since,
	   w.current_chunk, w.retention_held_by, w.retention_checked_at,
	   x.pid AS oldest_xmin_pid, x.xact_start AS oldest_xmin_since,
	   sb.standby_held_by, sb.standby_behind_bytes
  FROM outbox.worker_status() w
  LEFT JOIN LATERAL (SELECT a.pid, a.xact_start FROM pg_catalog.pg_stat_activity a
					  WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_catalog.pg_backend_pid()
					  ORDER BY pg_catalog.age(a.backend_xmin) DESC LIMIT 1) x ON true
 CROSS JOIN LATERAL (SELECT (SELECT s.slot_name || ' (' || s.state || ')'
							   FROM outbox.standby_status() s
							  WHERE s.state <> 'streaming' OR s.behind_bytes > 0
							  ORDER BY s.state = 'streaming', s.state = 'no standby connected',
									   s.behind_bytes DESC NULLS FIRST
							  LIMIT 1) AS standby_held_by,
							(SELECT max(s.behind_bytes) FROM outbox.standby_status() s)
							  AS standby_behind_bytes) sb;
COMMENT ON VIEW outbox.worker IS 'the relay: state, read position, frontier, and what holds them or retention back';
REVOKE ALL ON outbox.worker FROM PUBLIC;

-- One row per queue: pending, held by open transactions, who holds them,
-- and what happened to the messages since the server started.
CREATE VIEW outbox.queues AS
SELECT t.name AS queue,
	   t.state,
	   pend.pending,
	   pend.is_estimate AS pending_is_estimate,
	   pend.oldest_pending,
	   coalesce(q.held, 0) AS held,
	   coalesce(q.receivers, 0) AS receivers,
	   coalesce(q.poisoned, 0) AS poisoned,
	   coalesce(q.received, 0) AS received,
	   coalesce(q.acknowledged, 0) AS acknowledged,
	   coalesce(q.rolled_back, 0) AS rolled_back,
	   coalesce(q.rolled_back_counted, 0) AS rolled_back_counted,
	   (SELECT count(*) FROM outbox.dead_letters d WHERE d.target = t.name) AS dead_letters,
	   coalesce(q.window_messages, 0) AS window_messages,
	   greatest(p.done_id, q.acknowledged_up_to_id) AS done_up_to_id
  FROM outbox.targets t
  JOIN outbox.progress p ON p.target_id = t.id AND p.lane = 0
 CROSS JOIN LATERAL outbox.target_pending(t.id) pend
  LEFT JOIN outbox.queue_stats() q ON q.target_id = t.id
 WHERE t.kind = 'queue';
COMMENT ON VIEW outbox.queues IS 'per queue: pending, held by receiving transactions, received, rolled back';
REVOKE ALL ON outbox.queues FROM PUBLIC;

-- From shared memory: each database that has an outbox slot (see
-- outbox.max_databases), its relay and why none runs.
CREATE FUNCTION outbox.relay_status(OUT datid oid, OUT database text, OUT pid int,
								   OUT state text, OUT started_at timestamptz,
								   OUT last_error text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_relays'
LANGUAGE C VOLATILE;
COMMENT ON FUNCTION outbox.relay_status() IS
	'the relay of every database with the extension: pid, state, start, last error';
REVOKE ALL ON FUNCTION outbox.relay_status() FROM PUBLIC;

-- The relays of every database with the extension.
CREATE VIEW outbox.relays AS
SELECT datid, database, pid, state, started_at, last_error
  FROM outbox.relay_status()
 ORDER BY database;
COMMENT ON VIEW outbox.relays IS
	'the relay of every database with the extension (superusers: it names every database)';
REVOKE ALL ON outbox.relays FROM PUBLIC;

-- The figures above in the Prometheus text exposition format (version
-- 0.0.4), with a "target" label; scrape it with any SQL exporter (README).
-- Reads what outbox.lag, outbox.stats and outbox.worker read, as their
-- owner: a monitoring role needs EXECUTE on this function only, and sees
-- target names and figures, never URLs, headers, secrets or payloads.
CREATE FUNCTION outbox.metrics()
RETURNS text
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH l AS MATERIALIZED (SELECT * FROM outbox.lag),
	 s AS MATERIALIZED (SELECT t.name AS target, st.*
						  FROM outbox.target_stats() st JOIN outbox.targets t ON t.id = st.target_id),
	 w AS MATERIALIZED (SELECT * FROM outbox.worker_status()),
	 fam (ord, name, type, help) AS (VALUES
		(1, 'outbox_pending_messages', 'gauge', 'Messages committed and not yet delivered or dead-lettered.'),
		(2, 'outbox_oldest_pending_age_seconds', 'gauge', 'Age of the oldest pending message (0 when none).'),
		(3, 'outbox_dead_letters', 'gauge', 'Dead letters kept in outbox.dead_letters.'),
		(4, 'outbox_target_state', 'gauge', '1 for the state the target is in.'),
		(5, 'outbox_in_flight_requests', 'gauge', 'Requests on the wire.'),
		(6, 'outbox_failed_attempts', 'gauge', 'Failed attempts of the messages now being retried.'),
		(7, 'outbox_last_success_timestamp_seconds', 'gauge', 'When the target last acknowledged a request.'),
		(8, 'outbox_delivered_messages_total', 'counter', 'Messages acknowledged by the target.'),
		(9, 'outbox_requests_total', 'counter', 'Requests sent to the target.'),
		(10, 'outbox_request_bytes_total', 'counter', 'Bytes of request bodies sent to the target.'),
		(11, 'outbox_retries_total', 'counter', 'Failed attempts that were tried again.'),
		(12, 'outbox_dead_lettered_messages_total', 'counter', 'Messages the relay gave up on.'),
		(13, 'outbox_delivery_latency_seconds', 'histogram', 'From outbox_emit() to acknowledgement, per message.'),
		(14, 'outbox_relay_up', 'gauge', '1 when the relay is running.'),
		(15, 'outbox_frontier_id', 'gauge', 'Highest message id below which no message can still appear.'),
		(16, 'outbox_relay_read_position_id', 'gauge', 'Every target has read up to this id.'),
		(17, 'outbox_standby_slot_up', 'gauge', '1 when the slot of outbox.standby_slots has its standby connected.'),
		(18, 'outbox_standby_behind_bytes', 'gauge', 'WAL from what the slot''s standby flushed to the newest commit that emitted messages.'),
		(19, 'outbox_filtered_messages_total', 'counter', 'Messages of subscribed topics the subscriptions'' filters turned away.')),
	 sb AS MATERIALIZED (SELECT * FROM outbox.standby_status()),
	 fl AS MATERIALIZED (SELECT t.name AS target, f.filtered
						   FROM outbox.target_filtered() f JOIN outbox.targets t ON t.id = f.target_id),
	 lab AS MATERIALIZED (SELECT target,
					'{target="' || replace(replace(replace(target, '\', '\\'), '"', '\"'), E'\n', '\n') || '"' AS open
			   FROM (SELECT target FROM l UNION SELECT target FROM s) x),
	 samples (ord, k1, k2, line) AS MATERIALIZED (
		SELECT 1, l.target, 0, 'outbox_pending_messages' || b.open || '} ' || l.pending FROM l JOIN lab b USING (target)
		UNION ALL
		SELECT 2, l.target, 0, 'outbox_oldest_pending_age_seconds' || b.open || '} '
			   || coalesce(extract(epoch FROM l.lag)::float8, 0) FROM l JOIN lab b USING (target)
		UNION ALL
		SELECT 3, l.target, 0, 'outbox_dead_letters' || b.open || '} ' || l.dead_letters FROM l JOIN lab b USING (target)
		UNION ALL
		SELECT 4, l.target, k.n, 'outbox_target_state' || b.open || ',state="' || k.state || '"} '
			   || (l.state = k.state)::int
		  FROM l JOIN lab b USING (target)
		 CROSS JOIN unnest(ARRAY['idle', 'delivering', 'retrying', 'failing', 'paused', 'disabled',
							   'waiting for standby'])
				   WITH ORDINALITY k (state, n)
		UNION ALL
		SELECT 5, l.target, 0, 'outbox_in_flight_requests' || b.open || '} ' || l.in_flight FROM l JOIN lab b USING (target)
		UNION ALL
		SELECT 6, l.target, 0, 'outbox_failed_attempts' || b.open || '} ' || l.failed_attempts FROM l JOIN lab b USING (target)
		UNION ALL
		SELECT 7, l.target, 0, 'outbox_last_success_timestamp_seconds' || b.open || '} '
			   || extract(epoch FROM l.last_success_at)::float8
		  FROM l JOIN lab b USING (target) WHERE l.last_success_at IS NOT NULL
		UNION ALL
		SELECT 8, s.target, 0, 'outbox_delivered_messages_total' || b.open || '} ' || s.messages FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 9, s.target, 0, 'outbox_requests_total' || b.open || '} ' || s.requests FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 10, s.target, 0, 'outbox_request_bytes_total' || b.open || '} ' || s.bytes FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 11, s.target, 0, 'outbox_retries_total' || b.open || '} ' || s.retries FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 12, s.target, 0, 'outbox_dead_lettered_messages_total' || b.open || '} ' || s.dead_letters
		  FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 13, s.target, h.n::int, 'outbox_delivery_latency_seconds_bucket' || b.open || ',le="'
			   || CASE WHEN h.le = 'Infinity' THEN '+Inf' ELSE (h.le / 1000)::text END || '"} '
			   || sum(h.c) OVER (PARTITION BY s.target ORDER BY h.n)
		  FROM s JOIN lab b USING (target)
		 CROSS JOIN unnest(s.latency_le_ms, s.latency_buckets) WITH ORDINALITY h (le, c, n)
		UNION ALL
		SELECT 13, s.target, 1000, 'outbox_delivery_latency_seconds_sum' || b.open || '} ' || s.latency_sum_ms / 1000
		  FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 13, s.target, 1001, 'outbox_delivery_latency_seconds_count' || b.open || '} ' || s.latency_count
		  FROM s JOIN lab b USING (target)
		UNION ALL
		SELECT 14, '', 0, 'outbox_relay_up ' || (w.pid IS NOT NULL)::int FROM w
		UNION ALL
		SELECT 15, '', 0, 'outbox_frontier_id ' || w.frontier FROM w WHERE w.frontier IS NOT NULL
		UNION ALL
		SELECT 16, '', 0, 'outbox_relay_read_position_id ' || w.read_position FROM w WHERE w.read_position IS NOT NULL
		UNION ALL
		SELECT 17, sb.slot_name, 0, 'outbox_standby_slot_up{slot="' || sb.slot_name || '"} '
			   || (sb.state = 'streaming')::int FROM sb
		UNION ALL
		SELECT 18, sb.slot_name, 0, 'outbox_standby_behind_bytes{slot="' || sb.slot_name || '"} '
			   || sb.behind_bytes FROM sb WHERE sb.behind_bytes IS NOT NULL
		UNION ALL
		SELECT 19, fl.target, 0, 'outbox_filtered_messages_total' || b.open || '} ' || fl.filtered
		  FROM fl JOIN lab b USING (target))
SELECT string_agg(block, '' ORDER BY ord)
  FROM (SELECT f.ord,
			   '# HELP ' || f.name || ' ' || f.help || E'\n# TYPE ' || f.name || ' ' || f.type || E'\n'
			   || coalesce(string_agg(x.line || E'\n', '' ORDER BY x.k1, x.k2), '') AS block
		  FROM fam f LEFT JOIN samples x ON x.ord = f.ord
		 GROUP BY f.ord, f.name, f.type, f.help) blocks
$$;
COMMENT ON FUNCTION outbox.metrics() IS 'outbox figures in the Prometheus text exposition format';
REVOKE ALL ON FUNCTION outbox.metrics() FROM PUBLIC;

-- A read-only monitoring role: figures and states, no URLs, headers,
-- secrets or payloads (roles are shared by the cluster's databases: it is
-- created once, and stays when the extension is dropped).
-- A role of that name made by someone else is refused: whoever
-- administers it would decide who reads the figures.
DO $$
DECLARE
	r record;
BEGIN
	SELECT * INTO r FROM pg_catalog.pg_roles WHERE rolname = 'outbox_monitor';
	IF NOT FOUND THEN
		CREATE ROLE outbox_monitor NOLOGIN;
		COMMENT ON ROLE outbox_monitor IS 'reads outbox.lag, outbox.stats, outbox.worker and outbox.metrics()';
	ELSIF r.rolcanlogin OR r.rolsuper OR r.rolcreaterole OR r.rolbypassrls
		  OR EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m
					   JOIN pg_catalog.pg_roles a ON a.oid = m.member
					  WHERE m.roleid = r.oid AND m.admin_option AND NOT a.rolsuper) THEN
		RAISE EXCEPTION 'role "outbox_monitor" exists and is not the extension''s monitoring role'
			USING ERRCODE = 'duplicate_object',
				  DETAIL = 'It can log in, has privileges of its own, or a role that is not a superuser administers it.',
				  HINT = 'Drop or rename that role, then create the extension again.';
	END IF;
END
$$;
GRANT USAGE ON SCHEMA outbox TO outbox_monitor;
GRANT SELECT ON outbox.lag, outbox.stats, outbox.worker, outbox.queues TO outbox_monitor;
GRANT SELECT (id, name) ON outbox.targets TO outbox_monitor;	-- to join target_stats() by name
GRANT EXECUTE ON FUNCTION outbox.metrics(), outbox.target_pending(int), outbox.target_stats(),
	outbox.worker_status(), outbox.queue_stats() TO outbox_monitor;
GRANT EXECUTE ON FUNCTION outbox.standby_status() TO outbox_monitor;
GRANT EXECUTE ON FUNCTION outbox.target_filtered() TO outbox_monitor;

---------------------------------------------------------------------------
-- Change capture.
-- A table's changes become messages: by a trigger, or by the capture
-- worker decoding the WAL (src/capture.c, src/capture_*.c).
---------------------------------------------------------------------------

-- The captured tables.  In trigger mode outbox.capture_trigger(), installed
-- on the table by outbox.capture(), carries the same settings in its
-- arguments; this table is what outbox.captures shows and uncapture()
-- removes.  A dropped table's row goes with it (outbox.captures_dropped).
-- The capture worker reads it while decoding, as of each change: a user
-- catalog table.
CREATE TABLE outbox.captured_tables (
	tbl				regclass	PRIMARY KEY,
	mode			text		NOT NULL CHECK (mode IN ('trigger', 'wal')),
	topic			text,		-- NULL for an outbox table (topic_column)
	columns			text[],
	key				text[],
	topic_column	text,
	key_column		text,
	payload_column	text,
	headers_column	text,
	snapshot_rows	bigint,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	-- 'outbox', 'debezium' (change events) or 'debezium-outbox' (an
	-- outbox table routed as Debezium's outbox event router does)
	format			text		NOT NULL DEFAULT 'outbox'
					CHECK (format IN ('outbox', 'debezium', 'debezium-outbox')),
	topic_prefix	text,		-- 'debezium': the source block's name
	CHECK ((topic IS NULL) <> (topic_column IS NULL)),
	CHECK ((format = 'debezium') = (topic_prefix IS NOT NULL))
) WITH (user_catalog_table = true);
COMMENT ON TABLE outbox.captured_tables IS 'tables whose changes become messages (outbox.capture)';
REVOKE ALL ON TABLE outbox.captured_tables FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.captured_tables', '');

-- The WAL capture's offset, written by the capture worker in the same
-- transaction as the messages it covers (src/capture_worker.c): every source
-- transaction whose commit record begins below end_lsn is handed off, and
-- the first parts_done parts of the one committed at part_commit_lsn.  Not
-- dumped: its positions belong to this cluster's WAL.
CREATE TABLE outbox.capture_progress (
	slot_name		text		PRIMARY KEY,
	end_lsn			pg_lsn		NOT NULL,
	part_commit_lsn	pg_lsn,
	parts_done		int			NOT NULL DEFAULT 0,
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE outbox.capture_progress IS 'how far the WAL capture has handed off; maintained by the capture worker';
REVOKE ALL ON TABLE outbox.capture_progress FROM PUBLIC;

-- A WAL capture was added or removed: start the capture worker, or tell it.
CREATE FUNCTION outbox.capture_wake()
RETURNS void
AS 'MODULE_PATHNAME', 'outbox_capture_wake'
LANGUAGE C;
REVOKE ALL ON FUNCTION outbox.capture_wake() FROM PUBLIC;

-- The replication slot of this database's WAL capture: outbox_capture_
-- and the database's oid (slot names are the cluster's).
CREATE FUNCTION outbox.capture_slot_name()
RETURNS name
AS 'MODULE_PATHNAME', 'outbox_capture_slot_name'
LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION outbox.capture_slot_name() IS
	'the replication slot of this database''s WAL capture';

-- The capture worker's state, from shared memory.
CREATE FUNCTION outbox.capture_status(OUT pid int, OUT state text, OUT last_error text,
									  OUT last_commit_lsn pg_lsn, OUT last_commit_at timestamptz,
									  OUT offset_lsn pg_lsn, OUT handed bigint, OUT skipped bigint,
									  OUT decoded_lsn pg_lsn)
RETURNS record
AS 'MODULE_PATHNAME', 'outbox_capture_status'
LANGUAGE C STABLE;
COMMENT ON FUNCTION outbox.capture_status() IS
	'this database''s capture worker: pid, state, last error, what it handed off and decoded';
REVOKE ALL ON FUNCTION outbox.capture_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.capture_status() TO outbox_monitor;

-- The trigger of trigger captures (src/capture.c): its arguments carry the
-- capture's settings.
CREATE FUNCTION outbox.capture_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'outbox_capture_trigger'
LANGUAGE C;
REVOKE ALL ON FUNCTION outbox.capture_trigger() FROM PUBLIC;

-- Send every row of a captured table as a change with op "read", in the
-- calling transaction (outbox.capture(..., snapshot => true)).
CREATE FUNCTION outbox.capture_snapshot(tbl regclass, args text[])
RETURNS bigint
AS 'MODULE_PATHNAME', 'outbox_capture_snapshot'
LANGUAGE C STRICT;
REVOKE ALL ON FUNCTION outbox.capture_snapshot(regclass, text[]) FROM PUBLIC;

-- Capture the changes of a table as messages.  See docs/capture.md.
CREATE FUNCTION outbox.capture(
	tbl				regclass,
	mode			text	DEFAULT 'trigger',
	topic			text	DEFAULT NULL,
	columns			text[]	DEFAULT NULL,
	key				text[]	DEFAULT NULL,
	snapshot		boolean	DEFAULT false,
	topic_column	text	DEFAULT NULL,
	key_column		text	DEFAULT NULL,
	payload_column	text	DEFAULT NULL,
	headers_column	text	DEFAULT NULL,
	format			text	DEFAULT 'outbox',
	topic_prefix	text	DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	slot name := outbox.capture_slot_name();
	slot_start pg_lsn;
	rel record;
	source text;
	args text[];
	col text;
	colinfo record;
	outbox_table boolean := topic_column IS NOT NULL OR payload_column IS NOT NULL
							OR key_column IS NOT NULL OR headers_column IS NOT NULL;
	rows bigint;
	libs text;
	replident "char";
	identity text[];
	part regclass;
BEGIN
	IF tbl IS NULL THEN
		RAISE EXCEPTION 'table to capture must not be null'
			USING ERRCODE = 'null_value_not_allowed',
				  HINT = 'Name the table, for example outbox.capture(''public.orders'').';
	END IF;
	SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.relispartition, n.nspname
	  INTO rel
	  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	 WHERE c.oid = tbl;
	IF rel.relkind NOT IN ('r', 'p') THEN
		RAISE EXCEPTION '"%" is not a table', tbl
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only ordinary and partitioned tables can be captured.',
				  HINT = 'Capture the table the view, materialized view or foreign table reads.';
	END IF;
	IF rel.relpersistence = 't' THEN
		RAISE EXCEPTION 'cannot capture temporary table "%"', tbl
			USING ERRCODE = 'feature_not_supported',
				  HINT = 'Capture a permanent table, or call outbox_emit() from the session.';
	END IF;
	IF rel.nspname IN ('outbox', 'pg_catalog', 'information_schema', 'pg_toast') THEN
		RAISE EXCEPTION 'cannot capture "%"', tbl
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'Tables of the outbox and system schemas cannot be captured.',
				  HINT = 'Capture tables of your application''s schemas.';
	END IF;
	IF rel.relispartition THEN
		RAISE EXCEPTION 'cannot capture partition "%"', tbl
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Partitions are captured with their partitioned table.',
				  HINT = format('Capture the partitioned table: outbox.capture(%L).',
								(SELECT a::regclass::text FROM pg_partition_ancestors(tbl) a
								  WHERE a <> tbl ORDER BY 1 DESC LIMIT 1));
	END IF;
	IF EXISTS (SELECT 1 FROM outbox.captured_tables ct WHERE ct.tbl = capture.tbl) THEN
		RAISE EXCEPTION 'table "%" is already captured', tbl
			USING ERRCODE = 'duplicate_object',
				  HINT = 'See outbox.captures; to change how, call outbox.uncapture() first.';
	END IF;
	IF mode IS NULL OR mode NOT IN ('trigger', 'wal') THEN
		RAISE EXCEPTION 'unknown capture mode %', quote_nullable(mode)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'The modes are ''trigger'' (a trigger on the table) and ''wal'' (the capture worker mines the WAL).',
				  HINT = 'Pass mode => ''trigger'' or mode => ''wal''.';
	END IF;
	IF mode = 'wal' THEN
		IF current_setting('wal_level') NOT IN ('logical', CASE WHEN current_setting('effective_wal_level', true) IS NOT NULL THEN 'replica' ELSE 'logical' END) THEN	-- 19 on: replica (the slot made below turns decoding on)
			RAISE EXCEPTION 'capture mode "wal" needs wal_level = logical'
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('wal_level is %s: the WAL does not carry the changes of rows.',
									  current_setting('wal_level')),
					  HINT = 'ALTER SYSTEM SET wal_level = logical (replica from PostgreSQL 19 on) and restart the server, or capture with mode => ''trigger''.';
		END IF;
		libs := current_setting('output_plugin_libraries', true);
		IF libs IS NOT NULL AND libs !~ '(^|,)\s*("outbox"|outbox)\s*(,|$)' THEN
			RAISE EXCEPTION 'library "outbox" is not allowed as an output plugin'
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = format('output_plugin_libraries is ''%s''; logical decoding refuses other plugins, and the capture worker decodes with outbox.', libs),
					  HINT = format('ALTER SYSTEM SET output_plugin_libraries = %s; SELECT pg_reload_conf(); or capture with mode => ''trigger''.',
									CASE WHEN libs = '' THEN 'outbox' ELSE libs || ', outbox' END);
		END IF;
		IF rel.relpersistence = 'u' THEN
			RAISE EXCEPTION 'cannot capture unlogged table "%" from the WAL', tbl
				USING ERRCODE = 'feature_not_supported',
					  DETAIL = 'The changes of an unlogged table are not written to the WAL.',
					  HINT = 'Capture it with mode => ''trigger''.';
		END IF;
	END IF;
	IF snapshot IS NULL THEN
		snapshot := false;
	END IF;
	IF format IS NULL OR format NOT IN ('outbox', 'debezium', 'debezium-outbox') THEN
		RAISE EXCEPTION 'unknown capture format %', quote_nullable(format)
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = 'The formats are ''outbox'' (the default), ''debezium'' (Debezium''s change events) and ''debezium-outbox'' (an outbox table routed as Debezium''s outbox event router does).',
				  HINT = 'Pass format => ''outbox'', ''debezium'' or ''debezium-outbox''.';
	END IF;
	IF topic_prefix IS NOT NULL AND format <> 'debezium' THEN
		RAISE EXCEPTION 'topic_prefix is for format "debezium"'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Pass format => ''debezium'', or leave topic_prefix out.';
	END IF;
	IF format = 'debezium' THEN
		IF outbox_table THEN
			RAISE EXCEPTION 'a Debezium change capture takes no outbox table columns'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'topic_column, key_column, payload_column or headers_column was given with format ''debezium''.',
					  HINT = 'Capture an outbox table with format => ''debezium-outbox'', or a table''s changes without those columns.';
		END IF;
		topic_prefix := coalesce(topic_prefix, current_database());
		IF topic_prefix = '' OR octet_length(topic_prefix) > 128 THEN
			RAISE EXCEPTION 'topic_prefix must have 1 to 128 bytes'
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Name the logical server, for example topic_prefix => ''inventory''.';
		END IF;
		PERFORM outbox.check_text(topic_prefix, 'topic', 'topic_prefix');
		IF topic IS NULL THEN
			-- as the connector names it: its parts that are not blank
			-- (characters up to U+0020 only), joined by ".", each UTF-16
			-- unit outside [A-Za-z0-9._-] read as "_" (two for a character
			-- of 4 bytes in UTF-8), at most 249 of them
			topic := (SELECT string_agg(q.nm, '.' ORDER BY q.ord)
						FROM unnest(ARRAY[topic_prefix, rel.nspname::text, rel.relname::text])
							 WITH ORDINALITY AS q(nm, ord)
					   WHERE q.nm !~ '^[\x01-\x20]*$');
			topic := left((SELECT string_agg(CASE WHEN c.ch ~ '^[A-Za-z0-9._-]$' THEN c.ch
												  WHEN octet_length(convert_to(c.ch, 'UTF8')) = 4 THEN '__'
												  ELSE '_' END, '' ORDER BY c.n)
							 FROM regexp_split_to_table(topic, '') WITH ORDINALITY AS c(ch, n)), 249);
			IF topic IN ('.', '..') THEN
				topic := translate(topic, '.', '_');	-- (names Kafka refuses)
			END IF;
		END IF;
	ELSIF format = 'debezium-outbox' THEN
		-- Debezium's outbox event router: its default column names
		IF columns IS NOT NULL OR key IS NOT NULL OR capture.topic IS NOT NULL THEN
			RAISE EXCEPTION 'an outbox table capture takes its topic, key and payload from the row'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'topic, columns or key was given with format ''debezium-outbox''.',
					  HINT = 'Leave them out; topic_column, key_column and payload_column name other columns than aggregatetype, aggregateid and payload.';
		END IF;
		topic_column := coalesce(topic_column, 'aggregatetype');
		key_column := coalesce(key_column, 'aggregateid');
		payload_column := coalesce(payload_column, 'payload');
		outbox_table := true;
		IF NOT EXISTS (SELECT 1 FROM pg_attribute a
						WHERE a.attrelid = tbl AND a.attname = 'id' AND a.attnum > 0
						  AND NOT a.attisdropped) THEN
			RAISE EXCEPTION 'column "id" of table "%" does not exist', tbl
				USING ERRCODE = 'undefined_column',
					  DETAIL = 'Debezium''s outbox event router sends the id column as the header "id".',
					  HINT = 'Add an id column (uuid), as Debezium''s outbox table has.';
		END IF;
	END IF;

	-- Header values are printable ASCII: other bytes of the name are
	-- percent-encoded (so is "%").
	source := (SELECT string_agg(CASE WHEN b BETWEEN 32 AND 126 AND b <> 37
									  THEN chr(b) ELSE '%' || upper(lpad(to_hex(b), 2, '0')) END,
								 '' ORDER BY i)
				 FROM (SELECT i, get_byte(convert_to(rel.nspname || '.' || rel.relname,
												   'UTF8'), i) AS b
						 FROM generate_series(0, octet_length(convert_to(rel.nspname || '.' ||
																rel.relname, 'UTF8')) - 1) i) s);
	IF topic IS NULL AND NOT outbox_table THEN
		topic := rel.nspname || '.' || rel.relname;
	END IF;

	IF outbox_table THEN
		IF columns IS NOT NULL OR key IS NOT NULL OR capture.topic IS NOT NULL THEN
			RAISE EXCEPTION 'an outbox table capture takes its topic, key and payload from the row'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'topic_column, key_column, payload_column or headers_column was given together with topic, columns or key.',
					  HINT = 'Pass topic_column and payload_column (and key_column, headers_column), or topic, columns and key.';
		END IF;
		IF topic_column IS NULL OR payload_column IS NULL THEN
			RAISE EXCEPTION 'an outbox table capture needs topic_column and payload_column'
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Name the columns, for example topic_column => ''aggregatetype'', payload_column => ''payload''.';
		END IF;
		IF snapshot THEN
			RAISE EXCEPTION 'an outbox table capture has no snapshot'
				USING ERRCODE = 'invalid_parameter_value',
					  DETAIL = 'Rows already in the table are not sent; only inserted rows become messages.',
					  HINT = 'Leave snapshot false.';
		END IF;
		FOREACH col IN ARRAY ARRAY[topic_column, key_column, payload_column, headers_column] LOOP
			CONTINUE WHEN col IS NULL;
			SELECT a.atttypid, pg_catalog.format_type(a.atttypid, a.atttypmod) AS typ,
				   (SELECT t.typbasetype FROM pg_type t WHERE t.oid = a.atttypid) AS base
			  INTO colinfo
			  FROM pg_attribute a
			 WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
			IF NOT FOUND THEN
				RAISE EXCEPTION 'column "%" of table "%" does not exist', col, tbl
					USING ERRCODE = 'undefined_column',
						  HINT = 'Name a column of the table.';
			END IF;
			IF (col = topic_column AND coalesce(nullif(colinfo.base, 0), colinfo.atttypid)
											NOT IN ('text'::regtype, 'varchar'::regtype))
			   OR (col = payload_column AND colinfo.atttypid NOT IN ('jsonb'::regtype, 'json'::regtype, 'text'::regtype))
			   OR (col = headers_column AND colinfo.atttypid <> 'jsonb'::regtype) THEN
				RAISE EXCEPTION 'column "%" of table "%" has type %', col, tbl, colinfo.typ
					USING ERRCODE = 'datatype_mismatch',
						  DETAIL = 'The topic column must be text or varchar, the payload column jsonb, json or text, the headers column jsonb.',
						  HINT = 'Name a column of the right type.';
			END IF;
		END LOOP;
		args := ARRAY['1', CASE WHEN format = 'debezium-outbox' THEN 'r' ELSE 'o' END, '-', source,
					  topic_column, coalesce(key_column, ''), payload_column, coalesce(headers_column, '')]
				|| CASE WHEN format = 'debezium-outbox' THEN ARRAY['id'] END;
	ELSE
		IF octet_length(topic) > 255 OR topic = '' THEN
			RAISE EXCEPTION 'outbox topic must have 1 to 255 bytes'
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass a shorter topic => ...';
		END IF;
		PERFORM outbox.check_text(topic, 'topic', 'outbox topic');
		IF columns IS NOT NULL THEN
			IF cardinality(columns) = 0 OR array_position(columns, NULL) IS NOT NULL THEN
				RAISE EXCEPTION 'columns to capture must be a non-empty list of column names'
					USING ERRCODE = 'invalid_parameter_value',
						  HINT = 'Pass NULL to capture every column.';
			END IF;
			IF (SELECT count(DISTINCT c) FROM unnest(columns) c) <> cardinality(columns) THEN
				RAISE EXCEPTION 'columns to capture list a column twice'
					USING ERRCODE = 'duplicate_column',
						  HINT = 'Name each column once.';
			END IF;
		END IF;
		IF key IS NULL THEN
			key := ARRAY(SELECT a.attname::text
						   FROM pg_index i
						   CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, pos)
						   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
						  WHERE i.indrelid = tbl AND i.indisprimary
						  ORDER BY k.pos);
			IF cardinality(key) = 0 THEN
				RAISE EXCEPTION 'table "%" has no primary key', tbl
					USING ERRCODE = 'invalid_table_definition',
						  DETAIL = 'The key of a captured change is the primary key, or the columns named by key.',
						  HINT = 'Add a primary key, or pass key => ARRAY[''column'', ...].';
			END IF;
		ELSIF cardinality(key) = 0 OR array_position(key, NULL) IS NOT NULL
			  OR (SELECT count(DISTINCT c) FROM unnest(key) c) <> cardinality(key) THEN
			RAISE EXCEPTION 'key must be a non-empty list of distinct column names'
				USING ERRCODE = 'invalid_parameter_value',
					  HINT = 'Pass NULL for the primary key.';
		END IF;
		FOREACH col IN ARRAY coalesce(columns, '{}') || key LOOP
			IF NOT EXISTS (SELECT 1 FROM pg_attribute a
							WHERE a.attrelid = tbl AND a.attname = col AND a.attnum > 0
							  AND NOT a.attisdropped) THEN
				RAISE EXCEPTION 'column "%" of table "%" does not exist', col, tbl
					USING ERRCODE = 'undefined_column',
						  HINT = 'Name columns of the table.';
			END IF;
			IF EXISTS (SELECT 1 FROM pg_attribute a
						WHERE a.attrelid = tbl AND a.attname = col AND a.attgenerated = 'v') THEN
				RAISE EXCEPTION 'column "%" of table "%" is a virtual generated column', col, tbl
					USING ERRCODE = 'feature_not_supported',
						  DETAIL = 'Its value is computed when read: neither the trigger nor the WAL has it.',
						  HINT = 'Capture the columns it is computed from, or make it STORED.';
			END IF;
		END LOOP;
		args := CASE WHEN format = 'debezium'
					 THEN ARRAY['1', 'd', topic, source, topic_prefix, rel.nspname, rel.relname]
					 ELSE ARRAY['1', 'c', topic, source] END
				|| coalesce(cardinality(columns), 0)::text
				|| coalesce(columns, '{}') || cardinality(key)::text || key;
		IF mode = 'wal' THEN
			-- The WAL carries the old values of the replica identity only:
			-- that of each partition, for a partitioned table.
			FOR part IN SELECT tbl AS relid WHERE rel.relkind = 'r'
						UNION ALL
						SELECT p.relid FROM pg_partition_tree(tbl) p WHERE p.isleaf AND p.relid <> tbl LOOP
				SELECT c.relreplident INTO replident FROM pg_class c WHERE c.oid = part;
				identity := ARRAY(SELECT a.attname::text
									FROM pg_index i
									CROSS JOIN LATERAL unnest(i.indkey) k(attnum)
									JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
								   WHERE i.indrelid = part
									 AND ((replident = 'd' AND i.indisprimary)
										  OR (replident = 'i' AND i.indisreplident)));
				IF replident = 'n' OR (replident IN ('d', 'i') AND cardinality(identity) = 0) THEN
					RAISE EXCEPTION 'table "%" has no replica identity', part::regclass
						USING ERRCODE = 'object_not_in_prerequisite_state',
							  DETAIL = 'The WAL of its updates and deletes would not say which row changed.',
							  HINT = 'Add a primary key, or ALTER TABLE ... REPLICA IDENTITY FULL (on each partition: it is not inherited).';
				END IF;
				IF replident <> 'f' AND NOT (key <@ identity) THEN
					RAISE EXCEPTION 'the key of a WAL capture must be columns of the replica identity of "%"', part::regclass
						USING ERRCODE = 'invalid_parameter_value',
							  DETAIL = format('The replica identity is (%s); the WAL of a delete carries only those columns.',
											  array_to_string(identity, ', ')),
							  HINT = 'Pass key => those columns, or ALTER TABLE ... REPLICA IDENTITY FULL (on each partition: it is not inherited).';
				END IF;
			END LOOP;
		END IF;
	END IF;

	IF mode = 'wal' THEN
		-- The slot first: it cannot be created once the transaction wrote.
		-- Decoding starts at its consistent point; a change is captured if
		-- this capture had committed when the change was made.  The lock
		-- keeps the capture worker from dropping a slot it found unused
		-- while this capture commits (capture_drop_slot_if_unused in
		-- src/capture_worker.c, which takes it exclusive).
		PERFORM pg_advisory_xact_lock_shared(7386912245760017);
		IF NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = slot) THEN
			IF (SELECT count(*) FROM pg_replication_slots) >= current_setting('max_replication_slots')::int THEN
				RAISE EXCEPTION 'no replication slot is free for the WAL capture'
					USING ERRCODE = 'configuration_limit_exceeded',
						  DETAIL = format('max_replication_slots is %s, and all are in use.',
										  current_setting('max_replication_slots')),
						  HINT = 'Raise max_replication_slots and restart the server, or drop an unused slot.';
			END IF;
			BEGIN
				-- PostgreSQL 17 and later: a failover slot, which standbys
				-- with sync_replication_slots keep a copy of (the capture
				-- worker converts a slot made before)
				IF current_setting('server_version_num')::int >= 170000 THEN
					SELECT s.lsn INTO slot_start
					  FROM pg_create_logical_replication_slot(slot, 'outbox', temporary => false,
															 twophase => false, failover => true) s;
				ELSE
					SELECT s.lsn INTO slot_start
					  FROM pg_create_logical_replication_slot(slot, 'outbox') s;
				END IF;
				-- the worker drops the slot again if this capture fails
				PERFORM outbox.capture_wake();
				-- a new slot: the offset starts where it does (an offset left
				-- by an earlier one means nothing), committed with the
				-- capture, so that a standby's copy of the slot is never ahead
				-- of the offset the standby has unnoticed
				INSERT INTO outbox.capture_progress AS p (slot_name, end_lsn, part_commit_lsn, parts_done)
				VALUES (slot, slot_start, NULL, 0)
				ON CONFLICT (slot_name) DO UPDATE
				   SET end_lsn = excluded.end_lsn, part_commit_lsn = NULL, parts_done = 0,
					   updated_at = pg_catalog.now();
			EXCEPTION WHEN active_sql_transaction THEN
				RAISE EXCEPTION 'cannot start a WAL capture in a transaction that has written'
					USING ERRCODE = 'active_sql_transaction',
						  DETAIL = format('The first WAL capture creates the replication slot "%s", which PostgreSQL creates only before any write of the transaction.', slot),
						  HINT = 'Call outbox.capture(..., mode => ''wal'') in a transaction of its own.';
			END;
		ELSIF EXISTS (SELECT 1 FROM pg_replication_slots
					   WHERE slot_name = slot
						 AND (database IS DISTINCT FROM current_database() OR plugin IS DISTINCT FROM 'outbox')) THEN
			RAISE EXCEPTION 'replication slot "%" belongs to another database or plugin', slot
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  HINT = format('Drop that slot with pg_drop_replication_slot(%L) if nothing uses it.', slot);
		ELSIF EXISTS (SELECT 1 FROM pg_replication_slots
					   WHERE slot_name = slot AND wal_status = 'lost') THEN
			RAISE EXCEPTION 'the WAL capture is lost'
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  DETAIL = 'Its replication slot was invalidated (outbox.captures says why).',
					  HINT = 'outbox.uncapture() every WAL capture (the worker then drops the slot), then capture the tables again with snapshot => true.';
		END IF;
		-- Writers wait until the capture commits, so that a snapshot
		-- misses nothing committed between it and the capture.
		IF snapshot THEN
			EXECUTE format('LOCK TABLE %s IN SHARE MODE', tbl);
		END IF;
	END IF;

	IF mode = 'trigger' THEN
	EXECUTE format('CREATE TRIGGER outbox_capture AFTER INSERT%s ON %s FOR EACH ROW '
				   'EXECUTE FUNCTION outbox.capture_trigger(%s)',
				   CASE WHEN outbox_table THEN '' ELSE ' OR UPDATE OR DELETE' END, tbl,
				   (SELECT string_agg(quote_literal(a), ', ' ORDER BY i)
					  FROM unnest(args) WITH ORDINALITY u(a, i)));
	IF NOT outbox_table THEN
		EXECUTE format('CREATE TRIGGER outbox_capture_truncate AFTER TRUNCATE ON %s '
					   'FOR EACH STATEMENT EXECUTE FUNCTION outbox.capture_trigger(%s)',
					   tbl,
					   (SELECT string_agg(quote_literal(a), ', ' ORDER BY i)
						  FROM unnest(args) WITH ORDINALITY u(a, i)));
	END IF;
	END IF;
	IF snapshot THEN
		rows := outbox.capture_snapshot(tbl, args);
	END IF;
	INSERT INTO outbox.captured_tables (tbl, mode, topic, columns, key, topic_column, key_column,
										payload_column, headers_column, snapshot_rows, format,
										topic_prefix)
	VALUES (tbl, mode, CASE WHEN outbox_table THEN NULL ELSE topic END, columns,
			CASE WHEN outbox_table THEN NULL ELSE key END,
			topic_column, key_column, payload_column, headers_column, rows, format,
			topic_prefix);
	IF mode = 'wal' THEN
		PERFORM outbox.capture_wake();
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.capture(regclass, text, text, text[], text[], boolean, text, text, text, text, text, text) FROM PUBLIC;
COMMENT ON FUNCTION outbox.capture(regclass, text, text, text[], text[], boolean, text, text, text, text, text, text) IS
	'capture the changes of a table as messages';

-- Stop capturing a table.
CREATE FUNCTION outbox.uncapture(tbl regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	was text;
BEGIN
	DELETE FROM outbox.captured_tables ct WHERE ct.tbl = uncapture.tbl RETURNING ct.mode INTO was;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'table "%" is not captured', tbl
			USING ERRCODE = 'undefined_object',
				  HINT = 'See SELECT * FROM outbox.captures.';
	END IF;
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'outbox_capture') THEN
		EXECUTE format('DROP TRIGGER outbox_capture ON %s', tbl);
	END IF;
	IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'outbox_capture_truncate') THEN
		EXECUTE format('DROP TRIGGER outbox_capture_truncate ON %s', tbl);
	END IF;
	IF was = 'wal' THEN
		PERFORM outbox.capture_wake();
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.uncapture(regclass) FROM PUBLIC;
COMMENT ON FUNCTION outbox.uncapture(regclass) IS 'stop capturing the changes of a table';

-- A dropped table is no longer captured.
CREATE FUNCTION outbox.captures_dropped()
RETURNS event_trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	wal_captures int;
BEGIN
	-- A dropped table's WAL capture ends at the drop: the worker reads the
	-- row as of each change.
	WITH dropped AS (
		DELETE FROM outbox.captured_tables ct
		 USING pg_event_trigger_dropped_objects() d
		 WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND ct.tbl = d.objid
		RETURNING ct.mode)
	SELECT count(*) FILTER (WHERE mode = 'wal') INTO wal_captures FROM dropped;
	IF wal_captures > 0 THEN
		PERFORM outbox.capture_wake();
	END IF;
END
$$;
REVOKE ALL ON FUNCTION outbox.captures_dropped() FROM PUBLIC;
CREATE EVENT TRIGGER outbox_captures_dropped ON sql_drop
	WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')
	EXECUTE FUNCTION outbox.captures_dropped();

-- The captured tables: whether their triggers fire, or how far the WAL
-- capture has come.
CREATE VIEW outbox.captures AS
SELECT ct.tbl AS table_name,
	   ct.mode,
	   CASE WHEN ct.topic_column IS NULL THEN ct.topic ELSE '(' || ct.topic_column || ')' END AS topic,
	   CASE WHEN ct.topic_column IS NOT NULL THEN 'outbox table' ELSE 'changes' END AS shape,
	   ct.format,
	   CASE
		   WHEN ct.mode = 'wal' THEN
			   CASE WHEN s.wal_status = 'lost' OR w.state = 'lost' THEN 'lost'
					WHEN s.slot_name IS NULL THEN 'lost'
					ELSE coalesce(w.state, 'stopped') END
		   WHEN tg.missing > 0 THEN 'trigger missing'
		   WHEN tg.disabled > 0 THEN 'disabled'
		   WHEN tg.replica THEN 'replica only'
		   WHEN tg.always THEN 'always'
		   ELSE 'capturing'
	   END AS state,
	   ct.columns,
	   ct.key,
	   ct.snapshot_rows,
	   CASE WHEN ct.mode = 'wal' THEN w.last_commit_lsn END AS last_commit_lsn,
	   CASE WHEN ct.mode = 'wal' THEN w.last_commit_at END AS last_commit_at,
	   CASE WHEN ct.mode = 'wal' THEN
			pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(),
									   coalesce(greatest(p.end_lsn, w.decoded_lsn),
												s.confirmed_flush_lsn))::bigint END AS lag_bytes,
	   CASE WHEN ct.mode = 'wal' THEN pg_catalog.now() - p.updated_at END AS lag_time,
	   CASE WHEN ct.mode = 'wal' THEN
			pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn)::bigint END AS retained_wal,
	   CASE
		   WHEN ct.mode = 'wal' AND s.slot_name IS NULL THEN
			   'replication slot "' || outbox.capture_slot_name() || '" does not exist on this server'
			   || ' (after a failover or a restore from a backup the capture slot is not here):'
			   || ' capture the tables again with a snapshot'
		   WHEN ct.mode = 'wal' AND s.wal_status = 'lost' THEN
			   'replication slot "' || outbox.capture_slot_name() || '" was invalidated: ' ||
			   -- invalidation_reason: 17 on (to_jsonb: the column may not exist)
			   CASE pg_catalog.to_jsonb(s) ->> 'invalidation_reason'
				   WHEN 'idle_timeout' THEN 'it was idle longer than idle_replication_slot_timeout'
				   WHEN 'wal_level_insufficient' THEN 'wal_level became too low for logical decoding'
				   WHEN 'rows_removed' THEN 'rows it needed were removed (a conflict with recovery)'
				   ELSE 'the WAL it needed was removed (max_slot_wal_keep_size)'
			   END
		   WHEN ct.mode = 'wal' THEN w.last_error
		   WHEN tg.missing > 0 OR tg.disabled > 0 THEN 'changes are not captured: trigger ' || tg.broken
	   END AS last_error,
	   ct.created_at
  FROM outbox.captured_tables ct
  -- every trigger the capture needs: the row trigger on the table and each
  -- of its partitions, the TRUNCATE trigger on the table
  LEFT JOIN LATERAL (
	SELECT count(*) FILTER (WHERE t.tgenabled IS NULL) AS missing,
		   count(*) FILTER (WHERE t.tgenabled = 'D') AS disabled,
		   bool_and(t.tgenabled = 'R') AS replica,
		   bool_and(t.tgenabled = 'A') AS always,
		   string_agg(CASE WHEN t.tgenabled IS NULL OR t.tgenabled = 'D'
						   THEN n.name || ' on ' || r.relid::regclass::text ||
								CASE WHEN t.tgenabled IS NULL THEN ' dropped' ELSE ' disabled' END
					  END, ', '
					  ORDER BY r.level, r.relid::regclass::text, n.name) AS broken
	  FROM (SELECT ct.tbl AS relid, 0 AS level
			UNION ALL
			SELECT p.relid, p.level FROM pg_catalog.pg_partition_tree(ct.tbl) p
			 WHERE p.level > 0) r
	 CROSS JOIN (VALUES ('outbox_capture'), ('outbox_capture_truncate')) n(name)
	  LEFT JOIN pg_catalog.pg_trigger t ON t.tgrelid = r.relid AND t.tgname = n.name
	 WHERE ct.mode = 'trigger'
	   AND (n.name = 'outbox_capture'
			OR (r.level = 0 AND ct.topic_column IS NULL))) tg ON true
  LEFT JOIN pg_catalog.pg_replication_slots s ON ct.mode = 'wal' AND s.slot_name = outbox.capture_slot_name()
  LEFT JOIN outbox.capture_progress p ON ct.mode = 'wal' AND p.slot_name = outbox.capture_slot_name()
  LEFT JOIN LATERAL outbox.capture_status() w ON ct.mode = 'wal';
COMMENT ON VIEW outbox.captures IS
	'each captured table: mode, format, state, lag and retained WAL of a WAL capture, last error';
REVOKE ALL ON outbox.captures FROM PUBLIC;
GRANT SELECT ON outbox.captures TO outbox_monitor;

---------------------------------------------------------------------------
-- Last: wake a relay waiting for CREATE EXTENSION.
---------------------------------------------------------------------------
-- A relay waiting for CREATE EXTENSION starts delivering when this commits
-- (only where the library is preloaded: outbox.database exists then).
SELECT outbox.config_changed()
 WHERE pg_catalog.current_setting('outbox.database', true) IS NOT NULL;
