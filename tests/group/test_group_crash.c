/* test_group_crash.c — persist groups under nvh_crash_explore.
 *
 * The workload writes 208-byte records (straddling lines, neighbours sharing
 * one) in groups; each group's action publishes its record, in one of two
 * ways:
 *   COUNT  bump a persisted count (records below it are published)
 *   KEY    write the record's validation key ([Moraru11] §6, change 2)
 * and syncs every few groups (what a sync returned is acknowledged). The
 * checker opens every crash image and demands: every published record is
 * intact, the count never exceeds what was written, everything acknowledged
 * by a sync is published.
 *
 * Crashes are taken at every fence, in line and in adversarial word mode,
 * for the REAL model (count and size batching, ring-full fallback), the
 * simulated cache (LRU and random eviction) and SIM_LOWER; long runs are
 * sampled. Two broken set-ups must be caught: a workload publishing before
 * the fence (the action's effect run eagerly at end), and SIM_UPPER, which
 * is a throughput bound, not a crash-consistent model.
 */
#include "group_test.h"

#include <dirent.h>

gt_log *gt_current_log;

typedef enum publish_kind { PUB_COUNT, PUB_KEY } publish_kind;
typedef enum variant { CORRECT, EAGER } variant;

typedef struct workload_cfg {
    nvh_group_options opt;
    publish_kind pub;
    variant var;
    unsigned groups;
    unsigned sync_every;          /* 0 = only the final destroy */
} workload_cfg;

/* What the workload had acknowledged; volatile: stored before the next fence,
 * where the crash child (a fork) reads it. */
static volatile uint64_t g_synced;
static volatile uint64_t g_written;
static int *g_complaints;         /* shared with the children: caps messages */
static int g_order_errors;

/* ---------------------------------------------------------------------------
 * The workload
 * ------------------------------------------------------------------------- */
static void publish(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)ctx;
    /* arg packs the record index (low half) and how to publish it */
    uint64_t i = (uint64_t)(uintptr_t)arg & 0xFFFFFFFF;
    publish_kind pub = (publish_kind)((uint64_t)(uintptr_t)arg >> 32);
    gt_root *root = nvh_root(pool, NULL);
    if (pub == PUB_COUNT) {
        if (root->count != i) g_order_errors++;        /* actions in order */
        root->count = i + 1;
        nvh_flush(pool, &root->count, sizeof root->count);
    } else {
        if (i > 0 && root->rec[i - 1].key != gt_key(i - 1)) g_order_errors++;
        root->rec[i].key = gt_key(i);
        nvh_flush(pool, &root->rec[i].key, sizeof root->rec[i].key);
    }
}

static int group_workload(nvh_pool *pool, void *arg)
{
    const workload_cfg *cfg = arg;
    gt_root *root = nvh_root(pool, NULL);
    g_synced = 0;
    g_written = 0;
    g_order_errors = 0;
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &cfg->opt);
    if (!g) return 1;
    for (uint64_t i = 0; i < cfg->groups; i++) {
        void *arg_i = (void *)(uintptr_t)(i | ((uint64_t)cfg->pub << 32));
        if (nvh_group_begin(g) != NVH_OK) return 2;
        g_written = i + 1;
        gt_fill(&root->rec[i], i, 0);
        if (nvh_group_add(g, &root->rec[i], sizeof root->rec[i]) != NVH_OK) return 3;
        if (cfg->var == EAGER) {
            /* BUG: publishes before any fence made the record durable */
            if (nvh_group_end(g, NULL, NULL) != NVH_OK) return 4;
            publish(pool, g, arg_i);
        } else if (nvh_group_end(g, publish, arg_i) != NVH_OK) {
            return 4;
        }
        if (cfg->sync_every && (i + 1) % cfg->sync_every == 0) {
            if (nvh_group_sync(g) != NVH_OK) return 5;
            g_synced = i + 1;
        }
    }
    if (nvh_group_ctx_destroy(g) != NVH_OK) return 6;
    g_synced = cfg->groups;
    return g_order_errors ? 7 : 0;
}

/* ---------------------------------------------------------------------------
 * The checker
 * ------------------------------------------------------------------------- */
