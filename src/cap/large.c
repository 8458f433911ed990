/* large.c — a thread heap's kept large blocks (over NVH_CAP_CLASS_MAX):
 * the freed blocks it keeps for its next large requests, without the lock.
 *
 * A thread's free of a large block keeps it whole, mapped and resident, in
 * its heap's lists of kept blocks per large class (the heap becomes its
 * owner if another heap took it); the heap's next request of that class or
 * of the next NVH_CAP_LCACHE_REACH - 1 takes it back. Neither takes the
 * instance lock: with blocks of mixed sizes a thread of a program that
 * keeps a set of large buffers and replaces them (the large loop of
 * bench/run cap) finds a kept block for nearly every request, where a
 * handful of kept blocks of about the same size (the cache this replaces)
 * sent most of its calls to the span allocator and two threads queued on
 * its lock. The freeing thread keeps the block rather than handing it back
 * to the heap that took it: threads that trade large blocks both ways then
 * reuse what they receive, and freed memory never waits in the list of an
 * owner that is not running while the freeing thread, short of blocks,
 * carves new spans and faults their pages in (docs/CAP.md).
 *
 * File space: a heap keeps at most the larger of NVH_CAP_LCACHE_BYTES and
 * its recent peak of large bytes in use (NVH_CAP_LKEEP_SHARE); beyond that the
 * oldest go to the instance (one lock for several), which keeps them in its
 * own lists until its allowance punches them. What heaps keep is published
 * in NVH_CAP_LKEEP_STEP steps (cap->lkeep_bytes), and the instance's
 * allowance counts it as free, not in use (span.c decay_), so the file stays
 * within 1.5 times the blocks in use. At each decay (every
 * NVH_CAP_DECAY_MS, heap.c) a heap gives back what it kept unused for the
 * whole window, and everything after two idle windows, at trim and at exit. */
#include "cap.h"

