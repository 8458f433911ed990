/* app_sixdeg.c — 6-degrees of separation in persistent memory ([Coburn09]
 * §5.2, Fig. 6 "6-degrees"): a scale-free social graph; threads alternate
 * between a query (is there a path of at most `depth` links from a to b? a
 * breadth-first search in one read-only transaction; depth 6 is the paper's,
 * depth 2 the friend-of-friend query) and a mutation (the edge a->b removed
 * if present, else added, in one transaction), which keeps the number of
 * edges steady.
 *
 * The graph is built by preferential attachment (Barabasi-Albert: each new
 * vertex links to `degree` vertices picked in proportion to their degree,
 * both directions), which gives a power-law degree distribution (exponent
 * near 3; the paper's generator aims at 2.72).
 *
 * Layout: 64-byte vertex records (head of its block list, degree) and
 * 64-byte edge blocks of 14 slots (vertex id + 1; 0 = free slot). A removed
 * edge frees its slot, which the next addition to that vertex reuses, so
 * nothing is ever freed while a concurrent search may still read it. */
#include "apps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIXDEG_MAGIC 0x3644454752454553ull     /* "6DEGREES" */
#define SLOTS 14u

typedef struct block { uint64_t next; uint32_t dst[SLOTS]; } block;
typedef struct vertex { uint64_t head, degree; uint64_t pad[6]; } vertex;
typedef app_graph_root groot;
_Static_assert(sizeof(block) == 64 && sizeof(vertex) == 64 && sizeof(groot) == 64, "line-sized");

/* The root record is written once, at create: read it in place. */
static inline const groot *groot_of(app_be *be, uint64_t root) { return app_ptr(be, root); }
static inline vertex *vtx(app_be *be, const groot *g, uint32_t v)
{
    return (vertex *)app_ptr(be, g->vertices) + v;
}

uint32_t sixdeg_nvertices(app_be *be, uint64_t root) { return (uint32_t)groot_of(be, root)->nv; }

/* ---- mutation ------------------------------------------------------------ */
typedef struct tog_arg { uint64_t root; uint32_t a, b; int only_add; } tog_arg;
static int toggle_fn(app_be *be, void *p)
{
    tog_arg *t = p;
    const groot *g = groot_of(be, t->root);
    vertex *v = be->wr(be, vtx(be, g, t->a), sizeof *v);
    if (!v) return -1;
    uint64_t free_off = 0;
    unsigned free_k = 0;
    for (uint64_t off = v->head; off;) {
        const block *b = be->rd(be, app_ptr(be, off), sizeof *b);
        if (!b) return -1;
        for (unsigned k = 0; k < SLOTS; k++) {
            if (b->dst[k] == t->b + 1) {
                if (t->only_add) return 0;
                block *w = be->wr(be, app_ptr(be, off), sizeof *w);
                if (!w) return -1;
                w->dst[k] = 0;
                v->degree--;
                return 0;
            }
            if (!b->dst[k] && !free_off) { free_off = off; free_k = k; }
        }
        off = b->next;
    }
    block *w;
    if (free_off) {
        if (!(w = be->wr(be, app_ptr(be, free_off), sizeof *w))) return -1;
    } else {
        if (!(w = be->alloc(be, sizeof *w))) return -1;
        w->next = v->head;
        v->head = app_off(be, w);
        free_k = 0;
    }
    w->dst[free_k] = t->b + 1;
    v->degree++;
    return 0;
}

int sixdeg_toggle(app_be *be, uint64_t root, uint32_t a, uint32_t b)
{
    if (a == b) return 0;
    tog_arg t = {root, a, b, 0};
    return be->run(be, APP_LOCK_WRITE, 0, toggle_fn, &t);
}

/* ---- build ------------------------------------------------------------- */

int sixdeg_create(app_be *be, uint64_t *root_slot, uint32_t nv, uint32_t degree, uint64_t seed)
{
    int rc = app_graph_create(be, root_slot, SIXDEG_MAGIC, nv, sizeof(vertex));
    if (rc) return rc;
    uint64_t root = *root_slot;
    /* endpoints of every edge so far: a uniform pick is a degree-weighted one */
    uint32_t *ends = malloc(sizeof *ends * ((size_t)nv * degree * 2 + 2));
    if (!ends) return -1;
    uint64_t nends = 0, s = seed | 1;
    for (uint32_t v = 1; v < nv && !rc; v++) {
        for (uint32_t k = 0; k < degree && k < v && !rc; k++) {
            uint32_t t = nends ? ends[app_rand(&s) % nends] : 0;
            if (t == v) continue;
            tog_arg x = {root, v, t, 1}, y = {root, t, v, 1};
            rc = be->run(be, APP_LOCK_WRITE, 0, toggle_fn, &x);
            if (!rc) rc = be->run(be, APP_LOCK_WRITE, 0, toggle_fn, &y);
            ends[nends++] = v;
            ends[nends++] = t;
        }
    }
    free(ends);
    return rc;
}

