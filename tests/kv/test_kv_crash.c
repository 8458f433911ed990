/* test_kv_crash.c — crash consistency of the key-value store (hash engine)
 * under the crash simulator (nvh_crash_explore): a crash at EVERY fence of
 * runs of puts of new keys, overwrites, removes and atomic batches (line and
 * adversarial word modes), and sampled crashes over a long run. Each image
 * is checked against an operation-log oracle:
 *   - the pool and the store open (a committed batch is finished) and
 *     nvh_kv_check passes;
 *   - the store equals the model after a prefix of the operations at least
 *     as long as the acknowledged one: acknowledged operations are visible,
 *     the one in flight (a single operation or a whole batch) happened
 *     entirely or not at all;
 *   - no leak: the heap holds the descriptor, the map's root and segments
 *     and one object per entry (no batch log left);
 *   - the store keeps working (more operations, check again). */
#include "test_util.h"

#include "kv/kv.h"

#include <sys/mman.h>

#define LAYOUT "kvcrash"
#define STORE "crash"

typedef struct run_cfg {
    uint64_t seed;
    uint32_t nkeys;
    unsigned ops;
    unsigned del_pct, batch_pct;
    const char *engine;               /* NULL: hash */
} run_cfg;

static run_cfg g_run;
static volatile unsigned g_acked;
static int *g_complaints;

/* One operation of the stream: a single put/remove, or a batch of 2..6. */
#define MAXB 6
typedef struct kv_op {
    unsigned n;                       /* 1: single; > 1: a batch */
    bool batch;
    struct { uint32_t id; bool remove; } e[MAXB];
} kv_op;

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 17;
}

static kv_op next_op(uint64_t *rng)
{
    kv_op op = {.n = 1};
    if (rng_next(rng) % 100 < g_run.batch_pct) {
        op.batch = true;
        op.n = 2 + (unsigned)(rng_next(rng) % (MAXB - 1));
    }
    for (unsigned j = 0; j < op.n; j++) {
        op.e[j].id = (uint32_t)(rng_next(rng) % g_run.nkeys);
        op.e[j].remove = rng_next(rng) % 100 < g_run.del_pct;
    }
    return op;
}

static size_t key_of(uint32_t id, char *k)
{
    return (size_t)sprintf(k, "key-%u", id);
}

/* The value written by operation i for key id: its length varies with i. */
static size_t value_of(int64_t i, uint32_t id, char *v)
{
    size_t n = (size_t)sprintf(v, "v%lld/%u:", (long long)i, id);
    size_t len = n + (size_t)(i * 7 + id) % 90;
    for (size_t j = n; j < len; j++) v[j] = (char)('a' + (j + (size_t)i) % 26);
    return len;
}

/* model: ver[id] = index of the operation that last put it, -1 absent */
static void model_apply(int64_t *ver, int64_t i, const kv_op *op)
{
    for (unsigned j = 0; j < op->n; j++) ver[op->e[j].id] = op->e[j].remove ? -1 : i;
}

static void model_prefix(unsigned n, int64_t *ver)
{
    uint64_t rng = g_run.seed;
    for (uint32_t id = 0; id < g_run.nkeys; id++) ver[id] = -1;
    for (unsigned i = 0; i < n; i++) {
        kv_op op = next_op(&rng);
        model_apply(ver, i, &op);
    }
}

/* Run one operation on the store (removes of absent keys are skipped by
 * singles; batches carry them). Returns 0 or an error. */
static int store_apply(nvh_kv *kv, int64_t i, const kv_op *op, const int64_t *ver)
{
    char k[32], v[160];
    if (!op->batch) {
        size_t kl = key_of(op->e[0].id, k);
        if (op->e[0].remove) {
            int rc = nvh_kv_remove(kv, k, kl);
            return ver[op->e[0].id] < 0 ? (rc == NVH_E_NOTFOUND ? 0 : -100) : rc;
        }
        return nvh_kv_put(kv, k, kl, v, value_of(i, op->e[0].id, v));
    }
    nvh_kv_batch *b = nvh_kv_batch_new(kv);
    if (!b) return nvh_errcode();
    for (unsigned j = 0; j < op->n; j++) {
        size_t kl = key_of(op->e[j].id, k);
        int rc = op->e[j].remove ? nvh_kv_batch_remove(b, k, kl)
                                 : nvh_kv_batch_put(b, k, kl, v, value_of(i, op->e[j].id, v));
        if (rc) {
            nvh_kv_batch_abort(b);
            return rc;
        }
    }
    return nvh_kv_batch_commit(b);
}

static int kv_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_kv_config c = {.name = STORE, .create = NVH_KV_OPEN_EXISTING};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) return 1;
    int64_t *ver = malloc(g_run.nkeys * sizeof *ver);
    for (uint32_t id = 0; id < g_run.nkeys; id++) ver[id] = -1;
    uint64_t rng = g_run.seed;
    g_acked = 0;
    for (unsigned i = 0; i < g_run.ops; i++) {
        kv_op op = next_op(&rng);
        int rc = store_apply(kv, i, &op, ver);
        if (rc) {
            fprintf(stderr, "workload: op %u rc %d: %s\n", i, rc, nvh_errormsg());
            free(ver);
            return 1;
        }
        model_apply(ver, i, &op);
        g_acked = i + 1;
    }
    free(ver);
    return nvh_kv_close(kv);
}

