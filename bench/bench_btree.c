/* bench_btree.c — the consistent B+ tree vs its variants and PMDK's btree_map ([Moraru11] Fig. 7, Fig. 5)
 *
 * Cases (docs/BENCHMARKS.md, section "btree"):
 *   insert/256B, insert/4KB   inserts/s of N random 8-byte keys with 256 B or
 *                             4 KiB values into an empty tree (1 thread),
 *                             durable at the end (the groups variants include
 *                             the final sync in the time)
 *   lookup/256B, lookup/4KB   lookups/s of the same keys in another random
 *                             order, reading the value's first and last byte
 *   insert-cpu/..., lookup-cpu/...   the same runs measured in process CPU
 *                             time (user + system, all threads) instead of
 *                             wall time: on a shared, loaded machine the
 *                             ratio that stays meaningful
 *   wear_cdf/W                Fig. 5: fraction of the 64 B lines of node
 *                             memory written at most W times during N_wear
 *                             inserts, "original" (classic sorted nodes,
 *                             in-place splits) vs "modified" (this tree)
 * Subjects:
 *   volatile      the same tree in DRAM (malloc), no flush, no fence
 *   flush         flush + fence at every step (3 fences per insert)
 *   nt            non-temporal stores + fence (3 fences per insert)
 *   durable       the default tree: persist-group design, every put
 *                 durable when it returns (NVH_BTREE_DURABLE_ON_RETURN:
 *                 2 fences per insert)
 *   groups        persist groups, REAL model, opt-in deferred durability
 *                 (NVH_BTREE_DURABLE_DEFERRED: puts acknowledged by later
 *                 fences, batched)
 *   groups-lower  deferred, SIM_LOWER: transient states last forever (a lower bound)
 *   groups-upper  deferred, SIM_UPPER: transient states end at once (an upper bound;
 *                 not crash-consistent)
 *   groups-nodir  deferred groups without the DRAM key directory (no_key_directory):
 *                 lookups descend the tree, inserts skip the directory
 *   classic-tx    a classic sorted-node B+ tree (btree_classic.c: keys sorted
 *                 in 1 KiB nodes of 60 entries, shift on insert, in-place
 *                 splits; [Moraru11] §8.3's "original" tree) on nvheap's
 *                 public API, one nvheap transaction per insert (crash-
 *                 consistent). Its lookups are the reference of the paper's
 *                 "68-90 % of the classic tree's read throughput": case
 *                 classic_ratio/lookup-SIZE gives each subject's lookups/s
 *                 divided by classic-tx's in the same run (median of runs),
 *                 in wall time (vs_classic) and process CPU time
 *                 (vs_classic_cpu, the one to quote on a loaded machine)
 *   classic-flush the same classic tree, flush + fence per step like the
 *                 paper's (b) (3 fences per insert; no log, so a crash in a
 *                 shift can lose an entry: a lower bound for a consistent one)
 *   classic-nt    the same, every changed node line and the value written
 *                 with non-temporal stores (the paper's (d), MOVNT). The
 *                 paper's (c), write-combining memory, needs a WC mapping
 *                 of ordinary memory, which Linux does not offer to user
 *                 space (no user-space PAT control; only device BARs and
 *                 drivers map WC): not measurable here
 *   pmdk          PMDK's btree_map example (order 8, sorted nodes), one
 *                 transaction per insert that also pmemobj_tx_alloc's and
 *                 fills the value (like for like: nvheap allocates the value
 *                 in its own allocation too)
 * nvheap runs in the pmem domain on --dir (default /dev/shm: CLWB + SFENCE);
 * PMDK with PMEM_IS_PMEM_FORCE=1 on the same directory. The whole program
 * re-runs in a child with that variable set (libpmem reads it at load).
 *
 * Both pools are prefaulted at create (nvheap's NVH_POOL_PREFAULT, PMDK's
 * prefault.at_create), outside the timed loops, unless --no-prefault: on
 * this kind of VM mapping a page costs 1-2 us, ~0.09 pages per insert,
 * which is 15-20 % of an nvheap insert but 3 % of a PMDK one — a cost of
 * the VM's page tables rather than of either library. --no-prefault gives
 * the figures with first-touch faults inside the loops.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "btree_classic.h"

#ifdef NVH_BENCH_PMDK_BTREE
#include <libpmemobj.h>
#include "btree_map.h"
#endif

#define MIB (1024ull * 1024ull)

static const bench_info info = {
    .name = "btree",
    .summary = "B+ tree inserts/lookups vs volatile, flush, NT variants and PMDK btree_map; wear CDF",
    .baseline = "pmdk",
    .ratio_metric = "ops_per_s",
    .usage = "  --n N        entries for 256 B values (default 1000000, quick 5000)\n"
             "  --n4k N      entries for 4 KiB values (default 250000, quick 1000)\n"
             "  --wear-n N   inserts for the wear CDF (default 1000000, quick 5000)\n"
             "  --no-prefault  pools are not prefaulted at create (first-touch page\n"
             "               faults inside the timed loops, both libraries)\n"
             "  --subjects LIST  comma-separated subjects to run (default all: volatile,\n"
             "               flush,nt,durable,groups,groups-lower,groups-upper,groups-nodir,\n"
             "               classic-tx,classic-flush,classic-nt,pmdk)\n",
};

typedef struct subject {
    const char *name;
    nvh_btree_mode mode;
    nvh_group_model model;
    int no_key_directory;
    nvh_btree_durability durability;
} subject;

static const subject g_subjects[] = {
    {"volatile", NVH_BTREE_VOLATILE, NVH_GROUP_REAL, 0, 0},
    {"flush", NVH_BTREE_FLUSH, NVH_GROUP_REAL, 0, 0},
    {"nt", NVH_BTREE_NT, NVH_GROUP_REAL, 0, 0},
    {"durable", NVH_BTREE_GROUPS, NVH_GROUP_REAL, 0, NVH_BTREE_DURABLE_ON_RETURN},  /* the default */
    {"groups", NVH_BTREE_GROUPS, NVH_GROUP_REAL, 0, NVH_BTREE_DURABLE_DEFERRED},
    {"groups-lower", NVH_BTREE_GROUPS, NVH_GROUP_SIM_LOWER, 0, NVH_BTREE_DURABLE_DEFERRED},
    {"groups-upper", NVH_BTREE_GROUPS, NVH_GROUP_SIM_UPPER, 0, NVH_BTREE_DURABLE_DEFERRED},
    {"groups-nodir", NVH_BTREE_GROUPS, NVH_GROUP_REAL, 1, NVH_BTREE_DURABLE_DEFERRED},
};

