/* tx.c — the transaction API: begin / add / commit / abort with flattened
 * nesting, the per-thread descriptor, settings and statistics, and the hooks
 * the pool layer calls at open (recovery) and close.
 *
 * Commit order (docs/TX.md):
 *   1. object writes: validate reads, log old/new, FENCE 1, apply in place
 *   2. allocations: activate (after their intent records are durable)
 *   3. commit record + data flush: FENCE 2 — durable from here
 *   4. frees applied (each atomically clears its intent's link word)
 *   5. retire (IDLE, flushed, not fenced), release object locks */
#include "tx.h"

#include <stdlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ==========================================================================
 * Descriptor lookup
 * ========================================================================== */
/* The registry lookup (the thread's lane), remembered in nvh_tx_last_. */
static __attribute__((noinline)) nvh_tx *tx_lookup(nvh_pool *pool)
{
    uint64_t gen = nvh_txlog_gen_();    /* before the lookup */
    nvh_txlog *lg;
    nvh_lane *lane = nvh_txlog_lane_get(pool, &lg);
    if (!lane) return NULL;
    nvh_txstate *st = lg->tx;
    nvh_tx *tx = &st->txs[lane->index];
    if (__builtin_expect(tx->lane != lane, 0)) {
        tx->pool = pool;
        tx->lg = lg;
        tx->lane = lane;
        tx->st = st;
        tx->rng = 0x9E3779B97F4A7C15ull * (lane->index + 1);
    }
    nvh_tx_last_.tx = tx;
    nvh_tx_last_.gen = gen;
    return tx;
}

/* The calling thread's descriptor for pool: the bound transaction's (one
 * thread-local line), else the one its last begin used, else the lookup. */
static inline nvh_tx *tx_of(nvh_pool *pool)
{
    if (__builtin_expect(nvh_tx_bound_.pool == pool && pool != NULL, 1)) return nvh_tx_bound_.tx;
    nvh_tx *tx = nvh_tx_cached_(pool);
    if (__builtin_expect(tx != NULL, 1)) return tx;
    return tx_lookup(pool);
}

nvh_tx *nvh_tx_cur_(nvh_pool *pool, bool need_active)
{
    nvh_tx *tx = tx_of(pool);
    if (!tx) return NULL;
    if (need_active) {
        if (tx->status == NVH_TXS_NONE) {
            nvh_fail(NVH_E_INVAL, "no transaction is open on this thread");
            return NULL;
        }
        nvh_tx_lane_begin_(tx);
    }
    return tx;
}

int nvh_tx_fail_aborted_(nvh_tx *tx, const char *what)
{
    (void)tx;
    return nvh_fail(NVH_E_ABORTED, "%s: the transaction was aborted", what);
}

void *nvh_tx_arena_(nvh_tx *tx, size_t size)
{
    size = NVH_ALIGN_UP(size, (size_t)16);
    if (tx->arena_used + size > tx->arena_cap) {
        /* never realloc: earlier pointers handed out must stay valid; chain
         * a bigger block and keep the old ones until the transaction ends */
        size_t cap = tx->arena_cap ? tx->arena_cap * 2 : 4096;
        while (cap < size + 16) cap *= 2;
        char *b = malloc(cap);
        if (!b) { nvh_fail(NVH_E_NOMEM, "out of memory for transaction copies"); return NULL; }
        *(char **)b = tx->arena;               /* link to the previous block */
        tx->arena = b;
        tx->arena_cap = cap;
        tx->arena_used = 16;
    }
    void *p = tx->arena + tx->arena_used;
    tx->arena_used += size;
    return p;
}

static void arena_reset(nvh_tx *tx)
{
    if (!tx->arena) return;
    /* keep the newest block, free the older ones */
    char *old = *(char **)tx->arena;
    while (old) {
        char *n = *(char **)old;
        free(old);
        old = n;
    }
    *(char **)tx->arena = NULL;
    tx->arena_used = 16;
}

/* Not an error code: a fast path declined (the general path follows) */
#define NVH_TX_NOT_TAKEN 1

/* ==========================================================================
 * Dedupe of added ranges (open addressing on the offset)
 * ========================================================================== */
static bool dd_has(nvh_tx *tx, uint64_t off, uint64_t len)
{
    /* the fast path's words (one aligned 8-byte word each) */
    for (size_t i = 0; i < tx->fw_n; i++)
        if (tx->lane->recs[i].sh.off == NVH_ALIGN_DOWN(off, (uint64_t)8) && (off & 7) + len <= 8)
            return true;
    if (!tx->dd_n) return false;
    size_t mask = tx->dd_cap - 1;
    for (size_t i = (size_t)((off * 0x9E3779B97F4A7C15ull) >> 20) & mask;; i = (i + 1) & mask) {
        if (tx->dd_off[i] == 0) return false;
        if (tx->dd_off[i] == off) return tx->dd_len[i] >= len;
    }
}

