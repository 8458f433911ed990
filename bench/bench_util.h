/* bench_util.h — what every benchmark program shares.
 *
 *   Options      --quick --json --runs N --time MS --only SUBSTR --dir PATH
 *                --baseline SUBJECT --json-out FILE, parsed by bench_parse();
 *                the program's own options are left in opts.argc/argv.
 *   Timing       a monotonic clock, a timed call of a loop body, and a
 *                calibration that picks the iteration count for --time.
 *   Repetitions  every measurement is repeated --runs times (default 5, quick
 *                3) and reported as median, min and max.
 *   Output       with --json one line per result, exactly
 *                  {"bench": B, "case": C, "subject": S, "metric": M,
 *                   "value": V, "unit": U}
 *                (value = the median); otherwise a table printed at the end,
 *                one row per (case, subject), one column per metric, and a
 *                ratio column: this subject's ratio metric divided by the
 *                baseline subject's in the same case.
 *   Counters     nvheap's per-pool statistics (nvh_stats_get) turned into
 *                per-operation figures: lines_per_op, fences_per_op, ...
 *   Scratch      pool file paths that are removed at exit and on SIGINT/TERM.
 *   Children     re-running this program with a different environment (for
 *                peers such as libpmem that fix their behaviour when loaded);
 *                a child's results merge into the parent's output.
 *
 * Case names are "GROUP/VARIANT" (e.g. "persist_line/pmem-clwb"): the table
 * keeps the rows of one group together and plot.py draws one panel per group.
 * Subjects name what is measured: nvheap, pmdk, glibc, jemalloc, mimalloc,
 * memcached, ...
 */
#ifndef NVH_BENCH_UTIL_H
#define NVH_BENCH_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "nvheap.h"

/* ==========================================================================
 * Options
 * ========================================================================== */
typedef struct bench_info {
    const char *name;           /* "persist": the "bench" field of every result */
    const char *summary;        /* one line for --help                          */
    const char *baseline;       /* default subject of the ratio column          */
    const char *ratio_metric;   /* metric the ratio is computed on              */
    const char *usage;          /* help for the program's own options, or NULL  */
} bench_info;

typedef struct bench_opts {
    const bench_info *info;
    bool quick;                 /* --quick: smoke-test size, whole run < 10 s   */
    bool json;                  /* --json: JSON lines on stdout                 */
    bool child;                 /* --child: internal, raw records for a parent  */
    unsigned runs;              /* --runs N: repetitions per measurement        */
    double time_ns;             /* --time MS: duration of one measurement       */
    const char *baseline;       /* --baseline SUBJECT                           */
    const char *only;           /* --only SUBSTR: cases whose name contains it  */
    const char *dir;            /* --dir PATH: scratch files ($NVHEAP_BENCH_DIR
                                   or /dev/shm)                                 */
    const char *json_out;       /* --json-out FILE: JSON lines also go there    */
    int argc;                   /* the program's own arguments, in order        */
    char **argv;
} bench_opts;

/* Parse the common options; exits with usage on --help or a bad value. The
 * arguments it does not know stay in opts->argc/argv for the program, which
 * should reject the ones it does not know either (bench_usage_error). */
