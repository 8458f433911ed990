/* apply.c — changing page protection: reconcile pages with their window
 * counts, drain the async queue (sort, coalesce, cancel), and the latency
 * histogram the service records into.
 *
 * Everything here but pr_mprotect and pr_hist_add runs under apply_lock.
 * Reconciling instead of replaying requests is what makes cancellation and
 * coalescing free: a page whose unprotect and protect were both queued has
 * count 0 and is still read-only when the pass looks at it, so it is skipped;
 * adjacent pages that need the same change become one mprotect call.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <stdlib.h>
#include <sys/mman.h>

/* --------------------------------------------------------------------------
 * mprotect, counted (async-signal-safe: the SIGSEGV handler uses it too)
 * -------------------------------------------------------------------------- */
int pr_mprotect(struct nvh_protect *pr, uint64_t first, uint64_t n, bool writable)
{
    int rc = mprotect(pr_page_addr(pr, first), (size_t)(n << PR_PAGE_SHIFT),
                      writable ? PROT_READ | PROT_WRITE : PROT_READ);
    pr_stat(pr, ST_MPROTECTS, 1);
    pr_stat(pr, ST_PAGES_CHANGED, n);
    return rc;
}

/* --------------------------------------------------------------------------
 * Reconcile
 * -------------------------------------------------------------------------- */
/* One pass over [first, end): every page whose applied state differs from its
 * count gets changed, adjacent pages with the same target in one call. The
 * state store comes after the mprotect and before the next pass's count
 * loads, which is the applier's half of the "count RMW, then load state"
 * pair: a producer that closed the last window while we made the page
 * writable either sees the new state (and queues the page) or we see its
 * count in the next pass. Returns the pages changed; *same counts the pages
 * that needed nothing. */
static uint64_t reconcile_pass(struct nvh_protect *pr, uint64_t first, uint64_t end,
                               uint64_t *same, bool force)
{
    uint64_t changed = 0;
    uint64_t p = first;
    while (p < end) {
        bool want = pr_page_wanted(pr, p);
        if (!force && want == pr_bit_test(pr->state, p)) {
            if (same) (*same)++;
            p++;
            continue;
        }
        uint64_t q = p + 1;
        while (q < end && pr_page_wanted(pr, q) == want &&
               (force || pr_bit_test(pr->state, q) != want))
            q++;
        pr_mprotect(pr, p, q - p, want);
        uint64_t now = want ? 0 : pr_now_ns();
        for (uint64_t i = p; i < q; i++) {
            if (want) {
                pr_bit_set(pr->state, i);
                continue;
            }
            pr_bit_clear(pr->state, i);
            /* protect latency: from the call that closed the last window */
            uint64_t t = atomic_exchange_explicit(&pr->ptime[i], 0, memory_order_relaxed);
            if (t) pr_hist_add(&pr->lat[PR_KIND_PROTECT], now > t ? now - t : 0);
        }
        changed += q - p;
        p = q;
    }
    return changed;
}

/* Repeat passes until one changes nothing (that pass is the re-check of the
 * counts) and no handler made a page writable while a pass ran.
 *
 * Why the second condition: the invariant producers rely on is "state bit 0
 * => the page is really read-only" (a protect that finds the bit 0 queues
 * nothing). The handler makes pages writable without the lock; if its
 * mprotect lands between our mprotect(read-only) and our clearing of the
 * bit, the page is writable with its bit 0. The handler bumps fault_seq
 * between its mprotect and its bit store, so any such interleaving changes
 * fault_seq during our pass; we then redo the range by force (mprotect every
 * run to what the counts say, ignoring the bits). */
static void reconcile(struct nvh_protect *pr, uint64_t first, uint64_t end, bool force)
{
    for (;;) {
        uint64_t seq = atomic_load(&pr->fault_seq);
        uint64_t changed = reconcile_pass(pr, first, end, NULL, force);
        force = atomic_load(&pr->fault_seq) != seq && changed != 0;
        if (!changed && !force) return;
        pr_stat(pr, ST_RECHECKS, 1);
    }
}

void pr_reconcile_range(struct nvh_protect *pr, uint64_t first, uint64_t n)
{
    uint64_t end = first + n, mapped = pr_mapped_pages(pr);
    if (end > mapped) end = mapped;
    if (first >= end) return;
    reconcile(pr, first, end, false);
}

/* --------------------------------------------------------------------------
 * Drain the queue
 * -------------------------------------------------------------------------- */
