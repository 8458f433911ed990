/* hashmap_ops.c — the persistent hash map's operations: search, put /
 * insert / update (new entry published by one allocator activation whose
 * link is the predecessor's `next`), delete (one allocator free whose link
 * redirects the predecessor), get, foreach, count. Each modification is
 * failure-atomic and durable when the call returns. Design and costs:
 * docs/HASHMAP.md. */
#include "hashmap.h"
#include "../protect/protect.h"

/* ==========================================================================
 * Helpers
 * ========================================================================== */
/* A writer holds its key's stripe lock (hashmap.h: writers of different
 * stripes never store the same word). */
static inline void hm_lock(struct hm_stripe *st) { pthread_mutex_lock(&st->lock); }
static inline void hm_unlock(struct hm_stripe *st) { pthread_mutex_unlock(&st->lock); }

enum hm_mode { HM_PUT, HM_INSERT, HM_UPDATE };

/* Allocator calls run inside an implicit protection window, with an
 * explicit one on the link word (hashmap.c, "Protection windows"). */
/* nvh_free with one link update. */
static inline int hm_free(nvh_pool *pool, void *p, nvh_off_t *link, nvh_off_t value)
{
    nvh_link l = {link, value};
    if (!hm_window_(pool)) return nvh_free(pool, p, &l, 1);     /* hashmap.h */
    nvh_protect_open_(pool, link, 8);
    nvh_protect_internal_begin(pool);
    int rc = nvh_free(pool, p, &l, 1);
    nvh_protect_internal_end(pool);
    nvh_protect_close_(pool, link, 8);
    return rc;
}


static inline int hm_check_key(const void *key, size_t klen, const char *fn)
{
    if (!key && klen) return nvh_fail(NVH_E_INVAL, "%s: NULL key", fn);
    if (klen > NVH_HMAP_KEY_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: key of %zu bytes (at most %u)", fn, klen,
                        NVH_HMAP_KEY_MAX);
    return NVH_OK;
}

/* Where a read-only search starts: the bucket's dummy if it is linked, else
 * the nearest linked ancestor's (which precedes it in split order, so the
 * entry, if present, lies further along the list). Never writes. */
static inline struct nvh_hm_dummy *hm_start_ro(const struct nvh_hmap *m, uint64_t h63)
{
    uint64_t b = h63 & (hm_ld(&m->nbuckets) - 1);
    for (;;) {
        struct nvh_hm_dummy *d = hm_dummy(m, b);
        if (__builtin_expect(hm_dummy_ready(m, b, d), 1) || b == 0) return d;
        b = hm_parent(b);
    }
}

/* ==========================================================================
 * Search
 * ========================================================================== */
int nvh_hm_corrupt_(const struct nvh_hmap *m, uint64_t off, const char *what)
{
    return nvh_fail(NVH_E_CORRUPT, "hash map (root at offset %llu): %s at offset %llu",
                    (unsigned long long)m->root_off, what, (unsigned long long)off);
}

struct nvh_hm_node *nvh_hm_find_(struct nvh_hmap *m, struct nvh_hm_link *start, uint64_t so,
                                 const void *key, uint32_t klen, uint64_t **prev_out)
{
    uint64_t *prev = &start->next;
    uint64_t last = 0;             /* not start->so_key: a dummy's key is not checked */
    unsigned run = 0;
    for (;;) {
        uint64_t cur = hm_ld(prev);
        if (!cur) break;
        struct nvh_hm_link *n = hm_node_at(m, cur);
        if (!n || n->so_key < last || (n->so_key == last && ++run > HM_MAX_RUN)) {
            nvh_hm_corrupt_(m, nvh_off(m->pool, prev), n ? "list out of order (a cycle)"
                                                          : "list link to a non-node");
            *prev_out = NULL;
            return NULL;
        }
        uint64_t nso = n->so_key;
        if (nso != last) run = 0;
        last = nso;
        if (nso > so) break;
        if (nso == so) {             /* same 63-bit hash: compare the key bytes */
            struct nvh_hm_node *e = (struct nvh_hm_node *)n;
            /* the key and value may span 2 more lines: start those misses
             * together rather than one after the other */
            uint64_t len = sizeof *e + (uint64_t)e->klen + e->vlen;
            if (len > 64) __builtin_prefetch((const char *)e + 64);
            if (len > 128) __builtin_prefetch((const char *)e + 128);
            if (e->klen == klen && (klen == 0 || memcmp(e->data, key, klen) == 0)) {
                *prev_out = prev;
                return e;
            }
        }
        prev = &n->next;
    }
    *prev_out = prev;
    return NULL;
}

