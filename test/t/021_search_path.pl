# The relay runs no one else's code.  A non-superuser who owns the database
# shadows functions and operators the relay's queries use with look-alikes
# in a schema of theirs that try to make them superuser, and puts that
# schema first in the database's search_path.  After a restart, target
# changes and HTTP and NOTIFY delivery, they are still not a superuser, none
# of their functions ran, and every message arrived.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $node = relay_node('search_path');
my $sink = start_sink('search_path');

# The test's own sessions resolve names in pg_catalog only, so that only
# the relay could fall for the look-alikes (PGOPTIONS reaches psql's
# sessions, not the server's background workers).
$ENV{PGOPTIONS} = '-c search_path=pg_catalog,public';

sub sq
{
	my ($sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

sq(q{
CREATE ROLE mallory LOGIN;
ALTER DATABASE postgres OWNER TO mallory;
});

# Each look-alike logs its call and tries to promote mallory, then does what
# the real one does.
$node->safe_psql(
	'postgres', q{
SET ROLE mallory;
CREATE SCHEMA evil;
CREATE TABLE evil.calls (what text, by_superuser bool);
GRANT ALL ON SCHEMA evil TO PUBLIC;
GRANT ALL ON evil.calls TO PUBLIC;
CREATE FUNCTION evil.pwn(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO evil.calls VALUES (what, (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user));
	BEGIN
		ALTER ROLE mallory SUPERUSER;
	EXCEPTION WHEN OTHERS THEN NULL;
	END;
END $$;
CREATE FUNCTION evil.jsonb_each_text(j jsonb, OUT key text, OUT value text) RETURNS SETOF record
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('jsonb_each_text');
	RETURN QUERY SELECT * FROM pg_catalog.jsonb_each_text(j); END $$;
CREATE FUNCTION evil.textcat(a text, b text) RETURNS text
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('||'); RETURN pg_catalog.textcat(a, b); END $$;
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.textcat);
CREATE FUNCTION evil.int8gt(a bigint, b bigint) RETURNS bool
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('>'); RETURN pg_catalog.int8gt(a, b); END $$;
CREATE OPERATOR evil.> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.int8gt);
CREATE FUNCTION evil.int4eq(a int, b int) RETURNS bool
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('='); RETURN pg_catalog.int4eq(a, b); END $$;
CREATE OPERATOR evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.int4eq);
CREATE FUNCTION evil.greatest(a bigint, b bigint) RETURNS bigint
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('greatest'); RETURN CASE WHEN a > b THEN a ELSE b END; END $$;
CREATE FUNCTION evil.pg_notify(a text, b text) RETURNS void
	LANGUAGE plpgsql AS $$ BEGIN PERFORM evil.pwn('pg_notify'); PERFORM pg_catalog.pg_notify(a, b); END $$;
ALTER DATABASE postgres SET search_path = evil, pg_catalog, public;
});
# The database-level search_path reaches the relay when it next connects.
$node->restart;

sq(qq{
SELECT outbox.create_http_target('hook', '$sink->{url}/hook', headers => '{"x-a": "1", "x-b": "2"}');
SELECT outbox.subscribe('hook', '*');
SELECT outbox.create_notify_target('n', 'sp_channel');
SELECT outbox.subscribe('n', '*');
});
sq(q{SELECT count(outbox_emit('t.' || g, jsonb_build_object('g', g), 'k' || (g % 3))) FROM generate_series(1, 30) g});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'every message is delivered to both targets');
is(scalar(my @r = sink_path_records($sink, '/hook')), 30, 'the receiver got all 30 messages');

# A target change while running, then more messages.
sq(q{SELECT outbox.subscribe('hook', 'x.*'); SELECT count(outbox_emit('x.y', '{}')) FROM generate_series(1, 5)});
ok( $node->poll_query_until(
		'postgres',
		q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'and after a target change');

is(sq(q{SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'}), 'f',
	'the database owner is still not a superuser');
is(sq(q{SELECT count(*) FROM evil.calls WHERE by_superuser}), '0',
	'none of the look-alikes ran as a superuser');
is(sq(q{SELECT string_agg(DISTINCT what, ', ') FROM evil.calls}), '',
	'none of them ran at all');

stop_sink($sink);
relay_no_crash($node);
$node->stop;
done_testing();
