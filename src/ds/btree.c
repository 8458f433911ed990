/* btree.c — the consistent B+ tree: open/create/close, the variants'
 * allocation and persistence helpers, lookup, ordered scan, count.
 *
 * Readers never repair anything: they follow the `successor` of a node whose
 * split was interrupted and ignore entries outside a node's effective key
 * range (the range its parent gives it), so an interrupted split's duplicate
 * entries are invisible. Writers repair what they reach (btree_split.c).
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../common/internal.h"
#include "btree.h"

/* ==========================================================================
 * Errors
 * ========================================================================== */
static int bt_fail(int code, const char *msg)
{
    nvh_fail(code, "btree: %s", msg);
    return code;
}

/* ==========================================================================
 * Allocation in the tree's variant
 * ========================================================================== */
void *bt_reserve(struct nvh_btree *t, size_t size)
{
    if (!t->pool) {
        size_t sz = (size + NVH_ALLOC_ALIGN - 1) & ~(size_t)(NVH_ALLOC_ALIGN - 1);
        void *p = aligned_alloc(NVH_ALLOC_ALIGN, sz);
        if (!p) nvh_fail(NVH_E_NOMEM, "btree: out of memory");
        return p;
    }
    return nvh_reserve(t->pool, size);
}

/* Pre-fault fresh pool memory in one call (btree.h says why and when). */
void bt_prefault(struct nvh_btree *t, const void *p, size_t len)
{
    if (t->pool) nvh_pool_populate_fresh_(t->pool, p, len);
}

/* Nodes are reserved BT_NODE_BATCH at a time and each gets its write window
 * at once, instead of one by one as splits need them. Why: a new node lands
 * on a fresh page (the allocator carves 1 KiB nodes from its runs in order)
 * and, in a protected pool, the first store to a fresh page costs a fault
 * (async) or an mprotect (sync, eager): ~0.018 per insert of 256 B values,
 * the largest cost of async protection once the record slabs were held.
 * With the batch's windows open together, the first store's fault finds
 * the neighbouring pages wanted too and makes the whole run writable in one
 * mprotect (src/protect/fault.c, resolve_open_window): one fault per 4
 * pages. A node's window is opened with its batch, not by bt_new_node:
 * taking a node hands its window to the caller. Reservations are DRAM only: after a
 * crash the batch is free again, so the media never sees it. In a
 * protected pool the batch is BT_NODE_BATCH_HELD (64 nodes, 16 pages: one
 * fault per 16 pages). Exposure: reserved nodes are writable before they
 * are used (at most 63 KiB of the tree's own not-yet-live memory). */
static void bt_nres_refill(struct nvh_btree *t)
{
    t->nres_head = t->nres_n = 0;
    t->nres_epoch = nvh_protect_epoch_(t->pool);
    unsigned batch = t->nres_epoch ? BT_NODE_BATCH_HELD : BT_NODE_BATCH;
    for (unsigned i = 0; i < batch; i++) {
        void *n = nvh_reserve(t->pool, BT_NODE_SIZE);
        if (!n) break;                   /* pool full: hand out what we got */
        t->nres[t->nres_n++] = n;
    }
    if (t->nres_n == 0) return;
    /* hand them out in address order (the allocator usually gives a run) */
    for (unsigned i = 1; i < t->nres_n; i++)
        for (unsigned j = i; j > 0 && (uintptr_t)t->nres[j - 1] > (uintptr_t)t->nres[j]; j--) {
            void *x = t->nres[j];
            t->nres[j] = t->nres[j - 1];
            t->nres[j - 1] = x;
        }
    if (!t->nres_epoch) {
        /* unprotected: pre-fault the run's fresh pages in one call */
        const char *lo = t->nres[0], *hi = (const char *)t->nres[t->nres_n - 1] + BT_NODE_SIZE;
        if ((size_t)(hi - lo) <= 2u * t->nres_n * BT_NODE_SIZE) bt_prefault(t, lo, (size_t)(hi - lo));
        return;
    }
    /* Sync and eager modes apply an unprotect at once, one page per call: a
     * momentary window over the batch's whole span first makes it one
     * mprotect (the node windows opened under it are then nested count
     * updates, and closing the span changes nothing while they are open).
     * Only for a compact batch: the span may cover allocator headers or
     * other objects between the nodes for those few instructions. */
    const char *lo = t->nres[0], *hi = (const char *)t->nres[t->nres_n - 1] + BT_NODE_SIZE;
    bool span = (size_t)(hi - lo) <= 2u * t->nres_n * BT_NODE_SIZE;
    if (span) nvh_protect_open_(t->pool, lo, (size_t)(hi - lo));
    for (unsigned i = 0; i < t->nres_n; i++) nvh_protect_open_(t->pool, t->nres[i], BT_NODE_SIZE);
    if (span) nvh_protect_close_(t->pool, lo, (size_t)(hi - lo));
}

void *bt_node_take(struct nvh_btree *t)
{
    if (!t->pool) return bt_reserve(t, BT_NODE_SIZE);
    if (t->nres_head == t->nres_n) {
        bt_nres_refill(t);
        if (t->nres_n == 0) return NULL;          /* nvh_reserve's error stands */
    }
    void *n = t->nres[t->nres_head++];
    /* its window was opened in another protection epoch (or while off): it
     * is gone, open the node's own */
    if (t->nres_epoch != nvh_protect_epoch_(t->pool)) bt_wopen(t, n, BT_NODE_SIZE);
    return n;
}

