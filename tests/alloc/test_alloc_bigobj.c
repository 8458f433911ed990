/* test_alloc_bigobj.c — power-of-two large objects pack: region headers
 * live in header chunks (src/alloc/alloc.h, "Header zones"), so a 1 MiB
 * object takes exactly 1 MiB and four of them fill one 4 MiB chunk (two
 * 2 MiB, eight 512 KiB, and mixed sizes that add up to a chunk). Also: a
 * huge object never spans a header chunk (the data chunks left before it
 * become free space that is reused), an object lies in one zone (zone 0
 * is the pool's size at creation, later zones 64 chunks), a
 * damaged header-chunk slot is reported by check and refused by free (never
 * a signal), and a format-2 pool (headers inside the chunks) is refused
 * with NVH_E_VERSION. */
#include "test_util.h"

#include <stdbool.h>

#include "alloc/alloc.h"      /* white-box: header slots, geometry */
#include "pool/format.h"

#define LAYOUT "bigobj"
#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static char g_path[512];   /* the pool fresh() made (test_path unlinks) */

static nvh_pool *fresh(const char *name, uint64_t size, uint64_t max)
{
    const char *path = test_path(name);
    snprintf(g_path, sizeof g_path, "%s", path);
    nvh_pool_options o = {.root_size = 4096, .max_size = max};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, size, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    return pool;
}

static uint64_t chunk_of(nvh_pool *pool, const void *p)
{
    nvh_heap *h = pool->heap;
    return (nvh_off(pool, p) - h->chunks_off) / h->chunk_size;
}

static void fill(void *p, size_t n, unsigned tag)
{
    memset(p, (int)(tag * 37u + 11u), n);
}
static bool filled(const void *p, size_t n, unsigned tag)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(tag * 37u + 11u)) return false;
    return true;
}

/* The heap check of the open pool finds nothing corrupt. */
static void assert_clean(nvh_pool *pool)
{
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
}

/* Check the pool fresh() made (clean), close it, with `offline` check the
 * closed file too, and open it again. */
