/* test_alloc_protect.c — the allocator with stray-write protection on
 * (issue #6, docs/PROTECT.md): every store the allocator makes into the pool
 * (headers, bitmaps, ring records and watermarks, the object table, links it
 * sets or clears, nvh_alloc's zeroing) is inside a write window, so a long
 * random run of reserve/activate/free/cancel/alloc/named operations, with
 * syncs and a close/reopen, sees zero stray reports in sync and in async
 * mode. The heap is formatted lazily by the first allocation, already under
 * protection. A negative control stores into a run header without a window
 * and must be reported, so the test can fail. */
#include "test_util.h"

#include <stdatomic.h>
#include <stdbool.h>

#define NSLOTS 256
#define MIB ((uint64_t)1 << 20)

static _Atomic unsigned g_strays;

/* Runs in the SIGSEGV handler: async-signal-safe (one atomic add). ALLOW
 * lets the store proceed and leaves a window open on the page. */
static nvh_stray_action count_stray(const nvh_stray_info *info, void *arg)
{
    (void)info;
    (void)arg;
    atomic_fetch_add(&g_strays, 1);
    return NVH_STRAY_ALLOW;
}

static void protect_on(nvh_pool *pool, nvh_protect_mode mode)
{
    assert_int_equal(nvh_protect_set_stray_handler(pool, count_stray, NULL), NVH_OK);
    /* a short interval in async mode: many passes during the run */
    assert_int_equal(nvh_protect_set_mode(pool, mode, mode == NVH_PROTECT_ASYNC ? 200000 : 0),
                     NVH_OK);
}

/* The application's own stores into an object: inside its own window. */
static void fill(nvh_pool *pool, void *p, size_t n, uint8_t v)
{
    size_t len = n < 256 ? n : 256;
    assert_int_equal(nvh_unprotect(pool, p, len), NVH_OK);
    memset(p, v, len);
    nvh_persist(pool, p, len);
    assert_int_equal(nvh_protect(pool, p, len), NVH_OK);
}

static void random_run(nvh_pool *pool, uint64_t seed, int ops)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    uint8_t tag[NSLOTS] = {0};
    for (int i = 0; i < NSLOTS; i++)
        if (root[i]) tag[i] = *(uint8_t *)nvh_ptr(pool, root[i]);
    bool named_live[8] = {false};
    for (int k = 0; k < 8; k++) {
        char name[16];
        snprintf(name, sizeof name, "obj-%d", k);
        named_live[k] = nvh_get_named(pool, name, NULL) != NULL;
    }
    for (int i = 0; i < ops; i++) {
        uint64_t r = test_rand(&seed);
        int s = (int)(r % NSLOTS);
        unsigned what = (unsigned)(r >> 12) % 16;
        if (what < 2) {                                   /* named object */
            int k = (int)((r >> 20) % 8);
            char name[16];
            snprintf(name, sizeof name, "obj-%d", k);
            if (named_live[k]) {
                assert_int_equal(nvh_free_named(pool, name), NVH_OK);
            } else {
                void *p = nvh_reserve_named(pool, name, 100 + (r >> 24) % 3000);
                assert_non_null(p);
                fill(pool, p, 100, (uint8_t)k);
                assert_int_equal(nvh_activate_named(pool, name), NVH_OK);
            }
            named_live[k] = !named_live[k];
        } else if (root[s] == 0) {
            size_t size = (r >> 20) % 10 < 8 ? 1 + (r >> 24) % 1500 : 2000 + (r >> 24) % 40000;
            if (what == 2) {                              /* cancel */
                void *p = nvh_reserve(pool, size);
                assert_non_null(p);
                assert_int_equal(nvh_cancel(pool, p), NVH_OK);
            } else if (what == 3) {                       /* nvh_alloc zeroes it */
                void *p = nvh_alloc(pool, size, NULL, NULL, &root[s]);
                assert_non_null(p);
                fill(pool, p, size, (uint8_t)(s | 1));
                tag[s] = (uint8_t)(s | 1);
            } else {                                      /* reserve + activate */
                void *p = nvh_reserve(pool, size);
                assert_non_null(p);
                fill(pool, p, size, (uint8_t)(s | 1));
                nvh_off_t *l[1] = {&root[s]};
                assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
                tag[s] = (uint8_t)(s | 1);
            }
        } else {
            uint8_t *p = nvh_ptr(pool, root[s]);
            assert_int_equal(p[0], tag[s]);
            nvh_link l = {&root[s], 0};
            assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
            assert_int_equal(root[s], 0);
        }
        if (i % 997 == 0) assert_int_equal(nvh_heap_sync(pool), NVH_OK);
    }
}

static void run_mode(nvh_protect_mode mode, const char *name, int ops)
{
    const char *path = test_path(name);
    nvh_pool_options o = {.root_size = NSLOTS * sizeof(nvh_off_t), .max_size = 256 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, "aprot", 8 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    atomic_store(&g_strays, 0);
    protect_on(pool, mode);            /* before the heap exists: lazy format */
    random_run(pool, 42 + mode, ops);
    nvh_protect_stats st;
    assert_int_equal(nvh_protect_stats_get(pool, &st), NVH_OK);
    print_message("mode %d: %llu mprotect calls, %llu internal faults, %llu strays\n", mode,
                  (unsigned long long)st.mprotect_calls, (unsigned long long)st.internal_faults,
                  (unsigned long long)st.strays);
    assert_int_equal(st.strays, 0);
    assert_int_equal(atomic_load(&g_strays), 0);
    assert_true(st.mprotect_calls > 0);          /* protection really was on */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* reopen (recovery, lazy rebuild) and go on under protection */
    pool = nvh_pool_open(path, "aprot", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    protect_on(pool, mode);
    random_run(pool, 4242 + mode, ops / 2);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_protect_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.strays, 0);
    assert_int_equal(atomic_load(&g_strays), 0);

    if (mode == NVH_PROTECT_SYNC) {
        /* negative control: the allocator's own metadata IS protected, so a
         * store into a run header without a window is reported */
        nvh_off_t *root = nvh_root(pool, NULL);
        uint8_t *obj = NULL;
        for (int i = 0; i < NSLOTS && !obj; i++)
            if (root[i] && nvh_usable_size(pool, nvh_ptr(pool, root[i])) < 2048)
                obj = nvh_ptr(pool, root[i]);
        assert_non_null(obj);
        volatile uint8_t *hdr = (uint8_t *)((uintptr_t)obj & ~(uintptr_t)4095) + 20;
        *hdr = *hdr;                        /* a stray write (value unchanged) */
        assert_int_equal(atomic_load(&g_strays), 1);
        assert_int_equal(nvh_protect(pool, (const void *)hdr, 1), NVH_OK); /* close ALLOW's */
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void protect_sync(void **state)
{
    (void)state;
    run_mode(NVH_PROTECT_SYNC, "aprot-sync", 3000);
}

static void protect_async(void **state)
{
    (void)state;
    run_mode(NVH_PROTECT_ASYNC, "aprot-async", 20000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(protect_sync),
        cmocka_unit_test(protect_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
