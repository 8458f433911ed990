/* hashmap.c — the persistent hash map's life cycle: create, open (with
 * recovery of an update in flight), close, destroy; the segment directory
 * and resizing (one O(1) allocation per doubling); lazy bucket
 * initialisation (linking a dummy into the split-ordered list); the count
 * hint. Operations are in hashmap_ops.c, invariants in hashmap_check.c.
 * Design: docs/HASHMAP.md. */
#include "hashmap.h"
#include "../protect/protect.h"

#include <sched.h>
#include <stdlib.h>

/* ==========================================================================
 * Protection windows (docs/PROTECT.md)
 * ==========================================================================
 * Every store of the map into the pool is made inside an explicit window
 * (nvh_protect_open_/close_: one load and a branch when the pool is not
 * protected), opened before the first store and closed once the bytes are
 * durable. The allocator calls run inside an implicit library window too
 * (on a pool whose protection was ever configured: hm_window_ in
 * hashmap.h), so the allocator's own metadata stores and the link words it writes for
 * us are legal whether or not the allocator opens windows of its own (when
 * it does, the implicit window costs two thread-local updates and no
 * fault); the link words also get an explicit window here, so with a
 * windowed allocator nothing of ours ever faults (the wrappers hm_reserve,
 * hm_cancel, hm_activate are in hashmap.h). The cold paths (create, open's
 * repairs, close, destroy) run whole inside an implicit window. */


/* ==========================================================================
 * Helpers
 * ========================================================================== */

/* Recompute the DRAM view of the directory (nsegs, nbuckets, pointers). */
static int hm_load_directory(struct nvh_hmap *m)
{
    struct nvh_hm_root *r = m->root;
    unsigned n = 0;
    while (n < NVH_HM_SEGS && r->seg[n] != 0) n++;
    if (n == 0) return nvh_fail(NVH_E_CORRUPT, "hash map: no bucket segment");
    for (unsigned k = n; k < NVH_HM_SEGS; k++)
        if (r->seg[k] != 0)
            return nvh_fail(NVH_E_CORRUPT, "hash map: hole in the segment directory at %u", n);
    if (m->base_log2 + n - 1 > NVH_HM_MAX_BUCKETS_LOG2)
        return nvh_fail(NVH_E_CORRUPT, "hash map (root at offset %llu): %u segments of base "
                        "2^%u buckets exceed 2^%u", (unsigned long long)m->root_off, n,
                        m->base_log2, NVH_HM_MAX_BUCKETS_LOG2);
    for (unsigned k = 0; k < n; k++) {
        uint64_t bytes = hm_seg_buckets(m->base_log2, k) * sizeof(struct nvh_hm_dummy);
        void *p = nvh_ptr(m->pool, r->seg[k]);
        if (r->seg[k] % NVH_ALLOC_ALIGN || !nvh_contains(m->pool, p, bytes))
            return nvh_fail(NVH_E_CORRUPT, "hash map: segment %u at %llu outside the pool", k,
                            (unsigned long long)r->seg[k]);
        m->seg_ptr[k] = p;
        m->seg_off[k] = r->seg[k];
    }
    m->nsegs = n;
    hm_st(&m->nbuckets, UINT64_C(1) << (m->base_log2 + n - 1));
    return NVH_OK;
}

/* ==========================================================================
 * Count hint
 * ========================================================================== */
/* The exact count lives in DRAM. The persistent hint is refreshed (store +
 * flush, no fence: it rides on the next operation's fence) every 64 changes
 * and at close, so it costs 1/64 line per operation; after a crash it may be
 * off by the changes since its last refresh. It only steers resizing;
 * nvh_hmap_check recounts and repairs it. */
void nvh_hm_count_changed_(struct nvh_hmap *m, int64_t delta, bool force)
{
    /* Writers of several stripes: atomic updates; whoever passes 64 dirty
     * changes stores the hint (two such stores may land in either order:
     * it is a hint). */
    uint64_t c = __atomic_add_fetch(&m->count, (uint64_t)delta, __ATOMIC_RELAXED);
    bool due = force;
    if (delta && __atomic_add_fetch(&m->count_dirty, 1, __ATOMIC_RELAXED) >= 64)
        due = __atomic_exchange_n(&m->count_dirty, 0, __ATOMIC_RELAXED) >= 64;
    if (due) {
        if (force) __atomic_store_n(&m->count_dirty, 0, __ATOMIC_RELAXED);
        if (__atomic_load_n(&m->root->count_hint, __ATOMIC_RELAXED) != c) {
            nvh_protect_open_(m->pool, &m->root->count_hint, 8);
            __atomic_store_n(&m->root->count_hint, c, __ATOMIC_RELAXED);
            nvh_flush(m->pool, &m->root->count_hint, 8);
            nvh_protect_close_(m->pool, &m->root->count_hint, 8);
        }
    }
}

/* ==========================================================================
 * Buckets: linking a dummy into the list
 * ========================================================================== */

/* Step 3 of linking dummy d: its mark (`check`, hm_dummy_check) is kept in
 * st->marks until the caller's next fence has made the link durable
 * (nvh_hm_settle_ writes it then); a full list settles first. */
