/* tx.h — internals of the transaction layer (layer `tx`): the per-thread
 * transaction descriptor, the volatile ownership-record table of the object
 * transactions (NVTM, [Coburn09] §4.3), and the per-pool state.
 *
 * Files:
 *   tx.c       begin / add / commit / abort, nesting, pool open/close hooks
 *   txalloc.c  transactional alloc / free (allocator intents)
 *   otm.c      object transactions: open-for-read / open-for-write, ownership
 *              records, commit-time validation, nvh_tx_run with retry policy
 *   plock.c    epoch-based persistent locks
 *   refcount.c reference-counted objects, restartable recursive destruction */
#ifndef NVH_TX_H
#define NVH_TX_H

#include "../log/log.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* ==========================================================================
 * Ownership records
 * ==========================================================================
 * One word each, hashed by object offset:
 *   unlocked  version << 8 | last_writer_lane << 1 | 0
 *   locked    version << 8 | owner_lane << 1       | 1   (version: the one
 *             before locking, restored on abort)
 * The last writer's lane tells a later writer whose retirement to help-flush. */
/* 2^16 words = 512 KiB: NVTM's volatile state stays under 1 MB ([Coburn09]
 * §4.3); two objects share a record with probability 2^-16, a false
 * conflict at worst (the owner's own hits are recognised) */
#define NVH_OREC_BITS 16u
#define NVH_OREC_COUNT (1u << NVH_OREC_BITS)
#define OREC_LOCKED(w) ((w) & 1u)
#define OREC_LANE(w) ((unsigned)(((w) >> 1) & 0x7fu))
#define OREC_VER(w) ((w) >> 8)
#define OREC_MAKE(ver, lane, locked) (((uint64_t)(ver) << 8) | ((uint64_t)(lane) << 1) | (uint64_t)(locked))

/* The global version clock (nvh_txstate.gclock): the version in the low 56
 * bits (the TL2 clock; a commit's write version is the version after its
 * increment), the number of object commits between taking their write
 * version and their end ("in flight": they may be changing objects in
 * place) in the high 8 (at most NVH_TX_LANES). A word with no commit in
 * flight equals its version, so a reader that sampled such a word and
 * finds the clock unchanged knows no object changed in between (otm.c,
 * "unrecorded reads"). */
#define NVH_GC_INFL_ONE (1ull << 56)
#define NVH_GC_VER(g) ((g) & (NVH_GC_INFL_ONE - 1))

typedef struct nvh_rentry {       /* read set */
    _Atomic uint64_t *orec;       /* NULL: an unrecorded read (otm.c)        */
    uint64_t word;                /* unlocked word seen; unrecorded: the
                                     object's address                        */
} nvh_rentry;

typedef struct nvh_wentry {       /* write set (deferred object writes)      */
    char *obj;
    size_t size;
    char *copy;                   /* private copy the caller modifies        */
    _Atomic uint64_t *orec;
    uint64_t prev;                /* unlocked word before we locked it       */
    bool owns_lock;               /* false: another entry locked the orec    */
} nvh_wentry;

typedef struct nvh_talloc {
    char *ptr;
    uint64_t size;
    bool cancelled;               /* freed again in the same transaction     */
} nvh_talloc;

enum { NVH_TXS_NONE = 0, NVH_TXS_ACTIVE = 1, NVH_TXS_ABORTED = 2 };

/* One per lane, each on lines of its own (every field is written by its
 * owner on every transaction; neighbours must not share a line). */
#define NVH_TX_WB_INLINE 8u     /* buffered words kept in nvh_tx itself */
#define NVH_TX_FNMEM 8u         /* nvh_tx_run's remembered functions */

/* nvh_tx_run's memory of one function (otm.c, "Which first attempt"),
 * direct-mapped by fn: its last n runs only read; ro_fn is fn once
 * n >= need (its first attempt is then the address-free one), need doubles
 * each time that guess met a write. */
typedef struct nvh_tx_fnmem { uintptr_t ro_fn, fn; uint16_t n, need; } nvh_tx_fnmem;

