/* btree.h — internal header of the consistent B+ tree (src/ds/btree*.c).
 *
 * The design is [Moraru11] §6: nodes are append-only (an entry
 * is written into a free slot, never shifted), a value record becomes valid
 * when the leaf entry's pointer to it is written after its data (and the
 * entry's key) is durable, a split
 * builds two new nodes and retires the old one only once the new ones and the
 * parent's pointers are durable, deletes null a pointer. docs/BTREE.md has
 * the full argument; docs/FORMAT.md the on-media layout.
 *
 * Files:
 *   btree.c        open/create/close, variants, lookup, scan, count, stats
 *   btree_write.c  insert/update/delete (persist groups, flush, NT variants)
 *   btree_split.c  structural changes: split, repair of interrupted splits,
 *                  root growth, removal of empty leaves
 *   btree_slab.c   value records carved from tree-owned slabs, slab accounting
 *   btree_index.c  DRAM companions of the nodes (the search index)
 *   btree_check.c  invariant checker, eager reclaim, the wear counter
 */
#ifndef NVH_DS_BTREE_H
#define NVH_DS_BTREE_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nvheap.h"
#include "../common/internal.h"
#include "../pool/pool.h"          /* nvh_pool_hook, embedded in the handle */
#include "../protect/protect.h"

/* ==========================================================================
 * On-media format (all little-endian, fixed width; docs/FORMAT.md)
 * ========================================================================== */
#define BT_MAGIC_TREE 0x45455254424856ull   /* "VHBTREE" */
#define BT_MAGIC_NODE 0x45444f4e424856ull   /* "VHBNODE" */
#define BT_MAGIC_SLAB 0x42414c53424856ull   /* "VHBSLAB" */
#define BT_VERSION 2u                      /* 2: value records in slabs      */
#define BT_NODE_SIZE 1024u
#define BT_NODE_CAP 60u                    /* entries per node                */
#define BT_PENDING 1ull                    /* low bit of a leaf entry's ptr:
                                              record not durable yet          */
/* Slab sizes are powers of two: a large object takes whole 4 KiB blocks and
 * its region header lives in a header chunk (docs/ALLOC.md §1), so four
 * 1 MiB slabs fill a 4 MiB chunk and sixty-four 64 KiB slabs do. */
#define BT_SLAB_SIZE (64u * 1024u)         /* a record slab (one activation) */
#define BT_SLAB_BIG (16u * 1024u)          /* larger records: a slab of their own */
/* Record slabs of a tree whose pool is protected: 16x larger, since each
 * new slab costs two protection changes (a fault or an mprotect of its held
 * window, then the service's protect once it is full: with a populated pool
 * each rewrites the slab's page-table entries and interrupts the inserting
 * CPU for the TLB: many inserts' worth of time; docs/PROTECT.md has the
 * measurements against 256 KiB slabs). The cost: up to
 * 1 MiB of not yet carved slab stays writable while the slab is current. */
#define BT_SLAB_SIZE_HELD (1024u * 1024u)
#define BT_MAX_DEPTH 32                    /* levels (a deeper node is corrupt)    */
#define BT_NODE_BATCH 16u                  /* nodes reserved ahead (bt_node_take) */
/* ... in a protected pool: each batch's fresh pages cost one fault (async)
 * or mprotect (sync): 256 nodes, 64 pages, per protection change (their
 * windows stay open until each node is taken: the exposure of a 1 MiB slab) */
#define BT_NODE_BATCH_HELD 256u

/* The tree header: a named object "nvh.btree.<name>". */
typedef struct bt_header {
    uint64_t magic;          /* BT_MAGIC_TREE                                  */
    uint32_t version;        /* BT_VERSION                                     */
    uint32_t node_size;      /* BT_NODE_SIZE                                   */
    nvh_off_t root;          /* root node; 0 = empty tree (set by activation)  */
    nvh_off_t slabs;         /* newest record slab; 0 = none (activation links) */
    nvh_off_t cur_slab;      /* the slab records were last carved from, for the
                                next session to go on carving (btree_slab.c);
                                0 = none. Set by the slab's activation, cleared
                                by its free                                   */
    uint64_t reserved[3];    /* zero                                           */
} bt_header;
_Static_assert(sizeof(bt_header) == 64, "bt_header is one line");
_Static_assert(offsetof(bt_header, root) == 16, "bt_header.root offset");
_Static_assert(offsetof(bt_header, slabs) == 24, "bt_header.slabs offset");
_Static_assert(offsetof(bt_header, cur_slab) == 32, "bt_header.cur_slab offset");

/* One slot: in a leaf (key, value record), in an inner node (lower bound of
 * the child's key range, child). 16 B, so a slot never straddles a line. */
typedef struct bt_entry {
    uint64_t key;
    nvh_off_t ptr;           /* 0 = free slot                                   */
} bt_entry;
_Static_assert(sizeof(bt_entry) == 16, "bt_entry size");

/* A node: one 64 B header line and BT_NODE_CAP entries. The header is
 * written once, before the node is activated (successor excepted), so the
 * node's lo/hi are the range it was *created* for. */
