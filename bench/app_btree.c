/* app_btree.c — the transactional B-tree workload ([Coburn09] §5.2, Fig. 6
 * "BTree"): a B-tree after Cormen et al. (the paper's reference [12]: keys
 * in every node, minimum degree 8, preemptive splitting on the way down),
 * whose nodes are read and updated inside transactions. The paper's
 * operation: pick a number at random and search for it; present -> remove
 * it, absent -> insert it. Removal marks the key removed in its node (a
 * tombstone bit: one word, so nvheap commits it with one fence) and a later
 * insertion of that key revives it; nodes are never merged, so the tree
 * keeps the shape its insertions gave it.
 *
 * Node: 320 bytes (5 lines): count, leaf flag, 15 keys, 16 children. */
#include "apps.h"

#include <stdio.h>

#define BT_MAGIC 0x4254524545415050ull       /* "BTREEAPP" */
#define T 8u
#define MAXK (2 * T - 1)
#define DEAD (1ull << 63)                    /* key removed */
#define KEY(k) ((k) & ~DEAD)

typedef struct node {
    uint64_t n, leaf;
    uint64_t key[MAXK];
    uint64_t child[2 * T];
    uint64_t pad[7];
} node;
typedef struct thead { uint64_t magic, root; uint64_t pad[6]; } thead;
_Static_assert(sizeof(node) == 320 && sizeof(thead) == 64, "line multiples");

typedef struct create_arg { uint64_t *slot; } create_arg;
static int create_fn(app_be *be, void *p)
{
    create_arg *a = p;
    thead *h = be->alloc(be, sizeof *h);
    node *r = h ? be->alloc(be, sizeof *r) : NULL;
    uint64_t *slot = r ? be->wr(be, a->slot, 8) : NULL;
    if (!slot) return -1;
    r->leaf = 1;
    *h = (thead){BT_MAGIC, app_off(be, r), {0}};
    *slot = app_off(be, h);
    return 0;
}

int btree_create(app_be *be, uint64_t *root_slot)
{
    create_arg a = {root_slot};
    return be->run(be, APP_LOCK_WRITE, 0, create_fn, &a);
}

/* First index i with KEY(key[i]) >= k. */
static inline unsigned lower(const node *x, uint64_t k)
{
    unsigned i = 0;
    while (i < x->n && KEY(x->key[i]) < k) i++;
    return i;
}

/* Search: the node (offset) and index holding k, or 0. */
static int search(app_be *be, uint64_t root, uint64_t k, uint64_t *at, unsigned *idx,
                  uint64_t *word)
{
    const thead *h = be->rd(be, app_ptr(be, root), sizeof *h);
    if (!h) return -1;
    for (uint64_t off = h->root; off;) {
        const node *x = be->rd(be, app_ptr(be, off), sizeof *x);
        if (!x) return -1;
        unsigned i = lower(x, k);
        if (i < x->n && KEY(x->key[i]) == k) { *at = off; *idx = i; *word = x->key[i]; return 0; }
        off = x->leaf ? 0 : x->child[i];
    }
    *at = 0;
    return 0;
}

/* Split x's full child i (x already opened for write). */
static int split_child(app_be *be, node *x, unsigned i)
{
    node *y = be->wr(be, app_ptr(be, x->child[i]), sizeof *y);
    node *z = y ? be->alloc(be, sizeof *z) : NULL;
    if (!z) return -1;
    z->leaf = y->leaf;
    z->n = T - 1;
    for (unsigned j = 0; j < T - 1; j++) { z->key[j] = y->key[j + T]; y->key[j + T] = 0; }
    if (!y->leaf)
        for (unsigned j = 0; j < T; j++) { z->child[j] = y->child[j + T]; y->child[j + T] = 0; }
    y->n = T - 1;
    for (unsigned j = (unsigned)x->n; j > i; j--) x->child[j + 1] = x->child[j];
    x->child[i + 1] = app_off(be, z);
    for (unsigned j = (unsigned)x->n; j > i; j--) x->key[j] = x->key[j - 1];
    x->key[i] = y->key[T - 1];
    y->key[T - 1] = 0;
    x->n++;
    return 0;
}

static int insert_nonfull(app_be *be, uint64_t off, uint64_t k)
{
    for (;;) {
        const node *x = be->rd(be, app_ptr(be, off), sizeof *x);
        if (!x) return -1;
        unsigned i = lower(x, k);
        if (x->leaf) {
            node *w = be->wr(be, app_ptr(be, off), sizeof *w);
            if (!w) return -1;
            for (unsigned j = (unsigned)w->n; j > i; j--) w->key[j] = w->key[j - 1];
            w->key[i] = k;
            w->n++;
            return 0;
        }
        const node *c = be->rd(be, app_ptr(be, x->child[i]), sizeof *c);
        if (!c) return -1;
        if (c->n == MAXK) {
            node *w = be->wr(be, app_ptr(be, off), sizeof *w);
            if (!w || split_child(be, w, i)) return -1;
            if (k > KEY(w->key[i])) i++;
            x = w;
        }
        off = x->child[i];
    }
}

