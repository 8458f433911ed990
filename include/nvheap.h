/* nvheap.h — the public API of libnvheap.
 *
 * nvheap builds crash-consistent data structures directly in byte-addressable
 * persistent memory: real PMem/CXL memory under DAX, or any mmap-able file.
 *
 * Reading guide (the header is meant to be learnt from, like lmdb.h):
 *   1. Errors          every call reports an nvh_error code and a message.
 *   2. Pools           a pool is one file mapped at one contiguous address
 *                      range; it holds a superblock, a root area and a heap.
 *   3. Relative ptrs   pointers stored in a pool are offsets from its base.
 *   4. Persistence     nvh_flush / nvh_drain / nvh_persist and friends make
 *                      stores durable; how depends on the pool's domain.
 *   5. Statistics      every pool counts flushed lines, fences, msyncs.
 *   6. Crash simulator the `sim` domain and nvh_crash_explore(), the tool every
 *                      nvheap feature is tested with, offered to users too.
 *   7. Allocator       reserve/activate/free with failure-atomic link pointers,
 *                      named objects, checksummed headers, wear-aware reuse.
 *   8. Persist groups  software cache-line counters: deferred actions that run
 *                      once a shared, batched fence made their stores durable.
 *   9. Transactions    durable undo/redo transactions, isolated object
 *                      transactions (NVTM), epoch locks, reference counting.
 *  10. B+ tree         the consistent B+ tree of [Moraru11] (64-bit keys).
 *  11. Protection      stray-write protection: sync/async mprotect windows.
 *  12. Hash map        byte-string keys and values, incremental resizing.
 *  13. Key-value store nvh_kv_*: named stores of binary keys, sorted (B+
 *                      tree) or hash engine, durable on return, threads.
 *  14. Capacity mode   nvh_cap_*: a volatile heap in a pool (the preload
 *                      library libnvheap-cap.so has the malloc family).
 *
 * Threading: a pool handle may be used from several threads at once; the
 * persistence primitives are thread-safe. Create/open/close/grow of one pool
 * must not race with each other.
 */
#ifndef NVHEAP_H
#define NVHEAP_H

#ifndef __cplusplus
#include <stdatomic.h> /* C++ uses the __atomic builtins instead (section 4) */
#endif
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Everything declared here is the library's ABI: libnvheap is built with
 * -fvisibility=hidden, and only these declarations are visible to the
 * dynamic linker (tests/abi/test_exports checks the list). */
#pragma GCC visibility push(default)

/* The library version: CMakeLists.txt reads it from here for the SONAME
 * (libnvheap.so.MAJOR), the pkg-config file and the CMake package version. */
#define NVH_VERSION_MAJOR 1
#define NVH_VERSION_MINOR 0
#define NVH_VERSION_PATCH 0

/* Size of a cache line: the unit of flushing and of crash simulation. */
#define NVH_CACHELINE 64u

/* ==========================================================================
 * 1. Errors
 * ==========================================================================
 * Functions returning int return NVH_OK (0) or a negative nvh_error code.
 * Functions returning a pointer return NULL on error. In both cases the
 * calling thread's last error code and a human-readable message (naming the
 * file and the cause) are available from nvh_errcode()/nvh_errormsg() until
 * the thread's next failing call. */
typedef enum nvh_error {
    NVH_OK = 0,
    NVH_E_INVAL = -1,      /* bad argument (NULL, misaligned, out of range)  */
    NVH_E_NOENT = -2,      /* pool file does not exist                        */
    NVH_E_EXISTS = -3,     /* create refuses to overwrite an existing file    */
    NVH_E_BADMAGIC = -4,   /* not an nvheap pool                              */
    NVH_E_LAYOUT = -5,     /* pool was created with another layout name       */
    NVH_E_VERSION = -6,    /* pool format is newer than this library          */
    NVH_E_TRUNCATED = -7,  /* file is shorter than the size its superblock says */
    NVH_E_CHECKSUM = -8,   /* superblock (or other metadata) checksum mismatch */
    NVH_E_BUSY = -9,       /* pool is open elsewhere (this or another process) */
    NVH_E_SIZE = -10,      /* requested size too small or too large           */
    NVH_E_READONLY = -11,  /* file or pool not writable                       */
    NVH_E_IO = -12,        /* an OS call failed (message names it and errno)  */
    NVH_E_NOMEM = -13,     /* out of DRAM or virtual address space            */
    NVH_E_NOSPACE = -14,   /* pool full (and cannot grow), or disk full       */
    NVH_E_CORRUPT = -15,   /* on-media structure fails validation             */
    NVH_E_NOTSUP = -16,    /* not supported here (domain, CPU, file system)   */
    NVH_E_BADPTR = -17,    /* pointer not inside the pool / not an object     */
    NVH_E_DOUBLEFREE = -18,/* object already free                             */
    NVH_E_NOTFOUND = -19,  /* name or key not present                         */
    NVH_E_TOOLONG = -20,   /* name or key longer than the limit               */
    NVH_E_ABORTED = -21,   /* transaction aborted                             */
} nvh_error;

/* Code of the calling thread's last failure (NVH_OK if none yet). */
int nvh_errcode(void);
/* Message of the calling thread's last failure ("" if none). The string is
 * thread-local and valid until the thread's next failing nvheap call. */
const char *nvh_errormsg(void);
/* Static description of an error code ("pool is in use", ...). */
const char *nvh_strerror(int code);

/* ==========================================================================
 * 2. Pools
 * ==========================================================================
 * A pool file starts with a 4 KiB superblock (format in docs/FORMAT.md),
 * followed by the root area (fixed size chosen at create time, zeroed), then
 * the heap, which later layers (the allocator) manage. The whole pool is
 * mapped at one base address inside a reserved virtual range, so growing it
 * never moves the base and pointers into the pool stay valid while it is open.
 *
 * Persistence domain: each open pool runs in exactly one domain, chosen by the
 * NVH_DOMAIN_* value in the flags, else by the NVHEAP_DOMAIN environment
 * variable (pmem|eadr|msync|process|sim), else auto-detected: a DAX file that
 * accepts MAP_SYNC → pmem; tmpfs → process; anything else → msync.
 */
typedef struct nvh_pool nvh_pool;

typedef enum nvh_domain {
    NVH_DOMAIN_AUTO = 0,
    NVH_DOMAIN_PMEM = 1,    /* cache-line flush (CLWB/CLFLUSHOPT/CLFLUSH) + SFENCE */
    NVH_DOMAIN_EADR = 2,    /* caches are persistent: SFENCE only                 */
    NVH_DOMAIN_MSYNC = 3,   /* ordinary file: msync(MS_SYNC) the dirtied pages    */
    NVH_DOMAIN_PROCESS = 4, /* survives process crashes only (tmpfs, or asked)    */
    NVH_DOMAIN_SIM = 5,     /* crash simulator: private working copy + media image */
} nvh_domain;

/* Flags for nvh_pool_create / nvh_pool_open. The low 4 bits hold an
 * nvh_domain (0 = AUTO); the others are option bits. */
#define NVH_DOMAIN_MASK 0xFu
#define NVH_OPEN_READONLY 0x100u   /* open: map read-only, shared lock, epoch untouched */
/* With NVH_OPEN_READONLY only: take no lock, so that the open succeeds while
 * another process has the pool open read-write (as mdb_stat reads a live
 * LMDB), and never keeps a writer out. What it reads is the live pool: a
 * walk may meet a structure in the middle of another process's update and
 * fail with NVH_E_CORRUPT (retry), and it sees the size the pool had at
 * this open. For inspection tools (nvheap stat); NVH_E_INVAL without
 * NVH_OPEN_READONLY. */
#define NVH_OPEN_SHARED 0x800u
#define NVH_CREATE_NOFALLOCATE 0x200u /* create/grow: sparse file (skip posix_fallocate) */
/* create/open: map every page of the pool up front (MAP_POPULATE; grown
 * tails too), so that no first store takes a page fault later. Costs about
 * 1 us per 4 KiB page at open on a VM (~0.25 s per GiB); worth it for
 * latency-sensitive runs on pools that fit in memory. Like PMDK's
 * prefault.at_create / prefault.at_open. Ignored in the sim domain. */
#define NVH_POOL_PREFAULT 0x400u
/* create/open: populate heap space as the allocator takes it, instead of a
 * page fault per 4 KiB as stores first touch it: each chunk the allocator
 * claims fresh (4 MiB by default) is faulted in at the claim by
 * MADV_POPULATE_WRITE, 2 MiB at a time, and the mapping asks for 2 MiB pages
 * (MADV_HUGEPAGE; a DAX file system, or a tmpfs with huge pages enabled,
 * then backs each batch with one huge page). Trades a claim's latency (about
 * 1 ms per 4 MiB chunk on a VM) for no faults while the chunk fills. The
 * environment variable NVHEAP_POPULATE=1 sets it for every pool a process
 * opens. Only in the pmem, eadr and process domains (msync and sim track
 * dirty pages themselves); a kernel without MADV_POPULATE_WRITE (before
 * Linux 5.14) only loses the saving. docs/POOL.md "Populate". */
#define NVH_POOL_POPULATE 0x1000u

/* Sizes. A pool is at least NVH_POOL_MIN_SIZE bytes and at most
 * NVH_POOL_MAX_SIZE; its root area is 4 KiB unless options say otherwise. */
#define NVH_POOL_MIN_SIZE ((uint64_t)1 << 20)          /* 1 MiB  */
#define NVH_POOL_MAX_SIZE ((uint64_t)1 << 44)          /* 16 TiB */
#define NVH_ROOT_DEFAULT_SIZE 4096u
#define NVH_ROOT_MAX_SIZE ((uint64_t)1 << 30)
#define NVH_LAYOUT_MAX 63u                             /* bytes, without NUL */

/* Extended create options; zero-initialise and set what you need. */
typedef struct nvh_pool_options {
    uint64_t root_size;     /* root area bytes (rounded up to 4 KiB); 0 = 4 KiB   */
    uint64_t max_size;      /* growth limit and size of the reserved virtual
                               range; 0 = NVHEAP_MAX_SIZE env or 64 GiB. Recorded
                               in the pool: reopening keeps it unless the
                               NVHEAP_MAX_SIZE environment variable is set        */
} nvh_pool_options;

/* Create a new pool file of `size` bytes with the given layout name (NULL or
 * "" means no layout). Refuses (NVH_E_EXISTS) to overwrite an existing file.
 * The file is created with mode 0600 and its space allocated up front unless
 * NVH_CREATE_NOFALLOCATE is given. Returns the open pool. */
nvh_pool *nvh_pool_create(const char *path, const char *layout, uint64_t size,
                          unsigned flags);
nvh_pool *nvh_pool_create_ex(const char *path, const char *layout, uint64_t size,
                             unsigned flags, const nvh_pool_options *options);

/* Open an existing pool. `layout` must match the one given at create time
 * (NULL accepts any layout). Validates the superblock before touching
 * anything, takes an exclusive lock (NVH_E_BUSY if the pool is open
 * elsewhere), increments and persists the epoch. On any error the file is
 * left byte-for-byte unchanged. */
nvh_pool *nvh_pool_open(const char *path, const char *layout, unsigned flags);

/* Close: first close the B+ trees and hash maps still open (every completed
 * operation durable; their handles are invalid afterwards) — or, if one
 * cannot be closed from this thread (a deferred-durability tree of another
 * thread), return NVH_E_BUSY with the pool and everything in it left open.
 * Then persist what the library owns, unmap, unlock. NULL is a no-op.
 * Data the application stored but never flushed is only guaranteed to be
 * durable in the domains whose caches survive (eadr, process); in the sim
 * domain a clean close writes the working copy back (no crash happened).
 * Otherwise the handle is always released; NVH_E_IO if an msync failed while
 * the pool was open (nvh_pool_info.io_errors), since then durability was not
 * kept. */
int nvh_pool_close(nvh_pool *pool);

/* Grow the pool file to new_size bytes (>= current size, <= max_size). The
 * base address does not change. The new bytes read as zero. */
int nvh_pool_grow(nvh_pool *pool, uint64_t new_size);

/* Facts about an open pool. */
typedef struct nvh_pool_info {
    char layout[NVH_LAYOUT_MAX + 1];
    uint8_t uuid[16];
    uint64_t size;           /* current pool size in bytes                      */
    uint64_t max_size;       /* reserved virtual range / growth limit           */
    uint64_t epoch;          /* incremented at every open (read-write)          */
    uint32_t format_version; /* the format this open reads: an older pool is raised
                                to the library's at its first read-write open */
    nvh_domain domain;       /* domain of this open                             */
    nvh_domain created_domain; /* domain the pool was created in               */
    uint64_t root_offset, root_size;
    uint64_t heap_offset, heap_size;
    uint64_t create_time;    /* seconds since the Unix epoch                    */
    const char *flush_instruction; /* "clwb", "clflushopt", "clflush", "none"   */
    uint32_t clean_at_open;  /* 1 if the pool was closed cleanly before this
                                open, 0 after a crash (recovery ran at open) */
    uint32_t io_errors;      /* msync domain: failed msync calls since open.
                                Sticky: the kernel may have dropped the dirty
                                pages, so nvh_pool_close then fails NVH_E_IO */
} nvh_pool_info;

