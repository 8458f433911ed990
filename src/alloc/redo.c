/* redo.c — the per-arena persistent redo rings that make activate and free
 * failure-atomic with a single fence.
 *
 * Protocol (docs/ALLOC.md has the argument):
 *   1. write the record (1 line for up to 2 links), flush it;
 *   2. ONE fence: the operation is now durable (acknowledged);
 *   3. apply: link stores are flushed (durable at this thread's next fence),
 *      header/bitmap stores are only remembered in the ring's dirty list.
 * Retire (when the ring is full, or on demand): flush the dirty list, fence,
 * store the watermark, fence. Recovery replays, in global sequence order, the
 * state effects of every record above its ring's watermark, the link effects
 * of the two newest records of each ring (older activations' links were made
 * durable by a later fence of the same ring), and the link effects of every
 * unretired free record (a free's link line waits for the retire).
 */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Helpers
 * ========================================================================== */
static inline char *ring_line(nvh_heap *h, unsigned ring, unsigned line)
{
    return h->ring_body + ((size_t)ring * NVH_RING_LINES + line) * 64u;
}

/* CRC32C of the record's lines with its checksum field counted as zero,
 * seeded with its position (ring, line). The head line is copied (64 B, to
 * zero the field); continuation lines are chained on without a copy. */
static uint32_t rec_checksum(const void *rec, unsigned nlines, unsigned ring, unsigned line)
{
    unsigned char head[64];
    memcpy(head, rec, 64);
    memset(head + offsetof(struct nvh_rec, checksum), 0, 4);
    uint32_t crc = nvh_crc_fast(ring << 16 | line, head, 64);
    if (nlines > 1) crc = nvh_crc_fast(crc, (const char *)rec + 64, (nlines - 1) * 64u);
    return crc;
}

static bool obj_in_heap(nvh_heap *h, uint64_t obj)
{
    return obj >= h->chunks_off && obj < nvh_pool_size(h->pool) && obj % 64 == 0 &&
           !nvh_chunk_is_hdr(h, (obj - h->chunks_off) >> (h->bpc_shift + 12));
}

/* cheap de-duplication: the same run and link lines are hit repeatedly in a
 * batch. A table of lines already listed, two places per line (cleared at
 * retire): O(1), where scanning back over the list cost ~45 instructions
 * per call; a miss only lets a duplicate in (flushed twice). The hit test is
 * inline (nvh_redo_dirty_, alloc.h); the append is out of line. */
static inline void log_dirty(nvh_heap *h, nvh_arena *a, const void *addr)
{
    nvh_redo_dirty_(h, a, addr);     /* alloc.h */
}

void nvh_redo_dirty(nvh_heap *h, nvh_arena *a, const void *addr)
{
    log_dirty(h, a, addr);
}

void nvh_redo_dirty_add_(nvh_heap *h, nvh_arena *a, uint64_t line, uint64_t *seen)
{
    if (a->ndirty == a->dirty_cap) {
        size_t cap = a->dirty_cap ? a->dirty_cap * 2 : 256;
        uint64_t *g = realloc(a->dirty, cap * sizeof *g);
        if (!g) {                       /* cannot defer: flush now */
            nvh_flush(h->pool, (void *)(uintptr_t)line, 64);
            return;
        }
        a->dirty = g;
        a->dirty_cap = cap;
    }
    a->dirty[a->ndirty++] = line;
    *seen = line;
}

/* ==========================================================================
 * Retire
 * ========================================================================== */
/* A run's bitmap bit changed (activate / free on the normal path): the
 * media bitmap is written once per retire from the DRAM view instead of on
 * every operation. The run header line was the most-written line of the
 * heap (one write per activation or free of any of its slots; bench/run
 * wear); the redo records carry the same effects, and replay applies them,
 * so the media bitmap only has to be current when the ring retires. */
void nvh_bitmap_defer_(nvh_arena *a, nvh_run *run)
{
    if (a->nbm == a->bm_cap) {
        size_t cap = a->bm_cap ? a->bm_cap * 2 : 64;
        nvh_run **g = realloc(a->bm_runs, cap * sizeof *g);
        if (!g) return;                 /* caller stores the bit itself */
        a->bm_runs = g;
        a->bm_cap = cap;
    }
    run->bm_pending = true;
    a->bm_runs[a->nbm++] = run;
}

