/* test_group_api.c — every persist-group call and its errors: NULL
 * arguments, calls out of sequence, ranges outside the pool, bad options,
 * the wrong thread, re-entrant calls from actions; then the basic contract:
 * actions run exactly once in begin order, NULL actions, chained groups,
 * destroy with an open group, options and stats accessors. */
#include "group_test.h"

#include <pthread.h>

gt_log *gt_current_log;
static gt_log g_log;

static void reset_log(nvh_pool *pool)
{
    memset(&g_log, 0, sizeof g_log);
    g_log.expect_pool = pool;
    gt_current_log = &g_log;
}

/* ---------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------- */
static void null_arguments(void **state)
{
    (void)state;
    assert_null(nvh_group_ctx_create(NULL, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_int_equal(nvh_group_begin(NULL), NVH_E_INVAL);
    assert_int_equal(nvh_group_add(NULL, "x", 1), NVH_E_INVAL);
    assert_int_equal(nvh_group_end(NULL, NULL, NULL), NVH_E_INVAL);
    assert_int_equal(nvh_group_poll(NULL), NVH_E_INVAL);
    assert_int_equal(nvh_group_sync(NULL), NVH_E_INVAL);
    assert_int_equal(nvh_group_ctx_destroy(NULL), NVH_OK);          /* like free(NULL) */
    assert_int_equal(nvh_group_pending(NULL), 0);
    assert_null(nvh_group_pool(NULL));
    nvh_group_options o;
    assert_int_equal(nvh_group_options_get(NULL, &o), NVH_E_INVAL);
    nvh_group_stats st;
    memset(&st, 0xFF, sizeof st);
    nvh_group_stats_get(NULL, &st);
    assert_int_equal(st.groups, 0);
    nvh_group_stats_get(NULL, NULL);
    nvh_group_stats_reset(NULL);

    const char *path;
    nvh_pool *pool = gt_pool_create("grp-null", NVH_DOMAIN_PROCESS, &path);
    nvh_group_ctx *g = nvh_group_ctx_create(pool, NULL);
    assert_non_null(g);
    assert_int_equal(nvh_group_options_get(g, NULL), NVH_E_INVAL);
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    assert_int_equal(nvh_group_add(g, NULL, 8), NVH_E_INVAL);
    assert_int_equal(nvh_group_add(g, NULL, 0), NVH_E_INVAL);
    assert_int_equal(nvh_group_end(g, NULL, NULL), NVH_OK);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void out_of_sequence(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-seq", NVH_DOMAIN_PROCESS, &path);
    char *root = nvh_root(pool, NULL);
    nvh_group_ctx *g = nvh_group_ctx_create(pool, NULL);
    assert_non_null(g);

    assert_int_equal(nvh_group_end(g, NULL, NULL), NVH_E_INVAL);    /* end without begin */
    assert_non_null(strstr(nvh_errormsg(), "no group is open"));
    assert_int_equal(nvh_group_add(g, root, 8), NVH_E_INVAL);       /* add without begin */
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    assert_int_equal(nvh_group_begin(g), NVH_E_INVAL);              /* no nesting */
    assert_non_null(strstr(nvh_errormsg(), "already open"));
    assert_int_equal(nvh_group_sync(g), NVH_E_INVAL);               /* sync with one open */
    assert_int_equal(nvh_group_add(g, root, 8), NVH_OK);
    assert_int_equal(nvh_group_add(g, root, 0), NVH_OK);            /* empty range */
    assert_int_equal(nvh_group_end(g, NULL, NULL), NVH_OK);
    assert_int_equal(nvh_group_end(g, NULL, NULL), NVH_E_INVAL);    /* twice */
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void add_outside_pool(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-bad", NVH_DOMAIN_PROCESS, &path);
    char *base = nvh_pool_base(pool);
    uint64_t size = nvh_pool_size(pool);
    static char outside[128];
    nvh_group_ctx *g = nvh_group_ctx_create(pool, NULL);
    assert_int_equal(nvh_group_begin(g), NVH_OK);
    assert_int_equal(nvh_group_add(g, outside, 8), NVH_E_BADPTR);
    assert_non_null(strstr(nvh_errormsg(), "not inside pool"));
    assert_int_equal(nvh_group_add(g, base + size - 8, 16), NVH_E_BADPTR);  /* runs off the end */
    assert_int_equal(nvh_group_add(g, base - 64, 64), NVH_E_BADPTR);        /* before the base */
    assert_int_equal(nvh_group_add(g, base + size - 8, 8), NVH_OK);         /* last bytes */
    /* a failed add leaves the group usable */
    assert_int_equal(nvh_group_end(g, NULL, NULL), NVH_OK);
    nvh_group_stats st;
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.lines_added, 1);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void bad_options(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-opt", NVH_DOMAIN_PROCESS, &path);
    nvh_group_options o = {.model = (nvh_group_model)9};
    assert_null(nvh_group_ctx_create(pool, &o));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "model"));
    o = (nvh_group_options){.evict = (nvh_group_evict)7};
    assert_null(nvh_group_ctx_create(pool, &o));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    o = (nvh_group_options){.slots = NVH_GROUP_SLOTS_MAX + 1};
    assert_null(nvh_group_ctx_create(pool, &o));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);

    /* defaults are filled in */
    nvh_group_ctx *g = nvh_group_ctx_create(pool, NULL);
    assert_int_equal(nvh_group_options_get(g, &o), NVH_OK);
    assert_int_equal(o.model, NVH_GROUP_REAL);
    assert_int_equal(o.slots, 64);
    assert_int_equal(o.batch_count, 32);
    assert_int_equal(o.batch_ns, 100000);
    assert_int_equal(o.cache_lines, 131072);
    assert_ptr_equal(nvh_group_pool(g), pool);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);

    /* explicit values are kept; SIM_LOWER has an unlimited cache */
    o = (nvh_group_options){.slots = 5, .batch_count = 3, .batch_ns = NVH_GROUP_NEVER,
                            .model = NVH_GROUP_SIM_LOWER, .cache_lines = 9};
    g = nvh_group_ctx_create(pool, &o);
    assert_non_null(g);
    nvh_group_options got;
    nvh_group_options_get(g, &got);
    assert_int_equal(got.slots, 5);
    assert_int_equal(got.batch_count, 3);
    assert_true(got.batch_ns == NVH_GROUP_NEVER);
    assert_true(got.cache_lines == NVH_GROUP_NEVER);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

static void readonly_pool(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-ro", NVH_DOMAIN_PROCESS, &path);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, GT_LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_null(nvh_group_ctx_create(pool, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_READONLY);
    gt_pool_destroy(pool, path);
}

/* A context used from another thread: every call fails, nothing changes. */
struct foreign { nvh_group_ctx *g; int begin, sync, destroy, poll; };
static void *foreign_thread(void *arg)
{
    struct foreign *f = arg;
    f->begin = nvh_group_begin(f->g);
    f->poll = nvh_group_poll(f->g);
    f->sync = nvh_group_sync(f->g);
    f->destroy = nvh_group_ctx_destroy(f->g);
    return NULL;
}

static void wrong_thread(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-thr", NVH_DOMAIN_PROCESS, &path);
    struct foreign f = {.g = nvh_group_ctx_create(pool, NULL)};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, foreign_thread, &f), 0);
    pthread_join(t, NULL);
    assert_int_equal(f.begin, NVH_E_INVAL);
    assert_int_equal(f.poll, NVH_E_INVAL);
    assert_int_equal(f.sync, NVH_E_INVAL);
    assert_int_equal(f.destroy, NVH_E_INVAL);
    assert_int_equal(nvh_group_begin(f.g), NVH_OK);       /* still intact for its owner */
    assert_int_equal(nvh_group_end(f.g, NULL, NULL), NVH_OK);
    assert_int_equal(nvh_group_ctx_destroy(f.g), NVH_OK);
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Order, exactly once, NULL actions
 * ------------------------------------------------------------------------- */
