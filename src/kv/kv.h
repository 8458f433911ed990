/* kv.h — internals of the key-value store layer (src/kv/): the on-media store
 * descriptor, the DRAM handle, and what kv.c, kv_ops.c, kv_batch.c and
 * kv_iter.c share. The engines below it are the hash map (ds/hashmap.h) and
 * the sorted engine (kv/sorted.h). User guide: docs/KV.md. */
#ifndef NVH_KV_KV_H
#define NVH_KV_KV_H

#include "../common/internal.h"
#include "../ds/hashmap.h"
#include "sorted.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>

/* ==========================================================================
 * On-media: the store descriptor (docs/FORMAT.md, "Key-value store")
 * ==========================================================================
 * One named object per store, "nvh.kv.<name>", 64 bytes. Its first 24 bytes
 * never change after creation and are covered by `check`; `root` and
 * `batch` are link words written only by the allocator (activate / free). */
#define NVH_KV_DESC_MAGIC 0x45524f5453564b4eull   /* "NKVSTORE" little endian */
#define NVH_KV_DESC_VERSION 1u
#define NVH_KV_OBJ_PREFIX "nvh.kv."

enum kv_engine_id { KV_ENGINE_SORTED = 1, KV_ENGINE_HASH = 2 };
#define KV_DESC_CUSTOM_ORDER 1u                     /* desc.flags */

struct kv_desc {
    uint64_t magic;          /* 0   NVH_KV_DESC_MAGIC                          */
    uint32_t version;        /* 8   NVH_KV_DESC_VERSION                        */
    uint32_t engine;         /* 12  enum kv_engine_id                          */
    uint32_t flags;          /* 16  KV_DESC_CUSTOM_ORDER                       */
    uint32_t check;          /* 20  CRC32C of bytes 0..19                      */
    uint64_t root;           /* 24  engine root (0: creation not finished)     */
    uint64_t batch;          /* 32  committed batch log not yet applied (0: none) */
    uint64_t reserved[3];    /* 40  0                                           */
};
static_assert(sizeof(struct kv_desc) == 64, "kv descriptor size");
static_assert(offsetof(struct kv_desc, check) == 20, "kv descriptor check");
static_assert(offsetof(struct kv_desc, root) == 24, "kv descriptor root");
static_assert(offsetof(struct kv_desc, batch) == 32, "kv descriptor batch");

static inline uint32_t kv_desc_crc(const struct kv_desc *d)
{
    return nvh_crc32c(0, d, offsetof(struct kv_desc, check));
}

/* ==========================================================================
 * On-media: the batch log (kv_batch.c; docs/FORMAT.md)
 * ==========================================================================
 * One allocation: header, then `nops` records {op, klen, vlen, key, value},
 * each padded to 8 bytes. Written and persisted whole before the one
 * activation that links it from desc.batch (the commit point); immutable
 * after. `check` covers every byte after the header's first 32. */
#define NVH_KV_LOG_MAGIC 0x474f4c4854424b4eull    /* "NKBTHLOG" */
#define NVH_KV_LOG_VERSION 1u
enum kv_log_op { KV_LOG_PUT = 1, KV_LOG_REMOVE = 2 };

struct kv_log_head {
    uint64_t magic;          /* 0   NVH_KV_LOG_MAGIC                           */
    uint32_t version;        /* 8                                              */
    uint32_t check;          /* 12  CRC32C of bytes 32..bytes                  */
    uint64_t bytes;          /* 16  total log size, header included            */
    uint64_t nops;           /* 24  records                                    */
};
static_assert(sizeof(struct kv_log_head) == 32, "kv log header size");

struct kv_log_rec {
    uint32_t op;             /* 0   enum kv_log_op                             */
    uint32_t klen;           /* 4   1..NVH_KV_KEY_MAX                          */
    uint64_t vlen;           /* 8   0..NVH_KV_VALUE_MAX (0 for a remove)        */
    /* 16: key bytes, value bytes, zero padding to 8 */
};
static_assert(sizeof(struct kv_log_rec) == 16, "kv log record size");

