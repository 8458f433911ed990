/* named.c — named allocations ([Schwalb15] §3.6): a persistent open-addressing
 * hash table of 64 B entries {name[56], offset}, read directly from the pool,
 * so lookups need no DRAM index and work right after open. An entry commits
 * with the 8-byte store of its offset (inside the activation's redo record)
 * after its name was flushed ahead of the record's fence. Deleted entries
 * become tombstones (offset 1). Each committed entry's offset word carries a
 * check of the entry (alloc.h, nvh_named_word): a damaged entry is passed
 * over by lookups (which report NVH_E_CORRUPT for a name whose chain it lies
 * on), never followed. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

/* ==========================================================================
 * Table helpers (caller holds h->named_lock)
 * ========================================================================== */
static uint32_t name_hash(const char *name)
{
    return nvh_crc32c(0x4E414D45u, name, strlen(name));
}

static int check_name(const char *name)
{
    if (!name || !*name) return nvh_fail(NVH_E_INVAL, "name is NULL or empty");
    size_t len = strnlen(name, NVH_NAME_MAX + 1);
    if (len > NVH_NAME_MAX)
        return nvh_fail(NVH_E_TOOLONG, "name is longer than %u bytes", NVH_NAME_MAX);
    return NVH_OK;
}

/* Is the entry in `slot` holding word w (> NVH_NAMED_TOMB) intact: a
 * terminated name, the word's check, an offset inside the heap's chunks? */
static bool entry_ok(nvh_heap *h, uint32_t slot, uint64_t w, uint64_t *obj_out)
{
    const struct nvh_named_entry *e = &h->table[slot];
    uint64_t obj = w & NVH_NAMED_OFF_MASK;
    if (e->name[0] == '\0' || e->name[sizeof e->name - 1] != '\0' ||
        w != nvh_named_word(e->name, slot, obj) || obj < h->chunks_off ||
        obj >= nvh_pool_size(h->pool) || obj % NVH_HDR)
        return false;
    *obj_out = obj;
    return true;
}

static uint64_t slot_off(const nvh_heap *h, uint32_t slot)
{
    return (uint64_t)((const char *)&h->table[slot] - h->base);
}

/* Slot of the committed entry with this name (its object in *obj_out), or
 * -1 if there is none, or -2 (NVH_E_CORRUPT set) if there is none but a
 * damaged entry lies on the name's probe chain: that entry may have been
 * this name's, so "not found" would be a guess. Damaged entries are passed
 * over, so every intact name stays reachable. */
static int64_t table_find(nvh_heap *h, const char *name, uint64_t *obj_out)
{
    uint32_t mask = NVH_NAMED_CAP - 1, i = name_hash(name) & mask;
    int64_t damaged = -1;
    for (uint32_t n = 0; n < NVH_NAMED_CAP; n++, i = (i + 1) & mask) {
        struct nvh_named_entry *e = &h->table[i];
        uint64_t off = atomic_load_explicit(&e->off, memory_order_acquire), obj;
        if (off == 0 && e->name[0] == '\0') break;       /* end of the chain */
        if (off == NVH_NAMED_TOMB) continue;
        if (off == 0 || !entry_ok(h, i, off, &obj)) {    /* a name with off 0: damage */
            if (damaged < 0) damaged = i;
            continue;
        }
        if (strncmp(e->name, name, sizeof e->name) == 0) {
            *obj_out = obj;
            return i;
        }
    }
    if (damaged >= 0) {
        nvh_corrupt_report(h, slot_off(h, (uint32_t)damaged), "damaged object-table entry");
        nvh_fail(NVH_E_CORRUPT, "%s: object table entry %lld at offset %llu is damaged; it may "
                 "have been '%s'", h->pool->path, (long long)damaged,
                 (unsigned long long)slot_off(h, (uint32_t)damaged), name);
        return -2;
    }
    return -1;
}

/* ==========================================================================
 * The DRAM set of named objects' offsets (linear probing, deletion by
 * backward shift). Writers hold named_lock.
 * ========================================================================== */
#define NSET_CAP (2u * NVH_NAMED_CAP)
static inline uint32_t nset_home(uint64_t off)
{
    return (uint32_t)((off * 0x9E3779B97F4A7C15ull) >> 52) & (NSET_CAP - 1);
}

bool nvh_named_set_has_(nvh_heap *h, uint64_t off)
{
    for (uint32_t i = nset_home(off), n = 0; n < NSET_CAP; n++, i = (i + 1) & (NSET_CAP - 1)) {
        uint64_t v = atomic_load_explicit(&h->named_set[i], memory_order_relaxed);
        if (v == off) return true;
        if (v == 0) return false;
    }
    return false;
}

static void nset_add(nvh_heap *h, uint64_t off)
{
    uint32_t i = nset_home(off);
    for (uint32_t n = 0; n < NSET_CAP; n++, i = (i + 1) & (NSET_CAP - 1)) {
        uint64_t v = atomic_load_explicit(&h->named_set[i], memory_order_relaxed);
        if (v == off) return;
        if (v == 0) {
            atomic_store_explicit(&h->named_set[i], off, memory_order_relaxed);
            atomic_fetch_add_explicit(&h->named_n, 1, memory_order_release);
            return;
        }
    }
}

