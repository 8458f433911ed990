/* test_pool_state.c — the superblock's mutable state and what users see of a
 * pool: the epoch (incremented and persisted at every read-write open), the
 * alternating state slots, survival of a torn state update (every mix of old
 * and new 8-byte words), nvh_pool_info_get, relative pointers, the root area
 * option, create/reopen across every domain, grow over stale bytes, and a
 * crash-simulator check of nvh_pool_grow and of the epoch commit: at every
 * fence the sim domain executes during them, crash images (several seeds,
 * line and word granularity) must open with a consistent size and epoch.
 *
 * The open's own epoch commit runs inside nvh_pool_open, before a fence hook
 * can be installed, so the crash check drives the very same commit through
 * nvh_pool_state_commit_ (src/pool/pool.h) on an open sim pool. */
#include "pool_test_util.h"

#include "common/crc32c.h"
#include "pool/pool.h"

#include <time.h>

#define MiB ((uint64_t)1 << 20)
#define LAYOUT "state-layout"

static const nvh_domain all_domains[] = {NVH_DOMAIN_PMEM, NVH_DOMAIN_EADR, NVH_DOMAIN_MSYNC,
                                         NVH_DOMAIN_PROCESS, NVH_DOMAIN_SIM};
#define N_DOMAINS (sizeof all_domains / sizeof all_domains[0])

static int setup_env(void **state)
{
    (void)state;
    unsetenv("NVHEAP_DOMAIN");
    unsetenv("NVHEAP_MAX_SIZE");
    return 0;
}

/* ---- epochs and state slots --------------------------------------------- */

static void epoch_increments_and_persists(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        const char *path = test_path("epoch");
        nvh_pool *pool = nvh_pool_create(path, LAYOUT, MiB, all_domains[d]);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_epoch(pool), 1);
        nvh_pool_close(pool);
        for (uint64_t k = 2; k <= 8; k++) {
            pool = nvh_pool_open(path, LAYOUT, all_domains[d]);
            assert_non_null(pool);
            assert_int_equal(nvh_pool_epoch(pool), k);
            nvh_pool_info info;
            nvh_pool_info_get(pool, &info);
            assert_int_equal(info.epoch, k);
            nvh_pool_close(pool);
            /* on the file: the newest slot holds epoch k, marked clean */
            struct nvh_superblock sb;
            read_superblock(path, &sb);
            int cur = newest_slot(&sb);
            assert_true(cur >= 0);
            assert_int_equal(sb.state[cur].epoch, k);
            assert_int_equal(sb.state[cur].clean, 1);
            /* a read-only open sees it and changes nothing */
            if (all_domains[d] != NVH_DOMAIN_SIM) {
                file_fingerprint before = fingerprint(path);
                pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY | all_domains[d]);
                assert_non_null(pool);
                assert_int_equal(nvh_pool_epoch(pool), k);
                nvh_pool_close(pool);
                assert_same_file(path, before);
            }
        }
        unlink(path);
    }
}

/* Every commit writes slot seq % 2; the other slot keeps the previous state. */
static void check_slots(const char *path, uint64_t seq, uint64_t size, uint64_t epoch,
                        uint32_t clean)
{
    struct nvh_superblock sb;
    read_superblock(path, &sb);
    int cur = newest_slot(&sb);
    assert_int_equal(cur, (int)(seq % 2));
    assert_int_equal(sb.state[cur].sequence, seq);
    assert_int_equal(sb.state[cur].pool_size, size);
    assert_int_equal(sb.state[cur].epoch, epoch);
    assert_int_equal(sb.state[cur].clean, clean);
    assert_true(slot_valid(&sb, (unsigned)(1 - cur)));
    assert_int_equal(sb.state[1 - cur].sequence, seq - 1);
}

