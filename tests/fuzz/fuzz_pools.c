/* fuzz_pools.c — corruption fuzzer for pool readers (issue 18 item 3).
 *
 * Builds one pool with real content of every kind (objects with links,
 * named objects, a B+ tree with a few hundred keys and splits, a hash map,
 * committed transactions), then, per iteration, copies it, mutates the copy
 * (byte flips, zeroed 64 B lines, random words, truncation; biased toward
 * metadata: superblock, heap header, object table, rings, region headers,
 * tree nodes and slabs, hash-map root/segments/entries) and runs every reader
 * on it in a forked child under alarm(): `nvheap check`, `nvheap check
 * --repair` (on a second copy), read-only and read-write opens with the
 * allocator's check and full walks (named objects, heap objects, B+ tree
 * get/scan/count/check, hash map get/foreach/count/check).
 *
 * A child killed by a signal, one that times out, or one whose sanitizer
 * reported (exit codes 98/99, set through ASAN_OPTIONS/UBSAN_OPTIONS) is a
 * failure: its seed, iteration, mutations and stage are printed, and
 * `--repro SEED:ITER` replays exactly that case in this process (for gdb or
 * a sanitizer's stack trace).
 *
 *   fuzz_pools [--seed N] [--iters N] [--seconds S] [--dir D] [--cli PATH]
 *              [--classes flip,zero,word,trunc] [--regions LIST] [--repro S:I]
 *              [--keep-going] [--verbose]
 *
 * Deterministic for a given seed and iteration count (--seconds only stops
 * early). The CI test (label `fuzz`) runs a fixed count; scripts/fuzz-pools
 * runs it for minutes. Exit status: 0 no failure, 1 failures, 2 usage or
 * setup error. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nvheap.h"
#include "alloc/alloc.h"     /* white-box: heap header, to aim mutations */
#include "ds/btree.h"        /* white-box: node and slab layout          */
#include "ds/hashmap.h"      /* white-box: root, segments, entries       */
#include "pool/format.h"

#define TREE_NAME "fz"
#define TREE_KEYS 400u
#define MAP_KEYS 250u
#define NOBJ 40u
#define NNAMED 8u
#define ROOT_MAP 63u         /* root[63]: the hash map                    */
#define ROOT_TX 62u          /* root[62]: an object written by transactions */
#define CHILD_TIMEOUT 20u    /* seconds per case (a hang is far slower)    */
#define BATCH 16u            /* cases per forked child                     */

extern char **environ;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==========================================================================
 * Deterministic randomness
 * ========================================================================== */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

/* ==========================================================================
 * Regions of the template worth mutating
 * ========================================================================== */
enum region_kind {
    R_SUPER, R_HEAPHDR, R_TABLE, R_RINGS, R_RHDR, R_BTHDR, R_BTNODE, R_BTSLAB,
    R_HMROOT, R_HMSEG, R_HMENTRY, R_ANY, R_KIND_COUNT
};
static const char *const region_names[R_KIND_COUNT] = {
    "super", "heaphdr", "table", "rings", "rhdr", "bthdr", "btnode", "btslab",
    "hmroot", "hmseg", "hmentry", "any",
};

typedef struct region { uint64_t off, len; enum region_kind kind; } region;
static region *regions;
static size_t nregions, cap_regions;
static uint64_t tmpl_size;
static unsigned char *tmpl;              /* the template's bytes */

static void add_region(uint64_t off, uint64_t len, enum region_kind kind)
{
    if (!len || off >= tmpl_size) return;
    if (len > tmpl_size - off) len = tmpl_size - off;
    if (nregions == cap_regions) {
        cap_regions = cap_regions ? cap_regions * 2 : 256;
        regions = realloc(regions, cap_regions * sizeof *regions);
        if (!regions) { perror("realloc"); exit(2); }
    }
    regions[nregions++] = (region){off, len, kind};
}

/* ==========================================================================
 * The template pool
 * ========================================================================== */
static char dir[512], tmpl_path[600], dirty_path[600], work_path[600], repair_path[600];

/* The two templates cases alternate between: the pool closed cleanly, and
 * the same pool after a process died in the middle of work (unretired log
 * records, pending tree inserts, an open transaction: recovery runs). */
struct template_ {
    unsigned char *bytes;
    uint64_t size;
    region *regions;
    size_t nregions;
};
static struct template_ templates[2];
static unsigned ntemplates;

static void use_template(unsigned k)
{
    tmpl = templates[k].bytes;
    tmpl_size = templates[k].size;
    regions = templates[k].regions;
    nregions = templates[k].nregions;
}
static const char *cli;

