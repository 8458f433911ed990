/* test_alloc_integrity.c — allocator metadata whose loss would hand out live
 * space, or make objects vanish or appear, is checked: each test builds a
 * pool with content, damages one exact word or byte of the heap header, the
 * high-water mark or the object table, and checks that open / lookup fail
 * with NVH_E_CORRUPT and a message naming the structure and offset, that
 * nothing is formatted over live data, that no pointer outside the pool is
 * returned, and that the intact parts stay usable. Also: nvh_free refuses a
 * named object. */
#include "test_util.h"

#include <stdbool.h>

#include "alloc/alloc.h"      /* white-box: on-media layout of the heap */

#define LAYOUT "integrity"
#define NOBJ 40

static uint64_t objs[NOBJ];
static uint64_t heap_off;

static const char *names[] = {"alpha", "beta", "gamma", "delta"};
#define NNAMES 4

/* A pool with NOBJ linked objects (root[i]) and four named objects, each
 * filled with its tag, closed. */
static const char *make_pool(const char *tag)
{
    const char *path = test_path(tag);
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 4 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NOBJ; i++) {
        size_t size = i % 8 == 7 ? 9000 : 64 + (size_t)i * 8;
        unsigned char *p = nvh_reserve(pool, size);
        assert_non_null(p);
        memset(p, i + 1, size);
        nvh_persist(pool, p, size);
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
        objs[i] = nvh_off(pool, p);
    }
    for (int i = 0; i < NNAMES; i++) {
        char *p = nvh_reserve_named(pool, names[i], 100);
        assert_non_null(p);
        memset(p, 0xA0 + i, 100);
        nvh_persist(pool, p, 100);
        assert_int_equal(nvh_activate_named(pool, names[i]), NVH_OK);
    }
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    heap_off = info.heap_offset;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void expect_open_corrupt(const char *path, const char *what)
{
    uint64_t before = test_file_hash(path);
    test_expect_open_corrupt(path, LAYOUT, what);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    if (pool) nvh_pool_close(pool);
    assert_null(pool);
    assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
    assert_true(test_file_hash(path) == before);    /* nothing formatted, nothing written */
}

static bool obj_intact(nvh_pool *pool, int i)
{
    const unsigned char *p = nvh_ptr(pool, objs[i]);
    size_t size = i % 8 == 7 ? 9000 : 64 + (size_t)i * 8;
    for (size_t k = 0; k < size; k++)
        if (p[k] != (unsigned char)(i + 1)) return false;
    return true;
}

/* ---------------------------------------------------------------------------
 * Heap header and high-water mark
 * ------------------------------------------------------------------------- */

/* A zeroed heap magic on a pool whose superblock says the heap was formatted
 * is damage: open fails, and the heap is not formatted again over the
 * objects; putting the word back makes everything reachable again. */
static void zero_heap_magic(void **state)
{
    (void)state;
    const char *path = make_pool("magic");
    uint64_t magic, zero = 0;
    test_peek(path, (off_t)heap_off, &magic, 8);
    test_poke(path, (off_t)heap_off, &zero, 8);
    expect_open_corrupt(path, "heap header");
    test_poke(path, (off_t)heap_off, &magic, 8);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < NOBJ; i++) assert_true(obj_intact(pool, i));
    for (int i = 0; i < NNAMES; i++) assert_non_null(nvh_get_named(pool, names[i], NULL));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A pool that never allocated has no heap: opening it and allocating
 * formats the heap (the flag is not set), and from then on the flag is. */
static void fresh_pool_formats_lazily(void **state)
{
    (void)state;
    const char *path = test_path("lazy");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_non_null(nvh_alloc(pool, 100, NULL, NULL, NULL));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    uint64_t zero = 0;
    test_poke(path, (off_t)info.heap_offset, &zero, 8);
    heap_off = info.heap_offset;
    expect_open_corrupt(path, "heap header");
    unlink(path);
}

