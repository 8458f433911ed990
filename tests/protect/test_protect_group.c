/* test_protect_group.c — persist groups (src/group) on a protected pool.
 *
 * The group layer itself never stores into the pool (it flushes lines and
 * fences, and runs the application's actions): the stores are the
 * application's, so it opens windows for them, the way docs/PROTECT.md asks:
 * the record's window opens before it is filled and closes in the group's
 * action, which also writes the validation key inside a window of its own.
 * Random runs over the REAL and SIM_CACHE models, with no stray allowed, all
 * records intact, every page read-only once the windows are closed.
 *
 * Mode: NVHEAP_PROTECT if set (ctest runs this under sync and async, the
 * pool coming up protected from the environment hook); otherwise the test
 * turns sync and async on itself, one after the other. */
#include "protect_test.h"

#include <stdlib.h>

#define NREC 600u
#define RECSZ 200u

typedef struct rec {
    uint64_t key;              /* written by the action: the record is valid */
    uint64_t seq;
    uint64_t word[22];
    uint64_t check;
} rec;
_Static_assert(sizeof(rec) == RECSZ, "record size");

typedef struct run {
    nvh_pool *pool;
    rec *recs;                 /* in the root area */
    uint64_t actions;
} run;

static uint64_t check_of(const rec *r)
{
    uint64_t c = r->seq;
    for (unsigned w = 0; w < 22; w++) c = (c ^ r->word[w]) * 0x94D049BB133111EBull;
    return c;
}

static run *g_run;

/* The action: the record is durable; publish its key, then close both
 * windows (the record's, opened by the producer, and the key's). */
static void publish(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)ctx;
    rec *r = &g_run->recs[(uintptr_t)arg];
    assert_int_equal(nvh_unprotect(pool, &r->key, sizeof r->key), NVH_OK);
    r->key = r->seq * 0x2545F4914F6CDD1Dull;
    nvh_persist(pool, &r->key, sizeof r->key);
    assert_int_equal(nvh_protect(pool, &r->key, sizeof r->key), NVH_OK);
    assert_int_equal(nvh_protect(pool, r, sizeof *r), NVH_OK);
    g_run->actions++;
}

static void random_run(nvh_pool *pool, nvh_group_model model, uint64_t seed)
{
    size_t root_size = 0;
    run r = {.pool = pool, .recs = nvh_root(pool, &root_size)};
    assert_true(root_size >= NREC * sizeof(rec));
    g_run = &r;
    nvh_group_options go = {.model = model, .slots = 16, .batch_count = 8};
    nvh_group_ctx *ctx = nvh_group_ctx_create(pool, &go);
    assert_non_null(ctx);
    nvh_protect_stats_reset(pool);
    uint64_t begun = 0;
    for (unsigned i = 0; i < 4 * NREC; i++) {
        unsigned k = (unsigned)(test_rand(&seed) % NREC);
        rec *x = &r.recs[k];
        /* one update of record k at a time: wait until its last is published */
        if (x->seq && x->key != x->seq * 0x2545F4914F6CDD1Dull) nvh_group_sync(ctx);
        assert_int_equal(nvh_unprotect(pool, x, sizeof *x), NVH_OK);
        x->key = 0;
        x->seq = ++begun;
        for (unsigned w = 0; w < 22; w++) x->word[w] = test_rand(&seed);
        x->check = check_of(x);
        assert_int_equal(nvh_group_begin(ctx), NVH_OK);
        assert_int_equal(nvh_group_add(ctx, x, sizeof *x), NVH_OK);
        assert_int_equal(nvh_group_end(ctx, publish, (void *)(uintptr_t)k), NVH_OK);
        if (test_rand(&seed) % 16 == 0) nvh_group_poll(ctx);
    }
    assert_int_equal(nvh_group_sync(ctx), NVH_OK);
    assert_int_equal(r.actions, begun);
    assert_int_equal(nvh_group_ctx_destroy(ctx), NVH_OK);
    for (unsigned k = 0; k < NREC; k++) {
        const rec *x = &r.recs[k];
        if (!x->seq) continue;
        assert_int_equal(x->check, check_of(x));
        assert_int_equal(x->key, x->seq * 0x2545F4914F6CDD1Dull);
    }
    nvh_protect_stats s = pt_stats(pool);
    assert_int_equal(s.strays, 0);
    assert_int_equal(s.unbalanced, 0);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    for (unsigned k = 0; k < NREC; k += 20) assert_int_equal(pt_writable(&r.recs[k]), 0);
    g_run = NULL;
}

static void check_mode(nvh_protect_mode mode, uint64_t interval)
{
    const char *env = getenv("NVHEAP_PROTECT");
    nvh_pool_options po = {.root_size = 256 * 1024};
    const char *path = test_path("group");
    nvh_pool *pool = nvh_pool_create_ex(path, "protect", 4 * MIB, NVH_DOMAIN_PROCESS, &po);
    assert_non_null(pool);
    if (env && *env && strcmp(env, "off") != 0) {
        assert_int_not_equal(nvh_protect_get_mode(pool), NVH_PROTECT_OFF);   /* the hook */
    } else {
        assert_int_equal(nvh_protect_set_mode(pool, mode, interval), NVH_OK);
    }
    /* the root area is application memory: zero it inside a window */
    size_t root_size = 0;
    void *root = nvh_root(pool, &root_size);
    assert_int_equal(nvh_unprotect(pool, root, root_size), NVH_OK);
    memset(root, 0, root_size);
    assert_int_equal(nvh_protect(pool, root, root_size), NVH_OK);
    random_run(pool, NVH_GROUP_REAL, 1);
    random_run(pool, NVH_GROUP_SIM_CACHE, 2);
    random_run(pool, NVH_GROUP_REAL, 3);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void test_group_sync(void **state) { (void)state; check_mode(NVH_PROTECT_SYNC, 0); }
static void test_group_async(void **state)
{
    (void)state;
    check_mode(NVH_PROTECT_ASYNC, 100000);       /* 100 us: many passes */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_sync),
        cmocka_unit_test(test_group_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
