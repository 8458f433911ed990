/* alloc.h — internals of the persistent allocator (layer `alloc`): the
 * on-media structures of the heap (heap header, region headers, redo records,
 * object-table entries) and the DRAM structures (heap, arenas, runs, chunks,
 * don't-allocate FIFO) shared by the files of src/alloc/.
 *
 * Files:
 *   heap.c   format, open (recovery), close; chunks, growth, lazy chunk scan
 *   log.c    per-arena redo record rings: append, retire, replay
 *   arena.c  reserve / cancel / activate / free / alloc, thread caches, bins, FIFO
 *   named.c  the persistent object table (named allocations)
 *   check.c  header validation, corruption reports, check/repair, stats, iteration
 *
 * The design and its invariants are explained in docs/ALLOC.md. */
#ifndef NVH_ALLOC_H
#define NVH_ALLOC_H

#include "../common/crc32c.h"
#include "../common/internal.h"
#include "../pool/format.h"
#include "../protect/protect.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ==========================================================================
 * Geometry
 * ========================================================================== */
#define NVH_BLOCK 4096u                   /* block: unit of large regions        */
#define NVH_HDR 64u                       /* region header / alignment           */
#define NVH_CHUNK_DEFAULT ((uint64_t)4 << 20)
#define NVH_CHUNK_MIN ((uint64_t)64 << 10)
#define NVH_CHUNK_MAX ((uint64_t)64 << 20) /* blocks per chunk fit in 16 bits    */
#define NVH_SMALL_CLASSES 31u             /* 64 .. 1984 in 64 B steps            */
#define NVH_SMALL_MAX (NVH_SMALL_CLASSES * 64u)
#define NVH_RUN_SLOTS_BYTES (NVH_BLOCK - NVH_HDR)
#define NVH_RINGS 16u                     /* persistent rings = max arenas       */
#define NVH_RING_LINES 128u               /* 64 B lines per ring                 */
#define NVH_NAMED_CAP 1024u               /* object-table entries (power of 2)   */
#define NVH_FIFO_BATCH 16u                /* frees drain the FIFO in batches     */
#define NVH_SCAN_BUDGET 1u                /* unscanned chunks per reservation    */
#define NVH_HEAP_VERSION 1u
#define NVH_HEAP_MAGIC "NVHHEAP\1"
#define NVH_RHDR_MAGIC 0x5248564eu        /* "NVHR" */
#define NVH_RING_MAGIC 0x474e5652u        /* "RVNG" */

/* ==========================================================================
 * On-media structures (all little-endian, fixed width, pinned below)
 * ========================================================================== */

/* Heap header: first line of the heap area. Written once at format. */
struct nvh_heap_hdr {
    char magic[8];              /*  0 NVH_HEAP_MAGIC                         */
    uint32_t version;           /*  8                                        */
    uint32_t hdr_size;          /* 12 sizeof(struct nvh_heap_hdr)            */
    uint64_t chunk_size;        /* 16 bytes per chunk (power of 2)           */
    uint64_t table_off;         /* 24 object table, from the pool base       */
    uint64_t rings_off;         /* 32 ring headers, then ring bodies         */
    uint64_t chunks_off;        /* 40 chunk 0                                */
    uint32_t table_cap;         /* 48 object-table entries                   */
    uint16_t rings;             /* 52 number of rings                        */
    uint16_t ring_lines;        /* 54 lines per ring                         */
    uint32_t reserved;          /* 56                                        */
    uint32_t checksum;          /* 60 CRC32C of bytes 0..59                  */
};
static_assert(sizeof(struct nvh_heap_hdr) == 64, "heap header is one line");
static_assert(offsetof(struct nvh_heap_hdr, chunk_size) == 16, "heap header layout");
static_assert(offsetof(struct nvh_heap_hdr, checksum) == 60, "heap header layout");

/* Second line of the heap area: the high-water mark, one 8-byte word (so it
 * can never be torn): chunks at or above it have never been used. */
struct nvh_heap_state {
    uint64_t hwm_chunks;        /*  0 chunks in use (upper bound)            */
    uint8_t reserved[56];
};
static_assert(sizeof(struct nvh_heap_state) == 64, "heap state is one line");

