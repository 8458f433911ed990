/* cachesim_driver.c — the operations of [Kannan14] Figs. 13-15 and 18, run by bench_cachesim under valgrind's cache simulator
 *
 *   cachesim_driver WORKLOAD SUBJECT N DIR
 *   cachesim_driver --list          the WORKLOAD SUBJECT pairs of this build
 *
 * Sets up (not measured), then runs N operations of WORKLOAD with
 * callgrind's collection switched on around exactly that loop
 * (CALLGRIND_TOGGLE_COLLECT; run it with --collect-atstart=no), so the
 * simulated cache misses of the run are those of the N operations only.
 * Prints one line "counts LINES FENCES" (64 B lines flushed and fences in
 * the loop, totals: nvheap's pool statistics, PMDK's libpmem calls counted
 * by pmdk_count.c; 0 for the volatile subjects).
 *
 * Workloads and subjects:
 *   alloc, free      the allocator ([Kannan14] Fig. 13-15, Table 2): N
 *                    objects of 128 B (a 64 B key and a 64 B value, the
 *                    paper's hash elements). nvheap: nvh_reserve +
 *                    nvh_activate with one link (a word of an array in the
 *                    pool); pmdk: pmemobj_alloc into a PMEMoid in the pool;
 *                    glibc: malloc. free: nvh_free clearing the link |
 *                    pmemobj_free(&oid) | free (the allocations made first,
 *                    outside the measurement). No content written (as in
 *                    bench_alloc).
 *   hash-insert, hash-delete   the persistent hash table of [Kannan14] §4.3
 *                    (Fig. 18; bench_tx's hash case): 4096 buckets, 64 B
 *                    entries {key, val, next}, one transaction per insert
 *                    (allocates the entry, links it, counts it) or delete.
 *                    nvheap-word / nvheap-object / nvheap-hybrid: nvheap's
 *                    undo transactions with the logging hint WORD, OBJECT or
 *                    AUTO (hybrid: the entry as one object, the bucket and
 *                    the count as words); the entry's 3 words are logged as
 *                    in the paper's PHT. pmdk: TX_BEGIN, pmemobj_tx_alloc,
 *                    pmemobj_tx_add_range_direct of the bucket and the count
 *                    (and the entry's next on delete), pmemobj_tx_free.
 *                    volatile: the same table in DRAM with malloc/free and
 *                    plain stores (the paper's "ideal" baseline).
 *   update-1, update-4   1 or 4 random 8-byte words of a 1 M-word array in
 *                    the pool updated per transaction: the commit protocols.
 *                    nvheap-redo: nvh_tx_write_word (one-fence commit);
 *                    nvheap-undo: the same calls with the two-fence protocol
 *                    forced (nvh_tx_protocol_set); nvheap-word:
 *                    nvh_tx_add_range_hint(WORD) then the store; pmdk:
 *                    pmemobj_tx_add_range_direct then the store.
 * nvheap runs in the pmem domain, PMDK with PMEM_IS_PMEM_FORCE=1 (set by
 * bench_cachesim), both on DIR. Exit status 0, or 1 with a message. */
#include "nvheap.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <valgrind/callgrind.h>

#ifdef NVH_CACHESIM_PMDK
#include <libpmemobj.h>
#include "pmdk_count.h"
#endif

#define MIB ((uint64_t)1 << 20)
#define OBJ_SIZE 128u
#define HBUCKETS 4096u
#define UPDATE_WORDS (1u << 20)

static uint64_t g_lines, g_fences;
/* pool files, removed at exit */
static char g_paths[2][512];

static void remove_pools(void)
{
    for (int i = 0; i < 2; i++)
        if (g_paths[i][0]) unlink(g_paths[i]);
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "cachesim_driver: %s: %s\n", what, msg ? msg : "failed");
    exit(1);
}

