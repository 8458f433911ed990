/* lru.h — the DRAM eviction index of nvcached: every item's key and size,
 * with a CLOCK reference bit (an approximate LRU, as memcached's segmented
 * LRU is approximate too).
 *
 * It lives in DRAM only: after a restart it is rebuilt in the background
 * from the pool (store.c), so it never delays serving. The caller
 * serialises every call (store.c: the store lock; lock-free readers queue
 * their bumps by hash, applied under the lock with lru_bump_hash). */
#ifndef NVCACHED_LRU_H
#define NVCACHED_LRU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct nvc_lru nvc_lru;

nvc_lru *lru_new(void);
void lru_free(nvc_lru *l);
uint64_t lru_hash(const char *key, size_t klen);
/* Insert or update; a new entry starts referenced unless `cold`. Returns
 * the size it had before (0 if new); -1 if out of DRAM. */
int64_t lru_set(nvc_lru *l, const char *key, size_t klen, uint64_t size, bool cold);
/* true if present (and then marked referenced). */
bool lru_bump(nvc_lru *l, const char *key, size_t klen);
/* The same for every entry whose hash is h (lru_hash): a bump queued by
 * hash may mark a colliding key too, which only keeps it a round longer. */
void lru_bump_hash(nvc_lru *l, uint64_t h);
bool lru_contains(nvc_lru *l, const char *key, size_t klen);
/* The size recorded for the key, or -1 if it is not indexed. */
int64_t lru_size(nvc_lru *l, const char *key, size_t klen);
void lru_remove(nvc_lru *l, const char *key, size_t klen);
/* The CLOCK hand's next victim (not removed): copies its key into key
 * (NVC_KEY_MAX + 1 bytes) and returns its length, or -1 if empty. */
int lru_victim(nvc_lru *l, char *key);
uint64_t lru_bytes(const nvc_lru *l);
uint64_t lru_count(const nvc_lru *l);

#endif
