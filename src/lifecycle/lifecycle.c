/* lifecycle.c — the open/close sequence of a pool: nvh_pool_create,
 * nvh_pool_create_ex, nvh_pool_open, nvh_pool_close.
 *
 * A pool is a file (src/pool), a heap in it (src/alloc) and a transaction
 * log in the heap (src/log, src/tx). Each layer recovers from what the
 * layers below it have already made consistent, so the order is fixed:
 *
 *   open    pool file (validate, lock, map)  ->  heap recovery  ->
 *           transaction recovery  ->  NVHEAP_PROTECT  ->  epoch commit
 *   close   open containers (their close hooks)  ->  transactions quiesce
 *           ->  heap quiesce  ->  clean mark  ->  write-back, unmap
 *
 * The sequence sits above every layer it calls, so none of them calls up
 * (docs/ARCHITECTURE.md), the way PMDK's obj.c boots the heap and the
 * lanes from above both. */
#include "../alloc/alloc.h"
#include "../pool/pool.h"
#include "../protect/protect.h"
#include "../tx/tx.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Undo a partial open: protection off first (the teardown below writes),
 * then the allocator's DRAM state, then the file. Nothing reaches the
 * superblock: a failed open leaves the file as it was. */
static void release(nvh_pool *pool)
{
    nvh_protect_detach_(pool);
    nvh_heap_close_(pool);
    nvh_pool_file_close_(pool);
}

/* Every layer above the file, in order, on a freshly mapped pool; the epoch
 * is committed last, so a heap or log that fails validation (or a bad
 * NVHEAP_PROTECT) fails the open with the file unchanged. */
static int open_layers(nvh_pool *pool)
{
    if (nvh_heap_open_(pool, false) != NVH_OK) return nvh_errcode();
    if (nvh_tx_open_(pool) != NVH_OK) return nvh_errcode();
    /* NVHEAP_PROTECT=off|sync|async[:ns]: protection from the first store on
     * (docs/PROTECT.md) */
    if (nvh_protect_env_apply_(pool) != NVH_OK) return nvh_errcode();
    if (!pool->readonly)
        nvh_pool_state_commit_(pool, atomic_load_explicit(&pool->ctx.size, memory_order_relaxed),
                               pool->epoch + 1, 0);
    return NVH_OK;
}

nvh_pool *nvh_pool_create_ex(const char *path, const char *layout, uint64_t size,
                             unsigned flags, const nvh_pool_options *options)
{
    nvh_pool *pool = nvh_pool_file_create_(path, layout, size, flags, options);
    if (!pool) return NULL;
    if (open_layers(pool) != NVH_OK) {
        /* keep the layer's error across the teardown, which may overwrite it */
        nvh_err_saved err;
        nvh_err_save(&err);
        release(pool);
        unlink(path);                    /* a create that fails leaves no file */
        nvh_err_restore(&err);
        return NULL;
    }
    return pool;
}

nvh_pool *nvh_pool_create(const char *path, const char *layout, uint64_t size, unsigned flags)
{
    return nvh_pool_create_ex(path, layout, size, flags, NULL);
}

nvh_pool *nvh_pool_open(const char *path, const char *layout, unsigned flags)
{
    nvh_pool *pool = nvh_pool_file_open_(path, layout, flags);
    if (!pool) return NULL;
    if (open_layers(pool) != NVH_OK) {
        nvh_err_saved err;
        nvh_err_save(&err);
        release(pool);
        nvh_err_restore(&err);
        return NULL;
    }
    return pool;
}

int nvh_pool_close(nvh_pool *pool)
{
    if (!pool) return NVH_OK;
    /* containers first: their close writes through every layer below */
    bool refused;
    int rc = nvh_pool_close_containers_(pool, &refused);
    if (refused) return rc;                   /* the pool stays open, unchanged */
    if (!pool->readonly) {
        /* an implicit window: the layers' close-time stores stay legal under
         * protection whether or not they open windows themselves */
        nvh_protect_internal_begin(pool);
        nvh_tx_close_(pool);
        nvh_heap_quiesce_(pool);
        uint64_t size = atomic_load_explicit(&pool->ctx.size, memory_order_relaxed);
        nvh_pool_state_commit_(pool, size, pool->epoch, 1);
        nvh_protect_internal_end(pool);
        int wrc = nvh_pool_close_writeback_(pool);
        if (wrc != NVH_OK) rc = wrc;
    }
    release(pool);
    return rc;
}
