/* btree_write.c — insert, update and delete of the B+ tree, in its four
 * variants (persist groups, flush, non-temporal, volatile).
 *
 * Insert (GROUPS), the paper's Change 1 and 2:
 *   carve record R from the current slab; write len, data   ordinary stores
 *   leaf slot = (key, R | PENDING)             append into a free slot
 *   group {R, slot}; action (after a fence made both durable):
 *     slot.ptr = R       the validation: one 8-byte store, written only
 *                        after the record AND the slot's key are durable,
 *                        flushed; the action of any later group (after
 *                        the next fence) acknowledges the op as durable.
 * No allocator call and no fence of its own: records live in slabs
 * (btree_slab.c), ~1/32 fence per insert (the group layer's batch).
 * A slot whose ptr still carries PENDING after a crash was never validated:
 * it is a free slot, its record garbage inside a slab.
 *
 * Update: R2 written and persisted (fence), slot.ptr = R2 persisted (fence):
 * an 8-byte store replaces the version failure-atomically. Delete: slot.ptr
 * = 0 persisted ("deletes null the pointer"). Both first sync pending
 * inserts and are durable when they return.
 *
 * Durability on return (the default, NVH_BTREE_DURABLE_ON_RETURN): a GROUPS
 * tree has no group context then and an insert takes the flush variant's
 * path: record and slot key flushed, fence, the validation flushed, fence
 * (the validation must follow durable data, so two fences are the least).
 *
 * Deferred durability (NVH_BTREE_DURABLE_DEFERRED, opt-in), below.
 * Durability of inserts: each is atomic and is durable once acknowledged;
 * inserts still in flight at a crash survive or not independently of each
 * other (their validations are batched, not ordered by a fence each), so a
 * crash recovers every op <= durable() plus any subset of the inserts issued
 * after it (updates and deletes sync first, so they are never in flight
 * together with an earlier insert). What was recoverable once stays so.
 *
 * Protection: every store into the pool sits in a write window opened just
 * before it and closed once it is durable (records: at the group action;
 * slots: at the ack).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "btree.h"

/* ==========================================================================
 * Helpers
 * ========================================================================== */
/* An 8-byte store that bypasses the cache (NT variant, pmem domain only:
 * in the other domains the simulator/msync must see the store). Not with
 * CLFLUSH: nvh_drain then issues no SFENCE, which a streamed store needs to
 * be ordered and durable, so the word is stored and flushed instead. */
static inline void bt_store_nt(struct nvh_btree *t, uint64_t *dst, uint64_t v)
{
#if defined(__x86_64__)
    if (nvh_pool_domain(t->pool) == NVH_DOMAIN_PMEM &&
        NVH_CTX_(t->pool)->flush_kind != NVH_FLUSH_CLFLUSH) {
        __asm__ volatile("movnti %1, %0" : "=m"(*dst) : "r"(v));
        return;
    }
#endif
    *dst = v;
    nvh_flush(t->pool, dst, sizeof *dst);
}

/* A word of the pool in the tree's persistent variant: NT store, or store
 * and flush (not fenced). */
static inline void bt_store_persist(struct nvh_btree *t, uint64_t *dst, uint64_t v)
{
    if (t->mode == NVH_BTREE_NT) { bt_store_nt(t, dst, v); return; }
    *dst = v;
    nvh_flush(t->pool, dst, sizeof *dst);
}

static int bt_sync_pending(struct nvh_btree *t)
{
    if (!t->group || t->pend_used == 0) return NVH_OK;
    t->stats.syncs++;
    return nvh_btree_sync(t);
}

static inline size_t bt_rec_size(size_t len) { return sizeof(bt_record) + len; }

/* Values of at least this many bytes are streamed with non-temporal stores
 * in the groups variant (pmem domain), all but the record's first line.
 * Streaming loses to copy + CLWB for small values, breaks even at 512 B and
 * wins from 1 KiB (4 KiB: about half the insert time); the measurements are
 * in docs/BTREE.md, "Alternatives measured". */
#define BT_NT_VALUE_MIN 1024u

/* A new record (not referenced yet) holding value, its write window open;
 * in the NT variant written with streaming stores, else ordinary stores
 * (not flushed) — except a large value in the groups variant, streamed past
 * the first line. *to_flush: the bytes from the record's start that are
 * still to be flushed (not fenced) for it to be durable. */
