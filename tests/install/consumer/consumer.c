/* consumer.c — an application outside the nvheap tree, built against an
 * installed copy (tests/install): by the compiler with pkg-config's flags,
 * and by consumer/CMakeLists.txt with find_package(nvheap CONFIG).
 *
 *   consumer POOL   creates POOL, persists a record, reopens it, checks it */
#include <nvheap.h>

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

struct record {
    uint64_t counter;
};

static int fail(const char *what)
{
    fprintf(stderr, "consumer: %s: %s\n", what, nvh_errormsg());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: consumer POOL\n");
        return 2;
    }
    unlink(argv[1]);
    nvh_pool *pool = nvh_pool_create(argv[1], "consumer", (uint64_t)2 << 20, NVH_DOMAIN_PROCESS);
    if (!pool) return fail("create");
    struct record *r = nvh_root(pool, NULL);
    r->counter = 42;
    nvh_persist(pool, &r->counter, sizeof r->counter);
    if (nvh_pool_close(pool) != NVH_OK) return fail("close");

    pool = nvh_pool_open(argv[1], "consumer", NVH_DOMAIN_PROCESS);
    if (!pool) return fail("open");
    r = nvh_root(pool, NULL);
    int ok = r->counter == 42;
    if (nvh_pool_close(pool) != NVH_OK) return fail("close");
    unlink(argv[1]);
    if (!ok) {
        fprintf(stderr, "consumer: the record did not survive the reopen\n");
        return 1;
    }
    printf("consumer: nvheap %d.%d.%d ok\n", NVH_VERSION_MAJOR, NVH_VERSION_MINOR, NVH_VERSION_PATCH);
    return 0;
}
