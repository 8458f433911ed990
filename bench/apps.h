/* apps.h — what the application workloads of [Coburn09] §5.2 (SSCA,
 * 6-degrees, B-tree; app_ssca.c, app_sixdeg.c, app_btree.c) share: a small
 * transaction "backend" interface, so each application is written ONCE and
 * runs on nvheap's object transactions or on PMDK's transactions alike, and
 * nvheap's backend (PMDK's lives in bench_apps.c, so tests/apps need no PMDK).
 *
 * The rules an application follows (they are what makes one algorithm correct
 * on both backends):
 *   - persistent references are offsets from be->base (0 = none);
 *   - every access to a shared persistent object goes through rd() (read) or
 *     wr() (about to modify), each time it is needed: nvheap hands out a
 *     private copy (applied at commit), PMDK the object in place after
 *     snapshotting it, so a pointer from rd() is stale after a wr() of the
 *     same object — call wr() first if the object will be written;
 *   - rd()/wr()/alloc() return NULL on a conflict or error: the operation
 *     returns APP_RETRY-style non-zero at once (nvheap's nvh_tx_run retries
 *     a conflict);
 *   - memory from alloc() is zeroed, private to the transaction until linked,
 *     and written directly (no wr()).
 * Isolation: nvheap's object transactions are isolated on their own (eager
 * write locks, validated reads). PMDK's are not: its backend takes the lock
 * the operation names (one pool-resident rwlock for the whole structure, or
 * one of a set of pool-resident mutexes picked by a key) for the transaction,
 * as PMDK's TX_PARAM_RWLOCK / TX_PARAM_MUTEX are meant to be used. */
#ifndef NVH_BENCH_APPS_H
#define NVH_BENCH_APPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nvheap.h"

/* What the PMDK backend locks around one operation (nvheap ignores it). */
typedef enum app_lock {
    APP_LOCK_READ,      /* the structure's rwlock, shared; no PMDK transaction */
    APP_LOCK_WRITE,     /* the structure's rwlock, exclusive                   */
    APP_LOCK_KEY,       /* the mutex of stripe key % APP_STRIPES               */
    APP_LOCK_KEY_READ,  /* that mutex, for a read-only operation: no PMDK tx   */
} app_lock;

#define APP_STRIPES 1024u

typedef struct app_be app_be;
typedef int (*app_fn)(app_be *be, void *arg);

struct app_be {
    char *base;
    const void *(*rd)(app_be *be, const void *obj, size_t size);
    void *(*wr)(app_be *be, void *obj, size_t size);
    void *(*alloc)(app_be *be, size_t size);
    /* Run fn as one transaction (retried on conflicts); 0 on commit. */
    int (*run)(app_be *be, app_lock lock, uint64_t key, app_fn fn, void *arg);
    void *ctx;                  /* nvh_pool *, or the PMDK backend's state */
};

static inline void *app_ptr(const app_be *be, uint64_t off) { return off ? be->base + off : NULL; }
static inline uint64_t app_off(const app_be *be, const void *p)
{
    return p ? (uint64_t)((const char *)p - be->base) : 0;
}

/* The graph apps' root record (sixdeg, ssca): a magic, the vertex count and
 * the offset of nv vertex records, one cache line. */
typedef struct app_graph_root { uint64_t magic, nv, vertices; uint64_t pad[5]; } app_graph_root;
_Static_assert(sizeof(app_graph_root) == 64, "line-sized");

typedef struct app_graph_arg { uint64_t *slot; uint64_t magic; uint32_t nv; size_t vsize; } app_graph_arg;
static inline int app_graph_create_fn(app_be *be, void *p)
{
    app_graph_arg *a = p;
    app_graph_root *g = be->alloc(be, sizeof *g);
    void *vs = g ? be->alloc(be, (size_t)a->nv * a->vsize) : NULL;
    uint64_t *slot = vs ? be->wr(be, a->slot, 8) : NULL;
    if (!slot) return -1;
    *g = (app_graph_root){a->magic, a->nv, app_off(be, vs), {0}};
    *slot = app_off(be, g);
    return 0;
}

/* In one write transaction: a graph root with `magic` and nv zeroed vertex
 * records of vsize bytes, its offset stored in *root_slot. 0 on commit. */
static inline int app_graph_create(app_be *be, uint64_t *root_slot, uint64_t magic, uint32_t nv,
                                   size_t vsize)
{
    app_graph_arg a = {root_slot, magic, nv, vsize};
    return be->run(be, APP_LOCK_WRITE, 0, app_graph_create_fn, &a);
}

/* xorshift64: the workloads' random numbers (per thread, seeded) */
static inline uint64_t app_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}

/* ---- nvheap's backend: object transactions ----------------------------
 * rd() reads in place (nvh_tx_open_read): the applications' loops over an
 * object are bounded by its size and they follow references only through
 * rd()/wr(), which is what a transaction that will abort may rely on.
 * Under ThreadSanitizer rd() takes a private copy instead: the apps read
 * with plain loads, which are data races (harmless, validated) against
 * concurrent commits; the in-place path's TSan test reads atomically
 * (tests/tx/test_tx_otm_inplace.c). */
#if defined(__SANITIZE_THREAD__)
#define APP_NVH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define APP_NVH_TSAN 1
#endif
#endif
static inline const void *app_nvh_rd(app_be *be, const void *obj, size_t size)
{
#ifdef APP_NVH_TSAN
    return nvh_tx_open_read_copy(be->ctx, obj, size);
#else
    return nvh_tx_open_read(be->ctx, obj, size);
#endif
}
static inline void *app_nvh_wr(app_be *be, void *obj, size_t size)
{
    return nvh_tx_open_write(be->ctx, obj, size);
}
static inline void *app_nvh_alloc(app_be *be, size_t size) { return nvh_tx_alloc(be->ctx, size); }

