#!/usr/bin/env bash
# Build the Debian packages of outbox (debian/, pg_buildext): one
# postgresql-<v>-outbox for each PostgreSQL version in debian/pgversions
# whose server-dev package is installed (on Debian 12: 15).  The tree is
# copied to a scratch directory, built there with dpkg-buildpackage, and
# the .deb files are copied to OUT (default pkg/).
#
#   test/build-deb.sh [OUT]
#
# Installs the build dependencies with apt-get when run as root.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-pkg}
mkdir -p "$out"
out=$(cd "$out" && pwd)

"$here/test/install-deps.sh" debhelper dpkg-dev fakeroot postgresql-server-dev-all libssl-dev

version=$(dpkg-parsechangelog -l "$here/debian/changelog" -S Version)
scratch=$(mktemp -d /tmp/outbox-deb.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/outbox-$version"
(cd "$here" && tar --exclude=./.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
	--exclude=./tmp_check --exclude=./tmp_check_regress --exclude=./results \
	--exclude=./test-output --exclude=./pkg --exclude='./outbox-*.zip' \
	--exclude=node_modules -cf - .) | tar -C "$scratch/outbox-$version" -xf -
cd "$scratch/outbox-$version"
# debian/control must be what control.in gives for the installed versions.
pg_buildext checkcontrol
dpkg-buildpackage -us -uc -b >"$scratch/build.log" 2>&1 || {
	tail -50 "$scratch/build.log" >&2
	echo "build-deb: dpkg-buildpackage failed" >&2
	exit 1
}
cp "$scratch"/*.deb "$out"/
ls "$out"/*.deb