static int die(const char *what)
{
    fprintf(stderr, "fuzz_pools: %s: %s\n", what, nvh_errormsg());
    exit(2);
}

static uint64_t tree_value_len(uint64_t key) { return 8 + (key * 37) % 200; }
static void tree_value(uint64_t key, unsigned char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(key * 13 + i);
}
static bool tree_key_live(uint64_t k) { return k % 7 != 3; }   /* deleted ones */

static int tx_body(nvh_pool *pool, void *arg)
{
    uint64_t *obj = arg;
    if (nvh_tx_add_range(pool, obj, 64) != NVH_OK) return -1;
    for (unsigned i = 0; i < 8; i++) obj[i] += i + 1;
    uint64_t *fresh = nvh_tx_alloc(pool, 128);
    if (!fresh) return -1;
    memset(fresh, 0x5C, 128);
    return 0;
}

static void build_template(void)
{
    nvh_pool_options o = {.root_size = 4096, .max_size = 64 << 20};
    nvh_pool *pool = nvh_pool_create_ex(tmpl_path, "fuzz", 1 << 20, NVH_DOMAIN_PROCESS, &o);
    if (!pool) die("create");
    nvh_off_t *root = nvh_root(pool, NULL);

    /* objects with links: a chain obj[i] -> obj[i+1] (first word), head in root[0] */
    void *prev = NULL;
    for (unsigned i = 0; i < NOBJ; i++) {
        size_t size = i % 13 == 12 ? 9000 : i == 20 ? 300000 : 64 + (i % 6) * 150;
        unsigned char *p = nvh_reserve(pool, size);
        if (!p) die("reserve");
        memset(p, (int)(i + 1), size);
        memset(p, 0, 8);
        nvh_persist(pool, p, size);
        nvh_off_t *links[2] = {prev ? (nvh_off_t *)prev : &root[0], &root[1 + i]};
        if (nvh_activate(pool, p, links, 2) != NVH_OK) die("activate");
        prev = p;
    }
    /* named objects */
    for (unsigned i = 0; i < NNAMED; i++) {
        char name[32];
        snprintf(name, sizeof name, "obj.%u", i);
        unsigned char *p = nvh_reserve_named(pool, name, 100 + i * 300);
        if (!p) die("reserve_named");
        memset(p, (int)(0xA0 + i), 100 + i * 300);
        nvh_persist(pool, p, 100 + i * 300);
        if (nvh_activate_named(pool, name) != NVH_OK) die("activate_named");
    }
    /* a B+ tree: inserts (splits), updates, deletes */
    nvh_btree *t = nvh_btree_open(pool, TREE_NAME, 1, NULL);
    if (!t) die("btree_open");
    unsigned char val[256];
    for (uint64_t k = 0; k < TREE_KEYS; k++) {
        uint64_t key = (k * 2654435761u) % 100000;
        tree_value(key, val, tree_value_len(key));
        if (nvh_btree_put(t, key, val, tree_value_len(key)) != NVH_OK) die("btree_put");
    }
    for (uint64_t k = 0; k < TREE_KEYS; k++) {
        uint64_t key = (k * 2654435761u) % 100000;
        if (!tree_key_live(key) && nvh_btree_delete(t, key) != NVH_OK) die("btree_delete");
    }
    if (nvh_btree_close(t) != NVH_OK) die("btree_close");
    /* a hash map */
    /* a fixed hash seed: the default derives it from the (random) pool uuid,
     * and the mutations are aimed at where the entries lie */
    nvh_hmap_options ho = {.seed = 0x18};
    if (nvh_hmap_create(pool, &root[ROOT_MAP], &ho) != NVH_OK) die("hmap_create");
    nvh_hmap *m = nvh_hmap_open(pool, root[ROOT_MAP]);
    if (!m) die("hmap_open");
    for (unsigned i = 0; i < MAP_KEYS; i++) {
        char key[32], v[64];
        int kl = snprintf(key, sizeof key, "key-%u", i);
        int vl = snprintf(v, sizeof v, "value-%u-%0*u", i, (int)(i % 40), i);
        if (nvh_hmap_put(m, key, (size_t)kl, v, (size_t)vl) != NVH_OK) die("hmap_put");
    }
    for (unsigned i = 0; i < MAP_KEYS; i += 9) {
        char key[32];
        int kl = snprintf(key, sizeof key, "key-%u", i);
        if (nvh_hmap_delete(m, key, (size_t)kl) != NVH_OK) die("hmap_delete");
    }
    if (nvh_hmap_close(m) != NVH_OK) die("hmap_close");
    /* committed transactions on an object of their own */
    uint64_t *txo = nvh_alloc(pool, 64, NULL, NULL, &root[ROOT_TX]);
    if (!txo) die("alloc");
    for (unsigned i = 0; i < 5; i++)
        if (nvh_tx_run(pool, tx_body, txo) != NVH_OK) die("tx_run");
    if (nvh_pool_close(pool) != NVH_OK) die("close");
}