static inline uint64_t xs(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* The measured loop is bracketed by these: collection on, pool counters
 * reset / read. */
static void measure_begin(nvh_pool *pool)
{
    if (pool) nvh_stats_reset(pool);
#ifdef NVH_CACHESIM_PMDK
    pmdk_count_reset();
#endif
    CALLGRIND_TOGGLE_COLLECT;
}

static void measure_end(nvh_pool *pool)
{
    CALLGRIND_TOGGLE_COLLECT;
    if (pool) {
        nvh_stats st;
        nvh_stats_get(pool, &st);
        g_lines = st.lines_flushed;
        g_fences = st.fences;
    }
#ifdef NVH_CACHESIM_PMDK
    else {
        pmdk_count c = pmdk_count_total();
        g_lines = c.lines;
        g_fences = c.fences;
    }
#endif
}

static nvh_pool *nvheap_pool(const char *dir, uint64_t size)
{
    char *path = g_paths[0];
    snprintf(path, sizeof g_paths[0], "%s/nvh-cachesim-%d", dir, (int)getpid());
    unlink(path);
    /* a small address-space reservation: valgrind refuses the default's */
    nvh_pool_options po = {.max_size = size * 2};
    nvh_pool *pool = nvh_pool_create_ex(path, "cachesim", size, NVH_DOMAIN_PMEM, &po);
    if (!pool) die("nvh_pool_create", nvh_errormsg());
    return pool;
}

/* ==========================================================================
 * The allocator
 * ========================================================================== */
static void alloc_nvheap(uint64_t n, const char *dir, int do_free)
{
    nvh_pool *pool = nvheap_pool(dir, 64 * MIB + n * (OBJ_SIZE + 64));
    nvh_off_t *links = nvh_alloc(pool, n * sizeof *links, NULL, NULL, NULL);
    if (!links) die("nvh_alloc", nvh_errormsg());
    if (do_free) {
        for (uint64_t i = 0; i < n; i++) {
            nvh_off_t *link = &links[i];
            void *p = nvh_reserve(pool, OBJ_SIZE);
            if (!p || nvh_activate(pool, p, &link, 1) != NVH_OK) die("alloc", nvh_errormsg());
        }
        measure_begin(pool);
        for (uint64_t i = 0; i < n; i++) {
            nvh_link l = {&links[i], 0};
            if (nvh_free(pool, nvh_ptr(pool, links[i]), &l, 1) != NVH_OK) die("free", nvh_errormsg());
        }
        measure_end(pool);
    } else {
        measure_begin(pool);
        for (uint64_t i = 0; i < n; i++) {
            nvh_off_t *link = &links[i];
            void *p = nvh_reserve(pool, OBJ_SIZE);
            if (!p || nvh_activate(pool, p, &link, 1) != NVH_OK) die("alloc", nvh_errormsg());
        }
        measure_end(pool);
    }
    nvh_pool_close(pool);
}

static void alloc_glibc(uint64_t n, int do_free)
{
    void **ptrs = calloc(n, sizeof *ptrs);
    if (!ptrs) die("calloc", NULL);
    if (do_free) {
        for (uint64_t i = 0; i < n; i++)
            if (!(ptrs[i] = malloc(OBJ_SIZE))) die("malloc", NULL);
        measure_begin(NULL);
        for (uint64_t i = 0; i < n; i++) free(ptrs[i]);
        measure_end(NULL);
    } else {
        measure_begin(NULL);
        for (uint64_t i = 0; i < n; i++)
            if (!(ptrs[i] = malloc(OBJ_SIZE))) die("malloc", NULL);
        measure_end(NULL);
    }
    free(ptrs);
    g_lines = g_fences = 0;
}

#ifdef NVH_CACHESIM_PMDK
static PMEMobjpool *pmdk_pool(const char *dir, uint64_t size)
{
    char *path = g_paths[1];
    snprintf(path, sizeof g_paths[1], "%s/pmdk-cachesim-%d", dir, (int)getpid());
    unlink(path);
    PMEMobjpool *pop = pmemobj_create(path, "cachesim", size, 0600);
    if (!pop) die("pmemobj_create", pmemobj_errormsg());
    return pop;
}

static void alloc_pmdk(uint64_t n, const char *dir, int do_free)
{
    PMEMobjpool *pop = pmdk_pool(dir, 64 * MIB + n * (OBJ_SIZE + 128));
    PMEMoid root = pmemobj_root(pop, n * sizeof(PMEMoid));
    if (OID_IS_NULL(root)) die("pmemobj_root", pmemobj_errormsg());
    PMEMoid *oids = pmemobj_direct(root);
    if (do_free) {
        for (uint64_t i = 0; i < n; i++)
            if (pmemobj_alloc(pop, &oids[i], OBJ_SIZE, 0, NULL, NULL) != 0)
                die("pmemobj_alloc", pmemobj_errormsg());
        measure_begin(NULL);
        for (uint64_t i = 0; i < n; i++) pmemobj_free(&oids[i]);
        measure_end(NULL);
    } else {
        measure_begin(NULL);
        for (uint64_t i = 0; i < n; i++)
            if (pmemobj_alloc(pop, &oids[i], OBJ_SIZE, 0, NULL, NULL) != 0)
                die("pmemobj_alloc", pmemobj_errormsg());
        measure_end(NULL);
    }
    pmemobj_close(pop);
}
#endif

/* ==========================================================================
 * The hash table (as bench_tx's hash case)
 * ========================================================================== */
typedef struct hentry { uint64_t key, val, next; uint64_t pad[5]; } hentry;   /* 64 B */
typedef struct htable { uint64_t count; uint64_t pad[7]; uint64_t bucket[HBUCKETS]; } htable;

static void h_insert_nvheap(nvh_pool *pool, htable *t, nvh_tx_hint hint, uint64_t key)
{
    uint64_t *head = &t->bucket[key % HBUCKETS];
    if (nvh_tx_begin(pool) != NVH_OK) die("nvh_tx_begin", nvh_errormsg());
    hentry *en = nvh_tx_alloc(pool, sizeof *en);
    if (!en) die("nvh_tx_alloc", nvh_errormsg());
    nvh_tx_range r[3] = {{en, 24, hint}, {head, 8, hint}, {&t->count, 8, hint}};
    if (nvh_tx_add_ranges(pool, r, 3) != NVH_OK) die("nvh_tx_add_ranges", nvh_errormsg());
    en->key = key;
    en->val = key * 3;
    en->next = *head;
    *head = nvh_off(pool, en);
    t->count++;
    if (nvh_tx_commit(pool) != NVH_OK) die("nvh_tx_commit", nvh_errormsg());
}

static void h_delete_nvheap(nvh_pool *pool, htable *t, nvh_tx_hint hint, uint64_t key)
{
    uint64_t *link = &t->bucket[key % HBUCKETS];
    hentry *en = nvh_ptr(pool, *link);
    while (en && en->key != key) { link = &en->next; en = nvh_ptr(pool, *link); }
    if (!en) die("delete", "key missing");
    if (nvh_tx_begin(pool) != NVH_OK) die("nvh_tx_begin", nvh_errormsg());
    nvh_tx_range r[3] = {{link, 8, hint}, {&t->count, 8, hint}, {&en->next, 8, hint}};
    if (hint == NVH_TX_HINT_OBJECT) r[2] = (nvh_tx_range){en, 24, hint};
    if (nvh_tx_add_ranges(pool, r, 3) != NVH_OK) die("nvh_tx_add_ranges", nvh_errormsg());
    *link = en->next;
    en->next = 0;
    t->count--;
    if (nvh_tx_free(pool, en) != NVH_OK) die("nvh_tx_free", nvh_errormsg());
    if (nvh_tx_commit(pool) != NVH_OK) die("nvh_tx_commit", nvh_errormsg());
}

static void hash_nvheap(uint64_t n, const char *dir, nvh_tx_hint hint, int del)
{
    nvh_pool *pool = nvheap_pool(dir, 64 * MIB + n * 128);
    htable *t = nvh_alloc(pool, sizeof *t, NULL, NULL, NULL);
    if (!t) die("nvh_alloc", nvh_errormsg());
    if (!del) measure_begin(pool);
    for (uint64_t k = 1; k <= n; k++) h_insert_nvheap(pool, t, hint, k);
    if (!del) {
        measure_end(pool);
    } else {
        measure_begin(pool);
        for (uint64_t k = 1; k <= n; k++) h_delete_nvheap(pool, t, hint, k);
        measure_end(pool);
    }
    if (t->count != (del ? 0 : n)) die("hash", "wrong count");
    nvh_pool_close(pool);
}

/* volatile: the same table in DRAM, no log, no flush */
typedef struct vtable { uint64_t count; hentry *bucket[HBUCKETS]; } vtable;

static void hash_volatile(uint64_t n, int del)
{
    vtable *t = calloc(1, sizeof *t);
    if (!t) die("calloc", NULL);
    if (!del) measure_begin(NULL);
    for (uint64_t k = 1; k <= n; k++) {
        hentry **head = &t->bucket[k % HBUCKETS];
        hentry *en = malloc(sizeof *en);
        if (!en) die("malloc", NULL);
        en->key = k;
        en->val = k * 3;
        en->next = (uint64_t)(uintptr_t)*head;
        *head = en;
        t->count++;
    }
    if (!del) {
        measure_end(NULL);
    } else {
        measure_begin(NULL);
        for (uint64_t k = 1; k <= n; k++) {
            hentry **link = &t->bucket[k % HBUCKETS];
            hentry *en = *link;
            while (en && en->key != k) { link = (hentry **)&en->next; en = *link; }
            if (!en) die("delete", "key missing");
            *link = (hentry *)(uintptr_t)en->next;
            t->count--;
            free(en);
        }
        measure_end(NULL);
    }
    g_lines = g_fences = 0;
    free(t);
}

#ifdef NVH_CACHESIM_PMDK
typedef struct phentry { uint64_t key, val; PMEMoid next; uint64_t pad[4]; } phentry;  /* 64 B */
typedef struct phtable { uint64_t count; uint64_t pad[7]; PMEMoid bucket[HBUCKETS]; } phtable;

/* Run body(arg) as one PMDK transaction; non-zero if it aborted. In a
 * function of its own: TX_BEGIN is a setjmp, and the caller's loop
 * variables must not live across it. */
static __attribute__((noinline)) int pmdk_tx(PMEMobjpool *pop, void (*body)(void *), void *arg)
{
    volatile int failed = 0;
    TX_BEGIN(pop) {
        body(arg);
    } TX_ONABORT {
        failed = 1;
    } TX_END
    return failed;
}

typedef struct ph_op { phtable *t; uint64_t k; PMEMoid *link; phentry *en; } ph_op;

static void ph_insert_body(void *arg)
{
    ph_op *a = arg;
    PMEMoid *head = &a->t->bucket[a->k % HBUCKETS];
    PMEMoid o = pmemobj_tx_alloc(sizeof(phentry), 0);
    phentry *en = pmemobj_direct(o);
    pmemobj_tx_add_range_direct(head, sizeof *head);
    pmemobj_tx_add_range_direct(&a->t->count, 8);
    en->key = a->k;
    en->val = a->k * 3;
    en->next = *head;
    *head = o;
    a->t->count++;
}

static int pmdk_h_insert(PMEMobjpool *pop, phtable *t, uint64_t k)
{
    ph_op a = {.t = t, .k = k};
    return pmdk_tx(pop, ph_insert_body, &a);
}

static void ph_delete_body(void *arg)
{
    ph_op *a = arg;
    PMEMoid o = *a->link;
    pmemobj_tx_add_range_direct(a->link, sizeof *a->link);
    pmemobj_tx_add_range_direct(&a->t->count, 8);
    pmemobj_tx_add_range_direct(&a->en->next, sizeof a->en->next);
    *a->link = a->en->next;
    a->en->next = OID_NULL;
    a->t->count--;
    pmemobj_tx_free(o);
}

static int pmdk_h_delete(PMEMobjpool *pop, phtable *t, PMEMoid *link, phentry *en)
{
    ph_op a = {.t = t, .link = link, .en = en};
    return pmdk_tx(pop, ph_delete_body, &a);
}

static void hash_pmdk(uint64_t n, const char *dir, int del)
{
    PMEMobjpool *pop = pmdk_pool(dir, 64 * MIB + n * 192);
    PMEMoid root = pmemobj_root(pop, sizeof(phtable));
    if (OID_IS_NULL(root)) die("pmemobj_root", pmemobj_errormsg());
    phtable *t = pmemobj_direct(root);
    if (!del) measure_begin(NULL);
    for (uint64_t k = 1; k <= n; k++)
        if (pmdk_h_insert(pop, t, k)) die("pmdk insert", pmemobj_errormsg());
    if (!del) {
        measure_end(NULL);
    } else {
        measure_begin(NULL);
        for (uint64_t k = 1; k <= n; k++) {
            PMEMoid *link = &t->bucket[k % HBUCKETS];
            phentry *en = pmemobj_direct(*link);
            while (en && en->key != k) { link = &en->next; en = pmemobj_direct(*link); }
            if (!en) die("pmdk delete", "key missing");
            if (pmdk_h_delete(pop, t, link, en)) die("pmdk delete", pmemobj_errormsg());
        }
        measure_end(NULL);
    }
    if (t->count != (del ? 0 : n)) die("pmdk hash", "wrong count");
    pmemobj_close(pop);
}
#endif

/* ==========================================================================
 * Word updates: the commit protocols
 * ========================================================================== */
enum { U_REDO, U_UNDO, U_WORD };

static void update_nvheap(uint64_t n, const char *dir, unsigned words, int how)
{
    nvh_pool *pool = nvheap_pool(dir, 64 * MIB + UPDATE_WORDS * 8);
    uint64_t *arr = nvh_alloc(pool, UPDATE_WORDS * 8, NULL, NULL, NULL);
    if (!arr) die("nvh_alloc", nvh_errormsg());
    if (nvh_tx_protocol_set(pool, how == U_UNDO ? NVH_TX_PROTO_UNDO : NVH_TX_PROTO_AUTO) != NVH_OK)
        die("nvh_tx_protocol_set", nvh_errormsg());
    uint64_t s = 88172645463325252ull;
    measure_begin(pool);
    for (uint64_t i = 0; i < n; i++) {
        if (nvh_tx_begin(pool) != NVH_OK) die("nvh_tx_begin", nvh_errormsg());
        for (unsigned w = 0; w < words; w++) {
            uint64_t *p = &arr[xs(&s) % UPDATE_WORDS];
            if (how == U_WORD) {
                if (nvh_tx_add_range_hint(pool, p, 8, NVH_TX_HINT_WORD) != NVH_OK)
                    die("nvh_tx_add_range_hint", nvh_errormsg());
                *p += 1;
            } else if (nvh_tx_write_word(pool, p, nvh_tx_read_word(pool, p) + 1) != NVH_OK) {
                die("nvh_tx_write_word", nvh_errormsg());
            }
        }
        if (nvh_tx_commit(pool) != NVH_OK) die("nvh_tx_commit", nvh_errormsg());
    }
    measure_end(pool);
    nvh_pool_close(pool);
}

#ifdef NVH_CACHESIM_PMDK
typedef struct upd_op { uint64_t *arr, *s; unsigned words; } upd_op;

static void upd_body(void *arg)
{
    upd_op *a = arg;
    for (unsigned w = 0; w < a->words; w++) {
        uint64_t *p = &a->arr[xs(a->s) % UPDATE_WORDS];
        pmemobj_tx_add_range_direct(p, 8);
        *p += 1;
    }
}

static int pmdk_update_one(PMEMobjpool *pop, uint64_t *arr, uint64_t *s, unsigned words)
{
    upd_op a = {arr, s, words};
    return pmdk_tx(pop, upd_body, &a);
}

static void update_pmdk(uint64_t n, const char *dir, unsigned words)
{
    PMEMobjpool *pop = pmdk_pool(dir, 64 * MIB + UPDATE_WORDS * 8);
    PMEMoid root = pmemobj_root(pop, UPDATE_WORDS * 8);
    if (OID_IS_NULL(root)) die("pmemobj_root", pmemobj_errormsg());
    uint64_t *arr = pmemobj_direct(root);
    uint64_t s = 88172645463325252ull;
    measure_begin(NULL);
    for (uint64_t i = 0; i < n; i++)
        if (pmdk_update_one(pop, arr, &s, words)) die("pmdk update", pmemobj_errormsg());
    measure_end(NULL);
    pmemobj_close(pop);
}
#endif

/* --list: every WORKLOAD SUBJECT pair this build runs (tests/bench runs each) */
static void list_pairs(void)
{
    static const char *const pairs[] = {
        "alloc nvheap", "alloc glibc", "free nvheap", "free glibc",
        "hash-insert nvheap-word", "hash-insert nvheap-object", "hash-insert nvheap-hybrid",
        "hash-insert volatile", "hash-delete nvheap-word", "hash-delete nvheap-object",
        "hash-delete nvheap-hybrid", "hash-delete volatile",
        "update-1 nvheap-redo", "update-1 nvheap-undo", "update-1 nvheap-word",
        "update-4 nvheap-redo", "update-4 nvheap-undo", "update-4 nvheap-word",
#ifdef NVH_CACHESIM_PMDK
        "alloc pmdk", "free pmdk", "hash-insert pmdk", "hash-delete pmdk", "update-1 pmdk",
        "update-4 pmdk",
#endif
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) printf("%s\n", pairs[i]);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        list_pairs();
        return 0;
    }
    if (argc != 5) {
        fprintf(stderr, "usage: cachesim_driver WORKLOAD SUBJECT N DIR\n");
        return 2;
    }
    const char *wl = argv[1], *sub = argv[2], *dir = argv[4];
    uint64_t n = strtoull(argv[3], NULL, 0);
    if (n == 0) die("N", "must be > 0");
    atexit(remove_pools);
    int is_pmdk = !strcmp(sub, "pmdk");
#ifdef NVH_CACHESIM_PMDK
    if (is_pmdk) pmdk_count_init("cachesim_driver");
#else
    if (is_pmdk) die("pmdk", "this driver was built without libpmemobj");
#endif
    int known = 1;
    if (!strcmp(wl, "alloc") || !strcmp(wl, "free")) {
        int f = !strcmp(wl, "free");
        if (!strcmp(sub, "nvheap")) alloc_nvheap(n, dir, f);
        else if (!strcmp(sub, "glibc")) alloc_glibc(n, f);
#ifdef NVH_CACHESIM_PMDK
        else if (is_pmdk) alloc_pmdk(n, dir, f);
#endif
        else known = 0;
    } else if (!strcmp(wl, "hash-insert") || !strcmp(wl, "hash-delete")) {
        int del = !strcmp(wl, "hash-delete");
        if (!strcmp(sub, "nvheap-word")) hash_nvheap(n, dir, NVH_TX_HINT_WORD, del);
        else if (!strcmp(sub, "nvheap-object")) hash_nvheap(n, dir, NVH_TX_HINT_OBJECT, del);
        else if (!strcmp(sub, "nvheap-hybrid")) hash_nvheap(n, dir, NVH_TX_HINT_AUTO, del);
        else if (!strcmp(sub, "volatile")) hash_volatile(n, del);
#ifdef NVH_CACHESIM_PMDK
        else if (is_pmdk) hash_pmdk(n, dir, del);
#endif
        else known = 0;
    } else if (!strcmp(wl, "update-1") || !strcmp(wl, "update-4")) {
        unsigned words = wl[7] == '4' ? 4 : 1;
        if (!strcmp(sub, "nvheap-redo")) update_nvheap(n, dir, words, U_REDO);
        else if (!strcmp(sub, "nvheap-undo")) update_nvheap(n, dir, words, U_UNDO);
        else if (!strcmp(sub, "nvheap-word")) update_nvheap(n, dir, words, U_WORD);
#ifdef NVH_CACHESIM_PMDK
        else if (is_pmdk) update_pmdk(n, dir, words);
#endif
        else known = 0;
    } else {
        known = 0;
    }
    if (!known) die(wl, "unknown workload or subject");
    printf("counts %llu %llu\n", (unsigned long long)g_lines, (unsigned long long)g_fences);
    return 0;
}
