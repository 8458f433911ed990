/* test_protect_basic.c — protection modes and windows in one thread: off is
 * free, sync and async make writes inside windows succeed and leave pages
 * read-only outside them, cancellation, coalescing, the fault path, eager
 * unprotects, implicit library windows, the stray callback, bad input,
 * grow/close/reopen with protection on, several pools, latency figures. */
#include "protect_test.h"

#define LONG_INTERVAL 500000000ull        /* 500 ms: no service pass in a test step */

/* ==========================================================================
 * Modes and windows
 * ========================================================================== */
static void test_off_is_noop(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("off", 4 * MIB);
    assert_non_null(pool);
    char *p = pt_page(pool, 0);
    assert_int_equal(nvh_protect_get_mode(pool), NVH_PROTECT_OFF);
    assert_int_equal(nvh_unprotect(pool, p, 100), NVH_OK);
    p[0] = 1;
    assert_int_equal(nvh_protect(pool, p, 100), NVH_OK);
    p[1] = 2;                                   /* still writable: off */
    assert_int_equal(pt_writable(p), 1);
    nvh_pool_close(pool);
}

static void check_window_mode(nvh_protect_mode mode)
{
    nvh_pool *pool = pt_pool(mode == NVH_PROTECT_SYNC ? "sync" : "async", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, mode, LONG_INTERVAL), NVH_OK);
    assert_int_equal(nvh_protect_get_mode(pool), mode);
    char *p = pt_page(pool, 3);
    assert_int_equal(pt_writable(p), 0);
    assert_int_equal(pt_writable(nvh_pool_base(pool)), 0);  /* superblock too */

    assert_int_equal(nvh_unprotect(pool, p + 10, 256), NVH_OK);
    memset(p + 10, 0xab, 256);                  /* async: faults, resolved */
    assert_int_equal(nvh_protect(pool, p + 10, 256), NVH_OK);
    nvh_protect_sync(pool);
    assert_int_equal(pt_writable(p), 0);
    assert_int_equal((unsigned char)p[10], 0xab);
    nvh_protect_stats s = pt_stats(pool);
    assert_int_equal(s.strays, 0);
    if (mode == NVH_PROTECT_ASYNC) assert_int_equal(s.faults_resolved, 1);
    else assert_int_equal(s.faults_resolved, 0);
    nvh_pool_close(pool);
}

static void test_sync_window(void **state) { (void)state; check_window_mode(NVH_PROTECT_SYNC); }
static void test_async_window(void **state) { (void)state; check_window_mode(NVH_PROTECT_ASYNC); }

/* Sync: one mprotect per transition, none for nested windows. */
static void test_sync_counts_calls(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("synccalls", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    char *p = pt_page(pool, 0);
    nvh_protect_stats_reset(pool);
    assert_int_equal(nvh_unprotect(pool, p, 8), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 1);
    assert_int_equal(pt_writable(p), 1);
    assert_int_equal(nvh_unprotect(pool, p + 100, 8), NVH_OK);   /* nested */
    assert_int_equal(nvh_protect(pool, p + 100, 8), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 1);
    assert_int_equal(pt_writable(p), 1);                         /* outer still open */
    assert_int_equal(nvh_protect(pool, p, 8), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 2);
    assert_int_equal(pt_writable(p), 0);
    /* a 16-page range is one call each way */
    char *q = pt_page(pool, 10);
    assert_int_equal(nvh_unprotect(pool, q, 16 * PAGE), NVH_OK);
    memset(q, 1, 16 * PAGE);
    assert_int_equal(nvh_protect(pool, q, 16 * PAGE), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 4);
    nvh_pool_close(pool);
}

/* Async: a protect/unprotect pair inside one interval cancels. */
static void test_async_pair_cancels(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("cancel", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, LONG_INTERVAL), NVH_OK);
    char *p = pt_page(pool, 0);
    nvh_protect_stats_reset(pool);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(nvh_unprotect(pool, p, 64), NVH_OK);
        assert_int_equal(nvh_protect(pool, p, 64), NVH_OK);
    }
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    nvh_protect_stats s = pt_stats(pool);
    assert_int_equal(s.mprotect_calls, 0);
    assert_int_equal(s.requests, 1);             /* the page was queued once */
    assert_true(s.cancelled >= 1);
    assert_int_equal(pt_writable(p), 0);
    nvh_pool_close(pool);
}

