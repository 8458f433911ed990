/* alloc.h — internals of the persistent allocator (layer `alloc`): the
 * on-media structures of the heap (heap header, region headers, redo records,
 * object-table entries) and the DRAM structures (heap, arenas, runs, chunks,
 * don't-allocate FIFO) shared by the files of src/alloc/.
 *
 * Files:
 *   heap.c     format, open (recovery), close; chunks, growth, lazy chunk scan
 *   redo.c     per-arena redo record rings: append, retire, replay
 *   arena.c    per-arena DRAM state: the arena lock, free extents, bins of runs
 *   fifo.c     the don't-allocate FIFO freed space waits in before reuse
 *   tcache.c   the per-thread reservation cache (small slots without a lock)
 *   reserve.c  nvh_reserve (small, large, huge; span merge), nvh_cancel
 *   activate.c nvh_activate: validate, record, apply
 *   free.c     nvh_free: classify, log, apply
 *   alloc.c    nvh_alloc, usable size, heap sync and settings
 *   named.c    the persistent object table (named allocations)
 *   check.c    header validation, corruption reports, check/repair, stats, iteration
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
#include <sys/types.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/* ==========================================================================
 * Geometry
 * ========================================================================== */
#define NVH_BLOCK 4096u                   /* block: unit of large regions        */
#define NVH_HDR 64u                       /* header line; runs' slots start here  */
#define NVH_CHUNK_DEFAULT ((uint64_t)4 << 20)
#define NVH_CHUNK_MIN ((uint64_t)64 << 10)
#define NVH_CHUNK_MAX ((uint64_t)64 << 20) /* blocks per chunk fit in 16 bits    */
#define NVH_SMALL_CLASSES 63u             /* 64 .. 4032 in 64 B steps            */
#define NVH_SMALL_MAX (NVH_SMALL_CLASSES * 64u)
#define NVH_SMALL_CLASSES_F3 31u          /* the classes format 3 knew           */
/* Classes above 4032 B (format 5): a few sizes in multi-block runs, each the
 * largest multiple of 64 B with n slots in a 16-block run (n = 15..9, 7, 6,
 * 5), where that costs less per object than whole blocks: 4352 4672 4992
 * 5440 5952 6528 7232 9344 10880 13056 B. cls is still size / 64, so the
 * largest is NVH_CLS_TOP; other values above 63 are no class. */
#define NVH_CLS_TOP 204u                  /* 13056 B: the largest class          */
#define NVH_CLS_BIG_MAX (NVH_CLS_TOP * 64u)
#define NVH_RUN_BLOCKS_MAX 16u            /* blocks of the largest run           */
#define NVH_RUN_SLOTS_MAX 64u             /* slots per run: one bitmap word      */
#define NVH_RINGS 16u                     /* persistent rings = max arenas       */
#define NVH_RING_LINES 128u               /* 64 B lines per ring                 */
#define NVH_NAMED_CAP 1024u               /* entries of object table 0 (power of 2) */
#define NVH_FIFO_BATCH 16u                /* frees drain the FIFO in batches     */
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
    uint32_t zone0_chunks;      /* 56 chunks of zone 0 (1..2^22), whose header
                                      slots are at nvh_zone0_off (alloc.h)   */
    uint32_t checksum;          /* 60 CRC32C of bytes 0..59                  */
};
static_assert(sizeof(struct nvh_heap_hdr) == 64, "heap header is one line");
static_assert(offsetof(struct nvh_heap_hdr, chunk_size) == 16, "heap header layout");
static_assert(offsetof(struct nvh_heap_hdr, zone0_chunks) == 56, "heap header layout");
static_assert(offsetof(struct nvh_heap_hdr, checksum) == 60, "heap header layout");

/* Second line of the heap area: the high-water mark, one 8-byte word (so it
 * can never be torn): chunks at or above it have never been used. The word
 * carries its own check (nvh_hwm_word): a mark lowered by damage would let
 * the allocator format chunks over live objects, so a word that fails the
 * check makes open fail with NVH_E_CORRUPT. */
struct nvh_heap_state {
    uint64_t hwm_word;          /*  0 nvh_hwm_word(chunks in use, upper bound) */
    uint8_t reserved[56];
};
static_assert(sizeof(struct nvh_heap_state) == 64, "heap state is one line");

/* Chunk-full map: heap_off + NVH_FULLMAP_OFF, one bit per chunk (chunk c:
 * bit c % 64 of word c / 64), for the first NVH_FULLMAP_CHUNKS chunks. A set
 * bit promises that the chunk is an arena chunk with no free space on the
 * media (no free region, every run slot activated), so the lazy rebuild can
 * skip it without reading it: the first allocation after an open goes
 * straight to a chunk with room instead of scanning full ones (or growing
 * the pool past them). Set only from what is durable (a scan that found the
 * chunk full, or the owner arena's DRAM view at a chunk claim or at close);
 * cleared by every free into the chunk — on the normal path before the
 * free's record retires (the line is in the ring's dirty list) and again by
 * replay — so a set bit never hides free space. Zero (unknown: scan it) in
 * pools formatted without it. */
#define NVH_FULLMAP_OFF 512u
#define NVH_FULLMAP_BYTES (4096u - NVH_FULLMAP_OFF)
#define NVH_FULLMAP_CHUNKS ((uint64_t)NVH_FULLMAP_BYTES * 8u)
/* hwm word: chunks in the low 32 bits (a pool of at most 2^44 bytes has at
 * most 2^28 chunks), CRC32C of them in the high 32. Zero is not a valid
 * word: a zeroed mark is detected, not read as "no chunk used". */
#define NVH_HWM_SEED 0x4d57484eu          /* "NHWM" */
static inline uint64_t nvh_hwm_word(uint64_t chunks)
{
    uint32_t c = (uint32_t)chunks;
    return (uint64_t)c | (uint64_t)nvh_crc32c(NVH_HWM_SEED, &c, sizeof c) << 32;
}
static inline bool nvh_hwm_decode(uint64_t w, uint64_t *chunks)
{
    *chunks = (uint32_t)w;
    return w == nvh_hwm_word(*chunks);
}

/* Region header: one per region (free, run, large, huge), in the header
 * chunk of its zone (nvh_rhdr_at), not in the region: large and huge
 * objects start at their first block and fill every block of it. */
enum { NVH_RS_FREE = 1, NVH_RS_USED = 2, NVH_RS_QUARANTINE = 3 };
enum { NVH_RK_NONE = 0, NVH_RK_RUN = 1, NVH_RK_LARGE = 2, NVH_RK_HUGE = 3 };
struct nvh_rhdr {
    _Atomic uint64_t bitmap;    /*  0 runs: bit i = slot i allocated         */
    uint32_t magic;             /*  8 NVH_RHDR_MAGIC                         */
    uint32_t blocks;            /* 12 region size in 4 KiB blocks            */
    uint8_t state;              /* 16 NVH_RS_*                               */
    uint8_t kind;               /* 17 NVH_RK_* (kept when a region is freed) */
    uint8_t cls;                /* 18 runs: size class / 64 B (nvh_cls_valid) */
    uint8_t nslots;             /* 19 runs: slots, nvh_run_slots(cls, blocks) */
    uint32_t reserved0;         /* 20                                        */
    uint64_t seq;               /* 24 record that last wrote the header      */
    uint8_t reserved1[28];      /* 32 .. 59                                  */
    uint32_t checksum;          /* 60 CRC32C of bytes 8..59, seeded with the
                                      offset of the region's first block     */
};
static_assert(sizeof(struct nvh_rhdr) == 64, "region header is one line");
static_assert(offsetof(struct nvh_rhdr, magic) == 8, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, state) == 16, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, seq) == 24, "rhdr layout");
static_assert(offsetof(struct nvh_rhdr, checksum) == 60, "rhdr layout");

/* Ring header (one line per ring, contiguous): the watermark is one word,
 * nvh_wm_word(seq): a zeroed watermark would make recovery replay every
 * stale record of the ring over newer headers, so it carries a check. */
struct nvh_ring_hdr {
    _Atomic uint64_t watermark; /*  0 records with seq <= this are retired   */
    uint32_t magic;             /*  8 NVH_RING_MAGIC                         */
    uint32_t index;             /* 12                                        */
    uint8_t reserved[48];
};
static_assert(sizeof(struct nvh_ring_hdr) == 64, "ring header is one line");
/* seq << 8 | 8-bit check (never 0 for seq 0); monotonic in seq */
static inline uint64_t nvh_wm_word(uint64_t seq)
{
    return seq << 8 | ((((seq ^ 0x574du) * 0x9E3779B97F4A7C15ull) >> 56) ^ 0x5Au);
}
static inline bool nvh_wm_decode(uint64_t w, uint64_t *seq)
{
    *seq = w >> 8;
    return nvh_wm_word(*seq) == w;
}

/* Redo record. Head line (64 B) carries two links; each continuation line
 * carries four. kind_links: kind in the low 4 bits, nlinks in the high 4. */
enum { NVH_REC_ACT = 1, NVH_REC_FREE = 2, NVH_REC_ACT_NAMED = 3, NVH_REC_FREE_NAMED = 4 };
#define NVH_RECF_NEWRUN 0x20u           /* cls_flags: first activation in a run */
#define NVH_RECF_MERGE 0x20u            /* cls_flags of a FREE record of a large or
                                           huge region: not an object's free but
                                           the on-media merge of the free regions a
                                           reservation spans (reserve.c: span_merge);
                                           replayed like any free (one FREE header) */
