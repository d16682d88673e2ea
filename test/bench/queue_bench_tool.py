#!/usr/bin/env python3
"""queue_bench_tool: the consumers, producers and checks of queue_bench.sh.

Needs psycopg2 (Debian: python3-psycopg2).  Common options: --pghost
--pgport --pguser --dbname.  Every consumer and producer is its own process
(fork), so that the GIL does not serialise the clients; times are
time.monotonic() (CLOCK_MONOTONIC, one clock for all processes).  jsonb,
json and timestamptz values are handed to the client as text (no parsing),
for every system alike; every statement is PREPAREd once per connection.

  drain   --system outbox|pgq|hand|ceiling --consumers C --batch B --n N
          [--max-secs S] [--empty-sleep-ms 1] [--tick-ms 20] [--pgq-mode fanout|partitioned]
          C consumer processes drain a preloaded backlog of N messages:
            outbox  BEGIN; SELECT * FROM outbox.receive('q', B); COMMIT
            pgq     BEGIN; pgq.next_batch('q', 'cI'); pgq.get_batch_events(batch);
                    pgq.finish_batch(batch); COMMIT    (a ticker thread calls
                    pgq.ticker() every --tick-ms meanwhile, as pgqd would)
            hand    BEGIN; DELETE FROM hand_q WHERE id IN (SELECT id FROM hand_q
                    ORDER BY id FOR UPDATE SKIP LOCKED LIMIT B) RETURNING *; COMMIT
            ceiling no queue: BEGIN; INSERT INTO ceiling_t VALUES (1) RETURNING 1;
                    COMMIT, one "message" each (about the cheapest transaction
                    that flushes its commit record)
          A consumer whose receive comes back empty commits, sleeps
          --empty-sleep-ms and tries again, until N messages have been received
          in all (or --max-secs passed).  PgQ gives every registered consumer
          every event: with --consumers > 1 and --pgq-mode partitioned, consumer
          I of C reads every batch and takes the events whose key hashes to I
          (the usual way to spread one PgQ queue over processes while keeping
          per-key order); fanout (each consumer takes all, C x N deliveries) is
          refused here.
          Prints JSON: seconds from the start (all consumers connected) to the
          last COMMIT that acknowledged messages, messages/s, transactions,
          empty receives, duplicates, distinct messages, per-key order
          violations, client CPU, CPUs busy on the machine.

          Per-key order (counted at the consumer side, in commit order): each
          message carries its emitting order n (payload order_id; the backlog
          is emitted by one session in order n).  A message m of key k is a
          violation when some message of k emitted after m was acknowledged by
          a transaction whose COMMIT had returned before m's transaction sent
          its COMMIT (that is, certainly before; overlapping commits are not
          counted).

  latency --system outbox|pgq|hand --rate R --seconds S [--keys K] [--tick-ms 10] [--poll-ms 10]
          One producer emits R messages/s (fixed schedule) for S seconds, each
          in its own transaction (BEGIN; emit; COMMIT); one receiver waits:
            outbox  BEGIN; SELECT * FROM outbox.receive('q', 1, 5000); COMMIT
            hand    LISTEN hand_q; the producer does INSERT ...; NOTIFY hand_q;
                    the receiver runs the DELETE ... LIMIT 1 and, when it finds
                    nothing, waits on the socket (select(), 5 s) for a notification
            pgq     ticker thread every --tick-ms (queue ticker_max_count 1), the
                    receiver polls next_batch and sleeps --poll-ms when there is none
          Prints percentiles of (receive returned) - (producer's COMMIT
          returned) and - (producer sent COMMIT), in ms; --out FILE writes
          each message's times.
"""

import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import select
import sys
import threading
import time
import zlib

import psycopg2
import psycopg2.extensions

mono = time.monotonic
N_RE = re.compile(r'"order_id": (\d+)')
QUEUE = "q"
HAND = "hand_q"


def raw_text_types():
    # Hand jsonb, json, timestamptz and timestamp values over as the server's
    # text: a consumer would parse its payload itself, and all three systems
    # are treated alike.
    for oid, name in ((3802, "JSONB_TEXT"), (114, "JSON_TEXT"), (1184, "TSTZ_TEXT"), (1114, "TS_TEXT")):
        psycopg2.extensions.register_type(psycopg2.extensions.new_type((oid,), name, lambda v, c: v))