/* Async: N adjacent pages queued one by one become one mprotect each way. */
static void test_async_coalesces(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("coalesce", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, LONG_INTERVAL), NVH_OK);
    enum { N = 32 };
    nvh_protect_stats_reset(pool);
    for (int i = N - 1; i >= 0; i--)            /* reverse order: the pass sorts */
        assert_int_equal(nvh_unprotect(pool, pt_page(pool, (unsigned)i) + 8, 8), NVH_OK);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 1);
    for (int i = 0; i < N; i++) {
        assert_int_equal(pt_writable(pt_page(pool, (unsigned)i)), 1);
        pt_page(pool, (unsigned)i)[8] = (char)i;  /* no fault: applied */
    }
    assert_int_equal(pt_stats(pool).faults_resolved, 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(nvh_protect(pool, pt_page(pool, (unsigned)i) + 8, 8), NVH_OK);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    assert_int_equal(pt_stats(pool).mprotect_calls, 2);
    for (int i = 0; i < N; i++) assert_int_equal(pt_writable(pt_page(pool, (unsigned)i)), 0);
    nvh_pool_close(pool);
}

/* Async with a long interval: every first write to a queued page takes the
 * fault path, transparently, once per page. */
static void test_async_fault_path(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("faultpath", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, LONG_INTERVAL), NVH_OK);
    nvh_protect_stats_reset(pool);
    for (unsigned i = 0; i < 10; i++) {
        char *p = pt_page(pool, 2 * i);
        assert_int_equal(nvh_unprotect(pool, p, 128), NVH_OK);
        for (int k = 0; k < 128; k++) p[k] = (char)k;     /* one fault, then free */
    }
    nvh_protect_stats s = pt_stats(pool);
    assert_int_equal(s.faults_resolved, 10);
    assert_int_equal(s.strays, 0);
    for (unsigned i = 0; i < 10; i++)
        assert_int_equal(nvh_protect(pool, pt_page(pool, 2 * i), 128), NVH_OK);
    /* the pages stay writable until the pass; then read-only */
    assert_int_equal(pt_writable(pt_page(pool, 0)), 1);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    for (unsigned i = 0; i < 10; i++) assert_int_equal(pt_writable(pt_page(pool, 2 * i)), 0);
    nvh_pool_close(pool);
}

/* The service thread applies queued requests by itself within ~interval. */
static void test_async_service_applies(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("service", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 1000000), NVH_OK);   /* 1 ms */
    char *p = pt_page(pool, 0);
    assert_int_equal(nvh_unprotect(pool, p, 8), NVH_OK);
    for (int i = 0; i < 2000 && pt_writable(p) != 1; i++) usleep(1000);
    assert_int_equal(pt_writable(p), 1);
    p[0] = 7;
    assert_int_equal(pt_stats(pool).faults_resolved, 0);
    assert_int_equal(nvh_protect(pool, p, 8), NVH_OK);
    for (int i = 0; i < 2000 && pt_writable(p) != 0; i++) usleep(1000);
    assert_int_equal(pt_writable(p), 0);
    nvh_protect_latency lat;
    assert_int_equal(nvh_protect_latency_get(pool, 1, &lat), NVH_OK);
    assert_int_equal(lat.count, 1);
    assert_true(lat.p50_ns > 0 && lat.p50_ns < 2000000000ull);
    uint64_t up[8], cnt[8];
    assert_int_equal(nvh_protect_latency_buckets(pool, 1, up, cnt, 8), 1);
    assert_int_equal(cnt[0], 1);
    /* interval changes take effect */
    assert_int_equal(nvh_protect_set_interval(pool, 10000), NVH_OK);
    assert_int_equal(nvh_protect_set_interval(pool, 1), NVH_E_INVAL);
    nvh_pool_close(pool);
}

