/* test_pool_errors.c — every bad input to the pool API gets the right
 * nvh_error code and a message naming the file and the cause, never crashes,
 * and never modifies the file (hash, size and mtime compared before/after):
 * missing, empty, random, foreign-layout, newer-version, truncated and
 * corrupt files; torn or corrupt state slots; pools in use (same process and
 * a forked child); read-only files and opens; bad sizes, names, domains and
 * NULL arguments; bad grows; and nvh_strerror for every code. */
#include "pool_test_util.h"

#include <sys/wait.h>

#define MiB ((uint64_t)1 << 20)
#define LAYOUT "errors-layout"

/* ---- files that are not (valid) pools ----------------------------------- */

static void missing_file(void **state)
{
    (void)state;
    const char *path = test_path("missing");
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_NOENT);
    EXPECT_OPEN_FAILS(path, NULL, NVH_OPEN_READONLY, NVH_E_NOENT);
    assert_false(file_exists(path));   /* open never creates */
    /* a directory that does not exist, for create */
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s.nodir/pool", path);
    assert_null(nvh_pool_create(nodir, LAYOUT, MiB, 0));
    assert_int_equal(nvh_errcode(), NVH_E_NOENT);
    assert_non_null(strstr(nvh_errormsg(), nodir));
}

static void empty_and_random_files(void **state)
{
    (void)state;
    const char *path = test_path("garbage");
    write_file(path, "", 0);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_BADMAGIC);
    EXPECT_OPEN_FAILS(path, NULL, NVH_OPEN_READONLY, NVH_E_BADMAGIC);

    static const size_t sizes[] = {1, 7, 8, 511, 4096, 4097, 2 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *junk = malloc(sizes[i]);
        assert_non_null(junk);
        fill_random(junk, sizes[i], 1000 + i);
        write_file(path, junk, sizes[i]);
        EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_BADMAGIC);
        EXPECT_OPEN_FAILS(path, NULL, 0, NVH_E_BADMAGIC);
        free(junk);
    }
    /* a prefix of the magic is not the magic */
    write_file(path, NVH_MAGIC, 5);
    EXPECT_OPEN_FAILS(path, NULL, 0, NVH_E_BADMAGIC);
    unlink(path);
}

static void not_a_regular_file(void **state)
{
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s.d", test_path("dir"));
    assert_int_equal(mkdir(dir, 0700), 0);
    /* read-write: open(2) itself refuses a directory (EISDIR) */
    assert_null(nvh_pool_open(dir, NULL, 0));
    assert_int_equal(nvh_errcode(), NVH_E_IO);
    assert_non_null(strstr(nvh_errormsg(), dir));
    /* read-only: the open succeeds, validation refuses */
    assert_null(nvh_pool_open(dir, NULL, NVH_OPEN_READONLY));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), dir));
    rmdir(dir);
}

static void wrong_layout(void **state)
{
    (void)state;
    const char *path = make_pool("layout", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    EXPECT_OPEN_FAILS(path, "other-layout", 0, NVH_E_LAYOUT);
    EXPECT_OPEN_FAILS(path, "", 0, NVH_E_LAYOUT);
    EXPECT_OPEN_FAILS(path, "errors-layou", 0, NVH_E_LAYOUT);     /* a prefix */
    EXPECT_OPEN_FAILS(path, LAYOUT "x", NVH_OPEN_READONLY, NVH_E_LAYOUT);
    assert_non_null(strstr(nvh_errormsg(), LAYOUT));            /* names both */
    /* NULL accepts any layout; the right one opens */
    nvh_pool *pool = nvh_pool_open(path, NULL, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);

    /* a pool created without layout has the empty layout */
    path = make_pool("nolayout", NULL, MiB, NVH_DOMAIN_PROCESS);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_LAYOUT);
    pool = nvh_pool_open(path, "", NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);
}

static void newer_format_version(void **state)
{
    (void)state;
    const char *path = make_pool("version", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    struct nvh_superblock sb;
    read_superblock(path, &sb);
    assert_int_equal(sb.header.format_version, NVH_FORMAT_VERSION);
    sb.header.format_version = NVH_FORMAT_VERSION + 1;
    sb.header.checksum = header_crc(&sb.header);   /* a genuine newer header */
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_VERSION);
    EXPECT_OPEN_FAILS(path, NULL, NVH_OPEN_READONLY, NVH_E_VERSION);
    sb.header.format_version = 0xFFFFFFFFu;
    sb.header.checksum = header_crc(&sb.header);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_VERSION);
    /* version 0 never existed: corrupt, not "newer" */
    sb.header.format_version = 0;
    sb.header.checksum = header_crc(&sb.header);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_CORRUPT);
    unlink(path);
}