static void state_slots_alternate(void **state)
{
    (void)state;
    const char *path = test_path("slots");
    nvh_pool *pool = nvh_pool_create(path, LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    /* create wrote seq 1 (epoch 0, clean), the open inside create seq 2 */
    check_slots(path, 2, MiB, 1, 0);
    struct nvh_superblock sb;
    read_superblock(path, &sb);
    assert_int_equal(sb.state[1].sequence, 1);
    assert_int_equal(sb.state[1].epoch, 0);
    assert_int_equal(sb.state[1].clean, 1);

    assert_int_equal(nvh_pool_grow(pool, 2 * MiB), NVH_OK);
    check_slots(path, 3, 2 * MiB, 1, 0);
    assert_int_equal(nvh_pool_grow(pool, 3 * MiB), NVH_OK);
    check_slots(path, 4, 3 * MiB, 1, 0);
    assert_int_equal(nvh_pool_grow(pool, 3 * MiB), NVH_OK);    /* no-op: no commit */
    check_slots(path, 4, 3 * MiB, 1, 0);
    nvh_pool_close(pool);
    check_slots(path, 5, 3 * MiB, 1, 1);
    pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
    nvh_pool_close(pool);
    check_slots(path, 5, 3 * MiB, 1, 1);                       /* read-only: nothing */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    check_slots(path, 6, 3 * MiB, 2, 0);
    nvh_pool_close(pool);
    check_slots(path, 7, 3 * MiB, 2, 1);
    /* the header is written once at create and never again */
    struct nvh_superblock after;
    read_superblock(path, &after);
    assert_memory_equal(&after.header, &sb.header, sizeof sb.header);
    unsigned char zero[NVH_SUPERBLOCK_SIZE - 640] = {0};
    assert_memory_equal(after.reserved, zero, sizeof zero);
    unlink(path);
}

/* The open after a close writes slot o = (n+1) % 2. A crash during that write
 * leaves slot o as any mix of its old and new 8-byte words (x86 stores of
 * aligned words do not tear); all 256 mixes must open, with the new state
 * exactly when every word that differs arrived (words equal in old and new
 * do not matter), the previous state otherwise. */
static void torn_state_update_every_word_mix(void **state)
{
    (void)state;
    const char *path = make_pool("torn", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    struct nvh_superblock pristine;
    read_superblock(path, &pristine);
    int cur = newest_slot(&pristine);
    assert_true(cur >= 0);
    const struct nvh_superblock_state *now = &pristine.state[cur];
    int next = (int)((now->sequence + 1) % 2);
    assert_int_equal(next, 1 - cur);
    struct nvh_superblock_state fresh =
        make_state(&pristine.header, now->sequence + 1, now->pool_size, now->epoch + 1, 0);

    unsigned news = 0;
    for (unsigned mask = 0; mask < 256; mask++) {
        struct nvh_superblock sb = pristine;
        for (unsigned w = 0; w < 8; w++)
            if (mask & (1u << w))
                memcpy((char *)&sb.state[next] + 8 * w, (const char *)&fresh + 8 * w, 8);
        bool arrived = memcmp(&sb.state[next], &fresh, sizeof fresh) == 0;
        news += arrived;
        write_superblock(path, &sb);
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
        if (!pool) fail_msg("mask %02x: %s", mask, nvh_errormsg());
        uint64_t seen = arrived ? now->epoch + 1 : now->epoch;
        assert_int_equal(nvh_pool_epoch(pool), seen);
        assert_int_equal(nvh_pool_size(pool), MiB);
        nvh_pool_close(pool);
        if (mask % 37 == 0 || mask == 255) {
            /* a read-write open continues from what it saw and repairs */
            pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
            assert_non_null(pool);
            assert_int_equal(nvh_pool_epoch(pool), seen + 1);
            nvh_pool_close(pool);
            struct nvh_superblock repaired;
            read_superblock(path, &repaired);
            assert_true(slot_valid(&repaired, 0) && slot_valid(&repaired, 1));
        }
    }
    /* the words that differ are sequence, epoch and checksum (clean was 0 in
     * the overwritten slot too): 2^5 of the 256 mixes complete the update */
    assert_int_equal(news, 32);
    unlink(path);
}

/* Garbage in the slot the next commit would write, including garbage that
 * claims a higher sequence and a larger size: the previous state is used. */
static void torn_state_update_garbage(void **state)
{
    (void)state;
    const char *path = make_pool("garbage-slot", LAYOUT, MiB, NVH_DOMAIN_MSYNC);
    struct nvh_superblock pristine;
    read_superblock(path, &pristine);
    int cur = newest_slot(&pristine);
    int next = 1 - cur;
    uint64_t epoch = pristine.state[cur].epoch;

    for (uint64_t seed = 1; seed <= 32; seed++) {
        struct nvh_superblock sb = pristine;
        fill_random(&sb.state[next], sizeof sb.state[next], seed);
        if (seed % 2) {   /* plausible fields, wrong checksum */
            sb.state[next].sequence = pristine.state[cur].sequence + 1;
            sb.state[next].pool_size = 64 * MiB;
        }
        write_superblock(path, &sb);
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_MSYNC);
        if (!pool) fail_msg("seed %llu: %s", (unsigned long long)seed, nvh_errormsg());
        assert_int_equal(nvh_pool_epoch(pool), epoch + 1);
        assert_int_equal(nvh_pool_size(pool), MiB);
        nvh_pool_close(pool);
    }
    /* a crash during create (magic written last) leaves "not a pool" */
    struct nvh_superblock sb = pristine;
    memset(sb.header.magic, 0, sizeof sb.header.magic);
    write_superblock(path, &sb);
    EXPECT_OPEN_FAILS(path, LAYOUT, 0, NVH_E_BADMAGIC);
    unlink(path);
}

/* A grow whose commit tore: the file is already longer, the state may say
 * either size; both must open, with the file's extra bytes ignored. */
static void torn_grow_commit(void **state)
{
    (void)state;
    const char *path = make_pool("torn-grow", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    assert_int_equal(truncate(path, 4 * MiB), 0);      /* the grow's resize happened */
    struct nvh_superblock pristine;
    read_superblock(path, &pristine);
    int cur = newest_slot(&pristine);
    const struct nvh_superblock_state *now = &pristine.state[cur];
    struct nvh_superblock_state fresh =
        make_state(&pristine.header, now->sequence + 1, 4 * MiB, now->epoch, 0);
    for (unsigned mask = 0; mask < 256; mask++) {
        struct nvh_superblock sb = pristine;
        for (unsigned w = 0; w < 8; w++)
            if (mask & (1u << w))
                memcpy((char *)&sb.state[1 - cur] + 8 * w, (const char *)&fresh + 8 * w, 8);
        bool arrived = memcmp(&sb.state[1 - cur], &fresh, sizeof fresh) == 0;
        write_superblock(path, &sb);
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_size(pool), arrived ? 4 * MiB : MiB);
        nvh_pool_close(pool);
    }
    unlink(path);
}

/* Bytes past the recorded size are not pool bytes: a later grow must hand
 * them out as zero, as nvh_pool_grow promises ("the new bytes read as zero"). */
static void grow_over_stale_bytes_reads_zero(void **state)
{
    (void)state;
    for (size_t d = 0; d < N_DOMAINS; d++) {
        const char *path = make_pool("stale", LAYOUT, MiB, all_domains[d]);
        static unsigned char junk[2 * 65536];
        memset(junk, 0xAB, sizeof junk);
        test_poke(path, (off_t)MiB, junk, sizeof junk);          /* stale tail */
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, all_domains[d]);
        assert_non_null(pool);
        assert_int_equal(nvh_pool_size(pool), MiB);
        char *root = nvh_root(pool, NULL);
        nvh_memcpy_persist(pool, root, "below", 6);
        assert_int_equal(nvh_pool_grow(pool, 2 * MiB), NVH_OK);
        const unsigned char *tail = (const unsigned char *)nvh_pool_base(pool) + MiB;
        for (uint64_t i = 0; i < MiB; i++)
            if (tail[i]) fail_msg("%s: grown byte %llu is %#x", nvh_domain_name(all_domains[d]),
                                  (unsigned long long)i, tail[i]);
        assert_string_equal(root, "below");
        nvh_pool_close(pool);
        unlink(path);
    }
}

