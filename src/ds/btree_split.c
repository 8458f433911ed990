/* btree_split.c — structural changes of the B+ tree: descent with
 * preemptive splits, the split itself (two new nodes, old one retired after
 * the new ones and the parent's pointers are durable), repair of a split a
 * crash interrupted, root growth, removal of empty leaves; and the classic
 * in-place split of the volatile sorted variant.
 *
 * Why a split is crash-consistent ([Moraru11] §6, Fig. 3), node C with
 * effective range [lo, hi] in parent P at entry i, median key m:
 *   1. N1 = C's live entries < m, N2 = those >= m, both new; P.e[j].key = m
 *      in a free slot of P; flush all that, one fence.
 *   2. activate(N2, link P.e[j].ptr)     P now routes [m, hi] to N2; C still
 *                                        holds those keys too but readers
 *                                        ignore entries outside the range
 *                                        the parent gives (C's is [lo, m-1]).
 *   3. activate(N1, link C.successor)    readers arriving at C go to N1.
 *   4. free(C, P.e[i].ptr -> N1)         C is retired; its space rests in
 *                                        the allocator's don't-allocate FIFO.
 * Each step is one failure-atomic allocator operation, each leaves a tree
 * that reads exactly like the one before, so nothing recoverable is ever
 * lost (monotonic consistency). After a crash between 2 and 4 the next
 * writer that reaches C finishes the job (bt_repair): no scan at open.
 *
 * Value records are never copied: N1/N2 point at the same records as C, so
 * a record's validity (its validation key) is unaffected by splits. Pending
 * inserts hold the address of their leaf slot until their group action runs,
 * so every structural change first syncs the group context.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "btree.h"

/* ==========================================================================
 * Helpers
 * ========================================================================== */
static inline void bt_entry_swap(bt_entry *v, unsigned i, unsigned j)
{
    bt_entry x = v[i];
    v[i] = v[j];
    v[j] = x;
}

/* Put the k-th smallest key of v[0..n) at v[k], the smaller ones before it,
 * the larger after (keys are distinct). Nodes are unsorted by design, so a
 * split needs the median and the two halves, not a sort: selection is O(n)
 * and calls no comparator (qsort was ~4% of an insert). */
static void bt_select(bt_entry *v, unsigned n, unsigned k)
{
    unsigned lo = 0, hi = n - 1;
    while (hi > lo) {
        /* median of three as pivot, moved to hi */
        unsigned mid = lo + (hi - lo) / 2;
        if (v[mid].key < v[lo].key) bt_entry_swap(v, mid, lo);
        if (v[hi].key < v[lo].key) bt_entry_swap(v, hi, lo);
        if (v[mid].key < v[hi].key) bt_entry_swap(v, mid, hi);
        uint64_t pivot = v[hi].key;
        unsigned store = lo;
        for (unsigned i = lo; i < hi; i++)
            if (v[i].key < pivot) bt_entry_swap(v, i, store++);
        bt_entry_swap(v, store, hi);
        if (store == k) return;
        if (store < k) lo = store + 1;
        else hi = store - 1;
    }
}

static nvh_off_t *bt_link_of(struct nvh_btree *t, bt_path *p)
{
    return p->link ? &p->link->ptr : &t->hdr->root;
}

/* Settle every pending insert: their actions hold slot addresses. */
static int bt_settle_groups(struct nvh_btree *t)
{
    if (!t->group || (nvh_group_pending(t->group) == 0 && t->pend_valid == 0)) return NVH_OK;
    t->stats.syncs++;
    int rc = nvh_group_sync(t->group);
    if (rc == NVH_OK) bt_ack_validated(t);
    if (rc == NVH_OK && t->pend_used == 0 && t->durable < t->ops) {
        /* every op issued so far is durable now */
        bt_ack_(t, t->ops);
    }
    return rc;
}