static inline uint64_t kv_log_rec_size(uint64_t klen, uint64_t vlen)
{
    return (sizeof(struct kv_log_rec) + klen + vlen + 7) & ~UINT64_C(7);
}

/* ==========================================================================
 * DRAM handle
 * ========================================================================== */
struct nvh_kv {
    nvh_pool *pool;
    nvh_pool_hook hook;      /* key: desc; shares the handle between opens     */
    bool own_pool;           /* nvh_kv_open opened the pool: close closes it    */
    bool readonly;
    enum kv_engine_id engine;
    struct kv_desc *desc;
    nvh_hmap *hm;            /* engine hash                                     */
    kv_sorted *st;           /* engine sorted                                   */
    char name[NVH_KV_NAME_MAX + 1];
    /* Single writes hold it shared, a batch commit exclusive: a batch's log
     * replays its keys' final values, so no single write may land between
     * its commit point and the end of its application (the replay would
     * undo it). Readers never take it. */
    pthread_rwlock_t wlock;
    /* hash engine: key and value bytes = base + the map's delta since open
     * (nvh_hm_bytes_delta_); the base is set by one walk, under wlock, at
     * the first nvh_kv_stats_get after the open (hbytes_known: atomic) */
    int hbytes_known;
    int64_t hkbase, hvbase;
    /* calls that succeeded, one stripe per thread group (the pool's stat
     * stripes): a shared counter's line would move between the cores of
     * two readers at every get */
    struct kv_ctr {
        _Alignas(64) _Atomic uint64_t puts;
        _Atomic uint64_t gets, removes, batches;
    } ctr[NVH_STAT_STRIPES];
};
static_assert(sizeof(struct kv_ctr) == 64, "one line per stripe");

enum kv_ctr_id { KV_CTR_PUTS, KV_CTR_GETS, KV_CTR_REMOVES, KV_CTR_BATCHES };
static inline void kv_tally(nvh_kv *kv, enum kv_ctr_id id)
{
    unsigned s = nvh_thread_stripe_;
    if (__builtin_expect(s == 0, 0)) s = nvh_assign_stripe_();
    struct kv_ctr *c = &kv->ctr[s - 1];
    _Atomic uint64_t *v = id == KV_CTR_PUTS ? &c->puts : id == KV_CTR_GETS ? &c->gets
                        : id == KV_CTR_REMOVES ? &c->removes : &c->batches;
    atomic_fetch_add_explicit(v, 1, memory_order_relaxed);
}

/* ==========================================================================
 * Shared helpers
 * ========================================================================== */
/* Argument checks in the store's terms (kv_ops.c). */
int nvh_kv_check_key_(const nvh_kv *kv, const char *fn, const void *key, size_t klen);
int nvh_kv_check_value_(const nvh_kv *kv, const char *fn, const void *value, size_t vlen);
int nvh_kv_check_write_(const nvh_kv *kv, const char *fn);

/* The engine's idempotent put and remove (no lock, no argument check): what
 * single writes and the batch log's application share. Remove reports
 * NVH_E_NOTFOUND. */
int nvh_kv_engine_put_(nvh_kv *kv, const void *key, size_t klen, const void *value,
                       size_t vlen);
int nvh_kv_engine_remove_(nvh_kv *kv, const void *key, size_t klen);

#ifdef NVH_TEST_HOOKS
/* Tests only: walks of a hash store's entries made by nvh_kv_stats_get. */
extern _Atomic unsigned long nvh_kv_test_bytes_walks_;
#endif

/* Apply the batch log linked from the descriptor, then unlink and free it
 * (kv_batch.c). Open calls it before anything else; idempotent. */
int nvh_kv_batch_replay_(nvh_kv *kv);
/* Validate a batch log object (bounds, magic, checksum, records). */
int nvh_kv_log_validate_(nvh_kv *kv, const struct kv_log_head *h, size_t usable);

#endif /* NVH_KV_KV_H */