/* ==========================================================================
 * Put / insert / update
 * ========================================================================== */
/* Copy the value after the header and key bytes already stored at e, and
 * flush the whole entry, each line once: the value is copied up to the end
 * of the line the key ends in first, so that line is flushed once with the
 * header, and the rest starts on a line boundary (e is line-aligned: the
 * allocator's NVH_ALLOC_ALIGN), copied and flushed (or streamed, for long
 * values) by nvh_memcpy_nodrain. Flushing the header and then the value
 * from its unaligned start wrote the shared line back twice. */
static inline void hm_fill_value(nvh_pool *pool, struct nvh_hm_node *e, size_t klen,
                                 const void *val, size_t vlen)
{
    size_t hk = sizeof *e + klen;
    size_t head = (NVH_CACHELINE - hk % NVH_CACHELINE) % NVH_CACHELINE;
    if (head > vlen) head = vlen;
    if (head) memcpy(e->data + klen, val, head);
    nvh_flush(pool, e, hk + head);
    if (vlen > head)
        nvh_memcpy_nodrain(pool, e->data + klen + head, (const uint8_t *)val + head, vlen - head);
}

/* Fill and persist a new entry, then publish it with ONE activation whose
 * link is `*prev` (the predecessor's next, or a dummy's):
 *   fence 1  entry content (+ a pending slot for an update) durable: a redo
 *            record must never reach the media before what it publishes
 *            (its line can be evicted before its own fence);
 *   fence 2  nvh_activate: allocation + link, failure-atomic;
 *   fence 3  (update only) nvh_free of the old entry with the slot as its
 *            link, so the free and the clearing of the slot are atomic.
 * A crash between 2 and 3 leaves the slot naming the unreachable old entry:
 * open frees it (hashmap.c, hm_recover_pending). Each update in flight has
 * a slot of its own (root->pending, pending2[0..1]: HM_SLOTS), so writers
 * of different stripes update in parallel. Nothing is ever reachable
 * half-written, and a reader never sees the old and new entry both. */
/* Entries up to this size are reserved before the search (hm_write). */
#define HM_EARLY_RESERVE 1024u

/* Where a write's search starts, computed before its stripe lock: the
 * bucket (of the bucket count then), its dummy and the mark that says it
 * is linked. The dummy's miss is started at once (a hint: no lock needed,
 * the directory is published before the bucket count). */
struct hm_where {
    uint64_t nb;
    struct nvh_hm_dummy *d;
    uint64_t check;
};

static inline void hm_where_of(const struct nvh_hmap *m, uint64_t h63, struct hm_where *w)
{
    w->nb = hm_ld(&m->nbuckets);
    uint64_t bucket = h63 & (w->nb - 1);
    unsigned s;
    uint64_t i;
    hm_locate(m->base_log2, bucket, &s, &i);
    w->d = &m->seg_ptr[s][i];
    __builtin_prefetch(w->d);
    w->check = hm_dummy_check(m->seed, bucket, m->seg_off[s]);
}

/* Start the miss on the first node after the bucket's dummy (or the
 * ancestor's a lookup would start at), once the dummy's own miss has had
 * the reservation's time to complete: the search's first dependent miss
 * then overlaps the entry's fill and the lock. Lock-free, as a lookup's
 * start (hm_start_ro: it reads only marked dummies, which writers change
 * with atomic stores); the node is never dereferenced here, so one freed
 * meanwhile costs nothing. */
