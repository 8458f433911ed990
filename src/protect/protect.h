/* protect.h — internals of the stray-write protection layer (src/protect),
 * and the calls other layers use to keep their own writes inside windows.
 *
 * Model (docs/PROTECT.md has the long version). Every page of a protected
 * pool has
 *   count[page]    open write windows (unprotect +1, protect -1); the page
 *                  SHOULD be writable iff count > 0
 *   state bit      the protection last applied to the page (1 = writable).
 *                  Invariant: bit 0 => the page IS read-only. Bit 1 may
 *                  be stale (really read-only), which only costs a fault.
 *   pending bit    the page sits in the async request queue, or in the
 *                  applier's carry list (below)
 *   ref bit        async: a window on the page closed since the applier last
 *                  looked at it ("used this interval")
 * Every "applier" (the sync path, the async service thread, a producer that
 * found the queue full) holds pr->apply_lock and RECONCILES: it sets each
 * page it looks at to what its count says at that moment, never to what a
 * request said. Requests are only hints that a page may need a look, so a
 * protect/unprotect pair queued in one interval cancels by itself (count back
 * to 0, state still read-only: nothing to do). The SIGSEGV handler is the
 * one applier without the lock: it only ever makes a page writable whose
 * count is > 0 (or whose thread is in an internal window), re-checks the
 * count afterwards, never clears a state bit, and bumps fault_seq so an
 * applier whose pass it raced redoes that pass by force (apply.c). Its races
 * can cost a spurious fault, never leave a page writable with no window open.
 *
 * Second chance (async, unless NVH_PROTECT_STRICT): a queued page whose
 * count is 0 but whose ref bit is set is not protected by that pass: the
 * applier clears ref and carries the page (pending still set) to the next
 * pass, which protects it unless a window on it closed again meanwhile. So a
 * hot page stays writable for as long as it is used at least once per
 * interval: no protect mprotect, no fault, no queue entry (it stays pending).
 * A page is protected between one and two intervals after its last window
 * closed. nvh_protect_sync and mode changes flush (ignore ref).
 *
 * Lock-free pairs (all seq_cst, Dekker style), which let producers skip work:
 *   producer: count RMW, then test-and-set pending  | applier: clear pending, then load count
 *   producer: count RMW, then load state            | applier: store state, then load count
 */
#ifndef NVH_PROTECT_H
#define NVH_PROTECT_H

#include "../common/internal.h"

#include <signal.h>
#include <stdatomic.h>

/* --------------------------------------------------------------------------
 * Calls for the other layers (allocator, logs, transactions, containers)
 * --------------------------------------------------------------------------
 * Two ways to keep a library write legal while the pool is protected:
 *
 *   explicit   nvh_protect_open_(pool, p, len) ... stores ... nvh_protect_close_(pool, p, len)
 *              the same counted windows as the public nvh_unprotect/nvh_protect
 *              (cheap when protection is off: one load and a branch).
 *   implicit   nvh_protect_internal_begin(pool) ... any stores into any
 *              protected pool ... nvh_protect_internal_end(pool)
 *              a thread-local "inside the library" window: a fault of this
 *              thread on a protected pool page opens a window on that page
 *              (the handler does it) and _end closes them all. Nestable. One
 *              fault per page first written, so for cold paths (open, close,
 *              recovery, rare metadata) rather than per-operation hot paths. */
struct nvh_protect;
int nvh_protect_open_slow_(nvh_pool *pool, const void *p, size_t len);
int nvh_protect_close_slow_(nvh_pool *pool, const void *p, size_t len);
void nvh_protect_internal_begin(nvh_pool *pool);
void nvh_protect_internal_end(nvh_pool *pool);
/* Pool hooks (src/pool/pool.c: grow, file close). */
void nvh_protect_grow_(nvh_pool *pool, uint64_t old_size, uint64_t new_size);
void nvh_protect_detach_(nvh_pool *pool);
/* At open/create (src/lifecycle): apply NVHEAP_PROTECT=off|sync|async[:interval_ns]
 * if set. Read-only and sim-domain pools are left alone. NVH_E_INVAL for a
 * value it cannot parse. */
int nvh_protect_env_apply_(nvh_pool *pool);

