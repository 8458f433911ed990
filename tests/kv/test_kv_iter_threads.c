/* test_kv_iter_threads.c — iterators of a sorted store while writers
 * change it (run under TSan in CI): writers overwrite the even keys (always
 * present) and put and remove the odd ones (slots reused, leaves split),
 * or fill every gap and empty it again; iterators seek to random keys and
 * walk next or prev (or prev only). Every step must
 * land on the neighbour of the entry before it: keys strictly ascending
 * (descending), each value whole and its key's, and no even key skipped
 * (a step from a stale position — a leaf changed since the iterator's last
 * call — would skip or repeat keys). */
#include "test_util.h"
#include "kv_values.h"

#include "kv/kv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define NK 3000                  /* keys "k000000".. */
#define WALK 150

static nvh_kv *g_kv;
static atomic_bool g_stop;
static atomic_long g_bad;
static int g_dir;                /* walkers: 0 either way, -1 backwards only */

static size_t key_of(uint32_t u, char *k) { return (size_t)sprintf(k, "k%06u", u); }

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct wargs { uint32_t lo, hi; unsigned ops; uint64_t seed; } wargs;

static void *writer(void *p)
{
    wargs *a = p;
    char k[16], v[256];
    for (unsigned i = 0; i < a->ops && !atomic_load(&g_bad); i++) {
        uint32_t u = a->lo + (uint32_t)(rng(&a->seed) % (a->hi - a->lo));
        size_t kl = key_of(u, k);
        int rc;
        if (u % 2 && rng(&a->seed) % 2) {
            rc = nvh_kv_remove(g_kv, k, kl);
            if (rc == NVH_E_NOTFOUND) rc = NVH_OK;
        } else {
            rc = nvh_kv_put(g_kv, k, kl, v, make_value(u, i + 1, v));
        }
        if (rc) atomic_store(&g_bad, 100 + rc);
    }
    return NULL;
}

/* a->ops times: puts every odd key of [lo, hi) in a shuffled order (the
 * leaves fill and split), then removes them in another. */
static void *filler(void *p)
{
    wargs *a = p;
    char k[16], v[256];
    uint32_t n = (a->hi - a->lo) / 2, *u = malloc(n * sizeof *u);
    for (unsigned pass = 0; pass < 2 * a->ops && !atomic_load(&g_bad); pass++) {
        for (uint32_t i = 0; i < n; i++) u[i] = a->lo + 2 * i + 1;
        for (uint32_t i = n - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(rng(&a->seed) % (i + 1)), x = u[i];
            u[i] = u[j];
            u[j] = x;
        }
        for (uint32_t i = 0; i < n && !atomic_load(&g_bad); i++) {
            size_t kl = key_of(u[i], k);
            int rc = pass % 2 ? nvh_kv_remove(g_kv, k, kl)
                          : nvh_kv_put(g_kv, k, kl, v, make_value(u[i], 1, v));
            if (rc) atomic_store(&g_bad, 100 + rc);
        }
    }
    free(u);
    return NULL;
}

/* The entry the iterator is on: its number, checked against its value. */
static long at(nvh_kv_iter *it)
{
    const void *k, *v;
    size_t kl, vl;
    if (nvh_kv_iter_key(it, &k, &kl) || nvh_kv_iter_value(it, &v, &vl)) return -1;
    char tmp[16];
    if (kl != 7) return -2;
    memcpy(tmp, (const char *)k + 1, 6);
    tmp[6] = 0;
    long u = atol(tmp);
    return value_ok((uint32_t)u, v, vl) ? u : -3;
}

