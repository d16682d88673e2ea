#!/usr/bin/env bash
# Install, with apt-get, every Debian package the build, the tests and the
# demo use, plus any package named as an argument (the benchmarks add
# theirs); then, with npm ci, the npm packages of test/verify/ (the
# receiver of test/t/034_signatures.pl) as its package-lock.json pins them,
# into test/verify/node_modules.  Safe to run again; does nothing when all
# are present.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

packages=(
	build-essential
	postgresql-15
	postgresql-server-dev-15
	postgresql-contrib
	libcurl4-openssl-dev
	# NATS JetStream targets: libnats for the relay (and test/nats/), a real
	# nats-server for the tests
	libnats-dev
	nats-server
	# Kafka targets: librdkafka for the relay, and its mock cluster for the
	# tests (test/kafka/)
	librdkafka-dev
	# Redis Streams targets: hiredis's reply parser for the relay, a real
	# redis-server for the tests
	libhiredis-dev
	redis-server
	# RabbitMQ targets: rabbitmq-c for the relay (and test/rabbitmq/), a real
	# rabbitmq-server for the tests
	librabbitmq-dev
	rabbitmq-server
	libipc-run-perl
	# the TAP tests reach TLS-only brokers (test/t/OutboxRedis.pm)
	libio-socket-ssl-perl
	# OpenSSL for the relay's TLS to brokers (src/relay_tls.c)
	libssl-dev
	# the TAP tests decode the receivers' and brokers' records with it
	libjson-xs-perl
	cppcheck
	python3
	openssl
	prometheus
	prometheus-postgres-exporter
	# test/verify/: Node.js runs the receiver, which checks v1 signatures
	# with the npm package standardwebhooks and v1a ones with Python's
	# cryptography.
	nodejs
	python3-cryptography
	"$@"
)
# npm from apt only when no npm is installed (the machine's Node.js may
# bring its own).
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing packages: ${missing[*]}; run this script as root (or with sudo)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# The Debian package starts a cluster of its own; the tests use
	# throwaway servers and do not need it.
fi

# The npm packages, again only when the lock file changed since the last
# install (node_modules/.outbox-lock is a copy of the one installed).
verify=$here/verify
if ! cmp -s "$verify/package-lock.json" "$verify/node_modules/.outbox-lock"; then
	(cd "$verify" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
	cp "$verify/package-lock.json" "$verify/node_modules/.outbox-lock"
fi
