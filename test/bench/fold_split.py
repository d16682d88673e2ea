#!/usr/bin/env python3
"""fold_split.py - where the relay worker's samples go, by part of the relay.

Reads folded stacks (perf_fold in common.sh: "frame;frame;... count" per
line, outermost frame first) of the relay worker and prints the share of
its samples in each part, each sample counted once, in the first part
(in the order below) whose function is on its stack:

  outside the loop  samples not under outbox_worker_main: the library
                    threads (libnats', librdkafka's), and stacks perf could
                    not unwind to it
  JSON text         payloads and headers as JSON text (relay_payload_text,
                    relay_jsonb_text, JsonbToCString)
  message copy      the rest of building a message from a row
                    (relay_make_message)
  read              reading rows: transaction, snapshot, cursor, executor,
                    deforming (relay_read_messages)
  progress          recording progress and batches (relay_write_progress,
                    relay_record_cuts, relay_progress_*)
  request           cutting and building requests, handing them to the
                    transport library and the kernel (relay_dispatch,
                    relay_lane_start, relay_lane_cut)
  transport I/O     the transports' own I/O and replies: libcurl's sending
                    and receiving, acknowledgements, finishing messages
                    (relay_drive, relay_*_drive, relay_lane_outcome)
  wait              waiting for events (WaitEventSetWait, relay_sleep_ms)
  other             the rest of the loop (statistics, configuration,
                    retention, frontier)

  fold_split.py FILE.folded [FILE.folded ...]
"""
import sys

PARTS = [
    ("JSON text", ("relay_payload_text", "relay_jsonb_text", "JsonbToCString")),
    ("message copy", ("relay_make_message",)),
    ("read", ("relay_read_messages",)),
    ("progress", ("relay_write_progress", "relay_record_cuts", "relay_progress_")),
    ("request", ("relay_dispatch", "relay_lane_start", "relay_lane_cut")),
    ("transport I/O", ("relay_drive", "_drive", "relay_lane_outcome")),
    ("wait", ("WaitEventSetWait", "relay_sleep_ms")),
]


def part_of(frames):
    if not any(f == "outbox_worker_main" for f in frames):
        return "outside the loop"
    for name, marks in PARTS:
        for f in frames:
            base = f.split(".")[0]
            if any(base == m or (m.endswith("_") and base.startswith(m)) or
                   (m.startswith("_") and base.startswith("relay_") and base.endswith(m))
                   for m in marks):
                return name
    return "other"


def split(path):
    counts, total = {}, 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack or not n.isdigit():
                continue
            n = int(n)
            total += n
            p = part_of(stack.split(";"))
            counts[p] = counts.get(p, 0) + n
    return counts, total


def main():
    names = ["outside the loop"] + [p for p, _ in PARTS] + ["other"]
    for path in sys.argv[1:]:
        counts, total = split(path)
        if total == 0:
            print(f"{path}: no samples")
            continue
        print(f"{path}: {total} samples; " +
              ", ".join(f"{p} {100.0 * counts.get(p, 0) / total:.0f}%" for p in names if counts.get(p)))


if __name__ == "__main__":
    main()