#define NVH_RECF_KIND_SHIFT 6           /* cls_flags bits 6..7: region kind      */
/* A record of a run slot (kind RUN) uses `blocks` for the run's geometry,
 * in bits format 3 always wrote as blocks = 1:
 *   bits 0..7   blocks of the run (1 .. NVH_RUN_BLOCKS_MAX)
 *   bits 8..15  the slot's block minus the run's first block, so replay
 *               finds the run's header from the slot's offset
 *   bits 16..18 the class's bits 5..7 (bits 0..4 are in cls_flags)
 * A format-3 record reads as a one-block run of class cls_flags & 31. */
static inline uint32_t nvh_rec_run_word(unsigned rblocks, unsigned delta, unsigned cls)
{
    return (uint32_t)rblocks | (uint32_t)delta << 8 | (uint32_t)(cls >> 5) << 16;
}
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
    uint8_t cls_flags;          /* 63 cls bits 0..4 | NEWRUN | region kind     */
};
static_assert(sizeof(struct nvh_rec) == 64, "record head is one line");
static_assert(offsetof(struct nvh_rec, link) == 24, "record layout");
static_assert(offsetof(struct nvh_rec, checksum) == 56, "record layout");
#define NVH_REC_MAX_LINES 4u
static inline unsigned nvh_rec_cls(const struct nvh_rec *r)
{
    return (r->cls_flags & 0x1Fu) | ((r->blocks >> 16) & 0x7u) << 5;
}
static inline unsigned nvh_rec_run_blocks(const struct nvh_rec *r) { return r->blocks & 0xFFu; }
static inline unsigned nvh_rec_run_delta(const struct nvh_rec *r) { return (r->blocks >> 8) & 0xFFu; }
#define NVH_LINKS_MAX_ (2u + 4u * (NVH_REC_MAX_LINES - 1u))

/* Object-table entry: committed by the 8-byte store of `off` after the name is
 * durable. off == 0: empty (then name[0] == 0; a name with off 0 is damage);
 * off == 1: tombstone; else nvh_named_word(): the payload offset in bits
 * 0..47 and, in bits 48..63, a check of the name, the slot and the offset, so
 * that a flipped byte of the entry can neither make a phantom name appear nor
 * send a lookup to another offset (the whole entry still commits with one
 * 8-byte store). */
struct nvh_named_entry {
    char name[56];              /*  0 NUL-terminated, <= 55 bytes             */
    _Atomic uint64_t off;       /* 56 0, 1 or nvh_named_word(), as above       */
};
static_assert(sizeof(struct nvh_named_entry) == 64, "named entry is one line");
#define NVH_NAMED_TOMB 1u

/* Object tables 1..NVH_NAMED_TABLES-1: table k holds NVH_NAMED_CAP << k
 * entries and is an ordinary heap object (reserved, zeroed, flushed, then
 * activated with its directory word as the one link), so adding a table is
 * failure-atomic like any activation: before its record's fence the word is
 * 0 and the table does not exist; after it, replay sets the word. Directory
 * word k (k >= 1) lies at heap_off + NVH_NAMED_DIR_OFF + 8 (k - 1), in the
 * otherwise unused bytes 128..511 of the heap's first page; it holds the
 * payload offset of table k, or 0. Slot numbers are global: table k holds
 * slots NVH_NAMED_CAP (2^k - 1) .. NVH_NAMED_CAP (2^(k+1) - 1) - 1, so redo
 * records and nvh_named_word name an entry by one number whatever table it
 * is in. Tables are never freed. */
#define NVH_NAMED_TABLES 15u
#define NVH_NAMED_DIR_OFF 128u
#define NVH_NAMED_MAXSLOTS (NVH_NAMED_CAP * ((1u << NVH_NAMED_TABLES) - 1u))
static_assert(NVH_NAMED_DIR_OFF >= 2 * 64, "directory after the heap header and state");
static_assert(NVH_NAMED_DIR_OFF + 8 * (NVH_NAMED_TABLES - 1) <= NVH_FULLMAP_OFF,
              "directory before the chunk-full map");
/* The chains word, heap_off + NVH_NAMED_CHAINS_OFF (zero in pools whose
 * code predates it): nvh_named_chains_word(E) when every session up to the
 * one of pool epoch E kept the tables' probe chains without holes (an empty
 * slot between a committed entry and its name's home slot); any other
 * value: unknown. Such a session rewrites it at heap open; a session of
 * older code does not, so the epoch it commits leaves the word stale. With
 * sound chains a lookup that walks a name's chain to an empty slot in every
 * table has proven the name absent, without the DRAM index. */
#define NVH_NAMED_CHAINS_OFF (NVH_NAMED_DIR_OFF + 8u * (NVH_NAMED_TABLES - 1u))
static_assert(NVH_NAMED_CHAINS_OFF + 8 <= NVH_FULLMAP_OFF, "chains word before the map");
static inline uint64_t nvh_named_chains_word(uint64_t epoch)
{
    return (epoch & 0xFFFFFFFFFFFFull) | 0x4348000000000000ull;
}
static inline unsigned nvh_named_table_of(uint32_t slot)
{
    uint32_t q = slot / NVH_NAMED_CAP + 1;     /* table k: q in [2^k, 2^(k+1)) */
    return 31u - (unsigned)__builtin_clz(q);
}
static inline uint32_t nvh_named_table_first(unsigned k)
{
    return NVH_NAMED_CAP * ((1u << k) - 1u);
}
static inline uint64_t nvh_named_table_bytes(unsigned k)
{
    return (uint64_t)NVH_NAMED_CAP << k << 6;
}
#define NVH_NAMED_OFF_MASK (((uint64_t)1 << 48) - 1)   /* pools are < 2^44 bytes */
static inline uint64_t nvh_named_word(const char name[56], uint32_t slot, uint64_t obj)
{
    uint32_t c = nvh_crc32c(0x4e4d4531u ^ slot, name, 56);
    c = nvh_crc32c(c, &obj, sizeof obj);
    return obj | (uint64_t)((c ^ (c >> 16)) & 0xFFFFu) << 48;
}

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
    uint8_t blocks;             /* blocks of the run (1 .. NVH_RUN_BLOCKS_MAX) */
    uint32_t recword;           /* nvh_rec_run_word(blocks, 0, cls)           */
    uint64_t off;               /* pool offset of the run's first byte        */
    bool persisted;             /* run header written (by an activation)      */
    bool in_bin;
    bool quarantined;
    bool bm_pending;            /* media bitmap behind pbits until the retire */
    bool hsnap_ok;              /* hsnap holds a validated header             */
    uint64_t hsnap[7];          /* bytes 8..63 of the run's media header as
                                   last validated (nvh_run_hdr_valid)         */
} nvh_run;

typedef struct nvh_chunk {
    nvh_run **runs;             /* per block: the descriptor of the run that
                                   covers it (every block of a run), or NULL */
    bool scanned;               /* DRAM state built from the media            */
    bool arena_chunk;           /* formatted for arena use (vs huge)          */
    /* newest free record into this chunk while it was unscanned (0: none);
     * written and read under the chunk owner's lock. The scan hands the
     * chunk's free space out only once that record is retired everywhere. */
    _Atomic uint64_t unscanned_free_seq;
    /* set when this session marked the chunk in the chunk-full map (chunks
     * marked by earlier sessions are read from the map: nvh_fullmap_test) */
    _Atomic bool full_mark;
} nvh_chunk;

typedef struct nvh_extent { uint64_t block, nblocks; } nvh_extent;

/* A bin: the runs of one class in one arena that may have a slot, by
 * address (arena.c): a short sorted front of the lowest ones, v[0 .. nf),
 * then a binary min-heap of the rest, v[NVH_BIN_FRONT .. + n); every
 * front entry is below every heap entry. Each entry carries its key, so
 * sorting and sifting read only the array. cap >= the arena's runs of the
 * class (grown when a run is made), so adding never allocates. */
#define NVH_BIN_FRONT 8u
typedef struct nvh_bin_ent { uint64_t block; nvh_run *run; } nvh_bin_ent;
typedef struct nvh_bin { nvh_bin_ent *v; uint32_t n, cap, nf; } nvh_bin;

typedef struct nvh_fifo_entry {
    union {
        nvh_run *run;           /* a run slot: its run (descriptors live until
                                   the heap closes), so the drain needs no
                                   lookup (docs/ALLOC.md §4f)                 */
        uint64_t off;           /* an extent: its first block                 */
    };
    uint64_t nblocks;           /* 0: a run slot; else an extent              */
    uint64_t seq;               /* free record                                */
    uint64_t time_ns;
    uint64_t epoch;             /* 0 until a drain that found a lock-free
                                   reader in stamps it with nvh_epoch_now_();
                                   then reused only once every reader that
                                   announced an epoch <= it has left
                                   (common/epoch.c, fifo.c)                   */
    uint8_t huge;               /* extents: a huge (whole-chunk) one          */
    uint8_t slot;               /* run slots: the slot index, so the drain
                                   need not derive it again (nvh_slot_of)  */
} nvh_fifo_entry;

typedef struct nvh_resv {     /* a large/huge reservation (DRAM only)       */
    uint64_t block, blocks;
    uint8_t kind;
} nvh_resv;

