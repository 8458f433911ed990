/* store.c — nvcached's items in an nvheap pool, on the persistent hash map
 * (nvh_hmap_*). The only file that knows the engine (see store.h).
 *
 * Pool root area (application-owned, struct nvc_root below): the map's
 * offset, the CAS high-water mark, the generation, and the flush_all marks.
 *
 * CAS values: the root holds `cas_reserved`, the highest value this or an
 * earlier process may have handed out. A process hands out values from a
 * DRAM counter and persists a new reservation only when it passes the old
 * one (one fence per CAS_BATCH stores), so a store needs no extra fence and
 * the next process starts above every value ever used.
 *
 * Eviction: the DRAM index (lru.c) knows each item's key and size. After a
 * restart it knows only the items stored since; the earlier run's items
 * are counted by `bytes_hint` (root, stored without a fence on every
 * change: exact after SIGKILL, a hint after a power loss) until a
 * background walk of the map indexes them. That walk goes in small
 * resumable steps (nvh_hmap_walk) and never blocks requests for longer than
 * one step's indexing; it starts only when the memory in use reaches half
 * the limit, so a restart under the limit never scans at all.
 *
 * Locks. Gets take none (nvc_store_read: the map's lock-free lookup, the
 * value copied out while the map holds back its reuse). A change holds its
 * key's lock (one of NVC_KEY_LOCKS stripes, nvc_store_lock) for the whole
 * read-modify-write, so changes of different keys run in parallel, down to
 * the map, whose writers are striped too (docs/HASHMAP.md §7): the durable
 * map operation, a value's copy and its flushes, hold no lock shared by
 * every writer. The DRAM bookkeeping (eviction index, CAS counter,
 * counters, the bytes hints) is under `meta`, held for a few hundred
 * instructions and never across a fence except when evicting. Lock order:
 * key lock, then meta, then the map's locks; an evictor holding meta takes
 * a victim's key lock only with trylock. */
#include "store.h"
#include "lru.h"

#include <nvheap.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NVC_ROOT_MAGIC 0x3148434143564e00ull  /* "\0NVCACH1" little-endian */
#define NVC_ROOT_VERSION 1u
#define NVC_LAYOUT "nvcached"
#define NVC_POOL_INITIAL ((uint64_t)64 << 20)
#define CAS_BATCH 65536u

/* On media, in the pool's root area. */
struct nvc_root {
    uint64_t magic;          /* NVC_ROOT_MAGIC once the map exists                */
    uint32_t version;        /* NVC_ROOT_VERSION                                  */
    uint32_t reserved0;
    nvh_off_t map;           /* the hash map (nvh_hmap_create's link word)         */
    uint64_t cas_reserved;   /* every CAS value handed out is <= this              */
    uint64_t generation;     /* incremented and persisted at every start          */
    uint64_t flush_cas;      /* items with cas <= this are flushed                 */
    int64_t oldest_live;     /* flush_all delay: items stored at or before it are
                                flushed once now >= it; 0 = none                    */
    uint64_t bytes_hint;     /* item bytes (store.c's item_size) at the last
                                change: plain store, no fence                        */
    uint64_t items_hint;     /* items at the last change: the same way           */
    uint64_t reserved[7];
};
_Static_assert(sizeof(struct nvc_root) == 128, "nvc_root is 128 bytes on media");
_Static_assert(offsetof(struct nvc_root, map) == 16, "nvc_root.map offset");
_Static_assert(offsetof(struct nvc_root, oldest_live) == 48, "nvc_root.oldest_live offset");
_Static_assert(offsetof(struct nvc_root, bytes_hint) == 56, "nvc_root.bytes_hint offset");
_Static_assert(offsetof(struct nvc_root, items_hint) == 64, "nvc_root.items_hint offset");

#define NVC_KEY_LOCKS 64u

struct key_lock {
    pthread_mutex_t m;
} __attribute__((aligned(64)));

