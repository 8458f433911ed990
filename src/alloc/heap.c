/* heap.c — the heap as a whole: format at pool create, open-time recovery
 * (which only replays the bounded redo rings: constant time), close; the
 * chunk layer (high-water mark, pool growth, huge free-chunk list) and the
 * lazy rebuild of DRAM free-space state by scanning one chunk at a time.
 *
 * Heap area layout (offsets from the pool base; heap_off from the superblock):
 *   heap_off + 0      heap header (immutable, CRC)
 *   heap_off + 64     heap state: high-water mark (one self-checking word)
 *   heap_off + 128    object-table directory: payload offsets of tables 1..14
 *   heap_off + 512    chunk-full map (NVH_FULLMAP_OFF)
 *   heap_off + 4096   object table 0: NVH_NAMED_CAP x 64 B entries
 *   rings_off         NVH_RINGS ring headers (64 B each), then the ring bodies
 *   zone0_off         header slots of zone 0's chunks (64 B per block)
 *   chunks_off        chunk 0, chunk 1, ... (64 KiB aligned); chunk zone0 and
 *                     every 65th after it is a header chunk holding the
 *                     region headers of the 64 data chunks after it (alloc.h)
 */
#include "alloc.h"
#include "../pool/pool.h"   /* nvh_superblock_set_flags, nvh_pool_populate_ */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ==========================================================================
 * Helpers
 * ========================================================================== */
static uint32_t heap_hdr_checksum(const struct nvh_heap_hdr *hh)
{
    return nvh_crc32c(0, hh, offsetof(struct nvh_heap_hdr, checksum));
}

static uint64_t env_chunk_size(void)
{
    const char *e = getenv("NVHEAP_CHUNK_SIZE");
    if (e && *e) {
        unsigned long long v = strtoull(e, NULL, 0);
        if (v >= NVH_CHUNK_MIN && v <= NVH_CHUNK_MAX && (v & (v - 1)) == 0) return v;
    }
    return NVH_CHUNK_DEFAULT;
}

static bool all_zero(const void *p, size_t len)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < len; i++)
        if (c[i]) return false;
    return true;
}

/* ==========================================================================
 * Format
 * ========================================================================== */
static int heap_format(nvh_pool *pool, uint64_t heap_off)
{
    char *base = pool->ctx.base;
    uint64_t size = nvh_pool_size(pool);
    struct nvh_heap_hdr hh;
    memset(&hh, 0, sizeof hh);
    memcpy(hh.magic, NVH_HEAP_MAGIC, 8);
    hh.version = NVH_HEAP_VERSION;
    hh.hdr_size = sizeof hh;
    hh.chunk_size = env_chunk_size();
    hh.table_off = heap_off + 4096;
    hh.table_cap = NVH_NAMED_CAP;
    hh.rings_off = hh.table_off + (uint64_t)NVH_NAMED_CAP * 64;
    hh.rings = NVH_RINGS;
    hh.ring_lines = NVH_RING_LINES;
    /* zone 0: as many chunks as the pool holds now, so a small
     * pool pays only their header slots (chunk_size / 64 per chunk); the
     * chunks past it are zoned by header chunks */
    uint64_t z0off = nvh_zone0_off(&hh), slots = hh.chunk_size / 64;
    uint64_t fit = size > z0off + ((uint64_t)64 << 10)
                       ? (size - z0off - ((uint64_t)64 << 10)) / (hh.chunk_size + slots) : 0;
    hh.zone0_chunks = (uint32_t)(fit < 1 ? 1 : fit > NVH_ZONE0_MAX ? NVH_ZONE0_MAX : fit);
    uint64_t end = z0off + hh.zone0_chunks * slots;
    hh.chunks_off = NVH_ALIGN_UP(end, (uint64_t)64 << 10);
    if (hh.chunks_off > size)
        return nvh_fail(NVH_E_NOSPACE, "pool %s is too small for the heap metadata "
                        "(%llu bytes needed)", pool->path, (unsigned long long)hh.chunks_off);
    hh.checksum = heap_hdr_checksum(&hh);

    /* Everything but the header first (the file is fresh: zero), then the
     * header: a crash in between leaves a zero header, which open formats
     * (the superblock does not say NVH_STATE_HEAP yet). */
    memset(base + heap_off + 64, 0, 64);
    uint64_t hwm0 = nvh_hwm_word(0);
    memcpy(base + heap_off + 64, &hwm0, sizeof hwm0);
    nvh_flush(pool, base + heap_off + 64, 64);
    memset(base + hh.table_off, 0, (size_t)NVH_NAMED_CAP * 64);
    nvh_flush(pool, base + hh.table_off, (size_t)NVH_NAMED_CAP * 64);
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        struct nvh_ring_hdr *rh = (struct nvh_ring_hdr *)(base + hh.rings_off + i * 64u);
        memset(rh, 0, sizeof *rh);
        rh->magic = NVH_RING_MAGIC;
        rh->index = i;
        atomic_store_explicit(&rh->watermark, nvh_wm_word(0), memory_order_relaxed);
        nvh_flush(pool, rh, sizeof *rh);
    }
    char *body = base + hh.rings_off + NVH_RINGS * 64u;
    memset(body, 0, (size_t)NVH_RINGS * NVH_RING_LINES * 64);
    nvh_flush(pool, body, (size_t)NVH_RINGS * NVH_RING_LINES * 64);
    /* the header without its magic, fence, then the magic (one 8-byte
     * store): a crash leaves either a zero magic (open formats again) or a
     * complete header */
    memcpy(base + heap_off + 8, (char *)&hh + 8, sizeof hh - 8);
    nvh_flush(pool, base + heap_off, sizeof hh);
    nvh_drain(pool);
    uint64_t magic;
    memcpy(&magic, hh.magic, 8);
    __atomic_store_n((uint64_t *)(void *)(base + heap_off), magic, __ATOMIC_RELAXED);
    nvh_persist(pool, base + heap_off, sizeof hh);
    /* From here on a heap header that is not valid is damage: the superblock
     * (checksummed, two slots) remembers that the heap exists. The state slot
     * rides on the next fence, which the first allocation's record issues
     * before any object is live: a crash before it leaves a complete header
     * without the flag, which open accepts and records with its epoch
     * commit. (No fence of its own: format keeps its two.) */
    return nvh_superblock_set_flags(pool, NVH_STATE_HEAP);
}

