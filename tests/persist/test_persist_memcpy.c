/* test_persist_memcpy.c — nvh_memcpy_persist/_nodrain and nvh_memset_persist/
 * _nodrain copy and set exactly the bytes asked for, for every size 0..9000
 * at random source and destination alignments, never touching a byte
 * outside the destination; in the pmem domain copies at or above the NT
 * threshold stream their whole lines with non-temporal stores (counted in
 * nt_bytes exactly), elsewhere nothing is counted as NT; the counted lines
 * are always the lines the destination spans; and the data survives a
 * close and reopen. */
#include "persist_test_util.h"

#define MAX_LEN 9000
#define GUARD 256
#define GUARD_BYTE 0xA5

static int setup_env(void **state)
{
    (void)state;
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_NT_THRESHOLD");
    return 0;
}

/* src bytes distinct from the guard and from zero */
static void fill_source(unsigned char *src, size_t len, uint64_t seed)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)test_rand(&seed);
        src[i] = b == GUARD_BYTE || b == 0 ? 0x5B : b;
    }
}

static void check_guards(const unsigned char *dst, size_t len, size_t len_case)
{
    for (size_t i = 1; i <= GUARD; i++)
        if (dst[-(ptrdiff_t)i] != GUARD_BYTE) fail_msg("len %zu: byte %zu before dst changed", len_case, i);
    for (size_t i = 0; i < GUARD; i++)
        if (dst[len + i] != GUARD_BYTE) fail_msg("len %zu: byte %zu after dst changed", len_case, i);
}

/* Copy every size 0..MAX_LEN (stepping by `step`) in `domain`. */
static void memcpy_sizes_in(nvh_domain domain, size_t step)
{
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("memcpy", domain, 64 << 10, &work, &path);
    unsigned char *src_buf = malloc(MAX_LEN + 64);
    assert_non_null(src_buf);
    uint64_t rng = 0xC0FFEE + (uint64_t)domain;
    uint64_t nt_total = 0, nt_copies = 0;

    for (size_t len = 0; len <= MAX_LEN; len += step) {
        size_t dst_off = GUARD + test_rand(&rng) % 128;
        size_t src_off = test_rand(&rng) % 64;
        unsigned char *dst = (unsigned char *)work + dst_off;
        unsigned char *src = src_buf + src_off;
        memset(work, GUARD_BYTE, dst_off + len + GUARD);
        fill_source(src, len, len * 7919 + 1);

        nvh_stats before = stats_now(pool);
        void *ret = nvh_memcpy_persist(pool, dst, src, len);
        nvh_stats got = stats_diff(stats_now(pool), before);

        assert_ptr_equal(ret, dst);
        if (len && memcmp(dst, src, len) != 0) fail_msg("%s: copy of %zu bytes differs",
                                                        nvh_domain_name(domain), len);
        check_guards(dst, len, len);
        assert_int_equal(got.fences, 1);
        if (got.lines_flushed != lines_spanned(dst, len))
            fail_msg("%s: copy of %zu to +%zu counted %llu lines, spans %llu",
                     nvh_domain_name(domain), len, dst_off % 64,
                     (unsigned long long)got.lines_flushed,
                     (unsigned long long)lines_spanned(dst, len));
        uint64_t want_nt = domain == NVH_DOMAIN_PMEM && len >= 256 ? nt_body_bytes(dst, len) : 0;
#if !defined(__x86_64__)
        want_nt = 0;
#endif
        if (got.nt_bytes != want_nt)
            fail_msg("%s: copy of %zu to +%zu streamed %llu bytes, expected %llu",
                     nvh_domain_name(domain), len, dst_off % 64,
                     (unsigned long long)got.nt_bytes, (unsigned long long)want_nt);
        nt_total += got.nt_bytes;
        nt_copies += got.nt_bytes != 0;
    }
    if (domain == NVH_DOMAIN_PMEM)
        print_message("pmem: %llu copies streamed %llu bytes non-temporally\n",
                      (unsigned long long)nt_copies, (unsigned long long)nt_total);

    /* _nodrain: same bytes and lines, no fence */
    fill_source(src_buf, 5000, 99);
    memset(work, GUARD_BYTE, 6000);
    nvh_stats before = stats_now(pool);
    nvh_memcpy_nodrain(pool, work + GUARD + 3, src_buf, 5000);
    nvh_stats got = stats_diff(stats_now(pool), before);
    assert_int_equal(got.fences, 0);
    assert_int_equal(got.lines_flushed, lines_spanned(work + GUARD + 3, 5000));
    nvh_drain(pool);
    assert_memory_equal(work + GUARD + 3, src_buf, 5000);
    check_guards((unsigned char *)work + GUARD + 3, 5000, 5000);

    /* durable across close and reopen (in the same domain) */
    fill_source(src_buf, MAX_LEN, 4242);
    nvh_memcpy_persist(pool, work + 77, src_buf, MAX_LEN);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, "persist-test", domain);
    assert_non_null(pool);
    assert_memory_equal((char *)nvh_root(pool, NULL) + 77, src_buf, MAX_LEN);
    nvh_pool_close(pool);
    free(src_buf);
    unlink(path);
}

static void memcpy_pmem_every_size(void **state)
{
    (void)state;
    memcpy_sizes_in(NVH_DOMAIN_PMEM, 1);
}

static void memcpy_other_domains(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        if (all_domains[d] == NVH_DOMAIN_PMEM) continue;
        /* msync calls are slow on a disk: sample the sizes there */
        memcpy_sizes_in(all_domains[d], all_domains[d] == NVH_DOMAIN_MSYNC ? 61 : 1);
    }
}

static void memset_every_size(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        nvh_domain domain = all_domains[d];
        char *work;
        const char *path;
        nvh_pool *pool = scratch_pool("memset", domain, 64 << 10, &work, &path);
        uint64_t rng = 77 + d;
        size_t step = domain == NVH_DOMAIN_MSYNC ? 61 : 1;
        for (size_t len = 0; len <= MAX_LEN; len += step) {
            size_t off = GUARD + test_rand(&rng) % 128;
            unsigned char *dst = (unsigned char *)work + off;
            int value = (int)(len % 250) + 1;
            memset(work, GUARD_BYTE, off + len + GUARD);
            nvh_stats before = stats_now(pool);
            void *ret = (len % 2) ? nvh_memset_persist(pool, dst, value, len)
                                  : nvh_memset_nodrain(pool, dst, value, len);
            nvh_stats got = stats_diff(stats_now(pool), before);
            assert_ptr_equal(ret, dst);
            for (size_t i = 0; i < len; i++)
                if (dst[i] != (unsigned char)value) fail_msg("memset %zu: byte %zu", len, i);
            check_guards(dst, len, len);
            assert_int_equal(got.lines_flushed, lines_spanned(dst, len));
            assert_int_equal(got.fences, len % 2);
            assert_int_equal(got.nt_bytes, 0);
            if (!(len % 2)) nvh_drain(pool);
        }
        nvh_pool_close(pool);
        unlink(path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(memcpy_pmem_every_size),
        cmocka_unit_test(memcpy_other_domains),
        cmocka_unit_test(memset_every_size),
    };
    return cmocka_run_group_tests(tests, setup_env, NULL);
}