int nvh_pool_info_get(const nvh_pool *pool, nvh_pool_info *info);
const char *nvh_domain_name(nvh_domain domain); /* "pmem", ...; NULL if invalid */
int nvh_domain_parse(const char *name, nvh_domain *domain);
void *nvh_pool_base(const nvh_pool *pool);
uint64_t nvh_pool_size(const nvh_pool *pool);
nvh_domain nvh_pool_domain(const nvh_pool *pool);
uint64_t nvh_pool_epoch(const nvh_pool *pool);
/* CRC32C (Castagnoli, as iSCSI/ext4) of data[0, len) continued from `crc`
 * (0 to start): the checksum of every checksummed on-media structure
 * (docs/FORMAT.md), so offline tools verify a pool the way the library does. */
uint32_t nvh_crc32c(uint32_t crc, const void *data, size_t len);

/* The root area: a fixed-size zero-initialised region the application owns,
 * typically holding the relative pointers to its data structures. */
void *nvh_root(const nvh_pool *pool, uint64_t *size_out);

/* ==========================================================================
 * 3. Relative pointers
 * ==========================================================================
 * Pointers stored inside a pool are 64-bit offsets from the pool base; 0 is
 * NULL (offset 0 is the superblock, never an object). Declare typed ones with
 * NVH_RELPTR(type) and convert with nvh_ptr()/nvh_off() or the typed macros:
 *
 *   typedef NVH_RELPTR(struct node) node_ref;
 *   struct node { node_ref next; int value; };
 *   struct node *n = NVH_DEREF(pool, head);   // NULL-safe
 *   NVH_SET(pool, head, n);                     // store (not yet persisted)
 */
typedef uint64_t nvh_off_t;

/* type_tag_ is never read or written: it only carries the pointee type for
 * NVH_DEREF's cast and NVH_SET's type check (a pointer is at most 8 bytes,
 * so the union stays 8 bytes). */
#define NVH_RELPTR(type) union { nvh_off_t off; type *type_tag_; }
#define NVH_DEREF(pool, ref) \
    ((__typeof__((ref).type_tag_))nvh_ptr((pool), (ref).off))
#define NVH_SET(pool, ref, pointer) \
    ((ref).off = nvh_off((pool), (1 ? (pointer) : (ref).type_tag_)))
#define NVH_IS_NULL(ref) ((ref).off == 0)

/* ==========================================================================
 * 4. Persistence primitives (inline fast paths)
 * ==========================================================================
 * nvh_flush(pool, p, len)   start writing back the cache lines of [p, p+len)
 * nvh_drain(pool)           wait until every earlier flush of this thread is
 *                           durable (the fence; in msync domain: msync)
 * nvh_persist(pool, p, len) flush + drain
 * nvh_memcpy_persist / nvh_memset_persist: copy/set then persist; large copies
 *                           use non-temporal stores in the pmem domain.
 * nvh_memcpy_nodrain / nvh_memset_nodrain: the same without the final fence.
 *
 * The common case (pmem/eadr/process domains) is inlined: one switch on the
 * domain, a loop of flush instructions, and one relaxed counter update per
 * call — no indirect call per flush. */

/* ---- internal: what the inline paths need to see of a pool. Do not use. --- */
/* The header compiles as C11 and as C++11 or later (extern "C", same
 * layout): C++ has no _Atomic, _Alignas or _Thread_local, so these fields
 * are plain 8-byte-aligned integers there, accessed with the GCC/Clang
 * __atomic builtins (the same instructions as C11's relaxed atomics), and
 * the stripe is a __thread variable (no C++ thread_local wrapper call). */
#ifdef __cplusplus
#define NVH_ATOMIC_U64_ alignas(8) uint64_t
#define NVH_ALIGNAS_(n) alignas(n)
#define NVH_THREAD_LOCAL_ __thread
#define NVH_LOAD_RELAXED_(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define NVH_STORE_RELAXED_(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define NVH_FENCE_SEQ_CST_() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#else
#define NVH_ATOMIC_U64_ _Atomic uint64_t
#define NVH_ALIGNAS_(n) _Alignas(n)
#define NVH_THREAD_LOCAL_ _Thread_local
#define NVH_LOAD_RELAXED_(p) atomic_load_explicit((p), memory_order_relaxed)
#define NVH_STORE_RELAXED_(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define NVH_FENCE_SEQ_CST_() atomic_thread_fence(memory_order_seq_cst)
#endif

typedef enum nvh_flush_kind {
    NVH_FLUSH_NONE = 0, NVH_FLUSH_CLFLUSH = 1, NVH_FLUSH_CLFLUSHOPT = 2, NVH_FLUSH_CLWB = 3,
} nvh_flush_kind;

enum { NVH_STAT_LINES, NVH_STAT_FENCES, NVH_STAT_MSYNCS, NVH_STAT_NT_BYTES,
       NVH_STAT_COUNT_ };
#define NVH_STAT_STRIPES 16
typedef struct nvh_stat_stripe_ {
    /* one line of its own: threads on neighbouring stripes must not share one */
    NVH_ALIGNAS_(64) NVH_ATOMIC_U64_ value[8]; /* indexed by NVH_STAT_*         */
} nvh_stat_stripe_;

typedef struct nvh_persist_ctx_ {
    char *base;                           /* pool base address               */
    NVH_ATOMIC_U64_ size;                 /* mapped pool size (grows)        */
    uint8_t domain;                       /* nvh_domain                      */
    uint8_t flush_kind;                   /* nvh_flush_kind (pmem domain)    */
    uint8_t pad_[6];
    uint64_t nt_threshold;                /* copies >= this use NT stores    */
    nvh_stat_stripe_ stats[NVH_STAT_STRIPES];
} nvh_persist_ctx_;

/* Every nvh_pool begins with its nvh_persist_ctx_. */
#define NVH_CTX_(pool) ((nvh_persist_ctx_ *)(void *)(pool))

extern NVH_THREAD_LOCAL_ unsigned nvh_thread_stripe_
    __attribute__((tls_model("initial-exec")));
unsigned nvh_assign_stripe_(void);
void nvh_flush_slow_(nvh_pool *pool, const void *addr, size_t len);
void nvh_drain_slow_(nvh_pool *pool);
void nvh_memcpy_nt_(nvh_pool *pool, void *dst, const void *src, size_t len);

static inline void nvh_stat_add_(nvh_persist_ctx_ *ctx, unsigned stat, uint64_t n)
{
    unsigned stripe = nvh_thread_stripe_;
    if (__builtin_expect(stripe == 0, 0)) stripe = nvh_assign_stripe_();
    /* A plain load + store, not atomic_fetch_add: a LOCKed read-modify-write
     * is ordered after earlier CLWB/CLFLUSHOPT, so it would make every
     * nvh_flush wait for the previous one (bench/run persist: 8 flushes + 1
     * fence took 6.6x PMDK's time). Exact while a stripe has one writer (up
     * to NVH_STAT_STRIPES threads); beyond that a race may drop a count. */
    NVH_ATOMIC_U64_ *counter = &ctx->stats[stripe - 1].value[stat];
    NVH_STORE_RELAXED_(counter, NVH_LOAD_RELAXED_(counter) + n);
}
/* ---- end of internal section ---------------------------------------------- */

/* Integer arithmetic: an offset read from a damaged pool may be anything,
 * and the (unusable) address it gives must be computable without undefined
 * behaviour so that nvh_contains() can reject it. */
static inline void *nvh_ptr(const nvh_pool *pool, nvh_off_t off)
{
    return off ? (void *)((uintptr_t)NVH_CTX_(pool)->base + (uintptr_t)off) : NULL;
}
static inline nvh_off_t nvh_off(const nvh_pool *pool, const void *ptr)
{
    return ptr ? (nvh_off_t)((const char *)ptr - NVH_CTX_(pool)->base) : 0;
}
/* True if [ptr, ptr+len) lies inside the pool's current mapping. */
static inline int nvh_contains(const nvh_pool *pool, const void *ptr, size_t len)
{
    const nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    uintptr_t p = (uintptr_t)ptr, b = (uintptr_t)ctx->base;
    uint64_t size = NVH_LOAD_RELAXED_(&ctx->size);
    return p >= b && p - b <= size && len <= size - (p - b);
}

static inline void nvh_flush(nvh_pool *pool, const void *addr, size_t len)
{
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    if (len == 0) return;
    uintptr_t line = (uintptr_t)addr & ~(uintptr_t)(NVH_CACHELINE - 1);
    uintptr_t end = (uintptr_t)addr + len;
    uint64_t lines = (end - line + NVH_CACHELINE - 1) / NVH_CACHELINE;
    nvh_stat_add_(ctx, NVH_STAT_LINES, lines);
    switch ((nvh_domain)ctx->domain) {
    case NVH_DOMAIN_PMEM:
#if defined(__x86_64__)
        if (ctx->flush_kind == NVH_FLUSH_CLWB) {
            for (; line < end; line += NVH_CACHELINE)
                __asm__ volatile("clwb %0" : "+m"(*(volatile char *)line));
        } else if (ctx->flush_kind == NVH_FLUSH_CLFLUSHOPT) {
            for (; line < end; line += NVH_CACHELINE)
                __asm__ volatile("clflushopt %0" : "+m"(*(volatile char *)line));
        } else {
            for (; line < end; line += NVH_CACHELINE)
                __asm__ volatile("clflush %0" : "+m"(*(volatile char *)line));
        }
#else
        nvh_flush_slow_(pool, addr, len);
#endif
        return;
    case NVH_DOMAIN_EADR:
    case NVH_DOMAIN_PROCESS:
        __asm__ volatile("" ::: "memory");
        return;
    default: /* msync, sim */
        nvh_flush_slow_(pool, addr, len);
        return;
    }
}

static inline void nvh_drain(nvh_pool *pool)
{
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    nvh_stat_add_(ctx, NVH_STAT_FENCES, 1);
    switch ((nvh_domain)ctx->domain) {
    case NVH_DOMAIN_PMEM:
    case NVH_DOMAIN_EADR:
#if defined(__x86_64__)
        /* CLFLUSH is ordered with later stores by itself (Intel SDM), so as
         * in PMDK it needs no SFENCE; CLWB and CLFLUSHOPT do. */
        if (ctx->flush_kind != NVH_FLUSH_CLFLUSH) __asm__ volatile("sfence" ::: "memory");
        else __asm__ volatile("" ::: "memory");
#else
        NVH_FENCE_SEQ_CST_();
#endif
        return;
    case NVH_DOMAIN_PROCESS:
        __asm__ volatile("" ::: "memory");
        return;
    default:
        nvh_drain_slow_(pool);
        return;
    }
}

static inline void nvh_persist(nvh_pool *pool, const void *addr, size_t len)
{
    nvh_flush(pool, addr, len);
    nvh_drain(pool);
}

/* Copy then flush, without the fence. Uses non-temporal stores for copies of
 * at least the pool's NT threshold (default 256 B, NVHEAP_NT_THRESHOLD) in the
 * pmem domain. Returns dst. */
static inline void *nvh_memcpy_nodrain(nvh_pool *pool, void *dst, const void *src,
                                       size_t len)
{
    nvh_persist_ctx_ *ctx = NVH_CTX_(pool);
    if (ctx->domain == NVH_DOMAIN_PMEM && len >= ctx->nt_threshold) {
        nvh_memcpy_nt_(pool, dst, src, len);
        return dst;
    }
    memcpy(dst, src, len);
    nvh_flush(pool, dst, len);
    return dst;
}
static inline void *nvh_memcpy_persist(nvh_pool *pool, void *dst, const void *src,
                                       size_t len)
{
    nvh_memcpy_nodrain(pool, dst, src, len);
    nvh_drain(pool);
    return dst;
}
static inline void *nvh_memset_nodrain(nvh_pool *pool, void *dst, int c, size_t len)
{
    memset(dst, c, len);
    nvh_flush(pool, dst, len);
    return dst;
}
static inline void *nvh_memset_persist(nvh_pool *pool, void *dst, int c, size_t len)
{
    nvh_memset_nodrain(pool, dst, c, len);
    nvh_drain(pool);
    return dst;
}

/* ==========================================================================
 * 5. Statistics
 * ==========================================================================
 * Counted in every domain (so counts are hardware-independent figures):
 * `lines_flushed` counts 64 B lines passed to nvh_flush (and NT-copied lines),
 * `fences` counts nvh_drain calls, `msyncs` msync(2) calls actually made,
 * `nt_bytes` bytes copied with non-temporal stores. */
typedef struct nvh_stats {
    uint64_t lines_flushed;
    uint64_t fences;
    uint64_t msyncs;
    uint64_t nt_bytes;
} nvh_stats;

