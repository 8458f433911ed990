/* test_group_sim.c — the simulated cache-line-counter models and property
 * tests over all models.
 *
 *   SIM_LOWER  (transient states last forever): no action before sync, no
 *              flush, no fence; sync runs them all.
 *   SIM_UPPER  (transient states end at once): every action at its end, no
 *              flush, no fence (one per begin with sgroup_fence).
 *   SIM_CACHE  exact counters: with LRU and 2 lines per group in an 8-line
 *              cache, each action runs exactly 4 groups later; a line already
 *              dirty does not count for a later group ([Moraru11] §5.1);
 *              random eviction is deterministic by seed.
 *   property   random workloads (random sizes, shared lines, random options,
 *              every model but UPPER) in the sim domain: actions exactly once,
 *              in order; when an action runs, a fence has followed its
 *              group's last add and its bytes are in a crash image built at
 *              that moment (adversarial word mode).
 */
#include "group_test.h"

gt_log *gt_current_log;
static gt_log g_log;

static void reset_log(nvh_pool *pool)
{
    memset(&g_log, 0, sizeof g_log);
    g_log.expect_pool = pool;
    gt_current_log = &g_log;
}

/* A line-aligned 64-byte cell in the root area (line 1 + i). */
static inline uint64_t *cell(nvh_pool *pool, unsigned i)
{
    return (uint64_t *)((char *)nvh_root(pool, NULL) + NVH_CACHELINE * (1 + i));
}

static void group_of_cells(nvh_group_ctx *g, nvh_pool *pool, unsigned first, unsigned n,
                           uint64_t id)
{
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    for (unsigned k = 0; k < n; k++) {
        *cell(pool, first + k) = id;
        assert_int_equal(nvh_group_add(g, cell(pool, first + k), 8), NVH_OK);
    }
    assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)id), NVH_OK);
}

/* ---------------------------------------------------------------------------
 * Bounds
 * ------------------------------------------------------------------------- */
static void lower_bound_waits_for_sync(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-lower", NVH_DOMAIN_SIM, &path);
    reset_log(pool);
    nvh_group_options o = {.model = NVH_GROUP_SIM_LOWER, .slots = 1000};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < 300; i++) {
        group_of_cells(g, pool, i % 200, 2, i);
        assert_int_equal(nvh_group_poll(g), 0);
    }
    assert_int_equal(g_log.n, 0);                 /* not one, however long we go */
    assert_int_equal(nvh_group_pending(g), 300);
    nvh_stats ps;
    nvh_stats_get(pool, &ps);
    assert_int_equal(ps.fences, 0);
    assert_int_equal(ps.lines_flushed, 0);
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    assert_int_equal(g_log.n, 300);
    for (unsigned i = 0; i < 300; i++) assert_int_equal(g_log.id[i], i);
    nvh_stats_get(pool, &ps);
    assert_int_equal(ps.fences, 2);
    assert_int_equal(ps.lines_flushed, 201);      /* distinct dirty lines, once each */
    nvh_group_stats st;
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.delay_groups, 300 * 299 / 2);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void upper_bound_runs_at_once(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-upper", NVH_DOMAIN_SIM, &path);
    for (int sgroup = 0; sgroup <= 1; sgroup++) {
        reset_log(pool);
        nvh_group_options o = {.model = NVH_GROUP_SIM_UPPER, .sgroup_fence = sgroup};
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        nvh_stats_reset(pool);
        for (unsigned i = 0; i < 100; i++) {
            group_of_cells(g, pool, i % 50, 3, i);
            assert_int_equal(g_log.n, i + 1);       /* ran inside end */
            assert_int_equal(g_log.id[i], i);
            assert_int_equal(nvh_group_pending(g), 0);
        }
        nvh_stats ps;
        nvh_stats_get(pool, &ps);
        assert_int_equal(ps.lines_flushed, 0);
        assert_int_equal(ps.fences, sgroup ? 100 : 0);
        nvh_group_stats st;
        nvh_group_stats_get(g, &st);
        assert_int_equal(st.delay_groups, 0);
        assert_int_equal(st.lines_added, 300);
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    }
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Exact counters
 * ------------------------------------------------------------------------- */
static void cache_lru_exact_delay(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-lru", NVH_DOMAIN_SIM, &path);
    reset_log(pool);
    nvh_group_options o = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 8, .slots = 100};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < 50; i++) {
        group_of_cells(g, pool, 2 * i, 2, i);    /* two fresh lines per group */
        /* group j's lines are the LRU ones when group j + 4 adds its own */
        assert_int_equal(g_log.n, i >= 4 ? i - 3 : 0);
    }
    for (unsigned i = 0; i < g_log.n; i++) assert_int_equal(g_log.id[i], i);
    nvh_group_stats st;
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.evictions, 2 * 46);
    assert_int_equal(st.fences, 46);              /* one acknowledging fence per action */
    assert_int_equal(st.delay_groups, 4 * 46);
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    assert_int_equal(g_log.n, 50);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void cache_already_dirty_line_not_counted(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-tag", NVH_DOMAIN_SIM, &path);
    reset_log(pool);
    nvh_group_options o = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 2};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    group_of_cells(g, pool, 0, 2, 0);             /* A: L0, L1 */
    group_of_cells(g, pool, 0, 1, 1);             /* B: L0 again (tagged A): counter 0 */
    assert_int_equal(g_log.n, 0);                 /* B waits behind A */
    group_of_cells(g, pool, 2, 1, 2);             /* C: L2 evicts L1 (LRU) */
    assert_int_equal(g_log.n, 0);
    group_of_cells(g, pool, 3, 1, 3);             /* D: L3 evicts L0: A is clean */
    assert_int_equal(g_log.n, 2);                 /* A, then B at once; C still dirty */
    assert_int_equal(g_log.id[0], 0);
    assert_int_equal(g_log.id[1], 1);
    /* B's store to L0 rode on A's write-back: it is in the media */
    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    assert_int_equal(nvh_sim_write_image(pool, image, 7, NVH_CRASH_WORDS), NVH_OK);
    size_t len;
    unsigned char *img = test_read_file(image, &len);
    size_t off = (size_t)((char *)cell(pool, 0) - (char *)nvh_pool_base(pool));
    assert_int_equal(*(uint64_t *)(img + off), 1);
    free(img);
    unlink(image);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