static bt_record *bt_new_record(struct nvh_btree *t, const void *value, size_t len,
                                size_t *to_flush)
{
    bt_record *r = bt_rec_new(t, len);        /* writable: held slab or its own window */
    if (!r) return NULL;
    *to_flush = bt_rec_size(len);
    if (t->mode == NVH_BTREE_NT) {
        /* r->slab was stored by bt_rec_new: stream the header line whole */
        bt_store_nt(t, &r->len, len);
        bt_store_nt(t, &r->slab, r->slab);
        if (len) nvh_memcpy_nodrain(t->pool, r->data, value, len);
        *to_flush = 0;
        return r;
    }
    r->len = len;
    if (t->mode == NVH_BTREE_GROUPS && len >= BT_NT_VALUE_MIN) {
        /* the header's line with ordinary stores (the caller flushes it);
         * the rest, line-aligned (records are 64 B aligned), streamed in
         * the pmem domain — elsewhere, or if NVHEAP_NT_THRESHOLD says so,
         * copied and flushed: the same order, which the crash simulator
         * checks (the insert's group fence makes both durable before the
         * validation) */
        const size_t first = NVH_CACHELINE - sizeof *r;
        assert(((uintptr_t)r & (NVH_CACHELINE - 1)) == 0);
        memcpy(r->data, value, first);
        nvh_memcpy_nodrain(t->pool, r->data + first, (const char *)value + first, len - first);
        *to_flush = NVH_CACHELINE;
        return r;
    }
    if (len) memcpy(r->data, value, len);
    return r;
}

/* ==========================================================================
 * Insert actions (GROUPS)
 * ========================================================================== */
/* The record and the slot's key are durable: validate. The validation is
 * flushed here and becomes durable at the next fence, which the group layer
 * issues before the action of any group that begins after this point: so
 * every later insert's action acknowledges the inserts validated before its
 * group began (bt_ack_upto; nvh_btree_sync and structural changes fence
 * and acknowledge the rest). One group per insert: a group of its own for
 * the validation word cost ~500 instructions per insert in the group layer
 * (begin, add, end, retirement) for what one flush and the next, shared,
 * fence do. */
