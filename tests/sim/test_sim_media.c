/* test_sim_media.c — the sim domain's media model, seen through crash images
 * (nvh_sim_write_image): what a crash can and cannot lose.
 *
 *   persisted (flush + fence)   always in the image
 *   flushed, not yet fenced     maybe (the write-back may or may not be done)
 *   stored, never flushed       maybe (the line may have been evicted): about
 *                               half the images in line mode
 *   flushed then stored again   the flushed content or newer, never older
 *                               once the fence has passed
 * Line mode never tears a line; word mode tears at 8-byte granularity. The
 * same seed always builds the same bytes. */
#include "sim_test.h"

#define POOL_SIZE ((uint64_t)1 << 20)
#define SEEDS 200

/* A fresh sim-domain pool and the offset of its heap (where we scribble). */
static nvh_pool *sim_pool(const char **path_out, uint64_t *heap_off)
{
    const char *path = test_path("media");
    nvh_pool *pool = nvh_pool_create(path, "media", POOL_SIZE, NVH_DOMAIN_SIM);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    *heap_off = info.heap_offset;
    *path_out = path;
    return pool;
}

enum line_state { LINE_OLD, LINE_NEW, LINE_OTHER };

/* Compare the 64 bytes at off in the image file with an all-`old` and an
 * all-`fresh` line. */
static enum line_state classify(const char *image, uint64_t off, int old, int fresh)
{
    unsigned char got[NVH_CACHELINE], a[NVH_CACHELINE], b[NVH_CACHELINE];
    test_peek(image, (off_t)off, got, sizeof got);
    memset(a, old, sizeof a);
    memset(b, fresh, sizeof b);
    if (!memcmp(got, a, sizeof got)) return LINE_OLD;
    if (!memcmp(got, b, sizeof got)) return LINE_NEW;
    return LINE_OTHER;
}

/* ---------------------------------------------------------------------------
 * Determinism
 * ------------------------------------------------------------------------- */
static void same_seed_same_image(void **state)
{
    (void)state;
    const char *path;
    uint64_t heap;
    nvh_pool *pool = sim_pool(&path, &heap);
    char *base = nvh_pool_base(pool);
    /* 64 lines in flight: odd ones flushed but not fenced, even ones only stored */
    for (int i = 0; i < 64; i++) {
        memset(base + heap + 64 * (uint64_t)i, i + 1, 64);
        if (i % 2) nvh_flush(pool, base + heap + 64 * (uint64_t)i, 64);
    }
    uint64_t fences = nvh_sim_fence_count(pool);
    char a[600], b[600], c[600];
    snprintf(a, sizeof a, "%s.a", path);
    snprintf(b, sizeof b, "%s.b", path);
    snprintf(c, sizeof c, "%s.c", path);

    for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
        assert_int_equal(nvh_sim_write_image(pool, a, 42, (nvh_crash_mode)mode), NVH_OK);
        assert_int_equal(nvh_sim_write_image(pool, c, 43, (nvh_crash_mode)mode), NVH_OK);
        assert_int_equal(nvh_sim_write_image(pool, b, 42, (nvh_crash_mode)mode), NVH_OK);
        size_t la, lb, lc;
        unsigned char *ia = test_read_file(a, &la), *ib = test_read_file(b, &lb);
        unsigned char *ic = test_read_file(c, &lc);
        assert_int_equal(la, POOL_SIZE);
        assert_int_equal(lb, la);
        assert_int_equal(lc, la);
        assert_memory_equal(ia, ib, la);                  /* same seed: same bytes */
        assert_true(memcmp(ia, ic, la) != 0);             /* 64 coins: they differ */
        free(ia); free(ib); free(ic);
    }
    /* writing images is an observation: no fence, nothing made durable */
    assert_int_equal(nvh_sim_fence_count(pool), fences);
    unlink(a); unlink(b); unlink(c);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * What survives
 * ------------------------------------------------------------------------- */
