/* bench_alloc.c — allocation loops ([Schwalb15] Figs. 4-7) vs glibc, jemalloc, mimalloc, PMDK
 *
 * The allocation benchmark of [Schwalb15] (nvm_malloc) section 4.2.1, with every
 * allocator measured in the same run. One measurement is one fresh process
 * (a fork per subject and repetition, so every allocator starts empty, as
 * the paper's runs did) in which each of `threads` threads performs
 *   round 1  `ops` allocations              -> case alloc_W/T     (Figs. 4, 5)
 *   free 1   frees of all of them            -> case free_W/T
 *            round 1 + free 1 together       -> case alloc_free_W/T (Fig. 6)
 *   round 2  the same allocations again      -> case realloc_W/T   (Fig. 7)
 *   free 2   frees of all of them; nvheap frees without a link update here
 *            (nvh_free(p, ptr, NULL, 0))    -> case free_nolink_W/T (nvheap only)
 * W is the workload: `128` (128 B each) or `rand` (uniform 64..512 B, the same
 * sequence for every subject), or, when named in --workloads, `1m` (1 MiB
 * each, power-of-two large objects; at most 64 per thread and round), which
 * also reports heap_1m/T: heap_bytes (nvheap: chunks in use x chunk size,
 * header chunks included) and file_bytes (the pool file) after round 1;
 * or `4192` (4192 B each: a 4 KiB value with a ~96 B header; at most 20000
 * per thread and round), which reports heap_4192/T: heap_bytes_per_obj
 * (nvheap's chunks in use after round 1 per object); or `big` (one thread,
 * --ops 128 B objects: fill, half of them freed in random order -> case
 * randfree_big/1, then churn_big/1: ops/2 times a random live object freed
 * and another allocated; runs_big/1 gives nvheap's runs of the class and
 * their free slots after the random frees: the per-free cost of a heap
 * whose runs are nearly all partly used, against the heap's size);
 * T is the thread count (1, 2). Metrics: ops_per_s
 * (allocations, or frees, per second of wall time over all threads),
 * ns_per_op (wall), and cpu_ops_per_s: operations per second of the busiest
 * worker thread's CPU time (CLOCK_THREAD_CPUTIME_ID; kernel time of its page
 * faults included). On a shared machine whose cores are taken by other
 * programs, wall time also counts the time a worker waited for a core, CPU
 * time does not; for 2 threads it misses lock waits that sleep.
 *
 * Subjects (what one allocation is):
 *   nvheap-pmem     nvh_reserve + nvh_activate with one link (the link is the
 *                   object's slot in a link array in the pool's root area);
 *                   pmem domain on /dev/shm: real CLWB + SFENCE
 *   nvheap-process  the same calls, process domain (no flush instructions)
 *   pmdk            pmemobj_alloc with its destination PMEMoid in the pool's
 *                   root object (the like-for-like of activate with one
 *                   link); PMEM_IS_PMEM_FORCE=1, so libpmem flushes with CLWB
 *   glibc           malloc, pointer stored in a DRAM array
 *   jemalloc        malloc of libjemalloc.so.2 (dlopen'ed RTLD_LOCAL: Debian's
 *                   jemalloc exports plain malloc, linking it would replace
 *                   glibc's for the whole program)
 *   mimalloc        mi_malloc of libmimalloc.so.2 (dlopen'ed for the same reason)
 *   nvheap-clflush, nvheap-clflushopt   nvheap-pmem with that flush instruction
 *   nvheap-fenceonly                    the eadr domain: fences, no flushes
 *                   (these three only when named in --subjects, or --fig9)
 * --fig9 runs [Schwalb15] Fig. 9: the nvheap variants and PMDK with each of
 * libpmem's choices (--pmdk-flush; one child run each, since libpmem reads
 * PMEM_NO_CLWB / PMEM_NO_CLFLUSHOPT / PMEM_NO_FLUSH when it loads), and
 * prints each variant's time relative to its library's CLFLUSH variant.
 * Frees: nvh_free clearing the link | pmemobj_free(&oid) | free.
 * No subject writes the object's content (pmemobj_alloc without constructor
 * does not either).
 *
 * Counters (benchmark 2 of the allocator issue): lines_per_op and
 * fences_per_op of alloc_W/1 and free_W/1 for nvheap-pmem are nvheap's pool
 * statistics over the loop divided by its operations (amortised costs such
 * as log-ring retirement included). For PMDK they are counted exactly: this
 * program defines pmem_flush, pmem_drain, pmem_persist, pmem_memcpy,
 * pmem_memmove, pmem_memset, pmem_msync and pmem_deep_flush, which
 * libpmemobj imports from libpmem, so its calls land here (symbol
 * interposition), are counted per thread, and are forwarded to libpmem
 * (dlsym RTLD_NEXT). A memcpy/memset counts the lines of its destination
 * (flushed or streamed) and one fence unless PMEM_F_MEM_NODRAIN or
 * PMEM_F_MEM_NOFLUSH is set. A self-check at start verifies the interposition
 * (one pmemobj_persist of one line must count 1 line and 1 fence).
 *
 * The whole run happens in a child started with PMEM_IS_PMEM_FORCE=1 (libpmem
 * reads it when it loads). Options: --ops N (allocations per thread per round;
 * default 200000, quick 10000), --threads LIST (default 1,2), --workloads LIST
 * (default 128,rand), --subjects LIST.
 */
#include "bench_util.h"
#include "pmdk_count.h"

#include <libpmem.h>
#include <libpmemobj.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB ((uint64_t)1 << 20)
#define MAX_THREADS 8
#define LINE 64u

/* ==========================================================================
 * Subjects and workloads
 * ========================================================================== */
typedef enum subject_id {
    S_NVH_PMEM, S_NVH_PROCESS, S_PMDK, S_GLIBC, S_JEMALLOC, S_MIMALLOC,
    /* [Schwalb15] Fig. 9 variants (not run by default): the pmem domain with
     * another flush instruction, and fences without flushes */
    S_NVH_CLFLUSH, S_NVH_CLFLUSHOPT, S_NVH_FENCEONLY, S_COUNT
} subject_id;
/* S_PMDK's name is "pmdk", or "pmdk-KIND" under --pmdk-flush KIND */
static const char *subject_names[S_COUNT] = {
    "nvheap-pmem", "nvheap-process", "pmdk", "glibc", "jemalloc", "mimalloc",
    "nvheap-clflush", "nvheap-clflushopt", "nvheap-fenceonly"};
