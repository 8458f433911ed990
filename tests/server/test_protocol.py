"""Every text and meta command of nvcached, its replies, expiry, restart
with items intact, CAS values increasing across restarts, the generation,
graceful stop, and memccapable's text tests."""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import Client, Server


def test_set_get_gets_and_noreply(server):
    c = server.client()
    assert c.req("set a 5 0 3\r\nabc\r\nget a\r\n") == b"STORED\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"
    assert c.req("set b 4294967295 0 0 noreply\r\n\r\nget b nope a\r\n") == \
        b"VALUE b 4294967295 0\r\n\r\nVALUE a 5 3\r\nabc\r\nEND\r\n"
    out = c.req("gets a\r\n")
    m = re.match(rb"VALUE a 5 3 (\d+)\r\nabc\r\nEND\r\n$", out)
    assert m and int(m.group(1)) > 0
    assert c.req("get nope\r\n") == b"END\r\n"
    # binary-safe data, 1 MiB default item limit
    blob = bytes(range(256)) * 4096
    assert c.set("blob", blob) == b"STORED"
    assert c.get("blob")[1] == blob


def test_add_replace_append_prepend(server):
    c = server.client()
    assert c.req("add k 1 0 1\r\nx\r\nadd k 1 0 1\r\ny\r\n") == b"STORED\r\nNOT_STORED\r\n"
    assert c.req("replace nope 0 0 1\r\nx\r\nreplace k 7 0 2\r\nyy\r\n") == b"NOT_STORED\r\nSTORED\r\n"
    assert c.req("append k 0 0 2\r\n>>\r\nprepend k 0 0 2\r\n<<\r\n") == b"STORED\r\nSTORED\r\n"
    assert c.req("get k\r\n") == b"VALUE k 7 6\r\n<<yy>>\r\nEND\r\n"   # flags kept
    assert c.req("append nope 0 0 1\r\nx\r\nprepend nope 0 0 1\r\nx\r\n") == \
        b"NOT_STORED\r\nNOT_STORED\r\n"
    assert c.req("add k 0 0 1 noreply\r\nz\r\nappend k 0 0 1 noreply\r\n!\r\nget k\r\n") == \
        b"VALUE k 7 7\r\n<<yy>>!\r\nEND\r\n"


def test_cas(server):
    c = server.client()
    assert c.req("cas nope 0 0 1 5\r\nx\r\n") == b"NOT_FOUND\r\n"
    c.set("k", "v1")
    cas = c.get("k")[2]
    assert c.req("cas k 0 0 2 %d\r\nv2\r\n" % (cas + 1)) == b"EXISTS\r\n"
    assert c.req("cas k 3 0 2 %d\r\nv2\r\n" % cas) == b"STORED\r\n"
    f, v, cas2 = c.get("k")
    assert (f, v) == (3, b"v2") and cas2 > cas
    assert c.req("cas k 0 0 2 %d\r\nv3\r\n" % cas) == b"EXISTS\r\n"
    assert c.req("cas k 0 0 2 %d noreply\r\nv4\r\nget k\r\n" % cas2) == b"VALUE k 0 2\r\nv4\r\nEND\r\n"
    # every store gets a new, larger CAS
    seen = [c.get("k")[2]]
    for i in range(20):
        c.set("k", str(i))
        seen.append(c.get("k")[2])
    assert seen == sorted(set(seen))


def test_incr_decr(server):
    c = server.client()
    assert c.req("incr nope 1\r\ndecr nope 1\r\n") == b"NOT_FOUND\r\nNOT_FOUND\r\n"
    c.set("n", "10")
    assert c.req("incr n 5\r\ndecr n 20\r\nget n\r\n") == b"15\r\n0\r\nVALUE n 0 2\r\n0 \r\nEND\r\n"
    c.set("n", "18446744073709551615")
    assert c.req("incr n 2\r\n") == b"1\r\n"           # wraps at 2^64
    assert c.req("decr n 1\r\ndecr n 1\r\n") == b"0\r\n0\r\n"   # floors at 0
    c.set("s", "abc")
    assert c.req("incr s 1\r\n") == b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    assert c.req("incr n x\r\nincr n -1\r\n") == b"CLIENT_ERROR invalid numeric delta argument\r\n" * 2
    assert c.req("incr n 7 noreply\r\nget n\r\n") == b"VALUE n 0 20\r\n7                   \r\nEND\r\n"


