/* btree_classic.h — a classic sorted-node persistent B+ tree, the baseline of [Moraru11] §8.3 in bench_btree
 *
 * The "original" tree the paper's modified tree is compared with: keys kept
 * sorted in every node (binary search on lookup), an insert shifts the
 * larger entries of its leaf one slot right, a full node splits in place
 * into itself and a new right sibling. Built on nvheap's public API only
 * (the library's own tree is src/ds/btree*.c, append-in-node and unsorted).
 * Nodes are 1 KiB with 60 entries, like the library tree's, so the two
 * differ in the node layout and the search, not in the fan-out.
 *
 * Modes (how the stores become durable):
 *   CT_TX     every insert is one nvheap transaction: the shifted part of
 *             each node it changes is snapshotted with one nvh_tx_add_ranges
 *             call, the value record and any new node are nvh_tx_alloc'ed.
 *             Crash-consistent (the undo log restores a half-done shift).
 *   CT_FLUSH  the paper's (b): the stores of each step flushed, a fence
 *             between the steps (record + shifted lines, then activation,
 *             then the count). NOT crash-consistent on its own: a crash in
 *             the middle of a shift leaves an entry overwritten, which only
 *             a log can prevent; it is the cost of a classic tree with
 *             flushes and no log, a lower bound for a consistent one.
 *   CT_NT     the paper's (d): as CT_FLUSH, but every node line the step
 *             changes is rebuilt in a DRAM buffer and written back with
 *             non-temporal stores (whole lines, streamed past the cache),
 *             and so is the value record. Needs a pool whose NT threshold
 *             is at most 64 B (NVHEAP_NT_THRESHOLD=64 when it is created).
 *
 * A tree handle belongs to one thread. The tree's header is the named
 * object "ct.NAME" (one line: the root node's offset). */
#ifndef NVH_BENCH_BTREE_CLASSIC_H
#define NVH_BENCH_BTREE_CLASSIC_H

#include <stddef.h>
#include <stdint.h>

#include "nvheap.h"

typedef enum ct_mode { CT_TX = 0, CT_FLUSH = 1, CT_NT = 2 } ct_mode;

typedef struct ct_tree ct_tree;

/* Open the tree NAME of pool, creating it empty if `create` and absent
 * (NULL and nvh_errormsg() on failure; NVH_E_NOTFOUND if absent). An
 * existing tree's keys are counted by one walk. */
ct_tree *ct_open(nvh_pool *pool, const char *name, ct_mode mode, int create);
void ct_close(ct_tree *t);
/* Insert key with a copy of value (len bytes), or replace its value. */
int ct_put(ct_tree *t, uint64_t key, const void *value, size_t len);
/* The value of key (pointing into the pool), NVH_E_NOTFOUND if absent. */
int ct_get(const ct_tree *t, uint64_t key, const void **value, size_t *len);
uint64_t ct_count(const ct_tree *t);
/* Sorted order and separator invariants hold in every node: NVH_OK, or
 * NVH_E_CORRUPT. */
int ct_check(const ct_tree *t);

#endif /* NVH_BENCH_BTREE_CLASSIC_H */
