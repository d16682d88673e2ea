#!/usr/bin/env bash
# The newest full install script reads as one schema: each object made
# once, with its final shape.
#
#   test/check-schema-script.sh [SCRIPT]
#
# SCRIPT defaults to outbox--V.sql for outbox.control's default_version.
# Fails, naming the line, on:
#   - CREATE OR REPLACE (a function or view defined again),
#   - DROP of anything (made, then taken back),
#   - ALTER TABLE of a table the script creates, but for ENABLE ALWAYS
#     TRIGGER and ADD CONSTRAINT ... NOT VALID, which CREATE TABLE and
#     CREATE TRIGGER cannot say,
#   - a table, view or sequence created twice.
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

awk -v file="$(basename "$script")" '
function fail(msg) { printf "check-schema-script: %s:%d: %s\n", file, NR, msg > "/dev/stderr"; bad = 1 }
# outside dollar-quoted bodies only
{
	line = $0
	n = gsub(/\$[A-Za-z_]*\$/, "&", line)
	if (inbody) { if (n % 2 == 1) inbody = 0; next }
	if (n % 2 == 1) inbody = 1
	sub(/--.*/, "", line)
}
line ~ /^[ \t]*CREATE[ \t]+OR[ \t]+REPLACE/ { fail("CREATE OR REPLACE: define it once, as it is") }
line ~ /^[ \t]*DROP[ \t]/ { fail("DROP: make only what stays") }
line ~ /^[ \t]*CREATE[ \t]+(UNLOGGED[ \t]+)?TABLE[ \t]/ {
	split(line, w, /[ \t(]+/); for (i = 1; i <= length(w); i++) if (w[i] == "TABLE") { name = w[i + 1]; break }
	if (name in made) fail("table " name " created twice")
	made[name] = 1
}
line ~ /^[ \t]*CREATE[ \t]+(VIEW|SEQUENCE)[ \t]/ {
	split(line, w, /[ \t(]+/); name = w[3]
	if (name in made) fail(w[2] " " name " created twice")
	made[name] = 1
}
line ~ /^[ \t]*ALTER[ \t]+TABLE[ \t]/ {
	split(line, w, /[ \t]+/); name = w[3]; stmt = line; start = NR
	while (stmt !~ /;[ \t]*$/ && (getline nextline) > 0) { sub(/--.*/, "", nextline); stmt = stmt " " nextline }
	if (name in made) {
		rest = stmt
		sub(/^[ \t]*ALTER[ \t]+TABLE[ \t]+[^ \t]+[ \t]+/, "", rest)
		if (rest !~ /^ENABLE[ \t]+ALWAYS[ \t]+TRIGGER[ \t]+[A-Za-z_0-9]+[ \t]*;/) {
			# ADD CONSTRAINT ... NOT VALID, each clause
			n = split(rest, clauses, /,[ \t]*ADD[ \t]+/)
			for (i = 1; i <= n; i++) {
				c = clauses[i]; sub(/^ADD[ \t]+/, "", c)
				if (c !~ /^CONSTRAINT[ \t]/ || c !~ /NOT[ \t]+VALID[ \t]*;?[ \t]*$/) {
					fail("ALTER TABLE " name " (line " start "): give the table its final shape in CREATE TABLE")
					break
				}
			}
		}
	}
}
END { exit bad }
' "$script" && echo "check-schema-script: $(basename "$script") creates each object once, in its final shape"
