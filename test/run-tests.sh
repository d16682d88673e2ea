#!/usr/bin/env bash
# Run the whole test suite: the test HTTP receiver's self-test
# (test/sink/selftest.sh), then pg_regress (sql/, expected/) and the TAP
# tests (test/t/), each against throwaway servers of its own.
#
# PostgreSQL refuses to run as root, so when run as root this script
# installs the extension, copies the tree to a scratch directory owned by an
# unprivileged user (postgres by default, OUTBOX_TEST_USER to change) and
# runs the tests there as that user.  Failure output is copied back to
# test-output/.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
"$here/test/install-deps.sh" curl	# curl: the sink's self-test
PG_CONFIG=${PG_CONFIG:-pg_config}
make -s PG_CONFIG="$PG_CONFIG"

# The receiver the relay tests rely on must itself work.
if ! selftest_out=$(bash "$here/test/sink/selftest.sh" 2>&1); then
	echo "$selftest_out" >&2
	echo "test/sink/selftest.sh failed" >&2
	exit 1
fi
echo "test/sink/selftest.sh: $(echo "$selftest_out" | grep -c '^ok') checks passed"

if [ "$(id -u)" -ne 0 ]; then
	# An unprivileged user: the extension must be installed already (or the
	# PostgreSQL installation writable by this user).
	make -s PG_CONFIG="$PG_CONFIG" install
	exec make -s PG_CONFIG="$PG_CONFIG" installcheck
fi

user=${OUTBOX_TEST_USER:-postgres}
if ! id "$user" >/dev/null 2>&1; then
	useradd --system --create-home --shell /bin/bash "$user"
fi

make -s PG_CONFIG="$PG_CONFIG" install

scratch=$(mktemp -d /tmp/outbox-test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
tar --exclude=./.git --exclude=./tmp_check --exclude=./tmp_check_regress \
	--exclude=./results --exclude=./test-output -cf - . | tar -C "$scratch" -xf -
chown -R "$user" "$scratch"

rc=0
runuser -u "$user" -- env PATH="$PATH" bash -c "cd '$scratch' && make -s PG_CONFIG='$PG_CONFIG' installcheck" || rc=$?

rm -rf "$here/test-output"
if [ $rc -ne 0 ]; then
	mkdir -p "$here/test-output"
	for f in regression.diffs regression.out results tmp_check/log; do
		[ -e "$scratch/$f" ] && cp -r "$scratch/$f" "$here/test-output/" || true
	done
	[ -f "$scratch/regression.diffs" ] && cat "$scratch/regression.diffs" | head -200
	echo "test output kept in test-output/" >&2
fi
exit $rc
