/* test_apps.c — the data structures of bench/run apps (bench/app_*.c: the
 * SSCA graph, the 6-degrees social graph, the B-tree of [Coburn09] §5.2) on
 * nvheap's object transactions: their invariants and contents against a
 * DRAM model after single-threaded runs, their invariants after two threads
 * ran concurrently, and after crashes sampled at fences (nvh_crash_explore,
 * both line and adversarial word mode): the recovered structure holds every
 * acknowledged operation and at most the one in flight, and stays usable. */
#include "test_util.h"

#include <pthread.h>
#include <sys/mman.h>

#include "../../bench/apps.h"

#define LAYOUT "apps-test"

static const char *g_scratch;

static char g_path[512];

/* A new pool (one at a time), closed and removed again by drop(). */
static nvh_pool *fresh(const char *name, uint64_t size)
{
    snprintf(g_path, sizeof g_path, "%s", test_path(name));
    nvh_pool *pool = nvh_pool_create(g_path, LAYOUT, size, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    return pool;
}

static void drop(nvh_pool *pool)
{
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(g_path);
}

/* ==========================================================================
 * Single thread, against a model
 * ========================================================================== */
static void test_ssca_model(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("ssca", 16u << 20);
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL);
    const uint32_t nv = 256, ne = 4000;
    assert_int_equal(ssca_create(&be, slot, nv), 0);
    uint32_t maxw[256] = {0};
    for (uint32_t i = 0; i < ne; i++) {
        uint32_t s, d, w;
        ssca_gen_edge(42, i, nv, &s, &d, &w);
        assert_true(s < nv && d < nv && w >= 1 && w <= nv);
        assert_int_equal(ssca_add_edge(&be, *slot, s, d, w), 0);
        if (w > maxw[s]) maxw[s] = w;
    }
    uint64_t edges = 0;
    assert_int_equal(ssca_check(&be, *slot, &edges), 0);
    assert_int_equal(edges, ne);
    for (uint32_t v = 0; v < nv; v++) {
        uint32_t m;
        assert_int_equal(ssca_max_weight(&be, *slot, v, &m), 0);
        assert_int_equal(m, maxw[v]);
    }
    uint64_t rng = 7;
    for (int i = 0; i < 3000; i++)
        assert_int_equal(ssca_reweight(&be, *slot, (uint32_t)(app_rand(&rng) % nv), app_rand(&rng),
                                       1 + (uint32_t)(app_rand(&rng) % nv)), 0);
    assert_int_equal(ssca_check(&be, *slot, &edges), 0);
    assert_int_equal(edges, ne);
    /* negative control: the check sees a degree that disagrees with the edges */
    uint64_t *vertices = app_ptr(&be, ((uint64_t *)app_ptr(&be, *slot))[2]);
    vertices[1] += 1;                           /* vertex 0's degree */
    assert_int_not_equal(ssca_check(&be, *slot, NULL), 0);
    vertices[1] -= 1;
    drop(pool);
}

/* DRAM model of the social graph: adjacency bits. */
typedef struct sgraph { uint32_t nv; uint8_t *adj; } sgraph;
static int sg_has(const sgraph *g, uint32_t a, uint32_t b) { return g->adj[(size_t)a * g->nv + b]; }

static int sg_bfs(const sgraph *g, uint32_t a, uint32_t b, unsigned depth)
{
    int *dist = malloc(sizeof *dist * g->nv), found = 0;
    uint32_t *q = malloc(sizeof *q * g->nv), h = 0, t = 0;
    for (uint32_t i = 0; i < g->nv; i++) dist[i] = -1;
    dist[a] = 0;
    q[t++] = a;
    while (h < t) {
        uint32_t u = q[h++];
        if (u == b) { found = 1; break; }
        if ((unsigned)dist[u] == depth) continue;
        for (uint32_t v = 0; v < g->nv; v++)
            if (sg_has(g, u, v) && dist[v] < 0) { dist[v] = dist[u] + 1; q[t++] = v; }
    }
    free(dist);
    free(q);
    return found;
}

