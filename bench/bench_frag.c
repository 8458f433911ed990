/* bench_frag.c — fragmentation and slowdown vs glibc, 1 M random ops ([Moraru11] Table 2)
 *
 * [Moraru11] (NVMalloc) section 8.1.2: one million allocations and frees of
 * sizes uniform in 10 B .. 4 KB, at free/alloc ratios 1/3, 1/2 and 1/1; total
 * and external fragmentation at the end, and the allocator's slowdown
 * against glibc malloc. The don't-allocate delay T is 0 (as in [Moraru11]'s
 * footnote 12).
 *
 * The operation sequence (one seed, identical for every subject): each op is
 * a free of a uniformly chosen live block with probability r/(1+r) (r = the
 * ratio; an alloc when nothing is live), else an allocation of a uniform size
 * in 10..4096 B. Nothing is written into the blocks ([Moraru11]'s tool "performs
 * only memory allocations and deallocations").
 *
 * Subjects (a fresh process each):
 *   glibc           malloc / free
 *   nvheap          nvh_reserve + nvh_activate (no link) / nvh_free, process
 *                   domain (the allocator's own cost, no flush instructions)
 *   nvheap-pmem     the same in the pmem domain (CLWB + SFENCE on /dev/shm):
 *                   slowdown only, fragmentation is the same
 *   nvheap-populate nvheap with NVH_POOL_POPULATE (chunks faulted in at their
 *                   claim, 2 MiB at a time); not run unless named in --subjects
 *   nvheap-cap      capacity mode: nvh_cap_malloc / nvh_cap_free on the
 *                   capacity part of a pool (the allocator libnvheap-cap.so
 *                   runs, docs/CAP.md)
 *
 *   oracle-ff       ideal address-ordered first fit, oracle-bf ideal best
 *   oracle-bf       fit: exact sizes (16 B granules), no headers or classes,
 *                   simulated addresses (below); not run unless named
 *
 * What [Moraru11] defines: "address space fragmentation", "total and
 * external fragmentation", recorded for 1 M operations; it says neither
 * when they are taken nor what the heap is. Its malloc figures fit one
 * reading: total = the address space the heap spans at the end (glibc's
 * arena: its top is trimmed when free) less the requested bytes; glibc
 * gives 59-64 % at 1/1 that way, as the paper's 59.18 %. For a persistent
 * pool the same address-space figure is space_frag_pct: the pool's chunks
 * never shrink (heap_mib keeps the peak's), so total_frag_pct is the
 * space the pool has claimed, and space_frag_pct the space from the first
 * block any allocation got to the end of the page that holds the highest
 * live byte, the span glibc's trimmed heap has (header chunks inside the
 * span count: 1/65 of it).
 *
 * Definitions (at the end of the sequence; "heap" = the memory the allocator
 * has taken for its heap):
 *   heap_bytes      glibc: mallinfo2 arena + hblkhd (sbrk'd + mmapped bytes);
 *                   nvheap: nvh_heap_stats.heap_bytes (the chunks in use);
 *                   nvheap-cap: nvh_cap_stats.top (the part's bytes ever
 *                   used: like glibc's arena, free spans below it included)
 *   requested       sum of the sizes asked for by the live blocks
 *   total_frag      (heap_bytes - requested) / heap_bytes: every byte of
 *                   heap not holding requested data (headers, size rounding,
 *                   free space)
 *   external_frag   free bytes outside the largest free region / heap_bytes:
 *                   free space split into holes. glibc: (fordblks - keepcost)
 *                   / heap (keepcost = the top chunk, the free space at the
 *                   end of the heap); nvheap: (free_bytes - largest_free) /
 *                   heap (free whole-block regions; free slots inside runs
 *                   are not free regions and count only in total_frag);
 *                   nvheap-cap: every free span below the top (top -
 *                   span_bytes) / heap, an upper bound (the largest free
 *                   span is not subtracted)
 *   page_frag_pct   (live_pages x 4 KiB - requested) / (live_pages x 4 KiB),
 *                   live_pages = the distinct 4 KiB pages that hold a byte
 *                   of a live block at the end: the figure an allocator that
 *                   returned (punched) every page without a live byte, and
 *                   moved nothing, would reach (the lower bound of
 *                   total_frag for it; at 1/1 the heap is set by the peak)
 *   space_frag_pct  (space - requested) / space, space = from the page of
 *                   the lowest address any allocation returned to the end
 *                   of the page holding the highest live byte at the end
 *                   (the same for every subject; space_mib)
 *   space_ext_frag_pct  (space - usable) / space: the part of space_frag
 *                   outside live blocks (usable = malloc_usable_size,
 *                   nvh_usable_size; glibc's 8 B chunk headers count here)
 *   faults_per_kop  page faults of the sequence per 1000 ops (getrusage: pages
 *                   populated by MADV_POPULATE_WRITE count too); trap_faults_per_kop
 *                   only the faults the thread trapped on (perf software event)
 *   slowdown        this subject's time for the sequence / glibc's (medians);
 *                   cpu_slowdown the same with the thread's CPU time, which
 *                   other programs on a shared machine do not inflate
 * Options: --ops N (default 1000000, quick 50000), --ratios LIST (of 1/3,1/2,1/1),
 * --subjects LIST (of the subjects above), --fill 1 (write every byte of a new
 * block, so that faults count the pages a program would touch).
 */
