/* test_persist_counters.c — the statistics are exact, hardware-independent
 * figures in every domain: a flush of [p, p+n) counts the cache lines the
 * span touches (unaligned heads and tails included, nothing for n = 0), every
 * drain counts one fence, msyncs are counted only where msync(2) is really
 * called (msync domain, one per coalesced range of dirtied pages), and
 * nvh_stats_reset zeroes everything. */
#include "persist_test_util.h"

static int setup_env(void **state)
{
    (void)state;
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_NT_THRESHOLD");
    return 0;
}

static const size_t offsets[] = {0, 1, 7, 8, 31, 32, 63, 64, 65, 127, 128, 4095, 4096, 4097};
static const size_t lengths[] = {0,   1,   2,    7,    8,    9,    63,   64,    65,   127,
                                 128, 129, 191,  192,  255,  256,  257,  4095,  4096, 4097,
                                 8191, 8192, 8193, 65535, 65536, 65537};

static void persist_counts_lines_and_fences(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        nvh_domain domain = all_domains[d];
        char *work;
        const char *path;
        nvh_pool *pool = scratch_pool("counters", domain, 3 * MiB, &work, &path);
        nvh_stats zero = stats_now(pool);
        assert_int_equal(zero.lines_flushed + zero.fences + zero.msyncs + zero.nt_bytes, 0);

        for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
            for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
                char *p = work + offsets[oi];
                size_t n = lengths[li];
                memset(p, (int)(oi + li), n);
                nvh_stats before = stats_now(pool);
                nvh_persist(pool, p, n);
                nvh_stats got = stats_diff(stats_now(pool), before);
                if (got.lines_flushed != lines_spanned(p, n))
                    fail_msg("%s: persist(+%zu, %zu) counted %llu lines, expected %llu",
                             nvh_domain_name(domain), offsets[oi], n,
                             (unsigned long long)got.lines_flushed,
                             (unsigned long long)lines_spanned(p, n));
                assert_int_equal(got.fences, 1);
                assert_int_equal(got.nt_bytes, 0);
                /* the span is one run of contiguous pages: one msync, if any */
                assert_int_equal(got.msyncs, domain == NVH_DOMAIN_MSYNC && n > 0 ? 1 : 0);
            }
        }

        /* flush alone: lines, no fence; drain alone: a fence, no lines */
        nvh_stats before = stats_now(pool);
        nvh_flush(pool, work + 3, 200);
        nvh_stats got = stats_diff(stats_now(pool), before);
        assert_int_equal(got.lines_flushed, lines_spanned(work + 3, 200));
        assert_int_equal(got.fences, 0);
        assert_int_equal(got.msyncs, 0);         /* msync waits for the drain */
        before = stats_now(pool);
        nvh_drain(pool);
        got = stats_diff(stats_now(pool), before);
        assert_int_equal(got.lines_flushed, 0);
        assert_int_equal(got.fences, 1);
        assert_int_equal(got.msyncs, domain == NVH_DOMAIN_MSYNC ? 1 : 0);
        before = stats_now(pool);
        for (int i = 0; i < 10; i++) nvh_drain(pool);
        got = stats_diff(stats_now(pool), before);
        assert_int_equal(got.fences, 10);
        assert_int_equal(got.msyncs, 0);         /* nothing left to sync */

        /* memset/memcpy (below the NT threshold) count like a flush */
        before = stats_now(pool);
        nvh_memset_persist(pool, work + 100, 0x77, 150);
        nvh_memcpy_persist(pool, work + 1000, work + 100, 150);
        nvh_memset_nodrain(pool, work + 5000, 1, 10);
        nvh_memcpy_nodrain(pool, work + 6000, work + 5000, 10);
        got = stats_diff(stats_now(pool), before);
        assert_int_equal(got.lines_flushed,
                         lines_spanned(work + 100, 150) + lines_spanned(work + 1000, 150) +
                             lines_spanned(work + 5000, 10) + lines_spanned(work + 6000, 10));
        assert_int_equal(got.fences, 2);
        nvh_drain(pool);
        assert_memory_equal(work + 1000, work + 100, 150);

        /* random spans: running totals match exactly */
        uint64_t rng = 42 + d, want_lines = 0, want_fences = 0;
        nvh_stats_reset(pool);
        int iterations = domain == NVH_DOMAIN_MSYNC ? 300 : 3000;   /* msync is slow */
        for (int i = 0; i < iterations; i++) {
            size_t off = test_rand(&rng) % (2 * MiB);
            size_t n = test_rand(&rng) % 3000;
            if (test_rand(&rng) % 2) {
                nvh_persist(pool, work + off, n);
                want_fences++;
            } else {
                nvh_flush(pool, work + off, n);
            }
            want_lines += lines_spanned(work + off, n);
        }
        nvh_stats total = stats_now(pool);
        assert_int_equal(total.lines_flushed, want_lines);
        assert_int_equal(total.fences, want_fences);
        nvh_drain(pool);

        /* reset zeroes every counter */
        nvh_stats_reset(pool);
        total = stats_now(pool);
        assert_int_equal(total.lines_flushed, 0);
        assert_int_equal(total.fences, 0);
        assert_int_equal(total.msyncs, 0);
        assert_int_equal(total.nt_bytes, 0);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* The library's own persistence (the epoch commit of an open) is counted. */