static inline void hm_prefetch_run(const struct nvh_hmap *m, uint64_t h63,
                                   const struct hm_where *w)
{
    const struct nvh_hm_dummy *start =
        __builtin_expect(hm_ld(&w->d->check) == w->check, 1) ? w->d : hm_start_ro(m, h63);
    uint64_t next = hm_ld(&start->next);
    if (next) __builtin_prefetch(nvh_ptr(m->pool, next));
}

/* The dummy a write searches from, under its stripe lock: the one found
 * before the lock if it is still the bucket's and marked (a mark, once
 * stored, stays while the map is open; the recheck costs a load of a line
 * just read), else the bucket's dummy linked now if need be. */
static inline struct nvh_hm_dummy *hm_write_bucket(struct nvh_hmap *m, struct hm_stripe *st,
                                                   uint64_t h63, const struct hm_where *w)
{
    if (__builtin_expect(hm_ld(&m->nbuckets) == w->nb && hm_ld(&w->d->check) == w->check, 1))
        return w->d;
    return nvh_hm_bucket_(m, st, h63);
}

/* A write that stops before publishing: unlock, give the early
 * reservation back, return rc (any message is recorded by the caller). */
static int hm_write_abort(struct nvh_hmap *m, struct hm_stripe *st, struct nvh_hm_node *e,
                          size_t size, int rc)
{
    hm_unlock(st);
    if (e) {
        nvh_protect_close_(m->pool, e, size);
        hm_cancel(m->pool, e);
    }
    return rc;
}

/* An entry's header (all but `next`, which the search gives) and key. */
static inline void hm_fill_header(struct nvh_hm_node *e, uint64_t so, const void *key,
                                  size_t klen, size_t vlen)
{
    e->so_key = so;
    e->klen = (uint32_t)klen;
    e->vlen = (uint32_t)vlen;
    e->magic = NVH_HM_NODE_MAGIC;
    e->reserved = 0;
    if (klen) memcpy(e->data, key, klen);
}

