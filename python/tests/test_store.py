"""test_store.py — every method of nvheap.Store, Batch and Iterator, on both
engines, with good and bad input."""
import array
import os
import pathlib
import random
import threading

import pytest

import nvheap


# ---- open / close ----------------------------------------------------------

def test_open_creates_and_reopens(pool_path, engine):
    with nvheap.open(pool_path, engine=engine) as s:
        assert not s.closed
        assert s.engine == engine
        assert s.name == "default"
        assert s.path == pool_path
        assert not s.readonly
        s[b"k"] = b"v"
    assert s.closed
    with nvheap.open(pool_path, create=False) as s:      # engine None: either
        assert s.engine == engine
        assert s[b"k"] == b"v"
    with nvheap.open(pathlib.Path(pool_path), engine=engine, create=False) as s:
        assert s[b"k"] == b"v"
    assert repr(s).startswith("<nvheap.Store 'default'") and "closed" in repr(s)


def test_open_missing_pool(pool_dir):
    with pytest.raises(nvheap.NoEntError) as e:
        nvheap.open(os.path.join(pool_dir, "absent.pool"), create=False)
    assert e.value.code == nvheap.E_NOENT == -2
    assert e.value.name == "NVH_E_NOENT"
    assert e.value.message


def test_open_missing_store(pool_path, engine):
    nvheap.open(pool_path, engine=engine).close()
    with pytest.raises(nvheap.NotFoundError) as e:
        nvheap.open(pool_path, store="other", create=False)
    assert e.value.code == nvheap.E_NOTFOUND


def test_open_create_new(pool_path, engine):
    nvheap.open(pool_path, engine=engine, create="new").close()   # pool created too
    with pytest.raises(nvheap.ExistsError) as e:
        nvheap.open(pool_path, engine=engine, create="new")
    assert e.value.code == nvheap.E_EXISTS
    with pytest.raises(ValueError):
        nvheap.open(pool_path, create="maybe")


def test_several_stores_in_one_pool(pool_path, engine):
    with nvheap.open(pool_path, store="a", engine=engine) as a:
        a[b"k"] = b"in a"
    with nvheap.open(pool_path, store="b", engine="hash") as b:
        b[b"k"] = b"in b"
        assert b.name == "b"
    with nvheap.open(pool_path, store="a", create=False) as a:
        assert a[b"k"] == b"in a"
    with pytest.raises(nvheap.TooLongError):
        nvheap.open(pool_path, store="n" * (nvheap.NAME_MAX + 1))


def test_open_engine_mismatch(pool_path, engine):
    nvheap.open(pool_path, engine=engine).close()
    other = "hash" if engine == "sorted" else "sorted"
    with pytest.raises(nvheap.InvalidError) as e:
        nvheap.open(pool_path, engine=other)
    assert e.value.code == nvheap.E_INVAL
    with pytest.raises(nvheap.Error):
        nvheap.open(pool_path, engine="btree")


def test_open_twice_is_busy(pool_path, engine):
    with nvheap.open(pool_path, engine=engine):
        with pytest.raises(nvheap.BusyError) as e:
            nvheap.open(pool_path)
        assert e.value.code == nvheap.E_BUSY


def test_readonly(pool_path, engine):
    with nvheap.open(pool_path, engine=engine) as s:
        s[b"k"] = b"v"
    with nvheap.open(pool_path, readonly=True) as s:
        assert s.readonly
        assert s[b"k"] == b"v"
        assert list(s.items()) == [(b"k", b"v")]
        for write in (lambda: s.put(b"k", b"w"), lambda: s.delete(b"k"),
                      lambda: s.__setitem__(b"n", b"1")):
            with pytest.raises(nvheap.ReadOnlyError) as e:
                write()
            assert e.value.code == nvheap.E_READONLY
        with pytest.raises(nvheap.ReadOnlyError):
            with s.batch() as b:
                b[b"x"] = b"1"
    with pytest.raises(nvheap.NoEntError):
        nvheap.open(pool_path + ".absent", readonly=True)


