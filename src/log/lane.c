/* lane.c — where the transaction log lives: the per-pool registry of log
 * state, the log directory (the named object "nvheap.tx": one header line per
 * lane), lane ownership by threads, and the segment chains that hold records
 * and grow on demand up to a settable limit.
 *
 * Why a registry: struct nvh_pool belongs to the pool layer and has no slot
 * for this layer, so the log state is found by pool address. A thread caches
 * (pool -> state, lane) in thread-local storage; the cache is invalidated by a
 * global generation number that every close bumps, so a pool closed and
 * another one opened at the same address is never confused with it. */
#include "log.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Registry
 * ========================================================================== */
/* Grows by doubling (under reg_lock): no limit on pools open at once. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static nvh_txlog **reg;
static unsigned reg_cap;
_Atomic uint64_t nvh_txlog_reg_gen_ = 1;
static uint64_t reg_next_id = 1;

#define TLS_SLOTS 4
typedef struct tls_entry {
    nvh_pool *pool;
    nvh_txlog *lg;
    nvh_lane *lane;
    uint64_t gen;               /* nvh_txlog_reg_gen_ when cached     */
    uint64_t id;                /* lg->gen when cached     */
} tls_entry;
static _Thread_local tls_entry tls_cache[TLS_SLOTS] __attribute__((tls_model("initial-exec")));
static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

/* Thread exit: give back the lanes this thread owns in pools still open. */
static void tls_destructor(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&reg_lock);
    for (unsigned i = 0; i < TLS_SLOTS; i++) {
        tls_entry *e = &tls_cache[i];
        if (!e->lg || !e->lane) continue;
        for (unsigned j = 0; j < reg_cap; j++)
            if (reg[j] == e->lg && reg[j]->gen == e->id) {
                atomic_store(&e->lane->owned, 0);
                break;
            }
        memset(e, 0, sizeof *e);
    }
    pthread_mutex_unlock(&reg_lock);
}
static void tls_key_init(void) { pthread_key_create(&tls_key, tls_destructor); }

static nvh_txlog *reg_find_locked(nvh_pool *pool)
{
    for (unsigned i = 0; i < reg_cap; i++)
        if (reg[i] && reg[i]->pool == pool) return reg[i];
    return NULL;
}

int nvh_txlog_register_(nvh_pool *pool, nvh_txlog *lg)
{
    pthread_mutex_lock(&reg_lock);
    unsigned i = 0;
    while (i < reg_cap && reg[i]) i++;
    if (i == reg_cap) {
        unsigned cap = reg_cap ? reg_cap * 2 : 16;
        nvh_txlog **g = realloc(reg, cap * sizeof *g);
        if (!g) {
            pthread_mutex_unlock(&reg_lock);
            return nvh_fail(NVH_E_NOMEM, "out of memory registering the transaction log of %s "
                            "(%u pools open)", pool->path, reg_cap);
        }
        memset(g + reg_cap, 0, (cap - reg_cap) * sizeof *g);
        reg = g;
        reg_cap = cap;
    }
    lg->gen = reg_next_id++;
    reg[i] = lg;
    pthread_mutex_unlock(&reg_lock);
    return NVH_OK;
}

void nvh_txlog_unregister_(nvh_txlog *lg)
{
    pthread_mutex_lock(&reg_lock);
    bool empty = true;
    for (unsigned i = 0; i < reg_cap; i++) {
        if (reg[i] == lg) reg[i] = NULL;
        empty &= reg[i] == NULL;
    }
    if (empty) {
        /* the last pool closed: give the array back, so nothing of this
         * library stays allocated once every pool is closed (a dlclose()d
         * copy would otherwise leak it) */
        free(reg);
        reg = NULL;
        reg_cap = 0;
    }
    atomic_fetch_add(&nvh_txlog_reg_gen_, 1);
    pthread_mutex_unlock(&reg_lock);
}

/* The state of `pool` and this thread's cached lane (may be NULL). */
static inline tls_entry *tls_lookup(nvh_pool *pool)
{
    uint64_t g = atomic_load_explicit(&nvh_txlog_reg_gen_, memory_order_acquire);
    for (unsigned i = 0; i < TLS_SLOTS; i++)
        if (tls_cache[i].pool == pool && tls_cache[i].gen == g) return &tls_cache[i];
    return NULL;
}

