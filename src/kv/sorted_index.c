/* sorted_index.c — the sorted engine's inner index: a DRAM B+ tree over the
 * leaf companions, copy-on-write. Readers load the root once (acquire) and
 * descend a snapshot that no writer ever changes; a writer (under smo)
 * copies the path it changes, publishes the new root with one release
 * store, and retires the old path nodes through the epochs (sorted.c).
 * That makes readers wait-free here: no version checks, no retries. The
 * price is a path copy per leaf split (depth x ~800 B). */
#include "sorted_int.h"

kvs_skey *kvs_skey_new(const void *k, size_t kl)
{
    kvs_skey *s = malloc(sizeof *s + kl);
    if (!s) return NULL;
    s->prefix = kvs_prefix(k, kl);
    s->len = (uint32_t)kl;
    s->refs = 1;
    memcpy(s->b, k, kl);
    return s;
}

/* key (k, kl, kp) against separator i of n: <0, 0, >0. The node's own
 * copy of the separators' prefixes decides most comparisons without a
 * read of the separator (a cache miss per step of the binary search). */
static inline int ix_cmp(const kv_sorted *t, const void *k, size_t kl, uint64_t kp,
                         const kvs_inode *n, unsigned i)
{
    if (!t->cmp && kp != n->pfx[i]) return kp < n->pfx[i] ? -1 : 1;
    const kvs_skey *s = n->sep[i];
    if (!t->cmp) {
        int c = kvs_sum_cmp(kp, kl, s->prefix, s->len);
        if (c != 2) return c;
    }
    return kvs_cmp(t, k, kl, s->b, s->len);
}