/* Pools prefaulted at create (both libraries): --no-prefault clears it. */
static int g_prefault = 1;
/* --subjects: the subjects to run (NULL: all) */
static const char *g_subject_list;

static int subject_wanted(const char *name)
{
    if (!g_subject_list) return 1;
    size_t n = strlen(name);
    for (const char *p = g_subject_list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* N distinct random keys (a bijective mix of 1..N), and a shuffled copy. */
static void make_keys(uint64_t n, uint64_t **ins, uint64_t **look)
{
    *ins = malloc(n * sizeof **ins);
    *look = malloc(n * sizeof **look);
    if (!*ins || !*look) { perror("malloc"); exit(1); }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t s = i + 1;
        (*ins)[i] = bench_rand(&s);
        (*look)[i] = (*ins)[i];
    }
    uint64_t s = 77;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = bench_rand(&s) % (i + 1), x = (*look)[i];
        (*look)[i] = (*look)[j];
        (*look)[j] = x;
    }
}

/* ==========================================================================
 * nvheap subjects
 * ========================================================================== */
/* Process CPU time (user + system of every thread), ns. */
static uint64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct run_result {
    double insert_ns, lookup_ns;
    double insert_cpu_ns, lookup_cpu_ns;
    bench_counts counts;
    int ok;
} run_result;