static tls_entry *tls_fill(nvh_pool *pool)
{
    pthread_once(&tls_once, tls_key_init);
    pthread_setspecific(tls_key, (void *)1);
    uint64_t g = atomic_load_explicit(&nvh_txlog_reg_gen_, memory_order_acquire);
    pthread_mutex_lock(&reg_lock);
    nvh_txlog *lg = reg_find_locked(pool);
    tls_entry *slot = NULL;
    if (lg) {
        /* reuse an entry for the same pool (its lane survives a gen bump if
         * the state is the same object with the same id), else a stale or
         * empty one, else evict the last */
        for (unsigned i = 0; i < TLS_SLOTS && !slot; i++)
            if (tls_cache[i].pool == pool && tls_cache[i].lg == lg && tls_cache[i].id == lg->gen)
                slot = &tls_cache[i];
        for (unsigned i = 0; i < TLS_SLOTS && !slot; i++) {
            tls_entry *e = &tls_cache[i];
            bool live = false;
            for (unsigned j = 0; j < reg_cap && e->lg; j++)
                if (reg[j] == e->lg && reg[j]->gen == e->id) live = true;
            if (!live) { memset(e, 0, sizeof *e); slot = e; }
        }
        if (!slot) {
            slot = &tls_cache[TLS_SLOTS - 1];
            if (slot->lane) {
                atomic_store(&slot->lane->owned, 0);
                /* the tx layer's cached descriptor of that lane (nvh_tx_last_)
                 * must not outlive the ownership: every cache refills */
                atomic_fetch_add(&nvh_txlog_reg_gen_, 1);
            }
            memset(slot, 0, sizeof *slot);
        }
        if (slot->lg != lg) {
            slot->lane = NULL;
            slot->lg = lg;
            slot->id = lg->gen;
        }
        slot->pool = pool;
        slot->gen = g;
    }
    pthread_mutex_unlock(&reg_lock);
    return slot;
}

nvh_txlog *nvh_txlog_get(nvh_pool *pool)
{
    if (!pool) { nvh_fail(NVH_E_INVAL, "pool is NULL"); return NULL; }
    tls_entry *e = tls_lookup(pool);
    if (!e) e = tls_fill(pool);
    if (!e) {
        nvh_fail(NVH_E_NOTSUP, "pool %p has no transaction log (read-only open?)", (void *)pool);
        return NULL;
    }
    return e->lg;
}

/* ==========================================================================
 * Directory
 * ========================================================================== */
int nvh_txlog_dir_ensure(nvh_txlog *lg)
{
    if (atomic_load_explicit((_Atomic(struct nvh_tx_dir *) *)&lg->dir, memory_order_acquire))
        return NVH_OK;
    nvh_pool *pool = lg->pool;
    pthread_mutex_lock(&lg->lock);
    int rc = NVH_OK;
    if (!lg->dir) {
        struct nvh_tx_dir *d = nvh_reserve_named(pool, NVH_TX_DIR_NAME, sizeof *d);
        if (!d) {
            rc = nvh_errcode();
        } else {
            bool win = nvh_protect_open_(pool, d, sizeof *d) == NVH_OK;
            memset(d, 0, sizeof *d);
            d->magic = NVH_TX_DIR_MAGIC;
            d->version = nvh_txlog_test_dir_version_ ? (uint32_t)nvh_txlog_test_dir_version_
                                                     : NVH_TX_DIR_VERSION;
            d->nlanes = NVH_TX_LANES;
            for (unsigned i = 0; i < NVH_TX_LANES; i++) {   /* zero words fail their check */
                atomic_store_explicit(&d->lane[i].state, NVH_LS_MAKE(0, 0, NVH_LS_IDLE),
                                      memory_order_relaxed);
                atomic_store_explicit(&d->retire[i].tid, nvh_rw_make(0), memory_order_relaxed);
            }
            nvh_persist(pool, d, sizeof *d);    /* before the activation (see seg_new) */
            if (win) (void)nvh_protect_close_(pool, d, sizeof *d);
            rc = nvh_activate_named(pool, NVH_TX_DIR_NAME);
            if (rc != NVH_OK) {
                nvh_cancel(pool, d);
            } else {
                nvh_txlog_dir_attach_(lg, d);
                atomic_store_explicit((_Atomic(struct nvh_tx_dir *) *)&lg->dir, d,
                                      memory_order_release);
            }
        }
    }
    pthread_mutex_unlock(&lg->lock);
    return rc;
}

/* ==========================================================================
 * Lanes
 * ========================================================================== */
