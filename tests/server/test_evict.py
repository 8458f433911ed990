"""The -m limit: CLOCK eviction (recently read items survive), -M answers
SERVER_ERROR out of memory instead, and after a restart the background
index rebuild counts the earlier run's items so the limit still holds."""
import time

import pytest

from conftest import Server, nvcached_path

VAL = b"v" * 10000


def wait_rebuilt(c, timeout=20):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if c.stats()["nvheap_index_rebuilt"] == "1":
            return
        time.sleep(0.02)
    raise AssertionError("index not rebuilt")


@pytest.mark.parametrize("read", ["mg", "get"])
def test_eviction_at_limit_keeps_hot_items(tmpdir_nv, read):
    """Hot items read with mg (under the store lock) or get (lock-free: the
    reading thread queues its reference bits, eviction applies them),
    from a second connection (possibly another worker thread)."""
    s = Server(tmpdir_nv, args=["-m", "2"]).start()
    c = s.client()
    r = s.client()
    hot = ["hot%d" % i for i in range(20)]
    for k in hot:
        assert c.set(k, VAL) == b"STORED"
    for i in range(1000):
        assert c.set("cold%d" % i, VAL) == b"STORED"
        if i % 5 == 0:
            for k in hot:
                if read == "mg":
                    r.send("mg %s\r\n" % k)
                    r.line()
                else:
                    assert r.get(k) is not None
    st = c.stats()
    assert int(st["evictions"]) > 500
    assert int(st["bytes"]) <= 2 << 20
    assert 100 < int(st["curr_items"]) < 220
    assert sum(c.get(k) is not None for k in hot) >= 18
    assert c.get("cold999")[1] == VAL
    assert c.get("cold0") is None
    # an item larger than the whole limit
    assert c.req("set huge 0 0 1000000\r\n" + "h" * 1000000 + "\r\n") == b"STORED\r\n"
    s.stop()
    s = Server(tmpdir_nv, args=["-m", "1", "-I", "2m"], pool=s.pool).start()
    c = s.client()
    assert c.req("set huge 0 0 1500000\r\n" + "h" * 1500000 + "\r\n") == \
        b"SERVER_ERROR object too large for cache\r\n"
    assert c.get("cold999")[1] == VAL
    s.stop()


def test_no_evict_answers_out_of_memory(tmpdir_nv):
    s = Server(tmpdir_nv, args=["-m", "1", "-M"]).start()
    c = s.client()
    replies = [c.set("k%d" % i, VAL) for i in range(200)]
    n = replies.index(b"SERVER_ERROR out of memory storing object")
    assert 80 < n < 110 and all(r == b"STORED" for r in replies[:n])
    assert c.get("k0")[1] == VAL and c.get("k%d" % (n - 1))[1] == VAL
    st = c.stats()
    assert int(st["evictions"]) == 0 and int(st["store_no_memory"]) > 0
    assert c.req("delete k0\r\n") == b"DELETED\r\n"
    assert c.set("again", VAL) == b"STORED"      # room again after a delete
    s.stop()


def test_restart_rebuilds_index_and_keeps_limit(tmpdir_nv):
    s = Server(tmpdir_nv, args=["-m", "2"]).start()
    c = s.client()
    for i in range(150):
        c.set("old%d" % i, VAL)
    before = c.stats()
    s.kill9()
    s.start()
    c = s.client()
    assert c.get("old149")[1] == VAL                   # served before the rebuild is needed
    st = c.stats()
    assert st["nvheap_index_rebuilt"] == "0"           # no scan on the way to serving
    assert st["bytes"] == before["bytes"]              # the hint, exact after SIGKILL
    assert c.set("trigger", "x") == b"STORED"          # over half the limit: rebuild starts
    wait_rebuilt(c)
    st = c.stats()
    assert int(st["curr_items"]) == int(before["curr_items"]) + 1
    for i in range(300):
        assert c.set("new%d" % i, VAL) == b"STORED"
    st = c.stats()
    assert int(st["bytes"]) <= 2 << 20 and int(st["evictions"]) > 100
    assert c.get("new299")[1] == VAL
    assert sum(c.get("old%d" % i) is not None for i in range(150)) < 30
    s.stop()


def test_restart_under_half_the_limit_never_scans(tmpdir_nv):
    s = Server(tmpdir_nv, args=["-m", "64"]).start()
    c = s.client()
    for i in range(100):
        c.set("k%d" % i, VAL)
    s.kill9()
    s.start()
    c = s.client()
    for i in range(50):
        assert c.set("n%d" % i, VAL) == b"STORED"
    st = c.stats()
    assert st["nvheap_index_rebuilt"] == "0" and int(st["curr_items"]) == 150
    assert int(st["bytes"]) >= 150 * 10000
    s.stop()


def minflt(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.parametrize("populate", [True, False])
def test_pool_space_is_populated(tmpdir_nv, populate):
    """Items filling fresh pool space take no page fault per 4 KiB of data:
    the pool is opened with NVH_POOL_POPULATE (unless --no-populate), so the
    space the allocator claims is faulted in 2 MiB at a time."""
    with open(nvcached_path(), "rb") as f:
        image = f.read()
    if b"__tsan_init" in image or b"__asan_init" in image:
        pytest.skip("a sanitizer's shadow memory takes page faults of its own")
    args = ["-m", "512", "-t", "1"] + ([] if populate else ["--no-populate"])
    s = Server(tmpdir_nv, args=args).start()
    c = s.client()
    val = b"p" * 4096
    for i in range(50):                  # warm up the connection's buffers
        assert c.set("warm%d" % i, val) == b"STORED"
    before = minflt(s.proc.pid)
    n = 2000                             # 16 MB of pool: fresh chunks
    for i in range(n):
        assert c.set("k%d" % i, val) == b"STORED"
    faults = minflt(s.proc.pid) - before
    if populate:
        assert faults < n // 4, faults
    else:
        # the check has teeth: an item (4 KiB value + header, a 4352 B slot
        # of a 16-block run) takes about a page, and each page faults
        assert faults >= n // 2, faults
    s.stop()
