/* test_alloc_space.c — the allocator's use of space (docs/ALLOC.md §5):
 *   - a reservation that spans several free regions merged only in DRAM is
 *     filled before activation and the process crashes, at every fence: the
 *     covered headers must not be lost (span_every_fence, lines and words);
 *   - freed huge regions are reused before the pool reports NOSPACE, in the
 *     same session and after a reopen (huge_reuse);
 *   - fragmentation of a pool whose free space is contiguous reads 0
 *     (fragmentation_empty);
 *   - 1,000 short processes (half of them SIGKILLed) allocating and freeing
 *     in one pool keep the file within live data + a constant
 *     (processes_reuse);
 *   - a chunk found full and skipped by later sessions is found again once
 *     something in it is freed (full_chunk_freed), also after a crash at
 *     any fence (full_map_every_fence);
 *   - the first allocations after opening a crashed pool of full chunks
 *     use the room left in its last chunk (first_alloc_after_crash);
 *   - one arena's free space is used by another before the pool grows
 *     (cross_arena_reuse). */
#include "test_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define LAYOUT "allocspace"
#define KIB ((uint64_t)1 << 10)
#define MIB ((uint64_t)1 << 20)

/* ---------------------------------------------------------------------------
 * A reservation spanning merged free regions, crash at every fence
 * ------------------------------------------------------------------------- */
#define SPAN_SLOTS 8
static const uint32_t span_size[SPAN_SLOTS] = {
    2 * 4096 - 64,      /* A: 2 blocks                                          */
    3 * 4096 - 64,      /* B: 3 blocks, right after A                          */
    4000,               /* C: keeps the rest of the chunk apart                */
    5 * 4096 - 64,      /* D: exactly A + B once both are free                 */
    200 * 1024,         /* H1: one huge chunk (256 KiB chunks)                 */
    200 * 1024,         /* H2: the next one                                    */
    400 * 1024,         /* H3: two chunks: exactly H1 + H2                     */
    3000,               /* E: an allocation after all of it                    */
};

static int span_fill(nvh_pool *pool, void *ptr, size_t size, void *arg)
{
    (void)pool;
    memset(ptr, (int)(uintptr_t)arg, size);
    return 0;
}

static int span_alloc(nvh_pool *pool, nvh_off_t *root, int i)
{
    return nvh_alloc(pool, span_size[i], span_fill, (void *)(uintptr_t)(0xA0 + i), &root[i])
               ? 0 : 1;
}

static int span_free(nvh_pool *pool, nvh_off_t *root, int i)
{
    nvh_link l = {&root[i], 0};
    return nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1) == NVH_OK ? 0 : 1;
}

static int span_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_heap_config cfg;
    if (nvh_heap_config_get(pool, &cfg) != NVH_OK) return 1;
    cfg.fifo_max_bytes = 0;     /* freed space goes back to the extents at once */
    if (nvh_heap_config_set(pool, &cfg) != NVH_OK) return 1;
    nvh_off_t *root = nvh_root(pool, NULL);
    int rc = 0;
    for (int i = 0; i < 3; i++) rc |= span_alloc(pool, root, i);
    rc |= span_free(pool, root, 0);
    rc |= span_free(pool, root, 1);
    rc |= span_alloc(pool, root, 3);     /* spans A's and B's regions */
    rc |= span_alloc(pool, root, 4);
    rc |= span_alloc(pool, root, 5);
    rc |= span_free(pool, root, 4);
    rc |= span_free(pool, root, 5);
    rc |= span_alloc(pool, root, 6);     /* spans H1's and H2's regions */
    rc |= span_alloc(pool, root, 7);
    return rc;
}

static int g_fail_print = 0;
static int span_complain(const nvh_crash_point *pt, const char *what, long x)
{
    if (g_fail_print++ < 5)
        fprintf(stderr, "  checker: fence %llu: %s (%ld)\n", (unsigned long long)pt->fence,
                what, x);
    return 1;
}

