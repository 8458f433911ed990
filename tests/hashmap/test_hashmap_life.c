/* test_hashmap_life.c — the hash map's life cycle: nvh_pool_close with the
 * map still open (every put durable, the count kept), a second open of an
 * open map (the same handle, reference counted; puts alternating through
 * both land), destroy refused while the map is open twice, and a damaged
 * bucket-0 mark read as an unmarked bucket rather than crashing the open. */
#include "test_util.h"
#include "ds/hashmap.h"        /* white-box: where bucket 0's dummy lies */
#include <fcntl.h>

#define LAYOUT "hmlife"

static nvh_off_t *root_slot(nvh_pool *pool) { return nvh_root(pool, NULL); }

static void pool_close_with_map_open(void **state)
{
    (void)state;
    const char *path = test_path("hm-life-close");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_hmap_create(pool, root_slot(pool), NULL), NVH_OK);
    nvh_hmap *m = nvh_hmap_open(pool, *root_slot(pool));
    assert_non_null(m);
    for (uint64_t k = 0; k < 1000; k++) assert_int_equal(nvh_hmap_put(m, &k, 8, &k, 8), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);                /* m closed too */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    m = nvh_hmap_open(pool, *root_slot(pool));
    assert_non_null(m);
    assert_int_equal(nvh_hmap_count(m), 1000);            /* the hint was persisted */
    for (uint64_t k = 0; k < 1000; k++) {
        const void *v;
        size_t len;
        assert_int_equal(nvh_hmap_get(m, &k, 8, &v, &len), NVH_OK);
        assert_int_equal(len, 8);
        assert_memory_equal(v, &k, 8);
    }
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count_repaired, 0);
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void double_open(void **state)
{
    (void)state;
    const char *path = test_path("hm-life-double");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_hmap_options o = {.initial_buckets_log2 = 1};
    assert_int_equal(nvh_hmap_create(pool, root_slot(pool), &o), NVH_OK);
    nvh_hmap *a = nvh_hmap_open(pool, *root_slot(pool));
    nvh_hmap *b = nvh_hmap_open(pool, *root_slot(pool));
    assert_non_null(a);
    assert_ptr_equal(a, b);
    for (uint64_t k = 0; k < 2000; k++)
        assert_int_equal(nvh_hmap_put(k & 1 ? b : a, &k, 8, &k, 8), NVH_OK);
    /* destroy with another open: refused, nothing changed */
    assert_int_equal(nvh_hmap_destroy(a, root_slot(pool)), NVH_E_BUSY);
    assert_int_equal(nvh_hmap_close(b), NVH_OK);
    assert_int_equal(nvh_hmap_count(a), 2000);
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(a, &st), NVH_OK);
    assert_int_equal(st.count, 2000);
    assert_int_equal(nvh_hmap_destroy(a, root_slot(pool)), NVH_OK);
    assert_int_equal(*root_slot(pool), 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Bucket 0's dummy is the head of the list and is never linked after
 * create; with its mark and bucket 1's damaged on the media the map opens, checks clean
 * and every key stays reachable, instead of the open's bucket linking
 * chasing bucket 0's "parent" forever. */
static void bucket0_mark_damaged(void **state)
{
    (void)state;
    const char *path = test_path("hm-life-b0");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_hmap_options o = {.initial_buckets_log2 = 4};
    assert_int_equal(nvh_hmap_create(pool, root_slot(pool), &o), NVH_OK);
    nvh_hmap *m = nvh_hmap_open(pool, *root_slot(pool));
    assert_non_null(m);
    for (uint64_t k = 0; k < 100; k++) assert_int_equal(nvh_hmap_put(m, &k, 8, &k, 8), NVH_OK);
    assert_true(m->nstripes >= 2);
    uint64_t mark0 = nvh_off(pool, &hm_dummy(m, 0)->check);
    uint64_t mark1 = nvh_off(pool, &hm_dummy(m, 1)->check);  /* the open relinks it */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    uint64_t zero = 0;
    assert_int_equal(pwrite(fd, &zero, 8, (off_t)mark0), 8);
    assert_int_equal(pwrite(fd, &zero, 8, (off_t)mark1), 8);
    close(fd);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    m = nvh_hmap_open(pool, *root_slot(pool));
    assert_non_null(m);
    for (uint64_t k = 0; k < 100; k++) {
        const void *v;
        size_t len;
        assert_int_equal(nvh_hmap_get(m, &k, 8, &v, &len), NVH_OK);
    }
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count, 100);
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pool_close_with_map_open),
        cmocka_unit_test(double_open),
        cmocka_unit_test(bucket0_mark_damaged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