static void sg_load(app_be *be, uint64_t root, sgraph *g)
{
    /* the model starts from the built graph: read it through queries of
     * depth 1 (each edge a->b is "a path of one link") */
    for (uint32_t a = 0; a < g->nv; a++)
        for (uint32_t b = 0; b < g->nv; b++) {
            int f;
            if (a == b) continue;
            assert_int_equal(sixdeg_query(be, root, a, b, 1, &f, NULL), 0);
            g->adj[(size_t)a * g->nv + b] = (uint8_t)f;
        }
}

static void test_sixdeg_model(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("sixdeg", 16u << 20);
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL);
    const uint32_t nv = 200;
    assert_int_equal(sixdeg_create(&be, slot, nv, 3, 11), 0);
    uint64_t edges = 0;
    assert_int_equal(sixdeg_check(&be, *slot, &edges), 0);
    assert_true(edges > nv * 4);                /* about 2 x 3 per vertex */
    sgraph g = {nv, calloc((size_t)nv * nv, 1)};
    sg_load(&be, *slot, &g);
    uint64_t model_edges = 0;
    for (size_t i = 0; i < (size_t)nv * nv; i++) model_edges += g.adj[i];
    assert_int_equal(model_edges, edges);
    uint64_t rng = 99;
    for (int i = 0; i < 3000; i++) {
        uint32_t a = (uint32_t)(app_rand(&rng) % nv), b = (uint32_t)(app_rand(&rng) % nv);
        assert_int_equal(sixdeg_toggle(&be, *slot, a, b), 0);
        if (a != b) g.adj[(size_t)a * nv + b] ^= 1;
        if (i % 10 == 0) {
            unsigned depth = i % 20 ? 6 : 2, dist = 0;
            int found;
            uint32_t c = (uint32_t)(app_rand(&rng) % nv), d = (uint32_t)(app_rand(&rng) % nv);
            assert_int_equal(sixdeg_query(&be, *slot, c, d, depth, &found, &dist), 0);
            assert_int_equal(found, sg_bfs(&g, c, d, depth));
            assert_true(!found || dist <= depth);
        }
    }
    assert_int_equal(sixdeg_check(&be, *slot, &edges), 0);
    model_edges = 0;
    for (size_t i = 0; i < (size_t)nv * nv; i++) model_edges += g.adj[i];
    assert_int_equal(model_edges, edges);
    /* negative control: a degree that disagrees with the edges */
    uint64_t *vertices = app_ptr(&be, ((uint64_t *)app_ptr(&be, *slot))[2]);
    vertices[8 + 1] += 1;                       /* vertex 1's degree */
    assert_int_not_equal(sixdeg_check(&be, *slot, NULL), 0);
    vertices[8 + 1] -= 1;
    free(g.adj);
    sixdeg_thread_exit();
    drop(pool);
}

static void test_btree_model(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("btree", 16u << 20);
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL);
    assert_int_equal(btree_create(&be, slot), 0);
    enum { KEYS = 3000 };
    static uint8_t model[KEYS + 1];
    memset(model, 0, sizeof model);
    uint64_t rng = 5, live = 0;
    for (int i = 0; i < 20000; i++) {
        uint64_t k = 1 + app_rand(&rng) % KEYS;
        int ins;
        assert_int_equal(btree_toggle(&be, *slot, k, &ins), 0);
        assert_int_equal(ins, !model[k]);
        model[k] ^= 1;
        live += model[k] ? 1 : (uint64_t)-1;
    }
    uint64_t got = 0;
    assert_int_equal(btree_check(&be, *slot, &got), 0);
    assert_int_equal(got, live);
    for (uint64_t k = 1; k <= KEYS; k++) {
        int f;
        assert_int_equal(btree_lookup(&be, *slot, k, &f), 0);
        assert_int_equal(f, model[k]);
    }
    /* negative control: the root's first key moved above its right subtree */
    uint64_t *root = app_ptr(&be, ((uint64_t *)app_ptr(&be, *slot))[1]);
    root[2] ^= 1ull << 62;
    assert_int_not_equal(btree_check(&be, *slot, NULL), 0);
    root[2] ^= 1ull << 62;
    assert_int_equal(btree_check(&be, *slot, NULL), 0);
    drop(pool);
}

