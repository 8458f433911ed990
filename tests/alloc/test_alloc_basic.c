/* test_alloc_basic.c — every allocator API call and its errors: reserve,
 * cancel, activate with 0..14 links, free with links, nvh_alloc, usable size,
 * iteration, named objects, out-of-space, bad pointers, double frees, growth,
 * persistence across close/open, per-op flush/fence counts. */
#include "test_util.h"

#include <stdbool.h>
#include <time.h>

static nvh_pool *mkpool(const char *name, uint64_t size, uint64_t max, unsigned flags)
{
    const char *path = test_path(name);
    nvh_pool_options o = {.root_size = 16384, .max_size = max};
    nvh_pool *p = nvh_pool_create_ex(path, name, size, flags, &o);
    assert_non_null(p);
    unlink(path);    /* never reopened by path: the mapping and the descriptor are enough */
    return p;
}

static void reserve_activate_free(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("raf", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    nvh_off_t *root = nvh_root(pool, NULL);
    size_t sizes[] = {0, 1, 64, 65, 128, 1000, 1984, 1985, 4032, 4033, 100000, 3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *p = nvh_reserve(pool, sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        assert_true(nvh_usable_size(pool, p) >= (sizes[i] ? sizes[i] : 1));
        memset(p, 0xAB, sizes[i]);
        nvh_persist(pool, p, sizes[i] ? sizes[i] : 1);
        nvh_off_t *links[2] = {&root[2 * i], &root[2 * i + 1]};
        assert_int_equal(nvh_activate(pool, p, links, 2), NVH_OK);
        assert_int_equal(root[2 * i], nvh_off(pool, p));
        assert_int_equal(root[2 * i + 1], nvh_off(pool, p));
        assert_int_equal(nvh_activate(pool, p, NULL, 0), NVH_E_INVAL);   /* already active */
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = nvh_ptr(pool, root[2 * i]);
        nvh_link l[2] = {{&root[2 * i], 0}, {&root[2 * i + 1], 0}};
        assert_int_equal(nvh_free(pool, p, l, 2), NVH_OK);
        assert_int_equal(root[2 * i], 0);
        assert_int_equal(root[2 * i + 1], 0);
        assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_DOUBLEFREE);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void cancel_and_errors(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("err", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    nvh_off_t *root = nvh_root(pool, NULL);
    char *p = nvh_reserve(pool, 100);
    assert_non_null(p);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_BADPTR);   /* reserved only */
    assert_int_equal(nvh_cancel(pool, p), NVH_OK);
    assert_int_equal(nvh_cancel(pool, p), NVH_E_BADPTR);
    assert_int_equal(nvh_activate(pool, p, NULL, 0), NVH_E_BADPTR);
    char *big = nvh_reserve(pool, 10000);
    assert_non_null(big);
    assert_int_equal(nvh_cancel(pool, big), NVH_OK);
    assert_int_equal(nvh_cancel(pool, big), NVH_E_BADPTR);

    /* pointers outside the pool, misaligned, interior */
    int local;
    assert_int_equal(nvh_free(pool, &local, NULL, 0), NVH_E_BADPTR);
    assert_int_equal(nvh_free(pool, NULL, NULL, 0), NVH_E_INVAL);
    p = nvh_alloc(pool, 256, NULL, NULL, &root[0]);
    assert_non_null(p);
    assert_int_equal(nvh_free(pool, p + 8, NULL, 0), NVH_E_BADPTR);
    assert_int_equal(nvh_free(pool, p + 64, NULL, 0), NVH_E_BADPTR);     /* not a slot */
    assert_int_equal(nvh_free(pool, p + 256, NULL, 0), NVH_E_DOUBLEFREE); /* a free slot */
    assert_int_equal(nvh_free(pool, (char *)nvh_pool_base(pool) + 4096, NULL, 0), NVH_E_BADPTR);
    char *lg = nvh_alloc(pool, 20000, NULL, NULL, &root[1]);
    assert_non_null(lg);
    assert_int_equal(nvh_free(pool, lg + 4096, NULL, 0), NVH_E_BADPTR);
    /* link errors */
    nvh_link bad = {&root[5], 0};
    assert_int_equal(nvh_free(pool, p, &bad, 1), NVH_E_INVAL);       /* does not point at it */
    nvh_off_t *badlinks[1] = {(nvh_off_t *)((char *)&root[6] + 1)};
    char *q = nvh_reserve(pool, 64);
    assert_int_equal(nvh_activate(pool, q, badlinks, 1), NVH_E_INVAL);
    nvh_off_t *hdrlink[1] = {(nvh_off_t *)nvh_pool_base(pool)};
    assert_int_equal(nvh_activate(pool, q, hdrlink, 1), NVH_E_INVAL); /* superblock */
    assert_int_equal(nvh_activate(pool, q, badlinks, NVH_LINKS_MAX + 1), NVH_E_INVAL);
    assert_int_equal(nvh_cancel(pool, q), NVH_OK);
    nvh_link l = {&root[0], 0};
    assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
    assert_int_equal(nvh_usable_size(pool, p), 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void many_links(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("links", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (unsigned n = 0; n <= NVH_LINKS_MAX; n++) {
        char *p = nvh_reserve(pool, 300);
        nvh_off_t *links[NVH_LINKS_MAX];
        for (unsigned i = 0; i < n; i++) links[i] = &root[100 + i];
        assert_int_equal(nvh_activate(pool, p, links, n), NVH_OK);
        for (unsigned i = 0; i < n; i++) assert_int_equal(root[100 + i], nvh_off(pool, p));
        nvh_link fl[NVH_LINKS_MAX];
        for (unsigned i = 0; i < n; i++) fl[i] = (nvh_link){&root[100 + i], i == 0 ? 0 : 7 * 64};
        assert_int_equal(nvh_free(pool, p, fl, n), NVH_OK);
        for (unsigned i = 0; i < n; i++) assert_int_equal(root[100 + i], i == 0 ? 0 : 7 * 64);
        for (unsigned i = 0; i < NVH_LINKS_MAX; i++) root[100 + i] = 0;
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static int ctor_fill(nvh_pool *pool, void *ptr, size_t size, void *arg)
{
    (void)pool;
    memset(ptr, *(int *)arg, size);
    return 0;
}
static int ctor_fail(nvh_pool *pool, void *ptr, size_t size, void *arg)
{
    (void)pool; (void)ptr; (void)size; (void)arg;
    return 1;
}

static int count_obj(void *ptr, size_t usable, void *arg)
{
    (void)ptr; (void)usable;
    (*(int *)arg)++;
    return 0;
}

static void persist_across_reopen(void **state)
{
    (void)state;
    const char *path = test_path("reopen");
    nvh_pool *pool = nvh_pool_create(path, "r", 1 << 20, NVH_DOMAIN_SIM);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    int v = 0x5A;
    for (int i = 0; i < 200; i++) {
        char *p = nvh_alloc(pool, (size_t)(i % 7) * 300 + 10, ctor_fill, &v, &root[i]);
        assert_non_null(p);
    }
    assert_null(nvh_alloc(pool, 10, ctor_fail, NULL, &root[300]));
    assert_int_equal(nvh_errcode(), NVH_E_ABORTED);
    char *n = nvh_reserve_named(pool, "the-root", 500);
    assert_non_null(n);
    strcpy(n, "named data");
    nvh_persist(pool, n, 11);
    assert_int_equal(nvh_activate_named(pool, "the-root"), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, "r", NVH_DOMAIN_SIM);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    for (int i = 0; i < 200; i++) {
        unsigned char *p = nvh_ptr(pool, root[i]);
        assert_non_null(p);
        assert_int_equal(p[0], 0x5A);
        assert_true(nvh_usable_size(pool, p) >= (size_t)(i % 7) * 300 + 10);
    }
    size_t sz = 0;
    char *got = nvh_get_named(pool, "the-root", &sz);
    assert_non_null(got);
    assert_string_equal(got, "named data");
    assert_true(sz >= 500);
    int count = 0;
    assert_int_equal(nvh_heap_foreach(pool, count_obj, &count), 0);
    assert_int_equal(count, 201);
    /* free everything after the reopen (chunks not yet rescanned) */
    for (int i = 0; i < 200; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    assert_int_equal(nvh_free_named(pool, "the-root"), NVH_OK);
    count = 0;
    nvh_heap_foreach(pool, count_obj, &count);
    assert_int_equal(count, 0);
    /* and the space is reusable */
    for (int i = 0; i < 200; i++) assert_non_null(nvh_alloc(pool, 700, NULL, NULL, &root[i]));
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, 200);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static int list_named(const char *name, void *ptr, size_t size, void *arg)
{
    (void)ptr; (void)size; (void)name;
    (*(int *)arg)++;
    return 0;
}

static void named_objects(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("named", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    char name[80];
    memset(name, 'x', sizeof name);
    name[56] = 0;
    assert_null(nvh_reserve_named(pool, name, 10));
    assert_int_equal(nvh_errcode(), NVH_E_TOOLONG);
    name[55] = 0;
    void *p = nvh_reserve_named(pool, name, 10);
    assert_non_null(p);
    assert_null(nvh_reserve_named(pool, name, 10));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_null(nvh_get_named(pool, name, NULL));           /* not yet active */
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    assert_int_equal(nvh_activate_named(pool, name), NVH_OK);
    assert_ptr_equal(nvh_get_named(pool, name, NULL), p);
    assert_int_equal(nvh_activate_named(pool, name), NVH_E_NOTFOUND);
    assert_null(nvh_reserve_named(pool, name, 10));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_int_equal(nvh_free_named(pool, "nope"), NVH_E_NOTFOUND);
    assert_null(nvh_reserve_named(pool, "", 10));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    /* many names, with deletes (tombstones) in between */
    for (int i = 0; i < 300; i++) {
        char n[32];
        snprintf(n, sizeof n, "obj-%d", i);
        assert_non_null(nvh_reserve_named(pool, n, (size_t)i * 10));
        assert_int_equal(nvh_activate_named(pool, n), NVH_OK);
        if (i % 3 == 0) assert_int_equal(nvh_free_named(pool, n), NVH_OK);
    }
    void *c = nvh_reserve_named(pool, "cancelled", 64);
    assert_int_equal(nvh_cancel(pool, c), NVH_OK);
    assert_int_equal(nvh_activate_named(pool, "cancelled"), NVH_E_NOTFOUND);
    int count = 0;
    assert_int_equal(nvh_named_foreach(pool, list_named, &count), 0);
    assert_int_equal(count, 201);
    for (int i = 0; i < 300; i++) {
        char n[32];
        snprintf(n, sizeof n, "obj-%d", i);
        if (i % 3 == 0) assert_null(nvh_get_named(pool, n, NULL));
        else assert_non_null(nvh_get_named(pool, n, NULL));
    }
    assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void out_of_space_and_growth(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("full", 1 << 20, 16 << 20, NVH_DOMAIN_PROCESS);
    nvh_off_t *root = nvh_root(pool, NULL);
    uint64_t size0 = nvh_pool_size(pool);
    int n = 0;
    void *p;
    while ((p = nvh_alloc(pool, 100000, NULL, NULL, NULL)) != NULL) n++;
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_true(nvh_pool_size(pool) > size0);
    assert_true(nvh_pool_size(pool) <= 16 << 20);
    assert_true(n > 50);
    /* small objects may still fit in leftover space; then they fail cleanly */
    while ((p = nvh_alloc(pool, 64, NULL, NULL, NULL)) != NULL) n++;
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_null(nvh_reserve(pool, (size_t)1 << 40));
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    (void)root;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void flush_fence_counts(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("counts", 1 << 20, 64 << 20, NVH_DOMAIN_PMEM);
    nvh_off_t *root = nvh_root(pool, NULL);
    enum { N = 4096 };
    /* warm up: the first chunk claim costs extra */
    void *w = nvh_reserve(pool, 128);
    nvh_off_t *l0[1] = {&root[0]};
    assert_int_equal(nvh_activate(pool, w, l0, 1), NVH_OK);
    nvh_stats s0, s1, s2;
    nvh_stats_get(pool, &s0);
    for (int i = 0; i < N; i++) {
        void *p = nvh_reserve(pool, 128);
        nvh_off_t *links[1] = {&root[1 + i % 500]};
        assert_int_equal(nvh_activate(pool, p, links, 1), NVH_OK);
    }
    nvh_stats_get(pool, &s1);
    double lines = (double)(s1.lines_flushed - s0.lines_flushed) / N;
    double fences = (double)(s1.fences - s0.fences) / N;
    print_message("reserve+activate(128 B, 1 link): %.3f lines, %.3f fences per op\n", lines, fences);
    assert_true(fences < 1.05);
    assert_true(lines < 2.2);
    /* frees without links */
    nvh_stats_get(pool, &s1);
    int freed = 0;
    for (int i = 0; i < 500; i++) {
        void *p = nvh_ptr(pool, root[1 + i]);
        nvh_link l = {&root[1 + i], 0};
        assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
        freed++;
    }
    nvh_stats_get(pool, &s2);
    print_message("free(1 link): %.3f lines, %.3f fences per op\n",
                  (double)(s2.lines_flushed - s1.lines_flushed) / freed,
                  (double)(s2.fences - s1.fences) / freed);
    assert_true((double)(s2.fences - s1.fences) / freed < 1.1);
    /* the record is the only line flushed before the fence; the link lines
     * (8 links per line here) are written back once per retire batch */
    assert_true((double)(s2.lines_flushed - s1.lines_flushed) / freed < 1.25);
    /* free without links, activate with 2 links */
    nvh_stats s3, s4;
    void *objs[256];
    for (int i = 0; i < 256; i++) {
        objs[i] = nvh_reserve(pool, 128);
        nvh_off_t *links[2] = {&root[600 + 2 * i], &root[601 + 2 * i]};
        if (i == 0) nvh_stats_get(pool, &s3);
        if (!objs[i]) print_message("reserve: %s\n", nvh_errormsg());
        assert_int_equal(nvh_activate(pool, objs[i], links, 2), NVH_OK);
    }
    nvh_stats_get(pool, &s4);
    print_message("reserve+activate(128 B, 2 links): %.3f lines, %.3f fences per op\n",
                  (double)(s4.lines_flushed - s3.lines_flushed) / 256,
                  (double)(s4.fences - s3.fences) / 256);
    nvh_stats_get(pool, &s3);
    for (int i = 0; i < 256; i++) {
        root[600 + 2 * i] = root[601 + 2 * i] = 0;   /* the test drops the links itself */
        assert_int_equal(nvh_free(pool, objs[i], NULL, 0), NVH_OK);
    }
    nvh_stats_get(pool, &s4);
    print_message("free(0 links): %.3f lines, %.3f fences per op\n",
                  (double)(s4.lines_flushed - s3.lines_flushed) / 256,
                  (double)(s4.fences - s3.fences) / 256);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void config_roundtrip(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("cfg", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    nvh_heap_config c;
    assert_int_equal(nvh_heap_config_get(pool, &c), NVH_OK);
    c.fifo_delay_ns = 1000000;
    c.arenas = 3;
    assert_int_equal(nvh_heap_config_set(pool, &c), NVH_OK);
    nvh_heap_config d;
    nvh_heap_config_get(pool, &d);
    assert_int_equal(d.fifo_delay_ns, 1000000);
    assert_int_equal(d.arenas, 3);
    c.arenas = 0;
    assert_int_equal(nvh_heap_config_set(pool, &c), NVH_E_INVAL);
    assert_int_equal(nvh_heap_sync(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static int stop_after_two(void *ptr, size_t usable, void *arg)
{
    (void)ptr; (void)usable;
    return ++*(int *)arg == 2 ? 7 : 0;
}

/* Read-only opens, statistics, iteration, check on a clean pool */
static void readonly_stats_iteration(void **state)
{
    (void)state;
    const char *path = test_path("ro");
    nvh_pool *pool = nvh_pool_create(path, "ro", 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < 10; i++) assert_non_null(nvh_alloc(pool, 128, NULL, NULL, &root[i]));
    assert_non_null(nvh_alloc(pool, 9000, NULL, NULL, &root[10]));
    void *n = nvh_reserve_named(pool, "cfg", 300);
    assert_int_equal(nvh_usable_size(pool, n), 320);          /* reserved: known */
    assert_int_equal(nvh_activate_named(pool, "cfg"), NVH_OK);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.cls[2].slots_used, 10);
    assert_int_equal(st.cls[5].slots_used, 1);
    assert_int_equal(st.large_objects, 1);
    assert_int_equal(st.live_objects, 12);
    assert_true(st.free_bytes > 0 && st.largest_free <= st.free_bytes);
    assert_true(st.fragmentation >= 0.0 && st.fragmentation < 1.0);
    int calls = 0;
    assert_int_equal(nvh_heap_foreach(pool, stop_after_two, &calls), 7);   /* early stop */
    assert_int_equal(calls, 2);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    uint64_t corrupt = 9;
    assert_int_equal(nvh_heap_check_path(path, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);

    pool = nvh_pool_open(path, "ro", NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_null(nvh_reserve(pool, 64));
    assert_int_equal(nvh_errcode(), NVH_E_READONLY);
    size_t sz = 0;
    assert_non_null(nvh_get_named(pool, "cfg", &sz));
    assert_int_equal(sz, 320);
    assert_int_equal(nvh_free_named(pool, "cfg"), NVH_E_READONLY);
    root = nvh_root(pool, NULL);
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[0]), NULL, 0), NVH_E_READONLY);
    calls = 0;
    nvh_heap_foreach(pool, stop_after_two, &calls);
    assert_int_equal(calls, 2);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);

    /* NULL pool everywhere */
    assert_null(nvh_reserve(NULL, 1));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_int_equal(nvh_free(NULL, NULL, NULL, 0), NVH_E_INVAL);
    assert_int_equal(nvh_heap_stats_get(NULL, &st), NVH_E_INVAL);
}

/* Wear: freed space waits T in the don't-allocate FIFO; slot choice rotates */
static void wear_fifo_and_rotation(void **state)
{
    (void)state;
    nvh_pool *pool = mkpool("wear", 1 << 20, 64 << 20, NVH_DOMAIN_PROCESS);
    nvh_off_t *root = nvh_root(pool, NULL);
    /* rotation: a cancelled slot is not the next one handed out */
    void *a = nvh_reserve(pool, 192);
    assert_int_equal(nvh_cancel(pool, a), NVH_OK);
    void *b = nvh_reserve(pool, 192);
    assert_ptr_not_equal(a, b);
    assert_int_equal(nvh_cancel(pool, b), NVH_OK);
    /* FIFO with T = 1 hour: a freed object is not reused while space lasts */
    nvh_heap_config c;
    nvh_heap_config_get(pool, &c);
    c.fifo_delay_ns = 3600ull * 1000000000ull;
    assert_int_equal(nvh_heap_config_set(pool, &c), NVH_OK);
    void *x = nvh_alloc(pool, 256, NULL, NULL, &root[0]);
    nvh_link l = {&root[0], 0};
    assert_int_equal(nvh_free(pool, x, &l, 1), NVH_OK);
    nvh_heap_stats st;
    nvh_heap_stats_get(pool, &st);
    assert_int_equal(st.fifo_entries, 1);
    assert_int_equal(st.fifo_bytes, 256);
    for (int i = 0; i < 2000; i++) {
        void *y = nvh_alloc(pool, 256, NULL, NULL, &root[1 + i % 100]);
        assert_non_null(y);
        assert_ptr_not_equal(x, y);
        nvh_link ly = {&root[1 + i % 100], 0};
        assert_int_equal(nvh_free(pool, y, &ly, 1), NVH_OK);
    }
    /* T = 0 and a 4 KiB bound: freed space comes back (after its free
     * record is retired), so an alloc/free loop does not grow the heap */
    c.fifo_delay_ns = 0;
    c.fifo_max_bytes = 4096;
    assert_int_equal(nvh_heap_config_set(pool, &c), NVH_OK);
    nvh_heap_stats_get(pool, &st);
    uint64_t chunks = st.chunks, size = nvh_pool_size(pool);
    for (int i = 0; i < 20000; i++) {
        void *y = nvh_alloc(pool, 256, NULL, NULL, &root[1]);
        assert_non_null(y);
        nvh_link ly = {&root[1], 0};
        assert_int_equal(nvh_free(pool, y, &ly, 1), NVH_OK);
    }
    nvh_heap_stats_get(pool, &st);
    assert_int_equal(st.chunks, chunks);
    assert_int_equal(nvh_pool_size(pool), size);
    assert_true(st.fifo_bytes <= 4096 + 256);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

/* Open after a crash replays only the rings: its cost does not depend on the
 * number of live objects. */
static double open_crashed_ms(int nobj, uint64_t *replayed)
{
    const char *path = test_path("opentime");
    nvh_pool_options o = {.max_size = 1ull << 30};
    nvh_pool *pool = nvh_pool_create_ex(path, "ot", 1 << 20, NVH_DOMAIN_SIM, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < nobj; i++) {
        void *p = nvh_reserve(pool, 64);
        assert_non_null(p);
        nvh_off_t *l[1] = {&root[i % 512]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    assert_int_equal(nvh_sim_write_image(pool, image, 1, NVH_CRASH_LINES), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pool = nvh_pool_open(image, "ot", NVH_DOMAIN_PROCESS);
    void *first = nvh_reserve(pool, 64);     /* forces the heap open */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(pool);
    assert_non_null(first);
    nvh_heap_stats st;
    nvh_heap_stats_get(pool, &st);
    *replayed = st.records_replayed;
    assert_int_equal(st.live_objects, (uint64_t)nobj);
    nvh_pool_close(pool);
    unlink(image);
    return (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
}

static void open_time_constant(void **state)
{
    (void)state;
    uint64_t r1 = 0, r2 = 0;
    double small = open_crashed_ms(1000, &r1);
    double big = open_crashed_ms(100000, &r2);
    print_message("open after crash: 1e3 objects %.2f ms (%llu records replayed), "
                  "1e5 objects %.2f ms (%llu records replayed)\n", small,
                  (unsigned long long)r1, big, (unsigned long long)r2);
    assert_true(r1 <= 16 * 128 && r2 <= 16 * 128);
    assert_true(big < 200.0);      /* generous: sanitizer builds, shared CI machines */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reserve_activate_free),
        cmocka_unit_test(cancel_and_errors),
        cmocka_unit_test(many_links),
        cmocka_unit_test(persist_across_reopen),
        cmocka_unit_test(named_objects),
        cmocka_unit_test(out_of_space_and_growth),
        cmocka_unit_test(flush_fence_counts),
        cmocka_unit_test(config_roundtrip),
        cmocka_unit_test(readonly_stats_iteration),
        cmocka_unit_test(wear_fifo_and_rotation),
        cmocka_unit_test(open_time_constant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
