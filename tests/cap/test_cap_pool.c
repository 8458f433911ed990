/* test_cap_pool.c — the capacity part of a pool (nvh_cap_*): the API and its
 * errors, and seed 003's dual use across a real crash: a process fills the
 * capacity part and the persistent part of one pool, is SIGKILLed, and the
 * reopened pool has every persistent object intact and the capacity part
 * empty (its space free again). */
#include "test_util.h"

#include <signal.h>
#include <sys/wait.h>

#define PART ((uint64_t)48 << 20)

static nvh_pool *mkpool(const char *path)
{
    nvh_pool_options o = {.root_size = 4096, .max_size = (uint64_t)1 << 30};
    nvh_pool *p = nvh_pool_create_ex(path, "cap", (uint64_t)128 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(p);
    return p;
}

static void test_api(void **state)
{
    (void)state;
    const char *path = test_path("capapi");
    nvh_pool *pool = mkpool(path);
    nvh_cap *cap = nvh_cap_attach(pool, PART);
    assert_non_null(cap);
    nvh_cap_stats st;
    assert_int_equal(nvh_cap_stats_get(cap, &st), NVH_OK);
    assert_true(st.region_bytes >= PART - 8192);

    char *small = nvh_cap_malloc(cap, 100);
    char *big = nvh_cap_malloc(cap, 1 << 20);
    assert_non_null(small);
    assert_non_null(big);
    /* inside the pool, in the part */
    uint64_t off = nvh_off(pool, small);
    assert_true(off >= st.region_offset && off < st.region_offset + st.region_bytes);
    memset(big, 7, 1 << 20);
    assert_true(nvh_cap_usable_size(cap, small) >= 100);
    int *z = nvh_cap_calloc(cap, 1000, sizeof *z);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(z[i], 0);
    big = nvh_cap_realloc(cap, big, 3 << 20);
    assert_int_equal(big[(1 << 20) - 1], 7);

    /* bad input: codes, nothing changes */
    assert_int_equal(nvh_cap_free(cap, small + 16), NVH_E_BADPTR);
    int outside;
    assert_int_equal(nvh_cap_free(cap, &outside), NVH_E_BADPTR);
    assert_int_equal(nvh_cap_free(cap, small), NVH_OK);
    assert_int_equal(nvh_cap_free(cap, small), NVH_E_DOUBLEFREE);
    assert_null(nvh_cap_realloc(cap, small, 10));
    assert_int_equal(nvh_errcode(), NVH_E_DOUBLEFREE);
    assert_int_equal(nvh_cap_usable_size(cap, big + 8), 0);
    assert_int_equal(nvh_errcode(), NVH_E_BADPTR);

    /* full: NVH_E_NOSPACE, and the part still works */
    assert_null(nvh_cap_malloc(cap, PART));
    assert_int_equal(nvh_errcode(), NVH_E_NOSPACE);
    assert_int_equal(nvh_cap_free(cap, big), NVH_OK);
    assert_int_equal(nvh_cap_free(cap, z), NVH_OK);

    /* the persistent allocator still serves the rest of the pool */
    nvh_off_t *root = nvh_root(pool, NULL);
    void *obj = nvh_alloc(pool, 5000, NULL, NULL, root);
    assert_non_null(obj);
    assert_int_equal(nvh_cap_free(cap, obj), NVH_E_BADPTR);

    /* too small / no room in the pool */
    assert_null(nvh_cap_attach(pool, 4096));
    assert_int_equal(nvh_errcode(), NVH_E_SIZE);
    assert_null(nvh_cap_attach(pool, (uint64_t)4 << 30));
    assert_int_not_equal(nvh_errcode(), NVH_OK);

    assert_int_equal(nvh_cap_detach(cap), NVH_OK);
    /* the space is back: a part of the same size fits again */
    cap = nvh_cap_attach(pool, PART);
    assert_non_null(cap);
    assert_non_null(nvh_cap_malloc(cap, 12345));
    /* close detaches it */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

/* ---- dual use across SIGKILL ------------------------------------------------ */
#define NOBJ 200

static int child(const char *path, int ready_fd)
{
    nvh_pool *pool = mkpool(path);
    nvh_cap *cap = nvh_cap_attach(pool, PART);
    if (!cap)
        return 1;
    /* persistent objects, named, with known contents */
    for (int i = 0; i < NOBJ; i++) {
        char name[32];
        snprintf(name, sizeof name, "obj%d", i);
        size_t sz = 64 + (size_t)i * 97;
        unsigned char *p = nvh_reserve_named(pool, name, sz);
        if (!p)
            return 2;
        memset(p, i, sz);
        nvh_persist(pool, p, sz);
        if (nvh_activate_named(pool, name) != NVH_OK)
            return 3;
    }
    /* the capacity part: filled to about 3/4 */
    size_t used = 0;
    while (used < PART * 3 / 4) {
        size_t sz = 100 + used % 70000;
        unsigned char *p = nvh_cap_malloc(cap, sz);
        if (!p)
            return 4;
        memset(p, 0xCA, sz);
        used += sz;
    }
    if (write(ready_fd, "R", 1) != 1)
        return 5;
    for (;;)
        pause();
}

static void test_dual_use_sigkill(void **state)
{
    (void)state;
    const char *path = test_path("capkill");
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        _exit(child(path, fds[1]));
    }
    close(fds[1]);
    char c;
    assert_int_equal(read(fds[0], &c, 1), 1);
    kill(pid, SIGKILL);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(fds[0]);

    nvh_pool *pool = nvh_pool_open(path, "cap", 0);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    assert_int_equal(info.clean_at_open, 0);
    /* persistent objects intact */
    uint64_t pbytes = 0;
    for (int i = 0; i < NOBJ; i++) {
        char name[32];
        snprintf(name, sizeof name, "obj%d", i);
        size_t sz = 0;
        unsigned char *p = nvh_get_named(pool, name, &sz);
        assert_non_null(p);
        assert_true(sz >= 64 + (size_t)i * 97);
        for (size_t k = 0; k < 64 + (size_t)i * 97; k++)
            assert_int_equal(p[k], (unsigned char)i);
        pbytes += sz;
    }
    /* the capacity part is empty: the heap holds the persistent objects only */
    nvh_heap_stats hs;
    assert_int_equal(nvh_heap_stats_get(pool, &hs), NVH_OK);
    assert_int_equal(hs.live_objects, NOBJ);
    assert_true(hs.live_bytes < pbytes + 4096 * NOBJ);
    assert_true(hs.live_bytes < PART / 8);
    /* and its space is free: a new part of the same size fits */
    nvh_cap *cap = nvh_cap_attach(pool, PART);
    assert_non_null(cap);
    assert_int_equal(nvh_cap_detach(cap), NVH_OK);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_dual_use_sigkill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