def test_close_is_idempotent_and_final(pool_path, engine):
    s = nvheap.open(pool_path, engine=engine)
    s[b"k"] = b"v"
    it = iter(s)
    b = s.batch()
    s.close()
    s.close()
    calls = [lambda: s[b"k"], lambda: s.get(b"k"), lambda: s.put(b"k", b"v"),
             lambda: s.__setitem__(b"k", b"v"), lambda: s.delete(b"k"),
             lambda: s.__delitem__(b"k"), lambda: b"k" in s, lambda: len(s),
             lambda: list(s), lambda: s.keys(), lambda: s.items(), lambda: s.values(),
             lambda: s.range(), lambda: s.count(), lambda: s.batch(), lambda: s.stats(),
             lambda: s.check(), lambda: next(it), lambda: b.put(b"k", b"v"),
             lambda: b.commit()]
    for call in calls:
        with pytest.raises(nvheap.Error) as e:
            call()
        assert "closed" in e.value.message
    b.abort()                      # harmless after close
    with pytest.raises(nvheap.Error):
        with s:
            pass


# ---- get / put / delete ----------------------------------------------------

def test_put_get_delete(store):
    assert store.get(b"a") is None
    assert store.get(b"a", b"dflt") == b"dflt"
    assert store.put(b"a", b"1") is None
    assert store.get(b"a") == b"1"
    store.put(b"a", b"22")                         # overwrite
    assert store.get(b"a") == b"22"
    assert store.delete(b"a") is True
    assert store.delete(b"a") is False
    assert store.get(b"a") is None


def test_dict_style(store):
    store[b"x"] = b"1"
    assert store[b"x"] == b"1"
    assert b"x" in store and b"y" not in store
    assert len(store) == 1
    with pytest.raises(KeyError) as e:
        store[b"y"]
    assert isinstance(e.value, nvheap.NotFoundError)
    assert e.value.args == (b"y",)
    assert e.value.code == nvheap.E_NOTFOUND and e.value.name == "NVH_E_NOTFOUND"
    del store[b"x"]
    with pytest.raises(KeyError):
        del store[b"x"]
    assert len(store) == 0


def test_bytes_like_keys_and_values(store):
    store[bytearray(b"ba")] = bytearray(b"v1")
    store[memoryview(b"mv")] = memoryview(b"v2")
    store[array.array("B", b"ar")] = array.array("B", b"v3")

    class Sub(bytes):
        pass
    store[Sub(b"sub")] = Sub(b"v4")
    assert store[b"ba"] == b"v1" and type(store[b"ba"]) is bytes
    assert store[memoryview(b"xmvx")[1:3]] == b"v2"          # a sliced view
    assert store[b"ar"] == b"v3"
    assert store[bytearray(b"sub")] == b"v4"


def test_empty_and_large_values(store):
    store[b"empty"] = b""
    assert store[b"empty"] == b""
    assert b"empty" in store
    big = os.urandom(1 << 20)
    store[b"big"] = big
    assert store[b"big"] == big
    assert store.get(b"big", buffer=True) == big


def test_binary_keys(store):
    keys = [bytes([i]) for i in range(256)] + [b"\x00" * 3, b"\xff" * 100]
    for k in keys:
        store[k] = k[::-1]
    for k in keys:
        assert store[k] == k[::-1]
    assert len(store) == len(keys)


def test_get_buffer(store):
    store[b"k"] = b"value"
    mv = store.get(b"k", buffer=True)
    assert isinstance(mv, memoryview)
    assert mv.readonly
    assert mv.tobytes() == b"value"
    store[b"k"] = b"other"                 # a copy: the view keeps the old value
    assert mv.tobytes() == b"value"
    assert store.get(b"absent", buffer=True) is None
    assert store.get(b"absent", b"d", buffer=True) == b"d"


