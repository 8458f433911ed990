/* test_sim_checker.c — the harness survives its checkers.
 *
 * A checker that aborts, faults, returns odd values or calls exit() is a
 * failure with an exact status (128+signal for a crash), never the end of
 * the exploration; crash children never run the parent's atexit handlers or
 * its test framework's signal handlers; a SIGCHLD disposition of SIG_IGN does
 * not hide the children's statuses; images of crashed checkers are cleaned
 * up (or kept on request). */
#include "sim_test.h"

#include <signal.h>
#include <sys/wait.h>

static pid_t g_main_pid;
static int *g_atexit_in_child;   /* shared: atexit handlers run in a child */
static const char *g_scratch;

static void atexit_probe(void)
{
    if (getpid() != g_main_pid) __atomic_fetch_add(g_atexit_in_child, 1, __ATOMIC_RELAXED);
}

static int counter_workload(nvh_pool *pool, void *arg)
{
    uint64_t fences = *(const uint64_t *)arg;
    uint64_t *c = nvh_root(pool, NULL);
    for (uint64_t i = 0; i < fences; i++) {
        *c = i + 1;
        nvh_persist(pool, c, sizeof *c);
    }
    return fences == 3 ? 42 : 0;      /* 3 fences: exercise workload_status */
}

/* Misbehaves at chosen fences. */
static int wild_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)image; (void)arg;
    switch (pt->fence) {
    case 2: abort();
    case 4: raise(SIGSEGV); return 0;
    case 6: return 7;
    case 8: return -1;
    default: return 0;
    }
}

static int exiting_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)image; (void)arg;
    if (pt->fence == 3) exit(9);       /* its own exit: it runs atexit, its choice */
    return 0;
}

static const char *counter_pool(void)
{
    const char *path = test_path("checker");
    nvh_pool *pool = nvh_pool_create(path, NULL, 1 << 20, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void crashing_checker_reported(void **state)
{
    (void)state;
    const char *path = counter_pool();
    uint64_t fences = 10;
    nvh_crash_config cfg = {
        .pool_path = path, .workload = counter_workload, .check = wild_check, .arg = &fences,
        .seed = 3, .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    *g_atexit_in_child = 0;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.fences, 10);
    assert_int_equal(rep.points_tested, 11);       /* the exploration went on */
    assert_int_equal(rep.failures, 4);
    static const struct { uint64_t fence; int status; } want[] = {
        {2, 128 + SIGABRT}, {4, 128 + SIGSEGV}, {6, 7}, {8, -1},
    };
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rep.first[i].point.fence, want[i].fence);
        assert_int_equal(rep.first[i].status, want[i].status);
        assert_non_null(strstr(rep.first[i].backtrace, "nvh_sim_drain"));
    }
    assert_int_equal(*g_atexit_in_child, 0);              /* children used _exit */
    assert_int_equal(sim_count_files(g_scratch, "", 0), 0); /* crashed children's images too */

    /* keep_failed_images keeps the crashed checkers' images as well; without
     * scratch_dir, NVHEAP_SCRATCH says where they go */
    cfg.keep_failed_images = 1;
    cfg.scratch_dir = NULL;
    setenv("NVHEAP_SCRATCH", g_scratch, 1);
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    unsetenv("NVHEAP_SCRATCH");
    assert_int_equal(rep.failures, 4);
    assert_int_equal(sim_count_files(g_scratch, ".img", 1), 4);
    assert_int_equal(sim_count_files(g_scratch, "", 0), 0);
    unlink(path);
}

static void exiting_checker_reported(void **state)
{
    (void)state;
    const char *path = counter_pool();
    uint64_t fences = 5;
    nvh_crash_config cfg = {
        .pool_path = path, .workload = counter_workload, .check = exiting_check,
        .arg = &fences, .scratch_dir = g_scratch, .budget = 100,
    };
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    assert_int_equal(rep.points_tested, 6);
    assert_int_equal(rep.failures, 1);
    assert_int_equal(rep.first[0].point.fence, 3);
    assert_int_equal(rep.first[0].point.fence_count, 5);
    assert_int_equal(rep.first[0].status, 9);
    assert_int_equal(sim_count_files(g_scratch, "", 0), 0);
    unlink(path);
}

/* A final-point failure's backtrace is the explorer's caller's stack. */
static int final_fails(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)image; (void)arg;
    return pt->fence == 3 ? 1 : 0;     /* the final point of a 3-fence run */
}

void final_point_failure(void **state);   /* global: the backtrace must name it */
void final_point_failure(void **state)
{
    (void)state;
    const char *path = counter_pool();
    uint64_t fences = 3;
    nvh_crash_config cfg = {
        .pool_path = path, .workload = counter_workload, .check = final_fails,
        .arg = &fences, .scratch_dir = g_scratch,
    };
    nvh_crash_report rep;
    setenv("NVHEAP_CRASH_VERBOSE", "1", 1);     /* progress lines: must not disturb */
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    unsetenv("NVHEAP_CRASH_VERBOSE");
    assert_int_equal(rep.workload_status, 42);
    assert_int_equal(rep.failures, 1);
    assert_int_equal(rep.first[0].point.fence, 3);
    assert_int_equal(rep.first[0].point.fence_count, 3);
    assert_non_null(strstr(rep.first[0].backtrace, "final point"));
    assert_non_null(strstr(rep.first[0].backtrace, "final_point_failure"));
    unlink(path);
}

/* SIG_IGN for SIGCHLD makes the kernel reap children itself; the explorer
 * must still see their statuses, and put the disposition back. */
static void sigchld_ignored(void **state)
{
    (void)state;
    const char *path = counter_pool();
    uint64_t fences = 10;
    nvh_crash_config cfg = {
        .pool_path = path, .workload = counter_workload, .check = wild_check, .arg = &fences,
        .seed = 3, .scratch_dir = g_scratch,
    };
    struct sigaction ign, old, now;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    assert_int_equal(sigaction(SIGCHLD, &ign, &old), 0);
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(&cfg, &rep), NVH_OK);
    assert_int_equal(sigaction(SIGCHLD, &old, &now), 0);
    assert_true(now.sa_handler == SIG_IGN);
    assert_int_equal(rep.failures, 4);
    assert_int_equal(rep.first[1].status, 128 + SIGSEGV);
    unlink(path);
}

int main(void)
{
    g_main_pid = getpid();
    g_atexit_in_child = sim_shared_alloc(sizeof *g_atexit_in_child);
    g_scratch = sim_scratch_dir("checker");
    atexit(atexit_probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crashing_checker_reported),
        cmocka_unit_test(exiting_checker_reported),
        cmocka_unit_test(final_point_failure),
        cmocka_unit_test(sigchld_ignored),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(g_scratch);
    return failed;
}
