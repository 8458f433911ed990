/* arena.c — the allocation paths: reserve (DRAM only; small sizes from a
 * per-thread reservation cache, lock-free), cancel, activate and free (one
 * redo record + one fence, redo.c), the convenience nvh_alloc, and the
 * per-arena DRAM structures behind them: bins of non-full runs with a
 * rotating slot cursor, free-block extents, and the wear-aware
 * don't-allocate FIFO that freed space passes through before reuse. */
#include "alloc.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Arena setup
 * ========================================================================== */
void nvh_arena_init(nvh_heap *h, nvh_arena *a, unsigned index)
{
    (void)h;
    memset(a, 0, sizeof *a);
    nvh_alock_init(&a->lock);
    a->index = index;
    atomic_init(&a->unretired_min, UINT64_MAX);
}

/* The arena lock's contended path (alloc.h): spin on a plain load (no
 * cache-line ping-pong) with PAUSE for a short while, then yield the core;
 * on this 2-core VM the holder is often a preempted thread that needs it. */
void nvh_alock_wait_(nvh_alock *l)
{
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
            atomic_exchange_explicit(&l->v, 1, memory_order_acquire) == 0)
            return;
        if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
}

void nvh_arena_fini(nvh_arena *a)
{
    free(a->ext);
    free(a->resv);
    free(a->fifo);
    free(a->dirty);
    free(a->bm_runs);
}

static inline nvh_heap *heap_of(nvh_pool *pool, bool write)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "pool is NULL");
        return NULL;
    }
    /* the opened heap without a call; nvh_heap_get_ opens it the first time */
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!h, 0) && !(h = nvh_heap_get_(pool))) return NULL;
    if (write && pool->readonly) {
        nvh_fail(NVH_E_READONLY, "pool %s is open read-only", pool->path);
        return NULL;
    }
    return h;
}

/* ==========================================================================
 * Free extents (sorted by block, merged on insert; best fit, from the start)
 * ========================================================================== */
void nvh_extent_put(nvh_arena *a, uint64_t block, uint64_t n)
{
    size_t lo = 0, hi = a->next;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->ext[mid].block < block) lo = mid + 1; else hi = mid;
    }
    size_t i = lo;
    /* invariant: free space is never inserted twice */
    NVH_ASSERT(!(i > 0 && a->ext[i - 1].block + a->ext[i - 1].nblocks > block));
    NVH_ASSERT(!(i < a->next && block + n > a->ext[i].block));
    bool left = i > 0 && a->ext[i - 1].block + a->ext[i - 1].nblocks == block;
    bool right = i < a->next && block + n == a->ext[i].block;
    /* never merge across chunk ends: arena regions live inside one chunk.
     * (extents of different chunks are adjacent only at chunk boundaries,
     * which the bpc check below excludes) */
    if (left && right) {
        a->ext[i - 1].nblocks += n + a->ext[i].nblocks;
        memmove(&a->ext[i], &a->ext[i + 1], (a->next - i - 1) * sizeof *a->ext);
        a->next--;
        return;
    }
    if (left) { a->ext[i - 1].nblocks += n; return; }
    if (right) { a->ext[i].block = block; a->ext[i].nblocks += n; return; }
    if (a->next == a->ext_cap) {
        size_t cap = a->ext_cap ? a->ext_cap * 2 : 32;
        nvh_extent *g = realloc(a->ext, cap * sizeof *g);
        if (!g) return;
        a->ext = g;
        a->ext_cap = cap;
    }
    memmove(&a->ext[i + 1], &a->ext[i], (a->next - i) * sizeof *a->ext);
    a->ext[i] = (nvh_extent){block, n};
    a->next++;
}

static nvh_run *run_lookup(nvh_heap *h, uint64_t block);

/* Remove [block, block+n) from the free extents (containment of a damaged
 * span found after its chunk was scanned). */
static void extent_remove(nvh_arena *a, uint64_t block, uint64_t n)
{
    uint64_t end = block + n;
    for (size_t i = 0; i < a->next;) {
        uint64_t s = a->ext[i].block, e = s + a->ext[i].nblocks;
        if (e <= block || s >= end) { i++; continue; }
        /* keep the parts outside the span */
        a->ext[i].nblocks = block > s ? block - s : 0;
        if (a->ext[i].nblocks == 0) {
            memmove(&a->ext[i], &a->ext[i + 1], (a->next - i - 1) * sizeof *a->ext);
            a->next--;
        } else {
            i++;
        }
        if (e > end) nvh_extent_put(a, end, e - end);
    }
}

/* Never hand out [block, block+n) again in this session: take it out of
 * every arena's free extents and quarantine the runs inside it. Called with
 * no allocator lock held. */
void nvh_arena_exclude(nvh_heap *h, uint64_t block, uint64_t n)
{
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        nvh_arena *a = &h->arenas[i];
        nvh_alock_lock(&a->lock);
        extent_remove(a, block, n);
        for (uint64_t b = block; b < block + n; b++) {
            nvh_run *run = run_lookup(h, b);
            if (run) run->quarantined = true;
        }
        nvh_alock_unlock(&a->lock);
    }
}

/* Best fit inside one chunk. Extents may span chunk boundaries after a merge,
 * so the candidate range is clipped to the chunk of its start. */
static bool extent_take(nvh_heap *h, nvh_arena *a, uint64_t n, uint64_t *block_out)
{
    size_t best = SIZE_MAX;
    uint64_t best_len = UINT64_MAX, best_start = 0;
    for (size_t i = 0; i < a->next; i++) {
        uint64_t s = a->ext[i].block, e = s + a->ext[i].nblocks;
        /* find the first chunk-clipped piece of this extent that fits */
        while (s < e) {
            uint64_t cend = (s / h->bpc + 1) * h->bpc;
            uint64_t pe = e < cend ? e : cend;
            uint64_t len = pe - s;
            if (len >= n && len < best_len) { best = i; best_len = len; best_start = s; }
            s = pe;
        }
        if (best_len == n) break;
    }
    if (best == SIZE_MAX) return false;
    nvh_extent *x = &a->ext[best];
    uint64_t xs = x->block, xe = x->block + x->nblocks;
    /* remove [best_start, best_start+n) from [xs, xe) */
    if (best_start == xs) {
        x->block += n;
        x->nblocks -= n;
        if (x->nblocks == 0) {
            memmove(&a->ext[best], &a->ext[best + 1], (a->next - best - 1) * sizeof *a->ext);
            a->next--;
        }
    } else {
        x->nblocks = best_start - xs;
        if (best_start + n < xe) nvh_extent_put(a, best_start + n, xe - best_start - n);
    }
    *block_out = best_start;
    return true;
}

/* ==========================================================================
 * Bins and runs
 * ========================================================================== */
void nvh_bin_add(nvh_arena *a, nvh_run *run)
{
    if (run->in_bin || run->quarantined) return;
    run->in_bin = true;
    run->next = a->bins[run->cls];
    a->bins[run->cls] = run;
}

static nvh_run *run_lookup(nvh_heap *h, uint64_t block)
{
    return nvh_run_lookup(h, block);
}

static nvh_run *run_new(nvh_heap *h, nvh_arena *a, uint64_t block, unsigned cls)
{
    nvh_chunk *ch = nvh_chunk_get(h, nvh_chunk_of_block(h, block));
    nvh_run *run = ch ? calloc(1, sizeof *run) : NULL;
    if (!run) return NULL;
    run->block = block;
    run->cls = (uint8_t)cls;
    run->nslots = (uint8_t)nvh_cls_slots(cls);
    run->avail = run->nslots == 64 ? ~0ull : (1ull << run->nslots) - 1;
    /* runs are carved from the front of free extents: map 64 KiB ahead at
     * once instead of faulting page by page (heap.c: nvh_prefault) */
    if ((block & 15) == 0 && !run_lookup(h, block + 1)) nvh_prefault(h, block, 16);
    __atomic_store_n(&ch->runs[block % h->bpc], run, __ATOMIC_RELEASE);
    nvh_bin_add(a, run);
    return run;
}

