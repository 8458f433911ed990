/* kvs_crash.h — the harness of the sorted engine's crash tests
 * (test_kv_sorted_crash.c, test_kv_sorted_slab_crash.c): a workload of
 * inserts, overwrites and removes run under the crash simulator
 * (nvh_crash_explore) against a DRAM model; after each recovery the checker
 * demands:
 *   - opened read-only first (no allocator recovery, no repair), the tree
 *     opens and its check answers OK or NVH_E_CORRUPT, never a fault;
 *   - opened read-write, kv_sorted_open + kv_sorted_check succeed;
 *   - the recovered tree equals the model after a prefix of the operation
 *     stream at least as long as the acknowledged prefix (the op in flight
 *     happened entirely or not at all; nothing acknowledged is lost);
 *   - no leak: the heap holds exactly the header, the leaves, the record
 *     slabs, each naming at least one live record, and one allocator object
 *     per entry whose record is not in a slab (a version-1 tree's);
 *   - the tree keeps working (more operations, then check again);
 * and across the crash points of one run, monotonicity: a point taken after
 * a later acknowledgement never recovers a shorter prefix. */
#ifndef NVH_TEST_KVS_CRASH_H
#define NVH_TEST_KVS_CRASH_H

#include "kvs_model.h"

#include <sys/mman.h>

#define LAYOUT "kvscrash"

typedef struct run_cfg {
    uint64_t seed;
    uint32_t nkeys;
    unsigned ops;
    unsigned del_pct;
    unsigned long_every;
    uint64_t rec_max, slab_max;     /* kv_sorted_set_slabs_ (0, 0: defaults) */
    unsigned v1_ops;                /* the first ops write allocator records
                                       only, as a version-1 tree holds them */
    unsigned v2_ops;                /* the first ops write 16-byte record
                                       headers, as a version-2 tree holds
                                       them; then the tree is reopened      */
} run_cfg;

static run_cfg g_run;
/* A scripted run: g_script[i] is op i (g_run.ops of them) instead of the
 * seeded random stream; the operations after a recovery stay random. */
static const struct op *g_script;
static km_model *g_model;
static volatile unsigned g_acked;

typedef struct point_rec {
    int64_t acked;
    int64_t p_min, p_max;
} point_rec;
#define MAX_POINTS (1u << 20)
static point_rec *g_points;
static int *g_complaints;

typedef struct op { int del; uint32_t id; } op;

static op next_op(uint64_t *rng)
{
    op o;
    o.del = km_rng(rng) % 100 < g_run.del_pct;
    o.id = (uint32_t)(km_rng(rng) % g_run.nkeys);
    return o;
}

static op op_at(unsigned i, uint64_t *rng)
{
    return g_script ? g_script[i] : next_op(rng);
}

/* Apply to the model; returns the expected rc. */
static int model_apply(uint32_t *ver, uint32_t *clock, op o)
{
    if (o.del) {
        int rc = ver[o.id] ? NVH_OK : NVH_E_NOTFOUND;
        ver[o.id] = 0;
        return rc;
    }
    ver[o.id] = ++*clock;
    return NVH_OK;
}

static int tree_apply(kv_sorted *t, const km_model *m, op o, uint32_t ver, uint8_t *vb)
{
    if (o.del) return kv_sorted_remove(t, m->keys[o.id], m->klen[o.id]);
    size_t vl = km_val(o.id, ver, vb);
    return kv_sorted_put(t, m->keys[o.id], m->klen[o.id], vb, vl);
}

static int workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_off_t *link = nvh_root(pool, NULL);
    kv_sorted *t = kv_sorted_open(pool, link[0], NULL, NULL);
    if (!t) return 1;
    if (g_run.v2_ops && kv_sorted_set_rec16_(t, 1) != NVH_OK) return 1;
    if (g_run.v1_ops && kv_sorted_set_slabs_(t, 0, 64 << 10) != NVH_OK) return 1;
    else if (!g_run.v1_ops && g_run.slab_max &&
             kv_sorted_set_slabs_(t, g_run.rec_max, g_run.slab_max) != NVH_OK)
        return 1;
    uint32_t *ver = calloc(g_run.nkeys, sizeof *ver), clock = 0;
    uint8_t *vb = malloc(KM_VALMAX);
    uint64_t rng = g_run.seed;
    g_acked = 0;
    for (unsigned i = 0; i < g_run.ops; i++) {
        if (g_run.v1_ops && i == g_run.v1_ops) {
            const kvs_hdr *h = nvh_ptr(pool, link[0]);
            if (h->version != KVS_VERSION || h->slabs) return 1;    /* a version-1 tree */
            uint64_t rm = g_run.slab_max ? g_run.rec_max : KVS_SLAB_REC_MAX;
            uint64_t sm = g_run.slab_max ? g_run.slab_max : KVS_SLAB_MAX;
            if (kv_sorted_set_slabs_(t, rm, sm) != NVH_OK) return 1;
        }
        if (g_run.v2_ops && i == g_run.v2_ops) {
            /* the old library's session ends, this one's begins */
            const kvs_hdr *h = nvh_ptr(pool, link[0]);
            if (h->version != KVS_HDR_VERSION_SLABS) return 1;
            if (kv_sorted_close(t) != NVH_OK) return 1;
            if (!(t = kv_sorted_open(pool, link[0], NULL, NULL))) return 1;
            if (g_run.slab_max && kv_sorted_set_slabs_(t, g_run.rec_max, g_run.slab_max) != NVH_OK)
                return 1;
        }
        op o = op_at(i, &rng);
        int want = model_apply(ver, &clock, o);
        int got = tree_apply(t, g_model, o, ver[o.id], vb);
        if (got != want) {
            fprintf(stderr, "workload: op %u rc %d, model %d: %s\n", i, got, want, nvh_errormsg());
            return 1;
        }
        g_acked = i + 1;
    }
    free(ver);
    free(vb);
    return kv_sorted_close(t);
}