static void nset_del(nvh_heap *h, uint64_t off)
{
    const uint32_t m = NSET_CAP - 1;
    uint32_t i = nset_home(off), n = 0;
    for (; n < NSET_CAP; n++, i = (i + 1) & m) {
        uint64_t v = atomic_load_explicit(&h->named_set[i], memory_order_relaxed);
        if (v == 0) return;
        if (v == off) break;
    }
    if (n == NSET_CAP) return;
    /* backward shift: move later members of the cluster into the hole */
    for (uint32_t j = (i + 1) & m;; j = (j + 1) & m) {
        uint64_t v = atomic_load_explicit(&h->named_set[j], memory_order_relaxed);
        if (v == 0) break;
        uint32_t k = nset_home(v);
        if (((j - k) & m) >= ((j - i) & m)) {
            atomic_store_explicit(&h->named_set[i], v, memory_order_relaxed);
            i = j;
        }
    }
    atomic_store_explicit(&h->named_set[i], 0, memory_order_relaxed);
    atomic_fetch_sub_explicit(&h->named_n, 1, memory_order_release);
}

bool nvh_named_obj_(nvh_pool *pool, uint64_t off)
{
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    return h && nvh_named_has(h, off);
}

/* Fill the set from the table (heap open, after recovery). */
void nvh_named_set_build(nvh_heap *h)
{
    for (uint32_t i = 0; i < NVH_NAMED_CAP; i++) {
        uint64_t w = atomic_load_explicit(&h->table[i].off, memory_order_relaxed), obj;
        if (w > NVH_NAMED_TOMB && entry_ok(h, i, w, &obj)) nset_add(h, obj);
    }
}

static bool slot_pending(nvh_heap *h, uint32_t slot)
{
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].slot == slot) return true;
    return false;
}

/* A free slot on the name's chain: empty or a tombstone (a damaged entry is
 * kept: lookups of the name it held must keep reporting it). */
static int64_t table_insert_slot(nvh_heap *h, const char *name)
{
    uint32_t mask = NVH_NAMED_CAP - 1, i = name_hash(name) & mask;
    for (uint32_t n = 0; n < NVH_NAMED_CAP; n++, i = (i + 1) & mask) {
        uint64_t off = atomic_load_explicit(&h->table[i].off, memory_order_relaxed);
        bool free_slot = off == NVH_NAMED_TOMB || (off == 0 && h->table[i].name[0] == '\0');
        if (free_slot && !slot_pending(h, i)) return i;
    }
    return -1;
}

static nvh_named_pending *pending_find(nvh_heap *h, const char *name)
{
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && strcmp(h->pending[i].name, name) == 0) return &h->pending[i];
    return NULL;
}

void nvh_named_drop_pending(nvh_heap *h, uint64_t off)
{
    pthread_mutex_lock(&h->named_lock);
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].obj == off) h->pending[i].used = false;
    pthread_mutex_unlock(&h->named_lock);
}

/* Name of the pending reservation at off (caller holds named_lock). */
const char *nvh_named_pending_name(nvh_heap *h, uint64_t off)
{
    static const char none[56];
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].obj == off) return h->pending[i].name;
    return none;
}

static nvh_heap *named_heap(nvh_pool *pool, bool write)
{
    if (!pool) { nvh_fail(NVH_E_INVAL, "pool is NULL"); return NULL; }
    nvh_heap *h = nvh_heap_get_(pool);
    if (!h) return NULL;
    if (write && pool->readonly) {
        nvh_fail(NVH_E_READONLY, "pool %s is open read-only", pool->path);
        return NULL;
    }
    return h;
}

/* ==========================================================================
 * API
 * ========================================================================== */
void *nvh_reserve_named(nvh_pool *pool, const char *name, size_t size)
{
    nvh_heap *h = named_heap(pool, true);
    if (!h || check_name(name) != NVH_OK) return NULL;
    pthread_mutex_lock(&h->named_lock);
    void *p = NULL;
    uint64_t obj;
    int64_t found = table_find(h, name, &obj);
    if (found == -2) goto out;
    if (found >= 0 || pending_find(h, name)) {
        nvh_fail(NVH_E_EXISTS, "an object named '%s' exists", name);
        goto out;
    }
    int64_t slot = table_insert_slot(h, name);
    if (slot < 0) {
        nvh_fail(NVH_E_NOSPACE, "the object table of %s is full (%u entries)", pool->path,
                 NVH_NAMED_CAP);
        goto out;
    }
    nvh_named_pending *pe = NULL;
    for (size_t i = 0; i < h->npending; i++)
        if (!h->pending[i].used) { pe = &h->pending[i]; break; }
    if (!pe) {
        if (h->npending == h->pending_cap) {
            size_t cap = h->pending_cap ? h->pending_cap * 2 : 8;
            nvh_named_pending *g = realloc(h->pending, cap * sizeof *g);
            if (!g) { nvh_fail(NVH_E_NOMEM, "out of memory"); goto out; }
            h->pending = g;
            h->pending_cap = cap;
        }
        pe = &h->pending[h->npending++];
    }
    p = nvh_reserve(pool, size);
    if (!p) { pe->used = false; goto out; }
    memset(pe->name, 0, sizeof pe->name);
    strcpy(pe->name, name);
    pe->obj = nvh_off(pool, p);
    pe->slot = (uint32_t)slot;
    pe->used = true;
out:
    pthread_mutex_unlock(&h->named_lock);
    return p;
}

