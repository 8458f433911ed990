/* sorted_write.c — the sorted engine's write path: put (insert, overwrite),
 * remove, leaf splits, removal of empty leaves, and the queued record
 * frees (hdr->pend) with their recovery. Writers lock the leaf they change
 * (writers of different leaves run in parallel); splits and leaf removals
 * also take t->smo. Every store into the pool is made durable before the
 * call returns. The rules ([Moraru11] §6, docs/KV-SORTED.md):
 *   - a record is durable before any slot points at it (the slot's record
 *     word is the activation's link: written by nvh_activate after its
 *     fence, so an insert is 2 fences: record + summary, then activation);
 *   - append in node: an insert writes a free slot, nothing shifts;
 *   - a split builds two new leaves and retires the old one only after the
 *     new ones are linked, each step one failure-atomic allocator call;
 *   - a removal writes a free value into the slot that differs from the
 *     one its record's activation replaced (kvs_tomb_after, sorted_int.h);
 *   - a replaced or removed record is freed once no reader can hold it,
 *     through hdr->pend, so a crash before the free leaks nothing. */
#include "sorted_int.h"

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

/* The fence that makes what this thread flushed durable: a queued free's,
 * if one is owed, else a plain drain. */
static int kvs_data_fence(kv_sorted *t)
{
    int r = kvs_pend_free_one(t);
    if (r == 1) return NVH_OK;
    nvh_drain(t->pool);
    return r;
}

