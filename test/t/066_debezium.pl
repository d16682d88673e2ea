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

# A WAL capture's snapshot: read events, the last one so marked.
my @snap = grep { ($_->{topic} // '') eq 'postgres.public.stock' } @ev;
# (different keys: in any order of arrival)
is_deeply([ sort map { "$_->{v}{op} $_->{v}{source}{snapshot} $_->{key}" } @snap ],
	[ 'r last {"sku":"b"}', 'r true {"sku":"a"}' ], 'WAL capture with a snapshot: op r, snapshot true then last');

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

stop_sink($sink);
relay_no_crash($node);
done_testing();
