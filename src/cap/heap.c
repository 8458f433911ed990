/* heap.c — the capacity allocator proper: per-thread heaps of size-classed
 * pages (mimalloc-style free lists per page), cross-thread frees, large
 * objects, realloc.
 *
 * Small and medium objects (<= 64 KiB) live in pages of one size class
 * (64 KiB pages for classes up to 8 KiB, 512 KiB above; on the fine grid of
 * a big heap, pages grow per class and fit the class), owned by one thread
 * heap. malloc pops the free list of the class's current page; the owner's
 * free pushes onto it. A free by another thread queues the block's address
 * in a small per-thread batch for the owner heap without touching the block;
 * a full batch is pushed onto the owner's `remote` list with one CAS, and the
 * owner drains that list when a page runs dry, checking and setting each
 * block's key there. So neither path takes a lock, and the freeing thread
 * touches the owner's cache lines once per batch.
 *
 * Objects above 64 KiB are spans of their own (span.c), rounded to large
 * classes; the heap of the thread that frees one keeps it, for reuse
 * without the lock (large.c).
 *
 * Checks ("where cheap"): the block map finds the span of any pointer inside
 * the range; a pointer that is not the start of a block of a page (one
 * multiply), not the start of a large object, or in no span is invalid; a
 * block whose key marks it free is a double free. */
#include "cap.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

/* The thread's heap of each instance slot, valid while tl_gen matches the
 * instance's generation (a slot may be reused by a later instance; its old
 * heap's memory is gone then, so the check never reads through it). */
static __thread struct cap_heap *tl_heap[NVH_CAP_INSTANCES]
    __attribute__((tls_model("initial-exec")));
static __thread uint64_t tl_gen[NVH_CAP_INSTANCES] __attribute__((tls_model("initial-exec")));
static __thread int tl_creating __attribute__((tls_model("initial-exec")));

/* A page with nothing in it: every class starts with it as current page, so
 * the fast path needs no NULL check. */
static struct cap_span cap_sentinel;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static pthread_mutex_t ids_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t live_gen[NVH_CAP_INSTANCES];
static uint64_t next_gen = 1;

/* ---- size classes ----------------------------------------------------------- */
/* 16 B steps up to CAP_LINEAR (16 << S), then 2^S classes per power of two,
 * so a class is at most 1/2^S larger than the request; S = 5 keeps rounding
 * near glibc's 16 B granularity for the sizes where it matters (about 1 %
 * on average for sizes uniform in 10 B .. 4 KiB, [Moraru11] Table 2). Every
 * class is a multiple of 16 (16 B alignment).
 * Branch-free: programs mix sizes on both sides of CAP_LINEAR at random, and
 * a mispredicted branch costs as much as the rest of malloc's fast path. */
#define CAP_S NVH_CAP_CLASS_SHIFT
#define CAP_LINEAR ((size_t)16 << CAP_S)

/* The coarse class of sizes up to CAP_LINEAR by (size + 15) / 16
 * (heap_class); filled with key_once, before any heap exists. A size in
 * (16 (i - 1), 16 i] rounds to the class of 16 i: the coarse classes are
 * multiples of 16, and no power of two lies strictly between the two. */
static uint16_t coarse_small[(CAP_LINEAR >> 4) + 1];

static inline unsigned size_class(size_t s)
{
    unsigned small = (unsigned)((s + 15) >> 4) | (s == 0);
    size_t w = s - 1;
    unsigned b = 63u - (unsigned)__builtin_clzll(w | CAP_LINEAR);   /* b >= 4 + S */
    unsigned big = (1u << CAP_S) + 1u + ((b - 4u - CAP_S) << CAP_S) +
                   (unsigned)((w >> (b - CAP_S)) & ((1u << CAP_S) - 1u));
    unsigned m = 0u - (unsigned)(s <= CAP_LINEAR);   /* a mask, so no branch */
    return (small & m) | (big & ~m);
}

/* s rounded up to the grid of 2^S classes per power of two (16 B steps up
 * to 16 << S). A heap rounds with the coarse grid (NVH_CAP_COARSE_SHIFT),
 * whose classes are a subset of the fine ones, until it holds
 * NVH_CAP_FINE_BYTES of pages, and with the fine grid from then on (back
 * to coarse below half of that): with a few blocks per class, a page per
 * fine class wastes more than rounding saves (a 1 MiB heap of mixed sizes
 * would hold twice its live bytes); with many, the finer rounding saves
 * up to a fifth of the heap (docs/CAP.md). Which grid a block came from
 * does not matter to free or realloc: a page knows its block size. */
static inline size_t class_round(size_t s, unsigned S)
{
    size_t w = s - 1 + (s == 0);
    int sh = 63 - __builtin_clzll(w | 1) - (int)S;
    sh = sh < 4 ? 4 : sh;
    return (w | (((size_t)1 << sh) - 1)) + 1;
}

static inline size_t class_size(unsigned c)
{
    if (c <= (1u << CAP_S))
        return (size_t)c * 16u;
    unsigned j = c - (1u << CAP_S) - 1u;
    unsigned k = j & ((1u << CAP_S) - 1u), b = (j >> CAP_S) + 4u + CAP_S;
    return ((size_t)1 << b) + ((size_t)(k + 1u) << (b - CAP_S));
}

/* Blocks of a page of class size bs on the fine grid, the grow-th page a
 * heap makes for the class. Pages start small (room for two blocks) and
 * double with each page up to the target (NVH_CAP_FINE_PAGE, 512 KiB above
 * NVH_CAP_SMALL_MAX): with many fine classes, a heap that holds a few
 * blocks of each would otherwise hold a mostly empty page per class. Of the
 * sizes from the target to 3 times it (1.5 times for the 512 KiB pages, twice
 * while pages are small), the one
 * that leaves the smallest tail after the last whole block, so a page of an
 * odd class wastes little of its span. A big heap pays two things per
 * class: the tails of all its pages and the never-used part of its current
 * page (half a page on average); a 32 KiB target with the search up to
 * 96 KiB minimises their sum for sizes uniform in 10 B .. 4 KiB (docs/CAP.md
 * "Alternatives measured"). */
static uint32_t page_blocks(size_t bs, unsigned grow)
{
    size_t full = (bs <= NVH_CAP_SMALL_MAX ? NVH_CAP_FINE_PAGE : NVH_CAP_MEDIUM_PAGE) >> NVH_CAP_BLOCK_SHIFT;
    size_t base = ((2 * bs + NVH_CAP_BLOCK - 1) >> NVH_CAP_BLOCK_SHIFT) << (grow < 16 ? grow : 16);
    if (base > full)
        base = full;
    size_t hi = base < full ? base * 2 : bs <= NVH_CAP_SMALL_MAX ? full * 3 : full + full / 2;
    size_t best = base, best_tail = (base << NVH_CAP_BLOCK_SHIFT) % bs;
    for (size_t n = base + 1; n <= hi && best_tail; n++) {
        size_t tail = (n << NVH_CAP_BLOCK_SHIFT) % bs;
        if (tail * best < best_tail * n) {   /* tail / n < best_tail / best */
            best = n;
            best_tail = tail;
        }
    }
    return (uint32_t)best;
}

static inline uintptr_t key_of(const struct cap_inst *cap, const void *p)
{
    return cap->secret ^ (uintptr_t)p;
}

/* ---- instances' TLS slots ------------------------------------------------- */
static void thread_exit(void *arg)
{
    (void)arg;
    nvh_cap_thread_exit_();
}