static void dd_put(nvh_tx *tx, uint64_t off, uint64_t len)
{
    if (len > UINT32_MAX) return;
    if ((tx->dd_n + 1) * 2 > tx->dd_cap) {
        size_t cap = tx->dd_cap ? tx->dd_cap * 2 : 64;
        uint64_t *no = calloc(cap, sizeof *no);
        uint32_t *nl = calloc(cap, sizeof *nl);
        uint32_t *nu = calloc(cap / 2 + 1, sizeof *nu);
        if (!no || !nl || !nu) { free(no); free(nl); free(nu); return; }  /* an optimisation */
        size_t n = 0;
        for (size_t i = 0; i < tx->dd_cap; i++) {
            if (!tx->dd_off[i]) continue;
            size_t j = (size_t)((tx->dd_off[i] * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
            while (no[j]) j = (j + 1) & (cap - 1);
            no[j] = tx->dd_off[i];
            nl[j] = tx->dd_len[i];
            nu[n++] = (uint32_t)j;
        }
        free(tx->dd_off);
        free(tx->dd_len);
        free(tx->dd_used);
        tx->dd_off = no;
        tx->dd_len = nl;
        tx->dd_used = nu;
        tx->dd_cap = cap;
    }
    size_t mask = tx->dd_cap - 1;
    for (size_t i = (size_t)((off * 0x9E3779B97F4A7C15ull) >> 20) & mask;; i = (i + 1) & mask) {
        if (tx->dd_off[i] == off) { if (tx->dd_len[i] < len) tx->dd_len[i] = (uint32_t)len; return; }
        if (tx->dd_off[i] == 0) {
            tx->dd_off[i] = off;
            tx->dd_len[i] = (uint32_t)len;
            tx->dd_used[tx->dd_n++] = (uint32_t)i;
            return;
        }
    }
}

static void dd_clear(nvh_tx *tx)
{
    for (size_t i = 0; i < tx->dd_n; i++) tx->dd_off[tx->dd_used[i]] = 0;
    tx->dd_n = 0;
}

/* ==========================================================================
 * Begin / end bookkeeping
 * ========================================================================== */
static void tx_reset(nvh_tx *tx)
{
    tx->status = NVH_TXS_NONE;
    tx->depth = 0;
    tx->nallocs = tx->nfrees = 0;
    tx->nr = tx->nw = 0;
    tx->wbn = 0;
    tx->fw_n = 0;
    dd_clear(tx);
    arena_reset(tx);
}

int nvh_tx_begin(nvh_pool *pool)
{
    nvh_tx *tx = tx_of(pool);
    if (!tx) return nvh_errcode();
    return nvh_tx_begin_tx_(tx);
}

int nvh_tx_begin_tx_(nvh_tx *tx)
{
    if (tx->status != NVH_TXS_NONE) {
        tx->depth++;
        return tx->status == NVH_TXS_ABORTED ? nvh_tx_fail_aborted_(tx, "nvh_tx_begin") : NVH_OK;
    }
    nvh_tx_begin_fields_(tx);
    tx->lane_lazy = false;
    nvh_tx_bind_(tx->pool, tx);     /* the transaction's calls skip the lookup */
    return nvh_txlog_begin(tx->lg, tx->lane);
}

int nvh_tx_test_abort_no_fence_ = 0;

/* Roll everything back (abort or a failed commit step). */
void nvh_tx_rollback_(nvh_tx *tx)
{
    nvh_tx_lane_begin_(tx);
    bool logged = tx->lane->active_written;
    nvh_txlog_undo(tx->lg, tx->lane);
    nvh_tx_alloc_abort_(tx);
    nvh_txlog_retire(tx->lg, tx->lane);
    /* the retirement durable now, not at the next fence: recovery undoes a
     * transaction it finds unretired AFTER redoing every committed one, so
     * a one-fence commit whose redo lines became durable with the same
     * fence as this retirement would be replayed and then undone by our
     * stale records (a word of ours it wrote gets our old value back) */
    if (logged && !nvh_tx_test_abort_no_fence_) nvh_txlog_fence(tx->lg, tx->lane, 0);
    nvh_tx_otm_release_(tx, 0, false);
    nvh_txlog_win_close_all(tx->lg, tx->lane);   /* log pages and added ranges */
    tx->nallocs = tx->nfrees = 0;
    tx->nr = tx->nw = 0;
    tx->wbn = 0;                                 /* buffered words: dropped */
    tx->fw_n = 0;
    dd_clear(tx);
    tx->status = NVH_TXS_ABORTED;
    tx->aborts++;
}

int nvh_tx_abort(nvh_pool *pool)
{
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) return nvh_errcode();
    if (tx->status == NVH_TXS_ACTIVE) nvh_tx_rollback_(tx);
    if (--tx->depth == 0) tx_reset(tx);
    return NVH_OK;
}

static int wb_to_undo(nvh_tx *tx);


/* One-fence commit of a write set known by value: words given with
 * nvh_tx_write_word and the changed words of objects opened for write
 * (both are still unchanged in place, so nothing needs undoing). Redo
 * lines, ONE fence, the values in place (record.c). Declines (before any
 * change) when the set is larger than the redo lines hold or an object is
 * not made of whole aligned words. */
static int commit_one_fence(nvh_tx *tx)
{
    uint64_t offs[NVH_REDO_MAX], vals[NVH_REDO_MAX];
    unsigned n = (unsigned)tx->wbn;
    if (n > NVH_REDO_MAX) return NVH_TX_NOT_TAKEN;
    if (n) {
        memcpy(offs, tx->wb_off, n * sizeof *offs);
        memcpy(vals, tx->wb_val, n * sizeof *vals);
    }
    if (tx->nw && !nvh_tx_otm_words_(tx, offs, vals, &n, NVH_REDO_MAX)) return NVH_TX_NOT_TAKEN;
    uint64_t wv = 0;
    int rc = tx->nw ? nvh_tx_otm_validate_(tx, &wv)           /* conflicts abort */
                    : nvh_tx_otm_check_reads_(tx);
    if (rc == NVH_OK && n) rc = nvh_txlog_redo_commit(tx->lg, tx->lane, offs, vals, n, wv);
    if (rc != NVH_OK) {
        int code = nvh_errcode();
        nvh_tx_rollback_(tx);
        tx_reset(tx);
        return nvh_fail(code, "nvh_tx_commit: %s", nvh_errormsg());
    }
    nvh_tx_otm_release_(tx, wv, true);
    nvh_txlog_win_close_all(tx->lg, tx->lane);
    tx->commits++;
    tx_reset(tx);
    return NVH_OK;
}

int nvh_tx_commit(nvh_pool *pool)
{
    /* the bound transaction (no lookup); nvh_tx_commit_tx_ begins the lane
     * if nvh_tx_run left that out */
    if (__builtin_expect(nvh_tx_bound_.pool == pool && pool != NULL, 1))
        return nvh_tx_commit_tx_(nvh_tx_bound_.tx);
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) return nvh_errcode();
    return nvh_tx_commit_tx_(tx);
}

