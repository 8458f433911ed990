/* test_btree_crash.c — the B+ tree under nvh_crash_explore.
 *
 * The workload runs a fixed list of operations, each of which changes the
 * tree's content (inserts of new keys in random order, so leaves and inner
 * nodes split; updates to new versions; deletes, including runs of
 * consecutive keys that empty whole leaves, which then leave the tree). The
 * checker opens every crash image (allocator recovery, then the tree: no
 * scan), checks every invariant, and demands that the recovered content is
 * the state after every op < durable(crash), plus any subset of the ops in
 * flight [durable, issued) — each applied whole or not at all (inserts are
 * validated in batches; updates and deletes sync first, so they are in
 * flight alone) — i.e. everything acknowledged survived and nothing
 * half-done is visible.
 * Then it writes to the recovered tree (repairs of interrupted splits,
 * reclaim of unvalidated records), checks again and compares with the model.
 *
 * Monotonicity: the same run is crashed at every fence (increasing points);
 * the recovered state never falls below the durable watermark, which only
 * grows — what was once acknowledged stays recoverable — and the number of
 * recovered ops is recorded per fence to show the state advancing.
 *
 * Every fence for small trees in the default mode (groups, durable on
 * return, line granularity) and in the negative controls; the variants
 * (word granularity, flush and NT modes, big values) at VARIANT_SAMPLE
 * sampled fences each, every fence with NVHEAP_TEST_DEEP set (the longer
 * run: docs/BTREE.md); sampled crash points over 10^5 operations.
 */
#include "btree_test.h"

#include <sys/mman.h>

#define MAXLEN 40
#define BIGLEN 20000     /* values above 16 KiB get a record slab of their own */

typedef struct op {
    uint32_t idx;
    uint32_t ver;       /* 0 = delete */
} op;

typedef struct cfg {
    nvh_btree_mode mode;
    uint64_t nkeys;
    op *ops;
    uint64_t nops;
    unsigned maxlen;
    unsigned sync_every; /* explicit nvh_btree_sync every N ops (0 = never) */
    unsigned fault;      /* negative controls: deliberate bugs (src/ds/btree.h) */
    int on_return;       /* GROUPS: the default durability (durable on return);
                            0: NVH_BTREE_DURABLE_DEFERRED */
} cfg;

/* nvh_btree_debug_fault_ and the BT_FAULT_* bits: make the tree deliberately
 * broken (src/ds/btree.h, internal) */
#include "ds/btree.h"

static volatile uint64_t g_issued, g_durable;
static nvh_btree_stats g_stats;     /* of the last workload run */
static int64_t *g_shared;           /* [0] complaints, [1..] jmin per fence */
static uint64_t g_shared_len;
static const char *g_scratch;

/* ---------------------------------------------------------------------------
 * Operation lists
 * ------------------------------------------------------------------------- */
