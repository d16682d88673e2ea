#!/usr/bin/env bash
# The shared library exports only what PostgreSQL looks up in it.
#
#   test/check-symbols.sh [LIBRARY [SRCDIR]]
#
# LIBRARY is the built module (default: outbox.so), SRCDIR its sources
# (default: src); the SQL scripts are SRCDIR/../outbox--*.sql.  What PostgreSQL looks up by name: the magic block
# (Pg_magic_func), _PG_init, the logical decoding output plugin's
# _PG_output_plugin_init, the background workers' entry points (what
# launcher.c and outbox.c name in bgw_function_name), and each SQL-callable
# function with its info record (PG_FUNCTION_INFO_V1(f) makes f and
# pg_finfo_f), and every C function an install or update script names
# (AS 'MODULE_PATHNAME', 'f').  Everything else is built with hidden visibility (the
# Makefile's -fvisibility=hidden): a global of ours must not collide with
# another library's symbol of the same name in the server's symbol space.
# Fails, naming them, on any other symbol the library defines in its dynamic
# symbol table, and on an expected one it lacks; and on a library with the
# test hooks (unless OUTBOX_TEST_FAULTS is set).  Run by `make lint`.
set -euo pipefail
lib=${1:-outbox.so}
srcdir=${2:-src}
[ -f "$lib" ] || { echo "check-symbols: $lib is missing (build first)" >&2; exit 2; }

expected=$( {
	printf '%s\n' Pg_magic_func _PG_init _PG_output_plugin_init
	grep -ho 'bgw_function_name, "[A-Za-z0-9_]*"' "$srcdir"/*.c | sed 's/.*"\(.*\)"/\1/'
	grep -ho '"outbox_[a-z_]*_main"' "$srcdir"/*.c | tr -d '"'
	grep -ho '^PG_FUNCTION_INFO_V1([A-Za-z0-9_]*)' "$srcdir"/*.c |
		sed 's/PG_FUNCTION_INFO_V1(\(.*\))/\1\npg_finfo_\1/'
	# what the SQL scripts call, old versions' too (an update runs them)
	grep -ho "'MODULE_PATHNAME', *'[A-Za-z0-9_]*'" "$srcdir"/../outbox--*.sql |
		sed "s/.*, *'\(.*\)'/\1\npg_finfo_\1/"
} | sort -u)
# Defined (not U), global or weak, functions and data; not the linker's
# own section markers.
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ { print $3 }' |
	grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u)

# A product build has no test hooks (src/base.h): what make builds without
# OUTBOX_TEST_FAULTS (the Makefile rebuilds when that changes).
if [ "${OUTBOX_TEST_FAULTS:-}" = "" ] && grep -a -q -E 'outbox\.test_fault|injected fault' "$lib"; then
	echo "check-symbols: $lib has the test hooks of outbox.test_fault: a product build must not (rebuild without OUTBOX_TEST_FAULTS)" >&2
	exit 1
fi

extra=$(comm -13 <(echo "$expected") <(echo "$exported"))
missing=$(comm -23 <(echo "$expected") <(echo "$exported"))
status=0
if [ -n "$extra" ]; then
	echo "check-symbols: $lib exports $(echo "$extra" | wc -l) symbols PostgreSQL does not look up (give them hidden visibility, or make them static):" >&2
	echo "$extra" | sed 's/^/  /' >&2
	status=1
fi
if [ -n "$missing" ]; then
	echo "check-symbols: $lib does not export what PostgreSQL looks up:" >&2
	echo "$missing" | sed 's/^/  /' >&2
	status=1
fi
[ $status -eq 0 ] && echo "check-symbols: $lib exports $(echo "$exported" | wc -l) symbols, each one PostgreSQL looks up"
exit $status