raw_text_types()


def connect(a, autocommit=False):
    conn = psycopg2.connect(host=a["pghost"], port=a["pgport"], user=a["pguser"], dbname=a["dbname"],
                            application_name="queue_bench")
    conn.autocommit = autocommit
    return conn


try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):
    CLK_TCK = 100


def machine_cpu():
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, sum(v[:8])


def own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# pct() and summary_ms() are the relay benchmark's (same directory).
from relay_bench_tool import pct, summary_ms  # noqa: E402


# ---- the consumers' receive step, per system ----------------------------------------
# Each returns a function fetch() -> list of rows, or None when there was nothing
# to take; it runs inside the open transaction (psycopg2 sends BEGIN before the
# first statement), the caller commits.  Rows are reduced to (key, payload text).

def make_fetch(system, cur, batch, idx, consumers, pgq_mode):
    if system == "outbox":
        cur.execute("PREPARE recv(int) AS SELECT * FROM outbox.receive('%s', $1)" % QUEUE)

        def fetch():
            cur.execute("EXECUTE recv(%s)", (batch,))
            rows = cur.fetchall()
            return [(r[3], r[5]) for r in rows] if rows else None
        return fetch
    if system == "hand":
        cur.execute("PREPARE recv(int) AS DELETE FROM %s WHERE id IN (SELECT id FROM %s ORDER BY id"
                    " FOR UPDATE SKIP LOCKED LIMIT $1) RETURNING *" % (HAND, HAND))

        def fetch():
            cur.execute("EXECUTE recv(%s)", (batch,))
            rows = cur.fetchall()
            return [(r[1], r[2]) for r in rows] if rows else None
        return fetch
    if system == "pgq":
        cname = "c%d" % (idx + 1 if pgq_mode == "partitioned" else 1)
        cur.execute("PREPARE nb AS SELECT pgq.next_batch('%s', '%s')" % (QUEUE, cname))
        cur.execute("PREPARE ev(bigint) AS SELECT * FROM pgq.get_batch_events($1)")
        cur.execute("PREPARE fin(bigint) AS SELECT pgq.finish_batch($1)")
        part = pgq_mode == "partitioned" and consumers > 1

        def fetch():
            cur.execute("EXECUTE nb")
            bid = cur.fetchone()[0]
            if bid is None:
                return None
            cur.execute("EXECUTE ev(%s)", (bid,))
            rows = cur.fetchall()
            cur.execute("EXECUTE fin(%s)", (bid,))
            if part:
                return [(r[6], r[5]) for r in rows
                        if zlib.crc32(r[6].encode()) % consumers == idx]
            return [(r[6], r[5]) for r in rows]
        return fetch
    if system == "ceiling":
        # Not a queue: about the cheapest transaction that must flush its
        # commit record (one heap insert into the index-less ceiling_t), one
        # per "message"; what the client, the round trips and the WAL flush
        # cost here, without any queue.
        cur.execute("PREPARE recv AS INSERT INTO ceiling_t VALUES (1) RETURNING 1")
        seq = [idx * 1000000000]

        def fetch():
            cur.execute("EXECUTE recv")
            cur.fetchall()
            seq[0] += 1
            return [(None, '"order_id": %d' % seq[0])]
        return fetch
    raise ValueError(system)


