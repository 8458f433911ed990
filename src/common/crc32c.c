/* crc32c.c — CRC32C (Castagnoli) for on-media checksums.
 *
 * Uses the SSE4.2 crc32 instruction when CPUID reports it (8 bytes per
 * instruction), else a byte-wise table. Both give identical results, so a
 * pool written on one machine verifies on another. */
#include "internal.h"

#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static bool crc_have_sse42;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        crc_have_sse42 = (ecx & bit_SSE4_2) != 0;
#endif
}

static uint32_t crc_table_update(uint32_t crc, const unsigned char *p, size_t len)
{
    while (len--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc_sse42_update(uint32_t crc, const unsigned char *p, size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = __builtin_ia32_crc32di(c, word);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t nvh_crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    crc = ~crc;
#if defined(__x86_64__)
    if (crc_have_sse42) return ~crc_sse42_update(crc, data, len);
#endif
    return ~crc_table_update(crc, data, len);
}
