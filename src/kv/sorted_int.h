/* sorted_int.h — internal to the sorted engine (src/kv/sorted*.c): the
 * on-media structures (with static_asserts), the DRAM state (leaf
 * companions with their locks, the copy-on-write inner index) and the helpers the
 * files share. Design and crash/concurrency arguments: docs/KV-SORTED.md;
 * byte layouts: docs/FORMAT.md ("Sorted key-value tree"). */
#ifndef NVH_KV_SORTED_INT_H
#define NVH_KV_SORTED_INT_H

#include "sorted.h"
#include "../common/internal.h"
#include "../protect/protect.h"
#include "../pool/pool.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Limits
 * ========================================================================== */
#define KVS_KEY_MAX 4096u
#define KVS_VALUE_MAX ((uint64_t)64 << 20)

/* ==========================================================================
 * On-media format (all little-endian, fixed width, explicit padding)
 * ========================================================================== */
#define KVS_HDR_MAGIC 0x4853564bu   /* "KVSH" */
#define KVS_LEAF_MAGIC 0x4c53564bu  /* "KVSL" */
#define KVS_REC_MAGIC 0x5253564bu   /* "KVSR": kvs_rec16 */
#define KVS_REC8_MAGIC 0x3852u      /* "R8": kvs_rec8 */
#define KVS_SLAB_MAGIC 0x4253564bu  /* "KVSB" */
#define KVS_VERSION 1u              /* leaves, slabs; the header of a tree
                                       whose records are all allocator objects */
#define KVS_HDR_VERSION_SLABS 2u    /* header: records may live in slabs
                                       (hdr->slabs); a library that reads only
                                       version 1 refuses the tree            */
#define KVS_HDR_VERSION_REC8 3u     /* header: carved records may have the
                                       8-byte header (kvs_rec8); a library
                                       that reads only versions 1-2 refuses
                                       the tree                              */

#define KVS_CAP 32u                 /* slots per leaf                         */
#define KVS_GEN_LOG2 6u             /* iterators' retire-count stripes: 64    */
#define KVS_GEN_STRIPES (1u << KVS_GEN_LOG2)
#define KVS_PENDING 60u             /* deferred record frees in the header    */

/* Order the tree was built with (header `order`): set by the first open. */
#define KVS_ORDER_UNSET 0u
#define KVS_ORDER_BYTES 1u
#define KVS_ORDER_CUSTOM 2u

/* A record freed once no reader can hold it: `rec` is the record (the link
 * word the allocator clears when it frees it: failure-atomic, no leak),
 * `slot` the offset of the slot word that referenced it (diagnostics only:
 * the two words may tear). The build after open frees `rec` only if no
 * live slot references it (the operation that queued it completed). */
typedef struct kvs_pfree {
    uint64_t rec;
    uint64_t slot;
} kvs_pfree;

/* The tree's root object: what kv_sorted_create stores into *link. */
typedef struct kvs_hdr {
    uint32_t magic;                 /* KVS_HDR_MAGIC                         */
    uint16_t version;               /* KVS_VERSION                           */
    uint16_t order;                 /* KVS_ORDER_*                           */
    uint64_t first;                 /* first leaf in key order (0: empty)    */
    uint64_t slabs;                 /* newest record slab (0: none; a
                                       version-1 header has 0 here)           */
    uint64_t reserved[5];
    kvs_pfree pend[KVS_PENDING];    /* records waiting for their free        */
} kvs_hdr;
static_assert(sizeof(kvs_hdr) == 1024, "kvs_hdr size");
static_assert(offsetof(kvs_hdr, first) == 8, "kvs_hdr.first");
static_assert(offsetof(kvs_hdr, slabs) == 16, "kvs_hdr.slabs");
static_assert(offsetof(kvs_hdr, pend) == 64, "kvs_hdr.pend");

/* A record slab (sorted_slab.c): one allocator object from which records
 * are carved by a DRAM bump pointer, 64 B aligned, from offset 64 on. What
 * makes a record in it live is a slot naming it, written after the record
 * is durable; so a record costs no allocator activation, and a crash leaves
 * at worst records no slot names (garbage inside a slab). Slabs form a list
 * from kvs_hdr.slabs, newest first, pushed by the slab's activation (link
 * hdr->slabs, the slab's `next` written before). Space inside a slab is
 * never reused; a slab is freed whole (unlinked by its free) once no slot
 * names a record in it. */
typedef struct kvs_slab {
    uint32_t magic;                 /* KVS_SLAB_MAGIC                        */
    uint16_t version;               /* KVS_VERSION                           */
    uint16_t pad;
    uint64_t tree;                  /* offset of the kvs_hdr                 */
    uint64_t next;                  /* older slab (0: last)                  */
    uint64_t size;                  /* bytes, this header included           */
    uint64_t reserved[4];
} kvs_slab;
static_assert(sizeof(kvs_slab) == 64, "kvs_slab is one line");
static_assert(offsetof(kvs_slab, next) == 16 && offsetof(kvs_slab, size) == 24, "kvs_slab");

/* Slot rec values: below 64 the slot is free (0: never used; 1 or 2: a
 * removed entry), otherwise the offset of a durable record (records are 64 B
 * aligned). A removal writes a free value different from the one the slot
 * held before its record's activation: the allocator's recovery re-applies
 * an activation's link while the word still holds the activation's old
 * value (docs/ALLOC.md §4, A-B-A caveat), so writing that value back would
 * resurrect the removed entry after a crash. */
