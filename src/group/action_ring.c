/* action_ring.c — the persist-group calls themselves (begin, add, end, poll, sync)
 * and the ring of waiting groups behind them.
 *
 * The ring holds [Moraru11]'s "counter-action pairs" (§6): one entry per group,
 * in begin order, from begin until its action has run. Its head is checked
 * on every call, as the paper's B+ tree checks the counter at the head of its
 * circular buffer along with every operation; every ready entry at the head
 * is retired, in order, so actions run exactly once and in begin order.
 *
 * "Ready" depends on the model (see group.h / docs/GROUP.md):
 *   REAL       a fence issued after the group ended (ctx->fenced)
 *   SIM_CACHE  its counter is zero and the write-backs were fenced
 *   SIM_LOWER  the same; nothing is written back before sync or a full ring
 *   SIM_UPPER  at once
 *
 * A full ring (opt.slots groups waiting) is the paper's "out of counters":
 * begin then falls back to synchronous persistence — write back everything,
 * fence, run every action — and the new group gets a free slot. Slower, never
 * incorrect. (The paper's C0 makes only the new group write-through; doing
 * the whole ring at once costs one fence instead of one per group while the
 * counters stay exhausted.)
 */
#include "group.h"

#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------------------
 * Argument checks
 * -------------------------------------------------------------------------- */
_Thread_local char group_thread_mark;

int group_owner_error(const char *fn)
{
    return nvh_fail(NVH_E_INVAL, "%s: the group context belongs to another thread "
                    "(a fence orders only its own thread's flushes; create one per thread)", fn);
}

/* NULL, wrong thread: the checks every call starts with. */
static inline int check_ctx(const nvh_group_ctx *ctx, const char *fn)
{
    if (__builtin_expect(ctx == NULL, 0)) return nvh_fail(NVH_E_INVAL, "%s: NULL context", fn);
    return group_check_owner(ctx, fn);
}

/* --------------------------------------------------------------------------
 * The ring
 * -------------------------------------------------------------------------- */
/* Double the ring. Only needed when an action chains groups into a ring
 * that is full and cannot be emptied (we are inside the loop emptying it). */
static int grow_ring(nvh_group_ctx *ctx)
{
    uint64_t cap = (ctx->mask + 1) * 2;
    group_entry *ring = calloc(cap, sizeof *ring);
    if (!ring)
        return nvh_fail(NVH_E_NOMEM, "nvh_group_begin: out of memory growing the ring to "
                        "%llu entries", (unsigned long long)cap);
    for (uint64_t s = ctx->head; s < ctx->tail; s++) ring[s & (cap - 1)] = *group_entry_at(ctx, s);
    free(ctx->ring);
    ctx->ring = ring;
    ctx->mask = cap - 1;
    return NVH_OK;
}

/* May the head entry's action run now? In the simulated models the fence
 * that acknowledges the write-backs is issued here, lazily: only when an
 * action is about to depend on them. */
static inline bool entry_ready(nvh_group_ctx *ctx, uint64_t seq, const group_entry *e)
{
    switch (ctx->opt.model) {
    case NVH_GROUP_REAL:
        return seq < ctx->fenced;
    case NVH_GROUP_SIM_UPPER:
        return true;
    default:
        if (e->dirty) return false;
        if (ctx->wb_unfenced) group_fence(ctx);
        return true;
    }
}

unsigned group_run_ready(nvh_group_ctx *ctx)
{
    if (ctx->running) return 0;        /* the outer loop will see new entries */
    ctx->running = true;
    unsigned n = 0;
    while (ctx->head < ctx->tail) {
        uint64_t seq = ctx->head;
        group_entry *e = group_entry_at(ctx, seq);
        if (e->state != ENTRY_ENDED || !entry_ready(ctx, seq, e)) break;
        /* Pop before calling: the action may chain groups into the ring. */
        nvh_group_action action = e->action;
        void *arg = e->arg;
        ctx->stats.delay_groups += ctx->stats.groups - e->ended_at;
        e->state = 0;
        ctx->head++;
        ctx->stats.actions++;
        n++;
        if (action) {
            action(ctx->pool, ctx, arg);
            ctx->effects_unfenced = true;   /* it may have flushed stores */
        }
    }
    ctx->running = false;
    return n;
}

void group_force(nvh_group_ctx *ctx)
{
    NVH_ASSERT(!ctx->running && !ctx->open);
    /* Loops only while actions chain new groups. */
    while (group_pending(ctx) > 0) {
        if (group_is_simcache(ctx)) group_cache_writeback_all(ctx);
        if (ctx->opt.model != NVH_GROUP_SIM_UPPER) group_fence(ctx);
        group_run_ready(ctx);
    }
}

/* The ring is full at begin: run what is ready; if that frees nothing, fall
 * back to synchronous persistence of everything waiting. */
static int make_room(nvh_group_ctx *ctx)
{
    if (!ctx->running) group_run_ready(ctx);
    if (group_pending(ctx) < ctx->opt.slots) return NVH_OK;
    ctx->stats.fallbacks++;
    if (!ctx->running) {
        group_force(ctx);
        return NVH_OK;
    }
    /* An action is chaining groups into a full ring: make everything durable
     * (so the waiting entries are ready) but leave running them to the loop
     * we are inside; the new group needs room beyond `slots` meanwhile. */
    if (group_is_simcache(ctx)) group_cache_writeback_all(ctx);
    if (ctx->opt.model != NVH_GROUP_SIM_UPPER) group_fence(ctx);
    return group_pending(ctx) > ctx->mask ? grow_ring(ctx) : NVH_OK;
}

