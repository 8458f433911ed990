/* preload.c — libnvheap-cap.so: the malloc family for LD_PRELOAD, its memory
 * in an unlinked file (capacity mode, docs/CAP.md).
 *
 *   LD_PRELOAD=libnvheap-cap.so  NVHEAP_CAP_DIR=/mnt/pmem  program ...
 *
 * Built as one translation unit with heap.c, span.c and large.c (included
 * below), so the fast paths inline into malloc and free; only the names of
 * the malloc family are exported (preload.map). Not part of libnvheap.
 *
 * Bootstrap: the instance is made by the first call (or the constructor,
 * whichever comes first) without dlsym. Allocations made while it is being
 * made (pthread_atfork allocates), or while a thread creates its heap, go to
 * glibc's own allocator (__libc_malloc and friends, which glibc exports for
 * this purpose), and every free is routed by address: a pointer inside the
 * reserved range is ours, any other is glibc's. */
#include "heap.c"
#include "span.c"
#include "large.c"

#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define NVH_CAP_EXPORT __attribute__((visibility("default")))

/* glibc's allocator under its internal names (exported by libc.so.6, not
 * declared in any header) */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

enum { POL_ALL, POL_THRESHOLD, POL_SHARE };

static struct cap_inst g_cap;
static _Atomic int g_state;          /* 0: not yet, 1: ready, 2: off */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_policy = POL_ALL;
static size_t g_threshold;
static unsigned g_share;
static int g_abort = 1;
static bool g_populate;
static __thread int tl_init __attribute__((tls_model("initial-exec")));
static __thread uint64_t tl_total, tl_file __attribute__((tls_model("initial-exec")));
static size_t (*g_libc_usable)(void *);

static void say(const char *a, const char *b, const char *c)
{
    const char *parts[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (parts[i] && write(2, parts[i], strlen(parts[i])) < 0)
            return;
}

static size_t parse_size(const char *s, bool *ok)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    *ok = end != s;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    case 't': case 'T': v <<= 40; end++; break;
    default: break;
    }
    if (*end)
        *ok = false;
    return (size_t)v;
}

static void parse_env(const char **dir, size_t *reserve)
{
    const char *pol = getenv("NVHEAP_CAP_POLICY");
    bool ok = true;
    if (pol && *pol && strcmp(pol, "all") != 0) {
        if (strncmp(pol, "threshold:", 10) == 0) {
            g_threshold = parse_size(pol + 10, &ok);
            g_policy = POL_THRESHOLD;
        } else if (strncmp(pol, "share:", 6) == 0) {
            size_t pct = parse_size(pol + 6, &ok);
            ok = ok && pct <= 100;
            g_share = (unsigned)pct;
            g_policy = POL_SHARE;
        } else {
            ok = false;
        }
        if (!ok) {
            say("nvheap-cap: NVHEAP_CAP_POLICY=", pol,
                " is not all, threshold:BYTES or share:PCT; using all\n");
            g_policy = POL_ALL;
        }
    }
    const char *pop = getenv("NVHEAP_CAP_POPULATE");
    g_populate = pop && strcmp(pop, "1") == 0;
    const char *ab = getenv("NVHEAP_CAP_ABORT");
    if (ab && strcmp(ab, "0") == 0)
        g_abort = 0;
    const char *res = getenv("NVHEAP_CAP_RESERVE");
    *reserve = (size_t)256 << 30;
    if (res && *res) {
        size_t v = parse_size(res, &ok);
        if (ok && v)
            *reserve = v;
        else
            say("nvheap-cap: NVHEAP_CAP_RESERVE=", res, " is not a size; using 256G\n");
    }
    *dir = getenv("NVHEAP_CAP_DIR");
    if (!*dir || !**dir)
        *dir = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : ".";
}

static void fork_prepare(void)
{
    struct cap_heap *h = nvh_cap_heap_peek_(&g_cap);
    if (h)
        remote_flush(h);
    nvh_cap_fork_prepare_(&g_cap);
}
static void fork_parent(void)
{
    nvh_cap_fork_parent_(&g_cap);
}
static void fork_child(void)
{
    nvh_cap_fork_child_(&g_cap, nvh_cap_heap_peek_(&g_cap));
}

static void late_double_report(struct cap_inst *cap, void *p);

static bool init_slow(void)
{
    if (tl_init)
        return false;             /* a call from inside the initialisation */
    tl_init = 1;
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load(&g_state) == 0) {
        const char *dir;
        size_t reserve;
        parse_env(&dir, &reserve);
        int r = nvh_cap_init_file_(&g_cap, dir, reserve);
        if (r) {
            say("nvheap-cap: cannot make a heap file in ", dir, ": ");
            say(strerror(-r), "; using the system allocator\n", NULL);
            memset(&g_cap, 0, sizeof g_cap);
            atomic_store(&g_state, 2);
        } else {
            g_cap.abort_on_error = g_abort;
            g_cap.populate = g_populate;
            g_cap.late_double = late_double_report;
            pthread_atfork(fork_prepare, fork_parent, fork_child);
            atomic_store(&g_state, 1);
        }
    }
    pthread_mutex_unlock(&g_init_lock);
    tl_init = 0;
    return atomic_load(&g_state) == 1;
}

static inline bool ready(void)
{
    int s = atomic_load_explicit(&g_state, memory_order_acquire);
    if (nvh_cap_likely(s == 1))
        return !tl_init;
    return s == 0 ? init_slow() : false;
}

__attribute__((constructor)) static void cap_constructor(void)
{
    (void)ready();
}

