/* cap.h — internals of capacity mode (layer `cap`): a volatile heap whose
 * memory is a file (or a region of a pool) and whose metadata is all DRAM.
 * Nothing here is flushed, logged or recovered: after a crash or exit the
 * memory is simply gone (docs/CAP.md).
 *
 * Files:
 *   span.c     the instance: reserve and map the range, the block map, the
 *              global span allocator (bins, coalescing, hole punching), fork
 *   heap.c     thread heaps: size classes, pages, malloc/free fast paths,
 *              cross-thread frees, large objects, realloc
 *   large.c    a thread heap's kept large blocks and the large frees other
 *              threads hand back to it (no lock on the common large path)
 *   part.c     the in-process API on a region of a pool (nvh_cap_*)
 *   preload.c  the LD_PRELOAD malloc family (built only into libnvheap-cap.so)
 *
 * The core (span.c, heap.c, large.c) uses nothing of libnvheap but its
 * headers, so the preload library is these three files and preload.c alone. */
#ifndef NVH_CAP_H
#define NVH_CAP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NVH_CAP_BLOCK 4096u                    /* unit of spans and of the map  */
#define NVH_CAP_BLOCK_SHIFT 12u
#define NVH_CAP_SMALL_PAGE ((size_t)32 << 10)  /* page of classes <= 8 KiB      */
#define NVH_CAP_MEDIUM_PAGE ((size_t)512 << 10) /* page of classes <= 64 KiB    */
#define NVH_CAP_SMALL_MAX 8192u
#define NVH_CAP_CLASS_MAX 65536u               /* larger: a span of its own    */
/* Size classes: 16 B steps up to 16 << S, then 2^S classes per power of two
 * (S = NVH_CAP_CLASS_SHIFT), so rounding wastes at most 1/2^S of a block
 * above 16 << S and about a third of that on average (heap.c size_class). */
#ifndef NVH_CAP_CLASS_SHIFT
#define NVH_CAP_CLASS_SHIFT 6u
#endif
#define NVH_CAP_COARSE_SHIFT 2u    /* the classes of a heap that holds little */
#define NVH_CAP_FINE_BYTES ((size_t)32 << 20) /* pages of a heap on the fine grid */
#define NVH_CAP_BORROW_BYTES ((size_t)4 << 20) /* a heap with fewer bytes of pages
                                                  borrows blocks of the next
                                                  classes (heap.c borrow)   */
#define NVH_CAP_BORROW_UP 1u      /* lenders: the next coarse class up (heap.c) */
#define NVH_CAP_FINE_PAGE ((size_t)32 << 10)  /* fine grid: target page of classes
                                                 <= 8 KiB (heap.c page_blocks) */
#define NVH_CAP_CLASSES ((1u << NVH_CAP_CLASS_SHIFT) * (13u - NVH_CAP_CLASS_SHIFT) + 1u) /* 0 unused */
#define NVH_CAP_BINS 256u                      /* free-span bins                */
#define NVH_CAP_INSTANCES 8u                   /* instances alive at once       */
#define NVH_CAP_EMPTY_PAGES 4u                 /* empty small pages per thread  */
#define NVH_CAP_EMPTY_SHARE 64u   /* their unpunched bytes: at most 1/64 of the
                                     heap's pages (heap.c empty_keep)          */
#define NVH_CAP_LCLASSES 80u                   /* large classes, 17 .. 16384 blocks */
#define NVH_CAP_LCACHE_REACH 8u   /* a kept large block serves requests of its
                                     class and the 7 below it (up to 2x)       */
#define NVH_CAP_LCACHE_BYTES ((size_t)4 << 20) /* a thread heap's kept large
                                                  blocks: at least this ...  */
#define NVH_CAP_LKEEP_SHARE 1u    /* ... or its large bytes in use (recent
                                     peak), within the file's bound (large.c) */
#define NVH_CAP_LKEEP_STEP ((size_t)1 << 20) /* heaps' kept bytes are published
                                                to the instance in such steps */
#define NVH_CAP_RBATCH 62u                     /* cross-thread frees per push   */
#define NVH_CAP_RSPARE 64u                     /* spare batch nodes per thread  */
#define NVH_CAP_DECAY_MS 100u             /* window of the recent peak (ms)  */
#define NVH_CAP_GROW_STEP ((size_t)64 << 20)   /* device free-space check step  */
#define NVH_CAP_TRIM_MIN ((size_t)128 << 10)   /* smallest free top given back  */