struct nvc_store {
    pthread_mutex_t lock;        /* meta: the DRAM bookkeeping (above)       */
    struct key_lock keys[NVC_KEY_LOCKS];
    /* Lock-free readers (nvc_store_read) do not touch the eviction index:
     * each thread queues the hashes of the keys it read in a ring of its
     * own, and whoever holds the store lock applies the queued reference
     * bits (eviction drains every ring before the CLOCK hand moves). */
    struct bump_ring *rings;     /* list, grows under meta; freed at close   */
    nvh_pool *pool;
    nvh_hmap *map;
    struct nvc_root *root;
    nvc_lru *lru;
    nvc_store_config cfg;
    char *path;
    uint64_t next_cas;
    uint64_t evictions, reclaimed, total_items;   /* under the lock */
    uint64_t recovery_us;
    uint64_t old_bytes;      /* bytes_hint at open: the earlier run's items, until indexed */
    uint64_t old_items;      /* items_hint at open, the same way */
    pthread_t scan_thread;
    bool scan_started;
    int scan_stop;           /* atomic */
    int scan_done;           /* atomic */
    uint64_t scan_us;        /* atomic */
    uint64_t walk_us;        /* atomic: the walk's steps (no lock held)     */
};

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Memory an item takes in the pool: the map's 32 B entry header, key,
 * our header, data, rounded to the entries' 64 B alignment. */
static uint64_t item_size(size_t klen, size_t vlen)
{
    return (32u + klen + vlen + 63u) & ~(uint64_t)63u;
}

/* The flush marks are read by lock-free readers while flush_all (under the
 * store lock) writes them: atomic loads and stores. */
static bool hdr_live(const struct nvc_root *r, const nvc_hdr *h, int64_t now)
{
    if (h->exptime != 0 && h->exptime <= now)
        return false;
    if (h->cas <= __atomic_load_n(&r->flush_cas, __ATOMIC_RELAXED))
        return false;
    int64_t ol = __atomic_load_n(&r->oldest_live, __ATOMIC_RELAXED);
    if (ol != 0 && ol <= now && h->time <= ol)
        return false;
    return true;
}

/* ---- reference bits of lock-free reads ---------------------------------- */

/* One ring per reading thread: the reader produces (head), the holder of
 * the store lock consumes (tail), so a get costs a hash and two plain
 * atomic accesses to lines of its own thread, no shared lock. A full ring
 * drops the bump (CLOCK is approximate anyway) after trying to drain it. */
#define BUMP_RING 256u

struct bump_ring {
    struct bump_ring *next;
    uint64_t head;               /* atomic: written by the owner thread      */
    char pad[56];
    uint64_t tail;               /* atomic: written under the store lock      */
    uint64_t h[BUMP_RING];
};

static _Thread_local struct bump_ring *my_ring;
static _Thread_local const nvc_store *my_ring_store;

/* With meta held. */
static void bumps_drain(nvc_store *s)
{
    for (struct bump_ring *r = s->rings; r; r = r->next) {
        uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        uint64_t tail = r->tail;
        for (; tail != head; tail++)
            lru_bump_hash(s->lru, r->h[tail % BUMP_RING]);
        __atomic_store_n(&r->tail, tail, __ATOMIC_RELEASE);
    }
}

static void bump_later(nvc_store *s, const char *key, size_t klen)
{
    struct bump_ring *r = my_ring;
    if (!r || my_ring_store != s) {
        r = calloc(1, sizeof *r);
        if (!r)
            return;
        pthread_mutex_lock(&s->lock);
        r->next = s->rings;
        s->rings = r;
        pthread_mutex_unlock(&s->lock);
        my_ring = r;
        my_ring_store = s;
    }
    uint64_t head = r->head;
    if (head - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) >= BUMP_RING / 2 &&
        pthread_mutex_trylock(&s->lock) == 0) {
        bumps_drain(s);
        pthread_mutex_unlock(&s->lock);
    }
    if (head - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) >= BUMP_RING)
        return;
    r->h[head % BUMP_RING] = lru_hash(key, klen);
    __atomic_store_n(&r->head, head + 1, __ATOMIC_RELEASE);
}


static unsigned key_stripe(const char *key, size_t klen)
{
    return (unsigned)(lru_hash(key, klen) >> 32) & (NVC_KEY_LOCKS - 1);
}

void nvc_store_lock(nvc_store *s, const char *key, size_t klen)
{
    pthread_mutex_lock(&s->keys[key_stripe(key, klen)].m);
}

void nvc_store_unlock(nvc_store *s, const char *key, size_t klen)
{
    pthread_mutex_unlock(&s->keys[key_stripe(key, klen)].m);
}

static void meta_lock(nvc_store *s) { pthread_mutex_lock(&s->lock); }
static void meta_unlock(nvc_store *s) { pthread_mutex_unlock(&s->lock); }