static void bt_insert_action(nvh_pool *pool, nvh_group_ctx *ctx, void *arg)
{
    (void)pool; (void)ctx;
    bt_pending *pd = arg;
    struct nvh_btree *t = pd->tree;
    /* validations flushed before this group began are durable now */
    bt_ack_upto(t, pd->vmark);
    if (pd->rsize) bt_wclose(t, pd->rec, pd->rsize);
    pd->entry->ptr = bt_off(t, pd->rec);          /* the validation */
    bt_ix_validated(pd);                          /* lookups may skip the slot */
    bt_note(t, &pd->entry->ptr, sizeof pd->entry->ptr);
    bt_flush(t, &pd->entry->ptr, sizeof pd->entry->ptr);
    /* The slot's last store is done: its window closes now, not at the
     * ack. The flush needs no write permission (CLWB/CLFLUSHOPT, msync and
     * the simulator only read the line), and the page's window-cache line
     * is still at hand from the open in nvh_btree_put: closed at the ack,
     * an insert later, it would be a cache miss (docs/BTREE.md). */
    bt_wclose_way(t, pd->entry, sizeof *pd->entry, &pd->way);
    /* actions run in begin order: the validated inserts are the oldest of
     * the ring */
    assert(pd == &t->pend[(t->pend_next + t->pend_cap - t->pend_used + t->pend_valid) & (t->pend_cap - 1)]);
    pd->vno = ++t->vdone;
    t->pend_valid++;
    /* the next action's slot (actions run in begin order, often several in
     * a row: group_run_ready): its window-cache line, fetched while this
     * action finishes (pr_tc_hit 2.9 % -> 2.55 % of protected samples) */
    if (t->pool && t->pend_valid < t->pend_used)
        nvh_protect_prefetch_(t->pool, t->pend[(t->pend_next + t->pend_cap - t->pend_used + t->pend_valid) &
                                               (t->pend_cap - 1)].entry);
    if (__builtin_expect(t->fault & BT_FAULT_ACK_EARLY, 0)) bt_ack_upto(t, pd->vno);
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
    bt_idx *x = p->ix && p->ix->node == n ? p->ix : (p->ix = bt_ix(t, n));
    /* candidates: the used slots whose fingerprint matches (companion), or
     * every slot */
    uint64_t m = x ? bt_ix_match(x, key) : ((1ull << BT_NODE_CAP) - 1);
    for (; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctzll(m);
        /* a fingerprint collision (~1 in 6 inserts into a 40-entry leaf)
         * is settled by the companion's key if it keeps slots (no read of
         * another line), else by the node's */
        if (x && x->slots && x->u.lf.s[i].key != key) continue;
        bt_entry *e = &n->e[i];
        assert(!x || !x->slots || !e->ptr || e->key == x->u.lf.s[i].key);   /* kept exact */
        if (!e->ptr) {
            if (*free_slot < 0) *free_slot = (int)i;
            continue;
        }
        if (e->key != key) continue;
        bt_record *r = bt_entry_record(t, e);
        if (r) { *found = e; *rec = r; continue; }
        /* same key, never validated: a crash leftover, the slot is free */
        bt_entry_clear(t, n, i);
        if (*free_slot < 0) *free_slot = (int)i;
    }
    if (x && *free_slot < 0) *free_slot = bt_ix_free_slot(x, 0);
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
    size_t to_flush;
    bt_record *r = bt_new_record(t, value, len, &to_flush);
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
 * Update (existing live entry; pending inserts already synced)
 * ========================================================================== */
static int bt_update(struct nvh_btree *t, const bt_node *n, bt_entry *e, const void *value,
                     size_t len)
{
    bt_record *r1 = bt_ptr(t, e->ptr);
    size_t to_flush;
    bt_record *r2 = bt_new_record(t, value, len, &to_flush);
    if (!r2) return nvh_errcode();
    if (t->mode == NVH_BTREE_VOLATILE) {
        e->ptr = bt_off(t, r2);
        bt_note(t, &e->ptr, 8);
        bt_ix_hint(t, n, (unsigned)(e - n->e));
        bt_kd_set(t, e->key, bt_rec_word(e->ptr, bt_rec_size(len)));
        return bt_rec_release(t, r1);
    }
    /* the new version durable, then one 8-byte store switches to it */
    if (to_flush) nvh_flush(t->pool, r2, to_flush);
    nvh_drain(t->pool);
    if (t->rec_win) bt_wclose(t, r2, bt_rec_size(len));
    bt_wopen(t, &e->ptr, sizeof e->ptr);
    bt_note(t, &e->ptr, 8);
    bt_store_persist(t, &e->ptr, bt_off(t, r2));
    nvh_drain(t->pool);
    bt_wclose(t, &e->ptr, sizeof e->ptr);
    bt_ix_hint(t, n, (unsigned)(e - n->e));
    bt_kd_set(t, e->key, bt_rec_word(e->ptr, bt_rec_size(len)));
    return bt_rec_release(t, r1);
}

/* ==========================================================================
 * Put
 * ========================================================================== */
int nvh_btree_put(nvh_btree *t, uint64_t key, const void *value, size_t len)
{
    if (!t || (!value && len)) return nvh_fail(NVH_E_INVAL, "btree: tree or value is NULL");
    int rc0 = bt_check_write(t);
    if (rc0 != NVH_OK) return rc0;
    if (len > NVH_BTREE_VALUE_MAX)
        return nvh_fail(NVH_E_TOOLONG, "btree '%s': value of %zu bytes, the limit is %zu", t->name,
                        len, (size_t)NVH_BTREE_VALUE_MAX);
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
        rc = bt_update(t, path[d].node, e, value, len);
        if (rc == NVH_OK) bt_ack_(t, seq);
        return rc;
    }
    if (slot < 0) return nvh_fail(NVH_E_CORRUPT, "btree: leaf full after descent (bug)");
    e = &path[d].node->e[slot];
    /* the slot's line (a cache and TLB miss: random keys) is fetched while
     * the record is written */
    __builtin_prefetch(e, 1);
    /* ... and so is the protection layer's window-cache line for its page
     * (protected pools: the slot's window opens below) */
    if (t->pool) nvh_protect_prefetch_(t->pool, e);
    size_t to_flush;
    bt_record *r = bt_new_record(t, value, len, &to_flush);
    if (!r) return nvh_errcode();
    if (t->count >= 0) t->count++;
    /* durable on return: the groups tree without a group, i.e. every
     * step flushed and fenced before the next */
    switch (t->mode == NVH_BTREE_GROUPS && !t->group ? NVH_BTREE_FLUSH : t->mode) {
    case NVH_BTREE_VOLATILE:
        e->key = key;
        e->ptr = bt_off(t, r);
        bt_note(t, e, sizeof *e);
        bt_ix_add_leaf(t, path[d].ix, path[d].node, (unsigned)slot, key, e->ptr, bt_rec_size(len));
        bt_kd_add(t, key, bt_rec_word(e->ptr, bt_rec_size(len)));
        return NVH_OK;
    case NVH_BTREE_FLUSH:
    case NVH_BTREE_NT: {
        /* record and slot key durable, then the validation: the pointer */
        if (to_flush) nvh_flush(t->pool, r, to_flush);
        bt_wopen(t, e, sizeof *e);
        bt_note(t, e, sizeof *e);
        bt_store_persist(t, &e->key, key);
        nvh_drain(t->pool);
        if (t->rec_win) bt_wclose(t, r, bt_rec_size(len));
        bt_store_persist(t, &e->ptr, bt_off(t, r));
        if (__builtin_expect(!(t->fault & BT_FAULT_NO_VALIDATION_FENCE), 1)) nvh_drain(t->pool);
        bt_wclose(t, e, sizeof *e);
        bt_ix_add_leaf(t, path[d].ix, path[d].node, (unsigned)slot, key, bt_off(t, r), bt_rec_size(len));
        bt_kd_add(t, key, bt_rec_word(bt_off(t, r), bt_rec_size(len)));
        bt_ack_(t, seq);
        return NVH_OK;
    }
    case NVH_BTREE_GROUPS:
    default: {
        if (t->pend_used == t->pend_cap) {
            rc = bt_sync_pending(t);
            if (rc != NVH_OK) return rc;
        }
        bt_pending *pd = &t->pend[t->pend_next];
        t->pend_next = (t->pend_next + 1) & (t->pend_cap - 1);
        t->pend_used++;
        *pd = (bt_pending){t, e, r, t->rec_win ? bt_rec_size(len) : 0, key, seq, 1, path[d].node,
                           NULL, t->vdone, 0, 0};
        rc = nvh_group_begin(t->group);
        if (rc != NVH_OK) return rc;
        nvh_group_add(t->group, r, to_flush);
        /* the slot: key and the pending pointer, durable with the record;
         * the action then writes the bare pointer (the validation). The
         * leaf's companion remembers where the window cache keeps its page,
         * and the pending insert takes that over for the close. */
        bt_idx *x = path[d].ix && path[d].ix->node == path[d].node ? path[d].ix : NULL;
        pd->way = x ? x->win_way : 0;
        bt_wopen_way(t, e, sizeof *e, &pd->way);
        if (x) x->win_way = pd->way;
        e->key = key;
        e->ptr = bt_off(t, r) | BT_PENDING;
        if (__builtin_expect(t->fault & BT_FAULT_VALIDATE_EARLY, 0)) e->ptr = bt_off(t, r);
        bt_note(t, e, sizeof *e);
        pd->ix = bt_ix_add_leaf(t, path[d].ix, path[d].node, (unsigned)slot, key, e->ptr,
                                bt_rec_size(len));
        /* Lookups see this session's pending inserts (bt_entry_record), so
         * the directory takes the key now (buffered: bt_kd_add). */
        bt_kd_add(t, key, bt_rec_word(bt_off(t, r), bt_rec_size(len)));
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
    int rc0 = bt_check_write(t);
    if (rc0 != NVH_OK) return rc0;
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
    bt_wopen(t, &e->ptr, sizeof e->ptr);
    bt_note(t, &e->ptr, 8);
    if (t->pool) {
        bt_store_persist(t, &e->ptr, 0);
        nvh_drain(t->pool);
    } else {
        e->ptr = 0;
    }
    bt_wclose(t, &e->ptr, sizeof e->ptr);
    bt_ix_del(t, n, (unsigned)(e - n->e));
    bt_kd_del(t, key);
    rc = bt_rec_release(t, r);
    if (rc != NVH_OK) return rc;
    if (t->count > 0) t->count--;
    bt_ack_(t, seq);
    /* merge by deletion: an empty leaf leaves the tree */
    bt_idx *x = bt_ix_find(t, n);
    if (x && x->used && !(x->lo < path[d].lo || x->hi > path[d].hi)) {
        /* not stale: a used slot without PENDING is a live entry */
        for (uint64_t m = x->used; m; m &= m - 1)
            if (!(n->e[__builtin_ctzll(m)].ptr & BT_PENDING)) return NVH_OK;
    }
    int empty = 1;
    for (unsigned i = 0; i < BT_NODE_CAP && empty; i++) {
        bt_entry *x = &n->e[i];
        if (x->ptr && !(x->ptr & BT_PENDING) && x->key >= path[d].lo && x->key <= path[d].hi) empty = 0;
    }
    if (empty) return bt_remove_leaf(t, path, d);
    return NVH_OK;
}
