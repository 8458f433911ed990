/* test_alloc_corrupt.c — corruption detection and containment ([Moraru11]
 * §3.2): flip bytes in region headers (large, run, huge) and in data right
 * next to headers; the allocator reports corrupt headers (error code,
 * callback, counter, nvh_heap_check with offsets), refuses to free through
 * them, never hands the damaged memory out again, and keeps every other
 * object intact; --repair quarantines durably. */
#include "test_util.h"

#include <stdbool.h>

#include "alloc/alloc.h"      /* white-box: to find a free region's header */

#define LAYOUT "corrupt"
#define NOBJ 300

typedef struct obj { uint64_t off, size, hdr, reg, reg_end; uint8_t tag; } obj;   /* hdr: its region
                                                   header, in a header chunk */
static obj objs[NOBJ];

static int cb_calls;
static uint64_t cb_last;
static void on_corrupt(nvh_pool *pool, uint64_t off, const char *what, void *arg)
{
    (void)pool; (void)what; (void)arg;
    cb_calls++;
    cb_last = off;
}

static uint64_t found_off[16];
static int nfound;
static void on_check(uint64_t off, uint64_t len, const char *what, void *arg)
{
    (void)len; (void)what; (void)arg;
    if (nfound < 16) found_off[nfound] = off;
    nfound++;
}

static size_t obj_size(int i)
{
    if (i % 50 == 49) return 300000;            /* huge with 256 KiB chunks */
    if (i % 10 == 9) return 9000;                /* large */
    return 64 + (size_t)(i % 5) * 100;           /* small */
}