/* A pool that grew inside the timed loop was populated inside it too: its
 * growth would be timed as part of the inserts. */
static void check_no_growth(const bench_opts *opts, const char *name, nvh_pool *pool,
                            uint64_t size0)
{
    if (nvh_pool_size(pool) > size0)
        bench_error(opts, "%s: the pool grew inside the timed loop (%llu -> %llu MiB): raise the "
                    "size estimate", name, (unsigned long long)(size0 >> 20),
                    (unsigned long long)(nvh_pool_size(pool) >> 20));
}

/* The lookup phase, the same for every tree: look up look[0..n) through
 * `get`, touching each value's first and last byte, timed into res. False
 * (recorded) if a key is missing. Static inline with a constant `get` at
 * each call, so the compiler can make the call direct. */
typedef int (*tree_get_fn)(void *t, uint64_t key, const void **value, size_t *len);
static inline bool time_lookups(const bench_opts *opts, const char *name, tree_get_fn get,
                                void *t, uint64_t n, const uint64_t *look, run_result *res)
{
    volatile uint64_t sink = 0;
    uint64_t c0 = cpu_now_ns();
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        const void *v;
        size_t len;
        if (get(t, look[i], &v, &len) != NVH_OK) {
            bench_error(opts, "%s: key missing", name);
            return false;
        }
        sink += ((const unsigned char *)v)[0] + ((const unsigned char *)v)[len - 1];
    }
    res->lookup_ns = (double)(bench_now_ns() - t0);
    res->lookup_cpu_ns = (double)(cpu_now_ns() - c0);
    (void)sink;
    return true;
}

static int btree_get(void *t, uint64_t key, const void **value, size_t *len)
{
    return nvh_btree_get(t, key, value, len);
}

static int classic_get(void *t, uint64_t key, const void **value, size_t *len)
{
    return ct_get(t, key, value, len);
}

static run_result run_nvheap(const bench_opts *opts, const subject *sub, uint64_t n,
                             size_t vlen, const uint64_t *ins, const uint64_t *look)
{
    run_result res = {0};
    unsigned char *val = malloc(vlen);
    memset(val, 0x5a, vlen);
    nvh_pool *pool = NULL;
    const char *path = NULL;
    if (sub->mode != NVH_BTREE_VOLATILE) {
        path = bench_scratch_path(opts, NULL, sub->name);
        /* records (rounded to 64 B) + nodes (~1 KiB per 30 entries) + slack */
        uint64_t need = n * ((vlen + 32 + 63) / 64 * 64 + 64) + 64 * MIB;
        nvh_pool_options po = {.max_size = need * 2};
        pool = nvh_pool_create_ex(path, "bench", need,
                                  NVH_DOMAIN_PMEM | (g_prefault ? NVH_POOL_PREFAULT : 0), &po);
        if (!pool) {
            bench_error(opts, "%s: pool: %s", sub->name, nvh_errormsg());
            free(val);
            return res;
        }
    }
    nvh_group_options go = {.model = sub->model};
    if (sub->model != NVH_GROUP_REAL) go.slots = 8192;   /* the paper's 8 K counters */
    nvh_btree_options bo = {.mode = sub->mode, .group = &go,
                            .no_key_directory = sub->no_key_directory,
                            .durability = sub->durability};
    nvh_btree *t = nvh_btree_open(pool, "bench", 1, &bo);
    if (!t) {
        bench_error(opts, "%s: open: %s", sub->name, nvh_errormsg());
        goto out;
    }
    if (pool) bench_counts_begin(pool);
    uint64_t size0 = pool ? nvh_pool_size(pool) : 0;
    uint64_t c0 = cpu_now_ns();
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        memcpy(val, &ins[i], 8);
        if (nvh_btree_put(t, ins[i], val, vlen) != NVH_OK) {
            bench_error(opts, "%s: put: %s", sub->name, nvh_errormsg());
            goto out;
        }
    }
    if (nvh_btree_sync(t) != NVH_OK) bench_error(opts, "%s: sync: %s", sub->name, nvh_errormsg());
    res.insert_ns = (double)(bench_now_ns() - t0);
    res.insert_cpu_ns = (double)(cpu_now_ns() - c0);
    if (pool) res.counts = bench_counts_per_op(pool, n);
    if (pool) check_no_growth(opts, sub->name, pool, size0);
    if (!time_lookups(opts, sub->name, btree_get, t, n, look, &res)) goto out;
    res.ok = nvh_btree_count(t) == n;
    if (!res.ok) bench_error(opts, "%s: count %llu != %llu", sub->name,
                             (unsigned long long)nvh_btree_count(t), (unsigned long long)n);