int nvh_tx_commit_tx_(nvh_tx *tx)
{
    if (tx->status == NVH_TXS_NONE)
        return nvh_fail(NVH_E_INVAL, "no transaction is open on this thread");
    nvh_tx_lane_begin_(tx);
    if (tx->depth > 1) {
        tx->depth--;
        return tx->status == NVH_TXS_ABORTED ? nvh_tx_fail_aborted_(tx, "nvh_tx_commit") : NVH_OK;
    }
    if (tx->status == NVH_TXS_ABORTED) {
        tx_reset(tx);
        return nvh_fail(NVH_E_ABORTED, "nvh_tx_commit: the transaction was aborted");
    }
    nvh_txlog *lg = tx->lg;
    nvh_lane *lane = tx->lane;
    /* the in-place fast path's transaction (add_words_fast: nothing but its
     * words logged; no object opened, nothing given as a value, allocated
     * or freed): the lazy commit without the general checks and hooks */
    if (tx->fw_n && tx->fw_n == lane->nrecs && !(tx->wbn | tx->nw | tx->nallocs | tx->nfrees |
                                                  tx->rv | tx->dd_n) &&
        atomic_load_explicit(&tx->st->protocol, memory_order_relaxed) == NVH_TX_PROTO_AUTO &&
        !nvh_txlog_protected_(tx->pool)) {
        /* fw_n words (1 to NVH_REDO_MAX, add_words_fast's bound) and nothing
         * else: nvh_txlog_commit_lazy_words' conditions hold */
        lane->clock++;
        nvh_txlog_commit_lazy_words(lg, lane, lane->clock);
        nvh_tx_unbind_(tx);
        tx->commits++;
        /* tx_reset for this shape: nothing allocated, freed, read, written
         * by value, deduped by the table or copied (rv 0: no object open,
         * so no arena use); no window (unprotected) */
        tx->status = NVH_TXS_NONE;
        tx->depth = 0;
        tx->fw_n = 0;
        return NVH_OK;
    }
    uint64_t wv = 0;
    int rc;
    /* the protocol (docs/TX.md, "Which protocol a transaction gets"):
     * nothing logged in place, no allocation or free, and at most
     * NVH_REDO_MAX changed words given as values or in written objects ->
     * one fence; anything else -> the two-fence protocol */
    if ((tx->wbn || tx->nw) && !lane->active_written && !tx->nallocs && !tx->nfrees &&
        lane->redo &&
        atomic_load_explicit(&tx->st->protocol, memory_order_relaxed) == NVH_TX_PROTO_AUTO) {
        rc = commit_one_fence(tx);
        if (rc != NVH_TX_NOT_TAKEN) return rc;
    }
    if (tx->wbn && (rc = wb_to_undo(tx)) != NVH_OK) {
        int code = nvh_errcode();
        nvh_tx_rollback_(tx);
        tx_reset(tx);
        return nvh_fail(code, "nvh_tx_commit: %s", nvh_errormsg());
    }
    rc = nvh_txlog_commit_reserve(lg, lane);          /* what the full commit appends */
    if (rc == NVH_OK) rc = nvh_tx_otm_prepare_(tx, &wv); /* step 1 */
    if (rc == NVH_OK && (tx->nallocs || tx->nfrees))
        rc = nvh_tx_alloc_commit_(tx);                /* step 2 */
    if (rc != NVH_OK) {
        int code = nvh_errcode();
        nvh_tx_rollback_(tx);
        tx_reset(tx);
        return nvh_fail(code == NVH_E_ABORTED ? NVH_E_ABORTED : code,
                        "nvh_tx_commit: %s", nvh_errormsg());
    }
    if (lane->active_written) {
        /* commit order (recovery redoes committed transactions in it): the
         * lane's clock, which is above this lane's earlier commits and those
         * of the lanes it helped (record.c), and above the object write
         * version, so that objects written by several lanes (through object
         * transactions only) keep the global clock's order. No shared
         * counter for in-place transactions: a LOCKed increment would also
         * wait for this lane's pending flushes. */
        uint64_t cseq = lane->clock + 1;
        if (wv > cseq) cseq = wv;
        lane->clock = cseq;
        /* at most NVH_REDO_MAX words logged in place (no range, alloc or
         * free): the lazy commit, whose FENCE 2 waits for no data write-back
         * and which retires later; anything else: the full commit */
        if (atomic_load_explicit(&tx->st->protocol, memory_order_relaxed) != NVH_TX_PROTO_AUTO ||
            tx->nallocs || tx->nfrees || !nvh_txlog_commit_lazy(lg, lane, cseq)) {
            nvh_txlog_commit(lg, lane, cseq);         /* step 3: FENCE 2 */
            nvh_tx_alloc_finish_(tx);                 /* step 4 */
            nvh_txlog_retire(lg, lane);               /* step 5 */
        }
    }
    nvh_tx_otm_release_(tx, wv, true);
    /* the application's ranges and the log pages are read-only again */
    nvh_txlog_win_close_all(lg, lane);
    tx->commits++;
    tx_reset(tx);
    return NVH_OK;
}

