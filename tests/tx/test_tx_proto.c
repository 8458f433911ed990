/* test_tx_proto.c — the protocol the plain transaction calls choose
 * (docs/TX.md, "Which protocol a transaction gets"):
 *   - costs at the boundaries: objects of 1, 2 and 8 changed words commit
 *     with one fence, 9 with two; 1..8 words added in place take the lazy
 *     commit (2 fences, no data write-back before the second), 9 words or a
 *     range the full one; nvh_tx_protocol_set(UNDO) forces two fences;
 *   - a crash at EVERY fence of a run that mixes every protocol the
 *     selector picks, at and beyond the boundaries, with nested
 *     transactions, aborts, allocation and free, object writes together
 *     with words given as values, the forced protocol, and chains of
 *     one-fence commits after a lazy one (line and word modes);
 *   - negative controls: without the lazy commit's redo lines, recovering
 *     the version-5 log by version 4's rules (an ACTIVE header with redo
 *     lines of its tid undone), without the "later tid" rule, without the
 *     undo of the first record inline in the lane header or the full
 *     commit's redo record for it, and, on a
 *     version-4 log, without the one-fence commit's retirement of the lazy
 *     commit before it and with an abort's retirement left to the next
 *     fence (a one-fence commit of the same word then shares that fence),
 *     the same exploration finds failures;
 *   - format 4 -> 5: a crash at every fence (line and word modes) of the
 *     same run written as a format-4 pool with a version-4 log, each image
 *     opened by this library: recovered under version 4's rules (images
 *     with uncommitted and with committed, unretired transactions counted),
 *     pool and log raised to version 5; the four torn states of the
 *     superblock's upgrade open;
 *   - two lanes: A writes an object with one fence and goes idle, B writes
 *     it with the two-fence object protocol and goes on; a crash at every
 *     fence; negative control without B's help for A's pending commit;
 *   - two lanes: A commits word 0 in place (lazy, not retired) and goes
 *     idle, B commits it with one fence; a crash at every fence (line and
 *     word modes); negative control without B learning A's cseq. */
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:nvh_reserve_named\n"; }
#endif

#include "log/log.h"
#include "pool/format.h"
#include "tx/tx.h"
#include "tx_crash_test.h"
#include "tx_word_model.h"

#include <pthread.h>
#include <stdbool.h>

#define LAYOUT "txproto"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SAN 1
#else
#define SAN 0
#endif

/* ---------------------------------------------------------------------------
 * Workload. Words 0..15 are written by every kind (so that transactions of
 * different protocols overwrite each other's words); word 40 holds the
 * offset of an object allocated by a transaction (ALLOC/FREE kinds).
 * ------------------------------------------------------------------------- */
enum {
    K_OBJ,          /* n objects of 8 bytes opened for write                  */
    K_OBJ16,        /* one 16-byte object (2 words), plus n-1 8-byte ones     */
    K_OBJ_ODD,      /* a 12-byte object: not whole words -> two fences        */
    K_INPLACE,      /* n words added with one nvh_tx_add_ranges, stored in place */
    K_RANGE,        /* a 24-byte range (object record) in place               */
    K_OBJ_WB,       /* n-1 objects and one word given as a value              */
    K_NESTED,       /* nested: in place outside, a word given as a value inside */
    K_NESTED_OBJ,   /* nested: objects at two levels                          */
    K_ABORT_IN,     /* in place, then abort                                   */
    K_ABORT_OBJ,    /* objects, then abort                                    */
    K_ALLOC,        /* allocate an object, link it from word 40 (in place)    */
    K_FREE,         /* free it, clear word 40                                 */
    K_UNDO_OBJ,     /* objects with the two-fence protocol forced             */
    K_UNDO_IN,      /* in place with the two-fence protocol forced            */
    K_IN_AT,        /* word n in place                                        */
    K_OBJ_AT,       /* word n as an object                                    */
};

static unsigned pick(uint64_t *rng, unsigned i, unsigned n, unsigned *used)
{
    /* distinct words of 0..15 (n <= 12) */
    for (;;) {
        unsigned w = (unsigned)(test_rand(rng) % 16);
        bool dup = false;
        for (unsigned k = 0; k < i; k++) dup |= used[k] == w;
        if (!dup || n > 16) { used[i] = w; return w; }
    }
}