static int hm_write(struct nvh_hmap *m, const void *key, size_t klen, const void *val,
                    size_t vlen, enum hm_mode mode, const char *fn)
{
    if (!m) return nvh_fail(NVH_E_INVAL, "%s: NULL map", fn);
    int rc = hm_check_key(key, klen, fn);
    if (rc != NVH_OK) return rc;
    if (!val && vlen) return nvh_fail(NVH_E_INVAL, "%s: NULL value", fn);
    if (vlen > NVH_HMAP_VALUE_MAX)
        return nvh_fail(NVH_E_TOOLONG, "%s: value of %zu bytes (at most %llu)", fn, vlen,
                        (unsigned long long)NVH_HMAP_VALUE_MAX);
    nvh_pool *pool = m->pool;
    if (pool->readonly) return nvh_fail(NVH_E_READONLY, "%s: pool is read-only", fn);
    uint64_t h63 = hm_h63(hm_hash(m->seed, key, klen));
    uint64_t so = hm_entry_so(h63);
    size_t size = sizeof(struct nvh_hm_node) + klen + vlen;

    /* The bucket's dummy and the new entry's lines are cache misses the
     * search and the copy would take one after the other: start the
     * dummy's now, and reserve and fill a small entry (all but its `next`,
     * unflushed) before taking the lock, so that both overlap with the
     * lock and the search. A reservation is DRAM only: the rare write that
     * fails below cancels it. A large entry is reserved after the search. */
    struct hm_where w;
    hm_where_of(m, h63, &w);
    struct nvh_hm_node *e = NULL;
    if (size <= HM_EARLY_RESERVE) {
        e = hm_reserve(pool, size);
        if (!e) return nvh_errcode();
        hm_prefetch_run(m, h63, &w);
        nvh_protect_open_(pool, e, size);       /* closed after fence 1 (or abort) */
        hm_fill_header(e, so, key, klen, vlen);
        if (vlen) memcpy(e->data + klen, val, vlen);
    }

    struct hm_stripe *st = hm_stripe_of(m, h63);
    hm_lock(st);
    struct nvh_hm_dummy *d = hm_write_bucket(m, st, h63, &w);
    if (!d) return hm_write_abort(m, st, e, size, nvh_errcode());
    uint64_t *prev;
    struct nvh_hm_node *old = nvh_hm_find_(m, (struct nvh_hm_link *)d, so, key, (uint32_t)klen,
                                           &prev);
    if (!prev) return hm_write_abort(m, st, e, size, NVH_E_CORRUPT);   /* damaged list */
    if (old && mode == HM_INSERT) {
        hm_write_abort(m, st, e, size, NVH_OK);
        return nvh_fail(NVH_E_EXISTS, "%s: key exists", fn);
    }
    if (!old && mode == HM_UPDATE) {
        hm_write_abort(m, st, e, size, NVH_OK);
        return nvh_fail(NVH_E_NOTFOUND, "%s: key not present", fn);
    }
    if (e) {                                    /* filled early: link, flush */
        e->next = old ? old->next : *prev;
        nvh_flush(pool, e, size);
    } else {
        e = hm_reserve(pool, size);
        if (!e) return hm_write_abort(m, st, NULL, 0, nvh_errcode());
        nvh_protect_open_(pool, e, size);
        e->next = old ? old->next : *prev;
        hm_fill_header(e, so, key, klen, vlen);
        hm_fill_value(pool, e, klen, val, vlen);
    }
    unsigned slot = 0;
    uint64_t *pend = NULL;
    if (old) {
        slot = nvh_hm_slot_get_(m);
        pend = hm_slot_word(m->root, slot);
    }
    /* windows: the new entry (open) and (update) root->pending, closed
     * after fence 1 made them durable */
    if (old) {
        NVH_ASSERT(*pend == 0);
        nvh_protect_open_(pool, pend, 8);
        __atomic_store_n(pend, nvh_off(pool, old), __ATOMIC_RELAXED);  /* line shared */
        nvh_flush(pool, pend, 8);
    }
    bool blocked = false;          /* eager bucket links ride on fences 1 and 2 */
    if (!old) blocked = !nvh_hm_link_prepare_(m, st, prev) && st->ahead_n == 0;
    nvh_drain(pool);                                        /* fence 1 */
    nvh_protect_close_(pool, e, size);
    if (old) nvh_protect_close_(pool, pend, 8);
    nvh_hm_settle_(m, st, false);  /* fence 1 also made new dummies' links durable */
    nvh_hm_link_publish_(m, st);   /* their links: durable with fence 2 */

    rc = hm_activate(pool, e, prev);                        /* fence 2 */
    if (rc != NVH_OK) {
        hm_cancel(pool, e);
        if (old) {
            nvh_protect_open_(pool, pend, 8);
            __atomic_store_n(pend, 0, __ATOMIC_RELAXED);
            nvh_persist(pool, pend, 8);
            nvh_protect_close_(pool, pend, 8);
            nvh_hm_slot_put_(m, slot);
        }
        hm_unlock(st);
        return rc;
    }
    if (old) {
        HM_TEST_HOOK();
        nvh_hm_bytes_changed_(st, 0, (int64_t)vlen - (int64_t)old->vlen);
        rc = hm_free(pool, old, pend, 0);                  /* fence 3 */
        /* A failure here (a corrupt header) leaves the slot set: the next
         * open retries the free, and this handle never hands it out again.
         * The update itself is durable. */
        if (rc == NVH_OK) nvh_hm_slot_put_(m, slot);
    } else {
        nvh_hm_settle_(m, st, false);  /* fence 2 made the eager links durable: marks */
        nvh_hm_count_changed_(m, 1, false);
        nvh_hm_bytes_changed_(st, (int64_t)klen, (int64_t)vlen);
        int grc = nvh_hm_maybe_grow_(m);
        (void)grc;   /* a failed grow only leaves the chains longer */
        /* a batch blocked by an unlinked parent (after a crash): the
         * standalone linker links it, with a fence of its own */
        if (blocked) nvh_hm_link_ahead_(m, st);
    }
    hm_unlock(st);
    return rc;
}

