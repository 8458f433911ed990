/* test_tx_mt.c — concurrent object transactions (TSan-clean):
 *   - bank: N accounts, T threads doing random transfers with nvh_tx_run,
 *     plus a reader thread summing all accounts in read-only transactions:
 *     the sum seen is always the total (no torn or inconsistent read) and the
 *     final total is preserved (no lost update);
 *   - hot object: every thread increments one counter: no lost update;
 *   - crashes at sampled points while 2 threads transfer (sim domain): after
 *     recovery the total is preserved and every transfer acknowledged before
 *     the crash survived (per-thread commit counters kept in the pool). */
#include "test_util.h"

/* LeakSanitizer: the allocator's named-reservation bookkeeping
 * (nvh_reserve_named's pending array, src/alloc/named.c) is reported leaked
 * after nvh_pool_close in this build; not this layer's memory, reported to
 * its owner. Every other leak still fails the test. */
#if defined(__SANITIZE_ADDRESS__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:nvh_reserve_named\n"; }
#endif

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>

#define LAYOUT "txmt"
#define MIB ((uint64_t)1 << 20)
#define NACCT 64
#define INIT 1000u

typedef struct bank {
    uint64_t acct[NACCT * 8];   /* one account per cache line: stride 8 */
    uint64_t done[16 * 8];      /* per-thread acknowledged transfers, stride 8 */
} bank;

/* Under TSan the crash images are taken with the workers paused between
 * transactions: building an image reads the live working copy, a race by
 * design (any mix of in-flight words is a possible crash state) that TSan
 * would report. Without TSan the images are taken mid-flight. */
#if defined(__SANITIZE_THREAD__)
#define PAUSE_FOR_IMAGES 1
#else
#define PAUSE_FOR_IMAGES 0
#endif
static _Atomic int g_pause, g_paused;

typedef struct worker {
    nvh_pool *pool;
    bank *b;
    unsigned id;
    unsigned iters;
    uint64_t rng;
    _Atomic uint64_t acked;
    _Atomic int *stop;
    int failures;
} worker;

typedef struct xfer { bank *b; unsigned from, to, id; uint64_t amount; } xfer;
static int transfer(nvh_pool *pool, void *arg)
{
    xfer *x = arg;
    uint64_t *f = nvh_tx_open_write(pool, &x->b->acct[x->from * 8], 8);
    if (!f) return nvh_errcode();
    uint64_t *t = nvh_tx_open_write(pool, &x->b->acct[x->to * 8], 8);
    if (!t) return nvh_errcode();
    uint64_t *d = nvh_tx_open_write(pool, &x->b->done[x->id * 8], 8);
    if (!d) return nvh_errcode();
    uint64_t amt = *f < x->amount ? *f : x->amount;
    *f -= amt;
    *t += amt;
    *d += 1;
    return NVH_OK;
}

static void *work(void *p)
{
    worker *w = p;
    for (unsigned i = 0; (w->iters == 0 || i < w->iters) && !atomic_load(w->stop); i++) {
        if (PAUSE_FOR_IMAGES && atomic_load(&g_pause)) {
            atomic_fetch_add(&g_paused, 1);
            while (atomic_load(&g_pause)) sched_yield();
            atomic_fetch_sub(&g_paused, 1);
        }
        xfer x = {w->b, (unsigned)(test_rand(&w->rng) % NACCT), 0, w->id, 1 + test_rand(&w->rng) % 50};
        do x.to = (unsigned)(test_rand(&w->rng) % NACCT); while (x.to == x.from);
        if (nvh_tx_run(w->pool, transfer, &x) != NVH_OK) {
            w->failures++;
            continue;
        }
        atomic_fetch_add(&w->acked, 1);
    }
    return NULL;
}

typedef struct sum_arg { bank *b; uint64_t sum; } sum_arg;
static int sum_all(nvh_pool *pool, void *arg)
{
    sum_arg *s = arg;
    s->sum = 0;
    for (unsigned i = 0; i < NACCT; i++) {
        const uint64_t *a = nvh_tx_open_read(pool, &s->b->acct[i * 8], 8);
        if (!a) return nvh_errcode();
        s->sum += __atomic_load_n(a, __ATOMIC_RELAXED);   /* read in place */
    }
    return NVH_OK;
}

typedef struct reader { nvh_pool *pool; bank *b; _Atomic int *stop; uint64_t sums, bad; } reader;
static void *read_loop(void *p)
{
    reader *r = p;
    while (!atomic_load(r->stop)) {
        sum_arg s = {r->b, 0};
        if (nvh_tx_run(r->pool, sum_all, &s) != NVH_OK) { r->bad++; continue; }
        r->sums++;
        if (s.sum != (uint64_t)NACCT * INIT) r->bad++;
    }
    return NULL;
}

static bank *bank_setup(nvh_pool *pool)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    bank *b = nvh_alloc(pool, sizeof *b, NULL, NULL, &root[0]);
    assert_non_null(b);
    for (unsigned i = 0; i < NACCT; i++) b->acct[i * 8] = INIT;
    nvh_persist(pool, b, sizeof *b);
    return b;
}

static uint64_t bank_total(const bank *b)
{
    uint64_t t = 0;
    for (unsigned i = 0; i < NACCT; i++) t += b->acct[i * 8];
    return t;
}

