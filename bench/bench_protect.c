/* bench_protect.c — stray-write protection: off vs sync vs async intervals ([Moraru11] Table 4, Fig. 6)
 *
 * [Moraru11] §8.2 times 1 M B+ tree inserts (8 B keys, 256 B values) with no
 * protection, synchronous mprotect (with a page-state bitmap) and the
 * asynchronous service at several wait times, and plots the distribution of
 * the protection latency (request to applied) for 40 ms and 10 us.
 *
 * Workloads:
 *
 *   tree     the real B+ tree (include/nvheap.h section 10, default persist-
 *            groups mode, pmem domain as bench_btree): n puts of random 8 B
 *            keys with 256 B values (case tree/256B) and 4 KiB values
 *            (tree/4KB, --ops4k), then nvh_btree_sync, all in the time. The
 *            tree and the allocator open their own windows (unprotect a
 *            node/record before the update, protect once durable, as
 *            [Moraru11]'s tree did). --implicit is the stop-gap for a build in which
 *            they do not yet: each call runs inside an implicit library window
 *            (a fault opens a window on the page, the call's end closes it);
 *            those cases are named tree-implicit/... and the figures are
 *            "implicit windows". Without it, a store outside any window is
 *            counted (the measurement is dropped with a message).
 *
 * and three synthetic shapes (process domain, no flush: only protection
 * costs show), each op bracketing its stores with nvh_unprotect/nvh_protect:
 *
 *   random   one 256 B record at a uniformly random slot of N records
 *            (N x 256 B of records): every op on a cold page, the worst case
 *   btree    the write set of one B+ tree insert: a new 256 B record
 *            appended (log-like, as a bump allocator places them) and one
 *            16 B slot of a random 1 KiB leaf (N/16 leaves), two windows
 *   btree-early  the same, with the record pages' windows opened a block of
 *            64 pages ahead (what an allocator can do for its next chunk)
 *
 * Subjects: off (the baseline of the ratio column), sync, async-10us,
 * async-1ms, async-40ms, async-80ms, async-40ms-eager (unprotects applied in
 * the call, protects queued), async-40ms-strict / async-80ms-strict (no
 * second chance: every pass protects every unused page; the policy before).
 * Metrics: ns_per_op (wall time; ratio = overhead), paired_ratio (median
 * over runs of this subject's time over off's in the same run: the figure
 * to quote on a noisy machine), cpu_ns_per_op (CPU time
 * of all the process's threads, user + system, per op: the figure to trust
 * on a loaded machine), mprotect_per_op, pages_changed_per_op (pages whose
 * protection those calls changed: with a populated pool each one is a
 * page-table entry rewritten, ~150 ns here), faults_per_op (protection faults
 * resolved by the SIGSEGV handler: queued unprotects and implicit windows),
 * requests_per_op (queue entries), cache_misses_per_op (async: window opens
 * that found no unit in the thread's window cache, each one shared atomic
 * add; src/protect/cache.c), pass_us (async: wall time over the service's
 * passes, i.e. how often a pass actually ran; the interval when the service
 * keeps up), service_run / service_wait (async: the service thread's time
 * running and waiting on a run queue for a CPU, as fractions of the wall
 * time, from /proc/self/task/TID/schedstat), and for protect requests the
 * request-to-applied latency p50/p90/p99 and mean in microseconds. With
 * --cdf, cases fig6-WORKLOAD-INTERVAL/UPPER_MS carry the cumulative fraction
 * (from 1%) of protect requests applied within UPPER_MS milliseconds, from
 * the run with the median time (a line chart with --plot).
 *
 * --platform adds what a protection change costs the CPU that runs the
 * tree, on this machine, without nvheap: cases platform/fault-Npages (a
 * write to a read-only page whose SIGSEGV handler mprotects N pages
 * writable, against the same mprotect called directly: the signal's share)
 * and platform/ipi (a loop of in-cache loads, alone and while another
 * thread of the process, on another CPU, changes one page's protection
 * every 100 us: each change interrupts the loop's CPU with a TLB-shootdown
 * IPI; per_ipi_us is the loop's loss per change). docs/PROTECT.md,
 * "Measured": why opening pages ahead on the service's CPU loses.
 *
 * Every measurement is a fresh pool in --dir; synthetic areas are touched
 * once before timing; each run is checked for strays (none allowed).
 *
 * Options: --ops N (default 1000000, quick 10000), --ops4k N (default
 * 250000, quick 2000), --workloads LIST (tree,random,btree,btree-early),
 * --subjects LIST (the subjects above), --implicit, --cdf, --no-prefault,
 * --per-run, --service-fifo (the service thread at SCHED_FIFO: with it, a
 * pass never waits for a CPU, which separates scheduling delay from the
 * passes' own cost in Fig. 6)
 * (the tree's pool is prefaulted at create by default, as in bench_btree;
 * see g_prefault). Runs are run-major: run r of every subject, then run
 * r + 1, so a slow minute of the shared machine hits all subjects alike;
 * odd runs take the subjects in reverse order.
 *
 * Plugging in a workload: add an entry to `workloads[]` with bytes (pool
 * needed for n ops), optional setup (before protection is on), run (n ops,
 * durable at the end) and optional teardown.
 */