static int obj_write(nvh_pool *pool, uint64_t *reg, unsigned w, uint64_t v)
{
    uint64_t *c = nvh_tx_open_write(pool, &reg[w], 8);
    if (!c) return -1;
    *c = v;
    exp_next[w] = v;
    return 0;
}

static int one(nvh_pool *pool, uint64_t *reg, uint64_t *rng, int kind, unsigned n)
{
    unsigned used[16];
    model_begin();
    nvh_tx_protocol proto = kind == K_UNDO_OBJ || kind == K_UNDO_IN ? NVH_TX_PROTO_UNDO
                                                                    : NVH_TX_PROTO_AUTO;
    if (nvh_tx_protocol_set(pool, proto) != NVH_OK) return -1;
    if (nvh_tx_begin(pool) != NVH_OK) return -1;
    switch (kind) {
    case K_OBJ: case K_UNDO_OBJ: case K_ABORT_OBJ:
        for (unsigned i = 0; i < n; i++)
            if (obj_write(pool, reg, pick(rng, i, n, used), test_rand(rng))) return -2;
        break;
    case K_OBJ16: {
        uint64_t *c = nvh_tx_open_write(pool, &reg[16], 16);
        if (!c) return -2;
        c[0] = exp_next[16] = test_rand(rng);
        c[1] = exp_next[17] = test_rand(rng);
        for (unsigned i = 0; i + 1 < n; i++)
            if (obj_write(pool, reg, pick(rng, i, n, used), test_rand(rng))) return -2;
        break;
    }
    case K_OBJ_ODD: {
        unsigned char *c = nvh_tx_open_write(pool, &reg[18], 12);
        if (!c) return -2;
        for (unsigned b = 0; b < 12; b++) c[b] = (unsigned char)test_rand(rng);
        memcpy(&exp_next[18], c, 12);
        break;
    }
    case K_INPLACE: case K_UNDO_IN: case K_ABORT_IN: {
        nvh_tx_range r[16];
        unsigned ws[16];
        for (unsigned i = 0; i < n; i++) {
            ws[i] = pick(rng, i, n, used);
            r[i] = (nvh_tx_range){&reg[ws[i]], 8, NVH_TX_HINT_AUTO};
        }
        if (nvh_tx_add_ranges(pool, r, n) != NVH_OK) return -3;
        for (unsigned i = 0; i < n; i++) reg[ws[i]] = exp_next[ws[i]] = test_rand(rng);
        break;
    }
    case K_RANGE:
        if (nvh_tx_add_range(pool, &reg[20], 24) != NVH_OK) return -3;
        for (unsigned i = 0; i < 3; i++) reg[20 + i] = exp_next[20 + i] = test_rand(rng);
        break;
    case K_OBJ_WB: {
        for (unsigned i = 0; i + 1 < n; i++)
            if (obj_write(pool, reg, pick(rng, i, n, used), test_rand(rng))) return -2;
        uint64_t v = test_rand(rng);
        if (nvh_tx_write_word(pool, &reg[24], v) != NVH_OK) return -4;
        exp_next[24] = v;
        break;
    }
    case K_NESTED: {
        unsigned w = pick(rng, 0, 2, used);
        if (nvh_tx_add_word(pool, &reg[w]) != NVH_OK) return -3;
        reg[w] = exp_next[w] = test_rand(rng);
        if (nvh_tx_begin(pool) != NVH_OK) return -1;
        uint64_t v = test_rand(rng);
        if (nvh_tx_write_word(pool, &reg[25], v) != NVH_OK) return -4;
        exp_next[25] = v;
        if (nvh_tx_commit(pool) != NVH_OK) return -5;
        if (memcmp(reg, exp_prev, 25 * 8) == 0) return -6;   /* inner commit: nothing durable yet */
        break;
    }
    case K_NESTED_OBJ:
        if (obj_write(pool, reg, pick(rng, 0, 2, used), test_rand(rng))) return -2;
        if (nvh_tx_begin(pool) != NVH_OK) return -1;
        if (obj_write(pool, reg, pick(rng, 1, 2, used), test_rand(rng))) return -2;
        if (nvh_tx_commit(pool) != NVH_OK) return -5;
        break;
    case K_ALLOC: {
        uint64_t *o = nvh_tx_alloc(pool, 64);
        if (!o || nvh_tx_add_word(pool, &reg[40]) != NVH_OK) return -7;
        o[0] = 0x5A;    /* zeroed and ours: no add needed */
        reg[40] = exp_next[40] = nvh_off(pool, o);
        break;
    }
    case K_IN_AT:
        if (nvh_tx_add_word(pool, &reg[n]) != NVH_OK) return -3;
        reg[n] = exp_next[n] = test_rand(rng);
        break;
    case K_OBJ_AT:
        if (obj_write(pool, reg, n, test_rand(rng))) return -2;
        break;
    case K_FREE:
        if (!reg[40]) break;
        if (nvh_tx_add_word(pool, &reg[40]) != NVH_OK) return -7;
        if (nvh_tx_free(pool, nvh_ptr(pool, reg[40])) != NVH_OK) return -7;
        reg[40] = exp_next[40] = 0;
        break;
    }
    if (kind == K_ABORT_IN || kind == K_ABORT_OBJ) {
        if (nvh_tx_abort(pool) != NVH_OK) return -8;     /* outermost: ends it */
        g_inflight = 0;
        return memcmp(reg, exp_prev, REG) == 0 ? 0 : -9;
    }
    if (nvh_tx_commit(pool) != NVH_OK) return -10;
    model_ack();
    return memcmp(reg, exp_prev, REG) == 0 ? 0 : -11;
}