static void model_prefix(unsigned n, uint32_t *ver)
{
    uint32_t clock = 0;
    uint64_t rng = g_run.seed;
    memset(ver, 0, g_run.nkeys * sizeof *ver);
    for (unsigned i = 0; i < n; i++) model_apply(ver, &clock, op_at(i, &rng));
}

static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld) %s\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what, a, b,
                nvh_errormsg());
    return rc;
}

static int count_objects(void *ptr, size_t usable, void *arg)
{
    (void)ptr, (void)usable;
    (*(uint64_t *)arg)++;
    return 0;
}

/* Diagnose a leak: print the heap objects that are neither the header, a
 * chain leaf nor a live record. */
typedef struct leak_ctx { nvh_pool *pool; nvh_off_t hdr; } leak_ctx;
static int leak_fn(void *ptr, size_t usable, void *arg)
{
    leak_ctx *lc = arg;
    uint64_t off = nvh_off(lc->pool, ptr);
    if (off == lc->hdr) return 0;
    const kvs_hdr *h = nvh_ptr(lc->pool, lc->hdr);
    for (uint64_t o = h->slabs; o; o = ((const kvs_slab *)nvh_ptr(lc->pool, o))->next)
        if (o == off) return 0;
    for (uint64_t l = h->first; l; l = ((const kvs_leaf *)nvh_ptr(lc->pool, l))->next) {
        if (l == off) return 0;
        const kvs_leaf *lf = nvh_ptr(lc->pool, l);
        for (unsigned i = 0; i < KVS_CAP; i++) if (lf->slot[i].rec == off) return 0;
    }
    fprintf(stderr, "    unaccounted object at %llu (%zu B), magic %#x, leaf? left=%llu split_of=%llu next=%llu\n",
            (unsigned long long)off, usable, *(uint32_t *)ptr,
            (unsigned long long)((kvs_leaf *)ptr)->left, (unsigned long long)((kvs_leaf *)ptr)->split_of,
            (unsigned long long)((kvs_leaf *)ptr)->next);
    return 0;
}

/* Which prefix (acked or acked + 1) does the tree hold? -1: neither. */
static int64_t match_prefix(kv_sorted *t, unsigned acked, uint32_t *ver)
{
    km_model *m = g_model;
    uint32_t *save = m->ver;
    int64_t p = -1;
    m->ver = ver;
    km_quiet = 1;
    model_prefix(acked, ver);
    if (km_equals(t, m)) p = acked;
    if (p < 0 && acked < g_run.ops) {
        model_prefix(acked + 1, ver);
        if (km_equals(t, m)) p = acked + 1;
    }
    m->ver = save;
    km_quiet = 0;
    return p;
}

