/* free.c — nvh_free: give an object back, failure-atomic with the links
 * that point at it (docs/ALLOC.md §4, §4c). Under the lock of the arena
 * that owns the object's chunk, a free takes three steps:
 *
 *   classify  what is being freed — a slot of a run, a large object or a
 *             huge object — read from the region's header, which must pass
 *             its checksum first, and from the run's DRAM view. Everything
 *             else is refused before anything is written: a reservation
 *             (NVH_E_BADPTR: nvh_cancel gives it back), a damaged header
 *             (NVH_E_CORRUPT, the region is quarantined), not an object
 *             (NVH_E_BADPTR), an object already free (NVH_E_DOUBLEFREE).
 *   log       the redo record that makes the free durable: one line for up
 *             to two links, one fence (redo.c). Once it is written the free
 *             happens even if the process dies now: recovery replays it.
 *   apply     the state change the record describes: the run's bitmap bit
 *             or the region's header, the links (written back at the ring's
 *             retire, §4c), the chunk-full map; then the DRAM side: the space
 *             enters the owner arena's don't-allocate FIFO (fifo.c) — or,
 *             in a chunk not scanned yet, the chunk remembers the record, so
 *             that the scan does not hand the space out before it retires.
 *
 * The three are static inline functions inlined into nvh_free (the public
 * path: no call per step) and nvh_free_off_ (named frees, named.c). */
#include "alloc.h"

#include <string.h>

/* What classify found: everything log and apply need, so that nothing is
 * looked up twice (one run lookup and one slot computation per free,
 * docs/ALLOC.md §4e). */
typedef struct free_target {
    nvh_arena *arena;           /* owner of the chunk, locked                 */
    nvh_chunk *chunk;
    bool scanned;               /* the chunk's DRAM state is built            */
    uint64_t block;             /* block of the object: its run's first block,
                                   or the first block of its large/huge region */
    uint64_t delta;             /* runs: the object's block - block          */
    struct nvh_rhdr *hdr;       /* that block's region header (validated)     */
    nvh_run *run;               /* the run's DRAM descriptor, or NULL         */
    uint8_t kind;               /* NVH_RK_RUN, NVH_RK_LARGE or NVH_RK_HUGE    */
    uint8_t cls;                /* runs: the class in the media header        */
    unsigned slot;              /* runs: the slot                             */
    uint32_t blocks;            /* region size (runs: the record's run word) */
} free_target;

/* The owner arena of chunk c, locked. The owner may change while we wait
 * for its lock (the lazy scan claims chunks), so it is read again under
 * the lock. */
static inline __attribute__((always_inline)) nvh_arena *
lock_owner(nvh_heap *h, uint64_t c, uint64_t block)
{
    for (;;) {
        /* an owned chunk without the call (nvh_owner_arena claims it if not) */
        int own = nvh_owner_get(h, c, memory_order_acquire);
        nvh_arena *a = own >= 0 ? &h->arenas[own] : nvh_owner_arena(h, block);
        nvh_alock_lock(&a->lock);
        if (nvh_owner_get(h, c, memory_order_acquire) == (int)a->index)
            return a;
        nvh_alock_unlock(&a->lock);
    }
}

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

/* ==========================================================================
 * 1. Classify
 * ========================================================================== */
/* Is off a reservation that was never activated? A slot still in the
 * caller's own cache is not (it is free: DOUBLEFREE below). */
static inline __attribute__((always_inline)) bool
is_reservation(nvh_heap *h, const free_target *t, uint64_t off, uint64_t in,
               bool dram_slot_ok, unsigned dram_slot)
{
    const nvh_run *run = t->run;
    if (dram_slot_ok)
        return ((run->resv & (1ull << dram_slot)) ||
                ((run->tcached & (1ull << dram_slot)) && !nvh_tcache_holds(h, off, run->cls)));
    return in == 0 && nvh_resv_find(t->arena, t->block) != NULL;
}