/* The clean template, then a process that dies (no close) after more
 * inserts, an update and in the middle of a transaction. */
static void build_dirty(void)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", tmpl_path, dirty_path);
    if (system(cmd) != 0) { fprintf(stderr, "fuzz_pools: cannot copy the template\n"); exit(2); }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
        nvh_pool *pool = nvh_pool_open(dirty_path, NULL, NVH_DOMAIN_PROCESS);
        if (!pool) die("open dirty");
        nvh_btree *t = nvh_btree_open(pool, TREE_NAME, 1, NULL);
        if (!t) die("btree_open dirty");
        unsigned char val[256];
        for (uint64_t k = 0; k < 64; k++) {
            uint64_t key = 200000 + k * 3;
            tree_value(key, val, tree_value_len(key));
            nvh_btree_put(t, key, val, tree_value_len(key));
        }
        nvh_off_t *root = nvh_root(pool, NULL);
        nvh_hmap *m = nvh_hmap_open(pool, root[ROOT_MAP]);
        if (m) {
            nvh_hmap_put(m, "key-1", 5, "changed", 7);
            nvh_hmap_put(m, "dirty", 5, "x", 1);
        }
        uint64_t *txo = nvh_ptr(pool, root[ROOT_TX]);
        if (txo && nvh_tx_begin(pool) == NVH_OK) {
            nvh_tx_add_range(pool, txo, 64);
            txo[0] = 0xD1D1;
            nvh_tx_alloc(pool, 256);
        }
        _exit(0);                    /* no close: a crash */
    }
    int st;
    waitpid(pid, &st, 0);
}

/* Record the template's metadata regions (read-only open, white-box). */
static void map_template(const char *path)
{
    regions = NULL;
    nregions = cap_regions = 0;
    const char *tmpl_path = path;
    int fd = open(tmpl_path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(tmpl_path); exit(2); }
    tmpl_size = (uint64_t)st.st_size;
    tmpl = malloc(tmpl_size);
    if (!tmpl || pread(fd, tmpl, tmpl_size, 0) != (ssize_t)tmpl_size) { perror("read"); exit(2); }
    close(fd);

    nvh_pool *pool = nvh_pool_open(tmpl_path, NULL, NVH_OPEN_READONLY | NVH_DOMAIN_PROCESS);
    if (!pool) die("open template");
    const char *base = nvh_pool_base(pool);
    add_region(0, NVH_SUPERBLOCK_SIZE, R_SUPER);
    const struct nvh_superblock *sb = (const void *)base;
    uint64_t heap = sb->header.heap_offset;
    const struct nvh_heap_hdr *hh = (const void *)(base + heap);
    add_region(heap, 128, R_HEAPHDR);
    add_region(hh->table_off, (uint64_t)hh->table_cap * 64 > 16384 ? 16384 : (uint64_t)hh->table_cap * 64, R_TABLE);
    add_region(hh->rings_off, (uint64_t)hh->rings * 64 * (1 + hh->ring_lines), R_RINGS);
    /* region headers: the header-chunk slot of every 4 KiB block of the
     * used data chunks (runs, large and free regions begin at blocks) */
    add_region(heap + NVH_FULLMAP_OFF, NVH_FULLMAP_BYTES, R_HEAPHDR);   /* chunk-full map */
    uint64_t hwm = 0;
    if (!nvh_hwm_decode(((const struct nvh_heap_state *)(base + heap + 64))->hwm_word, &hwm))
        die("template's high-water mark fails its check");
    for (uint64_t c = 0; c < hwm && c < 8; c++)
        for (uint64_t b = 0; b < hh->chunk_size / NVH_BLOCK && !nvh_chunk_is_hdr_z(hh->zone0_chunks, c); b++) {
            uint64_t blk = c * (hh->chunk_size / NVH_BLOCK) + b;
            uint64_t off = nvh_rhdr_off_hh(hh, blk);
            const struct nvh_rhdr *r = (const void *)(base + off);
            if (off + 64 <= tmpl_size && r->magic == NVH_RHDR_MAGIC) add_region(off, 64, R_RHDR);
        }
    /* B+ tree: header, every node reachable (breadth first), every slab */
    size_t hsize;
    const bt_header *bh = nvh_get_named(pool, "nvh.btree." TREE_NAME, &hsize);
    if (bh) {
        add_region((uint64_t)((const char *)bh - base), 64, R_BTHDR);
        nvh_off_t queue[4096];
        size_t qh = 0, qt = 0;
        if (bh->root) queue[qt++] = bh->root;
        while (qh < qt) {
            nvh_off_t off = queue[qh++];
            const bt_node *n = (const void *)(base + off);
            add_region(off, BT_NODE_SIZE, R_BTNODE);
            if (n->level == 0) continue;
            for (unsigned i = 0; i < BT_NODE_CAP && qt < 4096; i++)
                if (n->e[i].ptr) queue[qt++] = n->e[i].ptr;
        }
        for (nvh_off_t s = bh->slabs; s; s = ((const bt_slab *)(base + s))->next)
            add_region(s, 4096, R_BTSLAB);
    }
    /* hash map: root, segment 0, entries */
    const nvh_off_t *root = nvh_root(pool, NULL);
    nvh_off_t hm = root[ROOT_MAP];
    if (hm) {
        const struct nvh_hm_root *r = (const void *)(base + hm);
        add_region(hm, sizeof *r, R_HMROOT);
        for (unsigned k = 0; k < NVH_HM_SEGS && r->seg[k]; k++)
            add_region(r->seg[k], hm_seg_buckets(r->base_log2, k) * 32, R_HMSEG);
        uint64_t cur = ((const struct nvh_hm_dummy *)(base + r->seg[0]))->next;
        for (unsigned n = 0; cur && n < 100000; n++) {
            const struct nvh_hm_link *l = (const void *)(base + cur);
            if (l->so_key & 1) add_region(cur, 64, R_HMENTRY);
            cur = l->next;
        }
    }
    nvh_pool_close(pool);
}