nvh_lane *nvh_txlog_lane_acquire(nvh_txlog *lg)
{
    tls_entry *e = tls_lookup(lg->pool);
    if (!e) e = tls_fill(lg->pool);
    if (!e) return NULL;
    if (e->lane) return e->lane;
    if (nvh_txlog_dir_ensure(lg) != NVH_OK) return NULL;
    for (unsigned i = 0; i < NVH_TX_LANES; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&lg->lanes[i].owned, &expect, 1)) {
            atomic_fetch_or(&lg->lanes_used, 1ull << i);
            e->lane = &lg->lanes[i];
            return e->lane;
        }
    }
    nvh_fail(NVH_E_BUSY, "all %u transaction lanes of the pool are in use by other threads",
             NVH_TX_LANES);
    return NULL;
}

void nvh_txlog_lane_release(nvh_txlog *lg, nvh_lane *lane)
{
    tls_entry *e = tls_lookup(lg->pool);
    if (e && e->lane == lane) e->lane = NULL;
    atomic_store(&lane->owned, 0);
}

/* ==========================================================================
 * Segments
 * ========================================================================== */
struct nvh_seg *nvh_txlog_seg_at(nvh_txlog *lg, uint64_t off)
{
    if (!off || !nvh_txlog_in_pool(lg->pool, off, sizeof(struct nvh_seg))) return NULL;
    struct nvh_seg *s = nvh_ptr(lg->pool, off);
    if (s->magic != NVH_TX_SEG_MAGIC || s->size < NVH_TX_SEG_MIN ||
        !nvh_txlog_in_pool(lg->pool, off, s->size) ||
        64 + (uint64_t)s->nrec_cap * 64 + s->data_cap > s->size)
        return NULL;
    return s;
}

/* Allocate a segment of `size` bytes linked from *link (failure-atomically:
 * the allocator sets the link with the activation). */
static struct nvh_seg *seg_format(nvh_txlog *lg, void *obj, uint64_t size)
{
    nvh_pool *pool = lg->pool;
    struct nvh_seg *s = obj;
    memset(s, 0, NVH_CACHELINE);
    s->magic = NVH_TX_SEG_MAGIC;
    s->size = size;
    /* a quarter of the space for records, the rest for data (at least 8
     * record slots): word-heavy transactions fill records first, object ones
     * data */
    uint64_t nrec = (size - 64) / 4 / 64;
    if (nrec < 8) nrec = 8;
    s->nrec_cap = (uint32_t)nrec;
    s->data_cap = (uint32_t)(size - 64 - nrec * 64);
    s->check = nvh_seg_check(s);
    /* record slots must not look valid: tid 0 never matches a transaction */
    memset((char *)s + 64, 0, nrec * 64);
    /* persisted, not just flushed: the activation record may reach the media
     * before the other lines flushed ahead of its fence, and a linked
     * segment without its header would be taken for a damaged one */
    nvh_persist(pool, s, 64 + nrec * 64);
    return s;
}

static struct nvh_seg *seg_new(nvh_txlog *lg, nvh_lane *lane, uint64_t size, uint64_t *link)
{
    nvh_pool *pool = lg->pool;
    void *obj = nvh_reserve(pool, size);
    if (!obj) return NULL;
    /* formatted here, written until the transaction ends (closed with the
     * transaction's other windows, also if the activation fails) */
    if (nvh_txlog_win_open(lg, lane, obj, nvh_usable_size(pool, obj)) != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, obj);
        nvh_fail(code, "cannot grow the transaction log: %s", nvh_errormsg());
        return NULL;
    }
    struct nvh_seg *s = seg_format(lg, obj, nvh_usable_size(pool, obj));
    nvh_off_t *links[1] = {link};
    if (nvh_activate(pool, s, links, 1) != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, s);
        nvh_fail(code, "cannot grow the transaction log: %s", nvh_errormsg());
        return NULL;
    }
    return s;
}

static inline char *seg_data(struct nvh_seg *s) { return (char *)s + 64 + (uint64_t)s->nrec_cap * 64; }

/* Start filling segment n (its records and data are written until the
 * transaction ends: a write window on it while protection is on). */
static inline int seg_use(nvh_txlog *lg, nvh_lane *lane, struct nvh_seg *n)
{
    int rc = nvh_txlog_win_open(lg, lane, n, n->size);
    if (rc != NVH_OK) return rc;
    nvh_txlog_seg_set_(lane, n);
    return NVH_OK;
}

