# The documentation covers what the extension has, once, and its links
# work.  Against a server with the extension created:
#
#  - every function of the extension (pg_proc via pg_depend) is described
#    by exactly one heading in docs/*.md naming it as `outbox.NAME(` (or
#    `outbox_emit(`); every view by exactly one heading "View `outbox.NAME`";
#    every table that is not a chunk of outbox.messages by exactly one
#    heading naming it as a table ("Table `outbox.NAME`", or "Tables" with a
#    list); every outbox.* setting in pg_settings by exactly one table row
#    "| `outbox.NAME` |" in docs/settings.md, and by no such row elsewhere;
#  - no heading repeats within a file (README.md, CHANGELOG.md, docs/*.md);
#  - every relative link of those files names a file that exists and, with
#    "#anchor", a heading of that file (GitHub's anchors);
#  - README.md is at most 300 lines;
#  - every target kind the SQL knows (outbox.targets' kind check) is in
#    the drawings of docs/internals.md (its file relay_KIND.c; queue:
#    queue_receive.c), and its create function (outbox.create_KIND_target;
#    queue: outbox.create_queue) is in docs/brokers.md or
#    docs/sql-reference.md.
#
# The check itself is shown to fail on a copy of the docs with one
# function's heading removed, a heading repeated, a link broken and a
# target kind taken out of the internals drawing.
use strict;
use warnings;
use File::Basename qw(dirname basename);
use File::Copy qw(copy);
use File::Path qw(make_path);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $root = $ENV{TESTDIR} // '.';

my $node = outbox_node('docs');

my @functions = split /\n/, $node->safe_psql('postgres', q{
SELECT DISTINCT CASE WHEN n.nspname = 'outbox' THEN 'outbox.' ELSE '' END || p.proname
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox'
 ORDER BY 1});
my @views = split /\n/, $node->safe_psql('postgres', q{
SELECT c.oid::regclass FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox'
 WHERE c.relkind = 'v' ORDER BY 1});
my @tables = split /\n/, $node->safe_psql('postgres', q{
SELECT c.oid::regclass FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox'
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid)
 ORDER BY 1});
my @settings = split /\n/, $node->safe_psql('postgres',
	q{SELECT name FROM pg_settings WHERE name LIKE 'outbox.%' ORDER BY 1});
my $kind_check = $node->safe_psql('postgres',
	q{SELECT pg_get_constraintdef(oid) FROM pg_constraint
	   WHERE conrelid = 'outbox.targets'::regclass AND conname = 'targets_kind_check'});
my @kinds = $kind_check =~ /'([a-z]+)'/g;
$node->stop;

cmp_ok(scalar(@functions), '>', 40, 'the extension has its functions (' . scalar(@functions) . ')');
cmp_ok(scalar(@views), '>=', 4, 'and its views (' . join(', ', @views) . ')');
cmp_ok(scalar(@settings), '>', 10, 'and its settings (' . scalar(@settings) . ')');
cmp_ok(scalar(@kinds), '>=', 7, 'and its target kinds (' . join(', ', @kinds) . ')');