/* The action timings of a random-eviction run: when (in groups ended) each
 * action ran. */
static void random_timings(nvh_pool *pool, uint64_t seed, uint64_t *when, unsigned n)
{
    reset_log(pool);
    nvh_group_options o = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 6,
                           .evict = NVH_GROUP_EVICT_RANDOM, .seed = seed, .slots = 200};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    uint64_t done = 0;
    for (unsigned i = 0; i < n; i++) {
        group_of_cells(g, pool, (i * 3) % 150, 3, i);
        while (done < g_log.n) when[done++] = i;
    }
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    while (done < g_log.n) when[done++] = n;
    assert_int_equal(g_log.n, n);
    for (unsigned i = 0; i < n; i++) assert_int_equal(g_log.id[i], i);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
}

static void cache_random_deterministic(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-rnd", NVH_DOMAIN_SIM, &path);
    enum { N = 120 };
    uint64_t a[N], b[N], c[N];
    random_timings(pool, 42, a, N);
    random_timings(pool, 42, b, N);
    random_timings(pool, 43, c, N);
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, c, sizeof a) != 0);
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Property test
 * ------------------------------------------------------------------------- */
typedef struct prop_group {
    uint32_t off, len;          /* bytes of this group, from the pool base  */
    uint64_t fence_after_add;   /* sim fence count after its last add       */
    unsigned char sum;          /* content marker                           */
} prop_group;

typedef struct prop_state {
    nvh_pool *pool;
    prop_group grp[400];
    uint64_t ran;               /* actions run so far                       */
    uint64_t image_checks;
    char image[600];
} prop_state;

static prop_state g_prop;

static unsigned char prop_byte(uint64_t id, uint32_t k) { return (unsigned char)(id * 31 + k * 7 + 1); }