typedef struct bt_node {
    uint64_t magic;          /* BT_MAGIC_NODE                                  */
    uint32_t level;          /* 0 = leaf                                       */
    uint32_t sorted;         /* volatile sorted variant: entries [0,count) sorted */
    uint64_t lo, hi;         /* key range at creation, inclusive              */
    nvh_off_t successor;     /* replacement node of an interrupted split      */
    uint32_t count;          /* volatile sorted variant only                  */
    uint32_t pad0;
    uint64_t reserved[2];
    bt_entry e[BT_NODE_CAP];
} bt_node;
_Static_assert(sizeof(bt_node) == BT_NODE_SIZE, "bt_node size");
_Static_assert(offsetof(bt_node, successor) == 32, "bt_node.successor offset");
_Static_assert(offsetof(bt_node, e) == 64, "entries start on the second line");

/* A record slab: one allocator object holding many value records, carved
 * by a DRAM bump pointer. Slabs form a list from bt_header.slabs (newest
 * first), pushed by the slab's activation (link = header.slabs, the slab's
 * `next` = the old head) and unlinked by its nvh_free. One activation fence
 * per slab instead of one per record: a record needs no allocator state of
 * its own, because what makes it live is the leaf entry pointing at it, and
 * that pointer is written only after the record is durable ([Moraru11] §6:
 * "valid only when its key is written after its data is durable"). */
typedef struct bt_slab {
    uint64_t magic;          /* BT_MAGIC_SLAB                                  */
    nvh_off_t next;          /* older slab, or 0                                */
    uint64_t size;           /* bytes, header included                          */
    uint64_t fill;           /* no record lies at or past this byte offset: the
                                durable bound of the bump pointer, raised ahead
                                of it by BT_FILL_STEP (btree_slab.c); 0 = unknown */
    uint64_t fill_check;     /* bt_fill_check(slab offset, fill): a fill that
                                does not match is unknown                       */
    nvh_off_t tree;          /* the tree header owning it                       */
    uint64_t reserved[2];    /* zero                                           */
} bt_slab;
_Static_assert(sizeof(bt_slab) == 64, "bt_slab header is one line");
_Static_assert(offsetof(bt_slab, next) == 8, "bt_slab.next offset");
_Static_assert(offsetof(bt_slab, fill) == 24 && offsetof(bt_slab, fill_check) == 32 &&
               offsetof(bt_slab, tree) == 40,
               "bt_slab.fill offsets");
/* How far the durable fill bound runs ahead of the bump pointer: one store
 * and flush of the slab's header line per BT_FILL_STEP bytes of records
 * (~13 inserts of 256 B), and at most this much of the slab is skipped when
 * a process dies without closing the tree. */
#define BT_FILL_STEP 4096u
static inline uint64_t bt_fill_check(nvh_off_t slab, uint64_t fill)
{
    return (fill ^ slab) * 0x9E3779B97F4A7C15ull ^ BT_MAGIC_SLAB;
}

/* A value record, 64 B aligned inside a slab. Written (and made durable)
 * before any leaf entry points at it; never written again. */
typedef struct bt_record {
    uint64_t len;            /* value bytes                                     */
    nvh_off_t slab;          /* the slab holding it (space accounting)          */
    unsigned char data[];
} bt_record;
_Static_assert(sizeof(bt_record) == 16, "bt_record header size");

/* ==========================================================================
 * DRAM state
 * ========================================================================== */
/* An insert whose group action has not run yet. */
typedef struct bt_pending {
    struct nvh_btree *tree;
    bt_entry *entry;         /* slot whose ptr is rec|BT_PENDING               */
    bt_record *rec;
    size_t rsize;            /* record bytes of its write window; 0: it has none
                                of its own (the held slab covers it, bt_rec_new) */
    uint64_t key;
    uint64_t seq;            /* operation number                               */
    int used;
    const struct bt_node *node;  /* the leaf holding entry                    */
    struct bt_idx *ix;       /* its companion when the insert ran (checked
                                against node before use), or NULL          */
    uint64_t vmark;          /* validations flushed before its group began:
                                when its action runs, those are durable    */
    uint64_t vno;            /* its own validation's number (0: not yet)    */
    uint8_t way;             /* protection: the slot page's window-cache way,
                                from the open (the close's hint)           */
} bt_pending;

/* DRAM accounting of one slab: live records. Tracked slabs are always a
 * prefix of the persistent slab list (this session's slabs, which are
 * pushed at its head; all of them after nvh_btree_reclaim counted them), so
 * the predecessor of a tracked slab is tracked too (or is the header). */
typedef struct bt_slabinfo {
    nvh_off_t off;           /* 0 = free entry                                  */
    uint64_t live;           /* records referenced by live leaf entries         */
    int32_t prev, next;      /* DRAM list in persistent-list order (-1 = none)  */
} bt_slabinfo;