/* A new node with the given entries, written and flushed (not fenced). */
static bt_node *bt_new_node(struct nvh_btree *t, uint32_t level, uint64_t lo, uint64_t hi,
                            const bt_entry *v, unsigned n)
{
    bt_node *c = bt_node_take(t);         /* its write window is open */
    if (!c) return NULL;
    memset(c, 0, sizeof *c);
    c->magic = BT_MAGIC_NODE;
    c->level = level;
    c->sorted = (uint32_t)t->sorted;
    c->lo = lo;
    c->hi = hi;
    if (n) memcpy(c->e, v, n * sizeof *v);
    c->count = t->sorted ? n : 0;
    /* unsorted nodes need their free slots zeroed on the media: all lines
     * are written; the sorted variant bounds its slots by count */
    bt_note(t, c, t->sorted ? 64 + (size_t)n * sizeof *v : sizeof *c);
    if (!__builtin_expect(t->fault & BT_FAULT_NODE_UNFLUSHED, 0) || !n)
        bt_flush(t, c, sizeof *c);
    t->stats.nodes++;
    return c;
}

int bt_stale(const bt_path *p)
{
    const bt_node *n = p->node;
    return n->successor != 0 || n->hi > p->hi || n->lo < p->lo;
}

/* Free the slots of in-range leaf entries whose validation never became
 * durable (crash leftovers: PENDING set, not pending in this session). Their
 * records are garbage inside a slab (btree_slab.c); nothing to free. */
int bt_reclaim_leaf(struct nvh_btree *t, bt_path *p)
{
    bt_node *n = p->node;
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        bt_entry *e = &n->e[i];
        if (!(e->ptr & BT_PENDING) || e->key < p->lo || e->key > p->hi) continue;
        if (bt_pending_has(t, e)) continue;
        bt_entry_clear(t, n, i);
        t->stats.reclaimed++;
    }
    return NVH_OK;
}

/* Live in-range entries of the node at p (in slot order); reclaims dead
 * records. */
static int bt_gather(struct nvh_btree *t, bt_path *p, bt_entry *v, unsigned *n)
{
    bt_node *c = p->node;
    *n = 0;
    if (c->level == 0) {
        int rc = bt_reclaim_leaf(t, p);
        if (rc != NVH_OK) return rc;
    }
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        bt_entry *e = &c->e[i];
        if (!e->ptr || e->key < p->lo || e->key > p->hi) continue;
        v[(*n)++] = *e;
    }
    return NVH_OK;
}

/* Replace the node at p by a new node holding v[0..n) (same range). */
static int bt_replace(struct nvh_btree *t, bt_path *p, const bt_entry *v, unsigned n)
{
    bt_node *c = p->node;
    bt_node *nn = bt_new_node(t, c->level, p->lo, p->hi, v, n);
    if (!nn) return nvh_errcode();
    bt_drain(t);
    nvh_off_t *succ = &c->successor;
    bt_ix_drop(t, c);
    int rc = bt_activate(t, nn, &succ, 1);
    if (rc != NVH_OK) { bt_cancel(t, nn); return rc; }
    nvh_link l = {bt_link_of(t, p), bt_off(t, nn)};
    rc = bt_free(t, c, &l, 1);
    if (rc != NVH_OK) return rc;
    bt_ix_relink(t, p, nn);
    p->node = nn;
    return NVH_OK;
}

int bt_repair(struct nvh_btree *t, bt_path *p)
{
    int rc = bt_settle_groups(t);
    if (rc != NVH_OK) return rc;
    bt_node *c = p->node;
    t->stats.repairs++;
    if (c->successor) {
        bt_node *s = bt_ptr(t, c->successor);
        nvh_link l = {bt_link_of(t, p), c->successor};
        rc = bt_free(t, c, &l, 1);
        if (rc != NVH_OK) return rc;
        bt_ix_relink(t, p, s);
        p->node = s;
        /* the successor was built for exactly this range */
        return bt_stale(p) ? bt_repair(t, p) : NVH_OK;
    }
    bt_entry v[BT_NODE_CAP];
    unsigned n;
    rc = bt_gather(t, p, v, &n);
    if (rc != NVH_OK) return rc;
    return bt_replace(t, p, v, n);
}