static inline void bitmap_defer(nvh_arena *a, nvh_run *run)
{
    if (!run->bm_pending) nvh_bitmap_defer_(a, run);
}

static void bitmap_write_pending(nvh_heap *h, nvh_arena *a)
{
    for (size_t i = 0; i < a->nbm; i++) {
        nvh_run *run = a->bm_runs[i];
        run->bm_pending = false;
        if (run->quarantined) continue;   /* never write into a damaged header */
        struct nvh_rhdr *hd = nvh_rhdr_at(h, run->block);
        uint64_t mask = run->nslots == 64 ? ~0ull : (1ull << run->nslots) - 1;
        nvh_wopen(h, &hd->bitmap, 8);
        atomic_store_explicit(&hd->bitmap, run->pbits & mask, memory_order_relaxed);
        nvh_wclose(h, &hd->bitmap, 8);
    }
    a->nbm = 0;
}

void nvh_redo_retire(nvh_heap *h, nvh_arena *a)
{
    nvh_pool *pool = h->pool;
    if (atomic_load_explicit(&a->unretired_min, memory_order_relaxed) == UINT64_MAX &&
        a->ndirty == 0 && a->nbm == 0) {
        a->ring_used = 0;
        return;
    }
    bitmap_write_pending(h, a);   /* their header lines are in the dirty list */
    for (size_t i = 0; i < a->ndirty; i++) nvh_flush(pool, (void *)(uintptr_t)a->dirty[i], 64);
    /* the last links may have been flushed by another thread */
    for (unsigned i = 0; i < a->nlast_links; i++)
        nvh_flush(pool, h->base + a->last_links[i], 8);
    nvh_drain(pool);
    struct nvh_ring_hdr *rh = &h->ring_hdr[a->index];
    nvh_wopen(h, &rh->watermark, 8);
    atomic_store_explicit(&rh->watermark, nvh_wm_word(a->last_seq), memory_order_relaxed);
    nvh_wclose(h, &rh->watermark, 8);
    nvh_persist(pool, rh, 8);
    a->ndirty = 0;
    memset(a->dirty_seen, 0, sizeof a->dirty_seen);
    a->ring_used = 0;
    a->nlast_links = 0;
    atomic_store_explicit(&a->unretired_min, UINT64_MAX, memory_order_release);
    atomic_fetch_add_explicit(&h->retire_epoch, 1, memory_order_release);
}

void nvh_redo_retire_all(nvh_heap *h)
{
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        nvh_arena *a = &h->arenas[i];
        nvh_alock_lock(&a->lock);
        nvh_redo_retire(h, a);
        nvh_alock_unlock(&a->lock);
    }
}

/* Every record with a smaller sequence number is retired in every ring. */
uint64_t nvh_redo_retired_before(nvh_heap *h)
{
    uint64_t m = UINT64_MAX;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        uint64_t u = atomic_load_explicit(&h->arenas[i].unretired_min, memory_order_acquire);
        if (u < m) m = u;
    }
    return m;
}

/* ==========================================================================
 * Append: write, flush, fence. Caller holds a->lock. Returns the sequence.
 * ========================================================================== */
