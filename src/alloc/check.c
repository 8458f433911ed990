/* check.c — region-header integrity: checksums over size, state, class and
 * the header's own position ([Moraru11] §3.2), corruption reports (error code,
 * application callback, counter), containment by scanning forward to the next
 * valid header, quarantine; and the whole-heap walks built on them: check
 * (with optional repair), statistics, iteration over live objects. */
#include "alloc.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Headers
 * ========================================================================== */
/* The checks themselves are inline in alloc.h (nvh_rhdr_checksum_,
 * nvh_rhdr_valid_): they run on every activate and free. */
uint32_t nvh_rhdr_checksum(const struct nvh_rhdr *r, uint64_t off)
{
    return nvh_rhdr_checksum_(r, off);
}

bool nvh_rhdr_valid(const nvh_heap *h, uint64_t block)
{
    return nvh_rhdr_valid_(h, block);
}

/* The first block of the region that holds block b, from the media alone
 * (a chunk without DRAM state): b when its header is valid and not free
 * (a used or quarantined header is never stale: runs are never freed, and
 * a freed region's header turns FREE), else the region that the chain from
 * the chunk's first header reaches b in — the later blocks of a run have
 * no header of their own, and their slots may hold stale free headers.
 * UINT64_MAX if the chain is broken before b or b is in a huge region. */
uint64_t nvh_region_start_media(nvh_heap *h, uint64_t b)
{
    if (nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state != NVH_RS_FREE) return b;
    uint64_t x = nvh_chunk_of_block(h, b) * h->bpc;
    while (x <= b) {
        if (!nvh_rhdr_valid(h, x)) return UINT64_MAX;
        const struct nvh_rhdr *r = nvh_rhdr_at(h, x);
        if (r->kind == NVH_RK_HUGE) return UINT64_MAX;
        if (b < x + r->blocks) return x;
        x += r->blocks;
    }
    return UINT64_MAX;
}

void nvh_rhdr_write(nvh_heap *h, uint64_t block, uint32_t blocks, uint8_t state, uint8_t kind,
                    uint8_t cls, uint64_t bitmap, uint64_t seq)
{
    uint64_t off = nvh_block_off(h, block);
    struct nvh_rhdr n;
    memset(&n, 0, sizeof n);
    n.magic = NVH_RHDR_MAGIC;
    n.blocks = blocks;
    n.state = state;
    n.kind = kind;
    n.cls = cls;
    n.nslots = cls ? (uint8_t)nvh_run_slots(cls, blocks) : 0;
    n.seq = seq;
    n.checksum = nvh_rhdr_checksum(&n, off);
    struct nvh_rhdr *r = nvh_rhdr_at(h, block);
    nvh_wopen(h, r, sizeof *r);
    memcpy((char *)r + 8, (char *)&n + 8, 56);
    atomic_store_explicit(&r->bitmap, bitmap, memory_order_relaxed);
    nvh_wclose(h, r, sizeof *r);
}

/* ==========================================================================
 * Corruption reports and quarantine
 * ========================================================================== */
void nvh_corrupt_report(nvh_heap *h, uint64_t off, const char *what)
{
    atomic_fetch_add_explicit(&h->corrupt_count, 1, memory_order_relaxed);
    if (h->corrupt_cb) h->corrupt_cb(h->pool, off, what, h->corrupt_arg);
}

void nvh_quarantine_add(nvh_heap *h, uint64_t block, uint64_t nblocks)
{
    /* callers hold arena and/or heap locks: the list has a lock of its own
     * (innermost in the lock order) */
    pthread_mutex_lock(&h->quar_lock);
    if (h->nquar == h->quar_cap) {
        size_t cap = h->quar_cap ? h->quar_cap * 2 : 8;
        nvh_extent *g = realloc(h->quar, cap * sizeof *g);
        if (!g) {
            pthread_mutex_unlock(&h->quar_lock);
            return;
        }
        h->quar = g;
        h->quar_cap = cap;
    }
    h->quar[h->nquar++] = (nvh_extent){block, nblocks};
    pthread_mutex_unlock(&h->quar_lock);
}

void nvh_heap_set_corruption_handler(nvh_pool *pool, nvh_corruption_fn fn, void *arg)
{
    nvh_heap *h = pool ? (pool->readonly ? pool->heap : nvh_heap_get_(pool)) : NULL;
    if (!h) return;
    h->corrupt_cb = fn;
    h->corrupt_arg = arg;
}