/* Next available slot at or after the rotating cursor: consecutive
 * reservations walk through the run instead of reusing the last-freed slot. */
static unsigned run_pick(nvh_run *run)
{
    uint64_t av = run->avail;
    uint64_t hi = run->cursor < 64 ? av & (~0ull << run->cursor) : 0;
    unsigned slot = (unsigned)__builtin_ctzll(hi ? hi : av);
    NVH_ASSERT(!((run->pbits | run->resv) & (1ull << slot)));
    run->avail &= ~(1ull << slot);
    run->resv |= 1ull << slot;
    run->cursor = (uint8_t)(slot + 1 >= run->nslots ? 0 : slot + 1);
    return slot;
}

/* ==========================================================================
 * Don't-allocate FIFO
 * ========================================================================== */
/* FIFO growth (power-of-2 capacity), out of line: it is rare */
static __attribute__((noinline)) bool fifo_grow(nvh_arena *a)
{
    size_t cap = a->fifo_cap ? a->fifo_cap * 2 : 256;
    nvh_fifo_entry *g = malloc(cap * sizeof *g);
    if (!g) return false;
    for (size_t i = 0; i < a->fifo_len; i++)
        g[i] = a->fifo[(a->fifo_head + i) & (a->fifo_cap - 1)];
    free(a->fifo);
    a->fifo = g;
    a->fifo_cap = cap;
    a->fifo_head = 0;
    return true;
}

/* Inline: every free pushes. huge_or_slot: for an extent (nblocks > 0)
 * whether it is huge; for a run slot (nblocks == 0) the slot index. */
static inline void fifo_push(nvh_heap *h, nvh_arena *a, nvh_run *run, uint64_t off,
                             uint64_t nblocks, uint8_t huge_or_slot, uint64_t seq,
                             uint64_t bytes)
{
    if (__builtin_expect(a->fifo_len == a->fifo_cap, 0) && !fifo_grow(a))
        return;                         /* space lost until the next open */
    /* no clock read when T is 0: the FIFO then only orders reuse */
    uint64_t t = atomic_load_explicit(&h->fifo_delay_ns, memory_order_relaxed) ? nvh_now_ns() : 0;
    /* the capacity is a power of 2 (256, doubled): mask, not divide */
    nvh_fifo_entry *e = &a->fifo[(a->fifo_head + a->fifo_len) & (a->fifo_cap - 1)];
    if (nblocks) e->off = off;
    else e->run = run;
    e->nblocks = nblocks;
    e->seq = seq;
    e->time_ns = t;
    e->epoch = nvh_epoch_now_();
    e->huge = nblocks ? huge_or_slot : 0;
    e->slot = nblocks ? 0 : huge_or_slot;
    a->fifo_len++;
    a->fifo_bytes += bytes;
}

static void fifo_release(nvh_heap *h, nvh_arena *a, const nvh_fifo_entry *e)
{
    if (e->nblocks == 0) {
        /* the run and slot recorded at free: the descriptor is the one the
         * free validated (a run never changes class or goes away while the
         * heap is open); a run quarantined since keeps its slots */
        nvh_run *run = e->run;
        unsigned slot = e->slot;
        if (run->quarantined) return;
        NVH_ASSERT(slot < run->nslots);
        run->avail |= 1ull << slot;
        a->fifo_bytes -= nvh_cls_size(run->cls);
        if (!run->in_bin) nvh_bin_add(a, run);  /* usually already in its bin */
    } else if (e->huge) {
        a->fifo_bytes -= e->nblocks * NVH_BLOCK;
        nvh_huge_put(h, e->off / h->bpc, e->nblocks / h->bpc);
    } else {
        a->fifo_bytes -= e->nblocks * NVH_BLOCK;
        nvh_extent_put(a, e->off, e->nblocks);
    }
}

/* Release FIFO heads whose time is up (or all, if force), whose free
 * record is retired in every ring (so no replay can touch the space's old
 * incarnation once it is reused), and that no lock-free reader can still
 * hold (freed before every active reader began: common/epoch.c; even when
 * forced, as a reader would see the space reused under it). Returns how
 * many were released. */
static size_t fifo_drain(nvh_heap *h, nvh_arena *a, bool force, bool may_retire)
{
    if (!a->fifo_len) return 0;
    uint64_t delay = atomic_load_explicit(&h->fifo_delay_ns, memory_order_relaxed);
    uint64_t maxb = atomic_load_explicit(&h->fifo_max_bytes, memory_order_relaxed);
    uint64_t now = delay && !force ? nvh_now_ns() : UINT64_MAX;
    /* read before the rings: a retire after this read changes the epoch */
    uint64_t epoch = atomic_load_explicit(&h->retire_epoch, memory_order_acquire);
    uint64_t retired = nvh_redo_retired_before(h);
    a->fifo_blocked = 0;
    size_t released = 0;
    uint64_t readers = nvh_epoch_min_active_();   /* UINT64_MAX: none reading */
    while (a->fifo_len) {
        nvh_fifo_entry *e = &a->fifo[a->fifo_head];
        /* T = 0 (the default): every entry's time is up */
        if (delay && !force && now - e->time_ns < delay && a->fifo_bytes <= maxb) break;
        if (e->epoch >= readers) {
            nvh_epoch_advance_();      /* readers that start now do not hold it */
            break;
        }
        if (e->seq >= retired) {
            if (!may_retire) {
                a->fifo_blocked = epoch + 1;
                break;
            }
            if (atomic_load_explicit(&a->unretired_min, memory_order_relaxed) <= e->seq)
                nvh_redo_retire(h, a);
            retired = nvh_redo_retired_before(h);
            if (e->seq >= retired) break;
        }
        /* released in place: releasing never touches the FIFO */
        a->fifo_head = (a->fifo_head + 1) & (a->fifo_cap - 1);
        a->fifo_len--;
        fifo_release(h, a, e);
        released++;
    }
    return released;
}

/* Find more space for arena a (held locked; may be dropped and retaken). */
static int refill(nvh_heap *h, nvh_arena *a)
{
    if (fifo_drain(h, a, false, true)) return NVH_OK;
    /* BUSY is transient (another arena's lock, or rings to retire before an
     * unscanned chunk can be handed out): it must never turn into a spurious
     * NOSPACE, which a fixed number of tries did under contention */
    for (unsigned tries = 0;; tries++) {
        /* Incremental rebuild: the claim scans unscanned chunks one at a
         * time until one joins this arena (the caller retries its bins and
         * extents and comes back if it had no room), skipping chunks the
         * chunk-full map knows to be full; only when no chunk is left to
         * scan does it take a fresh one (heap.c: nvh_chunk_claim). */
        int rc = nvh_chunk_claim(h, a, a->no_grow);
        if (rc == NVH_OK) return NVH_OK;
        if (rc != NVH_E_BUSY) break;
        nvh_alock_unlock(&a->lock);
        nvh_redo_retire_all(h);
        if (tries >= 2) sched_yield();
        nvh_alock_lock(&a->lock);
        /* another thread may have freed or scanned space for us meanwhile */
        if (fifo_drain(h, a, false, true)) return NVH_OK;
    }
    /* nothing left to scan: the caller looks at the other arenas before
     * it lets this one grow the pool (nvh_reserve). Not an error of the
     * call (no message: a reservation that then succeeds leaves none) */
    if (a->no_grow) return NVH_E_NOSPACE;
    /* pool full: take FIFO space early (space pressure overrides T) */
    if (fifo_drain(h, a, true, true)) return NVH_OK;
    if (a->fifo_len) {
        nvh_alock_unlock(&a->lock);
        nvh_redo_retire_all(h);
        nvh_alock_lock(&a->lock);
        if (fifo_drain(h, a, true, true)) return NVH_OK;
    }
    if (nvh_errcode() != NVH_E_NOSPACE)
        nvh_fail(NVH_E_NOSPACE, "pool %s is full", h->pool->path);
    return NVH_E_NOSPACE;
}

