/* test_hashmap_crash.c — crash consistency of the persistent hash map under
 * the crash simulator (nvh_crash_explore):
 *   - a crash at EVERY fence of small maps that start with 2 buckets and
 *     double several times (puts, inserts, updates, deletes; line and
 *     adversarial word modes, 2 images per fence);
 *   - sampled crashes over a run of 10^5 operations;
 * and, after each recovery, the checker demands:
 *   - nvh_hmap_open + nvh_hmap_check succeed (every invariant);
 *   - the recovered map equals the model after a prefix of the operation
 *     stream at least as long as the acknowledged prefix (the op in flight
 *     happened entirely or not at all; nothing acknowledged is lost);
 *   - no leak: the heap holds exactly the root, the segments and one object
 *     per entry;
 *   - the map keeps working (more operations, then check again);
 * and across the crash points of one run (monotonicity): a point taken after
 * a later acknowledgement never recovers a shorter prefix. */
#include "hm_model.h"
#include "ds/hashmap.h"        /* white-box: a key's writer stripe, the test hook */

#include <sys/mman.h>

#define LAYOUT "hmcrash"

/* ---------------------------------------------------------------------------
 * The run (inherited by the forked checkers)
 * ------------------------------------------------------------------------- */
typedef struct run_cfg {
    uint64_t seed;
    uint32_t nkeys;
    unsigned ops;
    unsigned del_pct;
} run_cfg;

static run_cfg g_run;
static volatile unsigned g_acked;        /* operations that returned */

typedef struct point_rec {
    int64_t acked;                       /* -1: not tested */
    int64_t p_min, p_max;                /* recovered prefix over the images */
} point_rec;
#define MAX_POINTS (1u << 20)
static point_rec *g_points;              /* MAP_SHARED: written by the children */
static int *g_complaints;

static int hm_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_off_t *slot = nvh_root(pool, NULL);
    nvh_hmap *m = nvh_hmap_open(pool, slot[0]);
    if (!m) return 1;
    uint32_t *ver = calloc(g_run.nkeys, sizeof *ver), clock = 0;
    uint64_t rng = g_run.seed;
    g_acked = 0;
    for (unsigned i = 0; i < g_run.ops; i++) {
        hm_op op = hm_next_op(&rng, g_run.nkeys, g_run.del_pct);
        int want = hm_model_apply(ver, &clock, op);
        int got = hm_map_apply(m, op, ver[op.id]);
        if (got != want) {
            fprintf(stderr, "workload: op %u rc %d, model %d: %s\n", i, got, want, nvh_errormsg());
            free(ver);
            return 1;
        }
        g_acked = i + 1;
    }
    free(ver);
    return nvh_hmap_close(m);
}

/* ---------------------------------------------------------------------------
 * Several updates in flight (writers of different stripes), single-threaded
 * so every fence is deterministic: each update, after its activation fence
 * and before the free that retires its old entry (nvh_hm_test_hook_), runs
 * the stream's next operation inside it when that key's stripe is above
 * the enclosing updates' stripes, up to 3 deep — so crashes find 1, 2
 * or 3 pending slots set at once. The enclosing update is durable at its
 * hook (its activation was fenced), so it counts as acknowledged there:
 * stream order = the order the operations took effect.
 * ------------------------------------------------------------------------- */
static struct {
    nvh_hmap *m;
    uint32_t *ver, clock;
    uint64_t rng;
    unsigned next;                /* index of the stream's next operation */
    unsigned depth, max_depth;
    uint64_t held[4];             /* stripes of the enclosing updates */
    int bad;
} g_nest;

static uint64_t key_stripe(nvh_hmap *m, uint32_t id)
{
    uint8_t k[HM_KEYBUF];
    size_t kl = hm_key(id, k);
    return hm_h63(hm_hash(m->seed, k, kl)) & (m->nstripes - 1);
}

static void nest_op(void)
{
    unsigned i = g_nest.next++;
    hm_op op = hm_next_op(&g_nest.rng, g_run.nkeys, g_run.del_pct);
    g_nest.held[g_nest.depth++] = key_stripe(g_nest.m, op.id);
    if (g_nest.depth > g_nest.max_depth) g_nest.max_depth = g_nest.depth;
    int want = hm_model_apply(g_nest.ver, &g_nest.clock, op);
    int got = hm_map_apply(g_nest.m, op, g_nest.ver[op.id]);
    g_nest.depth--;
    if (got != want) {
        fprintf(stderr, "nested workload: op %u rc %d, model %d: %s\n", i, got, want,
                nvh_errormsg());
        g_nest.bad = 1;
    }
    if (g_acked < i + 1) g_acked = i + 1;
}

