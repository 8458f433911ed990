/* window.c — opening and closing write windows: the public nvh_unprotect /
 * nvh_protect, their internal aliases for the other layers, and the
 * thread-local implicit windows (nvh_protect_internal_begin/end).
 *
 * The producer's job per page is one atomic count update; only the call that
 * opens the first window (0 -> 1) or closes the last one (1 -> 0) may have
 * anything else to do, and even then it skips when the page is already in
 * the right applied state or already queued:
 *
 *   unprotect 0->1   sync: reconcile now           async: nothing if the page is
 *                                                  still writable (a queued protect
 *                                                  will see count > 0), nothing if
 *                                                  already queued, else queue it
 *   protect   1->0   sync: reconcile now           async: nothing if the page is
 *                                                  still read-only (its unprotect
 *                                                  was never applied), nothing if
 *                                                  queued, else queue it
 *
 * Each skip is safe because the applier re-reads counts after it changes a
 * state bit or clears a pending bit (the seq_cst pairs in protect.h). With
 * the second chance (protect.h) a closing call on a writable page also sets
 * its ref bit, and a page used at least once per interval stays writable
 * and pending: reopening and closing it again costs the count update and a
 * few loads, no queue entry, no fault, no system call.
 *
 * Windows inside one page (nearly all of the library's) take a fast path
 * (open_fast / close_fast) that skips range resolution and the run builder.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <sched.h>
#include <stdlib.h>

_Thread_local pr_tls nvh_protect_tls_ __attribute__((tls_model("initial-exec")));

/* --------------------------------------------------------------------------
 * Queueing runs of pages
 * -------------------------------------------------------------------------- */
typedef struct run_builder {
    struct nvh_protect *pr;
    uint32_t kind;
    uint64_t first, n;
    uint64_t t_ns;
} run_builder;

static void push_request(struct nvh_protect *pr, const pr_request *r)
{
    pr_stat(pr, ST_REQUESTS, 1);
    while (!pr_queue_push(&pr->queue, r)) {
        /* Full: apply the queue ourselves rather than wait for the thread.
         * A producer preempted before publishing its cell can stall the
         * drain at that cell; yield and retry until it has. */
        pr_stat(pr, ST_QUEUE_FULL, 1);
        pthread_mutex_lock(&pr->apply_lock);
        size_t done = pr_drain(pr, false);
        pthread_mutex_unlock(&pr->apply_lock);
        if (done == 0) sched_yield();
    }
}

static void run_flush(run_builder *b)
{
    if (b->n == 0) return;
    if (b->t_ns == 0 && !(b->pr->flags & NVH_PROTECT_NO_LATENCY)) b->t_ns = pr_ticks();
    while (b->n > 0) {
        uint32_t chunk = b->n > (1u << 30) ? (1u << 30) : (uint32_t)b->n;
        pr_request r = {.first_page = b->first, .npages = chunk, .kind = b->kind,
                        .t_ns = b->t_ns};
        push_request(b->pr, &r);
        b->first += chunk;
        b->n -= chunk;
    }
}

static inline void run_add(run_builder *b, uint64_t page)
{
    if (b->n && b->first + b->n == page) { b->n++; return; }
    run_flush(b);
    b->first = page;
    b->n = 1;
}

/* Sync mode (and eager unprotects): reconcile the call's pages now. */
static void apply_now(struct nvh_protect *pr, uint64_t first, uint64_t n, uint32_t kind)
{
    uint64_t t0 = pr_now_ns();
    pthread_mutex_lock(&pr->apply_lock);
    pr_reconcile_range(pr, first, n);
    pthread_mutex_unlock(&pr->apply_lock);
    pr_stat(pr, ST_SYNC_APPLIES, 1);
    pr_hist_add(&pr->lat[kind], pr_now_ns() - t0);
}

/* --------------------------------------------------------------------------
 * The per-page work (pr resolved, mode not off, pages inside the mapping)
 * -------------------------------------------------------------------------- */
