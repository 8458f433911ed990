/* btree_index.c — the DRAM search index of the B+ tree's unsorted nodes.
 *
 * The persistent nodes stay exactly as [Moraru11] §6 wants them: entries are
 * appended into any free slot and never shifted. Searching such a node means
 * reading all of it (16 lines of 64 B), and at 1 M keys that read — not the
 * flushes — dominated both inserts and lookups. So each node visited gets a
 * DRAM companion: its header fields, a bitmap of the used slots; for an
 * inner node the keys of the used slots sorted with their slot numbers and
 * cached children; for a leaf one fingerprint byte per slot and each used
 * slot's key and record word. A descent then touches the companions (a
 * count over an inner node's sorted keys; a compare of a leaf's 60
 * fingerprints, 16 bytes at a time) and, for a lookup, only the record.
 *
 * The index is a cache built lazily from the node the first time a node is
 * visited after open (so open stays O(1)), and kept exact by every store
 * that changes a slot or a child pointer (bt_ix_add*, bt_ix_del,
 * bt_ix_hint, bt_ix_validated, bt_ix_relink); whatever it does not know
 * (record word 0, pending bit) is read from the node. It is dropped
 * whenever a node changes in a way that is not worth tracking (a node
 * retired or freed, an inconsistency). Memory comes from 2 MiB arenas with
 * transparent huge pages and is never returned before close, so a stale
 * cached companion pointer is harmless: its node field says whose it is.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../common/internal.h"
#include "btree.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

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

/* The companion's record word of a leaf entry pointer p for a record of
 * `lines` lines (0: not known): offset | lines << 1 | pending; 0 if p is
 * not 64 B aligned (not expected: then lookups read the node). */
static inline uint64_t ix_rec_word(nvh_off_t p, uint64_t lines)
{
    nvh_off_t off = p & ~BT_PENDING;
    if (!off || (off & 63)) return 0;
    return off | (lines > 31 ? 31 : lines) << 1 | (p & BT_PENDING);
}

/* The record word of leaf slot j from its entry; its record (just written
 * by the caller, so in the cache) gives the line count. */
static inline void ix_leaf_hint(const struct nvh_btree *t, bt_idx *x, const bt_node *n, unsigned j)
{
    if (!x->slots) return;
    nvh_off_t p = n->e[j].ptr;
    x->u.lf.s[j].key = n->e[j].key;
    x->u.lf.s[j].rec = 0;
    if (!(p & ~BT_PENDING)) return;
    const bt_record *r = bt_ptr(t, p & ~BT_PENDING);
    x->u.lf.s[j].rec = ix_rec_word(p, (sizeof *r + r->len + 63) / 64);
}

/* Inner companion: pad the keys past n with UINT64_MAX (never counted as
 * below a key) and recompute the separator line from them. */
static void ix_seal(bt_idx *x)
{
    for (unsigned i = x->n; i < 64; i++) *bt_ixk(x, i) = UINT64_MAX;
    for (unsigned b = 0; b < 8; b++) x->u.in.sep[b] = x->u.in.b[b].key[0];
}

/* Fill x from node n (a leaf's key/record slots too if `slots`). */
static void ix_fill(bt_idx *x, const bt_node *n, int slots)
{
    x->node = n;
    x->lo = n->lo;
    x->hi = n->hi;
    x->successor = n->successor;
    x->level = n->level;
    x->used = 0;
    x->n = 0;
    x->slots = 0;
    if (n->level == 0) {
        x->slots = (uint8_t)(slots != 0);
        for (unsigned j = 0; j < BT_NODE_CAP; j++) {
            nvh_off_t p = n->e[j].ptr;
            x->u.lf.fp[j] = bt_fp(n->e[j].key);
            if (slots) {
                x->u.lf.s[j].key = n->e[j].key;
                x->u.lf.s[j].rec = ix_rec_word(p, 0);   /* lines not read: cold */
            }
            if (p) x->used |= 1ull << j;
        }
        memset(&x->u.lf.fp[BT_NODE_CAP], 0, 64 - BT_NODE_CAP);
        return;
    }
    unsigned k = 0;
    for (unsigned j = 0; j < BT_NODE_CAP; j++) {
        if (!n->e[j].ptr) continue;
        x->used |= 1ull << j;
        /* insertion sort: at most 60 entries, built once per node */
        uint64_t key = n->e[j].key;
        unsigned p = k;
        while (p > 0 && bt_ixk_get(x, p - 1) > key) {
            *bt_ixk(x, p) = bt_ixk_get(x, p - 1);
            x->u.in.slot[p] = x->u.in.slot[p - 1];
            p--;
        }
        *bt_ixk(x, p) = key;
        x->u.in.slot[p] = (uint8_t)j;
        k++;
    }
    x->n = (uint8_t)k;
    ix_seal(x);
    x->u.in.gen = 0;                 /* kid[] not filled */
}

