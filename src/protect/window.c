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

/* A thread's cache gives back n units of `page` (cache.c). As n closes.
 * ref: set the page's ref bit (second chance) — for a unit evicted by
 * another page while in use; not for the units every owner gives back at
 * each pass (the cache kept the page writable while it was used, so the
 * next pass may protect it unless it is used again before). */
void pr_release_units_(struct nvh_protect *pr, uint64_t page, uint32_t n, uint64_t tick, bool ref)
{
    uint32_t c = atomic_load(&pr->count[page]), take;
    do {
        if (c == 0) { pr_stat(pr, ST_UNBALANCED, n); return; }
        take = c < n ? c : n;
    } while (!atomic_compare_exchange_weak(&pr->count[page], &c, c - take));
    if (take < n) pr_stat(pr, ST_UNBALANCED, n - take);
    if (c != take) return;                                       /* still open */
    int mode = atomic_load_explicit(&pr->mode, memory_order_relaxed);
    if (mode == NVH_PROTECT_OFF) return;
    if (mode == NVH_PROTECT_SYNC) { apply_now(pr, page, 1, PR_KIND_PROTECT); return; }
    if (!(pr->flags & NVH_PROTECT_NO_LATENCY))
        atomic_store_explicit(&pr->ptime[page], tick ? tick : pr_ticks(), memory_order_relaxed);
    if (!pr_bit_test(pr->state, page)) return;                   /* never made writable */
    if (ref && !(pr->flags & NVH_PROTECT_STRICT)) pr_bit_set(pr->ref, page);
    if (pr_bit_set(pr->pending, page)) return;                   /* already queued */
    run_builder b = {.pr = pr, .kind = PR_KIND_PROTECT, .t_ns = tick};
    run_add(&b, page);
    run_flush(&b);
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

static inline bool open_fast(nvh_pool *pool, const void *p, size_t len)
{
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    int mode;
    uint64_t page;
    if (!pr || !one_page(pool, pr, p, len, &mode, &page)) return false;
    /* async: a unit this thread's cache holds (no shared update at all), or
     * a batch of units the cache took in one shared add */
    int tc = mode == NVH_PROTECT_ASYNC ? pr_tc_open(pr, page) : PR_TC_NOT_CACHED;
    if (tc == PR_TC_DONE) return true;
    if (tc == PR_TC_NOT_CACHED && atomic_fetch_add(&pr->count[page], 1) != 0)
        return true;                                                      /* nested */
    if (mode == NVH_PROTECT_ASYNC && pr_bit_test(pr->state, page)) return true;   /* hot */
    run_builder b = {.pr = pr, .kind = PR_KIND_UNPROTECT};
    bool apply = false;
    open_first(pr, mode, page, &b, &apply);
    run_flush(&b);
    if (apply) apply_now(pr, page, 1, PR_KIND_UNPROTECT);
    return true;
}

/* 1: done; 0: the general path must handle it; -1: unbalanced (counted). */
static inline int close_fast(nvh_pool *pool, const void *p, size_t len)
{
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    int mode;
    uint64_t page;
    if (!pr || !one_page(pool, pr, p, len, &mode, &page)) return false;
    /* keep the unit in this thread's cache: the page stays in use */
    if (mode == NVH_PROTECT_ASYNC) {
        int tc = pr_tc_close(pr, page);
        if (tc == PR_TC_DONE) return 1;
        if (tc == PR_TC_UNBALANCED) { pr_stat(pr, ST_UNBALANCED, 1); return -1; }
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

/* nvh_unprotect after the cache's hit path: the single-page fast path, then
 * the general one (shared with nvh_protect_open_slow_, which has tried the
 * hit path itself). */
static int unprotect_after_hit(nvh_pool *pool, const void *p, size_t len)
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

int nvh_unprotect(nvh_pool *pool, const void *p, size_t len)
{
    /* the window cache's hit path first (protect.h), as the layers' calls */
    if (pool && atomic_load_explicit(&pool->protect, memory_order_acquire) &&
        pr_tc_open_hit(pool, p, len))
        return NVH_OK;
    return unprotect_after_hit(pool, p, len);
}

/* nvh_protect after the cache's hit path: the single-page fast path, then
 * the general one. Shared with nvh_protect_close_slow_, which has tried the
 * hit path itself (trying close_fast there and again here counted an
 * unbalanced close twice). */
static int protect_after_hit(nvh_pool *pool, const void *p, size_t len)
{
    int fast = pool ? close_fast(pool, p, len) : 0;
    if (fast > 0) return NVH_OK;
    if (fast < 0)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: [%p, +%zu) in pool %s had no open write "
                        "window (unbalanced nvh_protect)", p, len, pool->path);
    struct nvh_protect *pr;
    int mode = 0;
    uint64_t first = 0, end = 0;
    int rc = resolve(pool, p, len, "nvh_protect", &pr, &mode, &first, &end);
    if (rc != NVH_OK || !pr) return rc;
    uint64_t unbalanced = close_pages(pr, mode, first, end);
    if (unbalanced)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: %llu page(s) of [%p, +%zu) in pool %s had no "
                        "open write window (unbalanced nvh_protect)",
                        (unsigned long long)unbalanced, p, len, pool->path);
    return NVH_OK;
}

int nvh_protect(nvh_pool *pool, const void *p, size_t len)
{
    if (pool && atomic_load_explicit(&pool->protect, memory_order_acquire) &&
        pr_tc_close_hit(pool, p, len))
        return NVH_OK;
    return protect_after_hit(pool, p, len);
}

/* The explicit windows of the other layers: the same counted windows. */
int nvh_protect_open_slow_(nvh_pool *pool, const void *p, size_t len)
{
    return unprotect_after_hit(pool, p, len);
}

int nvh_protect_close_slow_(nvh_pool *pool, const void *p, size_t len)
{
    return protect_after_hit(pool, p, len);
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
