/* otm.c — concurrent object transactions (NVTM, [Coburn09] §4.3): a volatile
 * table of ownership records hashed by object offset, eager write locking
 * at open-for-write, versioned reads validated at commit (and whenever the
 * global clock moved since the last validation), abort and retry under a
 * contention policy, and the durable commit of deferred object writes.
 *
 * Why deferred writes (the caller modifies a private copy, applied at
 * commit) rather than NVTM's in-place writes: nothing changes in place
 * before the commit, all shared stores by the library are atomic, and the
 * undo and redo images are both known at commit, so the whole write set is
 * logged under ONE fence instead of one per opened object.
 *
 * Reads are NVTM's: open-for-read records the object's ownership-record
 * word and hands out the object itself; the caller reads it in place, and
 * the read set is validated at commit (the values read were those of the
 * recorded versions iff no record changed). A read-only transaction thus
 * copies nothing, writes no shared line and takes no persistence fence.
 * What a reader may observe before that validation (docs/TX.md, "Reading
 * in place"): each aligned 8-byte word holds a value some committed
 * transaction wrote, but words of one object, or of two objects, may come
 * from different commits. Three rules bound what such a doomed reader can
 * do:
 *   - an open of an object newer than the read version validates the read
 *     set (TL2's extension): a walk that comes back to an object changed
 *     since it was opened aborts there, so loops through opens end;
 *   - a NULL or out-of-pool pointer, and an error the caller returns, are
 *     conflicts (retried) when the read set is no longer current;
 *   - an object transaction is an epoch reader (common/epoch.c) from its
 *     first open (nvh_tx_run: its begin) to its end, so space freed
 *     meanwhile (by any thread) is not reused under it: a stale pointer
 *     leads to the old bytes, never to someone else's new object.
 * A caller that must never see such values opens with
 * nvh_tx_open_read_copy: a private copy, consistent when it is returned. */
#include "tx.h"

#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ==========================================================================
 * Helpers
 * ========================================================================== */
/* Copy with relaxed atomic word loads/stores: the bytes may be read by other
 * transactions concurrently, and the compiler must not tear or fuse them. */
static void atomic_copy_in(char *dst, const char *src, size_t n)
{
    size_t i = 0;
    /* acquire loads (plain moves on x86): the ownership record re-read that
     * validates the copy cannot move above them — a seqlock without a fence
     * (TSan does not model atomic_thread_fence) */
    if (((uintptr_t)src & 7) == 0)
        for (; i + 8 <= n; i += 8) {
            uint64_t v = __atomic_load_n((const uint64_t *)(src + i), __ATOMIC_ACQUIRE);
            memcpy(dst + i, &v, 8);
        }
    for (; i < n; i++) dst[i] = (char)__atomic_load_n((const char *)(src + i), __ATOMIC_ACQUIRE);
}

static void atomic_copy_out(char *dst, const char *src, size_t n)
{
    size_t i = 0;
    if (((uintptr_t)dst & 7) == 0)
        for (; i + 8 <= n; i += 8) {
            uint64_t v;
            memcpy(&v, src + i, 8);
            __atomic_store_n((uint64_t *)(dst + i), v, __ATOMIC_RELAXED);
        }
    for (; i < n; i++) __atomic_store_n(dst + i, src[i], __ATOMIC_RELAXED);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
    __asm__ volatile("pause");
#endif
}

static int conflict(nvh_tx *tx, const char *what)
{
    tx->conflict = true;
    tx->conflicts++;
    nvh_tx_rollback_(tx);
    return nvh_fail(NVH_E_ABORTED, "%s: conflict with another transaction (aborted)", what);
}

static __attribute__((noinline)) int push_r_grow(nvh_tx *tx)
{
    size_t cap = tx->rcap ? tx->rcap * 2 : 32;
    nvh_rentry *g = realloc(tx->rset, cap * sizeof *g);
    if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory");
    tx->rset = g;
    tx->rcap = cap;
    return NVH_OK;
}

static inline int push_r(nvh_tx *tx, _Atomic uint64_t *orec, uint64_t word)
{
    if (__builtin_expect(tx->nr == tx->rcap, 0) && push_r_grow(tx) != NVH_OK) return NVH_E_NOMEM;
    tx->rset[tx->nr++] = (nvh_rentry){orec, word};
    return NVH_OK;
}

static nvh_wentry *push_w(nvh_tx *tx)
{
    if (tx->nw == tx->wcap) {
        size_t cap = tx->wcap ? tx->wcap * 2 : 16;
        nvh_wentry *g = realloc(tx->wset, cap * sizeof *g);
        if (!g) { nvh_fail(NVH_E_NOMEM, "out of memory"); return NULL; }
        tx->wset = g;
        tx->wcap = cap;
    }
    return &tx->wset[tx->nw++];
}

static nvh_wentry *wfind(nvh_tx *tx, const char *obj)
{
    for (size_t i = 0; i < tx->nw; i++)
        if (tx->wset[i].obj == obj) return &tx->wset[i];
    return NULL;
}

/* The unlocked word an orec had before this transaction locked it. */
static bool locked_by_me(nvh_tx *tx, uint64_t w) { return OREC_LOCKED(w) && OREC_LANE(w) == tx->lane->index; }

static uint64_t my_prev(nvh_tx *tx, _Atomic uint64_t *orec)
{
    for (size_t i = 0; i < tx->nw; i++)
        if (tx->wset[i].orec == orec && tx->wset[i].owns_lock) return tx->wset[i].prev;
    return 0;
}

