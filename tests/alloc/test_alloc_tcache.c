/* test_alloc_tcache.c — the per-thread reservation cache in front of the
 * arenas (docs/ALLOC.md §4a): slots sitting in a cache are neither handed
 * out twice nor usable through guessed pointers (cancel/activate refuse
 * them, free calls them free), a cache goes back to its arena when its
 * thread exits and when the thread moves to another pool, a closed pool
 * detaches the caches of its threads, and a crash with full caches leaks
 * nothing (a reservation is DRAM only). */
#include "test_util.h"
#include "alloc/alloc.h"      /* white-box: run geometry */

#include <pthread.h>
#include <stdbool.h>
#include <sys/wait.h>

static nvh_pool *mkpool_at(const char *path, const char *layout)
{
    nvh_pool_options o = {.root_size = 16384, .max_size = 64 << 20};
    nvh_pool *p = nvh_pool_create_ex(path, layout, 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(p);
    return p;
}

/* The slots after the one handed out are in the cache (fresh run, cursor
 * order): not reservations the application holds. */
static void cached_slots_are_not_reservations(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", test_path("tc-cancel"));
    nvh_pool *pool = mkpool_at(path, "tc");
    nvh_off_t *root = nvh_root(pool, NULL);
    char *p = nvh_reserve(pool, 128);
    assert_non_null(p);
    char *q = p + 128;                  /* cached, never handed out */
    assert_int_equal(nvh_cancel(pool, q), NVH_E_BADPTR);
    nvh_off_t *l[1] = {&root[0]};
    assert_int_equal(nvh_activate(pool, q, l, 1), NVH_E_BADPTR);
    assert_int_equal(root[0], 0);
    assert_int_equal(nvh_free(pool, q, NULL, 0), NVH_E_DOUBLEFREE);
    /* it is still handed out exactly once, next */
    char *r = nvh_reserve(pool, 128);
    assert_ptr_equal(r, q);
    assert_int_equal(nvh_activate(pool, r, l, 1), NVH_OK);
    assert_int_equal(root[0], nvh_off(pool, r));
    /* a handed-out slot cancels like any reservation, and only once */
    assert_int_equal(nvh_cancel(pool, p), NVH_OK);
    assert_int_equal(nvh_cancel(pool, p), NVH_E_BADPTR);
    assert_int_equal(nvh_activate(pool, p, NULL, 0), NVH_E_BADPTR);
    /* 1000 reservations: all distinct from the live one and each other */
    char *seen[1000];
    for (int i = 0; i < 1000; i++) {
        seen[i] = nvh_reserve(pool, 128);
        assert_non_null(seen[i]);
        assert_ptr_not_equal(seen[i], r);
        for (int k = 0; k < i; k++) assert_ptr_not_equal(seen[i], seen[k]);
    }
    for (int i = 0; i < 1000; i++) assert_int_equal(nvh_cancel(pool, seen[i]), NVH_OK);
    nvh_link fl = {&root[0], 0};
    assert_int_equal(nvh_free(pool, r, &fl, 1), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* Thread exit returns the cache: a slot that was in another thread's cache
 * reads as reserved while that thread lives, as free once it has exited. */
static nvh_pool *g_pool;
static char *g_first;
static pthread_barrier_t g_bar;

static void *cache_owner(void *arg)
{
    (void)arg;
    g_first = nvh_reserve(g_pool, 128);
    assert_non_null(g_first);
    assert_int_equal(nvh_activate(g_pool, g_first, NULL, 0), NVH_OK);
    pthread_barrier_wait(&g_bar);      /* main probes while we live */
    pthread_barrier_wait(&g_bar);
    return NULL;
}

static void cache_returned_at_thread_exit(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", test_path("tc-exit"));
    g_pool = mkpool_at(path, "tc");
    nvh_heap_config c;                 /* one arena: main reuses the thread's run */
    assert_int_equal(nvh_heap_config_get(g_pool, &c), NVH_OK);
    c.arenas = 1;
    assert_int_equal(nvh_heap_config_set(g_pool, &c), NVH_OK);
    pthread_barrier_init(&g_bar, NULL, 2);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, cache_owner, NULL), 0);
    pthread_barrier_wait(&g_bar);
    char *cached = g_first + 128;
    assert_int_equal(nvh_free(g_pool, cached, NULL, 0), NVH_E_BADPTR); /* reserved (cache) */
    pthread_barrier_wait(&g_bar);
    pthread_join(t, NULL);
    assert_int_equal(nvh_free(g_pool, cached, NULL, 0), NVH_E_DOUBLEFREE); /* free again */
    /* and it can be reserved again */
    bool found = false;
    char *got[64];
    int n = 0;
    for (; n < 64 && !found; n++) {
        got[n] = nvh_reserve(g_pool, 128);
        assert_non_null(got[n]);
        found = got[n] == cached;
    }
    assert_true(found);
    for (int i = 0; i < n; i++) assert_int_equal(nvh_cancel(g_pool, got[i]), NVH_OK);
    assert_int_equal(nvh_free(g_pool, g_first, NULL, 0), NVH_OK);
    pthread_barrier_destroy(&g_bar);
    assert_int_equal(nvh_pool_close(g_pool), NVH_OK);
    unlink(path);
}

/* A thread that moves to another pool gives its cache back to the first;
 * closing a pool detaches the caches (the thread then works on a new one). */
static void cache_follows_the_pool(void **state)
{
    (void)state;
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s", test_path("tc-a"));
    snprintf(pb, sizeof pb, "%s", test_path("tc-b"));
    nvh_pool *a = mkpool_at(pa, "tc");
    nvh_pool *b = mkpool_at(pb, "tc");
    for (int round = 0; round < 3; round++) {
        char *x = nvh_reserve(a, 256);
        assert_non_null(x);
        assert_int_equal(nvh_activate(a, x, NULL, 0), NVH_OK);
        char *y = nvh_reserve(b, 256);   /* moves the cache: a's slots go back */
        assert_non_null(y);
        assert_int_equal(nvh_cancel(b, y), NVH_OK);
        /* the slot after x was cached for a, and is free again now; a
         * reserve on b then a moves the cache back: a's slots are handed out
         * again, never twice */
        assert_int_equal(nvh_free(a, x + 256, NULL, 0), NVH_E_DOUBLEFREE);
        assert_int_equal(nvh_free(a, x, NULL, 0), NVH_OK);
    }
    assert_int_equal(nvh_pool_close(a), NVH_OK);
    /* the cache was attached to b; close b, then reopen a and allocate */
    assert_int_equal(nvh_pool_close(b), NVH_OK);
    a = nvh_pool_open(pa, "tc", NVH_DOMAIN_PROCESS);
    assert_non_null(a);
    nvh_off_t *root = nvh_root(a, NULL);
    for (int i = 0; i < 100; i++) {
        char *p = nvh_reserve(a, 64 + (i % 7) * 100);
        assert_non_null(p);
        nvh_off_t *l[1] = {&root[i]};
        assert_int_equal(nvh_activate(a, p, l, 1), NVH_OK);
    }
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(a, &st), NVH_OK);
    assert_int_equal(st.live_objects, 100);
    assert_int_equal(nvh_pool_close(a), NVH_OK);
    unlink(pa);
    unlink(pb);
}