nvh_tx_stage nvh_tx_stage_get(nvh_pool *pool)
{
    nvh_tx *tx = nvh_tx_cur_(pool, false);
    if (!tx) return NVH_TX_NONE;
    return tx->status == NVH_TXS_ACTIVE ? NVH_TX_WORK
         : tx->status == NVH_TXS_ABORTED ? NVH_TX_ABORTED : NVH_TX_NONE;
}

int nvh_tx_depth(nvh_pool *pool)
{
    nvh_tx *tx = nvh_tx_cur_(pool, false);
    return tx ? tx->depth : 0;
}

/* ==========================================================================
 * Adding ranges
 * ========================================================================== */
/* Validate and log one range; no fence. */
static int add_one(nvh_tx *tx, void *ptr, size_t len, nvh_tx_hint hint)
{
    nvh_pool *pool = tx->pool;
    if (len == 0) return NVH_OK;
    if (!ptr) return nvh_fail(NVH_E_INVAL, "nvh_tx_add_range: pointer is NULL");
    if (hint > NVH_TX_HINT_OBJECT) return nvh_fail(NVH_E_INVAL, "nvh_tx_add_range: bad hint %d", hint);
    uint64_t off = nvh_off(pool, ptr);
    if (!nvh_contains(pool, ptr, len) || off < NVH_PAGE)
        return nvh_fail(NVH_E_BADPTR, "nvh_tx_add_range: [%p, +%zu) is not inside the pool's "
                        "data", ptr, len);
    if (dd_has(tx, off, len)) return NVH_OK;
    int rc = NVH_OK;
    bool one_word = (off & 7) + len <= 8;
    if (hint == NVH_TX_HINT_OBJECT || (hint == NVH_TX_HINT_AUTO && !one_word)) {
        rc = nvh_txlog_range(tx->lg, tx->lane, off, len, ptr);
    } else {
        /* word records: one per 8-byte word the range touches */
        uint64_t end = off + len;
        for (uint64_t w = off; w < end && rc == NVH_OK;) {
            uint64_t next = NVH_ALIGN_DOWN(w, (uint64_t)8) + 8;
            if (next > end) next = end;
            rc = nvh_txlog_word(tx->lg, tx->lane, w, (unsigned)(next - w));
            w = next;
        }
    }
    if (rc == NVH_OK) dd_put(tx, off, len);
    return rc;
}

static nvh_tx *tx_working(nvh_pool *pool, const char *what, int *rc)
{
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) { *rc = nvh_errcode(); return NULL; }
    if (tx->status == NVH_TXS_ABORTED) { *rc = nvh_tx_fail_aborted_(tx, what); return NULL; }
    return tx;
}

