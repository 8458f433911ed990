/* test_alloc_crash.c — crash consistency of the allocator under the crash
 * simulator (nvh_crash_explore): a crash at every fence of reserve/activate/
 * free/named sequences with 0, 1 and 2 links (line and word modes), and
 * sampled crashes in a long random alloc/free run that wraps the redo rings
 * many times, and replay order across rings (a record that happens after
 * another ring's record replays after it), and power-of-two large objects
 * packed edge to edge in a chunk, and the classes above 4032 B in
 * multi-block runs.
 * After each recovery the checker
 * demands:
 *   - every acknowledged activation/free survived, the op in flight happened
 *     entirely or not at all (links all old or all new);
 *   - the live objects are exactly the ones reachable from the model's links
 *     and names (no leak, no lost object); no two live objects overlap;
 *   - object contents are intact; no corrupt header;
 *   - free space is reusable: new allocations succeed and disturb nothing. */
#include "test_util.h"
#include "alloc/alloc.h"      /* white-box: the run geometry table */

#include <stdbool.h>
#include <pthread.h>
#include <sys/mman.h>

#define LAYOUT "alloccrash"
#define NSLOTS 512
#define MAXOBJ 4096

enum { ST_NONE, ST_ALLOC, ST_LIVE, ST_FREEING, ST_DEAD };
typedef struct mobj {
    uint64_t off;
    uint32_t size, tag;
    int16_t link[2];
    int16_t name;       /* -1 none */
    uint8_t nlinks;
    volatile uint8_t state;
} mobj;

/* the model, inherited by the forked crash children */
static mobj g_obj[MAXOBJ];
static volatile int g_nobj;
static int *g_complaints;

static uint8_t fillbyte(uint32_t tag, uint32_t i) { return (uint8_t)(tag * 31u + i * 7u + 1u); }

static void fill(void *p, uint32_t size, uint32_t tag)
{
    unsigned char *c = p;
    uint32_t n = size < 512 ? size : 512;   /* head and tail carry the tag */
    for (uint32_t i = 0; i < n; i++) c[i] = fillbyte(tag, i);
    if (size > 512) c[size - 1] = fillbyte(tag, size);
}

static bool content_ok(const void *p, uint32_t size, uint32_t tag)
{
    const unsigned char *c = p;
    uint32_t n = size < 512 ? size : 512;
    for (uint32_t i = 0; i < n; i++)
        if (c[i] != fillbyte(tag, i)) return false;
    return size <= 512 || c[size - 1] == fillbyte(tag, size);
}

/* ---------------------------------------------------------------------------
 * Operations (shared by the workloads)
 * ------------------------------------------------------------------------- */
static bool slot_used[NSLOTS];
static int g_force_slot = -1;   /* >= 0: the next link slot op_alloc takes */

static int free_slot(uint64_t *rng)
{
    if (g_force_slot >= 0) {
        int s = g_force_slot;
        g_force_slot = -1;
        return slot_used[s] ? -1 : s;
    }
    for (int tries = 0; tries < 4 * NSLOTS; tries++) {
        int s = (int)(test_rand(rng) % NSLOTS);
        if (!slot_used[s]) return s;
    }
    return -1;
}

static int op_alloc(nvh_pool *pool, uint64_t *rng, uint32_t size, unsigned nlinks, int name)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    if (g_nobj >= MAXOBJ) return 0;
    mobj *o = &g_obj[g_nobj];
    memset(o, 0, sizeof *o);
    o->link[0] = o->link[1] = -1;
    o->name = (int16_t)name;
    o->size = size;
    o->tag = (uint32_t)test_rand(rng);
    o->nlinks = (uint8_t)nlinks;
    for (unsigned i = 0; i < nlinks; i++) {
        int s = free_slot(rng);
        if (s < 0) return 0;
        o->link[i] = (int16_t)s;
        slot_used[s] = true;
    }
    void *p;
    char nm[32];
    if (name >= 0) {
        snprintf(nm, sizeof nm, "name-%d", name);
        p = nvh_reserve_named(pool, nm, size);
    } else {
        p = nvh_reserve(pool, size);
    }
    if (!p) {
        fprintf(stderr, "reserve failed: %s\n", nvh_errormsg());
        return -1;
    }
    fill(p, size, o->tag);
    nvh_persist(pool, p, size);
    o->off = nvh_off(pool, p);
    o->state = ST_ALLOC;
    g_nobj++;
    int rc;
    if (name >= 0) {
        rc = nvh_activate_named(pool, nm);
    } else {
        nvh_off_t *links[2] = {o->link[0] >= 0 ? &root[o->link[0]] : NULL,
                               o->link[1] >= 0 ? &root[o->link[1]] : NULL};
        rc = nvh_activate(pool, p, links, nlinks);
    }
    if (rc != NVH_OK) {
        fprintf(stderr, "activate failed: %s\n", nvh_errormsg());
        return -1;
    }
    o->state = ST_LIVE;
    return 0;
}

