/* pmalloc_shim.c — an LD_PRELOAD malloc family whose every block comes from a
 * persistent allocator, for bench_seedapps ([Kannan14] Figs. 14-15: real
 * programs with their allocations going to a persistent heap).
 *
 * Bench-only: the blocks are never reachable after the process ends (no
 * root, no links), so nothing here is a persistence design; what it measures
 * is what a persistent allocator's metadata work (records, flushes, fences,
 * headers on the media) costs a program that allocates the way real
 * programs do. Compiled twice (bench/CMakeLists.txt):
 *
 *   libnvh-pmalloc-nvheap.so  nvheap's public API: nvh_reserve + nvh_activate
 *                             (no link) per allocation, nvh_free per free, in
 *                             a pool on NVH_PMALLOC_DIR (default /dev/shm) in
 *                             the domain NVH_PMALLOC_DOMAIN (pmem, default;
 *                             process = the "ideal" allocator that flushes and
 *                             fences nothing, with the same metadata)
 *   libnvh-pmalloc-pmdk.so    PMDK: pmemobj_alloc / pmemobj_free (the "naive"
 *                             allocator of the paper: all metadata in the
 *                             pool, every update logged and flushed); run it
 *                             with PMEM_IS_PMEM_FORCE=1 (and PMEM_NO_FLUSH=1
 *                             for PMDK without flushes)
 *
 * Environment: NVH_PMALLOC_SIZE (pool bytes; nvheap: initial size, it grows;
 * PMDK: fixed, default 512 MiB), NVH_PMALLOC_STATS=FILE (append one line of
 * counts at exit: allocations, frees, blocks that went to DRAM, flushed
 * lines, fences), NVH_PMALLOC_SPLIT=1 (also split lines and fences into
 * those of allocations and those of frees: reads the counters around every
 * call, so leave it off when timing).
 *
 * Routing: before the shim's constructor (the backend's libraries allocate
 * in theirs), while the pool is being made, and inside the backend (which may
 * allocate for its DRAM state), blocks come from glibc (__libc_malloc and
 * friends); free() routes by address (inside the pool's range: the
 * backend's). A fork()ed child stops using the pool (its allocations go to
 * glibc, its frees of pool blocks are dropped): parent and child share the
 * pool's MAP_SHARED pages but not its DRAM state. Alignments above the
 * backend's own (nvheap 64 B, PMDK 16 B) over-allocate and keep the block's
 * start in a tagged word pair in front of the aligned pointer. A block the
 * pool cannot hold (full) comes from glibc and is counted. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>

#if defined(PMALLOC_NVHEAP)
#include <nvheap.h>
#elif defined(PMALLOC_PMDK)
#include <libpmemobj.h>
#include "pmdk_count.h"
#else
#error "define PMALLOC_NVHEAP or PMALLOC_PMDK"
#endif

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define ALIGN_TAG 0x6e76686d616c6967ull   /* "nvhmalig", xor'ed with the address */

enum { ST_NONE, ST_INIT, ST_READY, ST_OFF };
static _Atomic int g_state;
static uintptr_t g_lo, g_hi;      /* the pool's address range */
static TLS int t_inside;          /* in the backend, or making the pool: glibc */
static int g_split;
static _Atomic int g_constructed; /* the libraries below us are initialised */

static _Atomic uint64_t n_allocs, n_frees, n_dram, a_lines, a_fences, f_lines, f_fences;

/* ==========================================================================
 * Backends: init, alloc, free, usable size, flush/fence counters
 * ========================================================================== */
static void die(const char *what, const char *msg)
{
    char buf[512];
    int len = snprintf(buf, sizeof buf, "pmalloc_shim: %s: %s\n", what, msg ? msg : "");
    if (len > 0) (void)!write(2, buf, (size_t)len < sizeof buf ? (size_t)len : sizeof buf - 1);
    abort();
}

static uint64_t env_size(const char *name, uint64_t dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    uint64_t v = strtoull(s, &end, 10);
    switch (*end) {
    case 'G': case 'g': v <<= 30; break;
    case 'M': case 'm': v <<= 20; break;
    case 'K': case 'k': v <<= 10; break;
    default: break;
    }
    return v;
}