static void order_every_model(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-order", NVH_DOMAIN_PROCESS, &path);
    gt_root *root = nvh_root(pool, NULL);
    for (int m = NVH_GROUP_REAL; m <= NVH_GROUP_SIM_UPPER; m++) {
        for (unsigned batch = 1; batch <= 7; batch += 3) {
            reset_log(pool);
            nvh_group_options o = {.model = (nvh_group_model)m, .batch_count = batch,
                                   .batch_ns = NVH_GROUP_NEVER, .slots = 6, .cache_lines = 5,
                                   .evict = batch == 4 ? NVH_GROUP_EVICT_RANDOM : NVH_GROUP_EVICT_LRU};
            nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
            assert_non_null(g);
            for (uint64_t i = 0; i < 200; i++) {
                gt_record *r = &root->rec[i % GT_MAX_RECORDS];
                assert_int_equal(nvh_group_begin(g), NVH_OK);
                gt_fill(r, i, 0);
                assert_int_equal(nvh_group_add(g, r, sizeof *r), NVH_OK);
                /* every third group has no action: still ordered, still counted */
                assert_int_equal(nvh_group_end(g, i % 3 == 2 ? NULL : gt_log_action,
                                               (void *)(uintptr_t)i), NVH_OK);
                assert_true(nvh_group_pending(g) <= 6);
            }
            assert_int_equal(nvh_group_sync(g), NVH_OK);
            assert_int_equal(nvh_group_pending(g), 0);
            nvh_group_stats st;
            nvh_group_stats_get(g, &st);
            assert_int_equal(st.groups, 200);
            assert_int_equal(st.actions, 200);
            assert_int_equal(st.pending, 0);
            assert_true(st.max_pending <= 6);
            assert_int_equal(st.lines_added, 200 * 4);   /* 208 B records span 4 lines */
            /* exactly once, in order */
            uint64_t want = 0, k = 0;
            for (uint64_t i = 0; i < 200; i++) {
                if (i % 3 == 2) continue;
                assert_int_equal(g_log.id[k++], i);
                want++;
            }
            assert_int_equal(g_log.n, want);
            assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
        }
    }
    gt_pool_destroy(pool, path);
}

