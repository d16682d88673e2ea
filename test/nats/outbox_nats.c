/*
 * outbox_nats: the tests' and benchmarks' NATS JetStream tool (libnats).
 *
 *   outbox_nats create URL STREAM SUBJECT [REPLICAS [MAX_MSG_SIZE [DUPLICATES]]]
 *       a stream on file storage taking SUBJECT (a pattern), with the
 *       default duplicate window (2 minutes) unless DUPLICATES gives it in
 *       seconds (MAX_MSG_SIZE -1: no limit)
 *   outbox_nats delete URL STREAM
 *   outbox_nats count URL STREAM         messages the stream holds
 *   outbox_nats leader URL STREAM        the name of the stream's leader
 *   outbox_nats dump URL STREAM          one JSON line per message, in
 *       stream order: seq, subject, Nats-Msg-Id, outbox-key, outbox-seq,
 *       outbox-topic, payload (the strings as they are: tests use plain
 *       ASCII), headers (every header's first value, by name)
 *   outbox_nats publish URL SUBJECT COUNT KEYS [all]
 *       the benchmark's baseline: COUNT messages over KEYS keys with
 *       Nats-Msg-Id and outbox-key, published asynchronously and all
 *       acknowledged; prints the rate.  With "all", every header the relay
 *       puts on a message of the outbox format: webhook-id, outbox-seq and
 *       outbox-topic too (the same work as the relay's)
 *   outbox_nats respond URL SUBJECT REPLY FILE [HOLD]
 *       a service, not a stream: answers every request on SUBJECT (a
 *       pattern) with REPLY, and appends each request's subject to FILE
 *       (a first line "ready" once subscribed); with HOLD, each answer
 *       waits until a file of that name exists; runs until killed
 *
 * A tls:// URL connects with TLS: the CA in $OUTBOX_NATS_CA, a client
 * certificate and key in $OUTBOX_NATS_CERT and $OUTBOX_NATS_KEY, when set;
 * $OUTBOX_NATS_CREDS names a .creds file to log in with.  User information
 * in the URL logs in as libnats takes it.
 *
 * Exit status 0 on success; errors on stderr.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

static void
die(const char *what, natsStatus s, jsErrCode jerr)
{
	fprintf(stderr, "outbox_nats: %s: %s (jerr %d) %s\n", what, natsStatus_GetText(s),
			(int) jerr, nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
	exit(1);
}

static const char *
header(natsMsg *m, const char *name)
{
	const char *v = NULL;

	if (natsMsgHeader_Get(m, name, &v) != NATS_OK || v == NULL)
		return "";
	return v;
}

static void
json_string(const char *s, int len)
{
	int			i;

	putchar('"');
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

int
main(int argc, char **argv)
{
	natsConnection *nc = NULL;
	jsCtx	   *js = NULL;
	natsStatus	s;
	jsErrCode	jerr = 0;
	natsOptions *opts = NULL;

	if (argc < 4)
	{
		fprintf(stderr, "usage: outbox_nats create|delete|count|dump|publish|respond URL ...\n");
		return 2;
	}
	if ((s = natsOptions_Create(&opts)) != NATS_OK ||
		(s = natsOptions_SetURL(opts, argv[2])) != NATS_OK ||
		(s = natsOptions_SetTimeout(opts, 5000)) != NATS_OK ||
		(getenv("OUTBOX_NATS_CA") &&
		 (s = natsOptions_LoadCATrustedCertificates(opts, getenv("OUTBOX_NATS_CA"))) != NATS_OK) ||
		(getenv("OUTBOX_NATS_CERT") &&
		 (s = natsOptions_LoadCertificatesChain(opts, getenv("OUTBOX_NATS_CERT"),
												getenv("OUTBOX_NATS_KEY"))) != NATS_OK) ||
		(getenv("OUTBOX_NATS_CREDS") &&
		 (s = natsOptions_SetUserCredentialsFromFiles(opts, getenv("OUTBOX_NATS_CREDS"), NULL)) != NATS_OK))
		die("options", s, 0);
	if ((s = natsConnection_Connect(&nc, opts)) != NATS_OK)
		die("connect", s, 0);
	if ((s = natsConnection_JetStream(&js, nc, NULL)) != NATS_OK)
		die("jetstream", s, 0);

	if (strcmp(argv[1], "create") == 0 && argc >= 5)
	{
		jsStreamConfig cfg;
		jsStreamInfo *si = NULL;
		const char *subjects[1] = {argv[4]};

		jsStreamConfig_Init(&cfg);
		cfg.Name = argv[3];
		cfg.Subjects = subjects;
		cfg.SubjectsLen = 1;
		cfg.Storage = js_FileStorage;
		cfg.Replicas = argc >= 6 ? atoi(argv[5]) : 1;
		if (argc >= 7)
			cfg.MaxMsgSize = atoi(argv[6]);
		if (argc >= 8)
		{
			char	   *end;
			long		secs = strtol(argv[7], &end, 10);

			if (*argv[7] == '\0' || *end != '\0' || secs <= 0)
			{
				fprintf(stderr, "DUPLICATES must be a number of seconds, not \"%s\"\n", argv[7]);
				return 2;
			}
			cfg.Duplicates = (int64_t) secs * 1000000000;
		}
		if ((s = js_AddStream(&si, js, &cfg, NULL, &jerr)) != NATS_OK)
			die("create stream", s, jerr);
		jsStreamInfo_Destroy(si);
	}
	else if (strcmp(argv[1], "delete") == 0)
	{
		if ((s = js_DeleteStream(js, argv[3], NULL, &jerr)) != NATS_OK)
			die("delete stream", s, jerr);
	}
	else if (strcmp(argv[1], "count") == 0 || strcmp(argv[1], "dump") == 0 ||
			 strcmp(argv[1], "leader") == 0)
	{
		jsStreamInfo *si = NULL;
		uint64_t	seq;

		if ((s = js_GetStreamInfo(&si, js, argv[3], NULL, &jerr)) != NATS_OK)
			die("stream info", s, jerr);
		if (strcmp(argv[1], "count") == 0)
			printf("%" PRIu64 "\n", si->State.Msgs);
		else if (strcmp(argv[1], "leader") == 0)
			printf("%s\n", si->Cluster && si->Cluster->Leader ? si->Cluster->Leader : "");
		else
			for (seq = si->State.FirstSeq; si->State.Msgs > 0 && seq <= si->State.LastSeq; seq++)
			{
				natsMsg    *m = NULL;

				s = js_GetMsg(&m, js, argv[3], seq, NULL, &jerr);
				if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
					continue;
				if (s != NATS_OK)
					die("get message", s, jerr);
				printf("{\"seq\":%" PRIu64 ",\"subject\":", seq);
				json_string(natsMsg_GetSubject(m), strlen(natsMsg_GetSubject(m)));
				printf(",\"id\":");
				json_string(header(m, "Nats-Msg-Id"), strlen(header(m, "Nats-Msg-Id")));
				printf(",\"key\":");
				json_string(header(m, "outbox-key"), strlen(header(m, "outbox-key")));
				printf(",\"oseq\":\"%s\",\"topic\":", header(m, "outbox-seq"));
				json_string(header(m, "outbox-topic"), strlen(header(m, "outbox-topic")));
				printf(",\"payload\":");
				json_string(natsMsg_GetData(m) ? natsMsg_GetData(m) : "", natsMsg_GetDataLength(m));
				printf(",\"headers\":{");
				{
					const char **keys = NULL;
					int			nkeys = 0;
					int			k;

					if (natsMsgHeader_Keys(m, &keys, &nkeys) == NATS_OK)
					{
						for (k = 0; k < nkeys; k++)
						{
							if (k > 0)
								putchar(',');
							json_string(keys[k], strlen(keys[k]));
							putchar(':');
							json_string(header(m, keys[k]), strlen(header(m, keys[k])));
						}
						free((void *) keys);
					}
				}
				printf("}}\n");
				natsMsg_Destroy(m);
			}
		jsStreamInfo_Destroy(si);
	}
	else if (strcmp(argv[1], "respond") == 0 && argc >= 6)
	{
		natsSubscription *sub = NULL;
		FILE	   *f = fopen(argv[5], "a");

		if (f == NULL)
		{
			perror(argv[5]);
			return 1;
		}
		if ((s = natsConnection_SubscribeSync(&sub, nc, argv[3])) != NATS_OK ||
			(s = natsConnection_Flush(nc)) != NATS_OK)
			die("subscribe", s, 0);
		fprintf(f, "ready\n");
		fflush(f);
		for (;;)
		{
			natsMsg    *m = NULL;

			s = natsSubscription_NextMsg(&m, sub, 1000);
			if (s == NATS_TIMEOUT)
				continue;
			if (s != NATS_OK)
				die("next", s, 0);
			fprintf(f, "%s\n", natsMsg_GetSubject(m));
			fflush(f);
			while (argc >= 7 && access(argv[6], F_OK) != 0)
				nats_Sleep(50);
			if (natsMsg_GetReply(m) != NULL &&
				(s = natsConnection_PublishString(nc, natsMsg_GetReply(m), argv[4])) != NATS_OK)
				die("reply", s, 0);
			natsMsg_Destroy(m);
		}
	}
	else if (strcmp(argv[1], "publish") == 0 && argc >= 6)
	{
		long		count = atol(argv[4]);
		long		keys = atol(argv[5]);
		int			all = argc >= 7 && strcmp(argv[6], "all") == 0;
		long		i;
		jsOptions	jo;
		struct timespec t0,
					t1;
		char		id[64],
					key[32],
					seq[32],
					data[128];

		jsCtx_Destroy(js);
		jsOptions_Init(&jo);
		jo.PublishAsync.MaxPending = 4096;
		if ((s = natsConnection_JetStream(&js, nc, &jo)) != NATS_OK)
			die("jetstream", s, 0);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (i = 0; i < count; i++)
		{
			natsMsg    *m = NULL;

			snprintf(id, sizeof(id), "bench-%ld-%ld", (long) t0.tv_sec, i);
			snprintf(key, sizeof(key), "k%ld", i % keys);
			snprintf(data, sizeof(data), "{\"n\": %ld, \"pad\": \"0123456789\"}", i);
			if ((s = natsMsg_Create(&m, argv[3], NULL, data, strlen(data))) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "Nats-Msg-Id", id)) != NATS_OK ||
				(s = natsMsgHeader_Set(m, "outbox-key", key)) != NATS_OK)
				die("message", s, 0);
			if (all)
			{
				snprintf(seq, sizeof(seq), "%ld", i + 1);
				if ((s = natsMsgHeader_Set(m, "webhook-id", id)) != NATS_OK ||
					(s = natsMsgHeader_Set(m, "outbox-seq", seq)) != NATS_OK ||
					(s = natsMsgHeader_Set(m, "outbox-topic", "orders")) != NATS_OK)
					die("message", s, 0);
			}
			if ((s = js_PublishMsgAsync(js, &m, NULL)) != NATS_OK)
				die("publish", s, 0);
		}
		{
			jsPubOptions po;

			jsPubOptions_Init(&po);
			po.MaxWait = 60000;
			if ((s = js_PublishAsyncComplete(js, &po)) != NATS_OK)
				die("complete", s, 0);
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("%.0f\n", count / ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9));
	}
	else
	{
		fprintf(stderr, "outbox_nats: unknown command or missing arguments\n");
		return 2;
	}
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
	natsOptions_Destroy(opts);
	nats_Close();
	return 0;
}