out:
    nvh_btree_close(t);
    if (pool) nvh_pool_close(pool);
    if (path) bench_scratch_remove(path);
    free(val);
    return res;
}

/* ==========================================================================
 * The classic sorted-node tree (btree_classic.c)
 * ========================================================================== */
typedef struct classic_subject {
    const char *name;
    ct_mode mode;
} classic_subject;

static const classic_subject g_classic[] = {
    {"classic-tx", CT_TX},
    {"classic-flush", CT_FLUSH},
    {"classic-nt", CT_NT},
};

static run_result run_classic(const bench_opts *opts, const classic_subject *sub, uint64_t n,
                              size_t vlen, const uint64_t *ins, const uint64_t *look)
{
    run_result res = {0};
    unsigned char *val = malloc(vlen);
    memset(val, 0x5a, vlen);
    const char *path = bench_scratch_path(opts, NULL, sub->name);
    /* records (value + 16 B header: up to 4032 B in 64 B size classes;
     * larger ones counted as whole 4 KiB blocks after a 64 B header line,
     * an upper bound: the classes above 4032 B pack them tighter) + nodes
     * (1 KiB per 30-60 entries) + slack */
    uint64_t rec = vlen + 16 <= 4032 ? (vlen + 16 + 63) / 64 * 64 : (vlen + 16 + 64 + 4095) / 4096 * 4096;
    uint64_t need = n * (rec + 40) + 64 * MIB;
    nvh_pool_options po = {.max_size = need * 2};
    /* classic-nt streams whole node lines: the pool's NT threshold (read
     * when it is created) must let 64 B copies through */
    char *old = getenv("NVHEAP_NT_THRESHOLD");
    char saved[32] = "";
    if (old) snprintf(saved, sizeof saved, "%s", old);
    if (sub->mode == CT_NT) setenv("NVHEAP_NT_THRESHOLD", "64", 1);
    nvh_pool *pool = nvh_pool_create_ex(path, "bench", need,
                                        NVH_DOMAIN_PMEM | (g_prefault ? NVH_POOL_PREFAULT : 0), &po);
    if (sub->mode == CT_NT) {
        if (old) setenv("NVHEAP_NT_THRESHOLD", saved, 1);
        else unsetenv("NVHEAP_NT_THRESHOLD");
    }
    if (!pool) {
        bench_error(opts, "%s: pool: %s", sub->name, nvh_errormsg());
        free(val);
        return res;
    }
    ct_tree *t = ct_open(pool, "bench", sub->mode, 1);
    if (!t) {
        bench_error(opts, "%s: create: %s", sub->name, nvh_errormsg());
        goto out;
    }
    bench_counts_begin(pool);
    uint64_t size0 = nvh_pool_size(pool);
    uint64_t c0 = cpu_now_ns();
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        memcpy(val, &ins[i], 8);
        if (ct_put(t, ins[i], val, vlen) != NVH_OK) {
            bench_error(opts, "%s: put: %s", sub->name, nvh_errormsg());
            goto out;
        }
    }
    res.insert_ns = (double)(bench_now_ns() - t0);
    res.insert_cpu_ns = (double)(cpu_now_ns() - c0);
    res.counts = bench_counts_per_op(pool, n);
    check_no_growth(opts, sub->name, pool, size0);
    if (!time_lookups(opts, sub->name, classic_get, t, n, look, &res)) goto out;
    res.ok = ct_count(t) == n && ct_check(t) == NVH_OK;
    if (!res.ok) bench_error(opts, "%s: check failed (count %llu of %llu)", sub->name,
                             (unsigned long long)ct_count(t), (unsigned long long)n);