/* --------------------------------------------------------------------------
 * begin / add / end
 * -------------------------------------------------------------------------- */
int nvh_group_begin(nvh_group_ctx *ctx)
{
    int rc = check_ctx(ctx, "nvh_group_begin");
    if (rc != NVH_OK) return rc;
    if (ctx->open)
        return nvh_fail(NVH_E_INVAL, "nvh_group_begin: a group is already open (groups do "
                        "not nest: end it first)");
    /* [Moraru11] emulated the cost of the sgroup instruction, which orders
     * stores like an SFENCE, with an SFENCE. */
    if (ctx->opt.sgroup_fence && ctx->opt.model != NVH_GROUP_REAL) group_fence(ctx);
    group_run_ready_if_any(ctx);
    if (group_pending(ctx) >= ctx->opt.slots) {
        rc = make_room(ctx);
        if (rc != NVH_OK) return rc;
    }
    group_entry *e = group_entry_at(ctx, ctx->tail);
    memset(e, 0, sizeof *e);
    e->state = ENTRY_OPEN;
    ctx->tail++;
    ctx->open = true;
    return NVH_OK;
}

int nvh_group_add(nvh_group_ctx *ctx, const void *addr, size_t len)
{
    int rc = check_ctx(ctx, "nvh_group_add");
    if (rc != NVH_OK) return rc;
    if (!ctx->open) return nvh_fail(NVH_E_INVAL, "nvh_group_add: no group is open (begin one)");
    if (!addr) return nvh_fail(NVH_E_INVAL, "nvh_group_add: NULL address");
    if (len == 0) return NVH_OK;
    if (!nvh_contains(ctx->pool, addr, len))
        return nvh_fail(NVH_E_BADPTR, "nvh_group_add: [%p, +%zu) is not inside pool %s",
                        addr, len, ctx->pool->path);
    uint64_t lines = group_lines(addr, len);
    ctx->stats.lines_added += lines;
    switch (ctx->opt.model) {
    case NVH_GROUP_REAL:
        /* Start the write-back now, wait for it later (one shared fence). */
        nvh_flush(ctx->pool, addr, len);
        ctx->stats.lines_written_back += lines;
        break;
    case NVH_GROUP_SIM_UPPER:
        break;                           /* written back "at once", for free */
    default:
        group_cache_add(ctx, addr, len);
        break;
    }
    return NVH_OK;
}

int nvh_group_end(nvh_group_ctx *ctx, nvh_group_action action, void *arg)
{
    int rc = check_ctx(ctx, "nvh_group_end");
    if (rc != NVH_OK) return rc;
    if (!ctx->open) return nvh_fail(NVH_E_INVAL, "nvh_group_end: no group is open (begin one)");
    group_entry *e = group_entry_at(ctx, ctx->tail - 1);
    e->action = action;
    e->arg = arg;
    e->state = ENTRY_ENDED;
    ctx->open = false;
    ctx->stats.groups++;
    e->ended_at = ctx->stats.groups;
    if (group_pending(ctx) > ctx->stats.max_pending) ctx->stats.max_pending = group_pending(ctx);

    if (ctx->opt.model == NVH_GROUP_REAL) {
        batch_reason why = group_batch_due(ctx, true);
        if (why != BATCH_NONE && !ctx->running) {
            group_fence(ctx);
            if (why == BATCH_COUNT) ctx->stats.batch_fences++;
            else ctx->stats.timed_fences++;
        }
    }
    group_run_ready_if_any(ctx);
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * poll / sync
 * -------------------------------------------------------------------------- */
int nvh_group_poll(nvh_group_ctx *ctx)
{
    int rc = check_ctx(ctx, "nvh_group_poll");
    if (rc != NVH_OK) return rc;
    if (ctx->running) return 0;
    if (ctx->opt.model == NVH_GROUP_REAL) {
        batch_reason why = group_batch_due(ctx, false);
        if (why != BATCH_NONE) {
            group_fence(ctx);
            if (why == BATCH_COUNT) ctx->stats.batch_fences++;
            else ctx->stats.timed_fences++;
        }
    }
    return (int)group_run_ready(ctx);
}

int nvh_group_sync(nvh_group_ctx *ctx)
{
    int rc = check_ctx(ctx, "nvh_group_sync");
    if (rc != NVH_OK) return rc;
    if (ctx->running)
        return nvh_fail(NVH_E_BUSY, "nvh_group_sync: called from an action of the same "
                        "context (it would have to wait for itself)");
    if (ctx->open)
        return nvh_fail(NVH_E_INVAL, "nvh_group_sync: a group is open (end it first)");
    if (group_pending(ctx) == 0 && !ctx->effects_unfenced && !ctx->wb_unfenced)
        return NVH_OK;                   /* nothing to force: no fence */
    group_force(ctx);
    /* The actions' own stores (flushed by them) become durable now. */
    if (ctx->effects_unfenced || ctx->wb_unfenced) group_fence(ctx);
    ctx->stats.syncs++;
    return NVH_OK;
}