/* ==========================================================================
 * Reserve / cancel
 * ========================================================================== */
static int reserve_small(nvh_heap *h, nvh_arena *a, unsigned cls, uint64_t *off)
{
    for (;;) {
        nvh_run *run = a->bins[cls];
        while (run && (run->avail == 0 || run->quarantined)) {
            a->bins[cls] = run->next;
            run->in_bin = false;
            run->next = NULL;
            run = a->bins[cls];
        }
        if (run) {
            unsigned slot = run_pick(run);
            *off = nvh_block_off(h, run->block) + NVH_HDR + (uint64_t)slot * nvh_cls_size(cls);
            return NVH_OK;
        }
        uint64_t b;
        if (extent_take(h, a, 1, &b)) {
            if (!run_new(h, a, b, cls)) {
                nvh_extent_put(a, b, 1);
                return nvh_fail(NVH_E_NOMEM, "out of memory for a run descriptor");
            }
            continue;
        }
        int rc = refill(h, a);
        if (rc != NVH_OK) return rc;
    }
}

/* ==========================================================================
 * Per-thread reservation cache
 *
 * nvh_reserve of a small size pops a slot from the calling thread's cache:
 * no lock, no atomic read-modify-write, no clock. An empty cache is refilled
 * under the arena lock with up to tc_batch(cls) slots picked by the same
 * rotating cursor as before (wear). Cached and handed-out-but-not-activated
 * slots carry run->tcached (instead of run->resv); activate and cancel accept
 * either. The cache is DRAM only, so a crash frees it with every other
 * reservation. Lock order: tc_lock -> arena -> heap.
 * ========================================================================== */
static pthread_mutex_t tc_lock = PTHREAD_MUTEX_INITIALIZER; /* lists, attach */
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static _Thread_local nvh_tcache *tl_tc;

/* Give every slot in tc back to h's arenas. Caller holds tc_lock and tc is
 * attached to h (so h is alive: close detaches under tc_lock first). */
static void tc_return(nvh_heap *h, nvh_tcache *tc)
{
    for (unsigned cls = 1; cls <= NVH_SMALL_CLASSES; cls++) {
        while (tc->n[cls]) {
            uint64_t off = tc->off[cls][--tc->n[cls]];
            uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK;
            nvh_arena *a = &h->arenas[atomic_load(&h->owner[nvh_chunk_of_block(h, b)])];
            nvh_alock_lock(&a->lock);
            nvh_run *run = run_lookup(h, b);
            unsigned slot = 0;
            bool ok = nvh_slot_of(rel % NVH_BLOCK, cls, &slot);
            NVH_ASSERT(ok && run && (run->tcached & (1ull << slot)));
            if (ok && run) {
                run->tcached &= ~(1ull << slot);
                run->avail |= 1ull << slot;
                nvh_bin_add(a, run);
            }
            nvh_alock_unlock(&a->lock);
        }
    }
}

static void tc_unlink(nvh_heap *h, nvh_tcache *tc)
{
    if (tc->prev) tc->prev->next = tc->next;
    else h->tcaches = tc->next;
    if (tc->next) tc->next->prev = tc->prev;
    tc->next = tc->prev = NULL;
}

/* Thread exit: the cache's slots go back to their arenas. */
static void tc_thread_exit(void *arg)
{
    nvh_tcache *tc = arg;
    pthread_mutex_lock(&tc_lock);
    nvh_heap *h = atomic_load_explicit(&tc->heap, memory_order_relaxed);
    if (h) {
        tc_return(h, tc);
        tc_unlink(h, tc);
        atomic_store_explicit(&tc->heap, NULL, memory_order_relaxed);
    }
    pthread_mutex_unlock(&tc_lock);
    if (tl_tc == tc) tl_tc = NULL;
    free(tc);
}

/* Crash-simulator children are forked at fences, possibly while this
 * thread holds an arena lock and other (absent) threads hold tc_lock: the
 * child starts with a fresh, unattached cache (the old one stays, unused,
 * on the parent heap's list copy) and a fresh lock. */
static void tc_atfork_child(void)
{
    pthread_mutex_init(&tc_lock, NULL);
    tl_tc = NULL;
    pthread_setspecific(tc_key, NULL);
}

static void tc_init_once(void)
{
    pthread_key_create(&tc_key, tc_thread_exit);
    pthread_atfork(NULL, NULL, tc_atfork_child);
}

/* Close: detach every cache of h (their owners drop the entries when they
 * next reserve; the DRAM state the slots refer to is freed with h). */
void nvh_tcache_detach_all(nvh_heap *h)
{
    pthread_mutex_lock(&tc_lock);
    while (h->tcaches) {
        nvh_tcache *tc = h->tcaches;
        tc_unlink(h, tc);
        atomic_store_explicit(&tc->heap, NULL, memory_order_relaxed);
    }
    pthread_mutex_unlock(&tc_lock);
}

/* The calling thread's cache, attached to h (slow path: first use, or the
 * thread moved to another heap). NULL if out of memory. */
static nvh_tcache *tc_attach(nvh_heap *h)
{
    nvh_tcache *tc = tl_tc;
    if (!tc) {
        pthread_once(&tc_once, tc_init_once);
        tc = calloc(1, sizeof *tc);
        if (!tc) return NULL;
        tl_tc = tc;
        pthread_setspecific(tc_key, tc);
    }
    pthread_mutex_lock(&tc_lock);
    nvh_heap *old = atomic_load_explicit(&tc->heap, memory_order_relaxed);
    if (old != h) {
        if (old) {
            tc_return(old, tc);
            tc_unlink(old, tc);
        }
        memset(tc->n, 0, sizeof tc->n);       /* detached: entries are void */
        tc->next = h->tcaches;
        tc->prev = NULL;
        if (h->tcaches) h->tcaches->prev = tc;
        h->tcaches = tc;
        atomic_store_explicit(&tc->heap, h, memory_order_relaxed);
    }
    pthread_mutex_unlock(&tc_lock);
    return tc;
}

/* Is off one of the slots sitting in the calling thread's cache (not handed
 * out)? Error paths only. */
static bool tc_holds(nvh_heap *h, uint64_t off, unsigned cls)
{
    nvh_tcache *tc = tl_tc;
    if (!tc || atomic_load_explicit(&tc->heap, memory_order_relaxed) != h) return false;
    for (unsigned i = 0; i < tc->n[cls]; i++)
        if (tc->off[cls][i] == off) return true;
    return false;
}

/* Slots taken per refill: fewer for big classes, whose runs hold few. */
static inline unsigned tc_batch(unsigned cls)
{
    unsigned n = nvh_cls_slots(cls) / 4;
    return n < 1 ? 1 : n > NVH_TC_SLOTS ? NVH_TC_SLOTS : n;
}

/* Refill: one slot for the caller (*off) and up to tc_batch - 1 more for
 * the cache, all from arena a's bins in cursor order. Caller holds a->lock. */
static int tc_refill(nvh_heap *h, nvh_arena *a, nvh_tcache *tc, unsigned cls, uint64_t *off)
{
    uint64_t got[NVH_TC_SLOTS];
    unsigned n = 0, want = tc_batch(cls);
    int rc = reserve_small(h, a, cls, &got[n]);
    if (rc != NVH_OK) return rc;
    n++;
    while (n < want) {
        /* more only from runs already in the bin: no new run, no refill */
        nvh_run *run = a->bins[cls];
        while (run && (run->avail == 0 || run->quarantined)) {
            a->bins[cls] = run->next;
            run->in_bin = false;
            run->next = NULL;
            run = a->bins[cls];
        }
        if (!run) break;
        unsigned slot = run_pick(run);
        got[n++] = nvh_block_off(h, run->block) + NVH_HDR + (uint64_t)slot * nvh_cls_size(cls);
    }
    for (unsigned i = 0; i < n; i++) {   /* resv -> tcached */
        uint64_t rel = got[i] - h->chunks_off, b = rel / NVH_BLOCK;
        nvh_run *run = run_lookup(h, b);
        unsigned slot = 0;
        nvh_slot_of(rel % NVH_BLOCK, cls, &slot);
        uint64_t bit = 1ull << slot;
        run->resv &= ~bit;
        run->tcached |= bit;
    }
    *off = got[0];
    /* the cache is a stack: push in reverse so pops follow the cursor */
    for (unsigned i = n; i-- > 1;) tc->off[cls][tc->n[cls]++] = got[i];
    return NVH_OK;
}

