/* bench_recovery.c — pool open time after a crash, 10^3 to 10^7 live objects ([Schwalb15] Fig. 8)
 *
 * [Schwalb15] (nvm_malloc) section 4.2.2 measures the time until a recovered
 * allocator is usable again, for growing numbers of allocations, and expects
 * it not to depend on them (no scan of the heap at recovery). Here:
 *
 *   build   a forked child creates a pool and allocates N objects of 64 B,
 *           each with nvh_reserve + nvh_activate linking it into a link
 *           array in the root area (the application's reference to it), then
 *           _exit()s without nvh_pool_close: the file holds what a process
 *           crash leaves (unretired allocator log records included). The
 *           child builds in the process domain (on tmpfs every store reached
 *           the file; building is 4x faster than with CLWB).
 *   image   that crashed file is kept; every repetition copies it to a fresh
 *           work file (not timed), so each timed open is a recovery.
 *   case open/N, subject nvheap-crash:
 *           open_us        nvh_pool_open of the crashed copy, pmem domain
 *           first_alloc_us the first nvh_reserve + nvh_activate after it
 *                          (where a lazy rebuild of DRAM state would show)
 *           open_cpu_us, first_alloc_cpu_us  the same in CPU time of the
 *                          thread (user + system), which a loaded shared
 *                          machine does not inflate
 *   case open/N, subject nvheap-clean:
 *           the same after a clean nvh_pool_close of that pool.
 * After every recovery a sample of 1000 links is checked: each must point at
 * a live 64 B object (nvh_usable_size), and the object count is checked with
 * nvh_heap_stats_get (both not timed).
 *
 * Named mode (--named LIST, [Schwalb15] Fig. 8 as the paper ran it: recovery
 * time against the number of object-table entries): the child allocates N
 * named objects of 64 B (nvh_reserve_named + nvh_activate_named, names
 * "obj-<i>") instead of linked ones; case named_open/N, same subjects and
 * metrics; after every recovery a sample of 1000 names is looked up
 * (nvh_get_named) and checked. Named mode adds, each right after the first
 * allocation: first_named_us, nvh_get_named of a present name (open builds
 * the DRAM name index in the background: this lookup walks the tables'
 * chains), first_miss_us, nvh_get_named of an absent name,
 * first_create_us, nvh_reserve_named + nvh_activate_named of a new name
 * (freed again, untimed, after the next), and first_free_us, nvh_free of
 * the first allocation's object (it must know every name: it scans the
 * entries the build has not indexed yet), wall time.
 *
 * Options: --counts LIST (object counts, default 1000,10000,100000,1000000,
 * 10000000; quick 1000,10000,100000); --named LIST (named-object counts; then
 * only the named mode runs).
 */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)
#define OBJECT_SIZE 64u
#define LAYOUT "bench_recovery"
#define MAX_COUNTS 8
#define MAX_RUNS 32

/* ==========================================================================
 * Building a crashed pool (in a forked child)
 * ========================================================================== */
static bool g_named;          /* --named: objects are named, not linked */

static void obj_name(char *buf, size_t len, uint64_t i)
{
    snprintf(buf, len, "obj-%llu", (unsigned long long)i);
}

static int build_child(const char *path, uint64_t n)
{
    nvh_pool_options po = {.root_size = g_named ? 4096 : (n * sizeof(nvh_off_t) + 4095) & ~4095ull};
    /* named: each name also takes object-table space (tables grow by
     * doubling and fill to 3/4: at most 64 B x 8/3 x 2 per name) */
    uint64_t size = po.root_size + n * (OBJECT_SIZE + (g_named ? 448 : 8)) + 32 * MIB;
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, size, NVH_DOMAIN_PROCESS, &po);
    if (!pool) {
        fprintf(stderr, "bench_recovery: create %s: %s\n", path, nvh_errormsg());
        return 1;
    }
    nvh_off_t *links = nvh_root(pool, NULL);
    for (uint64_t i = 0; i < n && g_named; i++) {
        char name[32];
        obj_name(name, sizeof name, i);
        void *obj = nvh_reserve_named(pool, name, OBJECT_SIZE);
        if (!obj || (memset(obj, (int)(i & 0xff), OBJECT_SIZE), nvh_persist(pool, obj, OBJECT_SIZE),
                     nvh_activate_named(pool, name)) != NVH_OK) {
            fprintf(stderr, "bench_recovery: named object %llu: %s\n", (unsigned long long)i,
                    nvh_errormsg());
            return 1;
        }
    }
    for (uint64_t i = 0; i < n && !g_named; i++) {
        void *obj = nvh_reserve(pool, OBJECT_SIZE);
        if (!obj) {
            fprintf(stderr, "bench_recovery: reserve %llu: %s\n", (unsigned long long)i,
                    nvh_errormsg());
            return 1;
        }
        memset(obj, (int)(i & 0xff), OBJECT_SIZE);
        nvh_persist(pool, obj, OBJECT_SIZE);
        nvh_off_t *link = &links[i];
        if (nvh_activate(pool, obj, &link, 1) != NVH_OK) {
            fprintf(stderr, "bench_recovery: activate %llu: %s\n", (unsigned long long)i,
                    nvh_errormsg());
            return 1;
        }
    }
    return 0;                     /* the caller _exit()s: no close, a crash */
}