/* Arena lock: a test-and-test-and-set spinlock that yields when it has to
 * wait. Not a pthread_mutex_t: every activate and free takes its arena's
 * lock once, and glibc's mutex cost ~75 instructions and two LOCKed
 * read-modify-writes per pair (callgrind, docs/ALLOC.md §4f). Here the
 * acquire is one XCHG and the release a plain store (x86 TSO: a release
 * store needs no LOCK), so a lock/unlock pair has one LOCKed instruction.
 * Arenas are per thread (round robin), so the lock is nearly always free;
 * a remote free or a lazy-scan claim may find it held, and then the waiter
 * spins briefly with PAUSE and falls back to sched_yield (the holder may
 * hold it across a retire: 128 line flushes, or a chunk claim). */
typedef struct nvh_alock { _Atomic uint32_t v; } nvh_alock;
void nvh_alock_wait_(nvh_alock *l);   /* arena.c: the contended path */
static inline void nvh_alock_init(nvh_alock *l) { atomic_init(&l->v, 0); }
static inline bool nvh_alock_try(nvh_alock *l)
{
    return atomic_load_explicit(&l->v, memory_order_relaxed) == 0 &&
           atomic_exchange_explicit(&l->v, 1, memory_order_acquire) == 0;
}
static inline void nvh_alock_lock(nvh_alock *l)
{
    if (__builtin_expect(atomic_exchange_explicit(&l->v, 1, memory_order_acquire) != 0, 0))
        nvh_alock_wait_(l);
}
static inline void nvh_alock_unlock(nvh_alock *l)
{
    atomic_store_explicit(&l->v, 0, memory_order_release);
}

typedef struct nvh_arena {
    nvh_alock lock;
    unsigned index;
    nvh_bin bins[NVH_CLS_TOP + 1];
    uint32_t nruns[NVH_CLS_TOP + 1]; /* runs of each class it holds (the
                                   size of its next run, nvh_run_blocks_for) */
    uint8_t early[NVH_CLS_TOP + 1]; /* classes of one slot per block:
                                   objects served as one-block large regions
                                   before the first run (reserve.c)         */
    nvh_extent *ext; size_t next, ext_cap;  /* sorted free extents           */
    nvh_resv *resv; size_t nresv, resv_cap;
    nvh_fifo_entry *fifo; size_t fifo_head, fifo_len, fifo_cap;
    uint64_t fifo_bytes;
    /* ring state */
    unsigned ring_pos;          /* next line                                  */
    unsigned ring_used;         /* lines used since the last retire           */
    uint64_t last_seq;          /* seq of the newest record in the ring       */
    bool live;                  /* ring in h->live_rings (appended this session) */
    _Atomic uint64_t unretired_min; /* oldest unretired seq, UINT64_MAX none  */
    bool no_grow;               /* this reservation may not take a fresh
                                   chunk (nvh_reserve tries the other arenas'
                                   free space first); a->lock held          */
    uint64_t last_claim;        /* 1 + the chunk this arena claimed last (0:
                                   none): checked for the chunk-full map at
                                   the next claim                             */
    uint64_t fifo_blocked;      /* 1 + h->retire_epoch when the FIFO head last
                                   waited for a retire (0: not waiting); frees
                                   skip the drain until some ring retires     */
    uint64_t *dirty; size_t ndirty, dirty_cap; /* offsets of lines to flush at retire */
    nvh_run **bm_runs; size_t nbm, bm_cap; /* runs whose media bitmap the
                                   next retire writes (from pbits)            */
    uint64_t dirty_seen[64];    /* lines already in the list, two places per
                                   line (nvh_redo_dirty_; a miss only adds a
                                   duplicate)                                 */
    uint64_t last_links[NVH_LINKS_MAX_]; unsigned nlast_links;
    bool links_clwb;            /* this locked section already issued the
                                   CLWBs of last_links (nvh_redo_preflush)    */
    /* = last_seq, read by the other arenas' appends (nvh_seq_next): a line
     * of its own, so those reads do not share the owner's hot line */
    _Alignas(64) _Atomic uint64_t seq_pub;
    char pad[56];
} nvh_arena;

/* Per-thread reservation cache (tcache.c): small slots taken from the arena
 * in batches under its lock and handed out by nvh_reserve without a lock or
 * an atomic read-modify-write. One per thread, attached to one heap at a
 * time; returned at thread exit and when the thread moves to another heap;
 * detached (its slots dropped with the DRAM state) when the heap closes.
 * DRAM only: a crash loses it like any reservation. */