static int complain(const nvh_crash_point *pt, int rc, const char *what, uint64_t a, uint64_t b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 3)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%llu, %llu)\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what,
                (unsigned long long)a, (unsigned long long)b);
    return rc;
}

static int group_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    const workload_cfg *cfg = arg;
    nvh_pool *pool = nvh_pool_open(image, GT_LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    const gt_root *root = nvh_root(pool, NULL);
    int rc = 0;
    if (cfg->pub == PUB_COUNT) {
        uint64_t n = root->count;
        if (n > g_written) rc = complain(pt, 3, "count beyond the records written", n, g_written);
        else if (n < g_synced) rc = complain(pt, 4, "synced records lost", n, g_synced);
        for (uint64_t i = 0; i < n && !rc; i++)
            if (!gt_intact(&root->rec[i], i)) rc = complain(pt, 5, "published record torn", i, n);
    } else {
        for (uint64_t i = 0; i < GT_MAX_RECORDS && !rc; i++) {
            uint64_t key = root->rec[i].key;
            if (key == gt_key(i)) {
                if (!gt_intact(&root->rec[i], i))
                    rc = complain(pt, 5, "validated record torn", i, 0);
            } else if (key != 0) {
                rc = complain(pt, 6, "garbage key", i, key);
            } else if (i < g_synced) {
                rc = complain(pt, 4, "synced record not validated", i, g_synced);
            }
        }
    }
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Harness
 * ------------------------------------------------------------------------- */
static const char *g_scratch;

static const char *fresh_pool(void)
{
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-crash", NVH_DOMAIN_PROCESS, &path);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static nvh_crash_report explore(workload_cfg *cfg, nvh_crash_mode mode, unsigned images,
                                uint64_t budget, uint64_t seed)
{
    const char *path = fresh_pool();
    *g_complaints = 0;
    nvh_crash_config cc = {
        .pool_path = path, .layout = GT_LAYOUT, .workload = group_workload,
        .check = group_check, .arg = cfg, .seed = seed, .mode = mode,
        .budget = budget, .images_per_point = images, .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cc, &rep), NVH_OK);
    unlink(path);
    return rep;
}

static void expect_clean(workload_cfg *cfg, const char *what, unsigned images, uint64_t budget,
                         uint64_t min_fences)
{
    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        nvh_crash_report rep = explore(cfg, (nvh_crash_mode)mode, images, budget, 77 + mode);
        printf("  %-34s %s: %3llu fences, %4llu images, %llu failures\n", what,
               mode == NVH_CRASH_LINES ? "lines" : "words", (unsigned long long)rep.fences,
               (unsigned long long)rep.points_tested, (unsigned long long)rep.failures);
        if (rep.failures) nvh_crash_report_print(&rep, stderr);
        assert_int_equal(rep.workload_status, 0);
        assert_int_equal(rep.failures, 0);
        assert_true(rep.fences >= min_fences);
        uint64_t points = rep.fences + 1;                /* every fence + the end */
        if (budget && budget < points) points = budget;
        assert_int_equal(rep.points_tested, images * points);
    }
}

static void expect_caught(workload_cfg *cfg, const char *what)
{
    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        nvh_crash_report rep = explore(cfg, (nvh_crash_mode)mode, GT_IMAGES(8), 0, 5 + mode);
        printf("  %-34s %s: %3llu fences, %4llu images, %llu failures (expected)\n", what,
               mode == NVH_CRASH_LINES ? "lines" : "words", (unsigned long long)rep.fences,
               (unsigned long long)rep.points_tested, (unsigned long long)rep.failures);
        assert_true(rep.failures > 0);
        /* a torn published record, found at a fence, not only at the end */
        int torn_at_fence = 0;
        for (uint64_t k = 0; k < rep.failures && k < 8; k++)
            if (rep.first[k].status == 5 && rep.first[k].point.fence < rep.fences)
                torn_at_fence = 1;
        assert_true(torn_at_fence);
    }
}

/* ---------------------------------------------------------------------------
 * Every fence
 * ------------------------------------------------------------------------- */