int nvh_hmap_put(nvh_hmap *m, const void *key, size_t klen, const void *value, size_t vlen)
{
    return hm_write(m, key, klen, value, vlen, HM_PUT, "nvh_hmap_put");
}

int nvh_hmap_insert(nvh_hmap *m, const void *key, size_t klen, const void *value, size_t vlen)
{
    return hm_write(m, key, klen, value, vlen, HM_INSERT, "nvh_hmap_insert");
}

int nvh_hmap_update(nvh_hmap *m, const void *key, size_t klen, const void *value, size_t vlen)
{
    return hm_write(m, key, klen, value, vlen, HM_UPDATE, "nvh_hmap_update");
}

/* ==========================================================================
 * Delete: one free whose link redirects the predecessor (one fence)
 * ========================================================================== */
int nvh_hmap_delete(nvh_hmap *m, const void *key, size_t klen)
{
    if (!m) return nvh_fail(NVH_E_INVAL, "nvh_hmap_delete: NULL map");
    int rc = hm_check_key(key, klen, "nvh_hmap_delete");
    if (rc != NVH_OK) return rc;
    if (m->pool->readonly) return nvh_fail(NVH_E_READONLY, "nvh_hmap_delete: pool is read-only");
    uint64_t h63 = hm_h63(hm_hash(m->seed, key, klen));
    struct hm_stripe *st = hm_stripe_of(m, h63);
    hm_lock(st);
    /* Searching from the bucket's own dummy (linking it if needed) keeps the
     * predecessor of a first entry a dummy of this bucket. */
    struct nvh_hm_dummy *d = nvh_hm_bucket_(m, st, h63);
    if (!d) {
        hm_unlock(st);
        return nvh_errcode();
    }
    uint64_t *prev;
    struct nvh_hm_node *e =
        nvh_hm_find_(m, (struct nvh_hm_link *)d, hm_entry_so(h63), key, (uint32_t)klen, &prev);
    if (!e) {
        hm_unlock(st);
        if (!prev) return NVH_E_CORRUPT;          /* damaged list */
        return nvh_fail(NVH_E_NOTFOUND, "nvh_hmap_delete: key not present");
    }
    nvh_hm_settle_(m, st, true);   /* a dummy linked by this call or an earlier one */
    int64_t kl = e->klen, vl = e->vlen;
    rc = hm_free(m->pool, e, prev, e->next);
    if (rc == NVH_OK) {
        nvh_hm_count_changed_(m, -1, false);
        nvh_hm_bytes_changed_(st, -kl, -vl);
    }
    hm_unlock(st);
    return rc;
}

/* ==========================================================================
 * Reads
 * ========================================================================== */
int nvh_hmap_get(nvh_hmap *m, const void *key, size_t klen, const void **value, size_t *vlen)
{
    if (!m) return nvh_fail(NVH_E_INVAL, "nvh_hmap_get: NULL map");
    int rc = hm_check_key(key, klen, "nvh_hmap_get");
    if (rc != NVH_OK) return rc;
    uint64_t h63 = hm_h63(hm_hash(m->seed, key, klen));
    nvh_epoch_enter_();            /* no lock: see nvh_hm_get_fn_ */
    uint64_t *prev;
    struct nvh_hm_node *e = nvh_hm_find_(m, (struct nvh_hm_link *)hm_start_ro(m, h63),
                                         hm_entry_so(h63), key, (uint32_t)klen, &prev);
    nvh_epoch_exit_();
    if (!e && !prev) return NVH_E_CORRUPT;        /* damaged list (message recorded) */
    if (!e) return nvh_fail(NVH_E_NOTFOUND, "nvh_hmap_get: key not present");
    if (value) *value = e->data + e->klen;
    if (vlen) *vlen = e->vlen;
    return NVH_OK;
}