void nvh_stats_get(const nvh_pool *pool, nvh_stats *stats);
void nvh_stats_reset(nvh_pool *pool);

/* Which flush instruction this CPU would use (after NVHEAP_FLUSH). */
nvh_flush_kind nvh_flush_kind_detect(void);
const char *nvh_flush_kind_name(nvh_flush_kind kind);

/* ==========================================================================
 * 6. Crash simulator
 * ==========================================================================
 * In the sim domain the pool's working mapping is private memory and a
 * separate *media image* holds only what was flushed and then fenced. A crash
 * image at fence k is the media just before fence k takes effect, plus, for
 * every cache line whose working copy differs from the media, an independent
 * choice: old (never written back) or new (evicted early). In adversarial mode
 * each differing line instead gets a random subset of its 8-byte words new.
 * Choices are deterministic given (seed, fence index).
 *
 * nvh_crash_explore() runs a workload on a copy of a pool in the sim domain,
 * and at each chosen fence forks a child that writes the crash image to a
 * scratch file, calls the checker on it (the checker opens it — running
 * recovery — and verifies invariants), and exits. A checker that returns
 * non-zero, or a child that crashes, is a failure, recorded with the fence
 * index, the seed and the backtrace of the crash point. Fork-based: the child
 * sees the workload's volatile state as of the crash (e.g. what was already
 * acknowledged), which checkers use to decide what must have survived.
 * The workload should be single-threaded and deterministic for a given seed
 * (sampling runs it twice: once to count fences). */
typedef enum nvh_crash_mode {
    NVH_CRASH_LINES = 0,       /* each differing line: all old or all new */
    NVH_CRASH_WORDS = 1,       /* adversarial: random subset of 8-byte words */
} nvh_crash_mode;

typedef struct nvh_crash_point {
    uint64_t fence;            /* index of the fence (0-based); == fence_count
                                  means "after the workload, before close"  */
    uint64_t fence_count;      /* fences in the whole run (0 if not counted) */
    uint64_t seed;             /* seed from which this image was derived    */
    uint64_t lines_differing;  /* lines where working copy != media         */
} nvh_crash_point;

/* Runs in the parent on the working copy (open in the sim domain). Return 0
 * on success. */
typedef int (*nvh_crash_workload_fn)(nvh_pool *pool, void *arg);
/* Runs in a forked child on the crash image at image_path. Return 0 if the
 * image recovers to a consistent state. Print findings to stderr. */
typedef int (*nvh_crash_check_fn)(const char *image_path, const nvh_crash_point *point,
                                  void *arg);

typedef struct nvh_crash_failure {
    nvh_crash_point point;
    int status;                /* checker's return, or 128+signal if it crashed */
    char backtrace[2048];      /* symbolised stack of the crash point            */
} nvh_crash_failure;

typedef struct nvh_crash_config {
    const char *pool_path;     /* an existing pool; it is copied, never modified */
    const char *layout;        /* layout for opening it (NULL = any)             */
    nvh_crash_workload_fn workload;
    nvh_crash_check_fn check;
    void *arg;
    uint64_t seed;             /* base seed; 0 = 1                               */
    nvh_crash_mode mode;
    uint64_t budget;           /* 0: crash at every fence; N: N sampled fences   */
    unsigned images_per_point; /* random images per crash point; 0 = 1           */
    const char *scratch_dir;   /* for images; NULL = NVHEAP_SCRATCH or /dev/shm  */
    int keep_failed_images;    /* keep image files of failures (path printed)    */
} nvh_crash_config;

typedef struct nvh_crash_report {
    uint64_t fences;           /* fences the workload executed                   */
    uint64_t points_tested;    /* crash images checked                           */
    uint64_t failures;         /* how many failed                                */
    nvh_crash_failure first[8];/* the first failures, in order                   */
    int workload_status;       /* what the workload returned                     */
} nvh_crash_report;

/* Returns NVH_OK if the exploration ran (inspect report->failures), or an
 * error if it could not run (bad config, pool unreadable, fork failed). */
int nvh_crash_explore(const nvh_crash_config *config, nvh_crash_report *report);
/* Print a report (failures with fence, seed and backtrace) to a stream
 * (FILE *, given as void * to keep <stdio.h> out of this header). */
void nvh_crash_report_print(const nvh_crash_report *report, void *file);

/* Low-level: build the crash image of a sim-domain pool as of now (the state
 * a power failure right now could leave) and write it to path. */
int nvh_sim_write_image(nvh_pool *pool, const char *path, uint64_t seed,
                        nvh_crash_mode mode);
/* Number of fences executed by this sim-domain pool so far. */
uint64_t nvh_sim_fence_count(const nvh_pool *pool);
/* Hook called at every fence of a sim-domain pool, before the fence takes
 * effect (used by nvh_crash_explore; NULL removes it). */
typedef void (*nvh_sim_fence_hook)(nvh_pool *pool, uint64_t fence, void *arg);
void nvh_sim_set_fence_hook(nvh_pool *pool, nvh_sim_fence_hook hook, void *arg);

/* ==========================================================================
 * 7. Allocator
 * ==========================================================================
 * The heap area of a pool is managed by a persistent, failure-atomic,
 * wear-aware allocator (design in docs/ALLOC.md): chunks (4 MiB) of 4 KiB
 * blocks; objects up to 1984 B live in runs (one block, 64 B size classes),
 * larger ones in whole blocks (large) or whole chunks (huge). Every object is
 * at least 64 B and 64 B aligned. Pools grow automatically up to max_size;
 * a full pool fails with NVH_E_NOSPACE.
 *
 * Publication is two-step ([Schwalb15]): nvh_reserve returns memory that only
 * DRAM knows about; the application initialises and persists it, then
 * nvh_activate makes the allocation durable AND stores its offset into up to
 * NVH_LINKS_MAX link pointers (8-byte relative pointers inside the pool) in
 * one failure-atomic step: after a crash either the object is allocated and
 * every link points at it, or nothing happened. Cost: one fence, and one
 * flushed record line plus one line per link (amortised: see docs/ALLOC.md).
 * nvh_free is the mirror image. Named objects live in a persistent object
 * table (constant-time lookup right after open, no DRAM index to rebuild).
 *
 * Threads: all calls are thread-safe; each thread allocates from its own
 * arena (round robin over nvh_heap_config.arenas), frees of objects owned by
 * another arena are performed in the owner's log. */
#define NVH_ALLOC_ALIGN 64u
#define NVH_LINKS_MAX 14u          /* link pointers per activate/free       */
#define NVH_NAME_MAX 55u           /* bytes of a name, without the NUL      */

/* Reserve `size` bytes (0 counts as 1). DRAM only: after a crash the memory
 * is free again. NULL with NVH_E_NOSPACE if the pool is full, or if no zone
 * can hold `size`: an object lies in one zone, and zone 0 covers the pool's
 * size at creation while a zone it grew into later holds 64 chunks (256 MiB
 * with the default chunk): create a pool at the size its largest objects
 * need (PMDK pools are created at their size too). A power-of-two size over
 * 2 KiB takes exactly that many bytes (4 x 1 MiB fill one 4 MiB chunk). */
void *nvh_reserve(nvh_pool *pool, size_t size);
/* Give back a reservation that was never activated. */
int nvh_cancel(nvh_pool *pool, void *ptr);
/* Make a reservation durable and set *links[i] = nvh_off(pool, ptr) for every
 * i, failure-atomically. Links must be 8-byte aligned words inside the pool
 * (root area or heap objects), not inside the allocator's metadata.
 * Preconditions for crash consistency: the object's content must be durable
 * (nvh_persist it first), and so must each link's CURRENT value, unless an
 * earlier nvh_activate or nvh_free of this pool stored it (recovery restores
 * those first, in order): activate records it as the link's old value, and
 * recovery re-applies the link only while the media holds that value (so it
 * never overwrites a link the application changed later). The link stores
 * themselves become durable at the allocator's next fence; until then
 * recovery restores them. */
int nvh_activate(nvh_pool *pool, void *ptr, nvh_off_t *const links[], unsigned nlinks);

/* One link update for nvh_free: *link (which must point at the object) is
 * set to value (0 = clear, or redirect elsewhere). */
typedef struct nvh_link {
    nvh_off_t *link;
    nvh_off_t value;
} nvh_link;
/* Free an activated object and update its links, failure-atomically.
 * NVH_E_BADPTR: not an object of this pool (outside, misaligned, interior,
 * not activated); NVH_E_DOUBLEFREE: already free; NVH_E_CORRUPT: its header
 * fails its checksum (reported, the region is quarantined, nothing changes);
 * NVH_E_INVAL: the object is named (free it with nvh_free_named, which drops
 * the name with it; nothing changes).
 * The space rests in the don't-allocate FIFO before it is reused. */
int nvh_free(nvh_pool *pool, void *ptr, const nvh_link *links, unsigned nlinks);

/* Constructor for nvh_alloc: initialise ptr (size usable bytes); return 0,
 * or non-zero to abandon the allocation (nvh_alloc then fails, NVH_E_ABORTED). */
typedef int (*nvh_ctor_fn)(nvh_pool *pool, void *ptr, size_t size, void *arg);
/* reserve + constructor (or zero-fill if NULL) + persist + activate with one
 * link (link may be NULL). Returns the object or NULL. */
void *nvh_alloc(nvh_pool *pool, size_t size, nvh_ctor_fn ctor, void *arg, nvh_off_t *link);

/* Named objects (names of 1..NVH_NAME_MAX bytes; NVH_E_TOOLONG, NVH_E_EXISTS). */
void *nvh_reserve_named(nvh_pool *pool, const char *name, size_t size);
int nvh_activate_named(nvh_pool *pool, const char *name);
/* The object of that name (NULL and NVH_E_NOTFOUND if none); *size_out gets
 * its usable size if not NULL. A damaged object-table entry is never
 * followed: a name whose lookup passes one fails with NVH_E_CORRUPT (the
 * message names the entry and its offset; the free and reserve calls of that
 * name fail the same way); every other name stays usable. */
void *nvh_get_named(nvh_pool *pool, const char *name, size_t *size_out);
int nvh_free_named(nvh_pool *pool, const char *name);
/* Calls fn for every named object; stops when fn returns non-zero (and
 * returns that value). Damaged entries are skipped; after visiting every
 * intact one it returns NVH_E_CORRUPT if there was one. */
typedef int (*nvh_named_fn)(const char *name, void *ptr, size_t size, void *arg);
int nvh_named_foreach(nvh_pool *pool, nvh_named_fn fn, void *arg);

/* Usable bytes of an activated or reserved object (0 and NVH_E_BADPTR if not). */
size_t nvh_usable_size(nvh_pool *pool, const void *ptr);
/* Calls fn for every activated object (not while other threads free). */
typedef int (*nvh_object_fn)(void *ptr, size_t usable, void *arg);
int nvh_heap_foreach(nvh_pool *pool, nvh_object_fn fn, void *arg);

/* Retire every log ring: all allocator effects reach the media (2 fences per
 * ring with work). Done by close; useful before a pool is copied. */
int nvh_heap_sync(nvh_pool *pool);

/* Settings (per open pool; defaults from NVHEAP_FIFO_DELAY_NS,
 * NVHEAP_FIFO_MAX_BYTES, NVHEAP_ARENAS). Freed space stays in the
 * don't-allocate FIFO for fifo_delay_ns, unless the FIFO holds more than
 * fifo_max_bytes or the pool is otherwise full. */
typedef struct nvh_heap_config {
    uint64_t fifo_delay_ns;    /* T: minimum time before freed space is reused */
    uint64_t fifo_max_bytes;   /* space bound of the FIFO                      */
    unsigned arenas;           /* 1..16 arenas for new threads                 */
} nvh_heap_config;
int nvh_heap_config_get(nvh_pool *pool, nvh_heap_config *config);
int nvh_heap_config_set(nvh_pool *pool, const nvh_heap_config *config);

/* Corruption: a header that fails its checksum is reported to this callback
 * (offset of the header from the pool base, description), counted, and the
 * damaged region is contained (never handed out). */
typedef void (*nvh_corruption_fn)(nvh_pool *pool, uint64_t offset, const char *what, void *arg);
void nvh_heap_set_corruption_handler(nvh_pool *pool, nvh_corruption_fn fn, void *arg);
uint64_t nvh_heap_corruptions(const nvh_pool *pool);

/* Check every region header (for `nvheap check`): fn is called for each
 * corrupt region (offset, length). With repair the regions are quarantined
 * durably. Returns NVH_OK, or NVH_E_CORRUPT if corruption was found and not
 * repaired; *corrupt_out (may be NULL) gets the count. The _path form opens
 * the pool itself (read-only unless repairing). */
typedef void (*nvh_check_fn)(uint64_t offset, uint64_t length, const char *what, void *arg);
int nvh_heap_check(nvh_pool *pool, nvh_check_fn fn, void *arg, int repair,
                   uint64_t *corrupt_out);