/* Every read still current? */
static bool validate(nvh_tx *tx)
{
    for (size_t i = 0; i < tx->nr; i++) {
        nvh_rentry *e = &tx->rset[i];
        uint64_t cur = atomic_load_explicit(e->orec, memory_order_acquire);
        if (cur == e->word) continue;
        if (locked_by_me(tx, cur) && my_prev(tx, e->orec) == e->word) continue;
        return false;
    }
    return true;
}

/* An object version newer than rv: revalidate and move rv forward. */
static bool extend(nvh_tx *tx)
{
    uint64_t now = NVH_GC_VER(atomic_load_explicit(&tx->st->gclock, memory_order_acquire));
    if (!validate(tx)) return false;
    tx->rv = now;
    return true;
}

/* The ownership-record table, allocated by the pool's first object
 * transaction: pools that never run one pay nothing for it at open. */
static int orecs_ensure(nvh_txstate *st)
{
    if (__builtin_expect(__atomic_load_n(&st->orecs, __ATOMIC_ACQUIRE) != NULL, 1)) return NVH_OK;
    _Atomic uint64_t *t = calloc(NVH_OREC_COUNT, sizeof *t), *expect = NULL;
    if (!t) return nvh_fail(NVH_E_NOMEM, "out of memory for the ownership-record table");
    if (!__atomic_compare_exchange_n(&st->orecs, &expect, t, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        free((void *)t);                        /* another thread was first */
    return NVH_OK;
}

#define NVH_TX_RO_OFF 32u

int nvh_tx_test_otm_no_validate_ = 0;
int nvh_tx_test_otm_recorded_ = 0;
int nvh_tx_test_otm_abort_prev_ = 0;
int nvh_tx_test_otm_ignore_infl_ = 0;

/* The binding (tx.h, nvh_tx_bound_): set by the outermost begin and by the
 * first open of a transaction bound to no pool, cleared at its end. */
_Thread_local nvh_tx_binding nvh_tx_bound_ __attribute__((tls_model("initial-exec")));
_Thread_local nvh_tx_last nvh_tx_last_ __attribute__((tls_model("initial-exec")));

static inline __attribute__((always_inline)) void bind(nvh_pool *pool, nvh_tx *tx)
{
    const nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    uint64_t size = NVH_LOAD_RELAXED_(&ctx->size);
    nvh_tx_bound_.pool = pool;
    nvh_tx_bound_.tx = tx;
    nvh_tx_bound_.lo = (uintptr_t)ctx->base + NVH_PAGE;
    nvh_tx_bound_.span = size > NVH_PAGE ? size - NVH_PAGE : 0;
    nvh_tx_bound_.clock = &tx->st->gclock;
    nvh_tx_bound_.urv = tx->unrec ? tx->rv : NVH_TX_NO_FAST;
}

void nvh_tx_bind_(nvh_pool *pool, nvh_tx *tx) { bind(pool, tx); }

static inline void otm_unbind(nvh_tx *tx) { nvh_tx_unbind_(tx); }

/* The unrecorded reads became a read set (record_reads) or were dropped:
 * the fast open stops noting addresses. */
static inline void otm_recorded(nvh_tx *tx)
{
    tx->unrec = false;
    tx->ro = false;
    if (nvh_tx_bound_.tx == tx) nvh_tx_bound_.urv = NVH_TX_NO_FAST;
}


/* Is the read set still current? Only when the global clock moved since
 * the read version (every commit that changes an object takes a write
 * version before it changes anything in place); moves the read version on. */
static bool reads_current(nvh_tx *tx)
{
    uint64_t now = NVH_GC_VER(atomic_load_explicit(&tx->st->gclock, memory_order_acquire));
    if (now == tx->rv || nvh_tx_test_otm_no_validate_) return true;
    if (!validate(tx)) return false;
    tx->rv = now;
    return true;
}

/* Unrecorded reads. A transaction whose first open finds no object commit
 * in flight (the clock word equals its version, tx.h) reads without
 * ownership records: an open checks that the clock word is still the one
 * sampled (a line every open reads and only commits write) and notes the
 * object's address. Sound because a commit changes objects in place only
 * between taking its write version and its end, and the clock word shows
 * both: unchanged, no object changed since the sample. When the clock
 * moves (or the transaction opens an object for write or copy), the
 * addresses become a read set (record_reads), which validates them at the
 * same time; the transaction goes on with recorded reads. What this saves
 * per open: the record's hash and load (a line of a 512 KiB table) and the
 * version checks. */

/* Record (and validate) the read set: every object read so far unchanged
 * since rv? An unrecorded object's record must be unlocked and not newer
 * than rv: a commit that changed it after rv took a later write version
 * and holds the lock until it ends, and an abort after taking one releases
 * with it (release), so an old version means unchanged. Entries already
 * recorded must still hold their word. False: a conflict. */
static bool record_reads(nvh_tx *tx)
{
    /* address-free reads (nvh_tx_run_read): nothing to record them from;
     * the clock moved or the transaction wants a read set: a conflict
     * (nvh_tx_run_read retries recording) */
    if (tx->ro && !nvh_tx_test_ro_write_) return false;
    nvh_pool *pool = tx->pool;
    for (size_t i = 0; i < tx->nr; i++) {
        nvh_rentry *e = &tx->rset[i];
        if (e->orec) {
            if (atomic_load_explicit(e->orec, memory_order_acquire) != e->word &&
                !nvh_tx_test_otm_no_validate_)
                return false;
            continue;
        }
        const char *obj = (const char *)(uintptr_t)e->word;
        _Atomic uint64_t *orec = nvh_orec_for(tx->st, nvh_off(pool, obj));
        uint64_t w = atomic_load_explicit(orec, memory_order_acquire);
        if ((OREC_LOCKED(w) || OREC_VER(w) > tx->rv) && !nvh_tx_test_otm_no_validate_) return false;
        *e = (nvh_rentry){orec, w};
    }
    otm_recorded(tx);
    return true;
}

/* Are the reads so far still current (either kind)? */
static bool reads_ok(nvh_tx *tx)
{
    if (tx->unrec)
        return atomic_load_explicit(&tx->st->gclock, memory_order_acquire) == tx->rv ||
               nvh_tx_test_otm_no_validate_ || record_reads(tx);
    return reads_current(tx);
}

/* Has the transaction read objects that a validation must cover? The read
 * set, or address-free reads (which leave it empty). Every "anything to
 * validate?" test goes through this, never through nr alone. */
static inline bool otm_reads(const nvh_tx *tx) { return tx->nr || tx->ro; }

/* The end of the transaction's reads: the read set dropped, unbound, out
 * of the epoch (after the last in-place read). */
static inline void otm_end_reads(nvh_tx *tx)
{
    tx->nr = 0;
    tx->unrec = false;
    tx->ro = false;
    otm_unbind(tx);
    if (tx->epoch_in) {
        tx->epoch_in = false;
        nvh_epoch_exit_sticky_();
    }
}

static void otm_first(nvh_tx *tx);

/* The bound descriptor, if obj is a plain case (inside the pool's data);
 * NULL: otm_tx decides (and reports). */
static inline nvh_tx *otm_fast(nvh_pool *pool, const void *obj, size_t size)
{
    nvh_tx *tx = nvh_tx_bound_.tx;
    if (__builtin_expect(tx != NULL && nvh_tx_bound_.pool == pool, 1) && size &&
        nvh_contains(pool, obj, size) && nvh_off(pool, obj) >= NVH_PAGE) {
        if (__builtin_expect(!tx->rv, 0)) {
            if (!__atomic_load_n(&tx->st->orecs, __ATOMIC_ACQUIRE)) return NULL;
            otm_first(tx);
        }
        return tx;
    }
    return NULL;
}

/* The transaction's first object open: announce an epoch reader before any
 * object is read (nothing freed from now on is reused until the end), then
 * sample the read version (any moment up to the first object read is as
 * good a snapshot as the begin; gclock >= 1). No object commit in flight:
 * the reads go unrecorded (above). */
static inline __attribute__((always_inline)) void otm_sample(nvh_tx *tx)
{
    nvh_epoch_enter_sticky_();
    tx->epoch_in = true;
    uint64_t g = atomic_load_explicit(&tx->st->gclock, memory_order_acquire);
    uint64_t rv = NVH_GC_VER(g);
    bool unrec = g == rv;
    if (__builtin_expect(nvh_tx_test_otm_recorded_ | nvh_tx_test_otm_ignore_infl_, 0)) {
        if (nvh_tx_test_otm_recorded_) unrec = false;
        if (nvh_tx_test_otm_ignore_infl_) {
            rv = g;             /* negative control: the count taken as version bits */
            unrec = true;
        }
    }
    tx->rv = rv;
    tx->unrec = unrec;
    tx->ro = false;
}

static inline void otm_first(nvh_tx *tx)
{
    otm_sample(tx);
    if (nvh_tx_bound_.tx == tx) nvh_tx_bound_.urv = tx->unrec ? tx->rv : NVH_TX_NO_FAST;
}

void nvh_tx_otm_forget_(nvh_pool *pool)
{
    nvh_tx_last_.tx = NULL;        /* other threads': the registry's generation */
    nvh_tx *tx = nvh_tx_bound_.tx;
    if (nvh_tx_bound_.pool != pool || !tx) return;
    otm_recorded(tx);
    if (tx->epoch_in) {
        tx->epoch_in = false;
        nvh_epoch_exit_sticky_();
    }
    otm_unbind(tx);
}

static nvh_tx *otm_tx(nvh_pool *pool, const void *obj, size_t size, const char *what)
{
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) return NULL;
    if (orecs_ensure(tx->st) != NVH_OK) return NULL;
    if (tx->status == NVH_TXS_ABORTED) { nvh_tx_fail_aborted_(tx, what); return NULL; }
    if (nvh_tx_bound_.tx != tx) nvh_tx_bind_(pool, tx);
    if (!tx->rv) otm_first(tx);
    if (!obj || size == 0 || !nvh_contains(pool, obj, size) || nvh_off(pool, obj) < NVH_PAGE) {
        /* a pointer read from an object that changed since it was opened:
         * a conflict (retried), not the caller's error */
        if (otm_reads(tx) && !reads_ok(tx)) { conflict(tx, what); return NULL; }
        if (!obj || size == 0) { nvh_fail(NVH_E_INVAL, "%s: NULL object or size 0", what); return NULL; }
        nvh_tx_failed_(tx, nvh_fail(NVH_E_BADPTR, "%s: [%p, +%zu) is not inside the pool's "
                                    "data", what, obj, size));
        return NULL;
    }
    return tx;
}

/* ==========================================================================
 * Open for read / write
 * ========================================================================== */
static __attribute__((noinline)) const void *open_read_slow(nvh_pool *pool, const void *obj,
                                                            size_t size);

/* The object in place, noted in the read set (NVTM's open-for-read;
 * validation: at an open of a newer object or when the clock moved under
 * unrecorded reads, and at commit). The fast path is the common case of a
 * read-only transaction: an unrecorded read (the clock word unchanged since
 * the sample) of an object inside the bound pool's data, with room in the
 * read set: the address is noted. It reads the thread-local binding, the
 * clock word and the read set's cursor, and needs few registers, so it
 * saves none. Everything else (the first open, recorded reads, the clock
 * moved, errors) is the slow path's. */
const void *nvh_tx_open_read(nvh_pool *pool, const void *obj, size_t size)
{
    if (__builtin_expect(nvh_tx_bound_.pool == pool, 1)) {
        uintptr_t off = (uintptr_t)obj - nvh_tx_bound_.lo, span = nvh_tx_bound_.span;
        /* size in [1, span] and [obj, obj + size) inside: obj below lo
         * wraps off past span */
        if (__builtin_expect(size - 1 < span && off <= span - size, 1) &&
            atomic_load_explicit(nvh_tx_bound_.clock, memory_order_acquire) == nvh_tx_bound_.urv) {
            nvh_tx *tx = nvh_tx_bound_.tx;
            if (tx->ro) return obj;     /* address-free: the clock is the check */
            size_t n = tx->nr;
            if (__builtin_expect(n < tx->rcap, 1)) {
                tx->rset[n] = (nvh_rentry){NULL, (uint64_t)(uintptr_t)obj};
                tx->nr = n + 1;
                return obj;
            }
        }
    }
    return open_read_slow(pool, obj, size);
}

static const void *open_read_slow(nvh_pool *pool, const void *obj, size_t size)
{
    nvh_tx *tx = otm_fast(pool, obj, size);
    if (!tx && !(tx = otm_tx(pool, obj, size, "nvh_tx_open_read"))) return NULL;
    if (tx->unrec) {
        /* the clock unchanged (or reads not validated: the test hook) */
        if (atomic_load_explicit(&tx->st->gclock, memory_order_acquire) == tx->rv ||
            nvh_tx_test_otm_no_validate_) {
            if (tx->ro) return obj;
            return push_r(tx, NULL, (uint64_t)(uintptr_t)obj) == NVH_OK ? obj : NULL;
        }
        /* it moved: record (and validate) what was read, go on recorded */
        if (!record_reads(tx)) {
            conflict(tx, "nvh_tx_open_read");
            return NULL;
        }
    }
    nvh_wentry *we = tx->nw ? wfind(tx, obj) : NULL;
    if (we) {
        if (we->size < size) { nvh_fail(NVH_E_INVAL, "nvh_tx_open_read: size grew"); return NULL; }
        return we->copy;
    }
    _Atomic uint64_t *orec = nvh_orec_for(tx->st, nvh_off(pool, obj));
    for (unsigned tries = 0;; tries++) {
        uint64_t w = atomic_load_explicit(orec, memory_order_acquire);
        if (__builtin_expect(OREC_LOCKED(w), 0)) {
            /* ours (another object hashed here): stable while we hold it */
            if (locked_by_me(tx, w)) return obj;
            if (tries < atomic_load_explicit(&tx->st->spin, memory_order_relaxed)) {
                cpu_relax();
                continue;
            }
            conflict(tx, "nvh_tx_open_read");
            return NULL;
        }
        /* TL2: an object newer than the read version revalidates the read
         * set and moves the read version on (a commit that changes the
         * object after this load moves the clock: check_reads sees it) */
        if (OREC_VER(w) > tx->rv && !nvh_tx_test_otm_no_validate_ && !extend(tx)) {
            conflict(tx, "nvh_tx_open_read");
            return NULL;
        }
        if (push_r(tx, orec, w) != NVH_OK) return NULL;
        return obj;
    }
}

/* A private copy, consistent with everything read so far when returned:
 * copied with acquire loads between two reads of the ownership record (a
 * seqlock; acquire loads rather than a fence because TSan does not model
 * atomic_thread_fence). */
const void *nvh_tx_open_read_copy(nvh_pool *pool, const void *obj, size_t size)
{
    nvh_tx *tx = otm_tx(pool, obj, size, "nvh_tx_open_read_copy");
    if (!tx) return NULL;
    if (tx->ro) {
        /* address-free reads (nothing written, nw == 0): the copy agrees
         * with them iff no object commit began since the sample, i.e. the
         * clock word is unchanged after the copy (acquire loads: the
         * re-read cannot move above them) */
        char *copy = nvh_tx_arena_(tx, size);
        if (!copy) return NULL;
        atomic_copy_in(copy, obj, size);
        if (atomic_load_explicit(&tx->st->gclock, memory_order_acquire) != tx->rv &&
            !nvh_tx_test_otm_no_validate_) {
            conflict(tx, "nvh_tx_open_read_copy");
            return NULL;
        }
        return copy;
    }
    /* the copy's record is compared with the read version: the reads so
     * far must be recorded first */
    if (tx->unrec && !record_reads(tx)) {
        conflict(tx, "nvh_tx_open_read_copy");
        return NULL;
    }
    nvh_wentry *we = tx->nw ? wfind(tx, obj) : NULL;
    if (we) {
        if (we->size < size) { nvh_fail(NVH_E_INVAL, "nvh_tx_open_read_copy: size grew"); return NULL; }
        return we->copy;
    }
    char *copy = nvh_tx_arena_(tx, size);
    if (!copy) return NULL;
    _Atomic uint64_t *orec = nvh_orec_for(tx->st, nvh_off(pool, obj));
    unsigned spin = atomic_load_explicit(&tx->st->spin, memory_order_relaxed);
    for (unsigned tries = 0;; tries++) {
        uint64_t w1 = atomic_load_explicit(orec, memory_order_acquire);
        if (OREC_LOCKED(w1)) {
            if (locked_by_me(tx, w1)) {
                atomic_copy_in(copy, obj, size);
                return copy;
            }
            if (tries < spin) { cpu_relax(); continue; }
            conflict(tx, "nvh_tx_open_read_copy");
            return NULL;
        }
        /* the copy must agree with the objects read before it: a newer
         * object revalidates */
        if (OREC_VER(w1) > tx->rv && !nvh_tx_test_otm_no_validate_ && !extend(tx)) {
            conflict(tx, "nvh_tx_open_read_copy");
            return NULL;
        }
        atomic_copy_in(copy, obj, size);
        uint64_t w2 = atomic_load_explicit(orec, memory_order_relaxed);
        if (w1 != w2) {
            if (tries < spin) continue;
            conflict(tx, "nvh_tx_open_read_copy");
            return NULL;
        }
        if (push_r(tx, orec, w1) != NVH_OK) return NULL;
        return copy;
    }
}

void *nvh_tx_open_write(nvh_pool *pool, void *obj, size_t size)
{
    nvh_tx *tx = otm_fast(pool, obj, size);
    if (!tx && !(tx = otm_tx(pool, obj, size, "nvh_tx_open_write"))) return NULL;
    /* a writer's reads are validated against its own locks (recorded) */
    if (tx->unrec && !record_reads(tx)) {
        conflict(tx, "nvh_tx_open_write");
        return NULL;
    }
    nvh_wentry *we = wfind(tx, obj);
    if (we) {
        if (we->size < size) { nvh_fail(NVH_E_INVAL, "nvh_tx_open_write: size grew"); return NULL; }
        return we->copy;
    }
    _Atomic uint64_t *orec = nvh_orec_for(tx->st, nvh_off(pool, obj));
    unsigned spin = atomic_load_explicit(&tx->st->spin, memory_order_relaxed);
    uint64_t prev = 0;
    bool owns = false;
    for (unsigned tries = 0;; tries++) {
        uint64_t w = atomic_load_explicit(orec, memory_order_acquire);
        if (OREC_LOCKED(w)) {
            if (locked_by_me(tx, w)) { prev = my_prev(tx, orec); break; }
            if (tries < spin) { cpu_relax(); continue; }
            conflict(tx, "nvh_tx_open_write");
            return NULL;
        }
        uint64_t locked = OREC_MAKE(OREC_VER(w), tx->lane->index, 1);
        if (atomic_compare_exchange_weak_explicit(orec, &w, locked, memory_order_acq_rel,
                                                  memory_order_relaxed)) {
            prev = w;
            owns = true;
            break;
        }
    }
    we = push_w(tx);
    char *copy = we ? nvh_tx_arena_(tx, size) : NULL;
    if (!copy) {
        if (we) tx->nw--;
        if (owns) atomic_store_explicit(orec, prev, memory_order_release);
        return NULL;
    }
    *we = (nvh_wentry){(char *)obj, size, copy, orec, prev, owns};
    /* the object may have changed after our snapshot, and the pointer may
     * come from objects that did: every read must still be current (the
     * entry is in the write set first, so a read of this very object is
     * recognised as ours; a conflict releases the lock with the rest) */
    if (NVH_GC_VER(atomic_load_explicit(&tx->st->gclock, memory_order_acquire)) != tx->rv &&
        !extend(tx)) {
        conflict(tx, "nvh_tx_open_write");
        return NULL;
    }
    atomic_copy_in(copy, obj, size);
    return copy;
}

/* ==========================================================================
 * Commit and release
 * ========================================================================== */
int nvh_tx_otm_prepare_(nvh_tx *tx, uint64_t *wv_out)
{
    *wv_out = 0;
    if (!tx->nw) return nvh_tx_otm_check_reads_(tx);   /* read-only */
    uint64_t wv;
    int vrc = nvh_tx_otm_validate_(tx, &wv);
    if (vrc != NVH_OK) return vrc;
    *wv_out = wv;
    nvh_pool *pool = tx->pool;
    for (size_t i = 0; i < tx->nw; i++) {
        nvh_wentry *e = &tx->wset[i];
        if (!memcmp(e->copy, e->obj, e->size)) continue;   /* unchanged: no record */
        uint64_t off = nvh_off(pool, e->obj);
        int rc = (off & 7) + e->size <= 8
                     ? nvh_txlog_word(tx->lg, tx->lane, off, (unsigned)e->size)
                     : nvh_txlog_range(tx->lg, tx->lane, off, e->size, e->obj);
        if (rc != NVH_OK) return rc;
    }
    if (!tx->lane->unfenced) return NVH_OK;
    /* FENCE 1: old and new images durable before any byte changes in place;
     * help the lanes whose filter meets these objects: the last writer's
     * retirement, and its one-fence commit still pending (an object
     * written by a one-fence commit is in place but durable only at that
     * lane's next fence: replayed over ours, it would undo our write) */
    nvh_txlog_fence(tx->lg, tx->lane, nvh_tx_test_otm_no_help_ ? 0 : NVH_TXLOG_HELP_MEETING);
    /* protected pools: windows on every object first (nothing applied if
     * one cannot open), held until the transaction ends (an undo after a
     * failed later commit step writes here again) */
    if (nvh_txlog_protected_(tx->pool))
        for (size_t i = 0; i < tx->nw; i++) {
            int rc = nvh_txlog_win_open(tx->lg, tx->lane, tx->wset[i].obj, tx->wset[i].size);
            if (rc != NVH_OK) return rc;
        }
    for (size_t i = 0; i < tx->nw; i++) {
        nvh_wentry *e = &tx->wset[i];
        atomic_copy_out(e->obj, e->copy, e->size);
        if (__builtin_expect(nvh_tx_test_otm_applied_ != NULL, 0) &&
            nvh_tx_test_otm_applied_((unsigned)i) != NVH_OK)
            return nvh_fail(NVH_E_IO, "test hook: commit step failed after applying");
    }
    return NVH_OK;
}

int nvh_tx_test_otm_no_help_ = 0;
int (*nvh_tx_test_otm_applied_)(unsigned i) = NULL;

/* The one-fence commit of an object write set (tx.c, commit_one_fence):
 * append the changed 8-byte words of every written object to offs/vals
 * (from *n on, at most max in all). False if the set does not qualify: an
 * object not made of whole aligned words, or more words than max. The
 * objects are locked by this transaction, so their bytes in place are
 * stable; a word already in offs (given as a value too) is not repeated. */
bool nvh_tx_otm_words_(nvh_tx *tx, uint64_t *offs, uint64_t *vals, unsigned *n, unsigned max)
{
    nvh_pool *pool = tx->pool;
    unsigned k = *n;
    for (size_t i = 0; i < tx->nw; i++) {
        nvh_wentry *e = &tx->wset[i];
        uint64_t off = nvh_off(pool, e->obj);
        if ((off & 7) || (e->size & 7)) return false;
        for (size_t b = 0; b < e->size; b += 8) {
            uint64_t nv, ov;
            memcpy(&nv, e->copy + b, 8);
            ov = __atomic_load_n((const uint64_t *)(const void *)(e->obj + b), __ATOMIC_RELAXED);
            if (nv == ov) continue;                /* unchanged: not logged */
            unsigned j = 0;
            while (j < k && offs[j] != off + b) j++;
            if (j < k) return false;               /* also given as a value: two-fence path */
            if (k == max) return false;
            offs[k] = off + b;
            vals[k++] = nv;
        }
    }
    *n = k;
    return true;
}

/* Write version and read-set validation of a committing object write set
 * (both protocols): NVH_OK and *wv, or NVH_E_ABORTED on a conflict. */
int nvh_tx_otm_validate_(nvh_tx *tx, uint64_t *wv_out)
{
    if (tx->unrec && !record_reads(tx)) {       /* (open_write records them) */
        tx->conflict = true;
        tx->conflicts++;
        return nvh_fail(NVH_E_ABORTED, "a value read was changed by a concurrent commit");
    }
    /* a new version, and one more commit in flight until release */
    uint64_t g = atomic_fetch_add_explicit(&tx->st->gclock, 1 + NVH_GC_INFL_ONE,
                                           memory_order_acq_rel);
    uint64_t wv = NVH_GC_VER(g) + 1;
    tx->wv_held = wv;
    if (wv != tx->rv + 1 && !validate(tx)) {
        tx->conflict = true;
        tx->conflicts++;
        return nvh_fail(NVH_E_ABORTED, "a value read was changed by a concurrent commit");
    }
    *wv_out = wv;
    return NVH_OK;
}

int nvh_tx_otm_check_reads_(nvh_tx *tx)
{
    if (!otm_reads(tx)) return NVH_OK;
    /* the caller's reads in place come before this (they happened before
     * the call; x86 does not reorder loads; the fence keeps the compiler
     * honest): an unchanged clock means no object changed since rv */
    atomic_thread_fence(memory_order_acquire);
    if (reads_ok(tx)) return NVH_OK;
    tx->conflict = true;
    tx->conflicts++;
    return nvh_fail(NVH_E_ABORTED, "an object read was changed by a concurrent commit");
}

void nvh_tx_otm_release_(nvh_tx *tx, uint64_t wv, bool committed)
{
    uint64_t held = tx->wv_held;
    for (size_t i = 0; i < tx->nw; i++) {
        nvh_wentry *e = &tx->wset[i];
        if (!e->owns_lock) continue;
        /* an abort after taking a write version may have changed the object
         * in place and restored it (the two-fence commit applies before its
         * last steps): it releases with that version, so a reader that saw
         * the transient bytes fails validation, whatever it recorded */
        uint64_t w = committed ? OREC_MAKE(wv, tx->lane->index, 0)
                   : held && !nvh_tx_test_otm_abort_prev_ ? OREC_MAKE(held, OREC_LANE(e->prev), 0)
                   : e->prev;
        atomic_store_explicit(e->orec, w, memory_order_release);
    }
    if (held) {
        /* after the objects' final bytes and records: the commit is no
         * longer in flight (readers sampling the clock from now on read
         * unrecorded) */
        tx->wv_held = 0;
        atomic_fetch_sub_explicit(&tx->st->gclock, NVH_GC_INFL_ONE, memory_order_release);
    }
    tx->nw = 0;
    otm_end_reads(tx);
}

/* ==========================================================================
 * Run with retries
 * ========================================================================== */
static void backoff(nvh_tx *tx, unsigned attempt)
{
    uint64_t lo = atomic_load_explicit(&tx->st->backoff_min_ns, memory_order_relaxed);
    uint64_t hi = atomic_load_explicit(&tx->st->backoff_max_ns, memory_order_relaxed);
    uint64_t cap = attempt < 30 ? lo << attempt : hi;
    if (cap > hi) cap = hi;
    if (cap <= lo) cap = lo + 1;
    tx->rng = tx->rng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t ns = lo + (tx->rng >> 33) % (cap - lo);
    if (ns < 2000) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((uint64_t)(t.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)t.tv_nsec -
                    (uint64_t)t0.tv_nsec >= ns)
                break;
            cpu_relax();
        }
    } else {
        struct timespec ts = {0, (long)ns};
        nanosleep(&ts, NULL);
    }
}