uint64_t nvh_redo_append(nvh_heap *h, nvh_arena *a, struct nvh_rec *head,
                        const struct nvh_link_entry *links, unsigned nlinks)
{
    nvh_pool *pool = h->pool;
    NVH_ASSERT(nlinks <= NVH_LINKS_MAX_);
    NVH_ASSERT(obj_in_heap(h, head->obj));
    unsigned nlines = nvh_rec_nlines(nlinks);
    if (a->ring_pos + nlines > NVH_RING_LINES) {       /* pad to the ring start */
        a->ring_used += NVH_RING_LINES - a->ring_pos;
        a->ring_pos = 0;
    }
    if (a->ring_used + nlines > NVH_RING_LINES) nvh_redo_retire(h, a);

    uint64_t seq = nvh_seq_next(h, a);
    head->seq = seq;
    head->kind_links = (uint8_t)((head->kind_links & 0x0F) | (nlinks << 4));
    for (unsigned i = 0; i < nlinks && i < 2; i++) head->link[i] = links[i];
    head->checksum = 0;
    char *dst = ring_line(h, a->index, a->ring_pos);
    bool flushed = false;
    nvh_wopen(h, dst, nlines * 64u);
    if (nlines == 1) {
        /* common case: one line, checksummed in place (field is 0 above) */
        head->checksum = nvh_crc_fast(a->index << 16 | a->ring_pos, head, 64);
        if (pool->ctx.domain == NVH_DOMAIN_PMEM) {
            /* pmem: a non-temporal store of the whole line instead of store +
             * CLWB. The ring line is written once per lap and only read by
             * recovery, so there is nothing to keep cached, and on the test
             * machine a streamed line + SFENCE costs ~40% less than a
             * CLWB'd one + SFENCE (bench/run persist: memcpy_256 vs
             * persist_line). Counted as one flushed line (and 64 NT bytes). */
            nvh_memcpy_nt_(pool, dst, head, 64);
            flushed = true;
        } else {
            memcpy(dst, head, 64);
        }
    } else {
        unsigned char buf[NVH_REC_MAX_LINES * 64];
        memset(buf + 64, 0, (nlines - 1) * 64u);
        memcpy(buf, head, 64);
        for (unsigned i = 2; i < nlinks; i++)
            memcpy(buf + 64 + (i - 2) * 16u, &links[i], 16);
        uint32_t crc = rec_checksum(buf, nlines, a->index, a->ring_pos);
        memcpy(buf + offsetof(struct nvh_rec, checksum), &crc, 4);
        head->checksum = crc;
        memcpy(dst, buf, nlines * 64u);
    }
    nvh_wclose(h, dst, nlines * 64u);
    if (!flushed) nvh_flush(pool, dst, nlines * 64u);
    /* The previous record's links were stored but not flushed (see
     * nvh_rec_apply_links): this fence makes them durable, so at most the
     * newest record of a ring has links in flight, which replay restores. */
    for (unsigned i = 0; i < a->nlast_links; i++)
        nvh_flush(pool, h->base + a->last_links[i], 8);
#if defined(__x86_64__)
    /* nvh_drain issues no SFENCE after CLFLUSH (ordered by itself), but the
     * streamed record line is ordered only by a fence: without one the link
     * stores that follow could reach the media before the record */
    if (flushed && pool->ctx.flush_kind == NVH_FLUSH_CLFLUSH) __asm__ volatile("sfence" ::: "memory");
#endif
    nvh_drain(pool);
    nvh_redo_appended_(a, head, links, nlinks, nlines, seq);
    return seq;
}

/* ==========================================================================
 * Effects (shared by the normal path and replay)
 * ========================================================================== */
static inline void touch(nvh_heap *h, nvh_arena *a, const void *addr, bool replay)
{
    if (replay) nvh_flush(h->pool, addr, 64);
    else log_dirty(h, a, addr);
}


/* Region layout effects of an activation: prefix header, region header,
 * remainder header; all fully determined by the record. */
/* A run record's run: its first block, and the slot (rec_sane or the
 * caller checked both). */
static inline uint64_t rec_run(nvh_heap *h, const struct nvh_rec *r, unsigned *slot)
{
    uint64_t rel = r->obj - h->chunks_off;
    uint64_t b = rel / NVH_BLOCK - nvh_rec_run_delta(r);
    *slot = 0;
    nvh_slot_of(rel - b * NVH_BLOCK, nvh_rec_cls(r), slot);
    return b;
}

