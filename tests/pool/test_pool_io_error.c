/* test_pool_io_error.c — what a pool remembers about its own history:
 * whether it was closed cleanly before this open (nvh_pool_info.clean_at_open)
 * and whether an msync failed while it was open (io_errors, sticky, and
 * nvh_pool_close then fails with NVH_E_IO: after a failed msync the kernel
 * may have dropped the dirty pages, the PostgreSQL "fsync-gate" lesson).
 *
 * The msync failure is injected by defining msync in this executable: with
 * -rdynamic the library's calls bind to this definition, which fails on
 * demand and otherwise makes the real system call. */
#include "test_util.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((uint64_t)1 << 20)

static atomic_int msync_should_fail;
static atomic_int msync_calls;

int msync(void *addr, size_t length, int flags)
{
    atomic_fetch_add(&msync_calls, 1);
    if (atomic_load(&msync_should_fail)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_msync, addr, length, flags);
}

static void clean_flag_reports_the_previous_close(void **state)
{
    (void)state;
    const char *path = test_path("clean");
    nvh_pool *pool = nvh_pool_create(path, "clean", 2 * MiB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    assert_int_equal(info.clean_at_open, 1);           /* a new pool is clean */
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, "clean", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.clean_at_open, 1);
    assert_int_equal(info.io_errors, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* a process that dies with the pool open leaves it unclean */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        nvh_pool *p = nvh_pool_open(path, "clean", NVH_DOMAIN_PROCESS);
        _exit(p ? 0 : 1);                               /* no close */
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pool = nvh_pool_open(path, "clean", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.clean_at_open, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* and the clean close after it makes the next open clean again */
    pool = nvh_pool_open(path, "clean", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.clean_at_open, 1);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

static void failed_msync_is_sticky_and_fails_close(void **state)
{
    (void)state;
    const char *path = test_path("msync-eio");
    nvh_pool *pool = nvh_pool_create(path, "eio", 2 * MiB, NVH_DOMAIN_MSYNC);
    assert_non_null(pool);
    char *root = nvh_root(pool, NULL);

    /* a persist that works: msync runs, nothing is recorded */
    int before = atomic_load(&msync_calls);
    memcpy(root, "durable", 8);
    nvh_persist(pool, root, 8);
    assert_true(atomic_load(&msync_calls) > before);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.io_errors, 0);

    /* a persist whose msync fails: nvh_persist returns nothing, the pool keeps it */
    atomic_store(&msync_should_fail, 1);
    memcpy(root, "lost?", 6);
    nvh_persist(pool, root, 6);
    atomic_store(&msync_should_fail, 0);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.io_errors, 1);

    /* later successful msyncs do not clear it: the dropped pages stay dropped */
    nvh_persist(pool, root, 6);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.io_errors, 1);

    assert_int_equal(nvh_pool_close(pool), NVH_E_IO);
    assert_int_equal(nvh_errcode(), NVH_E_IO);
    assert_non_null(strstr(nvh_errormsg(), path));
    assert_non_null(strstr(nvh_errormsg(), "msync"));

    /* the handle was released all the same: the pool opens again, and its
     * next session starts with no errors */
    pool = nvh_pool_open(path, "eio", NVH_DOMAIN_MSYNC);
    assert_non_null(pool);
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.io_errors, 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(clean_flag_reports_the_previous_close),
        cmocka_unit_test(failed_msync_is_sticky_and_fails_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