/* Failures other than bad arguments (NVH_E_INVAL) abort the transaction
 * (include/nvheap.h): the log may hold a partial record set the caller cannot
 * reason about, and a caller that goes on after, say, NVH_E_BADPTR would
 * commit a transaction missing the write it asked for. */
int nvh_tx_failed_(nvh_tx *tx, int rc)
{
    if (rc == NVH_E_INVAL) return rc;
    nvh_err_saved err;
    nvh_err_save(&err);
    nvh_tx_rollback_(tx);
    nvh_err_restore(&err);
    return nvh_fail_context(err.code, "transaction aborted");
}

/* --------------------------------------------------------------------------
 * The in-place fast path: a transaction whose adds are whole aligned 8-byte
 * words, at most NVH_REDO_MAX of them (the shape the lazy commit takes,
 * "Which protocol a transaction gets" in docs/TX.md), on an unprotected
 * pool with a version 5 log. The same records, lines and fences as the
 * general path; what it leaves out is per-range work one check covers:
 * the descriptor comes from the thread's binding, the bounds from the
 * binding's copy of the pool's extent, dedupe is a scan of the few words
 * logged so far (not the hash table), and the records are appended
 * together (nvh_txlog_words). Anything else — another hint, a range, a
 * word already logged by the general path, more words — declines before
 * any change, and the general path runs.
 * -------------------------------------------------------------------------- */
static inline int add_words_fast(nvh_tx *tx, const nvh_tx_range *ranges, unsigned n)
{
    nvh_lane *lane = tx->lane;
    size_t have = tx->fw_n;
    if (tx->dd_n || lane->nrecs != have || n > NVH_REDO_MAX - have || !lane->redo_commits)
        return NVH_TX_NOT_TAKEN;
    uintptr_t lo = nvh_tx_bound_.lo, span = nvh_tx_bound_.span;
    uintptr_t base = (uintptr_t)NVH_CTX_(tx->pool)->base;
    uint64_t offs[NVH_REDO_MAX];
    unsigned k = 0;
    for (unsigned i = 0; i < n; i++) {
        uintptr_t a = (uintptr_t)ranges[i].ptr;
        /* [a, a + 8) inside the bound data (a below lo wraps past span) */
        if (ranges[i].len != 8 || (a & 7) || (unsigned)ranges[i].hint > NVH_TX_HINT_WORD ||
            span < 8 || a - lo > span - 8)
            return NVH_TX_NOT_TAKEN;
        /* the word's line fetched for writing now: its old value is read
         * below while logging, the caller stores into it after FENCE 1, and
         * the words of one call are then fetched in parallel, not one
         * miss after another with the logging of the previous word between */
        nvh_prefetchw_((const void *)a);
        uint64_t off = a - base;
        bool dup = false;
        for (size_t j = 0; j < have && !dup; j++) dup = lane->recs[j].sh.off == off;
        for (unsigned j = 0; j < k && !dup; j++) dup = offs[j] == off;
        if (!dup) offs[k++] = off;
    }
    if (!k) return NVH_OK;                      /* every word logged (and fenced) before */
    /* the records, then FENCE 1: the undo records are durable before the
     * caller stores (on failure, what was written is fenced too) */
    int rc = nvh_txlog_words_fenced(tx->lg, lane, offs, k);
    if (rc != NVH_OK) return nvh_tx_failed_(tx, rc);
    tx->fw_n = lane->nrecs;
    return NVH_OK;
}

int nvh_tx_add_ranges(nvh_pool *pool, const nvh_tx_range *ranges, unsigned n)
{
    int rc;
    if (__builtin_expect(nvh_tx_bound_.pool == pool && pool != NULL, 1)) {
        nvh_tx *tx = nvh_tx_bound_.tx;
        if (__builtin_expect(tx->status == NVH_TXS_ACTIVE && n && ranges &&
                             !nvh_txlog_protected_(pool), 1)) {
            nvh_tx_lane_begin_(tx);
            rc = add_words_fast(tx, ranges, n);
            if (rc != NVH_TX_NOT_TAKEN) return rc;
        }
    }
    nvh_tx *tx = tx_working(pool, "nvh_tx_add_range", &rc);
    if (!tx) return rc;
    if (n && !ranges) return nvh_fail(NVH_E_INVAL, "nvh_tx_add_ranges: ranges is NULL");
    bool logged = false;
    size_t before = tx->lane->nrecs;
    for (unsigned i = 0; i < n; i++) {
        rc = add_one(tx, ranges[i].ptr, ranges[i].len, ranges[i].hint);
        if (rc != NVH_OK) {
            if (tx->lane->nrecs != before) nvh_txlog_fence(tx->lg, tx->lane, NVH_TXLOG_HELP_MEETING);
            return nvh_tx_failed_(tx, rc);
        }
    }
    logged = tx->lane->nrecs != before || tx->lane->unfenced;
    /* FENCE 1: the undo records are durable before the caller stores */
    if (logged) nvh_txlog_fence(tx->lg, tx->lane, NVH_TXLOG_HELP_MEETING);
    /* protected pools: the caller may now store into the ranges without
     * windows of its own; they close when the transaction ends */
    if (nvh_txlog_protected_(pool))
        for (unsigned i = 0; i < n; i++) {
            rc = nvh_txlog_win_open(tx->lg, tx->lane, ranges[i].ptr, ranges[i].len);
            if (rc != NVH_OK) return nvh_tx_failed_(tx, rc);
        }
    return NVH_OK;
}