static void persisted_flushed_unflushed(void **state)
{
    (void)state;
    const char *path;
    uint64_t heap;
    nvh_pool *pool = sim_pool(&path, &heap);
    char *base = nvh_pool_base(pool);
    uint64_t A = heap, B = heap + 128, C = heap + 256, D = heap + 384;
    memset(base + A, 0xAA, 64);
    nvh_persist(pool, base + A, 64);          /* durable */
    memset(base + B, 0xBB, 64);               /* never flushed */
    memset(base + C, 0xCC, 64);
    nvh_flush(pool, base + C, 64);            /* flushed, no fence yet */
    memset(base + D, 0xD1, 64);
    nvh_flush(pool, base + D, 64);            /* flushed as D1 ...           */
    memset(base + D, 0xD2, 64);               /* ... then overwritten, unflushed */

    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    for (int round = 0; round < 2; round++) {
        unsigned a_new = 0, b_new = 0, c_new = 0, d_old = 0, d1 = 0, d2 = 0;
        for (uint64_t seed = 1; seed <= SEEDS; seed++) {
            assert_int_equal(nvh_sim_write_image(pool, image, seed, NVH_CRASH_LINES), NVH_OK);
            enum line_state s;
            s = classify(image, A, 0, 0xAA);
            assert_int_not_equal(s, LINE_OTHER);
            a_new += s == LINE_NEW;
            s = classify(image, B, 0, 0xBB);
            assert_int_not_equal(s, LINE_OTHER);    /* line mode never tears */
            b_new += s == LINE_NEW;
            s = classify(image, C, 0, 0xCC);
            assert_int_not_equal(s, LINE_OTHER);
            c_new += s == LINE_NEW;
            if (classify(image, D, 0, 0xD1) == LINE_NEW) d1++;
            else if (classify(image, D, 0, 0xD2) == LINE_NEW) d2++;
            else {
                assert_int_equal(classify(image, D, 0, 0xD2), LINE_OLD);
                d_old++;
            }
        }
        assert_int_equal(a_new, SEEDS);                        /* persisted: always */
        assert_in_range(b_new, SEEDS * 3 / 10, SEEDS * 7 / 10); /* unflushed: ~half */
        if (round == 0) {
            /* flushed, unfenced: the write-back may or may not have happened */
            assert_in_range(c_new, SEEDS / 2, SEEDS - 1);
            assert_true(d_old > 0 && d1 > 0 && d2 > 0);
            nvh_drain(pool);                 /* the fence: C and D1 are durable now */
        } else {
            assert_int_equal(c_new, SEEDS);
            assert_int_equal(d_old, 0);      /* never older than what was flushed */
            assert_true(d1 > 0 && d2 > 0);   /* D2 may still have been evicted */
        }
    }
    unlink(image);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Word mode: every 8-byte word of an in-flight line chosen independently. */
static void word_mode_tears_lines(void **state)
{
    (void)state;
    const char *path;
    uint64_t heap;
    nvh_pool *pool = sim_pool(&path, &heap);
    uint64_t *line = (uint64_t *)((char *)nvh_pool_base(pool) + heap);
    for (int w = 0; w < 8; w++) line[w] = 0x1111111111111111ull * (uint64_t)(w + 1);

    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    unsigned torn = 0, word_new[8] = {0};
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        assert_int_equal(nvh_sim_write_image(pool, image, seed, NVH_CRASH_WORDS), NVH_OK);
        uint64_t got[8];
        test_peek(image, (off_t)heap, got, sizeof got);
        unsigned n = 0;
        for (int w = 0; w < 8; w++) {
            assert_true(got[w] == 0 || got[w] == line[w]);   /* words never tear */
            if (got[w]) { n++; word_new[w]++; }
        }
        torn += n != 0 && n != 8;
    }
    assert_true(torn > SEEDS / 2);                 /* all-or-nothing is rare: 2/256 */
    for (int w = 0; w < 8; w++) assert_in_range(word_new[w], SEEDS * 3 / 10, SEEDS * 7 / 10);
    unlink(image);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Fence hook and count
 * ------------------------------------------------------------------------- */
struct hook_log {
    uint64_t calls, first, last;
    uint64_t present;         /* images (of 64) in which the persisted line was new */
    uint64_t off;
    char image[600];
};

static void hook(nvh_pool *pool, uint64_t fence, void *arg)
{
    struct hook_log *log = arg;
    if (log->calls == 0) log->first = fence;
    log->last = fence;
    log->calls++;
    if (log->calls == 1) {
        /* the hook runs before the fence takes effect: the line is in flight */
        for (uint64_t seed = 1; seed <= 64; seed++) {
            if (nvh_sim_write_image(pool, log->image, seed, NVH_CRASH_LINES) != NVH_OK) return;
            if (classify(log->image, log->off, 0, 0x5A) == LINE_NEW) log->present++;
        }
    }
}

static void fence_hook_and_count(void **state)
{
    (void)state;
    const char *path;
    uint64_t heap;
    nvh_pool *pool = sim_pool(&path, &heap);
    struct hook_log log = {.off = heap};
    snprintf(log.image, sizeof log.image, "%s.img", path);
    uint64_t before = nvh_sim_fence_count(pool);
    nvh_sim_set_fence_hook(pool, hook, &log);
    char *p = (char *)nvh_pool_base(pool) + heap;
    memset(p, 0x5A, 64);
    for (int i = 0; i < 5; i++) nvh_persist(pool, p, 64);
    nvh_sim_set_fence_hook(pool, NULL, NULL);
    nvh_persist(pool, p, 64);                           /* hook removed: not called */
    assert_int_equal(log.calls, 5);
    assert_int_equal(log.first, before);
    assert_int_equal(log.last, before + 4);
    assert_int_equal(nvh_sim_fence_count(pool), before + 6);
    assert_in_range(log.present, 1, 63);                /* in flight: 3/4 expected */
    unlink(log.image);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void not_a_sim_pool(void **state)
{
    (void)state;
    const char *path = test_path("media-proc");
    nvh_pool *pool = nvh_pool_create(path, NULL, POOL_SIZE, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    assert_int_equal(nvh_sim_write_image(pool, image, 1, NVH_CRASH_LINES), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "sim domain"));
    assert_int_equal(access(image, F_OK), -1);
    assert_int_equal(nvh_sim_fence_count(pool), 0);
    nvh_sim_set_fence_hook(pool, hook, NULL);            /* a no-op, not a crash */
    assert_int_equal(nvh_sim_write_image(NULL, image, 1, NVH_CRASH_LINES), NVH_E_INVAL);
    assert_int_equal(nvh_sim_write_image(pool, NULL, 1, NVH_CRASH_LINES), NVH_E_INVAL);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Grow: the media grows with the pool; images are the new size and open
 * ------------------------------------------------------------------------- */
static void grow_images(void **state)
{
    (void)state;
    const char *path;
    uint64_t heap;
    nvh_pool *pool = sim_pool(&path, &heap);
    assert_int_equal(nvh_pool_grow(pool, 4 << 20), NVH_OK);
    char *base = nvh_pool_base(pool);
    uint64_t tail = 3 << 20;
    memset(base + tail, 0x77, 64);
    nvh_persist(pool, base + tail, 64);
    memset(base + tail + 64, 0x78, 64);                  /* unflushed */

    char image[600];
    snprintf(image, sizeof image, "%s.img", path);
    unsigned unflushed_new = 0;
    for (uint64_t seed = 1; seed <= 32; seed++) {
        assert_int_equal(nvh_sim_write_image(pool, image, seed, NVH_CRASH_LINES), NVH_OK);
        struct stat st;
        assert_int_equal(stat(image, &st), 0);
        assert_int_equal(st.st_size, 4 << 20);
        assert_int_equal(classify(image, tail, 0, 0x77), LINE_NEW);
        unflushed_new += classify(image, tail + 64, 0, 0x78) == LINE_NEW;
    }
    assert_in_range(unflushed_new, 1, 31);
    /* the grow's superblock update was persisted: the image is a 4 MiB pool */
    nvh_pool *img = nvh_pool_open(image, "media", NVH_DOMAIN_PROCESS);
    assert_non_null(img);
    assert_int_equal(nvh_pool_size(img), 4 << 20);
    assert_int_equal(((unsigned char *)nvh_pool_base(img))[tail], 0x77);
    assert_int_equal(nvh_pool_close(img), NVH_OK);
    unlink(image);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_seed_same_image),
        cmocka_unit_test(persisted_flushed_unflushed),
        cmocka_unit_test(word_mode_tears_lines),
        cmocka_unit_test(fence_hook_and_count),
        cmocka_unit_test(not_a_sim_pool),
        cmocka_unit_test(grow_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