static nvh_pool *check_reopen(nvh_pool *pool, bool offline)
{
    assert_clean(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    if (offline) {
        uint64_t corrupt = 1;
        assert_int_equal(nvh_heap_check_path(g_path, NULL, NULL, 0, &corrupt), NVH_OK);
        assert_int_equal(corrupt, 0);
    }
    pool = nvh_pool_open(g_path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    return pool;
}

/* sizes[] (each a power of two, summing to one 4 MiB chunk) all land in the
 * same chunk, edge to edge, with usable size exactly their request; the heap
 * uses the header chunk and that one data chunk, nothing more; the objects
 * survive a reopen and check is clean. */
static void pack(const char *name, const size_t *sizes, unsigned n)
{
    nvh_pool *pool = fresh(name, 16 * MIB, 256 * MIB);
    nvh_off_t *root = nvh_root(pool, NULL);
    void *p[16];
    size_t total = 0;
    for (unsigned i = 0; i < n; i++) {
        p[i] = nvh_alloc(pool, sizes[i], NULL, NULL, &root[i]);
        assert_non_null(p[i]);
        assert_int_equal(nvh_usable_size(pool, p[i]), sizes[i]);
        fill(p[i], sizes[i], i);                 /* every byte, the first line too */
        nvh_persist(pool, p[i], sizes[i]);
        total += sizes[i];
    }
    assert_int_equal(total, 4 * MIB);
    uint64_t c = chunk_of(pool, p[0]);
    for (unsigned i = 0; i < n; i++) {
        assert_int_equal(chunk_of(pool, p[i]), c);
        assert_int_equal(chunk_of(pool, (char *)p[i] + sizes[i] - 1), c);
    }
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    assert_int_equal(hs.chunk_size, 4 * MIB);
    assert_int_equal(hs.chunks, 1);              /* one data chunk (zone 0: headers
                                                    in the heap metadata) */
    assert_int_equal(hs.live_bytes, 4 * MIB);
    assert_int_equal(hs.free_bytes, 0);
    const char *path = g_path;
    pool = check_reopen(pool, false);
    root = nvh_root(pool, NULL);
    for (unsigned i = 0; i < n; i++) {
        void *q = nvh_ptr(pool, root[i]);
        assert_true(filled(q, sizes[i], i));
        assert_int_equal(nvh_usable_size(pool, q), sizes[i]);
    }
    assert_clean(pool);
    /* free all, allocate again: the same chunk takes them (no growth) */
    for (unsigned i = 0; i < n; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    nvh_heap_sync(pool);
    for (unsigned i = 0; i < n; i++) {
        p[i] = nvh_alloc(pool, sizes[i], NULL, NULL, &root[i]);
        assert_non_null(p[i]);
        assert_int_equal(chunk_of(pool, p[i]), c);
    }
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    assert_int_equal(hs.chunks, 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void four_1mib(void **state)
{
    (void)state;
    static const size_t s[] = {MIB, MIB, MIB, MIB};
    pack("bigobj-1m", s, 4);
}

static void two_2mib(void **state)
{
    (void)state;
    static const size_t s[] = {2 * MIB, 2 * MIB};
    pack("bigobj-2m", s, 2);
}

static void eight_512k(void **state)
{
    (void)state;
    static const size_t s[] = {512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB,
                               512 * KIB, 512 * KIB, 512 * KIB, 512 * KIB};
    pack("bigobj-512k", s, 8);
}

static void mixed(void **state)
{
    (void)state;
    static const size_t s[] = {MIB, 256 * KIB, 2 * MIB, 256 * KIB, 512 * KIB};
    pack("bigobj-mixed", s, 5);
}

/* 16 x 1 MiB in a pool created at 8 MiB (zone 0 is one chunk): 4 data
 * chunks plus the header chunk after zone 0, not 6 chunks */
static void pool_size_for_n(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("bigobj-n", 8 * MIB, 256 * MIB);
    for (int i = 0; i < 16; i++) assert_non_null(nvh_alloc(pool, MIB, NULL, NULL, NULL));
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    assert_int_equal(hs.chunks, 1 + 4);
    nvh_heap *h = pool->heap;
    assert_int_equal(h->zone0, 1);
    assert_true(nvh_chunk_is_hdr(h, 1));
    assert_true(nvh_pool_size(pool) <= h->chunks_off + 5 * h->chunk_size + 8 * MIB);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(g_path);
}

/* With 64 KiB chunks a zone after zone 0 is 64 data chunks (4 MiB). A
 * small object takes chunk 0; huge objects of 5 chunks follow, each inside
 * one zone; the first that does not fit before a header chunk starts after
 * it, and the chunks it skipped are free space a smaller huge object then
 * takes. No object covers a header chunk, check is clean (also after
 * reopen), and an object over 64 chunks is refused. */
static void huge_skips_header_chunk(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "65536", 1);
    nvh_pool *pool = fresh("bigobj-zone", 1 * MIB, 64 * MIB);
    nvh_off_t *root = nvh_root(pool, NULL);
    nvh_heap *h = pool->heap;
    if (!h) {                                    /* formatted on first use */
        assert_non_null(nvh_alloc(pool, 64, NULL, NULL, NULL));
        h = pool->heap;
    }
    unsetenv("NVHEAP_CHUNK_SIZE");
    assert_int_equal(h->chunk_size, 64 * KIB);
    uint64_t hdr2 = h->zone0 + NVH_ZONE_SPAN;    /* the second header chunk */
    size_t big = 5 * 64 * KIB;
    int n = 0;
    uint64_t end = 0, gap_at = 0, gap = 0;
    for (;;) {
        assert_true(n < 40);
        void *p = nvh_alloc(pool, big, NULL, NULL, &root[n]);
        assert_non_null(p);
        fill(p, big, (unsigned)n);
        nvh_persist(pool, p, big);
        uint64_t c = chunk_of(pool, p);
        assert_true(nvh_chunks_data(h, c, 5));
        n++;
        if (c > hdr2) {                          /* jumped the header chunk */
            assert_int_equal(c, hdr2 + 1);
            gap_at = end;
            gap = hdr2 - end;
            break;
        }
        end = c + 5;
    }
    assert_true(gap >= 1 && gap < 5);
    void *q = nvh_alloc(pool, gap * 64 * KIB, NULL, NULL, &root[n]);
    assert_non_null(q);
    assert_int_equal(chunk_of(pool, q), gap_at); /* the skipped chunks, reused */
    fill(q, gap * 64 * KIB, (unsigned)n);
    nvh_persist(pool, q, gap * 64 * KIB);
    assert_null(nvh_alloc(pool, 65 * 64 * KIB, NULL, NULL, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_non_null(strstr(nvh_errormsg(), "at most 64 chunks"));
    const char *path = g_path;
    pool = check_reopen(pool, true);
    root = nvh_root(pool, NULL);
    for (int i = 0; i <= n; i++)
        assert_true(filled(nvh_ptr(pool, root[i]), i == n ? gap * 64 * KIB : big, (unsigned)i));
    /* free the two around the header chunk; small objects after */
    for (int i = n - 2; i <= n - 1; i++) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    for (int i = 0; i < 200; i++) assert_non_null(nvh_alloc(pool, 3000, NULL, NULL, NULL));
    assert_clean(pool);
    for (int i = 0; i < n - 2; i++) assert_true(filled(nvh_ptr(pool, root[i]), big, (unsigned)i));
    assert_true(filled(nvh_ptr(pool, root[n]), gap * 64 * KIB, (unsigned)n));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Zone 0 covers the pool's size at creation, so a pool created at its
 * working size holds an object larger than a later zone (64 chunks): with
 * 64 KiB chunks, a 16 MiB pool takes a 150-chunk object, keeps it across a
 * reopen, refuses a second one (zone 0 is full; later zones are too small)
 * without growing past its limit, and reuses the space once it is freed. */
static void zone0_holds_big_objects(void **state)
{
    (void)state;
    setenv("NVHEAP_CHUNK_SIZE", "65536", 1);
    nvh_pool *pool = fresh("bigobj-zone0", 16 * MIB, 64 * MIB);
    nvh_off_t *root = nvh_root(pool, NULL);
    size_t big = 150 * 64 * KIB;
    void *p = nvh_alloc(pool, big, NULL, NULL, &root[0]);
    unsetenv("NVHEAP_CHUNK_SIZE");
    assert_non_null(p);
    nvh_heap *h = pool->heap;
    assert_true(h->zone0 > 150);
    assert_true(chunk_of(pool, p) + 150 <= h->zone0);
    fill(p, big, 7);
    nvh_persist(pool, p, big);
    assert_null(nvh_alloc(pool, big, NULL, NULL, &root[1]));
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_non_null(strstr(nvh_errormsg(), "zone 0"));
    const char *path = g_path;
    pool = check_reopen(pool, false);
    root = nvh_root(pool, NULL);
    assert_true(filled(nvh_ptr(pool, root[0]), big, 7));
    nvh_link l = {&root[0], 0};
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[0]), &l, 1), NVH_OK);
    p = nvh_alloc(pool, big, NULL, NULL, &root[1]);
    assert_non_null(p);
    assert_clean(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A large object now starts at its first block, so the heap's very first
 * block (chunks_off) is an object's address: a named one there is found
 * (the object table once refused offsets below chunks_off + 64). */
static void named_at_first_block(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("bigobj-named", 16 * MIB, 64 * MIB);
    void *p = nvh_reserve_named(pool, "first", MIB);
    assert_non_null(p);
    assert_int_equal(nvh_off(pool, p), pool->heap->chunks_off);
    fill(p, MIB, 7);
    nvh_persist(pool, p, MIB);
    assert_int_equal(nvh_activate_named(pool, "first"), NVH_OK);
    assert_ptr_equal(nvh_get_named(pool, "first", NULL), p);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(g_path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    size_t sz = 0;
    void *q = nvh_get_named(pool, "first", &sz);
    assert_non_null(q);
    assert_int_equal(sz, MIB);
    assert_true(filled(q, MIB, 7));
    assert_int_equal(nvh_free_named(pool, "first"), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(g_path);
}

static int g_found;
static uint64_t g_found_off;
static char g_found_what[128];
static void on_check(uint64_t off, uint64_t len, const char *what, void *arg)
{
    (void)len; (void)arg;
    if (g_found++ == 0) {
        g_found_off = off;
        snprintf(g_found_what, sizeof g_found_what, "%s", what);
    }
}

/* A damaged header slot (a flipped byte, or the slot zeroed) of the
 * second of four 1 MiB objects: check reports it, naming the region and
 * the slot, free refuses it with NVH_E_CORRUPT, the other three are intact
 * and free normally; all of zone 0's slots zeroed is reported, not a
 * signal. */
static void corrupt_header_slot(void **state)
{
    (void)state;
    for (int variant = 0; variant < 3; variant++) {
        nvh_pool *pool = fresh("bigobj-corrupt", 16 * MIB, 256 * MIB);
        nvh_off_t *root = nvh_root(pool, NULL);
        for (unsigned i = 0; i < 4; i++) {
            void *p = nvh_alloc(pool, MIB, NULL, NULL, &root[i]);
            assert_non_null(p);
            fill(p, MIB, i);
            nvh_persist(pool, p, MIB);
        }
        nvh_heap *h = pool->heap;
        uint64_t obj = root[1], b = (obj - h->chunks_off) / NVH_BLOCK;
        uint64_t slot = nvh_rhdr_off(h, b);
        uint64_t hchunk = h->zone0_off;           /* zone 0's header slots */
        uint64_t csize = h->zone0 * (h->chunk_size / 64);
        assert_true(slot >= hchunk && slot < hchunk + csize);
        const char *path = g_path;
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        if (variant == 0) {
            unsigned char c;
            test_peek(path, (off_t)slot + 12, &c, 1);      /* blocks */
            c ^= 0x04;
            test_poke(path, (off_t)slot + 12, &c, 1);
        } else if (variant == 1) {
            unsigned char z[64] = {0};
            test_poke(path, (off_t)slot, z, sizeof z);
        } else {
            unsigned char *z = calloc(1, csize);
            assert_non_null(z);
            test_poke(path, (off_t)hchunk, z, csize);
            free(z);
        }
        uint64_t corrupt = 0;
        g_found = 0;
        assert_int_equal(nvh_heap_check_path(path, on_check, NULL, 0, &corrupt), NVH_E_CORRUPT);
        assert_true(corrupt >= 1);
        if (variant < 2) {
            assert_int_equal(g_found_off, obj);
            char want[64];
            snprintf(want, sizeof want, "offset %llu", (unsigned long long)slot);
            assert_non_null(strstr(g_found_what, want));
        }
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        root = nvh_root(pool, NULL);
        nvh_link l = {&root[1], 0};
        int frc = nvh_free(pool, nvh_ptr(pool, root[1]), &l, 1);
        /* a whole zeroed header chunk leaves no chain to tell a region
         * start from an interior block: "not an object", still refused */
        if (frc != NVH_E_CORRUPT && !(variant == 2 && frc == NVH_E_BADPTR)) fail_msg("variant %d: free: %d %s", variant, frc, nvh_errormsg());
        assert_int_equal(root[1], obj);
        for (unsigned i = 0; i < 4; i++) assert_true(filled(nvh_ptr(pool, root[i]), MIB, i));
        if (variant < 2) {
            nvh_link l0 = {&root[0], 0};
            assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[0]), &l0, 1), NVH_OK);
        }
        /* new objects never overlap the damaged one */
        for (int k = 0; k < 8; k++) {
            char *p = nvh_alloc(pool, MIB, NULL, NULL, NULL);
            assert_non_null(p);
            uint64_t o = nvh_off(pool, p);
            assert_true(o + MIB <= obj || o >= obj + MIB);
        }
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* A pool written by format 2 (region headers inside the chunks) cannot be
 * read by this layout: refused with NVH_E_VERSION and how to migrate. */
static void format2_refused(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("bigobj-v2", 8 * MIB, 64 * MIB);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    const char *path = g_path;
    struct nvh_superblock_header sh;
    test_peek(path, 0, &sh, sizeof sh);
    sh.format_version = 2;
    sh.checksum = nvh_sb_header_checksum(&sh);
    test_poke(path, 0, &sh, sizeof sh);
    assert_null(nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS));
    assert_int_equal(nvh_errcode(), NVH_E_VERSION);
    assert_non_null(strstr(nvh_errormsg(), "migrate"));
    uint64_t corrupt = 0;
    assert_int_not_equal(nvh_heap_check_path(path, NULL, NULL, 0, &corrupt), NVH_OK);
    unlink(path);
}

int main(void)
{
    unsetenv("NVHEAP_CHUNK_SIZE");               /* the default 4 MiB chunks */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(four_1mib),
        cmocka_unit_test(two_2mib),
        cmocka_unit_test(eight_512k),
        cmocka_unit_test(mixed),
        cmocka_unit_test(pool_size_for_n),
        cmocka_unit_test(huge_skips_header_chunk),
        cmocka_unit_test(zone0_holds_big_objects),
        cmocka_unit_test(corrupt_header_slot),
        cmocka_unit_test(format2_refused),
        cmocka_unit_test(named_at_first_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
