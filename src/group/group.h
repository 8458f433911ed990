/* group.h — internals of the persist-group layer, shared by its files:
 *
 *   context.c      create/destroy a context, options, stats, accessors
 *   action_ring.c  begin/add/end, the ring of waiting groups, running actions in
 *                  order, the ring-full fallback, poll and sync
 *   batch.c        the REAL model's fence policy (by count and by age)
 *   simcache.c     the simulated cache behind SIM_CACHE / SIM_LOWER: which lines
 *                  are dirty, tagged with which group, and their eviction
 *
 * Design and the reasons behind it: docs/GROUP.md.
 */
#ifndef NVH_GROUP_H
#define NVH_GROUP_H

#include "../common/internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* --------------------------------------------------------------------------
 * Defaults (docs/GROUP.md explains the choices)
 * -------------------------------------------------------------------------- */
#define GROUP_DEFAULT_SLOTS 64u
#define GROUP_DEFAULT_BATCH 32u
#define GROUP_DEFAULT_BATCH_NS 100000ull          /* 100 us */
#define GROUP_DEFAULT_CACHE_LINES 131072ull       /* 8 MiB, a server LLC share */

/* --------------------------------------------------------------------------
 * One waiting group (a "counter-action pair" of [Moraru11] §6)
 * -------------------------------------------------------------------------- */
enum { ENTRY_OPEN = 1, ENTRY_ENDED = 2 };

typedef struct group_entry {
    nvh_group_action action;
    void *arg;
    uint64_t ended_at;      /* ctx->stats.groups when it ended (delay stats)   */
    uint64_t dirty;         /* simulated models: its lines still in the cache —
                               the cache-line counter itself                     */
    uint8_t state;          /* ENTRY_OPEN until end, then ENTRY_ENDED          */
} group_entry;

/* --------------------------------------------------------------------------
 * The simulated cache (simcache.c)
 * -------------------------------------------------------------------------- */
#define CACHE_NIL UINT32_MAX

typedef struct cache_rec {
    uintptr_t line;         /* address / NVH_CACHELINE                          */
    uint64_t group;         /* seq of the group the line is tagged with        */
    uint32_t prev, next;    /* LRU list: prev = more recent                    */
} cache_rec;

typedef struct sim_cache {
    cache_rec *recs;        /* dense array of the dirty lines                  */
    uint32_t count, cap;
    uint32_t *table;        /* open addressing: dense index + 1, 0 = empty     */
    uint32_t table_mask;
    uint32_t mru, lru;      /* ends of the LRU list                            */
    uint64_t capacity;      /* dirty lines held before evicting                */
    uint64_t rng;           /* splitmix64 state (random eviction)              */
    nvh_group_evict policy;
} sim_cache;

/* --------------------------------------------------------------------------
 * A context: one thread's groups on one pool
 * -------------------------------------------------------------------------- */
struct nvh_group_ctx {
    nvh_pool *pool;
    const char *owner_mark;  /* &group_thread_mark in the owner thread: the
                                owner check is one TLS address compare (a
                                pthread_self call was ~14 instructions, 4
                                times per B+ tree insert)                    */
    nvh_group_options opt;  /* effective options (defaults filled in)         */

    /* Waiting groups: seqs [head, tail) live at ring[seq & mask]. The last
     * one may still be open. Capacity is a power of two >= opt.slots; it
     * grows only when an action chains groups into a full ring. */
    group_entry *ring;
    uint64_t mask;
    uint64_t head, tail;
    bool open;              /* ring[(tail-1) & mask] is open                   */
    bool running;           /* inside run_ready: actions are executing         */

    /* Fencing state */
    uint64_t fenced;        /* REAL: groups with seq < fenced ended before the
                               layer's last fence, so they are durable         */
    uint64_t oldest_ticks;  /* REAL: end time of the oldest unfenced group
                               (nvh_ticks)                                      */
    uint64_t batch_ticks;   /* opt.batch_ns in nvh_ticks                      */
    bool wb_unfenced;       /* simulated models: write-backs since the fence   */
    bool effects_unfenced;  /* actions ran since the last fence (sync drains)  */