static void hm_mark_later(struct nvh_hmap *m, struct hm_stripe *st, struct nvh_hm_dummy *d,
                          uint64_t check)
{
    if (st->nmarks == sizeof st->marks / sizeof st->marks[0]) nvh_hm_settle_(m, st, true);
    st->marks[st->nmarks].d = d;
    st->marks[st->nmarks].check = check;
    st->nmarks++;
    st->buckets_inited++;
}

/* The mark of `bucket`'s dummy (its segment from the DRAM directory). */
static inline uint64_t hm_bucket_check(const struct nvh_hmap *m, uint64_t bucket)
{
    unsigned s;
    uint64_t i;
    hm_locate(m->base_log2, bucket, &s, &i);
    return hm_dummy_check(m->seed, bucket, m->seg_off[s]);
}

/* Link dummy `bucket` after its parent's position. One fence of its own:
 *   1. d->next = successor, d->so_key      persisted (fence): the dummy is
 *                                            complete before anything can
 *                                            reach it
 *   2. pred->next = d                       flushed, NOT fenced here: it is
 *      made durable by the caller's next fence, which always comes before
 *      any allocator record that could depend on it — a put's content fence
 *      (fence 1) precedes its activation record, and delete / recovery fence
 *      first when m->link_unfenced is set (a free record could otherwise
 *      reach the media by eviction while d is still unlinked there)
 *   3. d->check = mark                      only once 2 is durable (a mark
 *      that reached the media before the link would claim a bucket that is
 *      not in the list): kept in m->marks until the caller's fence, then
 *      stored, not flushed (nvh_hm_settle_ says why).
 * A crash after 2 but before 3 leaves d linked but unmarked: harmless
 * (traversals from the parent pass through it), and the next use finds it
 * already in the list and only marks it. A crash before 2 is durable leaves
 * d unreachable garbage in its segment. Our own store to pred->next never
 * restores a value an allocator redo record could still expect (the dummy
 * was never in the list before), so link replay at recovery cannot undo it
 * (docs/ALLOC.md, the A-B-A caveat). Cost: 1 fence + 2 lines per bucket,
 * once per bucket (about 1/load-factor of the puts). */
static struct nvh_hm_dummy *hm_init_bucket(struct nvh_hmap *m, struct hm_stripe *st,
                                           uint64_t bucket)
{
    struct nvh_hm_dummy *d = hm_dummy(m, bucket);
    if (hm_dummy_ready(m, bucket, d)) return d;
    /* Bucket 0 is made at create and never linked later: a mark that does
     * not match is damage (nvh_hmap_check reports it). Its dummy is still
     * the list head, as lookups take it; recursing to its "parent" would
     * never end. */
    if (bucket == 0) return d;
    struct nvh_hm_dummy *parent = hm_init_bucket(m, st, hm_parent(bucket));
    if (!parent) return NULL;

    uint64_t so = hm_dummy_so(bucket);
    uint64_t d_off = nvh_off(m->pool, d);
    uint64_t *prev = &parent->next;
    uint64_t guard = 0;
    for (;;) {
        uint64_t cur = *prev;
        if (cur == d_off) break;                /* already linked: crash left it */
        if (cur == 0) break;
        struct nvh_hm_link *n = hm_at(m, cur);
        if (n->so_key > so) break;
        prev = &n->next;
        if (++guard > (UINT64_C(1) << 40)) {
            nvh_fail(NVH_E_CORRUPT, "hash map: cycle while linking bucket %llu",
                     (unsigned long long)bucket);
            return NULL;
        }
    }
    if (*prev == d_off) {
        /* Linked already: by a crash (mark it now), or by this handle with
         * its mark still waiting for the fence (then it is in m->marks:
         * adding it twice would only write the mark twice, but count the
         * bucket twice in the statistics). */
        for (unsigned k = 0; k < st->nmarks; k++)
            if (st->marks[k].d == d) return d;
    } else {
        nvh_protect_open_(m->pool, d, sizeof *d);
        d->next = *prev;
        d->so_key = so;
        d->reserved = 0;
        hm_st(&d->check, 0);
        nvh_persist(m->pool, d, sizeof *d);
        nvh_protect_close_(m->pool, d, sizeof *d);
        nvh_protect_open_(m->pool, prev, 8);
        hm_st(prev, d_off);                     /* published to readers */
        nvh_flush(m->pool, prev, 8);
        nvh_protect_close_(m->pool, prev, 8);
        st->link_unfenced = true;
    }
    hm_mark_later(m, st, d, hm_bucket_check(m, bucket));
    return d;
}

/* The marks are stored, not flushed: a mark only lets lookups start at its
 * bucket instead of an ancestor, so one the media never gets costs a longer
 * walk after a crash, until the next writer of the bucket (or the eager
 * linker) finds the dummy linked and marks it again (hm_init_bucket,
 * hm_link_collect). Its link is durable before it is stored, so a mark that
 * reaches the media by eviction never claims an unlinked dummy. */
void nvh_hm_settle_slow_(struct nvh_hmap *m, struct hm_stripe *st, bool drain)
{
    if (drain && st->link_unfenced) nvh_drain(m->pool);
    st->link_unfenced = false;
    for (unsigned k = 0; k < st->nmarks; k++) {
        nvh_protect_open_(m->pool, &st->marks[k].d->check, 8);
        hm_st(&st->marks[k].d->check, st->marks[k].check);
        nvh_protect_close_(m->pool, &st->marks[k].d->check, 8);
    }
    st->nmarks = 0;
}