/* ---- the on-media format, byte by byte (docs/FORMAT.md) ------------------ */

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* CRC32C is the standard Castagnoli CRC (iSCSI, RFC 3720 test vectors). */
static void crc32c_is_standard(void **state)
{
    (void)state;
    unsigned char buf[32];
    assert_int_equal(nvh_crc32c(0, "", 0), 0);
    assert_int_equal(nvh_crc32c(0, "123456789", 9), 0xE3069283u);
    memset(buf, 0, sizeof buf);
    assert_int_equal(nvh_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xFF, sizeof buf);
    assert_int_equal(nvh_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
    assert_int_equal(nvh_crc32c(0, buf, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
    assert_int_equal(nvh_crc32c(0, buf, 32), 0x113FDB5Cu);
    /* chaining: crc(a ++ b) == crc(crc(a), b), at every split */
    unsigned char text[100];
    fill_random(text, sizeof text, 5);
    uint32_t whole = nvh_crc32c(0, text, sizeof text);
    for (size_t cut = 0; cut <= sizeof text; cut++)
        assert_int_equal(nvh_crc32c(nvh_crc32c(0, text, cut), text + cut, sizeof text - cut), whole);
    /* the inlined hot-path version (crc32c.h) agrees at every length, seed
     * and alignment (its 8/4/1-byte tails) */
    assert_int_equal(nvh_crc32c_inline(0, "123456789", 9), 0xE3069283u);
    for (size_t start = 0; start < 8; start++)
        for (size_t len = 0; start + len <= sizeof text; len++)
            assert_int_equal(nvh_crc32c_inline((uint32_t)len * 0x9E3779B9u, text + start, len),
                             nvh_crc32c((uint32_t)len * 0x9E3779B9u, text + start, len));
    /* the unrolled constant-length variants (allocator records and headers) */
    for (size_t start = 0; start < 8; start++) {
        assert_int_equal(nvh_crc32c_inline(7, text + start, 64), nvh_crc32c(7, text + start, 64));
        assert_int_equal(nvh_crc32c_inline(7, text + start, 52), nvh_crc32c(7, text + start, 52));
    }
}

/* Read a fresh pool's page 0 as raw bytes and check every documented offset. */
static void on_media_layout_matches_format_doc(void **state)
{
    (void)state;
    const char *path = test_path("format");
    nvh_pool_options opts = {.root_size = 8192};
    nvh_pool *pool = nvh_pool_create_ex(path, "fmt", 2 * MiB, NVH_DOMAIN_PROCESS, &opts);
    assert_non_null(pool);
    nvh_pool_close(pool);
    unsigned char page[4096];
    test_peek(path, 0, page, sizeof page);

    assert_memory_equal(page, "NVHEAP\0\1", 8);                /* magic */
    assert_int_equal(le32(page + 8), NVH_FORMAT_VERSION);       /* format_version */
    assert_int_equal(le32(page + 12), 512);                     /* header_size */
    assert_int_equal(page[16 + 6] >> 4, 4);                     /* uuid v4 */
    assert_string_equal((char *)page + 32, "fmt");              /* layout */
    for (int i = 32 + 3; i < 96; i++) assert_int_equal(page[i], 0);
    assert_true(le64(page + 96) > 1600000000);                  /* create_time */
    assert_int_equal(le32(page + 104), NVH_DOMAIN_PROCESS);     /* created_domain */
    assert_int_equal(le32(page + 108), 0);                      /* feature_flags */
    assert_int_equal(le64(page + 112), 4096);                   /* root_offset */
    assert_int_equal(le64(page + 120), 8192);                   /* root_size */
    assert_int_equal(le64(page + 128), 4096 + 8192);            /* heap_offset */
    assert_int_equal(le32(page + 136), 2);                      /* area_count */
    assert_int_equal(le32(page + 140), 0);
    /* area table: 8 entries of {u32 kind, u32 flags, u64 offset, u64 size} */
    assert_int_equal(le32(page + 144), 1);                      /* ROOT */
    assert_int_equal(le32(page + 148), 0);
    assert_int_equal(le64(page + 152), 4096);
    assert_int_equal(le64(page + 160), 8192);
    assert_int_equal(le32(page + 168), 2);                      /* HEAP */
    assert_int_equal(le64(page + 176), 4096 + 8192);
    assert_int_equal(le64(page + 184), 0);                      /* to the end */
    for (int i = 192; i < 336; i++) assert_int_equal(page[i], 0);
    assert_int_equal(le64(page + 336), (uint64_t)64 << 30);     /* max_size (default) */
    for (int i = 344; i < 508; i++) assert_int_equal(page[i], 0);
    assert_int_equal(le32(page + 508), nvh_crc32c(0, page, 508));

    /* state slots: create = seq 1 (slot 1), open = seq 2 (slot 0), close = seq 3 */
    for (int slot = 0; slot < 2; slot++) {
        const unsigned char *s = page + 512 + 64 * slot;
        uint64_t seq = le64(s);
        assert_int_equal(seq % 2, (uint64_t)slot);
        assert_int_equal(le64(s + 8), 2 * MiB);                 /* pool_size */
        assert_int_equal(le64(s + 16), 1);                      /* epoch */
        assert_int_equal(le32(s + 24), seq == 3 ? 1 : 0);       /* clean */
        for (int i = 28; i < 56; i++) assert_int_equal(s[i], 0);
        assert_int_equal(le32(s + 56), nvh_crc32c(0, page + 16, 16));   /* uuid_crc */
        assert_int_equal(le32(s + 60), nvh_crc32c(0, s, 60));
    }
    assert_int_equal(le64(page + 512 + 64), 3);
    assert_int_equal(le64(page + 512), 2);
    for (int i = 640; i < 4096; i++) assert_int_equal(page[i], 0);
    unlink(path);
}

/* ---- info, root area, relative pointers --------------------------------- */

static void pool_info_fields(void **state)
{
    (void)state;
    const char *path = test_path("info");
    nvh_pool_options opts = {.root_size = 8192, .max_size = 16 * MiB};
    uint64_t t0 = (uint64_t)time(NULL);
    nvh_pool *pool = nvh_pool_create_ex(path, "info-layout", 3 * MiB, NVH_DOMAIN_PROCESS, &opts);
    uint64_t t1 = (uint64_t)time(NULL);
    assert_non_null(pool);
    nvh_pool_info info;
    memset(&info, 0xEE, sizeof info);
    assert_int_equal(nvh_pool_info_get(pool, &info), NVH_OK);
    assert_string_equal(info.layout, "info-layout");
    assert_int_equal(info.uuid[6] >> 4, 4);               /* version 4 UUID */
    assert_int_equal(info.uuid[8] & 0xC0, 0x80);          /* RFC 4122 variant */
    assert_int_equal(info.size, 3 * MiB);
    assert_int_equal(info.max_size, 16 * MiB);
    assert_int_equal(info.epoch, 1);
    assert_int_equal(info.format_version, NVH_FORMAT_VERSION);
    assert_int_equal(info.domain, NVH_DOMAIN_PROCESS);
    assert_int_equal(info.created_domain, NVH_DOMAIN_PROCESS);
    assert_int_equal(info.root_offset, 4096);
    assert_int_equal(info.root_size, 8192);
    assert_int_equal(info.heap_offset, 4096 + 8192);
    assert_int_equal(info.heap_size, 3 * MiB - 4096 - 8192);
    assert_true(info.create_time >= t0 && info.create_time <= t1);
    assert_string_equal(info.flush_instruction, "none");
    uint64_t root_size = 0;
    assert_ptr_equal(nvh_root(pool, &root_size), (char *)nvh_pool_base(pool) + 4096);
    assert_int_equal(root_size, 8192);
    assert_int_equal(nvh_pool_size(pool), info.size);
    assert_int_equal(nvh_pool_domain(pool), info.domain);
    /* the info follows a grow */
    assert_int_equal(nvh_pool_grow(pool, 5 * MiB), NVH_OK);
    nvh_pool_info grown;
    nvh_pool_info_get(pool, &grown);
    assert_int_equal(grown.size, 5 * MiB);
    assert_int_equal(grown.heap_size, 5 * MiB - 4096 - 8192);
    nvh_pool_close(pool);

    /* reopen in another domain: identity kept, domain is this open's */
    pool = nvh_pool_open(path, "info-layout", NVH_DOMAIN_PMEM);
    assert_non_null(pool);
    nvh_pool_info again;
    nvh_pool_info_get(pool, &again);
    assert_memory_equal(again.uuid, info.uuid, 16);
    assert_int_equal(again.create_time, info.create_time);
    assert_int_equal(again.epoch, 2);
    assert_int_equal(again.size, 5 * MiB);
    assert_int_equal(again.domain, NVH_DOMAIN_PMEM);
    assert_int_equal(again.created_domain, NVH_DOMAIN_PROCESS);
    assert_true(strcmp(again.flush_instruction, "clwb") == 0 ||
                strcmp(again.flush_instruction, "clflushopt") == 0 ||
                strcmp(again.flush_instruction, "clflush") == 0 ||
                strcmp(again.flush_instruction, "none") == 0);
    /* max_size is recorded at create: the same limit applies on reopen */
    assert_int_equal(again.max_size, 16 * MiB);
    assert_int_equal(nvh_pool_grow(pool, 17 * MiB), NVH_E_SIZE);
    nvh_pool_close(pool);

    /* NVHEAP_MAX_SIZE overrides the recorded limit (and bad values are ignored) */
    setenv("NVHEAP_MAX_SIZE", "0x800000", 1);
    pool = nvh_pool_open(path, NULL, NVH_DOMAIN_PROCESS);
    nvh_pool_info_get(pool, &again);
    assert_int_equal(again.max_size, 8 * MiB);
    assert_int_equal(nvh_pool_grow(pool, 16 * MiB), NVH_E_SIZE);
    assert_int_equal(nvh_pool_grow(pool, 8 * MiB), NVH_OK);
    nvh_pool_close(pool);
    setenv("NVHEAP_MAX_SIZE", "4194304", 1);      /* smaller than the pool */
    pool = nvh_pool_open(path, NULL, NVH_DOMAIN_PROCESS);
    nvh_pool_info_get(pool, &again);
    assert_int_equal(again.max_size, 8 * MiB);     /* never below the pool's size */
    nvh_pool_close(pool);
    static const char *const ignored[] = {"junk", "12x", "4096", "0x1000000000001"};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        setenv("NVHEAP_MAX_SIZE", ignored[i], 1);
        pool = nvh_pool_open(path, NULL, NVH_DOMAIN_PROCESS);
        nvh_pool_info_get(pool, &again);
        assert_int_equal(again.max_size, 16 * MiB);   /* the recorded limit */
        nvh_pool_close(pool);
    }
    unsetenv("NVHEAP_MAX_SIZE");

    /* two pools never share a uuid */
    const char *other = make_pool("info2", "info-layout", MiB, NVH_DOMAIN_PROCESS);
    pool = nvh_pool_open(other, NULL, NVH_DOMAIN_PROCESS);
    nvh_pool_info_get(pool, &again);
    assert_memory_not_equal(again.uuid, info.uuid, 16);
    assert_int_equal(again.max_size, (uint64_t)64 << 30);
    nvh_pool_close(pool);
    unlink(other);
    unlink(path);
}

static void root_size_option(void **state)
{
    (void)state;
    static const struct { uint64_t asked, got; } cases[] = {
        {0, 4096}, {1, 4096}, {4095, 4096}, {4096, 4096}, {4097, 8192},
        {5000, 8192}, {65536, 65536}, {3 * MiB + 1, 3 * MiB + 4096},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = test_path("rootsize");
        nvh_pool_options opts = {.root_size = cases[i].asked};
        nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 8 * MiB, NVH_DOMAIN_PROCESS, &opts);
        assert_non_null(pool);
        uint64_t size = 0;
        unsigned char *root = nvh_root(pool, &size);
        assert_int_equal(size, cases[i].got);
        for (uint64_t b = 0; b < size; b++) assert_int_equal(root[b], 0);
        nvh_pool_info info;
        nvh_pool_info_get(pool, &info);
        assert_int_equal(info.heap_offset, 4096 + cases[i].got);
        /* the whole root area is the application's, and persists */
        memset(root, (int)(0x11 * (i + 1)), size);
        nvh_persist(pool, root, size);
        nvh_pool_close(pool);
        pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_MSYNC);
        root = nvh_root(pool, &size);
        assert_int_equal(size, cases[i].got);
        for (uint64_t b = 0; b < size; b++) assert_int_equal(root[b], (0x11 * (i + 1)) & 0xFF);
        /* and the superblock next to it is unharmed */
        nvh_pool_close(pool);
        pool = nvh_pool_open(path, LAYOUT, NVH_OPEN_READONLY);
        assert_non_null(pool);
        nvh_pool_close(pool);
        unlink(path);
    }
}