static const struct step { int kind; unsigned n; } g_steps[] = {
    {K_OBJ, 1}, {K_INPLACE, 1}, {K_OBJ, 1}, {K_OBJ, 2}, {K_OBJ, 1}, {K_OBJ, 1},
    {K_INPLACE, 2}, {K_INPLACE, 8}, {K_INPLACE, 9}, {K_OBJ, 8}, {K_OBJ, 9},
    {K_OBJ16, 1}, {K_OBJ16, 7}, {K_OBJ_ODD, 0}, {K_RANGE, 0}, {K_INPLACE, 1},
    {K_OBJ_WB, 2}, {K_OBJ_WB, 8}, {K_NESTED, 0}, {K_NESTED_OBJ, 0}, {K_INPLACE, 2},
    {K_ABORT_IN, 2}, {K_OBJ, 2}, {K_ABORT_OBJ, 2}, {K_INPLACE, 1}, {K_ALLOC, 0},
    {K_OBJ, 1}, {K_FREE, 0}, {K_INPLACE, 1}, {K_UNDO_OBJ, 1}, {K_UNDO_IN, 1},
    {K_OBJ, 1}, {K_INPLACE, 3}, {K_OBJ, 2}, {K_OBJ, 2}, {K_OBJ, 2}, {K_OBJ, 2},
    /* a lazy commit of word 0, then one-fence commits: the first overwrites
     * word 0, the next ones reuse both redo slots (the lazy commit's lines
     * are gone; its commit record must be retired by then) */
    {K_IN_AT, 0}, {K_OBJ_AT, 0}, {K_OBJ_AT, 30}, {K_OBJ_AT, 31}, {K_OBJ_AT, 30},
};

