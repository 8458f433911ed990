/* cap_sizes.h — random block sizes for the capacity-mode stress tests:
 * log-distributed, mostly small, with rare blocks of several MiB, so that
 * every size class, large class and huge span is exercised in one run. */
#ifndef NVH_TEST_CAP_SIZES_H
#define NVH_TEST_CAP_SIZES_H

#include <stddef.h>
#include <stdint.h>

/* xorshift64: cheap enough for the threads' inner loops */
static inline uint64_t cap_rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A size in [2^lg, 2^(lg+1)): lg in [min_lg, 16] (up to 64 KiB) for
 * small_pm of every 1000 draws, in [17, 21] (up to 4 MiB) below mid_pm,
 * else in [22, max_lg]. */
static inline size_t cap_pick_size(uint64_t *s, unsigned small_pm, unsigned mid_pm,
                                   unsigned min_lg, unsigned max_lg)
{
    uint64_t r = cap_rnd(s);
    unsigned bits = (unsigned)(r % 1000), lg;
    if (bits < small_pm)
        lg = min_lg + (unsigned)(r >> 10) % (17 - min_lg);
    else if (bits < mid_pm)
        lg = 17 + (unsigned)(r >> 10) % 5;
    else
        lg = 22 + (unsigned)(r >> 10) % (max_lg - 21);
    size_t base = (size_t)1 << lg;
    return base + (size_t)(cap_rnd(s) % base);
}

#endif