    sim_cache cache;        /* SIM_CACHE / SIM_LOWER                           */
    nvh_group_stats stats;
};

/* --------------------------------------------------------------------------
 * Small helpers
 * -------------------------------------------------------------------------- */
static inline bool group_is_simcache(const nvh_group_ctx *ctx)
{
    return ctx->opt.model == NVH_GROUP_SIM_CACHE || ctx->opt.model == NVH_GROUP_SIM_LOWER;
}

static inline group_entry *group_entry_at(const nvh_group_ctx *ctx, uint64_t seq)
{
    return &ctx->ring[seq & ctx->mask];
}

static inline uint64_t group_pending(const nvh_group_ctx *ctx)
{
    return ctx->tail - ctx->head;
}

/* The batching deadline's clock: nvh_ticks (the TSC on x86-64, cheaper
 * than clock_gettime; read ~0.4 times per B+ tree insert). batch_ticks is the context's batch_ns in these ticks. */
static inline uint64_t group_now_ticks(void) { return nvh_ticks(); }

/* Lines covered by [addr, addr+len), len > 0. */
static inline uint64_t group_lines(const void *addr, size_t len)
{
    uintptr_t first = (uintptr_t)addr / NVH_CACHELINE;
    uintptr_t last = ((uintptr_t)addr + len - 1) / NVH_CACHELINE;
    return (uint64_t)(last - first + 1);
}

/* The layer's one way to fence: counts it and notes what it covered. Every
 * flush this context issued so far (write-backs, actions' effects) is
 * durable afterwards; in REAL every ended group is. */
static inline void group_fence(nvh_group_ctx *ctx)
{
    nvh_drain(ctx->pool);
    ctx->stats.fences++;
    ctx->wb_unfenced = false;
    ctx->effects_unfenced = false;
    ctx->fenced = ctx->open ? ctx->tail - 1 : ctx->tail;
}

/* --------------------------------------------------------------------------
 * Cross-file internal functions
 * -------------------------------------------------------------------------- */
/* simcache.c */
int group_cache_init(sim_cache *cache, uint64_t capacity, nvh_group_evict policy,
                     uint64_t seed);
void group_cache_fini(sim_cache *cache);
/* Tag the lines of [addr, addr+len) dirty for the open group, evicting (and
 * writing back) lines beyond the capacity. */
void group_cache_add(nvh_group_ctx *ctx, const void *addr, size_t len);
/* Write back every dirty line (sync, fallback): all counters reach zero. */
void group_cache_writeback_all(nvh_group_ctx *ctx);

/* batch.c */
/* REAL: whether a fence is due — batch_count groups wait unfenced, or the
 * oldest of them waited batch_ns. just_ended: called right after an end
 * (which may make that group the oldest: it gets the time stamp). The caller
 * counts the fence in the stats if it issues it. */
typedef enum batch_reason { BATCH_NONE = 0, BATCH_COUNT, BATCH_TIME } batch_reason;
batch_reason group_batch_due(nvh_group_ctx *ctx, bool just_ended);

/* action_ring.c */
/* Run every ready action at the head of the ring, in order. */
unsigned group_run_ready(nvh_group_ctx *ctx);
/* The same, skipped inline when nothing can be ready: in REAL only a fence
 * makes entries ready (seq < fenced), so begin and end — which call it every
 * time — do not enter the loop between fences. */
static inline void group_run_ready_if_any(nvh_group_ctx *ctx)
{
    if (ctx->running) return;
    if (ctx->opt.model == NVH_GROUP_REAL && ctx->head >= ctx->fenced) return;
    group_run_ready(ctx);
}
/* Make every waiting group durable and run all actions (sync's first half). */
void group_force(nvh_group_ctx *ctx);
/* Error unless called from the owner thread. */
extern _Thread_local char group_thread_mark;
int group_owner_error(const char *fn);
static inline int group_check_owner(const nvh_group_ctx *ctx, const char *fn)
{
    if (__builtin_expect(ctx->owner_mark == &group_thread_mark, 1)) return NVH_OK;
    return group_owner_error(fn);
}

#endif /* NVH_GROUP_H */
