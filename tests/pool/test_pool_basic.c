/* test_pool_basic.c — create, write a record, close, reopen in every
 * domain; epoch increments; grow keeps the base; root area survives. */
#include "test_util.h"
#include "pool/format.h"

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
        assert_int_equal(info.format_version, NVH_FORMAT_VERSION);
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

/* Resident pages of this process's mappings inside [lo, hi), in KiB
 * (/proc/self/smaps: a shared file page counts once it is mapped here). */
static uint64_t mapped_kib(const char *lo, const char *hi)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    int inside = 0;
    uint64_t kib = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        unsigned long long v;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)            /* a mapping's header */
            inside = (const char *)a >= lo && (const char *)b <= hi;
        else if (inside && sscanf(line, "Rss: %llu kB", &v) == 1)
            kib += v;
    }
    fclose(f);
    return kib;
}

/* NVH_POOL_PREFAULT maps every page at create, open and grow (MAP_POPULATE);
 * without it only the pages touched are. The sim domain ignores it. */
static void prefault(void **state)
{
    (void)state;
    const nvh_domain doms[] = {NVH_DOMAIN_PMEM, NVH_DOMAIN_PROCESS, NVH_DOMAIN_MSYNC, NVH_DOMAIN_SIM};
    const uint64_t size = 8u << 20;
    for (size_t d = 0; d < sizeof doms / sizeof doms[0]; d++) {
        for (int with = 0; with <= 1; with++) {
            const char *path = test_path("prefault");
            unsigned flags = doms[d] | (with ? NVH_POOL_PREFAULT : 0);
            nvh_pool *pool = nvh_pool_create(path, "pf", size, flags);
            assert_non_null(pool);
            char *base = nvh_pool_base(pool);
            uint64_t kib = mapped_kib(base, base + size);
            if (doms[d] != NVH_DOMAIN_SIM) {
                if (with) assert_true(kib >= size / 1024 * 9 / 10);
                else assert_true(kib < size / 1024 / 2);
            }
            nvh_memcpy_persist(pool, base + size - 4096, "end", 4);
            assert_int_equal(nvh_pool_grow(pool, 2 * size), NVH_OK);  /* the tail too */
            kib = mapped_kib(base, base + 2 * size);   /* the tail may join the VMA */
            if (doms[d] != NVH_DOMAIN_SIM) {
                if (with) assert_true(kib >= 2 * size / 1024 * 9 / 10);
                else assert_true(kib < size / 1024 / 2);
            }
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
            pool = nvh_pool_open(path, "pf", flags);
            assert_non_null(pool);
            base = nvh_pool_base(pool);
            assert_string_equal(base + size - 4096, "end");
            kib = mapped_kib(base, base + 2 * size);
            if (doms[d] != NVH_DOMAIN_SIM && with) assert_true(kib >= 2 * size / 1024 * 9 / 10);
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
            unlink(path);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_write_reopen),
        cmocka_unit_test(grow_keeps_base),
        cmocka_unit_test(prefault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
