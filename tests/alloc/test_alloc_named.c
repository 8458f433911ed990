/* test_alloc_named.c — the object tables grow past table 0's NVH_NAMED_CAP
 * entries: many names survive reopen and are found, deleted and reused; a
 * crash at every fence of a growth step recovers the tables before or after
 * the growth with every acknowledged name; a damaged directory word makes
 * open fail with NVH_E_CORRUPT naming it, never a signal; the tables are not
 * user objects (nvh_heap_foreach and nvh_heap_stats_get skip them). */
#include "test_util.h"

#include <stdbool.h>
#include <stdio.h>

#include "alloc/alloc.h"      /* white-box: directory words, NVH_NAMED_CAP */

#define LAYOUT "named"

static uint64_t heap_off;

static void name_of(char *buf, size_t n, int i) { snprintf(buf, n, "object-%07d", i); }

static uint64_t tag_of(int i, int gen) { return (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)gen; }

static int create(nvh_pool *pool, int i, int gen)
{
    char name[32];
    name_of(name, sizeof name, i);
    uint64_t *p = nvh_reserve_named(pool, name, 16);
    if (!p) return -1;
    p[0] = tag_of(i, gen);
    nvh_persist(pool, p, 8);
    return nvh_activate_named(pool, name);
}

static bool found(nvh_pool *pool, int i, int gen)
{
    char name[32];
    name_of(name, sizeof name, i);
    uint64_t *p = nvh_get_named(pool, name, NULL);
    return p && p[0] == tag_of(i, gen);
}

static int count_fn(void *ptr, size_t usable, void *arg)
{
    (void)ptr;
    (void)usable;
    ++*(long *)arg;
    return 0;
}

static int count_named(const char *name, void *ptr, size_t size, void *arg)
{
    (void)name; (void)ptr; (void)size;
    ++*(long *)arg;
    return 0;
}

static nvh_pool *make(const char *path, size_t size)
{
    unlink(path);
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, size, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    heap_off = info.heap_offset;
    return pool;
}

/* ---------------------------------------------------------------------------
 * 100,000 names: create, reopen, find all, delete a third, reuse
 * ------------------------------------------------------------------------- */
#define MANY 100000
static int gen_of[MANY];

static void many_names(void **state)
{
    (void)state;
    const char *path = test_path("named_many");
    nvh_pool *pool = make(path, (size_t)64 << 20);
    for (int i = 0; i < MANY; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) assert_true(found(pool, i, 0));
    char name[32];
    name_of(name, sizeof name, 0);
    assert_null(nvh_reserve_named(pool, name, 8));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_null(nvh_get_named(pool, "object-none", NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    /* the tables are the heap's metadata, not user objects */
    long objs = 0, named = 0;
    assert_int_equal(nvh_heap_foreach(pool, count_fn, &objs), NVH_OK);
    assert_int_equal(nvh_named_foreach(pool, count_named, &named), NVH_OK);
    assert_int_equal(objs, MANY);
    assert_int_equal(named, MANY);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, MANY);
    for (int i = 0; i < MANY; i += 3) {
        name_of(name, sizeof name, i);
        assert_int_equal(nvh_free_named(pool, name), NVH_OK);
        assert_null(nvh_get_named(pool, name, NULL));
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) {
        if (i % 3 == 0) {
            name_of(name, sizeof name, i);
            assert_null(nvh_get_named(pool, name, NULL));
            assert_int_equal(create(pool, i, 1), NVH_OK);
            gen_of[i] = 1;
        }
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) assert_true(found(pool, i, gen_of[i]));
    named = 0;
    assert_int_equal(nvh_named_foreach(pool, count_named, &named), NVH_OK);
    assert_int_equal(named, MANY);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Crash at every fence of a growth step
 * ------------------------------------------------------------------------- */
#define PRE 767                 /* table 0 one name short of 3/4 full */
#define MORE 3                  /* the second of these adds table 1   */
static volatile int g_acked;    /* names acknowledged (seen by the crash child) */

static int grow_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    for (int i = PRE; i < PRE + MORE; i++) {
        if (create(pool, i, 0) != NVH_OK) return 1;
        g_acked = i + 1;
    }
    return 0;
}

static int grow_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)pt; (void)arg;
    uint64_t dir1 = 1;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return 1;
    int acked = g_acked, rc = 0;
    for (int i = 0; i < acked && !rc; i++)
        if (!found(pool, i, 0)) rc = 2;
    long named = 0;
    if (!rc && nvh_named_foreach(pool, count_named, &named) != NVH_OK) rc = 3;
    if (!rc && named != acked && named != acked + 1) rc = 4;
    /* table 1 exists exactly when a name needed it (before or after growth) */
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    if (!rc && named > PRE + 1 && dir1 == 0) rc = 5;
    long objs = 0;
    if (!rc && (nvh_heap_foreach(pool, count_fn, &objs) != NVH_OK || objs != named)) rc = 6;
    /* growth completes after recovery too */
    for (int i = PRE + MORE; i < PRE + MORE + 2 && !rc; i++)
        if (!found(pool, i, 0) && create(pool, i, 0) != NVH_OK) rc = 7;
    nvh_pool_close(pool);
    return rc;
}

static void grow_crash(void **state)
{
    (void)state;
    const char *path = test_path("named_grow");
    nvh_pool *pool = make(path, (size_t)4 << 20);
    for (int i = 0; i < PRE; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    uint64_t dir1 = 1;
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_equal(dir1, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (int mode = 0; mode < 2; mode++) {
        g_acked = PRE;
        nvh_crash_config cfg = {
            .pool_path = path, .layout = LAYOUT, .workload = grow_workload,
            .check = grow_check, .seed = 23 + (uint64_t)mode,
            .mode = mode ? NVH_CRASH_WORDS : NVH_CRASH_LINES, .images_per_point = 2,
        };
        test_crash_explore(&cfg);
    }
    /* the workload's own run grew the table: check it on the real pool */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < PRE + MORE; i++) create(pool, i, 0);
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_not_equal(dir1, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * A damaged directory word
 * ------------------------------------------------------------------------- */
static void damaged_directory(void **state)
{
    (void)state;
    const char *path = test_path("named_dir");
    nvh_pool *pool = make(path, (size_t)8 << 20);
    for (int i = 0; i < 2000; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    uint64_t good;
    memcpy(&good, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_not_equal(good, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    const uint64_t bad[] = {good ^ 0x40, good + 4096, 0x123457, ~0ull, 4096};
    for (unsigned b = 0; b < sizeof bad / sizeof bad[0] + 1; b++) {
        if (b < sizeof bad / sizeof bad[0]) {
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &bad[b], 8);
        } else {        /* table 2 without table 1 */
            uint64_t zero = 0;
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &zero, 8);
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF + 8), &good, 8);
        }
        /* the transaction layer looks up its log directory by name at
         * open: a pool whose names cannot be trusted does not open */
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (pool) fail_msg("case %u: opened with a damaged directory word", b);
        assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
        assert_non_null(strstr(nvh_errormsg(), "object table directory word"));
        uint64_t zero = 0;
        test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF + 8), &zero, 8);
        test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &good, 8);
    }
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < 2000; i++) assert_true(found(pool, i, 0));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_names),
        cmocka_unit_test(grow_crash),
        cmocka_unit_test(damaged_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