out:
    if (t) ct_close(t);
    nvh_pool_close(pool);
    bench_scratch_remove(path);
    free(val);
    return res;
}

/* ==========================================================================
 * PMDK btree_map
 * ========================================================================== */
#ifdef NVH_BENCH_PMDK_BTREE
POBJ_LAYOUT_BEGIN(bench_btree);
POBJ_LAYOUT_ROOT(bench_btree, struct bench_root);
POBJ_LAYOUT_END(bench_btree);
struct bench_root {
    TOID(struct btree_map) map;
};

/* One insert: the value allocated and filled in the insert's transaction.
 * Returns 0, or 1 if the transaction aborted. */
static __attribute__((noinline)) int pmdk_insert(PMEMobjpool *pop, TOID(struct btree_map) map,
                                                 uint64_t key, const unsigned char *val, size_t vlen)
{
    volatile int failed = 0;
    TX_BEGIN(pop) {
        PMEMoid v = pmemobj_tx_alloc(vlen, 1);
        memcpy(pmemobj_direct(v), val, vlen);
        btree_map_insert(pop, map, key, v);
    } TX_ONABORT {
        failed = 1;
    } TX_END
    return failed;
}

static run_result run_pmdk(const bench_opts *opts, uint64_t n, size_t vlen, const uint64_t *ins,
                           const uint64_t *look)
{
    run_result res = {0};
    const char *path = bench_scratch_path(opts, NULL, "pmdk");
    uint64_t need = n * (vlen + 64 + 200) + 256 * MIB;
    int prefault = g_prefault;
    if (pmemobj_ctl_set(NULL, "prefault.at_create", &prefault) != 0)
        bench_error(opts, "pmdk: prefault.at_create: %s", pmemobj_errormsg());
    PMEMobjpool *pop = pmemobj_create(path, POBJ_LAYOUT_NAME(bench_btree), need, 0600);
    if (!pop) {
        bench_error(opts, "pmdk: pmemobj_create: %s", pmemobj_errormsg());
        return res;
    }
    TOID(struct bench_root) root = POBJ_ROOT(pop, struct bench_root);
    if (btree_map_create(pop, &D_RW(root)->map, NULL) != 0) {
        bench_error(opts, "pmdk: btree_map_create failed");
        goto out;
    }
    TOID(struct btree_map) map = D_RO(root)->map;
    unsigned char *val = malloc(vlen);
    memset(val, 0x5a, vlen);
    uint64_t c0 = cpu_now_ns();
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        memcpy(val, &ins[i], 8);
        if (pmdk_insert(pop, map, ins[i], val, vlen)) {
            bench_error(opts, "pmdk: insert aborted");
            free(val);
            goto out;
        }
    }
    res.insert_ns = (double)(bench_now_ns() - t0);
    res.insert_cpu_ns = (double)(cpu_now_ns() - c0);
    free(val);
    volatile uint64_t sink = 0;
    c0 = cpu_now_ns();
    t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i++) {
        PMEMoid v = btree_map_get(pop, map, look[i]);
        if (OID_IS_NULL(v)) {
            bench_error(opts, "pmdk: key missing");
            goto out;
        }
        const unsigned char *p = pmemobj_direct(v);
        sink += p[0] + p[vlen - 1];
    }
    res.lookup_ns = (double)(bench_now_ns() - t0);
    res.lookup_cpu_ns = (double)(cpu_now_ns() - c0);
    (void)sink;
    res.ok = 1;