/* An acquire fence, in a function of its own: GCC's TSan rejects
 * atomic_thread_fence inlined into an always_inline function at -O0
 * (-Werror=tsan), and run_attempt is one. */
static inline void reads_fence(void) { atomic_thread_fence(memory_order_acquire); }

/* One attempt of nvh_tx_run (the descriptor's status NONE), up to fn's
 * return: begin (the log lane's begin left to the transaction's first use
 * of the lane, tx.h lane_lazy: a read-only run does not write the lane's
 * lines), bind, the first open's work done at once (nvh_tx_run is the
 * object transactions' entry: the epoch announcement and the read version,
 * any moment before the first object read being as good a snapshot), fn. True if it ended on the
 * read-only path: fn returned NVH_OK having done nothing but object reads
 * (nvh_tx_reads_only_), and the reads are current (unrecorded: the clock
 * word unchanged; else validated); the end is then dropping the read set
 * and leaving the epoch (nothing to log, release or close). Else false,
 * *rc fn's code, for the full end (run_rest; a failed validation takes the
 * commit, which validates again and rolls back). */
static inline __attribute__((always_inline)) bool run_attempt(nvh_pool *pool, nvh_tx *tx,
                                                              nvh_tx_fn fn, void *arg, int *rc,
                                                              bool ro)
{
    nvh_tx_begin_fields_(tx);
    tx->lane_lazy = true;
    /* the first open's work, then the binding (which takes the read
     * version it sampled); without the table the first open allocates it
     * first (and reads recorded or with addresses) */
    if (__builtin_expect(__atomic_load_n(&tx->st->orecs, __ATOMIC_ACQUIRE) != NULL, 1)) {
        otm_sample(tx);
        tx->ro = ro && tx->unrec;
    }
    bind(pool, tx);
    *rc = fn(pool, arg);
    if (*rc != NVH_OK || !nvh_tx_reads_only_(tx)) return false;
    /* the caller's reads in place come before the validation (as
     * nvh_tx_otm_check_reads_) */
    reads_fence();
    if (otm_reads(tx) &&
        !(tx->unrec && atomic_load_explicit(&tx->st->gclock, memory_order_acquire) == tx->rv) &&
        !reads_ok(tx))
        return false;
    otm_end_reads(tx);
    tx->status = NVH_TXS_NONE;
    tx->depth = 0;
    tx->commits++;
    return true;
}

