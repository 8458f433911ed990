/* test_btree_basic.c — the B+ tree's API, errors, and property tests against
 * a DRAM model: random sequences of put (insert/update), delete and get in
 * every variant, the tree compared with the model after every step (get of
 * the key touched, count, and — in the small runs — a full ordered scan),
 * invariants checked regularly; reopen after close; range scans; wear
 * counting.
 */
#include "btree_test.h"
#include "ds/btree.h"                 /* nvh_btree_debug_fault_, BT_FAULT_* */

#define MAXLEN 300

typedef struct variant {
    const char *name;
    nvh_btree_mode mode;
    int sorted;
    int no_key_directory;
    nvh_btree_durability durability;
} variant;

static const variant g_variants[] = {
    {"durable", NVH_BTREE_GROUPS, 0, 0, NVH_BTREE_DURABLE_ON_RETURN},   /* the default */
    {"groups", NVH_BTREE_GROUPS, 0, 0, NVH_BTREE_DURABLE_DEFERRED},
    {"flush", NVH_BTREE_FLUSH, 0, 0, 0},
    {"nt", NVH_BTREE_NT, 0, 0, 0},
    {"volatile", NVH_BTREE_VOLATILE, 0, 0, 0},
    {"volatile-sorted", NVH_BTREE_VOLATILE, 1, 0, 0},
    {"groups-nodir", NVH_BTREE_GROUPS, 0, 1, NVH_BTREE_DURABLE_DEFERRED},   /* no key directory */
};