/* ==========================================================================
 * Mutations
 * ========================================================================== */
enum { M_FLIP = 1, M_ZERO = 2, M_WORD = 4, M_TRUNC = 8, M_ALL = 15 };
static unsigned classes = M_ALL;
static uint64_t region_mask = (1u << R_KIND_COUNT) - 1;

typedef struct mutation { unsigned cls; uint64_t off, value; } mutation;
#define MAX_MUT 4

static void describe(const mutation *m, unsigned n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < n && at < len; i++) {
        const char *c = m[i].cls == M_FLIP ? "flip" : m[i].cls == M_ZERO ? "zero64"
                      : m[i].cls == M_WORD ? "word" : "truncate";
        at += (size_t)snprintf(buf + at, len - at, "%s%s@%#" PRIx64 "=%#" PRIx64, i ? " " : "",
                               c, m[i].off, m[i].value);
    }
}

/* A position: mostly inside a metadata region of an allowed kind. */
static uint64_t pick_offset(enum region_kind *kind)
{
    for (int tries = 0; tries < 64 && rnd_below(10) < 9; tries++) {
        const region *r = &regions[rnd_below(nregions)];
        if (!(region_mask & (1u << r->kind))) continue;
        *kind = r->kind;
        return r->off + rnd_below(r->len);
    }
    *kind = R_ANY;
    return rnd_below(tmpl_size);
}

/* An interesting 8-byte word: another structure's offset (the most
 * damaging lie), small numbers, extremes, random bits. */
static uint64_t pick_word(void)
{
    switch (rnd_below(6)) {
    case 0: return regions[rnd_below(nregions)].off + rnd_below(3) * 8;
    case 1: return rnd_below(64);
    case 2: return UINT64_MAX - rnd_below(4);
    case 3: return rnd_below(tmpl_size + 8192);
    case 4: return rnd() & ~63ull & (((uint64_t)1 << 40) - 1);
    default: return rnd();
    }
}

static unsigned make_mutations(mutation *m)
{
    unsigned n = 1 + (unsigned)rnd_below(MAX_MUT), k = 0;
    for (unsigned i = 0; i < n; i++) {
        unsigned cls;
        do cls = 1u << rnd_below(4);
        while (!(classes & cls));
        if (cls == M_TRUNC && rnd_below(10)) {      /* truncation: rarer (~4% of cases) */
            if (classes == M_TRUNC) goto keep;
            i--;
            continue;
        }
    keep:;
        enum region_kind kind;
        uint64_t off = pick_offset(&kind);
        mutation mu = {cls, off, 0};
        switch (cls) {
        case M_FLIP: mu.value = 1 + rnd_below(255); break;
        case M_ZERO: mu.off &= ~63ull; break;
        case M_WORD: mu.off &= ~7ull; mu.value = pick_word(); break;
        case M_TRUNC: mu.value = rnd_below(2) ? off : off & ~4095ull; break;
        }
        m[k++] = mu;
    }
    return k;
}