struct nvh_hm_dummy *nvh_hm_bucket_(struct nvh_hmap *m, struct hm_stripe *st, uint64_t h63)
{
    uint64_t bucket = h63 & (hm_ld(&m->nbuckets) - 1);
    struct nvh_hm_dummy *d = hm_dummy(m, bucket);
    if (__builtin_expect(hm_dummy_ready(m, bucket, d), 1)) return d;
    return hm_init_bucket(m, st, bucket);
}

/* Buckets 1..nstripes-1 linked (and marked), so that every later link
 * stays inside its stripe (hashmap.h). A map made by create has them;
 * one made by an older library gets them at its first writable open,
 * before any writer runs: one fence per bucket, once. */
static int hm_link_stripe_roots(struct nvh_hmap *m)
{
    for (uint64_t b = 1; b < m->nstripes; b++)
        if (!hm_init_bucket(m, &m->stripes[b], b)) return nvh_errcode();
    for (unsigned k = 0; k < m->nstripes; k++) nvh_hm_settle_(m, &m->stripes[k], true);
    return NVH_OK;      /* the marks: durable with the next fence (or linked again) */
}

/* Eager linking, in batches: up to HM_LINK_BATCH unlinked buckets of the
 * newest segment at a time, sharing ONE fence for step 1 of every dummy
 * (each written and flushed), their predecessor links stored and flushed
 * after that fence (step 2, durable with the next fence) and their marks
 * deferred as in hm_init_bucket. A put folds its batch into its own fences
 * (nvh_hm_link_prepare_ before its content fence, nvh_hm_link_publish_
 * after it), so linking costs it no fence of its own. Two dummies of one
 * batch never share a predecessor word (the second would be lost), and no
 * dummy takes the word `avoid` (the put's own link): a batch stops before
 * such a bucket. Returns false if the batch stopped at a bucket whose
 * parent is not linked (only nvh_hm_link_ahead_ links a parent: its own
 * fence).
 *
 * Why two dummies of one batch never share a predecessor once the table
 * has doubled (nb > 2^base): the batch's buckets b are in the newest
 * segment, [nb/2, nb), so their parents p = b - nb/2 are distinct buckets
 * of the table before the doubling. Split order sorts by the low bits
 * first, so the keys of the nodes of p's class (h63 or bucket index
 * congruent to p mod nb/2) form one interval of the list's key space, and
 * the intervals of distinct p are disjoint. b lies in p's interval, and its
 * predecessor is the last node of key below b's, found walking from p's
 * dummy (linked: checked), whose key is the interval's smallest: the
 * predecessor's key is in [key(p), key(b)), inside p's interval. Distinct
 * parents, distinct predecessor nodes, distinct words. Only while segment
 * 0 fills (nb == 2^base) can two buckets of a batch share a parent (32 and
 * 64 both have parent 0), and only then are the batch's words compared. */
/* The batch reads, for each bucket, its dummy, its parent's dummy and the
 * nodes of the parent's run up to the bucket's place: misses one after the
 * other, bucket after bucket (right after a doubling a batch is full, 32
 * buckets), and each walk's second node depends on its first. So the
 * batch is gathered first and its misses started one level at a time: the
 * dummies and parents, then (once the parents have arrived) the first node
 * after each linked parent, then the node after that where the walk goes
 * on past the first (at load 1-2 the place is mostly within two nodes);
 * the walks then mostly hit. What the gathering computes (dummy, mark,
 * parent, whether it is linked) is kept for the walks. A node is read only
 * after a linked parent (an unlinked one holds garbage), under the stripe
 * lock: its run is the stripe's own. */
struct hm_cand {
    struct nvh_hm_dummy *d, *parent;   /* parent NULL: bucket 0 (never linked later) */
    uint64_t b, check, so, first;
    bool parent_ready;
};

