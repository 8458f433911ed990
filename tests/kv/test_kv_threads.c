/* test_kv_threads.c — threads on one store handle (hash engine): two
 * writers and two readers at once (zero-copy and copying gets, exists,
 * full scans) with no torn or reused value ever seen and the final state
 * equal to the writers' models (run under TSan in CI: no data race); and a
 * reader that keeps running while a writer is stuck inside the map (its
 * lock held), which fails if gets take the writers' lock. */
#include "test_util.h"
#include "kv_values.h"

#include "kv/kv.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#define NKEYS 400                 /* per writer */
#define WOPS 3000

static nvh_kv *g_kv;
static atomic_bool g_stop;
static atomic_long g_bad;

typedef struct wr_arg {
    uint32_t base;
    uint32_t ver[NKEYS];          /* 0: absent */
} wr_arg;

static void *writer(void *p)
{
    wr_arg *a = p;
    uint64_t rng = a->base * 7919u + 1;
    char k[32], v[300];
    for (int i = 1; i <= WOPS; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t id = (uint32_t)(rng >> 33) % NKEYS, key = a->base + id;
        size_t kl = (size_t)sprintf(k, "key%u", key);
        if ((rng >> 20) % 5 == 0) {
            int rc = nvh_kv_remove(g_kv, k, kl);
            if (rc != (a->ver[id] ? NVH_OK : NVH_E_NOTFOUND)) atomic_fetch_add(&g_bad, 1);
            a->ver[id] = 0;
        } else if ((rng >> 24) % 10 == 0) {       /* sometimes a batch of 3 */
            nvh_kv_batch *b = nvh_kv_batch_new(g_kv);
            for (uint32_t j = 0; j < 3; j++) {
                uint32_t id2 = (id + j) % NKEYS, key2 = a->base + id2;
                size_t kl2 = (size_t)sprintf(k, "key%u", key2);
                nvh_kv_batch_put(b, k, kl2, v, make_value(key2, (uint32_t)i, v));
                a->ver[id2] = (uint32_t)i;
            }
            if (nvh_kv_batch_commit(b) != NVH_OK) atomic_fetch_add(&g_bad, 1);
        } else {
            if (nvh_kv_put(g_kv, k, kl, v, make_value(key, (uint32_t)i, v)) != NVH_OK)
                atomic_fetch_add(&g_bad, 1);
            a->ver[id] = (uint32_t)i;
        }
    }
    return NULL;
}

static int zc_check(const void *v, size_t vl, void *arg)
{
    return value_ok(*(uint32_t *)arg, v, vl) ? 0 : 1;
}

static int scan_check(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)arg;
    char tmp[32];
    unsigned key;
    if (kl >= sizeof tmp) return 1;
    memcpy(tmp, k, kl);
    tmp[kl] = 0;
    if (sscanf(tmp, "key%u", &key) != 1) return 1;
    return value_ok(key, v, vl) ? 0 : 1;
}

static void *reader(void *p)
{
    uint64_t rng = (uintptr_t)p * 31 + 5, reads = 0;
    char k[32], buf[300];
    while (!atomic_load(&g_stop)) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t key = (uint32_t)(rng >> 33) % (2 * NKEYS);
        size_t kl = (size_t)sprintf(k, "key%u", key), vl = 0;
        int rc = nvh_kv_get_copy(g_kv, k, kl, buf, sizeof buf, &vl);
        if (rc == NVH_OK && !value_ok(key, buf, vl)) atomic_fetch_add(&g_bad, 1);
        if (rc != NVH_OK && rc != NVH_E_NOTFOUND) atomic_fetch_add(&g_bad, 1);
        rc = nvh_kv_get(g_kv, k, kl, zc_check, &key);
        if (rc != 0 && rc != NVH_E_NOTFOUND) atomic_fetch_add(&g_bad, 1);
        if (nvh_kv_exists(g_kv, k, kl) < 0) atomic_fetch_add(&g_bad, 1);
        if (++reads % 500 == 0 && nvh_kv_get_all(g_kv, scan_check, NULL) != 0)
            atomic_fetch_add(&g_bad, 1);
    }
    return NULL;
}

