/* bench_tx.c — durable transactions: NVTM's Table 3 and GUPS/GSPS ([Coburn09]), hybrid logging ([Kannan14]), vs PMDK
 *
 * Cases are GROUP/VARIANT (subjects: nvheap, nvheap-obj, pmdk):
 *   latency/{empty,read,write,read-write}-{dur,nodur}   [Coburn09] Table 3: one
 *        object transaction on one 8-byte object; dur = pmem domain (CLWB +
 *        SFENCE on /dev/shm), nodur = process domain (no flush, no fence).
 *        pmdk: TX_BEGIN/pmemobj_tx_add_range_direct (no read isolation: its
 *        "read" is a plain load); nvheap-undo: nvheap's calls with the
 *        two-fence protocol forced (nvh_tx_protocol_set); floor-1f (write,
 *        read-write): the one-fence transaction with no library code (t3_floor)
 *   gups/U        1 thread, 1 M-element array, U random 8-byte updates per
 *                 transaction (Fig. 4). nvheap: nvh_tx_add_ranges (one call
 *                 for the U words) then in-place updates; nvheap-obj:
 *                 nvh_tx_open_write per element; pmdk: add_range_direct per
 *                 element
 *                 nvheap-redo: nvh_tx_write_word per element (one-fence
 *                 word transactions, up to 8 words; beyond: the fallback);
 *                 nvheap-undo: nvheap's calls with the two-fence protocol
 *                 forced (nvh_tx_protocol_set), the comparison the default's
 *                 choice of protocol rests on (docs/TX.md)
 *                 floor-2f: the two-fence in-place transaction without any
 *                 library code (undo lines, fence, stores, commit lines,
 *                 fence, data written back for the next fence): the most
 *                 an in-place two-fence design can gain over PMDK here
 *   gsps/1        swap two random elements per transaction (same subjects)
 *   gups-mt/1M-Tt GUPS with 1 update per transaction on the 1 M-element array
 *                 by T = 1, 2 threads, each on its own half (in-place
 *                 transactions are not isolated); metric scaling_vs_1t
 *   contention/SIZE-Tt  [Coburn09] Fig. 5: GUPS with 1 update per transaction
 *                 on arrays of SIZE = 1, 4, 16, ..., 4^10 (1 M) elements, 64 B
 *                 apart, by T = 1, 2, 4, 8 threads (more threads than cores
 *                 oversubscribe). nvheap-obj: object transactions
 *                 (isolated, optimistic); pmdk: PMDK has no isolation, so
 *                 each transaction holds the element's PMEMmutex
 *                 (TX_PARAM_MUTEX; 4096 pool-resident mutexes, element
 *                 i % 4096). Metric scaling_vs_1t (throughput over 1 thread)
 *   contention-gsps/SIZE-Tt  the same with swaps (nvheap-obj, 1 and 2 threads)
 *   hash/{insert,delete}-{word,object,hybrid}  [Kannan14] Fig. 18: a persistent
 *                 hash table; log bytes, lines and fences per operation with
 *                 word-only, object-only and hybrid (AUTO) logging hints
 * Metrics: ns_per_op, ops_per_s, lines_per_op, fences_per_op, log_bytes_per_op;
 * for latency/...-dur, gups/U and gsps/1, whose subjects run interleaved
 * (each run times every subject once), also min_ns_per_op, cpu_ns_per_op,
 * pair_ratio and pair_ratio_cpu (PMDK's ns ÷ the subject's in the same run,
 * median over runs), clean_frac and all_ns_per_op (every chunk, the
 * disturbed ones too); the others count only chunks of a run during
 * which the thread ran undisturbed, and a subject whose runs are not steady
 * state gets a WARNING (--strict: the program fails), see measure_rounds.
 * The ratio column divides ns_per_op by PMDK's in the same case (< 1: faster).
 * PMDK runs with PMEM_IS_PMEM_FORCE=1 on /dev/shm (the whole program re-runs
 * itself as a child with that environment, since libpmem reads it at load).
 */
#include "bench_util.h"

#include <libpmemobj.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)
#define GUPS_N (1u << 20)
#define CONT_N (1u << 20)           /* Fig. 5's largest array              */
#define CONT_LOCKS 4096u            /* PMDK's mutexes for Fig. 5           */

static const bench_info info = {
    .name = "tx",
    .summary = "durable transactions: NVTM Table 3, GUPS/GSPS, hybrid logging, vs PMDK",
    .baseline = "pmdk",
    .ratio_metric = "ns_per_op",
    .usage = "  --strict     fail (exit 1) when a subject's runs are not steady state\n"
             "               (disturbed runs, absurd spread): its ratios are not valid\n",
};

/* ==========================================================================
 * Subjects' state
 * ========================================================================== */
typedef struct env {
    const bench_opts *opts;
    nvh_pool *pool;             /* pmem domain */
    nvh_pool *nodur;            /* process domain */
    uint64_t *arr;              /* GUPS_N words in pool */
    uint64_t *arr_nodur;
    PMEMobjpool *pop;
    uint64_t *parr;             /* GUPS_N words in the PMDK pool */
    uint64_t *carr, *pcarr;     /* Fig. 5: CONT_N elements 64 B apart (both pools) */
    PMEMmutex *plocks;          /* Fig. 5: PMDK's CONT_LOCKS mutexes  */
    uint64_t *floor_log;        /* floor-2f: its two log areas (pool) */
    uint64_t floor_tid;
} env;

