/* fifo.c — the don't-allocate FIFO: space a free gives back waits here,
 * per arena and in free order, before it can be reserved again. It serves
 * two ends at once (docs/ALLOC.md §4, §7):
 *   - wear [Moraru11]: freed space is not rewritten at once (at least the
 *     delay T, nvh_heap_config.fifo_delay_ns, unless space runs short);
 *   - the redo log: an entry leaves only once its free record is retired in
 *     every ring, so no replay can touch the space's old incarnation after
 *     it is reused.
 * The push is inline (alloc.h: nvh_fifo_push, every free); frees drain in
 * batches (free.c), reserve drains when it needs space (reserve.c). */
#include "alloc.h"

#include <stdlib.h>

/* FIFO growth (power-of-2 capacity), out of line: it is rare */
bool nvh_fifo_grow_(nvh_arena *a)
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

/* Give the space of one entry back: a slot to its run (and the run to its
 * bin), an extent to the arena's free extents, whole chunks to the heap's
 * free-chunk list. */
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

/* Stamp the unstamped entries (the tail from the first unstamped one). */
static void fifo_stamp(nvh_arena *a, uint64_t s)
{
    for (size_t i = a->fifo_len; i-- > 0;) {
        nvh_fifo_entry *e = &a->fifo[(a->fifo_head + i) & (a->fifo_cap - 1)];
        if (e->epoch) break;
        e->epoch = s;
    }
}

/* Release FIFO heads whose time is up (or all, if force), whose free
 * record is retired in every ring (so no replay can touch the space's old
 * incarnation once it is reused), and that no lock-free reader can still
 * hold (no reader is in, or the entry was stamped before every reader in
 * began: common/epoch.c; even when forced, as a reader would see the space
 * reused under it). Returns how many were released. Called through
 * nvh_fifo_drain (alloc.h), which skips an empty FIFO. a->lock held (the
 * retire it may do needs it; every free pushes under it, so each free in
 * the FIFO happened before the drain). */
size_t nvh_fifo_drain_(nvh_heap *h, nvh_arena *a, bool force, bool may_retire)
{
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
        if (readers != UINT64_MAX) {
            /* a reader is in: entries must carry a stamp taken after their
             * unlink. Unstamped entries are the FIFO's tail from here (a
             * drain stamps up to the tail), so one stamp covers them all;
             * the frees happened before this drain (a->lock), hence before
             * the stamp's read-modify-write (common/epoch.c) */
            if (e->epoch == 0) fifo_stamp(a, nvh_epoch_now_());
            if (e->epoch >= readers) {
                nvh_epoch_advance_();  /* readers that start now do not hold it */
                break;
            }
        }
        /* no reader in: one that announces later sees every unlink that
         * happened before this drain (the scan's fence), so none holds e */
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
