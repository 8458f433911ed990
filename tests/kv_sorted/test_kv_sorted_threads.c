/* test_kv_sorted_threads.c — the sorted engine used by several threads at
 * once (TSan-clean: this test runs in the thread-sanitizer build too):
 * writers (puts and removes on their own share of the keys — interleaved
 * in key order, so they share leaves, split them and drop them — each
 * keeping an exact model) and 2 readers (gets, seeks, bounded scans) on one
 * kv_sorted; every value a reader sees must be whole (its id and version
 * encoded in it, the rest a pattern of them), scans strictly ascending;
 * at the end the tree equals the writers' models and passes check.
 * parallel_writers: a writer stalled in its fence (a sim-domain fence hook)
 * holds only its own leaf — another writer's put into another leaf
 * completes meanwhile. */
#include "kvs_model.h"

#include <pthread.h>
#include <time.h>

#define LAYOUT "kvsthreads"
#define NKEYS 3000

static kv_sorted *g_t;
static km_model *g_m;
static volatile int g_stop;
static int g_bad;

static size_t tval(uint32_t id, uint32_t ver, uint8_t *buf)
{
    size_t len = 8 + (id * 7u + ver * 13u) % 300u;
    memcpy(buf, &id, 4);
    memcpy(buf + 4, &ver, 4);
    for (size_t i = 8; i < len; i++) buf[i] = (uint8_t)(id ^ (ver * 3u) ^ i);
    return len;
}

static int tval_ok(const void *v, size_t vl, uint32_t id)
{
    uint8_t buf[320];
    uint32_t vid, ver;
    if (vl < 8) return 0;
    memcpy(&vid, v, 4);
    memcpy(&ver, (const uint8_t *)v + 4, 4);
    if (vid != id) return 0;
    size_t len = tval(id, ver, buf);
    return len == vl && memcmp(buf, v, vl) == 0;
}

typedef struct wargs { unsigned w, nw, ops, rm_pct; uint32_t *ver; } wargs;

static void *writer(void *arg)
{
    wargs *a = arg;
    uint64_t rng = 1000 + a->w;
    uint8_t vb[320];
    uint32_t clock = 0;
    for (unsigned i = 0; i < a->ops; i++) {
        uint32_t id = (uint32_t)(km_rng(&rng) % (NKEYS / a->nw)) * a->nw + a->w;
        int rc;
        if (km_rng(&rng) % 100 < a->rm_pct) {
            rc = kv_sorted_remove(g_t, g_m->keys[id], g_m->klen[id]);
            if (rc != (a->ver[id] ? NVH_OK : NVH_E_NOTFOUND)) { __atomic_store_n(&g_bad, 1, __ATOMIC_RELAXED); break; }
            a->ver[id] = 0;
        } else {
            uint32_t ver = ++clock;
            size_t vl = tval(id, ver, vb);
            rc = kv_sorted_put(g_t, g_m->keys[id], g_m->klen[id], vb, vl);
            if (rc) { __atomic_store_n(&g_bad, 2, __ATOMIC_RELAXED); break; }
            a->ver[id] = ver;
        }
    }
    return NULL;
}

typedef struct rstate { uint32_t id; int bad; } rstate;

static int get_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    rstate *s = arg;
    if (km_bytes_cmp(k, kl, g_m->keys[s->id], g_m->klen[s->id]) || !tval_ok(v, vl, s->id)) s->bad = 1;
    return 0;
}

/* id of a key (binary search in the model's order) or -1 */
static int64_t id_of(const void *k, size_t kl)
{
    uint32_t i = km_lower(g_m, k, kl, 0);
    if (i >= g_m->n) return -1;
    uint32_t id = g_m->ord[i];
    return km_bytes_cmp(g_m->keys[id], g_m->klen[id], k, kl) == 0 ? (int64_t)id : -1;
}

typedef struct sstate { uint8_t last[KM_KEYMAX]; size_t ll; int n, bad; } sstate;

