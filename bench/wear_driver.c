/* wear_driver.c — the random alloc/free workload of [Moraru11] Fig. 4, run under valgrind by bench_wear
 *
 *   wear_driver glibc  OPS SEED RANGES_FILE
 *   wear_driver nvheap OPS SEED RANGES_FILE POOL_PATH DELAY_NS
 *   wear_driver --print-marker
 *
 * OPS random operations, half allocations and half frees (a free releases a
 * uniformly chosen live block; with nothing live it allocates instead),
 * sizes uniform in 10..4096 B; every allocated block is written exactly once
 * (memset of its requested size). glibc: malloc/free. nvheap: nvh_reserve,
 * the write, nvh_persist, nvh_activate (no link) / nvh_free (no link), in the
 * process domain, with the don't-allocate delay T = DELAY_NS.
 *
 * bench_wear runs this under `valgrind --tool=lackey --trace-mem=yes` and
 * counts the stores. Two things tell it which stores belong to the workload:
 *   - the marker: one store to `wear_marker` just before the first operation
 *     and one just after the last (--print-marker prints its address, which
 *     is the same in every run under valgrind);
 *   - RANGES_FILE, written at exit: the address ranges of the heap, one
 *     "RANGE lo hi" line each. nvheap: the whole pool mapping (all of its
 *     persistent metadata lives there). glibc: every 4 KiB page that held a
 *     block (or its 16 B chunk header), so in-heap metadata is included and
 *     malloc's own static state in libc is not. The driver's bookkeeping is
 *     mmapped, outside both.
 */
#include "nvheap.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A line of its own, written only at the two phase boundaries. */
volatile uint64_t wear_marker[8] __attribute__((aligned(64)));

typedef struct block {
    char *ptr;
    uint32_t size;
} block;

static void *map_array(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("wear_driver: mmap");
        exit(1);
    }
    return p;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--print-marker") == 0) {
        printf("%p\n", (void *)wear_marker);
        return 0;
    }
    bool nvheap = argc == 7 && strcmp(argv[1], "nvheap") == 0;
    if (!nvheap && !(argc == 5 && strcmp(argv[1], "glibc") == 0)) {
        fprintf(stderr, "usage: wear_driver glibc OPS SEED RANGES | nvheap OPS SEED RANGES POOL "
                        "DELAY_NS | --print-marker\n");
        return 2;
    }
    uint64_t ops = strtoull(argv[2], NULL, 10), x = strtoull(argv[3], NULL, 10) | 1;
    const char *ranges_path = argv[4];

    nvh_pool *pool = NULL;
    if (nvheap) {
        nvh_pool_options po = {.max_size = (uint64_t)4 << 30};
        unlink(argv[5]);
        pool = nvh_pool_create_ex(argv[5], "wear", (uint64_t)64 << 20, NVH_DOMAIN_PROCESS, &po);
        nvh_heap_config cfg;
        if (!pool || nvh_heap_config_get(pool, &cfg) != NVH_OK) {
            fprintf(stderr, "wear_driver: pool: %s\n", nvh_errormsg());
            return 1;
        }
        cfg.fifo_delay_ns = strtoull(argv[6], NULL, 10);
        cfg.fifo_max_bytes = (uint64_t)1 << 30;       /* the delay, not the bound, decides */
        if (nvh_heap_config_set(pool, &cfg) != NVH_OK) {
            fprintf(stderr, "wear_driver: config: %s\n", nvh_errormsg());
            return 1;
        }
    }
    block *live = map_array(ops * sizeof *live);
    uint64_t *pages = map_array(ops * 2 * sizeof *pages);
    uint64_t nlive = 0, npages = 0, allocs = 0, frees = 0;

    wear_marker[0] = 1;                                    /* the workload starts */
    for (uint64_t i = 0; i < ops; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if ((x & 1) && nlive > 0) {
            uint64_t k = (x >> 1) % nlive;
            if (pool) {
                if (nvh_free(pool, live[k].ptr, NULL, 0) != NVH_OK) {
                    fprintf(stderr, "wear_driver: nvh_free: %s\n", nvh_errormsg());
                    return 1;
                }
            } else {
                free(live[k].ptr);
            }
            live[k] = live[--nlive];
            frees++;
            continue;
        }
        uint32_t size = 10u + (uint32_t)((x >> 1) % 4087u);  /* 10 .. 4096 */
        char *p;
        if (pool) {
            p = nvh_reserve(pool, size);
            if (!p) {
                fprintf(stderr, "wear_driver: nvh_reserve: %s\n", nvh_errormsg());
                return 1;
            }
            memset(p, (int)(i & 0xff), size);
            nvh_persist(pool, p, size);
            if (nvh_activate(pool, p, NULL, 0) != NVH_OK) {
                fprintf(stderr, "wear_driver: nvh_activate: %s\n", nvh_errormsg());
                return 1;
            }
        } else {
            p = malloc(size);
            if (!p) return 1;
            memset(p, (int)(i & 0xff), size);
            uintptr_t first = ((uintptr_t)p - 16) >> 12, last = ((uintptr_t)p + size - 1) >> 12;
            pages[npages++] = first;
            if (last != first) pages[npages++] = last;     /* blocks <= 4096 B: two pages at most */
        }
        live[nlive].ptr = p;
        live[nlive].size = size;
        nlive++;
        allocs++;
    }
    wear_marker[0] = 2;                                    /* the workload is over */

    FILE *out = fopen(ranges_path, "w");
    if (!out) {
        perror(ranges_path);
        return 1;
    }
    if (pool) {
        uintptr_t base = (uintptr_t)nvh_pool_base(pool);
        fprintf(out, "RANGE %#lx %#lx\n", (unsigned long)base,
                (unsigned long)(base + nvh_pool_size(pool)));
        nvh_heap_stats st;
        if (nvh_heap_stats_get(pool, &st) == NVH_OK)
            fprintf(out, "INFO heap_bytes %llu live_objects %llu fifo_entries %llu\n",
                    (unsigned long long)st.heap_bytes, (unsigned long long)st.live_objects,
                    (unsigned long long)st.fifo_entries);
    } else {
        qsort(pages, npages, sizeof *pages, compare_u64);
        for (uint64_t i = 0; i < npages;) {
            uint64_t j = i;
            while (j + 1 < npages && pages[j + 1] <= pages[j] + 1) j++;
            fprintf(out, "RANGE %#lx %#lx\n", (unsigned long)(pages[i] << 12),
                    (unsigned long)((pages[j] + 1) << 12));
            i = j + 1;
        }
    }
    fprintf(out, "OPS allocs %llu frees %llu live %llu marker %p\n", (unsigned long long)allocs,
            (unsigned long long)frees, (unsigned long long)nlive, (void *)wear_marker);
    fclose(out);
    if (pool) {
        nvh_pool_close(pool);
        unlink(argv[5]);
    }
    return 0;
}
