/* txalloc.c — allocation and free inside a transaction.
 *
 * nvh_tx_alloc reserves (DRAM only), zeroes, and logs an ALLOC intent. At
 * commit the intents are made durable (a fence if needed) and the objects are
 * activated without links (the transaction's own logged stores link them),
 * all before the commit point; recovery of an uncommitted transaction frees
 * every intent that got activated. nvh_tx_free logs a FREE intent, durable
 * before the commit record, applied only after the commit point, with the allocator clearing the intent's link
 * word in the same failure-atomic step, so a free is applied exactly once
 * however often recovery runs. Abort cancels reservations, drops frees. */
#include "tx.h"

#include <stdlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int push_alloc(nvh_tx *tx, char *p, uint64_t size)
{
    if (tx->nallocs == tx->allocs_cap) {
        size_t cap = tx->allocs_cap ? tx->allocs_cap * 2 : 16;
        nvh_talloc *g = realloc(tx->allocs, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory");
        tx->allocs = g;
        tx->allocs_cap = cap;
    }
    tx->allocs[tx->nallocs++] = (nvh_talloc){p, size, false};
    return NVH_OK;
}

static int push_free(nvh_tx *tx, nvh_recref ref)
{
    if (tx->nfrees == tx->frees_cap) {
        size_t cap = tx->frees_cap ? tx->frees_cap * 2 : 16;
        nvh_recref *g = realloc(tx->frees, cap * sizeof *g);
        if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory");
        tx->frees = g;
        tx->frees_cap = cap;
    }
    tx->frees[tx->nfrees++] = ref;
    return NVH_OK;
}

void *nvh_tx_alloc(nvh_pool *pool, size_t size)
{
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) return NULL;
    if (tx->status == NVH_TXS_ABORTED) { nvh_tx_fail_aborted_(tx, "nvh_tx_alloc"); return NULL; }
    char *p = nvh_reserve(pool, size);
    if (!p) {
        nvh_err_saved err;
        nvh_err_save(&err);
        nvh_tx_rollback_(tx);
        nvh_err_restore(&err);
        nvh_fail_context(err.code, "nvh_tx_alloc: transaction aborted");
        return NULL;
    }
    uint64_t usable = nvh_usable_size(pool, p);
    if (usable < size) usable = size;
    /* protected pools: the new object is writable (by us and the caller)
     * until the transaction ends */
    int rc = nvh_txlog_win_open(tx->lg, tx->lane, p, usable);
    if (rc != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, p);
        nvh_tx_rollback_(tx);
        nvh_fail(code, "nvh_tx_alloc: cannot open a write window (transaction aborted)");
        return NULL;
    }
    /* zeroed: a crash-time destructor or a later reader never sees garbage */
    memset(p, 0, usable);
    rc = nvh_txlog_intent(tx->lg, tx->lane, NVH_LR_ALLOC, nvh_off(pool, p), usable, NULL);
    if (rc == NVH_OK) rc = push_alloc(tx, p, usable);
    if (rc != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, p);
        nvh_tx_rollback_(tx);
        nvh_fail(code, "nvh_tx_alloc: cannot log the allocation (transaction aborted)");
        return NULL;
    }
    return p;
}

