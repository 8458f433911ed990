/* test_kv_sorted_threads.c — the sorted engine used by several threads at
 * once (TSan-clean: this test runs in the thread-sanitizer build too):
 * 2 writers (puts and removes on their own halves of the keys, so each
 * keeps an exact model) and 2 readers (gets, seeks, bounded scans) on one
 * kv_sorted; every value a reader sees must be whole (its id and version
 * encoded in it, the rest a pattern of them), scans strictly ascending;
 * at the end the tree equals the writers' models and passes check. */
#include "kvs_model.h"

#include <pthread.h>

#define LAYOUT "kvsthreads"
#define NKEYS 3000

static kv_sorted *g_t;
static km_model *g_m;
static volatile int g_stop;
static int g_bad;

static size_t tval(uint32_t id, uint32_t ver, uint8_t *buf)
{
    size_t len = 8 + (id * 7u + ver * 13u) % 300u;
    memcpy(buf, &id, 4);
    memcpy(buf + 4, &ver, 4);
    for (size_t i = 8; i < len; i++) buf[i] = (uint8_t)(id ^ (ver * 3u) ^ i);
    return len;
}

static int tval_ok(const void *v, size_t vl, uint32_t id)
{
    uint8_t buf[320];
    uint32_t vid, ver;
    if (vl < 8) return 0;
    memcpy(&vid, v, 4);
    memcpy(&ver, (const uint8_t *)v + 4, 4);
    if (vid != id) return 0;
    size_t len = tval(id, ver, buf);
    return len == vl && memcmp(buf, v, vl) == 0;
}

typedef struct wargs { unsigned w; unsigned ops; uint32_t *ver; } wargs;

static void *writer(void *arg)
{
    wargs *a = arg;
    uint64_t rng = 1000 + a->w;
    uint8_t vb[320];
    uint32_t clock = 0;
    for (unsigned i = 0; i < a->ops; i++) {
        uint32_t id = (uint32_t)(km_rng(&rng) % (NKEYS / 2)) * 2 + a->w;
        int rc;
        if (km_rng(&rng) % 100 < 30) {
            rc = kv_sorted_remove(g_t, g_m->keys[id], g_m->klen[id]);
            if (rc != (a->ver[id] ? NVH_OK : NVH_E_NOTFOUND)) { __atomic_store_n(&g_bad, 1, __ATOMIC_RELAXED); break; }
            a->ver[id] = 0;
        } else {
            uint32_t ver = ++clock;
            size_t vl = tval(id, ver, vb);
            rc = kv_sorted_put(g_t, g_m->keys[id], g_m->klen[id], vb, vl);
            if (rc) { __atomic_store_n(&g_bad, 2, __ATOMIC_RELAXED); break; }
            a->ver[id] = ver;
        }
    }
    return NULL;
}

typedef struct rstate { uint32_t id; int bad; } rstate;

static int get_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    rstate *s = arg;
    if (km_bytes_cmp(k, kl, g_m->keys[s->id], g_m->klen[s->id]) || !tval_ok(v, vl, s->id)) s->bad = 1;
    return 0;
}

/* id of a key (binary search in the model's order) or -1 */
static int64_t id_of(const void *k, size_t kl)
{
    uint32_t i = km_lower(g_m, k, kl, 0);
    if (i >= g_m->n) return -1;
    uint32_t id = g_m->ord[i];
    return km_bytes_cmp(g_m->keys[id], g_m->klen[id], k, kl) == 0 ? (int64_t)id : -1;
}

typedef struct sstate { uint8_t last[KM_KEYMAX]; size_t ll; int n, bad; } sstate;

static int scan_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    sstate *s = arg;
    int64_t id = id_of(k, kl);
    if (id < 0 || !tval_ok(v, vl, (uint32_t)id)) s->bad = 1;
    if (s->n && km_bytes_cmp(s->last, s->ll, k, kl) >= 0) s->bad = 2;
    memcpy(s->last, k, kl);
    s->ll = kl;
    return ++s->n == 50;
}

