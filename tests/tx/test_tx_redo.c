/* test_tx_redo.c — one-fence word transactions (nvh_tx_write_word, redo
 * lines of log format 3; docs/TX.md "One-fence word transactions"):
 *   - the API: buffered values, read-your-writes, abort drops them, errors,
 *     the fallback to the two-fence protocol when mixed with add_range, too
 *     many words, or a version 2 directory;
 *   - exact costs: 1 fence and 2 lines for one word, 1 fence and 3 lines for
 *     two (the redo line, the words);
 *   - a crash at EVERY fence of a run mixing one-fence transactions of 1, 2,
 *     5 and 8 words with undo transactions, fallbacks, aborts and
 *     non-transactional stores after nvh_tx_quiesce, in line and word mode;
 *     negative control: with the replay of redo lines switched off at
 *     recovery the same exploration must find failures;
 *   - a crash at every fence of a hand-over between two lanes (lane A
 *     commits and goes idle, lane B overwrites the word and keeps going):
 *     negative control without B's help for A's pending transaction;
 *   - two threads (TSan): private words and a shared word under a mutex;
 *   - the lane filter's precision: words 64 KiB apart in one 1 MiB granule
 *     do not make one lane read another's pending entries, words of one
 *     64 KiB granule do. */
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:nvh_reserve_named\n"; }
#endif

#include "log/log.h"
#include "tx_crash_test.h"
#include "tx_word_model.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/mman.h>

#define LAYOUT "txredo"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SAN 1
#else
#define SAN 0
#endif

static volatile int g_no_replay_in_checker;

/* ---------------------------------------------------------------------------
 * Workload: kinds of transactions on a few words (so that they overlap)
 * ------------------------------------------------------------------------- */
enum { T_REDO, T_UNDO, T_MIXED, T_ABORT, T_MANY, T_QUIESCE_STORE };

static int one(nvh_pool *pool, uint64_t *reg, uint64_t *rng, int kind, unsigned nwords)
{
    model_begin();
    if (kind == T_QUIESCE_STORE) {
        /* a non-transactional store after nvh_tx_quiesce (the documented rule) */
        unsigned w = (unsigned)(test_rand(rng) % 8);
        if (nvh_tx_quiesce(pool) != NVH_OK) return -1;
        reg[w] = test_rand(rng);
        exp_next[w] = reg[w];
        nvh_persist(pool, &reg[w], 8);
        model_ack();
        return 0;
    }
    if (nvh_tx_begin(pool) != NVH_OK) return -1;
    if (kind == T_MANY) nwords = NVH_REDO_MAX + 1;
    for (unsigned i = 0; i < nwords; i++) {
        unsigned w = (unsigned)(test_rand(rng) % 8);
        if (kind == T_MANY) w = i;
        uint64_t v = test_rand(rng);
        if (kind == T_UNDO) {
            if (nvh_tx_add_word(pool, &reg[w]) != NVH_OK) return -1;
            reg[w] = v;
        } else {
            /* read-your-writes through nvh_tx_read_word */
            uint64_t old = nvh_tx_read_word(pool, &reg[w]);
            if (old != exp_next[w]) return -2;
            if (nvh_tx_write_word(pool, &reg[w], v) != NVH_OK) return -1;
            if (nvh_tx_read_word(pool, &reg[w]) != v) return -3;
            if (reg[w] != exp_prev[w]) return -4;          /* not in place yet */
        }
        exp_next[w] = v;
    }
    if (kind == T_MIXED) {
        unsigned w = 8 + (unsigned)(test_rand(rng) % 8);
        if (nvh_tx_add_range(pool, &reg[w], 8) != NVH_OK) return -1;
        reg[w] = exp_next[w] = test_rand(rng);
    }
    if (kind == T_ABORT) {
        if (nvh_tx_abort(pool) != NVH_OK) return -1;
        g_inflight = 0;
        return memcmp(reg, exp_prev, REG) == 0 ? 0 : -5;
    }
    if (nvh_tx_commit(pool) != NVH_OK) return -1;
    model_ack();
    return memcmp(reg, exp_prev, REG) == 0 ? 0 : -6;
}