/* --------------------------------------------------------------------------
 * The window cache's hit path, inline (async mode; the model is in cache.c)
 * --------------------------------------------------------------------------
 * Most window calls of a busy structure are on pages the calling thread
 * used within the last interval: its window cache holds a unit of the page
 * (open) or the entry that opened the window (close), and the call is a
 * few plain loads and stores on one line of the thread's table. That case
 * is decided here, inline in the caller: the out-of-line path (three calls
 * deep, with the range resolution and the mode checks) would be most of
 * a cached call's cost. Every other case (no table
 * yet, the page not in the table, no unit held, the service holding the
 * table, a range over two pages, protection off or sync) returns false and
 * the caller takes the out-of-line path, which decides it in full.
 *
 * Why the hit path needs no check of the mode or of the cache's id: a table
 * is only ever created while the pool is in async mode with the cache on,
 * and every change that turns the cache off (async -> sync or off, STRICT,
 * NO_CACHE, a short interval, pool close) first kills every table: its
 * `steal` is set and stays set, its entries are emptied, and the change
 * waits until no call is inside it. pr_tc_enter below reads `steal` after
 * announcing itself in `busy`, so a live table means the cache is on for
 * this very enabling (and a dead one holds no entry a look-up could find).
 * nvh_unprotect / nvh_protect try the same hit path first. */
#define PR_TC_SLOTS 16384u
#define PR_TC_WAYS 8u                /* set-associative: ways of a set    */
#define PR_TC_UNITS_MAX 0xfffu
/* An entry is one word: (page + 1) << 24 | opened << 13 | touched << 12 |
 * units (page + 1: an empty entry, 0, never matches a page).
 * units: window-count units held; opened: windows opened with a held unit
 * and not yet closed through this entry (their closes need no check against
 * the shared count); touched: a window call on the page since the service
 * last looked. 0 = empty. */
#define PR_TC_TOUCHED ((uint64_t)1 << 12)
#define PR_TC_OPEN_SHIFT 13u
#define PR_TC_OPEN_MAX 0x7ffu
#define PR_TC_PAGE_SHIFT 24u
/* Sets of PR_TC_WAYS entries, one 64 B line each, picked by a hash of the
 * page number (pr_tc_set_of). */
#define PR_TC_SETS (PR_TC_SLOTS / PR_TC_WAYS)
#define PR_TC_SET_BITS 11u
_Static_assert((1u << PR_TC_SET_BITS) == PR_TC_SETS, "PR_TC_SET_BITS");
_Static_assert(PR_TC_WAYS * sizeof(uint64_t) == 64, "a set is one cache line");

typedef struct pr_tc_entry {
    _Atomic uint64_t word;
} pr_tc_entry;

/* One thread's table for one pool (cache.c allocates, links and ages them). */
typedef struct pr_tcache {
    _Alignas(64) _Atomic uint32_t busy;      /* owner: inside a cached call     */
    _Atomic uint32_t steal;                  /* service: hands off (stays set
                                                once the table is dead)         */
    _Atomic uint32_t nonempty;               /* owner sets, service clears      */
    struct nvh_protect *pr;                  /* under the cache lock; NULL = dead */
    struct pr_tcache *next, *prev;           /* the pool's list, under the lock */
    _Alignas(64) pr_tc_entry e[PR_TC_SLOTS];
} pr_tcache;

/* The calling thread's table of the pool it used last (set by cache.c's
 * look-up, cleared when the owner frees that table): what the hit path
 * reads instead of searching the thread's tables. pool and base are only
 * compared and subtracted; nothing is dereferenced through them unless the
 * table is live. */
typedef struct pr_tc_hot {
    const nvh_pool *pool;
    const char *base;            /* the pool's mapping                        */
    pr_tcache *tc;
} pr_tc_hot;
extern _Thread_local pr_tc_hot nvh_protect_tc_hot_ __attribute__((tls_model("initial-exec")));

