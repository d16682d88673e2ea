#!/usr/bin/env bash
# Run the whole test suite: the test HTTP receiver's self-test
# (test/sink/selftest.sh), then pg_regress (sql/, expected/) and the TAP
# tests (test/t/), each against throwaway servers of their own, on the
# PostgreSQL versions PG names:
#
#   PG=15     (the default) Debian's PostgreSQL 15
#   PG=16, PG=17, PG=18
#             that version, laid out by ../shared/pg<N>/setup.sh (needs npm)
#   PG=all    15, 16, 17 and 18, one after the other: what CI runs
#   PG="15 18" any list of them
#
# The TAP files of a version run OUTBOX_TEST_JOBS at a time (default 4:
# they spend most of their time waiting for servers, not computing), the
# longest first, each with servers on ports no other file takes (the TAP
# library's port locks, in the scratch tree's tmp_check); every node is a
# copy of one initdb (OUTBOX_INITDB_CACHE, see OutboxRelayTest.pm).  The
# end of the run prints each version's time and the ten slowest TAP files
# that passed.  OUTBOX_TEST_FILES="029 053" runs only those files.
#
# The stress run, OUTBOX_TEST_STRESS=1 (make stress): the same suite on a
# machine made slower on purpose, so that a test that depends on how fast
# the machine is fails here rather than in CI: two CPU hogs a core, at the
# tests' own priority and each in a session of its own (the scheduler
# shares the CPU between sessions, and every server is one), and six files
# at a time unless OUTBOX_TEST_JOBS says otherwise.  OUTBOX_TEST_STRESS=N
# (N > 1) starts N hogs.
#
# Each version runs in a scratch copy of the tree, on /dev/shm when it is
# a tmpfs with 4 GiB free (OUTBOX_TEST_TMPDIR to choose; /tmp otherwise).
# The kits of 16, 17 and 18 are laid out in $OUTBOX_KIT_ROOT/outbox-pgN
# (/tmp by default): two runs at once need two roots, as each installs the
# extension into its kit.
# PostgreSQL refuses to run as root, so when run as root this script
# installs the extension, copies the tree to a scratch directory owned by an
# unprivileged user (postgres by default, OUTBOX_TEST_USER to change) and
# runs the tests there as that user.  Failure output is copied back to
# test-output/<version>/.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
PG=${PG:-15}
[ "$PG" = all ] && PG="15 16 17 18"
versions=
for v in $PG; do
	case $v in
		15 | 16 | 17 | 18) versions="$versions $v" ;;
		*)
			echo "PG must be 15, 16, 17, 18, a list of them or all, not '$PG'" >&2
			exit 2
			;;
	esac
done
stress=${OUTBOX_TEST_STRESS:-0}
case $stress in
	0) hogs=0 ;;
	1) hogs=$((2 * $(nproc))) ;;
	*[!0-9]*)
		echo "OUTBOX_TEST_STRESS must be 0, 1 (two hogs a core) or a number of hogs, not '$stress'" >&2
		exit 2
		;;
	*) hogs=$stress ;;
esac
if [ "$hogs" -gt 0 ]; then jobs=${OUTBOX_TEST_JOBS:-6}; else jobs=${OUTBOX_TEST_JOBS:-4}; fi
# curl: the sink's self-test; npm (for PostgreSQL 18's layout) from apt
# only when no npm is installed (the machine's Node.js may bring its own).
extra=(curl)
case " $versions " in
	*" 16 "* | *" 17 "* | *" 18 "*) command -v npm >/dev/null || extra+=(npm) ;;
esac
"$here/test/install-deps.sh" "${extra[@]}"

# The receiver the relay tests rely on must itself work.
if ! selftest_out=$(bash "$here/test/sink/selftest.sh" 2>&1); then
	echo "$selftest_out" >&2
	echo "test/sink/selftest.sh failed" >&2
	exit 1
fi
echo "test/sink/selftest.sh: $(echo "$selftest_out" | grep -c '^ok') checks passed"

user=${OUTBOX_TEST_USER:-postgres}
if [ "$(id -u)" -eq 0 ] && ! id "$user" >/dev/null 2>&1; then
	useradd --system --create-home --shell /bin/bash "$user"
fi

# Run $* as the test user (or as ourselves when not root).
as_user() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u "$user" -- env PATH="$PATH" "$@"
	else
		"$@"
	fi
}

# pg_config of a version.
pg_config_of() {
	case $1 in
		15)
			if [ -x /usr/lib/postgresql/15/bin/pg_config ]; then
				echo /usr/lib/postgresql/15/bin/pg_config
			else
				command -v pg_config
			fi
			;;
		*)
			local shared=${OUTBOX_SHARED:-$here/../shared}
			local dir=${OUTBOX_KIT_ROOT:-/tmp}/outbox-pg$1
			if [ ! -f "$shared/pg$1/setup.sh" ]; then
				echo "PostgreSQL $1 needs $shared/pg$1/setup.sh (set OUTBOX_SHARED)" >&2
				return 1
			fi
			bash "$shared/pg$1/setup.sh" "$dir" | tail -1
			;;
	esac
}