/* Close: give the unused reservations back. */
static void bt_nres_fini(struct nvh_btree *t)
{
    if (!t->pool) return;
    bool open = t->nres_epoch && t->nres_epoch == nvh_protect_epoch_(t->pool);
    for (unsigned i = t->nres_head; i < t->nres_n; i++) {
        if (open) bt_wclose(t, t->nres[i], BT_NODE_SIZE);
        nvh_cancel(t->pool, t->nres[i]);
    }
    t->nres_head = t->nres_n = 0;
}

void bt_cancel(struct nvh_btree *t, void *p)
{
    bt_ix_drop(t, p);
    if (!t->pool) { free(p); return; }
    bt_wclose(t, p, BT_NODE_SIZE);
    nvh_cancel(t->pool, p);
}

int bt_activate(struct nvh_btree *t, void *p, nvh_off_t *const links[], unsigned n)
{
    /* (a parent's cached child, if a link is one, is updated by the
     * caller: bt_ix_add / bt_ix_relink) */
    for (unsigned i = 0; i < n; i++) bt_note(t, links[i], sizeof *links[i]);
    if (!t->pool) {
        for (unsigned i = 0; i < n; i++) *links[i] = bt_off(t, p);
        return NVH_OK;
    }
    for (unsigned i = 0; i < n; i++) bt_wopen(t, links[i], sizeof *links[i]);
    int rc = nvh_activate(t->pool, p, links, n);
    for (unsigned i = 0; i < n; i++) bt_wclose(t, links[i], sizeof *links[i]);
    /* the node (written by bt_new_node, its window open) is durable */
    if (rc == NVH_OK) bt_wclose(t, p, BT_NODE_SIZE);
    return rc;
}

int bt_free(struct nvh_btree *t, void *p, const nvh_link *links, unsigned n)
{
    bt_ix_drop(t, p);                /* nodes only: their companion goes too;
                                        the caller updates the parent's kid */
    for (unsigned i = 0; i < n; i++) bt_note(t, links[i].link, sizeof *links[i].link);
    if (!t->pool) {
        for (unsigned i = 0; i < n; i++) *links[i].link = links[i].value;
        free(p);
        return NVH_OK;
    }
    for (unsigned i = 0; i < n; i++) bt_wopen(t, links[i].link, sizeof *links[i].link);
    int rc = nvh_free(t->pool, p, links, n);
    for (unsigned i = 0; i < n; i++) bt_wclose(t, links[i].link, sizeof *links[i].link);
    return rc;
}

/* ==========================================================================
 * Entries and ranges
 * ========================================================================== */
int bt_pending_has(const struct nvh_btree *t, const bt_entry *e)
{
    for (unsigned k = 0; k < t->pend_used; k++) {
        const bt_pending *pd = &t->pend[(t->pend_next + t->pend_cap - t->pend_used + k) & (t->pend_cap - 1)];
        if (pd->entry == e && (bt_off(t, pd->rec) | BT_PENDING) == e->ptr) return 1;
    }
    return 0;
}

bt_record *bt_entry_record(const struct nvh_btree *t, const bt_entry *e)
{
    nvh_off_t p = e->ptr;
    if (!p) return NULL;
    if (p & BT_PENDING) {
        /* Ours if this session wrote it (the record is durable soon, its
         * validation pending); else a crash leftover whose validation never
         * became durable: the slot is free. */
        return bt_pending_has(t, e) ? bt_ptr(t, p & ~BT_PENDING) : NULL;
    }
    return bt_ptr(t, p);
}

void bt_child_range(const bt_node *n, uint64_t lo, uint64_t hi, unsigned i,
                    uint64_t *clo, uint64_t *chi)
{
    uint64_t k = n->e[i].key, next = hi;
    int have = 0;
    for (unsigned j = 0; j < BT_NODE_CAP; j++) {
        const bt_entry *e = &n->e[j];
        if (!e->ptr || e->key <= k || e->key > hi || e->key < lo) continue;
        if (!have || e->key - 1 < next) { next = e->key - 1; have = 1; }
    }
    *clo = k;
    *chi = next;
}

int bt_child_for(const bt_node *n, uint64_t lo, uint64_t hi, uint64_t key)
{
    int best = -1;
    if (n->sorted) {
        /* classic variant: binary search for the last key <= key */
        int a = 0, b = (int)n->count - 1;
        while (a <= b) {
            int m = (a + b) / 2;
            if (n->e[m].key <= key) { best = m; a = m + 1; }
            else b = m - 1;
        }
        return best;
    }
    for (unsigned j = 0; j < BT_NODE_CAP; j++) {
        const bt_entry *e = &n->e[j];
        if (!e->ptr || e->key > key || e->key < lo || e->key > hi) continue;
        if (best < 0 || e->key > n->e[best].key) best = (int)j;
    }
    return best;
}

/* ==========================================================================
 * Open / close
 * ========================================================================== */
#define BT_NAME_MAX 40u

static void bt_name(char *buf, const char *name)
{
    snprintf(buf, NVH_NAME_MAX + 1, "nvh.btree.%s", name);
}

