/* app_ssca.c — SSCA #2 graph kernels in persistent memory ([Coburn09] §5.2,
 * Fig. 6 "SSCA"): a scale-free graph built by transactions (kernel 1, graph
 * construction from an R-MAT edge generator), the first analysis (each
 * vertex's highest-weighted edge, read-only transactions), and a kernel that
 * changes edge weights transactionally (the edge, and its vertex's weight
 * sum and maximum, in one transaction).
 *
 * Layout: an array of 64-byte vertex records (one ownership record each on
 * nvheap) and, per vertex, a list of 64-byte edge blocks of 6 edges. Adding
 * an edge writes the vertex and the head block (a few words: nvheap's
 * one-fence commit) or allocates a new head block when the head is full. */
#include "apps.h"

#include <stdio.h>
#include <string.h>

#define SSCA_MAGIC 0x5353434132475246ull      /* "SSCA2GRF" */
#define BLOCK_EDGES 6u

typedef struct edge { uint32_t dst, w; } edge;
typedef struct block {
    uint64_t next;                  /* offset of the next block, 0 = end */
    uint64_t n;                     /* edges used in e[]                 */
    edge e[BLOCK_EDGES];
} block;
typedef struct vertex {
    uint64_t head;                  /* newest block                      */
    uint64_t degree;
    uint64_t wsum, wmax;            /* over the vertex's edges           */
    uint64_t pad[4];
} vertex;
typedef app_graph_root groot;   /* vertices: offset of nv vertex records */
_Static_assert(sizeof(block) == 64 && sizeof(vertex) == 64 && sizeof(groot) == 64, "line-sized");

static inline vertex *vtx(app_be *be, const groot *g, uint32_t v)
{
    return (vertex *)app_ptr(be, g->vertices) + v;
}

/* The root record is written once, at create: read it in place. */
static inline const groot *groot_of(app_be *be, uint64_t root) { return app_ptr(be, root); }

int ssca_create(app_be *be, uint64_t *root_slot, uint32_t nvertices)
{
    return app_graph_create(be, root_slot, SSCA_MAGIC, nvertices, sizeof(vertex));
}

uint32_t ssca_nvertices(app_be *be, uint64_t root) { return (uint32_t)groot_of(be, root)->nv; }

/* ---- kernel 1: graph construction ------------------------------------- */
static inline uint64_t mix(uint64_t x)      /* splitmix64 finaliser */
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* R-MAT with SSCA #2's parameters (a, b, c, d) = (0.55, 0.1, 0.1, 0.25):
 * at each of the log2(nv) levels the edge falls into one quadrant of the
 * adjacency matrix; weights uniform in [1, nv]. Deterministic in (seed, i). */
void ssca_gen_edge(uint64_t seed, uint64_t i, uint32_t nv, uint32_t *src, uint32_t *dst,
                   uint32_t *w)
{
    uint64_t s = mix(seed ^ mix(i)) | 1;
    uint32_t u = 0, v = 0;
    for (uint32_t bit = nv >> 1; bit; bit >>= 1) {
        uint32_t r = (uint32_t)(app_rand(&s) % 100);
        if (r < 55) {}
        else if (r < 65) v |= bit;
        else if (r < 75) u |= bit;
        else { u |= bit; v |= bit; }
    }
    *src = u;
    *dst = v;
    *w = 1 + (uint32_t)(app_rand(&s) % nv);
}

typedef struct add_arg { uint64_t root; uint32_t src, dst, w; } add_arg;
static int add_fn(app_be *be, void *p)
{
    add_arg *a = p;
    const groot *g = groot_of(be, a->root);
    vertex *v = be->wr(be, vtx(be, g, a->src), sizeof *v);
    if (!v) return -1;
    const block *h = v->head ? be->rd(be, app_ptr(be, v->head), sizeof *h) : NULL;
    if (v->head && !h) return -1;
    block *b;
    if (h && h->n < BLOCK_EDGES) {
        if (!(b = be->wr(be, app_ptr(be, v->head), sizeof *b))) return -1;
    } else {
        if (!(b = be->alloc(be, sizeof *b))) return -1;
        b->next = v->head;
        v->head = app_off(be, b);
    }
    b->e[b->n++] = (edge){a->dst, a->w};
    v->degree++;
    v->wsum += a->w;
    if (a->w > v->wmax) v->wmax = a->w;
    return 0;
}

int ssca_add_edge(app_be *be, uint64_t root, uint32_t src, uint32_t dst, uint32_t w)
{
    add_arg a = {root, src, dst, w};
    return be->run(be, APP_LOCK_KEY, src, add_fn, &a);
}