static void test_async_eager_unprotect(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("eager", 4 * MIB);
    assert_non_null(pool);
    nvh_protect_options o = {.mode = NVH_PROTECT_ASYNC, .interval_ns = LONG_INTERVAL,
                             .flags = NVH_PROTECT_EAGER_UNPROTECT};
    assert_int_equal(nvh_protect_configure(pool, &o), NVH_OK);
    char *p = pt_page(pool, 1);
    assert_int_equal(nvh_unprotect(pool, p, 8), NVH_OK);
    assert_int_equal(pt_writable(p), 1);         /* applied in the call */
    p[0] = 1;
    assert_int_equal(pt_stats(pool).faults_resolved, 0);
    assert_int_equal(nvh_protect(pool, p, 8), NVH_OK);
    assert_int_equal(pt_writable(p), 1);         /* the protect is queued */
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    assert_int_equal(pt_writable(p), 0);
    nvh_pool_close(pool);
}

/* A full ring: the producer applies the queue itself, nothing is lost. */
static void test_async_queue_full(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("full", 4 * MIB);
    assert_non_null(pool);
    nvh_protect_options o = {.mode = NVH_PROTECT_ASYNC, .interval_ns = LONG_INTERVAL,
                             .queue_slots = 64};
    assert_int_equal(nvh_protect_configure(pool, &o), NVH_OK);
    enum { N = 300 };
    for (unsigned i = 0; i < N; i++) {          /* every other page: no merging */
        char *p = pt_page(pool, 2 * i);
        assert_int_equal(nvh_unprotect(pool, p, 8), NVH_OK);
    }
    nvh_protect_stats s = pt_stats(pool);
    assert_true(s.queue_full >= 1);
    assert_int_equal(s.requests, N);
    for (unsigned i = 0; i < N; i++) pt_page(pool, 2 * i)[0] = 1;
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(nvh_protect(pool, pt_page(pool, 2 * i), 8), NVH_OK);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    for (unsigned i = 0; i < N; i++) assert_int_equal(pt_writable(pt_page(pool, 2 * i)), 0);
    assert_int_equal(pt_stats(pool).strays, 0);
    nvh_pool_close(pool);
}

/* Switching modes keeps the pages protected and the windows working. */
static void test_mode_switches(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("switch", 4 * MIB);
    assert_non_null(pool);
    char *p = pt_page(pool, 0);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    assert_int_equal(pt_writable(p), 0);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 2000000), NVH_OK);
    assert_int_equal(nvh_unprotect(pool, p, 8), NVH_OK);
    p[0] = 1;
    assert_int_equal(nvh_protect(pool, p, 8), NVH_OK);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    assert_int_equal(pt_writable(p), 0);         /* the queue was applied */
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_OFF, 0), NVH_OK);
    assert_int_equal(pt_writable(p), 1);
    p[1] = 1;
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 0), NVH_OK);
    assert_int_equal(pt_writable(p), 0);
    nvh_pool_close(pool);
}

/* ==========================================================================
 * Library windows, callback, bad input
 * ========================================================================== */
static void test_internal_window(void **state)
{
    (void)state;
    for (int mode = NVH_PROTECT_SYNC; mode <= NVH_PROTECT_ASYNC; mode++) {
        nvh_pool *pool = pt_pool("internal", 4 * MIB);
        assert_non_null(pool);
        assert_int_equal(nvh_protect_set_mode(pool, (nvh_protect_mode)mode, LONG_INTERVAL), NVH_OK);
        nvh_protect_stats_reset(pool);
        nvh_protect_internal_begin(pool);
        nvh_protect_internal_begin(pool);         /* nests */
        for (unsigned i = 0; i < 4; i++) pt_page(pool, i)[5] = 5;   /* no window: legal here */
        pt_page(pool, 0)[6] = 6;                  /* second store: no fault */
        nvh_protect_internal_end(pool);
        pt_page(pool, 0)[7] = 7;                  /* still inside the outer one */
        nvh_protect_internal_end(pool);
        nvh_protect_stats s = pt_stats(pool);
        assert_int_equal(s.internal_faults, 4);
        assert_int_equal(s.strays, 0);
        nvh_protect_sync(pool);
        for (unsigned i = 0; i < 4; i++) assert_int_equal(pt_writable(pt_page(pool, i)), 0);
        /* explicit internal windows are the counted ones */
        char *p = pt_page(pool, 8);
        assert_int_equal(nvh_protect_open_(pool, p, 16), NVH_OK);
        p[0] = 1;
        assert_int_equal(nvh_protect_close_(pool, p, 16), NVH_OK);
        nvh_protect_sync(pool);
        assert_int_equal(pt_writable(p), 0);
        nvh_pool_close(pool);
    }
}

