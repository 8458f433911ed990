/* tx_unit.h — what the transaction unit tests (test_tx_basic.c,
 * test_tx_fast.c) share: a fresh pool and a data object to play with. */
#ifndef NVH_TESTS_TX_UNIT_H
#define NVH_TESTS_TX_UNIT_H

#include "test_util.h"

/* A new pool of `size` bytes at a fresh path named after `name`; the path
 * into *path_out (may be NULL). */
static inline nvh_pool *tx_unit_pool(const char *name, const char *layout, uint64_t size,
                                     unsigned domain, const char **path_out)
{
    const char *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(path, layout, size, domain);
    assert_non_null(pool);
    if (path_out) *path_out = path;
    return pool;
}

/* A data object allocated outside any transaction, zeroed and persisted
 * (a test's stores to it start from a known, durable state). */
static inline uint64_t *tx_unit_obj(nvh_pool *pool, size_t size)
{
    uint64_t *p = nvh_alloc(pool, size, NULL, NULL, NULL);
    assert_non_null(p);
    memset(p, 0, size);
    nvh_persist(pool, p, size);
    return p;
}

#endif /* NVH_TESTS_TX_UNIT_H */
