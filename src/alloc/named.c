/* named.c — named allocations ([Schwalb15] §3.6): a persistent open-addressing
 * hash table of 64 B entries {name[56], offset}, read directly from the pool,
 * so lookups need no DRAM index and work right after open. An entry commits
 * with the 8-byte store of its offset (inside the activation's redo record)
 * after its name was flushed ahead of the record's fence. Deleted entries
 * become tombstones (offset 1); abandoned reservations (name, offset 0) keep
 * probe chains intact and are reused like tombstones. */
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

/* Slot of a committed entry with this name, or -1. */
static int64_t table_find(nvh_heap *h, const char *name)
{
    uint32_t mask = NVH_NAMED_CAP - 1, i = name_hash(name) & mask;
    for (uint32_t n = 0; n < NVH_NAMED_CAP; n++, i = (i + 1) & mask) {
        struct nvh_named_entry *e = &h->table[i];
        uint64_t off = atomic_load_explicit(&e->off, memory_order_acquire);
        if (off == 0 && e->name[0] == '\0') return -1;
        if (off > NVH_NAMED_TOMB && strncmp(e->name, name, sizeof e->name) == 0) return i;
    }
    return -1;
}

static bool slot_pending(nvh_heap *h, uint32_t slot)
{
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].slot == slot) return true;
    return false;
}

static int64_t table_insert_slot(nvh_heap *h, const char *name)
{
    uint32_t mask = NVH_NAMED_CAP - 1, i = name_hash(name) & mask;
    for (uint32_t n = 0; n < NVH_NAMED_CAP; n++, i = (i + 1) & mask) {
        uint64_t off = atomic_load_explicit(&h->table[i].off, memory_order_relaxed);
        if (off <= NVH_NAMED_TOMB && !slot_pending(h, i)) return i;
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
    if (table_find(h, name) >= 0 || pending_find(h, name)) {
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
    if (rc == NVH_OK) pe->used = false;
out:
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

void *nvh_get_named(nvh_pool *pool, const char *name, size_t *size_out)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h || check_name(name) != NVH_OK) return NULL;
    pthread_mutex_lock(&h->named_lock);
    int64_t slot = table_find(h, name);
    uint64_t off = slot >= 0 ? atomic_load(&h->table[slot].off) : 0;
    pthread_mutex_unlock(&h->named_lock);
    if (slot < 0) {
        nvh_fail(NVH_E_NOTFOUND, "no object named '%s'", name);
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
    int64_t slot = table_find(h, name);
    if (slot < 0) rc = nvh_fail(NVH_E_NOTFOUND, "no object named '%s'", name);
    else rc = nvh_free_off_(h, atomic_load(&h->table[slot].off), NULL, 0, slot);
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

int nvh_named_foreach(nvh_pool *pool, nvh_named_fn fn, void *arg)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h) return nvh_errcode();
    if (!fn) return nvh_fail(NVH_E_INVAL, "callback is NULL");
    for (uint32_t i = 0; i < NVH_NAMED_CAP; i++) {
        char name[56];
        pthread_mutex_lock(&h->named_lock);
        uint64_t off = atomic_load(&h->table[i].off);
        memcpy(name, h->table[i].name, sizeof name);
        pthread_mutex_unlock(&h->named_lock);
        name[55] = '\0';
        if (off <= NVH_NAMED_TOMB) continue;
        uint64_t u = 0;
        nvh_heap_usable(h, off, &u);
        int r = fn(name, h->base + off, (size_t)u, arg);
        if (r) return r;
    }
    return NVH_OK;
}
