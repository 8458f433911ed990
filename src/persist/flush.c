/* flush.c — the out-of-line halves of the persistence primitives: the
 * domains whose flush is not a single instruction (msync records dirty
 * pages, sim records lines for the media image) and the non-temporal copy. */
#include "../common/internal.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

void nvh_msync_record(nvh_pool *pool, const void *addr, size_t len);
int nvh_msync_drain(nvh_pool *pool);
void nvh_sim_flush(nvh_pool *pool, const void *addr, size_t len);
void nvh_sim_drain(nvh_pool *pool);

void nvh_flush_slow_(nvh_pool *pool, const void *addr, size_t len)
{
    switch ((nvh_domain)pool->ctx.domain) {
    case NVH_DOMAIN_MSYNC:
        nvh_msync_record(pool, addr, len);
        return;
    case NVH_DOMAIN_SIM:
        nvh_sim_flush(pool, addr, len);
        return;
    default:
        /* Non-x86 pmem: no portable user-space line flush; a full fence
         * keeps ordering, durability needs the platform to be eADR. */
        atomic_thread_fence(memory_order_seq_cst);
        return;
    }
}

void nvh_drain_slow_(nvh_pool *pool)
{
    switch ((nvh_domain)pool->ctx.domain) {
    case NVH_DOMAIN_MSYNC:
        nvh_msync_drain(pool);
        return;
    case NVH_DOMAIN_SIM:
        nvh_sim_drain(pool);
        return;
    default:
        atomic_thread_fence(memory_order_seq_cst);
        return;
    }
}

/* Non-temporal copy: the unaligned head and tail go through the cache and are
 * flushed; the aligned middle is streamed with MOVNTI 8 bytes at a time (or
 * 16-byte MOVNTDQ), bypassing the cache, so it needs no flush — only the
 * caller's final SFENCE. Counted as flushed lines (the hardware-independent
 * figure: the same lines reach the media) and as NT bytes. */
void nvh_memcpy_nt_(nvh_pool *pool, void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
    char *d = dst;
    const char *s = src;
    size_t head = (NVH_CACHELINE - ((uintptr_t)d & (NVH_CACHELINE - 1))) & (NVH_CACHELINE - 1);
    if (head > len) head = len;
    if (head) {
        memcpy(d, s, head);
        nvh_flush(pool, d, head);
        d += head; s += head; len -= head;
    }
    size_t body = len & ~(size_t)(NVH_CACHELINE - 1);
    for (size_t i = 0; i < body; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        _mm_stream_si128((__m128i *)(d + i), v);
    }
    if (body) {
        nvh_stat_add_(&pool->ctx, NVH_STAT_LINES, body / NVH_CACHELINE);
        nvh_stat_add_(&pool->ctx, NVH_STAT_NT_BYTES, body);
    }
    d += body; s += body; len -= body;
    if (len) {
        memcpy(d, s, len);
        nvh_flush(pool, d, len);
    }
#else
    memcpy(dst, src, len);
    nvh_flush(pool, dst, len);
#endif
}
