/* test_alloc_open.c — opening and closing a pool's heap costs what the pool
 * uses, not what it may grow to (docs/ALLOC.md §3):
 *   - the per-chunk tables are sized by the growth limit (64 GiB by default:
 *     a million entries at the smallest chunk size), yet an open and a close
 *     of a small pool touch no more pages of them with a 64 GiB limit than
 *     with a 64 MiB one (open_cost_independent_of_limit; minor page faults
 *     from getrusage, for the smallest, a middle and the default chunk
 *     size; the open and close times are printed for reference);
 *   - the pool still works after such opens: objects allocated before are
 *     there, chunks claimed in one session have no owner in the next until
 *     claimed again, and allocations and frees across several reopens work
 *     (reopen_cycle). */
#include "test_util.h"

#include <malloc.h>
#include <sys/resource.h>
#include <time.h>

/* TSan's mmap and munmap interceptors touch shadow memory in proportion to
 * the mapping's size (the tables are mapped either way), so page faults
 * measure the sanitizer there, not the heap: the fault checks are skipped */
#if defined(__SANITIZE_THREAD__)
#define FAULTS_MEASURABLE 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FAULTS_MEASURABLE 0
#endif
#endif
#ifndef FAULTS_MEASURABLE
#define FAULTS_MEASURABLE 1
#endif

#define LAYOUT "allocopen"
#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A 4 MiB pool with limit max_size, its heap formatted with chunks of
 * chunk bytes and a few objects in it. */
static const char *make_pool(const char *name, uint64_t max_size, uint64_t chunk)
{
    char cs[32];
    snprintf(cs, sizeof cs, "%llu", (unsigned long long)chunk);
    setenv("NVHEAP_CHUNK_SIZE", cs, 1);
    const char *path = test_path(name);
    nvh_pool_options o = {.max_size = max_size};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 4 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < 8; i++) assert_non_null(nvh_alloc(pool, 100 + 1000 * i, NULL, NULL,
                                                          &root[i]));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unsetenv("NVHEAP_CHUNK_SIZE");
    return path;
}

typedef struct { long open_flt, close_flt; double open_us, close_us; } open_cost;

/* Faults and time of one open and one close of path (the medians of 5). */
static open_cost measure(const char *path)
{
    long of[5], cf[5];
    double ot[5], ct[5];
    for (int r = 0; r < 5; r++) {
        long f0 = minflt();
        double t0 = now_us();
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, 0);
        double t1 = now_us();
        long f1 = minflt();
        assert_non_null(pool);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        ct[r] = now_us() - t1;
        cf[r] = minflt() - f1;
        of[r] = f1 - f0;
        ot[r] = t1 - t0;
    }
    /* insertion sorts: medians */
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && of[j] < of[j - 1]; j--) { long t = of[j]; of[j] = of[j - 1]; of[j - 1] = t; }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && cf[j] < cf[j - 1]; j--) { long t = cf[j]; cf[j] = cf[j - 1]; cf[j - 1] = t; }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && ot[j] < ot[j - 1]; j--) { double t = ot[j]; ot[j] = ot[j - 1]; ot[j - 1] = t; }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && ct[j] < ct[j - 1]; j--) { double t = ct[j]; ct[j] = ct[j - 1]; ct[j - 1] = t; }
    return (open_cost){of[2], cf[2], ot[2], ct[2]};
}

static void open_cost_independent_of_limit(void **state)
{
    (void)state;
    static const uint64_t chunks[] = {64 << 10, 256 << 10, 4 << 20};
    for (unsigned i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        const char *small = make_pool("open-small", 64 * MIB, chunks[i]);
        const char *big = make_pool("open-big", 64 * GIB, chunks[i]);
        open_cost s = measure(small), b = measure(big);
        printf("# chunk %llu KiB: open %ld faults %.0f us, close %ld faults %.0f us (64 MiB "
               "limit); open %ld faults %.0f us, close %ld faults %.0f us (64 GiB limit)\n",
               (unsigned long long)(chunks[i] >> 10), s.open_flt, s.open_us, s.close_flt,
               s.close_us, b.open_flt, b.open_us, b.close_flt, b.close_us);
        /* a million chunks at 64 KiB: 2 MiB of owner entries and 32 MiB of
         * chunk records (512 + 8192 pages) if either walk covered the limit;
         * a few pages of slack for the allocator's own bookkeeping */
        if (FAULTS_MEASURABLE) {
            assert_true(b.open_flt <= s.open_flt + 16);
            assert_true(b.close_flt <= s.close_flt + 16);
        }
        unlink(small);
        unlink(big);
    }
}

/* Objects survive opens with the zeroed owner table, and chunks are claimed
 * again on use: allocate and free across reopens. */
static void reopen_cycle(void **state)
{
    (void)state;
    const char *path = make_pool("open-cycle", 64 * GIB, 64 << 10);
    for (int round = 0; round < 4; round++) {
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, 0);
        assert_non_null(pool);
        nvh_off_t *root = nvh_root(pool, NULL);
        for (int i = 0; i < 8; i++) {
            assert_true(nvh_usable_size(pool, nvh_ptr(pool, root[i])) >= (size_t)(100 + 1000 * i));
        }
        /* free and reallocate half; a large one takes a chunk of its own */
        for (int i = round % 2; i < 8; i += 2) {
            nvh_link l = {&root[i], 0};
            assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
            assert_non_null(nvh_alloc(pool, 100 + 1000 * i, NULL, NULL, &root[i]));
        }
        assert_non_null(nvh_alloc(pool, 200 << 10, NULL, NULL, &root[8 + round]));
        assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, NULL), NVH_OK);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
    }
    unlink(path);
}

int main(void)
{
    unsetenv("NVHEAP_CHUNK_SIZE");
    unsetenv("NVHEAP_MAX_SIZE");
    /* a fixed mmap threshold: glibc otherwise raises it after the first
     * large free, and a table malloc'd from recycled memory would then be
     * written without a page fault to show for it */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_cost_independent_of_limit),
        cmocka_unit_test(reopen_cycle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