def consumer_main(a, idx, counter, barrier, done_q, res_q):
    try:
        conn = connect(a)
        cur = conn.cursor()
        fetch = make_fetch(a["system"], cur, a["batch"], idx, a["consumers"], a["pgq_mode"])
        conn.commit()
        n = a["n"]
        sleep = a["empty_sleep_ms"] / 1000.0
        txns = []		# (t_commit_sent, t_commit_returned, rows)
        empty = 0
        batches = 0		# transactions that took something (PgQ: batches, even empty ones)
        cpu0 = own_cpu()
        barrier.wait()
        deadline = mono() + a["max_secs"]
        while True:
            rows = fetch()
            if rows is None:
                conn.commit()
                empty += 1
                if counter.value >= n or mono() > deadline:
                    break
                if sleep > 0:
                    time.sleep(sleep)
                continue
            ta = mono()
            conn.commit()
            tb = mono()
            batches += 1
            if not rows:		# a PgQ batch with none of our events
                if counter.value >= n or tb > deadline:
                    break
                continue
            txns.append((ta, tb, rows))
            with counter.get_lock():
                counter.value += len(rows)
                c = counter.value
            if c >= n or tb > deadline:
                break
        cpu1 = own_cpu()
        done_q.put(idx)
        # Not timed: reduce the rows to (key, n).
        out = []
        for ta, tb, rows in txns:
            out.append((ta, tb, [(k, int(N_RE.search(p).group(1))) for k, p in rows]))
        conn.close()
        res_q.put({"idx": idx, "txns": out, "empty": empty, "batches": batches,
                   "cpu_s": cpu1 - cpu0, "error": None})
    except Exception as e:		# report, do not hang the parent
        try:
            barrier.abort()
        except Exception:
            pass
        done_q.put(idx)
        res_q.put({"idx": idx, "txns": [], "empty": 0, "batches": 0, "cpu_s": 0,
                   "error": "%s: %s" % (type(e).__name__, str(e).strip())})


def ticker_thread(a, stop, stats, tick_s):
    conn = connect(a, autocommit=True)
    cur = conn.cursor()
    while not stop.is_set():
        cur.execute("SELECT pgq.ticker()")
        stats["calls"] += 1
        stats["ticked"] += cur.fetchone()[0] or 0
        stop.wait(tick_s)
    conn.close()


def order_violations(txns):
    """Definite per-key order violations; see the module doc string."""
    by_key = {}
    for ta, tb, msgs in txns:
        for k, n in msgs:
            if k is not None:
                by_key.setdefault(k, []).append((n, ta, tb))
    viol = 0
    for k, lst in by_key.items():
        lst.sort(reverse=True)		# by emitting order, latest first
        min_tb_later = float("inf")	# earliest commit return among later messages of k
        for n, ta, tb in lst:
            if min_tb_later < ta:
                viol += 1
            if tb < min_tb_later:
                min_tb_later = tb
    return viol, len(by_key)


def cmd_drain(a):
    if a["system"] == "pgq" and a["consumers"] > 1 and a["pgq_mode"] != "partitioned":
        print("pgq with more than one consumer: only --pgq-mode partitioned is a drain", file=sys.stderr)
        return 2
    ctx = mp.get_context("fork")
    C = a["consumers"]
    counter = ctx.Value("q", 0)
    barrier = ctx.Barrier(C + 1)
    done_q, res_q = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=consumer_main, args=(a, i, counter, barrier, done_q, res_q)) for i in range(C)]
    for p in procs:
        p.start()
    stop = threading.Event()
    tstats = {"calls": 0, "ticked": 0}
    tt = None
    if a["system"] == "pgq":
        tt = threading.Thread(target=ticker_thread, args=(a, stop, tstats, a["tick_ms"] / 1000.0), daemon=True)
        tt.start()
    try:
        barrier.wait(timeout=120)
    except threading.BrokenBarrierError:
        pass
    t0 = mono()
    m0 = machine_cpu()
    for _ in procs:
        done_q.get()
    t_done = mono()
    m1 = machine_cpu()
    res = [res_q.get() for _ in procs]
    for p in procs:
        p.join()
    stop.set()
    if tt:
        tt.join()
    errors = [r["error"] for r in res if r["error"]]
    txns = [t for r in res for t in r["txns"]]
    received = sum(len(t[2]) for t in txns)
    seen = {}
    for _, _, msgs in txns:
        for _, n in msgs:
            seen[n] = seen.get(n, 0) + 1
    dups = sum(v - 1 for v in seen.values())
    t_end = max((t[1] for t in txns), default=t0)
    secs = t_end - t0
    viol, nkeys = order_violations(txns)
    wall = t_done - t0
    out = {
        "system": a["system"], "consumers": C, "batch": a["batch"], "n": a["n"],
        "pgq_mode": a["pgq_mode"] if a["system"] == "pgq" and C > 1 else None,
        "received": received, "distinct": len(seen), "duplicates": dups,
        "drained": len(seen) >= a["n"], "timed_out": wall >= a["max_secs"],
        "seconds": round(secs, 3), "rate": round(received / secs, 1) if secs > 0 else None,
        "transactions": len(txns), "avg_batch": round(received / len(txns), 2) if txns else None,
        "empty_receives": sum(r["empty"] for r in res),
        "per_consumer": [len([1 for t in r["txns"] for _ in t[2]]) for r in sorted(res, key=lambda r: r["idx"])],
        "keys": nkeys, "order_violations": viol,
        "client_cpu_s": round(sum(r["cpu_s"] for r in res), 2),
        "machine_cpus_busy": round((m1[0] - m0[0]) / CLK_TCK / wall, 2) if wall > 0 else None,
        "errors": errors[:3],
    }
    if a["system"] == "pgq":
        out["pgq_batches"] = sum(r["batches"] for r in res)
        out["ticker_calls"] = tstats["calls"]
        out["ticks_made"] = tstats["ticked"]
    print(json.dumps(out))
    return 1 if errors else 0


