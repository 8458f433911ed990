/* store.h — nvcached's storage module: items in an nvheap pool.
 *
 * Everything the server keeps durably goes through this interface, so the
 * engine underneath (today the hash map, nvh_hmap_*) can be swapped for
 * another (the key-value store, nvh_kv_*) by rewriting store.c alone.
 *
 * An item is one map entry: key -> nvc_hdr followed by the data bytes.
 * Every call that changes an item is durable when it returns (the map's
 * operations are), so the protocol layer may acknowledge as soon as it
 * returns. Callers hold the key's lock (nvc_store_lock) around a sequence
 * of calls on that key: a read-modify-write (incr, append, cas) is then
 * atomic, and a pointer returned by nvc_store_find stays valid until the
 * next change. Changes of keys under different locks run in parallel.
 * A plain lookup needs no lock (nvc_store_read). */
#ifndef NVCACHED_STORE_H
#define NVCACHED_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NVC_KEY_MAX 250u

/* The header in front of every item's data (on media, inside the map's
 * value). Times are Unix seconds, so they mean the same after a restart. */
typedef struct nvc_hdr {
    uint32_t flags;     /* the client's 32-bit flags                           */
    uint32_t reserved;  /* zero                                                */
    int64_t exptime;    /* absolute expiry (Unix s); 0 = never                 */
    uint64_t cas;       /* unique, increasing across restarts                  */
    int64_t time;       /* when the item was stored (Unix s): flush_all delay   */
} nvc_hdr;
_Static_assert(sizeof(nvc_hdr) == 32, "nvc_hdr is 32 bytes on media");

typedef struct nvc_store nvc_store;

typedef struct nvc_store_config {
    const char *path;        /* pool file; created if missing                  */
    unsigned pool_flags;     /* NVH_DOMAIN_* for nvh_pool_open/create          */
    uint64_t limit_bytes;    /* -m: item memory limit                          */
    bool no_evict;           /* -M: fail with NVC_NOMEM instead of evicting    */
} nvc_store_config;

/* Result codes of the changing calls. */
enum {
    NVC_OK = 0,
    NVC_NOMEM = -1,      /* over the limit (and -M, or nothing to evict) / pool full */
    NVC_ERR = -2,        /* the pool reported an error (logged)                */
    NVC_TOOLARGE = -3,
};

/* What a lookup finds: a copy of the header, the data in the pool. */
typedef struct nvc_view {
    nvc_hdr hdr;
    const char *data;
    size_t len;
} nvc_view;

typedef struct nvc_store_stats {
    uint64_t curr_items, bytes, limit_bytes;
    uint64_t evictions, reclaimed, expired_unfetched, total_items;
    uint64_t generation, epoch, next_cas;
    uint64_t lines_flushed, fences;
    uint64_t recovery_us;        /* pool + map open time at start              */
    uint64_t scan_us;            /* background scan duration (0 until done)    */
    uint64_t walk_us;            /* its map walk's steps (no lock held)        */
    bool scan_done;
    const char *path, *domain;
    uint64_t pool_size;
} nvc_store_stats;

/* Opens (or creates) the pool and the map, bumps the generation; returns
 * NULL with a message in err. Nothing is scanned: the DRAM eviction index
 * of the earlier run's items is rebuilt in the background once the memory
 * in use reaches half the limit (or nvc_store_index_rebuild). */
nvc_store *nvc_store_open(const nvc_store_config *config, char *err, size_t errlen);
void nvc_store_close(nvc_store *s);

/* The lock of key's stripe (the same key always maps to the same lock). */
void nvc_store_lock(nvc_store *s, const char *key, size_t klen);
void nvc_store_unlock(nvc_store *s, const char *key, size_t klen);

/* With the key's lock held: 1 and *view if the key holds a live item (not
 * expired, not flushed), else 0. `bump` marks it recently used. */
int nvc_store_find(nvc_store *s, const char *key, size_t klen, int64_t now, bool bump,
                   nvc_view *view);
/* Without the lock: if the key holds a live item, call fn with its view
 * (the data is valid during fn only: a concurrent change or eviction
 * takes effect for later reads) and return 1, else 0. `bump` marks it
 * recently used. */
typedef void (*nvc_read_fn)(const nvc_view *view, void *arg);
int nvc_store_read(nvc_store *s, const char *key, size_t klen, int64_t now, bool bump,
                   nvc_read_fn fn, void *arg);
/* A read section of the calling thread (they nest): the data of every
 * view nvc_store_read hands out inside one stays readable until
 * nvc_store_read_end, whatever changes or evicts the item meanwhile (its
 * space is not reused), so a reply can send it from its place. Short only:
 * a section holds back the reuse of freed space. */
void nvc_store_read_begin(nvc_store *s);
void nvc_store_read_end(nvc_store *s);
/* With the key's lock held: store key -> value, where value starts with an
 * nvc_hdr whose cas this call fills in (returned in *cas too) unless
 * keep_cas (a touch keeps the item's CAS, as memcached's does). Evicts at
 * the limit. Durable on return. */
int nvc_store_put(nvc_store *s, const char *key, size_t klen, void *value, size_t vlen,
                  bool keep_cas, uint64_t *cas);
/* With the key's lock held: remove the key; 1 if it was there, 0 if not. */
int nvc_store_delete(nvc_store *s, const char *key, size_t klen);
/* flush_all (no lock needed): every item stored so far is invalid now
 * (delay 0) or at now + delay; durable on return. */
int nvc_store_flush(nvc_store *s, int64_t now, int64_t delay);

/* Start indexing the earlier run's items now (normally started when the
 * memory in use reaches half the limit). */
int nvc_store_index_rebuild(nvc_store *s);

void nvc_store_stats_get(nvc_store *s, nvc_store_stats *st);
void nvc_store_stats_reset(nvc_store *s);

#endif
