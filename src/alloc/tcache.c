/* tcache.c — the per-thread reservation cache (docs/ALLOC.md §4a).
 *
 * nvh_reserve of a small size pops a slot from the calling thread's cache:
 * no lock, no atomic read-modify-write, no clock (reserve.c). An empty cache
 * is refilled under the arena lock with up to tc_batch(cls) slots picked by
 * the same rotating cursor as before (wear). Cached and handed-out-but-not-
 * activated slots carry run->tcached (instead of run->resv); activate and
 * cancel accept either, but refuse a slot still in the caller's own cache
 * (alloc.h: nvh_tcache_holds). The cache is DRAM only, so a crash frees it
 * with every other reservation.
 *
 * A cache is attached to one heap at a time: it goes back to its arenas at
 * thread exit and when the thread moves to another heap, and is detached
 * (its entries void) when the heap closes. Lock order: tc_lock -> arena ->
 * heap. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

static pthread_mutex_t tc_lock = PTHREAD_MUTEX_INITIALIZER; /* lists, attach */
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
_Thread_local nvh_tcache *nvh_tcache_mine_;   /* read inline by nvh_reserve */

/* Give every slot in tc back to h's arenas. Caller holds tc_lock and tc is
 * attached to h (so h is alive: close detaches under tc_lock first). */
static void tc_return(nvh_heap *h, nvh_tcache *tc)
{
    for (unsigned cls = 1; cls <= NVH_CLS_TOP; cls++) {
        while (tc->n[cls]) {
            uint64_t off = tc->off[cls][--tc->n[cls]];
            uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK;
            nvh_arena *a =
                &h->arenas[nvh_owner_get(h, nvh_chunk_of_block(h, b), memory_order_acquire)];
            nvh_alock_lock(&a->lock);
            nvh_run *run = nvh_run_lookup(h, b);
            unsigned slot = 0;
            bool ok = run && nvh_run_slot_at(h, run, off, &slot);
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
    if (nvh_tcache_mine_ == tc) nvh_tcache_mine_ = NULL;
    free(tc);
}

/* Crash-simulator children are forked at fences, possibly while this
 * thread holds an arena lock and other (absent) threads hold tc_lock: the
 * child starts with a fresh, unattached cache (the old one stays, unused,
 * on the parent heap's list copy) and a fresh lock. */
static void tc_atfork_child(void)
{
    pthread_mutex_init(&tc_lock, NULL);
    nvh_tcache_mine_ = NULL;
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
nvh_tcache *nvh_tcache_attach(nvh_heap *h)
{
    nvh_tcache *tc = nvh_tcache_mine_;
    if (!tc) {
        pthread_once(&tc_once, tc_init_once);
        tc = calloc(1, sizeof *tc);
        if (!tc) return NULL;
        nvh_tcache_mine_ = tc;
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

/* Slots taken per refill: fewer for big classes, whose runs hold few. */
static inline unsigned tc_batch(unsigned cls)
{
    unsigned n = nvh_run_slots(cls, nvh_run_blocks_for(cls, NVH_RUN_LEVELS)) / 4;
    return n < 1 ? 1 : n > NVH_TC_SLOTS ? NVH_TC_SLOTS : n;
}

/* Refill: one slot for the caller (*off) and up to tc_batch - 1 more for
 * the cache, all from arena a's bins in cursor order. Caller holds a->lock. */
int nvh_tcache_refill(nvh_heap *h, nvh_arena *a, nvh_tcache *tc, unsigned cls, uint64_t *off)
{
    uint64_t got[NVH_TC_SLOTS];
    unsigned n = 0, want = tc_batch(cls);
    int rc = nvh_reserve_small(h, a, cls, &got[n]);
    if (rc != NVH_OK) return rc;
    {   /* resv -> tcached: the caller's slot, found from its offset */
        uint64_t rel = got[0] - h->chunks_off;
        nvh_run *run = nvh_run_lookup(h, rel / NVH_BLOCK);
        unsigned slot = 0;
        nvh_run_slot_at(h, run, got[0], &slot);
        run->resv &= ~(1ull << slot);
        run->tcached |= 1ull << slot;
    }
    n++;
    while (n < want) {
        /* more only from runs already in the bin: no new run, no refill;
         * the run and slot are at hand, so they go straight to tcached */
        nvh_run *run = nvh_bin_first(a, cls);
        if (!run) break;
        unsigned slot = nvh_run_pick(run);
        run->resv &= ~(1ull << slot);
        run->tcached |= 1ull << slot;
        got[n++] = nvh_run_slot_off(h, run, slot);
    }
    *off = got[0];
    /* the cache is a stack: push in reverse so pops follow the cursor */
    for (unsigned i = n; i-- > 1;) tc->off[cls][tc->n[cls]++] = got[i];
    /* the caller's slot above the top: nvh_tcache_holds answers for it
     * without a scan (it is in no entry below) */
    if (tc->n[cls] < NVH_TC_SLOTS) tc->off[cls][tc->n[cls]] = got[0];
    return NVH_OK;
}
