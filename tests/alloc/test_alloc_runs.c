/* test_alloc_runs.c — format 4's runs of several blocks and size classes up
 * to 4032 B (docs/ALLOC.md §1), and the upgrade of format-3 pools
 * (docs/FORMAT.md "Versioning rules"):
 *
 *   geometry            every class's runs, and the Table 2 model's waste
 *   later_blocks        slots in the later blocks of a run: activate, free,
 *                       usable size, interior and tail pointers refused,
 *                       double free, and frees into a chunk not scanned
 *                       yet (after a reopen: no DRAM state)
 *   wide_class_replay   records of classes above 31 in runs of several
 *                       blocks replayed after a crash
 *   format3_upgrade     a format-3 image (this code with format 3's
 *                       geometry: one-block runs, classes up to 31, larger
 *                       sizes as one-block regions), crashed with records
 *                       in its rings: read-only opens read it as it is, the
 *                       first read-write open raises the version word,
 *                       everything stays readable and new runs use format
 *                       4; and every crash state of the upgrade's fence
 *                       (each subset of its two stores) opens as well.
 *   bins_in_address_order  a class's runs with free slots are taken lowest
 *                       address first
 *   bins_random_frees   the same after random frees over ~100 runs: every
 *                       free slot handed out, runs in address order
 *   big_classes         the classes above 4032 B (format 5) in multi-block
 *                       runs: usable sizes, bad pointers, stats, reopen
 *   format4_upgrade     a format-4 pool is raised to 5 at its first
 *                       read-write open (every crash state of that fence)
 */
#include "alloc/alloc.h"      /* white-box: run geometry, headers */
#include "pool/format.h"
#include "test_util.h"

#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAYOUT "runs"
#define MIB (1024u * 1024u)

static uint8_t tag_of(uint64_t i) { return (uint8_t)(i * 37u + 11u); }

static void fill(nvh_pool *pool, void *p, size_t size, uint8_t tag)
{
    memset(p, tag, size);
    nvh_persist(pool, p, size);
}

static bool intact(nvh_pool *pool, uint64_t off, size_t size, uint8_t tag)
{
    const unsigned char *p = nvh_ptr(pool, off);
    for (size_t k = 0; k < size; k++)
        if (p[k] != tag) return false;
    return true;
}

