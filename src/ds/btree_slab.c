/* btree_slab.c — value records of the B+ tree: carved from tree-owned slabs
 * (persistent modes) or malloc'd (volatile variant), and the DRAM accounting
 * that frees a slab once no live leaf entry references a record in it.
 *
 * Why slabs: with one allocator object per record, every insert paid the
 * allocator's activation fence (the record must be allocated failure-
 * atomically). But a record needs no allocation state of its own: the leaf
 * entry pointing at it is what makes it live, and that pointer is written
 * only after the record is durable ([Moraru11] §6: a record "becomes valid only
 * when its key is written after its data is durable"). So a slab of 64 KiB
 * is activated once (one fence per ~200 records of 256 B) and records are
 * carved from it by a DRAM bump pointer; a crash leaves at worst records that
 * no entry references — garbage inside a slab, never a dangling pointer.
 *
 * Space: a slab is freed (nvh_free, unlinking it from the persistent list)
 * when its live count drops to zero. Live counts are known for this
 * session's slabs (counted as records are carved and released); slabs of
 * earlier sessions are counted by nvh_btree_reclaim (one walk of the tree),
 * so open stays O(1). Until then their dead records' space is not reused.
 * Slab space is never reused inside a slab (bump only), so no stale pointer
 * can ever see a different record at the same address; a freed slab goes
 * through the allocator's don't-allocate FIFO like any object.
 *
 * Across sessions: the tree header names the slab records were carved from
 * last (cur_slab), and each slab's header keeps a durable bound of its bump
 * pointer (fill), raised BT_FILL_STEP ahead of it in the same store-and-
 * flush that precedes the record's fence, so no record that an entry can
 * point at lies past it. The next session (after a close, or a crash) goes
 * on carving at the bound instead of activating a slab of its own: many
 * short sessions share slabs; a session that dies skips at most
 * BT_FILL_STEP. A clean close makes the bound exact.
 */
#include <stdlib.h>
#include <string.h>

#include "../common/internal.h"
#include "../protect/protect.h"
#include "btree.h"

/* ==========================================================================
 * Tracking table: slab offset -> bt_slabinfo (open addressing + free list)
 * ========================================================================== */
static inline uint32_t si_hash_of(nvh_off_t off, uint32_t cap)
{
    return (uint32_t)((off >> 6) * 0x9E3779B97F4A7C15ull >> 32) & (cap - 1);
}

static int32_t si_find(const struct nvh_btree *t, nvh_off_t off)
{
    if (!t->si_hash_cap) return -1;
    for (uint32_t h = si_hash_of(off, t->si_hash_cap);; h = (h + 1) & (t->si_hash_cap - 1)) {
        int32_t i = t->si_hash[h];
        if (i == -1) return -1;
        if (t->si[i].off == off) return i;
    }
}

static int si_rehash(struct nvh_btree *t, uint32_t cap)
{
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return nvh_fail(NVH_E_NOMEM, "btree: out of memory (slab table)");
    for (uint32_t k = 0; k < cap; k++) h[k] = -1;
    for (uint32_t i = 0; i < t->si_used; i++) {
        if (!t->si[i].off) continue;
        uint32_t p = si_hash_of(t->si[i].off, cap);
        while (h[p] != -1) p = (p + 1) & (cap - 1);
        h[p] = (int32_t)i;
    }
    free(t->si_hash);
    t->si_hash = h;
    t->si_hash_cap = cap;
    return NVH_OK;
}