typedef struct tog_arg { uint64_t root, key; int inserted; } tog_arg;
static int toggle_fn(app_be *be, void *p)
{
    tog_arg *t = p;
    uint64_t at, word;
    unsigned i;
    if (search(be, t->root, t->key, &at, &i, &word)) return -1;
    if (at) {                                   /* present or removed: flip it */
        node *w = be->wr(be, app_ptr(be, at), sizeof *w);
        if (!w) return -1;
        w->key[i] ^= DEAD;
        t->inserted = !(w->key[i] & DEAD);
        return 0;
    }
    t->inserted = 1;
    const thead *h = be->rd(be, app_ptr(be, t->root), sizeof *h);
    const node *r = h ? be->rd(be, app_ptr(be, h->root), sizeof *r) : NULL;
    if (!r) return -1;
    if (r->n < MAXK) return insert_nonfull(be, h->root, t->key);
    thead *hw = be->wr(be, app_ptr(be, t->root), sizeof *hw);
    node *s = hw ? be->alloc(be, sizeof *s) : NULL;
    if (!s) return -1;
    s->child[0] = hw->root;
    hw->root = app_off(be, s);
    if (split_child(be, s, 0)) return -1;
    return insert_nonfull(be, hw->root, t->key);
}

int btree_toggle(app_be *be, uint64_t root, uint64_t key, int *inserted)
{
    tog_arg t = {root, KEY(key), 0};
    int rc = be->run(be, APP_LOCK_WRITE, 0, toggle_fn, &t);
    if (inserted) *inserted = t.inserted;
    return rc;
}

typedef struct look_arg { uint64_t root, key; int found; } look_arg;
static int lookup_fn(app_be *be, void *p)
{
    look_arg *l = p;
    uint64_t at, word;
    unsigned i;
    if (search(be, l->root, l->key, &at, &i, &word)) return -1;
    l->found = at && !(word & DEAD);
    return 0;
}

int btree_lookup(app_be *be, uint64_t root, uint64_t key, int *found)
{
    look_arg l = {root, KEY(key), 0};
    int rc = be->run(be, APP_LOCK_READ, 0, lookup_fn, &l);
    *found = l.found;
    return rc;
}

/* ---- invariants (quiescent structure, read in place) ------------------- */
typedef struct chk { app_be *be; int leaf_depth; uint64_t live, nodes; } chk;

static int check_node(chk *c, uint64_t off, int depth, int is_root, uint64_t lo, uint64_t hi)
{
    const node *x = app_ptr(c->be, off);
    if (!x || ++c->nodes > (1u << 26)) { fprintf(stderr, "btree: bad node offset\n"); return 1; }
    if (x->n > MAXK || (!is_root && x->n < T - 1) || (is_root && !x->leaf && x->n < 1)) {
        fprintf(stderr, "btree: node at depth %d holds %llu keys\n", depth, (unsigned long long)x->n);
        return 1;
    }
    for (unsigned i = 0; i < x->n; i++) {
        uint64_t k = KEY(x->key[i]);
        if (k < lo || k > hi || (i && k <= KEY(x->key[i - 1]))) {
            fprintf(stderr, "btree: key %llu out of order at depth %d\n", (unsigned long long)k, depth);
            return 1;
        }
        if (!(x->key[i] & DEAD)) c->live++;
    }
    if (x->leaf) {
        if (c->leaf_depth < 0) c->leaf_depth = depth;
        if (c->leaf_depth != depth) { fprintf(stderr, "btree: leaves at depths %d and %d\n", c->leaf_depth, depth); return 1; }
        return 0;
    }
    if (x->n && KEY(x->key[0]) <= lo) {         /* no key fits in its left subtree */
        fprintf(stderr, "btree: inner node at depth %d starts with key %llu\n", depth,
                (unsigned long long)KEY(x->key[0]));
        return 1;
    }
    for (unsigned i = 0; i <= x->n; i++) {
        uint64_t l = i ? KEY(x->key[i - 1]) + 1 : lo, h = i < x->n ? KEY(x->key[i]) - 1 : hi;
        if (check_node(c, x->child[i], depth + 1, 0, l, h)) return 1;
    }
    return 0;
}

int btree_check(app_be *be, uint64_t root, uint64_t *live_out)
{
    const thead *h = root ? app_ptr(be, root) : NULL;
    if (!h || h->magic != BT_MAGIC || !h->root) { fprintf(stderr, "btree: bad header\n"); return 1; }
    chk c = {be, -1, 0, 0};
    if (check_node(&c, h->root, 0, 1, 0, ~DEAD)) return 1;
    if (live_out) *live_out = c.live;
    return 0;
}