/* DRAM companion of an unsorted node (btree_index.c): a cache of its
 * header and used-slot bitmap; for an inner node its used slots' keys
 * sorted (a count over them finds the child) with the children and their
 * companions; for a leaf a one-byte fingerprint per slot (one line to
 * compare) and each used slot's key and record, so that a lookup reads the
 * record and nothing else of the pool (the slot line was a second TLB and
 * cache miss) — but only in a tree without the key directory: with it,
 * lookups find the record in the directory and rarely descend, and the
 * slots (15 lines per leaf, written by every insert) cost inserts more
 * than they saved the few descending lookups (docs/BTREE.md, "Alternatives
 * measured"; 1 M random inserts make ~24.4 k leaves — 24 417
 * splits, nvh_btree_stats — whose companions shrink from ~26 to ~3 MiB,
 * nearer what the cache holds); such a leaf companion is
 * 2 lines and a descent reads the matching slot from the node. Companions
 * are kept exact by every store that changes a slot (bt_ix_add*,
 * bt_ix_del, bt_ix_hint, the insert's validation); a
 * slot whose record word is 0 (unknown) or marked pending is read from the
 * node instead. Companions live in 2 MiB arenas (transparent huge pages
 * where the kernel gives them) and are never returned to malloc while the
 * tree is open: a cached kid.ix is checked against kid.node (a dropped
 * companion has node NULL). */
#define BT_IX_MASK ((1ull << BT_NODE_CAP) - 1)   /* every slot of a companion's used */
typedef struct bt_idx {
    const bt_node *node;     /* the node; NULL while on a free list           */
    uint64_t used;           /* bit j: slot j has ptr != 0                     */
    uint64_t lo, hi;         /* header range                                   */
    nvh_off_t successor;     /* header successor when built                    */
    uint32_t level;
    uint8_t n;               /* inner: used slots in key[]/slot[]              */
    uint8_t slots;           /* leaf: u.lf.s[] kept (a tree without the key
                                directory, BT_IX_LEAF_SIZE); 0: fingerprints
                                only (BT_IX_LEAF_SMALL), the node has the keys */
    uint8_t pad[2];
    struct bt_idx *free_next;    /* free list link                              */
    uint8_t win_way;         /* protection: the window-cache way of the node's
                                page last time (nvh_protect_open_way_)     */
    uint8_t pad1[7];         /* the union starts on the second line          */
    union {
        struct {
            uint8_t fp[64];              /* fingerprint of slot j's key        */
            /* slot j (valid while its used bit is set): key, and its record
             * word: offset (64 B aligned) | lines << 1 | pending, or 0 (not
             * known: read the node). lines = the record's lines, capped at
             * 31 (0: not known), for prefetching; pending = the entry's
             * ptr carries BT_PENDING (validation not seen yet) */
            struct bt_lslot {
                uint64_t key;
                uint64_t rec;
            } s[BT_NODE_CAP];
        } lf;
        struct {
            /* sep[b] = the key at sorted position 8b (UINT64_MAX past n):
             * one line that picks the block of 8 keys to count in, so a
             * search reads 2 lines of keys and compares 15 keys, not 8
             * lines and 60 (bt_ix_lower) */
            uint64_t sep[8];
            /* the used slots' keys, ascending, 8 per block, UINT64_MAX
             * past n; next to them their children and the children's
             * companions (ix NULL = not looked up yet; ix->node != node =
             * dropped since): kid.node is kept exact by every store to the
             * node's child pointers (bt_ix_add/del, bt_ix_relink); the
             * whole array is re-read when gen != the tree's ix_gen (a new
             * companion, or a change whose parent was not known). A block
             * is 3 lines: its keys, then its 8 children. */
            struct bt_iblk {
                uint64_t key[8];
                struct bt_kid {
                    const bt_node *node;
                    struct bt_idx *ix;
                } kid[8];
            } b[8];
            uint8_t slot[64];            /* node slot of sorted position i */
            uint64_t gen;
        } in;
    } u;
} bt_idx;
#define BT_IX_LEAF_SIZE (offsetof(bt_idx, u) + 64 + 16 * BT_NODE_CAP)
#define BT_IX_LEAF_SMALL (offsetof(bt_idx, u) + 64)   /* header and fingerprints */
#define BT_IX_INNER_SIZE ((sizeof(bt_idx) + 63) & ~(size_t)63)
_Static_assert(offsetof(bt_idx, u) == 64, "companion: header line, then fingerprints");
_Static_assert(BT_IX_LEAF_SIZE % 64 == 0 && BT_IX_INNER_SIZE >= BT_IX_LEAF_SIZE, "companion sizes");
_Static_assert(offsetof(bt_idx, u.in.b) == 128 && sizeof(struct bt_iblk) == 192,
               "inner companion: header, separators, then blocks of 3 lines");

/* Sorted position i of an inner companion: its key and its child. */
static inline uint64_t *bt_ixk(bt_idx *x, unsigned i) { return &x->u.in.b[i >> 3].key[i & 7]; }
static inline uint64_t bt_ixk_get(const bt_idx *x, unsigned i) { return x->u.in.b[i >> 3].key[i & 7]; }
static inline struct bt_kid *bt_ixkid(bt_idx *x, unsigned i) { return &x->u.in.b[i >> 3].kid[i & 7]; }

/* Inner companion: number of keys < key (the position of the first key >=
 * key). Branch-free counts over the separator line and then over one
 * block of 8 keys: 15 independent compares on 2 lines (a binary search
 * would wait for one load after another; a count over all 60 keys read 8
 * lines and ran ~400 instructions per lookup). Correct because keys are
 * strictly ascending and padded with UINT64_MAX: every key of a block
 * before b is below sep[b] < key, every key after block b is >= sep[b+1]
 * >= key. */
