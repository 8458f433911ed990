/* sim.c — the `sim` persistence domain: the crash simulator's media model.
 *
 * The pool's working mapping is private (MAP_PRIVATE), so nothing the program
 * stores reaches the file by itself. Beside it lives the *media image*: a
 * DRAM copy holding only what the program made durable. nvh_flush snapshots
 * each flushed line (x86 guarantees the content as of the flush, or newer, is
 * written back); nvh_drain — the fence — first calls the fence hook (where
 * nvh_crash_explore forks a crash child) and then copies the snapshots into
 * the media. A crash image is the media plus a seeded random choice for every
 * line still in flight (see nvh_sim_write_image).
 */
#include "../common/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct sim_line {
    uint64_t offset;                     /* line offset from the pool base */
    unsigned char data[NVH_CACHELINE];   /* content at flush time          */
} sim_line;

struct nvh_sim {
    pthread_mutex_t lock;
    char *media;                         /* reserved like the pool, same size  */
    uint64_t media_reserved;
    sim_line *pending;                   /* flushed, not yet fenced            */
    size_t pending_count, pending_cap;
    uint64_t fences;
    nvh_sim_fence_hook hook;
    void *hook_arg;
};

/* --------------------------------------------------------------------------
 * Attach / grow / detach
 * -------------------------------------------------------------------------- */
