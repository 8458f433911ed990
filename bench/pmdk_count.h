/* pmdk_count.h — counting PMDK's flushed lines and fences, so a benchmark
 * can print them per operation next to nvheap's own counters.
 *
 * Linking pmdk_count.c into a benchmark interposes libpmem's flush entry
 * points (pmem_flush, pmem_drain, pmem_persist, pmem_mem{cpy,move,set},
 * pmem_msync, pmem_deep_flush): libpmemobj calls them through the PLT, so
 * the executable's definitions win, count, and call the real ones. Counts
 * are kept per worker (one cache line each, so counting does not make the
 * workers share a line); only the outermost call of a thread counts, since
 * pmem_persist itself calls pmem_flush and pmem_drain. */
#ifndef NVH_BENCH_PMDK_COUNT_H
#define NVH_BENCH_PMDK_COUNT_H

#include <stdint.h>

#define PMDK_COUNT_MAX_WORKERS 64u

typedef struct pmdk_count {
    uint64_t lines, fences;
} pmdk_count;

/* Resolve libpmem's real functions; call once before any PMDK pool exists.
 * `program` names the benchmark in the (fatal) message if one is missing. */
void pmdk_count_init(const char *program);

/* The counting slot of the calling thread: 0 (the default) for the main
 * thread, 1 .. PMDK_COUNT_MAX_WORKERS for workers. */
void pmdk_count_set_worker(unsigned id);

/* Sum over every worker, and back to zero. */
pmdk_count pmdk_count_total(void);
void pmdk_count_reset(void);

#endif /* NVH_BENCH_PMDK_COUNT_H */