/* The header of the object's block b fails validation: damage to contain
 * if b is a region start (the region is quarantined), else a pointer that
 * never was an object. Out of line (an error path), with scalar arguments:
 * a pointer to the caller's free_target would keep it out of registers. */
static int refuse_bad_header(nvh_heap *h, uint64_t b, nvh_run *run, bool scanned, uint64_t off)
{
    bool known_start = scanned ? (h->pview[b] != 0 || run != NULL) : chain_reaches(h, b);
    if (known_start || nvh_rhdr_at(h, b)->magic == NVH_RHDR_MAGIC) {
        nvh_corrupt_report(h, nvh_block_off(h, b), "region header corrupt at free");
        if (run) run->quarantined = true;
        else nvh_quarantine_add(h, b, 1);
        return nvh_fail(NVH_E_CORRUPT, "header at offset %llu fails its checksum; the region "
                        "is quarantined", (unsigned long long)nvh_block_off(h, b));
    }
    return nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
}

/* Step 1: what off is, in t (t->arena locked, chunk c). NVH_OK if it is an
 * activated object that may be freed; otherwise the error, set, and
 * nothing written. */
static inline __attribute__((always_inline)) int
free_classify(nvh_heap *h, uint64_t off, uint64_t c, free_target *t)
{
    uint64_t b = t->block;
    t->chunk = &h->chunks[c];
    t->scanned = __atomic_load_n(&t->chunk->scanned, __ATOMIC_ACQUIRE);
    /* The run descriptor, looked up once for all the checks below: under
     * the owner's lock it cannot change (a lookup per check would cost ~40
     * instructions per free). Every block of a run points at it. */
    t->run = nvh_run_lookup(h, b);
    if (t->run) {
        b = t->run->block;
    } else if (!t->scanned && !(nvh_rhdr_valid_(h, b) &&
                                nvh_rhdr_at(h, b)->state != NVH_RS_FREE)) {
        /* no DRAM state: a slot in a later block of a run has no header
         * of its own (its slot may hold a stale free header); the chain
         * from the chunk's start says which region holds the block */
        uint64_t s = nvh_region_start_media(h, b);
        if (s != UINT64_MAX && s != b && nvh_rhdr_at(h, s)->kind == NVH_RK_RUN) b = s;
    }
    t->delta = t->block - b;
    t->block = b;
    t->hdr = nvh_rhdr_at(h, b);
    uint64_t in = off - nvh_block_off(h, b);        /* offset inside the region */
    unsigned dram_slot = 0;
    bool dram_slot_ok = t->run && nvh_run_slot_at(h, t->run, off, &dram_slot);
    if (is_reservation(h, t, off, in, dram_slot_ok, dram_slot))
        return nvh_fail(NVH_E_BADPTR, "offset %llu is reserved, not activated (use nvh_cancel)",
                        (unsigned long long)off);
    if (!nvh_run_hdr_valid(h, t->run, b)) return refuse_bad_header(h, b, t->run, t->scanned, off);

    const struct nvh_rhdr *hd = t->hdr;
    if (hd->state == NVH_RS_QUARANTINE)
        return nvh_fail(NVH_E_CORRUPT, "offset %llu lies in a quarantined region",
                        (unsigned long long)off);
    if (hd->kind == NVH_RK_RUN) {
        /* the slot from the media header's class (the DRAM one agrees
         * unless the header was rewritten under a stale descriptor) */
        unsigned slot = dram_slot;
        bool ok = dram_slot_ok && t->run->cls == hd->cls ? true : nvh_slot_of(in, hd->cls, &slot);
        if (!ok || slot >= hd->nslots)
            return nvh_fail(NVH_E_BADPTR, "offset %llu is not a slot of its run",
                            (unsigned long long)off);
        /* the run's DRAM view when it has one: its media bitmap is only
         * brought up to date at the ring's retire (redo.c, wear) */
        const nvh_run *drun = t->scanned ? t->run : NULL;
        uint64_t bits = drun ? drun->pbits : atomic_load_explicit(&t->hdr->bitmap,
                                                                  memory_order_relaxed);
        if (!(bits & (1ull << slot))) {
            if (t->run && (t->run->resv & (1ull << slot)))
                return nvh_fail(NVH_E_BADPTR, "offset %llu is reserved, not activated "
                                "(use nvh_cancel)", (unsigned long long)off);
            return nvh_fail(NVH_E_DOUBLEFREE, "offset %llu is already free",
                            (unsigned long long)off);
        }
        t->kind = NVH_RK_RUN;
        t->cls = hd->cls;
        t->slot = slot;
        t->blocks = (dram_slot_ok && t->run->cls == hd->cls
                         ? t->run->recword : nvh_rec_run_word(hd->blocks, 0, hd->cls)) |
                    (uint32_t)t->delta << 8;
        return NVH_OK;
    }
    if (hd->kind == NVH_RK_LARGE || hd->kind == NVH_RK_HUGE) {
        if (in != 0 || (t->scanned && h->pview[b] != hd->blocks))
            return nvh_fail(NVH_E_BADPTR, "offset %llu is not the start of an object",
                            (unsigned long long)off);
        if (hd->state != NVH_RS_USED)
            return nvh_fail(NVH_E_DOUBLEFREE, "offset %llu is already free",
                            (unsigned long long)off);
        t->kind = hd->kind;
        t->cls = 0;
        t->slot = 0;
        t->blocks = hd->blocks;
        return NVH_OK;
    }
    return nvh_fail(hd->state == NVH_RS_FREE ? NVH_E_DOUBLEFREE : NVH_E_BADPTR,
                    "offset %llu is not an allocated object", (unsigned long long)off);
}