#define S_DEFAULT_COUNT S_NVH_CLFLUSH   /* subjects run without --subjects */

/* The nvheap subjects: one code path, a domain and a flush instruction each. */
static bool is_nvheap(subject_id id)
{
    return id == S_NVH_PMEM || id == S_NVH_PROCESS || id == S_NVH_CLFLUSH ||
           id == S_NVH_CLFLUSHOPT || id == S_NVH_FENCEONLY;
}

typedef enum workload_id { W_128, W_RAND, W_1M, W_4K, W_BIG, W_COUNT } workload_id;
static const char *const workload_names[W_COUNT] = {"128", "rand", "1m", "4192", "big"};
#define OPS_1M 64u          /* 1m: allocations per thread and round, at most */
#define OPS_4K 20000u       /* 4192: allocations per thread and round, at most */

enum { PH_ALLOC1, PH_FREE1, PH_ALLOC2, PH_FREE2, PH_COUNT };

/* What a measurement child sends back. */
typedef struct measurement {
    int ok;
    char error[200];
    double ns[PH_COUNT];               /* wall time of each phase            */
    double cpu_ns[PH_COUNT];           /* the busiest worker's CPU time      */
    double lines[PH_COUNT], fences[PH_COUNT]; /* counters during each phase   */
    double heap_bytes, file_bytes;     /* nvheap, after round 1              */
    double big_runs, big_free_slots;   /* big, nvheap: 128 B runs and their
                                          free slots after the random frees */
} measurement;

/* The allocator under test, as seen by the loops. */
typedef struct subject_ctx {
    subject_id id;
    nvh_pool *pool;                    /* nvheap subjects                    */
    nvh_off_t *links;                  /* nvheap: link array (root area)     */
    PMEMobjpool *pop;                  /* pmdk                               */
    PMEMoid *oids;                     /* pmdk: destination oids (root obj)  */
    void **ptrs;                       /* volatile allocators                */
    void *(*malloc_fn)(size_t);
    void (*free_fn)(void *);
    const uint32_t *perm;              /* big: a permutation of the objects  */
} subject_ctx;

typedef struct worker {
    subject_ctx *s;
    unsigned id;                       /* 1..threads                         */
    uint64_t first, count;             /* its slots in the link/ptr arrays   */
    const uint32_t *sizes;             /* count sizes                        */
    pthread_barrier_t *barrier;
    uint64_t start_ns[4], end_ns[4];   /* per phase, taken by the worker     */
    uint64_t cpu_ns[4];                /* the worker's CPU time in each phase */
    int failed;
    char error[160];
} worker;

/* ==========================================================================
 * The loops
 * ========================================================================== */
static int alloc_loop(worker *w)
{
    subject_ctx *s = w->s;
    const uint32_t *sizes = w->sizes;
    uint64_t first = w->first, n = w->count;
    if (is_nvheap(s->id)) {
        for (uint64_t i = 0; i < n; i++) {
            void *p = nvh_reserve(s->pool, sizes[i]);
            nvh_off_t *link = &s->links[first + i];
            if (!p || nvh_activate(s->pool, p, &link, 1) != NVH_OK) {
                snprintf(w->error, sizeof w->error, "nvheap alloc %llu: %s",
                         (unsigned long long)i, nvh_errormsg());
                return -1;
            }
        }
        return 0;
    }
    switch (s->id) {
    case S_PMDK:
        for (uint64_t i = 0; i < n; i++)
            if (pmemobj_alloc(s->pop, &s->oids[first + i], sizes[i], 0, NULL, NULL) != 0) {
                snprintf(w->error, sizeof w->error, "pmemobj_alloc %llu: %s",
                         (unsigned long long)i, pmemobj_errormsg());
                return -1;
            }
        return 0;
    default:
        for (uint64_t i = 0; i < n; i++) {
            void *p = s->malloc_fn(sizes[i]);
            if (!p) {
                snprintf(w->error, sizeof w->error, "malloc failed");
                return -1;
            }
            s->ptrs[first + i] = p;
        }
        return 0;
    }
}

/* with_link: nvheap clears the object's link in the free (the like-for-like
 * of pmemobj_free(&oid)); without, it frees with no link update. */
static int free_loop(worker *w, bool with_link)
{
    subject_ctx *s = w->s;
    uint64_t first = w->first, n = w->count;
    if (is_nvheap(s->id)) {
        for (uint64_t i = 0; i < n; i++) {
            nvh_off_t *link = &s->links[first + i];
            nvh_link l = {link, 0};
            if (nvh_free(s->pool, nvh_ptr(s->pool, *link), with_link ? &l : NULL,
                         with_link ? 1u : 0u) != NVH_OK) {
                snprintf(w->error, sizeof w->error, "nvh_free %llu: %s",
                         (unsigned long long)i, nvh_errormsg());
                return -1;
            }
        }
        return 0;
    }
    switch (s->id) {
    case S_PMDK:
        for (uint64_t i = 0; i < n; i++) pmemobj_free(&s->oids[first + i]);
        return 0;
    default:
        for (uint64_t i = 0; i < n; i++) s->free_fn(s->ptrs[first + i]);
        return 0;
    }
}

/* One object i of the subject: allocated into its link / oid / pointer
 * slot, or freed from it (nvheap clearing the link). The big workload's
 * loops use these; the rounds above keep their own loops per subject. */