static int write_mutated(const char *path, const mutation *m, unsigned n)
{
    unsigned char *img = malloc(tmpl_size);
    if (!img) return -1;
    memcpy(img, tmpl, tmpl_size);
    uint64_t size = tmpl_size;
    for (unsigned i = 0; i < n; i++) {
        switch (m[i].cls) {
        case M_FLIP: if (m[i].off < size) img[m[i].off] ^= (unsigned char)m[i].value; break;
        case M_ZERO: if (m[i].off + 64 <= size) memset(img + m[i].off, 0, 64); break;
        case M_WORD: if (m[i].off + 8 <= size) memcpy(img + m[i].off, &m[i].value, 8); break;
        case M_TRUNC: if (m[i].value < size) size = m[i].value; break;
        }
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int rc = fd < 0 || write(fd, img, size) != (ssize_t)size ? -1 : 0;
    if (fd >= 0) close(fd);
    free(img);
    return rc;
}

/* ==========================================================================
 * The readers (run in the child)
 * ========================================================================== */
/* Where a child is, in memory shared with the parent: the case (a child
 * runs a batch of them: forking a sanitizer build per case costs more than
 * the case) and its stage. */
struct shared {
    uint64_t iter;
    char stage[64];
    char desc[512];
    /* what the readers said (not failures: the numbers behind the report) */
    uint64_t check_rc[3];        /* nvheap check exit 0 / 1 / 2           */
    uint64_t repair_rc[3];       /* nvheap check --repair exit 0 / 1 / 2  */
    uint64_t clean_but_corrupt;  /* check said 0, a read-only walk met NVH_E_CORRUPT */
};
static bool walk_corrupt;        /* this case's read-only walk met NVH_E_CORRUPT */
static char walk_msg[256];
static void note_rc(int rc)
{
    if (rc != NVH_E_CORRUPT || walk_corrupt) return;
    walk_corrupt = true;
    snprintf(walk_msg, sizeof walk_msg, "%s", nvh_errormsg());
}
static struct shared *sh;
static void set_stage(const char *s)
{
    if (sh) { strncpy(sh->stage, s, sizeof sh->stage - 1); sh->stage[sizeof sh->stage - 1] = '\0'; }
}

static volatile uint64_t sink;   /* every byte read goes here (nothing is elided) */
static void touch(const void *p, size_t len)
{
    const unsigned char *c = p;
    uint64_t s = 0;
    for (size_t i = 0; i < len; i++) s += c[i];
    sink += s;
}

static int named_fn(const char *name, void *ptr, size_t size, void *arg)
{
    (void)arg;
    touch(name, strlen(name));
    if (ptr) touch(ptr, size);
    return 0;
}
static int object_fn(void *ptr, size_t usable, void *arg)
{
    (void)arg;
    touch(ptr, usable);
    return 0;
}
static int scan_fn(uint64_t key, const void *value, size_t len, void *arg)
{
    (void)key;
    touch(value, len);
    ++*(uint64_t *)arg;
    return 0;
}
static int hm_fn(const void *key, size_t klen, const void *value, size_t vlen, void *arg)
{
    touch(key, klen);
    touch(value, vlen);
    ++*(uint64_t *)arg;
    return 0;
}
static void check_fn(uint64_t offset, uint64_t length, const char *what, void *arg)
{
    (void)offset; (void)length; (void)arg;
    touch(what, strlen(what));
}

/* Walk everything reachable through the API: a corrupt structure may fail
 * (any error code is fine), never crash or hang. */
static void walk_pool(nvh_pool *pool, bool writable)
{
    set_stage(writable ? "rw: heap check" : "ro: heap check");
    uint64_t corrupt = 0;
    nvh_heap_check(pool, check_fn, NULL, 0, &corrupt);
    set_stage(writable ? "rw: named foreach" : "ro: named foreach");
    nvh_named_foreach(pool, named_fn, NULL);
    for (unsigned i = 0; i < NNAMED; i++) {
        char name[32];
        size_t size = 0;
        snprintf(name, sizeof name, "obj.%u", i);
        void *p = nvh_get_named(pool, name, &size);
        if (p) touch(p, size);
    }
    set_stage(writable ? "rw: heap foreach" : "ro: heap foreach");
    nvh_heap_foreach(pool, object_fn, NULL);

    set_stage(writable ? "rw: btree open" : "ro: btree open");
    /* read-only: FLUSH mode (a persist-group context needs a writable pool) */
    nvh_btree_options ro = {.mode = NVH_BTREE_FLUSH};
    nvh_btree *t = nvh_btree_open(pool, TREE_NAME, 0, writable ? NULL : &ro);
    if (t) {
        set_stage(writable ? "rw: btree get" : "ro: btree get");
        for (uint64_t k = 0; k < TREE_KEYS; k++) {
            const void *v;
            size_t len;
            uint64_t key = (k * 2654435761u) % 100000;
            int rc = nvh_btree_get(t, key, &v, &len);
            if (rc == NVH_OK) touch(v, len);
            if (!writable) note_rc(rc);
        }
        set_stage(writable ? "rw: btree scan" : "ro: btree scan");
        uint64_t seen = 0;
        int src = nvh_btree_scan(t, 0, UINT64_MAX, scan_fn, &seen);
        if (!writable) note_rc(src);
        set_stage(writable ? "rw: btree count" : "ro: btree count");
        sink += nvh_btree_count(t);
        set_stage(writable ? "rw: btree check" : "ro: btree check");
        int crc = nvh_btree_check(t);
        if (!writable) note_rc(crc);
        set_stage(writable ? "rw: btree close" : "ro: btree close");
        nvh_btree_close(t);
    }
    set_stage(writable ? "rw: hmap open" : "ro: hmap open");
    const nvh_off_t *root = nvh_root(pool, NULL);
    nvh_hmap *m = root ? nvh_hmap_open(pool, root[ROOT_MAP]) : NULL;
    if (m) {
        set_stage(writable ? "rw: hmap get" : "ro: hmap get");
        for (unsigned i = 0; i < MAP_KEYS; i++) {
            char key[32];
            const void *v;
            size_t vl;
            int kl = snprintf(key, sizeof key, "key-%u", i);
            int rc = nvh_hmap_get(m, key, (size_t)kl, &v, &vl);
            if (rc == NVH_OK) touch(v, vl);
            if (!writable) note_rc(rc);
        }
        set_stage(writable ? "rw: hmap foreach" : "ro: hmap foreach");
        uint64_t seen = 0;
        int frc = nvh_hmap_foreach(m, hm_fn, &seen);
        if (!writable) note_rc(frc);
        sink += nvh_hmap_count(m);
        set_stage(writable ? "rw: hmap check" : "ro: hmap check");
        int hrc = nvh_hmap_check(m, NULL);
        if (!writable) note_rc(hrc);
        set_stage(writable ? "rw: hmap close" : "ro: hmap close");
        nvh_hmap_close(m);
    }
}

/* Run the CLI on path; returns its exit status, or -signal, or -1000 for a
 * timeout (killed). posix_spawn: no copy of this (sanitizer-sized) process. */
static int run_cli(const char *path, bool repair)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char *args[6] = {(char *)cli, "check", (char *)path, NULL, NULL, NULL};
    if (repair) { args[3] = "--repair"; args[4] = "--no-backup"; }
    pid_t pid;
    int rc = posix_spawn(&pid, cli, &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -2000;
    int st;
    double deadline = now_s() + CHILD_TIMEOUT;
    for (unsigned nap = 50;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) return -2000;
        if (now_s() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1000;
        }
        usleep(nap);
        if (nap < 2000) nap *= 2;
    }
    if (WIFSIGNALED(st)) return -WTERMSIG(st);
    return WEXITSTATUS(st);
}