/* ==========================================================================
 * Fullness
 * ========================================================================== */
static int bt_free_slot(struct nvh_btree *t, bt_path *p)
{
    bt_node *n = p->node;
    if (t->sorted) return n->count < BT_NODE_CAP ? (int)n->count : -1;
    /* the path's companion if it is still n's (never freed: node tells) */
    bt_idx *x = p->ix && p->ix->node == n ? p->ix : (p->ix = bt_ix(t, n));
    int level = x ? (int)x->level : (int)n->level;
    if (x) {
        int j = bt_ix_free_slot(x, 1);
        if (j >= 0) return j;
    } else {
        /* From the end: nodes are created with their entries at the front,
         * so a free slot is usually found at once. */
        for (unsigned i = BT_NODE_CAP; i-- > 0;)
            if (!n->e[i].ptr) return (int)i;
    }
    if (level == 0) {
        /* slow path: crash leftovers (pending bit, never validated) */
        for (unsigned i = 0; i < BT_NODE_CAP; i++) {
            bt_entry *e = &n->e[i];
            if ((e->ptr & BT_PENDING) && !bt_pending_has(t, e)) {
                bt_entry_clear(t, n, i);
                return (int)i;
            }
        }
    }
    return -1;
}

/* ==========================================================================
 * Splits
 * ========================================================================== */
/* Classic in-place split of the volatile sorted variant: the upper half moves
 * to a new right node, the old node keeps the lower half, the separator is
 * shifted into the parent. */
static int bt_split_sorted(struct nvh_btree *t, bt_path *path, int d)
{
    bt_node *c = path[d].node, *p = path[d - 1].node;
    unsigned half = c->count / 2;
    uint64_t m = c->e[half].key;
    bt_node *r = bt_new_node(t, c->level, m, path[d].hi, &c->e[half], c->count - half);
    if (!r) return nvh_errcode();
    c->count = half;
    c->hi = m - 1;
    bt_note(t, c, 64);
    unsigned pos = p->count;
    while (pos > 0 && p->e[pos - 1].key > m) pos--;
    memmove(&p->e[pos + 1], &p->e[pos], (p->count - pos) * sizeof p->e[0]);
    p->e[pos].key = m;
    p->e[pos].ptr = bt_off(t, r);
    p->count++;
    bt_note(t, &p->e[pos], (p->count - pos) * sizeof p->e[0]);
    bt_note(t, p, 64);
    t->stats.splits++;
    return NVH_OK;
}

