/* hashmap.h — internal header of the persistent hash map (layer `ds`):
 * on-media structs (fixed-width fields, explicit padding, static_asserted
 * layout), the DRAM handle, the hash and split-order key helpers shared by
 * hashmap.c (create/open/recovery/resize), hashmap_ops.c (put/get/delete/
 * foreach) and hashmap_check.c (invariants, statistics).
 *
 * Design (docs/HASHMAP.md): a persistent *split-ordered list* (Shalev &
 * Shavit). Every entry lives in ONE sorted singly linked list, ordered by the
 * bit-reversed hash; a bucket is a sentinel ("dummy") node inside that list,
 * kept in a segmented bucket directory. Doubling the table only adds a
 * segment of (uninitialised) dummies; a bucket is linked into the list the
 * first time it is used, after its parent. No entry ever moves, so resizing
 * needs no migration and no log, and every put/delete is ONE allocator
 * activate/free with one link word. */
#ifndef NVH_DS_HASHMAP_H
#define NVH_DS_HASHMAP_H

#include "../common/internal.h"
#include "../pool/pool.h"          /* nvh_pool_hook, embedded in the handle */
#include "../protect/protect.h"

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ==========================================================================
 * On-media format (docs/FORMAT.md, "Hash map")
 * ========================================================================== */
#define NVH_HM_MAGIC 0x50414d4850564e31ull      /* "1NVPHMAP" little endian */
#define NVH_HM_NODE_MAGIC 0x45444f4eu            /* "NODE"                   */
#define NVH_HM_VERSION 1u
#define NVH_HM_SEGS 48u                          /* directory entries        */
#define NVH_HM_MAX_BUCKETS_LOG2 40u
#define NVH_HM_DEFAULT_BASE_LOG2 8u              /* 256 buckets at create    */
#define NVH_HM_DEFAULT_LOAD_PCT 200u             /* double above 2 per bucket */
#define HM_LINK_BATCH 32u                        /* buckets linked eagerly per fence */

/* The map's root object (one allocation; 448 bytes). Line 0 holds the words
 * that change (count hint, pending); lines 1..6 the segment directory. */
struct nvh_hm_root {
    uint64_t magic;          /* 0   NVH_HM_MAGIC, written last at create     */
    uint32_t version;        /* 8                                            */
    uint32_t base_log2;      /* 12  log2(buckets of segment 0)               */
    uint64_t seed;           /* 16  hash seed and dummy check seed            */
    uint64_t count_hint;     /* 24  entries, flushed every 64 changes: a hint */
    uint64_t pending;        /* 32  pending slot 0: entry being replaced by an
                                    update (0: none); cleared by the free that
                                    retires it                                 */
    uint32_t max_load_pct;   /* 40  resize when count > buckets * pct / 100  */
    uint32_t flags;          /* 44  reserved, 0                              */
    uint64_t pending2[2];    /* 48  pending slots 1 and 2, as `pending`: one
                                    per update in flight (HM_SLOTS); read as
                                    reserved zeros by older libraries          */
    uint64_t seg[NVH_HM_SEGS]; /* 64 directory: offsets of bucket segments; a
                                    prefix is non-zero. seg[0] holds 2^base
                                    buckets, seg[k>=1] holds 2^(base+k-1)      */
};
static_assert(sizeof(struct nvh_hm_root) == 448, "hm root size");
static_assert(offsetof(struct nvh_hm_root, count_hint) == 24, "hm root count");
static_assert(offsetof(struct nvh_hm_root, pending) == 32, "hm root pending");
static_assert(offsetof(struct nvh_hm_root, seg) == 64, "hm root directory");
static_assert(offsetof(struct nvh_hm_root, pending2) == 48, "hm root pending slots");

/* Pending slots: updates in flight at once. An update needs one from its
 * content fence to the free of the old entry; more writers than slots wait
 * for one (a few instructions: a slot is held for two fences). */
#define HM_SLOTS 3u
static inline uint64_t *hm_slot_word(struct nvh_hm_root *r, unsigned k)
{
    return k == 0 ? &r->pending : &r->pending2[k - 1];
}

/* A list node header. Dummies (buckets) and entries share the first 16
 * bytes so a traversal reads one shape: so_key's low bit tells them apart
 * (entries 1, dummies 0). */
struct nvh_hm_link {
    uint64_t next;           /* 0   offset of the next node in the list       */
    uint64_t so_key;         /* 8   split-order key                           */
};

