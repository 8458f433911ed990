/* test_protect_churn.c — async protection must not churn: on an idle
 * machine, pages that are used all the time must stay writable, so a
 * B+-tree-like workload costs a bounded number of mprotect calls and faults
 * however many operations it runs.
 *
 * Why this test exists: a rework of the window counts can look faster
 * under load yet, on an idle machine, protect hot pages and re-open them
 * in a loop (1-2.5 mprotect calls per B+ tree insert, 17-25x slower;
 * docs/PROTECT.md, "Alternatives measured"). Timing tests cannot catch that on a
 * shared machine; counting system calls can.
 *
 * The workload (one thread, as the B+ tree's inserts): every operation
 * writes a 16 B slot of one of LEAVES "leaf" pages (random, each window
 * opened and closed around the store) and appends a 256 B "record" into the
 * current 64 KiB "slab" (a held window over the whole slab, a nested
 * per-record window, as src/ds/btree_slab.c does). Run for RUN_MS at full
 * speed with a 20 ms and an 80 ms service interval:
 *   - every leaf page is used far more often than once per interval, so
 *     after its first fault it must never be protected again: faults and
 *     mprotect calls are bounded by the pages and slabs used, plus a few per
 *     service pass, plus what a stall may cost: the thread times every
 *     operation, and a gap of an interval or more (it was descheduled: a
 *     loaded machine) may hold a whole interval between two passes in which
 *     no leaf was used, so every leaf page may be protected and fault once
 *     more (once per gap: the second chance protects a page only after a
 *     whole interval unused, and then it stays read-only until its fault)
 *   - once the thread stops, every page is read-only again within a few
 *     intervals (exposure stays bounded), with no nvh_protect_sync
 * Both with the per-thread window cache (the default) and without
 * (NVH_PROTECT_NO_CACHE).
 * The negative control: the same run with NVH_PROTECT_STRICT (every pass
 * protects every page with no window open) must exceed the bound — the
 * check can fail. */
#include "protect_test.h"

#include <time.h>

#define LEAVES 128u
#define SLAB_PAGES 16u
#define RECORD 256u
#define RUN_MS 400u

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int wait_writable(const void *p, int want, unsigned ms)
{
    for (unsigned i = 0; i < ms; i++) {
        if (pt_writable(p) == want) return 1;
        usleep(1000);
    }
    return pt_writable(p) == want;
}

typedef struct churn_result {
    uint64_t ops, slabs, passes;
    uint64_t stalls;           /* gaps of an interval or more between two ops */
    nvh_protect_stats s;
} churn_result;

static churn_result churn_run(uint64_t interval_ns, unsigned flags)
{
    /* leaves on every other page (no coalescing between them), then slabs */
    uint64_t slab_area = 64u * SLAB_PAGES;            /* 64 slabs            */
    nvh_pool *pool = pt_pool("churn", (2 * LEAVES + slab_area + 64) * PAGE + 4 * MIB);
    assert_non_null(pool);
    nvh_protect_options o = {.mode = NVH_PROTECT_ASYNC, .interval_ns = interval_ns,
                             .flags = flags};
    assert_int_equal(nvh_protect_configure(pool, &o), NVH_OK);
    char *leaf0 = pt_page(pool, 0);
    char *slabs = pt_page(pool, 2 * LEAVES + 8);
    uint64_t nslabs = slab_area / SLAB_PAGES;

    churn_result r = {0};
    nvh_protect_stats_reset(pool);
    uint64_t seed = 0x9E3779B97F4A7C15ull, start = now_ns(), end = start + RUN_MS * 1000000ull;
    uint64_t slab = 0, used = 0;
    char *cur = slabs;
    nvh_protect_hold hold;
    nvh_protect_hold_open_(pool, &hold, cur, SLAB_PAGES * PAGE);
    r.slabs = 1;
    uint64_t last = start;
    for (;;) {
        uint64_t t = now_ns();
        if (t - last >= interval_ns) r.stalls++;
        last = t;
        if ((r.ops & 255) == 0 && t >= end) break;
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        /* the record, in the held slab (a new slab when full; slabs are
         * reused round-robin: the held window moves on like the tree's) */
        if (used + RECORD > SLAB_PAGES * PAGE) {
            nvh_protect_hold_close_(pool, &hold);
            slab = (slab + 1) % nslabs;
            cur = slabs + slab * SLAB_PAGES * PAGE;
            used = 0;
            nvh_protect_hold_open_(pool, &hold, cur, SLAB_PAGES * PAGE);
            r.slabs++;
        }
        char *rec = cur + used;
        used += RECORD;
        assert_int_equal(nvh_protect_open_(pool, rec, RECORD), NVH_OK);
        memset(rec, (int)(seed & 0xff), RECORD);
        /* the leaf slot */
        char *slot = leaf0 + (seed % LEAVES) * 2 * PAGE + ((seed >> 32) % (PAGE / 16)) * 16;
        assert_int_equal(nvh_unprotect(pool, slot, 16), NVH_OK);
        memcpy(slot, &seed, 8);
        memcpy(slot + 8, &r.ops, 8);
        assert_int_equal(nvh_protect(pool, slot, 16), NVH_OK);
        assert_int_equal(nvh_protect_close_(pool, rec, RECORD), NVH_OK);
        r.ops++;
    }
    nvh_protect_hold_close_(pool, &hold);
    r.passes = (now_ns() - start) / interval_ns + 1;
    r.s = pt_stats(pool);
    assert_int_equal(r.s.strays, 0);
    assert_int_equal(r.s.unbalanced, 0);
    /* idle from now on: every page read-only again within a few intervals,
     * by the service alone (no nvh_protect_sync) */
    unsigned wait_ms = (unsigned)(interval_ns / 1000000u) * 4u + 10000u;  /* loaded machine */
    for (unsigned i = 0; i < LEAVES; i += 7)
        assert_true(wait_writable(leaf0 + i * 2 * PAGE, 0, wait_ms));
    assert_true(wait_writable(cur, 0, wait_ms));
    assert_int_equal(pt_stats(pool).strays, 0);
    nvh_pool_close(pool);
    fprintf(stderr, "  churn %s interval %llu ms: %llu ops, %llu slabs, %llu passes, "
            "%llu stalled: %llu mprotect, %llu faults (%.5f per op), %llu deferred\n",
            flags & NVH_PROTECT_STRICT     ? "strict"
            : flags & NVH_PROTECT_NO_CACHE ? "no cache"
                                           : "cache",
            (unsigned long long)(interval_ns / 1000000u), (unsigned long long)r.ops,
            (unsigned long long)r.slabs, (unsigned long long)r.passes,
            (unsigned long long)r.stalls,
            (unsigned long long)r.s.mprotect_calls, (unsigned long long)r.s.faults_resolved,
            (double)(r.s.mprotect_calls + r.s.faults_resolved) / (double)r.ops,
            (unsigned long long)r.s.deferred);
    return r;
}

