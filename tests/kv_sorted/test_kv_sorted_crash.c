/* test_kv_sorted_crash.c — crash consistency of the sorted engine under the
 * crash simulator (harness and checker: kvs_crash.h):
 *   - a crash at EVERY fence of runs that insert, overwrite and remove keys
 *     of which many are 4096 bytes long (leaf splits with long keys, leaf
 *     removals), in line mode (2 images per fence) and in adversarial word
 *     mode (1);
 *   - a crash at every fence of runs of inserts that split leaves (into
 *     their upper and their lower half, long keys too), lines and words;
 *   - a crash at every fence of overwrites and removes of a few keys (the
 *     queued frees and their recovery at every step);
 *   - sampled crashes over a long random run (the operation-log oracle).
 * Record slabs and version-1 trees: test_kv_sorted_slab_crash.c. */
#include "kvs_crash.h"

/* inserts, overwrites, removes; every other key 4096 bytes: splits of
 * leaves full of long keys, leaf removals */
static void every_fence_lines(void **state)
{
    (void)state;
    run((run_cfg){11, 90, 200, 30, 2, 0, 0, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_words(void **state)
{
    (void)state;
    run((run_cfg){12, 90, 200, 30, 2, 0, 0, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* inserts of new keys in random order (every third 4096 bytes long): a
 * split every ~16 inserts, into the upper and the lower half, each done in
 * the insert's two fences (record activated with the queue entry as its
 * link, then the new leaf; the split leaf's tombstones owed to the next
 * fence) */
static void every_fence_splits(void **state)
{
    (void)state;
    run((run_cfg){16, 400, 170, 0, 3, 0, 0, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_splits_words(void **state)
{
    (void)state;
    run((run_cfg){17, 400, 170, 5, 3, 0, 0, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* overwrites and removes of a few keys: queued frees at every step */
static void every_fence_updates(void **state)
{
    (void)state;
    run((run_cfg){13, 6, 80, 35, 3, 0, 0, 0}, NVH_CRASH_LINES, 0, 1);
}

/* a long random run: sampled crash points */
static void sampled_long(void **state)
{
    (void)state;
    run((run_cfg){14, 1500, 6000, 30, 0, 0, 0, 0}, NVH_CRASH_LINES, 150, 1);
}

static void sampled_long_words(void **state)
{
    (void)state;
    run((run_cfg){15, 400, 3000, 40, 5, 0, 0, 0}, NVH_CRASH_WORDS, 100, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_fence_lines), cmocka_unit_test(every_fence_words),
        cmocka_unit_test(every_fence_splits), cmocka_unit_test(every_fence_splits_words),
        cmocka_unit_test(every_fence_updates), cmocka_unit_test(sampled_long),
        cmocka_unit_test(sampled_long_words),
    };
    return kvs_crash_main(tests, sizeof tests / sizeof tests[0]);
}
