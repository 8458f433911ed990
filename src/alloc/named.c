/* named.c — named allocations ([Schwalb15] §3.6): persistent object tables
 * of 64 B entries {name[56], offset} (table 0 in the heap metadata, tables
 * 1..14 heap objects added as names outgrow them, alloc.h) and, in DRAM, an
 * index name -> slot, so a lookup is one hash probe however many names there
 * are. Open indexes table 0 only; a background thread indexes the other
 * tables in steps, so open does not read every entry (docs/ALLOC.md §2a).
 * Until it is done a lookup walks the name's probe chain in each table on
 * the media: a hit there is certain, and so is a miss when the chains are
 * sound (no empty slot before a committed entry of the chain: activations
 * seal them, the chains word records it); an uncertain miss completes the
 * index first. A create needs a proven miss and a slot: in a table the
 * build has counted, else on its chain in the last table (table_insert_slot).
 * nvh_free's "is this object named?" completes the set of named objects'
 * offsets only, ahead of the index (set_complete).
 * An entry commits with the 8-byte store of its offset (inside the
 * activation's redo record) after its name was flushed ahead of the
 * record's fence. Deleted entries become tombstones (offset 1). Each
 * committed entry's offset word carries a check of the entry (alloc.h,
 * nvh_named_word): a damaged entry is never followed; a lookup of the name it
 * may have held reports NVH_E_CORRUPT. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Probes a walk of one chain on the media takes before it gives up (lookups
 * and placement before the index is complete). */
#define NVH_NAMED_WALK_MAX 64u

/* named_lock for an API call: counted while it waits, so that the
 * background build steps aside (build_main). */
static void named_lock(nvh_heap *h)
{
    atomic_fetch_add_explicit(&h->named_waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&h->named_lock);
    atomic_fetch_sub_explicit(&h->named_waiting, 1, memory_order_relaxed);
}

/* ==========================================================================
 * Tables (caller holds h->named_lock, or is open/replay, which run alone)
 * ========================================================================== */
static _Atomic uint64_t *dir_word(nvh_heap *h, unsigned k)
{
    return (_Atomic uint64_t *)(h->base + h->heap_off + NVH_NAMED_DIR_OFF + 8u * (k - 1u));
}

/* Is w a plausible payload offset of table k (inside the chunks, room for
 * the table)? The full check (an activated region that large) is at open. */
static bool dir_plausible(nvh_heap *h, unsigned k, uint64_t w)
{
    uint64_t size = nvh_pool_size(h->pool);
    return w % NVH_HDR == 0 && w >= h->chunks_off && w < size &&
           nvh_named_table_bytes(k) <= size - w;
}

/* Entry of a global slot, or NULL if its table does not exist. Reads the
 * directory word, so replay sees a table added by an earlier record. */
struct nvh_named_entry *nvh_named_entry_at(nvh_heap *h, uint32_t slot)
{
    if (slot < NVH_NAMED_CAP) return &h->table[slot];
    if (slot >= NVH_NAMED_MAXSLOTS) return NULL;
    unsigned k = nvh_named_table_of(slot);
    uint64_t w = atomic_load_explicit(dir_word(h, k), memory_order_acquire);
    if (w == 0 || !dir_plausible(h, k, w)) return NULL;
    return (struct nvh_named_entry *)(h->base + w) + (slot - nvh_named_table_first(k));
}

bool nvh_named_table_obj(nvh_heap *h, uint64_t off)
{
    for (unsigned k = 1; k < NVH_NAMED_TABLES; k++) {
        uint64_t w = atomic_load_explicit(dir_word(h, k), memory_order_relaxed);
        if (w == 0) return false;
        if (w == off) return true;
    }
    return false;
}

static uint32_t slots_cap(const nvh_heap *h)
{
    return nvh_named_table_first(h->ntables);
}

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

static int dir_fail(nvh_heap *h)
{
    return nvh_fail(NVH_E_CORRUPT, "%s: object table directory word at offset %llu is "
                    "damaged; named objects are unavailable", h->pool->path,
                    (unsigned long long)h->named_dir_badoff);
}

/* Is the entry in `slot` holding word w (> NVH_NAMED_TOMB) intact: a
 * terminated name, the word's check, an offset inside the heap's chunks? */
static bool entry_ok(nvh_heap *h, const struct nvh_named_entry *e, uint32_t slot, uint64_t w,
                     uint64_t *obj_out)
{
    uint64_t obj = w & NVH_NAMED_OFF_MASK;
    if (e->name[0] == '\0' || e->name[sizeof e->name - 1] != '\0' ||
        w != nvh_named_word(e->name, slot, obj) || obj < h->chunks_off ||
        obj >= nvh_pool_size(h->pool) || obj % NVH_HDR)
        return false;
    *obj_out = obj;
    return true;
}