/* The value length of key's entry, read inside the map's reader epoch (a
 * pointer from nvh_hmap_get is not safe to read once a concurrent change
 * may have freed the entry). */
static int vlen_fn(const void *key, size_t klen, const void *v, size_t vlen, void *arg)
{
    (void)key;
    (void)klen;
    (void)v;
    *(size_t *)arg = vlen;
    return 1;
}

/* Item bytes in use: exact once the index is complete, else the index
 * plus what the earlier run left (an over-estimate if keys were rewritten). */
static uint64_t mem_used(nvc_store *s)
{
    uint64_t b = lru_bytes(s->lru);
    if (!__atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE))
        b += s->old_bytes;
    return b;
}

static uint64_t items_used(nvc_store *s)
{
    uint64_t n = lru_count(s->lru);
    if (!__atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE))
        n += s->old_items;
    return n;
}

static void note_change(nvc_store *s)
{
    s->root->bytes_hint = mem_used(s);
    s->root->items_hint = items_used(s);
}

/* ---- the background scan ---------------------------------------------- */

struct scan_buf {
    char *p;
    size_t len, cap;
    int *stop;
};

static int scan_fn(const void *key, size_t klen, const void *value, size_t vlen, void *arg)
{
    struct scan_buf *b = arg;
    (void)value;
    if (__atomic_load_n(b->stop, __ATOMIC_RELAXED))
        return 2;
    if (klen > NVC_KEY_MAX)
        return 0;                 /* not ours: never written by nvcached */
    size_t need = 1 + 8 + klen;
    if (b->len + need > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : (1u << 20);
        while (cap < b->len + need)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 2;
        b->p = p;
        b->cap = cap;
    }
    uint64_t size = item_size(klen, vlen);
    b->p[b->len] = (char)klen;
    memcpy(b->p + b->len + 1, &size, 8);
    memcpy(b->p + b->len + 9, key, klen);
    b->len += need;
    return 0;
}

/* The rebuild walks the map in steps of SCAN_STEP entries (nvh_hmap_walk:
 * no lock, a reader epoch for the step only), then indexes the step's keys
 * under the store lock, checking each again (it may have gone or changed
 * since): requests wait at most for one step's indexing. */
#define SCAN_STEP 256u

static void *scan_main(void *arg)
{
    nvc_store *s = arg;
    uint64_t t0 = now_us(), walk = 0;
    struct scan_buf b = { .stop = &s->scan_stop };
    nvh_hmap_cursor cur = { 0, 0 };
    int rc = 1;
    while (rc == 1 && !__atomic_load_n(&s->scan_stop, __ATOMIC_RELAXED)) {
        uint64_t w0 = now_us();
        b.len = 0;
        rc = nvh_hmap_walk(s->map, &cur, SCAN_STEP, scan_fn, &b);
        walk += now_us() - w0;
        if (rc < 0)
            fprintf(stderr, "nvcached: index rebuild: %s\n", nvh_errormsg());
        meta_lock(s);
        for (size_t off = 0; off < b.len;) {
            size_t klen = (uint8_t)b.p[off];
            const char *key = b.p + off + 9;
            off += 9 + klen;
            if (lru_contains(s->lru, key, klen))
                continue;
            size_t vlen;
            if (nvh_hmap_get_fn(s->map, key, klen, vlen_fn, &vlen) != 1)
                continue;
            lru_set(s->lru, key, klen, item_size(klen, vlen), true);
        }
        meta_unlock(s);
    }
    free(b.p);
    __atomic_store_n(&s->walk_us, walk, __ATOMIC_RELAXED);
    __atomic_store_n(&s->scan_us, now_us() - t0, __ATOMIC_RELAXED);
    /* Under the lock: mem_used switches from "index + hint" to "index"
     * between two changes, never in the middle of one. */
    meta_lock(s);
    __atomic_store_n(&s->scan_done, 1, __ATOMIC_RELEASE);
    meta_unlock(s);
    return NULL;
}

/* ---- open / close ------------------------------------------------------- */