static op *make_ops(uint64_t nkeys, uint64_t inserts, uint64_t updates, uint64_t deletes,
                    uint64_t seed, uint64_t *nops)
{
    op *v = calloc(inserts + updates + deletes, sizeof *v);
    uint64_t *ver = calloc(nkeys, sizeof *ver);
    uint64_t n = 0, s = seed, live = 0;
    bt_model m;
    bt_model_init(&m, nkeys);
    /* inserts of distinct keys in random order */
    uint64_t *perm = malloc(nkeys * sizeof *perm);
    for (uint64_t i = 0; i < nkeys; i++) perm[i] = i;
    for (uint64_t i = nkeys - 1; i > 0; i--) {
        uint64_t j = test_rand(&s) % (i + 1), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (uint64_t i = 0; i < inserts && i < nkeys; i++) {
        v[n] = (op){(uint32_t)perm[i], (uint32_t)(n + 1)};
        n++;
        ver[perm[i]] = 1;
        live++;
    }
    for (uint64_t u = 0; u < updates && live; u++) {
        uint64_t i;
        do i = test_rand(&s) % nkeys; while (!ver[i]);
        v[n] = (op){(uint32_t)i, (uint32_t)(n + 1)};
        n++;
    }
    /* deletes: 3/4 a run of consecutive keys from the first quarter of the
     * key order on (empties whole leaves that are not leftmost), the rest
     * random */
    uint64_t start = nkeys / 4, run = deletes * 3 / 4;
    for (uint64_t d = 0, c = start; d < run && live; c++) {
        uint64_t i = m.order[c % nkeys];
        if (!ver[i]) continue;
        v[n++] = (op){(uint32_t)i, 0};
        ver[i] = 0;
        live--;
        d++;
    }
    for (uint64_t d = run; d < deletes && live; d++) {
        uint64_t i;
        do i = test_rand(&s) % nkeys; while (!ver[i]);
        v[n++] = (op){(uint32_t)i, 0};
        ver[i] = 0;
        live--;
    }
    free(perm);
    free(ver);
    bt_model_free(&m);
    *nops = n;
    return v;
}

static void apply(bt_model *m, const op *o)
{
    if (o->ver) {
        if (!m->ver[o->idx]) m->live++;
        m->ver[o->idx] = o->ver;
    } else if (m->ver[o->idx]) {
        m->ver[o->idx] = 0;
        m->live--;
    }
}

/* ---------------------------------------------------------------------------
 * Workload
 * ------------------------------------------------------------------------- */
static void on_durable(nvh_btree *t, uint64_t durable, void *arg)
{
    (void)t; (void)arg;
    g_durable = durable;
}

static nvh_btree_options tree_options(const cfg *c, nvh_group_options *go)
{
    memset(go, 0, sizeof *go);
    go->batch_count = 6;
    go->batch_ns = NVH_GROUP_NEVER;          /* deterministic for exploration */
    go->slots = 24;
    return (nvh_btree_options){.mode = c->mode, .group = go,
                               .durability = c->on_return ? NVH_BTREE_DURABLE_ON_RETURN
                                                          : NVH_BTREE_DURABLE_DEFERRED};
}

static int workload(nvh_pool *pool, void *arg)
{
    const cfg *c = arg;
    g_issued = 0;
    g_durable = 0;
    nvh_group_options go;
    nvh_btree_options opt = tree_options(c, &go);
    nvh_btree *t = nvh_btree_open(pool, "c", 1, &opt);
    if (!t) return 1;
    nvh_btree_set_durable_fn(t, on_durable, NULL);
    nvh_btree_debug_fault_(t, c->fault);
    static unsigned char buf[BIGLEN + 1];
    for (uint64_t k = 0; k < c->nops; k++) {
        const op *o = &c->ops[k];
        uint64_t key = bt_key_of(o->idx);
        g_issued = k + 1;                    /* before any fence of the op */
        int rc;
        if (o->ver) {
            size_t len = bt_value(key, o->ver, buf, c->maxlen);
            rc = nvh_btree_put(t, key, buf, len);
        } else {
            rc = nvh_btree_delete(t, key);
        }
        if (rc != NVH_OK) {
            fprintf(stderr, "workload op %llu: %s\n", (unsigned long long)k, nvh_errormsg());
            return 2;
        }
        if (nvh_btree_ops(t) != k + 1) return 3;
        if (c->sync_every && (k + 1) % c->sync_every == 0 && nvh_btree_sync(t) != NVH_OK) return 4;
    }
    nvh_btree_stats_get(t, &g_stats);
    if (nvh_btree_close(t) != NVH_OK) return 5;
    g_durable = c->nops;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Checker
 * ------------------------------------------------------------------------- */
static int complain(const nvh_crash_point *pt, int rc, const char *what, uint64_t a, uint64_t b)
{
    if (__atomic_fetch_add(&g_shared[0], 1, __ATOMIC_RELAXED) < 4)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%llu, %llu)\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what,
                (unsigned long long)a, (unsigned long long)b);
    return rc;
}

