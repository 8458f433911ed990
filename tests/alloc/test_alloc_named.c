/* test_alloc_named.c — the object tables grow past table 0's NVH_NAMED_CAP
 * entries: many names survive reopen and are found, deleted and reused; a
 * crash at every fence of a growth step recovers the tables before or after
 * the growth with every acknowledged name; a damaged directory word makes
 * open fail with NVH_E_CORRUPT naming it, never a signal; the tables are not
 * user objects (nvh_heap_foreach and nvh_heap_stats_get skip them). Open
 * indexes table 0 only: lookups, deletes, creates and frees right after
 * open, before and while the background build runs (one thread and
 * several), give the answers the whole index gives, and leave the DRAM
 * state equal to a full build's; a reservation given back inside another
 * name's chain leaves no hole that would hide that name. */
#include "test_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "alloc/alloc.h"      /* white-box: directory words, NVH_NAMED_CAP */

#define LAYOUT "named"

static uint64_t heap_off;

static void name_of(char *buf, size_t n, int i) { snprintf(buf, n, "object-%07d", i); }

static uint64_t tag_of(int i, int gen) { return (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)gen; }

static int create(nvh_pool *pool, int i, int gen)
{
    char name[32];
    name_of(name, sizeof name, i);
    uint64_t *p = nvh_reserve_named(pool, name, 16);
    if (!p) return -1;
    p[0] = tag_of(i, gen);
    nvh_persist(pool, p, 8);
    return nvh_activate_named(pool, name);
}

static bool found(nvh_pool *pool, int i, int gen)
{
    char name[32];
    name_of(name, sizeof name, i);
    uint64_t *p = nvh_get_named(pool, name, NULL);
    return p && p[0] == tag_of(i, gen);
}

static int count_fn(void *ptr, size_t usable, void *arg)
{
    (void)ptr;
    (void)usable;
    ++*(long *)arg;
    return 0;
}

static int count_named(const char *name, void *ptr, size_t size, void *arg)
{
    (void)name; (void)ptr; (void)size;
    ++*(long *)arg;
    return 0;
}

static nvh_pool *make(const char *path, size_t size)
{
    unlink(path);
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, size, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    heap_off = info.heap_offset;
    return pool;
}

/* ---------------------------------------------------------------------------
 * 100,000 names: create, reopen, find all, delete a third, reuse
 * ------------------------------------------------------------------------- */
#define MANY 100000
static int gen_of[MANY];

static void many_names(void **state)
{
    (void)state;
    const char *path = test_path("named_many");
    nvh_pool *pool = make(path, (size_t)64 << 20);
    for (int i = 0; i < MANY; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) assert_true(found(pool, i, 0));
    char name[32];
    name_of(name, sizeof name, 0);
    assert_null(nvh_reserve_named(pool, name, 8));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_null(nvh_get_named(pool, "object-none", NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    /* the tables are the heap's metadata, not user objects */
    long objs = 0, named = 0;
    assert_int_equal(nvh_heap_foreach(pool, count_fn, &objs), NVH_OK);
    assert_int_equal(nvh_named_foreach(pool, count_named, &named), NVH_OK);
    assert_int_equal(objs, MANY);
    assert_int_equal(named, MANY);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, MANY);
    for (int i = 0; i < MANY; i += 3) {
        name_of(name, sizeof name, i);
        assert_int_equal(nvh_free_named(pool, name), NVH_OK);
        assert_null(nvh_get_named(pool, name, NULL));
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) {
        if (i % 3 == 0) {
            name_of(name, sizeof name, i);
            assert_null(nvh_get_named(pool, name, NULL));
            assert_int_equal(create(pool, i, 1), NVH_OK);
            gen_of[i] = 1;
        }
    }
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < MANY; i++) assert_true(found(pool, i, gen_of[i]));
    named = 0;
    assert_int_equal(nvh_named_foreach(pool, count_named, &named), NVH_OK);
    assert_int_equal(named, MANY);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * Crash at every fence of a growth step
 * ------------------------------------------------------------------------- */
#define PRE 767                 /* table 0 one name short of 3/4 full */
#define MORE 3                  /* the second of these adds table 1   */
static volatile int g_acked;    /* names acknowledged (seen by the crash child) */

static int grow_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    for (int i = PRE; i < PRE + MORE; i++) {
        if (create(pool, i, 0) != NVH_OK) return 1;
        g_acked = i + 1;
    }
    return 0;
}