static inline uint64_t xs(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* ==========================================================================
 * Measurement helpers
 * ========================================================================== */
typedef struct loop_ctx {
    env *e;
    nvh_pool *pool;
    uint64_t *arr;
    uint64_t n;                 /* array elements */
    unsigned u;                 /* updates per tx */
    uint64_t rng;
    int kind;
} loop_ctx;

static void emit(const bench_opts *o, const char *c, const char *subj, double *ns, unsigned runs)
{
    bench_summary s = bench_summarize(ns, runs);
    bench_emit(o, c, subj, "ns_per_op", s, "ns");
    double ops[64];
    for (unsigned i = 0; i < runs; i++) ops[i] = 1e9 / ns[i];
    bench_emit(o, c, subj, "ops_per_s", bench_summarize(ops, runs), "ops/s");
}

static void emit_counts(const bench_opts *o, const char *c, const char *subj, nvh_pool *pool,
                        uint64_t ops, uint64_t log0)
{
    bench_counts k = bench_counts_per_op(pool, ops);
    bench_emit_counts(o, c, subj, &k);
    nvh_tx_stats st;
    nvh_tx_stats_get(pool, &st);
    bench_emit(o, c, subj, "log_bytes_per_op", bench_exact((double)(st.bytes_logged - log0) / ops),
               "B");
}

/* measure one body on one pool (nvheap subjects) */
static void measure_nv(env *e, const char *c, const char *subj, bench_body_fn body, loop_ctx *x,
                       double scale)
{
    const bench_opts *o = e->opts;
    uint64_t iters = bench_calibrate(o, body, x, scale);
    double ns[64];
    nvh_tx_stats st;
    for (unsigned r = 0; r < o->runs; r++) ns[r] = bench_time_ns(body, x, iters) / iters;
    emit(o, c, subj, ns, o->runs);
    bench_counts_begin(x->pool);
    nvh_tx_stats_get(x->pool, &st);
    bench_time_ns(body, x, iters);
    emit_counts(o, c, subj, x->pool, iters, st.bytes_logged);
}


typedef struct subj {
    const char *name;
    bench_body_fn body;
    int kind;                   /* 0 nvheap (counts), 1 pmdk, 2 floor-2f, 3 floor-1f */
    nvh_tx_protocol proto;      /* nvheap subjects                         */
} subj;
static void measure_rounds(env *e, const char *c, const subj *sj, unsigned ns_, loop_ctx *x,
                           double scale);

/* ==========================================================================
 * Table 3: minimal object transactions
 * ========================================================================== */
enum { K_EMPTY, K_READ, K_WRITE, K_RW };

static void t3_nv(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    uint64_t *a = x->arr, *b = x->arr + 8;
    for (uint64_t i = 0; i < iters; i++) {
        nvh_tx_begin(pool);
        if (x->kind == K_READ || x->kind == K_RW) {
            const uint64_t *r = nvh_tx_open_read(pool, b, 8);
            if (x->kind == K_RW) {
                uint64_t *w = nvh_tx_open_write(pool, a, 8);
                *w = *r + i;
            }
        } else if (x->kind == K_WRITE) {
            uint64_t *w = nvh_tx_open_write(pool, a, 8);
            *w = i;
        }
        nvh_tx_commit(pool);
    }
}

static void t3_pm(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    PMEMobjpool *pop = x->e->pop;
    uint64_t *a = x->e->parr, *b = x->e->parr + 8;
    for (uint64_t i = 0; i < iters; i++) {
        pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE);
        if (x->kind == K_READ || x->kind == K_RW) {
            uint64_t v = *(volatile uint64_t *)b;
            if (x->kind == K_RW) {
                pmemobj_tx_add_range_direct(a, 8);
                *a = v + i;
            }
        } else if (x->kind == K_WRITE) {
            pmemobj_tx_add_range_direct(a, 8);
            *a = i;
        }
        pmemobj_tx_commit();
        pmemobj_tx_end();
    }
}

static void t3_floor(void *p, uint64_t iters);

static void table3(env *e)
{
    static const char *names[] = {"empty", "read", "write", "read-write"};
    for (int k = 0; k < 4; k++)
        for (int dur = 1; dur >= 0; dur--) {
            char c[64];
            snprintf(c, sizeof c, "latency/%s-%s", names[k], dur ? "dur" : "nodur");
            if (!bench_selected(e->opts, c)) continue;
            loop_ctx x = {e, dur ? e->pool : e->nodur, dur ? e->arr : e->arr_nodur, 0, 0, 1, k};
            if (!dur) {
                measure_nv(e, c, "nvheap", t3_nv, &x, 0.5);
                continue;
            }
            /* nvheap-undo: the same calls with the two-fence protocol forced */
            const subj sj[] = {
                {"nvheap", t3_nv, 0, NVH_TX_PROTO_AUTO},
                {"pmdk", t3_pm, 1, NVH_TX_PROTO_AUTO},
                {"nvheap-undo", t3_nv, 0, NVH_TX_PROTO_UNDO},
                {"floor-1f", t3_floor, 3, NVH_TX_PROTO_AUTO},
            };
            measure_rounds(e, c, sj, k == K_WRITE || k == K_RW ? 4 : 2, &x, 0.25);
        }
}

/* ==========================================================================
 * GUPS / GSPS, one thread
 * ========================================================================== */
static void gups_nv(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    nvh_tx_range r[256];
    uint64_t *w[256];
    for (uint64_t i = 0; i < iters; i++) {
        for (unsigned k = 0; k < x->u; k++) {
            w[k] = &x->arr[xs(&x->rng) & (x->n - 1)];
            r[k] = (nvh_tx_range){w[k], 8, NVH_TX_HINT_AUTO};
        }
        nvh_tx_begin(pool);
        nvh_tx_add_ranges(pool, r, x->u);
        for (unsigned k = 0; k < x->u; k++) *w[k] += i;
        nvh_tx_commit(pool);
    }
}

static void gups_redo(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    for (uint64_t i = 0; i < iters; i++) {
        nvh_tx_begin(pool);
        for (unsigned k = 0; k < x->u; k++) {
            uint64_t *w = &x->arr[xs(&x->rng) & (x->n - 1)];
            nvh_tx_write_word(pool, w, nvh_tx_read_word(pool, w) + i);
        }
        nvh_tx_commit(pool);
    }
}

static void gsps_redo(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t *a = &x->arr[xs(&x->rng) & (x->n - 1)], *b = &x->arr[xs(&x->rng) & (x->n - 1)];
        nvh_tx_begin(pool);
        uint64_t va = nvh_tx_read_word(pool, a), vb = nvh_tx_read_word(pool, b);
        nvh_tx_write_word(pool, a, vb);
        nvh_tx_write_word(pool, b, va);
        nvh_tx_commit(pool);
    }
}

static void gups_obj(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    for (uint64_t i = 0; i < iters; i++) {
        nvh_tx_begin(pool);
        for (unsigned k = 0; k < x->u; k++) {
            uint64_t *w = nvh_tx_open_write(pool, &x->arr[xs(&x->rng) & (x->n - 1)], 8);
            *w += i;
        }
        nvh_tx_commit(pool);
    }
}

static void gups_pm(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    PMEMobjpool *pop = x->e->pop;
    for (uint64_t i = 0; i < iters; i++) {
        pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE);
        for (unsigned k = 0; k < x->u; k++) {
            uint64_t *w = &x->e->parr[xs(&x->rng) & (x->n - 1)];
            pmemobj_tx_add_range_direct(w, 8);
            *w += i;
        }
        pmemobj_tx_commit();
        pmemobj_tx_end();
    }
}

