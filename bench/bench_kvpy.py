"""bench_kvpy.py — the Python binding: store[key] and durable puts against py-lmdb

Run it as `bench/run kvpy` (which builds the package into a venv of
build-bench/, linked with a Release libnvheap.a, and runs this script there).

Cases (16-byte random keys, 100-byte values, --keys N keys loaded first):
  lookup/hit   v = store[k] for random present keys
               nvheap-sorted, nvheap-hash: store[k]
               lmdb:         txn.get(k) in one long read transaction (py-lmdb's
                             fastest lookup: no transaction per call)
               lmdb-txn:     with env.begin() as t: t.get(k) (a transaction per
                             lookup, as a single lookup is written)
  put/overwrite  durable overwrite of a random present key
               nvheap-*:     store[k] = v (durable on return)
               lmdb:         with env.begin(write=True) as t: t.put(k, v)
                             (one write transaction per put, default sync flags)
The ratio column is each subject's ns_per_op over lmdb's (the strict peer:
its fastest form) in the same run. Every measurement is repeated --runs
times (subjects interleaved, so drift hits all alike) and reported as
median, min and max. Stores live in --dir (default /dev/shm); nvheap runs in
its pmem domain unless NVHEAP_DOMAIN says otherwise (flushes are real CLWB/
CLFLUSHOPT; on tmpfs they reach the page cache only).

Options: --quick --json --json-out FILE --runs N --keys N --ops N --dir PATH
         --only SUBSTR
"""
import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

BENCH = "kvpy"
BASELINE = "lmdb"


def parse_args():
    p = argparse.ArgumentParser(prog="bench/run kvpy", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run (a few seconds)")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout")
    p.add_argument("--json-out", help="JSON lines also go to this file")
    p.add_argument("--runs", type=int, help="repetitions per measurement (default 5, quick 3)")
    p.add_argument("--keys", type=int, help="keys loaded (default 1000000, quick 20000)")
    p.add_argument("--ops", type=int, help="lookups per measurement (default 200000, quick "
                   "20000); puts are a tenth")
    p.add_argument("--dir", default=os.environ.get("NVHEAP_BENCH_DIR", "/dev/shm"),
                   help="scratch folder (default /dev/shm)")
    p.add_argument("--only", default="", help="cases whose name contains SUBSTR")
    a = p.parse_args()
    a.runs = a.runs or (3 if a.quick else 5)
    a.keys = a.keys or (20000 if a.quick else 1000000)
    a.ops = a.ops or (20000 if a.quick else 200000)
    return a


def load_nvheap(nvheap, path, engine, items):
    store = nvheap.open(path, engine=engine, size=max(256 << 20, len(items) * 600))
    for i in range(0, len(items), 1000):
        with store.batch() as b:
            for k, v in items[i:i + 1000]:
                b[k] = v
    return store


def load_lmdb(lmdb, path, items):
    env = lmdb.open(path, map_size=max(1 << 30, len(items) * 600))
    with env.begin(write=True) as t:
        for k, v in items:
            t.put(k, v)
    return env


