#!/usr/bin/env python3
"""Summarise an outbox_sink record file.

    python3 test/sink/sink_report.py R.jsonl [--json]

Prints the number of requests, the counts by status, by path (with each
path's counts by status), how many had sig_ok false (and true / unchecked),
and how many distinct webhook-id values were seen (re-deliveries show up as
the difference).  --json prints the same as one JSON object.
"""

import argparse
import json
import sys


def load(path):
    """The records of a record file, in file order (a torn last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def summarise(records):
    by_status = {}
    by_path = {}
    sig = {"true": 0, "false": 0, "null": 0}
    ids = set()
    with_id = 0
    for r in records:
        st = str(r.get("status"))
        by_status[st] = by_status.get(st, 0) + 1
        p = by_path.setdefault(r.get("path"), {"requests": 0, "by_status": {}})
        p["requests"] += 1
        p["by_status"][st] = p["by_status"].get(st, 0) + 1
        sig[json.dumps(r.get("sig_ok"))] += 1
        wid = (r.get("headers") or {}).get("webhook-id")
        if wid is not None:
            with_id += 1
            ids.add(wid)
    return {"requests": len(records), "by_status": by_status, "by_path": by_path,
            "sig_ok_false": sig["false"], "sig_ok_true": sig["true"],
            "sig_unchecked": sig["null"], "with_webhook_id": with_id,
            "distinct_webhook_id": len(ids)}


def _key(s):
    return (0, int(s)) if s.isdigit() else (1, s)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", help="record file written by outbox_sink.py --record")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    s = summarise(load(args.record))
    if args.json:
        print(json.dumps(s, sort_keys=True))
        return 0
    print(f"requests: {s['requests']}")
    print("by status: " + (", ".join(f"{k}: {v}" for k, v in
                                     sorted(s["by_status"].items(), key=lambda kv: _key(kv[0])))
                           or "-"))
    print("by path:")
    for path in sorted(s["by_path"], key=str):
        p = s["by_path"][path]
        detail = ", ".join(f"{k}: {v}" for k, v in
                           sorted(p["by_status"].items(), key=lambda kv: _key(kv[0])))
        print(f"  {path}: {p['requests']} ({detail})")
    print(f"sig_ok false: {s['sig_ok_false']} (true: {s['sig_ok_true']}, "
          f"unchecked: {s['sig_unchecked']})")
    print(f"webhook-id: {s['distinct_webhook_id']} distinct in {s['with_webhook_id']} requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
