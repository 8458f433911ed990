/* hashmap_check.c — the persistent hash map's invariant checker (used by
 * the tests after every crash recovery, and offered to applications) and
 * its statistics. The checker walks the whole list and every segment:
 * O(entries + buckets), read-only except that it repairs the count hint. */
#include "hashmap.h"
#include "../protect/protect.h"

#include <stdlib.h>

/* ==========================================================================
 * Helpers
 * ========================================================================== */
static inline void hm_lock(struct nvh_hmap *m) { hm_lock_all(m); }
static inline void hm_unlock(struct nvh_hmap *m) { hm_unlock_all(m); }

static uint64_t hm_buckets_inited(const struct nvh_hmap *m)
{
    uint64_t n = 0;
    for (unsigned k = 0; k < m->nstripes; k++) n += m->stripes[k].buckets_inited;
    return n;
}

/* Bucket index of a dummy pointer, or UINT64_MAX if it is not a dummy slot
 * of a current segment. */
static uint64_t hm_bucket_of(const struct nvh_hmap *m, const void *p)
{
    for (unsigned k = 0; k < m->nsegs; k++) {
        const char *s = (const char *)m->seg_ptr[k];
        uint64_t n = hm_seg_buckets(m->base_log2, k);
        if ((const char *)p < s || (const char *)p >= s + n * sizeof(struct nvh_hm_dummy))
            continue;
        uint64_t d = (uint64_t)((const char *)p - s);
        if (d % sizeof(struct nvh_hm_dummy)) return UINT64_MAX;
        uint64_t first = k == 0 ? 0 : hm_seg_buckets(m->base_log2, k);
        return first + d / sizeof(struct nvh_hm_dummy);
    }
    return UINT64_MAX;
}

#define HM_BAD(...) do { rc = nvh_fail(NVH_E_CORRUPT, __VA_ARGS__); goto out; } while (0)

/* ==========================================================================
 * Check
 * ========================================================================== */
/* Invariants:
 *  I1 root: magic, version, directory a non-empty prefix inside the pool;
 *     no update pending (open resolves it).
 *  I2 the list from bucket 0's dummy is sorted by split-order key; dummies'
 *     keys are unique; entries with equal keys have distinct key bytes (so
 *     there is no cycle and no duplicate key).
 *  I3 every dummy in the list is a slot of a current segment, at the place
 *     its key says (so_key = bitrev(bucket)); every *marked* dummy is in the
 *     list (a linked but unmarked one is allowed: a crash before the mark).
 *  I4 every entry: magic, key length <= NVH_HMAP_KEY_MAX, a live allocation
 *     large enough for header + key + value (nvh_usable_size), its split-
 *     order key is that of its key's hash, and a lookup of its key through
 *     its bucket finds exactly this entry.
 *  I5 the number of entries equals the DRAM count (else the count and the
 *     hint are repaired and the difference reported in stats). */