int nvh_heap_check_path(const char *path, nvh_check_fn fn, void *arg, int repair,
                        uint64_t *corrupt_out);

/* Usage statistics (for `nvheap info --stats`), from a walk of all headers.
 * The object tables of named objects past the first 1024 names are heap
 * metadata: counted in heap_bytes, not in the object or byte counts. */
typedef struct nvh_heap_class_stats {
    uint64_t runs, slots_used, slots_total;
} nvh_heap_class_stats;
typedef struct nvh_heap_stats {
    uint64_t chunk_size, chunks;     /* chunks in use (high-water mark)          */
    uint64_t heap_bytes;             /* bytes covered by chunks in use           */
    uint64_t live_objects, live_bytes;
    uint64_t large_objects, huge_objects, run_bytes;
    uint64_t free_bytes, free_regions;
    uint64_t largest_free;           /* largest span of adjacent free regions    */
    double fragmentation;            /* 1 - largest_free / free_bytes (0: all
                                        free space is one span, or none)        */
    uint64_t quarantined_bytes, corrupt_regions, corruptions;
    uint64_t fifo_entries, fifo_bytes, fifo_oldest_ns; /* don't-allocate list   */
    uint64_t fifo_delay_ns, fifo_max_bytes;
    uint64_t records_replayed;       /* by the last open                         */
    nvh_heap_class_stats cls[64];    /* index = class (size = 64 * index), 1..63;
                                        cls[0]: the classes above 4032 B together */
} nvh_heap_stats;
int nvh_heap_stats_get(nvh_pool *pool, nvh_heap_stats *stats);

/* ==========================================================================
 * 8. Persist groups
 * ==========================================================================
 * The software form of [Moraru11]'s cache-line counters (design: docs/GROUP.md).
 * A group is a set of stores whose durability one deferred *action* waits for:
 *
 *   nvh_group_begin(g);
 *   rec->a = ...; rec->b = ...;                 // ordinary stores
 *   nvh_group_add(g, rec, sizeof *rec);         // after the stores
 *   nvh_group_end(g, publish, rec);             // publish(pool, g, rec) runs later
 *
 * add starts the write-back at once (no wait); an action runs only after a
 * fence issued after its group's adds, so its effect (publish a pointer,
 * write a validation key, bump a count) can never be durable before the
 * group's data. Actions run exactly once, in begin order. Fences are shared:
 * one fence retires every waiting group once batch_count groups wait or the
 * oldest waited batch_ns. Stores an action makes should be flushed by it
 * (nvh_flush); they become durable at the next fence (monotonic
 * consistency), at the latest at nvh_group_sync. When `slots` groups wait
 * (the counters are exhausted) begin falls back to synchronous persistence
 * (the paper's counter C0): write back and fence everything, run the actions.
 *
 * Threads: a context belongs to the thread that created it (nvh_drain orders
 * only the calling thread's flushes); other threads get NVH_E_INVAL. Several
 * threads on one pool each create their own. Destroy every context before
 * closing its pool.
 *
 * Models (what "written back" means), for experiments with [Moraru11] Fig. 7.
 * Lower/upper are bounds on throughput, as in the paper:
 *   REAL       flush at add, batched fences. The default; crash-consistent.
 *   SIM_CACHE  exact counters over a simulated cache of cache_lines lines:
 *              add only tags lines dirty; a line is written back (flushed)
 *              when evicted (LRU or seeded random) or at sync; a group's
 *              counter falls as its lines are written back and its action
 *              runs when it is zero (after one fence acknowledging the
 *              write-backs). Crash-consistent.
 *   SIM_LOWER  transient states last forever: nothing is written back until
 *              nvh_group_sync or the ring is full. Crash-consistent.
 *   SIM_UPPER  transient states end at once: no flush, no fence, the action
 *              runs at end. NOT crash-consistent: a performance bound only.
 */
typedef struct nvh_group_ctx nvh_group_ctx;

/* An action: runs on the context's thread from begin/end/poll/sync. It may
 * store and nvh_flush, and may begin/add/end further groups on ctx (chained
 * groups run after it); nvh_group_sync/destroy from an action fail. */
typedef void (*nvh_group_action)(nvh_pool *pool, nvh_group_ctx *ctx, void *arg);

typedef enum nvh_group_model {
    NVH_GROUP_REAL = 0,
    NVH_GROUP_SIM_CACHE = 1,
    NVH_GROUP_SIM_LOWER = 2,
    NVH_GROUP_SIM_UPPER = 3,
    NVH_GROUP_SIM_FOREVER = NVH_GROUP_SIM_LOWER,   /* the same, named by behaviour */
    NVH_GROUP_SIM_INSTANT = NVH_GROUP_SIM_UPPER,
} nvh_group_model;

typedef enum nvh_group_evict {
    NVH_GROUP_EVICT_LRU = 0,     /* least recently added line first          */
    NVH_GROUP_EVICT_RANDOM = 1,  /* uniformly random line (deterministic seed) */
} nvh_group_evict;

#define NVH_GROUP_NEVER UINT64_MAX       /* batch_ns / cache_lines: no limit   */
#define NVH_GROUP_SLOTS_MAX (1u << 20)

/* Zero-initialise and set what you need; 0 means the default. */
typedef struct nvh_group_options {
    unsigned slots;          /* groups waiting for their action; 0 = 64        */
    unsigned batch_count;    /* REAL: fence when this many wait; 0 = 32,
                                UINT_MAX = only when the ring is full         */
    uint64_t batch_ns;       /* REAL: ... or when the oldest waited this long
                                (checked at 1, 2, 4, ... waiting and at poll, so
                                up to ~2x); 0 = 100 us; NVH_GROUP_NEVER = none
                                (for deterministic crash exploration)         */
    nvh_group_model model;
    uint64_t cache_lines;    /* SIM_CACHE: capacity; 0 = 131072 (8 MiB)       */
    nvh_group_evict evict;   /* SIM_CACHE: eviction policy                    */
    uint64_t seed;           /* SIM_CACHE random eviction; 0 = 1              */
    int sgroup_fence;        /* SIM_*: one fence per begin, as [Moraru11] emulated
                                the sgroup instruction                        */
} nvh_group_options;

/* Counters of one context (hardware-independent figures for benchmarks). */
typedef struct nvh_group_stats {
    uint64_t groups;         /* groups ended                                  */
    uint64_t actions;        /* groups retired (their action, if any, ran)    */
    uint64_t fences;         /* nvh_drain calls made by the group layer       */
    uint64_t batch_fences;   /* REAL: ... of them triggered by batch_count     */
    uint64_t timed_fences;   /* REAL: ... by batch_ns                          */
    uint64_t syncs;          /* nvh_group_sync calls that had work             */
    uint64_t fallbacks;      /* ring full: synchronous write-back (C0)        */
    uint64_t lines_added;    /* cache lines passed to add                     */
    uint64_t lines_written_back; /* lines the layer flushed                   */
    uint64_t evictions;      /* SIM_CACHE: write-backs caused by eviction      */
    uint64_t delay_groups;   /* sum over retired groups of the groups ended
                                after it before its action ran (/ actions =
                                mean transient-state length, in groups)       */
    uint64_t pending;        /* begun, action not yet run (incl. an open one) */
    uint64_t max_pending;
} nvh_group_stats;

/* Create a context for the calling thread on pool (options NULL = defaults).
 * NVH_E_INVAL for bad options, NVH_E_READONLY for a read-only pool. */
nvh_group_ctx *nvh_group_ctx_create(nvh_pool *pool, const nvh_group_options *options);
/* nvh_group_sync, then free. An open group is ended without an action.
 * NULL is a no-op. */
int nvh_group_ctx_destroy(nvh_group_ctx *ctx);

/* Groups do not nest: begin with a group open, add/end without one fail
 * with NVH_E_INVAL. add: [addr, addr+len) must lie in the pool (NVH_E_BADPTR),
 * len 0 is a no-op; call it after the stores (later stores need another add).
 * end: action may be NULL (the group is still ordered and synced). */
int nvh_group_begin(nvh_group_ctx *ctx);
int nvh_group_add(nvh_group_ctx *ctx, const void *addr, size_t len);
int nvh_group_end(nvh_group_ctx *ctx, nvh_group_action action, void *arg);

/* Run what is ready without forcing (REAL: fence if the oldest group is
 * older than batch_ns). For idle threads. Returns actions run, or an error. */
int nvh_group_poll(nvh_group_ctx *ctx);
/* Force everything: write back, fence, run every waiting action (and those
 * they chain), fence again so their flushed effects are durable. */
int nvh_group_sync(nvh_group_ctx *ctx);

uint64_t nvh_group_pending(const nvh_group_ctx *ctx);  /* begun, action not run */
nvh_pool *nvh_group_pool(const nvh_group_ctx *ctx);
/* Effective options (defaults filled in). */
int nvh_group_options_get(const nvh_group_ctx *ctx, nvh_group_options *options);
void nvh_group_stats_get(const nvh_group_ctx *ctx, nvh_group_stats *stats);
void nvh_group_stats_reset(nvh_group_ctx *ctx);       /* keeps pending     */

/* ==========================================================================
 * 9. Transactions
 * ==========================================================================
 * Durable, failure-atomic transactions over pool memory (design: docs/TX.md).
 * A transaction belongs to the calling thread and one pool; each thread has
 * its own log lane in the pool (NVH_TX_LANES_MAX threads at once).
 *
 * Two ways to modify data, mixable in one transaction:
 *
 *   In place (PMDK style, no isolation: the caller serialises threads):
 *     nvh_tx_begin(pool);
 *     nvh_tx_add_range(pool, &acct->balance, 8);  // snapshot, THEN store
 *     acct->balance -= 10;
 *     nvh_tx_commit(pool);                         // durable when it returns
 *
 *   Objects (NVTM style, isolated: threads may share objects):
 *     const struct a *r = nvh_tx_open_read(pool, x, sizeof *x);  // in place
 *     struct a *w = nvh_tx_open_write(pool, y, sizeof *y);       // private copy
 *     w->balance = r->balance + 1;                // applied to y at commit
 *   Conflicts abort the transaction (NULL + NVH_E_ABORTED); nvh_tx_run()
 *   retries it under the contention policy. Eager write locks, commit-time
 *   validation of read versions: no lost update; a transaction that commits
 *   saw no torn or inconsistent read (one that will abort may: see below).
 *
 * Cost (pmem domain; the library picks the protocol per transaction,
 * docs/TX.md): an empty or read-only transaction costs no fence; one whose
 * writes are known by value — objects opened for write and words given
 * with nvh_tx_write_word, at most 8 changed 8-byte words in all, no
 * nvh_tx_add_*, alloc or free — costs ONE fence; anything else 2. Every
 * nvh_tx_add_* call costs one fence before the caller may store (add
 * several ranges with one nvh_tx_add_ranges call to pay one), the commit
 * one more; with at most 8 words added the commit does not wait for the
 * data's write-back. Allocations cost the allocator's fence each at commit;
 * an abort that logged costs 2. nvh_tx_protocol_set can force the
 * two-fence protocol everywhere, for comparisons.
 *
 * Abort: every added range is restored exactly, objects allocated in the
 * transaction are released, frees are dropped. Nothing else is restored:
 * local variables and DRAM keep the values they had at the abort (there is
 * no setjmp/longjmp), so after a failed commit re-read what you need.
 *
 * Nesting is flattened: begin inside a transaction only counts a level; the
 * outermost commit commits. An abort at any level rolls back at once; the
 * transaction then stays open in the aborted state, every call but
 * commit/abort fails with NVH_E_ABORTED, and each level's commit returns
 * NVH_E_ABORTED until the outermost one closes it.
 *
 * Errors: every call returns a code (or NULL + nvh_errcode()): NVH_E_INVAL
 * (no transaction, bad argument), NVH_E_BADPTR (range not inside the pool,
 * object not allocated), NVH_E_NOSPACE (pool full, or the log would exceed
 * its limit: logs grow on demand up to nvh_tx_config.log_limit per thread),
 * NVH_E_ABORTED (aborted, or a conflict), NVH_E_BUSY (no free lane),
 * NVH_E_NOTSUP (read-only pool). After a failed call inside a transaction
 * the transaction is aborted (rolled back) except for NVH_E_INVAL on a bad
 * argument, which leaves it untouched.
 *
 * Recovery: nvh_pool_open rolls back every incomplete transaction and
 * finishes every committed one whose data might not be durable; a crash
 * during recovery is recovered by the next open. Read-only opens skip it.
 *
 * Stray-write protection (section 11): in a protected pool the library's
 * own stores are inside write windows, and so are the caller's stores into
 * ranges added with nvh_tx_add_range* and into objects from nvh_tx_alloc:
 * those stay writable until the transaction commits or aborts, so code
 * inside a transaction needs no nvh_unprotect of its own (a store there
 * after the commit is a stray again).
 *
 * Rules: store only into ranges added to the transaction (or into objects
 * it allocated), or give words as values; modify shared objects only
 * through open_write (not with nvh_tx_write_word either); another
 * thread's NON-transactional store to data a transaction of this thread
 * just committed must come after nvh_tx_quiesce (or any later fence of this
 * thread), otherwise recovery could replay the older transaction over it. */
