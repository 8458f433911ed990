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
    run((run_cfg){11, 90, 200, 30, 2, 0, 0, 0, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_words(void **state)
{
    (void)state;
    run((run_cfg){12, 90, 200, 30, 2, 0, 0, 0, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* inserts of new keys in random order (every third 4096 bytes long): a
 * split every ~16 inserts, into the upper and the lower half, each done in
 * the insert's two fences (record activated with the queue entry as its
 * link, then the new leaf; the split leaf's tombstones owed to the next
 * fence) */
static void every_fence_splits(void **state)
{
    (void)state;
    run((run_cfg){16, 400, 170, 0, 3, 0, 0, 0, 0}, NVH_CRASH_LINES, 0, 2);
}

static void every_fence_splits_words(void **state)
{
    (void)state;
    run((run_cfg){17, 400, 170, 5, 3, 0, 0, 0, 0}, NVH_CRASH_WORDS, 0, 1);
}

/* overwrites and removes of a few keys: queued frees at every step */
static void every_fence_updates(void **state)
{
    (void)state;
    run((run_cfg){13, 6, 80, 35, 3, 0, 0, 0, 0}, NVH_CRASH_LINES, 0, 1);
}

/* A leaf drop frees the leaf with one nvh_free whose link (the previous
 * leaf's `next`) the allocator stores without a write-back until its ring
 * retires; a split right after it activates the new leaf over that same
 * word, recording its current value, which may not be durable yet. The
 * allocator's recovery replays every unretired free's link before a later
 * activation's (global sequence order), so the activation's recorded value
 * is restored first. Keys by rank in key order (the model's `ord`): ranks
 * 0 mod 4 ascending (about 6 leaves of 16), then
 *   - the band [100, 200] of them removed (the leaves inside it dropped),
 *     and the free ranks of (60, 100) inserted ascending: the leaf before
 *     the band splits into its upper half, linked at its own `next`;
 *   - the band [252, 328] removed, and the free ranks of (330, 370)
 *     inserted descending: the leaf after the band splits into its lower
 *     half, linked at its predecessor's `next`, which the drop's free set.
 * (An upper split flushes the leaf's header line, `split_tag` beside
 * `next`, before its data fence, so its link is durable anyway.)
 * A crash at every fence, lines; it fails when recovery replays the free
 * records' links after the activations'. */
static void every_fence_drop_then_split(void **state)
{
    (void)state;
    enum { N = 400 };
    km_long_every = 0;
    km_model *m = km_new(N);
    static op script[N];
    unsigned n = 0;
    for (unsigned r = 0; r < N; r += 4) script[n++] = (op){0, m->ord[r]};
    for (unsigned r = 100; r <= 200; r += 4) script[n++] = (op){1, m->ord[r]};
    for (unsigned r = 61; r < 100; r++)
        if (r % 4) script[n++] = (op){0, m->ord[r]};
    for (unsigned r = 252; r <= 328; r += 4) script[n++] = (op){1, m->ord[r]};
    for (unsigned r = 369; r > 330; r--)
        if (r % 4) script[n++] = (op){0, m->ord[r]};
    km_free(m);
    g_script = script;
    run((run_cfg){18, N, n, 30, 0, 0, 0, 0, 0}, NVH_CRASH_LINES, 0, 2);
    g_script = NULL;
}

/* a long random run: sampled crash points */
static void sampled_long(void **state)
{
    (void)state;
    run((run_cfg){14, 1500, 6000, 30, 0, 0, 0, 0, 0}, NVH_CRASH_LINES, 150, 1);
}

static void sampled_long_words(void **state)
{
    (void)state;
    run((run_cfg){15, 400, 3000, 40, 5, 0, 0, 0, 0}, NVH_CRASH_WORDS, 100, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_fence_lines), cmocka_unit_test(every_fence_words),
        cmocka_unit_test(every_fence_splits), cmocka_unit_test(every_fence_splits_words),
        cmocka_unit_test(every_fence_updates), cmocka_unit_test(sampled_long),
        cmocka_unit_test(sampled_long_words), cmocka_unit_test(every_fence_drop_then_split),
    };
    return kvs_crash_main(tests, sizeof tests / sizeof tests[0]);
}