static int op_free_at(nvh_pool *pool, int i);

static int op_free(nvh_pool *pool, uint64_t *rng)
{
    int live = 0;
    for (int i = 0; i < g_nobj; i++) live += g_obj[i].state == ST_LIVE;
    if (!live) return 0;
    int pick = (int)(test_rand(rng) % (uint64_t)live);
    for (int i = 0; i < g_nobj; i++) {
        if (g_obj[i].state != ST_LIVE || pick-- != 0) continue;
        return op_free_at(pool, i);
    }
    return 0;
}

/* Free object i of the model (live). */
static int op_free_at(nvh_pool *pool, int i)
{
    nvh_off_t *root = nvh_root(pool, NULL);
    {
        mobj *o = &g_obj[i];
        o->state = ST_FREEING;
        int rc;
        if (o->name >= 0) {
            char nm[32];
            snprintf(nm, sizeof nm, "name-%d", o->name);
            rc = nvh_free_named(pool, nm);
        } else {
            nvh_link l[2];
            for (unsigned k = 0; k < o->nlinks; k++) l[k] = (nvh_link){&root[o->link[k]], 0};
            rc = nvh_free(pool, nvh_ptr(pool, o->off), l, o->nlinks);
        }
        if (rc != NVH_OK) {
            fprintf(stderr, "free failed: %s\n", nvh_errormsg());
            return -1;
        }
        o->state = ST_DEAD;
        for (unsigned k = 0; k < o->nlinks; k++) slot_used[o->link[k]] = false;
        return 0;
    }
}

/* ---------------------------------------------------------------------------
 * Checker
 * ------------------------------------------------------------------------- */
typedef struct live_obj { uint64_t off, size; } live_obj;
typedef struct live_set { live_obj *v; size_t n, cap; } live_set;

static int collect(void *ptr, size_t usable, void *arg)
{
    live_set *s = arg;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (live_obj){(uint64_t)(uintptr_t)ptr, usable};
    return 0;
}
static int cmp_live(const void *a, const void *b)
{
    const live_obj *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}
static bool in_live(const live_set *s, uint64_t addr)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t m = (lo + hi) / 2;
        if (s->v[m].off < addr) lo = m + 1; else hi = m;
    }
    return lo < s->n && s->v[lo].off == addr;
}

static int complain(const nvh_crash_point *pt, int rc, const char *what, long a, long b)
{
    if (__atomic_fetch_add(g_complaints, 1, __ATOMIC_RELAXED) < 5)
        fprintf(stderr, "  checker: fence %llu seed %#llx: %s (%ld, %ld)\n",
                (unsigned long long)pt->fence, (unsigned long long)pt->seed, what, a, b);
    return rc;
}