static nvh_pool *fresh(const char *name)
{
    const char *path = test_path(name);
    nvh_pool_options o = {.root_size = 64 * 1024, .max_size = 256 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    return pool;
}

/* ---------------------------------------------------------------------------
 * Geometry
 * ------------------------------------------------------------------------- */
static void geometry(void **state)
{
    (void)state;
    for (unsigned c = 1; c <= NVH_SMALL_CLASSES; c++) {
        for (unsigned lv = 0; lv < NVH_RUN_LEVELS; lv++) {
            unsigned b = nvh_run_blocks_for(c, lv);
            assert_true(b >= 1 && b <= NVH_RUN_BLOCKS_MAX);
            assert_true(nvh_run_slots(c, b) >= 2 && nvh_run_slots(c, b) <= 64);
        }
        /* the one-block runs of format 3 keep their slots */
        if (c <= NVH_SMALL_CLASSES_F3) assert_int_equal(nvh_run_slots(c, 1), 4032 / (64 * c));
    }
    /* [Moraru11] Table 2's sizes (10 B .. 4 KiB, uniform) waste under 3 %
     * in the largest runs (one-block runs, classes to 1984 B: 24 %) */
    double req = 0, used = 0;
    for (unsigned s = 10; s <= 4096; s++) {
        unsigned c = nvh_cls_of(s);
        req += s;
        if (!c) { used += 4096; continue; }
        unsigned b = nvh_run_blocks_for(c, NVH_RUN_LEVELS);
        used += (double)b * 4096 / nvh_run_slots(c, b);
    }
    double waste = 1 - req / used;
    print_message("  Table 2 sizes: %.2f %% of run space wasted\n", 100 * waste);
    assert_true(waste < 0.03);

    /* classes above 4032 B: the table is what its rule gives, each class
     * has at least 2 slots at every level and 5..15 in 16 blocks, and a
     * size costs the least of its class and whole blocks */
    unsigned nbig = 0;
    for (unsigned k = 64; k <= NVH_CLS_TOP; k++) {
        unsigned best = 0;
        for (unsigned c = k; c <= NVH_CLS_TOP && !best; c++) {
            unsigned n = (16 * 4096 - 64) / (64 * c);
            /* c is a class: the largest 64 B multiple with its n slots */
            if (n >= 2 && (16 * 4096 - 64) / (64 * (c + 1)) < n && 65536.0 / n < 4096.0 * ((64 * k + 4095) / 4096))
                best = c;
        }
        assert_int_equal(nvh_big_cls_[k - 64], best);
        if (best == k) {
            nbig++;
            assert_true(nvh_cls_valid(k));
            assert_int_equal(nvh_run_slots(k, 16), (16 * 4096 - 64) / (64 * k));
            for (unsigned lv = 0; lv < NVH_RUN_LEVELS; lv++) {
                unsigned b = nvh_run_blocks_for(k, lv);
                assert_true(b >= 2 && b <= NVH_RUN_BLOCKS_MAX && nvh_run_slots(k, b) >= 2);
            }
            /* the largest runs cost no more per object than 16 blocks */
            unsigned b = nvh_run_blocks_for(k, NVH_RUN_LEVELS);
            assert_true(b * 4096.0 / nvh_run_slots(k, b) <= 65536.0 / nvh_run_slots(k, 16));
        } else {
            assert_false(nvh_cls_valid(k));
        }
    }
    assert_int_equal(nbig, 10);
    assert_false(nvh_cls_valid(0));
    assert_false(nvh_cls_valid(NVH_CLS_TOP + 1));
    assert_false(nvh_cls_valid(255));
    /* a 4 KiB value with a ~96 B header: 15 in a 16-block run */
    assert_int_equal(nvh_cls_of(4192), 68);
    assert_int_equal(nvh_run_slots(68, 16), 15);
    assert_true(65536.0 / 15 < 4400);
    assert_int_equal(nvh_cls_of(4096), 0);          /* whole blocks cost less */
    assert_int_equal(nvh_cls_of(4033), 0);
    assert_int_equal(nvh_cls_of(8192), 0);
    assert_int_equal(nvh_cls_of(13057), 0);
    assert_int_equal(nvh_cls_of(13056), 204);
    /* the reciprocals: exact at every slot start of every class; exact
     * everywhere below 1024 for classes up to 63 */
    for (unsigned c = 1; c <= NVH_CLS_TOP; c++) {
        if (!nvh_cls_valid(c)) continue;
        for (unsigned y = 0; y < 1024; y++) {
            unsigned slot = 999;
            bool ok = nvh_slot_of(NVH_HDR + 64u * y, c, &slot);
            assert_true(ok == (y % c == 0));
            if (ok) assert_int_equal(slot, y / c);
        }
    }
}

/* ---------------------------------------------------------------------------
 * Slots in the later blocks of a run
 * ------------------------------------------------------------------------- */
#define NOBJ 60
static void later_blocks(void **state)
{
    (void)state;
    nvh_run_early_ = 0;
    nvh_pool *pool = fresh("runs-later");
    char path[4096];
    snprintf(path, sizeof path, "%s", pool->path);
    nvh_off_t *root = nvh_root(pool, NULL);
    /* class 40 (2560 B): a first run of 2 blocks, then 4, 8, 12 */
    for (int i = 0; i < NOBJ; i++) {
        void *p = nvh_reserve(pool, 2500);
        assert_non_null(p);
        fill(pool, p, 2500, tag_of((uint64_t)i));
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    nvh_heap *h = pool->heap;
    int later = -1;
    for (int i = NOBJ - 1; i >= 0 && later < 0; i--) {
        uint64_t b = (root[i] - h->chunks_off) / 4096;
        nvh_run *run = nvh_run_lookup(h, b);
        assert_non_null(run);
        if (run->blocks > 4 && b > run->block + 2) later = i;
    }
    assert_true(later >= 0);
    uint64_t off = root[later];
    char *p = nvh_ptr(pool, off);
    assert_int_equal(nvh_usable_size(pool, p), 2560);
    /* inside the slot, past the run's last slot, the run's first line */
    assert_int_equal(nvh_free(pool, p + 64, NULL, 0), NVH_E_BADPTR);
    nvh_run *run = nvh_run_lookup(h, (off - h->chunks_off) / 4096);
    char *tail = (char *)nvh_ptr(pool, nvh_run_slot_off(h, run, run->nslots));
    assert_int_equal(nvh_free(pool, tail, NULL, 0), NVH_E_BADPTR);
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, nvh_block_off(h, run->block)), NULL, 0),
                     NVH_E_BADPTR);
    nvh_link l = {&root[later], 0};
    assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
    assert_int_equal(root[later], 0);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_DOUBLEFREE);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* after a reopen the chunk has no DRAM state: the free walks the media */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    h = pool->heap;
    for (int i = 0; i < NOBJ; i++)
        if (i != later) assert_true(intact(pool, root[i], 2500, tag_of((uint64_t)i)));
    int victim = -1;
    for (int i = NOBJ - 1; i >= 0 && victim < 0; i--) {
        uint64_t b = (root[i] - h->chunks_off) / 4096;
        if (i != later && !nvh_rhdr_valid(h, b)) victim = i;    /* a later block */
    }
    assert_true(victim >= 0);
    assert_false(h->chunks[nvh_chunk_of_block(h, (root[victim] - h->chunks_off) / 4096)].scanned);
    p = nvh_ptr(pool, root[victim]);
    assert_int_equal(nvh_usable_size(pool, p), 2560);
    assert_int_equal(nvh_free(pool, p + 64, NULL, 0), NVH_E_BADPTR);
    assert_int_equal(nvh_free(pool, nvh_ptr(pool, off), NULL, 0), NVH_E_DOUBLEFREE);
    l = (nvh_link){&root[victim], 0};
    assert_int_equal(nvh_free(pool, p, &l, 1), NVH_OK);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_DOUBLEFREE);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, NOBJ - 2);
    assert_int_equal(st.cls[40].slots_used, NOBJ - 2);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    nvh_run_early_ = NVH_RUN_EARLY;
}