def test_key_limits(store):
    k = b"k" * nvheap.KEY_MAX
    store[k] = b"max"
    assert store[k] == b"max"
    long_key = b"k" * (nvheap.KEY_MAX + 1)
    for call in (lambda: store.put(long_key, b"v"), lambda: store.__setitem__(long_key, b"v")):
        with pytest.raises(nvheap.TooLongError) as e:
            call()
        assert e.value.code == nvheap.E_TOOLONG == -20
        assert e.value.name == "NVH_E_TOOLONG"
        assert str(nvheap.KEY_MAX) in e.value.message
        assert isinstance(e.value, ValueError) and isinstance(e.value, nvheap.Error)
    with pytest.raises(nvheap.TooLongError):   # lookups check the limit too
        long_key in store
    with pytest.raises(nvheap.TooLongError):
        store.get(long_key)
    with pytest.raises(nvheap.InvalidError) as e:
        store[b""] = b"v"
    assert e.value.code == nvheap.E_INVAL


def test_value_limit(store):
    with pytest.raises(nvheap.TooLongError) as e:
        store[b"k"] = bytes(nvheap.VALUE_MAX + 1)
    assert e.value.code == nvheap.E_TOOLONG
    assert b"k" not in store


@pytest.mark.parametrize("bad", ["str", 1, None, 1.5, [1, 2], object()])
def test_wrong_types(store, bad):
    with pytest.raises(TypeError, match="bytes-like"):
        store[bad] = b"v"
    with pytest.raises(TypeError, match="bytes-like"):
        store[b"k"] = bad
    with pytest.raises(TypeError):
        store[bad]
    with pytest.raises(TypeError):
        store.get(bad)
    with pytest.raises(TypeError):
        bad in store
    with pytest.raises(TypeError):
        store.delete(bad)
    with pytest.raises(TypeError):
        store.put(b"k")
    with pytest.raises(TypeError):
        store.get()
    assert len(store) == 0


# ---- iteration ---------------------------------------------------------------

def fill(store, n=200, seed=1):
    rnd = random.Random(seed)
    data = {}
    while len(data) < n:
        k = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 6)))
        data[k] = os.urandom(rnd.randrange(0, 40))
    for k, v in data.items():
        store[k] = v
    return data


def test_iteration_in_key_order(store):
    data = fill(store)
    keys = sorted(data)
    assert list(store) == keys
    assert list(store.keys()) == keys
    assert list(store.values()) == [data[k] for k in keys]
    assert list(store.items()) == [(k, data[k]) for k in keys]
    assert list(reversed(store)) == keys[::-1]
    assert list(store.items(reverse=True)) == [(k, data[k]) for k in keys[::-1]]
    it = iter(store)
    assert iter(it) is it
    assert len(list(it)) == len(keys)
    assert list(it) == []                      # exhausted stays exhausted


def test_iteration_of_empty_store(store):
    assert list(store) == [] and list(store.items()) == [] and list(reversed(store)) == []


def expected_range(keys, lo, hi, lo_incl, hi_incl):
    out = []
    for k in keys:
        if lo is not None and (k < lo or (k == lo and not lo_incl)):
            continue
        if hi is not None and (k > hi or (k == hi and not hi_incl)):
            continue
        out.append(k)
    return out


def test_range_bounds(sstore):
    data = fill(sstore, 300, seed=7)
    keys = sorted(data)
    rnd = random.Random(3)
    probes = [None, b"\x00", b"\xff\xff\xff\xff\xff\xff", keys[0], keys[-1]]
    probes += [rnd.choice(keys) for _ in range(6)] + [os.urandom(2) for _ in range(4)]
    for lo in probes:
        for hi in probes:
            for lo_incl in (True, False):
                for hi_incl in (True, False):
                    want = expected_range(keys, lo, hi, lo_incl, hi_incl)
                    got = list(sstore.range(lo, hi, lo_incl, hi_incl))
                    assert got == [(k, data[k]) for k in want], (lo, hi, lo_incl, hi_incl)
                    got_rev = list(sstore.keys(lo=lo, hi=hi, lo_incl=lo_incl,
                                               hi_incl=hi_incl, reverse=True))
                    assert got_rev == want[::-1], (lo, hi, lo_incl, hi_incl)
                    assert sstore.count(lo, hi, lo_incl, hi_incl) == len(want), \
                        (lo, hi, lo_incl, hi_incl)


