/* bench_util.c — the shared benchmark helpers declared in bench_util.h:
 * option parsing, timing and calibration, medians, result output (JSON lines
 * or a table with a ratio column), nvheap counters per operation, scratch
 * files removed at exit, and child runs whose results merge into ours. */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Records a child sends its parent on stdout (tab-separated). */
#define CHILD_RESULT "@R\t"
#define CHILD_NOTE "@N\t"
#define CHILD_ERROR "@E\t"

/* --------------------------------------------------------------------------
 * State of this run
 * -------------------------------------------------------------------------- */
typedef struct result {
    char *case_name, *subject, *metric, *unit;
    bench_summary value;
} result;

static struct {
    result *items;
    size_t count, cap;
    unsigned errors;
    FILE *json_out;
    const char *argv0;
} run;

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

/* ==========================================================================
 * Options
 * ========================================================================== */
static void print_usage(const bench_info *info, FILE *out)
{
    fprintf(out,
            "usage: bench_%s [--quick] [--json] [--runs N] [options]\n"
            "  %s\n\n"
            "common options:\n"
            "  --quick            small smoke-test run (well under 10 s)\n"
            "  --json             one JSON object per result on stdout\n"
            "  --json-out FILE    also write the JSON lines to FILE\n"
            "  --runs N           repetitions of each measurement (default 5, quick 3);\n"
            "                     the median is reported, the table also shows min..max\n"
            "  --time MS          duration of one measurement (default 100, quick 2)\n"
            "  --only SUBSTR      run only the cases whose name contains SUBSTR\n"
            "  --baseline SUBJ    subject of the ratio column (default %s)\n"
            "  --dir PATH         scratch directory for pool files\n"
            "                     (default $NVHEAP_BENCH_DIR or /dev/shm)\n",
            info->name, info->summary, info->baseline ? info->baseline : "none");
    if (info->usage) fprintf(out, "\n%s options:\n%s", info->name, info->usage);
}

void bench_usage_error(const bench_opts *opts, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "bench_%s: ", opts->info->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(bench_%s --help lists the options)\n", opts->info->name);
    exit(2);
}

/* Match "--name VALUE" or "--name=VALUE"; on a match *value is set and *i
 * advanced past what was consumed. */
static bool option_value(const bench_opts *opts, int argc, char **argv, int *i,
                         const char *name, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        return true;
    }
    if (arg[n] != '\0') return false;
    if (*i + 1 >= argc) bench_usage_error(opts, "%s needs a value", name);
    *value = argv[++*i];
    return true;
}

static double parse_positive(const bench_opts *opts, const char *name, const char *text)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v > 0) || !isfinite(v))
        bench_usage_error(opts, "%s: '%s' is not a positive number", name, text);
    return v;
}

void bench_parse(bench_opts *opts, const bench_info *info, int argc, char **argv)
{
    memset(opts, 0, sizeof *opts);
    opts->info = info;
    opts->baseline = info->baseline;
    opts->argv = xmalloc(sizeof(char *) * (size_t)(argc + 1));
    run.argv0 = argv[0];

    unsigned runs = 0;
    double time_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            print_usage(info, stdout);
            exit(0);
        } else if (strcmp(arg, "--quick") == 0) {
            opts->quick = true;
        } else if (strcmp(arg, "--json") == 0) {
            opts->json = true;
        } else if (strcmp(arg, "--child") == 0) {
            opts->child = true;
        } else if (option_value(opts, argc, argv, &i, "--runs", &value)) {
            double v = parse_positive(opts, "--runs", value);
            if (v != floor(v) || v > 1000) bench_usage_error(opts, "--runs: '%s' is not 1..1000", value);
            runs = (unsigned)v;
        } else if (option_value(opts, argc, argv, &i, "--time", &value)) {
            time_ms = parse_positive(opts, "--time", value);
        } else if (option_value(opts, argc, argv, &i, "--only", &value)) {
            opts->only = value;
        } else if (option_value(opts, argc, argv, &i, "--dir", &value)) {
            opts->dir = value;
        } else if (option_value(opts, argc, argv, &i, "--baseline", &value)) {
            opts->baseline = value;
        } else if (option_value(opts, argc, argv, &i, "--json-out", &value)) {
            opts->json_out = value;
        } else {
            opts->argv[opts->argc++] = argv[i];
        }
    }
    opts->argv[opts->argc] = NULL;
    opts->runs = runs ? runs : opts->quick ? 3 : 5;
    opts->time_ns = (time_ms > 0 ? time_ms : opts->quick ? 2.0 : 100.0) * 1e6;
    if (!opts->dir) {
        const char *env = getenv("NVHEAP_BENCH_DIR");
        struct stat st;
        opts->dir = env && *env ? env : stat("/dev/shm", &st) == 0 ? "/dev/shm" : "/tmp";
    }
    if (opts->json_out && !opts->child) {
        run.json_out = fopen(opts->json_out, "w");
        if (!run.json_out)
            bench_usage_error(opts, "--json-out: cannot create %s: %s", opts->json_out,
                              strerror(errno));
    }
}