# Run the suite on one version in a scratch copy of the tree; returns its
# exit status.
run_suite() {
	local v=$1 pgc bindir scratch rc=0 tap_rc=0
	# (set -e does not apply here: the caller tests our status.)
	pgc=$(pg_config_of "$v") && [ -n "$pgc" ] || {
		echo "=== PostgreSQL $v: no pg_config" >&2
		echo "$v -" >> "$timings/versions"
		return 1
	}
	bindir=$("$pgc" --bindir) || return 1
	echo "=== PostgreSQL $v ($("$bindir/postgres" --version))"
	local start=$SECONDS

	scratch=$(mktemp -d "$scratch_root/outbox-test-$v.XXXXXX")
	tar --exclude=./.git --exclude=./tmp_check --exclude=./tmp_check_regress \
		--exclude=./results --exclude=./test-output -cf - . | tar -C "$scratch" -xf -
	# Built with every compiler warning an error, on each version.
	(cd "$scratch" && make -s clean >/dev/null &&
		make -s -j"$(nproc)" PG_CONFIG="$pgc" WERROR=1 OUTBOX_TEST_FAULTS=1 &&
		make -s PG_CONFIG="$pgc" OUTBOX_TEST_FAULTS=1 install) || {
		echo "=== PostgreSQL $v: the build failed" >&2
		echo "$v -" >> "$timings/versions"
		rm -rf "$scratch"
		return 1
	}
	if [ "$(id -u)" -eq 0 ]; then chown -R "$user" "$scratch"; fi

	# pg_regress, from PGXS; then the TAP files with prove: Debian's 15
	# through PGXS, the kits' versions (configured without TAP) with their
	# own TAP library.
	as_user bash -c "cd '$scratch' && make -s PG_CONFIG='$pgc' installcheck TAP_TESTS=" || {
		rc=$?
		echo "pg_regress failed (regression.diffs below and in test-output/$v/)" > "$timings/$v.regress"
	}
	local perl_lib regress
	if [ "$v" = 15 ]; then
		perl_lib=$("$pgc" --pgxs | sed 's|/src/makefiles/pgxs.mk$|/src/test/perl|')
		regress=$(dirname "$("$pgc" --pgxs)")/../test/regress/pg_regress
		bindir=$("$pgc" --bindir)
	else
		local d
		d=$(dirname "$pgc")
		perl_lib=$d/perl
		regress=$d/native/lib/postgresql/pgxs/src/test/regress/pg_regress
		bindir=$d/bin
	fi
	as_user bash -c "cd '$scratch' && rm -rf tmp_check && mkdir -p tmp_check && \
		PATH='$bindir':\$PATH TESTDIR='$scratch' PGPORT=65432 \
		PG_REGRESS='$regress' \
		OUTBOX_INITDB_CACHE='$scratch/tmp_check/initdb-cache' \
		prove -j '$jobs' --timer -I '$perl_lib' -I test/t $tap_files 2>&1" |
		tee "$timings/$v.tap" || tap_rc=$?
	[ $tap_rc -ne 0 ] && rc=$tap_rc
	echo "$v $((SECONDS - start))" >> "$timings/versions"

	rm -rf "$here/test-output/$v"
	if [ $rc -ne 0 ]; then
		mkdir -p "$here/test-output/$v"
		# TAP logs: tmp_check/log (15, PGXS), log (the kits' TAP library)
		for f in regression.diffs regression.out results tmp_check/log log; do
			[ -e "$scratch/$f" ] && cp -r "$scratch/$f" "$here/test-output/$v/" || true
		done
		[ -f "$scratch/regression.diffs" ] && head -200 "$scratch/regression.diffs"
		echo "PostgreSQL $v: test output kept in test-output/$v/" >&2
	fi
	rm -rf "$scratch"
	[ $rc -ne 0 ] && : > "$timings/$v.failed"
	echo "=== PostgreSQL $v: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
	return $rc
}

# The TAP files in the order prove starts them: the longest first (their
# order by time in a make test PG=all of this machine, 049 first as its
# time varies most), so that none of them is left running alone at the
# end, then the rest by number.
slow_first="049 068 053 069 071 051 067 030 040 038 050 035 059 033 024 047 044 048 032 057 055 029 058 070 056"
tap_files=
for n in $slow_first; do
	for f in test/t/"$n"_*.pl; do
		[ -f "$f" ] && tap_files="$tap_files $f"
	done