/* After the count of `page` went 0 -> 1: what the open still has to do.
 * Sets *apply (sync / eager: reconcile the call's range now) or queues the
 * page into b. */
static inline void open_first(struct nvh_protect *pr, int mode, uint64_t page,
                              run_builder *b, bool *apply)
{
    if (mode == NVH_PROTECT_SYNC) { *apply = true; return; }
    if (pr_bit_test(pr->state, page)) return;                    /* still writable */
    if (pr->flags & NVH_PROTECT_EAGER_UNPROTECT) { *apply = true; return; }
    if (pr_bit_set(pr->pending, page)) return;                   /* already queued */
    run_add(b, page);
}

/* After the count of `page` went 1 -> 0 (now = 0: not read yet). */
static inline void close_last(struct nvh_protect *pr, int mode, uint64_t page,
                              run_builder *b, bool *apply, uint64_t *now)
{
    if (mode == NVH_PROTECT_SYNC) { *apply = true; return; }
    if (!(pr->flags & NVH_PROTECT_NO_LATENCY)) {
        /* Fig. 6 latency: from this call to the page's mprotect */
        if (!*now) *now = pr_ticks();
        atomic_store_explicit(&pr->ptime[page], *now, memory_order_relaxed);
    }
    if (!pr_bit_test(pr->state, page)) return;                   /* never made writable */
    /* used this interval: the pass that finds it keeps it writable one
     * more interval (a hint only; see protect.h "second chance") */
    if (!(pr->flags & NVH_PROTECT_STRICT)) pr_bit_set(pr->ref, page);
    if (pr_bit_set(pr->pending, page)) return;                   /* already queued */
    run_add(b, page);
}

static void open_pages(struct nvh_protect *pr, int mode, uint64_t first, uint64_t end)
{
    run_builder b = {.pr = pr, .kind = PR_KIND_UNPROTECT};
    bool apply = false;
    for (uint64_t page = first; page < end; page++)
        if (atomic_fetch_add(&pr->count[page], 1) == 0) open_first(pr, mode, page, &b, &apply);
    run_flush(&b);
    if (apply) apply_now(pr, first, end - first, PR_KIND_UNPROTECT);
}

static uint64_t close_pages(struct nvh_protect *pr, int mode, uint64_t first, uint64_t end)
{
    run_builder b = {.pr = pr, .kind = PR_KIND_PROTECT};
    bool apply = false;
    uint64_t unbalanced = 0, now = 0;
    for (uint64_t page = first; page < end; page++) {
        uint32_t c = atomic_load(&pr->count[page]);
        do {
            if (c == 0) break;
        } while (!atomic_compare_exchange_weak(&pr->count[page], &c, c - 1));
        if (c == 0) { unbalanced++; continue; }
        if (c == 1) close_last(pr, mode, page, &b, &apply, &now);
    }
    run_flush(&b);
    if (apply) apply_now(pr, first, end - first, PR_KIND_PROTECT);
    if (unbalanced) pr_stat(pr, ST_UNBALANCED, unbalanced);
    return unbalanced;
}

/* --------------------------------------------------------------------------
 * The fast path: a window inside one page (almost every library window: a
 * header, a node, a small record), protection on. No range resolution, no
 * error formatting, no run builder unless there is something to queue: for
 * a page already open (nested) or already writable and hot, the whole call
 * is the count update and a load or three of the page's bits.
 * Returns false (nothing done) for what the general path must handle: off,
 * a range outside the pool or over more than one page.
 * -------------------------------------------------------------------------- */
