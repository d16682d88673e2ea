#!/usr/bin/env python3
"""hand_relay: the hand-rolled outbox relay that relay_bench.sh compares with.

The usual polling relay over a table

    hand_outbox(id bigserial primary key, key text, payload jsonb, processed_at timestamptz)
    + CREATE INDEX ... ON hand_outbox (id) WHERE processed_at IS NULL

doing, until a poll finds nothing:

    BEGIN;
    SELECT id, key, payload::text FROM hand_outbox WHERE processed_at IS NULL
     ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED;
    -- POST each row, one request per message, on one keep-alive connection
    UPDATE hand_outbox SET processed_at = now() WHERE id = ANY(...);
    COMMIT;

Needs psycopg2 (Debian: python3-psycopg2).  With --procs N, N such relays
run in parallel (SKIP LOCKED shares the rows out; per-key order is then no
longer kept).  They start together; prints one JSON line:

    {"procs": N, "messages": n, "requests": n, "seconds": s, "rate": n/s, "errors": n}
"""

import argparse
import http.client
import json
import multiprocessing as mp
import sys
import time
import urllib.parse

import psycopg2


def relay(idx, args, ready, go, results):
    conn = psycopg2.connect(host=args.pghost, port=args.pgport, user=args.pguser, dbname=args.dbname)
    u = urllib.parse.urlsplit(args.url)
    hc = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
    path = u.path or "/"
    cur = conn.cursor()
    messages = requests = errors = 0
    ready.put(idx)
    go.wait()
    while True:
        cur.execute("SELECT id, key, payload::text FROM hand_outbox"
                    " WHERE processed_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                    (args.batch,))
        rows = cur.fetchall()
        if not rows:
            conn.rollback()
            break
        done = []
        for id_, key, payload in rows:
            body = payload.encode()
            hdrs = {"Content-Type": "application/json", "outbox-seq": str(id_),
                    "webhook-id": f"hand_{id_}", "outbox-topic": "orders.created"}
            if key is not None:
                hdrs["outbox-key"] = key
            for attempt in range(3):
                try:
                    hc.request("POST", path, body=body, headers=hdrs)
                    resp = hc.getresponse()
                    resp.read()
                    requests += 1
                    ok = 200 <= resp.status < 300
                    break
                except (http.client.HTTPException, OSError):
                    hc.close()
                    ok = False
            if ok:
                done.append(id_)
            else:
                errors += 1
        cur.execute("UPDATE hand_outbox SET processed_at = now() WHERE id = ANY(%s)", (done,))
        conn.commit()
        messages += len(done)
    results.put((idx, messages, requests, errors, time.time()))
    conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pghost", required=True)
    ap.add_argument("--pgport", type=int, required=True)
    ap.add_argument("--pguser", default="postgres")
    ap.add_argument("--dbname", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args()

    ctx = mp.get_context("fork")
    ready, results = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    ps = [ctx.Process(target=relay, args=(i, args, ready, go, results)) for i in range(args.procs)]
    for p in ps:
        p.start()
    for _ in ps:
        ready.get(timeout=30)
    t0 = time.time()
    go.set()
    res = [results.get() for _ in ps]
    for p in ps:
        p.join()
    t1 = max(r[4] for r in res)
    msgs = sum(r[1] for r in res)
    out = {"procs": args.procs, "messages": msgs, "requests": sum(r[2] for r in res),
           "errors": sum(r[3] for r in res), "seconds": round(t1 - t0, 3),
           "rate": round(msgs / (t1 - t0), 1)}
    print(json.dumps(out))
    return 0 if all(p.exitcode == 0 for p in ps) else 1


if __name__ == "__main__":
    sys.exit(main())
