/* test_pool_basic.c — create, write a record, close, reopen in every
 * domain; epoch increments; grow keeps the base; root area survives. */
#include "test_util.h"

static const nvh_domain domains[] = {NVH_DOMAIN_PMEM, NVH_DOMAIN_EADR, NVH_DOMAIN_MSYNC,
                                     NVH_DOMAIN_PROCESS, NVH_DOMAIN_SIM};

static void create_write_reopen(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof domains / sizeof domains[0]; d++) {
        const char *path = test_path("basic");
        nvh_pool *pool = nvh_pool_create(path, "basic", 2 << 20, domains[d]);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_domain(pool), domains[d]);
        assert_int_equal(nvh_pool_epoch(pool), 1);
        uint64_t root_size;
        char *root = nvh_root(pool, &root_size);
        assert_int_equal(root_size, 4096);
        for (uint64_t i = 0; i < root_size; i++) assert_int_equal(root[i], 0);
        nvh_memcpy_persist(pool, root, "hello, persistent world", 24);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);

        pool = nvh_pool_open(path, "basic", domains[d]);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_epoch(pool), 2);
        root = nvh_root(pool, NULL);
        assert_string_equal(root, "hello, persistent world");
        nvh_pool_info info;
        assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
        assert_string_equal(info.layout, "basic");
        assert_int_equal(info.size, 2 << 20);
        assert_int_equal(info.format_version, 1);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

static void grow_keeps_base(void **state)
{
    (void)state;
    for (size_t d = 0; d < sizeof domains / sizeof domains[0]; d++) {
        const char *path = test_path("grow");
        nvh_pool *pool = nvh_pool_create(path, NULL, 1 << 20, domains[d]);
        assert_non_null(pool);
        char *base = nvh_pool_base(pool);
        assert_int_equal(nvh_pool_grow(pool, 8 << 20), NVH_OK);
        assert_ptr_equal(nvh_pool_base(pool), base);
        assert_int_equal(nvh_pool_size(pool), 8 << 20);
        char *tail = base + (7 << 20);
        assert_int_equal(tail[0], 0);
        nvh_memcpy_persist(pool, tail, "tail", 5);
        assert_int_equal(nvh_pool_grow(pool, 4 << 20), NVH_E_SIZE);   /* no shrinking */
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        pool = nvh_pool_open(path, NULL, domains[d]);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_size(pool), 8 << 20);
        assert_string_equal((char *)nvh_pool_base(pool) + (7 << 20), "tail");
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_write_reopen),
        cmocka_unit_test(grow_keeps_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