int nvh_sim_attach(nvh_pool *pool)
{
    nvh_sim *sim = calloc(1, sizeof *sim);
    if (!sim) return nvh_fail(NVH_E_NOMEM, "out of memory for crash simulator");
    sim->media_reserved = pool->reserved_size;
    sim->media = mmap(NULL, sim->media_reserved, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (sim->media == MAP_FAILED) {
        free(sim);
        return nvh_fail_errno(NVH_E_NOMEM, errno, "cannot reserve the simulated media");
    }
    if (mprotect(sim->media, pool->ctx.size, PROT_READ | PROT_WRITE) != 0) {
        int e = errno;
        munmap(sim->media, sim->media_reserved);
        free(sim);
        return nvh_fail_errno(NVH_E_NOMEM, e, "cannot map the simulated media");
    }
    memcpy(sim->media, pool->ctx.base, pool->ctx.size);  /* the file is durable */
    pthread_mutex_init(&sim->lock, NULL);
    pool->sim = sim;
    return NVH_OK;
}

int nvh_sim_grow(nvh_pool *pool, uint64_t old_size, uint64_t new_size)
{
    nvh_sim *sim = pool->sim;
    (void)old_size;
    if (mprotect(sim->media, new_size, PROT_READ | PROT_WRITE) != 0)
        return nvh_fail_errno(NVH_E_NOMEM, errno, "cannot grow the simulated media");
    return NVH_OK;
}

void nvh_sim_detach(nvh_pool *pool)
{
    nvh_sim *sim = pool->sim;
    if (!sim) return;
    munmap(sim->media, sim->media_reserved);
    free(sim->pending);
    pthread_mutex_destroy(&sim->lock);
    free(sim);
    pool->sim = NULL;
}

/* --------------------------------------------------------------------------
 * Flush and fence
 * -------------------------------------------------------------------------- */
/* Snapshot a line. In a multi-threaded workload another thread may be storing
 * into the line while it is flushed; on hardware that is legal (CLWB writes
 * back some version of the line) and the snapshot is likewise some version.
 * So this read is deliberately not instrumented by TSan. */
__attribute__((no_sanitize_thread))
static void snapshot_line(unsigned char *dst, const volatile unsigned char *src)
{
    for (unsigned i = 0; i < NVH_CACHELINE; i++) dst[i] = src[i];
}

void nvh_sim_flush(nvh_pool *pool, const void *addr, size_t len)
{
    nvh_sim *sim = pool->sim;
    uintptr_t base = (uintptr_t)pool->ctx.base;
    uintptr_t start = NVH_ALIGN_DOWN((uintptr_t)addr, NVH_CACHELINE);
    uintptr_t end = (uintptr_t)addr + len;
    NVH_ASSERT(nvh_contains(pool, addr, len));
    pthread_mutex_lock(&sim->lock);
    for (uintptr_t line = start; line < end; line += NVH_CACHELINE) {
        if (sim->pending_count == sim->pending_cap) {
            size_t cap = sim->pending_cap ? sim->pending_cap * 2 : 256;
            sim_line *grown = realloc(sim->pending, cap * sizeof *grown);
            if (!grown) abort(); /* a test instrument: no sane way to continue */
            sim->pending = grown;
            sim->pending_cap = cap;
        }
        sim_line *rec = &sim->pending[sim->pending_count++];
        rec->offset = line - base;
        snapshot_line(rec->data, (const volatile unsigned char *)line);
    }
    pthread_mutex_unlock(&sim->lock);
}

void nvh_sim_drain(nvh_pool *pool)
{
    nvh_sim *sim = pool->sim;
    pthread_mutex_lock(&sim->lock);
    uint64_t fence = sim->fences++;
    nvh_sim_fence_hook hook = sim->hook;
    void *hook_arg = sim->hook_arg;
    pthread_mutex_unlock(&sim->lock);

    if (hook) hook(pool, fence, hook_arg);   /* crash point: before the fence */

    pthread_mutex_lock(&sim->lock);
    for (size_t i = 0; i < sim->pending_count; i++)
        memcpy(sim->media + sim->pending[i].offset, sim->pending[i].data, NVH_CACHELINE);
    sim->pending_count = 0;
    pthread_mutex_unlock(&sim->lock);
}

uint64_t nvh_sim_fence_count(const nvh_pool *pool)
{
    return pool && pool->sim ? pool->sim->fences : 0;
}

void nvh_sim_set_fence_hook(nvh_pool *pool, nvh_sim_fence_hook hook, void *arg)
{
    if (!pool || !pool->sim) return;
    pthread_mutex_lock(&pool->sim->lock);
    pool->sim->hook = hook;
    pool->sim->hook_arg = arg;
    pthread_mutex_unlock(&pool->sim->lock);
}

/* --------------------------------------------------------------------------
 * Crash images
 * -------------------------------------------------------------------------- */
/* Building a crash image compares and copies the whole pool (its media,
 * working copy and the image) in the crash child, where no other thread
 * runs. Through memcmp and memcpy under TSan, every byte of that passes the
 * interceptors, which write shadow memory for it: page faults and copies of
 * the parent's shadow pages for each image, most of a crash test's time in
 * that build. So these helpers work word by word, uninstrumented there (and
 * not turned back into library calls). */
#if defined(__SANITIZE_THREAD__)
#define SIM_IMAGE_FN __attribute__((no_sanitize_thread, optimize("no-tree-loop-distribute-patterns")))
#else
#define SIM_IMAGE_FN
#endif
typedef uint64_t __attribute__((may_alias)) sim_word;

/* Lines and pools are 8-byte aligned: compare / copy n words. */
static SIM_IMAGE_FN bool words_equal(const void *a, const void *b, size_t n)
{
    const sim_word *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return false;
    return true;
}

static SIM_IMAGE_FN void words_copy(void *dst, const void *src, size_t n)
{
    sim_word *d = dst;
    const sim_word *s = src;
    for (size_t i = 0; i < n; i++) d[i] = s[i];
}

#define LINE_WORDS (NVH_CACHELINE / 8)

/* Mix the `fresh` line into `image` word by word: each 8-byte word
 * independently old or new (adversarial mode). */
static SIM_IMAGE_FN void mix_words(unsigned char *image, const unsigned char *fresh,
                                   uint64_t *rng)
{
    uint64_t bits = nvh_splitmix64(rng);
    for (unsigned w = 0; w < LINE_WORDS; w++)
        if (bits & (1ull << w)) words_copy(image + 8 * w, fresh + 8 * w, 1);
}

/* Lines whose content after a crash is not decided by the media: the working
 * copy differs from it, or (rarely: a line flushed, then stored back to its
 * old value) only a pending snapshot does. Counted from the state alone, not
 * from the coin flips, so it is the same for every seed at one crash point. */
static SIM_IMAGE_FN uint64_t lines_in_flight(const nvh_sim *sim, const unsigned char *work,
                                             uint64_t size)
{
    uint64_t n = 0;
    for (uint64_t off = 0; off < size; off += NVH_CACHELINE)
        n += !words_equal(sim->media + off, work + off, LINE_WORDS);
    for (size_t i = 0; i < sim->pending_count; i++) {
        const sim_line *rec = &sim->pending[i];
        n += !words_equal(sim->media + rec->offset, rec->data, LINE_WORDS) &&
             words_equal(sim->media + rec->offset, work + rec->offset, LINE_WORDS);
    }
    return n;
}

/* Build the image a power failure right now could leave:
 *  1. start from the media (what was fenced);
 *  2. each flushed-but-unfenced line's snapshot may have been written back;
 *  3. each line whose working copy still differs may have been evicted.
 * Returns the number of lines in flight (the image's degrees of freedom). */
static SIM_IMAGE_FN uint64_t build_image(nvh_pool *pool, unsigned char *image, uint64_t size,
                                         uint64_t seed, nvh_crash_mode mode)
{
    nvh_sim *sim = pool->sim;
    uint64_t rng = seed;
    const unsigned char *work = (const unsigned char *)pool->ctx.base;
    words_copy(image, sim->media, size / 8);
    for (size_t i = 0; i < sim->pending_count; i++) {
        const sim_line *rec = &sim->pending[i];
        if (words_equal(image + rec->offset, rec->data, LINE_WORDS)) continue;
        if (mode == NVH_CRASH_WORDS) mix_words(image + rec->offset, rec->data, &rng);
        else if (nvh_splitmix64(&rng) & 1) words_copy(image + rec->offset, rec->data, LINE_WORDS);
    }
    for (uint64_t off = 0; off < size; off += NVH_CACHELINE) {
        if (words_equal(image + off, work + off, LINE_WORDS)) continue;
        if (mode == NVH_CRASH_WORDS) mix_words(image + off, work + off, &rng);
        else if (nvh_splitmix64(&rng) & 1) words_copy(image + off, work + off, LINE_WORDS);
    }
    return lines_in_flight(sim, work, size);
}

/* Under TSan the image goes to the file by the system call itself: the
 * write interceptor's check of the buffer would write shadow for all of it
 * (see SIM_IMAGE_FN above). */
static inline ssize_t image_write(int fd, const void *p, size_t len)
{
#if defined(__SANITIZE_THREAD__)
    return (ssize_t)syscall(SYS_write, fd, p, len);
#else
    return write(fd, p, len);
#endif
}

static int write_all(int fd, const void *buf, uint64_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = image_write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (uint64_t)n;
    }
    return 0;
}