static inline uint64_t pr_tc_set_of(uint64_t page)
{
    /* Fibonacci hashing: the pages a tree uses come in runs (a batch of
     * nodes is 16 adjacent pages, between slabs of records), which the low
     * bits of the page number spread unevenly over the sets (measured:
     * 20% of the sets full and 20% empty) */
    return (page * 0x9e3779b97f4a7c15ull) >> (64u - PR_TC_SET_BITS);
}
static inline pr_tc_entry *pr_tc_set(pr_tcache *tc, uint64_t page)
{
    return &tc->e[pr_tc_set_of(page) * PR_TC_WAYS];
}
/* The entry of `page` in its set (one 64 B line), or NULL. */
static inline pr_tc_entry *pr_tc_lookup(pr_tc_entry *set, uint64_t page)
{
    uint64_t tag = page + 1u;
    for (unsigned i = 0; i < PR_TC_WAYS; i++)
        if ((atomic_load_explicit(&set[i].word, memory_order_relaxed) >> PR_TC_PAGE_SHIFT) == tag)
            return &set[i];
    return NULL;
}
/* Enter a cached call: false if the service holds the table (or it is
 * dead). The StoreLoad barrier between the busy store and the steal load
 * is the service's membarrier (cache.c, top). */
static inline bool pr_tc_enter(pr_tcache *tc)
{
    atomic_store_explicit(&tc->busy, 1, memory_order_relaxed);
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(atomic_load_explicit(&tc->steal, memory_order_acquire) == 0, 1))
        return true;
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
    return false;
}
static inline void pr_tc_leave(pr_tcache *tc)
{
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&tc->busy, 0, memory_order_release);
}
/* The page of [p, p+len) if the range lies in one page of the pool the hot
 * record names, else false. */
static inline bool pr_tc_hot_page(const nvh_pool *pool, const void *p, size_t len,
                                  const pr_tc_hot *h, uint64_t *page)
{
    if (h->pool != pool || len == 0) return false;
    uint64_t off = (uint64_t)((uintptr_t)p - (uintptr_t)h->base);
    uint64_t last = off + len - 1;
    if ((off >> 12) != (last >> 12) || last < off ||
        last >= atomic_load_explicit(&pool->ctx.size, memory_order_relaxed))
        return false;
    *page = off >> 12;
    return true;
}
/* The entry of `page` in its set, trying the way *way first: the caller's
 * memory of where the page was found last. The way a page sits in is
 * random, so the scan's exit branch mispredicts on most calls (~13 cycles
 * of a ~25-cycle hit); a right hint is one compare and a predicted branch.
 * *way is updated to the way found; a wrong or stale hint costs the scan.
 * Any value is safe: only its low 3 bits are used, within the set. */
static inline pr_tc_entry *pr_tc_lookup_hinted(pr_tc_entry *set, uint64_t page, uint8_t *way)
{
    unsigned w = *way & (PR_TC_WAYS - 1u);
    if (__builtin_expect((atomic_load_explicit(&set[w].word, memory_order_relaxed) >> PR_TC_PAGE_SHIFT) ==
                             page + 1u, 1))
        return &set[w];
    pr_tc_entry *e = pr_tc_lookup(set, page);
    if (e) *way = (uint8_t)(e - set);
    return e;
}
/* A hit moves one unit between the entry's held units and its opened
 * windows. open: a held unit is taken for a new window; close: a window
 * this table's unit opened is closed and the unit kept. way: a hint for
 * pr_tc_lookup_hinted, or NULL. */
static inline bool pr_tc_hit(nvh_pool *pool, const void *p, size_t len, bool open, uint8_t *way)
{
    const pr_tc_hot *h = &nvh_protect_tc_hot_;
    uint64_t page;
    if (!pr_tc_hot_page(pool, p, len, h, &page)) return false;
    pr_tcache *tc = h->tc;
    if (!pr_tc_enter(tc)) return false;
    pr_tc_entry *set = pr_tc_set(tc, page);
    pr_tc_entry *e = way ? pr_tc_lookup_hinted(set, page, way) : pr_tc_lookup(set, page);
    uint64_t w = e ? atomic_load_explicit(&e->word, memory_order_relaxed) : 0;
    uint64_t units = w & PR_TC_UNITS_MAX, opened = (w >> PR_TC_OPEN_SHIFT) & PR_TC_OPEN_MAX;
    const uint64_t one_open = (uint64_t)1 << PR_TC_OPEN_SHIFT;
    bool hit = open ? units != 0 && opened != PR_TC_OPEN_MAX
                    : opened != 0 && units != PR_TC_UNITS_MAX;
    if (hit)
        atomic_store_explicit(&e->word, (open ? w - 1 + one_open : w + 1 - one_open) | PR_TC_TOUCHED,
                              memory_order_relaxed);
    pr_tc_leave(tc);
    return hit;
}
static inline bool pr_tc_open_hit(nvh_pool *pool, const void *p, size_t len)
{
    return pr_tc_hit(pool, p, len, true, NULL);
}
static inline bool pr_tc_close_hit(nvh_pool *pool, const void *p, size_t len)
{
    return pr_tc_hit(pool, p, len, false, NULL);
}