/* An older-format pool (format 1: no heap, object-table or log checksums;
 * format 2: region headers inside the chunks) is refused with
 * NVH_E_VERSION and a message saying how to migrate, never opened. */
static void older_format_version(void **state)
{
    (void)state;
    for (uint32_t v = 1; v < NVH_FORMAT_UPGRADE_FROM; v++) {
        const char *path = make_pool("oldversion", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
        struct nvh_superblock sb;
        read_superblock(path, &sb);
        sb.header.format_version = v;
        sb.header.checksum = header_crc(&sb.header);
        write_superblock(path, &sb);
        EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_VERSION);
        assert_non_null(strstr(nvh_errormsg(), "migrate"));
        EXPECT_OPEN_FAILS(path, NULL, NVH_OPEN_READONLY, NVH_E_VERSION);
        unlink(path);
    }
}

static void truncated_files(void **state)
{
    (void)state;
    const char *path = make_pool("trunc", LAYOUT, 2 * MiB, NVH_DOMAIN_PROCESS);
    const char *copy = test_path("trunc-copy");
    /* shorter than the superblock (magic intact) */
    static const off_t short_sizes[] = {8, 100, 512, 640, 4095};
    for (size_t i = 0; i < sizeof short_sizes / sizeof short_sizes[0]; i++) {
        copy_file(path, copy);
        assert_int_equal(truncate(copy, short_sizes[i]), 0);
        EXPECT_OPEN_FAILS(copy, LAYOUT, 0, NVH_E_TRUNCATED);
        EXPECT_OPEN_FAILS(copy, NULL, NVH_OPEN_READONLY, NVH_E_TRUNCATED);
    }
    /* superblock intact, but shorter than the recorded pool size */
    static const off_t mid_sizes[] = {4096, MiB, 2 * MiB - 4096, 2 * MiB - 1};
    for (size_t i = 0; i < sizeof mid_sizes / sizeof mid_sizes[0]; i++) {
        copy_file(path, copy);
        assert_int_equal(truncate(copy, mid_sizes[i]), 0);
        EXPECT_OPEN_FAILS(copy, LAYOUT, 0, NVH_E_TRUNCATED);
        assert_non_null(strstr(nvh_errormsg(), "2097152"));   /* the recorded size */
    }
    /* longer than recorded is fine: the pool is the recorded size */
    copy_file(path, copy);
    assert_int_equal(truncate(copy, 3 * MiB), 0);
    nvh_pool *pool = nvh_pool_open(copy, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_size(pool), 2 * MiB);
    nvh_pool_close(pool);
    unlink(copy);
    unlink(path);
}