/* ==========================================================================
 * Which first attempt: nvh_tx_run's memory of its functions
 * ==========================================================================
 * A function that only reads is best run address-free (tx->ro: no read set
 * at all), but a write there is a conflict that runs the function again;
 * the caller does not say which kind fn is, so nvh_tx_run remembers, per
 * thread (in the descriptor) and per function: a small direct-mapped table
 * of n, the function's read-only runs in a row. Its first attempt is the
 * address-free one once n >= need; a run that writes sets n to 0, and one
 * whose address-free guess met a write also doubles need (up to
 * NVH_TX_FN_NEED_MAX), so a function that mixes reads and writes settles
 * on the ordinary attempt. What it costs a writing run: the slot's hash
 * and one compare before the attempt (a function that never ran read-only
 * has no entry), and n = 0 in run_rest, which a write reaches anyway. */
#define NVH_TX_FN_NEED_MAX 1024u

static inline nvh_tx_fnmem *fnmem_of(nvh_tx *tx, nvh_tx_fn fn)
{
    uint64_t h = (uint64_t)(uintptr_t)fn * 0x9E3779B97F4A7C15ull;
    return &tx->fnmem[h >> (64 - 3)];
}
_Static_assert(NVH_TX_FNMEM == 8, "fnmem_of takes 3 bits");