static int bt_split(struct nvh_btree *t, bt_path *path, int d)
{
    if (t->sorted) return bt_split_sorted(t, path, d);
    int rc = bt_settle_groups(t);
    if (rc != NVH_OK) return rc;
    bt_path *cp = &path[d], *pp = &path[d - 1];
    bt_node *c = cp->node, *p = pp->node;
    bt_entry v[BT_NODE_CAP];
    unsigned n;
    rc = bt_gather(t, cp, v, &n);
    if (rc != NVH_OK) return rc;
    if (n <= BT_NODE_CAP / 2) {
        /* mostly dead slots (deleted or reclaimed): compact instead */
        t->stats.repairs++;
        return bt_replace(t, cp, v, n);
    }
    unsigned half = n / 2;
    bt_select(v, n, half);           /* v[half] is the median m: below it the */
    uint64_t m = v[half].key;        /* smaller keys, from it the larger      */
#ifndef NDEBUG
    /* debug: the gathered entries are partitioned at m, distinct, inside
     * C's range */
    for (unsigned k = 0; k < n; k++) {
        assert(v[k].key >= cp->lo && v[k].key <= cp->hi);
        assert(k < half ? v[k].key < m : v[k].key >= m);
        for (unsigned q = 0; q < k; q++) assert(v[q].key != v[k].key);
    }
    assert(m > cp->lo);    /* half >= 1 and keys are distinct */
#endif
    int j = bt_free_slot(t, pp);
    if (j < 0) return nvh_fail(NVH_E_CORRUPT, "btree: parent full during split (bug)");
    bt_node *n1 = bt_new_node(t, c->level, cp->lo, m - 1, v, half);
    bt_node *n2 = n1 ? bt_new_node(t, c->level, m, cp->hi, v + half, n - half) : NULL;
    if (!n2) {
        rc = nvh_errcode();
        if (n1) bt_cancel(t, n1);
        return rc;
    }
    /* 1. the separator key in a free parent slot, durable with the nodes */
    bt_wopen(t, &p->e[j].key, sizeof p->e[j].key);
    p->e[j].key = m;
    bt_note(t, &p->e[j], sizeof p->e[j]);
    bt_flush(t, &p->e[j], sizeof p->e[j]);
    bt_drain(t);
    bt_wclose(t, &p->e[j].key, sizeof p->e[j].key);
    /* 2. publish the upper half */
    nvh_off_t *link = &p->e[j].ptr;
    rc = bt_activate(t, n2, &link, 1);
    if (rc != NVH_OK) { bt_cancel(t, n1); bt_cancel(t, n2); return rc; }
    bt_ix_add(t, p, (unsigned)j, m);
    bt_ix_drop(t, c);                /* C gets a successor, then retires */
    /* 3. the lower half becomes C's successor */
    link = &c->successor;
    rc = bt_activate(t, n1, &link, 1);
    if (rc != NVH_OK) { bt_cancel(t, n1); return rc; }
    /* 4. retire C, the parent points at the lower half */
    nvh_link l = {bt_link_of(t, cp), bt_off(t, n1)};
    rc = bt_free(t, c, &l, 1);
    if (rc != NVH_OK) return rc;
    bt_ix_relink(t, cp, n1);
    t->stats.splits++;
    return NVH_OK;
}

/* A new root above the current one (one entry: [0, max] -> old root). */
static int bt_grow_root(struct nvh_btree *t, bt_path *path)
{
    bt_node *r = path[0].node;
    bt_entry e = {0, bt_off(t, r)};
    bt_node *nr = bt_new_node(t, r->level + 1, 0, UINT64_MAX, &e, 1);
    if (!nr) return nvh_errcode();
    bt_drain(t);
    nvh_off_t *link = &t->hdr->root;
    int rc = bt_activate(t, nr, &link, 1);
    if (rc != NVH_OK) { bt_cancel(t, nr); return rc; }
    path[0] = (bt_path){nr, 0, UINT64_MAX, NULL, NULL, NULL};
    path[1] = (bt_path){r, 0, UINT64_MAX, &nr->e[0], NULL, nr};
    t->stats.root_splits++;
    return NVH_OK;
}

/* ==========================================================================
 * Descent
 * ========================================================================== */