static int scan_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    sstate *s = arg;
    int64_t id = id_of(k, kl);
    if (id < 0 || !tval_ok(v, vl, (uint32_t)id)) s->bad = 1;
    if (s->n && km_bytes_cmp(s->last, s->ll, k, kl) >= 0) s->bad = 2;
    memcpy(s->last, k, kl);
    s->ll = kl;
    return ++s->n == 50;
}

static int seek_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    int64_t id = id_of(k, kl);
    if (id < 0 || !tval_ok(v, vl, (uint32_t)id)) *(int *)arg = 1;
    return 0;
}

static void *reader(void *arg)
{
    uint64_t rng = 2000 + (uintptr_t)arg;
    unsigned long n = 0;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        uint32_t id = (uint32_t)(km_rng(&rng) % NKEYS);
        unsigned r = (unsigned)(km_rng(&rng) % 10);
        if (r < 6) {
            rstate s = {id, 0};
            int rc = kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], get_fn, &s);
            if ((rc && rc != NVH_E_NOTFOUND) || s.bad) { __atomic_store_n(&g_bad, 3, __ATOMIC_RELAXED); break; }
        } else if (r < 8) {
            int bad = 0;
            enum kv_seek how = (enum kv_seek)(km_rng(&rng) % 7);
            int rc = kv_sorted_seek(g_t, how, g_m->keys[id], g_m->klen[id], seek_fn, &bad);
            if ((rc && rc != NVH_E_NOTFOUND) || bad) { __atomic_store_n(&g_bad, 4, __ATOMIC_RELAXED); break; }
        } else {
            sstate *s = calloc(1, sizeof *s);
            int rc = kv_sorted_scan(g_t, g_m->keys[id], g_m->klen[id], 1, NULL, 0, 0, scan_fn, s);
            if ((rc && rc != 1) || s->bad) { __atomic_store_n(&g_bad, 5 + s->bad, __ATOMIC_RELAXED); free(s); break; }
            free(s);
        }
        n++;
    }
    return (void *)n;
}

/* A new pool at `path` in `domain` holding an empty tree (g_t, its root
 * link in the pool's root, returned in *linkp if not NULL) and a new key model (g_m). */
static nvh_pool *open_tree(const char *path, unsigned domain, nvh_off_t **linkp)
{
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, 64 << 20, domain);
    assert_non_null(pool);
    nvh_off_t *link = nvh_root(pool, NULL);
    assert_int_equal(kv_sorted_create(pool, &link[0]), NVH_OK);
    g_t = kv_sorted_open(pool, link[0], NULL, NULL);
    assert_non_null(g_t);
    g_m = km_new(NKEYS);
    if (linkp) *linkp = link;
    return pool;
}