/* A process crash with full caches (and reservations never activated)
 * leaks nothing: the reopened heap has exactly the activated objects, every
 * slot of their runs that is not live can be allocated, and check is clean. */
static void crash_with_full_caches_leaks_nothing(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s", test_path("tc-crash"));
    nvh_pool *pool = mkpool_at(path, "tc");
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        nvh_pool *c = nvh_pool_open(path, "tc", NVH_DOMAIN_PROCESS);
        if (!c) _exit(2);
        nvh_off_t *root = nvh_root(c, NULL);
        for (int i = 0; i < 20; i++) {  /* all in the first 128 B run */
            char *p = nvh_reserve(c, 128);
            if (!p) _exit(3);
            nvh_off_t *l[1] = {&root[i / 2]};
            if (i % 2 == 0 && nvh_activate(c, p, l, 1) != NVH_OK) _exit(4);
        }
        for (int cls = 1; cls <= 31; cls += 5)
            if (!nvh_reserve(c, (size_t)cls * 64)) _exit(5);
        _exit(0);                        /* crash: no close, caches full */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    pool = nvh_pool_open(path, "tc", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    size_t bad = 0;
    assert_int_equal(nvh_heap_check(pool, NULL, NULL, 0, &bad), NVH_OK);
    assert_int_equal(bad, 0);
    nvh_heap_stats st;
    assert_int_equal(nvh_heap_stats_get(pool, &st), NVH_OK);
    assert_int_equal(st.live_objects, 10);
    /* every slot of the run not held by a live object comes back before a
     * new run is started: its slots - 10 live */
    uint64_t run_block = ((nvh_off_t *)nvh_root(pool, NULL))[0] / 4096;
    uint64_t run_blocks = nvh_run_blocks_for(2, 0);     /* the class's first run */
    char *held[64];
    unsigned got = 0;
    for (;;) {
        char *p = nvh_reserve(pool, 128);
        assert_non_null(p);
        held[got++] = p;
        uint64_t pb = nvh_off(pool, p) / 4096;
        if (pb < run_block || pb >= run_block + run_blocks || got == 64) break;
    }
    assert_int_equal(got, nvh_run_slots(2, (unsigned)run_blocks) - 10 + 1);
    for (unsigned i = 0; i < got; i++) assert_int_equal(nvh_cancel(pool, held[i]), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cached_slots_are_not_reservations),
        cmocka_unit_test(cache_returned_at_thread_exit),
        cmocka_unit_test(cache_follows_the_pool),
        cmocka_unit_test(crash_with_full_caches_leaks_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