/* ---------------------------------------------------------------------------
 * Records of wide classes replayed
 * ------------------------------------------------------------------------- */
static const size_t wide_sizes[] = {2100, 2500, 3000, 3500, 4000, 1000};
#define NWIDE 120

static void wide_class_replay(void **state)
{
    (void)state;
    nvh_run_early_ = 0;
    nvh_pool *pool = fresh("runs-wide");
    char path[4096];
    snprintf(path, sizeof path, "%s", pool->path);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {     /* allocate, free every third, crash: records unretired */
        nvh_pool *c = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (!c) _exit(2);
        nvh_off_t *root = nvh_root(c, NULL);
        for (int i = 0; i < NWIDE; i++) {
            size_t size = wide_sizes[i % 6];
            void *p = nvh_reserve(c, size);
            if (!p) _exit(3);
            fill(c, p, size, tag_of((uint64_t)i));
            nvh_off_t *l[1] = {&root[i]};
            if (nvh_activate(c, p, l, 1) != NVH_OK) _exit(4);
        }
        for (int i = 0; i < NWIDE; i += 3) {
            nvh_link l = {&root[i], 0};
            if (nvh_free(c, nvh_ptr(c, root[i]), &l, 1) != NVH_OK) _exit(5);
        }
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.records_replayed > 0);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NWIDE; i++) {
        if (i % 3 == 0) {
            assert_int_equal(root[i], 0);
            continue;
        }
        assert_true(intact(pool, root[i], wide_sizes[i % 6], tag_of((uint64_t)i)));
    }
    assert_int_equal(st.live_objects, NWIDE - NWIDE / 3);
    assert_true(st.cls[nvh_cls_of(3500)].runs >= 1);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
    nvh_run_early_ = NVH_RUN_EARLY;
}