bool bench_selected(const bench_opts *opts, const char *case_name)
{
    return !opts->only || strstr(case_name, opts->only) != NULL;
}

/* ==========================================================================
 * Timing
 * ========================================================================== */
uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double bench_time_ns(bench_body_fn body, void *ctx, uint64_t iters)
{
    uint64_t start = bench_now_ns();
    body(ctx, iters);
    return (double)(bench_now_ns() - start);
}

uint64_t bench_calibrate(const bench_opts *opts, bench_body_fn body, void *ctx, double scale)
{
    double target = opts->time_ns * scale;
    uint64_t iters = 1;
    for (;;) {
        double t = bench_time_ns(body, ctx, iters);
        if (t >= target / 8 || iters >= ((uint64_t)1 << 40)) {
            double n = t > 0 ? target * (double)iters / t : (double)iters * 8;
            return n < 1 ? 1 : (uint64_t)n;
        }
        iters *= t < target / 64 ? 8 : 2;
    }
}

/* ==========================================================================
 * Repetitions
 * ========================================================================== */
static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const double *values, unsigned n)
{
    return bench_summarize(values, n).median;
}

bench_summary bench_summarize(const double *values, unsigned n)
{
    bench_summary s = {NAN, NAN, NAN, n};
    if (n == 0) return s;
    double *sorted = xmalloc(n * sizeof *sorted);
    memcpy(sorted, values, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_double);
    s.min = sorted[0];
    s.max = sorted[n - 1];
    s.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    free(sorted);
    return s;
}

bench_summary bench_exact(double value)
{
    return (bench_summary){value, value, value, 1};
}

/* ==========================================================================
 * Output
 * ========================================================================== */
static void json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20) fprintf(out, "\\u%04x", c);
        else fputc(c, out);
    }
    fputc('"', out);
}

static void json_line(FILE *out, const char *bench, const result *r)
{
    fputs("{\"bench\": ", out);
    json_string(out, bench);
    fputs(", \"case\": ", out);
    json_string(out, r->case_name);
    fputs(", \"subject\": ", out);
    json_string(out, r->subject);
    fputs(", \"metric\": ", out);
    json_string(out, r->metric);
    double v = r->value.median;
    if (fabs(v) >= 1e5) fprintf(out, ", \"value\": %.1f", v);
    else fprintf(out, ", \"value\": %.6g", v);
    fputs(", \"unit\": ", out);
    json_string(out, r->unit);
    fputs("}\n", out);
    fflush(out);
}

/* Tabs and newlines would break the child protocol; names never need them. */
static bool plain_field(const char *s)
{
    return !strpbrk(s, "\t\n\r");
}