static inline unsigned bt_ix_lower(const bt_idx *x, uint64_t key)
{
    const uint64_t *s = x->u.in.sep;
    unsigned b = (unsigned)(s[1] < key) + (s[2] < key) + (s[3] < key) + (s[4] < key) +
                 (s[5] < key) + (s[6] < key) + (s[7] < key);
    const uint64_t *k = x->u.in.b[b].key;
    /* the block's children (2 lines) are asked for with its keys */
    __builtin_prefetch(&x->u.in.b[b].kid[0]);
    __builtin_prefetch(&x->u.in.b[b].kid[4]);
    unsigned c = (unsigned)(k[0] < key) + (k[1] < key) + (k[2] < key) + (k[3] < key) +
                 (k[4] < key) + (k[5] < key) + (k[6] < key) + (k[7] < key);
    return 8 * b + c;
}

/* Ask for the lines of companion x that a descent arriving at it will read
 * first, all at once (they would otherwise arrive one miss after another):
 * an inner one's header and separator lines (the block of keys and
 * children those select is asked for as soon as it is known); a leaf's
 * header and fingerprints, and for a reader also its key/record slots
 * where leaf companions have them (`slots`; all 15 slot lines: the
 * matching slot's line is only known once the
 * fingerprints arrived; measured ~12% faster lookups than header and
 * fingerprints only, while writers, which rarely need a slot line, were
 * ~6% faster without them). */
static inline void bt_ix_prefetch(const bt_idx *x, int leaf, int for_write, int slots)
{
    const char *c = (const char *)x;
    __builtin_prefetch(c);
    __builtin_prefetch(c + 64);
    if (leaf && !for_write && slots)
        for (unsigned o = 128; o < BT_IX_LEAF_SIZE; o += 64) __builtin_prefetch(c + o);
}

/* A slot of the companion table: the node address is kept next to the
 * pointer so that a probe never touches a companion it does not want. */
typedef struct bt_ixslot {
    const bt_node *node;     /* NULL = empty                                   */
    bt_idx *x;
} bt_ixslot;

/* The key directory: a DRAM hash table key -> record word (the leaf
 * companions' format, without the pending bit) of live entries (validated,
 * or this session's pending inserts, which lookups see as well),
 * in front of the tree for lookups (one cache miss instead of a descent
 * through the companions, and a lookup short enough for the core to
 * overlap consecutive ones). A cache like the companions: filled lazily
 * (validations, and lookups that had to descend), kept exact by every
 * store that changes a live entry's record (update, delete); a key it
 * does not hold is looked up in the tree. Splits and repairs move entries
 * between nodes but never change a key's record, so they leave it alone. */
#define BT_KD_BUF 32u               /* inserts' directory entries applied together */
/* The directory's life: IDLE until the first lookup (writes skip it: a tree
 * that is only written pays nothing for it; bulk loads are ~10-20 % faster),
 * then BUILDING — every lookup also adds the live entries of the next
 * BT_KD_BUILD_LEAVES leaves in key order (bounded work per lookup, no pause:
 * ~10 us; 1 M keys take ~5 k lookups) while writes maintain it as usual —
 * then READY (complete; writes keep it exact). A tree with the directory off
 * (option, or sorted nodes) is READY from the start. */
enum { BT_KD_IDLE = 0, BT_KD_BUILDING = 1, BT_KD_READY = 2 };
#define BT_KD_BUILD_LEAVES 8u
typedef struct bt_kslot {
    uint64_t key;
    uint64_t rec;            /* record word; 0 = empty slot                    */
} bt_kslot;
static inline uint64_t bt_kd_hash(uint64_t key)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
}
/* Record word of a record of rsize bytes at offset off (64 B aligned), or
 * 0 if off cannot be one. */
static inline uint64_t bt_rec_word(nvh_off_t off, size_t rsize)
{
    uint64_t lines = (rsize + 63) / 64;
    if (!off || (off & 63)) return 0;
    return off | (lines > 31 ? 31 : lines) << 1;
}
static inline uint8_t bt_fp(uint64_t key) { return (uint8_t)((key * 0x9E3779B97F4A7C15ull) >> 56); }

/* Wear counter: open-addressing map line address -> stores. */
typedef struct bt_wear {
    uint64_t *keys;          /* line address, 0 = empty                        */
    uint64_t *counts;
    uint64_t cap, used;
} bt_wear;

