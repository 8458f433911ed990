/* tx_crash_test.h — what the transaction crash tests (test_tx_crash.c,
 * test_tx_redo.c) share: the checker's complaint counter, which lives in
 * memory shared with the forked crash children, the lookup of the log
 * directory among the named objects, a fresh pool, the check of the
 * recovered region against the model, and the per-process setup. */
#ifndef NVH_TESTS_TX_CRASH_TEST_H
#define NVH_TESTS_TX_CRASH_TEST_H

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "test_util.h"
#include "log/log.h"

/* [0]: complaints of the checkers, [1]: free for a test's own count */
static int *g_complaints;
/* negative controls expect failures: count them, print none */
static volatile int g_complaints_quiet;
static const char *g_scratch;

/* Count a failed check, print the first few, return rc. */
static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5 && !g_complaints_quiet)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld)\n",
                (unsigned long long)(pt ? pt->fence : 0), (unsigned long long)(pt ? pt->seed : 0),
                what, a, b);
    return rc;
}

/* nvh_named_foreach callback: the transaction log directory into *arg. */
static inline int tx_dir_find(const char *name, void *ptr, size_t size, void *arg)
{
    (void)size;
    if (strcmp(name, NVH_TX_DIR_NAME) != 0) return 0;
    *(void **)arg = ptr;
    return 1;
}

/* A new pool (closed again) for a crash exploration or a direct run. */
static const char *tx_fresh_pool(const char *name, const char *layout)
{
    const char *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(path, layout, 2u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

/* The recovered region must equal the acknowledged state (prev) or, with a
 * transaction in flight, the next one: else complain (rc 5) with the first
 * byte that differs from prev. */
static int tx_region_check(const nvh_crash_point *pt, const void *reg, const void *prev,
                           const void *next, size_t bytes, int inflight, uint64_t acked)
{
    if (memcmp(reg, prev, bytes) == 0 || (inflight && memcmp(reg, next, bytes) == 0)) return 0;
    const unsigned char *r = reg, *p = prev;
    long first = -1;
    for (size_t i = 0; i < bytes; i++)
        if (r[i] != p[i]) { first = (long)i; break; }
    if (first >= 0 && !g_complaints_quiet)
        fprintf(stderr, "  at byte %ld: got %02x, want %02x, inflight %d\n", first, r[first],
                p[first], inflight);
    return complain(pt, 5, "data is neither the acknowledged state nor the next", (long)acked,
                    first);
}

/* Small chunks (small crash images), the shared counter, a scratch folder.
 * The default growth limit costs nothing here: the heap's per-chunk tables
 * are touched only for the chunks the pool uses (test_alloc_open). */
static void tx_crash_test_init(const char *name)
{
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_scratch = test_shm_scratch(name);
}

#endif /* NVH_TESTS_TX_CRASH_TEST_H */
