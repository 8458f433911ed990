/* sorted_slab.c — record slabs of the sorted engine: records carved from
 * tree-owned slabs instead of one allocator object each, and the DRAM
 * accounting that frees a slab once no slot names a record in it.
 *
 * Why: a record needs no allocation state of its own. What makes it live is
 * the leaf slot naming it, and that word is stored only after the record is
 * durable ([Moraru11] §6). With one allocator object per record every put
 * paid an activation: a log record, a locked instruction that waited for the
 * record's outstanding flushes, and the log rings' periodic retire fences.
 * Carved from a slab, a record costs a DRAM bump; the slab's own activation
 * (one per slab) is the data fence of the put that made it, so a put stays
 * at 2 fences. A crash leaves at worst records no slot names: garbage in a
 * slab, never a dangling word.
 *
 * Carvers: each writer thread bumps in its own carver (by kvs_tid), so
 * writers of different leaves do not share a line to carve. A carver's
 * slabs grow from KVS_SLAB_MIN to slab_max by doubling: a short session
 * (a CLI put) takes 1 KiB, a long one few activations.
 *
 * Space: space inside a slab is never reused (no stale reader can see a
 * different record at the same address); a slab is freed whole, through
 * the allocator's free (unlinked from the list in the same failure-atomic
 * step), once its live count is 0 and no carver carves from it. That free
 * is owed like a queued record's: the next write's data fence does it.
 * Live counts live in DRAM: the lazy build (the first operation after an
 * open, which walks every slot anyway) counts every slab's live records and
 * frees the empty ones, so open stays O(1).
 *
 * Locks: a carver's lock, then slab_mu (changes of the persistent list,
 * held across their fence), then slab_lock (the DRAM table, the queue, the
 * counts; never held across a fence, so writers that release records never
 * wait for another thread's flush). */
#include "sorted_int.h"

#include <sys/mman.h>

/* ==========================================================================
 * The table of slabs by offset (under slab_lock, or at the build)
 * ========================================================================== */
long kvs_slab_find(const kv_sorted *t, uint64_t rec)
{
    size_t lo = 0, hi = t->nsl;
    while (lo < hi) {                       /* first slab starting above rec */
        size_t m = (lo + hi) / 2;
        if (t->sl[m]->off <= rec) lo = m + 1;
        else hi = m;
    }
    if (lo == 0) return -1;
    const kvs_slabi *si = t->sl[lo - 1];
    return rec < si->end ? (long)(lo - 1) : -1;
}

/* Room for one more slab in the table. */
static int kvs_sl_reserve(kv_sorted *t)
{
    if (t->nsl == t->capsl) {
        size_t cap = t->capsl ? 2 * t->capsl : 64;
        kvs_slabi **n = realloc(t->sl, cap * sizeof *n);
        if (!n) return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory (slab table)");
        t->sl = n;
        t->capsl = cap;
    }
    return NVH_OK;
}

static int kvs_sl_add(kv_sorted *t, kvs_slabi *si)
{
    int rc = kvs_sl_reserve(t);
    if (rc) return rc;
    size_t i = t->nsl;
    while (i > 0 && t->sl[i - 1]->off > si->off) i--;   /* new slabs: mostly at the end */
    memmove(t->sl + i + 1, t->sl + i, (t->nsl - i) * sizeof *t->sl);
    t->sl[i] = si;
    t->nsl++;
    return NVH_OK;
}

static void kvs_sl_remove(kv_sorted *t, const kvs_slabi *si)
{
    long i = kvs_slab_find(t, si->off);
    if (i < 0 || t->sl[i] != si) return;
    memmove(t->sl + i, t->sl + i + 1, (t->nsl - (size_t)i - 1) * sizeof *t->sl);
    t->nsl--;
}

/* ==========================================================================
 * Freeing empty slabs
 * ========================================================================== */
/* si (not current) may have become empty: queue its free (under slab_lock). */
static void kvs_slab_maybe_queue(kv_sorted *t, kvs_slabi *si)
{
    if (si->live != 0 || si->cur || si->queued) return;
    si->queued = 1;
    si->qnext = t->sq;
    t->sq = si;
    __atomic_add_fetch(&t->nsq, 1, __ATOMIC_RELEASE);
}

/* Free si (under slab_mu): its free unlinks it from the persistent list
 * (failure-atomic), so a crash leaves it listed or gone. */