static inline bool one_page(nvh_pool *pool, struct nvh_protect *pr, const void *p, size_t len,
                            int *mode, uint64_t *page)
{
    uint64_t off = (uint64_t)((uintptr_t)p - (uintptr_t)pr->base);
    uint64_t size = atomic_load_explicit(&pool->ctx.size, memory_order_acquire);
    if (len == 0 || off >= size || len > size - off) return false;
    if ((off >> PR_PAGE_SHIFT) != ((off + len - 1) >> PR_PAGE_SHIFT)) return false;
    *mode = atomic_load_explicit(&pr->mode, memory_order_relaxed);
    if (*mode == NVH_PROTECT_OFF) return false;
    *page = off >> PR_PAGE_SHIFT;
    return true;
}

/* --------------------------------------------------------------------------
 * Per-thread counts (async mode, one-page windows)
 * --------------------------------------------------------------------------
 * A count update on the shared array is a LOCKed read-modify-write, and on
 * AMD Zen a LOCKed instruction waits until every earlier CLWB has reached
 * memory and keeps later loads from overlapping its cache miss: a window
 * opened or closed between the caller's flushes stalls for the write-backs
 * the caller deliberately left in flight (persist groups fence once per
 * batch). On the 1 M x 256 B B+ tree (~5 windows per insert) that cost more
 * CPU than the system calls and faults that remain (docs/BENCHMARKS.md).
 *
 * So in async mode each thread keeps counts of its own: a private array of
 * signed 32-bit counts (one per page of the reserved range, MAP_NORESERVE,
 * touched on use) that only it writes, with plain stores. A page's count is
 * the shared count plus every thread's (pr_page_wanted); a thread closing a
 * window another thread opened just goes negative. What the skips in the
 * producer rely on (the seq_cst pairs in protect.h) needs a StoreLoad fence
 * between the producer's count store and its bit loads; the producer no
 * longer has one, so the appliers supply it: pr_tc_barrier (membarrier(2),
 * MEMBARRIER_CMD_PRIVATE_EXPEDITED: every running thread of the process
 * executes a full barrier) between clearing pending bits / storing state
 * bits and loading counts. And since a thread no longer knows whether its
 * close was the page's last, every close does what the last one did; a
 * close on a page whose state bit is 0 queues it too (the handler may have
 * made it writable meanwhile and, without a barrier, not seen this close).
 *
 * The fault handler reads counts without a barrier: a window it must see is
 * the faulting thread's own (its own stores) or one whose opening happened
 * before the store (the application's synchronisation). What it can miss is
 * a concurrent close, and every close leaves the page queued: the next pass
 * protects it.
 *
 * Bindings: a thread remembers (pool, array) for up to PR_TBINDS pools in a
 * small heap block behind nvh_protect_tls_.bind (static TLS stays small);
 * a pool has PR_TSLOTS slots. No slot, no block, or no membarrier: the
 * thread uses the shared counts, as NVH_PROTECT_SHARED_COUNTS does. At
 * thread exit its slot is freed with its counts in it (the next thread to
 * claim the slot carries on from them: only sums matter); mode changes fold
 * every thread's counts into the shared ones (set_mode does not race with
 * window calls); turning protection off zeroes them. */
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct pr_tbind {
    struct {
        struct nvh_protect *pr;
        uint64_t uid;
        _Atomic int32_t *arr;            /* NULL: this pool has no slot for us */
        unsigned slot;
    } e[PR_TBINDS];
} pr_tbind;

static pthread_mutex_t tc_lock = PTHREAD_MUTEX_INITIALIZER;
#define TC_LIVE 256u
static struct { struct nvh_protect *pr; uint64_t uid; } tc_live[TC_LIVE];   /* tc_lock */
static uint64_t tc_next_uid = 1;                                            /* tc_lock */
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static bool tc_key_ok;
static _Atomic int tc_mb = 0;            /* membarrier: 0 unknown, 1 ok, -1 not available */

static bool tc_live_has(struct nvh_protect *pr, uint64_t uid)          /* tc_lock */
{
    for (unsigned i = 0; i < TC_LIVE; i++)
        if (tc_live[i].pr == pr && tc_live[i].uid == uid) return true;
    return false;
}

