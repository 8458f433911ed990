/* btree_classic.c — a classic sorted-node persistent B+ tree, the baseline of [Moraru11] §8.3 in bench_btree
 *
 * See btree_classic.h for the modes. Layout: a node is one 1 KiB object,
 * a header line (count, leaf flag) then 60 sorted keys then 60 pointers
 * (pool offsets): in a leaf, of value records {key, len, bytes}; in an
 * inner node, of children, where key[i] is the smallest key of child i
 * (key[0] is never compared: child 0 takes everything below key[1]).
 * Keys and pointers are separate arrays so that the binary search reads
 * contiguous keys, as a classic cache-conscious node does. */
#include "btree_classic.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CT_CAP 60u
#define CT_LINE 64u
#define CT_MAX_DEPTH 32

typedef struct ct_node {
    uint32_t count;
    uint32_t leaf;
    uint64_t pad[7];                /* keys start on a line of their own */
    uint64_t key[CT_CAP];
    uint64_t ptr[CT_CAP];
} ct_node;
static_assert(sizeof(ct_node) == 1024, "ct_node is 1 KiB");
static_assert(offsetof(ct_node, key) == 64, "keys start at line 1");

typedef struct ct_header {
    uint64_t root;                  /* offset of the root node */
    uint64_t pad[7];
} ct_header;
static_assert(sizeof(ct_header) == 64, "ct_header is one line");

typedef struct ct_record {
    uint64_t key, len;
    unsigned char data[];
} ct_record;

struct ct_tree {
    nvh_pool *pool;
    ct_mode mode;
    ct_header *hdr;
    uint64_t count;
    /* CT_TX: nodes allocated by the current transaction (stores into them
     * need no snapshot) */
    const ct_node *fresh[2 * CT_MAX_DEPTH + 2];
    unsigned nfresh;
};

static inline ct_node *node_at(const ct_tree *t, uint64_t off) { return nvh_ptr(t->pool, off); }

/* first i in [lo, n) with key[i] >= k, or n */
static inline unsigned lower_bound(const uint64_t *key, unsigned lo, unsigned n, uint64_t k)
{
    while (lo < n) {
        unsigned mid = (lo + n) / 2;
        if (key[mid] < k) lo = mid + 1; else n = mid;
    }
    return lo;
}

/* the child of an inner node that holds k: the last i with key[i] <= k
 * (i >= 1), else 0 */
static inline unsigned child_index(const ct_node *n, uint64_t k)
{
    unsigned lo = 1, hi = n->count;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (n->key[mid] <= k) lo = mid + 1; else hi = mid;
    }
    return lo - 1;
}

/* ---- durable writes, per mode ------------------------------------------- */
/* Write bytes [a, b) of node n from the same bytes of buf, whole lines, with
 * non-temporal stores (the pool's NT threshold is <= 64 B). */
static void nt_lines(ct_tree *t, ct_node *n, const ct_node *buf, size_t a, size_t b)
{
    a &= ~(size_t)(CT_LINE - 1);
    b = (b + CT_LINE - 1) & ~(size_t)(CT_LINE - 1);
    nvh_memcpy_nodrain(t->pool, (char *)n + a, (const char *)buf + a, b - a);
}

static int is_fresh(const ct_tree *t, const ct_node *n)
{
    for (unsigned i = 0; i < t->nfresh; i++)
        if (t->fresh[i] == n) return 1;
    return 0;
}

/* Put (k, p) at slot pos of n (count < CT_CAP), shifting the larger
 * entries right. CT_TX: inside the caller's transaction. CT_FLUSH/CT_NT:
 * entries written and flushed, a fence, then `rec` (if any) activated,
 * then the count written, flushed and fenced. */