/* ==========================================================================
 * 2. Log
 * ========================================================================== */
/* Step 2: the free record, started by free_off (object, kind, and for
 * named frees the object-table slot in link[0].addr, redo.c), completed with
 * what classify found, written and fenced in the owner's ring. When this
 * returns the free is durable. Returns the record's sequence number. */
static inline __attribute__((always_inline)) uint64_t
free_log(nvh_heap *h, const free_target *t, const struct nvh_link_entry *links,
         unsigned nlinks, struct nvh_rec *rec)
{
    rec->cls_flags = (uint8_t)((t->cls & 0x1F) | (t->kind << NVH_RECF_KIND_SHIFT));
    rec->blocks = t->blocks;
    return nvh_redo_append1(h, t->arena, rec, links, nlinks);
}

/* ==========================================================================
 * 3. Apply
 * ========================================================================== */
/* Step 3: the record's effects on the media, then the DRAM state. */
static inline __attribute__((always_inline)) void
free_apply(nvh_heap *h, const free_target *t, const struct nvh_rec *rec, uint64_t seq,
           const struct nvh_link_entry *links, unsigned nlinks, int64_t named_slot)
{
    nvh_arena *a = t->arena;
    nvh_run *run = t->run;
    uint64_t c = nvh_chunk_of_block(h, t->block);
    if (t->kind == NVH_RK_RUN && run && named_slot < 0) {
        /* the common case, with the run and slot found by classify */
        nvh_rec_apply_slot(h, a, rec, t->hdr, run, t->slot, links, nlinks, false);
    } else {
        nvh_rec_apply_state(h, rec, links, a, false);
        nvh_rec_apply_links(h, rec, links, a, false);
    }
    /* the chunk has free space again (rare: only chunks found full, by
     * this session or, for a chunk it has not scanned, an earlier one) */
    if (__builtin_expect(atomic_load_explicit(&t->chunk->full_mark, memory_order_relaxed) ||
                             (!t->scanned && nvh_fullmap_test(h, c)), 0))
        nvh_fullmap_clear(h, a, c, false);
    if (!t->scanned) {
        /* DRAM knows nothing of this chunk yet: the scan will find the space
         * free; it must not be reused before this record is retired. We hold
         * the chunk owner's lock, which the scan holds too (nvh_chunk_claim) */
        if (atomic_load_explicit(&t->chunk->unscanned_free_seq, memory_order_relaxed) < seq)
            atomic_store_explicit(&t->chunk->unscanned_free_seq, seq, memory_order_relaxed);
    } else if (t->kind == NVH_RK_RUN) {
        if (run) {
            run->pbits &= ~(1ull << t->slot);
            /* the FIFO entry names the run: only if the slot is one of its
             * own (a header rewritten under a stale descriptor: the space is
             * lost until the next open, which rebuilds the run from the
             * media) */
            if (run->cls == t->cls)
                nvh_fifo_push(h, a, run, 0, 0, (uint8_t)t->slot, seq, nvh_cls_size(run->cls));
        }
    } else {
        nvh_fifo_push(h, a, NULL, t->block, t->blocks, t->kind == NVH_RK_HUGE, seq,
                      (uint64_t)t->blocks * NVH_BLOCK);
    }
    /* Drain in batches: the FIFO head can only leave once its record is
     * retired (and its time is up), so trying on every free mostly finds it
     * blocked. Over the byte bound: drain now, retiring if need be. Else
     * every NVH_FIFO_BATCH entries, unless the head is still waiting for a
     * retire that has not happened. Reserve drains too when it needs space. */
    if (a->fifo_bytes > atomic_load_explicit(&h->fifo_max_bytes, memory_order_relaxed))
        nvh_fifo_drain(h, a, false, true);
    else if (a->fifo_len >= NVH_FIFO_BATCH &&
             a->fifo_blocked != 1 + atomic_load_explicit(&h->retire_epoch, memory_order_relaxed))
        nvh_fifo_drain(h, a, false, false);
    nvh_arena_debug_check(h, a, "free");
}