#define NVH_TC_SLOTS 8u
typedef struct nvh_tcache {
    _Atomic(struct nvh_heap *) heap; /* NULL: detached (written by close)   */
    struct nvh_tcache *next, *prev;  /* the heap's list, under the tc lock  */
    uint8_t n[NVH_CLS_TOP + 1];
    uint64_t off[NVH_CLS_TOP + 1][NVH_TC_SLOTS]; /* stack, top = n-1 */
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
    uint64_t zone0, zone0_off;  /* header zones: see nvh_rhdr_off             */

    pthread_mutex_t lock;       /* chunks, hwm, scan cursor, huge list        */
    uint64_t hwm;               /* DRAM high-water mark (chunks)              */
    uint64_t scan_next;         /* lazy rebuild cursor (chunk index)          */
    nvh_chunk *chunks;          /* max_chunks entries                         */
    uint32_t *pview;            /* per block: length of the region that starts
                                   there in the persistent tiling, 0 = none   */
    _Atomic int16_t *owner;     /* chunk -> arena index + 1, 0 = none (see
                                   nvh_owner_get)                              */
    nvh_extent *huge; size_t nhuge, huge_cap; /* free chunk extents           */

    nvh_arena arenas[NVH_RINGS];
    _Atomic unsigned narenas;
    _Atomic unsigned next_arena;
    _Atomic uint64_t seq;       /* sequence floor: the largest seq on the media
                                   at open (records get larger ones)          */
    _Atomic uint32_t live_rings; /* bit r: ring r appended in this session    */
    _Atomic uint64_t retire_epoch; /* +1 per retire of any ring (FIFO wake-up) */

    nvh_tcache *tcaches;        /* attached thread caches (tcache.c tc_lock) */

    pthread_mutex_t named_lock;
    nvh_named_pending *pending; size_t npending, pending_cap;
    /* offsets of the named objects (open addressing, 0 = empty): nvh_free
     * refuses them without a table walk. Written under named_lock, read
     * without it by nvh_free (named.c). */
    _Atomic(struct nvh_nset *) named_set;
    struct nvh_nset *nset_old;  /* replaced sets, freed at close (lock-free
                                   readers may still be in them)           */
    _Atomic uint32_t named_n;   /* entries of named_set | NVH_NAMED_BUILDING */
    /* DRAM name index (named.c), under named_lock: open addressing of
     * {slot + 1, name hash}; slots [build_next, build_end) are not indexed
     * yet (a background thread indexes them after open, in steps) */
    struct nvh_nidx { uint32_t slot1, hash; } *nidx;
    uint32_t nidx_cap, nidx_n;
    uint32_t build_next, build_end;
    bool chains_sound;          /* the chains word held: a chain miss is proof */
    bool chains_repair;         /* not sound: the build seals holes, vouches  */
    uint64_t named_epoch;       /* this session's pool epoch (chains word)    */
    _Atomic bool named_ready;   /* the index and named_set are complete      */
    _Atomic bool build_stop;    /* close: the build thread returns            */
    _Atomic unsigned named_waiting; /* API calls waiting for named_lock     */
    pthread_t build_thread;
    pid_t build_pid;            /* process that runs it, 0 = no thread        */
    uint32_t nused[NVH_NAMED_TABLES]; /* per table: entries not free (committed,
                                   pending or damaged)                      */
    unsigned ntables;           /* tables present (table 0 always)            */
    uint32_t named_damaged;     /* damaged entries found at open              */
    bool named_dir_bad;         /* a directory word failed its check at open  */
    uint64_t named_dir_badoff;

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
/* nvh_now_ns: common/internal.h */
/* The class of sizes above 4032 B, by (size + 63) / 64 - 64: the smallest
 * class that holds the size if it costs less per object than the whole
 * blocks the size needs, else 0 (a large region: 4096 B, 7233..8192 B,
 * 10881..12288 B and sizes above 13056 B cost least as whole blocks). */
extern const uint8_t nvh_big_cls_[NVH_CLS_TOP - 63];
static inline unsigned nvh_cls_of(size_t size)  /* a class, 0 = a large region */
{
    if (size == 0) size = 1;
    if (size <= NVH_SMALL_MAX) return (unsigned)((size + 63) / 64);
    return size <= NVH_CLS_BIG_MAX ? nvh_big_cls_[(size + 63) / 64 - 64] : 0;
}
/* cls is a size class: 1..63, or one of the classes above 4032 B. */
static inline bool nvh_cls_valid(unsigned cls)
{
    if (cls <= NVH_SMALL_CLASSES) return cls != 0;
    return cls <= NVH_CLS_TOP && nvh_big_cls_[cls - 64] == cls;
}
static inline unsigned nvh_cls_size(unsigned cls) { return cls * 64u; }
/* Run geometry (docs/ALLOC.md §1): a run of `blocks` blocks keeps its first
 * 64 B unused and holds equal slots after it, at most 64 (one bitmap word).
 * A header is valid only with nslots == nvh_run_slots(cls, blocks); the
 * one-block runs of format 3 (classes 1..31) satisfy the same rule. */
static inline unsigned nvh_run_slots(unsigned cls, unsigned blocks)
{
    unsigned n = (blocks * NVH_BLOCK - NVH_HDR) / nvh_cls_size(cls);
    return n > NVH_RUN_SLOTS_MAX ? NVH_RUN_SLOTS_MAX : n;
}
/* Blocks of a new run of class cls when its arena holds `nruns` runs of
 * the class already: the size up to a limit that wastes the smallest share
 * of the run (the 64 B line, the tail after the last slot), the smaller one
 * on a tie. The limit starts at one block and doubles with each run of the
 * class up to NVH_RUN_BLOCKS_MAX (16 blocks, 64 KiB): a heap that holds a
 * few objects of many classes does not pay a mostly empty 64 KiB run per
 * class, and a heap with many objects of a class soon gets the large runs.
 * With one-block runs and classes up to 1984 B, sizes uniform in 10 B ..
 * 4 KiB wasted 24 % ([Moraru11] Table 2); with 16-block runs and classes up
 * to 4032 B the geometry wastes 2.5 %. A table filled on first use
 * (constant values: no state). */
#define NVH_RUN_LEVELS 5u                 /* limits 1, 2, 4, 8, 16 blocks        */
/* A class that fits one slot per block (above 2016 B) starts its first run
 * in an arena only after this many of its objects: until then each is a
 * large region of the class's size in whole blocks (one block up to 4032 B,
 * as in format 3), whose space any size reuses when it is freed (runs are
 * never given back: a heap holding a few objects of many such classes
 * would keep a run of two or more blocks per class). */
#define NVH_RUN_EARLY 8u
extern unsigned nvh_run_early_;           /* NVH_RUN_EARLY; tests set 0       */
static_assert(1u << (NVH_RUN_LEVELS - 1) == NVH_RUN_BLOCKS_MAX, "run size levels");
unsigned nvh_run_blocks_for_(unsigned level, unsigned cls);
extern uint8_t nvh_run_blocks_tab_[NVH_RUN_LEVELS][NVH_CLS_TOP + 1];
static inline unsigned nvh_run_blocks_for(unsigned cls, uint64_t nruns)
{
    unsigned level = nruns >= NVH_RUN_LEVELS - 1 ? NVH_RUN_LEVELS - 1 : (unsigned)nruns;
    unsigned b = __atomic_load_n(&nvh_run_blocks_tab_[level][cls], __ATOMIC_RELAXED);
    return b ? b : nvh_run_blocks_for_(level, cls);
}
static inline uint64_t nvh_block_off(const nvh_heap *h, uint64_t block)
{
    return h->chunks_off + block * NVH_BLOCK;
}
static inline uint64_t nvh_chunk_of_block(const nvh_heap *h, uint64_t block)
{
    return block >> h->bpc_shift;
}
/* The owner table holds arena index + 1, so "no owner" is 0: the table is
 * sized by the reservable heap (the growth limit, up to millions of chunks)
 * but comes zeroed from the allocator, and an open touches none of it; only
 * the entries of chunks the pool actually uses ever get a page. Every read
 * and write of owner[] goes through these. */
static inline int16_t nvh_owner_code(unsigned arena) { return (int16_t)(arena + 1); }
/* chunk c's owner arena index, or -1 (none, or c beyond the table) */
static inline int nvh_owner_get(nvh_heap *h, uint64_t c, memory_order mo)
{
    return c < h->max_chunks ? (int)atomic_load_explicit(&h->owner[c], mo) - 1 : -1;
}
static inline void nvh_owner_set(nvh_heap *h, uint64_t c, unsigned arena, memory_order mo)
{
    atomic_store_explicit(&h->owner[c], nvh_owner_code(arena), mo);
}
/* claim unowned chunk c for arena; the owner it has after the call */
static inline int nvh_owner_claim(nvh_heap *h, uint64_t c, unsigned arena)
{
    int16_t own = atomic_load_explicit(&h->owner[c], memory_order_acquire);
    if (own == 0 &&
        atomic_compare_exchange_strong_explicit(&h->owner[c], &own, nvh_owner_code(arena),
                                                memory_order_acq_rel, memory_order_acquire))
        own = nvh_owner_code(arena);
    return (int)own - 1;
}
/* Chunks whose DRAM state (chunks[], owner[]) may be non-zero: those inside
 * the pool's current size. Walks over the tables (close) stop here, not at
 * max_chunks, so they cost what the pool uses, not what it may grow to. */
static inline uint64_t nvh_chunks_mapped(const nvh_heap *h, uint64_t pool_size)
{
    uint64_t n = pool_size > h->chunks_off ? (pool_size - h->chunks_off + h->chunk_size - 1) /
                                                 h->chunk_size : 0;
    return n < h->max_chunks ? n : h->max_chunks;
}
/* Header zones (docs/FORMAT.md "Header chunks"). Region headers live
 * outside the chunks they describe, so a chunk's data area is all of it:
 * a 1 MiB object takes exactly 1 MiB and four fit in a 4 MiB chunk (with
 * the header at the region start, a region of 2^k bytes needed one more
 * block, and power-of-two buffers wasted up to half a chunk). Zone 0 is the
 * first zone0 chunks (fixed at format from the pool's size then, so
 * a small pool pays only zone0 x chunk_size / 64 bytes): their header slots
 * are in the heap metadata at zone0_off. After it, every NVH_ZONE_SPAN-th
 * chunk (c >= zone0, (c - zone0) % NVH_ZONE_SPAN == 0) is a header chunk:
 * one 64 B slot per block of the 64 data chunks after it (a chunk of B
 * blocks needs B * 64 bytes = chunk_size / 64, so 64 chunks fill exactly
 * one chunk, whatever the chunk size). Header chunks are never allocated
 * and no region spans one, so an object lies in one zone. Data stays at
 * chunks_off + block * 4096: only the header's address changes. */
#define NVH_ZONE_SPAN 65u
#define NVH_ZONE_DATA (NVH_ZONE_SPAN - 1u)
/* Zone 0 covers the pool's size at format (up to this many chunks: 16 TiB
 * of 4 MiB chunks), so a pool created at its working size holds objects as
 * large as itself, as PMDK's fixed-size pools do; only space the pool grew
 * into later is zoned by header chunks. Its slots cost 1/64 of its chunks,
 * the same share as a header chunk's. */
#define NVH_ZONE0_MAX (1u << 22)
/* The most chunks one object can take: it lies in one zone. */
static inline uint64_t nvh_zone_max_chunks(uint64_t zone0)
{
    return zone0 > NVH_ZONE_DATA ? zone0 : NVH_ZONE_DATA;
}
static_assert(NVH_ZONE_DATA * sizeof(struct nvh_rhdr) == NVH_BLOCK,
              "the slots of 64 data chunks fill exactly one header chunk");
/* Geometry from the heap header alone (open, offline tools, tests). */
static inline uint64_t nvh_zone0_off(const struct nvh_heap_hdr *hh)
{
    return NVH_ALIGN_UP(hh->rings_off + (uint64_t)hh->rings * 64u * (1u + hh->ring_lines),
                        (uint64_t)NVH_BLOCK);
}
static inline bool nvh_chunk_is_hdr_z(uint64_t zone0, uint64_t chunk)
{
    return chunk >= zone0 && (chunk - zone0) % NVH_ZONE_SPAN == 0;
}
static inline uint64_t nvh_zone_index_z(uint64_t zone0, uint64_t chunk)
{
    return chunk < zone0 ? 0 : 1 + (chunk - zone0) / NVH_ZONE_SPAN;
}
static inline uint64_t nvh_rhdr_off_z(uint64_t zone0, uint64_t zone0_off, uint64_t chunks_off,
                                      uint64_t chunk_size, uint64_t block)
{
    uint64_t bpc = chunk_size / NVH_BLOCK, c = block / bpc;
    if (c < zone0) return zone0_off + block * 64u;
    uint64_t hc = c - (c - zone0) % NVH_ZONE_SPAN;
    return chunks_off + hc * chunk_size + (block - (hc + 1) * bpc) * 64u;
}
static inline uint64_t nvh_rhdr_off_hh(const struct nvh_heap_hdr *hh, uint64_t block)
{
    return nvh_rhdr_off_z(hh->zone0_chunks, nvh_zone0_off(hh), hh->chunks_off, hh->chunk_size,
                          block);
}
/* The same on an open heap. */
static inline bool nvh_chunk_is_hdr(const nvh_heap *h, uint64_t chunk)
{
    return nvh_chunk_is_hdr_z(h->zone0, chunk);
}
/* [chunk, chunk + n) holds no header chunk and lies in one zone (n >= 1) */
static inline bool nvh_chunks_data(const nvh_heap *h, uint64_t chunk, uint64_t n)
{
    return n >= 1 && !nvh_chunk_is_hdr(h, chunk) &&
           nvh_zone_index_z(h->zone0, chunk) == nvh_zone_index_z(h->zone0, chunk + n - 1);
}
/* The first header chunk after chunk c. */
static inline uint64_t nvh_next_hdr_chunk(const nvh_heap *h, uint64_t chunk)
{
    if (chunk < h->zone0) return h->zone0;
    return h->zone0 + ((chunk - h->zone0) / NVH_ZONE_SPAN + 1) * NVH_ZONE_SPAN;
}
/* Pool offset of the header slot of a block of a data chunk: on every
 * activate and free, so shifts and a divide by a constant only. */
static inline uint64_t nvh_rhdr_off(const nvh_heap *h, uint64_t block)
{
    uint64_t c = block >> h->bpc_shift;
    if (c < h->zone0) return h->zone0_off + block * 64u;
    uint64_t hc = c - (c - h->zone0) % NVH_ZONE_SPAN;
    return h->chunks_off + hc * h->chunk_size + (block - (hc + 1) * h->bpc) * 64u;
}
static inline struct nvh_rhdr *nvh_rhdr_at(const nvh_heap *h, uint64_t block)
{
    return (struct nvh_rhdr *)(h->base + nvh_rhdr_off(h, block));
}
/* Slot of the byte at `in` (offset from its run's first byte) in class cls:
 * true and *slot if `in` is the start of a slot (the caller checks it
 * against the run's nslots). A multiply by a 16-bit reciprocal of the class
 * instead of a divide (a div costs 25-40 cycles and the hot paths did
 * several): y = (in - 64) / 64 < 1024 (16 blocks); for cls <= 63
 * (y * ceil(65536 / cls)) >> 16 is exact for every y, and for every class
 * it is exact at every slot start y = s * cls (s <= 64: the error is below
 * s * cls / 65536 < 1); both checked for every pair (test_alloc_runs). A
 * y between slot starts may get a wrong quotient, which the product test
 * refuses. */
static inline bool nvh_slot_of(uint64_t in, unsigned cls, unsigned *slot)
{
    static const uint16_t recip[NVH_CLS_TOP + 1] = {
        0, 65535, 32768, 21846, 16384, 13108, 10923, 9363, 8192, 7282, 6554, 5958,
        5462, 5042, 4682, 4370, 4096, 3856, 3641, 3450, 3277, 3121, 2979, 2850,
        2731, 2622, 2521, 2428, 2341, 2260, 2185, 2115, 2048, 1986, 1928, 1873,
        1821, 1772, 1725, 1681, 1639, 1599, 1561, 1525, 1490, 1457, 1425, 1395,
        1366, 1338, 1311, 1286, 1261, 1237, 1214, 1192, 1171, 1150, 1130, 1111,
        1093, 1075, 1058, 1041, 1024, 1009, 993, 979, 964, 950, 937, 924,
        911, 898, 886, 874, 863, 852, 841, 830, 820, 810, 800, 790,
        781, 772, 763, 754, 745, 737, 729, 721, 713, 705, 698, 690,
        683, 676, 669, 662, 656, 649, 643, 637, 631, 625, 619, 613,
        607, 602, 596, 591, 586, 580, 575, 570, 565, 561, 556, 551,
        547, 542, 538, 533, 529, 525, 521, 517, 512, 509, 505, 501,
        497, 493, 490, 486, 482, 479, 475, 472, 469, 465, 462, 459,
        456, 452, 449, 446, 443, 440, 437, 435, 432, 429, 426, 423,
        421, 418, 415, 413, 410, 408, 405, 403, 400, 398, 395, 393,
        391, 388, 386, 384, 382, 379, 377, 375, 373, 371, 369, 367,
        365, 363, 361, 359, 357, 355, 353, 351, 349, 347, 345, 344,
        342, 340, 338, 337, 335, 333, 331, 330, 328, 327, 325, 323,
        322};
    /* y of any slot is below 1024; a larger y (no slot of any run) may get
     * a wrong quotient, which the product test below refuses (s < 2^16,
     * so s * cls cannot wrap) */
    static_assert(NVH_RUN_BLOCKS_MAX * NVH_BLOCK / 64 <= 1024, "reciprocals exact below 1024");
    if (in < NVH_HDR || (in & 63) || !nvh_cls_valid(cls)) return false;
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

/* Slot of the object at pool offset off in run (any block of it): true
 * and *slot if off is the start of one of the run's slots; a pointer into
 * the run's first line, inside a slot or past its last slot is none. */
static inline bool nvh_run_slot_at(const nvh_heap *h, const nvh_run *run, uint64_t off,
                                   unsigned *slot)
{
    (void)h;
    return nvh_slot_of(off - run->off, run->cls, slot) && *slot < run->nslots;
}
/* Pool offset of slot `slot` of run. */
static inline uint64_t nvh_run_slot_off(const nvh_heap *h, const nvh_run *run, unsigned slot)
{
    (void)h;
    return run->off + NVH_HDR + (uint64_t)slot * nvh_cls_size(run->cls);
}

/* Region-header checksum: bytes 8..59, i.e. everything but the bitmap
 * (which changes with every slot allocation and is a single atomic word) and
 * the checksum itself, seeded with the offset of the region's first block
 * (so a header copied to another slot fails). */
static inline uint32_t nvh_rhdr_checksum_(const struct nvh_rhdr *r, uint64_t off)
{
    return nvh_crc_fast((uint32_t)(off ^ (off >> 32)) ^ 0x9E3779B9u, (const char *)r + 8, 52);
}
/* A header is trusted only if its magic, checksum and fields check out
 * ([Moraru11]: validate before trusting). Inline: every activate and free
 * runs it; the pool size is read directly (nvh_pool_size is out of line). */
static inline bool nvh_rhdr_valid_(const nvh_heap *h, uint64_t block)
{
    if (nvh_chunk_is_hdr(h, nvh_chunk_of_block(h, block))) return false;
    uint64_t off = nvh_block_off(h, block);
    if (off + 64 > atomic_load_explicit(&h->pool->ctx.size, memory_order_relaxed)) return false;
    const struct nvh_rhdr *r = nvh_rhdr_at(h, block);
    return r->magic == NVH_RHDR_MAGIC && r->checksum == nvh_rhdr_checksum_(r, off) &&
           r->state >= NVH_RS_FREE && r->state <= NVH_RS_QUARANTINE && r->blocks != 0;
}

/* The header check of activate and free for a region that may have a run
 * descriptor: true iff nvh_rhdr_valid_ would be. The first check of a run
 * computes the checksum and keeps a copy of the checksummed bytes and the
 * checksum (bytes 8..63) in the descriptor; later checks compare the media
 * bytes with that copy (7 words, no CRC: ~40 instructions less per free,
 * docs/ALLOC.md §4f). Equal bytes at the same position mean the checksum
 * holds (it is a function of them and of the position), so the result is
 * the same, and any change at all — a stray write that happens to keep the
 * CRC included — is caught; a header the allocator rewrote legitimately
 * just takes the full check again and is snapshotted anew. The bitmap
 * (bytes 0..7) is outside the checksum and outside the copy. Owner's lock
 * held. */
static inline __attribute__((always_inline)) bool
nvh_run_hdr_valid(const nvh_heap *h, nvh_run *run, uint64_t block)
{
    const char *r = (const char *)nvh_rhdr_at(h, block);
    if (run && run->hsnap_ok) {
#if defined(__x86_64__)
        /* three 16-byte compares and one word (SSE2 is baseline x86-64) */
        const __m128i *m = (const __m128i *)(const void *)(r + 8);
        const __m128i *c = (const __m128i *)(const void *)run->hsnap;
        __m128i x = _mm_xor_si128(_mm_loadu_si128(m), _mm_loadu_si128(c));
        x = _mm_or_si128(x, _mm_xor_si128(_mm_loadu_si128(m + 1), _mm_loadu_si128(c + 1)));
        x = _mm_or_si128(x, _mm_xor_si128(_mm_loadu_si128(m + 2), _mm_loadu_si128(c + 2)));
        uint64_t tail;
        memcpy(&tail, r + 56, 8);
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_setzero_si128())) == 0xFFFF &&
            tail == run->hsnap[6])
            return true;
#else
        uint64_t w[7], d = 0;
        memcpy(w, r + 8, sizeof w);
        for (unsigned i = 0; i < 7; i++) d |= w[i] ^ run->hsnap[i];
        if (d == 0) return true;
#endif
    }
    if (!nvh_rhdr_valid_(h, block)) return false;
    if (run) {
        memcpy(run->hsnap, r + 8, sizeof run->hsnap);
        run->hsnap_ok = true;
    }
    return true;
}