static int seek_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    int64_t id = id_of(k, kl);
    if (id < 0 || !tval_ok(v, vl, (uint32_t)id)) *(int *)arg = 1;
    return 0;
}

static void *reader(void *arg)
{
    uint64_t rng = 2000 + (uintptr_t)arg;
    unsigned long n = 0;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        uint32_t id = (uint32_t)(km_rng(&rng) % NKEYS);
        unsigned r = (unsigned)(km_rng(&rng) % 10);
        if (r < 6) {
            rstate s = {id, 0};
            int rc = kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], get_fn, &s);
            if ((rc && rc != NVH_E_NOTFOUND) || s.bad) { __atomic_store_n(&g_bad, 3, __ATOMIC_RELAXED); break; }
        } else if (r < 8) {
            int bad = 0;
            enum kv_seek how = (enum kv_seek)(km_rng(&rng) % 7);
            int rc = kv_sorted_seek(g_t, how, g_m->keys[id], g_m->klen[id], seek_fn, &bad);
            if ((rc && rc != NVH_E_NOTFOUND) || bad) { __atomic_store_n(&g_bad, 4, __ATOMIC_RELAXED); break; }
        } else {
            sstate *s = calloc(1, sizeof *s);
            int rc = kv_sorted_scan(g_t, g_m->keys[id], g_m->klen[id], 1, NULL, 0, 0, scan_fn, s);
            if ((rc && rc != 1) || s->bad) { __atomic_store_n(&g_bad, 5 + s->bad, __ATOMIC_RELAXED); free(s); break; }
            free(s);
        }
        n++;
    }
    return (void *)n;
}

static void two_writers_two_readers(void **state)
{
    (void)state;
    const char *path = test_path("kvs-threads");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 64 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_off_t *link = nvh_root(pool, NULL);
    assert_int_equal(kv_sorted_create(pool, &link[0]), NVH_OK);
    g_t = kv_sorted_open(pool, link[0], NULL, NULL);
    assert_non_null(g_t);
    g_m = km_new(NKEYS);
    unsigned ops = 20000;
#if defined(__SANITIZE_THREAD__)
    ops = 4000;
#endif
    wargs wa[2] = {{0, ops, calloc(NKEYS, 4)}, {1, ops, calloc(NKEYS, 4)}};
    pthread_t w[2], r[2];
    g_stop = 0;
    for (int i = 0; i < 2; i++) pthread_create(&r[i], NULL, reader, (void *)(uintptr_t)i);
    for (int i = 0; i < 2; i++) pthread_create(&w[i], NULL, writer, &wa[i]);
    for (int i = 0; i < 2; i++) pthread_join(w[i], NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    unsigned long reads = 0;
    for (int i = 0; i < 2; i++) {
        void *n;
        pthread_join(r[i], &n);
        reads += (unsigned long)n;
    }
    print_message("  %u writes per writer, %lu reads\n", ops, reads);
    assert_int_equal(g_bad, 0);
    /* the model: versions of both halves; values by tval */
    assert_int_equal(kv_sorted_check(g_t), NVH_OK);
    uint64_t live = 0, cnt = 0;
    for (uint32_t id = 0; id < NKEYS; id++) {
        uint32_t ver = wa[id % 2].ver[id];
        uint8_t vb[320];
        rstate s = {id, 0};
        int rc = kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], get_fn, &s);
        if (ver) {
            assert_int_equal(rc, NVH_OK);
            size_t vl = tval(id, ver, vb);
            km_hit h = {0};
            assert_int_equal(kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], km_hit_fn, &h), NVH_OK);
            assert_int_equal(h.vl, vl);
            assert_memory_equal(h.val, vb, vl);
            live++;
        } else {
            assert_int_equal(rc, NVH_E_NOTFOUND);
        }
    }
    assert_int_equal(kv_sorted_count(g_t, NULL, 0, 0, NULL, 0, 0, &cnt), NVH_OK);
    assert_int_equal(cnt, live);
    assert_int_equal(kv_sorted_close(g_t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    free(wa[0].ver);
    free(wa[1].ver);
    km_free(g_m);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_writers_two_readers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