#define NVH_TX_LANES_MAX 64u

typedef enum nvh_tx_hint {
    NVH_TX_HINT_AUTO = 0,    /* word record for <= 8 bytes in one word, else object */
    NVH_TX_HINT_WORD = 1,    /* one word record per 8-byte word (metadata-heavy) */
    NVH_TX_HINT_OBJECT = 2,  /* one object record with a copy of the range       */
} nvh_tx_hint;

typedef struct nvh_tx_range {
    void *ptr;
    size_t len;
    nvh_tx_hint hint;
} nvh_tx_range;

int nvh_tx_begin(nvh_pool *pool);
/* Snapshot [ptr, ptr+len) before modifying it in place (len 0: no-op).
 * Adding a range already added is cheap (no record). */
int nvh_tx_add_range(nvh_pool *pool, void *ptr, size_t len);
int nvh_tx_add_range_hint(nvh_pool *pool, void *ptr, size_t len, nvh_tx_hint hint);
int nvh_tx_add_ranges(nvh_pool *pool, const nvh_tx_range *ranges, unsigned n);
/* One 8-byte aligned word. */
int nvh_tx_add_word(nvh_pool *pool, void *word);
/* Words given as values (one-fence transactions, docs/TX.md): the new
 * value of an 8-byte aligned word is buffered in the transaction and stored
 * in place only at commit; nothing is snapshotted. A transaction whose only
 * writes are at most 8 such words (no add_range, alloc, free or object
 * access) commits with ONE fence (pmem domain; 1 log line per 2 words)
 * instead of two; otherwise the words fall back to the two-fence protocol
 * at commit. Writing the same word again replaces its value (it also wins
 * over in-place stores to that word in the same transaction). Until the
 * commit the word in place still holds its old value: read it back with
 * nvh_tx_read_word (the buffered value, else the word in place), or keep
 * your own copy. Abort drops the values. Rule: a NON-transactional store to
 * such a word (by any thread) must come after a later transaction of the
 * writing thread or after nvh_tx_quiesce (the values are durable at once,
 * but the log entry is retired only at the thread's next fence). Errors:
 * NVH_E_INVAL (no transaction, misaligned), NVH_E_BADPTR (not in the pool). */
int nvh_tx_write_word(nvh_pool *pool, void *word, uint64_t value);
uint64_t nvh_tx_read_word(nvh_pool *pool, const void *word);
/* Zeroed memory that exists only if the transaction commits. */
void *nvh_tx_alloc(nvh_pool *pool, size_t size);
/* Free an object (activated, or allocated in this transaction) at commit. */
int nvh_tx_free(nvh_pool *pool, void *ptr);
/* Outermost: make everything durable, return NVH_OK; NVH_E_ABORTED if the
 * transaction was aborted (or a read was invalidated by a concurrent
 * commit: then nothing happened and a retry may succeed). */
int nvh_tx_commit(nvh_pool *pool);
/* Roll back now (see above). NVH_E_INVAL if no transaction is open. */
int nvh_tx_abort(nvh_pool *pool);

typedef enum nvh_tx_stage {
    NVH_TX_NONE = 0, NVH_TX_WORK = 1, NVH_TX_ABORTED = 2,
} nvh_tx_stage;
nvh_tx_stage nvh_tx_stage_get(nvh_pool *pool);
int nvh_tx_depth(nvh_pool *pool);

/* Object transactions. obj must lie inside the pool; size > 0. The returned
 * pointers are valid until the transaction ends. Opening an object for
 * write after opening it returns a private copy; from then on every open
 * of it returns that copy (a read after a write sees the write).
 * On a conflict: NULL, NVH_E_ABORTED, transaction rolled back; pointers
 * the transaction got before must not be used any more.
 *
 * nvh_tx_open_read returns obj itself (no copy; NVTM): the object is read
 * in place and validated at commit (and when a later open meets an object
 * newer than the transaction's snapshot), so a transaction that commits
 * saw one consistent snapshot. Before that a read may see a concurrent
 * commit's values: each aligned 8-byte word holds a value some commit
 * wrote, but words may come from different commits (a torn object). Such
 * a transaction is doomed (it aborts at commit at the latest; an error it
 * returns, or a NULL or out-of-pool pointer it opens, is turned into a
 * retried conflict), and memory freed meanwhile is not reused under it;
 * keep loops over an object's contents bounded by its size and follow
 * pointers only through the open calls. Concurrently
 * written words read in place are data races in C11 terms: read them with
 * __atomic_load_n(p, __ATOMIC_RELAXED) to keep a race detector quiet.
 * nvh_tx_open_read_copy returns a private copy that is consistent with
 * everything read before when it is returned (it costs the copy). */
const void *nvh_tx_open_read(nvh_pool *pool, const void *obj, size_t size);
const void *nvh_tx_open_read_copy(nvh_pool *pool, const void *obj, size_t size);
void *nvh_tx_open_write(nvh_pool *pool, void *obj, size_t size);

/* Run fn in a transaction, retrying on conflicts (fn returns NVH_OK to
 * commit, anything else to abort and return that code). The calling thread
 * remembers what fn did in its last runs: after a run of fn that only read
 * objects, the next one starts without a read set (each open, and the end,
 * check that no object commit began since the snapshot; cheaper opens),
 * and a write there (or a commit that began) retries fn at once with a
 * read set, and fn's next runs start with one again. Either way the
 * guarantees are the same; the choice only costs a writing run a few
 * instructions. */
typedef int (*nvh_tx_fn)(nvh_pool *pool, void *arg);
int nvh_tx_run(nvh_pool *pool, nvh_tx_fn fn, void *arg);

/* nvh_tx_run whose first attempt is the one without a read set whatever
 * fn did before (a hint: the caller knows fn only reads, e.g. its first
 * run). Same guarantees; a write by fn only costs the retry. */
int nvh_tx_run_read(nvh_pool *pool, nvh_tx_fn fn, void *arg);

/* Make every committed transaction's retirement durable (two fences if a
 * one-fence word transaction of some thread is still pending, else one). */
int nvh_tx_quiesce(nvh_pool *pool);

/* Settings (per open pool). Contention policy: a transaction that finds an
 * object locked spins `spin` times, then aborts; nvh_tx_run then waits a
 * random time in [backoff_min_ns, min(backoff_max_ns, min << attempt)] and
 * retries, at most max_retries times (0 = forever). */
typedef struct nvh_tx_config {
    uint64_t log_limit;        /* bytes of log per thread; default 64 MiB       */
    unsigned max_retries;      /* default 0 (forever)                          */
    unsigned spin;             /* default 64                                    */
    uint64_t backoff_min_ns;   /* default 200                                   */
    uint64_t backoff_max_ns;   /* default 100000                                */
} nvh_tx_config;
int nvh_tx_config_get(nvh_pool *pool, nvh_tx_config *config);
int nvh_tx_config_set(nvh_pool *pool, const nvh_tx_config *config);

/* Which commit protocol transactions get (per open pool; docs/TX.md).
 * AUTO (default): the library chooses per transaction: ONE fence when the
 * write set is known by value and small (at most 8 changed words, given
 * with nvh_tx_write_word or in objects opened with nvh_tx_open_write, no
 * nvh_tx_add_*, alloc or free), else the two-fence protocol. UNDO: always
 * the two-fence protocol (for experiments and comparisons). Both are
 * equally durable and atomic; only the fence count differs. */
typedef enum nvh_tx_protocol {
    NVH_TX_PROTO_AUTO = 0,
    NVH_TX_PROTO_UNDO = 1,
} nvh_tx_protocol;
int nvh_tx_protocol_set(nvh_pool *pool, nvh_tx_protocol protocol);
nvh_tx_protocol nvh_tx_protocol_get(nvh_pool *pool);

typedef struct nvh_tx_stats {
    uint64_t commits, aborts;  /* outermost transactions                         */
    uint64_t conflicts;        /* aborts caused by conflicts                      */
    uint64_t retries;          /* by nvh_tx_run                                   */
    uint64_t bytes_logged;     /* log bytes written (records, copies, commits)    */
    uint64_t recovered;        /* transactions rolled back/forward at open        */
} nvh_tx_stats;
int nvh_tx_stats_get(nvh_pool *pool, nvh_tx_stats *stats);
void nvh_tx_stats_reset(nvh_pool *pool);

/* Epoch-based persistent locks ([Coburn09]): a lock is one 8-byte word in the
 * pool, held when it equals the pool's current epoch. Every open bumps the
 * epoch, so all locks are free after a restart without any scan. Zero is
 * "free". Not recursive. Locks need no flushing. */
typedef struct nvh_plock { NVH_ATOMIC_U64_ word; } nvh_plock;
int nvh_plock_acquire(nvh_pool *pool, nvh_plock *lock);
int nvh_plock_try(nvh_pool *pool, nvh_plock *lock);   /* NVH_E_BUSY if held */
int nvh_plock_release(nvh_pool *pool, nvh_plock *lock);
int nvh_plock_held(nvh_pool *pool, const nvh_plock *lock);  /* 1 or 0 */

/* Reference-counted objects ([Coburn09]): zeroed objects with a count, whose
 * references (nvh_off_t fields) are assigned failure-atomically with the
 * count changes (each assignment is a small transaction: its log records are
 * the operation descriptors). When a count reaches zero the object is
 * destroyed recursively: the type's refs callback lists the reference fields
 * of an object; a crash in the middle is finished by nvh_rc_recover (call it
 * after registering the types, once per open). Counts are guarded by epoch
 * locks, so assignment is thread-safe; cycles are never reclaimed.
 * Objects are 64-byte aligned; a 64-byte header precedes each. */
typedef unsigned (*nvh_rc_refs_fn)(nvh_pool *pool, void *obj, nvh_off_t **refs, unsigned max);
int nvh_rc_register(nvh_pool *pool, uint32_t type, nvh_rc_refs_fn refs);  /* type < 256 */
/* New object (count 1) referenced by *dst; the object *dst referenced before
 * loses that reference. NULL on error. */
void *nvh_rc_new(nvh_pool *pool, size_t size, uint32_t type, nvh_off_t *dst);
/* *dst = obj (NULL allowed), counts adjusted atomically with the store. */
int nvh_rc_assign(nvh_pool *pool, nvh_off_t *dst, void *obj);
uint64_t nvh_rc_count(nvh_pool *pool, const void *obj);
int nvh_rc_recover(nvh_pool *pool);

/* ==========================================================================
 * 10. B+ tree
 * ==========================================================================
 * The consistent B+ tree of [Moraru11] §6 (design: docs/BTREE.md): 64-bit keys,
 * values of any size in value records carved from tree-owned slabs. Nodes
 * are append-only; a value becomes valid when the leaf entry's pointer to
 * it is written, after the record and the entry's key are durable (persist
 * groups); a split builds two new nodes and retires the old one only after
 * they and the parent's pointers are durable; deletes null a pointer.
 * Monotonic: whatever was recoverable once stays recoverable.
 *
 * Durability (nvh_btree_options.durability): by default
 * (NVH_BTREE_DURABLE_ON_RETURN) put and delete return once the operation is
 * durable: after a crash it is there (2 fences per insert, 2 per update, 1
 * per delete). Opt-in NVH_BTREE_DURABLE_DEFERRED (GROUPS mode): a put
 * returns before it is durable and is acknowledged when nvh_btree_durable()
 * reaches its operation number (ops are numbered 1, 2, ... in issue order;
 * every op <= durable() survives a crash; of the puts issued after it, each
 * survives whole or not at all, independently — updates and deletes first
 * make all earlier ops durable); nvh_btree_sync() makes everything durable,
 * and so do nvh_btree_close and nvh_pool_close. Every op is atomic either way.
 *
 * Recovery: open does no scan. Inserts that were never validated and splits
 * that were interrupted are ignored by readers and repaired/reclaimed by the
 * next write that reaches them; nvh_btree_reclaim does all of them at once
 * and also frees the record slabs of earlier sessions that hold no live
 * record (slabs of the current session are freed as they empty).
 * Stray-write protection: every store the tree makes into the pool is
 * inside a write window of its own (closed once the store is durable); the
 * current record slab (64 KiB) and up to 16 reserved nodes are also held
 * writable while the tree is open, so fresh pages cost one unprotect per
 * slab or batch instead of one per page (docs/BTREE.md).
 *
 * Threads: a tree handle is not thread-safe: it belongs to the thread that
 * opened it, and calls from another thread fail with NVH_E_BUSY. Opening an
 * open tree again (same thread, same options) returns the same handle, with
 * a reference more (close it once per open); other options: NVH_E_BUSY.
 * nvh_pool_close closes the trees still open (all their operations durable
 * first); their handles are then invalid. */