/* The explicit windows of the layers, as nvh_unprotect/nvh_protect but
 * inline (the window cache's hit path in the caller), optionally with a way
 * hint (pr_tc_lookup_hinted; NULL: none): for a caller that opens and
 * closes windows on the same pages again and again and can keep one byte
 * per page (the B+ tree: in a leaf's companion for the open, in the pending
 * insert for the close). Initialise the byte to anything; the call keeps it
 * up to date. Same semantics with or without. */
static inline int nvh_protect_open_way_(nvh_pool *pool, const void *p, size_t len, uint8_t *way)
{
    if (__builtin_expect(atomic_load_explicit(&pool->protect, memory_order_acquire) == NULL, 1))
        return NVH_OK;
    if (pr_tc_hit(pool, p, len, true, way)) return NVH_OK;
    return nvh_protect_open_slow_(pool, p, len);
}
static inline int nvh_protect_close_way_(nvh_pool *pool, const void *p, size_t len, uint8_t *way)
{
    if (__builtin_expect(atomic_load_explicit(&pool->protect, memory_order_acquire) == NULL, 1))
        return NVH_OK;
    if (pr_tc_hit(pool, p, len, false, way)) return NVH_OK;
    return nvh_protect_close_slow_(pool, p, len);
}
static inline int nvh_protect_open_(nvh_pool *pool, const void *p, size_t len)
{
    return nvh_protect_open_way_(pool, p, len, NULL);
}
static inline int nvh_protect_close_(nvh_pool *pool, const void *p, size_t len)
{
    return nvh_protect_close_way_(pool, p, len, NULL);
}
/* A hint: a window on the page of p is about to be opened or closed (async
 * mode: the thread's window-cache line for that page is fetched, so the
 * call finds it in the cache; a random leaf page's line is otherwise a
 * cache miss inside the call). Nothing else happens; no effect on the
 * protection. A dead table is still its owner's memory until the owner
 * frees it, which clears the hot record first. */
static inline void nvh_protect_prefetch_(nvh_pool *pool, const void *p)
{
    if (__builtin_expect(atomic_load_explicit(&pool->protect, memory_order_relaxed) == NULL, 1))
        return;
    const pr_tc_hot *h = &nvh_protect_tc_hot_;
    uint64_t page;
    if (pr_tc_hot_page(pool, p, 1, h, &page)) __builtin_prefetch(pr_tc_set(h->tc, page), 1);
}
/* Protection epoch of the pool: 0 while protection is off, else a number
 * that changes whenever the window counts are reset (protection turned off,
 * which forgets every window). */
uint64_t nvh_protect_epoch_(nvh_pool *pool);

/* Held windows: a window a structure keeps open across many operations
 * (the B+ tree's current record slab), so that its fresh pages cost one
 * unprotect for the whole range instead of one fault or mprotect per page.
 * The application may switch protection off and on meanwhile, which forgets
 * every window: the hold remembers the epoch it was opened in and closes
 * only a window that still exists. Exposure: the range stays writable for
 * as long as the hold is open (documented by each user). */
typedef struct nvh_protect_hold {
    const void *p;
    size_t len;
    uint64_t epoch;          /* 0 = nothing held (or opened while off)        */
} nvh_protect_hold;

static inline void nvh_protect_hold_open_(nvh_pool *pool, nvh_protect_hold *h, const void *p,
                                          size_t len)
{
    h->p = p;
    h->len = len;
    h->epoch = nvh_protect_epoch_(pool);
    if (h->epoch) nvh_protect_open_(pool, p, len);
}
static inline void nvh_protect_hold_close_(nvh_pool *pool, nvh_protect_hold *h)
{
    if (h->epoch && h->epoch == nvh_protect_epoch_(pool)) nvh_protect_close_(pool, h->p, h->len);
    h->p = NULL;
    h->len = 0;
    h->epoch = 0;
}

#ifdef NVH_PROTECT_INTERNALS_   /* defined by the files of src/protect only */

#include <pthread.h>
#include <time.h>