/* Last child i >= 1 with sep[i] <= key (strict: sep[i] < key), else 0. */
static inline unsigned ix_pick(const kv_sorted *t, const kvs_inode *n, const void *k,
                               size_t kl, uint64_t kp, int strict)
{
    unsigned lo = 1, hi = n->n;       /* answer in [0, n-1]: first i with sep[i] > key, minus 1 */
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        int c = ix_cmp(t, k, kl, kp, n, mid);
        if (strict ? c > 0 : c >= 0) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

/* ix_pick(..., strict 0) for bytewise order: a branch-free search of the
 * node's prefixes (a random key's path through a binary search mispredicts
 * half its branches) in six fixed steps, since pfx[] holds UINT64_MAX
 * beyond n (ix_trim) and pfx[0] is 0; then the separators themselves only
 * if the key's prefix equals the one picked (keys sharing their first 8
 * bytes). */
static inline unsigned ix_pick_bytes(const kv_sorted *t, const kvs_inode *n, const void *k,
                                     size_t kl, uint64_t kp)
{
    static_assert(KVS_FAN == 64, "six steps");
    const uint64_t *a = n->pfx;
    unsigned i = 0;                 /* last i with a[i] <= kp */
    i += a[i + 32] <= kp ? 32 : 0;
    i += a[i + 16] <= kp ? 16 : 0;
    i += a[i + 8] <= kp ? 8 : 0;
    i += a[i + 4] <= kp ? 4 : 0;
    i += a[i + 2] <= kp ? 2 : 0;
    i += a[i + 1] <= kp ? 1 : 0;
    if (i >= n->n) i = n->n - 1;    /* kp == UINT64_MAX: the padding matched */
    if (i == 0 || a[i] != kp) return i;
    return ix_pick(t, n, k, kl, kp, 0);             /* prefixes tie */
}

kvs_cleaf *kvs_ix_find(const kv_sorted *t, const kvs_inode *root, const void *k, size_t kl,
                       uint64_t kp, const kvs_skey **lo)
{
    const kvs_inode *n = root;
    const kvs_skey *bound = NULL;
    if (!n || n->n == 0) return NULL;
    for (;;) {
        unsigned i = t->cmp ? ix_pick(t, n, k, kl, kp, 0) : ix_pick_bytes(t, n, k, kl, kp);
        if (i > 0) bound = n->sep[i];
        if (n->level == 0) {
            if (lo) *lo = bound;
            kvs_prefetch(n->child[i], KVS_CLEAF_LOOKUP_LINES);
            return n->child[i];
        }
        n = n->child[i];
        /* the binary search's lines: header and prefixes, together */
        kvs_prefetch(n, 1 + (unsigned)(KVS_FAN * 8 / 64));
    }
}

kvs_cleaf *kvs_ix_below(const kv_sorted *t, const kvs_inode *root, const kvs_skey *s,
                        const kvs_skey **lo)
{
    const kvs_inode *n = root;
    const kvs_skey *bound = NULL;
    if (!s || !n || n->n == 0) return NULL;
    for (;;) {
        unsigned i = ix_pick(t, n, s->b, s->len, s->prefix, 1);
        if (i > 0) bound = n->sep[i];
        if (n->level == 0) {
            if (lo) *lo = bound;
            return n->child[i];
        }
        n = n->child[i];
    }
}

kvs_cleaf *kvs_ix_first(const kvs_inode *root)
{
    const kvs_inode *n = root;
    if (!n || n->n == 0) return NULL;
    while (n->level > 0) n = n->child[0];
    return n->child[0];
}

kvs_cleaf *kvs_ix_last(const kvs_inode *root, const kvs_skey **lo)
{
    const kvs_inode *n = root;
    const kvs_skey *bound = NULL;
    if (!n || n->n == 0) return NULL;
    for (;;) {
        unsigned i = n->n - 1;
        if (i > 0) bound = n->sep[i];
        if (n->level == 0) {
            if (lo) *lo = bound;
            return n->child[i];
        }
        n = n->child[i];
    }
}

/* pfx[] past the last entry reads UINT64_MAX (ix_pick_bytes). */
static inline void ix_trim(kvs_inode *n)
{
    for (unsigned i = n->n ? n->n : 1; i < KVS_FAN; i++) n->pfx[i] = UINT64_MAX;
}

static kvs_inode *ix_node(uint32_t level)
{
    kvs_inode *n = calloc(1, sizeof *n);
    if (n) {
        n->level = level;
        ix_trim(n);
    }
    return n;
}

static inline void ix_set(kvs_inode *n, unsigned i, kvs_skey *s, void *child)
{
    n->sep[i] = i ? s : NULL;
    n->pfx[i] = (i && s) ? s->prefix : 0;
    n->child[i] = child;
}

kvs_inode *kvs_ix_build(kvs_cleaf **leaves, size_t n)
{
    /* fill nodes to 3/4 so that splits do not follow at once */
    const unsigned per = KVS_FAN * 3 / 4;
    size_t cnt = n;
    void **kids = malloc((n ? n : 1) * sizeof *kids);
    kvs_skey **seps = malloc((n ? n : 1) * sizeof *seps);
    if (!kids || !seps) { free(kids); free(seps); return NULL; }
    for (size_t i = 0; i < n; i++) { kids[i] = leaves[i]; seps[i] = leaves[i]->sep; }
    uint32_t level = 0;
    if (n == 0) {
        free(kids); free(seps);
        return ix_node(0);
    }
    for (;;) {
        size_t nn = (cnt + per - 1) / per, out = 0;
        for (size_t j = 0; j < nn; j++) {
            kvs_inode *x = ix_node(level);
            if (!x) { free(kids); free(seps); return NULL; }   /* leaks the level: NOMEM */
            size_t from = j * cnt / nn, to = (j + 1) * cnt / nn;
            for (size_t i = from; i < to; i++) {
                ix_set(x, (unsigned)(i - from), seps[i], kids[i]);
                if (i > from && seps[i]) seps[i]->refs++;
            }
            x->n = (uint32_t)(to - from);
            kvs_skey *s = seps[from];
            kids[out] = x;
            seps[out] = s;
            out++;
        }
        cnt = out;
        if (cnt == 1) break;
        level++;
    }
    kvs_inode *r = kids[0];
    free(kids);
    free(seps);
    return r;
}

void kvs_skey_unref(kv_sorted *t, kvs_skey *s, int now)
{
    if (!s || --s->refs > 0) return;
    if (now || kvs_retire(t, KVS_R_MEM, s) != NVH_OK) {
        if (now) free(s);
        /* no room to retire it: keep it (a few bytes) rather than risk a reader */
    }
}

void kvs_ix_free(kv_sorted *t, kvs_inode *n)
{
    if (!n) return;
    for (unsigned i = 1; i < n->n; i++) kvs_skey_unref(t, n->sep[i], 1);
    if (n->level > 0)
        for (unsigned i = 0; i < n->n; i++) kvs_ix_free(t, n->child[i]);
    free(n);
}

/* The path from the root to the level-0 node holding companion c: descend
 * with c's separator (its range always contains it), then find c. */
typedef struct ix_step { kvs_inode *n; unsigned i; } ix_step;

static int ix_path(kv_sorted *t, kvs_cleaf *c, ix_step *path, int *depth)
{
    kvs_inode *n = t->root;
    int d = 0;
    for (;;) {
        unsigned i;
        if (c->sep) i = ix_pick(t, n, c->sep->b, c->sep->len, c->sep->prefix, 0);
        else i = 0;
        if (n->level == 0) {
            /* equal separators cannot occur; a removed neighbour may have
             * moved c's lower bound: look around the pick */
            if (n->child[i] != c) {
                unsigned j;
                for (j = 0; j < n->n && n->child[j] != c; j++) {}
                if (j == n->n) return kvs_corrupt(t, nvh_off(t->pool, c->p), "sorted index (leaf not found)");
                i = j;
            }
            path[d].n = n;
            path[d].i = i;
            *depth = d;
            return NVH_OK;
        }
        path[d].n = n;
        path[d].i = i;
        if (++d >= KVS_DEPTH_MAX) return kvs_corrupt(t, 0, "sorted index (too deep)");
        n = n->child[i];
    }
}

static kvs_inode *ix_copy(kv_sorted *t, const kvs_inode *n)
{
    kvs_inode *x = kvs_inode_take(t);
    if (x) memcpy(x, n, sizeof *x);
    return x;
}

static void ix_insert_at(kvs_inode *x, unsigned i, kvs_skey *s, void *child)
{
    memmove(&x->pfx[i + 1], &x->pfx[i], (x->n - i) * sizeof x->pfx[0]);
    memmove(&x->sep[i + 1], &x->sep[i], (x->n - i) * sizeof x->sep[0]);
    memmove(&x->child[i + 1], &x->child[i], (x->n - i) * sizeof x->child[0]);
    ix_set(x, i, s, child);
    x->n++;
}

static void ix_delete_at(kvs_inode *x, unsigned i)
{
    memmove(&x->pfx[i], &x->pfx[i + 1], (x->n - i - 1) * sizeof x->pfx[0]);
    memmove(&x->sep[i], &x->sep[i + 1], (x->n - i - 1) * sizeof x->sep[0]);
    memmove(&x->child[i], &x->child[i + 1], (x->n - i - 1) * sizeof x->child[0]);
    x->n--;
    if (x->n) { x->sep[0] = NULL; x->pfx[0] = 0; }
    ix_trim(x);
}

/* Publish root r; retire the replaced path nodes. */
static int ix_publish(kv_sorted *t, kvs_inode *r, ix_step *path, int depth)
{
    KVS_STORE(&t->root, r);
    int rc = NVH_OK;
    for (int d = 0; d <= depth; d++) {
        int e = kvs_retire(t, KVS_R_INODE, path[d].n);
        if (e && !rc) rc = e;
    }
    return rc;
}

int kvs_ix_replace(kv_sorted *t, kvs_cleaf *old, kvs_cleaf *a, kvs_cleaf *b, kvs_skey *sb)
{
    ix_step path[KVS_DEPTH_MAX];
    int depth, rc = ix_path(t, old, path, &depth);
    if (rc) return rc;
    kvs_inode *fresh[KVS_DEPTH_MAX + 1] = {0};
    int nf = 0;
    /* carry: what replaces the child at the level above (x), and an extra
     * node (y, lower bound sy) to insert after it when x split */
    kvs_inode *x = ix_copy(t, path[depth].n);
    if (!x) goto nomem;
    fresh[nf++] = x;
    unsigned i = path[depth].i;
    x->child[i] = a;
    void *ins = b;
    kvs_skey *sins = sb;
    unsigned at = i + 1;
    void *repl;
    for (int d = depth;; d--) {
        kvs_inode *y = NULL;
        kvs_skey *sy = NULL;
        if (ins) {
            if (x->n < KVS_FAN) {
                ix_insert_at(x, at, sins, ins);
            } else {
                /* split x: left keeps FAN/2, y the rest plus the new entry */
                y = ix_node(x->level);
                if (!y) goto nomem;
                fresh[nf++] = y;
                unsigned h = KVS_FAN / 2;
                for (unsigned j = h; j < x->n; j++) ix_set(y, j - h, x->sep[j], x->child[j]);
                y->n = x->n - h;
                sy = x->sep[h];
                y->sep[0] = NULL;
                y->pfx[0] = 0;
                x->n = h;
                ix_trim(x);
                if (at <= h) ix_insert_at(x, at, sins, ins);
                else ix_insert_at(y, at - h, sins, ins);
                if (at == h) {
                    /* the new entry is x's last: fine, y starts at the old h */
                }
            }
        }
        repl = x;
        if (d == 0) {
            if (y) {
                kvs_inode *r = ix_node(x->level + 1);
                if (!r) goto nomem;
                fresh[nf++] = r;
                ix_set(r, 0, NULL, x);
                ix_set(r, 1, sy, y);
                r->n = 2;
                repl = r;
            }
            break;
        }
        kvs_inode *p = ix_copy(t, path[d - 1].n);
        if (!p) goto nomem;
        fresh[nf++] = p;
        p->child[path[d - 1].i] = x;
        ins = y;
        sins = sy;
        at = path[d - 1].i + 1;
        x = p;
    }
    if (sb) sb->refs++;
    return ix_publish(t, repl, path, depth);
nomem:
    for (int j = 0; j < nf; j++) free(fresh[j]);
    return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for the index");
}

int kvs_ix_remove(kv_sorted *t, kvs_cleaf *c)
{
    ix_step path[KVS_DEPTH_MAX];
    int depth, rc = ix_path(t, c, path, &depth);
    if (rc) return rc;
    kvs_inode *fresh[KVS_DEPTH_MAX] = {0};
    int nf = 0;
    /* drop the entry; a node left empty is dropped from its parent */
    int d = depth;
    kvs_inode *x = NULL;
    kvs_skey *dropped = NULL;
    for (; d >= 0; d--) {
        if (path[d].n->n > 1 || d == 0) {
            x = ix_copy(t, path[d].n);
            if (!x) goto nomem;
            fresh[nf++] = x;
            /* the entry's separator leaves the index, or (entry 0) its
             * successor's does: it becomes the node's first child */
            dropped = path[d].i > 0 ? x->sep[path[d].i] : (x->n > 1 ? x->sep[1] : NULL);
            ix_delete_at(x, path[d].i);
            break;
        }
    }
    if (!x || x->n == 0) {
        for (int j = 0; j < nf; j++) free(fresh[j]);
        return kvs_corrupt(t, nvh_off(t->pool, c->p), "sorted index (removing the last leaf)");
    }
    for (int e = d - 1; e >= 0; e--) {
        kvs_inode *p = ix_copy(t, path[e].n);
        if (!p) goto nomem;
        fresh[nf++] = p;
        p->child[path[e].i] = x;
        x = p;
    }
    rc = ix_publish(t, x, path, depth);
    kvs_skey_unref(t, dropped, 0);
    return rc;
nomem:
    for (int j = 0; j < nf; j++) free(fresh[j]);
    return nvh_fail(NVH_E_NOMEM, "sorted tree: out of memory for the index");
}