#include "bench_util.h"

#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)
#define MAX_RUNS 32

typedef enum subject_id {
    S_GLIBC, S_NVHEAP, S_NVHEAP_PMEM, S_CAP, S_NVHEAP_POP, S_ORACLE_FF, S_ORACLE_BF, S_COUNT
} subject_id;
static const char *const subject_names[S_COUNT] = {"glibc", "nvheap", "nvheap-pmem", "nvheap-cap",
                                                   "nvheap-populate", "oracle-ff", "oracle-bf"};

/* ==========================================================================
 * Oracles: ideal non-moving placements of the same sequence
 * ==========================================================================
 * A simulated address space (nothing is mapped): blocks of exactly the
 * requested size rounded to 16 B, no header, no size class, free space
 * coalesced at once, the space above the highest block given back. First
 * fit takes the lowest hole that fits (address-ordered first fit), best fit
 * the smallest (the lowest of equals): the two classic low-fragmentation
 * placements. What they leave at the end is the fragmentation of the
 * placement policy alone, with no header, size class or alignment cost: a
 * floor for allocators that place by that policy and never move objects.
 * Holes are kept in an address-sorted array (linear search: run them on
 * sequences with a few thousand holes, e.g. 1/1). */
typedef struct hole { uint64_t off, len; } hole;
static hole *holes;
static size_t nholes, holes_cap;
static uint64_t oracle_top;
#define ORACLE_BASE ((uint64_t)1 << 40)  /* fake addresses, never dereferenced */

static uint64_t oracle_alloc(uint64_t size, bool best)
{
    size = (size + 15) & ~(uint64_t)15;
    size_t pick = SIZE_MAX;
    for (size_t i = 0; i < nholes; i++) {
        if (holes[i].len < size) continue;
        if (!best) { pick = i; break; }
        if (pick == SIZE_MAX || holes[i].len < holes[pick].len) pick = i;
        if (holes[i].len == size) break;
    }
    if (pick == SIZE_MAX) {
        uint64_t off = oracle_top;
        oracle_top += size;
        return off;
    }
    uint64_t off = holes[pick].off;
    holes[pick].off += size;
    holes[pick].len -= size;
    if (holes[pick].len == 0) {
        memmove(&holes[pick], &holes[pick + 1], (nholes - pick - 1) * sizeof *holes);
        nholes--;
    }
    return off;
}

