/* tx_crash_test.h — what the transaction crash tests (test_tx_crash.c,
 * test_tx_redo.c) share: the checker's complaint counter, which lives in
 * memory shared with the forked crash children, the lookup of the log
 * directory among the named objects, and the per-process setup. */
#ifndef NVH_TESTS_TX_CRASH_TEST_H
#define NVH_TESTS_TX_CRASH_TEST_H

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "test_util.h"
#include "log/log.h"

/* [0]: complaints of the checkers, [1]: free for a test's own count */
static int *g_complaints;
/* negative controls expect failures: count them, print none */
static volatile int g_complaints_quiet;
static const char *g_scratch;

/* Count a failed check, print the first few, return rc. */
static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5 && !g_complaints_quiet)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld)\n",
                (unsigned long long)(pt ? pt->fence : 0), (unsigned long long)(pt ? pt->seed : 0),
                what, a, b);
    return rc;
}

/* nvh_named_foreach callback: the transaction log directory into *arg. */
static int tx_dir_find(const char *name, void *ptr, size_t size, void *arg)
{
    (void)size;
    if (strcmp(name, NVH_TX_DIR_NAME) != 0) return 0;
    *(void **)arg = ptr;
    return 1;
}

/* Small chunks (small crash images), the shared counter, a scratch folder. */
static void tx_crash_test_init(const char *name)
{
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    g_scratch = test_shm_scratch(name);
}

#endif /* NVH_TESTS_TX_CRASH_TEST_H */