static void writers_and_readers(unsigned nw, unsigned rm_pct)
{
    const char *path = test_path("kvs-threads");
    nvh_off_t *link;
    nvh_pool *pool = open_tree(path, NVH_DOMAIN_PROCESS, &link);
    unsigned ops = 40000 / nw;
#if defined(__SANITIZE_THREAD__)
    ops = 8000 / nw;
#endif
    wargs wa[4];
    pthread_t w[4], r[2];
    for (unsigned i = 0; i < nw; i++) wa[i] = (wargs){i, nw, ops, rm_pct, calloc(NKEYS, 4)};
    g_stop = 0;
    g_bad = 0;
    for (int i = 0; i < 2; i++) pthread_create(&r[i], NULL, reader, (void *)(uintptr_t)i);
    for (unsigned i = 0; i < nw; i++) pthread_create(&w[i], NULL, writer, &wa[i]);
    for (unsigned i = 0; i < nw; i++) pthread_join(w[i], NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    unsigned long reads = 0;
    for (int i = 0; i < 2; i++) {
        void *n;
        pthread_join(r[i], &n);
        reads += (unsigned long)n;
    }
    print_message("  %u writers x %u writes (%u%% removes), %lu reads\n", nw, ops, rm_pct, reads);
    assert_int_equal(g_bad, 0);
    /* the model: versions of every writer's share; values by tval */
    assert_int_equal(kv_sorted_check(g_t), NVH_OK);
    uint64_t live = 0, cnt = 0;
    for (uint32_t id = 0; id < NKEYS; id++) {
        uint32_t ver = wa[id % nw].ver[id];
        uint8_t vb[320];
        rstate s = {id, 0};
        int rc = kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], get_fn, &s);
        if (ver) {
            assert_int_equal(rc, NVH_OK);
            size_t vl = tval(id, ver, vb);
            km_hit h = {0};
            assert_int_equal(kv_sorted_get(g_t, g_m->keys[id], g_m->klen[id], km_hit_fn, &h), NVH_OK);
            assert_int_equal(h.vl, vl);
            assert_memory_equal(h.val, vb, vl);
            live++;
        } else {
            assert_int_equal(rc, NVH_E_NOTFOUND);
        }
    }
    assert_int_equal(kv_sorted_count(g_t, NULL, 0, 0, NULL, 0, 0, &cnt), NVH_OK);
    assert_int_equal(cnt, live);
    assert_int_equal(kv_sorted_close(g_t), NVH_OK);
    /* reopen: the queued frees and the chain as the writers left them */
    g_t = kv_sorted_open(pool, link[0], NULL, NULL);
    assert_non_null(g_t);
    assert_int_equal(kv_sorted_check(g_t), NVH_OK);
    assert_int_equal(kv_sorted_count(g_t, NULL, 0, 0, NULL, 0, 0, &cnt), NVH_OK);
    assert_int_equal(cnt, live);
    assert_int_equal(kv_sorted_close(g_t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    for (unsigned i = 0; i < nw; i++) free(wa[i].ver);
    km_free(g_m);
    unlink(path);
}

static void two_writers_two_readers(void **state)
{
    (void)state;
    writers_and_readers(2, 30);
}

/* Four writers sharing every leaf, half of their writes removals: splits,
 * empty-leaf drops and overwrites of neighbouring keys race each other. */
static void four_writers_shared_leaves(void **state)
{
    (void)state;
    writers_and_readers(4, 50);
}

/* ---- parallel_writers --------------------------------------------------- */
static pthread_mutex_t g_hk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hk_cond = PTHREAD_COND_INITIALIZER;
static int g_hk_state;              /* 0 idle, 1 armed, 2 stalled, 3 released */
static __thread int g_hk_victim;

/* Stall the victim thread at its first fence until released. */
static void stall_hook(nvh_pool *pool, uint64_t fence, void *arg)
{
    (void)pool; (void)fence; (void)arg;
    if (!g_hk_victim) return;
    pthread_mutex_lock(&g_hk_lock);
    if (g_hk_state == 1) {
        g_hk_state = 2;
        pthread_cond_broadcast(&g_hk_cond);
        while (g_hk_state != 3) pthread_cond_wait(&g_hk_cond, &g_hk_lock);
    }
    pthread_mutex_unlock(&g_hk_lock);
}

typedef struct pw { uint32_t id; int rc; int done; } pw;

static void *pw_victim(void *arg)
{
    pw *a = arg;
    /* a first put makes this thread's record slab (its activation, under
     * the slab list's lock, is once per slab): the stalled put is then a
     * steady-state one */
    a->rc = kv_sorted_put(g_t, g_m->keys[g_m->ord[3]], g_m->klen[g_m->ord[3]], "warm", 4);
    if (a->rc != NVH_OK) return NULL;
    g_hk_victim = 1;
    a->rc = kv_sorted_put(g_t, g_m->keys[a->id], g_m->klen[a->id], "victim", 6);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void *pw_other(void *arg)
{
    pw *a = arg;
    a->rc = kv_sorted_put(g_t, g_m->keys[a->id], g_m->klen[a->id], "other", 5);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int wait_done(pw *a, int ms)
{
    for (int i = 0; i < ms && !__atomic_load_n(&a->done, __ATOMIC_ACQUIRE); i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return __atomic_load_n(&a->done, __ATOMIC_ACQUIRE);
}

static void parallel_writers(void **state)
{
    (void)state;
    const char *path = test_path("kvs-parallel");
    nvh_pool *pool = open_tree(path, NVH_DOMAIN_SIM, NULL);
    /* every other key in key order: many leaves, none full after it */
    for (uint32_t i = 0; i < NKEYS; i += 2)
        assert_int_equal(kv_sorted_put(g_t, g_m->keys[g_m->ord[i]], g_m->klen[g_m->ord[i]], "v", 1), NVH_OK);
    /* the victim inserts near the start, the other near the end: leaves
     * apart, whatever split where */
    pw v = {g_m->ord[1], -1, 0}, o = {g_m->ord[NKEYS - 3], -1, 0};
    nvh_sim_set_fence_hook(pool, stall_hook, NULL);
    g_hk_state = 1;
    pthread_t tv, to;
    pthread_create(&tv, NULL, pw_victim, &v);
    pthread_mutex_lock(&g_hk_lock);
    while (g_hk_state != 2) pthread_cond_wait(&g_hk_cond, &g_hk_lock);
    pthread_mutex_unlock(&g_hk_lock);
    /* the victim holds its leaf, between its record and its activation */
    pthread_create(&to, NULL, pw_other, &o);
    int other_done = wait_done(&o, 10000);
    int victim_done = __atomic_load_n(&v.done, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&g_hk_lock);
    g_hk_state = 3;
    pthread_cond_broadcast(&g_hk_cond);
    pthread_mutex_unlock(&g_hk_lock);
    pthread_join(tv, NULL);
    pthread_join(to, NULL);
    nvh_sim_set_fence_hook(pool, NULL, NULL);
    print_message("  other writer done while the victim stalled: %d\n", other_done);
    assert_true(other_done);         /* not serialised behind the victim */
    assert_false(victim_done);
    assert_int_equal(v.rc, NVH_OK);
    assert_int_equal(o.rc, NVH_OK);
    km_hit h = {0};
    assert_int_equal(kv_sorted_get(g_t, g_m->keys[v.id], g_m->klen[v.id], km_hit_fn, &h), NVH_OK);
    assert_int_equal(h.vl, 6);
    assert_int_equal(kv_sorted_get(g_t, g_m->keys[o.id], g_m->klen[o.id], km_hit_fn, &h), NVH_OK);
    assert_int_equal(h.vl, 5);
    assert_int_equal(kv_sorted_check(g_t), NVH_OK);
    assert_int_equal(kv_sorted_close(g_t), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    km_free(g_m);
    unlink(path);
}

/* fingerprint_race: the keys of one leaf share a fingerprint (kvs_fp), so a
 * lookup's fingerprint matches several slots, and a writer keeps reusing
 * slots (removing and inserting keys with that fingerprint and with
 * others, overwriting the stable keys) while readers get every key: a
 * stable key must always be found with a whole value of its own, a
 * churned key found with its own value or not at all. A lookup that
 * trusted a fingerprint match (or a stale fingerprint) would return
 * another key's value or miss a stable key. */
#define FP_STABLE 10
#define FP_CHURN 14
#define FP_KEYS (FP_STABLE + FP_CHURN)
static uint8_t g_fpk[FP_KEYS][16];
static bool g_fp_in[FP_KEYS];           /* the writer's model: present */

static void fp_keys(void)
{
    /* 16-byte keys "fprace--" + 8 bytes, all in one leaf's range; the
     * stable keys and half the churned ones share fingerprint 0x5a */
    unsigned same = 0, other = 0;
    for (uint64_t x = 0; same + other < FP_KEYS; x++) {
        uint8_t k[16];
        memcpy(k, "fprace--", 8);
        memcpy(k + 8, &x, 8);
        if (kvs_fp(kvs_hash(k, 16)) == 0x5a) {
            if (same < FP_STABLE + FP_CHURN / 2) memcpy(g_fpk[same++], k, 16);
        } else if (other < FP_CHURN / 2) {
            memcpy(g_fpk[FP_STABLE + FP_CHURN / 2 + other++], k, 16);
        }
    }
}

typedef struct fp_rs { uint32_t id; int bad; } fp_rs;

static int fp_get_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    fp_rs *s = arg;
    if (kl != 16 || memcmp(k, g_fpk[s->id], 16) || !tval_ok(v, vl, s->id)) s->bad = 1;
    return 0;
}

static void *fp_writer(void *arg)
{
    unsigned ops = *(unsigned *)arg;
    uint64_t rng = 77;
    uint8_t vb[320];
    bool *in = g_fp_in;
    for (unsigned i = 0; i < ops && !__atomic_load_n(&g_bad, __ATOMIC_RELAXED); i++) {
        uint32_t id = (uint32_t)(km_rng(&rng) % FP_KEYS);
        int rc;
        if (id >= FP_STABLE && in[id]) {
            rc = kv_sorted_remove(g_t, g_fpk[id], 16);
            in[id] = false;
        } else {
            size_t vl = tval(id, i + 1, vb);
            rc = kv_sorted_put(g_t, g_fpk[id], 16, vb, vl);
            in[id] = true;
        }
        if (rc) __atomic_store_n(&g_bad, 10, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void *fp_reader(void *arg)
{
    uint64_t rng = 3000 + (uintptr_t)arg;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        fp_rs st = {(uint32_t)(km_rng(&rng) % FP_KEYS), 0};
        int rc = kv_sorted_get(g_t, g_fpk[st.id], 16, fp_get_fn, &st);
        if (st.bad || (rc && rc != NVH_E_NOTFOUND) || (rc && st.id < FP_STABLE)) {
            __atomic_store_n(&g_bad, 11 + st.bad, __ATOMIC_RELAXED);
            break;
        }
    }
    return NULL;
}

static void fingerprint_race(void **state)
{
    (void)state;
    const char *path = test_path("kvs-fprace");
    nvh_pool *pool = open_tree(path, NVH_DOMAIN_PROCESS, NULL);
    fp_keys();
    uint8_t vb[320];
    memset(g_fp_in, 0, sizeof g_fp_in);
    for (uint32_t id = 0; id < FP_STABLE; id++) {
        assert_int_equal(kv_sorted_put(g_t, g_fpk[id], 16, vb, tval(id, 0, vb)), NVH_OK);
        g_fp_in[id] = true;
    }
    g_stop = 0;
    g_bad = 0;
    unsigned ops = 60000;
#if defined(__SANITIZE_THREAD__)
    ops = 6000;
#endif
    pthread_t w, r[2];
    for (uintptr_t i = 0; i < 2; i++) pthread_create(&r[i], NULL, fp_reader, (void *)i);
    pthread_create(&w, NULL, fp_writer, &ops);
    pthread_join(w, NULL);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++) pthread_join(r[i], NULL);
    assert_int_equal(g_bad, 0);
    for (uint32_t id = 0; id < FP_KEYS; id++) {
        fp_rs st = {id, 0};
        assert_int_equal(kv_sorted_get(g_t, g_fpk[id], 16, fp_get_fn, &st),
                         g_fp_in[id] ? NVH_OK : NVH_E_NOTFOUND);
        assert_int_equal(st.bad, 0);
    }
    assert_int_equal(kv_sorted_check(g_t), NVH_OK);
    assert_int_equal(kv_sorted_close(g_t), NVH_OK);
    nvh_pool_close(pool);
    km_free(g_m);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_writers_two_readers),
        cmocka_unit_test(four_writers_shared_leaves),
        cmocka_unit_test(parallel_writers),
        cmocka_unit_test(fingerprint_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