void pr_tc_init(struct nvh_protect *pr)
{
    pthread_mutex_lock(&tc_lock);
    pr->uid = 0;                          /* 0: no per-thread counts          */
    for (unsigned i = 0; i < TC_LIVE; i++)
        if (!tc_live[i].pr) {
            tc_live[i].pr = pr;
            tc_live[i].uid = pr->uid = tc_next_uid++;
            break;
        }
    pthread_mutex_unlock(&tc_lock);
}

void pr_tc_barrier(struct nvh_protect *pr)
{
    if (atomic_load_explicit(&pr->tslots, memory_order_acquire) == 0) return;
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
    /* a fork()ed child inherits our "registered" but not the registration
     * (it is per address space): register again and retry */
    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
        atomic_thread_fence(memory_order_seq_cst);    /* the child's only thread */
}

/* Move every thread's counts into the shared ones, page by page (the sum
 * of a page's thread counts is >= 0 when windows balance, even though one
 * thread's may be negative), the addition before the zeroing (a moment of
 * over-counting is harmless). zero_only: just forget them. */
void pr_tc_fold_all(struct nvh_protect *pr, bool zero_only)
{
    pthread_mutex_lock(&tc_lock);
    unsigned slots = atomic_load(&pr->tslots);
    size_t bytes = (size_t)pr->max_pages * sizeof(int32_t);
    _Atomic int32_t *t[PR_TSLOTS];
    unsigned n = 0;
    for (unsigned i = 0; i < slots; i++)
        if ((t[n] = atomic_load(&pr->tcount[i])) != NULL) n++;
    if (zero_only) {
        for (unsigned i = 0; i < n; i++) madvise((void *)t[i], bytes, MADV_DONTNEED);
    } else if (n) {
        uint64_t pages = pr_mapped_pages(pr);
        for (uint64_t p = 0; p < pages; p++) {
            int64_t sum = 0;
            for (unsigned i = 0; i < n; i++) sum += atomic_load_explicit(&t[i][p], memory_order_relaxed);
            if (sum > 0) atomic_fetch_add(&pr->count[p], (uint32_t)sum);
            if (sum < 0) {                /* unbalanced closes: never below 0 */
                uint32_t c = atomic_load(&pr->count[p]), d;
                do {
                    d = (int64_t)c + sum < 0 ? c : (uint32_t)-sum;
                } while (!atomic_compare_exchange_weak(&pr->count[p], &c, c - d));
            }
            for (unsigned i = 0; i < n; i++) atomic_store_explicit(&t[i][p], 0, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&tc_lock);
}

void pr_tc_destroy(struct nvh_protect *pr)
{
    pthread_mutex_lock(&tc_lock);
    for (unsigned i = 0; i < TC_LIVE; i++)
        if (tc_live[i].pr == pr) tc_live[i].pr = NULL;
    pthread_mutex_unlock(&tc_lock);
    size_t bytes = (size_t)pr->max_pages * sizeof(int32_t);
    for (unsigned i = 0; i < PR_TSLOTS; i++) {
        _Atomic int32_t *t = atomic_load(&pr->tcount[i]);
        if (t) munmap((void *)t, bytes);
        atomic_store(&pr->tcount[i], NULL);
    }
    atomic_store(&pr->tslots, 0);
}

/* Thread exit: free the slots. The counts stay where they are (a page's
 * count is a sum; which array holds a part of it does not matter): windows
 * the thread left open stay open, and the next thread to claim the slot
 * carries on from its values. */
static void tc_exit(void *arg)
{
    pr_tbind *b = arg;
    if (nvh_protect_tls_.bind == b) nvh_protect_tls_.bind = NULL;
    pthread_mutex_lock(&tc_lock);
    for (unsigned i = 0; i < PR_TBINDS; i++) {
        if (!b->e[i].pr || !b->e[i].arr || !tc_live_has(b->e[i].pr, b->e[i].uid)) continue;
        atomic_store(&b->e[i].pr->towner[b->e[i].slot], 0);
    }
    pthread_mutex_unlock(&tc_lock);
    free(b);
}
static void tc_key_init(void) { tc_key_ok = pthread_key_create(&tc_key, tc_exit) == 0; }

__attribute__((destructor)) static void tc_key_fini(void)
{
    if (tc_key_ok) {
        tc_key_ok = false;
        pthread_key_delete(tc_key);
    }
}

static bool tc_membarrier_ok(void)
{
    int v = atomic_load(&tc_mb);
    if (v) return v > 0;
    long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    bool ok = q > 0 && (q & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
              syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    atomic_store(&tc_mb, ok ? 1 : -1);
    return ok;
}

/* First window of this thread on pr (in this binding): find or make the
 * binding, claim a slot. NULL: use the shared counts. */
static __attribute__((noinline)) _Atomic int32_t *tc_bind(struct nvh_protect *pr)
{
    if (pr->uid == 0 || !tc_membarrier_ok()) return NULL;
    pthread_once(&tc_once, tc_key_init);
    if (!tc_key_ok) return NULL;
    pr_tbind *b = nvh_protect_tls_.bind;
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(tc_key, b) != 0) { free(b); return NULL; }
        nvh_protect_tls_.bind = b;
    }
    pthread_mutex_lock(&tc_lock);
    int free_e = -1;
    for (unsigned i = 0; i < PR_TBINDS; i++)
        if (!b->e[i].pr || !tc_live_has(b->e[i].pr, b->e[i].uid)) {
            b->e[i].pr = NULL;            /* a pool since destroyed          */
            if (free_e < 0) free_e = (int)i;
        }
    _Atomic int32_t *arr = NULL;
    if (free_e >= 0) {
        for (unsigned s = 0; s < PR_TSLOTS && !arr; s++) {
            int zero = 0;
            if (!atomic_compare_exchange_strong(&pr->towner[s], &zero, 1)) continue;
            arr = atomic_load(&pr->tcount[s]);
            if (!arr) {
                void *m = mmap(NULL, (size_t)pr->max_pages * sizeof(int32_t),
                               PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (m == MAP_FAILED) { atomic_store(&pr->towner[s], 0); break; }
                arr = m;
                atomic_store_explicit(&pr->tcount[s], arr, memory_order_release);
            }
            unsigned used = atomic_load(&pr->tslots);
            if (used < s + 1) atomic_store_explicit(&pr->tslots, s + 1, memory_order_release);
            b->e[free_e].slot = s;
        }
        b->e[free_e].pr = pr;             /* also remembers "no slot" (arr NULL) */
        b->e[free_e].uid = pr->uid;
        b->e[free_e].arr = arr;
    }
    pthread_mutex_unlock(&tc_lock);
    return arr;
}

/* The calling thread's counts for pr, or NULL (shared counts). */
static inline _Atomic int32_t *tc_get(struct nvh_protect *pr)
{
    if (pr->flags & (NVH_PROTECT_SHARED_COUNTS | NVH_PROTECT_STRICT)) return NULL;
    pr_tbind *b = nvh_protect_tls_.bind;
    if (__builtin_expect(b != NULL, 1))
        for (unsigned i = 0; i < PR_TBINDS; i++)
            if (b->e[i].pr == pr && b->e[i].uid == pr->uid) return b->e[i].arr;
    return tc_bind(pr);
}

static inline void tc_add(_Atomic int32_t *t, uint64_t page, int32_t d)
{
    atomic_store_explicit(&t[page], atomic_load_explicit(&t[page], memory_order_relaxed) + d,
                          memory_order_relaxed);
}

static void open_own(struct nvh_protect *pr, _Atomic int32_t *t, uint64_t page)
{
    tc_add(t, page, 1);
    if (pr_bit_test(pr->state, page)) return;        /* writable, or a stale 1: a fault */
    run_builder b = {.pr = pr, .kind = PR_KIND_UNPROTECT};
    bool apply = false;
    open_first(pr, NVH_PROTECT_ASYNC, page, &b, &apply);
    run_flush(&b);
    if (apply) apply_now(pr, page, 1, PR_KIND_UNPROTECT);
}

/* false: unbalanced (no window open on the page at all): nothing changed.
 * With one thread's counts (the usual case) a positive own count is proof
 * enough; with several, a thread may have closed one of ours, so the sum is
 * checked (loads of the other threads' counts for the page). */
static bool close_own(struct nvh_protect *pr, _Atomic int32_t *t, uint64_t page)
{
    if (atomic_load_explicit(&t[page], memory_order_relaxed) > 0) {
        if (atomic_load_explicit(&pr->tslots, memory_order_relaxed) > 1 &&
            !pr_page_wanted(pr, page))
            return false;
        tc_add(t, page, -1);
    } else {
        /* a window this thread did not open through its own count: a shared
         * one (a multi-page window closed page by page) first, else another
         * thread's (we go negative) */
        uint32_t c = atomic_load(&pr->count[page]);
        while (c != 0 && !atomic_compare_exchange_weak(&pr->count[page], &c, c - 1)) {}
        if (c == 0) {
            if (!pr_page_wanted(pr, page)) return false;
            tc_add(t, page, -1);
        }
    }
    run_builder b = {.pr = pr, .kind = PR_KIND_PROTECT};
    bool apply = false;
    uint64_t now = 0;
    if (!pr_bit_test(pr->state, page)) {
        /* read-only (or its unprotect still queued): queue it anyway, see above */
        if (!(pr->flags & NVH_PROTECT_NO_LATENCY))
            atomic_store_explicit(&pr->ptime[page], pr_ticks(), memory_order_relaxed);
        if (!pr_bit_set(pr->pending, page)) run_add(&b, page);
    } else {
        close_last(pr, NVH_PROTECT_ASYNC, page, &b, &apply, &now);
    }
    if (b.n) run_flush(&b);
    return true;
}

static inline bool open_fast(nvh_pool *pool, const void *p, size_t len)
{
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    int mode;
    uint64_t page;
    if (!pr || !one_page(pool, pr, p, len, &mode, &page)) return false;
    if (mode == NVH_PROTECT_ASYNC) {
        _Atomic int32_t *t = tc_get(pr);
        if (t) { open_own(pr, t, page); return true; }
    }
    if (atomic_fetch_add(&pr->count[page], 1) != 0) return true;          /* nested */
    if (mode == NVH_PROTECT_ASYNC && pr_bit_test(pr->state, page)) return true;   /* hot */
    run_builder b = {.pr = pr, .kind = PR_KIND_UNPROTECT};
    bool apply = false;
    open_first(pr, mode, page, &b, &apply);
    run_flush(&b);
    if (apply) apply_now(pr, page, 1, PR_KIND_UNPROTECT);
    return true;
}

/* 1 done, 0 not handled (the general path decides), -1 unbalanced (counted) */
static inline int close_fast(nvh_pool *pool, const void *p, size_t len)
{
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    int mode;
    uint64_t page;
    if (!pr || !one_page(pool, pr, p, len, &mode, &page)) return false;
    if (mode == NVH_PROTECT_ASYNC) {
        _Atomic int32_t *t = tc_get(pr);
        if (t) {
            if (close_own(pr, t, page)) return 1;
            pr_stat(pr, ST_UNBALANCED, 1);
            return -1;
        }
    }
    uint32_t c = atomic_load(&pr->count[page]);
    do {
        if (c == 0) return false;          /* unbalanced: the general path reports it */
    } while (!atomic_compare_exchange_weak(&pr->count[page], &c, c - 1));
    if (c != 1) return true;                                               /* nested */
    run_builder b = {.pr = pr, .kind = PR_KIND_PROTECT};
    bool apply = false;
    uint64_t now = 0;
    close_last(pr, mode, page, &b, &apply, &now);
    if (b.n) run_flush(&b);
    if (apply) apply_now(pr, page, 1, PR_KIND_PROTECT);
    return true;
}

/* --------------------------------------------------------------------------
 * Public calls
 * -------------------------------------------------------------------------- */
static int resolve(nvh_pool *pool, const void *p, size_t len, const char *fn,
                   struct nvh_protect **pr_out, int *mode_out, uint64_t *first, uint64_t *end)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "%s: pool is NULL", fn);
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    *pr_out = NULL;
    if (!pr || len == 0) return NVH_OK;
    int mode = atomic_load_explicit(&pr->mode, memory_order_relaxed);
    if (mode == NVH_PROTECT_OFF) return NVH_OK;
    if (!nvh_contains(pool, p, len))
        return nvh_fail(NVH_E_BADPTR, "%s: [%p, +%zu) is not inside pool %s", fn, p, len,
                        pool->path);
    uint64_t off = (uint64_t)((const char *)p - pool->ctx.base);
    *first = off >> PR_PAGE_SHIFT;
    *end = ((off + len - 1) >> PR_PAGE_SHIFT) + 1;
    *pr_out = pr;
    *mode_out = mode;
    return NVH_OK;
}