/* Region header: the first 64 B of every region (free, run, large, huge). */
enum { NVH_RS_FREE = 1, NVH_RS_USED = 2, NVH_RS_QUARANTINE = 3 };
enum { NVH_RK_NONE = 0, NVH_RK_RUN = 1, NVH_RK_LARGE = 2, NVH_RK_HUGE = 3 };
struct nvh_rhdr {
    _Atomic uint64_t bitmap;    /*  0 runs: bit i = slot i allocated         */
    uint32_t magic;             /*  8 NVH_RHDR_MAGIC                         */
    uint32_t blocks;            /* 12 region size in 4 KiB blocks            */
    uint8_t state;              /* 16 NVH_RS_*                               */
    uint8_t kind;               /* 17 NVH_RK_* (kept when a region is freed) */
    uint8_t cls;                /* 18 runs: size class 1..31                 */
    uint8_t nslots;             /* 19 runs: slots in the run                 */
    uint32_t reserved0;         /* 20                                        */
    uint64_t seq;               /* 24 record that last wrote the header      */
    uint8_t reserved1[28];      /* 32 .. 59                                  */
    uint32_t checksum;          /* 60 CRC32C of bytes 8..59, seeded with the
                                      header's own offset in the pool        */
};
static_assert(sizeof(struct nvh_rhdr) == 64, "region header is one line");
static_assert(offsetof(struct nvh_rhdr, magic) == 8, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, state) == 16, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, seq) == 24, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, checksum) == 60, "rhdr layout");

/* Ring header (one line per ring, contiguous): the watermark is one word. */
struct nvh_ring_hdr {
    _Atomic uint64_t watermark; /*  0 records with seq <= this are retired   */
    uint32_t magic;             /*  8 NVH_RING_MAGIC                         */
    uint32_t index;             /* 12                                        */
    uint8_t reserved[48];
};
static_assert(sizeof(struct nvh_ring_hdr) == 64, "ring header is one line");

/* Redo record. Head line (64 B) carries two links; each continuation line
 * carries four. kind_links: kind in the low 4 bits, nlinks in the high 4. */
enum { NVH_REC_ACT = 1, NVH_REC_FREE = 2, NVH_REC_ACT_NAMED = 3, NVH_REC_FREE_NAMED = 4 };
#define NVH_RECF_NEWRUN 0x20u           /* cls_flags: first activation in a run */
#define NVH_RECF_KIND_SHIFT 6           /* cls_flags bits 6..7: region kind      */
struct nvh_link_entry {
    uint64_t addr;              /* offset of the link word                     */
    uint64_t value;             /* ACT: old value (replay only if unchanged);
                                   FREE: new value (replay only if == obj)     */
};
struct nvh_rec {
    uint64_t seq;               /*  0 global sequence number, > 0             */
    uint64_t obj;               /*  8 payload offset of the object            */
    uint32_t blocks;            /* 16 large/huge: region blocks               */
    uint32_t remainder;         /* 20 blocks of free remainder after it       */
    struct nvh_link_entry link[2]; /* 24 (named records: link[0].addr = slot) */
    uint32_t checksum;          /* 56 CRC32C of the record, this field 0      */
    uint16_t prefix;            /* 60 blocks from containing free region start */
    uint8_t kind_links;         /* 62                                          */
    uint8_t cls_flags;          /* 63 cls (5 bits) | NEWRUN | region kind      */
};
static_assert(sizeof(struct nvh_rec) == 64, "record head is one line");
static_assert(offsetof(struct nvh_rec, link) == 24, "record layout");
static_assert(offsetof(struct nvh_rec, checksum) == 56, "record layout");
#define NVH_REC_MAX_LINES 4u
#define NVH_LINKS_MAX_ (2u + 4u * (NVH_REC_MAX_LINES - 1u))

/* Object-table entry: committed by the 8-byte store of `off` after the name is
 * durable. off == 0: empty (name[0] == 0) or abandoned reservation;
 * off == 1: tombstone. */