static int node_insert(ct_tree *t, ct_node *n, unsigned pos, uint64_t k, uint64_t p, void *rec)
{
    nvh_pool *pool = t->pool;
    unsigned cnt = n->count, moved = cnt - pos;
    if (t->mode == CT_TX) {
        if (!is_fresh(t, n)) {
            nvh_tx_range r[3] = {{&n->count, 8, NVH_TX_HINT_AUTO},
                                 {&n->key[pos], (moved + 1) * 8, NVH_TX_HINT_AUTO},
                                 {&n->ptr[pos], (moved + 1) * 8, NVH_TX_HINT_AUTO}};
            int rc = nvh_tx_add_ranges(pool, r, 3);
            if (rc != NVH_OK) return rc;
        }
        memmove(&n->key[pos + 1], &n->key[pos], moved * 8);
        memmove(&n->ptr[pos + 1], &n->ptr[pos], moved * 8);
        n->key[pos] = k;
        n->ptr[pos] = p;
        n->count = cnt + 1;
        return NVH_OK;
    }
    size_t ka = offsetof(ct_node, key) + pos * 8, kb = offsetof(ct_node, key) + (cnt + 1) * 8;
    size_t pa = offsetof(ct_node, ptr) + pos * 8, pb = offsetof(ct_node, ptr) + (cnt + 1) * 8;
    if (t->mode == CT_NT) {
        /* the changed lines rebuilt in DRAM, then streamed back whole */
        _Alignas(64) ct_node buf;
        size_t a = ka & ~(size_t)(CT_LINE - 1), b = (kb + CT_LINE - 1) & ~(size_t)(CT_LINE - 1);
        memcpy((char *)&buf + a, (char *)n + a, b - a);
        a = pa & ~(size_t)(CT_LINE - 1);
        b = (pb + CT_LINE - 1) & ~(size_t)(CT_LINE - 1);
        memcpy((char *)&buf + a, (char *)n + a, b - a);
        memmove(&buf.key[pos + 1], &buf.key[pos], moved * 8);
        memmove(&buf.ptr[pos + 1], &buf.ptr[pos], moved * 8);
        buf.key[pos] = k;
        buf.ptr[pos] = p;
        nt_lines(t, n, &buf, ka, kb);
        nt_lines(t, n, &buf, pa, pb);
        nvh_drain(pool);
        if (rec && nvh_activate(pool, rec, NULL, 0) != NVH_OK) return nvh_errcode();
        memcpy(&buf, n, CT_LINE);
        buf.count = cnt + 1;
        nt_lines(t, n, &buf, 0, CT_LINE);
        nvh_drain(pool);
        return NVH_OK;
    }
    memmove(&n->key[pos + 1], &n->key[pos], moved * 8);
    memmove(&n->ptr[pos + 1], &n->ptr[pos], moved * 8);
    n->key[pos] = k;
    n->ptr[pos] = p;
    nvh_flush(pool, (char *)n + ka, kb - ka);
    nvh_flush(pool, (char *)n + pa, pb - pa);
    nvh_drain(pool);
    if (rec && nvh_activate(pool, rec, NULL, 0) != NVH_OK) return nvh_errcode();
    n->count = cnt + 1;
    nvh_persist(pool, &n->count, sizeof n->count);
    return NVH_OK;
}

/* A new node holding a copy of buf (count, leaf, entries). CT_TX: allocated
 * in the transaction; otherwise written, flushed, fenced and activated. */
static ct_node *node_new(ct_tree *t, const ct_node *buf)
{
    nvh_pool *pool = t->pool;
    if (t->mode == CT_TX) {
        ct_node *n = nvh_tx_alloc(pool, sizeof *n);
        if (!n) return NULL;
        memcpy(n, buf, sizeof *n);
        if (t->nfresh < sizeof t->fresh / sizeof t->fresh[0]) t->fresh[t->nfresh++] = n;
        return n;
    }
    ct_node *n = nvh_reserve(pool, sizeof *n);
    if (!n) return NULL;
    if (t->mode == CT_NT) {
        nvh_memcpy_nodrain(pool, n, buf, sizeof *n);
    } else {
        memcpy(n, buf, sizeof *n);
        nvh_flush(pool, n, sizeof *n);
    }
    nvh_drain(pool);
    if (nvh_activate(pool, n, NULL, 0) != NVH_OK) return NULL;
    return n;
}

/* Set a node's count (the in-place half of a split). */
static int node_set_count(ct_tree *t, ct_node *n, uint32_t count)
{
    nvh_pool *pool = t->pool;
    if (t->mode == CT_TX) {
        if (!is_fresh(t, n)) {
            int rc = nvh_tx_add_range(pool, &n->count, 8);
            if (rc != NVH_OK) return rc;
        }
        n->count = count;
        return NVH_OK;
    }
    if (t->mode == CT_NT) {
        _Alignas(64) ct_node buf;
        memcpy(&buf, n, CT_LINE);
        buf.count = count;
        nt_lines(t, n, &buf, 0, CT_LINE);
        nvh_drain(pool);
        return NVH_OK;
    }
    n->count = count;
    nvh_persist(pool, &n->count, sizeof n->count);
    return NVH_OK;
}

static int set_root(ct_tree *t, ct_node *root)
{
    if (t->mode == CT_TX) {
        int rc = nvh_tx_add_range(t->pool, &t->hdr->root, 8);
        if (rc != NVH_OK) return rc;
        t->hdr->root = nvh_off(t->pool, root);
        return NVH_OK;
    }
    t->hdr->root = nvh_off(t->pool, root);
    nvh_persist(t->pool, &t->hdr->root, 8);
    return NVH_OK;
}

/* ---- insert --------------------------------------------------------------- */
/* Insert (k, p) at slot pos of n, whose ancestors are path[0 .. d-1] (n is
 * child idx[d-1] of path[d-1]); a full node splits, and the split goes up. */
