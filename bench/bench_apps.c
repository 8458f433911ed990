/* bench_apps.c — NVTM's Fig. 6 applications ([Coburn09] §5.2): SSCA #2 graph kernels, 6-degrees BFS and the transactional B-tree, nvheap vs PMDK
 *
 * Each application (bench/app_ssca.c, app_sixdeg.c, app_btree.c) is written
 * once over a transaction backend (bench/apps.h) and runs on two subjects:
 *   nvheap   nvheap's object transactions (nvh_tx_run + nvh_tx_open_read /
 *            open_write + nvh_tx_alloc; isolated, optimistic), pmem domain
 *   pmdk     libpmemobj transactions (pmemobj_tx_add_range_direct of each
 *            object before it is written, pmemobj_tx_zalloc); PMDK has no
 *            isolation, so each operation holds the lock PMDK's API offers
 *            for it (TX_PARAM_RWLOCK on one pool-resident rwlock for the
 *            structure, TX_PARAM_MUTEX on one of 1024 pool-resident mutexes
 *            picked by vertex for SSCA), read-only operations a read lock
 *            and no transaction; PMEM_IS_PMEM_FORCE=1 on the same directory
 * Cases (T = 1, 2, 4, 8 threads; more threads than cores oversubscribe):
 *   ssca/build-Tt       kernel 1: add R-MAT edges (one edge per transaction)
 *   ssca/maxweight-Tt   analysis 1: a vertex's highest-weighted edge
 *                       (read-only transaction over its edge blocks)
 *   ssca/reweight-Tt    one edge's weight and its vertex's sum and maximum
 *   6deg/d6-Tt          alternate: is b within 6 links of a (BFS, read-only
 *                       transaction) / toggle the edge a->b (transaction)
 *   6deg/fof-Tt         the same with friend-of-friend queries (2 links)
 *   btree/toggle-Tt     the paper's B-tree operation: key present -> removed,
 *                       absent -> inserted
 *   btree/lookup-Tt     lookups only (read-only transactions)
 * Every run of a case does the same number of operations on each subject
 * (split over the threads; same random streams), the subjects alternate run
 * by run, and the structure carries over from run to run on both alike.
 * Metrics: ops_per_s (all threads), ns_per_op (wall time / operations),
 * cpu_ns_per_op (the threads' CPU time / operations: what one operation
 * costs a core, less sensitive to other processes on a shared machine; a
 * thread asleep on a PMDK lock costs no CPU, one spinning on an nvheap
 * ownership record does),
 * lines_per_op and fences_per_op (flushed lines and fences per transaction:
 * nvh_stats_get; PMDK's through pmdk_count.c), conflicts_per_op (nvheap).
 * The ratio column divides ns_per_op by PMDK's in the same case (< 1: faster).
 */
#include "bench_util.h"
#include "apps.h"
#include "pmdk_count.h"

#include <errno.h>
#include <libpmemobj.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)

static const bench_info info = {
    .name = "apps",
    .summary = "NVTM Fig. 6 applications: SSCA, 6-degrees, B-tree, nvheap vs PMDK",
    .baseline = "pmdk",
    .ratio_metric = "ns_per_op",
    .usage = "  --threads LIST     thread counts, comma-separated (default 1,2,4,8)\n",
};

/* ==========================================================================
 * PMDK's backend
 * ========================================================================== */
typedef struct pmdk_root {
    uint64_t slot[4];               /* the applications' root offsets */
    PMEMrwlock rw;
    PMEMmutex stripe[APP_STRIPES];
} pmdk_root;

static const void *pm_rd(app_be *be, const void *obj, size_t size)
{
    (void)be; (void)size;
    return obj;
}

static void *pm_wr(app_be *be, void *obj, size_t size)
{
    (void)be;
    return pmemobj_tx_add_range_direct(obj, size) == 0 ? obj : NULL;
}

static void *pm_alloc(app_be *be, size_t size)
{
    (void)be;
    PMEMoid oid = pmemobj_tx_zalloc(size, 1);
    return OID_IS_NULL(oid) ? NULL : pmemobj_direct(oid);
}