static int build_crashed(const bench_opts *opts, const char *path, uint64_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(build_child(path, n));
    if (pid < 0) {
        bench_error(opts, "fork: %s", strerror(errno));
        return -1;
    }
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        bench_error(opts, "building the pool of %llu objects failed", (unsigned long long)n);
        return -1;
    }
    return 0;
}

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY), out = -1, rc = -1;
    struct stat st;
    if (in < 0 || fstat(in, &st) != 0) goto done;
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0) goto done;
    off_t off = 0;
    while (off < st.st_size) {
        ssize_t n = sendfile(out, in, &off, (size_t)(st.st_size - off));
        if (n <= 0) goto done;
    }
    rc = 0;
done:
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return rc;
}

/* ==========================================================================
 * One timed open, then the checks
 * ========================================================================== */
typedef struct open_result {
    double open_ns, first_alloc_ns;     /* wall time                          */
    double first_named_ns, first_miss_ns, first_create_ns, first_free_ns; /* named, wall */
    double open_cpu_ns, first_alloc_cpu_ns; /* this thread's CPU time          */
} open_result;

/* CPU time of the calling thread (user + system): unlike wall time it does
 * not count the time other programs on a shared machine held the cores. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int check_pool(const bench_opts *opts, nvh_pool *pool, uint64_t n, uint64_t extra)
{
    nvh_off_t *links = nvh_root(pool, NULL);
    uint64_t step = n / 1000 ? n / 1000 : 1;
    for (uint64_t i = 0; i < n; i += step) {
        char name[32];
        obj_name(name, sizeof name, i);
        void *obj = g_named ? nvh_get_named(pool, name, NULL) : nvh_ptr(pool, links[i]);
        if (!obj || nvh_usable_size(pool, obj) < OBJECT_SIZE ||
            ((unsigned char *)obj)[0] != (unsigned char)(i & 0xff)) {
            bench_error(opts, "after recovery, %s %llu of %llu is wrong", g_named ? "name" : "link",
                        (unsigned long long)i, (unsigned long long)n);
            return -1;
        }
    }
    nvh_heap_stats st;
    if (nvh_heap_stats_get(pool, &st) != NVH_OK || st.live_objects != n + extra) {
        bench_error(opts, "after recovery: %llu live objects, expected %llu",
                    (unsigned long long)st.live_objects, (unsigned long long)(n + extra));
        return -1;
    }
    return 0;
}

/* Open path, time it and the first allocation after it, check, close. */
static int timed_open(const bench_opts *opts, const char *path, uint64_t n, uint64_t extra,
                      open_result *r)
{
    uint64_t c0 = thread_cpu_ns(), t0 = bench_now_ns();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PMEM);
    uint64_t t1 = bench_now_ns(), c1 = thread_cpu_ns();
    if (!pool) {
        bench_error(opts, "open %s: %s", path, nvh_errormsg());
        return -1;
    }
    /* the first allocation: a new object, linked from nowhere (it stays) */
    void *obj = nvh_reserve(pool, OBJECT_SIZE);
    int rc = obj ? nvh_activate(pool, obj, NULL, 0) : -1;
    uint64_t t2 = bench_now_ns(), c2 = thread_cpu_ns();
    if (rc != NVH_OK) {
        bench_error(opts, "first allocation after open: %s", nvh_errormsg());
        nvh_pool_close(pool);
        return -1;
    }
    r->open_ns = (double)(t1 - t0);
    r->first_alloc_ns = (double)(t2 - t1);
    r->open_cpu_ns = (double)(c1 - c0);
    r->first_alloc_cpu_ns = (double)(c2 - c1);
    uint64_t kept = 1;
    if (g_named) {
        char name[32];
        obj_name(name, sizeof name, n / 2);
        uint64_t t3 = bench_now_ns();
        void *hit = nvh_get_named(pool, name, NULL);
        uint64_t t4 = bench_now_ns();
        void *miss = nvh_get_named(pool, "no-such-object", NULL);
        uint64_t t5 = bench_now_ns();
        void *made = nvh_reserve_named(pool, "new-object", OBJECT_SIZE);
        int crc = made ? nvh_activate_named(pool, "new-object") : -1;
        uint64_t t6 = bench_now_ns();
        rc = nvh_free(pool, obj, NULL, 0);
        uint64_t t7 = bench_now_ns();
        if (crc == NVH_OK) crc = nvh_free_named(pool, "new-object");
        if (!hit || miss || rc != NVH_OK || crc != NVH_OK) {
            bench_error(opts, "named lookups after open: %s", nvh_errormsg());
            nvh_pool_close(pool);
            return -1;
        }
        r->first_named_ns = (double)(t4 - t3);
        r->first_miss_ns = (double)(t5 - t4);
        r->first_create_ns = (double)(t6 - t5);
        r->first_free_ns = (double)(t7 - t6);
        kept = 0;
    }
    rc = check_pool(opts, pool, n, extra + kept);
    nvh_pool_close(pool);
    return rc;
}

