/* alloc.c — the calls composed from the allocation paths and the heap's
 * settings: nvh_alloc (reserve, construct, persist, activate), the usable
 * size of an object, nvh_heap_sync (retire every ring) and
 * nvh_heap_config_get/_set. */
#include "alloc.h"

#include <string.h>

void *nvh_alloc(nvh_pool *pool, size_t size, nvh_ctor_fn ctor, void *arg, nvh_off_t *link)
{
    void *p = nvh_reserve(pool, size);
    if (!p) return NULL;
    /* the constructor (or the zeroing) writes the new object on the
     * caller's behalf: inside a window on it, closed once it is durable */
    size_t wlen = size ? size : 1;
    nvh_protect_open_(pool, p, wlen);
    if (ctor) {
        if (ctor(pool, p, size, arg) != 0) {
            nvh_protect_close_(pool, p, wlen);
            nvh_cancel(pool, p);
            nvh_fail(NVH_E_ABORTED, "nvh_alloc: the constructor failed");
            return NULL;
        }
    } else {
        memset(p, 0, size);
    }
    /* the content must be durable before the record can be: its own fence */
    nvh_persist(pool, p, wlen);
    nvh_protect_close_(pool, p, wlen);
    nvh_off_t *links[1] = {link};
    if (nvh_activate(pool, p, links, link ? 1 : 0) != NVH_OK) {
        int code = nvh_errcode();
        nvh_cancel(pool, p);
        nvh_fail(code, "nvh_alloc: activation failed");
        return NULL;
    }
    return p;
}

/* Usable bytes of the object (or reservation) at off: the DRAM state of
 * the chunk's owner arena first, then the media header. NVH_E_BADPTR if off
 * is neither. */
int nvh_heap_usable(nvh_heap *h, uint64_t off, uint64_t *usable)
{
    uint64_t rel = off - h->chunks_off, b = rel / NVH_BLOCK, in = rel % NVH_BLOCK;
    /* The DRAM state of the chunk (its runs' bitmaps, its reservations) is
     * its owner arena's: read it under that arena's lock, since another
     * thread may be allocating or freeing in the same run right now. An
     * owned chunk keeps its owner. Reservations come before the media
     * header: a reservation's header is not ours yet (another thread's
     * activation may be writing a free remainder's header there now). */
    uint64_t c = nvh_chunk_of_block(h, b);
    int own = nvh_owner_get(h, c, memory_order_acquire);
    if (own >= 0) {
        nvh_arena *a = &h->arenas[own];
        int found = 0;           /* 1: an object, -1: not one (DRAM is the truth) */
        nvh_alock_lock(&a->lock);
        nvh_run *run = nvh_run_lookup(h, b);
        unsigned slot = 0;
        if (run) {
            /* the DRAM view is the truth (the media bitmap lags until retire) */
            found = nvh_run_slot_at(h, run, off, &slot) &&
                            ((run->resv | run->tcached | run->pbits) & (1ull << slot))
                        ? 1 : -1;
            if (found > 0) *usable = nvh_cls_size(run->cls);
        } else if (in == 0) {
            nvh_resv *r = nvh_resv_find(a, b);
            if (r) {
                *usable = r->blocks * NVH_BLOCK;
                found = 1;
            }
        }
        nvh_alock_unlock(&a->lock);
        if (found > 0) return NVH_OK;
        if (found < 0)
            return nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
    }
    /* a slot in a later block of a run: the run's header is at its first */
    uint64_t s = nvh_region_start_media(h, b);
    if (s != UINT64_MAX && s != b && nvh_rhdr_at(h, s)->kind == NVH_RK_RUN) {
        in += (b - s) * NVH_BLOCK;
        b = s;
    }
    if (nvh_rhdr_valid(h, b)) {
        const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
        unsigned slot = 0;
        if (r->state == NVH_RS_USED && r->kind == NVH_RK_RUN &&
            nvh_slot_of(in, r->cls, &slot) && slot < r->nslots &&
            (atomic_load(&((struct nvh_rhdr *)r)->bitmap) & (1ull << slot))) {
            *usable = nvh_cls_size(r->cls);
            return NVH_OK;
        }
        if (r->state == NVH_RS_USED && (r->kind == NVH_RK_LARGE || r->kind == NVH_RK_HUGE) &&
            in == 0) {
            *usable = (uint64_t)r->blocks * NVH_BLOCK;
            return NVH_OK;
        }
    }
    return nvh_fail(NVH_E_BADPTR, "offset %llu is not an object", (unsigned long long)off);
}

size_t nvh_usable_size(nvh_pool *pool, const void *ptr)
{
    nvh_heap *h = nvh_heap_of(pool, false);
    if (!h) return 0;
    uint64_t off = 0, usable = 0;
    if (nvh_check_heap_ptr(h, ptr, &off) != NVH_OK) return 0;
    if (nvh_heap_usable(h, off, &usable) != NVH_OK) return 0;
    return (size_t)usable;
}

int nvh_heap_sync(nvh_pool *pool)
{
    nvh_heap *h = nvh_heap_of(pool, true);
    if (!h) return nvh_errcode();
    nvh_redo_retire_all(h);
    return NVH_OK;
}

int nvh_heap_config_get(nvh_pool *pool, nvh_heap_config *config)
{
    nvh_heap *h = nvh_heap_of(pool, false);
    if (!h) return nvh_errcode();
    if (!config) return nvh_fail(NVH_E_INVAL, "config is NULL");
    config->fifo_delay_ns = atomic_load(&h->fifo_delay_ns);
    config->fifo_max_bytes = atomic_load(&h->fifo_max_bytes);
    config->arenas = atomic_load(&h->narenas);
    return NVH_OK;
}

int nvh_heap_config_set(nvh_pool *pool, const nvh_heap_config *config)
{
    nvh_heap *h = nvh_heap_of(pool, false);
    if (!h) return nvh_errcode();
    if (!config || config->arenas < 1 || config->arenas > NVH_RINGS)
        return nvh_fail(NVH_E_INVAL, "arenas must be 1..%u", NVH_RINGS);
    atomic_store(&h->fifo_delay_ns, config->fifo_delay_ns);
    atomic_store(&h->fifo_max_bytes, config->fifo_max_bytes);
    atomic_store(&h->narenas, config->arenas);
    return NVH_OK;
}
