/* simcache.c — the simulated CPU cache behind the SIM_CACHE and SIM_LOWER
 * models: exact cache-line counters ([Moraru11] §5.1, §7.3) in software.
 *
 * The cache holds the dirty lines that groups added, each tagged with the
 * group that dirtied it. The rules are the paper's:
 *   - adding a line that is not dirty tags it with the open group and
 *     increments that group's counter (group_entry.dirty);
 *   - adding a line that is already dirty changes no counter, whichever group
 *     it is tagged with: an older group's counter already covers it, and
 *     since actions run in group order, the older action (which waits for
 *     that line's write-back, carrying the new stores too) runs first;
 *   - a line leaves the cache when it is written back — evicted because the
 *     cache holds more than `capacity` lines (LRU, or uniformly random with a
 *     seeded generator, so runs are reproducible), or forced by sync or a
 *     full ring — and its group's counter falls by one.
 * A write-back is a real nvh_flush of the line's current content, so in the
 * sim domain the media (and every crash image) sees exactly what the model
 * says was written back; the fence acknowledging it is issued lazily by the
 * queue, just before an action depends on it.
 *
 * SIM_LOWER is this cache with unlimited capacity: nothing is ever evicted.
 *
 * Layout: a dense array of records (so a random victim is one index), an
 * open-addressing hash table from line to record (linear probing, backward-
 * shift deletion: no tombstones to clean up), and an LRU list threaded
 * through the records by index.
 */
#include "group.h"

#include <stdlib.h>
#include <string.h>

#define CACHE_INITIAL 1024u

/* --------------------------------------------------------------------------
 * Hashing and randomness
 * -------------------------------------------------------------------------- */
static inline uint32_t home_slot(const sim_cache *c, uintptr_t line)
{
    return (uint32_t)nvh_mix64((uint64_t)line) & c->table_mask;
}

/* --------------------------------------------------------------------------
 * Hash table
 * -------------------------------------------------------------------------- */
/* Table position holding `line`, or CACHE_NIL. */
static uint32_t table_find(const sim_cache *c, uintptr_t line)
{
    for (uint32_t i = home_slot(c, line);; i = (i + 1) & c->table_mask) {
        uint32_t v = c->table[i];
        if (v == 0) return CACHE_NIL;
        if (c->recs[v - 1].line == line) return i;
    }
}

static void table_put(sim_cache *c, uintptr_t line, uint32_t idx)
{
    uint32_t i = home_slot(c, line);
    while (c->table[i]) i = (i + 1) & c->table_mask;
    c->table[i] = idx + 1;
}

/* Backward-shift deletion: pull later members of the probe run into the
 * hole when their home slot does not lie (cyclically) after the hole. */
static void table_delete_at(sim_cache *c, uint32_t hole)
{
    uint32_t i = hole;
    for (;;) {
        i = (i + 1) & c->table_mask;
        uint32_t v = c->table[i];
        if (v == 0) break;
        uint32_t home = home_slot(c, c->recs[v - 1].line);
        /* does home lie cyclically in (hole, i]? then it must stay */
        bool stays = hole <= i ? (home > hole && home <= i) : (home > hole || home <= i);
        if (stays) continue;
        c->table[hole] = v;
        hole = i;
    }
    c->table[hole] = 0;
}

/* Double the record array and the table (load factor <= 1/2). */
static int cache_grow(sim_cache *c)
{
    uint32_t cap = c->cap * 2;
    cache_rec *recs = realloc(c->recs, (size_t)cap * sizeof *recs);
    if (!recs) return NVH_E_NOMEM;
    c->recs = recs;
    uint32_t *table = calloc((size_t)cap * 2, sizeof *table);
    if (!table) return NVH_E_NOMEM;
    free(c->table);
    c->table = table;
    c->table_mask = cap * 2 - 1;
    c->cap = cap;
    for (uint32_t k = 0; k < c->count; k++) table_put(c, c->recs[k].line, k);
    return NVH_OK;
}

/* --------------------------------------------------------------------------
 * LRU list (mru = most recently added; rec.prev points towards it)
 * -------------------------------------------------------------------------- */
static inline void lru_unlink(sim_cache *c, uint32_t k)
{
    cache_rec *r = &c->recs[k];
    if (r->prev != CACHE_NIL) c->recs[r->prev].next = r->next;
    else c->mru = r->next;
    if (r->next != CACHE_NIL) c->recs[r->next].prev = r->prev;
    else c->lru = r->prev;
}

static inline void lru_push_front(sim_cache *c, uint32_t k)
{
    cache_rec *r = &c->recs[k];
    r->prev = CACHE_NIL;
    r->next = c->mru;
    if (c->mru != CACHE_NIL) c->recs[c->mru].prev = k;
    c->mru = k;
    if (c->lru == CACHE_NIL) c->lru = k;
}

/* --------------------------------------------------------------------------
 * Records
 * -------------------------------------------------------------------------- */
/* Remove record k: out of the table and the list, and the last record moves
 * into its place (keeping the array dense for random victims). */