static void gsps_nv(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t *a = &x->arr[xs(&x->rng) & (x->n - 1)], *b = &x->arr[xs(&x->rng) & (x->n - 1)];
        nvh_tx_range r[2] = {{a, 8, NVH_TX_HINT_AUTO}, {b, 8, NVH_TX_HINT_AUTO}};
        nvh_tx_begin(pool);
        nvh_tx_add_ranges(pool, r, 2);
        uint64_t t = *a; *a = *b; *b = t;
        nvh_tx_commit(pool);
    }
}

static void gsps_obj(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    nvh_pool *pool = x->pool;
    for (uint64_t i = 0; i < iters; i++) {
        nvh_tx_begin(pool);
        uint64_t *a = nvh_tx_open_write(pool, &x->arr[xs(&x->rng) & (x->n - 1)], 8);
        uint64_t *b = nvh_tx_open_write(pool, &x->arr[xs(&x->rng) & (x->n - 1)], 8);
        uint64_t t = *a; *a = *b; *b = t;
        nvh_tx_commit(pool);
    }
}

static void gsps_pm(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    PMEMobjpool *pop = x->e->pop;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t *a = &x->e->parr[xs(&x->rng) & (x->n - 1)];
        uint64_t *b = &x->e->parr[xs(&x->rng) & (x->n - 1)];
        pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE);
        pmemobj_tx_add_range_direct(a, 8);
        if (b != a) pmemobj_tx_add_range_direct(b, 8);
        uint64_t t = *a; *a = *b; *b = t;
        pmemobj_tx_commit();
        pmemobj_tx_end();
    }
}

/* --------------------------------------------------------------------------
 * floor-2f: the two-fence in-place transaction with no library code at all,
 * on the same pool array, for the same case (docs/TX.md, "The 2-fence floor
 * for in-place stores"). Per transaction of U words: the old words packed 3
 * per non-temporal undo line {tid, n, (offset, old) x 3}, SFENCE (the undo
 * image durable before any store in place), the stores, the new words
 * packed 3 per non-temporal commit line, SFENCE (committed), CLWB of the
 * data lines (durable at the next transaction's first fence, which the
 * commit lines cover until then). Two log areas alternate, so no line is
 * rewritten while its write-back may be in flight. No CRC, no filters, no
 * bookkeeping: the least any two-fence design with undo images durable
 * before the caller's stores can do, i.e. an upper bound for nvheap's
 * in-place path against PMDK in the same run.
 * -------------------------------------------------------------------------- */
#define FLOOR_LINES 256u        /* per area: undo + commit lines, 256 words each */

static inline void floor_nt_line(uint64_t *d, const uint64_t *s)
{
#if defined(__x86_64__)
    for (int i = 0; i < 8; i++) __asm__ volatile("movnti %1, %0" : "=m"(d[i]) : "r"(s[i]));
#else
    memcpy(d, s, 64);
#endif
}


/* The u words' offsets and current values, three per line after a tag
 * and the count, streamed to dst: the undo image before the stores, the
 * commit image after them. */
static void floor_image(uint64_t *dst, const loop_ctx *x, uint64_t **w, unsigned u,
                        uint64_t tag)
{
    uint64_t line[8];
    for (unsigned l = 0; l < (u + 2) / 3; l++) {
        line[0] = tag;
        line[1] = u;
        for (unsigned j = 0; j < 3; j++) {
            unsigned k = l * 3 + j;
            line[2 + 2 * j] = k < u ? (uint64_t)((char *)w[k] - (char *)x->arr) : 0;
            line[3 + 2 * j] = k < u ? *w[k] : 0;
        }
        floor_nt_line(dst + l * 8, line);
    }
}

static void floor_tx(loop_ctx *x, uint64_t *log, uint64_t **w, unsigned u, uint64_t tid,
                     uint64_t i, int swap)
{
    uint64_t *area = log + (tid & 1) * FLOOR_LINES * 8;   /* alternate areas */
    floor_image(area, x, w, u, tid << 1);                   /* undo lines */
    bench_sfence();                                         /* FENCE 1 */
    if (swap) { uint64_t t = *w[0]; *w[0] = *w[1]; *w[1] = t; }
    else for (unsigned k = 0; k < u; k++) *w[k] += i;
    floor_image(area + (FLOOR_LINES / 2) * 8, x, w, u, tid << 1 | 1);  /* commit lines */
    bench_sfence();                                         /* FENCE 2 */
    for (unsigned k = 0; k < u; k++) bench_clwb(w[k]);      /* data: next fence */
}

/* floor-1f (latency/write-dur, read-write-dur): the one-fence transaction
 * on one word with no library code: the previous transaction's data line's
 * CLWB, one non-temporal redo line {tid, 1, offset, new value}, SFENCE
 * (committed), the store in place (written back before the next fence).
 * The least any design that makes the commit durable before it returns can
 * do: 1 fence, 2 lines. */
static void t3_floor(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    uint64_t *a = x->arr, *b = x->arr + 8;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t v = (x->kind == K_RW ? *(volatile uint64_t *)b : 0) + i;
        uint64_t tid = ++x->e->floor_tid;
        uint64_t *dst = x->e->floor_log + (tid & 1) * FLOOR_LINES * 8;
        uint64_t line[8] = {tid, 1, (uint64_t)((char *)a - (char *)x->arr), v, 0, 0, 0, 0};
        floor_nt_line(dst, line);
        bench_clwb(a);                                      /* the previous value */
        bench_sfence();                                     /* THE fence */
        *a = v;
    }
}

static void gups_floor(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    uint64_t *w[256];
    for (uint64_t i = 0; i < iters; i++) {
        for (unsigned k = 0; k < x->u; k++) w[k] = &x->arr[xs(&x->rng) & (x->n - 1)];
        floor_tx(x, x->e->floor_log, w, x->u, ++x->e->floor_tid, i, 0);
    }
}

static void gsps_floor(void *p, uint64_t iters)
{
    loop_ctx *x = p;
    uint64_t *w[2];
    for (uint64_t i = 0; i < iters; i++) {
        w[0] = &x->arr[xs(&x->rng) & (x->n - 1)];
        w[1] = &x->arr[xs(&x->rng) & (x->n - 1)];
        floor_tx(x, x->e->floor_log, w, 2, ++x->e->floor_tid, i, 1);
    }
}