static int heap_validate(nvh_pool *pool, const struct nvh_heap_hdr *hh, uint64_t heap_off)
{
    uint64_t size = nvh_pool_size(pool);
    if (memcmp(hh->magic, NVH_HEAP_MAGIC, 8) != 0)
        return nvh_fail(NVH_E_CORRUPT, "%s: heap header has a bad magic", pool->path);
    if (hh->checksum != heap_hdr_checksum(hh))
        return nvh_fail(NVH_E_CHECKSUM, "%s: heap header checksum mismatch", pool->path);
    if (hh->version > NVH_HEAP_VERSION)
        return nvh_fail(NVH_E_VERSION, "%s: heap format version %u is newer than %u",
                        pool->path, hh->version, NVH_HEAP_VERSION);
    uint64_t cs = hh->chunk_size;
    if (hh->hdr_size != sizeof *hh || cs < NVH_CHUNK_MIN || cs > NVH_CHUNK_MAX ||
        (cs & (cs - 1)) || hh->table_off != heap_off + 4096 ||
        hh->table_cap != NVH_NAMED_CAP || hh->rings != NVH_RINGS ||
        hh->ring_lines != NVH_RING_LINES ||
        hh->rings_off != hh->table_off + (uint64_t)NVH_NAMED_CAP * 64 ||
        hh->zone0_chunks < 1 || hh->zone0_chunks > NVH_ZONE0_MAX ||
        hh->chunks_off < nvh_zone0_off(hh) + hh->zone0_chunks * (cs / 64) ||
        hh->chunks_off % NVH_BLOCK || hh->chunks_off > size)
        return nvh_fail(NVH_E_CORRUPT, "%s: heap header describes an impossible layout",
                        pool->path);
    return NVH_OK;
}

/* ==========================================================================
 * Open / close
 * ========================================================================== */
/* The per-chunk and per-block tables are sized by the reservable heap (the
 * growth limit) but cost only what the pool uses: anonymous mappings whose
 * untouched pages are never materialised, and whose "nothing here" value is
 * zero (owner[] holds arena + 1), so opening a pool writes none of them.
 * (calloc would do for the first open, but once glibc raised its mmap
 * threshold it serves such sizes from recycled memory it must clear.) */
static void *table_map(uint64_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void table_unmap(void *p, uint64_t bytes)
{
    if (p) munmap(p, bytes ? bytes : 1);
}

static void heap_free(nvh_heap *h)
{
    if (!h) return;
    nvh_named_stop(h);          /* its thread reads the heap: stop it first */
    for (unsigned i = 0; i < NVH_RINGS; i++) nvh_arena_fini(&h->arenas[i]);
    if (h->chunks) {
        /* only chunks inside the pool ever got DRAM state */
        uint64_t n = nvh_chunks_mapped(h, nvh_pool_size(h->pool));
        for (uint64_t c = 0; c < n; c++) {
            nvh_chunk *ch = &h->chunks[c];
            if (ch->runs) {
                /* every block of a run points at it: free it at its first
                 * block and skip the others (they point at freed memory) */
                for (uint64_t b = 0; b < h->bpc;) {
                    nvh_run *run = ch->runs[b];
                    bool first = run && run->block == c * h->bpc + b;
                    b += first ? run->blocks : 1;
                    if (first) free(run);
                }
                free(ch->runs);
            }
        }
        table_unmap(h->chunks, h->max_chunks * sizeof *h->chunks);
    }
    table_unmap(h->pview, (h->max_chunks * h->bpc) * sizeof(uint32_t));
    table_unmap((void *)h->owner, h->max_chunks * sizeof *h->owner);
    free(h->huge);
    free(h->pending);
    nvh_named_fini(h);
    free(h->quar);
    pthread_mutex_destroy(&h->lock);
    pthread_mutex_destroy(&h->named_lock);
    pthread_mutex_destroy(&h->quar_lock);
    free(h);
}

static unsigned default_arenas(void)
{
    const char *e = getenv("NVHEAP_ARENAS");
    if (e && *e) {
        long v = strtol(e, NULL, 0);
        if (v >= 1 && v <= (long)NVH_RINGS) return (unsigned)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > (long)NVH_RINGS) n = NVH_RINGS;
    return (unsigned)n;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *e = getenv(name);
    if (e && *e) return strtoull(e, NULL, 0);
    return dflt;
}

/* Open the heap of a pool. A pool whose heap was never used (zero header)
 * gets its heap formatted lazily, by the first allocator call (create=true
 * from nvh_heap_get_), so pools that never allocate stay untouched. */
static int heap_open_locked(nvh_pool *pool, bool create);
static void fullmap_set(nvh_heap *h, uint64_t c);
static bool chunk_blocks_full(nvh_heap *h, uint64_t c);

/* Format and recovery store all over the heap's metadata once: the
 * implicit window (cold path), in case protection is already on (a heap
 * formatted lazily by the first allocation of a protected pool). */
int nvh_heap_open_(nvh_pool *pool, bool create)
{
    nvh_protect_internal_begin(pool);
    int rc = heap_open_locked(pool, create);
    nvh_protect_internal_end(pool);
    return rc;
}

static int heap_open_locked(nvh_pool *pool, bool create)
{
    char *base = pool->ctx.base;
    uint64_t heap_off = pool->sb->header.heap_offset;
    struct nvh_heap_hdr *hh = (struct nvh_heap_hdr *)(base + heap_off);
    if (heap_off + 4096 > nvh_pool_size(pool)) {
        if (!create) return NVH_OK;
        return nvh_fail(NVH_E_NOSPACE, "%s: no room for a heap", pool->path);
    }
    bool formatted = (pool->state_flags & NVH_STATE_HEAP) != 0, fresh = false;
    if (all_zero(hh->magic, sizeof hh->magic)) {
        /* never format over a heap the superblock says exists: its header
         * was zeroed by damage, and the objects behind it are live */
        if (formatted)
            return nvh_fail(NVH_E_CORRUPT, "%s: heap header at offset %llu is zeroed, but the "
                            "superblock says the heap was formatted", pool->path,
                            (unsigned long long)heap_off);
        if (!create || pool->readonly) return NVH_OK;  /* no heap yet */
        int rc = heap_format(pool, heap_off);
        if (rc != NVH_OK) return rc;
        fresh = true;
    }
    int rc = heap_validate(pool, hh, heap_off);
    if (rc != NVH_OK) return rc;
    /* a valid header whose flag a crash kept from the superblock: the
     * open's epoch commit (or the next state commit) records it */
    if (!formatted && !pool->readonly) pool->state_flags |= NVH_STATE_HEAP;
    uint64_t hwm_w = atomic_load_explicit(
        (_Atomic uint64_t *)&((struct nvh_heap_state *)(base + heap_off + 64))->hwm_word,
        memory_order_relaxed);
    uint64_t hwm0;
    if (!nvh_hwm_decode(hwm_w, &hwm0))
        return nvh_fail(NVH_E_CORRUPT, "%s: heap high-water mark at offset %llu fails its check "
                        "(word %016llx)", pool->path, (unsigned long long)(heap_off + 64),
                        (unsigned long long)hwm_w);
    if (hwm0 > (nvh_pool_size(pool) - hh->chunks_off) / hh->chunk_size)
        return nvh_fail(NVH_E_CORRUPT, "%s: heap high-water mark at offset %llu says %llu chunks, "
                        "more than the pool holds", pool->path,
                        (unsigned long long)(heap_off + 64), (unsigned long long)hwm0);

    /* a zeroed watermark would replay every stale record of its ring over
     * newer headers (recovery), or hide pending ones (read-only checks) */
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        const struct nvh_ring_hdr *rh =
            (const struct nvh_ring_hdr *)(base + hh->rings_off + i * 64u);
        uint64_t wm;
        if (!nvh_wm_decode(atomic_load_explicit(&((struct nvh_ring_hdr *)rh)->watermark,
                                                memory_order_relaxed), &wm))
            return nvh_fail(NVH_E_CORRUPT, "%s: redo ring %u: the watermark at offset %llu "
                            "fails its check", pool->path, i,
                            (unsigned long long)(hh->rings_off + i * 64u));
    }
    nvh_heap *h = calloc(1, sizeof *h);
    if (!h) return nvh_fail(NVH_E_NOMEM, "out of memory for the heap of %s", pool->path);
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_init(&h->named_lock, NULL);
    pthread_mutex_init(&h->quar_lock, NULL);
    h->pool = pool;
    h->base = base;
    h->heap_off = heap_off;
    h->hdr = hh;
    h->state = (struct nvh_heap_state *)(base + heap_off + 64);
    h->table = (struct nvh_named_entry *)(base + hh->table_off);
    h->ring_hdr = (struct nvh_ring_hdr *)(base + hh->rings_off);
    h->ring_body = base + hh->rings_off + NVH_RINGS * 64u;
    h->chunk_size = hh->chunk_size;
    h->bpc = hh->chunk_size / NVH_BLOCK;
    h->bpc_shift = (unsigned)__builtin_ctzll(h->bpc);   /* chunk size is a power of 2 */
    h->chunks_off = hh->chunks_off;
    h->zone0 = hh->zone0_chunks;
    h->zone0_off = nvh_zone0_off(hh);
    uint64_t max = pool->max_size > nvh_pool_size(pool) ? pool->max_size : nvh_pool_size(pool);
    h->max_chunks = max > h->chunks_off ? (max - h->chunks_off) / h->chunk_size : 0;
    if (h->max_chunks == 0) h->max_chunks = 1;
    /* per chunk, and one u32 per block, of the whole reservable heap, all
     * zero = empty (table_map) */
    h->chunks = table_map(h->max_chunks * sizeof *h->chunks);
    h->owner = table_map(h->max_chunks * sizeof *h->owner);
    h->pview = table_map(h->max_chunks * h->bpc * sizeof(uint32_t));
    if (!h->chunks || !h->owner || !h->pview) {
        heap_free(h);
        return nvh_fail(NVH_E_NOMEM, "out of memory for the heap of %s", pool->path);
    }
    for (unsigned i = 0; i < NVH_RINGS; i++) nvh_arena_init(h, &h->arenas[i], i);
    atomic_init(&h->narenas, default_arenas());
    atomic_init(&h->fifo_delay_ns, env_u64("NVHEAP_FIFO_DELAY_NS", 0));
    atomic_init(&h->fifo_max_bytes, env_u64("NVHEAP_FIFO_MAX_BYTES", (uint64_t)64 << 20));
    h->hwm = hwm0 < h->max_chunks ? hwm0 : h->max_chunks;
    if (!pool->readonly) {
        rc = nvh_redo_recover(h);
        if (rc != NVH_OK) {
            heap_free(h);
            return rc;
        }
    }
    /* recovery may have raised the persistent high-water mark */
    uint64_t hw = 0;
    if (nvh_hwm_decode(atomic_load_explicit((_Atomic uint64_t *)&h->state->hwm_word,
                                            memory_order_relaxed), &hw) && hw > h->hwm)
        h->hwm = hw < h->max_chunks ? hw : h->max_chunks;
    /* this session's epoch: open commits pool->epoch + 1 after the layers
     * (create = false); a heap formatted later finds it committed */
    uint64_t epoch = pool->readonly || create ? pool->epoch : pool->epoch + 1;
    rc = nvh_named_open(h, fresh, pool->epoch, epoch);
    if (rc != NVH_OK) {
        heap_free(h);
        return rc;
    }
    __atomic_store_n(&pool->heap, h, __ATOMIC_RELEASE);
    return NVH_OK;
}