static void oracle_free(uint64_t off, uint64_t size)
{
    size = (size + 15) & ~(uint64_t)15;
    size_t i = 0;
    while (i < nholes && holes[i].off < off) i++;
    bool left = i > 0 && holes[i - 1].off + holes[i - 1].len == off;
    bool right = i < nholes && off + size == holes[i].off;
    if (left && right) {
        holes[i - 1].len += size + holes[i].len;
        memmove(&holes[i], &holes[i + 1], (nholes - i - 1) * sizeof *holes);
        nholes--;
    } else if (left) {
        holes[i - 1].len += size;
    } else if (right) {
        holes[i].off = off;
        holes[i].len += size;
    } else {
        if (nholes == holes_cap) {
            holes_cap = holes_cap ? 2 * holes_cap : 1024;
            holes = realloc(holes, holes_cap * sizeof *holes);
            if (!holes) abort();
        }
        memmove(&holes[i + 1], &holes[i], (nholes - i) * sizeof *holes);
        holes[i] = (hole){off, size};
        nholes++;
    }
    /* the top hole goes back (as glibc trims its top) */
    if (nholes && holes[nholes - 1].off + holes[nholes - 1].len == oracle_top) {
        oracle_top = holes[nholes - 1].off;
        nholes--;
    }
}

typedef struct ratio {
    const char *label;          /* case VARIANT                              */
    unsigned num, den;          /* frees per allocations                     */
} ratio;
static const ratio ratios[] = {{"1:3", 1, 3}, {"1:2", 1, 2}, {"1:1", 1, 1}};
#define RATIO_COUNT (sizeof ratios / sizeof ratios[0])

/* What a child sends back. */
typedef struct outcome {
    int ok;
    char error[160];
    double ns, cpu_ns;          /* wall and CPU time of the sequence          */
    double faults, traps;       /* page faults of the sequence (traps < 0: unknown) */
    uint64_t heap_bytes, requested, free_bytes, hole_bytes, live;
    uint64_t span_bytes, span_peak, held_bytes; /* nvheap-cap only        */
    uint64_t live_pages;        /* distinct 4 KiB pages holding live bytes    */
    uint64_t low;               /* lowest address any allocation returned     */
    uint64_t extent;            /* address space from low's page to the end of
                                   the page holding the highest live byte    */
    uint64_t usable;            /* sum of the live blocks' usable sizes       */
} outcome;

/* ==========================================================================
 * The sequence
 * ========================================================================== */
typedef struct live_block {
    void *ptr;
    uint32_t size;
} live_block;

