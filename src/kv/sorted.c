/* sorted.c — the sorted engine's life cycle and read side: create, open,
 * close, destroy; the deferred frees of the DRAM objects writers unlink
 * (readers run without locks inside the common epochs); the lazy build of the DRAM state (leaf
 * companions and inner index) at the first operation after open, with the
 * repair of an interrupted split and of queued frees; get, seek, scan and
 * count. The write path is in sorted_write.c, the index in
 * sorted_index.c, the invariant check in sorted_check.c. Design:
 * docs/KV-SORTED.md. */
#include "sorted_int.h"

int kvs_corrupt(const kv_sorted *t, uint64_t off, const char *what)
{
    return nvh_fail(NVH_E_CORRUPT, "sorted tree (header at offset %llu): %s at offset %llu",
                    (unsigned long long)t->hdr_off, what, (unsigned long long)off);
}

/* ==========================================================================
 * Deferred frees of DRAM objects
 * ==========================================================================
 * What a writer unlinks from the index or the leaf chain (index nodes,
 * separators, companions) is stamped with nvh_epoch_now_() after the unlink
 * and freed once every active reader announced a later epoch
 * (common/epoch.c): such a reader began after the unlink and cannot reach
 * it. Records go back to the allocator at once: its don't-allocate FIFO
 * holds freed space back from readers by the same epochs. */
int kvs_retire(kv_sorted *t, uint32_t kind, void *p)
{
    /* before the stamp: iterators validate a companion they kept by this
     * count (kv_sorted_step) */
    if (kind == KVS_R_CLEAF) {
        uint64_t *g = kvs_gen_of(t, p);
        KVS_STORE(g, *g + 1);
    }
    if (t->nret == t->capret) {
        size_t cap = t->capret ? t->capret * 2 : 64;
        kvs_retired *r = realloc(t->ret, cap * sizeof *r);
        if (!r) return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for deferred frees");
        t->ret = r;
        t->capret = cap;
    }
    t->ret[t->nret++] = (kvs_retired){nvh_epoch_now_(), p, kind};
    return NVH_OK;
}

void kvs_cleaf_free(kvs_cleaf *c)
{
    free(c);
}

/* A companion no reader holds any more (under smo): kept as a spare. */
static void kvs_cleaf_spare(kv_sorted *t, kvs_cleaf *c)
{
    if (t->ncspare >= KVS_CSPARE) {
        kvs_cleaf_free(c);
        return;
    }
    c->next = t->cspare;
    t->cspare = c;
    t->ncspare++;
}

/* An index node no reader holds any more (under smo): kept as a spare. */
static void kvs_inode_spare(kv_sorted *t, void *n)
{
    if (t->nispare >= KVS_CSPARE) {
        free(n);
        return;
    }
    memcpy(n, &t->ispare, sizeof(void *));
    t->ispare = n;
    t->nispare++;
}

kvs_inode *kvs_inode_take(kv_sorted *t)
{
    void *n = t->ispare;
    if (!n) return malloc(sizeof(kvs_inode));
    memcpy(&t->ispare, n, sizeof(void *));
    t->nispare--;
    return n;
}

kvs_cleaf *kvs_cleaf_take(kv_sorted *t)
{
    kvs_cleaf *c = t->cspare;
    if (!c) return kvs_cleaf_new();
    t->cspare = c->next;
    t->ncspare--;
    memset(c, 0, sizeof *c);
    return c;
}

void kvs_reclaim(kv_sorted *t, int wait)
{
    while (t->nret) {
        uint64_t min = nvh_epoch_min_active_();
        size_t k = 0;
        for (size_t i = 0; i < t->nret; i++) {
            if (t->ret[i].epoch < min) {
                if (t->ret[i].kind == KVS_R_CLEAF) kvs_cleaf_spare(t, t->ret[i].p);
                else if (t->ret[i].kind == KVS_R_INODE) kvs_inode_spare(t, t->ret[i].p);
                else free(t->ret[i].p);
            } else {
                t->ret[k++] = t->ret[i];
            }
        }
        t->nret = k;
        if (!k) break;
        nvh_epoch_advance_();       /* readers that start now do not hold them */
        if (!wait) break;
        sched_yield();
    }
}

/* ==========================================================================
 * Create, open, close, destroy
 * ========================================================================== */
int kv_sorted_create(nvh_pool *pool, nvh_off_t *link)
{
    if (!pool || !link) return nvh_fail(NVH_E_INVAL, "kv_sorted_create: NULL argument");
    if (pool->readonly) return nvh_fail(NVH_E_READONLY, "kv_sorted_create: pool is read-only");
    nvh_protect_internal_begin(pool);
    kvs_hdr *h = nvh_reserve(pool, sizeof *h);
    int rc;
    if (!h) {
        rc = nvh_fail_context(nvh_errcode(), "kv_sorted_create: header");
    } else {
        memset(h, 0, sizeof *h);
        h->magic = KVS_HDR_MAGIC;
        h->version = KVS_VERSION;
        nvh_persist(pool, h, sizeof *h);
        nvh_off_t *const links[1] = {link};
        rc = nvh_activate(pool, h, links, 1);
        if (rc) nvh_cancel(pool, h);
    }
    nvh_protect_internal_end(pool);
    return rc;
}

kv_sorted *kv_sorted_open(nvh_pool *pool, nvh_off_t root, kv_cmp_fn cmp, void *cmp_arg)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "kv_sorted_open: NULL pool");
        return NULL;
    }
    uint64_t size = nvh_pool_size(pool);
    kvs_hdr *h = nvh_ptr(pool, root);
    if (root == 0 || (root & 63) || size < sizeof *h || root > size - sizeof *h) {
        nvh_fail(NVH_E_CORRUPT, "sorted tree: header offset %llu is outside the pool",
                 (unsigned long long)root);
        return NULL;
    }
    if (h->magic != KVS_HDR_MAGIC) {
        nvh_fail(NVH_E_CORRUPT, "sorted tree: no tree header at offset %llu (bad magic)",
                 (unsigned long long)root);
        return NULL;
    }
    if (h->version != KVS_VERSION && h->version != KVS_HDR_VERSION_SLABS &&
        h->version != KVS_HDR_VERSION_REC8) {
        nvh_fail(NVH_E_VERSION, "sorted tree at offset %llu: format version %u, this library "
                 "reads %u to %u", (unsigned long long)root, h->version, KVS_VERSION,
                 KVS_HDR_VERSION_REC8);
        return NULL;
    }
    kv_sorted *t = aligned_alloc(64, NVH_ALIGN_UP(sizeof *t, (size_t)64));
    if (!t) {
        nvh_fail(NVH_E_NOMEM, "kv_sorted_open: out of memory");
        return NULL;
    }
    memset(t, 0, sizeof *t);
    t->pool = pool;
    t->hdr = h;
    t->hdr_off = root;
    t->cmp = cmp;
    t->cmp_arg = cmp_arg;
    t->readonly = pool->readonly;
    t->slab_rec_max = KVS_SLAB_REC_MAX;
    t->slab_max = KVS_SLAB_MAX;
    pthread_mutex_init(&t->smo, NULL);
    pthread_mutex_init(&t->slab_mu, NULL);
    return t;
}

