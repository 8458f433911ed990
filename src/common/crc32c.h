/* crc32c.h — CRC32C inlined into the hot paths (allocator records and region
 * headers, transaction log records).
 *
 * nvh_crc32c (crc32c.c) is the reference: a function call, a pthread_once
 * and a dispatch per checksum. The hot paths checksum a 64-byte line per
 * operation, where that overhead is a fifth of the work, so they use
 * nvh_crc32c_inline: the SSE4.2 crc32 instruction in line, 8 bytes per
 * instruction, once the CPU is known to have it (decided once, cached in a
 * global). Both always give identical results, so a pool written on one
 * machine verifies on another. */
#ifndef NVH_CRC32C_H
#define NVH_CRC32C_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nvheap.h"   /* nvh_crc32c, the reference implementation */

extern _Atomic int nvh_crc32c_hw_;   /* -1 not yet known, 0 table, 1 SSE4.2 */
int nvh_crc32c_hw_detect_(void);     /* sets and returns nvh_crc32c_hw_      */

#if defined(__x86_64__)
/* The raw update (no pre/post inversion): 8 bytes at a time, then 4, then 1. */
__attribute__((target("sse4.2"))) static inline uint32_t
nvh_crc32c_sse42_(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    if (len >= 4) {
        uint32_t word;
        memcpy(&word, p, 4);
        c32 = __builtin_ia32_crc32si(c32, word);
        p += 4;
        len -= 4;
    }
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}

/* Fixed-length, fully unrolled variants for the checksums on every allocator
 * activate and free: a record head line (64 B) and a region header's bytes
 * 8..59 (52 B). The loop above spends ~5 instructions per 8-byte word on
 * the loop itself (callgrind); unrolled it is one load and one crc32 each. */
__attribute__((target("sse4.2"))) static inline uint32_t
nvh_crc32c_sse42_64_(uint32_t crc, const unsigned char *p)
{
    /* written out, not a loop over a copied array: the compiler keeps a
     * loop (and the copy) at -O2 */
    uint64_t c = crc, w0, w1, w2, w3, w4, w5, w6, w7;
    memcpy(&w0, p, 8); memcpy(&w1, p + 8, 8); memcpy(&w2, p + 16, 8); memcpy(&w3, p + 24, 8);
    memcpy(&w4, p + 32, 8); memcpy(&w5, p + 40, 8); memcpy(&w6, p + 48, 8); memcpy(&w7, p + 56, 8);
    c = __builtin_ia32_crc32di(c, w0); c = __builtin_ia32_crc32di(c, w1);
    c = __builtin_ia32_crc32di(c, w2); c = __builtin_ia32_crc32di(c, w3);
    c = __builtin_ia32_crc32di(c, w4); c = __builtin_ia32_crc32di(c, w5);
    c = __builtin_ia32_crc32di(c, w6); c = __builtin_ia32_crc32di(c, w7);
    return (uint32_t)c;
}
__attribute__((target("sse4.2"))) static inline uint32_t
nvh_crc32c_sse42_52_(uint32_t crc, const unsigned char *p)
{
    uint64_t w[6];
    uint32_t tail;
    memcpy(w, p, 48);
    memcpy(&tail, p + 48, 4);
    uint64_t c = crc;
    for (int i = 0; i < 6; i++) c = __builtin_ia32_crc32di(c, w[i]);
    return __builtin_ia32_crc32si((uint32_t)c, tail);
}
#endif

/* Same result as nvh_crc32c(seed, data, len). A target("sse4.2") function
 * cannot be inlined into a caller built without SSE4.2, so the instruction
 * path is one call; constant lengths 64 and 52 fold to the unrolled ones. */
static inline uint32_t nvh_crc32c_inline(uint32_t seed, const void *data, size_t len)
{
#if defined(__x86_64__)
    int hw = atomic_load_explicit(&nvh_crc32c_hw_, memory_order_relaxed);
    if (__builtin_expect(hw < 0, 0)) hw = nvh_crc32c_hw_detect_();
    if (__builtin_expect(hw, 1)) {
        if (__builtin_constant_p(len) && len == 64)
            return ~nvh_crc32c_sse42_64_(~seed, (const unsigned char *)data);
        if (__builtin_constant_p(len) && len == 52)
            return ~nvh_crc32c_sse42_52_(~seed, (const unsigned char *)data);
        return ~nvh_crc32c_sse42_(~seed, (const unsigned char *)data, len);
    }
#endif
    return nvh_crc32c(seed, data, len);
}

#endif /* NVH_CRC32C_H */