static int alloc_check(const char *image, const nvh_crash_point *pt, void *arg)
{
    (void)arg;
    /* `nvheap check` on the crashed pool, before recovery (read-only): torn
     * headers that the redo records will rewrite are not corruption */
    uint64_t ro_corrupt = 0;
    if (nvh_heap_check_path(image, NULL, NULL, 0, &ro_corrupt) != NVH_OK || ro_corrupt)
        return complain(pt, 17, "read-only check before recovery reports corruption",
                        (long)ro_corrupt, nvh_errcode());
    nvh_pool *pool = nvh_pool_open(image, LAYOUT, NVH_DOMAIN_PROCESS);
    if (!pool) {
        fprintf(stderr, "  checker: cannot open %s: %s\n", image, nvh_errormsg());
        return 2;
    }
    int rc = 0;
    uint64_t corrupt = 0;
    if (nvh_heap_check(pool, NULL, NULL, 0, &corrupt) != NVH_OK || corrupt)
        rc = complain(pt, 3, "corrupt headers after recovery", (long)corrupt, 0);
    nvh_off_t *root = nvh_root(pool, NULL);
    char *base = nvh_pool_base(pool);
    live_set L = {0};
    nvh_heap_foreach(pool, collect, &L);
    if (L.n) qsort(L.v, L.n, sizeof *L.v, cmp_live);
    for (size_t i = 1; i < L.n && !rc; i++)
        if (L.v[i - 1].off + L.v[i - 1].size > L.v[i].off)
            rc = complain(pt, 4, "live objects overlap", (long)i, (long)L.n);
    bool slot_ref[NSLOTS] = {0};
    size_t expected_live = 0;
    for (int i = 0; i < g_nobj && !rc; i++) {
        const mobj *o = &g_obj[i];
        if (o->state == ST_DEAD || o->state == ST_NONE) continue;
        uint64_t addr = (uint64_t)(uintptr_t)(base + o->off);
        bool live = in_live(&L, addr);
        unsigned nnew = 0;
        for (unsigned k = 0; k < o->nlinks; k++) nnew += root[o->link[k]] == o->off;
        bool named = false;
        if (o->name >= 0) {
            char nm[32];
            snprintf(nm, sizeof nm, "name-%d", o->name);
            named = nvh_get_named(pool, nm, NULL) == base + o->off;
        }
        if (o->state == ST_LIVE) {
            if (!live) rc = complain(pt, 5, "acknowledged object lost", i, (long)o->off);
            else if (nnew != o->nlinks) rc = complain(pt, 6, "acknowledged link lost", i, nnew);
            else if (o->name >= 0 && !named) rc = complain(pt, 7, "acknowledged name lost", i, 0);
        } else {
            /* in flight: all or nothing */
            bool yes = live;
            if (nnew != (yes ? o->nlinks : 0u))
                rc = complain(pt, 8, "in-flight op half done (links)", i, nnew);
            else if (o->name >= 0 && named != yes)
                rc = complain(pt, 9, "in-flight op half done (name)", i, named);
            if (!yes) {
                for (unsigned k = 0; k < o->nlinks; k++)
                    if (root[o->link[k]] != 0 && o->state == ST_FREEING)
                        rc = complain(pt, 10, "freed object's link not cleared", i, k);
                continue;
            }
        }
        if (rc) break;
        expected_live++;
        for (unsigned k = 0; k < o->nlinks; k++) slot_ref[o->link[k]] = true;
        if (!content_ok(base + o->off, o->size, o->tag))
            rc = complain(pt, 11, "object content damaged", i, (long)o->off);
    }
    if (!rc && expected_live != L.n)
        rc = complain(pt, 12, "live objects != reachable objects (leak or loss)",
                      (long)L.n, (long)expected_live);
    for (int s = 0; s < NSLOTS && !rc; s++)
        if (!slot_ref[s] && root[s] != 0) {
            /* a slot of an in-flight alloc that did not happen must be 0 too */
            rc = complain(pt, 13, "stray link", s, (long)root[s]);
        }
    /* free space is reusable and disturbs nothing */
    if (!rc) {
        nvh_off_t *spare = &root[NSLOTS + 8];
        for (int i = 0; i < 24 && !rc; i++) {
            uint32_t size = (uint32_t)(64 + (i * 977) % 9000);
            void *p = nvh_alloc(pool, size, NULL, NULL, &spare[i]);
            if (!p) { rc = complain(pt, 14, "cannot allocate after recovery", i, nvh_errcode()); break; }
            uint64_t a = (uint64_t)(uintptr_t)p;
            for (size_t k = 0; k < L.n; k++)
                if (a < L.v[k].off + L.v[k].size && L.v[k].off < a + size)
                    rc = complain(pt, 15, "new object overlaps a live one", i, (long)k);
            memset(p, 0xEE, size);
        }
        for (int i = 0; i < g_nobj && !rc; i++) {
            const mobj *o = &g_obj[i];
            if (o->state == ST_LIVE && !content_ok(base + o->off, o->size, o->tag))
                rc = complain(pt, 16, "live object damaged by new allocations", i, 0);
        }
    }
    free(L.v);
    nvh_pool_close(pool);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Workloads
 * ------------------------------------------------------------------------- */
static int seq_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t rng = 42;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    /* links 0, 1, 2; small, large, huge; named; frees of each kind */
    static const uint32_t sizes[] = {64, 128, 300, 1984, 5000, 40000, 300000};
    for (unsigned l = 0; l <= 2; l++)
        for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            if (op_alloc(pool, &rng, sizes[s], l, -1)) return 1;
    for (int n = 0; n < 3; n++)
        if (op_alloc(pool, &rng, 100 + (uint32_t)n * 3000, 0, n)) return 1;
    void *c = nvh_reserve(pool, 200);                   /* reserve + cancel: no fence */
    if (!c || nvh_cancel(pool, c) != NVH_OK) return 1;
    for (int i = 0; i < 14; i++)
        if (op_free(pool, &rng)) return 1;
    for (unsigned s = 0; s < 4; s++)                    /* reuse after frees */
        if (op_alloc(pool, &rng, sizes[s], 1, -1)) return 1;
    return 0;
}

