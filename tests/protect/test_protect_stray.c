/* test_protect_stray.c — stray writes end the process with a clear message
 * (sync and async, before any window and after a window closed), and the
 * SIGSEGV handler chains: faults outside pools reach the handler installed
 * before ours, or get the default action. Each case runs in a forked child
 * whose stderr and wait status are checked. */
#include "protect_test.h"

#include <setjmp.h>

/* ==========================================================================
 * Stray writes abort with the offset
 * ========================================================================== */
typedef struct stray_case {
    nvh_protect_mode mode;
    bool after_window;        /* open and close a window on the page first */
    uint64_t offset;          /* from the pool base                         */
} stray_case;

static void stray_child(void *arg)
{
    const stray_case *c = arg;
    nvh_pool *pool = pt_pool("stray", 4 * MIB);
    if (!pool) _exit(10);
    if (nvh_protect_set_mode(pool, c->mode, 500000000ull) != NVH_OK) _exit(11);
    char *p = (char *)nvh_pool_base(pool) + c->offset;
    if (c->after_window) {
        if (nvh_unprotect(pool, p, 8) != NVH_OK) _exit(12);
        p[0] = 1;
        if (nvh_protect(pool, p, 8) != NVH_OK) _exit(13);
        nvh_protect_sync(pool);
    }
    *(volatile char *)p = 42;                     /* the stray write */
    _exit(14);                                    /* not reached */
}

static void check_stray(nvh_protect_mode mode, bool after_window, uint64_t offset)
{
    stray_case c = {mode, after_window, offset};
    char out[4096];
    int status = pt_run_child(stray_child, &c, out, sizeof out);
    if (!WIFSIGNALED(status)) fprintf(stderr, "child status %#x, stderr: %s\n", status, out);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(out, "nvheap: stray write to protected pool memory at 0x"));
    char want[64];
    snprintf(want, sizeof want, "offset 0x%llx, page %llu", (unsigned long long)offset,
             (unsigned long long)(offset / PAGE));
    if (!strstr(out, want)) fprintf(stderr, "want '%s' in: %s\n", want, out);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, mode == NVH_PROTECT_SYNC ? "protection sync" : "protection async"));
}

static void test_stray_sync(void **state)
{
    (void)state;
    check_stray(NVH_PROTECT_SYNC, false, 0x1010);          /* the root area */
    check_stray(NVH_PROTECT_SYNC, true, 0x3008);
    check_stray(NVH_PROTECT_SYNC, false, 0x40);            /* the superblock */
}

static void test_stray_async(void **state)
{
    (void)state;
    check_stray(NVH_PROTECT_ASYNC, false, 0x1010);
    check_stray(NVH_PROTECT_ASYNC, true, 0x5ff8);
}

/* A stray handler that leaves with siglongjmp: the write never happens. */
static sigjmp_buf jump;
static nvh_stray_action jump_out(const nvh_stray_info *info, void *arg)
{
    (void)info;
    (void)arg;
    siglongjmp(jump, 1);
}

static void test_stray_callback_longjmp(void **state)
{
    (void)state;
    nvh_pool *pool = pt_pool("jump", 4 * MIB);
    assert_non_null(pool);
    assert_int_equal(nvh_protect_set_mode(pool, NVH_PROTECT_SYNC, 0), NVH_OK);
    assert_int_equal(nvh_protect_set_stray_handler(pool, jump_out, NULL), NVH_OK);
    volatile char *p = pt_page(pool, 0);
    if (sigsetjmp(jump, 1) == 0) {
        *p = 5;
        fail_msg("the stray write went through");
    }
    assert_int_equal(*p, 0);
    assert_int_equal(pt_stats(pool).strays, 1);
    nvh_pool_close(pool);                         /* not hung by the jump */
}

/* ==========================================================================
 * Chaining
 * ========================================================================== */
static void *bad_page(void)
{
    void *p = mmap(NULL, PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void own_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    _exit(si->si_code == SEGV_ACCERR ? 42 : 43);
}

typedef struct chain_case {
    bool own;                 /* install own_handler before protection       */
    bool stray_in_pool;       /* fault in the pool instead of outside it      */
    bool kill_self;           /* raise(SIGSEGV) instead of a fault             */
} chain_case;

static void chain_child(void *arg)
{
    const chain_case *c = arg;
    /* start from a plain program's state: no test framework handler */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, NULL);
    if (c->own) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = own_handler;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
    }
    nvh_pool *pool = pt_pool("chain", 4 * MIB);
    if (!pool) _exit(10);
    if (nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 1000000) != NVH_OK) _exit(11);
    if (c->stray_in_pool) *((volatile char *)nvh_pool_base(pool) + 0x2000) = 1;
    else if (c->kill_self) raise(SIGSEGV);
    else *(volatile char *)bad_page() = 1;
    _exit(14);
}

static void test_chain_to_previous(void **state)
{
    (void)state;
    char out[4096];
    chain_case c = {.own = true};
    int status = pt_run_child(chain_child, &c, out, sizeof out);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 42);    /* own_handler saw the fault */
    /* faults in the pool stay ours even with a previous handler */
    c = (chain_case){.own = true, .stray_in_pool = true};
    status = pt_run_child(chain_child, &c, out, sizeof out);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_non_null(strstr(out, "offset 0x2000"));
}

static void test_chain_to_default(void **state)
{
    (void)state;
    char out[4096];
    for (int k = 0; k < 2; k++) {
        chain_case c = {.kill_self = k == 1};
        int status = pt_run_child(chain_child, &c, out, sizeof out);
#if defined(__SANITIZE_ADDRESS__)
        /* ASan's handler was the previous one: it reports and exits */
        assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                            WEXITSTATUS(status) != 14));
#else
        if (!WIFSIGNALED(status)) fprintf(stderr, "status %#x: %s\n", status, out);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSEGV);   /* the default action, as without us */
#endif
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stray_sync),
        cmocka_unit_test(test_stray_async),
        cmocka_unit_test(test_stray_callback_longjmp),
        cmocka_unit_test(test_chain_to_previous),
        cmocka_unit_test(test_chain_to_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
