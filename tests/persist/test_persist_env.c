/* test_persist_env.c — how a pool's way of persisting is chosen: the
 * NVHEAP_FLUSH override (honoured only for an instruction the CPU has, and
 * only in the pmem domain), the NVHEAP_DOMAIN override (and that explicit
 * flags beat it), auto-detection (tmpfs -> process, a disk file -> msync;
 * DAX -> pmem needs real persistent memory and is not testable here), the
 * NVHEAP_NT_THRESHOLD knob, and the domain name table. */
#include "persist_test_util.h"

#include <sys/vfs.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#define TMPFS_MAGIC_ 0x01021994

static int setup_env(void **state)
{
    (void)state;
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_FLUSH");
    unsetenv("NVHEAP_NT_THRESHOLD");
    return 0;
}

/* The test's own CPUID reading, independent of the library's. */
static bool cpu_supports(nvh_flush_kind kind)
{
#if defined(__x86_64__)
    unsigned eax, ebx, ecx, edx;
    switch (kind) {
    case NVH_FLUSH_CLFLUSH:
        return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (edx & (1u << 19));
    case NVH_FLUSH_CLFLUSHOPT:
        return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 23));
    case NVH_FLUSH_CLWB:
        return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & (1u << 24));
    default:
        return true;
    }
#else
    return kind == NVH_FLUSH_NONE;
#endif
}

static nvh_flush_kind cpu_best(void)
{
    static const nvh_flush_kind order[] = {NVH_FLUSH_CLWB, NVH_FLUSH_CLFLUSHOPT, NVH_FLUSH_CLFLUSH};
    for (size_t i = 0; i < 3; i++)
        if (cpu_supports(order[i])) return order[i];
    return NVH_FLUSH_NONE;
}

static const char *pool_flush_instruction(nvh_pool *pool)
{
    static nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    return info.flush_instruction;
}

/* Create a pmem pool under the current environment, persist through it (so a
 * wrong choice would be SIGILL), and return the instruction it reports. */
static void expect_flush_choice(const char *env, nvh_flush_kind want)
{
    if (env) setenv("NVHEAP_FLUSH", env, 1);
    else unsetenv("NVHEAP_FLUSH");
    const char *path = test_path("flush");
    nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    const char *got = pool_flush_instruction(pool);
    if (strcmp(got, nvh_flush_kind_name(want)) != 0)
        fail_msg("NVHEAP_FLUSH=%s: pool uses %s, expected %s", env ? env : "(unset)", got,
                 nvh_flush_kind_name(want));
    assert_int_equal(nvh_flush_kind_detect(), want);      /* "after NVHEAP_FLUSH" */
    char *root = nvh_root(pool, NULL);
    for (int i = 0; i < 64; i++) nvh_memset_persist(pool, root + i * 61, i, 61);
    nvh_stats s = stats_now(pool);
    assert_true(s.lines_flushed >= 64);
    nvh_pool_close(pool);
    /* the choice is made per open: reopen sees the same environment */
    pool = nvh_pool_open(path, NULL, NVH_DOMAIN_PMEM);
    assert_string_equal(pool_flush_instruction(pool), nvh_flush_kind_name(want));
    nvh_pool_close(pool);
    unlink(path);
}

static void flush_override(void **state)
{
    (void)state;
    nvh_flush_kind best = cpu_best();
    print_message("CPU: clwb %d clflushopt %d clflush %d -> %s\n",
                  cpu_supports(NVH_FLUSH_CLWB), cpu_supports(NVH_FLUSH_CLFLUSHOPT),
                  cpu_supports(NVH_FLUSH_CLFLUSH), nvh_flush_kind_name(best));
    expect_flush_choice(NULL, best);
    static const nvh_flush_kind kinds[] = {NVH_FLUSH_CLWB, NVH_FLUSH_CLFLUSHOPT, NVH_FLUSH_CLFLUSH};
    for (size_t i = 0; i < 3; i++)
        expect_flush_choice(nvh_flush_kind_name(kinds[i]), cpu_supports(kinds[i]) ? kinds[i] : best);
    /* unknown names, "none" and case variants fall back to detection */
    expect_flush_choice("bogus", best);
    expect_flush_choice("none", best);
    expect_flush_choice("CLWB", best);
    expect_flush_choice("", best);
    unsetenv("NVHEAP_FLUSH");
    assert_string_equal(nvh_flush_kind_name(NVH_FLUSH_NONE), "none");
    assert_string_equal(nvh_flush_kind_name((nvh_flush_kind)42), "none");
}

