# psql sessions kept open for the queue TAP tests (test/t/040_* and up),
# driven through IPC::Run, the same way on every supported version.
#
# A psql session that runs one step at a time without blocking the caller:
# send() a step, poll() until it is done, then read step_out / step_err.
# Each step ends with a marker echoed to both streams.
package OutboxSession;

use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils ();

{
	use Time::HiRes qw(time usleep);

	sub new
	{
		my ($class, $node, $name) = @_;
		my $self = bless { name => $name, in => '', out => '', err => '', n => 0 }, $class;
		$self->{h} = IPC::Run::start(
			[
				'psql', '-XAtq', '-v', 'ON_ERROR_STOP=0', '-v', 'VERBOSITY=verbose',
				'-d', $node->connstr('postgres')
			],
			'<', \$self->{in}, '>', \$self->{out}, '2>', \$self->{err});
		$self->{pid} = $self->run("SET application_name = '$name'; SELECT pg_backend_pid();");
		return $self;
	}

	sub send
	{
		my ($self, $step) = @_;
		die "$self->{name}: a step is still running" if $self->{busy};
		my $m = "__step_$self->{name}_" . ++$self->{n} . '__';
		$self->{marker} = $m;
		$self->{busy} = 1;
		$self->{sent_at} = time;
		$self->{in} .= "$step\n\\echo $m\n\\warn $m\n";
		# IPC::Run writes to psql only while pumped: hand the step over
		# now, so that it runs while the caller does something else.
		my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
		while (length($self->{in}) > 0)
		{
			$self->{h}->pump_nb;
			last if length($self->{in}) == 0;
			die "$self->{name}: psql does not read its input" if time > $deadline;
			usleep(1000);
		}
		return;
	}

	sub poll
	{
		my ($self) = @_;
		return 1 unless $self->{busy};
		eval { $self->{h}->pump_nb; };
		my $m = $self->{marker};
		return 0 unless $self->{out} =~ /^\Q$m\E\n/m && $self->{err} =~ /^\Q$m\E\n/m;
		$self->{done_at} = time;
		($self->{step_out}, $self->{out}) = $self->{out} =~ /\A(.*?)^\Q$m\E\n(.*)\z/ms;
		($self->{step_err}, $self->{err}) = $self->{err} =~ /\A(.*?)^\Q$m\E\n(.*)\z/ms;
		chomp $self->{step_out};
		$self->{busy} = 0;
		return 1;
	}

	# Wait for the running step to finish, at most $timeout seconds;
	# returns whether it did.
	sub wait_done
	{
		my ($self, $timeout) = @_;
		my $deadline = time + ($timeout // $PostgreSQL::Test::Utils::timeout_default);
		# Look again after 1 ms, then less and less often (at most every
		# 20 ms): a quick step returns at once, and a step that waits
		# (a receive, a lock) does not cost a CPU's worth of pumping.
		my $pause = 1000;
		until ($self->poll)
		{
			return 0 if time > $deadline;
			usleep($pause);
			$pause = $pause * 3 / 2 if $pause < 20_000;
		}
		return 1;
	}

	# Run a step and return its stdout (without the last newline).
	sub run
	{
		my ($self, $step, $timeout) = @_;
		$self->send($step);
		$self->wait_done($timeout)
		  or die "$self->{name}: step timed out: $step\nstdout: $self->{out}\nstderr: $self->{err}";
		return $self->{step_out};
	}

	# Like run(), dying when the step printed anything on stderr.
	sub run_ok
	{
		my ($self, $step, $timeout) = @_;
		my $out = $self->run($step, $timeout);
		die "$self->{name}: step failed: $step\n$self->{step_err}" if $self->{step_err} ne '';
		return $out;
	}

	# Close stdin: psql exits, disconnecting (mid-transaction, if one is open).
	sub quit
	{
		my ($self) = @_;
		$self->{in} .= "\\q\n";
		eval { $self->{h}->finish; };
		return;
	}

	sub kill
	{
		my ($self) = @_;
		eval { $self->{h}->kill_kill; };
		return;
	}

	# One statement (without its ";"): its output, or "ERROR: ..." when
	# it printed an error.
	sub query
	{
		my ($self, $sql, $timeout) = @_;
		my $out = $self->run("$sql;", $timeout);
		return $self->{step_err} =~ /ERROR|FATAL/ ? "ERROR: $self->{step_err}" : $out;
	}

	# The result of a statement sent with send(), as query() gives it.
	sub result
	{
		my ($self, $timeout) = @_;
		$self->wait_done($timeout) or die "$self->{name}: step timed out";
		return $self->{step_err} =~ /ERROR|FATAL/ ? "ERROR: $self->{step_err}" : $self->{step_out};
	}

	sub pid { return $_[0]->{pid}; }

	# Whether psql has exited (as it does when its connection is lost or
	# its backend is terminated).
	sub gone
	{
		my ($self) = @_;
		eval { $self->{h}->pump_nb; };
		return !$self->{h}->pumpable;
	}

	sub close { $_[0]->quit; }
}

1;