static int bt_header_init(nvh_pool *pool, void *p, size_t size, void *arg)
{
    (void)pool; (void)arg;
    memset(p, 0, size);
    bt_header *h = p;
    h->magic = BT_MAGIC_TREE;
    h->version = BT_VERSION;
    h->node_size = BT_NODE_SIZE;
    return 0;
}


/* Free a handle that open built but does not hand out. */
static void bt_discard(struct nvh_btree *t)
{
    if (t->group) nvh_group_ctx_destroy(t->group);
    free(t->pend);
    if (t->wear) { free(t->wear->keys); free(t->wear->counts); free(t->wear); }
    free(t);
}

static int bt_hook_close(nvh_pool_hook *hook, int check_only);

nvh_btree *nvh_btree_open(nvh_pool *pool, const char *name, int create,
                          const nvh_btree_options *options)
{
    nvh_btree_options def = {0};
    if (!options) options = &def;
    if (!name || !*name || strlen(name) > BT_NAME_MAX) {
        bt_fail(NVH_E_INVAL, "tree name must be 1..40 bytes");
        return NULL;
    }
    if (options->mode > NVH_BTREE_VOLATILE || (options->sorted && options->mode != NVH_BTREE_VOLATILE)) {
        bt_fail(NVH_E_INVAL, "bad options (sorted nodes exist only in the volatile variant)");
        return NULL;
    }
    if (options->durability > NVH_BTREE_DURABLE_DEFERRED) {
        bt_fail(NVH_E_INVAL, "bad options (durability)");
        return NULL;
    }
    if (!pool && options->mode != NVH_BTREE_VOLATILE) {
        bt_fail(NVH_E_INVAL, "pool is NULL");
        return NULL;
    }
    struct nvh_btree *t = calloc(1, sizeof *t);
    if (!t) { bt_fail(NVH_E_NOMEM, "out of memory"); return NULL; }
    t->mode = options->mode;
    t->sorted = options->sorted;
    t->owner = pthread_self();
    snprintf(t->name, sizeof t->name, "%s", name);
    /* deferred durability exists only where a later fence can carry it */
    t->durability = options->mode == NVH_BTREE_GROUPS ? options->durability : NVH_BTREE_DURABLE_ON_RETURN;
    t->kd_off = options->no_key_directory != 0;
    t->kd_state = t->kd_off || t->sorted ? BT_KD_READY : BT_KD_IDLE;
    t->count = -1;
    t->slab_idx = t->si_head = t->si_freelist = -1;
    t->ix_gen = 1;                   /* companions start at gen 0: kids unknown */
    if (options->count_wear) {
        t->wear = calloc(1, sizeof *t->wear);
        if (!t->wear) goto nomem;
    }
    if (t->mode == NVH_BTREE_VOLATILE) {
        /* DRAM: offsets are plain addresses (base 0). */
        t->pool = NULL;
        t->base = 0;
        t->hdr = calloc(1, sizeof *t->hdr);
        if (!t->hdr) goto nomem;
        bt_header_init(NULL, t->hdr, sizeof *t->hdr, NULL);
        t->count = 0;
        return t;
    }
    t->pool = pool;
    t->readonly = pool->readonly;
    t->base = (uintptr_t)nvh_pool_base(pool);
    char full[NVH_NAME_MAX + 1];
    bt_name(full, name);
    bt_header *h = nvh_get_named(pool, full, NULL);
    if (!h) {
        if (!create) {
            nvh_fail(NVH_E_NOTFOUND, "btree: no tree named '%s' in the pool", name);
            goto fail;
        }
        if (t->readonly) {
            nvh_fail(NVH_E_READONLY, "btree: cannot create '%s': the pool is open read-only", name);
            goto fail;
        }
        h = nvh_reserve_named(pool, full, sizeof *h);
        if (!h) goto fail;
        nvh_protect_open_(pool, h, sizeof *h);
        bt_header_init(pool, h, sizeof *h, NULL);
        nvh_persist(pool, h, sizeof *h);
        nvh_protect_close_(pool, h, sizeof *h);
        if (nvh_activate_named(pool, full) != NVH_OK) goto fail;
        t->count = 0;
    } else if (!nvh_contains(pool, h, sizeof *h) || ((uintptr_t)h & 63) ||
               h->magic != BT_MAGIC_TREE || h->version != BT_VERSION ||
               h->node_size != BT_NODE_SIZE) {
        /* The header's own bytes decide, not the allocator's size for it:
         * an object in a region whose header was damaged and quarantined
         * reads as size 0 but is intact, and the tree above it must stay
         * reachable (nvheap check --repair). */
        nvh_fail(NVH_E_CORRUPT, "btree: '%s' (header at offset %llu) is not a B+ tree of "
                 "this version", name, (unsigned long long)nvh_off(pool, h));
        goto fail;
    } else if (h->root && !bt_node_ok(t, bt_ptr(t, h->root))) {
        /* nothing below a damaged root is reachable: refuse rather than
         * hand out a tree whose every operation fails */
        nvh_fail(NVH_E_CORRUPT, "btree: '%s' (header at offset %llu): root node at offset "
                 "%llu is not a node", name, (unsigned long long)nvh_off(pool, h),
                 (unsigned long long)h->root);
        goto fail;
    }
    t->hdr = h;
    if (t->mode == NVH_BTREE_GROUPS && t->durability == NVH_BTREE_DURABLE_DEFERRED && !t->readonly) {
        t->group = nvh_group_ctx_create(pool, options->group);
        if (!t->group) goto fail;
        nvh_group_options go;
        nvh_group_options_get(t->group, &go);
        /* One group per insert: up to `slots` inserts wait for their
         * action, and up to a batch of validated ones for a later action
         * (bt_ack_upto); keep room for a few more. */
        t->pend_cap = 16;                /* a power of two: ring index by mask */
        while (t->pend_cap < 2 * go.slots + 8) t->pend_cap *= 2;
        t->pend = calloc(t->pend_cap, sizeof *t->pend);
        if (!t->pend) goto nomem;
    }
    /* One handle per tree and process: two writers on one tree would each
     * believe their DRAM state (companions, pending inserts, slabs). */
    t->hook.key = h;
    t->hook.close = bt_hook_close;
    nvh_pool_hook *got = nvh_pool_hook_add_(pool, &t->hook);
    if (got != &t->hook) {
        struct nvh_btree *x = (struct nvh_btree *)(void *)((char *)got - offsetof(struct nvh_btree, hook));
        bool same = x->mode == t->mode && x->durability == t->durability &&
                    x->kd_off == t->kd_off && (x->wear != NULL) == (t->wear != NULL) &&
                    pthread_equal(x->owner, t->owner);
        bt_discard(t);
        if (same) return x;
        nvh_pool_hook_del_(pool, got);
        nvh_fail(NVH_E_BUSY, "btree '%s' is open already in this process %s", name,
                 pthread_equal(x->owner, pthread_self())
                     ? "with other options (open it again with the same options, or close it first)"
                     : "by another thread (a tree is not thread-safe: use it from the thread that "
                       "opened it)");
        return NULL;
    }
    if (!t->readonly) bt_slab_adopt(t);
    return t;
nomem:
    bt_fail(NVH_E_NOMEM, "out of memory");
fail:
    bt_discard(t);
    return NULL;
}