#if defined(__GNUC__)
#define NVH_CAP_INLINE static inline __attribute__((always_inline))
#define NVH_CAP_NOINLINE __attribute__((noinline))
#define nvh_cap_likely(x) __builtin_expect(!!(x), 1)
#define nvh_cap_unlikely(x) __builtin_expect(!!(x), 0)
#else
#define NVH_CAP_INLINE static inline
#define NVH_CAP_NOINLINE
#define nvh_cap_likely(x) (x)
#define nvh_cap_unlikely(x) (x)
#endif

/* A free block's first two words: the free-list link, and a key that marks it
 * free (address ^ instance secret). free() of a block whose key is set is a
 * double free (confirmed by a list walk where that is cheap), as glibc's
 * tcache does; malloc clears the key. */
struct cap_block {
    struct cap_block *next;
    uintptr_t key;
};

enum { CAP_SPAN_DEAD = 0, CAP_SPAN_FREE, CAP_SPAN_PAGE, CAP_SPAN_LARGE };
enum { CAP_PG_CUR = 1, CAP_PG_AVAIL, CAP_PG_FULL, CAP_PG_EMPTY };
/* A page's tail (the bytes after its last whole block, shorter than one):
 * none, a free block of class tcls, or that block handed out (heap.c). */
enum { CAP_TAIL_NONE = 0, CAP_TAIL_FREE, CAP_TAIL_USED };

struct cap_heap;
struct meta_slab;
struct cap_span;

/* The links of a doubly linked list of spans. A span has two pairs (it is on
 * two lists at once: a page on its class's avail list and its heap's list
 * of free tails), each also named by its fields (next/prev, dnext/dprev). */
struct cap_links {
    struct cap_span *next, *prev;
};

/* A batch of cross-thread frees for one owner heap: the freeing thread fills
 * it and pushes it onto the owner's `remote` list with one CAS. The pointers
 * are kept here, in DRAM, not chained through the blocks: the owner then
 * knows every block's address at once and its cache misses on them (the
 * blocks were last written by other cores) overlap instead of forming a
 * chain of dependent loads. */
struct cap_rbatch {
    uintptr_t next;            /* remote list link (tagged, see heap.c)       */
    uint32_t n;
    uint32_t pad_;
    struct cap_block *blk[NVH_CAP_RBATCH];
};

/* A span: a run of blocks of the range, free, a page of one size class, or
 * one large object. Descriptors live in DRAM (meta slabs, 64-byte aligned),
 * never in the file. The first cache line holds what a free by any thread
 * reads (where the block is, its size, its owner); the second what the
 * owner writes on every malloc and free (the free list, the count). Kept
 * apart, a cross-thread free does not take the line the owner is writing
 * (false sharing). */
struct cap_span {
    /* line 0: read by every free; written when the span changes role */
    uintptr_t start;
    uint32_t blocks;
    uint8_t kind;              /* CAP_SPAN_*                                   */
    uint8_t dirty;             /* free: holds pages not yet punched            */
    uint8_t hole;              /* free: holds punched pages (refill them);
                                  page kept empty by its heap: punched       */
    uint8_t cached;            /* large: freed, in the freeing thread's cache
                                  (1) or the instance's (2); its kind stays
                                  LARGE (the lock holder reads kinds of
                                  neighbours, this thread writes this) */
    uint8_t roomy;             /* large: a block grown by realloc, with headroom
                                  (2: a thread's kept one, taken whole)       */
    uint8_t pad0_[3];
    uint32_t bsize;            /* page: block size                             */
    struct cap_heap *heap;     /* page: owner; fixed while it has live blocks;
                                  large: the heap that took it last (or
                                  adopted it at a free: large.c)          */
    uint64_t inv;              /* page: ceil(2^40 / bsize): interior check     */
    uintptr_t user;            /* large: the pointer handed out (aligned ones) */
    union {                    /* free: bin list; page: avail list;
                                  kept large: class list (instance's, or its
                                  heap's)                                   */
        struct { struct cap_span *next, *prev; };
        struct cap_links link;
    };
    /* line 1: the owner's (page) or the lock holder's (free, large) */
    _Alignas(64) struct cap_block *free; /* page: owner-only free list         */
    uint32_t used;             /* page: blocks handed out, not freed to owner  */
    uint32_t cls;              /* page: size class                             */
    uint8_t pstate;            /* page: CAP_PG_* (owner only)                  */
    uint8_t tail;              /* page: CAP_TAIL_* (owner only, heap.c)        */
    uint16_t tcls;             /* page: size class of its tail block           */
    uint8_t pad1_[4];
    uintptr_t bump, end;       /* page: never-used blocks [bump, end)          */
    union {                    /* free + dirty: punch queue (oldest first);
                                  kept large: age queue;
                                  page: its heap's list of free tails      */
        struct { struct cap_span *dnext, *dprev; };
        struct cap_links dlink;
    };
    size_t dbytes;             /* free + dirty, or page kept empty by its
                                  heap: bytes that may hold pages          */
};
_Static_assert(offsetof(struct cap_span, free) == 64, "cap_span: owner line");
_Static_assert(sizeof(struct cap_span) == 128, "cap_span: two lines");