def test_range_defaults(sstore):
    for k in (b"a", b"b", b"c", b"d"):
        sstore[k] = k.upper()
    assert list(sstore.range(b"b", b"d")) == [(b"b", b"B"), (b"c", b"C")]   # [lo, hi)
    assert list(sstore.range(hi=b"b")) == [(b"a", b"A")]
    assert list(sstore.range(lo=b"c")) == [(b"c", b"C"), (b"d", b"D")]
    assert list(sstore.values(lo=bytearray(b"c"))) == [b"C", b"D"]
    assert sstore.count() == 4 == len(sstore)
    with pytest.raises(TypeError):
        sstore.range(lo="a")


def test_range_needs_sorted_engine(pool_path):
    with nvheap.open(pool_path, engine="hash") as s:
        s[b"a"] = b"1"
        with pytest.raises(nvheap.NotSupportedError) as e:
            s.range(b"a", b"b")
        assert e.value.code == nvheap.E_NOTSUP
        with pytest.raises(nvheap.NotSupportedError):
            s.count(b"a")
        assert s.count() == 1


def test_iterate_while_deleting(sstore):
    data = fill(sstore, 500, seed=11)
    seen = []
    for k in sstore:
        seen.append(k)
        del sstore[k]
    assert seen == sorted(data)
    assert len(sstore) == 0


def test_iterator_outlives_its_loop(sstore):
    fill(sstore, 50)
    its = [sstore.items() for _ in range(20)]
    for it in its[::2]:
        next(it)
    del its                                   # iterators freed, store still fine
    assert len(list(sstore.items())) == 50


# ---- batches -------------------------------------------------------------------

def test_batch_commits_on_exit(store):
    store[b"gone"] = b"x"
    with store.batch() as b:
        b[b"a"] = b"1"
        b.put(b"b", bytearray(b"2"))
        del b[b"gone"]
        b.delete(b"never-there")              # not an error in a batch
        assert len(b) == 4
        assert b"a" not in store              # nothing applied before commit
    assert store[b"a"] == b"1" and store[b"b"] == b"2" and b"gone" not in store
    with pytest.raises(nvheap.Error, match="committed"):
        b.put(b"c", b"3")
    assert store.stats()["batches"] >= 1


def test_batch_aborts_on_exception(store):
    store[b"keep"] = b"old"
    with pytest.raises(RuntimeError):
        with store.batch() as b:
            b[b"keep"] = b"new"
            b[b"new"] = b"1"
            raise RuntimeError("boom")
    assert store[b"keep"] == b"old" and b"new" not in store
    with pytest.raises(nvheap.Error, match="aborted"):
        b.commit()


def test_batch_explicit_commit_abort(store):
    b = store.batch()
    b[b"x"] = b"1"
    b.abort()
    b.abort()                                  # idempotent
    assert b"x" not in store
    b = store.batch()
    b[b"y"] = b"2"
    b.commit()
    assert store[b"y"] == b"2"
    with store.batch() as b:                   # committed inside the block: no double commit
        b[b"z"] = b"3"
        b.commit()
    assert store[b"z"] == b"3"
    b = store.batch()
    b[b"dropped"] = b"1"
    del b                                      # never committed: nothing applied
    assert b"dropped" not in store


def test_batch_dropped_by_close(pool_path, engine):
    s = nvheap.open(pool_path, engine=engine)
    with pytest.raises(nvheap.Error, match="closed"):
        with s.batch() as b:
            b[b"k"] = b"v"
            s.close()                      # the batch cannot commit any more
    with nvheap.open(pool_path, create=False) as s:
        assert b"k" not in s


def test_batch_bad_input(store):
    with store.batch() as b:
        with pytest.raises(TypeError):
            b["str"] = b"v"
        with pytest.raises(TypeError):
            b[b"k"] = 5
        with pytest.raises(nvheap.TooLongError) as e:
            b[b"k" * (nvheap.KEY_MAX + 1)] = b"v"
        assert e.value.code == nvheap.E_TOOLONG
        b[b"ok"] = b"v"
    assert list(store) == [b"ok"]


