/* outbox--0.2--0.3.sql */

\echo Use "ALTER EXTENSION outbox UPDATE TO '0.3'" to load this file. \quit

---------------------------------------------------------------------------
-- Change capture: the changes of a table become messages.
---------------------------------------------------------------------------

-- The captured tables.  In trigger mode outbox.capture_trigger(), installed
-- on the table by outbox.capture(), carries the same settings in its
-- arguments; this table is what outbox.captures shows and uncapture()
-- removes.  A dropped table's row goes with it (outbox.captures_dropped).
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
);
COMMENT ON TABLE outbox.captured_tables IS 'tables whose changes become messages (outbox.capture)';
REVOKE ALL ON TABLE outbox.captured_tables FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('outbox.captured_tables', '');
-- The capture worker reads it while decoding, as of each change.
ALTER TABLE outbox.captured_tables SET (user_catalog_table = true);

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
GRANT EXECUTE ON FUNCTION outbox.capture_status() TO outbox_monitor;

---------------------------------------------------------------------------
-- Broker targets: NATS JetStream (src/relay_nats.c), each message
-- published with Nats-Msg-Id = its id and waited for its JetStream
-- acknowledgement; Kafka (src/relay_kafka.c), an idempotent producer.  A
-- Kafka target's url is its bootstrap list.
---------------------------------------------------------------------------
ALTER TABLE outbox.targets
	ADD COLUMN subject text,			-- NATS: the subject template
	ADD COLUMN topic text,				-- Kafka: the topic template
	ADD COLUMN properties jsonb;		-- Kafka: librdkafka settings
ALTER TABLE outbox.targets DROP CONSTRAINT targets_kind_check,
	ADD CONSTRAINT targets_kind_check CHECK (kind IN ('http', 'notify', 'queue', 'nats', 'kafka'));
ALTER TABLE outbox.targets DROP CONSTRAINT targets_check,
	ADD CONSTRAINT targets_check CHECK ((kind IN ('http', 'nats', 'kafka')) = (url IS NOT NULL));
ALTER TABLE outbox.targets DROP CONSTRAINT targets_lanes_check,
	ADD CONSTRAINT targets_lanes_check
		CHECK (lanes BETWEEN 1 AND 256 AND (kind IN ('http', 'nats', 'kafka') OR lanes = 1)),
	ADD CONSTRAINT targets_subject_check CHECK ((kind = 'nats') = (subject IS NOT NULL)),
	ADD CONSTRAINT targets_topic_check CHECK ((kind = 'kafka') = (topic IS NOT NULL)),
	ADD CONSTRAINT targets_properties_check
		CHECK (properties IS NULL OR (kind = 'kafka' AND jsonb_typeof(properties) = 'object'));

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

