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