static const char *make_pool(void)
{
    const char *path = test_path("corrupt");
    nvh_pool_options o = {.root_size = 8192, .max_size = 256 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NOBJ; i++) {
        size_t size = obj_size(i);
        unsigned char *p = nvh_reserve(pool, size);
        assert_non_null(p);
        memset(p, (uint8_t)(i + 1), size);
        nvh_persist(pool, p, size);
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
        uint64_t off = nvh_off(pool, p), b = (off - pool->heap->chunks_off) / 4096;
        /* a slot's region is its run, which may span several blocks */
        nvh_run *run = nvh_run_lookup(pool->heap, b);
        uint64_t rb = run ? run->block : b, nb = run ? run->blocks : 1;
        uint64_t reg = nvh_block_off(pool->heap, rb);
        objs[i] = (obj){off, size, nvh_rhdr_off(pool->heap, rb), reg, reg + nb * 4096,
                        (uint8_t)(i + 1)};
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static bool intact(nvh_pool *pool, int i)
{
    const unsigned char *p = nvh_ptr(pool, objs[i].off);
    for (uint64_t k = 0; k < objs[i].size; k++)
        if (p[k] != objs[i].tag) return false;
    return true;
}

static void flip(const char *path, uint64_t off)
{
    unsigned char b;
    test_peek(path, (off_t)off, &b, 1);
    b ^= 0x5A;
    test_poke(path, (off_t)off, &b, 1);
}

/* data bytes right before a header (last byte of the previous object) and
 * right after it (first payload byte) do not disturb the allocator */
static void data_next_to_headers(void **state)
{
    (void)state;
    const char *path = make_pool();
    int large = 9;                                   /* a large object */
    flip(path, objs[large].off + objs[large].size - 1);
    flip(path, objs[large].off);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t corrupt = 99;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    for (int i = 0; i < NOBJ; i++)
        if (i != large) assert_true(intact(pool, i));
    nvh_off_t *root = nvh_root(pool, NULL);
    nvh_link l = {&root[large], 0};
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, objs[large].off), &l, 1), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void header_flips_contained(int victim, uint64_t hdr_off, unsigned byte)
{
    const char *path = make_pool();
    flip(path, hdr_off + byte);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    cb_calls = 0;
    nvh_heap_set_corruption_handler(pool, on_corrupt, NULL);
    /* check reports it with its offset */
    nfound = 0;
    uint64_t corrupt = 0;
    assert_int_equal(nvh_heap_check(pool, on_check, NULL, 0, &corrupt), NVH_E_CORRUPT);
    assert_true(corrupt >= 1);
    uint64_t region = objs[victim].reg;                /* reports name the region */
    assert_int_equal(found_off[0], region);
    assert_true(cb_calls >= 1);
    uint64_t before = nvh_heap_corruptions(pool);
    /* freeing through the corrupt header is refused */
    nvh_off_t *root = nvh_root(pool, NULL);
    nvh_link l = {&root[victim], 0};
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, objs[victim].off), &l, 1), NVH_E_CORRUPT);
    assert_true(nvh_heap_corruptions(pool) > before);
    assert_int_equal(root[victim], objs[victim].off);     /* nothing changed */
    /* every other object is intact and can be freed */
    for (int i = 0; i < NOBJ; i++) {
        if (i == victim || objs[i].reg == objs[victim].reg) continue;
        assert_true(intact(pool, i));
    }
    /* new allocations never land in the damaged region */
    uint64_t lo = region, hi = objs[victim].reg_end;
    if (objs[victim].size > 4000) hi = objs[victim].off + objs[victim].size;
    for (int k = 0; k < 400; k++) {
        size_t size = 64 + (size_t)(k % 7) * 700;
        char *p = nvh_reserve(pool, size);
        assert_non_null(p);
        uint64_t o = nvh_off(pool, p);
        assert_true(o + size <= lo || o >= hi);
        memset(p, 0, size);
        assert_int_equal(nvh_activate(pool, p, NULL, 0), NVH_OK);
    }
    for (int i = 0; i < NOBJ; i++) {
        if (i == victim || objs[i].reg == objs[victim].reg) continue;
        assert_true(intact(pool, i));
        nvh_link fl = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, objs[i].off), &fl, 1), NVH_OK);
    }
    /* repair quarantines durably */
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 1, &corrupt), NVH_OK);
    assert_true(corrupt >= 1);
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.quarantined_bytes >= 4096);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_int_equal(nvh_heap_check_path(path, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    /* after reopen the quarantined region is still never handed out */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int k = 0; k < 2000; k++) {
        size_t size = 64 + (size_t)(k % 7) * 700;
        char *p = nvh_reserve(pool, size);
        assert_non_null(p);
        uint64_t o = nvh_off(pool, p);
        assert_true(o + size <= lo || o >= hi);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void large_header(void **state)
{
    (void)state;
    make_pool();   /* the allocator is deterministic: learn the offsets */
    uint64_t hdr = objs[9].hdr;                 /* in the zone's header chunk */
    assert_true(hdr < objs[9].off);
    for (unsigned byte = 8; byte < 64; byte += 13) header_flips_contained(9, hdr, byte);
}

static void run_header(void **state)
{
    (void)state;
    /* slot objects: the run's header is in the zone's header chunk */
    make_pool();   /* to learn the offsets */
    uint64_t hdr = objs[12].hdr;
    header_flips_contained(12, hdr, 12);   /* blocks field */
    header_flips_contained(12, hdr, 18);   /* class */
}

static void huge_header(void **state)
{
    (void)state;
    make_pool();
    header_flips_contained(49, objs[49].hdr, 16);  /* state */
}

/* A free region whose header is damaged after its chunk was scanned (its
 * space already in DRAM's free extents): check reports it and the space is
 * never handed out again. */
static void free_region_header_after_scan(void **state)
{
    (void)state;
    const char *path = make_pool();
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap *h = pool->heap ? pool->heap : NULL;
    assert_non_null(nvh_reserve(pool, 64));        /* opens the heap, scans */
    h = pool->heap;
    for (int k = 0; k < 200000 && h->scan_next < h->hwm; k++)   /* scan every chunk */
        assert_non_null(nvh_reserve(pool, 64));
    uint64_t b = 0, n = 0;
    for (uint64_t c = 0; c < h->hwm && !n; c++) {
        uint64_t x = c * h->bpc, end = x + h->bpc;
        if (!nvh_rhdr_valid(h, x) || nvh_rhdr_at(h, x)->kind == NVH_RK_HUGE) continue;
        while (x < end) {
            const struct nvh_rhdr *r = nvh_rhdr_at(h, x);
            assert_true(nvh_rhdr_valid(h, x));
            if (r->state == NVH_RS_FREE && r->blocks >= 2) { b = x; n = r->blocks; break; }
            x += r->blocks;
        }
    }
    assert_true(n >= 2);
    struct nvh_rhdr *r = nvh_rhdr_at(h, b);
    r->blocks ^= 0x40;                              /* a stray write */
    nfound = 0;
    uint64_t corrupt = 0;
    assert_int_equal(nvh_heap_check(pool, on_check, NULL, 0, &corrupt), NVH_E_CORRUPT);
    assert_int_equal(corrupt, 1);
    assert_int_equal(found_off[0], nvh_block_off(h, b));
    uint64_t lo = nvh_block_off(h, b), hi = lo + n * 4096;
    for (int k = 0; k < 3000; k++) {
        size_t size = k % 2 ? 64 : 4000;
        char *p = nvh_reserve(pool, size);
        assert_non_null(p);
        uint64_t o = nvh_off(pool, p);
        assert_true(o + size <= lo || o >= hi);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A run header damaged after the allocator validated it in this session
 * (activate and free then compare the header with the copy the first check
 * kept, docs/ALLOC.md §4f): the next free and the next activation in that
 * run must still find the damage, byte by byte — in a checksummed field and
 * in the checksum itself — and nothing in the run may change. */
static void run_header_after_validation(void **state)
{
    (void)state;
    static const unsigned bytes[] = {12, 18, 19, 24, 40, 61};
    for (unsigned k = 0; k < sizeof bytes / sizeof bytes[0]; k++) {
        const char *path = test_path("corrupt-validated");
        nvh_pool_options o = {.root_size = 4096, .max_size = 64 << 20};
        nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 << 20, NVH_DOMAIN_PROCESS, &o);
        assert_non_null(pool);
        nvh_heap_set_corruption_handler(pool, on_corrupt, NULL);
        nvh_off_t *root = nvh_root(pool, NULL);
        char *p[4];
        for (int i = 0; i < 4; i++) {   /* one run: its header written, then validated */
            p[i] = nvh_reserve(pool, 128);
            assert_non_null(p[i]);
            nvh_off_t *l = &root[i];
            assert_int_equal(nvh_activate(pool, p[i], &l, 1), NVH_OK);
        }
        nvh_link l0 = {&root[0], 0};
        assert_int_equal(nvh_free(pool, p[0], &l0, 1), NVH_OK);   /* validated again */
        uint64_t hdr = nvh_off(pool, p[1]) & ~(uint64_t)4095;
        assert_int_equal(nvh_off(pool, p[2]) & ~(uint64_t)4095, hdr);
        char *h = (char *)nvh_rhdr_at(pool->heap, (hdr - pool->heap->chunks_off) / 4096);
        h[bytes[k]] ^= 0x10;                                     /* a stray write */
        int calls = cb_calls;
        uint64_t before = nvh_heap_corruptions(pool);
        nvh_link l1 = {&root[1], 0};
        assert_int_equal(nvh_free(pool, p[1], &l1, 1), NVH_E_CORRUPT);
        assert_int_equal(root[1], nvh_off(pool, p[1]));          /* link untouched */
        assert_int_equal(cb_calls, calls + 1);
        assert_int_equal(cb_last, hdr);
        assert_true(nvh_heap_corruptions(pool) > before);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

int main(void)
{
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(data_next_to_headers),
        cmocka_unit_test(large_header),
        cmocka_unit_test(run_header),
        cmocka_unit_test(huge_header),
        cmocka_unit_test(free_region_header_after_scan),
        cmocka_unit_test(run_header_after_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