static void span_report(uint64_t off, uint64_t len, const char *what, void *arg)
{
    (void)arg;
    if (g_fail_print < 5)
        fprintf(stderr, "  checker: %s at offset %llu (+%llu)\n", what, (unsigned long long)off,
                (unsigned long long)len);
}

static int span_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    uint64_t corrupt = 0;
    if (nvh_heap_check_path(image, span_report, NULL, 0, &corrupt) != NVH_OK || corrupt)
        return span_complain(pt, "read-only check before recovery reports corruption",
                             (long)corrupt);
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return span_complain(pt, "cannot open the image", nvh_errcode());
    int rc = 0;
    if (nvh_heap_check(pool, span_report, NULL, 0, &corrupt) != NVH_OK || corrupt)
        rc = span_complain(pt, "corrupt headers after recovery", (long)corrupt);
    nvh_off_t *root = nvh_root(pool, NULL);
    uint64_t linked = 0;
    for (int i = 0; i < SPAN_SLOTS && !rc; i++) {
        if (!root[i]) continue;
        linked++;
        unsigned char *p = nvh_ptr(pool, root[i]);
        if (nvh_usable_size(pool, p) < span_size[i])
            rc = span_complain(pt, "linked object is not live", i);
        else if (p[0] != 0xA0 + i || p[span_size[i] - 1] != 0xA0 + i)
            rc = span_complain(pt, "object content damaged", i);
    }
    nvh_heap_stats st;
    if (!rc && (nvh_heap_stats_get(pool, &st) != NVH_OK || st.live_objects != linked))
        rc = span_complain(pt, "live objects != linked objects", (long)st.live_objects);
    /* the space is usable: every size again, then a clean check */
    nvh_off_t *spare = &root[SPAN_SLOTS];
    for (int i = 0; i < SPAN_SLOTS && !rc; i++) {
        void *p = nvh_alloc(pool, span_size[i], span_fill, (void *)(uintptr_t)0xEE, &spare[i]);
        if (!p) rc = span_complain(pt, "cannot allocate after recovery", i);
    }
    if (!rc && (nvh_heap_check(pool, NULL, NULL, 0, &corrupt) != NVH_OK || corrupt))
        rc = span_complain(pt, "corrupt headers after new allocations", (long)corrupt);
    nvh_pool_close(pool);
    return rc;
}

static const char *g_scratch;

/* Crash at every fence (a sample under TSan) of `workload` on a fresh pool of
 * `size` bytes with `chunk` as the chunk size, checking each image. */
static void crash_every_fence(const char *name, const char *chunk, uint64_t size,
                              nvh_crash_workload_fn workload, nvh_crash_check_fn check,
                              uint64_t seed, unsigned images, nvh_crash_mode mode)
{
    setenv("NVHEAP_CHUNK_SIZE", chunk, 1);   /* small chunks: small images */
    const char *path = test_path(name);
    nvh_pool_options o = {.root_size = 4096, .max_size = 16 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, size, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    g_fail_print = 0;
#if defined(__SANITIZE_THREAD__)
    uint64_t budget = 20;
#else
    uint64_t budget = 0;        /* every fence */
#endif
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = workload, .check = check,
        .seed = seed, .mode = mode, .budget = budget, .images_per_point = images,
        .scratch_dir = g_scratch,
    };
    test_crash_explore(&cfg);
    unlink(path);
}

static void span_run(nvh_crash_mode mode)
{
    crash_every_fence("span", "262144", 4 << 20, span_workload, span_check, 11, 2, mode);
}

static void span_every_fence_lines(void **state)
{
    (void)state;
    span_run(NVH_CRASH_LINES);
}

static void span_every_fence_words(void **state)
{
    (void)state;
    span_run(NVH_CRASH_WORDS);
}

/* ---------------------------------------------------------------------------
 * The chunk-full map under crashes: a chunk is marked full when the arena
 * moves on to the next one, then frees make room in it; at every fence the
 * recovered pool must hand out every free slot before it grows (a mark that
 * survived a free would hide the slot).
 * ------------------------------------------------------------------------- */
