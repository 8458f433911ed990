/* persist_test_util.h — helpers for the persistence tests: the domain list,
 * a scratch pool with a page-aligned work area, the expected number of
 * cache lines a span touches, and counter snapshots/differences. */
#ifndef NVH_PERSIST_TEST_UTIL_H
#define NVH_PERSIST_TEST_UTIL_H

#include "test_util.h"

#include <stdbool.h>

#define MiB ((uint64_t)1 << 20)

static const nvh_domain all_domains[] = {NVH_DOMAIN_PMEM, NVH_DOMAIN_EADR, NVH_DOMAIN_MSYNC,
                                         NVH_DOMAIN_PROCESS, NVH_DOMAIN_SIM};
#define N_DOMAINS (sizeof all_domains / sizeof all_domains[0])

/* A fresh pool in `domain` whose root area (the application's own bytes,
 * page aligned) offers at least `work_len` bytes of scratch space at *work;
 * the heap behind it is left to the allocator. Counters are reset. */
static inline nvh_pool *scratch_pool(const char *name, nvh_domain domain, uint64_t work_len,
                                     char **work, const char **path_out)
{
    const char *path = test_path(name);
    nvh_pool_options opts = {.root_size = work_len};
    uint64_t size = ((work_len + 4095) & ~(uint64_t)4095) + 2 * MiB;
    nvh_pool *pool = nvh_pool_create_ex(path, "persist-test", size, domain, &opts);
    if (!pool) fail_msg("create %s in %s: %s", path, nvh_domain_name(domain), nvh_errormsg());
    uint64_t root_size = 0;
    *work = nvh_root(pool, &root_size);
    assert_true(root_size >= work_len);
    assert_int_equal((uintptr_t)*work % 4096, 0);
    if (path_out) *path_out = path;
    nvh_stats_reset(pool);
    return pool;
}

/* Cache lines touched by [addr, addr + len). */
static inline uint64_t lines_spanned(const void *addr, size_t len)
{
    if (len == 0) return 0;
    uintptr_t a = (uintptr_t)addr;
    return (a + len - 1) / NVH_CACHELINE - a / NVH_CACHELINE + 1;
}

/* Bytes the non-temporal path streams for a copy to dst of len bytes: the
 * whole lines after the unaligned head (head and tail go through the cache). */
static inline uint64_t nt_body_bytes(const void *dst, size_t len)
{
    size_t head = (NVH_CACHELINE - ((uintptr_t)dst & (NVH_CACHELINE - 1))) & (NVH_CACHELINE - 1);
    if (head > len) head = len;
    return (len - head) & ~(size_t)(NVH_CACHELINE - 1);
}

static inline nvh_stats stats_now(const nvh_pool *pool)
{
    nvh_stats s;
    nvh_stats_get(pool, &s);
    return s;
}

static inline nvh_stats stats_diff(nvh_stats after, nvh_stats before)
{
    return (nvh_stats){
        .lines_flushed = after.lines_flushed - before.lines_flushed,
        .fences = after.fences - before.fences,
        .msyncs = after.msyncs - before.msyncs,
        .nt_bytes = after.nt_bytes - before.nt_bytes,
    };
}

#endif /* NVH_PERSIST_TEST_UTIL_H */