def test_touch_gat_gats_and_expiry(server):
    c = server.client()
    c.set("t", "v", exptime=100)
    assert c.req("touch t 1\r\ntouch nope 1\r\n") == b"TOUCHED\r\nNOT_FOUND\r\n"
    assert c.req("touch t x\r\n") == b"CLIENT_ERROR invalid exptime argument\r\n"
    c.set("g", "gv", flags=9)
    cas = c.get("g")[2]
    assert c.req("gat 1 g nope\r\n") == b"VALUE g 9 2\r\ngv\r\nEND\r\n"
    assert c.req("gats 1 g\r\n") == b"VALUE g 9 2 %d\r\ngv\r\nEND\r\n" % cas   # touch keeps CAS
    assert c.req("gat x g\r\n") == b"CLIENT_ERROR invalid exptime argument\r\n"
    c.set("neg", "v", exptime=-1)
    c.set("abs_past", "v", exptime=int(time.time()) - 10)   # absolute, in the past
    c.set("abs_future", "v", exptime=int(time.time()) + 100)
    c.set("keep", "v")
    assert c.get("neg") is None and c.get("abs_past") is None
    assert c.get("abs_future") is not None
    time.sleep(2.2)
    assert c.get("t") is None and c.get("g") is None
    assert c.get("keep") is not None
    assert c.req("touch t 10\r\ndelete t\r\n") == b"NOT_FOUND\r\nNOT_FOUND\r\n"


def test_delete(server):
    c = server.client()
    c.set("d", "v")
    assert c.req("delete d\r\ndelete d\r\n") == b"DELETED\r\nNOT_FOUND\r\n"
    c.set("d", "v")
    assert c.req("delete d 0\r\ndelete d 0 noreply\r\n") == b"DELETED\r\n"
    assert c.req("delete d 5\r\n") == \
        b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
    assert c.req("delete\r\n") == b"ERROR\r\n"


def test_flush_all(server):
    c = server.client()
    c.set("a", "1")
    c.set("b", "2")
    assert c.req("flush_all\r\nget a b\r\n") == b"OK\r\nEND\r\n"
    c.set("a", "after")                       # same second: survives
    assert c.get("a")[1] == b"after"
    assert c.req("flush_all 2\r\n") == b"OK\r\n"
    assert c.get("a")[1] == b"after"
    time.sleep(3.1)
    assert c.get("a") is None
    c.set("c", "3")
    assert c.req("flush_all noreply\r\nget c\r\n") == b"END\r\n"
    assert c.req("flush_all x\r\n") == b"CLIENT_ERROR invalid exptime argument\r\n"


def test_misc_commands(server):
    c = server.client()
    assert c.req("version\r\n").startswith(b"VERSION 1.6.18")
    assert c.req("verbosity 1\r\nverbosity 0 noreply\r\n") == b"OK\r\n"
    assert c.req("bogus\r\n\r\nGET a\r\n") == b"ERROR\r\n" * 3
    assert c.req("shutdown\r\n") == b"ERROR: shutdown not enabled\r\n"
    st = c.stats()
    for k in ("pid", "uptime", "curr_items", "bytes", "limit_maxbytes", "evictions", "cmd_get",
              "get_hits", "threads", "generation", "nvheap_pool", "nvheap_epoch",
              "nvheap_fences_per_change", "nvheap_recovery_us", "total_items"):
        assert k in st, k
    assert st["limit_maxbytes"] == str(64 << 20)
    assert "item_size_max" in c.stats("settings")
    c.set("x", "y")
    assert c.stats("items")["items:1:number"] == "1"
    assert "total_malloced" in c.stats("slabs")
    assert c.req("stats reset\r\nstats nope\r\n") == b"RESET\r\nERROR\r\n"
    c.send("quit\r\n")
    assert c.read_all() == b""