/* --------------------------------------------------------------------------
 * Interleaved rounds (gups/U, gsps/1, latency/...-dur): each run times every
 * subject once, one after the other, so that a change of the machine's load
 * hits all subjects of a run alike. Besides the usual medians it emits, per
 * subject, `pair_ratio` (median over runs of PMDK's ns ÷ the subject's ns in
 * the same run: above 1 is faster than PMDK), `min_ns_per_op` (the least
 * disturbed run) and `cpu_ns_per_op` (thread CPU time: preemption by other
 * processes excluded).
 *
 * Steady state only. A run is timed in chunks of about 1/RUN_CHUNKS of its
 * length, and a chunk during which the thread was switched out (getrusage's
 * context switches: preempted by another process, or blocked) or took a
 * page fault, or whose wall-clock and thread CPU times disagree by more than
 * CLOCK_AGREE (the one busy thread's should be equal), does not count: the
 * run goes on until the clean chunks add up
 * to its iterations (at most RUN_CAP times them in all), and its figure is
 * the median of the clean chunks' ns per op (so that a chunk stretched by
 * what the guest cannot see, such as the host descheduling this virtual
 * CPU, which also counts as the thread's CPU time, does not move it either;
 * cpu_ns_per_op likewise). On a machine shared with other work, a run can
 * be preempted for most of its length while the next subject's run is not
 * touched: whole-run wall-clock pair ratios are then noise. A subject whose
 * clean chunks did not reach half its iterations in some run
 * ("disturbed"), whose runs spread more than SPREAD_MAX (max ÷ min), or
 * most of whose chunks did not count (faults in steady state, say), gets a
 * WARNING line naming the case, and with --strict the program fails: its
 * ratios must not be quoted. clean_frac is the share of timed chunks that
 * counted, all_ns_per_op the figure over every chunk.
 * -------------------------------------------------------------------------- */

static double cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define RUN_CHUNKS 32u          /* chunks per run                            */
#define RUN_CAP 4u              /* at most this many times the iterations    */
#define SPREAD_MAX 2.0          /* runs' max ÷ min beyond which: WARNING      */
#define CLOCK_AGREE 1.25        /* a chunk's wall ÷ CPU time (and CPU ÷ wall) */

static int tx_strict;           /* --strict: a WARNING fails the program      */
/* Test hook (tests/tx/bench_guard.sh): NVH_BENCH_TX_DISTURB=SUBJECT:half or
 * SUBJECT:all sleeps 1 ms inside every other (every) timed chunk of that
 * subject, a disturbance the guard must exclude (half) or report (all). */
static const char *disturb_subj;
static unsigned disturb_every;  /* 2: every other chunk, 1: every chunk */

typedef struct run_fig {
    double ns, cpu_ns;          /* per op: median over the clean chunks       */
    double all_ns;              /* per op, over every chunk                   */
    uint64_t chunks, clean;     /* chunks timed, chunks that counted          */
    uint64_t faults;            /* page faults, all chunks                   */
    bool disturbed;             /* clean chunks short of half the iterations */
} run_fig;

static uint64_t rusage_switches(const struct rusage *r)
{
    return (uint64_t)r->ru_nvcsw + (uint64_t)r->ru_nivcsw;
}

static uint64_t rusage_faults(const struct rusage *r)
{
    return (uint64_t)r->ru_minflt + (uint64_t)r->ru_majflt;
}

static run_fig timed_run(bench_body_fn body, void *ctx, uint64_t iters, unsigned disturb)
{
    run_fig f = {0};
    uint64_t chunk = iters / RUN_CHUNKS ? iters / RUN_CHUNKS : 1;
    uint64_t clean_iters = 0, done = 0;
    double all_wall = 0, all_cpu = 0;
    double cw[RUN_CAP * RUN_CHUNKS + 1], cc[RUN_CAP * RUN_CHUNKS + 1];   /* clean chunks */
    while (clean_iters < iters && f.chunks < RUN_CAP * RUN_CHUNKS) {
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        double c0 = cpu_now_ns();
        uint64_t t0 = bench_now_ns();
        body(ctx, chunk);
        if (disturb && f.chunks % disturb == 0) usleep(1000);
        uint64_t t1 = bench_now_ns();
        double c1 = cpu_now_ns();
        getrusage(RUSAGE_THREAD, &r1);
        done += chunk;
        f.chunks++;
        all_wall += (double)(t1 - t0);
        all_cpu += c1 - c0;
        uint64_t flt = rusage_faults(&r1) - rusage_faults(&r0);
        f.faults += flt;
        if (rusage_switches(&r1) != rusage_switches(&r0) || flt) continue;
        /* one thread, busy throughout: its wall and CPU time agree unless
         * the guest's clocks do not (the virtual CPU descheduled by the
         * host, a clock correction) */
        double w = (double)(t1 - t0), cp = c1 - c0;
        if (w > CLOCK_AGREE * cp || cp > CLOCK_AGREE * w) continue;
        cw[f.clean] = (double)(t1 - t0) / (double)chunk;
        cc[f.clean++] = (c1 - c0) / (double)chunk;
        clean_iters += chunk;
    }
    f.disturbed = clean_iters * 2 < iters;
    f.all_ns = all_wall / (double)done;
    if (f.clean) {
        f.ns = bench_median(cw, (unsigned)f.clean);
        f.cpu_ns = bench_median(cc, (unsigned)f.clean);
    } else {
        f.ns = all_wall / (double)done;
        f.cpu_ns = all_cpu / (double)done;
    }
    return f;
}

/* Iterations for a run of about opts->time_ns * scale, like bench_calibrate
 * but from the lesser of each trial call's wall and CPU time: a trial call
 * that was preempted (wall) or whose CPU clock ran ahead would otherwise
 * make every run of the subject far too short. */
static uint64_t tx_calibrate(const bench_opts *o, bench_body_fn body, void *ctx, double scale)
{
    double target = o->time_ns * scale;
    uint64_t iters = 1;
    for (;;) {
        double c0 = cpu_now_ns();
        double w = bench_time_ns(body, ctx, iters);
        double cp = cpu_now_ns() - c0;
        double t = w < cp ? w : cp;
        if (t >= target / 8 || iters >= ((uint64_t)1 << 40)) {
            double n = t > 0 ? target * (double)iters / t : (double)iters * 8;
            return n < 1 ? 1 : (uint64_t)n;
        }
        iters *= t < target / 64 ? 8 : 2;
    }
}

/* The guard: WARNING (with --strict an error) when a subject's figures of
 * this case are not steady-state measurements. */