typedef struct nvh_btree nvh_btree;

/* Largest value (NVH_E_TOOLONG above it). */
#define NVH_BTREE_VALUE_MAX ((size_t)UINT32_MAX)

typedef enum nvh_btree_mode {
    NVH_BTREE_GROUPS = 0,    /* persist groups (the paper's design; default)  */
    NVH_BTREE_FLUSH = 1,     /* same tree, flush + fence at every step        */
    NVH_BTREE_NT = 2,        /* same tree, non-temporal stores + fence         */
    NVH_BTREE_VOLATILE = 3,  /* DRAM only (malloc), no consistency: baseline  */
} nvh_btree_mode;

typedef enum nvh_btree_durability {
    NVH_BTREE_DURABLE_ON_RETURN = 0, /* put/delete durable when they return (default) */
    NVH_BTREE_DURABLE_DEFERRED = 1,  /* GROUPS: puts durable later (batched fences):
                                        nvh_btree_durable(), nvh_btree_sync()   */
} nvh_btree_durability;

typedef struct nvh_btree_options {
    nvh_btree_mode mode;
    int sorted;              /* VOLATILE only: classic sorted nodes, shifting
                                inserts, in-place splits (the "original" tree) */
    int count_wear;          /* count stores per 64 B line of node memory       */
    const nvh_group_options *group; /* GROUPS: context options (NULL = defaults) */
    int no_key_directory;    /* no DRAM key directory (key -> record hash table,
                                32 B per key): lookups descend the tree. The
                                directory starts at the first lookup (built from
                                the leaves a few at a time by the next lookups);
                                until then writes do not pay for it (BTREE.md) */
    nvh_btree_durability durability; /* default: durable on return          */
} nvh_btree_options;

typedef struct nvh_btree_stats {
    uint64_t splits, root_splits, repairs, leaves_removed, reclaimed;
    uint64_t syncs;          /* group syncs forced by structural changes       */
    uint64_t nodes;          /* nodes allocated                                */
    uint64_t slabs, slabs_freed; /* record slabs activated / freed (empty)    */
    uint64_t directory_keys; /* keys the key directory holds now              */
    int directory_state;     /* 0 not started (no lookup yet), 1 being built
                                from the leaves, 2 complete (or turned off)    */
} nvh_btree_stats;

/* Called (from the op or group action that made it so) when the durable
 * watermark advances. */
typedef void (*nvh_btree_durable_fn)(nvh_btree *tree, uint64_t durable, void *arg);

/* Open the tree `name` (1..40 bytes) of pool, creating it if `create` and it
 * does not exist (NVH_E_NOTFOUND otherwise). VOLATILE: pool may be NULL and
 * the tree lives in DRAM. options NULL = GROUPS with defaults (GROUPS needs
 * a writable pool: open a read-only pool's tree in FLUSH mode). A header
 * or root node that fails validation: NULL and NVH_E_CORRUPT. */
nvh_btree *nvh_btree_open(nvh_pool *pool, const char *name, int create,
                          const nvh_btree_options *options);
/* Drop a reference; the last one syncs, then frees the DRAM state (the tree
 * stays in the pool). A read-only pool opens trees read-only (get, scan and
 * count work; writes fail NVH_E_READONLY). */
int nvh_btree_close(nvh_btree *tree);

/* Insert or replace. NVH_E_TOOLONG if len > NVH_BTREE_VALUE_MAX,
 * NVH_E_READONLY on a read-only pool (the tree is unchanged). */
int nvh_btree_put(nvh_btree *tree, uint64_t key, const void *value, size_t len);
/* Value of key: *value points into the pool, valid until the next write.
 * NVH_E_NOTFOUND if absent. value/len may be NULL.
 * Damage: every node and record offset read from the pool is validated
 * before it is followed; a damaged node or record on the key's path gives
 * NVH_E_CORRUPT (message: structure and offset), never a fault, and keys
 * elsewhere stay readable. The same holds for scan, count and check. */
int nvh_btree_get(nvh_btree *tree, uint64_t key, const void **value, size_t *len);
int nvh_btree_delete(nvh_btree *tree, uint64_t key);   /* NVH_E_NOTFOUND */
/* Keys in [from, to] in ascending order; stops when fn returns non-zero
 * (and returns that value). A damaged subtree or record is skipped, the
 * walk goes on, and the call returns NVH_E_CORRUPT at the end. */
typedef int (*nvh_btree_scan_fn)(uint64_t key, const void *value, size_t len, void *arg);
int nvh_btree_scan(nvh_btree *tree, uint64_t from, uint64_t to,
                   nvh_btree_scan_fn fn, void *arg);
/* Live keys (counted by one walk after open, then maintained). In a
 * damaged tree: the keys that are readable, with nvh_errcode() NVH_E_CORRUPT
 * (and counted again at the next call). */
uint64_t nvh_btree_count(nvh_btree *tree);

int nvh_btree_sync(nvh_btree *tree);
uint64_t nvh_btree_ops(const nvh_btree *tree);
uint64_t nvh_btree_durable(const nvh_btree *tree);
void nvh_btree_set_durable_fn(nvh_btree *tree, nvh_btree_durable_fn fn, void *arg);

/* Repair every interrupted split and free every unvalidated record now. */
int nvh_btree_reclaim(nvh_btree *tree);
/* Check every invariant (ranges, magic, pointers inside the pool and
 * allocated, no duplicate live key); NVH_E_CORRUPT with a message if not. */
int nvh_btree_check(nvh_btree *tree);
void nvh_btree_stats_get(const nvh_btree *tree, nvh_btree_stats *stats);
nvh_group_ctx *nvh_btree_group(const nvh_btree *tree);
/* count_wear: writes per line of node memory. Calls fn(count, arg) for every
 * line written at least once; returns the number of lines. */
uint64_t nvh_btree_wear_foreach(const nvh_btree *tree, void (*fn)(uint64_t writes, void *arg),
                                void *arg);

/* ==========================================================================
 * 11. Stray-write protection
 * ==========================================================================
 * Keeps a pool's pages read-only except inside write windows, so a stray
 * store (a wild pointer, an overflow from DRAM data) into persistent memory
 * traps instead of corrupting the pool for good ([Moraru11] §4, in user space
 * on stock Linux; design and rules: docs/PROTECT.md).
 *
 *   nvh_protect_set_mode(pool, NVH_PROTECT_ASYNC, 40000000);   // 40 ms
 *   nvh_unprotect(pool, node, sizeof *node);    // open a write window
 *   node->count++;                              // legal store
 *   nvh_protect(pool, node, sizeof *node);      // close it
 *
 * Windows are counted per 4 KiB page: a page is writable while at least one
 * window covering it is open (in any thread); nested and overlapping windows
 * are fine, every nvh_unprotect needs its nvh_protect.
 *
 * Modes:
 *   OFF    no protection; unprotect/protect cost one load and a branch.
 *   SYNC   each call that opens the first / closes the last window on a page
 *          calls mprotect(2) before returning (a page-state bitmap skips
 *          redundant calls): the paper's baseline.
 *   ASYNC  calls only queue the page (lock-free) and return; a service
 *          thread wakes every interval_ns, sorts and coalesces the queued
 *          pages into ranges, drops protect/unprotect pairs that cancel and
 *          applies the rest with as few mprotect calls as it can. A store to
 *          a page whose unprotect is still queued faults; the SIGSEGV handler
 *          sees the open window, makes the page writable at once and the
 *          store proceeds transparently. A closed window's page stays
 *          writable until the pass after next if it was used in the last
 *          interval (so hot pages never pay), else until the next pass:
 *          1-2 intervals (NVH_PROTECT_STRICT: at most ~1).
 *
 * Stray writes: a store to a protected page with no open window. The handler
 * reports it: it calls the pool's stray handler if one is set, else writes
 *   "nvheap: stray write to protected pool memory at ADDR (pool PATH,
 *    offset 0xOFF, page N, protection MODE)"
 * to stderr and aborts (SIGABRT). Never ignored, never silently allowed.
 * Other SIGSEGVs (outside every protected pool) go to the handler that was
 * installed before nvheap's, or get the default action.
 *
 * Threads: unprotect/protect/sync/stats are thread-safe. set_mode and
 * configure must not race with other calls on the same pool, and must be
 * called with no window open. Pools: up to 64 protected at once per process.
 * Library writes open their own windows, so protection may stay on across
 * nvheap calls: the pool layer (superblock updates at grow and close), the
 * allocator, the B+ tree (which keeps one window open over its current
 * 64 KiB record slab while the tree is open) and the hash map do; persist
 * groups store nothing themselves (actions are the application's); for
 * transactions see docs/TX.md. docs/PROTECT.md has the per-layer table.
 * NVHEAP_PROTECT=off|sync|async[:interval_ns] in the environment turns
 * protection on at every nvh_pool_open/create (docs/PROTECT.md).
 * grow keeps new pages protected; close makes its own writes in a window,
 * then turns protection off and stops the service thread. */
typedef enum nvh_protect_mode {
    NVH_PROTECT_OFF = 0,
    NVH_PROTECT_SYNC = 1,
    NVH_PROTECT_ASYNC = 2,
} nvh_protect_mode;

#define NVH_PROTECT_INTERVAL_DEFAULT 1000000ull      /* 1 ms                 */
#define NVH_PROTECT_INTERVAL_MIN 1000ull             /* 1 us                 */
#define NVH_PROTECT_INTERVAL_MAX 10000000000ull      /* 10 s                 */

/* Option bits (nvh_protect_options.flags). */
#define NVH_PROTECT_EAGER_UNPROTECT 0x1u  /* async: an unprotect of a read-only
                                             page applies at once (one mprotect
                                             instead of a later fault); protects
                                             stay queued                        */
#define NVH_PROTECT_NO_LATENCY 0x2u       /* async: do not timestamp requests   */
#define NVH_PROTECT_STRICT 0x4u           /* async: protect a page at the first
                                             pass after its last window closed.
                                             Default: a page whose window closed
                                             again since the previous pass stays
                                             writable one more interval (hot
                                             pages cost no mprotect, no fault);
                                             exposure <= 2 intervals. STRICT
                                             also turns the window cache off    */
#define NVH_PROTECT_NO_CACHE 0x8u         /* async: no per-thread window cache.
                                             Default (intervals >= 1 ms): a
                                             thread keeps the window-count unit
                                             of a page it closed a window on
                                             until a pass finds the page unused
                                             for a whole interval, so its next
                                             window there updates no shared
                                             count (no LOCKed instruction);
                                             same exposure (docs/PROTECT.md)   */

typedef struct nvh_protect_options {
    nvh_protect_mode mode;
    uint64_t interval_ns;   /* async service period; 0 = 1 ms; MIN..MAX      */
    unsigned queue_slots;   /* async request ring (rounded up to a power of
                               two); 0 = 65536. A full ring makes the producer
                               apply the queue itself.                        */
    unsigned flags;         /* NVH_PROTECT_* bits                            */
} nvh_protect_options;

/* Turn protection on (every page read-only; interval_ns for ASYNC, 0 =
 * default), change mode or interval, or turn it off (every page writable).
 * NVH_E_READONLY on a read-only pool, NVH_E_INVAL for a bad mode/interval,
 * NVH_E_NOTSUP if the SIGSEGV handler cannot be installed (for instance ASan
 * with allow_user_segv_handler=0). */
int nvh_protect_set_mode(nvh_pool *pool, nvh_protect_mode mode, uint64_t interval_ns);
int nvh_protect_configure(nvh_pool *pool, const nvh_protect_options *options);
nvh_protect_mode nvh_protect_get_mode(const nvh_pool *pool);
/* Change only the async interval (takes effect at the next wake-up). */
int nvh_protect_set_interval(nvh_pool *pool, uint64_t interval_ns);

/* Open / close a write window on the pages of [p, p+len). len 0 is a no-op;
 * NVH_E_BADPTR if the range is not inside the pool; nvh_protect of a page
 * with no open window counts as unbalanced and returns NVH_E_INVAL (the
 * other pages of the range are still processed). NVH_OK when off. */
int nvh_unprotect(nvh_pool *pool, const void *p, size_t len);
int nvh_protect(nvh_pool *pool, const void *p, size_t len);
/* Apply every queued request now, in the caller (async); no-op otherwise. */
int nvh_protect_sync(nvh_pool *pool);

/* Stray handler: runs IN THE SIGNAL HANDLER of the faulting thread, so it
 * must be async-signal-safe (no malloc, stdio, locks, nor nvh_protect /
 * nvh_unprotect, which may take the pool's apply lock). Return ABORT for the
 * default report and abort, ALLOW to let the store proceed: this opens a
 * window on the page, which the application closes with nvh_protect (until
 * then the page is writable). It may also siglongjmp out. */
typedef enum nvh_stray_action {
    NVH_STRAY_ABORT = 0,
    NVH_STRAY_ALLOW = 1,
} nvh_stray_action;