static int resv_add(nvh_arena *a, uint64_t block, uint64_t blocks, uint8_t kind)
{
    if (a->nresv == a->resv_cap) {
        size_t cap = a->resv_cap ? a->resv_cap * 2 : 16;
        nvh_resv *g = realloc(a->resv, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory for a reservation");
        a->resv = g;
        a->resv_cap = cap;
    }
    a->resv[a->nresv++] = (nvh_resv){block, blocks, kind};
    return NVH_OK;
}

static nvh_resv *resv_find(nvh_arena *a, uint64_t block)
{
    for (size_t i = a->nresv; i-- > 0;)
        if (a->resv[i].block == block) return &a->resv[i];
    return NULL;
}

static void resv_remove(nvh_arena *a, nvh_resv *r)
{
    *r = a->resv[--a->nresv];
}

/* Debug invariant: no free extent covers a run or a persistent non-free
 * region start (NVHEAP_DEBUG_ALLOC=1). */
static _Atomic int debug_on = -1;
static void debug_validate_(nvh_heap *h, nvh_arena *a, const char *where);
/* inline flag test: the walk itself is out of line (and off by default) */
static inline void debug_validate(nvh_heap *h, nvh_arena *a, const char *where)
{
    if (__builtin_expect(atomic_load_explicit(&debug_on, memory_order_relaxed) != 0, 0))
        debug_validate_(h, a, where);
}
static void debug_validate_(nvh_heap *h, nvh_arena *a, const char *where)
{
    int v = atomic_load_explicit(&debug_on, memory_order_relaxed);
    if (v < 0) {
        v = getenv("NVHEAP_DEBUG_ALLOC") != NULL;
        atomic_store_explicit(&debug_on, v, memory_order_relaxed);
    }
    if (!v) return;
    for (size_t i = 0; i < a->next; i++) {
        if (i && a->ext[i - 1].block + a->ext[i - 1].nblocks > a->ext[i].block) {
            fprintf(stderr, "nvheap debug (%s): free extents overlap at %zu\n", where, i); abort();
        }
        for (uint64_t b = a->ext[i].block; b < a->ext[i].block + a->ext[i].nblocks; b++) {
            if (run_lookup(h, b)) { fprintf(stderr, "nvheap debug (%s): free extent [%llu,+%llu) covers the run at block %llu\n", where, (unsigned long long)a->ext[i].block, (unsigned long long)a->ext[i].nblocks, (unsigned long long)b); abort(); }
            if (h->pview[b] && nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state == NVH_RS_USED) { fprintf(stderr, "nvheap debug (%s): free extent covers the used region at block %llu\n", where, (unsigned long long)b); abort(); }
        }
    }
}

/* A large or huge reservation [b, b+n) is carved from free extents that
 * DRAM merges across persistent region boundaries, so it may cover the
 * headers of several free regions (or the zero first line of a chunk that
 * was never formatted). The caller fills the reservation before
 * nvh_activate (nvh_alloc's constructor does): a crash before the
 * activation would leave those headers overwritten by its data, with no
 * record to restore them. So before such a reservation is handed out, the
 * free regions it touches are merged on the media: one FREE record (flag
 * NVH_RECF_MERGE) whose effect is a single FREE header over the whole span,
 * written, fenced and applied like any free — replay rewrites the header
 * if a crash tears it. After it the reservation lies inside one persistent
 * free region, which activation splits as usual (plan_split). Reserve
 * stays DRAM-only in every other case (one persistent region: nothing to
 * do). Caller holds a->lock (and h->lock for huge). */
static int span_merge(nvh_heap *h, nvh_arena *a, uint64_t b, uint64_t n, bool huge)
{
    uint64_t plen = 0, qlen = 0;
    uint64_t p = nvh_pview_containing(h, b, &plen);
    uint64_t q = nvh_pview_containing(h, b + n - 1, &qlen);
    uint64_t cb = nvh_chunk_of_block(h, b), ce = nvh_chunk_of_block(h, b + n - 1);
    if (p == q && (p != UINT64_MAX || cb == ce)) return NVH_OK;
    uint64_t start = p != UINT64_MAX ? p : b;
    uint64_t end = q != UINT64_MAX ? q + qlen : (ce + 1) * h->bpc;
    if (end < b + n) end = (ce + 1) * h->bpc;
    if (!huge && nvh_chunk_of_block(h, start) != cb)
        return nvh_fail(NVH_E_CORRUPT, "free span at block %llu crosses a chunk end",
                        (unsigned long long)b);
    /* a huge span may end in chunks a cancelled fresh reservation gave
     * back: they count as used from here on (durable with the record) */
    if (huge) nvh_hwm_raise(h, (end + h->bpc - 1) >> h->bpc_shift, false);
    struct nvh_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.obj = nvh_block_off(h, start) + NVH_HDR;
    rec.blocks = (uint32_t)(end - start);
    rec.kind_links = NVH_REC_FREE;
    rec.cls_flags = (uint8_t)(NVH_RECF_MERGE |
                              ((huge ? NVH_RK_HUGE : NVH_RK_LARGE) << NVH_RECF_KIND_SHIFT));
    nvh_redo_append1(h, a, &rec, NULL, 0);
    nvh_rec_apply_state(h, &rec, NULL, a, false);
    /* durable before the caller can write over the old headers: a crashed
     * pool then reads consistently even before recovery (nvheap check of a
     * read-only open); only the fence window itself relies on replay */
    nvh_persist(h->pool, nvh_rhdr_at(h, start), NVH_HDR);
    /* the persistent tiling: one region where there were several */
    if (huge) {
        for (uint64_t x = start + h->bpc; x < end; x += h->bpc) nvh_pview_set(h, x, 0);
    } else {
        for (uint64_t x = start + 1; x < end; x++) nvh_pview_set(h, x, 0);
    }
    nvh_pview_set(h, start, end - start);
    a->links_clwb = false;
    return NVH_OK;
}

/* Huge: whole chunks from the heap's free-chunk list. Before the pool
 * grows, the arena's don't-allocate FIFO (a freed huge region waits there
 * until its record retires) and the unscanned chunks (free huge regions of
 * earlier sessions are found by the scan) are tried: free space anywhere in
 * the pool comes before growth. Caller holds a->lock (dropped and retaken
 * while other rings retire). */
static int reserve_huge(nvh_heap *h, nvh_arena *a, size_t size, uint64_t *off)
{
    uint64_t nch = ((uint64_t)size + NVH_HDR + h->chunk_size - 1) / h->chunk_size;
    uint64_t c = 0, rem = 0;
    int rc;
    for (unsigned tries = 0;; tries++) {
        rc = nvh_huge_take(h, nch, &c, &rem, false);
        if (rc == NVH_OK) break;
        if (fifo_drain(h, a, false, true)) continue;
        rc = nvh_chunk_claim(h, a, true);          /* scan one more chunk */
        if (rc == NVH_OK) continue;
        if (rc == NVH_E_BUSY) {
            nvh_alock_unlock(&a->lock);
            nvh_redo_retire_all(h);
            if (tries >= 2) sched_yield();
            nvh_alock_lock(&a->lock);
            continue;
        }
        rc = nvh_huge_take(h, nch, &c, &rem, true); /* fresh chunks */
        if (rc == NVH_OK) break;
        /* pool full: FIFO space early (space pressure overrides T) */
        if (fifo_drain(h, a, true, true)) continue;
        if (a->fifo_len) {
            nvh_alock_unlock(&a->lock);
            nvh_redo_retire_all(h);
            nvh_alock_lock(&a->lock);
            if (fifo_drain(h, a, true, true)) continue;
        }
        return rc;
    }
    atomic_store_explicit(&h->owner[c], (int16_t)a->index, memory_order_release);
    if (rem != UINT64_MAX) {            /* not fresh: may span free regions */
        pthread_mutex_lock(&h->lock);
        rc = span_merge(h, a, c * h->bpc, nch * h->bpc, true);
        pthread_mutex_unlock(&h->lock);
    }
    if (rc == NVH_OK) rc = resv_add(a, c * h->bpc, nch * h->bpc, NVH_RK_HUGE);
    if (rc != NVH_OK) {
        nvh_huge_put(h, c, nch);
        return rc;
    }
    *off = nvh_block_off(h, c * h->bpc) + NVH_HDR;
    return NVH_OK;
}

/* A small slot (cls > 0; into the thread's cache if it has one) or a large
 * region of `need` blocks from arena a. Caller holds a->lock. */
static int reserve_in(nvh_heap *h, nvh_arena *a, nvh_tcache *tc, unsigned cls, uint64_t need,
                      uint64_t *off)
{
    int rc;
    if (cls) {
        rc = tc ? tc_refill(h, a, tc, cls, off) : reserve_small(h, a, cls, off);
    } else {
        uint64_t b = 0;
        for (;;) {
            if (extent_take(h, a, need, &b)) { rc = NVH_OK; break; }
            rc = refill(h, a);
            if (rc != NVH_OK) break;
        }
        if (rc == NVH_OK) {
            rc = span_merge(h, a, b, need, false);
            if (rc == NVH_OK) rc = resv_add(a, b, need, NVH_RK_LARGE);
            if (rc == NVH_OK) *off = nvh_block_off(h, b) + NVH_HDR;
            else nvh_extent_put(a, b, need);
        }
    }
    debug_validate(h, a, "reserve");
    return rc;
}

void *nvh_reserve(nvh_pool *pool, size_t size)
{
    nvh_heap *h = heap_of(pool, true);
    if (!h) return NULL;
    if (size > pool->max_size) {
        nvh_fail(NVH_E_NOSPACE, "cannot reserve %zu bytes: larger than the pool's maximum", size);
        return NULL;
    }
    unsigned cls = nvh_cls_of(size);
    nvh_tcache *tc = tl_tc;
    if (cls) {
        /* fast path: the thread's cache (no lock, no atomic RMW) */
        if (__builtin_expect(tc != NULL, 1) &&
            atomic_load_explicit(&tc->heap, memory_order_relaxed) == h && tc->n[cls])
            return h->base + tc->off[cls][--tc->n[cls]];
        if (!tc || atomic_load_explicit(&tc->heap, memory_order_relaxed) != h)
            tc = tc_attach(h);
    }
    nvh_arena *a = nvh_arena_mine(h);
    uint64_t off = 0;
    int rc;
    uint64_t need = cls ? 0 : ((uint64_t)size + NVH_HDR + NVH_BLOCK - 1) / NVH_BLOCK;
    if (!cls && need > h->bpc / 2) {
        nvh_alock_lock(&a->lock);
        rc = reserve_huge(h, a, size, &off);
        nvh_alock_unlock(&a->lock);
    } else {
        /* Free space anywhere before the pool grows: this arena's (its
         * bins, extents, FIFO, and every chunk left to scan), then the
         * other arenas' (a reservation in another arena's chunk is that
         * arena's: activation and free find it through the chunk's
         * owner), and only then a fresh chunk for this arena. */
        nvh_alock_lock(&a->lock);
        a->no_grow = true;
        rc = reserve_in(h, a, tc, cls, need, &off);
        a->no_grow = false;
        nvh_alock_unlock(&a->lock);
        for (unsigned i = 0; rc == NVH_E_NOSPACE && i < NVH_RINGS; i++) {
            nvh_arena *o = &h->arenas[i];
            if (o == a) continue;
            nvh_alock_lock(&o->lock);
            o->no_grow = true;
            rc = reserve_in(h, o, tc, cls, need, &off);
            o->no_grow = false;
            nvh_alock_unlock(&o->lock);
        }
        if (rc == NVH_E_NOSPACE) {
            nvh_alock_lock(&a->lock);
            rc = reserve_in(h, a, tc, cls, need, &off);
            nvh_alock_unlock(&a->lock);
        }
    }
    if (rc != NVH_OK) return NULL;
    return h->base + off;
}

/* inlined: it runs on every activate, cancel and free */
static inline __attribute__((always_inline)) int
check_heap_ptr(nvh_heap *h, const void *ptr, uint64_t *off_out)
{
    if (!ptr) return nvh_fail(NVH_E_INVAL, "pointer is NULL");
    if (!nvh_contains(h->pool, ptr, 1))
        return nvh_fail(NVH_E_BADPTR, "pointer %p is outside pool %s", ptr, h->pool->path);
    uint64_t off = nvh_off(h->pool, ptr);
    if (off < h->chunks_off + NVH_HDR || off % NVH_ALLOC_ALIGN ||
        (off - h->chunks_off) % NVH_BLOCK == 0)
        return nvh_fail(NVH_E_BADPTR, "offset %llu of pool %s is not an object",
                        (unsigned long long)off, h->pool->path);
    *off_out = off;
    return NVH_OK;
}

int nvh_cancel(nvh_pool *pool, void *ptr)
{
    nvh_heap *h = heap_of(pool, true);
    if (!h) return nvh_errcode();
    uint64_t off = 0;
    int rc = check_heap_ptr(h, ptr, &off);
    if (rc != NVH_OK) return rc;
    nvh_named_drop_pending(h, off);
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, b);
    if (c >= h->max_chunks || atomic_load(&h->owner[c]) < 0)
        return nvh_fail(NVH_E_BADPTR, "%p is not a reservation", ptr);
    nvh_arena *a = &h->arenas[atomic_load(&h->owner[c])];
    nvh_alock_lock(&a->lock);
    rc = nvh_fail(NVH_E_BADPTR, "%p is not a reservation", ptr);
    nvh_run *run = run_lookup(h, b);
    nvh_resv *r;
    unsigned slot = 0;
    if (run && nvh_slot_of(rel % NVH_BLOCK, run->cls, &slot)) {
        if (slot < run->nslots && ((run->resv | run->tcached) & (1ull << slot)) &&
            !tc_holds(h, off, run->cls)) {
            run->resv &= ~(1ull << slot);
            run->tcached &= ~(1ull << slot);
            run->avail |= 1ull << slot;
            nvh_bin_add(a, run);
            rc = NVH_OK;
        }
    } else if (rel % NVH_BLOCK == NVH_HDR && (r = resv_find(a, b))) {
        if (r->kind == NVH_RK_HUGE) nvh_huge_put(h, b / h->bpc, r->blocks / h->bpc);
        else nvh_extent_put(a, b, r->blocks);
        resv_remove(a, r);
        rc = NVH_OK;
    }
    nvh_alock_unlock(&a->lock);
    return rc;
}