static int seq_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    uint64_t rng = 42;
    static const struct { int kind; unsigned n; } steps[] = {
        {T_REDO, 1}, {T_REDO, 1}, {T_REDO, 2}, {T_UNDO, 1}, {T_REDO, 1}, {T_REDO, 5},
        {T_MIXED, 1}, {T_REDO, 2}, {T_ABORT, 2}, {T_REDO, 8}, {T_UNDO, 2}, {T_UNDO, 1},
        {T_REDO, 1}, {T_MANY, 0}, {T_REDO, 2}, {T_QUIESCE_STORE, 0}, {T_REDO, 1},
        {T_REDO, 2}, {T_REDO, 1},
    };
    for (unsigned i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int rc = one(pool, reg, &rng, steps[i].kind, steps[i].n);
        if (rc != 0) { fprintf(stderr, "step %u: %d (%s)\n", i, rc, nvh_errormsg()); return 2; }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Checker
 * ------------------------------------------------------------------------- */
static int check_pool(nvh_pool *pool, const nvh_crash_point *pt)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    if (!root[0]) return g_acked ? complain(pt, 4, "region lost", (long)g_acked, 0) : 0;
    uint64_t *reg = nvh_ptr(pool, root[0]);
    int rc = tx_region_check(pt, reg, exp_prev, exp_next, REG, g_inflight, g_acked);
    if (rc) return rc;
    /* the recovered pool takes new transactions of both kinds */
    if (nvh_tx_begin(pool) != NVH_OK || nvh_tx_write_word(pool, &reg[NW - 1], 77) != NVH_OK ||
        nvh_tx_commit(pool) != NVH_OK || reg[NW - 1] != 77)
        return complain(pt, 9, "no one-fence transaction after recovery", nvh_errcode(), 0);
    if (nvh_tx_begin(pool) != NVH_OK || nvh_tx_add_word(pool, &reg[NW - 2]) != NVH_OK)
        return complain(pt, 9, "no transaction after recovery", nvh_errcode(), 0);
    reg[NW - 2] ^= 1;
    if (nvh_tx_commit(pool) != NVH_OK) return complain(pt, 9, "commit after recovery", 0, 0);
    return 0;
}

static int tx_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_txlog_test_no_redo_replay_ = g_no_replay_in_checker;
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
 * Hand-over between lanes: A writes X (one fence) and stays idle; B
 * overwrites X and runs more transactions that reuse its redo slots
 * ------------------------------------------------------------------------- */
typedef struct lane_a {
    nvh_pool *pool;
    uint64_t *reg;
    int a_undo;                 /* A writes X with an undo transaction       */
    int a_ahead;                /* A runs several transactions first (its
                                   clock runs ahead of B's)                  */
    int a_after;                /* A writes another word after X (X's
                                   transaction is then A's older pending one) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;                  /* 1 committed, 2 may exit */
    int rc;
} lane_a;

static void *lane_a_run(void *p)
{
    lane_a *a = p;
    int rc = NVH_OK;
    for (unsigned i = 0; a->a_ahead && i < 6 && rc == NVH_OK; i++) {
        model_begin();
        exp_next[20 + i] = i + 1;
        rc = nvh_tx_begin(a->pool);
        if (a->a_undo) {
            if (rc == NVH_OK) rc = nvh_tx_add_word(a->pool, &a->reg[20 + i]);
            a->reg[20 + i] = i + 1;
        } else if (rc == NVH_OK) {
            rc = nvh_tx_write_word(a->pool, &a->reg[20 + i], i + 1);
        }
        if (rc == NVH_OK) rc = nvh_tx_commit(a->pool);
        model_ack();
    }
    model_begin();
    exp_next[0] = 0xA0A0;
    if (rc == NVH_OK) rc = nvh_tx_begin(a->pool);
    if (a->a_undo) {
        if (rc == NVH_OK) rc = nvh_tx_add_word(a->pool, &a->reg[0]);
        a->reg[0] = 0xA0A0;
    } else if (rc == NVH_OK) {
        rc = nvh_tx_write_word(a->pool, &a->reg[0], 0xA0A0);
    }
    if (rc == NVH_OK) rc = nvh_tx_commit(a->pool);
    model_ack();
    if (a->a_after && rc == NVH_OK) {
        model_begin();
        exp_next[30] = 0xB0B0;
        rc = nvh_tx_begin(a->pool);
        if (rc == NVH_OK) rc = nvh_tx_write_word(a->pool, &a->reg[30], 0xB0B0);
        if (rc == NVH_OK) rc = nvh_tx_commit(a->pool);
        model_ack();
    }
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->phase = 1;
    pthread_cond_broadcast(&a->cv);
    while (a->phase != 2) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* arg: 0 A one-fence, B one-fence; 1 A one-fence, B undo; 2 A undo, B
 * one-fence; 3 as 0 with A's clock ahead of B's; 4 as 0 with one more
 * transaction of A after X's (B overwrites A's older pending one) */