nvc_store *nvc_store_open(const nvc_store_config *cfg, char *err, size_t errlen)
{
    nvc_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->path = strdup(cfg->path);
    /* Adaptive: critical sections are short (a lookup and a copy, or one
     * durable map operation), so spinning a little beats sleeping. */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&s->lock, &ma);
    for (unsigned k = 0; k < NVC_KEY_LOCKS; k++)
        pthread_mutex_init(&s->keys[k].m, &ma);
    pthread_mutexattr_destroy(&ma);
    s->lru = lru_new();
    if (!s->path || !s->lru) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    uint64_t t0 = now_us();
    s->pool = nvh_pool_open(cfg->path, NVC_LAYOUT, cfg->pool_flags);
    if (!s->pool && nvh_errcode() == NVH_E_NOENT)
        s->pool = nvh_pool_create(cfg->path, NVC_LAYOUT, NVC_POOL_INITIAL, cfg->pool_flags);
    if (!s->pool) {
        snprintf(err, errlen, "pool %s: %s", cfg->path, nvh_errormsg());
        goto fail;
    }
    uint64_t rsize = 0;
    s->root = nvh_root(s->pool, &rsize);
    if (!s->root || rsize < sizeof *s->root) {
        snprintf(err, errlen, "pool %s: root area too small (%llu bytes)", cfg->path,
                 (unsigned long long)rsize);
        goto fail;
    }
    struct nvc_root *r = s->root;
    if (r->magic != 0 && (r->magic != NVC_ROOT_MAGIC || r->version != NVC_ROOT_VERSION)) {
        snprintf(err, errlen, "pool %s: root is not an nvcached root of version %u "
                 "(magic %#llx, version %u)", cfg->path, NVC_ROOT_VERSION,
                 (unsigned long long)r->magic, r->version);
        goto fail;
    }
    /* A fresh pool: create the map (failure-atomic on its link word), then
     * mark the root. A crash in between leaves a map and no magic: the next
     * start only writes the magic. */
    if (r->map == 0 && nvh_hmap_create(s->pool, &r->map, NULL) != 0) {
        snprintf(err, errlen, "pool %s: creating the map: %s", cfg->path, nvh_errormsg());
        goto fail;
    }
    if (r->magic == 0) {
        r->version = NVC_ROOT_VERSION;
        nvh_persist(s->pool, &r->version, sizeof r->version);
        r->magic = NVC_ROOT_MAGIC;
        nvh_persist(s->pool, &r->magic, sizeof r->magic);
    }
    s->map = nvh_hmap_open(s->pool, r->map);
    if (!s->map) {
        snprintf(err, errlen, "pool %s: opening the map: %s", cfg->path, nvh_errormsg());
        goto fail;
    }
    r->generation++;
    nvh_persist(s->pool, &r->generation, sizeof r->generation);
    s->next_cas = r->cas_reserved + 1;
    s->recovery_us = now_us() - t0;
    s->old_bytes = nvh_hmap_count(s->map) ? r->bytes_hint : 0;
    s->old_items = s->old_bytes ? r->items_hint : 0;
    if (s->old_bytes == 0)
        __atomic_store_n(&s->scan_done, 1, __ATOMIC_RELEASE);   /* nothing to index */
    return s;
fail:
    nvc_store_close(s);
    return NULL;
}

void nvc_store_close(nvc_store *s)
{
    if (!s)
        return;
    if (s->scan_started) {
        __atomic_store_n(&s->scan_stop, 1, __ATOMIC_RELAXED);
        pthread_join(s->scan_thread, NULL);
    }
    if (s->map && s->root) {
        note_change(s);
        nvh_persist(s->pool, &s->root->bytes_hint, 2 * sizeof s->root->bytes_hint);
    }
    if (s->map)
        nvh_hmap_close(s->map);
    if (s->pool)
        nvh_pool_close(s->pool);
    lru_free(s->lru);
    pthread_mutex_destroy(&s->lock);
    for (unsigned k = 0; k < NVC_KEY_LOCKS; k++)
        pthread_mutex_destroy(&s->keys[k].m);
    while (s->rings) {
        struct bump_ring *r = s->rings;
        s->rings = r->next;
        free(r);
    }
    free(s->path);
    free(s);
}

/* ---- items -------------------------------------------------------------- */

int nvc_store_find(nvc_store *s, const char *key, size_t klen, int64_t now, bool bump,
                   nvc_view *view)
{
    const void *v;
    size_t vlen;
    if (nvh_hmap_get(s->map, key, klen, &v, &vlen) != 0 || vlen < sizeof(nvc_hdr))
        return 0;
    memcpy(&view->hdr, v, sizeof view->hdr);
    if (!hdr_live(s->root, &view->hdr, now))
        return 0;
    view->data = (const char *)v + sizeof(nvc_hdr);
    view->len = vlen - sizeof(nvc_hdr);
    if (bump)
        bump_later(s, key, klen);      /* the index is under meta */
    return 1;
}