/* Track slab off (live 0) at the tail (`at_head` 0) or head of the DRAM list. */
static int32_t si_add(struct nvh_btree *t, nvh_off_t off, int at_head, int32_t *tail)
{
    int32_t i;
    if (t->si_freelist >= 0) {
        i = t->si_freelist;
        t->si_freelist = t->si[i].next;
    } else {
        if (t->si_used == t->si_cap) {
            uint32_t ncap = t->si_cap ? t->si_cap * 2 : 64;
            bt_slabinfo *n = realloc(t->si, ncap * sizeof *n);
            if (!n) { nvh_fail(NVH_E_NOMEM, "btree: out of memory (slab table)"); return -1; }
            t->si = n;
            t->si_cap = ncap;
        }
        i = (int32_t)t->si_used++;
    }
    t->si[i] = (bt_slabinfo){0, 0, -1, -1};
    if ((t->si_used + 1) * 2 > t->si_hash_cap && si_rehash(t, t->si_hash_cap ? t->si_hash_cap * 2 : 128) != NVH_OK)
        return -1;
    t->si[i] = (bt_slabinfo){off, 0, -1, -1};
    uint32_t p = si_hash_of(off, t->si_hash_cap);
    while (t->si_hash[p] != -1) p = (p + 1) & (t->si_hash_cap - 1);
    t->si_hash[p] = i;
    if (at_head) {
        t->si[i].next = t->si_head;
        if (t->si_head >= 0) t->si[t->si_head].prev = i;
        t->si_head = i;
    } else {
        t->si[i].prev = *tail;
        if (*tail >= 0) t->si[*tail].next = i;
        else t->si_head = i;
        *tail = i;
    }
    return i;
}

static void si_remove(struct nvh_btree *t, int32_t i)
{
    bt_slabinfo *s = &t->si[i];
    if (s->prev >= 0) t->si[s->prev].next = s->next;
    else t->si_head = s->next;
    if (s->next >= 0) t->si[s->next].prev = s->prev;
    /* linear probing: delete by shifting the rest of the cluster back */
    uint32_t mask = t->si_hash_cap - 1, h = si_hash_of(s->off, t->si_hash_cap);
    while (t->si_hash[h] != i) h = (h + 1) & mask;
    t->si_hash[h] = -1;
    for (uint32_t j = (h + 1) & mask; t->si_hash[j] != -1; j = (j + 1) & mask) {
        uint32_t k = si_hash_of(t->si[t->si_hash[j]].off, t->si_hash_cap);
        /* leave it if its home k lies cyclically in (h, j] */
        if (h <= j ? (h < k && k <= j) : (h < k || k <= j)) continue;
        t->si_hash[h] = t->si_hash[j];
        t->si_hash[j] = -1;
        h = j;
    }
    s->off = 0;
    s->next = t->si_freelist;
    t->si_freelist = i;
}

/* The current slab's write window (protected pools): opened over all of its
 * 64 KiB when it becomes current, closed when it is full. Its fresh pages
 * then cost one unprotect for the slab (one fault resolving the run, or one
 * mprotect) instead of one per page, and the per-record windows inside it
 * are nested count updates. Exposure: the slab's not-yet-carved space and
 * its records stay writable while it is current (docs/PROTECT.md). */
static void bt_slab_unhold(struct nvh_btree *t)
{
    if (t->pool && t->slab_hold.p) nvh_protect_hold_close_(t->pool, &t->slab_hold);
}

static void si_reset(struct nvh_btree *t)
{
    free(t->si);
    free(t->si_hash);
    t->si = NULL;
    t->si_hash = NULL;
    t->si_cap = t->si_used = t->si_hash_cap = 0;
    t->si_head = t->si_freelist = -1;
    t->slab_idx = -1;
}

void bt_slab_fini(struct nvh_btree *t)
{
    bt_slab_unhold(t);
    si_reset(t);
}

/* ==========================================================================
 * Slabs
 * ========================================================================== */
/* A new slab of `size` bytes, pushed at the head of the list: header
 * written and persisted, then activated with link = header.slabs. */