/* Start fn address-free? (one load and compare: the read-only run's cost) */
static inline bool fnmem_ro(const nvh_tx_fnmem *m, nvh_tx_fn fn)
{
    return m->ro_fn == (uintptr_t)fn;
}

/* fn ran read-only (an ordinary attempt). */
static inline void fnmem_read(nvh_tx_fnmem *m, nvh_tx_fn fn)
{
    if (m->fn != (uintptr_t)fn) *m = (nvh_tx_fnmem){0, (uintptr_t)fn, 0, 1};
    if (m->n < UINT16_MAX) m->n++;
    if (m->n >= m->need) m->ro_fn = (uintptr_t)fn;
}

/* fn wrote; guessed: in an attempt started address-free on its memory. */
static void fnmem_wrote(nvh_tx_fnmem *m, nvh_tx_fn fn, bool guessed)
{
    if (m->fn != (uintptr_t)fn || nvh_tx_test_fnmem_sticky_) return;
    m->ro_fn = 0;
    m->n = 0;
    if (guessed && m->need < NVH_TX_FN_NEED_MAX) m->need = (uint16_t)(m->need * 2);
}

int nvh_tx_test_fnmem_sticky_ = 0;
int nvh_tx_test_ro_write_ = 0;

/* The rest of nvh_tx_run after an attempt that did not end on the
 * read-only path (rc: begin's or fn's code): commit or abort, and retry
 * conflicts under the contention policy. Out of line, so the common run
 * saves few registers and keeps no error buffer on its stack. */