static int kvs_slab_free(kv_sorted *t, kvs_slabi *si)
{
    nvh_pool *pool = t->pool;
    kvs_slab *s = nvh_ptr(pool, si->off);
    nvh_off_t *link = si->newer ? &((kvs_slab *)nvh_ptr(pool, si->newer->off))->next
                                : &t->hdr->slabs;
    if (*link != si->off)
        return nvh_fail(NVH_E_CORRUPT, "sorted tree (header at offset %llu): slab list out of "
                        "order at slab %llu", (unsigned long long)t->hdr_off,
                        (unsigned long long)si->off);
    nvh_link lk = {link, s->next};
    int rc = nvh_free(pool, s, &lk, 1);
    if (rc) return rc;

    kvs_spin_lock(&t->slab_lock);
    if (si->newer) si->newer->older = si->older;
    else __atomic_store_n(&t->slab_newest, si->older, __ATOMIC_RELAXED);
    if (si->older) si->older->newer = si->newer;
    kvs_sl_remove(t, si);
    kvs_spin_unlock(&t->slab_lock);
    free(si);
    return NVH_OK;
}

int kvs_slab_free_one(kv_sorted *t)
{
    if (__builtin_expect(!__atomic_load_n(&t->nsq, __ATOMIC_ACQUIRE), 1)) return 0;
    pthread_mutex_lock(&t->slab_mu);
    kvs_spin_lock(&t->slab_lock);
    kvs_slabi *si = t->sq;
    if (si) {
        t->sq = si->qnext;
        __atomic_sub_fetch(&t->nsq, 1, __ATOMIC_RELEASE);
    }
    kvs_spin_unlock(&t->slab_lock);
    int rc = 0;
    if (si) {
        rc = kvs_slab_free(t, si);
        if (rc) {                       /* stays listed: the next build frees it */
            kvs_spin_lock(&t->slab_lock);
            si->queued = 0;
            kvs_spin_unlock(&t->slab_lock);
            rc = nvh_fail_context(rc, "sorted tree (header at offset %llu): free of slab %llu",
                                  (unsigned long long)t->hdr_off, (unsigned long long)si->off);
        } else {
            rc = 1;
        }
    }
    pthread_mutex_unlock(&t->slab_mu);
    return rc;
}

/* ==========================================================================
 * Carving
 * ========================================================================== */
/* Fault a fresh slab in at once (one call instead of a fault per page),
 * where the mapping is ordinary memory the kernel populates. */
static void kvs_slab_populate(kv_sorted *t, void *p, size_t len)
{
    if (len >= 2 * NVH_PAGE) nvh_pool_populate_fresh_(t->pool, p, len);
}

/* The carver's slab is full: it stops being current; empty, it is owed its
 * free (under the carver's lock). */
static void kvs_carver_retire(kv_sorted *t, kvs_carver *cv)
{
    if (!cv->si) return;
    kvs_spin_lock(&t->slab_lock);
    cv->si->live += cv->carved;
    cv->si->cur = 0;
    kvs_slab_maybe_queue(t, cv->si);
    kvs_spin_unlock(&t->slab_lock);
    cv->si = NULL;
    cv->base = NULL;
    cv->used = cv->size = 0;
    cv->carved = 0;
}

