#!/usr/bin/env bash
# Dependencies between the extension's C files point one way.
#
#   test/check-layering.sh [DIR [SRCDIR]]
#
# DIR holds the built objects (default: src), SRCDIR the sources (default:
# DIR; they differ in a VPATH build).  For each SRCDIR/NAME.c, built as
# DIR/NAME.o, the files whose extern functions and variables it uses: its
# undefined symbols (nm -u) matched to the global symbols other objects
# define (nm --defined-only -g).  Prints that graph, one line a file, then
# fails if the graph has a cycle (a file that calls, through any chain,
# back into itself), if the base module (base.o) uses any other file, or if
# any file uses outbox.o (module load, _PG_init: it calls everyone's init,
# so nothing may call back into it).  Run by `make lint`, after the build.
# Symbols used through a header (macros, static inline functions) are not
# seen: they are the header's, not a file's.
set -euo pipefail
dir=${1:-src}
srcdir=${2:-$dir}
shopt -s nullglob
objs=()
for c in "$srcdir"/*.c; do
	o="$dir/$(basename "$c" .c).o"
	[ -f "$o" ] || { echo "check-layering: $o is missing (build first)" >&2; exit 2; }
	objs+=("$o")		# an object left from a removed file is not ours
done
if [ ${#objs[@]} -eq 0 ]; then
	echo "check-layering: no sources in $srcdir/" >&2
	exit 2
fi

# "def FILE SYMBOL" and "use FILE SYMBOL" lines, then the graph and its
# checks in awk.
for o in "${objs[@]}"; do
	f=$(basename "$o" .o)
	nm --defined-only -g "$o" | awk -v f="$f" 'NF >= 3 { print "def", f, $3 }'
	nm -u "$o" | awk -v f="$f" 'NF >= 2 { print "use", f, $2 }'
done | awk -v base=base -v top=outbox '
$1 == "def" { owner[$3] = $2; files[$2] = 1; next }
$1 == "use" { use[++nuse] = $2 " " $3; files[$2] = 1; next }
END {
	for (i = 1; i <= nuse; i++) {
		split(use[i], u, " ")
		if (!(u[2] in owner) || owner[u[2]] == u[1])
			continue
		e = u[1] SUBSEP owner[u[2]]
		edge[e] = 1
	}
	n = 0
	for (f in files)
		names[++n] = f
	# sort the names (insertion sort: a few dozen files)
	for (i = 2; i <= n; i++) {
		v = names[i]
		for (j = i - 1; j >= 1 && names[j] > v; j--)
			names[j + 1] = names[j]
		names[j + 1] = v
	}
	bad = 0
	for (i = 1; i <= n; i++) {
		f = names[i]
		line = ""
		for (a = 1; a <= n; a++)
			if ((f SUBSEP names[a]) in edge)
				line = line " " names[a]
		printf "%-22s ->%s\n", f ".c", (line == "" ? " (none)" : line)
	}
	if (base in files) {
		for (a = 1; a <= n; a++)
			if ((base SUBSEP names[a]) in edge) {
				printf "check-layering: %s.c uses %s.c; the base module uses no other file\n", base, names[a]
				bad = 1
			}
	}
	for (a = 1; a <= n; a++)
		if ((names[a] SUBSEP top) in edge) {
			printf "check-layering: %s.c uses %s.c, which is module load (_PG_init): nothing may call back into it\n", names[a], top
			bad = 1
		}
	# Depth-first search for cycles: a grey node reached again closes one.
	for (i = 1; i <= n; i++)
		color[names[i]] = 0
	ncycles = 0
	for (i = 1; i <= n; i++)
		if (color[names[i]] == 0)
			dfs(names[i], 0)
	if (ncycles > 0)
		bad = 1
	if (!bad)
		printf "check-layering: %d files, no cycles\n", n
	exit bad
}
function dfs(v, depth,    a, w) {
	color[v] = 1
	stack[depth] = v
	for (a = 1; a <= n; a++) {
		w = names[a]
		if (!((v SUBSEP w) in edge))
			continue
		if (color[w] == 1)
			report(w, depth)
		else if (color[w] == 0)
			dfs(w, depth + 1)
	}
	color[v] = 2
}
function report(w, depth,    s, line, started) {
	line = ""
	started = 0
	for (s = 0; s <= depth; s++) {
		if (stack[s] == w)
			started = 1
		if (started)
			line = line stack[s] ".c -> "
	}
	printf "check-layering: cycle: %s%s.c\n", line, w
	ncycles++
}
'
