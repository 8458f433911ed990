/* btree_write.c — insert, update and delete of the B+ tree, in its four
 * variants (persist groups, flush, non-temporal, volatile).
 *
 * Insert (GROUPS), the paper's Change 1 and 2:
 *   reserve record R; write vkey = ~key, len, data;     ordinary stores
 *   group: add(R); leaf slot = (key, R | PENDING)        append, no shifting
 *   action (after R is durable):  activate(R, link = slot.ptr)   one fence:
 *       R allocated and the slot pointing at it, failure-atomically;
 *     R.vkey = key (the validation key), chained group on that line whose
 *     action acknowledges the op as durable.
 * A slot whose ptr still carries PENDING after a crash was never activated:
 * it is a free slot. A record whose vkey != key was never validated: it is
 * ignored and reclaimed by the next writer that finds it.
 *
 * Update: a new record R2, persisted; activate(R2, link = R1.next); R2.vkey
 * persisted; free(R1, slot.ptr -> R2). A crash in between leaves R1 -> R2
 * with R2 valid or not: readers take R2 if valid, else R1 (monotonic).
 * Delete: free(R, slot.ptr -> 0). Updates and deletes are durable when they
 * return; they first sync pending inserts so that the durable state is
 * always the state after some prefix of the operations.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "btree.h"

/* ==========================================================================
 * Helpers
 * ========================================================================== */
/* An 8-byte store that bypasses the cache (NT variant, pmem domain only:
 * in the other domains the simulator/msync must see the store). */
static inline void bt_store_nt(struct nvh_btree *t, uint64_t *dst, uint64_t v)
{
#if defined(__x86_64__)
    if (nvh_pool_domain(t->pool) == NVH_DOMAIN_PMEM) {
        __asm__ volatile("movnti %1, %0" : "=m"(*dst) : "r"(v));
        return;
    }
#endif
    *dst = v;
    nvh_flush(t->pool, dst, sizeof *dst);
}

static int bt_sync_pending(struct nvh_btree *t)
{
    if (!t->group || t->pend_used == 0) return NVH_OK;
    t->stats.syncs++;
    return nvh_btree_sync(t);
}

/* A new record (reserved, not activated) holding value; vkey = ~key. */
static bt_record *bt_new_record(struct nvh_btree *t, uint64_t key, const void *value, size_t len)
{
    bt_record *r = bt_reserve(t, sizeof *r + len);
    if (!r) return NULL;
    if (t->mode == NVH_BTREE_NT) {
        bt_store_nt(t, &r->vkey, ~key);
        bt_store_nt(t, &r->next, 0);
        bt_store_nt(t, &r->len, len);
        bt_store_nt(t, &r->pad0, 0);
        if (len) nvh_memcpy_nodrain(t->pool, r->data, value, len);
        return r;
    }
    r->vkey = t->mode == NVH_BTREE_VOLATILE ? key : ~key;
    r->next = 0;
    r->len = len;
    r->pad0 = 0;
    if (len) memcpy(r->data, value, len);
    return r;
}

/* ==========================================================================
 * Insert action (GROUPS)
 * ========================================================================== */
static void bt_insert_action(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    bt_pending *pd = arg;
    struct nvh_btree *t = pd->tree;
    nvh_off_t *link = &pd->entry->ptr;
    bt_note(t, link, sizeof *link);
    int rc = nvh_activate(pool, pd->rec, &link, 1);
    if (rc != NVH_OK) {
        /* Cannot happen short of a bug (the space was reserved); keep the
         * tree consistent and report at the next sync. */
        t->deferred_err = rc;
        pd->entry->ptr = 0;
        nvh_cancel(pool, pd->rec);
    } else {
        pd->rec->vkey = pd->key;                  /* the validation key */
    }
    nvh_group_begin(ctx);
    if (rc == NVH_OK) nvh_group_add(ctx, &pd->rec->vkey, sizeof pd->rec->vkey);
    nvh_group_end(ctx, bt_ack_fn_(), pd);
}

/* ==========================================================================
 * Leaf search
 * ========================================================================== */
/* The live entry of key in the leaf at p (or NULL); *free_slot gets a free
 * slot index or -1. Crash leftovers for this key are reclaimed on the way. */
static int bt_leaf_find(struct nvh_btree *t, bt_path *p, uint64_t key, bt_entry **found,
                        bt_record **rec, int *free_slot)
{
    bt_node *n = p->node;
    *found = NULL;
    *free_slot = -1;
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        bt_entry *e = &n->e[i];
        if (!e->ptr) {
            if (*free_slot < 0) *free_slot = (int)i;
            continue;
        }
        if (e->key != key) continue;
        bt_record *r = bt_entry_record(t, e);
        if (r) { *found = e; *rec = r; continue; }
        /* same key, dead: a crash leftover; reclaim it and reuse the slot */
        if (e->ptr & BT_PENDING) {
            e->ptr = 0;
            bt_note(t, e, sizeof *e);
            bt_flush(t, e, sizeof *e);
        } else {
            nvh_link l = {&e->ptr, 0};
            t->stats.reclaimed++;
            int rc = bt_free(t, bt_ptr(t, e->ptr), &l, 1);
            if (rc != NVH_OK) return rc;
        }
        if (*free_slot < 0) *free_slot = (int)i;
    }
    return NVH_OK;
}

