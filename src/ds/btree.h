/* btree.h — internal header of the consistent B+ tree (src/ds/btree*.c).
 *
 * The design is seed 000 §6 (Moraru et al.): nodes are append-only (an entry
 * is written into a free slot, never shifted), a value record becomes valid
 * when its key is written into its header after its data is durable, a split
 * builds two new nodes and retires the old one only once the new ones and the
 * parent's pointers are durable, deletes null a pointer. docs/BTREE.md has
 * the full argument; docs/FORMAT.md the on-media layout.
 *
 * Files:
 *   btree.c        open/create/close, variants, lookup, scan, count, stats
 *   btree_write.c  insert/update/delete (persist groups, flush, NT variants)
 *   btree_split.c  structural changes: split, repair of interrupted splits,
 *                  root growth, removal of empty leaves
 *   btree_check.c  invariant checker and the wear (writes per line) counter
 */
#ifndef NVH_DS_BTREE_H
#define NVH_DS_BTREE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "nvheap.h"

/* ==========================================================================
 * On-media format (all little-endian, fixed width; docs/FORMAT.md)
 * ========================================================================== */
#define BT_MAGIC_TREE 0x45455254424856ull   /* "VHBTREE" */
#define BT_MAGIC_NODE 0x45444f4e424856ull   /* "VHBNODE" */
#define BT_VERSION 1u
#define BT_NODE_SIZE 1024u
#define BT_NODE_CAP 60u                    /* entries per node                */
#define BT_PENDING 1ull                    /* low bit of a leaf entry's ptr:
                                              record not activated yet        */

/* The tree header: a named object "nvh.btree.<name>". */
typedef struct bt_header {
    uint64_t magic;          /* BT_MAGIC_TREE                                  */
    uint32_t version;        /* BT_VERSION                                     */
    uint32_t node_size;      /* BT_NODE_SIZE                                   */
    nvh_off_t root;          /* root node; 0 = empty tree (set by activation)  */
    uint64_t reserved[5];    /* zero                                           */
} bt_header;
_Static_assert(sizeof(bt_header) == 64, "bt_header is one line");
_Static_assert(offsetof(bt_header, root) == 16, "bt_header.root offset");

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

/* A value record (its own allocation). Valid iff vkey == the leaf entry's
 * key; vkey is written (by a group action) only after the rest is durable. */
typedef struct bt_record {
    uint64_t vkey;           /* validation key; ~key until validated           */
    nvh_off_t next;          /* newer version of an interrupted update, or 0   */
    uint64_t len;            /* value bytes                                     */
    uint64_t pad0;
    unsigned char data[];
} bt_record;
_Static_assert(sizeof(bt_record) == 32, "bt_record header size");

/* ==========================================================================
 * DRAM state
 * ========================================================================== */
/* An insert whose group action has not run yet. */
typedef struct bt_pending {
    struct nvh_btree *tree;
    bt_entry *entry;         /* slot whose ptr is rec|BT_PENDING               */
    bt_record *rec;
    uint64_t key;
    uint64_t seq;            /* operation number                               */
    int used;
} bt_pending;

/* Wear counter: open-addressing map line address -> stores. */
typedef struct bt_wear {
    uint64_t *keys;          /* line address, 0 = empty                        */
    uint64_t *counts;
    uint64_t cap, used;
} bt_wear;

struct nvh_btree {
    nvh_pool *pool;          /* NULL for the volatile variant                  */
    uintptr_t base;          /* pool base, or 0 (volatile: offsets = addresses) */
    bt_header *hdr;          /* volatile variant: a malloc'd header            */
    nvh_btree_mode mode;
    int sorted;
    nvh_group_ctx *group;
    bt_pending *pend;        /* ring of pending inserts                        */
    unsigned pend_cap, pend_used, pend_next;
    uint64_t ops;            /* modifying operations issued                    */
    uint64_t durable;        /* every op <= this is durable                    */
    nvh_btree_durable_fn durable_fn;
    void *durable_arg;
    int deferred_err;        /* error of an action (reported by sync)          */
    int64_t count;           /* live keys, -1 = unknown (not counted yet)      */
    nvh_btree_stats stats;
    bt_wear *wear;
};

/* ==========================================================================
 * Helpers shared by the files
 * ========================================================================== */
static inline void *bt_ptr(const struct nvh_btree *t, nvh_off_t off)
{
    return off ? (void *)(t->base + (uintptr_t)off) : NULL;
}
static inline nvh_off_t bt_off(const struct nvh_btree *t, const void *p)
{
    return p ? (nvh_off_t)((uintptr_t)p - t->base) : 0;
}
static inline int bt_persistent(const struct nvh_btree *t) { return t->mode != NVH_BTREE_VOLATILE; }

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

static inline void bt_flush(struct nvh_btree *t, const void *p, size_t len)
{
    if (t->pool) nvh_flush(t->pool, p, len);
}
static inline void bt_drain(struct nvh_btree *t)
{
    if (t->pool) nvh_drain(t->pool);
}

/* Is this leaf entry (its ptr carrying BT_PENDING) pending in THIS session
 * (record reserved, action not run yet)? Leftovers of a crash are not. The
 * entry's address is compared, not only the pointer value: the space of a
 * leftover's never-activated record is free and may have been reserved
 * again, so a leftover and a live pending slot can hold the same value. */
int bt_pending_has(const struct nvh_btree *t, const bt_entry *e);

/* Value record of a leaf entry if the entry is live, else NULL. Follows the
 * `next` link of an interrupted update. */
bt_record *bt_entry_record(const struct nvh_btree *t, const bt_entry *e);

/* A position on a root-to-node path: the node, its effective key range, the
 * parent entry that points at it (NULL for the root: then the link is
 * &hdr->root). */
typedef struct bt_path {
    bt_node *node;
    uint64_t lo, hi;
    bt_entry *link;
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

/* Durability bookkeeping (btree.c): op seq is durable if nothing is pending;
 * the action of the chained "ack" group of an insert. */
void bt_ack_(struct nvh_btree *t, uint64_t seq);
nvh_group_action bt_ack_fn_(void);

/* Allocation of node/record memory in the tree's variant. */
void *bt_reserve(struct nvh_btree *t, size_t size);
void bt_cancel(struct nvh_btree *t, void *p);
/* Make a reserved object durable and set links (activation), or just store
 * the links (volatile). */
int bt_activate(struct nvh_btree *t, void *p, nvh_off_t *const links[], unsigned n);
/* Free an object and update links (nvh_free), or free() + stores. */
int bt_free(struct nvh_btree *t, void *p, const nvh_link *links, unsigned n);

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

#define BT_MAX_DEPTH 32

#endif /* NVH_DS_BTREE_H */