/* A bucket sentinel, 32 bytes, two per cache line, inside a segment. It is
 * initialised iff `check` equals hm_dummy_check(): segments are never
 * zeroed (resizing is O(1)), so garbage must not look initialised. */
struct nvh_hm_dummy {
    uint64_t next;           /* 0                                             */
    uint64_t so_key;         /* 8   bitrev64(bucket index): low bit 0         */
    uint64_t check;          /* 16  mix(seed, index, segment offset) once linked */
    uint64_t reserved;       /* 24                                            */
};
static_assert(sizeof(struct nvh_hm_dummy) == 32, "hm dummy size");

/* An entry: one allocation = header + key bytes + value bytes. Immutable
 * once activated except `next` (changed only by the allocator's link
 * updates: an insert after it, a delete of its successor, a dummy linked
 * after it). */
struct nvh_hm_node {
    uint64_t next;           /* 0                                             */
    uint64_t so_key;         /* 8   bitrev64(hash >> 1) | 1                   */
    uint32_t klen;           /* 16  1..NVH_HMAP_KEY_MAX                        */
    uint32_t vlen;           /* 20                                            */
    uint32_t magic;          /* 24  NVH_HM_NODE_MAGIC                         */
    uint32_t reserved;       /* 28  0                                         */
    uint8_t data[];          /* 32  key bytes, then value bytes               */
};
static_assert(sizeof(struct nvh_hm_node) == 32, "hm node header size");
static_assert(offsetof(struct nvh_hm_node, data) == 32, "hm node data offset");
static_assert(offsetof(struct nvh_hm_node, next) == offsetof(struct nvh_hm_link, next), "shape");
static_assert(offsetof(struct nvh_hm_node, so_key) == offsetof(struct nvh_hm_link, so_key), "shape");
static_assert(offsetof(struct nvh_hm_dummy, so_key) == offsetof(struct nvh_hm_link, so_key), "shape");

/* ==========================================================================
 * DRAM handle (nothing here is needed by recovery: all derived at open)
 * ==========================================================================
 * Writers are striped: a key's stripe is h63 mod nstripes (nstripes a
 * power of two <= the buckets of segment 0). Every link word a write
 * changes belongs to a node of the key's stripe: bucket b's run of the
 * list (from its dummy to the next linked one) holds only nodes whose
 * bucket is congruent to b mod nstripes once buckets 0..nstripes-1 are
 * linked (they are, from create or open: hm_link_stripe_roots), because
 * a bucket and its parent agree in their low bits and split order sorts
 * by the low bits first. So writers of different stripes never store the
 * same word, and each stripe keeps its own deferred marks and eager-link
 * batch. docs/HASHMAP.md §7. */
#define HM_STRIPES_MAX 32u     /* hm_lock_all holds them all: under TSan's 64 */

struct hm_stripe {
    pthread_mutex_t lock;    /* writers of this stripe, one at a time        */
    /* The key and value bytes this stripe's writers added (negative:
     * removed) since open. Kept per stripe, next to the lock a writer holds
     * anyway, so that a write does no read-modify-write on a line writers
     * of other stripes share; written only under the lock (relaxed atomic
     * stores; nvh_hm_bytes_delta_ sums them with relaxed loads). */
    int64_t dkbytes, dvbytes;
    bool link_unfenced;      /* a dummy's predecessor link is flushed but not
                                yet fenced: fence before the next free        */
    unsigned nmarks;         /* dummies linked whose mark waits for that fence */
    struct { struct nvh_hm_dummy *d; uint64_t check; } marks[64];
    uint64_t link_cursor;    /* next bucket the eager linker looks at        */
    uint64_t cursor_nb;      /* the bucket count link_cursor was set for     */
    unsigned ahead_n;        /* dummies of the eager batch being linked      */
    struct { struct nvh_hm_dummy *d; uint64_t *pred; uint64_t check; } ahead[HM_LINK_BATCH];
    uint64_t buckets_inited; /* dummies linked by this stripe's writers      */
} __attribute__((aligned(64)));