static uint64_t slot_off(nvh_heap *h, uint32_t slot)
{
    return (uint64_t)((const char *)nvh_named_entry_at(h, slot) - h->base);
}

/* ==========================================================================
 * The DRAM name index: open addressing of {slot + 1, hash}, deletion by
 * backward shift. Every intact committed entry is indexed under its name.
 * ========================================================================== */

static int nidx_put(nvh_heap *h, uint32_t slot1, uint32_t hash);
static int nidx_grow(nvh_heap *h)
{
    uint32_t ocap = h->nidx_cap, cap = ocap ? ocap * 2 : 4096;
    struct nvh_nidx *old = h->nidx, *n = calloc(cap, sizeof *n);
    if (!n) return nvh_fail(NVH_E_NOMEM, "out of memory (object name index)");
    h->nidx = n;
    h->nidx_cap = cap;
    h->nidx_n = 0;
    for (uint32_t i = 0; i < ocap; i++)
        if (old[i].slot1) nidx_put(h, old[i].slot1, old[i].hash);
    free(old);
    return NVH_OK;
}

static int nidx_put(nvh_heap *h, uint32_t slot1, uint32_t hash)
{
    if ((h->nidx_n + 1) * 2 > h->nidx_cap && nidx_grow(h) != NVH_OK) return NVH_E_NOMEM;
    uint32_t m = h->nidx_cap - 1, i = hash & m;
    while (h->nidx[i].slot1) i = (i + 1) & m;
    h->nidx[i].slot1 = slot1;
    h->nidx[i].hash = hash;
    h->nidx_n++;
    return NVH_OK;
}

static void nidx_del(nvh_heap *h, uint32_t slot1, uint32_t hash)
{
    uint32_t m = h->nidx_cap - 1, i = hash & m;
    while (h->nidx[i].slot1 && h->nidx[i].slot1 != slot1) i = (i + 1) & m;
    if (!h->nidx[i].slot1) return;
    for (uint32_t j = (i + 1) & m;; j = (j + 1) & m) {
        if (!h->nidx[j].slot1) break;
        uint32_t k = h->nidx[j].hash & m;
        if (((j - k) & m) >= ((j - i) & m)) {
            h->nidx[i] = h->nidx[j];
            i = j;
        }
    }
    h->nidx[i].slot1 = 0;
    h->nidx_n--;
}

static int64_t chain_damage(nvh_heap *h, const char *name);
static int64_t chain_find(nvh_heap *h, const char *name, uint32_t hash, uint64_t *obj_out,
                          bool *proof);
static void build_finish(nvh_heap *h);

/* Slot of the committed entry with this name (its object in *obj_out), or
 * -1 if there is none, or -2 (NVH_E_CORRUPT set) if there is none but a
 * damaged entry may have been this name's: "not found" would be a guess.
 * Before the index is complete: the media chains, and on a miss the rest of
 * the index (a miss on the chains is not proof, see the header). */
static int64_t table_find(nvh_heap *h, const char *name, uint64_t *obj_out)
{
    if (h->named_dir_bad) { dir_fail(h); return -2; }
    uint32_t hash = name_hash(name);
    if (!atomic_load_explicit(&h->named_ready, memory_order_relaxed)) {
        bool absent = false;
        int64_t slot = chain_find(h, name, hash, obj_out, &absent);
        if (slot >= 0) return slot;
        if (absent) return -1;
        build_finish(h);
    }
    int64_t damaged = -1;
    if (h->nidx_cap) {
        uint32_t m = h->nidx_cap - 1;
        for (uint32_t i = hash & m; h->nidx[i].slot1; i = (i + 1) & m) {
            if (h->nidx[i].hash != hash) continue;
            uint32_t slot = h->nidx[i].slot1 - 1;
            struct nvh_named_entry *e = nvh_named_entry_at(h, slot);
            if (!e || strncmp(e->name, name, sizeof e->name) != 0) continue;
            uint64_t w = atomic_load_explicit(&e->off, memory_order_acquire), obj;
            if (w > NVH_NAMED_TOMB &&
                entry_ok(h, e, slot, w, &obj)) {
                *obj_out = obj;
                return slot;
            }
            damaged = slot;
        }
    }
    if (damaged < 0 && h->named_damaged) damaged = chain_damage(h, name);
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
 * backward shift). Writers hold named_lock; nvh_free reads it without: a
 * grown set is published whole and the old one kept until close.
 * ========================================================================== */
struct nvh_nset {
    struct nvh_nset *next;
    uint32_t cap;
    _Atomic uint64_t v[];
};