static int obj_alloc(worker *w, uint64_t i, uint32_t size)
{
    subject_ctx *s = w->s;
    if (is_nvheap(s->id)) {
        void *p = nvh_reserve(s->pool, size);
        nvh_off_t *link = &s->links[i];
        if (p && nvh_activate(s->pool, p, &link, 1) == NVH_OK) return 0;
        snprintf(w->error, sizeof w->error, "nvheap alloc %llu: %s", (unsigned long long)i,
                 nvh_errormsg());
        return -1;
    }
    if (s->id == S_PMDK) {
        if (pmemobj_alloc(s->pop, &s->oids[i], size, 0, NULL, NULL) == 0) return 0;
        snprintf(w->error, sizeof w->error, "pmemobj_alloc %llu: %s", (unsigned long long)i,
                 pmemobj_errormsg());
        return -1;
    }
    if ((s->ptrs[i] = s->malloc_fn(size))) return 0;
    snprintf(w->error, sizeof w->error, "malloc failed");
    return -1;
}

static int obj_free(worker *w, uint64_t i, bool with_link)
{
    subject_ctx *s = w->s;
    if (is_nvheap(s->id)) {
        nvh_link l = {&s->links[i], 0};
        if (nvh_free(s->pool, nvh_ptr(s->pool, s->links[i]), with_link ? &l : NULL,
                     with_link ? 1u : 0u) == NVH_OK)
            return 0;
        snprintf(w->error, sizeof w->error, "nvh_free %llu: %s", (unsigned long long)i,
                 nvh_errormsg());
        return -1;
    }
    if (s->id == S_PMDK) pmemobj_free(&s->oids[i]);
    else s->free_fn(s->ptrs[i]);
    return 0;
}

/* The big workload (one thread): a large heap of n 128 B objects whose
 * runs are nearly all partly used after random frees, as in a key-value
 * store after deletes.
 *   PH_ALLOC1  fill: n allocations
 *   PH_FREE1   random frees: the first n/2 objects of a random permutation
 *              (clearing the link); nearly every run of the class has a
 *              free slot afterwards, and a run's first freed slot puts it
 *              back in its arena's bin
 *   PH_ALLOC2  churn: n/2 times, free a random live object and allocate
 *              its replacement (one op = the pair)
 *   PH_FREE2   the rest freed (not reported) */
static int big_phase(worker *w, int phase)
{
    const uint32_t *perm = w->s->perm;
    uint64_t n = w->count, half = n / 2;
    switch (phase) {
    case PH_ALLOC1:
        for (uint64_t i = 0; i < n; i++)
            if (obj_alloc(w, i, 128) != 0) return -1;
        return 0;
    case PH_FREE1:
        for (uint64_t k = 0; k < half; k++)
            if (obj_free(w, perm[k], true) != 0) return -1;
        return 0;
    case PH_ALLOC2: {
        uint64_t seed = 0x5eed;
        for (uint64_t k = 0; k < half; k++) {
            uint32_t i = perm[half + bench_rand(&seed) % (n - half)];
            if (obj_free(w, i, true) != 0 || obj_alloc(w, i, 128) != 0) return -1;
        }
        return 0;
    }
    default:
        for (uint64_t k = half; k < n; k++)
            if (obj_free(w, perm[k], false) != 0) return -1;
        return 0;
    }
}

/* CPU time of the calling thread: unlike wall time, it does not grow while
 * other programs on this shared machine hold the cores. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    pmdk_count_set_worker(w->id);
    for (int phase = 0; phase < PH_COUNT; phase++) {
        pthread_barrier_wait(w->barrier);              /* start together      */
        uint64_t cpu0 = thread_cpu_ns();
        w->start_ns[phase] = bench_now_ns();
        if (!w->failed && w->s->perm)
            w->failed = big_phase(w, phase);
        else if (!w->failed)
            w->failed = (phase == PH_ALLOC1 || phase == PH_ALLOC2)
                            ? alloc_loop(w) : free_loop(w, phase == PH_FREE1);
        w->end_ns[phase] = bench_now_ns();
        w->cpu_ns[phase] = thread_cpu_ns() - cpu0;
        pthread_barrier_wait(w->barrier);              /* phase over          */
    }
    return NULL;
}

/* ==========================================================================
 * One measurement (runs in a forked child)
 * ========================================================================== */
typedef struct plan {
    subject_id subject;
    workload_id workload;
    unsigned threads;
    uint64_t ops;                      /* per thread per round               */
    const char *path;                  /* pool file (nvheap, pmdk)           */
    uint32_t *sizes;                   /* threads * ops sizes                */
} plan;

static void counters_reset(subject_ctx *s)
{
    if (s->pool) nvh_stats_reset(s->pool);
    pmdk_count_reset();
}

static void counters_read(subject_ctx *s, double *lines, double *fences)
{
    if (s->pool) {
        nvh_stats st;
        nvh_stats_get(s->pool, &st);
        *lines = (double)st.lines_flushed;
        *fences = (double)st.fences;
    } else {
        pmdk_count c = pmdk_count_total();
        *lines = (double)c.lines;
        *fences = (double)c.fences;
    }
}

/* Every link (nvheap) or oid (pmdk) set: what round 2 must leave. */
static bool links_all_set(const subject_ctx *s, uint64_t total)
{
    for (uint64_t i = 0; i < total; i++) {
        if (s->links && !s->links[i]) return false;
        if (s->oids && OID_IS_NULL(s->oids[i])) return false;
    }
    return true;
}

static uint64_t pool_bytes_needed(const plan *p)
{
    uint64_t total = (uint64_t)p->threads * p->ops;
    /* 1m: nvheap starts small and grows (the file size is a result) */
    if (p->workload == W_1M) return is_nvheap(p->subject) ? 64 * MIB : total * 2 * MIB + 64 * MIB;
    uint64_t avg = p->workload == W_128 || p->workload == W_BIG ? 128
                   : p->workload == W_4K                      ? 8192
                                                              : 320;
    return total * (avg + 64) * 2 + 64 * MIB;
}

