/* crc32c.c — CRC32C (Castagnoli) for on-media checksums.
 *
 * Uses the SSE4.2 crc32 instruction when CPUID reports it (8 bytes per
 * instruction), else a byte-wise table. Both give identical results, so a
 * pool written on one machine verifies on another. */
#include "internal.h"
#include "crc32c.h"

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

uint32_t nvh_crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    crc = ~crc;
#if defined(__x86_64__)
    if (crc_have_sse42) return ~nvh_crc32c_sse42_(crc, data, len);
#endif
    return ~crc_table_update(crc, data, len);
}

_Atomic int nvh_crc32c_hw_ = -1;

int nvh_crc32c_hw_detect_(void)
{
    pthread_once(&crc_once, crc_init);
    int hw = crc_have_sse42 ? 1 : 0;
    atomic_store_explicit(&nvh_crc32c_hw_, hw, memory_order_relaxed);
    return hw;
}