# Headings of a Markdown file (outside fenced code), and its lines.
sub read_md
{
	my ($file) = @_;
	my (@headings, @links);
	my $fence;
	my $n = 0;
	open(my $fh, '<', $file) or die "$file: $!";
	my @lines = <$fh>;
	close $fh;
	for my $line (@lines)
	{
		$n++;
		if ($line =~ /^\s*(```|~~~)/)
		{
			if (!defined $fence) { $fence = $1; }
			elsif ($line =~ /^\s*\Q$fence\E\s*$/) { undef $fence; }
			next;
		}
		next if defined $fence;
		push @headings, { text => $1, line => $n } if $line =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $l = $line;
		$l =~ s/`[^`]*`//g;    # no links inside inline code
		while ($l =~ /\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)
		{
			push @links, { target => $1, line => $n };
		}
	}
	return { headings => \@headings, links => \@links, lines => scalar(@lines) };
}

# GitHub's anchor of a heading.
sub slug
{
	my ($h) = @_;
	$h = lc $h;
	$h =~ s/[^\p{L}\p{N}\s_-]//g;
	$h =~ s/ /-/g;
	return $h;
}

# The problems of a documentation tree at $dir, as a list of strings.
sub problems
{
	my ($dir) = @_;
	my @p;
	my @docs = sort glob("$dir/docs/*.md");
	push @p, "no docs/*.md" unless @docs;
	my %md = map { $_ => read_md($_) } (@docs, grep { -f } "$dir/README.md", "$dir/CHANGELOG.md");

	# Each function, view, table once as a heading of docs/.
	my @dh = map { my $f = $_; map { { %$_, file => basename($f) } } @{ $md{$f}{headings} } } @docs;
	for my $f (@functions)
	{
		my @h = grep { index($_->{text}, "`$f(") >= 0 } @dh;
		push @p, "function $f is described " . scalar(@h) . ' times'
		  . (@h ? ' (' . join(', ', map { "$_->{file}:$_->{line}" } @h) . ')' : '')
		  unless @h == 1;
	}
	for my $v (@views)
	{
		my @h = grep { $_->{text} =~ /\bView `\Q$v\E`/ } @dh;
		push @p, "view $v is described " . scalar(@h) . ' times' unless @h == 1;
	}
	for my $t (@tables)
	{
		my @h = grep { $_->{text} =~ /\bTables? .*`\Q$t\E`/ } @dh;
		push @p, "table $t is described " . scalar(@h) . ' times' unless @h == 1;
	}
	# Each setting once, as a row of docs/settings.md.
	my %rows;
	for my $f (@docs)
	{
		open(my $fh, '<', $f) or die;
		while (<$fh>)
		{
			push @{ $rows{$1} }, basename($f) if /^\|\s*`(outbox\.[a-z_]+)`\s*\|/;
		}
		close $fh;
	}
	for my $s (@settings)
	{
		my @r = @{ $rows{$s} // [] };
		push @p, "setting $s has " . scalar(@r) . ' rows (' . join(', ', @r) . ')'
		  unless @r == 1 && $r[0] eq 'settings.md';
	}
	# No heading twice in a file; links resolve.
	for my $f (sort keys %md)
	{
		my %seen;
		for my $h (@{ $md{$f}{headings} })
		{
			push @p, basename($f) . ":$h->{line}: heading \"$h->{text}\" repeats line $seen{$h->{text}}"
			  if $seen{ $h->{text} };
			$seen{ $h->{text} } //= $h->{line};
		}
		for my $l (@{ $md{$f}{links} })
		{
			my $t = $l->{target};
			next if $t =~ /^(?:[a-z][a-z0-9+.-]*:|\/\/)/i;    # http:, mailto:, ...
			my ($path, $anchor) = $t =~ /^([^#]*)(?:#(.*))?$/;
			my $target = $path eq '' ? $f : dirname($f) . "/$path";
			if (!-e $target)
			{
				push @p, basename($f) . ":$l->{line}: link to $t: no such file";
				next;
			}
			next unless defined $anchor && $anchor ne '';
			if (-d $target || $target !~ /\.md$/)
			{
				push @p, basename($f) . ":$l->{line}: link to $t: an anchor in a file that is not Markdown";
				next;
			}
			my $tm = $md{$target} // read_md($target);
			my %slugs;
			for my $h (@{ $tm->{headings} })
			{
				my $s = slug($h->{text});
				my $k = $s;
				my $i = 0;
				$k = $s . '-' . ++$i while $slugs{$k};
				$slugs{$k} = 1;
			}
			push @p, basename($f) . ":$l->{line}: link to $t: no such heading" unless $slugs{$anchor};
		}
	}
	push @p, "README.md has $md{\"$dir/README.md\"}{lines} lines (at most 300)"
	  if $md{"$dir/README.md"} && $md{"$dir/README.md"}{lines} > 300;
	# Each target kind in the internals drawings and with its create
	# function in brokers.md or sql-reference.md.
	my $internals = -f "$dir/docs/internals.md" ? slurp_file("$dir/docs/internals.md") : '';
	my $drawings = join("\n", $internals =~ /^```text\n(.*?)^```/msg);
	my $reference = join("\n", map { -f $_ ? slurp_file($_) : '' }
		  "$dir/docs/brokers.md", "$dir/docs/sql-reference.md");
	for my $k (@kinds)
	{
		my $file = $k eq 'queue' ? 'queue_receive.c' : "relay_$k.c";
		my $create = $k eq 'queue' ? 'outbox.create_queue(' : "outbox.create_${k}_target(";
		push @p, "target kind $k: $file is not in the drawings of docs/internals.md"
		  unless index($drawings, $file) >= 0;
		push @p, "target kind $k: $create is not in docs/brokers.md or docs/sql-reference.md"
		  unless index($reference, $create) >= 0;
	}
	return @p;
}

my @p = problems($root);
is_deeply(\@p, [], 'the documentation describes everything once and its links work')
  or diag(join("\n", @p));

# The check can fail: a copy with a function's heading taken out, a
# heading repeated and a broken link.
my $copy = PostgreSQL::Test::Utils::tempdir();
make_path("$copy/docs");
copy($_, "$copy/docs/" . basename($_)) for glob("$root/docs/*.md");
copy("$root/README.md", "$copy/README.md");
{
	my $f = "$copy/docs/queues.md";
	my $text = slurp_file($f);
	# Every heading naming outbox.receive( names it no more.
	1 while $text =~ s/^(#+ [^\n]*)`outbox\.receive\(/$1`receive(/m;
	$text .= "\n## Repeated\n\ntext\n\n## Repeated\n\n[broken](nowhere.md#here)\n";
	open(my $fh, '>', $f) or die;
	print $fh $text;
	close $fh;
	# The drawings no longer name relay_redis.c.
	$f = "$copy/docs/internals.md";
	$text = slurp_file($f);
	$text =~ s/relay_redis\.c/relay_somewhere.c/g;
	open($fh, '>', $f) or die;
	print $fh $text;
	close $fh;
}
my @bad = problems($copy);
ok((grep { /function outbox\.receive is described 0 times/ } @bad), 'a function with no heading is found');
ok((grep { /heading "Repeated" repeats/ } @bad), 'a repeated heading is found');
ok((grep { /link to nowhere\.md#here: no such file/ } @bad), 'a broken link is found');
ok((grep { /target kind redis: relay_redis\.c is not in the drawings/ } @bad),
	'a target kind missing from the internals drawings is found');

done_testing();
