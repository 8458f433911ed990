/* pmdk_count.c — interposition of libpmem's flush entry points to count
 * PMDK's flushed lines and fences (pmdk_count.h says how and why). */
#include "pmdk_count.h"

#include <libpmem.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE 64u

/* ==========================================================================
 * Per-worker counts
 * ========================================================================== */
typedef struct worker_count {
    _Alignas(64) uint64_t lines, fences;
} worker_count;

static worker_count counts[PMDK_COUNT_MAX_WORKERS + 1];
static _Thread_local unsigned worker_id;   /* 0 = main thread */
static _Thread_local unsigned call_depth;  /* nested libpmem calls count once */

#define COUNTED(lines_, fences_, call)                 \
    do {                                               \
        if (call_depth++ == 0) {                       \
            counts[worker_id].lines += (lines_);       \
            counts[worker_id].fences += (fences_);     \
        }                                              \
        call;                                          \
        call_depth--;                                  \
    } while (0)

void pmdk_count_set_worker(unsigned id)
{
    worker_id = id <= PMDK_COUNT_MAX_WORKERS ? id : PMDK_COUNT_MAX_WORKERS;
}

pmdk_count pmdk_count_total(void)
{
    pmdk_count total = {0, 0};
    for (unsigned i = 0; i <= PMDK_COUNT_MAX_WORKERS; i++) {
        total.lines += counts[i].lines;
        total.fences += counts[i].fences;
    }
    return total;
}

void pmdk_count_reset(void)
{
    memset(counts, 0, sizeof counts);
}

/* ==========================================================================
 * The real functions
 * ========================================================================== */
static struct {
    void (*flush)(const void *, size_t);
    void (*drain)(void);
    void (*persist)(const void *, size_t);
    void *(*memcpy_)(void *, const void *, size_t, unsigned);
    void *(*memmove_)(void *, const void *, size_t, unsigned);
    void *(*memset_)(void *, int, size_t, unsigned);
    int (*msync_)(const void *, size_t);
    void (*deep_flush)(const void *, size_t);
} real_pmem;

static void *real_symbol(const char *program, const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (!sym) {
        fprintf(stderr, "%s: dlsym(RTLD_NEXT, %s): %s\n", program, name, dlerror());
        abort();
    }
    return sym;
}

void pmdk_count_init(const char *program)
{
    *(void **)&real_pmem.flush = real_symbol(program, "pmem_flush");
    *(void **)&real_pmem.drain = real_symbol(program, "pmem_drain");
    *(void **)&real_pmem.persist = real_symbol(program, "pmem_persist");
    *(void **)&real_pmem.memcpy_ = real_symbol(program, "pmem_memcpy");
    *(void **)&real_pmem.memmove_ = real_symbol(program, "pmem_memmove");
    *(void **)&real_pmem.memset_ = real_symbol(program, "pmem_memset");
    *(void **)&real_pmem.msync_ = real_symbol(program, "pmem_msync");
    *(void **)&real_pmem.deep_flush = real_symbol(program, "pmem_deep_flush");
}

/* ==========================================================================
 * The interposed entry points
 * ========================================================================== */
static inline uint64_t lines_of(const void *addr, size_t len)
{
    if (len == 0) return 0;
    uintptr_t first = (uintptr_t)addr & ~(uintptr_t)(LINE - 1);
    return ((uintptr_t)addr + len - first + LINE - 1) / LINE;
}

/* Lines a memcpy/memset to dst writes back, and whether it ends with a fence. */
static inline uint64_t mem_lines(const void *dst, size_t len, unsigned flags)
{
    return (flags & PMEM_F_MEM_NOFLUSH) ? 0 : lines_of(dst, len);
}
static inline uint64_t mem_fences(unsigned flags)
{
    return (flags & (PMEM_F_MEM_NOFLUSH | PMEM_F_MEM_NODRAIN)) ? 0 : 1;
}

void pmem_flush(const void *addr, size_t len)
{
    COUNTED(lines_of(addr, len), 0, real_pmem.flush(addr, len));
}
void pmem_drain(void)
{
    COUNTED(0, 1, real_pmem.drain());
}
void pmem_persist(const void *addr, size_t len)
{
    COUNTED(lines_of(addr, len), 1, real_pmem.persist(addr, len));
}
void *pmem_memcpy(void *dst, const void *src, size_t len, unsigned flags)
{
    void *r;
    COUNTED(mem_lines(dst, len, flags), mem_fences(flags),
            r = real_pmem.memcpy_(dst, src, len, flags));
    return r;
}
void *pmem_memmove(void *dst, const void *src, size_t len, unsigned flags)
{
    void *r;
    COUNTED(mem_lines(dst, len, flags), mem_fences(flags),
            r = real_pmem.memmove_(dst, src, len, flags));
    return r;
}
void *pmem_memset(void *dst, int c, size_t len, unsigned flags)
{
    void *r;
    COUNTED(mem_lines(dst, len, flags), mem_fences(flags),
            r = real_pmem.memset_(dst, c, len, flags));
    return r;
}
int pmem_msync(const void *addr, size_t len)
{
    int r;
    COUNTED(lines_of(addr, len), 1, r = real_pmem.msync_(addr, len));
    return r;
}
void pmem_deep_flush(const void *addr, size_t len)
{
    COUNTED(lines_of(addr, len), 0, real_pmem.deep_flush(addr, len));
}