/* ---------------------------------------------------------------------------
 * Format 3 upgrade
 * ------------------------------------------------------------------------- */
/* Format 3's geometry: runs of one block for classes 1..31; sizes above
 * 1984 B as one-block large regions (the early path, never left here). */
static void format3_geometry(bool on)
{
    for (unsigned lv = 0; lv < NVH_RUN_LEVELS; lv++)
        for (unsigned c = 1; c <= NVH_SMALL_CLASSES; c++)
            nvh_run_blocks_tab_[lv][c] = on && c <= NVH_SMALL_CLASSES_F3 ? 1 : 0;
    nvh_run_early_ = on ? 255 : NVH_RUN_EARLY;
}

#define NV3 200
static size_t v3_size(int i)
{
    static const size_t s[] = {64, 128, 300, 1000, 1984, 2000, 4000, 4096, 9000, 40000};
    return s[i % 10];
}

/* The version word `version`, with the header checksum of the header with
 * version crc_version (another one: an upgrade torn by a crash). */
static void set_version_crc(const char *path, uint32_t version, uint32_t crc_version)
{
    struct nvh_superblock_header sh;
    test_peek(path, 0, &sh, sizeof sh);
    sh.format_version = crc_version;
    sh.checksum = nvh_sb_header_checksum(&sh);
    sh.format_version = version;
    test_poke(path, 0, &sh, sizeof sh);
}

static void set_version(const char *path, uint32_t version, bool crc_of_new)
{
    struct nvh_superblock_header sh;
    test_peek(path, 0, &sh, sizeof sh);
    sh.format_version = crc_of_new ? NVH_FORMAT_VERSION : NVH_FORMAT_UPGRADE_FROM;
    sh.checksum = nvh_sb_header_checksum(&sh);
    sh.format_version = version;
    test_poke(path, 0, &sh, sizeof sh);
}

static uint32_t version_of(const char *path)
{
    struct nvh_superblock_header sh;
    test_peek(path, 0, &sh, sizeof sh);
    return sh.checksum == nvh_sb_header_checksum(&sh) ? sh.format_version : 0;
}

/* The format-3 image: made, crashed (unretired records in the rings), its
 * version word set to 3. Every region header is format 3's. */
static void make_format3(const char *path)
{
    format3_geometry(true);
    nvh_pool_options o = {.root_size = 64 * 1024, .max_size = 256 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        nvh_pool *c = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (!c) _exit(2);
        nvh_off_t *root = nvh_root(c, NULL);
        for (int i = 0; i < NV3; i++) {
            char nm[16];
            snprintf(nm, sizeof nm, "n%d", i);
            void *p = i % 50 == 7 ? nvh_reserve_named(c, nm, v3_size(i)) : nvh_reserve(c, v3_size(i));
            if (!p) {
                fprintf(stderr, "reserve %d: %s\n", i, nvh_errormsg());
                _exit(3);
            }
            fill(c, p, v3_size(i), tag_of((uint64_t)i));
            nvh_off_t *l[1] = {&root[i]};
            if (i % 50 == 7) {
                if (nvh_activate_named(c, nm) != NVH_OK) _exit(4);
                root[i] = nvh_off(c, p);
                nvh_persist(c, &root[i], 8);
            } else if (nvh_activate(c, p, l, 1) != NVH_OK) {
                _exit(4);
            }
        }
        for (int i = 1; i < NV3; i += 4) {
            if (i % 50 == 7) continue;          /* named */
            nvh_link l = {&root[i], 0};
            if (nvh_free(c, nvh_ptr(c, root[i]), &l, 1) != NVH_OK) _exit(5);
        }
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("format-3 image writer: status %d", status);
    /* white-box: nothing of format 4 in it */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_heap *h = pool->heap;
    assert_non_null(h);
    for (uint64_t c = 0; c < h->hwm; c++) {
        for (uint64_t b = c * h->bpc; b < (c + 1) * h->bpc;) {
            assert_true(nvh_rhdr_valid(h, b));
            const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
            if (r->kind == NVH_RK_RUN && r->state == NVH_RS_USED)
                assert_true(r->blocks == 1 && r->cls <= NVH_SMALL_CLASSES_F3);
            if (r->kind == NVH_RK_HUGE) break;
            b += r->blocks;
        }
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    format3_geometry(false);
    set_version(path, NVH_FORMAT_UPGRADE_FROM, false);
    assert_int_equal(version_of(path), 3);
}

static void check_v3_content(nvh_pool *pool)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NV3; i++) {
        if (i % 4 == 1 && i % 50 != 7) {
            assert_int_equal(root[i], 0);
            continue;
        }
        assert_true(intact(pool, root[i], v3_size(i), tag_of((uint64_t)i)));
    }
    assert_ptr_equal(nvh_get_named(pool, "n7", NULL), nvh_ptr(pool, root[7]));
    assert_ptr_equal(nvh_get_named(pool, "n157", NULL), nvh_ptr(pool, root[157]));
}