static int handover_workload(nvh_pool *pool, void *arg)
{
    int mode = *(int *)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    /* B's lane exists (and is not lane A's) before A starts */
    if (nvh_tx_begin(pool) != NVH_OK || nvh_tx_write_word(pool, &reg[5], 5) != NVH_OK)
        return 1;
    model_begin();
    exp_next[5] = 5;
    if (nvh_tx_commit(pool) != NVH_OK) return 1;
    model_ack();
    lane_a a = {.pool = pool, .reg = reg, .a_undo = mode == 2, .a_ahead = mode == 2 || mode == 3,
                .a_after = mode == 4};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, lane_a_run, &a) != 0) return 2;
    pthread_mutex_lock(&a.mu);
    while (a.phase != 1) pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    int rc = a.rc == NVH_OK ? 0 : 3;
    /* B: X := B's value, then transactions on other words */
    uint64_t rng = 9;
    for (unsigned i = 0; i < 6 && rc == 0; i++) {
        unsigned w = i == 0 ? 0 : 1 + (unsigned)(test_rand(&rng) % 4);
        uint64_t v = test_rand(&rng);
        model_begin();
        exp_next[w] = v;
        if (nvh_tx_begin(pool) != NVH_OK) rc = 4;
        if (mode == 1 && i == 0) {
            if (nvh_tx_add_word(pool, &reg[w]) != NVH_OK) rc = 4;
            reg[w] = v;
        } else if (nvh_tx_write_word(pool, &reg[w], v) != NVH_OK) {
            rc = 4;
        }
        if (nvh_tx_commit(pool) != NVH_OK) rc = 4;
        if (!rc) model_ack();
    }
    pthread_mutex_lock(&a.mu);
    a.phase = 2;
    pthread_cond_broadcast(&a.cv);
    pthread_mutex_unlock(&a.mu);
    pthread_join(th, NULL);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Driver
 * ------------------------------------------------------------------------- */
static const char *fresh_pool(void) { return tx_fresh_pool("txredo", LAYOUT); }

static nvh_crash_report explore_arg(nvh_crash_workload_fn w, void *arg, nvh_crash_mode mode,
                                    uint64_t budget, unsigned images)
{
    const char *path = fresh_pool();
    *g_complaints = 0;
    memset(exp_prev, 0, REG);
    memset(exp_next, 0, REG);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = w, .check = tx_check, .arg = arg,
        .seed = 7, .mode = mode, .budget = budget, .images_per_point = images,
        .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    print_message("  %llu fences, %llu crash images checked, %llu failures\n",
                  (unsigned long long)rep.fences, (unsigned long long)rep.points_tested,
                  (unsigned long long)rep.failures);
    assert_int_equal(rep.workload_status, 0);
    unlink(path);
    return rep;
}
static nvh_crash_report explore(nvh_crash_workload_fn w, nvh_crash_mode mode, unsigned images)
{
    static int zero;
    return explore_arg(w, &zero, mode, 0, images);
}

