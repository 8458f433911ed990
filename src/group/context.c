/* context.c — persist-group contexts: creation with validated options,
 * destruction (which syncs first), and the read-only accessors (options,
 * stats, pending count).
 *
 * A context is one thread's view of the groups it runs on one pool. It is
 * deliberately not thread-shared: the fence that retires a group (nvh_drain,
 * an SFENCE in the pmem domain) orders only the calling thread's flushes, so
 * a group flushed by one thread and fenced by another would not be durable.
 */
#include "group.h"

#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------------
 * Options
 * -------------------------------------------------------------------------- */
static inline uint64_t next_pow2(uint64_t v)
{
    uint64_t p = 1;
    while (p < v) p <<= 1;
    return p;
}

/* Fill in defaults and reject what cannot work. */
static int resolve_options(const nvh_group_options *in, nvh_group_options *out)
{
    nvh_group_options o;
    if (in) o = *in;
    else memset(&o, 0, sizeof o);

    if (o.model != NVH_GROUP_REAL && o.model != NVH_GROUP_SIM_CACHE &&
        o.model != NVH_GROUP_SIM_LOWER && o.model != NVH_GROUP_SIM_UPPER)
        return nvh_fail(NVH_E_INVAL, "nvh_group_ctx_create: unknown model %d", (int)o.model);
    if (o.evict != NVH_GROUP_EVICT_LRU && o.evict != NVH_GROUP_EVICT_RANDOM)
        return nvh_fail(NVH_E_INVAL, "nvh_group_ctx_create: unknown eviction policy %d",
                        (int)o.evict);
    if (o.slots > NVH_GROUP_SLOTS_MAX)
        return nvh_fail(NVH_E_INVAL, "nvh_group_ctx_create: %u slots is more than the "
                        "maximum %u", o.slots, NVH_GROUP_SLOTS_MAX);
    if (o.slots == 0) o.slots = GROUP_DEFAULT_SLOTS;
    if (o.batch_count == 0) o.batch_count = GROUP_DEFAULT_BATCH;
    if (o.batch_ns == 0) o.batch_ns = GROUP_DEFAULT_BATCH_NS;
    if (o.cache_lines == 0) o.cache_lines = GROUP_DEFAULT_CACHE_LINES;
    if (o.model == NVH_GROUP_SIM_LOWER) o.cache_lines = NVH_GROUP_NEVER;
    if (o.seed == 0) o.seed = 1;
    o.sgroup_fence = o.sgroup_fence != 0;
    *out = o;
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Create / destroy
 * -------------------------------------------------------------------------- */
nvh_group_ctx *nvh_group_ctx_create(nvh_pool *pool, const nvh_group_options *options)
{
    if (!pool) {
        nvh_fail(NVH_E_INVAL, "nvh_group_ctx_create: NULL pool");
        return NULL;
    }
    if (pool->readonly) {
        nvh_fail(NVH_E_READONLY, "nvh_group_ctx_create: pool %s is open read-only",
                 pool->path);
        return NULL;
    }
    nvh_group_options opt;
    if (resolve_options(options, &opt) != NVH_OK) return NULL;

    nvh_group_ctx *ctx = calloc(1, sizeof *ctx);
    uint64_t cap = next_pow2(opt.slots);
    group_entry *ring = calloc(cap, sizeof *ring);
    if (!ctx || !ring) {
        free(ctx);
        free(ring);
        nvh_fail(NVH_E_NOMEM, "nvh_group_ctx_create: out of memory for %u slots", opt.slots);
        return NULL;
    }
    ctx->pool = pool;
    ctx->owner_mark = &group_thread_mark;
    ctx->opt = opt;
    /* the batching deadline runs on nvh_ticks (group.h) */
    nvh_ticks_calibrate();
    ctx->batch_ticks = opt.batch_ns == NVH_GROUP_NEVER ? UINT64_MAX : nvh_ns_to_ticks(opt.batch_ns);
    ctx->ring = ring;
    ctx->mask = cap - 1;
    if (group_is_simcache(ctx) &&
        group_cache_init(&ctx->cache, opt.cache_lines, opt.evict, opt.seed) != NVH_OK) {
        free(ring);
        free(ctx);
        return NULL;
    }
    return ctx;
}

int nvh_group_ctx_destroy(nvh_group_ctx *ctx)
{
    if (!ctx) return NVH_OK;
    int rc = group_check_owner(ctx, "nvh_group_ctx_destroy");
    if (rc != NVH_OK) return rc;
    if (ctx->running)
        return nvh_fail(NVH_E_BUSY, "nvh_group_ctx_destroy: called from an action of the "
                        "same context");
    if (ctx->open) rc = nvh_group_end(ctx, NULL, NULL);   /* cannot fail here */
    if (rc == NVH_OK) rc = nvh_group_sync(ctx);
    if (rc != NVH_OK) return rc;
    if (group_is_simcache(ctx)) group_cache_fini(&ctx->cache);
    free(ctx->ring);
    free(ctx);
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * Accessors
 * -------------------------------------------------------------------------- */
uint64_t nvh_group_pending(const nvh_group_ctx *ctx)
{
    return ctx ? group_pending(ctx) : 0;
}

nvh_pool *nvh_group_pool(const nvh_group_ctx *ctx)
{
    return ctx ? ctx->pool : NULL;
}

int nvh_group_options_get(const nvh_group_ctx *ctx, nvh_group_options *options)
{
    if (!ctx || !options)
        return nvh_fail(NVH_E_INVAL, "nvh_group_options_get: NULL %s", ctx ? "options" : "ctx");
    *options = ctx->opt;
    return NVH_OK;
}

void nvh_group_stats_get(const nvh_group_ctx *ctx, nvh_group_stats *stats)
{
    if (!stats) return;
    if (!ctx) {
        memset(stats, 0, sizeof *stats);
        return;
    }
    *stats = ctx->stats;
    stats->pending = group_pending(ctx);
}

void nvh_group_stats_reset(nvh_group_ctx *ctx)
{
    if (!ctx) return;
    /* `groups` also timestamps entries for the delay figure (delay = groups
     * at retirement - groups at end): rebase the waiting entries to the new
     * zero so their delays count only groups ended after the reset. */
    for (uint64_t s = ctx->head; s < ctx->tail; s++) group_entry_at(ctx, s)->ended_at = 0;
    memset(&ctx->stats, 0, sizeof ctx->stats);
    ctx->stats.max_pending = group_pending(ctx);
}