struct nvh_btree {
    nvh_pool *pool;          /* NULL for the volatile variant                  */
    nvh_pool_hook hook;      /* registered with the pool while open (key: hdr) */
    pthread_t owner;         /* the thread that opened it (not thread-safe)    */
    char name[41];           /* for messages                                   */
    bool readonly;           /* the pool is open read-only                     */
    nvh_btree_durability durability;
    uintptr_t base;          /* pool base, or 0 (volatile: offsets = addresses) */
    bt_header *hdr;          /* volatile variant: a malloc'd header            */
    nvh_btree_mode mode;
    int sorted;
    int kd_off;                  /* no key directory (option no_key_directory):
                                    then leaf companions keep key/record
                                    slots too (bt_idx.slots) */
    nvh_group_ctx *group;
    bt_pending *pend;        /* ring of pending inserts                        */
    unsigned pend_cap, pend_used, pend_next;
    unsigned pend_valid;     /* the oldest pend_valid of them are validated
                                (flushed, not known durable yet: acked by a
                                later insert's action or at sync)          */
    uint64_t vdone;          /* validations flushed so far                   */
    uint64_t ops;            /* modifying operations issued                    */
    uint64_t durable;        /* every op <= this is durable                    */
    nvh_btree_durable_fn durable_fn;
    void *durable_arg;
    int deferred_err;        /* error of an action (reported by sync)          */
    int64_t count;           /* live keys, -1 = unknown (not counted yet)      */
    unsigned fault;          /* BT_FAULT_* bits: deliberately broken (tests)   */
    /* record slabs (persistent modes) */
    bt_slab *slab;           /* current slab (bump allocation), or NULL        */
    int32_t slab_idx;        /* its bt_slabinfo index                          */
    uint64_t slab_used;      /* bytes carved from it, header included          */
    uint64_t slab_fill;      /* its durable fill bound (bt_slab.fill)          */
    bool rec_win;                /* the last bt_rec_new opened a record window */
    nvh_protect_hold slab_hold;  /* protected pool: a write window over the whole
                                    current slab, open while it is current  */
    /* nodes reserved ahead (persistent modes), each with its write window
     * already open (btree.c, bt_node_take) */
    void *nres[BT_NODE_BATCH_HELD];
    unsigned nres_head, nres_n;  /* next to hand out, reserved in all        */
    uint64_t nres_epoch;         /* protection epoch their windows were opened in */
    bt_slabinfo *si;         /* tracked slabs                                  */
    uint32_t si_cap, si_used;
    int32_t si_head, si_freelist;
    int32_t *si_hash;        /* open addressing: slab offset -> index, -1 empty */
    uint32_t si_hash_cap;
    /* node companions (btree_index.c) */
    struct bt_ixslot *ix_tab;    /* open addressing: node -> companion      */
    uint32_t ix_cap, ix_used;
    uint64_t ix_gen;             /* advances when child pointers changed
                                    without their parent's companion known */
    bt_idx *ix_free;             /* free inner-size companions              */
    bt_idx *ix_free_leaf;        /* free leaf-size companions               */
    bt_idx *ix_root;             /* the root's companion if known (lookups:
                                    checked against the root, as kid.ix)  */
    /* key directory (btree_index.c): open addressing key -> record word */
    int kd_state;                /* BT_KD_IDLE / BUILDING / READY            */
    uint64_t kd_cursor;          /* BUILDING: leaves below this key are in   */
    struct bt_kslot *kd_tab;     /* NULL until the first entry               */
    uint64_t kd_cap, kd_used;    /* slots (power of two), used slots         */
    struct bt_kslot kd_buf[BT_KD_BUF];  /* inserts' keys not in the table yet */
    unsigned kd_nbuf;
    char *ix_bump, *ix_end;      /* the current arena's unused part         */
    void **ix_arenas;            /* every arena (freed at close)            */
    uint32_t ix_narenas, ix_arenas_cap;
    nvh_btree_stats stats;
    bt_wear *wear;
};

/* ==========================================================================
 * Helpers shared by the files
 * ========================================================================== */
/* The record word of key, or 0 if the directory does not hold it. */
void bt_kd_apply(struct nvh_btree *t);
static inline uint64_t bt_kd_get(struct nvh_btree *t, uint64_t key)
{
    if (t->kd_nbuf) bt_kd_apply(t);
    if (!t->kd_tab) return 0;
    uint64_t mask = t->kd_cap - 1;
    for (uint64_t h = bt_kd_hash(key) & mask;; h = (h + 1) & mask) {
        const bt_kslot *e = &t->kd_tab[h];
        if (!e->rec) return 0;
        if (e->key == key) return e->rec;
    }
}

static inline void *bt_ptr(const struct nvh_btree *t, nvh_off_t off)
{
    return off ? (void *)(t->base + (uintptr_t)off) : NULL;
}
static inline nvh_off_t bt_off(const struct nvh_btree *t, const void *p)
{
    return p ? (nvh_off_t)((uintptr_t)p - t->base) : 0;
}
static inline int bt_persistent(const struct nvh_btree *t) { return t->mode != NVH_BTREE_VOLATILE; }

/* A tree is used by the thread that opened it (its handle is not
 * thread-safe); any other thread gets NVH_E_BUSY saying so. */
int bt_thread_error(const struct nvh_btree *t);
static inline int bt_check_thread(const struct nvh_btree *t)
{
    if (__builtin_expect(pthread_equal(t->owner, pthread_self()) != 0, 1)) return NVH_OK;
    return bt_thread_error(t);
}
/* Writes: NVH_E_READONLY on a read-only pool, else the thread check. */
int bt_check_write(const struct nvh_btree *t);
/* Adopt the slab an earlier session carved records from last (open), and
 * make the current slab's fill bound exact (close). */
void bt_slab_adopt(struct nvh_btree *t);
void bt_slab_close(struct nvh_btree *t);
/* ==========================================================================
 * Validation of what is read from the pool (docs/BTREE.md, "Corruption")
 * ==========================================================================
 * Every node and record offset a reader follows comes from the media, so a
 * damaged pool can hold any value there. Readers follow an offset only once
 * these say it can be what it claims: inside the pool, 64 B aligned, and for
 * a node its magic and a level below BT_MAX_DEPTH (a child must be exactly
 * one level below its parent, so descents and walks are bounded and cannot
 * cycle); for a record its whole value inside the pool. A companion
 * (btree_index.c) is built only for a node that passed, so cached children
 * are checked once, when their companion is made. The volatile variant
 * (offsets are DRAM addresses) is trusted. */