int bt_descend(struct nvh_btree *t, uint64_t key, int for_write, bt_path *path, int max)
{
    bt_node *root = bt_ptr(t, t->hdr->root);
    if (!root) {
        if (!for_write) return NVH_E_NOTFOUND;
        bt_node *n = bt_new_node(t, 0, 0, UINT64_MAX, NULL, 0);
        if (!n) return nvh_errcode();
        bt_drain(t);
        nvh_off_t *link = &t->hdr->root;
        int rc = bt_activate(t, n, &link, 1);
        if (rc != NVH_OK) { bt_cancel(t, n); return rc; }
        root = n;
    } else if (!bt_node_ok(t, root)) {
        return bt_corrupt(t, root, "root node");
    }
    path[0] = (bt_path){root, 0, UINT64_MAX, NULL, NULL, NULL};
    int d = 0;
    /* Bounded: each level costs a few steps (a repair, a split, a
     * successor); more is a damaged tree that would loop. */
    for (unsigned steps = 0;; steps++) {
        if (steps > 8 * BT_MAX_DEPTH) return bt_corrupt(t, path[d].node, "node (descent does not end)");
        bt_path *p = &path[d];
        bt_idx *x = p->ix ? p->ix : (p->ix = bt_ix(t, p->node));
        /* Every node on the path was checked (bt_node_ok) before it was
         * entered; its successor (an interrupted split's replacement) is
         * checked before a repair or a reader follows it. */
        nvh_off_t succ = x ? x->successor : p->node->successor;
        if (succ) {
            const bt_node *s = bt_ptr(t, succ);
            if (!bt_node_ok(t, s) || s->level != p->node->level)
                return bt_corrupt(t, p->node, "node's successor link");
        }
        if (for_write) {
            /* stale (interrupted split), or narrower than its effective
             * range (a crash between removing its right neighbour and
             * rebuilding it): rebuild before writing into it */
            if (!t->sorted && (x ? bt_ix_stale(x, p) : bt_stale(p) || p->node->hi < p->hi)) {
                int rc = bt_repair(t, p);
                if (rc != NVH_OK) return rc;
                p->ix = NULL;
                continue;                /* p->node changed: look again */
            }
            /* room for a separator (inner) or the entry (leaf): the
             * companion's bitmap answers inline, the call only when the
             * node is full or has no companion */
            bool room = x && x->node == p->node && (~x->used & BT_IX_MASK) != 0;
            if (!room && bt_free_slot(t, p) < 0) {
                int rc;
                if (d == 0) {
                    if (max < 3) return nvh_fail(NVH_E_CORRUPT, "btree: too deep");
                    rc = bt_grow_root(t, path);
                    if (rc != NVH_OK) return rc;
                    d = 1;
                }
                rc = bt_split(t, path, d);
                if (rc != NVH_OK) return rc;
                d--;                     /* choose the child again */
                path[d].ix = NULL;
                continue;
            }
        } else if (succ) {
            p->node = bt_ptr(t, succ);   /* checked above; its own successor next round */
            p->ix = NULL;
            continue;
        }
        bt_node *n = p->node;
        if ((x ? x->level : n->level) == 0) return d;
        int i;
        uint64_t clo, chi;
        if (t->sorted) {          /* (not n->sorted: no read of the node) */
            i = bt_child_for(n, p->lo, p->hi, key);
            if (i < 0) return nvh_fail(NVH_E_CORRUPT, "btree: no child covers key %llu",
                                       (unsigned long long)key);
            clo = n->e[i].key;
            chi = (unsigned)i + 1 < n->count ? n->e[i + 1].key - 1 : p->hi;
        } else if (x && x->successor == 0 && x->lo >= p->lo && x->hi <= p->hi && x->n) {
            /* not stale: every used entry is valid and in range, keys are
             * distinct: the child is the last key <= key */
            unsigned r = bt_ix_lower(x, key);
            if (r == x->n || bt_ixk_get(x, r) != key) {
                if (r == 0) return nvh_fail(NVH_E_CORRUPT, "btree: no child covers key %llu",
                                            (unsigned long long)key);
                r--;
            }
            i = x->u.in.slot[r];
            clo = bt_ixk_get(x, r);
            chi = r + 1 < x->n ? bt_ixk_get(x, r + 1) - 1 : p->hi;
            /* the child and its companion from the cache: no read of the
             * persistent slot, no table lookup */
            if (x->u.in.gen != t->ix_gen) bt_ix_refresh_kids(t, x);
            struct bt_kid *k = bt_ixkid(x, r);
            assert(k->node == bt_ptr(t, n->e[i].ptr));  /* kid[] kept exact */
            bt_idx *kx = k->ix;
            /* a cached companion is the child's while its node matches
             * (dropped ones have node NULL; their memory is never freed);
             * a companion is only made for a node that passed bt_node_ok */
            if (!kx || kx->node != k->node) {
                if (!bt_node_ok(t, k->node)) return bt_corrupt(t, k->node, "child node");
                kx = k->ix = bt_ix(t, k->node);
            }
            if ((kx ? kx->level : k->node->level) + 1 != x->level)
                return bt_corrupt(t, k->node, "child node (level does not fit its parent)");
            if (kx) bt_ix_prefetch(kx, x->level == 1, for_write, t->kd_off);
            /* A writer will store into one slot of the leaf: which one the
             * companion tells, but the leaf's page (a TLB miss: random
             * keys, 4 KiB pages) can be walked now, while the companion
             * is fetched, by asking for any line of it. */
            if (for_write && x->level == 1) __builtin_prefetch(k->node);
            if (d + 1 >= max) return nvh_fail(NVH_E_CORRUPT, "btree: deeper than %d levels", max);
            path[d + 1] = (bt_path){(bt_node *)k->node, clo, chi, &n->e[i], kx, n};
            d++;
            continue;
        } else {
            i = bt_child_scan(n, p->lo, p->hi, key, &chi);
            if (i < 0) return nvh_fail(NVH_E_CORRUPT, "btree: no child covers key %llu",
                                       (unsigned long long)key);
            clo = n->e[i].key;
        }
        if (d + 1 >= max) return nvh_fail(NVH_E_CORRUPT, "btree: deeper than %d levels", max);
        bt_node *c = bt_ptr(t, n->e[i].ptr);
        if (!bt_node_ok(t, c) || c->level + 1 != n->level)
            return bt_corrupt(t, c, "child node");
        path[d + 1] = (bt_path){c, clo, chi, &n->e[i], NULL, n};
        d++;
    }
}