/* --------------------------------------------------------------------------
 * Constants
 * -------------------------------------------------------------------------- */
#define PR_PAGE_SHIFT 12u
#define PR_QUEUE_DEFAULT 65536u
#define PR_QUEUE_MIN 64u
#define PR_QUEUE_MAX (1u << 24)
#define PR_REGISTRY_SLOTS 64u        /* protected pools at once, process-wide */
/* Pages one implicit window remembers (a per-thread list allocated at the
 * thread's first begin, reached by the handler through an initial-exec TLS
 * pointer). More pages than this still work: the rest are re-protected by a
 * sweep. */
#define PR_TLS_PAGES 64u
#define PR_TLS_POOLS 4u              /* distinct pools one implicit window names */
#define PR_LAT_BUCKETS 320u          /* latency histogram, log2 x 8 sub-buckets */

enum { PR_KIND_UNPROTECT = 0, PR_KIND_PROTECT = 1, PR_KIND_SWEEP = 2 };

/* Per-thread window cache (cache.c; async mode; the table's layout is above,
 * with the inline hit path): pools one thread caches at once, the shortest
 * interval it is used with (every pass makes each owner give back what it
 * holds, so below ~1 ms it only adds work), and the units one shared add
 * takes. */
#define PR_TC_POOLS 4u
#define PR_TC_MIN_INTERVAL 1000000ull
#define PR_TC_BATCH 16u              /* units one shared add takes for a cache */

/* --------------------------------------------------------------------------
 * The request queue (request_queue.c): bounded lock-free multi-producer ring
 * (Vyukov's per-cell sequence numbers), drained by one applier at a time.
 * -------------------------------------------------------------------------- */
typedef struct pr_request {
    uint64_t first_page;
    uint32_t npages;
    uint32_t kind;               /* PR_KIND_*                                  */
    uint64_t t_ns;               /* request time (CLOCK_MONOTONIC), 0 = untimed */
} pr_request;

typedef struct pr_cell {
    _Atomic uint64_t seq;
    pr_request req;
} pr_cell;

typedef struct pr_queue {
    _Alignas(64) _Atomic uint64_t tail;   /* producers                       */
    _Alignas(64) uint64_t head;           /* the applier (under apply_lock)  */
    uint64_t mask;
    pr_cell *cells;
} pr_queue;

int pr_queue_init(pr_queue *q, unsigned slots);
void pr_queue_fini(pr_queue *q);
/* false if the ring is full. */
bool pr_queue_push(pr_queue *q, const pr_request *r);
/* Pop up to max published entries (the applier only). */
size_t pr_queue_pop(pr_queue *q, pr_request *out, size_t max);

/* --------------------------------------------------------------------------
 * Cheap timestamps for the latency histogram: nvh_ticks (common/internal.h:
 * the TSC on x86-64; the async close path takes one per closing call).
 * -------------------------------------------------------------------------- */
static inline uint64_t pr_ticks(void) { return nvh_ticks(); }

/* --------------------------------------------------------------------------
 * Latency histogram (apply.c): log-linear buckets, relaxed atomic counts.
 * -------------------------------------------------------------------------- */
typedef struct pr_hist {
    _Atomic uint64_t bucket[PR_LAT_BUCKETS];
    _Atomic uint64_t count, sum_ns, max_ns;
} pr_hist;

void pr_hist_add(pr_hist *h, uint64_t ns);
unsigned pr_hist_index(uint64_t ns);
uint64_t pr_hist_upper(unsigned index);      /* largest ns in bucket */

/* --------------------------------------------------------------------------
 * Per-pool state
 * -------------------------------------------------------------------------- */
enum { ST_MPROTECTS, ST_PAGES_CHANGED, ST_REQUESTS, ST_BATCHES, ST_CANCELLED,
       ST_FAULTS_RESOLVED, ST_INTERNAL_FAULTS, ST_STRAYS, ST_QUEUE_FULL, ST_UNBALANCED,
       ST_SYNC_APPLIES, ST_RECHECKS, ST_DEFERRED, ST_TC_MISSES, ST_COUNT_ };

