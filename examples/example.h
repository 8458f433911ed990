/* example.h — the scaffolding the guide's examples share (docs/GUIDE.md):
 * a scratch pool path and a fresh pool, so that each example's own file
 * shows only the API it is about.
 *
 * A pool made here lives in /dev/shm (the `process` domain) or $TMPDIR (the
 * `msync` domain) under a name with the process id, so several examples can
 * run at once; the examples remove it when they are done. */
#ifndef NVHEAP_EXAMPLE_H
#define NVHEAP_EXAMPLE_H

#include <nvheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every nvheap call that fails leaves a message naming the file and cause. */
static inline int example_fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", what, nvh_errormsg());
    return 1;
}

/* argv[1] if given, else a per-process scratch path for `name`. */
static inline const char *example_path(int argc, char **argv, const char *name, char *buf,
                                       size_t len)
{
    if (argc > 1) return argv[1];
    struct stat st;
    const char *dir = getenv("TMPDIR");
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) dir = "/dev/shm";
    else if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, len, "%s/nvheap-example-%s-%ld.pool", dir, name, (long)getpid());
    return buf;
}

/* A new 16 MiB pool at path (an old file there is replaced). */
static inline nvh_pool *example_create(const char *path, const char *layout)
{
    unlink(path);
    return nvh_pool_create(path, layout, (uint64_t)16 << 20, NVH_DOMAIN_AUTO);
}

#endif