static bool check_runs(env *e, const char *c, const char *subj, const run_fig *f, unsigned runs,
                       const double *ns)
{
    const bench_opts *o = e->opts;
    unsigned disturbed = 0;
    uint64_t chunks = 0, clean = 0, faults = 0;
    for (unsigned r = 0; r < runs; r++) {
        disturbed += f[r].disturbed;
        chunks += f[r].chunks;
        clean += f[r].clean;
        faults += f[r].faults;
    }
    bench_summary s = bench_summarize(ns, runs);
    char why[160] = "";
    if (disturbed)
        snprintf(why, sizeof why, "%u of %u runs disturbed (fewer than half the iterations "
                 "ran without a context switch or fault)", disturbed, runs);
    else if (s.min > 0 && s.max / s.min > SPREAD_MAX)
        snprintf(why, sizeof why, "runs spread %.0f..%.0f ns (max/min %.1f > %.1f)", s.min, s.max,
                 s.max / s.min, SPREAD_MAX);
    else if (clean * 2 < chunks)
        snprintf(why, sizeof why, "only %llu of %llu chunks ran undisturbed",
                 (unsigned long long)clean, (unsigned long long)chunks);
    if (!why[0]) return true;
    if (tx_strict)
        bench_error(o, "%s %s: %s; its ratios are not valid", c, subj, why);
    else
        bench_note(o, "WARNING: %s %s: %s; do not quote its ratios", c, subj, why);
    return false;
}

static void measure_rounds(env *e, const char *c, const subj *sj, unsigned ns_, loop_ctx *x,
                           double scale)
{
    const bench_opts *o = e->opts;
    enum { MAXS = 8 };
    uint64_t iters[MAXS];
    double wall[MAXS][64], cpu[MAXS][64];
    run_fig fig[MAXS][64];
    unsigned runs = o->runs > 64 ? 64 : o->runs;
    int pm = -1;
    for (unsigned k = 0; k < ns_ && k < MAXS; k++) {
        if (sj[k].kind == 1) pm = (int)k;
        if (sj[k].kind >= 2 && !e->floor_log) { iters[k] = 0; continue; }
        if (sj[k].kind == 0) nvh_tx_protocol_set(x->pool, sj[k].proto);
        iters[k] = tx_calibrate(o, sj[k].body, x, scale);
        nvh_tx_protocol_set(x->pool, NVH_TX_PROTO_AUTO);
    }
    for (unsigned r = 0; r < runs; r++)
        for (unsigned k = 0; k < ns_ && k < MAXS; k++) {
            if (!iters[k]) continue;
            if (sj[k].kind == 0) nvh_tx_protocol_set(x->pool, sj[k].proto);
            unsigned dis = disturb_subj && !strcmp(disturb_subj, sj[k].name) ? disturb_every : 0;
            fig[k][r] = timed_run(sj[k].body, x, iters[k], dis);
            wall[k][r] = fig[k][r].ns;
            cpu[k][r] = fig[k][r].cpu_ns;
            nvh_tx_protocol_set(x->pool, NVH_TX_PROTO_AUTO);
        }
    /* pair ratios only between subjects whose runs pass the check: a
     * disturbed peer makes every ratio of the case meaningless */
    bool valid[MAXS];
    for (unsigned k = 0; k < ns_ && k < MAXS; k++)
        valid[k] = iters[k] && check_runs(e, c, sj[k].name, fig[k], runs, wall[k]);
    for (unsigned k = 0; k < ns_ && k < MAXS; k++) {
        if (!iters[k]) continue;
        emit(o, c, sj[k].name, wall[k], runs);
        uint64_t chunks = 0, clean = 0;
        for (unsigned r = 0; r < runs; r++) {
            chunks += fig[k][r].chunks;
            clean += fig[k][r].clean;
        }
        bench_emit(o, c, sj[k].name, "clean_frac", bench_exact(chunks ? (double)clean / chunks : 0),
                   "");
        bench_summary w = bench_summarize(wall[k], runs);
        double all[64];
        for (unsigned r = 0; r < runs; r++) all[r] = fig[k][r].all_ns;
        bench_emit(o, c, sj[k].name, "all_ns_per_op", bench_summarize(all, runs), "ns");
        bench_emit(o, c, sj[k].name, "min_ns_per_op", bench_exact(w.min), "ns");
        bench_emit(o, c, sj[k].name, "cpu_ns_per_op", bench_summarize(cpu[k], runs), "ns");
        if (pm >= 0 && (int)k != pm && valid[k] && valid[pm]) {
            double q[64];
            for (unsigned r = 0; r < runs; r++) q[r] = wall[pm][r] / wall[k][r];
            bench_emit(o, c, sj[k].name, "pair_ratio", bench_summarize(q, runs), "x");
            for (unsigned r = 0; r < runs; r++) q[r] = cpu[pm][r] / cpu[k][r];
            bench_emit(o, c, sj[k].name, "pair_ratio_cpu", bench_summarize(q, runs), "x");
        }
        if (sj[k].kind == 0) {
            /* exact counts: one more pass */
            nvh_tx_stats st;
            nvh_tx_protocol_set(x->pool, sj[k].proto);
            bench_counts_begin(x->pool);
            nvh_tx_stats_get(x->pool, &st);
            bench_time_ns(sj[k].body, x, iters[k]);
            emit_counts(o, c, sj[k].name, x->pool, iters[k], st.bytes_logged);
            nvh_tx_protocol_set(x->pool, NVH_TX_PROTO_AUTO);
        } else if (sj[k].kind == 2) {
            /* exact, by construction: 2 fences; ceil(U/3) undo + ceil(U/3)
             * commit lines + U data lines */
            unsigned nl = (x->u + 2) / 3;
            bench_emit(o, c, sj[k].name, "fences_per_op", bench_exact(2), "fences");
            bench_emit(o, c, sj[k].name, "lines_per_op", bench_exact(2.0 * nl + x->u), "lines");
        } else if (sj[k].kind == 3) {
            /* exact, by construction: one redo line and the data line */
            bench_emit(o, c, sj[k].name, "fences_per_op", bench_exact(1), "fences");
            bench_emit(o, c, sj[k].name, "lines_per_op", bench_exact(2), "lines");
        }
    }
}

