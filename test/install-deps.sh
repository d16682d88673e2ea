#!/usr/bin/env bash
# Install, with apt-get, every Debian package the build, the tests and the
# demo use, plus any package named as an argument (the benchmarks add
# theirs).  Safe to run again; does nothing when all are present.
set -euo pipefail

packages=(
	build-essential
	postgresql-15
	postgresql-server-dev-15
	postgresql-contrib
	libcurl4-openssl-dev
	libipc-run-perl
	cppcheck
	python3
	openssl
	prometheus
	prometheus-postgres-exporter
	"$@"
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "missing packages: ${missing[*]}; run this script as root (or with sudo)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian package starts a cluster of its own; the tests use throwaway
# servers and do not need it.