static int pm_run(app_be *be, app_lock lock, uint64_t key, app_fn fn, void *arg)
{
    PMEMobjpool *pop = (PMEMobjpool *)be->base;
    pmdk_root *r = be->ctx;
    int rc;
    if (lock == APP_LOCK_READ) {
        pmemobj_rwlock_rdlock(pop, &r->rw);
        rc = fn(be, arg);
        pmemobj_rwlock_unlock(pop, &r->rw);
        return rc;
    }
    if (lock == APP_LOCK_KEY_READ) {
        PMEMmutex *m = &r->stripe[key % APP_STRIPES];
        pmemobj_mutex_lock(pop, m);
        rc = fn(be, arg);
        pmemobj_mutex_unlock(pop, m);
        return rc;
    }
    if (lock == APP_LOCK_WRITE)
        rc = pmemobj_tx_begin(pop, NULL, TX_PARAM_RWLOCK, &r->rw, TX_PARAM_NONE);
    else
        rc = pmemobj_tx_begin(pop, NULL, TX_PARAM_MUTEX, &r->stripe[key % APP_STRIPES],
                              TX_PARAM_NONE);
    if (rc == 0) {
        rc = fn(be, arg);
        if (rc == 0) pmemobj_tx_commit();
        else if (pmemobj_tx_stage() == TX_STAGE_WORK) pmemobj_tx_abort(ECANCELED);
    }
    int end = pmemobj_tx_end();
    return rc ? rc : end;
}

/* ==========================================================================
 * Subjects
 * ========================================================================== */
enum { SSCA, SIXDEG, BTREE, NAPPS };

typedef struct subject {
    const char *name;
    app_be be;
    uint64_t *slot;                 /* NAPPS root slots in pool memory */
    nvh_pool *pool;                 /* nvheap */
    PMEMobjpool *pop;               /* pmdk   */
} subject;

static void counts_begin(subject *s)
{
    if (s->pool) { bench_counts_begin(s->pool); nvh_tx_stats_reset(s->pool); }
    else pmdk_count_reset();
}

static void counts_emit(const bench_opts *o, const char *c, subject *s, uint64_t ops)
{
    if (s->pool) {
        bench_counts k = bench_counts_per_op(s->pool, ops);
        bench_emit_counts(o, c, s->name, &k);
        nvh_tx_stats st;
        nvh_tx_stats_get(s->pool, &st);
        bench_emit(o, c, s->name, "conflicts_per_op", bench_exact((double)st.conflicts / ops), "");
    } else {
        pmdk_count k = pmdk_count_total();
        bench_emit(o, c, s->name, "lines_per_op", bench_exact((double)k.lines / ops), "lines");
        bench_emit(o, c, s->name, "fences_per_op", bench_exact((double)k.fences / ops), "fences");
    }
}

/* ==========================================================================
 * Workloads: op(subject, thread state, i) does operation i of a thread
 * ========================================================================== */
typedef struct work {
    int app, kind;
    uint32_t nv;                    /* vertices (graphs)              */
    uint64_t keys;                  /* key space (B-tree)             */
    uint64_t edge_base;             /* ssca/build: next edge index    */
} work;
enum { K_BUILD, K_MAXW, K_REWEIGHT, K_D6, K_FOF, K_TOGGLE, K_LOOKUP };

typedef struct worker {
    subject *s;
    const work *w;
    unsigned id, nt;
    uint64_t ops, rng;
    _Atomic int *go;
    int rc;
    double cpu_ns;                  /* the thread's CPU time in the loop */
} worker;

static int do_op(worker *k, uint64_t i)
{
    app_be *be = &k->s->be;
    const work *w = k->w;
    uint64_t root = k->s->slot[w->app];
    uint32_t s, d, wt;
    int f;
    switch (w->kind) {
    case K_BUILD:
        ssca_gen_edge(1, w->edge_base + i * k->nt + k->id, w->nv, &s, &d, &wt);
        return ssca_add_edge(be, root, s, d, wt);
    case K_MAXW:
        ssca_gen_edge(1, app_rand(&k->rng) % w->edge_base, w->nv, &s, &d, &wt);
        return ssca_max_weight(be, root, s, &wt);
    case K_REWEIGHT:
        ssca_gen_edge(1, app_rand(&k->rng) % w->edge_base, w->nv, &s, &d, &wt);
        return ssca_reweight(be, root, s, app_rand(&k->rng), 1 + (uint32_t)(app_rand(&k->rng) % w->nv));
    case K_D6:
    case K_FOF:
        s = (uint32_t)(app_rand(&k->rng) % w->nv);
        d = (uint32_t)(app_rand(&k->rng) % w->nv);
        if (i % 2) return sixdeg_toggle(be, root, s, d);
        return sixdeg_query(be, root, s, d, w->kind == K_D6 ? 6 : 2, &f, NULL);
    case K_TOGGLE:
        return btree_toggle(be, root, 1 + app_rand(&k->rng) % w->keys, &f);
    default:
        return btree_lookup(be, root, 1 + app_rand(&k->rng) % w->keys, &f);
    }
}

static void *worker_run(void *p)
{
    worker *k = p;
    if (!k->s->pool) pmdk_count_set_worker(k->id + 1);
    while (!atomic_load_explicit(k->go, memory_order_acquire)) {}
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    for (uint64_t i = 0; i < k->ops && !k->rc; i++) k->rc = do_op(k, i);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    k->cpu_ns = (double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec);
    sixdeg_thread_exit();
    return NULL;
}

