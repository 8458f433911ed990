/* cache.c — the per-thread window cache of async protection: window calls
 * on pages a thread used recently cost plain loads and stores instead of a
 * LOCKed read-modify-write on the pool's shared per-page window count.
 *
 * Why: on the B+ tree (docs/PROTECT.md) each insert opens and closes ~2.3
 * windows; a LOCKed RMW on the shared count per call costs more than the
 * whole 1.10x target allows (a LOCKed instruction on x86 waits for the
 * CLWBs issued before it).
 *
 * The model. The shared count of a page is a number of UNITS: one per open
 * window, as before, plus the units the threads' caches hold. A cache holds
 * the units of windows this thread closed:
 *   close of a single-page window   keep its unit in the cache; the shared
 *                                   count is not touched (the page stays "in
 *                                   use", so writable)
 *   open                            take a unit the cache holds for the page
 *                                   (no shared update); else take a batch of
 *                                   PR_TC_BATCH units with one atomic add:
 *                                   one for this window, the rest for the
 *                                   page's next windows (a record page gets
 *                                   16, most opened before the first closes)
 * So every open window always has its unit in the shared count, which is all
 * the service, the fault handler and other threads ever look at: they need
 * no change, and a window may still be closed by another thread than the
 * one that opened it (the closer keeps the unit, or takes the shared path).
 * A cached unit only delays the moment the page's count reaches 0.
 *
 * Giving units back (the exposure bound). Every entry has a `touched` bit
 * that the owner sets at each open or close it serves. At every pass the
 * service takes each table from its owner for a moment (below) and, per
 * entry: touched -> clear it; not touched (no window call on the page
 * since the previous pass) -> give the units back without the second chance
 * (pr_release_units_), before the pass drains, so that pass protects the
 * page. A page whose last window closed in the interval before pass P is
 * thus read-only after pass P+1: <= 2 intervals, the bound of the second
 * chance. A page used at least once per interval keeps its unit forever:
 * no shared update, no queue entry, no system call. An owner that evicts an
 * entry (its set is full: another page needs the way) gives its units back
 * at once, with the second chance if the page was used since the last pass
 * (tc_evict).
 *
 * Taking a table without atomics on the owner's side: the owner's cached
 * call stores 1 to the table's `busy`, reads `steal`, works, stores 0 —
 * plain moves (relaxed atomics) and compiler barriers only. The service sets
 * steal, runs membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which executes a
 * full barrier on every CPU that runs a thread of the process, then waits
 * for busy to read 0: from then on every call of the owner sees steal set
 * and takes the shared path until steal is cleared (the asymmetric Dekker
 * pattern: the StoreLoad barrier the owner would need between its busy store
 * and its steal load is run for it by the kernel, once per pass). Without
 * membarrier (old kernels) the cache stays off.
 *
 * Tables: one per (thread, pool): PR_TC_SLOTS one-word entries (below) in
 * 8-way sets of one cache line, the set picked by a hash of the page number
 * (a direct-mapped table on the page number missed on 19% of the B+ tree's
 * leaf-slot windows at 1 M keys: runs of node pages crowd some slots; each
 * miss is a LOCKed add plus an eviction's LOCKed release, and a LOCKed
 * instruction waits for the insert's CLWBs before it; 8-way: 1%, the first
 * use of a page in an interval). Allocated at the thread's first cached
 * call on the pool and linked into the pool's list under one process-wide
 * mutex. The thread
 * reaches its tables through one initial-exec TLS pointer (the library's
 * static TLS block stays small: tests/abi/test_dlopen.c). At thread exit a
 * destructor gives the units back and frees the tables; when a pool stops
 * caching (protection off or sync, STRICT, a short interval, close), every
 * unit is taken back and the tables are unlinked and marked dead, to be
 * freed by their owner at its next look-up or exit.
 *
 * Unbalanced closes: a close is checked against the shared count before its
 * unit is kept (count > units this thread holds of the page), so an
 * unbalanced nvh_protect is still reported — unless other threads hold
 * cached units of that page, which that check cannot tell from open windows
 * (docs/PROTECT.md, Limits).
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* --------------------------------------------------------------------------
 * Tables (the layout, the entry word and the set hash are in protect.h,
 * next to the inline hit path)
 * -------------------------------------------------------------------------- */