static void measure(const plan *p, measurement *m)
{
    subject_ctx s = {.id = p->subject};
    uint64_t total = (uint64_t)p->threads * p->ops;
    void *dl = NULL;
    memset(m, 0, sizeof *m);

    /* ---- set the subject up (not timed) ---- */
    if (is_nvheap(p->subject)) {
        nvh_pool_options po = {.root_size = (total * sizeof(nvh_off_t) + 4095) & ~4095ull};
        if (p->workload == W_1M) po.max_size = total * 2 * MIB + 256 * MIB;
        unsigned dom = p->subject == S_NVH_PROCESS     ? NVH_DOMAIN_PROCESS
                       : p->subject == S_NVH_FENCEONLY ? NVH_DOMAIN_EADR
                                                       : NVH_DOMAIN_PMEM;
        /* read at pool open; this is the measurement's own child process */
        if (p->subject == S_NVH_CLFLUSH) setenv("NVHEAP_FLUSH", "clflush", 1);
        if (p->subject == S_NVH_CLFLUSHOPT) setenv("NVHEAP_FLUSH", "clflushopt", 1);
        s.pool = nvh_pool_create_ex(p->path, "bench_alloc", pool_bytes_needed(p), dom, &po);
        if (!s.pool) {
            snprintf(m->error, sizeof m->error, "nvh_pool_create: %s", nvh_errormsg());
            return;
        }
        s.links = nvh_root(s.pool, NULL);
        memset(s.links, 0, total * sizeof(nvh_off_t));       /* prefault */
        nvh_persist(s.pool, s.links, total * sizeof(nvh_off_t));
    } else if (p->subject == S_PMDK) {
        s.pop = pmemobj_create(p->path, "bench_alloc", pool_bytes_needed(p) + 256 * MIB, 0600);
        if (!s.pop) {
            snprintf(m->error, sizeof m->error, "pmemobj_create: %s", pmemobj_errormsg());
            return;
        }
        PMEMoid root = pmemobj_root(s.pop, total * sizeof(PMEMoid));
        if (OID_IS_NULL(root)) {
            snprintf(m->error, sizeof m->error, "pmemobj_root: %s", pmemobj_errormsg());
            return;
        }
        s.oids = pmemobj_direct(root);
    } else {
        s.ptrs = calloc(total, sizeof *s.ptrs);
        if (!s.ptrs) {
            snprintf(m->error, sizeof m->error, "out of memory");
            return;
        }
        if (p->subject == S_GLIBC) {
            s.malloc_fn = malloc;
            s.free_fn = free;
        } else {
            const char *lib = p->subject == S_JEMALLOC ? "libjemalloc.so.2" : "libmimalloc.so.2";
            dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
            if (!dl) {
                snprintf(m->error, sizeof m->error, "dlopen %s: %s", lib, dlerror());
                return;
            }
            const char *mname = p->subject == S_JEMALLOC ? "malloc" : "mi_malloc";
            const char *fname = p->subject == S_JEMALLOC ? "free" : "mi_free";
            *(void **)&s.malloc_fn = dlsym(dl, mname);
            *(void **)&s.free_fn = dlsym(dl, fname);
            if (!s.malloc_fn || !s.free_fn || (void *)s.malloc_fn == (void *)malloc) {
                snprintf(m->error, sizeof m->error, "%s: no private %s/%s", lib, mname, fname);
                return;
            }
        }
    }

    uint32_t *perm = NULL;
    if (p->workload == W_BIG) {
        /* the same permutation for every subject (Fisher-Yates, fixed seed) */
        perm = malloc(total * sizeof *perm);
        if (!perm) {
            snprintf(m->error, sizeof m->error, "out of memory");
            return;
        }
        uint64_t seed = 42;
        for (uint64_t i = 0; i < total; i++) perm[i] = (uint32_t)i;
        for (uint64_t i = total; i > 1; i--) {
            uint64_t j = bench_rand(&seed) % i;
            uint32_t t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
        s.perm = perm;
    }

    /* ---- the phases. Each worker times itself (the thread that wakes up
     * last from a barrier may be scheduled late); a phase lasts from the
     * first worker's start to the last one's end. ---- */
    worker workers[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, p->threads + 1);
    for (unsigned t = 0; t < p->threads; t++) {
        workers[t] = (worker){.s = &s, .id = t + 1, .first = t * p->ops, .count = p->ops,
                              .sizes = p->sizes + t * p->ops, .barrier = &barrier};
        if (pthread_create(&tids[t], NULL, worker_main, &workers[t]) != 0) {
            snprintf(m->error, sizeof m->error, "pthread_create failed");
            _exit(3);
        }
    }
    for (int phase = 0; phase < PH_COUNT; phase++) {
        counters_reset(&s);
        pthread_barrier_wait(&barrier);
        pthread_barrier_wait(&barrier);
        uint64_t first = UINT64_MAX, last = 0, cpu = 0;
        for (unsigned t = 0; t < p->threads; t++) {
            if (workers[t].start_ns[phase] < first) first = workers[t].start_ns[phase];
            if (workers[t].end_ns[phase] > last) last = workers[t].end_ns[phase];
            if (workers[t].cpu_ns[phase] > cpu) cpu = workers[t].cpu_ns[phase];
        }
        m->ns[phase] = (double)(last - first);
        m->cpu_ns[phase] = (double)cpu;
        counters_read(&s, &m->lines[phase], &m->fences[phase]);
        if (phase == PH_ALLOC1 && s.pool) {
            nvh_heap_stats hs;
            if (nvh_heap_stats_get(s.pool, &hs) == NVH_OK)
                m->heap_bytes = (double)(hs.chunks * hs.chunk_size);
            m->file_bytes = (double)nvh_pool_size(s.pool);
        }
        if (phase == PH_FREE1 && s.pool && perm) {
            nvh_heap_stats hs;
            if (nvh_heap_stats_get(s.pool, &hs) == NVH_OK) {
                m->big_runs = (double)hs.cls[2].runs;
                m->big_free_slots = (double)(hs.cls[2].slots_total - hs.cls[2].slots_used);
            }
        }
        if (phase == PH_ALLOC2 && !m->error[0] && !perm && !links_all_set(&s, total))
            snprintf(m->error, sizeof m->error, "a link/oid is not set after round 2");
    }
    for (unsigned t = 0; t < p->threads; t++) {
        pthread_join(tids[t], NULL);
        if (workers[t].failed) {
            snprintf(m->error, sizeof m->error, "%s", workers[t].error);
            free(perm);
            return;
        }
    }
    free(perm);
    if (m->error[0]) return;
    m->ok = 1;
}

/* Fork, measure in the child, return what it sent. */
static void measure_in_child(const bench_opts *opts, const plan *p, measurement *m)
{
    int fds[2];
    memset(m, 0, sizeof *m);
    if (pipe(fds) != 0) {
        snprintf(m->error, sizeof m->error, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        measurement r;
        measure(p, &r);
        ssize_t wr = write(fds[1], &r, sizeof r);
        _exit(wr == (ssize_t)sizeof r ? 0 : 1);          /* no atexit: scratch is the parent's */
    }
    close(fds[1]);
    if (pid < 0) {
        snprintf(m->error, sizeof m->error, "fork: %s", strerror(errno));
        close(fds[0]);
        return;
    }
    ssize_t got = read(fds[0], m, sizeof *m);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != (ssize_t)sizeof *m) {
        memset(m, 0, sizeof *m);
        snprintf(m->error, sizeof m->error, "child died (status %d)", status);
    }
    (void)opts;
}

/* ==========================================================================
 * Checks made once before measuring
 * ========================================================================== */
/* One pmemobj_persist of one line must be counted as 1 line and 1 fence. */
static int check_interposition(const bench_opts *opts)
{
    const char *path = bench_scratch_path(opts, NULL, "check.pmdk");
    PMEMobjpool *pop = path ? pmemobj_create(path, "check", 16 * MIB, 0600) : NULL;
    if (!pop) {
        bench_error(opts, "pmemobj_create %s: %s", path ? path : "", pmemobj_errormsg());
        return -1;
    }
    PMEMoid root = pmemobj_root(pop, 4096);
    char *r = pmemobj_direct(root);
    int is_pmem = pmem_is_pmem(r, 64);
    pmdk_count_reset();
    r[0] = 1;
    pmemobj_persist(pop, r, 1);
    pmdk_count c = pmdk_count_total();
    pmemobj_close(pop);
    bench_scratch_remove(path);
    if (!is_pmem) {
        bench_error(opts, "pmem_is_pmem() = 0 although PMEM_IS_PMEM_FORCE=1");
        return -1;
    }
    if (c.lines != 1 || c.fences != 1) {
        bench_error(opts, "PMDK counting self-check: pmemobj_persist(1 line) counted %llu "
                    "lines, %llu fences (interposition broken?)",
                    (unsigned long long)c.lines, (unsigned long long)c.fences);
        return -1;
    }
    bench_note(opts, "pmdk: pmem_is_pmem()=1 (PMEM_IS_PMEM_FORCE=1); flush/fence counting "
               "by interposition self-checked");
    return 0;
}

/* ==========================================================================
 * Driving the measurements and reporting
 * ========================================================================== */
typedef struct settings {
    uint64_t ops;
    unsigned threads[4], nthreads;
    bool workload[W_COUNT];
    bool subject[S_COUNT];
} settings;

static void fill_sizes(uint32_t *sizes, uint64_t n, workload_id w)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sizes[i] = w == W_128 || w == W_BIG ? 128u : w == W_1M ? (uint32_t)MIB : w == W_4K ? 4192u
                                                                   : 64u + (uint32_t)(x % 449u);
    }
}

