#!/usr/bin/env python3
"""bench_charts: the charts of relay_bench.sh and queue_bench.sh.

Reads a benchmark's results.jsonl (the JSON lines the script recorded) and
writes, into OUTDIR, for each chart NAME: NAME.dat (the figures plotted,
with a comment header), NAME.gp (the gnuplot script that plots it; run
again with `cd OUTDIR && gnuplot NAME.gp`) and NAME.svg, by running gnuplot
(Debian: gnuplot-nox).  Prints the SVG paths it wrote, one a line.

  relay RESULTS OUTDIR [--configs "1:32 1:8 100:8 100:32"] [--note TEXT]
        relay-drain: drain throughput (medians over the rounds) by
        batch_size:lanes, against nginx's ceiling (wrk), the bare libcurl
        client and the hand-rolled polling relay;
        relay-latency: latency percentiles (p50, p90, p99) of the steady-rate
        run.
  queue RESULTS OUTDIR [--systems "outbox pgq hand"] [--note TEXT]
        queue-receive: receive-and-commit throughput (medians) per batch (one
        panel each) and consumers, outbox against PgQ, the SKIP LOCKED table
        and the ceiling;
        queue-latency: wake-up latency percentiles per system, if measured.

The figures are the ones the scripts' text reports print (medians of the
same runs); the charts add nothing to them.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

med = statistics.median

# one colour per thing compared, the same in every chart
COLOR = {
    "ceiling": "#7f7f7f",
    "outbox": "#1f6fb4",
    "pgq": "#e8821e",
    "hand": "#2ca02c",
    "emitted": "#1f6fb4",
    "commit": "#8fbfe6",
    "alt": "#9467bd",
}

TERMINAL = ('set terminal svg size {w},{h} dynamic noenhanced font "DejaVu Sans,13" '
            'fontscale 1 background rgb "white"')


def q(s):
    """A double-quoted gnuplot string (data file or script)."""
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def fmt_rate(v):
    return f"{v:,.0f}"


def fmt_k(v):
    if v >= 10000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}"


def fmt_ms(v):
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def run_gnuplot(outdir, name):
    gp = shutil.which("gnuplot")
    if not gp:
        print("bench_charts: no gnuplot (Debian: gnuplot-nox); wrote " + name + ".dat and .gp only", file=sys.stderr)
        return None
    svg = os.path.join(outdir, name + ".svg")
    log = os.path.join(outdir, name + ".gnuplot.log")
    for f in (svg, log):
        if os.path.exists(f):
            os.remove(f)
    r = subprocess.run([gp, name + ".gp"], cwd=outdir, capture_output=True, text=True)
    # gnuplot warns on stderr (e.g. about an empty series); keep it with the chart
    if r.stderr.strip():
        write(log, r.stderr)
    if r.returncode != 0 or not os.path.exists(svg):
        print(f"bench_charts: gnuplot failed on {name}.gp: {r.stderr.strip()}", file=sys.stderr)
        return None
    return svg


def figure(name, w, h, title, panels):
    """A gnuplot script drawing `panels` (the commands of each) side by side
    into NAME.svg under one title (a multiplot, so that the title stands above
    the panels' keys)."""
    gp = [TERMINAL.format(w=w, h=h),
          f"set output {q(name + '.svg')}",
          f"set multiplot layout 1,{len(panels)} title {q(title)}"]
    gp += panels
    gp.append("unset multiplot")
    return "\n".join(gp) + "\n"


def clustered(groups, series, values, labels, *, ylabel, title="", xlabel="", logscale=False,
              yfmt=None, key="outside top center vertical"):
    """gnuplot commands for a clustered bar chart: groups along x (their
    labels), in each a bar per series ((name, legend title, colour));
    values[group][series] (None: not measured) and the text above each bar.
    The commands read the data from "{panel}" (replaced by the caller with
    the data file, and index).  Returns the commands and the data-file text."""
    keep = [si for si in range(len(series)) if any(row[si] is not None for row in values)]
    series = [series[si] for si in keep]
    values = [[row[si] for si in keep] for row in values]
    labels = [[row[si] for si in keep] for row in labels]
    ns = max(len(series), 1)
    w = 0.8 / ns
    dat = ["# group " + " ".join(f"{name}_value {name}_label" for name, _, _ in series)]
    for gi, g in enumerate(groups):
        cols = [q(g)]
        for si in range(len(series)):
            v = values[gi][si]
            cols.append("NaN" if v is None else repr(float(v)))
            cols.append(q("" if v is None else labels[gi][si]))
        dat.append(" ".join(cols))
    vmax = max([v for row in values for v in row if v is not None] or [1])
    vmin = min([v for row in values for v in row if v is not None] or [0])
    cmd = [f"set title {q(title)}" if title else "unset title",
           f"set ylabel {q(ylabel)}",
           f"set xlabel {q(xlabel)}",
           "set style fill solid 0.9 border rgb '#404040'",
           f"set boxwidth {w:.4f} absolute",
           f"set xrange [-0.6:{len(groups) - 0.4}]",
           "set xtics nomirror scale 0 (" + ", ".join(f"{q(g)} {i}" for i, g in enumerate(groups)) + ")",
           "set ytics nomirror",
           "set grid ytics lc rgb '#dddddd'",
           f"set key {key} Left reverse samplen 2"]
    if logscale and vmin <= 0:
        logscale = False	# a value at or below 0 has no place on a log axis
        ylabel = ylabel.replace(" (log scale)", "")
    if logscale:
        lo = 10 ** math.floor(math.log10(max(vmin * 0.9, 1e-3)))
        cmd += ["set logscale y", f"set yrange [{lo}:{vmax * 4}]"]
    else:
        cmd += ["unset logscale y", f"set yrange [{min(0, vmin * 1.2)}:{vmax * 1.2}]"]
    if yfmt:
        cmd.append(f"set format y {q(yfmt)}")
    plots = []
    for si, (name, stitle, color) in enumerate(series):
        off = (si - (ns - 1) / 2.0) * w
        vc, lc = 2 + 2 * si, 3 + 2 * si
        plots.append(f"{{panel}} using ($0{off:+.4f}):{vc} with boxes lc rgb {q(color)} title {q(stitle)}")
        plots.append(f"{{panel}} using ($0{off:+.4f}):{vc}:{lc} with labels center offset 0,0.7 font ',11' notitle")
    cmd.append("plot " + ", \\\n     ".join(plots))
    return "\n".join(cmd) + "\n", "\n".join(dat) + "\n"


# ---- relay_bench.sh ------------------------------------------------------------------

def relay(a):
    res = [json.loads(line) for line in open(a.results) if line.strip()]

    def of(kind, **kw):
        return [r for r in res if r["kind"] == kind and all(r.get(k) == v for k, v in kw.items())]

    out = []
    ceil = [r["rps"] for r in of("wrk") if r.get("rps")]
    lcurl = [r["rps"] for r in of("libcurl") if r.get("rps")]
    bars = []		# (label, value, category, show the ratio to the ceiling)
    c = med(ceil) if ceil else None
    if c:
        bars.append(("nginx ceiling\n(wrk -c32)", c, "ceiling", False))
    if lcurl:
        bars.append(("bare libcurl\n(curl_client.c)", med(lcurl), "ceiling", True))
    for cfg in a.configs.split():
        bs, lanes = (int(x) for x in cfg.split(":"))
        rs = [r["rate"] for r in of("drain", batch=bs, lanes=lanes) if r.get("rate")]
        if rs:
            bars.append((f"outbox {cfg}\n(batch_size {bs},\n{lanes} lanes)", med(rs), "outbox", True))
    h1 = [r["rate"] for r in of("hand", procs=1) if r.get("rate")]
    if h1:
        bars.append(("hand-rolled\n(1 process)", med(h1), "hand", True))
    for r in of("hand"):
        if r.get("procs", 1) > 1 and r.get("rate"):
            bars.append((f"hand-rolled\n({r['procs']} processes,\nno key order)", r["rate"], "hand", True))
    if bars:
        name = "relay-drain"
        dat = ["# relay_bench.sh: drain throughput, medians over the rounds",
               "# label value(msg/s; req/s for nginx and libcurl) value_label category(1 baseline, 2 outbox, 3 hand-rolled)"]
        cat = {"ceiling": 1, "outbox": 2, "hand": 3}
        for label, v, k, ratio in bars:
            vl = fmt_rate(v) + (f"\n{v / c:.2f} x ceiling" if c and ratio else "")
            dat.append(f"{q(label)} {v!r} {q(vl)} {cat[k]}")
        write(os.path.join(a.outdir, name + ".dat"), "\n".join(dat) + "\n")
        vmax = max(b[1] for b in bars)
        body = ["unset title",
              "set ylabel 'messages/s  (requests/s for nginx and libcurl)'",
              "set style fill solid 0.9 border rgb '#404040'",
              "set boxwidth 0.7",
              f"set xrange [-0.6:{len(bars) - 0.4}]",
              f"set yrange [0:{vmax * 1.22}]",
              "set xtics nomirror scale 0 font ',11'",
              "set ytics nomirror",
              "set format y '%.0s%c'",
              "set grid ytics lc rgb '#dddddd'",
              "set key outside top center horizontal Left reverse samplen 2",
              "set bmargin 5",
              f"plot {q(name + '.dat')} using 0:($4 == 1 ? $2 : 1/0):xtic(1) with boxes lc rgb {q(COLOR['ceiling'])} title 'baselines, no database', \\",
              f"     '' using 0:($4 == 2 ? $2 : 1/0) with boxes lc rgb {q(COLOR['outbox'])} title 'outbox relay worker', \\",
              f"     '' using 0:($4 == 3 ? $2 : 1/0) with boxes lc rgb {q(COLOR['hand'])} title 'hand-rolled polling relay (FOR UPDATE SKIP LOCKED)', \\",
              "     '' using 0:2:3 with labels center offset 0,1.4 font ',11' notitle"]
        drains = of("drain")
        rounds = max(r.get("round", 1) for r in drains) if drains else 1
        n = drains[0]["n"] if drains else None
        backlog = f"a backlog of {n:,} messages" if n else "a backlog"
        title = (f"Relay drain throughput: {backlog} released at once into nginx (return 204)\n"
                 f"medians of {rounds} round{'s' if rounds > 1 else ''}; {a.note}")
        write(os.path.join(a.outdir, name + ".gp"), figure(name, 1000, 600, title, ["\n".join(body)]))
        out.append(run_gnuplot(a.outdir, name))

    lat = of("latency")
    if lat and lat[0].get("arrival_minus_emitted_at_ms"):
        r = lat[0]
        name = "relay-latency"
        L = r["arrival_minus_emitted_at_ms"]
        C = r.get("arrival_minus_commit_returned_ms") or {}
        K = r.get("commit_call_ms") or {}
        ps = ["p50", "p90", "p99"]
        series = [("emitted", "webhook arrival - emitted_at (server clock in outbox_emit, before COMMIT)", COLOR["emitted"]),
                  ("commit", "webhook arrival - COMMIT returned to the client", COLOR["commit"]),
                  ("rtt", "the client's COMMIT round trip (for scale)", COLOR["ceiling"])]
        values = [[L.get(p), C.get(p), K.get(p)] for p in ps]
        labels = [["" if v is None else fmt_ms(v) for v in row] for row in values]
        rate = (r.get("emitter") or {}).get("achieved_rate")
        title = (f"Relay latency at a steady {rate} msg/s for {a.lat_secs} s: batch_size 1, {a.lat_lanes} lanes, into bench_sink.py"
                 f"{chr(10)}{r['arrived']:,}/{r['emitted']:,} arrived; max {L.get('max')} ms; {a.note}")
        cmd, dat = clustered(ps, series, values, labels, ylabel="milliseconds",
                             xlabel="percentile over all messages of the run")
        write(os.path.join(a.outdir, name + ".dat"), "# relay_bench.sh: latency run, ms\n" + dat)
        write(os.path.join(a.outdir, name + ".gp"), figure(name, 900, 560, title, [cmd.replace("{panel}", q(name + ".dat"))]))
        out.append(run_gnuplot(a.outdir, name))
    return out


# ---- queue_bench.sh ------------------------------------------------------------------

QNAMES = {"outbox": "outbox.receive()", "pgq": "PgQ", "hand": "SKIP LOCKED table (hand-rolled)",
          "ceiling": "ceiling (no queue: one-row INSERT + COMMIT)"}


def queue(a):
    res = [json.loads(line) for line in open(a.results) if line.strip()]
    out = []
    drains = [r for r in res if r["kind"] == "drain" and r.get("rate")]
    systems = a.systems.split()
    if any(r.get("system") == "ceiling" for r in drains):
        systems.append("ceiling")
    series = [(s, QNAMES[s], COLOR[s]) for s in systems]
    batches = sorted({r["batch"] for r in drains})
    if drains:
        name = "queue-receive"
        panels = []
        dats = []
        for b in batches:
            cons = sorted({r["consumers"] for r in drains if r["batch"] == b})
            values, labels = [], []
            for c in cons:
                row, lrow = [], []
                for s in systems:
                    rr = [r for r in drains if r["system"] == s and r["batch"] == b and r["consumers"] == c]
                    v = med(r["rate"] for r in rr) if rr else None
                    row.append(v)
                    cut = any(not r.get("drained", True) for r in rr)
                    lrow.append("" if v is None else fmt_k(v) + ("*" if cut else ""))
                values.append(row)
                labels.append(lrow)
            groups = [f"{c} consumer" + ("s" if c > 1 else "") for c in cons]
            n = next(r["n"] for r in drains if r["batch"] == b)
            cmd, dat = clustered(groups, series, values, labels,
                                 title=f"batch {b}: at most {b} message{'s' if b > 1 else ''} per transaction, backlog {n:,}",
                                 ylabel="messages/s received and committed", yfmt="%.0s%c")
            panels.append(cmd)
            dats.append(f"# batch {b}\n" + dat)
        write(os.path.join(a.outdir, name + ".dat"),
              "# queue_bench.sh: receive-and-commit throughput, msg/s, medians over the rounds;\n"
              "# one data block per batch size (gnuplot index 0, 1, ...)\n" + "\n\n".join(dats))
        rounds = max(r.get("round", 1) for r in drains)
        cut = "; * = a drain cut at MAX_SECS (the rate of what it received)" if any(not r.get("drained", True) for r in drains) else ""
        title = ("Queue receive-and-commit throughput: outbox.receive() against PgQ, a SKIP LOCKED table and the ceiling\n"
                 f"medians of {rounds} round{'s' if rounds > 1 else ''}; {a.note}{cut}")
        panels = [p.replace("{panel}", f"{q(name + '.dat')} index {i}") for i, p in enumerate(panels)]
        write(os.path.join(a.outdir, name + ".gp"), figure(name, max(600, 520 * len(panels)), 600, title, panels))
        out.append(run_gnuplot(a.outdir, name))

    lat = [r for r in res if r["kind"] == "latency" and r.get("from_commit_returned_ms")]
    if lat:
        name = "queue-latency"
        ps = ["p50", "p90", "p99"]
        how = {"outbox": "outbox.receive('q', 1, 5000), waiting",
               "hand": "SKIP LOCKED table, LISTEN/NOTIFY-woken",
               "pgq": f"PgQ, ticker {a.lat_tick_ms} ms, polling every {a.lat_poll_ms} ms"}
        lat_series = [(r["system"], how[r["system"]], COLOR[r["system"]]) for r in lat]
        values = [[r["from_commit_returned_ms"].get(p) for r in lat] for p in ps]
        labels = [["" if v is None else fmt_ms(v) for v in row] for row in values]
        rate = lat[0].get("producer", {}).get("achieved_rate")
        title = (f"Queue wake-up latency at {rate} msg/s: receive returned - the producer's COMMIT returned"
                 f"{chr(10)}one transaction per message; {a.note}")
        cmd, dat = clustered(ps, lat_series, values, labels, ylabel="milliseconds (log scale)",
                             xlabel="percentile over all messages of the run", logscale=True)
        write(os.path.join(a.outdir, name + ".dat"), "# queue_bench.sh: latency runs, ms\n" + dat)
        write(os.path.join(a.outdir, name + ".gp"), figure(name, 900, 560, title, [cmd.replace("{panel}", q(name + ".dat"))]))
        out.append(run_gnuplot(a.outdir, name))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("relay")
    r.add_argument("results")
    r.add_argument("outdir")
    r.add_argument("--configs", default="1:32 1:8 100:8 100:32")
    r.add_argument("--lat-lanes", default="8")
    r.add_argument("--lat-secs", default="20")
    r.add_argument("--note", default="")
    qp = sub.add_parser("queue")
    qp.add_argument("results")
    qp.add_argument("outdir")
    qp.add_argument("--systems", default="outbox pgq hand")
    qp.add_argument("--lat-tick-ms", default="10")
    qp.add_argument("--lat-poll-ms", default="10")
    qp.add_argument("--note", default="")
    a = p.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    svgs = relay(a) if a.cmd == "relay" else queue(a)
    for s in svgs:
        if s:
            print(s)
    return 0 if svgs and all(svgs) else 1


if __name__ == "__main__":
    sys.exit(main())