static bool store_equals(nvh_kv *kv, const int64_t *ver)
{
    char k[32], v[160], buf[256];
    uint64_t live = 0, n = 0;
    for (uint32_t id = 0; id < g_run.nkeys; id++) {
        size_t kl = key_of(id, k), got = 0;
        int rc = nvh_kv_get_copy(kv, k, kl, buf, sizeof buf, &got);
        if (ver[id] < 0) {
            if (rc != NVH_E_NOTFOUND) return false;
            continue;
        }
        live++;
        size_t vl = value_of(ver[id], id, v);
        if (rc != NVH_OK || got != vl || memcmp(buf, v, vl) != 0) return false;
    }
    return nvh_kv_count_all(kv, &n) == NVH_OK && n == live;
}

static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld) %s\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what, a, b,
                nvh_errormsg());
    return rc;
}

static int count_obj(void *ptr, size_t usable, void *arg)
{
    (void)ptr, (void)usable;
    ++*(uint64_t *)arg;
    return 0;
}

static int kv_check_image(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    unsigned acked = g_acked;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return complain(pt, 2, "pool open failed", 0, 0);
    nvh_kv_config c = {.name = STORE, .create = NVH_KV_OPEN_EXISTING};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) return complain(pt, 3, "store open failed", 0, 0);
    if (nvh_kv_check(kv) != NVH_OK) return complain(pt, 4, "check", 0, 0);
    int64_t *ver = malloc(g_run.nkeys * sizeof *ver);
    int64_t p = -1;
    model_prefix(acked, ver);
    if (store_equals(kv, ver)) p = acked;
    if (p < 0 && acked < g_run.ops) {
        model_prefix(acked + 1, ver);
        if (store_equals(kv, ver)) p = acked + 1;
    }
    int rc = 0;
    if (p < 0) rc = complain(pt, 5, "recovered state is no prefix >= acknowledged", acked, 0);
    nvh_hmap_stats st;
    uint64_t objs = 0;
    nvh_heap_foreach(pool, count_obj, &objs);
    if (!rc && kv->desc->batch) rc = complain(pt, 6, "batch log still linked", 0, 0);
    if (!rc && kv->hm && nvh_hmap_check(kv->hm, &st) != NVH_OK)
        rc = complain(pt, 6, "map check", 0, 0);
    if (!rc && kv->hm && objs != 2 + st.segments + st.count)
        rc = complain(pt, 6, "leak or loss: heap objects != descriptor + root + segments + "
                      "entries", (long)objs, (long)(2 + st.segments + st.count));
    /* the store keeps working */
    if (!rc) {
        uint64_t rng = pt->seed ^ 0x5555;
        for (unsigned i = 0; i < 10 && !rc; i++) {
            kv_op op = next_op(&rng);
            int64_t idx = 1000000 + i;
            if (store_apply(kv, idx, &op, ver) != 0) rc = complain(pt, 7, "op after recovery", i, 0);
            model_apply(ver, idx, &op);
        }
        if (!rc && (nvh_kv_check(kv) != NVH_OK || !store_equals(kv, ver)))
            rc = complain(pt, 8, "store after more operations", 0, 0);
    }
    free(ver);
    nvh_kv_close(kv);
    nvh_pool_close(pool);
    return rc;
}

static const char *fresh_pool(const char *engine)
{
    const char *path = test_path("kvcrash");
    nvh_pool_options o = {.root_size = 4096, .max_size = 256 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_kv_config c = {.name = STORE, .engine = engine ? engine : "hash",
                       .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) {
        assert_int_equal(nvh_errcode(), NVH_E_NOTSUP);     /* no sorted engine built */
        nvh_pool_close(pool);
        unlink(path);
        return NULL;
    }
    assert_int_equal(nvh_kv_close(kv), NVH_OK);
    assert_int_equal(nvh_heap_sync(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void run(run_cfg rc, nvh_crash_mode mode, uint64_t budget, unsigned images)
{
    g_run = rc;
    const char *path = fresh_pool(rc.engine);
    if (!path) return;
    *g_complaints = 0;
    const char *deep = getenv("NVHEAP_TEST_DEEP");
    if (deep && budget) budget *= (uint64_t)strtoull(deep, NULL, 0);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = kv_workload, .check = kv_check_image,
        .seed = rc.seed, .mode = mode, .budget = budget, .images_per_point = images,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    if (rep.failures) nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
    print_message("  %u ops: %llu fences, %llu images checked, 0 failures\n", rc.ops,
                  (unsigned long long)rep.fences, (unsigned long long)rep.points_tested);
    unlink(path);
}

/* puts of new keys, overwrites (few keys), removes, batches: every fence */
static void test_every_fence_lines(void **state)
{
    (void)state;
    run((run_cfg){21, 12, 60, 25, 20, NULL}, NVH_CRASH_LINES, 0, 2);
}

static void test_every_fence_words(void **state)
{
    (void)state;
    run((run_cfg){22, 12, 60, 25, 20, NULL}, NVH_CRASH_WORDS, 0, 2);
}

/* batches only, on few keys (puts and removes of the same keys in a batch) */
static void test_every_fence_batches(void **state)
{
    (void)state;
    run((run_cfg){23, 5, 25, 30, 100, NULL}, NVH_CRASH_LINES, 0, 2);
}

/* the batch log over the sorted engine (its own operations are crash-tested
 * with it, tests/kv_sorted) */
static void test_every_fence_sorted(void **state)
{
    (void)state;
    run((run_cfg){25, 8, 30, 25, 50, "sorted"}, NVH_CRASH_LINES, 0, 1);
}

static void test_sampled_long(void **state)
{
    (void)state;
    run((run_cfg){24, 400, 4000, 25, 10, NULL}, NVH_CRASH_LINES, 60, 1);
}

int main(void)
{
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_complaints == MAP_FAILED) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_fence_lines), cmocka_unit_test(test_every_fence_words),
        cmocka_unit_test(test_every_fence_batches), cmocka_unit_test(test_every_fence_sorted),
        cmocka_unit_test(test_sampled_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
