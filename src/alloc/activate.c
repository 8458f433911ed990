/* activate.c — nvh_activate: make a reservation an object, failure-atomic
 * with the links that point at it (docs/ALLOC.md §4). Under the owner
 * arena's lock: validate the reservation (a slot of a run, or a large or
 * huge region), plan how it splits the persistent free region it was
 * carved from, write the redo record (one line for up to two links) and
 * fence it (redo.c) — the activation is durable — then apply it: header or
 * bitmap bit, tiling headers, object-table entry for named objects, links.
 * Header and bitmap lines are written back at the ring's retire. */
#include "alloc.h"

#include <string.h>

/* Fill prefix/remainder so that the persistent tiling stays a tiling: the
 * free region containing the new one is split around it. */
static int plan_split(nvh_heap *h, uint64_t b, uint64_t n, bool huge, struct nvh_rec *rec)
{
    uint64_t plen = 0, qlen = 0;
    uint64_t p = nvh_pview_containing(h, b, &plen);
    uint64_t q = nvh_pview_containing(h, b + n - 1, &qlen);
    uint64_t prefix = p == UINT64_MAX ? 0 : b - p;
    uint64_t rem = q == UINT64_MAX ? 0 : q + qlen - (b + n);
    if (q != UINT64_MAX && q + qlen < b + n) rem = 0;
    if (huge) {
        if (prefix % h->bpc || prefix / h->bpc > UINT16_MAX)
            return nvh_fail(NVH_E_NOTSUP, "huge region split too far from its free region");
        prefix /= h->bpc;
    } else if (prefix > UINT16_MAX) {
        return nvh_fail(NVH_E_NOTSUP, "region split too far from its free region");
    }
    if (rem > UINT32_MAX) return nvh_fail(NVH_E_NOTSUP, "remainder too large");
    rec->prefix = (uint16_t)prefix;
    rec->remainder = (uint32_t)rem;
    return NVH_OK;
}

/* The persistent tiling (pview) after the activation of [b, b+n): the
 * prefix and remainder of the split free region, the new region. */
static void pview_after(nvh_heap *h, const struct nvh_rec *rec, uint64_t b, uint64_t n, bool huge)
{
    uint64_t pre = huge ? (uint64_t)rec->prefix * h->bpc : rec->prefix;
    if (pre) nvh_pview_set(h, b - pre, pre);
    if (huge) {
        for (uint64_t x = b + h->bpc; x < b + n; x += h->bpc) nvh_pview_set(h, x, 0);
    } else {
        for (uint64_t x = b + 1; x < b + n; x++) nvh_pview_set(h, x, 0);
    }
    nvh_pview_set(h, b, n);
    if (rec->remainder) nvh_pview_set(h, b + n, rec->remainder);
}

/* The activation itself; inlined into nvh_activate (the public path) and
 * into nvh_activate_off_ (named activations), as free.c does with frees. */
