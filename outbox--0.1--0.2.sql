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
