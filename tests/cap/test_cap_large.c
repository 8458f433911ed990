/* test_cap_large.c — the capacity allocator's large blocks (src/cap/large.c):
 * a thread heap keeps its freed large blocks and serves its next large
 * requests from them without the instance lock; a block another thread
 * took is kept by the thread that frees it; the file stays within its
 * bounds while threads trade large blocks and shrinks once they are all
 * freed. */
#include "cap_unit.h"

#include <pthread.h>
#include <time.h>

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* in (64 KiB, 1 MiB), each doubling as likely (about the large loop of
 * bench/run cap) */
static size_t large_size(uint64_t *s)
{
    size_t lo = ((size_t)64 << 10) << (rnd(s) % 4);
    return lo + 1 + (size_t)(rnd(s) % lo);
}

/* A heap that keeps a set of large blocks of mixed sizes and replaces a
 * random one at a time serves nearly every request from its own kept
 * blocks: the span allocator (each call under the instance lock) is called
 * for a few percent of the operations at most. */
static void test_large_churn_lock_free(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    enum { SLOTS = 100, WARM = 3000, OPS = 10000 };
    static unsigned char *slot[SLOTS];
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    uint64_t calls0 = 0;
    for (unsigned i = 0; i < WARM + OPS; i++) {
        if (i == WARM)
            calls0 = cap.span_calls;
        unsigned k = (unsigned)(rnd(&seed) % SLOTS);
        if (slot[k])
            assert_int_equal(nvh_cap_free_(&cap, slot[k]), CAP_OK);
        size_t sz = large_size(&seed);
        slot[k] = nvh_cap_alloc_(h, sz);
        assert_non_null(slot[k]);
        slot[k][0] = slot[k][sz - 1] = 1;
    }
    uint64_t calls = cap.span_calls - calls0;
    fprintf(stderr, "  large churn: %llu span-allocator calls in %u operations\n",
            (unsigned long long)calls, (unsigned)OPS);
    assert_true(calls * 50 <= OPS);   /* 2 % */
    for (unsigned k = 0; k < SLOTS; k++) {
        assert_int_equal(nvh_cap_free_(&cap, slot[k]), CAP_OK);
        slot[k] = NULL;
    }
    nvh_cap_trim_(&cap);
}

/* Large blocks another thread took are kept by the thread that frees them:
 * its next requests of those sizes get them again, with no call of the
 * span allocator. A second free of a kept block is a double free. (The
 * freeing thread holds 32 MiB of other large blocks: the allowance lets it
 * keep 16 MiB of freed ones.) */
enum { XN = 24 };
static unsigned char *xp[XN], *old[XN];
static size_t sz[XN];
static int xrc[XN + 1];
static uint64_t xcalls;

static void *free_them(void *arg)
{
    (void)arg;
    struct cap_heap *h = heap();
    void *ballast[8];
    for (unsigned i = 0; i < 8; i++)
        ballast[i] = nvh_cap_alloc_(h, (size_t)4 << 20);
    for (unsigned i = 0; i < XN; i++)
        xrc[i] = nvh_cap_free_(&cap, xp[i]);
    xrc[XN] = nvh_cap_free_(&cap, xp[0]);   /* again: kept by this thread */
    uint64_t calls0 = cap.span_calls;
    for (unsigned i = XN; i-- > 0;) {
        xp[i] = nvh_cap_alloc_(h, sz[i]);
        bool found = false;
        for (unsigned j = 0; j < XN; j++)
            found |= xp[i] == old[j];
        if (!found)
            xp[i] = NULL;
    }
    xcalls = cap.span_calls - calls0;
    for (unsigned i = 0; i < 8; i++)
        nvh_cap_free_(&cap, ballast[i]);
    return NULL;
}

static void test_large_xthread_kept_by_freer(void **state)
{
    (void)state;
    struct cap_heap *h = heap();
    nvh_cap_trim_(&cap);
    for (unsigned i = 0; i < XN; i++) {
        sz[i] = (size_t)(i % 8 + 1) * 100000;
        xp[i] = nvh_cap_alloc_(h, sz[i]);
        assert_non_null(xp[i]);
        xp[i][0] = xp[i][sz[i] - 1] = (unsigned char)i;
    }
    void *guard = nvh_cap_alloc_(h, 100000);   /* none of them at the top */
    memcpy(old, xp, sizeof old);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_them, NULL), 0);
    pthread_join(t, NULL);
    for (unsigned i = 0; i < XN; i++)
        assert_int_equal(xrc[i], CAP_OK);
    assert_int_equal(xrc[XN], CAP_DOUBLE);
    for (unsigned i = 0; i < XN; i++)
        assert_non_null(xp[i]);   /* each one of the blocks it freed */
    assert_int_equal(xcalls, 0);
    /* the blocks are in use (the exited thread's heap took them): free */
    assert_int_equal(nvh_cap_free_(&cap, xp[0]), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, xp[0]), CAP_DOUBLE);
    for (unsigned i = 1; i < XN; i++)
        assert_int_equal(nvh_cap_free_(&cap, xp[i]), CAP_OK);
    assert_int_equal(nvh_cap_free_(&cap, guard), CAP_OK);
    nvh_cap_trim_(&cap);
}

