/* test_btree_protect.c — the B+ tree under stray-write protection ([Moraru11]
 * §6: the tree unprotects a node or record before it writes it and protects
 * it again once the write is durable; docs/PROTECT.md "Per-layer checklist").
 *
 * A long random run (puts of new keys and updates, deletes, lookups, scans,
 * syncs, leaf splits and removals) in every persistent variant with
 * protection on, SYNC and ASYNC, and NO implicit library window around the
 * calls: every store the tree makes into the pool must sit inside a window
 * of its own. A stray handler counts the strays (and lets the store proceed
 * so that the run goes on and every offender is seen); the test demands
 * zero, the data equal to a DRAM model, and every window closed at the end.
 *
 * Strays are classified after the run, to say whose store it was: inside a
 * live heap object (a node, a slab, the tree header: the tree's own store)
 * or outside every object (allocator metadata, src/alloc, which opens its
 * own windows in a change made in parallel with this one). Both fail the
 * test; NVH_BTREE_PROTECT_LENIENT=1 tolerates the second kind (for a build
 * whose allocator has no windows yet). */
#include "btree_test.h"

#include <execinfo.h>

#define MAXSTRAY 64

static volatile uint64_t g_strays;
static uint64_t g_stray_off[MAXSTRAY];

static nvh_stray_action on_stray(const nvh_stray_info *info, void *arg)
{
    (void)arg;
    uint64_t k = __atomic_fetch_add(&g_strays, 1, __ATOMIC_RELAXED);
    if (k < MAXSTRAY) g_stray_off[k] = info->offset;
    if (k < 6 && getenv("BT_STRAY_BT")) {   /* debugging: where (not signal-safe) */
        void *bt[16];
        int n = backtrace(bt, 16);
        backtrace_symbols_fd(bt, n, 2);
    }
    return NVH_STRAY_ALLOW;
}

typedef struct objset {
    uint64_t *lo, *hi;
    size_t n, cap;
} objset;

static int collect(void *ptr, size_t usable, void *arg)
{
    objset *o = arg;
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 1024;
        o->lo = realloc(o->lo, o->cap * sizeof *o->lo);
        o->hi = realloc(o->hi, o->cap * sizeof *o->hi);
        if (!o->lo || !o->hi) abort();
    }
    o->lo[o->n] = (uint64_t)(uintptr_t)ptr;
    o->hi[o->n++] = (uint64_t)(uintptr_t)ptr + usable;
    return 0;
}

static nvh_btree_durability g_durability = NVH_BTREE_DURABLE_DEFERRED;

