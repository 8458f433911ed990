/* msync.c — the msync domain: an ordinary file on a disk file system.
 * nvh_flush records the dirtied pages; nvh_drain msyncs them (MS_SYNC) and
 * forgets them. Ranges are kept coalesced in a small sorted array; when it
 * fills up, ranges are merged (a wider msync is correct, only slower). */
#include "../common/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MSYNC_MAX_RANGES 64

struct nvh_msync_set {
    pthread_mutex_t lock;
    unsigned count;
    struct { uintptr_t start, end; } range[MSYNC_MAX_RANGES];
};

int nvh_msync_init(nvh_pool *pool)
{
    nvh_msync_set *set = calloc(1, sizeof *set);
    if (!set) return nvh_fail(NVH_E_NOMEM, "out of memory for msync state");
    pthread_mutex_init(&set->lock, NULL);
    pool->msync = set;
    return NVH_OK;
}

void nvh_msync_fini(nvh_pool *pool)
{
    if (!pool->msync) return;
    pthread_mutex_destroy(&pool->msync->lock);
    free(pool->msync);
    pool->msync = NULL;
}

void nvh_msync_record(nvh_pool *pool, const void *addr, size_t len)
{
    nvh_msync_set *set = pool->msync;
    uintptr_t start = NVH_ALIGN_DOWN((uintptr_t)addr, NVH_PAGE);
    uintptr_t end = NVH_ALIGN_UP((uintptr_t)addr + len, NVH_PAGE);
    pthread_mutex_lock(&set->lock);
    unsigned i = 0;
    while (i < set->count && set->range[i].end < start) i++;
    /* merge every range that overlaps or touches [start, end) */
    unsigned j = i;
    while (j < set->count && set->range[j].start <= end) {
        if (set->range[j].start < start) start = set->range[j].start;
        if (set->range[j].end > end) end = set->range[j].end;
        j++;
    }
    if (j > i) {
        set->range[i].start = start;
        set->range[i].end = end;
        memmove(&set->range[i + 1], &set->range[j], (set->count - j) * sizeof set->range[0]);
        set->count -= j - i - 1;
    } else if (set->count < MSYNC_MAX_RANGES) {
        memmove(&set->range[i + 1], &set->range[i], (set->count - i) * sizeof set->range[0]);
        set->range[i].start = start;
        set->range[i].end = end;
        set->count++;
    } else {
        /* full: fold the new range into its nearest neighbour */
        unsigned k = i < set->count ? i : set->count - 1;
        if (start < set->range[k].start) set->range[k].start = start;
        if (end > set->range[k].end) set->range[k].end = end;
        if (k > 0 && set->range[k - 1].end >= set->range[k].start) {
            set->range[k - 1].end = set->range[k].end;
            memmove(&set->range[k], &set->range[k + 1], (set->count - k - 1) * sizeof set->range[0]);
            set->count--;
        }
    }
    pthread_mutex_unlock(&set->lock);
}

int nvh_msync_drain(nvh_pool *pool)
{
    nvh_msync_set *set = pool->msync;
    int rc = NVH_OK;
    pthread_mutex_lock(&set->lock);
    for (unsigned i = 0; i < set->count; i++) {
        nvh_stat_add_(&pool->ctx, NVH_STAT_MSYNCS, 1);
        if (msync((void *)set->range[i].start, set->range[i].end - set->range[i].start,
                  MS_SYNC) != 0) {
            /* nvh_drain returns nothing, so the failure is also kept in the
             * pool: nvh_pool_info shows it and nvh_pool_close returns NVH_E_IO */
            atomic_fetch_add_explicit(&pool->io_errors, 1, memory_order_relaxed);
            if (rc == NVH_OK)
                rc = nvh_fail_errno(NVH_E_IO, errno, "msync of pool %s failed", pool->path);
        }
    }
    set->count = 0;
    pthread_mutex_unlock(&set->lock);
    return rc;
}
