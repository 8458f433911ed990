/* internal.h — what every layer of libnvheap shares but users never see:
 * the error-reporting helpers, CRC32C, debug invariant checks, and the full
 * definition of struct nvh_pool (whose first member is the nvh_persist_ctx_
 * that the public inline fast paths read). */
#ifndef NVH_INTERNAL_H
#define NVH_INTERNAL_H

#include "nvheap.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* --------------------------------------------------------------------------
 * Invariant checks: on in debug builds, free in release builds.
 * -------------------------------------------------------------------------- */
#ifndef NDEBUG
#define NVH_ASSERT(cond) assert(cond)
#else
#define NVH_ASSERT(cond) ((void)0)
#endif

#define NVH_ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define NVH_ALIGN_DOWN(x, a) ((x) & ~((__typeof__(x))(a) - 1))
#define NVH_PAGE 4096u

/* --------------------------------------------------------------------------
 * Time (src/common/ticks.c)
 * --------------------------------------------------------------------------
 * nvh_now_ns: CLOCK_MONOTONIC in ns. nvh_ticks: a cheaper timestamp for
 * deadlines and latency figures — the TSC on x86-64 (a fraction of a
 * clock_gettime), nanoseconds elsewhere — converted
 * with nvh_ticks_to_ns once nvh_ticks_calibrate has run (once per process;
 * a 2 ms sleep the first time). */
#include <time.h>
static inline uint64_t nvh_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define NVH_TICKS_ARE_TSC 1
static inline uint64_t nvh_ticks(void) { return __rdtsc(); }
#else
#define NVH_TICKS_ARE_TSC 0
static inline uint64_t nvh_ticks(void) { return nvh_now_ns(); }
#endif
extern double nvh_ns_per_tick;               /* 1.0 until calibrated / not TSC */
void nvh_ticks_calibrate(void);
static inline uint64_t nvh_ticks_to_ns(uint64_t ticks)
{
    return (uint64_t)((double)ticks * nvh_ns_per_tick);
}
static inline uint64_t nvh_ns_to_ticks(uint64_t ns)
{
    return (uint64_t)((double)ns / nvh_ns_per_tick);
}

/* --------------------------------------------------------------------------
 * Deterministic randomness and hashing: splitmix64 (Steele, Lea, Flood,
 * "Fast splittable pseudorandom number generators", 2014). nvh_mix64 is its
 * finaliser, a bijection whose every output bit depends on every input bit;
 * the crash simulator's images are a pure function of their seed through it,
 * so it must stay the same everywhere (a reported seed must rebuild its image).
 * -------------------------------------------------------------------------- */
static inline uint64_t nvh_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t nvh_splitmix64(uint64_t *state)
{
    return nvh_mix64(*state += 0x9E3779B97F4A7C15ull);
}

/* --------------------------------------------------------------------------
 * Errors (src/common/error.c)
 * -------------------------------------------------------------------------- */
/* Record code + formatted message for this thread; returns code so callers
 * can write `return nvh_fail(NVH_E_INVAL, "...")`. */