int kv_sorted_set_slabs_(kv_sorted *t, uint64_t rec_max, uint64_t slab_max)
{
    if (!t || slab_max < KVS_SLAB_MIN || rec_max > slab_max - sizeof(kvs_slab))
        return nvh_fail(NVH_E_INVAL, "kv_sorted_set_slabs_: bad sizes");
    t->slab_rec_max = rec_max;
    t->slab_max = slab_max;
    return NVH_OK;
}

int kv_sorted_set_rec16_(kv_sorted *t, int on)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "kv_sorted_set_rec16_: NULL tree");
    t->rec16 = on;
    return NVH_OK;
}

static void kvs_free_dram(kv_sorted *t)
{
    kvs_reclaim(t, 1);
    for (kvs_cleaf *c = t->head, *n; c; c = n) {
        n = c->next;
        kvs_skey_unref(t, c->sep, 1);
        kvs_cleaf_free(c);
    }
    t->head = NULL;
    kvs_ix_free(t, t->root);
    t->root = NULL;
    free(t->ret);
    t->ret = NULL;
    t->nret = t->capret = 0;
    while (t->cspare) {
        kvs_cleaf *c = t->cspare;
        t->cspare = c->next;
        kvs_cleaf_free(c);
    }
    t->ncspare = 0;
    while (t->ispare) {
        void *n = t->ispare;
        memcpy(&t->ispare, n, sizeof(void *));
        free(n);
    }
    t->nispare = 0;
    kvs_slab_fini(t);
}

int kv_sorted_close(kv_sorted *t)
{
    if (!t) return NVH_OK;
    int rc = NVH_OK;
    pthread_mutex_lock(&t->smo);
    if (!t->readonly && KVS_LOADR(&t->built)) {
        nvh_protect_internal_begin(t->pool);
        rc = kvs_pend_flush(t);
        nvh_protect_internal_end(t->pool);
    }
    kvs_free_dram(t);
    pthread_mutex_unlock(&t->smo);
    pthread_mutex_destroy(&t->smo);
    pthread_mutex_destroy(&t->slab_mu);
    free(t);
    return rc;
}

int kv_sorted_destroy(kv_sorted *t, nvh_off_t *link)
{
    if (!t || !link) return nvh_fail(NVH_E_INVAL, "kv_sorted_destroy: NULL argument");
    if (t->readonly) return nvh_fail(NVH_E_READONLY, "kv_sorted_destroy: pool is read-only");
    if (*link != t->hdr_off)
        return nvh_fail(NVH_E_INVAL, "kv_sorted_destroy: link does not point at the tree");
    int rc = kvs_ensure_built(t);
    if (rc) return rc;
    pthread_mutex_lock(&t->smo);
    nvh_pool *pool = t->pool;
    nvh_protect_internal_begin(pool);
    rc = kvs_pend_flush(t);
    kvs_reclaim(t, 1);
    /* Free from the first leaf on: each record with its slot cleared, then
     * the leaf with hdr->first moved past it; every step failure-atomic, so
     * a crash leaves a smaller tree, never a dangling pointer or a leak. */
    while (rc == NVH_OK && t->head) {
        kvs_cleaf *c = t->head;
        for (unsigned i = 0; i < KVS_CAP && rc == NVH_OK; i++) {
            uint64_t r = c->p->slot[i].rec;
            if (kvs_slot_free(r) || kvs_slab_find(t, r) >= 0) continue;  /* slabs: below */
            nvh_link lk = {&c->p->slot[i].rec, 0};
            rc = nvh_free(pool, nvh_ptr(pool, r), &lk, 1);
        }
        if (rc) break;
        nvh_link lk = {&t->hdr->first, c->p->next};
        rc = nvh_free(pool, c->p, &lk, 1);
        if (rc) break;
        t->head = c->next;
        kvs_skey_unref(t, c->sep, 1);
        c->sep = NULL;
        c->next = NULL;
        /* stays reachable from the index until the DRAM state goes */
        if (t->head) KVS_STORE(&t->head->prev, NULL);
        kvs_cleaf_free(c);
    }
    if (rc == NVH_OK) rc = kvs_slab_destroy(t);
    if (rc == NVH_OK) {
        t->head = NULL;
        kvs_ix_free(t, t->root);
        t->root = NULL;
        nvh_link lk = {link, 0};
        rc = nvh_free(pool, t->hdr, &lk, 1);
    }
    nvh_protect_internal_end(pool);
    if (rc) {
        pthread_mutex_unlock(&t->smo);
        return rc;      /* t stays open (partly destroyed); close it */
    }
    kvs_free_dram(t);
    pthread_mutex_unlock(&t->smo);
    pthread_mutex_destroy(&t->smo);
    pthread_mutex_destroy(&t->slab_mu);
    free(t);
    return NVH_OK;
}

/* ==========================================================================
 * The lazy build
 * ========================================================================== */
/* Companion of persistent leaf l; the summaries are trusted, the record
 * offsets only range-checked here (readers validate a record when they
 * use it, so the build reads no record unless the order needs its key). */
static kvs_cleaf *kvs_companion(kv_sorted *t, kvs_leaf *l, int *err)
{
    kvs_cleaf *c = kvs_cleaf_new();
    if (!c) {
        *err = nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for leaf companions");
        return NULL;
    }
    c->p = l;
    uint64_t size = nvh_pool_size(t->pool);
    for (unsigned i = 0; i < KVS_CAP; i++) {
        const kvs_slot *s = &l->slot[i];
        uint64_t r = s->rec;
        if (kvs_slot_free(r)) {
            c->w[i].was = (uint8_t)r;
            continue;
        }
        if ((r & 63) || r >= size || s->klen == 0 || s->klen > KVS_KEY_MAX) {
            free(c);
            *err = kvs_corrupt(t, nvh_off(t->pool, &l->slot[i]), "leaf slot (record offset)");
            return NULL;
        }
        kvs_fp_set(c, i, s->hash);
        c->w[i].hash = s->hash;
        c->w[i].klen = (uint16_t)s->klen;
        c->w[i].pfx = s->prefix;
        c->rec[i] = r;
        c->live++;
    }
    return c;
}

int kvs_ent_cmp(const kv_sorted *t, const kvs_ent *a, const kvs_ent *b)
{
    if (!t->cmp) {
        int c = kvs_sum_cmp(a->prefix, a->klen, b->prefix, b->klen);
        if (c != 2) return c;
    }
    return kvs_cmp(t, a->v.key, a->v.klen, b->v.key, b->v.klen);
}