/* Runs of several blocks (docs/ALLOC.md §1): every class gets its largest
 * run from the first one (multirun_force), and the objects land in the
 * later blocks of their runs, where a slot's block has no header of its
 * own: new runs of 16, 12 and 5 blocks, activations and frees with 0-2
 * links in later blocks, a named object in one, classes above 31 (the
 * record's class bits beyond the 5 of format 3), reuse after the frees. */
static int multirun_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t rng = 4343;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    /* class 16 (1024 B): 16 blocks, 63 slots; class 40 (2560 B): 12
     * blocks, 19 slots; class 6 (384 B): 5 blocks, 53 slots */
    for (int i = 0; i < 24; i++)
        if (op_alloc(pool, &rng, 1000 + (uint32_t)(i % 3), (unsigned)(i % 3), -1)) return 1;
    for (int i = 0; i < 6; i++)
        if (op_alloc(pool, &rng, 2500, (unsigned)(i % 3), -1)) return 1;
    if (op_alloc(pool, &rng, 2000, 0, 3)) return 1;         /* named, class 32 */
    for (int i = 0; i < 14; i++)
        if (op_alloc(pool, &rng, 380, 1, -1)) return 1;
    for (int i = 0; i < 10; i++)
        if (op_free(pool, &rng)) return 1;
    for (int i = 0; i < 6; i++)
        if (op_alloc(pool, &rng, 1020, 1, -1)) return 1;
    return 0;
}

/* The classes above 4032 B (format 5) in their largest runs from the
 * first (multirun_force): 4192 B in 16-block runs of 15 slots (slots up to
 * block 14 of the run), 6000 B (class 6528: 10 slots), 13000 B (class
 * 13056: 5 slots over 16 blocks); activations and frees with 0-2 links, a
 * named object, reuse after frees, one 4096 B object (whole block). */
static int bigrun_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t rng = 6161;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    for (int i = 0; i < 16; i++)
        if (op_alloc(pool, &rng, 4192, (unsigned)(i % 3), -1)) return 1;
    for (int i = 0; i < 4; i++)
        if (op_alloc(pool, &rng, 6000, (unsigned)(i % 3), -1)) return 1;
    for (int i = 0; i < 6; i++)
        if (op_alloc(pool, &rng, 13000, (unsigned)(i % 3), -1)) return 1;
    if (op_alloc(pool, &rng, 5000, 0, 5)) return 1;          /* named, class 5440 */
    if (op_alloc(pool, &rng, 4096, 1, -1)) return 1;
    for (int i = 0; i < 10; i++)
        if (op_free(pool, &rng)) return 1;
    for (int i = 0; i < 5; i++)
        if (op_alloc(pool, &rng, 4200 + (uint32_t)i, 1, -1)) return 1;
    return 0;
}

/* Every class's run at its largest size from the first run on. */
static void multirun_force(bool on)
{
    nvh_run_early_ = on ? 0 : NVH_RUN_EARLY;
    for (unsigned lv = 0; lv < NVH_RUN_LEVELS; lv++)
        for (unsigned c = 1; c <= NVH_CLS_TOP; c++)
            if (nvh_cls_valid(c))
                nvh_run_blocks_tab_[lv][c] =
                    on ? (uint8_t)nvh_run_blocks_for_(NVH_RUN_LEVELS - 1, c) : 0;
}

