"""test_crash.py — kill -9 through Python.

A child process writes (single puts, or batches) and prints each write's
number once the call has returned, i.e. once the write is acknowledged. The
parent reads those lines, SIGKILLs the child at a random point of its run,
reads what the child printed before it died, reopens the store and checks:
every acknowledged write is there with its whole value; the write in
flight is all or nothing; nothing later exists. Each test does several
kill/reopen rounds, the next child continuing where the last one died, so
it also covers writing after recovery.
"""
import os
import random
import signal
import subprocess
import sys

import nvheap

CHILD = r"""
import sys, nvheap
path, engine, mode, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
batch_size = int(sys.argv[5])

def value(i, j=0):
    # 40..2000 bytes: a torn or mixed-up value cannot pass for a whole one
    return (b"<%d.%d>" % (i, j)) * (5 + (i * 7 + j) % 180)

s = nvheap.open(path, engine=engine)
out = sys.stdout
i = start
while True:
    if mode == "put":
        s[b"key-%08d" % i] = value(i)
    else:
        with s.batch() as b:
            for j in range(batch_size):
                b[b"b%08d-%03d" % (i, j)] = value(i, j)
            b[b"last"] = b"%d" % i
    out.write("%d\n" % i)
    out.flush()
    i += 1
"""


def value(i, j=0):
    return (b"<%d.%d>" % (i, j)) * (5 + (i * 7 + j) % 180)


def run_and_kill(path, engine, mode, start, acks_before_kill, batch_size=0):
    """Start a writer, SIGKILL it once it acknowledged acks_before_kill writes;
    return the numbers it acknowledged (including those printed just before
    it died)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, engine, mode, str(start), str(batch_size)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acked = []
    try:
        for line in child.stdout:
            acked.append(int(line))
            if len(acked) >= acks_before_kill:
                os.kill(child.pid, signal.SIGKILL)
                break
        acked += [int(line) for line in child.stdout]     # printed before it died
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        err = child.stderr.read().decode(errors="replace")
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, "writer ended by itself:\n" + err
    assert acked == list(range(start, start + len(acked)))
    return acked


def test_kill9_puts(pool_path, engine):
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    nvheap.open(pool_path, engine=engine).close()
    next_i = 0
    for _ in range(3):
        acked = run_and_kill(pool_path, engine, "put", next_i, rnd.randrange(200, 1500))
        last = acked[-1]
        with nvheap.open(pool_path, create=False) as s:
            s.check()
            for i in range(last + 1):
                assert s[b"key-%08d" % i] == value(i), "acknowledged put %d lost" % i
            # the put in flight: all or nothing
            inflight = s.get(b"key-%08d" % (last + 1))
            assert inflight in (None, value(last + 1))
            assert b"key-%08d" % (last + 2) not in s
            n = last + 1 + (inflight is not None)
            assert len(s) == n
            if engine == "sorted":
                assert list(s.keys()) == [b"key-%08d" % i for i in range(n)]
        next_i = n


def test_kill9_batches(pool_path, engine):
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    batch_size = 50
    nvheap.open(pool_path, engine=engine).close()
    next_i = 0
    for _ in range(3):
        acked = run_and_kill(pool_path, engine, "batch", next_i, rnd.randrange(20, 120),
                             batch_size)
        last = acked[-1]
        with nvheap.open(pool_path, create=False) as s:
            s.check()
            for i in range(last + 1):
                for j in range(batch_size):
                    assert s[b"b%08d-%03d" % (i, j)] == value(i, j), \
                        "acknowledged batch %d lost key %d" % (i, j)
            # the batch in flight: all of it or none of it
            present = [s.get(b"b%08d-%03d" % (last + 1, j)) for j in range(batch_size)]
            whole = present == [value(last + 1, j) for j in range(batch_size)]
            assert whole or present == [None] * batch_size, \
                "batch %d half applied: %d of %d keys" % (
                    last + 1, sum(p is not None for p in present), batch_size)
            assert s[b"last"] == b"%d" % (last + 1 if whole else last)
            assert b"b%08d-000" % (last + 2) not in s
            n = last + 1 + whole
            assert len(s) == n * batch_size + 1
        next_i = n
