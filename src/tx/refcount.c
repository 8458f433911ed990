/* refcount.c — reference-counted objects ([Coburn09] §4.2): failure-atomic reference
 * assignment, zeroed new objects, and restartable recursive destruction.
 *
 * An rc object is a heap object whose first 64 bytes are a header (count,
 * type, an epoch lock); the caller sees the payload after it. Every change of
 * counts and references is one small transaction of this library: the
 * transaction's log records are the "operation descriptors" of [Coburn09]
 * (Algorithm 1), with the same guarantee — after a crash the assignment and
 * the count change happened together or not at all.
 *
 * Destruction ([Coburn09] Fig. 3): when a count reaches zero, the same
 * transaction records the object in a persistent descriptor slot (the named
 * object "nvheap.rc"). The destructor then walks the object's references
 * (the type's refs callback lists them): a child still referenced elsewhere
 * is decremented and the reference cleared in one transaction; a child
 * whose count is 1 is destroyed recursively first, then freed and the
 * reference cleared in one transaction. Finally the object is freed and the
 * descriptor cleared in one transaction. A crash at any point leaves every
 * non-NULL reference pointing at a live (maybe partly destroyed) object, so
 * restarting the destruction from the descriptor (nvh_rc_recover, after the
 * types are registered again) finishes the job; NULL references are the
 * parts already done. */
#include "tx.h"

#include <stdlib.h>
#include <string.h>

#define RC_MAGIC 0x52434f42u          /* "BOCR" */
#define RC_DESC_NAME "nvheap.rc"
#define RC_DESC_SLOTS 64u
#define RC_TYPES 256u
#define RC_MAX_REFS 256u

struct refcount_hdr {
    uint64_t count;                   /*  0                                   */
    uint32_t type;                    /*  8                                   */
    uint32_t magic;                   /* 12 RC_MAGIC                          */
    nvh_plock lock;                   /* 16 epoch lock: count changes         */
    uint64_t size;                    /* 24 payload bytes                     */
    uint8_t reserved[32];             /* 32                                   */
};
_Static_assert(sizeof(struct refcount_hdr) == 64, "rc header is one line");

struct refcount_desc {
    uint64_t magic;                   /* RC_MAGIC                             */
    uint64_t pad[7];
    uint64_t slot[RC_DESC_SLOTS];     /* top objects being destroyed (payload offsets) */
};

/* ==========================================================================
 * Per-process type registry (by pool) and descriptor slots
 * ========================================================================== */
typedef struct refcount_pool {
    nvh_pool *pool;
    nvh_rc_refs_fn refs[RC_TYPES];
    struct refcount_desc *desc;
    pthread_mutex_t lock;             /* descriptor creation (never the global
                                         lock: fences inside may fork crash
                                         children that take it)               */
    _Atomic uint64_t busy;            /* descriptor slots in use (DRAM)       */
} refcount_pool;

static pthread_mutex_t refcount_lock = PTHREAD_MUTEX_INITIALIZER;
static refcount_pool *refcount_pools[64];

static refcount_pool *refcount_get(nvh_pool *pool, bool create)
{
    pthread_mutex_lock(&refcount_lock);
    refcount_pool *r = NULL, **freeslot = NULL;
    for (unsigned i = 0; i < 64; i++) {
        if (refcount_pools[i] && refcount_pools[i]->pool == pool) { r = refcount_pools[i]; break; }
        if (!refcount_pools[i] && !freeslot) freeslot = &refcount_pools[i];
    }
    if (!r && create && freeslot) {
        r = calloc(1, sizeof *r);
        if (r) { r->pool = pool; pthread_mutex_init(&r->lock, NULL); *freeslot = r; }
    }
    pthread_mutex_unlock(&refcount_lock);
    if (!r) nvh_fail(create ? NVH_E_NOMEM : NVH_E_INVAL, "no reference-counting state for this pool");
    return r;
}

/* Called when a pool closes (tx.c): forget its registrations. */
void nvh_refcount_forget_(nvh_pool *pool)
{
    pthread_mutex_lock(&refcount_lock);
    for (unsigned i = 0; i < 64; i++)
        if (refcount_pools[i] && refcount_pools[i]->pool == pool) { free(refcount_pools[i]); refcount_pools[i] = NULL; }
    pthread_mutex_unlock(&refcount_lock);
}