struct node;
typedef NVH_RELPTR(struct node) node_ref;
struct node {
    node_ref next;
    uint64_t value;
};
struct list_root {
    node_ref head;
    uint64_t count;
};

static void relative_pointers(void **state)
{
    (void)state;
    const char *path = test_path("relptr");
    nvh_pool_options opts = {.root_size = 64 << 10};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 2 * MiB, NVH_DOMAIN_PROCESS, &opts);
    assert_non_null(pool);
    char *base = nvh_pool_base(pool);
    uint64_t size = nvh_pool_size(pool);

    /* conversions */
    assert_null(nvh_ptr(pool, 0));
    assert_int_equal(nvh_off(pool, NULL), 0);
    for (nvh_off_t off = 1; off < size; off = off * 3 + 1) {
        assert_ptr_equal(nvh_ptr(pool, off), base + off);
        assert_int_equal(nvh_off(pool, nvh_ptr(pool, off)), off);
    }
    /* containment, including the edges and overflowing lengths */
    assert_true(nvh_contains(pool, base, size));
    assert_true(nvh_contains(pool, base, 0));
    assert_true(nvh_contains(pool, base + size, 0));
    assert_true(nvh_contains(pool, base + size - 1, 1));
    assert_false(nvh_contains(pool, base + size - 1, 2));
    assert_false(nvh_contains(pool, base, size + 1));
    assert_false(nvh_contains(pool, base + size, 1));
    assert_false(nvh_contains(pool, base - 1, 1));
    assert_false(nvh_contains(pool, base + 1, SIZE_MAX));
    assert_false(nvh_contains(pool, base + size + 4096, 0));
    int on_stack;
    assert_false(nvh_contains(pool, &on_stack, sizeof on_stack));

    /* a typed list built in the root area (the heap belongs to the allocator) */
    struct list_root *root = nvh_root(pool, NULL);
    assert_true(NVH_IS_NULL(root->head));
    assert_null(NVH_DEREF(pool, root->head));
    struct node *nodes = (struct node *)(root + 1);
    for (uint64_t i = 0; i < 100; i++) {
        struct node *n = &nodes[i];
        n->value = i * i;
        NVH_SET(pool, n->next, NVH_DEREF(pool, root->head));   /* push front */
        nvh_persist(pool, n, sizeof *n);
        NVH_SET(pool, root->head, n);
        root->count++;
        nvh_persist(pool, root, sizeof *root);
        assert_int_equal(root->head.off, nvh_off(pool, root + 1) + i * sizeof(struct node));
    }
    NVH_SET(pool, nodes[0].next, (struct node *)NULL);
    assert_true(NVH_IS_NULL(nodes[0].next));

    /* grow: the base does not move, so the pointers stay valid, and the new
     * range is inside the pool */
    struct node *far = (struct node *)(base + 3 * MiB);
    assert_false(nvh_contains(pool, far, sizeof *far));
    assert_int_equal(nvh_pool_grow(pool, 4 * MiB), NVH_OK);
    assert_ptr_equal(nvh_pool_base(pool), base);
    assert_true(nvh_contains(pool, far, sizeof *far));
    assert_true(nvh_contains(pool, base, 4 * MiB));
    assert_int_equal(NVH_DEREF(pool, root->head)->value, 99 * 99);
    nvh_pool_close(pool);

    /* reopen (a new mapping, in another domain) and walk the list */
    for (size_t d = 0; d < N_DOMAINS; d++) {
        pool = nvh_pool_open(path, LAYOUT, all_domains[d]);
        assert_non_null(pool);
        root = nvh_root(pool, NULL);
        assert_int_equal(root->count, 100);
        uint64_t walked = 0, expect = 99;
        struct node *n;
        for (n = NVH_DEREF(pool, root->head); n; n = NVH_DEREF(pool, n->next), expect--) {
            assert_true(nvh_contains(pool, n, sizeof *n));
            assert_int_equal(n->value, expect * expect);
            walked++;
        }
        assert_int_equal(walked, 100);
        nvh_pool_close(pool);
    }
    unlink(path);
}