int nvh_unprotect(nvh_pool *pool, const void *p, size_t len)
{
    if (pool && open_fast(pool, p, len)) return NVH_OK;
    struct nvh_protect *pr;
    int mode = 0;
    uint64_t first = 0, end = 0;
    int rc = resolve(pool, p, len, "nvh_unprotect", &pr, &mode, &first, &end);
    if (rc != NVH_OK || !pr) return rc;
    open_pages(pr, mode, first, end);
    return NVH_OK;
}

static int unbalanced_error(nvh_pool *pool, const void *p, size_t len, uint64_t pages)
{
    return nvh_fail(NVH_E_INVAL, "nvh_protect: %llu page(s) of [%p, +%zu) in pool %s had no "
                    "open write window (unbalanced nvh_protect)",
                    (unsigned long long)pages, p, len, pool->path);
}

int nvh_protect(nvh_pool *pool, const void *p, size_t len)
{
    int fast = pool ? close_fast(pool, p, len) : 0;
    if (fast > 0) return NVH_OK;
    if (fast < 0) return unbalanced_error(pool, p, len, 1);
    struct nvh_protect *pr;
    int mode = 0;
    uint64_t first = 0, end = 0;
    int rc = resolve(pool, p, len, "nvh_protect", &pr, &mode, &first, &end);
    if (rc != NVH_OK || !pr) return rc;
    uint64_t unbalanced = close_pages(pr, mode, first, end);
    if (unbalanced) return unbalanced_error(pool, p, len, unbalanced);
    return NVH_OK;
}

