/* test_btree_classic.c — the classic sorted-node B+ tree of bench_btree (bench/btree_classic.c):
 *
 *   modes       every mode (tx, flush, nt) against a DRAM model: random
 *               inserts that split leaves and inner nodes, replaces, lookups,
 *               the sorted-order check, and a reopen that finds it all
 *   crash_tx    CT_TX at every fence of 150 random inserts (crash simulator,
 *               LINES mode): every image opens, passes the check, holds every
 *               acknowledged key with its value and at most the one in flight
 *   crash_tx_words  the same in adversarial WORDS mode, sampled fences
 *   crash_flush_caught  negative control: CT_FLUSH (no log) under the same
 *               checker must fail at some of 80 sampled fences (a torn
 *               shift), which shows the checker can see what the
 *               transactions prevent
 */
#include "test_util.h"

#include "../../bench/btree_classic.h"

#define LAYOUT "ctest"
#define MIB (1024ull * 1024ull)

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* the value of key k, version v: len 8..300 bytes, a pattern of both */
static size_t value_of(uint64_t k, unsigned v, unsigned char *buf)
{
    size_t len = 8 + mix(k ^ v) % 293;
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(k * 31 + v * 7 + i);
    return len;
}

static void check_value(ct_tree *t, uint64_t k, unsigned v)
{
    unsigned char want[320];
    size_t wl = value_of(k, v, want);
    const void *got;
    size_t gl;
    assert_int_equal(ct_get(t, k, &got, &gl), NVH_OK);
    assert_int_equal(gl, wl);
    assert_memory_equal(got, want, wl);
}

static void test_modes(void **state)
{
    (void)state;
    static const ct_mode modes[] = {CT_TX, CT_FLUSH, CT_NT};
    enum { N = 6000, R = 600 };
    for (unsigned m = 0; m < 3; m++) {
        const char *path = test_path("ct-modes");
        if (modes[m] == CT_NT) setenv("NVHEAP_NT_THRESHOLD", "64", 1);
        nvh_pool *pool = nvh_pool_create(path, LAYOUT, 64 * MIB, NVH_DOMAIN_PMEM);
        unsetenv("NVHEAP_NT_THRESHOLD");
        assert_non_null(pool);
        ct_tree *t = ct_open(pool, "t", modes[m], 1);
        assert_non_null(t);
        unsigned char buf[320];
        for (uint64_t i = 0; i < N; i++) {
            uint64_t k = mix(i) | 1;      /* never 0: key[0] of an inner node is ignored anyway */
            size_t len = value_of(k, 0, buf);
            assert_int_equal(ct_put(t, k, buf, len), NVH_OK);
        }
        for (uint64_t i = 0; i < R; i++) {                /* replaces */
            uint64_t k = mix(i * 7 % N) | 1;
            size_t len = value_of(k, 1, buf);
            assert_int_equal(ct_put(t, k, buf, len), NVH_OK);
        }
        assert_int_equal(ct_count(t), N);
        assert_int_equal(ct_check(t), NVH_OK);
        assert_int_equal(ct_get(t, 2, NULL, NULL), NVH_E_NOTFOUND);   /* even: absent */
        for (int pass = 0; pass < 2; pass++) {
            for (uint64_t i = 0; i < N; i++) {
                uint64_t k = mix(i) | 1;
                int replaced = 0;
                for (uint64_t j = 0; j < R; j++) replaced |= (j * 7 % N) == i;
                check_value(t, k, (unsigned)replaced);
            }
            if (pass == 1) break;
            ct_close(t);
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
            pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PMEM);
            assert_non_null(pool);
            assert_null(ct_open(pool, "other", modes[m], 0));
            t = ct_open(pool, "t", modes[m], 0);
            assert_non_null(t);
            assert_int_equal(ct_count(t), N);
            assert_int_equal(ct_check(t), NVH_OK);
        }
        ct_close(t);
        nvh_pool_close(pool);
        unlink(path);
    }
}

/* ---- crash exploration ----------------------------------------------------- */
enum { CN = 150 };
static ct_mode g_mode;
static volatile uint64_t g_acked;       /* puts returned NVH_OK (seen by the forked checker) */
static const char *g_scratch;

static uint64_t ckey(uint64_t i) { return (mix(i + 1000) % 100000) * 2 + 1; }

static int crash_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    g_acked = 0;        /* sampling runs the workload twice */
    ct_tree *t = ct_open(pool, "t", g_mode, 0);
    if (!t) return 1;
    unsigned char buf[320];
    for (uint64_t i = 0; i < CN; i++) {
        uint64_t k = ckey(i);
        size_t len = value_of(k, 0, buf);
        if (ct_put(t, k, buf, len) != NVH_OK) return 2;
        g_acked = i + 1;
    }
    ct_close(t);
    return 0;
}