static void emit_rate(const bench_opts *opts, const char *group, workload_id w, unsigned threads,
                      const char *subject, const double *ns, const double *cpu_ns, unsigned runs,
                      double ops)
{
    char name[96];
    snprintf(name, sizeof name, "%s_%s/%u", group, workload_names[w], threads);
    double *rate = calloc(runs, sizeof *rate), *per_op = calloc(runs, sizeof *per_op);
    if (!rate || !per_op) {
        free(rate);
        free(per_op);
        return;
    }
    for (unsigned r = 0; r < runs; r++) {
        rate[r] = ops / (ns[r] / 1e9);
        per_op[r] = ns[r] / ops;
    }
    bench_emit(opts, name, subject, "ops_per_s", bench_summarize(rate, runs), "ops/s");
    bench_emit(opts, name, subject, "ns_per_op", bench_summarize(per_op, runs), "ns");
    for (unsigned r = 0; r < runs; r++) rate[r] = ops / (cpu_ns[r] / 1e9);
    bench_emit(opts, name, subject, "cpu_ops_per_s", bench_summarize(rate, runs), "ops/s");
    free(rate);
    free(per_op);
}

static void emit_counts(const bench_opts *opts, const char *group, workload_id w,
                        const char *subject, double lines, double fences, double ops)
{
    char name[96];
    snprintf(name, sizeof name, "%s_%s/1", group, workload_names[w]);
    bench_emit(opts, name, subject, "lines_per_op", bench_exact(lines / ops), "lines");
    bench_emit(opts, name, subject, "fences_per_op", bench_exact(fences / ops), "fences");
}

/* All subjects of one (workload, threads): `runs` repetitions, the subjects
 * in a rotating order within each, then the figures. */