static void header_checksum_mismatch(void **state)
{
    (void)state;
    const char *path = make_pool("hdrsum", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    struct nvh_superblock sb;
    read_superblock(path, &sb);
    sb.header.layout[2] ^= 0x20;       /* "errors-layout" -> "ERrors-layout" */
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_CHECKSUM);
    EXPECT_OPEN_FAILS(path, NULL, 0, NVH_E_CHECKSUM);
    EXPECT_OPEN_FAILS(path, NULL, NVH_OPEN_READONLY, NVH_E_CHECKSUM);
    /* every single-bit flip anywhere in the 508 checksummed bytes is caught */
    sb.header.layout[2] ^= 0x20;
    for (size_t bit = 0; bit < 508 * 8; bit += 37) {
        struct nvh_superblock bad = sb;
        ((unsigned char *)&bad.header)[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        write_superblock(path, &bad);
        nvh_pool *pool = nvh_pool_open(path, NULL, NVH_OPEN_READONLY);
        assert_null(pool);
        /* a flip in the magic is "not a pool", in the version maybe "newer" */
        int code = nvh_errcode();
        assert_true(code == NVH_E_CHECKSUM || code == NVH_E_BADMAGIC || code == NVH_E_VERSION);
        if (bit / 8 >= 16) assert_int_equal(code, NVH_E_CHECKSUM);
    }
    unlink(path);
}

/* Pool held open (so its two slots hold different epochs): slot X has the
 * open's state (epoch 2), the other the previous close (epoch 1). */
static void one_corrupt_state_slot(void **state)
{
    (void)state;
    const char *path = make_pool("slot1", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    nvh_pool *held = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(held);
    assert_int_equal(nvh_pool_epoch(held), 2);
    struct nvh_superblock sb;
    read_superblock(path, &sb);
    int cur = newest_slot(&sb);
    assert_true(cur == 0 || cur == 1);
    int old = 1 - cur;
    assert_true(slot_valid(&sb, (unsigned)old));
    assert_int_equal(sb.state[cur].epoch, 2);
    assert_int_equal(sb.state[old].epoch, 1);
    const char *copy = test_path("slot1-copy");

    /* newest slot corrupt: the older one is used (epoch 1 seen, 2 after) */
    copy_file(path, copy);
    flip_byte(copy, NVH_STATE_SLOT_OFFSET + 64 * cur + 20);
    nvh_pool *pool = nvh_pool_open(copy, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_epoch(pool), 2);
    assert_int_equal(nvh_pool_size(pool), MiB);
    nvh_pool_close(pool);
    /* the corrupt slot was the one rewritten: both slots are valid again */
    read_superblock(copy, &sb);
    assert_true(slot_valid(&sb, 0) && slot_valid(&sb, 1));
    unlink(copy);

    /* older slot corrupt: the newest is used (epoch 2 seen, 3 after) */
    copy_file(path, copy);
    flip_byte(copy, NVH_STATE_SLOT_OFFSET + 64 * old + 3);
    pool = nvh_pool_open(copy, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_epoch(pool), 3);
    nvh_pool_close(pool);
    unlink(copy);

    /* a read-only open also falls back, and reports the epoch it saw */
    copy_file(path, copy);
    flip_byte(copy, NVH_STATE_SLOT_OFFSET + 64 * cur + 60);   /* the CRC */
    file_fingerprint before = fingerprint(copy);
    pool = nvh_pool_open(copy, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_epoch(pool), 1);
    nvh_pool_close(pool);
    assert_same_file(copy, before);
    unlink(copy);

    nvh_pool_close(held);
    unlink(path);
}

static void both_state_slots_corrupt(void **state)
{
    (void)state;
    const char *path = make_pool("slot2", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    unsigned char junk[64];
    fill_random(junk, sizeof junk, 7);
    test_poke(path, NVH_STATE_SLOT_OFFSET, junk, 64);
    fill_random(junk, sizeof junk, 8);
    test_poke(path, NVH_STATE_SLOT_OFFSET + 64, junk, 64);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_CHECKSUM);
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_OPEN_READONLY, NVH_E_CHECKSUM);
    unlink(path);

    /* slots from another pool (valid CRC, other uuid) do not count either */
    const char *a = make_pool("slot2a", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    const char *b = make_pool("slot2b", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    struct nvh_superblock sa, sbb;
    read_superblock(a, &sa);
    read_superblock(b, &sbb);
    memcpy(sa.state, sbb.state, sizeof sa.state);
    write_superblock(a, &sa);
    EXPECT_OPEN_FAILS(a, LAYOUT, 0, NVH_E_CHECKSUM);
    /* and zeroed slots (sequence 0) are "never written" */
    memset(sa.state, 0, sizeof sa.state);
    write_superblock(a, &sa);
    EXPECT_OPEN_FAILS(a, LAYOUT, 0, NVH_E_CHECKSUM);
    unlink(a);
    unlink(b);
}

static void corrupt_layout_description(void **state)
{
    (void)state;
    /* checksummed but impossible: the header must still be sanity-checked */
    const char *path = make_pool("impossible", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    struct nvh_superblock good, sb;
    read_superblock(path, &good);
    int cur = newest_slot(&good);

    sb = good;
    sb.header.root_size = 4095;        /* not page aligned */
    sb.header.checksum = header_crc(&sb.header);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_CORRUPT);

    sb = good;
    memset(sb.header.layout, 'x', sizeof sb.header.layout);   /* no terminator */
    sb.header.checksum = header_crc(&sb.header);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, NULL, 0, NVH_E_CORRUPT);

    sb = good;
    sb.state[cur] = make_state(&sb.header, sb.state[cur].sequence, 12345, 1, 1);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_CORRUPT);       /* size not a page multiple */

    write_superblock(path, &good);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);
}

/* Layers above the pool (the allocator) validate their own metadata during
 * open. If they refuse, the open must still leave the file untouched: in
 * particular the epoch must not have been committed already. With no such
 * layer built in, the garbage is just heap bytes and the open succeeds. */