/* ==========================================================================
 * The free: classify -> log -> apply
 * ========================================================================== */
static inline __attribute__((always_inline)) int
free_off(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links, unsigned nlinks,
         int64_t named_slot)
{
    free_target t = {0};    /* in registers: only inline code takes its address */
    t.block = (off - h->chunks_off) / NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, t.block);
    if (c >= h->max_chunks || c >= __atomic_load_n(&h->hwm, __ATOMIC_ACQUIRE))
        return nvh_fail(NVH_E_BADPTR, "offset %llu is beyond the heap's chunks",
                        (unsigned long long)off);
    t.arena = lock_owner(h, c, t.block);
    nvh_redo_preflush(h, t.arena);
    /* The record is started here and completed by free_log: zeroed just
     * before nvh_redo_append1 checksums it, its loads would wait on the
     * zeroing stores, which made every free measurably slower. */
    struct nvh_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.obj = off;
    rec.kind_links = named_slot >= 0 ? NVH_REC_FREE_NAMED : NVH_REC_FREE;
    if (named_slot >= 0) rec.link[0].addr = (uint64_t)named_slot;
    int rc = free_classify(h, off, c, &t);
    if (rc == NVH_OK) {
        uint64_t seq = free_log(h, &t, links, nlinks, &rec);
        free_apply(h, &t, &rec, seq, links, nlinks, named_slot);
    }
    t.arena->links_clwb = false;    /* a failed free issued no fence */
    nvh_alock_unlock(&t.arena->lock);
    return rc;
}

int nvh_free_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                  unsigned nlinks, int64_t named_slot)
{
    return free_off(h, off, links, nlinks, named_slot);
}

int nvh_free(nvh_pool *pool, void *ptr, const nvh_link *links, unsigned nlinks)
{
    uint64_t off = 0;
    struct nvh_link_entry e[NVH_LINKS_MAX_];
    nvh_heap *h = nvh_op_enter(pool, true, ptr, links, nlinks, &off, e);
    if (!h) return nvh_errcode();
    /* the name would point at memory handed to the next object */
    if (nvh_named_has(h, off))
        return nvh_fail(NVH_E_INVAL, "nvh_free: the object at offset %llu is named; use "
                        "nvh_free_named", (unsigned long long)off);
    return free_off(h, off, e, nlinks, -1);
}