static void *walker(void *p)
{
    uint64_t s = 99 + (uintptr_t)p;
    nvh_kv_iter *it = nvh_kv_iter_new(g_kv);
    char k[16];
    while (!atomic_load(&g_stop) && !atomic_load(&g_bad)) {
        bool fwd = g_dir < 0 ? false : rng(&s) % 2;
        size_t kl = key_of((uint32_t)(rng(&s) % NK), k);
        int rc = fwd ? nvh_kv_iter_seek_higher_eq(it, k, kl) : nvh_kv_iter_seek_lower_eq(it, k, kl);
        if (rc) continue;
        long prev = at(it);
        if (prev < 0) { atomic_store(&g_bad, 1); break; }
        for (int i = 0; i < WALK; i++) {
            rc = fwd ? nvh_kv_iter_next(it) : nvh_kv_iter_prev(it);
            if (rc == NVH_E_NOTFOUND) {
                /* past the end: no even key beyond the last one seen */
                long edge = fwd ? (prev + 2) & ~1L : (prev - 1) & ~1L;
                if (fwd ? edge < NK : prev > 1) atomic_store(&g_bad, 2);
                break;
            }
            long u = at(it);
            if (rc || u < 0) { atomic_store(&g_bad, 3); break; }
            /* strictly monotonic, and no always-present (even) key skipped */
            long lo = fwd ? prev : u, hi = fwd ? u : prev;
            if (lo >= hi || (lo + 2) / 2 * 2 < hi) {
                atomic_store(&g_bad, 4);
                break;
            }
            prev = u;
        }
    }
    nvh_kv_iter_free(it);
    return NULL;
}

/* A store in a fresh pool of its own, holding the keys below NK that are
 * multiples of step (the process domain: durability costs no syscalls, so
 * the threads race). */
