"""Scale-out: 3 nvcached instances behind the sharding memcached users
already run (docs/SCALE-OUT.md): Debian's nutcracker (twemproxy, ketama
distribution) and pylibmc's ketama client (libmemcached).

Each test sets KEYS keys through the sharding layer, checks (asking each
instance directly) that every key lives on exactly one instance and that
all 3 hold some, kills one instance with SIGKILL, checks the keys of the
other two are still served (reads and writes) while it is down, restarts it
on the same pool and port, and checks it holds every key it acknowledged,
asked directly and through the sharding layer."""
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import Client, Server, free_port, wait_port

KEYS = 300
VICTIM = 1


def value_of(key):
    return ("%s=" % key).encode() + b"x" * 64


def direct_get(server, key):
    c = Client(server.port)
    try:
        r = c.get(key)
    finally:
        c.close()
    return None if r is None else r[1]


def start_cluster(tmpdir):
    servers = []
    for i in range(3):
        d = os.path.join(tmpdir, "n%d" % i)
        os.makedirs(d)
        servers.append(Server(d, keep_port=True).start())
    return servers


def owners(servers, keys):
    """key -> index of the instance holding it, asked of each directly."""
    own = {}
    for i, s in enumerate(servers):
        c = Client(s.port)
        for k in keys:
            r = c.get(k)
            if r is not None:
                assert r[1] == value_of(k), (k, r)
                assert k not in own, "%s on instances %d and %d" % (k, own[k], i)
                own[k] = i
        c.close()
    return own


def check_spread(servers, keys):
    own = owners(servers, keys)
    missing = [k for k in keys if k not in own]
    assert not missing, "acknowledged but on no instance: %s" % missing[:10]
    counts = [sum(1 for k in keys if own[k] == i) for i in range(len(servers))]
    assert all(n >= len(keys) // 10 for n in counts), counts
    return own


def poll(fn, timeout=10.0):
    """fn() until it returns true (small polls, no fixed sleeps)."""
    t0 = time.monotonic()
    while True:
        r = fn()
        if r:
            return r
        if time.monotonic() - t0 > timeout:
            return r
        time.sleep(0.02)


def kill_restart_check(servers, own, keys, get, set_):
    """The shared body: SIGKILL the victim, serve the others' keys, restart
    it on the same pool, check it kept every key it acknowledged."""
    victim = servers[VICTIM]
    mine = [k for k in keys if own[k] == VICTIM]
    others = [k for k in keys if own[k] != VICTIM]
    gen0 = int(victim.client().stats()["generation"])
    victim.kill9()

    # the cluster keeps serving: every key of the live instances reads back,
    # and a rewrite of one of them is acknowledged and visible
    for k in others:
        assert get(k) == value_of(k), k
    assert set_(others[0], value_of(others[0]))
    assert get(others[0]) == value_of(others[0])
    # the dead instance's keys are not remapped (no eject): a miss or an
    # error, never another instance's stale value
    for k in mine[:5]:
        assert get(k) in (None, value_of(k)), k

    victim.start()      # same pool, same port
    gen1 = int(victim.client().stats()["generation"])
    assert gen1 != gen0, "a restart must change the generation"
    lost = [k for k in mine if direct_get(victim, k) != value_of(k)]
    assert not lost, "%d of %d acknowledged keys lost on restart: %s" % (
        len(lost), len(mine), lost[:10])
    # and through the sharding layer, once it has reconnected
    assert poll(lambda: get(mine[0]) == value_of(mine[0])), "not served again"
    for k in mine:
        assert get(k) == value_of(k), k


# --- nutcracker (twemproxy) ----------------------------------------------

NUTCRACKER_CONF = """\
nvcached:
  listen: 127.0.0.1:{port}
  hash: md5
  distribution: ketama
  timeout: 2000
  preconnect: false
  auto_eject_hosts: false
  server_retry_timeout: 200
  server_failure_limit: 1
  servers:
{servers}
"""


class ProxyClient:
    """A raw text-protocol client to nutcracker that maps its error replies
    (SERVER_ERROR for a key whose instance is down) to None and reconnects
    when the proxy closes the connection."""

    def __init__(self, port):
        self.port = port
        self.c = Client(port, timeout=5)

    def _retry(self, fn):
        try:
            return fn()
        except (EOFError, ConnectionError):
            self.c.close()
            self.c = Client(self.port, timeout=5)
            return None

    def get(self, key):
        def go():
            self.c.send(b"get " + key.encode() + b"\r\n")
            head = self.c.line()
            if head == b"END\r\n" or head.startswith((b"SERVER_ERROR", b"ERROR")):
                return None
            parts = head.split()
            assert parts[0] == b"VALUE", head
            data = self.c.read_exact(int(parts[3]) + 2)[:-2]
            assert self.c.line() == b"END\r\n"
            return data
        return self._retry(go)

    def set(self, key, value):
        return self._retry(lambda: self.c.set(key, value) == b"STORED")


@pytest.fixture
def nutcracker_exe():
    exe = shutil.which("nutcracker") or (
        "/usr/sbin/nutcracker" if os.path.exists("/usr/sbin/nutcracker") else None)
    if not exe:
        pytest.skip("nutcracker not installed (Debian nutcracker; scripts/setup)")
    return exe


def test_nutcracker_ketama(tmpdir_nv, nutcracker_exe):
    servers = start_cluster(tmpdir_nv)
    port, stats_port = free_port(), free_port()
    conf = os.path.join(tmpdir_nv, "nutcracker.yml")
    with open(conf, "w") as f:
        f.write(NUTCRACKER_CONF.format(port=port, servers="\n".join(
            "   - 127.0.0.1:%d:1 nvc%d" % (s.port, i) for i, s in enumerate(servers))))
    log = os.path.join(tmpdir_nv, "nutcracker.log")
    proc = subprocess.Popen([nutcracker_exe, "-c", conf, "-s", str(stats_port),
                             "-a", "127.0.0.1", "-o", log,
                             "-p", os.path.join(tmpdir_nv, "nutcracker.pid")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        proxy = ProxyClient(port)
        keys = ["sk%04d" % i for i in range(KEYS)]
        for k in keys:
            assert proxy.set(k, value_of(k)), k
        own = check_spread(servers, keys)
        kill_restart_check(servers, own, keys, proxy.get, proxy.set)
        assert proc.poll() is None, "nutcracker exited"
    finally:
        proc.kill()
        proc.wait()
    for s in servers:
        s.stop()


# --- pylibmc's ketama client (libmemcached) ------------------------------

def test_pylibmc_ketama(tmpdir_nv):
    pylibmc = pytest.importorskip(
        "pylibmc", reason="pylibmc not installed (Debian python3-pylibmc; scripts/setup)")
    servers = start_cluster(tmpdir_nv)
    mc = pylibmc.Client(["127.0.0.1:%d" % s.port for s in servers], binary=False,
                        behaviors={"ketama": True, "connect_timeout": 1000,
                                   "retry_timeout": 1})

    def get(k):
        try:
            return mc.get(k)
        except pylibmc.Error:
            return None

    def set_(k, v):
        try:
            return mc.set(k, v)
        except pylibmc.Error:
            return False

    keys = ["pk%04d" % i for i in range(KEYS)]
    for k in keys:
        assert mc.set(k, value_of(k)), k
    own = check_spread(servers, keys)
    kill_restart_check(servers, own, keys, get, set_)
    for s in servers:
        s.stop()