static void rec_remove(sim_cache *c, uint32_t k)
{
    table_delete_at(c, table_find(c, c->recs[k].line));
    lru_unlink(c, k);
    uint32_t last = --c->count;
    if (k == last) return;
    cache_rec *moved = &c->recs[k];
    *moved = c->recs[last];
    /* Its table entry still says last + 1; k's own entry is gone already, so
     * the lookup (which compares recs[v - 1].line) can only find that one. */
    c->table[table_find(c, moved->line)] = k + 1;
    if (moved->prev != CACHE_NIL) c->recs[moved->prev].next = k;
    else c->mru = k;
    if (moved->next != CACHE_NIL) c->recs[moved->next].prev = k;
    else c->lru = k;
}

/* Write record k's line back and drop it from the cache: its group's
 * counter falls. */
static void write_back(nvh_group_ctx *ctx, uint32_t k)
{
    sim_cache *c = &ctx->cache;
    const cache_rec *r = &c->recs[k];
    nvh_flush(ctx->pool, (const void *)(r->line * NVH_CACHELINE), NVH_CACHELINE);
    group_entry *e = group_entry_at(ctx, r->group);
    NVH_ASSERT(r->group >= ctx->head && r->group < ctx->tail && e->dirty > 0);
    e->dirty--;
    ctx->stats.lines_written_back++;
    ctx->wb_unfenced = true;
    rec_remove(c, k);
}

static void evict_one(nvh_group_ctx *ctx)
{
    sim_cache *c = &ctx->cache;
    uint32_t victim = c->policy == NVH_GROUP_EVICT_LRU
                          ? c->lru
                          : (uint32_t)(nvh_splitmix64(&c->rng) % c->count);
    write_back(ctx, victim);
    ctx->stats.evictions++;
}

/* --------------------------------------------------------------------------
 * Entry points
 * -------------------------------------------------------------------------- */
int group_cache_init(sim_cache *c, uint64_t capacity, nvh_group_evict policy, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->recs = malloc(CACHE_INITIAL * sizeof *c->recs);
    c->table = calloc(CACHE_INITIAL * 2, sizeof *c->table);
    if (!c->recs || !c->table) {
        free(c->recs);
        free(c->table);
        return nvh_fail(NVH_E_NOMEM, "nvh_group_ctx_create: out of memory for the simulated "
                        "cache");
    }
    c->cap = CACHE_INITIAL;
    c->table_mask = CACHE_INITIAL * 2 - 1;
    c->mru = c->lru = CACHE_NIL;
    c->capacity = capacity;
    c->policy = policy;
    c->rng = seed;
    return NVH_OK;
}

void group_cache_fini(sim_cache *c)
{
    free(c->recs);
    free(c->table);
    memset(c, 0, sizeof *c);
}

void group_cache_add(nvh_group_ctx *ctx, const void *addr, size_t len)
{
    sim_cache *c = &ctx->cache;
    uint64_t open_seq = ctx->tail - 1;
    group_entry *open = group_entry_at(ctx, open_seq);
    uintptr_t first = (uintptr_t)addr / NVH_CACHELINE;
    uintptr_t last = ((uintptr_t)addr + len - 1) / NVH_CACHELINE;
    for (uintptr_t line = first; line <= last; line++) {
        uint32_t pos = table_find(c, line);
        if (pos != CACHE_NIL) {
            /* Already dirty: no counter changes (§5.1); it was just used. */
            uint32_t k = c->table[pos] - 1;
            lru_unlink(c, k);
            lru_push_front(c, k);
            continue;
        }
        if (c->count == c->cap && (c->cap >= UINT32_MAX / 4 || cache_grow(c) != NVH_OK)) {
            /* No memory to track it: write it through instead, like the
             * paper's C0 counter. Its group then waits only for the fence. */
            nvh_flush(ctx->pool, (const void *)(line * NVH_CACHELINE), NVH_CACHELINE);
            ctx->stats.lines_written_back++;
            ctx->wb_unfenced = true;
            continue;
        }
        uint32_t k = c->count++;
        c->recs[k].line = line;
        c->recs[k].group = open_seq;
        table_put(c, line, k);
        lru_push_front(c, k);
        open->dirty++;
        while (c->count > c->capacity) evict_one(ctx);
    }
}

void group_cache_writeback_all(nvh_group_ctx *ctx)
{
    sim_cache *c = &ctx->cache;
    if (c->count == 0) return;
    /* In LRU order, as a cache flush would (it does not matter for
     * correctness: all of them are fenced together). */
    for (uint32_t k = c->lru; k != CACHE_NIL; k = c->recs[k].prev) {
        const cache_rec *r = &c->recs[k];
        nvh_flush(ctx->pool, (const void *)(r->line * NVH_CACHELINE), NVH_CACHELINE);
        group_entry_at(ctx, r->group)->dirty--;
        ctx->stats.lines_written_back++;
    }
    ctx->wb_unfenced = true;
    c->count = 0;
    c->mru = c->lru = CACHE_NIL;
    memset(c->table, 0, ((size_t)c->table_mask + 1) * sizeof *c->table);
}