struct cap_inst;

/* A thread heap's kept large blocks (large.c): freed blocks of large
 * classes it took, kept whole and mapped for its next large requests, one
 * LIFO list per class (next/prev) plus an age list (dnext toward younger).
 * Owner only (under the instance lock while the heap is an orphan). */
struct cap_lkeep {
    struct cap_span *cls[NVH_CAP_LCLASSES];
    uint64_t map[(NVH_CAP_LCLASSES + 63) / 64]; /* classes with a block      */
    struct cap_span *old, *young;
    size_t bytes;            /* kept                                          */
    size_t pub;              /* of them, counted in cap->lkeep_bytes          */
    size_t low;              /* fewest kept since the heap's last decay       */
    size_t live;             /* bytes of the heap's large blocks in use (those
                                another heap freed stay counted: it is only
                                the allowance's base, which the room bounds) */
    size_t peak, peak_prev;  /* most live in this decay window, the last one  */
};

/* A thread's heap in one instance. Only its thread touches it, except the
 * `remote` list (other threads push frees) and while it is an orphan (its
 * thread exited: then it is touched only under the instance lock). */
struct cap_heap {
    struct cap_inst *cap;
    uint64_t gen;                    /* the instance's gen                    */
    struct cap_span *cur[NVH_CAP_CLASSES];
    struct cap_span *avail[NVH_CAP_CLASSES];
    uint8_t pgrow[NVH_CAP_CLASSES];  /* pages made per class, up to full size */
    struct cap_span *tails[NVH_CAP_CLASSES]; /* pages whose free tail is a block
                                                of this class (dnext/dprev)   */
    size_t fine_max;                 /* sizes up to this use the fine classes */
    size_t page_bytes;               /* bytes of the pages it holds           */
    /* written by other threads (one CAS per batch of frees): a line of its
     * own, apart from what the owner's malloc reads (fine_max) */
    _Alignas(64) _Atomic(uintptr_t) remote; /* batches (and lone blocks, tagged) */
    _Atomic int orphan;
    _Alignas(64) uint64_t decay_ms;  /* last time it gave idle memory back    */
    struct cap_span *empty[NVH_CAP_EMPTY_PAGES];
    unsigned nempty;
    size_t empty_bytes;              /* of them, bytes that may hold pages     */
    struct cap_lkeep lk;             /* kept large blocks (large.c)           */
    struct cap_span *rkeep;          /* a freed grown block, for the next one */
    /* outgoing cross-thread frees, batched per destination heap */
    struct cap_heap *rdest;
    struct cap_rbatch *rout;
    struct cap_rbatch *rspare;       /* empty batches for reuse (owner only)  */
    unsigned nspare;
    struct cap_heap *all_next;       /* every heap of the instance            */
    struct cap_heap *orphan_next;
};

_Static_assert(offsetof(struct cap_heap, remote) / 64 != offsetof(struct cap_heap, fine_max) / 64 &&
                   offsetof(struct cap_heap, remote) / 64 != offsetof(struct cap_heap, decay_ms) / 64,
               "cap_heap: the remote list has a line of its own");

/* Usage counters (nvh_cap_stats_). */
struct nvh_cap_counters {
    size_t reserved;         /* bytes of address range                          */
    size_t span_bytes;       /* bytes of spans in use (pages, large objects)    */
    size_t span_peak;
    size_t dirty_bytes;      /* free, not yet punched (cached large blocks too) */
    size_t top;              /* high-water mark of the range                    */
    size_t file_bytes;       /* blocks the file holds now (fstat), 0 if no file */
    uint64_t punches;
};

