"""nvheap — a crash-consistent key-value store in persistent memory.

    import nvheap
    with nvheap.open("/dev/shm/db.pool") as db:     # pool and store created if missing
        db[b"k"] = b"v"                              # durable when it returns
        db.get(b"k")                                 # b"v"
        for k, v in db.range(b"a", b"m"):            # keys in [b"a", b"m"), in order
            ...
        with db.batch() as b:                        # all or nothing, at the end of
            b[b"x"] = b"1"                           # the block (nothing on an
            del b[b"y"]                              # exception)

Keys are 1..KEY_MAX bytes, values 0..VALUE_MAX bytes; both are bytes-like
(bytes, bytearray, memoryview, ...) and come back as bytes. Every failure
raises a subclass of nvheap.Error with .code (the NVH_E_* number), .name
("NVH_E_TOOLONG") and .message (the library's message); NotFoundError is also
a KeyError and TooLongError/InvalidError are also ValueErrors.

See python/README.md and docs/PYTHON.md in the nvheap repository.
"""
from ._nvheap import (  # noqa: F401  (re-exported)
    KEY_MAX, LIBRARY_VERSION, NAME_MAX, VALUE_MAX,
    Batch, Error, Iterator, Store,
    AbortedError, BadMagicError, BadPtrError, BusyError, ChecksumError, CorruptError,
    DoubleFreeError, ExistsError, InvalidError, IoError, LayoutError, NoEntError,
    NoMemError, NoSpaceError, NotFoundError, NotSupportedError, ReadOnlyError, SizeError,
    TooLongError, TruncatedError, VersionError,
    E_ABORTED, E_BADMAGIC, E_BADPTR, E_BUSY, E_CHECKSUM, E_CORRUPT, E_DOUBLEFREE,
    E_EXISTS, E_INVAL, E_IO, E_LAYOUT, E_NOENT, E_NOMEM, E_NOSPACE, E_NOTFOUND,
    E_NOTSUP, E_READONLY, E_SIZE, E_TOOLONG, E_TRUNCATED, E_VERSION,
)

__version__ = LIBRARY_VERSION


def open(path, store="default", engine=None, create=True, size=0, max_size=0,
         readonly=False, layout=None):
    """Open the store `store` in the pool file `path` and return a Store.

    engine:   "sorted" (B+ tree: ordered iteration and range scans) or "hash"
              (hash map: iteration sorts a snapshot, no range scans). None
              creates "sorted" and opens an existing store of either engine.
    create:   True  - create the pool and the store if missing (default);
              False - both must exist (NoEntError, NotFoundError);
              "new" - the store must not exist yet (ExistsError).
    size:     pool size in bytes when the pool is created (0: 64 MiB);
    max_size: growth limit of the pool file (0: the library's default).
    readonly: writes raise ReadOnlyError; never creates anything.
    layout:   the pool's layout name (None: "nvkv").

    Every put, delete and batch commit is durable when it returns; after a
    crash (kill -9, power loss in the pmem/msync domains) each is there,
    whole, and a write in flight is all or nothing.
    """
    return Store(path, store, engine, create, size, max_size, readonly, layout)


__all__ = ["open", "Store", "Batch", "Iterator", "Error", "KEY_MAX", "VALUE_MAX",
           "NAME_MAX", "LIBRARY_VERSION"] + [n for n in dir() if n.endswith("Error")
                                              or n.startswith("E_")]
