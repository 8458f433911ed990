/* state.c — a pool's protection state: creation, turning modes on and off,
 * the pool hooks (grow, close), and the counters / latency read-outs.
 *
 * The page arrays (window counts; applied-state, pending, ref and hfault
 * bitmaps; close times) cover the pool's whole reserved range (max_size),
 * mapped MAP_NORESERVE: they are
 * never reallocated, so the signal handler can index them without a lock
 * while the pool grows, and only the pages of them that are used cost
 * memory (a 4-byte count per 4 KiB page: 0.1% of the pool written).
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* --------------------------------------------------------------------------
 * Creation and teardown of the per-pool state
 * -------------------------------------------------------------------------- */
static size_t bitmap_bytes(uint64_t pages)
{
    return (size_t)NVH_ALIGN_UP((pages + 63) / 64 * 8, (uint64_t)NVH_PAGE);
}

static struct nvh_protect *pr_create(nvh_pool *pool, unsigned queue_slots)
{
    struct nvh_protect *pr = aligned_alloc(64, NVH_ALIGN_UP(sizeof *pr, 64));
    if (!pr) { nvh_fail(NVH_E_NOMEM, "out of memory protecting %s", pool->path); return NULL; }
    memset(pr, 0, sizeof *pr);
    pr->pool = pool;
    pr->base = pool->ctx.base;
    pr->registry_slot = -1;
    /* as bt_prefault (src/ds/btree.c): only where the mapping is the media
     * (not the simulator's domain) and dirtying a page costs no write-back
     * (not msync), and not when the pool was mapped populated already */
    nvh_domain d = (nvh_domain)pool->ctx.domain;   /* common/internal.h: no call up into pool */
    pr->populate = !(pool->flags & NVH_POOL_PREFAULT) &&
                   (d == NVH_DOMAIN_PMEM || d == NVH_DOMAIN_PROCESS || d == NVH_DOMAIN_EADR);
    pr->widen_races = getenv("NVHEAP_TEST_WIDEN_RACES") != NULL;
    pr->max_pages = (pool->max_size + NVH_PAGE - 1) / NVH_PAGE;
    atomic_init(&pr->mode, NVH_PROTECT_OFF);
    atomic_init(&pr->interval_ns, NVH_PROTECT_INTERVAL_DEFAULT);
    atomic_init(&pr->epoch, 1);

    size_t count_bytes = (size_t)NVH_ALIGN_UP(pr->max_pages * 4, (uint64_t)NVH_PAGE);
    size_t bits = bitmap_bytes(pr->max_pages);
    size_t times = (size_t)NVH_ALIGN_UP(pr->max_pages * 8, (uint64_t)NVH_PAGE);
    pr->arrays_bytes = count_bytes + 4 * bits + times;
    char *arrays = mmap(NULL, pr->arrays_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arrays == MAP_FAILED) {
        nvh_fail_errno(NVH_E_NOMEM, errno, "cannot reserve %zu bytes of page state for %s",
                       pr->arrays_bytes, pool->path);
        free(pr);
        return NULL;
    }
    pr->count = (_Atomic uint32_t *)(void *)arrays;
    pr->state = (_Atomic uint64_t *)(void *)(arrays + count_bytes);
    pr->pending = (_Atomic uint64_t *)(void *)(arrays + count_bytes + bits);
    pr->ref = (_Atomic uint64_t *)(void *)(arrays + count_bytes + 2 * bits);
    pr->hfault = (_Atomic uint64_t *)(void *)(arrays + count_bytes + 3 * bits);
    pr->ptime = (_Atomic uint64_t *)(void *)(arrays + count_bytes + 4 * bits);

    if (pr_queue_init(&pr->queue, queue_slots ? queue_slots : PR_QUEUE_DEFAULT) != NVH_OK) {
        munmap(arrays, pr->arrays_bytes);
        free(pr);
        return NULL;
    }
    pr->batch_cap = (size_t)pr->queue.mask + 1;
    pr->batch = malloc(pr->batch_cap * sizeof *pr->batch);
    if (!pr->batch) {
        nvh_fail(NVH_E_NOMEM, "out of memory protecting %s", pool->path);
        pr_queue_fini(&pr->queue);
        munmap(arrays, pr->arrays_bytes);
        free(pr);
        return NULL;
    }
    pthread_mutex_init(&pr->apply_lock, NULL);
    pthread_mutex_init(&pr->wake_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pr->wake, &ca);
    pthread_condattr_destroy(&ca);
    return pr;
}

