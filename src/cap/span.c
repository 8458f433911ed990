/* span.c — a capacity instance: its address range, the block map, and the
 * global span allocator (free spans in size bins, coalescing, deferred hole
 * punching), plus fork.
 *
 * The range is reserved once (a sparse file mapped MAP_SHARED, or a region
 * of a pool): addresses never move, so free() routes a pointer with one
 * range check, and the block map (one DRAM word per 4 KiB block) turns an
 * address into its span descriptor. Spans are handed out under one mutex;
 * the per-thread heaps (heap.c) come here only for whole pages and large
 * objects, so the lock is off the fast paths.
 *
 * File space: the file grows as pages are touched (a free-space check guards
 * each step of the used top of the range);
 * freed spans stay "dirty" (their pages still in the file) until the dirty
 * bytes exceed the allowance (decay_(): half the bytes in use, or what the
 * recent peak of the bytes in use left free), then the oldest dirty spans
 * are punched (MADV_REMOVE) until half the allowance is left. The
 * allowance keeps alloc/free churn off the syscall and page-fault path; the
 * bound keeps the file near the live bytes. */
#include "cap.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define META_SLAB ((size_t)1 << 20)

/* ---- DRAM metadata: span descriptors and heaps --------------------------- */
/* Slabs are chained through their first line, so destroy can unmap them. */
struct meta_slab {
    struct meta_slab *next;
    size_t len;
};

static void *meta_alloc(struct cap_inst *cap, size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    if ((size_t)(cap->meta_end - cap->meta_cur) < bytes) {
        size_t len = bytes + 64 > META_SLAB ? bytes + 64 : META_SLAB;
        struct meta_slab *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        m->next = cap->meta_slabs;
        m->len = len;
        cap->meta_slabs = m;
        cap->meta_cur = (char *)m + 64;
        cap->meta_end = (char *)m + len;
    }
    void *p = cap->meta_cur;
    cap->meta_cur += bytes;
    return p;
}

static struct cap_span *desc_new(struct cap_inst *cap)
{
    struct cap_span *s = cap->desc_free;
    if (s)
        cap->desc_free = s->next;
    else if (!(s = meta_alloc(cap, sizeof *s)))
        return NULL;
    memset(s, 0, sizeof *s);
    return s;
}

static void desc_put(struct cap_inst *cap, struct cap_span *s)
{
    s->kind = CAP_SPAN_DEAD;   /* a stale map entry never matches it */
    s->next = cap->desc_free;
    cap->desc_free = s;
}

static inline size_t blk_index(const struct cap_inst *cap, uintptr_t a)
{
    return (a - cap->base) >> NVH_CAP_BLOCK_SHIFT;
}
static inline void map_set(struct cap_inst *cap, size_t i, struct cap_span *s)
{
    atomic_store_explicit(&cap->map[i], s, memory_order_relaxed);
}
static inline uintptr_t span_end(const struct cap_span *s)
{
    return s->start + ((uintptr_t)s->blocks << NVH_CAP_BLOCK_SHIFT);
}

/* Map entries: every block of a page (any interior address finds it), the
 * first and last block of a free or large span (neighbours find it when they
 * coalesce; free() finds a large object by its first block). */
static void map_span(struct cap_inst *cap, struct cap_span *s)
{
    size_t i = blk_index(cap, s->start);
    if (s->kind == CAP_SPAN_PAGE) {
        for (uint32_t k = 0; k < s->blocks; k++)
            map_set(cap, i + k, s);
    } else {
        map_set(cap, i, s);
        map_set(cap, i + s->blocks - 1, s);
    }
}

/* ---- bins ------------------------------------------------------------------ */
static inline unsigned bin_of(uint32_t n)
{
    if (n <= 64)
        return n - 1;
    uint32_t w = n - 1;
    unsigned b = 31u - (unsigned)__builtin_clz(w);
    unsigned bin = 64 + (b - 6) * 4 + ((w >> (b - 2)) & 3);
    return bin < NVH_CAP_BINS ? bin : NVH_CAP_BINS - 1;
}

static void bin_insert(struct cap_inst *cap, struct cap_span *s)
{
    unsigned b = bin_of(s->blocks);
    s->prev = NULL;
    s->next = cap->bins[b];
    if (s->next)
        s->next->prev = s;
    cap->bins[b] = s;
    cap->binmap[b / 64] |= (uint64_t)1 << (b % 64);
}

static void bin_remove(struct cap_inst *cap, struct cap_span *s)
{
    unsigned b = bin_of(s->blocks);
    if (s->prev)
        s->prev->next = s->next;
    else
        cap->bins[b] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (!cap->bins[b])
        cap->binmap[b / 64] &= ~((uint64_t)1 << (b % 64));
}