#include "bench_util.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)
#define VALUE 256u
#define VALUE_MAX 4096u
#define LEAF 1024u
#define MAX_RUNS 32

/* The stop-gap for layers that do not open their own windows yet: a
 * thread-local library window (src/protect/protect.h, exported for the
 * library's layers; not public API). --implicit wraps each tree call in one. */
void nvh_protect_internal_begin(nvh_pool *pool);
void nvh_protect_internal_end(nvh_pool *pool);

/* ==========================================================================
 * Workloads
 * ========================================================================== */
typedef struct wl_ctx {
    nvh_pool *pool;
    char *area;              /* start of the workload's pool memory          */
    uint64_t n;              /* ops of this run                              */
    uint64_t seed;
    uint64_t next;           /* append position                              */
    size_t vlen;             /* value bytes                                  */
    bool implicit;           /* tree: wrap each call in an implicit window   */
    nvh_btree *tree;
    const char *error;       /* set by a failing setup/run                   */
    unsigned char value[VALUE_MAX];
} wl_ctx;

typedef struct workload {
    const char *name;
    bool real;                           /* the real B+ tree (pmem domain,
                                            256 B and 4 KiB values)          */
    uint64_t (*bytes)(uint64_t n, size_t vlen);   /* pool bytes the run needs */
    bool (*setup)(wl_ctx *c);            /* before protection is on; NULL ok */
    void (*run)(wl_ctx *c);              /* c->n ops, durable at the end     */
    void (*teardown)(wl_ctx *c);         /* after the stats are read; NULL ok */
} workload;

static inline uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline void write_record(wl_ctx *c, char *p, uint64_t i)
{
    memcpy(c->value, &i, sizeof i);
    nvh_unprotect(c->pool, p, VALUE);
    memcpy(p, c->value, VALUE);
    nvh_persist(c->pool, p, VALUE);
    nvh_protect(c->pool, p, VALUE);
}

static uint64_t random_bytes(uint64_t n, size_t vlen) { (void)vlen; return n * VALUE; }
static void random_run(wl_ctx *c)
{
    for (uint64_t i = 0; i < c->n; i++)
        write_record(c, c->area + (rnd(&c->seed) % c->n) * VALUE, i);
}

static uint64_t btree_leaves(uint64_t n) { return n / 16 + 1; }
static uint64_t btree_bytes(uint64_t n, size_t vlen)
{
    (void)vlen;
    return n * VALUE + btree_leaves(n) * LEAF;
}
static void btree_run(wl_ctx *c)
{
    char *leaves = c->area + c->n * VALUE;
    uint64_t nleaves = btree_leaves(c->n);
    for (uint64_t i = 0; i < c->n; i++) {
        write_record(c, c->area + (c->next++) * VALUE, i);       /* the record */
        uint64_t r = rnd(&c->seed);
        char *slot = leaves + (r % nleaves) * LEAF + ((r >> 32) % (LEAF / 16)) * 16;
        uint64_t entry[2] = {r, (uint64_t)i * VALUE};            /* key, record offset */
        nvh_unprotect(c->pool, slot, sizeof entry);
        memcpy(slot, entry, sizeof entry);
        nvh_persist(c->pool, slot, sizeof entry);
        nvh_protect(c->pool, slot, sizeof entry);
    }
}

/* btree with the records' pages opened early: the window over the next
 * block of 64 record pages opens when the previous block starts filling, so
 * the service applies it (one coalesced mprotect) before the first store;
 * a block's window closes when the block after next starts. The per-record
 * windows stay (they are nested and cost no mprotect). What an allocator can
 * do for the chunk it is about to carve (docs/PROTECT.md). */
#define EARLY_PAGES 64u
static void open_block(wl_ctx *c, uint64_t blk, bool open)
{
    uint64_t bytes = (uint64_t)EARLY_PAGES * 4096, start = blk * bytes, total = c->n * VALUE;
    if (start >= total) return;
    uint64_t len = total - start < bytes ? total - start : bytes;
    if (open) nvh_unprotect(c->pool, c->area + start, len);
    else nvh_protect(c->pool, c->area + start, len);
}
static void btree_early_run(wl_ctx *c)
{
    const uint64_t per_block = (uint64_t)EARLY_PAGES * 4096 / VALUE;
    char *leaves = c->area + c->n * VALUE;
    uint64_t nleaves = btree_leaves(c->n);
    open_block(c, 0, true);
    for (uint64_t i = 0; i < c->n; i++) {
        if (i % per_block == 0) {
            uint64_t blk = i / per_block;
            open_block(c, blk + 1, true);
            if (blk >= 1) open_block(c, blk - 1, false);
        }
        write_record(c, c->area + (c->next++) * VALUE, i);
        uint64_t r = rnd(&c->seed);
        char *slot = leaves + (r % nleaves) * LEAF + ((r >> 32) % (LEAF / 16)) * 16;
        uint64_t entry[2] = {r, (uint64_t)i * VALUE};
        nvh_unprotect(c->pool, slot, sizeof entry);
        memcpy(slot, entry, sizeof entry);
        nvh_persist(c->pool, slot, sizeof entry);
        nvh_protect(c->pool, slot, sizeof entry);
    }
    uint64_t last = (c->n - 1) / per_block;   /* blocks last and last+1 are open */
    open_block(c, last, false);
    open_block(c, last + 1, false);
}