static inline uint32_t nset_home(uint64_t off, uint32_t cap)
{
    return (uint32_t)((off * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static bool nset_lookup(nvh_heap *h, uint64_t off)
{
    struct nvh_nset *s = atomic_load_explicit(&h->named_set, memory_order_acquire);
    if (!s) return false;
    uint32_t m = s->cap - 1;
    for (uint32_t i = nset_home(off, s->cap), n = 0; n < s->cap; n++, i = (i + 1) & m) {
        uint64_t v = atomic_load_explicit(&s->v[i], memory_order_relaxed);
        if (v == off) return true;
        if (v == 0) return false;
    }
    return false;
}

static void set_complete(nvh_heap *h);

/* The set holds every named object once NVH_NAMED_BUILDING is clear in
 * named_n: from the first call that needs it on, it is completed ahead of
 * the index (set_complete) and kept by every change. */
bool nvh_named_set_has_(nvh_heap *h, uint64_t off)
{
    if (atomic_load_explicit(&h->named_n, memory_order_acquire) & NVH_NAMED_BUILDING) {
        named_lock(h);
        set_complete(h);
        pthread_mutex_unlock(&h->named_lock);
    }
    return nset_lookup(h, off);
}

/* Insert off; false if it was there. */
static bool nset_put(struct nvh_nset *s, uint64_t off)
{
    uint32_t m = s->cap - 1;
    for (uint32_t i = nset_home(off, s->cap);; i = (i + 1) & m) {
        uint64_t v = atomic_load_explicit(&s->v[i], memory_order_relaxed);
        if (v == off) return false;
        if (v == 0) {
            atomic_store_explicit(&s->v[i], off, memory_order_relaxed);
            return true;
        }
    }
}

/* Room for `more` offsets beyond those in the set (at most half full). */
static int nset_reserve(nvh_heap *h, uint32_t more)
{
    struct nvh_nset *s = atomic_load_explicit(&h->named_set, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(&h->named_n, memory_order_relaxed) & ~NVH_NAMED_BUILDING;
    if (s && (n + more) * 2 <= s->cap) return NVH_OK;
    uint64_t cap = s ? s->cap * 2 : 2048;
    while ((n + more) * 2 > cap) cap *= 2;
    if (cap > UINT32_MAX) return nvh_fail(NVH_E_NOMEM, "out of memory (named object set)");
    struct nvh_nset *g = calloc(1, sizeof *g + (size_t)cap * sizeof g->v[0]);
    if (!g) return nvh_fail(NVH_E_NOMEM, "out of memory (named object set)");
    g->cap = (uint32_t)cap;
    for (uint32_t i = 0; s && i < s->cap; i++) {
        uint64_t v = atomic_load_explicit(&s->v[i], memory_order_relaxed);
        if (v) nset_put(g, v);
    }
    if (s) { s->next = h->nset_old; h->nset_old = s; }
    atomic_store_explicit(&h->named_set, g, memory_order_release);
    return NVH_OK;
}

static int nset_add(nvh_heap *h, uint64_t off)
{
    if (nset_reserve(h, 1) != NVH_OK) return NVH_E_NOMEM;
    if (nset_put(atomic_load_explicit(&h->named_set, memory_order_relaxed), off))
        atomic_fetch_add_explicit(&h->named_n, 1, memory_order_release);
    return NVH_OK;
}

static void nset_del(nvh_heap *h, uint64_t off)
{
    struct nvh_nset *s = atomic_load_explicit(&h->named_set, memory_order_relaxed);
    if (!s) return;
    const uint32_t m = s->cap - 1;
    uint32_t i = nset_home(off, s->cap), n = 0;
    for (; n < s->cap; n++, i = (i + 1) & m) {
        uint64_t v = atomic_load_explicit(&s->v[i], memory_order_relaxed);
        if (v == 0) return;
        if (v == off) break;
    }
    if (n == s->cap) return;
    for (uint32_t j = (i + 1) & m;; j = (j + 1) & m) {
        uint64_t v = atomic_load_explicit(&s->v[j], memory_order_relaxed);
        if (v == 0) break;
        uint32_t k = nset_home(v, s->cap);
        if (((j - k) & m) >= ((j - i) & m)) {
            atomic_store_explicit(&s->v[i], v, memory_order_relaxed);
            i = j;
        }
    }
    atomic_store_explicit(&s->v[i], 0, memory_order_relaxed);
    atomic_fetch_sub_explicit(&h->named_n, 1, memory_order_release);
}

bool nvh_named_obj_(nvh_pool *pool, uint64_t off)
{
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    return h && nvh_named_has(h, off);
}

void nvh_named_fini(nvh_heap *h)
{
    nvh_named_stop(h);
    struct nvh_nset *s = atomic_load_explicit(&h->named_set, memory_order_relaxed);
    free(s);
    while (h->nset_old) {
        s = h->nset_old;
        h->nset_old = s->next;
        free(s);
    }
    free(h->nidx);
}

/* ==========================================================================
 * Placement: each table is an open-addressing table of its own (linear
 * probing from hash & (entries - 1)); a name goes to the first table under
 * 3/4 full. Lookups go through the DRAM index; the chains matter for damage:
 * a damaged entry may have held any name whose chain in its table reaches it.
 * ========================================================================== */
static bool slot_pending(nvh_heap *h, uint32_t slot)
{
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].slot == slot) return true;
    return false;
}

static bool slot_free(struct nvh_named_entry *e)
{
    uint64_t off = atomic_load_explicit(&e->off, memory_order_relaxed);
    return off == NVH_NAMED_TOMB || (off == 0 && e->name[0] == '\0');
}

/* Add table k: reserve it, zero and flush it, activate it with directory
 * word k as its link. The activation's fence commits it; before that a
 * crash leaves only a lost reservation and a zero word. */
static int table_grow(nvh_heap *h)
{
    unsigned k = h->ntables;
    if (k >= NVH_NAMED_TABLES)
        return nvh_fail(NVH_E_NOSPACE, "the object tables of %s are full (%u entries)",
                        h->pool->path, NVH_NAMED_MAXSLOTS);
    uint64_t bytes = nvh_named_table_bytes(k);
    void *p = nvh_reserve(h->pool, (size_t)bytes);
    if (!p) return nvh_errcode();
    memset(p, 0, (size_t)bytes);
    nvh_flush(h->pool, p, (size_t)bytes);
    uint64_t off = nvh_off(h->pool, p);
    struct nvh_link_entry link = {
        .addr = (uint64_t)((char *)dir_word(h, k) - h->base), .value = 0};
    int rc = nvh_activate_off_(h, off, &link, 1, -1);
    if (rc != NVH_OK) {
        /* not cancelled (nvh_cancel takes named_lock): a reservation is
         * volatile, so its space returns at the next open */
        nvh_fail(rc, "adding object table %u (%llu bytes) to %s failed", k,
                 (unsigned long long)bytes, h->pool->path);
        return rc;
    }
    h->ntables = k + 1;
    return NVH_OK;
}

static bool slot_indexed(const nvh_heap *h, uint32_t slot);
static bool table_built(const nvh_heap *h, unsigned k)
{
    return slot_indexed(h, nvh_named_table_first(k)) &&
           slot_indexed(h, nvh_named_table_first(k + 1) - 1);
}

/* A free slot on the name's chain in table k, within `lim` probes, or -1. */
static int64_t chain_free_slot(nvh_heap *h, unsigned k, uint32_t hash, uint32_t lim)
{
    uint32_t cap = NVH_NAMED_CAP << k, mask = cap - 1, first = nvh_named_table_first(k);
    for (uint32_t n = 0, i = hash & mask; n < cap && n < lim; n++, i = (i + 1) & mask)
        if (slot_free(nvh_named_entry_at(h, first + i)) && !slot_pending(h, first + i))
            return first + i;
    return -1;
}

/* A free slot on the name's chain in the first table with room (empty or a
 * tombstone; a damaged entry is kept: lookups of the name it held must keep
 * reporting it). Counts it in nused if the build has indexed it (else the
 * build counts it when it gets there: build_step). Before the build is
 * complete only the indexed tables' fill is known: the first of them with
 * room, else the last table's chain within NVH_NAMED_WALK_MAX probes (it is
 * the newest, the one with room unless names were deleted, and any table
 * is correct for a name: lookups walk them all); -2 if neither has a slot,
 * then the caller completes the index and asks again. */
static int64_t table_insert_slot(nvh_heap *h, const char *name)
{
    uint32_t hash = name_hash(name);
    bool ready = atomic_load_explicit(&h->named_ready, memory_order_relaxed);
    for (unsigned k = 0;; k++) {
        if (!ready && (k == h->ntables || !table_built(h, k))) {
            int64_t s = chain_free_slot(h, h->ntables - 1, hash, NVH_NAMED_WALK_MAX);
            if (s >= 0 && slot_indexed(h, (uint32_t)s)) h->nused[h->ntables - 1]++;
            return s < 0 ? -2 : s;
        }
        if (k == h->ntables && table_grow(h) != NVH_OK) return -1;
        uint32_t cap = NVH_NAMED_CAP << k;
        if ((uint64_t)h->nused[k] * 4 >= (uint64_t)cap * 3) continue;
        int64_t s = chain_free_slot(h, k, hash, cap);
        if (s >= 0) {
            h->nused[k]++;
            return s;
        }
    }
}

/* A slot given back (cancel, delete): uncount it if the build has counted
 * it (build_step counts what it finds pending or committed). */
static void slot_release(nvh_heap *h, uint32_t slot)
{
    if (slot_indexed(h, slot)) h->nused[nvh_named_table_of(slot)]--;
}

/* Does a damaged entry lie on the name's chain in some table? */
static int64_t chain_damage(nvh_heap *h, const char *name)
{
    uint32_t hash = name_hash(name);
    for (unsigned k = 0; k < h->ntables; k++) {
        uint32_t cap = NVH_NAMED_CAP << k, mask = cap - 1, first = nvh_named_table_first(k);
        for (uint32_t n = 0, i = hash & mask; n < cap; n++, i = (i + 1) & mask) {
            struct nvh_named_entry *e = nvh_named_entry_at(h, first + i);
            uint64_t w = atomic_load_explicit(&e->off, memory_order_relaxed), obj;
            if (w == 0 && e->name[0] == '\0') break;
            if (w == NVH_NAMED_TOMB) continue;
            if (w == 0 || !entry_ok(h, e, first + i, w, &obj)) return first + i;
        }
    }
    return -1;
}

/* Walk the name's probe chain in every table on the media (the index is
 * not complete yet). Returns the slot of its intact committed entry, or -1
 * and in *proof whether the walks prove it absent: every walk ended at an
 * empty slot, past no damaged entry, in a pool whose chains are sound
 * (alloc.h, the chains word). A walk gives up after NVH_NAMED_WALK_MAX
 * probes (no proof: the caller completes the index instead). */
static int64_t chain_find(nvh_heap *h, const char *name, uint32_t hash, uint64_t *obj_out,
                          bool *proof)
{
    bool sure = h->chains_sound;
    for (unsigned k = 0; k < h->ntables; k++) {
        uint32_t cap = NVH_NAMED_CAP << k, mask = cap - 1, first = nvh_named_table_first(k);
        uint32_t lim = cap < NVH_NAMED_WALK_MAX ? cap : NVH_NAMED_WALK_MAX, n = 0;
        for (uint32_t i = hash & mask; n < lim; n++, i = (i + 1) & mask) {
            struct nvh_named_entry *e = nvh_named_entry_at(h, first + i);
            uint64_t w = atomic_load_explicit(&e->off, memory_order_acquire), obj;
            if (w == 0 && e->name[0] == '\0') break;
            if (w == NVH_NAMED_TOMB) continue;
            if (w != 0 && entry_ok(h, e, first + i, w, &obj)) {
                if (strncmp(e->name, name, sizeof e->name) == 0) {
                    *obj_out = obj;
                    return first + i;
                }
            } else {
                sure = false;       /* damaged: it may have been this name */
            }
        }
        if (n == lim) sure = false;
    }
    *proof = sure;
    return -1;
}

/* Keep the chains sound: the empty slots between the name's home and its
 * slot (reservations still pending, or given back) become tombstones,
 * flushed ahead of the activation's fence, so that no committed entry lies
 * beyond an empty slot of its chain, crash or cancel. Rare: a slot is
 * empty there only while another reservation of the chain is open. */
static void chain_seal(nvh_heap *h, const char *name, uint32_t slot)
{
    unsigned k = nvh_named_table_of(slot);
    uint32_t mask = (NVH_NAMED_CAP << k) - 1, first = nvh_named_table_first(k);
    for (uint32_t i = name_hash(name) & mask; first + i != slot; i = (i + 1) & mask) {
        struct nvh_named_entry *e = nvh_named_entry_at(h, first + i);
        if (atomic_load_explicit(&e->off, memory_order_relaxed) != 0 || e->name[0] != '\0')
            continue;
        nvh_wopen(h, &e->off, 8);
        atomic_store_explicit(&e->off, NVH_NAMED_TOMB, memory_order_relaxed);
        nvh_wclose(h, &e->off, 8);
        nvh_flush(h->pool, &e->off, 8);
    }
}

/* ==========================================================================
 * Building the DRAM state from the tables: open checks the directory and
 * indexes table 0; the rest is indexed in steps of NVH_NAMED_BUILD_STEP
 * slots, each under named_lock, by a background thread — or by the first
 * caller that needs the whole index, which finishes it (build_finish).
 * Slots below build_next are indexed and kept by every change; the others
 * are read as the media has them when the build reaches them, so a delete
 * there changes only the media, and a create there is indexed and counted
 * by the build, not by the create (slot_indexed). New tables wait for the
 * whole index (only then is every table's fill known).
 * ========================================================================== */
#define NVH_NAMED_BUILD_STEP 512u

static bool slot_indexed(const nvh_heap *h, uint32_t slot)
{
    return slot < h->build_next || slot >= h->build_end;
}

/* The chains word for this session: its chains are sound (alloc.h). */
static void chains_vouch(nvh_heap *h)
{
    _Atomic uint64_t *cw = (_Atomic uint64_t *)(h->base + h->heap_off + NVH_NAMED_CHAINS_OFF);
    nvh_wopen(h, (const void *)cw, 8);
    atomic_store_explicit(cw, nvh_named_chains_word(h->named_epoch), memory_order_relaxed);
    nvh_wclose(h, (const void *)cw, 8);
    nvh_flush(h->pool, (void *)cw, 8);
}

/* Index slots [build_next, build_next + n) (caller holds named_lock, or is
 * open). The last step publishes the index as complete. */
static int build_step(nvh_heap *h, uint32_t n)
{
    uint32_t end = h->build_end - h->build_next > n ? h->build_next + n : h->build_end;
    for (uint32_t i = h->build_next; i < end; i++) {
        struct nvh_named_entry *e = nvh_named_entry_at(h, i);
        uint64_t w = atomic_load_explicit(&e->off, memory_order_relaxed), obj;
        if ((w == 0 && e->name[0] == '\0') || w == NVH_NAMED_TOMB) {
            /* free, or a reservation made before the build got here (its
             * slot empty, or a tombstone if another activation sealed it):
             * counted now, uncounted by its cancel (slot_release) */
            if (h->npending && slot_pending(h, i)) h->nused[nvh_named_table_of(i)]++;
            continue;
        }
        h->nused[nvh_named_table_of(i)]++;
        if (w > NVH_NAMED_TOMB && entry_ok(h, e, i, w, &obj)) {
            if (nset_add(h, obj) != NVH_OK || nidx_put(h, i + 1, name_hash(e->name)) != NVH_OK) {
                h->nused[nvh_named_table_of(i)]--;
                h->build_next = i;  /* out of memory: the next step retries */
                return nvh_errcode();
            }
            /* chains not known sound: seal this one's holes (empty slots
             * the build has not reached stay uncounted: they are free) */
            if (h->chains_repair) chain_seal(h, e->name, i);
        } else {
            h->named_damaged++;
        }
    }
    h->build_next = end;
    if (end == h->build_end && h->chains_repair) {
        /* every hole sealed: durable first, then vouch for this session */
        nvh_drain(h->pool);
        chains_vouch(h);
        h->chains_repair = false;
        h->chains_sound = true;
    }
    if (end == h->build_end) {
        atomic_store_explicit(&h->named_ready, true, memory_order_release);
        atomic_fetch_and_explicit(&h->named_n, ~NVH_NAMED_BUILDING, memory_order_release);
    }
    return NVH_OK;
}

/* Complete the set of named objects' offsets before the index (caller holds
 * named_lock): nvh_free must know every named object, and reading one word
 * and the check of each entry the build has not reached, without the name
 * index's inserts, is a fraction of the build. From then on activations and
 * deletes keep the set whatever the slot (the build's adds find their
 * objects there). Out of memory: the whole build instead. */
static void set_complete(nvh_heap *h)
{
    if (!(atomic_load_explicit(&h->named_n, memory_order_relaxed) & NVH_NAMED_BUILDING)) return;
    /* gathered first, so that the set grows once: at 10^6 names its
     * growth by doubling costs as much as the inserts */
    uint64_t *objs = NULL;
    size_t n = 0, cap = 0;
    for (unsigned k = 0; k < h->ntables; k++) {
        uint32_t first = nvh_named_table_first(k), end = nvh_named_table_first(k + 1);
        uint32_t lo = first > h->build_next ? first : h->build_next;
        uint32_t hi = end < h->build_end ? end : h->build_end;
        struct nvh_named_entry *t = lo < hi ? nvh_named_entry_at(h, first) : NULL;
        for (uint32_t i = lo; i < hi; i++) {
            uint64_t w = atomic_load_explicit(&t[i - first].off, memory_order_relaxed), obj;
            if (w <= NVH_NAMED_TOMB || !entry_ok(h, &t[i - first], i, w, &obj)) continue;
            if (n == cap) {
                uint64_t *g = realloc(objs, (cap = cap ? cap * 2 : 4096) * sizeof *objs);
                if (!g) goto nomem;
                objs = g;
            }
            objs[n++] = obj;
        }
    }
    if (n > UINT32_MAX / 4 || nset_reserve(h, (uint32_t)n) != NVH_OK) goto nomem;
    struct nvh_nset *s = atomic_load_explicit(&h->named_set, memory_order_relaxed);
    uint32_t added = 0;
    for (size_t i = 0; i < n; i++) added += nset_put(s, objs[i]);
    free(objs);
    atomic_fetch_add_explicit(&h->named_n, added, memory_order_release);
    atomic_fetch_and_explicit(&h->named_n, ~NVH_NAMED_BUILDING, memory_order_release);
    return;
nomem:
    free(objs);
    build_finish(h);
}

/* The rest of the index, now (caller holds named_lock). Out of memory ends
 * it as complete with the names indexed so far: lookups of the others miss
 * until the next open, as after a failed index insert at activation. */
static void build_finish(nvh_heap *h)
{
    while (!atomic_load_explicit(&h->named_ready, memory_order_relaxed))
        if (build_step(h, UINT32_MAX) != NVH_OK) h->build_end = h->build_next;
}

_Atomic unsigned nvh_named_build_hold_;

static void *build_main(void *arg)
{
    nvh_heap *h = arg;
    for (;;) {
        while (atomic_load_explicit(&nvh_named_build_hold_, memory_order_acquire) &&
               !atomic_load_explicit(&h->build_stop, memory_order_relaxed))
            usleep(200);
        /* a caller waiting for the lock gets it between steps: the mutex is
         * not fair, and re-taking it at once would make the caller wait for
         * the whole build (or, yielding instead, cost a time slice per step
         * on a loaded machine). Bounded, so a stream of calls cannot stall
         * the build for good. */
        for (int i = 0; i < 20 && atomic_load_explicit(&h->named_waiting, memory_order_relaxed);
             i++)
            usleep(50);
        pthread_mutex_lock(&h->named_lock);
        bool done = atomic_load_explicit(&h->build_stop, memory_order_relaxed) ||
                    atomic_load_explicit(&h->named_ready, memory_order_relaxed);
        if (!done && build_step(h, NVH_NAMED_BUILD_STEP) != NVH_OK) build_finish(h);
        pthread_mutex_unlock(&h->named_lock);
        if (done) return NULL;
    }
}

/* Heap open, after recovery: the chains word, check the directory, index
 * table 0, start the background build of the rest (or build it here if no
 * thread can be had). Cost: the directory words, table 0 (64 KiB) and a
 * thread start, however many names there are. */
int nvh_named_open(nvh_heap *h, bool fresh, uint64_t prev_epoch, uint64_t epoch)
{
    _Atomic uint64_t *cw = (_Atomic uint64_t *)(h->base + h->heap_off + NVH_NAMED_CHAINS_OFF);
    h->named_epoch = epoch;
    h->chains_sound = fresh || atomic_load_explicit(cw, memory_order_relaxed) ==
                                   nvh_named_chains_word(prev_epoch);
    /* durable with the open's epoch commit (a fence); a crash before it
     * leaves a word that matches no epoch: unknown, which is safe */
    if (h->chains_sound && !h->pool->readonly) chains_vouch(h);
    h->ntables = 1;
    h->named_damaged = 0;
    for (unsigned k = 1; k < NVH_NAMED_TABLES; k++) {
        uint64_t w = atomic_load_explicit(dir_word(h, k), memory_order_relaxed), u = 0;
        if (w == 0) {
            for (unsigned j = k + 1; j < NVH_NAMED_TABLES; j++)
                if (atomic_load_explicit(dir_word(h, j), memory_order_relaxed) != 0) {
                    h->named_dir_bad = true;
                    h->named_dir_badoff = (uint64_t)((char *)dir_word(h, j) - h->base);
                }
            break;
        }
        if (!dir_plausible(h, k, w) || nvh_heap_usable(h, w, &u) != NVH_OK ||
            u < nvh_named_table_bytes(k)) {
            h->named_dir_bad = true;
            h->named_dir_badoff = (uint64_t)((char *)dir_word(h, k) - h->base);
            break;
        }
        h->ntables = k + 1;
    }
    h->build_next = 0;
    h->build_end = h->named_dir_bad ? 0 : slots_cap(h);   /* a bad directory: named calls report it */
    /* chains not known sound: the build seals every chain's holes, then vouches */
    h->chains_repair = !h->chains_sound && !h->pool->readonly && !h->named_dir_bad;
    atomic_store_explicit(&h->named_n, NVH_NAMED_BUILDING, memory_order_relaxed);
    int rc = build_step(h, NVH_NAMED_CAP);
    if (rc != NVH_OK) return rc;
    if (atomic_load_explicit(&h->named_ready, memory_order_relaxed)) return NVH_OK;
    if (pthread_create(&h->build_thread, NULL, build_main, h) == 0) {
        h->build_pid = getpid();
    } else {
        build_finish(h);
    }
    return NVH_OK;
}

/* Close: stop the background build (the heap is about to be freed). A
 * forked child has no copy of the thread: only its creator joins it. */
void nvh_named_stop(nvh_heap *h)
{
    if (h->build_pid == 0) return;
    if (h->build_pid == getpid()) {
        atomic_store_explicit(&h->build_stop, true, memory_order_relaxed);
        pthread_join(h->build_thread, NULL);
    }
    h->build_pid = 0;
}

static nvh_named_pending *pending_find(nvh_heap *h, const char *name)
{
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && strcmp(h->pending[i].name, name) == 0) return &h->pending[i];
    return NULL;
}

void nvh_named_drop_pending(nvh_heap *h, uint64_t off)
{
    named_lock(h);
    for (size_t i = 0; i < h->npending; i++)
        if (h->pending[i].used && h->pending[i].obj == off) {
            h->pending[i].used = false;
            slot_release(h, h->pending[i].slot);
        }
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
    named_lock(h);
    void *p = NULL;
    uint64_t obj;
    /* before the index is complete: absent as a lookup proves it (table_find
     * completes the index when the chains cannot), placed without it where
     * that can be done (table_insert_slot) */
    int64_t found = table_find(h, name, &obj);
    if (found == -2) goto out;
    if (found >= 0 || pending_find(h, name)) {
        nvh_fail(NVH_E_EXISTS, "an object named '%s' exists", name);
        goto out;
    }
    int64_t slot = table_insert_slot(h, name);
    if (slot == -2) {
        build_finish(h);
        slot = table_insert_slot(h, name);
    }
    if (slot < 0) goto out;
    nvh_named_pending *pe = NULL;
    for (size_t i = 0; i < h->npending; i++)
        if (!h->pending[i].used) { pe = &h->pending[i]; break; }
    if (!pe) {
        if (h->npending == h->pending_cap) {
            size_t cap = h->pending_cap ? h->pending_cap * 2 : 8;
            nvh_named_pending *g = realloc(h->pending, cap * sizeof *g);
            if (!g) { slot_release(h, (uint32_t)slot); nvh_fail(NVH_E_NOMEM, "out of memory"); goto out; }
            h->pending = g;
            h->pending_cap = cap;
        }
        pe = &h->pending[h->npending++];
    }
    p = nvh_reserve(pool, size);
    if (!p) { pe->used = false; slot_release(h, (uint32_t)slot); goto out; }
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
    named_lock(h);
    nvh_named_pending *pe = pending_find(h, name);
    if (!pe) {
        rc = nvh_fail(NVH_E_NOTFOUND, "no reservation named '%s'", name);
        goto out;
    }
    chain_seal(h, pe->name, pe->slot);
    /* the name travels inside the redo record; the entry (name, then the
     * committing offset) is written by the record's effects */
    rc = nvh_activate_off_(h, pe->obj, NULL, 0, pe->slot);
    if (rc == NVH_OK) {
        pe->used = false;
        /* committed: a failure here leaves only a lookup miss until the
         * next open, which rebuilds both from the tables. A slot the build
         * has not reached yet is indexed when it gets there. */
        nset_add(h, pe->obj);
        if (slot_indexed(h, pe->slot)) nidx_put(h, pe->slot + 1, name_hash(pe->name));
    }
out:
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

void *nvh_get_named(nvh_pool *pool, const char *name, size_t *size_out)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h || check_name(name) != NVH_OK) return NULL;
    named_lock(h);
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
    named_lock(h);
    uint64_t off = 0;
    int64_t slot = table_find(h, name, &off);
    if (slot == -2) rc = nvh_errcode();
    else if (slot < 0) rc = nvh_fail(NVH_E_NOTFOUND, "no object named '%s'", name);
    else {
        rc = nvh_free_off_(h, off, NULL, 0, slot);
        if (rc == NVH_OK) nset_del(h, off);
        if (rc == NVH_OK && slot_indexed(h, (uint32_t)slot)) {
            nidx_del(h, (uint32_t)slot + 1, name_hash(name));
            slot_release(h, (uint32_t)slot);     /* now a tombstone: free */
        }
    }
    pthread_mutex_unlock(&h->named_lock);
    return rc;
}

int nvh_named_foreach(nvh_pool *pool, nvh_named_fn fn, void *arg)
{
    nvh_heap *h = named_heap(pool, false);
    if (!h) return nvh_errcode();
    if (!fn) return nvh_fail(NVH_E_INVAL, "callback is NULL");
    if (h->named_dir_bad) return dir_fail(h);
    int64_t damaged = -1;
    for (uint32_t i = 0;; i++) {
        char name[56];
        named_lock(h);
        if (i >= slots_cap(h)) {
            pthread_mutex_unlock(&h->named_lock);
            break;
        }
        struct nvh_named_entry *e = nvh_named_entry_at(h, i);
        uint64_t w = atomic_load(&e->off), off = 0;
        memcpy(name, e->name, sizeof name);
        bool ok = w > NVH_NAMED_TOMB && entry_ok(h, e, i, w, &off);
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
    named_lock(h);
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