void *kvs_slab_carve(kv_sorted *t, size_t size, kvs_carve *cr)
{
    kvs_carver *cv = &t->carv[kvs_tid() % KVS_CARVERS];
    cr->cv = cv;
    cr->fresh = NULL;
    kvs_spin_lock(&cv->lock);
    if (cv->used + size <= cv->size) {
        void *r = cv->base + cv->used;
        cv->used += size;
        cv->carved++;
        cr->si = cv->si;
        kvs_spin_unlock(&cv->lock);
        return r;
    }
    kvs_carver_retire(t, cv);
    uint64_t ss = cv->next_size ? cv->next_size : KVS_SLAB_MIN;
    while (ss < sizeof(kvs_slab) + size) ss *= 2;
    kvs_slabi *si = calloc(1, sizeof *si);
    kvs_slab *s = si ? nvh_reserve(t->pool, ss) : NULL;
    if (!s) {
        int rc = si ? nvh_fail_context(nvh_errcode(), "sorted tree: no space for a record slab of "
                                       "%llu bytes", (unsigned long long)ss)
                    : nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory (slab)");
        (void)rc;
        free(si);
        kvs_spin_unlock(&cv->lock);
        return NULL;
    }
    /* a slot word an activation named may hold a value a slab record could
     * repeat once freed space became this slab (the allocator's recovery
     * re-applies a link while the word holds the activation's old value,
     * docs/ALLOC.md §4): retire the rings first. Never for a tree whose
     * records all fit in slabs. */
    if (__atomic_load_n(&t->slab_acts, __ATOMIC_ACQUIRE)) {
        __atomic_store_n(&t->slab_acts, 0, __ATOMIC_RELAXED);
        int rc = nvh_heap_sync(t->pool);
        if (rc) {
            nvh_cancel(t->pool, s);
            free(si);
            kvs_spin_unlock(&cv->lock);
            return NULL;
        }
    }
    kvs_slab_populate(t, s, ss);
    /* The list is held until the activation (kvs_slab_activate), so that
     * the slab's next and the list head it activates over stay what they
     * are now: both must be durable before the activation (nvh_activate's
     * preconditions: the object's content and its link's current value),
     * which the put's data fence does. */
    pthread_mutex_lock(&t->slab_mu);
    memset(s, 0, sizeof *s);
    s->magic = KVS_SLAB_MAGIC;
    s->version = KVS_VERSION;
    s->tree = t->hdr_off;
    s->size = ss;
    s->next = t->hdr->slabs;
    nvh_flush(t->pool, s, sizeof *s);
    if (t->rec16) {
        if (t->hdr->version < KVS_HDR_VERSION_SLABS) t->hdr->version = KVS_HDR_VERSION_SLABS;
    } else if (t->hdr->version < KVS_HDR_VERSION_REC8) {
        /* durable at the same fence, before any slot can name a record in
         * a slab (records carved here have the 8-byte header): a library
         * that reads only versions 1 and 2 refuses the tree */
        t->hdr->version = KVS_HDR_VERSION_REC8;
    }
    nvh_flush(t->pool, &t->hdr->slabs, sizeof t->hdr->slabs);     /* line 0: version too */
    si->off = nvh_off(t->pool, s);
    si->end = si->off + ss;
    si->cur = 1;
    cv->next_size = 2 * ss < t->slab_max ? 2 * ss : t->slab_max;
    cv->si = si;
    cv->base = (char *)s;
    cv->size = ss;
    cv->used = sizeof *s + size;
    cv->carved = 1;
    cr->si = si;
    cr->fresh = s;          /* carver and list held until the activation */
    return (char *)s + sizeof *s;
}

int kvs_slab_activate(kv_sorted *t, kvs_carve *cr)
{
    nvh_pool *pool = t->pool;
    kvs_slab *s = cr->fresh;
    kvs_slabi *si = cr->si;
    kvs_carver *cv = cr->cv;
    /* room in the table first: once activated, the slab must be in the
     * DRAM list (the next free's link is found through it) */
    kvs_spin_lock(&t->slab_lock);
    int rc = kvs_sl_reserve(t);
    kvs_spin_unlock(&t->slab_lock);
    if (rc == NVH_OK) {
        nvh_off_t *const links[1] = {&t->hdr->slabs};
        rc = nvh_activate(pool, s, links, 1);
    }
    if (rc) nvh_cancel(pool, s);
    else {
        kvs_spin_lock(&t->slab_lock);
        kvs_sl_add(t, si);              /* room reserved above */
        si->older = t->slab_newest;
        if (si->older) si->older->newer = si;
        __atomic_store_n(&t->slab_newest, si, __ATOMIC_RELAXED);
        kvs_spin_unlock(&t->slab_lock);
    }
    pthread_mutex_unlock(&t->slab_mu);
    if (rc) {
        cv->si = NULL; cv->base = NULL; cv->used = cv->size = 0; cv->carved = 0;
        free(si);
        cr->si = NULL;
    }
    cr->fresh = NULL;
    kvs_spin_unlock(&cv->lock);
    return rc;
}

void kvs_slab_abort(kv_sorted *t, kvs_carve *cr)
{
    if (cr->fresh) {
        kvs_carver *cv = cr->cv;
        nvh_cancel(t->pool, cr->fresh);
        pthread_mutex_unlock(&t->slab_mu);
        free(cv->si);
        cv->si = NULL; cv->base = NULL; cv->used = cv->size = 0; cv->carved = 0;
        cr->fresh = NULL;
        kvs_spin_unlock(&cv->lock);
    } else if (cr->si) {
        kvs_slab_release(t, cr->si);
    }
    cr->si = NULL;
}

kvs_slabi *kvs_slab_of(kv_sorted *t, uint64_t rec)
{
    /* no slab at all (a tree of allocator records only): no lock. A slab
     * holding rec was activated before the slot naming it was stored, under
     * the leaf lock the caller holds now */
    if (!__atomic_load_n(&t->slab_newest, __ATOMIC_RELAXED)) return NULL;
    kvs_spin_lock(&t->slab_lock);
    long i = kvs_slab_find(t, rec);
    kvs_slabi *si = i >= 0 ? t->sl[i] : NULL;
    kvs_spin_unlock(&t->slab_lock);
    return si;
}