static bool cli_ok(int rc) { return rc == 0 || rc == 1 || rc == 2; }

/* One case, in the current process. Returns 0 if every reader behaved. */
static unsigned cur_template;    /* 0 clean, 1 crashed */

static int run_case(const char *path, const char *rpath)
{
    int check_said = -1;
    walk_corrupt = false;
    if (cli) {
        set_stage("cli: check");
        int rc = run_cli(path, false);
        check_said = rc;
        if (rc >= 0 && rc <= 2) sh->check_rc[rc]++;
        if (!cli_ok(rc)) {
            fprintf(stderr, "  nvheap check: %s %d\n", rc < 0 ? "signal/timeout" : "exit", rc);
            return 1;
        }
        set_stage("cli: check --repair");
        rc = run_cli(rpath, true);
        if (rc >= 0 && rc <= 2) sh->repair_rc[rc]++;
        if (!cli_ok(rc)) {
            fprintf(stderr, "  nvheap check --repair: %s %d\n", rc < 0 ? "signal/timeout" : "exit", rc);
            return 1;
        }
    }
    set_stage("ro: open");
    nvh_pool *pool = nvh_pool_open(path, NULL, NVH_OPEN_READONLY | NVH_DOMAIN_PROCESS);
    if (pool) {
        walk_pool(pool, false);
        set_stage("ro: close");
        nvh_pool_close(pool);
    }
    /* a crashed template's read-only walk sees the pool before recovery
     * (check judges it after): only clean ones are comparable */
    if (check_said == 0 && walk_corrupt && cur_template == 0) {
        sh->clean_but_corrupt++;
        fprintf(stderr, "note: case %" PRIu64 " (%s): nvheap check said consistent, a walk "
                "met: %s\n", sh->iter, sh->desc, walk_msg);
    }
    /* read-write on the repaired copy when there is one, else on the
     * mutated pool: recovery (log replay, transaction rollback) runs */
    const char *rw = cli ? rpath : path;
    set_stage("rw: open");
    pool = nvh_pool_open(rw, NULL, NVH_DOMAIN_PROCESS);
    if (pool) {
        walk_pool(pool, true);
        set_stage("rw: close");
        nvh_pool_close(pool);
    }
    set_stage("done");
    return 0;
}