/* The real B+ tree (include/nvheap.h section 10, default GROUPS mode):
 * n puts of random 8 B keys, then nvh_btree_sync (durable, part of the
 * time). The tree opens its own windows (unprotect node/record before the
 * update, protect once durable; the allocator likewise): nothing here
 * brackets anything. With --implicit every call runs inside a library
 * implicit window instead (the stop-gap for a build whose tree/allocator
 * do not open windows yet): a protection fault of this thread on the pool
 * opens a window on the page, closed when the call returns. */
static uint64_t tree_bytes(uint64_t n, size_t vlen)
{
    /* as bench_btree: records (rounded to 64 B) + nodes + slack */
    return n * ((vlen + 32 + 63) / 64 * 64 + 64) + 64 * MIB;
}
static bool tree_setup(wl_ctx *c)
{
    /* [Moraru11] Table 4 measures the tree of persist groups, whose
     * durability trails the insert: the deferred mode, not the default. */
    nvh_btree_options bo = {.mode = NVH_BTREE_GROUPS,
                            .durability = NVH_BTREE_DURABLE_DEFERRED};
    c->tree = nvh_btree_open(c->pool, "protect", 1, &bo);
    if (!c->tree) c->error = nvh_errormsg();
    return c->tree != NULL;
}
static void tree_run(wl_ctx *c)
{
    for (uint64_t i = 0; i < c->n; i++) {
        uint64_t key = rnd(&c->seed);
        memcpy(c->value, &key, sizeof key);
        if (c->implicit) nvh_protect_internal_begin(c->pool);
        int rc = nvh_btree_put(c->tree, key, c->value, c->vlen);
        if (c->implicit) nvh_protect_internal_end(c->pool);
        if (rc != NVH_OK) { c->error = nvh_errormsg(); return; }
    }
    if (c->implicit) nvh_protect_internal_begin(c->pool);
    if (nvh_btree_sync(c->tree) != NVH_OK) c->error = nvh_errormsg();
    if (c->implicit) nvh_protect_internal_end(c->pool);
}
static void tree_teardown(wl_ctx *c)
{
    if (!c->tree) return;
    if (c->implicit) nvh_protect_internal_begin(c->pool);
    nvh_btree_close(c->tree);
    if (c->implicit) nvh_protect_internal_end(c->pool);
    c->tree = NULL;
}

static const workload workloads[] = {
    {"tree", true, tree_bytes, tree_setup, tree_run, tree_teardown},
    {"random", false, random_bytes, NULL, random_run, NULL},
    {"btree", false, btree_bytes, NULL, btree_run, NULL},
    {"btree-early", false, btree_bytes, NULL, btree_early_run, NULL},
};

/* ==========================================================================
 * Subjects (protection settings)
 * ========================================================================== */
typedef struct subject {
    const char *name;
    nvh_protect_mode mode;
    uint64_t interval_ns;
    unsigned flags;
    const char *cdf_name;    /* fig6 case name, or NULL */
} subject;

static const subject subjects[] = {
    {"off", NVH_PROTECT_OFF, 0, 0, NULL},    /* first in the table: paired_ratio divides by all[0] */
    {"sync", NVH_PROTECT_SYNC, 0, 0, NULL},
    {"async-10us", NVH_PROTECT_ASYNC, 10000, 0, "10us"},
    {"async-1ms", NVH_PROTECT_ASYNC, 1000000, 0, "1ms"},
    {"async-40ms", NVH_PROTECT_ASYNC, 40000000, 0, "40ms"},
    {"async-80ms", NVH_PROTECT_ASYNC, 80000000, 0, "80ms"},
    /* without the per-thread window cache (every window call updates the
     * shared count with a LOCKed instruction: the policy before it) */
    {"async-80ms-nocache", NVH_PROTECT_ASYNC, 80000000, NVH_PROTECT_NO_CACHE, NULL},
    {"async-40ms-eager", NVH_PROTECT_ASYNC, 40000000, NVH_PROTECT_EAGER_UNPROTECT, NULL},
    /* the policy before the second chance: every pass protects every unused page */
    {"async-40ms-strict", NVH_PROTECT_ASYNC, 40000000, NVH_PROTECT_STRICT, NULL},
    {"async-80ms-strict", NVH_PROTECT_ASYNC, 80000000, NVH_PROTECT_STRICT, NULL},
};
#define NSUBJECTS (sizeof subjects / sizeof subjects[0])