void bench_emit(const bench_opts *opts, const char *case_name, const char *subject,
                const char *metric, bench_summary value, const char *unit)
{
    if (!isfinite(value.median)) return;
    if (opts->child) {
        if (!plain_field(case_name) || !plain_field(subject) || !plain_field(metric) ||
            !plain_field(unit))
            return;
        printf(CHILD_RESULT "%s\t%s\t%s\t%s\t%.17g\t%.17g\t%.17g\t%u\n", case_name, subject,
               metric, unit, value.median, value.min, value.max, value.n);
        fflush(stdout);
        return;
    }
    if (run.count == run.cap) {
        run.cap = run.cap ? run.cap * 2 : 256;
        result *grown = realloc(run.items, run.cap * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "bench: out of memory\n");
            exit(1);
        }
        run.items = grown;
    }
    result *r = &run.items[run.count++];
    r->case_name = xstrdup(case_name);
    r->subject = xstrdup(subject);
    r->metric = xstrdup(metric);
    r->unit = xstrdup(unit);
    r->value = value;
    if (opts->json) json_line(stdout, opts->info->name, r);
    if (run.json_out) json_line(run.json_out, opts->info->name, r);
}

static void vnote(const bench_opts *opts, const char *child_tag, FILE *out, const char *prefix,
                  const char *fmt, va_list ap)
{
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    for (char *p = text; *p; p++)
        if (*p == '\n' || *p == '\t') *p = ' ';
    if (opts->child) {
        printf("%s%s\n", child_tag, text);
        fflush(stdout);
    } else {
        fprintf(out, "%s%s\n", prefix, text);
        fflush(out);
    }
}

void bench_note(const bench_opts *opts, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(opts, CHILD_NOTE, opts->json ? stderr : stdout, "# ", fmt, ap);
    va_end(ap);
}

void bench_error(const bench_opts *opts, const char *fmt, ...)
{
    va_list ap;
    run.errors++;
    fflush(stdout);
    va_start(ap, fmt);
    vnote(opts, CHILD_ERROR, stderr, "bench error: ", fmt, ap);
    va_end(ap);
}

/* ---- the table ------------------------------------------------------------ */
static void format_number(char *buf, size_t size, double v)
{
    double a = fabs(v);
    if (a >= 1e15 || (a > 0 && a < 0.01)) snprintf(buf, size, "%.3g", v);
    else if (v == floor(v) || a >= 1000) snprintf(buf, size, "%.0f", v);
    else if (a >= 100) snprintf(buf, size, "%.1f", v);
    else snprintf(buf, size, "%.2f", v);
}

static size_t group_length(const char *case_name)
{
    const char *slash = strchr(case_name, '/');
    return slash ? (size_t)(slash - case_name) : strlen(case_name);
}

static const result *find_result(const char *case_name, const char *subject, const char *metric)
{
    for (size_t i = 0; i < run.count; i++) {
        const result *r = &run.items[i];
        if (strcmp(r->case_name, case_name) == 0 && strcmp(r->subject, subject) == 0 &&
            strcmp(r->metric, metric) == 0)
            return r;
    }
    return NULL;
}

int bench_result(const char *case_name, const char *subject, const char *metric,
                 bench_summary *out)
{
    const result *r = find_result(case_name, subject, metric);
    if (!r) return -1;
    *out = r->value;
    return 0;
}

typedef struct row {
    const char *case_name, *subject;
    size_t group;      /* index of the row's group in order of appearance */
    size_t order;      /* order of appearance                              */
} row;

