/* reserve.c — nvh_reserve and nvh_cancel: a reservation is DRAM only (a
 * crash loses it, nvh_cancel gives it back), except when a large or huge
 * reservation spans several persistent free regions, which are merged on
 * the media first (span_merge, docs/ALLOC.md §5a).
 *
 *   small (<= 4032 B, and the classes above it up to 13056 B, alloc.h):
 *                      a slot of a run, from the thread's cache (tcache.c)
 *                      or the arena's bins; a new run from a free extent
 *   large (<= half a chunk): blocks from the arena's free extents
 *   huge: whole chunks from the heap's free-chunk list
 *
 * Where space comes from, in order: this arena's bins, extents and FIFO and
 * every chunk left to scan, then the other arenas' free space, and only
 * then a fresh chunk (the pool grows). */
#include "alloc.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Space for an arena
 * ========================================================================== */
/* Find more space for arena a (held locked; may be dropped and retaken). */
static int refill(nvh_heap *h, nvh_arena *a)
{
    if (nvh_fifo_drain(h, a, false, true)) return NVH_OK;
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
        if (nvh_fifo_drain(h, a, false, true)) return NVH_OK;
    }
    /* nothing left to scan: the caller looks at the other arenas before
     * it lets this one grow the pool (nvh_reserve). Not an error of the
     * call (no message: a reservation that then succeeds leaves none) */
    if (a->no_grow) return NVH_E_NOSPACE;
    /* pool full: take FIFO space early (space pressure overrides T) */
    if (nvh_fifo_drain(h, a, true, true)) return NVH_OK;
    if (a->fifo_len) {
        nvh_alock_unlock(&a->lock);
        nvh_redo_retire_all(h);
        nvh_alock_lock(&a->lock);
        if (nvh_fifo_drain(h, a, true, true)) return NVH_OK;
    }
    if (nvh_errcode() != NVH_E_NOSPACE)
        nvh_fail(NVH_E_NOSPACE, "pool %s is full", h->pool->path);
    return NVH_E_NOSPACE;
}

/* ==========================================================================
 * Small, large and huge reservations
 * ========================================================================== */
/* A small slot of class cls from arena a's bins (a new run if need be).
 * Caller holds a->lock. */
int nvh_reserve_small(nvh_heap *h, nvh_arena *a, unsigned cls, uint64_t *off)
{
    for (;;) {
        nvh_run *run = nvh_bin_first(a, cls);
        if (run) {
            unsigned slot = nvh_run_pick(run);
            *off = nvh_run_slot_off(h, run, slot);
            return NVH_OK;
        }
        uint64_t b;
        unsigned nb = nvh_run_blocks_for(cls, a->nruns[cls]);
        bool got = nvh_extent_take(h, a, nb, &b);
        if (!got) {
            int rc = refill(h, a);
            if (rc == NVH_OK) continue;
            if (rc != NVH_E_NOSPACE || !a->no_grow) return rc;
            /* Nothing left to scan and the pool would grow: a smaller run
             * in the free space there is (holes between runs of other
             * sizes) before the other arenas are asked and the pool grows */
            for (unsigned lv = NVH_RUN_LEVELS; !got && lv-- > 0;) {
                unsigned n2 = nvh_run_blocks_for(cls, lv);
                if (n2 < nb && nvh_extent_take(h, a, n2, &b)) {
                    nb = n2;
                    got = true;
                }
            }
            if (!got) return rc;
        }
        if (!nvh_run_new(h, a, b, cls, nb)) {
            nvh_extent_put(a, b, nb);
            return nvh_fail(NVH_E_NOMEM, "out of memory for a run descriptor");
        }
    }
}

/* Record a large or huge reservation (DRAM only: a crash loses it). */
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
 * free region, which activation splits as usual (activate.c: plan_split). Reserve
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
    rec.obj = nvh_block_off(h, start);
    rec.blocks = (uint32_t)(end - start);
    rec.kind_links = NVH_REC_FREE;
    rec.cls_flags = (uint8_t)(NVH_RECF_MERGE |
                              ((huge ? NVH_RK_HUGE : NVH_RK_LARGE) << NVH_RECF_KIND_SHIFT));
    nvh_redo_append1(h, a, &rec, NULL, 0);
    nvh_rec_apply_state(h, &rec, NULL, a, false);
    /* durable before the caller can write over the old headers: a crashed
     * pool then reads consistently even before recovery (nvheap check of a
     * read-only open); only the fence window itself relies on replay */
    nvh_persist(h->pool, nvh_rhdr_at(h, start), sizeof(struct nvh_rhdr));
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
    uint64_t nch = ((uint64_t)size + h->chunk_size - 1) / h->chunk_size;
    uint64_t c = 0, rem = 0;
    int rc;
    uint64_t zmax = nvh_zone_max_chunks(h->zone0);
    if (nch > zmax)             /* no region spans a header chunk (alloc.h) */
        return nvh_fail(NVH_E_NOSPACE, "cannot reserve %zu bytes: an object lies in one zone, "
                        "at most %llu chunks (%llu bytes) in pool %s (create the pool at the "
                        "size it needs: zone 0 covers the pool's size at creation)", size,
                        (unsigned long long)zmax, (unsigned long long)(zmax * h->chunk_size),
                        h->pool->path);
    for (unsigned tries = 0;; tries++) {
        rc = nvh_huge_take(h, nch, &c, &rem, false);
        if (rc == NVH_OK) break;
        if (nvh_fifo_drain(h, a, false, true)) continue;
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
        if (nvh_fifo_drain(h, a, true, true)) continue;
        if (a->fifo_len) {
            nvh_alock_unlock(&a->lock);
            nvh_redo_retire_all(h);
            nvh_alock_lock(&a->lock);
            if (nvh_fifo_drain(h, a, true, true)) continue;
        }
        return rc;
    }
    nvh_owner_set(h, c, a->index, memory_order_release);
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
    *off = nvh_block_off(h, c * h->bpc);
    return NVH_OK;
}

