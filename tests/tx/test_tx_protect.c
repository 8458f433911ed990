/* test_tx_protect.c — transactions on a pool with stray-write protection on
 * (docs/PROTECT.md, docs/TX.md "Write windows"): long random runs of word,
 * range and object transactions with transactional alloc/free, aborts and
 * persistent locks, in sync and async mode, must report no stray write —
 * every library store (log records, commit and retire marks, undo, applied
 * object copies, lock words) and every application store into an added
 * range or a transactionally allocated object is inside a window. A store
 * outside a transaction is still caught, and the windows close at commit
 * and abort. */
#include "test_util.h"
#include "protect/protect.h"

#include <signal.h>
#include <sys/wait.h>
#include <stdbool.h>

#define LAYOUT "txprotect"
#define MIB ((uint64_t)1 << 20)
#define NOBJ 64u
#define OBJ 256u
#define NSLOT 32u

/* Stray handler: counts, remembers the first offset, lets the store go on
 * (async-signal-safe: atomics only). */
static _Atomic uint64_t g_strays, g_first_off;
static nvh_stray_action on_stray(const nvh_stray_info *info, void *arg)
{
    (void)arg;
    if (atomic_fetch_add(&g_strays, 1) == 0) atomic_store(&g_first_off, info->offset);
    return NVH_STRAY_ALLOW;
}

typedef struct root {
    nvh_off_t obj[NOBJ];        /* fixed objects (allocated before protection) */
    nvh_off_t slot[NSLOT];      /* objects allocated/freed by transactions     */
    nvh_plock lock;
} root;

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* One random transaction; `mirror` tracks what the fixed objects must hold
 * and `slots` which slots are in use. */