static int compare_rows(const void *a, const void *b)
{
    const row *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static void print_table(const bench_opts *opts)
{
    if (run.count == 0) {
        printf("(no results)\n");
        return;
    }
    /* rows: distinct (case, subject), grouped by the case's group */
    row *rows = xmalloc(run.count * sizeof *rows);
    const char **groups = xmalloc(run.count * sizeof *groups);
    const char **metrics = xmalloc(run.count * sizeof *metrics);
    size_t nrows = 0, ngroups = 0, nmetrics = 0;
    bool spread = false;
    const char *ratio_metric = opts->info->ratio_metric;
    for (size_t i = 0; i < run.count; i++) {
        const result *r = &run.items[i];
        size_t m = 0;
        while (m < nmetrics && strcmp(metrics[m], r->metric) != 0) m++;
        if (m == nmetrics) metrics[nmetrics++] = r->metric;
        if (ratio_metric && strcmp(r->metric, ratio_metric) == 0 && r->value.n > 1) spread = true;
        size_t k = 0;
        while (k < nrows && !(strcmp(rows[k].case_name, r->case_name) == 0 &&
                              strcmp(rows[k].subject, r->subject) == 0))
            k++;
        if (k < nrows) continue;
        size_t len = group_length(r->case_name), g = 0;
        while (g < ngroups && !(group_length(groups[g]) == len &&
                                strncmp(groups[g], r->case_name, len) == 0))
            g++;
        if (g == ngroups) groups[ngroups++] = r->case_name;
        rows[nrows] = (row){r->case_name, r->subject, g, nrows};
        nrows++;
    }
    qsort(rows, nrows, sizeof *rows, compare_rows);

    /* cells: [row][column]; columns = case, subject, metrics (+ spread), ratio */
    size_t ncols = 2 + nmetrics + (spread ? 1 : 0) + 1;
    char (*cells)[48] = xmalloc(nrows * ncols * sizeof *cells);
    size_t *width = calloc(ncols, sizeof *width);
    const char **header = xmalloc(ncols * sizeof *header);
    if (!width) exit(1);
    size_t c = 0;
    header[c++] = "case";
    header[c++] = "subject";
    for (size_t m = 0; m < nmetrics; m++) {
        header[c++] = metrics[m];
        if (spread && strcmp(metrics[m], ratio_metric) == 0) header[c++] = "(min..max)";
    }
    header[c++] = "ratio";
    for (size_t r = 0; r < nrows; r++) {
        char (*cell)[48] = &cells[r * ncols];
        c = 0;
        snprintf(cell[c++], 48, "%.47s", rows[r].case_name);
        snprintf(cell[c++], 48, "%.47s", rows[r].subject);
        for (size_t m = 0; m < nmetrics; m++) {
            const result *res = find_result(rows[r].case_name, rows[r].subject, metrics[m]);
            if (res) format_number(cell[c], 48, res->value.median);
            else snprintf(cell[c], 48, "-");
            c++;
            if (spread && strcmp(metrics[m], ratio_metric) == 0) {
                char lo[20], hi[20];
                if (res && res->value.n > 1) {
                    format_number(lo, sizeof lo, res->value.min);
                    format_number(hi, sizeof hi, res->value.max);
                    snprintf(cell[c], 48, "(%s..%s)", lo, hi);
                } else {
                    snprintf(cell[c], 48, " ");
                }
                c++;
            }
        }
        const result *mine = ratio_metric ? find_result(rows[r].case_name, rows[r].subject,
                                                        ratio_metric) : NULL;
        const result *base = ratio_metric && opts->baseline
                                 ? find_result(rows[r].case_name, opts->baseline, ratio_metric)
                                 : NULL;
        if (mine && base && base->value.median != 0)
            snprintf(cell[c], 48, "%.2f", mine->value.median / base->value.median);
        else snprintf(cell[c], 48, "-");
    }
    for (c = 0; c < ncols; c++) {
        width[c] = strlen(header[c]);
        for (size_t r = 0; r < nrows; r++)
            if (strlen(cells[r * ncols + c]) > width[c]) width[c] = strlen(cells[r * ncols + c]);
    }

    printf("\n== bench %s: median of %u run%s", opts->info->name, opts->runs,
           opts->runs == 1 ? "" : "s");
    if (ratio_metric && opts->baseline)
        printf("; ratio = %s / %s's %s in the same case", ratio_metric, opts->baseline,
               ratio_metric);
    printf("\n");
    for (c = 0; c < ncols; c++)
        printf(c < 2 ? "%-*s  " : "%*s  ", (int)width[c], header[c]);
    printf("\n");
    for (size_t r = 0; r < nrows; r++) {
        if (r > 0 && rows[r].group != rows[r - 1].group) printf("\n");
        for (c = 0; c < ncols; c++)
            printf(c < 2 ? "%-*s  " : "%*s  ", (int)width[c], cells[r * ncols + c]);
        printf("\n");
    }
    fflush(stdout);
    free(rows);
    free(groups);
    free(metrics);
    free(cells);
    free(width);
    free(header);
}

int bench_finish(const bench_opts *opts)
{
    if (!opts->json && !opts->child) print_table(opts);
    if (run.json_out) {
        fclose(run.json_out);
        run.json_out = NULL;
    }
    return run.errors ? 1 : 0;
}

/* ==========================================================================
 * nvheap counters per operation
 * ========================================================================== */
void bench_counts_begin(nvh_pool *pool)
{
    nvh_stats_reset(pool);
}

bench_counts bench_counts_per_op(const nvh_pool *pool, uint64_t ops)
{
    nvh_stats s;
    nvh_stats_get(pool, &s);
    double n = ops ? (double)ops : 1;
    return (bench_counts){(double)s.lines_flushed / n, (double)s.fences / n,
                          (double)s.msyncs / n, (double)s.nt_bytes / n};
}

void bench_emit_counts(const bench_opts *opts, const char *case_name, const char *subject,
                       const bench_counts *counts)
{
    bench_emit(opts, case_name, subject, "lines_per_op", bench_exact(counts->lines_per_op),
               "lines");
    bench_emit(opts, case_name, subject, "fences_per_op", bench_exact(counts->fences_per_op),
               "fences");
    if (counts->msyncs_per_op > 0)
        bench_emit(opts, case_name, subject, "msyncs_per_op", bench_exact(counts->msyncs_per_op),
                   "msyncs");
    if (counts->nt_bytes_per_op > 0)
        bench_emit(opts, case_name, subject, "nt_bytes_per_op",
                   bench_exact(counts->nt_bytes_per_op), "bytes");
}

/* ==========================================================================
 * Scratch files
 * ========================================================================== */
#define SCRATCH_MAX 32
#define SCRATCH_PATH_MAX 512

static char scratch[SCRATCH_MAX][SCRATCH_PATH_MAX];
static volatile sig_atomic_t scratch_used[SCRATCH_MAX];

static void scratch_remove_all(void)
{
    for (unsigned i = 0; i < SCRATCH_MAX; i++)
        if (scratch_used[i]) {
            unlink(scratch[i]);     /* async-signal-safe */
            scratch_used[i] = 0;
        }
}

static void scratch_on_signal(int sig)
{
    scratch_remove_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void scratch_install_cleanup(void)
{
    static bool installed;
    if (installed) return;
    installed = true;
    atexit(scratch_remove_all);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = scratch_on_signal;
    sigemptyset(&sa.sa_mask);
    /* SIGPIPE: a child whose parent died is killed by its next write */
    const int signals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; i++)
        sigaction(signals[i], &sa, NULL);
}

const char *bench_scratch_path(const bench_opts *opts, const char *dir, const char *tag)
{
    scratch_install_cleanup();
    for (unsigned i = 0; i < SCRATCH_MAX; i++) {
        if (scratch_used[i]) continue;
        int n = snprintf(scratch[i], SCRATCH_PATH_MAX, "%s/nvh-bench-%s-%d-%s",
                         dir ? dir : opts->dir, opts->info->name, (int)getpid(), tag);
        if (n < 0 || n >= SCRATCH_PATH_MAX) {
            bench_error(opts, "scratch path in %s is too long", dir ? dir : opts->dir);
            return NULL;
        }
        unlink(scratch[i]);
        scratch_used[i] = 1;
        return scratch[i];
    }
    bench_error(opts, "more than %d scratch files at once", SCRATCH_MAX);
    return NULL;
}

void bench_scratch_remove(const char *path)
{
    if (!path) return;
    for (unsigned i = 0; i < SCRATCH_MAX; i++)
        if (scratch_used[i] && scratch[i] == path) {
            unlink(scratch[i]);
            scratch_used[i] = 0;
            return;
        }
    unlink(path);
}

/* ==========================================================================
 * Child runs
 * ========================================================================== */
/* Split a tab-separated record in place; returns the number of fields. */
static unsigned split_tabs(char *line, char **fields, unsigned max)
{
    unsigned n = 0;
    while (n < max) {
        fields[n++] = line;
        char *tab = strchr(line, '\t');
        if (!tab) break;
        *tab = '\0';
        line = tab + 1;
    }
    return n;
}

static void merge_child_line(const bench_opts *opts, char *line)
{
    size_t len = strlen(line);
    if (len && line[len - 1] == '\n') line[--len] = '\0';
    if (strncmp(line, CHILD_RESULT, 3) == 0) {
        char *f[8];
        if (split_tabs(line + 3, f, 8) != 8) {
            bench_error(opts, "malformed child record: %s", line + 3);
            return;
        }
        bench_summary s = {strtod(f[4], NULL), strtod(f[5], NULL), strtod(f[6], NULL),
                           (unsigned)strtoul(f[7], NULL, 10)};
        bench_emit(opts, f[0], f[1], f[2], s, f[3]);
    } else if (strncmp(line, CHILD_NOTE, 3) == 0) {
        bench_note(opts, "%s", line + 3);
    } else if (strncmp(line, CHILD_ERROR, 3) == 0) {
        bench_error(opts, "%s", line + 3);
    } else if (len) {
        bench_note(opts, "%s", line);   /* stray output: keep it visible */
    }
}

int bench_run_child(const bench_opts *opts, const char *const *env, const char *const *args)
{
    char runs[16], time_ms[32];
    snprintf(runs, sizeof runs, "%u", opts->runs);
    snprintf(time_ms, sizeof time_ms, "%.6g", opts->time_ns / 1e6);
    const char *argv[64];
    unsigned n = 0;
    argv[n++] = run.argv0;
    argv[n++] = "--child";
    argv[n++] = "--runs";
    argv[n++] = runs;
    argv[n++] = "--time";
    argv[n++] = time_ms;
    argv[n++] = "--dir";
    argv[n++] = opts->dir;
    if (opts->quick) argv[n++] = "--quick";
    if (opts->only) {
        argv[n++] = "--only";
        argv[n++] = opts->only;
    }
    for (unsigned i = 0; args && args[i]; i++) {
        if (n + 1 >= sizeof argv / sizeof argv[0]) {
            bench_error(opts, "too many child arguments");
            return -1;
        }
        argv[n++] = args[i];
    }
    argv[n] = NULL;

    int fds[2];
    if (pipe(fds) != 0) {
        bench_error(opts, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        bench_error(opts, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        for (unsigned i = 0; env && env[i]; i++) putenv(xstrdup(env[i]));
        execv("/proc/self/exe", (char *const *)argv);
        fprintf(stderr, "bench: cannot re-run /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    FILE *in = fdopen(fds[0], "r");
    if (!in) {
        close(fds[0]);
        bench_error(opts, "fdopen: %s", strerror(errno));
        waitpid(pid, NULL, 0);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) >= 0) merge_child_line(opts, line);
    free(line);
    fclose(in);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            bench_error(opts, "waitpid: %s", strerror(errno));
            return -1;
        }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    char what[256] = "";
    for (unsigned i = 0; args && args[i]; i++) {
        size_t used = strlen(what);
        snprintf(what + used, sizeof what - used, "%s%s", i ? " " : "", args[i]);
    }
    if (WIFSIGNALED(status))
        bench_error(opts, "child run [%s] died of signal %d", what, WTERMSIG(status));
    else
        bench_error(opts, "child run [%s] exited with status %d", what, WEXITSTATUS(status));
    return -1;
}

int bench_run_pmem_forced(const bench_opts *opts)
{
    const char *envs[] = {"PMEM_IS_PMEM_FORCE=1", NULL};
    const char *args[16] = {NULL};
    for (int i = 0; i < opts->argc && i < 15; i++) args[i] = opts->argv[i];
    bench_run_child(opts, envs, args);
    return bench_finish(opts);
}
