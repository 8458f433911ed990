"""conftest.py — fixtures of the nvheap binding's tests.

Pools live in a fresh folder on /dev/shm (nvheap's `process` domain: a kill
-9 keeps everything the page cache holds, which is what these tests crash)
or, where there is no /dev/shm, in pytest's tmp_path. NVHEAP_TEST_DIR
overrides the parent folder.
"""
import os
import shutil
import tempfile

import pytest

import nvheap

ENGINES = ["sorted", "hash"]


def _scratch_parent():
    for d in (os.environ.get("NVHEAP_TEST_DIR"), "/dev/shm"):
        if d and os.path.isdir(d) and os.access(d, os.W_OK):
            return d
    return None


@pytest.fixture
def pool_dir(tmp_path):
    parent = _scratch_parent()
    if parent is None:
        yield str(tmp_path)
        return
    d = tempfile.mkdtemp(prefix="nvheap-py-", dir=parent)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def pool_path(pool_dir):
    return os.path.join(pool_dir, "test.pool")


_engine_ok = {}


def engine_available(engine, parent):
    """The sorted engine may be a stub (NVH_E_NOTSUP) in a tree without it."""
    if engine not in _engine_ok:
        d = tempfile.mkdtemp(prefix="nvheap-py-probe-", dir=parent)
        try:
            nvheap.open(os.path.join(d, "probe.pool"), engine=engine).close()
            _engine_ok[engine] = True
        except nvheap.NotSupportedError:
            _engine_ok[engine] = False
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return _engine_ok[engine]


@pytest.fixture(params=ENGINES)
def engine(request, pool_dir):
    if not engine_available(request.param, pool_dir):
        pytest.skip("the %s engine is not in this build (NVH_E_NOTSUP)" % request.param)
    return request.param


@pytest.fixture
def sorted_engine(pool_dir):
    if not engine_available("sorted", pool_dir):
        pytest.skip("the sorted engine is not in this build (NVH_E_NOTSUP)")
    return "sorted"


@pytest.fixture
def store(pool_path, engine):
    s = nvheap.open(pool_path, engine=engine)
    yield s
    s.close()


@pytest.fixture
def sstore(pool_path, sorted_engine):
    """A sorted store."""
    s = nvheap.open(pool_path, engine=sorted_engine)
    yield s
    s.close()
