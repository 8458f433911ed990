/* apply.c — changing page protection: reconcile pages with their window
 * counts, drain the async queue (sort, coalesce, cancel), and the latency
 * histogram the service records into.
 *
 * Everything here but pr_mprotect and pr_hist_add runs under apply_lock.
 * The second chance of hot pages (protect.h) lives in drain_range: a page
 * used again since the last pass is carried to the next instead of being
 * protected.
 * Reconciling instead of replaying requests is what makes cancellation and
 * coalescing free: a page whose unprotect and protect were both queued has
 * count 0 and is still read-only when the pass looks at it, so it is skipped;
 * adjacent pages that need the same change become one mprotect call.
 */
#define NVH_PROTECT_INTERNALS_ 1
#include "protect.h"

#include <stdlib.h>
#include <string.h>
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
/* A forced pass also changes the pages a handler made writable since the
 * last forced look (their hfault bit, taken here): the state bit of such a
 * page may be 0 on a writable page (reconcile, below). */
static inline bool redo_page(struct nvh_protect *pr, uint64_t p, bool want, bool force)
{
    if (pr_bit_test(pr->state, p) != want) return true;
    if (!force || !pr_bit_test(pr->hfault, p)) return false;
    pr_bit_clear(pr->hfault, p);
    return true;
}

/* Tests only (protect.h, widen_races): let the other threads run for a
 * moment between an mprotect(read-only) and the state-bit stores. */
