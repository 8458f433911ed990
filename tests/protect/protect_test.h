/* protect_test.h — helpers for the protection tests: pools in the process
 * domain, a non-faulting "is this page writable?" probe (/proc/self/maps),
 * and running a piece of a test in a forked child with its stderr captured
 * (stray writes abort the process, so they are tested in children). */
#ifndef NVH_PROTECT_TEST_H
#define NVH_PROTECT_TEST_H

#include "test_util.h"
#include "protect/protect.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define MIB ((uint64_t)1 << 20)
#define PAGE 4096u

/* Pool files made by pt_pool are removed when the test program exits (a
 * test may close and reopen one meanwhile). In a forked child, which the
 * stray tests end with an abort, the file is unlinked at once: the child
 * keeps its mapping and never reopens the path. */
#define PT_MADE_MAX 64
static char pt_made[PT_MADE_MAX][512];
static unsigned pt_made_n;
static pid_t pt_main_pid;

__attribute__((constructor)) static void pt_note_main_pid(void) { pt_main_pid = getpid(); }

static void pt_remove_made(void)
{
    if (getpid() != pt_main_pid) return;
    for (unsigned i = 0; i < pt_made_n; i++) unlink(pt_made[i]);
}

static inline nvh_pool *pt_pool(const char *name, uint64_t size)
{
    const char *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(path, "protect", size, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "create: %s\n", nvh_errormsg());
        return NULL;
    }
    if (getpid() != pt_main_pid) {
        unlink(path);
    } else if (pt_made_n < PT_MADE_MAX) {
        if (pt_made_n == 0) atexit(pt_remove_made);
        snprintf(pt_made[pt_made_n++], sizeof pt_made[0], "%s", path);
    }
    return pool;
}

static inline void pt_close(nvh_pool *pool, const char *path)
{
    (void)path;
    nvh_pool_close(pool);
}

/* Heap page i of the pool (past the superblock and root). */
static inline char *pt_page(nvh_pool *pool, unsigned i)
{
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    return (char *)nvh_pool_base(pool) + info.heap_offset + (uint64_t)i * PAGE;
}

/* 1 if the page holding addr is mapped writable, 0 if not, -1 if unknown.
 * Reads /proc/self/maps, so it never faults. */
static inline int pt_writable(const void *addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    uintptr_t a = (uintptr_t)addr;
    char line[512];
    int result = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
        if (a >= lo && a < hi) { result = perms[1] == 'w'; break; }
    }
    fclose(f);
    return result;
}

static inline nvh_protect_stats pt_stats(nvh_pool *pool)
{
    nvh_protect_stats s;
    nvh_protect_stats_get(pool, &s);
    return s;
}

/* Run fn(arg) in a forked child with stderr captured into out (NUL-ended).
 * Returns the wait status. */
typedef void (*pt_child_fn)(void *arg);
static inline int pt_run_child(pt_child_fn fn, void *arg, char *out, size_t outlen)
{
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(fds[0], out + len, outlen - 1 - len)) > 0) {
        len += (size_t)n;
        if (len == outlen - 1) break;
    }
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

#endif