static void pool_path(char *path, size_t len, const char *tag)
{
    const char *dir = getenv("NVH_PMALLOC_DIR");
    static _Atomic unsigned seq;
    snprintf(path, len, "%s/pmalloc-%s.%ld.%u", dir && *dir ? dir : "/dev/shm", tag,
             (long)getpid(), atomic_fetch_add(&seq, 1));
}

#if defined(PMALLOC_NVHEAP)
#define NATIVE_ALIGN 64u
static nvh_pool *g_pool;

static int be_init(void)
{
    char path[4096];
    pool_path(path, sizeof path, "nvheap");
    unlink(path);
    nvh_domain domain = NVH_DOMAIN_PMEM;
    const char *d = getenv("NVH_PMALLOC_DOMAIN");
    if (d && *d && nvh_domain_parse(d, &domain) != NVH_OK) die("NVH_PMALLOC_DOMAIN", d);
    /* The growth limit is the reserved address range: halved until granted
     * (valgrind's address space is smaller than the default's 64 GiB). */
    uint64_t size = env_size("NVH_PMALLOC_SIZE", (uint64_t)256 << 20);
    nvh_pool_options po = {0};
    for (po.max_size = env_size("NVH_PMALLOC_MAX", (uint64_t)16 << 30);; po.max_size /= 2) {
        if (po.max_size < size) po.max_size = size;
        g_pool = nvh_pool_create_ex(path, "pmalloc", size,
                                    (unsigned)domain | NVH_CREATE_NOFALLOCATE, &po);
        if (g_pool || po.max_size == size) break;
        unlink(path);
    }
    if (!g_pool) die("nvh_pool_create", nvh_errormsg());
    unlink(path);   /* the pool keeps its descriptor (it grows through it) */
    nvh_pool_info info;
    if (nvh_pool_info_get(g_pool, &info) != NVH_OK) die("nvh_pool_info_get", nvh_errormsg());
    g_lo = (uintptr_t)nvh_pool_base(g_pool);
    g_hi = g_lo + info.max_size;
    nvh_stats_reset(g_pool);
    return 0;
}

static void *be_alloc(size_t n)
{
    void *p = nvh_reserve(g_pool, n);
    if (!p) return NULL;
    if (nvh_activate(g_pool, p, NULL, 0) != NVH_OK) {
        nvh_cancel(g_pool, p);
        return NULL;
    }
    return p;
}

static void be_free(void *p)
{
    if (nvh_free(g_pool, p, NULL, 0) != NVH_OK) die("free(): invalid pointer", nvh_errormsg());
}

static size_t be_usable(void *p)
{
    return nvh_usable_size(g_pool, p);
}

static void be_counts(uint64_t *lines, uint64_t *fences)
{
    nvh_stats st;
    nvh_stats_get(g_pool, &st);
    *lines = st.lines_flushed;
    *fences = st.fences;
}

/* Pending allocator work (a log ring's retire) reaches the media and the
 * counters, so a short run is charged all its flushes. */
static void be_finish(void)
{
    nvh_heap_sync(g_pool);
}

#else /* PMALLOC_PMDK */
#define NATIVE_ALIGN 16u
static PMEMobjpool *g_pop;

static int be_init(void)
{
    char path[4096];
    pool_path(path, sizeof path, "pmdk");
    unlink(path);
    pmdk_count_init("pmalloc_shim");
    uint64_t size = env_size("NVH_PMALLOC_SIZE", (uint64_t)512 << 20);
    g_pop = pmemobj_create(path, "pmalloc", size, 0600);
    if (!g_pop) die("pmemobj_create", pmemobj_errormsg());
    unlink(path);
    g_lo = (uintptr_t)g_pop;
    g_hi = g_lo + size;
    pmdk_count_reset();
    return 0;
}

static void *be_alloc(size_t n)
{
    PMEMoid oid;
    if (pmemobj_alloc(g_pop, &oid, n ? n : 1, 0, NULL, NULL) != 0) return NULL;
    return pmemobj_direct(oid);
}

static void be_free(void *p)
{
    PMEMoid oid = pmemobj_oid(p);
    if (OID_IS_NULL(oid)) die("free(): invalid pointer", "not in the pool");
    pmemobj_free(&oid);
}

