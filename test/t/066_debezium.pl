# Debezium-compatible change events (issue 29, item 2) in WAL mode, and in
# both modes through a transport: what the HTTP receiver gets is the
# connector's envelope, its source block (lsn, sequence, txId and ts_ms of
# the commit, from the WAL), its key object and topic; REPLICA IDENTITY
# DEFAULT and FULL give the before the connector gives, a change of the
# key is a delete and a create; an unchanged
# TOASTed value is the connector's placeholder; an outbox table is routed
# as Debezium's outbox event router does.  pg_regress debezium covers
# trigger mode value by value.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;

my $node = relay_node('debezium', conf => q{
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
});
allow_output_plugins($node);
sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $sink = start_sink('debezium');
my $url = $sink->{url};
my $json = json_codec();

q1(qq{
CREATE TABLE customers (id int PRIMARY KEY, first_name text, last_name text, email text);
CREATE TABLE customers_full (id int PRIMARY KEY, first_name text, last_name text, email text);
ALTER TABLE customers_full REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs ALTER body SET STORAGE EXTERNAL;
CREATE TABLE trig (id int PRIMARY KEY, v text);
CREATE TABLE docs_outbox (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs_outbox ALTER body SET STORAGE EXTERNAL;
CREATE TABLE outbox_events (
	id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
	type varchar(255) NOT NULL, payload jsonb);
CREATE TABLE xids (label text, xid xid8);
CREATE TABLE stock (sku text PRIMARY KEY, n int);
INSERT INTO stock VALUES ('a', 1), ('b', 2);
SELECT outbox.capture('customers', mode => 'wal', format => 'debezium', topic_prefix => 'PostgreSQL_server');
SELECT outbox.capture('customers_full', mode => 'wal', format => 'debezium', topic_prefix => 'PostgreSQL_server');
SELECT outbox.capture('docs', mode => 'wal', format => 'debezium');
SELECT outbox.capture('docs_outbox', mode => 'wal');
SELECT outbox.capture('outbox_events', mode => 'wal', format => 'debezium-outbox');
SELECT outbox.capture('trig', format => 'debezium', topic_prefix => 'PostgreSQL_server');
SELECT outbox.create_http_target('t', '$url/t');
SELECT outbox.subscribe('t', '*');
});
q1(q{SELECT outbox.capture('stock', mode => 'wal', format => 'debezium', snapshot => true)});

# One transaction per step, its xid kept (xids is not captured).
my @steps = (
	[ 'create', q{INSERT INTO customers VALUES (1, 'Anne', 'Kretchmar', 'annek@noanswer.org');
		INSERT INTO customers_full VALUES (1, 'Anne', 'Kretchmar', 'annek@noanswer.org')} ],
	[ 'update', q{UPDATE customers SET first_name = 'Anne Marie' WHERE id = 1;
		UPDATE customers_full SET first_name = 'Anne Marie' WHERE id = 1} ],
	[ 'rekey', q{UPDATE customers SET id = 2 WHERE id = 1} ],
	[ 'delete', q{DELETE FROM customers WHERE id = 2; DELETE FROM customers_full WHERE id = 1} ],
	[ 'truncate', q{TRUNCATE customers} ],
	[ 'toast', q{INSERT INTO docs SELECT 1, 'a', string_agg(md5(g::text), '') FROM generate_series(1, 200) g} ],
	[ 'toast update', q{UPDATE docs SET title = 'b' WHERE id = 1} ],
	[ 'toast rekey', q{UPDATE docs SET id = 2 WHERE id = 1} ],
	[ 'toast rekey, outbox format', q{INSERT INTO docs_outbox SELECT 1, 'a', string_agg(md5(g::text), '') FROM generate_series(1, 200) g;
		UPDATE docs_outbox SET id = 2 WHERE id = 1} ],
	[ 'router', q{INSERT INTO outbox_events VALUES ('6d7a3c2e-5b1f-4a8e-9c1d-2f3e4a5b6c7d', 'Order', '123',
		'OrderCreated', '{"id": 123, "customerId": 456}')} ],
	[ 'trigger', q{INSERT INTO trig VALUES (1, 'x')} ]);
for my $s (@steps)
{
	q1("BEGIN; $s->[1]; INSERT INTO xids SELECT '$s->[0]', pg_current_xact_id(); COMMIT;");
}
my %xid = map { split /\|/ } split /\n/, q1(q{SELECT label, xid FROM xids});

my $n = 2 + 2 + 2 + 2 + 1 + 1 + 1 + 2 + 2 + 1 + 1 + 2;
my @r = sink_path_records($sink, '/t', $n);
is(scalar(@r), $n, "all $n messages arrived");

# By topic and op (the order of arrival is the commit order).
my @ev;
for my $r (@r)
{
	my $h = $r->{headers};
	push @ev, { topic => $h->{'outbox-topic'}, key => $h->{'outbox-key'}, h => $h,
		v => $json->decode($r->{body}) };
}
# The event of a topic and op, and of a key when given.  Events of different
# keys arrive in any order (lanes): never pick one by its place.
sub evs_of
{
	my ($topic, $op, $key) = @_;
	return grep {
		($_->{topic} // '') eq $topic && ($_->{v}{op} // '') eq $op
		  && (!defined $key || ($_->{key} // '') eq $key)
	} @ev;
}
sub ev_of { my @m = evs_of(@_); return $m[0]; }
my $cust = 'PostgreSQL_server.public.customers';
my $full = 'PostgreSQL_server.public.customers_full';
my $anne = { id => 1, first_name => 'Anne', last_name => 'Kretchmar', email => 'annek@noanswer.org' };
my $anne2 = { %$anne, first_name => 'Anne Marie' };

my $c = ev_of($cust, 'c', '{"id":1}');
ok($c, 'create: op c on topic <prefix>.<schema>.<table>');
is_deeply($c->{v}{after}, $anne, 'create: after is the row');
is($c->{v}{before}, undef, 'create: before is null');
is($c->{key}, '{"id":1}', 'create: the key is the key object');
my $s = $c->{v}{source};
is_deeply([ @$s{qw(connector name db schema table snapshot)} ],
	[ 'postgresql', 'PostgreSQL_server', 'postgres', 'public', 'customers', 'false' ],
	'source: connector, name, db, schema, table, snapshot');
is($s->{txId}, $xid{create} % 4294967296, 'source.txId: the writing transaction');
ok($s->{lsn} =~ /^\d+$/ && $s->{lsn} > 0, 'source.lsn: the change\'s LSN, a number');
my @seq = @{ $json->decode($s->{sequence}) };
ok(@seq == 2 && $seq[1] eq "$s->{lsn}" && $seq[0] =~ /^\d+$/ && $seq[0] > $s->{lsn},
	'source.sequence: ["<commit LSN>", "<change LSN>"]') or diag($s->{sequence});
# the commit time: the source-commit-time header, to the millisecond
my $ct = $c->{h}{'source-commit-time'};
my $ms = q1(qq{SELECT floor(extract(epoch FROM '$ct'::timestamptz) * 1000)::bigint});
is($s->{ts_ms}, $ms, 'source.ts_ms: the commit time');
ok($c->{v}{ts_ms} >= $s->{ts_ms}, 'ts_ms: when the change was captured, after the commit');
is($c->{v}{transaction}, undef, 'transaction: null');
my $cf = ev_of($full, 'c');
is($cf->{v}{source}{lsn} > $s->{lsn} ? 1 : 0, 1, 'a later change of the transaction has a later LSN');
is($cf->{v}{source}{sequence}, qq{["$seq[0]","$cf->{v}{source}{lsn}"]},
	'... and the same commit LSN in its sequence');

my $u = ev_of($cust, 'u');
is($u->{v}{before}, undef, 'update, REPLICA IDENTITY DEFAULT: before is null');
is_deeply($u->{v}{after}, $anne2, 'update: after is the new row');
is_deeply(ev_of($full, 'u')->{v}{before}, $anne, 'update, REPLICA IDENTITY FULL: before is the old row');
# a change of the key: a delete of the old key, then a create of the new
my $rd = ev_of($cust, 'd', '{"id":1}');
is_deeply($rd->{v}{before}, { id => 1, first_name => undef, last_name => undef, email => undef },
	'update of the key, DEFAULT: a delete with the old key, the rest null');
is($rd->{key}, '{"id":1}', '... keyed by the old key');
my $rc = ev_of($cust, 'c', '{"id":2}');
is_deeply($rc->{v}{after}, { %$anne2, id => 2 }, '... then a create of the new row');
is($rc->{key}, '{"id":2}', '... keyed by the new key');
is(scalar(evs_of($cust, 'u')), 1, '... and no update (the one update is the first one)');
is($rd->{v}{source}{txId}, $xid{rekey} % 4294967296, '... both in the transaction');

my $d = ev_of($cust, 'd', '{"id":2}');
is_deeply($d->{v}{before}, { id => 2, first_name => undef, last_name => undef, email => undef },
	'delete, DEFAULT: before has the key, the rest null');
is($d->{v}{after}, undef, 'delete: after is null');
is($d->{key}, '{"id":2}', 'delete: the key');
is_deeply(ev_of($full, 'd')->{v}{before}, $anne2, 'delete, FULL: before is the old row');

my $t = ev_of($cust, 't');
ok($t && !defined $t->{v}{before} && !defined $t->{v}{after} && !defined $t->{key},
	'truncate: op t, no rows, no key');
is($t->{v}{source}{txId}, $xid{truncate} % 4294967296, 'truncate: its transaction');

my $doc = 'postgres.public.docs';
is(length(ev_of($doc, 'c', '{"id":1}')->{v}{after}{body}), 6400, 'a TOASTed value is sent in full when written');
my $tu = ev_of($doc, 'u');
is($tu->{v}{after}{body}, '__debezium_unavailable_value',
	'an unchanged TOASTed value not in the WAL: the connector\'s placeholder');
is($tu->{v}{after}{title}, 'b', '... the other columns as they are');
# a key change under REPLICA IDENTITY DEFAULT: the old row in the WAL has
# the key only, never the other columns' values (nulls there are not values)
is(ev_of($doc, 'd')->{key}, '{"id":1}', 'key change of a row with a TOASTed value: the delete');
my $tc = ev_of($doc, 'c', '{"id":2}');
is($tc->{key}, '{"id":2}', '... the create');
is($tc->{v}{after}{body}, '__debezium_unavailable_value', '... whose unchanged TOASTed value is the placeholder, not null');
is($tc->{v}{after}{title}, 'b', '... and whose other columns are the row\'s');

# The same in outbox's own format: the value is left out and listed as
# unchanged, not null.
my $ou = ev_of('public.docs_outbox', 'update');
ok($ou && !exists $ou->{v}{after}{body}, 'outbox format, key change: the unchanged TOASTed value is left out')
  or diag(explain($ou->{v}));
is_deeply($ou->{v}{unchanged}, ['body'], '... and listed as unchanged');

# A WAL capture's snapshot: read events, the first and the last so marked
# (source.snapshot "first", "last": the connector's SnapshotRecord).
my @snap = grep { ($_->{topic} // '') eq 'postgres.public.stock' } @ev;
# (different keys: in any order of arrival)
is_deeply([ sort map { "$_->{v}{op} $_->{v}{source}{snapshot} $_->{key}" } @snap ],
	[ 'r first {"sku":"a"}', 'r last {"sku":"b"}' ], 'WAL capture with a snapshot: op r, snapshot first then last');

my ($ro) = grep { $_->{topic} eq 'outbox.event.Order' } @ev;
ok($ro, 'router: topic outbox.event.<aggregatetype>');
is($ro->{key}, '123', 'router: key aggregateid');
is_deeply($ro->{v}, { id => 123, customerId => 456 }, 'router: the payload as it is');
is($ro->{h}{id}, '6d7a3c2e-5b1f-4a8e-9c1d-2f3e4a5b6c7d', 'router: header id');
is($ro->{h}{type}, undef, 'router: no type header (the router sends none by default)');

my $tr = ev_of('PostgreSQL_server.public.trig', 'c');
is_deeply($tr->{v}{after}, { id => 1, v => 'x' }, 'trigger mode through HTTP: the envelope');
is($tr->{v}{source}{lsn}, undef, 'trigger mode: no LSN (the commit is yet to come)');
is($tr->{v}{source}{txId}, $xid{trigger} % 4294967296, 'trigger mode: txId');

# Cases of the connector's own tests (debezium-connector-postgres,
# RecordsStreamProducerIT (SIT), AbstractRecordsProducerTest (ARPT)), in
# WAL mode, compared as jsonb (numbers as numbers):
#  - SIT shouldReceiveChangesForToastedText/VarcharArray/DateArray/
#    ByteaArray/IntArray/BigintArray/JsonArray/UuidArray/HstoreColumn...
#    (the update of a row leaving a TOASTed column unchanged): the
#    placeholder of the column's type, an array for an array column;
#  - ARPT schemaAndValuesForBinTypes(), ...ForGeomTypes(), the hstore,
#    oid and timetz-boundary cases (pg_regress debezium_cases has them
#    all in trigger mode).
my $big = q{(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 100) g)};
my @toast = (
	[ 'text[]', qq{ARRAY[$big]}, '["__debezium_unavailable_value"]' ],
	[ 'varchar(20000)[]', qq{ARRAY[$big]}, '["__debezium_unavailable_value"]' ],
	[ 'json[]', qq{ARRAY[to_json($big)]}, '["__debezium_unavailable_value"]' ],
	[ 'date[]', q{(SELECT array_agg('2022-12-12'::date + g) FROM generate_series(1, 2000) g)},
	  '[95,95,100,101,98,101,122,105,117,109,95,117,110,97,118,97,105,108,97,98,108,101,95,118,97,108,117,101]' ],
	[ 'int[]', q{(SELECT array_agg(g) FROM generate_series(1, 9999) g)},
	  '[95,95,100,101,98,101,122,105,117,109,95,117,110,97,118,97,105,108,97,98,108,101,95,118,97,108,117,101]' ],
	[ 'bigint[]', q{(SELECT array_agg(g::bigint) FROM generate_series(1, 9999) g)},
	  '[95,95,100,101,98,101,122,105,117,109,95,117,110,97,118,97,105,108,97,98,108,101,95,118,97,108,117,101]' ],
	[ 'bytea[]', qq{ARRAY[convert_to($big, 'UTF8')]}, '["X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="]' ],
	[ 'uuid[]', q{(SELECT array_agg(md5(g::text)::uuid) FROM generate_series(1, 400) g)},
	  '["b68a35a7-17ad-35b3-af2a-ae46edb4545a"]' ],
	[ 'hstore', qq{hstore('k', $big)}, '"{\"__debezium_unavailable_value\":\"__debezium_unavailable_value\"}"' ],
	[ 'text', $big, '"__debezium_unavailable_value"' ]);
q1(q{CREATE EXTENSION hstore});
my $i = 0;
for my $t (@toast)
{
	$i++;
	q1(qq{CREATE TABLE toast_$i (id int PRIMARY KEY, not_toast int, v $t->[0]);
		ALTER TABLE toast_$i ALTER v SET STORAGE EXTERNAL;
		SELECT outbox.capture('toast_$i', mode => 'wal', format => 'debezium');
		INSERT INTO toast_$i VALUES (1, 10, $t->[1]);
		UPDATE toast_$i SET not_toast = 2 WHERE id = 1;});
}
sub dbz_after
{
	my ($tbl, $op) = @_;
	return q1(qq{SELECT payload->'after' FROM outbox.messages
		WHERE payload->'source'->>'table' = '$tbl' AND payload->>'op' = '$op' ORDER BY id DESC LIMIT 1});
}
$i = 0;
for my $t (@toast)
{
	$i++;
	my $after;
	ok(wait_until(sub { ($after = dbz_after("toast_$i", 'u')) ne '' }), "$t->[0]: the update is captured");
	is(q1(qq{SELECT ('$after'::jsonb)->'v' = '$t->[2]'::jsonb}), 't',
		"SIT, a TOASTed $t->[0] left unchanged by an update: the connector's placeholder $t->[2]")
	  or diag($after);
	ok(q1(qq{SELECT ('$after'::jsonb)->>'not_toast'}) eq '2', "... and the changed column");
}

my @wal_cases = (
	[ 'bitbin_table', q{ba BYTEA, bol BIT(1), bol2 BIT, bs BIT(2), bs7 BIT(7), bv1 BIT VARYING(1),
		bv BIT VARYING(2), bv2 BIT VARYING(24), bvl BIT VARYING(64), bvunlimited1 BIT VARYING,
		bvunlimited2 BIT VARYING},
	  q{E'\\\\001\\\\002\\\\003'::bytea, '0'::bit(1), '1'::bit(1), '11'::bit(2), '1'::bit(7), '1'::bit varying(1),
		'00'::bit(2), '000000110000001000000001'::bit(24),
		'1000000000000000000000000000000000000000000000000000000000000000'::bit(64), '101',
		'111011010001000110000001000000001'},
	  '{"pk":1,"ba":"AQID","bol":false,"bol2":true,"bs":"Aw==","bs7":"QA==","bv1":true,"bv":"","bv2":"AQID","bvl":"AAAAAAAAAIA=","bvunlimited1":"BQ==","bvunlimited2":"AQIj2gE="}',
	  'ARPT schemaAndValuesForBinTypes()' ],
	[ 'geom_table', q{p POINT}, q{'(1,1)'::point},
	  '{"pk":1,"p":{"x":1.0,"y":1.0,"wkb":"AQEAAAAAAAAAAADwPwAAAAAAAPA/","srid":null}}',
	  'ARPT schemaAndValuesForGeomTypes()' ],
	[ 'hstore_table_mul', q{hs hstore, hsarr hstore[]},
	  q{'"key1" => "val1","key2" => "val2","key3" => "val3"', array['"key4" => "val4","key5" => NULL'::hstore, '"key6" => "val6"']},
	  '{"pk":1,"hs":"{\"key1\":\"val1\",\"key2\":\"val2\",\"key3\":\"val3\"}","hsarr":["{\"key5\":null,\"key4\":\"val4\"}","{\"key6\":\"val6\"}"]}',
	  'ARPT INSERT_HSTORE_TYPE_WITH_MULTIPLE_VALUES_STMT' ],
	[ 'oid_table', q{o OID, oa OID[]}, q{4000000000, '{3,4000000000}'},
	  '{"pk":1,"o":4000000000,"oa":[3,4000000000]}', 'ARPT schemasAndValuesForNumericType(), ...ForArrayTypes() (oid)' ],
	[ 'timetz_boundary_table', q{ttz0 TIME(0) WITH TIME ZONE, ttz6 TIME(6) WITH TIME ZONE, ttz TIMETZ},
	  q{'23:59:59.999999+00'::TIMETZ, '24:00:00+00'::TIMETZ, '13:51:30.120+02:00'},
	  '{"pk":1,"ttz0":"24:00:00Z","ttz6":"24:00:00Z","ttz":"11:51:30.12Z"}',
	  'SIT TIMETZ end-of-day boundary; ZonedTime (fraction without trailing zeros)' ],
	[ 'unknown_type_table', q{tsq tsquery, tokens varbit[]}, q{'fat <-> cat'::tsquery, '{101}'}, '{"pk":1}',
	  'ARPT INSERT_UNKNOWN_TYPE_STMT (include.unknown.datatypes false)' ]);
for my $c (@wal_cases)
{
	q1(qq{CREATE TABLE $c->[0] (pk SERIAL PRIMARY KEY, $c->[1]);
		SELECT outbox.capture('$c->[0]', mode => 'wal', format => 'debezium');
		INSERT INTO $c->[0] VALUES (DEFAULT, $c->[2]);});
}
for my $c (@wal_cases)
{
	my $after;
	ok(wait_until(sub { ($after = dbz_after($c->[0], 'c')) ne '' }), "$c->[0]: the insert is captured");
	my $want = $c->[3] =~ s/'/''/gr;
	is(q1(qq{SELECT '$after'::jsonb = '$want'::jsonb}), 't', "WAL mode, $c->[4]: $c->[0] as the connector writes it")
	  or diag($after);
}

stop_sink($sink);
relay_no_crash($node);
done_testing();