static int check(const char *image, const nvh_crash_point *pt, void *arg)
{
    const cfg *c = arg;
    uint64_t durable = g_durable, issued = g_issued;
    if (getenv("BT_KEEP_IMAGES")) {
        /* debugging: keep the untouched image, named with its window */
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "cp %s %s.d%llu.i%llu.orig", image, image,
                 (unsigned long long)durable, (unsigned long long)issued);
        if (system(cmd) != 0) return 99;
    }
    nvh_pool *pool = nvh_pool_open(image, BT_LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    nvh_group_options go;
    nvh_btree_options opt = tree_options(c, &go);
    opt.mode = NVH_BTREE_GROUPS;
    nvh_btree *t = nvh_btree_open(pool, "c", 0, &opt);
    bt_scan_out o = {0};
    int rc = 0;
    if (!t) {
        if (nvh_errcode() != NVH_E_NOTFOUND) rc = complain(pt, 3, "tree does not open", 0, 0);
        else if (durable > 0) rc = complain(pt, 4, "tree lost", durable, 0);
        nvh_pool_close(pool);
        return rc;
    }
    if (nvh_btree_check(t) != NVH_OK) {
        fprintf(stderr, "  checker: %s\n", nvh_errormsg());
        rc = complain(pt, 5, "invariants broken", 0, 0);
        goto out;
    }
    nvh_btree_scan(t, 0, UINT64_MAX, bt_scan_cb, &o);
    /* The recovered content: every op < durable applied; each op of the
     * window [durable, issued) applied or not, independently (inserts in
     * flight are validated in batches; an update or delete syncs first, so
     * it can only be the last op of the window). Each key has at most one
     * op in the window. */
    bt_model m;
    bt_model_init(&m, c->nkeys + 64);
    for (uint64_t k = 0; k < durable; k++) apply(&m, &c->ops[k]);
    int64_t *alt = malloc(m.nkeys * sizeof *alt);
    for (uint64_t i = 0; i < m.nkeys; i++) alt[i] = -1;
    for (uint64_t k = durable; k < issued && !rc; k++) {
        const op *w = &c->ops[k];
        if (alt[w->idx] >= 0) rc = complain(pt, 6, "two ops of one key in flight", k, w->idx);
        if (!w->ver || m.ver[w->idx]) {
            if (k + 1 != issued) rc = complain(pt, 6, "update/delete in flight with later ops", k, issued);
        }
        alt[w->idx] = w->ver;
    }
    int64_t found = (int64_t)durable;
    static unsigned char vb[BIGLEN + 1];
    size_t n = 0;
    for (uint64_t j = 0; j < m.nkeys && !rc; j++) {
        uint64_t i = m.order[j], key = bt_key_of(i);
        uint64_t got = UINT64_MAX;          /* version recovered; 0 = absent */
        if (n < o.n && o.keys[n] == key) {
            uint64_t cand[2] = {m.ver[i], alt[i] >= 0 ? (uint64_t)alt[i] : 0};
            for (int q = 0; q < 2; q++) {
                if (!cand[q]) continue;
                size_t len = bt_value(key, cand[q], vb, c->maxlen);
                if (o.hash[n] == bt_hash_bytes(vb, len)) got = cand[q];
            }
            if (got == UINT64_MAX) { rc = complain(pt, 6, "key with a value never written", i, n); break; }
            n++;
        } else {
            got = 0;
        }
        if (got != m.ver[i]) {
            if (alt[i] < 0 || (uint64_t)alt[i] != got) {
                rc = complain(pt, 6, got ? "unexpected version" : "acknowledged key lost", i, durable);
                break;
            }
            found++;
            if (!m.ver[i]) m.live++;
            else if (!got) m.live--;
            m.ver[i] = got;
        }
    }
    if (!rc && n != o.n) rc = complain(pt, 6, "recovered keys outside the model", o.n, n);
    free(alt);
    if (rc) {
        bt_model_free(&m);
        goto out;
    }
    if (pt->fence + 1 < g_shared_len) {
        int64_t *slot = &g_shared[1 + pt->fence];
        int64_t cur = __atomic_load_n(slot, __ATOMIC_RELAXED);
        while ((cur < 0 || found < cur) &&
               !__atomic_compare_exchange_n(slot, &cur, found, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    }
    /* m now holds exactly the recovered state: write to the recovered tree */
    static unsigned char buf[BIGLEN + 1];
    for (uint64_t x = 0; x < 40 && !rc; x++) {
        uint64_t i = x % 3 == 0 ? c->nkeys + x : (x * 7919) % c->nkeys;
        op w = {(uint32_t)i, (uint32_t)(1000000 + x)};
        size_t len = bt_value(bt_key_of(i), w.ver, buf, c->maxlen);
        if (nvh_btree_put(t, bt_key_of(i), buf, len) != NVH_OK) rc = complain(pt, 7, "put after recovery", x, 0);
        apply(&m, &w);
        if (x % 5 == 4) {
            uint64_t d = (x * 104729) % c->nkeys;
            int r = nvh_btree_delete(t, bt_key_of(d));
            if (r != (m.ver[d] ? NVH_OK : NVH_E_NOTFOUND)) rc = complain(pt, 8, "delete after recovery", d, 0);
            op del = {(uint32_t)d, 0};
            apply(&m, &del);
        }
    }
    if (!rc && nvh_btree_reclaim(t) != NVH_OK) rc = complain(pt, 9, "reclaim", 0, 0);
    if (!rc && nvh_btree_check(t) != NVH_OK) {
        fprintf(stderr, "  checker: %s\n", nvh_errormsg());
        rc = complain(pt, 10, "invariants broken after writes", 0, 0);
    }
    bt_scan_free(&o);
    if (!rc) {
        nvh_btree_scan(t, 0, UINT64_MAX, bt_scan_cb, &o);
        if (!bt_scan_matches(&o, &m, c->maxlen)) rc = complain(pt, 11, "writes after recovery lost", o.n, m.live);
    }
    bt_model_free(&m);
out:
    bt_scan_free(&o);
    nvh_btree_close(t);
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Harness
 * ------------------------------------------------------------------------- */
static nvh_crash_report explore(cfg *c, nvh_crash_mode mode, uint64_t budget, unsigned images,
                                uint64_t pool_size)
{
    const char *path = test_path("bt-crash");
    nvh_pool *pool = nvh_pool_create(path, BT_LAYOUT, pool_size, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (uint64_t i = 0; i < g_shared_len; i++) g_shared[i] = i ? -1 : 0;
    nvh_crash_config cc = {
        .pool_path = path, .layout = BT_LAYOUT, .workload = workload, .check = check,
        .arg = c, .seed = 3 + mode, .mode = mode, .budget = budget,
        .images_per_point = images, .scratch_dir = g_scratch,
        .keep_failed_images = getenv("BT_KEEP_IMAGES") != NULL,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cc, &rep), NVH_OK);
    if (rep.failures && !c->fault) nvh_crash_report_print(&rep, stderr);
    unlink(path);
    return rep;
}

/* The recovered ops per fence: never below the acknowledged watermark
 * (checked by the children); report how it advances. */
static void report_progress(const char *what, const nvh_crash_report *rep, uint64_t nops)
{
    int64_t last = -1;
    uint64_t advanced = 0, points = 0;
    for (uint64_t f = 0; f <= rep->fences && f + 1 < g_shared_len; f++) {
        int64_t j = g_shared[1 + f];
        if (j < 0) continue;
        points++;
        if (j > last) advanced++;
        if (j > last) last = j;
    }
    printf("  %-28s %5llu fences, %5llu images, recovered ops reached %lld of %llu (%llu advances)\n",
           what, (unsigned long long)rep->fences, (unsigned long long)rep->points_tested,
           (long long)last, (unsigned long long)nops, (unsigned long long)advanced);
    (void)points;
}

static int g_on_return;   /* run_every_fence*: the default durability */

/* Crash points of a variant run in the default suite: a sample keeps the
 * suite's time bounded on a loaded machine (every fence of all variants
 * takes ~8x the default mode's); NVHEAP_TEST_DEEP (any value) runs every
 * fence of each. */
#define VARIANT_SAMPLE 64u
static uint64_t variant_budget(void)
{
    return getenv("NVHEAP_TEST_DEEP") ? 0 : VARIANT_SAMPLE;
}

static void run_every_fence_len(nvh_btree_mode mode, nvh_crash_mode cmode, const char *what,
                                uint64_t inserts, uint64_t updates, uint64_t deletes,
                                unsigned images, unsigned maxlen, uint64_t budget)
{
    cfg c = {.mode = mode, .nkeys = inserts, .maxlen = maxlen, .sync_every = 50,
             .on_return = g_on_return};
    c.ops = make_ops(c.nkeys, inserts, updates, deletes, 17, &c.nops);
    nvh_crash_report rep = explore(&c, cmode, budget, images, maxlen > MAXLEN ? 16u << 20 : 4u << 20);
    report_progress(what, &rep, c.nops);
    printf("  %-28s splits %llu (root %llu), leaves removed %llu, slabs %llu (freed %llu)\n", "",
           (unsigned long long)g_stats.splits, (unsigned long long)g_stats.root_splits,
           (unsigned long long)g_stats.leaves_removed, (unsigned long long)g_stats.slabs,
           (unsigned long long)g_stats.slabs_freed);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
    assert_true(rep.fences > 0);
    /* the runs exercise what they claim: splits, a root split, merges */
    assert_true(g_stats.splits >= 2);
    assert_true(g_stats.root_splits >= 1);
    assert_true(g_stats.leaves_removed >= 1);
    /* at the end everything is durable */
    assert_int_equal(g_shared[1 + rep.fences] >= 0 ? (uint64_t)g_shared[1 + rep.fences] : c.nops, c.nops);
    /* big values: records in slabs of their own, freed by updates/deletes */
    if (maxlen > MAXLEN) assert_true(g_stats.slabs_freed >= 10);
    free(c.ops);
}

static void run_every_fence(nvh_btree_mode mode, nvh_crash_mode cmode, const char *what,
                            uint64_t inserts, uint64_t updates, uint64_t deletes, unsigned images,
                            uint64_t budget)
{
    run_every_fence_len(mode, cmode, what, inserts, updates, deletes, images, MAXLEN, budget);
}

static void every_fence_groups_lines(void **s)
{
    (void)s;
    /* 150 keys: leaves split, the root splits; 60 deletes empty leaves */
    run_every_fence(NVH_BTREE_GROUPS, NVH_CRASH_LINES, "groups, lines", 150, 30, 100, 2, 0);
}
static void every_fence_groups_words(void **s)
{
    (void)s;
    run_every_fence(NVH_BTREE_GROUPS, NVH_CRASH_WORDS, "groups, words", 150, 30, 100, 1,
                    variant_budget());
}
/* The default: every put and delete durable when it returns. The checker
 * demands every op that returned (the durable watermark advances at each
 * return) and sees at most the one op in flight. No explicit syncs. */
static void every_fence_durable(nvh_crash_mode cmode, const char *what, unsigned maxlen,
                                uint64_t budget)
{
    g_on_return = 1;
    run_every_fence_len(NVH_BTREE_GROUPS, cmode, what, 150, 30, 100, 1, maxlen, budget);
    g_on_return = 0;
}
static void every_fence_durable_lines(void **s)
{
    (void)s;
    every_fence_durable(NVH_CRASH_LINES, "durable (default), lines", MAXLEN, 0);
}
static void every_fence_durable_words(void **s)
{
    (void)s;
    every_fence_durable(NVH_CRASH_WORDS, "durable (default), words", MAXLEN, variant_budget());
}
static void every_fence_durable_big(void **s)
{
    (void)s;
    every_fence_durable(NVH_CRASH_LINES, "durable (default), big", BIGLEN, variant_budget());
}

static void every_fence_flush(void **s)
{
    (void)s;
    run_every_fence(NVH_BTREE_FLUSH, NVH_CRASH_LINES, "flush, lines", 150, 10, 100, 1,
                    variant_budget());
}
static void every_fence_nt(void **s)
{
    (void)s;
    run_every_fence(NVH_BTREE_NT, NVH_CRASH_LINES, "nt, lines", 150, 10, 100, 1,
                    variant_budget());
}

static void every_fence_big_values(void **s)
{
    (void)s;
    /* values up to 20 000 B: a fifth get a slab of their own, which the
     * update or delete of the key frees (nvh_free unlinking the slab list) */
    run_every_fence_len(NVH_BTREE_GROUPS, NVH_CRASH_LINES, "groups, big values", 150, 30, 100, 1,
                        BIGLEN, variant_budget());
}

static void sampled_1e5(void **s)
{
    (void)s;
    cfg c = {.mode = NVH_BTREE_GROUPS, .nkeys = 50000, .maxlen = 16, .sync_every = 5000};
    c.ops = make_ops(c.nkeys, 50000, 30000, 20000, 23, &c.nops);
    assert_int_equal(c.nops, 100000);
    nvh_crash_report rep = explore(&c, NVH_CRASH_LINES, 24, 1, 16u << 20);
    report_progress("groups, 1e5 ops, sampled", &rep, c.nops);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
    assert_true(rep.points_tested >= 24);
    free(c.ops);
}

/* Negative controls: the same exploration of a deliberately broken tree
 * must fail. Validation before the data is durable (the slot points at the
 * record in the record's own group, so a crash can keep the pointer and
 * lose the data): a torn or foreign value. New nodes of a split activated
 * without being flushed: the parent's pointer survives, the node not.
 * (negative_ack_early below: acknowledged before the validation's fence.) */
static void negative_control(unsigned fault, const char *what)
{
    cfg c = {.mode = NVH_BTREE_GROUPS, .nkeys = 150, .maxlen = MAXLEN, .sync_every = 50, .fault = fault,
             .on_return = fault == BT_FAULT_NO_VALIDATION_FENCE};
    c.ops = make_ops(c.nkeys, 150, 30, 100, 17, &c.nops);
    printf("  negative control (%s): the checker must complain\n", what);
    nvh_crash_report rep = explore(&c, NVH_CRASH_LINES, 0, 1, 4u << 20);
    printf("  %-28s %5llu fences, %5llu images, %llu caught\n", what, (unsigned long long)rep.fences,
           (unsigned long long)rep.points_tested, (unsigned long long)rep.failures);
    assert_int_equal(rep.workload_status, 0);
    assert_true(rep.failures > 0);
    free(c.ops);
}
static void negative_validate_early(void **s)
{
    (void)s;
    negative_control(BT_FAULT_VALIDATE_EARLY, "validation before data");
}
static void negative_node_unflushed(void **s)
{
    (void)s;
    negative_control(BT_FAULT_NODE_UNFLUSHED, "split nodes unflushed");
}
/* An insert acknowledged at its validation (flushed, no fence yet) instead
 * of at a later group's action: the crash before the next fence loses an
 * acknowledged key. Guards the rule that validations are acknowledged only
 * by the action of a group begun after them (bt_ack_upto). */
static void negative_ack_early(void **s)
{
    (void)s;
    negative_control(BT_FAULT_ACK_EARLY, "ack before validation fence");
}

/* The default durability's put returning before its validation is fenced:
 * a crash right after the return loses the key. */
static void negative_durable_unfenced(void **s)
{
    (void)s;
    negative_control(BT_FAULT_NO_VALIDATION_FENCE, "durable put unfenced");
}

int main(int argc, char **argv)
{
    if (argc == 5) {
        /* debugging: test_btree_crash IMAGE FENCE DURABLE ISSUED re-runs the
         * checker of every_fence_groups_lines on a kept image */
        cfg c = {.mode = NVH_BTREE_GROUPS, .nkeys = 150, .maxlen = MAXLEN, .sync_every = 50};
        c.ops = make_ops(c.nkeys, 150, 30, 100, 17, &c.nops);
        g_shared_len = 1;
        static int64_t sh[1];
        g_shared = sh;
        g_durable = strtoull(argv[3], NULL, 0);
        g_issued = strtoull(argv[4], NULL, 0);
        nvh_crash_point pt = {.fence = strtoull(argv[2], NULL, 0)};
        return check(argv[1], &pt, &c);
    }
    g_scratch = getenv("NVHEAP_TEST_DIR");
    if (g_scratch) mkdir(g_scratch, 0700);
    g_shared_len = 1u << 20;
    g_shared = mmap(NULL, g_shared_len * sizeof *g_shared, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_shared == MAP_FAILED) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_fence_groups_lines),
        cmocka_unit_test(every_fence_groups_words),
        cmocka_unit_test(every_fence_durable_lines),
        cmocka_unit_test(every_fence_durable_words),
        cmocka_unit_test(every_fence_durable_big),
        cmocka_unit_test(every_fence_flush),
        cmocka_unit_test(every_fence_nt),
        cmocka_unit_test(every_fence_big_values),
        cmocka_unit_test(sampled_1e5),
        cmocka_unit_test(negative_validate_early),
        cmocka_unit_test(negative_node_unflushed),
        cmocka_unit_test(negative_ack_early),
        cmocka_unit_test(negative_durable_unfenced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