int nvh_activate_named(nvh_pool *pool, const char *name)
{
    nvh_heap *h = named_heap(pool, true);
    if (!h) return nvh_errcode();
    int rc = check_name(name);
    if (rc != NVH_OK) return rc;
    pthread_mutex_lock(&h->named_lock);
    nvh_named_pending *pe = pending_find(h, name);
    if (!pe) {
        rc = nvh_fail(NVH_E_NOTFOUND, "no reservation named '%s'", name);
        goto out;
    }
    /* the name travels inside the redo record; the entry (name, then the
     * committing offset) is written by the record's effects */
    rc = nvh_activate_off_(h, pe->obj, NULL, 0, pe->slot);
    if (rc == NVH_OK) {
        pe->used = false;
        nset_add(h, pe->obj);
    }
out:
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

void *nvh_get_named(nvh_pool *pool, const char *name, size_t *size_out)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h || check_name(name) != NVH_OK) return NULL;
    pthread_mutex_lock(&h->named_lock);
    uint64_t off = 0;
    int64_t slot = table_find(h, name, &off);
    pthread_mutex_unlock(&h->named_lock);
    if (slot < 0) {
        if (slot == -1) nvh_fail(NVH_E_NOTFOUND, "no object named '%s'", name);
        return NULL;
    }
    if (size_out) {
        uint64_t u = 0;
        *size_out = nvh_heap_usable(h, off, &u) == NVH_OK ? (size_t)u : 0;
    }
    return h->base + off;
}

int nvh_free_named(nvh_pool *pool, const char *name)
{
    nvh_heap *h = named_heap(pool, true);
    if (!h) return nvh_errcode();
    int rc = check_name(name);
    if (rc != NVH_OK) return rc;
    pthread_mutex_lock(&h->named_lock);
    uint64_t off = 0;
    int64_t slot = table_find(h, name, &off);
    if (slot == -2) rc = nvh_errcode();
    else if (slot < 0) rc = nvh_fail(NVH_E_NOTFOUND, "no object named '%s'", name);
    else {
        rc = nvh_free_off_(h, off, NULL, 0, slot);
        if (rc == NVH_OK) nset_del(h, off);
    }
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

int nvh_named_foreach(nvh_pool *pool, nvh_named_fn fn, void *arg)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h) return nvh_errcode();
    if (!fn) return nvh_fail(NVH_E_INVAL, "callback is NULL");
    int64_t damaged = -1;
    for (uint32_t i = 0; i < NVH_NAMED_CAP; i++) {
        char name[56];
        pthread_mutex_lock(&h->named_lock);
        uint64_t w = atomic_load(&h->table[i].off), off = 0;
        memcpy(name, h->table[i].name, sizeof name);
        bool ok = w > NVH_NAMED_TOMB && entry_ok(h, i, w, &off);
        pthread_mutex_unlock(&h->named_lock);
        if (!ok) {
            if ((w > NVH_NAMED_TOMB || (w == 0 && name[0])) && damaged < 0) damaged = i;
            continue;
        }
        uint64_t u = 0;
        nvh_heap_usable(h, off, &u);
        int r = fn(name, h->base + off, (size_t)u, arg);
        if (r) return r;
    }
    if (damaged >= 0) {
        nvh_corrupt_report(h, slot_off(h, (uint32_t)damaged), "damaged object-table entry");
        return nvh_fail(NVH_E_CORRUPT, "%s: object table entry %lld at offset %llu is damaged "
                        "(skipped; every intact entry was visited)", pool->path,
                        (long long)damaged, (unsigned long long)slot_off(h, (uint32_t)damaged));
    }
    return NVH_OK;
}

int nvh_named_lookup_(nvh_pool *pool, const char *name, void **ptr_out, size_t *size_out)
{
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    if (!h) return NVH_E_NOTFOUND;
    pthread_mutex_lock(&h->named_lock);
    uint64_t off = 0;
    int64_t slot = table_find(h, name, &off);
    pthread_mutex_unlock(&h->named_lock);
    if (slot == -2) return NVH_E_CORRUPT;
    if (slot < 0) return NVH_E_NOTFOUND;
    uint64_t u = 0;
    nvh_heap_usable(h, off, &u);
    *ptr_out = h->base + off;
    *size_out = (size_t)u;
    return NVH_OK;
}
