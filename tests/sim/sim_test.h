/* sim_test.h — helpers for the crash-simulator tests: a private scratch
 * directory per test program (so leftovers are visible and nothing lands
 * outside the build tree), memory shared with crash children, whole-file
 * reads of crash images. */
#ifndef NVH_SIM_TEST_H
#define NVH_SIM_TEST_H

#include "test_util.h"

#include <dirent.h>
#include <sys/mman.h>

/* $NVHEAP_TEST_DIR/<name>-<pid>.d, created empty. */
static inline const char *sim_scratch_dir(const char *name)
{
    static char buf[4][512];
    static unsigned next;
    const char *dir = getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700);
    char *p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s-%d.d", dir, name, (int)getpid());
    mkdir(p, 0700);
    return p;
}

/* Files in dir whose name ends with suffix ("" = all). If remove is set,
 * they are deleted as well. */
static inline int sim_count_files(const char *dir, const char *suffix, int remove)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    size_t sl = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t l = strlen(e->d_name);
        if (l < sl || strcmp(e->d_name + l - sl, suffix) != 0) continue;
        n++;
        if (remove) {
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return n;
}

/* Anonymous memory that forked crash children write and the parent reads. */
static inline void *sim_shared_alloc(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, len);
    return p;
}

#endif
