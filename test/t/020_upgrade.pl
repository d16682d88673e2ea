# ALTER EXTENSION outbox UPDATE from 0.1 (the released schema) to 0.2: the
# new library runs on the 0.1 schema, messages emitted and pending before the
# update are all delivered after it, and ids keep rising, now covered by the
# durable id mark, across a restart; a dead letter of 0.1 gets its payload
# and can be delivered again; the rows of 0.1 stay in outbox.messages
# itself, new ones go to the chunks, and retention removes both.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $sink = start_sink('upgrade');
my $url = $sink->{url};
my $node = relay_node('upgrade', create_extension => 0);
$node->safe_psql('postgres', q{CREATE EXTENSION outbox VERSION '0.1'});
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
	'0.1', 'version 0.1 installed');

# (hook retries for ever: its receiver refuses for as long as the update
# and the steps around it take.)
$node->safe_psql('postgres', qq{
SELECT outbox.create_http_target('hook', '$url/hook', lanes => 4, max_attempts => 0);
SELECT outbox.subscribe('hook', '*');
SELECT outbox.create_notify_target('n', 'upgrade_channel');
SELECT outbox.subscribe('n', '*');
SELECT outbox.create_http_target('rej', '$url/rej', lanes => 1);
SELECT outbox.subscribe('rej', 'rej');
});
# A dead letter recorded by 0.1 (which kept no payload).
sink_control($sink, { path => '/rej', status => 422 });
$node->safe_psql('postgres', q{SELECT outbox_emit('rej', '{"kept": "yes"}')});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM outbox.dead_letters WHERE target = 'rej'}),
	'0.1: a dead letter');
sub emit
{
	my ($from, $to) = @_;
	$node->safe_psql('postgres',
		"SELECT count(outbox_emit('t', jsonb_build_object('g', g), 'k' || (g % 5))) FROM generate_series($from, $to) g");
}
emit(1, 20);
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag}),
	'0.1: the first 20 are delivered');

# The receiver refuses for a while: messages stay pending over the update.
sink_control($sink, { path => '/hook', status => 503 });
emit(21, 30);
ok($node->poll_query_until('postgres', q{SELECT pending = 10 FROM outbox.lag WHERE target = 'hook'}),
	'10 messages pending before the update');

# (to the default version, outbox.control's, through every one between)
my ($default) = slurp_file(($ENV{TESTDIR} // '.') . '/outbox.control') =~ /default_version\s*=\s*'([^']+)'/;
$node->safe_psql('postgres', 'ALTER EXTENSION outbox UPDATE');
is($node->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'outbox'}),
	$default, "updated to $default, through 0.2");
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_class WHERE relname = 'id_mark' AND relkind = 'S'}),
	'1', '... with the id mark');

emit(31, 40);
sink_control($sink, { path => '/hook', status => 204 });
ok($node->poll_query_until('postgres',
		q{SELECT bool_and(pending = 0 AND dead_letters = (target = 'rej')::int) FROM outbox.lag}),
	'after the update everything is delivered');
my %got;
$got{ $_->{seq} }++ for grep { $_->{status} == 204 } @{ sink_attempts($sink, '/hook') };
is(scalar keys %got, 41, '... all 41 messages reached the receiver');
is($node->safe_psql('postgres', q{SELECT delivered FROM outbox.lag WHERE target = 'n'}), '41',
	'... and NOTIFY');

is($node->safe_psql('postgres', q{SELECT payload->>'kept' FROM outbox.dead_letters WHERE target = 'rej'}),
	'yes', 'the 0.1 dead letter got its payload from the message');
sink_control($sink, { path => '/rej', reset => JSON::PP::true });
is($node->safe_psql('postgres', q{SELECT outbox.retry_dead_letters('rej')}), '1', '... and can be delivered again');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.dead_letters}), '... it is');
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM ONLY outbox.messages}), '>', 0,
	'messages stored by 0.1 are in outbox.messages itself');
is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.messages_1}), '10',
	'... those emitted after the update in its first chunk');