/* Run `ops` operations over nt threads; wall ns, or -1 on a failed op;
 * *cpu_ns the threads' CPU time summed. */
static double run_ops(subject *s, const work *w, unsigned nt, uint64_t ops, uint64_t seed,
                      double *cpu_ns)
{
    _Atomic int go = 0;
    worker k[8];
    pthread_t th[8];
    for (unsigned i = 0; i < nt; i++) {
        k[i] = (worker){s, w, i, nt, ops / nt, seed * 0x9e3779b97f4a7c15ull + i * 7919 + 1, &go, 0, 0};
        pthread_create(&th[i], NULL, worker_run, &k[i]);
    }
    uint64_t t0 = bench_now_ns();
    atomic_store_explicit(&go, 1, memory_order_release);
    int rc = 0;
    *cpu_ns = 0;
    for (unsigned i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        if (k[i].rc) rc = k[i].rc;
        *cpu_ns += k[i].cpu_ns;
    }
    double ns = (double)(bench_now_ns() - t0);
    return rc ? -1 : ns;
}

static const char *kind_name[] = {"ssca/build", "ssca/maxweight", "ssca/reweight", "6deg/d6",
                                  "6deg/fof", "btree/toggle", "btree/lookup"};

/* One case at one thread count: runs alternate between the subjects. */
static void measure(const bench_opts *o, subject *subj, work *w, unsigned nt, uint64_t ops)
{
    char c[64];
    snprintf(c, sizeof c, "%s-%ut", kind_name[w->kind], nt);
    if (!bench_selected(o, c)) return;
    ops -= ops % nt;
    double ns[2][64], cpu[2][64];
    for (int s = 0; s < 2; s++) counts_begin(&subj[s]);
    for (unsigned r = 0; r < o->runs; r++) {
        for (int s = 0; s < 2; s++) {
            double t = run_ops(&subj[s], w, nt, ops, r + 1, &cpu[s][r]);
            if (t < 0) {
                bench_error(o, "%s: %s: an operation failed: %s", c, subj[s].name,
                            subj[s].pool ? nvh_errormsg() : pmemobj_errormsg());
                return;
            }
            ns[s][r] = t / (double)ops;
            cpu[s][r] /= (double)ops;
        }
        if (w->kind == K_BUILD) w->edge_base += ops;    /* the next run adds new edges */
    }
    for (int s = 0; s < 2; s++) {
        double per_s[64];
        for (unsigned r = 0; r < o->runs; r++) per_s[r] = 1e9 / ns[s][r];
        bench_emit(o, c, subj[s].name, "ns_per_op", bench_summarize(ns[s], o->runs), "ns");
        bench_emit(o, c, subj[s].name, "ops_per_s", bench_summarize(per_s, o->runs), "ops/s");
        bench_emit(o, c, subj[s].name, "cpu_ns_per_op", bench_summarize(cpu[s], o->runs), "ns");
        counts_emit(o, c, &subj[s], ops * o->runs);
    }
}

/* ==========================================================================
 * Main
 * ========================================================================== */