/* check.c */
uint64_t nvh_region_start_media(nvh_heap *h, uint64_t block);
uint32_t nvh_rhdr_checksum(const struct nvh_rhdr *r, uint64_t off);
bool nvh_rhdr_valid(const nvh_heap *h, uint64_t block);
void nvh_rhdr_write(nvh_heap *h, uint64_t block, uint32_t blocks, uint8_t state, uint8_t kind,
                    uint8_t cls, uint64_t bitmap, uint64_t seq);
void nvh_corrupt_report(nvh_heap *h, uint64_t off, const char *what);
void nvh_quarantine_add(nvh_heap *h, uint64_t block, uint64_t nblocks);

/* heap.c */
int nvh_heap_open_(nvh_pool *pool, bool create);  /* format or recover (pool open) */
nvh_heap *nvh_heap_get_(nvh_pool *pool);
void nvh_heap_quiesce_(nvh_pool *pool);            /* pool close, before the clean mark */
void nvh_heap_close_(nvh_pool *pool);              /* free the DRAM state */
nvh_chunk *nvh_chunk_get(nvh_heap *h, uint64_t chunk);       /* allocate DRAM view */
int nvh_chunk_claim(nvh_heap *h, nvh_arena *a, bool scan_only); /* scanned or fresh */
int nvh_huge_take(nvh_heap *h, uint64_t nchunks, uint64_t *chunk_out, uint64_t *rem_out,
                  bool fresh);