int kvs_sum_sort(const kv_sorted *t, const kvs_cleaf *c, const uint64_t *recs, kvs_ent *e,
                 unsigned *n)
{
    /* by (prefix, length, slot): two words per entry; that is the bytewise
     * order unless two keys of over 8 bytes share their prefix
     * (kvs_sum_cmp), which the pass below settles by their records */
    uint64_t pk[KVS_CAP];
    uint32_t lo[KVS_CAP];
    unsigned m = 0;
    for (unsigned s = 0; s < KVS_CAP; s++) {
        if (kvs_slot_free(recs[s])) continue;
        uint64_t xp = KVS_LOADR(&c->w[s].pfx);
        uint32_t xl = (uint32_t)KVS_LOADR(&c->w[s].klen) << 8 | s;
        unsigned j = m++;
        /* prefixes alone in the loop (they rarely tie), lengths at a tie */
        for (; j > 0 && pk[j - 1] > xp; j--) {
            pk[j] = pk[j - 1];
            lo[j] = lo[j - 1];
        }
        for (; j > 0 && pk[j - 1] == xp && lo[j - 1] > xl; j--) {
            pk[j] = pk[j - 1];
            lo[j] = lo[j - 1];
        }
        pk[j] = xp;
        lo[j] = xl;
    }
    for (unsigned i = 0; i < m; i++) {
        unsigned s = lo[i] & 0xff;
        e[i] = (kvs_ent){.rec = recs[s], .prefix = pk[i], .hash = KVS_LOADR(&c->w[s].hash),
                         .klen = lo[i] >> 8, .v = {NULL, NULL, 0, 0}, .slot = s};
    }
    int err = 0;
    for (unsigned i = 0; i + 1 < m; i++) {
        if (e[i].prefix != e[i + 1].prefix || e[i].klen <= 8) continue;
        /* e[i..k): keys over 8 bytes with one prefix, ordered by length */
        unsigned k = i + 1;
        while (k < m && e[k].prefix == e[i].prefix) k++;
        for (unsigned a = i + 1; a < k; a++) {
            kvs_ent x = e[a];
            const kvs_rv *rx = kvs_ent_rec(t, &x, &err);
            if (!rx) return err;
            unsigned j = a;
            for (; j > i; j--) {
                const kvs_rv *rj = kvs_ent_rec(t, &e[j - 1], &err);
                if (!rj) return err;
                if (kvs_bytes_cmp(rj->key, rj->klen, rx->key, rx->klen) <= 0) break;
                e[j] = e[j - 1];
            }
            e[j] = x;
        }
        i = k - 1;
    }
    *n = m;
    return NVH_OK;
}

int kvs_leaf_sorted(const kv_sorted *t, const kvs_cleaf *c, kvs_ent *out, unsigned *n)
{
    unsigned m = 0;
    uint64_t recs[KVS_CAP];
    /* ask for every record's first line at once: they are scattered */
    uint64_t size = nvh_pool_size(t->pool);
    for (unsigned i = 0; i < KVS_CAP; i++) {
        recs[i] = KVS_LOAD(&c->rec[i]);
        if (!kvs_slot_free(recs[i]) && recs[i] < size) __builtin_prefetch(nvh_ptr(t->pool, recs[i]));
    }
    if (!t->cmp) {
        /* bytewise: by the summaries (a few word compares per step); the
         * records then give each entry's key (the caller compares those:
         * a reader racing a slot's reuse may see the next key's summary
         * with the old record, and its version check then fails) */
        int rc = kvs_sum_sort(t, c, recs, out, &m);
        if (rc) return rc;
        for (unsigned i = 0; i < m; i++) {
            if (!out[i].v.key && !kvs_rec_view_in(t, out[i].rec, size, &out[i].v))
                return kvs_corrupt(t, out[i].rec, "record");
            out[i].klen = out[i].v.klen;
            out[i].prefix = kvs_prefix(out[i].v.key, out[i].klen);
        }
        *n = m;
        return NVH_OK;
    }
    for (unsigned i = 0; i < KVS_CAP; i++) {
        uint64_t r = recs[i];
        if (kvs_slot_free(r)) continue;
        kvs_ent e;
        e.rec = r;
        if (!kvs_rec_view(t, r, &e.v)) return kvs_corrupt(t, r, "record");
        /* the summary from the record itself, not the slot's: a reader
         * racing a slot's reuse may see the next key's summary with the
         * old record (the record's first line is read anyway) */
        e.klen = e.v.klen;
        e.prefix = kvs_prefix(e.v.key, e.klen);
        e.hash = KVS_LOADR(&c->w[i].hash);
        e.slot = i;
        unsigned j = m;
        while (j > 0 && kvs_ent_cmp(t, &out[j - 1], &e) > 0) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = e;
        m++;
    }
    *n = m;
    return NVH_OK;
}

/* A reader's sorted copy of c's entries: NVH_OK, an error, or
 * KVS_RETRY if c died or a writer added or removed an entry meanwhile
 * (its seqlock moved: the copy may hold a key twice). */
#define KVS_RETRY 1
/* Entries of c in the order of its cached permutation (tag: valid for the
 * version v the caller read): NVH_OK, an error, or KVS_RETRY if the cache
 * changed while it was read. Slots do not change liveness while the
 * version stays v; the caller checks the version afterwards. */
static int kvs_leaf_cached(const kv_sorted *t, const kvs_cleaf *c, uint64_t tag, kvs_ent *out,
                           unsigned *n)
{
    unsigned m = (unsigned)(tag >> 32) & 0xff;
    uint8_t perm[KVS_CAP];
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x = KVS_LOAD(&c->perm[w]);   /* acquire: the tag load below stays after */
        memcpy(perm + 8 * w, &x, 8);
    }
    if (KVS_LOAD(&c->ptag) != tag || m > KVS_CAP) return KVS_RETRY;
    uint64_t size = nvh_pool_size(t->pool);
    for (unsigned i = 0; i < m; i++) {
        unsigned s = perm[i] % KVS_CAP;
        uint64_t r = KVS_LOAD(&c->rec[s]);
        out[i].rec = r;
        out[i].slot = s;
        if (!kvs_slot_free(r) && r < size) __builtin_prefetch(nvh_ptr(t->pool, r));
    }
    for (unsigned i = 0; i < m; i++) {
        uint64_t r = out[i].rec;
        if (kvs_slot_free(r)) return KVS_RETRY;   /* the version moved */
        if (!kvs_rec_view_in(t, r, size, &out[i].v)) return kvs_corrupt(t, r, "record");
        out[i].klen = out[i].v.klen;
        out[i].prefix = kvs_prefix(out[i].v.key, out[i].v.klen);
        out[i].hash = KVS_LOADR(&c->w[out[i].slot].hash);
    }
    *n = m;
    return NVH_OK;
}

/* Entry i of c's cached order at version v (tag: c->ptag as loaded; a
 * walk in direction dir prefetches the records of the next entries): 1
 * and *r if the cache was valid for v and the leaf still is at v with i
 * one of its entries; 0 if not (the caller reads the whole leaf); -1 on a
 * corrupt record (nvh_errcode()). */
