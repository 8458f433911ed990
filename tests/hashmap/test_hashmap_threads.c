/* test_hashmap_threads.c — writers of several stripes at once (docs/HASHMAP.md
 * §7): four writer threads, each with keys of its own and a random stream of
 * puts, inserts, updates and deletes checked against its own DRAM model at
 * every step, while a reader checks with nvh_hmap_get_fn that every value it
 * meets is whole. Maps of 32 stripes (base 2^6: mostly different stripes)
 * and of 2 (base 2^1: writers contend for stripes, the three pending slots
 * and resizes from 2 buckets up). Afterwards the map equals the union of the
 * models (every key, foreach, count), checks clean, holds no leaked object,
 * and equals them again after a reopen. Run under TSan by the sanitizer
 * build (ctest label `hashmap`). */
#include "hm_model.h"

#include <pthread.h>
#include <stdatomic.h>

#define LAYOUT "hmthreads"
enum { WRITERS = 4, KEYS = 600, STEPS = 4000 };

typedef struct writer {
    nvh_hmap *m;
    unsigned t;
    uint32_t *ver;               /* the shared model; this writer's slice only */
    int rc;
} writer;

static void *writer_main(void *p)
{
    writer *w = p;
    uint64_t rng = 1000 + w->t;
    uint32_t clock = 0;
    for (unsigned i = 0; i < STEPS && !w->rc; i++) {
        hm_op op = hm_next_op(&rng, KEYS, 20);
        op.id += w->t * KEYS;
        int want = hm_model_apply(w->ver, &clock, op);
        int got = hm_map_apply(w->m, op, w->ver[op.id]);
        if (got != want) w->rc = got ? got : -1;
        else if (!hm_key_matches(w->m, op.id, w->ver[op.id])) w->rc = -2;
    }
    return NULL;
}

typedef struct reader {
    nvh_hmap *m;
    _Atomic int *stop;
    int rc;
    uint64_t hits;
} reader;

static void *reader_main(void *p)
{
    reader *r = p;
    uint8_t k[HM_KEYBUF];
    uint64_t rng = 77;
    uint32_t max_ver = STEPS;   /* versions the writers write */
    while (!atomic_load(r->stop) && !r->rc) {
        uint32_t id = (uint32_t)(hm_rng(&rng) % (WRITERS * KEYS));
        int rc = nvh_hmap_get_fn(r->m, k, hm_key(id, k), hm_whole_fn, &max_ver);
        if (rc == 1) r->hits++;
        else if (rc != NVH_E_NOTFOUND) r->rc = rc ? rc : -3;
    }
    return NULL;
}

static void run(unsigned base)
{
    const char *path = test_path("hm-threads");
    nvh_pool_options o = {.root_size = 4096, .max_size = 1ull << 30};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *slot = nvh_root(pool, NULL);
    nvh_hmap_options ho = {.initial_buckets_log2 = base, .max_load_pct = 100};
    assert_int_equal(nvh_hmap_create(pool, slot, &ho), NVH_OK);
    nvh_hmap *m = nvh_hmap_open(pool, *slot);
    assert_non_null(m);
    uint32_t *ver = calloc(WRITERS * KEYS, sizeof *ver);
    writer w[WRITERS];
    pthread_t t[WRITERS + 1];
    _Atomic int stop = 0;
    reader r = {m, &stop, 0, 0};
    pthread_create(&t[WRITERS], NULL, reader_main, &r);
    for (unsigned i = 0; i < WRITERS; i++) {
        w[i] = (writer){m, i, ver, 0};
        pthread_create(&t[i], NULL, writer_main, &w[i]);
    }
    for (unsigned i = 0; i < WRITERS; i++) pthread_join(t[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(t[WRITERS], NULL);
    for (unsigned i = 0; i < WRITERS; i++) assert_int_equal(w[i].rc, 0);
    assert_int_equal(r.rc, 0);
    assert_true(hm_equals_model(m, ver, WRITERS * KEYS));
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
    assert_int_equal(st.count_repaired, 0);
    assert_int_equal(hm_heap_objects(pool), 1 + st.segments + st.count);
    print_message("  base 2^%u: %llu entries, %llu buckets, %llu resizes, %llu reader hits\n", base,
                  (unsigned long long)st.count, (unsigned long long)st.buckets,
                  (unsigned long long)st.resizes, (unsigned long long)r.hits);
    nvh_off_t mo = *slot;
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    m = nvh_hmap_open(pool, mo);
    assert_non_null(m);
    assert_true(hm_equals_model(m, ver, WRITERS * KEYS));
    assert_int_equal(nvh_hmap_check(m, NULL), NVH_OK);
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    free(ver);
    unlink(path);
}

static void test_writers_many_stripes(void **state)
{
    (void)state;
    run(6);
}

static void test_writers_two_stripes(void **state)
{
    (void)state;
    run(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writers_many_stripes),
        cmocka_unit_test(test_writers_two_stripes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