static void pr_destroy(struct nvh_protect *pr)
{
    pthread_cond_destroy(&pr->wake);
    pthread_mutex_destroy(&pr->wake_lock);
    pthread_mutex_destroy(&pr->apply_lock);
    free(pr->batch);
    free(pr->carry);
    pr_queue_fini(&pr->queue);
    munmap((void *)pr->count, pr->arrays_bytes);
    free(pr);
}

/* --------------------------------------------------------------------------
 * On / off
 * -------------------------------------------------------------------------- */
static int enable(struct nvh_protect *pr, int mode)
{
    if (pr_registry_add(pr) != NVH_OK) return nvh_errcode();
    uint64_t pages = pr_mapped_pages(pr);
    atomic_store(&pr->mode, mode);
    /* everything read-only in one call; the arrays are zero (no window,
     * read-only, nothing queued) since creation or the last disable */
    pthread_mutex_lock(&pr->apply_lock);
    int rc = pr_mprotect(pr, 0, pages, false);
    pthread_mutex_unlock(&pr->apply_lock);
    if (rc != 0) {
        int e = errno;
        atomic_store(&pr->mode, NVH_PROTECT_OFF);
        pr_registry_remove(pr);
        return nvh_fail_errno(NVH_E_IO, e, "cannot write-protect pool %s", pr->pool->path);
    }
    if (mode == NVH_PROTECT_ASYNC && pr_service_start(pr) != NVH_OK) {
        int code = nvh_errcode();
        pr_mprotect(pr, 0, pages, true);
        atomic_store(&pr->mode, NVH_PROTECT_OFF);
        pr_registry_remove(pr);
        return code;
    }
    return NVH_OK;
}

/* Stop the service, forget the queue, make every page writable, leave the
 * registry, and zero the arrays (giving their memory back). While this runs
 * a fault on the pool is legal (disabling). */
static void disable(struct nvh_protect *pr)
{
    if (atomic_load(&pr->mode) == NVH_PROTECT_OFF) return;
    atomic_store(&pr->disabling, 1);
    /* the caches' units are forgotten with the counts */
    atomic_store(&pr->tc_id, 0);
    pr_tc_steal_all(pr, false, true);
    pr_service_stop(pr);
    pthread_mutex_lock(&pr->apply_lock);
    while (pr_queue_pop(&pr->queue, pr->batch, pr->batch_cap) != 0) {}
    pr->carry_n = 0;
    pr_mprotect(pr, 0, pr_mapped_pages(pr), true);
    atomic_store(&pr->mode, NVH_PROTECT_OFF);
    pthread_mutex_unlock(&pr->apply_lock);
    pr_registry_remove(pr);                   /* waits out running handlers */
    madvise((void *)pr->count, pr->arrays_bytes, MADV_DONTNEED);
    atomic_fetch_add(&pr->epoch, 1);          /* held windows are gone now */
    atomic_store(&pr->disabling, 0);
}

uint64_t nvh_protect_epoch_(nvh_pool *pool)
{
    struct nvh_protect *pr = atomic_load_explicit(&pool->protect, memory_order_acquire);
    if (!pr || atomic_load_explicit(&pr->mode, memory_order_relaxed) == NVH_PROTECT_OFF) return 0;
    return atomic_load(&pr->epoch);
}

/* --------------------------------------------------------------------------
 * Configuration calls
 * -------------------------------------------------------------------------- */