/* ---- domains ------------------------------------------------------------ */

static void create_in_each_domain_reopen_in_each(void **state)
{
    (void)state;
    for (size_t c = 0; c < N_DOMAINS; c++) {
        const char *path = test_path("domains");
        nvh_pool *pool = nvh_pool_create(path, LAYOUT, MiB, all_domains[c]);
        assert_non_null(pool);
        nvh_pool_info info;
        nvh_pool_info_get(pool, &info);
        assert_int_equal(info.domain, all_domains[c]);
        assert_int_equal(info.created_domain, all_domains[c]);
        if (all_domains[c] != NVH_DOMAIN_PMEM) assert_string_equal(info.flush_instruction, "none");
        uint64_t *counter = nvh_root(pool, NULL);
        *counter = 1;
        nvh_persist(pool, counter, sizeof *counter);
        nvh_pool_close(pool);
        for (size_t o = 0; o < N_DOMAINS; o++) {
            pool = nvh_pool_open(path, LAYOUT, all_domains[o]);
            assert_non_null(pool);
            nvh_pool_info_get(pool, &info);
            assert_int_equal(info.domain, all_domains[o]);
            assert_int_equal(info.created_domain, all_domains[c]);
            counter = nvh_root(pool, NULL);
            assert_int_equal(*counter, o + 1);
            (*counter)++;
            nvh_persist(pool, counter, sizeof *counter);
            nvh_pool_close(pool);
        }
        unlink(path);
    }
}

