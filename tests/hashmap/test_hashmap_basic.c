/* test_hashmap_basic.c — the persistent hash map without crashes: every
 * operation and bad input, byte-string keys of 0 and 64 KiB, large values,
 * resizing from 2 buckets to thousands, property tests against the DRAM
 * model (random operation streams, compared after every step, with reopens),
 * persistence across pool close/open, costs in fences and flushed lines,
 * no leaked allocation, destroy, and two threads on one map. */
#include "hm_model.h"

#include <pthread.h>

#define LAYOUT "hmtest"

static nvh_pool *new_pool(const char *name, const char **path_out)
{
    const char *path = test_path(name);
    nvh_pool_options o = {.root_size = 4096, .max_size = 1ull << 30};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    if (path_out) *path_out = path;
    return pool;
}

static nvh_hmap *new_map_seeded(nvh_pool *pool, unsigned base, unsigned pct, uint64_t seed)
{
    nvh_off_t *slot = nvh_root(pool, NULL);
    nvh_hmap_options o = {.initial_buckets_log2 = base, .max_load_pct = pct, .seed = seed};
    assert_int_equal(nvh_hmap_create(pool, slot, &o), NVH_OK);
    assert_true(*slot != 0);
    nvh_hmap *m = nvh_hmap_open(pool, *slot);
    assert_non_null(m);
    return m;
}

static nvh_hmap *new_map(nvh_pool *pool, unsigned base, unsigned pct)
{
    return new_map_seeded(pool, base, pct, 0);   /* 0: seed from the pool */
}

static void check_ok(nvh_hmap *m)
{
    nvh_hmap_stats st;
    int rc = nvh_hmap_check(m, &st);
    if (rc != NVH_OK) fail_msg("check: %s", nvh_errormsg());
}

/* ---------------------------------------------------------------------------
 * Operations and bad inputs
 * ------------------------------------------------------------------------- */