struct nvh_hmap {
    nvh_pool *pool;
    nvh_pool_hook hook;      /* registered with the pool while open (key: root) */
    struct nvh_hm_root *root;
    nvh_off_t root_off;
    pthread_mutex_t lock;    /* resizing; with every stripe lock: check,
                                close, destroy, salvage. Readers take no lock
                                (docs/HASHMAP.md §7: epochs)                   */
    unsigned nstripes;       /* power of two, <= 2^base_log2, <= HM_STRIPES_MAX */
    unsigned slots_busy;     /* atomic: bit k = pending slot k is held        */
    unsigned base_log2;
    unsigned nsegs;          /* non-zero prefix of root->seg                 */
    uint64_t nbuckets;       /* 2^(base_log2 + nsegs - 1); hm_ld/hm_st: a
                                reader loads it, then the segment pointers
                                stored before it                              */
    uint64_t count;          /* exact while open (from the hint at open);
                                atomic                                        */
    uint64_t count_dirty;    /* atomic: changes since the hint was flushed   */
    uint64_t seed;
    struct nvh_hm_dummy *seg_ptr[NVH_HM_SEGS];
    uint64_t seg_off[NVH_HM_SEGS]; /* root->seg as loaded (readers never read
                                the root's directory: the allocator writes it) */
    uint64_t resizes;        /* segments added by this handle                */
    uint64_t recovered_pending; /* updates open retired or cleared            */
    struct hm_stripe *stripes; /* nstripes of them                           */
};

static inline struct hm_stripe *hm_stripe_of(const struct nvh_hmap *m, uint64_t h63)
{
    return &m->stripes[h63 & (m->nstripes - 1)];
}

/* Every stripe lock (in index order), then the map lock: nothing writes. */
static inline void hm_lock_all(struct nvh_hmap *m)
{
    for (unsigned k = 0; k < m->nstripes; k++) pthread_mutex_lock(&m->stripes[k].lock);
    pthread_mutex_lock(&m->lock);
}

static inline void hm_unlock_all(struct nvh_hmap *m)
{
    pthread_mutex_unlock(&m->lock);
    for (unsigned k = m->nstripes; k-- > 0;) pthread_mutex_unlock(&m->stripes[k].lock);
}

/* ==========================================================================
 * Words that lock-free readers load while a writer may store them (list
 * links, dummy marks, the bucket count, the count): acquire loads and
 * release stores, so that a reader that loads a link sees what was
 * written before it was published. The allocator stores its link words
 * with release too (alloc/redo.c).
 * ========================================================================== */
