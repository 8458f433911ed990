/* btree_test.h — helpers of the B+ tree tests: deterministic values, a DRAM
 * model (sorted key -> value version) to compare the tree with, and a scan
 * of the whole tree into arrays. */
#ifndef NVH_BTREE_TEST_H
#define NVH_BTREE_TEST_H

#include "test_util.h"

#define BT_LAYOUT "btreetest"

/* Value of (key, version): length and bytes derived from both, so a torn or
 * stale value is detected. maxlen bounds the length. */
static inline size_t bt_value(uint64_t key, uint64_t ver, unsigned char *buf, size_t maxlen)
{
    uint64_t s = key * 1000003u + ver;
    size_t len = (size_t)(test_rand(&s) % (maxlen + 1));
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)test_rand(&s);
    return len;
}

/* The model: key -> version (0 = absent), keys in [0, nkeys). */
typedef struct bt_model {
    uint64_t *ver;
    uint64_t *order;          /* indices sorted by key */
    uint64_t nkeys, live;
} bt_model;

/* Key of model index i: spread over the 64-bit space, ends included. */
static inline uint64_t bt_key_of(uint64_t i)
{
    if (i == 0) return 0;
    if (i == 1) return UINT64_MAX;
    return i * 0x9E3779B97F4A7C15ull >> 8;
}

static inline int bt_idx_cmp(const void *a, const void *b)
{
    uint64_t x = bt_key_of(*(const uint64_t *)a), y = bt_key_of(*(const uint64_t *)b);
    return x < y ? -1 : x > y;
}

static inline void bt_model_init(bt_model *m, uint64_t nkeys)
{
    m->ver = calloc(nkeys, sizeof *m->ver);
    m->order = malloc(nkeys * sizeof *m->order);
    assert_non_null(m->ver);
    assert_non_null(m->order);
    for (uint64_t i = 0; i < nkeys; i++) m->order[i] = i;
    qsort(m->order, nkeys, sizeof *m->order, bt_idx_cmp);
    m->nkeys = nkeys;
    m->live = 0;
}
static inline void bt_model_free(bt_model *m) { free(m->ver); free(m->order); m->ver = NULL; }

/* A scan into (key, len, hash) triples. */
typedef struct bt_scan_out {
    uint64_t *keys;
    uint64_t *hash;
    size_t n, cap;
} bt_scan_out;

static inline uint64_t bt_hash_bytes(const void *p, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ len;
    for (size_t i = 0; i < len; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static inline int bt_scan_cb(uint64_t key, const void *value, size_t len, void *arg)
{
    bt_scan_out *o = arg;
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 1024;
        o->keys = realloc(o->keys, o->cap * sizeof *o->keys);
        o->hash = realloc(o->hash, o->cap * sizeof *o->hash);
        if (!o->keys || !o->hash) abort();
    }
    o->keys[o->n] = key;
    o->hash[o->n++] = bt_hash_bytes(value, len);
    return 0;
}

static inline void bt_scan_free(bt_scan_out *o) { free(o->keys); free(o->hash); memset(o, 0, sizeof *o); }

/* Does the scan equal the model (ascending key order)? Returns 1 if so. */
static inline int bt_scan_matches(const bt_scan_out *o, const bt_model *m, size_t maxlen)
{
    if (o->n != m->live) return 0;
    unsigned char *buf = malloc(maxlen + 1);
    size_t n = 0;
    int ok = 1;
    for (uint64_t j = 0; ok && j < m->nkeys; j++) {
        uint64_t i = m->order[j];
        if (!m->ver[i]) continue;
        size_t len = bt_value(bt_key_of(i), m->ver[i], buf, maxlen);
        ok = n < o->n && o->keys[n] == bt_key_of(i) && o->hash[n] == bt_hash_bytes(buf, len);
        n++;
    }
    free(buf);
    return ok && n == o->n;
}

#endif