#define FULL_OBJ 1344u          /* class 21: runs of one block, 3 slots     */
#define FULL_CLS 21u
#define FULL_PER_RUN 3u
#define FULL_PER_CHUNK 48       /* 64 KiB chunks: 16 runs                   */
#define FULL_SLOTS 96

static int full_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_off_t *root = nvh_root(pool, NULL);
    /* fill two chunks and start a third */
    for (int i = 0; i < 2 * FULL_PER_CHUNK + 6; i++)
        if (!nvh_alloc(pool, FULL_OBJ, NULL, NULL, &root[i])) return 1;
    /* room in the two full chunks again */
    static const int victims[] = {3, FULL_PER_CHUNK + 8, FULL_PER_CHUNK + 9, 10};
    for (unsigned k = 0; k < sizeof victims / sizeof *victims; k++) {
        nvh_link l = {&root[victims[k]], 0};
        if (nvh_free(pool, nvh_ptr(pool, root[victims[k]]), &l, 1) != NVH_OK) return 1;
        if (k == 1 && nvh_heap_sync(pool) != NVH_OK) return 1;   /* retired */
    }
    for (int i = 2 * FULL_PER_CHUNK + 6; i < 2 * FULL_PER_CHUNK + 10; i++)
        if (!nvh_alloc(pool, FULL_OBJ, NULL, NULL, &root[i])) return 1;
    return 0;
}

static int full_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return span_complain(pt, "cannot open the image", nvh_errcode());
    int rc = 0;
    uint64_t corrupt = 0;
    if (nvh_heap_check(pool, span_report, NULL, 0, &corrupt) != NVH_OK || corrupt)
        rc = span_complain(pt, "corrupt headers after recovery", (long)corrupt);
    nvh_heap_stats st;
    if (!rc && nvh_heap_stats_get(pool, &st) != NVH_OK) rc = 1;
    if (rc || st.chunks == 0) {
        nvh_pool_close(pool);
        return rc;
    }
    /* every free slot of the class and every free block (a new run) */
    uint64_t chunks = st.chunks;
    uint64_t expect = st.cls[FULL_CLS].slots_total - st.cls[FULL_CLS].slots_used +
                      FULL_PER_RUN * (st.free_bytes / 4096);
    uint64_t got = 0;
    for (;;) {
        if (!nvh_alloc(pool, FULL_OBJ, NULL, NULL, NULL)) {
            rc = span_complain(pt, "allocation failed", nvh_errcode());
            break;
        }
        if (nvh_heap_stats_get(pool, &st) != NVH_OK) { rc = 1; break; }
        if (st.chunks != chunks) break;
        if (++got > expect) break;
    }
    if (!rc && got != expect)
        rc = span_complain(pt, "free slots handed out before the pool grew != free slots",
                           (long)got - (long)expect);
    nvh_pool_close(pool);
    return rc;
}

static void full_map_run(nvh_crash_mode mode)
{
    crash_every_fence("fullmap", "65536", 1 << 20, full_workload, full_check, 13, 1, mode);
}

static void full_map_every_fence(void **state)
{
    (void)state;
    full_map_run(NVH_CRASH_LINES);
    full_map_run(NVH_CRASH_WORDS);
}

/* ---------------------------------------------------------------------------
 * Huge regions are reused (same session, and after a reopen)
 * ------------------------------------------------------------------------- */