is($node->safe_psql('postgres', q{SELECT outbox.pause_target('hook')}), '0', 'the new admin functions work');
$node->safe_psql('postgres', q{SELECT outbox.resume_target('hook')});

# A target of 0.1 takes the security options of 0.2: a signing key rotated
# in, both signatures on its requests; monitoring through outbox_monitor.
my ($k1, $k2) = ('whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'whsec_bm90IHRoZSBzYW1lIGtleSBhdCBhbGwh');
$node->safe_psql('postgres', qq{
SELECT outbox.alter_target('hook', secret => '$k1');
SELECT outbox.rotate_secret('hook', '$k2');
});
$node->safe_psql('postgres', q{SELECT outbox_emit('signed', '{"after": "rotation"}')});
my @signed;
ok( wait_until(
		sub {
			@signed = grep { $_->{body} =~ /rotation/ } sink_path_records($sink, "/hook");
			@signed > 0;
		}),
	'a 0.1 target delivers after a key rotation');
my $h = $signed[0]{headers};
is( $h->{'webhook-signature'},
	join(' ',
		map { webhook_signature($_, $h->{'webhook-id'}, $h->{'webhook-timestamp'}, $signed[0]{body}) }
		  ($k2, $k1)),
	'... signed with the new and the old key');
$node->safe_psql('postgres', q{CREATE ROLE watcher LOGIN IN ROLE outbox_monitor});
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM outbox.lag}, extra_params => [ '-U', 'watcher' ]),
	'3', 'outbox_monitor reads outbox.lag after the update');

# Queues are new in 0.2: one made after the update receives in
# transactions; what a committed receive took does not come back after the
# restart below, what a rolled-back one took does.
$node->safe_psql('postgres', q{
SELECT outbox.create_queue('uq');
SELECT outbox.subscribe('uq', 'qu');
SELECT count(outbox_emit('qu', jsonb_build_object('q', g), 'k' || (g % 2))) FROM generate_series(1, 6) g;
});
is( $node->safe_psql('postgres', q{
BEGIN;
SELECT string_agg(payload->>'q', ',' ORDER BY id) FROM outbox.receive('uq', 4);
COMMIT;}), '1,2,3,4', 'a queue made after the update receives in order');
is( $node->safe_psql('postgres', q{
BEGIN;
SELECT string_agg(payload->>'q', ',' ORDER BY id) FROM outbox.receive('uq', 4);
ROLLBACK;}), '5,6', '... the rest, rolled back');

my $max = $node->safe_psql('postgres', 'SELECT max(id) FROM outbox.messages');
cmp_ok($node->safe_psql('postgres', 'SELECT last_value FROM outbox.id_mark'), '>=', $max,
	'the id mark covers every id handed out');
$node->restart;
emit(41, 41);
cmp_ok($node->safe_psql('postgres', q{SELECT max(id) FROM outbox.messages}), '>', $max,
	'after a restart ids continue above');
ok($node->poll_query_until('postgres', q{SELECT bool_and(pending = 0) FROM outbox.lag WHERE kind <> 'queue'}),
	'... and are delivered');
is( $node->safe_psql('postgres', q{
SELECT string_agg(payload->>'q' || ':' || receive_count, ',' ORDER BY id) FROM outbox.receive('uq', 10);}),
	'5:1,6:1', 'after the restart the queue gives what was rolled back, not what was committed');

# Retention removes the rows of 0.1 as well, once delivered.
$node->append_conf('postgresql.conf', "outbox.retention = 0\n");
$node->reload;
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM outbox.messages}),
	'with retention 0 every delivered message is removed, those of 0.1 too');
cmp_ok($node->safe_psql('postgres', q{SELECT max(id_high_water) FROM outbox.state}), '>', $max,
	'... and the highest id removed is recorded');

unlike(slurp_file($node->logfile), qr/could not remove delivered messages/,
	'retention neither failed on the 0.1 schema nor after the update');
relay_no_crash($node);
stop_sink($sink);
$node->stop;
done_testing();