static void test_basic_ops(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-basic", &path);
    nvh_hmap *m = new_map(pool, 0, 0);
    const void *v;
    size_t vl;
    assert_int_equal(nvh_hmap_get(m, "a", 1, &v, &vl), NVH_E_NOTFOUND);
    assert_int_equal(nvh_hmap_put(m, "a", 1, "one", 3), NVH_OK);
    assert_int_equal(nvh_hmap_get(m, "a", 1, &v, &vl), NVH_OK);
    assert_int_equal(vl, 3);
    assert_memory_equal(v, "one", 3);
    assert_int_equal(nvh_hmap_insert(m, "a", 1, "x", 1), NVH_E_EXISTS);
    assert_int_equal(nvh_hmap_update(m, "b", 1, "x", 1), NVH_E_NOTFOUND);
    assert_int_equal(nvh_hmap_update(m, "a", 1, "uno!", 4), NVH_OK);
    assert_int_equal(nvh_hmap_get(m, "a", 1, &v, &vl), NVH_OK);
    assert_int_equal(vl, 4);
    assert_memory_equal(v, "uno!", 4);
    assert_int_equal(nvh_hmap_put(m, "a", 1, "1", 1), NVH_OK);     /* put replaces */
    assert_int_equal(nvh_hmap_insert(m, "b", 1, NULL, 0), NVH_OK); /* empty value */
    assert_int_equal(nvh_hmap_get(m, "b", 1, NULL, &vl), NVH_OK);
    assert_int_equal(vl, 0);
    assert_int_equal(nvh_hmap_put(m, NULL, 0, "empty key", 9), NVH_OK);
    assert_int_equal(nvh_hmap_get(m, "", 0, &v, &vl), NVH_OK);
    assert_int_equal(vl, 9);
    assert_int_equal(nvh_hmap_contains(m, "a", 1), 1);
    assert_int_equal(nvh_hmap_contains(m, "zz", 2), 0);
    assert_int_equal(nvh_hmap_count(m), 3);
    assert_int_equal(nvh_hmap_delete(m, "a", 1), NVH_OK);
    assert_int_equal(nvh_hmap_delete(m, "a", 1), NVH_E_NOTFOUND);
    assert_int_equal(nvh_hmap_count(m), 2);
    /* keys that differ only in length, or share prefixes */
    assert_int_equal(nvh_hmap_put(m, "ab", 2, "2", 1), NVH_OK);
    assert_int_equal(nvh_hmap_put(m, "ab\0", 3, "3", 1), NVH_OK);
    assert_int_equal(nvh_hmap_get(m, "ab", 2, &v, &vl), NVH_OK);
    assert_memory_equal(v, "2", 1);
    assert_int_equal(nvh_hmap_get(m, "ab\0", 3, &v, &vl), NVH_OK);
    assert_memory_equal(v, "3", 1);
    check_ok(m);

    /* bad inputs: codes, and nothing changes */
    uint64_t n = nvh_hmap_count(m);
    assert_int_equal(nvh_hmap_put(NULL, "a", 1, "b", 1), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_put(m, NULL, 3, "b", 1), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_put(m, "a", 1, NULL, 5), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_get(NULL, "a", 1, NULL, NULL), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_delete(NULL, "a", 1), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_foreach(m, NULL, NULL), NVH_E_INVAL);
    uint8_t *big = malloc(NVH_HMAP_KEY_MAX + 1);
    memset(big, 'x', NVH_HMAP_KEY_MAX + 1);
    assert_int_equal(nvh_hmap_put(m, big, NVH_HMAP_KEY_MAX + 1, "v", 1), NVH_E_TOOLONG);
    assert_int_equal(nvh_hmap_get(m, big, NVH_HMAP_KEY_MAX + 1, NULL, NULL), NVH_E_TOOLONG);
    assert_int_equal(nvh_hmap_count(m), n);
    /* the longest key, and a large value */
    assert_int_equal(nvh_hmap_put(m, big, NVH_HMAP_KEY_MAX, "max", 3), NVH_OK);
    big[NVH_HMAP_KEY_MAX - 1] = 'y';
    assert_int_equal(nvh_hmap_get(m, big, NVH_HMAP_KEY_MAX, NULL, NULL), NVH_E_NOTFOUND);
    big[NVH_HMAP_KEY_MAX - 1] = 'x';
    assert_int_equal(nvh_hmap_get(m, big, NVH_HMAP_KEY_MAX, &v, &vl), NVH_OK);
    assert_memory_equal(v, "max", 3);
    size_t bigval = 300000;
    uint8_t *val = malloc(bigval);
    for (size_t i = 0; i < bigval; i++) val[i] = (uint8_t)(i * 7);
    assert_int_equal(nvh_hmap_put(m, "large", 5, val, bigval), NVH_OK);
    assert_int_equal(nvh_hmap_get(m, "large", 5, &v, &vl), NVH_OK);
    assert_int_equal(vl, bigval);
    assert_memory_equal(v, val, bigval);
    check_ok(m);
    free(big);
    free(val);

    /* open: bad offsets */
    assert_null(nvh_hmap_open(NULL, 64));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_hmap_open(pool, 3));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_null(nvh_hmap_open(pool, info.root_offset + 64));   /* zeroes: not a map */
    assert_int_equal(nvh_errcode(), NVH_E_BADMAGIC);
    assert_int_equal(nvh_hmap_create(pool, NULL, NULL), NVH_E_INVAL);
    nvh_hmap_options bad = {.initial_buckets_log2 = 30};
    assert_int_equal(nvh_hmap_create(pool, (nvh_off_t *)nvh_root(pool, NULL) + 1, &bad), NVH_E_INVAL);
    bad = (nvh_hmap_options){.max_load_pct = 5};
    assert_int_equal(nvh_hmap_create(pool, (nvh_off_t *)nvh_root(pool, NULL) + 1, &bad), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_close(m), NVH_OK);
    assert_int_equal(nvh_hmap_close(NULL), NVH_OK);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Property test: random streams vs the DRAM model, after every step
 * ------------------------------------------------------------------------- */