/* The heap of a pool, formatting it on first use. */
nvh_heap *nvh_heap_get_(nvh_pool *pool)
{
    /* the pool's own lock, not a global one: crash-simulator children are
     * forked at fences (possibly inside the format) and open other pools */
    nvh_heap *h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    if (h) return h;
    if (pool->readonly) {
        nvh_fail(NVH_E_NOTSUP, "pool %s has no heap (and is open read-only)", pool->path);
        return NULL;
    }
    pthread_mutex_lock(&pool->grow_lock);
    h = __atomic_load_n(&pool->heap, __ATOMIC_ACQUIRE);
    if (!h && nvh_heap_open_(pool, true) == NVH_OK) h = pool->heap;
    pthread_mutex_unlock(&pool->grow_lock);
    return h;
}

/* Quiesce (clean close): retire every ring so the media holds all effects,
 * and mark the chunks this session filled in the chunk-full map, so the
 * next session's first allocations go straight to chunks with room. */
void nvh_heap_quiesce_(nvh_pool *pool)
{
    nvh_heap *h = pool->heap;
    if (!h || pool->readonly) return;
    nvh_redo_retire_all(h);
    uint64_t n = h->hwm < NVH_FULLMAP_CHUNKS ? h->hwm : NVH_FULLMAP_CHUNKS;
    /* chunks with free space in some arena's lists, in one pass over them
     * (the pool is closing: no other thread allocates) */
    uint64_t *space = calloc((n + 63) / 64 + 1, sizeof *space);
    if (!space) return;             /* the marks are only a hint */
    for (unsigned i = 0; i < NVH_RINGS; i++) {
        nvh_arena *a = &h->arenas[i];
        nvh_alock_lock(&a->lock);
        for (size_t k = 0; k < a->next; k++)
            for (uint64_t c = a->ext[k].block >> h->bpc_shift;
                 c < n && c <= (a->ext[k].block + a->ext[k].nblocks - 1) >> h->bpc_shift; c++)
                space[c / 64] |= 1ull << (c % 64);
        for (size_t k = 0; k < a->nresv; k++) {
            uint64_t c = a->resv[k].block >> h->bpc_shift;
            if (c < n) space[c / 64] |= 1ull << (c % 64);
        }
        for (size_t k = 0; k < a->fifo_len; k++) {
            const nvh_fifo_entry *e = &a->fifo[(a->fifo_head + k) & (a->fifo_cap - 1)];
            uint64_t c = e->off >> h->bpc_shift;
            if (e->nblocks && c < n) space[c / 64] |= 1ull << (c % 64);
        }
        nvh_alock_unlock(&a->lock);
    }
    bool marked = false;
    pthread_mutex_lock(&h->lock);
    for (uint64_t c = 0; c < n; c++) {
        nvh_chunk *ch = &h->chunks[c];
        if ((space[c / 64] >> (c % 64)) & 1) continue;
        if (nvh_owner_get(h, c, memory_order_acquire) < 0 || !ch->arena_chunk ||
            !ch->runs || atomic_load(&ch->full_mark) ||
            !__atomic_load_n(&ch->scanned, __ATOMIC_ACQUIRE))
            continue;
        if (chunk_blocks_full(h, c)) {
            fullmap_set(h, c);
            marked = true;
        }
    }
    pthread_mutex_unlock(&h->lock);
    free(space);
    if (marked) nvh_drain(pool);
}

