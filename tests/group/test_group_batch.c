/* test_group_batch.c — the REAL model's fence economy: N groups with batch B
 * cost about N / B fences (counted by the pool's own counters, in the
 * process, sim and msync domains), the age limit retires a lone group, a full
 * ring falls back to one synchronous write-back (counted), and sync forces
 * everything with at most two fences. Prints the fences-per-group figures. */
#include "group_test.h"

gt_log *gt_current_log;
static gt_log g_log;

static void reset_log(nvh_pool *pool)
{
    memset(&g_log, 0, sizeof g_log);
    g_log.expect_pool = pool;
    gt_current_log = &g_log;
}

/* n groups of one record each; returns the pool's fences for them + sync. */
static uint64_t run_groups(nvh_pool *pool, nvh_group_ctx *g, uint64_t n)
{
    gt_root *root = nvh_root(pool, NULL);
    nvh_stats_reset(pool);
    for (uint64_t i = 0; i < n; i++) {
        gt_record *r = &root->rec[i % GT_MAX_RECORDS];
        assert_int_equal(nvh_group_begin(g), NVH_OK);
        gt_fill(r, i, 0);
        assert_int_equal(nvh_group_add(g, r, sizeof *r), NVH_OK);
        assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
    }
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    return gt_pool_fences(pool);
}

/* ---------------------------------------------------------------------------
 * N / B fences
 * ------------------------------------------------------------------------- */
static void fences_per_group(nvh_domain domain, const char *name)
{
    const char *path;
    nvh_pool *pool = gt_pool_create(name, domain, &path);
    const uint64_t n = 2000;
    static const unsigned batches[] = {1, 4, 16, 32, 64};
    for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
        unsigned batch = batches[b];
        reset_log(pool);
        nvh_group_options o = {.batch_count = batch, .slots = 64, .batch_ns = NVH_GROUP_NEVER};
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        assert_non_null(g);
        uint64_t fences = run_groups(pool, g, n);
        /* n / B batch fences (ceil), + the sync's retire fence if a partial
         * batch was left, + the sync's effects fence */
        uint64_t expect = n / batch + (n % batch ? 1 : 0) + 1;
        nvh_group_stats st;
        nvh_group_stats_get(g, &st);
        printf("  %-7s batch %2u: %llu groups, %llu fences = %.4f fences/group "
               "(batch %llu, sync %llu), mean delay %.1f groups\n",
               nvh_domain_name(domain), batch, (unsigned long long)n,
               (unsigned long long)fences, (double)fences / (double)n,
               (unsigned long long)st.batch_fences, (unsigned long long)st.syncs,
               (double)st.delay_groups / (double)st.actions);
        assert_int_equal(fences, expect);
        assert_int_equal(st.fences, fences);
        assert_int_equal(st.batch_fences, n / batch);
        assert_int_equal(st.fallbacks, 0);
        assert_int_equal(g_log.n, n);
        for (uint64_t i = 0; i < n; i++) assert_int_equal(g_log.id[i], i);
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    }
    gt_pool_destroy(pool, path);
}

static void fences_process(void **state) { (void)state; fences_per_group(NVH_DOMAIN_PROCESS, "grp-fp"); }
static void fences_sim(void **state) { (void)state; fences_per_group(NVH_DOMAIN_SIM, "grp-fs"); }
static void fences_msync(void **state) { (void)state; fences_per_group(NVH_DOMAIN_MSYNC, "grp-fm"); }
/* pmem forced on an ordinary file: the inline CLWB/CLFLUSHOPT + SFENCE path */
static void fences_pmem(void **state) { (void)state; fences_per_group(NVH_DOMAIN_PMEM, "grp-fpm"); }

/* With the defaults (batch 32, 100 us) a fast loop is batched by count. */
static void defaults_are_cheap(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-def", NVH_DOMAIN_PROCESS, &path);
    reset_log(pool);
    nvh_group_ctx *g = nvh_group_ctx_create(pool, NULL);
    uint64_t n = 3200;
    uint64_t fences = run_groups(pool, g, n);
    printf("  defaults: %llu groups, %llu fences = %.4f fences/group\n", (unsigned long long)n,
           (unsigned long long)fences, (double)fences / (double)n);
    /* count-triggered: n / 32; age-triggered ones add a few when the thread
     * is preempted (the bound is loose so a loaded machine cannot fail it) */
    assert_true(fences >= n / 32 + 1);
    assert_true(fences <= n / 4);
    assert_int_equal(g_log.n, n);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Age limit
 * ------------------------------------------------------------------------- */
static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {}
}

static void age_limit(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-age", NVH_DOMAIN_PROCESS, &path);
    gt_root *root = nvh_root(pool, NULL);
    reset_log(pool);
    /* 100 ms: long enough that no scheduling hiccup makes the group old
     * before the first poll */
    nvh_group_options o = {.batch_count = UINT_MAX, .slots = 1000, .batch_ns = 100000000};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    gt_fill(&root->rec[0], 0, 0);
    assert_int_equal(nvh_group_add(g, &root->rec[0], sizeof root->rec[0]), NVH_OK);
    assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)0), NVH_OK);
    assert_int_equal(nvh_group_poll(g), 0);            /* too young */
    assert_int_equal(g_log.n, 0);
    sleep_us(150000);
    assert_int_equal(nvh_group_poll(g), 1);            /* an idle thread's poll retires it */
    assert_int_equal(g_log.n, 1);
    nvh_group_stats st;
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.timed_fences, 1);
    assert_int_equal(st.fences, 1);

    /* ... and so does the next end of a busy one */
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)1), NVH_OK);
    sleep_us(150000);
    assert_int_equal(g_log.n, 1);
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)2), NVH_OK);
    assert_int_equal(g_log.n, 3);
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.timed_fences, 2);
    assert_int_equal(nvh_group_poll(g), 0);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Ring full
 * ------------------------------------------------------------------------- */