/* One instance: a reserved address range [base, base + size). */
struct cap_inst {
    uintptr_t base;
    size_t size;
    int fd;                  /* backing file (-1: a pool region)               */
    bool own_mapping;        /* unmap at destroy                                */
    unsigned id;             /* TLS slot                                        */
    uint64_t gen;            /* unique per instance: a stale TLS slot never matches */
    uintptr_t secret;
    int abort_on_error;      /* for the preload front end                       */
    bool populate;           /* fault fresh pages in at once (heap.c populate) */
    /* Cross-thread frees: with key_at_free the freeing thread checks and sets
     * the block's key (a double free is reported by that free call: the pool
     * part's error codes); else it only queues the address, never touching
     * the block (last written by the owner, whose cache still holds it), and
     * the owner checks and sets the key when it drains the queue: a double
     * free found there is counted in late_doubles and passed to late_double
     * (if set), and the block is not freed twice (heap.c heap_drain). */
    bool key_at_free;
    void (*late_double)(struct cap_inst *cap, void *p);
    _Atomic(struct cap_span *) *map;  /* one entry per block                    */
    size_t map_bytes;
    /* Above: read by every free, written at init only. Below, from the next
     * line on: written under the lock (or rarely), so taking the lock does
     * not take the line every free reads (false sharing). */
    _Alignas(64) pthread_mutex_t lock; /* global span allocator, heaps list, orphans */
    _Atomic uint64_t late_doubles;
    _Atomic uint64_t empty_punches; /* heaps' punches of their kept empty pages */
    size_t top;              /* used part of the range                          */
    _Atomic size_t top_hint; /* top, for reads without the lock                 */
    size_t checked;          /* top up to which the device was checked for room */
    struct cap_span *bins[NVH_CAP_BINS];
    uint64_t binmap[NVH_CAP_BINS / 64];
    struct cap_span *dhead, *dtail;
    size_t dirty_bytes, decay_min;
    /* freed large blocks kept whole, mapped and resident, per large class
     * (newest first), and in age order for eviction (span.c lcache_*) */
    struct cap_span *lc[NVH_CAP_LCLASSES];
    struct cap_span *lc_old, *lc_new;
    size_t lc_bytes;
    size_t file_slack;       /* free bytes up to which the file was found small */
    uint64_t win_start;      /* recent-peak window (span.c decay_): its start */
    size_t win_cur, win_prev; /* peak of span_bytes in this and the last one */
    size_t span_bytes;       /* bytes of spans in use (under the lock)          */
    size_t span_peak;
    uint64_t punches;
    uint64_t span_calls;     /* calls of the span allocator (each under the lock) */
    struct cap_span *desc_free;
    struct cap_rbatch *rbatch_free;  /* spare cross-thread batches           */
    char *meta_cur, *meta_end;
    struct meta_slab *meta_slabs;
    struct cap_heap *heaps, *orphans;
    char dir[256];           /* where fork creates the child's file            */
    int fork_fd;
    /* the map's entry for the ends of a span given back above the top
     * (span.c trim_top): a free span over the whole range, so a second free
     * of a block that went there is still found as a double free */
    struct cap_span above_top;
    /* heaps' kept large blocks (published in steps, large.c): in use for the
     * span counts, free for the allowance (span.c decay_); and how far they
     * may grow before the allowance must be applied again (set by decay_:
     * a heap that publishes past it sheds its oldest to the instance). A
     * line of their own (heaps add to the sum without the lock). */
    _Alignas(64) _Atomic size_t lkeep_bytes;
    _Atomic size_t lkeep_room;
};

_Static_assert(offsetof(struct cap_inst, lock) / 64 != offsetof(struct cap_inst, map) / 64 &&
                   offsetof(struct cap_inst, lock) / 64 != offsetof(struct cap_inst, secret) / 64,
               "cap_inst: the lock shares no line with what every free reads");

/* ---- large classes ------------------------------------------------------- */
/* Blocks over NVH_CAP_CLASS_MAX are rounded up to large classes, eight per
 * doubling of their 4 KiB blocks, up to NVH_CAP_LARGE_ROUND_MAX blocks
 * (64 MiB; bigger ones are not rounded). A freed block then serves the next
 * request of its class whole, on pages that are still mapped (span.c). */