static const bench_info info = {
    .name = "protect",
    .summary = "stray-write protection: off vs sync vs async intervals ([Moraru11] Table 4, Fig. 6)",
    .baseline = "off",
    .ratio_metric = "ns_per_op",
    .usage = "  --ops N            operations per measurement (default 1000000, quick 10000)\n"
             "  --ops4k N          tree inserts with 4 KiB values (default 250000, quick 2000)\n"
             "  --workloads LIST   tree,random,btree,btree-early (default all)\n"
             "  --implicit         run each tree call inside an implicit library window\n"
             "                     (stop-gap while the tree/allocator lack windows; cases\n"
             "                     are then named tree-implicit/...)\n"
             "  --subjects LIST    off,sync,async-10us,async-1ms,async-40ms,async-80ms,\n"
             "                     async-80ms-nocache, async-40ms-eager, async-40ms-strict,\n"
             "                     async-80ms-strict\n"
             "                     (default all)\n"
             "  --cdf              also emit the protect-latency CDF (cases fig6-*)\n"
             "  --service-fifo     run the async service thread at SCHED_FIFO priority 1\n"
             "                     (needs root or CAP_SYS_NICE): no waiting for a CPU\n"
             "  --no-prefault      the tree's pool is not prefaulted at create (first-touch\n"
             "                     page faults inside the timed loop, in every subject)\n"
             "  --platform         also measure this machine's cost of a protection fault and\n"
             "                     of a TLB-shootdown IPI (cases platform/...; no nvheap)\n"
             "  --per-run          also print each run's time of each subject (a note line\n"
             "                     `run R CASE SUBJECT NS ns`: for pairing runs yourself)\n",
};

/* The tree workload's pool is prefaulted at create (NVH_POOL_PREFAULT, as
 * bench_btree does for both libraries), outside the timing: a long-running
 * program's pool is populated, and on this VM a first touch costs 1-2 us
 * per page in every subject, which dilutes the protection's share of the
 * time (and async's fault handler populates a run of pages in one call,
 * cheaper than off's one fault per page, which flattered async). With
 * protection, populated pages also make every protection change rewrite
 * present page-table entries: the stricter case. --no-prefault clears it. */
static bool g_prefault = true;

static bool listed(const char *list, const char *name)
{
    if (!list) return true;
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0) return true;
        p += n + (comma ? 1 : 0);
    }
    return false;
}

/* ==========================================================================
 * One measurement
 * ========================================================================== */
/* CPU time of the whole process (all threads, user + system): the cost of
 * protection including the service thread, and robust against a loaded
 * machine where wall time mostly measures waiting for a CPU. */
static uint64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct result {
    double ns_per_op, cpu_ns_per_op;
    double pass_us, svc_run, svc_wait;  /* service: wall time per pass; its run
                                           and run-queue wait, fractions of wall */
    double mprotect_per_op, pages_per_op, faults_per_op, requests_per_op, misses_per_op;
    nvh_protect_latency lat;      /* protect requests */
    uint64_t cdf_upper[400], cdf_count[400];
    unsigned cdf_n;
    bool ok;
} result;

/* A store the tree made outside any window (its own windows missing and no
 * --implicit): counted, allowed (the page stays writable), and the
 * measurement is thrown away with a message. Runs in the signal handler. */
static _Atomic uint64_t g_strays;
static nvh_stray_action count_stray(const nvh_stray_info *info, void *arg)
{
    (void)info;
    (void)arg;
    atomic_fetch_add_explicit(&g_strays, 1, memory_order_relaxed);
    return NVH_STRAY_ALLOW;
}

/* Whether thread `tid` of this process is the protect service thread: it
 * names itself "nvh-protect" when it first runs. */
static bool task_is_service(const char *tid)
{
    char path[320], comm[32];
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", tid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool is = fgets(comm, sizeof comm, f) && strncmp(comm, "nvh-protect", 11) == 0;
    fclose(f);
    return is;
}

/* The service thread ("nvh-protect") of this process: time it ran and time
 * it waited on a run queue, in ns (/proc/self/task/TID/schedstat). false if
 * there is none or the kernel has no schedstat. What a pass's latency is
 * made of beyond the interval: the passes themselves (run) and waiting for
 * a CPU (wait). */
static bool service_sched(uint64_t *run_ns, uint64_t *wait_ns)
{
    char path[320];
    bool found = false;
    DIR *d = opendir("/proc/self/task");
    if (!d) return false;
    struct dirent *de;
    while (!found && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        if (!task_is_service(de->d_name)) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long r, w;
        found = fscanf(f, "%llu %llu", &r, &w) == 2;
        fclose(f);
        if (found) { *run_ns = r; *wait_ns = w; }
    }
    closedir(d);
    return found;
}

/* --service-fifo: the service thread at real-time priority (SCHED_FIFO 1),
 * so that it never waits for a CPU behind other processes: the experiment
 * that tells scheduling delay from the cost of the passes themselves.
 * Needs the privilege to set it (root or CAP_SYS_NICE). */
