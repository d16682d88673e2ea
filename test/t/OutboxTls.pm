# Throwaway certificates for the TLS tests (test/t/036_tls.pl,
# 072_broker_tls.pl), made with the openssl command line: CAs, server and
# client certificates signed by them, an expired one.
package OutboxTls;

use strict;
use warnings;

use Cwd qw(abs_path);
use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;

our @EXPORT = qw(tls_dir make_ca make_cert);

my $dir;

# The directory the certificates are in (made at the first call).
sub tls_dir
{
	$dir //= abs_path(PostgreSQL::Test::Utils::tempdir('tls'));
	return $dir;
}

sub _openssl
{
	my @args = @_;
	my ($out, $err);
	my $ok = eval { IPC::Run::run([ 'openssl', @args ], '<', \undef, '>', \$out, '2>', \$err) };
	die "openssl @args failed (the openssl command line is needed: test/install-deps.sh): "
	  . ($@ || $err)
	  unless $ok;
}

my @ec = ('-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes');

# A CA: "<dir>/$name.pem" and its key.
sub make_ca
{
	my ($name, $cn) = @_;
	my $d = tls_dir();
	_openssl('req', '-x509', @ec, '-days', '2', '-keyout', "$d/$name.key",
		'-out', "$d/$name.pem", '-subj', "/O=outbox-test/CN=$cn",
		'-addext', 'basicConstraints=critical,CA:true',
		'-addext', 'keyUsage=critical,keyCertSign,cRLSign');
	return "$d/$name.pem";
}

# A certificate signed by $ca: "<dir>/$name.pem" and "<dir>/$name.key";
# $days 0 makes one that has expired a second later.
sub make_cert
{
	my ($name, $ca, $subj, $ext, $days) = @_;
	my $d = tls_dir();
	_openssl('req', @ec, '-keyout', "$d/$name.key", '-out', "$d/$name.csr", '-subj', $subj);
	open(my $fh, '>', "$d/$name.ext") or die "$d/$name.ext: $!";
	print $fh $ext;
	close $fh;
	_openssl('x509', '-req', '-in', "$d/$name.csr", '-CA', "$d/$ca.pem",
		'-CAkey', "$d/$ca.key", '-CAcreateserial', '-days', $days // '2',
		'-extfile', "$d/$name.ext", '-out', "$d/$name.pem");
	return "$d/$name.pem";
}

1;