/* Power-of-two large objects (256 KiB chunks here): four 64 KiB objects
 * fill one chunk edge to edge, their headers in the zone's header chunk
 * (alloc.h); frees, a reuse of the freed space by a 128 KiB pair, and a
 * 512 KiB huge object. A crash at every fence of these allocations and
 * frees must recover as any other (alloc_check). */
static int pow2_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    uint64_t rng = 4242;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    for (int i = 0; i < 4; i++)
        if (op_alloc(pool, &rng, 64u << 10, 1, -1)) return 1;
    /* packed: the four are edge to edge */
    for (int i = 1; i < 4; i++)
        if (g_obj[i].off != g_obj[i - 1].off + (64u << 10) &&
            g_obj[i - 1].off != g_obj[i].off + (64u << 10)) {
            fprintf(stderr, "pow2: objects %d and %d are not adjacent\n", i - 1, i);
            return 1;
        }
    for (int i = 0; i < 2; i++)
        if (op_free(pool, &rng)) return 1;
    for (int i = 0; i < 2; i++)
        if (op_alloc(pool, &rng, 128u << 10, 2, -1)) return 1;
    if (op_alloc(pool, &rng, 512u << 10, 1, -1)) return 1;
    for (int i = 0; i < 3; i++)
        if (op_free(pool, &rng)) return 1;
    if (op_alloc(pool, &rng, 64u << 10, 0, 0)) return 1;     /* named */
    return 0;
}

static int random_workload(nvh_pool *pool, void *arg)
{
    uint64_t rng = *(uint64_t *)arg;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    int named = 0;
    for (int i = 0; i < 700; i++) {
        uint64_t r = test_rand(&rng) % 100;
        int live = 0;
        for (int k = 0; k < g_nobj; k++) live += g_obj[k].state == ST_LIVE;
        if (r < 45 || live < 8) {
            uint64_t z = test_rand(&rng) % 100;
            uint32_t size = z < 80 ? (uint32_t)(1 + test_rand(&rng) % 2000)
                          : z < 97 ? (uint32_t)(2000 + test_rand(&rng) % 60000)
                                   : (uint32_t)(150000 + test_rand(&rng) % 200000);
            int name = (test_rand(&rng) % 20 == 0 && named < 64) ? named++ : -1;
            if (op_alloc(pool, &rng, size, name >= 0 ? 0 : (unsigned)(test_rand(&rng) % 3), name)) return 1;
        } else {
            if (op_free(pool, &rng)) return 1;
        }
    }
    return 0;
}

/* The same random run, but every operation on a new thread: threads are
 * given arenas round robin, so consecutive operations use different arenas
 * and rings, and frees are often remote (performed in the owner's ring). This
 * exercises replay ordering across rings and the FIFO's retirement rule. */
typedef struct op_call { nvh_pool *pool; uint64_t *rng; int kind; uint32_t size;
                         unsigned nlinks; int name; int rc; } op_call;
static void *op_thread(void *arg)
{
    op_call *c = arg;
    c->rc = c->kind == 0 ? op_alloc(c->pool, c->rng, c->size, c->nlinks, c->name)
                         : op_free(c->pool, c->rng);
    return NULL;
}

static int threaded_workload(nvh_pool *pool, void *arg)
{
    uint64_t rng = *(uint64_t *)arg;
    g_nobj = 0;
    memset(slot_used, 0, sizeof slot_used);
    int named = 0;
    for (int i = 0; i < 300; i++) {
        uint64_t r = test_rand(&rng) % 100;
        int live = 0;
        for (int k = 0; k < g_nobj; k++) live += g_obj[k].state == ST_LIVE;
        op_call c = {pool, &rng, 1, 0, 0, -1, 0};
        if (r < 50 || live < 8) {
            uint64_t z = test_rand(&rng) % 100;
            c.kind = 0;
            c.size = z < 85 ? (uint32_t)(1 + test_rand(&rng) % 2000) : (uint32_t)(2000 + test_rand(&rng) % 60000);
            c.name = (test_rand(&rng) % 25 == 0 && named < 32) ? named++ : -1;
            c.nlinks = c.name >= 0 ? 0 : (unsigned)(test_rand(&rng) % 3);
        }
        pthread_t t;
        if (pthread_create(&t, NULL, op_thread, &c) != 0) return 1;
        pthread_join(t, NULL);
        if (c.rc) return 1;
    }
    return 0;
}

