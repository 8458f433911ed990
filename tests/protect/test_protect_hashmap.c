/* test_protect_hashmap.c — the persistent hash map (src/ds/hashmap*.c) on a
 * protected pool: random runs of put / insert / update / delete / get
 * against a DRAM model, with resizes (a tiny initial table), a close and a
 * reopen in the middle, in sync and async mode. Every store the map makes
 * must be inside a window: no stray (the default handler would abort the
 * test), no unbalanced protect, the map checks clean, and once the windows
 * are closed and applied every page of the map is read-only again.
 *
 * Mode: NVHEAP_PROTECT if set (the pool comes up protected from the
 * environment hook); otherwise each test turns its mode on itself. */
#include "protect_test.h"

#include <stdlib.h>

#define NKEYS 1500u
#define NOPS 12000u

typedef struct model {
    uint32_t vlen[NKEYS];      /* 0 = absent; else value length + 1 */
    uint8_t vbyte[NKEYS];
} model;

static size_t key_of(unsigned k, char *buf)
{
    return (size_t)snprintf(buf, 32, "key-%u-%u", k, k * 7919u);
}

static void verify(nvh_hmap *m, const model *md)
{
    uint64_t present = 0;
    for (unsigned k = 0; k < NKEYS; k++) {
        char kb[32];
        size_t kl = key_of(k, kb);
        const void *v = NULL;
        size_t vl = 0;
        int rc = nvh_hmap_get(m, kb, kl, &v, &vl);
        if (!md->vlen[k]) {
            assert_int_equal(rc, NVH_E_NOTFOUND);
            continue;
        }
        present++;
        assert_int_equal(rc, NVH_OK);
        assert_int_equal(vl, md->vlen[k] - 1);
        for (size_t i = 0; i < vl; i++)
            assert_int_equal(((const unsigned char *)v)[i], (unsigned char)(md->vbyte[k] + i));
    }
    assert_int_equal(nvh_hmap_count(m), present);
    nvh_hmap_stats st;
    assert_int_equal(nvh_hmap_check(m, &st), NVH_OK);
}

static void random_ops(nvh_hmap *m, model *md, uint64_t *seed, unsigned n)
{
    unsigned char val[600];
    for (unsigned i = 0; i < n; i++) {
        unsigned k = (unsigned)(test_rand(seed) % NKEYS);
        char kb[32];
        size_t kl = key_of(k, kb);
        unsigned op = (unsigned)(test_rand(seed) % 10);
        if (op < 6) {                                   /* put / insert / update */
            size_t vl = (size_t)(test_rand(seed) % 3 == 0 ? test_rand(seed) % 600 : test_rand(seed) % 40);
            uint8_t b = (uint8_t)test_rand(seed);
            for (size_t j = 0; j < vl; j++) val[j] = (unsigned char)(b + j);
            int rc;
            if (op < 4) {
                rc = nvh_hmap_put(m, kb, kl, val, vl);
            } else if (op == 4) {
                rc = nvh_hmap_insert(m, kb, kl, val, vl);
                if (md->vlen[k]) { assert_int_equal(rc, NVH_E_EXISTS); continue; }
            } else {
                rc = nvh_hmap_update(m, kb, kl, val, vl);
                if (!md->vlen[k]) { assert_int_equal(rc, NVH_E_NOTFOUND); continue; }
            }
            assert_int_equal(rc, NVH_OK);
            md->vlen[k] = (uint32_t)vl + 1;
            md->vbyte[k] = b;
        } else if (op < 9) {
            int rc = nvh_hmap_delete(m, kb, kl);
            assert_int_equal(rc, md->vlen[k] ? NVH_OK : NVH_E_NOTFOUND);
            md->vlen[k] = 0;
        } else {
            assert_int_equal(nvh_hmap_contains(m, kb, kl), md->vlen[k] ? 1 : 0);
        }
    }
}

static void run_mode(nvh_protect_mode mode, uint64_t interval, uint64_t seed)
{
    const char *env = getenv("NVHEAP_PROTECT");
    bool from_env = env && *env && strcmp(env, "off") != 0;
    const char *path = test_path(mode == NVH_PROTECT_SYNC ? "hm-sync" : "hm-async");
    nvh_pool *pool = nvh_pool_create(path, "protect", 32 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    if (!from_env) assert_int_equal(nvh_protect_set_mode(pool, mode, interval), NVH_OK);
    assert_int_not_equal(nvh_protect_get_mode(pool), NVH_PROTECT_OFF);
    nvh_protect_stats_reset(pool);

    nvh_off_t *slot = nvh_root(pool, NULL);       /* the map's link: first root word */
    nvh_hmap_options o = {.initial_buckets_log2 = 2, .max_load_pct = 100};
    assert_int_equal(nvh_hmap_create(pool, slot, &o), NVH_OK);
    assert_true(*slot != 0);
    nvh_hmap *m = nvh_hmap_open(pool, *slot);
    assert_non_null(m);
    static model md;
    memset(&md, 0, sizeof md);
    random_ops(m, &md, &seed, NOPS / 2);
    verify(m, &md);
    assert_int_equal(nvh_hmap_close(m), NVH_OK);

    /* reopen the pool: protection comes back (env) or is set again */
    nvh_protect_stats s = pt_stats(pool);
    assert_int_equal(s.strays, 0);
    assert_int_equal(s.unbalanced, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, "protect", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    if (!from_env) assert_int_equal(nvh_protect_set_mode(pool, mode, interval), NVH_OK);
    slot = nvh_root(pool, NULL);
    m = nvh_hmap_open(pool, *slot);
    assert_non_null(m);
    verify(m, &md);
    random_ops(m, &md, &seed, NOPS / 2);
    verify(m, &md);
    nvh_hmap_stats hs;
    assert_int_equal(nvh_hmap_stats_get(m, &hs), NVH_OK);

    /* all windows closed: after the queue is applied, every page the map
     * touched is read-only (spot-check each entry's page) */
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    for (unsigned k = 0; k < NKEYS; k += 37) {
        if (!md.vlen[k]) continue;
        char kb[32];
        size_t kl = key_of(k, kb);
        const void *v;
        assert_int_equal(nvh_hmap_get(m, kb, kl, &v, NULL), NVH_OK);
        assert_int_equal(pt_writable(v), 0);
    }
    assert_int_equal(pt_writable(slot), 0);
    s = pt_stats(pool);
    assert_int_equal(s.strays, 0);
    assert_int_equal(s.unbalanced, 0);

    assert_int_equal(nvh_hmap_destroy(m, slot), NVH_OK);
    assert_int_equal(*slot, 0);
    assert_int_equal(pt_stats(pool).strays, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void test_hashmap_sync(void **state)
{
    (void)state;
    run_mode(NVH_PROTECT_SYNC, 0, 11);
}

static void test_hashmap_async(void **state)
{
    (void)state;
    run_mode(NVH_PROTECT_ASYNC, 50000, 12);      /* 50 us: passes during the run */
}

static void test_hashmap_async_long(void **state)
{
    (void)state;
    run_mode(NVH_PROTECT_ASYNC, 200000000, 13);  /* 200 ms: mostly the fault path */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hashmap_sync),
        cmocka_unit_test(test_hashmap_async),
        cmocka_unit_test(test_hashmap_async_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