/* ==========================================================================
 * Two threads at once (isolation): invariants hold, nothing lost
 * ========================================================================== */
typedef struct mt { app_be *be; uint64_t root; unsigned id; int app; uint64_t done; int rc; } mt;
enum { APP_SSCA, APP_SIXDEG, APP_BTREE };

static void *mt_run(void *p)
{
    mt *m = p;
    uint64_t rng = 1234567 + m->id;
    for (uint64_t i = 0; i < 3000 && !m->rc; i++) {
        if (m->app == APP_SSCA) {
            uint32_t s, d, w, nv = ssca_nvertices(m->be, m->root);
            ssca_gen_edge(3, i * 2 + m->id, nv, &s, &d, &w);
            m->rc = ssca_add_edge(m->be, m->root, s, d, w);
            if (!m->rc && i % 2)
                m->rc = ssca_reweight(m->be, m->root, (uint32_t)(app_rand(&rng) % nv), app_rand(&rng),
                                      1 + (uint32_t)(app_rand(&rng) % nv));
        } else if (m->app == APP_SIXDEG) {
            uint32_t nv = sixdeg_nvertices(m->be, m->root);
            uint32_t a = (uint32_t)(app_rand(&rng) % nv), b = (uint32_t)(app_rand(&rng) % nv);
            int f;
            m->rc = i % 2 ? sixdeg_toggle(m->be, m->root, a, b)
                          : sixdeg_query(m->be, m->root, a, b, i % 4 ? 2 : 6, &f, NULL);
        } else {
            /* disjoint keys per thread (k % 2 == id): each thread knows its own count */
            uint64_t k = 2 * (1 + app_rand(&rng) % 2000) + m->id;
            int ins;
            m->rc = btree_toggle(m->be, m->root, k, &ins);
            m->done += ins ? 1 : (uint64_t)-1;
            continue;
        }
        m->done++;
    }
    sixdeg_thread_exit();
    return NULL;
}

static void run_mt(int app)
{
    nvh_pool *pool = fresh("apps-mt", 32u << 20);
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL);
    if (app == APP_SSCA) assert_int_equal(ssca_create(&be, slot, 512), 0);
    if (app == APP_SIXDEG) assert_int_equal(sixdeg_create(&be, slot, 300, 3, 5), 0);
    if (app == APP_BTREE) assert_int_equal(btree_create(&be, slot), 0);
    uint64_t before = 0;
    if (app == APP_SIXDEG) assert_int_equal(sixdeg_check(&be, *slot, &before), 0);
    mt m[2];
    pthread_t th[2];
    for (unsigned i = 0; i < 2; i++) {
        m[i] = (mt){&be, *slot, i, app, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, mt_run, &m[i]), 0);
    }
    for (unsigned i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(m[i].rc, 0);
    }
    uint64_t n = 0;
    if (app == APP_SSCA) {
        assert_int_equal(ssca_check(&be, *slot, &n), 0);
        assert_int_equal(n, m[0].done + m[1].done);    /* no edge lost */
    } else if (app == APP_SIXDEG) {
        assert_int_equal(sixdeg_check(&be, *slot, &n), 0);
    } else {
        assert_int_equal(btree_check(&be, *slot, &n), 0);
        assert_int_equal(n, m[0].done + m[1].done);    /* no insertion or removal lost */
    }
    nvh_tx_stats st;
    nvh_tx_stats_get(pool, &st);
    printf("  %s: 2 threads, %llu commits, %llu conflicts\n",
           app == APP_SSCA ? "ssca" : app == APP_SIXDEG ? "sixdeg" : "btree",
           (unsigned long long)st.commits, (unsigned long long)st.conflicts);
    drop(pool);
}