struct nvh_protect {
    nvh_pool *pool;
    char *base;
    uint64_t max_pages;                   /* arrays cover the reserved range  */
    _Atomic int mode;                     /* nvh_protect_mode                 */
    _Atomic int disabling;                /* switching to off: faults are legal */
    _Atomic uint64_t fault_seq;           /* bumped by every handler mprotect(RW) */
    _Atomic uint64_t epoch;               /* advances when disable() forgets the
                                             windows (held windows check it)  */
    unsigned flags;                       /* NVH_PROTECT_* option bits        */
    bool populate;                        /* the mapping is the media and
                                             populating it is free of side
                                             effects: the fault handler maps a
                                             fresh run's pages in one call  */
    _Atomic uint64_t interval_ns;
    int registry_slot;
    /* tests only (NVHEAP_TEST_WIDEN_RACES in the environment when the state
     * is created): an applier pauses between its mprotect(read-only) and
     * its state-bit stores, the window in which a racing fault handler can
     * hide a writable page behind a 0 bit (apply.c, reconcile), so that
     * test_protect_threads meets that interleaving often, not 1 run in 30 */
    bool widen_races;

    /* page arrays: mmap'ed MAP_NORESERVE for max_pages, touched on use */
    _Atomic uint32_t *count;
    _Atomic uint64_t *state;              /* 1 = writable (applied)           */
    _Atomic uint64_t *pending;            /* 1 = queued                       */
    _Atomic uint64_t *ref;                /* async: used since the last look  */
    _Atomic uint64_t *hfault;             /* a handler made it writable since an
                                             applier's forced pass last looked */
    _Atomic uint64_t *ptime;              /* async: when the last window closed
                                             (pr_ticks), for the protect latency */
    size_t arrays_bytes;

    /* async */
    pr_queue queue;
    pr_request *batch;                    /* applier scratch: popped requests */
    size_t batch_cap;
    pr_request *carry;                    /* applier: pages given a second
                                             chance, for the next pass (runs) */
    size_t carry_n, carry_cap;
    bool carry_sorted;                    /* in page order (else sorted at use) */
    pthread_t thread;
    bool thread_running;
    _Atomic bool stop;
    _Atomic bool sweep_wanted;            /* an implicit window overflowed    */
    pthread_mutex_t wake_lock;
    pthread_cond_t wake;

    pthread_mutex_t apply_lock;           /* one applier at a time            */

    /* per-thread window cache (cache.c); tc_list under the cache lock */
    _Atomic uint64_t tc_id;               /* 0 = off, else this enabling's id */
    struct pr_tcache *tc_list;
    uint64_t tc_pass_tick[3];             /* service: last three passes' ticks */

    /* stray reporting */
    _Atomic(nvh_stray_handler) stray_fn;
    _Atomic(void *) stray_arg;

    _Alignas(64) _Atomic uint64_t stats[ST_COUNT_];
    pr_hist lat[2];                       /* by PR_KIND_UNPROTECT / PROTECT   */
};

static inline void pr_stat(struct nvh_protect *pr, unsigned which, uint64_t n)
{
    atomic_fetch_add_explicit(&pr->stats[which], n, memory_order_relaxed);
}

static inline uint64_t pr_now_ns(void) { return nvh_now_ns(); }
static inline uint64_t pr_ticks_to_ns(uint64_t ticks) { return nvh_ticks_to_ns(ticks); }

/* Bit helpers on the state/pending bitmaps (seq_cst: see the pairs above). */
static inline bool pr_bit_test(_Atomic uint64_t *map, uint64_t page)
{
    return (atomic_load(&map[page >> 6]) >> (page & 63)) & 1u;
}
/* Old value. A set bit is seen by a plain (seq_cst) load first: on the hot
 * path (a page already queued / already marked) no read-modify-write and
 * no cache-line ownership is needed. Same ordering argument as the RMW for
 * the pairs above: the load is seq_cst and reads the value the RMW would. */
static inline bool pr_bit_set(_Atomic uint64_t *map, uint64_t page)
{
    uint64_t bit = (uint64_t)1 << (page & 63);
    if (atomic_load(&map[page >> 6]) & bit) return true;
    return (atomic_fetch_or(&map[page >> 6], bit) & bit) != 0;
}
static inline void pr_bit_clear(_Atomic uint64_t *map, uint64_t page)
{
    atomic_fetch_and(&map[page >> 6], ~((uint64_t)1 << (page & 63)));
}
static inline bool pr_page_wanted(struct nvh_protect *pr, uint64_t page)
{
    return atomic_load(&pr->count[page]) != 0;
}
static inline char *pr_page_addr(struct nvh_protect *pr, uint64_t page)
{
    return pr->base + (page << PR_PAGE_SHIFT);
}
static inline uint64_t pr_mapped_pages(struct nvh_protect *pr)
{
    return atomic_load_explicit(&pr->pool->ctx.size, memory_order_acquire) >> PR_PAGE_SHIFT;
}

