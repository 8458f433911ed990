/* kvs_model.h — what the sorted engine's tests share: a deterministic
 * universe of byte-string keys (ids map to distinct keys of 1..300 bytes
 * with many shared prefixes such as "user:000123", binary keys with zero
 * bytes, and 4096-byte keys), the value of (key, version), and the DRAM
 * model (version per id, 0 = absent; the ids in key order for ordered
 * queries) the tree is compared with. */
#ifndef NVH_TEST_KVS_MODEL_H
#define NVH_TEST_KVS_MODEL_H

#include "test_util.h"
#include "kv/sorted_int.h"

#include <stdbool.h>

#define KM_KEYMAX 4096
#define KM_VALMAX 600

/* the tests' generator under this header's prefix */
static inline uint64_t km_rng(uint64_t *s) { return test_rand(s); }

/* Every km_long_every-th id gets a 4096-byte key (0: only id % 97 == 5). */
static unsigned km_long_every;

/* Key of id (distinct for distinct ids). */
static inline size_t km_key(uint32_t id, uint8_t *buf)
{
    uint64_t s = id * 0x1234567ull + 99;
    unsigned kind = id % 10;
    size_t n;
    if (id % 97 == 5 || (km_long_every && id % km_long_every == 0)) {
        /* a 4096-byte key: long shared prefix, the id near the end */
        memset(buf, 'x', KM_KEYMAX);
        buf[0] = 0xfe;
        snprintf((char *)buf + KM_KEYMAX - 16, 16, "%015u", id);
        return KM_KEYMAX;
    }
    if (kind < 6) {
        /* "user:%06u" then 0..40 more bytes: prefixes collide in 8 bytes */
        n = (size_t)snprintf((char *)buf, 32, "user:%06u", id / 3);
        buf[n++] = (uint8_t)('a' + id % 3);
        size_t extra = km_rng(&s) % 41;
        for (size_t i = 0; i < extra; i++) buf[n++] = (uint8_t)('0' + km_rng(&s) % 10);
        return n;
    }
    if (kind < 8) {
        /* binary: a marker, the id, then random bytes up to 300 */
        buf[0] = 0xff;
        buf[1] = (uint8_t)(id >> 16);
        buf[2] = (uint8_t)(id >> 8);
        buf[3] = (uint8_t)id;
        n = 4 + km_rng(&s) % 297;
        for (size_t i = 4; i < n; i++) buf[i] = (uint8_t)km_rng(&s);
        return n;
    }
    if (id < 256 * 10 && kind == 8) {
        /* one-byte keys (some zero) */
        buf[0] = (uint8_t)(id / 10);
        return 1;
    }
    /* short binary keys with zero bytes: 3 bytes of id, zero padding */
    buf[0] = (uint8_t)(0x80 | (id >> 16));
    buf[1] = (uint8_t)(id >> 8);
    buf[2] = (uint8_t)id;
    n = 3 + id % 6;
    for (size_t i = 3; i < n; i++) buf[i] = 0;
    return n;
}

/* Value of (id, ver): 0..599 bytes. */
static inline size_t km_val(uint32_t id, uint32_t ver, uint8_t *buf)
{
    size_t len = (id * 13u + ver * 7u) % KM_VALMAX;
    if ((id + ver) % 11 == 0) len = 0;
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(id * 31u + ver * 17u + i);
    return len;
}

typedef struct km_model {
    uint32_t n;          /* ids 0..n-1 */
    uint32_t *ver;       /* 0 = absent */
    uint32_t *ord;       /* ids in key order */
    uint32_t *pos;       /* pos[id]: index in ord */
    uint8_t **keys;
    size_t *klen;
    uint64_t live;
} km_model;