static int seq_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    uint64_t rng = 17;
    for (unsigned i = 0; i < sizeof g_steps / sizeof g_steps[0]; i++) {
        int rc = one(pool, reg, &rng, g_steps[i].kind, g_steps[i].n);
        if (rc != 0) { fprintf(stderr, "step %u: %d (%s)\n", i, rc, nvh_errormsg()); return 2; }
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Checker
 * ------------------------------------------------------------------------- */
static int tx_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    int rc = 0;
    nvh_off_t *root = nvh_root(pool, NULL);
    if (!root[0]) {
        if (g_acked) rc = complain(pt, 4, "region lost", (long)g_acked, 0);
    } else {
        uint64_t *reg = nvh_ptr(pool, root[0]);
        rc = tx_region_check(pt, reg, exp_prev, exp_next, REG, g_inflight, g_acked);
        /* a linked object is allocated */
        if (!rc && reg[40] && nvh_usable_size(pool, nvh_ptr(pool, reg[40])) < 64)
            rc = complain(pt, 6, "linked object not allocated", (long)reg[40], 0);
        /* the recovered pool takes transactions of every protocol */
        if (!rc) {
            uint64_t *c;
            if (nvh_tx_begin(pool) != NVH_OK || !(c = nvh_tx_open_write(pool, &reg[NW - 1], 8)))
                rc = complain(pt, 9, "no object transaction after recovery", nvh_errcode(), 0);
            else {
                *c = 77;
                if (nvh_tx_commit(pool) != NVH_OK || reg[NW - 1] != 77)
                    rc = complain(pt, 9, "object commit after recovery", nvh_errcode(), 0);
            }
        }
        if (!rc && (nvh_tx_begin(pool) != NVH_OK || nvh_tx_add_word(pool, &reg[NW - 2]) != NVH_OK))
            rc = complain(pt, 9, "no transaction after recovery", nvh_errcode(), 0);
        if (!rc) {
            reg[NW - 2] ^= 1;
            if (nvh_tx_commit(pool) != NVH_OK) rc = complain(pt, 9, "commit after recovery", 0, 0);
        }
    }
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Two lanes: A writes object X (word 0) with one fence and waits; B writes X
 * (with word 1..8: nine words, the two-fence object protocol), then more
 * two-fence object transactions on other words, so that B's retirement of
 * the X transaction becomes durable while A's one-fence commit is not
 * retired by A itself.
 * ------------------------------------------------------------------------- */
typedef struct lane_a {
    nvh_pool *pool;
    uint64_t *reg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;
    int rc;
} lane_a;

static void *lane_a_run(void *p)
{
    lane_a *a = p;
    model_begin();
    int rc = nvh_tx_begin(a->pool);
    uint64_t *c = rc == NVH_OK ? nvh_tx_open_write(a->pool, &a->reg[0], 8) : NULL;
    if (c) { *c = exp_next[0] = 0xA0A0; rc = nvh_tx_commit(a->pool); }
    else rc = NVH_E_ABORTED;
    model_ack();
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->phase = 1;
    pthread_cond_broadcast(&a->cv);
    while (a->phase != 2) pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int handover_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    /* B's lane exists before A starts */
    model_begin();
    if (nvh_tx_begin(pool) != NVH_OK || obj_write(pool, reg, 30, 30) ||
        nvh_tx_commit(pool) != NVH_OK)
        return 1;
    model_ack();
    lane_a a = {.pool = pool, .reg = reg};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, lane_a_run, &a) != 0) return 2;
    pthread_mutex_lock(&a.mu);
    while (a.phase != 1) pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    int rc = a.rc == NVH_OK ? 0 : 3;
    uint64_t rng = 5;
    for (unsigned t = 0; t < 4 && rc == 0; t++) {
        model_begin();
        if (nvh_tx_begin(pool) != NVH_OK) rc = 4;
        for (unsigned i = 0; i < 9 && !rc; i++)   /* 9 words: two fences */
            if (obj_write(pool, reg, t == 0 ? i : 41 + i, test_rand(&rng))) rc = 4;
        if (!rc && nvh_tx_commit(pool) != NVH_OK) rc = 4;
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
 * Two lanes, lazy then one-fence: A commits word 0 in place (the lazy
 * protocol: its data flushed after the commit fence, its retirement left to
 * A's next fence) and goes idle, so that commit stays retirable only by a
 * helper. A's clock runs ahead (five lazy commits), so B's own clock is
 * below A's commit order. B then commits word 0 with one fence (a word
 * given by value, later an object), acknowledged, and goes on with one-fence
 * commits that reuse both of its redo slots. A crash at any fence of B must
 * find word 0 at B's value once B's commit returned: recovery may replay
 * A's commit (header COMMITTED, retire word below it) together with B's
 * redo lines, so B must commit after A in cseq order (it learns A's cseq
 * from A's pending entry while it help-flushes word 0).
 * ------------------------------------------------------------------------- */
static void *lane_lazy_run(void *p)
{
    lane_a *a = p;
    int rc = NVH_OK;
    for (unsigned t = 0; t < 5 && rc == NVH_OK; t++) {
        unsigned w = t < 4 ? 2 + t : 0;      /* the last one: word 0 */
        model_begin();
        rc = nvh_tx_begin(a->pool);
        if (rc == NVH_OK) rc = nvh_tx_add_range(a->pool, &a->reg[w], 8);
        if (rc == NVH_OK) {
            a->reg[w] = exp_next[w] = 0xA000 + t;
            rc = nvh_tx_commit(a->pool);
        }
        if (rc == NVH_OK) model_ack();
    }
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->phase = 1;
    pthread_cond_broadcast(&a->cv);
    while (a->phase != 2) pthread_cond_wait(&a->cv, &a->mu);   /* idle: no fence */
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int b_word(nvh_pool *pool, uint64_t *reg, unsigned w, uint64_t v)
{
    model_begin();
    if (nvh_tx_begin(pool) != NVH_OK || nvh_tx_write_word(pool, &reg[w], v) != NVH_OK)
        return -1;
    exp_next[w] = v;
    if (nvh_tx_commit(pool) != NVH_OK) return -1;
    model_ack();
    return reg[w] == v ? 0 : -2;
}

static int lazy_handover_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t *reg = region(pool);
    if (!reg) return 1;
    model_reset(reg);
    /* B's lane exists before A starts */
    if (b_word(pool, reg, 30, 30)) return 1;
    lane_a a = {.pool = pool, .reg = reg};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, lane_lazy_run, &a) != 0) return 2;
    pthread_mutex_lock(&a.mu);
    while (a.phase != 1) pthread_cond_wait(&a.cv, &a.mu);
    pthread_mutex_unlock(&a.mu);
    int rc = a.rc == NVH_OK ? 0 : 3;
    /* B: word 0 by value with one fence, then more one-fence commits (both
     * redo slots reused), then word 0 again as an object */
    if (!rc && b_word(pool, reg, 0, 0xB0B0)) rc = 4;
    if (!rc && b_word(pool, reg, 31, 0xB031)) rc = 5;
    if (!rc && b_word(pool, reg, 32, 0xB032)) rc = 5;
    if (!rc && b_word(pool, reg, 31, 0xB131)) rc = 5;
    if (!rc) {
        model_begin();
        if (nvh_tx_begin(pool) != NVH_OK || obj_write(pool, reg, 0, 0xB1B0) ||
            nvh_tx_commit(pool) != NVH_OK)
            rc = 6;
        else
            model_ack();
    }
    if (!rc && b_word(pool, reg, 32, 0xB132)) rc = 7;
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
static nvh_crash_report explore(nvh_crash_workload_fn w, nvh_crash_mode mode, unsigned images)
{
    const char *path = tx_fresh_pool("txproto", LAYOUT);
    *g_complaints = 0;
    memset(exp_prev, 0, REG);
    memset(exp_next, 0, REG);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = w, .check = tx_check, .arg = NULL,
        .seed = 11, .mode = mode, .budget = 0, .images_per_point = images,
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

static void fences_of(nvh_pool *pool, uint64_t *reg, int kind, unsigned n, uint64_t *fences,
                      uint64_t *lines)
{
    static uint64_t rng = 3;    /* fresh values in every call */
    nvh_stats s;
    /* the last of three is measured (the first retires what came before;
     * both log slots have their segments by the third) */
    for (int rep = 0; rep < 3; rep++) {
        nvh_stats_reset(pool);
        assert_int_equal(one(pool, reg, &rng, kind, n), 0);
    }
    nvh_stats_get(pool, &s);
    *fences = s.fences;
    *lines = s.lines_flushed;
}

static void costs(void **state)
{
    (void)state;
    const char *path = tx_fresh_pool("txproto", LAYOUT);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    uint64_t *reg = region(pool);
    assert_non_null(reg);
    model_reset(reg);
    static const struct { int kind; unsigned n; uint64_t fences, lines; } want[] = {
        /* one fence: the redo line(s) and the changed words */
        {K_OBJ, 1, 1, 2}, {K_OBJ, 2, 1, 3}, {K_OBJ, 8, 1, 4 + 8}, {K_OBJ16, 1, 1, 3},
        {K_OBJ_WB, 2, 1, 3},
        /* two fences beyond the boundary or with what needs an undo log */
        {K_OBJ, 9, 2, 0}, {K_OBJ_ODD, 0, 2, 0}, {K_UNDO_OBJ, 1, 2, 0},
        /* in place: always two; lazy up to 8 words (previous retirement 1,
         * header with the first record 1, records n - 1, redo lines, data
         * n: version 5 rewrites neither the records nor the header at the
         * commit) */
        {K_INPLACE, 1, 2, 4}, {K_INPLACE, 8, 2, 1 + 8 + 4 + 8}, {K_INPLACE, 9, 2, 0},
        {K_RANGE, 0, 2, 0},
        /* the full commit: header with the first record 1, records n - 1,
         * the records with their new words n - 1 and the first word's
         * appended copy 1, data n, COMMITTED header 1, retirement 1 */
        {K_UNDO_IN, 1, 2, 5}, {K_UNDO_IN, 2, 2, 8}, {K_UNDO_IN, 8, 2, 26},
    };
    for (unsigned i = 0; i < sizeof want / sizeof want[0]; i++) {
        uint64_t f, l;
        fences_of(pool, reg, want[i].kind, want[i].n, &f, &l);
        print_message("  kind %d n %u: %llu fences, %llu lines\n", want[i].kind, want[i].n,
                      (unsigned long long)f, (unsigned long long)l);
        assert_int_equal(f, want[i].fences);
        if (want[i].lines) assert_int_equal(l, want[i].lines);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void every_fence(void **state)
{
    (void)state;
    g_complaints_quiet = 0;
    nvh_crash_report r = explore(seq_workload, NVH_CRASH_LINES, SAN ? 2 : 4);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
    r = explore(seq_workload, NVH_CRASH_WORDS, SAN ? 1 : 3);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
}

static void negative(int *hook, const char *what, nvh_crash_workload_fn w)
{
    *hook = 1;
    g_complaints_quiet = 1;
    /* images per crash point: enough that the bug each control plants
     * shows in some image whatever the heap's layout of the log */
    nvh_crash_report r = explore(w, NVH_CRASH_LINES, 4);
    *hook = 0;
    g_complaints_quiet = 0;
    print_message("  %s: %llu failures (must be > 0)\n", what, (unsigned long long)r.failures);
    assert_true(r.failures > 0);
}

/* negative controls: each part of the lazy commit is needed */
static void no_lazy_redo_lines_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_no_lazy_redo_, "lazy commit without redo lines", seq_workload);
}

/* An abort's retirement left to the next fence, that fence a one-fence
 * commit of a word the abort had logged: a version-4 log replays the commit
 * and then undoes the abort's stale records over it. (A version-5 log reads
 * the ACTIVE header with the later commit's redo lines as ended, so this
 * control runs on a version-4 log; the fence stays for both.) */
static void abort_no_fence_fails(void **state)
{
    (void)state;
    nvh_txlog_test_dir_version_ = NVH_TX_DIR_VERSION_V4;
    negative(&nvh_tx_test_abort_no_fence_, "version 4: abort retired at the next fence only",
             seq_workload);
    nvh_txlog_test_dir_version_ = 0;
}

static void handover(void **state)
{
    (void)state;
    g_complaints_quiet = 0;
    nvh_crash_report r = explore(handover_workload, NVH_CRASH_LINES, SAN ? 1 : 2);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
}

static void handover_no_help_fails(void **state)
{
    (void)state;
    negative(&nvh_tx_test_otm_no_help_, "object commit without help for a pending one",
             handover_workload);
}

static void lazy_handover(void **state)
{
    (void)state;
    g_complaints_quiet = 0;
    nvh_crash_report r = explore(lazy_handover_workload, NVH_CRASH_LINES, SAN ? 2 : 4);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
    r = explore(lazy_handover_workload, NVH_CRASH_WORDS, SAN ? 1 : 3);
    if (r.failures) nvh_crash_report_print(&r, stderr);
    assert_int_equal(r.failures, 0);
}

static void lazy_handover_no_learn_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_no_learn_, "one-fence commit not ordered after a lazy one",
             lazy_handover_workload);
}