/* ==========================================================================
 * Removal of an empty leaf (merge by deletion)
 * ========================================================================== */
int bt_remove_leaf(struct nvh_btree *t, bt_path *path, int d)
{
    if (d == 0 || t->sorted) return NVH_OK;
    bt_path *lp = &path[d], *pp = &path[d - 1];
    bt_node *p = pp->node;
    uint64_t k = lp->link->key;
    if (k == pp->lo) return NVH_OK;       /* the leftmost child stays */
    /* The left neighbour inherits the range: it must hold nothing stale
     * there (entries of an interrupted split would come back to life). */
    int left = -1;
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        bt_entry *e = &p->e[i];
        if (!e->ptr || e->key >= k || e->key < pp->lo || e->key > pp->hi) continue;
        if (left < 0 || e->key > p->e[left].key) left = (int)i;
    }
    if (left < 0) return NVH_OK;
    int rc = bt_settle_groups(t);
    if (rc != NVH_OK) return rc;
    bt_path q = {bt_ptr(t, p->e[left].ptr), 0, 0, &p->e[left], NULL, p};
    bt_child_range(p, pp->lo, pp->hi, (unsigned)left, &q.lo, &q.hi);
    if (bt_stale(&q)) {
        rc = bt_repair(t, &q);
        if (rc != NVH_OK) return rc;
    }
    nvh_link l = {&lp->link->ptr, 0};
    rc = bt_free(t, lp->node, &l, 1);
    bt_ix_del(t, p, (unsigned)(lp->link - p->e));
    if (rc != NVH_OK) return rc;
    t->stats.leaves_removed++;
    /* Keep "every entry of a node lies in its header's [lo, hi]": the
     * neighbour's range grew, so it is rebuilt with the new header before
     * it can receive keys above its old hi. Otherwise a later split of it
     * with a median above the old hi, interrupted, would leave it holding
     * duplicates that the header test of bt_stale cannot see. After a crash
     * before this rebuild, bt_descend does it (header hi < effective hi). */
    bt_child_range(p, pp->lo, pp->hi, (unsigned)left, &q.lo, &q.hi);
    bt_entry v[BT_NODE_CAP];
    unsigned n;
    rc = bt_gather(t, &q, v, &n);
    if (rc != NVH_OK) return rc;
    return bt_replace(t, &q, v, n);
}