bool nvh_hm_link_collect_(struct nvh_hmap *m, struct hm_stripe *st, const uint64_t *avoid)
{
    /* A stripe links only its own buckets (b = its index mod nstripes) of
     * the newest segment; a resize by another stripe moves it on to the
     * new one. */
    uint64_t nb = hm_ld(&m->nbuckets);
    const uint64_t base_n = UINT64_C(1) << m->base_log2;
    if (st->cursor_nb != nb) {
        st->cursor_nb = nb;
        st->link_cursor = (nb > base_n ? nb / 2 : 0) + (uint64_t)(st - m->stripes);
    }
    st->ahead_n = 0;
    if (st->link_cursor >= nb) return true;
    /* The newest segment's place in the DRAM directory: its pointer and
     * offset were stored before the bucket count that made it reachable
     * (hm_load_directory, nvh_hm_maybe_grow_), and nb was loaded with
     * acquire. Segment 0 (nb == 2^base) starts at bucket 0. */
    const bool seg0 = nb == base_n;
    const unsigned k = seg0 ? 0 : (unsigned)__builtin_ctzll(nb) - m->base_log2;
    struct nvh_hm_dummy *const seg = m->seg_ptr[k];
    const uint64_t seg_off = m->seg_off[k], first = seg0 ? 0 : nb / 2;
    const uint64_t step = m->nstripes;

    struct hm_cand c[HM_LINK_BATCH];
    unsigned nc = 0;
    for (uint64_t b = st->link_cursor; nc < HM_LINK_BATCH && b < nb; b += step, nc++) {
        c[nc].b = b;
        c[nc].d = &seg[b - first];
        __builtin_prefetch(c[nc].d, 1);
        c[nc].check = hm_dummy_check(m->seed, b, seg_off);
        c[nc].parent = b ? hm_dummy(m, hm_parent(b)) : NULL;
        if (b) __builtin_prefetch(c[nc].parent);
    }
    for (unsigned i = 0; i < nc; i++) {
        c[i].parent_ready = c[i].parent && hm_dummy_ready(m, hm_parent(c[i].b), c[i].parent);
        c[i].first = c[i].parent_ready ? hm_ld(&c[i].parent->next) : 0;
        if (c[i].first) __builtin_prefetch(nvh_ptr(m->pool, c[i].first));
        c[i].so = hm_dummy_so(c[i].b);
    }
    for (unsigned i = 0; i < nc; i++) {
        if (!c[i].first) continue;
        const struct nvh_hm_link *x = hm_at(m, c[i].first);
        if (x->so_key >= c[i].so) continue;
        uint64_t next = hm_ld(&x->next);
        if (next) __builtin_prefetch(nvh_ptr(m->pool, next));
    }

    for (unsigned i = 0; i < nc && st->ahead_n < HM_LINK_BATCH; i++) {
        unsigned n = st->ahead_n;
        struct nvh_hm_dummy *d = c[i].d;
        if (!c[i].parent || hm_ld(&d->check) == c[i].check) {   /* linked (bucket 0: always) */
            st->link_cursor += step;
            continue;
        }
        if (!c[i].parent_ready) return false;
        uint64_t so = c[i].so, d_off = seg_off + (c[i].b - first) * sizeof *d;
        uint64_t *prev = &c[i].parent->next;
        bool linked = false;
        for (;;) {
            uint64_t cur = *prev;
            if (cur == d_off) { linked = true; break; }
            if (cur == 0) break;
            struct nvh_hm_link *x = hm_at(m, cur);
            if (x->so_key > so) break;
            prev = &x->next;
        }
        bool clash = prev == avoid;
        if (seg0)                              /* parents may be shared: see above */
            for (unsigned j = 0; j < n; j++) clash |= st->ahead[j].pred == prev;
#ifndef NDEBUG
        else                                   /* debug builds check the argument */
            for (unsigned j = 0; j < n; j++) NVH_ASSERT(st->ahead[j].pred != prev);
#endif
        if (clash) break;                      /* a later batch links it */
        st->link_cursor += step;
        st->ahead[n].d = d, st->ahead[n].check = c[i].check;
        st->ahead_n = n + 1;
        if (linked) {        /* a crash left it linked, unmarked; or this handle
                                linked it with its mark still waiting */
            bool waiting = false;
            for (unsigned j = 0; j < st->nmarks; j++) waiting |= st->marks[j].d == d;
            if (waiting) st->ahead_n = n;
            else st->ahead[n].pred = NULL;
            continue;
        }
        st->ahead[n].pred = prev;
        nvh_protect_open_(m->pool, d, sizeof *d);
        d->next = *prev;
        d->so_key = so;
        hm_st(&d->check, 0);
        d->reserved = 0;
        nvh_flush(m->pool, d, sizeof *d);
        nvh_protect_close_(m->pool, d, sizeof *d);
    }
    return true;
}

void nvh_hm_link_publish_slow_(struct nvh_hmap *m, struct hm_stripe *st)
{
    for (unsigned k = 0; k < st->ahead_n; k++) {
        uint64_t *pred = st->ahead[k].pred;
        if (pred) {
            nvh_protect_open_(m->pool, pred, 8);
            hm_st(pred, nvh_off(m->pool, st->ahead[k].d));   /* published */
            nvh_flush(m->pool, pred, 8);
            nvh_protect_close_(m->pool, pred, 8);
            st->link_unfenced = true;
        }
        hm_mark_later(m, st, st->ahead[k].d, st->ahead[k].check);
    }
    st->ahead_n = 0;
}

void nvh_hm_link_ahead_(struct nvh_hmap *m, struct hm_stripe *st)
{
    if (!nvh_hm_link_collect_(m, st, NULL) && st->ahead_n == 0) {
        /* rare (after a crash): link the parent first, its own fence */
        if (!hm_init_bucket(m, st, hm_parent(st->link_cursor))) return;
        nvh_hm_link_collect_(m, st, NULL);
    }
    if (st->ahead_n == 0) return;
    nvh_drain(m->pool);                        /* every dummy complete */
    nvh_hm_link_publish_(m, st);
}

/* ==========================================================================
 * Pending slots (updates in flight)
 * ========================================================================== */
#ifdef NVH_TEST_HOOKS
void (*nvh_hm_test_hook_)(void);
#endif