static void failing_upper_layer_writes_nothing(void **state)
{
    (void)state;
    const char *path = make_pool("upper", LAYOUT, 4 * MiB, NVH_DOMAIN_PROCESS);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    nvh_pool_close(pool);
    unsigned char junk[4096];
    fill_random(junk, sizeof junk, 99);
    test_poke(path, (off_t)info.heap_offset, junk, sizeof junk);

    file_fingerprint before = fingerprint(path);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    if (pool) {
        print_message("no layer above the pool refused the garbage heap\n");
        nvh_pool_close(pool);
    } else {
        print_message("refused: %s\n", nvh_errormsg());
        assert_non_null(strstr(nvh_errormsg(), path));
        assert_same_file(path, before);
    }
    unlink(path);
}

/* ---- pools in use ------------------------------------------------------- */

static void busy_same_process(void **state)
{
    (void)state;
    const char *path = make_pool("busy", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_DOMAIN_PROCESS, NVH_E_BUSY);
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_OPEN_READONLY, NVH_E_BUSY);
    /* the failed opens did not disturb the holder */
    nvh_memcpy_persist(pool, nvh_root(pool, NULL), "still mine", 11);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_string_equal(nvh_root(pool, NULL), "still mine");
    assert_int_equal(nvh_pool_close(pool), NVH_OK);

    /* read-only opens share; a writer is then refused, and vice versa */
    nvh_pool *r1 = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    nvh_pool *r2 = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(r1);
    assert_non_null(r2);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_BUSY);
    nvh_pool_close(r1);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_BUSY);
    nvh_pool_close(r2);
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);
}

/* In a forked child: open must fail with NVH_E_BUSY naming the file (or
 * succeed, if expect_ok). Exit status 0 = as expected. No cmocka here. */
static int child_try_open(const char *path, unsigned flags, bool expect_ok)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint64_t before = test_file_hash(path);
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, flags);
        if (expect_ok) {
            if (!pool) { fprintf(stderr, "child: %s\n", nvh_errormsg()); _exit(1); }
            _exit(nvh_pool_close(pool) == NVH_OK ? 0 : 2);
        }
        if (pool) _exit(3);
        if (nvh_errcode() != NVH_E_BUSY) _exit(4);
        if (!strstr(nvh_errormsg(), path)) _exit(5);
        if (test_file_hash(path) != before) _exit(6);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void busy_forked_child(void **state)
{
    (void)state;
    const char *path = make_pool("busyfork", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(child_try_open(path, NVH_DOMAIN_PROCESS, false), 0);
    assert_int_equal(child_try_open(path, NVH_OPEN_READONLY, false), 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* after close (and with no child alive holding the inherited lock) */
    assert_int_equal(child_try_open(path, NVH_DOMAIN_PROCESS, true), 0);
    /* a read-only holder: a read-only child shares, a writer child is refused */
    pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(pool);
    assert_int_equal(child_try_open(path, NVH_OPEN_READONLY, true), 0);
    assert_int_equal(child_try_open(path, NVH_DOMAIN_PROCESS, false), 0);
    nvh_pool_close(pool);
    unlink(path);
}

/* NVH_OPEN_SHARED: a read-only open beside a writer (in this process and in
 * a forked child) sees the live data, and does not keep the next writer out. */
static void shared_open_beside_writer(void **state)
{
    (void)state;
    const char *path = make_pool("shared", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_OPEN_SHARED, NVH_E_INVAL);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_memcpy_persist(pool, nvh_root(pool, NULL), "live data", 10);
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_OPEN_READONLY, NVH_E_BUSY);
    nvh_pool *r = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY | NVH_OPEN_SHARED);
    if (!r) fail_msg("shared open beside a writer: %s", nvh_errormsg());
    assert_string_equal(nvh_root(r, NULL), "live data");
    nvh_pool_info info;
    nvh_pool_info_get(r, &info);
    assert_int_equal(info.clean_at_open, 0);       /* the writer has it open */
    assert_int_equal(child_try_open(path, NVH_OPEN_READONLY | NVH_OPEN_SHARED, true), 0);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    /* the shared reader does not keep a writer out */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_int_equal(nvh_pool_close(r), NVH_OK);
    unlink(path);
}

/* ---- read-only files and opens ------------------------------------------ */