typedef struct nvh_tx {
    _Alignas(64) nvh_pool *pool;
    nvh_txlog *lg;
    nvh_lane *lane;
    struct nvh_txstate *st;
    int depth;
    int status;
    bool conflict;                /* aborted by a conflict (retry may help)  */
    /* ranges added (dedupe): open addressing on offset */
    uint64_t *dd_off; uint32_t *dd_len; size_t dd_cap, dd_n;
    uint32_t *dd_used;            /* slots filled, so clearing costs O(n)   */
    /* allocator intents */
    nvh_talloc *allocs; size_t nallocs, allocs_cap;
    nvh_recref *frees; size_t nfrees, frees_cap;
    /* object transactions */
    uint64_t rv;                  /* read version (0: no object opened yet)  */
    uint64_t wv_held;             /* write version taken, commit in flight in
                                     the clock until released (0: none)      */
    bool epoch_in;                /* an epoch reader (common/epoch.c) from the
                                     first object open to the end: objects
                                     read in place are not reused under it */
    bool unrec;                   /* reads unrecorded: the read set holds the
                                     objects, valid while gclock == rv (otm.c) */
    bool lane_lazy;               /* begun by nvh_tx_run without the log
                                     lane's begin: nvh_tx_lane_begin_ does it
                                     before the transaction's first use of
                                     the lane (a read-only run never does) */
    bool ro;                      /* unrecorded reads without addresses
                                     (nvh_tx_run_read's first attempt): valid
                                     while gclock == rv, nothing to record
                                     them into; otm.c */
    uint8_t ro_off;               /* read runs left that record (after an
                                     address-free attempt met a commit) */
    /* nvh_tx_run's memory of its functions (otm.c, "Which first attempt") */
    nvh_tx_fnmem fnmem[NVH_TX_FNMEM];
    nvh_rentry *rset; size_t nr, rcap;
    nvh_wentry *wset; size_t nw, wcap;
    char *arena; size_t arena_used, arena_cap;  /* snapshots and copies */
    unsigned attempt;             /* nvh_tx_run retries                      */
    uint64_t rng;
    /* words written with nvh_tx_write_word (buffered until commit): in the
     * lane's own lines up to NVH_TX_WB_INLINE words (a one-fence commit
     * takes at most 8), on the heap beyond (wbcap > NVH_TX_WB_INLINE).
     * Inline, because malloc'd arrays of two threads' lanes can share a
     * line, which both threads write on every transaction. */
    uint64_t *wb_off, *wb_val; size_t wbn, wbcap;
    /* 8-byte words logged by the in-place fast path (tx.c, add_words_fast):
     * lane->recs[0 .. fw_n) and nothing else; they are not in the dedupe
     * table (dd_has also scans them) */
    size_t fw_n;
    uint64_t wb_inline_off[NVH_TX_WB_INLINE], wb_inline_val[NVH_TX_WB_INLINE];
    /* statistics */
    uint64_t commits, aborts, conflicts, retries;
} nvh_tx;

typedef struct nvh_txstate {
    nvh_tx txs[NVH_TX_LANES];
    _Atomic uint64_t *orecs;
    /* the global version clock is written by every writing commit: alone on
     * its line, so the settings below (read by every open) stay shared */
    _Alignas(64) _Atomic uint64_t gclock;
    _Alignas(64) _Atomic unsigned max_retries;
    _Atomic uint64_t backoff_min_ns, backoff_max_ns;
    _Atomic unsigned spin;
    _Atomic unsigned protocol;    /* nvh_tx_protocol                         */
} nvh_txstate;

/* The calling thread's bound transaction: from the outermost begin
 * (nvh_tx_begin, nvh_tx_run) or the first object open of a transaction to
 * its end (otm.c, nvh_tx_otm_release_; nvh_tx_otm_forget_ when the pool
 * closes), with what the unrecorded object open checks, so that the calls
 * of an open transaction read one thread-local line instead of looking the
 * descriptor up (tx.c, tx_of):
 *   lo, span  the pool's data at the binding, [lo, lo + span] (a pool that
 *             grew since takes the slow path, which checks the real size);
 *   clock     the pool's clock word;
 *   urv       unrecorded reads: the clock word they hold for (tx->rv);
 *             otherwise NVH_TX_NO_FAST, which the clock word never equals
 *             (its in-flight count is at most NVH_TX_LANES), so every open
 *             takes the slow path (first open, recorded reads).
 * pool is NULL (nothing bound) or the transaction's pool, with tx set.
 * Defined in otm.c; the library's thread-local block has a budget
 * (tests/abi test_dlopen). */