/* More pages than an implicit window remembers: the rest are swept. */
static void test_internal_window_overflow(void **state)
{
    (void)state;
    for (int mode = NVH_PROTECT_SYNC; mode <= NVH_PROTECT_ASYNC; mode++) {
        nvh_pool *pool = pt_pool("overflow", 4 * MIB);
        assert_non_null(pool);
        assert_int_equal(nvh_protect_set_mode(pool, (nvh_protect_mode)mode, LONG_INTERVAL), NVH_OK);
        enum { N = 200 };
        nvh_protect_internal_begin(pool);
        for (unsigned i = 0; i < N; i++) pt_page(pool, i)[1] = 1;
        nvh_protect_internal_end(pool);
        nvh_protect_sync(pool);
        for (unsigned i = 0; i < N; i++) assert_int_equal(pt_writable(pt_page(pool, i)), 0);
        assert_int_equal(pt_stats(pool).strays, 0);
        assert_int_equal(pt_stats(pool).internal_faults, N);
        nvh_pool_close(pool);
    }
}

static _Atomic uint64_t seen_offset;
static _Atomic int seen_calls;
static nvh_stray_action allow_stray(const nvh_stray_info *info, void *arg)
{
    (void)arg;
    atomic_store(&seen_offset, info->offset);
    atomic_fetch_add(&seen_calls, 1);
    return NVH_STRAY_ALLOW;
}

static void test_stray_callback_allow(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("callback", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_stray_handler(pool, allow_stray, NULL), NVH_OK);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    char *p = pt_page(pool, 2) + 40;
    *p = 9;                                       /* stray: callback, allowed */
    assert_int_equal(atomic_load(&seen_calls), 1);
    assert_int_equal(atomic_load(&seen_offset), (uint64_t)(p - (char *)nvh_pool_base(pool)));
    assert_int_equal(*p, 9);
    assert_int_equal(pt_stats(pool).strays, 1);
    p[1] = 1;                                     /* the ALLOW window is open */
    assert_int_equal(atomic_load(&seen_calls), 1);
    assert_int_equal(nvh_protect(pool, p, 1), NVH_OK);      /* closes it */
    assert_int_equal(pt_writable(p), 0);
    nvh_pool_close(pool);
}

static void test_bad_input(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("bad", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(NULL, NVH_PROTECT_SYNC, 0), NVH_E_INVAL);
    assert_int_equal(nvh_protect_set_mode(pool, (nvh_protect_mode)7, 0), NVH_E_INVAL);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 5), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "interval"));
    nvh_protect_options o = {.mode = NVH_PROTECT_ASYNC, .flags = 0x80};
    assert_int_equal(nvh_protect_configure(pool, &o), NVH_E_INVAL);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    char local[8];
    assert_int_equal(nvh_unprotect(pool, local, 8), NVH_E_BADPTR);
    assert_int_equal(nvh_unprotect(NULL, local, 8), NVH_E_INVAL);
    char *p = pt_page(pool, 0);
    assert_int_equal(nvh_unprotect(pool, p, 0), NVH_OK);       /* len 0: no-op */
    assert_int_equal(nvh_protect(pool, p, 8), NVH_E_INVAL);     /* unbalanced */
    assert_non_null(strstr(nvh_errormsg(), "unbalanced"));
    assert_int_equal(pt_stats(pool).unbalanced, 1);
    assert_int_equal(pt_writable(p), 0);
    const char *path = test_path("bad-ro");
    nvh_pool *rw = nvh_pool_create(path, NULL, 4 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(rw);
    nvh_pool_close(rw);
    nvh_pool *ro = nvh_pool_open(path, NULL, NVH_OPEN_READONLY | NVH_DOMAIN_PROCESS);
    assert_non_null(ro);
    assert_int_equal(nvh_protect_set_mode(ro, NVH_PROTECT_SYNC, 0), NVH_E_READONLY);
    nvh_pool_close(ro);
    unlink(path);
    nvh_pool_close(pool);
}

/* ==========================================================================
 * Pool life cycle with protection on
 * ========================================================================== */