static void nest_hook(void)
{
    if (g_acked < g_nest.next) g_acked = g_nest.next;     /* the enclosing update is durable */
    if (g_nest.depth >= 3 || g_nest.next >= g_run.ops || g_nest.bad) return;
    /* peek: the next operation's key must be of a stripe above every one
     * the enclosing updates hold (stripe locks nest in one order, as TSan's
     * lock-order check demands even of a single thread) */
    uint64_t rng = g_nest.rng;
    hm_op op = hm_next_op(&rng, g_run.nkeys, g_run.del_pct);
    uint64_t s = key_stripe(g_nest.m, op.id);
    for (unsigned d = 0; d < g_nest.depth; d++)
        if (g_nest.held[d] >= s) return;
    nest_op();
}

static int hm_workload_nested(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_off_t *slot = nvh_root(pool, NULL);
    g_nest.m = nvh_hmap_open(pool, slot[0]);
    if (!g_nest.m) return 1;
    g_nest.ver = calloc(g_run.nkeys, sizeof *g_nest.ver);
    g_nest.clock = 0;
    g_nest.rng = g_run.seed;
    g_nest.next = g_nest.depth = g_nest.max_depth = 0;
    g_nest.bad = 0;
    g_acked = 0;
    nvh_hm_test_hook_ = nest_hook;
    while (g_nest.next < g_run.ops && !g_nest.bad) nest_op();
    nvh_hm_test_hook_ = NULL;
    free(g_nest.ver);
    /* the run must have had 3 updates in flight at once (slots 0, 1, 2) */
    if (g_nest.max_depth < 3) {
        fprintf(stderr, "nested workload: at most %u operations in flight\n", g_nest.max_depth);
        return 1;
    }
    return g_nest.bad ? 1 : nvh_hmap_close(g_nest.m);
}

/* Model after the first n operations. */
static void model_prefix(unsigned n, uint32_t *ver)
{
    uint32_t clock = 0;
    uint64_t rng = g_run.seed;
    memset(ver, 0, g_run.nkeys * sizeof *ver);
    for (unsigned i = 0; i < n; i++) {
        hm_op op = hm_next_op(&rng, g_run.nkeys, g_run.del_pct);
        hm_model_apply(ver, &clock, op);
    }
}

static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld) %s\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what, a, b,
                nvh_errormsg());
    return rc;
}

