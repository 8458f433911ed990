/* sorted_write.c — the sorted engine's write path: put (insert, overwrite),
 * remove, leaf splits, removal of empty leaves, the queued record frees
 * (hdr->pend) with their recovery, and the stores splits owe to the next
 * fence (kvs_owed). Writers lock the leaf they change
 * (writers of different leaves run in parallel); splits and leaf removals
 * also take t->smo. Every store into the pool is made durable before the
 * call returns. The rules ([Moraru11] §6, docs/KV-SORTED.md):
 *   - a record is durable before any slot points at it (the slot's record
 *     word is the activation's link: written by nvh_activate after its
 *     fence, so an insert is 2 fences: record + summary, then activation);
 *   - append in node: an insert writes a free slot, nothing shifts;
 *   - a split moves half of a full leaf to a new leaf, inserting the key
 *     that did not fit, in the insert's two fences: the record activated
 *     with a queue entry as its link, then the new leaf activated into the
 *     chain; the moved slots become free in the old leaf afterwards, and
 *     recovery drops from the old leaf what the new one (its moved_from)
 *     also holds;
 *   - a removal writes a free value into the slot that differs from the
 *     one its record's activation replaced (kvs_tomb_after, sorted_int.h);
 *   - a replaced or removed record is freed once no reader can hold it,
 *     through hdr->pend, so a crash before the free leaks nothing. */
#include "sorted_int.h"

#include <time.h>

static inline nvh_off_t *kvs_link_of(kv_sorted *t, const kvs_cleaf *c)
{
    return c->prev ? &c->prev->p->next : &t->hdr->first;
}

/* ==========================================================================
 * Queued frees
 * ==========================================================================
 * A record an overwrite or a removal unlinks is queued in hdr->pend[j]
 * (durable before the unlink), so that a crash before its free leaks
 * nothing. Its free is not paid with a fence of its own: the next write
 * (any thread) frees it at its data fence (kvs_data_fence): the free's one
 * fence is also what makes that write's record durable before its
 * activation. Steady state: 2 fences per insert, overwrite and removal. */
#define KVS_PEND_MASK ((UINT64_C(1) << KVS_PENDING) - 1)

/* Free one queued record whose unlink is done (any writer). 1: one was
 * freed (a fence: everything this thread flushed before is durable);
 * 0: none was ready; < 0: the free failed (the entry stays queued: the
 * next open frees it). */
static int kvs_pend_free_one(kv_sorted *t)
{
    uint64_t r = __atomic_load_n(&t->pend_ready, __ATOMIC_ACQUIRE);
    unsigned j;
    do {
        if (!r) return 0;
        j = (unsigned)__builtin_ctzll(r);
    } while (!__atomic_compare_exchange_n(&t->pend_ready, &r, r & ~(UINT64_C(1) << j), 1,
                                          __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE));
    kvs_pfree *pe = &t->hdr->pend[j];
    nvh_link lk = {&pe->rec, 0};
    int rc = nvh_free(t->pool, nvh_ptr(t->pool, pe->rec), &lk, 1);
    if (rc) return nvh_fail_context(rc, "sorted tree (header at offset %llu): queued free of "
                                    "record %llu", (unsigned long long)t->hdr_off,
                                    (unsigned long long)pe->rec);
    __atomic_and_fetch(&t->pend_used, ~(UINT64_C(1) << j), __ATOMIC_RELEASE);
    return 1;
}

static void kvs_pend_release(kv_sorted *t, unsigned j)
{
    __atomic_and_fetch(&t->pend_used, ~(UINT64_C(1) << j), __ATOMIC_RELEASE);
}

/* ==========================================================================
 * Stores owed to a later fence (kvs_owed, sorted_int.h)
 * ==========================================================================
 * A split's last stores (tombstones in the split leaf, the clear of its
 * queue entry) are flushed but not fenced: the put that split returns after
 * its two fences. They must be durable before anything that could depend
 * on them, and every such thing is a write that fences first: a write to
 * either half of the split locks one of their companions (published after
 * the owed entry), and its data fence (or the split's, or the drop's)
 * comes through kvs_owed_pre/post. A fence covers the issuing thread's
 * flushes only, so the lines another thread flushed are flushed again. */
static uint64_t kvs_tid_next;
static _Thread_local uint64_t kvs_tid_mine;
uint64_t kvs_tid(void)
{
    if (__builtin_expect(!kvs_tid_mine, 0))
        kvs_tid_mine = __atomic_add_fetch(&kvs_tid_next, 1, __ATOMIC_RELAXED);
    return kvs_tid_mine;
}

static inline void kvs_owed_lock(kv_sorted *t) { kvs_spin_lock(&t->owed_lock); }
static inline void kvs_owed_unlock(kv_sorted *t) { kvs_spin_unlock(&t->owed_lock); }

/* Before a fence: flush again what other threads owe; returns the newest
 * entry the fence will cover (0: none). */
static uint64_t kvs_owed_pre(kv_sorted *t)
{
    if (__builtin_expect(!__atomic_load_n(&t->nowed, __ATOMIC_ACQUIRE), 1)) return 0;
    uint64_t me = kvs_tid(), top = 0;
    kvs_owed_lock(t);
    for (uint32_t i = 0; i < t->nowed; i++) {
        const kvs_owed *o = &t->owed[i];
        if (o->tid != me) {
            for (uint32_t m = o->lines; m; m &= m - 1)
                nvh_flush(t->pool, (char *)o->leaf + 64 * __builtin_ctz(m), 64);
            if (o->pend < KVS_PENDING)
                nvh_flush(t->pool, &t->hdr->pend[o->pend], sizeof(kvs_pfree));
        }
        top = o->id;
    }
    kvs_owed_unlock(t);
    return top;
}