static void gups(env *e)
{
    static const unsigned us[] = {1, 2, 4, 8, 16, 64, 256};
    for (unsigned i = 0; i < sizeof us / sizeof us[0]; i++) {
        char c[64];
        snprintf(c, sizeof c, "gups/%u", us[i]);
        if (!bench_selected(e->opts, c)) continue;
        loop_ctx x = {e, e->pool, e->arr, GUPS_N, us[i], 88172645463325252ull, 0};
        /* nvheap-undo: the default calls with the two-fence protocol forced */
        const subj sj[] = {
            {"nvheap", gups_nv, 0, NVH_TX_PROTO_AUTO},   {"pmdk", gups_pm, 1, NVH_TX_PROTO_AUTO},
            {"nvheap-redo", gups_redo, 0, NVH_TX_PROTO_AUTO},
            {"nvheap-obj", gups_obj, 0, NVH_TX_PROTO_AUTO},
            {"floor-2f", gups_floor, 2, NVH_TX_PROTO_AUTO},
            {"nvheap-undo", gups_nv, 0, NVH_TX_PROTO_UNDO},
        };
        measure_rounds(e, c, sj, sizeof sj / sizeof sj[0], &x, 1.0 / 6);
    }
    if (bench_selected(e->opts, "gsps/1")) {
        loop_ctx x = {e, e->pool, e->arr, GUPS_N, 2, 88172645463325252ull, 0};
        const subj sj[] = {
            {"nvheap", gsps_nv, 0, NVH_TX_PROTO_AUTO},   {"pmdk", gsps_pm, 1, NVH_TX_PROTO_AUTO},
            {"nvheap-redo", gsps_redo, 0, NVH_TX_PROTO_AUTO},
            {"nvheap-obj", gsps_obj, 0, NVH_TX_PROTO_AUTO},
            {"floor-2f", gsps_floor, 2, NVH_TX_PROTO_AUTO},
            {"nvheap-undo", gsps_nv, 0, NVH_TX_PROTO_UNDO},
        };
        measure_rounds(e, "gsps/1", sj, sizeof sj / sizeof sj[0], &x, 1.0 / 6);
    }
}

/* ==========================================================================
 * Contention: object GUPS on small arrays, 1 and 2 threads
 * ========================================================================== */
typedef struct thr {
    env *e;
    uint64_t n;
    uint64_t rng;
    uint64_t ops;
    _Atomic int *go, *stop;
    int pmdk;
    int gsps;
    int mode;                   /* gups-mt: 1 add_word (undo), 2 write_word (one fence) */
    uint64_t base;              /* gups-mt: first element of this thread's half */
    double cpu_ns;              /* CPU time of the thread                   */
} thr;