static void run_property(uint64_t seed, uint32_t nkeys, unsigned steps, unsigned del_pct,
                         unsigned base, unsigned pct)
{
    const char *path;
    nvh_pool *pool = new_pool("hm-prop", &path);
    nvh_hmap *m = new_map(pool, base, pct);
    nvh_off_t mo = *(nvh_off_t *)nvh_root(pool, NULL);
    uint32_t *ver = calloc(nkeys, sizeof *ver), clock = 0;
    uint64_t rng = seed;
    for (unsigned i = 0; i < steps; i++) {
        hm_op op = hm_next_op(&rng, nkeys, del_pct);
        int want = hm_model_apply(ver, &clock, op);
        int got = hm_map_apply(m, op, ver[op.id]);
        if (got != want) fail_msg("step %u: op %d key %u: rc %d, model %d", i, op.kind, op.id, got, want);
        if (!hm_key_matches(m, op.id, ver[op.id])) fail_msg("step %u: key %u differs", i, op.id);
        if (i % 97 == 0 && !hm_equals_model(m, ver, nkeys)) fail_msg("step %u: map != model", i);
        if (i % 499 == 0) check_ok(m);
        if (i % 1013 == 1012) {                      /* reopen the map, sometimes the pool */
            assert_int_equal(nvh_hmap_close(m), NVH_OK);
            if (i % 2026 == 2025) {
                nvh_pool_close(pool);
                pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
                assert_non_null(pool);
            }
            m = nvh_hmap_open(pool, mo);
            assert_non_null(m);
        }
    }
    assert_true(hm_equals_model(m, ver, nkeys));
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count_repaired, 0);
    /* no leak: the heap holds the root, the segments and one object per entry */
    assert_int_equal(hm_heap_objects(pool), 1 + st.segments + st.count);
    print_message("  seed %llu: %u steps, %llu entries, %llu buckets (%llu linked), max chain %llu\n",
                  (unsigned long long)seed, steps, (unsigned long long)st.count,
                  (unsigned long long)st.buckets, (unsigned long long)st.buckets_linked,
                  (unsigned long long)st.max_chain);
    free(ver);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

static void test_property(void **state)
{
    (void)state;
    run_property(1, 64, 6000, 30, 1, 100);       /* few keys: many updates/deletes */
    run_property(2, 3000, 12000, 15, 2, 100);    /* growth through many doublings */
    run_property(3, 800, 8000, 45, 0, 0);        /* default geometry, delete-heavy */
    run_property(4, 400, 4000, 25, 1, 1000);     /* long chains (load 10) */
}

/* ---------------------------------------------------------------------------
 * Resizing
 * ------------------------------------------------------------------------- */
static void test_resize(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-resize", &path);
    nvh_hmap *m = new_map(pool, 1, 100);
    const uint32_t n = 20000;
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = 0; id < n; id++) {
        size_t kl = hm_key(id, k), vl = hm_val(id, 1, v);
        assert_int_equal(nvh_hmap_insert(m, k, kl, v, vl), NVH_OK);
    }
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count, n);
    assert_true(st.buckets >= n);                /* load factor <= 1 */
    assert_true(st.buckets < 4ull * n);
    assert_true(st.load_factor <= 1.0);
    assert_int_equal(st.segments, 1 + st.resizes);
    /* every bucket this handle linked is counted once (buckets 0 and 1,
     * the root buckets of a 2-bucket map's 2 writer stripes, are made by
     * create): a bucket re-met while its mark waits for a fence is not
     * linked or counted again */
    assert_int_equal(st.buckets_inited, st.buckets_linked - 2);
    for (uint32_t id = 0; id < n; id++) assert_true(hm_key_matches(m, id, 1));
    /* after reopen every bucket is still reachable, lazily linked ones too */
    nvh_off_t mo = *(nvh_off_t *)nvh_root(pool, NULL);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    m = nvh_hmap_open(pool, mo);
    assert_non_null(m);
    assert_int_equal(nvh_hmap_count(m), n);
    for (uint32_t id = 0; id < n; id += 3) {
        size_t kl = hm_key(id, k);
        assert_int_equal(nvh_hmap_delete(m, k, kl), NVH_OK);
    }
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count, n - (n + 2) / 3);
    print_message("  %u keys: %llu buckets, %llu segments, %llu linked, max chain %llu\n", n,
                  (unsigned long long)st.buckets, (unsigned long long)st.segments,
                  (unsigned long long)st.buckets_linked, (unsigned long long)st.max_chain);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* The eager linker's batches while segment 0 fills: a map of 2^8 buckets
 * starts with buckets 0..31 linked (one per writer stripe), so a stripe's
 * batch holds buckets that share a parent (32 + s, 64 + s, 128 + s all
 * have parent s) and can share a predecessor word when the parent's run
 * is short: such a batch must stop before the second (one store would be
 * lost and a marked dummy left out of the list). After the first doubling
 * parents are distinct and the linker no longer compares (hashmap.c). */
