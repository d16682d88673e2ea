# common.sh - the set-up the relay benchmarks share (relay_bench.sh,
# soak.sh); sourced, after the script has set its settings, then
# bench_setup is called.  Not run on its own.
#
# The script sets: BENCH_NAME (work directory and log names), PORT,
# NGINX_PORT (empty: no nginx), DB, REV, INSTALL, KEEP, OUT, WAIT_FOR,
# PGUSER_OS, here, repo, BENCH_PACKAGES (Debian packages it needs beyond
# curl, nginx and python3-psycopg2) and, optionally, BENCH_CONF (settings
# appended to postgresql.conf).  It may define bench_on_exit, run first on
# exit.
#
# bench_setup, as root: installs the packages, waits while a WAIT_FOR
# process runs, makes the throwaway directory $work (removed on exit unless
# KEEP=1; OUT=DIR keeps $work/out and the server log), builds the extension
# (the working tree, or REV) and installs it into the server's private
# library directory, starts PostgreSQL on 127.0.0.1:$PORT with the library
# preloaded and outbox.database = $DB (not yet created), and nginx answering
# 204 on 127.0.0.1:$NGINX_PORT.
#
# It leaves: work PGDATA SOCK SERVERLOG BIN PG_CONFIG PY RESULTS build_rev
# build_md5 pkglibdir NGINX_URL nginx_pid nginx_worker; and the functions
# log as_pg psqlq sql tool nginx_requests worker_pid rss_of jmerge record
# machine_busy create_bench_payload.

