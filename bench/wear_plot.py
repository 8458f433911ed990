#!/usr/bin/python3
"""wear_plot.py — draw bench_wear's histogram of writes per 64 B line ([Moraru11] Fig. 4).

    bench/wear_plot.py WEAR.png.jsonl -o WEAR.png

Input: JSON lines written by `bench/run wear --png WEAR.png`, one per subject:
{"subject": S, "ops": N, "total": T, "max": M, "hist": [[writes, lines], ...]}.
Left panel: how many lines received a number of writes in each bin (bins
are powers of two: 1, 2-3, 4-7, ...; log-log).
Right panel: the share of all writes that went to the most-written lines
(lines sorted by writes, descending): concentration of wear.
Uses Debian's python3-matplotlib, hence /usr/bin/python3.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    with open(args.data) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for row in rows:
        hist = sorted(row["hist"])
        label = "%s (total %s, max %d)" % (row["subject"], format(row["total"], ","), row["max"])
        edges = [1.0]
        while edges[-1] <= row["max"]:
            edges.append(edges[-1] * 2)
        counts = [0] * (len(edges) - 1)
        for w, n in hist:
            for i in range(len(counts)):
                if edges[i] <= w < edges[i + 1]:
                    counts[i] += n
                    break
        left.stairs(counts, edges, label=label, linewidth=1.5)
        # concentration: cumulative share of writes over lines sorted by writes
        desc = sorted(hist, reverse=True)
        lines_done, writes_done, xs, ys = 0, 0, [], []
        total_lines = sum(n for _, n in hist)
        for w, n in desc:
            lines_done += n
            writes_done += w * n
            xs.append(100.0 * lines_done / total_lines)
            ys.append(100.0 * writes_done / row["total"])
        right.plot(xs, ys, label=row["subject"])
    ops = rows[0]["ops"] if rows else 0
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("writes to a 64 B line")
    left.set_ylabel("number of lines (bins [2^k, 2^(k+1)))")
    left.set_title("Writes per 64 B line, %s random alloc/free ops" % format(ops, ","))
    left.legend(fontsize=8, loc="lower left")
    left.grid(True, which="both", alpha=0.3)
    right.set_xscale("log")
    right.set_xlabel("most-written lines (% of lines written)")
    right.set_ylabel("% of all writes")
    right.set_title("Concentration of writes")
    right.legend(fontsize=8)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
