#!/usr/bin/env python3
"""relay_bench_tool: the timing and checking parts of relay_bench.sh.

Needs psycopg2 (Debian: python3-psycopg2).  Subcommands (common options
--pghost --pgport --pguser --dbname):

  drain     --target-id T --n N [--worker-pid P] [--cpu-pids P,P] [--poll-ms 20]
            Turn outbox.enabled on (ALTER SYSTEM + pg_reload_conf) and poll
            outbox.progress until the target's delivered + dead reaches N.
            Prints JSON: seconds from the reload to the last recorded
            delivery, msgs/s, the rate between 10% and 90% delivered, time
            to the first recorded delivery, and the CPU seconds that the
            given processes and the whole machine used meanwhile.

  emit-rate --rate R --seconds S --threads K --out FILE
            Emit R messages/s (fixed schedule, open loop, spread over K
            connections) in single-statement autocommit transactions with
            outbox_emit(..., bench_payload(n), key); writes one JSON line per
            message: scheduled time, time before the call, time the commit
            returned, msg_id.

  latency   --emits FILE --sink-records FILE
            Joins emitted messages with the sink's arrival records by
            webhook-id (= msg_id for batch_size 1) and prints percentiles of
            arrival - emitted_at (the server's clock at the outbox_emit()
            call, before the commit) and of arrival - commit returned to the
            client, plus the commit times themselves.

  verify    --sink-records FILE --target-id T
            Checks what the sink received against outbox.messages above the
            target's subscription start: every message exactly once, nothing
            unknown, and per key in id order (arrival order).
"""

import argparse
import json
import sys
import threading
import time

import psycopg2


def connect(args, autocommit=True):
    conn = psycopg2.connect(host=args.pghost, port=args.pgport, user=args.pguser, dbname=args.dbname)
    conn.autocommit = autocommit
    return conn


def proc_cpu(pid):
    """utime + stime of a process, in seconds; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu():
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    total = sum(v[:8])
    return total - idle, total


try:
    import os
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):
    CLK_TCK = 100


def cmd_drain(args):
    conn = connect(args)
    cur = conn.cursor()
    pids = [int(p) for p in args.cpu_pids.split(",") if p] if args.cpu_pids else []
    q = ("SELECT coalesce(sum(delivered), 0)::bigint, coalesce(sum(dead), 0)::bigint"
         "  FROM outbox.progress WHERE target_id = %s")
    cur.execute(q, (args.target_id,))
    base = sum(cur.fetchone())
    cpu0 = {p: proc_cpu(p) for p in pids}
    m0 = machine_cpu()
    cur.execute("ALTER SYSTEM SET outbox.enabled = on")
    t0 = time.time()
    cur.execute("SELECT pg_reload_conf()")
    timeline = []
    poll = args.poll_ms / 1000.0
    deadline = t0 + args.timeout
    done = 0
    while True:
        cur.execute(q, (args.target_id,))
        d, dead = cur.fetchone()
        now = time.time()
        done = d + dead - base
        if not timeline or timeline[-1][1] != done:
            timeline.append((now, done))
        if done >= args.n or now > deadline:
            break
        time.sleep(poll)
    t1 = timeline[-1][0]
    cpu1 = {p: proc_cpu(p) for p in pids}
    m1 = machine_cpu()

    def t_at(frac):
        for t, n in timeline:
            if n >= frac * args.n:
                return t
        return None

    t10, t90 = t_at(0.10), t_at(0.90)
    first = next((t for t, n in timeline if n > 0), None)
    secs = t1 - t0
    out = {
        "n": args.n, "done": done, "delivered": d, "dead": dead,
        "timed_out": done < args.n,
        "seconds": round(secs, 3), "rate": round(done / secs, 1) if secs > 0 else None,
        "rate_10_90": round(0.8 * args.n / (t90 - t10), 1) if t10 and t90 and t90 > t10 else None,
        "first_delivery_s": round(first - t0, 3) if first else None,
        "cpu_s": {str(p): (round(cpu1[p] - cpu0[p], 2) if cpu0[p] is not None and cpu1[p] is not None else None)
                  for p in pids},
        "machine_cpus_busy": round((m1[0] - m0[0]) / CLK_TCK / secs, 2) if secs > 0 else None,
    }
    print(json.dumps(out))
    return 0


def cmd_emit_rate(args):
    n_total = int(args.rate * args.seconds)
    start = time.time() + 0.5
    rows = [None] * n_total
    errors = []

    def worker(k):
        conn = connect(args)
        cur = conn.cursor()
        for i in range(k, n_total, args.threads):
            sched = start + i / args.rate
            delay = sched - time.time()
            if delay > 0:
                time.sleep(delay)
            key = f"key-{(i * 7919) % 1000}"
            try:
                ta = time.time()
                cur.execute("SELECT outbox_emit('latency.test', bench_payload(%s), %s)::text",
                            (1000000 + i, key))
                msg_id = cur.fetchone()[0]
                tb = time.time()
            except psycopg2.Error as e:
                errors.append(str(e))
                continue
            rows[i] = {"i": i, "sched": sched, "t_call": ta, "t_commit": tb, "msg_id": msg_id}
        conn.close()

    ths = [threading.Thread(target=worker, args=(k,)) for k in range(args.threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    with open(args.out, "w") as f:
        for r in rows:
            if r is not None:
                f.write(json.dumps(r) + "\n")
    sent = [r for r in rows if r is not None]
    lag = sorted(r["t_call"] - r["sched"] for r in sent)
    span = sent[-1]["t_commit"] - sent[0]["t_call"] if sent else 0
    print(json.dumps({"emitted": len(sent), "errors": len(errors),
                      "achieved_rate": round(len(sent) / span, 1) if span else None,
                      "schedule_lag_p99_ms": round(1000 * pct(lag, 99), 2) if lag else None,
                      "first_error": errors[0] if errors else None}))
    return 0 if not errors else 1


def pct(sorted_vals, p):
    """Nearest-rank percentile of an ascending list."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(-(-p * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