unsigned nvh_hm_slot_get_(struct nvh_hmap *m)
{
    for (unsigned spins = 0;; spins++) {
        unsigned busy = __atomic_load_n(&m->slots_busy, __ATOMIC_RELAXED);
        unsigned want = (unsigned)__builtin_ctz(~busy);
        if (want < HM_SLOTS &&
            __atomic_compare_exchange_n(&m->slots_busy, &busy, busy | (1u << want), false,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return want;
        if (spins > 64) sched_yield();      /* every slot held for two fences */
    }
}

void nvh_hm_slot_put_(struct nvh_hmap *m, unsigned k)
{
    __atomic_fetch_and(&m->slots_busy, ~(1u << k), __ATOMIC_RELEASE);
}

/* ==========================================================================
 * Resizing: one more segment doubles the bucket count
 * ========================================================================== */
/* O(1): reserve the segment and activate it with the directory slot as its
 * link (one fence). Its dummies are garbage until linked (their check word
 * tells), so nothing is zeroed or copied and no entry moves: entries of
 * old bucket b that now belong to b + old_n are found through b + old_n's
 * dummy once it is linked (after b's, in split order). */
int nvh_hm_maybe_grow_(struct nvh_hmap *m)
{
    uint64_t limit = hm_ld(&m->nbuckets) * m->root->max_load_pct / 100;
    if (__atomic_load_n(&m->count, __ATOMIC_RELAXED) <= limit) return NVH_OK;
    /* One resize at a time; a writer that finds one under way goes on (the
     * next insert looks again). Writers of other stripes keep working: a
     * new segment only adds buckets, each below its parent's stripe. */
    if (pthread_mutex_trylock(&m->lock) != 0) return NVH_OK;
    int rc = NVH_OK;
    unsigned k = m->nsegs;
    limit = m->nbuckets * m->root->max_load_pct / 100;
    if (__atomic_load_n(&m->count, __ATOMIC_RELAXED) <= limit || k >= NVH_HM_SEGS ||
        m->base_log2 + k > NVH_HM_MAX_BUCKETS_LOG2)
        goto out;
    uint64_t bytes = hm_seg_buckets(m->base_log2, k) * sizeof(struct nvh_hm_dummy);
    void *seg = hm_reserve(m->pool, bytes);
    if (!seg) goto out;        /* no space to grow: keep working with longer chains */
    rc = hm_activate(m->pool, seg, &m->root->seg[k]);
    if (rc != NVH_OK) {
        hm_cancel(m->pool, seg);
        goto out;
    }
    m->seg_ptr[k] = seg;
    m->seg_off[k] = nvh_off(m->pool, seg);
    m->nsegs = k + 1;
    hm_st(&m->nbuckets, m->nbuckets * 2);   /* readers see the segment first */
    m->resizes++;
out:
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* ==========================================================================
 * Create
 * ========================================================================== */
static uint64_t hm_fresh_seed(nvh_pool *pool, const void *where)
{
    nvh_pool_info info;
    uint64_t s = (uint64_t)(uintptr_t)where ^ 0x6a09e667f3bcc908ull;
    if (nvh_pool_info_get(pool, &info) == NVH_OK) {
        uint64_t u0, u1;
        memcpy(&u0, info.uuid, 8);
        memcpy(&u1, info.uuid + 8, 8);
        s ^= hm_mix(u0) ^ hm_mix(u1 + info.epoch) ^ info.create_time;
    }
    static _Atomic uint64_t counter;
    s ^= hm_mix(atomic_fetch_add(&counter, 1) + nvh_off(pool, where));
    return hm_mix(s) | 1u;
}

static unsigned hm_nstripes(unsigned base_log2)
{
    return base_log2 >= 5 ? HM_STRIPES_MAX : 1u << base_log2;
}

/* Segment 0 of a new map: dummies 0..nstripes-1 linked in split order and
 * marked (each stripe's root bucket: hashmap.h), persisted. The segment
 * is reachable only once activated, so no order among these stores
 * matters. */
static void hm_seg0_init(nvh_pool *pool, struct nvh_hm_dummy *seg0, uint64_t seed,
                         unsigned base_log2)
{
    unsigned n = hm_nstripes(base_log2), bits = (unsigned)__builtin_ctz(n);
    uint64_t seg_off = nvh_off(pool, seg0), prev = UINT64_MAX;
    memset(seg0, 0, n * sizeof seg0[0]);
    for (unsigned i = 0; i < n; i++) {          /* i-th in split order */
        uint64_t b = bits ? hm_bitrev64(i) >> (64 - bits) : 0;
        seg0[b].so_key = hm_dummy_so(b);
        seg0[b].check = hm_dummy_check(seed, b, seg_off);
        if (prev != UINT64_MAX) seg0[prev].next = nvh_off(pool, &seg0[b]);
        prev = b;
    }
    nvh_persist(pool, seg0, n * sizeof seg0[0]);
}

static int hm_create(nvh_pool *pool, nvh_off_t *link, const nvh_hmap_options *options)
{
    if (!pool || !link) return nvh_fail(NVH_E_INVAL, "nvh_hmap_create: NULL pool or link");
    if (!nvh_contains(pool, link, 8) || (uintptr_t)link % 8)
        return nvh_fail(NVH_E_INVAL, "nvh_hmap_create: link is not an aligned word in the pool");
    unsigned base = options && options->initial_buckets_log2 ? options->initial_buckets_log2
                                                            : NVH_HM_DEFAULT_BASE_LOG2;
    unsigned pct = options && options->max_load_pct ? options->max_load_pct
                                                   : NVH_HM_DEFAULT_LOAD_PCT;
    if (base < 1 || base > 24)
        return nvh_fail(NVH_E_INVAL, "nvh_hmap_create: initial_buckets_log2 %u not in 1..24", base);
    if (pct < 10 || pct > 10000)
        return nvh_fail(NVH_E_INVAL, "nvh_hmap_create: max_load_pct %u not in 10..10000", pct);

    /* Segment 0 first (unlinked: if we crash before the root is activated
     * the allocator frees the reservation — it only lives in DRAM). */
    uint64_t seg_bytes = hm_seg_buckets(base, 0) * sizeof(struct nvh_hm_dummy);
    struct nvh_hm_root *r = nvh_reserve(pool, sizeof *r);
    if (!r) return nvh_errcode();
    struct nvh_hm_dummy *seg0 = nvh_reserve(pool, seg_bytes);
    if (!seg0) {
        int rc = nvh_errcode();
        nvh_cancel(pool, r);
        return rc;
    }
    memset(r, 0, sizeof *r);
    r->version = NVH_HM_VERSION;
    r->base_log2 = base;
    r->seed = options && options->seed ? options->seed : hm_fresh_seed(pool, r);
    r->max_load_pct = pct;
    /* Bucket 0's dummy is the list head: made here, marked, never unlinked;
     * the other stripes' root buckets follow it. */
    hm_seg0_init(pool, seg0, r->seed, base);
    r->magic = NVH_HM_MAGIC;
    nvh_persist(pool, r, sizeof *r);
    /* Activation 1: the root, linked from the caller's word; activation 2:
     * segment 0, linked from the root's directory. The other order would
     * leak the segment if a crash came between the two (it would be durable
     * but linked only from a reservation). */
    nvh_off_t *root_links[1] = {link};
    int rc = nvh_activate(pool, r, root_links, 1);
    if (rc != NVH_OK) {
        nvh_cancel(pool, seg0);
        nvh_cancel(pool, r);
        return rc;
    }
    /* A crash here leaves a durable root with an empty directory: open
     * finishes the creation (hm_finish_create). */
    nvh_off_t *seg_links[1] = {&r->seg[0]};
    rc = nvh_activate(pool, seg0, seg_links, 1);
    if (rc != NVH_OK) {
        nvh_cancel(pool, seg0);
        return rc;
    }
    return NVH_OK;
}

/* A crash between the root's and segment 0's activation leaves a root with
 * an empty directory: give it segment 0 now (the same as create would). */
static int hm_finish_create(struct nvh_hmap *m)
{
    struct nvh_hm_root *r = m->root;
    uint64_t seg_bytes = hm_seg_buckets(r->base_log2, 0) * sizeof(struct nvh_hm_dummy);
    struct nvh_hm_dummy *seg0 = nvh_reserve(m->pool, seg_bytes);
    if (!seg0) return nvh_errcode();
    hm_seg0_init(m->pool, seg0, r->seed, r->base_log2);
    nvh_off_t *seg_links[1] = {&r->seg[0]};
    int rc = nvh_activate(m->pool, seg0, seg_links, 1);
    if (rc != NVH_OK) nvh_cancel(m->pool, seg0);
    return rc;
}

/* ==========================================================================
 * Open / recovery / close
 * ========================================================================== */
/* An update writes root->pending = old entry (fenced), activates the new
 * entry in the old one's place, then frees the old one with `pending` as the
 * free's link (cleared atomically with the free). A crash in between leaves
 * pending set: if the old entry is still in the list (the activation did not
 * happen) the update is void and pending is cleared; otherwise the old entry
 * is unreachable and is freed now. Cost: one bucket search. */
static int hm_recover_pending(struct nvh_hmap *m, uint64_t *slot)
{
    uint64_t off = *slot;
    if (off == 0) return NVH_OK;
    struct nvh_hm_node *old = nvh_ptr(m->pool, off);
    if (!nvh_contains(m->pool, old, sizeof *old) || off % NVH_ALLOC_ALIGN ||
        old->magic != NVH_HM_NODE_MAGIC || !(old->so_key & 1))
        return nvh_fail(NVH_E_CORRUPT, "hash map: pending entry at %llu is not an entry",
                        (unsigned long long)off);
    uint64_t h63 = hm_bitrev64(old->so_key & ~UINT64_C(1));
    struct hm_stripe *st = hm_stripe_of(m, h63);
    struct nvh_hm_dummy *d = nvh_hm_bucket_(m, st, h63);
    if (!d) return nvh_errcode();
    /* Is `old` itself reachable? Walk the run of equal split-order keys. */
    uint64_t *prev = &d->next;
    bool reachable = false;
    for (unsigned steps = 0; *prev; steps++) {
        struct nvh_hm_link *n = hm_node_at(m, *prev);   /* a damaged list: no repair */
        if (!n || steps > (1u << 20)) return nvh_hm_corrupt_(m, nvh_off(m->pool, prev), "list link");
        if (*prev == off) {
            reachable = true;
            break;
        }
        if (n->so_key > old->so_key) break;
        prev = &n->next;
    }
    m->recovered_pending++;
    if (reachable) {
        nvh_hm_settle_(m, st, true);
        *slot = 0;
        nvh_persist(m->pool, slot, 8);
        return NVH_OK;
    }
    nvh_hm_settle_(m, st, true);
    nvh_link l = {slot, 0};
    return nvh_free(m->pool, old, &l, 1);
}

/* Every slot (updates in flight at a crash are in different stripes, so
 * each is resolved on its own). */
static int hm_recover_slots(struct nvh_hmap *m)
{
    for (unsigned k = 0; k < HM_SLOTS; k++) {
        int rc = hm_recover_pending(m, hm_slot_word(m->root, k));
        if (rc != NVH_OK) return rc;
    }
    return NVH_OK;
}

static struct nvh_hmap *hm_handle_new(void)
{
    struct nvh_hmap *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->stripes = aligned_alloc(64, HM_STRIPES_MAX * sizeof *m->stripes);
    if (!m->stripes) {
        free(m);
        return NULL;
    }
    memset(m->stripes, 0, HM_STRIPES_MAX * sizeof *m->stripes);
    pthread_mutex_init(&m->lock, NULL);
    for (unsigned k = 0; k < HM_STRIPES_MAX; k++) pthread_mutex_init(&m->stripes[k].lock, NULL);
    return m;
}

static void hm_handle_free(struct nvh_hmap *m)
{
    pthread_mutex_destroy(&m->lock);
    for (unsigned k = 0; k < HM_STRIPES_MAX; k++) pthread_mutex_destroy(&m->stripes[k].lock);
    free(m->stripes);
    free(m);
}

static int hm_hook_close(nvh_pool_hook *hook, int check_only);

static nvh_hmap *hm_open(nvh_pool *pool, nvh_off_t root_off)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "nvh_hmap_open: NULL pool");
        return NULL;
    }
    struct nvh_hm_root *r = nvh_ptr(pool, root_off);
    if (!r || root_off % NVH_ALLOC_ALIGN || !nvh_contains(pool, r, sizeof *r)) {
        nvh_fail(NVH_E_INVAL, "nvh_hmap_open: offset %llu is not a hash map",
                 (unsigned long long)root_off);
        return NULL;
    }
    if (r->magic != NVH_HM_MAGIC) {
        nvh_fail(NVH_E_BADMAGIC, "nvh_hmap_open: no hash map at offset %llu",
                 (unsigned long long)root_off);
        return NULL;
    }
    if (r->version != NVH_HM_VERSION) {
        nvh_fail(NVH_E_VERSION, "nvh_hmap_open: hash map format %u (this library: %u)",
                 r->version, NVH_HM_VERSION);
        return NULL;
    }
    if (r->base_log2 < 1 || r->base_log2 > 24 || r->max_load_pct < 10) {
        nvh_fail(NVH_E_CORRUPT, "nvh_hmap_open: bad geometry (base %u, load %u)", r->base_log2,
                 r->max_load_pct);
        return NULL;
    }
    /* One handle per map and process (two handles would each trust their
     * own DRAM view: count, pending marks, and a second open's recovery
     * would undo the first handle's update in flight): an open map's handle
     * is returned again, with a reference more. */
    nvh_pool_hook *open = nvh_pool_hook_get_(pool, r);
    if (open) return (struct nvh_hmap *)(void *)((char *)open - offsetof(struct nvh_hmap, hook));
    struct nvh_hmap *m = hm_handle_new();
    if (!m) {
        nvh_fail(NVH_E_NOMEM, "nvh_hmap_open: out of memory");
        return NULL;
    }
    m->pool = pool;
    m->root = r;
    m->root_off = root_off;
    m->base_log2 = r->base_log2;
    m->seed = r->seed;
    m->nstripes = hm_nstripes(m->base_log2);
    int rc = NVH_OK;
    /* A read-only open cannot repair: an interrupted create reads as a
     * corrupt map, and a pending update is left for the next writable open
     * (readers are unaffected by it: the old entry is either still in the
     * list, or unreachable). */
    if (r->seg[0] == 0 && !pool->readonly) rc = hm_finish_create(m);
    if (rc == NVH_OK) rc = hm_load_directory(m);
    if (rc == NVH_OK && !pool->readonly) rc = hm_link_stripe_roots(m);
    if (rc == NVH_OK && !pool->readonly) rc = hm_recover_slots(m);
    if (rc != NVH_OK) {
        hm_handle_free(m);
        return NULL;
    }
    hm_st(&m->count, r->count_hint);
    m->hook.key = r;
    m->hook.close = hm_hook_close;
    nvh_pool_hook *got = nvh_pool_hook_add_(pool, &m->hook);
    if (got != &m->hook) {
        /* another thread opened it meanwhile: use that handle */
        hm_handle_free(m);
        return (struct nvh_hmap *)(void *)((char *)got - offsetof(struct nvh_hmap, hook));
    }
    return m;
}

