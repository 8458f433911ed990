/* format.h — the on-media layout of a pool's superblock (docs/FORMAT.md).
 *
 * Page 0 of every pool file:
 *   0    .. 511   header: written once at create, never changed afterwards
 *                 (so it can never be torn by a crash after creation)
 *   512  .. 575   state slot 0 ┐ the mutable facts (size, epoch, clean flag);
 *   576  .. 639   state slot 1 ┘ updates alternate slots, the valid slot with
 *                                the higher sequence number is current
 *   640  .. 4095  reserved, zero
 * Each part carries its own CRC32C, so a torn state update costs at most the
 * update in flight, never the pool.
 *
 * All integers are little-endian (x86-64 and AArch64 native), fixed-width,
 * with explicit padding; layouts are pinned with static_assert below. */
#ifndef NVH_POOL_FORMAT_H
#define NVH_POOL_FORMAT_H

#include "nvheap.h"              /* nvh_crc32c */

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define NVH_MAGIC "NVHEAP\0\1"           /* 8 bytes, includes the NULs   */
#define NVH_FORMAT_VERSION 5u
/* The oldest format this library opens: every format-3 or -4 pool is a
 * valid format-5 pool (format 4 only gives meaning to values format 3
 * never wrote: runs of several blocks, size classes above 31; format 5 to
 * run classes above 4032 B, and it changes what a version-5 transaction log
 * means, while the log keeps its own version: a version-4 log is recovered
 * under its own rules, then raised; src/log/recover.c), so a read-write
 * open raises its version word (pool.c: format_upgrade) and an older
 * library then refuses it as newer; a read-only open reads it as it is. */
#define NVH_FORMAT_UPGRADE_FROM 3u
#define NVH_SUPERBLOCK_SIZE 4096u
#define NVH_STATE_SLOT_OFFSET 512u
#define NVH_AREA_MAX 8u

/* kinds in the area table */
enum { NVH_AREA_UNUSED = 0, NVH_AREA_ROOT = 1, NVH_AREA_HEAP = 2 };

struct nvh_area {
    uint32_t kind;          /* NVH_AREA_*                                   */
    uint32_t flags;         /* reserved, 0                                  */
    uint64_t offset;        /* from the pool base, 4 KiB aligned            */
    uint64_t size;          /* bytes; 0 for the heap = "to the end of pool" */
};
static_assert(sizeof(struct nvh_area) == 24, "nvh_area layout");

struct nvh_superblock_header {
    char magic[8];                  /*   0 NVH_MAGIC                               */
    uint32_t format_version;        /*   8 NVH_FORMAT_VERSION                      */
    uint32_t header_size;           /*  12 sizeof(struct nvh_superblock_header)    */
    uint8_t uuid[16];               /*  16 random (version 4) UUID                 */
    char layout[64];                /*  32 NUL-terminated, NUL-padded name         */
    uint64_t create_time;           /*  96 seconds since the Unix epoch            */
    uint32_t created_domain;        /* 104 nvh_domain used at create               */
    uint32_t feature_flags;         /* 108 reserved, 0                             */
    uint64_t root_offset;           /* 112                                         */
    uint64_t root_size;             /* 120                                         */
    uint64_t heap_offset;           /* 128                                         */
    uint32_t area_count;            /* 136 entries used in areas[]                 */
    uint32_t reserved0;             /* 140                                         */
    struct nvh_area areas[NVH_AREA_MAX]; /* 144 .. 335                             */
    uint64_t max_size;              /* 336 growth limit chosen at create; 0 = not
                                           recorded (default or NVHEAP_MAX_SIZE)   */
    uint8_t reserved1[164];         /* 344 .. 507, zero                            */
    uint32_t checksum;              /* 508 CRC32C of bytes 0..507                  */
};
static_assert(sizeof(struct nvh_superblock_header) == 512, "header size");
static_assert(offsetof(struct nvh_superblock_header, format_version) == 8, "header layout");
static_assert(offsetof(struct nvh_superblock_header, uuid) == 16, "header layout");
static_assert(offsetof(struct nvh_superblock_header, layout) == 32, "header layout");
static_assert(offsetof(struct nvh_superblock_header, create_time) == 96, "header layout");
static_assert(offsetof(struct nvh_superblock_header, root_offset) == 112, "header layout");
static_assert(offsetof(struct nvh_superblock_header, heap_offset) == 128, "header layout");
static_assert(offsetof(struct nvh_superblock_header, areas) == 144, "header layout");
static_assert(offsetof(struct nvh_superblock_header, max_size) == 336, "header layout");
static_assert(offsetof(struct nvh_superblock_header, checksum) == 508, "header layout");

/* state flags (format 2). NVH_STATE_HEAP: the heap area has been formatted.
 * Set once the heap header is durable and never cleared, so a heap header
 * that later reads as zero or garbage is damage (NVH_E_CORRUPT), never a
 * reason to format again over live objects. */
#define NVH_STATE_HEAP 1u

struct nvh_superblock_state {
    uint64_t sequence;              /*  0 increases by one per update; slot = seq % 2 */
    uint64_t pool_size;             /*  8 bytes of the file that belong to the pool   */
    uint64_t epoch;                 /* 16 incremented at every read-write open        */
    uint32_t clean;                 /* 24 1 after nvh_pool_close, 0 while open        */
    uint32_t flags;                 /* 28 NVH_STATE_* facts that never revert         */
    uint8_t reserved1[24];          /* 32 .. 55, zero                                 */
    uint32_t uuid_crc;              /* 56 CRC32C of the header's uuid: binds the slot */
    uint32_t checksum;              /* 60 CRC32C of bytes 0..59                       */
};
static_assert(sizeof(struct nvh_superblock_state) == 64, "state slot is one cache line");
static_assert(offsetof(struct nvh_superblock_state, pool_size) == 8, "state layout");
static_assert(offsetof(struct nvh_superblock_state, epoch) == 16, "state layout");
static_assert(offsetof(struct nvh_superblock_state, clean) == 24, "state layout");
static_assert(offsetof(struct nvh_superblock_state, flags) == 28, "state layout");
static_assert(offsetof(struct nvh_superblock_state, uuid_crc) == 56, "state layout");
static_assert(offsetof(struct nvh_superblock_state, checksum) == 60, "state layout");

struct nvh_superblock {
    struct nvh_superblock_header header;          /*    0 */
    struct nvh_superblock_state state[2];         /*  512 */
    uint8_t reserved[NVH_SUPERBLOCK_SIZE - 640];  /*  640 */
};
static_assert(sizeof(struct nvh_superblock) == NVH_SUPERBLOCK_SIZE, "superblock size");
static_assert(offsetof(struct nvh_superblock, state) == NVH_STATE_SLOT_OFFSET, "slots");

/* The checksums, defined once: the library writes and checks them with
 * these, and so does the offline checker (nvheap check), so the two cannot
 * disagree about what a checksum covers. */
static inline uint32_t nvh_sb_header_checksum(const struct nvh_superblock_header *h)
{
    return nvh_crc32c(0, h, offsetof(struct nvh_superblock_header, checksum));
}
static inline uint32_t nvh_sb_state_checksum(const struct nvh_superblock_state *s)
{
    return nvh_crc32c(0, s, offsetof(struct nvh_superblock_state, checksum));
}
/* What a state slot's uuid_crc must hold: binds the slot to its pool. */
static inline uint32_t nvh_sb_uuid_crc(const struct nvh_superblock_header *h)
{
    return nvh_crc32c(0, h->uuid, sizeof h->uuid);
}

#endif /* NVH_POOL_FORMAT_H */