static void test_seg0_batches(void **state)
{
    (void)state;
    /* fixed hash seeds: which buckets share a batch, and how many the
     * eager linker reaches in 400 inserts, depend on the seed */
    for (uint64_t seed = 1; seed <= 8; seed++) {
        const char *path;
        nvh_pool *pool = new_pool("hm-seg0", &path);
        nvh_hmap *m = new_map_seeded(pool, 8, 10000, seed);     /* never doubles */
        uint8_t k[HM_KEYBUF], v[HM_VALBUF];
        nvh_hmap_stats st;
        for (uint32_t id = 0; id < 400; id++) {
            size_t kl = hm_key(id, k), vl = hm_val(id, 1, v);
            assert_int_equal(nvh_hmap_insert(m, k, kl, v, vl), NVH_OK);
            if (id < 64 || id % 16 == 0) check_ok(m);
        }
        assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
        printf("  seed %u: %llu of 256 buckets linked\n", (unsigned)seed,
               (unsigned long long)st.buckets_linked);
        assert_int_equal(st.buckets_linked, 256);
        for (uint32_t id = 0; id < 400; id++) assert_true(hm_key_matches(m, id, 1));
        nvh_hmap_close(m);
        nvh_pool_close(pool);
        unlink(path);
    }
}

/* ---------------------------------------------------------------------------
 * Costs: fences and lines per operation (the figures docs/HASHMAP.md quotes)
 * ------------------------------------------------------------------------- */
/* A zero-padded 64 B key "PREFIX-i" (test_costs: fixed-size keys). */
static void cost_key(uint8_t k[64], const char *prefix, unsigned i)
{
    memset(k, 0, 64);
    snprintf((char *)k, 64, "%s-%u", prefix, i);
}