/* Open the (crashed) format-3 image read-write: recovery replays format-3
 * records, the version word becomes 4, everything is readable, and the
 * pool takes format-4 runs afterwards. */
static void upgrade_and_use(const char *path)
{
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(version_of(path), NVH_FORMAT_VERSION);
    check_v3_content(pool);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NV3; i += 4) {        /* old objects freed */
        nvh_link l = {&root[i], 0};
        if (i % 50 == 7) continue;
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    nvh_run_early_ = 0;
    for (int i = 0; i < 300; i++) {           /* format-4 runs beside them */
        size_t size = 1000 + (size_t)(i % 4) * 1000;
        void *p = nvh_reserve(pool, size);
        assert_non_null(p);
        fill(pool, p, size, 0x77);
        nvh_off_t *l[1] = {&root[NV3 + i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    nvh_run_early_ = NVH_RUN_EARLY;
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.cls[nvh_cls_of(3000)].runs >= 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    for (int i = 0; i < 300; i++)
        assert_true(intact(pool, root[NV3 + i], 1000 + (size_t)(i % 4) * 1000, 0x77));
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void format3_upgrade(void **state)
{
    (void)state;
    const char *path = test_path("runs-v3");
    make_format3(path);
    /* read-only: read as it is, version untouched */
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(version_of(path), NVH_FORMAT_UPGRADE_FROM);
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_int_equal(version_of(path), NVH_FORMAT_UPGRADE_FROM);

    /* every crash state of the upgrade's one fence: each subset of its two
     * stores (version word, checksum) durable */
    const char *copy = test_path("runs-v3-copy");
    for (unsigned k = 0; k < 4; k++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "cp --sparse=always '%s' '%s'", path, copy);
        assert_int_equal(system(cmd), 0);
        uint32_t v = (k & 1) ? NVH_FORMAT_VERSION : NVH_FORMAT_UPGRADE_FROM;
        set_version(copy, v, (k & 2) != 0);
        print_message("  upgrade crash state: version %u, checksum of version %u\n", v,
                      (k & 2) ? NVH_FORMAT_VERSION : NVH_FORMAT_UPGRADE_FROM);
        if (k == 1 || k == 2) assert_int_equal(version_of(copy), 0);   /* torn */
        upgrade_and_use(copy);
        unlink(copy);
    }
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Placement: runs in address order
 * ------------------------------------------------------------------------- */
static void drain_all(nvh_pool *pool)
{
    nvh_heap *h = pool->heap;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        nvh_arena *a = &h->arenas[i];
        nvh_alock_lock(&a->lock);
        nvh_fifo_drain(h, a, true, true);
        nvh_alock_unlock(&a->lock);
    }
}

/* A class's runs with free slots are taken lowest address first: after
 * frees spread over the class's runs, every bin lists its runs in address
 * order (reservations take the first). */
static void bins_in_address_order(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("runs-order");
    nvh_off_t *root = nvh_root(pool, NULL);
    enum { N = 120 };
    for (int i = 0; i < N; i++) {
        void *p = nvh_reserve(pool, 1000);                  /* class 16 */
        assert_non_null(p);
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    /* every third object, so every run keeps some and gets a free slot */
    for (int i = 0; i < N; i += 3) {
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    drain_all(pool);
    nvh_heap *h = pool->heap;
    unsigned runs = 0;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        const nvh_bin *b = &h->arenas[i].bins[16];
        const nvh_bin_ent *f = b->v, *v = b->v + NVH_BIN_FRONT;
        for (uint32_t k = 0; k < b->nf; k++, runs++) {   /* sorted, below the heap */
            assert_true(f[k].block == f[k].run->block && f[k].run->in_bin);
            if (k) assert_true(f[k - 1].block < f[k].block);
            if (b->n) assert_true(f[k].block < v[0].block);
        }
        for (uint32_t k = 0; k < b->n; k++, runs++) {
            assert_true(v[k].block == v[k].run->block && v[k].run->in_bin);
            if (k) assert_true(v[(k - 1) / 2].block < v[k].block);   /* heap order */
        }
    }
    print_message("  %u runs of class 16 in the bins\n", runs);
    assert_true(runs >= 3);
    /* the arena's next slot (past the thread's cache) is in its lowest run */
    nvh_run *low = NULL;
    nvh_arena *la = NULL;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        const nvh_bin *b = &h->arenas[i].bins[16];
        for (uint32_t k = 0; k < NVH_BIN_FRONT + b->n; k++) {
            if (k >= b->nf && k < NVH_BIN_FRONT) continue;
            nvh_run *r = b->v[k].run;
            if (r->avail && (!low || r->block < low->block)) { low = r; la = &h->arenas[i]; }
        }
    }
    assert_non_null(low);
    uint64_t off = 0;
    nvh_alock_lock(&la->lock);
    int rc = nvh_reserve_small(h, la, 16, &off);
    nvh_alock_unlock(&la->lock);
    assert_int_equal(rc, NVH_OK);
    assert_ptr_equal(nvh_run_lookup(h, (off - h->chunks_off) / NVH_BLOCK), low);
    assert_int_equal(nvh_cancel(pool, nvh_ptr(pool, off)), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

/* Many runs freed at random (a store after deletes): every run gets back
 * into its bin in random address order, and the arena then hands out every
 * free slot run by run from the lowest address up, each run's slots before
 * a higher run's. Fails with a bin that loses its order (a heap that sifts
 * wrongly, a LIFO list). */
static void bins_random_frees(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("runs-random");
    enum { N = 6000 };                                  /* 128 B: ~100 runs */
    nvh_off_t *objs = test_malloc(N * sizeof *objs);
    for (int i = 0; i < N; i++) {
        void *p = nvh_reserve(pool, 128);
        assert_non_null(p);
        assert_int_equal(nvh_activate(pool, p, NULL, 0), NVH_OK);
        objs[i] = nvh_off(pool, p);
    }
    /* a random third, in random order */
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int i = N - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int j = (int)(x % (uint64_t)(i + 1));
        nvh_off_t t = objs[i];
        objs[i] = objs[j];
        objs[j] = t;
    }
    for (int i = 0; i < N / 3; i++)
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, objs[i]), NULL, 0), NVH_OK);
    drain_all(pool);
    nvh_heap *h = pool->heap;
    nvh_run *first = nvh_run_lookup(h, (objs[N - 1] - h->chunks_off) / NVH_BLOCK);
    nvh_arena *a = NULL;
    unsigned free_slots = 0, runs = 0;
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        const nvh_bin *b = &h->arenas[i].bins[first->cls];
        for (uint32_t k = 0; k < NVH_BIN_FRONT + b->n; k++, runs++) {
            if (k >= b->nf && k < NVH_BIN_FRONT) { runs--; continue; }
            free_slots += (unsigned)__builtin_popcountll(b->v[k].run->avail);
            a = &h->arenas[i];
        }
    }
    print_message("  %u runs in the bin, %u free slots\n", runs, free_slots);
    assert_non_null(a);
    assert_true(runs >= 50);
    /* every slot freed (a few sit in the thread's cache instead), and the
     * slots of the last run never handed out */
    assert_true(free_slots + NVH_TC_SLOTS >= N / 3 && free_slots <= N / 3 + 64);
    uint64_t *got = test_malloc(free_slots * sizeof *got);
    uint64_t prev = 0;
    nvh_alock_lock(&a->lock);
    for (unsigned k = 0; k < free_slots; k++) {
        assert_int_equal(nvh_reserve_small(h, a, first->cls, &got[k]), NVH_OK);
        nvh_run *r = nvh_run_lookup(h, (got[k] - h->chunks_off) / NVH_BLOCK);
        assert_true(r->block >= prev);              /* lowest run first */
        prev = r->block;
    }
    /* all of them handed out: the next slot comes from a new run, above */
    uint64_t next = 0;
    assert_int_equal(nvh_reserve_small(h, a, first->cls, &next), NVH_OK);
    assert_true(nvh_run_lookup(h, (next - h->chunks_off) / NVH_BLOCK)->block > prev);
    nvh_alock_unlock(&a->lock);
    for (unsigned k = 0; k < free_slots; k++)
        assert_int_equal(nvh_cancel(pool, nvh_ptr(pool, got[k])), NVH_OK);
    assert_int_equal(nvh_cancel(pool, nvh_ptr(pool, next)), NVH_OK);
    test_free(got);
    test_free(objs);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

/* ---------------------------------------------------------------------------
 * Classes above 4032 B
 * ------------------------------------------------------------------------- */
#define NBIG 200
static size_t big_size(int i)
{
    static const size_t s[] = {4192, 4300, 5000, 6000, 7000, 9000, 10000, 13000};
    return s[i % 8];
}

/* Objects of the classes above 4032 B: slots of multi-block runs (after
 * the arena's first 8 of a class, served as whole blocks), their usable
 * size the class's, a 4192 B object costing 65536 / 15 B of run space;
 * interior pointers refused, double frees reported, stats, check and a
 * reopen (frees into chunks not scanned yet) agree. */
static void big_classes(void **state)
{
    (void)state;
    nvh_pool *pool = fresh("runs-big");
    char path[4096];
    snprintf(path, sizeof path, "%s", pool->path);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < NBIG; i++) {
        void *p = nvh_reserve(pool, big_size(i));
        assert_non_null(p);
        fill(pool, p, big_size(i), tag_of((uint64_t)i));
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    nvh_heap *h = pool->heap;
    unsigned in_runs = 0;
    for (int i = 0; i < NBIG; i++) {
        unsigned cls = nvh_cls_of(big_size(i));
        nvh_run *run = nvh_run_lookup(h, (root[i] - h->chunks_off) / NVH_BLOCK);
        size_t usable = nvh_usable_size(pool, nvh_ptr(pool, root[i]));
        if (run) {
            in_runs++;
            assert_int_equal(run->cls, cls);
            assert_int_equal(usable, nvh_cls_size(cls));
            /* a pointer 64 B into the slot is no object */
            assert_int_equal(nvh_free(pool, (char *)nvh_ptr(pool, root[i]) + 64, NULL, 0),
                             NVH_E_BADPTR);
        } else {
            assert_int_equal(usable, (nvh_cls_size(cls) + 4095) / 4096 * 4096);
        }
    }
    print_message("  %u of %d objects in runs\n", in_runs, NBIG);
    assert_true(in_runs >= NBIG - 8 * 8);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.cls[0].runs >= 8);
    assert_int_equal(st.cls[0].slots_used, in_runs);
    /* 4192 B objects in 16-block runs of 15 */
    assert_int_equal(nvh_run_slots(nvh_cls_of(4192), 16), 15);
    for (int i = 0; i < NBIG; i += 3) {
        nvh_link l = {&root[i], 0};
        uint64_t off = root[i];
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, off), &l, 1), NVH_OK);
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, off), NULL, 0), NVH_E_DOUBLEFREE);
    }
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.cls[0].runs >= 8);
    for (int i = 0; i < NBIG; i++) {
        if (i % 3 == 0) { assert_int_equal(root[i], 0); continue; }
        assert_true(intact(pool, root[i], big_size(i), tag_of((uint64_t)i)));
        assert_int_equal(nvh_usable_size(pool, nvh_ptr(pool, root[i])) >= big_size(i), 1);
    }
    for (int i = 1; i < NBIG; i += 3) {           /* frees before any scan */
        nvh_link l = {&root[i], 0};
        assert_int_equal(nvh_free(pool, nvh_ptr(pool, root[i]), &l, 1), NVH_OK);
    }
    corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* A format-4 pool (this code's objects of classes up to 4032 B and whole
 * blocks, version word 4) opens as it is read-only and is raised to 5 at
 * the first read-write open, then takes runs of the classes above 4032 B;
 * every crash state of the upgrade's fence (each subset of its two
 * stores) opens and upgrades as well. */
