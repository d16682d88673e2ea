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

-- Rows reach outbox.messages only through outbox_emit().  A direct INSERT
-- could take an id a committing transaction is about to use and make it
-- wait; an UPDATE would change a message after it may have been delivered.
-- The guard does not fire with session_replication_role = replica, which
-- is how a data-only restore loads the table.
CREATE FUNCTION outbox.messages_guard()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RAISE EXCEPTION 'cannot % outbox.messages directly',
		CASE TG_OP WHEN 'INSERT' THEN 'insert into' ELSE lower(TG_OP) END
		USING ERRCODE = 'insufficient_privilege',
			  DETAIL = 'Messages are written by outbox_emit() when the emitting transaction commits.',
			  HINT = 'Call outbox_emit(topic, payload, key, headers) instead.';
END
$$;
REVOKE ALL ON FUNCTION outbox.messages_guard() FROM PUBLIC;

CREATE TRIGGER messages_guard
	BEFORE INSERT OR UPDATE ON outbox.messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard();

-- Keep the high-water mark when rows are deleted or the table truncated,
-- in the same transaction, so ids are never handed out twice (I6).  These
-- fire even with session_replication_role = replica.
CREATE FUNCTION outbox.note_deleted_ids()
RETURNS trigger
LANGUAGE plpgsql
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
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	UPDATE outbox.state
	   SET id_high_water = greatest(id_high_water, (SELECT max(id) FROM outbox.messages));
	RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.note_truncated_ids() FROM PUBLIC;

CREATE TRIGGER messages_high_water_delete
	AFTER DELETE ON outbox.messages
	REFERENCING OLD TABLE AS deleted_messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_deleted_ids();
CREATE TRIGGER messages_high_water_truncate
	BEFORE TRUNCATE ON outbox.messages
	FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids();
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
