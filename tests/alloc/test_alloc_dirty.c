/* test_alloc_dirty.c — the redo ring's dirty-line list (alloc.h:
 * nvh_redo_dirty_), which a retire flushes line by line: a line listed
 * once is not listed again before the retire, even when two lines that
 * hash to the same place alternate (a free's run header and link line do,
 * on every free); and a free that clears a link flushes, per free, its
 * record line plus its shares of the link line (8 links per line), the run
 * header and the ring's watermark: ~1.17 lines, not more. */
#include "test_util.h"

#include "alloc/alloc.h"      /* white-box: the dirty-line list */

static nvh_arena g_arena;     /* large: static, zeroed */

static uint64_t place1(uint64_t line) { return (line * 0x9E3779B97F4A7C15ull) >> 58; }

static void alternating_colliders(void **state)
{
    (void)state;
    static char mem[1 << 20] __attribute__((aligned(64)));
    /* two lines with the same first place, as a run header and a link line
     * may have */
    uint64_t a = (uint64_t)(uintptr_t)mem, b = 0;
    for (uint64_t x = a + 64; x < a + sizeof mem; x += 64)
        if (place1(x) == place1(a)) {
            b = x;
            break;
        }
    assert_true(b != 0);
    nvh_arena *ar = &g_arena;
    for (int i = 0; i < 100; i++) {
        nvh_redo_dirty_(NULL, ar, (void *)(uintptr_t)a);
        nvh_redo_dirty_(NULL, ar, (void *)(uintptr_t)(b + 8));
    }
    assert_int_equal(ar->ndirty, 2);
    free(ar->dirty);
}

static void free_link_lines(void **state)
{
    (void)state;
    const char *path = test_path("dirty");
    unlink(path);
    enum { N = 16384 };
    nvh_pool_options o = {.root_size = N * sizeof(nvh_off_t), .max_size = 1ull << 30};
    nvh_pool *pool = nvh_pool_create_ex(path, "dirty", 1 << 20, NVH_DOMAIN_PMEM, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < N; i++) {
        void *p = nvh_reserve(pool, 128);
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    nvh_stats s0, s1;
    nvh_stats_get(pool, &s0);
    for (int i = 0; i < N; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    nvh_stats_get(pool, &s1);
    double lines = (double)(s1.lines_flushed - s0.lines_flushed) / N;
    double fences = (double)(s1.fences - s0.fences) / N;
    print_message("free(1 link) of 128 B objects in order: %.4f lines, %.4f fences per op\n",
                  lines, fences);
    /* per free: the record (1), the link line (1/8), the run header (1/31
     * of a 4 KiB run of 128 B slots), the watermark (1/128, one retire per
     * 128-line ring), and lines dirtied on both sides of a retire again:
     * 1.172; duplicates in the list made it 1.20 */
    assert_true(lines < 1.185);
    assert_true(fences < 1.02);     /* 1 + 2 per retire of 128 records */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alternating_colliders),
        cmocka_unit_test(free_link_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
