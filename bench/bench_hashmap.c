/* bench_hashmap.c — persistent hash table ([Kannan14] PHT): random puts and gets, 0.6-1.5 M elements, vs PMDK hashmap_tx
 *
 * The PHT workload of [Kannan14] §4.2-4.3 (Figs. 13, 18): a persistent hash
 * table filled with N random keys (puts, from empty: every resize included),
 * then N gets of random present keys; N = 600000, 1000000, 1500000 (quick:
 * 20000). Each repetition builds a fresh pool for each subject; subjects run
 * alternately, with the same keys in the same order.
 *
 * Cases (GROUP/VARIANT; VARIANT = N):
 *   put_k8/N, get_k8/N    8-byte keys, 64-byte values: the like-for-like
 *                          comparison with PMDK's hashmap_tx, whose keys are
 *                          uint64 and whose values are PMEMoids:
 *       nvheap  nvh_hmap_put(8 B key, 64 B value): one entry allocation
 *               (header + key + value), 2 fences; get = nvh_hmap_get + copy
 *               of the 64 B value
 *       pmdk    TX_BEGIN { v = pmemobj_tx_alloc(64); copy value into v;
 *               hm_tx_insert(key, v) } TX_END (the example's insert nests
 *               into our transaction: one transaction per put, as nvheap's put
 *               is one failure-atomic operation); get = hm_tx_get + copy of
 *               the 64 B value
 *   put_k64/N, get_k64/N  64-byte keys and values, [Kannan14]'s PHT element:
 *       nvheap  the same calls with 64 B keys
 *       pmdk    hashmap_tx cannot hold byte-string keys: the value object is
 *               128 B {key, value}, the map key is a 64-bit hash of the key
 *               (get compares the stored key bytes). This is how an
 *               application would put byte keys into hashmap_tx
 *               (collisions are not handled: it favours PMDK).
 * What else differs: PMDK's example rebuilds the whole table inside one
 * transaction when a chain is long (stop-the-world), nvheap doubles in O(1)
 * and links buckets lazily; PMDK grows at load 2 (count > 2 * buckets),
 * nvheap by default too (max_load_pct 200). Both are single-threaded here;
 * nvheap takes its map mutex on every call, PMDK's example has none.
 *
 * Metrics: ns_per_op (wall, per operation), and lines_per_op / fences_per_op
 * of the puts: for nvheap its pool counters (nvh_stats), for PMDK counted by
 * interposing libpmem's pmem_flush/drain/persist/memcpy/memset/... (which
 * libpmemobj calls through the PLT; self-checked at start: one
 * pmemobj_persist of one line must count 1 line and 1 fence). The ratio
 * column divides ns_per_op by PMDK's in the same case (< 1: faster; the
 * target is put ratio <= 1/3).
 *
 * Both run on --dir (default /dev/shm): nvheap in its pmem domain (CLWB +
 * SFENCE), PMDK with PMEM_IS_PMEM_FORCE=1 (the program re-runs itself as a
 * child with it: libpmem reads it when it loads), i.e. CLWB + SFENCE too.
 *
 * Options: --sizes LIST (default 600000,1000000,1500000; quick 20000),
 * --keys LIST (8,64). NVHEAP_BENCH_CHECK=1 runs nvh_hmap_check after the
 * puts (untimed) and fails the run if the map is not exactly the N keys.
 */
#include "bench_util.h"
#include "pmdk_count.h"

#include <libpmem.h>
#include <libpmemobj.h>

#include "hashmap_tx.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define LINE 64u
#define VAL 64u

static const bench_info info = {
    .name = "hashmap",
    .summary = "persistent hash table ([Kannan14] PHT): puts and gets, 0.6-1.5 M elements, vs PMDK hashmap_tx",
    .baseline = "pmdk",
    .ratio_metric = "ns_per_op",
    .usage = "  --sizes LIST   element counts (default 600000,1000000,1500000; quick 20000)\n"
             "  --keys LIST    key sizes in bytes, 8 and/or 64 (default 8,64)\n",
};