/* What a policy that keeps hot pages writable may spend: the first fault and
 * the final protect of every leaf page, a fault and a protect or two per
 * distinct slab (the slabs are reused round-robin, each one well within an
 * interval), per service pass up to half the leaves again, and for each
 * stall every leaf and the slab again (a protect and a fault each). A
 * policy that re-protects hot pages spends ~2 calls per leaf per pass,
 * stalled or not. */
static uint64_t churn_bound(const churn_result *r)
{
    uint64_t distinct = r->slabs < 64 ? r->slabs : 64;
    return 2 * LEAVES + 3 * distinct + (LEAVES / 2) * r->passes + (2 * LEAVES + 4) * r->stalls;
}

static void check_no_churn(uint64_t interval_ns, unsigned flags)
{
    churn_result r = churn_run(interval_ns, flags);
    assert_true(r.ops > 1000);
    uint64_t calls = r.s.mprotect_calls + r.s.faults_resolved;
    if (calls > churn_bound(&r))
        fprintf(stderr, "  CHURN: %llu calls > bound %llu\n", (unsigned long long)calls,
                (unsigned long long)churn_bound(&r));
    assert_true(calls <= churn_bound(&r));
}

/* without the window cache (NVH_PROTECT_NO_CACHE: every call updates the
 * shared count) */
static void test_no_churn_nocache_20ms(void **state)
{
    (void)state;
    check_no_churn(20000000, NVH_PROTECT_NO_CACHE);
}
static void test_no_churn_nocache_80ms(void **state)
{
    (void)state;
    check_no_churn(80000000, NVH_PROTECT_NO_CACHE);
}

/* the default: with the per-thread window cache */
static void test_no_churn_20ms(void **state)
{
    (void)state;
    check_no_churn(20000000, 0);
}
static void test_no_churn_80ms(void **state)
{
    (void)state;
    check_no_churn(80000000, 0);
}

/* The bound must be able to fail: with NVH_PROTECT_STRICT every pass
 * protects every leaf page (no window is open on it at that instant), and
 * each one faults again at its next use. Compared with the bound less its
 * stall allowance: strict churns in every pass the service makes, stalled
 * or not, while on a loaded machine the service itself makes fewer passes
 * than the run's length allows (passes is that length over the interval),
 * so strict's excess over the allowance per pass is not large enough to
 * also cover the stalls. */
static void test_strict_churns(void **state)
{
    (void)state;
    churn_result r = churn_run(20000000, NVH_PROTECT_STRICT);
    uint64_t calls = r.s.mprotect_calls + r.s.faults_resolved;
    r.stalls = 0;
    assert_true(calls > churn_bound(&r));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_churn_20ms),
        cmocka_unit_test(test_no_churn_80ms),
        cmocka_unit_test(test_no_churn_nocache_20ms),
        cmocka_unit_test(test_no_churn_nocache_80ms),
        cmocka_unit_test(test_strict_churns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