unsigned nvh_run_early_ = NVH_RUN_EARLY;

/* A small slot (cls > 0; into the thread's cache if it has one) or a large
 * region of `need` blocks from arena a. Caller holds a->lock. */
static int reserve_in(nvh_heap *h, nvh_arena *a, nvh_tcache *tc, unsigned cls, uint64_t need,
                      uint64_t *off)
{
    int rc;
    if (cls && !a->nruns[cls] && a->early[cls] < nvh_run_early_ && nvh_run_slots(cls, 1) < 2) {
        a->early[cls]++;        /* a large region of the class's size (alloc.h) */
        need = (nvh_cls_size(cls) + NVH_BLOCK - 1) / NVH_BLOCK;
        cls = 0;
    }
    if (cls) {
        rc = tc ? nvh_tcache_refill(h, a, tc, cls, off) : nvh_reserve_small(h, a, cls, off);
    } else {
        uint64_t b = 0;
        for (;;) {
            if (nvh_extent_take(h, a, need, &b)) { rc = NVH_OK; break; }
            rc = refill(h, a);
            if (rc != NVH_OK) break;
        }
        if (rc == NVH_OK) {
            rc = span_merge(h, a, b, need, false);
            if (rc == NVH_OK) rc = resv_add(a, b, need, NVH_RK_LARGE);
            if (rc == NVH_OK) *off = nvh_block_off(h, b);
            else nvh_extent_put(a, b, need);
        }
    }
    nvh_arena_debug_check(h, a, "reserve");
    return rc;
}

void *nvh_reserve(nvh_pool *pool, size_t size)
{
    nvh_heap *h = nvh_heap_of(pool, true);
    if (!h) return NULL;
    if (size > pool->max_size) {
        nvh_fail(NVH_E_NOSPACE, "cannot reserve %zu bytes: larger than the pool's maximum", size);
        return NULL;
    }
    unsigned cls = nvh_cls_of(size);
    nvh_tcache *tc = nvh_tcache_mine_;
    if (cls) {
        /* fast path: the thread's cache (no lock, no atomic RMW) */
        if (__builtin_expect(tc != NULL, 1) &&
            atomic_load_explicit(&tc->heap, memory_order_relaxed) == h && tc->n[cls])
            return h->base + tc->off[cls][--tc->n[cls]];
        if (!tc || atomic_load_explicit(&tc->heap, memory_order_relaxed) != h)
            tc = nvh_tcache_attach(h);
    }
    nvh_arena *a = nvh_arena_mine(h);
    uint64_t off = 0;
    int rc;
    /* the header lives in the zone's header chunk: 2^k bytes take 2^k */
    uint64_t need = cls ? 0 : ((uint64_t)size + NVH_BLOCK - 1) / NVH_BLOCK;
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

/* ==========================================================================
 * Cancel
 * ========================================================================== */
int nvh_cancel(nvh_pool *pool, void *ptr)
{
    nvh_heap *h = nvh_heap_of(pool, true);
    if (!h) return nvh_errcode();
    uint64_t off = 0;
    int rc = nvh_check_heap_ptr(h, ptr, &off);
    if (rc != NVH_OK) return rc;
    nvh_named_drop_pending(h, off);
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, b);
    int own = nvh_owner_get(h, c, memory_order_acquire);
    if (own < 0) return nvh_fail(NVH_E_BADPTR, "%p is not a reservation", ptr);
    nvh_arena *a = &h->arenas[own];
    nvh_alock_lock(&a->lock);
    rc = nvh_fail(NVH_E_BADPTR, "%p is not a reservation", ptr);
    nvh_run *run = nvh_run_lookup(h, b);
    nvh_resv *r;
    unsigned slot = 0;
    if (run && nvh_run_slot_at(h, run, off, &slot)) {
        if (((run->resv | run->tcached) & (1ull << slot)) &&
            !nvh_tcache_holds(h, off, run->cls)) {
            run->resv &= ~(1ull << slot);
            run->tcached &= ~(1ull << slot);
            run->avail |= 1ull << slot;
            nvh_bin_add(a, run);
            rc = NVH_OK;
        }
    } else if (rel % NVH_BLOCK == 0 && (r = nvh_resv_find(a, b))) {
        if (r->kind == NVH_RK_HUGE) nvh_huge_put(h, b / h->bpc, r->blocks / h->bpc);
        else nvh_extent_put(a, b, r->blocks);
        nvh_resv_remove(a, r);
        rc = NVH_OK;
    }
    nvh_alock_unlock(&a->lock);
    return rc;
}
