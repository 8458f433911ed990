/* bench_wear.c — writes per 64 B line under random alloc/free, glibc vs nvheap ([Moraru11] Fig. 4)
 *
 * [Moraru11] (NVMalloc) section 8.1.1: 100,000 random operations (half
 * allocations, half frees, sizes uniform in 10 B .. 4 KB, every block written
 * once), stores recorded with binary instrumentation, writes counted per 64 B
 * line, consecutive stores to one line coalesced. [Moraru11] found malloc's
 * writes concentrated on few lines (LIFO reuse of freed blocks, in-place
 * metadata) and 1.3x more writes in total than NVMalloc.
 *
 * Here the workload is bench/wear_driver.c, run under
 *   valgrind --tool=lackey --trace-mem=yes --log-fd=N
 * and this program parses lackey's trace from a pipe as it comes:
 *   - only stores count: lackey's " S addr,size" and " M addr,size" (modify
 *     = load + store) records; a store covering two lines counts for both;
 *   - coalescing: a store to line L is a new write of L unless the previous
 *     store of the trace (to any address) was to L as well;
 *   - only the workload's stores: between the driver's two stores to its
 *     marker line (address from `valgrind --tool=none wear_driver
 *     --print-marker`, verified against the driver's own report);
 *   - only stores into the heap: the driver's RANGE lines (nvheap: the pool
 *     mapping, persistent metadata included; glibc: the pages that held
 *     blocks, in-heap chunk headers and free-list links included).
 * Subjects: glibc (malloc), nvheap-T0 (don't-allocate delay T = 0) and
 * nvheap-T<ms> (T = --delay-ms, default 2000: the 100 ms [Moraru11] used
 * natively, scaled like [Moraru11]'s 2 s under Pin, since lackey slows the
 * driver down ~50-100x; the note reports the real ops/s under valgrind).
 *
 * Case wear/OPS. Metrics: total_writes, lines_written, max_writes_per_line
 * (the most-written line), p99_writes_per_line, mean_writes_per_line.
 * --png FILE also draws the histogram (lines per writes-per-line count, one
 * curve per subject) with bench/wear_plot.py; its data go to FILE.jsonl.
 * Options: --ops N (default 100000, quick 5000), --delay-ms MS, --png FILE,
 * --seed N.
 */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NVH_BENCH_SOURCE_DIR
#define NVH_BENCH_SOURCE_DIR "bench"
#endif

#define MAX_RANGES 65536

/* ==========================================================================
 * Per-line write counts: an open-addressing hash table keyed by line number
 * ========================================================================== */
typedef struct line_table {
    uint64_t *keys;             /* line number + 1; 0 = empty                 */
    uint32_t *counts;
    size_t cap, used;
} line_table;

static int table_init(line_table *t, size_t cap)
{
    t->cap = cap;
    t->used = 0;
    t->keys = calloc(cap, sizeof *t->keys);
    t->counts = calloc(cap, sizeof *t->counts);
    return t->keys && t->counts ? 0 : -1;
}

static void table_free(line_table *t)
{
    free(t->keys);
    free(t->counts);
}

static inline size_t table_slot(const line_table *t, uint64_t key)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (t->cap - 1);
}

static int table_add(line_table *t, uint64_t line);

static int table_grow(line_table *t)
{
    line_table bigger;
    if (table_init(&bigger, t->cap * 2) != 0) return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->keys[i]) continue;
        size_t s = table_slot(&bigger, t->keys[i]);
        while (bigger.keys[s]) s = (s + 1) & (bigger.cap - 1);
        bigger.keys[s] = t->keys[i];
        bigger.counts[s] = t->counts[i];
        bigger.used++;
    }
    table_free(t);
    *t = bigger;
    return 0;
}

static int table_add(line_table *t, uint64_t line)
{
    uint64_t key = line + 1;
    size_t s = table_slot(t, key);
    while (t->keys[s] && t->keys[s] != key) s = (s + 1) & (t->cap - 1);
    if (!t->keys[s]) {
        if ((t->used + 1) * 2 > t->cap) {
            if (table_grow(t) != 0) return -1;
            return table_add(t, line);
        }
        t->keys[s] = key;
        t->used++;
    }
    t->counts[s]++;
    return 0;
}

/* ==========================================================================
 * Parsing lackey's trace
 * ========================================================================== */
typedef struct trace_state {
    uint64_t marker_line;
    int phase;                  /* 0 before, 1 during, 2 after the workload   */
    uint64_t prev_line;         /* line of the previous store (coalescing)    */
    uint64_t stores;            /* store records seen during the workload     */
    line_table table;
} trace_state;