int nvh_tx_add_range_hint(nvh_pool *pool, void *ptr, size_t len, nvh_tx_hint hint)
{
    nvh_tx_range r = {ptr, len, hint};
    return nvh_tx_add_ranges(pool, &r, 1);
}

int nvh_tx_add_range(nvh_pool *pool, void *ptr, size_t len)
{
    return nvh_tx_add_range_hint(pool, ptr, len, NVH_TX_HINT_AUTO);
}

int nvh_tx_add_word(nvh_pool *pool, void *word)
{
    if ((uintptr_t)word % 8)
        return nvh_fail(NVH_E_INVAL, "nvh_tx_add_word: %p is not 8-byte aligned", word);
    return nvh_tx_add_range_hint(pool, word, 8, NVH_TX_HINT_WORD);
}

/* ==========================================================================
 * Words given as values (one-fence transactions, docs/TX.md)
 * ========================================================================== */
static inline size_t wb_find(const nvh_tx *tx, uint64_t off)
{
    for (size_t i = 0; i < tx->wbn; i++)
        if (tx->wb_off[i] == off) return i;
    return SIZE_MAX;
}

/* Room for more buffered words: the inline arrays first, then the heap. */
static int wb_grow(nvh_tx *tx)
{
    if (tx->wbcap == 0) {
        tx->wb_off = tx->wb_inline_off;
        tx->wb_val = tx->wb_inline_val;
        tx->wbcap = NVH_TX_WB_INLINE;
        return NVH_OK;
    }
    size_t cap = tx->wbcap * 2;
    bool heap = tx->wb_off != tx->wb_inline_off;
    uint64_t *o = heap ? realloc(tx->wb_off, cap * sizeof *o) : malloc(cap * sizeof *o);
    if (o) {
        if (!heap) memcpy(o, tx->wb_off, tx->wbn * sizeof *o);
        tx->wb_off = o;
    }
    uint64_t *v = !o ? NULL : heap ? realloc(tx->wb_val, cap * sizeof *v) : malloc(cap * sizeof *v);
    if (v) {
        if (!heap) memcpy(v, tx->wb_val, tx->wbn * sizeof *v);
        tx->wb_val = v;
    }
    if (!o || !v) {
        /* a half-done move: keep both arrays usable (the heap one is
         * freed at close if it is not the inline one) */
        if (o && !heap) { free(o); tx->wb_off = tx->wb_inline_off; }
        return nvh_tx_failed_(tx, nvh_fail(NVH_E_NOMEM, "nvh_tx_write_word: out of memory"));
    }
    tx->wbcap = cap;
    return NVH_OK;
}

int nvh_tx_write_word(nvh_pool *pool, void *word, uint64_t value)
{
    int rc;
    nvh_tx *tx = tx_working(pool, "nvh_tx_write_word", &rc);
    if (!tx) return rc;
    if (!word || (uintptr_t)word % 8)
        return nvh_fail(NVH_E_INVAL, "nvh_tx_write_word: %p is not an 8-byte aligned word", word);
    uint64_t off = nvh_off(pool, word);
    if (!nvh_contains(pool, word, 8) || off < NVH_PAGE)
        return nvh_tx_failed_(tx, nvh_fail(NVH_E_BADPTR, "nvh_tx_write_word: %p is not inside "
                                           "the pool's data", word));
    size_t i = wb_find(tx, off);
    if (i != SIZE_MAX) { tx->wb_val[i] = value; return NVH_OK; }
    if (__builtin_expect(tx->wbn == tx->wbcap, 0) && (rc = wb_grow(tx)) != NVH_OK) return rc;
    tx->wb_off[tx->wbn] = off;
    tx->wb_val[tx->wbn++] = value;
    return NVH_OK;
}

uint64_t nvh_tx_read_word(nvh_pool *pool, const void *word)
{
    nvh_tx *tx = tx_of(pool);
    if (tx && tx->wbn && word) {
        size_t i = wb_find(tx, (uint64_t)((const char *)word - pool->ctx.base));
        if (i != SIZE_MAX) return tx->wb_val[i];
    }
    uint64_t v;
    memcpy(&v, word, 8);
    return v;
}

/* The two-fence fallback (the transaction also logs something else, or the
 * directory predates version 3, or too many words): the buffered words
 * become word undo records (one fence), then stores in place; the normal
 * commit then logs their new values under FENCE 2. */
