/* check.c — nvh_heap_check_path: the allocator's header check on a pool
 * named by its path. Opening the pool runs the whole open sequence (heap
 * and transaction recovery), so the call lives here, above the allocator,
 * rather than beside nvh_heap_check (src/alloc/check.c). */
#include "../alloc/alloc.h"

#include <stdio.h>

int nvh_heap_check_path(const char *path, nvh_check_fn fn, void *arg, int repair,
                        uint64_t *corrupt_out)
{
    nvh_pool *pool = nvh_pool_open(path, NULL, repair ? 0 : NVH_OPEN_READONLY);
    if (!pool) return nvh_errcode();
    int rc = nvh_heap_check(pool, fn, arg, repair, corrupt_out);
    nvh_err_saved err;
    nvh_err_save(&err);
    nvh_pool_close(pool);
    if (rc != NVH_OK) nvh_fail(rc, "%s", err.msg);
    return rc;
}
