#!/usr/bin/python3
"""combine.py — the median of several benchmark invocations, as JSON or Markdown.

Each bench_* program already reports the median of its --runs repetitions;
on a shared, noisy machine it is worth running the whole program a few times
and taking the median across invocations too:

    for i in 1 2 3; do bench/run persist --json > /tmp/persist-$i.jsonl; done
    bench/combine.py /tmp/persist-*.jsonl > persist.jsonl        # JSON lines again
    bench/combine.py /tmp/persist-*.jsonl --markdown --baseline pmdk \\
        --metrics ns_per_op,ns_per_line,lines_per_op,fences_per_op

JSON output has the same fields as the inputs (value = median over the files
that have the result). Markdown output has one row per (case, subject), the
chosen metrics as columns, the min..max of the first metric across files, and
the ratio of the first metric to the baseline subject's in the same case.
"""
import argparse
import json
import statistics
import sys


def load(paths):
    """{(bench, case, subject, metric): [values...]}, unit per metric, order."""
    values, units, order = {}, {}, []
    for path in paths:
        with open(path, encoding="utf-8") as stream:
            for number, line in enumerate(stream, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    item = json.loads(line)
                    key = (item["bench"], item["case"], item["subject"], item["metric"])
                    value = float(item["value"])
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                    sys.exit(f"combine.py: {path}:{number}: not a result line ({err})")
                if key not in values:
                    values[key] = []
                    order.append(key)
                values[key].append(value)
                units[key] = item.get("unit", "")
    return values, units, order


def fmt(value):
    magnitude = abs(value)
    if value == int(value) or magnitude >= 1000:
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def markdown(values, order, metrics, baseline):
    rows = list(dict.fromkeys((b, c, s) for b, c, s, _ in order))
    groups = list(dict.fromkeys((b, c.partition("/")[0]) for b, c, _ in rows))
    rows.sort(key=lambda r: groups.index((r[0], r[1].partition("/")[0])))
    if not metrics:
        metrics = list(dict.fromkeys(m for _, _, _, m in order))
    first = metrics[0]
    header = ["case", "subject"] + metrics + [f"{first} min..max"]
    if baseline:
        header.append(f"ratio vs {baseline}")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    for bench, case, subject in rows:
        cells = [case, subject]
        for metric in metrics:
            got = values.get((bench, case, subject, metric))
            cells.append(fmt(statistics.median(got)) if got else "-")
        got = values.get((bench, case, subject, first))
        cells.append(f"{fmt(min(got))}..{fmt(max(got))}" if got and len(got) > 1 else "")
        if baseline:
            base = values.get((bench, case, baseline, first))
            if got and base and statistics.median(base) != 0:
                cells.append(f"{statistics.median(got) / statistics.median(base):.2f}")
            else:
                cells.append("-")
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description="Median of several benchmark JSON-lines files.")
    parser.add_argument("files", nargs="+", help="JSON-lines files, one per invocation")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--metrics", help="comma-separated metric columns (Markdown)")
    parser.add_argument("--baseline", help="subject for the ratio column (Markdown)")
    args = parser.parse_args()
    values, units, order = load(args.files)
    if args.markdown:
        metrics = args.metrics.split(",") if args.metrics else []
        markdown(values, order, metrics, args.baseline)
        return
    for key in order:
        bench, case, subject, metric = key
        print(json.dumps({"bench": bench, "case": case, "subject": subject, "metric": metric,
                          "value": round(statistics.median(values[key]), 6),
                          "unit": units[key]}))


if __name__ == "__main__":
    main()