/* ==========================================================================
 * Activate
 * ========================================================================== */
/* Fill prefix/remainder so that the persistent tiling stays a tiling: the
 * free region containing the new one is split around it. */
static int plan_split(nvh_heap *h, uint64_t b, uint64_t n, bool huge, struct nvh_rec *rec)
{
    uint64_t plen = 0, qlen = 0;
    uint64_t p = nvh_pview_containing(h, b, &plen);
    uint64_t q = nvh_pview_containing(h, b + n - 1, &qlen);
    uint64_t prefix = p == UINT64_MAX ? 0 : b - p;
    uint64_t rem = q == UINT64_MAX ? 0 : q + qlen - (b + n);
    if (q != UINT64_MAX && q + qlen < b + n) rem = 0;
    if (huge) {
        if (prefix % h->bpc || prefix / h->bpc > UINT16_MAX)
            return nvh_fail(NVH_E_NOTSUP, "huge region split too far from its free region");
        prefix /= h->bpc;
    } else if (prefix > UINT16_MAX) {
        return nvh_fail(NVH_E_NOTSUP, "region split too far from its free region");
    }
    if (rem > UINT32_MAX) return nvh_fail(NVH_E_NOTSUP, "remainder too large");
    rec->prefix = (uint16_t)prefix;
    rec->remainder = (uint32_t)rem;
    return NVH_OK;
}

