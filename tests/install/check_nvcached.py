#!/usr/bin/env python3
"""check_nvcached.py BIN VERSION WORKDIR — the installed nvcached runs.

Run by run_install_test.cmake against the binary in the install prefix:
`--version` names the project's version; the server starts on a free
loopback port with a pool in WORKDIR, stores and returns a key, stops on
SIGTERM with status 0, and after a restart still returns the key."""
import os
import signal
import socket
import subprocess
import sys
import time


def fail(msg):
    print("check_nvcached: " + msg, file=sys.stderr)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(binary, pool):
    port = free_port()
    proc = subprocess.Popen([binary, "-p", str(port), "-t", "1", "--pool", pool],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail("nvcached exited with %s: %s" % (proc.returncode, proc.stdout.read().decode()))
        try:
            return proc, socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            time.sleep(0.02)
    proc.kill()
    fail("nvcached did not listen on port %d" % port)


def ask(s, req, end):
    s.sendall(req)
    buf = b""
    while not buf.endswith(end):
        d = s.recv(4096)
        if not d:
            fail("connection closed after %r (got %r)" % (req, buf))
        buf += d
    return buf


def stop(proc, s):
    s.close()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        fail("nvcached did not stop on SIGTERM")
    if rc != 0:
        fail("nvcached exited with %d on SIGTERM: %s" % (rc, proc.stdout.read().decode()))


def main():
    binary, version, work = sys.argv[1:4]
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    if out.returncode != 0 or not out.stdout.startswith("nvcached " + version):
        fail("--version printed %r (status %d), expected 'nvcached %s ...'"
             % (out.stdout + out.stderr, out.returncode, version))
    pool = os.path.join(work, "nvcached.pool")
    if os.path.exists(pool):
        os.unlink(pool)
    proc, s = start(binary, pool)
    if ask(s, b"set installed 5 0 2\r\nok\r\n", b"\r\n") != b"STORED\r\n":
        fail("set was not STORED")
    got = ask(s, b"get installed\r\n", b"END\r\n")
    if got != b"VALUE installed 5 2\r\nok\r\nEND\r\n":
        fail("get returned %r" % got)
    stop(proc, s)
    proc, s = start(binary, pool)
    got = ask(s, b"get installed\r\n", b"END\r\n")
    if got != b"VALUE installed 5 2\r\nok\r\nEND\r\n":
        fail("after a restart get returned %r" % got)
    stop(proc, s)
    os.unlink(pool)
    print("installed nvcached %s: --version, set/get, restart" % version)


if __name__ == "__main__":
    main()