static int hm_close(nvh_hmap *m)
{
    if (!m) return NVH_OK;
    hm_lock_all(m);
    if (!m->pool->readonly) {
        for (unsigned k = 0; k < m->nstripes; k++) nvh_hm_settle_(m, &m->stripes[k], true);
        nvh_hm_count_changed_(m, 0, true);
        nvh_drain(m->pool);
    }
    hm_unlock_all(m);
    hm_handle_free(m);
    return NVH_OK;
}

/* nvh_pool_close with the map still open: operations are durable when
 * they return; close persists the count hint and frees the handle. */
static int hm_hook_close(nvh_pool_hook *hook, int check_only)
{
    if (check_only) return NVH_OK;
    struct nvh_hmap *m = (struct nvh_hmap *)(void *)((char *)hook - offsetof(struct nvh_hmap, hook));
    nvh_pool *pool = m->pool;
    nvh_protect_internal_begin(pool);
    int rc = hm_close(m);
    nvh_protect_internal_end(pool);
    return rc;
}

/* ==========================================================================
 * Destroy: entry by entry (each step failure-atomic), then the segments,
 * then the root. A crash in the middle leaves a smaller, consistent map.
 * ========================================================================== */
static int hm_destroy(nvh_hmap *m, nvh_off_t *link)
{
    if (!m || !link) return nvh_fail(NVH_E_INVAL, "nvh_hmap_destroy: NULL map or link");
    if (m->pool->readonly) return nvh_fail(NVH_E_READONLY, "nvh_hmap_destroy: pool is read-only");
    if (*link != m->root_off)
        return nvh_fail(NVH_E_INVAL, "nvh_hmap_destroy: link does not point at the map");
    if (nvh_pool_hook_del_(m->pool, &m->hook) > 0) {
        nvh_pool_hook_add_(m->pool, &m->hook);      /* keep the reference: refused */
        return nvh_fail(NVH_E_BUSY, "nvh_hmap_destroy: the map is open more than once "
                        "(close the other handles first)");
    }
    hm_lock_all(m);
    int rc = NVH_OK;
    for (unsigned k = 0; k < m->nstripes; k++) nvh_hm_settle_(m, &m->stripes[k], true);
    /* Walk from bucket 0's dummy, unlinking each entry from its predecessor. */
    uint64_t *prev = &m->seg_ptr[0][0].next;
    while (rc == NVH_OK && *prev) {
        struct nvh_hm_link *n = hm_at(m, *prev);
        if (!(n->so_key & 1)) {                 /* a dummy: keep, step over it */
            prev = &n->next;
            continue;
        }
        nvh_link l = {prev, n->next};
        rc = nvh_free(m->pool, n, &l, 1);
        if (rc == NVH_OK) hm_st(&m->count, m->count ? m->count - 1 : 0);
    }
    /* Only dummies are left. Before our own stores unlink them, retire the
     * allocator's redo rings so no replayed link store can bring a freed
     * entry back (docs/ALLOC.md, A-B-A caveat). Then unmark every dummy but
     * bucket 0's and cut the list after it (a crash leaves an empty map),
     * and free the segments top down (the directory stays a prefix). */
    if (rc == NVH_OK) rc = nvh_heap_sync(m->pool);
    for (unsigned k = 0; rc == NVH_OK && k < m->nsegs; k++) {
        uint64_t nb = hm_seg_buckets(m->base_log2, k);
        for (uint64_t i = k == 0 ? 1 : 0; i < nb; i++) {
            if (m->seg_ptr[k][i].check == 0) continue;
            hm_st(&m->seg_ptr[k][i].check, 0);
            nvh_flush(m->pool, &m->seg_ptr[k][i].check, 8);
        }
    }
    if (rc == NVH_OK) {
        nvh_drain(m->pool);
        hm_st(&m->seg_ptr[0][0].next, 0);
        nvh_persist(m->pool, &m->seg_ptr[0][0].next, 8);
    }
    /* Segment 0 last but one: a crash before the root is freed leaves a
     * root with no segment, which open turns into an empty map again. */
    for (unsigned k = m->nsegs; rc == NVH_OK && k-- > 0;) {
        nvh_link l = {&m->root->seg[k], 0};
        rc = nvh_free(m->pool, m->seg_ptr[k], &l, 1);
    }
    if (rc == NVH_OK) {
        nvh_link l = {link, 0};
        rc = nvh_free(m->pool, m->root, &l, 1);
    }
    hm_unlock_all(m);
    if (rc != NVH_OK) {
        nvh_pool_hook_add_(m->pool, &m->hook);      /* still open */
        return rc;
    }
    hm_handle_free(m);
    return NVH_OK;
}