bench_setup() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "run as root (the cluster itself runs as '$PGUSER_OS')" >&2
		exit 1
	fi

	log() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

	# ---- packages ---------------------------------------------------------------
	PY=/usr/bin/python3		# Debian's, where python3-psycopg2 installs
	"$repo/test/install-deps.sh" curl nginx python3-psycopg2 "${BENCH_PACKAGES[@]}"

	BIN=/usr/lib/postgresql/15/bin
	PG_CONFIG=$BIN/pg_config
	[ -x "$PG_CONFIG" ] || PG_CONFIG=$(command -v pg_config)
	id "$PGUSER_OS" >/dev/null 2>&1 || useradd --system --create-home --shell /bin/bash "$PGUSER_OS"

	# ---- wait for another benchmark -------------------------------------------------
	if [ -n "$WAIT_FOR" ]; then
		while pgrep -f "$WAIT_FOR" >/dev/null; do
			log "waiting: '$WAIT_FOR' is running (pid $(pgrep -f "$WAIT_FOR" | paste -sd, -)); checking again in 30 s"
			sleep 30
		done
	fi

	# ---- throwaway directory, cluster, nginx ------------------------------------
	work=$(mktemp -d "/var/tmp/outbox-$BENCH_NAME.XXXXXX")
	chmod 755 "$work"
	PGDATA=$work/data
	SOCK=$work/sock
	SERVERLOG=$work/log/server.log
	mkdir -p "$SOCK" "$work/log" "$work/nginx/tmp" "$work/out"
	chown "$PGUSER_OS" "$SOCK" "$work/log"
	RESULTS=$work/out/results.jsonl
	: >"$RESULTS"
	nginx_pid=

	as_pg() { runuser -u "$PGUSER_OS" -- "$@"; }

	cleanup() {
		local rc=$?
		set +e
		declare -F bench_on_exit >/dev/null && bench_on_exit
		if [ -n "$nginx_pid" ]; then
			kill -QUIT "$nginx_pid" 2>/dev/null
			for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$nginx_pid" 2>/dev/null || break; sleep 0.2; done
			kill -KILL "$nginx_pid" 2>/dev/null
		fi
		if [ -f "$PGDATA/postmaster.pid" ]; then
			as_pg "$BIN/pg_ctl" -D "$PGDATA" -m fast -w -t 30 stop >/dev/null 2>&1 ||
				as_pg "$BIN/pg_ctl" -D "$PGDATA" -m immediate -w stop >/dev/null 2>&1
		fi
		if [ -n "$OUT" ] && [ -d "$work/out" ]; then
			mkdir -p "$OUT" && cp -a "$work/out/." "$OUT/" && cp "$SERVERLOG" "$OUT/" 2>/dev/null
			[ -s "$work/anomalies" ] && cp "$work/anomalies" "$OUT/"
		fi
		if [ "$KEEP" = 1 ]; then
			echo "kept: $work" >&2
		else
			rm -rf "$work"
		fi
		exit $rc
	}
	trap cleanup EXIT
	trap 'exit 130' INT TERM

	# ---- build and install the extension ---------------------------------------
	# Built in a copy (the working tree as it is, or REV), so that neither a
	# concurrent edit nor a concurrent build in the repository mixes into it;
	# installed into $work/inst and from there into the server's private library
	# and extension directories (below), plus the system ones with INSTALL=1.
	mkdir -p "$work/src"
	if [ -n "$REV" ]; then
		build_rev=$(git -C "$repo" rev-parse --short "$REV")
		git -C "$repo" archive "$REV" | tar -x -C "$work/src"
	else
		build_rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')
		git -C "$repo" diff --quiet HEAD -- src outbox--0.1.sql Makefile 2>/dev/null || build_rev+=" + uncommitted changes"
		tar -C "$repo" --exclude=.git --exclude='*.o' --exclude='*.so' --exclude='*.bc' \
			--exclude=tmp_check --exclude=tmp_check_regress -cf - . | tar -C "$work/src" -xf -
	fi
	log "building outbox ($build_rev)"
	# BENCH_MAKE_ARGS: e.g. OUTBOX_TEST_FAULTS=1, the test build, for a
	# benchmark that uses outbox.test_fault (capture_bench.sh)
	make -s -C "$work/src" PG_CONFIG="$PG_CONFIG" ${BENCH_MAKE_ARGS:-} >/dev/null
	make -s -C "$work/src" PG_CONFIG="$PG_CONFIG" ${BENCH_MAKE_ARGS:-} DESTDIR="$work/inst" install >/dev/null
	if [ "$INSTALL" = 1 ]; then
		make -s -C "$work/src" PG_CONFIG="$PG_CONFIG" ${BENCH_MAKE_ARGS:-} install >/dev/null
	fi
	build_md5=$(md5sum <"$work/src/outbox.so" | cut -c1-12)

	log "initdb in $PGDATA"
	mkdir -p "$PGDATA"
	chown "$PGUSER_OS" "$PGDATA"
	as_pg "$BIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >/dev/null ||
		as_pg "$BIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --no-locale >/dev/null

	cat >>"$PGDATA/postgresql.conf" <<-EOF

	# ---- $BENCH_NAME ----
	listen_addresses = '127.0.0.1'
	unix_socket_directories = '$SOCK'
	port = $PORT
	max_connections = 40
	shared_preload_libraries = 'outbox'
	outbox.database = '$DB'

	# sized for a 2-core, 24 GB machine
	shared_buffers = 256MB
	wal_buffers = 16MB
	max_wal_size = 4GB
	min_wal_size = 1GB
	checkpoint_timeout = 30min
	checkpoint_completion_target = 0.9
	synchronous_commit = on
	fsync = on
	jit = off

	logging_collector = off
	log_line_prefix = '%m [%p] %b '
	log_min_messages = warning
	EOF
	# The script's own settings; later lines win.
	[ -z "${BENCH_CONF:-}" ] || printf '%s\n' "$BENCH_CONF" >>"$PGDATA/postgresql.conf"

	log "starting PostgreSQL on port $PORT"
	# The server runs in a private mount namespace whose library and extension
	# directories are copies of the system ones with our build installed over
	# them, so that a "make install" elsewhere during the run (new backends
	# would load the new outbox.so next to the preloaded one) cannot touch it.
	pkglibdir=$("$PG_CONFIG" --pkglibdir)
	extdir=$("$PG_CONFIG" --sharedir)/extension
	mkdir -p "$work/pkglib" "$work/extension"
	cp -a "$pkglibdir/." "$work/pkglib/"
	cp -a "$extdir/." "$work/extension/"
	cp -a "$work/inst$pkglibdir/." "$work/pkglib/"
	cp -a "$work/inst$extdir/." "$work/extension/"
	cp "$work/pkglib/outbox.so" "$work/outbox.so"
	unshare -m --propagation private sh -c 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && shift 4 && exec "$@"' sh \
		"$work/pkglib" "$pkglibdir" "$work/extension" "$extdir" \
		runuser -u "$PGUSER_OS" -- "$BIN/pg_ctl" -D "$PGDATA" -l "$SERVERLOG" -w -t 60 start >/dev/null

	export PGHOST=$SOCK PGPORT=$PORT PGUSER=postgres
	psqlq() { "$BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }
	sql() { psqlq -d "$DB" -At "$@"; }
	PGARGS=(--pghost "$SOCK" --pgport "$PORT" --pguser postgres --dbname "$DB")
	tool() { "$PY" "$here/relay_bench_tool.py" "${PGARGS[@]}" "$@"; }

	[ -n "$NGINX_PORT" ] || return 0	# no nginx wanted
	cat >"$work/nginx/nginx.conf" <<-EOF
	worker_processes 1;
	daemon off;
	pid $work/nginx/nginx.pid;
	error_log $work/nginx/error.log warn;
	events { worker_connections 4096; }
	http {
		access_log off;
		client_body_temp_path $work/nginx/tmp/body;
		proxy_temp_path $work/nginx/tmp/proxy;
		fastcgi_temp_path $work/nginx/tmp/fastcgi;
		uwsgi_temp_path $work/nginx/tmp/uwsgi;
		scgi_temp_path $work/nginx/tmp/scgi;
		keepalive_requests 1000000;
		keepalive_timeout 300s;
		server {
			listen 127.0.0.1:$NGINX_PORT;
			location / { return 204; }
			location = /nginx_status { stub_status; }
		}
	}
	EOF
	log "starting nginx on 127.0.0.1:$NGINX_PORT"
	/usr/sbin/nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" &
	nginx_pid=$!
	for _ in $(seq 50); do curl -sf "http://127.0.0.1:$NGINX_PORT/nginx_status" >/dev/null && break; sleep 0.1; done
	nginx_worker=$(pgrep -P "$nginx_pid" | head -1)
	[ -n "$nginx_worker" ] || { echo "nginx did not start:" >&2; cat "$work/nginx/error.log" >&2; exit 1; }
	NGINX_URL="http://127.0.0.1:$NGINX_PORT/hook"
	nginx_requests() { curl -sf "http://127.0.0.1:$NGINX_PORT/nginx_status" | awk 'NR == 3 {print $3}'; }
}