void nvh_fullmap_clear(nvh_heap *h, nvh_arena *a, uint64_t chunk, bool replay);
bool nvh_fullmap_test(nvh_heap *h, uint64_t chunk);
bool nvh_chunk_full_dram(nvh_heap *h, nvh_arena *a, uint64_t chunk);
void nvh_huge_put(nvh_heap *h, uint64_t chunk, uint64_t nchunks);
void nvh_hwm_raise(nvh_heap *h, uint64_t chunks, bool from_apply);
void nvh_prefault(nvh_heap *h, uint64_t block, uint64_t nblocks);
int nvh_heap_ensure_size(nvh_heap *h, uint64_t chunks);
void nvh_pview_set(nvh_heap *h, uint64_t block, uint64_t nblocks);
uint64_t nvh_pview_containing(nvh_heap *h, uint64_t block, uint64_t *len_out);
nvh_arena *nvh_arena_mine(nvh_heap *h);
nvh_arena *nvh_owner_arena(nvh_heap *h, uint64_t block);

/* redo.c */
/* Sequence number of a new record of arena a's ring (caller holds a->lock).
 * Records are ordered for replay by these numbers, which must (1) increase
 * along each ring, (2) be unique, and (3) respect causality across rings: a
 * record appended after another record's append returned (in happens-before
 * order) gets a larger number. A global fetch-and-add gave all three with a
 * LOCKed instruction per operation; here (a Lamport clock) each ring
 * publishes its newest number and a new record takes one more than the
 * largest published by the rings in use (and than the floor found on the
 * media at open), rounded up to the next multiple of 16 plus the ring's
 * index: the low 4 bits make numbers of different rings distinct. (3) holds
 * because the other ring published its number before its append returned,
 * and this append reads it afterwards; concurrent records (neither happens
 * before the other) may be ordered either way, as with the fetch-and-add.
 * Plain loads, no LOCKed read-modify-write (docs/ALLOC.md §4f). */
static_assert(NVH_RINGS <= 16, "nvh_seq_next keeps the ring index in 4 bits");
static inline uint64_t nvh_seq_next(nvh_heap *h, nvh_arena *a)
{
    if (__builtin_expect(!a->live, 0)) {
        a->live = true;
        atomic_fetch_or_explicit(&h->live_rings, 1u << a->index, memory_order_acq_rel);
    }
    uint64_t m = atomic_load_explicit(&h->seq, memory_order_relaxed);
    uint32_t live = atomic_load_explicit(&h->live_rings, memory_order_acquire);
    do {
        unsigned r = (unsigned)__builtin_ctz(live);
        uint64_t v = atomic_load_explicit(&h->arenas[r].seq_pub, memory_order_acquire);
        if (v > m) m = v;
        live &= live - 1;
    } while (live);
    uint64_t seq = ((m >> 4) + 1) << 4 | a->index;
    atomic_store_explicit(&a->seq_pub, seq, memory_order_release);
    return seq;
}

uint64_t nvh_redo_append(nvh_heap *h, nvh_arena *a, struct nvh_rec *head,
                        const struct nvh_link_entry *links, unsigned nlinks);

/* Ring bookkeeping after a record's fence (nvh_redo_append and its inline
 * fast path below). */
static inline void nvh_redo_appended_(nvh_arena *a, const struct nvh_rec *head,
                                     const struct nvh_link_entry *links, unsigned nlinks,
                                     unsigned nlines, uint64_t seq)
{
    /* only the first record after a retire sets it (we hold a->lock) */
    if (atomic_load_explicit(&a->unretired_min, memory_order_relaxed) == UINT64_MAX)
        atomic_store_explicit(&a->unretired_min, seq, memory_order_release);
    a->last_seq = seq;
    a->links_clwb = false;
    a->ring_pos += nlines;
    a->ring_used += nlines;
    a->nlast_links = 0;
    /* only an activation's links ride on the next fence; a free's links
     * wait for the retire (see nvh_rec_apply_links) */
    if ((head->kind_links & 0x0F) == NVH_REC_ACT)
        for (unsigned i = 0; i < nlinks; i++) a->last_links[a->nlast_links++] = links[i].addr;
}

/* pmem with CLWB: the links' write-backs can start early (preflush) */
static inline bool nvh_pmem_clwb_(const nvh_heap *h)
{
#if defined(__x86_64__)
    return h->pool->ctx.domain == NVH_DOMAIN_PMEM && h->pool->ctx.flush_kind == NVH_FLUSH_CLWB;
#else
    (void)h;
    return false;
#endif
}

/* pmem with any flush instruction (CLWB, CLFLUSHOPT, CLFLUSH): the fast path
 * below streams the record and writes the links back itself. Only the
 * fences-only configuration (no flush instruction) takes the generic path. */
static inline bool nvh_pmem_flush_(const nvh_heap *h)
{
#if defined(__x86_64__)
    return h->pool->ctx.domain == NVH_DOMAIN_PMEM && h->pool->ctx.flush_kind != NVH_FLUSH_NONE;
#else
    (void)h;
    return false;
#endif
}

/* Issue the write-backs of the ring's previous activation links now, at the
 * start of the locked section of an activate or free, instead of just before
 * the record's fence: a CLWB'd line takes tens of ns to write back, and
 * started here it overlaps the ~200 instructions of checks and
 * record building. Durability is unchanged — the fence of this section's
 * record still waits for them, and the fast append counts them as before;
 * the flag only spares it a second CLWB of the same lines. Every path that
 * leaves the section without that fence clears the flag (the next record
 * re-issues them: another thread's fence would not wait for our CLWBs). */
static inline void nvh_redo_preflush(nvh_heap *h, nvh_arena *a)
{
#if defined(__x86_64__)
    if (a->nlast_links && nvh_pmem_clwb_(h)) {
        for (unsigned i = 0; i < a->nlast_links; i++)
            __asm__ volatile("clwb %0" : "+m"(*(volatile char *)(h->base + a->last_links[i])));
        a->links_clwb = true;
    }
#else
    (void)h; (void)a;
#endif
}

/* nvh_redo_append, inlined for the common case of every activate and free:
 * a one-line record (at most 2 links) that fits the ring without a retire,
 * in the process domain or the pmem domain with a flush instruction (the
 * link write-backs use the pool's: CLWB, CLFLUSHOPT or CLFLUSH). The same stores,
 * flushes, fence and statistics as the generic path (which every other case
 * takes: the crash simulator's sim domain, msync, multi-line records), but
 * without the call and with the pmem line streamed by four inline MOVNTDQ
 * instead of nvh_memcpy_nt_'s generic copy (head/tail handling, an indirect
 * AVX/SSE2 choice, two statistics updates): ~60 instructions per pmem
 * operation (docs/ALLOC.md §4f). */
static inline __attribute__((always_inline)) uint64_t
nvh_redo_append1(nvh_heap *h, nvh_arena *a, struct nvh_rec *head,
                const struct nvh_link_entry *links, unsigned nlinks)
{
    nvh_persist_ctx_ *ctx = &h->pool->ctx;
    bool pmem = nvh_pmem_flush_(h);
    if (__builtin_expect(nlinks > 2 || a->ring_pos >= NVH_RING_LINES ||
                             a->ring_used >= NVH_RING_LINES ||
                             (!pmem && ctx->domain != NVH_DOMAIN_PROCESS), 0))
        return nvh_redo_append(h, a, head, links, nlinks);
    uint64_t seq = nvh_seq_next(h, a);
    head->seq = seq;
    head->kind_links = (uint8_t)((head->kind_links & 0x0F) | (nlinks << 4));
    for (unsigned i = 0; i < nlinks; i++) head->link[i] = links[i];
    head->checksum = 0;
    head->checksum = nvh_crc_fast(a->index << 16 | a->ring_pos, head, 64);
    char *dst = h->ring_body + ((size_t)a->index * NVH_RING_LINES + a->ring_pos) * 64u;
    nvh_wopen(h, dst, 64);
#if defined(__x86_64__)
    if (pmem) {
        /* the record line streamed (see nvh_redo_append), the previous
         * activation's link lines written back, one fence */
        const __m128i *src = (const __m128i *)(const void *)head;
        __m128i x0 = _mm_loadu_si128(src), x1 = _mm_loadu_si128(src + 1);
        __m128i x2 = _mm_loadu_si128(src + 2), x3 = _mm_loadu_si128(src + 3);
        _mm_stream_si128((__m128i *)(void *)dst, x0);
        _mm_stream_si128((__m128i *)(void *)(dst + 16), x1);
        _mm_stream_si128((__m128i *)(void *)(dst + 32), x2);
        _mm_stream_si128((__m128i *)(void *)(dst + 48), x3);
        nvh_wclose(h, dst, 64);
        if (!a->links_clwb) {   /* else issued by nvh_redo_preflush */
            unsigned k = ctx->flush_kind;
            for (unsigned i = 0; i < a->nlast_links; i++) {
                volatile char *l = (volatile char *)(h->base + a->last_links[i]);
                if (k == NVH_FLUSH_CLWB) __asm__ volatile("clwb %0" : "+m"(*l));
                else if (k == NVH_FLUSH_CLFLUSHOPT) __asm__ volatile("clflushopt %0" : "+m"(*l));
                else __asm__ volatile("clflush %0" : "+m"(*l));
            }
        }
        /* also with CLFLUSH (which nvh_drain leaves unfenced): the streamed
         * record line is ordered only by a fence, and the link stores that
         * follow must not reach the media before it */
        __asm__ volatile("sfence" ::: "memory");
        nvh_stat_add_(ctx, NVH_STAT_NT_BYTES, 64);
    } else
#endif
    {
        memcpy(dst, head, 64);
        nvh_wclose(h, dst, 64);
        __asm__ volatile("" ::: "memory");   /* process domain: program order */
    }
    {   /* nvh_stat_add_ for lines and fences with one stripe lookup */
        unsigned stripe = nvh_thread_stripe_;
        if (__builtin_expect(stripe == 0, 0)) stripe = nvh_assign_stripe_();
        _Atomic uint64_t *v = ctx->stats[stripe - 1].value;
        atomic_store_explicit(&v[NVH_STAT_LINES],
                              atomic_load_explicit(&v[NVH_STAT_LINES], memory_order_relaxed) +
                                  1 + a->nlast_links,
                              memory_order_relaxed);
        atomic_store_explicit(&v[NVH_STAT_FENCES],
                              atomic_load_explicit(&v[NVH_STAT_FENCES], memory_order_relaxed) + 1,
                              memory_order_relaxed);
    }
    nvh_redo_appended_(a, head, links, nlinks, 1, seq);
    return seq;
}
void nvh_redo_dirty(nvh_heap *h, nvh_arena *a, const void *addr);
void nvh_redo_retire(nvh_heap *h, nvh_arena *a);
void nvh_redo_retire_all(nvh_heap *h);
uint64_t nvh_redo_retired_before(nvh_heap *h);
void nvh_rec_apply_state(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay);
void nvh_rec_apply_links(nvh_heap *h, const struct nvh_rec *r,
                         const struct nvh_link_entry *links, nvh_arena *a, bool replay);