static void run_config(const bench_opts *opts, const settings *set, workload_id w,
                       unsigned threads)
{
    static const char *const groups[] = {"alloc", "free", "alloc_free", "realloc", "free_nolink",
                                         "fill", "randfree", "churn"};
    bool selected = false;
    if (w == W_BIG && threads != 1) return;   /* one thread only */
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        char name[96];
        snprintf(name, sizeof name, "%s_%s/%u", groups[g], workload_names[w], threads);
        selected = selected || bench_selected(opts, name);
    }
    if (!selected) return;                /* --only: every phase runs, or none */
    unsigned runs = opts->runs;
    uint64_t ops = w == W_1M && set->ops > OPS_1M ? OPS_1M
                   : w == W_4K && set->ops > OPS_4K ? OPS_4K : set->ops;
    uint64_t total = (uint64_t)threads * ops;
    double heap_bytes[S_COUNT] = {0}, file_bytes[S_COUNT] = {0};
    double big_runs[S_COUNT] = {0}, big_free_slots[S_COUNT] = {0};
    uint32_t *sizes = malloc(total * sizeof *sizes);
    double(*ns)[PH_COUNT][16] = calloc(S_COUNT, sizeof *ns);   /* [subject][phase][run] */
    double(*cpu)[PH_COUNT][16] = calloc(S_COUNT, sizeof *cpu);
    double(*lines)[PH_COUNT] = calloc(S_COUNT, sizeof *lines);
    double(*fences)[PH_COUNT] = calloc(S_COUNT, sizeof *fences);
    bool ok[S_COUNT] = {0};
    if (!sizes || !ns || !cpu || !lines || !fences || runs > 16) {
        bench_error(opts, "out of memory (or --runs > 16)");
        goto out;
    }
    fill_sizes(sizes, total, w);
    for (int si = 0; si < S_COUNT; si++) ok[si] = set->subject[si];

    for (unsigned r = 0; r < runs; r++) {
        for (int k = 0; k < S_COUNT; k++) {
            int si = (k + (int)r) % S_COUNT;
            if (!ok[si]) continue;
            const char *path = NULL;
            if (is_nvheap(si) || si == S_PMDK) {
                path = bench_scratch_path(opts, NULL, subject_names[si]);
                if (!path) {
                    ok[si] = false;
                    continue;
                }
            }
            plan p = {.subject = si, .workload = w, .threads = threads, .ops = ops,
                      .path = path, .sizes = sizes};
            measurement m;
            measure_in_child(opts, &p, &m);
            if (path) bench_scratch_remove(path);
            if (!m.ok) {
                bench_error(opts, "%s, %s, %u thread(s): %s", subject_names[si],
                            workload_names[w], threads, m.error);
                ok[si] = false;
                continue;
            }
            for (int ph = 0; ph < PH_COUNT; ph++) {
                ns[si][ph][r] = m.ns[ph];
                cpu[si][ph][r] = m.cpu_ns[ph];
                lines[si][ph] = m.lines[ph];         /* exact counts: the last run's */
                fences[si][ph] = m.fences[ph];
            }
            heap_bytes[si] = m.heap_bytes;           /* deterministic: the last run's */
            file_bytes[si] = m.file_bytes;
            big_runs[si] = m.big_runs;
            big_free_slots[si] = m.big_free_slots;
        }
    }

    for (int si = 0; si < S_COUNT; si++) {
        if (!ok[si]) continue;
        const char *name = subject_names[si];
        double both[16], both_cpu[16];
        for (unsigned r = 0; r < runs; r++) {
            both[r] = ns[si][PH_ALLOC1][r] + ns[si][PH_FREE1][r];
            both_cpu[r] = cpu[si][PH_ALLOC1][r] + cpu[si][PH_FREE1][r];
        }
        double total_ops = (double)total;
        if (w == W_BIG) {
            double half = (double)(total / 2);
            emit_rate(opts, "fill", w, threads, name, ns[si][PH_ALLOC1], cpu[si][PH_ALLOC1],
                      runs, total_ops);
            emit_rate(opts, "randfree", w, threads, name, ns[si][PH_FREE1], cpu[si][PH_FREE1],
                      runs, half);
            emit_rate(opts, "churn", w, threads, name, ns[si][PH_ALLOC2], cpu[si][PH_ALLOC2],
                      runs, half);
            if (si == S_NVH_PMEM || si == S_PMDK) {
                emit_counts(opts, "randfree", w, name, lines[si][PH_FREE1],
                            fences[si][PH_FREE1], half);
                emit_counts(opts, "churn", w, name, lines[si][PH_ALLOC2],
                            fences[si][PH_ALLOC2], half);
            }
            if (is_nvheap(si)) {
                bench_emit(opts, "runs_big/1", name, "runs_128", bench_exact(big_runs[si]),
                           "runs");
                bench_emit(opts, "runs_big/1", name, "free_slots_128",
                           bench_exact(big_free_slots[si]), "slots");
            }
            continue;
        }
        emit_rate(opts, "alloc", w, threads, name, ns[si][PH_ALLOC1], cpu[si][PH_ALLOC1], runs,
                  total_ops);
        emit_rate(opts, "free", w, threads, name, ns[si][PH_FREE1], cpu[si][PH_FREE1], runs,
                  total_ops);
        emit_rate(opts, "alloc_free", w, threads, name, both, both_cpu, runs, total_ops);
        emit_rate(opts, "realloc", w, threads, name, ns[si][PH_ALLOC2], cpu[si][PH_ALLOC2], runs,
                  total_ops);
        if (is_nvheap(si))
            emit_rate(opts, "free_nolink", w, threads, name, ns[si][PH_FREE2],
                      cpu[si][PH_FREE2], runs, total_ops);
        if (w == W_1M && is_nvheap(si)) {
            char hn[64];
            snprintf(hn, sizeof hn, "heap_1m/%u", threads);
            bench_emit(opts, hn, name, "heap_bytes", bench_exact(heap_bytes[si]), "bytes");
            bench_emit(opts, hn, name, "file_bytes", bench_exact(file_bytes[si]), "bytes");
        }
        if (w == W_4K && is_nvheap(si)) {
            char hn[64];
            snprintf(hn, sizeof hn, "heap_4192/%u", threads);
            bench_emit(opts, hn, name, "heap_bytes_per_obj",
                       bench_exact(heap_bytes[si] / (double)total), "bytes");
        }
        if (threads == 1 && (si == S_NVH_PMEM || si == S_PMDK)) {
            emit_counts(opts, "alloc", w, name, lines[si][PH_ALLOC1], fences[si][PH_ALLOC1],
                        (double)total);
            emit_counts(opts, "free", w, name, lines[si][PH_FREE1], fences[si][PH_FREE1],
                        (double)total);
            emit_counts(opts, "realloc", w, name, lines[si][PH_ALLOC2],
                        fences[si][PH_ALLOC2], (double)total);
            if (si == S_NVH_PMEM)
                emit_counts(opts, "free_nolink", w, name, lines[si][PH_FREE2],
                            fences[si][PH_FREE2], (double)total);
        }
    }
    /* the targets of the allocator issue, as notes */
    if (ok[S_NVH_PMEM] && ok[S_PMDK] && w != W_BIG)
        bench_note(opts, "target %s/%u: nvheap-pmem alloc throughput = %.2fx pmdk wall, %.2fx "
                   "CPU time (>= 5x wanted)", workload_names[w], threads,
                   bench_median(ns[S_PMDK][PH_ALLOC1], runs) /
                       bench_median(ns[S_NVH_PMEM][PH_ALLOC1], runs),
                   bench_median(cpu[S_PMDK][PH_ALLOC1], runs) /
                       bench_median(cpu[S_NVH_PMEM][PH_ALLOC1], runs));
    if (ok[S_NVH_PROCESS] && ok[S_GLIBC] && w != W_BIG)
        bench_note(opts, "target %s/%u: nvheap-process alloc throughput = %.2fx glibc wall, "
                   "%.2fx CPU time; round 2: %.2fx wall, %.2fx CPU (>= 0.5x wanted)",
                   workload_names[w], threads,
                   bench_median(ns[S_GLIBC][PH_ALLOC1], runs) /
                       bench_median(ns[S_NVH_PROCESS][PH_ALLOC1], runs),
                   bench_median(cpu[S_GLIBC][PH_ALLOC1], runs) /
                       bench_median(cpu[S_NVH_PROCESS][PH_ALLOC1], runs),
                   bench_median(ns[S_GLIBC][PH_ALLOC2], runs) /
                       bench_median(ns[S_NVH_PROCESS][PH_ALLOC2], runs),
                   bench_median(cpu[S_GLIBC][PH_ALLOC2], runs) /
                       bench_median(cpu[S_NVH_PROCESS][PH_ALLOC2], runs));