done
for f in test/t/*.pl; do
	case " $tap_files " in *" $f "*) ;; *) tap_files="$tap_files $f" ;; esac
done
if [ -n "${OUTBOX_TEST_FILES:-}" ]; then
	picked=
	for f in $tap_files; do
		for n in $OUTBOX_TEST_FILES; do
			case $f in test/t/"$n"_*) picked="$picked $f"; break ;; esac
		done
	done
	[ -n "$picked" ] || { echo "OUTBOX_TEST_FILES='$OUTBOX_TEST_FILES' names no TAP file" >&2; exit 2; }
	tap_files=$picked
fi

# Where the scratch trees go: OUTBOX_TEST_TMPDIR, else /dev/shm when it is
# a tmpfs with room (the servers' data directories, copies of the initdb
# template and every file's logs: a version's files create tens of
# thousands of files, and on a disk file system creating them costs more
# CPU than the tests themselves), else /tmp.  A version needs about 1 GiB
# at its peak; 4 GiB free is asked.
scratch_root=${OUTBOX_TEST_TMPDIR:-}
if [ -z "$scratch_root" ]; then
	scratch_root=/tmp
	if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ -w /dev/shm ] &&
		[ "$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')" -ge $((4 * 1024 * 1024)) ]; then
		scratch_root=/dev/shm
	fi
fi
[ -d "$scratch_root" ] && [ -w "$scratch_root" ] || {
	echo "OUTBOX_TEST_TMPDIR='$scratch_root' is not a directory this user can write" >&2
	exit 2
}
echo "=== scratch trees in $scratch_root"

# Each version's time and prove's output, for the summary at the end.
timings=$(mktemp -d /tmp/outbox-test-times.XXXXXX)
hog_pids=
cleanup() {
	[ -n "$hog_pids" ] && kill $hog_pids 2>/dev/null
	rm -rf "$timings"
}
trap cleanup EXIT
: > "$timings/versions"

if [ "$hogs" -gt 0 ]; then
	for _ in $(seq "$hogs"); do
		# (each ends when this script does, however it ends)
		perl -MPOSIX -e 'my $p = getppid(); POSIX::setsid(); 1 while getppid() == $p' &
		hog_pids="$hog_pids $!"
	done
	echo "=== stress: $hogs CPU hogs at the tests' priority, $jobs TAP files at a time"
fi

status=0
for v in $versions; do
	run_suite "$v" || status=1
done

echo "=== time per version"
while read -r v secs; do
	if [ "$secs" = - ]; then
		echo "  PostgreSQL $v: not built"
	else
		printf '  PostgreSQL %s: %d min %02d s\n' "$v" $((secs / 60)) $((secs % 60))
	fi
done < "$timings/versions"
echo "=== the ten slowest TAP files that passed (prove prints no time for a failed one)"
# prove --timer: "[hh:mm:ss] test/t/NAME.pl ..... ok     1234 ms ( ...)"
for f in "$timings"/*.tap; do
	[ -f "$f" ] || continue
	sed -n 's|^\[[0-9:]*\] \(test/t/[^ ]*\.pl\) .* \([0-9][0-9]*\) ms.*|\2 \1|p' "$f" |
		sed "s|\$| (PostgreSQL $(basename "$f" .tap))|"
# awk reads every line (head would exit early, and sort die of SIGPIPE under
# pipefail once its output outgrows one write).
done | sort -rn | awk 'NR <= 10 { ms = $1; $1 = ""; printf "  %6.1f s %s\n", ms / 1000, $0 }'
# Last, so that the tail of a CI log says what failed: each version's
# verdict, and for a failed one prove's summary of the failed files and the
# first lines of the failed checks (the whole output is above, and the
# servers' logs in test-output/<version>/).
echo "=== result per version"
while read -r v secs; do
	if [ "$secs" = - ]; then
		echo "  PostgreSQL $v: FAILED (not built)"
	elif [ -f "$timings/$v.failed" ]; then
		echo "  PostgreSQL $v: FAILED"
		[ -f "$timings/$v.regress" ] && sed 's/^/    /' "$timings/$v.regress"
		if [ -f "$timings/$v.tap" ]; then
			# (awk, not head: it reads everything, so nothing dies of
			# SIGPIPE under pipefail; || true: no match is no error)
			sed -n '/^Test Summary Report/,/^Files=/p' "$timings/$v.tap" |
				{ grep -v -e '^Test Summary Report' -e '^---' -e '^Files=' || true; } |
				awk 'NR <= 12 { print "    " $0 }'
			{ grep -E '^(not ok|#   Failed test|#   at |# +(got|expected):|# Looks like)' "$timings/$v.tap" || true; } |
				awk 'NR <= 12 { print "    " $0 }'
		fi
	else
		echo "  PostgreSQL $v: passed"
	fi
done < "$timings/versions"
exit $status
