# The two ways to a version give the same schema.  For every full install
# script outbox--V.sql but the oldest, the extension is created directly
# at V, and then created at the oldest version and updated to V with ALTER
# EXTENSION UPDATE; a description of the schema (tables, columns with types,
# defaults and nullability, constraints, indexes, sequences, views with
# their definitions, functions with their bodies, settings, security and
# volatility, triggers, comments, privileges of every object, the tables
# whose rows pg_dump keeps, and the list of the extension's objects) must
# be the same both ways, line for line.
#
# Each new version adds outbox--V.sql and outbox--PREV--V.sql; this test
# then covers it with no change.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use OutboxRelayTest;

my $srcdir = $ENV{TESTDIR} // '.';
opendir(my $dh, $srcdir) or die "cannot read $srcdir: $!";
my @scripts = grep { /^outbox--[0-9.]+\.sql$/ } readdir($dh);
closedir($dh);
my @full = sort { version_cmp($a, $b) } map { /^outbox--([0-9.]+)\.sql$/ ? $1 : () } @scripts;
my ($default) = slurp_file("$srcdir/outbox.control") =~ /default_version\s*=\s*'([^']+)'/;
ok(scalar(@full) >= 2, 'there are full install scripts of at least two versions: ' . join(', ', @full));
is($full[-1], $default, "the newest full install script is the default version ($default)");
my $oldest = $full[0];

sub version_cmp
{
	my ($x, $y) = @_;
	my @a = split /\./, $x;
	my @b = split /\./, $y;
	while (@a || @b)
	{
		my $c = (shift(@a) // 0) <=> (shift(@b) // 0);
		return $c if $c;
	}
	return 0;
}

my $node = relay_node('install_vs_update');

# What the schema is, as sorted lines of text that name no OIDs.
my $describe = q{
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'outbox'),
members AS (
  SELECT d.classid, d.objid FROM pg_depend d, ext
   WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (
  SELECT c.* FROM pg_class c JOIN members m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid),
allrels AS (
  SELECT c.* FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'outbox'),
procs AS (
  SELECT p.* FROM pg_proc p JOIN members m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid)
SELECT line FROM (
  SELECT 'member ' || pg_describe_object(classid, objid, 0) AS line FROM members
  UNION ALL
  SELECT 'relation ' || c.oid::regclass || ' kind ' || c.relkind::text || ' persistence ' || c.relpersistence::text
         || ' options ' || coalesce(c.reloptions::text, '-') || ' acl ' || coalesce(c.relacl::text, '-')
         || ' owner ' || c.relowner::regrole || ' rls ' || c.relrowsecurity
         || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
    FROM allrels c
  UNION ALL
  SELECT 'column ' || c.oid::regclass || ' #' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
         || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
         || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
         || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
         || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
         || CASE WHEN a.attgenerated <> '' THEN ' generated ' || a.attgenerated::text ELSE '' END
         || ' collation ' || coalesce(a.attcollation::regcollation::text, '-')
         || ' acl ' || coalesce(a.attacl::text, '-')
         || ' comment ' || coalesce(col_description(c.oid, a.attnum), '-')
    FROM allrels c JOIN pg_attribute a ON a.attrelid = c.oid
    LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'v', 'p', 'm', 'f')
  UNION ALL
  SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
         || ' deferrable ' || condeferrable || ' deferred ' || condeferred
    FROM pg_constraint WHERE connamespace = 'outbox'::regnamespace
  UNION ALL
  SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index i JOIN allrels c ON c.oid = i.indrelid
  UNION ALL
  SELECT 'sequence ' || seqrelid::regclass || ' ' || format_type(seqtypid, NULL) || ' ' || seqstart || ' '
         || seqincrement || ' ' || seqmax || ' ' || seqmin || ' ' || seqcache || ' ' || seqcycle
    FROM pg_sequence s JOIN allrels c ON c.oid = s.seqrelid
  UNION ALL
  SELECT 'view ' || c.oid::regclass || ' ' || pg_get_viewdef(c.oid) FROM allrels c WHERE c.relkind IN ('v', 'm')
  UNION ALL
  SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
    FROM pg_trigger t JOIN allrels c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal
  UNION ALL
  SELECT 'rule ' || r.rulename || ' ' || pg_get_ruledef(r.oid)
    FROM pg_rewrite r JOIN allrels c ON c.oid = r.ev_class WHERE r.rulename <> '_RETURN'
  UNION ALL
  SELECT 'policy ' || pol.polname || ' on ' || pol.polrelid::regclass
    FROM pg_policy pol JOIN allrels c ON c.oid = pol.polrelid
  UNION ALL
  SELECT 'function ' || p.oid::regprocedure || ' acl ' || coalesce(p.proacl::text, '-')
         || ' owner ' || p.proowner::regrole
         || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '-') || E'\n'
         || CASE WHEN p.prokind IN ('a', 'w') THEN 'aggregate' ELSE pg_get_functiondef(p.oid) END
    FROM procs p
  UNION ALL
  SELECT 'function outside the extension ' || p.oid::regprocedure
    FROM pg_proc p WHERE p.pronamespace = 'outbox'::regnamespace
     AND NOT EXISTS (SELECT 1 FROM procs q WHERE q.oid = p.oid)
  UNION ALL
  SELECT 'type ' || t.oid::regtype || ' ' || t.typtype::text
    FROM pg_type t WHERE t.typnamespace = 'outbox'::regnamespace AND t.typrelid = 0 AND t.typelem = 0
  UNION ALL
  SELECT 'schema ' || n.nspname || ' owner ' || n.nspowner::regrole || ' acl ' || coalesce(n.nspacl::text, '-')
         || ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '-')
    FROM pg_namespace n WHERE n.nspname = 'outbox'
  UNION ALL
  SELECT 'dumped ' || c::regclass || ' where ' || coalesce(w, '-')
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u(c, w) WHERE e.extname = 'outbox'
  UNION ALL
  SELECT 'extension ' || extname || ' ' || extversion || ' schema ' || extnamespace::regnamespace
         || ' relocatable ' || extrelocatable FROM pg_extension WHERE extname = 'outbox'
  UNION ALL
  SELECT 'default privileges ' || defaclrole::regrole || ' ' || defaclobjtype::text || ' ' || defaclacl::text
    FROM pg_default_acl WHERE defaclnamespace = 'outbox'::regnamespace
) s ORDER BY line;
};