/* After the fence: drop the entries up to top (their stores are durable)
 * and release their queue entries. */
static void kvs_owed_post(kv_sorted *t, uint64_t top)
{
    if (!top) return;
    kvs_owed_lock(t);
    uint32_t k = 0;
    for (uint32_t i = 0; i < t->nowed; i++) {
        if (t->owed[i].id <= top) {
            if (t->owed[i].pend < KVS_PENDING) kvs_pend_release(t, t->owed[i].pend);
        }
        else t->owed[k++] = t->owed[i];
    }
    __atomic_store_n(&t->nowed, k, __ATOMIC_RELEASE);
    kvs_owed_unlock(t);
}

/* Does a split of leaf l depend on stores still owed: l's own (a new split
 * tag voids the hint of its last split), or those of the leaf l was split
 * off (moving l's entries on would leave that leaf's stale copies of them
 * with no hint to drop them)? */
static bool kvs_owed_has(kv_sorted *t, const kvs_leaf *l)
{
    if (__builtin_expect(!__atomic_load_n(&t->nowed, __ATOMIC_ACQUIRE), 1)) return false;
    bool r = false;
    kvs_owed_lock(t);
    for (uint32_t i = 0; i < t->nowed && !r; i++)
        r = t->owed[i].leaf == l || (l->moved_from && nvh_off(t->pool, t->owed[i].leaf) == l->moved_from);
    kvs_owed_unlock(t);
    return r;
}

/* Make every owed store durable now. */
void kvs_owed_settle(kv_sorted *t)
{
    uint64_t top = kvs_owed_pre(t);
    if (!top) return;
    nvh_drain(t->pool);
    kvs_owed_post(t, top);
}

static void kvs_owed_add(kv_sorted *t, kvs_leaf *leaf, uint32_t lines, unsigned pend)
{
    for (;;) {
        kvs_owed_lock(t);
        if (t->nowed < KVS_OWED) break;
        kvs_owed_unlock(t);
        kvs_owed_settle(t);
    }
    kvs_owed *o = &t->owed[t->nowed];
    o->leaf = leaf;
    o->lines = lines;
    o->pend = pend;
    o->tid = kvs_tid();
    o->id = ++t->owed_id;
    __atomic_store_n(&t->nowed, t->nowed + 1, __ATOMIC_RELEASE);
    kvs_owed_unlock(t);
}

/* The fence that makes what this thread flushed durable (and what other
 * threads owe): a queued record's free or an empty slab's if one is owed,
 * else a plain drain. cr: the record being written (or NULL); if its slab
 * is new, the slab's activation follows (a fence of its own: its header and
 * the list head it links over must be durable first), once per slab. */
static int kvs_data_fence(kv_sorted *t, kvs_carve *cr)
{
    uint64_t top = kvs_owed_pre(t);
    int r;
    if (cr && cr->fresh) {
        /* (this thread holds the slab list: no slab free here) */
        if ((r = kvs_pend_free_one(t)) == 0) nvh_drain(t->pool);
        if (r >= 0) r = kvs_slab_activate(t, cr);
        else kvs_slab_abort(t, cr);
    } else if ((r = kvs_pend_free_one(t)) == 0 && (r = kvs_slab_free_one(t)) == 0) {
        nvh_drain(t->pool);
    }
    kvs_owed_post(t, top);
    return r >= 0 ? NVH_OK : r;
}

int kvs_pend_flush(kv_sorted *t)
{
    int r;
    while ((r = kvs_pend_free_one(t)) == 1) {}
    if (r == NVH_OK) while ((r = kvs_slab_free_one(t)) == 1) {}
    kvs_owed_settle(t);
    /* entries a split emptied hold 1 or 2: back to 0, which libraries
     * without splits in two fences read as empty too; after the rings are
     * retired, so that no activation that replaced 0 there is replayed */
    bool any = false;
    for (unsigned j = 0; j < KVS_PENDING; j++) any |= t->hdr->pend[j].rec - 1 < 63;
    if (r == NVH_OK && any && !KVS_LOAD(&t->pend_used) && (r = nvh_heap_sync(t->pool)) == NVH_OK) {
        for (unsigned j = 0; j < KVS_PENDING; j++) {
            kvs_pfree *pe = &t->hdr->pend[j];
            if (pe->rec - 1 >= 63) continue;
            pe->rec = 0;
            nvh_flush(t->pool, pe, sizeof *pe);
        }
        nvh_drain(t->pool);
    }
    return r;
}