#define NVH_TX_NO_FAST UINT64_MAX
typedef struct nvh_tx_binding {
    const nvh_pool *pool;
    nvh_tx *tx;
    uintptr_t lo, span;
    const _Atomic uint64_t *clock;
    uint64_t urv;
} nvh_tx_binding;
extern _Thread_local nvh_tx_binding nvh_tx_bound_ __attribute__((tls_model("initial-exec")));
void nvh_tx_bind_(nvh_pool *pool, nvh_tx *tx);
static inline void nvh_tx_unbind_(nvh_tx *tx)
{
    if (nvh_tx_bound_.tx == tx) {
        nvh_tx_bound_.pool = NULL;
        nvh_tx_bound_.tx = NULL;
        nvh_tx_bound_.urv = NVH_TX_NO_FAST;
    }
}

/* The calling thread's descriptor of the pool it last began a transaction
 * on (nvh_tx_begin, nvh_tx_run): valid while the log registry's generation
 * is unchanged (no pool closed and no lane of this thread evicted since,
 * lane.c), the lookup a begin saves. Defined in otm.c. */
typedef struct nvh_tx_last {
    nvh_tx *tx;
    uint64_t gen;
} nvh_tx_last;
extern _Thread_local nvh_tx_last nvh_tx_last_ __attribute__((tls_model("initial-exec")));
static inline nvh_tx *nvh_tx_cached_(const nvh_pool *pool)
{
    nvh_tx *tx = nvh_tx_last_.tx;
    /* the generation first: a stale descriptor may be freed memory */
    if (__builtin_expect(nvh_tx_last_.gen == nvh_txlog_gen_() && tx != NULL, 1) &&
        __builtin_expect(tx->pool == pool, 1))
        return tx;
    return NULL;
}

/* tx.c */
nvh_tx *nvh_tx_cur_(nvh_pool *pool, bool need_active);
/* nvh_tx_begin / nvh_tx_commit of a descriptor already looked up (nvh_tx_run) */
int nvh_tx_begin_tx_(nvh_tx *tx);
int nvh_tx_commit_tx_(nvh_tx *tx);
int nvh_tx_fail_aborted_(nvh_tx *tx, const char *what);
/* A call failed with rc (error state set): roll back unless rc is
 * NVH_E_INVAL; returns rc. */
int nvh_tx_failed_(nvh_tx *tx, int rc);
void nvh_tx_rollback_(nvh_tx *tx);
void *nvh_tx_arena_(nvh_tx *tx, size_t size);
/* Pool open/close (the sequence, src/lifecycle): recover the log after the
 * allocator opened; quiesce and free it before the allocator quiesces. */
int nvh_tx_open_(nvh_pool *pool);
void nvh_tx_close_(nvh_pool *pool);
/* Test hook: run recovery now on a pool opened with
 * NVHEAP_TX_SKIP_RECOVERY=1, as the open would have. */
int nvh_tx_recover_(nvh_pool *pool);

/* refcount.c */
void nvh_refcount_forget_(nvh_pool *pool);    /* pool close: drop its registrations */

/* The begin of the descriptor's fields (status NONE): nvh_tx_begin_tx_,
 * and nvh_tx_run's begin, which leaves the log lane's begin to
 * nvh_tx_lane_begin_ (lane_lazy). */
static inline void nvh_tx_begin_fields_(nvh_tx *tx)
{
    tx->depth = 1;
    tx->status = NVH_TXS_ACTIVE;
    tx->conflict = false;
    tx->rv = 0;     /* sampled by the first object open (otm.c; nvh_tx_run: at
                       its begin): a transaction without object reads or
                       writes never touches the global clock's line */
}

/* Every use of the log lane by a transaction comes after this: the lane's
 * begin (nvh_txlog_begin) if nvh_tx_run left it out. Called by
 * nvh_tx_cur_(pool, true) (every call of an open transaction), and by the
 * commit and the rollback. */
static inline void nvh_tx_lane_begin_(nvh_tx *tx)
{
    if (__builtin_expect(tx->lane_lazy, 0)) {
        tx->lane_lazy = false;
        nvh_txlog_begin(tx->lg, tx->lane);
    }
}

