# Per-subscription filters (issue 29, item 4): outbox.subscribe(target,
# pattern, filter => '<jsonpath>') over the document {"topic", "key",
# "headers", "payload"}, evaluated by the relay for HTTP, NOTIFY, NATS and
# Kafka targets and by outbox.receive() for queues:
#  - a predicate on a payload field, on a header, on the key and on the op
#    of a captured change; a non-predicate path (selects when it yields an
#    item); two subscriptions of a target, either matching;
#  - what no filter selects is not sent and is counted in outbox.stats and
#    outbox.metrics() (outbox_filtered_messages_total); per key the order of
#    what is sent is kept;
#  - a filter changed by subscribing again applies to messages read after;
#  - a filter whose evaluation raises an error (one the silent form does
#    not hide) selects nothing and wedges neither a target nor a queue; a
#    path that yields a boolean selects by its value.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;
use OutboxKafka;
use OutboxNats;

my $json = json_codec()->utf8->canonical;
my $cjson = json_codec();
my $node = relay_node('filters');
sub q1 { return $node->safe_psql('postgres', $_[0]); }

my $sink = start_sink('filters');
my $url = $sink->{url};
my $mock = kafka_mock('kf', 1);
my $nats = nats_start('filters');
nats_tool($nats->{url}, 'create', 'F', 'f.>');

q1(qq{
CREATE TABLE shop (id int PRIMARY KEY, total numeric);
SELECT outbox.capture('shop', topic => 'shop.changed');
SELECT outbox.create_http_target('big', '$url/big');
SELECT outbox.subscribe('big', 'orders.*', filter => '\$.payload.total > 100');
SELECT outbox.subscribe('big', 'shop.changed', filter => '\$.payload.op == "delete"');
SELECT outbox.create_http_target('acme', '$url/acme', batch_size => 10, lanes => 1);
SELECT outbox.subscribe('acme', '*', filter => '\$.headers."x-tenant" == "acme"');
SELECT outbox.create_http_target('items', '$url/items');
SELECT outbox.subscribe('items', 'orders.*', filter => '\$.payload.items[*] ? (\@.sku == "x")');
SELECT outbox.create_notify_target('n', 'outbox_filters');
SELECT outbox.subscribe('n', 'orders.*', filter => '\$.key starts with "vip-"');
SELECT outbox.create_nats_target('nt', '$nats->{url}', subject => 'f.{topic}');
SELECT outbox.subscribe('nt', 'orders.created', filter => '\$.payload.total > 100');
SELECT outbox.create_kafka_target('kt', '$mock->{bootstrap}', topic => 'kf');
SELECT outbox.subscribe('kt', 'orders.created', filter => '\$.payload.total <= 100');
SELECT outbox.create_queue('q');
SELECT outbox.subscribe('q', 'orders.*', filter => '\$.payload.total > 100');
});

# A listener on the NOTIFY channel (psql prints what it received after
# each command).
# The time limit is one command's: collect() starts it anew.
my ($lin, $lout, $lerr) = ('', '', '');
my $ltimer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
my $listener = IPC::Run::start([ 'psql', '-XAtq', '-d', $node->connstr('postgres') ],
	'<', \$lin, '>', \$lout, '2>', \$lerr, $ltimer);