out:
    pmemobj_close(pop);
    bench_scratch_remove(path);
    return res;
}
#endif

/* ==========================================================================
 * Throughput cases
 * ========================================================================== */
static void emit_runs(const bench_opts *opts, const char *label, const char *subject,
                      const run_result *r, unsigned runs, uint64_t n, int counts)
{
    double ins[16], look[16], ins_ns[16], look_ns[16], ins_c[16], look_c[16];
    unsigned k = 0;
    for (unsigned i = 0; i < runs; i++) {
        if (!r[i].ok) continue;
        ins[k] = (double)n / (r[i].insert_ns / 1e9);
        look[k] = (double)n / (r[i].lookup_ns / 1e9);
        ins_ns[k] = r[i].insert_ns / (double)n;
        look_ns[k] = r[i].lookup_ns / (double)n;
        ins_c[k] = (double)n / (r[i].insert_cpu_ns / 1e9);
        look_c[k] = (double)n / (r[i].lookup_cpu_ns / 1e9);
        k++;
    }
    if (!k) return;
    char c[64];
    snprintf(c, sizeof c, "insert/%s", label);
    bench_emit(opts, c, subject, "ops_per_s", bench_summarize(ins, k), "ops/s");
    bench_emit(opts, c, subject, "ns_per_op", bench_summarize(ins_ns, k), "ns");
    if (counts) bench_emit_counts(opts, c, subject, &r[0].counts);
    snprintf(c, sizeof c, "lookup/%s", label);
    bench_emit(opts, c, subject, "ops_per_s", bench_summarize(look, k), "ops/s");
    bench_emit(opts, c, subject, "ns_per_op", bench_summarize(look_ns, k), "ns");
    snprintf(c, sizeof c, "insert-cpu/%s", label);
    bench_emit(opts, c, subject, "ops_per_s", bench_summarize(ins_c, k), "ops/cpu-s");
    snprintf(c, sizeof c, "lookup-cpu/%s", label);
    bench_emit(opts, c, subject, "ops_per_s", bench_summarize(look_c, k), "ops/cpu-s");
}

static void throughput(const bench_opts *opts, const char *label, uint64_t n, size_t vlen)
{
    char ins_case[64], look_case[64];
    snprintf(ins_case, sizeof ins_case, "insert/%s", label);
    snprintf(look_case, sizeof look_case, "lookup/%s", label);
    if (!bench_selected(opts, ins_case) && !bench_selected(opts, look_case)) return;
    uint64_t *ins, *look;
    make_keys(n, &ins, &look);
    unsigned runs = opts->runs > 16 ? 16 : opts->runs;
    enum { NSUB = sizeof g_subjects / sizeof g_subjects[0] };
    enum { NCL = sizeof g_classic / sizeof g_classic[0] };
    static run_result r[NSUB + 1][16], rc[NCL][16];
    /* Runs interleave the subjects (run 1 of each, then run 2 of each, ...)
     * so that load changes on a shared machine hit them alike. */
    for (unsigned i = 0; i < runs; i++) {
        for (size_t s = 0; s < NSUB; s++)
            if (subject_wanted(g_subjects[s].name))
                r[s][i] = run_nvheap(opts, &g_subjects[s], n, vlen, ins, look);
        for (size_t s = 0; s < NCL; s++)
            if (subject_wanted(g_classic[s].name))
                rc[s][i] = run_classic(opts, &g_classic[s], n, vlen, ins, look);
#ifdef NVH_BENCH_PMDK_BTREE
        if (subject_wanted("pmdk")) r[NSUB][i] = run_pmdk(opts, n, vlen, ins, look);
#endif
    }
    for (size_t s = 0; s < NSUB; s++)
        if (subject_wanted(g_subjects[s].name))
            emit_runs(opts, label, g_subjects[s].name, r[s], runs, n,
                      g_subjects[s].mode != NVH_BTREE_VOLATILE);
    for (size_t s = 0; s < NCL; s++)
        if (subject_wanted(g_classic[s].name))
            emit_runs(opts, label, g_classic[s].name, rc[s], runs, n, 1);
    /* [Moraru11] §8.3: lookups/s of each subject over the classic tree's
     * (classic-tx), run by run (same load), then the median */
    if (subject_wanted("classic-tx")) {
        char c[64];
        snprintf(c, sizeof c, "classic_ratio/lookup-%s", label);
        for (size_t s = 0; s <= NSUB; s++) {
            const char *name = s < NSUB ? g_subjects[s].name : "pmdk";
            if (!subject_wanted(name)) continue;
#ifndef NVH_BENCH_PMDK_BTREE
            if (s == NSUB) continue;
#endif
            double q[16], qc[16];
            unsigned k = 0;
            for (unsigned i = 0; i < runs; i++)
                if (r[s][i].ok && rc[0][i].ok) {
                    qc[k] = rc[0][i].lookup_cpu_ns / r[s][i].lookup_cpu_ns;
                    q[k++] = rc[0][i].lookup_ns / r[s][i].lookup_ns;
                }
            if (k) bench_emit(opts, c, name, "vs_classic", bench_summarize(q, k), "x");
            if (k) bench_emit(opts, c, name, "vs_classic_cpu", bench_summarize(qc, k), "x");
        }
    }
#ifdef NVH_BENCH_PMDK_BTREE
    emit_runs(opts, label, "pmdk", r[NSUB], runs, n, 0);
#else
    bench_note(opts, "PMDK btree_map example sources not found: pmdk not measured");
#endif
    free(ins);
    free(look);
}

