/* hello_pool.c — the first nvheap program: keep a small record in a pool's
 * root area so that it outlives the program.
 *
 *   hello_pool [PATH]   default: /dev/shm/nvheap-hello.pool, or
 *                       $TMPDIR/nvheap-hello.pool when there is no /dev/shm
 *
 * Each run opens the pool (creating it the first time), increments a counter
 * and rewrites a message, persisting both; then closes the pool, reopens it
 * and checks that it reads back what it wrote. Run it twice: the counter goes
 * up. Inspect the pool with `nvheap info PATH`. */
#include <nvheap.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LAYOUT "hello_pool"         /* opening a pool made for another program fails */
#define POOL_SIZE ((uint64_t)8 << 20) /* 8 MiB (the minimum is 1 MiB) */

/* The record kept at the start of the root area. It is this program's
 * on-media format: fixed-width fields and no raw pointers (the pool may be
 * mapped at another address next time). The root area is zeroed when the
 * pool is created, so a new pool starts with counter 0 and an empty message.
 * 64 bytes: exactly one cache line. */
struct hello_record {
    uint64_t counter;       /* how many runs have written the record */
    char message[56];       /* NUL-terminated */
};

static const char *default_path(char *buf, size_t len)
{
    struct stat st;
    const char *dir = getenv("TMPDIR");
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) dir = "/dev/shm";
    else if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, len, "%s/nvheap-hello.pool", dir);
    return buf;
}

/* Every nvheap call that fails leaves a message naming the file and cause. */
static int fail(const char *what)
{
    fprintf(stderr, "hello_pool: %s: %s\n", what, nvh_errormsg());
    return 1;
}

int main(int argc, char **argv)
{
    char path_buf[4096];
    const char *path = argc > 1 ? argv[1] : default_path(path_buf, sizeof path_buf);

    /* 1. Open the pool; create it if it does not exist yet. The domain (how
     *    stores are made durable) is detected from the file: tmpfs such as
     *    /dev/shm gives "process", a disk file "msync", real PMem "pmem". */
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_AUTO);
    if (!pool && nvh_errcode() == NVH_E_NOENT) {
        printf("creating %s (%llu MiB)\n", path, (unsigned long long)(POOL_SIZE >> 20));
        pool = nvh_pool_create(path, LAYOUT, POOL_SIZE, NVH_DOMAIN_AUTO);
    }
    if (!pool) return fail("cannot open the pool");
    printf("opened %s: domain %s, epoch %llu\n", path, nvh_domain_name(nvh_pool_domain(pool)),
           (unsigned long long)nvh_pool_epoch(pool));

    /* 2. Update the record in place, in the mapped pool. A store is not
     *    durable until it is persisted (flushed and fenced). Order: first
     *    the message, then the counter — an aligned 8-byte store cannot be
     *    torn by a crash, so a crash in between leaves the old counter (and a
     *    message the next run rewrites). Bigger updates that must be all or
     *    nothing need a transaction; this one does not. */
    struct hello_record *record = nvh_root(pool, NULL);
    uint64_t counter = record->counter + 1;
    char message[sizeof record->message] = {0};
    snprintf(message, sizeof message, "hello #%llu from pid %ld", (unsigned long long)counter,
             (long)getpid());
    nvh_memcpy_persist(pool, record->message, message, sizeof message);
    record->counter = counter;
    nvh_persist(pool, &record->counter, sizeof record->counter);
    printf("wrote record: counter %llu, message \"%s\"\n", (unsigned long long)counter, message);

    if (nvh_pool_close(pool) != NVH_OK) return fail("cannot close the pool");

    /* 3. Reopen and read the record back. */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_AUTO);
    if (!pool) return fail("cannot reopen the pool");
    record = nvh_root(pool, NULL);
    int ok = record->counter == counter &&
             memcmp(record->message, message, sizeof message) == 0;
    printf("reopened (epoch %llu): counter %llu, message \"%.*s\": %s\n",
           (unsigned long long)nvh_pool_epoch(pool), (unsigned long long)record->counter,
           (int)sizeof record->message, record->message, ok ? "verified" : "MISMATCH");
    if (nvh_pool_close(pool) != NVH_OK) return fail("cannot close the pool");
    return ok ? 0 : 1;
}