/* The descriptor object, or NULL if there is none yet: a walk, not
 * nvh_get_named, whose expected NVH_E_NOTFOUND would stay behind as the
 * thread's last error after a successful call. */
typedef struct desc_find { void *ptr; size_t size; } desc_find;
static int desc_find_fn(const char *name, void *ptr, size_t size, void *arg)
{
    if (strcmp(name, RC_DESC_NAME) != 0) return 0;
    ((desc_find *)arg)->ptr = ptr;
    ((desc_find *)arg)->size = size;
    return 1;
}
static void *desc_lookup(nvh_pool *pool, size_t *size)
{
    desc_find f = {NULL, 0};
    nvh_named_foreach(pool, desc_find_fn, &f);
    *size = f.size;
    return f.ptr;
}

static struct refcount_desc *desc_get(nvh_pool *pool, refcount_pool *r)
{
    if (r->desc) return r->desc;
    size_t size = 0;
    struct refcount_desc *d = NULL;
    pthread_mutex_lock(&r->lock);
    if (!r->desc) {
        d = desc_lookup(pool, &size);
        if (!d) {
            d = nvh_reserve_named(pool, RC_DESC_NAME, sizeof *d);
            if (d) {
                bool win = nvh_protect_open_(pool, d, sizeof *d) == NVH_OK;
                memset(d, 0, sizeof *d);
                d->magic = RC_MAGIC;
                nvh_persist(pool, d, sizeof *d);
                if (win) (void)nvh_protect_close_(pool, d, sizeof *d);
                if (nvh_activate_named(pool, RC_DESC_NAME) != NVH_OK) { nvh_cancel(pool, d); d = NULL; }
            }
        } else if (size < sizeof *d || d->magic != RC_MAGIC) {
            nvh_fail(NVH_E_CORRUPT, "the reference-counting descriptor object is corrupt");
            d = NULL;
        }
        r->desc = d;
    }
    pthread_mutex_unlock(&r->lock);
    return r->desc;
}

static int slot_claim(refcount_pool *r)
{
    for (;;) {
        uint64_t b = atomic_load(&r->busy);
        if (b == ~0ull) return -1;
        unsigned i = (unsigned)__builtin_ctzll(~b);
        if (atomic_compare_exchange_weak(&r->busy, &b, b | (1ull << i))) return (int)i;
    }
}
static void slot_release(refcount_pool *r, int i) { atomic_fetch_and(&r->busy, ~(1ull << i)); }

static inline struct refcount_hdr *hdr_of(void *obj) { return (struct refcount_hdr *)((char *)obj - 64); }

static int check_obj(nvh_pool *pool, void *obj, const char *what)
{
    if (!obj) return nvh_fail(NVH_E_INVAL, "%s: object is NULL", what);
    if (!nvh_contains(pool, (char *)obj - 64, 64) || (uintptr_t)obj % 64 ||
        hdr_of(obj)->magic != RC_MAGIC)
        return nvh_fail(NVH_E_BADPTR, "%s: %p is not a reference-counted object", what, obj);
    return NVH_OK;
}

/* ==========================================================================
 * API
 * ========================================================================== */
int nvh_rc_register(nvh_pool *pool, uint32_t type, nvh_rc_refs_fn refs)
{
    if (!pool || type >= RC_TYPES) return nvh_fail(NVH_E_INVAL, "nvh_rc_register: bad pool or type");
    refcount_pool *r = refcount_get(pool, true);
    if (!r) return nvh_errcode();
    r->refs[type] = refs;
    return NVH_OK;
}

uint64_t nvh_rc_count(nvh_pool *pool, const void *obj)
{
    if (check_obj(pool, (void *)obj, "nvh_rc_count") != NVH_OK) return 0;
    return __atomic_load_n(&hdr_of((void *)obj)->count, __ATOMIC_ACQUIRE);
}

static int destroy(nvh_pool *pool, refcount_pool *r, void *obj, unsigned depth);

/* In a running transaction: drop one reference to obj; if it was the last,
 * record obj in descriptor slot *slot_io (claimed here). */