static inline bool kvs_slot_free(uint64_t rec) { return rec < 64; }
static inline uint64_t kvs_tomb_after(uint8_t was) { return was == 1 ? 2 : 1; }

typedef struct kvs_slot {
    uint64_t rec;                   /* record offset (the validation word)   */
    uint64_t prefix;                /* first 8 key bytes, big-endian, 0-pad  */
    uint32_t hash;                  /* kvs_hash(key)                         */
    uint32_t klen;                  /* key length                            */
} kvs_slot;
static_assert(sizeof(kvs_slot) == 24, "kvs_slot size");

typedef struct kvs_leaf {
    uint32_t magic;                 /* KVS_LEAF_MAGIC                        */
    uint16_t version;               /* KVS_VERSION                           */
    uint16_t cap;                   /* KVS_CAP                               */
    uint64_t tree;                  /* offset of the kvs_hdr                 */
    uint64_t next;                  /* next leaf in key order (0: last)      */
    uint64_t left;                  /* split in progress: the new lower half */
    uint64_t split_of;              /* upper half of a split of that leaf,
                                       until the split completes (written by
                                       the four-step split of format 3's first
                                       library; read for recovery only)      */
    uint64_t moved_from;            /* this leaf was split off that leaf: while
                                       the two are neighbours in the chain and
                                       that leaf's split_tag is moved_tag,
                                       records both hold belong here (the
                                       source's tombstones may not be durable
                                       yet). A hint: never cleared           */
    uint64_t moved_tag;             /* the source's split_tag at the split   */
    uint64_t split_tag;             /* random, nonzero, new at each split of
                                       this leaf (0: never split). A hint
                                       whose tag differs is stale: the source
                                       split again, or its space is another
                                       leaf now                               */
    kvs_slot slot[KVS_CAP];         /* unsorted: append in node              */
} kvs_leaf;
static_assert(offsetof(kvs_leaf, next) == 16, "kvs_leaf.next");
static_assert(offsetof(kvs_leaf, moved_from) == 40, "kvs_leaf.moved_from");
static_assert(offsetof(kvs_leaf, split_tag) == 56, "kvs_leaf.split_tag");

/* Does leaf n's moved_from hint hold for leaf src at offset src_off? */
static inline bool kvs_moved_of(const kvs_leaf *n, const kvs_leaf *src, uint64_t src_off)
{
    return n->moved_from == src_off && n->moved_tag != 0 && n->moved_tag == src->split_tag;
}
static_assert(offsetof(kvs_leaf, slot) == 64, "kvs_leaf.slot");
static_assert(sizeof(kvs_leaf) == 64 + 24 * KVS_CAP, "kvs_leaf size");

/* Records come in two layouts, told apart by their first bytes (a record
 * is 64 B aligned and never changes once a slot names it):
 *  - kvs_rec16: magic KVS_REC_MAGIC (32 bits), a 16-byte header: every
 *    record of a tree of version 1 or 2, and allocator-object records
 *    (larger than a slab takes) of any version;
 *  - kvs_rec8: magic KVS_REC8_MAGIC (16 bits), an 8-byte header: what this
 *    library carves from slabs, only into trees of version 3 (the first
 *    slab of a session raises the version, durable before any slot names a
 *    record in it; KVS_HDR_VERSION_REC8). With 16-byte keys and 100-byte
 *    values a record takes 2 lines instead of 3.
 * kvs_rec is only ever a pointer to either: read it through its view
 * (kvs_rv, kvs_rec_view). */
typedef struct kvs_rec kvs_rec;

typedef struct kvs_rec16 {
    uint32_t magic;                 /* KVS_REC_MAGIC                         */
    uint32_t klen;                  /* 1..KVS_KEY_MAX                        */
    uint64_t vlen;                  /* 0..KVS_VALUE_MAX                      */
    uint8_t data[];                 /* key, then value                       */
} kvs_rec16;
static_assert(sizeof(kvs_rec16) == 16, "kvs_rec16 size");

typedef struct kvs_rec8 {
    uint16_t magic;                 /* KVS_REC8_MAGIC                        */
    uint16_t klen;                  /* 1..KVS_KEY_MAX                        */
    uint32_t vlen;                  /* 0..KVS_VALUE_MAX (carved: far less)   */
    uint8_t data[];                 /* key, then value                       */
} kvs_rec8;
static_assert(sizeof(kvs_rec8) == 8, "kvs_rec8 size");
static_assert(offsetof(kvs_rec8, klen) == 2 && offsetof(kvs_rec8, vlen) == 4, "kvs_rec8");
/* the 16-bit magic differs from the low half of the 32-bit one */
static_assert((KVS_REC_MAGIC & 0xffffu) != KVS_REC8_MAGIC, "record magics");

/* ==========================================================================
 * DRAM state
 * ========================================================================== */
/* A separator: an immutable DRAM copy of a key (the lower bound of a leaf's
 * range), owned by the leaf companion that entered the index with it. */
typedef struct kvs_skey {
    uint64_t prefix;
    uint32_t len;
    uint32_t refs;                  /* writers: the companion holding it and
                                       the entries of the current index       */
    uint8_t b[];
} kvs_skey;

/* A companion's summaries of one slot besides its fingerprint and record
 * word: what writers keep (the key prefix, so that splits order a leaf
 * without reading its records) and readers read (hash). */