static int kvs_pend_take(kv_sorted *t, unsigned *j)
{
    for (;;) {
        uint64_t u = __atomic_load_n(&t->pend_used, __ATOMIC_ACQUIRE);
        uint64_t avail = ~u & KVS_PEND_MASK;
        if (!avail) {
            /* every entry queued: free one that is owed (or wait for the
             * writers that hold the others to finish) */
            int r = kvs_pend_free_one(t);
            if (r < 0) return r;
            if (r == 0 && __atomic_load_n(&t->nowed, __ATOMIC_ACQUIRE)) kvs_owed_settle(t);
            else if (r == 0) sched_yield();
            continue;
        }
        unsigned i = (unsigned)__builtin_ctzll(avail);
        if (__atomic_compare_exchange_n(&t->pend_used, &u, u | (UINT64_C(1) << i), 1,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            *j = i;
            return NVH_OK;
        }
    }
}

/* The record in pend[j] is unlinked: its free is owed. */
static void kvs_pend_ready(kv_sorted *t, unsigned j)
{
    __atomic_or_fetch(&t->pend_ready, UINT64_C(1) << j, __ATOMIC_RELEASE);
}

/* Write pend[j] = (rec, slot word) and flush it (durable at the caller's
 * next fence, together with what it accompanies). */
static void kvs_pend_write(kv_sorted *t, unsigned j, uint64_t rec, const uint64_t *slot)
{
    kvs_pfree *pe = &t->hdr->pend[j];
    pe->slot = nvh_off(t->pool, slot);
    pe->rec = rec;
    nvh_flush(t->pool, pe, sizeof *pe);
}

static void kvs_pend_drop(kv_sorted *t, unsigned j)
{
    kvs_pfree *pe = &t->hdr->pend[j];
    pe->rec = 0;
    pe->slot = 0;
    nvh_flush(t->pool, pe, sizeof *pe);
    kvs_pend_release(t, j);
}

int kvs_pending_recover(kv_sorted *t, uint64_t live)
{
    int rc = NVH_OK;
    for (unsigned j = 0; j < KVS_PENDING && rc == NVH_OK; j++) {
        kvs_pfree *pe = &t->hdr->pend[j];
        if (kvs_slot_free(pe->rec)) continue;
        if ((live >> j) & 1) {
            /* the operation that queued it did not complete: still live */
            pe->rec = 0;
            pe->slot = 0;
            nvh_flush(t->pool, pe, sizeof *pe);
            continue;
        }
        nvh_link lk = {&pe->rec, 0};
        rc = nvh_free(t->pool, nvh_ptr(t->pool, pe->rec), &lk, 1);
        if (rc) rc = nvh_fail_context(rc, "sorted tree (header at offset %llu): queued free of "
                                      "record %llu", (unsigned long long)t->hdr_off,
                                      (unsigned long long)pe->rec);
    }
    return rc;
}

/* ==========================================================================
 * Records
 * ========================================================================== */
/* Does a record of (kl, vl) go into a slab (else: an allocator object)? */
static inline bool kvs_rec_carved(const kv_sorted *t, size_t kl, size_t vl)
{
    return (t->rec16 ? sizeof(kvs_rec16) : sizeof(kvs_rec8)) + kl + vl <= t->slab_rec_max;
}

/* A record holding (k, v), written and flushed (durable at the next
 * fence): carved from a slab (cr->si set; cr->fresh if its slab is new and
 * owes its activation, which kvs_data_fence does), with the 8-byte header
 * (the slab's creation made the tree version 3 first), or, above
 * slab_rec_max, a reserved allocator object with the 16-byte header
 * (activated with the slot word as its link). */
static kvs_rec *kvs_rec_make(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl,
                             kvs_carve *cr, kvs_rv *view)
{
    cr->cv = NULL;
    cr->si = NULL;
    cr->fresh = NULL;
    uint8_t *d;
    void *r;
    size_t h;
    if (kvs_rec_carved(t, kl, vl) && !t->rec16) {
        h = sizeof(kvs_rec8);
        kvs_rec8 *r8 = kvs_slab_carve(t, (h + kl + vl + 63) & ~(size_t)63, cr);
        if (r8) {
            r8->magic = KVS_REC8_MAGIC;
            r8->klen = (uint16_t)kl;
            r8->vlen = (uint32_t)vl;
        }
        r = r8;
    } else {
        h = sizeof(kvs_rec16);
        kvs_rec16 *r16 = kvs_rec_carved(t, kl, vl)
                             ? kvs_slab_carve(t, (h + kl + vl + 63) & ~(size_t)63, cr)
                             : nvh_reserve(t->pool, h + kl + vl);
        if (r16) {
            r16->magic = KVS_REC_MAGIC;
            r16->klen = (uint32_t)kl;
            r16->vlen = vl;
        }
        r = r16;
    }
    if (!r) {
        nvh_fail_context(nvh_errcode(), "sorted tree: no space for a record of %zu bytes",
                         h + kl + vl);
        return NULL;
    }
    d = (uint8_t *)r + h;
    if (view) *view = (kvs_rv){d, d + kl, vl, (uint32_t)kl};
    memcpy(d, k, kl);
    nvh_flush(t->pool, r, h + kl);
    if (vl) nvh_memcpy_nodrain(t->pool, d + kl, v, vl);
    return r;
}

/* A record written by kvs_rec_make that no slot will name. */
static void kvs_rec_drop(kv_sorted *t, kvs_rec *r, kvs_carve *cr)
{
    if (cr->cv) kvs_slab_abort(t, cr);
    else nvh_cancel(t->pool, r);
}

/* nvh_activate(r, link = *word). */
static int kvs_activate(kv_sorted *t, void *r, uint64_t *word)
{
    nvh_off_t *const links[1] = {word};
    return nvh_activate(t->pool, r, links, 1);
}

/* Make record r (durable: after the data fence) the value of slot word
 * *word: a carved record by one 8-byte store and a fence, an allocator
 * object by its activation (link *word). */
static int kvs_rec_link(kv_sorted *t, kvs_rec *r, const kvs_carve *cr, uint64_t *word)
{
    if (cr->cv) {
        *word = nvh_off(t->pool, r);
        nvh_flush(t->pool, word, 8);
        nvh_drain(t->pool);
        return NVH_OK;
    }
    /* a later plain store into this word must not repeat the activation's
     * old value while the activation can be replayed (kvs_slab_activate) */
    __atomic_store_n(&t->slab_acts, 1, __ATOMIC_RELEASE);
    return kvs_activate(t, r, word);
}

/* ==========================================================================
 * Leaves
 * ========================================================================== */
static kvs_leaf *kvs_leaf_init(kv_sorted *t, void *mem)
{
    kvs_leaf *l = mem;
    memset(l, 0, sizeof *l);
    l->magic = KVS_LEAF_MAGIC;
    l->version = KVS_VERSION;
    l->cap = KVS_CAP;
    l->tree = t->hdr_off;
    return l;
}

static void kvs_slot_set(kvs_slot *s, const kvs_ent *e)
{
    s->rec = e->rec;
    s->prefix = e->prefix;
    s->hash = e->hash;
    s->klen = e->klen;
}

static kvs_cleaf *kvs_cleaf_of(kv_sorted *t, kvs_leaf *l, const kvs_ent *e, unsigned n)
{
    kvs_cleaf *c = kvs_cleaf_take(t);
    if (!c) return NULL;
    c->p = l;
    for (unsigned i = 0; i < n; i++) {
        kvs_fp_set(c, i, e[i].hash);
        c->w[i].hash = e[i].hash;
        c->w[i].klen = (uint16_t)e[i].klen;
        c->w[i].pfx = e[i].prefix;
        c->rec[i] = e[i].rec;
        ((uint8_t *)c->perm)[i] = (uint8_t)i;   /* e is in key order */
    }
    c->live = n;
    c->ptag = kvs_ptag_make(0, n);
    return c;
}

/* The first leaf of an empty tree. */
static int kvs_first_leaf(kv_sorted *t)
{
    nvh_pool *pool = t->pool;
    void *mem = nvh_reserve(pool, sizeof(kvs_leaf));
    if (!mem) return nvh_fail_context(nvh_errcode(), "sorted tree: no space for a leaf");
    kvs_leaf *l = kvs_leaf_init(t, mem);
    nvh_persist(pool, l, sizeof *l);
    kvs_cleaf *c = kvs_cleaf_of(t, l, NULL, 0);
    kvs_inode *r = c ? kvs_ix_build(&c, 1) : NULL;
    if (!r) {
        free(c);
        nvh_cancel(pool, mem);
        return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory");
    }
    int rc = kvs_activate(t, l, &t->hdr->first);
    if (rc) {
        kvs_ix_free(t, r);
        free(c);
        nvh_cancel(pool, mem);
        return rc;
    }
    kvs_inode *old = t->root;
    t->head = c;
    KVS_STORE(&t->root, r);
    return kvs_retire(t, KVS_R_INODE, old);
}


/* key (k, kl, prefix kp) against entry e: <0, 0, >0 (0 and *err set if
 * e's record is corrupt). */
static int kvs_key_vs(const kv_sorted *t, const void *k, size_t kl, uint64_t kp, kvs_ent *e,
                      int *err)
{
    if (!t->cmp) {
        int c = kvs_sum_cmp(kp, kl, e->prefix, e->klen);
        if (c != 2) return c;
    }
    const kvs_rv *r = kvs_ent_rec(t, e, err);
    return r ? kvs_cmp(t, k, kl, r->key, r->klen) : 0;
}

/* The entries of locked companion c in key order: from its cached order
 * when that is valid (a reader fills it only when it is not valid for the
 * version, and the version does not move while c is locked; the tag is
 * checked again after the order was read all the same), else sorted by the
 * companion's summaries (bytewise order: a record is read only where two
 * prefixes tie; a custom order reads them all). The summaries come from the
 * companion: e->v.key stays NULL until kvs_ent_rec reads it. */
static int kvs_ents_of(const kv_sorted *t, const kvs_cleaf *c, kvs_ent *e, unsigned *n)
{
    uint64_t tag = KVS_LOAD(&c->ptag);
    if (kvs_ptag_valid_for(tag, KVS_LOADR(&c->ver))) {
        unsigned m = (unsigned)(tag >> 32) & 0xff;
        uint8_t perm[KVS_CAP];
        for (unsigned w = 0; w < KVS_CAP / 8; w++) {
            uint64_t x = KVS_LOADR(&c->perm[w]);
            memcpy(perm + 8 * w, &x, 8);
        }
        bool ok = m <= KVS_CAP && KVS_LOAD(&c->ptag) == tag;
        for (unsigned i = 0; ok && i < m; i++) {
            unsigned s = perm[i];
            ok = s < KVS_CAP && !kvs_slot_free(c->rec[s]);
            if (!ok) break;
            e[i] = (kvs_ent){.rec = c->rec[s], .prefix = c->w[s].pfx, .hash = c->w[s].hash,
                             .klen = c->w[s].klen, .v = {NULL, NULL, 0, 0}, .slot = s};
        }
        if (ok && m == c->live) {
            *n = m;
            return NVH_OK;
        }
    }
    if (t->cmp) return kvs_leaf_sorted(t, c, e, n);
    return kvs_sum_sort(t, c, c->rec, e, n);
}

/* A new split tag (under smo): random, so that a stale moved_from hint
 * (its source split again, or freed and its space a leaf again) does not
 * match. */
static uint64_t kvs_split_tag(kv_sorted *t)
{
    if (!t->tag_rng)
        t->tag_rng = (uint64_t)(uintptr_t)t ^ nvh_mix64((uint64_t)time(NULL) ^ t->hdr_off) ^
                     ((uint64_t)clock() << 32);
    uint64_t x;
    do x = nvh_mix64(t->tag_rng += 0x9E3779B97F4A7C15ull); while (!x);
    return x;
}

/* Companion of c's persistent leaf keeping only the entries e[0..n) (in
 * key order, in their slots). */
static kvs_cleaf *kvs_cleaf_keep(kv_sorted *t, const kvs_cleaf *c, const kvs_ent *e,
                                  unsigned n)
{
    kvs_cleaf *d = kvs_cleaf_take(t);
    if (!d) return NULL;
    d->p = c->p;
    for (unsigned i = 0; i < n; i++) {
        unsigned s = e[i].slot;
        kvs_fp_set(d, s, c->w[s].hash);
        d->w[s].hash = c->w[s].hash;
        d->w[s].klen = c->w[s].klen;
        d->w[s].pfx = c->w[s].pfx;
        d->rec[s] = c->rec[s];
        d->w[s].was = c->w[s].was;
        ((uint8_t *)d->perm)[i] = (uint8_t)s;
    }
    d->live = n;
    d->ptag = kvs_ptag_make(0, n);
    return d;
}

/* Insert k into full leaf c by splitting it, in the put's two fences
 * ([Moraru11] §6: validation after durable data; docs/KV-SORTED.md):
 *   the entries of c and k, in key order, are cut in two halves; the half
 *   that holds k moves to a new leaf N (written with k's slot naming the
 *   new record R, N.moved_from = c's leaf L), the other half stays in L.
 *   0. R, N and queue entry pend[j] (R's slot, for diagnostics) flushed;
 *   1. nvh_activate(R, link pend[j].rec) — fence: R, N are durable, and R
 *      is allocated but referenced only by the queue entry (a crash frees
 *      it: no live slot names it);
 *   2. nvh_activate(N, link L.next for the upper half, the link to L for
 *      the lower one) — fence: N is in the chain, with k. L still holds
 *      copies of the moved entries; N.moved_from says they belong to N;
 *   3. tombstones into L's moved slots, pend[j].rec cleared (flushed, owed
 *      to the next fence: kvs_owed).
 * L is changed in place but its companion is replaced (a companion's key
 * range never shrinks while it lives: writers that reached c retry). */
static int kvs_split_insert(kv_sorted *t, kvs_cleaf *c, const void *k, size_t kl, uint64_t kp,
                            uint32_t kh, const void *v, size_t vl)
{
    nvh_pool *pool = t->pool;
    kvs_leaf *old = c->p;
    kvs_ent e[KVS_CAP + 1];
    unsigned n;
    int rc = kvs_ents_of(t, c, e, &n);
    if (rc) return rc;
    if (n < 2) return kvs_corrupt(t, nvh_off(pool, old), "leaf (full, but fewer than 2 entries)");
    unsigned p = 0;     /* entries below k */
    for (unsigned hi = n; p < hi;) {
        unsigned m = (p + hi) / 2;
        int d = kvs_key_vs(t, k, kl, kp, &e[m], &rc);
        if (rc) return rc;
        if (d > 0) p = m + 1;
        else hi = m;
    }
    unsigned mid = n / 2;
    bool upper = p >= mid;
    /* the upper leaf's lower bound: k or e[mid] (its key is copied) */
    if (!kvs_ent_rec(t, &e[mid], &rc)) return rc;
    /* N: e[mid..n) + k (upper) or e[0..mid) + k (lower), in key order */
    unsigned nb = upper ? mid : 0, ne = upper ? n : mid;
    kvs_ent ne_[KVS_CAP + 1];
    unsigned nn = 0, kpos = 0;
    for (unsigned i = nb; i < ne; i++) {
        if (i == p) kpos = nn++;
        ne_[nn++] = e[i];
    }
    if (p == ne) kpos = nn++;
    /* L's new split tag must not be durable before the tombstones of its
     * last split (whose hint it voids), nor may L's entries move on while
     * the leaf L was split off still holds stale copies of them: settle
     * those first; what other leaves owe rides on this split's first fence */
    if (kvs_owed_has(t, old)) kvs_owed_settle(t);
    /* R: carved from a slab (the common case: no queue entry, its fence is
     * step 1's), or an allocator object activated with a queue entry as its
     * link at step 1 */
    unsigned j = KVS_PENDING;
    bool big = !kvs_rec_carved(t, kl, vl);
    if (big && (rc = kvs_pend_take(t, &j))) return rc;
    kvs_carve cr;
    kvs_rv rv;
    kvs_rec *r = kvs_rec_make(t, k, kl, v, vl, &cr, &rv);
    void *mem = r ? nvh_reserve(pool, sizeof(kvs_leaf)) : NULL;
    if (!mem) {
        rc = r ? nvh_fail_context(nvh_errcode(), "sorted tree: no space to split a leaf") : nvh_errcode();
        if (r) kvs_rec_drop(t, r, &cr);
        if (big) kvs_pend_release(t, j);
        return rc;
    }
    kvs_ent *ke = &ne_[kpos];
    ke->rec = nvh_off(pool, r);
    ke->prefix = kp;
    ke->hash = kh;
    ke->klen = (uint32_t)kl;
    ke->v = rv;
    kvs_leaf *nl = kvs_leaf_init(t, mem);
    for (unsigned i = 0; i < nn; i++) kvs_slot_set(&nl->slot[i], &ne_[i]);
    nl->next = upper ? old->next : nvh_off(pool, old);
    nl->moved_from = nvh_off(pool, old);
    nl->moved_tag = kvs_split_tag(t);
    /* DRAM first (nothing persistent to undo if it fails): the kept half
     * of L, N, and the lower bound of the upper leaf */
    const kvs_ent *keep = upper ? e : e + mid;
    unsigned nkeep = upper ? mid : n - mid;
    kvs_cleaf *cl = kvs_cleaf_keep(t, c, keep, nkeep), *cn = kvs_cleaf_of(t, nl, ne_, nn);
    const kvs_ent *lb = upper ? &ne_[0] : &e[mid];
    kvs_skey *sep = kvs_skey_new(lb->v.key, lb->klen);
    if (!cl || !cn || !sep) {
        free(cl); free(cn); free(sep);
        nvh_cancel(pool, mem);
        kvs_rec_drop(t, r, &cr);
        if (big) kvs_pend_release(t, j);
        return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for a split");
    }
    kvs_pfree *pe = big ? &t->hdr->pend[j] : NULL;
    uint64_t pold = big ? pe->rec : 0;
    if (big) {
        pe->slot = nvh_off(pool, &nl->slot[kpos].rec);
        nvh_flush(pool, pe, sizeof *pe);
    }
    nvh_flush(pool, nl, sizeof *nl);
    old->split_tag = nl->moved_tag;
    nvh_flush(pool, &old->split_tag, 8);
    /* 1. (what other threads owe rides on this fence too) */
    if (big) {
        uint64_t top = kvs_owed_pre(t);
        rc = kvs_activate(t, r, &pe->rec);
        if (rc) {
            nvh_cancel(pool, r);
            kvs_pend_drop(t, j);
            goto fail;
        }
        kvs_owed_post(t, top);
    } else if ((rc = kvs_data_fence(t, &cr)) != NVH_OK) {
        kvs_rec_drop(t, r, &cr);
        goto fail;
    }
    /* 2. */
    rc = kvs_activate(t, nl, upper ? &old->next : kvs_link_of(t, c));
    if (rc) {
        if (big) kvs_pend_ready(t, j);  /* R's free is owed (its link: pend[j]) */
        else kvs_rec_drop(t, r, &cr);   /* garbage in its slab */
        goto fail;
    }
    /* 3. the moved slots leave L: free values that differ from the one each
     * held before its record's activation (kvs_tomb_after) */
    uint32_t lines = 0;
    for (unsigned i = upper ? mid : 0; i < (upper ? n : mid); i++) {
        kvs_slot *s = &old->slot[e[i].slot];
        s->rec = kvs_tomb_after(c->w[e[i].slot].was);
        cl->w[e[i].slot].was = (uint8_t)s->rec;
        lines |= 1u << ((nvh_off(pool, &s->rec) - nvh_off(pool, old)) / 64);
    }
    for (uint32_t m = lines; m; m &= m - 1) nvh_flush(pool, (char *)old + 64 * __builtin_ctz(m), 64);
    if (big) {
        pe->rec = kvs_tomb_after((uint8_t)(pold < 64 ? pold : 0));
        nvh_flush(pool, &pe->rec, 8);
    }
    kvs_owed_add(t, old, lines, j);     /* j: KVS_PENDING if none */

    /* DRAM: the two companions replace c in the chain and the index */
    kvs_cleaf *lo = upper ? cl : cn, *hi = upper ? cn : cl;
    lo->sep = c->sep;           /* c's reference passes on */
    hi->sep = sep;
    lo->prev = c->prev;
    lo->next = hi;
    hi->prev = lo;
    hi->next = c->next;
    rc = kvs_ix_replace(t, c, lo, hi, sep);   /* finds c by its separator */
    c->sep = NULL;
    if (c->next) KVS_STORE(&c->next->prev, hi);
    if (c->prev) KVS_STORE(&c->prev->next, lo);
    else t->head = lo;
    KVS_STORE(&c->dead, 1);
    __atomic_add_fetch(&t->count, 1, __ATOMIC_RELAXED);
    kvs_bytes_add(t, (int64_t)kl, (int64_t)vl);
    int rc2 = kvs_retire(t, KVS_R_CLEAF, c);
    return rc ? rc : rc2;
fail:
    nvh_cancel(pool, mem);
    free(cl); free(cn); free(sep);
    return rc;
}

/* Drop empty leaf c from the chain (one failure-atomic free that moves the
 * link past it) and from the index. Not the only leaf. */
static int kvs_leaf_drop(kv_sorted *t, kvs_cleaf *c)
{
    kvs_owed_settle(t);     /* the leaf may be one a split still owes stores */
    nvh_link lk = {kvs_link_of(t, c), c->p->next};
    int rc = nvh_free(t->pool, c->p, &lk, 1);
    if (rc) return rc;
    if (c->prev) KVS_STORE(&c->prev->next, c->next);
    else t->head = c->next;
    if (c->next) KVS_STORE(&c->next->prev, c->prev);
    rc = kvs_ix_remove(t, c);
    KVS_STORE(&c->dead, 1);
    kvs_skey_unref(t, c->sep, 0);
    c->sep = NULL;
    int rc2 = kvs_retire(t, KVS_R_CLEAF, c);
    return rc ? rc : rc2;
}

/* ==========================================================================
 * put, remove
 * ==========================================================================
 * A writer descends the index like a reader (inside an epoch), locks the
 * companion it reaches and checks that it is not dead: a live companion's
 * key range only grows (a neighbour's removal may give it that neighbour's
 * range; its own split kills it first), so it is the key's leaf, and it
 * stays alive while locked. The epoch can go then: the lock keeps the
 * companion and its records. Splits and leaf removals take smo as well. */
static kvs_cleaf *kvs_lock_leaf(kv_sorted *t, const void *k, size_t kl, uint64_t kp)
{
    kvs_cleaf *c;
    nvh_epoch_enter_();
    for (;;) {
        c = kvs_ix_find(t, KVS_LOAD(&t->root), k, kl, kp, NULL);
        if (!c) break;
        kvs_lock(c);
        if (!KVS_LOADR(&c->dead)) break;
        kvs_unlock(c);
    }
    nvh_epoch_exit_();
    return c;
}

/* Under smo: structure changes, then what no reader holds any more. */
static int kvs_smo_first_leaf(kv_sorted *t)
{
    pthread_mutex_lock(&t->smo);
    int rc = t->root->n == 0 ? kvs_first_leaf(t) : NVH_OK;
    kvs_reclaim(t, 0);
    pthread_mutex_unlock(&t->smo);
    return rc;
}

/* Split (inserting k) or drop locked companion c; c's lock is released
 * before the retired objects (c itself among them) may be freed. */
static int kvs_smo_split_insert(kv_sorted *t, kvs_cleaf *c, const void *k, size_t kl,
                                uint64_t kp, uint32_t kh, const void *v, size_t vl)
{
    pthread_mutex_lock(&t->smo);
    int rc = kvs_split_insert(t, c, k, kl, kp, kh, v, vl);
    kvs_unlock(c);
    kvs_reclaim(t, 0);
    pthread_mutex_unlock(&t->smo);
    return rc;
}

static int kvs_smo_drop(kv_sorted *t, kvs_cleaf *c)
{
    pthread_mutex_lock(&t->smo);
    int rc = c->live == 0 && (c->prev || c->next) ? kvs_leaf_drop(t, c) : NVH_OK;
    kvs_unlock(c);
    kvs_reclaim(t, 0);
    pthread_mutex_unlock(&t->smo);
    return rc;
}

/* Overwrite slot i of locked companion c (old: its record): the new
 * record durable (the data fence), then the slot switched in one 8-byte
 * store (a carved record) or by the record's activation, fenced. The old
 * record: a carved one leaves its slab's live count at once (its slab is
 * freed when that reaches 0, by a later data fence); an allocator object
 * is queued in the same data fence and owed its free to the next write's. */
static int kvs_overwrite(kv_sorted *t, kvs_cleaf *c, int i, uint64_t old, uint64_t old_vlen,
                         const void *k, size_t kl, const void *v, size_t vl)
{
    nvh_pool *pool = t->pool;
    kvs_slot *s = &c->p->slot[i];
    if (s->rec != old) return kvs_corrupt(t, nvh_off(pool, s), "leaf slot (differs from its companion)");
    kvs_slabi *osi = kvs_slab_of(t, old);
    unsigned j = 0;
    int rc;
    if (!osi && (rc = kvs_pend_take(t, &j))) return rc;
    kvs_carve cr;
    kvs_rec *r = kvs_rec_make(t, k, kl, v, vl, &cr, NULL);
    if (!r) {
        rc = nvh_errcode();
        if (!osi) kvs_pend_release(t, j);
        return rc;
    }
    if (!osi) kvs_pend_write(t, j, old, &s->rec);
    rc = kvs_data_fence(t, &cr);
    if (rc == NVH_OK) rc = kvs_rec_link(t, r, &cr, &s->rec);
    if (rc) {
        kvs_rec_drop(t, r, &cr);
        if (!osi) kvs_pend_drop(t, j);
        return rc;
    }
    int64_t dv = (int64_t)vl - (int64_t)old_vlen;
    KVS_STORE(&c->rec[i], nvh_off(pool, r));
    c->w[i].was = 0;
    kvs_bytes_add(t, 0, dv);
    if (osi) kvs_slab_release(t, osi);
    else kvs_pend_ready(t, j);
    return NVH_OK;
}

/* Insert into free slot i of locked companion c. */
static int kvs_insert(kv_sorted *t, kvs_cleaf *c, int i, const void *k, size_t kl,
                      uint64_t kp, uint32_t kh, const void *v, size_t vl)
{
    nvh_pool *pool = t->pool;
    kvs_slot *s = &c->p->slot[i];
    uint8_t was = c->w[i].was;
    /* the summary first: its line (written back and evicted by its last
     * flush) is fetched while the record is written; a free slot's summary
     * means nothing, so a failed insert leaves nothing to undo */
    s->prefix = kp;
    s->hash = kh;
    s->klen = (uint32_t)kl;
    kvs_carve cr;
    kvs_rec *r = kvs_rec_make(t, k, kl, v, vl, &cr, NULL);
    if (!r) return nvh_errcode();
    nvh_flush(pool, &s->prefix, 16);
    int rc = kvs_data_fence(t, &cr);
    if (rc == NVH_OK) rc = kvs_rec_link(t, r, &cr, &s->rec);
    if (rc) {
        kvs_rec_drop(t, r, &cr);
        return rc;
    }
    kvs_ver_begin(c);
    kvs_fp_set(c, (unsigned)i, kh);
    KVS_STORER(&c->w[i].hash, kh);
    KVS_STORER(&c->w[i].klen, (uint16_t)kl);
    KVS_STORER(&c->w[i].pfx, kp);
    KVS_STORE(&c->rec[i], nvh_off(pool, r));
    kvs_perm_change(t, c, i, -1);
    kvs_ver_end(c);
    c->w[i].was = was;
    c->live++;
    __atomic_add_fetch(&t->count, 1, __ATOMIC_RELAXED);
    kvs_bytes_add(t, (int64_t)kl, (int64_t)vl);
    return NVH_OK;
}

/* A free slot of locked companion c, -1 if none. Slots fill in order
 * (an insert takes the first free one, splits and the build pack their
 * new leaves), so slot `live` is usually the first free one: then one
 * record word is read, not the four lines of them. */
static int kvs_free_slot(const kvs_cleaf *c)
{
    unsigned n = c->live;
    if (n < KVS_CAP && kvs_slot_free(c->rec[n])) return (int)n;
    for (unsigned i = 0; i < KVS_CAP; i++)
        if (kvs_slot_free(c->rec[i])) return (int)i;
    return -1;
}

static int kvs_put_one(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl)
{
    uint64_t kp = kvs_prefix(k, kl);
    uint32_t kh = kvs_hash(k, kl);
    int rc;
    for (;;) {
        kvs_cleaf *c = kvs_lock_leaf(t, k, kl, kp);
        if (!c) {
            if ((rc = kvs_smo_first_leaf(t))) return rc;
            continue;
        }
        uint64_t old = 0;
        kvs_rv ov = {NULL, NULL, 0, 0};
        int err = 0;
        int i = kvs_leaf_find(t, c, k, kl, kh, &old, &ov, &err);
        if (err) rc = err;
        else if (i >= 0) rc = kvs_overwrite(t, c, i, old, ov.vlen, k, kl, v, vl);
        else {
            i = kvs_free_slot(c);
            if (i < 0)              /* c dies; unlocks it */
                return kvs_smo_split_insert(t, c, k, kl, kp, kh, v, vl);
            rc = kvs_insert(t, c, i, k, kl, kp, kh, v, vl);
        }
        kvs_unlock(c);
        return rc;
    }
}

static int kvs_write_begin(kv_sorted *t, const char *fn)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "%s: NULL tree", fn);
    if (t->readonly) return nvh_fail(NVH_E_READONLY, "%s: pool is read-only", fn);
    return kvs_ensure_built(t);
}