static inline uint64_t hm_ld(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void hm_st(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* ==========================================================================
 * Hashing and split-order keys
 * ========================================================================== */
static inline uint64_t hm_mix(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

static inline uint64_t hm_load64(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* 64-bit hash of a byte string: two multiply-xorshift lanes over 16-byte
 * blocks (so a 64 B key costs 4 dependent rounds), then a finaliser. */
static inline uint64_t hm_hash(uint64_t seed, const void *key, size_t len)
{
    const uint8_t *p = key;
    uint64_t a = seed ^ 0x9e3779b97f4a7c15ull, b = (seed + len) * 0xbf58476d1ce4e5b9ull;
    size_t n = len;
    while (n >= 16) {
        a = (a ^ hm_load64(p)) * 0x94d049bb133111ebull;
        b = (b ^ hm_load64(p + 8)) * 0xbf58476d1ce4e5b9ull;
        a ^= a >> 29;
        b ^= b >> 31;
        p += 16;
        n -= 16;
    }
    uint64_t t0 = 0, t1 = 0;
    if (n >= 8) {
        t0 = hm_load64(p);
        p += 8;
        n -= 8;
    }
    if (n) memcpy(&t1, p, n);      /* n == 0: p may be NULL (empty key) */
    a = (a ^ t0) * 0x94d049bb133111ebull;
    b = (b ^ t1 ^ ((uint64_t)n << 59)) * 0xbf58476d1ce4e5b9ull;
    return hm_mix(a ^ (b >> 7) ^ (b << 57) ^ (uint64_t)len);
}

static inline uint64_t hm_bitrev64(uint64_t x)
{
    x = ((x >> 1) & 0x5555555555555555ull) | ((x & 0x5555555555555555ull) << 1);
    x = ((x >> 2) & 0x3333333333333333ull) | ((x & 0x3333333333333333ull) << 2);
    x = ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
    return __builtin_bswap64(x);
}

/* The hash keeps 63 bits (bit 63 of the reversed value would collide with
 * the entry/dummy tag bit). */
static inline uint64_t hm_h63(uint64_t hash) { return hash >> 1; }
static inline uint64_t hm_entry_so(uint64_t h63) { return hm_bitrev64(h63) | 1u; }
static inline uint64_t hm_dummy_so(uint64_t bucket) { return hm_bitrev64(bucket); }

/* Value that marks dummy `bucket` of the segment at seg_off as linked. */
static inline uint64_t hm_dummy_check(uint64_t seed, uint64_t bucket, uint64_t seg_off)
{
    return hm_mix(seed ^ (bucket * 0x9e3779b97f4a7c15ull + seg_off)) | 1u;
}

/* Parent bucket: the index with its highest set bit cleared. */
static inline uint64_t hm_parent(uint64_t bucket)
{
    return bucket & ~(UINT64_C(1) << (63 - __builtin_clzll(bucket)));
}

/* ==========================================================================
 * Segment directory
 * ========================================================================== */
/* Segment and index of a bucket. */
static inline void hm_locate(unsigned base_log2, uint64_t bucket, unsigned *seg, uint64_t *idx)
{
    if (bucket < (UINT64_C(1) << base_log2)) {
        *seg = 0;
        *idx = bucket;
        return;
    }
    unsigned hb = 63u - (unsigned)__builtin_clzll(bucket);
    *seg = hb - base_log2 + 1;
    *idx = bucket - (UINT64_C(1) << hb);
}

/* Buckets held by segment k. */
static inline uint64_t hm_seg_buckets(unsigned base_log2, unsigned k)
{
    return UINT64_C(1) << (k == 0 ? base_log2 : base_log2 + k - 1);
}

static inline struct nvh_hm_dummy *hm_dummy(const struct nvh_hmap *m, uint64_t bucket)
{
    unsigned s;
    uint64_t i;
    hm_locate(m->base_log2, bucket, &s, &i);
    NVH_ASSERT(m->seg_ptr[s] != NULL);
    return &m->seg_ptr[s][i];
}

static inline bool hm_dummy_ready(const struct nvh_hmap *m, uint64_t bucket,
                                  const struct nvh_hm_dummy *d)
{
    unsigned s;
    uint64_t i;
    hm_locate(m->base_log2, bucket, &s, &i);
    return hm_ld(&d->check) == hm_dummy_check(m->seed, bucket, m->seg_off[s]);
}

static inline struct nvh_hm_link *hm_at(const struct nvh_hmap *m, uint64_t off)
{
    return (struct nvh_hm_link *)nvh_ptr(m->pool, off);
}

/* ==========================================================================
 * Validation of what is read from the pool (docs/HASHMAP.md, "Corruption")
 * ==========================================================================
 * A list link comes from the media, so a damaged pool can hold any value in
 * it. A walk follows a link only once hm_node_at says it can be a node:
 * inside the pool and aligned (dummies 32 B, entries NVH_ALLOC_ALIGN), and
 * an entry with its magic, a key length within NVH_HMAP_KEY_MAX and its key
 * and value inside the pool. A walk also requires split-order keys that
 * never decrease, with at most HM_MAX_RUN nodes of one key in a row (equal
 * keys need equal 63-bit hashes): a cycle in a damaged list breaks one of
 * the two, so every walk ends. */
#define HM_MAX_RUN 256u

static inline struct nvh_hm_link *hm_node_at(const struct nvh_hmap *m, uint64_t off)
{
    struct nvh_hm_link *n = (struct nvh_hm_link *)nvh_ptr(m->pool, off);
    if (!n || off % sizeof(struct nvh_hm_dummy) ||
        !nvh_contains(m->pool, n, sizeof(struct nvh_hm_dummy)))
        return NULL;
    if (!(n->so_key & 1)) return n;                 /* a dummy */
    const struct nvh_hm_node *e = (const struct nvh_hm_node *)n;
    if (off % NVH_ALLOC_ALIGN || !nvh_contains(m->pool, e, sizeof *e) ||
        e->magic != NVH_HM_NODE_MAGIC || e->klen > NVH_HMAP_KEY_MAX ||
        !nvh_contains(m->pool, e, sizeof *e + (size_t)e->klen + e->vlen))
        return NULL;
    return n;
}

/* Record NVH_E_CORRUPT naming the map (its root offset), what and where. */
int nvh_hm_corrupt_(const struct nvh_hmap *m, uint64_t off, const char *what);

/* ==========================================================================
 * Allocator calls inside an implicit protection window (hashmap.c says why)
 * ==========================================================================
 * Only a pool whose protection was configured (pool->protect set) can
 * fault: protection is never switched on while calls run on the pool
 * (docs/PROTECT.md, "Threads": set_mode must not race with other calls), so
 * on any other pool the window is skipped — its begin and end are two
 * out-of-line calls and a thread-local list update per allocator call, on
 * every put. A pool whose protection was turned off again keeps the window
 * (protect stays set until the pool closes): correct, only slower. */
static inline bool hm_window_(nvh_pool *pool)
{
    return __builtin_expect(atomic_load_explicit(&pool->protect, memory_order_relaxed) != NULL, 0);
}

static inline void *hm_reserve(nvh_pool *pool, size_t size)
{
    if (!hm_window_(pool)) return nvh_reserve(pool, size);
    nvh_protect_internal_begin(pool);
    void *p = nvh_reserve(pool, size);
    nvh_protect_internal_end(pool);
    return p;
}

static inline void hm_cancel(nvh_pool *pool, void *p)
{
    if (!hm_window_(pool)) {
        nvh_cancel(pool, p);
        return;
    }
    nvh_protect_internal_begin(pool);
    nvh_cancel(pool, p);
    nvh_protect_internal_end(pool);
}

/* nvh_activate with one link word. */
static inline int hm_activate(nvh_pool *pool, void *p, nvh_off_t *link)
{
    nvh_off_t *const links[1] = {link};
    if (!hm_window_(pool)) return nvh_activate(pool, p, links, 1);
    nvh_protect_open_(pool, link, 8);
    nvh_protect_internal_begin(pool);
    int rc = nvh_activate(pool, p, links, 1);
    nvh_protect_internal_end(pool);
    nvh_protect_close_(pool, link, 8);
    return rc;
}

/* ==========================================================================
 * Shared internal functions
 * ========================================================================== */
/* Dummy of the bucket of h63, linked into the list first if needed. NULL on
 * error (allocation-free; only fails on corruption). */
struct nvh_hm_dummy *nvh_hm_bucket_(struct nvh_hmap *m, struct hm_stripe *st, uint64_t h63);

/* Search the list from `start` for (so, key). Returns the node or NULL;
 * *prev_out gets the word that points at the node (or, if not found, at the
 * first node after the position where the key belongs). A damaged list
 * (hm_node_at, key order) returns NULL with *prev_out NULL and
 * NVH_E_CORRUPT recorded. */
struct nvh_hm_node *nvh_hm_find_(struct nvh_hmap *m, struct nvh_hm_link *start, uint64_t so,
                                 const void *key, uint32_t klen, uint64_t **prev_out);

/* After a fence (or with drain = true: after one it issues if a dummy link
 * is unfenced), store the marks of the dummies linked since (not flushed:
 * a lost mark costs only a longer walk, hashmap.c). Inline: a put calls it
 * twice and mostly finds nothing to do. */
void nvh_hm_settle_slow_(struct nvh_hmap *m, struct hm_stripe *st, bool drain);
static inline void nvh_hm_settle_(struct nvh_hmap *m, struct hm_stripe *st, bool drain)
{
    if (st->nmarks == 0 && !(drain && st->link_unfenced)) {
        st->link_unfenced = false;
        return;
    }
    nvh_hm_settle_slow_(m, st, drain);
}

/* Link one not-yet-linked bucket of the newest segment (after an insert),
 * so that by the next doubling every bucket is linked and reads never start
 * at a parent. Progress lives in DRAM only (restarts at open: idempotent). */
void nvh_hm_link_ahead_(struct nvh_hmap *m, struct hm_stripe *st);
/* The same folded into a put's fences: prepare writes the next batch's
 * dummies (flushed, not fenced; none takes the word `avoid`, the put's own
 * link) before the put's content fence; publish stores their predecessor
 * links after that fence (durable with the put's activation fence).
 * Prepare returns false when blocked by an unlinked parent. Both are inline
 * for the common put, whose stripe has linked its buckets of the newest
 * segment already. */
bool nvh_hm_link_collect_(struct nvh_hmap *m, struct hm_stripe *st, const uint64_t *avoid);
void nvh_hm_link_publish_slow_(struct nvh_hmap *m, struct hm_stripe *st);
static inline bool nvh_hm_link_prepare_(struct nvh_hmap *m, struct hm_stripe *st,
                                        const uint64_t *avoid)
{
    if (st->cursor_nb == hm_ld(&m->nbuckets) && st->link_cursor >= st->cursor_nb) {
        st->ahead_n = 0;
        return true;
    }
    return nvh_hm_link_collect_(m, st, avoid);
}
static inline void nvh_hm_link_publish_(struct nvh_hmap *m, struct hm_stripe *st)
{
    if (st->ahead_n) nvh_hm_link_publish_slow_(m, st);
}

/* Salvage a damaged list in place (nvheap check --repair): each link to
 * something a walk must not follow (hm_node_at, key order, a cycle), to an
 * entry that is not a live allocation of its size or not at its hash's
 * place, or to a dummy not at its bucket's place, is redirected (durably)
 * to the next intact linked dummy; fn hears of each change (the link's
 * offset, its old and new value, why). What lay between is dropped; every
 * other entry stays. Returns the number of links changed, or an error. The
 * count hint is then repaired by nvh_hmap_check. */
typedef void (*nvh_hm_salvage_fn)(uint64_t link_off, uint64_t old_value, uint64_t new_value,
                                  const char *why, void *arg);
int nvh_hm_salvage_(struct nvh_hmap *m, nvh_hm_salvage_fn fn, void *arg);

/* Look key up and call fn(key, klen, value, vlen, arg) on the entry while
 * it cannot be freed (the pointers are valid during fn only); returns fn's
 * value, NVH_E_NOTFOUND (no message recorded: the caller words it) or
 * NVH_E_CORRUPT. For the key-value store's zero-copy get. */
typedef int (*nvh_hm_entry_fn)(const void *key, size_t klen, const void *value, size_t vlen,
                               void *arg);
int nvh_hm_get_fn_(struct nvh_hmap *m, const void *key, size_t klen, nvh_hm_entry_fn fn,
                   void *arg);

/* Add a segment if the load factor calls for it (after an insert; the
 * caller holds a stripe lock; a resize already under way elsewhere makes
 * it return at once). */
int nvh_hm_maybe_grow_(struct nvh_hmap *m);
/* Take a free pending slot (waiting if all are held) / give it back. */
unsigned nvh_hm_slot_get_(struct nvh_hmap *m);
void nvh_hm_slot_put_(struct nvh_hmap *m, unsigned k);
/* Tests only: called by an update after its activation fence, with its
 * stripe lock and pending slot held, so a single-threaded crash workload
 * can run updates of other stripes inside it: several updates in flight,
 * each with its own slot, at deterministic fences. It exists only in the
 * in-tree library the tests link (libnvheap_internal, compiled with
 * NVH_TEST_HOOKS: CMakeLists.txt); the installed libraries, and so
 * nvcached, have neither the pointer nor the branch. */
#ifdef NVH_TEST_HOOKS
extern void (*nvh_hm_test_hook_)(void);
#define HM_TEST_HOOK()                                                    \
    do {                                                                  \
        if (__builtin_expect(nvh_hm_test_hook_ != NULL, 0)) nvh_hm_test_hook_(); \
    } while (0)
#else
#define HM_TEST_HOOK() ((void)0)
#endif
/* A stripe's own counter, changed by its lock holder (hm_stripe). */
static inline void hm_ctr_add(int64_t *c, int64_t d)
{
    __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

/* The key and value bytes the entries gained since the map was opened
 * (negative: lost), changed by writers after each change is durable: a
 * caller that walked the entries once with writers kept out keeps an exact
 * total as walked - delta then + delta now (the key-value store's stats). */
static inline void nvh_hm_bytes_delta_(const struct nvh_hmap *m, int64_t *dk, int64_t *dv)
{
    int64_t k = 0, v = 0;
    for (unsigned s = 0; s < m->nstripes; s++) {
        k += __atomic_load_n(&m->stripes[s].dkbytes, __ATOMIC_RELAXED);
        v += __atomic_load_n(&m->stripes[s].dvbytes, __ATOMIC_RELAXED);
    }
    *dk = k;
    *dv = v;
}
/* By the holder of st's lock. */
static inline void nvh_hm_bytes_changed_(struct hm_stripe *st, int64_t dk, int64_t dv)
{
    if (dk) hm_ctr_add(&st->dkbytes, dk);
    if (dv) hm_ctr_add(&st->dvbytes, dv);
}
/* Store and flush the count hint (no fence) every 64 changes, or now. */
void nvh_hm_count_changed_(struct nvh_hmap *m, int64_t delta, bool force);

#endif /* NVH_DS_HASHMAP_H */