static void test_costs(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-cost", &path);
    nvh_hmap *m = new_map(pool, 8, 10000);       /* no resize, every bucket warm */
    uint8_t k[64], v[64];
    memset(v, 'v', sizeof v);
    const unsigned n = 4000;
    nvh_stats s;
    /* warm every bucket up: linking a bucket is a one-time cost */
    for (unsigned i = 0; i < n; i++) {
        cost_key(k, "warm", i);
        nvh_hmap_put(m, k, sizeof k, v, sizeof v);
    }
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < n; i++) {
        cost_key(k, "key", i);
        assert_int_equal(nvh_hmap_put(m, k, sizeof k, v, sizeof v), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    double put_f = (double)s.fences / n, put_l = (double)s.lines_flushed / n;
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < n; i++) {
        cost_key(k, "key", i);
        assert_int_equal(nvh_hmap_update(m, k, sizeof k, v, sizeof v), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    double upd_f = (double)s.fences / n;
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < n; i++) {
        cost_key(k, "key", i);
        assert_int_equal(nvh_hmap_get(m, k, sizeof k, NULL, NULL), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    assert_int_equal(s.fences, 0);                /* gets never write */
    assert_int_equal(s.lines_flushed, 0);
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < n; i++) {
        cost_key(k, "key", i);
        assert_int_equal(nvh_hmap_delete(m, k, sizeof k), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    double del_f = (double)s.fences / n, del_l = (double)s.lines_flushed / n;
    /* a large value (the entry reserved after the search, its value
     * streamed): 2,096 B are 33 lines, each flushed once */
    static uint8_t big[2000];
    memset(big, 'b', sizeof big);
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < n / 8; i++) {
        cost_key(k, "big", i);
        assert_int_equal(nvh_hmap_put(m, k, sizeof k, big, sizeof big), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    double big_l = (double)s.lines_flushed / (n / 8);
    print_message("  put (64 B key+value): %.3f fences, %.3f lines; update %.3f fences; "
                  "delete %.3f fences, %.3f lines; put of 2000 B: %.3f lines\n", put_f, put_l,
                  upd_f, del_f, del_l, big_l);
    assert_true(big_l <= 33 + 2.2);
    assert_true(put_f <= 2.1);
    /* a 160 B entry is 3 lines, each flushed once; + the activation record
     * and the predecessor's link (+ the allocator's retire tail) */
    assert_true(put_l <= 5.2);
    assert_true(upd_f <= 3.1);
    assert_true(del_f <= 1.1);
    nvh_hmap_close(m);
    /* Puts into a growing map (load factor <= 1: about one bucket linked
     * per put): a bucket costs its dummy's line and its predecessor's, no
     * fence; its mark is stored, not flushed (docs/HASHMAP.md §3). 5 lines
     * per put as above + 2 per bucket; flushing the marks too made it ~8. */
    m = new_map(pool, 1, 100);
    const unsigned g = 16384;
    nvh_stats_reset(pool);
    for (unsigned i = 0; i < g; i++) {
        cost_key(k, "grow", i);
        assert_int_equal(nvh_hmap_put(m, k, sizeof k, v, sizeof v), NVH_OK);
    }
    nvh_stats_get(pool, &s);
    nvh_hmap_stats hs;
    assert_int_equal(nvh_hmap_check(m, &hs), NVH_OK);
    double grow_f = (double)s.fences / g, grow_l = (double)s.lines_flushed / g;
    double per_bucket = (double)(hs.buckets_inited) / g;
    print_message("  growing map: %.3f fences, %.3f lines per put, %.3f buckets linked per put\n",
                  grow_f, grow_l, per_bucket);
    assert_true(per_bucket > 0.5);
    assert_true(grow_f <= 2.1);
    assert_true(grow_l <= 5.2 + 2 * per_bucket + 0.2);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Read-only pools: reads work, writes fail cleanly
 * ------------------------------------------------------------------------- */
static void test_readonly(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-ro", &path);
    nvh_hmap *m = new_map(pool, 1, 100);
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = 0; id < 300; id++)
        assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 1, v)), NVH_OK);
    nvh_off_t mo = *(nvh_off_t *)nvh_root(pool, NULL);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    uint64_t h = test_file_hash(path);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    m = nvh_hmap_open(pool, mo);
    assert_non_null(m);
    for (uint32_t id = 0; id < 300; id++) assert_true(hm_key_matches(m, id, 1));
    assert_int_equal(nvh_hmap_check(m, NULL), NVH_OK);
    assert_int_equal(nvh_hmap_put(m, "x", 1, "y", 1), NVH_E_READONLY);
    assert_int_equal(nvh_hmap_delete(m, k, hm_key(3, k)), NVH_E_READONLY);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    assert_true(test_file_hash(path) == h);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Destroy
 * ------------------------------------------------------------------------- */
static void test_destroy(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-destroy", &path);
    uint64_t before = hm_heap_objects(pool);
    nvh_hmap *m = new_map(pool, 1, 100);
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = 0; id < 500; id++)
        assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 1, v)), NVH_OK);
    nvh_off_t *slot = nvh_root(pool, NULL);
    assert_int_equal(nvh_hmap_destroy(m, slot + 1), NVH_E_INVAL);   /* wrong link */
    assert_int_equal(nvh_hmap_destroy(m, slot), NVH_OK);
    assert_int_equal(*slot, 0);
    assert_int_equal(hm_heap_objects(pool), before);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Lock-free get with a callback; the resumable walk (cursor)
 * ------------------------------------------------------------------------- */