typedef struct nvh_stray_info {
    nvh_pool *pool;
    void *addr;             /* faulting address                               */
    uint64_t offset;        /* addr - pool base                               */
    const char *path;       /* pool file                                      */
    nvh_protect_mode mode;
} nvh_stray_info;

typedef nvh_stray_action (*nvh_stray_handler)(const nvh_stray_info *info, void *arg);
/* Per pool; NULL restores the default (report + abort). */
int nvh_protect_set_stray_handler(nvh_pool *pool, nvh_stray_handler fn, void *arg);

/* Counters since protection was first turned on (kept across mode changes,
 * reset by nvh_protect_stats_reset). */
typedef struct nvh_protect_stats {
    uint64_t mprotect_calls;   /* every mprotect(2) made for the pool           */
    uint64_t pages_changed;    /* pages whose protection those calls changed     */
    uint64_t requests;         /* async: page ranges queued                      */
    uint64_t batches;          /* async: passes that found requests              */
    uint64_t cancelled;        /* queued pages that needed no change when
                                  processed (protect/unprotect pairs)            */
    uint64_t faults_resolved;  /* faults on pages with an open window, made
                                  writable by the handler (queued unprotects)   */
    uint64_t internal_faults;  /* faults inside library (implicit) windows       */
    uint64_t strays;           /* stray writes caught                            */
    uint64_t queue_full;       /* producer found the ring full, applied itself   */
    uint64_t unbalanced;       /* nvh_protect of a page with no open window       */
    uint64_t sync_applies;     /* sync mode / eager / nvh_protect_sync applies    */
    uint64_t deferred;         /* async: unused pages kept writable one more
                                  interval because they were used in the last  */
    uint64_t cache_misses;     /* async, window cache: opens that found no unit
                                  in the thread's cache (one shared add each) */
} nvh_protect_stats;
int nvh_protect_stats_get(const nvh_pool *pool, nvh_protect_stats *stats);
void nvh_protect_stats_reset(nvh_pool *pool);

/* Request-to-applied latency ([Moraru11] Fig. 6): for each queued request, the
 * time from the call that queued it to the end of the mprotect pass that
 * handled it (sync mode: the duration of the call's mprotect). kind 0 =
 * unprotect requests (may have been applied earlier by a fault), 1 = protect.
 * Percentiles come from a log-linear histogram (resolution ~9%). */
typedef struct nvh_protect_latency {
    uint64_t count;
    double mean_ns;
    uint64_t max_ns;
    uint64_t p50_ns, p90_ns, p99_ns, p999_ns;
} nvh_protect_latency;
int nvh_protect_latency_get(const nvh_pool *pool, int kind, nvh_protect_latency *out);
/* The histogram itself, for CDF plots: fills up to max (upper bound in ns,
 * count) pairs of the non-empty buckets in ascending order; returns how many. */
unsigned nvh_protect_latency_buckets(const nvh_pool *pool, int kind, uint64_t *upper_ns,
                                     uint64_t *counts, unsigned max);

/* ==========================================================================
 * 12. Hash map
 * ==========================================================================
 * A persistent hash map with byte-string keys (0..NVH_HMAP_KEY_MAX bytes)
 * and values (design: docs/HASHMAP.md). It is a split-ordered list: all
 * entries in one list sorted by bit-reversed hash, buckets are sentinels in
 * that list. Every operation is failure-atomic and durable when it returns:
 * a new key costs 2 fences (entry content, then one allocator activation
 * that publishes it), a delete 1 (one allocator free that unlinks it), a
 * replacement 3. Resizing doubles the bucket count with one O(1) allocation
 * when count > buckets * max_load_pct / 100 (default 200); buckets are linked
 * lazily on first use; no entry ever moves. Open after a crash is O(1) (plus
 * finishing an interrupted replacement: one bucket search).
 *
 *   nvh_off_t *slot = nvh_root(pool, NULL);          // where the map lives
 *   if (!*slot) nvh_hmap_create(pool, slot, NULL);
 *   nvh_hmap *m = nvh_hmap_open(pool, *slot);
 *   nvh_hmap_put(m, "k", 1, "v", 1);
 *   nvh_hmap_close(m);
 *
 * Threads: readers (get, contains, foreach, count) take no lock and never
 * wait for a writer; writers (put, insert, update, delete, check) are
 * serialised by the handle's mutex. Opening an open map again returns the
 * same handle with a reference more (close it once per open). Pointers
 * returned by get are valid until the next call that modifies the map.
 * nvh_pool_close closes maps still open. */
typedef struct nvh_hmap nvh_hmap;

#define NVH_HMAP_KEY_MAX 65536u
#define NVH_HMAP_VALUE_MAX ((uint64_t)UINT32_MAX - 65600u)

typedef struct nvh_hmap_options {
    unsigned initial_buckets_log2; /* 1..24; 0 = 8 (256 buckets)                */
    unsigned max_load_pct;         /* 10..10000; 0 = 200 (2 entries per bucket) */
    uint64_t seed;                 /* hash seed; 0 = derived from the pool uuid  */
} nvh_hmap_options;

typedef struct nvh_hmap_stats {
    uint64_t count;            /* entries                                       */
    uint64_t buckets;          /* current bucket count (a power of two)         */
    uint64_t segments;         /* bucket segments (1 + doublings)               */
    double load_factor;        /* count / buckets                               */
    uint64_t resizes;          /* doublings done by this handle                 */
    uint64_t buckets_inited;   /* buckets linked by this handle                 */
    uint64_t recovered_pending;/* interrupted replacements open finished (0..3) */
    /* filled by nvh_hmap_check only (they need a walk): */
    uint64_t buckets_linked, buckets_marked, buckets_unmarked;
    uint64_t max_chain;        /* most entries between two linked buckets        */
    uint64_t key_bytes, value_bytes;
    int64_t count_repaired;    /* walk count minus the count the handle had      */
} nvh_hmap_stats;

/* Create an empty map and store its offset into *link (an aligned word in
 * the pool, e.g. in the root area) failure-atomically. options may be NULL. */
int nvh_hmap_create(nvh_pool *pool, nvh_off_t *link, const nvh_hmap_options *options);
/* Open the map at offset root (recovering an interrupted replacement). NULL
 * and NVH_E_BADMAGIC / NVH_E_CORRUPT / NVH_E_INVAL on error. */
nvh_hmap *nvh_hmap_open(nvh_pool *pool, nvh_off_t root);
/* Drop a reference; the last one persists the count hint and frees the
 * handle (the map stays in the pool). */
int nvh_hmap_close(nvh_hmap *map);
/* Free every entry, the buckets and the map, clearing *link (which must
 * point at the map); the handle is freed on success. NVH_E_BUSY while the
 * map is open more than once. A crash in the middle
 * leaves a smaller (possibly empty) valid map. */
int nvh_hmap_destroy(nvh_hmap *map, nvh_off_t *link);

/* Insert or replace. NVH_E_TOOLONG for a key or value over the limit,
 * NVH_E_NOSPACE if the pool is full (the map is unchanged). */
int nvh_hmap_put(nvh_hmap *map, const void *key, size_t klen, const void *value, size_t vlen);
/* Insert only: NVH_E_EXISTS if the key is present. */
int nvh_hmap_insert(nvh_hmap *map, const void *key, size_t klen, const void *value, size_t vlen);
/* Replace only: NVH_E_NOTFOUND if the key is absent. */
int nvh_hmap_update(nvh_hmap *map, const void *key, size_t klen, const void *value, size_t vlen);
/* *value points into the pool (valid until the next modification); value
 * and vlen may be NULL. NVH_E_NOTFOUND if absent. Never writes.
 * NVH_E_CORRUPT (message: map and offset) if the search meets a link that
 * fails validation (outside the pool, misaligned, not a node, out of key
 * order): no reader follows such a link, so a damaged map never faults. */
int nvh_hmap_get(nvh_hmap *map, const void *key, size_t klen, const void **value, size_t *vlen);
/* 1 if present, 0 if not, or an error code. */
int nvh_hmap_contains(nvh_hmap *map, const void *key, size_t klen);
int nvh_hmap_delete(nvh_hmap *map, const void *key, size_t klen);   /* NVH_E_NOTFOUND */

/* Every entry, in split order (stable while the map is unchanged); stops
 * when fn returns non-zero and returns that. fn must not call the map.
 * Past a damaged link the walk goes on at the next intact bucket and the
 * call returns NVH_E_CORRUPT at the end (unless fn stopped it). */
typedef int (*nvh_hmap_fn)(const void *key, size_t klen, const void *value, size_t vlen,
                           void *arg);
int nvh_hmap_foreach(nvh_hmap *map, nvh_hmap_fn fn, void *arg);
/* Look key up without a lock and call fn(key, klen, value, vlen, arg) on the
 * entry while it cannot be freed or reused: the pointers are valid during fn
 * only (a concurrent replacement or delete takes effect for later calls).
 * Returns fn's value, NVH_E_NOTFOUND (no message recorded: cheap for caches
 * that miss often) or NVH_E_CORRUPT. fn must not call the map. */
int nvh_hmap_get_fn(nvh_hmap *map, const void *key, size_t klen, nvh_hmap_fn fn, void *arg);
/* A read section of the calling thread (sections nest). Until its end no
 * entry is freed for reuse, whoever replaces or deletes it (this thread
 * included), so pointers from nvh_hmap_get and from nvh_hmap_get_fn's fn stay
 * readable until nvh_hmap_read_end; the entry seen is the one current at the
 * lookup. Keep sections short (no waiting inside): a section holds back the
 * reuse of space freed meanwhile in every pool. */
void nvh_hmap_read_begin(nvh_hmap *map);
void nvh_hmap_read_end(nvh_hmap *map);
/* A resumable walk: each call visits up to max entries from *cursor on (in
 * split order; a run of entries with one 63-bit hash is never split between
 * calls, so a call may visit a few more) and advances the cursor. Start with
 * a zeroed cursor. Returns 1 while entries may be left, 0 once the walk is
 * complete, fn's non-zero value (the cursor is then left where the call
 * started) or NVH_E_CORRUPT. A call takes no lock and holds back the reuse
 * of freed entries only for its own length, so writers run between (and
 * during) steps: every key present from the first call to the last is
 * visited exactly once, keys inserted or deleted meanwhile at most once. */
typedef struct nvh_hmap_cursor {
    uint64_t pos;              /* split-order position of the next entry     */
    uint64_t done;             /* 1 once the walk reached the end            */
} nvh_hmap_cursor;
int nvh_hmap_walk(nvh_hmap *map, nvh_hmap_cursor *cursor, unsigned max, nvh_hmap_fn fn,
                  void *arg);
uint64_t nvh_hmap_count(nvh_hmap *map);
int nvh_hmap_stats_get(nvh_hmap *map, nvh_hmap_stats *stats);
/* Check every invariant (docs/HASHMAP.md §5) with a walk of the list and the
 * buckets; NVH_E_CORRUPT with a message if one fails. Repairs the count. */
int nvh_hmap_check(nvh_hmap *map, nvh_hmap_stats *stats);

/* ==========================================================================
 * 13. Key-value store
 * ==========================================================================
 * A store maps binary keys (1..NVH_KV_KEY_MAX bytes) to binary values
 * (0..NVH_KV_VALUE_MAX bytes). It lives in a pool under a name (several
 * stores per pool); its engine, chosen at creation, is "sorted" (a B+ tree:
 * ordered scans, iterators) or "hash" (the hash map of section 12: no order).
 * User guide: docs/KV.md.
 *
 *   nvh_kv_config c = {.path = "/pmem/db", .create = NVH_KV_CREATE_IF_MISSING};
 *   nvh_kv *kv = nvh_kv_open(&c);
 *   nvh_kv_put(kv, "k", 1, "v", 1);             // durable when it returns
 *   char buf[64]; size_t n;
 *   nvh_kv_get_copy(kv, "k", 1, buf, sizeof buf, &n);
 *   nvh_kv_close(kv);
 *
 * On return: every put, remove and batch commit is durable (after a crash
 * it is there, whole). On a crash: an operation in flight happened entirely
 * or not at all; a batch in flight is all or none. Opening a store after a
 * crash finishes an interrupted batch first.
 * Threads: every call may come from any thread at any time on one handle
 * (except close, which must be the last call). Readers never block each
 * other. Limits: longer keys or values fail NVH_E_TOOLONG (never
 * truncated); an empty key fails NVH_E_INVAL. Errors are NVH_E_* codes with
 * messages naming the store ("nvh_kv_put: store 'x': ..."). */
typedef struct nvh_kv nvh_kv;
typedef struct nvh_kv_iter nvh_kv_iter;
typedef struct nvh_kv_batch nvh_kv_batch;

#define NVH_KV_KEY_MAX 4096u                 /* longer keys: NVH_E_TOOLONG        */
#define NVH_KV_VALUE_MAX ((size_t)64 << 20)  /* 64 MiB; longer: NVH_E_TOOLONG     */
#define NVH_KV_NAME_MAX 32u                  /* store name bytes, without the NUL */