static void pview_after(nvh_heap *h, const struct nvh_rec *rec, uint64_t b, uint64_t n, bool huge)
{
    uint64_t pre = huge ? (uint64_t)rec->prefix * h->bpc : rec->prefix;
    if (pre) nvh_pview_set(h, b - pre, pre);
    if (huge) {
        for (uint64_t x = b + h->bpc; x < b + n; x += h->bpc) nvh_pview_set(h, x, 0);
    } else {
        for (uint64_t x = b + 1; x < b + n; x++) nvh_pview_set(h, x, 0);
    }
    nvh_pview_set(h, b, n);
    if (rec->remainder) nvh_pview_set(h, b + n, rec->remainder);
}

/* The activation itself; inlined into nvh_activate (the public path) and
 * into nvh_activate_off_ (named activations), as free_off below. */
static inline __attribute__((always_inline)) int
activate_off(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links, unsigned nlinks,
             int64_t named_slot)
{
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK, in = rel % NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, b);
    int16_t own = c < h->max_chunks ? atomic_load(&h->owner[c]) : -1;
    if (own < 0) return nvh_fail(NVH_E_BADPTR, "offset %llu is not a reservation",
                                 (unsigned long long)off);
    nvh_arena *a = &h->arenas[own];
    struct nvh_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.obj = off;
    rec.kind_links = named_slot >= 0 ? NVH_REC_ACT_NAMED : NVH_REC_ACT;
    if (named_slot >= 0) rec.link[0].addr = (uint64_t)named_slot;

    nvh_alock_lock(&a->lock);
    nvh_redo_preflush(h, a);
    int rc = NVH_OK;
    bool heap_locked = false;
    nvh_run *run = run_lookup(h, b);
    nvh_resv *rv = NULL;
    unsigned slot = 0;
    if (run && nvh_slot_of(in, run->cls, &slot) && slot < run->nslots &&
        ((run->resv | run->tcached) & (1ull << slot)) && !tc_holds(h, off, run->cls)) {
        if (run->persisted && !nvh_run_hdr_valid(h, run, b)) {
            nvh_corrupt_report(h, nvh_block_off(h, b), "run header corrupt at activation");
            run->quarantined = true;
            run->resv &= ~(1ull << slot);
            run->tcached &= ~(1ull << slot);
            rc = nvh_fail(NVH_E_CORRUPT, "run header at offset %llu fails its checksum; "
                          "the run is quarantined", (unsigned long long)nvh_block_off(h, b));
            goto out;
        }
        rec.cls_flags = (uint8_t)(run->cls | (NVH_RK_RUN << NVH_RECF_KIND_SHIFT));
        rec.blocks = 1;
        if (!run->persisted) {
            rec.cls_flags |= NVH_RECF_NEWRUN;
            rc = plan_split(h, b, 1, false, &rec);
            if (rc != NVH_OK) goto out;
        }
    } else if (in == NVH_HDR && (rv = resv_find(a, b))) {
        bool huge = rv->kind == NVH_RK_HUGE;
        /* huge regions split free regions that span chunks other arenas may
         * be splitting too: plan and apply under the heap lock */
        if (huge) { pthread_mutex_lock(&h->lock); heap_locked = true; }
        rec.cls_flags = (uint8_t)(rv->kind << NVH_RECF_KIND_SHIFT);
        rec.blocks = (uint32_t)rv->blocks;
        rc = plan_split(h, b, rv->blocks, huge, &rec);
        if (rc != NVH_OK) goto out;
    } else {
        bool active = run ? (in >= NVH_HDR && (run->pbits & (1ull << slot)))
                          : (nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state == NVH_RS_USED);
        rc = nvh_fail(active ? NVH_E_INVAL : NVH_E_BADPTR, "offset %llu is %s",
                      (unsigned long long)off, active ? "already active" : "not a reservation");
        goto out;
    }
    struct nvh_link_entry named_links[6];
    if (named_slot >= 0) {
        /* the record's second line carries the name (see redo.c) */
        memset(named_links, 0, sizeof named_links);
        named_links[0].addr = (uint64_t)named_slot;
        memcpy(&named_links[2], nvh_named_pending_name(h, off), 56);
        links = named_links;
        nlinks = 6;
    }
    nvh_redo_append1(h, a, &rec, links, nlinks);
    if (run && !rv && !(rec.cls_flags & NVH_RECF_NEWRUN) && named_slot < 0) {
        /* the common case: a slot of a run already on the media */
        nvh_rec_apply_slot(h, a, &rec, nvh_rhdr_at(h, b), run, slot, links, nlinks, true);
    } else {
        nvh_rec_apply_state(h, &rec, links, a, false);
        nvh_rec_apply_links(h, &rec, links, a, false);
    }
    if (run && !rv) {
        if (!run->persisted) pview_after(h, &rec, b, 1, false);
        run->resv &= ~(1ull << slot);
        run->tcached &= ~(1ull << slot);
        run->pbits |= 1ull << slot;
        run->persisted = true;
    } else {
        pview_after(h, &rec, b, rv->blocks, rv->kind == NVH_RK_HUGE);
        resv_remove(a, rv);
    }
out:
    if (heap_locked) pthread_mutex_unlock(&h->lock);
    a->links_clwb = false;      /* a failed activation issued no fence */
    nvh_alock_unlock(&a->lock);
    return rc;
}

static inline __attribute__((always_inline)) int
check_link(nvh_heap *h, const nvh_off_t *link, uint64_t *off_out)
{
    if (!link) return nvh_fail(NVH_E_INVAL, "link pointer is NULL");
    if (!nvh_contains(h->pool, link, 8) || (uintptr_t)link % 8)
        return nvh_fail(NVH_E_INVAL, "link %p is not an aligned word inside the pool",
                        (const void *)link);
    uint64_t off = nvh_off(h->pool, link);
    if (off < h->pool->sb->header.root_offset || (off >= h->heap_off && off < h->chunks_off))
        return nvh_fail(NVH_E_INVAL, "link at offset %llu lies in pool metadata",
                        (unsigned long long)off);
    *off_out = off;
    return NVH_OK;
}

int nvh_activate_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                      unsigned nlinks, int64_t named_slot)
{
    return activate_off(h, off, links, nlinks, named_slot);
}

int nvh_activate(nvh_pool *pool, void *ptr, nvh_off_t *const links[], unsigned nlinks)
{
    nvh_heap *h = heap_of(pool, true);
    if (!h) return nvh_errcode();
    uint64_t off = 0;
    int rc = check_heap_ptr(h, ptr, &off);
    if (rc != NVH_OK) return rc;
    if (nlinks > NVH_LINKS_MAX || (nlinks && !links))
        return nvh_fail(NVH_E_INVAL, "nvh_activate: %u links (at most %u)", nlinks, NVH_LINKS_MAX);
    struct nvh_link_entry e[NVH_LINKS_MAX_];
    for (unsigned i = 0; i < nlinks; i++) {
        rc = check_link(h, links[i], &e[i].addr);
        if (rc != NVH_OK) return rc;
        e[i].value = atomic_load_explicit((_Atomic uint64_t *)links[i], memory_order_relaxed);
    }
    return activate_off(h, off, e, nlinks, -1);
}

/* ==========================================================================
 * Free
 * ========================================================================== */
/* Unscanned chunk: does the persistent chain from the chunk's start reach
 * block b exactly (so b is a region start, even if its header is damaged)? */
