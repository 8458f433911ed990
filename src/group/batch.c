/* batch.c — the REAL model's fence policy: when to spend one nvh_drain on
 * every group that ended since the last one.
 *
 * A group's lines were flushed (CLWB) at add, so all a group still needs is
 * one fence issued after its adds; any later fence serves every group ended
 * before it. Fences are the expensive part (an SFENCE waits for all the
 * thread's write-backs; in the msync domain it is an msync), so they are
 * shared: one fence when batch_count groups wait, or when the oldest waiting
 * group has waited batch_ns — the bound on how long an action is deferred
 * while the thread keeps working. N groups then cost about N / batch_count
 * fences. Waiting longer costs nothing in REAL mode: write-back started at
 * add, so by the time of the fence most lines are already in the media and
 * the fence returns quickly.
 *
 * The clock is not read at every end: a clock read can cost more than the
 * rest of a group's bookkeeping, and CLOCK_MONOTONIC_COARSE ticks too
 * slowly (milliseconds) for a 100 us default. It is read when the number of waiting
 * groups reaches a power of two (1 stamps the oldest; 2, 4, 8, ... check its
 * age) and at every poll. With groups ending every d ns, the check that
 * fires comes at most about twice the limit (+ d) after the oldest ended:
 * the age bound is approximate by design, in exchange for log2(batch_count)
 * clock reads per batch instead of batch_count. An idle thread must poll.
 */
#include "group.h"

/* --------------------------------------------------------------------------
 * Helpers
 * -------------------------------------------------------------------------- */
/* Ended groups not yet covered by a fence. Entries below ctx->fenced were
 * fenced; only they are ever retired in REAL mode, so head <= fenced. */
static inline uint64_t unfenced_groups(const nvh_group_ctx *ctx)
{
    uint64_t ended_end = ctx->open ? ctx->tail - 1 : ctx->tail;
    uint64_t from = ctx->fenced > ctx->head ? ctx->fenced : ctx->head;
    return ended_end > from ? ended_end - from : 0;
}

/* --------------------------------------------------------------------------
 * The policy
 * -------------------------------------------------------------------------- */
batch_reason group_batch_due(nvh_group_ctx *ctx, bool just_ended)
{
    uint64_t waiting = unfenced_groups(ctx);
    if (waiting == 0) return BATCH_NONE;
    if (waiting >= ctx->opt.batch_count) return BATCH_COUNT;
    if (ctx->opt.batch_ns == NVH_GROUP_NEVER) return BATCH_NONE;
    if (just_ended && (waiting & (waiting - 1)) != 0) return BATCH_NONE;  /* not 2^k */
    uint64_t now = group_now_ticks();
    if (just_ended && waiting == 1) {
        ctx->oldest_ticks = now;       /* the group that just ended is the oldest */
        return BATCH_NONE;
    }
    return now - ctx->oldest_ticks >= ctx->batch_ticks ? BATCH_TIME : BATCH_NONE;
}
