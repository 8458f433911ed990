/* pool.c — pool files: create, open (validate, lock, detect the domain, map),
 * grow, close, and the superblock's state updates. The layers above the
 * pool (heap and transaction recovery, the epoch commit, the clean mark) are
 * sequenced by src/lifecycle, which calls the primitives declared in pool.h.
 *
 * Mapping: a pool is mapped at the start of a reserved PROT_NONE virtual
 * range as large as its max_size, so nvh_pool_grow maps the new tail in place
 * and the base never moves ([Schwalb15] §3.2: "a contiguous range in virtual
 * memory"). Validation reads the superblock with pread before anything is
 * mapped or written, so a bad file is reported without being touched. */
#include "pool.h"
#include "format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif
#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* src/protect: write windows around superblock stores, new pages protected
 * at grow, protection off at close */
#include "../protect/protect.h"

#define DEFAULT_MAX_SIZE ((uint64_t)64 << 30)
#define MAP_ALIGN ((uint64_t)2 << 20)   /* 2 MiB: lets DAX use huge pages */

/* --------------------------------------------------------------------------
 * Small helpers
 * -------------------------------------------------------------------------- */
/* NVHEAP_MAX_SIZE if set to a valid size, else 0 (unset or junk: ignored). */
static uint64_t env_max_size(void)
{
    const char *env = getenv("NVHEAP_MAX_SIZE");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 0);
        if (*end == '\0' && v >= NVH_POOL_MIN_SIZE && v <= NVH_POOL_MAX_SIZE) return v;
    }
    return 0;
}

/* NVHEAP_POPULATE=1: NVH_POOL_POPULATE for every pool (nvheap.h). */
static unsigned env_populate(void)
{
    const char *env = getenv("NVHEAP_POPULATE");
    return env && strcmp(env, "1") == 0 ? NVH_POOL_POPULATE : 0u;
}

/* The growth limit of a new pool that did not ask for one. */
static uint64_t default_max_size(void)
{
    uint64_t v = env_max_size();
    return v ? v : DEFAULT_MAX_SIZE;
}

/* The growth limit of a reopened pool: NVHEAP_MAX_SIZE if the operator set
 * it (an explicit override, like LMDB's mapsize at open), else the max_size
 * recorded at create, else the default (pools made before it was recorded). */
static uint64_t open_max_size(const struct nvh_superblock_header *h)
{
    uint64_t v = env_max_size();
    if (v) return v;
    if (h->max_size >= NVH_POOL_MIN_SIZE && h->max_size <= NVH_POOL_MAX_SIZE) return h->max_size;
    return DEFAULT_MAX_SIZE;
}

static bool state_valid(const struct nvh_superblock_header *h,
                        const struct nvh_superblock_state *s)
{
    return s->sequence != 0 && s->checksum == nvh_sb_state_checksum(s) &&
           s->uuid_crc == nvh_sb_uuid_crc(h);
}

/* Index of the current state slot, or -1 if neither is valid. */
static int current_slot(const struct nvh_superblock *sb)
{
    bool v0 = state_valid(&sb->header, &sb->state[0]);
    bool v1 = state_valid(&sb->header, &sb->state[1]);
    if (v0 && v1) return sb->state[1].sequence > sb->state[0].sequence ? 1 : 0;
    if (v0) return 0;
    if (v1) return 1;
    return -1;
}

static int open_errno_code(int e)
{
    switch (e) {
    case ENOENT: return NVH_E_NOENT;
    case EEXIST: return NVH_E_EXISTS;
    case EACCES: case EPERM: case EROFS: return NVH_E_READONLY;
    case ENOSPC: case EDQUOT: return NVH_E_NOSPACE;
    case ENOMEM: return NVH_E_NOMEM;
    default: return NVH_E_IO;
    }
}

/* Re-raise the thread's last error with the pool file named in front, for
 * errors raised by layers that do not know the path (domain resolution). */
static int fail_naming_file(const char *what, const char *path)
{
    return nvh_fail_context(nvh_errcode(), "%s %s", what, path);
}

static int read_full(int fd, void *buf, size_t len, off_t off)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n; len -= (size_t)n; off += n;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len, off_t off)
{
    const char *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len, off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n; len -= (size_t)n; off += n;
    }
    return 0;
}

/* Give the file `size` bytes, really allocated unless the caller asked for a
 * sparse file: a sparse pool on a full disk would SIGBUS at some later store
 * instead of failing here with NVH_E_NOSPACE. */
