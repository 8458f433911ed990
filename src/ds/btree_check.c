/* btree_check.c — the B+ tree's invariant checker (nvh_btree_check), the
 * eager reclaim walk (nvh_btree_reclaim) and the wear counter that counts
 * stores per 64 B line of node memory ([Moraru11] Fig. 5).
 */
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "btree.h"

/* ==========================================================================
 * Wear counter: line address -> stores (open addressing, linear probing)
 * ========================================================================== */
static int bt_wear_grow(bt_wear *w)
{
    uint64_t ncap = w->cap ? w->cap * 2 : 1u << 16;
    uint64_t *nk = calloc(ncap, sizeof *nk), *nc = calloc(ncap, sizeof *nc);
    if (!nk || !nc) { free(nk); free(nc); return -1; }
    for (uint64_t i = 0; i < w->cap; i++) {
        if (!w->keys[i]) continue;
        uint64_t h = (w->keys[i] >> 6) * 0x9E3779B97F4A7C15ull & (ncap - 1);
        while (nk[h]) h = (h + 1) & (ncap - 1);
        nk[h] = w->keys[i];
        nc[h] = w->counts[i];
    }
    free(w->keys);
    free(w->counts);
    w->keys = nk;
    w->counts = nc;
    w->cap = ncap;
    return 0;
}

void bt_wear_note(struct nvh_btree *t, const void *addr, size_t len)
{
    bt_wear *w = t->wear;
    if (!len) return;
    uint64_t first = (uint64_t)(uintptr_t)addr & ~63ull;
    uint64_t last = ((uint64_t)(uintptr_t)addr + len - 1) & ~63ull;
    for (uint64_t line = first; line <= last; line += 64) {
        if ((w->used + 1) * 2 > w->cap && bt_wear_grow(w) != 0) return;
        uint64_t h = (line >> 6) * 0x9E3779B97F4A7C15ull & (w->cap - 1);
        while (w->keys[h] && w->keys[h] != line) h = (h + 1) & (w->cap - 1);
        if (!w->keys[h]) { w->keys[h] = line; w->used++; }
        w->counts[h]++;
    }
}

uint64_t nvh_btree_wear_foreach(const nvh_btree *t, void (*fn)(uint64_t writes, void *arg),
                                void *arg)
{
    if (!t || !t->wear) return 0;
    for (uint64_t i = 0; i < t->wear->cap; i++)
        if (t->wear->keys[i] && fn) fn(t->wear->counts[i], arg);
    return t->wear->used;
}

/* ==========================================================================
 * Corruption reports
 * ========================================================================== */
int bt_corrupt(const struct nvh_btree *t, const void *where, const char *what)
{
    uint64_t hdr = t->pool ? nvh_off(t->pool, t->hdr) : 0;
    uint64_t off = t->pool ? nvh_off(t->pool, where) : (uint64_t)(uintptr_t)where;
    return nvh_fail(NVH_E_CORRUPT, "btree (header at offset %llu): corrupt %s at offset %llu",
                    (unsigned long long)hdr, what, (unsigned long long)off);
}

/* ==========================================================================
 * Invariant checker
 * ========================================================================== */
typedef struct bt_check_state {
    uint64_t live;
    uint64_t last_key;
    int have_last;
} bt_check_state;

static int bt_obj_ok(struct nvh_btree *t, const void *p, size_t need)
{
    if (!t->pool) return p != NULL;
    if (!nvh_contains(t->pool, p, need)) return 0;
    return nvh_usable_size(t->pool, p) >= need;
}