static unsigned parse_threads(const bench_opts *o, unsigned *out)
{
    static const unsigned def[] = {1, 2, 4, 8};
    unsigned n = 0;
    for (int i = 0; i < o->argc; i++) {
        if (strcmp(o->argv[i], "--threads") != 0 || i + 1 >= o->argc)
            bench_usage_error(o, "unknown option: %s", o->argv[i]);
        char *p = o->argv[++i];
        while (*p && n < 8) {
            unsigned long v = strtoul(p, &p, 10);
            if (v < 1 || v > 8) bench_usage_error(o, "--threads: 1 to 8 each");
            out[n++] = (unsigned)v;
            if (*p == ',') p++;
        }
    }
    if (!n) { memcpy(out, def, sizeof def); n = 4; }
    return n;
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    unsigned threads[8], nthreads = parse_threads(&opts, threads);
    if (!opts.child) return bench_run_pmem_forced(&opts);
    pmdk_count_init("bench_apps");
    const bool q = opts.quick;
    const uint64_t pool_size = q ? 128 * MIB : 512 * MIB;
    subject subj[2] = {{.name = "nvheap"}, {.name = "pmdk"}};
    const char *p1 = bench_scratch_path(&opts, NULL, "nvheap");
    const char *p2 = bench_scratch_path(&opts, NULL, "pmdk");
    subj[0].pool = nvh_pool_create(p1, "bench-apps", pool_size, NVH_DOMAIN_PMEM);
    subj[1].pop = pmemobj_create(p2, "bench-apps", pool_size, 0600);
    if (!subj[0].pool || !subj[1].pop) {
        bench_error(&opts, "cannot create pools: %s / %s", nvh_errormsg(), pmemobj_errormsg());
        return bench_finish(&opts);
    }
    subj[0].be = app_nvh_backend(subj[0].pool);
    subj[0].slot = nvh_root(subj[0].pool, NULL);
    pmdk_root *pr = pmemobj_direct(pmemobj_root(subj[1].pop, sizeof(pmdk_root)));
    subj[1].be = (app_be){(char *)subj[1].pop, pm_rd, pm_wr, pm_alloc, pm_run, pr};
    subj[1].slot = pr->slot;
    nvh_pool_info pi;
    nvh_pool_info_get(subj[0].pool, &pi);
    bench_note(&opts, "nvheap: pmem domain on %s (%s); PMDK: PMEM_IS_PMEM_FORCE=1 on the same "
               "directory; threads beyond %ld cores are oversubscribed", opts.dir,
               pi.flush_instruction, sysconf(_SC_NPROCESSORS_ONLN));

    /* sizes: the paper's footprints (4 GB) scaled to a shared 2-core box */
    const uint32_t ssca_nv = q ? 1u << 10 : 1u << 14, six_nv = q ? 512 : 4096;
    const uint64_t btree_keys = q ? 1u << 14 : 1u << 20, btree_fill = q ? 4000 : 200000;
    const uint64_t ops_build = q ? 4000 : 40000, ops_ssca = q ? 4000 : 40000;
    const uint64_t ops_d6 = q ? 200 : 2000, ops_fof = q ? 4000 : 40000;
    const uint64_t ops_bt = q ? 4000 : 40000;

    for (int s = 0; s < 2; s++) {
        app_be *be = &subj[s].be;
        int rc = ssca_create(be, &subj[s].slot[SSCA], ssca_nv);
        if (!rc) rc = sixdeg_create(be, &subj[s].slot[SIXDEG], six_nv, 4, 77);
        if (!rc) rc = btree_create(be, &subj[s].slot[BTREE]);
        uint64_t rng = 31;
        for (uint64_t i = 0; i < btree_fill && !rc; i++)
            rc = btree_toggle(be, subj[s].slot[BTREE], 1 + app_rand(&rng) % btree_keys, NULL);
        if (rc) {
            bench_error(&opts, "%s: building the structures failed: %s", subj[s].name,
                        s ? pmemobj_errormsg() : nvh_errormsg());
            return bench_finish(&opts);
        }
    }
    sixdeg_thread_exit();

    work build = {SSCA, K_BUILD, ssca_nv, 0, 0};
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &build, threads[t], ops_build);
    if (!build.edge_base) {                     /* the analyses need a graph */
        bench_note(&opts, "ssca: no build case selected; kernel 1 runs untimed first");
        worker k = {&subj[0], &build, 0, 1, ops_build, 1, NULL, 0, 0};
        for (int s = 0; s < 2; s++) {
            k.s = &subj[s];
            for (uint64_t i = 0; i < ops_build && !k.rc; i++) k.rc = do_op(&k, i);
        }
        build.edge_base = ops_build;
    }
    work maxw = {SSCA, K_MAXW, ssca_nv, 0, build.edge_base};
    work rew = {SSCA, K_REWEIGHT, ssca_nv, 0, build.edge_base};
    work d6 = {SIXDEG, K_D6, six_nv, 0, 0}, fof = {SIXDEG, K_FOF, six_nv, 0, 0};
    work tog = {BTREE, K_TOGGLE, 0, btree_keys, 0}, look = {BTREE, K_LOOKUP, 0, btree_keys, 0};
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &maxw, threads[t], ops_ssca);
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &rew, threads[t], ops_ssca);
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &d6, threads[t], ops_d6);
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &fof, threads[t], ops_fof);
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &tog, threads[t], ops_bt);
    for (unsigned t = 0; t < nthreads; t++) measure(&opts, subj, &look, threads[t], ops_bt);

    /* the structures must still be sound after everything ran */
    for (int s = 0; s < 2; s++) {
        uint64_t n1, n2, n3;
        app_be *be = &subj[s].be;
        if (ssca_check(be, subj[s].slot[SSCA], &n1) || sixdeg_check(be, subj[s].slot[SIXDEG], &n2) ||
            btree_check(be, subj[s].slot[BTREE], &n3))
            bench_error(&opts, "%s: a structure's invariants are broken after the run", subj[s].name);
        else
            bench_note(&opts, "%s: checked after the run: ssca %llu edges, 6-degrees %llu edges, "
                       "B-tree %llu keys", subj[s].name, (unsigned long long)n1,
                       (unsigned long long)n2, (unsigned long long)n3);
    }
    pmemobj_close(subj[1].pop);
    nvh_pool_close(subj[0].pool);
    return bench_finish(&opts);
}