def test_batch_overwrites_in_order(store):
    with store.batch() as b:
        b[b"k"] = b"1"
        b[b"k"] = b"2"
        del b[b"k"]
        b[b"k"] = b"3"
    assert store[b"k"] == b"3"


def test_large_batch(store):
    with store.batch() as b:
        for i in range(2000):
            b[b"key%05d" % i] = b"v" * (i % 50)
    assert len(store) == 2000
    assert store[b"key01999"] == b"v" * (1999 % 50)


# ---- stats, check, errors --------------------------------------------------------

def test_stats(store):
    fill(store, 10)
    st = store.stats()
    assert st["engine"] == store.engine
    assert st["count"] == 10 == len(store)
    assert st["puts"] >= 10
    for field in ("key_bytes", "value_bytes", "pool_size", "pool_used", "gets", "removes",
                  "batches", "flushes", "fences"):
        assert isinstance(st[field], int) and st[field] >= 0
    assert st["pool_size"] > 0 and st["fences"] > 0
    store.check()


def test_error_classes():
    classes = {
        nvheap.E_INVAL: nvheap.InvalidError, nvheap.E_NOENT: nvheap.NoEntError,
        nvheap.E_EXISTS: nvheap.ExistsError, nvheap.E_BUSY: nvheap.BusyError,
        nvheap.E_READONLY: nvheap.ReadOnlyError, nvheap.E_NOSPACE: nvheap.NoSpaceError,
        nvheap.E_CORRUPT: nvheap.CorruptError, nvheap.E_NOTSUP: nvheap.NotSupportedError,
        nvheap.E_NOTFOUND: nvheap.NotFoundError, nvheap.E_TOOLONG: nvheap.TooLongError,
    }
    for code, cls in classes.items():
        assert code < 0 and issubclass(cls, nvheap.Error)
    assert issubclass(nvheap.NotFoundError, KeyError)
    assert issubclass(nvheap.TooLongError, ValueError)
    assert issubclass(nvheap.Error, Exception)
    assert nvheap.__version__ == nvheap.LIBRARY_VERSION


def test_errors_across_threads(store):
    """Each thread's error carries its own nvh_errormsg() (the message is
    thread-local in the library and read before the GIL is taken back)."""
    errors = {}

    def worker(n):
        for _ in range(50):
            try:
                store[b"k" * n] = b"v"
            except nvheap.TooLongError as e:
                errors.setdefault(n, set()).add(e.message)
    lengths = [nvheap.KEY_MAX + 1 + i for i in range(4)]
    ts = [threading.Thread(target=worker, args=(n,)) for n in lengths]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(errors) == lengths
    for n, messages in errors.items():
        assert len(messages) == 1
        assert str(n) in messages.pop()


# ---- threads -------------------------------------------------------------------

def test_threads_put_get(store):
    n_threads, per = 4, 300

    def worker(t):
        for i in range(per):
            k = b"t%d-%d" % (t, i)
            store[k] = k * 2
            assert store[k] == k * 2
    ts = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(store) == n_threads * per
    for t in range(n_threads):
        for i in range(per):
            k = b"t%d-%d" % (t, i)
            assert store[k] == k * 2


def test_close_while_writers_run(pool_path, engine):
    """close() waits for writes in flight; later writes raise, none crashes."""
    s = nvheap.open(pool_path, engine=engine)
    acked = []
    stop = threading.Event()

    def writer(t):
        i = 0
        while not stop.is_set():
            k = b"w%d-%d" % (t, i)
            try:
                s[k] = b"v"
            except nvheap.Error as e:
                assert "closed" in e.message
                return
            acked.append(k)
            i += 1
    ts = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
    for t in ts:
        t.start()
    while len(acked) < 200:
        threading.Event().wait(0.001)
    s.close()
    stop.set()
    for t in ts:
        t.join()
    with nvheap.open(pool_path, create=False) as s:
        for k in acked:
            assert s[k] == b"v"
