"""Bad input: the server answers ERROR / CLIENT_ERROR or closes the
connection as memcached does, never crashes, never corrupts an item, keeps
memory bounded, and serves the next client."""
import os
import random
import resource
import socket
import time

import pytest

from conftest import Client, Server


def healthy(server):
    assert server.alive()
    c = server.client()
    assert c.req("set health 0 0 2\r\nok\r\nget health\r\n") == \
        b"STORED\r\nVALUE health 0 2\r\nok\r\nEND\r\n"
    c.close()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


def test_line_too_long_closes(server):
    c = server.client()
    c.send(b"set " + b"k" * 3000)                # no newline: over the limit
    assert c.read_all() == b"CLIENT_ERROR line too long\r\n"
    c = server.client()
    c.send(b"bogus " + b"a" * 3000 + b"\r\n")
    assert c.read_all() == b"CLIENT_ERROR line too long\r\n"
    # a long multi-get is fine (memcached allows those too)
    c = server.client()
    keys = " ".join("key%05d" % i for i in range(2000))
    assert c.req("get " + keys + "\r\n") == b"END\r\n"
    healthy(server)


def test_binary_protocol_magic(server):
    c = server.client()
    c.send(bytes([0x80, 0x0a, 0, 0]) + b"\0" * 20)
    assert c.read_all() == b"CLIENT_ERROR binary protocol not supported\r\n"
    healthy(server)


def test_bad_numbers_and_lengths(server):
    c = server.client()
    c.set("keep", "safe")
    for line in ("set k 0 0 -5", "set k 0 0 99999999999", "set k x 0 1", "set k 0 x 1",
                 "set k 0 0 1x", "cas k 0 0 1 -1", "incr keep 99999999999999999999",
                 "touch keep 99999999999", "gat 1x keep"):
        out = c.req(line + "\r\n")
        assert out.startswith(b"CLIENT_ERROR") or out == b"ERROR\r\n", (line, out)
    # too large: refused, the data block is swallowed, the connection goes on
    assert c.req("set keep 0 0 %d\r\n" % (2 << 20) + "z" * (2 << 20) + "\r\nget keep\r\n") == \
        b"SERVER_ERROR object too large for cache\r\nEND\r\n"   # a failed set drops the old value
    c.set("keep", "safe")
    # a data block that is not followed by \r\n
    assert c.req("set keep 0 0 2\r\nabcd\r\n") == b"CLIENT_ERROR bad data chunk\r\nERROR\r\n"
    assert c.get("keep")[1] == b"safe"
    healthy(server)


def test_truncated_blocks_and_vanishing_clients(server):
    c = server.client()
    c.set("t", "old")
    for payload in (b"set t 0 0 100\r\nabc", b"set t 0 0 5\r\nabcde", b"get t t t",
                    b"ms t 10\r\n12345", b"get " + b"t " * 500 + b"\r\n" * 0):
        v = server.client()
        v.send(payload)
        v.close()                                 # and vanish
    # a client that pipelines a lot of requests and closes without reading
    v = server.client()
    v.send(b"get t\r\n" * 20000)
    v.close()
    time.sleep(0.2)
    assert c.get("t")[1] == b"old"                # nothing half-written
    healthy(server)


def test_connection_limit_and_idle_connections(tmpdir_nv):
    s = Server(tmpdir_nv, args=["-c", "10"]).start()
    time.sleep(0.3)                               # the start-up probe's close
    conns = [s.client() for _ in range(10)]
    for c in conns:
        assert c.req("version\r\n").startswith(b"VERSION")
    extra = s.client()
    assert extra.read_all() == b"ERROR Too many open connections\r\n"
    conns[0].close()
    time.sleep(0.2)
    healthy(s)
    for c in conns[1:]:
        c.close()
    # the server sees the closes asynchronously: retry while still full
    for _ in range(100):
        try:
            st = s.client().stats()
            break
        except (EOFError, ConnectionResetError):
            time.sleep(0.05)
    assert int(st["rejected_connections"]) >= 1
    s.stop()
    # many idle connections (bounded by this process's descriptor limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    n = min(10000, soft - 100)
    s = Server(tmpdir_nv, args=["-c", str(n + 10)]).start()
    idle = [s.client() for _ in range(n)]
    healthy(s)
    rss = rss_kib(s.proc.pid)
    assert rss < 200 * 1024, rss
    for c in idle:
        c.close()
    s.stop()