uint64_t bt_ix_match(const bt_idx *x, uint64_t key)
{
    uint8_t f = bt_fp(key);
#if defined(__x86_64__)
    __m128i v = _mm_set1_epi8((char)f);
    uint64_t m = 0;
    for (unsigned i = 0; i < 4; i++) {
        __m128i c = _mm_loadu_si128((const __m128i *)&x->u.lf.fp[16 * i]);
        m |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(c, v)) << (16 * i);
    }
    return m & x->used;
#else
    uint64_t m = 0;
    for (unsigned j = 0; j < BT_NODE_CAP; j++) m |= (uint64_t)(x->u.lf.fp[j] == f) << j;
    return m & x->used;
#endif
}

/* Companion memory: carved from 2 MiB arenas that ask for transparent huge
 * pages (THP is "madvise" on the dev VM), so that a descent's companions
 * cost no TLB miss each; freed companions go to a free list per size and
 * the arenas are returned only at close. */
#define BT_IX_ARENA (2u << 20)

static void *ix_carve(struct nvh_btree *t, size_t size)
{
    if ((size_t)(t->ix_end - t->ix_bump) < size) {
        if (t->ix_narenas == t->ix_arenas_cap) {
            uint32_t cap = t->ix_arenas_cap ? t->ix_arenas_cap * 2 : 16;
            void **a = realloc(t->ix_arenas, cap * sizeof *a);
            if (!a) return NULL;
            t->ix_arenas = a;
            t->ix_arenas_cap = cap;
        }
        void *m = NULL;
        if (posix_memalign(&m, BT_IX_ARENA, BT_IX_ARENA) != 0) return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(m, BT_IX_ARENA, MADV_HUGEPAGE);   /* a hint; errors are fine */
#endif
        t->ix_arenas[t->ix_narenas++] = m;
        t->ix_bump = m;
        t->ix_end = (char *)m + BT_IX_ARENA;
    }
    void *x = t->ix_bump;
    t->ix_bump += size;
    return x;
}

bt_idx *bt_ix_build(struct nvh_btree *t, const bt_node *n)
{
    if ((t->ix_used + 1) * 2 > t->ix_cap && ix_grow(t) != 0) return NULL;
    /* leaf companions are 17 lines (2 without slots), inner ones 25; a
     * tree's leaf companions are all of one size: slots iff the tree has
     * no key directory, fixed at open */
    bt_idx **fl = n->level == 0 ? &t->ix_free_leaf : &t->ix_free;
    bt_idx *x = *fl;
    size_t size = n->level != 0 ? BT_IX_INNER_SIZE : t->kd_off ? BT_IX_LEAF_SIZE : BT_IX_LEAF_SMALL;
    if (x) *fl = x->free_next;
    else if (!(x = ix_carve(t, size))) return NULL;
    ix_fill(x, n, t->kd_off);
    uint32_t h = ix_hash(n, t->ix_cap);
    while (t->ix_tab[h].node) h = (h + 1) & (t->ix_cap - 1);
    t->ix_tab[h] = (bt_ixslot){n, x};
    t->ix_used++;
    return x;
}

void bt_ix_drop(struct nvh_btree *t, const bt_node *n)
{
    if (!t->ix_cap) return;
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
    /* a parent's cached kid.ix may still point here: node NULL tells it */
    x->node = NULL;
    bt_idx **fl = x->level == 0 ? &t->ix_free_leaf : &t->ix_free;
    x->free_next = *fl;
    *fl = x;
}

void bt_ix_fini(struct nvh_btree *t)
{
    for (uint32_t i = 0; i < t->ix_narenas; i++) free(t->ix_arenas[i]);
    free(t->ix_arenas);
    free(t->ix_tab);
    t->ix_arenas = NULL;
    t->ix_narenas = t->ix_arenas_cap = 0;
    t->ix_bump = t->ix_end = NULL;
    t->ix_free = t->ix_free_leaf = NULL;
    t->ix_tab = NULL;
    t->ix_cap = t->ix_used = 0;
}