/* The explicit windows of the other layers: the same counted windows. */
int nvh_protect_open_slow_(nvh_pool *pool, const void *p, size_t len)
{
    if (open_fast(pool, p, len)) return NVH_OK;
    return nvh_unprotect(pool, p, len);
}

int nvh_protect_close_slow_(nvh_pool *pool, const void *p, size_t len)
{
    int fast = close_fast(pool, p, len);
    if (fast > 0) return NVH_OK;
    if (fast < 0) return unbalanced_error(pool, p, len, 1);
    return nvh_protect(pool, p, len);
}

/* --------------------------------------------------------------------------
 * Implicit (thread-local) windows
 * -------------------------------------------------------------------------- */
/* The thread's page list: allocated at its first begin (never in the
 * handler), freed by a thread-exit destructor. */
static pthread_key_t list_key;
static pthread_once_t list_once = PTHREAD_ONCE_INIT;
static bool list_key_ok;

static void list_free(void *p)
{
    /* thread exit: no window of this thread can be open any more */
    if (nvh_protect_tls_.list == p) nvh_protect_tls_.list = NULL;
    free(p);
}
static void list_key_init(void) { list_key_ok = pthread_key_create(&list_key, list_free) == 0; }

/* Unload (dlclose) or exit: a thread exiting after libnvheap.so was
 * unloaded must not call list_free, whose code is gone. Lists of threads
 * still running are left to them (they are not freed: at exit other
 * threads may still be inside a window). */