void kvs_slab_release(kv_sorted *t, kvs_slabi *si)
{
    kvs_spin_lock(&t->slab_lock);
    si->live--;
    kvs_slab_maybe_queue(t, si);
    kvs_spin_unlock(&t->slab_lock);
}

/* ==========================================================================
 * Build, close, destroy, check
 * ========================================================================== */
int kvs_slab_load(kv_sorted *t)
{
    nvh_pool *pool = t->pool;
    uint64_t size = nvh_pool_size(pool), hops = 0, max = size / KVS_SLAB_MIN + 1;
    kvs_slabi *newer = NULL;
    for (uint64_t o = t->hdr->slabs; o;) {
        kvs_slab *s = nvh_ptr(pool, o);
        if (++hops > max || (o & 63) || o > size - sizeof *s || s->magic != KVS_SLAB_MAGIC ||
            s->tree != t->hdr_off || s->size < 2 * sizeof *s || s->size > size - o ||
            nvh_usable_size(pool, s) < s->size)
            return kvs_corrupt(t, o, "record slab");
        kvs_slabi *si = calloc(1, sizeof *si);
        if (!si) return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory (slab table)");
        si->off = o;
        si->end = o + s->size;
        int rc = kvs_sl_add(t, si);
        if (rc) { free(si); return rc; }
        si->newer = newer;
        if (newer) newer->older = si;
        else t->slab_newest = si;
        newer = si;
        o = s->next;
    }
    for (size_t i = 1; i < t->nsl; i++)
        if (t->sl[i]->off < t->sl[i - 1]->end) return kvs_corrupt(t, t->sl[i]->off, "record slab (overlaps another)");
    return NVH_OK;
}

void kvs_slab_count(kv_sorted *t, uint64_t rec)
{
    long i = kvs_slab_find(t, rec);
    if (i >= 0) t->sl[i]->live++;
}

int kvs_slab_loaded(kv_sorted *t)
{
    for (kvs_slabi *si = t->slab_newest, *o; si; si = o) {
        o = si->older;
        if (si->live) continue;
        int rc = kvs_slab_free(t, si);
        if (rc) return rc;
    }
    return NVH_OK;
}

void kvs_slab_fini(kv_sorted *t)
{
    for (kvs_slabi *si = t->slab_newest, *o; si; si = o) {
        o = si->older;
        free(si);
    }
    /* carvers' fresh slabs never outlive the put that made them */
    t->slab_newest = NULL;
    t->sq = NULL;
    t->nsq = 0;
    free(t->sl);
    t->sl = NULL;
    t->nsl = t->capsl = 0;
    for (unsigned i = 0; i < KVS_CARVERS; i++) {
        kvs_carver *cv = &t->carv[i];
        cv->si = NULL; cv->base = NULL; cv->used = cv->size = 0; cv->carved = 0;
    }
}

int kvs_slab_destroy(kv_sorted *t)
{
    /* (under smo with no writer: the list is the caller's) */
    /* no slot names a record any more: each slab leaves the list head */
    while (t->slab_newest) {
        t->slab_newest->live = 0;
        int rc = kvs_slab_free(t, t->slab_newest);
        if (rc) return rc;
    }
    return NVH_OK;
}

int kvs_slab_check(kv_sorted *t, const uint64_t *counts)
{
    for (size_t i = 0; i < t->nsl; i++) {
        kvs_slabi *si = t->sl[i];
        int64_t live = si->live;
        for (unsigned c = 0; c < KVS_CARVERS; c++)
            if (t->carv[c].si == si) live += t->carv[c].carved;
        if (live != (int64_t)counts[i])
            return kvs_corrupt(t, si->off, "record slab (live count differs from its records)");
        if (!si->cur && live == 0 && !si->queued)
            return kvs_corrupt(t, si->off, "record slab (empty but not owed its free)");
    }
    uint64_t n = 0;
    for (kvs_slabi *si = t->slab_newest; si; si = si->older) {
        if (++n > t->nsl) return kvs_corrupt(t, si->off, "record slab list (a cycle)");
        uint64_t want = si->older ? si->older->off : 0;
        if (((kvs_slab *)nvh_ptr(t->pool, si->off))->next != want)
            return kvs_corrupt(t, si->off, "record slab (list differs from its DRAM copy)");
    }
    if (n != t->nsl || (t->slab_newest ? t->slab_newest->off : 0) != t->hdr->slabs)
        return kvs_corrupt(t, t->hdr_off, "record slab list (differs from its DRAM copy)");
    return NVH_OK;
}