static void bt_free_volatile(struct nvh_btree *t, bt_node *n)
{
    if (!n) return;
    if (n->level > 0) {
        for (unsigned i = 0; i < BT_NODE_CAP; i++)
            if (n->e[i].ptr && (!n->sorted || i < n->count)) bt_free_volatile(t, bt_ptr(t, n->e[i].ptr));
    } else {
        for (unsigned i = 0; i < BT_NODE_CAP; i++)
            if (n->e[i].ptr && (!n->sorted || i < n->count)) free(bt_ptr(t, n->e[i].ptr));
    }
    free(n);
}

/* Free the handle now (sync first), whatever its references. */
static int bt_close_now(struct nvh_btree *t)
{
    int rc = NVH_OK;
    if (t->group) {
        rc = nvh_btree_sync(t);
        int rc2 = nvh_group_ctx_destroy(t->group);
        if (rc == NVH_OK) rc = rc2;
    }
    if (!t->pool) {
        bt_free_volatile(t, bt_ptr(t, t->hdr->root));
        free(t->hdr);
    }
    free(t->pend);
    bt_nres_fini(t);
    if (t->pool && !t->readonly) bt_slab_close(t);
    bt_slab_fini(t);
    bt_ix_fini(t);
    bt_kd_fini(t);
    if (t->wear) { free(t->wear->keys); free(t->wear->counts); free(t->wear); }
    free(t);
    return rc;
}

/* nvh_pool_close with the tree still open: every completed operation made
 * durable, then closed. A deferred tree's persist-group context belongs to
 * the opening thread: from another thread the pool refuses to close. */
static int bt_hook_close(nvh_pool_hook *hook, int check_only)
{
    struct nvh_btree *t = (struct nvh_btree *)(void *)((char *)hook - offsetof(struct nvh_btree, hook));
    if (check_only) {
        if (t->group && !pthread_equal(t->owner, pthread_self()))
            return nvh_fail(NVH_E_BUSY, "btree '%s' (deferred durability) is open in another "
                            "thread: close it there before the pool", t->name);
        return NVH_OK;
    }
    return bt_close_now(t);
}

int nvh_btree_close(nvh_btree *t)
{
    if (!t) return NVH_OK;
    int rc = bt_check_thread(t);
    if (rc != NVH_OK) return rc;
    if (t->pool && nvh_pool_hook_del_(t->pool, &t->hook) > 0) return NVH_OK;
    return bt_close_now(t);
}

int bt_thread_error(const struct nvh_btree *t)
{
    return nvh_fail(NVH_E_BUSY, "btree '%s': called from a thread other than the one that "
                    "opened it; a B+ tree is not thread-safe: use it from that thread only",
                    t->name);
}

int bt_check_write(const struct nvh_btree *t)
{
    if (__builtin_expect(t->readonly, 0))
        return nvh_fail(NVH_E_READONLY, "btree '%s': the pool is open read-only", t->name);
    return bt_check_thread(t);
}

/* ==========================================================================
 * Durability bookkeeping
 * ========================================================================== */
void bt_set_durable_(struct nvh_btree *t, uint64_t seq)
{
    if (seq <= t->durable) return;
    t->durable = seq;
    if (t->durable_fn) t->durable_fn(t, seq, t->durable_arg);
}