static void key_init(void)
{
    pthread_key_create(&exit_key, thread_exit);
    for (unsigned i = 1; i <= (CAP_LINEAR >> 4); i++)
        coarse_small[i] = (uint16_t)size_class(class_round((size_t)i << 4, NVH_CAP_COARSE_SHIFT));
}

int nvh_cap_id_get_(struct cap_inst *cap)
{
    pthread_mutex_lock(&ids_lock);
    for (unsigned i = 0; i < NVH_CAP_INSTANCES; i++) {
        if (!live_gen[i]) {
            live_gen[i] = next_gen++;
            cap->id = i;
            cap->gen = live_gen[i];
            pthread_mutex_unlock(&ids_lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&ids_lock);
    return -EMFILE;
}

void nvh_cap_id_put_(struct cap_inst *cap)
{
    pthread_mutex_lock(&ids_lock);
    if (live_gen[cap->id] == cap->gen)
        live_gen[cap->id] = 0;
    pthread_mutex_unlock(&ids_lock);
}

struct cap_heap *nvh_cap_heap_peek_(struct cap_inst *cap)
{
    return tl_gen[cap->id] == cap->gen ? tl_heap[cap->id] : NULL;
}

void nvh_cap_forget_(struct cap_inst *cap)
{
    if (tl_gen[cap->id] == cap->gen) {
        tl_heap[cap->id] = NULL;
        tl_gen[cap->id] = 0;
    }
}

static NVH_CAP_NOINLINE struct cap_heap *heap_create(struct cap_inst *cap)
{
    if (tl_creating)
        return NULL;
    tl_creating = 1;
    pthread_once(&key_once, key_init);
    pthread_mutex_lock(&cap->lock);
    struct cap_heap *h = cap->orphans;
    if (h) {
        /* adopt a heap whose thread exited: its pages are still in use */
        cap->orphans = h->orphan_next;
        h->orphan_next = NULL;
        atomic_store(&h->orphan, 0);
    } else if ((h = nvh_cap_heap_new_(cap))) {
        h->gen = cap->gen;
        h->decay_ms = nvh_cap_now_ms_();
        for (unsigned c = 0; c < NVH_CAP_CLASSES; c++)
            h->cur[c] = &cap_sentinel;
    }
    pthread_mutex_unlock(&cap->lock);
    if (h) {
        tl_heap[cap->id] = h;
        tl_gen[cap->id] = cap->gen;
        pthread_setspecific(exit_key, (void *)1);   /* run thread_exit */
    }
    tl_creating = 0;
    return h;
}

/* The hot paths are static inline here and wrapped by the nvh_cap_*_
 * functions below: preload.c includes this file, so malloc and free inline
 * them whole (a call per operation is a measurable share of a 20 ns free). */
NVH_CAP_INLINE struct cap_heap *heap_get(struct cap_inst *cap)
{
    if (nvh_cap_likely(tl_gen[cap->id] == cap->gen))
        return tl_heap[cap->id];
    return heap_create(cap);
}

struct cap_heap *nvh_cap_heap_(struct cap_inst *cap)
{
    return heap_get(cap);
}

/* ---- lists of pages -------------------------------------------------------- */
/* A heap's lists of pages (a class's avail pages, a class's free tails) are
 * doubly linked through one of a span's two link pairs, `off` its offset
 * (LINK or DLINK), pushed at the head. */
#define LINK offsetof(struct cap_span, link)
#define DLINK offsetof(struct cap_span, dlink)

static inline struct cap_links *links_at(struct cap_span *s, size_t off)
{
    return (struct cap_links *)((char *)s + off);
}

static void list_push(struct cap_span **head, struct cap_span *s, size_t off)
{
    struct cap_links *l = links_at(s, off);
    l->prev = NULL;
    l->next = *head;
    if (l->next)
        links_at(l->next, off)->prev = s;
    *head = s;
}

static void list_remove(struct cap_span **head, struct cap_span *s, size_t off)
{
    struct cap_links *l = links_at(s, off);
    if (l->prev)
        links_at(l->prev, off)->next = l->next;
    else
        *head = l->next;
    if (l->next)
        links_at(l->next, off)->prev = l->prev;
    l->next = l->prev = NULL;
}

/* ---- pages ---------------------------------------------------------------- */
static void avail_push(struct cap_heap *h, struct cap_span *p)
{
    p->pstate = CAP_PG_AVAIL;
    list_push(&h->avail[p->cls], p, LINK);
}

static void avail_remove(struct cap_heap *h, struct cap_span *p)
{
    list_remove(&h->avail[p->cls], p, LINK);
}

/* ---- tail blocks ------------------------------------------------------------ */
/* A page is a whole number of 4 KiB blocks (the block map's unit), so a page
 * of a class that does not divide it ends in a tail shorter than one block:
 * about 0.4 % of a big heap of odd sizes ([Moraru11] Table 2), as much as the
 * size-class rounding. The tail is handed out as one block of a smaller
 * class (the largest on the heap's grid that fits, and whose power-of-two
 * alignment its address has, so aligned requests may take it too): a class
 * whose current page has no free block takes a free tail of its class before
 * it carves never-used blocks. The tail block counts in its page's `used`,
 * so the page is not retired while it is live; a free finds it by its
 * address (the page's `end`, past every whole block). */
static void tail_push(struct cap_heap *h, struct cap_span *p)
{
    p->tail = CAP_TAIL_FREE;
    list_push(&h->tails[p->tcls], p, DLINK);
}

static void tail_unlink(struct cap_heap *h, struct cap_span *p)
{
    list_remove(&h->tails[p->tcls], p, DLINK);
    p->tail = CAP_TAIL_NONE;
}

/* The class of a tail of t bytes at address a on grid S: the largest class
 * of the grid that fits in t and whose size's power-of-two factor divides
 * a and is at most 4 KiB; 0 if none (t < 16). A page starts on 4 KiB, so
 * that much alignment of a class's blocks is a property of the class;
 * more would depend on where the system placed the range (a medium page's
 * tail would go to a 32 KiB class on one run and a 28 KiB one on the next,
 * and the medium loop's file, set by which blocks keep which pages, ranged
 * over 0.9-1.33 x live with one sequence). Aligned requests above 4 KiB
 * take no class blocks (nvh_cap_alloc_aligned_). */
static unsigned tail_class(size_t t, uintptr_t a, unsigned S)
{
    if (t < 16)
        return 0;
    unsigned c = size_class(t & ~(size_t)15);
    for (; c; c--) {
        size_t cs = class_size(c);
        size_t al = cs & (0 - cs);
        if (cs <= t && class_round(cs, S) == cs && al <= NVH_CAP_BLOCK && (a & (al - 1)) == 0)
            break;
    }
    return c;
}

/* The class's avail page of the lowest address among the first few: pages
 * are refilled bottom first, so the ones at the top of a heap that shrinks
 * empty and go back (span.c take_free, trim_top). */
static struct cap_span *avail_lowest(struct cap_heap *h, unsigned c)
{
    struct cap_span *best = h->avail[c];
    unsigned k = 0;
    for (struct cap_span *q = best; q && k < 16; q = q->next, k++)
        if (q->start < best->start)
            best = q;
    return best;
}

static void fine_update(struct cap_heap *h)
{
    if (h->page_bytes >= NVH_CAP_FINE_BYTES)
        h->fine_max = NVH_CAP_CLASS_MAX;
    else if (h->page_bytes < NVH_CAP_FINE_BYTES / 2)
        h->fine_max = 0;
}

/* Kept empty pages: reused by any class without the lock, but their pages
 * hold file space. A small heap's file would hold them on top of its
 * classes' high-water marks (the small loop of bench/run cap: 56-80 KiB of
 * kept pages against 0.5 MiB live), so the ones beyond an allowance of
 * 1/NVH_CAP_EMPTY_SHARE of the heap's pages are punched as they are kept
 * (the range stays the heap's; a class that takes one faults its pages in
 * again as it carves them). A big heap's few kept pages fit within it and
 * are never punched. Punching every page a small heap keeps holds the small
 * loop's file lower (docs/CAP.md) but costs the loops that empty and refill
 * pages often (realloc, xsmall) a punch and refaults each time. p->dbytes: the bytes of a kept page that may hold file
 * pages; p->hole: it was punched. */
static void empty_keep(struct cap_heap *h, struct cap_span *p, size_t touched)
{
    if (touched && h->empty_bytes + touched > h->page_bytes / NVH_CAP_EMPTY_SHARE) {
        if (madvise((void *)p->start, touched, MADV_REMOVE) == 0) {
            atomic_fetch_add_explicit(&h->cap->empty_punches, 1, memory_order_relaxed);
            p->hole = 1;
            touched = 0;
        }
    }
    p->dbytes = touched;
    h->empty_bytes += touched;
}

/* A kept page leaves the list (taken by a class, or given back). */
static void empty_unkeep(struct cap_heap *h, struct cap_span *p)
{
    h->empty_bytes -= p->dbytes;
    p->dbytes = 0;
}

/* An empty page: keep a few small ones for any class, give the rest back. */
static void page_retire(struct cap_heap *h, struct cap_span *p, bool locked)
{
    struct cap_inst *cap = h->cap;
    if (h->pgrow[p->cls])
        h->pgrow[p->cls]--;    /* the class needs a page fewer */
    if (p->tail == CAP_TAIL_FREE)
        tail_unlink(h, p);
    size_t psize = (size_t)p->blocks << NVH_CAP_BLOCK_SHIFT;
    /* the part of the page that blocks were ever carved from (the tail is
     * in the last whole block's 4 KiB page, or past it once all are carved) */
    size_t touched = p->bump >= p->end ? psize
                                       : ((p->bump - p->start + NVH_CAP_BLOCK - 1) & ~(uintptr_t)(NVH_CAP_BLOCK - 1));
    p->pstate = CAP_PG_EMPTY;
    p->free = NULL;
    p->bump = p->end = p->start;
    if (psize < NVH_CAP_MEDIUM_PAGE && !atomic_load_explicit(&h->orphan, memory_order_relaxed)) {
        if (h->nempty < NVH_CAP_EMPTY_PAGES) {
            empty_keep(h, p, touched);
            h->empty[h->nempty++] = p;
            return;
        }
        /* the list is full: keep the lower page, give the highest back, so
         * that kept pages do not hold the top of the range (trim_top) */
        unsigned hi = 0;
        for (unsigned i = 1; i < h->nempty; i++)
            if (h->empty[i]->start > h->empty[hi]->start)
                hi = i;
        if (h->empty[hi]->start > p->start) {
            struct cap_span *x = h->empty[hi];
            empty_unkeep(h, x);
            empty_keep(h, p, touched);
            h->empty[hi] = p;
            p = x;
        }
    }
    p->heap = NULL;
    h->page_bytes -= (size_t)p->blocks << NVH_CAP_BLOCK_SHIFT;
    fine_update(h);
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    nvh_cap_span_free_(cap, p);
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}

/* After a free made a page empty or un-full. */
static NVH_CAP_NOINLINE void page_after_free(struct cap_heap *h, struct cap_span *p, bool locked)
{
    if (p->pstate == CAP_PG_FULL) {
        if (p->used == 0)
            page_retire(h, p, locked);
        else
            avail_push(h, p);
    } else if (p->used == 0 && p->pstate == CAP_PG_AVAIL) {
        avail_remove(h, p);
        page_retire(h, p, locked);
    } else if (p->used == 0 && atomic_load_explicit(&h->orphan, memory_order_relaxed)) {
        /* an orphan allocates no more: its current pages go back too */
        h->cur[p->cls] = &cap_sentinel;
        page_retire(h, p, locked);
    }
}

/* Carve never-used blocks into the free list, about 4 KiB at a time, so a
 * page's memory is touched (and the file filled) only as it is used. */
static bool page_extend(struct cap_heap *h, struct cap_span *p)
{
    struct cap_inst *cap = h->cap;
    size_t bs = p->bsize;
    size_t left = (p->end - p->bump) / bs;
    if (!left)
        return false;
    size_t n = bs >= 4096 ? 1 : 4096 / bs;
    if (n > left)
        n = left;
    uintptr_t a = p->bump;
    struct cap_block *head = NULL;
    for (size_t i = n; i-- > 0;) {
        struct cap_block *b = (struct cap_block *)(a + i * bs);
        b->next = head;
        b->key = key_of(cap, b);
        head = b;
    }
    p->bump = a + n * bs;
    p->free = head;
    /* the tail's 4 KiB page is the last block's: offered once that block is
     * carved, so that a tail never touches a page the file does not hold */
    if (p->bump == p->end && p->tcls)
        tail_push(h, p);
    return true;
}

/* Page-contiguity-aware placement in user space ([Kannan14] §4.1 changes
 * the kernel for it): with cap->populate, a fresh page or large block (from
 * the top of the range or a punched hole) is faulted in by one call instead
 * of one fault per 4 KiB as the program first touches it. The kernel then
 * allocates the object's pages together (on a tmpfs mounted huge=always,
 * as 2 MiB pages), and the program takes no faults on it. Off by default:
 * a program that touches a few pages of a big block would pay for all. */
static void populate(struct cap_inst *cap, uintptr_t a, size_t len)
{
    if (cap->populate && len > NVH_CAP_BLOCK)
        (void)madvise((void *)a, len, MADV_POPULATE_WRITE);   /* a hint: errors ignored */
}

/* A kept empty page for a class whose page is n blocks: one of exactly n
 * blocks, else one a little larger (its tail is then longer), the lowest
 * such (placement: low addresses first), or NULL. */
static struct cap_span *empty_take(struct cap_heap *h, uint32_t n)
{
    unsigned pick = h->nempty;
    bool exact = false;
    for (unsigned i = h->nempty; i-- > 0;) {
        struct cap_span *q = h->empty[i];
        bool eq = q->blocks == n;
        if (!eq && (q->blocks < n || q->blocks > n + n / 2 || exact))
            continue;
        /* an exact size first, then the lowest address */
        if (pick == h->nempty || (eq && !exact) || q->start < h->empty[pick]->start)
            pick = i;
        exact |= eq;
    }
    if (pick == h->nempty)
        return NULL;
    struct cap_span *p = h->empty[pick];
    h->empty[pick] = h->empty[--h->nempty];
    empty_unkeep(h, p);
    p->hole = 0;
    return p;
}

static struct cap_span *page_new(struct cap_heap *h, unsigned c)
{
    struct cap_inst *cap = h->cap;
    size_t bs = class_size(c);
    /* a coarse heap's pages are all full size: few classes, few pages, and
     * equal sizes keep the span space unfragmented */
    uint32_t n = h->fine_max
                     ? page_blocks(bs, h->pgrow[c])
                     : (uint32_t)((bs <= NVH_CAP_SMALL_MAX ? NVH_CAP_SMALL_PAGE : NVH_CAP_MEDIUM_PAGE) >>
                                  NVH_CAP_BLOCK_SHIFT);
    struct cap_span *p = empty_take(h, n);
    if (p) {
        n = p->blocks;
    } else {
        bool zero;
        pthread_mutex_lock(&cap->lock);
        p = nvh_cap_span_alloc_(cap, n, CAP_SPAN_PAGE, &zero);
        pthread_mutex_unlock(&cap->lock);
        if (!p)
            return NULL;
        if (zero)
            populate(cap, p->start, (size_t)n << NVH_CAP_BLOCK_SHIFT);
        h->page_bytes += (size_t)n << NVH_CAP_BLOCK_SHIFT;
        fine_update(h);
    }
    size_t psize = (size_t)n << NVH_CAP_BLOCK_SHIFT;
    if (h->pgrow[c] < 16)
        h->pgrow[c]++;
    p->heap = h;
    p->free = NULL;
    p->bump = p->start;
    p->end = p->start + (psize / bs) * bs;
    p->used = 0;
    p->bsize = (uint32_t)bs;
    p->inv = (((uint64_t)1 << 40) + bs - 1) / bs;
    p->cls = c;
    p->pstate = CAP_PG_CUR;
    p->tail = CAP_TAIL_NONE;
    p->tcls = (uint16_t)tail_class(p->start + psize - p->end, p->end,
                                   h->fine_max ? NVH_CAP_CLASS_SHIFT : NVH_CAP_COARSE_SHIFT);
    return p;
}

/* Hand out the free tail of page q (of another class). */
static void *tail_take(struct cap_heap *h, struct cap_span *q)
{
    tail_unlink(h, q);
    q->tail = CAP_TAIL_USED;
    q->used++;
    struct cap_block *b = (struct cap_block *)q->end;
    b->key = 0;
    return b;
}

/* The tail block of p is freed to its owner h (its key is already set). The
 * page's state follows its used count as local_free's does, except that a
 * full page stays full (it has no free whole block to offer). */
static NVH_CAP_NOINLINE void tail_release(struct cap_heap *h, struct cap_span *p, bool locked)
{
    tail_push(h, p);
    if (--p->used)
        return;
    if (p->pstate == CAP_PG_AVAIL)
        avail_remove(h, p);
    else if (p->pstate == CAP_PG_CUR) {
        if (!atomic_load_explicit(&h->orphan, memory_order_relaxed))
            return;   /* a live heap's current page stays current */
        h->cur[p->cls] = &cap_sentinel;
    }
    page_retire(h, p, locked);
}

/* Free one block into a page of h, as its owner (or under the lock while h
 * is an orphan). The block's key is already set. */
NVH_CAP_INLINE void local_free(struct cap_heap *h, struct cap_span *p, struct cap_block *b, bool locked)
{
    b->next = p->free;
    p->free = b;
    p->used--;
    /* The current page of a live heap stays current when it empties (a
     * batch freed and allocated again refills it): no call. Bitwise, not
     * short-circuit: whether a page just emptied is a coin toss in a batch
     * workload, and a mispredicted branch costs more than this whole path.
     * An orphan (only ever drained under the lock) retires emptied current
     * pages too: page_after_free checks. */
    unsigned st = p->pstate;
    if (nvh_cap_unlikely((st == CAP_PG_FULL) | ((p->used == 0) & ((st != CAP_PG_CUR) | locked))))
        page_after_free(h, p, locked);
}

/* ---- cross-thread frees ------------------------------------------------------ */
/* The `remote` list of a heap holds batches (struct cap_rbatch) and, where a
 * freeing thread has no batch to fill (it has no heap of its own yet, or
 * metadata ran out), lone blocks chained through their first word. The low
 * bit tells them apart: blocks are 16-byte aligned, batches 64. */
#define RLONE ((uintptr_t)1)

/* An empty batch from the thread's spares, else from the instance, which
 * then gives NVH_CAP_RSPARE / 2 more at once: a thread frees in bursts (a
 * batch of the program's hand-offs: hundreds of blocks) and its drains
 * return batches in bursts, so one lock per batch was a lock per 62 frees
 * (the xsmall/2 loop of bench/run cap: 30,000 of them per 2 M operations,
 * about 900 with this). */
static struct cap_rbatch *rbatch_get(struct cap_heap *h)
{
    struct cap_rbatch *b = h->rspare;
    if (b) {
        h->rspare = (struct cap_rbatch *)b->next;
        h->nspare--;
        b->next = 0;
        b->n = 0;
        return b;
    }
    struct cap_inst *cap = h->cap;
    pthread_mutex_lock(&cap->lock);
    b = nvh_cap_rbatch_new_(cap);
    for (unsigned i = 0; b && i < NVH_CAP_RSPARE / 2; i++) {
        struct cap_rbatch *x = nvh_cap_rbatch_new_(cap);
        if (!x)
            break;
        x->next = (uintptr_t)h->rspare;
        h->rspare = x;
        h->nspare++;
    }
    pthread_mutex_unlock(&cap->lock);
    return b;
}

/* A drained batch: kept for the owner's own cross-thread frees; past
 * NVH_CAP_RSPARE (a thread that only receives frees) half go back. */
static void rbatch_keep(struct cap_heap *h, struct cap_rbatch *b, bool locked)
{
    b->next = (uintptr_t)h->rspare;
    h->rspare = b;
    if (++h->nspare <= NVH_CAP_RSPARE)
        return;
    struct cap_inst *cap = h->cap;
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    while (h->nspare > NVH_CAP_RSPARE / 2) {
        struct cap_rbatch *x = h->rspare;
        h->rspare = (struct cap_rbatch *)x->next;
        h->nspare--;
        nvh_cap_rbatch_put_(cap, x);
    }
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}

/* A cross-thread double free found by the owner's drain: the block is
 * already free (not freed again). */
static NVH_CAP_NOINLINE void late_double(struct cap_inst *cap, struct cap_block *b)
{
    atomic_fetch_add_explicit(&cap->late_doubles, 1, memory_order_relaxed);
    if (cap->late_double)
        cap->late_double(cap, b);
}

/* A drained cross-thread free of b into its page: a whole block, or the
 * page's tail block (past its last whole block). Anything else past the
 * whole blocks was never handed out: dropped. */
NVH_CAP_INLINE void drain_one(struct cap_heap *h, struct cap_span *p, struct cap_block *b, bool locked)
{
    if (nvh_cap_likely((uintptr_t)b < p->end))
        local_free(h, p, b, locked);
    else if ((uintptr_t)b == p->end && p->tail == CAP_TAIL_USED)
        tail_release(h, p, locked);
}

/* Take the frees other threads pushed to h. */
static void heap_drain(struct cap_heap *h, bool locked)
{
    if (!atomic_load_explicit(&h->remote, memory_order_relaxed))
        return;
    uintptr_t x = atomic_exchange_explicit(&h->remote, 0, memory_order_acquire);
    struct cap_inst *cap = h->cap;
    while (x) {
        if (x & RLONE) {
            struct cap_block *b = (struct cap_block *)(x & ~RLONE);
            x = (uintptr_t)b->next;
            drain_one(h, nvh_cap_span_of_(cap, b), b, locked);
            continue;
        }
        struct cap_rbatch *rb = (struct cap_rbatch *)x;
        x = rb->next;
        uint32_t n = rb->n;
        /* the blocks sit in other cores' caches: ask for a few lines ahead */
        for (uint32_t i = 0; i < n && i < 16; i++)
            __builtin_prefetch(rb->blk[i], 1);
        /* the instance's fields in locals: the stores to the blocks could
         * alias them, and the loop would load them again for every block */
        const bool check = !cap->key_at_free;
        const uintptr_t secret = cap->secret, base = cap->base;
        _Atomic(struct cap_span *) *const map = cap->map;
        for (uint32_t i = 0; i < n; i++) {
            if (i + 16 < n)
                __builtin_prefetch(rb->blk[i + 16], 1);
            struct cap_block *b = rb->blk[i];
            if (check) {
                /* the freeing thread left the block alone: check it here */
                uintptr_t k = secret ^ (uintptr_t)b;
                if (nvh_cap_unlikely(b->key == k)) {
                    late_double(cap, b);
                    continue;
                }
                b->key = k;
            }
            struct cap_span *p = atomic_load_explicit(&map[((uintptr_t)b - base) >> NVH_CAP_BLOCK_SHIFT],
                                                      memory_order_relaxed);
            drain_one(h, p, b, locked);
        }
        rbatch_keep(h, rb, locked);
    }
}

static void orphan_drain(struct cap_heap *dest)
{
    struct cap_inst *cap = dest->cap;
    pthread_mutex_lock(&cap->lock);
    if (atomic_load(&dest->orphan))
        heap_drain(dest, true);
    pthread_mutex_unlock(&cap->lock);
}

/* Push a batch or a lone block (tagged); *link is its link word. */
static void remote_push(struct cap_heap *dest, uintptr_t item, uintptr_t *link)
{
    uintptr_t old = atomic_load_explicit(&dest->remote, memory_order_relaxed);
    do {
        *link = old;
    } while (!atomic_compare_exchange_weak_explicit(&dest->remote, &old, item, memory_order_release,
                                                    memory_order_relaxed));
    /* an orphan has no thread to drain it: drain it here (seq_cst pairs
     * with the orphaning thread's store of the flag and final drain) */
    if (nvh_cap_unlikely(atomic_load(&dest->orphan)))
        orphan_drain(dest);
}

static void remote_push_lone(struct cap_heap *dest, struct cap_block *b)
{
    remote_push(dest, (uintptr_t)b | RLONE, (uintptr_t *)&b->next);
}

static void remote_flush(struct cap_heap *h)
{
    struct cap_rbatch *rb = h->rout;
    if (rb && rb->n) {
        h->rout = NULL;
        remote_push(h->rdest, (uintptr_t)rb, &rb->next);
    }
}

/* Check and set a block's key: CAP_DOUBLE if it is already free. */
NVH_CAP_INLINE int key_set(struct cap_inst *cap, struct cap_block *b)
{
    uintptr_t k = key_of(cap, b);
    if (nvh_cap_unlikely(b->key == k))
        return CAP_DOUBLE;
    b->key = k;
    return CAP_OK;
}

/* A free by a thread that does not own the block's page. By default it
 * neither reads nor writes the block: the block was last written by the
 * owner (malloc, and usually the program's own writes there), so its line
 * is in the owner's cache, and a read here would take it across (a miss
 * per free, the largest cost of a cross-thread free) and the owner's drain
 * would take it back. The owner checks the key when it drains the batch
 * (cap->key_at_free explains the other mode). Lone blocks are chained
 * through their first word, so they are checked and keyed here. */
static NVH_CAP_NOINLINE int remote_free(struct cap_inst *cap, struct cap_heap *h, struct cap_span *p, struct cap_block *b)
{
    struct cap_heap *dest = p->heap;
    bool keyed = cap->key_at_free || !h;
    if (keyed && key_set(cap, b) != CAP_OK)
        return CAP_DOUBLE;
    if (!h) {
        remote_push_lone(dest, b);
        return CAP_OK;
    }
    if (h->rdest != dest) {
        remote_flush(h);
        h->rdest = dest;
    }
    struct cap_rbatch *rb = h->rout;
    if (nvh_cap_unlikely(!rb)) {
        if (!(rb = h->rout = rbatch_get(h))) {
            if (!keyed && key_set(cap, b) != CAP_OK)
                return CAP_DOUBLE;
            remote_push_lone(dest, b);
            return CAP_OK;
        }
    }
    rb->blk[rb->n++] = b;
    if (rb->n == NVH_CAP_RBATCH)
        remote_flush(h);
    return CAP_OK;
}

/* The common cross-thread free, inline in free: the thread has a heap and
 * a batch open for the block's owner, and the block is only queued. Batch
 * changes, a full batch and keying at free go through remote_free (a call
 * that saves and restores half a dozen registers: about half of this
 * path's instructions in the xsmall loop at 2 threads). */
NVH_CAP_INLINE int remote_free_fast(struct cap_inst *cap, struct cap_heap *h, struct cap_span *p,
                                    struct cap_block *b)
{
    struct cap_rbatch *rb;
    if (nvh_cap_likely(h != NULL && h->rdest == p->heap && (rb = h->rout) != NULL &&
                       rb->n < NVH_CAP_RBATCH - 1 && !cap->key_at_free)) {
        rb->blk[rb->n++] = b;
        return CAP_OK;
    }
    return remote_free(cap, h, p, b);
}

/* ---- malloc ----------------------------------------------------------------- */
NVH_CAP_INLINE void *take(struct cap_span *p)
{
    struct cap_block *b = p->free;
    p->free = b->next;
    p->used++;
    b->key = 0;
    return b;
}

/* Idle memory goes back every NVH_CAP_DECAY_MS, checked on the slow paths
 * (a page running dry, a block over NVH_CAP_CLASS_MAX): empty current pages,
 * the kept empty pages and large blocks go to the instance, which keeps
 * them mapped within its allowance (span.c decay_). So a program that freed
 * everything holds less than a tenth of its peak in the file at its first
 * slow path two windows later, and one that keeps allocating keeps its
 * pages. */
static void heap_release_caches(struct cap_heap *h, bool locked, bool all);

static NVH_CAP_NOINLINE void heap_decay_now(struct cap_heap *h, uint64_t t)
{
    struct cap_inst *cap = h->cap;
    /* no slow path for two windows: the kept large blocks all go back */
    bool idle = t - h->decay_ms >= 2u * NVH_CAP_DECAY_MS;
    h->decay_ms = t;
    remote_flush(h);
    heap_drain(h, false);
    for (unsigned c = 0; c < NVH_CAP_CLASSES; c++) {
        struct cap_span *p = h->cur[c];
        if (p != &cap_sentinel && p->used == 0) {
            h->cur[c] = &cap_sentinel;
            page_retire(h, p, false);
        }
    }
    heap_release_caches(h, false, idle);   /* the kept empty pages too */
    pthread_mutex_lock(&cap->lock);
    nvh_cap_span_decay_(cap);
    pthread_mutex_unlock(&cap->lock);
}

NVH_CAP_INLINE void heap_decay(struct cap_heap *h)
{
    uint64_t t = nvh_cap_now_ms_();
    if (nvh_cap_unlikely(t - h->decay_ms >= NVH_CAP_DECAY_MS))
        heap_decay_now(h, t);
}

/* A small heap (on the coarse grid) fills, in the file, about the most
 * blocks each class ever had live at once (alloc_slow), and with few blocks
 * per class those high-water marks stand well above the classes' means: in
 * the small loop of bench/run cap (2,000 blocks of 16 B .. 1 KiB) they are a
 * third of the live bytes. A class of 64 B .. 8 KiB whose blocks are all in
 * use, and that would carve never-used blocks of its page p (its current
 * page, or the avail page it is about to make current), first takes a free
 * block of the next coarse class up (a quarter bigger at most; the next
 * NVH_CAP_BORROW_UP classes, nearest first) from that class's current page
 * or one of its first avail pages, if that page lies below p: the classes then
 * fill their high-water marks together, which is less than filling each
 * apart (a sum of peaks is more than the peak of the sum). The block stays
 * one of its page's (free and usable size follow the page). Not for an
 * aligned request (exact): a block of another class need not have the
 * alignment of the class asked for. Only in a heap of less than
 * NVH_CAP_BORROW_BYTES of pages: a bigger heap's classes hold more blocks
 * each, their high-water marks closer to their means, and a heap that
 * carves a lot (blocks in flight to other threads) would pay a slow path
 * per borrowed block where carving gives it 4 KiB of blocks at once. For
 * that reason too a class carves its first blocks itself: one that lived on
 * borrowed blocks alone (a few blocks per class, freed and asked for again,
 * as in the xsmall loop) would take a slow path for each. Only from a page
 * below p, and never instead of a new page: blocks lent from pages higher
 * up keep those pages, and the top of the range, in use after the heap
 * shrank ([Moraru11] Table 2 at 1/1: 63 % total fragmentation against
 * 57.5 % without borrowing; 57.1 % lending only from below). Lending only
 * to a current page, only from the lender's current page, left the small
 * loop's file at 1.41-1.59 x live over 40 seeds; with the avail pages on
 * both sides 1.36-1.55 x; lending from three classes up (and punching every
 * kept page of a small heap) 1.27-1.44 x, but
 * each borrowed block is a slow path, and the loop's CPU time rose by a
 * fifth (docs/CAP.md). */
static void *borrow(struct cap_heap *h, unsigned c, const struct cap_span *p, bool exact)
{
    size_t cs = class_size(c);
    if (exact || h->page_bytes >= NVH_CAP_BORROW_BYTES || cs < 64 || cs >= NVH_CAP_SMALL_MAX)
        return NULL;
    for (unsigned up = 0; up < NVH_CAP_BORROW_UP && cs < NVH_CAP_SMALL_MAX; up++) {
        unsigned n = size_class(class_round(cs + 1, NVH_CAP_COARSE_SHIFT));
        cs = class_size(n);
        struct cap_span *q = h->cur[n];
        if (q->free && q->start < p->start)
            return take(q);
        /* the lender's other pages with freed blocks (the first few) */
        unsigned k = 0;
        for (q = h->avail[n]; q && k < 4; q = q->next, k++) {
            if (q->free && q->start < p->start) {
                void *b = take(q);
                if (!q->free && q->bump >= q->end) {   /* an avail page has a block to give */
                    avail_remove(h, q);
                    q->pstate = CAP_PG_FULL;
                }
                return b;
            }
        }
    }
    return NULL;
}

static NVH_CAP_NOINLINE void *alloc_slow(struct cap_heap *h, unsigned c, bool exact)
{
    heap_decay(h);
    remote_flush(h);
    heap_drain(h, false);
    struct cap_span *p = h->cur[c];
    if (p->free)
        return take(p);
    if (p != &cap_sentinel && p->bump < p->end && p->used) {
        /* Freed blocks of the class's other pages before never-used ones:
         * carving touches new pages, and the file would then hold more than
         * the most blocks the class ever had live (docs/CAP.md, file space
         * of small heaps). The current page waits in the avail list with its
         * never-used blocks (an avail page has free or never-used blocks;
         * one that empties is retired as any avail page). */
        struct cap_span *q = h->avail[c];
        for (unsigned k = 0; q && !q->free && k < 4; k++)
            q = q->next;
        if (q && q->free) {
            avail_remove(h, q);
            avail_push(h, p);
            q->pstate = CAP_PG_CUR;
            h->cur[c] = q;
            return take(q);
        }
    }
    /* a free tail of another page before never-used blocks (tail_take) */
    struct cap_span *t = h->tails[c];
    if (t)
        return tail_take(h, t);
    void *b;
    if (p != &cap_sentinel) {
        if (p->bump < p->end && p->bump > p->start && (b = borrow(h, c, p, exact)))
            return b;
        if (page_extend(h, p))
            return take(p);
        p->pstate = CAP_PG_FULL;
    }
    p = avail_lowest(h, c);
    if (p) {
        avail_remove(h, p);
        p->pstate = CAP_PG_CUR;
        h->cur[c] = p;
        if (p->free)
            return take(p);
        if (p->bump > p->start && (b = borrow(h, c, p, exact)))
            return b;
        if (page_extend(h, p))
            return take(p);
    }
    p = page_new(h, c);
    if (!p) {
        h->cur[c] = &cap_sentinel;
        errno = ENOMEM;
        return NULL;
    }
    h->cur[c] = p;
    page_extend(h, p);
    return take(p);
}

/* exact: a block of class c itself (an aligned request; see borrow) */
NVH_CAP_INLINE void *alloc_class(struct cap_heap *h, unsigned c, bool exact)
{
    struct cap_span *p = h->cur[c];
    if (nvh_cap_likely(p->free != NULL))
        return take(p);
    return alloc_slow(h, c, exact);
}

/* A large block at the top of the range, for a block that grows by realloc:
 * it can then go on growing in place. The thread's kept grown block comes
 * first: a program that grows a buffer, frees it and grows the next one
 * (a request, a line, a message) then reuses it whole, mapped, at once as
 * big as the last one grew, with no call to the span allocator at all (its
 * lock was a quarter of such a loop's time), if it has the room asked for. */
static void *large_alloc_top(struct cap_heap *h, size_t size)
{
    struct cap_inst *cap = h->cap;
    if (size > cap->size)
        return NULL;
    struct cap_span *k = h->rkeep;
    if (k) {
        h->rkeep = NULL;
        if (((size_t)k->blocks << NVH_CAP_BLOCK_SHIFT) >= size) {
            k->cached = 0;
            k->roomy = 2;   /* taken whole: no move while it fits (realloc) */
            return (void *)k->start;
        }
        pthread_mutex_lock(&cap->lock);
        nvh_cap_span_free_(cap, k);
        pthread_mutex_unlock(&cap->lock);
    }
    uint32_t n = (uint32_t)((size + NVH_CAP_BLOCK - 1) >> NVH_CAP_BLOCK_SHIFT);
    bool zero;
    pthread_mutex_lock(&cap->lock);
    struct cap_span *s = nvh_cap_span_alloc_top_(cap, n, CAP_SPAN_LARGE, &zero);
    pthread_mutex_unlock(&cap->lock);
    if (!s)
        return NULL;
    s->roomy = 1;
    s->heap = h;
    nvh_cap_lkeep_took_(h, s);
    return (void *)s->start;
}

/* Large blocks are rounded up to large classes (cap.h), so that a freed
 * block, kept whole in a thread's cache or the instance's (span.c), serves
 * the next request of its class on pages that are still mapped. */
static void *large_alloc(struct cap_heap *h, size_t size, size_t align, bool *zero_out)
{
    struct cap_inst *cap = h->cap;
    size_t pad = align > NVH_CAP_BLOCK ? align - NVH_CAP_BLOCK : 0;
    if (size > cap->size || size + pad > cap->size) {
        errno = ENOMEM;
        return NULL;
    }
    uint32_t n = nvh_cap_large_round_((uint32_t)((size + pad + NVH_CAP_BLOCK - 1) >> NVH_CAP_BLOCK_SHIFT));
    bool zero = false;
    heap_decay(h);
    /* the heap's kept blocks (those its thread freed), else the instance's */
    struct cap_span *s = nvh_cap_lkeep_take_(h, n, NVH_CAP_LCACHE_REACH);
    if (!s) {
        pthread_mutex_lock(&cap->lock);
        s = nvh_cap_span_reuse_(cap, n);
        if (!s)
            s = nvh_cap_span_alloc_(cap, n, CAP_SPAN_LARGE, &zero);
        pthread_mutex_unlock(&cap->lock);
        if (!s) {
            errno = ENOMEM;
            return NULL;
        }
        s->heap = h;
    }
    nvh_cap_lkeep_took_(h, s);
    uintptr_t user = s->start;
    if (align > NVH_CAP_BLOCK)
        user = (user + align - 1) & ~(uintptr_t)(align - 1);
    nvh_cap_span_set_user_(cap, s, user);
    if (zero)
        populate(cap, s->start, (size_t)s->blocks << NVH_CAP_BLOCK_SHIFT);
    if (zero_out)
        *zero_out = zero;
    return (void *)user;
}

/* A free of a large block by the calling thread's heap h (NULL: it has
 * none, the instance takes the block): the freeing heap keeps it (large.c). */
static void large_free(struct cap_inst *cap, struct cap_heap *h, struct cap_span *s)
{
    if (h && s->heap != h)
        nvh_cap_lkeep_adopt_(h, s);
    nvh_cap_large_free_own_(cap, h, s, false);
}

/* The class of a request in h: on h's grid (class_round). Up to CAP_LINEAR
 * (the sizes most programs ask for most) by (size + 15) / 16: on the fine
 * grid that is the class, on the coarse one a table gives it (coarse_small),
 * a load instead of class_round's arithmetic on malloc's fast path. */
NVH_CAP_INLINE unsigned heap_class(const struct cap_heap *h, size_t size)
{
    if (nvh_cap_likely(size <= CAP_LINEAR)) {
        unsigned i = (unsigned)((size + 15) >> 4) | (size == 0);
        return size <= h->fine_max ? i : coarse_small[i];
    }
    unsigned grid = size <= h->fine_max ? NVH_CAP_CLASS_SHIFT : NVH_CAP_COARSE_SHIFT;
    return size_class(class_round(size, grid));
}

NVH_CAP_INLINE void *cap_alloc(struct cap_heap *h, size_t size)
{
    if (nvh_cap_likely(size <= NVH_CAP_CLASS_MAX))
        return alloc_class(h, heap_class(h, size), false);
    return large_alloc(h, size, 0, NULL);
}

void *nvh_cap_alloc_(struct cap_heap *h, size_t size)
{
    return cap_alloc(h, size);
}

void *nvh_cap_alloc_aligned_(struct cap_heap *h, size_t size, size_t alignment)
{
    if (alignment <= 16)
        return nvh_cap_alloc_(h, size);
    if (alignment <= NVH_CAP_BLOCK && size <= NVH_CAP_CLASS_MAX) {
        /* a class whose size is a multiple of the alignment: every block of
         * its pages is aligned (pages start on 4 KiB) */
        unsigned c = size_class(size < alignment ? alignment : size);
        while (c < NVH_CAP_CLASSES && class_size(c) % alignment)
            c++;
        if (c < NVH_CAP_CLASSES)
            return alloc_class(h, c, true);
    }
    return large_alloc(h, size, alignment, NULL);
}

void *nvh_cap_calloc_(struct cap_heap *h, size_t size)
{
    if (size <= NVH_CAP_CLASS_MAX) {
        void *p = alloc_class(h, heap_class(h, size), false);
        if (p)
            memset(p, 0, size);
        return p;
    }
    bool zero = false;
    void *p = large_alloc(h, size, 0, &zero);
    if (p && !zero)
        memset(p, 0, size);
    return p;
}

/* ---- free --------------------------------------------------------------------- */
/* Whether p, whose map entry is the free span s, is the start of a block
 * that went into s when it was freed: 4 KiB aligned (every page and large
 * block starts so), inside s, and for the range given back above the top
 * (cap->above_top, whose entries stay where the range grows again under
 * large blocks) above the top now. */
static bool freed_block(const struct cap_inst *cap, const struct cap_span *s, const void *p)
{
    uintptr_t off = (uintptr_t)p - s->start;
    if (off % NVH_CAP_BLOCK || off >= ((uintptr_t)s->blocks << NVH_CAP_BLOCK_SHIFT))
        return false;
    return s != &cap->above_top ||
           (uintptr_t)p - cap->base >= atomic_load_explicit(&cap->top_hint, memory_order_relaxed);
}

static NVH_CAP_NOINLINE int free_other(struct cap_inst *cap, struct cap_span *s, void *p)
{
    switch (s->kind) {
    case CAP_SPAN_LARGE:
        if ((uintptr_t)p != s->user)
            return CAP_INVALID;
        if (s->cached)
            return CAP_DOUBLE;
        large_free(cap, nvh_cap_heap_peek_(cap), s);
        return CAP_OK;
    case CAP_SPAN_FREE:
        /* the start of a block that coalesced into this free span */
        return freed_block(cap, s, p) ? CAP_DOUBLE : CAP_INVALID;
    default:
        return CAP_INVALID;
    }
}

/* The owner's free of a block past its page's carving front: the page's
 * tail block, or one never handed out (invalid). */
static NVH_CAP_NOINLINE int free_tail(struct cap_inst *cap, struct cap_heap *h, struct cap_span *s,
                                      struct cap_block *b)
{
    if ((uintptr_t)b != s->end || s->tail != CAP_TAIL_USED)
        return CAP_INVALID;
    b->key = key_of(cap, b);
    tail_release(h, s, false);
    return CAP_OK;
}

NVH_CAP_INLINE int cap_free(struct cap_inst *cap, void *p)
{
    struct cap_span *s = nvh_cap_span_of_(cap, p);
    if (nvh_cap_unlikely(!s))
        return CAP_INVALID;
    if (nvh_cap_likely(s->kind == CAP_SPAN_PAGE)) {
        uintptr_t off = (uintptr_t)p - s->start;
        if (nvh_cap_unlikely(((off * s->inv) >> 40) * s->bsize != off ||
                             off >= ((uintptr_t)s->blocks << NVH_CAP_BLOCK_SHIFT)))
            return CAP_INVALID;
        struct cap_block *b = p;
        struct cap_heap *h = nvh_cap_heap_peek_(cap);
        if (nvh_cap_likely(s->heap == h)) {
            if (nvh_cap_unlikely(b->key == key_of(cap, p)))
                return CAP_DOUBLE;
            if (nvh_cap_unlikely((uintptr_t)p >= s->bump))
                return free_tail(cap, h, s, b);   /* or never handed out */
            b->key = key_of(cap, p);
            local_free(h, s, b, false);
            return CAP_OK;
        }
        return remote_free_fast(cap, h, s, b);
    }
    return free_other(cap, s, p);
}

int nvh_cap_free_(struct cap_inst *cap, void *p)
{
    return cap_free(cap, p);
}

/* the span of a live pointer, or NULL */
static struct cap_span *live_span(struct cap_inst *cap, const void *p, int *bad)
{
    struct cap_span *s = nvh_cap_span_of_(cap, p);
    *bad = CAP_INVALID;
    if (!s)
        return NULL;
    if (s->kind == CAP_SPAN_PAGE) {
        uintptr_t off = (uintptr_t)p - s->start;
        if (((off * s->inv) >> 40) * s->bsize != off ||
            off >= ((uintptr_t)s->blocks << NVH_CAP_BLOCK_SHIFT))
            return NULL;
        if (((const struct cap_block *)p)->key == key_of(cap, p)) {
            *bad = CAP_DOUBLE;
            return NULL;
        }
        if ((uintptr_t)p >= s->end && ((uintptr_t)p != s->end || s->tail != CAP_TAIL_USED))
            return NULL;   /* past the whole blocks, and not a live tail */
        return s;
    }
    if (s->kind == CAP_SPAN_LARGE && (uintptr_t)p == s->user) {
        if (!s->cached)
            return s;
        *bad = CAP_DOUBLE;
    }
    if (s->kind == CAP_SPAN_FREE && freed_block(cap, s, p))
        *bad = CAP_DOUBLE;
    return NULL;
}

static inline size_t span_usable(const struct cap_span *s, const void *p)
{
    if (s->kind == CAP_SPAN_PAGE)
        return (uintptr_t)p < s->end ? s->bsize : class_size(s->tcls);
    return s->start + ((uintptr_t)s->blocks << NVH_CAP_BLOCK_SHIFT) - s->user;
}

size_t nvh_cap_usable_(struct cap_inst *cap, const void *p)
{
    int bad;
    struct cap_span *s = live_span(cap, p, &bad);
    return s ? span_usable(s, p) : 0;
}

void *nvh_cap_realloc_(struct cap_heap *h, void *p, size_t size, int *bad)
{
    struct cap_inst *cap = h->cap;
    struct cap_span *s = live_span(cap, p, bad);
    if (!s)
        return NULL;
    *bad = CAP_OK;
    size_t usable = span_usable(s, p);
    /* a roomy block (grown by realloc) keeps its headroom while it shrinks
     * a little: it is likely to grow again */
    bool roomy = s->kind == CAP_SPAN_LARGE && s->roomy;
    if (size <= usable && (size >= usable / 2 || usable <= 64 || (roomy && size >= usable / 8) ||
                           (roomy && s->roomy == 2)))
        return p;
    /* Growth keeps headroom: a block that grows is likely to grow again (by
     * half in a size class, doubling in a span of its own: untouched pages of
     * the headroom cost no file space), so a growing buffer is copied or its
     * span grown a logarithmic number of times. */
    size_t want = size;
    if (size > usable) {
        size_t extra = size > NVH_CAP_SMALL_MAX ? size : size / 2;
        if (extra < cap->size / 4)
            want = size + extra;
    }
    if (s->kind == CAP_SPAN_LARGE && size > usable && s->user == s->start) {
        /* grow in place into a free neighbour or the top of the range */
        uint32_t n = (uint32_t)((size + NVH_CAP_BLOCK - 1) >> NVH_CAP_BLOCK_SHIFT);
        uint32_t nw = (uint32_t)((want + NVH_CAP_BLOCK - 1) >> NVH_CAP_BLOCK_SHIFT);
        pthread_mutex_lock(&cap->lock);
        bool ok = nvh_cap_span_grow_(cap, s, nw) || (nw > n && nvh_cap_span_grow_(cap, s, n));
        pthread_mutex_unlock(&cap->lock);
        if (ok) {
            s->roomy = 1;
            return p;
        }
    }
    /* a block that grows past a page moves to a span at the top of the
     * range, where its next growths are in place (no copy) */
    void *q = size > usable && want > NVH_CAP_BLOCK ? large_alloc_top(h, want) : nvh_cap_alloc_(h, want);
    if (!q && want > size)
        q = nvh_cap_alloc_(h, size);
    if (!q)
        return NULL;
    memcpy(q, p, size < usable ? size : usable);
    nvh_cap_free_(cap, p);
    return q;
}

/* ---- thread exit, trim ------------------------------------------------------------ */
/* The heap's kept pages and blocks go to the instance; its kept large
 * blocks all of them, or (!all, a decay) those it did not need lately. */
static void heap_release_caches(struct cap_heap *h, bool locked, bool all)
{
    struct cap_inst *cap = h->cap;
    if (!h->lk.bytes && !h->nempty && !h->rkeep)
        return;
    if (!locked)
        pthread_mutex_lock(&cap->lock);
    if (h->rkeep) {
        nvh_cap_span_free_(cap, h->rkeep);
        h->rkeep = NULL;
    }
    nvh_cap_lkeep_release_(h, all, true);
    while (h->nempty) {
        struct cap_span *p = h->empty[--h->nempty];
        empty_unkeep(h, p);
        p->heap = NULL;
        h->page_bytes -= (size_t)p->blocks << NVH_CAP_BLOCK_SHIFT;
        fine_update(h);
        nvh_cap_span_free_(cap, p);
    }
    if (!locked)
        pthread_mutex_unlock(&cap->lock);
}

static void heap_abandon(struct cap_heap *h)
{
    struct cap_inst *cap = h->cap;
    remote_flush(h);
    h->rdest = NULL;
    heap_drain(h, false);
    heap_release_caches(h, false, true);
    pthread_mutex_lock(&cap->lock);
    if (h->rout) {
        nvh_cap_rbatch_put_(cap, h->rout);
        h->rout = NULL;
    }
    while (h->rspare) {
        struct cap_rbatch *x = h->rspare;
        h->rspare = (struct cap_rbatch *)x->next;
        nvh_cap_rbatch_put_(cap, x);
    }
    h->nspare = 0;
    atomic_store(&h->orphan, 1);
    heap_drain(h, true);
    /* empty current pages go back; pages with live blocks wait for their
     * frees (drained by whoever frees into an orphan) or for an adopter */
    for (unsigned c = 0; c < NVH_CAP_CLASSES; c++) {
        struct cap_span *p = h->cur[c];
        if (p != &cap_sentinel && p->used == 0) {
            h->cur[c] = &cap_sentinel;
            page_retire(h, p, true);
        }
    }
    h->orphan_next = cap->orphans;
    cap->orphans = h;
    nvh_cap_span_settle_(cap);
    pthread_mutex_unlock(&cap->lock);
}

void nvh_cap_thread_exit_(void)
{
    for (unsigned i = 0; i < NVH_CAP_INSTANCES; i++) {
        struct cap_heap *h = tl_heap[i];
        uint64_t gen = tl_gen[i];
        if (!h)
            continue;
        tl_heap[i] = NULL;
        tl_gen[i] = 0;
        pthread_mutex_lock(&ids_lock);
        bool live = gen && live_gen[i] == gen;
        pthread_mutex_unlock(&ids_lock);
        if (live)
            heap_abandon(h);
    }
}

void nvh_cap_trim_(struct cap_inst *cap)
{
    struct cap_heap *h = nvh_cap_heap_peek_(cap);
    if (h) {
        remote_flush(h);
        heap_drain(h, false);
        for (unsigned c = 0; c < NVH_CAP_CLASSES; c++) {
            struct cap_span *p = h->cur[c];
            if (p != &cap_sentinel && p->used == 0) {
                h->cur[c] = &cap_sentinel;
                page_retire(h, p, false);
            }
        }
        heap_release_caches(h, false, true);
    }
    pthread_mutex_lock(&cap->lock);
    nvh_cap_span_purge_(cap);
    pthread_mutex_unlock(&cap->lock);
}