typedef struct kvs_wslot {
    uint64_t pfx;                   /* the key's first 8 bytes, big-endian   */
    uint32_t hash;                  /* atomic: kvs_hash(key)                 */
    uint16_t klen;                  /* atomic: key length                    */
    uint8_t was;                    /* under lock: a free slot's free value, a
                                       live slot's before its record's
                                       activation (kvs_tomb_after)            */
    uint8_t pad;
} kvs_wslot;
static_assert(sizeof(kvs_wslot) == 16, "kvs_wslot: 4 per line");

/* DRAM companion of a persistent leaf: what readers search (they never read
 * persistent leaves, so a split may change or free a leaf at once). rec[]
 * words are published with release stores after the summary words of their
 * slot (fingerprint, hash, length). Readers order entries by their records,
 * which lookups and scans read anyway; writers keep key prefixes too (pfx),
 * so that keeping the cached order and splitting read no record. 64-byte
 * aligned (kvs_cleaf_new): a lookup reads line 0 (fingerprints, dead), the
 * rec[] word of each slot whose fingerprint matches, and its record. */
typedef struct kvs_cleaf {
    /* line 0: what every lookup reads */
    uint64_t fp[KVS_CAP / 8];       /* atomic: byte i (kvs_fp_at) is slot i's
                                       key fingerprint (kvs_fp); meaningless
                                       for a free slot                        */
    uint32_t dead;                  /* atomic: replaced or removed (set under
                                       lock, after the replacement is public) */
    uint32_t ver;                   /* atomic seqlock: odd while a writer adds
                                       or removes an entry (DRAM stores only,
                                       never across a flush)                  */
    struct kvs_cleaf *next;         /* key order (atomic: readers' scans)     */
    kvs_leaf *p;                    /* the persistent leaf                    */
    kvs_skey *sep;                  /* lower bound it entered the index with
                                       (NULL: the first leaf)                 */
    /* lines 1-4 */
    uint64_t rec[KVS_CAP];          /* atomic                                 */
    /* line 5: the writer's lock, and the cached order */
    struct kvs_cleaf *prev;         /* key order (atomic: iterator steps back) */
    uint32_t lock;                  /* atomic: the leaf's writer lock         */
    uint32_t live;                  /* live slots (under lock)                */
    /* Readers' cache of the live slots in key order, so a scan or seek does
     * not sort the leaf on every visit: perm holds slot numbers (byte i of
     * the array: the i-th live slot), valid for the seqlock value in ptag
     * (kvs_ptag_*). Any reader that sorted a leaf may fill it; fillers
     * exclude each other by swapping ptag to KVS_PTAG_BUSY, and readers
     * check ptag before and after reading perm (a seqlock of its own). An
     * insert voids it (a reader sorts the leaf once again); a removal
     * carries it over. */
    uint64_t ptag;                  /* atomic                                 */
    uint64_t perm[KVS_CAP / 8];     /* atomic words                           */
    uint64_t pad5;
    /* lines 6-13: each slot's other summaries, one 16-byte group per slot,
     * so an insert writes one line of them */
    kvs_wslot w[KVS_CAP];
} kvs_cleaf;
static_assert(offsetof(kvs_cleaf, rec) == 64, "kvs_cleaf: line 0, then rec[] on lines 1-4");
static_assert(offsetof(kvs_cleaf, perm) + sizeof(uint64_t) * (KVS_CAP / 8) <= 6 * 64 &&
                  offsetof(kvs_cleaf, w) == 6 * 64, "kvs_cleaf: the lock and cache on line 5");
/* The lines a lookup may read: asked for at once when the index yields
 * the companion (their misses overlap). */
#define KVS_CLEAF_LOOKUP_LINES 5u

/* A zeroed companion, 64-byte aligned (free() releases it); NULL if out of
 * memory. */
static inline kvs_cleaf *kvs_cleaf_new(void)
{
    size_t sz = (sizeof(kvs_cleaf) + 63) & ~(size_t)63;
    kvs_cleaf *c = aligned_alloc(64, sz);
    if (c) memset(c, 0, sz);
    return c;
}

/* A key's one-byte fingerprint (from its hash: no second pass over the
 * key). A lookup compares the key only in slots whose fingerprint matches:
 * one in 256 of the others, on average. */
static inline uint8_t kvs_fp(uint32_t kh) { return (uint8_t)(kh >> 24); }
static inline uint8_t kvs_fp_at(const kvs_cleaf *c, unsigned i)
{
    return (uint8_t)(__atomic_load_n(&c->fp[i / 8], __ATOMIC_RELAXED) >> (8 * (i % 8)));
}
/* Writers (under the leaf lock, before the release store of c->rec[i]). */
static inline void kvs_fp_set(kvs_cleaf *c, unsigned i, uint32_t kh)
{
    uint64_t *w = &c->fp[i / 8];
    unsigned sh = 8 * (i % 8);
    uint64_t x = __atomic_load_n(w, __ATOMIC_RELAXED);
    x = (x & ~((uint64_t)0xff << sh)) | ((uint64_t)kvs_fp(kh) << sh);
    __atomic_store_n(w, x, __ATOMIC_RELAXED);
}

/* ptag: bit 40 set when valid, live-slot count in bits 32-39, the leaf's
 * version (kvs_cleaf.ver) in bits 0-31; 0: nothing cached. */
