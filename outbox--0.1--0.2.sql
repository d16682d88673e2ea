/* outbox--0.1--0.2.sql */

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.2'" to load this file. \quit

---------------------------------------------------------------------------
-- Ids never go backwards (I6).
---------------------------------------------------------------------------

-- The durable id mark: at or above every message id ever handed out.  The
-- commit sequence moves it ahead in chunks with setval() (non-transactional
-- and WAL-logged) before it hands out an id past it, so a transaction that
-- reserved ids and then failed, whose rows VACUUM removed, still leaves its
-- ids covered after a restart.  Written only by the library.
CREATE SEQUENCE outbox.id_mark AS bigint MINVALUE 0 START 0 NO CYCLE;
COMMENT ON SEQUENCE outbox.id_mark IS 'at or above every message id handed out; maintained by the library';
REVOKE ALL ON SEQUENCE outbox.id_mark FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.id_mark', '');

-- A dump keeps the target id sequence, so targets created after a restore
-- get new ids.
SELECT pg_catalog.pg_extension_config_dump('outbox.targets_id_seq', '');

---------------------------------------------------------------------------
-- Target rows the relay can trust: the same limits as the target functions,
-- as constraints (the relay checks rows again as it loads them, and skips a
-- bad one with a WARNING shown in outbox.lag).
---------------------------------------------------------------------------
-- NOT VALID: a row written by hand before the update does not make the
-- update fail (the relay skips it); new and changed rows are checked.
ALTER TABLE outbox.targets
	ADD CONSTRAINT targets_batch_size_check CHECK (batch_size BETWEEN 1 AND 1000) NOT VALID,
	ADD CONSTRAINT targets_lanes_check CHECK (lanes BETWEEN 1 AND 256 AND (kind = 'http' OR lanes = 1)) NOT VALID,
	ADD CONSTRAINT targets_max_attempts_check CHECK (max_attempts BETWEEN 0 AND 1000000) NOT VALID,
	ADD CONSTRAINT targets_timeout_ms_check CHECK (timeout_ms BETWEEN 10 AND 3600000) NOT VALID,
	ADD CONSTRAINT targets_secret_check CHECK (secret IS NULL OR secret ~ '^whsec_[A-Za-z0-9+/]+={0,2}$') NOT VALID,
	ADD CONSTRAINT targets_headers_check CHECK (jsonb_typeof(headers) = 'object') NOT VALID,
	ADD CONSTRAINT targets_channel_check CHECK (channel IS NULL OR octet_length(channel) BETWEEN 1 AND 63) NOT VALID;

-- Only a duplicate name is "already exists"; any other unique violation
-- (a restored target id, say) is reported as it is.  (An update script
-- replaces a function in place.)
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
									ordering, max_attempts, timeout_ms)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000))
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

-- A relay waiting for CREATE EXTENSION starts delivering when this commits
-- (only where the library is preloaded: outbox.database exists then).
SELECT outbox.config_changed()
 WHERE pg_catalog.current_setting('outbox.database', true) IS NOT NULL;

---------------------------------------------------------------------------
-- Stable batch ids: a batch of fewer than batch_size messages is recorded
-- before it is sent, so that after a restart it is cut the same way (same
-- members, same webhook-id).  Full batches are cut the same way anyway.
---------------------------------------------------------------------------
ALTER TABLE outbox.progress ADD COLUMN batch_end bigint;
COMMENT ON COLUMN outbox.progress.batch_end IS
	'last id of the batch in flight when it was cut short of batch_size; ignored once done_id passes it';

---------------------------------------------------------------------------
-- Retention without bloat (I8).
--
-- Messages are stored in four chunk tables, outbox.messages_1 to _4, which
-- inherit from outbox.messages: reading outbox.messages reads them all, so
-- it stays queryable as before.  Committing transactions write into the
-- current chunk.  The relay calls outbox.retention_step() about once a
-- second: it empties, with TRUNCATE, a chunk that stopped being current at
-- least outbox.retention ago and whose every message every target has
-- finished, and moves the current chunk on to an empty one.  Nothing is
-- deleted or updated row by row, so removal costs the same for ten
-- messages as for ten million and leaves no dead rows for VACUUM.
-- outbox.messages itself (chunk 0) keeps only rows stored before the
-- update; it is emptied the same way once they are finished.
---------------------------------------------------------------------------

-- Dead letters keep what is needed to deliver them again after their
-- message was removed.
ALTER TABLE outbox.dead_letters
	ADD COLUMN payload jsonb,
	ADD COLUMN headers jsonb,
	ADD COLUMN emitted_at timestamptz;
UPDATE outbox.dead_letters d
   SET payload = m.payload, headers = m.headers, emitted_at = m.emitted_at
  FROM outbox.messages m
 WHERE m.id = d.id;

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

ALTER TABLE outbox.state ADD COLUMN removed_before timestamptz;
COMMENT ON COLUMN outbox.state.removed_before IS
	'every message removed so far was emitted before this time';

-- Removing a table's rows records the highest id removed, and a time before
-- which every removed message was emitted: when its chunk stopped being
-- current, or now() for the current chunk.  Only this table's rows: each
-- chunk has this trigger, and the id mark (I6) covers every id handed out
-- whatever is removed.
CREATE OR REPLACE FUNCTION outbox.note_truncated_ids()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	highest bigint;
	emitted_before timestamptz;
BEGIN
	EXECUTE format('SELECT max(id) FROM ONLY %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO highest;
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

DO $$
DECLARE
	i int;
	rel text;
BEGIN
	FOR i IN 1..4 LOOP
		rel := 'messages_' || i;
		EXECUTE format('CREATE TABLE outbox.%I (CONSTRAINT %I PRIMARY KEY (id)) INHERITS (outbox.messages)',
					   rel, rel || '_pkey');
		EXECUTE format('COMMENT ON TABLE outbox.%I IS %L', rel,
					   'chunk ' || i || ' of outbox.messages (read outbox.messages)');
		EXECUTE format('REVOKE ALL ON TABLE outbox.%I FROM PUBLIC', rel);
		EXECUTE format('CREATE TRIGGER messages_guard BEFORE UPDATE ON outbox.%I'
					   ' FOR EACH STATEMENT EXECUTE FUNCTION outbox.messages_guard()', rel);
		EXECUTE format('CREATE TRIGGER messages_high_water_insert AFTER INSERT ON outbox.%I'
					   ' REFERENCING NEW TABLE AS inserted_messages'
					   ' FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_inserted_ids()', rel);
		EXECUTE format('CREATE TRIGGER messages_high_water_truncate BEFORE TRUNCATE ON outbox.%I'
					   ' FOR EACH STATEMENT EXECUTE FUNCTION outbox.note_truncated_ids()', rel);
		EXECUTE format('ALTER TABLE outbox.%I ENABLE ALWAYS TRIGGER messages_high_water_insert', rel);
		EXECUTE format('ALTER TABLE outbox.%I ENABLE ALWAYS TRIGGER messages_high_water_truncate', rel);
		PERFORM pg_catalog.pg_extension_config_dump(format('outbox.%I', rel)::regclass, '');
	END LOOP;
END
$$;

-- Chunk 1 is current; the others (and outbox.messages, chunk 0, with the
-- rows of 0.1) count as rotated now.
INSERT INTO outbox.chunks (chunk, relname, is_current, current_since, rotated_at) VALUES
	(0, 'messages', false, NULL, now()),
	(1, 'messages_1', true, now(), NULL),
	(2, 'messages_2', false, NULL, now()),
	(3, 'messages_3', false, NULL, now()),
	(4, 'messages_4', false, NULL, now());

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