sub schema_of
{
	my ($how, @sql) = @_;
	$node->safe_psql('postgres', 'DROP EXTENSION IF EXISTS outbox CASCADE');
	$node->safe_psql('postgres', $_) for @sql;
	my $d = $node->safe_psql('postgres', $describe);
	return $d;
}

for my $v (@full[1 .. $#full])
{
	my $direct = schema_of("direct $v", "CREATE EXTENSION outbox VERSION '$v'");
	my $updated = schema_of("$oldest updated to $v",
		"CREATE EXTENSION outbox VERSION '$oldest'",
		"ALTER EXTENSION outbox UPDATE TO '$v'");
	cmp_ok(scalar(split /\n/, $direct), '>', 200, "$v: the description of the schema is not empty");
	like($direct, qr/^extension outbox \Q$v\E /m, "$v: created directly at $v");
	like($updated, qr/^extension outbox \Q$v\E /m, "$v: updated from $oldest to $v");
	if ($direct eq $updated)
	{
		pass("$v: a direct install and the update from $oldest give the same schema");
	}
	else
	{
		my $dir = PostgreSQL::Test::Utils::tempdir();
		open(my $a, '>', "$dir/direct") or die;
		print $a $direct, "\n";
		close $a;
		open(my $b, '>', "$dir/updated") or die;
		print $b $updated, "\n";
		close $b;
		my $diff = `diff -u $dir/direct $dir/updated`;
		fail("$v: a direct install and the update from $oldest give the same schema");
		diag("--- direct $v, +++ $oldest updated to $v:\n$diff");
	}
}

# The check itself can fail: a schema that differs by one grant is seen.
my $base = schema_of('direct', "CREATE EXTENSION outbox VERSION '$default'");
$node->safe_psql('postgres', 'GRANT SELECT ON outbox.stats TO PUBLIC');
isnt($node->safe_psql('postgres', $describe), $base, 'the description sees a changed grant');
$node->safe_psql('postgres', 'REVOKE SELECT ON outbox.stats FROM PUBLIC');
is($node->safe_psql('postgres', $describe), $base, 'and the same again once the grant is revoked');
$node->safe_psql('postgres', q{ALTER FUNCTION outbox.target_pending(int) SET work_mem = '1MB'});
isnt($node->safe_psql('postgres', $describe), $base, 'the description sees a changed function definition');

$node->stop;

# The newest full script reads as one schema (test/check-schema-script.sh,
# also run by make lint): each object made once, in its final shape.  The
# check fails on a copy that breaks each of its rules.
my $check = "$srcdir/test/check-schema-script.sh";
my ($out, $err);
ok(IPC::Run::run([ $check, "$srcdir/outbox--$default.sql" ], '>', \$out, '2>', \$err),
	"outbox--$default.sql creates each object once, in its final shape")
  or diag($err);
my $script = slurp_file("$srcdir/outbox--$default.sql");
my %broken = (
	'a table altered after its CREATE TABLE' => "ALTER TABLE outbox.targets ADD COLUMN extra text;\n",
	'a function defined again' =>
	  "CREATE OR REPLACE FUNCTION outbox.frontier() RETURNS bigint LANGUAGE sql AS \$\$ SELECT 0::bigint \$\$;\n",
	'a function dropped' => "DROP FUNCTION outbox.frontier();\n",
	'a view made twice' => "CREATE VIEW outbox.lag AS SELECT 1;\n",
	'a table altered, in lower case, over two lines' => "alter table only\n  outbox.targets add column extra text;\n",
	'an ALTER after a comment holding a dollar quote' =>
	  "-- not a body: \$\$\nALTER TABLE outbox.targets ADD COLUMN extra text;\n",
	'a function altered' => "ALTER FUNCTION outbox.frontier() STABLE;\n",
	'an object commented twice' => "COMMENT ON VIEW outbox.lag IS 'again';\n");
my $dir = PostgreSQL::Test::Utils::tempdir();
for my $what (sort keys %broken)
{
	my $copy = "$dir/outbox--$default.sql";
	open(my $fh, '>', $copy) or die "$copy: $!";
	print $fh $script, $broken{$what};
	close $fh;
	ok(!IPC::Run::run([ $check, $copy ], '>', \$out, '2>', \$err), "the check refuses $what")
	  and like($err, qr/outbox--\Q$default\E\.sql:\d+:/, '... naming the line');
}

done_testing();