#define KVS_PTAG_BUSY UINT64_MAX
static inline uint64_t kvs_ptag_make(uint32_t ver, unsigned n)
{
    return (UINT64_C(1) << 40) | ((uint64_t)n << 32) | ver;
}
static inline bool kvs_ptag_valid_for(uint64_t tag, uint32_t ver)
{
    return tag != KVS_PTAG_BUSY && (tag >> 40) == 1 && (uint32_t)tag == ver;
}

/* Inner index node (DRAM, copy-on-write: never changed once published).
 * child[i] covers [sep[i], sep[i+1]); sep[0] is unused (the bound comes
 * from the parent). level 0: children are leaf companions. */
#define KVS_FAN 64
typedef struct kvs_inode {
    uint32_t n;
    uint32_t level;
    uint64_t pfx[KVS_FAN];
    kvs_skey *sep[KVS_FAN];
    void *child[KVS_FAN];
} kvs_inode;
#define KVS_DEPTH_MAX 16

/* Retired DRAM objects (index nodes, separators, companions), freed once no
 * reader can hold them (common/epoch.c: stamped at the retire). Records are
 * not retired here: the allocator holds freed space back from readers. */
enum { KVS_R_MEM, KVS_R_CLEAF, KVS_R_INODE };
typedef struct kvs_retired {
    uint64_t epoch;
    void *p;
    uint32_t kind;
} kvs_retired;

/* What a split leaves to a later fence (sorted_write.c, kvs_split_insert):
 * the tombstones of the slots it moved out of the split leaf (bit i of
 * lines: line i of leaf, flushed but not fenced) and the clear of the
 * queue entry that held the new record while the split was in flight
 * (hdr->pend[pend], kept in use until that clear is durable). Whoever
 * fences next re-flushes the lines another thread flushed, so they are
 * durable before any write that could depend on them (a write to either
 * half, a further split, a drop). */
#define KVS_OWED 16
typedef struct kvs_owed {
    kvs_leaf *leaf;
    uint32_t lines;
    uint32_t pend;
    uint64_t tid;                   /* kvs_tid() of the thread that flushed  */
    uint64_t id;                    /* increasing: what a fence covered      */
} kvs_owed;

/* DRAM accounting of one record slab (sorted_slab.c), under t->slab_lock. */
typedef struct kvs_slabi {
    uint64_t off, end;              /* the slab: [off, end) of the pool      */
    int64_t live;                   /* slots naming its records; while it is
                                       a carver's current slab, minus what
                                       that carver carved (added at retire)  */
    struct kvs_slabi *newer, *older;/* the persistent list's order          */
    struct kvs_slabi *qnext;        /* queued for its free                   */
    uint32_t cur;                   /* a carver's current slab               */
    uint32_t queued;                /* empty: waiting for its free           */
} kvs_slabi;

/* A bump allocator over one slab. Writers pick one by thread (kvs_tid),
 * so concurrent writers rarely share one; the lock is held to carve, and
 * across the activation of a slab it made (kvs_carve.fresh). */
#define KVS_CARVERS 8
typedef struct kvs_carver {
    _Alignas(64) uint32_t lock;
    kvs_slabi *si;                  /* current slab (NULL: none)             */
    char *base;                     /* its memory                            */
    uint64_t used, size;            /* bytes carved (header included), size  */
    int64_t carved;                 /* records carved from it                */
    uint64_t next_size;             /* size of the next slab it makes        */
} kvs_carver;

/* A record being written: from a slab (si) or an allocator object. */
typedef struct kvs_carve {
    kvs_carver *cv;                 /* locked while fresh is set             */
    void *fresh;                    /* a slab reserved for this record,
                                       activated after the data fence (the
                                       carver and slab_mu held till then)     */
    kvs_slabi *si;                  /* the record's slab (NULL: allocator)   */
} kvs_carve;

struct kv_sorted {
    nvh_pool *pool;
    kvs_hdr *hdr;
    nvh_off_t hdr_off;
    kv_cmp_fn cmp;                  /* NULL: bytewise                         */
    void *cmp_arg;
    bool readonly;

    /* Writers lock the companion of the leaf they change (kvs_cleaf.lock);
     * smo serialises what changes the chain or the index (splits, leaf
     * drops, the first leaf), the lazy build and the retired list. Lock
     * order: a leaf, then smo; never two leaves. */
    pthread_mutex_t smo;
    uint32_t built;                 /* atomic: index built                    */
    kvs_inode *root;                /* atomic (acquire/release); under smo    */
    /* atomic, under smo: companions retired, striped by their address
     * (kvs_gen_of): an iterator trusts a companion it kept while its
     * stripe's count is unchanged, whatever other leaves do */
    uint64_t cgen[KVS_GEN_STRIPES];
    kvs_cleaf *head;                /* first companion (smo)                  */
    kvs_retired *ret;               /* smo                                    */
    size_t nret, capret;
    /* Companions whose readers have all left, kept for the next splits
     * (smo): a split needs two, and aligned_alloc of one costs as much as
     * the rest of the split's DRAM work. Linked by next; at most
     * KVS_CSPARE. */
    kvs_cleaf *cspare;
    uint32_t ncspare;
    /* Index nodes likewise, for the path copies of splits (smo): linked
     * through their first word; at most KVS_CSPARE. */
    void *ispare;
    uint32_t nispare;