/* The ring's dirty-line list (flushed at the retire): a table of lines
 * already listed (cleared at retire) de-duplicates in O(1). Two places per
 * line (two hashes): a free's run header and its link line hit one place
 * about once per 32 pairs of lines, and with a single place two such lines
 * alternating, header and link on every free, each evicted the other and
 * put a duplicate in the list at every call (a retire flushed ~35 lines for
 * 128 frees instead of ~21). A line is put in its first place if that is
 * empty, else in its second, so two colliding lines keep one each. A miss
 * that still gets in only costs a duplicate (flushed twice). The hit test
 * is inline, the append out of line. */
void nvh_redo_dirty_add_(nvh_heap *h, nvh_arena *a, uint64_t line, uint64_t *seen);
static inline void nvh_redo_dirty_(nvh_heap *h, nvh_arena *a, const void *addr)
{
    uint64_t line = (uint64_t)(uintptr_t)addr & ~(uint64_t)63;
    /* run headers are 4 KiB apart: hash, not mask */
    uint64_t x = line * 0x9E3779B97F4A7C15ull;
    uint64_t *s1 = &a->dirty_seen[x >> 58];
    if (__builtin_expect(*s1 == line, 1)) return;
    /* the second place differs from the first (xor with a nonzero value),
     * so two lines colliding in their first place always keep one each */
    uint64_t *s2 = &a->dirty_seen[(x >> 58) ^ (((x >> 52) & 63) | 1)];
    if (*s2 != line) nvh_redo_dirty_add_(h, a, line, *s1 ? s2 : s1);
}
/* Mark a run whose media bitmap the next retire writes (redo.c, §7a). */
void nvh_bitmap_defer_(nvh_arena *a, nvh_run *run);

/* Normal-path effects of an ACT (act = true) or FREE record, not named, of
 * a slot of an existing run (no NEWRUN) whose DRAM run descriptor the caller
 * (nvh_activate_off_, nvh_free_off_) already holds: exactly what
 * nvh_rec_apply_state (apply_region's / free_region's run branch) and
 * nvh_rec_apply_links do for that record, without recomputing its block,
 * slot and run from the record and without the kind dispatch (~60
 * instructions per operation, callgrind). Replay and every other record
 * keep the generic functions. Inline (alloc.h): the call cost ~25
 * instructions per operation. */
static inline __attribute__((always_inline)) void
nvh_rec_apply_slot(nvh_heap *h, nvh_arena *a, const struct nvh_rec *r, struct nvh_rhdr *hd,
                   nvh_run *run, unsigned slot, const struct nvh_link_entry *links,
                   unsigned nlinks, bool act)
{
    if (!run->bm_pending) nvh_bitmap_defer_(a, run);
    if (!run->bm_pending) {
        /* load + store: every writer of the bitmap holds the owner's lock */
        uint64_t bits = atomic_load_explicit(&hd->bitmap, memory_order_relaxed);
        nvh_wopen(h, &hd->bitmap, 8);
        atomic_store_explicit(&hd->bitmap, act ? bits | (1ull << slot) : bits & ~(1ull << slot),
                              memory_order_relaxed);
        nvh_wclose(h, &hd->bitmap, 8);
    }
    nvh_redo_dirty_(h, a, hd);
    for (unsigned i = 0; i < nlinks; i++) {
        _Atomic uint64_t *w = (_Atomic uint64_t *)(h->base + links[i].addr);
        if (act) {
            /* flushed before the ring's next fence (nvh_redo_append);
             * release: as in nvh_rec_apply_links */
            nvh_wopen(h, (const void *)w, 8);
            atomic_store_explicit(w, r->obj, memory_order_release);
            nvh_wclose(h, (const void *)w, 8);
            continue;
        }
        if (atomic_load_explicit(w, memory_order_relaxed) == r->obj) {
            nvh_wopen(h, (const void *)w, 8);
            atomic_store_explicit(w, links[i].value, memory_order_release);
            nvh_wclose(h, (const void *)w, 8);
        }
        nvh_redo_dirty_(h, a, (const void *)w);
    }
}

int nvh_redo_recover(nvh_heap *h);
uint64_t *nvh_redo_pending_blocks(nvh_heap *h, size_t *n_out);

/* ==========================================================================
 * The allocation paths: arena.c, fifo.c, tcache.c, reserve.c, activate.c,
 * free.c, alloc.c. What more than one of them uses is declared here; the
 * helpers that run on every operation are static inline, so splitting the
 * paths by concern costs no call.
 * ========================================================================== */

/* arena.c: per-arena DRAM state (free extents, bins of runs) */
void nvh_arena_init(nvh_heap *h, nvh_arena *a, unsigned index);
void nvh_arena_fini(nvh_arena *a);
void nvh_extent_put(nvh_arena *a, uint64_t block, uint64_t nblocks);
bool nvh_extent_take(nvh_heap *h, nvh_arena *a, uint64_t n, uint64_t *block_out);
void nvh_bin_add(nvh_arena *a, nvh_run *run);
void nvh_bin_pop_(nvh_bin *b);
void nvh_bin_front_pop_(nvh_bin *b);
bool nvh_bin_room(nvh_arena *a, unsigned cls);
nvh_run *nvh_run_new(nvh_heap *h, nvh_arena *a, uint64_t block, unsigned cls, unsigned blocks);
void nvh_run_publish(nvh_heap *h, nvh_chunk *ch, nvh_run *run);
/* The descriptor's fields derived from block, cls and blocks. */
static inline void nvh_run_derive(const nvh_heap *h, nvh_run *run)
{
    run->recword = nvh_rec_run_word(run->blocks, 0, run->cls);
    run->off = nvh_block_off(h, run->block);
}
unsigned nvh_run_pick(nvh_run *run);
void nvh_arena_exclude(nvh_heap *h, uint64_t block, uint64_t n);

/* The lowest run of class cls in a's bin with a slot to reserve, or NULL;
 * runs found full or quarantined at the top leave the bin on the way (a
 * run that fills stays in the bin until it reaches the top). a->lock held. */
static inline nvh_run *nvh_bin_first(nvh_arena *a, unsigned cls)
{
    nvh_bin *b = &a->bins[cls];
    while (b->nf) {                     /* the front holds the lowest runs */
        nvh_run *run = b->v[0].run;
        if (__builtin_expect(run->avail != 0 && !run->quarantined, 1)) return run;
        run->in_bin = false;
        nvh_bin_front_pop_(b);
    }
    while (b->n) {
        nvh_run *run = b->v[NVH_BIN_FRONT].run;
        if (__builtin_expect(run->avail != 0 && !run->quarantined, 1)) return run;
        run->in_bin = false;
        nvh_bin_pop_(b);
    }
    return NULL;
}

/* Debug invariant (NVHEAP_DEBUG_ALLOC=1): no free extent covers a run or a
 * persistent non-free region start. The flag test is inline, the walk out
 * of line (and off by default). -1: environment not read yet. */
extern _Atomic int nvh_arena_debug_on_;
void nvh_arena_debug_check_(nvh_heap *h, nvh_arena *a, const char *where);
static inline void nvh_arena_debug_check(nvh_heap *h, nvh_arena *a, const char *where)
{
    if (__builtin_expect(atomic_load_explicit(&nvh_arena_debug_on_, memory_order_relaxed) != 0, 0))
        nvh_arena_debug_check_(h, a, where);
}

/* fifo.c: the don't-allocate FIFO freed space waits in before reuse */
bool nvh_fifo_grow_(nvh_arena *a);
size_t nvh_fifo_drain_(nvh_heap *h, nvh_arena *a, bool force, bool may_retire);
/* Release FIFO heads whose time is up (or all, if force) and whose free
 * record is retired in every ring; may_retire: retire a's ring when the
 * head waits for it. Returns how many were released. An empty FIFO costs
 * no call. */
static inline size_t nvh_fifo_drain(nvh_heap *h, nvh_arena *a, bool force, bool may_retire)
{
    if (!a->fifo_len) return 0;
    return nvh_fifo_drain_(h, a, force, may_retire);
}
/* Inline: every free pushes. huge_or_slot: for an extent (nblocks > 0)
 * whether it is huge; for a run slot (nblocks == 0) the slot index. */
