/* test_alloc_threads.c — multi-threaded stress (run under TSan in the
 * sanitizer build): threads allocate and free concurrently from their own
 * arenas, and free each other's objects (remote frees to the owning arena)
 * through a shared hand-off array; named objects from several threads. At
 * the end the live objects are exactly the ones still referenced, none
 * overlap, and contents are intact. */
#include "test_util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define NTHREADS 4
#define SLOTS_PER_THREAD 128
#define OPS 4000
#define HANDOFF 64

static nvh_pool *g_pool;
static int g_round;           /* set before the threads start */
static _Atomic uint64_t g_handoff[HANDOFF];   /* offsets passed between threads */

typedef struct targ { int id; uint64_t rng; } targ;

static void *worker(void *arg)
{
    targ *t = arg;
    nvh_off_t *root = nvh_root(g_pool, NULL);
    nvh_off_t *mine = &root[t->id * SLOTS_PER_THREAD];
    for (int i = 0; i < OPS; i++) {
        uint64_t r = test_rand(&t->rng);
        int s = (int)(r % SLOTS_PER_THREAD);
        if (mine[s] == 0) {
            size_t size = (r >> 8) % 100 < 90 ? 1 + (r >> 16) % 1500 : 2000 + (r >> 16) % 30000;
            unsigned char *p = nvh_reserve(g_pool, size);
            assert_non_null(p);
            memset(p, (uint8_t)(t->id + 1), size < 64 ? size : 64);
            nvh_persist(g_pool, p, size < 64 ? size : 64);
            nvh_off_t *l[1] = {&mine[s]};
            assert_int_equal(nvh_activate(g_pool, p, l, 1), NVH_OK);
        } else if ((r >> 40) % 4 == 0) {
            /* hand the object to another thread: unlink it durably first
             * (free with a redirect of 0 would free it; we just move it) */
            int h = (int)((r >> 20) % HANDOFF);
            uint64_t expect = 0;
            uint64_t off = mine[s];
            if (atomic_compare_exchange_strong(&g_handoff[h], &expect, off)) mine[s] = 0;
        } else {
            nvh_link l = {&mine[s], 0};
            assert_int_equal(nvh_free(g_pool, nvh_ptr(g_pool, mine[s]), &l, 1), NVH_OK);
        }
        /* remote frees: take something another thread handed off */
        int h = (int)((r >> 28) % HANDOFF);
        uint64_t off = atomic_exchange(&g_handoff[h], 0);
        if (off) {
            const unsigned char *p = nvh_ptr(g_pool, off);
            assert_true(p[0] >= 1 && p[0] <= NTHREADS);
            assert_int_equal(nvh_free(g_pool, (void *)p, NULL, 0), NVH_OK);
        }
        if (i % 500 == 0 && t->id == 0) {
            char name[32];
            snprintf(name, sizeof name, "t%d-%d-%llu", t->id, i, (unsigned long long)g_round);
            void *p = nvh_reserve_named(g_pool, name, 100);
            assert_non_null(p);
            assert_int_equal(nvh_activate_named(g_pool, name), NVH_OK);
            assert_ptr_equal(nvh_get_named(g_pool, name, NULL), p);
        }
    }
    return NULL;
}

typedef struct span { uint64_t off, size; } span;
static span g_live[NTHREADS * SLOTS_PER_THREAD * 4];
static size_t g_nlive;
static int collect(void *ptr, size_t usable, void *arg)
{
    (void)arg;
    g_live[g_nlive++] = (span){nvh_off(g_pool, ptr), usable};
    return 0;
}
static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void stress(void **state)
{
    (void)state;
    const char *path = test_path("threads");
    nvh_pool_options o = {.root_size = 16384, .max_size = 1ull << 30};
    g_pool = nvh_pool_create_ex(path, "threads", 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(g_pool);
    nvh_heap_config c;
    nvh_heap_config_get(g_pool, &c);
    c.arenas = NTHREADS;
    assert_int_equal(nvh_heap_config_set(g_pool, &c), NVH_OK);
    pthread_t th[NTHREADS];
    targ args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (targ){i, (uint64_t)i * 7919 + 1};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    /* objects still in the hand-off array are referenced from there */
    nvh_off_t *root = nvh_root(g_pool, NULL);
    size_t referenced = 0;
    for (int i = 0; i < NTHREADS * SLOTS_PER_THREAD; i++) referenced += root[i] != 0;
    for (int h = 0; h < HANDOFF; h++) referenced += atomic_load(&g_handoff[h]) != 0;
    g_nlive = 0;
    nvh_heap_foreach(g_pool, collect, NULL);
    int named = 0;
    for (int i = 0; i < OPS; i += 500) named++;
    assert_int_equal(g_nlive, referenced + (size_t)named);
    qsort(g_live, g_nlive, sizeof *g_live, cmp_span);
    for (size_t i = 1; i < g_nlive; i++) assert_true(g_live[i - 1].off + g_live[i - 1].size <= g_live[i].off);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(g_pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(g_pool), NVH_OK);
    /* and everything is still there after a reopen */
    g_pool = nvh_pool_open(path, "threads", NVH_DOMAIN_PROCESS);
    assert_non_null(g_pool);
    size_t before = g_nlive;
    g_nlive = 0;
    nvh_heap_foreach(g_pool, collect, NULL);
    assert_int_equal(g_nlive, before);
    g_round = 1;
    /* second round after the reopen: frees hit chunks the lazy rebuild has
     * not scanned yet, while other threads' allocations trigger scans */
    nvh_heap_config_get(g_pool, &c);
    c.arenas = NTHREADS;
    assert_int_equal(nvh_heap_config_set(g_pool, &c), NVH_OK);
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (targ){i, (uint64_t)i * 104729 + 5};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    root = nvh_root(g_pool, NULL);
    referenced = 0;
    for (int i = 0; i < NTHREADS * SLOTS_PER_THREAD; i++) referenced += root[i] != 0;
    for (int h = 0; h < HANDOFF; h++) referenced += atomic_load(&g_handoff[h]) != 0;
    g_nlive = 0;
    nvh_heap_foreach(g_pool, collect, NULL);
    assert_int_equal(g_nlive, referenced + 2 * (size_t)named);
    qsort(g_live, g_nlive, sizeof *g_live, cmp_span);
    for (size_t i = 1; i < g_nlive; i++) assert_true(g_live[i - 1].off + g_live[i - 1].size <= g_live[i].off);
    assert_int_equal(nvh_pool_close(g_pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