#define NVH_CAP_LARGE_ROUND_MAX 16384u
static inline uint32_t nvh_cap_large_round_(uint32_t n)
{
    if (n <= 16 || n > NVH_CAP_LARGE_ROUND_MAX)
        return n;
    uint32_t w = n - 1;
    unsigned b = 31u - (unsigned)__builtin_clz(w);   /* >= 4 */
    uint32_t step = (uint32_t)1 << (b - 3u);
    return (w | (step - 1)) + 1;
}
/* The large class of a rounded block count in 17 .. 16384 (0 .. 79). */
static inline unsigned nvh_cap_large_class_(uint32_t n)
{
    uint32_t w = n - 1;
    unsigned b = 31u - (unsigned)__builtin_clz(w);
    return (b - 4u) * 8u + ((w >> (b - 3u)) & 7u);
}

/* ---- span.c: instances and the span allocator ---------------------------- */
/* A file-backed instance: an unlinked file in dir, the range reserved at
 * reserve bytes (halved until the system grants it). 0 or -errno. */
int nvh_cap_init_file_(struct cap_inst *cap, const char *dir, size_t reserve);
/* An instance on memory the caller owns (a region of a pool). */
int nvh_cap_init_region_(struct cap_inst *cap, void *base, size_t size);
void nvh_cap_destroy_(struct cap_inst *cap);
/* Under cap->lock: a span of n blocks of `kind`; *zero = its memory is known
 * to read as zeros. NULL if the range or the device is full. */
struct cap_span *nvh_cap_span_alloc_(struct cap_inst *cap, uint32_t n, int kind, bool *zero);
/* The same, where it can grow in place: at the start of the largest free
 * span if that is 4 times bigger, else at the top of the used range. */
struct cap_span *nvh_cap_span_alloc_top_(struct cap_inst *cap, uint32_t n, int kind, bool *zero);
/* Under cap->lock: give a span back (coalesce, maybe punch). */
void nvh_cap_span_free_(struct cap_inst *cap, struct cap_span *s);
/* Under cap->lock: keep a freed large block of a large class whole for
 * reuse (its pages stay mapped); it counts as dirty, and the allowance
 * evicts the oldest ones. A block of another size is freed as by
 * nvh_cap_span_free_. */
void nvh_cap_span_cache_(struct cap_inst *cap, struct cap_span *s);
/* Under cap->lock: a kept block of n blocks' class or the next one (NULL:
 * none); it is in use again. */
struct cap_span *nvh_cap_span_reuse_(struct cap_inst *cap, uint32_t n);
/* Under cap->lock: a thread heap's large blocks were `extra` bytes more in
 * use lately than now (large.c: it takes and frees them without the
 * lock, so the instance did not see its peak); for the recent peak. */
void nvh_cap_span_note_peak_(struct cap_inst *cap, size_t extra);
/* Under cap->lock: apply the allowance now (a heap's periodic decay). */
void nvh_cap_span_decay_(struct cap_inst *cap);
/* Milliseconds of a coarse monotonic clock (vDSO, no system call). */
uint64_t nvh_cap_now_ms_(void);
/* Under cap->lock: grow a large span in place to n blocks; false if the
 * neighbour is not free or too small. */
bool nvh_cap_span_grow_(struct cap_inst *cap, struct cap_span *s, uint32_t n);
/* Set the pointer a large span hands out (aligned allocations: inside it). */
void nvh_cap_span_set_user_(struct cap_inst *cap, struct cap_span *s, uintptr_t user);
/* Under cap->lock: punch dirty spans down to the allowance without the
 * recent-peak bound (a thread's exit). */
void nvh_cap_span_settle_(struct cap_inst *cap);
/* Under cap->lock: punch every free dirty span (malloc_trim). */
void nvh_cap_span_purge_(struct cap_inst *cap);
struct cap_heap *nvh_cap_heap_new_(struct cap_inst *cap);  /* under cap->lock */
/* Under cap->lock: an empty cross-thread batch (NULL: out of memory), and
 * giving one back. */