def time_ns(fn):
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def main():
    a = parse_args()
    os.environ.setdefault("NVHEAP_DOMAIN", "pmem")
    import nvheap
    try:
        import lmdb
    except ImportError:
        sys.exit("bench_kvpy: py-lmdb is missing (apt-get install python3-lmdb, or pip "
                 "install lmdb; scripts/setup installs python3-lmdb)")

    rnd = random.Random(42)
    keys = list({rnd.getrandbits(128).to_bytes(16, "little") for _ in range(a.keys)})
    items = [(k, rnd.getrandbits(800).to_bytes(100, "little")) for k in keys]
    probe = [rnd.choice(keys) for _ in range(a.ops)]
    put_probe = probe[:max(1, a.ops // 10)]
    value = b"v" * 100

    scratch = tempfile.mkdtemp(prefix="bench-kvpy-", dir=a.dir)
    try:
        stores = {}
        for engine in ("sorted", "hash"):
            try:
                stores["nvheap-" + engine] = load_nvheap(
                    nvheap, os.path.join(scratch, engine + ".pool"), engine, items)
            except nvheap.NotSupportedError as e:
                print("# nvheap-%s skipped: %s" % (engine, e.message), file=sys.stderr)
        env = load_lmdb(lmdb, os.path.join(scratch, "lmdb"), items)

        def nvheap_lookup(s):
            def run():
                for k in probe:
                    s[k]
            return run

        def nvheap_put(s):
            def run():
                for k in put_probe:
                    s[k] = value
            return run

        def lmdb_lookup():
            with env.begin() as txn:
                for k in probe:
                    txn.get(k)

        def lmdb_txn_lookup():
            for k in probe:
                with env.begin() as t:
                    t.get(k)

        def lmdb_put():
            for k in put_probe:
                with env.begin(write=True) as t:
                    t.put(k, value)

        cases = [("lookup/hit", len(probe),
                  [(n, nvheap_lookup(s)) for n, s in stores.items()] +
                  [("lmdb", lmdb_lookup), ("lmdb-txn", lmdb_txn_lookup)]),
                 ("put/overwrite", len(put_probe),
                  [(n, nvheap_put(s)) for n, s in stores.items()] + [("lmdb", lmdb_put)])]
        # sanity: the stores agree
        for n, s in stores.items():
            assert s[probe[0]] == env.begin().get(probe[0]), n

        results = []
        for case, nops, subjects in cases:
            if a.only not in case:
                continue
            samples = {name: [] for name, _ in subjects}
            before = {n: s.stats() for n, s in stores.items()}
            for run in range(a.runs + 1):            # run 0 warms up
                order = subjects if run % 2 else subjects[::-1]
                for name, fn in order:
                    ns = time_ns(fn) / nops
                    if run:
                        samples[name].append(ns)
            base = statistics.median(samples[BASELINE]) if BASELINE in samples else None
            for name, _ in subjects:
                med = statistics.median(samples[name])
                row = {"case": case, "subject": name, "median": med,
                       "min": min(samples[name]), "max": max(samples[name]),
                       "ratio": med / base if base else None}
                if name in stores:
                    st = stores[name].stats()
                    done = nops * (a.runs + 1)
                    row["flushes_per_op"] = (st["flushes"] - before[name]["flushes"]) / done
                    row["fences_per_op"] = (st["fences"] - before[name]["fences"]) / done
                results.append(row)
        for s in stores.values():
            s.close()
        env.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    lines = []
    for r in results:
        for metric, unit, v in (("ns_per_op", "ns", r["median"]),
                                ("ratio_vs_lmdb", "x", r["ratio"]),
                                ("flushes_per_op", "lines", r.get("flushes_per_op")),
                                ("fences_per_op", "fences", r.get("fences_per_op"))):
            if v is None:
                continue
            lines.append(json.dumps({"bench": BENCH, "case": r["case"], "subject": r["subject"],
                                     "metric": metric, "value": round(v, 3), "unit": unit}))
    if a.json_out:
        with open(a.json_out, "a", encoding="utf-8") as f:
            f.write("".join(l + "\n" for l in lines))
    if a.json:
        print("\n".join(lines))
        return
    print("kvpy: %d keys of 16 B, values of 100 B, %d runs (median [min..max]), %s, "
          "NVHEAP_DOMAIN=%s, Python %s, py-lmdb %s"
          % (len(keys), a.runs, a.dir, os.environ["NVHEAP_DOMAIN"],
             sys.version.split()[0], lmdb.__version__))
    print("%-14s %-14s %10s %18s %14s %10s %10s" % ("case", "subject", "ns/op", "[min..max]",
                                                   "ratio vs lmdb", "flush/op", "fence/op"))
    for r in results:
        rng = "[%.0f..%.0f]" % (r["min"], r["max"])
        ratio = "%.2fx" % r["ratio"] if r["ratio"] is not None else "-"
        fl = "%.2f" % r["flushes_per_op"] if "flushes_per_op" in r else "-"
        fe = "%.2f" % r["fences_per_op"] if "fences_per_op" in r else "-"
        print("%-14s %-14s %10.0f %18s %14s %10s %10s"
              % (r["case"], r["subject"], r["median"], rng, ratio, fl, fe))


if __name__ == "__main__":
    main()
