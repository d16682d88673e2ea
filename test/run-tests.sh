#!/usr/bin/env bash
# Run the whole test suite: the test HTTP receiver's self-test
# (test/sink/selftest.sh), then pg_regress (sql/, expected/) and the TAP
# tests (test/t/), each against throwaway servers of their own, on the
# PostgreSQL versions PG names:
#
#   PG=15   (the default) Debian's PostgreSQL 15
#   PG=18   PostgreSQL 18, laid out by ../shared/pg18/setup.sh (needs npm)
#   PG=all  both, one after the other: what CI runs (make test PG=all)
#
# PostgreSQL refuses to run as root, so when run as root this script
# installs the extension, copies the tree to a scratch directory owned by an
# unprivileged user (postgres by default, OUTBOX_TEST_USER to change) and
# runs the tests there as that user.  Failure output is copied back to
# test-output/<version>/.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
PG=${PG:-15}
case $PG in
	all) versions="15 18" ;;
	15 | 18) versions=$PG ;;
	*)
		echo "PG must be 15, 18 or all, not '$PG'" >&2
		exit 2
		;;
esac
# curl: the sink's self-test; npm (for PostgreSQL 18's layout) from apt
# only when no npm is installed (the machine's Node.js may bring its own).
extra=(curl)
case " $versions " in
	*" 18 "*) command -v npm >/dev/null || extra+=(npm) ;;
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
		18)
			local shared=${OUTBOX_SHARED:-$here/../shared}
			local dir=${OUTBOX_PG18_DIR:-/tmp/outbox-pg18}
			if [ ! -x "$shared/pg18/setup.sh" ] && [ ! -f "$shared/pg18/setup.sh" ]; then
				echo "PostgreSQL 18 needs $shared/pg18/setup.sh (set OUTBOX_SHARED)" >&2
				return 1
			fi
			bash "$shared/pg18/setup.sh" "$dir"
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
		return 1
	}
	bindir=$("$pgc" --bindir) || return 1
	echo "=== PostgreSQL $v ($("$bindir/postgres" --version))"
	local start=$SECONDS

	scratch=$(mktemp -d /tmp/outbox-test-$v.XXXXXX)
	tar --exclude=./.git --exclude=./tmp_check --exclude=./tmp_check_regress \
		--exclude=./results --exclude=./test-output -cf - . | tar -C "$scratch" -xf -
	# Built with every compiler warning an error, on each version.
	(cd "$scratch" && make -s clean >/dev/null &&
		make -s PG_CONFIG="$pgc" WERROR=1 && make -s PG_CONFIG="$pgc" install) || {
		echo "=== PostgreSQL $v: the build failed" >&2
		rm -rf "$scratch"
		return 1
	}
	if [ "$(id -u)" -eq 0 ]; then chown -R "$user" "$scratch"; fi

	if [ "$v" = 15 ]; then
		# Debian's PGXS runs pg_regress, then the TAP tests (prove).
		as_user bash -c "cd '$scratch' && make -s PG_CONFIG='$pgc' installcheck" || rc=$?
	else
		# This build of 18 was configured without TAP support, so PGXS runs
		# only pg_regress; prove runs the TAP tests with 18's own library.
		local d
		d=$(dirname "$pgc")
		as_user bash -c "cd '$scratch' && make -s PG_CONFIG='$pgc' installcheck" || rc=$?
		as_user bash -c "cd '$scratch' && rm -rf tmp_check && mkdir -p tmp_check && \
			PATH='$d/bin':\$PATH TESTDIR='$scratch' PGPORT=65432 \
			PG_REGRESS='$d/native/lib/postgresql/pgxs/src/test/regress/pg_regress' \
			prove -I '$d/perl' -I test/t test/t/*.pl" || tap_rc=$?
		[ $tap_rc -ne 0 ] && rc=$tap_rc
	fi

	rm -rf "$here/test-output/$v"
	if [ $rc -ne 0 ]; then
		mkdir -p "$here/test-output/$v"
		for f in regression.diffs regression.out results tmp_check/log; do
			[ -e "$scratch/$f" ] && cp -r "$scratch/$f" "$here/test-output/$v/" || true
		done
		[ -f "$scratch/regression.diffs" ] && head -200 "$scratch/regression.diffs"
		echo "PostgreSQL $v: test output kept in test-output/$v/" >&2
	fi
	rm -rf "$scratch"
	echo "=== PostgreSQL $v: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
	return $rc
}

status=0
for v in $versions; do
	run_suite "$v" || status=1
done
exit $status