static void widen_race_pause(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

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
        if (!redo_page(pr, p, want, force)) {
            if (same) (*same)++;
            p++;
            continue;
        }
        uint64_t q = p + 1;
        while (q < end && pr_page_wanted(pr, q) == want && redo_page(pr, q, want, force))
            q++;
        pr_mprotect(pr, p, q - p, want);
        if (__builtin_expect(pr->widen_races, 0) && !want) widen_race_pause();
        uint64_t now = want ? 0 : pr_ticks();
        for (uint64_t i = p; i < q; i++) {
            if (want) {
                pr_bit_set(pr->state, i);
                continue;
            }
            pr_bit_clear(pr->state, i);
            /* protect latency: from the call that closed the last window */
            uint64_t t = atomic_exchange_explicit(&pr->ptime[i], 0, memory_order_relaxed);
            if (t) pr_hist_add(&pr->lat[PR_KIND_PROTECT], now > t ? pr_ticks_to_ns(now - t) : 0);
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
 * fault_seq during our pass; we then redo by force (mprotect to what the
 * counts say, ignoring the bits) the pages a handler made writable: it sets
 * their hfault bit after its mprotect and before the bump, so a page of
 * such an interleaving has its bit set after we last took it (our take
 * precedes our mprotect, which precedes the handler's) and is redone by the
 * next forced pass, which the bump makes happen. Only those pages, not the
 * whole range: when faults are frequent (4 KiB records, long intervals)
 * nearly every pass is forced, and redoing thousands of pages each time
 * changes ten times the pages per insert (docs/PROTECT.md). */
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

/* Unprotect latency: queue entry to the end of the pass that handled it
 * (the fault path may have applied it earlier). Protect latency is recorded
 * per page as pages are made read-only (reconcile_pass): a page's protect
 * request is often not a queue entry of its own, because the entry of its
 * unprotect was still queued. */
static void record_latency(struct nvh_protect *pr, const pr_request *r, size_t n, uint64_t now)
{
    for (size_t i = 0; i < n; i++) {
        if (r[i].t_ns == 0 || r[i].kind != PR_KIND_UNPROTECT) continue;
        pr_hist_add(&pr->lat[PR_KIND_UNPROTECT],
                    now > r[i].t_ns ? pr_ticks_to_ns(now - r[i].t_ns) : 0);
    }
}

/* --------------------------------------------------------------------------
 * Second chance (protect.h): the carry list
 * -------------------------------------------------------------------------- */
/* Make room for `more` carried runs, and keep the batch big enough to take
 * the whole carry list plus a full queue. false (out of memory): the caller
 * protects the page now instead, which is always correct. */
static bool carry_reserve(struct nvh_protect *pr, size_t more)
{
    size_t want = pr->carry_n + more;
    if (want <= pr->carry_cap) return true;
    size_t cap = pr->carry_cap ? pr->carry_cap * 2 : 1024;
    while (cap < want) cap *= 2;
    /* the batch first: pr_drain copies the whole carry list into it */
    size_t bcap = cap + (size_t)pr->queue.mask + 1;
    if (bcap > pr->batch_cap) {
        pr_request *b = realloc(pr->batch, bcap * sizeof *b);
        if (!b) return false;
        pr->batch = b;
        pr->batch_cap = bcap;
    }
    pr_request *c = realloc(pr->carry, cap * sizeof *c);
    if (!c) return false;
    pr->carry = c;
    pr->carry_cap = cap;
    return true;
}

static void carry_page(struct nvh_protect *pr, uint64_t page)
{
    pr_request *last = pr->carry_n ? &pr->carry[pr->carry_n - 1] : NULL;
    if (last && page < last->first_page) pr->carry_sorted = false;   /* a later batch */
    if (last && last->first_page + last->npages == page && last->npages < (1u << 30)) {
        last->npages++;
        return;
    }
    pr->carry[pr->carry_n++] = (pr_request){.first_page = page, .npages = 1,
                                            .kind = PR_KIND_PROTECT, .t_ns = 0};
}

/* Reconcile [first, end) of a drained range: pages that are unused now
 * (count 0) but writable and used since the last look (ref) are carried
 * instead of protected; the rest are reconciled as usual, in maximal
 * sub-ranges so neighbours still coalesce. Pending bits are cleared before
 * the counts are read (the "clear pending, then load count" half) except
 * on carried pages, which stay pending: their producers need not queue them. */
static void drain_range(struct nvh_protect *pr, uint64_t first, uint64_t end, bool flush,
                        uint64_t *same)
{
    uint64_t sub = first;
    for (uint64_t p = first; p <= end; p++) {
        bool carry = false;
        if (p < end && !flush && pr_bit_test(pr->ref, p) && !pr_page_wanted(pr, p) &&
            pr_bit_test(pr->state, p) && carry_reserve(pr, 1)) {
            pr_bit_clear(pr->ref, p);
            carry = true;
        }
        if (!carry && p < end) continue;
        if (sub < p) {
            for (uint64_t q = sub; q < p; q++) pr_bit_clear(pr->pending, q);
            uint64_t seq = atomic_load(&pr->fault_seq);
            if (reconcile_pass(pr, sub, p, same, false) != 0)    /* then re-check */
                reconcile(pr, sub, p, atomic_load(&pr->fault_seq) != seq);
        }
        if (carry) {
            carry_page(pr, p);
            pr_stat(pr, ST_DEFERRED, 1);
        }
        sub = p + 1;
    }
}

/* --------------------------------------------------------------------------
 * The drain
 * -------------------------------------------------------------------------- */
/* The batch is two sorted runs: [0, carried) the carry list (built in page
 * order, re-sorted only if a later batch of the same drain appended lower
 * pages), [carried, n) what was popped, sorted here. Walking them as a merge
 * keeps a pass O(new log new + carried): with a short interval and many hot
 * pages, the carried ones are most of every batch. */
static inline const pr_request *merge_peek(const pr_request *batch, size_t a, size_t a_end,
                                           size_t b, size_t b_end)
{
    if (a < a_end && (b >= b_end || batch[a].first_page <= batch[b].first_page))
        return &batch[a];
    return b < b_end ? &batch[b] : NULL;
}

size_t pr_drain(struct nvh_protect *pr, bool flush)
{
    size_t total = 0;
    /* the pages carried by the previous pass are looked at once, in the
     * first batch; what this pass carries goes to the next one */
    size_t carried = pr->carry_n;
    if (carried) memcpy(pr->batch, pr->carry, carried * sizeof *pr->batch);
    if (carried && !pr->carry_sorted) qsort(pr->batch, carried, sizeof *pr->batch, by_first_page);
    pr->carry_n = 0;
    pr->carry_sorted = true;
    for (;;) {
        size_t n = carried;
        n += pr_queue_pop(&pr->queue, pr->batch + n, pr->batch_cap - n);
        if (n == 0) break;
        total += n;
        bool sweep = false;
        for (size_t i = carried; i < n; i++) sweep |= pr->batch[i].kind == PR_KIND_SWEEP;
        qsort(pr->batch + carried, n - carried, sizeof *pr->batch, by_first_page);

        uint64_t mapped = pr_mapped_pages(pr), same = 0;
        /* merge overlapping and adjacent requests into ranges; each range is
         * reconciled in one sweep, so neighbours coalesce into one call */
        size_t a = 0, b = carried;
        const pr_request *r;
        while ((r = merge_peek(pr->batch, a, carried, b, n)) != NULL) {
            uint64_t first = r->first_page, end = first + r->npages;
            if (a < carried && r == &pr->batch[a]) a++; else b++;
            while ((r = merge_peek(pr->batch, a, carried, b, n)) != NULL && r->first_page <= end) {
                uint64_t e = r->first_page + r->npages;
                if (e > end) end = e;
                if (a < carried && r == &pr->batch[a]) a++; else b++;
            }
            if (end > mapped) end = mapped;
            if (first < end) drain_range(pr, first, end, flush, &same);
        }
        if (sweep) pr_reconcile_range(pr, 0, mapped);
        pr_stat(pr, ST_CANCELLED, same);
        pr_stat(pr, ST_BATCHES, 1);
        record_latency(pr, pr->batch + carried, n - carried, pr_ticks());
        carried = 0;
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
