/* flush.c — the out-of-line halves of the persistence primitives: the
 * domains whose flush is not a single instruction (msync records dirty
 * pages, sim records lines for the media image) and the non-temporal copy. */
#include "../common/internal.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A full memory barrier. Not atomic_thread_fence: GCC's TSan rejects it
 * (-Werror=tsan), and these fallbacks only need the hardware ordering. */
static inline void full_fence(void)
{
#if defined(__x86_64__)
    __asm__ volatile("mfence" ::: "memory");
#else
    __sync_synchronize();
#endif
}

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
        full_fence();
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
        full_fence();
        return;
    }
}

#if defined(__x86_64__)
/* Stream whole 64 B lines: four loads, then four streaming stores, so each
 * line leaves the write-combining buffer in one piece. The AVX variant halves
 * the instruction count; it is chosen once, by CPUID. */
static void stream_lines_sse2(char *d, const char *s, size_t body)
{
    for (size_t i = 0; i < body; i += NVH_CACHELINE) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
}

__attribute__((target("avx")))
static void stream_lines_avx(char *d, const char *s, size_t body)
{
    for (size_t i = 0; i < body; i += NVH_CACHELINE) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
    }
}

static void stream_lines(char *d, const char *s, size_t body)
{
    static _Atomic int have_avx = -1;   /* every thread computes the same value */
    int avx = atomic_load_explicit(&have_avx, memory_order_relaxed);
    if (__builtin_expect(avx < 0, 0)) {
        __builtin_cpu_init();
        avx = __builtin_cpu_supports("avx") ? 1 : 0;
        atomic_store_explicit(&have_avx, avx, memory_order_relaxed);
    }
    if (avx) stream_lines_avx(d, s, body);
    else stream_lines_sse2(d, s, body);
}
#endif

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
    stream_lines(d, s, body);
    if (body) {
        /* With CLFLUSH, nvh_drain issues no SFENCE (CLFLUSH orders itself),
         * but streamed stores are ordered and made durable only by one: the
         * copy fences them here, as PMDK does in that mode. */
        if (pool->ctx.flush_kind == NVH_FLUSH_CLFLUSH) __asm__ volatile("sfence" ::: "memory");
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