static inline int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One line of the trace: " S 0402a4c8,8" / " M ...": count it. */
static int trace_line(trace_state *st, const char *p)
{
    if (p[0] != ' ' || (p[1] != 'S' && p[1] != 'M') || p[2] != ' ') return 0;
    p += 3;
    uint64_t addr = 0;
    int v;
    while ((v = hexval(*p)) >= 0) {
        addr = addr << 4 | (uint64_t)v;
        p++;
    }
    if (*p != ',') return 0;
    uint64_t size = strtoull(p + 1, NULL, 10);
    if (size == 0) size = 1;
    uint64_t first = addr >> 6, last = (addr + size - 1) >> 6;
    for (uint64_t line = first; line <= last; line++) {
        if (line == st->marker_line) {
            if (st->phase < 2) st->phase++;
            st->prev_line = line;
            continue;
        }
        if (st->phase != 1) continue;
        if (line != st->prev_line && table_add(&st->table, line) != 0) return -1;
        st->prev_line = line;
    }
    if (st->phase == 1) st->stores++;
    return 0;
}

/* ==========================================================================
 * Running the driver under valgrind
 * ========================================================================== */
typedef struct subject {
    const char *name;
    bool nvheap;
    uint64_t delay_ns;
} subject;

typedef struct wear_result {
    uint64_t total, lines, max, p99;
    uint64_t max_offset;        /* most-written line, from the first range    */
    double mean;
    double seconds;             /* wall time under valgrind                   */
    uint64_t *hist_writes, *hist_lines; size_t hist_n;   /* histogram        */
} wear_result;

static char driver_path[PATH_MAX];

static int locate_driver(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return -1;
    *slash = 0;
    if (strlen(self) + sizeof "/wear_driver" > sizeof driver_path) return -1;
    strcpy(driver_path, self);
    strcat(driver_path, "/wear_driver");
    return access(driver_path, X_OK);
}

/* The marker's address under valgrind (the same in every valgrind run). */
static int read_marker(const bench_opts *opts, uint64_t *marker)
{
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "valgrind --tool=none -q '%s' --print-marker", driver_path);
    FILE *p = popen(cmd, "r");
    unsigned long long m = 0;
    int ok = p && fscanf(p, "%llx", &m) == 1;
    if (p) pclose(p);
    if (!ok || m == 0) {
        bench_error(opts, "could not read the marker address (%s)", cmd);
        return -1;
    }
    *marker = m;
    return 0;
}