static void apply_region(nvh_heap *h, const struct nvh_rec *r, nvh_arena *a, bool replay)
{
    unsigned rk = r->cls_flags >> NVH_RECF_KIND_SHIFT;
    uint64_t b;
    if (rk == NVH_RK_RUN) {
        unsigned slot = 0, cls = nvh_rec_cls(r), nb = nvh_rec_run_blocks(r);
        b = rec_run(h, r, &slot);
        if (r->cls_flags & NVH_RECF_NEWRUN) {
            if (r->prefix) {
                nvh_rhdr_write(h, b - r->prefix, r->prefix, NVH_RS_FREE, NVH_RK_NONE, 0, 0, r->seq);
                touch(h, a, nvh_rhdr_at(h, b - r->prefix), replay);
            }
            nvh_rhdr_write(h, b, nb, NVH_RS_USED, NVH_RK_RUN, (uint8_t)cls, 1ull << slot, r->seq);
            touch(h, a, nvh_rhdr_at(h, b), replay);
            if (r->remainder) {
                nvh_rhdr_write(h, b + nb, r->remainder, NVH_RS_FREE, NVH_RK_NONE, 0, 0, r->seq);
                touch(h, a, nvh_rhdr_at(h, b + nb), replay);
            }
        } else {
            struct nvh_rhdr *hd = nvh_rhdr_at(h, b);
            /* the normal path validated the header just before the record */
            if (replay && (!nvh_rhdr_valid(h, b) || hd->kind != NVH_RK_RUN)) {
                nvh_corrupt_report(h, nvh_block_off(h, b), "run header invalid during activation");
                return;
            }
            /* load + store, not a LOCKed RMW: every writer of a run's bitmap
             * holds the owner arena's lock (replay runs alone), and a LOCKed
             * RMW costs ~20 cycles and waits for earlier CLWBs */
            nvh_run *run = replay ? NULL : nvh_run_lookup(h, b);
            if (run) bitmap_defer(a, run);
            if (!run || !run->bm_pending) {
                nvh_wopen(h, &hd->bitmap, 8);
                atomic_store_explicit(&hd->bitmap,
                                      atomic_load_explicit(&hd->bitmap, memory_order_relaxed) |
                                          (1ull << slot),
                                      memory_order_relaxed);
                nvh_wclose(h, &hd->bitmap, 8);
            }
            touch(h, a, hd, replay);
        }
        return;
    }
    b = (r->obj - h->chunks_off) / NVH_BLOCK;       /* the region's first block */
    bool huge = rk == NVH_RK_HUGE;
    uint64_t pre = huge ? (uint64_t)r->prefix * h->bpc : r->prefix;
    if (pre) {
        nvh_rhdr_write(h, b - pre, (uint32_t)pre, NVH_RS_FREE, huge ? NVH_RK_HUGE : NVH_RK_NONE,
                       0, 0, r->seq);
        touch(h, a, nvh_rhdr_at(h, b - pre), replay);
    }
    nvh_rhdr_write(h, b, r->blocks, NVH_RS_USED, (uint8_t)rk, 0, 0, r->seq);
    touch(h, a, nvh_rhdr_at(h, b), replay);
    if (r->remainder) {
        nvh_rhdr_write(h, b + r->blocks, r->remainder, NVH_RS_FREE,
                       huge ? NVH_RK_HUGE : NVH_RK_NONE, 0, 0, r->seq);
        touch(h, a, nvh_rhdr_at(h, b + r->blocks), replay);
    }
    if (huge) {
        uint64_t endc = (b + r->blocks + r->remainder + h->bpc - 1) / h->bpc;
        nvh_hwm_raise(h, endc, true);
        touch(h, a, h->state, replay);
    }
}

static void free_region(nvh_heap *h, const struct nvh_rec *r, nvh_arena *a, bool replay)
{
    unsigned rk = r->cls_flags >> NVH_RECF_KIND_SHIFT;
    uint64_t rel = r->obj - h->chunks_off;
    if (rk == NVH_RK_RUN) {
        unsigned slot = 0;
        uint64_t b = rec_run(h, r, &slot);
        struct nvh_rhdr *hd = nvh_rhdr_at(h, b);
        /* owner arena's lock held (or replay): load + store, see apply_region */
        /* a run with a DRAM view (its chunk is scanned): deferred to the
         * retire; a free into an unscanned chunk stores the bit itself */
        nvh_run *run = replay ? NULL : nvh_run_lookup(h, b);
        if (run) bitmap_defer(a, run);
        if (!run || !run->bm_pending) {
            nvh_wopen(h, &hd->bitmap, 8);
            atomic_store_explicit(&hd->bitmap,
                                  atomic_load_explicit(&hd->bitmap, memory_order_relaxed) &
                                      ~(1ull << slot),
                                  memory_order_relaxed);
            nvh_wclose(h, &hd->bitmap, 8);
        }
        touch(h, a, hd, replay);
        /* the chunk-full map (heap.c); the normal path's caller does it */
        if (replay) nvh_fullmap_clear(h, a, nvh_chunk_of_block(h, b), true);
        return;
    }
    uint64_t b = rel / NVH_BLOCK;
    nvh_rhdr_write(h, b, r->blocks, NVH_RS_FREE, (uint8_t)rk, 0, 0, r->seq);
    touch(h, a, nvh_rhdr_at(h, b), replay);
    if (replay) nvh_fullmap_clear(h, a, nvh_chunk_of_block(h, b), true);
}