static int size_file(int fd, uint64_t size, unsigned flags, const char *path)
{
    if (!(flags & NVH_CREATE_NOFALLOCATE)) {
        int e = posix_fallocate(fd, 0, (off_t)size);
        if (e == 0) return NVH_OK;
        if (e != EOPNOTSUPP && e != EINVAL)
            return nvh_fail_errno(open_errno_code(e), e, "cannot allocate %llu bytes for %s",
                                  (unsigned long long)size, path);
    }
    if (ftruncate(fd, (off_t)size) != 0)
        return nvh_fail_errno(open_errno_code(errno), errno, "cannot size %s to %llu bytes",
                              path, (unsigned long long)size);
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Domain detection and mapping
 * -------------------------------------------------------------------------- */
static bool file_is_dax(int fd, uint64_t size)
{
    /* PROT_READ only, so the probe also works on a read-only descriptor:
     * MAP_SYNC is validated against the file whatever the protection. */
    (void)size;
    void *p = mmap(NULL, NVH_PAGE, PROT_READ, MAP_SHARED_VALIDATE | MAP_SYNC, fd, 0);
    if (p == MAP_FAILED) return false;
    munmap(p, NVH_PAGE);
    return true;
}

static nvh_domain detect_domain(int fd, uint64_t size)
{
    if (file_is_dax(fd, size)) return NVH_DOMAIN_PMEM;
    struct statfs fs;
    if (fstatfs(fd, &fs) == 0 && (unsigned long)fs.f_type == TMPFS_MAGIC)
        return NVH_DOMAIN_PROCESS;
    return NVH_DOMAIN_MSYNC;
}

static int mmap_flags_for(const nvh_pool *pool, bool dax)
{
    if (pool->ctx.domain == NVH_DOMAIN_SIM) return MAP_PRIVATE | MAP_FIXED;
    if (dax && !pool->readonly) return MAP_SHARED_VALIDATE | MAP_SYNC | MAP_FIXED;
    return MAP_SHARED | MAP_FIXED;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define POPULATE_BATCH ((uintptr_t)2 << 20)

/* NVH_POOL_POPULATE is asked for and the domain stores straight to the
 * mapping (msync and the crash simulator track dirty pages themselves). */
static bool populate_domain(const nvh_pool *pool)
{
    nvh_domain d = (nvh_domain)pool->ctx.domain;
    return (pool->flags & NVH_POOL_POPULATE) &&
           (d == NVH_DOMAIN_PMEM || d == NVH_DOMAIN_EADR || d == NVH_DOMAIN_PROCESS);
}

/* Map file bytes [from, to) at base+from. */
static int map_range(nvh_pool *pool, uint64_t from, uint64_t to, bool dax)
{
    int prot = pool->readonly ? PROT_READ : PROT_READ | PROT_WRITE;
    void *want = pool->ctx.base + from;
    int mflags = mmap_flags_for(pool, dax);
    /* prefault: read-fault every page now (a shared mapping is populated
     * writable without dirtying; a private one would copy the file) */
    if ((pool->flags & NVH_POOL_PREFAULT) && pool->ctx.domain != NVH_DOMAIN_SIM)
        mflags |= MAP_POPULATE;
    void *got = mmap(want, to - from, prot, mflags, pool->fd, (off_t)from);
    if (got == MAP_FAILED)
        return nvh_fail_errno(NVH_E_IO, errno, "cannot map %s", pool->path);
    NVH_ASSERT(got == want);
    /* populate: 2 MiB pages where the file system has them (the base is
     * 2 MiB aligned, MAP_ALIGN); a hint, so a refusal changes nothing */
    if (populate_domain(pool) && !pool->readonly) (void)madvise(got, to - from, MADV_HUGEPAGE);
    return NVH_OK;
}

void nvh_pool_populate_fresh_(nvh_pool *pool, const void *addr, size_t len)
{
    if (nvh_protect_epoch_(pool) || (pool->flags & NVH_POOL_PREFAULT) || pool->readonly) return;
    nvh_domain d = (nvh_domain)pool->ctx.domain;
    if (d != NVH_DOMAIN_PMEM && d != NVH_DOMAIN_PROCESS && d != NVH_DOMAIN_EADR) return;
    uintptr_t pg = NVH_PAGE, a = (uintptr_t)addr & ~(pg - 1), b = ((uintptr_t)addr + len + pg - 1) & ~(pg - 1);
    (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
}

void nvh_pool_populate_(nvh_pool *pool, void *addr, uint64_t len)
{
    if (!populate_domain(pool) || pool->readonly) return;
    /* in 2 MiB batches on 2 MiB boundaries: each call can be one huge page,
     * and no single call holds the mapping's lock for long */
    uintptr_t a = (uintptr_t)addr, end = a + len;
    while (a < end) {
        uintptr_t next = (a + POPULATE_BATCH) & ~(uintptr_t)(POPULATE_BATCH - 1);
        if (next > end) next = end;
        (void)madvise((void *)a, next - a, MADV_POPULATE_WRITE);   /* a hint: errors ignored */
        a = next;
    }
}

/* --------------------------------------------------------------------------
 * State updates
 * -------------------------------------------------------------------------- */
static int state_commit(nvh_pool *pool, uint64_t size, uint64_t epoch, uint32_t clean,
                        bool fence)
{
    struct nvh_superblock *sb = pool->sb;
    /* the slot about to be overwritten is current only once the newest one
     * is durable: an unfenced commit (nvh_superblock_set_flags) is made
     * durable first, by this thread (its flush + fence) */
    if (pool->state_unfenced) nvh_persist(pool, &sb->state[pool->state_slot], sizeof sb->state[0]);
    uint64_t seq = pool->state_seq + 1;
    struct nvh_superblock_state *slot = &sb->state[seq % 2];
    struct nvh_superblock_state next = {
        .sequence = seq, .pool_size = size, .epoch = epoch, .clean = clean,
        .flags = pool->state_flags,
        .uuid_crc = nvh_sb_uuid_crc(&sb->header),
    };
    next.checksum = nvh_sb_state_checksum(&next);
    nvh_protect_open_(pool, slot, sizeof *slot);
    memcpy(slot, &next, sizeof next);
    if (fence) nvh_persist(pool, slot, sizeof *slot);
    else nvh_flush(pool, slot, sizeof *slot);
    nvh_protect_close_(pool, slot, sizeof *slot);
    pool->state_seq = seq;
    pool->state_slot = (unsigned)(seq % 2);
    pool->state_unfenced = !fence;
    pool->epoch = epoch;
    return NVH_OK;
}

int nvh_pool_state_commit_(nvh_pool *pool, uint64_t size, uint64_t epoch, uint32_t clean)
{
    return state_commit(pool, size, epoch, clean, true);
}

int nvh_superblock_set_flags(nvh_pool *pool, uint32_t flags)
{
    if ((pool->state_flags & flags) == flags) return NVH_OK;
    pool->state_flags |= flags;
    return state_commit(pool, nvh_pool_size(pool), pool->epoch, 0, false);
}

/* --------------------------------------------------------------------------
 * Validation of a pool file (pread only: never writes)
 * -------------------------------------------------------------------------- */
static int validate(int fd, const char *path, const char *layout,
                    struct nvh_superblock *sb, uint64_t *file_size_out, int *slot_out)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return nvh_fail_errno(NVH_E_IO, errno, "cannot stat %s", path);
    if (!S_ISREG(st.st_mode)) return nvh_fail(NVH_E_INVAL, "%s is not a regular file", path);
    uint64_t file_size = (uint64_t)st.st_size;
    memset(sb, 0, sizeof *sb);
    size_t have = file_size < sizeof *sb ? (size_t)file_size : sizeof *sb;
    if (have && read_full(fd, sb, have, 0) != 0)
        return nvh_fail_errno(NVH_E_IO, errno, "cannot read the superblock of %s", path);
    if (have < sizeof sb->header.magic ||
        memcmp(sb->header.magic, NVH_MAGIC, sizeof sb->header.magic) != 0)
        return nvh_fail(NVH_E_BADMAGIC, "%s is not an nvheap pool (bad magic)", path);
    if (file_size < NVH_SUPERBLOCK_SIZE)
        return nvh_fail(NVH_E_TRUNCATED, "%s is truncated: %llu bytes, shorter than its "
                        "superblock", path, (unsigned long long)file_size);
    if (sb->header.format_version > NVH_FORMAT_VERSION)
        return nvh_fail(NVH_E_VERSION, "%s has format version %u; this library reads up to %u",
                        path, sb->header.format_version, NVH_FORMAT_VERSION);
    if (sb->header.checksum != nvh_sb_header_checksum(&sb->header)) {
        /* An upgrade torn by a crash (format_upgrade): it stores only the
         * version word and the checksum, so a header whose checksum is
         * that of another version this library opens is the pool at the
         * lower of the two versions (nothing of the higher one is written
         * before the upgrade's fence), not upgraded yet */
        struct nvh_superblock_header old = sb->header;
        uint32_t w = sb->header.format_version;
        for (uint32_t v = NVH_FORMAT_UPGRADE_FROM; v <= NVH_FORMAT_VERSION; v++) {
            old.format_version = v;
            if (w < NVH_FORMAT_UPGRADE_FROM || w == v ||
                sb->header.checksum != nvh_sb_header_checksum(&old))
                continue;
            old.format_version = v < w ? v : w;
            sb->header.format_version = old.format_version;
            sb->header.checksum = nvh_sb_header_checksum(&old);
            break;
        }
    }
    if (sb->header.format_version >= 1 && sb->header.format_version < NVH_FORMAT_UPGRADE_FROM)
        return nvh_fail(NVH_E_VERSION, "%s has format version %u; this library reads formats "
                        "%u to %u (format 3 keeps the allocator's region headers outside the "
                        "objects, in header chunks). To migrate, open it with the nvheap release "
                        "that wrote it and copy its objects into a pool created by this one (for "
                        "key-value stores: nvheap dump with that release, nvheap load with "
                        "this one)", path, sb->header.format_version, NVH_FORMAT_UPGRADE_FROM,
                        NVH_FORMAT_VERSION);
    if (sb->header.checksum != nvh_sb_header_checksum(&sb->header))
        return nvh_fail(NVH_E_CHECKSUM, "%s: superblock header checksum mismatch "
                        "(stored %08x, computed %08x)", path, sb->header.checksum,
                        nvh_sb_header_checksum(&sb->header));
    if (sb->header.format_version == 0 || sb->header.header_size != sizeof sb->header)
        return nvh_fail(NVH_E_CORRUPT, "%s: superblock header has version %u, size %u",
                        path, sb->header.format_version, sb->header.header_size);
    if (sb->header.layout[NVH_LAYOUT_MAX] != '\0')
        return nvh_fail(NVH_E_CORRUPT, "%s: layout name is not terminated", path);
    if (layout && strcmp(layout, sb->header.layout) != 0)
        return nvh_fail(NVH_E_LAYOUT, "%s has layout '%s', expected '%s'", path,
                        sb->header.layout, layout);
    int slot = current_slot(sb);
    if (slot < 0)
        return nvh_fail(NVH_E_CHECKSUM, "%s: both superblock state slots fail their checksum",
                        path);
    const struct nvh_superblock_state *s = &sb->state[slot];
    const struct nvh_superblock_header *h = &sb->header;
    if (s->pool_size < NVH_POOL_MIN_SIZE || s->pool_size > NVH_POOL_MAX_SIZE ||
        s->pool_size % NVH_PAGE || h->root_offset != NVH_SUPERBLOCK_SIZE ||
        h->root_size % NVH_PAGE || h->heap_offset != h->root_offset + h->root_size ||
        h->heap_offset > s->pool_size)
        return nvh_fail(NVH_E_CORRUPT, "%s: superblock describes an impossible layout "
                        "(size %llu, root %llu+%llu, heap at %llu)", path,
                        (unsigned long long)s->pool_size, (unsigned long long)h->root_offset,
                        (unsigned long long)h->root_size, (unsigned long long)h->heap_offset);
    if (file_size < s->pool_size)
        return nvh_fail(NVH_E_TRUNCATED, "%s is truncated: %llu bytes, its superblock says %llu",
                        path, (unsigned long long)file_size, (unsigned long long)s->pool_size);
    *file_size_out = file_size;
    *slot_out = slot;
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Open (shared by create and open: fd is open, locked and validated)
 * -------------------------------------------------------------------------- */
void nvh_pool_file_close_(nvh_pool *pool)
{
    if (!pool) return;
    nvh_protect_detach_(pool);            /* first: the layers below may write */
    nvh_sim_detach(pool);
    nvh_msync_fini(pool);
    if (pool->reserved) munmap(pool->reserved, pool->reserved_size);
    if (pool->fd >= 0) close(pool->fd);   /* also drops the flock */
    pthread_mutex_destroy(&pool->grow_lock);
    pthread_mutex_destroy(&pool->hooks_lock);
    free(pool->path);
    free(pool);
}

/* Raise an older pool's version word at its first read-write open, before
 * anything of the newer format can be written into it (this runs before
 * the heap opens). Two 4-byte stores, version and checksum, made durable
 * by one fence: a crash before it leaves either header, or a mix of the
 * two, which validate() reads as the old header (its checksum is that of
 * the old or the new version); the next read-write open upgrades it again.
 * An older library refuses the upgraded pool (newer version) and a torn
 * one (checksum). hdr: the header as validate() read it. */
static void format_upgrade(nvh_pool *pool, const struct nvh_superblock_header *hdr)
{
    struct nvh_superblock_header n = *hdr;
    n.format_version = NVH_FORMAT_VERSION;
    n.checksum = nvh_sb_header_checksum(&n);
    struct nvh_superblock_header *m = &pool->sb->header;
    m->format_version = n.format_version;
    m->checksum = n.checksum;
    nvh_flush(pool, &m->format_version, sizeof m->format_version);
    nvh_flush(pool, &m->checksum, sizeof m->checksum);
    nvh_drain(pool);
    pool->format_version = NVH_FORMAT_VERSION;
}

static nvh_pool *pool_attach(int fd, const char *path, unsigned flags,
                             const struct nvh_superblock *sb_copy, int slot,
                             uint64_t max_size)
{
    nvh_pool *pool = aligned_alloc(64, NVH_ALIGN_UP(sizeof *pool, 64));
    if (!pool) {
        close(fd);
        nvh_fail(NVH_E_NOMEM, "out of memory opening %s", path);
        return NULL;
    }
    memset(pool, 0, sizeof *pool);
    pool->fd = fd;
    pool->flags = flags | ((flags & NVH_OPEN_READONLY) ? 0u : env_populate());
    pool->readonly = (flags & NVH_OPEN_READONLY) != 0;
    /* error-checking: the crash simulator's image writer locks it to see a
     * stable pool size, and may run at a fence inside a grow or a heap
     * format on the thread that holds it (EDEADLK then tells it so) */
    pthread_mutexattr_t grow_attr;
    pthread_mutexattr_init(&grow_attr);
    pthread_mutexattr_settype(&grow_attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&pool->grow_lock, &grow_attr);
    pthread_mutexattr_destroy(&grow_attr);
    pthread_mutex_init(&pool->hooks_lock, NULL);
    pool->path = strdup(path);
    uint64_t size = sb_copy->state[slot].pool_size;
    pool->state_seq = sb_copy->state[slot].sequence;
    pool->state_flags = sb_copy->state[slot].flags;
    pool->state_slot = (unsigned)slot;
    pool->epoch = sb_copy->state[slot].epoch;
    pool->created_domain = (nvh_domain)sb_copy->header.created_domain;
    pool->opened_clean = sb_copy->state[slot].clean != 0;
    pool->format_version = sb_copy->header.format_version;

    bool dax = file_is_dax(fd, size);
    nvh_domain domain;
    if (!pool->path || nvh_domain_resolve(flags, dax ? NVH_DOMAIN_PMEM : detect_domain(fd, size),
                                          &domain) != NVH_OK) {
        if (!pool->path) nvh_fail(NVH_E_NOMEM, "out of memory opening %s", path);
        else fail_naming_file("cannot open pool", path);
        goto fail;
    }
    if (domain == NVH_DOMAIN_SIM && pool->readonly) {
        nvh_fail(NVH_E_INVAL, "%s: the sim domain needs a read-write open", path);
        goto fail;
    }
    pool->ctx.domain = (uint8_t)domain;
    pool->ctx.flush_kind = (uint8_t)(domain == NVH_DOMAIN_PMEM ? nvh_flush_kind_select()
                                                                : NVH_FLUSH_NONE);
    pool->ctx.nt_threshold = nvh_nt_threshold_default();
    if (max_size < size) max_size = size;
    pool->max_size = max_size;

    /* reserve max_size (+ alignment slack), then map the file at its start */
    pool->reserved_size = max_size + MAP_ALIGN;
    pool->reserved = mmap(NULL, pool->reserved_size, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (pool->reserved == MAP_FAILED) {
        pool->reserved = NULL;
        nvh_fail_errno(NVH_E_NOMEM, errno, "cannot reserve %llu bytes of address space for %s",
                       (unsigned long long)pool->reserved_size, path);
        goto fail;
    }
    pool->ctx.base = (char *)NVH_ALIGN_UP((uintptr_t)pool->reserved, MAP_ALIGN);
    atomic_store_explicit(&pool->ctx.size, size, memory_order_relaxed);
    if (map_range(pool, 0, size, dax && domain != NVH_DOMAIN_SIM) != NVH_OK) goto fail;
    pool->sb = (struct nvh_superblock *)pool->ctx.base;

    if (domain == NVH_DOMAIN_MSYNC && nvh_msync_init(pool) != NVH_OK) goto fail;
    if (domain == NVH_DOMAIN_SIM && nvh_sim_attach(pool) != NVH_OK) goto fail;
    if (!pool->readonly && sb_copy->header.format_version < NVH_FORMAT_VERSION)
        format_upgrade(pool, &sb_copy->header);

    return pool;
fail:
    nvh_pool_file_close_(pool);
    return NULL;
}

static int lock_file(int fd, const char *path, bool shared)
{
    while (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK)
            return nvh_fail(NVH_E_BUSY, "pool %s is in use (open in this or another process)",
                            path);
        return nvh_fail_errno(NVH_E_IO, errno, "cannot lock %s", path);
    }
    return NVH_OK;
}

nvh_pool *nvh_pool_file_open_(const char *path, const char *layout, unsigned flags)
{
    if (!path) {
        nvh_fail(NVH_E_INVAL, "nvh_pool_open: path is NULL");
        return NULL;
    }
    bool readonly = (flags & NVH_OPEN_READONLY) != 0;
    bool unlocked = (flags & NVH_OPEN_SHARED) != 0;
    if (unlocked && !readonly) {
        nvh_fail(NVH_E_INVAL, "cannot open %s: NVH_OPEN_SHARED needs NVH_OPEN_READONLY", path);
        return NULL;
    }
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer forever; validate() then refuses anything but a regular file,
     * and the flag is dropped (it means nothing for regular files). */
    int fd = open(path, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        nvh_fail_errno(open_errno_code(e), e, "cannot open pool %s%s", path,
                       e == EACCES && !readonly ? " for writing" : "");
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    struct nvh_superblock sb;
    uint64_t file_size = 0;
    int slot = -1;
    /* A shared open takes no lock: it must work beside a writer's
     * exclusive one, and must not keep the next writer out. */
    if ((!unlocked && lock_file(fd, path, readonly) != NVH_OK) ||
        validate(fd, path, layout, &sb, &file_size, &slot) != NVH_OK) {
        close(fd);
        return NULL;
    }
    return pool_attach(fd, path, flags, &sb, slot, open_max_size(&sb.header));
}

/* --------------------------------------------------------------------------
 * Create
 * -------------------------------------------------------------------------- */
static void make_uuid(uint8_t uuid[16])
{
    if (getrandom(uuid, 16, 0) != 16) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
        for (int i = 0; i < 16; i++) { x = x * 6364136223846793005ull + 1; uuid[i] = (uint8_t)(x >> 56); }
    }
    uuid[6] = (uint8_t)((uuid[6] & 0x0F) | 0x40);   /* version 4 */
    uuid[8] = (uint8_t)((uuid[8] & 0x3F) | 0x80);   /* RFC 4122 variant */
}

nvh_pool *nvh_pool_file_create_(const char *path, const char *layout, uint64_t size,
                                unsigned flags, const nvh_pool_options *options)
{
    nvh_pool_options opts = {0};
    if (options) opts = *options;
    if (!layout) layout = "";
    if (!path) { nvh_fail(NVH_E_INVAL, "nvh_pool_create: path is NULL"); return NULL; }
    if (strlen(layout) > NVH_LAYOUT_MAX) {
        nvh_fail(NVH_E_TOOLONG, "cannot create pool %s: layout name is %zu bytes; at most %u "
                 "allowed", path, strlen(layout), NVH_LAYOUT_MAX);
        return NULL;
    }
    if (flags & NVH_OPEN_READONLY) {
        nvh_fail(NVH_E_INVAL, "cannot create %s read-only", path);
        return NULL;
    }
    uint64_t root_size = opts.root_size ? opts.root_size : NVH_ROOT_DEFAULT_SIZE;
    if (root_size > NVH_ROOT_MAX_SIZE) {
        nvh_fail(NVH_E_SIZE, "cannot create pool %s: root area of %llu bytes exceeds the "
                 "maximum %llu", path, (unsigned long long)root_size,
                 (unsigned long long)NVH_ROOT_MAX_SIZE);
        return NULL;
    }
    root_size = NVH_ALIGN_UP(root_size, (uint64_t)NVH_PAGE);
    if (size > NVH_POOL_MAX_SIZE) {
        nvh_fail(NVH_E_SIZE, "cannot create pool %s: size %llu exceeds the maximum %llu",
                 path, (unsigned long long)size, (unsigned long long)NVH_POOL_MAX_SIZE);
        return NULL;
    }
    size = NVH_ALIGN_UP(size, (uint64_t)NVH_PAGE);
    uint64_t min = NVH_POOL_MIN_SIZE;
    if (NVH_SUPERBLOCK_SIZE + root_size + NVH_PAGE > min) min = NVH_SUPERBLOCK_SIZE + root_size + NVH_PAGE;
    if (size < min) {
        nvh_fail(NVH_E_SIZE, "cannot create pool %s: size %llu is below the minimum %llu",
                 path, (unsigned long long)size, (unsigned long long)min);
        return NULL;
    }
    uint64_t max_size = opts.max_size ? opts.max_size : default_max_size();
    if (max_size > NVH_POOL_MAX_SIZE) {
        nvh_fail(NVH_E_SIZE, "cannot create pool %s: max_size %llu exceeds the maximum %llu",
                 path, (unsigned long long)max_size, (unsigned long long)NVH_POOL_MAX_SIZE);
        return NULL;
    }
    nvh_domain domain;
    if (nvh_domain_resolve(flags, NVH_DOMAIN_AUTO, &domain) != NVH_OK) {
        fail_naming_file("cannot create pool", path);
        return NULL;
    }

    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        nvh_fail_errno(open_errno_code(e), e, "cannot create pool %s", path);
        return NULL;
    }
    if (lock_file(fd, path, false) != NVH_OK || size_file(fd, size, flags, path) != NVH_OK)
        goto fail;

    struct nvh_superblock sb;
    memset(&sb, 0, sizeof sb);
    struct nvh_superblock_header *h = &sb.header;
    memcpy(h->magic, NVH_MAGIC, sizeof h->magic);
    h->format_version = NVH_FORMAT_VERSION;
    h->header_size = sizeof *h;
    make_uuid(h->uuid);
    strncpy(h->layout, layout, sizeof h->layout - 1);
    h->create_time = (uint64_t)time(NULL);
    h->created_domain = domain == NVH_DOMAIN_AUTO ? detect_domain(fd, size) : domain;
    h->root_offset = NVH_SUPERBLOCK_SIZE;
    h->root_size = root_size;
    h->heap_offset = NVH_SUPERBLOCK_SIZE + root_size;
    h->max_size = max_size;
    h->area_count = 2;
    h->areas[0] = (struct nvh_area){.kind = NVH_AREA_ROOT, .offset = h->root_offset,
                                    .size = root_size};
    h->areas[1] = (struct nvh_area){.kind = NVH_AREA_HEAP, .offset = h->heap_offset, .size = 0};
    h->checksum = nvh_sb_header_checksum(h);
    struct nvh_superblock_state *s = &sb.state[1];
    *s = (struct nvh_superblock_state){.sequence = 1, .pool_size = size, .epoch = 0, .clean = 1,
                                       .uuid_crc = nvh_sb_uuid_crc(h)};
    s->checksum = nvh_sb_state_checksum(s);

    /* Everything but the magic first, then the magic: a crash during create
     * leaves a file that open rejects as "not a pool", never a half pool. */
    if (write_full(fd, (char *)&sb + 8, sizeof sb - 8, 8) != 0 || fsync(fd) != 0 ||
        write_full(fd, sb.header.magic, 8, 0) != 0 || fsync(fd) != 0) {
        nvh_fail_errno(open_errno_code(errno), errno, "cannot write the superblock of %s", path);
        goto fail;
    }
    nvh_pool *pool = pool_attach(fd, path, flags, &sb, 1, max_size);
    if (!pool) {
        nvh_err_saved err;
        nvh_err_save(&err);
        unlink(path);
        nvh_err_restore(&err);
    }
    return pool;
fail:
    {
        nvh_err_saved err;
        nvh_err_save(&err);
        close(fd);
        unlink(path);
        nvh_err_restore(&err);
    }
    return NULL;
}

/* --------------------------------------------------------------------------
 * Grow
 * -------------------------------------------------------------------------- */
int nvh_pool_grow(nvh_pool *pool, uint64_t new_size)
{
    if (!pool) return nvh_fail(NVH_E_INVAL, "nvh_pool_grow: pool is NULL");
    if (pool->readonly) return nvh_fail(NVH_E_READONLY, "pool %s is open read-only", pool->path);
    new_size = NVH_ALIGN_UP(new_size, (uint64_t)NVH_PAGE);
    pthread_mutex_lock(&pool->grow_lock);
    uint64_t old_size = atomic_load_explicit(&pool->ctx.size, memory_order_relaxed);
    int rc = NVH_OK;
    if (new_size < old_size) {
        rc = nvh_fail(NVH_E_SIZE, "cannot shrink pool %s from %llu to %llu bytes", pool->path,
                      (unsigned long long)old_size, (unsigned long long)new_size);
    } else if (new_size > pool->max_size) {
        rc = nvh_fail(NVH_E_SIZE, "pool %s cannot grow to %llu bytes: its maximum is %llu",
                      pool->path, (unsigned long long)new_size, (unsigned long long)pool->max_size);
    } else if (new_size > old_size) {
        bool dax = pool->ctx.domain == NVH_DOMAIN_PMEM && file_is_dax(pool->fd, old_size);
        /* Bytes past the recorded size are not part of the pool (a crash
         * between an earlier grow's resize and its commit leaves them, and
         * anyone may have appended): drop them so the new bytes read as zero. */
        struct stat st;
        if (fstat(pool->fd, &st) != 0)
            rc = nvh_fail_errno(NVH_E_IO, errno, "cannot stat %s", pool->path);
        else if ((uint64_t)st.st_size > old_size && ftruncate(pool->fd, (off_t)old_size) != 0)
            rc = nvh_fail_errno(NVH_E_IO, errno, "cannot trim %s to its recorded size %llu",
                                pool->path, (unsigned long long)old_size);
        if (rc == NVH_OK) rc = size_file(pool->fd, new_size, pool->flags, pool->path);
        if (rc == NVH_OK) rc = map_range(pool, old_size, new_size, dax);
        if (rc == NVH_OK && pool->sim) rc = nvh_sim_grow(pool, old_size, new_size);
        if (rc == NVH_OK) {
            atomic_store_explicit(&pool->ctx.size, new_size, memory_order_release);
            nvh_protect_grow_(pool, old_size, new_size);   /* new pages read-only */
            /* The file grew before the superblock says so: a crash in between
             * leaves a longer file, which open accepts. */
            nvh_pool_state_commit_(pool, new_size, pool->epoch, 0);
        }
    }
    pthread_mutex_unlock(&pool->grow_lock);
    return rc;
}

/* --------------------------------------------------------------------------
 * Open containers (internal.h, nvh_pool_hook): a list under a mutex; pools
 * have a handful of open containers, so a linear search is enough.
 * -------------------------------------------------------------------------- */
nvh_pool_hook *nvh_pool_hook_add_(nvh_pool *pool, nvh_pool_hook *hook)
{
    pthread_mutex_lock(&pool->hooks_lock);
    nvh_pool_hook *h = pool->hooks;
    while (h && h->key != hook->key) h = h->next;
    if (h) {
        h->refs++;
    } else {
        h = hook;
        h->refs = 1;
        h->next = pool->hooks;
        pool->hooks = h;
    }
    pthread_mutex_unlock(&pool->hooks_lock);
    return h;
}

nvh_pool_hook *nvh_pool_hook_get_(nvh_pool *pool, const void *key)
{
    pthread_mutex_lock(&pool->hooks_lock);
    nvh_pool_hook *h = pool->hooks;
    while (h && h->key != key) h = h->next;
    if (h) h->refs++;
    pthread_mutex_unlock(&pool->hooks_lock);
    return h;
}

unsigned nvh_pool_hook_del_(nvh_pool *pool, nvh_pool_hook *hook)
{
    pthread_mutex_lock(&pool->hooks_lock);
    unsigned left = hook->refs ? --hook->refs : 0;
    if (left == 0) {
        nvh_pool_hook **p = &pool->hooks;
        while (*p && *p != hook) p = &(*p)->next;
        if (*p) *p = hook->next;
        hook->next = NULL;
    }
    pthread_mutex_unlock(&pool->hooks_lock);
    return left;
}

/* Close the containers still open: first ask each whether it can close
 * (a refusal, *refused, leaves everything as it was), then close them all. */
int nvh_pool_close_containers_(nvh_pool *pool, bool *refused)
{
    *refused = false;
    pthread_mutex_lock(&pool->hooks_lock);
    for (nvh_pool_hook *h = pool->hooks; h; h = h->next) {
        int rc = h->close(h, 1);
        if (rc != NVH_OK) {
            pthread_mutex_unlock(&pool->hooks_lock);
            *refused = true;
            return rc;
        }
    }
    nvh_pool_hook *list = pool->hooks;
    pool->hooks = NULL;
    pthread_mutex_unlock(&pool->hooks_lock);
    int rc = NVH_OK;
    while (list) {
        nvh_pool_hook *h = list;
        list = h->next;
        h->next = NULL;
        h->refs = 0;
        int rc2 = h->close(h, 0);
        if (rc == NVH_OK) rc = rc2;
    }
    return rc;
}

/* --------------------------------------------------------------------------
 * Close
 * -------------------------------------------------------------------------- */
int nvh_pool_close_writeback_(nvh_pool *pool)
{
    int rc = NVH_OK;
    uint64_t size = atomic_load_explicit(&pool->ctx.size, memory_order_relaxed);
    uint32_t io_errors = atomic_load_explicit(&pool->io_errors, memory_order_relaxed);
    if (io_errors)
        /* fsync-gate: after a failed msync the kernel may have dropped the
         * dirty pages, so nothing written since open can be promised */
        rc = nvh_fail(NVH_E_IO, "pool %s: %u msync call(s) failed while it was open; "
                      "data written since the open may not be durable", pool->path, io_errors);
    if (pool->ctx.domain == NVH_DOMAIN_SIM) {
        /* No crash happened: every cached line would reach the media. */
        if (write_full(pool->fd, pool->ctx.base, size, 0) != 0)
            rc = nvh_fail_errno(NVH_E_IO, errno, "cannot write back sim pool %s", pool->path);
    } else if (pool->ctx.domain == NVH_DOMAIN_PROCESS || pool->ctx.domain == NVH_DOMAIN_EADR) {
        /* nothing: the page cache / persistent caches hold the data */
    }
    return rc;
}

/* --------------------------------------------------------------------------
 * Accessors
 * -------------------------------------------------------------------------- */
int nvh_pool_info_get(const nvh_pool *pool, nvh_pool_info *info)
{
    if (!pool || !info) return nvh_fail(NVH_E_INVAL, "nvh_pool_info_get: NULL argument");
    const struct nvh_superblock_header *h = &pool->sb->header;
    memset(info, 0, sizeof *info);
    memcpy(info->layout, h->layout, NVH_LAYOUT_MAX);
    memcpy(info->uuid, h->uuid, sizeof info->uuid);
    info->size = atomic_load_explicit(&pool->ctx.size, memory_order_relaxed);
    info->max_size = pool->max_size;
    info->clean_at_open = pool->opened_clean;
    info->io_errors = atomic_load_explicit(&pool->io_errors, memory_order_relaxed);
    info->epoch = pool->epoch;
    info->format_version = pool->format_version;
    info->domain = (nvh_domain)pool->ctx.domain;
    info->created_domain = pool->created_domain;
    info->root_offset = h->root_offset;
    info->root_size = h->root_size;
    info->heap_offset = h->heap_offset;
    info->heap_size = info->size - h->heap_offset;
    info->create_time = h->create_time;
    info->flush_instruction = nvh_flush_kind_name((nvh_flush_kind)pool->ctx.flush_kind);
    return NVH_OK;
}

/* The accessors accept NULL (and answer NULL / 0 / NVH_DOMAIN_AUTO). */
void *nvh_pool_base(const nvh_pool *pool) { return pool ? pool->ctx.base : NULL; }
uint64_t nvh_pool_size(const nvh_pool *pool)
{
    return pool ? atomic_load_explicit(&pool->ctx.size, memory_order_relaxed) : 0;
}
nvh_domain nvh_pool_domain(const nvh_pool *pool)
{
    return pool ? (nvh_domain)pool->ctx.domain : NVH_DOMAIN_AUTO;
}
uint64_t nvh_pool_epoch(const nvh_pool *pool) { return pool ? pool->epoch : 0; }

void *nvh_root(const nvh_pool *pool, uint64_t *size_out)
{
    if (!pool) { nvh_fail(NVH_E_INVAL, "nvh_root: pool is NULL"); return NULL; }
    if (size_out) *size_out = pool->sb->header.root_size;
    return pool->ctx.base + pool->sb->header.root_offset;
}