static size_t be_usable(void *p)
{
    return pmemobj_alloc_usable_size(pmemobj_oid(p));
}

static void be_counts(uint64_t *lines, uint64_t *fences)
{
    pmdk_count c = pmdk_count_total();
    *lines = c.lines;
    *fences = c.fences;
}

static void be_finish(void) {}
#endif

/* The pool's first allocation sets up its arena and first chunk (thousands
 * of lines in nvheap); done here, with the counters reset after it, so that
 * the per-call counts are those of a pool in use and the set-up is part of
 * the process's fixed cost. */
static void be_warm(void)
{
    void *p = be_alloc(64);
    if (p) be_free(p);
#if defined(PMALLOC_NVHEAP)
    nvh_heap_sync(g_pool);
    nvh_stats_reset(g_pool);
#else
    pmdk_count_reset();
#endif
}

/* ==========================================================================
 * State
 * ========================================================================== */
static void fork_child(void)
{
    atomic_store(&g_state, ST_OFF);
}

static inline int ready(void)
{
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (__builtin_expect(s == ST_READY, 1)) return 1;
    if (s != ST_NONE || !atomic_load_explicit(&g_constructed, memory_order_acquire)) return 0;
    int expect = ST_NONE;
    if (!atomic_compare_exchange_strong(&g_state, &expect, ST_INIT)) return 0;
    t_inside = 1;
    const char *split = getenv("NVH_PMALLOC_SPLIT");
    g_split = split && *split == '1';
    be_init();
    be_warm();
    pthread_atfork(NULL, NULL, fork_child);
    t_inside = 0;
    atomic_store_explicit(&g_state, ST_READY, memory_order_release);
    return 1;
}

static inline int in_pool(const void *p)
{
    return (uintptr_t)p >= g_lo && (uintptr_t)p < g_hi;
}

__attribute__((constructor)) static void shim_constructor(void)
{
    /* Our dependencies (libnvheap, libpmemobj) run their constructors before
     * ours, and may allocate in them: the pool is made only from here on. */
    atomic_store_explicit(&g_constructed, 1, memory_order_release);
    (void)ready();
}

__attribute__((destructor)) static void shim_destructor(void)
{
    if (atomic_load(&g_state) != ST_READY) return;
    const char *file = getenv("NVH_PMALLOC_STATS");
    t_inside = 1;
    be_finish();
    uint64_t lines, fences;
    be_counts(&lines, &fences);
    t_inside = 0;
    if (!file || !*file) return;
    char buf[512];
    int len = snprintf(buf, sizeof buf,
                       "pmalloc allocs %llu frees %llu dram %llu lines %llu fences %llu "
                       "alloc_lines %llu alloc_fences %llu free_lines %llu free_fences %llu\n",
                       (unsigned long long)n_allocs, (unsigned long long)n_frees,
                       (unsigned long long)n_dram, (unsigned long long)lines,
                       (unsigned long long)fences, (unsigned long long)a_lines,
                       (unsigned long long)a_fences, (unsigned long long)f_lines,
                       (unsigned long long)f_fences);
    int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (len > 0) (void)!write(fd, buf, (size_t)len);
        close(fd);
    }
}

/* ==========================================================================
 * Allocation and free through the backend (counted)
 * ========================================================================== */
static void *pool_alloc(size_t n)
{
    uint64_t l0 = 0, f0 = 0, l1, f1;
    t_inside = 1;
    if (g_split) be_counts(&l0, &f0);
    void *p = be_alloc(n);
    if (g_split) {
        be_counts(&l1, &f1);
        atomic_fetch_add_explicit(&a_lines, l1 - l0, memory_order_relaxed);
        atomic_fetch_add_explicit(&a_fences, f1 - f0, memory_order_relaxed);
    }
    t_inside = 0;
    if (p) atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
    return p;
}

static void pool_free(void *p)
{
    uint64_t l0 = 0, f0 = 0, l1, f1;
    t_inside = 1;
    if (g_split) be_counts(&l0, &f0);
    be_free(p);
    if (g_split) {
        be_counts(&l1, &f1);
        atomic_fetch_add_explicit(&f_lines, l1 - l0, memory_order_relaxed);
        atomic_fetch_add_explicit(&f_fences, f1 - f0, memory_order_relaxed);
    }
    t_inside = 0;
    atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
}