int nvh_protect_configure(nvh_pool *pool, const nvh_protect_options *options)
{
    if (!pool || !options) return nvh_fail(NVH_E_INVAL, "nvh_protect_configure: NULL argument");
    nvh_protect_options o = *options;
    if (o.mode != NVH_PROTECT_OFF && o.mode != NVH_PROTECT_SYNC && o.mode != NVH_PROTECT_ASYNC)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: unknown protection mode %d", (int)o.mode);
    if (o.interval_ns == 0) o.interval_ns = NVH_PROTECT_INTERVAL_DEFAULT;
    if (o.interval_ns < NVH_PROTECT_INTERVAL_MIN || o.interval_ns > NVH_PROTECT_INTERVAL_MAX)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: interval %llu ns is outside [%llu, %llu]",
                        (unsigned long long)o.interval_ns,
                        (unsigned long long)NVH_PROTECT_INTERVAL_MIN,
                        (unsigned long long)NVH_PROTECT_INTERVAL_MAX);
    if (o.queue_slots > PR_QUEUE_MAX)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: queue of %u slots exceeds the maximum %u",
                        o.queue_slots, PR_QUEUE_MAX);
    if (o.flags & ~(NVH_PROTECT_EAGER_UNPROTECT | NVH_PROTECT_NO_LATENCY | NVH_PROTECT_STRICT |
                    NVH_PROTECT_NO_CACHE))
        return nvh_fail(NVH_E_INVAL, "nvh_protect: unknown option bits 0x%x", o.flags);

    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (o.mode == NVH_PROTECT_OFF) {
        if (pr) disable(pr);
        return NVH_OK;
    }
    if (pool->readonly)
        return nvh_fail(NVH_E_READONLY, "cannot protect pool %s: it is open read-only (its "
                        "mapping is read-only already)", pool->path);
    int rc = pr_handler_install();
    if (rc != NVH_OK) return rc;
    nvh_ticks_calibrate();
    if (!pr) {
        pr = pr_create(pool, o.queue_slots);
        if (!pr) return nvh_errcode();
        atomic_store(&pool->protect, pr);
    }
    atomic_store(&pr->interval_ns, o.interval_ns);
    pr->flags = o.flags;
    int old = atomic_load(&pr->mode);
    if (old == NVH_PROTECT_OFF) {
        rc = enable(pr, (int)o.mode);
        if (rc == NVH_OK) pr_tc_configure(pr);
        return rc;
    }
    if (old == NVH_PROTECT_ASYNC && o.mode == NVH_PROTECT_SYNC) {
        atomic_store(&pr->tc_id, 0);
        pr_tc_steal_all(pr, true, true);          /* queued, then drained below */
        pr_service_stop(pr);
        pthread_mutex_lock(&pr->apply_lock);
        pr_drain(pr, true);
        atomic_store(&pr->mode, NVH_PROTECT_SYNC);
        pthread_mutex_unlock(&pr->apply_lock);
    } else if (old == NVH_PROTECT_SYNC && o.mode == NVH_PROTECT_ASYNC) {
        atomic_store(&pr->mode, NVH_PROTECT_ASYNC);
        if ((rc = pr_service_start(pr)) != NVH_OK) {
            atomic_store(&pr->mode, NVH_PROTECT_SYNC);
            return rc;
        }
    } else if (o.mode == NVH_PROTECT_ASYNC) {
        pr_service_kick(pr);                      /* new interval now */
    }
    pr_tc_configure(pr);                          /* flags or interval may have changed */
    return NVH_OK;
}

int nvh_protect_set_mode(nvh_pool *pool, nvh_protect_mode mode, uint64_t interval_ns)
{
    nvh_protect_options o = {.mode = mode, .interval_ns = interval_ns};
    return nvh_protect_configure(pool, &o);
}

nvh_protect_mode nvh_protect_get_mode(const nvh_pool *pool)
{
    struct nvh_protect *pr = pool ? atomic_load(&((nvh_pool *)pool)->protect) : NULL;
    return pr ? (nvh_protect_mode)atomic_load(&pr->mode) : NVH_PROTECT_OFF;
}

int nvh_protect_set_interval(nvh_pool *pool, uint64_t interval_ns)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_protect_set_interval: pool is NULL");
    if (interval_ns < NVH_PROTECT_INTERVAL_MIN || interval_ns > NVH_PROTECT_INTERVAL_MAX)
        return nvh_fail(NVH_E_INVAL, "nvh_protect: interval %llu ns is outside [%llu, %llu]",
                        (unsigned long long)interval_ns,
                        (unsigned long long)NVH_PROTECT_INTERVAL_MIN,
                        (unsigned long long)NVH_PROTECT_INTERVAL_MAX);
    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (!pr) return nvh_fail(NVH_E_INVAL, "pool %s is not protected", pool->path);
    atomic_store(&pr->interval_ns, interval_ns);
    if (atomic_load(&pr->mode) == NVH_PROTECT_ASYNC) pr_service_kick(pr);
    pr_tc_configure(pr);
    return NVH_OK;
}

