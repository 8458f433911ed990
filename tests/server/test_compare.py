"""The same command sequences against nvcached and Debian's memcached
1.6.18: the replies must be byte-identical (CAS values, which each server
numbers its own way, are replaced by a placeholder)."""
import re

import pytest

from conftest import Client

SEQUENCES = [
    # storage and retrieval
    "set a 0 0 1\r\nx\r\nget a\r\nget a a b\r\nadd a 0 0 1\r\ny\r\nadd b 3 0 1\r\ny\r\nget a b\r\n",
    "replace nope 0 0 1\r\nx\r\nset r 1 0 2\r\nab\r\nreplace r 2 0 3\r\nabc\r\nget r\r\n",
    "set p 5 0 2\r\nmm\r\nappend p 9 0 2\r\n>>\r\nprepend p 9 0 2\r\n<<\r\nget p\r\n"
    "append nope 0 0 1\r\nx\r\nprepend nope 0 0 1\r\nx\r\n",
    "set e 0 0 0\r\n\r\nget e\r\nset sp 0 0 5\r\na b c\r\nget sp\r\n",
    "set k 0 0 1 noreply\r\nx\r\nadd k 0 0 1 noreply\r\ny\r\nget k\r\n",
    "cas nope 0 0 1 1\r\nx\r\nset c 0 0 1\r\nx\r\ncas c 0 0 1 999999\r\ny\r\nget c\r\n",
    # arithmetic
    "set n 0 0 2\r\n10\r\nincr n 5\r\ndecr n 100\r\nget n\r\nincr n 12345\r\nget n\r\n"
    "incr nope 1\r\ndecr nope 1\r\n",
    "set n 0 0 20\r\n18446744073709551615\r\nincr n 1\r\nget n\r\nset s 0 0 3\r\nabc\r\n"
    "incr s 1\r\nincr n x\r\nincr n -1\r\nincr n 1 noreply\r\nget n\r\n",
    # touch, delete, flush
    "set t 0 0 1\r\nx\r\ntouch t 100\r\ntouch nope 1\r\ntouch t x\r\ngat 100 t nope\r\n"
    "gat x t\r\n",
    "set d 0 0 1\r\nx\r\ndelete d\r\ndelete d\r\ndelete d 0\r\ndelete d 5\r\ndelete d 0 noreply\r\n"
    "delete\r\n",
    "set f 0 0 1\r\nx\r\nflush_all\r\nget f\r\nflush_all 0\r\nflush_all noreply\r\nflush_all x\r\n"
    "flush_all noreply 0\r\nflush_all 0 0\r\n",
    # misc and errors
    "verbosity 1\r\nverbosity 1 noreply\r\nverbosity\r\nverbosity x\r\nverbosity noreply\r\n"
    "verbosity a b c\r\n",
    "bogus\r\n\r\nGET a\r\nget\r\nshutdown\r\nstats nope\r\n",
    "set k -1 0 1\r\nx\r\nset k 0 0 -1\r\nset k 0 0 x\r\nset k 0 x 1\r\nset k 0 0 1 2 3\r\n"
    "set k 0 0\r\nset k 4294967296 0 1\r\nx\r\n",
    "set k 0 0 2\r\nabcd\r\nget k\r\n",
    "set " + "k" * 251 + " 0 0 1\r\nx\r\nset " + "k" * 250 + " 0 0 1\r\nx\r\nget " + "k" * 250 +
    "\r\n",
    "get " + "k" * 251 + "\r\n",
    "set k 18446744073709551615 0 1\r\nx\r\nget k\r\nset k 18446744073709551616 0 1\r\nx\r\n",
    "get " + " ".join("key%d" % i for i in range(100)) + "\r\n",
    "set big 0 0 2000000\r\n" + "x" * 2000000 + "\r\nget big\r\n",
    # meta
    "ms m 2 F5 T0\r\nhi\r\nmg m s v f t k O9\r\nmg m\r\nmg nope v\r\nmg nope v q\r\nmg m q\r\n"
    "mg m k q\r\n",
    "ms m 2\r\nhi\r\nms m 1 MA\r\n!\r\nms m 1 MP\r\n<\r\nmg m v\r\nms m 1 ME\r\nx\r\n"
    "ms new 1 MR\r\nx\r\nms new 1 ME\r\ny\r\nms m 1 MX\r\nx\r\nms nf 1 C5 c O1 k\r\nx\r\n",
    "ms m 2 q\r\nhi\r\nms m 2 C999999 c\r\nho\r\nmd m q\r\nmd m\r\nmd m O1 k\r\nmd m q\r\n",
    "ma n\r\nma n q\r\nma n N0 J5 v\r\nma n v\r\nma n MD D10 v\r\nma n q\r\nma n t k\r\n"
    "ma n MX\r\nma zz O2\r\n",
    "mg viv v N30\r\nmg viv v N30\r\nms viv 1\r\nx\r\nmg viv v\r\n",
    "mg\r\nmg k zz\r\nmg k v v\r\nms k\r\nms k abc\r\nmn\r\n",
]


def normalise(b):
    b = re.sub(rb"(VALUE \S+ \d+ \d+) \d+\r\n", rb"\1 CAS\r\n", b)
    return re.sub(rb" c\d+", b" cCAS", b)


@pytest.mark.parametrize("seq", range(len(SEQUENCES)))
def test_same_replies_as_memcached(server, memcached, seq):
    payload = SEQUENCES[seq]
    replies = []
    for port in (server.port, memcached):
        c = Client(port)
        c.req("flush_all\r\n")
        replies.append(normalise(c.req(payload)))
        c.close()
    assert replies[0] == replies[1]


def test_quit_and_binary_magic_close(server, memcached):
    for port in (server.port, memcached):
        c = Client(port)
        c.send("quit\r\n")
        assert c.read_all() == b""