/* ==========================================================================
 * One object count
 * ========================================================================== */
static void emit_us(const bench_opts *opts, const char *name, const char *subject,
                    const char *metric, const double *ns, unsigned runs)
{
    double us[MAX_RUNS];
    for (unsigned r = 0; r < runs; r++) us[r] = ns[r] / 1e3;
    bench_emit(opts, name, subject, metric, bench_summarize(us, runs), "us");
}

/* crash_open_median: the medians of the open after a crash [0] and of the
 * first allocation after it [2] (wall), and their CPU times [1], [3] */
static void run_count(const bench_opts *opts, uint64_t n, double *crash_open_median)
{
    char name[64];
    snprintf(name, sizeof name, "%sopen/%llu", g_named ? "named_" : "", (unsigned long long)n);
    if (!bench_selected(opts, name)) return;
    const char *image = bench_scratch_path(opts, NULL, "image");
    const char *work = bench_scratch_path(opts, NULL, "work");
    unsigned runs = opts->runs;
    double crash_open[MAX_RUNS], crash_first[MAX_RUNS], clean_open[MAX_RUNS],
        clean_first[MAX_RUNS], crash_open_cpu[MAX_RUNS], crash_first_cpu[MAX_RUNS],
        clean_open_cpu[MAX_RUNS], clean_first_cpu[MAX_RUNS], crash_named[MAX_RUNS],
        crash_miss[MAX_RUNS], crash_create[MAX_RUNS], crash_free[MAX_RUNS];
    uint64_t t0 = bench_now_ns();
    if (!image || !work || build_crashed(opts, image, n) != 0) goto out;
    struct stat st;
    stat(image, &st);
    bench_note(opts, "%llu objects: built in %.1f s, pool file %.1f MiB", (unsigned long long)n,
               (double)(bench_now_ns() - t0) / 1e9, (double)st.st_size / (double)MIB);
    for (unsigned r = 0; r < runs; r++) {
        open_result a, b;
        if (copy_file(image, work) != 0) {
            bench_error(opts, "copying %s: %s", image, strerror(errno));
            goto out;
        }
        /* the crashed copy (recovery), then the same pool after a clean close */
        if (timed_open(opts, work, n, 0, &a) != 0 ||
            timed_open(opts, work, n, g_named ? 0 : 1, &b) != 0)
            goto out;
        crash_named[r] = a.first_named_ns;
        crash_miss[r] = a.first_miss_ns;
        crash_create[r] = a.first_create_ns;
        crash_free[r] = a.first_free_ns;
        crash_open[r] = a.open_ns;
        crash_first[r] = a.first_alloc_ns;
        clean_open[r] = b.open_ns;
        clean_first[r] = b.first_alloc_ns;
        crash_open_cpu[r] = a.open_cpu_ns;
        crash_first_cpu[r] = a.first_alloc_cpu_ns;
        clean_open_cpu[r] = b.open_cpu_ns;
        clean_first_cpu[r] = b.first_alloc_cpu_ns;
        bench_scratch_remove(work);
        work = bench_scratch_path(opts, NULL, "work");
        if (!work) goto out;
    }
    emit_us(opts, name, "nvheap-crash", "open_us", crash_open, runs);
    emit_us(opts, name, "nvheap-crash", "first_alloc_us", crash_first, runs);
    emit_us(opts, name, "nvheap-clean", "open_us", clean_open, runs);
    emit_us(opts, name, "nvheap-clean", "first_alloc_us", clean_first, runs);
    emit_us(opts, name, "nvheap-crash", "open_cpu_us", crash_open_cpu, runs);
    emit_us(opts, name, "nvheap-crash", "first_alloc_cpu_us", crash_first_cpu, runs);
    emit_us(opts, name, "nvheap-clean", "open_cpu_us", clean_open_cpu, runs);
    emit_us(opts, name, "nvheap-clean", "first_alloc_cpu_us", clean_first_cpu, runs);
    if (g_named) {
        emit_us(opts, name, "nvheap-crash", "first_named_us", crash_named, runs);
        emit_us(opts, name, "nvheap-crash", "first_miss_us", crash_miss, runs);
        emit_us(opts, name, "nvheap-crash", "first_create_us", crash_create, runs);
        emit_us(opts, name, "nvheap-crash", "first_free_us", crash_free, runs);
    }
    crash_open_median[0] = bench_median(crash_open, runs);
    crash_open_median[1] = bench_median(crash_open_cpu, runs);
    crash_open_median[2] = bench_median(crash_first, runs);
    crash_open_median[3] = bench_median(crash_first_cpu, runs);
out:
    if (image) bench_scratch_remove(image);
    if (work) bench_scratch_remove(work);
}