static void one_tx(nvh_pool *pool, root *r, uint8_t (*mirror)[OBJ], bool *slots, uint64_t *s)
{
    uint8_t save[4][OBJ];
    unsigned touched[4], nt = 0;
    bool abort_it = rnd(s) % 5 == 0;
    bool slot_before[NSLOT];
    nvh_off_t slotv_before[NSLOT];
    memcpy(slot_before, slots, sizeof slot_before);
    memcpy(slotv_before, r->slot, sizeof slotv_before);
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    unsigned nops = 1 + (unsigned)(rnd(s) % 4);
    for (unsigned k = 0; k < nops; k++) {
        unsigned i = (unsigned)(rnd(s) % NOBJ);
        uint8_t *o = nvh_ptr(pool, r->obj[i]);
        /* one kind of access per object and transaction (an object opened
         * for writing gets its private copy applied at commit, which would
         * overwrite in-place stores made to it through add_range) */
        bool seen = false;
        for (unsigned t = 0; t < nt; t++) seen |= touched[t] == i;
        if (seen || nt == 4) continue;
        touched[nt] = i; memcpy(save[nt], mirror[i], OBJ); nt++;
        switch (rnd(s) % 6) {
        case 0: {                                   /* word record */
            unsigned w = (unsigned)(rnd(s) % (OBJ / 8));
            assert_int_equal(nvh_tx_add_word(pool, (uint64_t *)o + w), NVH_OK);
            ((uint64_t *)o)[w] = rnd(s);
            memcpy(&mirror[i][w * 8], &((uint64_t *)o)[w], 8);
            break;
        }
        case 1: {                                   /* range (object record) */
            unsigned a = (unsigned)(rnd(s) % OBJ), len = 1 + (unsigned)(rnd(s) % (OBJ - a));
            assert_int_equal(nvh_tx_add_range(pool, o + a, len), NVH_OK);
            memset(o + a, (int)(rnd(s) & 0xff), len);
            memcpy(&mirror[i][a], o + a, len);
            break;
        }
        case 2: {                                   /* object transaction */
            uint8_t *c = nvh_tx_open_write(pool, o, OBJ);
            assert_non_null(c);
            c[rnd(s) % OBJ] ^= 0x5a;
            memcpy(mirror[i], c, OBJ);
            break;
        }
        case 3: {                                   /* transactional alloc */
            unsigned sl = (unsigned)(rnd(s) % NSLOT);
            if (slots[sl]) break;
            uint64_t *n = nvh_tx_alloc(pool, 64 + rnd(s) % 512);
            assert_non_null(n);
            n[0] = 0xabcdef;                        /* the caller writes the new object */
            assert_int_equal(nvh_tx_add_word(pool, &r->slot[sl]), NVH_OK);
            r->slot[sl] = nvh_off(pool, n);
            slots[sl] = true;
            break;
        }
        case 4: {                                   /* transactional free */
            unsigned sl = (unsigned)(rnd(s) % NSLOT);
            if (!slots[sl]) break;
            assert_int_equal(nvh_tx_free(pool, nvh_ptr(pool, r->slot[sl])), NVH_OK);
            assert_int_equal(nvh_tx_add_word(pool, &r->slot[sl]), NVH_OK);
            r->slot[sl] = 0;
            slots[sl] = false;
            break;
        }
        default: {                                  /* several ranges, one call */
            unsigned j = (unsigned)(rnd(s) % NOBJ);
            uint8_t *p = nvh_ptr(pool, r->obj[j]);
            nvh_tx_range rg[2] = {{o, 16, NVH_TX_HINT_AUTO}, {p + 64, 8, NVH_TX_HINT_WORD}};
            if (j != i) {
                bool seen_j = false;
                for (unsigned t = 0; t < nt; t++) seen_j |= touched[t] == j;
                if (seen_j || nt == 4) j = i;     /* just the one range */
                else { touched[nt] = j; memcpy(save[nt], mirror[j], OBJ); nt++; }
            }
            assert_int_equal(nvh_tx_add_ranges(pool, rg, j != i ? 2 : 1), NVH_OK);
            memset(o, 7, 16);
            memcpy(mirror[i], o, 16);
            if (j != i) { p[64] ^= 1; mirror[j][64] = p[64]; }
            break;
        }
        }
    }
    if (abort_it) {
        assert_int_equal(nvh_tx_abort(pool), NVH_OK);
        for (unsigned t = nt; t-- > 0;) memcpy(mirror[touched[t]], save[t], OBJ);
        memcpy(slots, slot_before, sizeof slot_before);
        assert_memory_equal(r->slot, slotv_before, sizeof slotv_before);
    } else {
        assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    }
    /* a persistent lock in the pool, now and then */
    if (rnd(s) % 8 == 0) {
        assert_int_equal(nvh_plock_acquire(pool, &r->lock), NVH_OK);
        assert_int_equal(nvh_plock_release(pool, &r->lock), NVH_OK);
    }
}

