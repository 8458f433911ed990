/* arena.c — the per-arena DRAM state behind the allocation paths: the arena
 * lock's contended path, the sorted free-block extents (merged on insert,
 * best fit), the bins of non-full runs with their rotating slot cursor, and
 * the exclusion of damaged space. All of it is rebuilt from the media after
 * a crash (docs/ALLOC.md §3); a->lock guards an arena's part.
 *
 * The paths that use it: reserve.c, activate.c, free.c (and fifo.c, which
 * gives freed space back here). */
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
    for (unsigned c = 0; c <= NVH_CLS_TOP; c++) free(a->bins[c].v);
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
            nvh_run *run = nvh_run_lookup(h, b);
            if (run) run->quarantined = true;
        }
        nvh_alock_unlock(&a->lock);
    }
}

/* Best fit inside one chunk. Extents may span chunk boundaries after a merge,
 * so the candidate range is clipped to the chunk of its start. */
bool nvh_extent_take(nvh_heap *h, nvh_arena *a, uint64_t n, uint64_t *block_out)
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
/* Reservations take the lowest-addressed run of the class with a slot:
 * live objects gather in a class's lowest runs, so the runs above them
 * empty out as objects are freed and the heap's used address space follows
 * its live data down after a peak ([Moraru11] Table 2 at 1/1) instead of
 * staying spread over the space of the peak. A run re-enters its bin when
 * a slot of it is freed while it was out; in a large heap freed at random
 * (a store after deletes) that is nearly every free, anywhere in the
 * address range, so the bin is a min-heap on the run's block: O(log n) per
 * add and per run leaving the top, where a sorted list walked every run
 * below the one added; its lowest runs wait in a short sorted front
 * (nvh_bin_add). */
static inline bool bin_less(const nvh_bin_ent *x, const nvh_bin_ent *y)
{
    return x->block < y->block;
}

static void heap_push(nvh_bin *b, nvh_bin_ent e)
{
    nvh_bin_ent *v = b->v + NVH_BIN_FRONT;
    uint32_t i = b->n++;
    while (i) {                         /* sift up */
        uint32_t up = (i - 1) / 2;
        if (!bin_less(&e, &v[up])) break;
        v[i] = v[up];
        i = up;
    }
    v[i] = e;
}

/* Where a run re-enters its bin: usually just below the runs being filled
 * (a slot freed in a run that filled earlier, which the next reservations
 * take), so the bin keeps its lowest runs apart in a short sorted front:
 * adding such a run and taking it again costs a shift of at most
 * NVH_BIN_FRONT entries, not two walks down the heap. */
void nvh_bin_add(nvh_arena *a, nvh_run *run)
{
    if (run->in_bin || run->quarantined) return;
    nvh_bin *b = &a->bins[run->cls];
    /* nvh_bin_room made room when the run was made: a run is in its
     * arena's bin at most once (in_bin), and cap >= the arena's runs */
    NVH_ASSERT(b->n < b->cap);
    if (__builtin_expect(b->n >= b->cap, 0)) return;
    run->in_bin = true;
    nvh_bin_ent e = {run->block, run};
    if (b->n && !bin_less(&e, &b->v[NVH_BIN_FRONT])) {
        heap_push(b, e);                /* above the heap's lowest */
        return;
    }
    if (b->nf == NVH_BIN_FRONT) {
        /* full: the highest of e and the front goes to the heap (below
         * every heap entry, so the front stays below the heap) */
        if (bin_less(&b->v[b->nf - 1], &e)) {
            heap_push(b, e);
            return;
        }
        heap_push(b, b->v[--b->nf]);
    }
    uint32_t i = b->nf++;
    while (i && bin_less(&e, &b->v[i - 1])) {
        b->v[i] = b->v[i - 1];
        i--;
    }
    b->v[i] = e;
}

/* Remove the front's first entry (nvh_bin_first, alloc.h). */
void nvh_bin_front_pop_(nvh_bin *b)
{
    b->nf--;
    memmove(&b->v[0], &b->v[1], b->nf * sizeof *b->v);
}

/* Remove the heap's top (nvh_bin_first, alloc.h, clears its in_bin). */
void nvh_bin_pop_(nvh_bin *b)
{
    nvh_bin_ent *v = b->v + NVH_BIN_FRONT;
    nvh_bin_ent e = v[--b->n];
    uint32_t n = b->n, i = 0;
    for (;;) {                          /* sift down */
        uint32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bin_less(&v[c + 1], &v[c])) c++;
        if (!bin_less(&v[c], &e)) break;
        v[i] = v[c];
        i = c;
    }
    if (n) v[i] = e;
}

/* Room in a's bin of cls for one more run of the class (before a->nruns
 * counts it): the allocation happens where making a run may fail, so that
 * nvh_bin_add cannot. The heap alone can hold every run. */
bool nvh_bin_room(nvh_arena *a, unsigned cls)
{
    nvh_bin *b = &a->bins[cls];
    if (a->nruns[cls] < b->cap) return true;
    uint32_t cap = b->cap ? b->cap * 2 : 16;
    nvh_bin_ent *g = realloc(b->v, (NVH_BIN_FRONT + cap) * sizeof *g);
    if (!g) return false;
    b->v = g;
    b->cap = cap;
    return true;
}

/* Preferred run sizes per class (alloc.h: nvh_run_blocks_for), filled on
 * first use; every thread computes the same values, so the racing stores
 * are benign (relaxed atomics for the sanitizers). */
uint8_t nvh_run_blocks_tab_[NVH_RUN_LEVELS][NVH_CLS_TOP + 1];