static int getfn_copy(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    (void)key;
    (void)klen;
    memcpy(arg, val, vlen);
    return (int)vlen + 1;
}

typedef struct walk_seen { uint8_t *seen; uint32_t nkeys; int bad; unsigned visits; } walk_seen;
static int walk_fn(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    (void)val;
    (void)vlen;
    walk_seen *w = arg;
    unsigned id;
    char tmp[16] = {0};
    memcpy(tmp, key, klen < 15 ? klen : 15);
    if (sscanf(tmp, "k%u-", &id) != 1 || id >= w->nkeys) w->bad++;
    else if (w->seen[id] < 255) w->seen[id]++;
    w->visits++;
    return 0;
}

static void test_get_fn(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-getfn", &path);
    nvh_hmap *m = new_map(pool, 0, 0);
    char buf[16];
    assert_int_equal(nvh_hmap_get_fn(m, "a", 1, getfn_copy, buf), NVH_E_NOTFOUND);
    assert_int_equal(nvh_hmap_put(m, "a", 1, "one", 3), NVH_OK);
    assert_int_equal(nvh_hmap_get_fn(m, "a", 1, getfn_copy, buf), 4);   /* fn's value */
    assert_memory_equal(buf, "one", 3);
    assert_int_equal(nvh_hmap_get_fn(m, "a", 1, NULL, buf), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_get_fn(NULL, "a", 1, getfn_copy, buf), NVH_E_INVAL);
    nvh_hmap_cursor c = {0, 0};
    assert_int_equal(nvh_hmap_walk(m, &c, 0, walk_fn, NULL), NVH_E_INVAL);
    assert_int_equal(nvh_hmap_walk(m, NULL, 1, walk_fn, NULL), NVH_E_INVAL);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* Inside a read section a value read by nvh_hmap_get stays readable after
 * its entry is deleted and the space freed: puts of the same size do not
 * reuse it until the section ends (they would at once without it). */
static void test_read_section(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-rsec", &path);
    nvh_hmap *m = new_map(pool, 0, 0);
    char val[200], k[16];
    memset(val, 'x', sizeof val);
    assert_int_equal(nvh_hmap_put(m, "a", 1, val, sizeof val), NVH_OK);
    nvh_hmap_read_begin(m);
    nvh_hmap_read_begin(m);                      /* sections nest */
    const void *v;
    size_t vlen;
    assert_int_equal(nvh_hmap_get(m, "a", 1, &v, &vlen), NVH_OK);
    nvh_hmap_read_end(m);
    assert_int_equal(nvh_hmap_delete(m, "a", 1), NVH_OK);
    memset(val, 'y', sizeof val);
    for (int i = 0; i < 2000; i++) {             /* same entry size as "a" */
        snprintf(k, sizeof k, "%c", 'b' + i % 20);
        assert_int_equal(nvh_hmap_put(m, k, 1, val, sizeof val), NVH_OK);
    }
    memset(val, 'x', sizeof val);
    assert_int_equal(vlen, sizeof val);
    assert_memory_equal(v, val, sizeof val);
    nvh_hmap_read_end(m);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* Walk in small steps while the map changes between the steps (updates of
 * keys that stay, deletes, inserts, several doublings): every key present
 * throughout is visited exactly once, every other at most once. */
static void test_walk(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-walk", &path);
    nvh_hmap *m = new_map(pool, 1, 100);
    enum { STAY = 1500, GO = 1500, NEW = 6000, N = STAY + GO + NEW };
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = 0; id < STAY + GO; id++)
        assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 1, v)), NVH_OK);
    /* a quiet walk first: every key once, in steps */
    walk_seen w = {calloc(N, 1), N, 0, 0};
    nvh_hmap_cursor c = {0, 0};
    int rc, steps = 0;
    while ((rc = nvh_hmap_walk(m, &c, 16, walk_fn, &w)) == 1) {
        steps++;
        assert_true(w.visits <= (unsigned)steps * 16 + 8);   /* runs are short */
    }
    assert_int_equal(rc, 0);
    assert_true(steps > 100);
    assert_int_equal(w.bad, 0);
    for (uint32_t id = 0; id < STAY + GO; id++) assert_int_equal(w.seen[id], 1);
    assert_int_equal(nvh_hmap_walk(m, &c, 16, walk_fn, &w), 0);   /* done stays done */

    /* now with changes between the steps */
    memset(w.seen, 0, N);
    w.visits = 0;
    c = (nvh_hmap_cursor){0, 0};
    uint64_t rng = 42, segs0 = 0;
    nvh_hmap_stats st;
    nvh_hmap_stats_get(m, &st);
    segs0 = st.segments;
    uint32_t next_new = STAY + GO, next_go = STAY;
    while ((rc = nvh_hmap_walk(m, &c, 5, walk_fn, &w)) == 1) {
        for (int i = 0; i < 8; i++) {
            uint32_t id = (uint32_t)(hm_rng(&rng) % STAY);
            assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 2, v)), NVH_OK);
            if (next_new < N) {
                id = next_new++;
                assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 1, v)), NVH_OK);
            }
        }
        if (next_go < STAY + GO) {
            uint32_t id = next_go++;
            assert_int_equal(nvh_hmap_delete(m, k, hm_key(id, k)), NVH_OK);
        }
    }
    assert_int_equal(rc, 0);
    assert_int_equal(w.bad, 0);
    nvh_hmap_stats_get(m, &st);
    assert_true(st.segments >= segs0 + 1);       /* the table doubled meanwhile */
    assert_true(next_new > STAY + GO + 4096);
    for (uint32_t id = 0; id < N; id++) {
        if (id < STAY) assert_int_equal(w.seen[id], 1);
        else assert_true(w.seen[id] <= 1);
    }
    check_ok(m);
    free(w.seen);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Threads: calls on one handle are serialised
 * ------------------------------------------------------------------------- */