static void prop_action(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)ctx;
    uint64_t id = (uint64_t)(uintptr_t)arg;
    prop_state *p = &g_prop;
    assert_int_equal(id, p->ran);                        /* exactly once, in order */
    p->ran++;
    prop_group *gr = &p->grp[id];
    if (gr->len == 0) return;
    assert_true(nvh_sim_fence_count(pool) > gr->fence_after_add);
    if (id % (GT_TSAN ? 40 : 8) != 0) return;            /* sample the costly check */
    assert_int_equal(nvh_sim_write_image(pool, p->image, 1000 + id, NVH_CRASH_WORDS), NVH_OK);
    size_t len;
    unsigned char *img = test_read_file(p->image, &len);
    for (uint32_t k = 0; k < gr->len; k++) {
        if (img[gr->off + k] != prop_byte(id, k)) {
            fprintf(stderr, "group %llu byte %u not durable when its action ran\n",
                    (unsigned long long)id, k);
            fail();
        }
    }
    free(img);
    p->image_checks++;
}

static void property_random_workloads(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-prop", NVH_DOMAIN_SIM, &path);
    char *base = nvh_pool_base(pool);
    char *root = nvh_root(pool, NULL);
    uint64_t root_size;
    nvh_root(pool, &root_size);
    snprintf(g_prop.image, sizeof g_prop.image, "%s.img", path);
    uint64_t rng = 20261122;
    for (int run = 0; run < 12; run++) {
        nvh_group_options o = {
            .model = (nvh_group_model)(run % 3),          /* REAL, CACHE, LOWER */
            .slots = 1 + (unsigned)(test_rand(&rng) % 40),
            .batch_count = 1 + (unsigned)(test_rand(&rng) % 50),
            .batch_ns = NVH_GROUP_NEVER,
            .cache_lines = 1 + test_rand(&rng) % 64,
            .evict = (nvh_group_evict)(test_rand(&rng) % 2),
            .seed = test_rand(&rng),
        };
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        assert_non_null(g);
        memset(&g_prop.grp, 0, sizeof g_prop.grp);
        g_prop.pool = pool;
        g_prop.ran = 0;
        uint64_t pos = 0, n = 0;
        while (n < 400) {
            uint32_t len = (uint32_t)(test_rand(&rng) % 300);
            uint32_t gap = (uint32_t)(test_rand(&rng) % 3 == 0 ? test_rand(&rng) % 100 : 0);
            if (pos + gap + len > root_size) break;
            pos += gap;
            prop_group *gr = &g_prop.grp[n];
            gr->off = (uint32_t)(root + pos - base);
            gr->len = len;
            assert_int_equal(nvh_group_begin(g), NVH_OK);
            /* the range in one to three adds, in random order of pieces */
            uint32_t cut1 = len ? (uint32_t)(test_rand(&rng) % (len + 1)) : 0;
            for (uint32_t k = 0; k < len; k++) root[pos + k] = (char)prop_byte(n, k);
            assert_int_equal(nvh_group_add(g, root + pos + cut1, len - cut1), NVH_OK);
            assert_int_equal(nvh_group_add(g, root + pos, cut1), NVH_OK);
            gr->fence_after_add = nvh_sim_fence_count(pool);
            assert_int_equal(nvh_group_end(g, prop_action, (void *)(uintptr_t)n), NVH_OK);
            pos += len;
            n++;
            if (test_rand(&rng) % 50 == 0) assert_int_equal(nvh_group_sync(g), NVH_OK);
            else if (test_rand(&rng) % 10 == 0) assert_true(nvh_group_poll(g) >= 0);
            assert_true(nvh_group_pending(g) <= o.slots);
        }
        assert_int_equal(nvh_group_sync(g), NVH_OK);
        assert_int_equal(g_prop.ran, n);
        nvh_group_stats st;
        nvh_group_stats_get(g, &st);
        assert_int_equal(st.groups, n);
        assert_int_equal(st.actions, n);
        assert_true(st.max_pending <= o.slots);
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
        /* clear the root for the next run (not part of any group) */
        memset(root, 0, root_size);
        nvh_persist(pool, root, root_size);
    }
    assert_true(g_prop.image_checks > (GT_TSAN ? 10u : 60u));
    unlink(g_prop.image);
    gt_pool_destroy(pool, path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lower_bound_waits_for_sync),
        cmocka_unit_test(upper_bound_runs_at_once),
        cmocka_unit_test(cache_lru_exact_delay),
        cmocka_unit_test(cache_already_dirty_line_not_counted),
        cmocka_unit_test(cache_random_deterministic),
        cmocka_unit_test(property_random_workloads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