static int wb_to_undo(nvh_tx *tx)
{
    nvh_pool *pool = tx->pool;
    size_t before = tx->lane->nrecs;
    int rc = NVH_OK;
    for (size_t i = 0; i < tx->wbn && rc == NVH_OK; i++)
        rc = add_one(tx, pool->ctx.base + tx->wb_off[i], 8, NVH_TX_HINT_WORD);
    if (tx->lane->nrecs != before || tx->lane->unfenced) nvh_txlog_fence(tx->lg, tx->lane, NVH_TXLOG_HELP_MEETING);
    if (rc != NVH_OK) return rc;
    for (size_t i = 0; i < tx->wbn && rc == NVH_OK; i++)
        rc = nvh_txlog_win_open(tx->lg, tx->lane, pool->ctx.base + tx->wb_off[i], 8);
    if (rc != NVH_OK) return rc;
    for (size_t i = 0; i < tx->wbn; i++) memcpy(pool->ctx.base + tx->wb_off[i], &tx->wb_val[i], 8);
    tx->wbn = 0;
    return NVH_OK;
}

int nvh_tx_quiesce(nvh_pool *pool)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    if (!lg->dir) return NVH_OK;
    /* every lane, this thread's own included (its owner copy of the pending
     * transaction is retired again, harmlessly, at its next fence) */
    nvh_txlog_quiesce_all(lg, NULL);
    return NVH_OK;
}

/* ==========================================================================
 * Settings and statistics
 * ========================================================================== */
int nvh_tx_config_get(nvh_pool *pool, nvh_tx_config *c)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    if (!c) return nvh_fail(NVH_E_INVAL, "nvh_tx_config_get: config is NULL");
    nvh_txstate *st = lg->tx;
    c->log_limit = atomic_load(&lg->limit);
    c->max_retries = atomic_load(&st->max_retries);
    c->spin = atomic_load(&st->spin);
    c->backoff_min_ns = atomic_load(&st->backoff_min_ns);
    c->backoff_max_ns = atomic_load(&st->backoff_max_ns);
    return NVH_OK;
}

int nvh_tx_config_set(nvh_pool *pool, const nvh_tx_config *c)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    if (!c) return nvh_fail(NVH_E_INVAL, "nvh_tx_config_set: config is NULL");
    if (c->log_limit < 2 * NVH_TX_SEG_MIN)
        return nvh_fail(NVH_E_INVAL, "log_limit %llu is below the minimum %u",
                        (unsigned long long)c->log_limit, 2 * NVH_TX_SEG_MIN);
    if (c->backoff_min_ns > c->backoff_max_ns)
        return nvh_fail(NVH_E_INVAL, "backoff_min_ns > backoff_max_ns");
    nvh_txstate *st = lg->tx;
    atomic_store(&lg->limit, c->log_limit);
    atomic_store(&st->max_retries, c->max_retries);
    atomic_store(&st->spin, c->spin);
    atomic_store(&st->backoff_min_ns, c->backoff_min_ns);
    atomic_store(&st->backoff_max_ns, c->backoff_max_ns);
    return NVH_OK;
}

int nvh_tx_protocol_set(nvh_pool *pool, nvh_tx_protocol p)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    if (p != NVH_TX_PROTO_AUTO && p != NVH_TX_PROTO_UNDO)
        return nvh_fail(NVH_E_INVAL, "nvh_tx_protocol_set: unknown protocol %d", (int)p);
    atomic_store(&((nvh_txstate *)lg->tx)->protocol, (unsigned)p);
    return NVH_OK;
}

nvh_tx_protocol nvh_tx_protocol_get(nvh_pool *pool)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return NVH_TX_PROTO_AUTO;
    return (nvh_tx_protocol)atomic_load(&((nvh_txstate *)lg->tx)->protocol);
}

int nvh_tx_stats_get(nvh_pool *pool, nvh_tx_stats *s)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    if (!s) return nvh_fail(NVH_E_INVAL, "nvh_tx_stats_get: stats is NULL");
    nvh_txstate *st = lg->tx;
    memset(s, 0, sizeof *s);
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        s->commits += st->txs[i].commits;
        s->aborts += st->txs[i].aborts;
        s->conflicts += st->txs[i].conflicts;
        s->retries += st->txs[i].retries;
        s->bytes_logged += lg->lanes[i].bytes_logged;
    }
    s->recovered = lg->recovered_txs;
    return NVH_OK;
}

void nvh_tx_stats_reset(nvh_pool *pool)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return;
    nvh_txstate *st = lg->tx;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        st->txs[i].commits = st->txs[i].aborts = st->txs[i].conflicts = st->txs[i].retries = 0;
        lg->lanes[i].bytes_logged = 0;
    }
}

/* ==========================================================================
 * Pool hooks
 * ========================================================================== */
