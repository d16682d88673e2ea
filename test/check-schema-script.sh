#!/usr/bin/env bash
# The newest full install script reads as one schema: each object made
# once, with its final shape.
#
#   test/check-schema-script.sh [SCRIPT]
#
# SCRIPT defaults to outbox--V.sql for outbox.control's default_version.
# The script is read as PostgreSQL's lexer reads it (quoted strings, E''
# strings, quoted identifiers, dollar-quoted bodies with their tags, -- and
# nested /* */ comments, psql's backslash commands), cut into statements at
# each top-level semicolon, and each statement is checked, in any letter
# case and however it is spread over lines.  Fails, naming the line, on:
#   - CREATE OR REPLACE (a function or view defined again),
#   - DROP of anything (made, then taken back),
#   - ALTER of anything but a table (ALTER FUNCTION, VIEW, EXTENSION ...),
#   - ALTER TABLE of a table the script creates, but for ENABLE ALWAYS
#     TRIGGER and ADD CONSTRAINT ... NOT VALID, which CREATE TABLE and
#     CREATE TRIGGER cannot say,
#   - a table, view or sequence created twice, or a COMMENT ON the same
#     object twice.
# Update scripts (outbox--A--B.sql) are not its business.  Run by
# `make lint`; TAP 045 shows it failing on a script that breaks each rule.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
script=${1:-}
if [ -z "$script" ]; then
	v=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$here/outbox.control")
	script=$here/outbox--$v.sql
fi
[ -f "$script" ] || { echo "check-schema-script: $script is missing" >&2; exit 2; }

exec perl -e '
use strict;
use warnings;
my ($path) = @ARGV;
my $name = $path; $name =~ s{.*/}{};
open(my $fh, "<", $path) or die "$path: $!";
my $src = do { local $/; <$fh> };
close $fh;

# Statements as skeletons: upper case, comments gone, every literal and
# body replaced by a placeholder, white space folded; with their first line.
my (@stmts, $cur, $line0);
my $line = 1;
my $n = length $src;
my $i = 0;
my $bol = 1;
sub add { my ($t) = @_; $line0 //= $line if $t =~ /\S/; $cur .= $t; }
while ($i < $n)
{
	my $c = substr($src, $i, 1);
	my $rest = substr($src, $i, 2);
	if ($bol && $c eq "\\")		# psql command: the whole line
	{
		my $e = index($src, "\n", $i);
		$e = $n if $e < 0;
		$i = $e;
		next;
	}
	$bol = 0;
	if ($c eq "\n") { $line++; $bol = 1; add(" "); $i++; next; }
	if ($rest eq "--")
	{
		my $e = index($src, "\n", $i);
		$i = $e < 0 ? $n : $e;
		next;
	}
	if ($rest eq "/*")
	{
		my $depth = 0;
		while ($i < $n)
		{
			my $two = substr($src, $i, 2);
			if ($two eq "/*") { $depth++; $i += 2; next; }
			if ($two eq "*/") { $depth--; $i += 2; last if $depth == 0; next; }
			$line++ if substr($src, $i, 1) eq "\n";
			$i++;
		}
		add(" ");
		next;
	}
	if ($c eq "\x27" || (($c eq "E" || $c eq "e") && substr($src, $i + 1, 1) eq "\x27"
		&& ($i == 0 || substr($src, $i - 1, 1) !~ /[A-Za-z0-9_]/)))
	{
		my $escapes = $c ne "\x27";
		$i += $escapes ? 2 : 1;
		while ($i < $n)
		{
			my $d = substr($src, $i, 1);
			$line++ if $d eq "\n";
			if ($escapes && $d eq "\\") { $i += 2; next; }
			if ($d eq "\x27")
			{
				if (substr($src, $i + 1, 1) eq "\x27") { $i += 2; next; }
				$i++;
				last;
			}
			$i++;
		}
		add(" STR ");
		next;
	}
	if ($c eq "\"")
	{
		my $e = $i + 1;
		while ($e < $n)
		{
			if (substr($src, $e, 1) eq "\"")
			{
				last unless substr($src, $e + 1, 1) eq "\"";
				$e++;
			}
			$e++;
		}
		add(substr($src, $i, $e + 1 - $i));	# quoted: kept as written
		$i = $e + 1;
		next;
	}
	if ($c eq "\$" && substr($src, $i) =~ /^(\$(?:[A-Za-z_][A-Za-z_0-9]*)?\$)/
		&& ($i == 0 || substr($src, $i - 1, 1) !~ /[A-Za-z0-9_]/))
	{
		my $tag = $1;
		my $e = index($src, $tag, $i + length $tag);
		die "$name:$line: unterminated $tag body\n" if $e < 0;
		$line += (substr($src, $i, $e - $i) =~ tr/\n//);
		$i = $e + length $tag;
		add(" BODY ");
		next;
	}
	if ($c eq ";")
	{
		(my $t = uc($cur // "")) =~ s/\s+/ /g;
		$t =~ s/^ | $//g;
		push @stmts, [ $line0 // $line, $t ] if $t ne "";
		$cur = ""; $line0 = undef;
		$i++;
		next;
	}
	add($c);
	$i++;
}

my (%made, %commented, @bad);
sub bad { push @bad, "$name:$_[0]: $_[1]"; }
for my $s (@stmts)
{
	my ($l, $t) = @$s;
	if ($t =~ /^CREATE OR REPLACE\b/) { bad($l, "CREATE OR REPLACE: define it once, as it is"); next; }
	if ($t =~ /^DROP\b/) { bad($l, "DROP: make only what stays"); next; }
	if ($t =~ /^CREATE (?:(?:GLOBAL |LOCAL )?(?:TEMP |TEMPORARY |UNLOGGED ))?(TABLE|VIEW|SEQUENCE)(?: IF NOT EXISTS)? ([^ (]+)/)
	{
		bad($l, lc("$1 $2") . " created twice") if $made{$2}++;
		next;
	}
	if ($t =~ /^COMMENT ON (.*?) IS /)
	{
		bad($l, "COMMENT ON " . lc($1) . " twice") if $commented{$1}++;
		next;
	}
	if ($t =~ /^ALTER (\w+)/ && $1 ne "TABLE")
	{
		bad($l, "ALTER $1: give it its final shape where it is created");
		next;
	}
	if ($t =~ /^ALTER TABLE (?:IF EXISTS )?(?:ONLY )?([^ ]+) (.*)$/ && $made{$1})
	{
		my ($table, $rest) = ($1, $2);
		next if $rest =~ /^ENABLE ALWAYS TRIGGER [^ ,]+$/;
		# the clauses, split at commas outside parentheses
		my (@clauses, $depth, $part);
		$depth = 0; $part = "";
		for my $ch (split //, $rest)
		{
			$depth++ if $ch eq "(";
			$depth-- if $ch eq ")";
			if ($ch eq "," && $depth == 0) { push @clauses, $part; $part = ""; next; }
			$part .= $ch;
		}
		push @clauses, $part;
		my $ok = 1;
		for my $c (@clauses)
		{
			$c =~ s/^ | $//g;
			$ok = 0 unless $c =~ /^ADD CONSTRAINT \S+ .* NOT VALID$/;
		}
		bad($l, "ALTER TABLE " . lc($table) . ": give the table its final shape in CREATE TABLE") unless $ok;
	}
}
if (@bad)
{
	print STDERR "check-schema-script: $_\n" for @bad;
	exit 1;
}
print "check-schema-script: $name creates each object once, in its final shape (" . scalar(@stmts) . " statements)\n";
' "$script"
