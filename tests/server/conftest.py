"""Shared fixtures of the nvcached tests: servers on free loopback ports
(nvcached on a scratch pool, and Debian's memcached as the reference) and a
raw-socket client, so replies can be compared byte for byte."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def nvcached_path():
    p = os.environ.get("NVCACHED")
    if p:
        return p
    for cand in ("build/server/nvcached", "build-asan/server/nvcached"):
        full = os.path.join(ROOT, cand)
        if os.path.exists(full):
            return full
    pytest.skip("nvcached not built (set NVCACHED)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc, timeout=20.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.005)
    raise RuntimeError("server did not listen on %d" % port)


LIVE = []   # every Server started, so a failing test leaves no process behind


@pytest.fixture(autouse=True)
def reap_servers():
    yield
    while LIVE:
        s = LIVE.pop()
        if s.proc and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


class Server:
    """One nvcached process on its own pool; restartable on the same pool."""

    def __init__(self, tmpdir, args=(), domain="process", pool=None, keep_port=False):
        LIVE.append(self)
        # keep_port: restarts reuse the first port (a proxy's config or a
        # client's ketama ring names an instance by host:port)
        self.keep_port = keep_port
        self.pool = pool or os.path.join(tmpdir, "nvcached.pool")
        self.args = list(args)
        self.domain = domain
        self.proc = None
        self.port = None
        self.log = os.path.join(tmpdir, "nvcached.log")

    def start(self):
        if not (self.keep_port and self.port):
            self.port = free_port()
        cmd = [nvcached_path(), "-p", str(self.port), "--pool", self.pool] + self.args
        if self.domain:
            cmd += ["--domain", self.domain]
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=self.logf)
        self.startup = wait_port(self.port, self.proc)
        return self

    def client(self):
        return Client(self.port)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            rc = self.proc.wait(timeout=timeout)
        else:
            rc = self.proc.returncode if self.proc else None
        self.logf.close()
        with open(self.log, "rb") as f:
            log = f.read()
        # sanitizer builds: any report fails the test that started the server
        for marker in (b"Sanitizer", b"runtime error:", b"WARNING: ThreadSanitizer"):
            assert marker not in log, log.decode(errors="replace")[-4000:]
        return rc

    def kill9(self):
        return self.stop(signal.SIGKILL)

    def alive(self):
        return self.proc.poll() is None


class Client:
    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def _fill(self):
        d = self.sock.recv(1 << 16)
        if not d:
            raise EOFError("connection closed; read so far: %r" % self.buf)
        self.buf += d

    def read_until(self, end):
        while end not in self.buf:
            self._fill()
        i = self.buf.index(end) + len(end)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def line(self):
        return self.read_until(b"\r\n")

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_all(self, timeout=2.0):
        """Everything until the server closes (or the timeout)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                self._fill()
        except (EOFError, socket.timeout, ConnectionResetError):
            pass
        out, self.buf = self.buf, b""
        return out

    def req(self, payload):
        """Sends payload + "mn" and returns every reply byte before "MN"."""
        if isinstance(payload, str):
            payload = payload.encode()
        self.send(payload + b"mn\r\n")
        out = self.read_until(b"MN\r\n")
        return out[:-4]

    # small helpers on top of the text protocol
    def set(self, key, value, flags=0, exptime=0, cmd="set"):
        if isinstance(value, str):
            value = value.encode()
        self.send(b"%s %s %d %d %d\r\n" % (cmd.encode(), key.encode(), flags, exptime, len(value))
                  + value + b"\r\n")
        return self.line().rstrip(b"\r\n")

    def get(self, key):
        """(flags, value, cas) or None."""
        self.send(b"gets " + key.encode() + b"\r\n")
        head = self.line()
        if head == b"END\r\n":
            return None
        parts = head.split()
        assert parts[0] == b"VALUE", head
        n = int(parts[3])
        data = self.read_exact(n + 2)[:-2]
        assert self.line() == b"END\r\n"
        return int(parts[2]), data, int(parts[4])

    def stats(self, arg=""):
        self.send(("stats %s\r\n" % arg).strip() + "\r\n" if arg else "stats\r\n")
        out = {}
        while True:
            ln = self.line()
            if ln == b"END\r\n":
                return out
            _, k, v = ln.decode().rstrip("\r\n").split(" ", 2)
            out[k] = v


@pytest.fixture
def tmpdir_nv():
    base = os.environ.get("NVCACHED_TEST_DIR")
    if base:
        os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix="nvc-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(tmpdir_nv):
    s = Server(tmpdir_nv).start()
    yield s
    s.stop()


@pytest.fixture
def memcached():
    """Debian's memcached on a free port, or a skip."""
    exe = shutil.which("memcached")
    if not exe:
        pytest.skip("memcached not installed")
    port = free_port()
    cmd = [exe, "-p", str(port), "-U", "0", "-l", "127.0.0.1"]
    if os.geteuid() == 0:
        cmd += ["-u", "root"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    yield port
    proc.terminate()
    proc.wait(timeout=10)