static bt_slab *bt_slab_new(struct nvh_btree *t, uint64_t size, int32_t *idx, int hold)
{
    bt_slab *s = nvh_reserve(t->pool, size);
    if (!s) return NULL;
    /* the allocator may round a reservation up (a record's own slab, to
     * whole blocks): the slab is all of it */
    size_t usable = nvh_usable_size(t->pool, s);
    if (usable > size) size = usable;
    /* The allocator writes the header of the free space that follows the
     * slab at the slab's activation, on the page after it: fresh memory
     * too. A window on it, opened with the hold, makes it writable with
     * the slab (the fault on the slab's header resolves the whole run of
     * adjacent pages with a window open) instead of a fault of its own
     * inside nvh_activate; closed again once the activation is done.
     * Only the allocator writes there meanwhile. */
    char *after = NULL;
    if (hold) {
        /* the new current slab: held before its header is written, so the
         * header's page is made writable with the rest (one fault or
         * mprotect for the whole slab, not one for the header first) */
        bt_slab_unhold(t);
        nvh_protect_hold_open_(t->pool, &t->slab_hold, s, size);
        after = (char *)NVH_ALIGN_UP((uintptr_t)s + size, (uintptr_t)NVH_PAGE);
        if (t->slab_hold.epoch && nvh_contains(t->pool, after, 64))
            nvh_protect_open_(t->pool, after, 64);
        else
            after = NULL;
    }
    bt_prefault(t, s, size);
    nvh_protect_open_(t->pool, s, sizeof *s);
    memset(s, 0, sizeof *s);
    s->magic = BT_MAGIC_SLAB;
    s->next = t->hdr->slabs;
    s->size = size;
    s->tree = bt_off(t, t->hdr);
    s->fill = size;                   /* a record's own slab: full at once */
    if (hold) {
        s->fill = sizeof *s + BT_FILL_STEP < size ? sizeof *s + BT_FILL_STEP : size;
        t->slab_fill = s->fill;
    }
    s->fill_check = bt_fill_check(bt_off(t, s), s->fill);
    nvh_persist(t->pool, s, sizeof *s);
    nvh_protect_close_(t->pool, s, sizeof *s);
    /* a current slab is also named by the header's cur_slab (both links are
     * set by the one activation) */
    nvh_off_t *links[2] = {&t->hdr->slabs, &t->hdr->cur_slab};
    unsigned nlinks = hold ? 2 : 1;
    nvh_protect_open_(t->pool, t->hdr, sizeof *t->hdr);
    int rc = nvh_activate(t->pool, s, links, nlinks);
    nvh_protect_close_(t->pool, t->hdr, sizeof *t->hdr);
    if (after) nvh_protect_close_(t->pool, after, 64);
    if (rc != NVH_OK) {
        if (hold) bt_slab_unhold(t);
        nvh_cancel(t->pool, s);
        return NULL;
    }
    *idx = si_add(t, bt_off(t, s), 1, NULL);
    if (*idx < 0) return NULL;       /* tracked never: only its space is lost */
    t->stats.slabs++;
    return s;
}

/* Free the tracked slab i (its live count is 0): unlink it from the list. */
static int bt_slab_free(struct nvh_btree *t, int32_t i)
{
    /* Entries that stopped referencing its records must be durable before
     * the space can be reused: deletes and updates are (they fence), and
     * pending inserts hold records of the current slab only; settle the
     * group context anyway (this runs once per slab). */
    if (t->group && nvh_group_pending(t->group)) {
        int rc = nvh_group_sync(t->group);
        if (rc != NVH_OK) return rc;
    }
    bt_slab *s = bt_ptr(t, t->si[i].off);
    int32_t p = t->si[i].prev;
    nvh_off_t *link = p >= 0 ? &((bt_slab *)bt_ptr(t, t->si[p].off))->next : &t->hdr->slabs;
    if (*link != t->si[i].off) return nvh_fail(NVH_E_CORRUPT, "btree: slab list out of order (bug)");
    /* the header must never name a freed slab as the one to go on carving */
    nvh_link l[2] = {{link, s->next}, {&t->hdr->cur_slab, 0}};
    unsigned nl = t->hdr->cur_slab == t->si[i].off ? 2 : 1;
    nvh_protect_open_(t->pool, link, sizeof *link);
    nvh_protect_open_(t->pool, t->hdr, sizeof *t->hdr);
    int rc = nvh_free(t->pool, s, l, nl);
    nvh_protect_close_(t->pool, t->hdr, sizeof *t->hdr);
    nvh_protect_close_(t->pool, link, sizeof *link);
    if (rc != NVH_OK) return rc;
    si_remove(t, i);
    t->stats.slabs_freed++;
    return NVH_OK;
}