/* Queue a free span for punching with `bytes` of it that may hold pages (an
 * upper bound: a span coalesced with a punched neighbour holds pages only in
 * its own part, and a carved span's remainder at most what the whole had). */
static void dirty_push(struct cap_inst *cap, struct cap_span *s, size_t bytes)
{
    if (!bytes)
        return;
    s->dirty = 1;
    s->dbytes = bytes;
    s->dnext = NULL;
    s->dprev = cap->dtail;
    if (cap->dtail)
        cap->dtail->dnext = s;
    else
        cap->dhead = s;
    cap->dtail = s;
    cap->dirty_bytes += bytes;
}

static void dirty_remove(struct cap_inst *cap, struct cap_span *s)
{
    if (!s->dirty)
        return;
    if (s->dprev)
        s->dprev->dnext = s->dnext;
    else
        cap->dhead = s->dnext;
    if (s->dnext)
        s->dnext->dprev = s->dprev;
    else
        cap->dtail = s->dprev;
    s->dirty = 0;
    cap->dirty_bytes -= s->dbytes;
    s->dbytes = 0;
}

/* ---- the file -------------------------------------------------------------- */
/* Give the pages of a free span back to the device. MADV_REMOVE punches a
 * hole in the file behind a shared mapping (tmpfs, ext4, xfs, DAX); reads
 * then see zeros. */