out:
    free(sizes);
    free(ns);
    free(cpu);
    free(lines);
    free(fences);
}

static const bench_info info = {
    .name = "alloc",
    .summary = "allocation loops ([Schwalb15] Figs. 4-7) vs glibc, jemalloc, mimalloc, PMDK",
    .baseline = "pmdk",
    .ratio_metric = "ops_per_s",
    .usage =
        "  --ops N            allocations per thread per round (default 200000, quick 10000)\n"
        "  --threads LIST     thread counts, comma-separated (default 1,2; at most 8)\n"
        "  --workloads LIST   128,rand,1m,4192,big (default 128,rand); big: --ops N\n"
        "                     objects of 128 B, half freed at random (randfree), then\n"
        "                     N/2 x (free a random one, allocate) (churn); 1 thread\n"
        "  --subjects LIST    of nvheap-pmem,nvheap-process,pmdk,glibc,jemalloc,mimalloc\n"
        "                     (default), nvheap-clflush,nvheap-clflushopt,nvheap-fenceonly\n"
        "  --pmdk-flush KIND  libpmem's flush: clwb (default), clflushopt, clflush, or none\n"
        "                     (fences only); the subject is then named pmdk-KIND\n"
        "  --fig9             [Schwalb15] Fig. 9: allocation cost per flush instruction,\n"
        "                     nvheap and PMDK, each relative to its CLFLUSH variant\n"
        "  --inner            run here (the parent re-runs itself with PMEM_IS_PMEM_FORCE=1)\n",
};

static bool parse_list(const char *text, const char *const *names, int count, bool *out)
{
    for (int i = 0; i < count; i++) out[i] = false;
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < count; i++)
            if (strlen(names[i]) == len && strncmp(names[i], p, len) == 0) found = i;
        if (found < 0) return false;
        out[found] = true;
        p += len + (p[len] == ',');
    }
    return true;
}

/* libpmem's environment for a flush choice (read when it loads), or NULL. */
static const char *const *pmdk_flush_env(const char *kind)
{
    static const char *const clwb[] = {"PMEM_NO_CLWB=0", "PMEM_NO_CLFLUSHOPT=0",
                                       "PMEM_NO_FLUSH=0"};
    static const char *const clflushopt[] = {"PMEM_NO_CLWB=1", "PMEM_NO_CLFLUSHOPT=0",
                                             "PMEM_NO_FLUSH=0"};
    static const char *const clflush[] = {"PMEM_NO_CLWB=1", "PMEM_NO_CLFLUSHOPT=1",
                                          "PMEM_NO_FLUSH=0"};
    static const char *const none[] = {"PMEM_NO_CLWB=0", "PMEM_NO_CLFLUSHOPT=0",
                                       "PMEM_NO_FLUSH=1"};
    if (!kind) return NULL;
    if (strcmp(kind, "clwb") == 0) return clwb;
    if (strcmp(kind, "clflushopt") == 0) return clflushopt;
    if (strcmp(kind, "clflush") == 0) return clflush;
    if (strcmp(kind, "none") == 0) return none;
    return NULL;
}

/* [Schwalb15] Fig. 9: the allocation loop with each flush instruction, and
 * with fences only and with neither, relative to CLFLUSH. libpmem fixes its
 * choice when it loads, so PMDK's four variants are four child runs; the
 * nvheap variants share the first (the choice is per pool open). The paper's
 * "flushes without fences" variant has no nvheap equivalent: a domain either
 * orders its flushes or does not flush. */