int nvh_hmap_check(nvh_hmap *m, nvh_hmap_stats *stats)
{
    if (!m) return nvh_fail(NVH_E_INVAL, "nvh_hmap_check: NULL map");
    hm_lock(m);
    int rc = NVH_OK;
    uint8_t *seen = NULL;
    nvh_hmap_stats st;
    memset(&st, 0, sizeof st);
    struct nvh_hm_root *r = m->root;

    /* I1 */
    if (r->magic != NVH_HM_MAGIC || r->version != NVH_HM_VERSION) HM_BAD("hm: bad root magic");
    for (unsigned k = 0; k < NVH_HM_SEGS; k++)
        if ((k < m->nsegs) != (r->seg[k] != 0)) HM_BAD("hm: directory slot %u", k);
    for (unsigned k = 0; k < HM_SLOTS; k++)
        if (*hm_slot_word(r, k) != 0 && !m->pool->readonly)
            HM_BAD("hm: update pending in slot %u with no writer", k);

    seen = calloc((size_t)(m->nbuckets + 7) / 8, 1);
    if (!seen) {
        rc = nvh_fail(NVH_E_NOMEM, "nvh_hmap_check: out of memory");
        goto out;
    }

    /* I2, I3, I4 */
    struct nvh_hm_link *head = (struct nvh_hm_link *)&m->seg_ptr[0][0];
    if (head->so_key != 0) HM_BAD("hm: bucket 0 dummy key %llx", (unsigned long long)head->so_key);
    seen[0] |= 1;
    st.buckets_linked = 1;
    uint64_t last_so = 0, chain = 0, run_start = 0;
    unsigned run = 0;
    uint64_t cur = head->next;
    while (cur) {
        struct nvh_hm_link *n = hm_node_at(m, cur);
        if (!n)
            HM_BAD("hm: node offset %llu outside the pool, misaligned, or a damaged entry "
                   "(magic, key length, size)", (unsigned long long)cur);
        uint64_t so = n->so_key;
        if (so < last_so) HM_BAD("hm: list out of order at %llu", (unsigned long long)cur);
        run = so == last_so ? run + 1 : 0;
        if (run > HM_MAX_RUN) HM_BAD("hm: list cycles at %llu", (unsigned long long)cur);
        if (!(so & 1)) {                                        /* a dummy */
            uint64_t b = hm_bucket_of(m, n);
            if (b == UINT64_MAX) HM_BAD("hm: dummy %llu not in a segment", (unsigned long long)cur);
            if (b >= m->nbuckets || hm_dummy_so(b) != so)
                HM_BAD("hm: dummy of bucket %llu has key %llx", (unsigned long long)b,
                       (unsigned long long)so);
            if (so == last_so) HM_BAD("hm: dummy key repeated");
            if (seen[b / 8] & (1u << (b % 8))) HM_BAD("hm: bucket %llu linked twice", (unsigned long long)b);
            seen[b / 8] |= (uint8_t)(1u << (b % 8));
            st.buckets_linked++;
            if (!hm_dummy_ready(m, b, (struct nvh_hm_dummy *)n)) st.buckets_unmarked++;
            if (chain > st.max_chain) st.max_chain = chain;
            chain = 0;
        } else {                                                /* an entry */
            struct nvh_hm_node *e = (struct nvh_hm_node *)n;
            if (cur % NVH_ALLOC_ALIGN) HM_BAD("hm: entry %llu misaligned", (unsigned long long)cur);
            if (e->magic != NVH_HM_NODE_MAGIC) HM_BAD("hm: entry %llu bad magic", (unsigned long long)cur);
            if (e->klen > NVH_HMAP_KEY_MAX) HM_BAD("hm: entry %llu key length", (unsigned long long)cur);
            size_t usable = nvh_usable_size(m->pool, e);
            if (usable < sizeof *e + (uint64_t)e->klen + e->vlen)
                HM_BAD("hm: entry %llu is not a live object of %llu bytes (usable %zu)",
                       (unsigned long long)cur,
                       (unsigned long long)(sizeof *e + (uint64_t)e->klen + e->vlen), usable);
            uint64_t h63 = hm_h63(hm_hash(m->seed, e->data, e->klen));
            if (hm_entry_so(h63) != so) HM_BAD("hm: entry %llu hash mismatch", (unsigned long long)cur);
            if (so != last_so) run_start = cur;
            /* equal-key run: the key bytes must differ from every earlier one */
            for (uint64_t q = run_start; q != cur;) {
                struct nvh_hm_node *x = nvh_ptr(m->pool, q);
                if (x->klen == e->klen && memcmp(x->data, e->data, e->klen) == 0)
                    HM_BAD("hm: duplicate key at %llu", (unsigned long long)cur);
                q = x->next;
            }
            /* lookup through its bucket (read-only start) finds this entry */
            uint64_t b = h63 & (m->nbuckets - 1);
            while (b && !hm_dummy_ready(m, b, hm_dummy(m, b))) b = hm_parent(b);
            uint64_t *prev;
            struct nvh_hm_node *f = nvh_hm_find_(m, (struct nvh_hm_link *)hm_dummy(m, b), so,
                                                 e->data, e->klen, &prev);
            if (f != e) HM_BAD("hm: entry %llu not found by its own key", (unsigned long long)cur);
            st.count++;
            st.key_bytes += e->klen;
            st.value_bytes += e->vlen;
            chain++;
        }
        last_so = so;
        cur = n->next;
    }
    if (chain > st.max_chain) st.max_chain = chain;

    /* I3: every marked dummy was reached */
    for (uint64_t b = 1; b < m->nbuckets; b++) {
        struct nvh_hm_dummy *d = hm_dummy(m, b);
        if (hm_dummy_ready(m, b, d)) {
            st.buckets_marked++;
            if (!(seen[b / 8] & (1u << (b % 8))))
                HM_BAD("hm: bucket %llu marked but not in the list", (unsigned long long)b);
            if (d->so_key != hm_dummy_so(b))          /* searches start at it */
                HM_BAD("hm: dummy of bucket %llu has key %llx", (unsigned long long)b,
                       (unsigned long long)d->so_key);
        }
    }
    st.buckets_marked++;   /* bucket 0 */

    /* I5 */
    if (st.count != m->count) {
        st.count_repaired = (int64_t)st.count - (int64_t)m->count;
        hm_st(&m->count, st.count);
        if (!m->pool->readonly) {
            nvh_protect_open_(m->pool, &m->root->count_hint, 8);   /* docs/PROTECT.md */
            m->root->count_hint = st.count;
            nvh_flush(m->pool, &m->root->count_hint, 8);
            nvh_protect_close_(m->pool, &m->root->count_hint, 8);
        }
    }
out:
    free(seen);
    st.buckets = m->nbuckets;
    st.segments = m->nsegs;
    st.resizes = m->resizes;
    st.buckets_inited = hm_buckets_inited(m);
    st.recovered_pending = m->recovered_pending;
    st.load_factor = m->nbuckets ? (double)m->count / (double)m->nbuckets : 0;
    hm_unlock(m);
    if (stats) *stats = st;
    return rc;
}