/* ==========================================================================
 * Records
 * ========================================================================== */
/* The bump pointer passed the durable fill bound: raise it BT_FILL_STEP
 * ahead. Stored and flushed, not fenced: the fence that makes the record
 * durable, which every insert and update has before an entry points at the
 * record, makes the bound durable first. */
static void bt_slab_raise_fill(struct nvh_btree *t)
{
    bt_slab *s = t->slab;
    uint64_t f = t->slab_used + BT_FILL_STEP;
    if (f > s->size) f = s->size;
    nvh_protect_open_(t->pool, s, sizeof *s);
    s->fill = f;
    s->fill_check = bt_fill_check(bt_off(t, s), f);
    nvh_flush(t->pool, s, sizeof *s);
    nvh_protect_close_(t->pool, s, sizeof *s);
    t->slab_fill = f;
}

void bt_slab_adopt(struct nvh_btree *t)
{
    nvh_off_t o = t->hdr->cur_slab;
    if (!o || (o & 63) || t->slab) return;
    bt_slab *s = bt_ptr(t, o);
    if (!nvh_contains(t->pool, s, sizeof *s) || s->magic != BT_MAGIC_SLAB ||
        s->tree != bt_off(t, t->hdr))
        return;
    if (s->fill_check != bt_fill_check(o, s->fill) || s->fill < sizeof *s || s->fill > s->size ||
        s->size > BT_SLAB_SIZE_HELD || nvh_usable_size(t->pool, s) < s->size)
        return;                                   /* unknown: leave it (reclaim counts it) */
    uint64_t at = (s->fill + 63) & ~(uint64_t)63;
    if (at + 64 > s->size) return;                /* full */
    /* held as a freshly activated current slab is (protected pools) */
    if (nvh_protect_epoch_(t->pool)) nvh_protect_hold_open_(t->pool, &t->slab_hold, s, s->size);
    t->slab = s;
    t->slab_idx = -1;           /* its live records are counted by reclaim only */
    t->slab_used = at;
    t->slab_fill = s->fill;
}

void bt_slab_close(struct nvh_btree *t)
{
    bt_slab *s = t->slab;
    if (!s || t->slab_fill == t->slab_used || !nvh_contains(t->pool, s, sizeof *s)) return;
    /* every record carved is durable (the tree is synced): the exact bound */
    nvh_protect_open_(t->pool, s, sizeof *s);
    s->fill = t->slab_used;
    s->fill_check = bt_fill_check(bt_off(t, s), s->fill);
    nvh_persist(t->pool, s, sizeof *s);
    nvh_protect_close_(t->pool, s, sizeof *s);
    t->slab_fill = t->slab_used;
}

bt_record *bt_rec_new(struct nvh_btree *t, size_t len)
{
    size_t size = (sizeof(bt_record) + len + 63) & ~(size_t)63;
    if (!t->pool) {
        bt_record *r = aligned_alloc(NVH_ALLOC_ALIGN, size);
        if (!r) nvh_fail(NVH_E_NOMEM, "btree: out of memory");
        return r;
    }
    bt_slab *s;
    int32_t idx;
    uint64_t at;
    if (size > BT_SLAB_BIG) {
        /* a slab of its own (one activation, as an allocation would cost) */
        s = bt_slab_new(t, sizeof(bt_slab) + size, &idx, 0);
        if (!s) return NULL;
        at = sizeof(bt_slab);
    } else {
        if (!t->slab || t->slab_used + size > t->slab->size) {
            /* (bt_slab_new moves the hold to the new slab before the old
             * one can be freed below). Protected: larger slabs, fewer
             * protection changes (btree.h, BT_SLAB_SIZE_HELD). */
            uint64_t ssize = nvh_protect_epoch_(t->pool) ? BT_SLAB_SIZE_HELD : BT_SLAB_SIZE;
            s = bt_slab_new(t, ssize, &idx, 1);
            if (!s) return NULL;
            int32_t old = t->slab_idx;
            t->slab = s;
            t->slab_idx = idx;
            t->slab_used = sizeof(bt_slab);
            /* (bt_slab_new set slab_fill) */
            /* the previous current slab may already be empty */
            if (old >= 0 && t->si[old].off && t->si[old].live == 0) {
                int rc = bt_slab_free(t, old);
                if (rc != NVH_OK) return NULL;
            }
        }
        s = t->slab;
        idx = t->slab_idx;
        at = t->slab_used;
        t->slab_used += size;
        if (t->slab_used > t->slab_fill) bt_slab_raise_fill(t);
    }
    if (idx >= 0) t->si[idx].live++;   /* (an adopted slab is not counted) */
    bt_record *r = (bt_record *)((char *)s + at);
    /* A record of the current slab needs no window of its own while the
     * slab is held (protected pool): every store to a record happens now,
     * in bt_new_record, under the hold (later writes go to leaf slots), and
     * its flushes need no write access. That takes two of an insert's four
     * window calls off the protected path. Any other record gets a window,
     * closed once it is durable (t->rec_win says which). */
    t->rec_win = !(s == t->slab && t->slab_hold.p == (const void *)s && t->slab_hold.epoch &&
                   t->slab_hold.epoch == nvh_protect_epoch_(t->pool));
    if (t->rec_win) nvh_protect_open_(t->pool, r, size);
    r->slab = bt_off(t, s);
    return r;
}