int nvh_protect_sync(nvh_pool *pool)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_protect_sync: pool is NULL");
    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (!pr || atomic_load(&pr->mode) != NVH_PROTECT_ASYNC) return NVH_OK;
    pr_tc_steal_all(pr, true, false);             /* every cached unit back */
    pthread_mutex_lock(&pr->apply_lock);
    pr_drain(pr, true);
    pthread_mutex_unlock(&pr->apply_lock);
    pr_stat(pr, ST_SYNC_APPLIES, 1);
    return NVH_OK;
}

int nvh_protect_set_stray_handler(nvh_pool *pool, nvh_stray_handler fn, void *arg)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_protect_set_stray_handler: pool is NULL");
    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (!pr) {
        /* create the (off) state so the handler is kept for a later set_mode */
        if (pool->readonly)
            return nvh_fail(NVH_E_READONLY, "pool %s is open read-only", pool->path);
        pr = pr_create(pool, 0);
        if (!pr) return nvh_errcode();
        atomic_store(&pool->protect, pr);
    }
    atomic_store(&pr->stray_arg, arg);
    atomic_store(&pr->stray_fn, fn);
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Pool hooks
 * -------------------------------------------------------------------------- */
/* After the new tail is mapped (writable) and the size published: protect it.
 * Its counts and bits are zero (never used). */
void nvh_protect_grow_(nvh_pool *pool, uint64_t old_size, uint64_t new_size)
{
    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (!pr || atomic_load(&pr->mode) == NVH_PROTECT_OFF || new_size <= old_size) return;
    pthread_mutex_lock(&pr->apply_lock);
    pr_mprotect(pr, old_size >> PR_PAGE_SHIFT, (new_size - old_size) >> PR_PAGE_SHIFT, false);
    pthread_mutex_unlock(&pr->apply_lock);
}

/* NVHEAP_PROTECT: whole test suites (or an application) with protection on
 * and no code change. Parsed at every open so a test can set it per pool. */
int nvh_protect_env_apply_(nvh_pool *pool)
{
    const char *env = getenv("NVHEAP_PROTECT");
    if (!env || !*env) return NVH_OK;
    nvh_protect_mode mode;
    uint64_t interval = 0;
    const char *rest = NULL;
    if (strcmp(env, "off") == 0) return NVH_OK;
    if (strcmp(env, "sync") == 0) {
        mode = NVH_PROTECT_SYNC;
    } else if (strncmp(env, "async", 5) == 0 && (env[5] == '\0' || env[5] == ':')) {
        mode = NVH_PROTECT_ASYNC;
        if (env[5] == ':') {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(env + 6, &end, 10);
            if (errno || end == env + 6 || *end) rest = env;
            interval = (uint64_t)v;
        }
    } else {
        rest = env;
    }
    if (rest)
        return nvh_fail(NVH_E_INVAL, "NVHEAP_PROTECT=%s: expected off, sync, async or "
                        "async:INTERVAL_NS (opening %s)", env, pool->path);
    /* a read-only mapping is protected already; the crash simulator keeps
     * its own working copy and media image and is not protected */
    if (pool->readonly || pool->ctx.domain == NVH_DOMAIN_SIM) return NVH_OK;
    return nvh_protect_set_mode(pool, mode, interval);
}

/* Close (and failed opens): turn protection off and free the state. */
void nvh_protect_detach_(nvh_pool *pool)
{
    struct nvh_protect *pr = atomic_load(&pool->protect);
    if (!pr) return;
    disable(pr);
    atomic_store(&pool->protect, NULL);
    pr_destroy(pr);
}

/* --------------------------------------------------------------------------
 * Counters and latency
 * -------------------------------------------------------------------------- */