static void state_free(void *p)
{
    nvh_txstate *st = p;
    if (!st) return;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        nvh_tx *tx = &st->txs[i];
        free(tx->dd_off); free(tx->dd_len); free(tx->dd_used); free(tx->allocs); free(tx->frees);
        free(tx->rset); free(tx->wset); if (tx->wb_off != tx->wb_inline_off) free(tx->wb_off);
        if (tx->wb_val != tx->wb_inline_val) free(tx->wb_val);
        while (tx->arena) { char *n = *(char **)tx->arena; free(tx->arena); tx->arena = n; }
    }
    free((void *)st->orecs);
    free(st);
}

static void txlog_free(nvh_txlog *lg)
{
    if (!lg) return;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        free(lg->lanes[i].recs);
        free(lg->lanes[i].wins);
    }
    if (lg->tx_free) lg->tx_free(lg->tx);
    pthread_mutex_destroy(&lg->lock);
    free(lg);
}

/* Recovery writes anywhere (log lines, redone and undone application
 * bytes, the allocator's frees): an implicit window (cold path). */
static int recover_in_window(nvh_txlog *lg)
{
    /* recovery's allocator calls may fail harmlessly (freeing an intent
     * that was never activated, or already freed by an earlier recovery):
     * a successful recovery leaves the thread's last error as it was */
    nvh_err_saved err;
    nvh_err_save(&err);
    nvh_protect_internal_begin(lg->pool);
    int rc = nvh_txlog_recover(lg);
    nvh_protect_internal_end(lg->pool);
    if (rc == NVH_OK && (nvh_errcode() != err.code || strcmp(nvh_errormsg(), err.msg) != 0))
        (void)nvh_err_restore(&err);
    return rc;
}

/* Called by nvh_pool_open/create after the allocator opened: recovery. */
int nvh_tx_open_(nvh_pool *pool)
{
    if (pool->readonly) return NVH_OK;
    /* line-aligned: lanes and descriptors are laid out one per line group
     * so that threads never share a line they write (log.h, tx.h). The
     * ownership-record table is allocated by the first object transaction
     * (otm.c), not here: most pools never run one. */
    nvh_txlog *lg = aligned_alloc(64, sizeof *lg);
    nvh_txstate *st = aligned_alloc(64, sizeof *st);
    if (!lg || !st) {
        free(lg); free(st);
        return nvh_fail(NVH_E_NOMEM, "out of memory opening the transaction log");
    }
    memset(lg, 0, sizeof *lg);
    memset(st, 0, sizeof *st);
    atomic_store(&st->gclock, 1);
    atomic_store(&st->spin, 64);
    atomic_store(&st->backoff_min_ns, 200);
    atomic_store(&st->backoff_max_ns, 100000);
    lg->pool = pool;
    lg->tx = st;
    lg->tx_free = state_free;
    pthread_mutex_init(&lg->lock, NULL);
    for (unsigned i = 0; i < NVH_TX_LANES; i++) lg->lanes[i].index = i;
    atomic_store(&lg->limit, NVH_TX_LIMIT_DEFAULT);
    atomic_store(&lg->next_tid, 1);
    atomic_store(&lg->next_cseq, 1);
    /* NVHEAP_TX_SKIP_RECOVERY=1: open without recovering (tests run the
     * recovery themselves under the crash simulator; forensics) */
    const char *skip = getenv("NVHEAP_TX_SKIP_RECOVERY");
    int rc = skip && *skip == '1' ? NVH_OK : recover_in_window(lg);
    /* the global clock and the lanes' clocks continue above every commit
     * order in the log */
    atomic_store(&st->gclock, atomic_load(&lg->next_cseq));
    for (unsigned i = 0; i < NVH_TX_LANES; i++) lg->lanes[i].clock = atomic_load(&lg->next_cseq);
    if (rc == NVH_OK) rc = nvh_txlog_register_(pool, lg);
    if (rc != NVH_OK) {
        nvh_err_saved err;
        nvh_err_save(&err);
        txlog_free(lg);
        nvh_err_restore(&err);
        return nvh_fail_context(err.code, "transaction recovery failed");
    }
    return NVH_OK;
}

/* Called by nvh_pool_close before the allocator quiesces. */
void nvh_tx_close_(nvh_pool *pool)
{
    nvh_txlog *lg = NULL;
    nvh_refcount_forget_(pool);
    if (pool->readonly) return;
    nvh_tx_otm_forget_(pool);
    lg = nvh_txlog_get(pool);
    if (!lg) return;
    if (lg->dir) nvh_txlog_quiesce_all(lg, NULL);
    nvh_txlog_unregister_(lg);
    txlog_free(lg);
}

/* Test hook: run recovery now on an open pool (opened with
 * NVHEAP_TX_SKIP_RECOVERY=1), as nvh_pool_open would have. */
int nvh_tx_recover_(nvh_pool *pool)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return nvh_errcode();
    return recover_in_window(lg);
}