static void *thr_run(void *p)
{
    thr *t = p;
    nvh_pool *pool = t->e->pool;
    while (!atomic_load_explicit(t->go, memory_order_acquire)) {}
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    uint64_t ops = 0;
    while (!atomic_load_explicit(t->stop, memory_order_relaxed)) {
        for (int k = 0; k < 16; k++) {
            if (t->mode) {
                uint64_t *w = &t->e->arr[t->base + (xs(&t->rng) & (t->n - 1))];
                nvh_tx_begin(pool);
                if (t->mode == 1) {
                    nvh_tx_add_word(pool, w);
                    *w += 1;
                } else {
                    nvh_tx_write_word(pool, w, nvh_tx_read_word(pool, w) + 1);
                }
                nvh_tx_commit(pool);
                continue;
            }
            if (t->pmdk) {
                /* PMDK isolates with locks: the element's mutex, held by
                 * the transaction (released at its end) */
                uint64_t i = xs(&t->rng) % t->n;
                uint64_t *w = &t->e->pcarr[i * 8];
                pmemobj_tx_begin(t->e->pop, NULL, TX_PARAM_MUTEX, &t->e->plocks[i % CONT_LOCKS],
                                 TX_PARAM_NONE);
                pmemobj_tx_add_range_direct(w, 8);
                *w += 1;
                pmemobj_tx_commit();
                pmemobj_tx_end();
                continue;
            }
            for (;;) {
                nvh_tx_begin(pool);
                uint64_t *w = nvh_tx_open_write(pool, &t->e->carr[(xs(&t->rng) % t->n) * 8], 8);
                uint64_t *w2 = NULL;
                if (w && t->gsps) w2 = nvh_tx_open_write(pool, &t->e->carr[(xs(&t->rng) % t->n) * 8], 8);
                if (w && (!t->gsps || w2)) {
                    if (t->gsps) { uint64_t v = *w; *w = *w2; *w2 = v; }
                    else *w += 1;
                    if (nvh_tx_commit(pool) == NVH_OK) break;
                } else {
                    nvh_tx_commit(pool);      /* closes the aborted transaction */
                }
            }
        }
        ops += 16;
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    t->cpu_ns = (double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec);
    t->ops = ops;
    return NULL;
}

static double run_threads_mode(env *e, unsigned nt, uint64_t n, int pmdk, int gsps, int mode,
                               double *cpu_ns_per_op);
static double run_threads(env *e, unsigned nt, uint64_t n, int pmdk, int gsps)
{
    return run_threads_mode(e, nt, n, pmdk, gsps, 0, NULL);
}

static double run_threads_mode(env *e, unsigned nt, uint64_t n, int pmdk, int gsps, int mode,
                               double *cpu_ns_per_op)
{
    _Atomic int go = 0, stop = 0;
    enum { MAX_THREADS = 8 };
    thr t[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    for (unsigned i = 0; i < nt; i++) {
        t[i] = (thr){e, n, 0x1234567ull * (i + 7), 0, &go, &stop, pmdk, gsps, mode,
                     mode ? i * n : 0, 0};
        pthread_create(&th[i], NULL, thr_run, &t[i]);
    }
    uint64_t t0 = bench_now_ns();
    atomic_store(&go, 1);
    uint64_t dur = (uint64_t)e->opts->time_ns;
    while (bench_now_ns() - t0 < dur) usleep(1000);
    atomic_store(&stop, 1);
    uint64_t ops = 0;
    double cpu = 0;
    for (unsigned i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        ops += t[i].ops;
        cpu += t[i].cpu_ns;
    }
    if (cpu_ns_per_op) *cpu_ns_per_op = cpu / (double)ops;
    double el = (double)(bench_now_ns() - t0);
    return el / (double)ops;
}

/* 2-thread scaling (issue target: >= 1.7x one thread's throughput): each
 * thread on its own half of the 1 M-element array, one update per
 * transaction; the 1- and 2-thread runs alternate so load drifts hit both.
 * scaling_vs_1t is wall-clock throughput (meaningful only with two idle
 * cores); scaling_cpu_est = 2 x (CPU ns per op, 1 thread) / (CPU ns per op,
 * 2 threads): the throughput ratio two dedicated cores would give, from the
 * per-operation CPU cost, which includes what the threads cost each other
 * (shared lines, help-flushing) but not the time other processes take */
static void gups_mt(env *e)
{
    static const char *subj[] = {"nvheap", "nvheap-redo"};
    for (int m = 1; m <= 2; m++) {
        if (!bench_selected(e->opts, "gups-mt/1M-1t") && !bench_selected(e->opts, "gups-mt/1M-2t"))
            return;
        double n1[64], n2[64], sc[64], c1[64], c2[64], scc[64];
        unsigned runs = e->opts->runs;
        for (unsigned r = 0; r < runs; r++) {
            n1[r] = run_threads_mode(e, 1, GUPS_N / 2, 0, 0, m, &c1[r]);
            n2[r] = run_threads_mode(e, 2, GUPS_N / 2, 0, 0, m, &c2[r]);
            sc[r] = n1[r] / n2[r];
            scc[r] = 2 * c1[r] / c2[r];
        }
        emit(e->opts, "gups-mt/1M-1t", subj[m - 1], n1, runs);
        emit(e->opts, "gups-mt/1M-2t", subj[m - 1], n2, runs);
        bench_emit(e->opts, "gups-mt/1M-1t", subj[m - 1], "cpu_ns_per_op",
                   bench_summarize(c1, runs), "ns");
        bench_emit(e->opts, "gups-mt/1M-2t", subj[m - 1], "cpu_ns_per_op",
                   bench_summarize(c2, runs), "ns");
        bench_emit(e->opts, "gups-mt/1M-2t", subj[m - 1], "scaling_vs_1t",
                   bench_summarize(sc, runs), "x");
        bench_emit(e->opts, "gups-mt/1M-2t", subj[m - 1], "scaling_cpu_est",
                   bench_summarize(scc, runs), "x");
    }
}

/* Fig. 5: every array size from 1 to 1 M elements in powers of 4, 1 to 8
 * threads; the subjects alternate run by run. The paper names 1, 4 and 16 as
 * its high-contention sizes and scales to 8 threads on larger arrays. */
static void contention(env *e)
{
    enum { NSIZES = 11 };
    static const unsigned nts[] = {1, 2, 4, 8};
    static const char *subj[] = {"nvheap-obj", "pmdk"};
    for (unsigned s = 0; s < NSIZES; s++) {
        uint64_t size = (uint64_t)1 << (2 * s);
        double one_t[2] = {0, 0};
        for (unsigned k = 0; k < 4; k++) {
            unsigned nt = nts[k];
            char c[64];
            snprintf(c, sizeof c, "contention/%llu-%ut", (unsigned long long)size, nt);
            if (!bench_selected(e->opts, c)) continue;
            double ns[2][64];
            /* elements are 64 B apart (one per ownership record) */
            for (unsigned r = 0; r < e->opts->runs; r++)
                for (int p = 0; p < 2; p++) ns[p][r] = run_threads(e, nt, size, p, 0);
            for (int p = 0; p < 2; p++) {
                emit(e->opts, c, subj[p], ns[p], e->opts->runs);
                double med = bench_median(ns[p], e->opts->runs);
                if (nt == 1) one_t[p] = med;
                else if (one_t[p] > 0)
                    bench_emit(e->opts, c, subj[p], "scaling_vs_1t", bench_exact(one_t[p] / med), "x");
            }
        }
    }
    static const uint64_t gsizes[] = {1, 4, 16, GUPS_N / 8};
    for (unsigned s = 0; s < 4; s++) {
        double one_t = 0;
        for (unsigned nt = 1; nt <= 2; nt++) {
            char c[64];
            snprintf(c, sizeof c, "contention-gsps/%llu-%ut", (unsigned long long)gsizes[s], nt);
            if (!bench_selected(e->opts, c)) continue;
            double ns[64];
            for (unsigned r = 0; r < e->opts->runs; r++) ns[r] = run_threads(e, nt, gsizes[s], 0, 1);
            emit(e->opts, c, "nvheap-obj", ns, e->opts->runs);
            double med = bench_median(ns, e->opts->runs);
            if (nt == 1) one_t = med;
            else if (one_t > 0)
                bench_emit(e->opts, c, "nvheap-obj", "scaling_vs_1t", bench_exact(one_t / med), "x");
        }
    }
}

/* ==========================================================================
 * Hybrid logging: a persistent hash table ([Kannan14] §4.3, Fig. 18)
 * ========================================================================== */
#define HBUCKETS 4096u
typedef struct hentry { uint64_t key, val, next; uint64_t pad[5]; } hentry;   /* 64 B */
typedef struct htable { uint64_t count; uint64_t pad[7]; uint64_t bucket[HBUCKETS]; } htable;

typedef struct hctx {
    nvh_pool *pool;
    htable *t;
    nvh_tx_hint hint;
    uint64_t next_key, del_key;
} hctx;

static void h_insert(void *p, uint64_t iters)
{
    hctx *h = p;
    nvh_pool *pool = h->pool;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t key = h->next_key++;
        uint64_t *head = &h->t->bucket[key % HBUCKETS];
        nvh_tx_begin(pool);
        hentry *en = nvh_tx_alloc(pool, sizeof *en);
        /* the entry's three words are logged too (as in [Kannan14]'s PHT, where
         * the entry comes from a free list): word-only logs 5 words, object-only
         * 3 objects, hybrid the entry as one object and the two counters as words */
        nvh_tx_range r[3] = {{en, 24, h->hint}, {head, 8, h->hint}, {&h->t->count, 8, h->hint}};
        nvh_tx_add_ranges(pool, r, 3);
        en->key = key;
        en->val = key * 3;
        en->next = *head;
        *head = nvh_off(pool, en);
        h->t->count++;
        nvh_tx_commit(pool);
    }
}

static void h_delete(void *p, uint64_t iters)
{
    hctx *h = p;
    nvh_pool *pool = h->pool;
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t key = h->del_key++;
        uint64_t *link = &h->t->bucket[key % HBUCKETS];
        hentry *en = nvh_ptr(pool, *link);
        while (en && en->key != key) { link = &en->next; en = nvh_ptr(pool, *link); }
        if (!en) continue;
        nvh_tx_begin(pool);
        /* 3 word updates: the link, the count, the entry's next (cleared) */
        nvh_tx_range r[3] = {{link, 8, h->hint}, {&h->t->count, 8, h->hint}, {&en->next, 8, h->hint}};
        if (h->hint == NVH_TX_HINT_OBJECT) r[2] = (nvh_tx_range){en, 24, h->hint};
        nvh_tx_add_ranges(pool, r, 3);
        *link = en->next;
        en->next = 0;
        h->t->count--;
        nvh_tx_free(pool, en);
        nvh_tx_commit(pool);
    }
}