static km_model *km_sort_model_;
static int km_cmp_ids(const void *a, const void *b)
{
    const km_model *m = km_sort_model_;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    size_t lx = m->klen[x], ly = m->klen[y];
    int c = memcmp(m->keys[x], m->keys[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly;
}

static inline km_model *km_new(uint32_t n)
{
    km_model *m = calloc(1, sizeof *m);
    m->n = n;
    m->ver = calloc(n, sizeof *m->ver);
    m->ord = malloc(n * sizeof *m->ord);
    m->pos = malloc(n * sizeof *m->pos);
    m->keys = malloc(n * sizeof *m->keys);
    m->klen = malloc(n * sizeof *m->klen);
    uint8_t *buf = malloc(KM_KEYMAX);
    for (uint32_t i = 0; i < n; i++) {
        m->klen[i] = km_key(i, buf);
        m->keys[i] = malloc(m->klen[i]);
        memcpy(m->keys[i], buf, m->klen[i]);
        m->ord[i] = i;
    }
    free(buf);
    km_sort_model_ = m;
    qsort(m->ord, n, sizeof *m->ord, km_cmp_ids);
    for (uint32_t i = 0; i < n; i++) m->pos[m->ord[i]] = i;
    for (uint32_t i = 1; i < n; i++)
        if (km_cmp_ids(&m->ord[i - 1], &m->ord[i]) == 0) fail_msg("model: ids %u %u share a key", m->ord[i - 1], m->ord[i]);
    return m;
}

static inline void km_free(km_model *m)
{
    for (uint32_t i = 0; i < m->n; i++) free(m->keys[i]);
    free(m->keys); free(m->klen); free(m->ver); free(m->ord); free(m->pos); free(m);
}

static inline int km_bytes_cmp(const void *a, size_t al, const void *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c) return c;
    return al < bl ? -1 : al > bl;
}

/* First index in ord whose key is >= (k, kl) (strict: >). */
static inline uint32_t km_lower(const km_model *m, const void *k, size_t kl, int strict)
{
    uint32_t lo = 0, hi = m->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2, id = m->ord[mid];
        int c = km_bytes_cmp(m->keys[id], m->klen[id], k, kl);
        if (strict ? c <= 0 : c < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Expected id of a seek, or -1. */
static inline int64_t km_seek(const km_model *m, enum kv_seek how, const void *k, size_t kl)
{
    int64_t i;
    switch (how) {
    case KV_SEEK_FIRST: i = 0; goto up;
    case KV_SEEK_GE: i = km_lower(m, k, kl, 0); goto up;
    case KV_SEEK_GT: i = km_lower(m, k, kl, 1); goto up;
    case KV_SEEK_LAST: i = (int64_t)m->n - 1; goto down;
    case KV_SEEK_LT: i = (int64_t)km_lower(m, k, kl, 0) - 1; goto down;
    case KV_SEEK_LE: i = (int64_t)km_lower(m, k, kl, 1) - 1; goto down;
    case KV_SEEK_EQ: {
        uint32_t j = km_lower(m, k, kl, 0);
        if (j < m->n && m->ver[m->ord[j]] &&
            km_bytes_cmp(m->keys[m->ord[j]], m->klen[m->ord[j]], k, kl) == 0) return m->ord[j];
        return -1;
    }
    }
    return -1;
up:
    for (; i < (int64_t)m->n; i++)
        if (m->ver[m->ord[i]]) return m->ord[i];
    return -1;
down:
    for (; i >= 0; i--)
        if (m->ver[m->ord[i]]) return m->ord[i];
    return -1;
}

/* The tree's entry, collected by a callback. */
typedef struct km_hit {
    int n;
    uint8_t key[KM_KEYMAX];
    size_t kl;
    uint8_t val[KM_VALMAX + 64];
    size_t vl;
} km_hit;

static inline int km_hit_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    km_hit *h = arg;
    h->n++;
    memcpy(h->key, k, kl);
    h->kl = kl;
    h->vl = vl;
    memcpy(h->val, v, vl < sizeof h->val ? vl : sizeof h->val);
    return 0;
}

/* Does the tree hold exactly the model (full scan + count)? Prints the first
 * difference to stderr. */
static int km_quiet;   /* no diagnostics from km_equals (prefix probing) */
#define km_say(...) do { if (!km_quiet) fprintf(stderr, __VA_ARGS__); } while (0)

typedef struct km_cmp_state {
    const km_model *m;
    uint32_t next;       /* index in ord of the next expected present id */
    int bad;
    uint8_t val[KM_VALMAX];
} km_cmp_state;

static inline int km_scan_fn(const void *k, size_t kl, const void *v, size_t vl, void *arg)
{
    km_cmp_state *s = arg;
    const km_model *m = s->m;
    while (s->next < m->n && !m->ver[m->ord[s->next]]) s->next++;
    if (s->next >= m->n) { km_say("model: tree has an extra key at the end\n"); s->bad = 1; return 1; }
    uint32_t id = m->ord[s->next++];
    if (km_bytes_cmp(k, kl, m->keys[id], m->klen[id]) != 0) {
        km_say("model: key differs (expected id %u, len %zu; got len %zu)\n", id, m->klen[id], kl);
        s->bad = 1;
        return 1;
    }
    size_t el = km_val(id, m->ver[id], s->val);
    if (el != vl || memcmp(v, s->val, vl) != 0) {
        km_say("model: value of id %u differs (len %zu, expected %zu)\n", id, vl, el);
        s->bad = 1;
        return 1;
    }
    return 0;
}

static inline bool km_equals(kv_sorted *t, const km_model *m)
{
    km_cmp_state s = {m, 0, 0, {0}};
    int rc = kv_sorted_scan(t, NULL, 0, 0, NULL, 0, 0, km_scan_fn, &s);
    if (rc && !s.bad) { km_say("model: scan rc %d %s\n", rc, nvh_errormsg()); return false; }
    if (s.bad) return false;
    while (s.next < m->n && !m->ver[m->ord[s.next]]) s.next++;
    if (s.next < m->n) { km_say("model: tree misses id %u\n", m->ord[s.next]); return false; }
    uint64_t cnt = 0;
    if (kv_sorted_count(t, NULL, 0, 0, NULL, 0, 0, &cnt) != NVH_OK) return false;
    uint64_t live = 0;
    for (uint32_t i = 0; i < m->n; i++) live += m->ver[i] != 0;
    if (cnt != live) { km_say("model: count %llu, expected %llu\n", (unsigned long long)cnt, (unsigned long long)live); return false; }
    return true;
}

/* What a tree's chain accounts for in the heap, read from the pool (the
 * tests' leak checks): leaves, record slabs (empty: those no live slot
 * names a record in), live records carved from a slab (srecs) and live
 * records that are allocator objects (arecs). */
typedef struct km_objs {
    uint64_t leaves, slabs, empty, srecs, arecs;
} km_objs;
static inline km_objs km_tree_objects(nvh_pool *pool, nvh_off_t hdr)
{
    const kvs_hdr *h = nvh_ptr(pool, hdr);
    km_objs o = {0};
    enum { MAXS = 4096 };
    static uint64_t lo[MAXS], hi[MAXS], live[MAXS];
    for (uint64_t s = h->slabs; s && o.slabs < MAXS; s = ((const kvs_slab *)nvh_ptr(pool, s))->next) {
        lo[o.slabs] = s;
        hi[o.slabs] = s + ((const kvs_slab *)nvh_ptr(pool, s))->size;
        live[o.slabs++] = 0;
    }
    for (uint64_t l = h->first; l && o.leaves < 1000000; l = ((const kvs_leaf *)nvh_ptr(pool, l))->next) {
        const kvs_leaf *lf = nvh_ptr(pool, l);
        o.leaves++;
        for (unsigned i = 0; i < KVS_CAP; i++) {
            uint64_t r = lf->slot[i].rec, k = 0;
            if (kvs_slot_free(r)) continue;
            while (k < o.slabs && !(r >= lo[k] && r < hi[k])) k++;
            if (k < o.slabs) { live[k]++; o.srecs++; }
            else o.arecs++;
        }
    }
    for (uint64_t k = 0; k < o.slabs; k++) o.empty += live[k] == 0;
    return o;
}

#endif /* NVH_TEST_KVS_MODEL_H */