uint64_t nvh_heap_corruptions(const nvh_pool *pool)
{
    return pool && pool->heap ? atomic_load(&pool->heap->corrupt_count) : 0;
}

/* ==========================================================================
 * Walk: every region of every chunk below the high-water mark, following
 * the persistent chain; corrupt headers are contained by skipping to the
 * next valid non-free header.
 * ========================================================================== */
typedef struct walk_cb {
    /* region callback: b = first block, n = blocks, r = header (NULL if corrupt) */
    void (*region)(nvh_heap *h, uint64_t b, uint64_t n, const struct nvh_rhdr *r, void *arg);
    void *arg;
} walk_cb;

static uint64_t skip_corrupt(nvh_heap *h, uint64_t b, uint64_t end)
{
    for (b++; b < end; b++)
        if (nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state != NVH_RS_FREE) return b;
    return end;
}

static void walk_heap(nvh_heap *h, const walk_cb *cb)
{
    uint64_t hwm = 0;
    if (!nvh_hwm_decode(atomic_load_explicit((_Atomic uint64_t *)&h->state->hwm_word,
                                             memory_order_relaxed), &hwm))
        hwm = 0;                 /* damaged since open: this session's mark */
    if (h->hwm > hwm) hwm = h->hwm;
    uint64_t limit_blocks = (nvh_pool_size(h->pool) - h->chunks_off) / NVH_BLOCK;
    uint64_t end_all = hwm * h->bpc;
    if (end_all > limit_blocks) end_all = limit_blocks;
    uint64_t b = 0;
    while (b < end_all) {
        uint64_t cend = (b / h->bpc + 1) * h->bpc;
        if (nvh_chunk_is_hdr(h, b / h->bpc)) {     /* a header chunk: metadata */
            b = cend;
            continue;
        }
        if (cend > end_all) cend = end_all;
        const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
        bool valid = nvh_rhdr_valid(h, b);
        /* a huge region never spans a header chunk (alloc.h, header zones) */
        if (valid && r->kind == NVH_RK_HUGE && b % h->bpc == 0 &&
            nvh_chunks_data(h, b / h->bpc, (r->blocks + h->bpc - 1) / h->bpc)) {
            uint64_t n = r->blocks;
            if (b + n > end_all) n = end_all - b;
            cb->region(h, b, n, r, cb->arg);
            b += n;
            continue;
        }
        /* a zero chunk header below the mark is damage too (heap.c,
         * scan_step): every such chunk was formatted before the mark passed */
        if (!valid || b + r->blocks > cend || r->kind == NVH_RK_HUGE) {
            uint64_t q = skip_corrupt(h, b, cend);
            cb->region(h, b, q - b, (const struct nvh_rhdr *)1, cb->arg); /* corrupt marker */
            b = q;
            continue;
        }
        cb->region(h, b, r->blocks, r, cb->arg);
        b += r->blocks;
    }
}
#define CORRUPT_MARK ((const struct nvh_rhdr *)1)

/* ==========================================================================
 * Check
 * ========================================================================== */
typedef struct check_ctx {
    nvh_check_fn fn;
    void *arg;
    int repair;
    uint64_t corrupt, repaired;
    uint64_t *pending;          /* read-only opens: blocks records will rewrite */
    size_t npending;
    nvh_extent *spans;          /* corrupt spans, excluded after the walk */
    size_t nspans, spans_cap;
} check_ctx;

static bool is_pending(const check_ctx *c, uint64_t b)
{
    size_t lo = 0, hi = c->npending;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (c->pending[m] < b) lo = m + 1; else hi = m;
    }
    return lo < c->npending && c->pending[lo] == b;
}

static void check_region(nvh_heap *h, uint64_t b, uint64_t n, const struct nvh_rhdr *r, void *arg)
{
    check_ctx *c = arg;
    if (r != CORRUPT_MARK) return;
    if (is_pending(c, b)) return;       /* torn by the crash; recovery rewrites it */
    c->corrupt++;
    /* reported by the region it describes (what is lost); the message
     * names the header slot in its header chunk (where the damage is) */
    uint64_t off = nvh_block_off(h, b);
    char what[96];
    snprintf(what, sizeof what, "corrupt region header (header chunk slot at offset %llu)",
             (unsigned long long)nvh_rhdr_off(h, b));
    nvh_corrupt_report(h, off, what);
    if (c->fn) c->fn(off, n * NVH_BLOCK, what, c->arg);
    if (c->nspans == c->spans_cap) {
        size_t cap = c->spans_cap ? c->spans_cap * 2 : 8;
        nvh_extent *g = realloc(c->spans, cap * sizeof *g);
        if (g) { c->spans = g; c->spans_cap = cap; }
    }
    if (c->nspans < c->spans_cap) c->spans[c->nspans++] = (nvh_extent){b, n};
    if (c->repair && !h->pool->readonly) {
        nvh_rhdr_write(h, b, (uint32_t)n, NVH_RS_QUARANTINE, NVH_RK_NONE, 0, 0, 0);
        nvh_persist(h->pool, nvh_rhdr_at(h, b), 64);
        nvh_quarantine_add(h, b, n);
        c->repaired++;
    }
}