void nvh_heap_close_(nvh_pool *pool)
{
    nvh_heap *h = pool->heap;
    if (!h) return;
    nvh_tcache_detach_all(h);   /* thread caches must not outlive the heap */
    pool->heap = NULL;
    heap_free(h);
}

/* ==========================================================================
 * Persistent tiling view (DRAM): pview[b] = length of the region starting at
 * block b as the media will have it once all applied records are durable.
 * ========================================================================== */
void nvh_pview_set(nvh_heap *h, uint64_t block, uint64_t nblocks)
{
    h->pview[block] = (uint32_t)nblocks;
}

/* The persistent region containing `block`: returns its start and length,
 * or UINT64_MAX if none (never-formatted space). Arena regions never cross a
 * chunk end; huge regions start at chunk starts. */
uint64_t nvh_pview_containing(nvh_heap *h, uint64_t block, uint64_t *len_out)
{
    uint64_t chunk = nvh_chunk_of_block(h, block);
    uint64_t c0 = chunk * h->bpc;
    for (uint64_t b = block + 1; b-- > c0;) {
        if (h->pview[b]) {
            if (b + h->pview[b] > block) { *len_out = h->pview[b]; return b; }
            return UINT64_MAX;
        }
    }
    if (h->chunks[chunk].arena_chunk) return UINT64_MAX;
    for (uint64_t c = chunk; c-- > 0;) {
        uint64_t b = c * h->bpc;
        if (h->chunks[c].arena_chunk) return UINT64_MAX;
        if (h->pview[b]) {
            if (b + h->pview[b] > block) { *len_out = h->pview[b]; return b; }
            return UINT64_MAX;
        }
    }
    return UINT64_MAX;
}

/* ==========================================================================
 * Chunks
 * ========================================================================== */
nvh_chunk *nvh_chunk_get(nvh_heap *h, uint64_t chunk)
{
    nvh_chunk *ch = &h->chunks[chunk];
    if (!ch->runs) {
        /* published with a release store: run_lookup reads it without a lock */
        nvh_run **runs = calloc(h->bpc, sizeof *runs);
        if (!runs) return NULL;
        __atomic_store_n(&ch->runs, runs, __ATOMIC_RELEASE);
    }
    return ch;
}

/* Make the pool large enough for `chunks` chunks (grows geometrically). */
int nvh_heap_ensure_size(nvh_heap *h, uint64_t chunks)
{
    nvh_pool *pool = h->pool;
    uint64_t need = h->chunks_off + chunks * h->chunk_size;
    uint64_t size = nvh_pool_size(pool);
    if (need <= size) return NVH_OK;
    if (chunks > h->max_chunks || need > pool->max_size)
        return nvh_fail(NVH_E_NOSPACE, "pool %s is full: %llu bytes needed, maximum size %llu",
                        pool->path, (unsigned long long)need,
                        (unsigned long long)pool->max_size);
    uint64_t want = size + size / 2;
    if (want < need) want = need;
    if (want > pool->max_size) want = pool->max_size;
    want = NVH_ALIGN_DOWN(want - h->chunks_off, h->chunk_size) + h->chunks_off;
    if (want < need) want = need;
    int rc = nvh_pool_grow(pool, want);
    if (rc != NVH_OK && want > need) rc = nvh_pool_grow(pool, need);
    if (rc != NVH_OK)
        return nvh_fail(NVH_E_NOSPACE, "pool %s is full and cannot grow to %llu bytes: %s",
                        pool->path, (unsigned long long)need, nvh_errormsg());
    return NVH_OK;
}

/* Raise the persistent high-water mark. A single 8-byte word: never torn.
 * From apply: flushed at the ring's retire (dirty list); else persisted. */