static void test_ssca_mt(void **state) { (void)state; run_mt(APP_SSCA); }
static void test_sixdeg_mt(void **state) { (void)state; run_mt(APP_SIXDEG); }
static void test_btree_mt(void **state) { (void)state; run_mt(APP_BTREE); }

/* ==========================================================================
 * Crashes sampled at fences
 * ========================================================================== */
/* Operations acknowledged by the workload: shared with the forked checkers
 * (they see the parent's memory as of the crash). */
static volatile uint64_t g_acked;
static int *g_fail;                 /* checkers' complaints, shared memory */

typedef struct crash_cfg { int app; uint64_t ops; } crash_cfg;

/* The app's deterministic operation i (the same in workload and model). */
static int crash_op(app_be *be, uint64_t root, int app, uint64_t i)
{
    if (app == APP_SSCA) {
        uint32_t s, d, w;
        ssca_gen_edge(17, i, 64, &s, &d, &w);
        if (i % 3 == 2) return ssca_reweight(be, root, s, i, w);
        return ssca_add_edge(be, root, s, d, w);
    }
    if (app == APP_SIXDEG) {
        uint64_t r = i * 0x9e3779b97f4a7c15ull + 1;
        return sixdeg_toggle(be, root, (uint32_t)(app_rand(&r) % 40), (uint32_t)(app_rand(&r) % 40));
    }
    uint64_t r = i * 0x9e3779b97f4a7c15ull + 3;
    return btree_toggle(be, root, 1 + app_rand(&r) % 300, NULL);
}

static int crash_create(app_be *be, uint64_t *slot, int app)
{
    if (app == APP_SSCA) return ssca_create(be, slot, 64);
    if (app == APP_SIXDEG) return sixdeg_create(be, slot, 40, 0, 9);   /* one transaction: no edges */
    return btree_create(be, slot);
}

static int crash_workload(nvh_pool *pool, void *arg)
{
    const crash_cfg *c = arg;
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL);
    g_acked = 0;
    if (crash_create(&be, slot, c->app)) return 1;
    g_acked = 1;                    /* op 0: the create */
    for (uint64_t i = 0; i < c->ops; i++) {
        if (crash_op(&be, *slot, c->app, i)) return 1;
        g_acked = i + 2;
    }
    sixdeg_thread_exit();
    return 0;
}

/* What the structure must hold after `n` operations (create = op 0): the
 * same program run on a fresh DRAM-backed pool, summarised as a count
 * (edges, or live keys) and, for the B-tree, its key set. */
static uint64_t model_count(const crash_cfg *c, uint64_t n, uint8_t *keys)
{
    const char *path = test_path("apps-model");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 2u << 20, NVH_DOMAIN_PROCESS);
    if (!pool) return UINT64_MAX;
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL), count = 0;
    if (n && crash_create(&be, slot, c->app) == 0) {
        for (uint64_t i = 0; i + 1 < n; i++) crash_op(&be, *slot, c->app, i);
        if (c->app == APP_SSCA) ssca_check(&be, *slot, &count);
        else if (c->app == APP_SIXDEG) sixdeg_check(&be, *slot, &count);
        else btree_check(&be, *slot, &count);
        if (keys && c->app == APP_BTREE)
            for (uint64_t k = 1; k <= 300; k++) { int f = 0; btree_lookup(&be, *slot, k, &f); keys[k] = (uint8_t)f; }
    }
    nvh_pool_close(pool);
    unlink(path);
    return count;
}

