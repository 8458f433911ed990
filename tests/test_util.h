/* test_util.h — helpers shared by the test programs: scratch paths, file
 * hashing (to prove a failed open left a file untouched), byte pokes. */
#ifndef NVH_TEST_UTIL_H
#define NVH_TEST_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "nvheap.h"

/* splitmix64: a test's pseudo-random values, reproducible from the seed in
 * *s (a failing seed printed by a test rebuilds its run). */
static inline uint64_t test_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A fresh path under $NVHEAP_TEST_DIR (or /tmp) that does not exist yet. */
static inline const char *test_path(const char *name)
{
    static char buf[8][512];
    static unsigned next;
    const char *dir = getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700);
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s-%d.pool", dir, name, (int)getpid());
    unlink(p);
    return p;
}

/* A fresh directory /dev/shm/NAME-PID.d for a crash test's images (made
 * once per process; the caller removes it). */
static inline const char *test_shm_scratch(const char *name)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "/dev/shm/%s-%d.d", name, (int)getpid());
    mkdir(dir, 0700);
    return dir;
}

/* FNV-1a of a whole file: equal before and after means "not modified". */
static inline uint64_t test_file_hash(const char *path)
{
    uint64_t h = 1469598103934665603ull;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c;
    while ((c = fgetc(f)) != EOF) h = (h ^ (uint64_t)(unsigned char)c) * 1099511628211ull;
    fclose(f);
    return h;
}

/* Opening `path` read-write must fail with NVH_E_CORRUPT, its message naming
 * `what` and an offset (damage is reported where it is, never formatted over). */
static inline void test_expect_open_corrupt(const char *path, const char *layout,
                                            const char *what)
{
    nvh_pool *pool = nvh_pool_open(path, layout, NVH_DOMAIN_PROCESS);
    if (pool) nvh_pool_close(pool);
    assert_null(pool);
    assert_int_equal(nvh_errcode(), NVH_E_CORRUPT);
    if (!strstr(nvh_errormsg(), what)) fail_msg("message '%s' lacks '%s'", nvh_errormsg(), what);
    assert_non_null(strstr(nvh_errormsg(), "offset"));
}

static inline void test_poke(const char *path, off_t off, const void *bytes, size_t len)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, bytes, len, off), (ssize_t)len);
    close(fd);
}

static inline void test_peek(const char *path, off_t off, void *bytes, size_t len)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, bytes, len, off), (ssize_t)len);
    close(fd);
}

/* The whole file in a malloc'd buffer (crash images); *len gets its size. */
static inline unsigned char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Run a crash exploration and require that it ran, that the workload
 * finished, and that every crash image passed the checker (on failure the
 * report, with the failing images' backtraces, goes to stderr). */
static inline void test_crash_explore(const nvh_crash_config *cfg)
{
    nvh_crash_report rep;
    assert_int_equal(nvh_crash_explore(cfg, &rep), NVH_OK);
    print_message("  %llu fences, %llu crash images checked, %llu failures\n",
                  (unsigned long long)rep.fences, (unsigned long long)rep.points_tested,
                  (unsigned long long)rep.failures);
    if (rep.failures) nvh_crash_report_print(&rep, stderr);
    assert_int_equal(rep.workload_status, 0);
    assert_int_equal(rep.failures, 0);
}

#endif