static void hashbench(env *e)
{
    static const char *hn[] = {"hybrid", "word", "object"};
    static const nvh_tx_hint hv[] = {NVH_TX_HINT_AUTO, NVH_TX_HINT_WORD, NVH_TX_HINT_OBJECT};
    const bench_opts *o = e->opts;
    uint64_t n = o->quick ? 2000 : 20000;
    for (int k = 0; k < 3; k++) {
        char ci[64], cd[64];
        snprintf(ci, sizeof ci, "hash/insert-%s", hn[k]);
        snprintf(cd, sizeof cd, "hash/delete-%s", hn[k]);
        if (!bench_selected(o, ci) && !bench_selected(o, cd)) continue;
        htable *t = nvh_alloc(e->pool, sizeof *t, NULL, NULL, NULL);
        if (!t) { bench_error(o, "hash: %s", nvh_errormsg()); return; }
        hctx h = {e->pool, t, hv[k], 1, 1};
        double ns[64], dn[64];
        for (unsigned r = 0; r < o->runs; r++) {
            uint64_t log0;
            nvh_tx_stats st;
            bench_counts_begin(e->pool);
            nvh_tx_stats_get(e->pool, &st);
            log0 = st.bytes_logged;
            ns[r] = bench_time_ns(h_insert, &h, n) / n;
            if (r == o->runs - 1) emit_counts(o, ci, "nvheap", e->pool, n, log0);
            bench_counts_begin(e->pool);
            nvh_tx_stats_get(e->pool, &st);
            log0 = st.bytes_logged;
            dn[r] = bench_time_ns(h_delete, &h, n) / n;
            if (r == o->runs - 1) emit_counts(o, cd, "nvheap", e->pool, n, log0);
            if (r == o->runs - 1) {
                bench_emit(o, ci, "nvheap", "ns_per_op", bench_summarize(ns, o->runs), "ns");
                bench_emit(o, cd, "nvheap", "ns_per_op", bench_summarize(dn, o->runs), "ns");
            }
        }
        nvh_free(e->pool, t, NULL, 0);
    }
}

/* ==========================================================================
 * Main
 * ========================================================================== */
int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    for (int i = 0; i < opts.argc; i++) {
        if (strcmp(opts.argv[i], "--strict") == 0) tx_strict = 1;
        else bench_usage_error(&opts, "unknown option: %s", opts.argv[i]);
    }
    const char *dis = getenv("NVH_BENCH_TX_DISTURB");
    if (dis && strchr(dis, ':')) {
        static char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(dis, ':') - dis), dis);
        disturb_subj = name;
        disturb_every = strcmp(strchr(dis, ':') + 1, "all") == 0 ? 1 : 2;
    }
    if (!opts.child) {
        /* libpmem reads PMEM_IS_PMEM_FORCE when it loads: run in a child */
        const char *envs[] = {"PMEM_IS_PMEM_FORCE=1", NULL};
        const char *args[] = {tx_strict ? "--strict" : NULL, NULL};
        bench_run_child(&opts, envs, args);
        return bench_finish(&opts);
    }
    env e = {.opts = &opts};
    const char *p1 = bench_scratch_path(&opts, NULL, "nvheap");
    const char *p2 = bench_scratch_path(&opts, NULL, "nodur");
    const char *p3 = bench_scratch_path(&opts, NULL, "pmdk");
    e.pool = nvh_pool_create(p1, "bench", 192 * MIB, NVH_DOMAIN_PMEM);
    e.nodur = nvh_pool_create(p2, "bench", 16 * MIB, NVH_DOMAIN_PROCESS);
    if (!e.pool || !e.nodur) {
        bench_error(&opts, "cannot create pools: %s", nvh_errormsg());
        return bench_finish(&opts);
    }
    e.arr = nvh_alloc(e.pool, GUPS_N * 8, NULL, NULL, NULL);
    e.arr_nodur = nvh_alloc(e.nodur, 4096, NULL, NULL, NULL);
    e.pop = pmemobj_create(p3, "bench", 192 * MIB, 0600);
    if (!e.arr || !e.arr_nodur || !e.pop) {
        bench_error(&opts, "setup failed: %s / %s", nvh_errormsg(), pmemobj_errormsg());
        return bench_finish(&opts);
    }
    PMEMoid root = pmemobj_root(e.pop, GUPS_N * 8);
    e.parr = pmemobj_direct(root);
    PMEMoid coid, loid;
    e.carr = nvh_alloc(e.pool, (size_t)CONT_N * 64, NULL, NULL, NULL);
    if (!e.carr || pmemobj_zalloc(e.pop, &coid, (size_t)CONT_N * 64, 1) ||
        pmemobj_zalloc(e.pop, &loid, CONT_LOCKS * sizeof(PMEMmutex), 2)) {
        bench_error(&opts, "setup of the Fig. 5 arrays failed: %s / %s", nvh_errormsg(),
                    pmemobj_errormsg());
        return bench_finish(&opts);
    }
    e.floor_log = nvh_alloc(e.pool, 2 * FLOOR_LINES * 64, NULL, NULL, NULL);
    if (e.floor_log && ((uintptr_t)e.floor_log & 63)) e.floor_log = NULL;   /* lines only */
    e.pcarr = pmemobj_direct(coid);
    e.plocks = pmemobj_direct(loid);
    memset(e.carr, 0, (size_t)CONT_N * 64);
    nvh_persist(e.pool, e.carr, (size_t)CONT_N * 64);
    /* distinct values, so a swap always changes both words (an object
     * transaction logs nothing for an unchanged copy) */
    for (uint64_t i = 0; i < GUPS_N; i++) e.arr[i] = e.parr[i] = i + 1;
    nvh_persist(e.pool, e.arr, GUPS_N * 8);
    pmemobj_persist(e.pop, e.parr, GUPS_N * 8);
    nvh_pool_info pi;
    nvh_pool_info_get(e.pool, &pi);
    bench_note(&opts, "nvheap: pmem domain on %s (%s); PMDK: PMEM_IS_PMEM_FORCE=1 on the same "
               "directory", opts.dir, pi.flush_instruction);
    if (e.floor_log && strcmp(pi.flush_instruction, "clwb") != 0) {
        /* the floors execute CLWB themselves (valgrind, for one, hides it) */
        e.floor_log = NULL;
        bench_note(&opts, "floor subjects skipped: they need CLWB (the pool uses %s)",
                   pi.flush_instruction);
    }
    table3(&e);
    gups(&e);
    gups_mt(&e);
    contention(&e);
    hashbench(&e);
    pmemobj_close(e.pop);
    nvh_pool_close(e.pool);
    nvh_pool_close(e.nodur);
    return bench_finish(&opts);
}
