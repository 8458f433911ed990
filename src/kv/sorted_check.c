/* sorted_check.c — the sorted engine's invariant check (kv_sorted_check,
 * nvh_kv_check): walks the persistent leaf chain and the DRAM state
 * together, and reports the first violation as
 * NVH_E_CORRUPT naming the structure and its offset (the caller keeps
 * writers out: nvh_kv_check holds the store's write lock exclusively):
 *   - every leaf valid (magic, version, owner), no split left unfinished;
 *   - the companions mirror the leaves slot by slot, the index lists the
 *     companions in chain order and routes every key to its own leaf;
 *   - every record valid, its key matching the slot's summary;
 *   - keys strictly ascending along the chain (no duplicates);
 *   - the entry count; the queued frees match the DRAM bitmap. */
#include "sorted_int.h"

static int chk_index_order(kv_sorted *t, const kvs_inode *n, kvs_cleaf **expect, int depth)
{
    if (depth > KVS_DEPTH_MAX) return kvs_corrupt(t, 0, "sorted index (too deep)");
    if (n->n == 0 || n->n > KVS_FAN) return kvs_corrupt(t, 0, "sorted index (node fill)");
    for (unsigned i = 0; i < n->n; i++) {
        if (n->level == 0) {
            if (n->child[i] != *expect)
                return kvs_corrupt(t, *expect ? nvh_off(t->pool, (*expect)->p) : 0,
                                   "sorted index (leaf order differs from the chain)");
            *expect = (*expect)->next;
        } else {
            int rc = chk_index_order(t, n->child[i], expect, depth + 1);
            if (rc) return rc;
        }
    }
    return NVH_OK;
}