void bt_ack_(struct nvh_btree *t, uint64_t seq)
{
    if (t->pend_used == 0) bt_set_durable_(t, seq);
}

void bt_ack_upto(struct nvh_btree *t, uint64_t mark)
{
    while (t->pend_valid) {
        bt_pending *pd = &t->pend[(t->pend_next + t->pend_cap - t->pend_used) & (t->pend_cap - 1)];
        assert(pd->used && pd->vno);
        if (pd->vno > mark) return;
        pd->used = 0;
        t->pend_used--;
        t->pend_valid--;
        bt_set_durable_(t, pd->seq);
    }
}

void bt_ack_validated(struct nvh_btree *t)
{
    if (!t->pend_valid) return;
    bt_drain(t);
    bt_ack_upto(t, UINT64_MAX);
}

int nvh_btree_sync(nvh_btree *t)
{
    if (!t) return bt_fail(NVH_E_INVAL, "tree is NULL");
    int rc0 = bt_check_thread(t);
    if (rc0 != NVH_OK) return rc0;
    if (t->group) {
        int rc = nvh_group_sync(t->group);
        if (rc != NVH_OK) return rc;
        bt_ack_validated(t);
    }
    if (t->deferred_err) {
        int rc = t->deferred_err;
        t->deferred_err = 0;
        return bt_fail(rc, "an insert failed in its group action (pool full?)");
    }
    if (t->pend_used == 0) bt_set_durable_(t, t->ops);
    return NVH_OK;
}

uint64_t nvh_btree_ops(const nvh_btree *t) { return t ? t->ops : 0; }
void nvh_btree_debug_fault_(nvh_btree *t, unsigned faults)
{
    if (t) t->fault = faults;
}
uint64_t nvh_btree_durable(const nvh_btree *t) { return t ? t->durable : 0; }
void nvh_btree_set_durable_fn(nvh_btree *t, nvh_btree_durable_fn fn, void *arg)
{
    if (!t) return;
    t->durable_fn = fn;
    t->durable_arg = arg;
}
void nvh_btree_stats_get(const nvh_btree *t, nvh_btree_stats *s)
{
    if (!t || !s) return;
    /* the buffered entries may be keys the table holds already: apply
     * them for an exact count (the tree is not const, only this view) */
    if (t->kd_nbuf) bt_kd_apply((struct nvh_btree *)(uintptr_t)t);
    *s = t->stats;
    s->directory_keys = t->kd_used;
    s->directory_state = t->kd_state;
}
nvh_group_ctx *nvh_btree_group(const nvh_btree *t) { return t ? t->group : NULL; }

/* ==========================================================================
 * Lookup
 * ========================================================================== */
/* Find the live leaf entry of key (read-only descent). NULL if absent, or
 * with *err set to the descent's error (NVH_E_CORRUPT: a damaged node on
 * the way). */
static bt_entry *bt_find(struct nvh_btree *t, uint64_t key, bt_record **rec, int *err)
{
    bt_path path[BT_MAX_DEPTH];
    int d = bt_descend(t, key, 0, path, BT_MAX_DEPTH);
    if (d < 0) {
        *err = d;
        return NULL;
    }
    bt_node *n = path[d].node;
    if (t->sorted) {
        int a = 0, b = (int)n->count - 1;
        while (a <= b) {
            int m = (a + b) / 2;
            if (n->e[m].key == key) { *rec = bt_ptr(t, n->e[m].ptr); return &n->e[m]; }
            if (n->e[m].key < key) a = m + 1; else b = m - 1;
        }
        return NULL;
    }
    if (key < path[d].lo || key > path[d].hi) return NULL;
    bt_idx *x = path[d].ix ? path[d].ix : bt_ix(t, n);
    if (x && x->slots) {
        for (uint64_t m = bt_ix_match(x, key); m; m &= m - 1) {
            unsigned i = (unsigned)__builtin_ctzll(m);
            const struct bt_lslot *ls = &x->u.lf.s[i];
            if (ls->key != key) continue;            /* fingerprint collision */
            uint64_t w = ls->rec;
            if (w && !(w & BT_PENDING)) {
                /* A validated entry: the companion (kept exact by every
                 * store to the slot) names its record, so nothing of the
                 * node is read — the slot's line was a second TLB and
                 * cache miss. Ask for the whole record (the caller reads
                 * the value): its lines, up to 8; 2 if not known. */
                const char *r = bt_ptr(t, w & ~(uint64_t)63);
                unsigned lines = (unsigned)(w >> 1) & 31u;
                if (!lines) lines = 2;
                if (lines > 8) lines = 8;
                for (unsigned k = 0; k < lines; k++) __builtin_prefetch(r + 64 * k);
                assert(n->e[i].key == key && (const char *)bt_entry_record(t, &n->e[i]) == r);
                *rec = (bt_record *)(uintptr_t)r;
                return &n->e[i];
            }
            /* pending (this session's insert, or a crash leftover) or not
             * known: the node decides */
            bt_entry *e = &n->e[i];
            if (e->key != key) continue;
            bt_record *r = bt_entry_record(t, e);
            if (r) { *rec = r; return e; }
        }
        return NULL;
    }
    /* the fingerprints' candidates (a companion without slots), or every
     * slot: the node decides */
    for (uint64_t m = x ? bt_ix_match(x, key) : BT_IX_MASK; m; m &= m - 1) {
        bt_entry *e = &n->e[__builtin_ctzll(m)];
        if (e->key != key || !e->ptr) continue;
        bt_record *r = bt_entry_record(t, e);
        if (r) { *rec = r; return e; }
    }
    return NULL;
}