typedef struct thr_arg { nvh_hmap *m; uint32_t first, n; int rc; } thr_arg;
static void *thr_main(void *p)
{
    thr_arg *a = p;
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = a->first; id < a->first + a->n && !a->rc; id++) {
        a->rc = nvh_hmap_put(a->m, k, hm_key(id, k), v, hm_val(id, 1, v));
        if (!a->rc && !hm_key_matches(a->m, id, 1)) a->rc = -100;
        if (!a->rc && id % 3 == 0) a->rc = nvh_hmap_delete(a->m, k, hm_key(id, k));
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-thr", &path);
    nvh_hmap *m = new_map(pool, 1, 100);
    pthread_t t[2];
    thr_arg a[2] = {{m, 0, 3000, 0}, {m, 3000, 3000, 0}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thr_main, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    assert_int_equal(a[0].rc, 0);
    assert_int_equal(a[1].rc, 0);
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count, 4000);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

/* Writers on two threads while a third walks in steps and a fourth reads
 * with nvh_hmap_get_fn (run under TSan by the sanitizer build): the stable
 * keys are visited exactly once per walk, every value read is whole (one
 * version's bytes), and the map checks clean afterwards. */
typedef struct conc_arg {
    nvh_hmap *m;
    uint32_t first, n;
    int rc;
    _Atomic int *stop;
} conc_arg;

enum { CONC_STABLE = 400 };

static void *conc_writer(void *p)
{
    conc_arg *a = p;
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t round = 2; round < 5 && !a->rc; round++)
        for (uint32_t id = a->first; id < a->first + a->n && !a->rc; id++) {
            a->rc = nvh_hmap_put(a->m, k, hm_key(id, k), v, hm_val(id, round, v));
            if (!a->rc && id % 4 == 0) a->rc = nvh_hmap_delete(a->m, k, hm_key(id, k));
        }
    /* the stable keys get new versions too */
    for (uint32_t id = 0; id < CONC_STABLE && !a->rc; id++)
        if (id % 2 == a->first % 2)
            a->rc = nvh_hmap_put(a->m, k, hm_key(id, k), v, hm_val(id, 7, v));
    return NULL;
}