void bench_parse(bench_opts *opts, const bench_info *info, int argc, char **argv);
/* Print "NAME: message" and the usage hint to stderr, exit 2. */
void bench_usage_error(const bench_opts *opts, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
/* Whether a case of this name is selected by --only. */
bool bench_selected(const bench_opts *opts, const char *case_name);

/* ==========================================================================
 * Timing
 * ========================================================================== */
/* The loop under test: runs `iters` operations on `ctx`. The loop lives in the
 * body, so the indirect call is paid once per measurement, not per op. */
typedef void (*bench_body_fn)(void *ctx, uint64_t iters);

/* splitmix64: reproducible pseudo-random keys and choices from the seed in *s. */
static inline uint64_t bench_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Library-free floor subjects (bench_tx, bench_kv): the bare instructions,
 * with no domain, counting or fallback, so a floor measures only the
 * hardware (CLWB must exist: the floors run in the pmem domain's setting). */
static inline void bench_clwb(const void *p)
{
#if defined(__x86_64__)
    __asm__ volatile("clwb %0" : "+m"(*(volatile char *)p));
#else
    (void)p;
#endif
}

static inline void bench_sfence(void)
{
#if defined(__x86_64__)
    __asm__ volatile("sfence" ::: "memory");
#endif
}

uint64_t bench_now_ns(void);                      /* CLOCK_MONOTONIC */
/* Elapsed nanoseconds of one call body(ctx, iters). */
double bench_time_ns(bench_body_fn body, void *ctx, uint64_t iters);
/* Iteration count that makes one call last about opts->time_ns * scale
 * (doubling trial calls, which also warm caches and page tables up). */
uint64_t bench_calibrate(const bench_opts *opts, bench_body_fn body, void *ctx, double scale);

/* ==========================================================================
 * Repetitions
 * ========================================================================== */
typedef struct bench_summary {
    double median, min, max;
    unsigned n;
} bench_summary;

double bench_median(const double *values, unsigned n);   /* n >= 1 */
bench_summary bench_summarize(const double *values, unsigned n);
/* A single exact figure (a count): median = min = max = value. */
bench_summary bench_exact(double value);

/* ==========================================================================
 * Output
 * ========================================================================== */
/* Record one result. With --json it is printed at once; otherwise it is kept
 * for the table bench_finish prints. Non-finite values are dropped. */
void bench_emit(const bench_opts *opts, const char *case_name, const char *subject,
                const char *metric, bench_summary value, const char *unit);
/* A remark about the run (what was verified, what was skipped): printed at
 * once, to stdout before the table, or to stderr in --json mode. */
void bench_note(const bench_opts *opts, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Record a failure (printed to stderr); bench_finish then returns 1. */
void bench_error(const bench_opts *opts, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Print the table (unless --json), close --json-out, return the exit status. */
int bench_finish(const bench_opts *opts);
/* A result recorded so far in this process (children's included): 0 and
 * *out, or -1 if there is none (in --json mode nothing is kept). */
int bench_result(const char *case_name, const char *subject, const char *metric,
                 bench_summary *out);

/* ==========================================================================
 * nvheap counters per operation
 * ========================================================================== */
typedef struct bench_counts {
    double lines_per_op;      /* 64 B lines flushed (or NT-copied)  */
    double fences_per_op;     /* nvh_drain calls                     */
    double msyncs_per_op;     /* msync(2) calls made                 */
    double nt_bytes_per_op;   /* bytes written with NT stores        */
} bench_counts;

/* Reset the pool's counters before a measured loop. */
void bench_counts_begin(nvh_pool *pool);
/* The pool's counters since bench_counts_begin, divided by ops. */
bench_counts bench_counts_per_op(const nvh_pool *pool, uint64_t ops);
/* Emit lines_per_op and fences_per_op, plus msyncs_per_op and
 * nt_bytes_per_op when non-zero. */
void bench_emit_counts(const bench_opts *opts, const char *case_name, const char *subject,
                       const bench_counts *counts);

/* ==========================================================================
 * Scratch files
 * ========================================================================== */
/* A path "DIR/nvh-bench-NAME-PID-TAG" that does not exist (removed if it
 * did), registered for removal at exit and on SIGINT/TERM/HUP/PIPE. dir NULL
 * means opts->dir. The string stays valid until bench_scratch_remove. */
const char *bench_scratch_path(const bench_opts *opts, const char *dir, const char *tag);
/* Remove the file now and forget it. */
void bench_scratch_remove(const char *path);

/* ==========================================================================
 * Child runs
 * ========================================================================== */
/* Run this program again with `--child`, the common options of this run, and
 * `args` (NULL-terminated), in this environment plus `env` ("NAME=VALUE"
 * strings, NULL-terminated). Its results and notes are merged as if produced
 * here. Returns 0, or -1 (recorded with bench_error) if it failed. */
int bench_run_child(const bench_opts *opts, const char *const *env, const char *const *args);

/* Run this program's own arguments again as a child with
 * PMEM_IS_PMEM_FORCE=1 (libpmem reads it when it loads, so it must be set
 * before the program starts), then finish: returns bench_finish's result. */
int bench_run_pmem_forced(const bench_opts *opts);

#endif /* NVH_BENCH_UTIL_H */