static int hm_check_image(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_hm_test_hook_ = NULL;            /* forked from the nested workload */
    unsigned acked = g_acked;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return complain(pt, 2, "pool open failed", 0, 0);
    nvh_off_t *slot = nvh_root(pool, NULL);
    nvh_hmap *m = nvh_hmap_open(pool, slot[0]);
    if (!m) return complain(pt, 3, "map open failed", 0, 0);
    nvh_hmap_stats st;
    if (nvh_hmap_check(m, &st) != NVH_OK) return complain(pt, 4, "invariant", 0, 0);

    uint32_t *ver = calloc(g_run.nkeys, sizeof *ver);
    int64_t p = -1;
    model_prefix(acked, ver);
    if (hm_equals_model(m, ver, g_run.nkeys)) p = acked;
    if (p < 0 && acked < g_run.ops) {
        model_prefix(acked + 1, ver);
        if (hm_equals_model(m, ver, g_run.nkeys)) p = acked + 1;
    }
    int rc = 0;
    if (p < 0) rc = complain(pt, 5, "recovered state is no prefix >= acknowledged", acked, (long)st.count);
    uint64_t objs = hm_heap_objects(pool);
    if (!rc && objs != 1 + st.segments + st.count)
        rc = complain(pt, 6, "leak or loss: heap objects != root + segments + entries", (long)objs,
                      (long)(1 + st.segments + st.count));
    /* the recovered map keeps working */
    if (!rc) {
        uint32_t clock = 1u << 30;
        uint64_t rng = pt->seed ^ 0x5555;
        for (int i = 0; i < 20 && !rc; i++) {
            hm_op op = hm_next_op(&rng, g_run.nkeys, 30);
            int want = hm_model_apply(ver, &clock, op);
            if (hm_map_apply(m, op, ver[op.id]) != want)
                rc = complain(pt, 7, "operation after recovery", i, op.id);
        }
        if (!rc && (nvh_hmap_check(m, NULL) != NVH_OK || !hm_equals_model(m, ver, g_run.nkeys)))
            rc = complain(pt, 8, "map after more operations", 0, 0);
    }
    free(ver);
    if (!rc && pt->fence < MAX_POINTS) {
        point_rec *r = &g_points[pt->fence];
        __atomic_store_n(&r->acked, acked, __ATOMIC_RELAXED);
        int64_t cur;
        while ((cur = __atomic_load_n(&r->p_min, __ATOMIC_RELAXED)) > p &&
               !__atomic_compare_exchange_n(&r->p_min, &cur, p, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
        while ((cur = __atomic_load_n(&r->p_max, __ATOMIC_RELAXED)) < p &&
               !__atomic_compare_exchange_n(&r->p_max, &cur, p, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    }
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Driver
 * ------------------------------------------------------------------------- */
static const char *fresh_pool(unsigned base, unsigned pct)
{
    const char *path = test_path("hmcrash");
    nvh_pool_options o = {.root_size = 4096, .max_size = 256 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_hmap_options ho = {.initial_buckets_log2 = base, .max_load_pct = pct, .seed = 99};
    assert_int_equal(nvh_hmap_create(pool, nvh_root(pool, NULL), &ho), NVH_OK);
    assert_int_equal(nvh_heap_sync(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static nvh_crash_workload_fn g_workload = hm_workload;

static void run(run_cfg rc, unsigned base, unsigned pct, nvh_crash_mode mode, uint64_t budget,
                unsigned images)
{
    g_run = rc;
    const char *path = fresh_pool(base, pct);
    *g_complaints = 0;
    for (unsigned i = 0; i < MAX_POINTS; i++) g_points[i] = (point_rec){-1, INT64_MAX, -1};
    const char *deep = getenv("NVHEAP_TEST_DEEP");
    if (deep && budget) budget *= (uint64_t)strtoull(deep, NULL, 0);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = g_workload, .check = hm_check_image,
        .seed = rc.seed, .mode = mode, .budget = budget, .images_per_point = images,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    if (rep.failures) nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
    /* monotonicity across the crash points of this run */
    int64_t best_p = -1, best_acked = -1;
    unsigned tested = 0, inflight = 0;
    for (unsigned f = 0; f < MAX_POINTS && f <= rep.fences; f++) {
        point_rec *r = &g_points[f];
        if (r->acked < 0) continue;
        tested++;
        inflight += r->p_max > r->acked;
        if (r->acked > best_acked && best_p > r->p_min)
            fail_msg("monotonicity: fence %u recovered prefix %lld < %lld seen earlier",
                     f, (long long)r->p_min, (long long)best_p);
        if (r->acked > best_acked) best_acked = r->acked;
        if (r->p_max > best_p) best_p = r->p_max;
    }
    print_message("  %u ops: %llu fences, %llu images checked (%u points, %u recovered the op in"
                  " flight), 0 failures\n", rc.ops, (unsigned long long)rep.fences,
                  (unsigned long long)rep.points_tested, tested, inflight);
    unlink(path);
}

static void test_every_fence_lines(void **state)
{
    (void)state;
    run((run_cfg){11, 24, 70, 25}, 1, 100, NVH_CRASH_LINES, 0, 2);
}

static void test_every_fence_words(void **state)
{
    (void)state;
    run((run_cfg){12, 24, 70, 25}, 1, 100, NVH_CRASH_WORDS, 0, 2);
}

/* updates and deletes of few keys: pending recovery at every fence */
static void test_every_fence_updates(void **state)
{
    (void)state;
    run((run_cfg){13, 6, 60, 20}, 1, 50, NVH_CRASH_LINES, 0, 2);
}

/* several updates in flight at once, each in its own pending slot (writers
 * of different stripes: 4 stripes of a 4-bucket map), crash at every fence,
 * both modes */
static void test_every_fence_nested(void **state)
{
    (void)state;
    g_workload = hm_workload_nested;
    run((run_cfg){16, 12, 80, 15}, 2, 100, NVH_CRASH_LINES, 0, 2);
    run((run_cfg){16, 12, 80, 15}, 2, 100, NVH_CRASH_WORDS, 0, 2);
    g_workload = hm_workload;
}

static void test_sampled_long(void **state)
{
    (void)state;
    run((run_cfg){14, 3000, 100000, 25}, 1, 100, NVH_CRASH_LINES, 120, 1);
}

static void test_sampled_long_words(void **state)
{
    (void)state;
    run((run_cfg){15, 500, 20000, 35}, 1, 100, NVH_CRASH_WORDS, 80, 1);
}

int main(void)
{
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_points = mmap(NULL, MAX_POINTS * sizeof(point_rec), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_complaints == MAP_FAILED || g_points == MAP_FAILED) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_fence_lines), cmocka_unit_test(test_every_fence_words),
        cmocka_unit_test(test_every_fence_updates), cmocka_unit_test(test_every_fence_nested),
        cmocka_unit_test(test_sampled_long),
        cmocka_unit_test(test_sampled_long_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