static void api(void **state)
{
    (void)state;
    const char *path = fresh_pool();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *reg = region(pool);
    assert_non_null(reg);
    uint64_t local = 0;
    assert_int_equal(nvh_tx_write_word(pool, &reg[0], 1), NVH_E_INVAL);   /* no tx */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, (char *)&reg[0] + 4, 1), NVH_E_INVAL);
    assert_int_equal(nvh_tx_write_word(pool, &reg[0], 9), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &local, 1), NVH_E_BADPTR);   /* aborts */
    assert_int_equal(nvh_tx_commit(pool), NVH_E_ABORTED);
    assert_int_equal(reg[0], 0);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[0], 11), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[0], 12), NVH_OK);        /* replaces */
    assert_int_equal(nvh_tx_read_word(pool, &reg[0]), 12);
    assert_int_equal(reg[0], 0);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(reg[0], 12);
    /* abort drops the values */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[0], 13), NVH_OK);
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(reg[0], 12);
    /* nesting: the outermost commit applies */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[1], 21), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(reg[1], 0);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(reg[1], 21);
    /* an aborted transaction rejects writes */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[1], 22), NVH_OK);
    assert_int_equal(nvh_tx_abort(pool), NVH_OK);
    assert_int_equal(reg[1], 21);
    /* mixed with add_range and with an allocation (two-fence fallback);
     * the buffered value wins over an in-place store to the same word */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[2], 31), NVH_OK);
    assert_int_equal(nvh_tx_add_range(pool, &reg[3], 16), NVH_OK);
    reg[3] = 41;
    reg[4] = 42;
    assert_int_equal(nvh_tx_add_word(pool, &reg[2]), NVH_OK);
    reg[2] = 99;
    assert_non_null(nvh_tx_alloc(pool, 64));
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    assert_int_equal(reg[2], 31);
    assert_int_equal(reg[3], 41);
    assert_int_equal(reg[4], 42);
    /* more words than one-fence redo lines hold: fallback */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    for (unsigned i = 0; i < 20; i++) assert_int_equal(nvh_tx_write_word(pool, &reg[8 + i], i + 1), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    for (unsigned i = 0; i < 20; i++) assert_int_equal(reg[8 + i], i + 1);
    assert_int_equal(nvh_tx_quiesce(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* reopen: nothing replayed over the final values */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    reg = region(pool);
    assert_int_equal(reg[0], 12);
    assert_int_equal(reg[2], 31);
    assert_int_equal(reg[27], 20);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* exact costs in the pmem domain */
static void costs(void **state)
{
    (void)state;
    const char *path = test_path("txredo-pmem");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 4u << 20, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    uint64_t *reg = region(pool);
    nvh_stats s;
    for (unsigned k = 0; k < 3; k++) {       /* warm: directory, lane, a pending tx */
        assert_int_equal(nvh_tx_begin(pool), NVH_OK);
        assert_int_equal(nvh_tx_write_word(pool, &reg[k], k), NVH_OK);
        assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    }
    nvh_stats_reset(pool);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[5], nvh_tx_read_word(pool, &reg[5]) + 1), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_stats_get(pool, &s);
    print_message("one-word one-fence tx: %llu lines, %llu fences\n",
                  (unsigned long long)s.lines_flushed, (unsigned long long)s.fences);
    assert_int_equal(s.fences, 1);
    assert_int_equal(s.lines_flushed, 2);   /* the redo line, the word */
    nvh_stats_reset(pool);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    uint64_t a = nvh_tx_read_word(pool, &reg[16]), b = nvh_tx_read_word(pool, &reg[32]);
    assert_int_equal(nvh_tx_write_word(pool, &reg[16], b), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, &reg[32], a), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_stats_get(pool, &s);
    print_message("two-word swap: %llu lines, %llu fences\n",
                  (unsigned long long)s.lines_flushed, (unsigned long long)s.fences);
    assert_int_equal(s.fences, 1);
    assert_int_equal(s.lines_flushed, 3);
    /* A one-fence OBJECT commit leaves no write-back in flight when it
     * returns: its words are flushed just before the lane's next fence
     * (record.c, flush_own_pending), because a CLWB still in flight makes
     * the thread's next LOCKed instruction — the next object open's
     * ownership-record CAS — wait for it like a fence. So a one-object
     * transaction after a two-object one flushes 3 lines (its redo line and
     * the previous two words), not 2 (its redo line and its own word, the
     * count with the flush at the commit: test hook). */
    for (int at_commit = 0; at_commit < 2; at_commit++) {
        nvh_txlog_test_flush_at_commit_ = at_commit;
        for (unsigned k = 0; k < 3; k++) {
            nvh_stats_reset(pool);
            assert_int_equal(nvh_tx_begin(pool), NVH_OK);
            unsigned nobj = k == 2 ? 1 : 2;
            for (unsigned j = 0; j < nobj; j++) {
                uint64_t *w = nvh_tx_open_write(pool, &reg[64 + 16 * j], 8);
                assert_non_null(w);
                (*w)++;
            }
            assert_int_equal(nvh_tx_commit(pool), NVH_OK);
        }
        nvh_stats_get(pool, &s);
        print_message("one object after two, words flushed %s: %llu lines, %llu fences\n",
                      at_commit ? "at the commit" : "before the next fence",
                      (unsigned long long)s.lines_flushed, (unsigned long long)s.fences);
        assert_int_equal(s.fences, 1);
        assert_int_equal(s.lines_flushed, at_commit ? 2 : 3);
    }
    nvh_txlog_test_flush_at_commit_ = 0;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void every_fence(void **state)
{
    (void)state;
    g_no_replay_in_checker = g_complaints_quiet = 0;
    nvh_crash_report r = explore(seq_workload, NVH_CRASH_LINES, SAN ? 1 : 2);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
    r = explore(seq_workload, NVH_CRASH_WORDS, SAN ? 1 : 3);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
}

/* negative control: recovery without the redo lines must lose commits */
static void every_fence_no_replay_fails(void **state)
{
    (void)state;
    g_no_replay_in_checker = g_complaints_quiet = 1;
    nvh_crash_report r = explore(seq_workload, NVH_CRASH_LINES, 2);
    g_no_replay_in_checker = g_complaints_quiet = 0;
    print_message("  without redo replay: %llu failures (must be > 0)\n",
                  (unsigned long long)r.failures);
    assert_true(r.failures > 0);
}

static void handover(void **state)
{
    (void)state;
    for (int mode = 0; mode < 5; mode++) {
        nvh_crash_report r = explore_arg(handover_workload, &mode, NVH_CRASH_LINES, 0, SAN ? 2 : 4);
        if (r.failures) nvh_crash_report_print(&r, stderr);
        assert_int_equal(r.failures, 0);
        r = explore_arg(handover_workload, &mode, NVH_CRASH_WORDS, 0, SAN ? 1 : 4);
        if (r.failures) nvh_crash_report_print(&r, stderr);
        assert_int_equal(r.failures, 0);
    }
}

/* negative controls: without B's help for A's pending transaction (modes
 * 0, 1: A's stale values are replayed over B's), or with the help but
 * without B learning A's commit order (mode 3: A's clock is ahead, both are
 * replayed during B's next fence, in the wrong order) */
static void handover_no_help_fails(void **state)
{
    (void)state;
    g_no_replay_in_checker = g_complaints_quiet = 0;
    for (int mode = 0; mode < 5; mode += mode == 1 ? 3 : 1) {   /* 0, 1, 4 */
        nvh_txlog_test_no_pending_help_ = 1;
        nvh_crash_report r = explore_arg(handover_workload, &mode, NVH_CRASH_LINES, 0, 8);
        nvh_txlog_test_no_pending_help_ = 0;
        print_message("  mode %d without help: %llu failures (must be > 0)\n", mode,
                      (unsigned long long)r.failures);
        assert_true(r.failures > 0);
    }
    /* the lane filter: a lane that does not publish its records' bits is
     * skipped by the other lanes' fences, which is no help at all (the
     * three modes that fail without help: B one-fence, B undo, and B
     * overwriting A's older pending transaction) */
    for (int mode = 0; mode < 5; mode += mode == 1 ? 3 : 1) {   /* 0, 1, 4 */
        nvh_txlog_test_no_filter_publish_ = 1;
        nvh_crash_report r = explore_arg(handover_workload, &mode, NVH_CRASH_LINES, 0, 8);
        nvh_txlog_test_no_filter_publish_ = 0;
        print_message("  mode %d without the filter bits: %llu failures (must be > 0)\n", mode,
                      (unsigned long long)r.failures);
        assert_true(r.failures > 0);
    }
    int mode = 3;
    nvh_txlog_test_no_learn_ = 1;
    nvh_crash_report r = explore_arg(handover_workload, &mode, NVH_CRASH_LINES, 0, 8);
    nvh_txlog_test_no_learn_ = 0;
    print_message("  mode 3 without learning the order: %llu failures (must be > 0)\n",
                  (unsigned long long)r.failures);
    assert_true(r.failures > 0);
}

/* long random runs, sampled crash points */
static int random_workload(nvh_pool *pool, void *arg)
{
    uint64_t rng = *(uint64_t *)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    static const int kinds[] = {T_REDO, T_REDO, T_REDO, T_REDO, T_UNDO, T_UNDO, T_MIXED,
                                T_ABORT, T_MANY, T_QUIESCE_STORE};
    for (unsigned k = 0; k < 300; k++) {
        int kind = kinds[test_rand(&rng) % (sizeof kinds / sizeof kinds[0])];
        unsigned n = 1 + (unsigned)(test_rand(&rng) % (test_rand(&rng) & 1 ? 2 : NVH_REDO_MAX));
        int rc = one(pool, reg, &rng, kind, n);
        if (rc != 0) { fprintf(stderr, "tx %u: %d (%s)\n", k, rc, nvh_errormsg()); return 2; }
    }
    return 0;
}

static void random_sampled(void **state)
{
    (void)state;
    uint64_t seeds[] = {3, 11, 2024};
    for (unsigned i = 0; i < 3; i++) {
        nvh_crash_report r = explore_arg(random_workload, &seeds[i],
                                         i & 1 ? NVH_CRASH_WORDS : NVH_CRASH_LINES,
                                         SAN ? 30 : 150, 2);
        if (r.failures) nvh_crash_report_print(&r, stderr);
        assert_int_equal(r.failures, 0);
    }
}

/* two threads: private words, and a shared counter under a mutex */
typedef struct mt_arg {
    nvh_pool *pool;
    uint64_t *reg;
    pthread_mutex_t *mu;
    unsigned id;
    int rc;
} mt_arg;

static void *mt_run(void *p)
{
    mt_arg *m = p;
    for (unsigned i = 0; i < (SAN ? 300u : 3000u) && !m->rc; i++) {
        uint64_t *mine = &m->reg[8 + m->id * 8 + i % 4];
        if (nvh_tx_begin(m->pool) != NVH_OK) { m->rc = 1; break; }
        nvh_tx_write_word(m->pool, mine, nvh_tx_read_word(m->pool, mine) + 1);
        if (i % 3 == 0) {
            pthread_mutex_lock(m->mu);
            /* the shared counter: one-fence, or the undo path every 9th */
            if (i % 9 == 0) {
                nvh_tx_add_word(m->pool, &m->reg[0]);
                m->reg[0]++;
            } else {
                nvh_tx_write_word(m->pool, &m->reg[0], m->reg[0] + 1);
            }
            if (nvh_tx_commit(m->pool) != NVH_OK) m->rc = 2;
            pthread_mutex_unlock(m->mu);
        } else if (nvh_tx_commit(m->pool) != NVH_OK) {
            m->rc = 3;
        }
    }
    return NULL;
}

static void two_threads(void **state)
{
    (void)state;
    const char *path = test_path("txredo-mt");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 4u << 20, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    uint64_t *reg = region(pool);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    mt_arg m[2];
    pthread_t th[2];
    for (unsigned i = 0; i < 2; i++) {
        m[i] = (mt_arg){pool, reg, &mu, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, mt_run, &m[i]), 0);
    }
    for (unsigned i = 0; i < 2; i++) pthread_join(th[i], NULL);
    unsigned n = SAN ? 300u : 3000u;
    assert_int_equal(m[0].rc, 0);
    assert_int_equal(m[1].rc, 0);
    assert_int_equal(reg[0], 2 * ((n + 2) / 3));
    uint64_t sum = 0;
    for (unsigned i = 0; i < 2; i++)
        for (unsigned k = 0; k < 4; k++) sum += reg[8 + i * 8 + k];
    assert_int_equal(sum, 2 * n);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    reg = region(pool);
    assert_int_equal(reg[0], 2 * ((n + 2) / 3));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* The lane filter's precision (record.c, filter_lanes): lane A's one-fence
 * commits at word a; lane B's at a word 64 KiB away, in the same 1 MiB
 * granule, must not meet A's filter (the coarse filter alone would: 2-thread
 * GUPS lost its scaling on the granule the threads' halves shared), B's at a
 * word in a's 64 KiB granule must (else the check below proves nothing). */
typedef struct {
    nvh_pool *pool;
    uint64_t *word;
    pthread_barrier_t *bar;
    int rc;
} fine_arg;

static void *fine_lane_a(void *p)
{
    fine_arg *a = p;
    for (unsigned i = 0; i < 4 && !a->rc; i++) {
        if (nvh_tx_begin(a->pool) != NVH_OK ||
            nvh_tx_write_word(a->pool, a->word, i + 1) != NVH_OK || nvh_tx_commit(a->pool) != NVH_OK)
            a->rc = 1;
    }
    pthread_barrier_wait(a->bar);           /* A's bits are published   */
    pthread_barrier_wait(a->bar);           /* B has committed: A exits */
    return NULL;
}

static uint64_t meets_total(nvh_pool *pool)
{
    nvh_txlog *lg = nvh_txlog_get(pool);
    uint64_t n = 0;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) n += lg->lanes[i].filter_meets;
    return n;
}

static void filter_fine(void **state)
{
    (void)state;
    const char *path = test_path("txredo-filter");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 8u << 20, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    char *blk = nvh_alloc(pool, 3u << 20, NULL, NULL, NULL);
    assert_non_null(blk);
    char *base = nvh_pool_base(pool);
    uint64_t g = ((uint64_t)(blk - base) + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    uint64_t *a_word = (uint64_t *)(base + g);
    uint64_t *far_word = (uint64_t *)(base + g + (64u << 10));   /* same 1 MiB granule */
    uint64_t *near_word = (uint64_t *)(base + g + 4096);         /* same 64 KiB granule */
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    fine_arg a = {pool, a_word, &bar, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fine_lane_a, &a), 0);
    pthread_barrier_wait(&bar);
    uint64_t m0 = meets_total(pool);
    for (unsigned i = 0; i < 4; i++) {
        assert_int_equal(nvh_tx_begin(pool), NVH_OK);
        assert_int_equal(nvh_tx_write_word(pool, far_word, i + 1), NVH_OK);
        assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    }
    uint64_t m_far = meets_total(pool) - m0;
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_write_word(pool, near_word, 7), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    uint64_t m_near = meets_total(pool) - m0 - m_far;
    pthread_barrier_wait(&bar);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    print_message("  filter meets: 64 KiB apart %llu (must be 0), same 64 KiB %llu (must be > 0)\n",
                  (unsigned long long)m_far, (unsigned long long)m_near);
    assert_int_equal(a.rc, 0);
    assert_int_equal(m_far, 0);
    assert_true(m_near > 0);
    assert_int_equal(*far_word, 4);
    assert_int_equal(*near_word, 7);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    tx_crash_test_init("txredo");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(api),
        cmocka_unit_test(costs),
        cmocka_unit_test(every_fence),
        cmocka_unit_test(every_fence_no_replay_fails),
        cmocka_unit_test(handover),
        cmocka_unit_test(handover_no_help_fails),
        cmocka_unit_test(random_sampled),
        cmocka_unit_test(two_threads),
        cmocka_unit_test(filter_fine),
    };
    /* TXREDO_ONLY=two_threads: one test (repeated TSan runs) */
    const char *only = getenv("TXREDO_ONLY");
    if (only && *only) cmocka_set_test_filter(only);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);
    return rc;
}