__attribute__((destructor)) static void list_key_fini(void)
{
    if (list_key_ok) {
        list_key_ok = false;
        pthread_key_delete(list_key);
    }
}

static pr_tls_list *list_get(pr_tls *tls)
{
    if (__builtin_expect(tls->list != NULL, 1)) return tls->list;
    pthread_once(&list_once, list_key_init);
    pr_tls_list *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    if (list_key_ok) pthread_setspecific(list_key, l);
    /* published before any depth > 0 of ours (the handler is this thread) */
    atomic_signal_fence(memory_order_seq_cst);
    tls->list = l;
    return l;
}

void nvh_protect_internal_begin(nvh_pool *pool)
{
    pr_tls *tls = &nvh_protect_tls_;
    pr_tls_list *l = tls->depth == 0 ? list_get(tls) : tls->list;
    if (l) {
        if (tls->depth == 0) { l->npools = 0; l->any_pool = false; }
        bool known = false;
        for (unsigned i = 0; i < l->npools; i++) known |= l->pools[i] == pool;
        if (!known) {
            if (l->npools < PR_TLS_POOLS) l->pools[l->npools++] = pool;
            else l->any_pool = true;
        }
    }
    /* the handler (same thread) must see the pool list before the depth */
    atomic_signal_fence(memory_order_seq_cst);
    tls->depth++;
    atomic_signal_fence(memory_order_seq_cst);
}