/* The thread's tables, by the pool's cache id (unique per enabling). */
typedef struct pr_tc_tls {
    uint64_t id[PR_TC_POOLS];
    pr_tcache *tc[PR_TC_POOLS];
} pr_tc_tls;

static _Thread_local pr_tc_tls *tc_tls __attribute__((tls_model("initial-exec")));
_Thread_local pr_tc_hot nvh_protect_tc_hot_ __attribute__((tls_model("initial-exec")));

static pthread_mutex_t tc_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t tc_next_id = 1;

/* The page field holds page + 1, so that an empty entry (0) never matches. */
static inline uint64_t tc_page(uint64_t w) { return (w >> PR_TC_PAGE_SHIFT) - 1u; }
static inline uint64_t tc_tag(uint64_t page) { return (page + 1u) << PR_TC_PAGE_SHIFT; }
static inline uint32_t tc_units(uint64_t w) { return (uint32_t)(w & PR_TC_UNITS_MAX); }
static inline uint32_t tc_opened(uint64_t w)
{
    return (uint32_t)(w >> PR_TC_OPEN_SHIFT) & PR_TC_OPEN_MAX;
}

/* --------------------------------------------------------------------------
 * membarrier
 * -------------------------------------------------------------------------- */
static pthread_once_t mb_once = PTHREAD_ONCE_INIT;
static bool mb_ok;