int nvh_hm_get_fn_(struct nvh_hmap *m, const void *key, size_t klen, nvh_hm_entry_fn fn,
                   void *arg)
{
    uint64_t h63 = hm_h63(hm_hash(m->seed, key, klen));
    /* Lock-free: a reader follows links loaded with acquire (a writer
     * publishes an entry with one release store, after its content), and
     * its epoch keeps every entry it may reach from being reused until it
     * leaves (the allocator holds freed space back: common/epoch.c). */
    nvh_epoch_enter_();
    uint64_t *prev;
    struct nvh_hm_node *e = nvh_hm_find_(m, (struct nvh_hm_link *)hm_start_ro(m, h63),
                                         hm_entry_so(h63), key, (uint32_t)klen, &prev);
    int rc;
    if (e) rc = fn(e->data, e->klen, e->data + e->klen, e->vlen, arg);
    else rc = prev ? NVH_E_NOTFOUND : NVH_E_CORRUPT;
    nvh_epoch_exit_();
    return rc;
}

int nvh_hmap_get_fn(nvh_hmap *m, const void *key, size_t klen, nvh_hmap_fn fn, void *arg)
{
    if (!m || !fn) return nvh_fail(NVH_E_INVAL, "nvh_hmap_get_fn: NULL map or function");
    int rc = hm_check_key(key, klen, "nvh_hmap_get_fn");
    if (rc != NVH_OK) return rc;
    return nvh_hm_get_fn_(m, key, klen, fn, arg);
}

/* The reader epoch of the lookups, held across them: the same protection
 * every lock-free get takes for its own length (nestable per thread). */
void nvh_hmap_read_begin(nvh_hmap *m)
{
    (void)m;
    nvh_epoch_enter_();
}

void nvh_hmap_read_end(nvh_hmap *m)
{
    (void)m;
    nvh_epoch_exit_();
}

int nvh_hmap_contains(nvh_hmap *m, const void *key, size_t klen)
{
    const void *v;
    size_t n;
    int rc = nvh_hmap_get(m, key, klen, &v, &n);
    return rc == NVH_OK ? 1 : rc == NVH_E_NOTFOUND ? 0 : rc;
}

/* After a damaged link: the linked, intact dummy with the smallest
 * split-order key above `last` (buckets are dummies at known places in the
 * segments, so the rest of the list can be reached past the damage), or
 * NULL if there is none. O(buckets). */
static struct nvh_hm_dummy *hm_resume(const struct nvh_hmap *m, uint64_t last)
{
    struct nvh_hm_dummy *best = NULL;
    uint64_t nb = hm_ld(&m->nbuckets);
    for (uint64_t b = 1; b < nb; b++) {
        struct nvh_hm_dummy *d = hm_dummy(m, b);
        uint64_t so = hm_dummy_so(b);
        if (so <= last || (best && so >= best->so_key)) continue;
        if (hm_dummy_ready(m, b, d) && d->so_key == so) best = d;
    }
    return best;
}