static inline void nvh_fifo_push(nvh_heap *h, nvh_arena *a, nvh_run *run, uint64_t off,
                                 uint64_t nblocks, uint8_t huge_or_slot, uint64_t seq,
                                 uint64_t bytes)
{
    if (__builtin_expect(a->fifo_len == a->fifo_cap, 0) && !nvh_fifo_grow_(a))
        return;                         /* space lost until the next open */
    /* no clock read when T is 0: the FIFO then only orders reuse */
    uint64_t t = atomic_load_explicit(&h->fifo_delay_ns, memory_order_relaxed) ? nvh_now_ns() : 0;
    /* the capacity is a power of 2 (256, doubled): mask, not divide */
    nvh_fifo_entry *e = &a->fifo[(a->fifo_head + a->fifo_len) & (a->fifo_cap - 1)];
    if (nblocks) e->off = off;
    else e->run = run;
    e->nblocks = nblocks;
    e->seq = seq;
    e->time_ns = t;
    e->epoch = 0;                       /* stamped by a drain, if needed */
    e->huge = nblocks ? huge_or_slot : 0;
    e->slot = nblocks ? 0 : huge_or_slot;
    a->fifo_len++;
    a->fifo_bytes += bytes;
}

/* tcache.c: the per-thread reservation cache */
extern _Thread_local nvh_tcache *nvh_tcache_mine_;   /* the calling thread's */
nvh_tcache *nvh_tcache_attach(nvh_heap *h);
int nvh_tcache_refill(nvh_heap *h, nvh_arena *a, nvh_tcache *tc, unsigned cls, uint64_t *off);
void nvh_tcache_detach_all(nvh_heap *h);
/* Is off one of the slots sitting in the calling thread's cache (not handed
 * out)? Activate, cancel and free of a slot marked tcached ask it: such a
 * slot was never handed out. */
static inline bool nvh_tcache_holds(nvh_heap *h, uint64_t off, unsigned cls)
{
    nvh_tcache *tc = nvh_tcache_mine_;
    if (!tc || atomic_load_explicit(&tc->heap, memory_order_relaxed) != h) return false;
    /* the usual case, the slot the thread was just handed: it sits right
     * above the stack's top (a pop leaves it there, a refill puts it
     * there), and the entry above the top is never one below it (entries
     * are distinct; nvh_tcache_refill) */
    unsigned n = tc->n[cls];
    if (n < NVH_TC_SLOTS && tc->off[cls][n] == off) return false;
    for (unsigned i = 0; i < n; i++)
        if (tc->off[cls][i] == off) return true;
    return false;
}

/* reserve.c: reserve and cancel */
int nvh_reserve_small(nvh_heap *h, nvh_arena *a, unsigned cls, uint64_t *off);
/* The large or huge reservation starting at block (DRAM only), or NULL.
 * a->lock held. */
static inline nvh_resv *nvh_resv_find(nvh_arena *a, uint64_t block)
{
    for (size_t i = a->nresv; i-- > 0;)
        if (a->resv[i].block == block) return &a->resv[i];
    return NULL;
}
static inline void nvh_resv_remove(nvh_arena *a, nvh_resv *r)
{
    *r = a->resv[--a->nresv];
}

/* activate.c, free.c */
int nvh_activate_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                      unsigned nlinks, int64_t named_slot);
int nvh_free_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                  unsigned nlinks, int64_t named_slot);

/* alloc.c */
int nvh_heap_usable(nvh_heap *h, uint64_t off, uint64_t *usable);

/* The checks at the public entry points (nvh_reserve, nvh_cancel,
 * nvh_activate, nvh_free, ...), inline: they run on every call. */

/* The pool's opened heap (opened the first time), or NULL with the error
 * set; write: refuse a read-only pool. */
static inline nvh_heap *nvh_heap_of(nvh_pool *pool, bool write)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "pool is NULL");
        return NULL;
    }
    /* the opened heap without a call; nvh_heap_get_ opens it the first time */
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    if (__builtin_expect(!h, 0) && !(h = nvh_heap_get_(pool))) return NULL;
    if (write && pool->readonly) {
        nvh_fail(NVH_E_READONLY, "pool %s is open read-only", pool->path);
        return NULL;
    }
    return h;
}

/* ptr can be an object of the heap: inside the pool, in a data chunk
 * (not a header chunk), 64 B aligned and not a run's first line. */
static inline __attribute__((always_inline)) int
nvh_check_heap_ptr(nvh_heap *h, const void *ptr, uint64_t *off_out)
{
    if (!ptr) return nvh_fail(NVH_E_INVAL, "pointer is NULL");
    if (!nvh_contains(h->pool, ptr, 1))
        return nvh_fail(NVH_E_BADPTR, "pointer %p is outside pool %s", ptr, h->pool->path);
    uint64_t off = nvh_off(h->pool, ptr);
    if (off < h->chunks_off || off % NVH_ALLOC_ALIGN ||
        nvh_chunk_is_hdr(h, (off - h->chunks_off) >> (h->bpc_shift + 12)))
        return nvh_fail(NVH_E_BADPTR, "offset %llu of pool %s is not an object",
                        (unsigned long long)off, h->pool->path);
    *off_out = off;
    return NVH_OK;
}

/* link can be a link: an aligned word of the pool outside its metadata. */
static inline __attribute__((always_inline)) int
nvh_check_link(nvh_heap *h, const nvh_off_t *link, uint64_t *off_out)
{
    if (!link) return nvh_fail(NVH_E_INVAL, "link pointer is NULL");
    if (!nvh_contains(h->pool, link, 8) || (uintptr_t)link % 8)
        return nvh_fail(NVH_E_INVAL, "link %p is not an aligned word inside the pool",
                        (const void *)link);
    uint64_t off = nvh_off(h->pool, link);
    if (off < h->pool->sb->header.root_offset || (off >= h->heap_off && off < h->chunks_off))
        return nvh_fail(NVH_E_INVAL, "link at offset %llu lies in pool metadata",
                        (unsigned long long)off);
    *off_out = off;
    return NVH_OK;
}

/* The entry checks nvh_activate and nvh_free share: the pool's writable
 * heap, ptr a possible object (its offset in *off_out), at most
 * NVH_LINKS_MAX links, each an aligned pool word outside the metadata,
 * copied to e[]. free: links is an nvh_link array, each link must point at
 * the object and e[i].value is the value to store; else links is an
 * nvh_off_t * array and e[i].value the link's current value (replay writes
 * a link only if it still holds it). is_free is a constant at both callers:
 * the branches on it fold away. */
static inline __attribute__((always_inline)) nvh_heap *
nvh_op_enter(nvh_pool *pool, bool is_free, void *ptr, const void *links, unsigned nlinks,
             uint64_t *off_out, struct nvh_link_entry *e)
{
    const char *op = is_free ? "nvh_free" : "nvh_activate";
    nvh_heap *h = nvh_heap_of(pool, true);
    if (!h || nvh_check_heap_ptr(h, ptr, off_out) != NVH_OK) return NULL;
    if (nlinks > NVH_LINKS_MAX || (nlinks && !links)) {
        nvh_fail(NVH_E_INVAL, "%s: %u links (at most %u)", op, nlinks, NVH_LINKS_MAX);
        return NULL;
    }
    for (unsigned i = 0; i < nlinks; i++) {
        nvh_off_t *l = is_free ? ((const nvh_link *)links)[i].link : ((nvh_off_t *const *)links)[i];
        if (nvh_check_link(h, l, &e[i].addr) != NVH_OK) return NULL;
        if (is_free) {
            if (*l != *off_out) {
                nvh_fail(NVH_E_INVAL, "%s: link %u does not point at the object", op, i);
                return NULL;
            }
            e[i].value = ((const nvh_link *)links)[i].value;
        } else {
            e[i].value = atomic_load_explicit((_Atomic uint64_t *)l, memory_order_relaxed);
        }
    }
    return h;
}

/* named.c */
struct nvh_named_entry *nvh_named_entry_at(nvh_heap *h, uint32_t slot); /* NULL: no table */
bool nvh_named_table_obj(nvh_heap *h, uint64_t off);   /* an object table's payload? */
void nvh_named_fini(nvh_heap *h);
/* heap open: directory, chains word (the last read-write session had
 * prev_epoch, this one has epoch), table 0, the background build */
int nvh_named_open(nvh_heap *h, bool fresh, uint64_t prev_epoch, uint64_t epoch);
void nvh_named_stop(nvh_heap *h);      /* close: stop the background build   */
/* Tests: while nonzero, background builds wait before each step. */
extern _Atomic unsigned nvh_named_build_hold_;
bool nvh_named_set_has_(nvh_heap *h, uint64_t off);
/* Is the object at off named? (nvh_free refuses named objects.) One load
 * when the pool has no named object; while the index is being built after
 * open (NVH_NAMED_BUILDING in named_n), completes the set first. */
#define NVH_NAMED_BUILDING 0x80000000u
static inline bool nvh_named_has(nvh_heap *h, uint64_t off)
{
    return atomic_load_explicit(&h->named_n, memory_order_acquire) != 0 &&
           nvh_named_set_has_(h, off);
}
void nvh_named_drop_pending(nvh_heap *h, uint64_t off);
const char *nvh_named_pending_name(nvh_heap *h, uint64_t off); /* 56 bytes, NUL padded */

#endif /* NVH_ALLOC_H */