/* Does an allocation of n bytes go to the file? */
static inline bool to_file(size_t n)
{
    if (nvh_cap_likely(g_policy == POL_ALL))
        return true;
    if (g_policy == POL_THRESHOLD)
        return n >= g_threshold;
    /* share: keep the file's part of this thread's bytes at PCT % */
    tl_total += n;
    if (tl_file * 100 < tl_total * g_share) {
        tl_file += n;
        return true;
    }
    return false;
}

static void report(const char *fn, int bad)
{
    say(fn, bad == CAP_DOUBLE ? "(): double free detected\n" : "(): invalid pointer\n", NULL);
    if (g_abort)
        abort();
}

/* A cross-thread double free, found when the owner thread drains its
 * queue of frees (heap.c remote_free): reported as glibc reports one. */
static void late_double_report(struct cap_inst *cap, void *p)
{
    (void)cap;
    (void)p;
    report("free", CAP_DOUBLE);
}

static size_t libc_usable(void *p)
{
    if (!g_libc_usable)
        g_libc_usable = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
    return g_libc_usable ? g_libc_usable(p) : 0;
}

static inline struct cap_heap *file_heap(size_t n)
{
    if (nvh_cap_likely(ready()) && to_file(n))
        return heap_get(&g_cap);
    return NULL;
}

/* The exported functions call each other only through these (a call by
 * name would go through the PLT, and could reach another malloc). */
static inline void *do_malloc(size_t n)
{
    struct cap_heap *h = file_heap(n);
    if (nvh_cap_likely(h != NULL)) {
        void *p = cap_alloc(h, n);
        if (nvh_cap_likely(p != NULL))
            return p;
    }
    return __libc_malloc(n);   /* DRAM: by policy, or the file is full */
}

static inline void do_free(void *p)
{
    if (nvh_cap_likely(nvh_cap_contains_(&g_cap, p))) {
        int r = cap_free(&g_cap, p);
        if (nvh_cap_unlikely(r != CAP_OK))
            report("free", r);
        return;
    }
    if (p)
        __libc_free(p);
}

NVH_CAP_EXPORT void *malloc(size_t n)
{
    return do_malloc(n);
}

NVH_CAP_EXPORT void free(void *p)
{
    do_free(p);
}

NVH_CAP_EXPORT void *calloc(size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    struct cap_heap *h = file_heap(bytes);
    if (h) {
        void *p = nvh_cap_calloc_(h, bytes);
        if (p)
            return p;
    }
    return __libc_calloc(n, size);
}

static void *do_realloc(void *p, size_t n)
{
    if (!p)
        return do_malloc(n);
    if (n == 0) {              /* glibc: free and return NULL */
        do_free(p);
        return NULL;
    }
    if (nvh_cap_contains_(&g_cap, p)) {
        struct cap_heap *h = file_heap(n);
        if (h) {
            int bad;
            void *q = nvh_cap_realloc_(h, p, n, &bad);
            if (bad != CAP_OK) {
                report("realloc", bad);
                return NULL;
            }
            if (q)
                return q;
        }
        /* to DRAM: by policy, or the file is full */
        size_t old = nvh_cap_usable_(&g_cap, p);
        if (!old) {
            report("realloc", CAP_INVALID);
            return NULL;
        }
        void *q = __libc_malloc(n);
        if (q) {
            memcpy(q, p, old < n ? old : n);
            nvh_cap_free_(&g_cap, p);
        }
        return q;
    }
    if (g_policy == POL_THRESHOLD && n >= g_threshold && ready()) {
        /* a DRAM block that grew past the threshold moves to the file */
        struct cap_heap *h = nvh_cap_heap_(&g_cap);
        void *q = h ? nvh_cap_alloc_(h, n) : NULL;
        if (q) {
            size_t old = libc_usable(p);
            memcpy(q, p, old < n ? old : n);
            __libc_free(p);
            return q;
        }
    }
    return __libc_realloc(p, n);
}

NVH_CAP_EXPORT void *realloc(void *p, size_t n)
{
    return do_realloc(p, n);
}

NVH_CAP_EXPORT void *reallocarray(void *p, size_t n, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return do_realloc(p, bytes);
}

static void *aligned(size_t align, size_t n)
{
    struct cap_heap *h = file_heap(n);
    if (h) {
        void *p = nvh_cap_alloc_aligned_(h, n, align);
        if (p)
            return p;
    }
    return __libc_memalign(align, n);
}

NVH_CAP_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    int e = errno;
    void *p = aligned(align, n);
    if (!p)
        return ENOMEM;
    errno = e;
    *out = p;
    return 0;
}

NVH_CAP_EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (align == 0 || (align & (align - 1))) {
        errno = EINVAL;
        return NULL;
    }
    return aligned(align, n);
}

NVH_CAP_EXPORT void *memalign(size_t align, size_t n)
{
    if (align <= 16)
        return do_malloc(n);
    if (align & (align - 1))   /* glibc rounds up to a power of two */
        align = (size_t)1 << (64 - __builtin_clzll(align));
    return aligned(align, n);
}

NVH_CAP_EXPORT void *valloc(size_t n)
{
    return aligned((size_t)sysconf(_SC_PAGESIZE), n);
}

NVH_CAP_EXPORT void *pvalloc(size_t n)
{
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    if (n > SIZE_MAX - ps) {
        errno = ENOMEM;
        return NULL;
    }
    return aligned(ps, (n + ps - 1) & ~(ps - 1));
}

NVH_CAP_EXPORT size_t malloc_usable_size(void *p)
{
    if (!p)
        return 0;
    if (nvh_cap_contains_(&g_cap, p)) {
        size_t u = nvh_cap_usable_(&g_cap, p);
        if (!u)
            report("malloc_usable_size", CAP_INVALID);
        return u;
    }
    return libc_usable(p);
}