int nvh_protect_stats_get(const nvh_pool *pool, nvh_protect_stats *s)
{
    if (!pool || !s) return nvh_fail(NVH_E_INVAL, "nvh_protect_stats_get: NULL argument");
    memset(s, 0, sizeof *s);
    struct nvh_protect *pr = atomic_load(&((nvh_pool *)pool)->protect);
    if (!pr) return NVH_OK;
#define GET(field, idx) s->field = atomic_load_explicit(&pr->stats[idx], memory_order_relaxed)
    GET(mprotect_calls, ST_MPROTECTS);
    GET(pages_changed, ST_PAGES_CHANGED);
    GET(requests, ST_REQUESTS);
    GET(batches, ST_BATCHES);
    GET(cancelled, ST_CANCELLED);
    GET(faults_resolved, ST_FAULTS_RESOLVED);
    GET(internal_faults, ST_INTERNAL_FAULTS);
    GET(strays, ST_STRAYS);
    GET(queue_full, ST_QUEUE_FULL);
    GET(unbalanced, ST_UNBALANCED);
    GET(sync_applies, ST_SYNC_APPLIES);
    GET(deferred, ST_DEFERRED);
    GET(cache_misses, ST_TC_MISSES);
#undef GET
    return NVH_OK;
}

void nvh_protect_stats_reset(nvh_pool *pool)
{
    struct nvh_protect *pr = pool ? atomic_load(&pool->protect) : NULL;
    if (!pr) return;
    for (unsigned i = 0; i < ST_COUNT_; i++) atomic_store(&pr->stats[i], 0);
    for (unsigned k = 0; k < 2; k++) {
        pr_hist *h = &pr->lat[k];
        for (unsigned i = 0; i < PR_LAT_BUCKETS; i++) atomic_store(&h->bucket[i], 0);
        atomic_store(&h->count, 0);
        atomic_store(&h->sum_ns, 0);
        atomic_store(&h->max_ns, 0);
    }
}

static pr_hist *hist_of(const nvh_pool *pool, int kind)
{
    struct nvh_protect *pr = pool ? atomic_load(&((nvh_pool *)pool)->protect) : NULL;
    if (!pr || kind < 0 || kind > 1) return NULL;
    return &pr->lat[kind];
}

int nvh_protect_latency_get(const nvh_pool *pool, int kind, nvh_protect_latency *out)
{
    if (!pool || !out || kind < 0 || kind > 1)
        return nvh_fail(NVH_E_INVAL, "nvh_protect_latency_get: bad argument");
    memset(out, 0, sizeof *out);
    pr_hist *h = hist_of(pool, kind);
    if (!h) return NVH_OK;
    uint64_t counts[PR_LAT_BUCKETS], total = 0;
    for (unsigned i = 0; i < PR_LAT_BUCKETS; i++) total += counts[i] = atomic_load(&h->bucket[i]);
    if (total == 0) return NVH_OK;
    out->count = total;
    out->mean_ns = (double)atomic_load(&h->sum_ns) / (double)atomic_load(&h->count);
    out->max_ns = atomic_load(&h->max_ns);
    const double q[4] = {0.50, 0.90, 0.99, 0.999};
    uint64_t *dst[4] = {&out->p50_ns, &out->p90_ns, &out->p99_ns, &out->p999_ns};
    for (unsigned k = 0; k < 4; k++) {
        uint64_t rank = (uint64_t)(q[k] * (double)total), seen = 0;
        if (rank >= total) rank = total - 1;
        for (unsigned i = 0; i < PR_LAT_BUCKETS; i++) {
            seen += counts[i];
            if (seen > rank) {
                uint64_t up = pr_hist_upper(i);
                *dst[k] = up < out->max_ns ? up : out->max_ns;
                break;
            }
        }
    }
    return NVH_OK;
}

unsigned nvh_protect_latency_buckets(const nvh_pool *pool, int kind, uint64_t *upper_ns,
                                     uint64_t *counts, unsigned max)
{
    pr_hist *h = hist_of(pool, kind);
    if (!h || !upper_ns || !counts) return 0;
    unsigned n = 0;
    for (unsigned i = 0; i < PR_LAT_BUCKETS && n < max; i++) {
        uint64_t c = atomic_load(&h->bucket[i]);
        if (!c) continue;
        upper_ns[n] = pr_hist_upper(i);
        counts[n] = c;
        n++;
    }
    return n;
}