/* txalloc.c */
int nvh_tx_alloc_commit_(nvh_tx *tx);   /* activate before the commit point */
void nvh_tx_alloc_finish_(nvh_tx *tx);  /* frees after it                    */
void nvh_tx_alloc_abort_(nvh_tx *tx);

/* Does the transaction hold nothing but object reads (no object write, no
 * word given as a value, no logged range, allocation, free, open window or
 * copy)? Then otm.c's nvh_tx_run ends it itself (validate, release) without
 * nvh_tx_commit_tx_. Every kind of write state a transaction can hold must
 * be tested here. */
static inline bool nvh_tx_reads_only_(const nvh_tx *tx)
{
    if (tx->status != NVH_TXS_ACTIVE || tx->depth != 1 || tx->nw) return false;
    /* the log lane not begun yet: nothing but object opens happened, since
     * every call that can leave another kind of write state (a word given
     * as a value, an add, an allocation or free, a copying open) begins
     * the lane first (nvh_tx_cur_, nvh_tx_lane_begin_); an object opened
     * for write (the bound open skips the lane's begin) shows in nw */
    if (tx->lane_lazy) return true;
    return !tx->wbn && !tx->fw_n && !tx->nallocs && !tx->nfrees && !tx->dd_n &&
           tx->arena_used <= 16 && !tx->lane->active_written && !tx->lane->nwins;
}

/* otm.c */
int nvh_tx_otm_prepare_(nvh_tx *tx, uint64_t *wv_out); /* validate, log, fence 1, apply */
int nvh_tx_otm_validate_(nvh_tx *tx, uint64_t *wv_out); /* write version, read-set check */
/* A commit without object writes: are the objects read in place still at
 * the versions opened? NVH_OK, or NVH_E_ABORTED (a conflict) */
int nvh_tx_otm_check_reads_(nvh_tx *tx);
/* test hook (negative control of test_tx_otm_inplace): reads are never
 * validated, neither at an open nor at commit */
extern int nvh_tx_test_otm_no_validate_;
/* test hooks (test_tx_otm_inplace): reads are always recorded (the path of
 * a transaction that began with a commit in flight); an abort after taking
 * a write version releases its records with their old words */
extern int nvh_tx_test_otm_recorded_, nvh_tx_test_otm_abort_prev_;
/* test hook: a transaction's first open reads unrecorded even with a commit
 * in flight (negative control) */
extern int nvh_tx_test_otm_ignore_infl_;
/* test hook: called by the two-fence object commit after applying write-set
 * entry i in place; non-zero fails the commit there (rolled back) */
extern int (*nvh_tx_test_otm_applied_)(unsigned i);
bool nvh_tx_otm_words_(nvh_tx *tx, uint64_t *offs, uint64_t *vals, unsigned *n, unsigned max);
/* test hook (negative control of test_tx_proto): an abort's retirement is
 * left to the next fence */
extern int nvh_tx_test_abort_no_fence_;
/* test hook (negative control of test_tx_proto): the two-fence object
 * commit helps no other lane at its first fence */
extern int nvh_tx_test_otm_no_help_;
/* test hooks (negative controls of test_tx_otm_inplace): nvh_tx_run's
 * memory of a function never learns a write; an address-free attempt takes
 * an open for write (no conflict, its reads never recorded) */
extern int nvh_tx_test_fnmem_sticky_, nvh_tx_test_ro_write_;
void nvh_tx_otm_release_(nvh_tx *tx, uint64_t wv, bool committed);
/* Pool close, before the pool's transaction state is freed (every close of
 * a writable pool): the calling thread forgets an object transaction of it
 * that is still open (leaves its epoch), and every thread's descriptor
 * cached by nvh_tx_run becomes stale. */
void nvh_tx_otm_forget_(nvh_pool *pool);

static inline _Atomic uint64_t *nvh_orec_for(nvh_txstate *st, uint64_t off)
{
    uint64_t h = (off >> 6) * 0x9E3779B97F4A7C15ull;
    /* an atomic load (a plain move on x86): the table pointer is published
     * by a CAS at the first object transaction (otm.c) */
    _Atomic uint64_t *t = __atomic_load_n(&st->orecs, __ATOMIC_ACQUIRE);
    return &t[h >> (64 - NVH_OREC_BITS)];
}

#endif /* NVH_TX_H */
