# Helpers of the Kafka test (test/t/053_kafka.pl): librdkafka's mock
# cluster run as a process of its own on loopback (test/kafka/outbox_kafka,
# built here on first use), commands sent to it (faults), the topics read
# back, and the Java client's partitioner (murmur2) computed here.
package OutboxKafka;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use File::Basename qw(basename dirname);
use IPC::Run;
use JSON::PP;
use OutboxRelayTest ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

our @EXPORT = qw(kafka_mock kafka_command kafka_stop kafka_consume kafka_tool java_partition murmur2);

my $src = abs_path(dirname(__FILE__) . '/../kafka/outbox_kafka.c');
my @mocks;    # every mock cluster started, stopped at exit even if a test dies
my $tool;
my $json = OutboxRelayTest::json_codec()->utf8;

sub kafka_tool
{
	return $tool if $tool;
	# a name of its own: files run at the same time share tmp_check
	$tool = "$PostgreSQL::Test::Utils::tmp_check/outbox_kafka_" . basename($0, '.pl');
	system('cc', '-O2', '-o', $tool, $src, '-lrdkafka', '-lpthread') == 0
	  or BAIL_OUT("could not build $src");
	return $tool;
}

# Start a 3-broker mock cluster with the topics (name => partitions, ...).
# Returns a hash: bootstrap, harness, in, out.
sub kafka_mock
{
	my (@topics) = @_;
	my ($in, $out, $err) = ('', '', '');
	my $log = "$PostgreSQL::Test::Utils::log_path/" . basename($0, '.pl') . '_kafka_mock.log';
	my $h = IPC::Run::start([ kafka_tool(), 'mock', @topics ],
		'<', \$in, '>', \$out, '2>', $log);
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while ($out !~ /\n/ && time < $deadline)
	{
		$h->pump_nb;
		usleep(20_000);
	}
	my ($bootstrap) = $out =~ /^(\S+)\n/ or die "the mock cluster did not start: $out";
	my $m = { bootstrap => $bootstrap, harness => $h, in => \$in, out => \$out };
	push @mocks, $m;
	$out = '';
	return $m;
}

# Send a command to the mock; returns its answer line.
sub kafka_command
{
	my ($m, $cmd) = @_;
	${ $m->{out} } = '';
	${ $m->{in} } .= "$cmd\n";
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (${ $m->{out} } !~ /\n/ && time < $deadline)
	{
		$m->{harness}->pump_nb;
		usleep(10_000);
	}
	my ($answer) = ${ $m->{out} } =~ /^(.*)\n/;
	return $answer // 'no answer';
}

sub kafka_stop
{
	my ($m) = @_;
	return unless $m->{harness};
	${ $m->{in} } .= "quit\n";
	eval { $m->{harness}->finish };
	$m->{harness} = undef;
}

END
{
	local $?;
	for my $m (grep { $_->{harness} } @mocks)
	{
		eval { $m->{harness}->kill_kill };
		$m->{harness} = undef;
	}
}

# Every record of a topic: an array of hashes (partition, offset, key,
# payload, headers), by partition then offset.
sub kafka_consume
{
	my ($m, $topic) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ kafka_tool(), 'consume', $m->{bootstrap}, $topic ], '>', \$out, '2>', \$err)
	  or die "outbox_kafka consume $topic: $err";
	return [ map { $json->decode($_) } split /\n/, $out ];
}

# Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a
# signed 32-bit integer.
sub murmur2
{
	my ($data) = @_;
	my @b = unpack('C*', $data);
	my $len = scalar @b;
	my $m = 0x5bd1e995;
	my $h = (0x9747b28c ^ $len) & 0xffffffff;
	my $mul = sub {
		my ($a, $b) = @_;
		# 32-bit multiply without losing bits to floating point
		my $lo = ($a & 0xffff) * $b;
		my $hi = (($a >> 16) * $b) & 0xffff;
		return ($lo + ($hi << 16)) & 0xffffffff;
	};
	my $i = 0;
	for (; $i + 4 <= $len; $i += 4)
	{
		my $k = $b[$i] | ($b[ $i + 1 ] << 8) | ($b[ $i + 2 ] << 16) | ($b[ $i + 3 ] << 24);
		$k = $mul->($k, $m);
		$k ^= $k >> 24;
		$k = $mul->($k, $m);
		$h = $mul->($h, $m);
		$h ^= $k;
	}
	my $rest = $len - $i;
	$h ^= $b[ $i + 2 ] << 16 if $rest >= 3;
	$h ^= $b[ $i + 1 ] << 8 if $rest >= 2;
	if ($rest >= 1)
	{
		$h ^= $b[$i];
		$h = $mul->($h, $m);
	}
	$h ^= $h >> 13;
	$h = $mul->($h, $m);
	$h ^= $h >> 15;
	return $h >= 2147483648 ? $h - 4294967296 : $h;
}

# The partition the Java client's default partitioner gives a key.
sub java_partition
{
	my ($key, $n) = @_;
	return (murmur2($key) & 0x7fffffff) % $n;
}

1;
