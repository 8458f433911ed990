/* part.c — the capacity part of a pool (nvh_cap_*, include/nvheap.h §14):
 * a volatile heap carved out of one reservation of the persistent allocator,
 * next to the pool's persistent objects (seed 003's dual use).
 *
 * The region is reserved (nvh_reserve) and never activated: the persistent
 * allocator knows of it only in DRAM, so it costs no log record, no flush and
 * no fence, and after a crash (or any close) the space is free again on the
 * media — the capacity part is empty at the next open by construction, with
 * no marking or recovery code. The capacity allocator (heap.c, span.c) runs
 * on the region with all its metadata in DRAM. A pool-close hook detaches the
 * part if the application did not. */
#include "cap.h"

#include "common/internal.h"
#include "pool/pool.h"          /* nvh_pool_hook */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct nvh_cap_part {
    struct cap_inst inst;
    nvh_pool *pool;
    void *region;
    nvh_pool_hook hook;
};

static void part_release(struct nvh_cap_part *c)
{
    nvh_cap_destroy_(&c->inst);
    nvh_cancel(c->pool, c->region);
    free(c);
}

static int part_hook_close(nvh_pool_hook *hook, int check_only)
{
    if (check_only)
        return NVH_OK;
    part_release((struct nvh_cap_part *)(void *)((char *)hook - offsetof(struct nvh_cap_part, hook)));
    return NVH_OK;
}

nvh_cap *nvh_cap_attach(nvh_pool *pool, uint64_t bytes)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "nvh_cap_attach: pool is NULL");
        return NULL;
    }
    if (bytes < NVH_CAP_SMALL_PAGE * 2 || bytes > ((uint64_t)1 << 44)) {
        nvh_fail(NVH_E_SIZE, "nvh_cap_attach: %llu bytes: the capacity part takes 128 KiB .. 16 TiB",
                 (unsigned long long)bytes);
        return NULL;
    }
    /* aligned as its instance asks (a cache line, cap.h) */
    struct nvh_cap_part *c = aligned_alloc(_Alignof(struct nvh_cap_part),
                                           (sizeof *c + 63) & ~(size_t)63);
    if (c)
        memset(c, 0, sizeof *c);
    if (!c) {
        nvh_fail(NVH_E_NOMEM, "nvh_cap_attach: out of memory");
        return NULL;
    }
    c->pool = pool;
    c->region = nvh_reserve(pool, (size_t)bytes);
    if (!c->region) {
        free(c);
        nvh_fail_context(nvh_errcode(), "nvh_cap_attach: reserving %llu bytes of the pool",
                         (unsigned long long)bytes);
        return NULL;
    }
    int r = nvh_cap_init_region_(&c->inst, c->region, nvh_usable_size(pool, c->region));
    if (r) {
        nvh_cancel(pool, c->region);
        free(c);
        nvh_fail_errno(r == -EMFILE ? NVH_E_BUSY : NVH_E_NOMEM, -r,
                       "nvh_cap_attach: capacity instance (at most %u at once)", NVH_CAP_INSTANCES);
        return NULL;
    }
    c->hook.key = c;
    c->hook.close = part_hook_close;
    nvh_pool_hook_add_(pool, &c->hook);
    return c;
}

int nvh_cap_detach(nvh_cap *c)
{
    if (!c)
        return NVH_OK;
    nvh_pool_hook_del_(c->pool, &c->hook);
    part_release(c);
    return NVH_OK;
}

static struct cap_heap *part_heap(nvh_cap *c)
{
    struct cap_heap *h = nvh_cap_heap_(&c->inst);
    if (!h)
        nvh_fail(NVH_E_NOMEM, "capacity part: no thread heap");
    return h;
}

static void *nospace(nvh_cap *c, size_t size)
{
    nvh_fail(NVH_E_NOSPACE, "capacity part of %llu bytes: no room for %zu bytes",
             (unsigned long long)c->inst.size, size);
    return NULL;
}

void *nvh_cap_malloc(nvh_cap *c, size_t size)
{
    struct cap_heap *h = part_heap(c);
    if (!h)
        return NULL;
    void *p = nvh_cap_alloc_(h, size);
    return p ? p : nospace(c, size);
}

void *nvh_cap_calloc(nvh_cap *c, size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        nvh_fail(NVH_E_SIZE, "nvh_cap_calloc: %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    struct cap_heap *h = part_heap(c);
    if (!h)
        return NULL;
    void *p = nvh_cap_calloc_(h, bytes);
    return p ? p : nospace(c, bytes);
}

static int bad_ptr(nvh_cap *c, const void *ptr, int bad, const char *fn)
{
    if (bad == CAP_DOUBLE)
        return nvh_fail(NVH_E_DOUBLEFREE, "%s: %p (offset %llu of the capacity part) is already free",
                        fn, ptr, (unsigned long long)((uintptr_t)ptr - c->inst.base));
    return nvh_fail(NVH_E_BADPTR, "%s: %p is not a block of the capacity part (%s)", fn, ptr,
                    nvh_cap_contains_(&c->inst, ptr) ? "an interior or unallocated address"
                                                     : "outside it");
}

void *nvh_cap_realloc(nvh_cap *c, void *ptr, size_t size)
{
    if (!ptr)
        return nvh_cap_malloc(c, size);
    if (!nvh_cap_contains_(&c->inst, ptr)) {
        bad_ptr(c, ptr, CAP_INVALID, "nvh_cap_realloc");
        return NULL;
    }
    struct cap_heap *h = part_heap(c);
    if (!h)
        return NULL;
    int bad = CAP_OK;
    void *q = nvh_cap_realloc_(h, ptr, size ? size : 1, &bad);
    if (bad != CAP_OK) {
        bad_ptr(c, ptr, bad, "nvh_cap_realloc");
        return NULL;
    }
    return q ? q : nospace(c, size);
}

int nvh_cap_free(nvh_cap *c, void *ptr)
{
    if (!ptr)
        return NVH_OK;
    if (!nvh_cap_contains_(&c->inst, ptr))
        return bad_ptr(c, ptr, CAP_INVALID, "nvh_cap_free");
    int r = nvh_cap_free_(&c->inst, ptr);
    return r == CAP_OK ? NVH_OK : bad_ptr(c, ptr, r, "nvh_cap_free");
}

size_t nvh_cap_usable_size(nvh_cap *c, const void *ptr)
{
    size_t u = ptr && nvh_cap_contains_(&c->inst, ptr) ? nvh_cap_usable_(&c->inst, ptr) : 0;
    if (!u)
        bad_ptr(c, ptr, CAP_INVALID, "nvh_cap_usable_size");
    return u;
}

int nvh_cap_stats_get(nvh_cap *c, nvh_cap_stats *stats)
{
    if (!c || !stats)
        return nvh_fail(NVH_E_INVAL, "nvh_cap_stats_get: NULL argument");
    struct nvh_cap_counters k;
    nvh_cap_counters_(&c->inst, &k);
    memset(stats, 0, sizeof *stats);
    stats->region_offset = nvh_off(c->pool, c->region);
    stats->region_bytes = k.reserved;
    stats->span_bytes = k.span_bytes;
    stats->span_peak = k.span_peak;
    stats->dirty_bytes = k.dirty_bytes;
    stats->top = k.top;
    stats->punches = k.punches;
    return NVH_OK;
}

int nvh_cap_trim(nvh_cap *c)
{
    if (!c)
        return nvh_fail(NVH_E_INVAL, "nvh_cap_trim: NULL");
    nvh_cap_trim_(&c->inst);
    return NVH_OK;
}