# ---- latency -----------------------------------------------------------------------------

def producer_main(a, barrier, res_q):
    conn = connect(a)
    cur = conn.cursor()
    system = a["system"]
    if system == "outbox":
        cur.execute("PREPARE emit(bigint, text) AS SELECT outbox_emit('bench', bench_payload($1), $2)")
    elif system == "hand":
        cur.execute("PREPARE emit(bigint, text) AS INSERT INTO %s (key, payload) VALUES ($2, bench_payload($1))" % HAND)
    else:
        cur.execute("PREPARE emit(bigint, text) AS SELECT pgq.insert_event('%s', 'bench', bench_payload($1)::text,"
                    " $2, NULL, NULL, NULL)" % QUEUE)
    conn.commit()
    stmt = "EXECUTE emit(%s, %s)" + ("; NOTIFY " + HAND if system == "hand" else "")
    total = int(a["rate"] * a["seconds"])
    rows = []
    errors = 0
    barrier.wait()
    start = mono() + 0.3
    for i in range(total):
        delay = start + i / a["rate"] - mono()
        if delay > 0:
            time.sleep(delay)
        n = 10000000 + i
        try:
            cur.execute(stmt, (n, "key-%d" % (i % a["keys"])))
            ta = mono()
            conn.commit()
            tb = mono()
        except psycopg2.Error:
            conn.rollback()
            errors += 1
            continue
        rows.append((n, ta, tb))
    conn.close()
    span = rows[-1][2] - rows[0][1] if len(rows) > 1 else 0
    res_q.put(("producer", rows, {"errors": errors, "achieved_rate": round(len(rows) / span, 1) if span else None}))


def receiver_main(a, barrier, stop, res_q):
    conn = connect(a)
    cur = conn.cursor()
    system = a["system"]
    got = []		# (n, t_returned)
    calls = []		# outbox: (t_call, t_returned, t_committed, rows) of every receive
    total = int(a["rate"] * a["seconds"])
    poll = a["poll_ms"] / 1000.0
    if system == "outbox":
        cur.execute("PREPARE recv AS SELECT * FROM outbox.receive('%s', 1, 5000)" % QUEUE)
    elif system == "hand":
        cur.execute("PREPARE recv AS DELETE FROM %s WHERE id IN (SELECT id FROM %s ORDER BY id"
                    " FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING *" % (HAND, HAND))
        cur.execute("LISTEN " + HAND)
    else:
        cur.execute("PREPARE nb AS SELECT pgq.next_batch('%s', 'c1')" % QUEUE)
        cur.execute("PREPARE ev(bigint) AS SELECT * FROM pgq.get_batch_events($1)")
        cur.execute("PREPARE fin(bigint) AS SELECT pgq.finish_batch($1)")
    conn.commit()
    barrier.wait()
    empty = 0
    while len(got) < total:
        if system == "outbox":
            tc = mono()
            cur.execute("EXECUTE recv")
            rows = cur.fetchall()
            t = mono()
            conn.commit()
            calls.append((tc, t, mono(), len(rows)))
            for r in rows:
                got.append((int(N_RE.search(r[5]).group(1)), t))
            if not rows:
                empty += 1
                if stop.is_set():
                    break
        elif system == "hand":
            cur.execute("EXECUTE recv")
            rows = cur.fetchall()
            t = mono()
            conn.commit()
            for r in rows:
                got.append((int(N_RE.search(r[2]).group(1)), t))
            if rows:
                continue
            empty += 1
            if stop.is_set():
                break
            # A notification may already sit in libpq's input buffer (read
            # with the COMMIT's reply), where select() would not see it.
            conn.poll()
            if conn.notifies:
                conn.notifies.clear()
                continue
            if select.select([conn], [], [], 5.0)[0]:
                conn.poll()
                conn.notifies.clear()
        else:
            cur.execute("EXECUTE nb")
            bid = cur.fetchone()[0]
            if bid is None:
                conn.commit()
                empty += 1
                if stop.is_set():
                    break
                time.sleep(poll)
                continue
            cur.execute("EXECUTE ev(%s)", (bid,))
            rows = cur.fetchall()
            t = mono()
            cur.execute("EXECUTE fin(%s)", (bid,))
            conn.commit()
            for r in rows:
                got.append((int(N_RE.search(r[5]).group(1)), t))
    conn.close()
    res_q.put(("receiver", got, {"empty_receives": empty}, calls))