/* ---- crash simulation of grow and of the epoch commit -------------------- */

typedef struct crash_check {
    const char *image;            /* scratch path for crash images        */
    uint64_t sizes[2];            /* acceptable recorded pool sizes       */
    uint64_t epochs[2];           /* acceptable recorded epochs           */
    const char *root_ok[2];       /* acceptable root strings              */
    uint64_t fences_seen;
    uint64_t images_checked;
} crash_check;

static bool one_of(uint64_t v, const uint64_t pair[2]) { return v == pair[0] || v == pair[1]; }

/* Open a crash image as recovery would and check it against `c`. */
static void check_image(crash_check *c, const char *where)
{
    nvh_pool *img = nvh_pool_open(c->image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!img) fail_msg("%s: crash image does not open: %s", where, nvh_errormsg());
    uint64_t size = nvh_pool_size(img);
    if (!one_of(size, c->sizes))
        fail_msg("%s: image size %llu, expected %llu or %llu", where, (unsigned long long)size,
                 (unsigned long long)c->sizes[0], (unsigned long long)c->sizes[1]);
    assert_true(file_size_of(c->image) >= size);
    uint64_t seen = nvh_pool_epoch(img) - 1;          /* open incremented it */
    if (!one_of(seen, c->epochs))
        fail_msg("%s: image epoch %llu, expected %llu or %llu", where, (unsigned long long)seen,
                 (unsigned long long)c->epochs[0], (unsigned long long)c->epochs[1]);
    const char *root = nvh_root(img, NULL);
    if (strcmp(root, c->root_ok[0]) != 0 && strcmp(root, c->root_ok[1]) != 0)
        fail_msg("%s: root '%.20s'", where, root);
    assert_int_equal(nvh_pool_close(img), NVH_OK);
    unlink(c->image);
    c->images_checked++;
}

