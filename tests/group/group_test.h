/* group_test.h — helpers for the persist-group tests: pools in a chosen
 * domain with a roomy root area, records that straddle cache lines and carry
 * a checksum (so a torn record is detected), and an action log that checks
 * "exactly once, in order". */
#ifndef NVH_GROUP_TEST_H
#define NVH_GROUP_TEST_H

#include "test_util.h"

#include <limits.h>
#include <sys/mman.h>
#include <time.h>

/* Under TSan every fork (one per crash image) costs ~70 ms: the crash and
 * image-heavy tests check fewer images there (they are single-threaded, so
 * TSan has nothing to find in them anyway). */
#if defined(__SANITIZE_THREAD__)
#define GT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GT_TSAN 1
#endif
#endif
#ifndef GT_TSAN
#define GT_TSAN 0
#endif
/* images per crash point: n normally, 1 under TSan */
#define GT_IMAGES(n) (GT_TSAN ? 1u : (unsigned)(n))

#define GT_LAYOUT "grouptest"
#define GT_ROOT_SIZE (256u * 1024u)

/* The pool open whose root window gt_pool_create opened (its address and
 * open epoch: a test may close it itself and reopen, possibly at the same
 * address; the window died with that open). set: remember pool; else:
 * 1 if pool is that open (and forget it). */
static inline int gt_window_note(nvh_pool *pool, int set)
{
    static nvh_pool *open_pool;
    static uint64_t open_epoch;
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    if (set) {
        open_pool = pool;
        open_epoch = info.epoch;
        return 1;
    }
    int same = open_pool == pool && open_epoch == info.epoch;
    open_pool = NULL;
    return same;
}

/* A fresh pool (open) in `domain`, with a 256 KiB root area.
 *
 * Stray-write protection (NVHEAP_PROTECT=sync|async in the environment
 * protects the pool at create; docs/PROTECT.md): the root area is the
 * application's, and the tests store into it directly (records, keys,
 * counters, in the test bodies and in actions), so the helper opens one
 * application write window over the whole root area here, as an
 * application that keeps its own area writable would, and closes it in
 * gt_pool_destroy. Under protection the group tests then check that the library (pool,
 * allocator, the group layer) makes no store outside a window of its own:
 * any store of theirs outside the root area aborts as a stray. With
 * protection off both windows cost a load and a branch. */
static inline nvh_pool *gt_pool_create(const char *name, nvh_domain domain, const char **path_out)
{
    const char *path = test_path(name);
    nvh_pool_options opts = {.root_size = GT_ROOT_SIZE};
    nvh_pool *pool = nvh_pool_create_ex(path, GT_LAYOUT, 1 << 20, domain, &opts);
    assert_non_null(pool);
    size_t size = 0;
    void *root = nvh_root(pool, &size);
    assert_non_null(root);
    assert_int_equal(nvh_unprotect(pool, root, size), NVH_OK);
    gt_window_note(pool, 1);
    if (path_out) *path_out = path;
    return pool;
}

static inline void gt_pool_destroy(nvh_pool *pool, const char *path)
{
    size_t size = 0;
    void *root = nvh_root(pool, &size);
    if (gt_window_note(pool, 0)) assert_int_equal(nvh_protect(pool, root, size), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static inline uint64_t gt_pool_fences(const nvh_pool *pool)
{
    nvh_stats st;
    nvh_stats_get(pool, &st);
    return st.fences;
}

/* --------------------------------------------------------------------------
 * Records: 200 bytes, so they straddle lines and neighbours share lines.
 * `key` is the validation key an action may write ([Moraru11] §6 change 2).
 * -------------------------------------------------------------------------- */
#define GT_WORDS 23
typedef struct gt_record {
    uint64_t key;               /* written by the publishing action        */
    uint64_t seq;               /* index + 1                               */
    uint64_t word[GT_WORDS];
    uint64_t check;
} gt_record;
_Static_assert(sizeof(gt_record) == 208, "record size");

#define GT_MAX_RECORDS 1200
typedef struct gt_root {
    _Alignas(64) uint64_t count;          /* published records (its own line) */
    _Alignas(64) gt_record rec[GT_MAX_RECORDS];
} gt_root;
_Static_assert(sizeof(gt_root) <= GT_ROOT_SIZE, "root area too small");

static inline uint64_t gt_key(uint64_t i) { return 0x4B455900ull ^ ((i + 1) * 0x2545F4914F6CDD1Dull); }

static inline uint64_t gt_word(uint64_t i, unsigned w, uint64_t gen)
{
    return ((i + 1) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)w << 56) ^ (gen * 0xD1B54A32D192ED03ull);
}

static inline uint64_t gt_check(const gt_record *r)
{
    uint64_t c = r->seq * 0xBF58476D1CE4E5B9ull;
    for (unsigned w = 0; w < GT_WORDS; w++) c = (c ^ r->word[w]) * 0x94D049BB133111EBull;
    return c;
}

/* Fill record i (not its key). */
static inline void gt_fill(gt_record *r, uint64_t i, uint64_t gen)
{
    r->seq = i + 1;
    for (unsigned w = 0; w < GT_WORDS; w++) r->word[w] = gt_word(i, w, gen);
    r->check = gt_check(r);
}

static inline int gt_intact(const gt_record *r, uint64_t i)
{
    if (r->seq != i + 1 || r->check != gt_check(r)) return 0;
    for (unsigned w = 0; w < GT_WORDS; w++)
        if (r->word[w] != gt_word(i, w, 0)) return 0;
    return 1;
}

/* --------------------------------------------------------------------------
 * Action log: every action appends its argument; tests compare with the
 * begin order.
 * -------------------------------------------------------------------------- */
typedef struct gt_log {
    uint64_t n;
    uint64_t id[4096];
    nvh_pool *expect_pool;
} gt_log;

static inline void gt_log_action(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)ctx;
    extern gt_log *gt_current_log;
    gt_log *log = gt_current_log;
    if (log->expect_pool) assert_ptr_equal(pool, log->expect_pool);
    assert_true(log->n < 4096);
    log->id[log->n++] = (uint64_t)(uintptr_t)arg;
}

#endif