static nvh_kv *open_filled(const char *name, uint32_t step, nvh_pool **pool)
{
    const char *path = test_path(name);
    unlink(path);
    *pool = nvh_pool_create(path, "kviter", 64 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(*pool);
    nvh_kv_config c = {.create = NVH_KV_CREATE_NEW};
    nvh_kv *kv = nvh_kv_open_pool(*pool, &c);
    assert_non_null(kv);
    char k[16], v[256];
    for (uint32_t u = 0; u < NK; u += step)
        assert_int_equal(nvh_kv_put(kv, k, key_of(u, k), v, make_value(u, 0, v)), NVH_OK);
    return kv;
}

/* Two walkers run while two writers (fn with w[0], w[1]) do their work;
 * then the walkers stop, and none of them saw a step out of order. */
static void race(void *(*fn)(void *), wargs w[2])
{
    atomic_store(&g_stop, false);
    atomic_store(&g_bad, 0);
    pthread_t tw[2], tr[2];
    for (uintptr_t i = 0; i < 2; i++) pthread_create(&tr[i], NULL, walker, (void *)i);
    for (int i = 0; i < 2; i++) pthread_create(&tw[i], NULL, fn, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(tw[i], NULL);
    atomic_store(&g_stop, true);
    for (int i = 0; i < 2; i++) pthread_join(tr[i], NULL);
    assert_int_equal(atomic_load(&g_bad), 0);
}

/* The store checks clean; close it and remove its pool. */
static void close_checked(nvh_kv *kv, nvh_pool *pool, const char *name)
{
    assert_int_equal(nvh_kv_check(kv), NVH_OK);
    nvh_kv_close(kv);
    nvh_pool_close(pool);
    unlink(test_path(name));
}

static void iterators_and_writers(void **state)
{
    (void)state;
    nvh_pool *pool;
    g_kv = open_filled("kv-iter-threads", 2, &pool);
    unsigned ops = 100000;
#if defined(__SANITIZE_THREAD__)
    ops = 4000;
#endif
    wargs w[2] = {{0, NK / 2, ops, 7}, {NK / 2, NK, ops, 11}};
    race(writer, w);
    /* quiet now: one walk each way sees every key in order */
    nvh_kv_iter *it = nvh_kv_iter_new(g_kv);
    uint64_t n = 0, count;
    long last = -1;
    for (int rc = nvh_kv_iter_first(it); rc == NVH_OK; rc = nvh_kv_iter_next(it), n++) {
        long u = at(it);
        assert_true(u > last);
        last = u;
    }
    assert_int_equal(nvh_kv_count_all(g_kv, &count), NVH_OK);
    assert_int_equal(n, count);
    n = 0;
    last = NK;
    for (int rc = nvh_kv_iter_last(it); rc == NVH_OK; rc = nvh_kv_iter_prev(it), n++) {
        long u = at(it);
        assert_true(u < last);
        last = u;
    }
    assert_int_equal(n, count);
    nvh_kv_iter_free(it);
    close_checked(g_kv, pool, "kv-iter-threads");
}

/* Iterators walking backwards only while two writers fill the gaps
 * between the even keys (every leaf splits, about twice) and empty them
 * again, 8 times: every step back, within a leaf or across to the previous one,
 * lands on the neighbour. */
static void backward_walks_and_splits(void **state)
{
    (void)state;
    nvh_pool *pool;
    g_kv = open_filled("kv-iter-back", 2, &pool);
    g_dir = -1;
    unsigned rounds = 8;
#if defined(__SANITIZE_THREAD__)
    rounds = 2;
#endif
    wargs w[2] = {{0, NK / 2, rounds, 5}, {NK / 2, NK, rounds, 9}};
    race(filler, w);
    g_dir = 0;
    uint64_t count;
    assert_int_equal(nvh_kv_count_all(g_kv, &count), NVH_OK);
    assert_int_equal(count, NK / 2);
    close_checked(g_kv, pool, "kv-iter-back");
}

/* Steps cross leaves both ways without a seek: a walk from the last key
 * to the first and back over 3000 keys (about 190 leaves) makes no step
 * fall back to a seek (the test hook counts them) when nothing changes;
 * while splits happen elsewhere, a step from a leaf that did not change
 * rarely needs one (the retire counts are per address stripe). */
static void steps_cross_leaves(void **state)
{
    (void)state;
    nvh_pool *pool;
    nvh_kv *kv = open_filled("kv-iter-steps", 1, &pool);
    char k[16], v[256] = {0};
    nvh_kv_iter *it = nvh_kv_iter_new(kv);
    g_kv = kv;
    unsigned long seeks0 = kvs_test_step_seeks_;
    long n = 0, last = NK;
    for (int rc = nvh_kv_iter_last(it); rc == NVH_OK; rc = nvh_kv_iter_prev(it), n++) {
        long u = at(it);
        assert_int_equal(u, last - 1);
        last = u;
    }
    assert_int_equal(n, NK);
    for (int rc = nvh_kv_iter_first(it); rc == NVH_OK; rc = nvh_kv_iter_next(it), n++) {
        long u = at(it);
        assert_int_equal(u, last);
        last = u + 1;
    }
    assert_int_equal(n, 2 * NK);
    assert_int_equal(kvs_test_step_seeks_ - seeks0, 0);
    /* a walk back across the leaves while puts of new keys above all
     * others split the last leaf (~25 splits): a step seeks only when a
     * retire fell in the stripe of the companion it holds (1 in 64, and
     * the walk holds a new one every ~16 steps): at most 4 of them (one
     * store-wide count: a seek after every split) */
    assert_int_equal(nvh_kv_iter_seek_lower_eq(it, "k002000", 7), NVH_OK);
    seeks0 = kvs_test_step_seeks_;
    last = 2000;
    for (uint32_t i = 0; i < 1500; i++) {
        if (i < 400) {
            size_t kl = (size_t)sprintf(k, "z%06u", i);
            assert_int_equal(nvh_kv_put(kv, k, kl, v, 10), NVH_OK);
        }
        assert_int_equal(nvh_kv_iter_prev(it), NVH_OK);
        long u = at(it);
        assert_int_equal(u, last - 1);
        last = u;
    }
    assert_true(kvs_test_step_seeks_ - seeks0 <= 4);
    nvh_kv_iter_free(it);
    close_checked(kv, pool, "kv-iter-steps");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(iterators_and_writers), cmocka_unit_test(backward_walks_and_splits),
        cmocka_unit_test(steps_cross_leaves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