static int bt_cmp_key(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int bt_check_node(struct nvh_btree *t, bt_node *n, uint64_t lo, uint64_t hi, int level,
                         bt_check_state *st)
{
    /* n passed bt_node_ok (the caller checked it before reading it) */
    for (int hops = 0; n->successor; hops++) {
        bt_node *s = bt_ptr(t, n->successor);
        if (hops > 1 || !bt_node_ok(t, s) || !bt_obj_ok(t, s, sizeof *n))
            return bt_corrupt(t, n, "node's successor link (btree check)");
        n = s;
    }
    if (level >= 0 && (int)n->level != level)
        return nvh_fail(NVH_E_CORRUPT, "btree check: node level %u, expected %d", n->level, level);
    if (lo > hi || n->lo > lo) return nvh_fail(NVH_E_CORRUPT, "btree check: bad node range");
    unsigned limit = n->sorted ? n->count : BT_NODE_CAP;
    if (limit > BT_NODE_CAP) return nvh_fail(NVH_E_CORRUPT, "btree check: bad count");
    /* every valid entry lies in the header's range (what bt_stale relies on) */
    for (unsigned i = 0; i < limit; i++) {
        const bt_entry *e = &n->e[i];
        if (!e->ptr || e->key < lo || e->key > hi) continue;
        if (e->key < n->lo || e->key > n->hi)
            return nvh_fail(NVH_E_CORRUPT, "btree check: key %llu outside the node's header range",
                            (unsigned long long)e->key);
    }
    if (n->level == 0) {
        uint64_t keys[BT_NODE_CAP];
        unsigned k = 0;
        for (unsigned i = 0; i < limit; i++) {
            bt_entry *e = &n->e[i];
            if (!e->ptr || e->key < lo || e->key > hi) continue;
            if ((e->ptr & BT_PENDING) && !bt_pending_has(t, e)) continue;
            bt_record *v = n->sorted ? bt_ptr(t, e->ptr) : bt_entry_record(t, e);
            if (!v) continue;            /* never validated: a free slot */
            if (!bt_rec_ok(t, v)) return bt_corrupt(t, &e->ptr, "leaf entry (btree check: "
                                                    "record pointer outside the pool)");
            if (t->pool ? !nvh_contains(t->pool, v, sizeof *v) || !bt_slab_check_record(t, v)
                        : !bt_obj_ok(t, v, sizeof *v))
                return nvh_fail(NVH_E_CORRUPT, "btree check: key %llu -> record outside its slab",
                                (unsigned long long)e->key);
            keys[k++] = e->key;
        }
        qsort(keys, k, sizeof keys[0], bt_cmp_key);
        for (unsigned i = 0; i < k; i++) {
            if (st->have_last && keys[i] <= st->last_key)
                return nvh_fail(NVH_E_CORRUPT, "btree check: key %llu duplicated or out of order",
                                (unsigned long long)keys[i]);
            st->last_key = keys[i];
            st->have_last = 1;
        }
        st->live += k;
        return NVH_OK;
    }
    bt_entry v[BT_NODE_CAP];
    unsigned k = 0;
    for (unsigned i = 0; i < limit; i++) {
        bt_entry *e = &n->e[i];
        if (!e->ptr || e->key < lo || e->key > hi) continue;
        if (!bt_node_ok(t, bt_ptr(t, e->ptr)) || !bt_obj_ok(t, bt_ptr(t, e->ptr), sizeof(bt_node)))
            return bt_corrupt(t, &e->ptr, "inner entry (btree check: child pointer is not a node)");
        v[k++] = *e;
    }
    qsort(v, k, sizeof v[0], bt_cmp_key);
    if (k == 0 || v[0].key != lo)
        return nvh_fail(NVH_E_CORRUPT, "btree check: inner node without a child at its low bound");
    for (unsigned i = 0; i < k; i++) {
        if (i && v[i].key == v[i - 1].key)
            return nvh_fail(NVH_E_CORRUPT, "btree check: two children with the same bound");
        uint64_t chi = i + 1 < k ? v[i + 1].key - 1 : hi;
        int rc = bt_check_node(t, bt_ptr(t, v[i].ptr), v[i].key, chi, (int)n->level - 1, st);
        if (rc != NVH_OK) return rc;
    }
    return NVH_OK;
}

int nvh_btree_check(nvh_btree *t)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "btree: tree is NULL");
    bt_header *h = t->hdr;
    if (h->magic != BT_MAGIC_TREE || h->version != BT_VERSION)
        return nvh_fail(NVH_E_CORRUPT, "btree check: bad header");
    bt_node *root = bt_ptr(t, h->root);
    if (!root) return NVH_OK;
    if (!bt_node_ok(t, root) || !bt_obj_ok(t, root, sizeof *root))
        return bt_corrupt(t, root, "root node (btree check)");
    bt_check_state st = {0, 0, 0};
    int rc = bt_check_node(t, root, 0, UINT64_MAX, -1, &st);
    if (rc != NVH_OK) return rc;
    if (t->count >= 0 && (uint64_t)t->count != st.live)
        return nvh_fail(NVH_E_CORRUPT, "btree check: count %lld, %llu live keys",
                        (long long)t->count, (unsigned long long)st.live);
    return NVH_OK;
}

