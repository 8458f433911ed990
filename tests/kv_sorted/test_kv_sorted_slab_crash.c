/* test_kv_sorted_slab_crash.c — crash consistency of the sorted engine's
 * record slabs under the crash simulator (harness and checker:
 * kvs_crash.h), at every fence, in line and word modes:
 *   - small slabs and few keys: slabs empty and are freed all the time
 *     (their frees owed to later data fences, the build's count and free),
 *     with records of both kinds (the 4096-byte keys' stay allocator
 *     objects);
 *   - a version-1 tree (every record an allocator object, as format 3's
 *     first library wrote them) that goes on with slab records: the header's
 *     version raise, overwrites and removes of allocator records;
 *   - a version-2 tree (slab records with 16-byte headers) that goes on
 *     with 8-byte-header records: the raise to version 3. */
#include "kvs_crash.h"

/* records in small slabs (1 KiB; records above 960 B, the 4096-byte keys,
 * stay allocator objects): inserts, overwrites and removes of few keys
 * empty slabs often, so their frees (owed to a later data fence) and the
 * build's count and free of empty slabs are crashed at every fence */
static void every_fence_slab_frees(void **state)
{
    (void)state;
    run((run_cfg){21, 24, 160, 35, 4, 960, 1024, 0, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_slab_frees_words(void **state)
{
    (void)state;
    run((run_cfg){22, 24, 160, 35, 4, 960, 1024, 0, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* a version-1 tree (every record an allocator object, as format 3's
 * library wrote it) goes on with slab records: its first slab raises the
 * header's version, overwrites and removes of its allocator records (the
 * queued frees) mix with slab records, splits and leaf removals */
static void every_fence_v1_upgrade(void **state)
{
    (void)state;
    run((run_cfg){23, 60, 150, 30, 4, 960, 2048, 70, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_v1_upgrade_words(void **state)
{
    (void)state;
    run((run_cfg){24, 60, 150, 30, 4, 960, 2048, 70, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* a version-2 tree (slab records with the 16-byte header, as the library
 * before tree version 3 wrote it) goes on with 8-byte-header records after
 * a reopen: its next slab raises the version, durable before any slot
 * names such a record (kv_sorted_check refuses an 8-byte record in a tree
 * of version 2), overwrites and removes of old records, splits */
static void every_fence_v2_upgrade(void **state)
{
    (void)state;
    run((run_cfg){25, 60, 150, 30, 4, 960, 2048, 0, 70}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_v2_upgrade_words(void **state)
{
    (void)state;
    run((run_cfg){26, 60, 150, 30, 4, 960, 2048, 0, 70}, NVH_CRASH_WORDS, 0, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_fence_slab_frees), cmocka_unit_test(every_fence_slab_frees_words),
        cmocka_unit_test(every_fence_v1_upgrade), cmocka_unit_test(every_fence_v1_upgrade_words),
        cmocka_unit_test(every_fence_v2_upgrade), cmocka_unit_test(every_fence_v2_upgrade_words),
    };
    return kvs_crash_main(tests, sizeof tests / sizeof tests[0]);
}
