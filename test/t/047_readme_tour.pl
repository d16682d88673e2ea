# The README's tour works as written.  Every ```sql block between
# "<!-- tour:start -->" and "<!-- tour:end -->" in README.md runs, in order,
# in one psql session (ON_ERROR_STOP) against a fresh server with the
# library preloaded and the extension not yet created; the tour's webhook
# URL http://127.0.0.1:8080 is pointed at the test receiver, its NATS URL
# at a real nats-server -js with a stream taking orders.>, its Kafka broker
# at librdkafka's mock cluster with a topic orders, its Redis URL at a real
# redis-server, its RabbitMQ URL at a real rabbitmq-server with a queue
# orders.  Then every
# message the tour emitted and committed reaches the receiver or its other
# targets, none of the rolled-back ones does, and nothing is pending.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;
use OutboxNats;
use OutboxKafka;
use OutboxRedis;
use OutboxRabbitMQ;

my $root = $ENV{TESTDIR} // '.';
my $readme = slurp_file("$root/README.md");
my ($tour) = $readme =~ /^<!-- tour:start -->\n(.*?)^<!-- tour:end -->$/ms;
ok(defined $tour, 'README.md has a tour between the markers');
$tour //= '';
my @blocks = $tour =~ /^```sql\n(.*?)^```$/msg;
cmp_ok(scalar(@blocks), '>=', 4, 'the tour has SQL blocks (' . scalar(@blocks) . ')');
my $sql = join("\n", @blocks);
like($sql, qr/CREATE EXTENSION outbox/, 'the tour creates the extension');
like($sql, qr{'http://127\.0\.0\.1:8080/}, 'the tour names the webhook URL the test replaces');
unlike($sql, qr/^\s*\\/m, 'the tour has no psql meta-commands');

my $node = relay_node('tour', create_extension => 0);
my $sink = start_sink('tour');
my $nats = nats_start('tour');
nats_tool($nats->{url}, 'create', 'ORDERS', 'orders.>');
like($sql, qr{'nats://127\.0\.0\.1:4222'}, 'the tour names the NATS URL the test replaces');
(my $run = $sql) =~ s{http://127\.0\.0\.1:8080}{$sink->{url}}g;
$run =~ s{nats://127\.0\.0\.1:4222}{$nats->{url}}g;
my $kafka = kafka_mock('orders', 3);
like($sql, qr{'127\.0\.0\.1:9092'}, 'the tour names the Kafka broker the test replaces');
$run =~ s{'127\.0\.0\.1:9092'}{'$kafka->{bootstrap}'}g;
my $redis = redis_start('tour');
like($sql, qr{'redis://127\.0\.0\.1:6379'}, 'the tour names the Redis URL the test replaces');
$run =~ s{redis://127\.0\.0\.1:6379}{redis://127.0.0.1:$redis->{port}}g;
my $rmq = rmq_start('tour');
rmq_tool($rmq->{url}, 'declare', 'orders');
like($sql, qr{'amqp://guest:guest\@127\.0\.0\.1:5672'}, 'the tour names the RabbitMQ URL the test replaces');
$run =~ s{amqp://guest:guest\@127\.0\.0\.1:5672}{$rmq->{url}}g;

my ($stdout, $stderr);
my $ok = $node->psql('postgres', $run, stdout => \$stdout, stderr => \$stderr,
	extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
is($ok, 0, 'the tour runs without an error') or diag("stderr:\n$stderr\nstdout:\n$stdout");

ok( wait_until(
		sub {
			$node->safe_psql('postgres',
				q{SELECT coalesce(sum(pending), 0) FROM outbox.lag WHERE kind <> 'queue'}) eq '0';
		}),
	'the relay delivered everything the tour emitted');
my @records = @{ sink_records($sink) };
cmp_ok(scalar(@records), '>', 0, 'the receiver got the tour\'s webhooks (' . scalar(@records) . ')');
is($node->safe_psql('postgres', 'SELECT count(*) FROM outbox.dead_letters'), '0', 'no dead letter');
# (a NATS target is held while its host names resolve when that takes
# over 50 ms, as on a busy machine: a moment's wait, not an error of the
# tour, but it stays its last error)
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(target || ': ' || last_error, '; ') FROM outbox.lag
		 WHERE last_error IS NOT NULL AND last_error NOT LIKE '%resolving the NATS servers'' host names%'}),
	'', 'no target reports an error');
my $stored = nats_dump($nats->{url}, 'ORDERS');
# (two keys: no order between them)
is(join(' ', sort map { $_->{subject} } @$stored), 'orders.changed orders.created',
	'the stream holds the committed orders messages, once each');
is(join(' ', sort map { $_->{headers}{'outbox-topic'} } @{ kafka_consume($kafka, 'orders') }),
	'orders.changed orders.created', 'the Kafka topic holds them too');
is(join(' ', sort map { $_->{topic} } @{ redis_entries($redis, 'orders') }),
	'orders.changed orders.created', 'the Redis stream holds them too');
redis_stop($redis);
is(join(' ', sort map { $_->{topic} } @{ rmq_dump($rmq->{url}, 'orders') }),
	'orders.changed orders.created', 'the RabbitMQ queue holds them too');
rmq_stop($rmq);
stop_sink($sink);
nats_stop($nats);
kafka_stop($kafka);
relay_no_crash($node);
$node->stop;
done_testing();