int nvh_hmap_foreach(nvh_hmap *m, nvh_hmap_fn fn, void *arg)
{
    if (!m || !fn) return nvh_fail(NVH_E_INVAL, "nvh_hmap_foreach: NULL map or function");
    nvh_epoch_enter_();            /* lock-free, as nvh_hm_get_fn_ */
    int rc = 0, err = NVH_OK;
    uint64_t *prev = &m->seg_ptr[0][0].next;
    uint64_t last = 0;
    unsigned run = 0;
    uint64_t cur;
    while ((cur = hm_ld(prev)) != 0 && rc == 0) {
        struct nvh_hm_link *n = hm_node_at(m, cur);
        if (!n || n->so_key < last || (n->so_key == last && ++run > HM_MAX_RUN)) {
            /* A damaged link: what lies beyond it is reached again from
             * the next bucket whose dummy is linked and intact (hm_resume) */
            err = nvh_hm_corrupt_(m, nvh_off(m->pool, prev),
                                  n ? "list out of order (a cycle)" : "list link to a non-node");
            struct nvh_hm_dummy *d = hm_resume(m, last);
            if (!d) break;
            prev = &d->next;
            last = d->so_key;            /* strictly above: the walk moves on */
            run = 0;
            continue;
        }
        if (n->so_key != last) run = 0;
        last = n->so_key;
        prev = &n->next;
        if (!(n->so_key & 1)) continue;          /* a bucket dummy */
        const struct nvh_hm_node *e = (const struct nvh_hm_node *)n;
        rc = fn(e->data, e->klen, e->data + e->klen, e->vlen, arg);
    }
    nvh_epoch_exit_();
    return rc ? rc : err;
}

/* One step of a resumable walk. The cursor is a split-order position: the
 * next step starts at the linked dummy that precedes it (the bucket of the
 * position in the current table, or its nearest linked ancestor: O(1)) and
 * skips what lies before it. Entries never move in split order (resizing
 * only adds dummies), so a position stays meaningful across any number of
 * writes and doublings. A step ends only between two different split-order
 * keys: entries with equal keys (equal 63-bit hashes) are visited in the
 * same step, so none is skipped or repeated at a boundary. */
int nvh_hmap_walk(nvh_hmap *m, nvh_hmap_cursor *c, unsigned max, nvh_hmap_fn fn, void *arg)
{
    if (!m || !c || !fn || max == 0)
        return nvh_fail(NVH_E_INVAL, "nvh_hmap_walk: NULL map, cursor or function, or max 0");
    if (c->done) return 0;
    const uint64_t pos = c->pos;       /* visit entries whose key is >= pos */
    nvh_epoch_enter_();                /* lock-free, as nvh_hm_get_fn_ */
    struct nvh_hm_link *start =
        pos ? (struct nvh_hm_link *)hm_start_ro(m, hm_bitrev64(pos))
            : (struct nvh_hm_link *)&m->seg_ptr[0][0];
    uint64_t *prev = &start->next;
    uint64_t last = 0, stop_so = 0;
    unsigned run = 0, seen = 0;
    bool stopping = false;
    int rc = 0;
    uint64_t next_pos = 0;
    bool done = true;
    uint64_t cur;
    while ((cur = hm_ld(prev)) != 0) {
        struct nvh_hm_link *n = hm_node_at(m, cur);
        if (!n || n->so_key < last || (n->so_key == last && ++run > HM_MAX_RUN)) {
            rc = nvh_hm_corrupt_(m, nvh_off(m->pool, prev),
                                 n ? "list out of order (a cycle)" : "list link to a non-node");
            break;
        }
        uint64_t so = n->so_key;
        if (stopping && so != stop_so) {   /* the run is complete: stop here */
            next_pos = so;
            done = false;
            break;
        }
        if (so != last) run = 0;
        last = so;
        prev = &n->next;
        if (!(so & 1) || so < pos) continue;       /* a dummy, or visited before */
        const struct nvh_hm_node *e = (const struct nvh_hm_node *)n;
        rc = fn(e->data, e->klen, e->data + e->klen, e->vlen, arg);
        if (rc) break;
        if (++seen >= max && !stopping) {
            stopping = true;
            stop_so = so;
        }
    }
    nvh_epoch_exit_();
    if (rc) return rc;
    if (done) {
        c->done = 1;
        return 0;
    }
    c->pos = next_pos;
    return 1;
}

uint64_t nvh_hmap_count(nvh_hmap *m)
{
    if (!m) return 0;
    return hm_ld(&m->count);
}
