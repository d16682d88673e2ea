# "A failing message blocks only its lane" (DESIGN.md, Lanes): a receiver
# that keeps failing the messages of one key (503, retried forever) must
# not hold up the other keys of the target, even after that key's backlog
# grew beyond what the relay keeps queued per target (10,000 messages).
#
# The test sink fails by path, not by key, so this test runs its own tiny
# receiver: 503 for outbox-key "stuck", 204 (and a line in a file) for
# every other key.
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $dir = $PostgreSQL::Test::Utils::log_path;
my ($port_file, $ok_file) = ("$dir/stuck_receiver.port", "$dir/stuck_receiver.ok");
unlink $port_file, $ok_file;
my $receiver = <<'EOPY';
import http.server, os, sys
port_file, ok_file = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self.headers.get("outbox-key")
        status = 503 if key == "stuck" else 204
        if status == 204:
            with open(ok_file, "a") as f:
                f.write(f"{key} {self.headers.get('outbox-seq')}\n")
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(port_file + ".tmp", port_file)
server.serve_forever()
EOPY
my $h = IPC::Run::start([ 'python3', '-c', $receiver, $port_file, $ok_file ],
	'>', "$dir/stuck_receiver.log", '2>&1');
ok(wait_until(sub { -s $port_file }, 20), 'the receiver runs');
my $port = slurp_file($port_file);

my $node = relay_node('relay_stuck');
# A key in another lane than "stuck" (of 2).
my $good = $node->safe_psql(
	'postgres', q{
SELECT k FROM (SELECT 'good-' || g AS k FROM generate_series(1, 50) g) s
 WHERE outbox.lane_of(k, 0, 2) <> outbox.lane_of('stuck', 0, 2) ORDER BY k LIMIT 1});
$node->safe_psql(
	'postgres', qq{
BEGIN;
SELECT outbox.create_http_target('t', 'http://127.0.0.1:$port/in', lanes => 2, max_attempts => 0);
SELECT outbox.subscribe('t', '*');
COMMIT;
});

$node->safe_psql('postgres', qq{SELECT count(outbox_emit('x', '{}', '$good')) FROM generate_series(1, 5)});
ok(wait_until(sub { -e $ok_file && (() = slurp_file($ok_file) =~ /^\Q$good\E /mg) >= 5 }, 20),
	'the good key is delivered');

$node->safe_psql('postgres', q{SELECT count(outbox_emit('x', '{}', 'stuck')) FROM generate_series(1, 12000)});
$node->safe_psql('postgres', qq{SELECT count(outbox_emit('x', '{}', '$good')) FROM generate_series(1, 5)});
ok( wait_until(sub { (() = slurp_file($ok_file) =~ /^\Q$good\E /mg) >= 10 }, 15),
	'with 12000 messages of a failing key pending, another lane\'s messages are still delivered');
note $node->safe_psql('postgres', q{SELECT format('pending %s, delivered %s, last error %s', pending, delivered, last_error) FROM outbox.lag});

$h->kill_kill;
relay_no_crash($node);
$node->stop;
done_testing();