static void ring_full_fallback(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-full", NVH_DOMAIN_SIM, &path);
    gt_root *root = nvh_root(pool, NULL);
    for (int m = NVH_GROUP_REAL; m <= NVH_GROUP_SIM_LOWER; m++) {
        reset_log(pool);
        /* no count or age limit, LOWER never writes back: only the ring forces */
        nvh_group_options o = {.model = (nvh_group_model)m, .batch_count = UINT_MAX,
                               .batch_ns = NVH_GROUP_NEVER, .slots = 4,
                               .cache_lines = NVH_GROUP_NEVER};
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        nvh_stats_reset(pool);
        for (uint64_t i = 0; i < 4; i++) {
            assert_int_equal(nvh_group_begin(g), NVH_OK);
            gt_fill(&root->rec[i], i, 0);
            assert_int_equal(nvh_group_add(g, &root->rec[i], sizeof root->rec[i]), NVH_OK);
            assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
        }
        assert_int_equal(g_log.n, 0);
        assert_int_equal(nvh_group_pending(g), 4);
        assert_int_equal(gt_pool_fences(pool), 0);
        /* the fifth begin finds no free slot: one synchronous write-back */
        assert_int_equal(nvh_group_begin(g), NVH_OK);
        assert_int_equal(g_log.n, 4);
        for (uint64_t i = 0; i < 4; i++) assert_int_equal(g_log.id[i], i);
        nvh_group_stats st;
        nvh_group_stats_get(g, &st);
        assert_int_equal(st.fallbacks, 1);
        assert_int_equal(st.fences, 1);
        assert_int_equal(gt_pool_fences(pool), 1);
        /* REAL flushed 4 lines per record at add; the simulated cache wrote
         * back the 13 distinct lines (neighbouring records share one) */
        assert_int_equal(st.lines_written_back, m == NVH_GROUP_REAL ? 16 : 13);
        assert_int_equal(nvh_group_add(g, &root->rec[4], 64), NVH_OK);
        assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)4), NVH_OK);
        assert_int_equal(nvh_group_pending(g), 1);
        /* 40 more: one fallback per 4 */
        for (uint64_t i = 5; i < 45; i++) {
            assert_int_equal(nvh_group_begin(g), NVH_OK);
            assert_int_equal(nvh_group_add(g, &root->rec[i], 64), NVH_OK);
            assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
        }
        nvh_group_stats_get(g, &st);
        assert_int_equal(st.fallbacks, 11);
        assert_int_equal(nvh_group_sync(g), NVH_OK);
        assert_int_equal(g_log.n, 45);
        for (uint64_t i = 0; i < 45; i++) assert_int_equal(g_log.id[i], i);
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    }
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * sync
 * ------------------------------------------------------------------------- */
static void publish_count(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)ctx;
    gt_root *root = nvh_root(pool, NULL);
    root->count = (uint64_t)(uintptr_t)arg + 1;
    nvh_flush(pool, &root->count, sizeof root->count);
}

/* After sync, the media holds every group and every action's effect. */
static void sync_makes_everything_durable(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-sync", NVH_DOMAIN_SIM, &path);
    gt_root *root = nvh_root(pool, NULL);
    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    for (int m = NVH_GROUP_REAL; m <= NVH_GROUP_SIM_LOWER; m++) {
        nvh_group_options o = {.model = (nvh_group_model)m, .batch_count = 1000, .slots = 1000,
                               .batch_ns = NVH_GROUP_NEVER, .cache_lines = 3};
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        for (uint64_t i = 0; i < 30; i++) {
            assert_int_equal(nvh_group_begin(g), NVH_OK);
            gt_fill(&root->rec[i], i, (uint64_t)m);
            assert_int_equal(nvh_group_add(g, &root->rec[i], sizeof root->rec[i]), NVH_OK);
            assert_int_equal(nvh_group_end(g, publish_count, (void *)(uintptr_t)i), NVH_OK);
        }
        assert_int_equal(nvh_group_sync(g), NVH_OK);
        /* whatever the seed, the image equals the working copy for them */
        for (uint64_t seed = 1; seed <= 3; seed++) {
            assert_int_equal(nvh_sim_write_image(pool, image, seed, NVH_CRASH_WORDS), NVH_OK);
            size_t len;
            unsigned char *img = test_read_file(image, &len);
            const unsigned char *base = nvh_pool_base(pool);
            size_t off = (size_t)((const unsigned char *)root - base);
            assert_memory_equal(img + off, root, sizeof(uint64_t));
            assert_int_equal(*(uint64_t *)(img + off), 30);
            assert_memory_equal(img + off + 64, root->rec, 30 * sizeof(gt_record));
            free(img);
        }
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    }
    unlink(image);
    gt_pool_destroy(pool, path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fences_process),
        cmocka_unit_test(fences_sim),
        cmocka_unit_test(fences_msync),
        cmocka_unit_test(fences_pmem),
        cmocka_unit_test(defaults_are_cheap),
        cmocka_unit_test(age_limit),
        cmocka_unit_test(ring_full_fallback),
        cmocka_unit_test(sync_makes_everything_durable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
