#!/usr/bin/python3
"""plot.py — render benchmark JSON lines as PNG bar or line charts.

Reads the JSON lines the bench_* programs print with --json (or write with
--json-out), from files or stdin, and draws one panel per benchmark and case
group: a case "GROUP/VARIANT" is one x position VARIANT in panel GROUP, with
one bar per subject (nvheap, pmdk, ...). When every VARIANT of a group is a
number (threads, sizes) the panel is a line chart with one line per subject.
Value ranges wider than 100x get a log scale.

    bench/run persist --json > persist.jsonl
    bench/plot.py persist.jsonl -o persist.png            # one PNG, a panel per group
    bench/plot.py persist.jsonl -o persist.png --split    # persist-GROUP.png each
    bench/plot.py persist.jsonl -o lines.png --metric ns_per_line
    bench/run persist --plot persist.png                  # run, then plot (same thing)

Shebang is Debian's /usr/bin/python3, which has python3-matplotlib.
"""
import argparse
import json
import math
import os
import sys

# Metrics to plot when --metric is not given (the first one a group has).
PREFERRED_METRICS = ("ns_per_op", "ops_per_s", "us_per_op", "ms_per_op", "bytes_per_op")


def read_results(paths):
    """Parse JSON result lines; blank lines and '#' comments are skipped."""
    results = []
    for path in paths or ["-"]:
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
        with stream:
            for number, line in enumerate(stream, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as err:
                    sys.exit(f"plot.py: {path}:{number}: not JSON ({err})")
                missing = {"bench", "case", "subject", "metric", "value"} - item.keys()
                if missing:
                    sys.exit(f"plot.py: {path}:{number}: missing {', '.join(sorted(missing))}")
                results.append(item)
    return results


def split_case(case):
    group, _, variant = case.partition("/")
    return group, variant or group


def as_number(text):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def build_panels(results, wanted_metric):
    """[(bench, group, metric, unit, variants, subjects, {(variant, subject): value})]"""
    order = []
    by_group = {}
    for item in results:
        group, _ = split_case(item["case"])
        key = (item["bench"], group)
        if key not in by_group:
            by_group[key] = []
            order.append(key)
        by_group[key].append(item)
    panels = []
    for bench, group in order:
        items = by_group[(bench, group)]
        metrics = list(dict.fromkeys(i["metric"] for i in items))
        if wanted_metric:
            if wanted_metric not in metrics:
                continue
            metric = wanted_metric
        else:
            metric = next((m for m in PREFERRED_METRICS if m in metrics), metrics[0])
        chosen = [i for i in items if i["metric"] == metric]
        variants = list(dict.fromkeys(split_case(i["case"])[1] for i in chosen))
        subjects = list(dict.fromkeys(i["subject"] for i in chosen))
        values = {(split_case(i["case"])[1], i["subject"]): float(i["value"]) for i in chosen}
        unit = chosen[0].get("unit", "")
        panels.append((bench, group, metric, unit, variants, subjects, values))
    return panels


def fmt(value):
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.3g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def draw_panel(ax, panel):
    bench, group, metric, unit, variants, subjects, values = panel
    present = [v for v in values.values() if v > 0]
    log = bool(present) and max(present) / min(present) > 100
    numeric = [as_number(v) for v in variants]
    if all(x is not None for x in numeric) and len(variants) > 1:
        for subject in subjects:
            points = sorted((x, values[(v, subject)]) for v, x in zip(variants, numeric)
                            if (v, subject) in values)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=subject)
        ax.set_xlabel(group)
    else:
        width = 0.8 / max(len(subjects), 1)
        for s, subject in enumerate(subjects):
            xs, ys = [], []
            for x, variant in enumerate(variants):
                if (variant, subject) in values:
                    xs.append(x - 0.4 + width * (s + 0.5))
                    ys.append(values[(variant, subject)])
            bars = ax.bar(xs, ys, width, label=subject)
            ax.bar_label(bars, labels=[fmt(y) for y in ys], fontsize=6, rotation=90,
                         padding=2)
        ax.set_xticks(range(len(variants)))
        ax.set_xticklabels(variants, rotation=30, ha="right", fontsize=8)
        ax.margins(y=0.25)
    if log:
        ax.set_yscale("log")
    ax.set_title(f"{bench}: {group}", fontsize=10)
    ax.set_ylabel(f"{metric} ({unit})" if unit else metric, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)


def main():
    parser = argparse.ArgumentParser(description="Plot benchmark JSON lines as PNG.")
    parser.add_argument("files", nargs="*", help="JSON-lines files (default: stdin)")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--metric", help="metric to plot (default: ns_per_op or the first)")
    parser.add_argument("--split", action="store_true",
                        help="one PNG per group: OUTPUT-GROUP.png")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: needs matplotlib (apt-get install python3-matplotlib)")

    panels = build_panels(read_results(args.files), args.metric)
    if not panels:
        sys.exit("plot.py: nothing to plot" + (f" for metric {args.metric}" if args.metric else ""))
    base, ext = os.path.splitext(args.output)
    written = []
    if args.split:
        for panel in panels:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            draw_panel(ax, panel)
            fig.tight_layout()
            several_benches = len({p[0] for p in panels}) > 1
            label = f"{panel[0]}-{panel[1]}" if several_benches else panel[1]
            name = f"{base}-{label}{ext or '.png'}"
            fig.savefig(name, dpi=120)
            plt.close(fig)
            written.append(name)
    else:
        cols = 1 if len(panels) == 1 else 2
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.5 * rows), squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            draw_panel(ax, panel)
        for ax in list(axes.flat)[len(panels):]:
            ax.set_visible(False)
        fig.tight_layout()
        fig.savefig(args.output, dpi=110)
        plt.close(fig)
        written.append(args.output)
    for name in written:
        print(f"plot.py: wrote {name}")


if __name__ == "__main__":
    main()