static nvh_pool *new_pool(const char *name, const char **path)
{
    *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(*path, BT_LAYOUT, 8u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    return pool;
}

static void full_compare(nvh_btree *t, const bt_model *m)
{
    bt_scan_out o = {0};
    assert_int_equal(nvh_btree_scan(t, 0, UINT64_MAX, bt_scan_cb, &o), 0);
    if (!bt_scan_matches(&o, m, MAXLEN)) {
        fprintf(stderr, "scan: %zu keys, model %llu\n", o.n, (unsigned long long)m->live);
        fail_msg("scan differs from the model");
    }
    bt_scan_free(&o);
}

/* One random run: ops over nkeys keys, compared after every step. */
static void property_run(const variant *v, uint64_t seed, unsigned ops, uint64_t nkeys,
                         int scan_every_step)
{
    const char *path;
    nvh_pool *pool = new_pool("bt-prop", &path);
    nvh_btree_options opt = {.mode = v->mode, .sorted = v->sorted,
                             .no_key_directory = v->no_key_directory, .durability = v->durability};
    nvh_btree *t = nvh_btree_open(v->mode == NVH_BTREE_VOLATILE ? NULL : pool, "prop", 1, &opt);
    assert_non_null(t);
    bt_model m;
    bt_model_init(&m, nkeys);
    unsigned char buf[MAXLEN + 1];
    uint64_t s = seed;
    uint64_t cursor = 0;
    for (unsigned step = 0; step < ops; step++) {
        uint64_t r = test_rand(&s);
        uint64_t i = r % nkeys;
        unsigned what = (unsigned)(r >> 40) % 10;
        /* phases: grow, then churn, then shrink in key order, so whole
         * leaves empty out (merge by deletion) */
        int shrink = step > ops * 2 / 3;
        if (shrink && what < 8) i = m.order[cursor++ % nkeys];
        uint64_t key = bt_key_of(i);
        if (what < 3 || (shrink && what < 8)) {
            int rc = nvh_btree_delete(t, key);
            if (m.ver[i]) {
                assert_int_equal(rc, NVH_OK);
                m.ver[i] = 0;
                m.live--;
            } else {
                assert_int_equal(rc, NVH_E_NOTFOUND);
            }
        } else {
            uint64_t ver = step + 1;
            size_t len = bt_value(key, ver, buf, MAXLEN);
            assert_int_equal(nvh_btree_put(t, key, buf, len), NVH_OK);
            if (!m.ver[i]) m.live++;
            m.ver[i] = ver;
        }
        /* compare after every step */
        const void *val;
        size_t len;
        int rc = nvh_btree_get(t, key, &val, &len);
        if (m.ver[i]) {
            assert_int_equal(rc, NVH_OK);
            size_t elen = bt_value(key, m.ver[i], buf, MAXLEN);
            assert_int_equal(len, elen);
            assert_memory_equal(val, buf, len);
        } else {
            assert_int_equal(rc, NVH_E_NOTFOUND);
        }
        assert_int_equal(nvh_btree_count(t), m.live);
        if (scan_every_step || step % 97 == 0) full_compare(t, &m);
        if (step % 211 == 0) {
            if (nvh_btree_check(t) != NVH_OK) fail_msg("check: %s", nvh_errormsg());
        }
    }
    full_compare(t, &m);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    assert_int_equal(nvh_btree_sync(t), NVH_OK);
    assert_int_equal(nvh_btree_durable(t), nvh_btree_ops(t));
    nvh_btree_stats st;
    nvh_btree_stats_get(t, &st);
    printf("  %-16s seed %llu: %u ops, %llu live, splits %llu, leaves removed %llu\n", v->name,
           (unsigned long long)seed, ops, (unsigned long long)m.live,
           (unsigned long long)st.splits, (unsigned long long)st.leaves_removed);
    if (ops >= 2000 && nkeys >= 500) assert_true(st.splits > 0);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    /* persistent variants: everything is there after reopening the pool */
    if (v->mode != NVH_BTREE_VOLATILE) {
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        t = nvh_btree_open(pool, "prop", 0, &opt);
        assert_non_null(t);
        assert_int_equal(nvh_btree_check(t), NVH_OK);
        full_compare(t, &m);
        assert_int_equal(nvh_btree_count(t), m.live);
        assert_int_equal(nvh_btree_close(t), NVH_OK);
    }
    bt_model_free(&m);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void property_small_every_step(void **state)
{
    (void)state;
    for (size_t v = 0; v < sizeof g_variants / sizeof g_variants[0]; v++)
        property_run(&g_variants[v], 11 + v, 1500, 150, 1);
}

static void property_large(void **state)
{
    (void)state;
    for (size_t v = 0; v < sizeof g_variants / sizeof g_variants[0]; v++)
        for (uint64_t seed = 1; seed <= 2; seed++) property_run(&g_variants[v], seed, 12000, 3000, 0);
}

/* ---------------------------------------------------------------------------
 * API details
 * ------------------------------------------------------------------------- */
static void errors(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-err", &path);
    assert_null(nvh_btree_open(pool, "", 1, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_btree_open(pool, "01234567890123456789012345678901234567890", 1, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_btree_open(pool, "absent", 0, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    nvh_btree_options bad = {.mode = NVH_BTREE_GROUPS, .sorted = 1};
    assert_null(nvh_btree_open(pool, "x", 1, &bad));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_btree_open(NULL, "x", 1, NULL));
    nvh_btree *t = nvh_btree_open(pool, "t", 1, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_btree_get(t, 5, NULL, NULL), NVH_E_NOTFOUND);
    assert_int_equal(nvh_btree_delete(t, 5), NVH_E_NOTFOUND);
    assert_int_equal(nvh_btree_put(t, 5, NULL, 3), NVH_E_INVAL);
    assert_int_equal(nvh_btree_put(t, 5, NULL, 0), NVH_OK);      /* empty value */
    size_t len = 99;
    assert_int_equal(nvh_btree_get(t, 5, NULL, &len), NVH_OK);
    assert_int_equal(len, 0);
    assert_int_equal(nvh_btree_count(t), 1);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    /* the name space is per tree */
    t = nvh_btree_open(pool, "t", 0, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_btree_count(t), 1);
    nvh_btree *u = nvh_btree_open(pool, "u", 1, NULL);
    assert_non_null(u);
    assert_int_equal(nvh_btree_count(u), 0);
    assert_int_equal(nvh_btree_close(u), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_btree_close(NULL), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

typedef struct range_ctx {
    uint64_t n, last, stop_after;
    int ordered;
} range_ctx;

static int range_cb(uint64_t key, const void *value, size_t len, void *arg)
{
    range_ctx *c = arg;
    if (c->n && key <= c->last) c->ordered = 0;
    assert_int_equal(len, 8);
    uint64_t v;
    memcpy(&v, value, 8);
    assert_int_equal(v, key * 3);
    c->last = key;
    c->n++;
    return c->stop_after && c->n == c->stop_after ? 42 : 0;
}

static void range_scan(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-range", &path);
    nvh_btree *t = nvh_btree_open(pool, "r", 1, NULL);
    assert_non_null(t);
    /* descending then scattered inserts: the leaves are far from sorted */
    uint64_t s = 5;
    for (uint64_t k = 5000; k > 0; k--) {
        uint64_t key = k * 10, v = key * 3;
        assert_int_equal(nvh_btree_put(t, key, &v, 8), NVH_OK);
        uint64_t x = (test_rand(&s) % 50000) * 10 + 5, xv = x * 3;
        if (k % 4 == 0) assert_int_equal(nvh_btree_put(t, x, &xv, 8), NVH_OK);
    }
    range_ctx c = {0, 0, 0, 1};
    assert_int_equal(nvh_btree_scan(t, 1000, 2000, range_cb, &c), 0);
    assert_true(c.ordered);
    uint64_t expect = 101; /* 1000, 1010, ..., 2000 */
    uint64_t extra = 0;
    /* count the scattered keys in range through gets */
    for (uint64_t k = 1005; k < 2000; k += 10) extra += nvh_btree_get(t, k, NULL, NULL) == NVH_OK;
    assert_int_equal(c.n, expect + extra);
    range_ctx all = {0, 0, 0, 1};
    assert_int_equal(nvh_btree_scan(t, 0, UINT64_MAX, range_cb, &all), 0);
    assert_true(all.ordered);
    assert_int_equal(all.n, nvh_btree_count(t));
    range_ctx stop = {0, 0, 10, 1};
    assert_int_equal(nvh_btree_scan(t, 0, UINT64_MAX, range_cb, &stop), 42);
    assert_int_equal(stop.n, 10);
    range_ctx none = {0, 0, 0, 1};
    assert_int_equal(nvh_btree_scan(t, 2000, 1000, range_cb, &none), 0);
    assert_int_equal(none.n, 0);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static int count_lines;
static void wear_cb(uint64_t writes, void *arg)
{
    (void)arg;
    assert_true(writes > 0);
    count_lines++;
}

static void durable_and_wear(void **state)
{
    (void)state;
    const char *path;
    nvh_pool *pool = new_pool("bt-dur", &path);
    nvh_group_options go = {.batch_count = 4, .batch_ns = NVH_GROUP_NEVER};
    nvh_btree_options opt = {.mode = NVH_BTREE_GROUPS, .count_wear = 1, .group = &go,
                             .durability = NVH_BTREE_DURABLE_DEFERRED};
    nvh_btree *t = nvh_btree_open(pool, "d", 1, &opt);
    assert_non_null(t);
    for (uint64_t k = 0; k < 3; k++) assert_int_equal(nvh_btree_put(t, k, &k, 8), NVH_OK);
    assert_int_equal(nvh_btree_ops(t), 3);
    assert_true(nvh_btree_durable(t) < 3);           /* deferred: not yet acknowledged */
    for (uint64_t k = 3; k < 500; k++) assert_int_equal(nvh_btree_put(t, k, &k, 8), NVH_OK);
    assert_true(nvh_btree_durable(t) > 0);           /* the batches advanced it */
    assert_int_equal(nvh_btree_sync(t), NVH_OK);
    assert_int_equal(nvh_btree_durable(t), 500);
    assert_int_equal(nvh_btree_delete(t, 7), NVH_OK); /* synchronous: durable at once */
    assert_int_equal(nvh_btree_durable(t), 501);
    count_lines = 0;
    uint64_t lines = nvh_btree_wear_foreach(t, wear_cb, NULL);
    assert_true(lines > 16);
    assert_int_equal((uint64_t)count_lines, lines);
    assert_non_null(nvh_btree_group(t));
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A protected pool's 1 MiB record slabs fill the allocator's 4 MiB chunks:
 * four a chunk (asked for one header line short of 1 MiB), not three with
 * a quarter of the heap left free between them. */
static void slabs_pack_chunks(void **state)
{
    (void)state;
    const char *path = test_path("bt-pack");
    nvh_pool *pool = nvh_pool_create(path, BT_LAYOUT, 128u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_btree *t = nvh_btree_open(pool, "pack", 1, NULL);
    assert_non_null(t);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    static unsigned char v[2000];
    for (uint64_t k = 0; k < 20000; k++) {        /* ~40 MiB: ~40 held slabs */
        memset(v, (int)k, sizeof v);
        assert_int_equal(nvh_btree_put(t, k * 2654435761u, v, sizeof v), NVH_OK);
    }
    assert_int_equal(nvh_btree_sync(t), NVH_OK);
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    printf("  heap %llu MiB, live %llu MiB, free %llu MiB\n",
           (unsigned long long)(hs.heap_bytes >> 20), (unsigned long long)(hs.live_bytes >> 20),
           (unsigned long long)(hs.free_bytes >> 20));
    assert_true(hs.free_bytes * 10 < hs.heap_bytes);   /* 1 MiB slabs: ~25 % */
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_OFF, 0), NVH_OK);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Large values in the groups variant, pmem domain: all but the record's
 * first line are streamed (non-temporal stores, counted in nt_bytes); the
 * values read back whole around the threshold (1 KiB) and at odd lengths,
 * after updates, and after a reopen. The crash tests cover the same code's
 * ordering in the sim domain (copied and flushed there). */
static void large_values_streamed(void **state)
{
    (void)state;
    const char *path = test_path("bt-large");
    nvh_pool *pool = nvh_pool_create(path, BT_LAYOUT, 32u << 20, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    static const size_t lens[] = {0, 100, 1023, 1024, 1025, 1071, 4096, 5000, 17000, 33333};
    enum { N = sizeof lens / sizeof lens[0], ROUNDS = 3 };
    static unsigned char v[40000], want[40000];
    nvh_btree *t = nvh_btree_open(pool, "large", 1, NULL);
    assert_non_null(t);
    nvh_stats_reset(pool);
    for (unsigned round = 0; round < ROUNDS; round++) {
        for (uint64_t k = 0; k < N; k++) {         /* inserts, then updates */
            uint64_t s = k * 7919u + round;
            for (size_t i = 0; i < lens[k]; i++) v[i] = (unsigned char)test_rand(&s);
            assert_int_equal(nvh_btree_put(t, k, v, lens[k]), NVH_OK);
        }
    }
    nvh_stats st;
    nvh_stats_get(pool, &st);
    /* streamed: at least the bodies of the values >= 1 KiB, every round */
    assert_true(st.nt_bytes >= (uint64_t)ROUNDS * (1024 - 48 - 63));
    for (int reopen = 0; reopen < 2; reopen++) {
        for (uint64_t k = 0; k < N; k++) {
            uint64_t s = k * 7919u + (ROUNDS - 1);
            for (size_t i = 0; i < lens[k]; i++) want[i] = (unsigned char)test_rand(&s);
            const void *got;
            size_t len;
            assert_int_equal(nvh_btree_get(t, k, &got, &len), NVH_OK);
            assert_int_equal(len, lens[k]);
            if (len) assert_memory_equal(got, want, len);
        }
        assert_int_equal(nvh_btree_check(t), NVH_OK);
        nvh_btree_close(t);
        nvh_pool_close(pool);
        pool = nvh_pool_open(path, BT_LAYOUT, NVH_DOMAIN_PMEM);
        assert_non_null(pool);
        t = nvh_btree_open(pool, "large", 0, NULL);
        assert_non_null(t);
    }
    nvh_btree_close(t);
    nvh_pool_close(pool);
    unlink(path);
}

/* Record slabs: this session's slabs are freed as they empty; slabs of an
 * earlier session are only counted (and freed) by nvh_btree_reclaim. */
static void slabs(void **state)
{
    (void)state;
    const char *path = test_path("bt-slabs");
    nvh_pool *pool = nvh_pool_create(path, BT_LAYOUT, 32u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    static unsigned char v[2000];
    enum { N = 1200 };
    nvh_btree *t = nvh_btree_open(pool, "s", 1, NULL);
    assert_non_null(t);
    for (uint64_t k = 0; k < N; k++) {          /* 2 KiB records: 31 per slab (64 KiB) */
        memset(v, (int)k, sizeof v);
        assert_int_equal(nvh_btree_put(t, k, v, sizeof v), NVH_OK);
    }
    for (uint64_t k = 0; k < N / 2; k++) assert_int_equal(nvh_btree_delete(t, k), NVH_OK);
    nvh_btree_stats st;
    nvh_btree_stats_get(t, &st);
    assert_true(st.slabs >= N / 31);
    assert_true(st.slabs <= N / 31 + 2);   /* 39 */
    assert_true(st.slabs_freed >= N / 2 / 31 - 1);       /* the emptied ones */
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    /* a new session: the old slabs are not tracked until reclaim */
    t = nvh_btree_open(pool, "s", 0, NULL);
    assert_non_null(t);
    for (uint64_t k = N / 2; k < N * 3 / 4; k++) assert_int_equal(nvh_btree_delete(t, k), NVH_OK);
    nvh_btree_stats_get(t, &st);
    assert_int_equal(st.slabs_freed, 0);
    assert_int_equal(nvh_btree_reclaim(t), NVH_OK);
    nvh_btree_stats_get(t, &st);
    assert_true(st.slabs_freed >= N / 4 / 31 - 1);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    /* after the recount, deletes free slabs again */
    uint64_t before = st.slabs_freed;
    for (uint64_t k = N * 3 / 4; k < N; k++) assert_int_equal(nvh_btree_delete(t, k), NVH_OK);
    nvh_btree_stats_get(t, &st);
    assert_true(st.slabs_freed >= before + N / 4 / 31 - 1);
    assert_int_equal(nvh_btree_count(t), 0);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    /* and the tree still works */
    for (uint64_t k = 0; k < 100; k++) {
        memset(v, (int)k + 1, sizeof v);
        assert_int_equal(nvh_btree_put(t, k, v, sizeof v), NVH_OK);
    }
    for (uint64_t k = 0; k < 100; k++) {
        const void *p;
        size_t len;
        assert_int_equal(nvh_btree_get(t, k, &p, &len), NVH_OK);
        assert_int_equal(len, sizeof v);
        assert_int_equal(((const unsigned char *)p)[len - 1], (unsigned char)(k + 1));
    }
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Lookups of validated entries trust the leaf companions (key and record
 * word, no read of the node): after every kind of store to a slot — insert
 * (pending, then validated), update to a value of another length, delete
 * and re-insert, a reopen that rebuilds the companions from the media — a
 * lookup must return exactly the current value. Fails if any of those
 * stores leaves a companion behind (e.g. an update that does not refresh
 * the record word returns the old version). */
static void check_get(nvh_btree *t, uint64_t key, uint64_t ver)
{
    static unsigned char want[3000];
    size_t wlen = bt_value(key, ver, want, sizeof want);
    const void *p;
    size_t len;
    assert_int_equal(nvh_btree_get(t, key, &p, &len), NVH_OK);
    assert_int_equal(len, wlen);
    assert_memory_equal(p, want, wlen);
}

static void companion_exact(void **state)
{
    (void)state;
    const nvh_btree_mode modes[] = {NVH_BTREE_GROUPS, NVH_BTREE_FLUSH, NVH_BTREE_VOLATILE};
    static unsigned char v[3000];
    enum { N = 1500 };
    for (unsigned mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        const char *path = test_path("bt-companion");
        nvh_pool *pool = NULL;
        if (modes[mi] != NVH_BTREE_VOLATILE) {
            pool = nvh_pool_create(path, BT_LAYOUT, 64u << 20, NVH_DOMAIN_PROCESS);
            assert_non_null(pool);
        }
        nvh_btree_options o = {.mode = modes[mi], .durability = NVH_BTREE_DURABLE_DEFERRED};
        nvh_btree *t = nvh_btree_open(pool, "c", 1, &o);
        assert_non_null(t);
        /* inserts, each looked up while (in GROUPS) still pending */
        for (uint64_t k = 0; k < N; k++) {
            size_t len = bt_value(bt_key_of(k), 1, v, sizeof v);
            assert_int_equal(nvh_btree_put(t, bt_key_of(k), v, len), NVH_OK);
            check_get(t, bt_key_of(k), 1);
        }
        assert_int_equal(nvh_btree_sync(t), NVH_OK);
        for (uint64_t k = 0; k < N; k++) check_get(t, bt_key_of(k), 1);     /* validated */
        /* updates (other lengths: other line counts, other slabs) */
        for (uint64_t k = 0; k < N; k++) {
            size_t len = bt_value(bt_key_of(k), 2, v, sizeof v);
            assert_int_equal(nvh_btree_put(t, bt_key_of(k), v, len), NVH_OK);
            check_get(t, bt_key_of(k), 2);
        }
        /* delete a third, look up, re-insert (the freed slot is reused) */
        for (uint64_t k = 0; k < N; k += 3) {
            assert_int_equal(nvh_btree_delete(t, bt_key_of(k)), NVH_OK);
            assert_int_equal(nvh_btree_get(t, bt_key_of(k), NULL, NULL), NVH_E_NOTFOUND);
            size_t len = bt_value(bt_key_of(k), 3, v, sizeof v);
            assert_int_equal(nvh_btree_put(t, bt_key_of(k), v, len), NVH_OK);
            check_get(t, bt_key_of(k), 3);
        }
        assert_int_equal(nvh_btree_sync(t), NVH_OK);
        for (uint64_t k = 0; k < N; k++) check_get(t, bt_key_of(k), k % 3 ? 2 : 3);
        assert_int_equal(nvh_btree_check(t), NVH_OK);
        if (pool) {
            /* a new session: companions rebuilt from the nodes */
            assert_int_equal(nvh_btree_close(t), NVH_OK);
            t = nvh_btree_open(pool, "c", 0, &o);
            assert_non_null(t);
            for (uint64_t k = 0; k < N; k++) check_get(t, bt_key_of(k), k % 3 ? 2 : 3);
        }
        assert_int_equal(nvh_btree_close(t), NVH_OK);
        if (pool) {
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
            unlink(path);
        }
    }
}

/* The key directory starts at the first lookup and is built from the leaves
 * a few at a time by the lookups that follow (btree.h, BT_KD_*). Inserts
 * before it (GROUPS: some still pending) must not fill it; while it is
 * built, updates, deletes and new inserts interleave with the lookups; once
 * it is complete it must hold exactly the live keys, and every lookup must
 * return the current value (a stale or missing entry would show: a lookup
 * the directory answers is not checked against the tree in release
 * builds). The negative control (BT_FAULT_KD_SKIP_LEAF: the build skips
 * every other leaf) must end with keys missing from the directory. */
static uint64_t directory_run(nvh_btree_mode mode, unsigned fault)
{
    enum { N = 20000, EXTRA = 4000 };
    static unsigned char v[MAXLEN + 1];
    const char *path = test_path("bt-kd");
    nvh_pool *pool = NULL;
    if (mode != NVH_BTREE_VOLATILE) {
        pool = nvh_pool_create(path, BT_LAYOUT, 64u << 20, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
    }
    nvh_btree_options o = {.mode = mode, .durability = NVH_BTREE_DURABLE_DEFERRED};
    nvh_btree *t = nvh_btree_open(pool, "kd", 1, &o);
    assert_non_null(t);
    if (fault) nvh_btree_debug_fault_(t, fault);
    bt_model m;
    bt_model_init(&m, N + EXTRA);
    for (uint64_t i = 0; i < N; i++) {
        size_t len = bt_value(bt_key_of(i), 1, v, MAXLEN);
        assert_int_equal(nvh_btree_put(t, bt_key_of(i), v, len), NVH_OK);
        m.ver[i] = 1;
        m.live++;
    }
    for (uint64_t i = 0; i < N; i += 7) {          /* deletes before the start */
        assert_int_equal(nvh_btree_delete(t, bt_key_of(i)), NVH_OK);
        m.ver[i] = 0;
        m.live--;
    }
    nvh_btree_stats st;
    nvh_btree_stats_get(t, &st);
    assert_int_equal(st.directory_state, 0);        /* no lookup yet */
    assert_int_equal(st.directory_keys, 0);
    uint64_t s = 99, extra = 0, missing = UINT64_MAX;
    int saw_building = 0;
    for (unsigned step = 0; step < 3 * N; step++) {
        uint64_t r = test_rand(&s);
        uint64_t i = r % (N + extra);
        unsigned what = (unsigned)(r >> 40) % 16;
        if (what == 0) {                            /* update */
            uint64_t ver = step + 2;
            size_t len = bt_value(bt_key_of(i), ver, v, MAXLEN);
            assert_int_equal(nvh_btree_put(t, bt_key_of(i), v, len), NVH_OK);
            if (!m.ver[i]) m.live++;
            m.ver[i] = ver;
        } else if (what == 1) {                     /* delete */
            int rc = nvh_btree_delete(t, bt_key_of(i));
            assert_int_equal(rc, m.ver[i] ? NVH_OK : NVH_E_NOTFOUND);
            if (m.ver[i]) m.live--;
            m.ver[i] = 0;
        } else if (what == 2 && extra < EXTRA) {    /* a new key */
            i = N + extra++;
            size_t len = bt_value(bt_key_of(i), 1, v, MAXLEN);
            assert_int_equal(nvh_btree_put(t, bt_key_of(i), v, len), NVH_OK);
            m.ver[i] = 1;
            m.live++;
        }
        const void *p;
        size_t len;
        int rc = nvh_btree_get(t, bt_key_of(i), &p, &len);
        if (m.ver[i]) {
            if (rc != NVH_OK) fail_msg("step %u: key %llu missing", step, (unsigned long long)i);
            size_t elen = bt_value(bt_key_of(i), m.ver[i], v, MAXLEN);
            assert_int_equal(len, elen);
            assert_memory_equal(p, v, elen);
        } else if (rc != NVH_E_NOTFOUND) {
            fail_msg("step %u: deleted key %llu found", step, (unsigned long long)i);
        }
        nvh_btree_stats_get(t, &st);
        if (st.directory_state == 1) saw_building = 1;
        /* complete: it must hold every live key now (later lookups that
         * miss it would add their keys and hide a gap) */
        if (st.directory_state == 2 && missing == UINT64_MAX) missing = m.live - st.directory_keys;
    }
    assert_true(saw_building);                       /* it was built in steps */
    assert_int_equal(st.directory_state, 2);
    /* every live key once more (directory hits), then the count */
    for (uint64_t i = 0; i < N + extra; i++) {
        const void *p;
        size_t len;
        int rc = nvh_btree_get(t, bt_key_of(i), &p, &len);
        assert_int_equal(rc, m.ver[i] ? NVH_OK : NVH_E_NOTFOUND);
    }
    nvh_btree_stats_get(t, &st);
    if (!fault) assert_int_equal(st.directory_keys, m.live);
    assert_int_equal(nvh_btree_count(t), m.live);
    bt_model_free(&m);
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    if (pool) {
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
    return missing;                  /* live keys it missed when complete */
}

static void directory_build(void **state)
{
    (void)state;
    const nvh_btree_mode modes[] = {NVH_BTREE_GROUPS, NVH_BTREE_FLUSH, NVH_BTREE_VOLATILE};
    for (unsigned mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
        assert_int_equal(directory_run(modes[mi], 0), 0);
    /* negative control: a build that skips leaves leaves keys out */
    uint64_t missing = directory_run(NVH_BTREE_GROUPS, BT_FAULT_KD_SKIP_LEAF);
    printf("  negative control: the skipping build misses %llu live keys\n",
           (unsigned long long)missing);
    assert_true(missing > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(errors),
        cmocka_unit_test(range_scan),
        cmocka_unit_test(durable_and_wear),
        cmocka_unit_test(slabs),
        cmocka_unit_test(large_values_streamed),
        cmocka_unit_test(slabs_pack_chunks),
        cmocka_unit_test(companion_exact),
        cmocka_unit_test(directory_build),
        cmocka_unit_test(property_small_every_step),
        cmocka_unit_test(property_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