worker_pid() { sql -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox relay' AND datname = current_database()"; }
# VmRSS RssAnon RssShmem VmHWM, in kB
rss_of() { awk '/^(VmRSS|RssAnon|RssShmem|VmHWM):/ {v[$1]=$2} END {printf "{\"rss_kb\": %d, \"anon_kb\": %d, \"shmem_kb\": %d, \"hwm_kb\": %d}\n", v["VmRSS:"], v["RssAnon:"], v["RssShmem:"], v["VmHWM:"]}' "/proc/$1/status"; }
jmerge() { "$PY" -c 'import json, sys
d = {}
for a in sys.argv[1:]:
    d.update(json.loads(a))
print(json.dumps(d))' "$@"; }
record() { jmerge "$@" >>"$RESULTS"; }

# A throwaway CA and a server certificate for 127.0.0.1 (TLS benchmarks):
# $1/ca.pem, $1/server.pem, $1/server.key, readable by the server's user;
# $2: the certificate's subjectAltName (default IP:127.0.0.1).
bench_tls_certs() {
	local d=$1 san=${2:-IP:127.0.0.1} ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	mkdir -p "$d"
	openssl req -x509 "${ec[@]}" -days 2 -keyout "$d/ca.key" -out "$d/ca.pem" -subj /CN=bench-ca \
		-addext basicConstraints=critical,CA:true -addext keyUsage=critical,keyCertSign >/dev/null 2>&1
	openssl req "${ec[@]}" -keyout "$d/server.key" -out "$d/server.csr" -subj /CN=127.0.0.1 >/dev/null 2>&1
	printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$d/server.ext"
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
		-extfile "$d/server.ext" -out "$d/server.pem" >/dev/null 2>&1
	chmod 755 "$d"
	chmod 644 "$d"/*.pem "$d/server.key"
}

# CPUs busy (all processes) over $1 seconds, from /proc/stat
machine_busy() {
	local a b
	a=$(head -1 /proc/stat)
	sleep "$1"
	b=$(head -1 /proc/stat)
	awk -v a="$a" -v b="$b" -v n="$(nproc)" 'BEGIN {
		split(a, x, " "); split(b, y, " "); busy = 0; total = 0
		for (i = 2; i <= 9; i++) { d = y[i] - x[i]; total += d; if (i != 5 && i != 6) busy += d }
		printf "%.2f", total ? busy / total * n : 0 }'
}

# Before a measurement: wait, at most QUIET_WAIT seconds, until the machine
# is quiet (at most QUIET_MAX CPUs busy), else note it in $work/anomalies
# and measure anyway; sets BUSY to the last figure.  $1: what is measured.
wait_quiet() {
	local waited=0
	while :; do
		BUSY=$(machine_busy 1)
		awk -v b="$BUSY" -v m="$QUIET_MAX" 'BEGIN { exit !(b <= m) }' && return 0
		if [ "$waited" -ge "$QUIET_WAIT" ]; then
			log "machine still busy ($BUSY CPUs) after ${waited}s; measuring anyway"
			echo "measured on a busy machine ($BUSY CPUs busy just before): $1" >>"$work/anomalies"
			return 0
		fi
		[ "$waited" = 0 ] && log "machine busy ($BUSY CPUs, before: $1); waiting for quiet (<= $QUIET_MAX)"
		local nap=$((QUIET_WAIT - waited - 1))
		[ "$nap" -gt 4 ] && nap=4
		[ "$nap" -gt 0 ] && sleep "$nap"
		waited=$((waited + nap + 1))
	done
}

# bench_payload(g) in $DB: the ~220-byte JSON payload of message g that the
# relay benchmarks emit.
create_bench_payload() {
	sql >/dev/null <<-'SQL'
	-- ~220 bytes of JSON text
	CREATE FUNCTION bench_payload(g bigint) RETURNS jsonb
	LANGUAGE sql IMMUTABLE PARALLEL SAFE
	AS $$
		SELECT jsonb_build_object('order_id', g, 'customer_id', 100000 + g % 1000,
								  'status', 'created', 'amount', 123.45, 'currency', 'EUR',
								  'sku', 'SKU-' || lpad(g::text, 8, '0'),
								  'created_at', '2024-01-01T12:00:00Z', 'note', repeat('p', 50))
	$$;
	SQL
}

# perf_fold DATA OUT: the call stacks of a perf record --call-graph file as
# folded stacks (one line "outer;...;inner count" per distinct stack, the
# format flamegraph.pl, speedscope and inferno read), symbols resolved in a
# private mount namespace where the library directory is the server's.
perf_fold() {
	unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf script "$@"' \
		sh "$work/pkglib" "$pkglibdir" -i "$1" -F comm,ip,sym,dso --no-inline 2>/dev/null |
		"$PY" -c '
import collections, sys
counts = collections.Counter()
frames, head = [], None
def flush():
    if head is not None:
        counts[";".join([head] + frames[::-1])] += 1
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush(); frames, head = [], None
    elif not line.startswith("\t"):
        flush(); frames, head = [], line.split()[0]
    else:
        parts = line.split(None, 1)
        sym = parts[1] if len(parts) > 1 else parts[0]
        dso = sym.rsplit(" (", 1)
        name = dso[0].split("+0x")[0]
        if name == "[unknown]" and len(dso) > 1:
            name = "[" + dso[1].rstrip(")").rsplit("/", 1)[-1] + "]"
        frames.append(name.replace(";", ":"))
flush()
for stack, n in counts.most_common():
    print(stack, n)
' >"$2"
}

# perf_report_files DATA NAME: from a perf record --call-graph file of the
# relay worker, $work/out/perf-NAME.txt (self time by thread and shared
# object, the top self-time symbols, the top inclusive ones) and
# $work/out/perf-NAME.folded (perf_fold).
perf_report_files() {
	local preport
	preport() {
		unshare -m sh -c 'mount --bind "$1" "$2" && shift 2 && exec perf report "$@"' \
			sh "$work/pkglib" "$pkglibdir" -i "$DATA" --no-inline --stdio -g none "$@" 2>/dev/null |
			grep -E '^ +[0-9]' || true
	}
	local DATA=$1
	{
		echo "==== $2: perf record -F 999 --call-graph dwarf of the relay worker ($(perf script -i "$DATA" -F pid 2>/dev/null | wc -l) samples)"
		echo "  self time by thread name and shared object:"
		preport --no-children --sort comm,dso | head -16 | sed 's/^/    /'
		echo "  top self-time symbols:"
		preport --no-children --sort dso,sym | head -40 | sed 's/^/    /'
		echo "  inclusive time (children, self) of the top symbols:"
		preport --children --sort dso,sym | head -60 | sed 's/^/    /'
	} >"$work/out/perf-$2.txt"
	perf_fold "$DATA" "$work/out/perf-$2.folded"
}

# ---- librdkafka's mock cluster, for the Kafka benchmarks ----
# kafka_mock_start: builds test/kafka/outbox_kafka into $work and starts
# `outbox_kafka mock` (3 brokers, a warm-up topic) in the background:
# commands go to its stdin through a FIFO held open on fd 7, each answer is
# one line of $work/mock.out after the bootstrap list; sets mock_pid and
# BOOT.  mock_cmd WORDS...: one command, failing unless the mock answers
# "ok".  kafka_mock_stop: from bench_on_exit.
kafka_mock_start() {
	cc -O2 -Wall -o "$work/outbox_kafka" "$repo/test/kafka/outbox_kafka.c" -lrdkafka -lpthread
	mkfifo "$work/mock.in"
	"$work/outbox_kafka" mock bench.warmup 1 <"$work/mock.in" >"$work/mock.out" 2>"$work/mock.log" &
	mock_pid=$!
	exec 7>"$work/mock.in"
	for _ in $(seq 300); do [ -n "$(head -1 "$work/mock.out" 2>/dev/null)" ] && break; sleep 0.1; done
	BOOT=$(head -1 "$work/mock.out")
	[ -n "$BOOT" ] || { echo "the mock cluster did not start:" >&2; cat "$work/mock.log" >&2; exit 1; }
	mock_lines=1
}

mock_cmd() {
	local ans
	echo "$*" >&7
	for _ in $(seq 300); do [ "$(wc -l <"$work/mock.out")" -gt "$mock_lines" ] && break; sleep 0.02; done
	mock_lines=$((mock_lines + 1))
	ans=$(sed -n "${mock_lines}p" "$work/mock.out")
	[ "$ans" = ok ] || { echo "mock: '$*': ${ans:-no answer}" >&2; exit 1; }
}

kafka_mock_stop() {
	[ -n "${mock_pid:-}" ] || return 0
	# a mock that already exited leaves the FIFO without a reader: no
	# SIGPIPE for the shell, and its stderr stays
	kill -0 "$mock_pid" 2>/dev/null && (echo quit >&7) 2>/dev/null
	{ exec 7>&-; } 2>/dev/null
	for _ in $(seq 50); do kill -0 "$mock_pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$mock_pid" 2>/dev/null
	[ -n "$OUT" ] && mkdir -p "$OUT" && cp "$work/mock.log" "$OUT/" 2>/dev/null
	return 0
}
