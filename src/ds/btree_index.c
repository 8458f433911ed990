/* btree_index.c — the DRAM search index of the B+ tree's unsorted nodes.
 *
 * The persistent nodes stay exactly as seed 000 §6 wants them: entries are
 * appended into any free slot and never shifted. Searching such a node means
 * reading all of it (16 lines of 64 B), and at 1 M keys that read — not the
 * flushes — dominated both inserts and lookups. So each node visited gets a
 * small DRAM companion: its header fields, a bitmap of the used slots, and
 * the keys of the used slots sorted with their slot numbers. A descent then
 * touches the companions (a count over an inner node's sorted keys; a
 * compare of a leaf's 60 one-byte fingerprints, one line, 16 bytes at a
 * time) and only the persistent line holding the slot it needs.
 *
 * The index is a cache, never a source of truth: built lazily from the node
 * the first time a node is visited after open (so open stays O(1)), updated
 * by every store that makes a slot used or free (bt_ix_add / bt_ix_del),
 * and dropped whenever a node changes in a way that is not worth tracking
 * (a split or removal touching a parent, a node retired or freed). Readers
 * still verify the slot they land on (key, pointer, range), and a mismatch
 * drops the companion and falls back to the plain scan.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "btree.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define BT_IX_MASK ((1ull << BT_NODE_CAP) - 1)

static inline uint32_t ix_hash(const bt_node *n, uint32_t cap)
{
    return (uint32_t)(((uintptr_t)n >> 6) * 0x9E3779B97F4A7C15ull >> 32) & (cap - 1);
}

bt_idx *bt_ix_find(const struct nvh_btree *t, const bt_node *n)
{
    if (!t->ix_cap) return NULL;
    uint32_t mask = t->ix_cap - 1;
    for (uint32_t h = ix_hash(n, t->ix_cap);; h = (h + 1) & mask) {
        const bt_ixslot *e = &t->ix_tab[h];
        if (e->node == n) return e->x;
        if (!e->node) return NULL;
    }
}

static int ix_grow(struct nvh_btree *t)
{
    uint32_t cap = t->ix_cap ? t->ix_cap * 2 : 1024;
    bt_ixslot *tab = calloc(cap, sizeof *tab);
    if (!tab) return -1;
    for (uint32_t i = 0; i < t->ix_cap; i++) {
        if (!t->ix_tab[i].node) continue;
        uint32_t h = ix_hash(t->ix_tab[i].node, cap);
        while (tab[h].node) h = (h + 1) & (cap - 1);
        tab[h] = t->ix_tab[i];
    }
    free(t->ix_tab);
    t->ix_tab = tab;
    t->ix_cap = cap;
    return 0;
}

/* Fill x from node n. */
static void ix_fill(bt_idx *x, const bt_node *n)
{
    x->node = n;
    x->lo = n->lo;
    x->hi = n->hi;
    x->successor = n->successor;
    x->level = n->level;
    x->used = 0;
    x->n = 0;
    if (n->level == 0) {
        for (unsigned j = 0; j < BT_NODE_CAP; j++) {
            x->u.fp[j] = bt_fp(n->e[j].key);
            if (n->e[j].ptr) x->used |= 1ull << j;
        }
        memset(&x->u.fp[BT_NODE_CAP], 0, 64 - BT_NODE_CAP);
        return;
    }
    unsigned k = 0;
    for (unsigned j = 0; j < BT_NODE_CAP; j++) {
        if (!n->e[j].ptr) continue;
        x->used |= 1ull << j;
        /* insertion sort: at most 60 entries, built once per node */
        uint64_t key = n->e[j].key;
        unsigned p = k;
        while (p > 0 && x->u.in.key[p - 1] > key) {
            x->u.in.key[p] = x->u.in.key[p - 1];
            x->u.in.slot[p] = x->u.in.slot[p - 1];
            p--;
        }
        x->u.in.key[p] = key;
        x->u.in.slot[p] = (uint8_t)j;
        k++;
    }
    x->n = (uint8_t)k;
    x->u.in.gen = 0;                 /* kid[] not filled */
}

uint64_t bt_ix_match(const bt_idx *x, uint64_t key)
{
    uint8_t f = bt_fp(key);
#if defined(__x86_64__)
    __m128i v = _mm_set1_epi8((char)f);
    uint64_t m = 0;
    for (unsigned i = 0; i < 4; i++) {
        __m128i c = _mm_loadu_si128((const __m128i *)&x->u.fp[16 * i]);
        m |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(c, v)) << (16 * i);
    }
    return m & x->used;
#else
    uint64_t m = 0;
    for (unsigned j = 0; j < BT_NODE_CAP; j++) m |= (uint64_t)(x->u.fp[j] == f) << j;
    return m & x->used;
#endif
}

bt_idx *bt_ix_build(struct nvh_btree *t, const bt_node *n)
{
    if ((t->ix_used + 1) * 2 > t->ix_cap && ix_grow(t) != 0) return NULL;
    /* leaf companions are small (two lines), inner ones full size; the
     * free list holds full-size ones only */
    bt_idx *x;
    if (n->level == 0) {
        /* two whole lines: header, fingerprints */
        if (!(x = aligned_alloc(64, BT_IX_LEAF_SIZE))) return NULL;
    } else if ((x = t->ix_free) != NULL) {
        t->ix_free = (bt_idx *)(uintptr_t)x->node;
    } else if (!(x = aligned_alloc(64, (sizeof *x + 63) & ~(size_t)63))) {
        return NULL;
    }
    ix_fill(x, n);
    uint32_t h = ix_hash(n, t->ix_cap);
    while (t->ix_tab[h].node) h = (h + 1) & (t->ix_cap - 1);
    t->ix_tab[h] = (bt_ixslot){n, x};
    t->ix_used++;
    return x;
}