/* The lookup's fast path: companions only, no path array, no read of the
 * pool but the record. 1: found (*rec), 0: absent, -1: something the
 * companions do not settle (a node not indexed or stale, cached children
 * out of date, an entry pending or whose record word is not known): ask
 * bt_find. Its loop is what makes lookups overlap: a lookup's last miss
 * (the record) is still outstanding while the next lookup's descent runs,
 * if that descent is short enough to fit in the core's reorder window
 * (~256 instructions): the general descent ran ~1000. */
static int bt_find_fast(struct nvh_btree *t, uint64_t key, bt_record **rec)
{
    const bt_node *root = bt_ptr(t, t->hdr->root);
    if (!root || t->sorted) return -1;
    bt_idx *x = t->ix_root;
    if (!x || x->node != root) {
        /* a node gets a companion only once it is known valid: the general
         * path reports a damaged one */
        if (!bt_node_ok(t, root) || !(x = t->ix_root = bt_ix(t, root))) return -1;
    }
    uint64_t lo = 0, hi = UINT64_MAX;
    while (x->level) {
        /* stale (interrupted split, wider header range), or children not
         * cached for this generation: the general path */
        if (x->successor || x->lo < lo || x->hi > hi || !x->n || x->u.in.gen != t->ix_gen)
            return -1;
        unsigned r = bt_ix_lower(x, key);
        if (r == x->n || bt_ixk_get(x, r) != key) {
            if (!r) return -1;
            r--;
        }
        uint64_t clo = bt_ixk_get(x, r);
        hi = r + 1 < x->n ? bt_ixk_get(x, r + 1) - 1 : hi;
        lo = clo;
        struct bt_kid *k = bt_ixkid(x, r);
        bt_idx *kx = k->ix;
        if (!kx || kx->node != k->node) {
            if (!bt_node_ok(t, k->node) || !(kx = k->ix = bt_ix(t, k->node))) return -1;
        }
        if (kx->level + 1 != x->level) return -1;  /* damaged: bt_find reports it */
        bt_ix_prefetch(kx, x->level == 1, 0, t->kd_off);
        x = kx;
    }
    if (x->successor || x->lo < lo || x->hi > hi) return -1;
    uint64_t m = bt_ix_match(x, key);
    if (!x->slots) {
        /* fingerprints only (a tree with the key directory): the matching
         * slots are read from the node; a validated entry names its
         * record, anything else goes to the general path */
        const bt_node *n = x->node;
        for (; m; m &= m - 1) {
            const bt_entry *e = &n->e[__builtin_ctzll(m)];
            if (e->key != key) continue;         /* fingerprint collision */
            nvh_off_t p = e->ptr;
            if (!p || (p & BT_PENDING)) return -1;
            const char *r = bt_ptr(t, p);
            __builtin_prefetch(r);
            __builtin_prefetch(r + 64);
            *rec = (bt_record *)(uintptr_t)r;
            return 1;
        }
        return 0;                                /* used slots are exact */
    }
    for (; m; m &= m - 1) {
        const struct bt_lslot *ls = &x->u.lf.s[__builtin_ctzll(m)];
        if (ls->key != key) continue;            /* fingerprint collision */
        uint64_t w = ls->rec;
        if (!w || (w & BT_PENDING)) return -1;   /* the node decides */
        const char *r = bt_ptr(t, w & ~(uint64_t)63);
        unsigned lines = (unsigned)(w >> 1) & 31u;
        if (!lines) lines = 2;
        if (lines > 8) lines = 8;
        for (unsigned q = 0; q < lines; q++) __builtin_prefetch(r + 64 * q);
        *rec = (bt_record *)(uintptr_t)r;
        return 1;
    }
    return 0;                                    /* used slots are exact */
}

/* The key directory's build (btree.h, BT_KD_*): the first lookup starts it,
 * each lookup while it runs adds the live entries of the next few leaves in
 * key order. A leaf is found by a read-only descent for the cursor key (no
 * sibling links to follow; the descent runs through the companions); its
 * effective range [lo, hi] says where the next one starts. What the build
 * adds is what a lookup would find (bt_find: live entries in range, this
 * session's pending inserts included); entries the build has not reached
 * yet are found by descending, as before. Writes during the build maintain
 * the directory as always, so it is exact at every step. */