static int crash_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  fence %llu: open: %s\n", (unsigned long long)pt->fence, nvh_errormsg());
        return 2;
    }
    int rc = 0;
    ct_tree *t = ct_open(pool, "t", g_mode, 0);
    if (!t || ct_check(t) != NVH_OK) {
        fprintf(stderr, "  fence %llu: tree damaged\n", (unsigned long long)pt->fence);
        rc = 3;
        goto out;
    }
    uint64_t acked = g_acked, count = ct_count(t);
    if (count < acked || count > acked + 1) {
        fprintf(stderr, "  fence %llu: %llu keys, %llu acknowledged\n",
                (unsigned long long)pt->fence, (unsigned long long)count,
                (unsigned long long)acked);
        rc = 4;
        goto out;
    }
    unsigned char want[320];
    for (uint64_t i = 0; i < CN && !rc; i++) {
        uint64_t k = ckey(i);
        const void *got;
        size_t gl;
        int g = ct_get(t, k, &got, &gl);
        if (i < acked || (i == acked && g == NVH_OK)) {
            size_t wl = value_of(k, 0, want);
            if (g != NVH_OK || gl != wl || memcmp(got, want, wl) != 0) {
                fprintf(stderr, "  fence %llu: key %llu (put %llu) %s\n",
                        (unsigned long long)pt->fence, (unsigned long long)k,
                        (unsigned long long)i, g == NVH_OK ? "has a wrong value" : "lost");
                rc = 5;
            }
        } else if (g == NVH_OK) {
            fprintf(stderr, "  fence %llu: key of put %llu present before it ran\n",
                    (unsigned long long)pt->fence, (unsigned long long)i);
            rc = 6;
        }
    }
    /* the recovered tree takes more inserts */
    unsigned char buf[320];
    size_t len = value_of(3, 0, buf);
    if (!rc && g_mode == CT_TX && (ct_put(t, 200001, buf, len) != NVH_OK || ct_check(t) != NVH_OK))
        rc = 7;
out:
    if (t) ct_close(t);
    nvh_pool_close(pool);
    return rc;
}

static const char *crash_pool(void)
{
    const char *path = test_path("ct-crash");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 4 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    ct_tree *t = ct_open(pool, "t", CT_TX, 1);
    assert_non_null(t);
    ct_close(t);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void test_crash_tx(void **state)
{
    (void)state;
    g_mode = CT_TX;
    g_acked = 0;
    const char *path = crash_pool();
    nvh_crash_config cfg = {.pool_path = path, .layout = LAYOUT, .workload = crash_workload,
                            .check = crash_check, .seed = 7, .mode = NVH_CRASH_LINES,
                            .budget = 0, .scratch_dir = g_scratch};
    test_crash_explore(&cfg);
    unlink(path);
}

static void test_crash_tx_words(void **state)
{
    (void)state;
    g_mode = CT_TX;
    g_acked = 0;
    const char *path = crash_pool();
    nvh_crash_config cfg = {.pool_path = path, .layout = LAYOUT, .workload = crash_workload,
                            .check = crash_check, .seed = 11, .mode = NVH_CRASH_WORDS,
                            .budget = 120, .images_per_point = 2, .scratch_dir = g_scratch};
    test_crash_explore(&cfg);
    unlink(path);
}

static void test_crash_flush_caught(void **state)
{
    (void)state;
    g_mode = CT_FLUSH;
    g_acked = 0;
    const char *path = crash_pool();
    nvh_crash_config cfg = {.pool_path = path, .layout = LAYOUT, .workload = crash_workload,
                            .check = crash_check, .seed = 7, .mode = NVH_CRASH_LINES,
                            .budget = 80, .scratch_dir = g_scratch};
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    print_message("  no log: %llu of %llu crash images fail the check (expected: some)\n",
                  (unsigned long long)rep.failures, (unsigned long long)rep.points_tested);
    assert_int_equal(rep.workload_status, 0);
    assert_true(rep.failures > 0);
    unlink(path);
}

/* No argument: the mode tests. "crash": the crash tests (registered as
 * test_btree_classic_crash, which the TSan suite skips like every *_crash
 * test: one forked child per image is too slow there, and they are
 * single-threaded). */
int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "crash")) {
        g_scratch = test_shm_scratch("ct-crash");
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_crash_tx),
            cmocka_unit_test(test_crash_tx_words),
            cmocka_unit_test(test_crash_flush_caught),
        };
        int rc = cmocka_run_group_tests(tests, NULL, NULL);
        rmdir(g_scratch);
        return rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