static void huge_reuse(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "4194304", 1);  /* the sizes of the report */
    const char *path = test_path("hugereuse");
    nvh_pool_options o = {.root_size = 4096, .max_size = 32 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 32 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    assert_non_null(nvh_alloc(pool, 5 * MIB, NULL, NULL, &root[0]));
    int n = 1;
    while (n < 32 && nvh_alloc(pool, 5 * MIB / 2, NULL, NULL, &root[n])) n++;
    assert_true(n > 2);         /* the pool is full now */
    assert_null(nvh_alloc(pool, 5 * MIB / 2, NULL, NULL, NULL));
    for (int round = 0; round < 2; round++) {
        nvh_link l = {&root[0], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[0]), &l, 1), NVH_OK);
        if (round == 1) {       /* the free space of an earlier session */
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
            pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
            assert_non_null(pool);
            root = nvh_root(pool, NULL);
        }
        void *p = nvh_alloc(pool, 5 * MIB, NULL, NULL, &root[0]);
        if (!p) fail_msg("round %d: 5 MiB after freeing 5 MiB: %s", round, nvh_errormsg());
        assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
        p = nvh_alloc(pool, 4 * MIB, NULL, NULL, &root[0]);
        if (!p) fail_msg("round %d: 4 MiB after freeing 5 MiB: %s", round, nvh_errormsg());
        assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
        p = nvh_alloc(pool, 5 * MIB, NULL, NULL, &root[0]);
        assert_non_null(p);
    }
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Fragmentation: contiguous free space is not fragmented
 * ------------------------------------------------------------------------- */
static void fragmentation_empty(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "4194304", 1);
    const char *path = test_path("frag");
    nvh_pool_options o = {.root_size = 4096, .max_size = 64 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    /* two whole chunks, each a huge object, then both free */
    for (int i = 0; i < 2; i++) assert_non_null(nvh_alloc(pool, 3 * MIB, NULL, NULL, &root[i]));
    for (int i = 0; i < 2; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.free_bytes, st.heap_bytes);
    assert_true(st.free_regions >= 2);
    if (st.fragmentation != 0.0) fail_msg("empty pool: fragmentation %.4f", st.fragmentation);
    /* large objects side by side in an arena chunk, all freed */
    for (int i = 0; i < 8; i++) assert_non_null(nvh_alloc(pool, 20000, NULL, NULL, &root[i]));
    for (int i = 0; i < 8; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, 0);
    if (st.fragmentation != 0.0) fail_msg("all freed: fragmentation %.4f", st.fragmentation);
    /* a hole between two live objects is fragmentation */
    for (int i = 0; i < 3; i++) assert_non_null(nvh_alloc(pool, 20000, NULL, NULL, &root[i]));
    nvh_link l = {&root[1], 0};
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[1]), &l, 1), NVH_OK);
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.fragmentation > 0.0 && st.fragmentation < 1.0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * 1,000 short processes
 * ------------------------------------------------------------------------- */
#define PROC_SLOTS 64
#define PROC_COUNT 1000
#define PROC_OPS 4
#define PROC_MAX_SIZE (48 * KIB)

/* One child: open, a few frees and allocations in random link slots, then
 * close — or, for odd i, SIGKILL itself at a random point instead. */
static void proc_child(const char *path, unsigned i)
{
    uint64_t rng = 0x1234 + i;
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) _exit(2);
    nvh_off_t *root = nvh_root(pool, NULL);
    unsigned kill_at = (i & 1) ? (unsigned)(test_rand(&rng) % (PROC_OPS + 1)) : PROC_OPS + 1;
    for (unsigned k = 0; k < PROC_OPS; k++) {
        if (k == kill_at) raise(SIGKILL);
        unsigned s = (unsigned)(test_rand(&rng) % PROC_SLOTS);
        if (root[s]) {
            nvh_link l = {&root[s], 0};
            if (nvh_free(pool, nvh_ptr(pool, root[s]), &l, 1) != NVH_OK) _exit(3);
        }
        size_t size = 64 + (size_t)(test_rand(&rng) % PROC_MAX_SIZE);
        if (!nvh_alloc(pool, size, NULL, NULL, &root[s])) _exit(4);
    }
    if (kill_at == PROC_OPS) raise(SIGKILL);
    if (nvh_pool_close(pool) != NVH_OK) _exit(5);
    _exit(0);
}