void bt_ix_add(struct nvh_btree *t, const bt_node *n, unsigned slot, uint64_t key)
{
    bt_idx *x = bt_ix_find(t, n);
    if (!x) return;
    if (x->used & (1ull << slot)) { bt_ix_drop(t, n); return; }   /* not expected */
    x->used |= 1ull << slot;
    if (x->level == 0) {
        x->u.lf.fp[slot] = bt_fp(key);
        ix_leaf_hint(t, x, n, slot);
        return;
    }
    if (x->n >= BT_NODE_CAP) { bt_ix_drop(t, n); return; }       /* not expected */
    unsigned p = bt_ix_lower(x, key);
    for (unsigned q = x->n; q > p; q--) {
        *bt_ixk(x, q) = bt_ixk_get(x, q - 1);
        *bt_ixkid(x, q) = *bt_ixkid(x, q - 1);
        x->u.in.slot[q] = x->u.in.slot[q - 1];
    }
    *bt_ixk(x, p) = key;
    x->u.in.slot[p] = (uint8_t)slot;
    bt_ixkid(x, p)->node = bt_ptr(t, n->e[slot].ptr);
    bt_ixkid(x, p)->ix = NULL;
    x->n++;
    ix_seal(x);
}

bt_idx *bt_ix_add_leaf(struct nvh_btree *t, bt_idx *x, const bt_node *n, unsigned slot,
                       uint64_t key, nvh_off_t ptr, size_t rsize)
{
    if (!x || x->node != n) x = bt_ix_find(t, n);
    if (!x) return NULL;
    if (x->level != 0 || (x->used & (1ull << slot))) { bt_ix_drop(t, n); return NULL; }  /* not expected */
    x->used |= 1ull << slot;
    x->u.lf.fp[slot] = bt_fp(key);
    if (x->slots) {
        x->u.lf.s[slot].key = key;
        x->u.lf.s[slot].rec = ix_rec_word(ptr, (rsize + 63) / 64);
    }
    return x;
}

void bt_ix_validated(const bt_pending *pd)
{
    bt_idx *x = pd->ix;
    unsigned slot = (unsigned)(pd->entry - pd->node->e);
    /* the companion is the leaf's still (a structural change syncs the
     * pending inserts first, so it cannot have been dropped in between;
     * checked anyway), and the slot is the one the insert filled */
    if (!x || x->node != pd->node || !(x->used & (1ull << slot)) || !x->slots) return;
    x->u.lf.s[slot].rec &= ~(uint64_t)BT_PENDING;
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
        for (unsigned q = p; q + 1 < x->n; q++) {
            *bt_ixk(x, q) = bt_ixk_get(x, q + 1);
            *bt_ixkid(x, q) = *bt_ixkid(x, q + 1);
            x->u.in.slot[q] = x->u.in.slot[q + 1];
        }
        x->n--;
        ix_seal(x);
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
        bt_ixkid(x, q)->node = bt_ptr(t, n->e[x->u.in.slot[q]].ptr);
        bt_ixkid(x, q)->ix = NULL;
    }
    x->u.in.gen = t->ix_gen;
}

void bt_ix_relink(struct nvh_btree *t, const bt_path *p, const bt_node *child)
{
    if (!p->link) return;                          /* the root: no parent */
    if (!p->parent) { t->ix_gen++; return; }       /* unknown: every kid[] again */
    bt_idx *x = bt_ix_find(t, p->parent);
    if (!x || x->level == 0) return;
    unsigned slot = (unsigned)(p->link - p->parent->e);
    for (unsigned q = 0; q < x->n; q++) {
        if (x->u.in.slot[q] != slot) continue;
        bt_ixkid(x, q)->node = child;
        bt_ixkid(x, q)->ix = NULL;
        return;
    }
    bt_ix_drop(t, p->parent);                      /* inconsistent: rebuild */
}

void bt_ix_hint(struct nvh_btree *t, const bt_node *n, unsigned slot)
{
    bt_idx *x = bt_ix_find(t, n);
    if (x && x->level == 0) ix_leaf_hint(t, x, n, slot);
}

/* ==========================================================================
 * The key directory (btree.h says what it is for)
 * ========================================================================== */
/* Tables are mmap'd (zeroed: rec 0 = empty) with transparent huge pages:
 * at 1 M keys the table is 32 MiB, and a lookup's probe must not add a TLB
 * miss to its cache miss. Load factor at most 1/2: a probe almost always
 * ends in the home slot's line. */
#define BT_KD_MIN (1u << 16)

static bt_kslot *kd_map(uint64_t cap)
{
    size_t len = cap * sizeof(bt_kslot);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(m, len, MADV_HUGEPAGE);          /* a hint; errors are fine */
#endif
    return m;
}

static void kd_place(bt_kslot *tab, uint64_t cap, uint64_t key, uint64_t w)
{
    uint64_t mask = cap - 1, h = bt_kd_hash(key) & mask;
    while (tab[h].rec) h = (h + 1) & mask;
    tab[h].key = key;
    tab[h].rec = w;
}