void nvh_rec_apply_state(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay)
{
    unsigned kind = r->kind_links & 0x0F;
    switch (kind) {
    case NVH_REC_ACT:
        apply_region(h, r, a, replay);
        break;
    case NVH_REC_FREE:
        free_region(h, r, a, replay);
        break;
    case NVH_REC_ACT_NAMED: {
        /* the name travels in the record's second line (links[2..5]): the
         * entry is written whole, name then offset, by apply and by replay */
        apply_region(h, r, a, replay);
        struct nvh_named_entry *e = nvh_named_entry_at(h, (uint32_t)r->link[0].addr);
        if (!e) break;          /* its table's directory word is damaged */
        uint64_t cur = atomic_load_explicit(&e->off, memory_order_relaxed);
        if (!replay || cur == 0 || cur == NVH_NAMED_TOMB ||
            (cur & NVH_NAMED_OFF_MASK) == r->obj) {
            nvh_wopen(h, e, sizeof *e);
            memcpy(e->name, &links[2], sizeof e->name);
            e->name[sizeof e->name - 1] = '\0';
            atomic_store_explicit(&e->off,
                                  nvh_named_word(e->name, (uint32_t)r->link[0].addr, r->obj),
                                  memory_order_release);
            nvh_wclose(h, e, sizeof *e);
        }
        touch(h, a, e, replay);
        break;
    }
    case NVH_REC_FREE_NAMED: {
        free_region(h, r, a, replay);
        struct nvh_named_entry *e = nvh_named_entry_at(h, (uint32_t)r->link[0].addr);
        if (!e) break;
        uint64_t cur = atomic_load_explicit(&e->off, memory_order_relaxed);
        if (cur > NVH_NAMED_TOMB && (cur & NVH_NAMED_OFF_MASK) == r->obj) {
            nvh_wopen(h, &e->off, 8);
            atomic_store_explicit(&e->off, NVH_NAMED_TOMB, memory_order_relaxed);
            nvh_wclose(h, &e->off, 8);
        }
        touch(h, a, e, replay);
        break;
    }
    default:
        break;
    }
}

/* Link effects. Normal path: store only. An activation's link line is
 * flushed just before the ring's next fence (nvh_redo_append, nvh_redo_retire),
 * because a CLWB left in flight here would make the arena mutex's next locked
 * instruction wait for the write-back — a hidden second fence per operation
 * (bench/run alloc: 26% of the cycles). A free's link line only joins the
 * ring's dirty list and is written back at the retire, de-duplicated with
 * the other lines of the batch: replay redoes the link effect of EVERY
 * unretired free record (nvh_redo_recover), which is safe because the freed
 * space cannot be reused — so no link can legitimately point at the object
 * again — before that record is retired (the don't-allocate FIFO, §4). A
 * free thus flushes one line (its record) before its one fence.
 * Replay: ACT sets a link only if it still holds the value it had before the
 * activation; FREE only if it still points at the object. */
void nvh_rec_apply_links(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay)
{
    unsigned kind = r->kind_links & 0x0F;
    unsigned n = r->kind_links >> 4;
    if (kind != NVH_REC_ACT && kind != NVH_REC_FREE) return;
    for (unsigned i = 0; i < n; i++) {
        _Atomic uint64_t *w = (_Atomic uint64_t *)(h->base + links[i].addr);
        uint64_t cur = atomic_load_explicit(w, memory_order_relaxed);
        /* the caller's link word, stored on its behalf: our own window.
         * Release: a container's lock-free reader that loads the link
         * (acquire) then sees the object's content written before */
        if (kind == NVH_REC_ACT) {
            if (!replay || cur == links[i].value) {
                nvh_wopen(h, (const void *)w, 8);
                atomic_store_explicit(w, r->obj, memory_order_release);
                nvh_wclose(h, (const void *)w, 8);
            }
        } else if (kind == NVH_REC_FREE) {
            if (cur == r->obj) {
                nvh_wopen(h, (const void *)w, 8);
                atomic_store_explicit(w, links[i].value, memory_order_release);
                nvh_wclose(h, (const void *)w, 8);
            }
            if (!replay) log_dirty(h, a, (const void *)w);
        }
        if (replay) nvh_flush(h->pool, (void *)w, 8);
    }
}