/* negative controls of the version-5 recovery rules: read the way a
 * version-4 library would, a lazily committed transaction (ACTIVE header,
 * valid redo lines of its tid) is undone after its commit returned; and
 * without the "later tid" rule a lazy commit whose lines the one-fence
 * commit after next overwrote (its retirement not yet durable) is undone */
static void v4_rules_on_v5_log_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_v4_rules_, "version-5 log recovered by version-4 rules",
             seq_workload);
}

/* the header's inline first record: recovery must undo it, and the full
 * commit must append its redo image */
static void no_w0_undo_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_no_w0_undo_, "inline first record not undone", seq_workload);
}

static void no_w0_append_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_no_w0_append_, "full commit without the inline word's redo record",
             seq_workload);
}

static void no_later_tid_fails(void **state)
{
    (void)state;
    negative(&nvh_txlog_test_no_later_tid_, "ACTIVE header with later redo lines undone",
             seq_workload);
}

/* ---------------------------------------------------------------------------
 * Format 4 -> 5. The workload writes a format-4 pool: its superblock says
 * version 4 and the library writes a version-4 log (test hook: lazy
 * commits rewrite the records and write a COMMITTED header). Each crash
 * image is opened by this library: read-only first (the pool and its log
 * as they are: counted by what is live in the log), then read-write, which
 * raises the pool's version to 5, recovers the version-4 log under
 * version 4's rules and raises its version to 5; the data must be the
 * acknowledged state (or the next one) and both versions 5 afterwards.
 * ------------------------------------------------------------------------- */