/* The pool's mapped size (nvh_contains' bound), read without a call. */
static inline uint64_t bt_pool_size(const nvh_pool *pool)
{
    return atomic_load_explicit(&((const nvh_persist_ctx_ *)(const void *)pool)->size,
                                memory_order_relaxed);
}
static inline int bt_node_ok(const struct nvh_btree *t, const bt_node *n)
{
    if (!t->pool) return n != NULL;
    return n && ((uintptr_t)n & 63) == 0 && nvh_contains(t->pool, n, sizeof *n) &&
           n->magic == BT_MAGIC_NODE && n->level < BT_MAX_DEPTH;
}
static inline int bt_rec_ok(const struct nvh_btree *t, const bt_record *r)
{
    if (!t->pool) return r != NULL;
    /* on lookups' hot path: offsets and one branch (r->len is a cache miss
     * the caller would wait for anyway; no short-circuit branch on it) */
    uint64_t size = bt_pool_size(t->pool);
    uint64_t off = (uint64_t)((uintptr_t)r - t->base);
    if (size < sizeof *r || off > size - sizeof *r || (off & 63) || !r) return 0;
    return r->len <= size - sizeof *r - off;
}
/* Record NVH_E_CORRUPT naming the tree structure and its offset. */
int bt_corrupt(const struct nvh_btree *t, const void *where, const char *what);

/* Ask for every line of a node at once: a linear scan of 16 lines would
 * otherwise wait for the lines one after another (the node is usually not
 * in the cache: random keys, a tree larger than the LLC). */
static inline void bt_prefetch_node(const void *n)
{
    for (unsigned i = 0; i < BT_NODE_SIZE; i += 64) __builtin_prefetch((const char *)n + i);
}

/* Count stores to node memory (Fig. 5). */
void bt_wear_note(struct nvh_btree *t, const void *addr, size_t len);
static inline void bt_note(struct nvh_btree *t, const void *addr, size_t len)
{
    if (__builtin_expect(t->wear != NULL, 0)) bt_wear_note(t, addr, len);
}

/* Pre-fault fresh pool memory the tree is about to fill (a record slab, a
 * batch of nodes) in one call instead of one page fault per 4 KiB page on
 * the insert path: nvh_pool_populate_fresh_ (pool.h says when it is
 * skipped). Defined in btree.c. */
void bt_prefault(struct nvh_btree *t, const void *p, size_t len);

static inline void bt_flush(struct nvh_btree *t, const void *p, size_t len)
{
    if (t->pool) nvh_flush(t->pool, p, len);
}
static inline void bt_drain(struct nvh_btree *t)
{
    if (t->pool) nvh_drain(t->pool);
}

/* Write windows of the protection layer ([Moraru11] §6: unprotect the node or
 * record before the update, protect it again once the update is durable).
 * One load and a branch when the pool is not protected. */
static inline void bt_wopen(struct nvh_btree *t, const void *p, size_t len)
{
    if (t->pool) nvh_protect_open_(t->pool, p, len);
}
static inline void bt_wclose(struct nvh_btree *t, const void *p, size_t len)
{
    if (t->pool) nvh_protect_close_(t->pool, p, len);
}
/* The same with a way hint (nvh_protect_open_way_): for the leaf slots,
 * opened and closed on the same hot pages again and again. */
static inline void bt_wopen_way(struct nvh_btree *t, const void *p, size_t len, uint8_t *way)
{
    if (t->pool) nvh_protect_open_way_(t->pool, p, len, way);
}
static inline void bt_wclose_way(struct nvh_btree *t, const void *p, size_t len, uint8_t *way)
{
    if (t->pool) nvh_protect_close_way_(t->pool, p, len, way);
}

/* Is this leaf entry (its ptr carrying BT_PENDING) pending in THIS session
 * (record reserved, action not run yet)? Leftovers of a crash are not. The
 * entry's address is compared, not only the pointer value: the space of a
 * leftover's never-activated record is free and may have been reserved
 * again, so a leftover and a live pending slot can hold the same value. */
int bt_pending_has(const struct nvh_btree *t, const bt_entry *e);

/* Value record of a leaf entry if the entry is live, else NULL (free, or a
 * crash leftover whose record never became durable). */
bt_record *bt_entry_record(const struct nvh_btree *t, const bt_entry *e);

/* A position on a root-to-node path: the node, its effective key range, the
 * parent entry that points at it (NULL for the root: then the link is
 * &hdr->root). */
typedef struct bt_path {
    bt_node *node;
    uint64_t lo, hi;
    bt_entry *link;
    bt_idx *ix;              /* the node's companion if known, else NULL       */
    bt_node *parent;         /* the node holding link, if known (NULL: root,
                                or not known: see bt_ix_relink)               */
} bt_path;

/* Effective range of child entry i of node n whose range is [lo, hi]. */
void bt_child_range(const bt_node *n, uint64_t lo, uint64_t hi, unsigned i,
                    uint64_t *clo, uint64_t *chi);
/* One pass over unsorted inner node n (range [lo,hi]): the child covering
 * key (or -1) and, in *chi, the upper end of its range. */