struct read_ctx {
    nvc_store *s;
    int64_t now;
    nvc_read_fn fn;
    void *arg;
};

static int read_fn(const void *key, size_t klen, const void *v, size_t vlen, void *arg)
{
    struct read_ctx *r = arg;
    (void)key;
    (void)klen;
    if (vlen < sizeof(nvc_hdr))
        return 2;
    nvc_view view;
    memcpy(&view.hdr, v, sizeof view.hdr);
    if (!hdr_live(r->s->root, &view.hdr, r->now))
        return 2;
    view.data = (const char *)v + sizeof(nvc_hdr);
    view.len = vlen - sizeof(nvc_hdr);
    r->fn(&view, r->arg);
    return 1;
}

int nvc_store_read(nvc_store *s, const char *key, size_t klen, int64_t now, bool bump,
                   nvc_read_fn fn, void *arg)
{
    struct read_ctx r = { s, now, fn, arg };
    if (nvh_hmap_get_fn(s->map, key, klen, read_fn, &r) != 1)
        return 0;
    if (bump)
        bump_later(s, key, klen);
    return 1;
}

void nvc_store_read_begin(nvc_store *s)
{
    nvh_hmap_read_begin(s->map);
}

void nvc_store_read_end(nvc_store *s)
{
    nvh_hmap_read_end(s->map);
}

static void maybe_start_scan(nvc_store *s, uint64_t need)
{
    if (s->scan_started || __atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE))
        return;
    if (mem_used(s) + need <= s->cfg.limit_bytes / 2)
        return;
    if (pthread_create(&s->scan_thread, NULL, scan_main, s) == 0)
        s->scan_started = true;
}

int nvc_store_index_rebuild(nvc_store *s)
{
    meta_lock(s);
    if (!s->scan_started && !__atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE) &&
        pthread_create(&s->scan_thread, NULL, scan_main, s) == 0)
        s->scan_started = true;
    meta_unlock(s);
    return 0;
}

/* With meta and the key lock of stripe `own` held: evict the CLOCK hand's
 * next victim. Its key lock is needed too (a holder of it may be reading
 * the item in place), taken with trylock (lock order): a victim whose lock
 * is busy is passed over for the next. Returns 1 if one was evicted, 0 if
 * the index is empty or every candidate was busy. */
static int evict_one(nvc_store *s, unsigned own)
{
    char victim[NVC_KEY_MAX + 1];
    bumps_drain(s);              /* recent reads count before the hand moves */
    for (int tries = 0; tries < 8; tries++) {
        int vk = lru_victim(s->lru, victim);
        if (vk < 0)
            return 0;
        unsigned vs = key_stripe(victim, (size_t)vk);
        if (vs != own && pthread_mutex_trylock(&s->keys[vs].m) != 0)
            continue;
        if (nvh_hmap_delete(s->map, victim, (size_t)vk) == 0)
            s->evictions++;
        lru_remove(s->lru, victim, (size_t)vk);
        if (vs != own)
            pthread_mutex_unlock(&s->keys[vs].m);
        note_change(s);
        return 1;
    }
    return 0;
}