struct cap_rbatch *nvh_cap_rbatch_new_(struct cap_inst *cap);
void nvh_cap_rbatch_put_(struct cap_inst *cap, struct cap_rbatch *b);
void nvh_cap_counters_(struct cap_inst *cap, struct nvh_cap_counters *out);
/* Fork: prepare copies the file into a new one (under the lock, before the
 * parent resumes); the child maps the copy over the same range. */
void nvh_cap_fork_prepare_(struct cap_inst *cap);
void nvh_cap_fork_parent_(struct cap_inst *cap);
void nvh_cap_fork_child_(struct cap_inst *cap, struct cap_heap *self);

static inline struct cap_span *nvh_cap_span_of_(const struct cap_inst *cap, const void *p)
{
    uintptr_t a = (uintptr_t)p - cap->base;
    return atomic_load_explicit(&cap->map[a >> NVH_CAP_BLOCK_SHIFT], memory_order_relaxed);
}
static inline bool nvh_cap_contains_(const struct cap_inst *cap, const void *p)
{
    return (uintptr_t)p - cap->base < cap->size;
}

/* ---- large.c: a thread heap's kept large blocks ---------------------------- */
/* A kept block of n blocks' large class or one of the next reach - 1
 * (NULL: none), in use again; owner only (or under the lock for an orphan). */
struct cap_span *nvh_cap_lkeep_take_(struct cap_heap *h, uint32_t n, unsigned reach);
/* The heap took the large block s (its kept one or a new one). */
void nvh_cap_lkeep_took_(struct cap_heap *h, struct cap_span *s);
/* Keep the owner's freed large block s (false: it does not fit the heap's
 * allowance or is not of a large class; the caller frees it). May give the
 * oldest kept blocks to the instance (takes the lock unless `locked`). */
bool nvh_cap_lkeep_put_(struct cap_heap *h, struct cap_span *s, bool locked);
/* Give kept blocks to the instance: all of them, or (idle) those the heap
 * did not need since its last decay. Takes the lock unless `locked`. */
void nvh_cap_lkeep_release_(struct cap_heap *h, bool all, bool locked);
/* h frees the large block s that another heap took: h becomes its owner. */
void nvh_cap_lkeep_adopt_(struct cap_heap *h, struct cap_span *s);
/* The owner's free of its large block s (kept, or given to the instance);
 * h NULL: given to the instance. */
void nvh_cap_large_free_own_(struct cap_inst *cap, struct cap_heap *h, struct cap_span *s, bool locked);

/* ---- heap.c: the allocator ----------------------------------------------- */
/* Results of free/usable-size checks (the front ends turn them into glibc's
 * messages or NVH_E_* codes). */
enum { CAP_OK = 0, CAP_INVALID = 1, CAP_DOUBLE = 2 };

/* The calling thread's heap (created on first use); NULL while the thread
 * is creating it (a recursive call from inside pthread_setspecific). */
struct cap_heap *nvh_cap_heap_(struct cap_inst *cap);
void *nvh_cap_alloc_(struct cap_heap *h, size_t size);
/* alignment: a power of two */
void *nvh_cap_alloc_aligned_(struct cap_heap *h, size_t size, size_t alignment);
void *nvh_cap_calloc_(struct cap_heap *h, size_t size);
/* p is inside the range; CAP_OK, CAP_INVALID or CAP_DOUBLE */
int nvh_cap_free_(struct cap_inst *cap, void *p);
/* usable bytes of a live block (0: invalid pointer) */
size_t nvh_cap_usable_(struct cap_inst *cap, const void *p);
/* realloc inside the instance; *bad = CAP_INVALID etc. when p is not live */
void *nvh_cap_realloc_(struct cap_heap *h, void *p, size_t size, int *bad);
/* return cached and free memory to the device (malloc_trim) */
void nvh_cap_trim_(struct cap_inst *cap);
/* thread exit: the thread's heap of every instance becomes an orphan */
void nvh_cap_thread_exit_(void);
/* forget the calling thread's heap of an instance being destroyed */
void nvh_cap_forget_(struct cap_inst *cap);
/* the calling thread's heap slot for an instance (fork child) */
struct cap_heap *nvh_cap_heap_peek_(struct cap_inst *cap);
/* instance ids (TLS slots) and generations: set cap->id and cap->gen
 * (-EMFILE when NVH_CAP_INSTANCES are alive); put releases them */
int nvh_cap_id_get_(struct cap_inst *cap);
void nvh_cap_id_put_(struct cap_inst *cap);

#endif