-- The checks of a broker target's options (NATS or Kafka), shared by the
-- create functions and alter_target.
CREATE FUNCTION outbox.check_broker_options(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF t.kind = 'nats' THEN
		PERFORM outbox.check_nats_target(t.url, t.subject);
	ELSE
		PERFORM outbox.check_kafka_target(t.url, t.topic, t.properties);
	END IF;
	IF t.batch_size IS NULL OR t.batch_size < 1 OR t.batch_size > 1000 THEN
		RAISE EXCEPTION 'batch_size must be between 1 and 1000, not %', t.batch_size
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'It is how many messages of different keys a lane has waiting for their acknowledgements.';
	END IF;
	IF t.ordering IS NULL OR t.ordering NOT IN ('key', 'strict') THEN
		RAISE EXCEPTION 'ordering must be ''key'' or ''strict'', not %', quote_nullable(t.ordering)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = '''key'' keeps order per key and publishes keys concurrently; ''strict'' publishes one message at a time, in commit order.';
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
REVOKE ALL ON FUNCTION outbox.check_broker_options(outbox.targets) FROM PUBLIC;

-- add_target stores the subject, topic and properties too.
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
									client_key, envelope_only, subject, topic, properties)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000),
				target.ca_file, target.client_cert, target.client_key,
				coalesce(target.envelope_only, false), target.subject, target.topic,
				target.properties)
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

-- A target that publishes messages into NATS JetStream streams.
CREATE FUNCTION outbox.create_nats_target(
	name		 text,
	url			 text,
	subject		 text	DEFAULT '{topic}',
	batch_size	 int	DEFAULT 100,
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
BEGIN
	PERFORM outbox.check_target_name(name);
	t.name := name;
	t.kind := 'nats';
	t.url := url;
	t.subject := subject;
	t.batch_size := batch_size;
	t.lanes := lanes;
	t.ordering := ordering;
	t.max_attempts := max_attempts;
	t.timeout_ms := timeout_ms;
	PERFORM outbox.check_broker_options(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
	UPDATE outbox.targets x SET subject = t.subject WHERE x.name = t.name;
END
$$;
COMMENT ON FUNCTION outbox.create_nats_target(text, text, text, int, int, text, int, int) IS
	'create a target that publishes messages into NATS JetStream, each acknowledged by its stream';
REVOKE ALL ON FUNCTION outbox.create_nats_target(text, text, text, int, int, text, int, int) FROM PUBLIC;

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
	timeout_ms	 int	DEFAULT 30000)
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
	PERFORM outbox.check_broker_options(t);
	IF ordering = 'strict' THEN
		t.lanes := 1;
	END IF;
	PERFORM outbox.add_target(t);
END
$$;
COMMENT ON FUNCTION outbox.create_kafka_target(text, text, text, jsonb, int, int, text, int, int) IS
	'create a target that produces messages into Kafka topics, with an idempotent producer';
REVOKE ALL ON FUNCTION outbox.create_kafka_target(text, text, text, jsonb, int, int, text, int, int) FROM PUBLIC;

DROP FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean);
-- Change a target's options; NULL leaves an option as it is.  secret => ''
-- removes the secret, max_rate => 0 removes the rate limit, disable_after
-- => interval '0' never disables.  Takes effect without a restart: the
-- next request uses the new URL, headers, secret, batch size, timeout and
-- rate; new lanes or ordering once the target's lanes are idle (the relay
-- stops reading for it, delivers what it holds, then redistributes keys).
-- A NATS target takes url, subject, batch_size, lanes, ordering,
-- max_attempts, timeout_ms, max_rate and disable_after; a Kafka target the
-- same with topic and properties instead of subject (url is its brokers).  Returns the number
-- of options changed.
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
	properties	  jsonb		DEFAULT NULL)
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
	IF old.kind NOT IN ('http', 'nats', 'kafka') AND (url IS NOT NULL OR batch_size IS NOT NULL
													  OR lanes IS NOT NULL OR ordering IS NOT NULL
													  OR timeout_ms IS NOT NULL OR max_rate IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, NATS and Kafka targets have a URL (brokers), batches, lanes, a timeout or a rate.';
	END IF;
	IF old.kind <> 'http' AND (headers IS NOT NULL OR secret IS NOT NULL OR ca_file IS NOT NULL
							   OR client_cert IS NOT NULL OR client_key IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets have headers, a secret or TLS files.';
	END IF;
	IF old.kind <> 'nats' AND subject IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NATS targets have a subject.';
	END IF;
	IF old.kind <> 'kafka' AND (topic IS NOT NULL OR properties IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Kafka targets have a topic and properties.';
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
	IF t.secret IS NULL THEN
		t.previous_secret := NULL;	-- an unsigned target has nothing to rotate
	END IF;
	IF old.kind = 'http' THEN
		PERFORM outbox.check_http_target(t);
	ELSIF old.kind IN ('nats', 'kafka') THEN
		PERFORM outbox.check_broker_options(t);
	ELSE
		PERFORM outbox.check_target_options(t);
	END IF;
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
		+ (t.properties IS DISTINCT FROM old.properties)::int;

	UPDATE outbox.targets x
	   SET url = t.url, headers = t.headers, secret = t.secret, batch_size = t.batch_size,
		   max_attempts = t.max_attempts, timeout_ms = t.timeout_ms, max_rate = t.max_rate,
		   disable_after = t.disable_after, previous_secret = t.previous_secret,
		   ca_file = t.ca_file, client_cert = t.client_cert, client_key = t.client_key,
		   envelope_only = t.envelope_only, subject = t.subject, topic = t.topic,
		   properties = t.properties,
		   pending_lanes = CASE WHEN t.lanes = old.lanes THEN NULL ELSE t.lanes END,
		   pending_ordering = CASE WHEN t.ordering = old.ordering THEN NULL ELSE t.ordering END
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;
COMMENT ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb) IS
	'change a target''s options without a restart; returns how many changed';
REVOKE ALL ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb) FROM PUBLIC;

---------------------------------------------------------------------------
-- One outbox per database: the relay of every database, seen from any.
---------------------------------------------------------------------------

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

CREATE VIEW outbox.relays AS
SELECT datid, database, pid, state, started_at, last_error
  FROM outbox.relay_status()
 ORDER BY database;
COMMENT ON VIEW outbox.relays IS
	'the relay of every database with the extension (superusers: it names every database)';
REVOKE ALL ON outbox.relays FROM PUBLIC;

---------------------------------------------------------------------------
-- Failover-safe delivery (outbox.standby_slots): the slots' state, in
-- outbox.worker and outbox.metrics().
---------------------------------------------------------------------------

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

CREATE OR REPLACE VIEW outbox.worker AS
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

CREATE OR REPLACE FUNCTION outbox.metrics()
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
		(18, 'outbox_standby_behind_bytes', 'gauge', 'WAL from what the slot''s standby flushed to the newest commit that emitted messages.')),
	 sb AS MATERIALIZED (SELECT * FROM outbox.standby_status()),
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
			   || sb.behind_bytes FROM sb WHERE sb.behind_bytes IS NOT NULL)
SELECT string_agg(block, '' ORDER BY ord)
  FROM (SELECT f.ord,
			   '# HELP ' || f.name || ' ' || f.help || E'\n# TYPE ' || f.name || ' ' || f.type || E'\n'
			   || coalesce(string_agg(x.line || E'\n', '' ORDER BY x.k1, x.k2), '') AS block
		  FROM fam f LEFT JOIN samples x ON x.ord = f.ord
		 GROUP BY f.ord, f.name, f.type, f.help) blocks
$$;
GRANT EXECUTE ON FUNCTION outbox.standby_status() TO outbox_monitor;

---------------------------------------------------------------------------
-- Formats consumers parse: CloudEvents 1.0 on HTTP, NATS and Kafka
-- targets (format, and source: the event's source attribute).
---------------------------------------------------------------------------

ALTER TABLE outbox.targets
	ADD COLUMN format text NOT NULL DEFAULT 'outbox'
		CONSTRAINT targets_format_check
		CHECK (format IN ('outbox', 'cloudevents', 'cloudevents-structured')),
	ADD COLUMN ce_source text
		CONSTRAINT targets_ce_source_check
		CHECK (ce_source IS NULL OR (octet_length(ce_source) BETWEEN 1 AND 1024
									 AND ce_source !~ '[[:cntrl:][:space:]]'));

-- The format options of a target: which kinds take which format, and a
-- source the CloudEvents attribute can carry.
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
	IF t.format <> 'outbox' AND t.kind NOT IN ('http', 'nats', 'kafka') THEN
		RAISE EXCEPTION 'a % target cannot send CloudEvents', upper(t.kind)
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'CloudEvents go to HTTP, NATS and Kafka targets; NOTIFY sends outbox envelopes only.',
				  HINT = 'Use an HTTP, NATS or Kafka target for CloudEvents consumers.';
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

-- add_target stores the format and source too.
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
									format, ce_source)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000),
				target.ca_file, target.client_cert, target.client_key,
				coalesce(target.envelope_only, false), target.subject, target.topic,
				target.properties, coalesce(target.format, 'outbox'), target.ce_source)
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

DROP FUNCTION outbox.create_http_target(text, text, jsonb, text, int, int, text, int, int, text, text, text);
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

DROP FUNCTION outbox.create_nats_target(text, text, text, int, int, text, int, int);
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

DROP FUNCTION outbox.create_kafka_target(text, text, text, jsonb, int, int, text, int, int);
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

DROP FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb);
-- Change a target's options; NULL leaves an option as it is (see the
-- previous definition); format and source as at create, source => ''
-- removes the source (the default is used).
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
	source		  text		DEFAULT NULL)
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
	IF old.kind NOT IN ('http', 'nats', 'kafka') AND (url IS NOT NULL OR batch_size IS NOT NULL
													  OR lanes IS NOT NULL OR ordering IS NOT NULL
													  OR timeout_ms IS NOT NULL OR max_rate IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, NATS and Kafka targets have a URL (brokers), batches, lanes, a timeout or a rate.';
	END IF;
	IF old.kind <> 'http' AND (headers IS NOT NULL OR secret IS NOT NULL OR ca_file IS NOT NULL
							   OR client_cert IS NOT NULL OR client_key IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets have headers, a secret or TLS files.';
	END IF;
	IF old.kind <> 'nats' AND subject IS NOT NULL THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only NATS targets have a subject.';
	END IF;
	IF old.kind <> 'kafka' AND (topic IS NOT NULL OR properties IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Kafka targets have a topic and properties.';
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
	IF t.secret IS NULL THEN
		t.previous_secret := NULL;	-- an unsigned target has nothing to rotate
	END IF;
	IF old.kind = 'http' THEN
		PERFORM outbox.check_http_target(t);
	ELSIF old.kind IN ('nats', 'kafka') THEN
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
		+ (t.ce_source IS DISTINCT FROM old.ce_source)::int;

	UPDATE outbox.targets x
	   SET url = t.url, headers = t.headers, secret = t.secret, batch_size = t.batch_size,
		   max_attempts = t.max_attempts, timeout_ms = t.timeout_ms, max_rate = t.max_rate,
		   disable_after = t.disable_after, previous_secret = t.previous_secret,
		   ca_file = t.ca_file, client_cert = t.client_cert, client_key = t.client_key,
		   envelope_only = t.envelope_only, subject = t.subject, topic = t.topic,
		   properties = t.properties, format = t.format, ce_source = t.ce_source,
		   pending_lanes = CASE WHEN t.lanes = old.lanes THEN NULL ELSE t.lanes END,
		   pending_ordering = CASE WHEN t.ordering = old.ordering THEN NULL ELSE t.ordering END
	 WHERE x.id = tid;
	PERFORM outbox.config_changed();
	RETURN n;
END
$$;
COMMENT ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb, text, text) IS
	'change a target''s options without a restart; returns how many changed';
REVOKE ALL ON FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb, text, text) FROM PUBLIC;

---------------------------------------------------------------------------
-- Per-subscription filters: a jsonpath over the message's document.
---------------------------------------------------------------------------

ALTER TABLE outbox.subscriptions ADD COLUMN filter jsonpath;
COMMENT ON COLUMN outbox.subscriptions.filter IS
	'jsonpath over {"topic", "key", "headers", "payload"} a message must match, or NULL';

DROP FUNCTION outbox.subscribe(text, text);
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

-- Per target, the messages its subscriptions' filters turned away (since
-- the relay started or outbox.reset_stats()).
CREATE FUNCTION outbox.target_filtered(OUT target_id int, OUT filtered bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'outbox_target_filtered'
LANGUAGE C VOLATILE STRICT PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION outbox.target_filtered() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.target_filtered() TO outbox_monitor;

CREATE OR REPLACE VIEW outbox.stats AS
SELECT t.name AS target, s.state, s.messages, s.requests, s.bytes, s.retries, s.dead_letters,
	   s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.window_messages, s.in_flight, s.failed_attempts,
	   s.last_success_at, s.reset_at, coalesce(f.filtered, 0) AS filtered
  FROM outbox.target_stats() s
  JOIN outbox.targets t ON t.id = s.target_id
  LEFT JOIN outbox.target_filtered() f ON f.target_id = s.target_id;

CREATE OR REPLACE FUNCTION outbox.metrics()
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


---------------------------------------------------------------------------
-- Redis Streams targets (src/relay_redis.c): each message appended to a
-- stream with XADD, together with a de-duplication mark of its id, in one
-- script run on the server, so a message sent again within the window is
-- not appended twice.  RabbitMQ targets (src/relay_rabbitmq.c): each
-- message published with AMQP 0-9-1 on a channel in confirm mode,
-- persistent and mandatory, and waited for the broker's confirm.
---------------------------------------------------------------------------
ALTER TABLE outbox.targets
	ADD COLUMN stream text,				-- Redis: the stream's key template
	ADD COLUMN maxlen bigint,			-- Redis: approximate MAXLEN, NULL none
	ADD COLUMN dedup_window int,		-- Redis: seconds a de-dup mark lives, 0 none
	ADD COLUMN exchange text,			-- RabbitMQ: the exchange ('' the default)
	ADD COLUMN routing_key text;		-- RabbitMQ: the routing key template
ALTER TABLE outbox.targets DROP CONSTRAINT targets_kind_check,
	ADD CONSTRAINT targets_kind_check
		CHECK (kind IN ('http', 'notify', 'queue', 'nats', 'kafka', 'redis', 'rabbitmq'));
ALTER TABLE outbox.targets DROP CONSTRAINT targets_check,
	ADD CONSTRAINT targets_check
		CHECK ((kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq')) = (url IS NOT NULL));
ALTER TABLE outbox.targets DROP CONSTRAINT targets_lanes_check,
	ADD CONSTRAINT targets_lanes_check
		CHECK (lanes BETWEEN 1 AND 256 AND (kind IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq') OR lanes = 1)),
	ADD CONSTRAINT targets_stream_check
		CHECK ((kind = 'redis') = (stream IS NOT NULL) AND octet_length(stream) BETWEEN 1 AND 1024),
	ADD CONSTRAINT targets_maxlen_check
		CHECK (maxlen IS NULL OR (kind = 'redis' AND maxlen >= 1)),
	ADD CONSTRAINT targets_dedup_window_check
		CHECK ((kind = 'redis') = (dedup_window IS NOT NULL) AND dedup_window BETWEEN 0 AND 2592000),
	ADD CONSTRAINT targets_exchange_check
		CHECK ((kind = 'rabbitmq') = (exchange IS NOT NULL) AND octet_length(exchange) <= 255),
	ADD CONSTRAINT targets_routing_key_check
		CHECK ((kind = 'rabbitmq') = (routing_key IS NOT NULL) AND octet_length(routing_key) <= 255);
-- Redis, RabbitMQ and NATS targets verify their servers' certificates as
-- HTTP targets do, with the same TLS files (src/relay_conn.c,
-- src/relay_tls.c; libnats for NATS); a NATS target may log in with a
-- .creds file or an NKey seed file (credentials).
ALTER TABLE outbox.targets DROP CONSTRAINT targets_ca_file_check,
	ADD CONSTRAINT targets_ca_file_check
		CHECK (ca_file IS NULL OR (ca_file ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats'))),
	DROP CONSTRAINT targets_client_cert_check,
	ADD CONSTRAINT targets_client_cert_check
		CHECK (client_cert IS NULL OR (client_cert ~ '^/' AND kind IN ('http', 'redis', 'rabbitmq', 'nats'))),
	ADD COLUMN credentials text
		CONSTRAINT targets_credentials_check CHECK (credentials IS NULL OR (credentials ~ '^/' AND kind = 'nats'));
COMMENT ON COLUMN outbox.targets.credentials IS
	'NATS: a .creds file (a user JWT and its NKey seed) or an NKey seed file the relay logs in with';

-- Whether a file is a NATS .creds file or a user's NKey seed (in C: the
-- relay reads it so).
CREATE FUNCTION outbox.check_nats_credentials(path text)
RETURNS void
LANGUAGE C STRICT
SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'outbox_check_nats_credentials';
REVOKE ALL ON FUNCTION outbox.check_nats_credentials(text) FROM PUBLIC;
COMMENT ON COLUMN outbox.targets.stream IS
	'Redis: the key of the stream each message is appended to, {topic} and {key} filled in';
COMMENT ON COLUMN outbox.targets.maxlen IS
	'Redis: the stream is trimmed to about this many entries (XADD MAXLEN ~), NULL for never';
COMMENT ON COLUMN outbox.targets.dedup_window IS
	'Redis: seconds the mark of an appended message id lives; a message sent again within it is not appended again (0: no marks)';
COMMENT ON COLUMN outbox.targets.exchange IS
	'RabbitMQ: the exchange each message is published to ('''' is the default exchange, which routes to the queue the routing key names)';
COMMENT ON COLUMN outbox.targets.routing_key IS
	'RabbitMQ: the routing key, {topic} and {key} filled in';

-- TLS files go with a URL that asks for TLS: https:// for HTTP targets,
-- rediss:// for Redis targets, amqps:// for RabbitMQ targets, tls:// for
-- NATS targets.  Only superusers and members of pg_read_server_files name
-- them, or a NATS target's credentials: the relay reads them as the
-- server.
CREATE OR REPLACE FUNCTION outbox.check_tls_files(t outbox.targets)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f record;
	scheme text := CASE t.kind WHEN 'http' THEN 'https://' WHEN 'redis' THEN 'rediss://'
								WHEN 'rabbitmq' THEN 'amqps://' WHEN 'nats' THEN 'tls://' END;
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
				  DETAIL = 'ca_file, client_cert and client_key go to HTTP, Redis, RabbitMQ and NATS targets.';
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
	IF t.ordering IS NULL OR t.ordering NOT IN ('key', 'strict') THEN
		RAISE EXCEPTION 'ordering must be ''key'' or ''strict'', not %', quote_nullable(t.ordering)
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = '''key'' keeps order per key and publishes keys concurrently; ''strict'' publishes one message at a time, in commit order.';
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
	PERFORM outbox.check_tls_files(t);
END
$$;

-- CloudEvents go to HTTP, NATS, Kafka and RabbitMQ targets, and, in
-- structured mode (the event in one field), to Redis targets.
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
	IF t.format <> 'outbox' AND t.kind NOT IN ('http', 'nats', 'kafka', 'rabbitmq', 'redis') THEN
		RAISE EXCEPTION 'a % target cannot send CloudEvents', upper(t.kind)
			USING ERRCODE = 'feature_not_supported',
				  DETAIL = 'CloudEvents go to HTTP, NATS, Kafka, RabbitMQ and Redis targets; NOTIFY sends outbox envelopes only.',
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

-- add_target stores the stream, maxlen, dedup_window, exchange and
-- routing key too.
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
									exchange, routing_key, credentials)
		VALUES (target.name, target.kind, target.url, coalesce(target.headers, '{}'), target.secret,
				target.channel, coalesce(target.batch_size, 1), target.lanes, target.ordering,
				coalesce(target.max_attempts, 10), coalesce(target.timeout_ms, 10000),
				target.ca_file, target.client_cert, target.client_key,
				coalesce(target.envelope_only, false), target.subject, target.topic,
				target.properties, coalesce(target.format, 'outbox'), target.ce_source,
				target.stream, target.maxlen, target.dedup_window,
				target.exchange, target.routing_key, target.credentials)
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

---------------------------------------------------------------------------
-- Destinations the broker does not take, and messages set aside (issue 41)
---------------------------------------------------------------------------

-- A destination filled in from a message's topic or key that the broker
-- does not take (no stream or binding covers the subject or routing key,
-- the cluster has no such Kafka topic) is the message's own failure: its
-- lane retries it, the rest of the target goes on, and after
-- unroutable_after from its first refusal it is a dead letter (NULL: it
-- is retried for ever).
ALTER TABLE outbox.targets
	ADD COLUMN unroutable_after interval DEFAULT interval '10 minutes'
		CHECK (unroutable_after > interval '0');
COMMENT ON COLUMN outbox.targets.unroutable_after IS
	'how long a message whose filled-in destination the broker does not take is retried before it is a dead letter (NULL: for ever)';

-- failing_id: the message a lane's last_error is about, while it fails
-- (written by the relay); set_aside_id and set_aside_reason: a request of
-- outbox.set_aside(), cleared by the relay once it acted on it.
ALTER TABLE outbox.progress
	ADD COLUMN failing_id bigint,
	ADD COLUMN set_aside_id bigint,
	ADD COLUMN set_aside_reason text;
COMMENT ON COLUMN outbox.progress.failing_id IS
	'the message the lane''s last_error is about, while the lane retries it';
COMMENT ON COLUMN outbox.progress.set_aside_id IS
	'asked by outbox.set_aside(): the relay makes this message a dead letter if it is still the lane''s failing head';

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

DROP FUNCTION outbox.alter_target(text, text, jsonb, text, int, int, text, int, int, float8, interval, text, text, text, boolean, text, text, jsonb, text, text);
-- Change a target's options; NULL leaves an option as it is (see the
-- previous definitions).  A Redis target takes url, stream, maxlen
-- (maxlen => 0 never trims), dedup_window, batch_size, lanes, ordering,
-- max_attempts, timeout_ms, max_rate and disable_after; a RabbitMQ
-- target the same with exchange and routing_key instead of stream,
-- maxlen and dedup_window.  unroutable_after (NATS, Kafka and RabbitMQ
-- targets): how long a message whose filled-in destination the broker
-- does not take is retried, interval '0' for ever.
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
	IF old.kind NOT IN ('http', 'nats', 'kafka', 'redis', 'rabbitmq') AND (url IS NOT NULL OR batch_size IS NOT NULL
													  OR lanes IS NOT NULL OR ordering IS NOT NULL
													  OR timeout_ms IS NOT NULL OR max_rate IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, NATS, Kafka, Redis and RabbitMQ targets have a URL (brokers), batches, lanes, a timeout or a rate.';
	END IF;
	IF old.kind <> 'http' AND (headers IS NOT NULL OR secret IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP targets have headers and a secret.';
	END IF;
	IF old.kind NOT IN ('http', 'redis', 'rabbitmq', 'nats') AND (ca_file IS NOT NULL OR client_cert IS NOT NULL
																  OR client_key IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only HTTP, Redis, RabbitMQ and NATS targets have TLS files.';
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
	IF old.kind <> 'kafka' AND (topic IS NOT NULL OR properties IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Kafka targets have a topic and properties.';
	END IF;
	IF old.kind <> 'redis' AND (stream IS NOT NULL OR maxlen IS NOT NULL OR dedup_window IS NOT NULL) THEN
		RAISE EXCEPTION 'target "%" is a % target', name, old.kind
			USING ERRCODE = 'wrong_object_type',
				  DETAIL = 'Only Redis targets have a stream, maxlen and dedup_window.';
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
	IF t.secret IS NULL THEN
		t.previous_secret := NULL;	-- an unsigned target has nothing to rotate
	END IF;
	IF old.kind = 'http' THEN
		PERFORM outbox.check_http_target(t);
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
		   unroutable_after = t.unroutable_after, credentials = t.credentials,
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

-- Comments of 0.2's objects that 0.3 changed or 0.2 lacked.
COMMENT ON TABLE outbox.targets IS 'delivery targets: HTTP endpoints, NOTIFY channels, queues, NATS JetStream, Kafka, Redis Streams and RabbitMQ';
COMMENT ON FUNCTION outbox.unsubscribe(text, text) IS
	'stop delivering a pattern''s topics to a target (a NOTICE if it was not subscribed)';
COMMENT ON FUNCTION outbox.drop_target(text) IS
	'remove a target with its subscriptions, progress and a queue''s receipts; its dead letters stay';