def summary_ms(vals):
    v = sorted(vals)
    if not v:
        return None
    return {"n": len(v), "min": round(1000 * v[0], 2), "p50": round(1000 * pct(v, 50), 2),
            "p90": round(1000 * pct(v, 90), 2), "p99": round(1000 * pct(v, 99), 2),
            "max": round(1000 * v[-1], 2), "mean": round(1000 * sum(v) / len(v), 2)}


def load_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def cmd_latency(args):
    emits = load_records(args.emits)
    recs = load_records(args.sink_records)
    arrival = {}
    dup = 0
    for r in recs:
        if r["id"] in arrival:
            dup += 1
        else:
            arrival[r["id"]] = r["t"]
    conn = connect(args)
    cur = conn.cursor()
    cur.execute("SELECT msg_id::text, extract(epoch FROM emitted_at)::float8 FROM outbox.messages"
                " WHERE msg_id = ANY(%s::uuid[])", ([e["msg_id"] for e in emits],))
    emitted_at = dict(cur.fetchall())
    from_emit, from_commit, commit = [], [], []
    missing = 0
    for e in emits:
        t = arrival.get(e["msg_id"])
        commit.append(e["t_commit"] - e["t_call"])
        if t is None:
            missing += 1
            continue
        if e["msg_id"] in emitted_at:
            from_emit.append(t - emitted_at[e["msg_id"]])
        from_commit.append(t - e["t_commit"])
    print(json.dumps({
        "emitted": len(emits), "arrived": len(emits) - missing, "missing": missing,
        "duplicate_requests": dup, "sink_requests": len(recs),
        "arrival_minus_emitted_at_ms": summary_ms(from_emit),
        "arrival_minus_commit_returned_ms": summary_ms(from_commit),
        "commit_call_ms": summary_ms(commit),
    }))
    return 0


def cmd_verify(args):
    recs = load_records(args.sink_records)
    conn = connect(args)
    cur = conn.cursor()
    cur.execute("SELECT min(start_id) FROM outbox.subscriptions WHERE target_id = %s", (args.target_id,))
    start = cur.fetchone()[0]
    cur.execute("SELECT id, key FROM outbox.messages WHERE id > %s ORDER BY id", (start,))
    expect = dict(cur.fetchall())
    seen = {}
    dups = unknown = key_mismatch = order_violations = 0
    last_by_key = {}
    first_dups = []
    for r in recs:
        if r.get("items") is not None:
            items = r["items"]
        else:
            items = [[int(r["seq"]), r.get("key")]]
        for seq, key in items:
            seq = int(seq)
            if seq in seen:
                dups += 1
                if len(first_dups) < 5:
                    first_dups.append(seq)
            seen[seq] = seen.get(seq, 0) + 1
            if seq not in expect:
                unknown += 1
                continue
            if expect[seq] != key:
                key_mismatch += 1
            k = expect[seq]
            if k in last_by_key and seq <= last_by_key[k]:
                order_violations += 1
            last_by_key[k] = max(seq, last_by_key.get(k, seq))
    missing = [i for i in expect if i not in seen]
    out = {"expected": len(expect), "requests": len(recs), "delivered_distinct": len(seen),
           "missing": len(missing), "first_missing": missing[:5], "duplicates": dups,
           "first_duplicates": first_dups, "unknown": unknown, "key_mismatch": key_mismatch,
           "per_key_order_violations": order_violations}
    out["ok"] = not (missing or dups or unknown or key_mismatch or order_violations)
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
    p.add_argument("--target-id", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--cpu-pids", default="")
    p.add_argument("--poll-ms", type=float, default=20)
    p.add_argument("--timeout", type=float, default=900)
    p = sub.add_parser("emit-rate")
    p.add_argument("--rate", type=float, default=500)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--out", required=True)
    p = sub.add_parser("latency")
    p.add_argument("--emits", required=True)
    p.add_argument("--sink-records", required=True)
    p = sub.add_parser("verify")
    p.add_argument("--sink-records", required=True)
    p.add_argument("--target-id", type=int, required=True)
    args = ap.parse_args()
    return {"drain": cmd_drain, "emit-rate": cmd_emit_rate, "latency": cmd_latency,
            "verify": cmd_verify}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