static void open_is_counted(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        const char *path = test_path("opencount");
        nvh_pool *pool = nvh_pool_create(path, NULL, MiB, all_domains[d]);
        assert_non_null(pool);
        nvh_stats s = stats_now(pool);
        assert_true(s.lines_flushed >= 1);
        assert_true(s.fences >= 1);
        if (all_domains[d] == NVH_DOMAIN_MSYNC) assert_true(s.msyncs >= 1);
        else assert_int_equal(s.msyncs, 0);
        if (all_domains[d] == NVH_DOMAIN_SIM) assert_int_equal(nvh_sim_fence_count(pool), s.fences);
        nvh_pool_close(pool);
        unlink(path);
    }
}

/* Flush the page `page` of work (one byte in it). */
static void touch_page(nvh_pool *pool, char *work, unsigned page)
{
    char *p = work + (size_t)page * 4096 + 100;
    *p = (char)page;
    nvh_flush(pool, p, 1);
}

static uint64_t msyncs_of_drain(nvh_pool *pool)
{
    nvh_stats before = stats_now(pool);
    nvh_drain(pool);
    nvh_stats got = stats_diff(stats_now(pool), before);
    assert_int_equal(got.fences, 1);
    return got.msyncs;
}

static void msync_coalesces_pages(void **state)
{
    (void)state;
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("msync", NVH_DOMAIN_MSYNC, 3 * MiB, &work, &path);

    assert_int_equal(msyncs_of_drain(pool), 0);                  /* nothing dirty */

    touch_page(pool, work, 10);
    assert_int_equal(msyncs_of_drain(pool), 1);

    touch_page(pool, work, 10);                                  /* same page twice */
    touch_page(pool, work, 10);
    assert_int_equal(msyncs_of_drain(pool), 1);

    for (unsigned p = 20; p < 23; p++) touch_page(pool, work, p);   /* adjacent */
    assert_int_equal(msyncs_of_drain(pool), 1);

    for (unsigned p = 32; p > 29; p--) touch_page(pool, work, p);   /* adjacent, reversed */
    assert_int_equal(msyncs_of_drain(pool), 1);

    touch_page(pool, work, 40);                                  /* a gap of one page */
    touch_page(pool, work, 42);
    assert_int_equal(msyncs_of_drain(pool), 2);

    touch_page(pool, work, 50);                                  /* the gap filled later */
    touch_page(pool, work, 52);
    touch_page(pool, work, 51);
    assert_int_equal(msyncs_of_drain(pool), 1);

    nvh_flush(pool, work + 60 * 4096 + 4000, 200);               /* spans two pages */
    touch_page(pool, work, 62);                                  /* touches the span */
    assert_int_equal(msyncs_of_drain(pool), 1);

    nvh_flush(pool, work + 70 * 4096, 5 * 4096);                 /* five pages */
    touch_page(pool, work, 73);                                  /* inside it */
    touch_page(pool, work, 80);                                  /* apart */
    assert_int_equal(msyncs_of_drain(pool), 2);

    /* many scattered pages: bounded by the range table, never zero */
    for (unsigned p = 100; p < 400; p += 2) touch_page(pool, work, p);
    uint64_t n = msyncs_of_drain(pool);
    assert_true(n >= 1 && n <= 64);
    for (unsigned p = 600; p > 300; p -= 3) touch_page(pool, work, p);
    n = msyncs_of_drain(pool);
    assert_true(n >= 1 && n <= 64);

    /* the data of every recorded page reached the file */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    nvh_pool *probe = nvh_pool_open(path, "persist-test", NVH_OPEN_READONLY);
    assert_non_null(probe);
    nvh_pool_info info;
    nvh_pool_info_get(probe, &info);
    nvh_pool_close(probe);
    for (unsigned p = 100; p < 400; p += 2) {
        char c;
        assert_int_equal(pread(fd, &c, 1, (off_t)(info.root_offset + (size_t)p * 4096 + 100)), 1);
        assert_int_equal(c, (char)p);
    }
    close(fd);
    unlink(path);
}

/* In the sim domain the simulator's own fence count agrees with the stats. */
static void sim_fence_count_matches(void **state)
{
    (void)state;
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("simcount", NVH_DOMAIN_SIM, 8192, &work, &path);
    uint64_t base_fences = nvh_sim_fence_count(pool);
    for (int i = 0; i < 50; i++) nvh_persist(pool, work + i * 100, 100);
    nvh_stats s = stats_now(pool);
    assert_int_equal(s.fences, 50);
    assert_int_equal(nvh_sim_fence_count(pool) - base_fences, 50);
    nvh_pool_close(pool);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(persist_counts_lines_and_fences),
        cmocka_unit_test(open_is_counted),
        cmocka_unit_test(msync_coalesces_pages),
        cmocka_unit_test(sim_fence_count_matches),
    };
    return cmocka_run_group_tests(tests, setup_env, NULL);
}
