# outbox: PGXS build.
#
#   make              build
#   make install      install into the PostgreSQL that pg_config names
#   make test         install, then run pg_regress and the TAP tests, each
#                     against its own throwaway server (works as root), on
#                     PostgreSQL 15; PG=16, 17 or 18 on that version,
#                     PG=all on 15, 16, 17 and 18 (CI)
#   make stress       make test with a CPU hog on every core (PG= as above)
#   make demo         install packages, build, and show messages flowing
#   make dist         the PGXN archive outbox-<version>.zip of HEAD (META.json)
#   make deb          the Debian package(s) postgresql-<v>-outbox (debian/),
#                     built with pg_buildext in a scratch copy, into pkg/

MODULE_big = outbox
OBJS = \
	src/api.o \
	src/aws_sigv4.o \
	src/base.o \
	src/capture.o \
	src/capture_json.o \
	src/capture_slot.o src/capture_decode.o src/capture_plugin.o src/capture_worker.o \
	src/chars.o \
	src/destinations.o \
	src/emit.o \
	src/filter.o \
	src/json_scan.o \
	src/databases.o \
	src/launcher.o \
	src/outbox.o \
	src/queue_compact.o \
	src/queue_config.o \
	src/queue_fill.o \
	src/queue_poison.o \
	src/queue_receive.o \
	src/queue_shmem.o \
	src/queue_stats.o \
	src/queue_xact.o \
	src/relay_acks.o \
	src/relay_config.o \
	src/relay_conn.o \
	src/relay_dead_letters.o \
	src/relay_envelope.o \
	src/relay_http.o \
	src/relay_kafka.o \
	src/relay_lane.o \
	src/relay_main.o \
	src/relay_nats.o \
	src/relay_redis.o \
	src/relay_rabbitmq.o \
	src/relay_auth.o \
	src/relay_aws.o \
	src/relay_kinesis.o \
	src/relay_sns.o \
	src/relay_sqs.o \
	src/relay_notify.o \
	src/relay_progress.o \
	src/relay_read.o \
	src/relay_retention.o \
	src/relay_tls.o \
	src/shmem.o \
	src/signing.o \
	src/standby.o \
	src/stats.o \
	src/storage.o \
	src/topic_grants.o \
	src/trace.o

EXTENSION = outbox
DATA = outbox--0.1.sql outbox--0.1--0.2.sql outbox--0.2.sql \
	outbox--0.2--0.3.sql outbox--0.3.sql outbox--0.3--0.4.sql outbox--0.4.sql
PGFILEDESC = "outbox - transactional outbox delivered in commit order"

REGRESS = emit savepoints triggers frontier errors targets operations security queue capture formats debezium debezium_cases redis rabbitmq aws oauth2
REGRESS_OPTS = --temp-config=$(srcdir)/test/regress.conf \
	--temp-instance=$(CURDIR)/tmp_check_regress

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

CURL_CONFIG ?= curl-config
# The extension's version (outbox.control's default_version), for the
# relay's User-Agent.
OUTBOX_VERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(dir $(firstword $(MAKEFILE_LIST)))outbox.control)
PG_CPPFLAGS = -I$(srcdir)/src $(shell $(CURL_CONFIG) --cflags) -DOUTBOX_VERSION='"$(OUTBOX_VERSION)"'
# Extra warnings PostgreSQL's own headers build clean with; WERROR=1 (CI)
# turns every warning into an error.
PG_CFLAGS = -Wextra -Wno-unused-parameter -Wno-sign-compare \
	-Wno-missing-field-initializers -Wshadow=compatible-local \
	$(if $(WERROR),-Werror)