    _Alignas(64) uint64_t count;    /* atomic: live entries once built        */
    /* Key and value bytes (nvh_kv_stats): writers add their changes since
     * the open (same line as count, which they write anyway); the first
     * kv_sorted_bytes after an open walks the entries once, with writers
     * kept out, and sets the base (base + change = the total from then) */
    int64_t dkbytes, dvbytes;       /* atomic                                 */
    int64_t kbase, vbase;
    uint32_t bytes_known;           /* atomic                                 */
    /* hdr->pend[j] in use (atomic bitmaps): taken by the writer that queues
     * a record; ready once the record is unlinked: the next writer's data
     * fence frees it (kvs_data_fence) */
    _Alignas(64) uint64_t pend_used;
    uint64_t pend_ready;
    /* Splits' stores that ride on later fences (kvs_owed, sorted_write.c),
     * under the spin lock owed_lock */
    _Alignas(64) uint32_t owed_lock;
    uint32_t nowed;                 /* atomic: entries in owed[]             */
    uint64_t owed_id;               /* last id handed out                    */
    uint64_t tag_rng;               /* smo: state of the split tags' PRNG    */
    kvs_owed owed[KVS_OWED];

    /* Record slabs (sorted_slab.c). slab_mu serialises the changes of the
     * persistent slab list (an activation, a free: held across their
     * fence); slab_lock, a spin lock never held across a fence, guards the
     * DRAM table, the queue and every kvs_slabi (the DRAM list changes
     * under both). Order: a carver's lock, slab_mu, slab_lock. */
    pthread_mutex_t slab_mu;
    _Alignas(64) uint32_t slab_lock;
    uint32_t slab_acts;             /* a record activation named a slot word
                                       since the rings were last retired     */
    kvs_slabi *slab_newest;         /* = hdr->slabs                          */
    kvs_slabi **sl;                 /* by offset (range lookups)             */
    size_t nsl, capsl;
    kvs_slabi *sq;                  /* empty slabs owed their free           */
    uint32_t nsq;                   /* atomic: entries in sq                 */
    uint64_t slab_rec_max;          /* larger records are allocator objects
                                       (0: all, as a version-1 tree's)       */
    uint64_t slab_max;              /* largest slab a carver makes           */
    int rec16;                      /* tests: carve 16-byte record headers,
                                       tree version 2 (kv_sorted_set_rec16_) */
    kvs_carver carv[KVS_CARVERS];
};

/* ==========================================================================
 * Keys
 * ========================================================================== */
static inline uint64_t kvs_prefix(const void *k, size_t kl)
{
    if (kl >= 8) {
        uint64_t v;
        memcpy(&v, k, 8);
        return __builtin_bswap64(v);
    }
    uint8_t b[8] = {0};
    memcpy(b, k, kl < 8 ? kl : 8);
    uint64_t v;
    memcpy(&v, b, 8);
    return __builtin_bswap64(v);
}

static inline uint32_t kvs_hash(const void *k, size_t kl)
{
    const uint8_t *p = k;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (kl * 0xff51afd7ed558ccdull);
    size_t i = 0;
    for (; i + 8 <= kl; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = nvh_mix64(h ^ w);
    }
    if (i < kl) {
        uint64_t w = 0;
        memcpy(&w, p + i, kl - i);
        h = nvh_mix64(h ^ w ^ 0x5bd1e995u);
    }
    return (uint32_t)(h >> 32);
}

/* Equal keys of kl bytes (short keys without a call: two overlapping
 * words cover 8..16 bytes). */
static inline bool kvs_key_eq(const void *a, const void *b, size_t kl)
{
    if (kl >= 8 && kl <= 16) {
        uint64_t a0, a1, b0, b1;
        memcpy(&a0, a, 8);
        memcpy(&b0, b, 8);
        memcpy(&a1, (const uint8_t *)a + kl - 8, 8);
        memcpy(&b1, (const uint8_t *)b + kl - 8, 8);
        return ((a0 ^ b0) | (a1 ^ b1)) == 0;
    }
    return memcmp(a, b, kl) == 0;
}