/* Fence hook: images as of just before the fence, several seeds per mode. */
static void crash_at_fence(nvh_pool *pool, uint64_t fence, void *arg)
{
    crash_check *c = arg;
    c->fences_seen++;
    char where[64];
    for (uint64_t seed = 1; seed <= 8; seed++) {
        for (int mode = NVH_CRASH_LINES; mode <= NVH_CRASH_WORDS; mode++) {
            assert_int_equal(nvh_sim_write_image(pool, c->image, seed * 1000003 + fence,
                                                 (nvh_crash_mode)mode), NVH_OK);
            snprintf(where, sizeof where, "fence %llu seed %llu mode %d",
                     (unsigned long long)fence, (unsigned long long)seed, mode);
            check_image(c, where);
        }
    }
}

/* After an operation returned, it is durable: every image shows its result. */
static void check_after(nvh_pool *pool, crash_check *c, const char *what)
{
    c->sizes[0] = c->sizes[1];
    c->epochs[0] = c->epochs[1];
    c->root_ok[0] = c->root_ok[1];
    for (uint64_t seed = 1; seed <= 4; seed++) {
        assert_int_equal(nvh_sim_write_image(pool, c->image, seed, NVH_CRASH_WORDS), NVH_OK);
        check_image(c, what);
    }
}