/* ==========================================================================
 * Keys
 * ========================================================================== */
static inline uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Key i: klen bytes whose first word is splitmix(i) (a bijection: distinct). */
static void make_key(uint64_t i, unsigned klen, uint8_t *out)
{
    uint64_t w[8];
    w[0] = splitmix(i);
    for (unsigned j = 1; j < 8; j++) w[j] = splitmix(i * 8 + j + 0x1234567);
    memcpy(out, w, klen);
}

/* PMDK's map key for a 64 B key: a 64-bit hash of it. */
static inline uint64_t key_hash64(const uint8_t *k)
{
    uint64_t h = 0x243F6A8885A308D3ull, w;
    for (unsigned j = 0; j < 64; j += 8) {
        memcpy(&w, k + j, 8);
        h = splitmix(h ^ w);
    }
    return h;
}

/* ==========================================================================
 * One run of a subject
 * ========================================================================== */
typedef struct run_result {
    double put_ns, get_ns;        /* per op */
    double lines, fences;         /* per put */
    int ok;
} run_result;

typedef struct workload {
    const bench_opts *opts;
    uint64_t n;
    unsigned klen;
    uint8_t *keys;                /* n * klen */
    uint8_t *vals;                /* n * VAL  */
    uint32_t *order;              /* get order */
} workload;

static volatile uint64_t sink;

static run_result run_nvheap(const workload *w)
{
    run_result r = {0};
    const char *path = bench_scratch_path(w->opts, NULL, "nvheap");
    nvh_pool_options po = {.root_size = 4096, .max_size = 64ull << 30};
    /* the size PMDK's pool gets (run_pmdk), so that neither grows its pool
     * inside the timed puts */
    uint64_t size = (128 * MIB + w->n * 512 + 2 * MIB - 1) & ~(2 * MIB - 1);
    nvh_pool *pool = nvh_pool_create_ex(path, "bench-hashmap", size, NVH_DOMAIN_PMEM, &po);
    if (!pool) {
        bench_error(w->opts, "nvheap pool: %s", nvh_errormsg());
        return r;
    }
    nvh_off_t *slot = nvh_root(pool, NULL);
    nvh_hmap *m = NULL;
    if (nvh_hmap_create(pool, slot, NULL) != NVH_OK || !(m = nvh_hmap_open(pool, *slot))) {
        bench_error(w->opts, "nvheap map: %s", nvh_errormsg());
        nvh_pool_close(pool);
        bench_scratch_remove(path);
        return r;
    }
    nvh_stats_reset(pool);
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < w->n; i++) {
        if (nvh_hmap_put(m, w->keys + i * w->klen, w->klen, w->vals + i * VAL, VAL) != NVH_OK) {
            bench_error(w->opts, "nvh_hmap_put: %s", nvh_errormsg());
            goto out;
        }
    }
    uint64_t t1 = bench_now_ns();
    if (nvh_pool_size(pool) > size)
        bench_error(w->opts, "nvheap: the pool grew inside the timed puts (%llu -> %llu MiB)",
                    (unsigned long long)(size >> 20), (unsigned long long)(nvh_pool_size(pool) >> 20));
    nvh_stats s;
    nvh_stats_get(pool, &s);
    if (getenv("NVHEAP_BENCH_CHECK")) {          /* verify the map (not timed) */
        nvh_hmap_stats st;
        if (nvh_hmap_check(m, &st) != NVH_OK || st.count != w->n) {
            bench_error(w->opts, "nvh_hmap_check: %s (count %llu)", nvh_errormsg(),
                        (unsigned long long)st.count);
            goto out;
        }
        bench_note(w->opts, "nvheap map verified: %llu entries, %llu buckets, max chain %llu",
                   (unsigned long long)st.count, (unsigned long long)st.buckets,
                   (unsigned long long)st.max_chain);
    }
    {   /* the geometry the gets will see (O(1)): a map that did not grow
         * would explain slow gets at a glance */
        nvh_hmap_stats st;
        if (nvh_hmap_stats_get(m, &st) == NVH_OK)
            bench_note(w->opts, "nvheap map after %llu puts: %llu buckets (load %.2f), %llu doublings, %llu buckets linked",
                       (unsigned long long)w->n, (unsigned long long)st.buckets, st.load_factor,
                       (unsigned long long)st.resizes, (unsigned long long)st.buckets_inited);
    }
    uint8_t buf[VAL];
    uint64_t t2 = bench_now_ns();
    for (uint64_t j = 0; j < w->n; j++) {
        uint64_t i = w->order[j];
        const void *v;
        size_t vl;
        if (nvh_hmap_get(m, w->keys + i * w->klen, w->klen, &v, &vl) != NVH_OK || vl != VAL) {
            bench_error(w->opts, "nvh_hmap_get: key %llu missing", (unsigned long long)i);
            goto out;
        }
        memcpy(buf, v, VAL);
        sink += buf[0];
    }
    uint64_t t3 = bench_now_ns();
    r.put_ns = (double)(t1 - t0) / (double)w->n;
    r.get_ns = (double)(t3 - t2) / (double)w->n;
    r.lines = (double)s.lines_flushed / (double)w->n;
    r.fences = (double)s.fences / (double)w->n;
    r.ok = 1;