static inline int kvs_bytes_cmp(const void *a, size_t al, const void *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

static inline int kvs_cmp(const kv_sorted *t, const void *a, size_t al, const void *b, size_t bl)
{
    if (t->cmp) return t->cmp(a, al, b, bl, t->cmp_arg);
    return kvs_bytes_cmp(a, al, b, bl);
}

/* Bytewise comparison by summaries alone, or 2 if the full keys decide. */
static inline int kvs_sum_cmp(uint64_t pa, size_t la, uint64_t pb, size_t lb)
{
    if (pa != pb) return pa < pb ? -1 : 1;
    if (la <= 8 && lb <= 8) return la < lb ? -1 : la > lb;
    return 2;
}

/* ==========================================================================
 * Records
 * ==========================================================================
 * A record is decoded once, where it is validated (kvs_rec_view_in): the
 * view says where its key and value are and how long, so that the code
 * that compares, copies or emits it does not test the header's layout
 * again at every field. */
typedef struct kvs_rv {
    const uint8_t *key;             /* NULL: not read                        */
    const uint8_t *val;
    uint64_t vlen;
    uint32_t klen;
} kvs_rv;

/* Has the record the 8-byte header (else the 16-byte one)? */
static inline bool kvs_rec_is8(const kvs_rec *r)
{
    return ((const kvs_rec8 *)(const void *)r)->magic == KVS_REC8_MAGIC;
}

/* A record offset from a slot, validated before anything follows it: inside
 * the pool, aligned, its magic and lengths sane; *v its view. false if not. */
static inline bool kvs_rec_view_in(const kv_sorted *t, uint64_t off, uint64_t size, kvs_rv *v)
{
    if (off == 0 || (off & 63) || size < sizeof(kvs_rec16) || off > size - sizeof(kvs_rec16))
        return false;
    const uint8_t *p = nvh_ptr(t->pool, off);
    uint64_t kl, vl, h;
    if (kvs_rec_is8((const kvs_rec *)(const void *)p)) {
        const kvs_rec8 *r = (const void *)p;
        kl = r->klen;
        vl = r->vlen;
        h = sizeof *r;
    } else {
        const kvs_rec16 *r = (const void *)p;
        if (r->magic != KVS_REC_MAGIC) return false;
        kl = r->klen;
        vl = r->vlen;
        h = sizeof *r;
    }
    if (kl == 0 || kl > KVS_KEY_MAX || vl > KVS_VALUE_MAX || h + kl + vl > size - off) return false;
    v->key = p + h;
    v->val = p + h + kl;
    v->vlen = vl;
    v->klen = (uint32_t)kl;
    return true;
}
/* The same, for callers that read the pool's size once for many records
 * (the size only grows). */
static inline bool kvs_rec_view(const kv_sorted *t, uint64_t off, kvs_rv *v)
{
    return kvs_rec_view_in(t, off, nvh_pool_size(t->pool), v);
}
/* Bytes record off (viewed as v) takes, its header included. */
static inline uint64_t kvs_rv_bytes(const kv_sorted *t, uint64_t off, const kvs_rv *v)
{
    return (uint64_t)(v->key - (const uint8_t *)nvh_ptr(t->pool, off)) + v->klen + v->vlen;
}

/* A leaf offset read from the pool, validated (NULL if not a leaf of t). */
static inline kvs_leaf *kvs_leaf_get(const kv_sorted *t, uint64_t off)
{
    uint64_t size = nvh_pool_size(t->pool);
    if (off == 0 || (off & 63) || size < sizeof(kvs_leaf) || off > size - sizeof(kvs_leaf))
        return NULL;
    kvs_leaf *l = nvh_ptr(t->pool, off);
    if (l->magic != KVS_LEAF_MAGIC || l->version != KVS_VERSION || l->cap != KVS_CAP ||
        l->tree != t->hdr_off)
        return NULL;
    return l;
}

/* Ask for the first `lines` cache lines of p at once (their misses overlap
 * instead of following one another). */
static inline void kvs_prefetch(const void *p, unsigned lines)
{
#pragma GCC unroll 16
    for (unsigned i = 0; i < lines; i++) __builtin_prefetch((const char *)p + 64 * i);
}

/* NVH_E_CORRUPT naming the structure and its offset. */
int kvs_corrupt(const kv_sorted *t, uint64_t off, const char *what);

/* ==========================================================================
 * Atomics (the fields marked atomic above)
 * ========================================================================== */
/* The retire count of companion c's stripe (kv_sorted.cgen): by address,
 * so a companion freed and another allocated at its address share it. */
static inline uint64_t *kvs_gen_of(kv_sorted *t, const void *c)
{
    uint64_t a = (uint64_t)(uintptr_t)c >> 6;
    return &t->cgen[(a * UINT64_C(0x9e3779b97f4a7c15)) >> (64 - KVS_GEN_LOG2)];
}

#define KVS_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define KVS_LOADR(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define KVS_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define KVS_STORER(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* ==========================================================================
 * Epochs and locks (sorted.c)
 * ==========================================================================
 * Readers (and writers while they descend) run inside nvh_epoch_enter_ /
 * nvh_epoch_exit_ (common/epoch.c). */
/* Queue a DRAM object freed once every reader that could hold it has left
 * (under smo). */
int kvs_retire(kv_sorted *t, uint32_t kind, void *p);
/* Free what no reader can hold any more; wait: until the list is empty
 * (under smo). */
void kvs_reclaim(kv_sorted *t, int wait);
void kvs_cleaf_free(kvs_cleaf *c);
/* A zeroed companion (under smo): a spare one, else a new one; NULL if out
 * of memory. */
kvs_cleaf *kvs_cleaf_take(kv_sorted *t);
#define KVS_CSPARE 64u
/* An index node's memory (under smo): a spare one, else malloc'd; its
 * contents undefined. NULL if out of memory. */
kvs_inode *kvs_inode_take(kv_sorted *t);

static inline void kvs_spin_lock(uint32_t *l)
{
    for (unsigned n = 0;; n++) {
        if (!__atomic_load_n(l, __ATOMIC_RELAXED) && !__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
            return;
        /* the holder may be between its fences, or preempted on a busy
         * machine: spin briefly, then give the core away */
        if (n >= 64) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else __builtin_ia32_pause();
#endif
    }
}
static inline void kvs_spin_unlock(uint32_t *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }
static inline void kvs_lock(kvs_cleaf *c) { kvs_spin_lock(&c->lock); }
static inline void kvs_unlock(kvs_cleaf *c) { kvs_spin_unlock(&c->lock); }

/* Writers (under the leaf lock) around the DRAM stores that add or remove
 * an entry of c: readers that sort a leaf (seek, scan) retry when it moved
 * under them (else a key removed from one slot and put back into a later
 * one, which another writer's insert made the first free one, would be read
 * twice). */
/* No fences: the entry's record word is stored with release after the odd
 * version (so a reader that sees the new word sees the odd version or a
 * later one), and readers load the record words with acquire before they
 * load the version again (so that load is not done earlier). */
static inline void kvs_ver_begin(kvs_cleaf *c)
{
    __atomic_store_n(&c->ver, c->ver + 1, __ATOMIC_RELAXED);
}
static inline void kvs_ver_end(kvs_cleaf *c)
{
    __atomic_store_n(&c->ver, c->ver + 1, __ATOMIC_RELEASE);
}

/* Writers (under the leaf lock, between kvs_ver_begin and kvs_ver_end):
 * carry c's cached key order over the entry added in slot add and/or
 * removed from slot del (-1: none), so readers need not sort the leaf
 * again; drops the cache if it cannot, and voids a tag naming another
 * version. */
void kvs_perm_change(const kv_sorted *t, kvs_cleaf *c, int add, int del);

/* Writers: entries' key and value bytes changed by dk, dv. */
static inline void kvs_bytes_add(kv_sorted *t, int64_t dk, int64_t dv)
{
    if (dk) __atomic_add_fetch(&t->dkbytes, dk, __ATOMIC_RELAXED);
    if (dv) __atomic_add_fetch(&t->dvbytes, dv, __ATOMIC_RELAXED);
}

/* Build the DRAM state (index, companions) on first use; repairs
 * interrupted splits and queued frees when the pool is writable. */
int kvs_ensure_built(kv_sorted *t);

/* ==========================================================================
 * Index (sorted_index.c)
 * ========================================================================== */
kvs_skey *kvs_skey_new(const void *k, size_t kl);
/* Leaf companion covering key k (prefix kp); *lo = its lower bound in the
 * snapshot (NULL: leftmost). */
kvs_cleaf *kvs_ix_find(const kv_sorted *t, const kvs_inode *root, const void *k, size_t kl,
                       uint64_t kp, const kvs_skey **lo);
/* Companion covering the keys just below separator s (NULL if s is the
 * leftmost bound), with its own lower bound. */
kvs_cleaf *kvs_ix_below(const kv_sorted *t, const kvs_inode *root, const kvs_skey *s,
                        const kvs_skey **lo);
kvs_cleaf *kvs_ix_first(const kvs_inode *root);
kvs_cleaf *kvs_ix_last(const kvs_inode *root, const kvs_skey **lo);
/* Bulk build from companions in key order (seps[0] ignored). */
kvs_inode *kvs_ix_build(kvs_cleaf **leaves, size_t n);
/* Writers: replace leaf companion `old` by a, and add b (lower bound sb)
 * right after it (b NULL: only replace). Publishes a new root. */
int kvs_ix_replace(kv_sorted *t, kvs_cleaf *old, kvs_cleaf *a, kvs_cleaf *b, kvs_skey *sb);
/* Writers: drop leaf companion c (it must not be the only one). */
int kvs_ix_remove(kv_sorted *t, kvs_cleaf *c);
/* Free a whole index (close; no readers). */
void kvs_ix_free(kv_sorted *t, kvs_inode *n);
/* Drop a reference to a separator; retired (or freed at once: now) at 0. */
void kvs_skey_unref(kv_sorted *t, kvs_skey *s, int now);

/* A live entry of a leaf, with its record's view (validated) once read. */
typedef struct kvs_ent {
    uint64_t rec;
    uint64_t prefix;
    uint32_t hash, klen;
    kvs_rv v;                       /* v.key NULL: the record not read yet   */
    uint32_t slot;                  /* its slot in the leaf                   */
} kvs_ent;
/* The live entries of companion c in key order (readers: check c->dead
 * afterwards). Returns NVH_OK or NVH_E_CORRUPT. */
int kvs_leaf_sorted(const kv_sorted *t, const kvs_cleaf *c, kvs_ent *out, unsigned *n);
/* Bytewise order only: the live entries of c (record words recs[], as the
 * caller loaded them) sorted by the companion's summaries (prefix, length),
 * records read only where keys of over 8 bytes share their prefix; e->v.key
 * NULL unless read. Readers check c's version afterwards (the summaries
 * match the record words while it has not moved). */
int kvs_sum_sort(const kv_sorted *t, const kvs_cleaf *c, const uint64_t *recs, kvs_ent *e,
                 unsigned *n);
/* e's record, read (and validated) on first use: its view, NULL (and *err
 * set) if corrupt. */
static inline const kvs_rv *kvs_ent_rec(const kv_sorted *t, kvs_ent *e, int *err)
{
    if (e->v.key) return &e->v;
    if (kvs_rec_view(t, e->rec, &e->v)) return &e->v;
    e->v.key = NULL;
    *err = kvs_corrupt(t, e->rec, "record");
    return NULL;
}
int kvs_ent_cmp(const kv_sorted *t, const kvs_ent *a, const kvs_ent *b);

/* ==========================================================================
 * Leaf search
 * ========================================================================== */
/* Slots of c whose fingerprint is f: bit i set for slot i. Exact byte
 * matches per fingerprint word (no false positives from the bit trick:
 * each byte's high bit is tested apart from the carry of the others). */
static inline uint32_t kvs_fp_match(const kvs_cleaf *c, uint8_t f)
{
    const uint64_t lo7 = UINT64_C(0x7f7f7f7f7f7f7f7f), ones = UINT64_C(0x0101010101010101);
    uint32_t m = 0;
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x = KVS_LOADR(&c->fp[w]) ^ (ones * f);
        uint64_t z = ~(((x & lo7) + lo7) | x | lo7);     /* 0x80 where a byte is 0 */
        /* gather the 8 high bits into one byte (bit j: byte j) */
        uint64_t b = ((z >> 7) * UINT64_C(0x0102040810204080)) >> 56;
        m |= (uint32_t)b << (8 * w);
    }
    return m;
}

/* Record lines a lookup asks for at once (header, key, the value's start). */
#define KVS_REC_LOOKUP_LINES 2u

/* Leaf search: slot of key k in companion c, or -1 (readers and writers);
 * *rec and *v: its record and the record's view. Inline: the view stays in
 * registers for the caller that emits or replaces the record. */
static inline int kvs_leaf_find(const kv_sorted *t, const kvs_cleaf *c, const void *k, size_t kl,
                  uint32_t kh, uint64_t *rec, kvs_rv *v, int *err)
{
    /* bytewise: only the slots whose fingerprint matches, then the key in
     * their record (read anyway for the value: checking the slot's hash
     * first would cost a line of the companion on every lookup to save a
     * record read on one in ~8); a custom comparator decides equality
     * itself, so every slot is a candidate */
    uint32_t m = t->cmp ? UINT32_MAX : kvs_fp_match(c, kvs_fp(kh));
    uint64_t size = nvh_pool_size(t->pool);
    for (; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        uint64_t r = KVS_LOAD(&c->rec[i]);
        if (kvs_slot_free(r)) continue;
        /* the record's first lines at once: its header and key decide, and
         * the caller reads the value next */
        if (r < size) kvs_prefetch(nvh_ptr(t->pool, r), KVS_REC_LOOKUP_LINES);
        if (!kvs_rec_view_in(t, r, size, v)) {
            *err = kvs_corrupt(t, r, "record");
            return -1;
        }
        if (t->cmp ? kvs_cmp(t, k, kl, v->key, v->klen) == 0
                   : (v->klen == kl && kvs_key_eq(v->key, k, kl))) {
            *rec = r;
            return (int)i;
        }
    }
    return -1;
}

/* ==========================================================================
 * Write path (sorted_write.c)
 * ========================================================================== */
/* Apply the queued frees found in the header at the build (under smo): bit
 * j of live set if pend[j]'s record is referenced by a live slot. */
int kvs_pending_recover(kv_sorted *t, uint64_t live);
/* Free every queued record still owed its free, and make the stores
 * splits owe durable (close, destroy). */
int kvs_pend_flush(kv_sorted *t);
/* Make the stores splits owe durable (kvs_owed). */
void kvs_owed_settle(kv_sorted *t);
/* This thread's small number (1, 2, ...). */
uint64_t kvs_tid(void);

/* ==========================================================================
 * Record slabs (sorted_slab.c)
 * ========================================================================== */
#define KVS_SLAB_MIN 1024u          /* a carver's first slab; each next one
                                       twice as large, up to slab_max        */
#define KVS_SLAB_MAX (256u * 1024u)
#define KVS_SLAB_REC_MAX (16u * 1024u) /* larger records: allocator objects */
/* Memory for a record of `size` bytes (64 B multiple) from this thread's
 * carver: *cr says where from; NULL with the error set. If cr->fresh is
 * set the carver stays locked until kvs_slab_activate or kvs_slab_abort. */
void *kvs_slab_carve(kv_sorted *t, size_t size, kvs_carve *cr);
/* After the data fence of a record carved from a fresh slab: activates the
 * slab (a fence), before any slot may name the record. */
int kvs_slab_activate(kv_sorted *t, kvs_carve *cr);
/* A carved record that no slot will name (a failed write). */
void kvs_slab_abort(kv_sorted *t, kvs_carve *cr);
/* The slab holding record rec, NULL if rec is an allocator object. Stays
 * valid while a durable slot names rec. */
kvs_slabi *kvs_slab_of(kv_sorted *t, uint64_t rec);
/* No durable slot names that record of si any more. */
void kvs_slab_release(kv_sorted *t, kvs_slabi *si);
/* Free one empty slab (a fence) if one is owed: 1, 0 if none, < 0 error. */
int kvs_slab_free_one(kv_sorted *t);
/* Build: read the slab list (writable pools); count each live record;
 * then free the slabs nobody references. */
int kvs_slab_load(kv_sorted *t);
void kvs_slab_count(kv_sorted *t, uint64_t rec);
int kvs_slab_loaded(kv_sorted *t);
/* Close: drop the DRAM state. Destroy: free every slab. */
void kvs_slab_fini(kv_sorted *t);
int kvs_slab_destroy(kv_sorted *t);
/* Check: every live record of a slab lies in a listed slab, and the counts
 * match (counts[i]: live records found in t->sl[i]). */
int kvs_slab_check(kv_sorted *t, const uint64_t *counts);
/* Index into t->sl of the slab holding rec, -1 if none (no lock). */
long kvs_slab_find(const kv_sorted *t, uint64_t rec);

#endif /* NVH_KV_SORTED_INT_H */