/* An over-aligned block: [start .. tag, start-pointer | aligned block]. */
static inline int aligned_start(void *p, void **start)
{
    uint64_t *w = (uint64_t *)p;
    if ((uintptr_t)p - 16 < g_lo || w[-2] != (ALIGN_TAG ^ (uint64_t)(uintptr_t)p)) return 0;
    *start = (void *)(uintptr_t)w[-1];
    return 1;
}

static void *pool_memalign(size_t align, size_t n)
{
    if (align <= NATIVE_ALIGN) return pool_alloc(n);
    if (n > SIZE_MAX - align - 16) return NULL;
    char *start = pool_alloc(n + align + 16);
    if (!start) return NULL;
    uintptr_t q = ((uintptr_t)start + 16 + align - 1) & ~(uintptr_t)(align - 1);
    uint64_t *w = (uint64_t *)q;
    w[-2] = ALIGN_TAG ^ (uint64_t)q;
    w[-1] = (uint64_t)(uintptr_t)start;
    return (void *)q;
}

static size_t pool_usable(void *p)
{
    void *start;
    if (aligned_start(p, &start)) return be_usable(start) - (size_t)((char *)p - (char *)start);
    return be_usable(p);
}

static void pool_release(void *p)
{
    void *start;
    if (atomic_load_explicit(&g_state, memory_order_relaxed) == ST_OFF) return; /* fork child */
    if (aligned_start(p, &start)) {
        ((uint64_t *)p)[-2] = 0;
        p = start;
    }
    pool_free(p);
}

static inline void *do_malloc(size_t n)
{
    if (!t_inside && ready()) {
        void *p = pool_alloc(n);
        if (p) return p;
        atomic_fetch_add_explicit(&n_dram, 1, memory_order_relaxed);
    }
    return __libc_malloc(n);
}

static inline void *do_memalign(size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1))) {
        errno = EINVAL;
        return NULL;
    }
    if (!t_inside && ready()) {
        void *p = pool_memalign(align, n);
        if (p) return p;
        atomic_fetch_add_explicit(&n_dram, 1, memory_order_relaxed);
    }
    return __libc_memalign(align, n);
}

static inline void do_free(void *p)
{
    if (!p) return;
    if (in_pool(p)) pool_release(p);
    else __libc_free(p);
}

/* ==========================================================================
 * The malloc family
 * ========================================================================== */
EXPORT void *malloc(size_t n)
{
    return do_malloc(n);
}

EXPORT void free(void *p)
{
    do_free(p);
}

EXPORT void *calloc(size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (!t_inside && ready()) {
        void *p = pool_alloc(total);
        if (p) return memset(p, 0, total);
        atomic_fetch_add_explicit(&n_dram, 1, memory_order_relaxed);
    }
    return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t n)
{
    if (!p) return do_malloc(n);
    if (n == 0) {
        do_free(p);
        return NULL;
    }
    if (!in_pool(p)) return __libc_realloc(p, n);
    size_t old = pool_usable(p);
    if (n <= old && n >= old / 2) return p;
    void *q = do_malloc(n);
    if (!q) return NULL;
    memcpy(q, p, n < old ? n : old);
    do_free(p);
    return q;
}

EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc(p, total);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = do_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t n)
{
    return do_memalign(align, n);
}

EXPORT void *memalign(size_t align, size_t n)
{
    return do_memalign(align, n);
}

EXPORT void *valloc(size_t n)
{
    return do_memalign(4096, n);
}

EXPORT void *pvalloc(size_t n)
{
    return do_memalign(4096, (n + 4095) & ~(size_t)4095);
}

EXPORT size_t malloc_usable_size(void *p)
{
    static size_t (*libc_usable)(void *);
    if (!p) return 0;
    if (in_pool(p)) return pool_usable(p);
    if (!libc_usable) {
        int was = t_inside;
        t_inside = 1;
        libc_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
        t_inside = was;
    }
    return libc_usable ? libc_usable(p) : 0;
}