static void sb_set_version(void *base, uint32_t word, uint32_t crc_of)
{
    struct nvh_superblock_header *h = base;
    h->format_version = crc_of;
    h->checksum = nvh_sb_header_checksum(h);
    h->format_version = word;
}

static int v4_workload(nvh_pool *pool, void *arg)
{
    g_acked = 0;            /* the explorer runs a workload twice */
    g_inflight = 0;
    sb_set_version(NVH_CTX_(pool)->base, 4, 4);
    nvh_persist(pool, NVH_CTX_(pool)->base, sizeof(struct nvh_superblock_header));
    return seq_workload(pool, arg);
}

/* g_complaints[1]: images with an uncommitted transaction in a lane (ACTIVE,
 * not retired); [2]: with a committed one not retired (a COMMITTED header,
 * which recovery must redo); [3]: format-4 images checked */
static void count_live(nvh_pool *pool)
{
    struct nvh_tx_dir *d = NULL;
    nvh_named_foreach(pool, tx_dir_find, &d);
    if (!d) return;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        uint64_t w = atomic_load(&d->lane[i].state);
        uint64_t rt = nvh_rw_tid(atomic_load(&d->retire[i].tid));
        if (NVH_LS_TID(w) > rt && NVH_LS_ST(w) == NVH_LS_ACTIVE)
            __atomic_fetch_add(&g_complaints[1], 1, __ATOMIC_RELAXED);
        if (NVH_LS_TID(w) > rt && NVH_LS_ST(w) == NVH_LS_COMMITTED)
            __atomic_fetch_add(&g_complaints[2], 1, __ATOMIC_RELAXED);
    }
}