#define KVS_STEP_AHEAD 8u
static int kvs_leaf_cached_one(const kv_sorted *t, const kvs_cleaf *c, uint64_t tag, uint32_t v,
                               unsigned i, int dir, kvs_rv *r)
{
    unsigned m = (unsigned)(tag >> 32) & 0xff;
    if (!kvs_ptag_valid_for(tag, v) || i >= m) return 0;
    uint8_t perm[KVS_CAP];
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x = KVS_LOAD(&c->perm[w]);     /* acquire: the tag load below stays after */
        memcpy(perm + 8 * w, &x, 8);
    }
    if (KVS_LOAD(&c->ptag) != tag) return 0;
    unsigned s = perm[i] % KVS_CAP;
    /* the records the next steps in this direction read: asked for now, so
     * that a walk's misses overlap as a scan's do (only prefetched, never
     * dereferenced: the perm bytes may be torn, the check below is for
     * entry i alone) */
    uint64_t size = nvh_pool_size(t->pool);
    for (unsigned j = 1; j <= KVS_STEP_AHEAD; j++) {
        if (dir < 0 ? i < j : i + j >= m) break;
        uint64_t ro = KVS_LOADR(&c->rec[perm[dir < 0 ? i - j : i + j] % KVS_CAP]);
        if (!kvs_slot_free(ro) && ro < size) kvs_prefetch(nvh_ptr(t->pool, ro), 2);
    }
    uint64_t off = KVS_LOAD(&c->rec[s]);
    if (kvs_slot_free(off)) return 0;
    if (!kvs_rec_view_in(t, off, size, r)) {
        kvs_corrupt(t, off, "record");
        return -1;
    }
    if (KVS_LOAD(&c->ver) != v || KVS_LOAD(&c->dead)) return 0;
    return 1;
}

/* Publish the order of a leaf sorted at version v (out: its entries, each
 * found among c's slots by its record). Best effort: skipped when another
 * reader is filling the cache or has filled it for v already. */