/* Replay order across rings (record sequence numbers, docs/ALLOC.md §4f).
 * Thread 1 (arena 0) appends 30 records, the last activating X with link
 * slot s. Thread 2 (arena 1, created after thread 1 ended) frees X clearing
 * s (a remote free: ring 0) and then activates Y with the same slot s (ring
 * 1), then one more object. Y's record happens after X's free, so it must
 * replay after it: crashed between Y's fence and ring 1's next one, the
 * media may still hold s == X (neither link line written back), and only
 * the order free-then-activate ends with s == Y. A sequence number that
 * ignored the other rings (ring 1's first record numbered below ring 0's
 * 30th) replays Y first and loses its acknowledged link: this test fails
 * then (negative control, §4f). */
static void *ring_order_t1(void *arg)
{
    op_call *c = arg;
    uint64_t rng = 4242;
    for (int i = 0; i < 30 && !c->rc; i++) c->rc = op_alloc(c->pool, &rng, 128, 1, -1);
    return NULL;
}

static void *ring_order_t2(void *arg)
{
    op_call *c = arg;
    nvh_off_t *root = nvh_root(c->pool, NULL);
    mobj *x = &g_obj[g_nobj - 1];
    int s = x->link[0];
    x->state = ST_FREEING;
    nvh_link l = {&root[s], 0};
    if (nvh_free(c->pool, nvh_ptr(c->pool, x->off), &l, 1) != NVH_OK) {
        c->rc = -1;
        return NULL;
    }
    x->state = ST_DEAD;
    slot_used[s] = false;
    uint64_t rng = 77;
    g_force_slot = s;
    c->rc = op_alloc(c->pool, &rng, 128, 1, -1);
    if (!c->rc && g_obj[g_nobj - 1].link[0] != s) c->rc = -1;
    if (!c->rc) c->rc = op_alloc(c->pool, &rng, 64, 1, -1);
    return NULL;
}

static int ring_order_workload(nvh_pool *pool, void *arg)
{
    (void)arg;
    g_nobj = 0;
    g_force_slot = -1;
    memset(slot_used, 0, sizeof slot_used);
    op_call c = {pool, NULL, 0, 0, 0, -1, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, ring_order_t1, &c) != 0) return 1;
    pthread_join(t, NULL);
    if (c.rc || g_nobj < 1) return 1;
    if (pthread_create(&t, NULL, ring_order_t2, &c) != 0) return 1;
    pthread_join(t, NULL);
    return c.rc ? 1 : 0;
}

static const char *g_scratch;

static const char *fresh_pool(void)
{
    const char *path = test_path("crash");
    nvh_pool_options o = {.root_size = 8192, .max_size = 64 << 20};
    nvh_pool *pool = nvh_pool_create_ex(path, LAYOUT, 1 << 20, NVH_DOMAIN_PROCESS, &o);
    assert_non_null(pool);
    assert_int_equal(nvh_pool_close(pool), NVH_OK);
    return path;
}

static void run(nvh_crash_workload_fn w, void *arg, nvh_crash_mode mode, uint64_t budget,
                unsigned images)
{
    const char *path = fresh_pool();
    *g_complaints = 0;
    /* NVHEAP_TEST_DEEP=k: k times the sampled crash points (local soak runs) */
    const char *deep = getenv("NVHEAP_TEST_DEEP");
    if (deep && budget) budget *= (uint64_t)strtoull(deep, NULL, 0);
    nvh_crash_config cfg = {
        .pool_path = path, .layout = LAYOUT, .workload = w, .check = alloc_check,
        .arg = arg, .seed = 7, .mode = mode, .budget = budget, .images_per_point = images,
        .scratch_dir = g_scratch,
    };
    test_crash_explore(&cfg);
    unlink(path);
}