/* ---- kernel 2: the highest-weighted edge of a vertex ------------------ */
typedef struct max_arg { uint64_t root; uint32_t v; uint32_t out; } max_arg;
static int max_fn(app_be *be, void *p)
{
    max_arg *a = p;
    const groot *g = groot_of(be, a->root);
    const vertex *v = be->rd(be, vtx(be, g, a->v), sizeof *v);
    if (!v) return -1;
    uint32_t m = 0;
    for (uint64_t off = v->head; off;) {
        const block *b = be->rd(be, app_ptr(be, off), sizeof *b);
        if (!b) return -1;
        for (uint64_t k = 0; k < b->n && k < BLOCK_EDGES; k++)
            if (b->e[k].w > m) m = b->e[k].w;
        off = b->next;
    }
    a->out = m;
    return 0;
}

int ssca_max_weight(app_be *be, uint64_t root, uint32_t v, uint32_t *out)
{
    max_arg a = {root, v, 0};
    int rc = be->run(be, APP_LOCK_KEY_READ, v, max_fn, &a);
    *out = a.out;
    return rc;
}

/* ---- reweighting: one edge and its vertex's sum and maximum ------------ */
typedef struct rw_arg { uint64_t root; uint32_t v; uint64_t pick; uint32_t w; } rw_arg;
static int reweight_fn(app_be *be, void *p)
{
    rw_arg *a = p;
    const groot *g = groot_of(be, a->root);
    vertex *v = be->wr(be, vtx(be, g, a->v), sizeof *v);
    if (!v) return -1;
    if (!v->degree) return 0;
    uint64_t k = a->pick % v->degree;
    uint64_t m = 0;
    for (uint64_t off = v->head; off;) {
        const block *b = be->rd(be, app_ptr(be, off), sizeof *b);
        if (!b) return -1;
        if (k < b->n) {
            block *bw = be->wr(be, app_ptr(be, off), sizeof *bw);
            if (!bw) return -1;
            v->wsum = v->wsum - bw->e[k].w + a->w;
            bw->e[k].w = a->w;
            b = bw;
            k = UINT64_MAX;                     /* done: only the maximum is left */
        } else if (k != UINT64_MAX) {
            k -= b->n;
        }
        for (uint64_t j = 0; j < b->n && j < BLOCK_EDGES; j++)
            if (b->e[j].w > m) m = b->e[j].w;
        off = b->next;
    }
    v->wmax = m;
    return 0;
}

int ssca_reweight(app_be *be, uint64_t root, uint32_t v, uint64_t pick, uint32_t w)
{
    rw_arg a = {root, v, pick, w};
    return be->run(be, APP_LOCK_KEY, v, reweight_fn, &a);
}

/* ---- invariants (quiescent structure, read in place) ------------------- */
int ssca_check(app_be *be, uint64_t root, uint64_t *edges_out)
{
    const groot *g = root ? groot_of(be, root) : NULL;
    if (!g || g->magic != SSCA_MAGIC) {
        fprintf(stderr, "ssca: bad root record\n");
        return 1;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < g->nv; i++) {
        const vertex *v = vtx(be, g, i);
        uint64_t n = 0, sum = 0, max = 0, blocks = 0;
        for (uint64_t off = v->head; off; blocks++) {
            const block *b = app_ptr(be, off);
            if (b->n == 0 || b->n > BLOCK_EDGES || blocks > v->degree) {
                fprintf(stderr, "ssca: vertex %u: block %llu holds %llu edges\n", i,
                        (unsigned long long)blocks, (unsigned long long)b->n);
                return 1;
            }
            for (uint64_t k = 0; k < b->n; k++) {
                if (b->e[k].dst >= g->nv || b->e[k].w == 0) {
                    fprintf(stderr, "ssca: vertex %u: bad edge to %u weight %u\n", i, b->e[k].dst,
                            b->e[k].w);
                    return 1;
                }
                n++;
                sum += b->e[k].w;
                if (b->e[k].w > max) max = b->e[k].w;
            }
            off = b->next;
        }
        if (n != v->degree || sum != v->wsum || max != v->wmax) {
            fprintf(stderr, "ssca: vertex %u: degree %llu sum %llu max %llu, edges say %llu %llu %llu\n",
                    i, (unsigned long long)v->degree, (unsigned long long)v->wsum,
                    (unsigned long long)v->wmax, (unsigned long long)n, (unsigned long long)sum,
                    (unsigned long long)max);
            return 1;
        }
        total += n;
    }
    if (edges_out) *edges_out = total;
    return 0;
}