/* ==========================================================================
 * The cold paths, each whole inside an implicit protection window
 * ========================================================================== */
int nvh_hmap_create(nvh_pool *pool, nvh_off_t *link, const nvh_hmap_options *options)
{
    if (!pool) return hm_create(pool, link, options);
    nvh_protect_internal_begin(pool);
    int rc = hm_create(pool, link, options);
    nvh_protect_internal_end(pool);
    return rc;
}

nvh_hmap *nvh_hmap_open(nvh_pool *pool, nvh_off_t root_off)
{
    if (!pool) return hm_open(pool, root_off);
    nvh_protect_internal_begin(pool);
    nvh_hmap *m = hm_open(pool, root_off);
    nvh_protect_internal_end(pool);
    return m;
}

int nvh_hmap_close(nvh_hmap *m)
{
    if (!m) return NVH_OK;
    nvh_pool *pool = m->pool;
    if (nvh_pool_hook_del_(pool, &m->hook) > 0) return NVH_OK;   /* opened again */
    nvh_protect_internal_begin(pool);
    int rc = hm_close(m);
    nvh_protect_internal_end(pool);
    return rc;
}

int nvh_hmap_destroy(nvh_hmap *m, nvh_off_t *link)
{
    if (!m) return hm_destroy(m, link);
    nvh_pool *pool = m->pool;
    nvh_protect_internal_begin(pool);
    int rc = hm_destroy(m, link);
    nvh_protect_internal_end(pool);
    return rc;
}