static void run(nvh_btree_mode bmode, nvh_protect_mode pmode, unsigned nops)
{
    const char *path = test_path("bt-protect");
    nvh_pool *pool = nvh_pool_create(path, BT_LAYOUT, 64u << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_btree_options opt = {.mode = bmode, .durability = g_durability};
    nvh_btree *t = nvh_btree_open(pool, "p", 1, &opt);
    assert_non_null(t);
    g_strays = 0;
    assert_int_equal(nvh_protect_set_stray_handler(pool, on_stray, NULL), NVH_OK);
    int rc = nvh_protect_set_mode(pool, pmode, 200000);
    if (rc == NVH_E_NOTSUP) {            /* e.g. ASan without allow_user_segv_handler */
        nvh_btree_close(t);
        nvh_pool_close(pool);
        unlink(path);
        skip();
    }
    assert_int_equal(rc, NVH_OK);
    uint64_t nkeys = nops / 3;
    bt_model m;
    bt_model_init(&m, nkeys);
    unsigned char buf[300];
    uint64_t del_at = nkeys / 5;
    uint64_t s = 99 + (uint64_t)bmode * 7 + (uint64_t)pmode;
    nvh_btree_stats first = {0};
    for (unsigned k = 0; k < nops; k++) {
        uint64_t r = test_rand(&s), i = r % nkeys, key;
        unsigned what = (unsigned)(r >> 32) % 10;
        /* the last third deletes runs of consecutive keys (whole leaves
         * empty and leave the tree) between the random operations */
        if (k > nops * 2 / 3 && what < 5) {
            i = m.order[del_at++ % nkeys];
            what = 9;
        }
        key = bt_key_of(i);
        if (what < 6) {
            size_t len = bt_value(key, k + 1, buf, (r >> 40) % 4 ? 40 : 280);
            assert_int_equal(nvh_btree_put(t, key, buf, len), NVH_OK);
            if (!m.ver[i]) m.live++;
            m.ver[i] = k + 1;
        } else if (what < 9) {
            const void *v;
            size_t len;
            rc = nvh_btree_get(t, key, &v, &len);
            assert_int_equal(rc, m.ver[i] ? NVH_OK : NVH_E_NOTFOUND);
        } else {
            rc = nvh_btree_delete(t, key);
            assert_int_equal(rc, m.ver[i] ? NVH_OK : NVH_E_NOTFOUND);
            if (m.ver[i]) m.live--;
            m.ver[i] = 0;
        }
        if (k % 997 == 0) assert_int_equal(nvh_btree_sync(t), NVH_OK);
        if (k == nops / 2) {
            /* a new session, protection on: it adopts the current slab
             * (held again) and carves on from its fill bound */
            nvh_btree_stats_get(t, &first);      /* stats are per handle */
            assert_int_equal(nvh_btree_close(t), NVH_OK);
            t = nvh_btree_open(pool, "p", 0, &opt);
            assert_non_null(t);
        }
    }
    assert_int_equal(nvh_btree_sync(t), NVH_OK);
    bt_scan_out o = {0};
    assert_int_equal(nvh_btree_scan(t, 0, UINT64_MAX, bt_scan_cb, &o), NVH_OK);
    /* values of any length up to 280: compare by recomputing each version */
    assert_int_equal(o.n, m.live);
    size_t n = 0;
    for (uint64_t j = 0; j < m.nkeys; j++) {
        uint64_t i = m.order[j];
        if (!m.ver[i]) continue;
        uint64_t key = bt_key_of(i);
        assert_true(n < o.n && o.keys[n] == key);
        unsigned char v1[300];
        /* the version's length bound is encoded in its draw: try both */
        size_t l1 = bt_value(key, m.ver[i], v1, 40);
        int ok = o.hash[n] == bt_hash_bytes(v1, l1);
        if (!ok) {
            l1 = bt_value(key, m.ver[i], v1, 280);
            ok = o.hash[n] == bt_hash_bytes(v1, l1);
        }
        assert_true(ok);
        n++;
    }
    bt_scan_free(&o);
    assert_int_equal(nvh_btree_reclaim(t), NVH_OK);
    assert_int_equal(nvh_btree_check(t), NVH_OK);
    nvh_btree_stats bs;
    nvh_btree_stats_get(t, &bs);
    bs.splits += first.splits;
    bs.leaves_removed += first.leaves_removed;
    bs.slabs += first.slabs;
    bs.slabs_freed += first.slabs_freed;
    assert_int_equal(nvh_btree_close(t), NVH_OK);
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    nvh_protect_stats ps;
    assert_int_equal(nvh_protect_stats_get(pool, &ps), NVH_OK);
    /* classify the strays */
    objset os = {0};
    nvh_heap_foreach(pool, collect, &os);
    uint64_t base = (uint64_t)(uintptr_t)nvh_pool_base(pool), ours = 0, other = 0;
    for (uint64_t k = 0; k < g_strays && k < MAXSTRAY; k++) {
        uint64_t a = base + g_stray_off[k];
        int in = 0;
        for (size_t j = 0; j < os.n && !in; j++) in = a >= os.lo[j] && a < os.hi[j];
        if (in) ours++; else other++;
        if (k < 8) fprintf(stderr, "  stray at offset %#llx (%s)\n", (unsigned long long)g_stray_off[k],
                           in ? "inside a heap object: the tree's store" : "outside every object: allocator metadata");
    }
    free(os.lo);
    free(os.hi);
    printf("  %-7s %-5s %u ops: splits %llu, leaves removed %llu, slabs %llu (freed %llu); "
           "mprotect %llu, strays %llu (tree %llu, allocator %llu), unbalanced %llu\n",
           bmode == NVH_BTREE_GROUPS ? (g_durability == NVH_BTREE_DURABLE_DEFERRED ? "groups" : "durable")
                                     : bmode == NVH_BTREE_FLUSH ? "flush" : "nt",
           pmode == NVH_PROTECT_SYNC ? "sync" : "async", nops, (unsigned long long)bs.splits,
           (unsigned long long)bs.leaves_removed, (unsigned long long)bs.slabs,
           (unsigned long long)bs.slabs_freed, (unsigned long long)ps.mprotect_calls,
           (unsigned long long)g_strays, (unsigned long long)ours, (unsigned long long)other,
           (unsigned long long)ps.unbalanced);
    assert_true(bs.splits >= 5);
    assert_true(bs.leaves_removed > 0);
    assert_int_equal(ours, 0);
    assert_int_equal(ps.unbalanced, 0);
    if (other) {
        fprintf(stderr, "  NOTE: %llu allocator store(s) outside a window (src/alloc)\n",
                (unsigned long long)other);
        const char *lenient = getenv("NVH_BTREE_PROTECT_LENIENT");
        if (!lenient || *lenient != '1') fail_msg("allocator strays (NVH_BTREE_PROTECT_LENIENT=1 tolerates them)");
    } else {
        assert_int_equal(g_strays, 0);
    }
    bt_model_free(&m);
    nvh_pool_close(pool);
    unlink(path);
}

#if defined(__SANITIZE_ADDRESS__)
#define NOPS 3000
#else
#define NOPS 12000
#endif

static void groups_sync(void **s) { (void)s; run(NVH_BTREE_GROUPS, NVH_PROTECT_SYNC, NOPS); }
static void groups_async(void **s) { (void)s; run(NVH_BTREE_GROUPS, NVH_PROTECT_ASYNC, NOPS * 2); }
static void durable_run(nvh_protect_mode pmode, unsigned nops)
{
    g_durability = NVH_BTREE_DURABLE_ON_RETURN;
    run(NVH_BTREE_GROUPS, pmode, nops);
    g_durability = NVH_BTREE_DURABLE_DEFERRED;
}
static void durable_sync(void **s) { (void)s; durable_run(NVH_PROTECT_SYNC, NOPS); }
static void durable_async(void **s) { (void)s; durable_run(NVH_PROTECT_ASYNC, NOPS); }
static void flush_sync(void **s) { (void)s; run(NVH_BTREE_FLUSH, NVH_PROTECT_SYNC, NOPS / 2); }
static void nt_async(void **s) { (void)s; run(NVH_BTREE_NT, NVH_PROTECT_ASYNC, NOPS); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(groups_sync),
        cmocka_unit_test(groups_async),
        cmocka_unit_test(durable_sync),
        cmocka_unit_test(durable_async),
        cmocka_unit_test(flush_sync),
        cmocka_unit_test(nt_async),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