out:
    nvh_hmap_close(m);
    nvh_pool_close(pool);
    bench_scratch_remove(path);
    return r;
}

struct pmdk_root {
    TOID(struct hashmap_tx) map;
};

/* One PMDK put: a transaction that allocates the value object, fills it and
 * inserts it (hm_tx_insert's own transaction nests into this one). Its own
 * function: TX_BEGIN is setjmp-based. */
static __attribute__((noinline)) int pmdk_put_one(PMEMobjpool *pop, TOID(struct hashmap_tx) map,
                                                  uint64_t key, const uint8_t *k,
                                                  const uint8_t *val, unsigned klen, size_t obj)
{
    volatile int failed = 0;
    TX_BEGIN(pop) {
        PMEMoid v = pmemobj_tx_alloc(obj, 1);
        uint8_t *p = pmemobj_direct(v);
        if (klen == 8) {
            memcpy(p, val, VAL);
        } else {
            memcpy(p, k, 64);
            memcpy(p + 64, val, VAL);
        }
        if (hm_tx_insert(pop, map, key, v) != 0) pmemobj_tx_abort(EINVAL);
    } TX_ONABORT {
        failed = 1;
    } TX_END
    return failed;
}

static run_result run_pmdk(const workload *w)
{
    run_result r = {0};
    const char *path = bench_scratch_path(w->opts, NULL, "pmdk");
    /* entry (40 B) + value object (64 or 128 B) with PMDK's headers and
     * classes, plus the bucket array and the rebuilds' transient copies */
    uint64_t size = 128 * MIB + w->n * 512;
    PMEMobjpool *pop = pmemobj_create(path, "bench-hashmap", size, 0600);
    if (!pop) {
        bench_error(w->opts, "pmemobj_create: %s", pmemobj_errormsg());
        return r;
    }
    PMEMoid root = pmemobj_root(pop, sizeof(struct pmdk_root));
    struct pmdk_root *rp = pmemobj_direct(root);
    struct hashmap_args args = {.seed = 1};
    if (hm_tx_create(pop, &rp->map, &args) != 0) {
        bench_error(w->opts, "hm_tx_create failed");
        goto close;
    }
    hm_tx_init(pop, rp->map);
    TOID(struct hashmap_tx) map = rp->map;
    size_t obj = w->klen == 8 ? VAL : 64 + VAL;
    pmdk_count_reset();
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < w->n; i++) {
        const uint8_t *k = w->keys + i * w->klen;
        uint64_t key;
        if (w->klen == 8) memcpy(&key, k, 8);
        else key = key_hash64(k);
        int failed = pmdk_put_one(pop, map, key, k, w->vals + i * VAL, w->klen, obj);
        if (failed) {
            bench_error(w->opts, "PMDK insert %llu failed: %s", (unsigned long long)i,
                        pmemobj_errormsg());
            goto close;
        }
    }
    uint64_t t1 = bench_now_ns();
    pmdk_count counted = pmdk_count_total();
    uint64_t lines = counted.lines, fences = counted.fences;
    uint8_t buf[VAL];
    uint64_t t2 = bench_now_ns();
    for (uint64_t j = 0; j < w->n; j++) {
        uint64_t i = w->order[j];
        const uint8_t *k = w->keys + i * w->klen;
        uint64_t key;
        if (w->klen == 8) memcpy(&key, k, 8);
        else key = key_hash64(k);
        PMEMoid v = hm_tx_get(pop, map, key);
        const uint8_t *p = pmemobj_direct(v);
        if (!p || (w->klen == 64 && memcmp(p, k, 64) != 0)) {
            bench_error(w->opts, "PMDK get: key %llu missing", (unsigned long long)i);
            goto close;
        }
        memcpy(buf, w->klen == 8 ? p : p + 64, VAL);
        sink += buf[0];
    }
    uint64_t t3 = bench_now_ns();
    r.put_ns = (double)(t1 - t0) / (double)w->n;
    r.get_ns = (double)(t3 - t2) / (double)w->n;
    r.lines = (double)lines / (double)w->n;
    r.fences = (double)fences / (double)w->n;
    r.ok = 1;
