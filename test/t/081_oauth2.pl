# OAuth2 client credentials of HTTP targets against a real token endpoint
# (the npm package oauth2-mock-server) and a receiver that takes only its
# tokens, verified with the issuer's keys (test/oauth/oauth_peer.mjs):
#  - one token for many requests, fetched with the client's id and secret
#    (HTTP Basic, then in the form) and the scope; every message delivered
#    once, per key in order;
#  - tokens that expire: fetched anew before they do, no request refused
#    for an expired one;
#  - a receiver refusing a token (401: revoked, expired in flight): a new
#    one fetched once and the same batch sent again, no attempt used up;
#  - the token endpoint down, answering 400 (invalid_scope) or not JSON,
#    refusing the client (a wrong secret), refused by the destination
#    rules: the target held with the endpoint's reason, nothing
#    dead-lettered (max_attempts 1), then delivered in order;
#  - the secret never in the server's log or outbox.lag.
use strict;
use warnings;
use Cwd qw(abs_path);
use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use OutboxRelayTest;

my $json = JSON::PP->new->utf8->canonical;
my $peer = node_peer_start(abs_path(dirname(__FILE__) . '/../oauth/oauth_peer.mjs'), 'oauth');
my $token_url = "http://127.0.0.2:$peer->{ports}{token}/token";
my $receiver = "http://127.0.0.1:$peer->{ports}{receiver}/hook";
my $secret = 's3cret-Zq7';
node_peer_control($peer, 'setup',
	{ clients => { relay => $secret }, method => 'basic', scope => 'hooks.write' });

my $node = relay_node('oauth');
$node->safe_psql('postgres', qq{
	SELECT outbox.create_http_target('hook', '$receiver', batch_size => 5, lanes => 4,
									 max_attempts => 1);
	SELECT outbox.set_oauth2('hook', '$token_url', 'relay', '$secret', 'hooks.write');
	SELECT outbox.subscribe('hook', 'hook.*');});

my $emitted = 0;
sub emit
{
	my ($n) = @_;
	my $sql = "BEGIN;\n";
	for (1 .. $n)
	{
		$emitted++;
		my $key = 'k' . ($emitted % 10);
		$sql .= qq{SELECT outbox_emit('hook.x', '{"n": $emitted}', '$key');\n};
	}
	$node->safe_psql('postgres', $sql . "COMMIT;\n");
}

sub pending { return lag_value($node, 'hook', 'pending') }
sub stats { return node_peer_control($peer, 'stats') }

sub all_delivered
{
	my ($what) = @_;
	ok_wait($what, sub { my $p = pending(); return ($p == 0, "$p pending") });
}

sub held_with
{
	my ($what, $re) = @_;
	ok_wait($what, sub {
		my $e = lag_value($node, 'hook', 'last_error');
		return (scalar($e =~ $re), $e) });
}

# Every message the receiver took: each once, per key in order.
sub check_messages
{
	my ($what) = @_;
	my (%seen, %per_key);
	for my $req (@{ node_peer_control($peer, 'messages') })
	{
		for my $m (@{ $json->decode($req->{body}) })
		{
			$seen{ $m->{payload}{n} }++;
			push @{ $per_key{ $m->{key} } }, $m->{payload}{n};
		}
	}
	is(scalar(keys %seen), $emitted, "$what: all $emitted messages taken");
	is(scalar(grep { $_ > 1 } values %seen), 0, "$what: each once");
	my @out = grep {
		my $l = $per_key{$_};
		grep { $l->[$_] <= $l->[ $_ - 1 ] } 1 .. $#$l
	} sort keys %per_key;
	is_deeply(\@out, [], "$what: per key in order");
}

sub no_dead_letters
{
	my ($what) = @_;
	is($node->safe_psql('postgres', q{SELECT count(*) FROM outbox.dead_letters}), '0',
		"$what: nothing dead-lettered");
}

# --- one token, HTTP Basic -------------------------------------------------
emit(200);
all_delivered('200 messages delivered with a token');
my $s = stats();
is($s->{token_requests}, 1, 'one token asked for');
is_deeply($s->{methods}, ['basic'], 'the client authenticated with HTTP Basic');
is_deeply($s->{scopes}, ['hooks.write'], 'the scope asked for');
is_deeply($s->{refused}, {}, 'the receiver refused no request');
check_messages('one token');

# --- the client's id and secret in the form --------------------------------
node_peer_control($peer, 'setup',
	{ clients => { relay => $secret }, method => 'post', scope => 'hooks.write' });
$node->safe_psql('postgres', qq{
	SELECT outbox.set_oauth2('hook', '$token_url', 'relay', '$secret', 'hooks.write', 'post');});