/* A zeroed high-water mark would let every new chunk be carved over live
 * objects: open fails instead. */
static void zero_hwm(void **state)
{
    (void)state;
    const char *path = make_pool("hwm");
    uint64_t w, zero = 0;
    test_peek(path, (off_t)(heap_off + 64), &w, 8);
    test_poke(path, (off_t)(heap_off + 64), &zero, 8);
    expect_open_corrupt(path, "high-water mark");
    /* one flipped bit of the count: caught by the word's check */
    uint64_t flipped = w ^ 1;
    test_poke(path, (off_t)(heap_off + 64), &flipped, 8);
    expect_open_corrupt(path, "high-water mark");
    /* a well-formed mark larger than the pool */
    uint64_t big = nvh_hwm_word(1u << 20);
    test_poke(path, (off_t)(heap_off + 64), &big, 8);
    expect_open_corrupt(path, "high-water mark");
    test_poke(path, (off_t)(heap_off + 64), &w, 8);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < NOBJ; i++) assert_true(obj_intact(pool, i));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A zeroed redo-ring watermark would make recovery replay every stale
 * record of the ring over newer region headers: open fails instead. */
static void zero_ring_watermark(void **state)
{
    (void)state;
    const char *path = make_pool("watermark");
    struct nvh_heap_hdr hh;
    test_peek(path, (off_t)heap_off, &hh, sizeof hh);
    uint64_t at = hh.rings_off, w, zero = 0;        /* ring 0's watermark */
    test_peek(path, (off_t)at, &w, 8);
    test_poke(path, (off_t)at, &zero, 8);
    expect_open_corrupt(path, "watermark");
    test_poke(path, (off_t)at, &w, 8);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < NOBJ; i++) assert_true(obj_intact(pool, i));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A zeroed header at the start of a live huge object's chunk must not read
 * as "never formatted": the allocator would hand out the object's memory.
 * The damaged object is reported and quarantined; every allocation after it
 * lies elsewhere, and the other objects are intact. */
static void zeroed_chunk_header(void **state)
{
    (void)state;
    const char *path = test_path("chunkhdr");
    nvh_pool_options o = {.max_size = 64 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 4 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    size_t hsize = 600000;                      /* 3 chunks of 256 KiB */
    unsigned char *big = nvh_alloc(pool, hsize, NULL, NULL, &root[0]);
    assert_non_null(big);
    memset(big, 0x5C, hsize);
    nvh_persist(pool, big, hsize);
    unsigned char *small = nvh_alloc(pool, 200, NULL, NULL, &root[1]);
    assert_non_null(small);
    memset(small, 0x3A, 200);
    nvh_persist(pool, small, 200);
    uint64_t big_off = nvh_off(pool, big);
    uint64_t big_hdr = nvh_rhdr_off(pool->heap, (big_off - pool->heap->chunks_off) / 4096);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unsigned char zero[64] = {0};
    test_poke(path, (off_t)big_hdr, zero, 64);               /* its region header */

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t corrupt = 0;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_E_CORRUPT);
    assert_true(corrupt >= 1);
    /* allocate well past the heap's current extent: every chunk is scanned */
    for (int i = 0; i < 300; i++) {
        size_t sz = i % 3 ? 4000 : 300000;
        unsigned char *p = nvh_alloc(pool, sz, NULL, NULL, NULL);
        assert_non_null(p);
        uint64_t off = nvh_off(pool, p);
        assert_true(off + sz <= big_off || off >= big_off + hsize);
        memset(p, 0xEE, sz);
    }
    big = nvh_ptr(pool, big_off);
    for (size_t k = 0; k < hsize; k++) assert_int_equal(big[k], 0x5C);
    small = nvh_ptr(pool, root[1]);
    for (int k = 0; k < 200; k++) assert_int_equal(small[k], 0x3A);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Crash at every fence of the first allocations of a pool without a heap
 * (format, then activations): once an object is live (its link, root[0],
 * is durable) the superblock must already say the heap exists, so a zeroed
 * heap magic in that image is NVH_E_CORRUPT, never a fresh format. Before,
 * the image opens (the format may be redone). */
static int first_alloc_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < 4; i++) {
        unsigned char *p = nvh_alloc(pool, 100 + 1000 * (size_t)i, NULL, NULL, &root[i]);
        if (!p) return 1;
    }
    return 0;
}