/* ---- query: bounded breadth-first search -------------------------------- */
/* Per-thread scratch: visit stamps and two frontiers (a retried search
 * starts over with a new stamp). */
static _Thread_local struct { uint32_t *mark, *cur, *next, n, stamp; } bfs;

static int bfs_scratch(uint32_t nv)
{
    if (bfs.n >= nv) return 0;
    free(bfs.mark); free(bfs.cur); free(bfs.next);
    bfs.mark = calloc(nv, sizeof *bfs.mark);
    bfs.cur = malloc(nv * sizeof *bfs.cur);
    bfs.next = malloc(nv * sizeof *bfs.next);
    bfs.stamp = 0;
    bfs.n = bfs.mark && bfs.cur && bfs.next ? nv : 0;
    return bfs.n ? 0 : -1;
}

void sixdeg_thread_exit(void)
{
    free(bfs.mark); free(bfs.cur); free(bfs.next);
    bfs.mark = bfs.cur = bfs.next = NULL;
    bfs.n = 0;
}

typedef struct q_arg { uint64_t root; uint32_t a, b; unsigned depth; int found; unsigned dist; } q_arg;
static int query_fn(app_be *be, void *p)
{
    q_arg *q = p;
    const groot *g = groot_of(be, q->root);
    uint32_t stamp = ++bfs.stamp;
    if (stamp == 0) { memset(bfs.mark, 0, bfs.n * sizeof *bfs.mark); stamp = bfs.stamp = 1; }
    uint32_t *cur = bfs.cur, *next = bfs.next, ncur = 1;
    cur[0] = q->a;
    bfs.mark[q->a] = stamp;
    q->found = q->a == q->b;
    q->dist = 0;
    for (unsigned d = 1; d <= q->depth && ncur && !q->found; d++) {
        uint32_t nnext = 0;
        for (uint32_t i = 0; i < ncur && !q->found; i++) {
            const vertex *v = be->rd(be, vtx(be, g, cur[i]), sizeof *v);
            if (!v) return -1;
            for (uint64_t off = v->head; off && !q->found;) {
                const block *b = be->rd(be, app_ptr(be, off), sizeof *b);
                if (!b) return -1;
                for (unsigned k = 0; k < SLOTS; k++) {
                    uint32_t u = b->dst[k];
                    if (!u-- || u >= g->nv || bfs.mark[u] == stamp) continue;
                    if (u == q->b) { q->found = 1; q->dist = d; break; }
                    bfs.mark[u] = stamp;
                    next[nnext++] = u;
                }
                off = b->next;
            }
        }
        uint32_t *t = cur; cur = next; next = t;
        ncur = nnext;
    }
    return 0;
}

int sixdeg_query(app_be *be, uint64_t root, uint32_t a, uint32_t b, unsigned depth, int *found,
                 unsigned *dist)
{
    if (bfs_scratch(sixdeg_nvertices(be, root))) return -1;
    q_arg q = {root, a, b, depth, 0, 0};
    int rc = be->run(be, APP_LOCK_READ, 0, query_fn, &q);
    *found = q.found;
    if (dist) *dist = q.dist;
    return rc;
}

/* ---- invariants (quiescent structure, read in place) ------------------- */
int sixdeg_check(app_be *be, uint64_t root, uint64_t *edges_out)
{
    const groot *g = root ? groot_of(be, root) : NULL;
    if (!g || g->magic != SIXDEG_MAGIC) {
        fprintf(stderr, "sixdeg: bad root record\n");
        return 1;
    }
    uint32_t *seen = calloc(g->nv, sizeof *seen);
    if (!seen) return 1;
    uint64_t total = 0;
    int bad = 0;
    for (uint32_t i = 0; i < g->nv && !bad; i++) {
        const vertex *v = vtx(be, g, i);
        uint64_t n = 0, blocks = 0;
        for (uint64_t off = v->head; off && !bad; off = ((const block *)app_ptr(be, off))->next) {
            const block *b = app_ptr(be, off);
            if (++blocks > g->nv) { fprintf(stderr, "sixdeg: vertex %u: block cycle\n", i); bad = 1; }
            for (unsigned k = 0; k < SLOTS && !bad; k++) {
                uint32_t u = b->dst[k];
                if (!u--) continue;
                if (u >= g->nv || u == i || seen[u] == i + 1) {
                    fprintf(stderr, "sixdeg: vertex %u: bad or duplicate edge to %u\n", i, u);
                    bad = 1;
                }
                seen[u] = i + 1;
                n++;
            }
        }
        if (!bad && n != v->degree) {
            fprintf(stderr, "sixdeg: vertex %u: degree %llu, %llu edges\n", i,
                    (unsigned long long)v->degree, (unsigned long long)n);
            bad = 1;
        }
        total += n;
    }
    free(seen);
    if (edges_out) *edges_out = total;
    return bad;
}