static int v4_check_(const char *image, const nvh_crash_point *pt, void *arg);
static int v4_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    /* the checker is this library: a directory it creates is version 5 */
    int saved = nvh_txlog_test_dir_version_;
    nvh_txlog_test_dir_version_ = 0;
    int rc = v4_check_(image, pt, arg);
    nvh_txlog_test_dir_version_ = saved;
    return rc;
}

static int v4_check_(const char *image, const nvh_crash_point *pt, void *arg)
{
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    if (!pool) return complain(pt, 2, "read-only open of a format-4 image", nvh_errcode(), 0);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    struct nvh_tx_dir *d = NULL;
    nvh_named_foreach(pool, tx_dir_find, &d);
    int rc = 0;
    /* before the workload's first fence the superblock may still say 5 */
    if (d && (info.format_version != 4 || d->version != NVH_TX_DIR_VERSION_V4))
        rc = complain(pt, 3, "not a format-4 image", (long)info.format_version,
                      (long)d->version);
    if (info.format_version == 4) {
        count_live(pool);
        __atomic_fetch_add(&g_complaints[3], 1, __ATOMIC_RELAXED);
    }
    nvh_pool_close(pool);
    if (rc) return rc;
    if ((rc = tx_check(image, pt, arg)) != 0) return rc;
    pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    if (!pool) return complain(pt, 2, "open after the upgrade", nvh_errcode(), 0);
    nvh_pool_info_get(pool, &info);
    d = NULL;
    nvh_named_foreach(pool, tx_dir_find, &d);
    if (info.format_version != NVH_FORMAT_VERSION || (d && d->version != NVH_TX_DIR_VERSION))
        rc = complain(pt, 3, "not upgraded", (long)info.format_version, d ? (long)d->version : -1);
    nvh_pool_close(pool);
    return rc;
}