static inline __attribute__((always_inline)) int
activate_off(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links, unsigned nlinks,
             int64_t named_slot)
{
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK, in = rel % NVH_BLOCK;
    uint64_t c = nvh_chunk_of_block(h, b);
    int own = nvh_owner_get(h, c, memory_order_acquire);
    if (own < 0) return nvh_fail(NVH_E_BADPTR, "offset %llu is not a reservation",
                                 (unsigned long long)off);
    nvh_arena *a = &h->arenas[own];
    struct nvh_rec rec;
    memset(&rec, 0, sizeof rec);
    rec.obj = off;
    rec.kind_links = named_slot >= 0 ? NVH_REC_ACT_NAMED : NVH_REC_ACT;
    if (named_slot >= 0) rec.link[0].addr = (uint64_t)named_slot;

    nvh_alock_lock(&a->lock);
    nvh_redo_preflush(h, a);
    int rc = NVH_OK;
    bool heap_locked = false;
    nvh_run *run = nvh_run_lookup(h, b);
    nvh_resv *rv = NULL;
    unsigned slot = 0;
    bool slot_ok = run && nvh_run_slot_at(h, run, off, &slot);
    if (slot_ok && ((run->resv | run->tcached) & (1ull << slot)) &&
        !nvh_tcache_holds(h, off, run->cls)) {
        /* from here on b is the run's first block (where its header is) */
        uint64_t delta = b - run->block;
        b = run->block;
        if (run->persisted && !nvh_run_hdr_valid(h, run, b)) {
            nvh_corrupt_report(h, nvh_block_off(h, b), "run header corrupt at activation");
            run->quarantined = true;
            run->resv &= ~(1ull << slot);
            run->tcached &= ~(1ull << slot);
            rc = nvh_fail(NVH_E_CORRUPT, "run header at offset %llu fails its checksum; "
                          "the run is quarantined", (unsigned long long)nvh_block_off(h, b));
            goto out;
        }
        rec.cls_flags = (uint8_t)((run->cls & 0x1F) | (NVH_RK_RUN << NVH_RECF_KIND_SHIFT));
        rec.blocks = run->recword | (uint32_t)delta << 8;
        if (!run->persisted) {
            rec.cls_flags |= NVH_RECF_NEWRUN;
            rc = plan_split(h, b, run->blocks, false, &rec);
            if (rc != NVH_OK) goto out;
        }
    } else if (in == 0 && (rv = nvh_resv_find(a, b))) {
        bool huge = rv->kind == NVH_RK_HUGE;
        /* huge regions split free regions that span chunks other arenas may
         * be splitting too: plan and apply under the heap lock */
        if (huge) { pthread_mutex_lock(&h->lock); heap_locked = true; }
        rec.cls_flags = (uint8_t)(rv->kind << NVH_RECF_KIND_SHIFT);
        rec.blocks = (uint32_t)rv->blocks;
        rc = plan_split(h, b, rv->blocks, huge, &rec);
        if (rc != NVH_OK) goto out;
    } else {
        bool active = run ? (slot_ok && (run->pbits & (1ull << slot)))
                          : (nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state == NVH_RS_USED);
        rc = nvh_fail(active ? NVH_E_INVAL : NVH_E_BADPTR, "offset %llu is %s",
                      (unsigned long long)off, active ? "already active" : "not a reservation");
        goto out;
    }
    struct nvh_link_entry named_links[6];
    if (named_slot >= 0) {
        /* the record's second line carries the name (see redo.c) */
        memset(named_links, 0, sizeof named_links);
        named_links[0].addr = (uint64_t)named_slot;
        memcpy(&named_links[2], nvh_named_pending_name(h, off), 56);
        links = named_links;
        nlinks = 6;
    }
    nvh_redo_append1(h, a, &rec, links, nlinks);
    if (run && !rv && !(rec.cls_flags & NVH_RECF_NEWRUN) && named_slot < 0) {
        /* the common case: a slot of a run already on the media */
        nvh_rec_apply_slot(h, a, &rec, nvh_rhdr_at(h, b), run, slot, links, nlinks, true);
    } else {
        nvh_rec_apply_state(h, &rec, links, a, false);
        nvh_rec_apply_links(h, &rec, links, a, false);
    }
    if (run && !rv) {
        if (!run->persisted) pview_after(h, &rec, b, run->blocks, false);
        run->resv &= ~(1ull << slot);
        run->tcached &= ~(1ull << slot);
        run->pbits |= 1ull << slot;
        run->persisted = true;
    } else {
        pview_after(h, &rec, b, rv->blocks, rv->kind == NVH_RK_HUGE);
        nvh_resv_remove(a, rv);
    }
out:
    if (heap_locked) pthread_mutex_unlock(&h->lock);
    a->links_clwb = false;      /* a failed activation issued no fence */
    nvh_alock_unlock(&a->lock);
    return rc;
}

int nvh_activate_off_(nvh_heap *h, uint64_t off, const struct nvh_link_entry *links,
                      unsigned nlinks, int64_t named_slot)
{
    return activate_off(h, off, links, nlinks, named_slot);
}

int nvh_activate(nvh_pool *pool, void *ptr, nvh_off_t *const links[], unsigned nlinks)
{
    uint64_t off = 0;
    struct nvh_link_entry e[NVH_LINKS_MAX_];
    nvh_heap *h = nvh_op_enter(pool, false, ptr, links, nlinks, &off, e);
    if (!h) return nvh_errcode();
    return activate_off(h, off, e, nlinks, -1);
}