static void flush_instruction_only_in_pmem(void **state)
{
    (void)state;
    setenv("NVHEAP_FLUSH", "clflush", 1);
    for (size_t d = 0; d < N_DOMAINS; d++) {
        if (all_domains[d] == NVH_DOMAIN_PMEM) continue;
        const char *path = test_path("flushnone");
        nvh_pool *pool = nvh_pool_create(path, NULL, MiB, all_domains[d]);
        assert_non_null(pool);
        assert_string_equal(pool_flush_instruction(pool), "none");
        nvh_pool_close(pool);
        unlink(path);
    }
    unsetenv("NVHEAP_FLUSH");
}

static void domain_env_override(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        const char *name = nvh_domain_name(all_domains[d]);
        setenv("NVHEAP_DOMAIN", name, 1);
        const char *path = test_path("envdomain");
        nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_AUTO);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_domain(pool), all_domains[d]);
        nvh_pool_info info;
        nvh_pool_info_get(pool, &info);
        assert_int_equal(info.created_domain, all_domains[d]);
        nvh_pool_close(pool);
        pool = nvh_pool_open(path, NULL, NVH_DOMAIN_AUTO);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_domain(pool), all_domains[d]);
        nvh_pool_close(pool);
        /* an explicit domain in the flags beats the environment */
        nvh_domain other = all_domains[(d + 1) % N_DOMAINS];
        pool = nvh_pool_open(path, NULL, other);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_domain(pool), other);
        nvh_pool_close(pool);
        unlink(path);
    }
    /* "auto" and the empty string mean: detect */
    static const char *const detect[] = {"auto", ""};
    for (size_t i = 0; i < 2; i++) {
        setenv("NVHEAP_DOMAIN", detect[i], 1);
        const char *path = test_path("envauto");
        nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_AUTO);
        assert_non_null(pool);
        assert_int_not_equal(nvh_pool_domain(pool), NVH_DOMAIN_AUTO);
        assert_int_not_equal(nvh_pool_domain(pool), NVH_DOMAIN_SIM);
        nvh_pool_close(pool);
        unlink(path);
    }
    unsetenv("NVHEAP_DOMAIN");
}

static bool is_tmpfs(const char *dir)
{
    struct statfs fs;
    return statfs(dir, &fs) == 0 && (unsigned long)fs.f_type == TMPFS_MAGIC_;
}

static void auto_detect_tmpfs_is_process(void **state)
{
    (void)state;
    if (!is_tmpfs("/dev/shm")) {
        print_message("/dev/shm is not a tmpfs here\n");
        skip();
    }
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/nvh-test-persist-env-%d.pool", (int)getpid());
    unlink(path);
    nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_AUTO);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_domain(pool), NVH_DOMAIN_PROCESS);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.created_domain, NVH_DOMAIN_PROCESS);
    assert_string_equal(info.flush_instruction, "none");
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, NULL, NVH_DOMAIN_AUTO);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_domain(pool), NVH_DOMAIN_PROCESS);
    nvh_pool_close(pool);
    /* read-only opens detect too */
    pool = nvh_pool_open(path, NULL, NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_domain(pool), NVH_DOMAIN_PROCESS);
    nvh_pool_close(pool);
    unlink(path);
}