static void format4_upgrade_every_fence(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        g_complaints_quiet = 0;
        g_complaints[1] = g_complaints[2] = g_complaints[3] = 0;
        nvh_txlog_test_dir_version_ = NVH_TX_DIR_VERSION_V4;
        const char *path = tx_fresh_pool("txproto", LAYOUT);
        *g_complaints = 0;
        memset(exp_prev, 0, REG);
        memset(exp_next, 0, REG);
        nvh_crash_config cfg = {
            .pool_path = path, .layout = LAYOUT, .workload = v4_workload, .check = v4_check,
            .seed = 13, .mode = mode ? NVH_CRASH_WORDS : NVH_CRASH_LINES, .budget = 0,
            .images_per_point = SAN ? 1 : 2, .scratch_dir = g_scratch,
        };
        nvh_crash_report rep;
        assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
        nvh_txlog_test_dir_version_ = 0;
        print_message("  %s: %llu fences, %llu images: %d with an uncommitted transaction, "
                      "%d with a committed one not retired; %llu failures\n",
                      mode ? "words" : "lines", (unsigned long long)rep.fences,
                      (unsigned long long)rep.points_tested, g_complaints[1], g_complaints[2],
                      (unsigned long long)rep.failures);
        if (rep.failures) nvh_crash_report_print(&rep, stderr);
        assert_int_equal(rep.workload_status, 0);
        assert_int_equal(rep.failures, 0);
        assert_true(g_complaints[3] > 0 && g_complaints[1] > 0 && g_complaints[2] > 0);
        unlink(path);
    }
}

/* the lazy commit of a version-4 log needs its retirement by the next
 * one-fence commit (its COMMITTED header would replay it over that
 * commit's words once the redo lines are gone) */
static void v4_no_lazy_retire_fails(void **state)
{
    (void)state;
    nvh_txlog_test_dir_version_ = NVH_TX_DIR_VERSION_V4;
    negative(&nvh_txlog_test_no_hdr_retire_, "version 4: one-fence commit not retiring the lazy one",
             seq_workload);
    nvh_txlog_test_dir_version_ = 0;
}

/* An upgrade's version word and checksum torn by a crash, format 4 -> 5:
 * each of the four states opens (as format 4 until the fence completed, and
 * nvh_pool_info says so) and is upgraded */
static void format4_upgrade_torn(void **state)
{
    (void)state;
    for (unsigned k = 0; k < 4; k++) {
        const char *path = tx_fresh_pool("txproto-torn", LAYOUT);
        struct nvh_superblock_header sh;
        test_peek(path, 0, &sh, sizeof sh);
        uint32_t word = (k & 1) ? NVH_FORMAT_VERSION : 4, crc_of = (k & 2) ? NVH_FORMAT_VERSION : 4;
        sb_set_version(&sh, word, crc_of);
        test_poke(path, 0, &sh, sizeof sh);
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
        if (!pool) fprintf(stderr, "  version %u, checksum of %u: %s\n", word, crc_of, nvh_errormsg());
        assert_non_null(pool);
        /* a read-only open reports the version it opened the pool as, not
         * the torn word */
        nvh_pool_info info;
        nvh_pool_info_get(pool, &info);
        assert_int_equal(info.format_version, k == 3 ? NVH_FORMAT_VERSION : 4);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        nvh_pool_info_get(pool, &info);
        assert_int_equal(info.format_version, NVH_FORMAT_VERSION);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

int main(void)
{
    tx_crash_test_init("txproto");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(costs),
        cmocka_unit_test(every_fence),
        cmocka_unit_test(no_lazy_redo_lines_fails),
        cmocka_unit_test(abort_no_fence_fails),
        cmocka_unit_test(handover),
        cmocka_unit_test(handover_no_help_fails),
        cmocka_unit_test(lazy_handover),
        cmocka_unit_test(lazy_handover_no_learn_fails),
        cmocka_unit_test(v4_rules_on_v5_log_fails),
        cmocka_unit_test(no_later_tid_fails),
        cmocka_unit_test(no_w0_undo_fails),
        cmocka_unit_test(no_w0_append_fails),
        cmocka_unit_test(format4_upgrade_every_fence),
        cmocka_unit_test(v4_no_lazy_retire_fails),
        cmocka_unit_test(format4_upgrade_torn),
    };
    const char *only = getenv("TXPROTO_ONLY");
    if (only && *only) cmocka_set_test_filter(only);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);
    return rc;
}