static void punch(struct cap_inst *cap, struct cap_span *s)
{
    dirty_remove(cap, s);
    if (madvise((void *)s->start, (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT, MADV_REMOVE) == 0) {
        s->hole = 1;
        cap->punches++;
    }
}

/* Before the used top of the range rises past what was checked: is there
 * room on the device for the next NVH_CAP_GROW_STEP? Pages are not
 * preallocated (fallocate would zero pages the program may never touch); a
 * device that fills up anyway makes a page fault fail with SIGBUS, as with
 * any shared file mapping (docs/CAP.md, limits). A refused growth makes the
 * allocation fail (the preload then serves it from DRAM). */
static bool room(struct cap_inst *cap, size_t len)
{
    if (cap->fd < 0)
        return true;
    struct statvfs sv;
    if (fstatvfs(cap->fd, &sv) != 0)
        return true;
    return (uint64_t)sv.f_bavail * sv.f_frsize >= len;
}

/* Raise the top by `bytes` (false: the range or the device is full). */
static bool raise_top(struct cap_inst *cap, size_t bytes)
{
    if (bytes > cap->size - cap->top)
        return false;
    if (cap->top + bytes > cap->checked) {
        size_t want = cap->top + bytes - cap->checked;
        want = (want + NVH_CAP_GROW_STEP - 1) & ~(NVH_CAP_GROW_STEP - 1);
        if (want > cap->size - cap->checked)
            want = cap->size - cap->checked;
        if (!room(cap, want))
            return false;
        cap->checked += want;
    }
    cap->top += bytes;
    atomic_store_explicit(&cap->top_hint, cap->top, memory_order_relaxed);
    return true;
}

uint64_t nvh_cap_now_ms_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The recent peak of the bytes in use: the largest value seen in this
 * window of NVH_CAP_DECAY_MS or the one before it. Under cap->lock. */
static size_t recent_peak(struct cap_inst *cap)
{
    uint64_t t = nvh_cap_now_ms_();
    if (t - cap->win_start >= NVH_CAP_DECAY_MS) {
        /* a window with no activity at all ends the older one too */
        cap->win_prev = t - cap->win_start >= 2u * NVH_CAP_DECAY_MS ? 0 : cap->win_cur;
        cap->win_cur = 0;
        cap->win_start = t;
    }
    /* (the peak is recorded where bytes come into use, account(): pages a
     * heap gives back after a quiet spell must not count as a fresh peak) */
    return cap->win_cur > cap->win_prev ? cap->win_cur : cap->win_prev;
}

void nvh_cap_span_note_peak_(struct cap_inst *cap, size_t extra)
{
    (void)recent_peak(cap);   /* (a new window first) */
    size_t kept = atomic_load_explicit(&cap->lkeep_bytes, memory_order_relaxed);
    size_t live = (cap->span_bytes > kept ? cap->span_bytes - kept : 0) + extra;
    if (live > cap->win_cur)
        cap->win_cur = live;
}

/* The dirty allowance. Two bounds on the spans the file holds (in use plus
 * dirty, kept large blocks included):
 *  - 1.5 times the bytes in use (dirty <= in use / 2): churn at a steady
 *    live size does not punch, and at a peak the file stays within 1.5 times
 *    what is in use;
 *  - or 1.5 times the peak of the bytes in use over the last one or two
 *    windows of NVH_CAP_DECAY_MS: a program that frees a batch and allocates it again
 *    (a request, a phase) refills pages it already has instead of punching
 *    and faulting them in again on every round. Once the batch has not come
 *    back for a window, the bound falls to the first one.
 * Both at least min(decay_min, a twentieth of the all-time peak of the bytes
 * in use), so a heap that empties keeps less than a tenth of its peak file
 * once the window passed (or at
 * once when a thread exits: `settle`, a thread's exit is where a program
 * sheds a working set). Punching goes to half the allowance, so it runs in
 * batches: coalesced free spans first (oldest first), then kept large blocks
 * (oldest first), which are likelier to be asked for again whole. */
static void lcache_evict(struct cap_inst *cap, struct cap_span *s);

/* Spans count address space, but the file holds only the pages the program
 * touched: one that writes a few pages of each large block (a header, a
 * tail) has a file far smaller than its spans, and punching its free spans
 * would only make it fault them in again. So while the heap is in use the
 * file itself is asked (fstat) before punching: if it holds no more than the
 * spans in use (`bound`), the free spans hold (next to) no pages and nothing
 * is punched; they may grow by the difference before it is asked again. */
static bool file_within(struct cap_inst *cap, size_t held, size_t bound)
{
    if (held <= cap->file_slack)
        return true;
    struct stat st;
    if (cap->fd < 0 || fstat(cap->fd, &st) != 0)
        return false;
    size_t file = (size_t)st.st_blocks * 512;
    if (file > bound)
        return false;
    cap->file_slack = held + (bound - file);
    return true;
}

/* How far the heaps' kept large blocks may grow while what the instance
 * holds stays within `bound` (large.c lk_publish). */
static void lkeep_room(struct cap_inst *cap, size_t bound)
{
    size_t own = cap->dirty_bytes + cap->lc_bytes;
    atomic_store_explicit(&cap->lkeep_room, bound > own ? bound - own : 0, memory_order_relaxed);
}

static void decay_(struct cap_inst *cap, bool settle)
{
    /* large blocks the thread heaps keep (large.c) are spans in use here,
     * but free to the program: they count as held, like the instance's */
    size_t kept = atomic_load_explicit(&cap->lkeep_bytes, memory_order_relaxed);
    if (kept > cap->span_bytes)
        kept = cap->span_bytes;
    size_t in_use = cap->span_bytes - kept;
    size_t allow = in_use / 2;
    size_t recent = settle ? 0 : recent_peak(cap);
    recent += recent / 2;
    if (recent > in_use && recent - in_use > allow)
        allow = recent - in_use;
    size_t floor = cap->span_peak / 20;
    if (floor > cap->decay_min)
        floor = cap->decay_min;
    if (allow < floor)
        allow = floor;
    size_t held = cap->dirty_bytes + cap->lc_bytes + kept;
    if (held <= allow) {
        lkeep_room(cap, allow);
        return;
    }
    if (!settle && in_use > floor && file_within(cap, held, in_use)) {
        lkeep_room(cap, cap->file_slack);
        return;
    }
    cap->file_slack = 0;
    while (cap->dirty_bytes + cap->lc_bytes + kept > allow / 2) {
        if (cap->dhead)
            punch(cap, cap->dhead);
        else if (cap->lc_old)
            lcache_evict(cap, cap->lc_old);   /* into the punch queue */
        else
            break;
    }
    lkeep_room(cap, allow);
}

static void decay(struct cap_inst *cap)
{
    decay_(cap, false);
}

void nvh_cap_span_decay_(struct cap_inst *cap)
{
    decay_(cap, false);
}

void nvh_cap_span_settle_(struct cap_inst *cap)
{
    decay_(cap, true);
}

/* ---- span allocator ---------------------------------------------------------- */
/* A free span of at least n blocks: the lowest address among the first
 * CAP_FIT_LOOK spans that fit, smallest bins first. Low addresses first keeps
 * the used range compact: after a peak the spans in use gather at its
 * bottom, and the free space above them reaches the top, where it is given
 * back (trim_top); a LIFO choice would scatter them over the peak's range.
 * The bound keeps a heap with many free spans from scanning them all. */
#define CAP_FIT_LOOK 32u
static struct cap_span *take_free(struct cap_inst *cap, uint32_t n)
{
    unsigned b = bin_of(n), seen = 0;
    struct cap_span *best = NULL;
    /* the first bin may hold smaller spans (a log bin): look through it */
    for (struct cap_span *s = cap->bins[b]; s && seen < CAP_FIT_LOOK; s = s->next)
        if (s->blocks >= n) {
            seen++;
            if (!best || s->start < best->start)
                best = s;
        }
    for (unsigned w = (b + 1) / 64; w < NVH_CAP_BINS / 64 && seen < CAP_FIT_LOOK; w++) {
        uint64_t m = cap->binmap[w];
        if (w == (b + 1) / 64)
            m &= ~(uint64_t)0 << ((b + 1) % 64);
        for (; m && seen < CAP_FIT_LOOK; m &= m - 1)
            for (struct cap_span *s = cap->bins[w * 64 + (unsigned)__builtin_ctzll(m)];
                 s && seen < CAP_FIT_LOOK; s = s->next) {
                seen++;
                if (!best || s->start < best->start)
                    best = s;
            }
    }
    return best;
}

static void account(struct cap_inst *cap, struct cap_span *s, bool add)
{
    size_t bytes = (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
    size_t now = add ? (cap->span_bytes += bytes) : (cap->span_bytes -= bytes);
    if (now > cap->span_peak)
        cap->span_peak = now;
    if (add) {
        /* the recent peak of what the program has in use: not the large
         * blocks the heaps keep (large.c) */
        size_t kept = atomic_load_explicit(&cap->lkeep_bytes, memory_order_relaxed);
        size_t live = now > kept ? now - kept : 0;
        if (live > cap->win_cur)
            cap->win_cur = live;
    }
}

/* The first n blocks of the free span s (taken out of the bins); the rest
 * stays free. NULL only if no descriptor could be made. */
static struct cap_span *carve(struct cap_inst *cap, struct cap_span *s, uint32_t n, bool *zero)
{
    bin_remove(cap, s);
    bool hole = s->hole;
    size_t d = s->dbytes;
    dirty_remove(cap, s);
    if (s->blocks > n) {     /* split: the tail stays free */
        struct cap_span *r = desc_new(cap);
        if (!r) {
            bin_insert(cap, s);
            dirty_push(cap, s, d);
            return NULL;
        }
        r->kind = CAP_SPAN_FREE;
        r->start = s->start + ((uintptr_t)n << NVH_CAP_BLOCK_SHIFT);
        r->blocks = s->blocks - n;
        r->hole = hole;
        s->blocks = n;
        map_span(cap, r);
        bin_insert(cap, r);
        size_t rb = (size_t)r->blocks << NVH_CAP_BLOCK_SHIFT;
        dirty_push(cap, r, d < rb ? d : rb);
    }
    *zero = hole && !d;
    return s;
}

/* n blocks at the top of the used range: the free span that ends at the top
 * (if any), extended by raising the top. */
static struct cap_span *at_top(struct cap_inst *cap, uint32_t n, bool *zero)
{
    size_t tb = cap->top >> NVH_CAP_BLOCK_SHIFT;
    struct cap_span *w = tb ? atomic_load_explicit(&cap->map[tb - 1], memory_order_relaxed) : NULL;
    if (w && w->kind == CAP_SPAN_FREE && span_end(w) == cap->base + cap->top) {
        if (w->blocks >= n)
            return carve(cap, w, n, zero);
        if (!raise_top(cap, (size_t)(n - w->blocks) << NVH_CAP_BLOCK_SHIFT))
            return NULL;
        bin_remove(cap, w);
        dirty_remove(cap, w);
        w->blocks = n;
        *zero = false;
        return w;
    }
    struct cap_span *s = desc_new(cap);
    if (!s)
        return NULL;
    s->start = cap->base + cap->top;
    if (!raise_top(cap, (size_t)n << NVH_CAP_BLOCK_SHIFT)) {
        desc_put(cap, s);
        return NULL;
    }
    s->blocks = n;
    *zero = true;
    return s;
}

static struct cap_span *finish(struct cap_inst *cap, struct cap_span *s, int kind)
{
    s->kind = (uint8_t)kind;
    s->dirty = s->hole = s->cached = s->roomy = 0;
    s->next = s->prev = NULL;
    s->user = s->start;
    map_span(cap, s);
    account(cap, s, true);
    return s;
}

struct cap_span *nvh_cap_span_alloc_(struct cap_inst *cap, uint32_t n, int kind, bool *zero)
{
    cap->span_calls++;
    struct cap_span *s = take_free(cap, n);
    s = s ? carve(cap, s, n, zero) : at_top(cap, n, zero);
    return s ? finish(cap, s, kind) : NULL;
}

/* The largest free span, if it leaves room to grow (>= 4n blocks). */
static struct cap_span *largest_free(struct cap_inst *cap, uint32_t n)
{
    for (unsigned w = NVH_CAP_BINS / 64; w-- > 0;) {
        if (!cap->binmap[w])
            continue;
        unsigned b = w * 64 + 63u - (unsigned)__builtin_clzll(cap->binmap[w]);
        struct cap_span *best = NULL;
        for (struct cap_span *s = cap->bins[b]; s; s = s->next)
            if (!best || s->blocks > best->blocks)
                best = s;
        return best && (uint64_t)best->blocks >= (uint64_t)n * 4 ? best : NULL;
    }
    return NULL;
}

struct cap_span *nvh_cap_span_alloc_top_(struct cap_inst *cap, uint32_t n, int kind, bool *zero)
{
    cap->span_calls++;
    struct cap_span *s = largest_free(cap, n);
    s = s ? carve(cap, s, n, zero) : at_top(cap, n, zero);
    return s ? finish(cap, s, kind) : NULL;
}

/* A free span left at the top of the used range by a retired page (see
 * nvh_cap_span_free_) that is large, both in bytes (NVH_CAP_TRIM_MIN,
 * glibc's default trim threshold) and against the spans in use (a quarter
 * of them: the heap shrank, it did not just free a page it will need
 * again), is given back: its pages punched and the top lowered to its
 * start, as glibc trims the top of its heap. So the address space a heap
 * spans follows its live blocks down after a peak instead of staying at the
 * peak's ([Moraru11] Table 2 measures it); a heap that churns below its top
 * keeps its pages (the allowance, decay_). */
static void trim_top(struct cap_inst *cap, struct cap_span *s)
{
    size_t bytes = (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
    if (bytes < NVH_CAP_TRIM_MIN || bytes < cap->span_bytes / 4)
        return;
    bin_remove(cap, s);
    if (s->dirty) {
        dirty_remove(cap, s);
        if (madvise((void *)s->start, bytes, MADV_REMOVE) == 0)
            cap->punches++;
        else {
            dirty_push(cap, s, bytes);   /* it holds pages: keep it */
            bin_insert(cap, s);
            return;
        }
    }
    /* every block: a second free of any block that went there finds it */
    size_t i = blk_index(cap, s->start);
    for (uint32_t k = 0; k < s->blocks; k++)
        map_set(cap, i + k, &cap->above_top);
    cap->top = s->start - cap->base;
    atomic_store_explicit(&cap->top_hint, cap->top, memory_order_relaxed);
    desc_put(cap, s);
}

/* Make s free: coalesce with free neighbours, queue its pages for punching. */
static void release(struct cap_inst *cap, struct cap_span *s)
{
    bool hole = s->hole;
    /* its own pages, unless it is a page its heap kept empty and punched */
    size_t d = s->kind == CAP_SPAN_PAGE && hole ? 0 : (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
    s->kind = CAP_SPAN_FREE;
    s->cached = 0;
    s->roomy = 0;
    s->hole = 0;
    s->dirty = 0;
    s->dbytes = 0;
    size_t i = blk_index(cap, s->start);
    /* left neighbour: a free span ending where s starts */
    if (i > 0) {
        struct cap_span *l = atomic_load_explicit(&cap->map[i - 1], memory_order_relaxed);
        if (l && l->kind == CAP_SPAN_FREE && l != s && span_end(l) == s->start) {
            bin_remove(cap, l);
            d += l->dbytes;
            dirty_remove(cap, l);
            hole |= l->hole;
            l->blocks += s->blocks;
            desc_put(cap, s);
            /* a second free of the block finds the span it went into */
            map_set(cap, i, l);
            s = l;
        }
    }
    uintptr_t end = span_end(s);
    if (end - cap->base < cap->top) {
        struct cap_span *r = atomic_load_explicit(&cap->map[blk_index(cap, end)], memory_order_relaxed);
        if (r && r->kind == CAP_SPAN_FREE && r != s && r->start == end) {
            bin_remove(cap, r);
            d += r->dbytes;
            dirty_remove(cap, r);
            hole |= r->hole;
            s->blocks += r->blocks;
            desc_put(cap, r);
            map_set(cap, blk_index(cap, end), s);
        }
    }
    s->kind = CAP_SPAN_FREE;
    s->hole = hole;
    map_span(cap, s);
    bin_insert(cap, s);
    dirty_push(cap, s, d);
}

void nvh_cap_span_free_(struct cap_inst *cap, struct cap_span *s)
{
    cap->span_calls++;
    bool page = s->kind == CAP_SPAN_PAGE;
    if (s->kind != CAP_SPAN_FREE)
        account(cap, s, false);
    uintptr_t start = s->start;
    release(cap, s);
    /* a page goes back when its class's live blocks fell (a heap keeps a few
     * empty pages): the heap shrank; a large block at the top is more likely
     * a buffer asked for again (kept blocks, the allowance) */
    if (page) {
        struct cap_span *f = atomic_load_explicit(&cap->map[blk_index(cap, start)], memory_order_relaxed);
        if (f && f->kind == CAP_SPAN_FREE && f != &cap->above_top && span_end(f) == cap->base + cap->top)
            trim_top(cap, f);
    }
    decay(cap);
}

/* ---- kept large blocks ------------------------------------------------------ */
/* A freed large block is kept whole, in use by nobody, until a request of
 * its class takes it again: its pages are mapped and resident, so the next
 * block of that class costs no page fault, where a block carved out of
 * coalesced free space at a new offset lands its pages on ones the process
 * never touched (a shared-memory fault and a fresh file page each; with
 * sizes that vary, most of them). Kept blocks count as dirty for the
 * allowance, which evicts the oldest (decay_). */
static bool lcache_fits(const struct cap_span *s)
{
    return s->blocks > 16 && s->blocks <= NVH_CAP_LARGE_ROUND_MAX &&
           nvh_cap_large_round_(s->blocks) == s->blocks;
}

static void lcache_unlink(struct cap_inst *cap, struct cap_span *s)
{
    unsigned c = nvh_cap_large_class_(s->blocks);
    if (s->prev)
        s->prev->next = s->next;
    else
        cap->lc[c] = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (s->dprev)
        s->dprev->dnext = s->dnext;
    else
        cap->lc_old = s->dnext;
    if (s->dnext)
        s->dnext->dprev = s->dprev;
    else
        cap->lc_new = s->dprev;
    s->next = s->prev = s->dnext = s->dprev = NULL;
    s->cached = 0;
    cap->lc_bytes -= (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
}

static void lcache_evict(struct cap_inst *cap, struct cap_span *s)
{
    lcache_unlink(cap, s);
    release(cap, s);   /* accounted as not in use when kept */
}

void nvh_cap_span_cache_(struct cap_inst *cap, struct cap_span *s)
{
    cap->span_calls++;
    if (!lcache_fits(s) || s->roomy) {
        nvh_cap_span_free_(cap, s);
        return;
    }
    account(cap, s, false);
    unsigned c = nvh_cap_large_class_(s->blocks);
    s->cached = 2;
    s->prev = NULL;
    s->next = cap->lc[c];
    if (s->next)
        s->next->prev = s;
    cap->lc[c] = s;
    s->dnext = NULL;
    s->dprev = cap->lc_new;
    if (cap->lc_new)
        cap->lc_new->dnext = s;
    else
        cap->lc_old = s;
    cap->lc_new = s;
    cap->lc_bytes += (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT;
    decay(cap);
}

struct cap_span *nvh_cap_span_reuse_(struct cap_inst *cap, uint32_t n)
{
    cap->span_calls++;
    if (n <= 16 || n > NVH_CAP_LARGE_ROUND_MAX)
        return NULL;
    unsigned c = nvh_cap_large_class_(n);
    struct cap_span *s = NULL;
    for (unsigned k = c; !s && k < c + NVH_CAP_LCACHE_REACH && k < NVH_CAP_LCLASSES; k++)
        s = cap->lc[k];
    if (!s)
        return NULL;
    lcache_unlink(cap, s);
    account(cap, s, true);
    return s;
}

bool nvh_cap_span_grow_(struct cap_inst *cap, struct cap_span *s, uint32_t n)
{
    cap->span_calls++;
    uint32_t extra = n - s->blocks;
    uintptr_t end = span_end(s);
    size_t bytes = (size_t)extra << NVH_CAP_BLOCK_SHIFT;
    if (end - cap->base == cap->top) {          /* at the top: raise it */
        if (!raise_top(cap, bytes))
            return false;
    } else {
        struct cap_span *r = atomic_load_explicit(&cap->map[blk_index(cap, end)], memory_order_relaxed);
        if (!r || r->kind != CAP_SPAN_FREE || r->start != end)
            return false;
        if (r->blocks < extra) {
            /* the free span up to the top: take it and raise the top */
            if (span_end(r) != cap->base + cap->top ||
                !raise_top(cap, (size_t)(extra - r->blocks) << NVH_CAP_BLOCK_SHIFT))
                return false;
            bin_remove(cap, r);
            dirty_remove(cap, r);
            desc_put(cap, r);
            goto grown;
        }
        bin_remove(cap, r);
        size_t d = r->dbytes;
        dirty_remove(cap, r);
        if (r->blocks == extra) {
            desc_put(cap, r);
        } else {
            r->start = end + bytes;
            r->blocks -= extra;
            map_span(cap, r);
            bin_insert(cap, r);
            size_t rb = (size_t)r->blocks << NVH_CAP_BLOCK_SHIFT;
            dirty_push(cap, r, d < rb ? d : rb);
        }
    }
grown:
    map_set(cap, blk_index(cap, s->start + ((uintptr_t)(s->blocks - 1) << NVH_CAP_BLOCK_SHIFT)), NULL);
    cap->span_bytes += bytes;
    s->blocks = n;
    map_span(cap, s);
    if (s->user != s->start)
        map_set(cap, blk_index(cap, s->user), s);
    size_t now = cap->span_bytes;
    if (now > cap->span_peak)
        cap->span_peak = now;
    if (now > cap->win_cur)
        cap->win_cur = now;
    return true;
}

void nvh_cap_span_set_user_(struct cap_inst *cap, struct cap_span *s, uintptr_t user)
{
    s->user = user;
    if (user != s->start)
        map_set(cap, blk_index(cap, user), s);
}

void nvh_cap_span_purge_(struct cap_inst *cap)
{
    while (cap->lc_old)
        lcache_evict(cap, cap->lc_old);
    while (cap->dhead)
        punch(cap, cap->dhead);
}

struct cap_heap *nvh_cap_heap_new_(struct cap_inst *cap)
{
    struct cap_heap *h = meta_alloc(cap, sizeof *h);
    if (h) {
        memset(h, 0, sizeof *h);
        h->cap = cap;
        h->all_next = cap->heaps;
        cap->heaps = h;
    }
    return h;
}

struct cap_rbatch *nvh_cap_rbatch_new_(struct cap_inst *cap)
{
    struct cap_rbatch *b = cap->rbatch_free;
    if (b)
        cap->rbatch_free = (struct cap_rbatch *)b->next;
    else
        b = meta_alloc(cap, sizeof *b);
    if (b) {
        b->next = 0;
        b->n = 0;
    }
    return b;
}

void nvh_cap_rbatch_put_(struct cap_inst *cap, struct cap_rbatch *b)
{
    b->next = (uintptr_t)cap->rbatch_free;
    cap->rbatch_free = b;
}

void nvh_cap_counters_(struct cap_inst *cap, struct nvh_cap_counters *out)
{
    pthread_mutex_lock(&cap->lock);
    memset(out, 0, sizeof *out);
    out->reserved = cap->size;
    out->span_bytes = cap->span_bytes;
    out->span_peak = cap->span_peak;
    out->dirty_bytes = cap->dirty_bytes + cap->lc_bytes;
    out->top = cap->top;
    out->punches = cap->punches + atomic_load_explicit(&cap->empty_punches, memory_order_relaxed);
    struct stat st;
    if (cap->fd >= 0 && fstat(cap->fd, &st) == 0)
        out->file_bytes = (size_t)st.st_blocks * 512;
    pthread_mutex_unlock(&cap->lock);
}

/* ---- instances --------------------------------------------------------------- */
static int common_init(struct cap_inst *cap)
{
    cap->map_bytes = (cap->size >> NVH_CAP_BLOCK_SHIFT) * sizeof(cap->map[0]);
    void *m = mmap(NULL, cap->map_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return -errno;
    cap->map = m;
    cap->above_top.kind = CAP_SPAN_FREE;
    cap->above_top.start = cap->base;
    cap->above_top.blocks = (uint32_t)(cap->size >> NVH_CAP_BLOCK_SHIFT);
    pthread_mutex_init(&cap->lock, NULL);
    cap->decay_min = (size_t)32 << 20;
    cap->fork_fd = -1;
    uintptr_t r = (uintptr_t)cap ^ (uintptr_t)&r;
#if defined(__x86_64__)
    unsigned lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    r ^= ((uint64_t)hi << 32 | lo) * 0x9E3779B97F4A7C15ull;
#endif
    cap->secret = r | 1;
    int e = nvh_cap_id_get_(cap);
    if (e) {
        munmap(m, cap->map_bytes);
        cap->map = NULL;
    }
    return e;
}

/* An unlinked file with close-on-exec: O_TMPFILE where the file system has
 * it (the file never has a name), else a named file unlinked at once. */
static int open_file(const char *dir)
{
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        return fd;
    char path[320];
    size_t n = strlen(dir);
    if (n > sizeof path - 32)
        return -ENAMETOOLONG;
    memcpy(path, dir, n);
    memcpy(path + n, "/.nvheap-cap-XXXXXX", sizeof "/.nvheap-cap-XXXXXX");
    fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unlink(path);
    return fd;
}

int nvh_cap_init_file_(struct cap_inst *cap, const char *dir, size_t reserve)
{
    memset(cap, 0, sizeof *cap);
    size_t n = strlen(dir);
    if (n >= sizeof cap->dir)
        return -ENAMETOOLONG;
    memcpy(cap->dir, dir, n + 1);
    int fd = open_file(dir);
    if (fd < 0)
        return fd;
    reserve &= ~(size_t)(NVH_CAP_SMALL_PAGE - 1);
    void *base = MAP_FAILED;
    while (reserve >= ((size_t)64 << 20)) {
        if (ftruncate(fd, (off_t)reserve) == 0) {
            base = mmap(NULL, reserve, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
            if (base != MAP_FAILED)
                break;
        }
        reserve /= 2;
    }
    if (base == MAP_FAILED) {
        int e = errno ? errno : ENOMEM;
        close(fd);
        return -e;
    }
    cap->fd = fd;
    cap->base = (uintptr_t)base;
    cap->size = reserve;
    cap->own_mapping = true;
    int r = common_init(cap);
    if (r) {
        munmap(base, reserve);
        close(fd);
    }
    return r;
}

int nvh_cap_init_region_(struct cap_inst *cap, void *base, size_t size)
{
    memset(cap, 0, sizeof *cap);
    uintptr_t b = ((uintptr_t)base + NVH_CAP_BLOCK - 1) & ~(uintptr_t)(NVH_CAP_BLOCK - 1);
    if ((uintptr_t)base + size < b + NVH_CAP_SMALL_PAGE)
        return -EINVAL;
    cap->fd = -1;
    cap->base = b;
    cap->size = ((uintptr_t)base + size - b) & ~(size_t)(NVH_CAP_BLOCK - 1);
    cap->checked = cap->size;
    cap->key_at_free = true;   /* nvh_cap_free reports every double free */
    return common_init(cap);
}

void nvh_cap_destroy_(struct cap_inst *cap)
{
    nvh_cap_forget_(cap);
    nvh_cap_id_put_(cap);
    if (cap->map)
        munmap((void *)cap->map, cap->map_bytes);
    if (cap->own_mapping)
        munmap((void *)cap->base, cap->size);
    if (cap->fd >= 0)
        close(cap->fd);
    pthread_mutex_destroy(&cap->lock);
    /* descriptors and heaps (other threads' TLS slots are invalid now: the
     * generation no longer matches, so nothing reads these again) */
    for (struct meta_slab *m = cap->meta_slabs, *n; m; m = n) {
        n = m->next;
        munmap(m, m->len);
    }
    cap->meta_slabs = NULL;
    cap->map = NULL;
}

/* ---- fork ------------------------------------------------------------------ */
/* Copy the data extents of the used part of the file into a fresh file,
 * reading through the mapping. Runs in the parent before fork, with the
 * instance lock held: the copy is what the child will see. */
static int copy_file(struct cap_inst *cap)
{
    int nfd = open_file(cap->dir);
    if (nfd < 0)
        return nfd;
    if (ftruncate(nfd, (off_t)cap->size) != 0) {
        close(nfd);
        return -errno;
    }
    off_t off = 0, top = (off_t)cap->top;
    while (off < top) {
        off_t d = lseek(cap->fd, off, SEEK_DATA);
        if (d < 0 || d >= top)
            break;
        off_t h = lseek(cap->fd, d, SEEK_HOLE);
        if (h < 0 || h > top)
            h = top;
        while (d < h) {
            ssize_t w = pwrite(nfd, (const char *)cap->base + d, (size_t)(h - d), d);
            if (w <= 0) {
                close(nfd);
                return -EIO;
            }
            d += w;
        }
        off = h;
    }
    return nfd;
}

void nvh_cap_fork_prepare_(struct cap_inst *cap)
{
    pthread_mutex_lock(&cap->lock);
    cap->fork_fd = cap->fd >= 0 ? copy_file(cap) : -1;
}

void nvh_cap_fork_parent_(struct cap_inst *cap)
{
    if (cap->fork_fd >= 0)
        close(cap->fork_fd);
    cap->fork_fd = -1;
    pthread_mutex_unlock(&cap->lock);
}

void nvh_cap_fork_child_(struct cap_inst *cap, struct cap_heap *self)
{
    if (cap->fork_fd >= 0) {
        void *m = mmap((void *)cap->base, cap->size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_NORESERVE | MAP_FIXED, cap->fork_fd, 0);
        if (m == MAP_FAILED)
            abort();   /* the child would write into its parent's heap */
        close(cap->fd);
        cap->fd = cap->fork_fd;
        cap->checked = cap->top;
    } else if (cap->fd >= 0) {
        abort();       /* no private copy could be made */
    }
    cap->fork_fd = -1;
    /* every other thread is gone in the child: their heaps are orphans */
    cap->orphans = NULL;
    for (struct cap_heap *h = cap->heaps; h; h = h->all_next) {
        if (h == self)
            continue;
        atomic_store(&h->orphan, 1);
        h->orphan_next = cap->orphans;
        cap->orphans = h;
    }
    pthread_mutex_unlock(&cap->lock);
}