def test_memory_bounded_for_a_client_that_does_not_read(server):
    c = server.client()
    c.set("big", b"x" * (1 << 20))
    slow = server.client()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sock.settimeout(0.05)
    before = rss_kib(server.proc.pid)
    sent = 0
    try:
        for _ in range(400):                      # 400 MiB of replies asked for
            slow.sock.send(b"get big\r\n" * 1)
            sent += 1
    except (socket.timeout, BlockingIOError):
        pass
    time.sleep(0.5)
    after = rss_kib(server.proc.pid)
    assert after - before < 64 * 1024, (before, after)   # the server stopped reading
    healthy(server)
    slow.close()


def test_large_replies_kept_while_the_item_is_rewritten(server):
    """Values of 1 KiB and more are sent from their place in the pool. A
    reply the socket cannot take at once must stay what it was when the
    get ran, though the item is replaced and its space freed and reused
    before the client reads it (the unsent rest is copied first)."""
    size, n = 8192, 40
    w = server.client()
    w.set("big", b"a" * size)
    w.set("mid", b"m" * 1000)           # copied into the output, not referenced
    slow = Client.__new__(Client)       # a small receive window from the start
    slow.buf = b""
    slow.sock = socket.socket()
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sock.connect(("127.0.0.1", server.port))
    slow.sock.settimeout(10)
    # 3.5 MB of copied replies fill the socket, then the referenced ones wait
    slow.send(b"get mid\r\n" * 3500 + b"get big\r\n" * n)
    time.sleep(0.5)
    for i in range(300):
        ch = bytes([ord("b") + i % 20])
        w.set("big", ch * size)
        w.set("other%d" % (i % 50), ch * size)
    for _ in range(3500):
        assert slow.line() == b"VALUE mid 0 1000\r\n"
        assert slow.read_exact(1002) == b"m" * 1000 + b"\r\n"
        assert slow.line() == b"END\r\n"
    bad = 0
    for _ in range(n):
        assert slow.line() == b"VALUE big 0 %d\r\n" % size
        bad += slow.read_exact(size + 2) != b"a" * size + b"\r\n"
        assert slow.line() == b"END\r\n"
    assert bad == 0
    healthy(server)
    slow.close()


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 3:
            data[pos:pos] = rng.choice([b"\r\n", b" ", b"-1", b"99999999999", b"noreply", b"\x80"])
        else:
            data = data + data[: rng.randint(0, len(data))]
    return bytes(data)


SEEDS = [b"set k%d 0 0 5\r\nhello\r\n", b"get k%d k1 k2\r\n", b"gets k%d\r\n", b"incr k%d 5\r\n",
         b"append k%d 0 0 1\r\nx\r\n", b"cas k%d 0 0 1 5\r\nz\r\n", b"touch k%d 10\r\n",
         b"gat 10 k%d\r\n", b"delete k%d\r\n", b"mg k%d v f t c k s O1\r\n",
         b"ms k%d 3 T10 F3 c\r\nabc\r\n", b"md k%d q\r\n", b"ma k%d N0 J1 D3 v\r\n",
         b"flush_all 100\r\n", b"stats\r\n", b"me k%d\r\n", b"verbosity 1\r\n"]


def test_fuzz_mutated_command_streams(server):
    rng = random.Random(int(os.environ.get("NVCACHED_FUZZ_SEED", "21")))
    rounds = int(os.environ.get("NVCACHED_FUZZ_ROUNDS", "300"))
    ref = server.client()
    ref.set("sentinel", "intact", flags=7)
    for r in range(rounds):
        c = server.client()
        parts = []
        for _ in range(8):
            s = rng.choice(SEEDS)
            if b"%d" in s:
                s = s % rng.randrange(20)
            parts.append(mutate(rng, s) if rng.random() < 0.7 else s)
        stream = b"".join(parts)
        if rng.random() < 0.2:
            stream = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3000)))
        try:
            c.send(stream)
            c.sock.settimeout(0.02)
            try:
                c.sock.recv(1 << 16)
            except (socket.timeout, ConnectionResetError):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass
        c.close()
        if r % 50 == 49:
            assert server.alive()
            assert ref.req("version\r\n").startswith(b"VERSION")
    assert server.alive()
    f = ref.get("sentinel")
    assert f is None or f[:2] == (7, b"intact")   # a fuzzed flush_all may have removed it
    healthy(server)