/* ==========================================================================
 * Recovery
 * ========================================================================== */
typedef struct found_rec {
    uint64_t seq;
    unsigned ring, line;
} found_rec;

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static int cmp_found(const void *x, const void *y)
{
    const found_rec *a = x, *b = y;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static bool rec_sane(nvh_heap *h, const struct nvh_rec *r, const struct nvh_link_entry *links)
{
    unsigned kind = r->kind_links & 0x0F, n = r->kind_links >> 4;
    unsigned rk = r->cls_flags >> NVH_RECF_KIND_SHIFT;
    uint64_t size = nvh_pool_size(h->pool);
    if (kind < NVH_REC_ACT || kind > NVH_REC_FREE_NAMED || rk == 0) return false;
    if (!obj_in_heap(h, r->obj)) return false;
    if (rk == NVH_RK_RUN) {
        /* the run (first block, blocks, class) lies in the slot's chunk and
         * the object is one of its slots */
        unsigned cls = nvh_rec_cls(r), nb = nvh_rec_run_blocks(r), d = nvh_rec_run_delta(r);
        if (!nvh_cls_valid(cls) || nb == 0 || nb > NVH_RUN_BLOCKS_MAX ||
            d >= nb || (r->blocks >> 19) != 0)
            return false;
        uint64_t rel = r->obj - h->chunks_off, ob = rel / NVH_BLOCK;
        uint64_t b = ob - d, lo = (ob >> h->bpc_shift) << h->bpc_shift;
        if (ob < d || b < lo || b + nb + r->remainder > lo + h->bpc || b - lo < r->prefix)
            return false;
        unsigned slot;
        if (!nvh_slot_of(rel - b * NVH_BLOCK, cls, &slot) || slot >= nvh_run_slots(cls, nb))
            return false;
    } else {
        if ((r->obj - h->chunks_off) % NVH_BLOCK || r->blocks == 0) return false;
        uint64_t b = (r->obj - h->chunks_off) / NVH_BLOCK;
        if (nvh_block_off(h, b + r->blocks + r->remainder) > size &&
            (r->kind_links & 0x0F) != NVH_REC_FREE && (r->kind_links & 0x0F) != NVH_REC_FREE_NAMED)
            return false;
        /* the regions it writes (prefix, region, remainder) lie in one zone:
         * a header chunk is never part of a region */
        uint64_t pre = rk == NVH_RK_HUGE ? (uint64_t)r->prefix * h->bpc : r->prefix;
        if (pre > b) return false;
        uint64_t c0 = (b - pre) >> h->bpc_shift;
        uint64_t c1 = (b + r->blocks + r->remainder - 1) >> h->bpc_shift;
        if (!nvh_chunks_data(h, c0, c1 - c0 + 1)) return false;
    }
    if (kind == NVH_REC_ACT_NAMED || kind == NVH_REC_FREE_NAMED) {
        /* the slot's table may be added by an earlier record of this
         * replay, so the bound is the largest directory's; apply skips a
         * slot whose table is missing */
        if (r->link[0].addr >= NVH_NAMED_MAXSLOTS) return false;
        if (kind == NVH_REC_ACT_NAMED ? n != 6 : n != 0) return false;
    } else {
        for (unsigned i = 0; i < n; i++)
            if (links[i].addr % 8 || links[i].addr < 4096 || links[i].addr + 8 > size)
                return false;
    }
    return true;
}

static void gather_links(nvh_heap *h, unsigned ring, unsigned line, struct nvh_link_entry *out)
{
    const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, ring, line);
    unsigned n = r->kind_links >> 4;
    for (unsigned i = 0; i < n && i < 2; i++) out[i] = r->link[i];
    for (unsigned i = 2; i < n; i++)
        memcpy(&out[i], ring_line(h, ring, line) + 64 + (i - 2) * 16u, 16);
}