/* ==========================================================================
 * Sorted (classic, volatile) variant
 * ========================================================================== */
static int bt_sorted_pos(const bt_node *n, uint64_t key, int *exact)
{
    int a = 0, b = (int)n->count;
    while (a < b) {
        int m = (a + b) / 2;
        if (n->e[m].key < key) a = m + 1; else b = m;
    }
    *exact = a < (int)n->count && n->e[a].key == key;
    return a;
}

static int bt_sorted_put(struct nvh_btree *t, bt_path *p, uint64_t key, const void *value,
                         size_t len)
{
    bt_node *n = p->node;
    int exact;
    int pos = bt_sorted_pos(n, key, &exact);
    bt_record *r = bt_new_record(t, key, value, len);
    if (!r) return nvh_errcode();
    if (exact) {
        free(bt_ptr(t, n->e[pos].ptr));
        n->e[pos].ptr = bt_off(t, r);
        bt_note(t, &n->e[pos].ptr, 8);
        return NVH_OK;
    }
    memmove(&n->e[pos + 1], &n->e[pos], (n->count - (unsigned)pos) * sizeof n->e[0]);
    n->e[pos].key = key;
    n->e[pos].ptr = bt_off(t, r);
    n->count++;
    bt_note(t, &n->e[pos], (n->count - (unsigned)pos) * sizeof n->e[0]);
    bt_note(t, n, 64);
    if (t->count >= 0) t->count++;
    return NVH_OK;
}

/* ==========================================================================
 * Update (existing live entry)
 * ========================================================================== */
static int bt_update(struct nvh_btree *t, bt_entry *e, uint64_t key, const void *value,
                     size_t len)
{
    if (t->mode == NVH_BTREE_VOLATILE) {
        bt_record *r = bt_new_record(t, key, value, len);
        if (!r) return nvh_errcode();
        free(bt_ptr(t, e->ptr));
        e->ptr = bt_off(t, r);
        bt_note(t, &e->ptr, 8);
        return NVH_OK;
    }
    /* settle an interrupted update of this entry first */
    bt_record *r1 = bt_ptr(t, e->ptr);
    if (r1->next) {
        bt_record *nx = bt_ptr(t, r1->next);
        nvh_link l;
        int rc;
        if (nx->vkey == key) {
            l = (nvh_link){&e->ptr, r1->next};
            rc = bt_free(t, r1, &l, 1);
            r1 = nx;
        } else {
            l = (nvh_link){&r1->next, 0};
            rc = bt_free(t, nx, &l, 1);
        }
        if (rc != NVH_OK) return rc;
        t->stats.repairs++;
    }
    bt_record *r2 = bt_new_record(t, key, value, len);
    if (!r2) return nvh_errcode();
    if (t->mode != NVH_BTREE_NT) nvh_flush(t->pool, r2, sizeof *r2 + len);
    nvh_drain(t->pool);
    nvh_off_t *link = &r1->next;
    int rc = nvh_activate(t->pool, r2, &link, 1);
    if (rc != NVH_OK) { nvh_cancel(t->pool, r2); return rc; }
    if (t->mode == NVH_BTREE_NT) bt_store_nt(t, &r2->vkey, key);
    else {
        r2->vkey = key;
        nvh_flush(t->pool, &r2->vkey, sizeof r2->vkey);
    }
    nvh_drain(t->pool);
    nvh_link l = {&e->ptr, bt_off(t, r2)};
    bt_note(t, &e->ptr, 8);
    return bt_free(t, r1, &l, 1);
}

/* ==========================================================================
 * Put
 * ========================================================================== */