static int check_image(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    unsigned acked = g_acked;
    uint32_t *ver = calloc(g_run.nkeys, sizeof *ver);
    /* read-only first (the allocator's recovery does not run: the newest
     * link stores may be missing, so only "no fault, a consistent tree") */
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    if (!pool) return complain(pt, 2, "read-only pool open failed", 0, 0);
    nvh_off_t *link = nvh_root(pool, NULL);
    kv_sorted *t = kv_sorted_open(pool, link[0], NULL, NULL);
    if (!t) return complain(pt, 3, "read-only tree open failed", 0, 0);
    int ro = kv_sorted_check(t);
    if (ro != NVH_OK && ro != NVH_E_CORRUPT) return complain(pt, 4, "read-only check", ro, 0);
    kv_sorted_close(t);
    nvh_pool_close(pool);

    pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return complain(pt, 2, "pool open failed", 0, 0);
    link = nvh_root(pool, NULL);
    t = kv_sorted_open(pool, link[0], NULL, NULL);
    if (!t) return complain(pt, 3, "tree open failed", 0, 0);
    if (kv_sorted_check(t) != NVH_OK) return complain(pt, 4, "invariant", 0, 0);
    int64_t p = match_prefix(t, acked, ver);
    int rc = 0;
    if (p < 0) rc = complain(pt, 5, "recovered state is no prefix >= acknowledged", acked, 0);
    uint64_t objs = 0, live = 0;
    if (!rc) {
        nvh_heap_foreach(pool, count_objects, &objs);
        kv_sorted_count(t, NULL, 0, 0, NULL, 0, 0, &live);
        km_objs to = km_tree_objects(pool, link[0]);
        uint64_t leaves = to.leaves, slabs = to.slabs, empty = to.empty, recs = to.arecs;
        (void)live;
        if (objs != 1 + leaves + slabs + recs && __atomic_load_n(g_complaints, __ATOMIC_RELAXED) < 5) {
            leak_ctx lc = {pool, link[0]};
            const kvs_hdr *hh = nvh_ptr(pool, link[0]);
            fprintf(stderr, "    header: version %u slabs %llu first %llu\n", hh->version,
                    (unsigned long long)hh->slabs, (unsigned long long)hh->first);
            nvh_heap_foreach(pool, leak_fn, &lc);
        }
        if (objs != 1 + leaves + slabs + recs)
            rc = complain(pt, 7, "leak or loss: heap objects != header + leaves + slabs + records",
                          (long)objs, (long)(1 + leaves + slabs + recs));
        else if (empty)
            rc = complain(pt, 7, "leak: record slabs with no live record", (long)empty, (long)slabs);
    }
    if (!rc) {
        /* the recovered tree keeps working */
        km_model *m = g_model;
        uint32_t *save = m->ver, clock = 1u << 30;
        model_prefix((unsigned)p, ver);
        m->ver = ver;
        uint64_t rng = pt->seed ^ 0x5555;
        uint8_t *vb = malloc(KM_VALMAX);
        for (int i = 0; i < 40 && !rc; i++) {
            op o = next_op(&rng);
            int want = model_apply(ver, &clock, o);
            if (tree_apply(t, m, o, ver[o.id], vb) != want) rc = complain(pt, 8, "operation after recovery", i, o.id);
        }
        if (!rc && (kv_sorted_check(t) != NVH_OK || !km_equals(t, m)))
            rc = complain(pt, 9, "tree after more operations", 0, 0);
        m->ver = save;
        free(vb);
    }
    if (!rc && pt->fence < MAX_POINTS) {
        point_rec *r = &g_points[pt->fence];
        __atomic_store_n(&r->acked, acked, __ATOMIC_RELAXED);
        int64_t cur;
        while ((cur = __atomic_load_n(&r->p_min, __ATOMIC_RELAXED)) > p &&
               !__atomic_compare_exchange_n(&r->p_min, &cur, p, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
        while ((cur = __atomic_load_n(&r->p_max, __ATOMIC_RELAXED)) < p &&
               !__atomic_compare_exchange_n(&r->p_max, &cur, p, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    }
    free(ver);
    kv_sorted_close(t);
    nvh_pool_close(pool);
    return rc;
}

static const char *fresh_pool(void)
{
    const char *path = test_path("kvscrash");
    nvh_pool_options o = {.root_size = 4096, .max_size = 256 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(kv_sorted_create(pool, nvh_root(pool, NULL)), NVH_OK);
    assert_int_equal(nvh_heap_sync(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void run(run_cfg rc, nvh_crash_mode mode, uint64_t budget, unsigned images)
{
    g_run = rc;
    km_long_every = rc.long_every;
    g_model = km_new(rc.nkeys);
    const char *path = fresh_pool();
    *g_complaints = 0;
    for (unsigned i = 0; i < MAX_POINTS; i++) g_points[i] = (point_rec){-1, INT64_MAX, -1};
    const char *deep = getenv("NVHEAP_TEST_DEEP");
    if (deep && budget) budget *= (uint64_t)strtoull(deep, NULL, 0);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = workload, .check = check_image,
        .seed = rc.seed, .mode = mode, .budget = budget, .images_per_point = images,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    if (rep.failures) nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
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
    km_free(g_model);
    g_model = NULL;
    unlink(path);
}

/* Run the tests (KVS_TEST_FILTER: a cmocka name filter). */
static int kvs_crash_main(const struct CMUnitTest *tests, size_t n)
{
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_points = mmap(NULL, MAX_POINTS * sizeof(point_rec), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_complaints == MAP_FAILED || g_points == MAP_FAILED) return 1;
    if (getenv("KVS_TEST_FILTER")) cmocka_set_test_filter(getenv("KVS_TEST_FILTER"));
    return _cmocka_run_group_tests("kvs_crash", tests, n, NULL, NULL);
}

#endif /* NVH_TEST_KVS_CRASH_H */