/* CPU time of the calling thread (immune to other programs taking the cores). */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t next_random(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Runs the sequence on one subject; returns 0 or -1 with out->error set. */
static int fill_blocks;          /* --fill 1: write every byte of a new block */

static long thread_faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

/* A counter of the page faults the calling thread traps on (the perf
 * software event; unlike getrusage it does not count pages faulted in by
 * MADV_POPULATE_WRITE on the program's behalf). -1 if perf is unavailable. */
static int trap_counter(void)
{
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = PERF_TYPE_SOFTWARE;
    a.config = PERF_COUNT_SW_PAGE_FAULTS;
    a.exclude_kernel = 1;
    a.exclude_hv = 1;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static double trap_read(int fd)
{
    uint64_t v = 0;
    if (fd < 0 || read(fd, &v, sizeof v) != (ssize_t)sizeof v) return -1;
    return (double)v;
}

static int run_sequence(subject_id sub, nvh_pool *pool, nvh_cap *cap, const ratio *rt,
                        uint64_t ops, live_block *live, outcome *out)
{
    int tfd = trap_counter();
    double t0_traps = trap_read(tfd);
    long f0 = thread_faults();
    uint64_t x = 0x2545f4914f6cdd1dull, nlive = 0, requested = 0, low = UINT64_MAX;
    /* free with probability num / (num + den) */
    uint64_t free_threshold = (uint64_t)((double)UINT32_MAX * rt->num / (rt->num + rt->den));
    uint64_t t0 = bench_now_ns(), cpu0 = thread_cpu_ns();
    for (uint64_t i = 0; i < ops; i++) {
        uint64_t r = next_random(&x);
        if ((r & UINT32_MAX) < free_threshold && nlive > 0) {
            uint64_t k = (r >> 32) % nlive;
            if (sub == S_GLIBC) {
                free(live[k].ptr);
            } else if (sub == S_ORACLE_FF || sub == S_ORACLE_BF) {
                oracle_free((uint64_t)(uintptr_t)live[k].ptr - ORACLE_BASE, live[k].size);
            } else if (sub == S_CAP) {
                if (nvh_cap_free(cap, live[k].ptr) != NVH_OK) {
                    snprintf(out->error, sizeof out->error, "nvh_cap_free: %s", nvh_errormsg());
                    return -1;
                }
            } else if (nvh_free(pool, live[k].ptr, NULL, 0) != NVH_OK) {
                snprintf(out->error, sizeof out->error, "nvh_free: %s", nvh_errormsg());
                return -1;
            }
            requested -= live[k].size;
            live[k] = live[--nlive];
        } else {
            uint32_t size = 10u + (uint32_t)((r >> 32) % 4087u);   /* 10 .. 4096 */
            void *p;
            if (sub == S_GLIBC) {
                p = malloc(size);
            } else if (sub == S_ORACLE_FF || sub == S_ORACLE_BF) {
                p = (void *)(uintptr_t)(ORACLE_BASE + oracle_alloc(size, sub == S_ORACLE_BF));
            } else if (sub == S_CAP) {
                p = nvh_cap_malloc(cap, size);
            } else {
                p = nvh_reserve(pool, size);
                if (p && nvh_activate(pool, p, NULL, 0) != NVH_OK) p = NULL;
            }
            if (!p) {
                snprintf(out->error, sizeof out->error, "allocation %llu failed: %s",
                         (unsigned long long)i, sub == S_GLIBC ? "malloc" : nvh_errormsg());
                return -1;
            }
            if (fill_blocks) memset(p, 0x5a, size);
            if ((uint64_t)(uintptr_t)p < low) low = (uint64_t)(uintptr_t)p;
            live[nlive].ptr = p;
            live[nlive].size = size;
            nlive++;
            requested += size;
        }
    }
    out->ns = (double)(bench_now_ns() - t0);
    out->cpu_ns = (double)(thread_cpu_ns() - cpu0);
    out->faults = (double)(thread_faults() - f0);
    double t1_traps = trap_read(tfd);
    out->traps = t0_traps >= 0 && t1_traps >= 0 ? t1_traps - t0_traps : -1;
    if (tfd >= 0) close(tfd);
    out->requested = requested;
    out->live = nlive;
    out->low = low;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Distinct 4 KiB pages holding a byte of a live block (scratch mmapped, so
 * that it is no part of glibc's heap). */
static uint64_t live_pages(const live_block *live, uint64_t n)
{
    uint64_t cap = 2 * n + 1, k = 0;
    uint64_t *pg = mmap(NULL, cap * sizeof *pg, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pg == MAP_FAILED) return 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t a = (uint64_t)(uintptr_t)live[i].ptr >> 12;
        uint64_t b = ((uint64_t)(uintptr_t)live[i].ptr + live[i].size - 1) >> 12;
        for (uint64_t x = a; x <= b && k < cap; x++) pg[k++] = x;
    }
    qsort(pg, k, sizeof *pg, cmp_u64);
    uint64_t u = 0;
    for (uint64_t i = 0; i < k; i++) u += i == 0 || pg[i] != pg[i - 1];
    munmap(pg, cap * sizeof *pg);
    return u;
}

static void measure(subject_id sub, const ratio *rt, uint64_t ops, const char *path,
                    outcome *out)
{
    memset(out, 0, sizeof *out);
    /* the bookkeeping array is mmapped, so it is no part of glibc's heap */
    live_block *live = mmap(NULL, ops * sizeof *live, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (live == MAP_FAILED) {
        snprintf(out->error, sizeof out->error, "mmap: %s", strerror(errno));
        return;
    }
    nvh_pool *pool = NULL;
    nvh_cap *cap = NULL;
    if (sub == S_CAP) {
        /* room for every block live at once (about 1 GiB at 1/3, 1 M ops) */
        uint64_t part = ops * 4096 + 256 * MIB;
        pool = nvh_pool_create(path, "bench_frag", part + 256 * MIB, NVH_DOMAIN_PROCESS);
        if (!pool || !(cap = nvh_cap_attach(pool, part))) {
            snprintf(out->error, sizeof out->error, "capacity part: %s", nvh_errormsg());
            return;
        }
    } else if (sub != S_GLIBC && sub != S_ORACLE_FF && sub != S_ORACLE_BF) {
        unsigned dom = sub == S_NVHEAP_PMEM ? NVH_DOMAIN_PMEM : NVH_DOMAIN_PROCESS;
        if (sub == S_NVHEAP_POP) dom |= NVH_POOL_POPULATE;
        pool = nvh_pool_create(path, "bench_frag", 64 * MIB, dom);
        nvh_heap_config cfg;
        if (!pool || nvh_heap_config_get(pool, &cfg) != NVH_OK) {
            snprintf(out->error, sizeof out->error, "pool: %s", nvh_errormsg());
            return;
        }
        cfg.fifo_delay_ns = 0;                              /* T = 0 */
        if (nvh_heap_config_set(pool, &cfg) != NVH_OK) {
            snprintf(out->error, sizeof out->error, "config: %s", nvh_errormsg());
            return;
        }
    }
    if (run_sequence(sub, pool, cap, rt, ops, live, out) != 0) return;
    if (sub == S_CAP) {
        nvh_cap_stats st;
        if (nvh_cap_stats_get(cap, &st) != NVH_OK) {
            snprintf(out->error, sizeof out->error, "stats: %s", nvh_errormsg());
            return;
        }
        out->heap_bytes = st.top;
        out->span_bytes = st.span_bytes;
        out->span_peak = st.span_peak;
        out->held_bytes = st.span_bytes + st.dirty_bytes;
        out->free_bytes = st.top - st.span_bytes;
        out->hole_bytes = st.top - st.span_bytes;
    } else if (sub == S_ORACLE_FF || sub == S_ORACLE_BF) {
        uint64_t fr = 0, big = 0;
        for (size_t i = 0; i < nholes; i++) {
            fr += holes[i].len;
            if (holes[i].len > big) big = holes[i].len;
        }
        out->heap_bytes = oracle_top;
        out->free_bytes = fr;
        out->hole_bytes = fr - big;
    } else if (sub == S_GLIBC) {
        struct mallinfo2 mi = mallinfo2();
        out->heap_bytes = mi.arena + mi.hblkhd;
        out->free_bytes = mi.fordblks;
        out->hole_bytes = mi.fordblks - mi.keepcost;
    } else {
        nvh_heap_stats st;
        if (nvh_heap_stats_get(pool, &st) != NVH_OK) {
            snprintf(out->error, sizeof out->error, "stats: %s", nvh_errormsg());
            return;
        }
        out->heap_bytes = st.heap_bytes;
        out->free_bytes = st.free_bytes;
        out->hole_bytes = st.free_bytes - st.largest_free;
        if (st.live_objects != out->live) {
            snprintf(out->error, sizeof out->error, "heap stats: %llu live objects, expected %llu",
                     (unsigned long long)st.live_objects, (unsigned long long)out->live);
            return;
        }
    }
    out->live_pages = live_pages(live, out->live);
    /* the address-space extent and the live blocks' usable bytes */
    uint64_t high = 0;
    for (uint64_t i = 0; i < out->live; i++) {
        uint64_t end = (uint64_t)(uintptr_t)live[i].ptr + live[i].size;
        if (end > high) high = end;
        out->usable += sub == S_ORACLE_FF || sub == S_ORACLE_BF ? (live[i].size + 15u) & ~15u
                       : sub == S_GLIBC ? malloc_usable_size(live[i].ptr)
                       : sub == S_CAP ? nvh_cap_usable_size(cap, live[i].ptr)
                                      : nvh_usable_size(pool, live[i].ptr);
    }
    if (out->live)
        out->extent = ((high + 4095) & ~(uint64_t)4095) - (out->low & ~(uint64_t)4095);
    out->ok = 1;
}

static void measure_in_child(subject_id sub, const ratio *rt, uint64_t ops, const char *path,
                             outcome *out)
{
    int fds[2];
    memset(out, 0, sizeof *out);
    if (pipe(fds) != 0) {
        snprintf(out->error, sizeof out->error, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        outcome o;
        measure(sub, rt, ops, path, &o);
        ssize_t wr = write(fds[1], &o, sizeof o);
        _exit(wr == (ssize_t)sizeof o ? 0 : 1);       /* no atexit: scratch is the parent's */
    }
    close(fds[1]);
    if (pid < 0) {
        snprintf(out->error, sizeof out->error, "fork: %s", strerror(errno));
        close(fds[0]);
        return;
    }
    ssize_t got = read(fds[0], out, sizeof *out);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof *out) {
        memset(out, 0, sizeof *out);
        snprintf(out->error, sizeof out->error, "child died (status %d)", status);
    }
}

/* Whether the comma-separated list holds name as an item. */
static bool list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

/* ==========================================================================
 * Main
 * ========================================================================== */
static const bench_info info = {
    .name = "frag",
    .summary = "fragmentation and slowdown vs glibc, 1 M random ops ([Moraru11] Table 2)",
    .baseline = "glibc",
    .ratio_metric = "ns_per_op",
    .usage = "  --ops N            operations per sequence (default 1000000, quick 50000)\n"
             "  --ratios LIST      free/alloc ratios among 1:3,1:2,1:1 (default all)\n"
             "  --subjects LIST    of glibc,nvheap,nvheap-pmem,nvheap-cap,nvheap-populate,\n"
             "                     oracle-ff,oracle-bf (default all but nvheap-populate and\n"
             "                     the oracles)\n"
             "  --fill 0|1         write every byte of each new block (default 0)\n",
};

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t ops = opts.quick ? 50000 : 1000000;
    bool want[RATIO_COUNT] = {true, true, true};
    bool run_subject[S_COUNT] = {true, true, true, true, false, false, false};
    for (int i = 0; i < opts.argc; i++) {
        const char *arg = opts.argv[i];
        if (i + 1 >= opts.argc) bench_usage_error(&opts, "unknown option or missing value: %s", arg);
        const char *val = opts.argv[++i];
        if (strcmp(arg, "--ops") == 0) {
            char *end;
            ops = strtoull(val, &end, 10);
            if (*end || ops == 0) bench_usage_error(&opts, "--ops: bad count '%s'", val);
        } else if (strcmp(arg, "--fill") == 0) {
            fill_blocks = atoi(val) != 0;
        } else if (strcmp(arg, "--subjects") == 0) {
            for (int s = 0; s < S_COUNT; s++) run_subject[s] = list_has(val, subject_names[s]);
        } else if (strcmp(arg, "--ratios") == 0) {
            for (size_t k = 0; k < RATIO_COUNT; k++) want[k] = strstr(val, ratios[k].label) != NULL;
        } else {
            bench_usage_error(&opts, "unknown option: %s", arg);
        }
    }
    if (opts.runs > MAX_RUNS) bench_usage_error(&opts, "--runs: at most %d", MAX_RUNS);
    bench_note(&opts, "%llu ops, sizes 10..4096 B, T = 0; %u runs, a fresh process each",
               (unsigned long long)ops, opts.runs);

    for (size_t k = 0; k < RATIO_COUNT; k++) {
        const ratio *rt = &ratios[k];
        char name[64];
        snprintf(name, sizeof name, "frag/%s", rt->label);
        if (!want[k] || !bench_selected(&opts, name)) continue;
        double ns[S_COUNT][MAX_RUNS], cpu[S_COUNT][MAX_RUNS];
        outcome last[S_COUNT];
        bool ok[S_COUNT];
        for (int s = 0; s < S_COUNT; s++) ok[s] = run_subject[s];
        for (unsigned r = 0; r < opts.runs; r++) {
            for (int j = 0; j < S_COUNT; j++) {
                int s = (j + (int)r) % S_COUNT;             /* rotate the order */
                if (!ok[s]) continue;
                bool no_pool = s == S_GLIBC || s == S_ORACLE_FF || s == S_ORACLE_BF;
                const char *path = no_pool ? NULL : bench_scratch_path(&opts, NULL, "pool");
                measure_in_child(s, rt, ops, path, &last[s]);
                if (path) bench_scratch_remove(path);
                if (!last[s].ok) {
                    bench_error(&opts, "%s, ratio %s: %s", subject_names[s], rt->label,
                                last[s].error);
                    ok[s] = false;
                    continue;
                }
                ns[s][r] = last[s].ns / (double)ops;
                cpu[s][r] = last[s].cpu_ns / (double)ops;
            }
        }
        double glibc_ns = ok[S_GLIBC] ? bench_median(ns[S_GLIBC], opts.runs) : 0;
        double glibc_cpu = ok[S_GLIBC] ? bench_median(cpu[S_GLIBC], opts.runs) : 0;
        for (int s = 0; s < S_COUNT; s++) {
            if (!ok[s]) continue;
            const outcome *o = &last[s];
            double heap = (double)o->heap_bytes;
            bench_emit(&opts, name, subject_names[s], "ns_per_op",
                       bench_summarize(ns[s], opts.runs), "ns");
            bench_emit(&opts, name, subject_names[s], "cpu_ns_per_op",
                       bench_summarize(cpu[s], opts.runs), "ns");
            if (glibc_ns > 0)
                bench_emit(&opts, name, subject_names[s], "slowdown",
                           bench_exact(bench_median(ns[s], opts.runs) / glibc_ns), "x");
            if (glibc_cpu > 0)
                bench_emit(&opts, name, subject_names[s], "cpu_slowdown",
                           bench_exact(bench_median(cpu[s], opts.runs) / glibc_cpu), "x");
            bench_emit(&opts, name, subject_names[s], "total_frag_pct",
                       bench_exact(100.0 * (heap - (double)o->requested) / heap), "%");
            bench_emit(&opts, name, subject_names[s], "external_frag_pct",
                       bench_exact(100.0 * (double)o->hole_bytes / heap), "%");
            if (o->live_pages)
                bench_emit(&opts, name, subject_names[s], "page_frag_pct",
                           bench_exact(100.0 * (1.0 - (double)o->requested /
                                                          ((double)o->live_pages * 4096.0))),
                           "%");
            if (o->extent) {
                double ext = (double)o->extent;
                bench_emit(&opts, name, subject_names[s], "space_frag_pct",
                           bench_exact(100.0 * (ext - (double)o->requested) / ext), "%");
                bench_emit(&opts, name, subject_names[s], "space_ext_frag_pct",
                           bench_exact(100.0 * (ext - (double)o->usable) / ext), "%");
                bench_emit(&opts, name, subject_names[s], "space_mib",
                           bench_exact(ext / (double)MIB), "MiB");
            }
            bench_emit(&opts, name, subject_names[s], "heap_mib",
                       bench_exact(heap / (double)MIB), "MiB");
            bench_emit(&opts, name, subject_names[s], "requested_mib",
                       bench_exact((double)o->requested / (double)MIB), "MiB");
            bench_emit(&opts, name, subject_names[s], "live_blocks",
                       bench_exact((double)o->live), "blocks");
            bench_emit(&opts, name, subject_names[s], "faults_per_kop",
                       bench_exact(1000.0 * o->faults / (double)ops), "faults");
            if (o->traps >= 0)
                bench_emit(&opts, name, subject_names[s], "trap_faults_per_kop",
                           bench_exact(1000.0 * o->traps / (double)ops), "faults");
            if (s == S_CAP) {
                bench_emit(&opts, name, subject_names[s], "span_mib",
                           bench_exact((double)o->span_bytes / (double)MIB), "MiB");
                bench_emit(&opts, name, subject_names[s], "span_peak_mib",
                           bench_exact((double)o->span_peak / (double)MIB), "MiB");
                bench_emit(&opts, name, subject_names[s], "held_mib",
                           bench_exact((double)o->held_bytes / (double)MIB), "MiB");
            }
        }
    }
    return bench_finish(&opts);
}