static void bank_threads(void **state)
{
    (void)state;
    const char *path = test_path("txmt");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    enum { T = 3 };
    _Atomic int stop = 0;
    worker w[T];
    pthread_t th[T], rt;
    reader rd = {pool, b, &stop, 0, 0};
    for (unsigned i = 0; i < T; i++) {
        w[i] = (worker){pool, b, i, 3000, 17 + i, 0, &stop, 0};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    pthread_create(&rt, NULL, read_loop, &rd);
    for (unsigned i = 0; i < T; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(rt, NULL);
    uint64_t acked = 0;
    for (unsigned i = 0; i < T; i++) {
        assert_int_equal(w[i].failures, 0);
        acked += atomic_load(&w[i].acked);
        assert_int_equal(b->done[i * 8], atomic_load(&w[i].acked));
    }
    assert_int_equal(acked, T * 3000u);
    assert_int_equal(bank_total(b), (uint64_t)NACCT * INIT);
    assert_int_equal(rd.bad, 0);
    nvh_tx_stats st;
    nvh_tx_stats_get(pool, &st);
    print_message("  %llu commits, %llu conflicts, %llu retries, %llu consistent sums\n",
                  (unsigned long long)st.commits, (unsigned long long)st.conflicts,
                  (unsigned long long)st.retries, (unsigned long long)rd.sums);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* and it all survived the close */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    b = nvh_ptr(pool, ((nvh_off_t *)nvh_root(pool, NULL))[0]);
    assert_int_equal(bank_total(b), (uint64_t)NACCT * INIT);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static int incr(nvh_pool *pool, void *arg)
{
    uint64_t *c = nvh_tx_open_write(pool, arg, 8);
    if (!c) return nvh_errcode();
    (*c)++;
    return NVH_OK;
}
typedef struct hot { nvh_pool *pool; uint64_t *ctr; unsigned n; int fails; } hot;
static void *hot_loop(void *p)
{
    hot *h = p;
    for (unsigned i = 0; i < h->n; i++)
        if (nvh_tx_run(h->pool, incr, h->ctr) != NVH_OK) h->fails++;
    return NULL;
}

static void hot_object(void **state)
{
    (void)state;
    const char *path = test_path("txhot");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *ctr = nvh_alloc(pool, 64, NULL, NULL, NULL);
    assert_non_null(ctr);
    enum { T = 4, N = 2000 };
    hot h[T];
    pthread_t th[T];
    for (unsigned i = 0; i < T; i++) {
        h[i] = (hot){pool, ctr, N, 0};
        pthread_create(&th[i], NULL, hot_loop, &h[i]);
    }
    for (unsigned i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(h[i].fails, 0);
    }
    assert_int_equal(*ctr, (uint64_t)T * N);
    nvh_tx_stats st;
    nvh_tx_stats_get(pool, &st);
    print_message("  hot counter: %llu commits, %llu conflicts\n", (unsigned long long)st.commits,
                  (unsigned long long)st.conflicts);
    /* bounded retries: a give-up is reported as NVH_E_ABORTED */
    nvh_tx_config c;
    nvh_tx_config_get(pool, &c);
    c.max_retries = 1;
    assert_int_equal(nvh_tx_config_set(pool, &c), NVH_OK);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);   /* hold the lock ourselves... */
    assert_non_null(nvh_tx_open_write(pool, ctr, 8));
    hot other = {pool, ctr, 1, 0};
    pthread_t t2;
    pthread_create(&t2, NULL, hot_loop, &other);     /* ...so the other thread gives up */
    pthread_join(t2, NULL);
    assert_int_equal(other.fails, 1);
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Crashes while two threads transfer (sim domain, sampled images)
 * ------------------------------------------------------------------------- */
static void concurrent_crashes(void **state)
{
    (void)state;
    const char *path = test_path("txmtcrash");
    /* small, so the pool grows while images are taken (nvh_sim_write_image
     * serialises with a grow, so every image is one a real crash can leave) */
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 2 * MIB, NVH_DOMAIN_SIM);
    assert_non_null(pool);
    bank *b = bank_setup(pool);
    enum { T = 2 };
    _Atomic int stop = 0;
    worker w[T];
    pthread_t th[T];
    for (unsigned i = 0; i < T; i++) {
        w[i] = (worker){pool, b, i, 0, 99 + i, 0, &stop, 0};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    unsigned checked = 0;
    for (unsigned k = 0; k < 24; k++) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        uint64_t before[T];
        if (PAUSE_FOR_IMAGES) {
            atomic_store(&g_pause, 1);
            while (atomic_load(&g_paused) < T) sched_yield();
        }
        for (unsigned i = 0; i < T; i++) before[i] = atomic_load(&w[i].acked);
        assert_int_equal(nvh_sim_write_image(pool, image, 1000 + k, k % 2 ? NVH_CRASH_WORDS
                                                                         : NVH_CRASH_LINES),
                         NVH_OK);
        atomic_store(&g_pause, 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            nvh_pool *p = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
            if (!p) {
                fprintf(stderr, "crash image %u does not open: %s\n", k, nvh_errormsg());
                _exit(2);
            }
            bank *rb = nvh_ptr(p, ((nvh_off_t *)nvh_root(p, NULL))[0]);
            if (bank_total(rb) != (uint64_t)NACCT * INIT) _exit(3);
            for (unsigned i = 0; i < T; i++)
                if (rb->done[i * 8] < before[i]) _exit(4);   /* acknowledged transfer lost */
            nvh_pool_close(p);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        checked++;
    }
    atomic_store(&stop, 1);
    for (unsigned i = 0; i < T; i++) pthread_join(th[i], NULL);
    print_message("  %u crash images checked, %llu + %llu transfers\n", checked,
                  (unsigned long long)atomic_load(&w[0].acked),
                  (unsigned long long)atomic_load(&w[1].acked));
    assert_int_equal(bank_total(b), (uint64_t)NACCT * INIT);
    unlink(image);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bank_threads),
        cmocka_unit_test(hot_object),
        cmocka_unit_test(concurrent_crashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