static void bt_kd_build_leaf(struct nvh_btree *t, const bt_path *p)
{
    const bt_node *n = p->node;
    const bt_idx *x = p->ix;
    for (unsigned i = 0; i < BT_NODE_CAP; i++) {
        const bt_entry *e = &n->e[i];
        if (!e->ptr || e->key < p->lo || e->key > p->hi) continue;
        bt_record *r = bt_entry_record(t, e);
        if (!r) continue;                          /* a crash leftover */
        /* the companion's word if it has one; else the record's lines
         * are left unknown (0: lookups do not prefetch it), as they are
         * for entries whose companion a split rebuilt: reading each record
         * for its size cost ~40-60 ns per lookup of a 1 M-entry tree (a
         * cache and TLB miss per record), and a lookup that reads the
         * value's first and last line was ~15% slower with all 5 lines of
         * a 256 B record prefetched than with none */
        uint64_t w = x && x->level == 0 && x->node == n && x->slots && x->u.lf.s[i].key == e->key
                         && (x->u.lf.s[i].rec & ~(uint64_t)BT_PENDING) != 0
                         && bt_ptr(t, x->u.lf.s[i].rec & ~(uint64_t)63) == (void *)r
                     ? x->u.lf.s[i].rec
                     : bt_rec_word(bt_off(t, r), 0);
        bt_kd_add(t, e->key, w);   /* buffered: the table's misses overlap */
    }
}

static void bt_kd_progress(struct nvh_btree *t)
{
    if (t->kd_state == BT_KD_IDLE) {
        t->kd_state = BT_KD_BUILDING;
        t->kd_cursor = 0;
        if (t->count >= 0) bt_kd_reserve(t, (uint64_t)t->count);
    }
    bt_path path[BT_MAX_DEPTH];
    for (unsigned k = 0; k < BT_KD_BUILD_LEAVES; k++) {
        int d = bt_descend(t, t->kd_cursor, 0, path, BT_MAX_DEPTH);
        if (d < 0) {          /* an empty tree (or an error: the directory is a
                                 cache, lookups it misses still descend) */
            t->kd_state = BT_KD_READY;
            return;
        }
        if (!path[d].ix) path[d].ix = bt_ix(t, path[d].node);
        if (!(t->fault & BT_FAULT_KD_SKIP_LEAF) || (k & 1)) bt_kd_build_leaf(t, &path[d]);
        if (path[d].hi == UINT64_MAX) {
            t->kd_state = BT_KD_READY;
            return;
        }
        t->kd_cursor = path[d].hi + 1;
    }
}

int nvh_btree_get(nvh_btree *t, uint64_t key, const void **value, size_t *len)
{
    if (!t) return bt_fail(NVH_E_INVAL, "tree is NULL");
    int trc = bt_check_thread(t);
    if (trc != NVH_OK) return trc;
    if (__builtin_expect(t->kd_state != BT_KD_READY, 0)) bt_kd_progress(t);
    bt_record *r = NULL;
    uint64_t w = bt_kd_get(t, key);
    if (w) {
        /* the key directory knows the record: one probe, no descent */
        r = bt_ptr(t, w & ~(uint64_t)63);
        unsigned lines = (unsigned)(w >> 1) & 31u;
        if (lines > 8) lines = 8;
        for (unsigned q = 0; q < lines; q++) __builtin_prefetch((const char *)r + 64 * q);
#ifndef NDEBUG
        /* debug: the directory is exact — in an intact tree; in a damaged
         * one (duplicate keys, keys outside their node) the two may differ,
         * which is corruption, not a reason to abort */
        bt_record *r2 = NULL;
        int err2 = NVH_OK;
        if (!bt_find(t, key, &r2, &err2) || r2 != r)
            return bt_corrupt(t, r, "tree (the key directory and a descent disagree)");
#endif
        goto found;
    }
    int f = bt_find_fast(t, key, &r);
#ifndef NDEBUG
    if (f >= 0) {
        /* debug: the fast path agrees with the general one */
        bt_record *r2 = NULL;
        int err2 = NVH_OK;
        bt_entry *e2 = bt_find(t, key, &r2, &err2);
        if (f ? !e2 || r2 != r : e2 != NULL)       /* see above: damage, not a bug */
            return bt_corrupt(t, r, "tree (the fast and the general lookup disagree)");
    }
#endif
    if (f > 0) {
        /* a validated entry (the fast path takes no other) */
        if (!bt_rec_ok(t, r)) return bt_corrupt(t, r, "value record");
        bt_kd_set(t, key, bt_rec_word(bt_off(t, r), sizeof *r + r->len));
        goto checked;
    }
    int err = NVH_OK;
    bt_entry *e = f == 0 ? NULL : bt_find(t, key, &r, &err);
    if (!e) {
        if (err != NVH_OK && err != NVH_E_NOTFOUND) return err;
        nvh_fail(NVH_E_NOTFOUND, "btree: key %llu not found", (unsigned long long)key);
        return NVH_E_NOTFOUND;
    }
    if (!bt_rec_ok(t, r)) return bt_corrupt(t, r, "value record");
    if (!(e->ptr & BT_PENDING)) bt_kd_set(t, key, bt_rec_word(bt_off(t, r), sizeof *r + r->len));
    goto checked;
found:
    /* the directory's and the fast path's records come from the media too */
    if (!bt_rec_ok(t, r)) return bt_corrupt(t, r, "value record");
checked:
    if (value) *value = r->data;
    if (len) *len = (size_t)r->len;
    return NVH_OK;
}

/* ==========================================================================
 * Ordered scan
 * ========================================================================== */
static int bt_entry_cmp(const void *a, const void *b)
{
    uint64_t x = ((const bt_entry *)a)->key, y = ((const bt_entry *)b)->key;
    return x < y ? -1 : x > y;
}

/* A walk's arguments, and the first damage it met (bt_corrupt's code; the
 * walk skips a damaged node or record and goes on with the rest). */