static inline int bt_child_scan(const bt_node *n, uint64_t lo, uint64_t hi, uint64_t key,
                                uint64_t *chi)
{
    int best = -1;
    uint64_t best_key = 0, next = hi;
    if (n->successor == 0 && n->lo >= lo && n->hi <= hi) {
        /* Not stale (the common case): every valid entry lies in [lo, hi],
         * so the scan needs no range test. Keys of valid entries are
         * distinct, so ">=" picks the largest key <= key. */
        for (unsigned j = 0; j < BT_NODE_CAP; j++) {
            uint64_t k = n->e[j].key;
            if (!n->e[j].ptr) continue;
            if (k <= key) {
                if (k >= best_key) { best = (int)j; best_key = k; }
            } else if (k - 1 < next) {
                next = k - 1;
            }
        }
        *chi = next;
        return best;
    }
    for (unsigned j = 0; j < BT_NODE_CAP; j++) {
        uint64_t k = n->e[j].key;
        if (!n->e[j].ptr || k < lo || k > hi) continue;
        if (k <= key) {
            if (best < 0 || k > best_key) { best = (int)j; best_key = k; }
        } else if (k - 1 < next) {
            next = k - 1;
        }
    }
    *chi = next;
    return best;
}
/* Index of the child of inner node n (range [lo,hi]) covering key, or -1. */
int bt_child_for(const bt_node *n, uint64_t lo, uint64_t hi, uint64_t key);

/* Durability bookkeeping (btree.c): every op <= seq is durable; op seq is
 * durable and nothing is pending. */
void bt_set_durable_(struct nvh_btree *t, uint64_t seq);
void bt_ack_(struct nvh_btree *t, uint64_t seq);
/* Acknowledge the validated inserts whose validation number is <= mark
 * (their validation is known durable), oldest first. */
void bt_ack_upto(struct nvh_btree *t, uint64_t mark);
/* After a group sync: every validation is flushed; one fence makes them
 * durable and every insert is acknowledged. */
void bt_ack_validated(struct nvh_btree *t);

/* Allocation of node memory in the tree's variant. bt_new_node (split.c)
 * opens the new node's write window; bt_activate closes it (the node is
 * durable then), bt_cancel too. Link words get windows of their own. */
void *bt_reserve(struct nvh_btree *t, size_t size);
/* A reserved node (BT_NODE_SIZE) with its write window open (close it with
 * bt_wclose once durable, as bt_activate does, or give it back with
 * bt_cancel). Persistent modes hand out nodes reserved BT_NODE_BATCH at a
 * time, their windows opened together (btree.c explains why). */
void *bt_node_take(struct nvh_btree *t);
void bt_cancel(struct nvh_btree *t, void *p);
/* Make a reserved object durable and set links (activation), or just store
 * the links (volatile). */
int bt_activate(struct nvh_btree *t, void *p, nvh_off_t *const links[], unsigned n);
/* Free an object and update links (nvh_free), or free() + stores. */
int bt_free(struct nvh_btree *t, void *p, const nvh_link *links, unsigned n);

/* Value records (btree_slab.c). Persistent modes carve them from slabs
 * (the record's write window is open on return: close it with bt_wclose
 * once it is durable); the volatile variant mallocs them. */
bt_record *bt_rec_new(struct nvh_btree *t, size_t len);
/* A record no live leaf entry references any more (deleted, replaced, or a
 * failed insert): its slab's live count falls, an empty slab that is not the
 * current one is freed (after the group context is settled). */
int bt_rec_release(struct nvh_btree *t, bt_record *r);
/* Count the live records of every slab from scratch (nvh_btree_reclaim):
 * forget the tracking, track every slab of the list, then bt_slab_count()
 * each live entry and bt_slab_free_empty(). */
int bt_slab_recount_begin(struct nvh_btree *t);
void bt_slab_count(struct nvh_btree *t, const bt_record *r);
int bt_slab_free_empty(struct nvh_btree *t);
/* Is r a record inside a slab of this tree's list (checker)? */
int bt_slab_check_record(struct nvh_btree *t, const bt_record *r);
void bt_slab_fini(struct nvh_btree *t);

/* Node companions (btree_index.c). bt_ix: the companion of an unsorted
 * node, built if needed (NULL: sorted variant, or out of memory — callers
 * then scan the node). */
bt_idx *bt_ix_find(const struct nvh_btree *t, const bt_node *n);
bt_idx *bt_ix_build(struct nvh_btree *t, const bt_node *n);
static inline bt_idx *bt_ix(struct nvh_btree *t, const bt_node *n)
{
    if (t->sorted) return NULL;
    bt_idx *x = bt_ix_find(t, n);
    return x ? x : bt_ix_build(t, n);
}
void bt_ix_drop(struct nvh_btree *t, const bt_node *n);
void bt_ix_add(struct nvh_btree *t, const bt_node *n, unsigned slot, uint64_t key);
void bt_ix_del(struct nvh_btree *t, const bt_node *n, unsigned slot);
/* bt_ix_add for a leaf slot whose entry now holds (key, ptr) with ptr the
 * offset of a record of rsize bytes (PENDING bit allowed), with the leaf's
 * companion if the caller has it (x: used only if it is still n's). No
 * read of the entry or the record. Returns the companion (or NULL). */
bt_idx *bt_ix_add_leaf(struct nvh_btree *t, bt_idx *x, const bt_node *n, unsigned slot,
                       uint64_t key, nvh_off_t ptr, size_t rsize);