int nvh_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, appending ": strerror(errno_value)". */
int nvh_fail_errno(int code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Re-raise the current failure with context: the message becomes
 * "<formatted fmt>: <current message>" and the code `code`. (nvh_fail may
 * also quote nvh_errormsg() as an argument: it formats before it writes.) */
int nvh_fail_context(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A failure kept across cleanup that may fail on its own and overwrite it:
 * nvh_err_save before the cleanup, nvh_err_restore after (returns the code). */
#define NVH_ERRMSG_MAX 512
typedef struct nvh_err_saved {
    int code;
    char msg[NVH_ERRMSG_MAX];
} nvh_err_saved;
void nvh_err_save(nvh_err_saved *s);
int nvh_err_restore(const nvh_err_saved *s);

/* --------------------------------------------------------------------------
 * Epoch-based reclamation (src/common/epoch.c): lock-free readers announce
 * themselves; freed space is reused only once every reader that may hold it
 * has left (the allocator's don't-allocate FIFO holds it back).
 * -------------------------------------------------------------------------- */
/* A read section (nestable, per thread): no object freed after enter is
 * reused before the matching exit. */
void nvh_epoch_enter_(void);
void nvh_epoch_exit_(void);
/* The same for a thread whose sections follow each other closely (object
 * transactions): the slot stays announced between sections, so a section
 * takes no fence; a scan revokes an idle one that fell behind (epoch.c). */
void nvh_epoch_enter_sticky_(void);
void nvh_epoch_exit_sticky_(void);
/* test hook: scans never revoke sticky slots (negative control) */
extern int nvh_epoch_test_no_revoke_;
/* Stamp for objects whose unlink happened before the call (the allocator
 * stamps FIFO entries at the drain, and only when a reader is in). */
uint64_t nvh_epoch_now_(void);
/* Space stamped s may be reused iff s < nvh_epoch_min_active_(). */
uint64_t nvh_epoch_min_active_(void);
/* Move the global epoch on (when stamped space is held back). */
void nvh_epoch_advance_(void);

/* --------------------------------------------------------------------------
 * CRC32C (src/common/crc32c.c): SSE4.2 instruction when the CPU has it,
 * table-driven otherwise. Castagnoli polynomial, as in iSCSI/ext4. Declared
 * in nvheap.h (public: offline tools check checksums with it).
 * -------------------------------------------------------------------------- */

/* --------------------------------------------------------------------------
 * Persistence (src/persist)
 * -------------------------------------------------------------------------- */
typedef struct nvh_sim nvh_sim;       /* crash simulator state, sim.c  */
typedef struct nvh_msync_set nvh_msync_set; /* dirty page ranges, msync.c */

/* An open container's registration with its pool (pool/pool.h). */
typedef struct nvh_pool_hook nvh_pool_hook;

/* Resolve the domain for a pool: explicit flag, else NVHEAP_DOMAIN, else the
 * detected one. `detected` comes from probing the file. */
int nvh_domain_resolve(unsigned flags, nvh_domain detected, nvh_domain *out);
/* The flush instruction to use: NVHEAP_FLUSH override, else best by CPUID. */
nvh_flush_kind nvh_flush_kind_select(void);
uint64_t nvh_nt_threshold_default(void);

int nvh_msync_init(nvh_pool *pool);
void nvh_msync_fini(nvh_pool *pool);
/* The out-of-line flush and drain of the msync and sim domains (msync.c,
 * sim.c), called by flush.c. */
void nvh_msync_record(nvh_pool *pool, const void *addr, size_t len);
int nvh_msync_drain(nvh_pool *pool);
void nvh_sim_flush(nvh_pool *pool, const void *addr, size_t len);
void nvh_sim_drain(nvh_pool *pool);

int nvh_sim_attach(nvh_pool *pool);    /* after the working copy is loaded */
int nvh_sim_grow(nvh_pool *pool, uint64_t old_size, uint64_t new_size);
void nvh_sim_detach(nvh_pool *pool);
/* nvh_sim_write_image that also reports how many lines were in flight (the
 * image's degrees of freedom); used by nvh_crash_explore (crash.c). */
int nvh_sim_image_(nvh_pool *pool, const char *path, uint64_t seed, nvh_crash_mode mode,
                   uint64_t *differing_out);

/* --------------------------------------------------------------------------
 * The pool handle
 * -------------------------------------------------------------------------- */
struct nvh_superblock;

struct nvh_pool {
    nvh_persist_ctx_ ctx;          /* MUST be first: read by inline fast paths */
    int fd;
    unsigned flags;
    bool readonly;
    char *path;
    char *reserved;                /* start of reserved virtual range (== base) */
    uint64_t reserved_size;
    uint64_t max_size;
    struct nvh_superblock *sb;     /* == base */
    unsigned state_slot;           /* which superblock state slot is current */
    uint64_t epoch;
    uint64_t state_seq;
    uint32_t state_flags;          /* NVH_STATE_* of the current state slot */
    bool state_unfenced;           /* the current slot is flushed, not yet fenced */
    nvh_domain created_domain;
    bool opened_clean;             /* the pool had been closed cleanly before this open */
    uint32_t format_version;       /* as validate() read it (a torn upgrade reads as the
                                    * lower version), raised by format_upgrade */
    _Atomic uint32_t io_errors;    /* msync failures since open (msync.c); sticky */

    pthread_mutex_t grow_lock;     /* serialises grow (and heap format); error-checking */
    nvh_msync_set *msync;          /* msync domain only */
    nvh_sim *sim;                  /* sim domain only   */
    struct nvh_heap *heap;         /* allocator state (src/alloc), NULL if none */
    /* stray-write protection (src/protect), NULL until first turned on */
    struct nvh_protect *_Atomic protect;
    pthread_mutex_t hooks_lock;    /* guards hooks (nvh_pool_hook_*)               */
    nvh_pool_hook *hooks;          /* open containers, closed by nvh_pool_close    */
};

/* Look a name up in the object table without touching the thread's error
 * state on NVH_E_NOTFOUND (alloc/named.c): NVH_OK, NVH_E_NOTFOUND, or
 * NVH_E_CORRUPT (error set) if a damaged entry may have been the name's. */
int nvh_named_lookup_(nvh_pool *pool, const char *name, void **ptr_out, size_t *size_out);
/* Is the object at pool offset off named (alloc/named.c)? */
bool nvh_named_obj_(nvh_pool *pool, uint64_t off);

#endif /* NVH_INTERNAL_H */