void nvh_hwm_raise(nvh_heap *h, uint64_t chunks, bool from_apply)
{
    _Atomic uint64_t *w = (_Atomic uint64_t *)&h->state->hwm_word;
    uint64_t cur = atomic_load_explicit(w, memory_order_relaxed), cc;
    if (nvh_hwm_decode(cur, &cc) && cc >= chunks) {
        if (!from_apply) nvh_flush(h->pool, w, 8);
        return;
    }
    if (!nvh_hwm_decode(cur, &cc)) {
        /* damaged since open: rewritten from this session's mark */
        uint64_t dram = __atomic_load_n(&h->hwm, __ATOMIC_ACQUIRE);
        if (dram > chunks && dram <= h->max_chunks) chunks = dram;
    }
    nvh_wopen(h, w, 8);
    while ((!nvh_hwm_decode(cur, &cc) || cc < chunks) &&
           !atomic_compare_exchange_weak_explicit(w, &cur, nvh_hwm_word(chunks),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    nvh_wclose(h, w, 8);
    if (!from_apply) nvh_flush(h->pool, w, 8);
}

/* Insert a free chunk extent into the huge list (sorted, merged). Caller
 * holds h->lock. */
static void huge_put_locked(nvh_heap *h, uint64_t chunk, uint64_t n)
{
    size_t i = 0;
    while (i < h->nhuge && h->huge[i].block < chunk) i++;
    if (i > 0 && h->huge[i - 1].block + h->huge[i - 1].nblocks == chunk) {
        h->huge[i - 1].nblocks += n;
        if (i < h->nhuge && chunk + n == h->huge[i].block) {
            h->huge[i - 1].nblocks += h->huge[i].nblocks;
            memmove(&h->huge[i], &h->huge[i + 1], (h->nhuge - i - 1) * sizeof *h->huge);
            h->nhuge--;
        }
        return;
    }
    if (i < h->nhuge && chunk + n == h->huge[i].block) {
        h->huge[i].block = chunk;
        h->huge[i].nblocks += n;
        return;
    }
    if (h->nhuge == h->huge_cap) {
        size_t cap = h->huge_cap ? h->huge_cap * 2 : 16;
        nvh_extent *g = realloc(h->huge, cap * sizeof *g);
        if (!g) return;            /* lose track of it (leak in DRAM only) */
        h->huge = g;
        h->huge_cap = cap;
    }
    memmove(&h->huge[i + 1], &h->huge[i], (h->nhuge - i) * sizeof *h->huge);
    h->huge[i] = (nvh_extent){chunk, n};
    h->nhuge++;
}

void nvh_huge_put(nvh_heap *h, uint64_t chunk, uint64_t nchunks)
{
    pthread_mutex_lock(&h->lock);
    huge_put_locked(h, chunk, nchunks);
    pthread_mutex_unlock(&h->lock);
}

/* Find nchunks contiguous chunks: first fit from the free list (taking the
 * start of an extent; *rem_out = chunks left in it), else, if `fresh`, fresh
 * chunks above the high-water mark (*rem_out = UINT64_MAX: no header lies
 * in them). */
int nvh_huge_take(nvh_heap *h, uint64_t nchunks, uint64_t *chunk_out, uint64_t *rem_out,
                  bool fresh)
{
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->nhuge; i++) {
        if (h->huge[i].nblocks >= nchunks) {
            *chunk_out = h->huge[i].block;
            *rem_out = h->huge[i].nblocks - nchunks;
            h->huge[i].block += nchunks;
            h->huge[i].nblocks -= nchunks;
            if (h->huge[i].nblocks == 0) {
                memmove(&h->huge[i], &h->huge[i + 1], (h->nhuge - i - 1) * sizeof *h->huge);
                h->nhuge--;
            }
            pthread_mutex_unlock(&h->lock);
            return NVH_OK;
        }
    }
    /* fresh chunks: only once the caller has looked everywhere else (its
     * FIFO, the unscanned chunks: reserve.c, reserve_huge) */
    if (!fresh) {
        pthread_mutex_unlock(&h->lock);
        return NVH_E_NOSPACE;
    }
    uint64_t c = h->hwm, gap = 0;
    if (nvh_chunk_is_hdr(h, c)) c++;
    if (!nvh_chunks_data(h, c, nchunks)) {
        /* the zone's data chunks left are too few: they become a free huge
         * region, and the object starts after the next header chunk */
        uint64_t next = nvh_next_hdr_chunk(h, c);
        if (nchunks > NVH_ZONE_DATA) {  /* only zone 0 holds it, and it is full */
            pthread_mutex_unlock(&h->lock);
            return nvh_fail(NVH_E_NOSPACE, "pool %s: no room for %llu contiguous chunks in "
                            "zone 0, and a later zone holds at most %u", h->pool->path,
                            (unsigned long long)nchunks, NVH_ZONE_DATA);
        }
        gap = next - c;
        c = next + 1;
    }
    int rc = nvh_heap_ensure_size(h, c + nchunks);
    if (rc == NVH_OK && gap) {
        uint64_t g = c - 1 - gap, gb = g * h->bpc;
        nvh_rhdr_write(h, gb, (uint32_t)(gap * h->bpc), NVH_RS_FREE, NVH_RK_HUGE, 0, 0, 0);
        nvh_persist(h->pool, nvh_rhdr_at(h, gb), 64);
        nvh_pview_set(h, gb, gap * h->bpc);
        for (uint64_t i = 0; i < gap; i++)
            __atomic_store_n(&h->chunks[g + i].scanned, true, __ATOMIC_RELEASE);
        /* the gap is free space from now on, whatever becomes of this
         * reservation: below the persistent mark (its header is durable),
         * so objects later placed in it are never above the mark */
        nvh_hwm_raise(h, g + gap, false);
        nvh_drain(h->pool);
        huge_put_locked(h, g, gap);
    }
    if (rc == NVH_OK) {
        /* Every chunk below any high-water mark starts with a valid header
         * or lies inside a region that does, so a zero chunk header there is
         * damage, not "never formatted" (scan_step). The fresh chunks get a
         * free huge header, durable before the mark can pass them (another
         * activation may raise the persistent mark over them while this
         * reservation is pending); its activation overwrites it. */
        uint64_t b = c * h->bpc;
        nvh_rhdr_write(h, b, (uint32_t)(nchunks * h->bpc), NVH_RS_FREE, NVH_RK_HUGE, 0, 0, 0);
        nvh_persist(h->pool, nvh_rhdr_at(h, b), 64);
        nvh_pview_set(h, b, nchunks * h->bpc);
        __atomic_store_n(&h->hwm, c + nchunks, __ATOMIC_RELEASE);
        for (uint64_t i = 0; i < nchunks; i++)
            __atomic_store_n(&h->chunks[c + i].scanned, true, __ATOMIC_RELEASE);
        *chunk_out = c;
        *rem_out = UINT64_MAX;
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* ==========================================================================
 * Lazy rebuild: scan chunk `c` (an arena chunk: its first header is a
 * non-huge region) into arena `a`. Caller holds a->lock and h->lock.
 * ========================================================================== */
static uint64_t next_valid_nonfree(nvh_heap *h, uint64_t b, uint64_t end)
{
    for (; b < end; b++) {
        if (nvh_rhdr_valid(h, b) && nvh_rhdr_at(h, b)->state != NVH_RS_FREE) return b;
    }
    return end;
}

static void fullmap_set(nvh_heap *h, uint64_t c);

/* A run's header is sound: class and blocks in range, the slots its
 * geometry gives, and the run inside the chunk (end = the chunk's end). */
static bool run_hdr_sound(const struct nvh_rhdr *r, uint64_t b, uint64_t end)
{
    return nvh_cls_valid(r->cls) && r->blocks >= 1 &&
           r->blocks <= NVH_RUN_BLOCKS_MAX && r->nslots == nvh_run_slots(r->cls, r->blocks) &&
           b + r->blocks <= end;
}

/* The DRAM descriptor of the run at b (header r, sound), published for
 * every block of it and put in a's bin if a slot is free; NULL if out of
 * memory. */
static nvh_run *scan_run(nvh_heap *h, nvh_arena *a, nvh_chunk *ch, uint64_t b,
                         const struct nvh_rhdr *r)
{
    nvh_run *run = nvh_bin_room(a, r->cls) ? calloc(1, sizeof *run) : NULL;
    if (!run) return NULL;
    uint64_t mask = r->nslots == 64 ? ~0ull : (1ull << r->nslots) - 1;
    run->block = b;
    run->cls = r->cls;
    run->nslots = r->nslots;
    run->blocks = (uint8_t)r->blocks;
    nvh_run_derive(h, run);
    run->pbits = atomic_load_explicit(&((struct nvh_rhdr *)r)->bitmap, memory_order_relaxed) & mask;
    run->avail = ~run->pbits & mask;
    run->persisted = true;
    nvh_run_publish(h, ch, run);
    if (run->avail) nvh_bin_add(a, run);
    a->nruns[run->cls]++;
    return run;
}

static void scan_arena_chunk(nvh_heap *h, nvh_arena *a, uint64_t c)
{
    nvh_chunk *ch = nvh_chunk_get(h, c);
    uint64_t b = c * h->bpc, end = b + h->bpc;
    bool full = true;           /* no free region, no free slot, no damage */
    ch->arena_chunk = true;
    while (b < end) {
        const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
        if (!nvh_rhdr_valid(h, b) || r->blocks == 0 || b + r->blocks > end ||
            r->kind == NVH_RK_HUGE) {
            nvh_corrupt_report(h, nvh_block_off(h, b), "invalid region header during scan");
            full = false;
            uint64_t q = next_valid_nonfree(h, b + 1, end);
            nvh_pview_set(h, b, q - b);
            nvh_quarantine_add(h, b, q - b);
            b = q;
            continue;
        }
        nvh_pview_set(h, b, r->blocks);
        if (r->state == NVH_RS_FREE) {
            nvh_extent_put(a, b, r->blocks);
            full = false;
        } else if (r->state == NVH_RS_QUARANTINE) {
            nvh_quarantine_add(h, b, r->blocks);
            full = false;
        } else if (r->kind == NVH_RK_RUN) {
            if (!run_hdr_sound(r, b, end)) {
                nvh_corrupt_report(h, nvh_block_off(h, b), "run header with a bad class");
                full = false;
                nvh_quarantine_add(h, b, r->blocks);
            } else {
                nvh_run *run = scan_run(h, a, ch, b, r);
                if (!run || run->avail) full = false;
            }
        }
        b += r->blocks;
    }
    nvh_owner_set(h, c, a->index, memory_order_release);
    __atomic_store_n(&ch->scanned, true, __ATOMIC_RELEASE);
    /* a full chunk is skipped by the next session's scan (it never gets
     * DRAM state, frees into it take the unscanned path) */
    if (full && !atomic_load_explicit(&ch->full_mark, memory_order_relaxed)) {
        fullmap_set(h, c);
        nvh_drain(h->pool);
    }
}

/* Process the chunk at the scan cursor. Returns 1 if it became an arena
 * chunk of `a`, 0 otherwise (huge, free, corrupt: cursor advanced). */
static int scan_step(nvh_heap *h, nvh_arena *a)
{
    uint64_t c = h->scan_next;
    uint64_t b = c * h->bpc;
    if (nvh_chunk_is_hdr(h, c)) {       /* metadata: nothing to allocate */
        h->scan_next = c + 1;
        __atomic_store_n(&h->chunks[c].scanned, true, __ATOMIC_RELEASE);
        return 0;
    }
    const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
    if (nvh_rhdr_valid(h, b) && r->blocks) {
        if (r->kind == NVH_RK_HUGE) {
            uint64_t n = (r->blocks + h->bpc - 1) / h->bpc;
            if (n == 0 || c + n > h->hwm || !nvh_chunks_data(h, c, n)) n = 1;
            for (uint64_t i = 0; i < n; i++)
                __atomic_store_n(&h->chunks[c + i].scanned, true, __ATOMIC_RELEASE);
            nvh_pview_set(h, b, r->blocks);
            if (r->state == NVH_RS_FREE) huge_put_locked(h, c, n);
            else if (r->state == NVH_RS_QUARANTINE) nvh_quarantine_add(h, b, r->blocks);
            h->scan_next = c + n;
            return 0;
        }
        h->scan_next = c + 1;
        scan_arena_chunk(h, a, c);
        return 1;
    }
    h->scan_next = c + 1;
    __atomic_store_n(&h->chunks[c].scanned, true, __ATOMIC_RELEASE);
    /* Below the high-water mark every chunk was formatted before the mark
     * passed it (nvh_chunk_claim, nvh_huge_take): a zero header here is
     * damage — the chunk may be the start of a live huge object — never a
     * free chunk. Contained below (quarantined, or resynchronised). */
    nvh_corrupt_report(h, nvh_block_off(h, b), all_zero(r, sizeof *r)
                                                  ? "zeroed header at a chunk start"
                                                  : "invalid header at a chunk start");
    uint64_t q = next_valid_nonfree(h, b + 1, b + h->bpc);
    if (q < b + h->bpc && nvh_rhdr_at(h, q)->kind != NVH_RK_HUGE) {
        /* resynchronised inside the chunk: an arena chunk with a bad first header */
        nvh_chunk *ch = nvh_chunk_get(h, c);
        ch->arena_chunk = true;
        nvh_owner_set(h, c, a->index, memory_order_relaxed);
        nvh_quarantine_add(h, b, q - b);
        nvh_pview_set(h, b, q - b);
        /* scan the rest with a temporary cursor: reuse scan_arena_chunk logic */
        uint64_t bb = q, end = b + h->bpc;
        while (bb < end) {
            const struct nvh_rhdr *x = nvh_rhdr_at(h, bb);
            if (!nvh_rhdr_valid(h, bb) || x->blocks == 0 || bb + x->blocks > end) {
                uint64_t q2 = next_valid_nonfree(h, bb + 1, end);
                nvh_quarantine_add(h, bb, q2 - bb);
                nvh_pview_set(h, bb, q2 - bb);
                bb = q2;
                continue;
            }
            nvh_pview_set(h, bb, x->blocks);
            if (x->state == NVH_RS_FREE) nvh_extent_put(a, bb, x->blocks);
            else if (x->kind == NVH_RK_RUN && x->state == NVH_RS_USED && run_hdr_sound(x, bb, end))
                (void)scan_run(h, a, ch, bb, x);
            bb += x->blocks;
        }
        __atomic_store_n(&ch->scanned, true, __ATOMIC_RELEASE);
        return 1;
    }
    nvh_quarantine_add(h, b, h->bpc);
    return 0;
}

/* Map blocks the allocator is about to carve in one system call instead of
 * one page fault per 4 KiB as allocation first touches them (128 B objects
 * would take a fault every 32 objects). Called for 16 blocks (64 KiB) at a
 * time as runs are carved, not for a whole chunk at its claim (a
 * millisecond-scale latency spike, which would make the
 * first allocation after an open cost more than the chunk scans). Only the
 * domains whose stores go straight to the mapping (the crash simulator and
 * the msync domain track pages themselves); a failure (old kernel, or
 * protected pages) only loses the saving. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
void nvh_prefault(nvh_heap *h, uint64_t block, uint64_t nblocks)
{
    nvh_domain d = (nvh_domain)h->pool->ctx.domain;
    if (d != NVH_DOMAIN_PMEM && d != NVH_DOMAIN_EADR && d != NVH_DOMAIN_PROCESS) return;
    if (h->pool->flags & NVH_POOL_PREFAULT) return;   /* mapped at open already */
    uint64_t cend = (nvh_chunk_of_block(h, block) + 1) * h->bpc;
    if (block + nblocks > cend) nblocks = cend - block;
    (void)madvise(h->base + nvh_block_off(h, block), nblocks * NVH_BLOCK, MADV_POPULATE_WRITE);
}

/* Give arena `a` a chunk: next unscanned chunk that is an arena chunk, else
 * the first chunk of a free huge extent, else a fresh chunk. Caller holds
 * a->lock. Returns NVH_E_BUSY if the rings must be retired first (the caller
 * drops its lock, calls nvh_redo_retire_all and retries). */
int nvh_chunk_claim(nvh_heap *h, nvh_arena *a, bool scan_only)
{
    pthread_mutex_lock(&h->lock);
    /* the chunk this arena claimed before is used up now, as a rule: if all
     * of it is activated, the next session need not scan it */
    if (a->last_claim) {
        uint64_t lc = a->last_claim - 1;
        a->last_claim = 0;
        if (!atomic_load_explicit(&h->chunks[lc].full_mark, memory_order_relaxed) &&
            nvh_owner_get(h, lc, memory_order_relaxed) == (int)a->index &&
            nvh_chunk_full_dram(h, a, lc))
            fullmap_set(h, lc);    /* durable at the next fence (the claim's
                                      or the record's): a lost bit only costs
                                      a scan */
    }
    /* Scan before growing: every chunk below the high-water mark that is
     * not known to be full is looked at before the pool takes a fresh one
     * (space freed by any process or arena is found). Known-full chunks
     * cost one bit test, so the first allocation after opening a full pool
     * scans only the chunks that have room. */
    while (h->scan_next < h->hwm) {
        uint64_t sc = h->scan_next;
        if (__atomic_load_n(&h->chunks[sc].scanned, __ATOMIC_ACQUIRE) ||
            nvh_fullmap_test(h, sc)) {
            /* claimed in this session, or full (a free into it clears the
             * mark and moves the cursor back: nvh_fullmap_clear) */
            h->scan_next++;
            continue;
        }
        /* Claim the chunk before reading it: frees of an unscanned chunk
         * take its owner's lock (nvh_free_off_ via nvh_owner_arena, which
         * claims an unowned chunk with the same CAS), so once the owner is
         * fixed and we hold the owner's lock, no free of this chunk is half
         * way and every earlier one happens-before the scan. (Reading an
         * unowned chunk without claiming it raced with a free that claimed
         * it meanwhile: the scan could see the freed slot and hand it out
         * before the free's record was retired — the TSan report of
         * test_alloc_threads.) */
        int own = nvh_owner_claim(h, sc, a->index);
        nvh_arena *other = own != (int)a->index ? &h->arenas[own] : NULL;
        if (other && !nvh_alock_try(&other->lock)) {
            pthread_mutex_unlock(&h->lock);
            return NVH_E_BUSY;
        }
        /* frees made into this chunk while unscanned must be retired in
         * every ring before its free space is handed out (docs/ALLOC.md §4);
         * they are all in the owner's ring, which we can retire right here */
        uint64_t fs = atomic_load_explicit(&h->chunks[sc].unscanned_free_seq,
                                           memory_order_relaxed);
        if (fs && fs >= nvh_redo_retired_before(h)) {
            nvh_arena *o = other ? other : a;
            if (atomic_load_explicit(&o->unretired_min, memory_order_relaxed) <= fs)
                nvh_redo_retire(h, o);
            if (fs >= nvh_redo_retired_before(h)) {
                if (other) nvh_alock_unlock(&other->lock);
                pthread_mutex_unlock(&h->lock);
                return NVH_E_BUSY;
            }
        }
        int got = scan_step(h, a);
        if (other) nvh_alock_unlock(&other->lock);
        if (got || scan_only) {
            if (got) a->last_claim = sc + 1;
            pthread_mutex_unlock(&h->lock);
            return NVH_OK;
        }
    }
    if (scan_only) {
        pthread_mutex_unlock(&h->lock);
        return NVH_E_NOSPACE;
    }
    uint64_t c;
    if (h->nhuge > 0) {
        /* first chunk of the first free extent; the rest keeps a header */
        nvh_extent *e = &h->huge[0];
        c = e->block;
        uint64_t n = e->nblocks;
        uint64_t b = c * h->bpc;
        uint64_t plen = 0, p = nvh_pview_containing(h, b, &plen);
        /* fence 1: the new headers of c and c+1 (both still inside the old
         * free region if p < c, so harmless until fence 2) */
        if (n > 1) {
            uint64_t end = (p != UINT64_MAX) ? p + plen : b + n * h->bpc;
            if (end > b + h->bpc) {
                nvh_rhdr_write(h, b + h->bpc, (uint32_t)(end - b - h->bpc), NVH_RS_FREE,
                               NVH_RK_HUGE, 0, 0, 0);
                nvh_flush(h->pool, nvh_rhdr_at(h, b + h->bpc), 64);
                nvh_pview_set(h, b + h->bpc, end - b - h->bpc);
            }
        } else if (p != UINT64_MAX && p + plen > b + h->bpc) {
            uint64_t end = p + plen;
            nvh_rhdr_write(h, b + h->bpc, (uint32_t)(end - b - h->bpc), NVH_RS_FREE,
                           NVH_RK_HUGE, 0, 0, 0);
            nvh_flush(h->pool, nvh_rhdr_at(h, b + h->bpc), 64);
            nvh_pview_set(h, b + h->bpc, end - b - h->bpc);
        }
        nvh_rhdr_write(h, b, (uint32_t)h->bpc, NVH_RS_FREE, NVH_RK_NONE, 0, 0, 0);
        nvh_flush(h->pool, nvh_rhdr_at(h, b), 64);
        nvh_drain(h->pool);
        if (p != UINT64_MAX && p < b) {
            nvh_rhdr_write(h, p, (uint32_t)(b - p), NVH_RS_FREE, NVH_RK_HUGE, 0, 0, 0);
            nvh_persist(h->pool, nvh_rhdr_at(h, p), 64);
            nvh_pview_set(h, p, b - p);
        }
        e->block++;
        if (--e->nblocks == 0) {
            memmove(&h->huge[0], &h->huge[1], (h->nhuge - 1) * sizeof *h->huge);
            h->nhuge--;
        }
    } else {
        c = h->hwm;
        if (nvh_chunk_is_hdr(h, c)) c++; /* the zone's header chunk: skipped */
        int rc = nvh_heap_ensure_size(h, c + 1);
        if (rc != NVH_OK) {
            pthread_mutex_unlock(&h->lock);
            return rc;
        }
        uint64_t b = c * h->bpc;
        /* header durable before the mark that makes the chunk count */
        nvh_rhdr_write(h, b, (uint32_t)h->bpc, NVH_RS_FREE, NVH_RK_NONE, 0, 0, 0);
        nvh_persist(h->pool, nvh_rhdr_at(h, b), 64);
        __atomic_store_n(&h->hwm, c + 1, __ATOMIC_RELEASE);
        nvh_hwm_raise(h, c + 1, false);
        nvh_drain(h->pool);
    }
    nvh_chunk *ch = nvh_chunk_get(h, c);
    if (!ch) {
        pthread_mutex_unlock(&h->lock);
        return nvh_fail(NVH_E_NOMEM, "out of memory for chunk metadata");
    }
    ch->arena_chunk = true;
    nvh_pview_set(h, c * h->bpc, h->bpc);
    nvh_owner_set(h, c, a->index, memory_order_release);
    __atomic_store_n(&ch->scanned, true, __ATOMIC_RELEASE);
    a->last_claim = c + 1;
    pthread_mutex_unlock(&h->lock);
    /* NVH_POOL_POPULATE: the fresh chunk is faulted in now (2 MiB pages
     * where the file system has them), outside the heap lock */
    nvh_pool_populate_(h->pool, h->base + nvh_block_off(h, c * h->bpc), h->bpc * NVH_BLOCK);
    nvh_extent_put(a, c * h->bpc, h->bpc);
    return NVH_OK;
}

/* ==========================================================================
 * Chunk-full map (alloc.h: NVH_FULLMAP_OFF)
 * ========================================================================== */
static inline _Atomic uint64_t *fullmap_word(nvh_heap *h, uint64_t c)
{
    return (_Atomic uint64_t *)(h->base + h->heap_off + NVH_FULLMAP_OFF) + c / 64;
}

/* Chunk c's bit on the media (the lazy rebuild's cursor, and frees into
 * chunks this session has not scanned: the map is read where it is used,
 * not loaded at open). */
bool nvh_fullmap_test(nvh_heap *h, uint64_t c)
{
    return c < NVH_FULLMAP_CHUNKS &&
           (atomic_load_explicit(fullmap_word(h, c), memory_order_acquire) & (1ull << (c % 64)));
}

/* Mark chunk c full (flushed, not fenced: the caller's next fence makes it
 * durable, and a lost mark only costs a scan). Caller holds c's owner
 * lock or h->lock with nobody else able to free into c. */
static void fullmap_set(nvh_heap *h, uint64_t c)
{
    if (c >= NVH_FULLMAP_CHUNKS || h->pool->readonly) return;
    _Atomic uint64_t *w = fullmap_word(h, c);
    nvh_wopen(h, (const void *)w, 8);
    atomic_fetch_or_explicit(w, 1ull << (c % 64), memory_order_relaxed);
    nvh_wclose(h, (const void *)w, 8);
    nvh_flush(h->pool, (const void *)w, 8);
    atomic_store_explicit(&h->chunks[c].full_mark, true, memory_order_release);
}

/* A free into chunk `chunk` (owner's lock held, or replay): the chunk has
 * free space again. Normal path: the bit's line joins the ring's dirty list,
 * so it is durable before the free's record retires; until then replay
 * clears it again (free_region). An unscanned chunk the lazy rebuild
 * skipped as full is put back in its way. */
void nvh_fullmap_clear(nvh_heap *h, nvh_arena *a, uint64_t chunk, bool replay)
{
    if (chunk >= NVH_FULLMAP_CHUNKS) return;
    _Atomic uint64_t *w = fullmap_word(h, chunk);
    uint64_t bit = 1ull << (chunk % 64);
    bool was = atomic_load_explicit(w, memory_order_relaxed) & bit;
    if (was) {
        nvh_wopen(h, (const void *)w, 8);
        atomic_fetch_and_explicit(w, ~bit, memory_order_relaxed);
        nvh_wclose(h, (const void *)w, 8);
    }
    if (replay) {
        nvh_flush(h->pool, (const void *)w, 8);
        return;
    }
    nvh_redo_dirty(h, a, (const void *)w);
    atomic_store_explicit(&h->chunks[chunk].full_mark, false, memory_order_release);
    if (was && !__atomic_load_n(&h->chunks[chunk].scanned, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&h->lock);
        if (h->scan_next > chunk) h->scan_next = chunk;
        pthread_mutex_unlock(&h->lock);
    }
}

/* Is every block of chunk c (scanned, owned by a: a->lock held) activated,
 * by a's DRAM view? Free extents, large reservations and FIFO extents in
 * it, and runs with a slot that is not activated (free, cached, reserved or
 * waiting in the FIFO: pbits has them clear) all say no. */
/* Does arena a hold free space of chunk c in its extents, its large
 * reservations or its FIFO (freed regions waiting)? a->lock held. */
static bool arena_has_space_in(const nvh_arena *a, uint64_t lo, uint64_t hi)
{
    for (size_t i = 0; i < a->next; i++)
        if (a->ext[i].block < hi && a->ext[i].block + a->ext[i].nblocks > lo) return true;
    for (size_t i = 0; i < a->nresv; i++)
        if (a->resv[i].block >= lo && a->resv[i].block < hi) return true;
    for (size_t i = 0; i < a->fifo_len; i++) {
        const nvh_fifo_entry *e = &a->fifo[(a->fifo_head + i) & (a->fifo_cap - 1)];
        if (e->nblocks && e->off >= lo && e->off < hi) return true;
    }
    return false;
}

bool nvh_chunk_full_dram(nvh_heap *h, nvh_arena *a, uint64_t c)
{
    nvh_chunk *ch = &h->chunks[c];
    if (!ch->scanned || !ch->arena_chunk || !ch->runs) return false;
    if (arena_has_space_in(a, c * h->bpc, (c + 1) * h->bpc)) return false;
    return chunk_blocks_full(h, c);
}

/* The part of the test that needs no arena list: no quarantine in chunk c,
 * every run's slots activated, every other region used (the tiling). */
static bool chunk_blocks_full(nvh_heap *h, uint64_t c)
{
    nvh_chunk *ch = &h->chunks[c];
    uint64_t lo = c * h->bpc, hi = lo + h->bpc;
    pthread_mutex_lock(&h->quar_lock);
    for (size_t i = 0; i < h->nquar; i++)
        if (h->quar[i].block < hi && h->quar[i].block + h->quar[i].nblocks > lo) {
            pthread_mutex_unlock(&h->quar_lock);
            return false;
        }
    pthread_mutex_unlock(&h->quar_lock);
    for (uint64_t i = 0; i < h->bpc; i++) {
        nvh_run *run = ch->runs[i];
        if (!run) continue;
        uint64_t mask = run->nslots == 64 ? ~0ull : (1ull << run->nslots) - 1;
        if (run->quarantined || (run->pbits & mask) != mask) return false;
    }
    /* every block is a run or inside a used region: walk the persistent
     * tiling (pview) so that free space DRAM lost track of is not marked */
    for (uint64_t b = lo; b < hi;) {
        uint64_t n = h->pview[b];
        if (n == 0) return false;
        if (!ch->runs[b - lo]) {
            const struct nvh_rhdr *r = nvh_rhdr_at(h, b);
            if (!nvh_rhdr_valid(h, b) || r->state != NVH_RS_USED || r->kind != NVH_RK_LARGE)
                return false;
        }
        b += n;
    }
    return true;
}

/* ==========================================================================
 * Arenas: thread -> arena (round robin), chunk -> owning arena
 * ========================================================================== */
static _Thread_local struct { nvh_heap *heap; unsigned arena; } tl_arena;

nvh_arena *nvh_arena_mine(nvh_heap *h)
{
    if (tl_arena.heap != h) {
        unsigned n = atomic_load_explicit(&h->narenas, memory_order_relaxed);
        tl_arena.arena = atomic_fetch_add_explicit(&h->next_arena, 1, memory_order_relaxed) % n;
        tl_arena.heap = h;
    }
    return &h->arenas[tl_arena.arena];
}

/* The arena whose ring orders the records about objects in block's chunk;
 * claims the chunk for the caller's arena if nobody owns it yet. */
nvh_arena *nvh_owner_arena(nvh_heap *h, uint64_t block)
{
    uint64_t c = nvh_chunk_of_block(h, block);
    if (c >= h->max_chunks) return NULL;
    int own = nvh_owner_get(h, c, memory_order_acquire);
    if (own < 0) own = nvh_owner_claim(h, c, nvh_arena_mine(h)->index);
    return &h->arenas[own];
}