int nvh_sim_image_(nvh_pool *pool, const char *path, uint64_t seed, nvh_crash_mode mode,
                   uint64_t *differing_out)
{
    if (!pool || !path) return nvh_fail(NVH_E_INVAL, "nvh_sim_write_image: NULL argument");
    if (!pool->sim)
        return nvh_fail(NVH_E_INVAL, "nvh_sim_write_image: pool %s is not in the sim domain",
                        pool->path);
    pthread_mutex_lock(&pool->sim->lock);
    uint64_t size = atomic_load_explicit(&pool->ctx.size, memory_order_acquire);
    unsigned char *image = mmap(NULL, size, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (image == MAP_FAILED) {
        pthread_mutex_unlock(&pool->sim->lock);
        return nvh_fail_errno(NVH_E_NOMEM, errno, "cannot allocate a crash image of %llu bytes",
                              (unsigned long long)size);
    }
    uint64_t differing = build_image(pool, image, size, seed, mode);
    pthread_mutex_unlock(&pool->sim->lock);

    int rc = NVH_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) rc = nvh_fail_errno(NVH_E_IO, errno, "cannot create crash image %s", path);
    else {
        if (write_all(fd, image, size) != 0)
            rc = nvh_fail_errno(NVH_E_IO, errno, "cannot write crash image %s", path);
        close(fd);
    }
    munmap(image, size);
    if (differing_out) *differing_out = differing;
    return rc;
}

/* Public: may run while other threads work on the pool. It holds grow_lock
 * so the size is stable: a grow extends the file, then commits the new size
 * to the superblock, and an image taken in between with the old size could
 * pair a short file with a superblock that already records the grown size —
 * an image no real crash can produce. EDEADLK: this thread is inside a grow
 * or a heap format (a fence hook) and holds the lock already, so the size
 * cannot move either. (nvh_crash_explore calls nvh_sim_image_ in a forked
 * child, where no other thread runs and a lock held at the fork would never
 * be released: it must not take the lock.) */
int nvh_sim_write_image(nvh_pool *pool, const char *path, uint64_t seed, nvh_crash_mode mode)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_sim_write_image: NULL argument");
    int locked = pthread_mutex_lock(&pool->grow_lock) == 0;
    int rc = nvh_sim_image_(pool, path, seed, mode, NULL);
    if (locked) pthread_mutex_unlock(&pool->grow_lock);
    return rc;
}