emit(20);
all_delivered('delivered with client_auth post');
$s = stats();
is($s->{methods}[-1], 'post', 'the new options asked for a new token, id and secret in the form');
is($s->{token_requests}, 2, 'one token asked for');

# --- a token refused in flight (401): a new one, the batch again -----------
node_peer_control($peer, 'fault', { receiver_401 => 1 });
my $log_offset = -s $node->logfile;
emit(20);
all_delivered('delivered after the receiver refused a token once');
$s = stats();
is($s->{token_requests}, 3, 'a new token asked for once');
is($s->{refused}{'token revoked'}, 1, 'the receiver refused one request');
no_dead_letters('a refused token');
unlike(slurp_file($node->logfile, $log_offset), qr/holds target "hook"/,
	'the target was not held: the request went again with the new token');

# --- tokens that expire ----------------------------------------------------
# Ten seconds each: fetched anew after three quarters of it, none sent in
# its last second.
node_peer_control($peer, 'fault', { expires_in => 10 });
node_peer_control($peer, 'fault', { receiver_401 => 1 });
my $t0 = time;
my $asked = stats()->{token_requests};
while (time - $t0 < 25)
{
	emit(5);
	all_delivered('a round delivered') or last;
	sleep 1;    # the span over which tokens expire
}
$s = stats();
cmp_ok($s->{token_requests} - $asked, '>=', 3, 'tokens fetched anew as they expire')
  or diag($json->encode($s));
is(scalar(grep { /expired|ERR_JWT/ } keys %{ $s->{refused} }), 0,
	'no request carried an expired token')
  or diag($json->encode($s->{refused}));
node_peer_control($peer, 'fault', { expires_in => 3600, receiver_401 => 1 });
emit(5);
all_delivered('delivered with a long token again');
check_messages('tokens that expire');

# --- the token endpoint fails ----------------------------------------------
# Each time the receiver refuses the token in hand, so a new one is asked for.
sub endpoint_fault
{
	my ($what, $fault, $re, $mend, $before) = @_;
	$before->() if $before;
	node_peer_control($peer, 'fault', { %$fault, receiver_401 => 1 });
	emit(10);
	held_with("$what: held with the endpoint's reason", $re);
	cmp_ok(pending(), '>', 0, "$what: messages wait");
	no_dead_letters($what);
	$mend->();
	all_delivered("$what: delivered once the endpoint answers");
	check_messages($what);
}

sub endpoint_answers
{
	node_peer_control($peer, 'fault', { token_times => 0 });
}

endpoint_fault('endpoint down', { down => JSON::PP::true },
	qr/could not get an OAuth2 token from \Q$token_url\E: .*(connect|refused)/i,
	sub { node_peer_control($peer, 'fault', { down => JSON::PP::false }) });
endpoint_fault('400 invalid_scope',
	{ token_status => 400, token_times => 1000000,
	  token_body => '{"error":"invalid_scope","error_description":"scope not granted"}' },
	qr/HTTP 400: invalid_scope \(scope not granted\)/, \&endpoint_answers);
endpoint_fault('an answer that is not JSON',
	{ token_status => 200, token_times => 1000000, token_body => '<html>hello</html>' },
	qr/the answer is not a JSON object/, \&endpoint_answers);
endpoint_fault('a wrong secret', {}, qr/HTTP 401: invalid_client \(client authentication failed\)/,
	sub {
		$node->safe_psql('postgres', qq{
			SELECT outbox.set_oauth2('hook', '$token_url', 'relay', '$secret', 'hooks.write', 'post');});
	},
	sub {
		$node->safe_psql('postgres', qq{
			SELECT outbox.set_oauth2('hook', '$token_url', 'relay', 'wrong-secret', 'hooks.write', 'post');});
	});

# The destination rules refuse the token endpoint (127.0.0.2), not the receiver.
$node->safe_psql('postgres', q{ALTER SYSTEM SET outbox.denied_destinations = '127.0.0.2/32'});
$node->reload;
relay_reloaded($node, 'postgres', 'outbox.denied_destinations' => '127.0.0.2/32');
endpoint_fault('destination rules', {}, qr/connection refused by the relay/,
	sub {
		$node->safe_psql('postgres', q{ALTER SYSTEM RESET outbox.denied_destinations});
		$node->reload;
	});

# --- no secret shown -------------------------------------------------------
# (the test's own statements are logged, log_statement = all)
is_deeply([ grep { /\Q$secret\E|wrong-secret/ && !/ statement: / } split /\n/, slurp_file($node->logfile) ],
	[], 'the secret is in no log line of the relay');
is($node->safe_psql('postgres',
	qq{SELECT count(*) FROM outbox.lag WHERE last_error LIKE '%$secret%' OR last_error LIKE '%wrong-secret%'}),
	'0', 'nor in outbox.lag');
relay_no_crash($node);
done_testing();