static __attribute__((noinline)) int run_rest(nvh_pool *pool, nvh_tx *tx, nvh_tx_fn fn,
                                              void *arg, int rc, bool ro)
{
    nvh_tx_fnmem *m = fnmem_of(tx, fn);
    /* ro: the first attempt was address-free (tx->ro is cleared by its
     * end); guessed: on fn's memory, not nvh_tx_run_read's word */
    bool guessed = ro && fnmem_ro(m, fn);
    for (unsigned attempt = 0;; attempt++) {
        bool conflicted;
        if (rc == NVH_OK && !nvh_tx_reads_only_(tx)) fnmem_wrote(m, fn, false);
        if (rc == NVH_OK) {
            rc = nvh_tx_commit_tx_(tx);
            conflicted = rc == NVH_E_ABORTED && tx->conflict;
        } else {
            /* an error from a transaction whose reads are no longer current
             * (a value read in place changed under it) is a conflict: the
             * caller acted on an inconsistent view */
            if (!tx->conflict && tx->status == NVH_TXS_ACTIVE && otm_reads(tx) && !reads_ok(tx)) {
                tx->conflict = true;
                tx->conflicts++;
            }
            conflicted = tx->conflict;
            nvh_err_saved err;
            nvh_err_save(&err);
            nvh_tx_abort(pool);
            if (!conflicted) return nvh_fail(rc, "%s", err.msg);
        }
        if (rc == NVH_OK || !conflicted) return rc;
        unsigned max = atomic_load_explicit(&tx->st->max_retries, memory_order_relaxed);
        if (max && attempt + 1 >= max)
            return nvh_fail(NVH_E_ABORTED, "nvh_tx_run: gave up after %u conflicts", attempt + 1);
        tx->retries++;
        if (ro) {
            /* an address-free attempt fails on any object commit during it
             * (the clock moved: let the thread's next read runs record, its
             * reads meet commits) or on a write (fn's memory learns it):
             * retry at once with a read set */
            if (atomic_load_explicit(&tx->st->gclock, memory_order_acquire) != tx->rv)
                tx->ro_off = NVH_TX_RO_OFF;
            else
                fnmem_wrote(m, fn, guessed);
            ro = false;
        } else {
            backoff(tx, attempt);
        }
        if (run_attempt(pool, tx, fn, arg, &rc, false)) {
            fnmem_read(m, fn);
            return NVH_OK;
        }
    }
}