typedef enum nvh_kv_create {
    NVH_KV_OPEN_EXISTING = 0,   /* the pool and the store must exist (NVH_E_NOENT
                                   for the pool, NVH_E_NOTFOUND for the store)   */
    NVH_KV_CREATE_IF_MISSING = 1, /* create the pool and/or the store if absent  */
    NVH_KV_CREATE_NEW = 2,      /* the store must not exist yet (NVH_E_EXISTS);
                                   the pool is created if absent                 */
} nvh_kv_create;

/* Order of the sorted engine: negative/0/positive like memcmp. NULL =
 * bytewise (memcmp on the common prefix, then the shorter key first). The
 * comparator is not stored: opening a store with another order than it was
 * built with is the caller's error (as in LMDB). The store records whether
 * a custom order was used and refuses NULL for such a store, and a custom
 * one for a bytewise store (NVH_E_INVAL). */
typedef int (*nvh_kv_cmp_fn)(const void *a, size_t alen, const void *b, size_t blen, void *arg);

#define NVH_KV_READONLY 1u           /* nvh_kv_config.flags: writes fail NVH_E_READONLY */

typedef struct nvh_kv_config {
    const char *path;          /* pool file (nvh_kv_open only)                    */
    const char *layout;        /* pool layout name; NULL = "nvkv"                 */
    const char *name;          /* store name in the pool; NULL = "default"        */
    const char *engine;        /* "sorted" (NULL) or "hash"; when opening an
                                  existing store NULL accepts either, a name must
                                  match (NVH_E_INVAL)                             */
    uint64_t size;             /* pool size at creation; 0 = 64 MiB               */
    uint64_t max_size;         /* growth limit of the pool file; 0 = the pool's   */
    nvh_kv_create create;
    nvh_kv_cmp_fn cmp;         /* sorted engine only                               */
    void *cmp_arg;
    unsigned flags;            /* NVH_KV_READONLY                                  */
} nvh_kv_config;

/* Open (or create, per config->create) the pool at config->path and the
 * store in it. NULL + nvh_errcode() on error; a failed open leaves an
 * existing pool's stores unchanged. */
nvh_kv *nvh_kv_open(const nvh_kv_config *config);
/* The same on a pool the caller opened (config->path, layout, size and
 * max_size are ignored); the pool must outlive the store handle. */
nvh_kv *nvh_kv_open_pool(nvh_pool *pool, const nvh_kv_config *config);
/* Close the handle (every write was durable already); closes the pool too
 * if nvh_kv_open opened it. No other call on the handle may run or follow.
 * NULL is a no-op. */
int nvh_kv_close(nvh_kv *kv);
nvh_pool *nvh_kv_pool(nvh_kv *kv);
const char *nvh_kv_engine(const nvh_kv *kv);   /* "sorted" or "hash" */
/* The stores of a pool: fn(name, engine, arg) each; stops when fn returns
 * non-zero (returned). */
int nvh_kv_list(nvh_pool *pool, int (*fn)(const char *name, const char *engine, void *arg),
                void *arg);
/* Delete a store that is not open, with all its data. NVH_E_NOTFOUND if
 * absent, NVH_E_BUSY if open. A crash in the middle leaves the store
 * smaller but valid, or gone; drop again to finish. */
int nvh_kv_drop(nvh_pool *pool, const char *name);

/* Insert or replace; durable and failure-atomic. NVH_E_NOSPACE if the pool
 * is full (the store is unchanged). */
int nvh_kv_put(nvh_kv *kv, const void *key, size_t klen, const void *value, size_t vlen);
int nvh_kv_remove(nvh_kv *kv, const void *key, size_t klen);     /* NVH_E_NOTFOUND */
int nvh_kv_exists(nvh_kv *kv, const void *key, size_t klen);     /* 1, 0, or an error */
/* Copy: copies min(value length, bufsize) bytes into buf and sets *vlen to
 * the full length; returns 0 if the whole value fit, NVH_E_SIZE if buf was
 * too small (retry with *vlen bytes), NVH_E_NOTFOUND if absent. buf may be
 * NULL with bufsize 0 (a size query). */
int nvh_kv_get_copy(nvh_kv *kv, const void *key, size_t klen, void *buf, size_t bufsize,
                    size_t *vlen);
/* Zero-copy: fn sees the value in the pool; the pointer is valid only
 * during fn (the store does not free it while fn runs, whatever other
 * threads do). fn must not call the store. Returns fn's return value, or
 * NVH_E_NOTFOUND. */
typedef int (*nvh_kv_value_fn)(const void *value, size_t vlen, void *arg);
int nvh_kv_get(nvh_kv *kv, const void *key, size_t klen, nvh_kv_value_fn fn, void *arg);

/* Ordered calls (sorted engine; the hash engine returns NVH_E_NOTSUP except
 * for count_all and get_all, which it answers in hash order). above = keys
 * > k, below = keys < k, between = lo < key < hi. fn returning non-zero
 * stops the scan and that value is returned. Entries passed to fn are valid
 * only during fn; fn must not call the store. A scan is not a snapshot:
 * it sees each key at most once, with a whole value. */
typedef int (*nvh_kv_entry_fn)(const void *key, size_t klen, const void *value, size_t vlen,
                               void *arg);
int nvh_kv_count_all(nvh_kv *kv, uint64_t *count);
int nvh_kv_count_above(nvh_kv *kv, const void *k, size_t kl, uint64_t *count);
int nvh_kv_count_below(nvh_kv *kv, const void *k, size_t kl, uint64_t *count);
int nvh_kv_count_between(nvh_kv *kv, const void *lo, size_t lol, const void *hi, size_t hil,
                         uint64_t *count);
int nvh_kv_get_all(nvh_kv *kv, nvh_kv_entry_fn fn, void *arg);
int nvh_kv_get_above(nvh_kv *kv, const void *k, size_t kl, nvh_kv_entry_fn fn, void *arg);
int nvh_kv_get_below(nvh_kv *kv, const void *k, size_t kl, nvh_kv_entry_fn fn, void *arg);
int nvh_kv_get_between(nvh_kv *kv, const void *lo, size_t lol, const void *hi, size_t hil,
                       nvh_kv_entry_fn fn, void *arg);

/* Iterators (sorted engine; hash: NULL with NVH_E_NOTSUP from
 * nvh_kv_iter_new). An iterator sees each key at most once and never a torn
 * value; it is not a snapshot. The positioning calls return 0 on an entry,
 * NVH_E_NOTFOUND if there is none (the iterator is then unpositioned). One
 * iterator is used by one thread at a time. */
nvh_kv_iter *nvh_kv_iter_new(nvh_kv *kv);
void nvh_kv_iter_free(nvh_kv_iter *it);
int nvh_kv_iter_seek(nvh_kv_iter *it, const void *k, size_t kl);           /* == k         */
int nvh_kv_iter_seek_lower(nvh_kv_iter *it, const void *k, size_t kl);     /* greatest < k */
int nvh_kv_iter_seek_lower_eq(nvh_kv_iter *it, const void *k, size_t kl);  /* greatest <= k */
int nvh_kv_iter_seek_higher(nvh_kv_iter *it, const void *k, size_t kl);    /* least > k    */
int nvh_kv_iter_seek_higher_eq(nvh_kv_iter *it, const void *k, size_t kl); /* least >= k   */
int nvh_kv_iter_first(nvh_kv_iter *it);
int nvh_kv_iter_last(nvh_kv_iter *it);
int nvh_kv_iter_next(nvh_kv_iter *it);   /* NVH_E_NOTFOUND past the end */
int nvh_kv_iter_prev(nvh_kv_iter *it);   /* NVH_E_NOTFOUND before the first */
/* Key and value of the current entry: copies owned by the iterator, valid
 * until it moves or is freed. NVH_E_NOTFOUND if unpositioned. */
int nvh_kv_iter_key(nvh_kv_iter *it, const void **key, size_t *klen);
int nvh_kv_iter_value(nvh_kv_iter *it, const void **value, size_t *vlen);

/* Atomic batch: puts and removes, applied in order, that become durable all
 * or none at commit (a remove of an absent key is not an error in a batch).
 * The batch is buffered in DRAM until commit; commit writes it as one log
 * object, links it from the store durably (the commit point), applies it and
 * drops the log; a crash after the commit point is finished by the next
 * open. While a commit applies, other writers of the store wait; readers do
 * not, and may see part of a batch until commit returns. */
nvh_kv_batch *nvh_kv_batch_new(nvh_kv *kv);
int nvh_kv_batch_put(nvh_kv_batch *b, const void *key, size_t klen, const void *value,
                     size_t vlen);
int nvh_kv_batch_remove(nvh_kv_batch *b, const void *key, size_t klen);
int nvh_kv_batch_commit(nvh_kv_batch *b);   /* frees b; all or none durable on return */
void nvh_kv_batch_abort(nvh_kv_batch *b);   /* frees b, nothing applied */

typedef struct nvh_kv_stats {
    uint64_t count;                   /* entries                                   */
    uint64_t key_bytes, value_bytes;  /* of the entries: O(1) but the first call
                                         after an open, a walk                     */
    uint64_t pool_size, pool_used;
    uint64_t puts, gets, removes, batches;  /* calls that succeeded on this handle */
    uint64_t flushes, fences;         /* of the pool since it was opened           */
} nvh_kv_stats;
int nvh_kv_stats_get(nvh_kv *kv, nvh_kv_stats *stats);
/* The engine's own invariant check (NVH_E_CORRUPT with a message). */
int nvh_kv_check(nvh_kv *kv);

/* ==========================================================================
 * 14. Capacity mode
 * ==========================================================================
 * A volatile heap in persistent memory, for data that needs the capacity but
 * not the persistence ([Kannan14]'s NVMCap; docs/CAP.md). Two forms:
 *  - libnvheap-cap.so, an LD_PRELOAD library: the whole malloc family of an
 *    unmodified program, its memory an unlinked file in NVHEAP_CAP_DIR;
 *  - the calls below: the capacity part of a pool, next to its persistent
 *    objects in one process.
 * Nothing here is flushed or logged. The part is one reservation of the
 * persistent allocator that is never activated, so after a crash or a close
 * its space is free again: the capacity part is empty at every open, the
 * persistent objects are untouched. All calls are thread-safe (per-thread
 * heaps; a block may be freed by any thread). Blocks are 16 B aligned. Not
 * for pools opened with stray-write protection (its windows do not cover
 * the part). */
typedef struct nvh_cap_part nvh_cap;

/* Carve a capacity part of `bytes` (128 KiB .. 16 TiB) out of the pool's
 * heap. NULL with NVH_E_NOSPACE if the pool has no room or bytes is over
 * one heap object's maximum (see nvh_reserve: the pool's size at creation,
 * or 256 MiB in space it grew into), NVH_E_BUSY if 8 parts are attached in the
 * process. nvh_pool_close detaches it. */
nvh_cap *nvh_cap_attach(nvh_pool *pool, uint64_t bytes);
/* Give the part back to the pool; its blocks are invalid afterwards. */
int nvh_cap_detach(nvh_cap *cap);
/* malloc/calloc/realloc/free/malloc_usable_size on the part. NULL with
 * NVH_E_NOSPACE when the part is full. free and realloc of a pointer that is
 * not a live block fail with NVH_E_BADPTR (outside the part, interior, never
 * allocated) or NVH_E_DOUBLEFREE, and change nothing. realloc(NULL, n) is
 * malloc(n). */
void *nvh_cap_malloc(nvh_cap *cap, size_t size);
void *nvh_cap_calloc(nvh_cap *cap, size_t n, size_t size);
void *nvh_cap_realloc(nvh_cap *cap, void *ptr, size_t size);
int nvh_cap_free(nvh_cap *cap, void *ptr);
size_t nvh_cap_usable_size(nvh_cap *cap, const void *ptr);   /* 0: NVH_E_BADPTR */
/* Return the part's free pages to the device (hole punching), as
 * malloc_trim does; done by itself once freed space exceeds half the space
 * in use (docs/CAP.md). */
int nvh_cap_trim(nvh_cap *cap);
typedef struct nvh_cap_stats {
    uint64_t region_offset;   /* of the part in the pool                       */
    uint64_t region_bytes;    /* its size                                      */
    uint64_t span_bytes;      /* pages and large blocks in use                 */
    uint64_t span_peak;       /* highest span_bytes so far                     */
    uint64_t dirty_bytes;     /* freed, not yet punched                        */
    uint64_t top;             /* bytes of the part ever used                   */
    uint64_t punches;         /* hole-punch calls                              */
} nvh_cap_stats;
int nvh_cap_stats_get(nvh_cap *cap, nvh_cap_stats *stats);

#pragma GCC visibility pop
#ifdef __cplusplus
}
#endif
#endif /* NVHEAP_H */