/* the random workload without crashes, in the process domain */
static void random_direct(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        const char *path = fresh_pool();
        nvh_pool *pool = nvh_pool_open(path, LAYOUT, NVH_DOMAIN_PROCESS);
        assert_non_null(pool);
        uint64_t s = seed;
        assert_int_equal(random_workload(pool, &s), 0);
        assert_int_equal(nvh_pool_close(pool), NVH_OK);
        unlink(path);
    }
}

/* Under TSan a forked child costs ~100x more: there the exhaustive runs
 * become samples (the release and ASan builds keep every fence). */
#if defined(__SANITIZE_THREAD__)
#define EVERY_FENCE_BUDGET 20
#define IMAGES 1
#define SAMPLES 12
#else
#define EVERY_FENCE_BUDGET 0
#define IMAGES 3
#define SAMPLES 60
#endif

static void every_fence_lines(void **state)
{
    (void)state;
    run(seq_workload, NULL, NVH_CRASH_LINES, EVERY_FENCE_BUDGET, IMAGES);
}
static void every_fence_words(void **state)
{
    (void)state;
    run(seq_workload, NULL, NVH_CRASH_WORDS, EVERY_FENCE_BUDGET, IMAGES);
}
static void random_run_sampled(void **state)
{
    (void)state;
    uint64_t seed = 99;
    run(random_workload, &seed, NVH_CRASH_LINES, SAMPLES, IMAGES == 1 ? 1 : 2);
    seed = 1234;
    run(random_workload, &seed, NVH_CRASH_WORDS, SAMPLES, IMAGES == 1 ? 1 : 2);
}

static void two_arenas_sampled(void **state)
{
    (void)state;
    uint64_t seed = 555;
    run(threaded_workload, &seed, NVH_CRASH_LINES, SAMPLES / 2, IMAGES == 1 ? 1 : 2);
    seed = 777;
    run(threaded_workload, &seed, NVH_CRASH_WORDS, SAMPLES / 2, IMAGES == 1 ? 1 : 2);
}

static void pow2_every_fence(void **state)
{
    (void)state;
    run(pow2_workload, NULL, NVH_CRASH_LINES, EVERY_FENCE_BUDGET, IMAGES);
    run(pow2_workload, NULL, NVH_CRASH_WORDS, EVERY_FENCE_BUDGET, IMAGES);
}

static void multirun_every_fence(void **state)
{
    (void)state;
    multirun_force(true);
    run(multirun_workload, NULL, NVH_CRASH_LINES, EVERY_FENCE_BUDGET, IMAGES);
    run(multirun_workload, NULL, NVH_CRASH_WORDS, EVERY_FENCE_BUDGET, IMAGES);
    multirun_force(false);
}

static void bigrun_every_fence(void **state)
{
    (void)state;
    multirun_force(true);
    run(bigrun_workload, NULL, NVH_CRASH_LINES, EVERY_FENCE_BUDGET, IMAGES);
    run(bigrun_workload, NULL, NVH_CRASH_WORDS, EVERY_FENCE_BUDGET, IMAGES);
    multirun_force(false);
}

static void ring_order_every_fence(void **state)
{
    (void)state;
    run(ring_order_workload, NULL, NVH_CRASH_LINES, EVERY_FENCE_BUDGET, IMAGES);
    run(ring_order_workload, NULL, NVH_CRASH_WORDS, EVERY_FENCE_BUDGET, IMAGES);
}

int main(void)
{
    setenv("NVHEAP_ARENAS", "2", 1);
    setenv("NVHEAP_CHUNK_SIZE", "262144", 1);   /* small chunks: small images */
    g_complaints = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static char scratch[512];
    const char *dir = getenv("NVHEAP_TEST_DIR");
    if (!dir || !*dir) dir = "/tmp";
    mkdir(dir, 0700);
    snprintf(scratch, sizeof scratch, "%s/alloccrash-%d.d", dir, (int)getpid());
    mkdir(scratch, 0700);
    g_scratch = scratch;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_direct),
        cmocka_unit_test(every_fence_lines),
        cmocka_unit_test(every_fence_words),
        cmocka_unit_test(random_run_sampled),
        cmocka_unit_test(two_arenas_sampled),
        cmocka_unit_test(ring_order_every_fence),
        cmocka_unit_test(pow2_every_fence),
        cmocka_unit_test(multirun_every_fence),
        cmocka_unit_test(bigrun_every_fence),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(scratch);
    return rc;
}