static void test_two_writers_two_readers(void **state)
{
    (void)state;
    const char *path = test_path("kv-threads");
    nvh_kv_config c = {.path = path, .name = "t", .engine = "hash",
                       .create = NVH_KV_CREATE_NEW, .size = 64 << 20};
    g_kv = nvh_kv_open(&c);
    assert_non_null(g_kv);
    atomic_store(&g_stop, false);
    atomic_store(&g_bad, 0);
    static wr_arg w[2];
    memset(w, 0, sizeof w);
    w[0].base = 0;
    w[1].base = NKEYS;
    pthread_t tw[2], tr[2];
    for (int i = 0; i < 2; i++) pthread_create(&tr[i], NULL, reader, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 2; i++) pthread_create(&tw[i], NULL, writer, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(tw[i], NULL);
    atomic_store(&g_stop, true);
    for (int i = 0; i < 2; i++) pthread_join(tr[i], NULL);
    assert_int_equal(atomic_load(&g_bad), 0);
    /* the final state is both writers' models */
    uint64_t live = 0, n = 0;
    char k[32], v[300], buf[300];
    for (int t = 0; t < 2; t++)
        for (uint32_t id = 0; id < NKEYS; id++) {
            uint32_t key = w[t].base + id;
            size_t kl = (size_t)sprintf(k, "key%u", key), vl = 0;
            int rc = nvh_kv_get_copy(g_kv, k, kl, buf, sizeof buf, &vl);
            if (!w[t].ver[id]) {
                assert_int_equal(rc, NVH_E_NOTFOUND);
                continue;
            }
            live++;
            assert_int_equal(rc, NVH_OK);
            size_t want = make_value(key, w[t].ver[id], v);
            assert_int_equal(vl, want);
            assert_memory_equal(buf, v, want);
        }
    assert_int_equal(nvh_kv_count_all(g_kv, &n), NVH_OK);
    assert_int_equal(n, live);
    assert_int_equal(nvh_kv_check(g_kv), NVH_OK);
    assert_int_equal(nvh_kv_close(g_kv), NVH_OK);
    unlink(path);
}

/* A writer stuck inside the map (its lock held, as during a slow flush):
 * readers must go on. */
static atomic_int g_reads_done;

static void *blocked_reader(void *p)
{
    (void)p;
    char buf[16];
    size_t vl;
    for (int i = 0; i < 1000; i++) {
        if (nvh_kv_get_copy(g_kv, "present", 7, buf, sizeof buf, &vl) != NVH_OK ||
            nvh_kv_exists(g_kv, "absent", 6) != 0)
            atomic_fetch_add(&g_bad, 1);
    }
    uint64_t n;
    if (nvh_kv_count_all(g_kv, &n) != NVH_OK || n != 1) atomic_fetch_add(&g_bad, 1);
    atomic_store(&g_reads_done, 1);
    return NULL;
}

static void test_reader_while_writer_blocked(void **state)
{
    (void)state;
    const char *path = test_path("kv-blocked");
    nvh_kv_config c = {.path = path, .name = "b", .engine = "hash",
                       .create = NVH_KV_CREATE_NEW};
    g_kv = nvh_kv_open(&c);
    assert_non_null(g_kv);
    assert_int_equal(nvh_kv_put(g_kv, "present", 7, "v", 1), NVH_OK);
    atomic_store(&g_bad, 0);
    atomic_store(&g_reads_done, 0);
    pthread_mutex_lock(&g_kv->hm->lock);          /* the writer is stuck */
    pthread_t t;
    pthread_create(&t, NULL, blocked_reader, NULL);
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && !atomic_load(&g_reads_done); i++) nanosleep(&ts, NULL);
    int done = atomic_load(&g_reads_done);
    pthread_mutex_unlock(&g_kv->hm->lock);
    pthread_join(t, NULL);
    if (!done) fail_msg("readers waited for the writer's lock");
    assert_int_equal(atomic_load(&g_bad), 0);
    assert_int_equal(nvh_kv_close(g_kv), NVH_OK);
    unlink(path);
}

int main(void)
{
    setenv("NVHEAP_DOMAIN", "process", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_writers_two_readers),
        cmocka_unit_test(test_reader_while_writer_blocked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