static int grow_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)pt; (void)arg;
    uint64_t dir1 = 1;
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) return 1;
    int acked = g_acked, rc = 0;
    for (int i = 0; i < acked && !rc; i++)
        if (!found(pool, i, 0)) rc = 2;
    long named = 0;
    if (!rc && nvh_named_foreach(pool, count_named, &named) != NVH_OK) rc = 3;
    if (!rc && named != acked && named != acked + 1) rc = 4;
    /* table 1 exists exactly when a name needed it (before or after growth) */
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    if (!rc && named > PRE + 1 && dir1 == 0) rc = 5;
    long objs = 0;
    if (!rc && (nvh_heap_foreach(pool, count_fn, &objs) != NVH_OK || objs != named)) rc = 6;
    /* growth completes after recovery too */
    for (int i = PRE + MORE; i < PRE + MORE + 2 && !rc; i++)
        if (!found(pool, i, 0) && create(pool, i, 0) != NVH_OK) rc = 7;
    nvh_pool_close(pool);
    return rc;
}

static void grow_crash(void **state)
{
    (void)state;
    const char *path = test_path("named_grow");
    nvh_pool *pool = make(path, (size_t)4 << 20);
    for (int i = 0; i < PRE; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    uint64_t dir1 = 1;
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_equal(dir1, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (int mode = 0; mode < 2; mode++) {
        g_acked = PRE;
        nvh_crash_config cfg = {
            .pool_path = path, .layout = LAYOUT, .workload = grow_workload,
            .check = grow_check, .seed = 23 + (uint64_t)mode,
            .mode = mode ? NVH_CRASH_WORDS : NVH_CRASH_LINES, .images_per_point = 2,
        };
        test_crash_explore(&cfg);
    }
    /* the workload's own run grew the table: check it on the real pool */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < PRE + MORE; i++) create(pool, i, 0);
    memcpy(&dir1, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_not_equal(dir1, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * A damaged directory word
 * ------------------------------------------------------------------------- */
static void damaged_directory(void **state)
{
    (void)state;
    const char *path = test_path("named_dir");
    nvh_pool *pool = make(path, (size_t)8 << 20);
    for (int i = 0; i < 2000; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    uint64_t good;
    memcpy(&good, (char *)nvh_pool_base(pool) + heap_off + NVH_NAMED_DIR_OFF, 8);
    assert_int_not_equal(good, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    const uint64_t bad[] = {good ^ 0x40, good + 4096, 0x123457, ~0ull, 4096};
    for (unsigned b = 0; b < sizeof bad / sizeof bad[0] + 1; b++) {
        if (b < sizeof bad / sizeof bad[0]) {
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &bad[b], 8);
        } else {        /* table 2 without table 1 */
            uint64_t zero = 0;
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &zero, 8);
            test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF + 8), &good, 8);
        }
        /* the transaction layer looks up its log directory by name at
         * open: a pool whose names cannot be trusted does not open */
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (pool) fail_msg("case %u: opened with a damaged directory word", b);
        assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
        assert_non_null(strstr(nvh_errormsg(), "object table directory word"));
        uint64_t zero = 0;
        test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF + 8), &zero, 8);
        test_poke(path, (off_t)(heap_off + NVH_NAMED_DIR_OFF), &good, 8);
    }
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    for (int i = 0; i < 2000; i++) assert_true(found(pool, i, 0));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---------------------------------------------------------------------------
 * The lazy index
 * ------------------------------------------------------------------------- */
#define LAZY 20000              /* tables 0..4 */
#define LAZY_THREADS 4

static nvh_heap *heap_of(nvh_pool *pool) { return pool->heap; }

static bool index_ready(nvh_pool *pool)
{
    return atomic_load(&heap_of(pool)->named_ready);
}

/* The DRAM state equals what a full build of the media gives. */
static void check_dram(nvh_pool *pool, long expect)
{
    nvh_heap *h = heap_of(pool);
    pthread_mutex_lock(&h->named_lock);
    assert_true(atomic_load(&h->named_ready));
    uint32_t used[NVH_NAMED_TABLES] = {0};
    long live = 0;
    for (uint32_t s = 0; s < nvh_named_table_first(h->ntables); s++) {
        struct nvh_named_entry *e = nvh_named_entry_at(h, s);
        uint64_t w = atomic_load(&e->off);
        if ((w == 0 && e->name[0] == '\0') || w == NVH_NAMED_TOMB) continue;
        used[nvh_named_table_of(s)]++;
        live++;
    }
    assert_int_equal(live, expect);
    for (unsigned k = 0; k < NVH_NAMED_TABLES; k++) assert_int_equal(used[k], h->nused[k]);
    assert_int_equal(h->nidx_n, expect);
    assert_int_equal(atomic_load(&h->named_n), expect);
    pthread_mutex_unlock(&h->named_lock);
}

static nvh_pool *open_held(const char *path)
{
    atomic_store(&nvh_named_build_hold_, 1);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    return pool;
}

/* A closed pool holding the names 0..LAZY-1 (generation 0). */
static void make_lazy(const char *path)
{
    nvh_pool *pool = make(path, (size_t)32 << 20);
    for (int i = 0; i < LAZY; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
}

static void lazy_single(void **state)
{
    (void)state;
    const char *path = test_path("named_lazy");
    make_lazy(path);
    nvh_pool *pool = open_held(path);
    /* open indexed table 0 only */
    assert_false(index_ready(pool));
    assert_true(heap_of(pool)->nidx_n <= NVH_NAMED_CAP);
    char name[32];
    /* hits, and misses proven on the chains: no index needed */
    for (int i = 0; i < LAZY; i += 7) assert_true(found(pool, i, 0));
    assert_null(nvh_get_named(pool, "object-none", NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    /* deletes in indexed and not yet indexed slots */
    long live = LAZY;
    for (int i = 0; i < LAZY; i += 5) {
        name_of(name, sizeof name, i);
        assert_int_equal(nvh_free_named(pool, name), NVH_OK);
        assert_null(nvh_get_named(pool, name, NULL));
        assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
        live--;
    }
    assert_false(index_ready(pool));
    /* nvh_free must know every named object: the first completes the set
     * of their offsets, not the index (a named object not indexed yet is
     * refused, an unnamed one freed) */
    name_of(name, sizeof name, LAZY - 1);
    void *p = nvh_get_named(pool, name, NULL);
    assert_non_null(p);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_INVAL);
    assert_false(index_ready(pool));
    for (int i = 0; i < 8; i++) {
        void *q = nvh_reserve(pool, 16);
        assert_non_null(q);
        assert_int_equal(nvh_activate(pool, q, NULL, 0), NVH_OK);
        assert_int_equal(nvh_free(pool, q, NULL, 0), NVH_OK);
    }
    assert_false(index_ready(pool));
    /* the set is kept by deletes and creates in slots not indexed yet */
    name_of(name, sizeof name, LAZY - 2);
    void *p2 = nvh_get_named(pool, name, NULL);
    assert_non_null(p2);
    assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    live--;
    assert_int_equal(create(pool, LAZY + 100, 0), NVH_OK);
    live++;
    name_of(name, sizeof name, LAZY + 100);
    void *p3 = nvh_get_named(pool, name, NULL);
    assert_int_equal(nvh_free(pool, p3, NULL, 0), NVH_E_INVAL);
    assert_false(index_ready(pool));
    atomic_store(&nvh_named_build_hold_, 0);
    while (!index_ready(pool)) usleep(1000);
    assert_int_equal(nvh_free(pool, p, NULL, 0), NVH_E_INVAL);
    check_dram(pool, live);
    assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    live--;
    name_of(name, sizeof name, LAZY - 2);
    assert_int_equal(create(pool, LAZY - 2, 0), NVH_OK);
    live++;
    check_dram(pool, live);
    name_of(name, sizeof name, 3);
    assert_null(nvh_reserve_named(pool, name, 8));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    /* creates reuse the deleted slots */
    for (int i = 0; i < LAZY; i += 5) assert_int_equal(create(pool, i, 1), NVH_OK);
    check_dram(pool, LAZY);
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* creates right after open do not wait for the index: a miss proven on
     * the chains, a slot on the chain in the last table; then found before
     * and after the build, counted by it */
    pool = open_held(path);
    assert_false(index_ready(pool));
    for (int i = LAZY; i < LAZY + 50; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    assert_false(index_ready(pool));
    for (int i = LAZY; i < LAZY + 50; i++) assert_true(found(pool, i, 0));
    name_of(name, sizeof name, LAZY + 7);
    assert_null(nvh_reserve_named(pool, name, 8));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    name_of(name, sizeof name, LAZY + 9);
    assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    assert_false(index_ready(pool));
    atomic_store(&nvh_named_build_hold_, 0);
    while (!index_ready(pool)) usleep(1000);
    check_dram(pool, LAZY + 49);
    assert_int_equal(create(pool, LAZY + 9, 0), NVH_OK);
    check_dram(pool, LAZY + 50);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = open_held(path);
    for (int i = LAZY; i < LAZY + 50; i++) assert_true(found(pool, i, 0));
    for (int i = LAZY; i < LAZY + 49; i++) {
        name_of(name, sizeof name, i);
        assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    }
    name_of(name, sizeof name, LAZY + 49);
    assert_int_equal(nvh_free_named(pool, name), NVH_OK);
    assert_int_equal(create(pool, LAZY, 0), NVH_OK);
    atomic_store(&nvh_named_build_hold_, 0);
    while (!index_ready(pool)) usleep(1000);
    check_dram(pool, LAZY + 1);
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* chains of unknown soundness (a pool last written by older code: the
     * chains word is stale): a miss completes the index — the transaction
     * layer's lookup of its directory at open is one — answers agree */
    uint64_t zero = 0;
    test_poke(path, (off_t)(heap_off + NVH_NAMED_CHAINS_OFF), &zero, 8);
    pool = open_held(path);
    assert_true(index_ready(pool));         /* built at open, chains sealed */
    assert_true(heap_of(pool)->chains_sound);
    assert_true(found(pool, 5, 1));
    assert_null(nvh_get_named(pool, "object-none", NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    for (int i = 0; i <= LAZY; i++) assert_true(found(pool, i, i % 5 == 0 && i < LAZY ? 1 : 0));
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* that session's build sealed the chains and vouched for them */
    pool = open_held(path);
    assert_true(heap_of(pool)->chains_sound);
    assert_false(index_ready(pool));
    assert_true(found(pool, LAZY - 1, 0));
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Reservations made before the build reaches their slots (creates right
 * after open place on the last table's chain), activated or cancelled after
 * it passed them, one of them sealed into a tombstone by the activation of
 * a later name on its chain: the fill counts still equal a full build's. */
static uint32_t home_in(const char *name, unsigned k)
{
    return nvh_crc32c(0x4E414D45u, name, strlen(name)) & ((NVH_NAMED_CAP << k) - 1);
}

static void lazy_pending(void **state)
{
    (void)state;
    const char *path = test_path("named_lazy_pending");
    make_lazy(path);
    nvh_pool *pool = open_held(path);
    unsigned last = heap_of(pool)->ntables - 1;
    assert_true(last >= 2);
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, "pending-a");
    snprintf(c, sizeof c, "pending-c");
    int j = 0;
    do snprintf(b, sizeof b, "pending-b-%d", j++); while (home_in(b, last) != home_in(a, last));
    void *pa = nvh_reserve_named(pool, a, 16);
    void *pb = nvh_reserve_named(pool, b, 16);
    void *pc = nvh_reserve_named(pool, c, 16);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_non_null(pc);
    assert_int_equal(nvh_activate_named(pool, b), NVH_OK);   /* seals a's slot */
    assert_false(index_ready(pool));
    atomic_store(&nvh_named_build_hold_, 0);
    while (!index_ready(pool)) usleep(1000);
    assert_int_equal(nvh_activate_named(pool, a), NVH_OK);
    assert_int_equal(nvh_cancel(pool, pc), NVH_OK);
    check_dram(pool, LAZY + 2);
    assert_non_null(nvh_get_named(pool, a, NULL));
    assert_non_null(nvh_get_named(pool, b, NULL));
    assert_null(nvh_get_named(pool, c, NULL));
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Several threads right after open while the build runs: each owns the
 * names i = t (mod LAZY_THREADS) and looks them up, deletes a third, checks
 * them gone, creates them again, adds new ones, and frees an unnamed object. */
static pthread_barrier_t lazy_barrier;

static void *lazy_thread(void *arg)
{
    nvh_pool *pool = ((void **)arg)[0];
    int t = (int)(intptr_t)((void **)arg)[1], bad = 0;
    pthread_barrier_wait(&lazy_barrier);
    char name[32];
    for (int i = t; i < LAZY && !bad; i += LAZY_THREADS) {
        if (!found(pool, i, 0)) bad = 1;
        if (i % 3) continue;
        name_of(name, sizeof name, i);
        if (nvh_free_named(pool, name) != NVH_OK) bad = 2;
        if (nvh_get_named(pool, name, NULL) || nvh_errcode() != NVH_E_NOTFOUND) bad = 3;
        if (create(pool, i, 1) != NVH_OK || !found(pool, i, 1)) bad = 4;
    }
    for (int i = LAZY + t; i < LAZY + 400 && !bad; i += LAZY_THREADS)
        if (create(pool, i, 0) != NVH_OK) bad = 5;
    void *p = nvh_reserve(pool, 32);
    if (!p || nvh_activate(pool, p, NULL, 0) != NVH_OK || nvh_free(pool, p, NULL, 0) != NVH_OK)
        bad = 6;
    return (void *)(intptr_t)bad;
}

static void lazy_threads(void **state)
{
    (void)state;
    const char *path = test_path("named_lazy_mt");
    make_lazy(path);
    nvh_pool *pool;

    for (int round = 0; round < 2; round++) {
        if (round == 1) {       /* the names back at generation 0 */
            pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
            assert_non_null(pool);
            char name[32];
            for (int i = 0; i < LAZY; i += 3) {
                name_of(name, sizeof name, i);
                assert_int_equal(nvh_free_named(pool, name), NVH_OK);
                assert_int_equal(create(pool, i, 0), NVH_OK);
            }
            for (int i = LAZY; i < LAZY + 400; i++) {
                name_of(name, sizeof name, i);
                assert_int_equal(nvh_free_named(pool, name), NVH_OK);
            }
            assert_int_equal(nvh_pool_close(pool), NVH_OK);
        }
        /* round 0: the build starts with the threads; round 1: it waits
         * until they are done, so every call meets the partial index */
        pool = open_held(path);
        assert_false(index_ready(pool));
        pthread_barrier_init(&lazy_barrier, NULL, LAZY_THREADS + 1);
        pthread_t th[LAZY_THREADS];
        void *args[LAZY_THREADS][2];
        for (int t = 0; t < LAZY_THREADS; t++) {
            args[t][0] = pool;
            args[t][1] = (void *)(intptr_t)t;
            assert_int_equal(pthread_create(&th[t], NULL, lazy_thread, args[t]), 0);
        }
        if (round == 0) atomic_store(&nvh_named_build_hold_, 0);
        pthread_barrier_wait(&lazy_barrier);
        for (int t = 0; t < LAZY_THREADS; t++) {
            void *r;
            pthread_join(th[t], &r);
            if (r) fail_msg("round %d thread %d: step %d failed", round, t, (int)(intptr_t)r);
        }
        pthread_barrier_destroy(&lazy_barrier);
        atomic_store(&nvh_named_build_hold_, 0);
        check_dram(pool, LAZY + 400);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        for (int i = 0; i < LAZY + 400; i++)
            assert_true(found(pool, i, i < LAZY && i % 3 == 0 ? 1 : 0));
        long named = 0;
        assert_int_equal(nvh_named_foreach(pool, count_named, &named), NVH_OK);
        assert_int_equal(named, LAZY + 400);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
    }
    unlink(path);
}

/* Two names with the same home slot: A reserved (pending), B placed after
 * it and activated, A given back. A's slot must not be left empty inside
 * B's chain: after reopen, B is found before the index is built. */
static uint32_t home_of(const char *name) { return home_in(name, 0); }

static void chain_hole(void **state)
{
    (void)state;
    const char *path = test_path("named_hole");
    nvh_pool *pool = make(path, (size_t)8 << 20);
    char a[32], b[32];
    snprintf(a, sizeof a, "hole-a");
    int j = 0;
    do snprintf(b, sizeof b, "hole-b-%d", j++); while (home_of(b) != home_of(a));
    void *pa = nvh_reserve_named(pool, a, 16);
    assert_non_null(pa);
    uint64_t *pb = nvh_reserve_named(pool, b, 16);
    assert_non_null(pb);
    *pb = 77;
    nvh_persist(pool, pb, 8);
    assert_int_equal(nvh_activate_named(pool, b), NVH_OK);
    assert_int_equal(nvh_cancel(pool, pa), NVH_OK);
    /* table 1 exists, so that the index is built in the background */
    for (int i = 0; i < 800; i++) assert_int_equal(create(pool, i, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = open_held(path);
    /* the open's own build covered table 0, where both names live: so look
     * at the chain walk directly, as a lookup before the build does */
    assert_true(heap_of(pool)->chains_sound);
    assert_false(index_ready(pool));
    uint64_t *q = nvh_get_named(pool, b, NULL);
    assert_non_null(q);
    assert_int_equal(*q, 77);
    struct nvh_named_entry *e = nvh_named_entry_at(heap_of(pool), home_of(a));
    assert_true(atomic_load(&e->off) == NVH_NAMED_TOMB);
    assert_null(nvh_get_named(pool, a, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_NOTFOUND);
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* the same hole as code without the sealing leaves it, in a pool whose
     * chains word is unset: found (the index is built at open), the hole
     * sealed by that build, and the next session trusts the chains */
    uint64_t zero = 0;
    off_t slot_off = (off_t)(heap_off + 4096 + 64u * home_of(a) + 56);
    test_poke(path, slot_off, &zero, 8);
    test_poke(path, (off_t)(heap_off + NVH_NAMED_CHAINS_OFF), &zero, 8);
    pool = open_held(path);
    assert_true(index_ready(pool));         /* built at open, chains sealed */
    q = nvh_get_named(pool, b, NULL);
    assert_non_null(q);
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pool = open_held(path);
    assert_true(heap_of(pool)->chains_sound);
    e = nvh_named_entry_at(heap_of(pool), home_of(a));
    assert_true(atomic_load(&e->off) == NVH_NAMED_TOMB);
    assert_false(index_ready(pool));
    assert_non_null(nvh_get_named(pool, b, NULL));
    atomic_store(&nvh_named_build_hold_, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_names),
        cmocka_unit_test(grow_crash),
        cmocka_unit_test(damaged_directory),
        cmocka_unit_test(lazy_single),
        cmocka_unit_test(lazy_pending),
        cmocka_unit_test(lazy_threads),
        cmocka_unit_test(chain_hole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