/* ==========================================================================
 * Statistics (cheap: no walk)
 * ========================================================================== */
int nvh_hmap_stats_get(nvh_hmap *m, nvh_hmap_stats *stats)
{
    if (!m || !stats) return nvh_fail(NVH_E_INVAL, "nvh_hmap_stats_get: NULL argument");
    hm_lock(m);
    memset(stats, 0, sizeof *stats);
    stats->count = m->count;
    stats->buckets = m->nbuckets;
    stats->segments = m->nsegs;
    stats->resizes = m->resizes;
    stats->buckets_inited = hm_buckets_inited(m);
    stats->recovered_pending = m->recovered_pending;
    stats->load_factor = m->nbuckets ? (double)m->count / (double)m->nbuckets : 0;
    hm_unlock(m);
    return NVH_OK;
}

/* ==========================================================================
 * Salvage (nvheap check --repair)
 * ========================================================================== */
/* The linked, intact dummy with the smallest split-order key above `last`
 * (0 if none): where the list continues past a damaged stretch. */
static uint64_t hm_next_dummy(const struct nvh_hmap *m, uint64_t last)
{
    const struct nvh_hm_dummy *best = NULL;
    for (uint64_t b = 1; b < m->nbuckets; b++) {
        const struct nvh_hm_dummy *d = hm_dummy(m, b);
        uint64_t so = hm_dummy_so(b);
        if (so <= last || (best && so >= best->so_key)) continue;
        if (hm_dummy_ready(m, b, d) && d->so_key == so) best = d;
    }
    return best ? nvh_off(m->pool, best) : 0;
}

/* Why the node at cur (reached after split-order key `last`, `run` nodes
 * of that key in a row) cannot stay in the list, or NULL if it can. */
static const char *hm_reject(struct nvh_hmap *m, uint64_t cur, uint64_t last, unsigned run)
{
    struct nvh_hm_link *n = hm_node_at(m, cur);
    if (!n) return "a link to something that is not a node";
    if (n->so_key < last) return "the list goes back in key order (a cycle)";
    if (n->so_key == last && run >= HM_MAX_RUN) return "the list cycles";
    if (!(n->so_key & 1)) {
        uint64_t b = hm_bucket_of(m, n);
        if (b == UINT64_MAX || b >= m->nbuckets || hm_dummy_so(b) != n->so_key)
            return "a bucket dummy that is not at its bucket's place";
        return NULL;
    }
    struct nvh_hm_node *e = (struct nvh_hm_node *)n;
    if (nvh_usable_size(m->pool, e) < sizeof *e + (uint64_t)e->klen + e->vlen)
        return "an entry that is not a live allocation of its size";
    if (hm_entry_so(hm_h63(hm_hash(m->seed, e->data, e->klen))) != e->so_key)
        return "an entry whose key does not hash to its place";
    return NULL;
}

int nvh_hm_salvage_(struct nvh_hmap *m, nvh_hm_salvage_fn fn, void *arg)
{
    if (!m) return nvh_fail(NVH_E_INVAL, "nvh_hm_salvage_: NULL map");
    if (m->pool->readonly) return nvh_fail(NVH_E_READONLY, "nvh_hm_salvage_: pool is read-only");
    hm_lock(m);
    int changed = 0;
    uint64_t *prev = &m->seg_ptr[0][0].next;
    uint64_t last = 0;
    unsigned run = 0;
    /* every change moves the walk to a dummy with a larger key: bounded */
    while (*prev) {
        const char *why = hm_reject(m, *prev, last, run);
        if (why) {
            uint64_t old = *prev, now = hm_next_dummy(m, last);
            nvh_protect_open_(m->pool, prev, 8);
            hm_st(prev, now);
            nvh_persist(m->pool, prev, 8);
            nvh_protect_close_(m->pool, prev, 8);
            if (fn) fn(nvh_off(m->pool, prev), old, now, why, arg);
            changed++;
            if (!now) break;
            continue;
        }
        struct nvh_hm_link *n = hm_at(m, *prev);
        run = n->so_key == last ? run + 1 : 0;
        last = n->so_key;
        prev = &n->next;
    }
    hm_unlock(m);
    return changed;
}