int bt_rec_release(struct nvh_btree *t, bt_record *r)
{
    if (!t->pool) { free(r); return NVH_OK; }
    int32_t i = si_find(t, r->slab);
    if (i < 0) return NVH_OK;        /* an earlier session's slab: not counted yet */
    if (t->si[i].live) t->si[i].live--;
    if (t->si[i].live == 0 && i != t->slab_idx) return bt_slab_free(t, i);
    return NVH_OK;
}

/* ==========================================================================
 * Recount (nvh_btree_reclaim) and checks
 * ========================================================================== */
int bt_slab_recount_begin(struct nvh_btree *t)
{
    nvh_off_t cur = t->slab ? bt_off(t, t->slab) : 0;
    si_reset(t);
    int32_t tail = -1;
    uint64_t hops = 0, max = nvh_pool_size(t->pool) / BT_SLAB_BIG + 1;
    for (nvh_off_t o = t->hdr->slabs; o; o = ((bt_slab *)bt_ptr(t, o))->next) {
        bt_slab *s = bt_ptr(t, o);
        if (++hops > max || !nvh_contains(t->pool, s, sizeof *s) || s->magic != BT_MAGIC_SLAB)
            return nvh_fail(NVH_E_CORRUPT, "btree: bad slab list");
        int32_t i = si_add(t, o, 0, &tail);
        if (i < 0) return nvh_errcode();
        if (o == cur) t->slab_idx = i;
    }
    if (cur && t->slab_idx < 0) {                 /* cannot happen; be safe */
        bt_slab_unhold(t);
        t->slab = NULL;
    }
    return NVH_OK;
}

void bt_slab_count(struct nvh_btree *t, const bt_record *r)
{
    int32_t i = si_find(t, r->slab);
    if (i >= 0) t->si[i].live++;
}

int bt_slab_free_empty(struct nvh_btree *t)
{
    for (int32_t i = t->si_head, next; i >= 0; i = next) {
        next = t->si[i].next;
        if (t->si[i].live == 0 && i != t->slab_idx) {
            int rc = bt_slab_free(t, i);
            if (rc != NVH_OK) return rc;
        }
    }
    return NVH_OK;
}

int bt_slab_check_record(struct nvh_btree *t, const bt_record *r)
{
    if (!t->pool) return 1;
    bt_slab *s = bt_ptr(t, r->slab);
    if (!s || !nvh_contains(t->pool, s, sizeof *s) || s->magic != BT_MAGIC_SLAB) return 0;
    if (nvh_usable_size(t->pool, s) < s->size) return 0;
    uintptr_t a = (uintptr_t)r, b = (uintptr_t)s;
    return a >= b + sizeof *s && a + sizeof *r + r->len <= b + s->size;
}