static const bench_info info = {
    .name = "recovery",
    .summary = "pool open time after a crash, 10^3 to 10^7 live objects ([Schwalb15] Fig. 8)",
    .baseline = "nvheap-clean",
    .ratio_metric = "open_us",
    .usage = "  --counts LIST      object counts, comma-separated (default 1000,...,10000000;\n"
             "                     quick 1000,10000,100000)\n"
             "  --named LIST       named-object counts ([Schwalb15] Fig. 8: recovery time\n"
             "                     against object-table entries); only this mode runs\n",
};

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t counts[MAX_COUNTS] = {1000, 10000, 100000, 1000000, 10000000};
    unsigned ncounts = opts.quick ? 3 : 5;
    for (int i = 0; i < opts.argc; i++) {
        bool named = strcmp(opts.argv[i], "--named") == 0;
        if ((named || strcmp(opts.argv[i], "--counts") == 0) && i + 1 < opts.argc) {
            g_named = g_named || named;
            const char *p = opts.argv[++i];
            ncounts = 0;
            while (*p && ncounts < MAX_COUNTS) {
                char *end;
                unsigned long long v = strtoull(p, &end, 10);
                if (end == p || v == 0 || v > 100000000ull || (*end && *end != ','))
                    bench_usage_error(&opts, "%s: bad list", named ? "--named" : "--counts");
                counts[ncounts++] = v;
                p = *end ? end + 1 : end;
            }
        } else {
            bench_usage_error(&opts, "unknown option or missing value: %s", opts.argv[i]);
        }
    }
    if (opts.runs > MAX_RUNS) bench_usage_error(&opts, "--runs: at most %d", MAX_RUNS);
    bench_note(&opts, "objects of %u B, each %s; crash = _exit "
               "without close; open in the pmem domain (%s); %u runs", OBJECT_SIZE,
               g_named ? "named (object table)" : "linked from the root area",
               nvh_flush_kind_name(nvh_flush_kind_detect()), opts.runs);
    double median[MAX_COUNTS][4] = {{0}};   /* [count][open wall, cpu, first wall, cpu] */
    for (unsigned c = 0; c < ncounts; c++) run_count(&opts, counts[c], median[c]);
    unsigned last = ncounts - 1;
    if (ncounts > 1 && median[0][0] > 0 && median[last][0] > 0)
        bench_note(&opts, "open after crash: %llu %sobjects %.0f us (CPU %.0f us), %llu objects "
                   "%.0f us (CPU %.0f us): ratio %.2f (CPU %.2f) (target: < 5 ms, ratio <= 2)",
                   (unsigned long long)counts[last], g_named ? "named " : "", median[last][0] / 1e3,
                   median[last][1] / 1e3, (unsigned long long)counts[0], median[0][0] / 1e3,
                   median[0][1] / 1e3, median[last][0] / median[0][0],
                   median[last][1] / median[0][1]);
    if (median[last][2] > 0)
        bench_note(&opts, "first allocation after the open of the crashed pool of %llu objects: "
                   "%.0f us (CPU %.0f us) (target: < 2 ms)", (unsigned long long)counts[last],
                   median[last][2] / 1e3, median[last][3] / 1e3);
    return bench_finish(&opts);
}
