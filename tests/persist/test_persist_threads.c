/* test_persist_threads.c — the persistence primitives are thread-safe: four
 * threads persisting (flush/drain, memcpy, memset) into disjoint ranges of
 * one pool, in every domain, each keeping its own expected counts; the
 * pool's counters must equal the exact sum, every thread's data must be in
 * place and survive close/reopen. Meant to be clean under TSan.
 *
 * In the sim domain a flush snapshots whole cache lines, so there the
 * threads' ranges are line-disjoint (two threads storing into one line while
 * one of them flushes it would be a data race in the simulator); elsewhere
 * neighbouring ranges deliberately share cache lines.
 *
 * Exact sums rely on the counters' stripes: each counting thread owns one of
 * NVH_STAT_STRIPES (16) stripes, handed out round robin, and updates it with
 * a plain load + store; a stripe is owned by one live thread at a time and
 * given back when the thread exits, so up to 16 concurrently counting
 * threads never share one. */
#include "persist_test_util.h"

#include <pthread.h>

#define THREADS 4

typedef struct worker {
    nvh_pool *pool;
    nvh_domain domain;
    unsigned char *region;        /* this thread's bytes              */
    size_t region_len;
    unsigned id;
    int iterations;
    uint64_t lines, fences, nt_bytes;   /* what this thread expects counted */
} worker;

static unsigned char pattern(unsigned id, size_t i) { return (unsigned char)(id * 67 + i * 13 + 1); }

static void *worker_main(void *arg)
{
    worker *w = arg;
    uint64_t rng = 1234 + w->id;
    unsigned char src[1024];
    for (int it = 0; it < w->iterations; it++) {
        size_t off = test_rand(&rng) % w->region_len;
        size_t len = test_rand(&rng) % (w->region_len - off + 1);
        if (len > sizeof src) len = sizeof src;
        unsigned char *dst = w->region + off;
        switch (test_rand(&rng) % 4) {
        case 0:
            for (size_t i = 0; i < len; i++) dst[i] = pattern(w->id, off + i);
            nvh_persist(w->pool, dst, len);
            w->fences++;
            break;
        case 1:
            for (size_t i = 0; i < len; i++) dst[i] = pattern(w->id, off + i);
            nvh_flush(w->pool, dst, len);
            if (it % 3 == 0) { nvh_drain(w->pool); w->fences++; }
            break;
        case 2:
            for (size_t i = 0; i < len; i++) src[i] = pattern(w->id, off + i);
            nvh_memcpy_persist(w->pool, dst, src, len);
            w->fences++;
            if (w->domain == NVH_DOMAIN_PMEM && len >= 256) w->nt_bytes += nt_body_bytes(dst, len);
            break;
        default:
            nvh_memset_persist(w->pool, dst, (int)w->id + 1, len);
            w->fences++;
            break;
        }
        w->lines += lines_spanned(dst, len);
    }
    /* finally the whole region, so its content is known */
    for (size_t i = 0; i < w->region_len; i++) w->region[i] = pattern(w->id, i);
    nvh_persist(w->pool, w->region, w->region_len);
    w->lines += lines_spanned(w->region, w->region_len);
    w->fences++;
    return NULL;
}

static void threads_in(nvh_domain domain)
{
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("threads", domain, 64 << 10, &work, &path);
    /* line-disjoint in sim (1024 = 16 lines), line-sharing elsewhere (1000) */
    size_t stride = domain == NVH_DOMAIN_SIM ? 1024 : 1000;
    int iterations = domain == NVH_DOMAIN_MSYNC ? 150 : 2000;
    worker w[THREADS];
    pthread_t tid[THREADS];
    for (unsigned t = 0; t < THREADS; t++) {
        w[t] = (worker){.pool = pool, .domain = domain, .region = (unsigned char *)work + t * stride,
                        .region_len = stride, .id = t, .iterations = iterations};
        assert_int_equal(pthread_create(&tid[t], NULL, worker_main, &w[t]), 0);
    }
    uint64_t lines = 0, fences = 0, nt = 0;
    for (unsigned t = 0; t < THREADS; t++) {
        assert_int_equal(pthread_join(tid[t], NULL), 0);
        lines += w[t].lines;
        fences += w[t].fences;
        nt += w[t].nt_bytes;
    }
    nvh_stats s = stats_now(pool);
    if (s.lines_flushed != lines || s.fences != fences || s.nt_bytes != nt)
        fail_msg("%s: counted lines %llu fences %llu nt %llu; threads expect %llu %llu %llu",
                 nvh_domain_name(domain), (unsigned long long)s.lines_flushed,
                 (unsigned long long)s.fences, (unsigned long long)s.nt_bytes,
                 (unsigned long long)lines, (unsigned long long)fences, (unsigned long long)nt);
    /* msync: a drain syncs whatever any thread recorded, so the count of
     * calls is not per thread; it is at least one and at most one per drain
     * times the range table size */
    if (domain == NVH_DOMAIN_MSYNC) assert_true(s.msyncs >= 1 && s.msyncs <= fences * 64);
    else assert_int_equal(s.msyncs, 0);
    if (domain == NVH_DOMAIN_SIM) assert_true(nvh_sim_fence_count(pool) >= fences);

    for (unsigned t = 0; t < THREADS; t++)
        for (size_t i = 0; i < stride; i++) assert_int_equal(w[t].region[i], pattern(t, i));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, "persist-test", domain);
    assert_non_null(pool);
    const unsigned char *back = nvh_root(pool, NULL);
    for (unsigned t = 0; t < THREADS; t++)
        for (size_t i = 0; i < stride; i++) assert_int_equal(back[t * stride + i], pattern(t, i));
    nvh_pool_close(pool);
    unlink(path);
}