static void sweep(struct nvh_protect *pr)
{
    int mode = atomic_load(&pr->mode);
    if (mode == NVH_PROTECT_OFF) return;
    if (mode == NVH_PROTECT_ASYNC) {
        pr_request r = {.first_page = 0, .npages = 0, .kind = PR_KIND_SWEEP, .t_ns = 0};
        push_request(pr, &r);
    } else {
        pthread_mutex_lock(&pr->apply_lock);
        pr_reconcile_range(pr, 0, pr_mapped_pages(pr));
        pthread_mutex_unlock(&pr->apply_lock);
    }
}

void nvh_protect_internal_end(nvh_pool *pool)
{
    pr_tls *tls = &nvh_protect_tls_;
    if (tls->depth == 0) return;               /* unbalanced: ignore */
    if (tls->depth > 1) { tls->depth--; return; }
    /* Leave the window first, so no fault of ours adds to the list while we
     * close what it holds. */
    atomic_signal_fence(memory_order_seq_cst);
    tls->depth = 0;
    atomic_signal_fence(memory_order_seq_cst);
    pr_tls_list *l = tls->list;
    if (tls->lost) {
        /* pages were made writable with no list to remember them: the
         * closing pool is the one we know of */
        tls->lost = false;
        struct nvh_protect *pr = atomic_load(&pool->protect);
        if (pr) sweep(pr);
    }
    if (!l) return;
    for (unsigned i = 0; i < l->n; i++) {
        struct nvh_protect *pr = l->pages[i].pr;
        int mode = atomic_load(&pr->mode);
        if (mode == NVH_PROTECT_OFF) continue;
        uint64_t page = l->pages[i].page;
        close_pages(pr, mode, page, page + 1);
    }
    l->n = 0;
    if (l->overflow) {
        l->overflow = false;
        for (unsigned i = 0; i < l->npools; i++) {
            struct nvh_protect *pr = atomic_load(&l->pools[i]->protect);
            if (pr) sweep(pr);
        }
    }
}