static int drop_in_tx(nvh_pool *pool, refcount_pool *r, void *obj, int *slot_io)
{
    struct refcount_hdr *h = hdr_of(obj);
    int rc = nvh_tx_add_word(pool, &h->count);
    if (rc != NVH_OK) return rc;
    if (h->count == 0) return nvh_fail(NVH_E_CORRUPT, "reference count underflow at %p", obj);
    if (--h->count == 0) {
        struct refcount_desc *d = desc_get(pool, r);
        int s = d ? slot_claim(r) : -1;
        if (s < 0) return nvh_fail(NVH_E_BUSY, "too many destructions in progress");
        *slot_io = s;
        if ((rc = nvh_tx_add_word(pool, &d->slot[s])) != NVH_OK) return rc;
        d->slot[s] = nvh_off(pool, obj);
    }
    return NVH_OK;
}

/* Finish a destruction recorded in slot s. */
static int finish(nvh_pool *pool, refcount_pool *r, int s)
{
    struct refcount_desc *d = r->desc;
    void *obj = nvh_ptr(pool, d->slot[s]);
    int rc = destroy(pool, r, obj, 0);
    if (rc == NVH_OK) {
        nvh_tx_begin(pool);
        nvh_tx_add_word(pool, &d->slot[s]);
        d->slot[s] = 0;
        nvh_tx_free(pool, (char *)obj - 64);
        rc = nvh_tx_commit(pool);
    }
    slot_release(r, s);
    return rc;
}

void *nvh_rc_new(nvh_pool *pool, size_t size, uint32_t type, nvh_off_t *dst)
{
    refcount_pool *r = refcount_get(pool, true);
    if (!r) return NULL;
    if (type >= RC_TYPES) { nvh_fail(NVH_E_INVAL, "nvh_rc_new: type %u out of range", type); return NULL; }
    if (!dst) { nvh_fail(NVH_E_INVAL, "nvh_rc_new: dst is NULL (the new object must be referenced)"); return NULL; }
    int rc = nvh_tx_begin(pool);
    if (rc != NVH_OK) return NULL;
    /* zeroed (nvh_tx_alloc): a destructor restarted after a crash never sees
     * garbage references */
    char *p = nvh_tx_alloc(pool, 64 + size);
    void *obj = p ? p + 64 : NULL;
    int slot = -1;
    void *old = NULL;
    if (obj) {
        struct refcount_hdr *h = (struct refcount_hdr *)p;
        h->count = 1;
        h->type = type;
        h->magic = RC_MAGIC;
        h->size = size;
        rc = nvh_tx_add_word(pool, dst);
        if (rc == NVH_OK && *dst) {
            old = nvh_ptr(pool, *dst);
            rc = check_obj(pool, old, "nvh_rc_new") == NVH_OK ? drop_in_tx(pool, r, old, &slot)
                                                               : nvh_errcode();
        }
        if (rc == NVH_OK) *dst = nvh_off(pool, obj);
        else nvh_tx_abort(pool);
    }
    if (nvh_tx_commit(pool) != NVH_OK) {
        if (slot >= 0) slot_release(r, slot);
        return NULL;
    }
    if (slot >= 0) finish(pool, r, slot);
    return obj;
}

int nvh_rc_assign(nvh_pool *pool, nvh_off_t *dst, void *obj)
{
    refcount_pool *r = refcount_get(pool, true);
    if (!r) return nvh_errcode();
    if (!dst) return nvh_fail(NVH_E_INVAL, "nvh_rc_assign: dst is NULL");
    if (obj && check_obj(pool, obj, "nvh_rc_assign") != NVH_OK) return nvh_errcode();
    void *old = *dst ? nvh_ptr(pool, *dst) : NULL;
    if (old == obj) return NVH_OK;
    if (old && check_obj(pool, old, "nvh_rc_assign") != NVH_OK) return nvh_errcode();
    /* the objects' epoch locks guard their counts (address order: no deadlock) */
    nvh_plock *l1 = obj ? &hdr_of(obj)->lock : NULL, *l2 = old ? &hdr_of(old)->lock : NULL;
    if (l1 && l2 && l2 < l1) { nvh_plock *t = l1; l1 = l2; l2 = t; }
    if (l1) nvh_plock_acquire(pool, l1);
    if (l2) nvh_plock_acquire(pool, l2);
    int slot = -1;
    int rc = nvh_tx_begin(pool);
    if (rc == NVH_OK && obj) {
        rc = nvh_tx_add_word(pool, &hdr_of(obj)->count);
        if (rc == NVH_OK) hdr_of(obj)->count++;
    }
    if (rc == NVH_OK && old) rc = drop_in_tx(pool, r, old, &slot);
    if (rc == NVH_OK) rc = nvh_tx_add_word(pool, dst);
    if (rc == NVH_OK) *dst = nvh_off(pool, obj);
    if (rc != NVH_OK) nvh_tx_abort(pool);
    int crc = nvh_tx_commit(pool);
    if (rc == NVH_OK) rc = crc;
    if (l2) nvh_plock_release(pool, l2);
    if (l1) nvh_plock_release(pool, l1);
    if (rc != NVH_OK) {
        if (slot >= 0) slot_release(r, slot);
        return rc;
    }
    if (slot >= 0) return finish(pool, r, slot);
    return NVH_OK;
}