static bool chain_reaches(nvh_heap *h, uint64_t b)
{
    uint64_t x = nvh_chunk_of_block(h, b) * h->bpc;
    if (x == b) return true;
    if (!nvh_rhdr_valid(h, x) || nvh_rhdr_at(h, x)->kind == NVH_RK_HUGE) return false;
    while (x < b) {
        if (!nvh_rhdr_valid(h, x)) return false;
        x += nvh_rhdr_at(h, x)->blocks;
    }
    return x == b;
}

/* The free itself; inlined into nvh_free (the public path: no second call
 * and prologue per free) and into nvh_free_off_ (named frees). */
static inline __attribute__((always_inline)) int
free_off(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links, unsigned nlinks,
         int64_t named_slot)
{
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK, in = rel % NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, b);
    if (c >= h->max_chunks || c >= __atomic_load_n(&h->hwm, __ATOMIC_ACQUIRE))
        return nvh_fail(NVH_E_BADPTR, "offset %llu is beyond the heap's chunks",
                        (unsigned long long)off);
    nvh_arena *a;
    for (;;) {   /* the owner may change while we wait (lazy scan claims) */
        /* an owned chunk without the call (nvh_owner_arena claims it if not) */
        int16_t own = atomic_load_explicit(&h->owner[c], memory_order_acquire);
        a = own >= 0 ? &h->arenas[own] : nvh_owner_arena(h, b);
        nvh_alock_lock(&a->lock);
        if (atomic_load_explicit(&h->owner[c], memory_order_acquire) == (int16_t)a->index) break;
        nvh_alock_unlock(&a->lock);
    }
    nvh_redo_preflush(h, a);
    int rc = NVH_OK;
    struct nvh_rhdr *hd = nvh_rhdr_at(h, b);
    nvh_chunk *ch = &h->chunks[c];
    bool scanned = __atomic_load_n(&ch->scanned, __ATOMIC_ACQUIRE);
    struct nvh_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.obj = off;
    rec.kind_links = named_slot >= 0 ? NVH_REC_FREE_NAMED : NVH_REC_FREE;
    if (named_slot >= 0) rec.link[0].addr = (uint64_t)named_slot;
    /* The run descriptor, looked up once for all the checks below: under
     * the owner's lock it cannot change (a lookup per check would cost ~40
     * instructions per free). */
    nvh_run *run = run_lookup(h, b);
    unsigned s = 0;
    bool s_ok = run && nvh_slot_of(in, run->cls, &s);
    {   /* a reservation that was never activated: nvh_cancel is the way back */
        bool reserved = false;
        if (s_ok) {
            /* a slot still in the caller's own cache is free (DOUBLEFREE below) */
            reserved = s < run->nslots && ((run->resv & (1ull << s)) ||
                                           ((run->tcached & (1ull << s)) &&
                                            !tc_holds(h, off, run->cls)));
        } else if (in == NVH_HDR) {
            reserved = resv_find(a, b) != NULL;
        }
        if (reserved) {
            rc = nvh_fail(NVH_E_BADPTR, "offset %llu is reserved, not activated (use nvh_cancel)",
                          (unsigned long long)off);
            goto out;
        }
    }
    if (!nvh_run_hdr_valid(h, run, b)) {
        bool known_start = scanned ? (h->pview[b] != 0 || run_lookup(h, b)) : chain_reaches(h, b);
        if (known_start || hd->magic == NVH_RHDR_MAGIC) {
            nvh_corrupt_report(h, nvh_block_off(h, b), "region header corrupt at free");
            if (run) run->quarantined = true;
            else nvh_quarantine_add(h, b, 1);
            rc = nvh_fail(NVH_E_CORRUPT, "header at offset %llu fails its checksum; the region "
                          "is quarantined", (unsigned long long)nvh_block_off(h, b));
        } else {
            rc = nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
        }
        goto out;
    }
    if (hd->state == NVH_RS_QUARANTINE) {
        rc = nvh_fail(NVH_E_CORRUPT, "offset %llu lies in a quarantined region",
                      (unsigned long long)off);
        goto out;
    }
    unsigned slot = s;
    if (hd->kind == NVH_RK_RUN) {
        /* the slot from the media header's class (the DRAM one agrees
         * unless the header was rewritten under a stale descriptor) */
        bool ok = s_ok && run->cls == hd->cls ? true : nvh_slot_of(in, hd->cls, &slot);
        if (!ok || slot >= hd->nslots) {
            rc = nvh_fail(NVH_E_BADPTR, "offset %llu is not a slot of its run",
                          (unsigned long long)off);
            goto out;
        }
        /* the run's DRAM view when it has one: its media bitmap is only
         * brought up to date at the ring's retire (redo.c, wear) */
        nvh_run *drun = scanned ? run : NULL;
        uint64_t bits = drun ? drun->pbits
                             : atomic_load_explicit(&hd->bitmap, memory_order_relaxed);
        if (!(bits & (1ull << slot))) {
            if (run && (run->resv & (1ull << slot)))
                rc = nvh_fail(NVH_E_BADPTR, "offset %llu is reserved, not activated "
                              "(use nvh_cancel)", (unsigned long long)off);
            else
                rc = nvh_fail(NVH_E_DOUBLEFREE, "offset %llu is already free",
                              (unsigned long long)off);
            goto out;
        }
        rec.cls_flags = (uint8_t)(hd->cls | (NVH_RK_RUN << NVH_RECF_KIND_SHIFT));
        rec.blocks = 1;
    } else if (hd->kind == NVH_RK_LARGE || hd->kind == NVH_RK_HUGE) {
        if (in != NVH_HDR || (scanned && h->pview[b] != hd->blocks)) {
            rc = nvh_fail(NVH_E_BADPTR, "offset %llu is not the start of an object",
                          (unsigned long long)off);
            goto out;
        }
        if (hd->state != NVH_RS_USED) {
            rc = nvh_fail(NVH_E_DOUBLEFREE, "offset %llu is already free",
                          (unsigned long long)off);
            goto out;
        }
        rec.cls_flags = (uint8_t)(hd->kind << NVH_RECF_KIND_SHIFT);
        rec.blocks = hd->blocks;
    } else {
        rc = nvh_fail(hd->state == NVH_RS_FREE ? NVH_E_DOUBLEFREE : NVH_E_BADPTR,
                      "offset %llu is not an allocated object", (unsigned long long)off);
        goto out;
    }
    uint64_t seq = nvh_redo_append1(h, a, &rec, links, nlinks);
    unsigned rk = rec.cls_flags >> NVH_RECF_KIND_SHIFT;
    if (rk == NVH_RK_RUN && run && named_slot < 0) {
        /* the common case, with the run and slot found above */
        nvh_rec_apply_slot(h, a, &rec, hd, run, slot, links, nlinks, false);
    } else {
        nvh_rec_apply_state(h, &rec, links, a, false);
        nvh_rec_apply_links(h, &rec, links, a, false);
    }
    /* the chunk has free space again (rare: only chunks found full, by
     * this session or, for a chunk it has not scanned, an earlier one) */
    if (__builtin_expect(atomic_load_explicit(&ch->full_mark, memory_order_relaxed) ||
                             (!scanned && nvh_fullmap_test(h, c)), 0))
        nvh_fullmap_clear(h, a, c, false);
    if (!scanned) {
        /* DRAM knows nothing of this chunk yet: the scan will find the space
         * free; it must not be reused before this record is retired. We hold
         * the chunk owner's lock, which the scan holds too (nvh_chunk_claim) */
        if (atomic_load_explicit(&ch->unscanned_free_seq, memory_order_relaxed) < seq)
            atomic_store_explicit(&ch->unscanned_free_seq, seq, memory_order_relaxed);
    } else if (rk == NVH_RK_RUN) {
        if (run) {
            run->pbits &= ~(1ull << slot);
            /* the FIFO entry names the run: only if the slot is one of its
             * own (a header rewritten under a stale descriptor: the space is
             * lost until the next open, as the old release check did) */
            if (run->cls == hd->cls) fifo_push(h, a, run, 0, 0, (uint8_t)slot, seq, nvh_cls_size(run->cls));
        }
    } else {
        fifo_push(h, a, NULL, b, rec.blocks, rk == NVH_RK_HUGE, seq,
                  (uint64_t)rec.blocks * NVH_BLOCK);
    }
    /* Drain in batches: the FIFO head can only leave once its record is
     * retired (and its time is up), so trying on every free mostly finds it
     * blocked. Over the byte bound: drain now, retiring if need be. Else
     * every NVH_FIFO_BATCH entries, unless the head is still waiting for a
     * retire that has not happened. Reserve drains too when it needs space. */
    if (a->fifo_bytes > atomic_load_explicit(&h->fifo_max_bytes, memory_order_relaxed))
        fifo_drain(h, a, false, true);
    else if (a->fifo_len >= NVH_FIFO_BATCH &&
             a->fifo_blocked != 1 + atomic_load_explicit(&h->retire_epoch, memory_order_relaxed))
        fifo_drain(h, a, false, false);
    debug_validate(h, a, "free");