/* ==========================================================================
 * Eager reclaim: repair every interrupted split, free every dead record
 * ========================================================================== */
static int bt_reclaim_node(struct nvh_btree *t, bt_path *p)
{
    const bt_node *s = bt_ptr(t, p->node->successor);
    if (s && (!bt_node_ok(t, s) || s->level != p->node->level))
        return bt_corrupt(t, p->node, "node's successor link");
    if (!t->sorted && (bt_stale(p) || p->node->hi < p->hi)) {
        int rc = bt_repair(t, p);
        if (rc != NVH_OK) return rc;
    }
    bt_node *n = p->node;
    if (n->level == 0) {
        if (t->sorted) return NVH_OK;
        int rc = bt_reclaim_leaf(t, p);
        if (rc != NVH_OK || !t->pool) return rc;
        for (unsigned i = 0; i < BT_NODE_CAP; i++) {
            const bt_entry *e = &n->e[i];
            if (!e->ptr || (e->ptr & BT_PENDING) || e->key < p->lo || e->key > p->hi) continue;
            if (!bt_rec_ok(t, bt_ptr(t, e->ptr))) return bt_corrupt(t, &e->ptr, "leaf entry (record pointer)");
            bt_slab_count(t, bt_ptr(t, e->ptr));
        }
        return NVH_OK;
    }
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        bt_entry *e = &n->e[i];
        if (!e->ptr || e->key < p->lo || e->key > p->hi) continue;
        if (n->sorted && i >= n->count) break;
        bt_path c = {bt_ptr(t, e->ptr), 0, 0, e, NULL, n};
        if (!bt_node_ok(t, c.node) || c.node->level + 1 != n->level)
            return bt_corrupt(t, c.node, "child node");
        if (n->sorted) {
            c.lo = e->key;
            c.hi = i + 1 < n->count ? n->e[i + 1].key - 1 : p->hi;
        } else {
            bt_child_range(n, p->lo, p->hi, i, &c.lo, &c.hi);
        }
        int rc = bt_reclaim_node(t, &c);
        if (rc != NVH_OK) return rc;
    }
    return NVH_OK;
}

/* Repair every interrupted split, free every leftover slot, and count the
 * live records of every slab (those of earlier sessions included), freeing
 * the slabs that hold none. A split that repairs a node only copies entries
 * (records are never moved), so counting during the walk is exact. */
int nvh_btree_reclaim(nvh_btree *t)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "btree: tree is NULL");
    int rc = bt_check_write(t);
    if (rc == NVH_OK) rc = nvh_btree_sync(t);
    if (rc != NVH_OK) return rc;
    if (t->pool) {
        rc = bt_slab_recount_begin(t);
        if (rc != NVH_OK) return rc;
    }
    bt_node *root = bt_ptr(t, t->hdr->root);
    if (root && !bt_node_ok(t, root)) return bt_corrupt(t, root, "root node");
    if (root) {
        bt_path p = {root, 0, UINT64_MAX, NULL, NULL, NULL};
        rc = bt_reclaim_node(t, &p);
    }
    if (rc == NVH_OK && t->pool) rc = bt_slab_free_empty(t);
    if (rc == NVH_OK && t->pool) nvh_drain(t->pool);
    return rc;
}