static void processes_reuse(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    const char *path = test_path("procs");
    nvh_pool_options o = {.root_size = 4096, .max_size = 1024 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unsigned killed = 0, count = PROC_COUNT;
    const char *e = getenv("NVHEAP_TEST_PROCS");      /* longer local runs */
    if (e && *e) count = (unsigned)strtoul(e, NULL, 0);
    for (unsigned i = 0; i < count; i++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) proc_child(path, i);
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) { killed++; continue; }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("child %u: status %#x", i, st);
    }
    assert_true(killed >= count / 2 - 10);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    nvh_off_t *root = nvh_root(pool, NULL);
    uint64_t linked = 0;
    for (int s = 0; s < PROC_SLOTS; s++) linked += root[s] != 0;
    assert_int_equal(hs.live_objects, linked);     /* nothing leaked */
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    /* The bound: live data + 2 MiB. The constant covers the heap's fixed
     * metadata below chunk 0 (object table and redo rings, 0.25 MiB), the
     * free space between live objects that the next request may not fit
     * into (objects of up to 48 KiB; 0.7-0.9 MiB measured, in 256 KiB
     * chunks), empty runs of classes no longer used, and the last growth
     * step of the file (it grows by half its size, or to the chunk needed).
     * It does not depend on the number of processes: the file stays at the
     * same size from 300 to 3,000 of them (an allocator that takes a fresh
     * chunk whenever the first unscanned one has no room ends at 266 MiB). */
    uint64_t bound = hs.live_bytes + 2 * MIB;
    print_message("  %u processes (%u killed): file %.2f MiB, live %.2f MiB in %llu objects, "
                  "%llu chunks in use, free %.2f MiB in %llu regions (largest %.2f), runs "
                  "%.2f MiB, bound %.2f MiB\n", count, killed, (double)sb.st_size / MIB,
                  (double)hs.live_bytes / MIB, (unsigned long long)hs.live_objects,
                  (unsigned long long)hs.chunks, (double)hs.free_bytes / MIB,
                  (unsigned long long)hs.free_regions, (double)hs.largest_free / MIB,
                  (double)hs.run_bytes / MIB, (double)bound / MIB);
    assert_true((uint64_t)sb.st_size <= bound);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * A chunk skipped as full is found again after a free into it
 * ------------------------------------------------------------------------- */
static void full_chunk_freed(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    const char *path = test_path("fullchunk");
    nvh_pool_options o = {.root_size = 64 * KIB, .max_size = 64 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    /* fill four chunks with 2000 B objects (2 per run) */
    unsigned n = 0;
    nvh_heap_stats st;
    for (;;) {
        assert_non_null(nvh_alloc(pool, 1984, NULL, NULL, &root[n]));
        n++;
        assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
        if (st.chunks == 5) break;
        assert_true(n < 8000);
    }
    /* the newest object sits alone in chunk 4; free it so chunk 4 is not full */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* second open: free one object of chunk 0 */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    nvh_link l = {&root[0], 0};
    uint64_t freed = root[0];
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[0]), &l, 1), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* third open: fill chunk 4, then the next allocation must take the
     * freed slot of chunk 0 before the pool grows */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    bool found = false;
    for (unsigned i = 0; i < 300 && !found; i++) {
        void *p = nvh_alloc(pool, 1984, NULL, NULL, NULL);
        assert_non_null(p);
        found = nvh_off(pool, p) == freed;
        assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
        assert_int_equal(st.chunks, 5);
    }
    assert_true(found);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * The first allocation after opening a crashed pool whose chunks are full
 * but the last takes the room in the last one: it does not grow the pool
 * after scanning a full chunk or two (the full ones are skipped by their
 * mark, set when the arena moved on to the next chunk).
 * ------------------------------------------------------------------------- */