static bool g_service_fifo;
static void service_fifo(void)
{
    for (int tries = 0; tries < 1000; tries++) {   /* it names itself when it first runs */
        DIR *d = opendir("/proc/self/task");
        if (!d) return;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            if (!task_is_service(de->d_name)) continue;
            struct sched_param sp = {.sched_priority = 1};
            if (sched_setscheduler((pid_t)atoi(de->d_name), SCHED_FIFO, &sp) != 0)
                fprintf(stderr, "--service-fifo: %s\n", strerror(errno));
            closedir(d);
            return;
        }
        closedir(d);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

typedef struct run_cfg {
    uint64_t n;
    size_t vlen;
    bool implicit;
} run_cfg;

static void measure(const bench_opts *o, const workload *w, const subject *s,
                    const run_cfg *cfg, unsigned run, result *res)
{
    memset(res, 0, sizeof *res);
    uint64_t n = cfg->n;
    const char *path = bench_scratch_path(o, NULL, "pool");
    uint64_t need = w->bytes(n, cfg->vlen) + 4 * MIB;
    uint64_t size = (need + 2 * MIB - 1) & ~(2 * MIB - 1);
    nvh_pool_options popt = {.max_size = 2 * size};
    /* the real tree runs as bench_btree does (pmem domain: CLWB + SFENCE);
     * the synthetic shapes in the process domain (no flush: only the
     * protection costs show) */
    nvh_pool *pool = nvh_pool_create_ex(path, "bench_protect", size,
                                        w->real ? NVH_DOMAIN_PMEM | (g_prefault ? NVH_POOL_PREFAULT : 0)
                                                : NVH_DOMAIN_PROCESS, &popt);
    if (!pool) {
        bench_error(o, "create %s: %s", path, nvh_errormsg());
        bench_scratch_remove(path);
        return;
    }
    nvh_pool_info pi;
    nvh_pool_info_get(pool, &pi);
    static wl_ctx c;
    memset(&c, 0, sizeof c);
    c.pool = pool;
    c.area = (char *)nvh_pool_base(pool) + pi.heap_offset;
    c.n = n;
    c.vlen = cfg->vlen;
    c.implicit = cfg->implicit;
    c.seed = 0x243F6A8885A308D3ull + run;
    memset(c.value, 0x5a, sizeof c.value);
    if (!w->real) memset(c.area, 0, w->bytes(n, cfg->vlen));   /* fault the pages in first */
    if (w->setup && !w->setup(&c)) {
        bench_error(o, "%s setup: %s", w->name, c.error ? c.error : "failed");
        goto out;
    }
    atomic_store(&g_strays, 0);
    if (s->mode != NVH_PROTECT_OFF) {
        nvh_protect_options po = {.mode = s->mode, .interval_ns = s->interval_ns,
                                  .flags = s->flags};
        if (nvh_protect_configure(pool, &po) != NVH_OK) {
            bench_error(o, "protect %s: %s", s->name, nvh_errormsg());
            goto out;
        }
        nvh_protect_set_stray_handler(pool, count_stray, NULL);
        nvh_protect_stats_reset(pool);
    }
    uint64_t size0 = nvh_pool_size(pool);
    /* the service thread names itself when it first runs: not found yet,
     * it has not run yet (its counters start at 0) */
    uint64_t sr0 = 0, sw0 = 0, sr1 = 0, sw1 = 0;
    bool sched = s->mode == NVH_PROTECT_ASYNC;
    if (sched && g_service_fifo) service_fifo();
    if (sched && !service_sched(&sr0, &sw0)) sr0 = sw0 = 0;
    uint64_t t0 = bench_now_ns(), c0 = cpu_now_ns();
    w->run(&c);
    nvh_protect_sync(pool);                 /* everything applied: part of the cost */
    uint64_t t1 = bench_now_ns(), c1 = cpu_now_ns();
    sched = sched && service_sched(&sr1, &sw1);
    /* a pool that grew inside the loop was populated inside it too: not
     * the cost being measured */
    if (nvh_pool_size(pool) > size0)
        bench_error(o, "%s/%s: the pool grew inside the timed loop (%llu -> %llu MiB): raise the "
                    "workload's size estimate", w->name, s->name, (unsigned long long)(size0 >> 20),
                    (unsigned long long)(nvh_pool_size(pool) >> 20));
    nvh_protect_stats st;
    nvh_protect_stats_get(pool, &st);
    /* off before the teardown: the tree's close writes outside our timing */
    nvh_protect_set_mode(pool, NVH_PROTECT_OFF, 0);
    if (c.error) {
        bench_error(o, "%s/%s: %s", w->name, s->name, c.error);
        goto out;
    }
    if (st.strays || st.unbalanced || atomic_load(&g_strays)) {
        bench_error(o, "%s/%s: %llu strays, %llu unbalanced%s", w->name, s->name,
                    (unsigned long long)st.strays, (unsigned long long)st.unbalanced,
                    w->real && !cfg->implicit
                        ? " (the tree/allocator do not open all their windows in this build: "
                          "--implicit runs them inside implicit windows)" : "");
        goto out;
    }
    res->ns_per_op = (double)(t1 - t0) / (double)n;
    res->cpu_ns_per_op = (double)(c1 - c0) / (double)n;
    res->mprotect_per_op = (double)st.mprotect_calls / (double)n;
    res->pages_per_op = (double)st.pages_changed / (double)n;
    res->faults_per_op = (double)(st.faults_resolved + st.internal_faults) / (double)n;
    res->requests_per_op = (double)st.requests / (double)n;
    res->misses_per_op = (double)st.cache_misses / (double)n;
    res->pass_us = st.batches ? (double)(t1 - t0) / (double)st.batches / 1000.0 : 0;
    res->svc_run = sched ? (double)(sr1 - sr0) / (double)(t1 - t0) : -1;
    res->svc_wait = sched ? (double)(sw1 - sw0) / (double)(t1 - t0) : -1;
    nvh_protect_latency_get(pool, 1, &res->lat);
    res->cdf_n = nvh_protect_latency_buckets(pool, 1, res->cdf_upper, res->cdf_count, 400);
    res->ok = true;
out:
    if (w->teardown) w->teardown(&c);
    nvh_pool_close(pool);
    bench_scratch_remove(path);
}


/* ==========================================================================
 * --platform: the cost of a protection change to the CPU that runs the tree
 * ========================================================================== */
#define PLAT_PAGE 4096u

static size_t g_plat_run;            /* pages the handler makes writable */

static void plat_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr & ~(uintptr_t)(PLAT_PAGE - 1);
    mprotect((void *)a, g_plat_run * PLAT_PAGE, PROT_READ | PROT_WRITE);
}