/* Two threads allocate large blocks (written whole), keep a set of their
 * own and swap others through shared slots, freeing what they take out (so
 * about half of those frees are of the other thread's blocks): at the
 * peak sample the file holds at most 1.5 times the most bytes the blocks
 * in use ever reached (the allowance's recent-peak bound) plus the
 * allowance's floor, and once everything is freed and the threads reach a
 * slow path two windows later, less than a tenth of its peak. */
enum { TSLOTS = 40, SHARED = 64, TOPS = 3000 };
static unsigned char *own[2][TSLOTS];
static _Atomic(unsigned char *) shared_slot[SHARED];
static _Atomic size_t tlive, tlive_peak;
static pthread_barrier_t bar;

static unsigned char *talloc(size_t sz)
{
    unsigned char *p = nvh_cap_alloc_(heap(), sz);
    assert_non_null(p);
    memset(p, 1, sz);
    size_t now = atomic_fetch_add(&tlive, nvh_cap_usable_(&cap, p)) + nvh_cap_usable_(&cap, p);
    size_t pk = atomic_load(&tlive_peak);
    while (now > pk && !atomic_compare_exchange_weak(&tlive_peak, &pk, now)) {
    }
    return p;
}

static void tfree(unsigned char *p)
{
    atomic_fetch_sub(&tlive, nvh_cap_usable_(&cap, p));
    assert_int_equal(nvh_cap_free_(&cap, p), CAP_OK);
}

static void *trade(void *arg)
{
    unsigned id = (unsigned)(uintptr_t)arg;
    uint64_t seed = 0x2545F4914F6CDD1Dull * (id + 1);
    for (unsigned i = 0; i < TOPS; i++) {
        unsigned k = (unsigned)(rnd(&seed) % TSLOTS);
        if (own[id][k])
            tfree(own[id][k]);
        own[id][k] = talloc(large_size(&seed));
        unsigned char *was = atomic_exchange(&shared_slot[rnd(&seed) % SHARED], talloc(large_size(&seed)));
        if (was)
            tfree(was);
    }
    /* both done: each takes the frees the other handed back since its last
     * large request (a large request takes them); then the peak sample */
    pthread_barrier_wait(&bar);
    nvh_cap_free_(&cap, nvh_cap_alloc_(heap(), (size_t)100 << 10));
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    for (unsigned k = 0; k < TSLOTS; k++)
        tfree(own[id][k]);
    return NULL;
}

static void test_large_trade_file(void **state)
{
    (void)state;
    pthread_barrier_init(&bar, NULL, 3);
    nvh_cap_trim_(&cap);
    struct nvh_cap_counters base, peak, end;
    nvh_cap_counters_(&cap, &base);
    pthread_t t[2];
    for (unsigned i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, trade, (void *)(uintptr_t)i), 0);
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    nvh_cap_counters_(&cap, &peak);
    size_t file = peak.file_bytes - base.file_bytes, most = atomic_load(&tlive_peak);
    fprintf(stderr, "  large trade: file %zu KiB, blocks in use %zu KiB, at most %zu KiB (%.2fx)\n",
            file >> 10, atomic_load(&tlive) >> 10, most >> 10, (double)file / (double)most);
    size_t floor = peak.span_peak / 20 + 2 * NVH_CAP_LKEEP_STEP;
    assert_true(file <= most + most / 2 + floor);
    pthread_barrier_wait(&bar);
    for (unsigned i = 0; i < 2; i++)
        pthread_join(t[i], NULL);   /* (exits: their heaps settle) */
    for (unsigned r = 0; r < SHARED; r++) {
        unsigned char *p = atomic_exchange(&shared_slot[r], NULL);
        if (p)
            tfree(p);   /* into the exited threads' heaps: orphans */
    }
    /* two windows on, a slow path gives back what this thread's heap kept */
    usleep(3 * NVH_CAP_DECAY_MS * 1000);
    nvh_cap_free_(&cap, nvh_cap_alloc_(heap(), (size_t)200 << 10));
    nvh_cap_counters_(&cap, &end);
    size_t left = end.file_bytes > base.file_bytes ? end.file_bytes - base.file_bytes : 0;
    fprintf(stderr, "  large trade: file %zu KiB at the end (peak %zu KiB)\n", left >> 10, file >> 10);
    assert_true(left < file / 10);
    pthread_barrier_destroy(&bar);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_churn_lock_free),
        cmocka_unit_test(test_large_xthread_kept_by_freer),
        cmocka_unit_test(test_large_trade_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