static void mb_init(void)
{
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (q < 0 || !(q & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return;
    mb_ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/* --------------------------------------------------------------------------
 * Giving units back (owner on eviction; service / thread exit / mode
 * changes on a table they hold)
 * -------------------------------------------------------------------------- */
/* tick: when the page's last window closed, as far as known (0 = now). */
static inline void tc_drop(struct nvh_protect *pr, pr_tc_entry *e, bool release, bool ref,
                           uint64_t tick)
{
    uint64_t w = atomic_load_explicit(&e->word, memory_order_relaxed);
    if (!w) return;
    atomic_store_explicit(&e->word, 0, memory_order_relaxed);
    if (release && tc_units(w)) pr_release_units_(pr, tc_page(w), tc_units(w), tick, ref);
}

/* The owner evicts an entry to make room for another page: its units go
 * back now. With the second chance if the page was used since the last
 * pass (touched: it is in use); without if not (its last use was in the
 * interval before that pass, so the next pass protects it, as the service
 * would have at its next look): the exposure stays <= 2 intervals either
 * way. */
static inline void tc_evict(struct nvh_protect *pr, pr_tc_entry *e)
{
    uint64_t w = atomic_load_explicit(&e->word, memory_order_relaxed);
    tc_drop(pr, e, true, (w & PR_TC_TOUCHED) != 0, 0);
}

static void tc_empty(struct nvh_protect *pr, pr_tcache *tc, bool release)
{
    for (uint32_t i = 0; i < PR_TC_SLOTS; i++) tc_drop(pr, &tc->e[i], release, false, 0);
    atomic_store_explicit(&tc->nonempty, 0, memory_order_relaxed);
}

/* The service's pass over a table it holds: untouched units back, touched
 * bits cleared. An untouched entry was last used in the interval before the
 * previous pass; the protect latency counts from the middle of it (the
 * entries carry no timestamp: no TSC read per close). */
static void tc_age(struct nvh_protect *pr, pr_tcache *tc, uint64_t tick)
{
    bool left = false;
    for (uint32_t i = 0; i < PR_TC_SLOTS; i++) {
        pr_tc_entry *e = &tc->e[i];
        uint64_t w = atomic_load_explicit(&e->word, memory_order_relaxed);
        if (!w) continue;
        if (w & PR_TC_TOUCHED) {
            atomic_store_explicit(&e->word, w & ~PR_TC_TOUCHED, memory_order_relaxed);
            left = true;
        } else {
            tc_drop(pr, e, true, false, tick);
        }
    }
    atomic_store_explicit(&tc->nonempty, left, memory_order_relaxed);
}

/* --------------------------------------------------------------------------
 * The thread's tables
 * -------------------------------------------------------------------------- */
static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;
static bool tc_key_ok;

/* Under tc_lock, by the owner (exit, slot reuse): give back what a live
 * table holds, unlink it, free it. */
static void tc_retire_locked(pr_tcache *tc)
{
    struct nvh_protect *pr = tc->pr;
    if (pr) {
        tc_empty(pr, tc, true);
        if (tc->prev) tc->prev->next = tc->next;
        else pr->tc_list = tc->next;
        if (tc->next) tc->next->prev = tc->prev;
    }
    if (nvh_protect_tc_hot_.tc == tc) nvh_protect_tc_hot_ = (pr_tc_hot){NULL, NULL, NULL};
    free(tc);
}

/* Thread exit: no call of this thread is running any more. */
static void tc_thread_exit(void *p)
{
    pr_tc_tls *t = p;
    if (tc_tls == t) tc_tls = NULL;
    pthread_mutex_lock(&tc_lock);
    for (unsigned k = 0; k < PR_TC_POOLS; k++)
        if (t->tc[k]) tc_retire_locked(t->tc[k]);
    pthread_mutex_unlock(&tc_lock);
    free(t);
}

static void tc_key_init(void) { tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0; }

/* Unload (dlclose) or exit: see list_key_fini in window.c. */
__attribute__((destructor)) static void tc_key_fini(void)
{
    if (tc_key_ok) {
        tc_key_ok = false;
        pthread_key_delete(tc_key);
    }
}

/* Slow path: a table for (pr, id), in a free or dead slot or replacing the
 * least recently attached one. NULL: no cache for this call. */
static pr_tcache *tc_attach(struct nvh_protect *pr, uint64_t id)
{
    pr_tc_tls *t = tc_tls;
    if (!t) {
        pthread_once(&tc_key_once, tc_key_init);
        if (!tc_key_ok) return NULL;           /* no exit hook: units would leak */
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        pthread_setspecific(tc_key, t);
        tc_tls = t;
    }
    pr_tcache *tc = aligned_alloc(64, NVH_ALIGN_UP(sizeof *tc, 64));
    if (!tc) return NULL;
    memset(tc, 0, sizeof *tc);
    pthread_mutex_lock(&tc_lock);
    if (atomic_load(&pr->tc_id) != id) {        /* turned off meanwhile */
        pthread_mutex_unlock(&tc_lock);
        free(tc);
        return NULL;
    }
    unsigned k = PR_TC_POOLS - 1;
    for (unsigned j = 0; j < PR_TC_POOLS; j++)
        if (!t->tc[j] || !t->tc[j]->pr) { k = j; break; }
    if (t->tc[k]) tc_retire_locked(t->tc[k]);
    tc->pr = pr;
    tc->next = pr->tc_list;
    if (pr->tc_list) pr->tc_list->prev = tc;
    pr->tc_list = tc;
    for (unsigned j = k; j > 0; j--) { t->tc[j] = t->tc[j - 1]; t->id[j] = t->id[j - 1]; }
    t->tc[0] = tc;
    t->id[0] = id;
    pthread_mutex_unlock(&tc_lock);
    return tc;
}

static inline pr_tcache *tc_find(struct nvh_protect *pr, uint64_t id)
{
    pr_tc_tls *t = tc_tls;
    if (__builtin_expect(t != NULL, 1)) {
        if (t->id[0] == id) return t->tc[0];
        for (unsigned k = 1; k < PR_TC_POOLS; k++)
            if (t->id[k] == id) return t->tc[k];
    }
    return tc_attach(pr, id);
}

/* --------------------------------------------------------------------------
 * The owner's fast path
 * -------------------------------------------------------------------------- */
static inline pr_tcache *tc_get(struct nvh_protect *pr)
{
    uint64_t id = atomic_load_explicit(&pr->tc_id, memory_order_relaxed);
    if (!id) return NULL;
    pr_tcache *tc = tc_find(pr, id);
    if (!tc) return NULL;
    /* the inline hit path (protect.h) serves this thread's next calls on
     * the pool from this table */
    if (nvh_protect_tc_hot_.tc != tc) nvh_protect_tc_hot_ = (pr_tc_hot){pr->pool, pr->base, tc};
    return pr_tc_enter(tc) ? tc : NULL;
}

/* Where a page that is not in its set goes: an empty way, else one whose
 * page was not used since the service last looked (no touched bit), else
 * the way the page number picks. Its current entry, if any, is evicted by
 * the caller. */
static pr_tc_entry *tc_victim(pr_tc_entry *set, uint64_t page)
{
    pr_tc_entry *cold = NULL;
    for (unsigned i = 0; i < PR_TC_WAYS; i++) {
        uint64_t w = atomic_load_explicit(&set[i].word, memory_order_relaxed);
        if (!w) return &set[i];
        if (!(w & PR_TC_TOUCHED) && !cold) cold = &set[i];
    }
    return cold ? cold : &set[page & (PR_TC_WAYS - 1)];
}

int pr_tc_open(struct nvh_protect *pr, uint64_t page)
{
    pr_tcache *tc = tc_get(pr);
    if (!tc) return PR_TC_NOT_CACHED;
    pr_tc_entry *set = pr_tc_set(tc, page), *e = pr_tc_lookup(set, page);
    uint64_t w = e ? atomic_load_explicit(&e->word, memory_order_relaxed) : 0;
    uint64_t opened = e && tc_opened(w) == PR_TC_OPEN_MAX ? 0 : (uint64_t)1 << PR_TC_OPEN_SHIFT;
    if (e && tc_units(w)) {                            /* take a held unit */
        atomic_store_explicit(&e->word, (w - 1 + opened) | PR_TC_TOUCHED, memory_order_relaxed);
        pr_tc_leave(tc);
        return PR_TC_DONE;
    }
    /* None held: take a batch from the shared count in one atomic add, one
     * for this window and the rest for the page's next windows (a record
     * page gets 16 windows, mostly opened before the first one closes). */
    int rc = atomic_fetch_add(&pr->count[page], PR_TC_BATCH) == 0 ? PR_TC_FIRST : PR_TC_DONE;
    pr_stat(pr, ST_TC_MISSES, 1);
    if (!e) {
        e = tc_victim(set, page);
        tc_evict(pr, e);
        w = tc_tag(page);
    }
    atomic_store_explicit(&e->word, (w + opened + (PR_TC_BATCH - 1)) | PR_TC_TOUCHED,
                          memory_order_relaxed);
    if (!atomic_load_explicit(&tc->nonempty, memory_order_relaxed))
        atomic_store_explicit(&tc->nonempty, 1, memory_order_relaxed);
    pr_tc_leave(tc);
    return rc;
}

int pr_tc_close(struct nvh_protect *pr, uint64_t page)
{
    pr_tcache *tc = tc_get(pr);
    if (!tc) return PR_TC_NOT_CACHED;
    pr_tc_entry *set = pr_tc_set(tc, page), *e = pr_tc_lookup(set, page);
    uint64_t w = e ? atomic_load_explicit(&e->word, memory_order_relaxed) : 0;
    uint32_t mine = e ? tc_units(w) : 0, opened = e ? tc_opened(w) : 0;
    if (mine == PR_TC_UNITS_MAX) { pr_tc_leave(tc); return PR_TC_NOT_CACHED; }
    if (opened) {
        /* closes a window this entry's unit opened (the usual case): the
         * window exists, no check needed */
        w -= (uint64_t)1 << PR_TC_OPEN_SHIFT;
    } else {
        /* the window being closed must exist: its unit is in the shared
         * count besides the ones this thread holds (else it is an
         * unbalanced call: the shared path must not take one of our units
         * for it). A plain load: only the value matters. */
        if (atomic_load_explicit(&pr->count[page], memory_order_relaxed) <= mine) {
            pr_tc_leave(tc);
            return PR_TC_UNBALANCED;
        }
        if (!e) {
            e = tc_victim(set, page);
            tc_evict(pr, e);
            w = tc_tag(page);
        }
    }
    atomic_store_explicit(&e->word, (w + 1) | PR_TC_TOUCHED, memory_order_relaxed);
    if (!atomic_load_explicit(&tc->nonempty, memory_order_relaxed))
        atomic_store_explicit(&tc->nonempty, 1, memory_order_relaxed);
    pr_tc_leave(tc);
    return PR_TC_DONE;
}

/* --------------------------------------------------------------------------
 * Taking tables from their owners (under tc_lock)
 * -------------------------------------------------------------------------- */
enum { TC_AGE, TC_EMPTY, TC_FORGET };

/* what: TC_AGE (a service pass), TC_EMPTY (every unit back: nvh_protect_sync),
 * TC_FORGET (units dropped, counts are being reset; tables die). release:
 * give units back (TC_EMPTY, or TC_FORGET while the counts still matter). */
static void take_tables(struct nvh_protect *pr, int what, bool release)
{
    unsigned n = 0;
    for (pr_tcache *tc = pr->tc_list; tc; tc = tc->next) {
        if (what == TC_AGE && !atomic_load_explicit(&tc->nonempty, memory_order_relaxed))
            continue;
        atomic_store(&tc->steal, 1);
        n++;
    }
    if (n == 0) return;
    /* every owner's busy store before now is visible, every owner's later
     * steal load sees 1 */
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    /* TC_AGE: the middle of the interval before the previous pass */
    uint64_t tick = 0;
    if (what == TC_AGE && pr->tc_pass_tick[2])
        tick = pr->tc_pass_tick[2] / 2 + pr->tc_pass_tick[1] / 2;
    pr_tcache *next;
    for (pr_tcache *tc = pr->tc_list; tc; tc = next) {
        next = tc->next;
        if (!atomic_load(&tc->steal)) continue;
        while (atomic_load_explicit(&tc->busy, memory_order_acquire)) sched_yield();
        if (what == TC_AGE) {
            tc_age(pr, tc, tick);
        } else {
            tc_empty(pr, tc, release);
        }
        if (what == TC_FORGET) {
            /* dead: the owner frees it; steal stays set, so a call that
             * raced with the switch takes the shared path */
            if (tc->prev) tc->prev->next = tc->next;
            else pr->tc_list = tc->next;
            if (tc->next) tc->next->prev = tc->prev;
            tc->next = tc->prev = NULL;
            tc->pr = NULL;
            continue;
        }
        atomic_store_explicit(&tc->steal, 0, memory_order_release);
    }
}

void pr_tc_pass(struct nvh_protect *pr)
{
    if (!atomic_load_explicit(&pr->tc_id, memory_order_relaxed)) return;
    pr->tc_pass_tick[2] = pr->tc_pass_tick[1];
    pr->tc_pass_tick[1] = pr->tc_pass_tick[0];
    pr->tc_pass_tick[0] = pr_ticks();
    pthread_mutex_lock(&tc_lock);
    take_tables(pr, TC_AGE, true);
    pthread_mutex_unlock(&tc_lock);
}

void pr_tc_steal_all(struct nvh_protect *pr, bool release, bool detach)
{
    pthread_mutex_lock(&tc_lock);
    take_tables(pr, detach ? TC_FORGET : TC_EMPTY, release);
    pthread_mutex_unlock(&tc_lock);
}

void pr_tc_configure(struct nvh_protect *pr)
{
    pthread_once(&mb_once, mb_init);
    bool want = mb_ok && atomic_load(&pr->mode) == NVH_PROTECT_ASYNC &&
                !(pr->flags & (NVH_PROTECT_STRICT | NVH_PROTECT_NO_CACHE)) &&
                atomic_load(&pr->interval_ns) >= PR_TC_MIN_INTERVAL;
    uint64_t id = atomic_load(&pr->tc_id);
    if (want && !id) {
        atomic_store(&pr->tc_id, atomic_fetch_add(&tc_next_id, 1));
    } else if (!want && id) {
        atomic_store(&pr->tc_id, 0);
        pr_tc_steal_all(pr, atomic_load(&pr->mode) != NVH_PROTECT_OFF, true);
    }
}