void bt_ix_drop(struct nvh_btree *t, const bt_node *n)
{
    if (!t->ix_cap) return;
    t->ix_gen++;                     /* cached kidx[] may point at it */
    uint32_t mask = t->ix_cap - 1, h = ix_hash(n, t->ix_cap);
    while (t->ix_tab[h].node && t->ix_tab[h].node != n) h = (h + 1) & mask;
    bt_idx *x = t->ix_tab[h].x;
    if (!t->ix_tab[h].node) return;
    t->ix_tab[h] = (bt_ixslot){NULL, NULL};
    /* linear probing: shift the rest of the cluster back */
    for (uint32_t j = (h + 1) & mask; t->ix_tab[j].node; j = (j + 1) & mask) {
        uint32_t k = ix_hash(t->ix_tab[j].node, t->ix_cap);
        if (h <= j ? (h < k && k <= j) : (h < k || k <= j)) continue;
        t->ix_tab[h] = t->ix_tab[j];
        t->ix_tab[j] = (bt_ixslot){NULL, NULL};
        h = j;
    }
    t->ix_used--;
    if (x->level == 0) { free(x); return; }
    x->node = (const bt_node *)(uintptr_t)t->ix_free;
    t->ix_free = x;
}

void bt_ix_fini(struct nvh_btree *t)
{
    for (uint32_t i = 0; i < t->ix_cap; i++) free(t->ix_tab[i].x);
    free(t->ix_tab);
    while (t->ix_free) {
        bt_idx *x = t->ix_free;
        t->ix_free = (bt_idx *)(uintptr_t)x->node;
        free(x);
    }
    t->ix_tab = NULL;
    t->ix_cap = t->ix_used = 0;
}

/* Position of the first key >= key: a branch-free count over all the keys.
 * Its loads are independent (the lines stream in together), where a binary
 * search would wait for one cache miss after another. */
unsigned bt_ix_lower(const bt_idx *x, uint64_t key)
{
    unsigned c = 0, n = x->n;
    for (unsigned i = 0; i < n; i++) c += x->u.in.key[i] < key;
    return c;
}

void bt_ix_add(struct nvh_btree *t, const bt_node *n, unsigned slot, uint64_t key)
{
    bt_idx *x = bt_ix_find(t, n);
    if (!x) return;
    if (x->used & (1ull << slot)) { bt_ix_drop(t, n); return; }   /* not expected */
    x->used |= 1ull << slot;
    if (x->level == 0) { x->u.fp[slot] = bt_fp(key); return; }
    unsigned p = bt_ix_lower(x, key);
    memmove(&x->u.in.key[p + 1], &x->u.in.key[p], (x->n - p) * sizeof x->u.in.key[0]);
    memmove(&x->u.in.slot[p + 1], &x->u.in.slot[p], (x->n - p) * sizeof x->u.in.slot[0]);
    memmove(&x->u.in.kid[p + 1], &x->u.in.kid[p], (x->n - p) * sizeof x->u.in.kid[0]);
    x->u.in.key[p] = key;
    x->u.in.slot[p] = (uint8_t)slot;
    x->u.in.kid[p].node = bt_ptr(t, n->e[slot].ptr);
    x->u.in.kid[p].ix = NULL;
    x->n++;
}

void bt_ix_del(struct nvh_btree *t, const bt_node *n, unsigned slot)
{
    bt_idx *x = bt_ix_find(t, n);
    if (!x) return;
    if (!(x->used & (1ull << slot))) return;
    x->used &= ~(1ull << slot);
    if (x->level == 0) return;
    for (unsigned p = 0; p < x->n; p++) {
        if (x->u.in.slot[p] != slot) continue;
        memmove(&x->u.in.key[p], &x->u.in.key[p + 1], (x->n - p - 1) * sizeof x->u.in.key[0]);
        memmove(&x->u.in.slot[p], &x->u.in.slot[p + 1], (x->n - p - 1) * sizeof x->u.in.slot[0]);
        memmove(&x->u.in.kid[p], &x->u.in.kid[p + 1], (x->n - p - 1) * sizeof x->u.in.kid[0]);
        x->n--;
        return;
    }
    bt_ix_drop(t, n);                /* inconsistent: rebuild on next visit */
}

int bt_ix_free_slot(const bt_idx *x, int highest)
{
    uint64_t f = ~x->used & BT_IX_MASK;
    if (!f) return -1;
    return highest ? 63 - __builtin_clzll(f) : __builtin_ctzll(f);
}

void bt_ix_refresh_kids(const struct nvh_btree *t, bt_idx *x)
{
    const bt_node *n = x->node;
    for (unsigned q = 0; q < x->n; q++) {
        x->u.in.kid[q].node = bt_ptr(t, n->e[x->u.in.slot[q]].ptr);
        x->u.in.kid[q].ix = NULL;
    }
    x->u.in.gen = t->ix_gen;
}