/* apply.c — everything under apply_lock */
/* Bring pages [first, first+n) to what their counts say; sets the caller's
 * mprotect count. Caller holds apply_lock. */
void pr_reconcile_range(struct nvh_protect *pr, uint64_t first, uint64_t n);
/* Drain the queue (and the carry list) and reconcile what it names (sorted,
 * coalesced). flush: protect every unused page now (no second chance), as
 * nvh_protect_sync and mode changes need. Caller holds apply_lock. Returns
 * requests processed. */
size_t pr_drain(struct nvh_protect *pr, bool flush);
/* mprotect wrapper that counts (async-signal-safe). */
int pr_mprotect(struct nvh_protect *pr, uint64_t first, uint64_t n, bool writable);

/* service.c */
int pr_service_start(struct nvh_protect *pr);
void pr_service_stop(struct nvh_protect *pr);
void pr_service_kick(struct nvh_protect *pr);

/* window.c: give back n window units of `page` that a thread's cache held
 * (its last window there closed at `tick`, 0 = now), like the close of n
 * windows; ref: with the second chance (an eviction), else without. */
void pr_release_units_(struct nvh_protect *pr, uint64_t page, uint32_t n, uint64_t tick,
                        bool ref);

/* cache.c: the per-thread window cache (async). open/close: true if the
 * cache did the whole call (a unit it held was taken / the unit was kept).
 * pass: the service, at the start of every pass (units untouched for a
 * whole interval go back). configure: after any mode/interval/flags change
 * (turns the cache on or off; off takes every unit back). steal_all: every
 * unit of every thread back now, if release (nvh_protect_sync, a switch to
 * sync); detach: and the tables die (the cache goes off; without release
 * when the counts are being reset anyway). */
enum { PR_TC_NOT_CACHED, PR_TC_DONE, PR_TC_FIRST, PR_TC_UNBALANCED };
/* PR_TC_DONE, PR_TC_FIRST (a batch taken, the count was 0: open_first) or
 * PR_TC_NOT_CACHED (the shared path). */
int pr_tc_open(struct nvh_protect *pr, uint64_t page);
/* PR_TC_DONE, PR_TC_UNBALANCED (no window open besides the units held) or
 * PR_TC_NOT_CACHED. */
int pr_tc_close(struct nvh_protect *pr, uint64_t page);
void pr_tc_pass(struct nvh_protect *pr);
void pr_tc_configure(struct nvh_protect *pr);
void pr_tc_steal_all(struct nvh_protect *pr, bool release, bool detach);

/* fault.c */
int pr_handler_install(void);
int pr_registry_add(struct nvh_protect *pr);
void pr_registry_remove(struct nvh_protect *pr);

/* window.c: the implicit window of the calling thread, read by the handler.
 * The page list lives behind a pointer (allocated by internal_begin, never
 * by the handler; freed at thread exit) so that the initial-exec TLS block
 * stays a few bytes: a dlopen'ed libnvheap.so only gets glibc's small
 * static-TLS surplus (tests/abi/test_dlopen.c). */
typedef struct pr_tls_list {
    unsigned n;                  /* pages[] used                              */
    bool overflow;               /* a page did not fit: sweep at the end      */
    bool any_pool;               /* more than PR_TLS_POOLS pools named        */
    unsigned npools;
    nvh_pool *pools[PR_TLS_POOLS];
    struct { struct nvh_protect *pr; uint64_t page; } pages[PR_TLS_PAGES];
} pr_tls_list;
typedef struct pr_tls {
    unsigned depth;              /* nesting of internal_begin                 */
    bool lost;                   /* depth > 0 without a list (out of memory):
                                    pages made writable unlisted; _end sweeps */
    pr_tls_list *list;           /* NULL until the thread's first begin       */
} pr_tls;
extern _Thread_local pr_tls nvh_protect_tls_ __attribute__((tls_model("initial-exec")));

#endif /* NVH_PROTECT_INTERNALS_ */
#endif /* NVH_PROTECT_H */