/* The leaf entry of pending insert pd was validated (ptr without PENDING). */
void bt_ix_validated(const bt_pending *pd);
void bt_ix_fini(struct nvh_btree *t);
/* Leaf companion: bitmap of the used slots whose fingerprint matches key. */
uint64_t bt_ix_match(const bt_idx *x, uint64_t key);

/* key's live entry is validated and points at the record of word w (0:
 * forget the key). */
void bt_kd_set(struct nvh_btree *t, uint64_t key, uint64_t w);
/* The same for a key an insert just made live, deferred: inserts' entries
 * are buffered and applied BT_KD_BUF at a time (bt_kd_apply: every target
 * line asked for first, so that their misses overlap; one at a time, each
 * insert paid a cache miss of its own, ~150 ns). Every other directory
 * operation applies the buffer first. */
static inline void bt_kd_add(struct nvh_btree *t, uint64_t key, uint64_t w)
{
    if (t->sorted || t->kd_off || t->kd_state == BT_KD_IDLE) return;
    t->kd_buf[t->kd_nbuf].key = key;
    t->kd_buf[t->kd_nbuf].rec = w;
    if (++t->kd_nbuf == BT_KD_BUF) bt_kd_apply(t);
}
void bt_kd_del(struct nvh_btree *t, uint64_t key);
void bt_kd_fini(struct nvh_btree *t);
/* Room for `keys` entries at the load factor, allocated at once (the build
 * knows the count: no rehash while it runs). Failure is fine: kd_set grows. */
void bt_kd_reserve(struct nvh_btree *t, uint64_t keys);

/* Free leaf slot i of n that holds a never-validated entry (a crash leftover
 * or a reclaimed insert): null its pointer durably-ordered (flushed, noted
 * for the group) inside its write window, and drop it from the DRAM index. */
static inline void bt_entry_clear(struct nvh_btree *t, const bt_node *n, unsigned i)
{
    bt_entry *e = (bt_entry *)&n->e[i];
    bt_wopen(t, e, sizeof *e);
    e->ptr = 0;
    bt_note(t, e, sizeof *e);
    bt_flush(t, e, sizeof *e);
    bt_wclose(t, e, sizeof *e);
    bt_ix_del(t, n, i);
}
/* The child pointer at p->link now points at `child` (a split, repair or
 * rebuild replaced the node): update the parent's companion (p->parent), or
 * if the parent is not known invalidate every cached child (ix_gen). */
void bt_ix_relink(struct nvh_btree *t, const bt_path *p, const bt_node *child);
/* Refresh the companion's record word of leaf slot `slot` from the
 * entry's pointer (the record was just written: its length is read from
 * the cache). */
void bt_ix_hint(struct nvh_btree *t, const bt_node *n, unsigned slot);
/* Re-read the children of inner companion x (its gen is old). */
void bt_ix_refresh_kids(const struct nvh_btree *t, bt_idx *x);
/* A free slot from the used bitmap (highest or lowest), or -1. */
int bt_ix_free_slot(const bt_idx *x, int highest);
/* Is the node of companion x stale on path position p (interrupted split,
 * or header range narrower than the effective one)? */
static inline int bt_ix_stale(const bt_idx *x, const bt_path *p)
{
    return x->successor != 0 || x->hi != p->hi || x->lo < p->lo;
}

/* Structural changes (btree_split.c). Each may call nvh_group_sync first. */
/* Descend to the leaf for key, repairing interrupted splits and splitting
 * full nodes on the way when `for_write`. Fills path[0..depth]. Returns the
 * depth (index of the leaf in path) or a negative error. */
int bt_descend(struct nvh_btree *t, uint64_t key, int for_write, bt_path *path, int max);
/* Remove an empty, non-leftmost leaf at path[depth]. */
int bt_remove_leaf(struct nvh_btree *t, bt_path *path, int depth);
/* Repair a node whose split was interrupted (successor or stale range). */
int bt_repair(struct nvh_btree *t, bt_path *p);
/* Is the node at p stale (interrupted split)? */
int bt_stale(const bt_path *p);
/* Free records of in-range entries that were never validated. */
int bt_reclaim_leaf(struct nvh_btree *t, bt_path *p);


/* Deliberate bugs for the crash checker's negative controls
 * (nvh_btree_debug_fault_, tests/btree/test_btree_crash.c): the crash test
 * must catch each of them. Never set otherwise. */
#define BT_FAULT_VALIDATE_EARLY 1u   /* insert: slot points at the record in the
                                        record's own group (validation before
                                        the data is durable)                 */
#define BT_FAULT_NODE_UNFLUSHED 2u   /* split: new nodes activated unflushed  */
#define BT_FAULT_ACK_EARLY 4u        /* insert: acknowledged at its validation,
                                        before a fence made it durable       */
#define BT_FAULT_KD_SKIP_LEAF 8u     /* the key directory's build skips every
                                        other leaf (test_btree_basic's
                                        directory_build must catch it)       */
#define BT_FAULT_NO_VALIDATION_FENCE 16u /* durable insert: returns before its
                                        validation is fenced (acked too early) */
void nvh_btree_debug_fault_(nvh_btree *t, unsigned faults);

#endif /* NVH_DS_BTREE_H */