static void sim_crash_grow_and_epoch_commit(void **state)
{
    (void)state;
    const char *path = make_pool("simcrash", LAYOUT, MiB, NVH_DOMAIN_PROCESS);
    crash_check c = {.image = test_path("simcrash-image"),
                     .sizes = {MiB, MiB}, .epochs = {1, 1}, .root_ok = {"", ""}};
    nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_SIM);
    assert_non_null(pool);
    c.epochs[0] = c.epochs[1] = nvh_pool_epoch(pool);      /* 2 */
    nvh_sim_set_fence_hook(pool, crash_at_fence, &c);

    /* 1. application data in the root */
    char *root = nvh_root(pool, NULL);
    c.root_ok[1] = "root-v1";
    strcpy(root, "root-v1");
    nvh_persist(pool, root, 8);
    check_after(pool, &c, "after root write");

    /* 2. grows: each commit's fence must leave old or new size, never worse */
    static const uint64_t grow_to[] = {2 * MiB, 3 * MiB + 4096, 8 * MiB};
    for (size_t g = 0; g < sizeof grow_to / sizeof grow_to[0]; g++) {
        uint64_t fences = c.fences_seen;
        c.sizes[1] = grow_to[g];
        assert_int_equal(nvh_pool_grow(pool, grow_to[g]), NVH_OK);
        assert_true(c.fences_seen > fences);                 /* the hook saw it */
        check_after(pool, &c, "after grow");
    }

    /* 3. the epoch commit, as nvh_pool_open performs it */
    uint64_t fences = c.fences_seen;
    c.epochs[1] = nvh_pool_epoch(pool) + 1;
    assert_int_equal(nvh_pool_state_commit_(pool, nvh_pool_size(pool), c.epochs[1], 0), NVH_OK);
    assert_true(c.fences_seen > fences);
    assert_int_equal(nvh_pool_epoch(pool), c.epochs[1]);
    check_after(pool, &c, "after epoch commit");

    /* 4. a grow and a root update mixed with it */
    c.sizes[1] = 9 * MiB;
    c.root_ok[1] = "root-v2";
    strcpy(root, "root-v2");
    nvh_flush(pool, root, 8);                 /* in flight across the grow's fence */
    assert_int_equal(nvh_pool_grow(pool, 9 * MiB), NVH_OK);
    nvh_drain(pool);
    check_after(pool, &c, "after grow with data in flight");

    /* 5. close's commit (clean flag) */
    fences = c.fences_seen;
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    assert_true(c.fences_seen > fences);
    print_message("crash images checked: %llu at %llu fences\n",
                  (unsigned long long)c.images_checked, (unsigned long long)c.fences_seen);

    /* the real file after a clean close */
    pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_size(pool), 9 * MiB);
    assert_int_equal(nvh_pool_epoch(pool), c.epochs[1] + 1);
    assert_string_equal(nvh_root(pool, NULL), "root-v2");
    nvh_pool_close(pool);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(epoch_increments_and_persists),
        cmocka_unit_test(state_slots_alternate),
        cmocka_unit_test(torn_state_update_every_word_mix),
        cmocka_unit_test(torn_state_update_garbage),
        cmocka_unit_test(torn_grow_commit),
        cmocka_unit_test(grow_over_stale_bytes_reads_zero),
        cmocka_unit_test(crc32c_is_standard),
        cmocka_unit_test(on_media_layout_matches_format_doc),
        cmocka_unit_test(pool_info_fields),
        cmocka_unit_test(root_size_option),
        cmocka_unit_test(relative_pointers),
        cmocka_unit_test(create_in_each_domain_reopen_in_each),
        cmocka_unit_test(sim_crash_grow_and_epoch_commit),
    };
    return cmocka_run_group_tests(tests, setup_env, NULL);
}