/* Permission bits do not stop root (CAP_DAC_OVERRIDE): as root a 0400 file
 * opens read-write, so the EACCES path cannot be provoked and is skipped; the
 * read-only semantics are tested by readonly_open_semantics for everyone. */
static void readonly_file_refuses_writer(void **state)
{
    (void)state;
    if (geteuid() == 0) {
        print_message("running as root: permission bits do not apply, skipping EACCES case\n");
        skip();
    }
    const char *path = make_pool("rofile", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    assert_int_equal(chmod(path, 0400), 0);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_READONLY);
    assert_non_null(strstr(nvh_errormsg(), "writing"));
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);
}

static void readonly_open_semantics(void **state)
{
    (void)state;
    const char *path = make_pool("roopen", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_memcpy_persist(pool, nvh_root(pool, NULL), "ro data", 8);
    assert_int_equal(nvh_pool_epoch(pool), 2);
    nvh_pool_close(pool);
    assert_int_equal(chmod(path, 0400), 0);

    file_fingerprint before = fingerprint(path);
    for (int round = 0; round < 3; round++) {
        pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_epoch(pool), 2);          /* not incremented */
        nvh_pool_info info;
        assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
        assert_int_equal(info.epoch, 2);
        assert_string_equal(info.layout, LAYOUT);
        assert_string_equal(nvh_root(pool, NULL), "ro data");
        /* grow of a read-only open */
        assert_int_equal(nvh_pool_grow(pool, 2 * MiB), NVH_E_READONLY);
        assert_non_null(strstr(nvh_errormsg(), path));
        assert_int_equal(nvh_pool_size(pool), MiB);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        assert_same_file(path, before);
    }
    /* the sim domain needs a private working copy it can write back */
    EXPECT_OPEN_FAILS(path, LAYOUT, NVH_OPEN_READONLY | NVH_DOMAIN_SIM, NVH_E_INVAL);
    /* create cannot be read-only */
    const char *other = test_path("rocreate");
    assert_null(nvh_pool_create(other, LAYOUT, MiB, NVH_OPEN_READONLY));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), other));
    assert_false(file_exists(other));
    chmod(path, 0600);
    /* a later read-write open continues from the stored epoch */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_epoch(pool), 3);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---- create: sizes, names, existing files ------------------------------- */

/* create must fail with `code`, name the file, and leave no file behind. */
static void expect_create_fails(const char *path, const char *layout, uint64_t size,
                                unsigned flags, const nvh_pool_options *opts, int code)
{
    nvh_pool *pool = nvh_pool_create_ex(path, layout, size, flags, opts);
    if (pool) {
        nvh_pool_close(pool);
        unlink(path);
        fail_msg("create of %llu bytes succeeded", (unsigned long long)size);
    }
    assert_int_equal(nvh_errcode(), code);
    if (!strstr(nvh_errormsg(), path))
        fail_msg("message '%s' does not name %s", nvh_errormsg(), path);
    assert_false(file_exists(path));
}

static void bad_sizes(void **state)
{
    (void)state;
    const char *path = test_path("size");
    expect_create_fails(path, LAYOUT, 0, 0, NULL, NVH_E_SIZE);
    expect_create_fails(path, LAYOUT, 4096, 0, NULL, NVH_E_SIZE);
    expect_create_fails(path, LAYOUT, NVH_POOL_MIN_SIZE - 4096 - 1, 0, NULL, NVH_E_SIZE);
    expect_create_fails(path, LAYOUT, NVH_POOL_MAX_SIZE + 1, 0, NULL, NVH_E_SIZE);
    expect_create_fails(path, LAYOUT, UINT64_MAX, 0, NULL, NVH_E_SIZE);

    nvh_pool_options opts = {.root_size = NVH_ROOT_MAX_SIZE + 1};
    expect_create_fails(path, LAYOUT, 4 * MiB, 0, &opts, NVH_E_SIZE);
    opts.root_size = UINT64_MAX;
    expect_create_fails(path, LAYOUT, 4 * MiB, 0, &opts, NVH_E_SIZE);
    /* a root that leaves no page of heap */
    opts.root_size = MiB;
    expect_create_fails(path, LAYOUT, MiB, 0, &opts, NVH_E_SIZE);
    expect_create_fails(path, LAYOUT, MiB + 4096, 0, &opts, NVH_E_SIZE);
    opts = (nvh_pool_options){.max_size = NVH_POOL_MAX_SIZE + 1};
    expect_create_fails(path, LAYOUT, MiB, 0, &opts, NVH_E_SIZE);

    /* the boundaries themselves are accepted */
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, NVH_POOL_MIN_SIZE, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unlink(path);
    opts = (nvh_pool_options){.root_size = MiB};
    pool = nvh_pool_create_ex(path, LAYOUT, 2 * MiB, NVH_DOMAIN_PROCESS, &opts);
    assert_non_null(pool);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.root_size, MiB);
    assert_int_equal(info.heap_size, MiB - 4096);
    nvh_pool_close(pool);
    unlink(path);
    /* a size just under the minimum is rounded up to the page, i.e. to it */
    pool = nvh_pool_create(path, LAYOUT, NVH_POOL_MIN_SIZE - 1, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_size(pool), NVH_POOL_MIN_SIZE);
    nvh_pool_close(pool);
    unlink(path);
}