static double plat_now_us(void) { return (double)bench_now_ns() / 1000.0; }

/* One write per group of `pages` pages, every group read-only: through the
 * fault handler, then with the mprotect called first. us per group. */
static void plat_fault_once(size_t pages, double *fault_us, double *direct_us)
{
    const size_t groups = 256, len = groups * pages * PLAT_PAGE;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    *fault_us = *direct_us = 0;
    if (m == MAP_FAILED) return;
    memset(m, 1, len);                   /* populated and dirty, as the pool */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = plat_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    g_plat_run = pages;
    sigaction(SIGSEGV, &sa, &old);
    mprotect(m, len, PROT_READ);
    double t0 = plat_now_us();
    for (size_t g = 0; g < groups; g++) ((volatile char *)m)[g * pages * PLAT_PAGE] = 2;
    double t1 = plat_now_us();
    mprotect(m, len, PROT_READ);
    double t2 = plat_now_us();
    for (size_t g = 0; g < groups; g++) {
        mprotect(m + g * pages * PLAT_PAGE, pages * PLAT_PAGE, PROT_READ | PROT_WRITE);
        ((volatile char *)m)[g * pages * PLAT_PAGE] = 2;
    }
    double t3 = plat_now_us();
    sigaction(SIGSEGV, &old, NULL);
    munmap(m, len);
    *fault_us = (t1 - t0) / (double)groups;
    *direct_us = (t3 - t2) / (double)groups;
}

typedef struct plat_helper {
    _Atomic int stop;
    _Atomic uint64_t changes;
    int cpu;
} plat_helper;

/* Another thread of this process on another CPU: one page of its own
 * flipped read-only and back every 100 us. Each change of a present page's
 * protection flushes it from the TLB of every CPU running the process: an
 * IPI to the loop's CPU (x86 without broadcast invalidation). */
