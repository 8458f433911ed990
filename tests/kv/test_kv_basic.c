/* test_kv_basic.c — the key-value store API (nvh_kv_*) without crashes:
 * create/open modes, several named stores in one pool, list and drop, every
 * operation of the hash engine against a DRAM model, limits and bad input
 * (messages in the store's terms), a wrong engine or a damaged descriptor at
 * open, a full pool, read-only opens, statistics, and fences per put. */
#include "test_util.h"

#include "kv/kv.h"

#define LAYOUT "nvkv"

static nvh_kv *kv_open_hash(const char *path, const char *name, nvh_kv_create mode)
{
    nvh_kv_config c = {.path = path, .name = name, .engine = "hash", .create = mode,
                       .size = 16 << 20};
    return nvh_kv_open(&c);
}

static void expect_msg(const char *part)
{
    if (!strstr(nvh_errormsg(), part)) fail_msg("message '%s' lacks '%s'", nvh_errormsg(), part);
}

static void must(int rc)
{
    if (rc != NVH_OK) fail_msg("rc %d: %s", rc, nvh_errormsg());
}

/* ---------------------------------------------------------------------------
 * Create / open modes, names, engines
 * ------------------------------------------------------------------------- */
static void test_open_modes(void **state)
{
    (void)state;
    const char *path = test_path("kv-modes");
    /* open-existing on a missing pool */
    assert_null(kv_open_hash(path, "s", NVH_KV_OPEN_EXISTING));
    assert_int_equal(nvh_errcode(), NVH_E_NOENT);
    nvh_kv *kv = kv_open_hash(path, "s", NVH_KV_CREATE_IF_MISSING);
    assert_non_null(kv);
    assert_string_equal(nvh_kv_engine(kv), "hash");
    assert_non_null(nvh_kv_pool(kv));
    must(nvh_kv_put(kv, "k", 1, "v", 1));
    must(nvh_kv_close(kv));
    /* create-new of an existing store; open-existing of a missing store */
    assert_null(kv_open_hash(path, "s", NVH_KV_CREATE_NEW));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_null(kv_open_hash(path, "t", NVH_KV_OPEN_EXISTING));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    expect_msg("'t'");
    /* create-new in an existing pool makes a second store */
    kv = kv_open_hash(path, "t", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    assert_int_equal(nvh_kv_exists(kv, "k", 1), 0);
    must(nvh_kv_close(kv));
    /* reopen: the data is there; engine NULL accepts the stored one */
    nvh_kv_config c = {.path = path, .name = "s"};
    kv = nvh_kv_open(&c);
    assert_non_null(kv);
    assert_string_equal(nvh_kv_engine(kv), "hash");
    assert_int_equal(nvh_kv_exists(kv, "k", 1), 1);
    must(nvh_kv_close(kv));
    /* the wrong engine, a comparator for a hash store, a bad engine name */
    c.engine = "sorted";
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    expect_msg("uses the hash engine, not sorted");
    c.engine = "btree";
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    c.engine = "hash";
    c.name = "this-store-name-is-longer-than-32-bytes";
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_TOOLONG);
    c.name = "";
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    /* another layout */
    c.name = "s";
    c.layout = "other";
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_LAYOUT);
    assert_null(nvh_kv_open(NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    unlink(path);
}

/* A store of the default name, engine "sorted" by default: with the sorted
 * engine built in it works, else it is refused cleanly (NVH_E_NOTSUP). */
static void test_default_sorted(void **state)
{
    (void)state;
    const char *path = test_path("kv-default");
    nvh_kv_config c = {.path = path, .create = NVH_KV_CREATE_IF_MISSING};
    nvh_kv *kv = nvh_kv_open(&c);
    if (!kv) {
        assert_int_equal(nvh_errcode(), NVH_E_NOTSUP);
        unlink(path);
        return;
    }
    assert_string_equal(nvh_kv_engine(kv), "sorted");
    must(nvh_kv_put(kv, "b", 1, "2", 1));
    must(nvh_kv_put(kv, "a", 1, "1", 1));
    uint64_t n = 0;
    must(nvh_kv_count_all(kv, &n));
    assert_int_equal(n, 2);
    must(nvh_kv_close(kv));
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * The sorted engine through the store: ordered calls, iterators, batches,
 * the order flag (skipped when the library has no sorted engine)
 * ------------------------------------------------------------------------- */
typedef struct collect {
    char keys[64][8];
    int n;
} collect;

static int collect_cb(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)v, (void)vl;
    collect *c = arg;
    snprintf(c->keys[c->n++], 8, "%.*s", (int)kl, (const char *)k);
    return 0;
}

static int rev_cmp(const void *a, size_t al, const void *b, size_t bl, void *arg)
{
    (void)arg;
    size_t n = al < bl ? al : bl;
    int c = memcmp(a, b, n);
    if (c) return -c;
    return al < bl ? 1 : al > bl ? -1 : 0;
}

static void test_sorted_api(void **state)
{
    (void)state;
    const char *path = test_path("kv-sorted");
    nvh_kv_config c = {.path = path, .name = "s", .engine = "sorted",
                       .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open(&c);
    if (!kv) {
        assert_int_equal(nvh_errcode(), NVH_E_NOTSUP);
        unlink(path);
        return;
    }
    const char *keys[] = {"b", "d", "a", "c", "e", "ab"};
    for (int i = 0; i < 6; i++) must(nvh_kv_put(kv, keys[i], strlen(keys[i]), keys[i], 1));
    uint64_t n;
    must(nvh_kv_count_all(kv, &n));
    assert_int_equal(n, 6);
    must(nvh_kv_count_above(kv, "b", 1, &n));       /* c d e */
    assert_int_equal(n, 3);
    must(nvh_kv_count_below(kv, "b", 1, &n));       /* a ab */
    assert_int_equal(n, 2);
    must(nvh_kv_count_between(kv, "a", 1, "d", 1, &n));   /* ab b c */
    assert_int_equal(n, 3);
    collect col = {.n = 0};
    must(nvh_kv_get_all(kv, collect_cb, &col));
    assert_int_equal(col.n, 6);
    assert_string_equal(col.keys[0], "a");
    assert_string_equal(col.keys[1], "ab");
    assert_string_equal(col.keys[5], "e");
    col.n = 0;
    must(nvh_kv_get_between(kv, "a", 1, "d", 1, collect_cb, &col));
    assert_int_equal(col.n, 3);
    assert_string_equal(col.keys[0], "ab");
    assert_string_equal(col.keys[2], "c");
    col.n = 0;
    must(nvh_kv_get_above(kv, "c", 1, collect_cb, &col));
    assert_int_equal(col.n, 2);
    col.n = 0;
    must(nvh_kv_get_below(kv, "ab", 2, collect_cb, &col));
    assert_int_equal(col.n, 1);
    /* iterators */
    nvh_kv_iter *it = nvh_kv_iter_new(kv);
    assert_non_null(it);
    const void *k, *v;
    size_t kl, vl;
    assert_int_equal(nvh_kv_iter_key(it, &k, &kl), NVH_E_NOTFOUND);
    must(nvh_kv_iter_first(it));
    int seen = 1;
    while (nvh_kv_iter_next(it) == NVH_OK) seen++;
    assert_int_equal(seen, 6);
    assert_int_equal(nvh_kv_iter_next(it), NVH_E_NOTFOUND);
    must(nvh_kv_iter_last(it));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_int_equal(kl, 1);
    assert_memory_equal(k, "e", 1);
    must(nvh_kv_iter_prev(it));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_memory_equal(k, "d", 1);
    must(nvh_kv_iter_value(it, &v, &vl));
    assert_int_equal(vl, 1);
    assert_memory_equal(v, "d", 1);
    must(nvh_kv_iter_seek(it, "ab", 2));
    assert_int_equal(nvh_kv_iter_seek(it, "aa", 2), NVH_E_NOTFOUND);
    must(nvh_kv_iter_seek_higher(it, "ab", 2));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_memory_equal(k, "b", 1);
    must(nvh_kv_iter_seek_higher_eq(it, "ab", 2));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_int_equal(kl, 2);
    must(nvh_kv_iter_seek_lower(it, "b", 1));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_int_equal(kl, 2);                       /* "ab" */
    must(nvh_kv_iter_seek_lower_eq(it, "bz", 2));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_memory_equal(k, "b", 1);
    assert_int_equal(nvh_kv_iter_seek_lower(it, "a", 1), NVH_E_NOTFOUND);
    assert_int_equal(nvh_kv_iter_prev(it), NVH_E_NOTFOUND);
    /* the iterator's copy survives a remove of its entry; next goes on */
    must(nvh_kv_iter_seek(it, "c", 1));
    must(nvh_kv_remove(kv, "c", 1));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_memory_equal(k, "c", 1);
    must(nvh_kv_iter_next(it));
    must(nvh_kv_iter_key(it, &k, &kl));
    assert_memory_equal(k, "d", 1);
    nvh_kv_iter_free(it);
    /* a batch on the sorted engine */
    nvh_kv_batch *b = nvh_kv_batch_new(kv);
    must(nvh_kv_batch_put(b, "x", 1, "1", 1));
    must(nvh_kv_batch_remove(b, "a", 1));
    must(nvh_kv_batch_remove(b, "nope", 4));
    must(nvh_kv_batch_commit(b));
    assert_int_equal(nvh_kv_exists(kv, "x", 1), 1);
    assert_int_equal(nvh_kv_exists(kv, "a", 1), 0);
    must(nvh_kv_check(kv));
    must(nvh_kv_close(kv));
    /* order: a bytewise store refuses a comparator; a custom-order store
     * needs one */
    c.create = NVH_KV_OPEN_EXISTING;
    c.cmp = rev_cmp;
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    c.name = "rev";
    c.create = NVH_KV_CREATE_NEW;
    kv = nvh_kv_open(&c);
    assert_non_null(kv);
    for (int i = 0; i < 6; i++) must(nvh_kv_put(kv, keys[i], strlen(keys[i]), keys[i], 1));
    col.n = 0;
    must(nvh_kv_get_all(kv, collect_cb, &col));
    assert_string_equal(col.keys[0], "e");
    assert_string_equal(col.keys[5], "a");
    must(nvh_kv_close(kv));
    c.cmp = NULL;
    c.create = NVH_KV_OPEN_EXISTING;
    assert_null(nvh_kv_open(&c));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    expect_msg("custom");
    /* nvh_pool_close with a sorted store open closes it */
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_kv_config pc = {.name = "s"};
    kv = nvh_kv_open_pool(pool, &pc);
    assert_non_null(kv);
    must(nvh_kv_put(kv, "late", 4, "v", 1));
    must(nvh_pool_close(pool));
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    kv = nvh_kv_open_pool(pool, &pc);
    assert_non_null(kv);
    assert_int_equal(nvh_kv_exists(kv, "late", 4), 1);
    must(nvh_kv_close(kv));
    must(nvh_pool_close(pool));
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Operations against a model
 * ------------------------------------------------------------------------- */
static int value_cb(const void *v, size_t vl, void *arg)
{
    char *out = arg;
    memcpy(out, v, vl);
    out[vl] = 0;
    return 7;
}

typedef struct walk {
    uint64_t n, kbytes, vbytes;
    int stop_after;
} walk;

static int walk_cb(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)v;
    walk *w = arg;
    w->n++;
    w->kbytes += kl;
    w->vbytes += vl;
    return w->stop_after && w->n == (uint64_t)w->stop_after ? 42 : 0;
}

static void test_ops(void **state)
{
    (void)state;
    const char *path = test_path("kv-ops");
    nvh_kv *kv = kv_open_hash(path, "ops", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    char buf[64];
    size_t vl = 99;
    assert_int_equal(nvh_kv_get_copy(kv, "a", 1, buf, sizeof buf, &vl), NVH_E_NOTFOUND);
    expect_msg("store 'ops'");
    must(nvh_kv_put(kv, "a", 1, "one", 3));
    must(nvh_kv_get_copy(kv, "a", 1, buf, sizeof buf, &vl));
    assert_int_equal(vl, 3);
    assert_memory_equal(buf, "one", 3);
    /* size query and a short buffer */
    vl = 0;
    assert_int_equal(nvh_kv_get_copy(kv, "a", 1, NULL, 0, &vl), NVH_E_SIZE);
    assert_int_equal(vl, 3);
    memset(buf, 0, sizeof buf);
    assert_int_equal(nvh_kv_get_copy(kv, "a", 1, buf, 2, &vl), NVH_E_SIZE);
    assert_memory_equal(buf, "on\0", 3);
    /* overwrite, empty value, zero-copy get */
    must(nvh_kv_put(kv, "a", 1, "uno!", 4));
    assert_int_equal(nvh_kv_get(kv, "a", 1, value_cb, buf), 7);
    assert_string_equal(buf, "uno!");
    must(nvh_kv_put(kv, "e", 1, NULL, 0));
    must(nvh_kv_get_copy(kv, "e", 1, NULL, 0, &vl));
    assert_int_equal(vl, 0);
    assert_int_equal(nvh_kv_get(kv, "zz", 2, value_cb, buf), NVH_E_NOTFOUND);
    assert_int_equal(nvh_kv_exists(kv, "a", 1), 1);
    assert_int_equal(nvh_kv_exists(kv, "b", 1), 0);
    must(nvh_kv_remove(kv, "a", 1));
    assert_int_equal(nvh_kv_remove(kv, "a", 1), NVH_E_NOTFOUND);
    expect_msg("nvh_kv_remove: store 'ops': key not found");
    /* binary keys with NULs, prefixes */
    must(nvh_kv_put(kv, "ab", 2, "2", 1));
    must(nvh_kv_put(kv, "ab\0", 3, "3", 1));
    must(nvh_kv_put(kv, "\0", 1, "0", 1));
    must(nvh_kv_get_copy(kv, "ab\0", 3, buf, sizeof buf, &vl));
    assert_memory_equal(buf, "3", 1);
    uint64_t n;
    must(nvh_kv_count_all(kv, &n));
    assert_int_equal(n, 4);
    walk w = {0};
    must(nvh_kv_get_all(kv, walk_cb, &w));
    assert_int_equal(w.n, 4);
    assert_int_equal(w.kbytes, 1 + 2 + 3 + 1);
    walk w2 = {.stop_after = 2};
    assert_int_equal(nvh_kv_get_all(kv, walk_cb, &w2), 42);
    assert_int_equal(w2.n, 2);
    /* ordered calls are the sorted engine's */
    assert_int_equal(nvh_kv_count_above(kv, "a", 1, &n), NVH_E_NOTSUP);
    expect_msg("hash engine");
    assert_int_equal(nvh_kv_get_between(kv, "a", 1, "b", 1, walk_cb, &w), NVH_E_NOTSUP);
    assert_int_equal(nvh_kv_count_below(kv, "a", 1, &n), NVH_E_NOTSUP);
    assert_int_equal(nvh_kv_count_between(kv, "a", 1, "b", 1, &n), NVH_E_NOTSUP);
    assert_int_equal(nvh_kv_get_above(kv, "a", 1, walk_cb, &w), NVH_E_NOTSUP);
    assert_int_equal(nvh_kv_get_below(kv, "a", 1, walk_cb, &w), NVH_E_NOTSUP);
    assert_null(nvh_kv_iter_new(kv));
    assert_int_equal(nvh_errcode(), NVH_E_NOTSUP);
    must(nvh_kv_check(kv));
    nvh_kv_stats st;
    must(nvh_kv_stats_get(kv, &st));
    assert_int_equal(st.count, 4);
    assert_int_equal(st.key_bytes, 1 + 2 + 3 + 1);
    assert_int_equal(st.value_bytes, w.vbytes);
    assert_true(st.value_bytes > 0);
    assert_int_equal(st.removes, 1);
    assert_true(st.puts >= 6);
    assert_true(st.fences > 0 && st.pool_size >= (16u << 20) && st.pool_used > 0);
    must(nvh_kv_close(kv));
    unlink(path);
}

/* A random stream of puts, overwrites and removes over 500 keys, compared
 * with a DRAM model after every step, with a reopen every 700 steps. */
#define NKEYS 500
static void test_model(void **state)
{
    (void)state;
    const char *path = test_path("kv-model");
    nvh_kv *kv = kv_open_hash(path, "m", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    static int ver[NKEYS];               /* 0 absent, else the value's version */
    memset(ver, 0, sizeof ver);
    uint64_t rng = 12345, live = 0;
    char key[48], val[600], buf[600];
    for (int i = 1; i <= 5000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        unsigned id = (unsigned)(rng >> 33) % NKEYS;
        size_t kl = (size_t)snprintf(key, sizeof key, "key-%u-%.*s", id, (int)(id % 30),
                                     "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        if ((rng >> 20) % 4 == 0) {
            int rc = nvh_kv_remove(kv, key, kl);
            assert_int_equal(rc, ver[id] ? NVH_OK : NVH_E_NOTFOUND);
            if (ver[id]) live--;
            ver[id] = 0;
        } else {
            size_t vl = (size_t)(rng >> 40) % sizeof val;
            memset(val, 'a' + i % 26, vl);
            must(nvh_kv_put(kv, key, kl, val, vl));
            if (!ver[id]) live++;
            ver[id] = (int)vl + 1;
        }
        size_t got = 0;
        int rc = nvh_kv_get_copy(kv, key, kl, buf, sizeof buf, &got);
        if (ver[id]) {
            must(rc);
            assert_int_equal(got, (size_t)ver[id] - 1);
        } else {
            assert_int_equal(rc, NVH_E_NOTFOUND);
        }
        if (i % 700 == 0) {
            must(nvh_kv_close(kv));
            kv = kv_open_hash(path, "m", NVH_KV_OPEN_EXISTING);
            assert_non_null(kv);
            uint64_t n;
            must(nvh_kv_count_all(kv, &n));
            assert_int_equal(n, live);
            must(nvh_kv_check(kv));
        }
    }
    must(nvh_kv_close(kv));
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Limits and bad input
 * ------------------------------------------------------------------------- */
static void test_limits(void **state)
{
    (void)state;
    const char *path = test_path("kv-limits");
    nvh_kv *kv = kv_open_hash(path, "x", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    static char big[NVH_KV_KEY_MAX + 1000];
    memset(big, 'k', sizeof big);
    assert_int_equal(nvh_kv_put(kv, big, 5000, "v", 1), NVH_E_TOOLONG);
    assert_string_equal(nvh_errormsg(),
                        "nvh_kv_put: store 'x': key of 5000 bytes exceeds NVH_KV_KEY_MAX (4096)");
    assert_int_equal(nvh_kv_get_copy(kv, big, NVH_KV_KEY_MAX + 1, NULL, 0, NULL), NVH_E_TOOLONG);
    assert_int_equal(nvh_kv_remove(kv, big, NVH_KV_KEY_MAX + 1), NVH_E_TOOLONG);
    assert_int_equal(nvh_kv_exists(kv, big, NVH_KV_KEY_MAX + 1), NVH_E_TOOLONG);
    /* the longest key works */
    must(nvh_kv_put(kv, big, NVH_KV_KEY_MAX, "v", 1));
    assert_int_equal(nvh_kv_exists(kv, big, NVH_KV_KEY_MAX), 1);
    /* empty and NULL keys, NULL values */
    assert_int_equal(nvh_kv_put(kv, "", 0, "v", 1), NVH_E_INVAL);
    expect_msg("empty key");
    assert_int_equal(nvh_kv_put(kv, NULL, 3, "v", 1), NVH_E_INVAL);
    assert_int_equal(nvh_kv_put(kv, "k", 1, NULL, 3), NVH_E_INVAL);
    assert_int_equal(nvh_kv_exists(kv, "", 0), NVH_E_INVAL);
    /* a value over the limit: refused before anything is read */
    assert_int_equal(nvh_kv_put(kv, "k", 1, big, NVH_KV_VALUE_MAX + 1), NVH_E_TOOLONG);
    expect_msg("exceeds NVH_KV_VALUE_MAX");
    assert_int_equal(nvh_kv_put(NULL, "k", 1, "v", 1), NVH_E_INVAL);
    assert_int_equal(nvh_kv_get(kv, "k", 1, NULL, NULL), NVH_E_INVAL);
    must(nvh_kv_close(kv));
    unlink(path);
}

/* A 16 MiB value (the floor) round-trips. */
static void test_big_value(void **state)
{
    (void)state;
    const char *path = test_path("kv-bigval");
    nvh_kv_config c = {.path = path, .name = "b", .engine = "hash",
                       .create = NVH_KV_CREATE_NEW, .size = 64 << 20};
    nvh_kv *kv = nvh_kv_open(&c);
    assert_non_null(kv);
    size_t n = 16u << 20;
    char *v = malloc(n), *out = malloc(n);
    for (size_t i = 0; i < n; i++) v[i] = (char)(i * 7);
    must(nvh_kv_put(kv, "big", 3, v, n));
    size_t got = 0;
    must(nvh_kv_get_copy(kv, "big", 3, out, n, &got));
    assert_int_equal(got, n);
    assert_memory_equal(v, out, n);
    free(v);
    free(out);
    must(nvh_kv_close(kv));
    unlink(path);
}

/* A full pool: NVH_E_NOSPACE, the store unchanged and still usable. */
static void test_full_pool(void **state)
{
    (void)state;
    const char *path = test_path("kv-full");
    nvh_pool_options o = {.max_size = 8 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_kv_config c = {.name = "f", .engine = "hash", .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    if (!kv) fail_msg("%s", nvh_errormsg());
    static char val[64 << 10];
    memset(val, 'v', sizeof val);
    char key[32];
    int rc = NVH_OK, i;
    for (i = 0; i < 10000 && rc == NVH_OK; i++) {
        size_t kl = (size_t)snprintf(key, sizeof key, "k%d", i);
        rc = nvh_kv_put(kv, key, kl, val, sizeof val);
    }
    assert_int_equal(rc, NVH_E_NOSPACE);
    expect_msg("store 'f'");
    int stored = i - 1;
    uint64_t n;
    must(nvh_kv_count_all(kv, &n));
    assert_int_equal(n, (uint64_t)stored);
    size_t kl = (size_t)snprintf(key, sizeof key, "k%d", stored);
    assert_int_equal(nvh_kv_exists(kv, key, kl), 0);
    must(nvh_kv_check(kv));
    /* an overwrite that does not fit leaves the old value */
    size_t vl;
    char *huge = calloc(1, 1u << 20);
    assert_int_equal(nvh_kv_put(kv, "k0", 2, huge, 1u << 20), NVH_E_NOSPACE);
    free(huge);
    must(nvh_kv_get_copy(kv, "k0", 2, NULL, 0, &vl) == NVH_E_SIZE ? NVH_OK : -1);
    assert_int_equal(vl, sizeof val);
    /* space again after a remove */
    must(nvh_kv_remove(kv, "k1", 2));
    must(nvh_kv_put(kv, "small", 5, "s", 1));
    must(nvh_kv_close(kv));
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Several stores, list, drop
 * ------------------------------------------------------------------------- */
typedef struct listed {
    char names[8][40];
    int n;
} listed;

static int list_cb(const char *name, const char *engine, void *arg)
{
    listed *l = arg;
    assert_string_equal(engine, "hash");
    snprintf(l->names[l->n++], 40, "%s", name);
    return 0;
}

static void test_list_drop(void **state)
{
    (void)state;
    const char *path = test_path("kv-list");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_kv_config c = {.engine = "hash", .create = NVH_KV_CREATE_NEW};
    const char *names[3] = {"one", "two", "three"};
    for (int i = 0; i < 3; i++) {
        c.name = names[i];
        nvh_kv *kv = nvh_kv_open_pool(pool, &c);
        assert_non_null(kv);
        for (int j = 0; j <= i * 50; j++) {
            char k[16];
            must(nvh_kv_put(kv, k, (size_t)snprintf(k, sizeof k, "%d", j), names[i], 3));
        }
        if (i != 1) must(nvh_kv_close(kv));
    }
    /* a named object that is not a store is not listed */
    void *o = nvh_reserve_named(pool, "app.data", 64);
    assert_non_null(o);
    must(nvh_activate_named(pool, "app.data"));
    listed l = {.n = 0};
    must(nvh_kv_list(pool, list_cb, &l));
    assert_int_equal(l.n, 3);
    /* drop: refused while open, then the store and its data go */
    nvh_heap_stats before, after;
    assert_int_equal(nvh_kv_drop(pool, "two"), NVH_E_BUSY);
    assert_int_equal(nvh_kv_drop(pool, "nope"), NVH_E_NOTFOUND);
    must(nvh_heap_stats_get(pool, &before));
    must(nvh_kv_drop(pool, "three"));
    must(nvh_heap_stats_get(pool, &after));
    assert_true(after.live_objects + 101 + 3 <= before.live_objects);
    l.n = 0;
    must(nvh_kv_list(pool, list_cb, &l));
    assert_int_equal(l.n, 2);
    c.name = "three";
    c.create = NVH_KV_OPEN_EXISTING;
    assert_null(nvh_kv_open_pool(pool, &c));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    /* opening an open store gives the same handle */
    c.name = "two";
    nvh_kv *two = nvh_kv_open_pool(pool, &c);
    assert_non_null(two);
    nvh_kv *again = nvh_kv_open_pool(pool, &c);
    assert_ptr_equal(two, again);
    must(nvh_kv_close(again));
    assert_int_equal(nvh_kv_exists(two, "50", 2), 1);
    /* pool close with a store still open closes it */
    must(nvh_pool_close(pool));
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    c.name = "one";
    nvh_kv *one = nvh_kv_open_pool(pool, &c);
    assert_non_null(one);
    uint64_t n;
    must(nvh_kv_count_all(one, &n));
    assert_int_equal(n, 1);
    must(nvh_kv_close(one));
    must(nvh_kv_drop(pool, "one"));
    must(nvh_kv_drop(pool, "two"));
    l.n = 0;
    must(nvh_kv_list(pool, list_cb, &l));
    assert_int_equal(l.n, 0);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Damage, read-only
 * ------------------------------------------------------------------------- */
static void test_corrupt_descriptor(void **state)
{
    (void)state;
    const char *path = test_path("kv-corrupt");
    nvh_kv *kv = kv_open_hash(path, "c", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    must(nvh_kv_put(kv, "k", 1, "v", 1));
    nvh_pool *pool = nvh_kv_pool(kv);
    struct kv_desc *d = nvh_get_named(pool, "nvh.kv.c", NULL);
    assert_non_null(d);
    off_t doff = (off_t)nvh_off(pool, d);
    must(nvh_kv_close(kv));
    struct {
        off_t at;
        uint64_t value;
        int code;
        const char *what;
    } cases[] = {
        {0, 0x1234, NVH_E_CORRUPT, "magic"},                       /* magic */
        {12, 1, NVH_E_CORRUPT, "checksum"},                        /* engine */
        {24, 0x7777777, NVH_E_CORRUPT, "misaligned"},              /* root */
        {24, (uint64_t)1 << 40, NVH_E_CORRUPT, "engine"},          /* root outside */
        {24, 4096, NVH_E_CORRUPT, "engine"},                       /* root: no map */
        {32, 64, NVH_E_CORRUPT, "batch"},                          /* batch log */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t orig;
        test_peek(path, doff + cases[i].at, &orig, 8);
        test_poke(path, doff + cases[i].at, &cases[i].value, 8);
        nvh_kv *bad = kv_open_hash(path, "c", NVH_KV_OPEN_EXISTING);
        if (bad) fail_msg("case %zu opened", i);
        if (nvh_errcode() != cases[i].code)
            fail_msg("case %zu: %d %s", i, nvh_errcode(), nvh_errormsg());
        expect_msg(cases[i].what);
        expect_msg("store 'c'");
        test_poke(path, doff + cases[i].at, &orig, 8);
    }
    kv = kv_open_hash(path, "c", NVH_KV_OPEN_EXISTING);
    assert_non_null(kv);
    assert_int_equal(nvh_kv_exists(kv, "k", 1), 1);
    must(nvh_kv_close(kv));
    unlink(path);
}

static void test_readonly(void **state)
{
    (void)state;
    const char *path = test_path("kv-ro");
    nvh_kv *kv = kv_open_hash(path, "r", NVH_KV_CREATE_NEW);
    assert_non_null(kv);
    must(nvh_kv_put(kv, "k", 1, "v", 1));
    must(nvh_kv_close(kv));
    uint64_t h = test_file_hash(path);
    nvh_kv_config c = {.path = path, .name = "r", .flags = NVH_KV_READONLY};
    kv = nvh_kv_open(&c);
    assert_non_null(kv);
    assert_int_equal(nvh_kv_exists(kv, "k", 1), 1);
    assert_int_equal(nvh_kv_put(kv, "k", 1, "w", 1), NVH_E_READONLY);
    assert_int_equal(nvh_kv_remove(kv, "k", 1), NVH_E_READONLY);
    must(nvh_kv_check(kv));
    must(nvh_kv_close(kv));
    c.name = "absent";
    c.create = NVH_KV_CREATE_IF_MISSING;
    assert_null(nvh_kv_open(&c));
    assert_int_equal(test_file_hash(path), h);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Costs: fences per put (at most 2 for a new key), per overwrite, remove
 * ------------------------------------------------------------------------- */
static void test_costs(void **state)
{
    (void)state;
    const char *path = test_path("kv-costs");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 64 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_kv_config c = {.name = "c", .engine = "hash", .create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open_pool(pool, &c);
    assert_non_null(kv);
    enum { N = 20000 };
    char key[16], val[100];
    memset(val, 'v', sizeof val);
    nvh_stats a, b;
    const char *what[3] = {"put new", "overwrite", "remove"};
    double fences[3], lines[3];
    for (int phase = 0; phase < 3; phase++) {
        nvh_stats_get(pool, &a);
        for (int i = 0; i < N; i++) {
            size_t kl = (size_t)snprintf(key, sizeof key, "%015d", i);
            if (phase < 2) must(nvh_kv_put(kv, key, kl, val, sizeof val));
            else must(nvh_kv_remove(kv, key, kl));
        }
        nvh_stats_get(pool, &b);
        fences[phase] = (double)(b.fences - a.fences) / N;
        lines[phase] = (double)(b.lines_flushed - a.lines_flushed) / N;
        print_message("%-10s %.3f fences/op, %.2f lines/op\n", what[phase], fences[phase],
                      lines[phase]);
    }
    assert_true(fences[0] <= 2.05);
    assert_true(fences[1] <= 3.05);
    assert_true(fences[2] <= 1.05);
    must(nvh_kv_close(kv));
    nvh_pool_close(pool);
    unlink(path);
}

/* nvh_kv_stats' key and value bytes (both engines: counters the writers
 * keep, set by one walk after each open) equal a walk of the entries after
 * inserts, overwrites with longer and shorter values, removals and a batch,
 * and again after a reopen, both when stats come first after the open and
 * when writes do. */
static void stats_match_walk(nvh_kv *kv)
{
    nvh_kv_stats st;
    walk w = {0};
    must(nvh_kv_stats_get(kv, &st));
    must(nvh_kv_get_all(kv, walk_cb, &w));
    assert_int_equal(st.count, w.n);
    assert_int_equal(st.key_bytes, w.kbytes);
    assert_int_equal(st.value_bytes, w.vbytes);
}

static void stats_writes(nvh_kv *kv, unsigned round)
{
    char k[32], v[300];
    memset(v, 'v', sizeof v);
    for (unsigned i = 0; i < 400; i++) {
        size_t kl = (size_t)sprintf(k, "key-%u", (i * 7919u + round) % 300u);
        unsigned op = (i + round) % 5;
        if (op == 4) {
            int rc = nvh_kv_remove(kv, k, kl);
            assert_true(rc == NVH_OK || rc == NVH_E_NOTFOUND);
        } else {
            must(nvh_kv_put(kv, k, kl, v, (i * 31u + round) % 300u));
        }
    }
    nvh_kv_batch *b = nvh_kv_batch_new(kv);
    assert_non_null(b);
    must(nvh_kv_batch_put(b, "batch-a", 7, v, 100));
    must(nvh_kv_batch_put(b, "key-1", 5, v, 3));
    must(nvh_kv_batch_remove(b, "key-2", 5));
    must(nvh_kv_batch_commit(b));
}

static void stats_bytes(const char *engine)
{
    const char *path = test_path("kv-stats");
    unlink(path);
    nvh_kv_config c = {.path = path, .size = 32 << 20, .engine = engine,
                       .create = NVH_KV_CREATE_IF_MISSING};
    nvh_kv *kv = nvh_kv_open(&c);
    if (!kv && nvh_errcode() == NVH_E_NOTSUP) return;   /* no sorted engine built in */
    assert_non_null(kv);
    stats_match_walk(kv);                /* empty */
    stats_writes(kv, 0);
    stats_match_walk(kv);                /* the first stats: the walk */
    stats_writes(kv, 1);
    stats_match_walk(kv);                /* counters */
    must(nvh_kv_close(kv));
    kv = nvh_kv_open(&c);                /* reopen: stats first */
    assert_non_null(kv);
    stats_match_walk(kv);
    stats_writes(kv, 2);
    stats_match_walk(kv);
    must(nvh_kv_close(kv));
    kv = nvh_kv_open(&c);                /* reopen: writes first */
    assert_non_null(kv);
    stats_writes(kv, 3);
    stats_match_walk(kv);
    stats_writes(kv, 4);
    stats_match_walk(kv);
    must(nvh_kv_close(kv));
    unlink(path);
}

static void test_stats_bytes(void **state)
{
    (void)state;
    stats_bytes("sorted");
    stats_bytes("hash");
}

/* The hash engine's stats walk its entries once per open, not per call:
 * on a store of 20 k entries, 50 calls between writes make one walk (the
 * test hook counts them), and the figures stay exact. */
static void test_stats_hash_no_walk(void **state)
{
    (void)state;
    const char *path = test_path("kv-stats-walk");
    unlink(path);
    nvh_kv_config c = {.path = path, .size = 64 << 20, .engine = "hash",
                       .create = NVH_KV_CREATE_IF_MISSING};
    nvh_kv *kv = nvh_kv_open(&c);
    assert_non_null(kv);
    char k[32], v[64];
    memset(v, 'x', sizeof v);
    uint64_t kb = 0, vb = 0;
    for (unsigned i = 0; i < 20000; i++) {
        size_t kl = (size_t)sprintf(k, "walk-%u", i);
        must(nvh_kv_put(kv, k, kl, v, i % 64));
        kb += kl;
        vb += i % 64;
    }
    unsigned long walks0 = nvh_kv_test_bytes_walks_;
    for (unsigned i = 0; i < 50; i++) {
        nvh_kv_stats st;
        must(nvh_kv_stats_get(kv, &st));
        assert_int_equal(st.count, 20000);
        assert_int_equal(st.key_bytes, kb);
        assert_int_equal(st.value_bytes, vb);
        size_t kl = (size_t)sprintf(k, "walk-%u", i);        /* overwrite: 64 bytes */
        vb += 64 - i % 64;
        must(nvh_kv_put(kv, k, kl, v, 64));
    }
    assert_int_equal(nvh_kv_test_bytes_walks_ - walks0, 1);
    stats_match_walk(kv);
    must(nvh_kv_close(kv));
    unlink(path);
}

int main(void)
{
    setenv("NVHEAP_DOMAIN", "process", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_modes),  cmocka_unit_test(test_default_sorted),
        cmocka_unit_test(test_sorted_api),
        cmocka_unit_test(test_ops),         cmocka_unit_test(test_model),
        cmocka_unit_test(test_limits),      cmocka_unit_test(test_big_value),
        cmocka_unit_test(test_full_pool),   cmocka_unit_test(test_list_drop),
        cmocka_unit_test(test_corrupt_descriptor), cmocka_unit_test(test_readonly),
        cmocka_unit_test(test_costs),       cmocka_unit_test(test_stats_bytes),
        cmocka_unit_test(test_stats_hash_no_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