my $tick = 0;
my @notes;
sub collect
{
	$tick++;
	$ltimer->start($PostgreSQL::Test::Utils::timeout_default);
	$lin .= "SELECT 'tick $tick';\n";
	$listener->pump while $listener->pumpable && $lout !~ /^tick $tick$/m;
	while ($lout =~ s/^Asynchronous notification "outbox_filters" with payload "(.*)" received from server process with PID \d+\.\n//m)
	{
		push @notes, $cjson->decode($1);
	}
	$lout =~ s/^tick \d+\n//mg;
}
$lin .= "LISTEN outbox_filters;\n";
collect();

# 200 orders on 10 keys: total i, every 7th for acme, every 5th with the
# item x, every 4th with a vip- key.
q1(q{
SELECT count(outbox_emit('orders.created',
	jsonb_build_object('n', g, 'total', g,
					   'items', CASE WHEN g % 5 = 0 THEN '[{"sku": "x"}]'::jsonb ELSE '[{"sku": "y"}]' END),
	CASE WHEN g % 4 = 0 THEN 'vip-' ELSE 'k-' END || (g % 10),
	CASE WHEN g % 7 = 0 THEN '{"x-tenant": "acme"}'::jsonb ELSE '{"x-tenant": "other"}' END))
  FROM generate_series(1, 200) g;
INSERT INTO shop SELECT g, g FROM generate_series(1, 10) g;
DELETE FROM shop WHERE id <= 3;
});

my @big = sink_path_records($sink, '/big', 100 + 3);
my @items = sink_path_records($sink, '/items', 40);
wait_until(sub {
	my $n = 0;
	$n += scalar(@{ $cjson->decode($_->{body}) }) for grep { $_->{path} eq '/acme' } @{ sink_records($sink) };
	$n >= 28 });
wait_until(sub { nats_count($nats->{url}, 'F') >= 100 });
wait_until(sub { @{ kafka_consume($mock, 'kf') } >= 100 });
wait_until(sub { collect(); @notes >= 50 });
# Once every target has recorded its deliveries, nothing more comes: the
# receivers have all of it (the listener once it looks again).
ok($node->poll_query_until('postgres', q{SELECT count(*) FROM outbox.lag WHERE pending > 0 AND target <> 'q'}, '0'),
	'every target delivered what its filter selects');
collect();

my @orders = grep { ($_->{headers}{'outbox-topic'} // '') eq 'orders.created' } sink_path_records($sink, '/big');
is(scalar(@orders), 100, 'a payload predicate: the 100 orders above 100, no more');
is_deeply([ sort { $a <=> $b } map { $cjson->decode($_->{body})->{total} } @orders ], [ 101 .. 200 ],
	'... exactly those');
my @deletes = grep { ($_->{headers}{'outbox-topic'} // '') eq 'shop.changed' } sink_path_records($sink, '/big');
is(scalar(@deletes), 3, 'a captured change by its op: the 3 deletes only');
ok(!grep({ $cjson->decode($_->{body})->{op} ne 'delete' } @deletes), '... none of the inserts');
my %last;
my $inorder = 1;
for my $r (@orders)
{
	my ($k, $n) = ($r->{headers}{'outbox-key'}, $cjson->decode($r->{body})->{n});
	$inorder = 0 if defined $last{$k} && $last{$k} > $n;
	$last{$k} = $n;
}
ok($inorder, 'per key, what passes the filter arrives in order');

my @acme;
push @acme, @{ $cjson->decode($_->{body}) } for grep { $_->{path} eq '/acme' } @{ sink_records($sink) };
is(scalar(@acme), 28, 'a header predicate, in batches: the 28 acme orders');
ok(!grep({ $_->{headers}{'x-tenant'} ne 'acme' } @acme), '... and no other tenant');
@items = sink_path_records($sink, '/items');
is(scalar(@items), 40, 'a path with a filter expression (not a predicate): the 40 orders with item x');
is(scalar(@notes), 50, 'NOTIFY: a predicate on the key, the 50 vip- orders');
ok(!grep({ $_->{key} !~ /^vip-/ } @notes), '... all of them vip-');
my $nd = nats_dump($nats->{url}, 'F');
is(scalar(@$nd), 100, 'NATS: the 100 orders above 100');
ok(!grep({ $cjson->decode($_->{payload})->{total} <= 100 } @$nd), '... none at or below');
my $kd = kafka_consume($mock, 'kf');
is(scalar(@$kd), 100, 'Kafka: the 100 orders at or below 100');
ok(!grep({ $cjson->decode($_->{payload})->{total} > 100 } @$kd), '... none above');

# The queue: receive() hands out only what the filter selects.
my $got = q1(q{SELECT count(*), min((payload->>'total')::int), max((payload->>'total')::int)
  FROM outbox.receive('q', 1000)});
is($got, '100|101|200', 'a queue receives only what its filter selects');

# Counted as filtered.
# (the relay publishes its figures every 50 ms at most)
ok($node->poll_query_until('postgres', q{SELECT filtered FROM outbox.stats WHERE target = 'big'}, 100 + 10),
	'outbox.stats counts what the filters turned away (100 orders, 10 inserts)');
ok($node->poll_query_until('postgres', q{SELECT filtered FROM outbox.stats WHERE target = 'kt'}, '100'),
	'... for Kafka too');
like(q1(q{SELECT outbox.metrics()}), qr/^outbox_filtered_messages_total\{target="big"\} 110$/m,
	'outbox.metrics() has outbox_filtered_messages_total');

# Subscribing again changes the filter for what is read after.
q1(q{SELECT outbox.subscribe('items', 'orders.*', filter => '$.payload.total == 7')});
q1(q{SELECT outbox_emit('orders.created', jsonb_build_object('n', g, 'total', g), 'k-x')
  FROM generate_series(1, 10) g});
my @items2 = sink_path_records($sink, '/items', 41);
$node->poll_query_until('postgres', q{SELECT pending = 0 FROM outbox.lag WHERE target = 'items'})
  or die 'items did not finish';
@items2 = sink_path_records($sink, '/items');
is(scalar(@items2), 41, 'a changed filter: one more message');
is($cjson->decode($items2[-1]{body})->{total}, 7, '... the one it selects');

# A filter that raises an error the silent form does not hide (a date
# compared with a timestamptz needs a time zone) selects nothing, with a
# warning, and wedges neither a target nor a queue; a path yielding a
# boolean selects by its value.
q1(q{
SELECT outbox.create_http_target('dt', '} . $url . q{/dt');
SELECT outbox.subscribe('dt', 'dates', filter => '$.payload.d.datetime() < "2030-01-01 00:00:00+00".datetime()');
SELECT outbox.subscribe('dt', 'flags', filter => '$.payload.vip');
SELECT outbox.create_queue('qd');
SELECT outbox.subscribe('qd', 'dates', filter => '$.payload.d.datetime() < "2030-01-01 00:00:00+00".datetime()');
SELECT outbox.subscribe('qd', 'flags', filter => '$.payload.vip');
});
q1(q{SELECT outbox_emit('dates', '{"d": "2024-01-01"}', 'd' || g) FROM generate_series(1, 5) g;
SELECT outbox_emit('flags', v::jsonb, 'f') FROM unnest(ARRAY['{"vip": true}', '{"vip": false}', '{}']) v;});
my @dt = sink_path_records($sink, '/dt', 1);
ok(wait_until(sub { q1(q{SELECT pending FROM outbox.lag WHERE target = 'dt'}) eq '0' }),
	'a filter that raises an error does not wedge its target');
@dt = sink_path_records($sink, '/dt');
is(scalar(@dt), 1, 'only the message whose boolean is true went');
is($dt[0]{body}, '{"vip": true}', '... the vip one');
is(q1(q{SELECT count(*) FROM outbox.receive('qd', 100)}), '1',
	'a queue with such a filter receives on, only the vip one');
like(slurp_file($node->logfile), qr/outbox filter of subscription "dates" selects nothing for a message: cannot convert value from date to timestamptz/,
	'the error is logged');

$listener->finish;
stop_sink($sink);
kafka_stop($mock);
nats_stop($nats);
relay_no_crash($node);
done_testing();