/* Sizes above 4032 B, by 64 B step k = (size + 63) / 64 from 64 to
 * NVH_CLS_TOP: the class (alloc.h), or 0 for whole blocks. A class c holds
 * n = (65536 - 64) / (64 c) slots in a 16-block run, 65536 / n bytes per
 * object; k takes the smallest class >= k when that is below
 * ceil(64 k / 4096) x 4096 (test_alloc_runs: geometry derives the table
 * again). */
const uint8_t nvh_big_cls_[NVH_CLS_TOP - 63] = {
    0, 68, 68, 68, 68, 73, 73, 73, 73, 73, 78, 78, 78, 78, 78, 85,
    85, 85, 85, 85, 85, 85, 93, 93, 93, 93, 93, 93, 93, 93, 102, 102,
    102, 102, 102, 102, 102, 102, 102, 113, 113, 113, 113, 113, 113, 113, 113, 113,
    113, 113, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146, 146,
    146, 146, 146, 170, 170, 170, 170, 170, 170, 170, 170, 170, 170, 170, 170, 170,
    170, 170, 170, 170, 170, 170, 170, 170, 170, 170, 170, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 204, 204, 204, 204, 204, 204, 204, 204, 204, 204, 204, 204};
unsigned nvh_run_blocks_for_(unsigned level, unsigned cls)
{
    unsigned best = 0, lim = 1u << level;
    uint64_t best_waste = 0;
    /* at least two slots (a run of one slot is a block that only its class
     * can reuse): classes above 2016 B need two blocks even at level 0 */
    while (nvh_run_slots(cls, lim) < 2) lim++;
    for (unsigned b = 1; b <= lim; b++) {
        unsigned n = nvh_run_slots(cls, b);
        if (n < 2) continue;
        uint64_t waste = (uint64_t)b * NVH_BLOCK - (uint64_t)n * nvh_cls_size(cls);
        /* waste / b below best_waste / best (cross-multiplied) */
        if (!best || waste * best < best_waste * b) {
            best = b;
            best_waste = waste;
        }
    }
    __atomic_store_n(&nvh_run_blocks_tab_[level][cls], (uint8_t)best, __ATOMIC_RELAXED);
    return best;
}

/* Make every block of run point at its descriptor (a pointer into any block
 * of the run finds the run). Release stores: frees read them unlocked. */
void nvh_run_publish(nvh_heap *h, nvh_chunk *ch, nvh_run *run)
{
    uint64_t first = run->block & (h->bpc - 1);
    for (unsigned i = 0; i < run->blocks; i++)
        __atomic_store_n(&ch->runs[first + i], run, __ATOMIC_RELEASE);
}

/* A new run of class cls on [block, block + blocks) (taken from a's free
 * extents), in a's bin. */
nvh_run *nvh_run_new(nvh_heap *h, nvh_arena *a, uint64_t block, unsigned cls, unsigned blocks)
{
    nvh_chunk *ch = nvh_chunk_get(h, nvh_chunk_of_block(h, block));
    nvh_run *run = ch && nvh_bin_room(a, cls) ? calloc(1, sizeof *run) : NULL;
    if (!run) return NULL;
    run->block = block;
    run->cls = (uint8_t)cls;
    run->blocks = (uint8_t)blocks;
    run->nslots = (uint8_t)nvh_run_slots(cls, blocks);
    nvh_run_derive(h, run);
    run->avail = run->nslots == 64 ? ~0ull : (1ull << run->nslots) - 1;
    /* runs are carved from the front of free extents: map 64 KiB ahead at
     * once instead of faulting page by page (heap.c: nvh_prefault) */
    for (uint64_t x = block; x < block + blocks; x++)
        if ((x & 15) == 0 && !nvh_run_lookup(h, x + 1)) nvh_prefault(h, x, 16);
    nvh_run_publish(h, ch, run);
    nvh_bin_add(a, run);
    a->nruns[cls]++;
    return run;
}

/* Next available slot at or after the rotating cursor: consecutive
 * reservations walk through the run instead of reusing the last-freed slot. */
unsigned nvh_run_pick(nvh_run *run)
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
 * Debug invariant (NVHEAP_DEBUG_ALLOC=1, alloc.h: nvh_arena_debug_check)
 * ========================================================================== */
_Atomic int nvh_arena_debug_on_ = -1;
void nvh_arena_debug_check_(nvh_heap *h, nvh_arena *a, const char *where)
{
    int v = atomic_load_explicit(&nvh_arena_debug_on_, memory_order_relaxed);
    if (v < 0) {
        v = getenv("NVHEAP_DEBUG_ALLOC") != NULL;
        atomic_store_explicit(&nvh_arena_debug_on_, v, memory_order_relaxed);
    }
    if (!v) return;
    for (size_t i = 0; i < a->next; i++) {
        const nvh_extent *x = &a->ext[i];
        if (i && a->ext[i - 1].block + a->ext[i - 1].nblocks > x->block) {
            fprintf(stderr, "nvheap debug (%s): free extents overlap at %zu\n", where, i);
            abort();
        }
        for (uint64_t b = x->block; b < x->block + x->nblocks; b++) {
            if (nvh_run_lookup(h, b)) {
                fprintf(stderr, "nvheap debug (%s): free extent [%llu,+%llu) covers the run at "
                        "block %llu\n", where, (unsigned long long)x->block,
                        (unsigned long long)x->nblocks, (unsigned long long)b);
                abort();
            }
            if (h->pview[b] && nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state == NVH_RS_USED) {
                fprintf(stderr, "nvheap debug (%s): free extent covers the used region at "
                        "block %llu\n", where, (unsigned long long)b);
                abort();
            }
        }
    }
}