int nvh_redo_recover(nvh_heap *h)
{
    nvh_pool *pool = h->pool;
    found_rec *found = malloc(sizeof *found * NVH_RINGS * NVH_RING_LINES);
    if (!found) return nvh_fail(NVH_E_NOMEM, "out of memory for recovery");
    size_t nfound = 0;
    uint64_t maxseq = 0;
    /* the two newest records of each ring: their link effects may not be
     * durable (a record can reach the media before its own fence, by
     * eviction, so the newest durable record does not prove that the one
     * before it was fenced-over) */
    uint64_t last_of[NVH_RINGS], prev_of[NVH_RINGS];
    unsigned last_line[NVH_RINGS], prev_line[NVH_RINGS];
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        uint64_t wm;
        if (!nvh_wm_decode(atomic_load_explicit(&h->ring_hdr[i].watermark, memory_order_relaxed),
                           &wm)) {
            free(found);
            return nvh_fail(NVH_E_CORRUPT, "%s: redo ring %u: the watermark at offset %llu "
                            "fails its check", h->pool->path, i,
                            (unsigned long long)((char *)&h->ring_hdr[i] - h->base));
        }
        if (wm > maxseq) maxseq = wm;
        last_of[i] = prev_of[i] = 0;
        last_line[i] = prev_line[i] = 0;
        for (unsigned j = 0; j < NVH_RING_LINES; j++) {
            const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, i, j);
            if (r->seq == 0) continue;
            unsigned n = r->kind_links >> 4;
            unsigned nlines = nvh_rec_nlines(n);
            if (n > NVH_LINKS_MAX_ || j + nlines > NVH_RING_LINES) continue;
            if (rec_checksum(r, nlines, i, j) != r->checksum) continue;
            if (r->seq > maxseq) maxseq = r->seq;
            if (r->seq <= wm) continue;
            struct nvh_link_entry links[NVH_LINKS_MAX_];
            gather_links(h, i, j, links);
            if (!rec_sane(h, r, links)) {
                nvh_corrupt_report(h, (uint64_t)((char *)r - h->base), "insane redo record");
                continue;
            }
            found[nfound++] = (found_rec){r->seq, i, j};
            if (r->seq > last_of[i]) {
                prev_of[i] = last_of[i]; prev_line[i] = last_line[i];
                last_of[i] = r->seq; last_line[i] = j;
            } else if (r->seq > prev_of[i]) {
                prev_of[i] = r->seq; prev_line[i] = j;
            }
        }
    }
    qsort(found, nfound, sizeof *found, cmp_found);
    for (size_t k = 0; k < nfound; k++) {
        if (k && found[k].seq == found[k - 1].seq) continue;
        const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, found[k].ring, found[k].line);
        struct nvh_link_entry links[NVH_LINKS_MAX_];
        gather_links(h, found[k].ring, found[k].line, links);
        nvh_rec_apply_state(h, r, links, &h->arenas[found[k].ring], true);
    }
    /* links, in global order: the newest two records of every ring (their
     * activation links may be in flight) and every unretired free record
     * (a free's link line is written back only at the retire; the space it
     * freed is not reused before then, so no A-B-A: see apply_links) */
    found_rec *tail = malloc(sizeof *tail * (nfound + 2 * NVH_RINGS));
    if (!tail) {
        free(found);
        return nvh_fail(NVH_E_NOMEM, "out of memory for recovery");
    }
    size_t ntail = 0;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        if (prev_of[i]) tail[ntail++] = (found_rec){prev_of[i], i, prev_line[i]};
        if (last_of[i]) tail[ntail++] = (found_rec){last_of[i], i, last_line[i]};
    }
    for (size_t k = 0; k < nfound; k++) {
        const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, found[k].ring, found[k].line);
        if ((r->kind_links & 0x0F) == NVH_REC_FREE) tail[ntail++] = found[k];
    }
    qsort(tail, ntail, sizeof *tail, cmp_found);
    for (size_t k = 0; k < ntail; k++) {
        if (k && tail[k].seq == tail[k - 1].seq) continue;
        const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, tail[k].ring, tail[k].line);
        struct nvh_link_entry links[NVH_LINKS_MAX_];
        gather_links(h, tail[k].ring, tail[k].line, links);
        nvh_rec_apply_links(h, r, links, &h->arenas[tail[k].ring], true);
    }
    h->replayed = nfound;
    if (nfound) {
        nvh_drain(pool);
        for (unsigned i = 0; i < NVH_RINGS; i++) {
            if (!last_of[i]) continue;
            /* recovery runs inside nvh_heap_open_'s implicit window */
            atomic_store_explicit(&h->ring_hdr[i].watermark, nvh_wm_word(last_of[i]),
                                  memory_order_relaxed);
            nvh_flush(pool, &h->ring_hdr[i], 8);
        }
        nvh_drain(pool);
    }
    for (unsigned i = 0; i < NVH_RINGS; i++)
        (void)nvh_wm_decode(atomic_load_explicit(&h->ring_hdr[i].watermark, memory_order_relaxed),
                            &h->arenas[i].last_seq);
    atomic_store(&h->seq, maxseq);   /* the floor of nvh_seq_next */
    free(tail);
    free(found);
    return NVH_OK;
}