static int by_first_page(const void *a, const void *b)
{
    const pr_request *x = a, *y = b;
    return x->first_page < y->first_page ? -1 : x->first_page > y->first_page;
}

/* Clear the pending bits of [first, end) BEFORE reading the counts there: a
 * producer whose count change comes after our read then finds the bit clear
 * and queues the page again (the "clear pending, then load count" half). */
static void clear_pending(struct nvh_protect *pr, uint64_t first, uint64_t end)
{
    for (uint64_t p = first; p < end; p++) pr_bit_clear(pr->pending, p);
}

/* Unprotect latency: queue entry to the end of the pass that handled it
 * (the fault path may have applied it earlier). Protect latency is recorded
 * per page as pages are made read-only (reconcile_pass): a page's protect
 * request is often not a queue entry of its own, because the entry of its
 * unprotect was still queued. */
static void record_latency(struct nvh_protect *pr, const pr_request *r, size_t n, uint64_t now)
{
    for (size_t i = 0; i < n; i++) {
        if (r[i].t_ns == 0 || r[i].kind != PR_KIND_UNPROTECT) continue;
        pr_hist_add(&pr->lat[PR_KIND_UNPROTECT], now > r[i].t_ns ? now - r[i].t_ns : 0);
    }
}

size_t pr_drain(struct nvh_protect *pr)
{
    size_t total = 0;
    for (;;) {
        size_t n = pr_queue_pop(&pr->queue, pr->batch, pr->batch_cap);
        if (n == 0) break;
        total += n;
        bool sweep = false;
        for (size_t i = 0; i < n; i++) sweep |= pr->batch[i].kind == PR_KIND_SWEEP;
        qsort(pr->batch, n, sizeof *pr->batch, by_first_page);

        uint64_t mapped = pr_mapped_pages(pr), same = 0;
        /* merge overlapping and adjacent requests into ranges; each range is
         * reconciled in one sweep, so neighbours coalesce into one call */
        size_t i = 0;
        while (i < n) {
            uint64_t first = pr->batch[i].first_page;
            uint64_t end = first + pr->batch[i].npages;
            size_t j = i + 1;
            while (j < n && pr->batch[j].first_page <= end) {
                uint64_t e = pr->batch[j].first_page + pr->batch[j].npages;
                if (e > end) end = e;
                j++;
            }
            if (end > mapped) end = mapped;
            if (first < end) {
                clear_pending(pr, first, end);
                uint64_t seq = atomic_load(&pr->fault_seq);
                if (reconcile_pass(pr, first, end, &same, false) != 0)   /* then re-check */
                    reconcile(pr, first, end, atomic_load(&pr->fault_seq) != seq);
            }
            i = j;
        }
        if (sweep) pr_reconcile_range(pr, 0, mapped);
        pr_stat(pr, ST_CANCELLED, same);
        pr_stat(pr, ST_BATCHES, 1);
        record_latency(pr, pr->batch, n, pr_now_ns());
    }
    return total;
}

/* --------------------------------------------------------------------------
 * Latency histogram: 16 exact buckets for 0..15 ns, then 8 per power of two
 * (each bucket spans 1/8 of its octave: ~9% resolution up to ~70 minutes).
 * -------------------------------------------------------------------------- */
unsigned pr_hist_index(uint64_t ns)
{
    if (ns < 16) return (unsigned)ns;
    unsigned e = 63u - (unsigned)__builtin_clzll(ns);        /* >= 4 */
    unsigned sub = (unsigned)(ns >> (e - 3)) & 7u;
    unsigned idx = 16u + (e - 4u) * 8u + sub;
    return idx < PR_LAT_BUCKETS ? idx : PR_LAT_BUCKETS - 1;
}

uint64_t pr_hist_upper(unsigned idx)
{
    if (idx < 16) return idx;
    unsigned e = (idx - 16u) / 8u + 4u, sub = (idx - 16u) % 8u;
    uint64_t lower = (uint64_t)(8u + sub) << (e - 3);
    return lower + ((uint64_t)1 << (e - 3)) - 1;
}

void pr_hist_add(pr_hist *h, uint64_t ns)
{
    atomic_fetch_add_explicit(&h->bucket[pr_hist_index(ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
    uint64_t max = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (ns > max && !atomic_compare_exchange_weak_explicit(&h->max_ns, &max, ns,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed)) {}
}