static int entry_insert(ct_tree *t, ct_node **path, const unsigned *idx, int d, ct_node *n,
                        unsigned pos, uint64_t k, uint64_t p, void *rec)
{
    if (n->count < CT_CAP) return node_insert(t, n, pos, k, p, rec);
    const unsigned half = CT_CAP / 2;
    _Alignas(64) ct_node buf;
    memset(&buf, 0, sizeof buf);
    buf.leaf = n->leaf;
    buf.count = CT_CAP - half;
    memcpy(buf.key, &n->key[half], (CT_CAP - half) * 8);
    memcpy(buf.ptr, &n->ptr[half], (CT_CAP - half) * 8);
    ct_node *r = node_new(t, &buf);
    if (!r) return nvh_errcode();
    int rc = node_set_count(t, n, half);
    if (rc != NVH_OK) return rc;
    rc = pos <= half ? node_insert(t, n, pos, k, p, rec) : node_insert(t, r, pos - half, k, p, rec);
    if (rc != NVH_OK) return rc;
    uint64_t sep = r->key[0];
    if (d == 0) {
        memset(&buf, 0, sizeof buf);
        buf.count = 2;
        buf.key[1] = sep;
        buf.ptr[0] = nvh_off(t->pool, n);
        buf.ptr[1] = nvh_off(t->pool, r);
        ct_node *root = node_new(t, &buf);
        if (!root) return nvh_errcode();
        return set_root(t, root);
    }
    return entry_insert(t, path, idx, d - 1, path[d - 1], idx[d - 1] + 1, sep,
                        nvh_off(t->pool, r), NULL);
}

/* A value record {key, len, value}: CT_TX allocates it in the transaction
 * (flushed at commit); the others write and flush it, not yet activated. */
static ct_record *record_new(ct_tree *t, uint64_t key, const void *value, size_t len)
{
    nvh_pool *pool = t->pool;
    size_t size = sizeof(ct_record) + len;
    if (t->mode == CT_TX) {
        ct_record *r = nvh_tx_alloc(pool, size);
        if (!r) return NULL;
        r->key = key;
        r->len = len;
        memcpy(r->data, value, len);
        return r;
    }
    ct_record *r = nvh_reserve(pool, size);
    if (!r) return NULL;
    if (t->mode == CT_NT) {
        /* the first line composed in DRAM, the rest streamed from value */
        _Alignas(64) unsigned char line[CT_LINE];
        size_t head = len < CT_LINE - sizeof(ct_record) ? len : CT_LINE - sizeof(ct_record);
        memset(line, 0, sizeof line);
        memcpy(line, &key, 8);
        uint64_t l = len;
        memcpy(line + 8, &l, 8);
        memcpy(line + sizeof(ct_record), value, head);
        nvh_memcpy_nodrain(pool, r, line, CT_LINE);
        if (len > head)
            nvh_memcpy_nodrain(pool, (char *)r + CT_LINE, (const char *)value + head, len - head);
        return r;
    }
    r->key = key;
    r->len = len;
    memcpy(r->data, value, len);
    nvh_flush(pool, r, size);
    return r;
}

static int put_locked(ct_tree *t, uint64_t key, const void *value, size_t len)
{
    nvh_pool *pool = t->pool;
    ct_node *path[CT_MAX_DEPTH];
    unsigned idx[CT_MAX_DEPTH];
    int d = 0;
    ct_node *n = node_at(t, t->hdr->root);
    while (!n->leaf) {
        if (d == CT_MAX_DEPTH) return NVH_E_CORRUPT;
        unsigned i = child_index(n, key);
        path[d] = n;
        idx[d++] = i;
        n = node_at(t, n->ptr[i]);
    }
    unsigned pos = lower_bound(n->key, 0, n->count, key);
    ct_record *rec = record_new(t, key, value, len);
    if (!rec) return nvh_errcode();
    uint64_t roff = nvh_off(pool, rec);
    if (pos < n->count && n->key[pos] == key) {         /* replace */
        ct_record *old = nvh_ptr(pool, n->ptr[pos]);
        if (t->mode == CT_TX) {
            int rc = nvh_tx_add_range(pool, &n->ptr[pos], 8);
            if (rc != NVH_OK) return rc;
            n->ptr[pos] = roff;
            return nvh_tx_free(pool, old);
        }
        nvh_drain(pool);
        if (nvh_activate(pool, rec, NULL, 0) != NVH_OK) return nvh_errcode();
        n->ptr[pos] = roff;
        nvh_persist(pool, &n->ptr[pos], 8);
        return nvh_free(pool, old, NULL, 0);
    }
    int rc = entry_insert(t, path, idx, d, n, pos, key, roff, t->mode == CT_TX ? NULL : rec);
    if (rc == NVH_OK) t->count++;
    return rc;
}