static void first_alloc_after_crash(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "65536", 1);
    const char *path = test_path("firstalloc");
    nvh_pool_options o = {.root_size = 64 * KIB, .max_size = 64 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {             /* fill 6 chunks and a bit, then crash */
        nvh_pool *p = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (!p) _exit(2);
        nvh_off_t *root = nvh_root(p, NULL);
        for (int i = 0; i < 6 * FULL_PER_CHUNK + 3; i++)
            if (!nvh_alloc(p, FULL_OBJ, NULL, NULL, &root[i])) _exit(3);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    uint64_t chunks = hs.chunks;
    assert_int_equal(chunks, 7);        /* zone 0 (alloc.h) holds them: no header chunk */
    for (int i = 0; i < 20; i++) {
        assert_non_null(nvh_alloc(pool, FULL_OBJ, NULL, NULL, NULL));
        assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
        if (hs.chunks != chunks) fail_msg("allocation %d grew the pool to %llu chunks", i,
                                          (unsigned long long)hs.chunks);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Free space of another arena is used before the pool grows: thread 1
 * (arena 0) fills chunks and frees everything; thread 2 (arena 1) then
 * allocates as much again, small and large objects.
 * ------------------------------------------------------------------------- */
#define XA_OBJS 600
typedef struct xa_arg {
    nvh_pool *pool;
    nvh_off_t *slots;
    size_t size;
    int alloc, free_all, rc;
} xa_arg;

static void *xa_thread(void *p)
{
    xa_arg *x = p;
    for (int i = 0; i < XA_OBJS && x->alloc; i++)
        if (!nvh_alloc(x->pool, x->size, NULL, NULL, &x->slots[i])) { x->rc = 1; return NULL; }
    for (int i = 0; i < XA_OBJS && x->free_all; i++) {
        nvh_link l = {&x->slots[i], 0};
        if (nvh_free(x->pool, nvh_ptr(x->pool, x->slots[i]), &l, 1) != NVH_OK) {
            x->rc = 2;
            return NULL;
        }
    }
    return NULL;
}

static void cross_arena_reuse(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    static const size_t sizes[] = {1984, 20000};
    for (unsigned k = 0; k < 2; k++) {
        const char *path = test_path("xarena");
        nvh_pool_options o = {.root_size = 64 * KIB, .max_size = 256 * MIB};
        nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 * MIB, NVH_DOMAIN_PROCESS, &o);
        assert_non_null(pool);
        nvh_off_t *root = nvh_root(pool, NULL);
        xa_arg x = {pool, root, sizes[k], 1, 1, 0};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, xa_thread, &x), 0);   /* arena 0 */
        pthread_join(t, NULL);
        assert_int_equal(x.rc, 0);
        nvh_heap_stats st;
        assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
        uint64_t chunks = st.chunks;
        xa_arg y = {pool, root + XA_OBJS, sizes[k], 1, 0, 0};
        assert_int_equal(pthread_create(&t, NULL, xa_thread, &y), 0);   /* arena 1 */
        pthread_join(t, NULL);
        assert_int_equal(y.rc, 0);
        assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
        if (st.chunks != chunks)
            fail_msg("%zu B: the second arena grew the pool from %llu to %llu chunks",
                     sizes[k], (unsigned long long)chunks, (unsigned long long)st.chunks);
        assert_int_equal(st.live_objects, XA_OBJS);
        uint64_t corrupt = 1;
        assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
        assert_int_equal(corrupt, 0);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

int main(void)
{
    setenv("NVHEAP_ARENAS", "2", 1);
    static char scratch[512];
    const char *dir = getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700);
    snprintf(scratch, sizeof scratch, "%s/allocspace-%d.d", dir, (int)getpid());
    mkdir(scratch, 0700);
    g_scratch = scratch;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(span_every_fence_lines),
        cmocka_unit_test(span_every_fence_words),
        cmocka_unit_test(full_map_every_fence),
        cmocka_unit_test(huge_reuse),
        cmocka_unit_test(fragmentation_empty),
        cmocka_unit_test(processes_reuse),
        cmocka_unit_test(full_chunk_freed),
        cmocka_unit_test(first_alloc_after_crash),
        cmocka_unit_test(cross_arena_reuse),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(scratch);
    return rc;
}