static void kvs_leaf_cache(kvs_cleaf *c, uint32_t v, const kvs_ent *out, unsigned m)
{
    uint64_t old = KVS_LOAD(&c->ptag);
    if (old == KVS_PTAG_BUSY || kvs_ptag_valid_for(old, v)) return;
    uint8_t perm[KVS_CAP] = {0};
    for (unsigned i = 0; i < m; i++) perm[i] = (uint8_t)out[i].slot;
    if (!__atomic_compare_exchange_n(&c->ptag, &old, KVS_PTAG_BUSY, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return;
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x;
        memcpy(&x, perm + 8 * w, 8);
        KVS_STORER(&c->perm[w], x);
    }
    KVS_STORE(&c->ptag, kvs_ptag_make(v, m));
}

void kvs_perm_change(const kv_sorted *t, kvs_cleaf *c, int add, int del)
{
    uint32_t v = c->ver - 1;            /* the version before this change */
    uint64_t old = KVS_LOAD(&c->ptag);
    if (!kvs_ptag_valid_for(old, v)) {
        /* a tag a reader published for a version that had passed would be
         * taken as valid again once the 32-bit version wraps: void it (a
         * reader filling the cache (busy) publishes for its own version,
         * which is past) */
        if (old != 0 && old != KVS_PTAG_BUSY)
            __atomic_compare_exchange_n(&c->ptag, &old, 0, false, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
        return;
    }
    if (!__atomic_compare_exchange_n(&c->ptag, &old, KVS_PTAG_BUSY, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return;
    unsigned m = (unsigned)(old >> 32) & 0xff;
    uint8_t perm[KVS_CAP + 8] = {0};
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x = KVS_LOADR(&c->perm[w]);
        memcpy(perm + 8 * w, &x, 8);
    }
    if (del >= 0) {
        unsigned i = 0;
        while (i < m && perm[i] != del) i++;
        if (i == m) { KVS_STORE(&c->ptag, 0); return; }
        memmove(perm + i, perm + i + 1, m - i - 1);
        m--;
    }
    if (add >= 0) {
        kvs_rv rabuf;
        const kvs_rv *ra = NULL;    /* the new entry's record, once read */
        if (m >= KVS_CAP) { KVS_STORE(&c->ptag, 0); return; }
        unsigned lo = 0, hi = m;   /* first entry above the new key */
        if (!t->cmp) {
            /* bytewise: the first entry whose prefix is not below the new
             * key's, without a branch on each comparison (random keys
             * mispredict half of them); that is the answer unless its
             * prefix ties, which the search below settles */
            const uint64_t ap = c->w[add].pfx;
            unsigned len = m;
            while (len > 0) {
                unsigned half = len / 2;
                bool below = c->w[perm[lo + half]].pfx < ap;
                lo = below ? lo + half + 1 : lo;
                len = below ? len - half - 1 : half;
            }
            if (lo == m || c->w[perm[lo]].pfx != ap) hi = lo;
            else lo = 0;
        }
        while (lo < hi) {
            unsigned mid = (lo + hi) / 2, s = perm[mid];
            /* bytewise: the summaries decide unless they tie */
            int d = t->cmp ? 2 : kvs_sum_cmp(c->w[s].pfx, c->w[s].klen, c->w[add].pfx, c->w[add].klen);
            if (d == 2) {
                kvs_rv rm;
                if (!ra && kvs_rec_view(t, KVS_LOADR(&c->rec[add]), &rabuf)) ra = &rabuf;
                if (!ra || !kvs_rec_view(t, KVS_LOADR(&c->rec[s]), &rm)) {
                    KVS_STORE(&c->ptag, 0);
                    return;
                }
                d = kvs_cmp(t, rm.key, rm.klen, ra->key, ra->klen);
            }
            if (d < 0) lo = mid + 1;
            else hi = mid;
        }
        memmove(perm + lo + 1, perm + lo, m - lo);
        perm[lo] = (uint8_t)add;
        m++;
    }
    for (unsigned w = 0; w < KVS_CAP / 8; w++) {
        uint64_t x;
        memcpy(&x, perm + 8 * w, 8);
        KVS_STORER(&c->perm[w], x);
    }
    KVS_STORE(&c->ptag, kvs_ptag_make(v + 2, m));
}

/* The live entries of c in key order (cached or sorted), consistent at
 * seqlock version *ver (NULL: not wanted), c not dead after the reads; or
 * KVS_RETRY. */
static int kvs_leaf_read(const kv_sorted *t, kvs_cleaf *c, kvs_ent *out, unsigned *n,
                         uint32_t *ver)
{
    uint32_t v = KVS_LOAD(&c->ver);
    if (ver) *ver = v;
    if (v & 1) return KVS_RETRY;
    uint64_t tag = KVS_LOAD(&c->ptag);
    int rc;
    bool cached = kvs_ptag_valid_for(tag, v);
    if (cached) rc = kvs_leaf_cached(t, c, tag, out, n);
    else rc = kvs_leaf_sorted(t, c, out, n);   /* acquire loads of c->rec[] */
    if (KVS_LOAD(&c->ver) != v || KVS_LOAD(&c->dead)) return KVS_RETRY;
    if (rc == NVH_OK && !cached) kvs_leaf_cache(c, v, out, *n);
    return rc;
}

/* Drop from companion c (of leaf l, being built) the records leaf n holds
 * too; tombstone their slots in l when the pool is writable (no fence of
 * its own: the build drains; the open retired every record whose
 * activation could re-apply a link). */
static void kvs_moved_drop(kv_sorted *t, kvs_cleaf *c, const kvs_leaf *n)
{
    for (unsigned i = 0; i < KVS_CAP; i++) {
        uint64_t r = c->rec[i];
        if (kvs_slot_free(r)) continue;
        unsigned s = 0;
        while (s < KVS_CAP && n->slot[s].rec != r) s++;
        if (s == KVS_CAP) continue;
        c->rec[i] = 0;
        c->live--;
        c->w[i].was = 1;
        if (!t->readonly) {
            c->p->slot[i].rec = 1;
            nvh_flush(t->pool, &c->p->slot[i].rec, 8);
        }
    }
}

/* Walk the leaf chain once: finish or undo an interrupted split, drop empty
 * leaves, build the companions and the index. Under smo. */
static int kvs_build(kv_sorted *t)
{
    nvh_pool *pool = t->pool;
    kvs_hdr *h = t->hdr;
    bool w = !t->readonly;
    int rc = NVH_OK;
    /* queued frees: their records, looked up in every live slot below */
    uint64_t pend_rec[KVS_PENDING], pend_live = 0;
    unsigned npend = 0;
    for (unsigned j = 0; w && j < KVS_PENDING; j++) {
        pend_rec[j] = h->pend[j].rec;
        npend += !kvs_slot_free(pend_rec[j]);
    }
    /* record slabs: listed now, their live records counted below (the walk
     * reads every slot anyway), the empty ones freed at the end */
    if (w && (rc = kvs_slab_load(t)) != NVH_OK) return rc;
    size_t n = 0, cap = 64;
    kvs_cleaf **v = malloc(cap * sizeof *v);
    if (!v) return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory");
    uint64_t steps = 0, max_steps = nvh_pool_size(pool) / sizeof(kvs_leaf) + 2;
    nvh_off_t *link = &h->first;
    uint64_t cur = h->first;
    uint64_t count = 0;
    kvs_ent ents[KVS_CAP];
    while (cur) {
        if (++steps > max_steps) { rc = kvs_corrupt(t, cur, "leaf chain (a cycle)"); break; }
        kvs_leaf *l = kvs_leaf_get(t, cur);
        if (!l) { rc = kvs_corrupt(t, cur, "leaf"); break; }
        if (l->left) {
            /* split interrupted after its lower half was activated: finish
             * it (the lower half replaces l in the chain) */
            kvs_leaf *l1 = kvs_leaf_get(t, l->left);
            if (!l1) { rc = kvs_corrupt(t, l->left, "leaf (lower half of a split)"); break; }
            if (w) {
                kvs_leaf *l2 = kvs_leaf_get(t, l->next);
                if (l2 && l2->split_of == cur) {
                    l2->split_of = 0;
                    nvh_flush(pool, &l2->split_of, 8);
                }
                nvh_link lk = {link, l->left};
                rc = nvh_free(pool, l, &lk, 1);
                if (rc) break;
                cur = *link;
                continue;
            }
            cur = l->left;
            l = l1;
        }
        if (l->next) {
            kvs_leaf *nx = kvs_leaf_get(t, l->next);
            if (!nx) { rc = kvs_corrupt(t, l->next, "leaf (chain link)"); break; }
            if (nx->split_of == cur) {
                /* split interrupted before its lower half existed: its upper
                 * half holds copies of l's entries; drop it */
                if (w) {
                    nvh_link lk = {&l->next, nx->next};
                    rc = nvh_free(pool, nx, &lk, 1);
                    if (rc) break;
                    continue;   /* l again */
                }
            }
        }
        uint64_t next = l->next;
        if (!w && next) {
            kvs_leaf *nx = kvs_leaf_get(t, next);
            if (nx && nx->split_of == cur) next = nx->next;
        }
        kvs_cleaf *c = kvs_companion(t, l, &rc);
        if (!c) break;
        /* a split's moved entries belong to the leaf split off l (the
         * tombstones in l may not have been durable) */
        if (n && kvs_moved_of(v[n - 1]->p, l, cur)) kvs_moved_drop(t, c, v[n - 1]->p);
        if (l->next) {
            kvs_leaf *nx = kvs_leaf_get(t, l->next);
            if (nx && kvs_moved_of(nx, l, cur)) kvs_moved_drop(t, c, nx);
        }
        for (unsigned i = 0; npend && i < KVS_CAP; i++) {
            if (kvs_slot_free(c->rec[i])) continue;
            for (unsigned j = 0; j < KVS_PENDING; j++)
                if (pend_rec[j] == c->rec[i]) pend_live |= UINT64_C(1) << j;
        }
        if (c->live == 0 && (n > 0 || next)) {
            free(c);
            if (w) {
                nvh_link lk = {link, l->next};
                rc = nvh_free(pool, l, &lk, 1);
                if (rc) break;
                cur = *link;
            } else {
                cur = next;
            }
            continue;
        }
        if (n > 0) {
            unsigned m;
            rc = kvs_leaf_sorted(t, c, ents, &m);
            if (rc) { free(c); break; }
            kvs_leaf_cache(c, 0, ents, m);
            c->sep = kvs_skey_new(ents[0].v.key, ents[0].v.klen);
            if (!c->sep) { free(c); rc = nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory"); break; }
        }
        if (n == cap) {
            kvs_cleaf **v2 = realloc(v, 2 * cap * sizeof *v);
            if (!v2) { kvs_skey_unref(t, c->sep, 1); free(c); rc = nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory"); break; }
            v = v2;
            cap *= 2;
        }
        if (n) { v[n - 1]->next = c; c->prev = v[n - 1]; }
        v[n++] = c;
        count += c->live;
        link = &l->next;
        cur = next;
    }
    if (w && rc == NVH_OK && npend) rc = kvs_pending_recover(t, pend_live);
    if (w && rc == NVH_OK && t->nsl) {
        for (size_t i = 0; i < n; i++)
            for (unsigned s = 0; s < KVS_CAP; s++)
                if (!kvs_slot_free(v[i]->rec[s])) kvs_slab_count(t, v[i]->rec[s]);
        rc = kvs_slab_loaded(t);
    }
    if (w) nvh_drain(pool);     /* the repairs' flushed words */
    if (rc == NVH_OK) {
        kvs_inode *r = kvs_ix_build(v, n);
        if (!r) rc = nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for the index");
        else {
            t->head = n ? v[0] : NULL;
            t->count = count;
            KVS_STORE(&t->root, r);
        }
    }
    if (rc) {
        for (size_t i = 0; i < n; i++) {
            kvs_skey_unref(t, v[i]->sep, 1);
            free(v[i]);
        }
        kvs_slab_fini(t);
    }
    free(v);
    return rc;
}

int kvs_ensure_built(kv_sorted *t)
{
    if (__builtin_expect(KVS_LOAD(&t->built), 1)) return NVH_OK;
    pthread_mutex_lock(&t->smo);
    int rc = NVH_OK;
    if (!t->built) {
        nvh_protect_internal_begin(t->pool);
        rc = kvs_build(t);
        nvh_protect_internal_end(t->pool);
        if (rc == NVH_OK) KVS_STORE(&t->built, 1);
    }
    pthread_mutex_unlock(&t->smo);
    return rc;
}

/* ==========================================================================
 * Reads
 * ========================================================================== */
static int kvs_key_ok(const void *k, size_t kl, const char *fn)
{
    if (!k || kl == 0) return nvh_fail(NVH_E_INVAL, "%s: empty or NULL key", fn);
    if (kl > KVS_KEY_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: key of %zu bytes exceeds %u", fn, kl, KVS_KEY_MAX);
    return NVH_OK;
}

/* Has c been replaced or removed? Readers ask after reading its slots (all
 * acquire loads, so this load is not hoisted above them): a companion
 * never changes once dead, so a "no" means what was read was current. */
static inline bool kvs_dead(const kvs_cleaf *c)
{
    return KVS_LOAD(&c->dead) != 0;
}

static inline int kvs_emit(const kvs_rv *r, kv_entry_fn fn, void *arg)
{
    return fn ? fn(r->key, r->klen, r->val, r->vlen, arg) : NVH_OK;
}

int kv_sorted_get(kv_sorted *t, const void *k, size_t kl, kv_entry_fn fn, void *arg)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "kv_sorted_get: NULL tree");
    int rc = kvs_key_ok(k, kl, "kv_sorted_get");
    if (rc) return rc;
    if ((rc = kvs_ensure_built(t))) return rc;
    uint64_t kp = kvs_prefix(k, kl);
    uint32_t kh = kvs_hash(k, kl);
    nvh_epoch_enter_();
    for (;;) {
        const kvs_inode *root = KVS_LOAD(&t->root);
        kvs_cleaf *c = kvs_ix_find(t, root, k, kl, kp, NULL);
        if (!c) { rc = NVH_E_NOTFOUND; break; }
        uint64_t rec = 0;
        kvs_rv rv = {NULL, NULL, 0, 0};
        int err = 0;
        int i = kvs_leaf_find(t, c, k, kl, kh, &rec, &rv, &err);
        if (kvs_dead(c)) continue;
        if (err) { rc = err; break; }
        if (i < 0) { rc = NVH_E_NOTFOUND; break; }
        rc = kvs_emit(&rv, fn, arg);
        break;
    }
    nvh_epoch_exit_();
    return rc;
}

/* Key of an entry against (k, kl, kp). */
static inline int kvs_ent_vs(const kv_sorted *t, const kvs_ent *e, const void *k, size_t kl,
                             uint64_t kp)
{
    if (!t->cmp) {
        int c = kvs_sum_cmp(e->prefix, e->klen, kp, kl);
        if (c != 2) return c;
    }
    return kvs_cmp(t, e->v.key, e->v.klen, k, kl);
}

/* kv_sorted_seek; pos (not NULL) receives where the entry found stands,
 * for kv_sorted_step (pos->c NULL: nowhere to step from). KV_SEEK_EQ with
 * a position searches like GE and requires equality. */
static int kvs_seek(kv_sorted *t, enum kv_seek how, const void *k, size_t kl, kv_entry_fn fn,
                    void *arg, kv_sorted_pos *pos)
{
    if (pos) pos->c = NULL;
    int rc;
    if (how != KV_SEEK_FIRST && how != KV_SEEK_LAST) {
        if ((rc = kvs_key_ok(k, kl, "kv_sorted_seek"))) return rc;
    } else {
        k = NULL;
        kl = 0;
    }
    if ((unsigned)how > KV_SEEK_LAST) return nvh_fail(NVH_E_INVAL, "kv_sorted_seek: bad mode %d", (int)how);
    if ((rc = kvs_ensure_built(t))) return rc;
    uint64_t kp = k ? kvs_prefix(k, kl) : 0;
    bool up = how == KV_SEEK_GT || how == KV_SEEK_GE || how == KV_SEEK_FIRST || how == KV_SEEK_EQ;
    kvs_ent ents[KVS_CAP];
    nvh_epoch_enter_();
retry:
    for (;;) {
        const kvs_inode *root = KVS_LOAD(&t->root);
        const kvs_skey *lo = NULL;
        kvs_cleaf *c;
        if (how == KV_SEEK_FIRST) c = kvs_ix_first(root);
        else if (how == KV_SEEK_LAST) c = kvs_ix_last(root, &lo);
        else c = kvs_ix_find(t, root, k, kl, kp, &lo);
        while (c) {
            unsigned n;
            uint32_t ver;
            /* before the read, which sees c not dead after it */
            uint64_t gen = KVS_LOAD(kvs_gen_of(t, c));
            rc = kvs_leaf_read(t, c, ents, &n, &ver);
            if (rc == KVS_RETRY) goto retry;
            if (rc) goto out;
            int hit = -1;
            if (up) {
                for (unsigned i = 0; i < n && hit < 0; i++) {
                    if (!k) hit = (int)i;
                    else {
                        int d = kvs_ent_vs(t, &ents[i], k, kl, kp);
                        if (d > 0 || (d == 0 && how != KV_SEEK_GT)) hit = (int)i;
                        if (hit >= 0 && how == KV_SEEK_EQ && d != 0) { rc = NVH_E_NOTFOUND; goto out; }
                    }
                }
            } else {
                for (unsigned i = n; i-- > 0 && hit < 0;) {
                    if (!k) hit = (int)i;
                    else {
                        int d = kvs_ent_vs(t, &ents[i], k, kl, kp);
                        if (d < 0 || (d == 0 && how == KV_SEEK_LE)) hit = (int)i;
                    }
                }
            }
            if (hit >= 0) {
                if (pos) *pos = (kv_sorted_pos){c, gen, ver, (uint32_t)hit};
                rc = kvs_emit(&ents[hit].v, fn, arg);
                goto out;
            }
            if (up) {
                kvs_cleaf *nx = KVS_LOAD(&c->next);
                if (kvs_dead(c)) goto retry;
                c = nx;
            } else {
                if (!lo) break;
                c = kvs_ix_below(t, root, lo, &lo);
            }
        }
        rc = NVH_E_NOTFOUND;
        goto out;
    }
out:
    nvh_epoch_exit_();
    return rc;
}

int kv_sorted_seek(kv_sorted *t, enum kv_seek how, const void *k, size_t kl,
                   kv_entry_fn fn, void *arg)
{
    if (!t) return nvh_fail(NVH_E_INVAL, "kv_sorted_seek: NULL tree");
    if (how == KV_SEEK_EQ) return kv_sorted_get(t, k, kl, fn, arg);
    return kvs_seek(t, how, k, kl, fn, arg, NULL);
}

int kv_sorted_seek_pos(kv_sorted *t, enum kv_seek how, const void *k, size_t kl,
                       kv_entry_fn fn, void *arg, kv_sorted_pos *pos)
{
    if (!t || !pos) return nvh_fail(NVH_E_INVAL, "kv_sorted_seek_pos: NULL argument");
    return kvs_seek(t, how, k, kl, fn, arg, pos);
}

/* A step from pos without a descent, when its companion is still as the
 * last call left it: not retired since (the retire count of its address's
 * stripe unchanged: read inside this call's epoch, before c is touched, so
 * a companion retired later is not freed before the epoch ends; and c was
 * live after the count was read at the last call, so it was not retired
 * before) and its seqlock has not moved (the same entries in the same
 * order). Past either end of c the step moves to the neighbour in the
 * chain (next, or prev when c's `prev` still names it back), taking that
 * companion's count before checking it is live. Anything else is
 * KVS_RETRY: the caller seeks from its key. */
static int kvs_step(kv_sorted *t, int dir, kv_entry_fn fn, void *arg, kv_sorted_pos *pos)
{
    kvs_ent ents[KVS_CAP];
    kvs_cleaf *c = pos->c;
    if (!c || KVS_LOAD(kvs_gen_of(t, c)) != pos->gen || KVS_LOAD(&c->ver) != pos->ver)
        return KVS_RETRY;
    unsigned n;
    uint32_t ver;
    kvs_rv r;
    int e;
    /* the cached order: one entry of it, or past its end the next leaf */
    uint64_t tag = KVS_LOAD(&c->ptag);
    if (kvs_ptag_valid_for(tag, pos->ver)) {
        n = (unsigned)(tag >> 32) & 0xff;
        if (dir < 0 ? pos->idx > 0 : pos->idx + 1 < n) {
            unsigned to = dir < 0 ? pos->idx - 1 : pos->idx + 1;
            if ((e = kvs_leaf_cached_one(t, c, tag, pos->ver, to, dir, &r)) < 0) return nvh_errcode();
            if (e == 1) {
                pos->idx = to;
                return kvs_emit(&r, fn, arg);
            }
        } else if (dir > 0 && pos->idx + 1 == n) {
            goto next_leaf;
        } else if (dir < 0 && pos->idx == 0) {
            goto prev_leaf;
        }
    }
    int rc = kvs_leaf_read(t, c, ents, &n, &ver);
    if (rc) return rc;
    if (ver != pos->ver || pos->idx >= n) return KVS_RETRY;
    if (dir < 0) {
        if (pos->idx == 0) goto prev_leaf;
        pos->idx--;
        return kvs_emit(&ents[pos->idx].v, fn, arg);
    }
    if (pos->idx + 1 < n) {
        pos->idx++;
        return kvs_emit(&ents[pos->idx].v, fn, arg);
    }
next_leaf: {
        /* its keys are all above c's while c is live (and at the version
         * whose last entry pos names) */
        kvs_cleaf *nx = KVS_LOAD(&c->next);
        if (KVS_LOAD(&c->ver) != pos->ver || kvs_dead(c)) return KVS_RETRY;
        if (!nx) {
            pos->c = NULL;
            return NVH_E_NOTFOUND;
        }
        /* nx's count before it is seen live (by the reads below) */
        uint64_t gen = KVS_LOAD(kvs_gen_of(t, nx));
        ver = KVS_LOAD(&nx->ver);
        if ((e = kvs_leaf_cached_one(t, nx, KVS_LOAD(&nx->ptag), ver, 0, 1, &r)) < 0)
            return nvh_errcode();
        if (e == 0) {
            rc = kvs_leaf_read(t, nx, ents, &n, &ver);
            if (rc) return rc;
            if (n == 0) return KVS_RETRY;
            r = ents[0].v;
        }
        *pos = (kv_sorted_pos){nx, gen, ver, 0};
        return kvs_emit(&r, fn, arg);
    }
prev_leaf: {
        /* pv precedes c while both are live and pv->next is c: its last
         * entry is the key before c's first (the one pos names, c being
         * at pos's version). A companion's prev is stored (release) before
         * the one it named is retired, as next is. */
        kvs_cleaf *pv = KVS_LOAD(&c->prev);
        if (KVS_LOAD(&c->ver) != pos->ver || kvs_dead(c)) return KVS_RETRY;
        if (!pv) {              /* c is the first leaf: nothing before it */
            pos->c = NULL;
            return NVH_E_NOTFOUND;
        }
        uint64_t gen = KVS_LOAD(kvs_gen_of(t, pv));
        if (KVS_LOAD(&pv->next) != c || kvs_dead(pv)) return KVS_RETRY;
        ver = KVS_LOAD(&pv->ver);
        uint64_t ptag = KVS_LOAD(&pv->ptag);
        n = (unsigned)(ptag >> 32) & 0xff;
        e = 0;
        if (n && (e = kvs_leaf_cached_one(t, pv, ptag, ver, n - 1, -1, &r)) < 0)
            return nvh_errcode();
        if (e == 0) {
            rc = kvs_leaf_read(t, pv, ents, &n, &ver);
            if (rc) return rc;
            if (n == 0) return KVS_RETRY;
            r = ents[n - 1].v;
        }
        /* still neighbours at those versions */
        if (KVS_LOAD(&pv->next) != c || KVS_LOAD(&c->ver) != pos->ver || kvs_dead(c))
            return KVS_RETRY;
        *pos = (kv_sorted_pos){pv, gen, ver, n - 1};
        return kvs_emit(&r, fn, arg);
    }
}

#ifdef NVH_TEST_HOOKS
_Atomic unsigned long kvs_test_step_seeks_;
#endif

int kv_sorted_step(kv_sorted *t, int dir, const void *k, size_t kl, kv_entry_fn fn, void *arg,
                   kv_sorted_pos *pos)
{
    if (!t || !pos) return nvh_fail(NVH_E_INVAL, "kv_sorted_step: NULL argument");
    int rc = KVS_RETRY;
    if (pos->c) {
        nvh_epoch_enter_();
        rc = kvs_step(t, dir, fn, arg, pos);
        nvh_epoch_exit_();
    }
    if (rc != KVS_RETRY) return rc;
#ifdef NVH_TEST_HOOKS
    kvs_test_step_seeks_++;
#endif
    return kvs_seek(t, dir < 0 ? KV_SEEK_LT : KV_SEEK_GT, k, kl, fn, arg, pos);
}

/* Scan: a cursor (the last key passed to fn) makes each key appear once
 * however the leaves change under the scan: after a leaf died, or every
 * KVS_SCAN_REENTER leaves (so that a long scan does not hold back the
 * writers' frees), the scan leaves its epoch and descends again to the
 * cursor. */
#define KVS_SCAN_REENTER 64

typedef struct kvs_bound {
    const void *k;
    size_t kl;
    uint64_t kp;
    int incl;
} kvs_bound;

static int kvs_scan(kv_sorted *t, kvs_bound lo, kvs_bound hi, kv_entry_fn fn, void *arg,
                    uint64_t *count)
{
    uint8_t *cur = malloc(KVS_KEY_MAX);
    if (!cur) return nvh_fail(NVH_E_NOMEM, "kv_sorted_scan: out of memory");
    kvs_bound c0 = lo;           /* entries must be above c0 (incl: or equal) */
    kvs_ent ents[KVS_CAP];
    int rc = NVH_OK;
    uint64_t cnt = 0;
    nvh_epoch_enter_();
    unsigned leaves = 0;
    const kvs_inode *root = KVS_LOAD(&t->root);
    kvs_cleaf *c = c0.k ? kvs_ix_find(t, root, c0.k, c0.kl, c0.kp, NULL) : kvs_ix_first(root);
    bool filter = c0.k != NULL;   /* after a descent: skip keys up to the cursor */
    while (c) {
        unsigned n;
        rc = kvs_leaf_read(t, c, ents, &n, NULL);
        if (rc == KVS_RETRY) {
            rc = NVH_OK;
            goto redescend;
        }
        if (rc) break;
        int last = -1;
        for (unsigned i = 0; i < n; i++) {
            if (filter) {
                int d = kvs_ent_vs(t, &ents[i], c0.k, c0.kl, c0.kp);
                if (d < 0 || (d == 0 && !c0.incl)) continue;
                filter = false;   /* sorted: the rest are above it too */
            }
            if (hi.k) {
                int d = kvs_ent_vs(t, &ents[i], hi.k, hi.kl, hi.kp);
                if (d > 0 || (d == 0 && !hi.incl)) goto done;
            }
            cnt++;
            last = (int)i;
            if (fn) {
                rc = kvs_emit(&ents[i].v, fn, arg);
                if (rc) goto done;
            }
        }
        if (last >= 0) {
            /* the cursor: the leaf's last key passed on (the next leaf's keys
             * are all above it; after a descent they are filtered) */
            memcpy(cur, ents[last].v.key, ents[last].klen);
            c0.k = cur;
            c0.kl = ents[last].klen;
            c0.kp = ents[last].prefix;
            c0.incl = 0;
        }
        {
            kvs_cleaf *nx = KVS_LOAD(&c->next);
            if (kvs_dead(c)) goto redescend;
            if (!nx) break;
            if (++leaves % KVS_SCAN_REENTER) {
                c = nx;
                continue;
            }
        }
        nvh_epoch_exit_();
        nvh_epoch_enter_();
    redescend:
        root = KVS_LOAD(&t->root);
        c = c0.k ? kvs_ix_find(t, root, c0.k, c0.kl, c0.kp, NULL) : kvs_ix_first(root);
        filter = c0.k != NULL;
    }
done:
    nvh_epoch_exit_();
    free(cur);
    if (count) *count = cnt;
    return rc;
}

static int kvs_bound_set(kvs_bound *b, const void *k, size_t kl, int incl, const char *fn)
{
    b->k = k;
    b->kl = kl;
    b->incl = incl;
    b->kp = 0;
    if (!k) return NVH_OK;
    int rc = kvs_key_ok(k, kl, fn);
    if (rc) return rc;
    b->kp = kvs_prefix(k, kl);
    return NVH_OK;
}

int kv_sorted_scan(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                   const void *hi, size_t hil, int hi_incl, kv_entry_fn fn, void *arg)
{
    if (!t || !fn) return nvh_fail(NVH_E_INVAL, "kv_sorted_scan: NULL argument");
    kvs_bound a, b;
    int rc = kvs_bound_set(&a, lo, lol, lo_incl, "kv_sorted_scan");
    if (!rc) rc = kvs_bound_set(&b, hi, hil, hi_incl, "kv_sorted_scan");
    if (!rc) rc = kvs_ensure_built(t);
    if (rc) return rc;
    return kvs_scan(t, a, b, fn, arg, NULL);
}

int kv_sorted_count(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                    const void *hi, size_t hil, int hi_incl, uint64_t *count)
{
    if (!t || !count) return nvh_fail(NVH_E_INVAL, "kv_sorted_count: NULL argument");
    kvs_bound a, b;
    int rc = kvs_bound_set(&a, lo, lol, lo_incl, "kv_sorted_count");
    if (!rc) rc = kvs_bound_set(&b, hi, hil, hi_incl, "kv_sorted_count");
    if (!rc) rc = kvs_ensure_built(t);
    if (rc) return rc;
    if (!lo && !hi) {
        *count = KVS_LOAD(&t->count);
        return NVH_OK;
    }
    return kvs_scan(t, a, b, NULL, NULL, count);
}

/* ==========================================================================
 * Key and value bytes
 * ========================================================================== */
static int kvs_bytes_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    (void)k, (void)v;
    int64_t *s = arg;
    s[0] += (int64_t)kl;
    s[1] += (int64_t)vl;
    return 0;
}

int kv_sorted_bytes_known(kv_sorted *t)
{
    return t && KVS_LOAD(&t->bytes_known);
}

int kv_sorted_bytes(kv_sorted *t, uint64_t *key_bytes, uint64_t *value_bytes)
{
    if (!t || !key_bytes || !value_bytes) return nvh_fail(NVH_E_INVAL, "kv_sorted_bytes: NULL argument");
    int rc = kvs_ensure_built(t);
    if (rc) return rc;
    if (!KVS_LOAD(&t->bytes_known)) {
        /* once per open: the entries as they are (no writer runs: the
         * caller's promise), less what writers changed since the open */
        pthread_mutex_lock(&t->smo);
        if (!t->bytes_known) {
            int64_t s[2] = {0, 0};
            kvs_bound none = {NULL, 0, 0, 0};
            rc = kvs_scan(t, none, none, kvs_bytes_fn, s, NULL);
            if (rc == NVH_OK) {
                t->kbase = s[0] - KVS_LOADR(&t->dkbytes);
                t->vbase = s[1] - KVS_LOADR(&t->dvbytes);
                KVS_STORE(&t->bytes_known, 1);
            }
        }
        pthread_mutex_unlock(&t->smo);
        if (rc) return rc;
    }
    *key_bytes = (uint64_t)(t->kbase + KVS_LOADR(&t->dkbytes));
    *value_bytes = (uint64_t)(t->vbase + KVS_LOADR(&t->dvbytes));
    return NVH_OK;
}
