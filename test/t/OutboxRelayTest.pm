# Helpers shared by the relay TAP tests (test/t/010_* and up): a server
# configured for fast relay tests, the test HTTP sink (test/sink/
# outbox_sink.py) started and stopped from Perl, its record file read back,
# and polling.
package OutboxRelayTest;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(basename dirname);
use File::Path qw(rmtree);
use Encode ();
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Fcntl qw(:flock);
use Time::HiRes qw(time usleep);

our @EXPORT = qw(
  node_peer_start node_peer_control
  outbox_node relay_node relay_worker_pid relay_worker_pid_now sink_path_records relay_no_crash start_sink
  sink_control sink_stats stop_sink sink_records sink_attempts wait_until wait_for ok_wait
  relay_reloaded relay_went_round settings_reloaded lag_value json_codec
  webhook_signature by_key check_key_fifo client_matches_server standby_pair cold_standby kill_all
  allow_output_plugins sql_literal dead_letter_lines);

# One initdb a kind, copied for every node (make test sets
# OUTBOX_INITDB_CACHE to a directory of its scratch tree): a copy costs a
# third of an initdb's CPU, and a version's files make about 75 nodes.
# Each initdb program (by its path), environment that shapes the cluster
# (time zone, locale) and set of initdb arguments other than the data
# directory gets its own template, made once under a lock by the first file
# that needs it; arguments naming another directory (the WAL's) are not
# cached.  The TAP library of 17 and later has INITDB_TEMPLATE for the same
# purpose; this covers 15 and 16 too, and the nodes made with extra
# arguments.
if (my $cache = $ENV{OUTBOX_INITDB_CACHE})
{
	no warnings 'redefine';
	my $real = \&PostgreSQL::Test::Utils::system_or_bail;
	*PostgreSQL::Test::Utils::system_or_bail = sub {
		my @cmd = @_;
		return $real->(@cmd) unless @cmd && $cmd[0] eq 'initdb';
		my ($pgdata, @key);
		for (my $i = 1; $i < @cmd; $i++)
		{
			if ($cmd[$i] eq '-D' || $cmd[$i] eq '--pgdata') { $pgdata = $cmd[++$i]; }
			else { push @key, $cmd[$i]; }
		}
		return $real->(@cmd)
		  if !defined $pgdata || grep { /^(-X|--waldir)/ } @key;
		my ($initdb) = grep { -x } map { "$_/initdb" } split /:/, $ENV{PATH} // '';
		push @key, map { $_ // '' } $initdb, @ENV{qw(TZ PGTZ LANG LC_ALL LC_CTYPE LC_COLLATE)};
		require Digest::MD5;
		my $name = Digest::MD5::md5_hex(join("\0", @key));
		my $template = "$cache/$name";
		mkdir $cache;
		open(my $lock, '>', "$cache/$name.lock") or die "$cache/$name.lock: $!";
		my $give_up = time + $PostgreSQL::Test::Utils::timeout_default;
		until (flock($lock, LOCK_EX | LOCK_NB))
		{
			die "the initdb template $template stays locked" if time > $give_up;
			usleep(50_000);
		}
		unless (-d $template)
		{
			rmtree("$template.tmp");
			my @make = @cmd;
			$_ = $_ eq $pgdata ? "$template.tmp" : $_ for @make;
			$real->(@make);
			rename("$template.tmp", $template) or die "rename $template.tmp: $!";
		}
		close $lock;
		note("initializing database system by copying the initdb template $template (@key)");
		$real->('cp', '-RPp', $template, $pgdata);
		return;
	};
}

# poll_query_until writes its query to psql's input, and a psql refused
# while the server recovers from a crash may exit before reading it: the
# broken pipe dies instead of polling on (seen under load, right after a
# kill -9).  Poll on in that case, within the library's own time limit.
{
	no warnings 'redefine';
	my $poll = \&PostgreSQL::Test::Cluster::poll_query_until;
	*PostgreSQL::Test::Cluster::poll_query_until = sub {
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		for (;;)
		{
			my @r = eval { ($poll->(@_)) };
			return wantarray ? @r : $r[0] unless $@;
			die $@ unless $@ =~ /Broken pipe/ && time < $deadline;
			usleep(100_000);
		}
	};
}

# BackgroundPsql's query() of the 16 and 17 kits returns as soon as psql's
# stdout has the query's end marker, when an error of the query may still
# be on its way on stderr (15's and 18's wait for a marker on both
# streams).  Make it wait for both on every version, so that a caller that
# looks at stderr after a query sees that query's errors.
{
	no warnings 'redefine';
	require PostgreSQL::Test::BackgroundPsql;
	my $queries = 0;
	*PostgreSQL::Test::BackgroundPsql::query = sub {
		my ($self, $query) = @_;
		local $Test::Builder::Level = $Test::Builder::Level + 1;
		PostgreSQL::Test::BackgroundPsql::note("background psql query: $query");
		$self->{timeout}->start() if defined $self->{query_timer_restart};
		my $mark = 'outbox_query_end_' . $queries++;
		$self->{stdin} .= "$query\n;\n\\echo '$mark'\n\\warn '$mark'\n";
		$self->{run}->pump
		  until ($self->{stdout} =~ /^$mark\r?\n/m && $self->{stderr} =~ /^$mark\r?\n/m)
		  || $self->{timeout}->is_expired;
		die "psql query timed out" if $self->{timeout}->is_expired;
		my $out = $self->{stdout};
		$out =~ s/\r?\n?^$mark\r?\n//m;
		$self->{stderr} =~ s/^$mark\r?\n//m;
		$self->{stdout} = '';
		my $failed = $self->{stderr} eq '' ? 0 : 1;
		return wantarray ? ($out, $failed) : $out;
	};
}

my $sink_script = abs_path(dirname(__FILE__) . '/../sink/outbox_sink.py');
# A JSON codec: JSON::XS where it is installed (test/install-deps.sh
# installs it; tens of times faster on the receivers' and brokers' records,
# thousands of them a file), JSON::PP otherwise.  Both take JSON::PP::true
# and give JSON::PP::Boolean back.
sub json_codec
{
	return eval { require JSON::XS; JSON::XS->new } || JSON::PP->new;
}

my $json = json_codec()->utf8->canonical;
my $json_pp = JSON::PP->new->utf8->canonical;

# A started node with the library preloaded and outbox.database = postgres
# (the one-database form); %opts: conf (extra postgresql.conf text), init
# (a hash ref of arguments for init), create_extension (default 1),
# every_database (leave outbox.database unset: a relay per database).
sub outbox_node
{
	my ($name, %opts) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opts{init} // {} });
	$node->append_conf(
		'postgresql.conf', qq{
shared_preload_libraries = 'outbox'
} . ($opts{every_database} ? '' : qq{outbox.database = 'postgres'
}) . ($opts{conf} // ''));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION outbox')
	  if $opts{create_extension} // 1;
	return $node;
}

# outbox_node() with fast relay settings; %opts as for outbox_node().
sub relay_node
{
	my ($name, %opts) = @_;
	return outbox_node(
		$name, %opts,
		conf => q{
outbox.retry_base_delay = 20
outbox.retry_max_delay = 500
outbox.poll_interval = 1000
# A crash of the worker restarts the server rather than stopping it, so
# the test goes on and fails on what it checks (and relay_no_crash()
# reports the crash) instead of aborting the whole suite at shutdown.
restart_after_crash = on
} . ($opts{conf} // ''));
}

# 15.19 and later minors decode only with the output plugins listed in
# output_plugin_libraries: allow outbox's (and test_decoding, pgoutput).
sub allow_output_plugins
{
	my ($node) = @_;
	return unless $node->safe_psql('postgres',
		q{SELECT count(*) FROM pg_settings WHERE name = 'output_plugin_libraries'}) eq '1';
	$node->safe_psql('postgres',
		q{ALTER SYSTEM SET output_plugin_libraries = pgoutput, test_decoding, outbox});
	$node->reload;
}

# A primary and a streaming standby on the physical slot standby1 (the
# failover tests, 058 and up).  The primary: the library preloaded (every
# database form), fast retries, $opts{conf} appended, $opts{logical} for
# wal_level = logical, $opts{sql} run in postgres before the standby is
# made (by cold_standby(): the 16-18 layouts have no pg_basebackup of
# their own).  The standby:
# primary_slot_name = 'standby1', outbox.standby_slots empty (promoted, it
# has no standby of its own), $opts{standby_conf} appended; with
# $opts{slot_sync}, what keeping copies of failover slots needs (17).
# Returns both, started, the standby streaming.
sub standby_pair
{
	my ($name, %opts) = @_;
	my $primary = PostgreSQL::Test::Cluster->new("${name}_primary");
	$primary->init(allows_streaming => $opts{logical} ? 'logical' : 1);
	$primary->append_conf('postgresql.conf', q{
shared_preload_libraries = 'outbox'
outbox.retry_base_delay = 20
outbox.retry_max_delay = 500
} . ($opts{conf} // ''));
	$primary->start;
	allow_output_plugins($primary) if $opts{logical};
	$primary->safe_psql('postgres',
		q{SELECT pg_create_physical_replication_slot('standby1');} . ($opts{sql} // ''));
	my $standby = cold_standby($primary, "${name}_standby");
	$standby->append_conf('postgresql.conf', q{
primary_slot_name = 'standby1'
outbox.standby_slots = ''
} . ($opts{standby_conf} // ''));
	if ($opts{slot_sync})
	{
		# what a standby keeping copies of failover slots needs
		# (PostgreSQL 17): the database in primary_conninfo, and
		# hot_standby_feedback (reported every second here)
		(my $conninfo = $primary->connstr('postgres')) =~ s/'/''/g;
		$standby->append_conf('postgresql.conf', qq{
primary_conninfo = '$conninfo'
hot_standby_feedback = on
wal_receiver_status_interval = 1
});
	}
	$standby->start;
	$primary->poll_query_until('postgres',
		q{SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'}, '1')
	  or die "$name: the standby does not stream";
	return ($primary, $standby);
}

# A streaming standby $name of $node (not started), made from a file copy
# of $node stopped for it: no pg_basebackup of the server's version is
# needed (the 16-18 layouts have none).  The copy's replication slots are
# removed, as pg_basebackup leaves them out.
sub cold_standby
{
	my ($node, $name) = @_;
	$node->stop;
	$node->backup_fs_cold("${name}_copy");
	$node->start;
	my $standby = PostgreSQL::Test::Cluster->new($name);
	$standby->init_from_backup($node, "${name}_copy", has_streaming => 1);
	unlink glob($standby->data_dir . '/pg_replslot/*/*');
	rmdir $_ for glob($standby->data_dir . '/pg_replslot/*');
	return $standby;
}

# Kill -9 the postmaster of $node and every child of it at once (a crash
# of the whole server, as a failover test wants it).
sub kill_all
{
	my ($node) = @_;
	my $pm = $node->{_pid};
	my @children = split /\s+/, `pgrep -P $pm`;
	my @pids = ($pm, grep { /^\d+$/ } @children);
	# each one's start time: a pid used again by another process is gone
	my $stat = sub { my $st = eval { slurp_file("/proc/$_[0]/stat") } // ''; $st };
	my %started = map { my @f = split ' ', ($stat->($_) =~ s/^.*\) //sr); ($_ => $f[19] // '') } @pids;
	kill 'KILL', @pids;
	$node->{_pid} = undef;
	# gone once reaped, or a zombie (it holds nothing then)
	my $alive = sub {
		grep {
			my $st = $stat->($_);
			my @f = split ' ', ($st =~ s/^.*\) //sr);
			$st ne '' && $f[0] ne 'Z' && ($f[19] // '') eq $started{$_};
		} @pids;
	};
	wait_for("the killed server's processes to be gone",
		sub { my @a = $alive->(); (!@a, "@a still there") })
	  or die 'kill_all: processes of the killed server are still alive';
	unlink $node->data_dir . '/postmaster.pid';
}

# Whether the client program $prog (pg_dump, pg_basebackup) on PATH has the
# server's major version: the 16-18 layouts the suite runs on have no
# builds of them of their version, and those of 15 refuse a newer server.  Returns the
# reason to skip when it does not, else ''.
sub client_matches_server
{
	my ($node, $prog) = @_;
	my $server = $node->safe_psql('postgres', q{SELECT current_setting('server_version_num')::int / 10000});
	my $out = `$prog --version 2>&1`;
	my ($client) = $out =~ /(\d+)(?:\.\d+)?/;
	return '' if defined $client && $client == $server;
	return "$prog " . ($client // '?') . " cannot work with a PostgreSQL $server server, and this installation has no $prog $server";
}

# The pid of the relay worker: waits until exactly one runs (the launcher
# starts it after the server, and a relay that exits is replaced a moment
# later), and dies naming what it saw if none does within the time limit.
sub relay_worker_pid
{
	my ($node) = @_;
	my $pid;
	wait_for(
		'exactly one outbox relay running',
		sub {
			$pid = relay_worker_pid_now($node);
			return (scalar($pid =~ /^\d+$/), $pid eq '' ? 'none' : join(', ', split /\n/, $pid));
		})
	  or die 'no single outbox relay: ' . ($pid eq '' ? 'none' : $pid);
	return $pid;
}

# The pids of the relay workers now, one a line ('' when there is none).
sub relay_worker_pid_now
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		q{SELECT string_agg(pid::text, E'\n' ORDER BY pid) FROM pg_stat_activity WHERE backend_type = 'outbox relay'});
}

# Check that no server process died of a signal or an assertion, other
# than the processes in @killed (pids killed on purpose).
sub relay_no_crash
{
	my ($node, @killed) = @_;
	my %ok = map { $_ => 1 } @killed;
	my @crashes =
	  grep {
		!(/\(PID (\d+)\) was terminated by signal/ && $ok{$1})
	  }
	  grep { /was terminated by signal|TRAP:|\*\*\* .* \*\*\*: terminated|PANIC:/ }
	  split /\n/, slurp_file($node->logfile);
	is_deeply(\@crashes, [], 'no server process crashed');
}

# Every sink started, stopped at exit even when a test dies.
my @sinks;
my @node_peers;

END
{
	local $?;
	for my $sink (grep { $_->{harness} } @sinks)
	{
		eval { $sink->{harness}->kill_kill };
	}
	for my $p (grep { $_->{harness} } @node_peers)
	{
		$p->{harness}->signal('TERM');
		eval { $p->{harness}->finish };
	}
}

# Start a peer of the tests written for Node.js ($script PORT_FILE writes
# its ports to PORT_FILE, as JSON, once it listens: test/aws/aws_peer.mjs,
# test/oauth/oauth_peer.mjs); returns a hash: ports, control (the control
# port), log, harness, http.
sub node_peer_start
{
	my ($script, $name) = @_;
	my $base = "$PostgreSQL::Test::Utils::log_path/${name}_" . basename($0, '.pl');
	my $port_file = "$base.port";
	unlink $port_file;
	my $h = IPC::Run::start([ 'node', $script, $port_file ],
		'<', \undef, '>>', "$base.log", '2>>', "$base.log");
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	until (-s $port_file)
	{
		die "peer $name did not start (see $base.log)" if time > $deadline || !$h->pumpable;
		usleep(20_000);
	}
	my $ports = JSON::PP->new->utf8->decode(slurp_file($port_file));
	my $peer = {
		name => $name,
		ports => $ports,
		control => $ports->{control},
		log => "$base.log",
		harness => $h,
		http => HTTP::Tiny->new(timeout => $PostgreSQL::Test::Utils::timeout_default),
	};
	push @node_peers, $peer;
	return $peer;
}

# POST /$what of a node peer's control port with $req (GET when $req is
# undef); the decoded answer.
sub node_peer_control
{
	my ($peer, $what, $req) = @_;
	my $codec = JSON::PP->new->utf8->canonical;
	my $url = "http://127.0.0.1:$peer->{control}/$what";
	my $res = defined $req
	  ? $peer->{http}->post($url,
		{ content => $codec->encode($req), headers => { 'content-type' => 'application/json' } })
	  : $peer->{http}->get($url);
	die "peer $peer->{name}: $what failed: $res->{status} $res->{content}" unless $res->{success};
	return $codec->decode($res->{content});
}

# Start the sink; @args are extra command line arguments.  Returns a hash:
# name, port, url (http://127.0.0.1:port), record (file), log, harness.
sub start_sink
{
	my ($name, @args) = @_;
	my $dir = $PostgreSQL::Test::Utils::log_path;
	# (files of their own: test files running at once share log_path)
	my $base = "$dir/sink_" . basename($0, '.pl') . "_$name";
	my $record = "$base.jsonl";
	my $port_file = "$base.port";
	unlink $record, $port_file;
	my $h = IPC::Run::start(
		[
			'python3', $sink_script, '--port-file', $port_file,
			'--record', $record, @args
		],
		'<', \undef, '>>', "$base.log", '2>>', "$base.log");
	# --port given means a fixed port (the caller passed it)
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	until (-s $port_file)
	{
		die "sink $name did not start" if time > $deadline || !$h->pumpable;
		usleep(20_000);
	}
	my $port = slurp_file($port_file);
	chomp $port;
	my $sink = {
		name => $name,
		port => $port,
		url => "http://127.0.0.1:$port",
		record => $record,
		log => "$base.log",
		harness => $h,
		http => HTTP::Tiny->new(timeout => $PostgreSQL::Test::Utils::timeout_default),
	};
	push @sinks, $sink;
	return $sink;
}

# POST /_control with the given fields; returns the decoded answer.
sub sink_control
{
	my ($sink, $req) = @_;
	# (JSON::PP: JSON::XS writes a number once used as a string as a
	# string, which the sink refuses)
	my $res = $sink->{http}->post("$sink->{url}/_control",
		{ content => $json_pp->encode($req), headers => { 'content-type' => 'application/json' } });
	die "sink control failed: $res->{status} $res->{content}" unless $res->{success};
	return $json->decode($res->{content});
}

sub sink_stats
{
	my ($sink) = @_;
	my $res = $sink->{http}->get("$sink->{url}/_stats");
	die "sink stats failed: $res->{status}" unless $res->{success};
	return $json->decode($res->{content});
}

sub stop_sink
{
	my ($sink) = @_;
	my $h = $sink->{harness};
	return unless $h;
	$h->signal('TERM');
	my $deadline = time + 10;
	while ($h->pumpable && time < $deadline)
	{
		usleep(50_000);
		eval { $h->pump_nb };
	}
	$h->kill_kill if $h->pumpable;
	eval { $h->finish };
	delete $sink->{harness};
}

# Every record of the sink, decoded (JSON::PP: fine for a few hundred).
# Read incrementally: records already read are kept.
sub sink_records
{
	my ($sink) = @_;
	$sink->{records} //= [];
	$sink->{offset} //= 0;
	open(my $fh, '<:raw', $sink->{record}) or return $sink->{records};
	seek($fh, $sink->{offset}, 0);
	while (my $line = <$fh>)
	{
		last unless $line =~ /\n\z/;    # torn last line: read it next time
		$sink->{offset} += length($line);
		push @{ $sink->{records} }, $json->decode($line);
	}
	close $fh;
	return $sink->{records};
}

# The sink's records of one path; with $n, first wait (wait_until, with
# $timeout and $interval) until there are at least $n.
sub sink_path_records
{
	my ($sink, $path, $n, $timeout, $interval) = @_;
	my @r;
	my $read = sub {
		@r = grep { $_->{path} eq $path } @{ sink_records($sink) };
		return (@r >= ($n // 0), scalar(@r) . ' of them');
	};
	if (defined $n)
	{
		wait_for("$n records on $path at the receiver $sink->{name}", $read,
			timeout => $timeout, interval => $interval);
	}
	else { $read->() }
	return @r;
}

# One entry per message carried by a request, in arrival order: rseq (the
# record's seq), status (-1 when the connection was dropped), path, wid
# (webhook-id), seq (outbox seq), key ('-' for none), msg_id, t, n (the
# messages of the request).  A batch (body an array) gives one entry per
# envelope.  Built from sink_records() as they come in (each record is read
# and split once, however often the test polls).
sub sink_attempts
{
	my ($sink, $path) = @_;
	my $records = sink_records($sink);
	my $all = $sink->{attempts} //= [];
	$sink->{attempts_read} //= 0;
	for my $r (@$records[ $sink->{attempts_read} .. $#$records ])
	{
		my $h = $r->{headers} // {};
		my $st = defined $r->{status} ? $r->{status} : -1;
		my $wid = $h->{'webhook-id'} // '-';
		my $body = $r->{body} // '';
		if (substr($body, 0, 1) eq '[')
		{
			my $items = $json->decode(Encode::encode('UTF-8', $body));
			for my $e (@$items)
			{
				push @$all, { rseq => $r->{seq}, status => $st, path => $r->{path}, wid => $wid,
					seq => $e->{seq}, key => $e->{key} // '-', msg_id => $e->{id}, t => $r->{t},
					n => scalar @$items };
			}
		}
		else
		{
			push @$all, { rseq => $r->{seq}, status => $st, path => $r->{path}, wid => $wid,
				seq => $h->{'outbox-seq'} // '-', key => $h->{'outbox-key'} // '-',
				msg_id => $wid, t => $r->{t}, n => 1 };
		}
	}
	$sink->{attempts_read} = scalar @$records;
	return [ map { {%$_} } grep { !defined $path || $_->{path} eq $path } @$all ];
}

# Poll $cond every $interval seconds until it returns true or $timeout
# seconds passed (the TAP library's time limit, 180 s unless
# PG_TEST_TIMEOUT_DEFAULT says otherwise); returns whether it became true,
# and says where it gave up when it did not.
sub wait_until
{
	my ($cond, $timeout, $interval) = @_;
	my (undef, $file, $line) = caller;
	# $cond in scalar context, as callers expect (a match's captures or a
	# grep's list would be read as a list by wait_for)
	return _wait("the condition at $file line $line", sub { my $r = $cond->(); return ($r) },
		$timeout, $interval);
}

# wait_until() for a named state: $cond returns whether it holds and,
# optionally, what it saw instead ("3 of 10 delivered"): a list, so a match
# must be given as scalar($x =~ /.../) (in a list a match returns its
# captures, or nothing when it fails); on a time-out the
# test's output says what did not happen and what was last seen (unless
# quiet => 1: a short wait the caller tries again).
sub wait_for
{
	my ($what, $cond, %o) = @_;
	return _wait($what, $cond, $o{timeout}, $o{interval}, $o{quiet});
}

# ok(wait_for(...)): a check that the state came.
sub ok_wait
{
	my ($what, $cond, %o) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	return ok(wait_for($what, $cond, %o), $what);
}

sub _wait
{
	my ($what, $cond, $timeout, $interval, $quiet) = @_;
	$timeout //= $PostgreSQL::Test::Utils::timeout_default;
	$interval //= 0.1;
	my $start = time;
	my $deadline = $start + $timeout;
	my $seen;
	while (1)
	{
		my ($ok, $s) = $cond->();
		return 1 if $ok;
		$seen = $s;
		last if time > $deadline;
		usleep($interval * 1e6);
	}
	diag(sprintf('gave up after %.0f s waiting for %s%s',
			time - $start, $what, defined $seen ? " (last seen: $seen)" : ''))
	  unless $quiet;
	return 0;
}

# The dead letters of target $t in database $db (postgres): "key|error"
# lines, in id order.
sub dead_letter_lines
{
	my ($node, $t, $db) = @_;
	return [ split /\n/, $node->safe_psql($db // 'postgres',
		"SELECT coalesce(key, '') || '|' || last_error FROM outbox.dead_letters"
		  . " WHERE target = " . sql_literal($t) . " ORDER BY id") ];
}

# A column of a target's row in outbox.lag, now.
sub lag_value
{
	my ($node, $target, $column, $db) = @_;
	return $node->safe_psql($db // 'postgres',
		"SELECT $column FROM outbox.lag WHERE target = '$target'");
}

# After a change of postgresql.conf and a reload ($node->reload or
# pg_reload_conf()): wait until a new session of $db sees every setting of
# %want (the postmaster has read the file, and signalled its children
# before it forks a new one).
sub settings_reloaded
{
	my ($node, $db, %want) = @_;
	for my $name (sort keys %want)
	{
		(my $q = $name) =~ s/'/''/g;
		$node->poll_query_until($db, "SELECT current_setting('$q')", $want{$name})
		  or die "$name is not '$want{$name}' after the reload";
	}
	return 1;
}

# settings_reloaded(), then wait until the relay of $db has gone round its
# loop twice since (it reads the file at the top of its loop: the second
# turn began after the first had applied it), so that what is emitted next
# is read under the new settings.
sub relay_reloaded
{
	my ($node, $db, %want) = @_;
	settings_reloaded($node, $db, %want);
	relay_went_round($node, $db, 2);
	return 1;
}

# $s as an SQL literal (NULL for undef), for statements built in Perl.
sub sql_literal
{
	my ($s) = @_;
	return 'NULL' unless defined $s;
	$s =~ s/'/''/g;
	return "'$s'";
}

# Wait until the relay of $db has gone round its loop $turns times from
# now (it publishes outbox.worker.last_wakeup as it does).
sub relay_went_round
{
	my ($node, $db, $turns) = @_;
	for my $turn (1 .. $turns)
	{
		my $t = $node->safe_psql($db, 'SELECT clock_timestamp()');
		$node->poll_query_until($db,
			"SELECT last_wakeup > '$t' FROM outbox.worker")
		  or die "the relay did not go round its loop (turn $turn)";
	}
	return 1;
}

# Standard Webhooks: "v1," . base64(HMAC-SHA256(key, id.timestamp.body))
# with the key the base64 after "whsec_"; computed independently of the
# sink's Python and of the extension's C.
sub webhook_signature
{
	my ($secret, $id, $ts, $body_bytes) = @_;
	require Digest::SHA;
	require MIME::Base64;
	(my $b64 = $secret) =~ s/^whsec_//;
	my $key = MIME::Base64::decode_base64($b64);
	return 'v1,'
	  . MIME::Base64::encode_base64(
		Digest::SHA::hmac_sha256("$id.$ts.$body_bytes", $key), '');
}

# Group attempt entries by key: { key => [entries in arrival order] }.
sub by_key
{
	my ($attempts) = @_;
	my %k;
	push @{ $k{ $_->{key} } }, $_ for @$attempts;
	return \%k;
}

# I4 on a record without crashes: for each key, the attempts in arrival
# order never start a message before every lower seq of the key got a 2xx,
# every expected seq got exactly one 2xx, and nothing is attempted after
# its own 2xx.  $expected: { key => [seqs ascending] }.  Returns a list of
# problems (empty when fine), at most $max of them.
sub check_key_fifo
{
	my ($attempts, $expected, $max) = @_;
	$max //= 10;
	my @problems;
	my $per_key = by_key($attempts);
	for my $key (sort keys %$expected)
	{
		my @want = @{ $expected->{$key} };
		my %pos;
		@pos{@want} = (0 .. $#want);
		my $next = 0;    # index into @want of the next message to finish
		my @list = @{ $per_key->{$key} // [] };
		# Entries of one request (a batch) are handled together: they
		# must be the next messages of the key, consecutively.
		my $i = 0;
		while ($i < @list)
		{
			my $j = $i;
			$j++ while $j + 1 < @list && $list[ $j + 1 ]{rseq} == $list[$i]{rseq};
			my $status = $list[$i]{status};
			for my $k ($i .. $j)
			{
				my $a = $list[$k];
				my $p = $pos{ $a->{seq} };
				my $at = $next + ($k - $i);
				if (!defined $p)
				{
					push @problems, "key $key: unexpected seq $a->{seq} (record $a->{rseq})";
				}
				elsif ($p < $at)
				{
					push @problems,
					  "key $key: seq $a->{seq} attempted again after its 2xx (record $a->{rseq})";
				}
				elsif ($p > $at)
				{
					push @problems,
					  "key $key: seq $a->{seq} attempted (record $a->{rseq}) before seq $want[$at] got a 2xx";
				}
			}
			$next += $j - $i + 1 if $status >= 200 && $status < 300;
			$i = $j + 1;
			last if @problems >= $max;
		}
		push @problems, "key $key: only $next of " . scalar(@want) . " delivered"
		  if $next < @want;
		last if @problems >= $max;
	}
	return @problems;
}

1;