typedef struct bt_walk_ctx {
    uint64_t from, to;
    nvh_btree_scan_fn fn;
    void *arg;
    uint64_t *counted;       /* count instead of calling fn */
    int err;
} bt_walk_ctx;

/* Walk the subtree of n (effective range [lo, hi]) in key order. n is a
 * valid node (bt_node_ok); `level` is the level its parent expects (-1 for
 * the root), so the recursion is at most BT_MAX_DEPTH deep. */
static int bt_walk(struct nvh_btree *t, bt_node *n, uint64_t lo, uint64_t hi, int level,
                   bt_walk_ctx *w)
{
    /* an interrupted split leaves at most one successor to follow */
    for (unsigned hops = 0; n->successor; hops++) {
        bt_node *s = bt_ptr(t, n->successor);
        if (hops > 1 || !bt_node_ok(t, s) || s->level != n->level) {
            int rc = bt_corrupt(t, n, "node's successor link");
            if (w->err == NVH_OK) w->err = rc;
            return 0;
        }
        n = s;
    }
    if (level >= 0 && n->level != (unsigned)level) {
        int rc = bt_corrupt(t, n, "node (level does not fit its parent)");
        if (w->err == NVH_OK) w->err = rc;
        return 0;
    }
    bt_entry v[BT_NODE_CAP];
    bt_record *recs[BT_NODE_CAP];
    unsigned k = 0;
    unsigned limit = n->sorted ? n->count : BT_NODE_CAP;
    if (limit > BT_NODE_CAP) limit = BT_NODE_CAP;
    uint64_t from = w->from, to = w->to;
    if (n->level == 0) {
        for (unsigned i = 0; i < limit; i++) {
            bt_entry *e = &n->e[i];
            if (!e->ptr || e->key < lo || e->key > hi || e->key < from || e->key > to) continue;
            bt_record *r = n->sorted ? bt_ptr(t, e->ptr) : bt_entry_record(t, e);
            if (!r) continue;
            if (!bt_rec_ok(t, r)) {
                int rc = bt_corrupt(t, &e->ptr, "leaf entry (record pointer)");
                if (w->err == NVH_OK) w->err = rc;
                continue;
            }
            v[k].key = e->key;
            v[k].ptr = (nvh_off_t)k;     /* index into recs after sorting */
            recs[k++] = r;
        }
        if (w->counted) { *w->counted += k; return 0; }
        if (!n->sorted) qsort(v, k, sizeof v[0], bt_entry_cmp);
        for (unsigned i = 0; i < k; i++) {
            bt_record *r = recs[v[i].ptr];
            int rc = w->fn(v[i].key, r->data, (size_t)r->len, w->arg);
            if (rc) return rc;
        }
        return 0;
    }
    for (unsigned i = 0; i < limit; i++) {
        bt_entry *e = &n->e[i];
        if (!e->ptr || e->key < lo || e->key > hi) continue;
        v[k++] = *e;
    }
    if (!n->sorted) qsort(v, k, sizeof v[0], bt_entry_cmp);
    for (unsigned i = 0; i < k; i++) {
        uint64_t clo = v[i].key, chi = i + 1 < k ? v[i + 1].key - 1 : hi;
        if (chi < from || clo > to) continue;
        bt_node *c = bt_ptr(t, v[i].ptr);
        if (!bt_node_ok(t, c)) {
            int rc = bt_corrupt(t, c, "child node");
            if (w->err == NVH_OK) w->err = rc;
            continue;                    /* the other subtrees are intact */
        }
        int rc = bt_walk(t, c, clo, chi, (int)n->level - 1, w);
        if (rc) return rc;
    }
    return 0;
}

/* The root if it is valid; NULL for an empty tree, or with *err set. */
static bt_node *bt_root(struct nvh_btree *t, int *err)
{
    bt_node *root = bt_ptr(t, t->hdr->root);
    if (root && !bt_node_ok(t, root)) {
        *err = bt_corrupt(t, root, "root node");
        return NULL;
    }
    return root;
}

int nvh_btree_scan(nvh_btree *t, uint64_t from, uint64_t to, nvh_btree_scan_fn fn, void *arg)
{
    if (!t || !fn) return bt_fail(NVH_E_INVAL, "tree or callback is NULL");
    int trc = bt_check_thread(t);
    if (trc != NVH_OK) return trc;
    bt_walk_ctx w = {from, to, fn, arg, NULL, NVH_OK};
    bt_node *root = bt_root(t, &w.err);
    if (!root || from > to) return w.err;
    int rc = bt_walk(t, root, 0, UINT64_MAX, -1, &w);
    return rc ? rc : w.err;
}

uint64_t nvh_btree_count(nvh_btree *t)
{
    if (!t) return 0;
    if (t->count < 0) {
        uint64_t c = 0;
        bt_walk_ctx w = {0, UINT64_MAX, NULL, NULL, &c, NVH_OK};
        bt_node *root = bt_root(t, &w.err);
        if (root) bt_walk(t, root, 0, UINT64_MAX, -1, &w);
        /* a damaged tree's count is of what is intact, and not kept: the
         * next call walks again (and the error stays readable) */
        if (w.err != NVH_OK) return c;
        t->count = (int64_t)c;
    }
    return (uint64_t)t->count;
}