close:
    pmemobj_close(pop);
    bench_scratch_remove(path);
    return r;
}

/* ==========================================================================
 * Driver
 * ========================================================================== */
static int parse_list(const char *s, uint64_t *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        out[n++] = strtoull(s, &end, 10);
        if (end == s) return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void emit_case(const bench_opts *opts, const char *group, unsigned klen, uint64_t n,
                      const char *subject, const double *ns, unsigned runs, const run_result *last,
                      bool counts)
{
    char name[64];
    snprintf(name, sizeof name, "%s_k%u/%llu", group, klen, (unsigned long long)n);
    bench_emit(opts, name, subject, "ns_per_op", bench_summarize(ns, runs), "ns");
    if (counts) {
        bench_emit(opts, name, subject, "lines_per_op", bench_exact(last->lines), "lines");
        bench_emit(opts, name, subject, "fences_per_op", bench_exact(last->fences), "fences");
    }
}

int main(int argc, char **argv)
{
    bench_opts opts;
    bench_parse(&opts, &info, argc, argv);
    uint64_t sizes[8] = {600000, 1000000, 1500000}, keys[4] = {8, 64};
    int nsizes = 3, nkeys = 2;
    if (opts.quick) {
        sizes[0] = 20000;
        nsizes = 1;
    }
    const char *sizes_arg = NULL, *keys_arg = NULL;
    for (int i = 0; i < opts.argc; i++) {
        if (!strcmp(opts.argv[i], "--sizes") && i + 1 < opts.argc) sizes_arg = opts.argv[++i];
        else if (!strcmp(opts.argv[i], "--keys") && i + 1 < opts.argc) keys_arg = opts.argv[++i];
        else bench_usage_error(&opts, "unknown option: %s", opts.argv[i]);
    }
    if (sizes_arg && (nsizes = parse_list(sizes_arg, sizes, 8)) <= 0)
        bench_usage_error(&opts, "bad --sizes %s", sizes_arg);
    if (keys_arg && (nkeys = parse_list(keys_arg, keys, 4)) <= 0)
        bench_usage_error(&opts, "bad --keys %s", keys_arg);
    for (int i = 0; i < nkeys; i++)
        if (keys[i] != 8 && keys[i] != 64) bench_usage_error(&opts, "--keys: 8 or 64");

    if (!opts.child) {
        const char *envs[] = {"PMEM_IS_PMEM_FORCE=1", NULL};
        const char *args[8] = {NULL};
        int a = 0;
        if (sizes_arg) { args[a++] = "--sizes"; args[a++] = sizes_arg; }
        if (keys_arg) { args[a++] = "--keys"; args[a++] = keys_arg; }
        bench_run_child(&opts, envs, args);
        return bench_finish(&opts);
    }

    pmdk_count_init("bench_hashmap");
    /* self-check of the PMDK counters */
    {
        const char *path = bench_scratch_path(&opts, NULL, "selfcheck");
        PMEMobjpool *pop = pmemobj_create(path, "selfcheck", PMEMOBJ_MIN_POOL, 0600);
        if (!pop) {
            bench_error(&opts, "pmemobj_create: %s", pmemobj_errormsg());
            return bench_finish(&opts);
        }
        void *p = pmemobj_direct(pmemobj_root(pop, 64));
        pmdk_count_reset();
        pmemobj_persist(pop, p, 1);
        pmdk_count c = pmdk_count_total();
        if (c.lines != 1 || c.fences != 1)
            bench_error(&opts, "PMDK counter self-check: %llu lines, %llu fences (want 1, 1)",
                        (unsigned long long)c.lines, (unsigned long long)c.fences);
        pmemobj_close(pop);
        bench_scratch_remove(path);
    }
    bench_note(&opts, "nvheap: pmem domain on %s; PMDK hashmap_tx example: PMEM_IS_PMEM_FORCE=1 on "
               "the same directory; %u repetitions, medians", opts.dir, opts.runs);

    for (int ki = 0; ki < nkeys; ki++) {
        for (int si = 0; si < nsizes; si++) {
            unsigned klen = (unsigned)keys[ki];
            uint64_t n = sizes[si];
            char probe[64];
            snprintf(probe, sizeof probe, "put_k%u/%llu", klen, (unsigned long long)n);
            char probe2[64];
            snprintf(probe2, sizeof probe2, "get_k%u/%llu", klen, (unsigned long long)n);
            if (!bench_selected(&opts, probe) && !bench_selected(&opts, probe2)) continue;
            workload w = {.opts = &opts, .n = n, .klen = klen};
            w.keys = malloc(n * klen);
            w.vals = malloc(n * VAL);
            w.order = malloc(n * sizeof *w.order);
            if (!w.keys || !w.vals || !w.order) {
                bench_error(&opts, "out of memory");
                return bench_finish(&opts);
            }
            for (uint64_t i = 0; i < n; i++) {
                make_key(i, klen, w.keys + i * klen);
                for (unsigned j = 0; j < VAL; j += 8) {
                    uint64_t x = splitmix(i ^ ((uint64_t)j << 40));
                    memcpy(w.vals + i * VAL + j, &x, 8);
                }
                w.order[i] = (uint32_t)i;
            }
            for (uint64_t i = n - 1; i > 0; i--) {     /* Fisher-Yates, fixed seed */
                uint64_t j = splitmix(i * 77) % (i + 1);
                uint32_t t = w.order[i];
                w.order[i] = w.order[j];
                w.order[j] = t;
            }
            double nv_put[64], nv_get[64], pm_put[64], pm_get[64];
            run_result nv = {0}, pm = {0};
            unsigned runs = opts.runs > 64 ? 64 : opts.runs;
            bool ok = true;
            for (unsigned r = 0; r < runs && ok; r++) {
                /* alternate the order of the subjects */
                if (r % 2 == 0) {
                    nv = run_nvheap(&w);
                    pm = run_pmdk(&w);
                } else {
                    pm = run_pmdk(&w);
                    nv = run_nvheap(&w);
                }
                ok = nv.ok && pm.ok;
                nv_put[r] = nv.put_ns;
                nv_get[r] = nv.get_ns;
                pm_put[r] = pm.put_ns;
                pm_get[r] = pm.get_ns;
            }
            if (ok) {
                emit_case(&opts, "put", klen, n, "nvheap", nv_put, runs, &nv, true);
                emit_case(&opts, "put", klen, n, "pmdk", pm_put, runs, &pm, true);
                emit_case(&opts, "get", klen, n, "nvheap", nv_get, runs, &nv, false);
                emit_case(&opts, "get", klen, n, "pmdk", pm_get, runs, &pm, false);
            }
            free(w.keys);
            free(w.vals);
            free(w.order);
        }
    }
    return bench_finish(&opts);
}