static void real_count(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.batch_count = 4, .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_COUNT, .groups = 24, .sync_every = 10};
    expect_clean(&cfg, "REAL batch 4, count", GT_IMAGES(4), 0, 8);
}

static void real_key_fallback(void **state)
{
    (void)state;
    /* batch 5 > slots 3: the ring fills and falls back */
    workload_cfg cfg = {.opt = {.batch_count = 5, .slots = 3, .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_KEY, .groups = 20, .sync_every = 7};
    expect_clean(&cfg, "REAL slots 3 (fallback), key", GT_IMAGES(4), 0, 6);
}

static void cache_lru_count(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 6,
                                .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_COUNT, .groups = 24, .sync_every = 9};
    expect_clean(&cfg, "SIM_CACHE lru 6 lines, count", GT_IMAGES(4), 0, 8);
}

static void cache_random_key(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 5,
                                .evict = NVH_GROUP_EVICT_RANDOM, .seed = 9, .slots = 8,
                                .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_KEY, .groups = 24, .sync_every = 11};
    expect_clean(&cfg, "SIM_CACHE random 5 lines, key", GT_IMAGES(4), 0, 8);
}

static void lower_count(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.model = NVH_GROUP_SIM_LOWER, .slots = 5,
                                .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_COUNT, .groups = 24, .sync_every = 13};
    expect_clean(&cfg, "SIM_LOWER slots 5, count", GT_IMAGES(4), 0, 4);
}

/* ---------------------------------------------------------------------------
 * Broken set-ups are caught
 * ------------------------------------------------------------------------- */
static void eager_publish_caught(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.batch_count = 4, .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_COUNT, .var = EAGER, .groups = 16, .sync_every = 0};
    expect_caught(&cfg, "BROKEN eager publish, count");
    cfg.pub = PUB_KEY;
    expect_caught(&cfg, "BROKEN eager publish, key");
}

static void upper_bound_not_consistent(void **state)
{
    (void)state;
    workload_cfg cfg = {.opt = {.model = NVH_GROUP_SIM_UPPER, .batch_ns = NVH_GROUP_NEVER},
                        .pub = PUB_COUNT, .groups = 16, .sync_every = 4};
    expect_caught(&cfg, "SIM_UPPER (a bound, not a model)");
}

/* ---------------------------------------------------------------------------
 * Long runs, sampled
 * ------------------------------------------------------------------------- */
static void sampled_long_runs(void **state)
{
    (void)state;
    workload_cfg real = {.opt = {.batch_count = 8, .slots = 16, .batch_ns = NVH_GROUP_NEVER},
                         .pub = PUB_COUNT, .groups = 1200, .sync_every = 250};
    expect_clean(&real, "REAL 1200 groups, sampled", GT_IMAGES(3), GT_TSAN ? 8 : 20, 150);
    workload_cfg cache = {.opt = {.model = NVH_GROUP_SIM_CACHE, .cache_lines = 40,
                                  .evict = NVH_GROUP_EVICT_RANDOM, .seed = 3, .slots = 32,
                                  .batch_ns = NVH_GROUP_NEVER},
                          .pub = PUB_KEY, .groups = 1200, .sync_every = 300};
    expect_clean(&cache, "SIM_CACHE 1200 groups, sampled", GT_IMAGES(3), GT_TSAN ? 8 : 20, 40);
}

static int setup(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof name, "grp-crash");
    const char *dir = getenv("NVHEAP_TEST_DIR");
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s-%d.d", dir && *dir ? dir : "/tmp", name, (int)getpid());
    mkdir(dir && *dir ? dir : "/tmp", 0700);
    mkdir(buf, 0700);
    g_scratch = buf;
    g_complaints = mmap(NULL, sizeof *g_complaints, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g_complaints != MAP_FAILED);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rmdir(g_scratch);        /* empty unless an image was kept */
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(real_count),
        cmocka_unit_test(real_key_fallback),
        cmocka_unit_test(cache_lru_count),
        cmocka_unit_test(cache_random_key),
        cmocka_unit_test(lower_count),
        cmocka_unit_test(eager_publish_caught),
        cmocka_unit_test(upper_bound_not_consistent),
        cmocka_unit_test(sampled_long_runs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