static void threads_pmem(void **state) { (void)state; threads_in(NVH_DOMAIN_PMEM); }
static void threads_eadr(void **state) { (void)state; threads_in(NVH_DOMAIN_EADR); }
static void threads_msync(void **state) { (void)state; threads_in(NVH_DOMAIN_MSYNC); }
static void threads_process(void **state) { (void)state; threads_in(NVH_DOMAIN_PROCESS); }
static void threads_sim(void **state) { (void)state; threads_in(NVH_DOMAIN_SIM); }

/* Counters read while threads are adding to them never go backwards. */
typedef struct reader_arg {
    nvh_pool *pool;
    _Atomic int stop;
} reader_arg;

static void *reader_main(void *arg)
{
    reader_arg *r = arg;
    uint64_t last = 0;
    while (!atomic_load(&r->stop)) {
        nvh_stats s;
        nvh_stats_get(r->pool, &s);
        if (s.lines_flushed < last) return (void *)1;
        last = s.lines_flushed;
    }
    return NULL;
}

static void stats_read_concurrently(void **state)
{
    (void)state;
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("threads-read", NVH_DOMAIN_PROCESS, 64 << 10, &work, &path);
    reader_arg r = {.pool = pool};
    pthread_t reader;
    assert_int_equal(pthread_create(&reader, NULL, reader_main, &r), 0);
    worker w[THREADS];
    pthread_t tid[THREADS];
    for (unsigned t = 0; t < THREADS; t++) {
        w[t] = (worker){.pool = pool, .domain = NVH_DOMAIN_PROCESS,
                        .region = (unsigned char *)work + t * 4096, .region_len = 4096, .id = t,
                        .iterations = 5000};
        assert_int_equal(pthread_create(&tid[t], NULL, worker_main, &w[t]), 0);
    }
    uint64_t lines = 0;
    for (unsigned t = 0; t < THREADS; t++) {
        pthread_join(tid[t], NULL);
        lines += w[t].lines;
    }
    atomic_store(&r.stop, 1);
    void *bad;
    pthread_join(reader, &bad);
    assert_null(bad);
    assert_int_equal(stats_now(pool).lines_flushed, lines);
    nvh_pool_close(pool);
    unlink(path);
}

/* Stripes are owned by live threads only: after many threads have come and
 * gone, a new thread never gets the stripe of a thread that is still alive,
 * and live threads count exactly (with round-robin assignment the 17th
 * thread ever created shared the main thread's stripe and about half of the
 * concurrent counts were lost). Reads nvh_thread_stripe_, the internal
 * per-thread stripe index of nvheap.h (1-based, 0 = none yet). */
typedef struct hammer_arg {
    nvh_pool *pool;
    char *line;
    long count;
    pthread_barrier_t *all_counted; /* if set: wait here, so all are alive together */
    unsigned stripe;              /* out: the stripe this thread counted in */
} hammer_arg;

static void *hammer(void *arg)
{
    hammer_arg *h = arg;
    for (long i = 0; i < h->count; i++) nvh_flush(h->pool, h->line, 1);
    h->stripe = nvh_thread_stripe_;
    if (h->all_counted) pthread_barrier_wait(h->all_counted);
    return NULL;
}

static void stripes_reused_after_thread_exit(void **state)
{
    (void)state;
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("threads-stripes", NVH_DOMAIN_PROCESS, 64 << 10, &work, &path);
    hammer_arg once = {.pool = pool, .line = work, .count = 1};
    hammer(&once);                                  /* the main thread counts too */
    unsigned main_stripe = once.stripe;
    assert_true(main_stripe >= 1 && main_stripe <= NVH_STAT_STRIPES);
    for (int i = 0; i < 4 * NVH_STAT_STRIPES; i++) {   /* threads come and go */
        pthread_t t;
        hammer_arg a = once;
        assert_int_equal(pthread_create(&t, NULL, hammer, &a), 0);
        pthread_join(t, NULL);
        assert_true(a.stripe >= 1 && a.stripe <= NVH_STAT_STRIPES);
        if (a.stripe == main_stripe)
            fail_msg("thread %d got stripe %u, owned by the live main thread", i, a.stripe);
    }
    nvh_stats_reset(pool);
    enum { LIVE = 3, COUNT = 200000 };
    hammer_arg args[LIVE + 1];
    pthread_t tid[LIVE];
    pthread_barrier_t all_counted;
    pthread_barrier_init(&all_counted, NULL, LIVE + 1);
    for (int t = 0; t <= LIVE; t++)
        args[t] = (hammer_arg){.pool = pool, .line = work + 64 * t, .count = COUNT,
                               .all_counted = &all_counted};
    for (int t = 0; t < LIVE; t++)
        assert_int_equal(pthread_create(&tid[t], NULL, hammer, &args[t]), 0);
    hammer(&args[LIVE]);                            /* main, concurrently */
    for (int t = 0; t < LIVE; t++) pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&all_counted);
    /* all four were alive at the barrier, each holding its stripe */
    for (int a = 0; a <= LIVE; a++)
        for (int b = a + 1; b <= LIVE; b++) assert_int_not_equal(args[a].stripe, args[b].stripe);
    assert_int_equal(stats_now(pool).lines_flushed, (uint64_t)(LIVE + 1) * COUNT);
    nvh_pool_close(pool);
    unlink(path);
}

int main(void)
{
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_NT_THRESHOLD");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_pmem),
        cmocka_unit_test(threads_eadr),
        cmocka_unit_test(threads_msync),
        cmocka_unit_test(threads_process),
        cmocka_unit_test(threads_sim),
        cmocka_unit_test(stats_read_concurrently),
        cmocka_unit_test(stripes_reused_after_thread_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