int kv_sorted_put(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl)
{
    int rc = kvs_write_begin(t, "kv_sorted_put");
    if (rc) return rc;
    if (!k || kl == 0) return nvh_fail(NVH_E_INVAL, "kv_sorted_put: empty or NULL key");
    if (kl > KVS_KEY_MAX)
        return nvh_fail(NVH_E_TOOLONG, "kv_sorted_put: key of %zu bytes exceeds %u", kl, KVS_KEY_MAX);
    if (vl > KVS_VALUE_MAX)
        return nvh_fail(NVH_E_TOOLONG, "kv_sorted_put: value of %zu bytes exceeds %llu", vl,
                        (unsigned long long)KVS_VALUE_MAX);
    if (!v && vl) return nvh_fail(NVH_E_INVAL, "kv_sorted_put: NULL value");
    nvh_protect_internal_begin(t->pool);
    rc = kvs_put_one(t, k, kl, v, vl);
    nvh_protect_internal_end(t->pool);
    return rc;
}

static int kvs_remove_one(kv_sorted *t, const void *k, size_t kl)
{
    nvh_pool *pool = t->pool;
    uint64_t kp = kvs_prefix(k, kl);
    uint32_t kh = kvs_hash(k, kl);
    kvs_cleaf *c = kvs_lock_leaf(t, k, kl, kp);
    if (!c) return NVH_E_NOTFOUND;
    uint64_t old = 0;
    kvs_rv ov = {NULL, NULL, 0, 0};
    int err = 0, rc;
    int i = kvs_leaf_find(t, c, k, kl, kh, &old, &ov, &err);
    kvs_slot *s = i >= 0 ? &c->p->slot[i] : NULL;
    unsigned j = 0;
    kvs_slabi *osi = NULL;
    if (err) rc = err;
    else if (i < 0) rc = NVH_E_NOTFOUND;
    else if (s->rec != old) rc = kvs_corrupt(t, nvh_off(pool, s), "leaf slot (differs from its companion)");
    else if ((osi = kvs_slab_of(t, old))) rc = NVH_OK;
    else rc = kvs_pend_take(t, &j);
    if (rc) { kvs_unlock(c); return rc; }
    if (osi) {
        /* a carved record: the tombstone and one fence (the data fence: it
         * may free a queued record or an empty slab). Stores a split owes
         * first: a removal must not be durable while the split leaf's stale
         * copy of the entry is not yet tombstoned (the build would keep
         * that copy, outside its leaf's range) */
        if (__atomic_load_n(&t->nowed, __ATOMIC_ACQUIRE)) kvs_owed_settle(t);
        s->rec = kvs_tomb_after(c->w[i].was);
        c->w[i].was = (uint8_t)s->rec;
        nvh_flush(pool, &s->rec, 8);
        rc = kvs_data_fence(t, NULL);
        if (rc) {
            /* the free that was to be the fence failed: fence anyway */
            nvh_drain(pool);
        }
        rc = NVH_OK;
    } else {
        /* the queued free must be durable before the slot changes (they
         * are in different lines): the data fence, then the tombstone's */
        kvs_pend_write(t, j, old, &s->rec);
        rc = kvs_data_fence(t, NULL);
        if (rc) { kvs_pend_drop(t, j); kvs_unlock(c); return rc; }
        s->rec = kvs_tomb_after(c->w[i].was);
        c->w[i].was = (uint8_t)s->rec;
        nvh_flush(pool, &s->rec, 8);
        nvh_drain(pool);
    }
    kvs_ver_begin(c);
    KVS_STORE(&c->rec[i], 0);
    kvs_perm_change(t, c, -1, i);
    kvs_ver_end(c);
    c->live--;
    __atomic_sub_fetch(&t->count, 1, __ATOMIC_RELAXED);
    kvs_bytes_add(t, -(int64_t)ov.klen, -(int64_t)ov.vlen);
    if (osi) kvs_slab_release(t, osi);
    else kvs_pend_ready(t, j);
    if (c->live == 0) return kvs_smo_drop(t, c);
    kvs_unlock(c);
    return rc;
}

int kv_sorted_remove(kv_sorted *t, const void *k, size_t kl)
{
    int rc = kvs_write_begin(t, "kv_sorted_remove");
    if (rc) return rc;
    if (!k || kl == 0) return nvh_fail(NVH_E_INVAL, "kv_sorted_remove: empty or NULL key");
    if (kl > KVS_KEY_MAX)
        return nvh_fail(NVH_E_TOOLONG, "kv_sorted_remove: key of %zu bytes exceeds %u", kl,
                        KVS_KEY_MAX);
    nvh_protect_internal_begin(t->pool);
    rc = kvs_remove_one(t, k, kl);
    nvh_protect_internal_end(t->pool);
    return rc;
}