static void format4_image(const char *path)
{
    nvh_pool_options o = {.root_size = 64 * 1024, .max_size = 256 * MIB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < 100; i++) {
        size_t size = v3_size(i) == 9000 ? 8192 : v3_size(i);    /* no class above 4032 */
        void *p = nvh_reserve(pool, size);
        assert_non_null(p);
        fill(pool, p, size, tag_of((uint64_t)i));
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    set_version_crc(path, 4, 4);
    assert_int_equal(version_of(path), 4);
}

static void format4_use(const char *path)
{
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(version_of(path), NVH_FORMAT_VERSION);
    nvh_off_t *root = nvh_root(pool, NULL);
    for (int i = 0; i < 100; i++) {
        size_t size = v3_size(i) == 9000 ? 8192 : v3_size(i);
        assert_true(intact(pool, root[i], size, tag_of((uint64_t)i)));
    }
    nvh_run_early_ = 0;
    for (int i = 0; i < 40; i++) {
        void *p = nvh_reserve(pool, 4192);
        assert_non_null(p);
        fill(pool, p, 4192, 0x66);
        nvh_off_t *l[1] = {&root[100 + i]};
        assert_int_equal(nvh_activate(pool, p, l, 1), NVH_OK);
    }
    nvh_run_early_ = NVH_RUN_EARLY;
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_true(st.cls[0].runs >= 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root = nvh_root(pool, NULL);
    for (int i = 0; i < 40; i++) assert_true(intact(pool, root[100 + i], 4192, 0x66));
    uint64_t corrupt = 1;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &corrupt), NVH_OK);
    assert_int_equal(corrupt, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void format4_upgrade(void **state)
{
    (void)state;
    const char *path = test_path("runs-v4");
    format4_image(path);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS | NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(version_of(path), 4);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_int_equal(version_of(path), 4);
    const char *copy = test_path("runs-v4-copy");
    for (unsigned k = 0; k < 4; k++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd, "cp --sparse=always '%s' '%s'", path, copy);
        assert_int_equal(system(cmd), 0);
        uint32_t v = (k & 1) ? NVH_FORMAT_VERSION : 4, c = (k & 2) ? NVH_FORMAT_VERSION : 4;
        set_version_crc(copy, v, c);
        print_message("  upgrade crash state: version %u, checksum of version %u\n", v, c);
        if (k == 1 || k == 2) assert_int_equal(version_of(copy), 0);   /* torn */
        format4_use(copy);
        unlink(copy);
    }
    unlink(path);
}

int main(void)
{
    unsetenv("NVHEAP_CHUNK_SIZE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(geometry),
        cmocka_unit_test(later_blocks),
        cmocka_unit_test(wide_class_replay),
        cmocka_unit_test(format3_upgrade),
        cmocka_unit_test(bins_in_address_order),
        cmocka_unit_test(bins_random_frees),
        cmocka_unit_test(big_classes),
        cmocka_unit_test(format4_upgrade),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
