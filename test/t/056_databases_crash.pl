# One outbox per database through crashes and the move from the
# one-database form.
#
# (a) Three databases emitting, the server stopped in immediate mode (a
#     crash) in the middle, twice: in each database every committed
#     message is delivered, and no id is handed out twice, before or after.
# (b) A server in the one-database form of 0.2 (outbox.database = 'app')
#     with messages still pending and a counter far along switches to every
#     database (outbox.database emptied): the pending messages are
#     delivered, new ids go on above the old ones, and a second database
#     gets an outbox of its own.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);
use OutboxRelayTest;

my $sink = start_sink('databases_crash', '--delay-ms', '2');
my $url = $sink->{url};

sub delivered_ids
{
	my ($path) = @_;
	my %ids;
	$ids{ $_->{seq} }++ for grep { $_->{status} == 204 } @{ sink_attempts($sink, $path) };
	return \%ids;
}

# --- (a) crashes with three databases mid-stream ---
my @dbs = qw(c1 c2 c3);
my $node = relay_node('databases_crash', every_database => 1, create_extension => 0);
for my $db (@dbs)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
CREATE EXTENSION outbox;
CREATE TABLE committed (id bigint PRIMARY KEY);
SELECT outbox.create_http_target('t', '$url/$db', lanes => 4, max_attempts => 0);
SELECT outbox.subscribe('t', 'm');
});
}

# Each emitter commits two messages a transaction, at most about 1,000
# messages a second: unpaced, a fast emitter got 100,000 messages ahead of
# a relay slowed by a loaded machine before the crash, more than the wait
# below lets it deliver.
sub start_emitters
{
	my @h;
	for my $db (@dbs)
	{
		my $sql = q{DO $$
BEGIN
  FOR i IN 1..20000 LOOP
    PERFORM outbox_emit('m', jsonb_build_object('i', i), 'k' || i % 10);
    PERFORM outbox_emit('m', jsonb_build_object('i', i), 'k' || (i + 1) % 10);
    COMMIT;
    IF i % 5 = 0 THEN PERFORM pg_sleep(0.01); END IF;
  END LOOP;
END $$;};
		push @h, IPC::Run::start(
			[ 'psql', '-X', '-q', '-h', $node->host, '-p', $node->port, '-d', $db, '-c', $sql ],
			'>', \my $o, '2>', \my $e);
	}
	return @h;
}

