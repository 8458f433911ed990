/* test_group_threads.c — several threads on one pool, each with its own
 * group context (the documented model): every thread's actions run exactly
 * once and in its own begin order, the pool's fence counter equals the sum
 * of the contexts' fences, and after destroy every record and every count is
 * in place (and, in the sim domain, in the media: reopened after a clean
 * close). Meant to be clean under TSan.
 *
 * In the sim domain a flush snapshots whole lines, so the threads' regions
 * are line-disjoint (see tests/persist/test_persist_threads.c). */
#include "group_test.h"

#include <pthread.h>

gt_log *gt_current_log;

#define THREADS 4
#define PER_THREAD 250
#define REGION_RECORDS (GT_MAX_RECORDS / THREADS)   /* 300 >= PER_THREAD */

typedef struct worker {
    nvh_pool *pool;
    unsigned id;
    nvh_group_model model;
    uint64_t *count;             /* this thread's published count (own line) */
    gt_record *rec;              /* this thread's records                     */
    uint64_t ran;                /* actions run, checked for order            */
    int errors;
    uint64_t fences;             /* the context's fences                      */
} worker;

static void publish(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    worker *w = arg;
    if (nvh_group_pool(ctx) != pool) w->errors++;
    uint64_t i = w->ran++;
    if (*w->count != i || !gt_intact(&w->rec[i], i)) w->errors++;
    *w->count = i + 1;
    nvh_flush(pool, w->count, sizeof *w->count);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    nvh_group_options o = {.model = w->model, .batch_count = 3 + w->id, .slots = 8,
                           .cache_lines = 16, .evict = NVH_GROUP_EVICT_RANDOM,
                           .seed = w->id + 1};
    nvh_group_ctx *g = nvh_group_ctx_create(w->pool, &o);
    if (!g) {
        w->errors++;
        return NULL;
    }
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        gt_record *r = &w->rec[i];
        if (nvh_group_begin(g) != NVH_OK) w->errors++;
        gt_fill(r, i, 0);
        if (nvh_group_add(g, r, sizeof *r) != NVH_OK) w->errors++;
        if (nvh_group_end(g, publish, w) != NVH_OK) w->errors++;
        if (i % 50 == 49 && nvh_group_sync(g) != NVH_OK) w->errors++;
    }
    nvh_group_stats st;
    if (nvh_group_sync(g) != NVH_OK) w->errors++;
    nvh_group_stats_get(g, &st);
    w->fences = st.fences;
    if (st.actions != PER_THREAD) w->errors++;
    if (nvh_group_ctx_destroy(g) != NVH_OK) w->errors++;
    return NULL;
}

/* Thread t's line-aligned region of the root: its count line, then its
 * records (REGION_RECORDS * 208 B is a multiple of 64). */
static void layout(nvh_pool *pool, worker *w, unsigned t)
{
    char *root = nvh_root(pool, NULL);
    size_t region = NVH_CACHELINE + REGION_RECORDS * sizeof(gt_record);
    w->count = (uint64_t *)(root + t * region);
    w->rec = (gt_record *)(root + t * region + NVH_CACHELINE);
}

static void threads_in(nvh_domain domain, nvh_group_model model)
{
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-thr", domain, &path);
    _Static_assert((REGION_RECORDS * sizeof(gt_record)) % NVH_CACHELINE == 0, "line-disjoint");
    _Static_assert(THREADS * (NVH_CACHELINE + REGION_RECORDS * sizeof(gt_record)) <= GT_ROOT_SIZE,
                   "regions fit the root");
    _Static_assert(PER_THREAD <= REGION_RECORDS, "records fit the region");
    worker w[THREADS];
    pthread_t t[THREADS];
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < THREADS; i++) {
        w[i] = (worker){.pool = pool, .id = i, .model = model};
        layout(pool, &w[i], i);
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    uint64_t fences = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].errors, 0);
        assert_int_equal(w[i].ran, PER_THREAD);
        fences += w[i].fences;
    }
    assert_int_equal(gt_pool_fences(pool), fences);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* what the threads made durable is there after reopening */
    pool = nvh_pool_open(path, GT_LAYOUT, domain);
    assert_non_null(pool);
    for (unsigned i = 0; i < THREADS; i++) {
        worker r;
        layout(pool, &r, i);
        assert_int_equal(*r.count, PER_THREAD);
        for (uint64_t k = 0; k < PER_THREAD; k++) assert_true(gt_intact(&r.rec[k], k));
    }
    gt_pool_destroy(pool, path);
}

static void threads_process_real(void **state) { (void)state; threads_in(NVH_DOMAIN_PROCESS, NVH_GROUP_REAL); }
static void threads_sim_real(void **state) { (void)state; threads_in(NVH_DOMAIN_SIM, NVH_GROUP_REAL); }
static void threads_sim_cache(void **state) { (void)state; threads_in(NVH_DOMAIN_SIM, NVH_GROUP_SIM_CACHE); }
static void threads_process_upper(void **state) { (void)state; threads_in(NVH_DOMAIN_PROCESS, NVH_GROUP_SIM_UPPER); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_process_real),
        cmocka_unit_test(threads_sim_real),
        cmocka_unit_test(threads_sim_cache),
        cmocka_unit_test(threads_process_upper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
