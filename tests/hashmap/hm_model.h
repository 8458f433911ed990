/* hm_model.h — what the hash map tests share: a deterministic universe of
 * byte-string keys (lengths 3..~1100, ids encoded so keys are distinct), the
 * value of (key, version), a seeded random operation stream, and the DRAM
 * model (version per key; 0 = absent) the map is compared with. */
#ifndef NVH_TEST_HM_MODEL_H
#define NVH_TEST_HM_MODEL_H

#include "test_util.h"

#include <stdbool.h>

#define HM_KEYBUF 2048
#define HM_VALBUF 512

/* the tests' generator under this header's prefix */
static inline uint64_t hm_rng(uint64_t *s) { return test_rand(s); }

/* Key `id`: "k<id>-" then filler; every 50th key is long (1000+ bytes). */
static inline size_t hm_key(uint32_t id, uint8_t *buf)
{
    int n = snprintf((char *)buf, 32, "k%u-", id);
    size_t len = (size_t)n + (id * 37u) % 61u;
    if (id % 50 == 1) len += 1000;
    for (size_t i = (size_t)n; i < len; i++) buf[i] = (uint8_t)(id * 7u + i);
    return len;
}

/* Value of key `id` at version `ver` (ver >= 1): 0..299 bytes. */
static inline size_t hm_val(uint32_t id, uint32_t ver, uint8_t *buf)
{
    size_t len = (id * 13u + ver * 7u) % 300u;
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(id * 31u + ver * 17u + i);
    return len;
}

/* One operation of the stream. */
typedef enum { HM_OP_PUT, HM_OP_DEL, HM_OP_INS, HM_OP_UPD } hm_opkind;
typedef struct hm_op {
    hm_opkind kind;
    uint32_t id;
} hm_op;

static inline hm_op hm_next_op(uint64_t *rng, uint32_t nkeys, unsigned del_pct)
{
    hm_op op;
    uint64_t r = hm_rng(rng) % 100;
    op.id = (uint32_t)(hm_rng(rng) % nkeys);
    op.kind = r < del_pct ? HM_OP_DEL : r < del_pct + 10 ? HM_OP_INS
            : r < del_pct + 20 ? HM_OP_UPD : HM_OP_PUT;
    return op;
}

/* Apply op to the model (ver[id] = version, 0 = absent; *clock counts
 * versions so every write is distinct). Returns the expected result code. */
static inline int hm_model_apply(uint32_t *ver, uint32_t *clock, hm_op op)
{
    switch (op.kind) {
    case HM_OP_DEL:
        if (!ver[op.id]) return NVH_E_NOTFOUND;
        ver[op.id] = 0;
        return NVH_OK;
    case HM_OP_INS:
        if (ver[op.id]) return NVH_E_EXISTS;
        ver[op.id] = ++*clock;
        return NVH_OK;
    case HM_OP_UPD:
        if (!ver[op.id]) return NVH_E_NOTFOUND;
        ver[op.id] = ++*clock;
        return NVH_OK;
    default:
        ver[op.id] = ++*clock;
        return NVH_OK;
    }
}

/* Apply op to the map; `newver` is the version the model gave it. */
static inline int hm_map_apply(nvh_hmap *m, hm_op op, uint32_t newver)
{
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    size_t kl = hm_key(op.id, k);
    size_t vl = hm_val(op.id, newver, v);
    switch (op.kind) {
    case HM_OP_DEL: return nvh_hmap_delete(m, k, kl);
    case HM_OP_INS: return nvh_hmap_insert(m, k, kl, v, vl);
    case HM_OP_UPD: return nvh_hmap_update(m, k, kl, v, vl);
    default: return nvh_hmap_put(m, k, kl, v, vl);
    }
}

/* Does key id have exactly the model's state in the map? */
static inline bool hm_key_matches(nvh_hmap *m, uint32_t id, uint32_t ver)
{
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    size_t kl = hm_key(id, k);
    const void *got;
    size_t gl;
    int rc = nvh_hmap_get(m, k, kl, &got, &gl);
    if (!ver) return rc == NVH_E_NOTFOUND;
    if (rc != NVH_OK) return false;
    size_t vl = hm_val(id, ver, v);
    return gl == vl && memcmp(got, v, vl) == 0;
}

/* foreach must visit exactly the model's keys, each once, with its value. */
typedef struct hm_visit {
    const uint32_t *ver;
    uint32_t nkeys;
    uint8_t *seen;
    uint64_t n;
    int bad;
} hm_visit;

static inline int hm_visit_fn(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    hm_visit *s = arg;
    unsigned id;
    char tmp[16] = {0};
    memcpy(tmp, key, klen < 15 ? klen : 15);
    if (sscanf(tmp, "k%u-", &id) != 1 || id >= s->nkeys || s->seen[id] || !s->ver[id]) {
        s->bad++;
        return 0;
    }
    s->seen[id] = 1;
    s->n++;
    uint8_t k[HM_KEYBUF], v[HM_VALBUF];
    size_t kl = hm_key(id, k), vl = hm_val(id, s->ver[id], v);
    if (kl != klen || memcmp(k, key, kl) || vl != vlen || memcmp(v, val, vl)) s->bad++;
    return 0;
}

/* The map equals the model: every key, foreach, count. */
static inline bool hm_equals_model(nvh_hmap *m, const uint32_t *ver, uint32_t nkeys)
{
    uint64_t live = 0;
    for (uint32_t id = 0; id < nkeys; id++) {
        if (!hm_key_matches(m, id, ver[id])) return false;
        live += ver[id] != 0;
    }
    hm_visit s = {ver, nkeys, calloc(nkeys, 1), 0, 0};
    nvh_hmap_foreach(m, hm_visit_fn, &s);
    free(s.seen);
    return s.bad == 0 && s.n == live && nvh_hmap_count(m) == live;
}

/* Allocated heap objects (to prove: no leak). */
static inline int hm_count_obj(void *p, size_t usable, void *arg)
{
    (void)p;
    (void)usable;
    ++*(uint64_t *)arg;
    return 0;
}
static inline uint64_t hm_heap_objects(nvh_pool *pool)
{
    uint64_t n = 0;
    nvh_heap_foreach(pool, hm_count_obj, &n);
    return n;
}

/* An nvh_hmap_get_fn callback: 1 if the value is the bytes of one version
 * (1 .. *(uint32_t *)max_ver) of its key, below 0 if not. */
static inline int hm_whole_fn(const void *key, size_t klen, const void *val, size_t vlen,
                              void *max_ver)
{
    unsigned id;
    char tmp[16] = {0};
    memcpy(tmp, key, klen < 15 ? klen : 15);
    if (sscanf(tmp, "k%u-", &id) != 1) return -1;
    uint8_t v[HM_VALBUF];
    for (uint32_t ver = 1; ver <= *(const uint32_t *)max_ver; ver++)
        if (hm_val(id, ver, v) == vlen && memcmp(v, val, vlen) == 0) return 1;
    return -2;
}

#endif