int nvh_heap_check(nvh_pool *pool, nvh_check_fn fn, void *arg, int repair, uint64_t *corrupt_out)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_heap_check: pool is NULL");
    nvh_heap *h = pool->heap;
    if (corrupt_out) *corrupt_out = 0;
    if (!h) return NVH_OK;
    if (repair) {
        if (pool->readonly) return nvh_fail(NVH_E_READONLY, "cannot repair a read-only pool");
        nvh_redo_retire_all(h);
    }
    check_ctx c = {fn, arg, repair, 0, 0, NULL, 0, NULL, 0, 0};
    if (pool->readonly) c.pending = nvh_redo_pending_blocks(h, &c.npending);
    walk_cb cb = {check_region, &c};
    pthread_mutex_lock(&h->lock);
    walk_heap(h, &cb);
    pthread_mutex_unlock(&h->lock);
    free(c.pending);
    /* contain: what check found damaged is never handed out in this session
     * (repair also makes it durable); arena locks only after the heap lock
     * is released (lock order) */
    if (!pool->readonly)
        for (size_t i = 0; i < c.nspans; i++) nvh_arena_exclude(h, c.spans[i].block, c.spans[i].nblocks);
    free(c.spans);
    if (corrupt_out) *corrupt_out = c.corrupt;
    if (c.corrupt && !repair)
        return nvh_fail(NVH_E_CORRUPT, "%s: %llu corrupt region header(s)", pool->path,
                        (unsigned long long)c.corrupt);
    return NVH_OK;
}

/* ==========================================================================
 * Statistics
 * ========================================================================== */
/* Free space is measured in spans of adjacent free regions (the walk is in
 * address order): the allocator merges neighbouring free regions when it
 * reserves, so two free regions side by side are one piece of free space,
 * and a pool with nothing allocated reads fragmentation 0. */
typedef struct stats_ctx {
    nvh_heap_stats *s;
    uint64_t span_end, span_bytes;  /* current span of adjacent free regions */
} stats_ctx;

static void stats_region(nvh_heap *h, uint64_t b, uint64_t n, const struct nvh_rhdr *r, void *arg)
{
    stats_ctx *c = arg;
    nvh_heap_stats *s = c->s;
    uint64_t bytes = n * NVH_BLOCK;
    s->heap_bytes += bytes;
    if (r == CORRUPT_MARK) { s->corrupt_regions++; s->quarantined_bytes += bytes; return; }
    if (!r || r->state == NVH_RS_FREE) {
        s->free_bytes += bytes;
        s->free_regions++;
        /* a header chunk between two free regions does not split the span:
         * it is never free space, and an empty pool reads fragmentation 0 */
        bool adj = c->span_end == b ||
                   (c->span_end != UINT64_MAX && c->span_end % h->bpc == 0 &&
                    nvh_chunk_is_hdr(h, c->span_end / h->bpc) && c->span_end + h->bpc == b);
        c->span_bytes = adj ? c->span_bytes + bytes : bytes;
        c->span_end = b + n;
        if (c->span_bytes > s->largest_free) s->largest_free = c->span_bytes;
        return;
    }
    if (r->state == NVH_RS_QUARANTINE) { s->quarantined_bytes += bytes; return; }
    /* object tables 1..14: heap metadata, in heap_bytes but not objects */
    if (r->kind != NVH_RK_RUN && nvh_named_table_obj(h, nvh_block_off(h, b))) return;
    if (r->kind == NVH_RK_RUN && nvh_cls_valid(r->cls)) {
        uint64_t bits = atomic_load_explicit(&((struct nvh_rhdr *)r)->bitmap,
                                             memory_order_relaxed);
        unsigned used = (unsigned)__builtin_popcountll(bits);
        /* the classes above 4032 B together in cls[0] (nvheap.h) */
        nvh_heap_class_stats *k = &s->cls[r->cls <= NVH_SMALL_CLASSES ? r->cls : 0];
        k->runs++;
        k->slots_used += used;
        k->slots_total += r->nslots;
        s->live_objects += used;
        s->live_bytes += (uint64_t)used * nvh_cls_size(r->cls);
        s->run_bytes += bytes;
    } else if (r->kind == NVH_RK_LARGE) {
        s->large_objects++;
        s->live_objects++;
        s->live_bytes += bytes;
    } else if (r->kind == NVH_RK_HUGE) {
        s->huge_objects++;
        s->live_objects++;
        s->live_bytes += bytes;
    }
    (void)h;
}