int kvs_pend_flush(kv_sorted *t)
{
    int r;
    while ((r = kvs_pend_free_one(t)) == 1) {}
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
            if (r == 0) sched_yield();
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

static void kvs_pend_release(kv_sorted *t, unsigned j)
{
    __atomic_and_fetch(&t->pend_used, ~(UINT64_C(1) << j), __ATOMIC_RELEASE);
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
        if (pe->rec == 0) continue;
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
/* A reserved record holding (k, v), flushed (durable at the next fence). */
static kvs_rec *kvs_rec_make(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl)
{
    kvs_rec *r = nvh_reserve(t->pool, sizeof *r + kl + vl);
    if (!r) {
        nvh_fail_context(nvh_errcode(), "sorted tree: no space for a record of %zu bytes",
                         sizeof *r + kl + vl);
        return NULL;
    }
    r->magic = KVS_REC_MAGIC;
    r->klen = (uint32_t)kl;
    r->vlen = vl;
    memcpy(r->data, k, kl);
    nvh_flush(t->pool, r, sizeof *r + kl);
    if (vl) nvh_memcpy_nodrain(t->pool, r->data + kl, v, vl);
    return r;
}

/* nvh_activate(r, link = *word). */
static int kvs_activate(kv_sorted *t, void *r, uint64_t *word)
{
    nvh_off_t *const links[1] = {word};
    return nvh_activate(t->pool, r, links, 1);
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

static kvs_cleaf *kvs_cleaf_of(kvs_leaf *l, const kvs_ent *e, unsigned n)
{
    kvs_cleaf *c = kvs_cleaf_new();
    if (!c) return NULL;
    c->p = l;
    for (unsigned i = 0; i < n; i++) {
        kvs_fp_set(c, i, e[i].hash);
        c->hash[i] = e[i].hash;
        c->klen[i] = (uint16_t)e[i].klen;
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
    kvs_cleaf *c = kvs_cleaf_of(l, NULL, 0);
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
    return kvs_retire(t, KVS_R_MEM, old);
}

/* Split full leaf c ([Moraru11] §6, Fig. 3, in a leaf chain):
 *   1. L1 <- the lower half of c's entries, L2 <- the upper half (both new,
 *      sorted; L1.next = L2, L2.next = c.next, L2.split_of = c); fence;
 *   2. activate L2 with link c.next: the chain is c, L2 (L2's entries are
 *      copies of c's; open drops L2 again: split_of names its predecessor);
 *   3. activate L1 with link c.left: open finishes the split from here;
 *   4. L2.split_of = 0 (flushed), free c with its link redirected to L1.
 * Records are shared, never copied. Readers never read persistent leaves
 * (they use the companions), so c's memory may go at once. */
static int kvs_split(kv_sorted *t, kvs_cleaf *c)
{
    nvh_pool *pool = t->pool;
    kvs_ent e[KVS_CAP];
    unsigned n;
    int rc = kvs_leaf_sorted(t, c, e, &n);
    if (rc) return rc;
    unsigned mid = n / 2;
    void *m1 = nvh_reserve(pool, sizeof(kvs_leaf));
    void *m2 = m1 ? nvh_reserve(pool, sizeof(kvs_leaf)) : NULL;
    if (!m2) {
        rc = nvh_fail_context(nvh_errcode(), "sorted tree: no space to split a leaf");
        if (m1) nvh_cancel(pool, m1);
        return rc;
    }
    kvs_leaf *l1 = kvs_leaf_init(t, m1), *l2 = kvs_leaf_init(t, m2), *old = c->p;
    for (unsigned i = 0; i < mid; i++) kvs_slot_set(&l1->slot[i], &e[i]);
    for (unsigned i = mid; i < n; i++) kvs_slot_set(&l2->slot[i - mid], &e[i]);
    l1->next = nvh_off(pool, l2);
    l2->next = old->next;
    l2->split_of = nvh_off(pool, old);
    kvs_cleaf *c1 = kvs_cleaf_of(l1, e, mid), *c2 = kvs_cleaf_of(l2, e + mid, n - mid);
    kvs_skey *s2 = kvs_skey_new(e[mid].r->data, e[mid].klen);
    if (!c1 || !c2 || !s2) {
        free(c1); free(c2); free(s2);
        nvh_cancel(pool, m1);
        nvh_cancel(pool, m2);
        return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for a split");
    }
    nvh_flush(pool, l1, sizeof *l1);
    nvh_flush(pool, l2, sizeof *l2);
    nvh_drain(pool);
    rc = kvs_activate(t, l2, &old->next);
    if (rc) goto undo2;
    rc = kvs_activate(t, l1, &old->left);
    if (rc) goto undo1;
    l2->split_of = 0;
    nvh_flush(pool, &l2->split_of, 8);
    nvh_link lk = {kvs_link_of(t, c), nvh_off(pool, l1)};
    rc = nvh_free(pool, old, &lk, 1);
    if (rc) return rc;   /* persistent state finishes at the next open */

    /* DRAM: the companions replace c in the chain and the index */
    c1->sep = c->sep;          /* c's reference passes to c1 */
    c2->sep = s2;
    c1->prev = c->prev;
    c1->next = c2;
    c2->prev = c1;
    c2->next = c->next;
    rc = kvs_ix_replace(t, c, c1, c2, s2);   /* finds c by its separator */
    c->sep = NULL;
    if (c->next) c->next->prev = c2;
    if (c->prev) KVS_STORE(&c->prev->next, c1);
    else t->head = c1;
    KVS_STORE(&c->dead, 1);
    int rc2 = kvs_retire(t, KVS_R_CLEAF, c);
    return rc ? rc : rc2;
undo1: {
        nvh_cancel(pool, m1);
        nvh_link lk2 = {&old->next, l2->next};
        nvh_free(pool, l2, &lk2, 1);
        free(c1); free(c2); free(s2);
        return rc;
    }
undo2:
    nvh_cancel(pool, m1);
    nvh_cancel(pool, m2);
    free(c1); free(c2); free(s2);
    return rc;
}

/* Drop empty leaf c from the chain (one failure-atomic free that moves the
 * link past it) and from the index. Not the only leaf. */
static int kvs_leaf_drop(kv_sorted *t, kvs_cleaf *c)
{
    nvh_link lk = {kvs_link_of(t, c), c->p->next};
    int rc = nvh_free(t->pool, c->p, &lk, 1);
    if (rc) return rc;
    if (c->prev) KVS_STORE(&c->prev->next, c->next);
    else t->head = c->next;
    if (c->next) c->next->prev = c->prev;
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

/* Split or drop locked companion c; c's lock is released before the
 * retired objects (c itself among them) may be freed. */
static int kvs_smo_split(kv_sorted *t, kvs_cleaf *c)
{
    pthread_mutex_lock(&t->smo);
    int rc = kvs_split(t, c);
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

/* Overwrite slot i of locked companion c (old: its record): new record
 * durable, the old one queued (same fence), the activation switches the
 * slot; the old record's free is owed to the next write's fence. */
static int kvs_overwrite(kv_sorted *t, kvs_cleaf *c, int i, uint64_t old, const void *k,
                         size_t kl, const void *v, size_t vl)
{
    nvh_pool *pool = t->pool;
    kvs_slot *s = &c->p->slot[i];
    if (s->rec != old) return kvs_corrupt(t, nvh_off(pool, s), "leaf slot (differs from its companion)");
    unsigned j;
    int rc = kvs_pend_take(t, &j);
    if (rc) return rc;
    kvs_rec *r = kvs_rec_make(t, k, kl, v, vl);
    if (!r) { rc = nvh_errcode(); kvs_pend_release(t, j); return rc; }
    kvs_pend_write(t, j, old, &s->rec);
    rc = kvs_data_fence(t);
    if (rc == NVH_OK) rc = kvs_activate(t, r, &s->rec);
    if (rc) {
        nvh_cancel(pool, r);
        kvs_pend_drop(t, j);
        return rc;
    }
    KVS_STORE(&c->rec[i], nvh_off(pool, r));
    c->was[i] = 0;
    kvs_bytes_add(t, 0, (int64_t)vl - (int64_t)((const kvs_rec *)nvh_ptr(pool, old))->vlen);
    kvs_pend_ready(t, j);
    return NVH_OK;
}

/* Insert into free slot i of locked companion c. */
static int kvs_insert(kv_sorted *t, kvs_cleaf *c, int i, const void *k, size_t kl,
                      uint64_t kp, uint32_t kh, const void *v, size_t vl)
{
    nvh_pool *pool = t->pool;
    kvs_slot *s = &c->p->slot[i];
    uint8_t was = (uint8_t)s->rec;
    kvs_rec *r = kvs_rec_make(t, k, kl, v, vl);
    if (!r) return nvh_errcode();
    s->prefix = kp;
    s->hash = kh;
    s->klen = (uint32_t)kl;
    nvh_flush(pool, &s->prefix, 16);
    int rc = kvs_data_fence(t);
    if (rc == NVH_OK) rc = kvs_activate(t, r, &s->rec);
    if (rc) {
        nvh_cancel(pool, r);
        return rc;
    }
    kvs_ver_begin(c);
    kvs_fp_set(c, (unsigned)i, kh);
    KVS_STORER(&c->hash[i], kh);
    KVS_STORER(&c->klen[i], (uint16_t)kl);
    KVS_STORE(&c->rec[i], nvh_off(pool, r));
    kvs_perm_change(t, c, i, -1);
    kvs_ver_end(c);
    c->was[i] = was;
    c->live++;
    __atomic_add_fetch(&t->count, 1, __ATOMIC_RELAXED);
    kvs_bytes_add(t, (int64_t)kl, (int64_t)vl);
    return NVH_OK;
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
        int err = 0;
        int i = kvs_leaf_find(t, c, k, kl, kp, kh, &old, &err);
        if (err) rc = err;
        else if (i >= 0) rc = kvs_overwrite(t, c, i, old, k, kl, v, vl);
        else {
            for (i = 0; i < (int)KVS_CAP && !kvs_slot_free(c->rec[i]); i++) {}
            if (i == (int)KVS_CAP) {
                rc = kvs_smo_split(t, c);   /* c dies: retry in its halves */
                if (rc) return rc;
                continue;
            }
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
    int err = 0, rc;
    int i = kvs_leaf_find(t, c, k, kl, kp, kh, &old, &err);
    kvs_slot *s = i >= 0 ? &c->p->slot[i] : NULL;
    unsigned j = 0;
    if (err) rc = err;
    else if (i < 0) rc = NVH_E_NOTFOUND;
    else if (s->rec != old) rc = kvs_corrupt(t, nvh_off(pool, s), "leaf slot (differs from its companion)");
    else rc = kvs_pend_take(t, &j);
    if (rc) { kvs_unlock(c); return rc; }
    /* the queued free must be durable before the slot changes (they are
     * in different lines): the data fence, then the tombstone's */
    kvs_pend_write(t, j, old, &s->rec);
    rc = kvs_data_fence(t);
    if (rc) { kvs_pend_drop(t, j); kvs_unlock(c); return rc; }
    s->rec = kvs_tomb_after(c->was[i]);
    nvh_flush(pool, &s->rec, 8);
    nvh_drain(pool);
    kvs_ver_begin(c);
    KVS_STORE(&c->rec[i], 0);
    kvs_perm_change(t, c, -1, i);
    kvs_ver_end(c);
    c->live--;
    __atomic_sub_fetch(&t->count, 1, __ATOMIC_RELAXED);
    {
        const kvs_rec *ro = nvh_ptr(pool, old);
        kvs_bytes_add(t, -(int64_t)ro->klen, -(int64_t)ro->vlen);
    }
    kvs_pend_ready(t, j);
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