typedef struct range { uint64_t lo, hi; } range;

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool in_ranges(const range *r, size_t n, uint64_t addr)
{
    size_t lo = 0, hi = n;                 /* sorted by lo, disjoint */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (addr < r[mid].lo) hi = mid;
        else if (addr >= r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

static int run_subject(const bench_opts *opts, const subject *sub, uint64_t ops, uint64_t seed,
                       uint64_t marker, wear_result *res)
{
    memset(res, 0, sizeof *res);
    char tag[64];
    snprintf(tag, sizeof tag, "%s.ranges", sub->name);
    const char *ranges_path = bench_scratch_path(opts, NULL, tag);
    snprintf(tag, sizeof tag, "%s.pool", sub->name);
    const char *pool_path = bench_scratch_path(opts, NULL, tag);
    if (!ranges_path || !pool_path) return -1;
    char ops_s[32], seed_s[32], delay_s[32], logfd[32];
    snprintf(ops_s, sizeof ops_s, "%llu", (unsigned long long)ops);
    snprintf(seed_s, sizeof seed_s, "%llu", (unsigned long long)seed);
    snprintf(delay_s, sizeof delay_s, "%llu", (unsigned long long)sub->delay_ns);

    int fds[2];
    if (pipe(fds) != 0) return -1;
    snprintf(logfd, sizeof logfd, "--log-fd=%d", fds[1]);
    fflush(NULL);
    uint64_t t0 = bench_now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
        const char *argv[] = {"valgrind", "--tool=lackey", "--trace-mem=yes", logfd,
                              driver_path, sub->nvheap ? "nvheap" : "glibc", ops_s, seed_s,
                              ranges_path, pool_path, delay_s, NULL};
        if (!sub->nvheap) argv[9] = NULL;
        execvp("valgrind", (char **)argv);
        _exit(127);
    }
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        return -1;
    }
    trace_state st = {.marker_line = marker >> 6, .prev_line = UINT64_MAX};
    if (table_init(&st.table, (size_t)1 << 20) != 0) return -1;
    FILE *in = fdopen(fds[0], "r");
    static char buf[1 << 20];
    setvbuf(in, buf, _IOFBF, sizeof buf);
    char line[256];
    int failed = 0;
    while (fgets(line, sizeof line, in))
        if (!failed && trace_line(&st, line) != 0) failed = 1;
    fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    res->seconds = (double)(bench_now_ns() - t0) / 1e9;
    if (failed || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || st.phase != 2) {
        bench_error(opts, "%s: the driver under valgrind failed (status %d, phase %d%s)",
                    sub->name, status, st.phase, failed ? ", out of memory" : "");
        table_free(&st.table);
        return -1;
    }

    /* ---- the heap ranges, and the driver's own facts ---- */
    FILE *rf = fopen(ranges_path, "r");
    range *ranges = malloc(MAX_RANGES * sizeof *ranges);
    size_t nranges = 0;
    char text[256];
    while (rf && ranges && fgets(text, sizeof text, rf)) {
        unsigned long long lo, hi;
        void *m;
        if (sscanf(text, "RANGE %llx %llx", &lo, &hi) == 2 && nranges < MAX_RANGES) {
            ranges[nranges++] = (range){lo, hi};
        } else if (sscanf(text, "OPS allocs %*u frees %*u live %*u marker %p", &m) == 1) {
            if ((uint64_t)(uintptr_t)m != marker)
                bench_error(opts, "%s: marker at %p, expected %#llx", sub->name, m,
                            (unsigned long long)marker);
            text[strcspn(text, "\n")] = 0;
            bench_note(opts, "%s: %s", sub->name, text);
        } else if (strncmp(text, "INFO ", 5) == 0) {
            text[strcspn(text, "\n")] = 0;
            bench_note(opts, "%s: %s", sub->name, text + 5);
        }
    }
    if (rf) fclose(rf);
    bench_scratch_remove(ranges_path);
    bench_scratch_remove(pool_path);
    if (!ranges || nranges == 0) {
        bench_error(opts, "%s: no heap ranges reported", sub->name);
        free(ranges);
        table_free(&st.table);
        return -1;
    }
    qsort(ranges, nranges, sizeof *ranges, compare_u64);

    /* ---- counts of the lines inside the heap ---- */
    uint32_t *counts = malloc(st.table.used * sizeof *counts);
    size_t n = 0;
    for (size_t i = 0; counts && i < st.table.cap; i++) {
        if (!st.table.keys[i]) continue;
        uint64_t addr = (st.table.keys[i] - 1) << 6;
        if (!in_ranges(ranges, nranges, addr)) continue;
        counts[n++] = st.table.counts[i];
        res->total += st.table.counts[i];
        if (st.table.counts[i] > res->max) {
            res->max = st.table.counts[i];
            res->max_offset = addr - ranges[0].lo;
        }
    }
    free(ranges);
    table_free(&st.table);
    if (!counts || n == 0) {
        free(counts);
        bench_error(opts, "%s: no store hit the heap", sub->name);
        return -1;
    }
    res->lines = n;
    res->mean = (double)res->total / (double)n;
    uint64_t *sorted = malloc(n * sizeof *sorted);
    res->hist_writes = calloc(n, sizeof *res->hist_writes);
    res->hist_lines = calloc(n, sizeof *res->hist_lines);
    if (!sorted || !res->hist_writes || !res->hist_lines) {
        free(counts);
        free(sorted);
        return -1;
    }
    for (size_t i = 0; i < n; i++) sorted[i] = counts[i];
    free(counts);
    qsort(sorted, n, sizeof *sorted, compare_u64);
    res->p99 = sorted[(size_t)((double)(n - 1) * 0.99)];
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && sorted[j] == sorted[i]) j++;
        res->hist_writes[res->hist_n] = sorted[i];
        res->hist_lines[res->hist_n] = j - i;
        res->hist_n++;
        i = j;
    }
    free(sorted);
    bench_note(opts, "%s: %llu stores traced in the workload, %.0f s under valgrind "
               "(%.0f ops/s); most-written line at %s%#llx", sub->name,
               (unsigned long long)st.stores, res->seconds, (double)ops / res->seconds,
               sub->nvheap ? "pool offset " : "heap start + ",
               (unsigned long long)res->max_offset);
    return 0;
}

/* ==========================================================================
 * Main
 * ========================================================================== */