struct nvh_named_entry {
    char name[56];              /*  0 NUL-terminated, <= 55 bytes             */
    _Atomic uint64_t off;       /* 56 payload offset, 0 or 1 as above          */
};
static_assert(sizeof(struct nvh_named_entry) == 64, "named entry is one line");
#define NVH_NAMED_TOMB 1u

/* ==========================================================================
 * DRAM structures
 * ========================================================================== */
typedef struct nvh_run {
    uint64_t block;             /* global block index of the run              */
    uint64_t avail;             /* slots free for reservation (DRAM only)     */
    uint64_t pbits;             /* persistent view: activated slots           */
    uint64_t resv;              /* reserved, not yet activated                */
    uint64_t tcached;           /* taken by a thread cache: still cached, or
                                   handed out by it and not yet activated or
                                   cancelled (counts as reserved)            */
    uint8_t cls, nslots, cursor;
    bool persisted;             /* run header written (by an activation)      */
    bool in_bin;
    bool quarantined;
    bool bm_pending;            /* media bitmap behind pbits until the retire */
    struct nvh_run *next;       /* bin list                                   */
} nvh_run;

typedef struct nvh_chunk {
    nvh_run **runs;             /* run descriptor per block (or NULL)         */
    bool scanned;               /* DRAM state built from the media            */
    bool arena_chunk;           /* formatted for arena use (vs huge)          */
    /* newest free record into this chunk while it was unscanned (0: none);
     * written and read under the chunk owner's lock. The scan hands the
     * chunk's free space out only once that record is retired everywhere. */
    _Atomic uint64_t unscanned_free_seq;
} nvh_chunk;

typedef struct nvh_extent { uint64_t block, nblocks; } nvh_extent;

typedef struct nvh_fifo_entry {
    uint64_t off;               /* slot payload offset or extent first block  */
    uint64_t nblocks;           /* 0: a run slot; else an extent              */
    uint64_t seq;               /* free record                                */
    uint64_t time_ns;
    uint8_t huge;               /* extents: a huge (whole-chunk) one          */
    uint8_t slot;               /* run slots: the slot index, so the drain
                                   need not derive it again (nvh_slot_of)  */
} nvh_fifo_entry;

typedef struct nvh_resv {     /* a large/huge reservation (DRAM only)       */
    uint64_t block, blocks;
    uint8_t kind;
} nvh_resv;

typedef struct nvh_arena {
    pthread_mutex_t lock;
    unsigned index;
    nvh_run *bins[NVH_SMALL_CLASSES + 1];
    nvh_extent *ext; size_t next, ext_cap;  /* sorted free extents           */
    nvh_resv *resv; size_t nresv, resv_cap;
    nvh_fifo_entry *fifo; size_t fifo_head, fifo_len, fifo_cap;
    uint64_t fifo_bytes;
    /* ring state */
    unsigned ring_pos;          /* next line                                  */
    unsigned ring_used;         /* lines used since the last retire           */
    uint64_t last_seq;          /* seq of the newest record in the ring       */
    _Atomic uint64_t unretired_min; /* oldest unretired seq, UINT64_MAX none  */
    unsigned claim_scans;       /* chunks the current reservation scanned (the
                                   lazy rebuild's budget per reservation)     */
    uint64_t fifo_blocked;      /* 1 + h->retire_epoch when the FIFO head last
                                   waited for a retire (0: not waiting); frees
                                   skip the drain until some ring retires     */
    uint64_t *dirty; size_t ndirty, dirty_cap; /* offsets of lines to flush at retire */
    nvh_run **bm_runs; size_t nbm, bm_cap; /* runs whose media bitmap the
                                   next retire writes (from pbits)            */
    uint64_t dirty_seen[64];    /* lines already in the list, direct-mapped by
                                   line address (a miss only adds a duplicate) */
    uint64_t last_links[NVH_LINKS_MAX_]; unsigned nlast_links;
    char pad[64];
} nvh_arena;

/* Per-thread reservation cache (arena.c): small slots taken from the arena
 * in batches under its lock and handed out by nvh_reserve without a lock or
 * an atomic read-modify-write. One per thread, attached to one heap at a
 * time; returned at thread exit and when the thread moves to another heap;
 * detached (its slots dropped with the DRAM state) when the heap closes.
 * DRAM only: a crash loses it like any reservation. */
