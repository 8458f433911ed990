/* sorted.h — the sorted engine of the key-value store (a B+ tree of byte-string
 * keys), as the store layer (src/kv/kv*.c) calls it. Contract: section 2 of the
 * kv interface shared by the kv helpers. */
#ifndef NVH_KV_SORTED_H
#define NVH_KV_SORTED_H

#include "nvheap.h"

typedef struct kv_sorted kv_sorted;
typedef int (*kv_cmp_fn)(const void *a, size_t alen, const void *b, size_t blen, void *arg);
typedef int (*kv_entry_fn)(const void *k, size_t kl, const void *v, size_t vl, void *arg);

/* A new empty tree; its root object's offset is stored into *link failure-atomically
 * (link is a word in the pool, e.g. in kv-core's store descriptor). */
int kv_sorted_create(nvh_pool *pool, nvh_off_t *link);
kv_sorted *kv_sorted_open(nvh_pool *pool, nvh_off_t root, kv_cmp_fn cmp, void *cmp_arg);
int kv_sorted_close(kv_sorted *t);
int kv_sorted_destroy(kv_sorted *t, nvh_off_t *link);   /* frees everything, clears *link */

/* Durable on return; failure-atomic. Idempotent (the batch log replays them). */
int kv_sorted_put(kv_sorted *t, const void *k, size_t kl, const void *v, size_t vl);
int kv_sorted_remove(kv_sorted *t, const void *k, size_t kl);           /* NVH_E_NOTFOUND */
/* fn(k, kl, v, vl, arg) once for the entry; pointers valid during fn only. */
int kv_sorted_get(kv_sorted *t, const void *k, size_t kl, kv_entry_fn fn, void *arg);

enum kv_seek { KV_SEEK_EQ, KV_SEEK_LT, KV_SEEK_LE, KV_SEEK_GT, KV_SEEK_GE,
               KV_SEEK_FIRST, KV_SEEK_LAST };
/* fn once for the entry found (k ignored for FIRST/LAST); NVH_E_NOTFOUND if none. */
int kv_sorted_seek(kv_sorted *t, enum kv_seek how, const void *k, size_t kl,
                   kv_entry_fn fn, void *arg);
/* Where a seek left an iterator, so that next/prev step within the leaf's
 * cached key order instead of descending again. Opaque to the caller; it
 * holds no reference (the engine validates it at each step). */
typedef struct kv_sorted_pos {
    void *c;
    uint64_t gen;
    uint32_t ver, idx;
} kv_sorted_pos;
/* kv_sorted_seek that also records the entry's position in *pos
 * (KV_SEEK_EQ too). */
int kv_sorted_seek_pos(kv_sorted *t, enum kv_seek how, const void *k, size_t kl,
                       kv_entry_fn fn, void *arg, kv_sorted_pos *pos);
/* The entry after (dir > 0) or before (dir < 0) the one at *pos, whose key
 * is (k, kl): a step within its leaf when nothing changed there, else a
 * seek GT/LT from k. fn once for it; NVH_E_NOTFOUND at the end. */
int kv_sorted_step(kv_sorted *t, int dir, const void *k, size_t kl, kv_entry_fn fn, void *arg,
                   kv_sorted_pos *pos);
#ifdef NVH_TEST_HOOKS
/* Tests only: steps that fell back to a seek from their key. */
extern _Atomic unsigned long kvs_test_step_seeks_;
#endif
/* Ascending scan of lo..hi; lo/hi NULL = unbounded; *_incl: bound included.
 * Stops when fn returns non-zero (returned). */
int kv_sorted_scan(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                   const void *hi, size_t hil, int hi_incl, kv_entry_fn fn, void *arg);
int kv_sorted_count(kv_sorted *t, const void *lo, size_t lol, int lo_incl,
                    const void *hi, size_t hil, int hi_incl, uint64_t *count);
int kv_sorted_check(kv_sorted *t);
/* Total key and value bytes of the entries: O(1) from counters the writers
 * keep, except the first call after an open, which walks the entries once
 * (O(entries)) — no writer may run during that call; kv_sorted_bytes_known
 * tells whether the next call is O(1). */
int kv_sorted_bytes(kv_sorted *t, uint64_t *key_bytes, uint64_t *value_bytes);
int kv_sorted_bytes_known(kv_sorted *t);

/* Tests only: records of at most rec_max bytes (header, key and value) are
 * carved from slabs of at most slab_max bytes; larger ones are allocator
 * objects (rec_max 0: every record, as a version-1 tree holds them). */
int kv_sorted_set_slabs_(kv_sorted *t, uint64_t rec_max, uint64_t slab_max);
/* Tests only: carve records with the 16-byte header and raise the tree to
 * version 2 only, as the library before version 3 wrote them (a generator
 * of old-format trees). */
int kv_sorted_set_rec16_(kv_sorted *t, int on);

#endif /* NVH_KV_SORTED_H */