static void random_run(nvh_protect_mode mode, uint64_t interval, unsigned ntx)
{
    const char *path = test_path("txprotect");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 32 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    root *r = nvh_root(pool, NULL);
    assert_non_null(r);
    static uint8_t mirror[NOBJ][OBJ];
    bool slots[NSLOT] = {false};
    for (unsigned i = 0; i < NOBJ; i++) {
        uint8_t *o = nvh_alloc(pool, OBJ, NULL, NULL, NULL);
        assert_non_null(o);
        memset(o, (int)i, OBJ);
        memcpy(mirror[i], o, OBJ);
        r->obj[i] = nvh_off(pool, o);
    }
    /* one transaction before protection: the log directory exists */
    assert_int_equal(nvh_tx_begin(pool), NVH_OK);
    assert_int_equal(nvh_tx_add_word(pool, &r->slot[0]), NVH_OK);
    assert_int_equal(nvh_tx_commit(pool), NVH_OK);
    nvh_persist(pool, r, sizeof *r);
    atomic_store(&g_strays, 0);
    assert_int_equal(nvh_protect_set_stray_handler(pool, on_stray, NULL), NVH_OK);
    assert_int_equal(nvh_protect_set_mode(pool, mode, interval), NVH_OK);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ mode;
    for (unsigned t = 0; t < ntx; t++) {
        one_tx(pool, r, mirror, slots, &s);
        if (atomic_load(&g_strays)) {
            fprintf(stderr, "stray write at pool offset 0x%llx during transaction %u\n",
                    (unsigned long long)atomic_load(&g_first_off), t);
            break;
        }
    }
    assert_int_equal(nvh_protect_sync(pool), NVH_OK);
    nvh_protect_stats st;
    assert_int_equal(nvh_protect_stats_get(pool, &st), NVH_OK);
    print_message("  %s: %u transactions, %llu mprotect calls, %llu faults resolved, %llu strays\n",
                  mode == NVH_PROTECT_SYNC ? "sync" : "async", ntx,
                  (unsigned long long)st.mprotect_calls, (unsigned long long)st.faults_resolved,
                  (unsigned long long)st.strays);
    assert_int_equal(atomic_load(&g_strays), 0);
    assert_int_equal(st.strays, 0);
    assert_int_equal(st.unbalanced, 0);
    for (unsigned i = 0; i < NOBJ; i++)
        assert_memory_equal(nvh_ptr(pool, r->obj[i]), mirror[i], OBJ);
    /* the windows closed with the transactions: the objects are read-only
     * again (sync: at once; async: after a flush), a plain store is a stray */
    if (mode == NVH_PROTECT_SYNC) {
        uint8_t *o = nvh_ptr(pool, r->obj[0]);
        o[0] ^= 1;
        assert_int_equal(atomic_load(&g_strays), 1);
        nvh_protect(pool, o, 1);                    /* the window ALLOW opened */
    }
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_OFF, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* everything committed is there after a reopen, nothing to recover */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    r = nvh_root(pool, NULL);
    for (unsigned i = 1; i < NOBJ; i++)
        assert_memory_equal(nvh_ptr(pool, r->obj[i]), mirror[i], OBJ);
    nvh_tx_stats ts;
    assert_int_equal(nvh_tx_stats_get(pool, &ts), NVH_OK);
    assert_int_equal(ts.recovered, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void run_sync(void **state) { (void)state; random_run(NVH_PROTECT_SYNC, 0, 600); }
static void run_async(void **state) { (void)state; random_run(NVH_PROTECT_ASYNC, 200000, 3000); }

/* Recovery at open runs inside an implicit window: a crashed transaction is
 * undone on a pool the environment protects from the start. */
static void recovery_protected(void **state)
{
    (void)state;
    const char *path = test_path("txprotrec");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 16 * MIB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    uint64_t *w = nvh_alloc(pool, 64, NULL, NULL, NULL);
    *w = 1;
    nvh_persist(pool, w, 8);
    nvh_off_t off = nvh_off(pool, w);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {                        /* crash in the middle of a transaction */
        nvh_pool *c = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        if (!c) _exit(2);
        uint64_t *cw = nvh_ptr(c, off);
        if (nvh_tx_begin(c) != NVH_OK || nvh_tx_add_word(c, cw) != NVH_OK) _exit(3);
        *cw = 2;
        nvh_persist(c, cw, 8);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    setenv("NVHEAP_PROTECT", "sync", 1);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    unsetenv("NVHEAP_PROTECT");
    assert_non_null(pool);
    assert_int_equal(nvh_protect_get_mode(pool), NVH_PROTECT_SYNC);
    assert_int_equal(*(uint64_t *)nvh_ptr(pool, off), 1);
    nvh_tx_stats ts;
    assert_int_equal(nvh_tx_stats_get(pool, &ts), NVH_OK);
    assert_int_equal(ts.recovered, 1);
    nvh_protect_stats st;
    assert_int_equal(nvh_protect_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.strays, 0);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_OFF, 0), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(run_sync),
        cmocka_unit_test(run_async),
        cmocka_unit_test(recovery_protected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