static int kd_grow(struct nvh_btree *t)
{
    uint64_t cap = t->kd_cap ? t->kd_cap * 2 : BT_KD_MIN;
    bt_kslot *tab = kd_map(cap);
    if (!tab) return -1;
    /* The old table is read in order, the new one written at random: ask
     * for each target line 16 entries ahead so that the misses overlap
     * (one after another, a rehash of 512 k keys cost ~100 ns per insert
     * of the whole run). */
    const uint64_t ahead = 16, mask = cap - 1;
    for (uint64_t i = 0; i < t->kd_cap; i++) {
        if (i + ahead < t->kd_cap && t->kd_tab[i + ahead].rec)
            __builtin_prefetch(&tab[bt_kd_hash(t->kd_tab[i + ahead].key) & mask], 1);
        if (t->kd_tab[i].rec) kd_place(tab, cap, t->kd_tab[i].key, t->kd_tab[i].rec);
    }
    if (t->kd_tab) munmap(t->kd_tab, t->kd_cap * sizeof(bt_kslot));
    t->kd_tab = tab;
    t->kd_cap = cap;
    return 0;
}

static void kd_set(struct nvh_btree *t, uint64_t key, uint64_t w);
static void kd_del(struct nvh_btree *t, uint64_t key);

void bt_kd_apply(struct nvh_btree *t)
{
    unsigned n = t->kd_nbuf;
    t->kd_nbuf = 0;
    if ((t->kd_used + n) * 2 > t->kd_cap && t->kd_tab) {
        while ((t->kd_used + n) * 2 > t->kd_cap)
            if (kd_grow(t) != 0) break;          /* kd_set copes */
    }
    if (t->kd_tab)
        for (unsigned i = 0; i < n; i++)
            __builtin_prefetch(&t->kd_tab[bt_kd_hash(t->kd_buf[i].key) & (t->kd_cap - 1)], 1);
    for (unsigned i = 0; i < n; i++) kd_set(t, t->kd_buf[i].key, t->kd_buf[i].rec);
}

void bt_kd_del(struct nvh_btree *t, uint64_t key)
{
    if (t->kd_nbuf) bt_kd_apply(t);
    kd_del(t, key);
}

void bt_kd_set(struct nvh_btree *t, uint64_t key, uint64_t w)
{
    if (t->kd_nbuf) bt_kd_apply(t);
    kd_set(t, key, w);
}

static void kd_del(struct nvh_btree *t, uint64_t key)
{
    if (!t->kd_tab) return;
    uint64_t mask = t->kd_cap - 1, h = bt_kd_hash(key) & mask;
    while (t->kd_tab[h].rec && t->kd_tab[h].key != key) h = (h + 1) & mask;
    if (!t->kd_tab[h].rec) return;
    t->kd_tab[h] = (bt_kslot){0, 0};
    /* linear probing: shift the rest of the cluster back */
    for (uint64_t j = (h + 1) & mask; t->kd_tab[j].rec; j = (j + 1) & mask) {
        uint64_t k = bt_kd_hash(t->kd_tab[j].key) & mask;
        if (h <= j ? (h < k && k <= j) : (h < k || k <= j)) continue;
        t->kd_tab[h] = t->kd_tab[j];
        t->kd_tab[j] = (bt_kslot){0, 0};
        h = j;
    }
    t->kd_used--;
}

static void kd_set(struct nvh_btree *t, uint64_t key, uint64_t w)
{
    w &= ~(uint64_t)BT_PENDING;
    if (!w) { kd_del(t, key); return; }
    if (t->sorted || t->kd_off || t->kd_state == BT_KD_IDLE) return;
    if ((t->kd_used + 1) * 2 > t->kd_cap && kd_grow(t) != 0) {
        /* no memory: the directory only speeds lookups up; forget the key
         * so that it cannot be stale */
        kd_del(t, key);
        return;
    }
    uint64_t mask = t->kd_cap - 1, h = bt_kd_hash(key) & mask;
    while (t->kd_tab[h].rec) {
        if (t->kd_tab[h].key == key) { t->kd_tab[h].rec = w; return; }
        h = (h + 1) & mask;
    }
    t->kd_tab[h].key = key;
    t->kd_tab[h].rec = w;
    t->kd_used++;
}

void bt_kd_reserve(struct nvh_btree *t, uint64_t keys)
{
    if (t->kd_tab || t->kd_nbuf) return;          /* only an empty directory */
    uint64_t cap = BT_KD_MIN;
    while (cap < keys * 2 && cap < ((uint64_t)1 << 40)) cap *= 2;
    bt_kslot *tab = kd_map(cap);
    if (!tab) return;
    t->kd_tab = tab;
    t->kd_cap = cap;
}

void bt_kd_fini(struct nvh_btree *t)
{
    if (t->kd_tab) munmap(t->kd_tab, t->kd_cap * sizeof(bt_kslot));
    t->kd_tab = NULL;
    t->kd_cap = t->kd_used = 0;
    t->kd_nbuf = 0;
}