#define NVH_TC_SLOTS 8u
typedef struct nvh_tcache {
    _Atomic(struct nvh_heap *) heap; /* NULL: detached (written by close)   */
    struct nvh_tcache *next, *prev;  /* the heap's list, under the tc lock  */
    uint8_t n[NVH_SMALL_CLASSES + 1];
    uint64_t off[NVH_SMALL_CLASSES + 1][NVH_TC_SLOTS]; /* stack, top = n-1 */
} nvh_tcache;

typedef struct nvh_named_pending {
    char name[56];
    uint64_t obj;
    uint32_t slot;
    bool used;
} nvh_named_pending;

struct nvh_heap {
    nvh_pool *pool;
    char *base;
    uint64_t heap_off;
    struct nvh_heap_hdr *hdr;
    struct nvh_heap_state *state;
    struct nvh_ring_hdr *ring_hdr;
    char *ring_body;
    struct nvh_named_entry *table;
    uint64_t chunk_size, bpc, chunks_off;   /* bpc: blocks per chunk          */
    unsigned bpc_shift;         /* log2(bpc): chunk of a block without a divide */
    uint64_t max_chunks;

    pthread_mutex_t lock;       /* chunks, hwm, scan cursor, huge list        */
    uint64_t hwm;               /* DRAM high-water mark (chunks)              */
    uint64_t scan_next;         /* lazy rebuild cursor (chunk index)          */
    nvh_chunk *chunks;          /* max_chunks entries                         */
    uint32_t *pview;            /* per block: length of the region that starts
                                   there in the persistent tiling, 0 = none   */
    _Atomic int16_t *owner;     /* chunk -> arena, -1 = none                  */
    nvh_extent *huge; size_t nhuge, huge_cap; /* free chunk extents           */

    nvh_arena arenas[NVH_RINGS];
    _Atomic unsigned narenas;
    _Atomic unsigned next_arena;
    _Atomic uint64_t seq;       /* last assigned record sequence              */
    _Atomic uint64_t retire_epoch; /* +1 per retire of any ring (FIFO wake-up) */

    nvh_tcache *tcaches;        /* attached thread caches (arena.c tc lock) */

    pthread_mutex_t named_lock;
    nvh_named_pending *pending; size_t npending, pending_cap;

    /* configuration */
    _Atomic uint64_t fifo_delay_ns, fifo_max_bytes;
    /* corruption reporting */
    void (*corrupt_cb)(nvh_pool *, uint64_t, const char *, void *);
    void *corrupt_arg;
    _Atomic uint64_t corrupt_count;
    pthread_mutex_t quar_lock;
    nvh_extent *quar; size_t nquar, quar_cap;   /* DRAM quarantine list    */
    uint64_t replayed;          /* records replayed at open (diagnostics)    */
};
typedef struct nvh_heap nvh_heap;

/* ==========================================================================
 * Helpers
 * ========================================================================== */
static inline uint64_t nvh_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline unsigned nvh_cls_of(size_t size)  /* 1..31, 0 = not small */
{
    if (size == 0) size = 1;
    return size <= NVH_SMALL_MAX ? (unsigned)((size + 63) / 64) : 0;
}
static inline unsigned nvh_cls_size(unsigned cls) { return cls * 64u; }
static inline unsigned nvh_cls_slots(unsigned cls) { return NVH_RUN_SLOTS_BYTES / nvh_cls_size(cls); }
static inline uint64_t nvh_block_off(const nvh_heap *h, uint64_t block)
{
    return h->chunks_off + block * NVH_BLOCK;
}
static inline struct nvh_rhdr *nvh_rhdr_at(const nvh_heap *h, uint64_t block)
{
    return (struct nvh_rhdr *)(h->base + nvh_block_off(h, block));
}
static inline uint64_t nvh_chunk_of_block(const nvh_heap *h, uint64_t block)
{
    return block >> h->bpc_shift;
}
/* Slot of the byte at `in` (offset inside its run's block) in class cls:
 * true and *slot if `in` is the start of a slot. A multiply by a 16-bit
 * reciprocal of the class instead of a divide (a div costs 25-40 cycles and
 * the hot paths did several): y = (in - 64) / 64 < 63 and cls <= 31, so
 * (y * ceil(65536 / cls)) >> 16 is exact. */
