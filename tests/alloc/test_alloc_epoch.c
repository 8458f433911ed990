/* test_alloc_epoch.c — freed space and lock-free readers (common/epoch.c,
 * alloc/fifo.c): an object freed while a reader is in (nvh_epoch_enter_,
 * as the hash map's lookups do) is not handed out again until that reader
 * has left, however many allocations and drains come in between; and once
 * it has left, or only readers that began after the drain stamped the
 * space are in, the space is reused. Run under TSan in the sanitizer build
 * (the reader is a real thread). */
#include "test_util.h"

#include "common/internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define NFREE 256           /* objects freed while the reader is in      */
#define NALLOC 4096         /* allocations that must not get them back   */
#define SIZE 100

static nvh_pool *g_pool;

/* a reader thread: enters, says so, waits to be told to leave */
typedef struct reader {
    pthread_t th;
    _Atomic int state;      /* 0 start, 1 in, 2 leave asked, 3 out        */
} reader;

static void *reader_main(void *arg)
{
    reader *r = arg;
    nvh_epoch_enter_();
    atomic_store(&r->state, 1);
    while (atomic_load(&r->state) != 2) sched_yield();
    nvh_epoch_exit_();
    atomic_store(&r->state, 3);
    return NULL;
}

static void reader_start(reader *r)
{
    atomic_init(&r->state, 0);
    assert_int_equal(pthread_create(&r->th, NULL, reader_main, r), 0);
    while (atomic_load(&r->state) != 1) sched_yield();
}

static void reader_stop(reader *r)
{
    atomic_store(&r->state, 2);
    pthread_join(r->th, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool in_set(const uint64_t *set, size_t n, uint64_t v)
{
    return n && bsearch(&v, set, n, sizeof v, cmp_u64) != NULL;
}

/* Allocate (reserve + activate into root[base..]) up to n objects; count
 * how many got space of set. */
static size_t alloc_count(nvh_off_t *root, size_t base, size_t n, const uint64_t *set,
                          size_t nset)
{
    size_t hits = 0;
    for (size_t i = 0; i < n; i++) {
        void *p = nvh_reserve(g_pool, SIZE);
        assert_non_null(p);
        nvh_off_t *l[1] = {&root[base + i]};
        assert_int_equal(nvh_activate(g_pool, p, l, 1), NVH_OK);
        hits += in_set(set, nset, root[base + i]);
    }
    return hits;
}

static void free_range(nvh_off_t *root, size_t base, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        nvh_link l = {&root[base + i], 0};
        assert_int_equal(nvh_free(g_pool, nvh_ptr(g_pool, root[base + i]), &l, 1), NVH_OK);
    }
}

static void held_while_reader_in(void **state)
{
    (void)state;
    const char *path = test_path("epoch");
    unlink(path);
    nvh_pool_options o = {.root_size = (NFREE + 3 * NALLOC) * sizeof(nvh_off_t),
                          .max_size = 1ull << 30};
    g_pool = nvh_pool_create_ex(path, "epoch", 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(g_pool);
    nvh_heap_config c;
    nvh_heap_config_get(g_pool, &c);
    c.arenas = 1;               /* every free and reserve in one arena */
    c.fifo_delay_ns = 0;        /* only the readers hold space back    */
    assert_int_equal(nvh_heap_config_set(g_pool, &c), NVH_OK);
    nvh_off_t *root = nvh_root(g_pool, NULL);

    /* the objects the reader may hold, linked from root[0..NFREE) */
    assert_int_equal(alloc_count(root, 0, NFREE, NULL, 0), 0);
    uint64_t freed[NFREE];
    for (size_t i = 0; i < NFREE; i++) freed[i] = root[i];
    qsort(freed, NFREE, sizeof *freed, cmp_u64);

    /* 1. a reader is in before the frees: none of their space comes back
     * however many allocations, frees and drains follow */
    reader r1;
    reader_start(&r1);
    free_range(root, 0, NFREE);
    size_t base = NFREE;
    for (int round = 0; round < 3; round++) {
        assert_int_equal(alloc_count(root, base, NALLOC, freed, NFREE), 0);
        free_range(root, base, NALLOC / 2);     /* drains run on these frees */
        base += NALLOC;
    }

    /* 2. the reader leaves and a new one enters: it began after the drains
     * stamped the space (and moved the epoch on), so it cannot hold it and
     * the space is reused while it is still in */
    reader_stop(&r1);
    reader r2;
    reader_start(&r2);
    free_range(root, base - NALLOC + NALLOC / 2, NALLOC / 2);  /* a drain or two */
    base -= NALLOC;
    size_t hits = alloc_count(root, base, NALLOC, freed, NFREE);
    assert_true(hits > 0);
    reader_stop(&r2);

    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(g_pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(g_pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(held_while_reader_in),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