/* A group with nothing added still orders its action behind earlier ones. */
static void empty_groups(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-empty", NVH_DOMAIN_PROCESS, &path);
    reset_log(pool);
    nvh_group_options o = {.batch_count = 1000, .batch_ns = NVH_GROUP_NEVER};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    for (uint64_t i = 0; i < 10; i++) {
        assert_int_equal(nvh_group_begin(g), NVH_OK);
        assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
    }
    assert_int_equal(g_log.n, 0);                   /* REAL: waiting for a fence */
    assert_int_equal(nvh_group_pending(g), 10);
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    assert_int_equal(g_log.n, 10);
    for (uint64_t i = 0; i < 10; i++) assert_int_equal(g_log.id[i], i);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Actions that call back into the context
 * ------------------------------------------------------------------------- */
struct reentry { int sync_rc, destroy_rc, chained; uint64_t depth; };
static struct reentry g_re;

static void chained_action(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    gt_log_action(pool, ctx, arg);
    g_re.sync_rc = nvh_group_sync(ctx);
    g_re.destroy_rc = nvh_group_ctx_destroy(ctx);
    /* chain: ids below 1000 start a follow-up group with id + 1000 */
    if (id < 1000) {
        gt_root *root = nvh_root(pool, NULL);
        assert_int_equal(nvh_group_begin(ctx), NVH_OK);
        root->count = id;
        assert_int_equal(nvh_group_add(ctx, &root->count, 8), NVH_OK);
        assert_int_equal(nvh_group_end(ctx, chained_action, (void *)(uintptr_t)(id + 1000)),
                         NVH_OK);
        g_re.chained++;
    }
}

static void actions_reenter(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-reent", NVH_DOMAIN_PROCESS, &path);
    for (int m = NVH_GROUP_REAL; m <= NVH_GROUP_SIM_UPPER; m++) {
        reset_log(pool);
        memset(&g_re, 0, sizeof g_re);
        /* 3 slots and a batch of 3: chained groups land in a full ring too */
        nvh_group_options o = {.model = (nvh_group_model)m, .slots = 3, .batch_count = 3,
                               .batch_ns = NVH_GROUP_NEVER, .cache_lines = 2};
        nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
        for (uint64_t i = 0; i < 12; i++) {
            assert_int_equal(nvh_group_begin(g), NVH_OK);
            assert_int_equal(nvh_group_end(g, chained_action, (void *)(uintptr_t)i), NVH_OK);
        }
        assert_int_equal(nvh_group_sync(g), NVH_OK);
        assert_int_equal(nvh_group_pending(g), 0);
        assert_int_equal(g_re.sync_rc, NVH_E_BUSY);
        assert_int_equal(g_re.destroy_rc, NVH_E_BUSY);
        assert_int_equal(g_re.chained, 12);
        assert_int_equal(g_log.n, 24);
        /* every original ran before its own follow-up, and originals in order */
        uint64_t next_orig = 0;
        int seen[12] = {0};
        for (uint64_t k = 0; k < g_log.n; k++) {
            uint64_t id = g_log.id[k];
            if (id < 1000) {
                assert_int_equal(id, next_orig++);
                seen[id] = 1;
            } else {
                assert_true(seen[id - 1000]);
            }
        }
        assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    }
    gt_pool_destroy(pool, path);
}

/* ---------------------------------------------------------------------------
 * Destroy, stats
 * ------------------------------------------------------------------------- */
static void destroy_runs_everything(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-destroy", NVH_DOMAIN_PROCESS, &path);
    gt_root *root = nvh_root(pool, NULL);
    reset_log(pool);
    nvh_group_options o = {.model = NVH_GROUP_SIM_LOWER};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    for (uint64_t i = 0; i < 5; i++) {
        assert_int_equal(nvh_group_begin(g), NVH_OK);
        gt_fill(&root->rec[i], i, 0);
        assert_int_equal(nvh_group_add(g, &root->rec[i], sizeof root->rec[i]), NVH_OK);
        assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
    }
    assert_int_equal(nvh_group_begin(g), NVH_OK);      /* left open */
    assert_int_equal(g_log.n, 0);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    assert_int_equal(g_log.n, 5);
    gt_pool_destroy(pool, path);
}

static void stats_and_reset(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = gt_pool_create("grp-stats", NVH_DOMAIN_PROCESS, &path);
    gt_root *root = nvh_root(pool, NULL);
    reset_log(pool);
    nvh_group_options o = {.batch_count = 4, .batch_ns = NVH_GROUP_NEVER};
    nvh_group_ctx *g = nvh_group_ctx_create(pool, &o);
    nvh_stats_reset(pool);
    for (uint64_t i = 0; i < 10; i++) {
        assert_int_equal(nvh_group_begin(g), NVH_OK);
        assert_int_equal(nvh_group_add(g, &root->rec[i], sizeof root->rec[i]), NVH_OK);
        assert_int_equal(nvh_group_end(g, gt_log_action, (void *)(uintptr_t)i), NVH_OK);
    }
    nvh_group_stats st;
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.groups, 10);
    assert_int_equal(st.actions, 8);          /* two batches of 4 */
    assert_int_equal(st.fences, 2);
    assert_int_equal(st.batch_fences, 2);
    assert_int_equal(st.timed_fences, 0);
    assert_int_equal(st.pending, 2);
    assert_int_equal(st.lines_added, 10 * 4);
    assert_int_equal(st.lines_written_back, 10 * 4);
    /* delay: group k of a batch waits for the (4 - k - 1) after it */
    assert_int_equal(st.delay_groups, 2 * (3 + 2 + 1 + 0));
    nvh_stats pst;
    nvh_stats_get(pool, &pst);
    assert_int_equal(pst.fences, 2);
    assert_int_equal(pst.lines_flushed, 10 * 4);

    nvh_group_stats_reset(g);
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.groups, 0);
    assert_int_equal(st.pending, 2);
    assert_int_equal(nvh_group_sync(g), NVH_OK);
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.actions, 2);
    assert_int_equal(st.syncs, 1);
    assert_int_equal(st.fences, 2);           /* retire, then the actions' effects */
    assert_int_equal(nvh_group_sync(g), NVH_OK);   /* nothing left: no fence */
    nvh_group_stats_get(g, &st);
    assert_int_equal(st.fences, 2);
    assert_int_equal(st.syncs, 1);
    assert_int_equal(nvh_group_ctx_destroy(g), NVH_OK);
    gt_pool_destroy(pool, path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_arguments),
        cmocka_unit_test(out_of_sequence),
        cmocka_unit_test(add_outside_pool),
        cmocka_unit_test(bad_options),
        cmocka_unit_test(readonly_pool),
        cmocka_unit_test(wrong_thread),
        cmocka_unit_test(order_every_model),
        cmocka_unit_test(empty_groups),
        cmocka_unit_test(actions_reenter),
        cmocka_unit_test(destroy_runs_everything),
        cmocka_unit_test(stats_and_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
