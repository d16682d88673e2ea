#!/usr/bin/env python3
"""bench_sink: a small, fast HTTP receiver for relay_bench.sh.

Standard library only (asyncio).  Answers every request "204 No Content"
on keep-alive HTTP/1.1 connections and records, per request, the arrival
time (time.time() once the whole body has been read), the outbox-seq,
webhook-id, outbox-key and outbox-count headers and, with
--parse-batches, the (seq, key) of every envelope of a batch body.

    python3 bench_sink.py --port 0 --port-file F --record R.jsonl [--parse-batches]

Records are kept in memory and written to the record file, one JSON line
per request in arrival order, when the process gets SIGTERM or SIGINT:

    {"t": 1700000000.123456, "seq": 17, "id": "<webhook-id>",
     "key": "k", "count": 1, "items": [[seq, key], ...]}

("items" only with --parse-batches and a JSON array body.)
"""

import argparse
import asyncio
import json
import os
import signal
import sys
import time

records = []
parse_batches = False

RESPONSE = b"HTTP/1.1 204 No Content\r\nServer: bench_sink\r\n\r\n"
RESPONSE_CLOSE = b"HTTP/1.1 204 No Content\r\nServer: bench_sink\r\nConnection: close\r\n\r\n"


async def handle(reader, writer):
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            if line in (b"\r\n", b"\n"):
                continue		# stray empty line between requests
            headers = {}
            while True:
                h = await reader.readline()
                if not h:
                    return
                if h in (b"\r\n", b"\n"):
                    break
                name, _, value = h.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            body = await reader.readexactly(length) if length > 0 else b""
            t = time.time()
            rec = {"t": t, "seq": headers.get("outbox-seq"), "id": headers.get("webhook-id"),
                   "key": headers.get("outbox-key"), "count": headers.get("outbox-count")}
            if parse_batches and body[:1] == b"[":
                try:
                    rec["items"] = [[e.get("seq"), e.get("key")] for e in json.loads(body)]
                except ValueError:
                    rec["items"] = None
            records.append(rec)
            close = headers.get("connection", "").lower() == "close" or line.endswith(b"HTTP/1.0\r\n")
            writer.write(RESPONSE_CLOSE if close else RESPONSE)
            if close:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


def dump(path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")))
            f.write("\n")
    os.replace(tmp, path)


async def main():
    global parse_batches
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--record", required=True)
    ap.add_argument("--parse-batches", action="store_true")
    args = ap.parse_args()
    parse_batches = args.parse_batches

    server = await asyncio.start_server(handle, args.host, args.port, backlog=256)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)

    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    await stop
    server.close()
    dump(args.record)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