static const bench_info info = {
    .name = "wear",
    .summary = "writes per 64 B line under random alloc/free, glibc vs nvheap ([Moraru11] Fig. 4)",
    .baseline = "glibc",
    .ratio_metric = "total_writes",
    .usage = "  --ops N            operations (default 100000, quick 5000)\n"
             "  --delay-ms MS      T of the nvheap-T<MS> subject (default 2000)\n"
             "  --seed N           workload seed (default 1)\n"
             "  --png FILE         draw the histogram (data in FILE.jsonl)\n",
};

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t ops = opts.quick ? 5000 : 100000, delay_ms = 2000, seed = 1;
    const char *png = NULL;
    for (int i = 0; i < opts.argc; i++) {
        const char *arg = opts.argv[i];
        if (i + 1 >= opts.argc) bench_usage_error(&opts, "unknown option or missing value: %s", arg);
        const char *val = opts.argv[++i];
        char *end;
        if (strcmp(arg, "--png") == 0) {
            png = val;
            continue;
        }
        uint64_t v = strtoull(val, &end, 10);
        if (*end) bench_usage_error(&opts, "%s: bad number '%s'", arg, val);
        if (strcmp(arg, "--ops") == 0 && v > 0) ops = v;
        else if (strcmp(arg, "--delay-ms") == 0) delay_ms = v;
        else if (strcmp(arg, "--seed") == 0) seed = v;
        else bench_usage_error(&opts, "unknown option: %s", arg);
    }
    if (locate_driver() != 0) {
        bench_error(&opts, "wear_driver not found next to this program (%s)", driver_path);
        return bench_finish(&opts);
    }
    uint64_t marker;
    if (read_marker(&opts, &marker) != 0) return bench_finish(&opts);

    char tname[32];
    snprintf(tname, sizeof tname, "nvheap-T%llums", (unsigned long long)delay_ms);
    const subject subjects[] = {
        {"glibc", false, 0},
        {"nvheap-T0", true, 0},
        {tname, true, delay_ms * 1000000ull},
    };
    enum { NSUB = sizeof subjects / sizeof subjects[0] };
    char name[64];
    snprintf(name, sizeof name, "wear/%llu", (unsigned long long)ops);
    bench_note(&opts, "%llu ops (half allocs, half frees), sizes 10..4096 B, each block written "
               "once; lackey store trace, writes per 64 B line, consecutive stores to a line "
               "coalesced; one valgrind run per subject (exact counts, no repetitions)",
               (unsigned long long)ops);

    FILE *hist = NULL;
    char hist_path[PATH_MAX];
    if (png) {
        snprintf(hist_path, sizeof hist_path, "%s.jsonl", png);
        hist = fopen(hist_path, "w");
        if (!hist) bench_error(&opts, "%s: %s", hist_path, strerror(errno));
    }
    wear_result res[NSUB];
    bool ok[NSUB];
    for (int s = 0; s < NSUB; s++) {
        ok[s] = run_subject(&opts, &subjects[s], ops, seed, marker, &res[s]) == 0;
        if (!ok[s]) continue;
        const wear_result *r = &res[s];
        bench_emit(&opts, name, subjects[s].name, "total_writes", bench_exact((double)r->total),
                   "writes");
        bench_emit(&opts, name, subjects[s].name, "lines_written", bench_exact((double)r->lines),
                   "lines");
        bench_emit(&opts, name, subjects[s].name, "max_writes_per_line",
                   bench_exact((double)r->max), "writes");
        bench_emit(&opts, name, subjects[s].name, "p99_writes_per_line",
                   bench_exact((double)r->p99), "writes");
        bench_emit(&opts, name, subjects[s].name, "mean_writes_per_line", bench_exact(r->mean),
                   "writes");
        if (hist) {
            fprintf(hist, "{\"subject\": \"%s\", \"ops\": %llu, \"total\": %llu, \"max\": %llu, "
                    "\"hist\": [", subjects[s].name, (unsigned long long)ops,
                    (unsigned long long)r->total, (unsigned long long)r->max);
            for (size_t i = 0; i < r->hist_n; i++)
                fprintf(hist, "%s[%llu, %llu]", i ? ", " : "",
                        (unsigned long long)r->hist_writes[i], (unsigned long long)r->hist_lines[i]);
            fprintf(hist, "]}\n");
        }
        free(r->hist_writes);
        free(r->hist_lines);
    }
    for (int s = 1; s < NSUB; s++)
        if (ok[0] && ok[s])
            bench_note(&opts, "%s vs glibc: most-written line %.1fx fewer writes (target >= 10x), "
                       "total writes %.2fx fewer (target > 1; [Moraru11]: 1.3x)", subjects[s].name,
                       (double)res[0].max / (double)res[s].max,
                       (double)res[0].total / (double)res[s].total);
    if (hist) {
        fclose(hist);
        char cmd[3 * PATH_MAX];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/wear_plot.py' '%s' -o '%s'",
                 NVH_BENCH_SOURCE_DIR, hist_path, png);
        if (system(cmd) != 0) bench_error(&opts, "plotting failed: %s", cmd);
        else bench_note(&opts, "histogram: %s (data %s)", png, hist_path);
    }
    return bench_finish(&opts);
}