typedef struct app_nvh_call { app_be *be; app_fn fn; void *arg; } app_nvh_call;
static inline int app_nvh_call_fn(app_nvh_call *c)
{
    int rc = c->fn(c->be, c->arg);
    /* a NULL from rd/wr/alloc: nvh_errcode() says whether it was a conflict */
    return rc ? (nvh_errcode() != NVH_OK ? nvh_errcode() : NVH_E_ABORTED) : NVH_OK;
}
/* Two trampolines, one per kind of operation: a program calling nvheap
 * directly passes each operation's own function to nvh_tx_run, and
 * nvh_tx_run picks the first attempt from what that function did before
 * (address-free after runs that only read); one trampoline for every
 * operation would mix lookups and updates under one function. The two
 * must stay distinct functions (no identical-code folding). */
#if defined(__GNUC__) && !defined(__clang__)
#define APP_NVH_DISTINCT __attribute__((unused, no_icf))
#else
#define APP_NVH_DISTINCT __attribute__((unused))
#endif
static APP_NVH_DISTINCT int app_nvh_body(nvh_pool *pool, void *p)
{
    (void)pool;
    return app_nvh_call_fn(p);
}
static APP_NVH_DISTINCT int app_nvh_body_read(nvh_pool *pool, void *p)
{
    (void)pool;
    return app_nvh_call_fn(p);
}
/* Every operation runs through plain nvh_tx_run; PMDK's backend takes a
 * read lock (or a stripe without a PMDK transaction) for the operations
 * that go to app_nvh_body_read. */
static inline int app_nvh_run(app_be *be, app_lock lock, uint64_t key, app_fn fn, void *arg)
{
    (void)key;
    app_nvh_call c = {be, fn, arg};
    bool read = lock == APP_LOCK_READ || lock == APP_LOCK_KEY_READ;
    return nvh_tx_run(be->ctx, read ? app_nvh_body_read : app_nvh_body, &c);
}

static inline app_be app_nvh_backend(nvh_pool *pool)
{
    return (app_be){nvh_pool_base(pool), app_nvh_rd, app_nvh_wr, app_nvh_alloc, app_nvh_run, pool};
}

/* ---- the applications (each file: build, operations, invariant check) --
 * A check returns 0 if the structure's invariants hold, else prints what
 * broke to stderr and returns non-zero. Each app keeps its root offset in a
 * 64-bit slot the caller provides in pool memory (the pool's root object). */

/* SSCA #2 (app_ssca.c): a scale-free directed graph with weighted edges. */
typedef struct ssca_graph ssca_graph;
int ssca_create(app_be *be, uint64_t *root_slot, uint32_t nvertices);
uint32_t ssca_nvertices(app_be *be, uint64_t root);
/* Kernel 1: the i-th of the generator's edges (R-MAT, seeded), added in one
 * transaction. */
void ssca_gen_edge(uint64_t seed, uint64_t i, uint32_t nv, uint32_t *src, uint32_t *dst,
                   uint32_t *w);
int ssca_add_edge(app_be *be, uint64_t root, uint32_t src, uint32_t dst, uint32_t w);
/* Kernel 2: the largest weight among vertex v's edges (read-only tx). */
int ssca_max_weight(app_be *be, uint64_t root, uint32_t v, uint32_t *out);
/* Reweighting kernel: set a random edge of v to weight w, updating the
 * vertex's weight sum and maximum in the same transaction. */
int ssca_reweight(app_be *be, uint64_t root, uint32_t v, uint64_t pick, uint32_t w);
/* Invariants: per vertex, degree == edges in its blocks, weight sum and
 * maximum match the edges, every edge's endpoint is a vertex; *edges_out
 * gets the total edge count. */
int ssca_check(app_be *be, uint64_t root, uint64_t *edges_out);

/* 6-degrees (app_sixdeg.c): a scale-free social graph, directed edges. */
int sixdeg_create(app_be *be, uint64_t *root_slot, uint32_t nvertices, uint32_t degree,
                  uint64_t seed);
/* BFS from a to b, at most `depth` links (read-only tx); *found 1 or 0,
 * *dist the links on the path (when found). */
int sixdeg_query(app_be *be, uint64_t root, uint32_t a, uint32_t b, unsigned depth, int *found,
                 unsigned *dist);
/* Mutation: edge a->b removed if present, else added (one transaction). */
int sixdeg_toggle(app_be *be, uint64_t root, uint32_t a, uint32_t b);
/* Invariants: degree == live edges of each vertex, no duplicate or self
 * edge, endpoints in range, total == sum of degrees. */
int sixdeg_check(app_be *be, uint64_t root, uint64_t *edges_out);
uint32_t sixdeg_nvertices(app_be *be, uint64_t root);
/* Free the calling thread's search scratch (call before a thread exits). */
void sixdeg_thread_exit(void);

/* B-tree (app_btree.c): CLRS B-tree (minimum degree 8) of 64-bit keys. */
int btree_create(app_be *be, uint64_t *root_slot);
/* The paper's operation: key present -> removed, absent -> inserted. */
int btree_toggle(app_be *be, uint64_t root, uint64_t key, int *inserted);
int btree_lookup(app_be *be, uint64_t root, uint64_t key, int *found);
/* Invariants: keys sorted within and across nodes, node fill within the
 * B-tree bounds, all leaves at one depth, live count == live keys;
 * *live_out gets the number of present keys. */
int btree_check(app_be *be, uint64_t root, uint64_t *live_out);

#endif /* NVH_BENCH_APPS_H */