/* nvh_tx_run without the thread's descriptor cached, or nested (read:
 * nvh_tx_run_read's first attempt). */
static __attribute__((noinline)) int run_lookup(nvh_pool *pool, nvh_tx_fn fn, void *arg,
                                                bool read)
{
    if (!fn) return nvh_fail(NVH_E_INVAL, "nvh_tx_run: fn is NULL");
    nvh_tx *tx = nvh_tx_cur_(pool, false);     /* caches it (nvh_tx_last_) */
    if (!tx) return nvh_errcode();
    if (tx->status != NVH_TXS_NONE) {
        /* nested: flattened into the enclosing transaction, no retry here */
        int rc = nvh_tx_begin(pool);
        if (rc == NVH_OK) rc = fn(pool, arg);
        if (rc != NVH_OK) { nvh_tx_abort(pool); return rc; }
        return nvh_tx_commit(pool);
    }
    nvh_tx_fnmem *m = fnmem_of(tx, fn);
    bool ro = read || fnmem_ro(m, fn);
    if (ro && tx->ro_off) {
        tx->ro_off--;
        ro = false;
    }
    int rc;
    if (run_attempt(pool, tx, fn, arg, &rc, ro)) {
        if (!ro) fnmem_read(m, fn);
        return NVH_OK;
    }
    return run_rest(pool, tx, fn, arg, rc, ro);
}