/* ==========================================================================
 * Fig. 5: writes per line of node memory
 * ========================================================================== */
typedef struct hist {
    uint64_t *v;
    uint64_t n, cap;
} hist;

static void hist_add(uint64_t w, void *arg)
{
    hist *h = arg;
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 4096;
        h->v = realloc(h->v, h->cap * sizeof *h->v);
        if (!h->v) { perror("realloc"); exit(1); }
    }
    h->v[h->n++] = w;
}

static int u64cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void wear(const bench_opts *opts, uint64_t n)
{
    if (!bench_selected(opts, "wear_cdf")) return;
    uint64_t *ins, *look;
    make_keys(n, &ins, &look);
    const char *names[2] = {"original", "modified"};
    for (int v = 0; v < 2; v++) {
        nvh_pool *pool = NULL;
        const char *path = NULL;
        if (v == 1) {
            path = bench_scratch_path(opts, NULL, "wear");
            uint64_t need = n * 128 + 64 * MIB;
            nvh_pool_options po = {.max_size = need * 2};
            pool = nvh_pool_create_ex(path, "bench", need, NVH_DOMAIN_PMEM, &po);
            if (!pool) { bench_error(opts, "wear: pool: %s", nvh_errormsg()); break; }
        }
        nvh_btree_options bo = {.mode = v ? NVH_BTREE_GROUPS : NVH_BTREE_VOLATILE,
                                .sorted = v == 0, .count_wear = 1};
        nvh_btree *t = nvh_btree_open(pool, "wear", 1, &bo);
        if (!t) { bench_error(opts, "wear: open: %s", nvh_errormsg()); break; }
        for (uint64_t i = 0; i < n; i++) nvh_btree_put(t, ins[i], &ins[i], 8);
        nvh_btree_sync(t);
        hist h = {0};
        nvh_btree_wear_foreach(t, hist_add, &h);
        qsort(h.v, h.n, sizeof *h.v, u64cmp);
        /* CDF at powers of two and a few more points */
        uint64_t maxw = h.n ? h.v[h.n - 1] : 0;
        for (uint64_t w = 1;; w = w < 4 ? w + 1 : w * 2) {
            uint64_t below = 0;
            /* upper bound: lines with <= w writes */
            uint64_t a = 0, b = h.n;
            while (a < b) {
                uint64_t m = (a + b) / 2;
                if (h.v[m] <= w) a = m + 1; else b = m;
            }
            below = a;
            char c[64];
            snprintf(c, sizeof c, "wear_cdf/%llu", (unsigned long long)w);
            bench_emit(opts, c, names[v], "fraction", bench_exact((double)below / (double)h.n), "lines");
            if (w >= maxw) break;
        }
        bench_emit(opts, "wear_summary/max", names[v], "writes", bench_exact((double)maxw), "writes");
        bench_emit(opts, "wear_summary/p99", names[v], "writes",
                   bench_exact((double)h.v[(uint64_t)((double)(h.n - 1) * 0.99)]), "writes");
        bench_emit(opts, "wear_summary/p999", names[v], "writes",
                   bench_exact((double)h.v[(uint64_t)((double)(h.n - 1) * 0.999)]), "writes");
        bench_emit(opts, "wear_summary/lines", names[v], "lines", bench_exact((double)h.n), "lines");
        uint64_t total = 0;
        for (uint64_t i = 0; i < h.n; i++) total += h.v[i];
        bench_emit(opts, "wear_summary/writes", names[v], "writes", bench_exact((double)total), "writes");
        free(h.v);
        nvh_btree_close(t);
        if (pool) nvh_pool_close(pool);
        if (path) bench_scratch_remove(path);
    }
    free(ins);
    free(look);
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t n = opts.quick ? 5000 : 1000000, n4k = opts.quick ? 1000 : 250000;
    uint64_t nwear = opts.quick ? 5000 : 1000000;
    for (int i = 0; i < opts.argc; i++) {
        const char *a = opts.argv[i];
        if (!strcmp(a, "--no-prefault")) {
            g_prefault = 0;
            continue;
        }
        if (!strcmp(a, "--subjects") && i + 1 < opts.argc) {
            g_subject_list = opts.argv[++i];
            continue;
        }
        uint64_t *dst = !strcmp(a, "--n") ? &n : !strcmp(a, "--n4k") ? &n4k
                      : !strcmp(a, "--wear-n") ? &nwear : NULL;
        if (!dst || i + 1 >= opts.argc) bench_usage_error(&opts, "unknown option: %s", a);
        *dst = strtoull(opts.argv[++i], NULL, 0);
        if (*dst < 100) bench_usage_error(&opts, "%s: at least 100", a);
    }
    if (!opts.child) {
        /* libpmem reads PMEM_IS_PMEM_FORCE when it loads: run in a child */
        const char *envs[] = {"PMEM_IS_PMEM_FORCE=1", NULL};
        char sn[32], s4[32], sw[32];
        snprintf(sn, sizeof sn, "%llu", (unsigned long long)n);
        snprintf(s4, sizeof s4, "%llu", (unsigned long long)n4k);
        snprintf(sw, sizeof sw, "%llu", (unsigned long long)nwear);
        const char *args[] = {"--n", sn, "--n4k", s4, "--wear-n", sw,
                              "--subjects", g_subject_list ? g_subject_list : "volatile,flush,nt,"
                              "durable,groups,groups-lower,groups-upper,groups-nodir,classic-tx,"
                              "classic-flush,classic-nt,pmdk",
                              g_prefault ? NULL : "--no-prefault", NULL};
        bench_run_child(&opts, envs, args);
        return bench_finish(&opts);
    }
    bench_note(&opts, "nvheap: pmem domain on %s (%s); PMDK btree_map: PMEM_IS_PMEM_FORCE=1 on the "
               "same directory; %llu entries with 256 B values, %llu with 4 KiB; runs %u; "
               "pools %s", opts.dir, nvh_flush_kind_name(nvh_flush_kind_detect()),
               (unsigned long long)n, (unsigned long long)n4k, opts.runs,
               g_prefault ? "prefaulted at create (both libraries)" : "not prefaulted");
    throughput(&opts, "256B", n, 256);
    throughput(&opts, "4KB", n4k, 4096);
    wear(&opts, nwear);
    return bench_finish(&opts);
}