static inline bool nvh_slot_of(uint64_t in, unsigned cls, unsigned *slot)
{
    static const uint16_t recip[NVH_SMALL_CLASSES + 1] = {
        0, 65535, 32768, 21846, 16384, 13108, 10923, 9363, 8192, 7282, 6554, 5958,
        5462, 5042, 4682, 4370, 4096, 3856, 3641, 3450, 3277, 3121, 2979, 2850,
        2731, 2622, 2521, 2428, 2341, 2260, 2185, 2115};
    if (in < NVH_HDR || (in & 63) || cls == 0 || cls > NVH_SMALL_CLASSES) return false;
    unsigned y = (unsigned)((in - NVH_HDR) >> 6);
    unsigned s = cls == 1 ? y : (y * recip[cls]) >> 16;
    if (s * cls != y) return false;
    *slot = s;
    return true;
}
static inline unsigned nvh_rec_nlines(unsigned nlinks)
{
    return nlinks <= 2 ? 1u : 1u + (nlinks - 2 + 3) / 4;
}

/* CRC32C on the allocator's hot paths (record and region-header checksums):
 * nvh_crc32c's result, inlined, with unrolled 64 B and 52 B variants
 * (src/common/crc32c.h). */
static inline uint32_t nvh_crc_fast(uint32_t seed, const void *data, size_t len)
{
    return nvh_crc32c_inline(seed, data, len);
}

/* Write windows (src/protect, docs/PROTECT.md): every store the allocator
 * makes into the pool — headers, bitmaps, ring records and watermarks, the
 * object table, and the links it sets or clears for the caller — sits
 * inside an explicit window on exactly the bytes written, so the allocator
 * runs with stray-write protection on. One load and a branch each while
 * protection is off. Cold paths (format, recovery, close) use the implicit
 * window instead (nvh_protect_internal_begin/end). */
static inline void nvh_wopen(nvh_heap *h, const void *p, size_t len)
{
    nvh_protect_open_(h->pool, p, len);
}
static inline void nvh_wclose(nvh_heap *h, const void *p, size_t len)
{
    nvh_protect_close_(h->pool, p, len);
}

/* Run descriptor of a block, or NULL. Read without the owner's lock (a free
 * finds its arena here): the descriptor array and its slots are published
 * with release stores. */
static inline nvh_run *nvh_run_lookup(const nvh_heap *h, uint64_t block)
{
    uint64_t c = nvh_chunk_of_block(h, block);
    if (c >= h->max_chunks) return NULL;
    nvh_run **runs = __atomic_load_n(&h->chunks[c].runs, __ATOMIC_ACQUIRE);
    return runs ? __atomic_load_n(&runs[block & (h->bpc - 1)], __ATOMIC_ACQUIRE) : NULL;
}

/* Region-header checksum: bytes 8..59, i.e. everything but the bitmap
 * (which changes with every slot allocation and is a single atomic word) and
 * the checksum itself, seeded with the header's offset. */
static inline uint32_t nvh_rhdr_checksum_(const struct nvh_rhdr *r, uint64_t off)
{
    return nvh_crc_fast((uint32_t)(off ^ (off >> 32)) ^ 0x9E3779B9u, (const char *)r + 8, 52);
}
/* A header is trusted only if its magic, checksum and fields check out
 * (seed 000: validate before trusting). Inline: every activate and free
 * runs it; the pool size is read directly (nvh_pool_size is out of line). */
static inline bool nvh_rhdr_valid_(const nvh_heap *h, uint64_t block)
{
    uint64_t off = nvh_block_off(h, block);
    if (off + 64 > atomic_load_explicit(&h->pool->ctx.size, memory_order_relaxed)) return false;
    const struct nvh_rhdr *r = (const struct nvh_rhdr *)(h->base + off);
    return r->magic == NVH_RHDR_MAGIC && r->checksum == nvh_rhdr_checksum_(r, off) &&
           r->state >= NVH_RS_FREE && r->state <= NVH_RS_QUARANTINE && r->blocks != 0;
}