# Only what PostgreSQL looks up is exported (test/check-symbols.sh): hidden
# visibility by default, PGDLLEXPORT marking the rest.  PGXS does this from
# PostgreSQL 16 on (CFLAGS_SL_MODULE); 15's c.h leaves PGDLLEXPORT empty
# unless it is defined before, as here (16's defines it the same way).
PG_CFLAGS += -fvisibility=hidden
# The test build (test/run-tests.sh): the hooks of outbox.test_fault,
# which the product leaves out (src/base.h).
PG_CPPFLAGS += $(if $(OUTBOX_TEST_FAULTS),-DOUTBOX_TEST_FAULTS)
# Which build the objects are, in a stamp written when it changes:
# switching rebuilds them (a missing-file rule would not: PGXS makes every
# target .SECONDARY).
OUTBOX_BUILD_KIND := $(if $(OUTBOX_TEST_FAULTS),test,product)
$(shell mkdir -p src && { echo $(OUTBOX_BUILD_KIND) | cmp -s - src/.build-kind || echo $(OUTBOX_BUILD_KIND) > src/.build-kind; })
PG_CPPFLAGS += '-DPGDLLEXPORT=__attribute__((visibility("default")))'

SHLIB_LINK = $(shell $(CURL_CONFIG) --libs) -lnats -lrdkafka -lhiredis -lrabbitmq -lssl -lcrypto

EXTRA_CLEAN = tmp_check_regress test-output outbox-*.zip src/.build-kind

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)

# The two commands work on a fresh machine: the scripts install the Debian
# packages they need (pg_config among them) before building.
.PHONY: all test stress demo lint dist deb
all:

PG ?= 15
test:
	PG='$(PG)' test/run-tests.sh

# The suite on a machine made slower on purpose (a CPU hog on every core):
# docs/internals.md#tests.
stress:
	OUTBOX_TEST_STRESS=$${OUTBOX_TEST_STRESS:-1} PG='$(PG)' test/run-tests.sh

demo:
	test/demo.sh

# The PGXN distribution: HEAD as a zip whose version is META.json's, which
# must be the control file's default_version (0.2 is 0.2.0).
DISTVERSION = $(shell git -C $(dir $(firstword $(MAKEFILE_LIST))). show HEAD:META.json 2>/dev/null | sed -n 's/^   "version": "\([^"]*\)".*/\1/p')
dist:
	@control=$$(git show HEAD:outbox.control | sed -n "s/^default_version = '\(.*\)'/\1/p"); \
	case "$(DISTVERSION)" in "$$control" | "$$control".0) ;; \
	*) echo "META.json version $(DISTVERSION) is not outbox.control's $$control" >&2; exit 1 ;; esac
	git archive --format zip --prefix=outbox-$(DISTVERSION)/ -o outbox-$(DISTVERSION).zip HEAD
	@echo "outbox-$(DISTVERSION).zip"

deb:
	test/build-deb.sh pkg

ifneq ($(PGXS),)
include $(PGXS)

$(OBJS): $(wildcard $(srcdir)/src/*.h) src/.build-kind

# Set after PGXS, whose Makefile.global empties it.
PROVE_FLAGS = -I $(srcdir)/test/t

# Static analysis of our own code (warnings in PostgreSQL's headers are not ours),
# then the layering check on the built objects: no file calls, through any
# chain, back into itself (test/check-layering.sh); then the library's
# exported symbols: only what PostgreSQL looks up (test/check-symbols.sh);
# and the full install script: each object made once, in its final shape
# (test/check-schema-script.sh).
lint: $(OBJS) $(shlib)
	cppcheck -q --error-exitcode=1 --enable=warning,performance,portability \
		--inline-suppr --suppress=missingIncludeSystem --suppress=toomanyconfigs \
		--suppress='*:$(includedir_server)/*' --max-configs=1 \
		-I$(srcdir)/src -I$(includedir_server) $(srcdir)/src/*.c
	$(srcdir)/test/check-layering.sh src $(srcdir)/src
	$(srcdir)/test/check-symbols.sh $(shlib) $(srcdir)/src
	$(srcdir)/test/check-schema-script.sh
endif