static int run_fig9(bench_opts *opts, const settings *set, const char **pass, unsigned npass,
                    bool given_threads, bool given_workloads)
{
    static const char *const kinds[] = {"clflush", "clflushopt", "clwb", "none"};
    opts->baseline = "pmdk-clflush";
    const char *args[24];
    for (unsigned k = 0; k < 4; k++) {
        unsigned n = 0;
        for (unsigned i = 0; i + 1 < npass; i += 2)
            if (strcmp(pass[i], "--subjects") != 0 && strcmp(pass[i], "--pmdk-flush") != 0) {
                args[n++] = pass[i];
                args[n++] = pass[i + 1];
            }
        if (!given_workloads) {
            args[n++] = "--workloads";
            args[n++] = "128";
        }
        if (!given_threads) {
            args[n++] = "--threads";
            args[n++] = "1";
        }
        args[n++] = "--subjects";
        args[n++] = k == 0 ? "pmdk,nvheap-clflush,nvheap-clflushopt,nvheap-pmem,"
                             "nvheap-fenceonly,nvheap-process"
                           : "pmdk";
        args[n++] = "--pmdk-flush";
        args[n++] = kinds[k];
        args[n++] = "--inner";
        args[n] = NULL;
        const char *env[6] = {"PMEM_IS_PMEM_FORCE=1",
                              "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536"};
        const char *const *flush_env = pmdk_flush_env(kinds[k]);
        for (unsigned i = 0; i < 3; i++) env[2 + i] = flush_env[i];
        bench_run_child(opts, env, args);
    }
    /* runtime of each variant relative to its library's CLFLUSH run */
    static const char *const rows[][2] = {
        {"nvheap-clflush", "nvheap-clflush"}, {"nvheap-clflushopt", "nvheap-clflush"},
        {"nvheap-pmem", "nvheap-clflush"},    {"nvheap-fenceonly", "nvheap-clflush"},
        {"nvheap-process", "nvheap-clflush"}, {"pmdk-clflush", "pmdk-clflush"},
        {"pmdk-clflushopt", "pmdk-clflush"},  {"pmdk-clwb", "pmdk-clflush"},
        {"pmdk-none", "pmdk-clflush"}};
    for (int w = 0; w < W_COUNT; w++) {
        if (!set->workload[w]) continue;
        for (unsigned t = 0; t < set->nthreads; t++) {
            char name[64];
            snprintf(name, sizeof name, "alloc_%s/%u", workload_names[w], set->threads[t]);
            for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
                bench_summary v, base;
                if (bench_result(name, rows[r][0], "ns_per_op", &v) ||
                    bench_result(name, rows[r][1], "ns_per_op", &base))
                    continue;
                bench_note(opts, "fig9 %s %-18s %7.1f ns per allocation = %.2f of %s",
                           name, rows[r][0], v.median, v.median / base.median, rows[r][1]);
            }
        }
    }
    return bench_finish(opts);
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    settings set = {.ops = opts.quick ? 10000 : 200000, .threads = {1, 2}, .nthreads = 2};
    for (int i = 0; i < W_COUNT; i++)       /* on request: 1m, 4192, big */
        set.workload[i] = i != W_1M && i != W_4K && i != W_BIG;
    for (int i = 0; i < S_COUNT; i++) set.subject[i] = i < S_DEFAULT_COUNT;
    bool inner = false, fig9 = false, given_threads = false, given_workloads = false;
    const char *pmdk_flush = NULL;
    const char *pass[16];
    unsigned npass = 0;
    for (int i = 0; i < opts.argc; i++) {
        const char *arg = opts.argv[i];
        bool has_value = i + 1 < opts.argc;
        if (strcmp(arg, "--inner") == 0) {
            inner = true;
            continue;
        }
        if (strcmp(arg, "--fig9") == 0) {
            fig9 = true;
            continue;
        }
        if (!has_value) bench_usage_error(&opts, "unknown option or missing value: %s", arg);
        const char *val = opts.argv[++i];
        if (npass + 2 < 16) {
            pass[npass++] = arg;
            pass[npass++] = val;
        }
        if (strcmp(arg, "--ops") == 0) {
            char *end;
            set.ops = strtoull(val, &end, 10);
            if (*end || set.ops == 0) bench_usage_error(&opts, "--ops: bad count '%s'", val);
        } else if (strcmp(arg, "--threads") == 0) {
            given_threads = true;
            set.nthreads = 0;
            for (const char *p = val; *p && set.nthreads < 4;) {
                char *end;
                unsigned long t = strtoul(p, &end, 10);
                if (end == p || t == 0 || t > MAX_THREADS || (*end && *end != ','))
                    bench_usage_error(&opts, "--threads: bad list '%s'", val);
                set.threads[set.nthreads++] = (unsigned)t;
                p = *end ? end + 1 : end;
            }
        } else if (strcmp(arg, "--pmdk-flush") == 0) {
            if (!pmdk_flush_env(val)) bench_usage_error(&opts, "--pmdk-flush: bad kind '%s'", val);
            pmdk_flush = val;
        } else if (strcmp(arg, "--workloads") == 0) {
            given_workloads = true;
            if (!parse_list(val, workload_names, W_COUNT, set.workload))
                bench_usage_error(&opts, "--workloads: bad list '%s'", val);
        } else if (strcmp(arg, "--subjects") == 0) {
            if (!parse_list(val, subject_names, S_COUNT, set.subject))
                bench_usage_error(&opts, "--subjects: bad list '%s'", val);
        } else {
            bench_usage_error(&opts, "unknown option: %s", arg);
        }
    }

    if (!inner && fig9) {
        if (!given_workloads) set.workload[W_RAND] = false;
        if (!given_threads) set.nthreads = 1;
        return run_fig9(&opts, &set, pass, npass, given_threads, given_workloads);
    }
    if (!inner) {
        /* libpmem fixes its flush behaviour when it loads: re-run in a child */
        /* jemalloc has 2.6 KiB of static TLS: more than dlopen's default reserve */
        const char *env[6] = {"PMEM_IS_PMEM_FORCE=1",
                              "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536"};
        const char *const *flush_env = pmdk_flush_env(pmdk_flush ? pmdk_flush : "clwb");
        for (unsigned i = 0; i < 3; i++) env[2 + i] = flush_env[i];
        pass[npass++] = "--inner";
        pass[npass] = NULL;
        bench_run_child(&opts, env, pass);
        return bench_finish(&opts);
    }
    static char pmdk_name[32];
    if (pmdk_flush) {
        snprintf(pmdk_name, sizeof pmdk_name, "pmdk-%s", pmdk_flush);
        subject_names[S_PMDK] = pmdk_name;
    }

    pmdk_count_init("bench_alloc");
    nvh_flush_kind fk = nvh_flush_kind_detect();
    bench_note(&opts, "nvheap-pmem: pmem domain, %s, pools in %s; %llu allocations per thread "
               "per round; %u run%s, a fresh process per subject and run",
               nvh_flush_kind_name(fk), opts.dir, (unsigned long long)set.ops, opts.runs,
               opts.runs == 1 ? "" : "s");
    if (set.subject[S_PMDK] && check_interposition(&opts) != 0) set.subject[S_PMDK] = false;
    for (int w = 0; w < W_COUNT; w++) {
        if (!set.workload[w]) continue;
        for (unsigned t = 0; t < set.nthreads; t++) run_config(&opts, &set, w, set.threads[t]);
    }
    return bench_finish(&opts);
}