static void *conc_reader(void *p)
{
    conc_arg *a = p;
    uint8_t k[HM_KEYBUF];
    uint64_t rng = 7;
    uint32_t max_ver = 7;   /* versions the writers write */
    while (!atomic_load(a->stop) && !a->rc) {
        uint32_t id = (uint32_t)(hm_rng(&rng) % (a->n));
        int rc = nvh_hmap_get_fn(a->m, k, hm_key(id, k), hm_whole_fn, &max_ver);
        if (rc != 1 && rc != NVH_E_NOTFOUND) a->rc = rc ? rc : -3;
        if (id < CONC_STABLE && rc != 1) a->rc = -4;           /* never absent */
    }
    return NULL;
}

static void *conc_walker(void *p)
{
    conc_arg *a = p;
    uint8_t *seen = calloc(a->n, 1);
    while (!atomic_load(a->stop) && !a->rc) {
        memset(seen, 0, a->n);
        walk_seen w = {seen, a->n, 0, 0};
        nvh_hmap_cursor c = {0, 0};
        int rc;
        while ((rc = nvh_hmap_walk(a->m, &c, 7, walk_fn, &w)) == 1) {}
        if (rc != 0 || w.bad) a->rc = rc ? rc : -5;
        for (uint32_t id = 0; id < CONC_STABLE && !a->rc; id++)
            if (seen[id] != 1) a->rc = -6;
        for (uint32_t id = CONC_STABLE; id < a->n && !a->rc; id++)
            if (seen[id] > 1) a->rc = -7;
    }
    free(seen);
    return NULL;
}

static void test_concurrent_readers(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("hm-conc", &path);
    nvh_hmap *m = new_map(pool, 1, 100);
    enum { PER = 1500, TOTAL = CONC_STABLE + 2 * PER };
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    for (uint32_t id = 0; id < CONC_STABLE; id++)
        assert_int_equal(nvh_hmap_put(m, k, hm_key(id, k), v, hm_val(id, 1, v)), NVH_OK);
    _Atomic int stop = 0;
    conc_arg w[2] = {{m, CONC_STABLE, PER, 0, &stop}, {m, CONC_STABLE + PER, PER, 0, &stop}};
    conc_arg r = {m, 0, TOTAL, 0, &stop}, wk = {m, 0, TOTAL, 0, &stop};
    pthread_t t[4];
    pthread_create(&t[0], NULL, conc_writer, &w[0]);
    pthread_create(&t[1], NULL, conc_writer, &w[1]);
    pthread_create(&t[2], NULL, conc_reader, &r);
    pthread_create(&t[3], NULL, conc_walker, &wk);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    atomic_store(&stop, 1);
    pthread_join(t[2], NULL);
    pthread_join(t[3], NULL);
    assert_int_equal(w[0].rc, 0);
    assert_int_equal(w[1].rc, 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal(wk.rc, 0);
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count, CONC_STABLE + 2 * (PER - PER / 4));
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_ops), cmocka_unit_test(test_property),
        cmocka_unit_test(test_resize),    cmocka_unit_test(test_seg0_batches),
        cmocka_unit_test(test_costs),
        cmocka_unit_test(test_destroy),   cmocka_unit_test(test_threads),
        cmocka_unit_test(test_readonly),  cmocka_unit_test(test_get_fn),
        cmocka_unit_test(test_read_section),
        cmocka_unit_test(test_walk),      cmocka_unit_test(test_concurrent_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
