/* pool_test_util.h — helpers for the pool tests: reading and rewriting the
 * superblock of a pool file (through the real on-media structs of
 * src/pool/format.h and the library's CRC32C), copying files, and the
 * EXPECT_OPEN_FAILS check that an open fails with the right code, names the
 * file in its message, and leaves the file untouched. */
#ifndef NVH_POOL_TEST_UTIL_H
#define NVH_POOL_TEST_UTIL_H

#include "test_util.h"

#include "common/internal.h"
#include "pool/format.h"

#include <sys/stat.h>
#include <sys/types.h>

/* Everything we can observe of a file without opening it as a pool. */
typedef struct file_fingerprint {
    uint64_t hash;
    off_t size;
    struct timespec mtime;
} file_fingerprint;

static inline file_fingerprint fingerprint(const char *path)
{
    file_fingerprint f = {0};
    struct stat st;
    f.hash = test_file_hash(path);
    if (stat(path, &st) == 0) {
        f.size = st.st_size;
        f.mtime = st.st_mtim;
    }
    return f;
}

static inline void assert_same_file(const char *path, file_fingerprint before)
{
    file_fingerprint after = fingerprint(path);
    assert_int_equal(after.hash, before.hash);
    assert_int_equal(after.size, before.size);
    assert_int_equal(after.mtime.tv_sec, before.mtime.tv_sec);
    assert_int_equal(after.mtime.tv_nsec, before.mtime.tv_nsec);
}

/* nvh_pool_open(path, layout, flags) must fail with `code`, its message must
 * name the file, and the file must be byte-for-byte (and mtime) unchanged. */
#define EXPECT_OPEN_FAILS(path, layout, flags, code)                          \
    do {                                                                      \
        file_fingerprint before_ = fingerprint(path);                         \
        nvh_pool *pool_ = nvh_pool_open((path), (layout), (flags));           \
        if (pool_) nvh_pool_close(pool_);                                     \
        assert_null(pool_);                                                   \
        assert_int_equal(nvh_errcode(), (code));                              \
        if (!strstr(nvh_errormsg(), (path)))                                  \
            fail_msg("message '%s' does not name %s", nvh_errormsg(), (path)); \
        assert_same_file((path), before_);                                    \
    } while (0)

/* Create a pool and close it again; returns path. */
static inline const char *make_pool(const char *name, const char *layout, uint64_t size,
                                    unsigned flags)
{
    const char *path = test_path(name);
    nvh_pool *pool = nvh_pool_create(path, layout, size, flags);
    if (!pool) fail_msg("create %s: %s", path, nvh_errormsg());
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static inline void read_superblock(const char *path, struct nvh_superblock *sb)
{
    test_peek(path, 0, sb, sizeof *sb);
}

static inline void write_superblock(const char *path, const struct nvh_superblock *sb)
{
    test_poke(path, 0, sb, sizeof *sb);
}

static inline uint32_t header_crc(const struct nvh_superblock_header *h)
{
    return nvh_crc32c(0, h, offsetof(struct nvh_superblock_header, checksum));
}

static inline uint32_t state_crc(const struct nvh_superblock_state *s)
{
    return nvh_crc32c(0, s, offsetof(struct nvh_superblock_state, checksum));
}

/* A state slot as the library writes it (valid checksum, bound to uuid). */
static inline struct nvh_superblock_state make_state(const struct nvh_superblock_header *h,
                                                     uint64_t seq, uint64_t size,
                                                     uint64_t epoch, uint32_t clean)
{
    struct nvh_superblock_state s = {.sequence = seq, .pool_size = size, .epoch = epoch,
                                     .clean = clean,
                                     .uuid_crc = nvh_crc32c(0, h->uuid, sizeof h->uuid)};
    s.checksum = state_crc(&s);
    return s;
}

static inline bool slot_valid(const struct nvh_superblock *sb, unsigned i)
{
    const struct nvh_superblock_state *s = &sb->state[i];
    return s->sequence != 0 && s->checksum == state_crc(s) &&
           s->uuid_crc == nvh_crc32c(0, sb->header.uuid, sizeof sb->header.uuid);
}

/* Index of the slot the library will treat as current, -1 if none. */
static inline int newest_slot(const struct nvh_superblock *sb)
{
    bool v0 = slot_valid(sb, 0), v1 = slot_valid(sb, 1);
    if (v0 && v1) return sb->state[1].sequence > sb->state[0].sequence ? 1 : 0;
    return v0 ? 0 : v1 ? 1 : -1;
}

/* XOR one byte of a file with 0x5A (always a change). */
static inline void flip_byte(const char *path, off_t off)
{
    unsigned char b;
    test_peek(path, off, &b, 1);
    b ^= 0x5A;
    test_poke(path, off, &b, 1);
}

static inline void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY);
    assert_true(in >= 0);
    unlink(to);
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(out >= 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0) assert_int_equal(write(out, buf, (size_t)n), n);
    assert_int_equal(n, 0);
    close(in);
    close(out);
}

static inline void write_file(const char *path, const void *data, size_t len)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    if (len) assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static inline uint64_t file_size_of(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

static inline bool file_exists(const char *path)
{
    return access(path, F_OK) == 0;
}

/* Deterministic pseudo-random bytes (xorshift64*). */
static inline void fill_random(void *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed ? seed : 0x9E3779B97F4A7C15ull;
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++) {
        x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
        p[i] = (unsigned char)((x * 2685821657736338717ull) >> 56);
    }
}

#endif /* NVH_POOL_TEST_UTIL_H */