static void layout_name_too_long(void **state)
{
    (void)state;
    const char *path = test_path("toolong");
    char name[NVH_LAYOUT_MAX + 2];
    memset(name, 'L', sizeof name - 1);
    name[sizeof name - 1] = '\0';                 /* 64 characters */
    expect_create_fails(path, name, MiB, 0, NULL, NVH_E_TOOLONG);
    name[NVH_LAYOUT_MAX] = '\0';                  /* 63: the limit itself */
    nvh_pool *pool = nvh_pool_create(path, name, MiB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_close(pool);
    pool = nvh_pool_open(path, name, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_string_equal(info.layout, name);
    nvh_pool_close(pool);
    /* an over-long name at open is simply not this pool's layout */
    name[NVH_LAYOUT_MAX] = 'L';
    EXPECT_OPEN_FAILS(path, name, 0, NVH_E_LAYOUT);
    unlink(path);
}

static void create_over_existing(void **state)
{
    (void)state;
    const char *path = make_pool("exists", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    file_fingerprint before = fingerprint(path);
    assert_null(nvh_pool_create(path, LAYOUT, MiB, NVH_DOMAIN_PROCESS));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_non_null(strstr(nvh_errormsg(), path));
    assert_same_file(path, before);
    /* it is still a good pool */
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    /* and create refuses even while it is open */
    assert_null(nvh_pool_create(path, LAYOUT, 2 * MiB, NVH_DOMAIN_PROCESS));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    nvh_pool_close(pool);
    unlink(path);

    /* any existing file, pool or not, empty or not */
    write_file(path, "precious", 8);
    before = fingerprint(path);
    assert_null(nvh_pool_create(path, NULL, MiB, 0));
    assert_int_equal(nvh_errcode(), NVH_E_EXISTS);
    assert_same_file(path, before);
    unlink(path);
}

/* ---- domains ------------------------------------------------------------ */

static void invalid_domain(void **state)
{
    (void)state;
    unsetenv("NVHEAP_DOMAIN");
    const char *path = test_path("domain");
    for (unsigned d = NVH_DOMAIN_SIM + 1; d <= NVH_DOMAIN_MASK; d++)
        expect_create_fails(path, LAYOUT, MiB, d, NULL, NVH_E_INVAL);

    path = make_pool("domain", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    for (unsigned d = NVH_DOMAIN_SIM + 1; d <= NVH_DOMAIN_MASK; d++)
        EXPECT_OPEN_FAILS(path, LAYOUT, d, NVH_E_INVAL);

    static const char *const bad[] = {"bogus", "PMEM", "pmem ", "dax", "1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("NVHEAP_DOMAIN", bad[i], 1);
        EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_INVAL);
        assert_non_null(strstr(nvh_errormsg(), "NVHEAP_DOMAIN"));
        assert_non_null(strstr(nvh_errormsg(), bad[i]));
        const char *fresh = test_path("domain-env");
        expect_create_fails(fresh, LAYOUT, MiB, 0, NULL, NVH_E_INVAL);
        assert_non_null(strstr(nvh_errormsg(), bad[i]));
        /* an explicit domain in the flags wins over the environment */
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        nvh_pool_close(pool);
    }
    unsetenv("NVHEAP_DOMAIN");
    /* the message was built without overlapping its own buffer */
    setenv("NVHEAP_DOMAIN", "bogus", 1);
    assert_null(nvh_pool_open(path, LAYOUT, 0));
    assert_null(strstr(nvh_errormsg(), "NVHEAP_DOMAIN: NVHEAP_DOMAIN"));
    assert_non_null(strstr(nvh_errormsg(), "unknown persistence domain 'bogus'"));
    unsetenv("NVHEAP_DOMAIN");
    unlink(path);
}

/* ---- NULL arguments ----------------------------------------------------- */

static void null_arguments(void **state)
{
    (void)state;
    assert_null(nvh_pool_create(NULL, LAYOUT, MiB, 0));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_pool_create_ex(NULL, NULL, MiB, 0, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_pool_open(NULL, LAYOUT, 0));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_pool_open(NULL, NULL, NVH_OPEN_READONLY));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_int_equal(nvh_pool_grow(NULL, 2 * MiB), NVH_E_INVAL);
    assert_int_equal(nvh_pool_close(NULL), NVH_OK);
    nvh_pool_info info;
    assert_int_equal(nvh_pool_info_get(NULL, &info), NVH_E_INVAL);
    assert_null(nvh_root(NULL, NULL));
    assert_int_equal(nvh_errcode(), NVH_E_INVAL);
    assert_null(nvh_pool_base(NULL));
    assert_int_equal(nvh_pool_size(NULL), 0);
    assert_int_equal(nvh_pool_epoch(NULL), 0);
    assert_int_equal(nvh_pool_domain(NULL), NVH_DOMAIN_AUTO);
    nvh_domain d = NVH_DOMAIN_PMEM;
    assert_int_equal(nvh_domain_parse(NULL, &d), NVH_E_INVAL);
    assert_int_equal(nvh_domain_parse("pmem", NULL), NVH_E_INVAL);
    assert_int_equal(nvh_domain_parse("nonsense", &d), NVH_E_INVAL);
    assert_int_equal(d, NVH_DOMAIN_PMEM);      /* untouched on failure */
    assert_null(nvh_domain_name((nvh_domain)99));
    assert_null(nvh_domain_name((nvh_domain)-1));
    nvh_stats st;
    memset(&st, 0xFF, sizeof st);
    nvh_stats_get(NULL, &st);
    assert_int_equal(st.lines_flushed, 0);
    assert_int_equal(st.fences, 0);
    nvh_stats_reset(NULL);
    assert_int_equal(nvh_sim_write_image(NULL, "/nonexistent", 1, NVH_CRASH_LINES), NVH_E_INVAL);
    assert_int_equal(nvh_sim_fence_count(NULL), 0);
    nvh_sim_set_fence_hook(NULL, NULL, NULL);

    /* with a real pool: NULL outputs, and sim calls on a non-sim pool */
    const char *path = test_path("nulls");
    nvh_pool *pool = nvh_pool_create(path, NULL, MiB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_info_get(pool, NULL), NVH_E_INVAL);
    nvh_stats_get(pool, NULL);
    assert_non_null(nvh_root(pool, NULL));
    assert_int_equal(nvh_sim_write_image(pool, NULL, 1, NVH_CRASH_LINES), NVH_E_INVAL);
    const char *image = test_path("nulls-image");
    assert_int_equal(nvh_sim_write_image(pool, image, 1, NVH_CRASH_LINES), NVH_E_INVAL);
    assert_non_null(strstr(nvh_errormsg(), path));
    assert_false(file_exists(image));
    assert_int_equal(nvh_sim_fence_count(pool), 0);
    nvh_sim_set_fence_hook(pool, NULL, NULL);
    nvh_pool_close(pool);
    unlink(path);
}

/* ---- grow --------------------------------------------------------------- */

static void grow_errors(void **state)
{
    (void)state;
    const char *path = test_path("growerr");
    nvh_pool_options opts = {.max_size = 4 * MiB};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, MiB, NVH_DOMAIN_PROCESS, &opts);
    assert_non_null(pool);
    nvh_pool_info info;
    nvh_pool_info_get(pool, &info);
    assert_int_equal(info.max_size, 4 * MiB);
    uint64_t size_before = file_size_of(path);

    assert_int_equal(nvh_pool_grow(pool, 4 * MiB + 1), NVH_E_SIZE);
    assert_non_null(strstr(nvh_errormsg(), path));
    assert_int_equal(nvh_pool_grow(pool, 8 * MiB), NVH_E_SIZE);
    assert_int_equal(nvh_pool_grow(pool, NVH_POOL_MAX_SIZE + 1), NVH_E_SIZE);
    assert_int_equal(nvh_pool_grow(pool, UINT64_MAX), NVH_E_SIZE);
    assert_int_equal(nvh_pool_grow(pool, MiB - 4096), NVH_E_SIZE);     /* shrink */
    assert_int_equal(nvh_pool_grow(pool, 0), NVH_E_SIZE);
    assert_int_equal(nvh_pool_size(pool), MiB);
    assert_int_equal(file_size_of(path), size_before);   /* failed grows touch nothing */

    assert_int_equal(nvh_pool_grow(pool, MiB), NVH_OK);              /* same size */
    assert_int_equal(nvh_pool_grow(pool, MiB + 1), NVH_OK);          /* page rounding */
    assert_int_equal(nvh_pool_size(pool), MiB + 4096);
    assert_int_equal(nvh_pool_grow(pool, 4 * MiB), NVH_OK);          /* to the limit */
    assert_int_equal(nvh_pool_size(pool), 4 * MiB);
    assert_int_equal(nvh_pool_grow(pool, 4 * MiB + 4096), NVH_E_SIZE);
    assert_int_equal(nvh_pool_size(pool), 4 * MiB);
    nvh_pool_close(pool);

    pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    assert_non_null(pool);
    file_fingerprint before = fingerprint(path);
    assert_int_equal(nvh_pool_grow(pool, 8 * MiB), NVH_E_READONLY);
    assert_non_null(strstr(nvh_errormsg(), path));
    assert_int_equal(nvh_pool_grow(pool, 4 * MiB), NVH_E_READONLY);
    nvh_pool_close(pool);
    assert_same_file(path, before);
    unlink(path);
}

/* ---- error descriptions ------------------------------------------------- */

static void strerror_every_code(void **state)
{
    (void)state;
    const int first = NVH_OK, last = NVH_E_ABORTED;
    for (int a = first; a >= last; a--) {
        const char *sa = nvh_strerror(a);
        assert_non_null(sa);
        assert_true(strlen(sa) > 0);
        assert_string_not_equal(sa, "unknown error");
        for (int b = a - 1; b >= last; b--) assert_string_not_equal(sa, nvh_strerror(b));
    }
    assert_string_equal(nvh_strerror(1), "unknown error");
    assert_string_equal(nvh_strerror(last - 1), "unknown error");
    assert_string_equal(nvh_strerror(-1000), "unknown error");
}

/* A failure that quotes the current message (nvh_errormsg() as an argument
 * of nvh_fail) keeps it intact: the message buffer is both source and
 * destination of that call. */
static void fail_quoting_current_message(void **state)
{
    (void)state;
    nvh_fail(NVH_E_NOSPACE, "pool full at offset %d", 4096);
    nvh_fail(NVH_E_ABORTED, "commit: %s", nvh_errormsg());
    assert_int_equal(nvh_errcode(), NVH_E_ABORTED);
    assert_string_equal(nvh_errormsg(), "commit: pool full at offset 4096");
    nvh_fail(NVH_E_IO, "%s; again: %s", nvh_errormsg(), nvh_errormsg());
    assert_string_equal(nvh_errormsg(),
                        "commit: pool full at offset 4096; again: commit: pool full at offset 4096");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(missing_file),
        cmocka_unit_test(fail_quoting_current_message),
        cmocka_unit_test(empty_and_random_files),
        cmocka_unit_test(not_a_regular_file),
        cmocka_unit_test(wrong_layout),
        cmocka_unit_test(newer_format_version),
        cmocka_unit_test(older_format_version),
        cmocka_unit_test(truncated_files),
        cmocka_unit_test(header_checksum_mismatch),
        cmocka_unit_test(one_corrupt_state_slot),
        cmocka_unit_test(both_state_slots_corrupt),
        cmocka_unit_test(corrupt_layout_description),
        cmocka_unit_test(failing_upper_layer_writes_nothing),
        cmocka_unit_test(busy_same_process),
        cmocka_unit_test(busy_forked_child),
        cmocka_unit_test(readonly_file_refuses_writer),
        cmocka_unit_test(readonly_open_semantics),
        cmocka_unit_test(bad_sizes),
        cmocka_unit_test(layout_name_too_long),
        cmocka_unit_test(create_over_existing),
        cmocka_unit_test(invalid_domain),
        cmocka_unit_test(null_arguments),
        cmocka_unit_test(grow_errors),
        cmocka_unit_test(shared_open_beside_writer),
        cmocka_unit_test(strerror_every_code),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