int ct_put(ct_tree *t, uint64_t key, const void *value, size_t len)
{
    if (t->mode != CT_TX) return put_locked(t, key, value, len);
    int rc = nvh_tx_begin(t->pool);
    if (rc != NVH_OK) return rc;
    t->nfresh = 0;
    uint64_t count = t->count;
    rc = put_locked(t, key, value, len);
    if (rc != NVH_OK) {
        if (nvh_tx_stage_get(t->pool) != NVH_TX_NONE) nvh_tx_abort(t->pool);
        t->count = count;
        return rc;
    }
    rc = nvh_tx_commit(t->pool);
    if (rc != NVH_OK) t->count = count;
    return rc;
}

int ct_get(const ct_tree *t, uint64_t key, const void **value, size_t *len)
{
    const ct_node *n = node_at(t, t->hdr->root);
    while (!n->leaf) n = node_at(t, n->ptr[child_index(n, key)]);
    unsigned pos = lower_bound(n->key, 0, n->count, key);
    if (pos == n->count || n->key[pos] != key) return NVH_E_NOTFOUND;
    const ct_record *r = nvh_ptr(t->pool, n->ptr[pos]);
    if (value) *value = r->data;
    if (len) *len = (size_t)r->len;
    return NVH_OK;
}

uint64_t ct_count(const ct_tree *t) { return t->count; }

/* keys of n's subtree in [lo, hi]; returns the number of keys or -1 */
static int64_t check_node(const ct_tree *t, const ct_node *n, uint64_t lo, uint64_t hi, int depth)
{
    if (depth > CT_MAX_DEPTH || n->count == 0 || n->count > CT_CAP) return -1;
    for (unsigned i = 0; i < n->count; i++) {
        if (n->key[i] > hi || (i > 0 && n->key[i] <= n->key[i - 1])) return -1;
        if ((n->leaf || i > 0) && n->key[i] < lo) return -1;
    }
    if (n->leaf) {
        for (unsigned i = 0; i < n->count; i++) {
            const ct_record *r = nvh_ptr(t->pool, n->ptr[i]);
            if (r->key != n->key[i]) return -1;
        }
        return n->count;
    }
    int64_t total = 0;
    for (unsigned i = 0; i < n->count; i++) {
        uint64_t clo = i ? n->key[i] : lo, chi = i + 1 < n->count ? n->key[i + 1] - 1 : hi;
        int64_t c = check_node(t, node_at(t, n->ptr[i]), clo, chi, depth + 1);
        if (c < 0) return -1;
        total += c;
    }
    return total;
}

int ct_check(const ct_tree *t)
{
    const ct_node *root = node_at(t, t->hdr->root);
    if (root->leaf && root->count == 0) return t->count == 0 ? NVH_OK : NVH_E_CORRUPT;
    int64_t c = check_node(t, root, 0, UINT64_MAX, 0);
    return c >= 0 && (uint64_t)c == t->count ? NVH_OK : NVH_E_CORRUPT;
}

static int leaf_ctor(nvh_pool *pool, void *ptr, size_t size, void *arg)
{
    (void)pool;
    (void)arg;
    memset(ptr, 0, size);
    ((ct_node *)ptr)->leaf = 1;
    return 0;
}

ct_tree *ct_open(nvh_pool *pool, const char *name, ct_mode mode, int create)
{
    char hname[NVH_NAME_MAX + 1];
    snprintf(hname, sizeof hname, "ct.%s", name);
    ct_tree *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->pool = pool;
    t->mode = mode;
    t->hdr = nvh_get_named(pool, hname, NULL);
    if (t->hdr) {
        int64_t c = check_node(t, node_at(t, t->hdr->root), 0, UINT64_MAX, 0);
        const ct_node *root = node_at(t, t->hdr->root);
        if (c < 0 && !(root->leaf && root->count == 0)) {
            free(t);          /* damaged: ct_check's invariants do not hold */
            return NULL;
        }
        t->count = c < 0 ? 0 : (uint64_t)c;
        return t;
    }
    if (!create) {
        free(t);
        return NULL;
    }
    /* the root first (a crash before the name is activated leaks it) */
    ct_node *root = nvh_alloc(pool, sizeof(ct_node), leaf_ctor, NULL, NULL);
    t->hdr = root ? nvh_reserve_named(pool, hname, sizeof(ct_header)) : NULL;
    if (!t->hdr) {
        free(t);
        return NULL;
    }
    memset(t->hdr, 0, sizeof *t->hdr);
    t->hdr->root = nvh_off(pool, root);
    nvh_persist(pool, t->hdr, sizeof *t->hdr);
    if (nvh_activate_named(pool, hname) != NVH_OK) {
        free(t);
        return NULL;
    }
    return t;
}

void ct_close(ct_tree *t) { free(t); }