/* ==========================================================================
 * Read-only opens: the headers that unreplayed records will rewrite (a
 * crashed pool checked without recovery may hold them torn; they are not
 * corruption). Sorted block indexes, malloc'd; *n_out entries.
 * ========================================================================== */
/* Append x to the growing array *v (n used, *cap allocated); false if out
 * of memory. */
static bool push_block(uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
    if (*n == *cap) {
        size_t c = *cap * 2;
        uint64_t *g = realloc(*v, c * sizeof *g);
        if (!g) return false;
        *v = g;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return true;
}

uint64_t *nvh_redo_pending_blocks(nvh_heap *h, size_t *n_out)
{
    size_t cap = 3 * NVH_RINGS * NVH_RING_LINES;
    uint64_t *v = malloc(sizeof *v * cap);
    size_t n = 0;
    *n_out = 0;
    if (!v) return NULL;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        uint64_t wm;
        if (!nvh_wm_decode(atomic_load_explicit(&h->ring_hdr[i].watermark, memory_order_relaxed),
                           &wm))
            wm = 0;            /* damaged: every record counts as pending */
        for (unsigned j = 0; j < NVH_RING_LINES; j++) {
            const struct nvh_rec *r = (const struct nvh_rec *)ring_line(h, i, j);
            unsigned nl = r->kind_links >> 4, nlines = nvh_rec_nlines(nl);
            if (r->seq <= wm || nl > NVH_LINKS_MAX_ || j + nlines > NVH_RING_LINES) continue;
            if (rec_checksum(r, nlines, i, j) != r->checksum) continue;
            if (!obj_in_heap(h, r->obj)) continue;
            unsigned rk = r->cls_flags >> NVH_RECF_KIND_SHIFT;
            uint64_t rel = r->obj - h->chunks_off;
            uint64_t b = rel / NVH_BLOCK;
            /* a run slot's record rewrites its run's header */
            if (rk == NVH_RK_RUN) b -= nvh_rec_run_delta(r) <= b ? nvh_rec_run_delta(r) : 0;
            uint64_t pre = rk == NVH_RK_HUGE ? (uint64_t)r->prefix * h->bpc : r->prefix;
            bool ok = push_block(&v, &n, &cap, b);
            if (pre && pre <= b) ok = ok && push_block(&v, &n, &cap, b - pre);
            if (r->remainder)
                ok = ok && push_block(&v, &n, &cap,
                                      b + (rk == NVH_RK_RUN ? nvh_rec_run_blocks(r) : r->blocks));
            /* a huge record rewrites the headers of regions spanning chunks:
             * the chunk starts inside them may read as zero until it does */
            if (rk == NVH_RK_HUGE && pre <= b) {
                uint64_t end = b + r->blocks + r->remainder, max = h->max_chunks * h->bpc;
                for (uint64_t x = b - pre + h->bpc; ok && x < end && x < max; x += h->bpc)
                    ok = push_block(&v, &n, &cap, x);
            }
            if (ok && rk == NVH_RK_HUGE && b % h->bpc == 0)
                for (uint64_t x = b + h->bpc; ok && x < b + r->blocks; x += h->bpc)
                    ok = push_block(&v, &n, &cap, x);
            if (!ok) { free(v); return NULL; }
        }
    }
    qsort(v, n, sizeof *v, cmp_u64);
    *n_out = n;
    return v;
}