static int first_alloc_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)pt; (void)arg;
    nvh_off_t live;
    test_peek(image, 4096, &live, sizeof live);              /* root[0] */
    uint64_t zero = 0, magic;
    test_peek(image, (off_t)heap_off, &magic, 8);
    test_poke(image, (off_t)heap_off, &zero, 8);
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    int code = nvh_errcode();
    if (pool) nvh_pool_close(pool);
    if (live && (pool || code != NVH_E_CORRUPT)) return 1;   /* would format over it */
    test_poke(image, (off_t)heap_off, &magic, 8);
    pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return 2;
    nvh_pool_close(pool);
    return 0;
}

static void heap_flag_crash_consistent(void **state)
{
    (void)state;
    const char *path = test_path("flagcrash");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    heap_off = info.heap_offset;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (int mode = 0; mode < 2; mode++) {
        nvh_crash_config cfg = {
            .pool_path = path, .layout = LAYOUT, .workload = first_alloc_workload,
            .check = first_alloc_check, .seed = 11 + (uint64_t)mode,
            .mode = mode ? NVH_CRASH_WORDS : NVH_CRASH_LINES, .images_per_point = 3,
        };
        test_crash_explore(&cfg);
    }
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Object table
 * ------------------------------------------------------------------------- */
static uint64_t table_entry_of(const char *path, const char *name)
{
    for (uint32_t i = 0; i < NVH_NAMED_CAP; i++) {
        struct nvh_named_entry e;
        uint64_t at = heap_off + 4096 + (uint64_t)i * 64;
        test_peek(path, (off_t)at, &e, sizeof e);
        if (strncmp(e.name, name, sizeof e.name) == 0) return at;
    }
    fail_msg("no table entry for '%s'", name);
    return 0;
}

/* The damaged entry's name reports NVH_E_CORRUPT naming the entry; every
 * other name is still found, with its content; the walk visits the intact
 * ones and reports the damage. */
static void expect_named_damage(const char *path, int victim, bool victim_name_readable)
{
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    char *base = nvh_pool_base(pool);
    uint64_t size = nvh_pool_size(pool);
    if (victim_name_readable) {
        size_t sz = 0;
        assert_null(nvh_get_named(pool, names[victim], &sz));
        assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
        assert_non_null(strstr(nvh_errormsg(), "object table entry"));
        assert_non_null(strstr(nvh_errormsg(), "offset"));
        /* not re-created over the damaged entry either */
        assert_null(nvh_reserve_named(pool, names[victim], 10));
        assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
        assert_int_equal(nvh_free_named(pool, names[victim]), NVH_E_CORRUPT);
    }
    for (int i = 0; i < NNAMES; i++) {
        if (i == victim) continue;
        unsigned char *p = nvh_get_named(pool, names[i], NULL);
        assert_non_null(p);
        assert_true((char *)p >= base && (char *)p < base + size);
        for (int k = 0; k < 100; k++) assert_int_equal(p[k], 0xA0 + i);
    }
    for (int i = 0; i < NOBJ; i++) assert_true(obj_intact(pool, i));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static int count_names(const char *name, void *ptr, size_t size, void *arg)
{
    (void)name; (void)ptr; (void)size;
    ++*(int *)arg;
    return 0;
}

static void named_offset_flip(void **state)
{
    (void)state;
    const char *path = make_pool("named_off");
    uint64_t at = table_entry_of(path, names[1]);
    unsigned char b;
    test_peek(path, (off_t)(at + 57), &b, 1);       /* second byte of the offset */
    b ^= 0x10;
    test_poke(path, (off_t)(at + 57), &b, 1);
    expect_named_damage(path, 1, true);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    int n = 0;
    assert_int_equal(nvh_named_foreach(pool, count_names, &n), NVH_E_CORRUPT);
    assert_int_equal(n, NNAMES - 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void named_offset_zeroed(void **state)
{
    (void)state;
    const char *path = make_pool("named_zero");
    uint64_t at = table_entry_of(path, names[2]), zero = 0;
    test_poke(path, (off_t)(at + 56), &zero, 8);
    expect_named_damage(path, 2, true);
    unlink(path);
}

/* A flipped name byte must not make a phantom name appear, nor lose the
 * names that share its probe chain. */
static void named_name_flip(void **state)
{
    (void)state;
    const char *path = make_pool("named_name");
    uint64_t at = table_entry_of(path, names[0]);
    char c = 'A';                       /* "alpha" -> "Alpha" */
    test_poke(path, (off_t)at, &c, 1);
    expect_named_damage(path, 0, true);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_null(nvh_get_named(pool, "Alpha", NULL));
    assert_int_not_equal(nvh_errcode(), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* An entry whose check is right but whose offset lies outside the pool
 * (written by a bug, or forged) is never followed. */
static void named_offset_outside_pool(void **state)
{
    (void)state;
    const char *path = make_pool("named_out");
    uint64_t at = table_entry_of(path, names[3]);
    struct nvh_named_entry e;
    test_peek(path, (off_t)at, &e, sizeof e);
    uint32_t slot = (uint32_t)((at - heap_off - 4096) / 64);
    uint64_t w = nvh_named_word(e.name, slot, (uint64_t)1 << 40);
    test_poke(path, (off_t)(at + 56), &w, 8);
    expect_named_damage(path, 3, true);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * nvh_free of a named object
 * ------------------------------------------------------------------------- */
static void free_of_named_refused(void **state)
{
    (void)state;
    const char *path = make_pool("free_named");
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    unsigned char *p = nvh_get_named(pool, "beta", NULL);
    assert_non_null(p);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "nvh_free_named"));
    /* the name still leads to the intact object, which no allocation reuses */
    for (int i = 0; i < 200; i++) assert_non_null(nvh_alloc(pool, 100, NULL, NULL, NULL));
    assert_ptr_equal(nvh_get_named(pool, "beta", NULL), p);
    for (int k = 0; k < 100; k++) assert_int_equal(p[k], 0xA1);
    assert_int_equal(nvh_free_named(pool, "beta"), NVH_OK);
    /* freed through its name, the offset is an ordinary object again */
    unsigned char *q = nvh_reserve_named(pool, "beta2", 100);
    assert_non_null(q);
    assert_int_equal(nvh_activate_named(pool, "beta2"), NVH_OK);
    assert_int_equal(nvh_free_named(pool, "beta2"), NVH_OK);
    nvh_off_t *root = nvh_root(pool, NULL);
    nvh_link l = {&root[0], 0};
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, objs[0]), &l, 1), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* after a reopen (the set is rebuilt from the table) */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    p = nvh_get_named(pool, "gamma", NULL);
    assert_non_null(p);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_INVAL);
    assert_int_equal(nvh_free_named(pool, "gamma"), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zero_heap_magic),
        cmocka_unit_test(fresh_pool_formats_lazily),
        cmocka_unit_test(zero_hwm),
        cmocka_unit_test(zero_ring_watermark),
        cmocka_unit_test(zeroed_chunk_header),
        cmocka_unit_test(heap_flag_crash_consistent),
        cmocka_unit_test(named_offset_flip),
        cmocka_unit_test(named_offset_zeroed),
        cmocka_unit_test(named_name_flip),
        cmocka_unit_test(named_offset_outside_pool),
        cmocka_unit_test(free_of_named_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