my %max_before;
for my $round (1 .. 2)
{
	my @h = start_emitters();
	# Let messages of this round flow in every database, then crash.
	ok( wait_until(
			sub {
				3 == grep {
					my $db = $_;
					(grep { $_ > ($max_before{$db} // 0) } keys %{ delivered_ids("/$db") }) > 300
				} @dbs;
			},
			undef, 0.5),
		"round $round: all three databases deliver");
	$node->stop('immediate');
	$_->kill_kill for @h;
	eval { $_->finish } for @h;
	$node->start;
	for my $db (@dbs)
	{
		my $max = $node->safe_psql($db, 'SELECT max(id) FROM outbox.messages');
		cmp_ok($max, '>', $max_before{$db} // 0, "round $round, $db: messages committed before the crash are there");
		$max_before{$db} = $max;
	}
}

# After the last crash: new messages, then everything must arrive.
for my $db (@dbs)
{
	$node->safe_psql($db, q{SELECT count(outbox_emit('m', '{"after": true}', 'k' || g % 10)) FROM generate_series(1, 50) g});
}
for my $db (@dbs)
{
	my @ids = split /\n/, $node->safe_psql($db, 'SELECT id FROM outbox.messages ORDER BY id');
	# (the lag view first: cheaper to poll than the receiver's record)
	$node->poll_query_until($db, q{SELECT pending = 0 FROM outbox.lag WHERE target = 't'});
	ok(wait_until(sub { my $d = delivered_ids("/$db"); !grep { !$d->{$_} } @ids }, undef, 0.5),
		"$db: every committed message (" . scalar(@ids) . ") was delivered after two crashes")
	  or do
	{
		my $d = delivered_ids("/$db");
		my @missing = grep { !$d->{$_} } @ids;
		diag(scalar(@missing) . " not delivered, the first: @missing[0 .. ($#missing < 9 ? $#missing : 9)]");
	};
	my $after_min = $node->safe_psql($db, q{SELECT min(id) FROM outbox.messages WHERE payload ? 'after'});
	cmp_ok($after_min, '>', $max_before{$db}, "$db: ids after the crash are above every id before it");
	is($node->safe_psql($db, 'SELECT count(*) - count(DISTINCT id) FROM outbox.messages'), '0',
		"$db: no id twice");
	is($node->safe_psql($db, 'SELECT count(*) FROM outbox.dead_letters'), '0', "$db: no dead letters");
	# per key, the first delivery of each id follows id order
	my %first;
	my @order;
	for my $a (grep { $_->{status} == 204 } @{ sink_attempts($sink, "/$db") })
	{
		next if $first{ $a->{seq} }++;
		push @order, $a;
	}
	my %last;
	my $bad = 0;
	for my $a (@order)
	{
		$bad++ if defined $last{ $a->{key} } && $a->{seq} < $last{ $a->{key} };
		$last{ $a->{key} } = $a->{seq};
	}
	is($bad, 0, "$db: per key, first deliveries in id order");
}
relay_no_crash($node);
$node->stop;

# --- (b) from the one-database form to every database ---
# (a receiver of its own: its record stays small to read)
stop_sink($sink);
$sink = start_sink('one_database');
$url = $sink->{url};
my $old = relay_node('one_database', create_extension => 0,
	conf => "outbox.database = 'app'\n");
$old->safe_psql('postgres', 'CREATE DATABASE app');
$old->safe_psql('postgres', 'CREATE DATABASE other');
$old->safe_psql('app', qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/app', max_attempts => 0);
SELECT outbox.subscribe('t', 'm');
SELECT outbox.pause_target('t');
SELECT count(outbox_emit('m', jsonb_build_object('n', g), 'k')) FROM generate_series(1, 3000) g;
});
my ($ret, $out, $err) = $old->psql('other', 'CREATE EXTENSION outbox; SELECT outbox_emit($$m$$, $${}$$)');
like($err, qr/cannot be used in database "other".*\n.*outbox.database/,
	'one-database form: another database is refused, naming outbox.database');
$old->safe_psql('other', 'DROP EXTENSION IF EXISTS outbox');
my $old_max = $old->safe_psql('app', 'SELECT max(id) FROM outbox.messages');
is($old_max, '3000', 'app: 3,000 messages pending (the target is paused)');

# The move: outbox.database emptied, a restart.
$old->append_conf('postgresql.conf', "outbox.database = ''\n");
$old->restart;
$old->safe_psql('app', q{SELECT outbox.resume_target('t')});
$old->poll_query_until('app', q{SELECT pending = 0 FROM outbox.lag WHERE target = 't'});
ok(wait_until(sub { scalar(keys %{ delivered_ids('/app') }) >= 3000 }),
	'after the move the pending messages are delivered');
$old->safe_psql('app', q{SELECT outbox_emit('m', '{"new": true}', 'k')});
ok(wait_until(sub { delivered_ids('/app')->{3001} || grep { $_ > 3000 } keys %{ delivered_ids('/app') } }),
	'a new message is delivered');
cmp_ok($old->safe_psql('app', q{SELECT id FROM outbox.messages WHERE payload ? 'new'}), '>', $old_max,
	'... with an id above every old one (the counter goes on)');
$old->safe_psql('other', qq{
CREATE EXTENSION outbox;
SELECT outbox.create_http_target('t', '$url/other');
SELECT outbox.subscribe('t', 'm');
SELECT outbox_emit('m', '{}');
});
ok(wait_until(sub { scalar(keys %{ delivered_ids('/other') }) >= 1 }),
	'and the other database has an outbox of its own');
relay_no_crash($old);
$old->stop;
stop_sink($sink);
done_testing();