/* nvh_tx_run's two starts, each a copy of the attempt with ro constant
 * (no flag kept across fn's call), entered by a tail call: the dispatch
 * below saves no registers. */
static __attribute__((noinline)) int run_start_ro(nvh_pool *pool, nvh_tx *tx, nvh_tx_fn fn,
                                                  void *arg)
{
    int rc;
    if (__builtin_expect(run_attempt(pool, tx, fn, arg, &rc, true), 1)) return NVH_OK;
    return run_rest(pool, tx, fn, arg, rc, true);
}

static __attribute__((noinline)) int run_start(nvh_pool *pool, nvh_tx *tx, nvh_tx_fn fn,
                                               void *arg)
{
    int rc;
    if (__builtin_expect(run_attempt(pool, tx, fn, arg, &rc, false), 1)) {
        fnmem_read(fnmem_of(tx, fn), fn);
        return NVH_OK;
    }
    return run_rest(pool, tx, fn, arg, rc, false);
}

/* The first attempt is the address-free one for a function whose last runs
 * only read (its memory, above), else the ordinary one. */
int nvh_tx_run(nvh_pool *pool, nvh_tx_fn fn, void *arg)
{
    /* the cached descriptor, valid while no pool closed since (gen) */
    nvh_tx *tx = nvh_tx_cached_(pool);
    if (__builtin_expect(!tx || !fn || tx->status != NVH_TXS_NONE, 0))
        return run_lookup(pool, fn, arg, false);
    if (fnmem_ro(fnmem_of(tx, fn), fn)) {
        if (__builtin_expect(!tx->ro_off, 1)) return run_start_ro(pool, tx, fn, arg);
        tx->ro_off--;
    }
    return run_start(pool, tx, fn, arg);
}

/* nvh_tx_run whose first attempt is the address-free one whatever fn's
 * memory says (the caller knows fn only reads): an open checks the clock
 * word and notes nothing; the commit is the same check. Anything that
 * needs the reads as a set (the clock moved, an open for write, a commit
 * with writes) is a conflict there, retried at once as nvh_tx_run's
 * attempts, and the thread's next NVH_TX_RO_OFF read runs record (reads
 * that meet commits would otherwise run twice). */
int nvh_tx_run_read(nvh_pool *pool, nvh_tx_fn fn, void *arg)
{
    nvh_tx *tx = nvh_tx_cached_(pool);
    if (__builtin_expect(!tx || !fn || tx->status != NVH_TXS_NONE || tx->ro_off, 0))
        return run_lookup(pool, fn, arg, true);
    int rc;
    if (__builtin_expect(run_attempt(pool, tx, fn, arg, &rc, true), 1)) return NVH_OK;
    return run_rest(pool, tx, fn, arg, rc, true);
}