int nvh_btree_put(nvh_btree *t, uint64_t key, const void *value, size_t len)
{
    if (!t || (!value && len)) return nvh_fail(NVH_E_INVAL, "btree: tree or value is NULL");
    if (t->deferred_err) return nvh_btree_sync(t);
    bt_path path[BT_MAX_DEPTH];
    int d = bt_descend(t, key, 1, path, BT_MAX_DEPTH);
    if (d < 0) return d;
    uint64_t seq = ++t->ops;
    if (t->sorted) return bt_sorted_put(t, &path[d], key, value, len);
    bt_entry *e;
    bt_record *old = NULL;
    int slot, rc = bt_leaf_find(t, &path[d], key, &e, &old, &slot);
    if (rc != NVH_OK) return rc;
    if (e) {
        if (t->mode != NVH_BTREE_VOLATILE && t->pend_used) {
            rc = bt_sync_pending(t);
            if (rc != NVH_OK) return rc;
        }
        rc = bt_update(t, e, key, value, len);
        if (rc == NVH_OK) bt_ack_(t, seq);
        return rc;
    }
    if (slot < 0) return nvh_fail(NVH_E_CORRUPT, "btree: leaf full after descent (bug)");
    e = &path[d].node->e[slot];
    bt_record *r = bt_new_record(t, key, value, len);
    if (!r) return nvh_errcode();
    if (t->count >= 0) t->count++;
    switch (t->mode) {
    case NVH_BTREE_VOLATILE:
        e->key = key;
        e->ptr = bt_off(t, r);
        bt_note(t, e, sizeof *e);
        return NVH_OK;
    case NVH_BTREE_FLUSH:
    case NVH_BTREE_NT: {
        /* record and slot key durable, then activation publishes, then the
         * validation key */
        if (t->mode == NVH_BTREE_FLUSH) nvh_flush(t->pool, r, sizeof *r + len);
        e->key = key;
        bt_note(t, e, sizeof *e);
        nvh_flush(t->pool, e, sizeof *e);
        nvh_drain(t->pool);
        nvh_off_t *link = &e->ptr;
        rc = nvh_activate(t->pool, r, &link, 1);
        if (rc != NVH_OK) { nvh_cancel(t->pool, r); if (t->count > 0) t->count--; return rc; }
        if (t->mode == NVH_BTREE_NT) bt_store_nt(t, &r->vkey, key);
        else {
            r->vkey = key;
            nvh_flush(t->pool, &r->vkey, sizeof r->vkey);
        }
        nvh_drain(t->pool);
        bt_ack_(t, seq);
        return NVH_OK;
    }
    case NVH_BTREE_GROUPS:
    default: {
        if (t->pend_used == t->pend_cap) {
            rc = bt_sync_pending(t);
            if (rc != NVH_OK) { nvh_cancel(t->pool, r); return rc; }
        }
        bt_pending *pd = &t->pend[t->pend_next];
        t->pend_next = (t->pend_next + 1) % t->pend_cap;
        t->pend_used++;
        *pd = (bt_pending){t, e, r, key, seq, 1};
        rc = nvh_group_begin(t->group);
        if (rc != NVH_OK) return rc;
        nvh_group_add(t->group, r, sizeof *r + len);
        /* the slot: key, then the pending pointer (one line: ordered). The
         * slot is part of the group: the allocator's replay restores an
         * activation's link only if the link still holds its pre-activation
         * value (R | PENDING) on the media, and since it defers flushing
         * link lines to its next fence, that value must be durable before
         * the activation (the crash test found the window). */
        e->key = key;
        e->ptr = bt_off(t, r) | BT_PENDING;
        bt_note(t, e, sizeof *e);
        nvh_group_add(t->group, e, sizeof *e);
        return nvh_group_end(t->group, bt_insert_action, pd);
    }
    }
}

/* ==========================================================================
 * Delete
 * ========================================================================== */
int nvh_btree_delete(nvh_btree *t, uint64_t key)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "btree: tree is NULL");
    if (t->deferred_err) return nvh_btree_sync(t);
    if (!t->hdr->root) return nvh_fail(NVH_E_NOTFOUND, "btree: key %llu not found", (unsigned long long)key);
    int rc = bt_sync_pending(t);
    if (rc != NVH_OK) return rc;
    bt_path path[BT_MAX_DEPTH];
    int d = bt_descend(t, key, 1, path, BT_MAX_DEPTH);
    if (d < 0) return d;
    bt_node *n = path[d].node;
    if (t->sorted) {
        int exact, pos = bt_sorted_pos(n, key, &exact);
        if (!exact) return nvh_fail(NVH_E_NOTFOUND, "btree: key %llu not found", (unsigned long long)key);
        t->ops++;
        free(bt_ptr(t, n->e[pos].ptr));
        memmove(&n->e[pos], &n->e[pos + 1], (n->count - (unsigned)pos - 1) * sizeof n->e[0]);
        n->count--;
        bt_note(t, &n->e[pos], (n->count - (unsigned)pos + 1) * sizeof n->e[0]);
        bt_note(t, n, 64);
        if (t->count > 0) t->count--;
        return NVH_OK;
    }
    bt_entry *e;
    bt_record *r;
    int slot;
    rc = bt_leaf_find(t, &path[d], key, &e, &r, &slot);
    if (rc != NVH_OK) return rc;
    if (!e) return nvh_fail(NVH_E_NOTFOUND, "btree: key %llu not found", (unsigned long long)key);
    uint64_t seq = ++t->ops;
    bt_record *r1 = bt_ptr(t, e->ptr);
    if (t->pool && r1->next) {
        /* interrupted update: drop the newer version first */
        nvh_link l = {&r1->next, 0};
        rc = bt_free(t, bt_ptr(t, r1->next), &l, 1);
        if (rc != NVH_OK) return rc;
    }
    nvh_link l = {&e->ptr, 0};
    rc = bt_free(t, r1, &l, 1);
    if (rc != NVH_OK) return rc;
    if (t->count > 0) t->count--;
    bt_ack_(t, seq);
    /* merge by deletion: an empty leaf leaves the tree */
    int empty = 1;
    for (unsigned i = 0; i < BT_NODE_CAP && empty; i++) {
        bt_entry *x = &n->e[i];
        if (x->ptr && !(x->ptr & BT_PENDING) && x->key >= path[d].lo && x->key <= path[d].hi) empty = 0;
    }
    if (empty) return bt_remove_leaf(t, path, d);
    return NVH_OK;
}