int nvh_txlog_room(nvh_txlog *lg, nvh_lane *lane, uint64_t data)
{
    data = NVH_ALIGN_UP(data, (uint64_t)8);
    struct nvh_seg *s = lane->seg;
    if (s && lane->rec_next < lane->seg_nrec_cap && lane->data_next + data <= lane->seg_data_cap)
        return NVH_OK;
    /* a transaction's first record: the slot's first segment, validated
     * once and remembered (no walk, no read of the header) */
    struct nvh_seg *h = lane->head_seg[lane->slot];
    if (!s && h && data <= h->data_cap) return seg_use(lg, lane, h);
    /* move on to the next segment of the chain, growing it if needed */
    /* the chain's head comes from the header's shadow (the header line may
     * have been evicted by a flush: never read it back on the hot path) */
    uint64_t *link = s ? &s->next : &lane->hdr->slot_head[lane->slot];
    uint64_t cur = s ? s->next : lane->sh.slot_head[lane->slot];
    for (;;) {
        struct nvh_seg *n = nvh_txlog_seg_at(lg, cur);
        if (!n) break;
        if (!s) lane->head_seg[lane->slot] = n;
        if (data <= n->data_cap) return seg_use(lg, lane, n);
        /* too small for this record: skip it (records keep their order) */
        link = &n->next;
        cur = n->next;
        s = n;
    }
    if (cur) {
        /* a linked object that is not a valid segment: only this layer links
         * here, so it is ours (e.g. written by an older, buggy version);
         * reformat it if it is an allocated object, else refuse */
        void *obj = nvh_ptr(lg->pool, cur);
        size_t usable = nvh_contains(lg->pool, obj, 64) ? nvh_usable_size(lg->pool, obj) : 0;
        if (usable < NVH_TX_SEG_MIN || usable > UINT32_MAX)
            return nvh_fail(NVH_E_CORRUPT, "transaction log segment at offset %llu is corrupt",
                            (unsigned long long)*link);
        int rc = nvh_txlog_win_open(lg, lane, obj, usable);
        if (rc != NVH_OK) return rc;
        struct nvh_seg *n = seg_format(lg, obj, usable);
        if (!s) lane->head_seg[lane->slot] = n;
        if ((rc = seg_use(lg, lane, n)) != NVH_OK) return rc;
        if (data <= n->data_cap) return NVH_OK;
        link = &n->next;
        cur = n->next;
        s = n;
        if (cur) return nvh_fail(NVH_E_CORRUPT, "transaction log chain is damaged");
    }
    uint64_t size = s ? s->size * 2 : NVH_TX_SEG_MIN;
    uint64_t need = 64 + 8 * 64 + data + NVH_CACHELINE;
    need = need * 4 / 3 + 64;
    while (size < need) size *= 2;
    uint64_t limit = atomic_load_explicit(&lg->limit, memory_order_relaxed);
    if (lane->chain_bytes[lane->slot] + size > limit) {
        if (lane->chain_bytes[lane->slot] + need <= limit) size = need;
        else
            return nvh_fail(NVH_E_NOSPACE, "transaction needs more log than the limit of %llu "
                            "bytes per thread (nvh_tx_set_log_limit)", (unsigned long long)limit);
    }
    struct nvh_seg *n = seg_new(lg, lane, size, link);
    if (!n) return nvh_errcode();
    if (link == &lane->hdr->slot_head[lane->slot]) {   /* keep the shadow in step */
        lane->sh.slot_head[lane->slot] = nvh_off(lg->pool, n);
        lane->head_seg[lane->slot] = n;
    }
    lane->chain_bytes[lane->slot] += n->size;
    int rc = seg_use(lg, lane, n);
    if (rc != NVH_OK) return rc;
    NVH_ASSERT(lane->data_next + data <= n->data_cap);
    return NVH_OK;
}

/* Bytes of every segment in a chain (at open, to enforce the limit). */
uint64_t nvh_txlog_chain_bytes_(nvh_txlog *lg, uint64_t head)
{
    uint64_t total = 0;
    for (struct nvh_seg *s = nvh_txlog_seg_at(lg, head); s; s = nvh_txlog_seg_at(lg, s->next))
        total += s->size;
    return total;
}

char *nvh_txlog_seg_data_(struct nvh_seg *s) { return seg_data(s); }

/* This thread's lane in pool (acquiring one on first use), with one TLS
 * lookup on the fast path. */
nvh_lane *nvh_txlog_lane_get(nvh_pool *pool, nvh_txlog **lg_out)
{
    tls_entry *e = pool ? tls_lookup(pool) : NULL;
    if (__builtin_expect(e && e->lane != NULL, 1)) {
        *lg_out = e->lg;
        return e->lane;
    }
    nvh_txlog *lg = nvh_txlog_get(pool);
    if (!lg) return NULL;
    *lg_out = lg;
    return nvh_txlog_lane_acquire(lg);
}