/* ==========================================================================
 * Driver
 * ========================================================================== */
static void usage(void)
{
    fprintf(stderr, "usage: fuzz_pools [--seed N] [--iters N] [--seconds S] [--dir D] "
                    "[--cli PATH] [--classes flip,zero,word,trunc] [--regions LIST] "
                    "[--repro SEED:ITER] [--keep-going] [--verbose]\n"
                    "regions: super heaphdr table rings rhdr bthdr btnode btslab hmroot "
                    "hmseg hmentry any\n");
    exit(2);
}

static unsigned parse_classes(const char *s)
{
    unsigned c = 0;
    if (strstr(s, "flip")) c |= M_FLIP;
    if (strstr(s, "zero")) c |= M_ZERO;
    if (strstr(s, "word")) c |= M_WORD;
    if (strstr(s, "trunc")) c |= M_TRUNC;
    if (!c) usage();
    return c;
}

static uint64_t parse_regions(const char *s)
{
    uint64_t mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        for (unsigned k = 0; k < R_KIND_COUNT; k++)
            if (strcmp(tok, region_names[k]) == 0) mask |= 1u << k;
    if (!mask) usage();
    return mask;
}

int main(int argc, char **argv)
{
    uint64_t seed = 1, iters = 1000, repro_iter = UINT64_MAX;
    double seconds = 0;
    bool keep_going = false, verbose = false;
    const char *d = getenv("NVHEAP_TEST_DIR");
    cli = getenv("NVHEAP_CLI");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--seed") && v) { seed = strtoull(v, NULL, 0); i++; }
        else if (!strcmp(a, "--iters") && v) { iters = strtoull(v, NULL, 0); i++; }
        else if (!strcmp(a, "--seconds") && v) { seconds = atof(v); i++; }
        else if (!strcmp(a, "--dir") && v) { d = v; i++; }
        else if (!strcmp(a, "--cli") && v) { cli = v; i++; }
        else if (!strcmp(a, "--classes") && v) { classes = parse_classes(v); i++; }
        else if (!strcmp(a, "--regions") && v) { region_mask = parse_regions(v); i++; }
        else if (!strcmp(a, "--repro") && v) {
            if (sscanf(v, "%" SCNu64 ":%" SCNu64, &seed, &repro_iter) != 2) usage();
            i++;
        }
        else if (!strcmp(a, "--keep-going")) keep_going = true;
        else if (!strcmp(a, "--verbose")) verbose = true;
        else usage();
    }
    if (cli && !*cli) cli = NULL;
    if (!d || !*d) d = "/tmp";
    mkdir(d, 0700);
    snprintf(dir, sizeof dir, "%s/fuzz-pools-%d", d, (int)getpid());
    if (mkdir(dir, 0700) != 0) { perror(dir); return 2; }
    snprintf(tmpl_path, sizeof tmpl_path, "%s/template.pool", dir);
    snprintf(dirty_path, sizeof dirty_path, "%s/dirty.pool", dir);
    snprintf(work_path, sizeof work_path, "%s/mutated.pool", dir);
    snprintf(repair_path, sizeof repair_path, "%s/repaired.pool", dir);
    /* sanitizer reports get exit codes of their own (not the CLI's 1/2) */
    setenv("ASAN_OPTIONS", "exitcode=99:detect_leaks=0:allow_user_segv_handler=1", 0);
    setenv("UBSAN_OPTIONS", "exitcode=98:halt_on_error=1:print_stacktrace=1", 0);

    build_template();
    build_dirty();
    const char *paths[2] = {tmpl_path, dirty_path};
    for (unsigned k = 0; k < 2; k++) {
        map_template(paths[k]);
        templates[k] = (struct template_){tmpl, tmpl_size, regions, nregions};
        if (verbose)
            fprintf(stderr, "fuzz_pools: template %u: %" PRIu64 " bytes, %zu metadata regions\n",
                    k, tmpl_size, nregions);
    }
    ntemplates = 2;

    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) { perror("mmap"); return 2; }

    uint64_t failures = 0, done = 0, first = 0, last = iters;
    if (repro_iter != UINT64_MAX) { first = repro_iter; last = repro_iter + 1; }
    double start = now_s();
    for (uint64_t it = first; it < last;) {
        if (seconds > 0 && now_s() - start > seconds) break;
        uint64_t end = it + BATCH < last ? it + BATCH : last;
        sh->iter = it;
        set_stage("start");
        pid_t pid = repro_iter != UINT64_MAX ? 0 : fork();
        if (pid < 0) { perror("fork"); return 2; }
        if (pid == 0) {
            for (uint64_t j = it; j < end; j++) {
                rng_state = seed * 0x9E3779B97F4A7C15ull ^ (j + 1) * 0xD1B54A32D192ED03ull;
                cur_template = (unsigned)(j % ntemplates);
                use_template(cur_template);
                mutation m[MAX_MUT];
                unsigned n = make_mutations(m);
                sh->iter = j;
                char d[480];
                describe(m, n, d, sizeof d);
                snprintf(sh->desc, sizeof sh->desc, "%s template: %s",
                         j % ntemplates ? "crashed" : "clean", d);
                set_stage("write");
                if (write_mutated(work_path, m, n) != 0 || write_mutated(repair_path, m, n) != 0) {
                    perror("write");
                    _exit(2);
                }
                if (verbose) fprintf(stderr, "iter %" PRIu64 ": %s\n", j, sh->desc);
                if (repro_iter != UINT64_MAX) {   /* in this process: for gdb / sanitizers */
                    fprintf(stderr, "repro %" PRIu64 ":%" PRIu64 ": %s\n", seed, j, sh->desc);
                    int rc = run_case(work_path, repair_path);
                    fprintf(stderr, "repro: %s\n", rc ? "FAILED" : "ok");
                    return rc ? 1 : 0;
                }
                alarm(CHILD_TIMEOUT * 3);
                if (run_case(work_path, repair_path)) _exit(1);
            }
            _exit(0);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR) { perror("waitpid"); return 2; }
        const char *why = NULL;
        char buf[64];
        if (WIFSIGNALED(st)) {
            snprintf(buf, sizeof buf, WTERMSIG(st) == SIGALRM ? "timeout (hang)" : "signal %d",
                     WTERMSIG(st));
            why = buf;
        } else if (WEXITSTATUS(st) != 0) {
            snprintf(buf, sizeof buf, "exit %d%s", WEXITSTATUS(st),
                     WEXITSTATUS(st) >= 98 ? " (sanitizer report)" : "");
            why = buf;
        }
        if (!why) {
            done += end - it;
            it = end;
            continue;
        }
        failures++;
        done += sh->iter - it + 1;
        fprintf(stderr, "FAIL seed %" PRIu64 " iter %" PRIu64 ": %s in stage '%s'; "
                "mutations: %s\n  reproduce: %s --repro %" PRIu64 ":%" PRIu64 "%s%s\n",
                seed, sh->iter, why, sh->stage, sh->desc, argv[0], seed, sh->iter,
                cli ? " --cli " : "", cli ? cli : "");
        if (!keep_going) break;
        it = sh->iter + 1;
    }
    fprintf(stderr, "fuzz_pools: seed %" PRIu64 ", %" PRIu64 " mutated pools in %.1f s, "
            "%" PRIu64 " failure%s\n", seed, done, now_s() - start, failures,
            failures == 1 ? "" : "s");
    if (cli)
        fprintf(stderr, "fuzz_pools: nvheap check exit 0/1/2: %" PRIu64 "/%" PRIu64 "/%" PRIu64
                "; check --repair exit 0/1/2: %" PRIu64 "/%" PRIu64 "/%" PRIu64 "; called "
                "consistent but a read-only walk met NVH_E_CORRUPT: %" PRIu64 "\n",
                sh->check_rc[0], sh->check_rc[1], sh->check_rc[2], sh->repair_rc[0],
                sh->repair_rc[1], sh->repair_rc[2], sh->clean_but_corrupt);
    /* FUZZ_KEEP=1 keeps the files (a --repro case's mutated pool) */
    if (!getenv("FUZZ_KEEP")) {
        unlink(tmpl_path);
        unlink(dirty_path);
        unlink(work_path);
        unlink(repair_path);
        char bak[700];
        snprintf(bak, sizeof bak, "%s.bak", repair_path);
        unlink(bak);
        rmdir(dir);
    }
    return failures ? 1 : 0;
}