/* check.c */
uint32_t nvh_rhdr_checksum(const struct nvh_rhdr *r, uint64_t off);
bool nvh_rhdr_valid(const nvh_heap *h, uint64_t block);
void nvh_rhdr_write(nvh_heap *h, uint64_t block, uint32_t blocks, uint8_t state, uint8_t kind,
                    uint8_t cls, uint64_t bitmap, uint64_t seq);
void nvh_corrupt_report(nvh_heap *h, uint64_t off, const char *what);
void nvh_quarantine_add(nvh_heap *h, uint64_t block, uint64_t nblocks);

/* heap.c */
int nvh_heap_open_(nvh_pool *pool, bool create);
nvh_heap *nvh_heap_get_(nvh_pool *pool);
void nvh_heap_close_(nvh_pool *pool);
nvh_chunk *nvh_chunk_get(nvh_heap *h, uint64_t chunk);       /* allocate DRAM view */
int nvh_chunk_claim(nvh_heap *h, nvh_arena *a, bool fresh_first); /* scanned or fresh */
int nvh_huge_take(nvh_heap *h, uint64_t nchunks, uint64_t *chunk_out, uint64_t *rem_out);
void nvh_huge_put(nvh_heap *h, uint64_t chunk, uint64_t nchunks);
void nvh_hwm_raise(nvh_heap *h, uint64_t chunks, bool from_apply);
void nvh_prefault(nvh_heap *h, uint64_t block, uint64_t nblocks);
int nvh_heap_ensure_size(nvh_heap *h, uint64_t chunks);
void nvh_pview_set(nvh_heap *h, uint64_t block, uint64_t nblocks);
uint64_t nvh_pview_containing(nvh_heap *h, uint64_t block, uint64_t *len_out);
nvh_arena *nvh_arena_mine(nvh_heap *h);
nvh_arena *nvh_owner_arena(nvh_heap *h, uint64_t block);

/* log.c */
uint64_t nvh_log_append(nvh_heap *h, nvh_arena *a, struct nvh_rec *head,
                        const struct nvh_link_entry *links, unsigned nlinks);
void nvh_log_dirty(nvh_heap *h, nvh_arena *a, const void *addr);
void nvh_log_retire(nvh_heap *h, nvh_arena *a);
void nvh_log_retire_all(nvh_heap *h);
uint64_t nvh_log_retired_before(nvh_heap *h);
void nvh_rec_apply_state(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay);
void nvh_rec_apply_links(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay);
void nvh_rec_apply_slot(nvh_heap *h, nvh_arena *a, const struct nvh_rec *r,
                        struct nvh_rhdr *hd, nvh_run *run, unsigned slot,
                        const struct nvh_link_entry *links, unsigned nlinks, bool act);
int nvh_log_recover(nvh_heap *h);
uint64_t *nvh_log_pending_blocks(nvh_heap *h, size_t *n_out);

/* arena.c */
void nvh_arena_init(nvh_heap *h, nvh_arena *a, unsigned index);
void nvh_arena_fini(nvh_arena *a);
void nvh_extent_put(nvh_arena *a, uint64_t block, uint64_t nblocks);
void nvh_bin_add(nvh_arena *a, nvh_run *run);
void nvh_arena_exclude(nvh_heap *h, uint64_t block, uint64_t n);

void nvh_tcache_detach_all(nvh_heap *h);

int nvh_activate_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                      unsigned nlinks, int64_t named_slot);
int nvh_free_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                  unsigned nlinks, int64_t named_slot);
int nvh_heap_usable(nvh_heap *h, uint64_t off, uint64_t *usable);

/* named.c */
void nvh_named_drop_pending(nvh_heap *h, uint64_t off);
const char *nvh_named_pending_name(nvh_heap *h, uint64_t off); /* 56 bytes, NUL padded */

#endif /* NVH_ALLOC_H */