static inline size_t sbytes(const struct cap_span *s)
{
    return (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
}

/* Half the most large bytes the heap had in use over this decay window and
 * the last: a heap that frees a batch and takes it again within that keeps
 * it, as the instance's allowance does (span.c decay_). */
static inline size_t lk_budget(const struct cap_lkeep *k)
{
    size_t p = k->peak > k->peak_prev ? k->peak : k->peak_prev;
    size_t b = (p > k->live ? p : k->live) / NVH_CAP_LKEEP_SHARE;
    return b > NVH_CAP_LCACHE_BYTES ? b : NVH_CAP_LCACHE_BYTES;
}

/* Publish the heap's kept bytes to the instance when they moved by a step
 * (or to zero): the instance reads the sum only under its lock, for the
 * allowance, where a step per heap is precision enough. Returns by how much
 * the heaps' sum went past the room the instance's allowance left them
 * (cap->lkeep_room): the heap then sheds that much (lk_shed), and the
 * instance applies its allowance to what it is given. */
static inline size_t lk_publish(struct cap_heap *h)
{
    struct cap_lkeep *k = &h->lk;
    size_t d = k->bytes > k->pub ? k->bytes - k->pub : k->pub - k->bytes;
    if (d < NVH_CAP_LKEEP_STEP && (k->bytes || !k->pub))
        return 0;
    struct cap_inst *cap = h->cap;
    bool up = k->bytes > k->pub;
    k->pub = k->bytes;
    if (!up) {
        atomic_fetch_sub_explicit(&cap->lkeep_bytes, d, memory_order_relaxed);
        return 0;
    }
    size_t sum = atomic_fetch_add_explicit(&cap->lkeep_bytes, d, memory_order_relaxed) + d;
    size_t room = atomic_load_explicit(&cap->lkeep_room, memory_order_relaxed);
    return sum > room ? sum - room : 0;
}

static void lk_link(struct cap_heap *h, struct cap_span *s)
{
    struct cap_lkeep *k = &h->lk;
    unsigned c = nvh_cap_large_class_(s->blocks);
    s->cached = 1;
    s->prev = NULL;
    s->next = k->cls[c];
    if (s->next)
        s->next->prev = s;
    k->cls[c] = s;
    k->map[c / 64] |= (uint64_t)1 << (c % 64);
    s->dnext = NULL;
    s->dprev = k->young;
    if (k->young)
        k->young->dnext = s;
    else
        k->old = s;
    k->young = s;
    k->bytes += sbytes(s);
}

static void lk_unlink(struct cap_heap *h, struct cap_span *s)
{
    struct cap_lkeep *k = &h->lk;
    unsigned c = nvh_cap_large_class_(s->blocks);
    if (s->prev)
        s->prev->next = s->next;
    else if (!(k->cls[c] = s->next))
        k->map[c / 64] &= ~((uint64_t)1 << (c % 64));
    if (s->next)
        s->next->prev = s->prev;
    if (s->dprev)
        s->dprev->dnext = s->dnext;
    else
        k->old = s->dnext;
    if (s->dnext)
        s->dnext->dprev = s->dprev;
    else
        k->young = s->dprev;
    s->next = s->prev = s->dnext = s->dprev = NULL;
    s->cached = 0;
    k->bytes -= sbytes(s);
    if (k->bytes < k->low)
        k->low = k->bytes;
}

/* The lowest class in [from, to) with a kept block, or `to`. */
static unsigned lk_first(const struct cap_lkeep *k, unsigned from, unsigned to)
{
    for (unsigned w = from / 64; w * 64 < to; w++) {
        uint64_t m = k->map[w];
        if (w == from / 64)
            m &= ~(uint64_t)0 << (from % 64);
        if (m) {
            unsigned c = w * 64 + (unsigned)__builtin_ctzll(m);
            return c < to ? c : to;
        }
    }
    return to;
}

struct cap_span *nvh_cap_lkeep_take_(struct cap_heap *h, uint32_t n, unsigned reach)
{
    struct cap_lkeep *k = &h->lk;
    if (!k->bytes || n <= 16 || n > NVH_CAP_LARGE_ROUND_MAX)
        return NULL;
    unsigned c = nvh_cap_large_class_(n);
    unsigned to = c + reach < NVH_CAP_LCLASSES ? c + reach : NVH_CAP_LCLASSES;
    unsigned f = lk_first(k, c, to);
    if (f == to)
        return NULL;
    struct cap_span *s = k->cls[f];
    lk_unlink(h, s);
    lk_publish(h);
    return s;
}

void nvh_cap_lkeep_took_(struct cap_heap *h, struct cap_span *s)
{
    struct cap_lkeep *k = &h->lk;
    k->live += sbytes(s);
    if (k->live > k->peak)
        k->peak = k->live;
}

/* Give the oldest kept blocks to the instance until `keep` bytes are left. */
static void lk_shed(struct cap_heap *h, size_t keep, bool locked)
{
    struct cap_inst *cap = h->cap;
    if (h->lk.bytes <= keep)
        return;
    /* taken out and published first (under the lock, which the instance's
     * counts are read under): the instance applies its allowance as it is
     * given each one, and must count none twice, nor any as in use */
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    struct cap_span *list = NULL;
    while (h->lk.bytes > keep) {
        struct cap_span *s = h->lk.old;
        lk_unlink(h, s);
        s->next = list;
        list = s;
    }
    lk_publish(h);
    while (list) {
        struct cap_span *s = list;
        list = s->next;
        s->next = NULL;
        s->cached = 1;   /* (until the instance has it: still not in use) */
        nvh_cap_span_cache_(cap, s);
    }
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}

/* The instance's recent peak of the bytes in use is taken where spans come
 * into use under its lock: tell it how far above its present large bytes in
 * use this heap was lately (under the lock). */
static void lk_note_peak(struct cap_heap *h)
{
    struct cap_lkeep *k = &h->lk;
    size_t p = k->peak > k->peak_prev ? k->peak : k->peak_prev;
    if (p > k->live)
        nvh_cap_span_note_peak_(h->cap, p - k->live);
}

/* The heaps' kept blocks went past the room the instance left them: with
 * the room brought up to date (the allowance follows the bytes in use and
 * their recent peak), shed what is still over it, and a quarter more. */
static NVH_CAP_NOINLINE void lk_over(struct cap_heap *h, bool locked)
{
    struct cap_inst *cap = h->cap;
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    lk_note_peak(h);
    nvh_cap_span_decay_(cap);
    size_t sum = atomic_load_explicit(&cap->lkeep_bytes, memory_order_relaxed);
    size_t room = atomic_load_explicit(&cap->lkeep_room, memory_order_relaxed);
    if (sum > room) {
        size_t over = sum - room;
        size_t keep = h->lk.bytes > over ? h->lk.bytes - over : 0;
        lk_shed(h, keep - keep / 4, true);
    }
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}

bool nvh_cap_lkeep_put_(struct cap_heap *h, struct cap_span *s, bool locked)
{
    size_t budget = lk_budget(&h->lk);
    if (s->roomy || s->blocks <= 16 || s->blocks > NVH_CAP_LARGE_ROUND_MAX ||
        nvh_cap_large_round_(s->blocks) != s->blocks || sbytes(s) > budget / 2)
        return false;
    lk_link(h, s);
    /* over the allowance: shed down to three quarters of it, so that a heap
     * at its allowance takes the lock once per several frees, not each */
    if (h->lk.bytes > budget)
        lk_shed(h, budget - budget / 4, locked);
    if (lk_publish(h))
        lk_over(h, locked);
    return true;
}

void nvh_cap_lkeep_release_(struct cap_heap *h, bool all, bool locked)
{
    struct cap_lkeep *k = &h->lk;
    /* what stayed kept through the whole window was not needed in it */
    size_t idle = all ? k->bytes : k->low;
    if (!all && locked)
        lk_note_peak(h);
    lk_shed(h, k->bytes - (idle < k->bytes ? idle : k->bytes), locked);
    k->low = k->bytes;
    k->peak_prev = all ? 0 : k->peak;
    k->peak = k->live;
}

static void lk_live_sub(struct cap_lkeep *k, size_t bytes)
{
    /* (a block grown in place by realloc is larger than what its owner
     * counted: the count is only the allowance's base) */
    k->live = k->live > bytes ? k->live - bytes : 0;
}

void nvh_cap_lkeep_adopt_(struct cap_heap *h, struct cap_span *s)
{
    s->heap = h;
    h->lk.live += sbytes(s);   /* (taken off again by the free) */
}

void nvh_cap_large_free_own_(struct cap_inst *cap, struct cap_heap *h, struct cap_span *s, bool locked)
{
    size_t bytes = sbytes(s);
    bool orphan = !h || atomic_load_explicit(&h->orphan, memory_order_relaxed);
    if (h)
        lk_live_sub(&h->lk, bytes);
    /* a block at the top goes back at once: the top stays free to grow into;
     * so does a block grown by realloc (it coalesces, and the next growing
     * block starts where it did, on pages that are still mapped) */
    bool at_top = s->start + bytes ==
                  cap->base + atomic_load_explicit(&cap->top_hint, memory_order_relaxed);
    /* a grown block: the thread keeps one, the largest, for its next
     * growing buffer (heap.c large_alloc_top); it stays a large span in
     * use, marked cached. The largest, so that a buffer that outgrew the
     * kept one is copied once, not again by every later buffer of that size. */
    if (!orphan && s->roomy && bytes <= NVH_CAP_LCACHE_BYTES) {
        struct cap_span *old = h->rkeep;
        if (!old || old->blocks < s->blocks) {
            s->cached = 1;
            h->rkeep = s;
            if (!old)
                return;
            s = old;   /* the smaller one goes back */
        }
        if (!locked)
            pthread_mutex_lock(&cap->lock);
        nvh_cap_span_free_(cap, s);
        if (!locked)
            pthread_mutex_unlock(&cap->lock);
        return;
    }
    if (!orphan && !at_top && nvh_cap_lkeep_put_(h, s, locked))
        return;
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    if (at_top || s->roomy)
        nvh_cap_span_free_(cap, s);
    else
        nvh_cap_span_cache_(cap, s);
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}