def cmd_latency(a):
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(3)
    stop = ctx.Event()
    res_q = ctx.Queue()
    prod = ctx.Process(target=producer_main, args=(a, barrier, res_q))
    recv = ctx.Process(target=receiver_main, args=(a, barrier, stop, res_q))
    prod.start()
    recv.start()
    tstop = threading.Event()
    tstats = {"calls": 0, "ticked": 0}
    tt = None
    if a["system"] == "pgq":
        tt = threading.Thread(target=ticker_thread, args=(a, tstop, tstats, a["tick_ms"] / 1000.0), daemon=True)
        tt.start()
    barrier.wait(timeout=120)
    got = {}
    first = res_q.get()
    got[first[0]] = first
    if first[0] == "producer":
        time.sleep(2)		# the last messages' way to the receiver
        stop.set()
    second = res_q.get()
    got[second[0]] = second
    stop.set()
    prod.join()
    recv.join()
    tstop.set()
    if tt:
        tt.join()
    emits = got["producer"][1]
    recvd = {}
    dup = 0
    for n, t in got["receiver"][1]:
        if n in recvd:
            dup += 1
        recvd.setdefault(n, t)
    from_ret, from_sent = [], []
    missing = 0
    raw = []
    for n, ta, tb in emits:
        t = recvd.get(n)
        raw.append({"n": n, "commit_sent": ta, "commit_returned": tb, "received": t})
        if t is None:
            missing += 1
            continue
        from_ret.append(t - tb)
        from_sent.append(t - ta)
    if a["out"]:
        with open(a["out"], "w") as f:
            for x in raw:
                f.write(json.dumps(x) + "\n")
            for c in got["receiver"][3]:
                f.write(json.dumps({"call": c[0], "returned": c[1], "committed": c[2], "rows": c[3]}) + "\n")
    out = {"system": a["system"], "emitted": len(emits), "received": len(recvd), "missing": missing,
           "duplicates": dup, "producer": got["producer"][2], "receiver": got["receiver"][2],
           "from_commit_returned_ms": summary_ms(from_ret), "from_commit_sent_ms": summary_ms(from_sent)}
    if tt:
        out["ticker_calls"] = tstats["calls"]
    print(json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pghost", required=True)
    ap.add_argument("--pgport", type=int, required=True)
    ap.add_argument("--pguser", default="postgres")
    ap.add_argument("--dbname", required=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("drain")
    p.add_argument("--system", choices=["outbox", "pgq", "hand", "ceiling"], required=True)
    p.add_argument("--consumers", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--max-secs", type=float, default=120)
    p.add_argument("--empty-sleep-ms", type=float, default=1)
    p.add_argument("--tick-ms", type=float, default=20)
    p.add_argument("--pgq-mode", choices=["fanout", "partitioned"], default="partitioned")
    p = sub.add_parser("latency")
    p.add_argument("--system", choices=["outbox", "pgq", "hand"], required=True)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--keys", type=int, default=20)
    p.add_argument("--tick-ms", type=float, default=10)
    p.add_argument("--poll-ms", type=float, default=10)
    p.add_argument("--out", default="", help="one JSON line per message: its times (monotonic s)")
    args = vars(ap.parse_args())
    return {"drain": cmd_drain, "latency": cmd_latency}[args["cmd"]](args)


if __name__ == "__main__":
    sys.exit(main())