def test_meta_get_set_delete(server):
    c = server.client()
    assert c.req("ms m 2 F5 T0\r\nhi\r\n") == b"HD\r\n"
    out = c.req("mg m s v f t k O9 c\r\n")
    cas = int(re.search(rb" c(\d+)", out).group(1))
    assert out == b"VA 2 s2 f5 t-1 km O9 c%d\r\nhi\r\n" % cas
    assert c.req("mg m\r\nmg nope v\r\nmg nope v q\r\n") == b"HD\r\nEN\r\n"
    assert c.req("ms m 2 C%d c\r\nho\r\n" % (cas + 1)) == b"EX c0\r\n"
    out = c.req("ms m 2 C%d c q\r\nho\r\nmg m v c\r\n" % cas)
    m = re.match(rb"VA 2 c(\d+)\r\nho\r\n$", out)
    assert m and int(m.group(1)) > cas
    assert c.req("ms m 1 MA\r\n!\r\nms m 1 MP\r\n<\r\nmg m v\r\n") == b"HD\r\nHD\r\nVA 4\r\n<ho!\r\n"
    assert c.req("ms m 1 ME\r\nx\r\nms new 1 MR\r\nx\r\nms new 1 ME\r\ny\r\n") == b"NS\r\nNS\r\nHD\r\n"
    assert c.req("ms nf 1 C5\r\nx\r\n") == b"NF\r\n"
    assert c.req("ms m 1 MX\r\nx\r\n") == b"CLIENT_ERROR invalid mode for ms M token\r\n"
    # touch through mg T, then t shows the new TTL
    assert c.req("mg m T100 t\r\n") in (b"HD t100\r\n", b"HD t99\r\n")
    assert c.req("md m q\r\nmd m\r\nmd m O1 k\r\n") == b"NF\r\nNF O1 km\r\n"
    c.set("m", "v")
    cas = c.get("m")[2]
    assert c.req("md m C%d\r\nmd m C%d\r\n" % (cas + 1, cas)) == b"EX\r\nHD\r\n"
    c.send("mn\r\n")
    assert c.line() == b"MN\r\n"
    # vivify on miss: the first client wins, the next ones see Z
    assert c.req("mg viv v N30\r\nmg viv v N30\r\n") == b"VA 0 W\r\n\r\nVA 0 Z\r\n\r\n"
    assert c.req("ms viv 1\r\nx\r\nmg viv v\r\n") == b"HD\r\nVA 1\r\nx\r\n"


def test_meta_arith_debug_and_errors(server):
    c = server.client()
    assert c.req("ma n\r\nma n q\r\n") == b"NF\r\nNF\r\n"
    assert c.req("ma n N0 J5 v\r\nma n v\r\nma n MD D10 v\r\nma n q\r\n") == \
        b"VA 1\r\n5\r\nVA 1\r\n6\r\nVA 1\r\n0\r\n"
    out = c.req("ma n c t k\r\n")
    assert re.match(rb"HD c\d+ t-1 kn\r\n$", out)
    assert c.req("ma n MX\r\n") == b"CLIENT_ERROR invalid mode for ma M token\r\n"
    c.set("s", "abc")
    assert c.req("ma s\r\n") == b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
    assert re.match(rb"ME n exp=-1 la=0 cas=\d+ fetch=no cls=1 size=\d+\r\n$", c.req("me n\r\n"))
    assert c.req("me nope\r\n") == b"EN\r\n"
    assert c.req("mg\r\nmg k zz\r\nmg k v v\r\nms k\r\nms k abc\r\n") == (
        b"ERROR\r\nCLIENT_ERROR invalid flag\r\nCLIENT_ERROR duplicate flag\r\n"
        b"CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n")
    # flags memcached has and nvcached does not implement are refused, named
    for cmd in ("mg k b", "mg k h", "mg k l", "mg k R30", "md k I", "ms k 1 I\r\nx"):
        out = c.req(cmd + "\r\n")
        assert out.startswith(b"CLIENT_ERROR unsupported flag"), (cmd, out)