static void test_grow_close_reopen(void **state)
{
    (void)state;
    for (int mode = NVH_PROTECT_SYNC; mode <= NVH_PROTECT_ASYNC; mode++) {
        const char *path = test_path(mode == NVH_PROTECT_SYNC ? "grow-sync" : "grow-async");
        nvh_pool *pool = nvh_pool_create(path, "protect", 2 * MIB, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        assert_int_equal(nvh_protect_set_mode(pool, (nvh_protect_mode)mode, 1000000), NVH_OK);
        char *base = nvh_pool_base(pool);
        assert_int_equal(nvh_pool_grow(pool, 4 * MIB), NVH_OK);  /* superblock written */
        char *tail = base + 3 * MIB;
        assert_int_equal(pt_writable(tail), 0);                   /* new pages protected */
        nvh_protect_sync(pool);          /* async: the superblock window's protect is queued */
        assert_int_equal(pt_writable(base), 0);
        assert_int_equal(nvh_unprotect(pool, tail, 64), NVH_OK);
        memcpy(tail, "grown", 6);
        assert_int_equal(nvh_protect(pool, tail, 64), NVH_OK);
        uint64_t epoch = nvh_pool_epoch(pool);
        assert_int_equal(pt_stats(pool).strays, 0);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);          /* writes the superblock */
        pool = nvh_pool_open(path, "protect", NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_size(pool), 4 * MIB);
        assert_int_equal(nvh_pool_epoch(pool), epoch + 1);
        assert_string_equal((char *)nvh_pool_base(pool) + 3 * MIB, "grown");
        assert_int_equal(nvh_protect_get_mode(pool), NVH_PROTECT_OFF);
        nvh_pool_close(pool);
        unlink(path);
    }
}

static void test_several_pools(void **state)
{
    (void)state;
    enum { N = 4 };
    nvh_pool *pools[N];
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "multi%d", i);
        pools[i] = pt_pool(name, 2 * MIB);
        assert_non_null(pools[i]);
        assert_int_equal(nvh_protect_set_mode(pools[i], i % 2 ? NVH_PROTECT_ASYNC : NVH_PROTECT_SYNC,
                                              LONG_INTERVAL), NVH_OK);
        assert_int_equal(nvh_protect_set_stray_handler(pools[i], allow_stray, NULL), NVH_OK);
    }
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < N; i++) {
            char *p = pt_page(pools[i], (unsigned)round);
            assert_int_equal(nvh_unprotect(pools[i], p, 32), NVH_OK);
            memset(p, i, 32);
            assert_int_equal(nvh_protect(pools[i], p, 32), NVH_OK);
        }
    for (int i = 0; i < N; i++) {
        nvh_protect_sync(pools[i]);
        assert_int_equal(pt_stats(pools[i]).strays, 0);
        assert_int_equal(pt_writable(pt_page(pools[i], 0)), 0);
    }
    /* a stray into pool 2 is reported for pool 2 only */
    atomic_store(&seen_calls, 0);
    pt_page(pools[2], 5)[0] = 1;
    assert_int_equal(atomic_load(&seen_calls), 1);
    assert_int_equal(pt_stats(pools[2]).strays, 1);
    assert_int_equal(pt_stats(pools[1]).strays, 0);
    assert_int_equal(nvh_protect(pools[2], pt_page(pools[2], 5), 1), NVH_OK);
    /* closing one keeps the others protected */
    nvh_pool_close(pools[0]);
    assert_int_equal(pt_writable(pt_page(pools[1], 0)), 0);
    for (int i = 1; i < N; i++) nvh_pool_close(pools[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_is_noop),
        cmocka_unit_test(test_sync_window),
        cmocka_unit_test(test_async_window),
        cmocka_unit_test(test_sync_counts_calls),
        cmocka_unit_test(test_async_pair_cancels),
        cmocka_unit_test(test_async_coalesces),
        cmocka_unit_test(test_async_fault_path),
        cmocka_unit_test(test_async_service_applies),
        cmocka_unit_test(test_async_eager_unprotect),
        cmocka_unit_test(test_async_queue_full),
        cmocka_unit_test(test_mode_switches),
        cmocka_unit_test(test_internal_window),
        cmocka_unit_test(test_internal_window_overflow),
        cmocka_unit_test(test_stray_callback_allow),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_grow_close_reopen),
        cmocka_unit_test(test_several_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