int nvh_tx_free(nvh_pool *pool, void *ptr)
{
    nvh_tx *tx = nvh_tx_cur_(pool, true);
    if (!tx) return nvh_errcode();
    if (tx->status == NVH_TXS_ABORTED) return nvh_tx_fail_aborted_(tx, "nvh_tx_free");
    if (!ptr) return NVH_OK;
    for (size_t i = 0; i < tx->nallocs; i++)
        if (tx->allocs[i].ptr == (char *)ptr) {
            if (tx->allocs[i].cancelled)
                return nvh_tx_failed_(tx, nvh_fail(NVH_E_DOUBLEFREE, "nvh_tx_free: %p freed "
                                                   "twice", ptr));
            tx->allocs[i].cancelled = true;
            return NVH_OK;
        }
    uint64_t off = nvh_off(pool, ptr);
    for (size_t i = 0; i < tx->nfrees; i++)
        if (tx->frees[i].sh.off == off)
            return nvh_tx_failed_(tx, nvh_fail(NVH_E_DOUBLEFREE, "nvh_tx_free: %p freed twice",
                                               ptr));
    if (!nvh_contains(pool, ptr, 1))
        return nvh_tx_failed_(tx, nvh_fail(NVH_E_BADPTR, "nvh_tx_free: %p is outside the pool",
                                           ptr));
    size_t usable = nvh_usable_size(pool, ptr);
    if (!usable)
        return nvh_tx_failed_(tx, nvh_fail(NVH_E_BADPTR, "nvh_tx_free: %p is not an allocated "
                                           "object", ptr));
    /* the name would outlive the object (nvh_free refuses it too) */
    if (nvh_named_obj_(pool, off))
        return nvh_fail(NVH_E_INVAL, "nvh_tx_free: %p is a named object; use nvh_free_named "
                        "outside the transaction", ptr);
    nvh_recref ref;
    int rc = nvh_txlog_intent(tx->lg, tx->lane, NVH_LR_FREE, off, usable, &ref);
    if (rc == NVH_OK) rc = push_free(tx, ref);
    if (rc != NVH_OK) {
        int code = nvh_errcode();
        nvh_tx_rollback_(tx);
        return nvh_fail(code, "nvh_tx_free: cannot log the free (transaction aborted)");
    }
    return NVH_OK;
}

int nvh_tx_alloc_commit_(nvh_tx *tx)
{
    /* Every intent must be durable before the commit record is: a FREE
     * intent's link word (the "not yet applied" mark, outside the record's
     * checksum because applying the free clears it) would otherwise share
     * the commit fence with the commit record, and a crash image holding
     * the commit but a stale link redoes the transaction's stores (the
     * reference to the object cleared) without the free: a live object
     * nobody references. ALLOC intents also precede their activations. */
    if ((tx->nallocs || tx->nfrees) && tx->lane->unfenced) nvh_txlog_fence(tx->lg, tx->lane, 0);
    if (!tx->nallocs) return NVH_OK;
    nvh_pool *pool = tx->pool;
    for (size_t i = 0; i < tx->nallocs; i++) {
        nvh_talloc *a = &tx->allocs[i];
        if (a->cancelled) continue;
        /* contents become durable with the commit fence at the latest; the
         * flush here lets the activation's fence carry them */
        nvh_flush(pool, a->ptr, a->size);
        int rc = nvh_activate(pool, a->ptr, NULL, 0);
        if (rc != NVH_OK) return rc;
        a->size |= 1ull << 63;   /* activated: abort must free, not cancel */
    }
    return NVH_OK;
}

void nvh_tx_alloc_finish_(nvh_tx *tx)
{
    nvh_pool *pool = tx->pool;
    for (size_t i = 0; i < tx->nallocs; i++)
        if (tx->allocs[i].cancelled) nvh_cancel(pool, tx->allocs[i].ptr);
    for (size_t i = 0; i < tx->nfrees; i++) {
        struct nvh_txrec *r = tx->frees[i].rec;
        nvh_link l = {(nvh_off_t *)&r->link, 0};
        int rc = nvh_free(pool, nvh_ptr(pool, tx->frees[i].sh.off), &l, 1);
        NVH_ASSERT(rc == NVH_OK);
        (void)rc;
    }
    tx->nallocs = tx->nfrees = 0;
}

void nvh_tx_alloc_abort_(nvh_tx *tx)
{
    nvh_pool *pool = tx->pool;
    for (size_t i = 0; i < tx->nallocs; i++) {
        nvh_talloc *a = &tx->allocs[i];
        if (a->size >> 63) (void)nvh_free(pool, a->ptr, NULL, 0);  /* activated at commit */
        else (void)nvh_cancel(pool, a->ptr);
    }
    tx->nallocs = tx->nfrees = 0;
}
