/* test_pool_populate.c — NVH_POOL_POPULATE and NVHEAP_POPULATE=1: a chunk
 * the allocator claims fresh is faulted in at the claim, so the stores that
 * fill the objects carved from it take (almost) no page fault; without the
 * option every 4 KiB of a large object faults on its first store. Also: the
 * msync domain ignores the option, and the objects are usable as ever. */
#include "test_util.h"

#include <sys/resource.h>

#define NOBJ 64
#define OBJ_SIZE (40u << 10)      /* large objects: 10 blocks each, 2.5 MiB */
#define PAGES ((long)NOBJ * (OBJ_SIZE / 4096))

static long thread_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

/* Faults taken while writing NOBJ fresh large objects of a new pool. */
static long store_faults(unsigned flags)
{
    const char *path = test_path("populate");
    unlink(path);
    nvh_pool *pool = nvh_pool_create(path, "populate", 64u << 20, flags);
    assert_non_null(pool);
    static void *obj[NOBJ];
    for (unsigned i = 0; i < NOBJ; i++) {
        obj[i] = nvh_reserve(pool, OBJ_SIZE);   /* the claim (and populate) happen here */
        assert_non_null(obj[i]);
    }
    long f0 = thread_faults();
    for (unsigned i = 0; i < NOBJ; i++) memset(obj[i], (int)i, OBJ_SIZE);
    long f = thread_faults() - f0;
    for (unsigned i = 0; i < NOBJ; i++) {
        nvh_persist(pool, obj[i], OBJ_SIZE);
        assert_int_equal(nvh_activate(pool, obj[i], NULL, 0), NVH_OK);
    }
    for (unsigned i = 0; i < NOBJ; i++) {
        assert_int_equal(((unsigned char *)obj[i])[OBJ_SIZE - 1], (unsigned char)i);
        assert_int_equal(nvh_free(pool, obj[i], NULL, 0), NVH_OK);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    return f;
}

static void populate_flag(void **state)
{
    (void)state;
    long off = store_faults(NVH_DOMAIN_PROCESS);
    long on = store_faults(NVH_DOMAIN_PROCESS | NVH_POOL_POPULATE);
    print_message("store faults for %u x %u B: %ld without, %ld with NVH_POOL_POPULATE\n", NOBJ,
                  OBJ_SIZE, off, on);
    /* every fault on the objects' own pages is gone (under TSan its shadow
     * memory faults too, in both runs alike) */
    assert_true(off - on >= PAGES * 9 / 10);
}

static void populate_env(void **state)
{
    (void)state;
    setenv("NVHEAP_POPULATE", "1", 1);
    long on = store_faults(NVH_DOMAIN_PROCESS);
    setenv("NVHEAP_POPULATE", "0", 1);
    long off = store_faults(NVH_DOMAIN_PROCESS);
    unsetenv("NVHEAP_POPULATE");
    assert_true(off - on >= PAGES * 9 / 10);
}

/* msync tracks dirty pages itself: the option changes nothing there */
static void populate_msync_ignored(void **state)
{
    (void)state;
    long on = store_faults(NVH_DOMAIN_MSYNC | NVH_POOL_POPULATE);
    assert_true(on >= PAGES / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(populate_flag),
        cmocka_unit_test(populate_env),
        cmocka_unit_test(populate_msync_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