static int chk_run(kv_sorted *t)
{
    nvh_pool *pool = t->pool;
    uint64_t count = 0, steps = 0, max_steps = nvh_pool_size(pool) / sizeof(kvs_leaf) + 2;
    uint64_t cur = t->hdr->first;
    kvs_cleaf *c = t->head;
    kvs_ent e[KVS_CAP];
    uint8_t *last = malloc(KVS_KEY_MAX);
    size_t lastlen = 0;
    int have_last = 0, rc = NVH_OK;
    /* live records found in each slab (writable trees: the table is built) */
    bool w = !t->readonly;
    uint64_t *scount = w && t->nsl ? calloc(t->nsl, sizeof *scount) : NULL;
    if (!last || (w && t->nsl && !scount)) {
        free(last);
        free(scount);
        return nvh_fail(NVH_E_NOMEM, "kv_sorted_check: out of memory");
    }
    const kvs_inode *root = t->root;
    if (root && root->n) {
        kvs_cleaf *x = t->head;
        rc = chk_index_order(t, root, &x, 0);
        if (!rc && x) rc = kvs_corrupt(t, nvh_off(pool, x->p), "sorted index (misses a leaf)");
    }
    /* A writable tree's chain is exactly its companions (the build repaired
     * it); a read-only one is checked through its companions only (the
     * build read interrupted splits and empty leaves past them). */
    if (!w) cur = c ? nvh_off(pool, c->p) : 0;
    while (rc == NVH_OK && cur) {
        if (++steps > max_steps) { rc = kvs_corrupt(t, cur, "leaf chain (a cycle)"); break; }
        kvs_leaf *l = kvs_leaf_get(t, cur);
        if (!l) { rc = kvs_corrupt(t, cur, "leaf"); break; }
        if (!c || c->p != l) { rc = kvs_corrupt(t, cur, "leaf (no companion in chain order)"); break; }
        if (w && (l->left || l->split_of)) { rc = kvs_corrupt(t, cur, "leaf (unfinished split)"); break; }
        unsigned live = 0;
        for (unsigned i = 0; i < KVS_CAP; i++) {
            const kvs_slot *s = &l->slot[i];
            uint64_t off_s = nvh_off(pool, s);
            if (kvs_slot_free(s->rec) != kvs_slot_free(c->rec[i]) ||
                (!kvs_slot_free(s->rec) && s->rec != c->rec[i])) {
                rc = kvs_corrupt(t, off_s, "leaf slot (differs from its companion)");
                break;
            }
            if (kvs_slot_free(s->rec)) {
                if (w && c->w[i].was != s->rec) {
                    rc = kvs_corrupt(t, off_s, "leaf slot (free value differs from its companion)");
                    break;
                }
                continue;
            }
            kvs_rv r;
            if (!kvs_rec_view(t, s->rec, &r)) { rc = kvs_corrupt(t, s->rec, "record"); break; }
            if (kvs_rec_is8(nvh_ptr(t->pool, s->rec)) && t->hdr->version < KVS_HDR_VERSION_REC8) {
                rc = kvs_corrupt(t, s->rec, "record (8-byte header in a tree of version 1 or 2)");
                break;
            }
            if (scount) {
                long si = kvs_slab_find(t, s->rec);
                if (si >= 0 && s->rec + kvs_rv_bytes(t, s->rec, &r) > t->sl[si]->end) {
                    rc = kvs_corrupt(t, s->rec, "record (crosses its slab's end)");
                    break;
                }
                if (si >= 0) scount[si]++;
            }
            if (r.klen != s->klen || kvs_prefix(r.key, r.klen) != s->prefix ||
                kvs_hash(r.key, r.klen) != s->hash || c->w[i].klen != s->klen ||
                c->w[i].hash != s->hash || c->w[i].pfx != s->prefix ||
                kvs_fp_at(c, i) != kvs_fp(s->hash)) {
                rc = kvs_corrupt(t, off_s, "leaf slot (summary does not match its record)");
                break;
            }
            const kvs_skey *lo = NULL;
            if (kvs_ix_find(t, root, r.key, r.klen, s->prefix, &lo) != c) {
                rc = kvs_corrupt(t, off_s, "leaf slot (key outside the leaf's range)");
                break;
            }
            live++;
        }
        if (rc) break;
        if (live != c->live) { rc = kvs_corrupt(t, cur, "leaf (live count of its companion)"); break; }
        unsigned n;
        if ((rc = kvs_leaf_sorted(t, c, e, &n))) break;
        /* readers trust a cached key order valid for the leaf's version */
        uint64_t tag = c->ptag;
        if (kvs_ptag_valid_for(tag, c->ver)) {
            const uint8_t *perm = (const uint8_t *)c->perm;
            bool ok = ((tag >> 32) & 0xff) == n;
            for (unsigned i = 0; ok && i < n; i++) ok = perm[i] == e[i].slot;
            if (!ok) { rc = kvs_corrupt(t, cur, "leaf (cached key order of its companion)"); break; }
        }
        for (unsigned i = 0; i < n; i++) {
            if (have_last && kvs_cmp(t, last, lastlen, e[i].v.key, e[i].klen) >= 0) {
                rc = kvs_corrupt(t, e[i].rec, "record (keys not ascending: duplicate or out of order)");
                break;
            }
            memcpy(last, e[i].v.key, e[i].klen);
            lastlen = e[i].klen;
            have_last = 1;
        }
        count += live;
        cur = w ? l->next : (c->next ? nvh_off(pool, c->next->p) : 0);
        c = c->next;
    }
    if (rc == NVH_OK && c) rc = kvs_corrupt(t, nvh_off(pool, c->p), "leaf companion (beyond the chain)");
    if (rc == NVH_OK && count != KVS_LOAD(&t->count))
        rc = nvh_fail(NVH_E_CORRUPT, "sorted tree (header at offset %llu): %llu entries, the "
                      "count says %llu", (unsigned long long)t->hdr_off,
                      (unsigned long long)count, (unsigned long long)t->count);
    /* entries whose clear a split still owes stay in use until it is
     * durable: complete those first */
    if (!t->readonly) kvs_owed_settle(t);
    for (unsigned j = 0; rc == NVH_OK && !t->readonly && j < KVS_PENDING; j++) {
        bool used = (KVS_LOAD(&t->pend_used) >> j) & 1;
        if (used != !kvs_slot_free(t->hdr->pend[j].rec))
            rc = kvs_corrupt(t, nvh_off(pool, &t->hdr->pend[j]), "queued free (differs from DRAM)");
    }
    if (rc == NVH_OK && w) {
        kvs_spin_lock(&t->slab_lock);
        rc = kvs_slab_check(t, scount);
        kvs_spin_unlock(&t->slab_lock);
    }
    free(scount);
    free(last);
    return rc;
}

int kv_sorted_check(kv_sorted *t)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "kv_sorted_check: NULL tree");
    int rc = kvs_ensure_built(t);
    if (rc) return rc;
    pthread_mutex_lock(&t->smo);
    rc = chk_run(t);
    pthread_mutex_unlock(&t->smo);
    return rc;
}