int nvh_heap_stats_get(nvh_pool *pool, nvh_heap_stats *s)
{
    if (!pool || !s) return nvh_fail(NVH_E_INVAL, "nvh_heap_stats: NULL argument");
    memset(s, 0, sizeof *s);
    nvh_heap *h = pool->heap;
    if (!h) return NVH_OK;
    /* run bitmaps on the media lag until their ring retires (redo.c) */
    if (!pool->readonly) nvh_redo_retire_all(h);
    stats_ctx sc = {s, UINT64_MAX, 0};
    walk_cb cb = {stats_region, &sc};
    pthread_mutex_lock(&h->lock);
    walk_heap(h, &cb);
    s->chunks = h->hwm;
    s->chunk_size = h->chunk_size;
    pthread_mutex_unlock(&h->lock);
    s->fragmentation = s->free_bytes ? 1.0 - (double)s->largest_free / (double)s->free_bytes : 0.0;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        nvh_arena *a = &h->arenas[i];
        nvh_alock_lock(&a->lock);
        s->fifo_entries += a->fifo_len;
        s->fifo_bytes += a->fifo_bytes;
        if (a->fifo_len && a->fifo[a->fifo_head].time_ns) {
            uint64_t t = a->fifo[a->fifo_head].time_ns, now = nvh_now_ns();
            if (now - t > s->fifo_oldest_ns) s->fifo_oldest_ns = now - t;
        }
        nvh_alock_unlock(&a->lock);
    }
    s->corruptions = atomic_load(&h->corrupt_count);
    s->fifo_delay_ns = atomic_load(&h->fifo_delay_ns);
    s->fifo_max_bytes = atomic_load(&h->fifo_max_bytes);
    s->records_replayed = h->replayed;
    return NVH_OK;
}

/* ==========================================================================
 * Iteration over live (activated) objects
 * ========================================================================== */
typedef struct iter_ctx {
    nvh_object_fn fn;
    void *arg;
    int stop;
} iter_ctx;

static void iter_region(nvh_heap *h, uint64_t b, uint64_t n, const struct nvh_rhdr *r, void *arg)
{
    iter_ctx *c = arg;
    if (c->stop || !r || r == CORRUPT_MARK || r->state != NVH_RS_USED) return;
    char *start = h->base + nvh_block_off(h, b);
    /* object tables 1..14 are heap objects but the heap's own metadata */
    if (r->kind != NVH_RK_RUN && nvh_named_table_obj(h, nvh_block_off(h, b))) return;
    if (r->kind == NVH_RK_RUN) {
        if (!nvh_cls_valid(r->cls)) return;
        uint64_t bits = atomic_load_explicit(&((struct nvh_rhdr *)r)->bitmap, memory_order_relaxed);
        unsigned size = nvh_cls_size(r->cls);
        for (unsigned i = 0; i < r->nslots && !c->stop; i++)
            if (bits & (1ull << i)) c->stop = c->fn(start + NVH_HDR + (size_t)i * size, size, c->arg);
    } else {
        c->stop = c->fn(start, n * NVH_BLOCK, c->arg);
    }
}

int nvh_heap_foreach(nvh_pool *pool, nvh_object_fn fn, void *arg)
{
    if (!pool || !fn) return nvh_fail(NVH_E_INVAL, "nvh_heap_foreach: NULL argument");
    if (!pool->heap) return NVH_OK;
    /* run bitmaps on the media lag until their ring retires (redo.c) */
    if (!pool->readonly) nvh_redo_retire_all(pool->heap);
    iter_ctx c = {fn, arg, 0};
    walk_cb cb = {iter_region, &c};
    walk_heap(pool->heap, &cb);
    return c.stop;
}