static int crash_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    const crash_cfg *c = arg;
    uint64_t acked = g_acked;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: fence %llu: open failed: %s\n", (unsigned long long)pt->fence,
                nvh_errormsg());
        __atomic_fetch_add(g_fail, 1, __ATOMIC_RELAXED);
        return 2;
    }
    app_be be = app_nvh_backend(pool);
    uint64_t *slot = nvh_root(pool, NULL), count = 0;
    int rc = 0;
    if (!*slot) {
        if (acked) rc = 3;                         /* the create was acknowledged */
    } else {
        rc = c->app == APP_SSCA     ? ssca_check(&be, *slot, &count)
           : c->app == APP_SIXDEG   ? sixdeg_check(&be, *slot, &count)
                                    : btree_check(&be, *slot, &count);
        if (!rc) {
            /* acknowledged ops all there, the in-flight one all or nothing */
            static uint8_t k0[301], k1[301], got[301];
            uint64_t m0 = model_count(c, acked, k0), m1 = model_count(c, acked + 1, k1);
            if (count != m0 && count != m1) rc = 4;
            if (!rc && c->app == APP_BTREE) {
                for (uint64_t k = 1; k <= 300; k++) { int f = 0; btree_lookup(&be, *slot, k, &f); got[k] = (uint8_t)f; }
                if (memcmp(got + 1, k0 + 1, 300) && memcmp(got + 1, k1 + 1, 300)) rc = 5;
            }
            /* and the recovered structure takes more operations */
            for (uint64_t i = 0; i < 5 && !rc; i++)
                if (crash_op(&be, *slot, c->app, 1000 + i)) rc = 6;
            if (!rc) rc = c->app == APP_SSCA   ? ssca_check(&be, *slot, NULL)
                        : c->app == APP_SIXDEG ? sixdeg_check(&be, *slot, NULL)
                                               : btree_check(&be, *slot, NULL);
        }
    }
    if (rc) {
        fprintf(stderr, "  checker: fence %llu seed %#llx: rc %d (acked %llu, count %llu)\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, rc,
                (unsigned long long)acked, (unsigned long long)count);
        __atomic_fetch_add(g_fail, 1, __ATOMIC_RELAXED);
    }
    nvh_pool_close(pool);
    return rc;
}

static void run_crash(int app, uint64_t ops)
{
    crash_cfg c = {app, ops};
    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        const char *path = test_path("apps-crash");
        nvh_pool *pool = nvh_pool_create(path, LAYOUT, 2u << 20, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        *g_fail = 0;
        nvh_crash_config cc = {
            .pool_path = path, .layout = LAYOUT, .workload = crash_workload, .check = crash_check,
            .arg = &c, .seed = 21 + (uint64_t)mode, .mode = (nvh_crash_mode)mode, .budget = 40,
            .images_per_point = 1, .scratch_dir = g_scratch,
        };
        nvh_crash_report rep;
        assert_int_equal(nvh_crash_explore(&cc, &rep), NVH_OK);
        if (rep.failures) nvh_crash_report_print(&rep, stderr);
        printf("  %s %s: %llu fences, %llu crash images checked\n",
               app == APP_SSCA ? "ssca" : app == APP_SIXDEG ? "sixdeg" : "btree",
               mode == NVH_CRASH_LINES ? "lines" : "words", (unsigned long long)rep.fences,
               (unsigned long long)rep.points_tested);
        assert_int_equal(rep.workload_status, 0);
        assert_true(rep.points_tested >= 20);
        assert_int_equal(rep.failures, 0);
        assert_int_equal(*g_fail, 0);
        unlink(path);
    }
}

static void test_ssca_crash(void **state) { (void)state; run_crash(APP_SSCA, 150); }
static void test_sixdeg_crash(void **state) { (void)state; run_crash(APP_SIXDEG, 250); }
static void test_btree_crash(void **state) { (void)state; run_crash(APP_BTREE, 250); }

int main(void)
{
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    g_fail = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_scratch = test_shm_scratch("test_apps");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ssca_model),
        cmocka_unit_test(test_sixdeg_model),
        cmocka_unit_test(test_btree_model),
        cmocka_unit_test(test_ssca_mt),
        cmocka_unit_test(test_sixdeg_mt),
        cmocka_unit_test(test_btree_mt),
        cmocka_unit_test(test_ssca_crash),
        cmocka_unit_test(test_sixdeg_crash),
        cmocka_unit_test(test_btree_crash),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);
    return rc;
}