static void *plat_helper_main(void *arg)
{
    plat_helper *h = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(h->cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    char *p = mmap(NULL, PLAT_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    p[0] = 1;
    while (!atomic_load_explicit(&h->stop, memory_order_relaxed)) {
        mprotect(p, PLAT_PAGE, PROT_READ);
        mprotect(p, PLAT_PAGE, PROT_READ | PROT_WRITE);
        atomic_fetch_add_explicit(&h->changes, 2, memory_order_relaxed);
        usleep(100);
    }
    munmap(p, PLAT_PAGE);
    return NULL;
}

/* ns per iteration of a loop of dependent-free loads from 1 MiB (in cache):
 * what the interruptions cost shows, not memory. */
static double plat_loop(const uint64_t *a, size_t words, uint64_t iters, uint64_t *sink)
{
    uint64_t x = 0x9E3779B97F4A7C15ull, sum = 0;
    double t0 = plat_now_us();
    for (uint64_t i = 0; i < iters; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sum += a[x & (words - 1)];
    }
    *sink += sum;
    return (plat_now_us() - t0) * 1000.0 / (double)iters;
}

static void platform_costs(const bench_opts *o, unsigned runs)
{
    static const size_t sizes[] = {1, 64, 256};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char cname[64];
        snprintf(cname, sizeof cname, "platform/fault-%zupages", sizes[i]);
        if (!bench_selected(o, cname)) continue;
        double f[MAX_RUNS], d[MAX_RUNS], sig[MAX_RUNS];
        for (unsigned r = 0; r < runs; r++) {
            plat_fault_once(sizes[i], &f[r], &d[r]);
            sig[r] = f[r] - d[r];
        }
        bench_emit(o, cname, "fault+mprotect", "us_per_change", bench_summarize(f, runs), "us");
        bench_emit(o, cname, "mprotect", "us_per_change", bench_summarize(d, runs), "us");
        bench_emit(o, cname, "signal_share", "us_per_change", bench_summarize(sig, runs), "us");
    }
    if (!bench_selected(o, "platform/ipi")) return;
    /* the loop on the first CPU this process may use, the helper on the
     * second: never the same one (that would measure preemption) */
    cpu_set_t set, saved;
    int cpus[2] = {-1, -1}, found = 0;
    if (sched_getaffinity(0, sizeof saved, &saved) == 0)
        for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
            if (CPU_ISSET(c, &saved)) cpus[found++] = c;
    if (found < 2) {
        bench_note(o, "platform/ipi: fewer than two CPUs to run on, no IPI to measure: skipped");
        return;
    }
    CPU_ZERO(&set);
    CPU_SET(cpus[0], &set);
    sched_setaffinity(0, sizeof set, &set);
    const size_t words = (1u << 20) / sizeof(uint64_t);
    uint64_t *a = calloc(words, sizeof *a), sink = 0;
    const uint64_t iters = o->quick ? 2000000u : 40000000u;
    double alone[MAX_RUNS], with[MAX_RUNS], per[MAX_RUNS];
    unsigned ok = 0;
    for (unsigned r = 0; a && r < runs; r++) {
        alone[ok] = plat_loop(a, words, iters, &sink);
        plat_helper h = {.cpu = cpus[1]};
        pthread_t th;
        if (pthread_create(&th, NULL, plat_helper_main, &h) != 0) break;
        with[ok] = plat_loop(a, words, iters, &sink);
        uint64_t changes = atomic_load(&h.changes);
        atomic_store(&h.stop, 1);
        pthread_join(th, NULL);
        if (!changes) continue;
        per[ok] = (with[ok] - alone[ok]) * (double)iters / (double)changes / 1000.0;
        ok++;
    }
    sched_setaffinity(0, sizeof saved, &saved);
    free(a);
    if (!ok) return;
    bench_emit(o, "platform/ipi", "loop", "ns_per_iter", bench_summarize(alone, ok), "ns");
    bench_emit(o, "platform/ipi", "loop+changes", "ns_per_iter", bench_summarize(with, ok), "ns");
    bench_emit(o, "platform/ipi", "per_ipi", "us_lost", bench_summarize(per, ok), "us");
    if (sink == 42) bench_note(o, "(sink)");
}

/* ==========================================================================
 * Main
 * ========================================================================== */
static int by_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t n = opts.quick ? 10000 : 1000000, n4k = opts.quick ? 2000 : 250000;
    const char *wl_list = NULL, *subj_list = NULL;
    bool cdf = false, implicit = false, platform = false, per_run = false;
    for (int i = 0; i < opts.argc; i++) {
        const char *a = opts.argv[i];
        if (strcmp(a, "--ops") == 0 && i + 1 < opts.argc) n = strtoull(opts.argv[++i], NULL, 0);
        else if (strcmp(a, "--ops4k") == 0 && i + 1 < opts.argc)
            n4k = strtoull(opts.argv[++i], NULL, 0);
        else if (strcmp(a, "--workloads") == 0 && i + 1 < opts.argc) wl_list = opts.argv[++i];
        else if (strcmp(a, "--subjects") == 0 && i + 1 < opts.argc) subj_list = opts.argv[++i];
        else if (strcmp(a, "--cdf") == 0) cdf = true;
        else if (strcmp(a, "--service-fifo") == 0) g_service_fifo = true;
        else if (strcmp(a, "--implicit") == 0) implicit = true;
        else if (strcmp(a, "--no-prefault") == 0) g_prefault = false;
        else if (strcmp(a, "--platform") == 0) platform = true;
        else if (strcmp(a, "--per-run") == 0) per_run = true;
        else bench_usage_error(&opts, "unknown option: %s", a);
    }
    if (n < 16) bench_usage_error(&opts, "--ops must be at least 16");
    unsigned runs = opts.runs > MAX_RUNS ? MAX_RUNS : opts.runs;
    bench_note(&opts, "%llu ops per measurement (tree/4KB: %llu), %u runs, in %s%s; the tree's "
               "pool %s; subjects alternate within each run (odd runs in reverse order)",
               (unsigned long long)n, (unsigned long long)n4k, runs, opts.dir,
               implicit ? "; tree calls inside IMPLICIT windows (stop-gap)" : "",
               g_prefault ? "prefaulted at create" : "not prefaulted (--no-prefault)");

    static result all[NSUBJECTS][MAX_RUNS];
    for (size_t wi = 0; wi < sizeof workloads / sizeof workloads[0]; wi++)
    for (unsigned vi = 0; vi < 2; vi++) {
        const workload *w = &workloads[wi];
        if (!listed(wl_list, w->name)) continue;
        if (vi == 1 && !w->real) continue;             /* synthetic: 256 B only */
        run_cfg cfg = {.n = vi ? n4k : n, .vlen = vi ? 4096 : VALUE,
                       .implicit = w->real && implicit};
        char cname[64];
        snprintf(cname, sizeof cname, "%s%s/%s", w->name, cfg.implicit ? "-implicit" : "",
                 vi ? "4KB" : "256B");
        if (!bench_selected(&opts, cname)) continue;
        /* run-major: every subject's r-th run before any (r+1)-th, so that a
         * slow minute of this shared machine hits all subjects alike; odd
         * runs take the subjects in reverse order, so that no subject is
         * always measured first (after the pool files of the previous run
         * were freed) or always right after another */
        for (unsigned r = 0; r < runs; r++)
            for (size_t k = 0; k < NSUBJECTS; k++) {
                size_t si = r % 2 ? NSUBJECTS - 1 - k : k;
                if (!listed(subj_list, subjects[si].name)) continue;
                measure(&opts, w, &subjects[si], &cfg, r, &all[si][r]);
                if (per_run && all[si][r].ok)
                    bench_note(&opts, "run %u %s %s %.1f ns", r, cname, subjects[si].name,
                               all[si][r].ns_per_op);
            }
        for (size_t si = 0; si < NSUBJECTS; si++) {
            const subject *s = &subjects[si];
            if (!listed(subj_list, s->name)) continue;
            result *res = all[si];
            double ns[MAX_RUNS], cpu[MAX_RUNS], mp[MAX_RUNS], fl[MAX_RUNS], rq[MAX_RUNS];
            double cm[MAX_RUNS], pg[MAX_RUNS], pu[MAX_RUNS], sv[MAX_RUNS], sq[MAX_RUNS];
            double p50[MAX_RUNS], p90[MAX_RUNS], p99[MAX_RUNS], mean[MAX_RUNS];
            unsigned ok = 0, median_run = 0;
            for (unsigned r = 0; r < runs; r++) {
                if (!res[r].ok) continue;
                ns[ok] = res[r].ns_per_op;
                cpu[ok] = res[r].cpu_ns_per_op;
                mp[ok] = res[r].mprotect_per_op;
                pg[ok] = res[r].pages_per_op;
                fl[ok] = res[r].faults_per_op;
                rq[ok] = res[r].requests_per_op;
                cm[ok] = res[r].misses_per_op;
                pu[ok] = res[r].pass_us;
                sv[ok] = res[r].svc_run;
                sq[ok] = res[r].svc_wait;
                p50[ok] = (double)res[r].lat.p50_ns / 1000.0;
                p90[ok] = (double)res[r].lat.p90_ns / 1000.0;
                p99[ok] = (double)res[r].lat.p99_ns / 1000.0;
                mean[ok] = res[r].lat.mean_ns / 1000.0;
                ok++;
            }
            if (!ok) continue;
            /* the run whose time is the median provides the CDF */
            double sorted[MAX_RUNS];
            memcpy(sorted, ns, ok * sizeof *ns);
            qsort(sorted, ok, sizeof *sorted, by_double);
            for (unsigned r = 0, k = 0; r < runs; r++)
                if (res[r].ok) { if (ns[k] == sorted[ok / 2]) median_run = r; k++; }

            bench_emit(&opts, cname, s->name, "ns_per_op", bench_summarize(ns, ok), "ns");
            bench_emit(&opts, cname, s->name, "cpu_ns_per_op", bench_summarize(cpu, ok), "ns");
            if (s->mode == NVH_PROTECT_OFF) continue;
            /* Paired ratio: the median over runs of this subject's time over
             * off's time IN THE SAME RUN (measured seconds apart). The ratio
             * column divides the two medians, which a slow minute of this
             * shared machine can skew when it hits one subject's median run;
             * the per-run pairs cancel drift slower than a run. Both are
             * printed; quote paired_ratio (docs/BENCHMARKS.md, protect). */
            double paired[MAX_RUNS];
            unsigned np = 0;
            for (unsigned r = 0; r < runs; r++)
                if (res[r].ok && all[0][r].ok && all[0][r].ns_per_op > 0)
                    paired[np++] = res[r].ns_per_op / all[0][r].ns_per_op;
            if (np) bench_emit(&opts, cname, s->name, "paired_ratio", bench_summarize(paired, np), "x");
            bench_emit(&opts, cname, s->name, "mprotect_per_op", bench_summarize(mp, ok), "calls");
            bench_emit(&opts, cname, s->name, "pages_changed_per_op", bench_summarize(pg, ok), "pages");
            bench_emit(&opts, cname, s->name, "faults_per_op", bench_summarize(fl, ok), "faults");
            if (s->mode == NVH_PROTECT_ASYNC) {
                bench_emit(&opts, cname, s->name, "requests_per_op", bench_summarize(rq, ok), "req");
                bench_emit(&opts, cname, s->name, "cache_misses_per_op", bench_summarize(cm, ok),
                           "opens");
                bench_emit(&opts, cname, s->name, "pass_us", bench_summarize(pu, ok), "us");
                if (sv[0] >= 0) {   /* -1: no schedstat on this kernel */
                    bench_emit(&opts, cname, s->name, "service_run", bench_summarize(sv, ok), "x");
                    bench_emit(&opts, cname, s->name, "service_wait", bench_summarize(sq, ok), "x");
                }
            }
            bench_emit(&opts, cname, s->name, "lat_p50_us", bench_summarize(p50, ok), "us");
            bench_emit(&opts, cname, s->name, "lat_p90_us", bench_summarize(p90, ok), "us");
            bench_emit(&opts, cname, s->name, "lat_p99_us", bench_summarize(p99, ok), "us");
            bench_emit(&opts, cname, s->name, "lat_mean_us", bench_summarize(mean, ok), "us");
            if (cdf && s->cdf_name) {
                const result *m = &res[median_run];
                uint64_t total = 0, seen = 0;
                for (unsigned b = 0; b < m->cdf_n; b++) total += m->cdf_count[b];
                for (unsigned b = 0; b < m->cdf_n && total; b++) {
                    seen += m->cdf_count[b];
                    /* from 1%: keeps plot.py's y axis linear (it goes log
                     * beyond a 100x range) and the table short */
                    if ((double)seen / (double)total < 0.01) continue;
                    char cc[96];
                    snprintf(cc, sizeof cc, "fig6-%s%s%s-%s/%.4g", w->name,
                             cfg.implicit ? "-implicit" : "", vi ? "-4KB" : "", s->cdf_name,
                             (double)m->cdf_upper[b] / 1e6);
                    bench_emit(&opts, cc, "nvheap", "cdf", bench_exact((double)seen / (double)total),
                               "fraction");
                }
            }
        }
    }
    if (platform) platform_costs(&opts, runs);
    return bench_finish(&opts);
}