out:
    a->links_clwb = false;      /* a failed free issued no fence */
    nvh_alock_unlock(&a->lock);
    return rc;
}

int nvh_free_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                  unsigned nlinks, int64_t named_slot)
{
    return free_off(h, off, links, nlinks, named_slot);
}

int nvh_free(nvh_pool *pool, void *ptr, const nvh_link *links, unsigned nlinks)
{
    nvh_heap *h = heap_of(pool, true);
    if (!h) return nvh_errcode();
    uint64_t off = 0;
    int rc = check_heap_ptr(h, ptr, &off);
    if (rc != NVH_OK) return rc;
    if (nlinks > NVH_LINKS_MAX || (nlinks && !links))
        return nvh_fail(NVH_E_INVAL, "nvh_free: %u links (at most %u)", nlinks, NVH_LINKS_MAX);
    struct nvh_link_entry e[NVH_LINKS_MAX_];
    for (unsigned i = 0; i < nlinks; i++) {
        rc = check_link(h, links[i].link, &e[i].addr);
        if (rc != NVH_OK) return rc;
        if (*links[i].link != off)
            return nvh_fail(NVH_E_INVAL, "link %u does not point at the object", i);
        e[i].value = links[i].value;
    }
    /* the name would point at memory handed to the next object */
    if (nvh_named_has(h, off))
        return nvh_fail(NVH_E_INVAL, "nvh_free: the object at offset %llu is named; use "
                        "nvh_free_named", (unsigned long long)off);
    return free_off(h, off, e, nlinks, -1);
}

/* ==========================================================================
 * nvh_alloc, usable size, settings
 * ========================================================================== */
void *nvh_alloc(nvh_pool *pool, size_t size, nvh_ctor_fn ctor, void *arg, nvh_off_t *link)
{
    void *p = nvh_reserve(pool, size);
    if (!p) return NULL;
    /* the constructor (or the zeroing) writes the new object on the
     * caller's behalf: inside a window on it, closed once it is durable */
    size_t wlen = size ? size : 1;
    nvh_protect_open_(pool, p, wlen);
    if (ctor) {
        if (ctor(pool, p, size, arg) != 0) {
            nvh_protect_close_(pool, p, wlen);
            nvh_cancel(pool, p);
            nvh_fail(NVH_E_ABORTED, "nvh_alloc: the constructor failed");
            return NULL;
        }
    } else {
        memset(p, 0, size);
    }
    /* the content must be durable before the record can be: its own fence */
    nvh_persist(pool, p, wlen);
    nvh_protect_close_(pool, p, wlen);
    nvh_off_t *links[1] = {link};
    if (nvh_activate(pool, p, links, link ? 1 : 0) != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, p);
        nvh_fail(code, "nvh_alloc: activation failed");
        return NULL;
    }
    return p;
}

int nvh_heap_usable(nvh_heap *h, uint64_t off, uint64_t *usable)
{
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK, in = rel % NVH_BLOCK;
    /* The DRAM state of the chunk (its runs' bitmaps, its reservations) is
     * its owner arena's: read it under that arena's lock, since another
     * thread may be allocating or freeing in the same run right now. An
     * owned chunk keeps its owner. Reservations come before the media
     * header: a reservation's header is not ours yet (another thread's
     * activation may be writing a free remainder's header there now). */
    uint64_t c = nvh_chunk_of_block(h, b);
    int16_t own = c < h->max_chunks ? atomic_load(&h->owner[c]) : -1;
    if (own >= 0) {
        nvh_arena *a = &h->arenas[own];
        int found = 0;           /* 1: an object, -1: not one (DRAM is the truth) */
        nvh_alock_lock(&a->lock);
        nvh_run *run = run_lookup(h, b);
        unsigned slot = 0;
        if (run && nvh_slot_of(in, run->cls, &slot)) {
            /* the DRAM view is the truth (the media bitmap lags until retire) */
            found = slot < run->nslots && ((run->resv | run->tcached | run->pbits) & (1ull << slot))
                        ? 1 : -1;
            if (found > 0) *usable = nvh_cls_size(run->cls);
        } else if (in == NVH_HDR) {
            nvh_resv *r = resv_find(a, b);
            if (r) {
                *usable = r->blocks * NVH_BLOCK - NVH_HDR;
                found = 1;
            }
        }
        nvh_alock_unlock(&a->lock);
        if (found > 0) return NVH_OK;
        if (found < 0)
            return nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
    }
    if (nvh_rhdr_valid(h, b)) {
        const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
        if (r->state == NVH_RS_USED && r->kind == NVH_RK_RUN && r->cls &&
            r->cls <= NVH_SMALL_CLASSES && in >= NVH_HDR &&
            (in - NVH_HDR) % nvh_cls_size(r->cls) == 0 &&
            (in - NVH_HDR) / nvh_cls_size(r->cls) < r->nslots &&
            (atomic_load(&((struct nvh_rhdr *)r)->bitmap) &
             (1ull << ((in - NVH_HDR) / nvh_cls_size(r->cls))))) {
            *usable = nvh_cls_size(r->cls);
            return NVH_OK;
        }
        if (r->state == NVH_RS_USED && (r->kind == NVH_RK_LARGE || r->kind == NVH_RK_HUGE) &&
            in == NVH_HDR) {
            *usable = (uint64_t)r->blocks * NVH_BLOCK - NVH_HDR;
            return NVH_OK;
        }
    }
    return nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
}

size_t nvh_usable_size(nvh_pool *pool, const void *ptr)
{
    nvh_heap *h = heap_of(pool, false);
    if (!h) return 0;
    uint64_t off = 0, usable = 0;
    if (check_heap_ptr(h, ptr, &off) != NVH_OK) return 0;
    if (nvh_heap_usable(h, off, &usable) != NVH_OK) return 0;
    return (size_t)usable;
}

int nvh_heap_sync(nvh_pool *pool)
{
    nvh_heap *h = heap_of(pool, true);
    if (!h) return nvh_errcode();
    nvh_redo_retire_all(h);
    return NVH_OK;
}

int nvh_heap_config_get(nvh_pool *pool, nvh_heap_config *config)
{
    nvh_heap *h = heap_of(pool, false);
    if (!h) return nvh_errcode();
    if (!config) return nvh_fail(NVH_E_INVAL, "config is NULL");
    config->fifo_delay_ns = atomic_load(&h->fifo_delay_ns);
    config->fifo_max_bytes = atomic_load(&h->fifo_max_bytes);
    config->arenas = atomic_load(&h->narenas);
    return NVH_OK;
}

int nvh_heap_config_set(nvh_pool *pool, const nvh_heap_config *config)
{
    nvh_heap *h = heap_of(pool, false);
    if (!h) return nvh_errcode();
    if (!config || config->arenas < 1 || config->arenas > NVH_RINGS)
        return nvh_fail(NVH_E_INVAL, "arenas must be 1..%u", NVH_RINGS);
    atomic_store(&h->fifo_delay_ns, config->fifo_delay_ns);
    atomic_store(&h->fifo_max_bytes, config->fifo_max_bytes);
    atomic_store(&h->narenas, config->arenas);
    return NVH_OK;
}