static void auto_detect_disk_is_msync(void **state)
{
    (void)state;
    const char *path = test_path("disk");     /* under NVHEAP_TEST_DIR: the build dir */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    if (is_tmpfs(dir)) {
        print_message("%s is a tmpfs, not a disk\n", dir);
        skip();
    }
    nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_AUTO);
    assert_non_null(pool);
    /* a DAX mount would say pmem; this suite's scratch directory is not one */
    assert_int_equal(nvh_pool_domain(pool), NVH_DOMAIN_MSYNC);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.created_domain, NVH_DOMAIN_MSYNC);
    nvh_stats_reset(pool);
    nvh_persist(pool, nvh_root(pool, NULL), 8);
    assert_int_equal(stats_now(pool).msyncs, 1);
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, NULL, NVH_DOMAIN_AUTO);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_domain(pool), NVH_DOMAIN_MSYNC);
    nvh_pool_close(pool);
    unlink(path);
}

/* NT bytes of one aligned memcpy_persist of len bytes in a fresh pmem pool. */
static uint64_t nt_bytes_of_copy(size_t len)
{
    char *work;
    const char *path;
    nvh_pool *pool = scratch_pool("nt", NVH_DOMAIN_PMEM, 8192, &work, &path);
    static char src[8192];
    memset(src, 0x3C, sizeof src);
    nvh_memcpy_persist(pool, work, src, len);
    assert_memory_equal(work, src, len);
    uint64_t nt = stats_now(pool).nt_bytes;
    assert_int_equal(stats_now(pool).lines_flushed, lines_spanned(work, len));
    nvh_pool_close(pool);
    unlink(path);
    return nt;
}

static void nt_threshold_env(void **state)
{
    (void)state;
    unsetenv("NVHEAP_NT_THRESHOLD");                 /* default 256 */
    assert_int_equal(nt_bytes_of_copy(255), 0);
    assert_int_equal(nt_bytes_of_copy(256), 256);
    assert_int_equal(nt_bytes_of_copy(4096), 4096);
    setenv("NVHEAP_NT_THRESHOLD", "64", 1);
    assert_int_equal(nt_bytes_of_copy(63), 0);
    assert_int_equal(nt_bytes_of_copy(64), 64);
    assert_int_equal(nt_bytes_of_copy(200), 192);    /* the tail goes through the cache */
    setenv("NVHEAP_NT_THRESHOLD", "0", 1);           /* 0 disables NT copies */
    assert_int_equal(nt_bytes_of_copy(8192), 0);
    setenv("NVHEAP_NT_THRESHOLD", "4096", 1);
    assert_int_equal(nt_bytes_of_copy(4095), 0);
    assert_int_equal(nt_bytes_of_copy(4096), 4096);
    setenv("NVHEAP_NT_THRESHOLD", "junk", 1);        /* ignored: the default */
    assert_int_equal(nt_bytes_of_copy(255), 0);
    assert_int_equal(nt_bytes_of_copy(256), 256);
    unsetenv("NVHEAP_NT_THRESHOLD");
}

static void domain_names(void **state)
{
    (void)state;
    static const char *const names[] = {"auto", "pmem", "eadr", "msync", "process", "sim"};
    for (int d = NVH_DOMAIN_AUTO; d <= NVH_DOMAIN_SIM; d++) {
        assert_string_equal(nvh_domain_name((nvh_domain)d), names[d]);
        nvh_domain back = (nvh_domain)99;
        assert_int_equal(nvh_domain_parse(names[d], &back), NVH_OK);
        assert_int_equal(back, d);
    }
    assert_null(nvh_domain_name((nvh_domain)(NVH_DOMAIN_SIM + 1)));
    nvh_domain d;
    assert_int_equal(nvh_domain_parse("Pmem", &d), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), "Pmem"));
    assert_int_equal(nvh_domain_parse("", &d), NVH_E_INVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(flush_override),
        cmocka_unit_test(flush_instruction_only_in_pmem),
        cmocka_unit_test(domain_env_override),
        cmocka_unit_test(auto_detect_tmpfs_is_process),
        cmocka_unit_test(auto_detect_disk_is_msync),
        cmocka_unit_test(nt_threshold_env),
        cmocka_unit_test(domain_names),
    };
    return cmocka_run_group_tests(tests, setup_env, NULL);
}