/* Destroy obj's references (not obj itself). */
static int destroy(nvh_pool *pool, refcount_pool *r, void *obj, unsigned depth)
{
    struct refcount_hdr *h = hdr_of(obj);
    nvh_rc_refs_fn refs = h->type < RC_TYPES ? r->refs[h->type] : NULL;
    if (!refs) return NVH_OK;                          /* a leaf type */
    if (depth > 100000) return nvh_fail(NVH_E_CORRUPT, "reference cycle or chain too deep");
    nvh_off_t *slots[RC_MAX_REFS];
    unsigned n = refs(pool, obj, slots, RC_MAX_REFS);
    if (n > RC_MAX_REFS) n = RC_MAX_REFS;
    for (unsigned i = 0; i < n; i++) {
        if (!slots[i] || !*slots[i]) continue;          /* NULL: already done */
        void *child = nvh_ptr(pool, *slots[i]);
        if (check_obj(pool, child, "nvh_rc destroy") != NVH_OK) return nvh_errcode();
        nvh_plock_acquire(pool, &hdr_of(child)->lock);
        bool last = hdr_of(child)->count <= 1;
        if (!last) {
            int rc = nvh_tx_begin(pool);
            if (rc == NVH_OK) rc = nvh_tx_add_word(pool, &hdr_of(child)->count);
            if (rc == NVH_OK) hdr_of(child)->count--;
            if (rc == NVH_OK) rc = nvh_tx_add_word(pool, slots[i]);
            if (rc == NVH_OK) *slots[i] = 0;
            if (rc != NVH_OK) nvh_tx_abort(pool);
            int c = nvh_tx_commit(pool);
            nvh_plock_release(pool, &hdr_of(child)->lock);
            if (rc != NVH_OK || c != NVH_OK) return rc != NVH_OK ? rc : c;
            continue;
        }
        nvh_plock_release(pool, &hdr_of(child)->lock);
        int rc = destroy(pool, r, child, depth + 1);
        if (rc != NVH_OK) return rc;
        /* the child's references are all NULL now: free it and clear ours
         * in one step */
        rc = nvh_tx_begin(pool);
        if (rc == NVH_OK) rc = nvh_tx_add_word(pool, slots[i]);
        if (rc == NVH_OK) *slots[i] = 0;
        if (rc == NVH_OK) rc = nvh_tx_free(pool, (char *)child - 64);
        if (rc != NVH_OK) nvh_tx_abort(pool);
        int c = nvh_tx_commit(pool);
        if (rc != NVH_OK || c != NVH_OK) return rc != NVH_OK ? rc : c;
    }
    return NVH_OK;
}

int nvh_rc_recover(nvh_pool *pool)
{
    refcount_pool *r = refcount_get(pool, true);
    if (!r) return nvh_errcode();
    size_t size = 0;
    struct refcount_desc *d = desc_lookup(pool, &size);
    if (!d) return NVH_OK;                /* nothing was ever destroyed */
    if (size < sizeof *d || d->magic != RC_MAGIC)
        return nvh_fail(NVH_E_CORRUPT, "the reference-counting descriptor object is corrupt");
    r->desc = d;
    int rc = NVH_OK;
    for (unsigned s = 0; s < RC_DESC_SLOTS && rc == NVH_OK; s++) {
        if (!d->slot[s]) continue;
        uint64_t b = atomic_fetch_or(&r->busy, 1ull << s);
        if (b & (1ull << s)) continue;                /* someone is on it */
        rc = finish(pool, r, (int)s);
    }
    return rc;
}