def test_restart_keeps_items_cas_and_generation(tmpdir_nv):
    s = Server(tmpdir_nv).start()
    c = s.client()
    g1 = int(c.stats()["generation"])
    for i in range(200):
        c.set("k%d" % i, "v%d" % i, flags=i, exptime=0 if i % 2 else 1000)
    c.set("short", "v", exptime=1)
    maxcas = max(c.get("k%d" % i)[2] for i in range(200))
    assert s.stop() == 0                               # SIGTERM: a clean stop
    time.sleep(1.1)
    s.start()
    c = s.client()
    st = c.stats()
    assert int(st["generation"]) == g1 + 1
    for i in range(200):
        f, v, cas = c.get("k%d" % i)
        assert (f, v) == (i, b"v%d" % i)
    assert c.get("short") is None                      # expired while down
    c.set("new", "x")
    assert c.get("new")[2] > maxcas
    s.kill9()
    s.start()
    c = s.client()
    assert int(c.stats()["generation"]) == g1 + 2
    assert c.get("k7")[1] == b"v7"
    c.set("newer", "x")
    assert c.get("newer")[2] > maxcas
    # an immediate flush_all is durable too
    assert c.req("flush_all\r\n") == b"OK\r\n"
    s.kill9()
    s.start()
    c = s.client()
    assert c.get("k7") is None and c.get("newer") is None
    s.stop()


def test_options(tmpdir_nv):
    from conftest import nvcached_path
    out = subprocess.run([nvcached_path(), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--pool" in out.stdout and "-M" in out.stdout
    out = subprocess.run([nvcached_path(), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("nvcached ")
    for bad in (["-p", "x"], ["-m", "0"], ["-t", "0"], ["-I", "10"], ["--domain", "nope"], ["zz"]):
        out = subprocess.run([nvcached_path()] + bad, capture_output=True, text=True)
        assert out.returncode == 2, bad
    # -I: larger items, -t 1
    s = Server(tmpdir_nv, args=["-I", "2m", "-t", "1", "-m", "16"]).start()
    c = s.client()
    assert c.set("big", b"x" * (1536 << 10)) == b"STORED"
    assert c.stats("settings")["item_size_max"] == str(2 << 20)
    s.stop()
    # a pool of another program is refused with a message
    other = os.path.join(tmpdir_nv, "other.pool")
    with open(other, "wb") as f:
        f.write(b"not a pool" * 1000)
    out = subprocess.run([nvcached_path(), "--pool", other, "-p", "0"], capture_output=True,
                         text=True, timeout=20)
    assert out.returncode == 1 and "other.pool" in out.stderr


def worker_conns(s, total):
    """Connections per worker once `total` are open (this one included:
    the server sees earlier closes asynchronously)."""
    for _ in range(100):
        c = s.client()
        n = [int(x) for x in c.stats()["worker_conns"].split(",")]
        c.close()
        if sum(n) == total:
            break
        time.sleep(0.05)
    return n


def test_connections_dealt_evenly(tmpdir_nv):
    """A burst of connects is spread over the workers (max - min <= 1), and
    so are new connections after some closed: the main thread deals each to
    the worker with the fewest."""
    s = Server(tmpdir_nv, args=["-t", "4"]).start()
    time.sleep(0.2)                               # the start-up probe's close
    conns = [s.client() for _ in range(40)]       # all connect before any sends
    for c in conns:
        assert c.req("version\r\n").startswith(b"VERSION")
    n = worker_conns(s, 41)                       # the stats connection included
    assert len(n) == 4 and sum(n) == 41 and max(n) - min(n) <= 1, n
    gone = sorted(set(range(0, 20, 3)) | set(range(1, 20, 7)))
    for i in gone:                                # closes unevenly over the workers
        conns[i].close()
    closed = len(gone)
    worker_conns(s, 41 - closed)
    more = [s.client() for _ in range(closed + 8)]
    for c in more:
        assert c.req("version\r\n").startswith(b"VERSION")
    n = worker_conns(s, 41 + 8)
    assert sum(n) == 41 + 8 and max(n) - min(n) <= 1, n
    s.stop()


def test_memccapable(server):
    exe = shutil.which("memccapable")
    if not exe:
        pytest.skip("memccapable not installed (libmemcached-tools)")
    out = subprocess.run([exe, "-a", "-h", "127.0.0.1", "-p", str(server.port)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[FAIL]" not in out.stdout