int nvc_store_put(nvc_store *s, const char *key, size_t klen, void *value, size_t vlen,
                  bool keep_cas, uint64_t *cas)
{
    uint64_t size = item_size(klen, vlen);
    uint64_t limit = s->cfg.limit_bytes;
    if (size > limit)
        return NVC_TOOLARGE;
    unsigned own = key_stripe(key, klen);
    meta_lock(s);
    /* Make room first: the old item of this key (if indexed) is replaced. */
    int64_t known = lru_size(s->lru, key, klen);
    uint64_t oldsize = known > 0 ? (uint64_t)known : 0;
    maybe_start_scan(s, size);
    bool indexed = __atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE);
    while (mem_used(s) - oldsize + size > limit) {
        if (s->cfg.no_evict) {
            meta_unlock(s);
            return NVC_NOMEM;
        }
        if (!evict_one(s, own)) {
            /* Only the earlier run's items are left and the index of them
             * is still being built (or every victim's key is being changed
             * right now): store over the limit for that time rather than
             * fail. */
            if (!indexed || lru_count(s->lru) > 0)
                break;
            meta_unlock(s);
            return NVC_NOMEM;
        }
        if (!lru_contains(s->lru, key, klen))
            oldsize = 0;             /* evicted this very key */
    }
    nvc_hdr *h = value;
    if (!keep_cas) {
        if (s->next_cas > s->root->cas_reserved) {
            s->root->cas_reserved = s->next_cas + CAS_BATCH - 1;
            nvh_persist(s->pool, &s->root->cas_reserved, sizeof s->root->cas_reserved);
        }
        h->cas = s->next_cas++;
    }
    meta_unlock(s);
    /* The durable write under the key lock only. */
    int rc;
    for (int tries = 0;; tries++) {
        rc = nvh_hmap_put(s->map, key, klen, value, vlen);
        if (rc != NVH_E_NOSPACE || tries >= 64 || s->cfg.no_evict)
            break;
        meta_lock(s);
        int evicted = evict_one(s, own);
        meta_unlock(s);
        if (!evicted)
            break;
    }
    if (rc == NVH_E_NOSPACE || rc == NVH_E_NOMEM)
        return NVC_NOMEM;
    if (rc != 0) {
        fprintf(stderr, "nvcached: storing an item: %s\n", nvh_errormsg());
        return NVC_ERR;
    }
    meta_lock(s);
    lru_set(s->lru, key, klen, size, false);
    s->total_items++;
    note_change(s);
    meta_unlock(s);
    if (cas)
        *cas = h->cas;
    return NVC_OK;
}

int nvc_store_delete(nvc_store *s, const char *key, size_t klen)
{
    int rc = nvh_hmap_delete(s->map, key, klen);
    meta_lock(s);
    lru_remove(s->lru, key, klen);
    note_change(s);
    meta_unlock(s);
    if (rc == 0)
        return 1;
    if (rc != NVH_E_NOTFOUND)
        fprintf(stderr, "nvcached: deleting an item: %s\n", nvh_errormsg());
    return 0;
}

int nvc_store_flush(nvc_store *s, int64_t now, int64_t when)
{
    /* As memcached: items stored at or before `when - 1` die at that time;
     * an immediate flush also kills every CAS value handed out so far, so
     * items stored later in the same second survive. */
    struct nvc_root *r = s->root;
    meta_lock(s);
    __atomic_store_n(&r->oldest_live, when - 1, __ATOMIC_RELAXED);
    if (when - 1 <= now) {
        uint64_t fc = s->next_cas - 1;
        if (fc > r->cas_reserved)
            fc = r->cas_reserved;
        __atomic_store_n(&r->flush_cas, fc, __ATOMIC_RELAXED);
    }
    nvh_persist(s->pool, &r->flush_cas, 16);   /* flush_cas and oldest_live */
    meta_unlock(s);
    return 0;
}

void nvc_store_stats_get(nvc_store *s, nvc_store_stats *st)
{
    memset(st, 0, sizeof *st);
    meta_lock(s);
    st->scan_done = __atomic_load_n(&s->scan_done, __ATOMIC_ACQUIRE);
    st->curr_items = items_used(s);
    st->bytes = mem_used(s);
    st->limit_bytes = s->cfg.limit_bytes;
    st->evictions = s->evictions;
    st->reclaimed = s->reclaimed;
    st->total_items = s->total_items;
    st->generation = s->root->generation;
    st->next_cas = s->next_cas;
    st->pool_size = nvh_pool_size(s->pool);
    meta_unlock(s);
    st->epoch = nvh_pool_epoch(s->pool);
    nvh_stats ps;
    nvh_stats_get(s->pool, &ps);
    st->lines_flushed = ps.lines_flushed;
    st->fences = ps.fences;
    st->recovery_us = s->recovery_us;
    st->scan_us = __atomic_load_n(&s->scan_us, __ATOMIC_RELAXED);
    st->walk_us = __atomic_load_n(&s->walk_us, __ATOMIC_RELAXED);
    st->path = s->path;
    st->domain = nvh_domain_name(nvh_pool_domain(s->pool));
}

void nvc_store_stats_reset(nvc_store *s)
{
    meta_lock(s);
    s->evictions = s->reclaimed = s->total_items = 0;
    meta_unlock(s);
    nvh_stats_reset(s->pool);
}
